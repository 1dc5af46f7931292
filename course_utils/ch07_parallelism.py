"""Chapter 07: every parallelism the source names, on 2-4 CPU ranks. The small transformer block the
tensor- and pipeline-parallel scripts split, the pieces of measurement the scripts share (a per-rank
JSON record, max differences, the ring model of an all-reduce). The pipeline schedules in unit time are
in ``ch07_schedules`` and the pictures of what the scripts measured in ``ch07_figures``; their names are
imported here, so the notebook and the scripts import everything from this module."""

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

from .ch07_figures import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    draw_mesh,
    draw_overlap,
    draw_pipeline,
    draw_stragglers,
    draw_tp_shards,
)
from .ch07_schedules import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    SCHEDULE_DEFAULTS,
    SCHEDULES,
    bubble_fraction,
    draw_schedule,
    run_in_unit_time,
    schedule_explorer,
    schedule_orders,
    timeline_facts,
)

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


