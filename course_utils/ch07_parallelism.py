"""Chapter 07: every parallelism the source names, on 2-4 CPU ranks. The small transformer block the
tensor- and pipeline-parallel scripts split, the pieces of measurement the scripts share (a per-rank
JSON record, max differences, the ring model of an all-reduce), and the chapter's pictures."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .i18n import tr

#: What the chapter's scripts import beyond torch's core: the notebook asks the launcher's warm server
#: to import them once (``warm_up(imports=CHAPTER_IMPORTS)``), instead of every rank of every launch.
CHAPTER_IMPORTS = (
    "torch.distributed.tensor.parallel", "torch.distributed.tensor.debug", "torch.distributed.pipelining",
    "torch.distributed.fsdp", "torch.distributed.checkpoint", "torch.distributed.optim",
    "torch.distributed.algorithms.join", "torch.profiler", "course_utils.ch07_parallelism", "course_utils.memory",
)

# ---------------------------------------------------------------------------------------------
# The model the scripts split: one pre-norm transformer block (attention, then an MLP)
# ---------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head self-attention with four projections ``q``, ``k``, ``v`` and ``o``. The heads are
    counted from the projection's output (``-1`` below), so the same code runs on a rank that holds
    only some of the heads: that is what lets tensor parallelism split it by heads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (proj(x).view(b, s, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads here, s, head_dim)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """The block's MLP: ``up`` (dim -> hidden), GELU, ``down`` (hidden -> dim)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 256) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stack(nn.Module):
    """``blocks`` transformer blocks and a linear head: the model the pipeline splits by blocks."""

    def __init__(self, blocks: int = 4, dim: int = 64, heads: int = 4, hidden: int = 256, out: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): Block(dim, heads, hidden) for i in range(blocks)})
        self.head = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else x


def seeded(module_fn: Any, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """``module_fn()`` built from `seed` (the same weights on every rank and in every run), in `dtype`,
    without moving the caller's random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return module_fn().to(dtype)


# ---------------------------------------------------------------------------------------------
# Tensor-parallel plans
# ---------------------------------------------------------------------------------------------


def tp_plan(sequence_parallel: bool = False) -> dict:
    """The plan that splits a :class:`Block` for ``parallelize_module``: q, k, v and the MLP's ``up``
    column-wise (each rank computes some heads, some hidden units), ``o`` and ``down`` row-wise (each
    rank's partial sum, added up by one all-reduce). With `sequence_parallel`, the activations between
    the splits stay sharded on the sequence (dim 1): the layer norms run on 1/N of the tokens, and each
    all-reduce becomes an all-gather before the split part and a reduce-scatter after it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}

    def gather() -> Any:
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    return {
        "norm1": SequenceParallel(), "attn": gather(),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=Shard(1)),
        "norm2": SequenceParallel(), "mlp": gather(),
        "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }


#: The styles an exercise's plan may use, and the options of each that it may set
PLAN_STYLES = {"ColwiseParallel": ("input_layouts", "output_layouts", "use_local_output"),
               "RowwiseParallel": ("input_layouts", "output_layouts", "use_local_output")}
ATTENTION_LAYERS = ("q", "k", "v", "o")


def _placement_spec(p: Any) -> list:
    from torch.distributed.tensor import Replicate, Shard

    if isinstance(p, Shard):
        return ["Shard", int(p.dim)]
    if isinstance(p, Replicate):
        return ["Replicate"]
    raise ValueError(f"a layout must be Shard(dim) or Replicate(), not {p!r}")


def plan_to_spec(plan: Any) -> dict:
    """A tensor-parallel plan for the attention (``{"q": ColwiseParallel(), ...}``) as plain JSON data,
    so that it can travel to the ranks on a command line; ValueError, said for a learner, for anything
    else (another kind of object, a layer the attention does not have, a style the exercise does not use)."""
    if not isinstance(plan, dict):
        raise ValueError(f"the plan should be a dict {{layer name: style}}, but it is a {type(plan).__name__}")
    if len(plan) > len(ATTENTION_LAYERS):
        raise ValueError(f"the attention has only the layers {', '.join(ATTENTION_LAYERS)}")
    spec = {}
    for name, style in plan.items():
        if not isinstance(name, str) or name not in ATTENTION_LAYERS:
            raise ValueError(f"{name!r} is not a layer of the attention: use {', '.join(map(repr, ATTENTION_LAYERS))}")
        kind = type(style).__name__
        if kind not in PLAN_STYLES or type(style).__module__ != "torch.distributed.tensor.parallel.style":
            raise ValueError(f"the style of {name!r} should be ColwiseParallel() or RowwiseParallel(), not {kind}")
        options = {"input_layouts": _placement_spec(style.input_layouts[0]),
                   "output_layouts": _placement_spec(style.output_layouts[0]),
                   "use_local_output": bool(style.use_local_output)}
        spec[name] = [kind, options]
    return spec


def plan_from_spec(spec: Mapping[str, Any]) -> dict:
    """The plan that :func:`plan_to_spec` wrote down, rebuilt (on a rank)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def placement(p: Sequence) -> Any:
        return Shard(int(p[1])) if p[0] == "Shard" else Replicate()

    styles = {"ColwiseParallel": ColwiseParallel, "RowwiseParallel": RowwiseParallel}
    return {name: styles[kind](input_layouts=placement(o["input_layouts"]),
                               output_layouts=placement(o["output_layouts"]),
                               use_local_output=o["use_local_output"])
            for name, (kind, o) in spec.items()}


# ---------------------------------------------------------------------------------------------
# Measurements the scripts share
# ---------------------------------------------------------------------------------------------


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference of two tensors of the same shape (DTensors gathered first)."""
    a, b = (t.full_tensor() if hasattr(t, "full_tensor") else t for t in (a, b))
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} and {tuple(b.shape)}")
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max()) if a.numel() else 0.0


def bytes_written() -> int | None:
    """Bytes this process has handed to ``write``-like system calls so far (Linux's ``wchar`` in
    ``/proc/self/io``): gloo sends with ``writev``, so the difference around a collective is what this
    rank sent, plus a few bytes of headers. None where there is no ``/proc`` (macOS, Windows)."""
    try:
        with open("/proc/self/io") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("wchar:"))
    except (OSError, StopIteration, ValueError):
        return None


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Send what C++ libraries write to file descriptor 2 to /dev/null inside the ``with`` block: the
    profiler's tracing library (kineto) writes notes there at each start and stop (``profiler_start``,
    and on a machine without a GPU ``gpuGetDeviceCount failed``), which are not errors of the script."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def ring_allreduce_bytes(nbytes: int, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of a tensor of `nbytes` bytes: a reduce-scatter and an
    all-gather, each ``world_size - 1`` steps of one ``1/world_size`` chunk, so ``2 (N-1)/N x nbytes``."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return 2 * (world_size - 1) / world_size * nbytes


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle fraction of a GPipe or 1F1B pipeline step when every stage takes the same time per
    micro-batch and communication is free: ``(p - 1) / (m + p - 1)``."""
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages and microbatches must be at least 1, got {stages} and {microbatches}")
    return (stages - 1) / (microbatches + stages - 1)


#: c10d's operator names (what a collective is called at the dispatcher) -> the name the course prints
_COLLECTIVES = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "_allgather_base_": "all_gather",
    "allgather_": "all_gather", "all_gather_into_tensor": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter", "broadcast_": "broadcast",
    "broadcast": "broadcast", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
}


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives issued inside ``with CollectiveCounter() as c:``, as ``c.counts``
    (``{"all_gather": 10, ...}``): every c10d or functional-collective operator that reaches the
    dispatcher, the ones DTensor issues too (it lets DTensor turn its ops into plain ones first). A
    lighter relative of ``torch.distributed.tensor.debug.CommDebugMode``, which also tracks modules."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return NotImplemented  # DTensor first decomposes the op into plain ops and collectives
        namespace = func.namespace
        if namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            name = func._overloadpacket.__name__
            key = _COLLECTIVES.get(name, name)
            self.counts[key] = self.counts.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


#: The 32 samples' lengths (tokens) of the chapter's exercise Q3, the same for every learner.
Q3_LENGTHS = [(i * 37) % 241 + 8 for i in range(32)]


def random_batches(lengths: Sequence[int], world_size: int, batch: int, seed: int = 0) -> list[list[list[int]]]:
    """What ``DistributedSampler(shuffle=True)`` and a ``DataLoader(batch_size=batch)`` give each rank:
    ``plan[rank][step]`` is a list of sample indices. Every rank gets the same number of samples (the
    sampler's equal shards), but not the same number of tokens."""
    _check_plan_args(lengths, world_size, batch)
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    steps = len(order) // (world_size * batch)
    return [[order[rank::world_size][i * batch:(i + 1) * batch] for i in range(steps)] for rank in range(world_size)]


def length_grouped_batches(lengths: Sequence[int], world_size: int, batch: int, seed: int = 0) -> list[list[list[int]]]:
    """Length-sorted buckets: the samples sorted by length, cut into groups of ``world_size * batch`` (one
    step of every rank), each group dealt to the ranks back and forth (snake order) so that every rank of a
    step gets samples of nearly the same lengths; the steps then come in a random order."""
    _check_plan_args(lengths, world_size, batch)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=gen).tolist()  # ties broken at random
    order.sort(key=lambda i: lengths[i], reverse=True)
    group = world_size * batch
    steps = len(order) // group
    plan: list[list[list[int]]] = [[] for _ in range(world_size)]
    for i in torch.randperm(steps, generator=gen).tolist():
        chunk = order[i * group:(i + 1) * group]
        for rank in range(world_size):
            plan[rank].append([])
        for j, idx in enumerate(chunk):
            lap, pos = divmod(j, world_size)
            rank = pos if lap % 2 == 0 else world_size - 1 - pos
            plan[rank][-1].append(idx)
    return plan


def _check_plan_args(lengths: Sequence[int], world_size: int, batch: int) -> None:
    if world_size < 1 or batch < 1:
        raise ValueError(f"world_size and batch must be at least 1, got {world_size} and {batch}")
    if len(lengths) < world_size * batch:
        raise ValueError(f"{len(lengths)} samples do not make one step of {world_size} ranks x {batch}")


def imbalance(plan: Sequence[Sequence[Sequence[int]]], lengths: Sequence[int]) -> float:
    """Over all steps, the tokens of the busiest rank of each step divided by the mean rank's: 1.0 when
    every rank of every step has the same work, and the factor by which a step waits for its slowest rank
    when time is proportional to tokens."""
    tokens = [[sum(lengths[i] for i in b) for b in rank] for rank in plan]
    steps = list(zip(*tokens, strict=True))
    return sum(max(s) for s in steps) / sum(sum(s) / len(s) for s in steps)


def write_record(folder: str | Path | None, stem: str, rank: int, record: Mapping[str, Any]) -> None:
    """Rank `rank`'s record as ``<folder>/<stem>_rank<rank>.json`` (nothing when `folder` is None)."""
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        Path(folder, f"{stem}_rank{rank}.json").write_text(json.dumps(record))


def load_records(folder: str | Path, stem: str) -> list[dict]:
    """Every rank's record of `stem` in `folder`, in rank order; a clear error if none was written."""
    paths = sorted(Path(folder).glob(f"{stem}_rank*.json"), key=lambda p: int(p.stem.rpartition("rank")[2]))
    if not paths:
        raise FileNotFoundError(f"no record {stem}_rank*.json in {folder}: did the script run with --out?")
    return [json.loads(p.read_text()) for p in paths]


def chunk_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of a ``Shard(0)`` parameter that rank `rank` of `world_size` holds:
    ``torch.chunk``'s split, ``ceil(rows / N)`` rows per rank, the last ones shorter or empty."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    size = math.ceil(rows / world_size)
    return min(rank * size, rows), min((rank + 1) * size, rows)




# ---------------------------------------------------------------------------------------------
# Pipeline schedules in unit time (the widget, and the "formula" line of the script)
# ---------------------------------------------------------------------------------------------

SCHEDULES = ("GPipe", "1F1B")
#: The schedule explorer's default view (also what the notebook's static twin shows).
SCHEDULE_DEFAULTS = dict(stages=4, microbatches=8, schedule="1F1B")


def schedule_orders(schedule: str, stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """The order in which each stage runs its forwards ("F", i) and backwards ("B", i), as PyTorch's
    ``ScheduleGPipe`` and ``Schedule1F1B`` run them: GPipe every forward then every backward; 1F1B
    ``stages - s`` forwards first on stage s, then one backward and one forward in turn, then the rest."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages and microbatches must be at least 1, got {stages} and {microbatches}")
    orders = []
    for s in range(stages):
        if schedule == "GPipe":
            orders.append([("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)])
            continue
        warmup = min(microbatches, stages - s)
        order = [("F", i) for i in range(warmup)]
        f, b = warmup, 0
        while b < microbatches:
            order.append(("B", b))
            b += 1
            if f < microbatches:
                order.append(("F", f))
                f += 1
        orders.append(order)
    return orders


def run_in_unit_time(orders: Sequence[Sequence[tuple[str, int]]], backward_cost: int = 2) -> list[list[tuple]]:
    """Each stage's actions with their start and end, as if a forward took 1 unit of time, a backward
    `backward_cost`, and messages none: a stage starts an action when it has finished its previous one
    and the action's input exists (F of micro-batch i needs F of i on the stage before; B of i needs B of
    i on the stage after, or F of i on the last stage). ``[stage][k] = (kind, i, start, end)``."""
    stages = len(orders)
    done: dict[tuple[int, str, int], int] = {}
    position, clock = [0] * stages, [0] * stages
    out: list[list[tuple]] = [[] for _ in range(stages)]
    while any(position[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, mb = orders[s][position[s]]
            if kind == "F":
                need = (s - 1, "F", mb) if s > 0 else None
            else:
                need = (s + 1, "B", mb) if s < stages - 1 else (s, "F", mb)
            if need is not None and need not in done:
                continue
            start = max(clock[s], done[need] if need else 0)
            clock[s] = start + (1 if kind == "F" else backward_cost)
            done[(s, kind, mb)] = clock[s]
            out[s].append((kind, mb, start, clock[s]))
            position[s] += 1
            moved = True
        if not moved:
            raise RuntimeError("the stages' orders wait on each other: not a valid schedule")
    return out


def timeline_facts(timeline: Sequence[Sequence[tuple]]) -> dict:
    """The bubble (idle fraction of stages x step time) and the most micro-batches whose activations a
    stage holds at once (forwards done, backwards not yet), from a timeline of (kind, i, start, end)."""
    span = (max(end for stage in timeline for *_, end in stage)
            - min(start for stage in timeline for _, _, start, _ in stage))
    busy = sum(end - start for stage in timeline for _, _, start, end in stage)
    peaks = []
    for stage in timeline:
        held = peak = 0
        for kind, *_ in sorted(stage, key=lambda e: e[2]):
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return {"bubble": 1 - busy / (len(timeline) * span), "peak_in_flight": peaks, "span": span}


def _draw_timeline(ax: Any, timeline: Sequence[Sequence[tuple]], unit: str) -> None:
    from .figures import COLORS

    colors = {"F": COLORS["blue"], "B": COLORS["orange"]}
    for s, stage in enumerate(timeline):
        for kind, mb, start, end in stage:
            ax.barh(s, end - start, left=start, color=colors[kind], edgecolor="white", height=0.8)
            ax.text((start + end) / 2, s, f"{kind}{mb}", ha="center", va="center", fontsize=7,
                    color="white" if kind == "F" else "black")
    ax.set_yticks(range(len(timeline)), [tr(f"stage {s}", f"阶段 {s}") for s in range(len(timeline))])
    ax.invert_yaxis()
    ax.set_xlabel(unit)


def draw_schedule(stages: int = 4, microbatches: int = 8, schedule: str = "1F1B", backward_cost: int = 2) -> Any:
    """The timeline of `schedule` on `stages` stages and `microbatches` micro-batches in unit time
    (a forward 1, a backward `backward_cost`), its bubble against ``(p-1)/(m+p-1)`` and the activations held."""
    from .figures import describe_figure, pyplot

    plt = pyplot()
    timeline = run_in_unit_time(schedule_orders(schedule, stages, microbatches), backward_cost)
    facts = timeline_facts(timeline)
    formula = bubble_fraction(stages, microbatches)
    fig, ax = plt.subplots(figsize=(9, 0.45 * stages + 1.4))
    _draw_timeline(ax, timeline, tr("time (a forward = 1 unit, a backward = 2)",
                                    "时间（前向 = 1 个单位，反向 = 2 个）"))
    ax.set_title(tr(f"{schedule}, {stages} stages, {microbatches} micro-batches: bubble {facts['bubble']:.3f} "
                    f"(formula {formula:.3f}); stage 0 holds at most {facts['peak_in_flight'][0]} micro-batches",
                    f"{schedule}，{stages} 个阶段，{microbatches} 个微批次：气泡 {facts['bubble']:.3f}"
                    f"（公式 {formula:.3f}）；阶段 0 最多同时持有 {facts['peak_in_flight'][0]} "
                    "个微批次"), fontsize=9)
    fig.tight_layout()
    return describe_figure(
        fig,
        f"A timeline of the {schedule} pipeline schedule: {stages} rows (stages) of boxes, blue forwards F0 to "
        f"F{microbatches - 1} and orange backwards, in unit time. Idle fraction {facts['bubble']:.3f}, equal to "
        f"(p-1)/(m+p-1) = {formula:.3f}; stage 0 holds the activations of at most {facts['peak_in_flight'][0]} "
        "micro-batches at once.",
        f"{schedule} 流水线调度的时间线：{stages} 行（阶段）方块，蓝色为前向 F0 到 "
        f"F{microbatches - 1}，橙色为反向，"
        f"单位时间。空闲比例 {facts['bubble']:.3f}，等于 (p-1)/(m+p-1) = "
        f"{formula:.3f}；阶段 0 最多同时持有 "
        f"{facts['peak_in_flight'][0]} 个微批次的激活。")


def schedule_explorer() -> Any:
    """Sliders for the stages and micro-batches and a menu for the schedule; redraws :func:`draw_schedule`."""
    import ipywidgets as w

    from .figures import show_figure

    d = SCHEDULE_DEFAULTS
    stages = w.IntSlider(value=d["stages"], min=1, max=8, description=tr("stages", "阶段数"),
                         continuous_update=False)
    micro = w.IntSlider(value=d["microbatches"], min=1, max=16, description=tr("micro-batches", "微批次"),
                        continuous_update=False)
    schedule = w.Dropdown(options=list(SCHEDULES), value=d["schedule"], description=tr("schedule", "调度"))
    out = w.interactive_output(lambda stages, microbatches, schedule: show_figure(
        draw_schedule(stages, microbatches, schedule)), {"stages": stages, "microbatches": micro, "schedule": schedule})
    return w.VBox([w.HBox([stages, micro, schedule]), out])


# ---------------------------------------------------------------------------------------------
# The chapter's pictures of what the scripts measured
# ---------------------------------------------------------------------------------------------


def draw_tp_shards(record: Mapping[str, Any], world: int) -> Any:
    """The block's four big weights, each drawn as its full matrix cut into the parts the ranks hold:
    column-wise layers by rows (output features), row-wise layers by columns (input features)."""
    from matplotlib.patches import Rectangle

    from .figures import OKABE_ITO, describe_figure, pyplot

    plt = pyplot()
    shards = record["shards"]
    names = [("attn.q.weight", "ColwiseParallel"), ("attn.o.weight", "RowwiseParallel"),
             ("mlp.up.weight", "ColwiseParallel"), ("mlp.down.weight", "RowwiseParallel")]
    fig, axes = plt.subplots(1, 4, figsize=(10, 3.2))
    for ax, (name, style) in zip(axes, names, strict=True):
        (rows, cols), (lr, lc) = shards[name]
        by_rows = lr != rows
        for k in range(world):
            if by_rows:
                ax.add_patch(Rectangle((0, k * lr), cols, lr, color=OKABE_ITO[k % 7], alpha=0.85))
            else:
                ax.add_patch(Rectangle((k * lc, 0), lc, rows, color=OKABE_ITO[k % 7], alpha=0.85))
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_title(f"{name}\n{style}: {[lr, lc]} {tr('per rank', '每个 rank')}", fontsize=8)
        ax.set_xlabel(tr("input features", "输入特征"), fontsize=8)
        ax.set_ylabel(tr("output features", "输出特征"), fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [Rectangle((0, 0), 1, 1, color=OKABE_ITO[k % 7]) for k in range(world)]
    fig.legend(handles, [f"rank {k}" for k in range(world)], loc="lower center", ncol=world, fontsize=8)
    fig.suptitle(tr("What each rank holds of the block's weights under tensor parallelism",
                    "张量并行下每个 rank 持有块中权重的哪一部分"), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    parts = "; ".join(f"{n} {shards[n][0]} -> {shards[n][1]}" for n, _ in names)
    return describe_figure(
        fig, f"Four weight matrices drawn as rectangles, each cut into {world} coloured parts, one per rank: q and up "
        f"are cut by rows (output features, ColwiseParallel), o and down by columns (input features, RowwiseParallel). "
        f"Full shape -> each rank's part: {parts}.",
        f"四个权重矩阵画成矩形，每个切成 {world} 个彩色部分，每个 rank 一份：q 和 up "
        "按行切分（输出特征，ColwiseParallel），"
        "o 和 down 按列切分（输入特征，RowwiseParallel）。完整形状 -> 每个 "
        f"rank 的部分：{parts}。")


def draw_pipeline(records: Sequence[Mapping[str, Any]]) -> Any:
    """The measured timeline of one training step of each schedule: every stage's forwards and backwards
    of every micro-batch, in milliseconds from the step's start."""
    from .figures import describe_figure, pyplot

    plt = pyplot()
    names = list(records[0]["results"])
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 + 1.1 * len(names) * len(records) / 2 + 0.6), sharex=True)
    for ax, name in zip(axes, names, strict=True):
        timeline = [[(k, mb, 1000 * s, 1000 * e) for k, mb, s, e in rec["results"][name]["events"]] for rec in records]
        _draw_timeline(ax, timeline, tr("milliseconds from the start of the step",
                                        "从这一步开始算起的毫秒数"))
        held = [rec["results"][name]["peak_in_flight"] for rec in records]
        ax.set_title(tr(f"{name}: micro-batches held at once per stage {held}",
                        f"{name}：每个阶段同时持有的微批次 {held}"), fontsize=9)
    fig.tight_layout()
    m, n = records[0]["microbatches"], len(records)
    return describe_figure(
        fig, f"Two timelines measured on {n} ranks, GPipe above and 1F1B below: for each stage a row of blue forward "
        f"boxes and orange backward boxes of micro-batches 0 to {m - 1}. GPipe runs every forward before any backward; "
        "1F1B interleaves them, so stage 0 holds fewer micro-batches at once.",
        f"在 {n} 个 rank 上测得的两条时间线，上为 GPipe，下为 1F1B：每个阶段一行，"
        f"蓝色为微批次 0 到 {m - 1} 的前向，"
        "橙色为反向。GPipe 先做完所有前向再做反向；1F1B 让两者交替，"
        "因此阶段 0 同时持有的微批次更少。")


def draw_mesh(records: Sequence[Mapping[str, Any]]) -> Any:
    """Which rows of attn.q.weight (64 x 64) each rank of the 2-D mesh holds, under FSDP x TP and HSDP."""
    from matplotlib.patches import Rectangle

    from .figures import OKABE_ITO, describe_figure, pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, key, title in ((axes[0], "fsdp_tp", tr("FSDP x TP (dp, tp)", "FSDP x TP (dp, tp)")),
                           (axes[1], "hsdp", tr("HSDP (replicate, shard)", "HSDP (replicate, shard)"))):
        for rec in records:
            rows, r = rec[key]["rows"], rec["rank"]
            ax.add_patch(Rectangle((r, rows[0]), 0.9, len(rows), color=OKABE_ITO[r % 7]))
            ax.text(r + 0.45, rows[0] + len(rows) / 2, f"{rows[0]}-{rows[-1]}", ha="center", va="center", fontsize=8,
                    rotation=90)
        ax.set_xlim(-0.1, len(records))
        ax.set_ylim(64, 0)
        ax.set_xticks([r + 0.45 for r in range(len(records))],
                      [f"rank {rec['rank']}\n{tuple(rec[key]['coords'])}" for rec in records], fontsize=8)
        ax.set_ylabel(tr("row of attn.q.weight", "attn.q.weight 的行"))
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    def held(key: str, rows: str, sep: str) -> str:
        return sep.join(f"rank {rec['rank']} " + rows.format(rec[key]["rows"][0], rec[key]["rows"][-1])
                        for rec in records)

    return describe_figure(
        fig, f"Two panels of {len(records)} bars, one per rank, marking the rows of the 64-row attn.q.weight that the "
        f"rank holds. FSDP x TP: {held('fsdp_tp', 'rows {}-{}', '; ')}. HSDP: {held('hsdp', 'rows {}-{}', '; ')} "
        f"(two copies).",
        f"两幅图，各有 {len(records)} 个条，每个 rank 一条，标出该 rank 持有 64 行的 "
        "attn.q.weight 中的哪些行。"
        f"FSDP x TP：{held('fsdp_tp', '第 {}-{} 行', '；')}"
        f"。HSDP：{held('hsdp', '第 {}-{} 行', '；')}（两份副本）。")


def draw_overlap(record: Mapping[str, Any]) -> Any:
    """The profiler's timeline of one DDP backward (the autograd nodes that compute, the all-reduces that
    communicate) and, for each bucket size, how much communication ran during backward and after it."""
    from .figures import COLORS, describe_figure, pyplot

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    trace = record["trace"]
    for start, end, _ in trace["compute"]:
        ax.barh(1, end - start, left=start, color=COLORS["blue"], height=0.6)
    for start, end, _ in trace["comm"]:
        ax.barh(0, end - start, left=start, color=COLORS["orange"], height=0.6, edgecolor="black", linewidth=0.5)
    ax.set_yticks([0, 1], [tr("all-reduces\n(gloo's thread)", "all-reduce\n（gloo 的线程）"),
                           tr("backward\n(main thread)", "反向传播\n（主线程）")])
    ax.set_xlabel(tr("milliseconds", "毫秒"))
    ax.set_title(tr("One DDP backward, 1 MiB buckets (torch.profiler, rank 0)",
                    "一次 DDP 反向传播，1 MiB 桶（torch.profiler，rank 0）"), fontsize=9)
    caps = list(record["sweep"])
    over = [1000 * record["sweep"][c]["overlapped"] for c in caps]
    exposed = [1000 * record["sweep"][c]["exposed"] for c in caps]
    xs = range(len(caps))
    bx.bar(xs, over, color=COLORS["green"], label=tr("during backward", "反向传播期间"))
    bx.bar(xs, exposed, bottom=over, color=COLORS["vermilion"],
           label=tr("exposed after backward", "反向传播之后暴露的"))
    bx.set_xticks(list(xs), [f"{float(c):g}\n({record['sweep'][c]['buckets']})" for c in caps])
    bx.set_xlabel(tr("bucket_cap_mb (buckets)", "bucket_cap_mb（桶数）"))
    bx.set_ylabel(tr("communication, ms (median)", "通信，毫秒（中位数）"))
    bx.legend(fontsize=8)
    bx.set_title(tr("Where the all-reduces ran", "all-reduce 在何时运行"), fontsize=9)
    fig.tight_layout()
    return describe_figure(
        fig, f"Left: a timeline of one DDP backward on rank 0, blue bars for the autograd nodes computing on the main "
        f"thread and orange bars for the {len(trace['comm'])} gradient all-reduces on gloo's thread, the first of them "
        "beside the blue ones. Right: for each bucket_cap_mb, stacked bars of the communication time that ran during "
        "backward (green) and after it (red).",
        "左：rank 0 上一次 DDP 反向传播的时间线，蓝条是主线程上计算的 autograd "
        "节点，橙条是 gloo 线程上的 "
        f"{len(trace['comm'])} 次梯度 all-reduce，其中最先的几次与蓝条并排。右：每种 "
        "bucket_cap_mb 下，"
        "堆叠的条形表示在反向传播期间（绿）和之后（红）运行的通信时间。")


def draw_stragglers(records: Sequence[Mapping[str, Any]]) -> Any:
    """Each rank's step time before and after one rank was slowed, split into compute and the time in the
    all-reduce (waiting for the others, then communicating)."""
    from .figures import COLORS, describe_figure, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.38
    for rec in records:
        r = rec["rank"]
        for k, (key, hatch) in enumerate((("base", ""), ("slowed", "//"))):
            m = rec[key]
            x = r + (k - 0.5) * width
            ax.bar(x, 1000 * m["compute"], width, color=COLORS["blue"], hatch=hatch, edgecolor="white")
            ax.bar(x, 1000 * m["allreduce"], width, bottom=1000 * m["compute"], color=COLORS["orange"], hatch=hatch,
                   edgecolor="white")
    slow, delay = records[0]["slow_rank"], records[0]["delay"]
    ax.set_xticks(range(len(records)),
                  [f"rank {rec['rank']}" + (tr(" (slowed)", "（被减速）") if rec["rank"] == slow else "")
                   for rec in records])
    ax.set_ylabel(tr("milliseconds per step (median)", "每步毫秒数（中位数）"))
    ax.bar(0, 0, color=COLORS["blue"], label=tr("compute", "计算"))
    ax.bar(0, 0, color=COLORS["orange"], label=tr("in the all-reduce", "在 all-reduce 中"))
    ax.legend(fontsize=8, title=tr("left: no delay; right, hatched: one rank slowed",
                                   "左：无延迟；右（斜线）：一个 rank 被减速"), title_fontsize=8)
    ax.set_title(tr(f"Rank {slow} sleeps {1000 * delay:.0f} ms a step: every rank's step grows by about as much",
                    f"rank {slow} 每步多睡 {1000 * delay:.0f} 毫秒："
                    "每个 rank 的每一步都变长了差不多同样多"), fontsize=9)
    fig.tight_layout()
    return describe_figure(
        fig, f"Grouped stacked bars per rank: a step's compute (blue) and time in the all-reduce (orange), without a "
        f"delay and with rank {slow} sleeping {1000 * delay:.0f} ms per step. With the delay every rank's bar grows "
        f"by about {1000 * delay:.0f} ms: the slowed rank's in compute, the others' in the all-reduce, "
        "where they wait.",
        "每个 rank 一组堆叠条形：一步中的计算（蓝）和在 all-reduce 中的时间（橙），"
        f"分别是无延迟时和 rank {slow} "
        f"每步多睡 {1000 * delay:.0f} 毫秒时。有延迟时每个 rank 的条都增长了约 "
        f"{1000 * delay:.0f} 毫秒："
        "被减速的 rank 增长在计算上，其他 rank 增长在 all-reduce 中的等待上。")
