"""Watching a running job: its ranks' log files read as they grow (:class:`Logs`), and
:func:`supervise`, which shows them until the job ends or its time is up, then stops every process
of it; a kernel interrupt stops it too, however often it is pressed."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

from ..i18n import tr
from .engine import Engine

POLL_S = 0.1  # seconds between two looks at the logs


class Tail:
    """The whole lines of a growing file, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.buf = path, 0, b""
        self.lines: list[str] = []

    def read(self, final: bool = False) -> list[str]:
        """The new whole lines (with `final`, an unfinished last line too)."""
        with contextlib.suppress(OSError), open(self.path, "rb") as fh:
            fh.seek(self.pos)
            self.buf += fh.read()
            self.pos = fh.tell()
        *whole, self.buf = self.buf.split(b"\n")
        if final and self.buf:
            whole, self.buf = [*whole, self.buf], b""
        new = [w.decode("utf-8", "replace").rstrip("\r") for w in whole]
        self.lines += new
        return new

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


class Logs:
    """Every attempt's (stdout, stderr) tails of every rank."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.attempts: dict[int, list[tuple[Tail, Tail]]] = {}

    def read(self, folders: Mapping[int, Path], final: bool = False) -> list[tuple]:
        """New lines of `folders` (see Engine.attempt_dirs), as (attempt, rank, stdout, stderr)."""
        for n in folders.keys() - self.attempts.keys():
            ranks = [folders[n] / str(r) for r in range(self.nproc)]
            self.attempts[n] = [(Tail(d / "stdout.log"), Tail(d / "stderr.log")) for d in ranks]
        return [
            (n, r, out.read(final), err.read(final))
            for n in sorted(self.attempts)
            for r, (out, err) in enumerate(self.attempts[n])
        ]

    def last(self) -> list[tuple[Tail, Tail]]:
        """The last attempt's tails per rank; empty ones before any attempt."""
        if self.attempts:
            return self.attempts[max(self.attempts)]
        return [(Tail(Path(os.devnull)), Tail(Path(os.devnull))) for _ in range(self.nproc)]

    def keep(self, log_dir: Path) -> None:
        """Move the last attempt's logs to stable names: <log_dir>/rank<R>.{stdout,stderr}.log."""
        for r, tails in enumerate(self.last() if self.attempts else []):
            for tail, kind in zip(tails, ("stdout", "stderr"), strict=True):
                with contextlib.suppress(OSError):  # (a rank that never started wrote none)
                    os.replace(tail.path, log_dir / f"rank{r}.{kind}.log")


class Display(Protocol):
    """How a job is shown (``display.py``): after every look at the logs, and once at the end."""

    def show(self, logs: Logs, new: list[tuple]) -> None: ...

    def end(self, logs: Logs, outcome: str | None) -> None: ...


@contextlib.contextmanager
def one_interrupt() -> Iterator[list[float]]:
    """Inside the block, the first Ctrl-C (a kernel interrupt, SIGINT) raises KeyboardInterrupt as
    usual, and every later one is only counted (in the list yielded): a job being stopped is stopped
    to the end, however often the learner presses. Only where Python delivers signals (the main
    thread) and where SIGINT already raised KeyboardInterrupt (a callable handler)."""
    pressed: list[float] = []
    main = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGINT) if main else None
    if not callable(old):
        yield pressed
        return

    def on_sigint(signum: int, frame: object) -> None:
        pressed.append(time.monotonic())
        if len(pressed) == 1:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, old)


def supervise(job: Engine, display: Display, deadline: float, t0: float) -> tuple:
    """Watch `job` until it exits or `deadline` (time.monotonic()) passes, then stop every process
    of it (the whole job, or what it left running); on an interrupt too, however often it is
    pressed: a second press only skips the grace period. Returns (exit code or None, seconds since
    `t0`, logs)."""
    logs = Logs(job.job.nproc)
    with one_interrupt() as pressed:
        try:
            while (rc := job.poll()) is None and time.monotonic() < deadline:
                display.show(logs, logs.read(job.attempt_dirs()))
                job.wait(max(0.0, min(POLL_S, deadline - time.monotonic())))
            elapsed = time.monotonic() - t0
            job.stop()
        except BaseException as exc:  # KeyboardInterrupt (a kernel interrupt) or an error of ours
            _stop_interrupted(job, display, logs, pressed, exc)
            raise
    display.show(logs, logs.read(job.attempt_dirs(), final=True))
    logs.keep(job.job.logs)
    display.end(logs, "timeout" if rc is None else "failure" if rc else "ok")
    return rc, elapsed, logs


def _stop_interrupted(job: Engine, display: Display, logs: Logs, pressed: list, exc: BaseException) -> None:
    again = len(pressed)  # presses from now on hurry the stop; they cannot abort it
    for _ in range(3):  # (where presses still raise: no handler of ours, see one_interrupt)
        with contextlib.suppress(KeyboardInterrupt):
            job.stop(hurry=lambda: len(pressed) > again)
            break
    if not isinstance(exc, KeyboardInterrupt):
        display.end(logs, None)
        return
    with contextlib.suppress(Exception):  # what the ranks printed, kept where the logs go
        display.show(logs, logs.read(job.attempt_dirs(), final=True))
        logs.keep(job.job.logs)
    display.end(logs, "interrupted")
    where = job.job.logs
    exc.args = (tr(
        "the job was interrupted, and every process of it was stopped. What the ranks printed is above; logs: {where}",
        "作业被中断，它的所有进程都已停止。各 rank 打印的内容在上面；日志：{where}", where=where),)
