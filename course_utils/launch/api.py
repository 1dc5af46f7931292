"""``torchrun()``: run a script on N local ranks from a notebook or a terminal, as ``torchrun
--standalone`` would, with a timeout, per-rank logs and a clear error naming the rank that failed.

Used in notebook 04 from section 1 ("Starting processes") on, notebook 05 (sections 3, 6 and 7: a
full run, interrupted and resumed, elastic restarts) and notebook 06 (pitfall 7: evaluating on rank 0).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..i18n import tr
from . import display, warm
from .capacity import check_capacity
from .diagnosis import RankFailure, diagnose
from .engine import JOB_VAR, Engine, Job, StartTimeout, job_env
from .server import WARM_IMPORTS_VAR
from .torchrun_engine import Torchrun
from .watch import supervise

ENGINES = ("warm", "torchrun")


class LaunchError(RuntimeError):
    """A rank of a distributed job failed (or the launcher did). ``rank``: the one that failed by
    itself (not one that only lost its peer or was stopped), the lowest of several that failed alike
    (with the same error on every rank, the one named can vary; ``error`` does not); or None.
    ``failures``: every failed rank's record (``diagnosis.RankFailure``)."""

    rank: int | None = None
    exit_code: int | None = None
    error: str = ""  # the last line of its error output, e.g. "ValueError: bad shape"
    failures: Mapping[int, RankFailure] = {}
    logs: Sequence[str] = ()  # each rank's stdout (and `stderr`, its stderr)
    stderr: Sequence[str] = ()
    log_dir: str = ""
    elapsed: float = 0.0  # seconds from the start to the end of the job

    def __init__(self, message: str, **info: Any) -> None:
        super().__init__(message)
        self.__dict__.update(info)


class LaunchTimeout(LaunchError):
    """The job ran past its timeout; every process of it was stopped."""


@dataclass
class LaunchResult:
    """A finished job: ``logs[r]`` is rank r's stdout, ``stderr[r]`` its stderr (of the last
    attempt when the job was restarted; ``attempts`` holds every attempt's stdout)."""

    script: str
    nproc: int
    backend: str
    returncode: int
    elapsed: float = field(repr=False)
    logs: list[str] = field(repr=False)
    stderr: list[str] = field(repr=False)
    log_dir: str = field(repr=False)
    restarts: int = field(default=0, repr=False)
    attempts: list[list[str]] = field(default_factory=list, repr=False)
    engine: str = field(default="torchrun", repr=False)  # what started the ranks: "warm" or "torchrun"
    command: str = field(default="", repr=False)  # the same job as a terminal command

    def lines(self, rank: int) -> list[str]:
        """Rank `rank`'s stdout as a list of lines."""
        return self.logs[rank].splitlines()


def choose_engine(engine: str | None, max_restarts: int) -> str:
    """The engine to use: `engine`, else $COURSE_LAUNCHER, else warm unless the job needs torchrun
    (elastic restarts) or the system cannot fork a warm server safely (only Linux is tested)."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} or None; got {engine!r}.")
    if engine == "warm" and max_restarts:
        raise ValueError(
            "elastic restarts (max_restarts > 0) are torchrun's: its agent restarts the ranks. "
            "Use engine='torchrun' (or leave engine=None, which chooses torchrun for them)."
        )
    preferred = os.environ.get("COURSE_LAUNCHER") or "warm"
    if engine is None and preferred not in ENGINES:
        raise ValueError(f"COURSE_LAUNCHER must be one of {ENGINES}; got {preferred!r}.")
    if engine is None:
        can_warm = sys.platform.startswith("linux") and not max_restarts
        engine = preferred if can_warm else "torchrun"
    return engine


def warm_up(imports: Sequence[str] = ()) -> None:
    """Start the warm engine's server now, in the background, so that the first launch does not
    wait for it to import torch (a notebook calls this in its first cell). Does nothing where the
    warm engine is not used (off Linux, or COURSE_LAUNCHER=torchrun).

    `imports`: more modules for the server to import, which every rank it forks then has already
    (e.g. ``torch.distributed.tensor``; chapter 07's first cell); they are kept in
    ``COURSE_WARM_IMPORTS``, so that the later launches of this process find that server. (A module
    the server cannot import stops it, and the launches then run with torchrun, with a warning that
    says why.)"""
    if isinstance(imports, str) or not all(isinstance(m, str) and m and "," not in m for m in imports):
        raise ValueError(f"warm_up(imports=...) takes a list of module names, got {imports!r}")
    if imports:
        os.environ[WARM_IMPORTS_VAR] = ",".join(imports)
    if choose_engine(None, 0) == "warm":
        warm.warm_up(job_env({}))


# Set by the launcher for its own use, and no different in a terminal's run of the script.
_NOT_SHOWN = {JOB_VAR, "PYTHONUNBUFFERED", "PYTHONPATH", "COURSE_BACKEND"}


def shown_env(env: Mapping[str, str], nproc: int, backend: str, default_backend: str) -> dict:
    """The variables of `env` that a terminal's ``torchrun`` in this environment would not give the
    ranks (with `default_backend`: what a script chooses by itself)."""
    terminal = dict(os.environ)
    if "OMP_NUM_THREADS" not in terminal and nproc > 1:
        terminal["OMP_NUM_THREADS"] = "1"  # torchrun's own default
    shown = {k: v for k, v in env.items() if k not in _NOT_SHOWN and terminal.get(k) != v}
    if backend != (os.environ.get("COURSE_BACKEND") or default_backend):
        shown["COURSE_BACKEND"] = backend
    return shown


def command(script: str, nproc: int, argv: Sequence[str], max_restarts: int = 0,
            env: Mapping[str, str] | None = None) -> str:
    """The job as a learner would type it in a terminal (`env`: variables to set before it)."""
    assign = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    opts = ["torchrun", "--standalone", f"--nproc-per-node={nproc}", *restarts]
    return " ".join([*assign, shlex.join([*opts, script, *argv])])


def _check(base: Path, script: str, nproc: object, timeout: object, max_restarts: object) -> None:
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a whole number of processes, at least 1; got {nproc!r}.")
    if not (base / script).is_file():  # (an absolute script stays itself)
        raise FileNotFoundError(
            f"script not found: {script} (looked for {(base / script).resolve()}). Paths "
            "are relative to the current directory, which is notebooks/ in a course notebook: "
            "e.g. 'scripts/hello_dist.py'."
        )
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None; got {timeout!r}.")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more; got {max_restarts!r}.")


def _backends(backend: str | None, extra: Mapping[str, str], nproc: int) -> tuple[str, str]:
    """(the job's backend, the one a script would choose by itself), refused if it cannot work."""
    from ..dist import check_backend, choose_backend  # imports torch: only when launching

    default = choose_backend(nproc, warn=False)
    from_env = not backend and not extra.get("COURSE_BACKEND") and os.environ.get("COURSE_BACKEND")
    chosen = str(backend or extra.get("COURSE_BACKEND") or os.environ.get("COURSE_BACKEND") or default)
    check_backend(chosen, nproc, setting="COURSE_BACKEND" if from_env else None)
    return chosen, default


def _start(job: Job, engine: str, deadline: float) -> Engine:
    """The job started on `engine`; on torchrun, with a warning, where the warm server cannot run."""
    runner: Engine = warm.Warm(job) if engine == "warm" else Torchrun(job)
    try:
        runner.start(deadline)
    except OSError as exc:
        if engine != "warm":
            raise
        warnings.warn(f"{exc}; running the job with torchrun instead", RuntimeWarning, stacklevel=3)
        shutil.rmtree(job.logs / "warm", ignore_errors=True)
        runner = Torchrun(job)
        runner.start(deadline)
    return runner


def _timeout_error(script: str, nproc: int, timeout: float, **info: Any) -> LaunchTimeout:
    """The error of a job stopped at its timeout, with where its logs are."""
    log_dir = info["log_dir"]
    return LaunchTimeout(tr(
        "{script} ({nproc} processes) did not finish within its timeout of {timeout:g} s, "
        "so every process of the job was stopped.\n"
        "A rank that waits forever (in all_reduce, barrier, ...) usually means that another "
        "rank never made the same call.\n"
        "Logs of each rank R: {log_dir}/rankR.stdout.log and rankR.stderr.log",
        "{script}（{nproc} 个进程）超过了 {timeout:g} 秒的时限仍未结束，作业的所有进程已被停止。\n"
        "某个 rank 一直卡在等待中（all_reduce、barrier 等），"
        "通常是因为另一个 rank 始终没有执行同一个调用。\n"
        "每个 rank R 的日志：{log_dir}/rankR.stdout.log 和 rankR.stderr.log",
        script=script, nproc=nproc, timeout=timeout, log_dir=log_dir,
    ), **info)


def torchrun(
    script: str | os.PathLike,
    nproc: int = 2,
    args: Sequence[object] = (),
    timeout: float | None = 300.0,
    backend: str | None = None,
    max_restarts: int = 0,
    env: Mapping[str, object] | None = None,
    show: bool = True,
    *,
    cwd: str | os.PathLike | None = None,
    engine: str | None = None,
    max_nproc: int | None = None,
) -> LaunchResult:
    """Run `script` (relative to `cwd`, by default the current directory: ``notebooks/`` in a
    notebook) on `nproc` local processes as ``torchrun --standalone`` would, each rank with its own
    log files and, unless `env` or this environment sets ``OMP_NUM_THREADS``, one thread.
    `engine`: "torchrun" runs ``python -m torch.distributed.run``; "warm" forks the ranks from a
    server that imported torch once (a fraction of a second instead of seconds; Linux, no restarts);
    None: ``COURSE_LAUNCHER`` if set, else warm where it can. `backend` None: ``COURSE_BACKEND`` if
    set, else nccl with a GPU per rank, else gloo. `timeout`: seconds (None: no limit), counted from
    the call. `env`: more variables for the ranks. `show`: in Jupyter a live widget, then the output
    grouped by rank; in a terminal, lines streamed with a ``[rank N]`` prefix. `max_nproc`: the most
    processes to start (None: what this machine can hold, see ``machine_capacity``).
    Raises ``LaunchError`` naming a failing rank with its traceback, ``LaunchTimeout`` past
    `timeout`, and, before starting anything, ``ValueError`` / ``FileNotFoundError`` /
    ``RuntimeError`` (nccl without a GPU per rank) for bad arguments."""
    base, script = Path(cwd if cwd is not None else Path.cwd()), os.fspath(script)
    _check(base, script, nproc, timeout, max_restarts)
    check_capacity(nproc, max_nproc)
    engine = choose_engine(engine, max_restarts)
    extra = {k: str(v) for k, v in (env or {}).items()}
    backends = _backends(backend, extra, nproc)
    job, shown = _job(script, nproc, args, base, extra, backends, max_restarts)
    backend, log_dir = backends[0], job.logs
    t0 = time.monotonic()  # the timeout counts from here: starting the ranks is part of the job
    deadline = t0 + timeout if timeout is not None else float("inf")
    try:
        runner = _start(job, engine, deadline)
    except StartTimeout:
        info = {"log_dir": str(log_dir), "logs": [""] * nproc, "stderr": [""] * nproc,
                "elapsed": time.monotonic() - t0}
        raise _timeout_error(script, nproc, timeout, **info) from None
    try:  # (an interrupt before the supervision starts stops the job too)
        view = display.for_here(display.title(shown, backend, runner.name), show)
    except BaseException:
        runner.stop()
        raise
    rc, elapsed, logs = supervise(runner, view, deadline, t0)
    out, err = [o.text() for o, _ in logs.last()], [e.text() for _, e in logs.last()]
    info = {"log_dir": str(log_dir), "logs": out, "stderr": err, "elapsed": elapsed}
    if rc is None:
        raise _timeout_error(script, nproc, timeout, **info)
    if rc != 0:
        found = diagnose(runner.failures(), rc, script, nproc, err, str(log_dir), runner.output())
        raise LaunchError(found.message, rank=found.rank, exit_code=found.exit_code,
                          error=found.error, failures=found.failures, **info)
    attempts = [[o.text() for o, _ in ranks] for _, ranks in sorted(logs.attempts.items())]
    return LaunchResult(script, nproc, backend, 0, elapsed, out, err, str(log_dir),
                        max(logs.attempts, default=0), attempts, engine=runner.name, command=shown)


# a temporary folder inside /tmp that nbval_sanitize.cfg reads as <tmp> too (a test run's own)
_READ_AS_TMP = re.compile(r"/tmp(?:/tmp[\w\-]+)+")


def _log_root() -> str | None:
    """Where a job's log folder goes: /tmp, whose paths are short and read the same on every Unix (the
    stored outputs show them as <tmp>), or the temporary folder where that lies in /tmp and reads as
    <tmp> as well (a test run's own, conftest.py; not /tmp/user/1000, say, which pam_tmpdir sets);
    where there is no /tmp, the system's temporary folder."""
    if not os.path.isdir("/tmp"):
        return None
    root = tempfile.gettempdir()
    return root if _READ_AS_TMP.fullmatch(root) else "/tmp"


def _job(script: str, nproc: int, args: Sequence[object], base: Path, extra: Mapping[str, str],
         backends: tuple[str, str], max_restarts: int) -> tuple[Job, str]:
    """``torchrun()``'s job (a log folder of its own, the ranks' environment with the chosen backend
    in ``COURSE_BACKEND``) and the terminal command it shows; `backends`: see ``_backends``."""
    backend, default_backend = backends
    log_dir = Path(tempfile.mkdtemp(dir=_log_root()))
    run_env = {**job_env(extra), "COURSE_BACKEND": backend, JOB_VAR: uuid.uuid4().hex}
    argv = tuple(str(a) for a in args)
    shown = command(script, nproc, argv, max_restarts, shown_env(run_env, nproc, backend, default_backend))
    return Job(script, nproc, argv, base, run_env, log_dir, max_restarts), shown
