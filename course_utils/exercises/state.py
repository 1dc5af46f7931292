"""What a check puts back: :func:`untouched` runs the learner's code as in a fresh kernel (grad mode
on, float32 on the CPU by default) and restores afterwards what that code may have changed (the
random generators, grad mode, the default dtype and device, the thread count, the working folder,
the standard streams), so that a check never changes the learner's notebook."""

import contextlib
import os
import random
import sys
from collections.abc import Iterator

import numpy as np
import torch


def _set_default_device(device: torch.device) -> None:
    torch.set_default_device(None if device.type == "cpu" else device)


def _chdir(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):  # (the folder was deleted meanwhile: nowhere to go back to)
            os.chdir(path)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _determinism() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_determinism(saved: tuple[bool, bool]) -> None:
    """Deterministic algorithms and their warn_only back as `saved`, only if they changed:
    ``torch.use_deterministic_algorithms`` imports ``torch._inductor.config`` (dynamo, sympy: seconds
    the first time, and an import an interrupt would leave half done)."""
    if _determinism() != saved:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Run with grad mode on, no inference mode, float32 tensors on the CPU by default, as a fresh kernel;
    then restore what the block may have changed, the learner's settings before it included: the torch
    (CUDA, MPS), numpy and ``random`` generators, grad mode, the default dtype and device, the thread
    count, anomaly detection, deterministic algorithms (and their warn_only), the working directory and
    ``sys.stdout``/``stderr``."""
    state = [(torch.get_rng_state, torch.set_rng_state), (np.random.get_state, np.random.set_state)]
    state += [(random.getstate, random.setstate), (torch.is_grad_enabled, torch.set_grad_enabled)]
    state += [(torch.get_default_dtype, torch.set_default_dtype)]
    state += [(torch.get_default_device, _set_default_device)]
    state += [(torch.get_num_threads, torch.set_num_threads)]
    state += [(torch.is_anomaly_enabled, torch.set_anomaly_enabled)]
    state += [(_determinism, _set_determinism)]
    state += [(_cwd, _chdir)]
    state += [(lambda: (sys.stdout, sys.stderr), lambda streams: setattr(sys, "stdout", streams[0])
               or setattr(sys, "stderr", streams[1]))]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state.append((torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all))
    if torch.backends.mps.is_available():
        state.append((torch.mps.get_rng_state, torch.mps.set_rng_state))
    saved = [(restore, get()) for get, restore in state]
    try:
        torch.set_default_dtype(torch.float32)
        torch.set_default_device(None)  # a set_default_device("meta") of an earlier cell: not in the check
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        failed = None
        for restore, value in saved:  # every one, even after one fails (or is interrupted)
            try:
                restore(value)
            except BaseException as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
