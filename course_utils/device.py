"""Pick the compute device and seed every random number generator in one call."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

ENV_VAR = "COURSE_DEVICE"
_VALID = ("cpu", "cuda", "mps")


def pick_device(prefer: str | None = None) -> torch.device:
    """Return CUDA if there is a GPU, else Apple's MPS, else the CPU.

    `prefer` (or the environment variable ``COURSE_DEVICE``) forces a choice,
    e.g. ``COURSE_DEVICE=cpu`` on a GPU machine. Asking for a device that is not
    there raises a ``RuntimeError`` that says so, rather than failing later.
    """
    choice = (prefer or os.environ.get(ENV_VAR, "")).strip().lower()
    if choice:
        kind = choice.split(":")[0]
        if kind not in _VALID:
            raise ValueError(
                f"{ENV_VAR}={choice!r} is not a device this course knows; use one of {', '.join(_VALID)}."
            )
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"{ENV_VAR} asks for {choice!r}, but PyTorch sees no CUDA GPU here. "
                f"Unset {ENV_VAR} to fall back to the CPU."
            )
        if kind == "mps" and not _mps_available():
            raise RuntimeError(
                f"{ENV_VAR} asks for 'mps', but this machine has no Apple GPU available to PyTorch."
            )
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def seed_everything(seed: int = 0) -> int:
    """Seed Python's `random`, NumPy and PyTorch (CPU and every GPU). Returns the seed."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return seed


def describe(device: torch.device | None = None) -> str:
    """One line saying which device the notebook runs on (deterministic on a given machine)."""
    device = device or pick_device()
    if device.type == "cuda":
        return f"device: cuda ({torch.cuda.get_device_name(device)})"
    return f"device: {device.type}"
