"""Chapter 06: the pitfalls of PyTorch training, each one reproduced, measured and fixed.

Every pitfall here is a small, seeded function that runs the buggy code and the fixed
code and returns *measurements* (a loss, a count, an overlap, bytes kept alive), so a
notebook can assert that the bug really happens and that the fix really removes it.
:class:`PitfallLedger` records those checks and builds the chapter's summary table
from them; :func:`switchboard_run` trains one small model with any set of mistakes
switched on (the logic behind the chapter's widget).

Nothing runs at import time; the functions that start processes are bounded by a
timeout and clean up after themselves.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import html
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

from .launch import SpawnFailed, spawn_bounded  # noqa: F401 (part of this chapter's API)
from .models import MLP  # the source chapter's MLP (4.2), every layer declared in __init__

# ---------------------------------------------------------------------------------------------
# The record of one pitfall's check, and the summary table built from the records
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    """A measurement as short, stable text: whole numbers with thousands separators, floats at 4 places."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:,.4f}"
    return str(value)


@dataclass(frozen=True)
class PitfallResult:
    """One pitfall, checked: what was measured with the bug and with the fix.

    ``bug_seen`` says the bug measurably happened; ``fixed`` says the same measurement
    came out right after the fix. Both must be True for the check to pass.
    """

    key: str
    title: str
    measure: str
    bug: Any
    fix: Any
    bug_seen: bool
    fixed: bool

    @property
    def ok(self) -> bool:
        return bool(self.bug_seen and self.fixed)

    def line(self) -> str:
        bug = "bug reproduced" if self.bug_seen else "BUG NOT REPRODUCED"
        fix = "fix works" if self.fixed else "FIX DOES NOT WORK"
        return f"{self.title}: {self.measure}: with the bug {_fmt(self.bug)}, fixed {_fmt(self.fix)} ({bug}; {fix})"

    def __repr__(self) -> str:
        return self.line()


@dataclass(frozen=True)
class SummaryTable:
    """The chapter's closing table; plain text in a terminal, an HTML table in Jupyter."""

    results: tuple[PitfallResult, ...]

    HEADER = ("#", "pitfall", "measured", "with the bug", "fixed", "check")

    def rows(self) -> list[tuple[str, ...]]:
        return [
            (str(i), r.title, r.measure, _fmt(r.bug), _fmt(r.fix), "pass" if r.ok else "FAIL")
            for i, r in enumerate(self.results, 1)
        ]

    @property
    def all_ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def __repr__(self) -> str:
        rows = [self.HEADER, *self.rows()]
        widths = [max(len(row[c]) for row in rows) for c in range(len(self.HEADER))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self.HEADER)
        body = []
        for row in self.rows():
            colour = "#1b7f3a" if row[-1] == "pass" else "#b3261e"
            cells = "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row[:-1])
            body.append(f"<tr>{cells}<td style='color:{colour}'><b>{row[-1]}</b></td></tr>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def summary_table(results: Sequence[PitfallResult]) -> SummaryTable:
    """Build the summary table from check results (in the order given)."""
    return SummaryTable(tuple(results))


class PitfallLedger:
    """Collects the chapter's checks, in order, and turns them into the summary table.

    ``check(...)`` raises ``AssertionError`` when the bug did not show or the fix did not
    work, so a notebook that calls it fails loudly if PyTorch ever changes the behaviour.
    ``expect_error(...)`` wraps a cell that is *meant* to fail: it records the error and lets
    it through, so the learner sees it (the cell carries the ``raises-exception`` tag).
    """

    def __init__(self) -> None:
        self._results: dict[str, PitfallResult] = {}
        self.errors: dict[str, BaseException] = {}

    def check(self, key: str, title: str, measure: str, *, bug: Any, fix: Any,
              bug_seen: bool, fixed: bool) -> None:
        """Record one pitfall's measurements and print them; fail unless the bug showed and the fix worked."""
        result = PitfallResult(key, title, measure, bug, fix, bool(bug_seen), bool(fixed))
        self._results[key] = result  # re-running a cell replaces its row, keeps its place
        if not result.bug_seen:
            raise AssertionError(
                f"{title}: the bug did not happen ({measure} = {_fmt(bug)}), so this demonstration shows "
                "nothing. Did a PyTorch upgrade change this behaviour? Re-read the explanation above."
            )
        if not result.fixed:
            raise AssertionError(f"{title}: the fix did not work ({measure} = {_fmt(fix)}).")
        print(result.line())

    @contextlib.contextmanager
    def expect_error(self, key: str, error: type[BaseException] | tuple[type[BaseException], ...],
                     confirm: Callable[[BaseException], bool] | None = None) -> Iterator[None]:
        """Run the block, which must raise `error`; record it and re-raise it unchanged.

        `confirm(exc)` may check that the error is the one the lesson is about.
        """
        try:
            yield
        except error as exc:
            if confirm is not None and not confirm(exc):
                raise AssertionError(
                    f"{key}: the expected {type(exc).__name__} happened, but not for the reason this lesson "
                    f"shows: {exc}"
                ) from exc
            self.errors[key] = exc
            raise
        names = error.__name__ if isinstance(error, type) else " or ".join(e.__name__ for e in error)
        raise AssertionError(f"{key}: expected {names}, but the code ran without error: the bug did not happen.")

    @property
    def results(self) -> list[PitfallResult]:
        return list(self._results.values())

    def table(self) -> SummaryTable:
        return summary_table(self.results)


# ---------------------------------------------------------------------------------------------
# Shared small pieces: data, training loop, autograd measurements
# ---------------------------------------------------------------------------------------------


def _contained(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run `fn` with one intra-op thread and a forked global RNG, then restore both.

    These models are tiny: a second thread buys little, costs a lot on a busy machine (threads
    spin while waiting for a core), and one thread gives the same numbers on every machine. The
    helpers seed torch to reproduce a pitfall; the learner's random stream is theirs, so it is the
    same afterwards as before (``torch.random.fork_rng``), whether a cached result was used or not.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):
                return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


@lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from .data import digits_tensors

    x, y = digits_tensors("train")
    xt, yt = digits_tensors("test")
    return x.flatten(1), y, xt.flatten(1), yt


def digits_flat() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X_train [1438, 784], y_train, X_test [359, 784], y_test): the course's digits, flattened."""
    return tuple(t.clone() for t in _digits())  # type: ignore[return-value]


def _batches(n: int, batch_size: int, steps: int, seed: int) -> list[torch.Tensor]:
    """`steps` mini-batches of indices, reshuffled every pass over `n` items (seeded)."""
    g = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    perm = torch.randperm(n, generator=g)
    pos = 0
    while len(out) < steps:
        if pos + batch_size > n:
            perm, pos = torch.randperm(n, generator=g), 0
        out.append(perm[pos : pos + batch_size])
        pos += batch_size
    return out


def saved_tensor_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run `fn()` and count the bytes autograd saved for a backward pass meanwhile.

    Returns ``(fn's result, bytes)``. Under ``torch.no_grad()`` nothing is saved: 0.
    """
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total


def graph_size(t: Any) -> tuple[int, int]:
    """(nodes, bytes of saved tensors) of the autograd graph that `t` keeps alive.

    A Python float (``loss.item()``) keeps nothing: (0, 0). Tensors shared by several
    nodes (the weights) are counted once.
    """
    if not isinstance(t, torch.Tensor) or t.grad_fn is None:
        return 0, 0
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except RuntimeError:  # already freed
                    continue
                values = value if isinstance(value, tuple | list) else (value,)
                for v in values:
                    if isinstance(v, torch.Tensor) and v.numel():
                        s = v.untyped_storage()
                        storages[s.data_ptr()] = s.nbytes()
        stack.extend(fn for fn, _ in node.next_functions)
    return len(seen), sum(storages.values())


# ---------------------------------------------------------------------------------------------
# Pitfall 1: an nn.Module created inside forward() never trains
# ---------------------------------------------------------------------------------------------


class LayerInForwardMLP(nn.Module):
    """The bug: ``fc2`` is created inside ``forward``, so it is new and random at every call,
    never registered, never seen by the optimizer."""

    def __init__(self, in_dim: int = 784, hidden_dim: int = 256, out_dim: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.relu = nn.ReLU()
        self.hidden_dim, self.out_dim = hidden_dim, out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc2 = nn.Linear(self.hidden_dim, self.out_dim)  # BUG: a new layer at every call
        return fc2(self.relu(self.fc1(x)))


@dataclass
class LayerRun:
    """What training a model for a few steps showed."""

    n_params: int
    losses: list[float]
    same_input_diff: float  # max |f(x) - f(x)| for two calls on the same input


def _train_mlp(model: nn.Module, steps: int, lr: float, batch_size: int, seed: int) -> list[float]:
    x, y, _, _ = _digits()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for idx in _batches(len(x), batch_size, steps, seed):
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@_contained
def train_briefly(model: nn.Module, steps: int = 40, lr: float = 0.1, batch_size: int = 64, seed: int = 0) -> LayerRun:
    """Train `model` for a few SGD steps on the digits; measure parameters, losses and repeatability."""
    n_params = sum(p.numel() for p in model.parameters())
    losses = _train_mlp(model, steps, lr, batch_size, seed)
    x = _digits()[0][:8]
    with torch.no_grad():
        diff = (model(x) - model(x)).abs().max().item()
    return LayerRun(n_params, losses, diff)


@_contained
def layer_in_forward(buggy: bool, steps: int = 40, lr: float = 0.1, batch_size: int = 64, seed: int = 0) -> LayerRun:
    """Train the source's MLP (fixed) or the same MLP with ``fc2`` created in forward (buggy)."""
    torch.manual_seed(seed)
    model = LayerInForwardMLP() if buggy else MLP()
    return train_briefly(model, steps, lr, batch_size, seed)


# ---------------------------------------------------------------------------------------------
# Pitfall 2: shuffle=True under DDP instead of DistributedSampler + set_epoch
# ---------------------------------------------------------------------------------------------


@_contained
def sampler_orders(n: int, world_size: int = 2, epochs: int = 2, mode: str = "sampler+set_epoch",
                   seed: int = 0, seed_per_rank: bool = False) -> list[list[list[int]]]:
    """The sample indices each rank visits, ``orders[epoch][rank]``, simulated in one process.

    mode: ``"shuffle"`` (every rank builds ``DataLoader(shuffle=True)`` after seeding torch the
    same way, as every rank of a DDP job does), ``"sampler"`` (``DistributedSampler`` without
    ``set_epoch``) or ``"sampler+set_epoch"``. ``DistributedSampler(num_replicas, rank)`` is
    exactly what each rank would build, so this is what a real job sees. ``seed_per_rank``
    seeds rank r with ``seed + r`` instead (a common attempt to "fix" ``shuffle=True``).
    """
    if mode not in ("shuffle", "sampler", "sampler+set_epoch"):
        raise ValueError(f"mode must be 'shuffle', 'sampler' or 'sampler+set_epoch', not {mode!r}")
    data = list(range(n))
    orders: list[list[list[int]]] = [[] for _ in range(epochs)]
    for rank in range(world_size):
        torch.manual_seed(seed + rank if seed_per_rank else seed)  # what every rank's script does at its top
        if mode == "shuffle":
            loader = DataLoader(data, batch_size=1, shuffle=True)
        else:
            sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
            loader = DataLoader(data, batch_size=1, sampler=sampler)
        for epoch in range(epochs):
            if mode == "sampler+set_epoch":
                sampler.set_epoch(epoch)
            orders[epoch].append([int(b) for batch in loader for b in batch])
    return orders


def overlap(a: Sequence[int], b: Sequence[int]) -> float:
    """Fraction of the samples of `a` that `b` also visits."""
    return len(set(a) & set(b)) / max(1, len(set(a)))


def same_position(a: Sequence[int], b: Sequence[int]) -> float:
    """Fraction of positions at which two orders hold the same sample."""
    return sum(x == y for x, y in zip(a, b, strict=False)) / max(1, min(len(a), len(b)))


def sampler_figure(n: int = 16, world_size: int = 2, epochs: int = 2):
    """Which rank sees which sample, when, for the three ways of building the loaders."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    modes = ("shuffle", "sampler", "sampler+set_epoch")
    titles = ("DataLoader(shuffle=True)", "DistributedSampler, no set_epoch", "DistributedSampler + set_epoch")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), sharey=True)
    cmap = ListedColormap(["#f2f2f2", *plt.get_cmap("viridis")(np.linspace(0.1, 0.95, n))])
    for ax, mode, title in zip(axes, modes, titles, strict=True):
        orders = sampler_orders(n, world_size, epochs, mode)
        grid = np.zeros((epochs * world_size, n))
        labels = []
        for e in range(epochs):
            for r in range(world_size):
                for pos, idx in enumerate(orders[e][r]):
                    grid[e * world_size + r, idx] = pos + 1
                labels.append(f"epoch {e}, rank {r}")
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=n, aspect="auto")
        for (row, col), v in np.ndenumerate(grid):
            if v:
                ax.text(col, row, int(v) - 1, ha="center", va="center", fontsize=7,
                        color="black" if v > 0.6 * n else "white")
        for e in range(1, epochs):
            ax.axhline(e * world_size - 0.5, color="black", lw=1.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("sample index")
        ax.set_xticks(range(0, n, 4))
        ax.set_yticks(range(len(labels)), labels)
    fig.suptitle("Number in a cell = position at which that rank visits that sample; grey = never", fontsize=10)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Pitfall 3: evaluating without eval() / no_grad()   (and: forgetting train() afterwards)
# ---------------------------------------------------------------------------------------------


class SwitchNet(nn.Module):
    """A small digits classifier with BatchNorm and Dropout (the modules that change with the mode).

    ``layer_in_forward=True`` plants pitfall 1: the output layer is created in ``forward``.
    """

    def __init__(self, layer_in_forward: bool = False, hidden: int = 64, p_drop: float = 0.3) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(784, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(p_drop))
        self.layer_in_forward = layer_in_forward
        self.hidden = hidden
        if not layer_in_forward:
            self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = nn.Linear(self.hidden, 10) if self.layer_in_forward else self.head
        return head(self.body(x))


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    correct = 0
    for i in range(0, len(x), batch_size):
        correct += (model(x[i : i + batch_size]).argmax(1) == y[i : i + batch_size]).sum().item()
    return correct / len(x)


@dataclass
class EvalReport:
    """What evaluating the same trained model in the wrong and the right way measured."""

    acc_train_mode: float  # model.train(), grad on
    acc_eval_mode: float  # model.eval() + no_grad
    logit_diff_train_mode: float  # max |f(x) - f(x)|, the same batch twice
    logit_diff_eval_mode: float
    bn_shift_train_mode: float  # how far BatchNorm's running mean moved during the evaluation
    bn_shift_eval_mode: float
    saved_bytes_grad: int  # bytes autograd saved for a backward pass that never comes
    saved_bytes_no_grad: int


@_contained
def eval_mode_effects(model: nn.Module, batch_size: int = 32, seed: int = 0) -> EvalReport:
    """Evaluate copies of `model` on the digits test set in train mode with autograd on (the bug)
    and with ``eval()`` + ``no_grad()`` (the fix); Dropout's randomness is seeded."""
    torch.manual_seed(seed)
    _, _, xt, yt = _digits()
    bad = copy.deepcopy(model).train()
    before = bad.body[1].running_mean.clone()
    acc_bad, bytes_bad = saved_tensor_bytes(lambda: _accuracy(bad, xt, yt, batch_size))
    shift_bad = (bad.body[1].running_mean - before).abs().max().item()
    diff_bad = (bad(xt[:batch_size]) - bad(xt[:batch_size])).abs().max().item()

    good = copy.deepcopy(model).eval()
    before = good.body[1].running_mean.clone()
    with torch.no_grad():
        acc_good, bytes_good = saved_tensor_bytes(lambda: _accuracy(good, xt, yt, batch_size))
        diff_good = (good(xt[:batch_size]) - good(xt[:batch_size])).abs().max().item()
    shift_good = (good.body[1].running_mean - before).abs().max().item()
    return EvalReport(acc_bad, acc_good, diff_bad, diff_good, shift_bad, shift_good, bytes_bad, bytes_good)


# ---------------------------------------------------------------------------------------------
# Pitfall 4: tensors on different devices (erratum 11)
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def single_process_group(backend: str = "gloo") -> Iterator[None]:
    """A process group of one process (rank 0 of 1), inside this process: enough to build a DDP
    model in a notebook. Uses a file store in a temporary folder (no port); always torn down."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; call "
                           "torch.distributed.destroy_process_group() first.")
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@dataclass
class DeviceReport:
    """What happened when labels (or a class-weight tensor) stayed on the CPU."""

    model_device: str
    input_device_after_ddp: str  # where DDP's input mover put the CPU input
    labels_error: str  # the error of the loss with labels on the CPU ("" if none)
    weights_error: str  # the error of a loss whose class weights were made on the CPU
    fixed_loss_device: str  # the loss after the fix (labels and weights moved)
    real_ddp: bool  # True when a real DDP wrapper on a GPU did the moving

    @property
    def bug_seen(self) -> bool:
        return "device" in self.labels_error and "device" in self.weights_error

    @property
    def fixed(self) -> bool:
        return self.fixed_loss_device == self.model_device


def _error_text(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return ""


@_contained
def device_mismatch(device: torch.device | str | None = None, seed: int = 0) -> DeviceReport:
    """Reproduce pitfall 4. With a GPU: a real one-process DDP model on ``cuda`` (DDP moves the
    input; labels and class weights left on the CPU break the loss). Without one: the ``meta``
    device stands in for the GPU, and the input is moved there as ``DDP.forward``'s input mover
    does (``x.to(device)``; DDP cannot be built on ``meta``); the same loss breaks with the same
    kind of error."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("meta")
    device = torch.device(device)
    torch.manual_seed(seed)
    x = torch.randn(8, 784)  # a batch straight from a DataLoader: on the CPU
    y = torch.randint(0, 10, (8,))
    weights = torch.ones(10)  # e.g. class weights made with torch.ones(...) outside the model
    model = MLP().to(device)

    if device.type == "cuda":
        from torch.nn.parallel import DistributedDataParallel as DDP

        with single_process_group("gloo"):
            ddp = DDP(model, device_ids=[device.index or 0])
            out = ddp(x)  # DDP moves x to the GPU itself
            report = _device_report(device, out, y, weights, real_ddp=True)
        return report
    out = model(x.to(device))  # what DDP's forward does to the input
    return _device_report(device, out, y, weights, real_ddp=False)


def _device_report(device: torch.device, out: torch.Tensor, y: torch.Tensor, weights: torch.Tensor,
                   real_ddp: bool) -> DeviceReport:
    labels_error = _error_text(lambda: F.cross_entropy(out, y))
    weights_error = _error_text(lambda: nn.CrossEntropyLoss(weight=weights)(out, y.to(device)))
    fixed = nn.CrossEntropyLoss(weight=weights).to(device)(out, y.to(device))  # the fix
    return DeviceReport(str(device), str(out.device), labels_error, weights_error, str(fixed.device), real_ddp)


# ---------------------------------------------------------------------------------------------
# Pitfall 5: forgetting zero_grad, versus accumulating on purpose (erratum 7)
# ---------------------------------------------------------------------------------------------


@_contained
def grad_norms(calls: int = 3, zero_grad: bool = False, seed: int = 0) -> list[float]:
    """Norm of ``fc1.weight.grad`` after each of `calls` backward passes on the same batch.

    Without ``zero_grad`` it grows linearly (1x, 2x, 3x ...), because ``.grad`` accumulates;
    with ``zero_grad`` before each pass it stays the same.
    """
    torch.manual_seed(seed)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y, _, _ = _digits()
    norms = []
    for _ in range(calls):
        if zero_grad:
            opt.zero_grad()
        F.cross_entropy(model(x[:64]), y[:64]).backward()
        norms.append(model.fc1.weight.grad.norm().item())
    return norms


@dataclass
class AccumulationReport:
    """One big batch against k accumulated micro-batches."""

    k: int
    max_grad_diff_scaled: float  # loss / k, step after k micro-batches: equals the big batch
    max_grad_diff_unscaled: float  # forgot to divide by k: gradients k times too large
    max_param_diff_after_step: float


@_contained
def accumulation_equivalence(k: int = 4, batch_size: int = 64, seed: int = 0) -> AccumulationReport:
    """Gradient accumulation done right equals one big batch, numerically (float64, no BatchNorm)."""
    x, y, _, _ = _digits()
    x, y = x[:batch_size].double(), y[:batch_size]
    torch.manual_seed(seed)
    big = MLP().double()
    acc = copy.deepcopy(big)
    unscaled = copy.deepcopy(big)
    opt_big = torch.optim.SGD(big.parameters(), lr=0.1)
    opt_acc = torch.optim.SGD(acc.parameters(), lr=0.1)

    opt_big.zero_grad()
    F.cross_entropy(big(x), y).backward()

    opt_acc.zero_grad()
    for xs, ys in zip(x.chunk(k), y.chunk(k), strict=True):
        (F.cross_entropy(acc(xs), ys) / k).backward()  # scale each micro-batch's loss by 1/k
        F.cross_entropy(unscaled(xs), ys).backward()  # the mistake: no 1/k

    def max_diff(a: nn.Module, b: nn.Module, grads: bool) -> float:
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return max(((p.grad - q.grad) if grads else (p - q)).abs().max().item() for p, q in pairs)

    d_scaled, d_unscaled = max_diff(acc, big, True), max_diff(unscaled, big, True)
    opt_big.step()
    opt_acc.step()
    with torch.no_grad():
        d_params = max_diff(acc, big, False)
    return AccumulationReport(k, d_scaled, d_unscaled, d_params)


@_contained
def no_sync_allreduce_calls(k: int = 4, use_no_sync: bool = True, seed: int = 0) -> tuple[int, torch.Tensor]:
    """Accumulate k micro-batches in a one-process DDP model; count the gradient all-reduces.

    Returns ``(all-reduce calls, fc1.weight.grad)``. Without ``no_sync`` DDP all-reduces after every
    micro-batch (k calls); inside ``no_sync`` only after the last one (1 call), same gradient.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y, _, _ = _digits()
    x, y = x[:64], y[:64]
    calls = 0

    def counting_hook(state, bucket):  # no annotations: DDP checks them, and they are strings here
        nonlocal calls
        calls += 1
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    with single_process_group("gloo"):
        torch.manual_seed(seed)
        model = DDP(MLP(), bucket_cap_mb=1000)  # one bucket: one call per synchronisation
        model.register_comm_hook(None, counting_hook)
        chunks = list(zip(x.chunk(k), y.chunk(k), strict=True))
        for i, (xs, ys) in enumerate(chunks):
            last = i == k - 1
            ctx = model.no_sync() if (use_no_sync and not last) else contextlib.nullcontext()
            with ctx:
                (F.cross_entropy(model(xs), ys) / k).backward()
        grad = model.module.fc1.weight.grad.clone()
    return calls, grad


# ---------------------------------------------------------------------------------------------
# The recap's retain_graph claim (erratum 2)
# ---------------------------------------------------------------------------------------------


@dataclass
class SecondDerivative:
    """d/dx and d2/dx2 of x**3 at x, and what retain_graph=True alone allows."""

    first: float
    second_with_create_graph: float
    retain_graph_first_has_grad_fn: bool
    retain_graph_error: str
    backward_twice_grad: float  # retain_graph=True: a second backward pass accumulates into .grad


def second_derivative(x0: float = 2.0) -> SecondDerivative:
    """x**3: first derivative 3x^2, second 6x. Only ``create_graph=True`` gives the second one."""
    x = torch.tensor(x0, requires_grad=True)
    (g,) = torch.autograd.grad(x**3, x, create_graph=True)
    (h,) = torch.autograd.grad(g, x)

    x2 = torch.tensor(x0, requires_grad=True)
    (g2,) = torch.autograd.grad(x2**3, x2, retain_graph=True)
    err = _error_text(lambda: torch.autograd.grad(g2, x2))

    x3 = torch.tensor(x0, requires_grad=True)
    z = x3**3
    z.backward(retain_graph=True)
    z.backward()
    return SecondDerivative(g.item(), h.item(), g2.grad_fn is not None, err, x3.grad.item())


# ---------------------------------------------------------------------------------------------
# Erratum 10 (silent no-op) and mp.spawn from a notebook
# ---------------------------------------------------------------------------------------------


def touch_worker(rank: int, world_size: int, folder: str) -> None:
    """A worker for ``mp.spawn`` defined in a module (so child processes can import it):
    leaves one file per rank in `folder` as proof that it ran."""
    Path(folder, f"rank{rank}-of-{world_size}").touch()


def checked_spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 2, timeout: float = 60.0) -> int:
    """The fix for erratum 10: refuse to "start" zero processes instead of silently returning."""
    if nprocs < 1:
        raise ValueError(
            f"nprocs={nprocs}: mp.spawn would start no process at all and return as if training had "
            "finished. torch.cuda.device_count() is 0 on a machine without a GPU: choose the number of "
            "processes yourself (gloo runs on the CPU), or launch a script with torchrun."
        )
    return spawn_bounded(fn, args, nprocs, timeout)


# ---------------------------------------------------------------------------------------------
# Beyond the source: in-place ops, summing loss tensors, pickle checkpoints, worker RNGs
# ---------------------------------------------------------------------------------------------


def inplace_breaks_autograd(inplace: bool) -> tuple[str, torch.Tensor | None]:
    """sigmoid saves its output for backward; modifying that output in place breaks backward.

    Returns ``(error message or "", x.grad)``.
    """
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    y = torch.sigmoid(x)
    if inplace:
        y.mul_(2)  # BUG: overwrites the tensor sigmoid saved
    else:
        y = y * 2  # a new tensor; the saved one is untouched
    err = _error_text(lambda: y.sum().backward())
    return err, x.grad


@dataclass
class LossSumReport:
    total: float
    graph_nodes: int
    saved_bytes: int


@_contained
def loss_sum_keeps_graph(use_item: bool, steps: int = 20, train: bool = False, batch_size: int = 64,
                         seed: int = 0) -> LossSumReport:
    """Sum the loss of `steps` batches into ``total``: ``total += loss`` (a tensor, whose graph
    reaches back into every batch's graph) or ``total += loss.item()`` (a float, which keeps nothing).

    ``train=False``: a validation loop run with autograd on and no backward, where every batch's
    saved activations stay alive. ``train=True``: a training loop; ``backward()`` frees the saved
    tensors, but every step's graph nodes are still chained together.
    """
    torch.manual_seed(seed)
    model = MLP()
    x, y, _, _ = _digits()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total: float | torch.Tensor = 0.0
    for idx in _batches(len(x), batch_size, steps, seed):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if train:
            opt.zero_grad()
            loss.backward()
            opt.step()
        total += loss.item() if use_item else loss
    del loss
    nodes, nbytes = graph_size(total)
    value = total.detach().item() if isinstance(total, torch.Tensor) else total
    return LossSumReport(value, nodes, nbytes)


def leave_marker(path: str) -> None:
    """What the untrusted checkpoint's payload calls: create an empty file (harmless)."""
    Path(path).touch()


class _Payload:
    """A harmless stand-in for malicious code: unpickling it calls :func:`leave_marker`, which
    creates an empty file. A real attacker would call anything at all (``os.system``...). A
    function of the course, rather than a builtin, keeps the name in ``weights_only``'s refusal
    the same on every Python version."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (leave_marker, (self.marker,))


@_contained
def make_untrusted_checkpoint(folder: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``checkpoint.pt`` (a state dict plus a pickled payload) into `folder`.

    Returns ``(checkpoint path, marker path)``; the marker file appears if the payload runs.
    """
    folder = Path(folder)
    marker = folder / "PAYLOAD_RAN"
    path = folder / "checkpoint.pt"
    torch.manual_seed(0)
    torch.save({"model": nn.Linear(2, 2).state_dict(), "meta": _Payload(str(marker))}, path)
    return path, marker


def loader_worker_init(worker_id: int) -> None:
    """``worker_init_fn`` that reseeds the dataset's own NumPy Generator, if it has one, from the
    worker's seed (different in every worker and every epoch). DataLoader has already seeded torch,
    ``random`` and NumPy's global generator in the worker, and given it one thread; it cannot know
    about a Generator object that the dataset holds."""
    info = get_worker_info()
    if info is not None and hasattr(info.dataset, "rng"):
        info.dataset.rng = np.random.default_rng(info.seed)


class AugmentDataset(Dataset):
    """Returns, per item, one "random augmentation" drawn from each RNG a dataset might use:
    torch, Python's ``random``, NumPy's global RNG, and a NumPy Generator made in ``__init__``."""

    SOURCES = ("torch", "random", "numpy global", "numpy Generator from __init__")

    def __init__(self, n: int = 8, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> torch.Tensor:
        return torch.tensor(
            [torch.rand(1).item(), random.random(), np.random.rand(), self.rng.random()], dtype=torch.float64
        )


@dataclass
class WorkerDraws:
    """draws[epoch][item] = the 4 values of :class:`AugmentDataset` for that item."""

    draws: np.ndarray  # [epochs, n, 4]
    num_workers: int

    def repeated_across_workers(self, source: int) -> float:
        """Fraction of items whose draw (from one RNG) equals another item's draw in the same epoch."""
        d = self.draws[:, :, source]
        fr = []
        for epoch in d:
            _, counts = np.unique(np.round(epoch, 12), return_counts=True)
            fr.append(counts[counts > 1].sum() / len(epoch))
        return float(np.mean(fr))

    def repeated_across_epochs(self, source: int) -> float:
        """Fraction of items whose draw is the same in epoch 0 and epoch 1."""
        return float(np.mean(np.isclose(self.draws[0, :, source], self.draws[1, :, source], rtol=0, atol=0)))


@_contained
def worker_draws(reseed: bool, num_workers: int = 2, n: int = 8, epochs: int = 2, seed: int = 0,
                 timeout: float = 60.0) -> WorkerDraws:
    """Load :class:`AugmentDataset` with `num_workers` workers for `epochs` epochs.

    ``reseed=False`` uses no worker_init_fn; ``reseed=True`` uses :func:`loader_worker_init`, which
    reseeds the dataset's Generator per worker.
    """
    torch.manual_seed(seed)
    ds = AugmentDataset(n, seed)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, timeout=timeout,
                        worker_init_fn=loader_worker_init if reseed else None)
    draws = np.stack([np.stack([t.numpy() for t in loader]) for _ in range(epochs)])
    return WorkerDraws(draws, num_workers)


# ---------------------------------------------------------------------------------------------
# The switchboard: one small training run with any mistakes switched on
# ---------------------------------------------------------------------------------------------

#: The mistakes the switchboard can plant, with the words the widget shows.
SWITCHES: dict[str, str] = {
    "layer_in_forward": "output layer created in forward()",
    "no_zero_grad": "optimizer.zero_grad() forgotten",
    "eval_without_eval": "validation without model.eval() / no_grad()",
    "no_train_after_eval": "model.train() forgotten after validation",
}


@dataclass
class SwitchboardRun:
    """Curves and counters of one switchboard run."""

    mistakes: tuple[str, ...]
    train_loss: list[float]  # per step
    val_steps: list[int]
    val_loss: list[float]  # as the (possibly buggy) validation reported it
    val_acc: list[float]
    final_val_loss_true: float  # the final model evaluated correctly (eval + no_grad)
    final_val_acc_true: float
    steps_in_train_mode: int
    bn_updates: int  # steps after which BatchNorm's running mean had changed
    model: nn.Module  # the trained model (shared by cached runs: copy it before changing it)


def _normalise(mistakes: Sequence[str] | None) -> tuple[str, ...]:
    mistakes = tuple(sorted(set(mistakes or ())))
    unknown = [m for m in mistakes if m not in SWITCHES]
    if unknown:
        raise ValueError(f"unknown mistake(s) {unknown}; choose from {sorted(SWITCHES)}")
    return mistakes


def switchboard_run(mistakes: Sequence[str] | None = (), steps: int = 200, eval_every: int = 20,
                    batch_size: int = 64, lr: float = 0.1, seed: int = 0) -> SwitchboardRun:
    """Train :class:`SwitchNet` on the digits with the given mistakes switched on (see ``SWITCHES``)."""
    on = _normalise(mistakes)
    return _switchboard_cached(on, steps, eval_every, batch_size, lr, seed)


@lru_cache(maxsize=64)
@_contained
def _switchboard_cached(on: tuple[str, ...], steps: int, eval_every: int, batch_size: int, lr: float,
                        seed: int) -> SwitchboardRun:
    x, y, xt, yt = _digits()
    torch.manual_seed(seed)
    model = SwitchNet(layer_in_forward="layer_in_forward" in on)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    bn = model.body[1]
    train_loss, val_steps, val_loss, val_acc = [], [], [], []
    in_train_mode = bn_updates = 0
    model.train()
    for step, idx in enumerate(_batches(len(x), batch_size, steps, seed), 1):
        in_train_mode += int(model.training)
        before = bn.running_mean.clone()
        if "no_zero_grad" not in on:
            opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        bn_updates += int(not torch.equal(before, bn.running_mean))
        train_loss.append(loss.item())
        if step % eval_every == 0:
            if "eval_without_eval" in on:
                out = model(xt)  # still in train mode, graph built, BatchNorm stats updated with test data
            else:
                model.eval()
                with torch.no_grad():
                    out = model(xt)
                if "no_train_after_eval" not in on:
                    model.train()
            val_steps.append(step)
            val_loss.append(F.cross_entropy(out, yt).item())
            val_acc.append((out.argmax(1) == yt).float().mean().item())
    model.eval()
    with torch.no_grad():
        out = model(xt)
    return SwitchboardRun(on, train_loss, val_steps, val_loss, val_acc, F.cross_entropy(out, yt).item(),
                          (out.argmax(1) == yt).float().mean().item(), in_train_mode, bn_updates, model)


def _smooth(values: Sequence[float], k: int = 5) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if len(v) < k:
        return v
    return np.convolve(v, np.ones(k) / k, mode="valid")


def switchboard_figure(mistakes: Sequence[str] | None = ("no_zero_grad",), **kwargs: Any):
    """Loss curves of the clean run and of the run with `mistakes` switched on (a matplotlib Figure)."""
    import matplotlib.pyplot as plt

    on = _normalise(mistakes)
    clean = switchboard_run((), **kwargs)
    bad = switchboard_run(on, **kwargs)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    runs = [(clean, "tab:blue", "no mistake")] + ([(bad, "tab:red", "mistakes on")] if on else [])
    for run, colour, name in runs:
        sm = _smooth(run.train_loss)
        ax1.plot(np.arange(len(sm)) + len(run.train_loss) - len(sm) + 1, sm, color=colour, label=name)
        ax2.plot(run.val_steps, run.val_loss, "o-", color=colour, label=f"{name} (as reported)")
    ax1.set_title("Training loss (moving average of 5 steps)")
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy loss")
    ax2.set_title("Validation loss")
    ax2.set_xlabel("step")
    ax2.set_ylabel("cross-entropy loss")
    top = max(3.0, min(10.0, max(max(bad.train_loss), max(bad.val_loss)) * 1.05))
    for ax in (ax1, ax2):
        ax.set_ylim(0, top)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    label = ", ".join(SWITCHES[m] for m in on) or "none"
    fig.suptitle(f"Mistakes on: {label}", fontsize=10)
    fig.tight_layout()
    return fig


def _summary_lines(rows: Sequence[tuple[str, SwitchboardRun]]) -> str:
    width = max(18, *(len(name) for name, _ in rows))
    lines = [f"{'run':{width}s} {'final train loss':>16s} {'reported val loss':>17s} {'true val loss':>13s} "
             f"{'true val acc':>12s} {'steps in train()':>16s}"]
    for name, r in rows:
        lines.append(f"{name:{width}s} {r.train_loss[-1]:16.4f} {r.val_loss[-1]:17.4f} {r.final_val_loss_true:13.4f} "
                     f"{r.final_val_acc_true:12.4f} {r.steps_in_train_mode:16d}")
    return "\n".join(lines)


def switchboard_summary(mistakes: Sequence[str] | None = ("no_zero_grad",), **kwargs: Any) -> str:
    """The switchboard's numbers as text: the same run without and with the mistakes."""
    on = _normalise(mistakes)
    return _summary_lines([("no mistake", switchboard_run((), **kwargs)),
                           ("with the mistakes", switchboard_run(on, **kwargs))])


def switchboard_overview(**kwargs: Any) -> str:
    """One row per mistake switched on alone, under the clean run."""
    rows = [("no mistake", switchboard_run((), **kwargs))]
    rows += [(key, switchboard_run((key,), **kwargs)) for key in SWITCHES]
    return _summary_lines(rows)


def switchboard_widget(default: Sequence[str] = ("no_zero_grad",)):
    """Checkboxes, one per mistake; the figure and numbers redraw when one is switched."""
    import ipywidgets as widgets
    from IPython.display import display

    from .figures import show_figure

    boxes = {k: widgets.Checkbox(value=k in default, description=v, indent=False,
                                 layout=widgets.Layout(width="auto")) for k, v in SWITCHES.items()}
    out = widgets.Output()

    def redraw(_: object = None) -> None:
        chosen = [k for k, b in boxes.items() if b.value]
        with out:
            out.clear_output(wait=True)
            show_figure(switchboard_figure(chosen))
            print(switchboard_summary(chosen))

    for b in boxes.values():
        b.observe(redraw, names="value")
    redraw()
    ui = widgets.VBox([widgets.HTML("<b>Switch mistakes on and off:</b>"), *boxes.values(), out])
    display(ui)
    return ui

