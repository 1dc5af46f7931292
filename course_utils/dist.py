"""Inside one rank: a script started by ``torchrun`` calls ``ctx = setup()``, ``rprint(...)`` and
``cleanup()``; chapter 05's evaluates with :func:`evaluate` (each sample once, counts all-reduced)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .i18n import tr


def choose_backend(local_world_size: int = 1, warn: bool = True) -> str:
    """nccl with a GPU per local rank, else gloo: with a warning when there are GPUs (a wrong
    ``--nproc-per-node``?), unless ``warn=False`` (the notebooks' 2-rank demos on a 1-GPU laptop)."""
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be at least 1, got {local_world_size}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= local_world_size:
        return "nccl"
    if gpus and warn:
        warnings.warn(tr(
            "{local_world_size} processes on this node but {gpus} GPU(s): using gloo on the CPU. Start one process "
            "per GPU (--nproc-per-node), or set COURSE_BACKEND=nccl to make this an error.",
            "本节点上有 {local_world_size} 个进程，却只有 {gpus} 块 GPU：改用 CPU 上的 gloo。请每块 GPU "
            "启动一个进程（--nproc-per-node），或者设置 COURSE_BACKEND=nccl，让这种情况直接报错。",
            local_world_size=local_world_size, gpus=gpus),
            stacklevel=2,
        )
    return "gloo"


def check_backend(backend: str, local_world_size: int, setting: str | None = None) -> None:
    """Refuse, with a clear reason, a backend that cannot work on this machine. `setting`: the
    environment variable the backend came from (``COURSE_BACKEND``), named in the message."""
    where = (f" ({setting}={backend} is set in your environment: unset {setting} to let the course choose)"
             if setting else "")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}{where}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and n < local_world_size:
        raise RuntimeError(
            f"nccl needs one GPU per rank: {local_world_size} rank(s) asked for, {n} GPU(s) here. "
            f"Use backend 'gloo' (it runs on the CPU) or fewer ranks{where}."
        )


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def setup(backend: str | None = None, timeout_s: float | None = None) -> DistContext:
    """Join the process group that the launcher's environment variables describe (``env://``).

    Backend: ``backend``, else ``COURSE_BACKEND`` (the launcher sets it), else :func:`choose_backend`.
    ``timeout_s`` for collectives; None keeps PyTorch's (30 min for gloo, 10 for nccl), which a first
    ``torch.compile`` on one rank may need."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError(
            "RANK or WORLD_SIZE is not set: this script must be started by a launcher, e.g. "
            "`python -m torch.distributed.run --nproc-per-node 2 SCRIPT` or "
            "course_utils.launch.torchrun(SCRIPT, nproc=2)."
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    explicit = backend
    chosen = backend or os.environ.get("COURSE_BACKEND")
    backend = chosen or choose_backend(local_world)
    if not chosen and backend == "gloo" and world > local_world and torch.cuda.is_available():
        # On several nodes each node decides alone: one falling back to gloo would mix backends.
        raise RuntimeError(
            f"this node has {torch.cuda.device_count()} GPU(s) for {local_world} local processes, "
            "so it would fall back to gloo while other nodes may use nccl. Start one process per "
            "GPU, or set COURSE_BACKEND=nccl (or gloo) for the whole job."
        )
    if backend == "nccl" and "LOCAL_RANK" not in os.environ and world > torch.cuda.device_count():
        raise RuntimeError(
            "LOCAL_RANK is not set, and the global rank cannot name a GPU of this node on a job of "
            f"{world} processes: start the ranks with torchrun, which sets LOCAL_RANK."
        )
    check_backend(backend, local_world, setting="COURSE_BACKEND" if chosen and not explicit else None)
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    if backend == "nccl":
        torch.cuda.set_device(device)
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, init_method="env://", **kwargs)
    return DistContext(rank, world, local_rank, backend, device)


def cleanup() -> None:
    """Leave the process group, in step with the other ranks (safe to call twice).

    More than ``destroy_process_group()``: each collective that DDP launches during ``backward()``
    holds a Python object, which a gloo worker thread drops a moment after the collective ends;
    dropped after the interpreter began to shut down, CPython ends that thread inside a C++
    destructor and the process aborts (``terminate called without an active exception``). So: a
    barrier (no rank leaves while a peer still talks to it; skipped when an exception is on its
    way out, as the others may never reach it), destroy, then wait until the other threads idle.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if sys.exc_info()[0] is None:
        dist.barrier()
    dist.destroy_process_group()
    _let_native_threads_settle()


def _let_native_threads_settle(timeout_s: float = 1.0, quiet_looks: int = 3) -> None:
    """Sleep (GIL released) until no other thread of this process has been runnable for
    ``quiet_looks`` looks in a row, at most ``timeout_s``. Linux reads /proc; elsewhere a pause."""
    from .launch import processes

    if not processes.HAS_PROC:
        time.sleep(0.05)
        return
    me = str(threading.get_native_id())
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < quiet_looks and time.monotonic() < deadline:
        time.sleep(0.005)
        states = (processes.stat("self", task) for task in processes.threads() if task != me)
        busy = any(s is not None and s[0] == "R" for s in states)  # (None: it ended meanwhile)
        quiet = 0 if busy else quiet + 1


def rprint(*args: object) -> None:
    """Print one whole line in a single write, so lines of two ranks never glue together."""
    sys.stdout.write(" ".join(str(a) for a in args) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def single_process_group(backend: str = "gloo") -> Iterator[None]:
    """A process group of one process (rank 0 of 1) in this process, enough to build a DDP model
    in a notebook; a file store in a temporary folder (no port); always torn down."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "a process group already exists in this process; call "
            "torch.distributed.destroy_process_group() first."
        )
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
