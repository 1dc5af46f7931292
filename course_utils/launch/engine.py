"""What every engine offers ``torchrun()``: the job it runs (:class:`Job`), how it reports the ranks'
ends (:class:`Exits`), and the contract itself (:class:`Engine`). Two engines keep it:
``torchrun_engine.Torchrun`` (PyTorch's own launcher) and ``warm.Warm`` (ranks forked from a server
that imported torch once). Nothing starts a process before :meth:`Engine.start`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

JOB_VAR = "COURSE_LAUNCH_ID"  # in the environment of every process of a job: to find them all
COURSE_ROOT = Path(__file__).resolve().parents[2]


class StartTimeout(Exception):
    """The job's timeout passed while its ranks were still being started (what started is stopped)."""


@dataclass(frozen=True)
class Job:
    """One launch: `script` (relative to `cwd`) with `argv` on `nproc` ranks, each with the
    environment `env` plus what the engine gives a rank, logs under `logs`; `restarts`: elastic
    restarts allowed (torchrun's agent only)."""

    script: str
    nproc: int
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    logs: Path
    restarts: int = 0

    @property
    def job_id(self) -> str:
        """The value of JOB_VAR in the environment of every process of the job."""
        return self.env[JOB_VAR]


@dataclass(frozen=True)
class Exits:
    """How the ranks of a job ended, as its engine saw them: ``codes``, {rank: exit code} of those
    that failed; ``first``, the first failure observed (None if unknown); ``error_files``, where each
    rank's torch error file is when it wrote one (``TORCHELASTIC_ERROR_FILE``, see diagnosis)."""

    codes: Mapping[int, int] = field(default_factory=dict)
    first: int | None = None
    error_files: Mapping[int, Path] = field(default_factory=dict)


class Engine(Protocol):
    """How the ranks of a :class:`Job` are started, watched and stopped."""

    name: str  # "torchrun" or "warm"
    job: Job

    def start(self, deadline: float) -> None:
        """Start the ranks. :class:`StartTimeout` (everything started is stopped) if
        `deadline` (``time.monotonic()``) comes first; OSError if this engine cannot run the job."""

    def poll(self) -> int | None:
        """The job's exit code (0: every rank succeeded), or None while it runs."""

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking early when the job ends."""

    def stop(self, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stop every process of the job (SIGTERM, then SIGKILL after the grace period, at once when
        `hurry()` turns true). Safe to call after the job ended: it stops what the ranks left."""

    def failures(self) -> Exits:
        """How the ranks ended (once the job is over)."""

    def attempt_dirs(self) -> dict[int, Path]:
        """{attempt: its folder, with <rank>/stdout.log and <rank>/stderr.log}; restarts add one."""

    def output(self) -> str:
        """What the launcher itself said (torchrun's summary of the failures, ...)."""


def job_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of every rank, as torchrun would give it from here: this process's, `extra`,
    one OpenMP thread where neither sets ``OMP_NUM_THREADS`` (torchrun's default), unbuffered output,
    and the course on the path (the scripts import ``course_utils``)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env.setdefault("OMP_NUM_THREADS", "1")
    paths = (str(COURSE_ROOT), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env
