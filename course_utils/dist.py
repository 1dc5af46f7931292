"""The boilerplate every distributed script of the course shares, so each script shows only its lesson.

A script started by ``torchrun`` (or ``course_utils.launch.torchrun``) does::

    from course_utils.dist import setup, cleanup, rprint
    ctx = setup()                  # process group from env://, backend and device chosen for you
    rprint("hello")                # one whole line (the launcher adds "[rank N]")
    ...
    cleanup()

Backend: ``COURSE_BACKEND`` if set (the launcher sets it), else nccl when CUDA is
there with a GPU for every local rank, else gloo on the CPU.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

BACKEND_VAR = "COURSE_BACKEND"


def choose_backend(local_world_size: int = 1, warn: bool = True) -> str:
    """nccl if CUDA is available with at least one GPU per local rank, else gloo. With GPUs, but
    fewer than the local ranks, gloo on the CPU, with a warning: on a GPU node that is almost always
    a wrong ``--nproc-per-node`` (``COURSE_BACKEND=nccl`` turns it into an error). The notebooks'
    launcher passes ``warn=False``: its 2-process demos on a 1-GPU laptop mean gloo on purpose."""
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be at least 1, got {local_world_size}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= local_world_size:
        return "nccl"
    if gpus and warn:
        warnings.warn(f"{local_world_size} processes on this node but {gpus} GPU(s): using gloo on the CPU. Start one "
                      "process per GPU (--nproc-per-node), or set COURSE_BACKEND=nccl to make this an error.",
                      stacklevel=2)
    return "gloo"


def check_backend(backend: str, local_world_size: int) -> None:
    """Refuse, with a clear reason, a backend that cannot work on this machine."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < local_world_size:
            raise RuntimeError(
                f"nccl needs one GPU per rank: {local_world_size} rank(s) asked for, {n} GPU(s) here. "
                "Use backend 'gloo' (it runs on the CPU) or fewer ranks."
            )


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(
            f"{name} is not set: this script must be started by a launcher that sets RANK, WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT, e.g. `python -m torch.distributed.run --nproc-per-node 2 SCRIPT` "
            "or course_utils.launch.torchrun(SCRIPT, nproc=2)."
        )
    return int(value)


def setup(backend: str | None = None, timeout_s: float | None = None) -> DistContext:
    """Join the process group described by the launcher's environment variables (``env://``).

    `timeout_s`: how long a collective may wait for the other ranks before it fails. None keeps
    PyTorch's default (30 minutes for gloo, 10 for nccl), which a real run needs: a first
    ``torch.compile`` or a slow checkpoint write on one rank keeps the others waiting for minutes.
    A script that must fail sooner, or wait longer, says so where it calls ``setup``. A job started
    from a notebook is bounded anyway by the launcher's own timeout, which stops every process.
    """
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    chosen = backend or os.environ.get(BACKEND_VAR)
    backend = chosen or choose_backend(local_world)
    if not chosen and backend == "gloo" and world > local_world and torch.cuda.is_available():
        # On several nodes each node decides alone: one falling back to gloo would mix backends.
        raise RuntimeError(
            f"this node has {torch.cuda.device_count()} GPU(s) for {local_world} local processes, so it would "
            "fall back to gloo while other nodes may use nccl. Start one process per GPU, or set "
            f"{BACKEND_VAR}=nccl (or gloo) for the whole job.")
    if backend == "nccl" and "LOCAL_RANK" not in os.environ and world > torch.cuda.device_count():
        raise RuntimeError(
            "LOCAL_RANK is not set, and the global rank cannot name a GPU of this node on a job of "
            f"{world} processes: start the ranks with torchrun, which sets LOCAL_RANK.")
    check_backend(backend, local_world)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, init_method="env://", **kwargs)
    return DistContext(rank, world, local_rank, backend, device)


def cleanup() -> None:
    """Leave the process group, in step with the other ranks (safe to call twice).

    Why more than ``dist.destroy_process_group()``: every ``backward()`` stores a Python object
    (a ``contextvars.Context``) in thread-local state, and each collective that DDP launches during
    backward keeps a copy of that state. gloo's worker threads drop their reference to a finished
    collective a moment after it completes, and dropping that Python object needs the GIL. If the
    main thread has already begun to shut the interpreter down, CPython ends such a thread with
    ``pthread_exit`` inside a C++ destructor, and the process aborts with ``terminate called
    without an active exception`` (SIGABRT) after all its work was done. So, on a normal exit:

    1. a barrier: every rank has finished every collective (no rank leaves while a peer is
       still talking to it), and the main thread waits without the GIL, so the backend's
       threads can release what they hold;
    2. ``destroy_process_group()``;
    3. a short wait, without the GIL, until no other thread of this process is runnable any
       more (bounded), so the last references are dropped while the interpreter is whole.

    When an exception is on its way out (``cleanup()`` in a ``finally:``), the other ranks may
    never reach the barrier: then only step 2 runs, and the launcher stops the job.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if sys.exc_info()[0] is None:
        dist.barrier()
    dist.destroy_process_group()
    _let_native_threads_settle()


def _let_native_threads_settle(timeout_s: float = 1.0, quiet_looks: int = 3) -> None:
    """Sleep (the GIL released) until no other thread of this process is runnable, for
    `quiet_looks` looks in a row, or `timeout_s` has passed. Linux reads /proc; elsewhere a
    short fixed pause."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(0.05)
        return
    me = str(threading.get_native_id())
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < quiet_looks and time.monotonic() < deadline:
        time.sleep(0.005)
        busy = False
        for task in tasks.iterdir():
            if task.name == me:
                continue
            try:
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # the thread ended between the listing and the read
            busy = busy or state == "R"
        quiet = 0 if busy else quiet + 1


def rprint(*args: object) -> None:
    """Print one whole line in a single write, so lines of two ranks never glue together.

    The launcher knows which rank wrote it (``[rank N]`` prefix in a terminal, grouped by rank in a notebook).
    """
    sys.stdout.write(" ".join(str(a) for a in args) + "\n")
    sys.stdout.flush()


def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    """This rank's share of ``range(n)`` with no padding: every index on exactly one rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return list(range(rank, n, world_size))


class ShardSampler(Sampler[int]):
    """Evaluation sampler: rank r gets indices r, r + W, r + 2W, ... (no shuffling, no padding).

    ``DistributedSampler`` pads the index list so that every rank gets the same number of
    samples (it repeats the first ones), which is what training needs; counted in a metric, the
    repeated samples count twice. Shards here may differ in length by one, so evaluate with
    the plain model (``ddp_model.module``), whose forward pass needs no collective.
    """

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.indices = shard_indices(n, rank, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def all_reduce_sums(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor of counts over all ranks (in place, and returned); a no-op without a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


@torch.inference_mode()
def local_eval_sums(model: nn.Module, loader: DataLoader, device: torch.device, bf16: bool = False) -> torch.Tensor:
    """``[sum of losses, number correct, number of samples]`` over this rank's loader (float64)."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y, reduction="sum")
        sums += torch.stack([loss.double(), (logits.argmax(1) == y).sum().double(),
                             torch.tensor(float(len(y)), dtype=torch.float64, device=device)])
    return sums


@dataclass(frozen=True)
class EvalResult:
    loss: float
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")


def evaluate(model: nn.Module, dataset: TensorDataset, rank: int, world_size: int, device: torch.device,
             batch_size: int = 256, bf16: bool = False) -> EvalResult:
    """Evaluate ``model`` on ``dataset``: each rank its own shard, counts all-reduced, each sample once.

    Pass the plain model (``ddp_model.module``), in eval mode, with the same weights and buffers
    on every rank (see :func:`sync_buffers`). Every rank must call this (it ends in a collective).
    """
    # A generator of its own: creating a DataLoader iterator draws a seed from it, and drawing from
    # the global one would change the training run's random stream (dropout) from then on.
    loader = DataLoader(dataset, batch_size=batch_size, sampler=ShardSampler(len(dataset), rank, world_size),
                        generator=torch.Generator())
    was_training = model.training
    model.eval()
    sums = all_reduce_sums(local_eval_sums(model, loader, device, bf16))
    model.train(was_training)
    loss_sum, correct, total = sums.tolist()
    return EvalResult(loss_sum / max(total, 1.0), int(correct), int(total))


def sync_buffers(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (BatchNorm running statistics) to every rank.

    DDP broadcasts rank 0's buffers at the start of each training forward, but that forward
    then updates each rank's running statistics with its own batch: after the last step the
    ranks disagree slightly. Call this before evaluating or saving, so all ranks hold the model
    that the checkpoint holds.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for b in model.buffers():
            dist.broadcast(b, src)
