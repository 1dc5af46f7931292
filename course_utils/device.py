"""The machine: the compute device, seeding every generator, the CPU cores and how busy they are."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

from .i18n import tr

ENV_VAR = "COURSE_DEVICE"
_VALID = ("cpu", "cuda", "mps")


def pick_device(prefer: str | None = None) -> torch.device:
    """CUDA if there is a GPU, else Apple's MPS, else the CPU; `prefer` or ``COURSE_DEVICE`` forces one
    (a device that is not there is refused now, rather than failing later)."""
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
        name = torch.cuda.get_device_name(device)
        return tr("device: cuda ({name})", "设备：cuda（{name}）", name=name)
    return tr("device: {type}", "设备：{type}", type=device.type)


def load_average() -> float | None:
    """The 1-minute load average (processes running or waiting to run), or None where the OS has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def cpu_cores() -> int:
    """The number of CPU cores this process may run on (the one core count of the course)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1


def busy_warning(load: float | None, cores: int) -> str:
    """A warning when the load average is above the core count (on Linux the load also counts
    processes waiting for the disk), else ""."""
    if load is None or load <= cores:
        return ""
    return tr("WARNING: this machine is busy: load average {load:.1f} on {cores} cores. Other programs compete for "
              "the CPU (or, on Linux, the disk), so these numbers measure that competition as much as the loader "
              "(more worker processes simply win a larger share of the CPU). Measure again when the machine is idle "
              "before drawing conclusions.",
              "警告：这台机器正忙：负载均值 {load:.1f}，而只有 {cores} 个核心。其他程序在争抢 CPU（在 Linux "
              "上也可能是磁盘），所以这些数字测到的既是加载器，也同样是这种争抢（worker 进程越多，只是抢到的 CPU "
              "份额越大）。请等机器空闲时再测一次，然后再下结论。",
              load=load, cores=cores)


def cpu_load() -> str:
    """The load average against the core count, as one line to print beside a timing and the core count
    ("" without one; the Chinese line leaves the cores to the core count printed beside it)."""
    load = load_average()
    if load is None:
        return ""
    cores = cpu_cores()
    busy = tr(" (busy: load above the core count, numbers are not an idle machine's)",
              "（繁忙：负载高于核心数，"
              "这些数字不是空闲机器上的结果）") if load > cores else ""
    on_cores = tr(" on {cores} cores", "{cores:.0}", cores=str(cores))  # the Chinese says the load only
    return tr("load average {load:.1f}{on_cores}{busy}", "负载均值 {load:.1f}{on_cores}{busy}",
              load=load, on_cores=on_cores, busy=busy)


@contextlib.contextmanager
def one_main_thread() -> Iterator[None]:
    """Run the block with one intra-op thread in this process (as DataLoader workers have), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
