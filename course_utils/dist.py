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
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND_VAR = "COURSE_BACKEND"


def choose_backend(local_world_size: int = 1) -> str:
    """nccl if CUDA is available with at least one GPU per local rank, else gloo."""
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be at least 1, got {local_world_size}")
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
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


def setup(backend: str | None = None, timeout_s: float = 60.0) -> DistContext:
    """Join the process group described by the launcher's environment variables (``env://``)."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    backend = backend or os.environ.get(BACKEND_VAR) or choose_backend(local_world)
    check_backend(backend, local_world)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistContext(rank, world, local_rank, backend, device)


def cleanup() -> None:
    """Leave the process group (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rprint(*args: object) -> None:
    """Print one whole line in a single write, so lines of two ranks never glue together.

    The launcher knows which rank wrote it (``[rank N]`` prefix in a terminal, grouped by rank in a notebook).
    """
    sys.stdout.write(" ".join(str(a) for a in args) + "\n")
    sys.stdout.flush()
