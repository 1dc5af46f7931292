"""The processes of a job, through Linux's ``/proc``: reading a process's state, finding every
process of a job, stopping them (SIGTERM, a grace period, then SIGKILL), and tying a process to its
caller's life (the parent-death signal). Used by both engines, the warm server, ``dist.py`` and the
tests.

Standard library only, and no import of the rest of the course: ``python -S processes.py CALLER
COMMAND...`` is the small launcher that asks Linux for SIGTERM when its caller dies, then becomes
COMMAND (see :func:`with_parent_death_signal`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

GRACE_S = 2.0  # seconds a process gets between SIGTERM and SIGKILL when a job is stopped
HAS_PROC = os.path.isdir("/proc/self")


def stat(pid: int | str = "self", task: int | str | None = None) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` (of one thread with `task`) after the command name: the state
    first (``R``, ``S``, ``Z``...), then the parent, the process group, the session...; None for a
    process that is gone, or where there is no ``/proc``."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode("ascii", "replace").split()


def threads() -> list[str]:
    """The thread ids of this process (Linux); an empty list elsewhere."""
    with contextlib.suppress(OSError):
        return os.listdir("/proc/self/task")
    return []


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (a process that is not ours to signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal
        return True
    fields = stat(pid)
    if fields is None:
        return not HAS_PROC  # no /proc: kill() is all we know; else it ended meanwhile
    return fields[0] != "Z"


def started(pid: int | str = "self") -> int | None:
    """When `pid` started, in clock ticks since boot (``/proc/PID/stat``); None if it is gone."""
    fields = stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def find(environ: str | None = None, sessions: Iterable[int] = (), since: int | None = None) -> set[int]:
    """Linux: the processes (but this one) whose environment holds `environ` (``"NAME=value"``; a
    zombie's shows none), and those in the session of one of `sessions` (a job's processes);
    with `since` (see :func:`started`), only processes started then or later."""
    leaders = {str(p) for p in sessions}
    marker = f"{environ}\0".encode() if environ else None
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return set()
    found = set()
    for name in names:
        fields = stat(name)
        if fields is None or len(fields) < 20 or (since is not None and int(fields[19]) < since):
            continue
        if fields[3] in leaders:
            found.add(int(name))
        elif marker is not None:
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{name}/environ").read_bytes():
                    found.add(int(name))
    return found - {os.getpid()}


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send `sig` to each of `pids`, and to the process group of each one that leads its own."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:  # each rank leads its own process group
                os.killpg(pid, sig)
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def stop(
    find: Callable[[], set[int]],
    also: Iterable[int] = (),
    reap: Callable[[], object] = lambda: None,
    hurry: Callable[[], bool] = lambda: False,
    grace: float = GRACE_S,
) -> None:
    """SIGTERM the processes `find()` returns (and `also`), each one's process group too; SIGKILL
    what is left after `grace` seconds (or as soon as `hurry()` is true: the learner pressed again),
    until `find()` finds none. `reap` is called while waiting (to collect one's own children)."""
    pids = find() | set(also)
    # SIGKILL more than once: a launcher in the middle of a restart may start new workers.
    for sig in [signal.SIGTERM] + [signal.SIGKILL] * 5:
        signal_all(pids, sig)
        end = time.monotonic() + (grace if sig == signal.SIGTERM else 0.05)
        while any(map(alive, pids)) and time.monotonic() < end:
            if sig == signal.SIGTERM and hurry():
                break
            time.sleep(0.05)
            reap()
        reap()
        pids = {p for p in pids | find() if alive(p)}
        if not pids:
            break


def set_parent_death_signal(sig: int) -> None:
    """Linux: `sig` to this process when its parent dies (``PR_SET_PDEATHSIG``); elsewhere nothing."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, int(sig))  # PR_SET_PDEATHSIG


def with_parent_death_signal(cmd: list[str]) -> list[str]:
    """`cmd`, started through this file: it asks Linux for SIGTERM when its caller (this process)
    dies, then becomes `cmd`. (A ``preexec_fn`` would do the same, but is unsafe in a threaded
    kernel.) Unchanged off Linux."""
    if not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), *cmd]


def _exec_with_parent_death_signal(argv: list[str]) -> None:
    caller, cmd = int(argv[0]), argv[1:]
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != caller:  # it died before the signal was asked for
        sys.exit("the caller of the launcher is gone")
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    _exec_with_parent_death_signal(sys.argv[1:])
