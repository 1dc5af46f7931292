"""How many ranks this machine can hold at once: ``torchrun()`` and ``spawn_bounded()`` refuse more,
before anything starts, unless told otherwise (``nproc=1000`` once filled the memory, every rank
importing torch, and set off the OOM killer)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..i18n import tr

# What one rank costs, measured on Linux x86-64 with torch 2.14 (a gloo rank after one all_reduce):
# a fresh interpreter that imported torch (a torchrun worker) has 512 MB resident, 280 MB of it its
# own (PSS 301 MB); a rank forked from the warm server shares most of its server's pages at first
# (7 MB of its own, PSS 100 MB) and owns more as it works. Counted at the fresh interpreter's cost.
RANK_MEMORY_MB = 300
RANKS_PER_CORE = 4  # beyond this many ranks per core they mostly wait for each other (at least 8 allowed)


def memory_available() -> int | None:
    """Bytes of memory available to new processes (Linux: MemAvailable, within a cgroup's limit
    where one is set); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            free = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    with contextlib.suppress(OSError, ValueError):  # a container's own limit (cgroup v2)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = min(free, max(int(limit) - used, 0))
    return free


def capacity(cores: int, free: int | None) -> tuple[int, str]:
    """How many ranks `cores` CPU cores and `free` bytes of memory (None: unknown) hold, and why in
    words: RANK_MEMORY_MB each within 80% of the memory, RANKS_PER_CORE per core (at least 8)."""
    limit = max(8, RANKS_PER_CORE * cores)
    why = tr("with {cores} CPU core(s), more than {limit} ranks mostly wait for each other",
             "只有 {cores} 个 CPU 核心，超过 {limit} 个 rank 时它们大多在互相等待", cores=cores, limit=limit)
    if free is not None:
        fit = max(1, int(0.8 * free / (RANK_MEMORY_MB * 2**20)))
        limit = min(limit, fit)
        why = tr("each rank imports torch (about {rank_mb} MB of memory) and {free_gb:.1f} GB is available, room "
                 "for {fit}; and {why}",
                 "每个 rank 都要导入 torch（约 {rank_mb} MB 内存），当前可用 {free_gb:.1f} GB，"
                 "最多容纳 {fit} 个；而且{why}",
                 rank_mb=RANK_MEMORY_MB, free_gb=free / 2**30, fit=fit, why=why)
    return limit, why


def machine_capacity() -> tuple[int, str]:
    """How many ranks this machine can hold at once, and why in words (see :func:`capacity`)."""
    from ..device import cpu_cores  # (imports torch: only when launching)

    return capacity(cpu_cores(), memory_available())


def check_capacity(nproc: int, max_nproc: int | None, name: str = "nproc") -> None:
    """Refuse, before anything starts, more processes than the machine can hold, unless `max_nproc`
    allows them explicitly (ValueError saying what to do). `name`: the argument's name."""
    if max_nproc is not None and (not isinstance(max_nproc, int) or isinstance(max_nproc, bool)
                                  or max_nproc < 1):
        raise ValueError(f"max_{name} must be a whole number of processes, at least 1, or None; "
                         f"got {max_nproc!r}.")
    if max_nproc is not None:
        if nproc > max_nproc:
            raise ValueError(f"{name}={nproc} is more than max_{name}={max_nproc}.")
        return
    limit, why = machine_capacity()
    if nproc > limit:
        cli = tr(" (from a terminal: --max-nproc {nproc})", "（在终端中：--max-nproc {nproc}）",
                 nproc=nproc) if name == "nproc" else ""
        raise ValueError(tr(
            "{name}={nproc} is more processes than this machine can hold: {why}. Use fewer processes "
            "(at most {limit} here); to start {nproc} all the same, pass max_{name}={nproc}{cli}.",
            "{name}={nproc} 超出了这台机器能容纳的进程数：{why}。请减少进程数（这里最多 {limit} 个）；"
            "如果确实要启动 {nproc} 个，请传入 max_{name}={nproc}{cli}。",
            name=name, nproc=nproc, why=why, limit=limit, cli=cli))
