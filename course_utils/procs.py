"""What child processes write on stderr, captured instead of interleaved in a notebook.

Child processes (``mp.spawn``'s, DataLoader workers, a launcher's ranks) inherit the file
descriptor 2 of the process that starts them. In Jupyter that is the kernel's stderr, so two
children failing at once print two tracebacks in whatever order they happen to arrive. Inside
:func:`child_stderr` they write to a temporary file instead, and the cell prints a summary
that does not depend on timing::

    with child_stderr() as err:
        ...start processes...
    print(err.summary())      # "2 x AttributeError: Can't get attribute ..."
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["CapturedStderr", "child_stderr", "error_lines", "worker_failure"]

_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


_MODULE_REPR = re.compile(r"<module '([\w.]+)' \(.*?\)>")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_lines(text: str) -> list[str]:
    """The lines of `text` that name an exception (``ValueError: ...``), in order, as plain text
    that reads the same on every Python version: colour codes removed (3.13 colours tracebacks
    when a terminal or ``FORCE_COLOR`` asks for it), and a module's repr shortened to
    ``<module 'name'>`` (``(built-in)`` on 3.11, the loader's class from 3.12)."""
    text = _ANSI.sub("", text)
    lines = [ln.strip() for ln in text.splitlines() if _ERROR_LINE.match(ln.strip())]
    return [_MODULE_REPR.sub(r"<module '\1'>", ln) for ln in lines]


_WORKER_DIED = re.compile(r"DataLoader worker .*?exited unexpectedly")
_PIDS = re.compile(r" \(pid(?:\(s\))?[^)]*\)")  # " (pid 42)", " (pid(s) 42, 43)"


def worker_failure(err: BaseException) -> str:
    """A DataLoader's report that a worker died, as one line that reads the same in every run:
    ``RuntimeError: DataLoader worker exited unexpectedly``, without the pid(s) and exit details that
    change from run to run. Any other error comes back as ``Type: message`` unchanged."""
    found = _WORKER_DIED.search(str(err))
    what = _PIDS.sub("", found.group(0)) if found else str(err)
    return f"{type(err).__name__}: {what}"


@dataclass
class CapturedStderr:
    """What the children wrote (``text``, once the block has ended)."""

    text: str = ""

    def errors(self) -> Counter[str]:
        """Each distinct exception line, with how many times it was written."""
        return Counter(error_lines(self.text))

    def summary(self) -> str:
        """One line per distinct error, most frequent first (ties in alphabetical order)."""
        errs = sorted(self.errors().items(), key=lambda kv: (-kv[1], kv[0]))
        if not errs:
            return "no error on the children's stderr"
        return "\n".join(f"{n} x {line}" for line, n in errs)


@contextlib.contextmanager
def child_stderr() -> Iterator[CapturedStderr]:
    """Send file descriptor 2 to a temporary file while the block runs (and so the stderr of
    every process started inside it); restore it afterwards, even on an error."""
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
