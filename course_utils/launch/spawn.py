"""``mp.spawn`` that cannot hang a notebook (:func:`spawn_bounded`), the children's stderr kept
instead of interleaved under a cell (:func:`child_stderr`), and a free port for a process group.

Used in notebook 04, section 1 ("Starting processes") and section 2 ("A process group, from
``env://``"); notebook 06, pitfalls 8 and 9 (``mp.spawn`` of zero processes, of a notebook's
function); notebook 03, section 8 (``child_stderr``, ``error_lines``); ``scripts/spawn_demo.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..i18n import tr
from .capacity import check_capacity

_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")
_MODULE_REPR = re.compile(r"<module '([\w.]+)' \(.*?\)>")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def free_port() -> int:
    """A TCP port that is free right now on this machine (the OS picks it). Another program may
    take it before it is used: a launcher's own store avoids that (see ``server.start_store``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def error_lines(text: str) -> list[str]:
    """The lines of `text` that name an exception (``ValueError: ...``), alike on every Python:
    without colours (3.13), a module's repr shortened to ``<module 'name'>`` (varies from 3.12)."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines()]
    return [_MODULE_REPR.sub(r"<module '\1'>", ln) for ln in lines if _ERROR_LINE.match(ln)]


@dataclass
class CapturedStderr:
    """What the children wrote (``text``, once the block has ended)."""

    text: str = ""

    def summary(self) -> str:
        """One line per distinct error, most frequent first (ties in alphabetical order)."""
        errs = sorted(Counter(error_lines(self.text)).items(), key=lambda kv: (-kv[1], kv[0]))
        return "\n".join(f"{n} x {line}" for line, n in errs) or "no error on the children's stderr"


@contextlib.contextmanager
def child_stderr() -> Iterator[CapturedStderr]:
    """Send file descriptor 2, so the stderr of every process started in the block, to a file."""
    captured = CapturedStderr()
    with tempfile.TemporaryFile() as fh:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(fh.fileno(), 2)
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            fh.seek(0)
            captured.text = fh.read().decode("utf-8", "replace")


class SpawnFailed(RuntimeError):
    """Children of :func:`spawn_bounded` failed (``exit_code``) or outlived their time (None)."""

    def __init__(self, msg: str, exit_code: int | None = None, children_stderr: str = "") -> None:
        super().__init__(msg)
        self.exit_code, self.children_stderr = exit_code, children_stderr


def _check_nprocs(nprocs: object, timeout: float, max_nprocs: int | None) -> None:
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise ValueError(f"nprocs must be a whole number of processes; got {nprocs!r}.")
    if nprocs < 1:
        raise ValueError(
            f"nprocs={nprocs}: mp.spawn would start no process at all and return as if training "
            "had finished. torch.cuda.device_count() is 0 on a machine without a GPU: choose the "
            "number of processes yourself (gloo runs on the CPU), or launch a script with torchrun."
        )
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}.")
    check_capacity(nprocs, max_nprocs, "nprocs")


def spawn_bounded(
    fn: Callable,
    args: tuple = (),
    nprocs: int = 2,
    timeout: float = 60.0,
    start_method: str = "spawn",
    max_nprocs: int | None = None,
) -> int:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` that cannot hang a notebook, and whose
    outcome does not depend on which child was faster: every child is waited for until `timeout`,
    then killed. A failing or late child raises :class:`SpawnFailed` quoting the children's error
    line (their stderr is captured, not interleaved under the cell). More processes than the machine
    can hold are refused unless `max_nprocs` allows them (see ``machine_capacity``). Returns how
    many it started."""
    _check_nprocs(nprocs, timeout, max_nprocs)
    import torch.multiprocessing as mp

    with child_stderr() as err:
        ctx = mp.start_processes(fn, args, nprocs, join=False, start_method=start_method)
        deadline = time.monotonic() + timeout
        for p in ctx.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        late = [p for p in ctx.processes if p.is_alive()]
        for p in late:
            p.kill()
            p.join(5)
    codes = [p.exitcode for p in ctx.processes if p.exitcode != 0]
    if late:
        msg = tr(
            "{n_late} of {nprocs} spawned processes did not finish within {timeout:g} s and were stopped. "
            "A process waiting forever (in init_process_group, a collective, ...) usually means that "
            "another one never joined.",
            "启动的 {nprocs} 个进程中有 {n_late} 个没有在 {timeout:g} 秒内结束，已被终止。"
            "一个进程永远等下去（在 init_process_group、某个集合通信……中），通常说明另一个进程始终没有加入。",
            n_late=len(late), nprocs=nprocs, timeout=timeout)
        raise SpawnFailed(msg, None, err.text)
    if codes:
        code, causes = max(set(codes), key=codes.count), error_lines(err.text)
        name = getattr(fn, "__name__", fn)
        msg = tr(f"{len(codes)} of {nprocs} child processes exited with code {code} before finishing "
                 f"{name}. The children's error: ",
                 f"{nprocs} 个子进程中有 {len(codes)} 个在 {name} 结束之前退出，退出码 {code}。子进程的报错：")
        raise SpawnFailed(msg + (causes[-1] if causes else "(no error message)"), code, err.text)
    return len(ctx.processes)
