"""Start processes from a notebook or a terminal, safely: ``torchrun()`` runs a script on N ranks,
``spawn_bounded()`` is ``mp.spawn`` with a deadline, ``child_stderr()`` keeps what children write.
Command line: ``python -m course_utils launch SCRIPT --nproc 2 -- ARGS``.

The package, by what each module decides:

- ``api``: ``torchrun()``, ``LaunchResult``, ``LaunchError`` / ``LaunchTimeout``, the terminal command
  a launch shows; ``cli``: the command line.
- ``engine``: the contract every engine keeps (start, poll, wait, stop, failures, attempt_dirs);
  ``torchrun_engine`` (+ ``agent``, torchrun itself with a report of the failed ranks) and ``warm``
  (the client) + ``server`` (the warm server: forking the ranks, the job's store, a rank's shutdown).
- ``watch``: the logs read as they grow, the supervision until the end or the timeout;
  ``display``: how a job is shown (terminal, Jupyter widget, nothing).
- ``diagnosis``: which rank a failed launch blames, and why (torch's error files, stderr).
- ``processes``: ``/proc``, stopping a job (SIGTERM, grace, SIGKILL), the parent-death signal.
- ``capacity``: how many ranks this machine holds; ``spawn``: ``spawn_bounded``, ``child_stderr``.
"""

from __future__ import annotations

from typing import Any

from .api import (
    ENGINES,
    WARM_IMPORTS_VAR,
    LaunchError,
    LaunchResult,
    LaunchTimeout,
    choose_engine,
    torchrun,
    warm_up,
)
from .capacity import machine_capacity
from .cli import main
from .spawn import CapturedStderr, SpawnFailed, child_stderr, error_lines, free_port, spawn_bounded

__all__ = [
    "ENGINES", "WARM_IMPORTS_VAR", "CapturedStderr", "LaunchError", "LaunchResult", "LaunchTimeout", "SpawnFailed",
    "child_stderr", "choose_engine", "error_lines", "free_port", "machine_capacity", "main",
    "spawn_bounded", "torchrun", "warm_up",
]
for _name in ("LaunchError", "LaunchResult", "LaunchTimeout", "SpawnFailed", "CapturedStderr"):
    globals()[_name].__module__ = __name__  # their public home, as tracebacks and pickles name them


def __getattr__(name: str) -> Any:
    # Chapter 03's helper, which lives in its chapter module; notebook 03 still imports it here.
    if name == "worker_failure":
        from ..ch03_data_loading import worker_failure

        return worker_failure
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
