"""Start processes from a notebook or a terminal, safely: ``torchrun()`` runs a script on N ranks,
``spawn_bounded()`` is ``mp.spawn`` with a deadline, ``child_stderr()`` keeps what children write.
Command line: ``python -m course_utils launch SCRIPT --nproc 2 -- ARGS``."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import html
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .i18n import tr

JOB_VAR = "COURSE_LAUNCH_ID"  # in the environment of every process of a job: to find them all
POLL_S = 0.1  # seconds between two looks at the logs
GRACE_S = 2.0  # seconds a process gets between SIGTERM and SIGKILL when a job is stopped
TAIL_LINES = 12  # lines of a failing rank's error output quoted in the exception

# Linux: the launcher gets SIGTERM when its caller dies (a killed or restarted kernel) and stops its
# ranks; set by a stdlib-only shim that execs it (preexec_fn is unsafe in a threaded kernel).
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "try: ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG\n"
    "except Exception: pass\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit('the caller of the launcher is gone')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|"
    r"DistBackendError|Socket Timeout|timed out|SIGTERM|Signal 15",
)
# A last line that says why a rank stopped: an exception, or a script's own "error: ..." line.
_SAYS_WHY = re.compile(r"^(error\b|[A-Za-z_][\w.]*(Error|Exception)\b)", re.IGNORECASE)


class LaunchError(RuntimeError):
    """A rank of a distributed job failed (or the launcher did). ``rank``: the one that failed by
    itself (not one that only lost its peer or was stopped), the lowest of several that failed alike
    (with the same error on every rank, the one named can vary; ``error`` does not); or None."""

    rank: int | None = None
    exit_code: int | None = None
    error: str = ""  # the last line of its error output, e.g. "ValueError: bad shape"
    logs: Sequence[str] = ()  # each rank's stdout (and `stderr`, its stderr)
    stderr: Sequence[str] = ()
    log_dir: str = ""
    elapsed: float = 0.0  # seconds from the start to the end of the job

    def __init__(self, message: str, **info: Any) -> None:
        super().__init__(message)
        self.__dict__.update(info)


class LaunchTimeout(LaunchError):
    """The job ran past its timeout; every process of it was stopped."""


class _StartTimeout(Exception):
    """The job's timeout passed while its ranks were still being started (everything started was stopped)."""


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


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (not a terminal, not a plain IPython shell)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return "IPKernelApp" in getattr(shell, "config", {})


def _strip(line: str) -> str:  # a rank's stderr line without the "[rankN]:" torch adds
    return _TORCH_RANK_PREFIX.sub("", line)


def _write(stream: Any, lines: list[str]) -> None:
    if lines:
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()


def _describe_exit(code: int | None) -> str:
    if code is None or code >= 0:
        if code is None:
            return tr("an unknown exit code", "未知的退出码")
        return tr(f"exit code {code}", f"退出码 {code}")
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    oom = ""
    if code == -signal.SIGKILL:
        oom = tr(": killed, often because the machine ran out of memory", "：被强制终止，通常是因为机器内存不足")
    return tr(f"exit code {code} ({name}{oom})", f"退出码 {code}（{name}{oom}）")


class _Tail:
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


class _Logs:
    """Every attempt's (stdout, stderr) tails of every rank."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.attempts: dict[int, list[tuple[_Tail, _Tail]]] = {}

    def read(self, folders: Mapping[int, Path], final: bool = False) -> list[tuple]:
        """New lines of `folders` (see attempt_dirs), as (attempt, rank, stdout, stderr) lines."""
        for n in folders.keys() - self.attempts.keys():
            ranks = [folders[n] / str(r) for r in range(self.nproc)]
            self.attempts[n] = [(_Tail(d / "stdout.log"), _Tail(d / "stderr.log")) for d in ranks]
        return [
            (n, r, out.read(final), err.read(final))
            for n in sorted(self.attempts)
            for r, (out, err) in enumerate(self.attempts[n])
        ]

    def last(self) -> list[tuple[_Tail, _Tail]]:
        """The last attempt's tails per rank; empty ones before any attempt."""
        if self.attempts:
            return self.attempts[max(self.attempts)]
        return [(_Tail(Path(os.devnull)), _Tail(Path(os.devnull))) for _ in range(self.nproc)]

    def keep(self, log_dir: Path) -> None:
        """Move the last attempt's logs to stable names: <log_dir>/rank<R>.{stdout,stderr}.log."""
        for r, tails in enumerate(self.last() if self.attempts else []):
            for tail, kind in zip(tails, ("stdout", "stderr"), strict=True):
                with contextlib.suppress(OSError):  # (a rank that never started wrote none)
                    os.replace(tail.path, log_dir / f"rank{r}.{kind}.log")


def _alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rfind(b")") + 2 :][:1] != b"Z"
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal, or no /proc
        return True


class _Torchrun:
    """How the ranks are started: PyTorch's launcher, ``python -m torch.distributed.run``, in a
    session of its own. The rest reads only ``nproc``, ``logs`` (the folder) and the methods below,
    so another engine offering them (``_Warm``: ranks forked from a warm server) can take its place."""

    name = "torchrun"

    def __init__(
        self, script: str, nproc: int, argv: list, restarts: int, cwd: Path, env: dict, logs: Path,
        deadline: float = float("inf"),
    ) -> None:
        self.nproc, self.logs, self.job_id = nproc, logs, env[JOB_VAR]
        if restarts > 0:
            # Restarted ranks otherwise read the previous attempt's keys from the shared rendezvous
            # store and fail to connect or hang (pytorch/pytorch#135712).
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        # --standalone: c10d rendezvous on localhost:0, a free port chosen by the OS every time
        opts = f"--standalone --nnodes 1 --nproc-per-node {nproc} --max-restarts {restarts} "
        opts += "--redirects 3 --shutdown-timeout 5"
        cmd = [sys.executable, "-m", "torch.distributed.run", *opts.split()]
        cmd += ["--log-dir", str(logs / "torchrun"), script, *argv]
        if sys.platform.startswith("linux"):
            cmd = _with_pdeathsig(cmd)
        with open(logs / "launcher.log", "wb") as out:
            kw = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": subprocess.STDOUT}
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True, **kw)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking (within 50 ms) when the launcher exits."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(seconds)

    def attempt_dirs(self) -> dict[int, Path]:
        """{attempt: its folder, with <rank>/stdout.log and <rank>/stderr.log}; restarts add one."""
        folders = (self.logs / "torchrun").glob("*/attempt_*")
        return {int(d.name[8:]): d for d in folders if d.name[8:].isdigit()}

    def output(self) -> str:
        """What the launcher itself wrote (its summary of the failures, ...)."""
        return (self.logs / "launcher.log").read_text(errors="replace")

    def failures(self) -> tuple[dict[int, int], int | None]:
        """({rank: exit code} of the ranks that failed, the first that failed or None)."""
        return _failures(self.output())

    def pids(self) -> set[int]:
        """Live processes of the job (workers run in sessions of their own: the launcher's process
        group misses them). Linux: those whose environment holds its JOB_VAR (a zombie's shows
        none), orphans too. Elsewhere: the launcher's descendants, as ``ps`` lists them."""
        if os.path.isdir("/proc/self"):
            return _job_processes(self.job_id)
        found: set[int] = set()
        children: dict[int, list[int]] = {}
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            ps = ["ps", "-A", "-o", "pid=,ppid=,stat="]
            rows = subprocess.run(ps, capture_output=True, text=True, timeout=10).stdout
            for row in rows.splitlines():
                pid, ppid, state = row.split()[:3]
                if not state.startswith("Z"):
                    children.setdefault(int(ppid), []).append(int(pid))
        stack = [self.proc.pid] if self.poll() is None else []  # its pid is ours until reaped
        while stack:
            found.add(pid := stack.pop())
            stack.extend(children.get(pid, []))
        return found

    def stop(self, hurry: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM every process of the job, SIGKILL what is left after GRACE_S (at once when
        `hurry()` turns true)."""
        if os.name != "posix":  # pragma: no cover - the course runs on Linux and macOS
            self.proc.kill()
            return
        launcher = {self.proc.pid} if self.poll() is None else set()  # not reaped yet
        _stop(self.pids, launcher, self.poll, hurry)  # (poll reaps the launcher once it has exited)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _job_processes(job_id: str, sessions: Iterable[int] = ()) -> set[int]:
    """Linux: the processes (but this one) whose environment holds the job's JOB_VAR (a zombie's
    shows none), orphans too, and those in the session of one of `sessions`."""
    marker = f"{JOB_VAR}={job_id}\0".encode()
    leaders = {str(p).encode() for p in sessions}
    found = set()
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        with contextlib.suppress(OSError, IndexError):
            if leaders:
                stat = Path(f"/proc/{pid}/stat").read_bytes()
                if stat[stat.rfind(b")") + 2 :].split()[3] in leaders:
                    found.add(pid)
                    continue
            if marker in Path(f"/proc/{pid}/environ").read_bytes():
                found.add(pid)
    return found - {os.getpid()}


def _with_pdeathsig(cmd: list[str]) -> list[str]:
    """`cmd` started through the shim that asks Linux for SIGTERM when its caller dies."""
    return [sys.executable, "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *cmd]


def _stop(
    find: Callable[[], set[int]],
    also: Iterable[int] = (),
    reap: Callable = lambda: None,
    hurry: Callable[[], bool] = lambda: False,
) -> None:
    """SIGTERM the processes `find()` returns (and `also`), each one's process group too, SIGKILL
    what is left after GRACE_S (or as soon as `hurry()` is true: the learner pressed again), until
    `find()` finds none."""
    pids = find() | set(also)
    # SIGKILL more than once: a launcher in the middle of a restart may start new workers.
    for sig in [signal.SIGTERM] + [signal.SIGKILL] * 5:
        for pid in pids:
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:  # each worker leads its own process group
                    os.killpg(pid, sig)
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.monotonic() + (GRACE_S if sig == signal.SIGTERM else 0.05)
        while any(map(_alive, pids)) and time.monotonic() < end and not (sig == signal.SIGTERM and hurry()):
            time.sleep(0.05)
            reap()
        pids = {p for p in pids | find() if _alive(p)}
        if not pids:
            break


# --- the warm engine: ranks forked from a server that imported torch once --------------------

_WARM_IMPORTS = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data")
# More modules for the server to import (comma-separated), set by ``warm_up(imports=...)``: a chapter whose
# scripts import heavy parts of torch (DTensor, pipelining: seconds each) pays for them once, not per rank.
WARM_IMPORTS_VAR = "COURSE_WARM_IMPORTS"
# Variables that the interpreter, torch or its libraries may read once, at start-up or import
# (TORCH_DISTRIBUTED_DEBUG and TORCH_LOGS are read by ``import torch``; PYTHONHASHSEED by Python):
# a forked rank keeps what its server read, so a job runs on a server started with the same values.
_IMPORT_TIME = (
    "TORCH", "PYTORCH", "PYTHON", "CUDA", "CUBLAS", "CUDNN", "NCCL", "GLOO", "OMP_", "MKL",
    "KMP_", "OPENBLAS", "LD_", "HIP", "ROCM", WARM_IMPORTS_VAR,
)


def _import_time(env: Mapping[str, str]) -> tuple:
    """The part of `env` that a server reads at start-up (see _IMPORT_TIME): the pool's key."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_IMPORT_TIME)))


def _job_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of every rank: this one, one thread per rank (as torchrun's default, so the
    numbers printed do not depend on cores), unbuffered output, `extra`, and the course on the path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    paths = (str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _prctl_pdeathsig(sig: int) -> None:
    """Linux: `sig` to this process when its parent dies."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, int(sig))  # PR_SET_PDEATHSIG


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _run_rank(job: dict, rank: int, reply_fd: int, server: int) -> None:
    """In a forked child of the server: become rank `rank` of `job` as ``python -u SCRIPT ARGS``
    started by torchrun would be (own session, environment, working directory, ``__main__``, log
    files), run the script, and leave by ``SystemExit`` so that the interpreter shuts down as
    usual (threads joined, atexit, files flushed, objects finalised). Never returns."""
    try:
        os.setsid()  # a process group of its own, as torchrun's workers: stopped as a whole
        _prctl_pdeathsig(signal.SIGKILL)  # the server gone (killed): its ranks go too
        if os.getppid() != server:
            os._exit(1)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # the server blocked them around fork
        os.close(reply_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
            path = Path(job["logs"], str(rank), name)
            log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, fd)
            os.close(log)
        # The server's own streams: unbuffered (PYTHONUNBUFFERED), in the job's encoding.
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        os.chdir(job["cwd"])
        env = job["envs"][rank]
        os.environ.clear()
        os.environ.update(env)
        script = os.path.abspath(job["script"])
        sys.argv = [job["script"], *job["argv"]]
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[0:1] = [os.path.dirname(os.path.realpath(script)), *extra]
        import builtins
        import importlib.machinery
        import types

        main = types.ModuleType("__main__")
        main.__file__, main.__builtins__, main.__cached__ = script, builtins, None
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
        sys.modules["__main__"] = main
        with open(script, "rb") as fh:
            code = compile(fh.read(), script, "exec", dont_inherit=True)
    except BaseException:  # the rank could not start: say why in its log
        import traceback

        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(1)
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # from the script on
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):  # killed by SIGINT, as CPython reports it
            atexit._run_exitfuncs()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    raise SystemExit(0)


def _serve() -> None:
    """The warm server, one per kernel: imports torch once and never runs torch work itself (so it
    has one thread and fork is safe; it never initialises CUDA: the ranks do). It reads one job
    per line on stdin (JSON: script, argv, cwd, envs, logs), forks the ranks and answers on stdout
    ``{"pids": [...]}``, then ``{"codes": {rank: exit code}, "root": first failing rank}``. When a
    rank fails, the others get SIGTERM, then SIGKILL after GRACE_S, as torchrun does. Its caller
    gone (end of input, or SIGTERM from its parent's death): it kills every rank and exits.
    One difference a script could see: every rank has the server's string-hash seed."""
    import importlib
    import json
    import select

    extra = [m.strip() for m in os.environ.get(WARM_IMPORTS_VAR, "").split(",") if m.strip()]
    for name in (*_WARM_IMPORTS, *extra):
        importlib.import_module(name)
    reply_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing but replies on the reply pipe
    os.close(null)
    groups: set[int] = set()

    def kill(sig: int) -> None:
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, sig)
            with contextlib.suppress(OSError):
                os.kill(group, sig)  # (a rank that has not called setsid yet)

    def bye(*_: object) -> None:
        kill(signal.SIGKILL)
        os._exit(0)

    def send(**msg: object) -> None:
        os.write(reply_fd, (json.dumps(msg) + "\n").encode())

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt stops a job via its client
    poller = select.poll()
    poller.register(0, select.POLLIN)
    server_pid = os.getpid()
    send(ready=server_pid)
    buf = b""
    while True:
        while b"\n" not in buf:
            data = os.read(0, 1 << 16)
            if not data:
                bye()
            buf += data
        line, buf = buf.split(b"\n", 1)
        job = json.loads(line)
        if _threads() > 1:  # e.g. OpenBLAS's pool, started by import torch with OMP_NUM_THREADS>1
            send(error=f"the warm server has {_threads()} threads, so forking it is unsafe")
            continue
        pids: list[int] = []
        stop = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # no handler of ours runs in a new child
        try:
            for rank in range(len(job["envs"])):
                pid = os.fork()
                if pid == 0:
                    _run_rank(job, rank, reply_fd, server_pid)
                pids.append(pid)
                groups.add(pid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
        send(pids=pids)
        codes: dict[int, int] = {}
        root, kill_at = None, float("inf")
        while len(codes) < len(pids):
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid in pids:
                rank = pids.index(pid)
                codes[rank] = os.waitstatus_to_exitcode(status)
                if codes[rank] != 0 and root is None:
                    root, kill_at = rank, time.monotonic() + GRACE_S
                    kill(signal.SIGTERM)
                continue
            if time.monotonic() > kill_at:
                kill(signal.SIGKILL)
            if poller.poll(5):
                data = os.read(0, 1 << 16)
                if not data:
                    bye()
                buf += data  # (a client sends its next job only after this one's answer)
        groups.clear()
        send(codes=codes, root=root)


class _Server:
    """A warm server process (see ``_serve``) and its pipes, started with a job's environment.
    Idle servers wait in a pool for the next job whose start-up variables (``_import_time``) are
    the same; one job at a time each (two jobs at once: two servers)."""

    idle: list[_Server] = []
    unsafe: set[tuple] = set()  # start-up variables whose server had threads (see _serve)
    lock = threading.Lock()
    START_S = 180.0  # seconds to import torch on a slow, loaded machine
    KEEP = 3  # idle servers kept at most (each holds an imported torch: a few hundred MB)

    def __init__(self, env: Mapping[str, str]) -> None:
        self.key = _import_time(env)
        env = {k: v for k, v in env.items() if k != JOB_VAR}
        cmd = _with_pdeathsig([sys.executable, "-c", "from course_utils.launch import _serve; _serve()"])
        self.errors = tempfile.TemporaryFile()
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(cmd, stdin=pipe, stdout=pipe, stderr=self.errors, env=env,
                                     start_new_session=True)
        self.buf, self.thread, self.ready = b"", threading.get_ident(), False

    def wait_ready(self, deadline: float = float("inf")) -> None:
        """Wait until the server has imported torch; OSError (it is closed) if it does not,
        _StartTimeout (it is killed) if `deadline` (time.monotonic()) comes first."""
        if self.ready:
            return
        try:
            msg = self.read(min(self.START_S, deadline - time.monotonic()))
        except EOFError:
            msg = None
        if msg is None and time.monotonic() >= deadline:
            self.close(now=True)
            raise _StartTimeout
        if not msg or "ready" not in msg:
            self.close()
            self.errors.seek(0)
            why = self.errors.read().decode(errors="replace").strip().splitlines()[-1:]
            raise OSError(f"the warm launcher did not start{': ' + why[0] if why else ''}")
        self.ready = True

    @classmethod
    def acquire(cls, env: Mapping[str, str], deadline: float = float("inf")) -> _Server:
        """An idle server (ready) started with the same start-up variables as `env`, or a new one
        (_StartTimeout if it is not ready by `deadline`)."""
        key = _import_time(env)
        if key in cls.unsafe:
            raise OSError("a warm server with these variables has threads, so forking it is unsafe")
        with cls.lock:
            for server in [s for s in cls.idle if s.proc.poll() is not None]:
                cls.idle.remove(server)
                server.close()
            server = next((s for s in reversed(cls.idle) if s.key == key), None)
            if server is not None:
                cls.idle.remove(server)
            else:
                server = cls(env)
        try:
            server.wait_ready(deadline)
        except BaseException:  # an interrupt too: no server left behind
            server.close()
            raise
        return server

    def release(self) -> None:
        """Back to the pool, unless a thread other than the main one started it: Linux sends the
        parent-death signal when that thread ends, so the server would die under a later job."""
        if self.thread != threading.main_thread().ident:
            self.close()
            return
        with self.lock:
            self.idle.append(self)
            old = self.idle[: -self.KEEP]
            del self.idle[: -self.KEEP]
        for server in old:
            server.close()

    def send(self, msg: dict) -> None:
        import json

        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout: float) -> dict | None:
        """The server's next message, or None if none comes within `timeout` seconds; EOFError if
        the server is gone."""
        import json
        import select

        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not poller.poll(max(0, int(left * 1000))):
                return None
            data = os.read(fd, 1 << 16)
            if not data:
                raise EOFError("the warm launcher's server is gone")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self, now: bool = False) -> None:
        """End the server: end of input (it kills its ranks and exits), killed after 5 s, or at once
        with `now` (its ranks die with it: their parent-death signal)."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()  # end of input: the server kills what is left and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(0 if now else 5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.errors):
            with contextlib.suppress(OSError, ValueError):
                pipe.close()


def warm_up(imports: Sequence[str] = ()) -> None:
    """Start the warm engine's server now, in the background, so that the first launch does not
    wait for it to import torch (a notebook calls this in its first cell). Does nothing where the
    warm engine is not used (off Linux, or COURSE_LAUNCHER=torchrun).

    `imports`: more modules for the server to import, which every rank it forks then has already
    (e.g. ``torch.distributed.tensor``); they are kept in ``COURSE_WARM_IMPORTS``, so that the later
    launches of this process find that server. (A module the server cannot import stops it, and the
    launches then run with torchrun, with a warning that says why.)"""
    if isinstance(imports, str) or not all(isinstance(m, str) and m and "," not in m for m in imports):
        raise ValueError(f"warm_up(imports=...) takes a list of module names, got {imports!r}")
    if imports:
        os.environ[WARM_IMPORTS_VAR] = ",".join(imports)
    env = _job_env({})
    key = _import_time(env)
    if _choose_engine(None, 0) != "warm" or key in _Server.unsafe:
        return
    with _Server.lock:
        if any(s.key == key for s in _Server.idle):
            return
    _Server(env).release()


@atexit.register
def _close_servers() -> None:
    while _Server.idle:
        _Server.idle.pop().close()


class _Warm:
    """How the ranks are started: forked from a warm server (``_serve``), each as torchrun would
    start it (same variables; ``TORCHELASTIC_USE_AGENT_STORE=False``: rank 0 hosts the store, on a
    free port). Offers what ``_Torchrun`` offers. No elastic restarts, one node: that is torchrun's."""

    name = "warm"

    def __init__(
        self, script: str, nproc: int, argv: list, restarts: int, cwd: Path, env: dict, logs: Path,
        deadline: float = float("inf"),
    ) -> None:
        assert restarts == 0, "elastic restarts are torchrun's"
        self.nproc, self.logs, self.job_id = nproc, logs, env[JOB_VAR]
        self.rc: int | None = None
        self.codes: dict[int, int] = {}
        self.root: int | None = None
        self.note = ""
        folder = logs / "warm" / "attempt_0"
        self.folder, self.server = folder, _Server.acquire(env, deadline)
        run_id, port = uuid.uuid4().hex, free_port()  # (chosen as late as can be)
        envs = []
        for r in range(nproc):
            (folder / str(r)).mkdir(parents=True)
            envs.append({
                **env, "RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0",
                "ROLE_RANK": str(r), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc),
                "WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc),
                "MASTER_ADDR": "localhost", "MASTER_PORT": str(port),
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
                "TORCHELASTIC_ERROR_FILE": str(folder / str(r) / "error.json"),
                "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            })
        cwd_ = os.path.abspath(cwd)  # (the server's working directory is not the kernel's)
        job = {"script": script, "argv": argv, "cwd": cwd_, "envs": envs, "logs": str(folder)}
        try:
            self.server.send(job)
            started = self.server.read(min(_Server.START_S, deadline - time.monotonic()))
        except BaseException as exc:  # an interrupt too: closing the server ends any rank it forked
            self.server.close()
            if isinstance(exc, OSError | EOFError | ValueError):
                raise OSError(f"the warm launcher failed: {exc}") from exc
            raise
        if started is None and time.monotonic() >= deadline:  # still forking at the job's timeout
            self.server.close(now=True)
            raise _StartTimeout
        if not started or "pids" not in started:
            self.server.close()
            if started and "error" in started:
                _Server.unsafe.add(self.server.key)
            raise OSError(f"the warm launcher failed: {(started or {}).get('error', 'no answer')}")
        self.ranks: list[int] = started["pids"]

    def poll(self) -> int | None:
        return self._answer(0.0)

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking when the job ends."""
        self._answer(seconds)

    def _answer(self, timeout: float) -> int | None:
        if self.rc is None and self.server is not None:
            try:
                msg = self.server.read(timeout)
            except (EOFError, OSError, ValueError):
                self.rc, self.note = 1, tr("The warm launcher's server died during the job.",
                                           "warm 启动器的服务进程在作业运行期间退出了。")
                self.server.close()
                self.server = None
                return self.rc
            if msg is not None:
                self.codes = {int(r): c for r, c in msg["codes"].items()}
                self.root = msg["root"]
                self.rc = 1 if any(self.codes.values()) else 0
                self.server.release()
                self.server = None
        return self.rc

    def attempt_dirs(self) -> dict[int, Path]:
        return {0: self.folder}

    def output(self) -> str:
        lines = [tr(f"rank {r} exited with {_describe_exit(c)}", f"rank {r} 已退出：{_describe_exit(c)}")
                 for r, c in sorted(self.codes.items())]
        return "\n".join([*lines, self.note]).strip()

    def failures(self) -> tuple[dict[int, int], int | None]:
        return {r: c for r, c in self.codes.items() if c}, self.root

    def pids(self) -> set[int]:
        """Live processes of the job: the ranks and every process in their sessions, and any
        process whose environment holds the job's JOB_VAR (one that left the session)."""
        found = _job_processes(self.job_id, self.ranks) | set(self.ranks)
        return {p for p in found if _alive(p)}

    def stop(self, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stop every process of the job (see ``_stop``); the server, told by its ranks' ends,
        answers and goes back to the pool; one that does not answer is closed."""
        _stop(self.pids, hurry=hurry)
        if self.server is not None:
            self._answer(10.0)
        if self.server is not None:  # no answer: not to be trusted with another job
            self.server.close()
            self.server = None


@contextlib.contextmanager
def _one_interrupt() -> Iterator[list[float]]:
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


def _supervise(job: _Torchrun | _Warm, display: _Quiet, deadline: float, t0: float) -> tuple:
    """Watch the job until it exits or `deadline` (time.monotonic()) passes, then stop every process
    of it (the whole job, or what it left running); on an interrupt too, however often it is
    pressed: a second press only skips the grace period. Returns (exit code|None, seconds since
    `t0`, logs)."""
    logs = _Logs(job.nproc)
    with _one_interrupt() as pressed:
        try:
            while (rc := job.poll()) is None and time.monotonic() < deadline:
                display.show(logs, logs.read(job.attempt_dirs()))
                job.wait(max(0.0, min(POLL_S, deadline - time.monotonic())))
            elapsed = time.monotonic() - t0
            job.stop()
        except BaseException as exc:  # KeyboardInterrupt (a kernel interrupt) or an error of ours
            again = len(pressed)  # presses from now on hurry the stop; they cannot abort it
            for _ in range(3):  # (where presses still raise: no handler of ours, see _one_interrupt)
                with contextlib.suppress(KeyboardInterrupt):
                    job.stop(hurry=lambda: len(pressed) > again)
                    break
            if not isinstance(exc, KeyboardInterrupt):
                display.end(logs, None)
                raise
            with contextlib.suppress(Exception):  # what the ranks printed, kept where the logs go
                display.show(logs, logs.read(job.attempt_dirs(), final=True))
                logs.keep(job.logs)
            display.end(logs, "interrupted")
            exc.args = (tr(
                f"the job was interrupted, and every process of it was stopped. What the ranks printed "
                f"is above; logs: {job.logs}",
                f"作业被中断，它的所有进程都已停止。各 rank 打印的内容在上面；日志：{job.logs}"),)
            raise
    display.show(logs, logs.read(job.attempt_dirs(), final=True))
    logs.keep(job.logs)
    display.end(logs, "timeout" if rc is None else "failure" if rc else "ok")
    return rc, elapsed, logs


class _Quiet:
    """How a job is shown: not at all (``show=False``). The other displays override these."""

    def show(self, logs: _Logs, new: list[tuple]) -> None:
        """After every look at the logs: `new` lines as (attempt, rank, stdout, stderr)."""

    def end(self, logs: _Logs, outcome: str | None) -> None:
        """Once the job is over: "ok", "failure", "timeout", or None if it stopped early."""


class _Terminal(_Quiet):
    """The job's command first, then every line as it comes, with a ``[rank N]`` prefix; the ranks'
    stderr to stderr."""

    attempt = 0

    def __init__(self, title: str) -> None:
        print(tr(f"[launcher] {title}", f"[启动器] {title}"), file=sys.stderr, flush=True)

    def show(self, logs: _Logs, new: list[tuple]) -> None:
        for n, r, out, err in new:
            if n > self.attempt:
                self.attempt = n
                print(tr(f"[launcher] restarting the job (attempt {n})", f"[启动器] 正在重启作业（尝试 {n}）"),
                      flush=True)
            _write(sys.stdout, [f"[rank {r}] {line}" for line in out])
            _write(sys.stderr, [f"[rank {r}] {_strip(line)}" for line in err])


class _Notebook(_Quiet):
    """Jupyter: a live widget (shown without text/plain, which nbval skips, and emptied at the end),
    then the output grouped by rank, in rank order (after a failure or a timeout, to stderr)."""

    refresh_s = 0.25  # at most four refreshes a second

    def __init__(self, title: str) -> None:
        self.title, self.t0, self.last = title, time.monotonic(), 0.0
        self.widget = self.display_id = None

    def _html(self, status: str, ranks: list[tuple[_Tail, _Tail]]) -> str:
        rows = ""
        for r, (out, err) in enumerate(ranks):
            last = (out.lines[-3:] + [_strip(x) for x in err.lines[-3:]])[-3:]
            text = html.escape("\n".join(last)) or "&nbsp;"
            rows += f"<tr><td style='vertical-align:top'><b>rank {r}</b></td>"
            rows += f"<td><pre style='margin:0'>{text}</pre></td></tr>"
        title, status = html.escape(self.title), html.escape(status)
        return tr(f"<b>{title}</b>: {status}<table>{rows}</table>", f"<b>{title}</b>：{status}<table>{rows}</table>")

    def show(self, logs: _Logs, new: list[tuple]) -> None:
        if self.display_id is None:  # the first look (inside _supervise, which cleans up)
            self.display_id = uuid.uuid4().hex
            with contextlib.suppress(Exception):  # no ipywidgets or no frontend: no live view
                import ipywidgets
                from IPython.display import display

                widget = ipywidgets.HTML(self._html(tr("starting", "正在启动"), logs.last()))
                bundle = {k: v for k, v in widget._repr_mimebundle_().items() if k != "text/plain"}
                display(bundle, raw=True, display_id=self.display_id)
                self.widget = widget
        if self.widget is None or time.monotonic() - self.last < self.refresh_s:
            return
        self.last = time.monotonic()
        n = max(logs.attempts, default=0)
        s = self.last - self.t0
        status = tr(f"running, {s:.0f} s", f"运行中，{s:.0f} 秒")
        status += tr(f" (attempt {n})", f"（尝试 {n}）") if n else ""
        self.widget.value = self._html(status, logs.last())  # (an unchanged value sends nothing)

    def end(self, logs: _Logs, outcome: str | None) -> None:
        if self.widget is not None:
            from IPython.display import update_display

            with contextlib.suppress(Exception):
                update_display({}, raw=True, display_id=self.display_id)
                self.widget.close()
            self.widget = None
        grouped = []
        for n, ranks in sorted(logs.attempts.items()):
            grouped += [tr(f"--- attempt {n} ---", f"--- 尝试 {n} ---")] if len(logs.attempts) > 1 else []
            grouped += [f"[rank {r}] {x}" for r, (out, _) in enumerate(ranks) for x in out.lines]
        errs = [f"[rank {r}] {_strip(x)}" for r, (_, e) in enumerate(logs.last()) for x in e.lines]
        if outcome == "ok":
            _write(sys.stdout, grouped)
            _write(sys.stderr, errs)
        elif outcome is not None:
            what = {"failure": "失败", "timeout": "超时", "interrupted": "中断"}[outcome]
            outcome_en = "interrupt" if outcome == "interrupted" else outcome
            sys.stderr.write(tr(f"[launcher] what the ranks printed before the {outcome_en}:\n",
                                f"[启动器] {what}之前各 rank 打印的内容：\n"))
            _write(sys.stderr, grouped + (errs if outcome != "failure" else []))


def _failures(launcher_text: str) -> tuple[dict[int, int], int | None]:
    """Parse torchrun's failure summary: ({rank: exit code}, root-cause rank)."""
    pattern = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
    head, sep, tail = launcher_text.rpartition("Root Cause")
    failures = {int(m[1]): int(m[2]) for m in pattern.finditer(head if sep else launcher_text)}
    root = None
    if sep and (m := pattern.search(tail)):
        root, failures[int(m[1])] = int(m[1]), int(m[2])
    return failures, root


def _error_tail(lines: Sequence[str], n: int = TAIL_LINES) -> list[str]:
    """The last `n` non-blank lines of a rank's stderr, from its last traceback on."""
    lines = [x for x in map(_strip, lines) if x.strip()]
    starts = [i for i, x in enumerate(lines) if x.startswith("Traceback (most recent call last)")]
    return lines[starts[-1] if starts else 0 :][-n:]


def _blame(failures: dict[int, int], root: int | None, stderr: list[list[str]]) -> int | None:
    """The rank to name: one that failed by itself, the lowest of several that failed alike; among
    them, one that said why (wrote an error) rather than one that stopped silently, whichever exited
    first. Every rank stopping because rank 0 refused something is the usual case: rank 0 says why
    and may even be stopped (SIGTERM) by the launcher after saying it, once a silent peer has exited."""

    def last_line(r: int) -> str:
        return ([""] + _error_tail(stderr[r] if r < len(stderr) else []))[-1]

    if not failures:
        return min((r for r, e in enumerate(stderr) if "Traceback" in "\n".join(e)), default=None)
    genuine = [r for r in sorted(failures) if failures[r] != -signal.SIGTERM]
    genuine = [r for r in genuine if not _COLLATERAL.search(last_line(r))]
    said_why = [r for r in genuine if _SAYS_WHY.match(last_line(r))]
    if genuine and not any(map(last_line, genuine)):  # all silent: one stopped after saying why?
        stopped = [r for r in sorted(failures) if r not in genuine and _SAYS_WHY.match(last_line(r))]
        stopped = [r for r in stopped if not _COLLATERAL.search(last_line(r))]
        if stopped:
            return stopped[0]
    genuine = said_why or [r for r in genuine if last_line(r)] or genuine
    if not genuine:
        return root if root is not None else min(failures)
    if len({last_line(r) for r in genuine}) == 1 or root not in genuine:
        return genuine[0]
    return root


def _failure(job: _Torchrun | _Warm, rc: int, script: str, nproc: int, **info: Any) -> LaunchError:
    """The error of a failed job: the rank to blame with its traceback, or the launcher's output."""
    failures, root = job.failures()
    rank = _blame(failures, root, [e.splitlines() for e in info["stderr"]])
    where = info["log_dir"]
    if rank is None:
        code, error = rc, ""
        tail = [x for x in job.output().splitlines() if x.strip()][-TAIL_LINES:]
        exit_ = _describe_exit(rc)
        head = tr(f"the launcher failed ({exit_}) running {script} before any rank "
                  "reported an error. Its last lines:",
                  f"启动器运行 {script} 时失败（{exit_}），当时还没有任何 rank 报告错误。它输出的最后几行：")
        foot = tr(f"Logs: {where}", f"日志：{where}")
    else:
        code, tail = failures.get(rank), _error_tail(info["stderr"][rank].splitlines())
        exit_ = _describe_exit(code)
        head = tr(f"rank {rank} of {nproc} failed with {exit_} running {script}\n"
                  "Last lines of its error output:",
                  f"rank {rank}（共 {nproc} 个 rank）运行 {script} 时失败，{exit_}\n其错误输出的最后几行：")
        first = next((r for r in sorted(failures) if failures[r] not in (0, -signal.SIGTERM)), None)
        if code == -signal.SIGTERM and first is not None:  # it said why, then the launcher stopped it
            code = failures[first]  # the job's own exit code: the one that ended it
            exit_ = _describe_exit(code)
            head = tr(f"rank {rank} of {nproc} failed running {script} (rank {first} exited first, with {exit_}; "
                      f"rank {rank} was stopped as it ended)\nLast lines of its error output:",
                      f"rank {rank}（共 {nproc} 个 rank）运行 {script} 时失败（rank {first} 先退出，{exit_}；"
                      f"rank {rank} 在结束时被停止）\n其错误输出的最后几行：")
        log = Path(where, f"rank{rank}.stderr.log")
        foot = tr(f"Its full log: {log} (every rank's logs are in {where})",
                  f"它的完整日志：{log}（所有 rank 的日志都在 {where} 中）")
        error = (tail or [""])[-1]
    nothing = tr("    (it wrote nothing to stderr)", "    （它没有向 stderr 写入任何内容）")
    shown = "\n".join("    " + x for x in tail) if tail else nothing
    return LaunchError(f"{head}\n{shown}\n{foot}", rank=rank, exit_code=code, error=error, **info)


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
    notebook) on `nproc` local processes as ``torchrun --standalone`` would, each rank with one
    thread and its own log files. `engine`: "torchrun" runs ``python -m torch.distributed.run``;
    "warm" forks the ranks from a server that imported torch once (a fraction of a second instead
    of seconds; Linux, no restarts); None: ``COURSE_LAUNCHER`` if set, else warm where it can.
    `backend` None: ``COURSE_BACKEND`` if set, else nccl with a GPU per rank, else gloo. `timeout`: seconds (None: no limit). `env`: more variables for the
    ranks. `show`: in Jupyter a live widget, then the output grouped by rank; in a terminal, lines
    streamed with a ``[rank N]`` prefix. `max_nproc`: the most processes to start (None: what this
    machine can hold, see :func:`machine_capacity`); give a larger number to go beyond on purpose.
    Raises ``LaunchError`` naming a failing rank with its traceback, ``LaunchTimeout`` past `timeout`
    (counted from the call: starting the ranks too), and, before starting anything, ``ValueError``
    / ``FileNotFoundError`` / ``RuntimeError`` (nccl without a GPU per rank) for bad arguments."""
    base, script_str = Path(cwd if cwd is not None else Path.cwd()), os.fspath(script)
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a whole number of processes, at least 1; got {nproc!r}.")
    if not (base / script_str).is_file():  # (an absolute script_str stays itself)
        raise FileNotFoundError(
            f"script not found: {script_str} (looked for {(base / script_str).resolve()}). Paths "
            "are relative to the current directory, which is notebooks/ in a course notebook: "
            "e.g. 'scripts/hello_dist.py'."
        )
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None; got {timeout!r}.")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more; got {max_restarts!r}.")
    _check_capacity(nproc, max_nproc)
    engine = _choose_engine(engine, max_restarts)
    from .dist import check_backend, choose_backend  # imports torch: only when launching

    extra = {k: str(v) for k, v in (env or {}).items()}
    from_env = not backend and not extra.get("COURSE_BACKEND") and os.environ.get("COURSE_BACKEND")
    backend = backend or extra.get("COURSE_BACKEND") or os.environ.get("COURSE_BACKEND")
    backend = str(backend or choose_backend(nproc, warn=False))
    check_backend(backend, nproc, setting="COURSE_BACKEND" if from_env else None)

    log_dir = Path(tempfile.mkdtemp(dir="/tmp" if os.path.isdir("/tmp") else None))  # (sanitized)
    run_env = {**_job_env(extra), "COURSE_BACKEND": backend, JOB_VAR: uuid.uuid4().hex}

    argv = [str(a) for a in args]
    command = _command(script_str, nproc, argv, max_restarts)
    t0 = time.monotonic()  # the timeout counts from here: starting the ranks is part of the job
    deadline = t0 + timeout if timeout is not None else float("inf")
    job: _Torchrun | _Warm | None = None
    try:
        try:
            job = (_Warm if engine == "warm" else _Torchrun)(
                script_str, nproc, argv, max_restarts, base, run_env, log_dir, deadline
            )
        except OSError as exc:  # the warm server could not start: the real torchrun does the job
            if engine != "warm":
                raise
            warnings.warn(f"{exc}; running the job with torchrun instead", RuntimeWarning, stacklevel=2)
            shutil.rmtree(log_dir / "warm", ignore_errors=True)
            job = _Torchrun(script_str, nproc, argv, max_restarts, base, run_env, log_dir, deadline)
    except _StartTimeout:
        rc, elapsed, out, err = None, time.monotonic() - t0, [""] * nproc, [""] * nproc
    else:
        try:  # (an interrupt before the supervision starts stops the job too)
            title = _title(command, backend, job.name)
            display = (_Notebook(title) if _in_notebook() else _Terminal(title)) if show else _Quiet()
        except BaseException:
            job.stop()
            raise
        rc, elapsed, logs = _supervise(job, display, deadline, t0)
        out, err = [o.text() for o, _ in logs.last()], [e.text() for _, e in logs.last()]
    info = {"log_dir": str(log_dir), "logs": out, "stderr": err, "elapsed": elapsed}
    if rc is None:
        raise LaunchTimeout(tr(
            f"{script_str} ({nproc} processes) did not finish within its timeout of {timeout:g} s, "
            "so every process of the job was stopped.\n"
            "A rank that waits forever (in all_reduce, barrier, ...) usually means that another "
            "rank never made the same call.\n"
            f"Logs of each rank R: {log_dir}/rankR.stdout.log and rankR.stderr.log",
            f"{script_str}（{nproc} 个进程）超过了 {timeout:g} 秒的时限仍未结束，作业的所有进程已被停止。\n"
            "某个 rank 一直卡在等待中（all_reduce、barrier 等），通常是因为另一个 rank 始终没有执行同一个调用。\n"
            f"每个 rank R 的日志：{log_dir}/rankR.stdout.log 和 rankR.stderr.log",
        ), **info)
    if rc != 0:
        assert job is not None
        raise _failure(job, rc, script_str, nproc, **info)
    attempts = [[o.text() for o, _ in ranks] for _, ranks in sorted(logs.attempts.items())]
    restarts = max(logs.attempts, default=0)
    return LaunchResult(
        script_str, nproc, backend, 0, elapsed, out, err, str(log_dir), restarts, attempts,
        engine=job.name, command=command,
    )


ENGINES = ("warm", "torchrun")

# What one rank costs, measured on Linux x86-64 with torch 2.14 (a gloo rank after one all_reduce):
# a fresh interpreter that imported torch (a torchrun worker) has 512 MB resident, 280 MB of it its
# own (PSS 301 MB); a rank forked from the warm server shares most of its server's pages at first
# (7 MB of its own, PSS 100 MB) and owns more as it works. Counted at the fresh interpreter's cost.
RANK_MEMORY_MB = 300
RANKS_PER_CORE = 4  # beyond this many ranks per core they mostly wait for each other (at least 8 allowed)


def _memory_available() -> int | None:
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


def _cores() -> int:
    from .device import cpu_cores  # (imports torch: only when launching)

    return cpu_cores()


def machine_capacity() -> tuple[int, str]:
    """How many ranks this machine can hold at once, and why in words: RANK_MEMORY_MB each within the
    memory available, and RANKS_PER_CORE per CPU core (at least 8)."""
    cores = _cores()
    limit = max(8, RANKS_PER_CORE * cores)
    why = tr(f"with {cores} CPU core(s), more than {limit} ranks mostly wait for each other",
             f"只有 {cores} 个 CPU 核心，超过 {limit} 个 rank 时它们大多在互相等待")
    free = _memory_available()
    if free is not None:
        fit = max(1, int(0.8 * free / (RANK_MEMORY_MB * 2**20)))
        limit = min(limit, fit)
        why = tr(f"each rank imports torch (about {RANK_MEMORY_MB} MB of memory) and {free / 2**30:.1f} GB "
                 f"is available, room for {fit}; and {why}",
                 f"每个 rank 都要导入 torch（约 {RANK_MEMORY_MB} MB 内存），当前可用 {free / 2**30:.1f} GB，"
                 f"最多容纳 {fit} 个；而且{why}")
    return limit, why


def _check_capacity(nproc: int, max_nproc: int | None, name: str = "nproc") -> None:
    """Refuse, before anything starts, more processes than the machine can hold, unless `max_nproc`
    allows them explicitly (ValueError saying what to do). `name`: the argument's name."""
    if max_nproc is not None and (not isinstance(max_nproc, int) or isinstance(max_nproc, bool) or max_nproc < 1):
        raise ValueError(f"max_{name} must be a whole number of processes, at least 1, or None; got {max_nproc!r}.")
    if max_nproc is not None:
        if nproc > max_nproc:
            raise ValueError(f"{name}={nproc} is more than max_{name}={max_nproc}.")
        return
    limit, why = machine_capacity()
    if nproc > limit:
        cli = f" (from a terminal: --max-nproc {nproc})" if name == "nproc" else ""
        cli_zh = f"（在终端中：--max-nproc {nproc}）" if name == "nproc" else ""
        raise ValueError(tr(
            f"{name}={nproc} is more processes than this machine can hold: {why}. Use fewer processes "
            f"(at most {limit} here); to start {nproc} all the same, pass max_{name}={nproc}{cli}.",
            f"{name}={nproc} 超出了这台机器能容纳的进程数：{why}。请减少进程数（这里最多 {limit} 个）；"
            f"如果确实要启动 {nproc} 个，请传入 max_{name}={nproc}{cli_zh}。"))


def _choose_engine(engine: str | None, max_restarts: int) -> str:
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


def _title(command: str, backend: str, engine: str) -> str:
    """The headline of a job's display: its terminal command, the backend and the engine."""
    return tr(f"{command}   [{backend}, {engine} engine]", f"{command}   [{backend}，{engine} 引擎]")


def _command(script: str, nproc: int, argv: list[str], max_restarts: int) -> str:
    """The job as a learner would type it in a terminal."""
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    opts = ["torchrun", "--standalone", f"--nproc-per-node={nproc}", *restarts]
    return shlex.join([*opts, script, *argv])


def main(argv: list[str]) -> int:
    """``python -m course_utils launch SCRIPT --nproc 2 [--backend gloo] [--timeout S] -- ARGS``."""
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m course_utils launch",
        description="Run a distributed script on N local processes (torchrun with safe defaults). "
        "Arguments after -- go to the script.",
    )
    add = parser.add_argument
    add("script", help="the script to run, relative to the current directory")
    add("--nproc", type=int, default=2, help="number of processes (default 2)")
    add("--backend", choices=["gloo", "nccl"], help="default: nccl with a GPU per rank, else gloo")
    add("--timeout", type=float, default=300.0, help="seconds (default 300)")
    add("--quiet", action="store_true", help="do not stream the ranks' output")
    add("--engine", choices=ENGINES, help="default: warm on Linux (ranks forked from a server "
        "that imported torch once), else torchrun; $COURSE_LAUNCHER sets it too")
    add("--max-nproc", type=int, help="allow up to this many processes (default: what this machine "
        "can hold, by its memory and cores)")
    o = parser.parse_args(argv[:cut])
    try:
        kw = {"nproc": o.nproc, "timeout": o.timeout, "backend": o.backend, "show": not o.quiet}
        kw["engine"], kw["max_nproc"] = o.engine, o.max_nproc
        result = torchrun(o.script, args=argv[cut + 1 :], **kw)
    except LaunchError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        code = 124 if isinstance(exc, LaunchTimeout) else exc.exit_code
        return code if code is not None and 0 < code < 256 else 1
    except KeyboardInterrupt as exc:  # Ctrl-C: the job is stopped; no traceback of the launcher
        print(tr(f"[launcher] {str(exc) or 'interrupted'}", f"[启动器] {str(exc) or '已中断'}"), file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = f"{o.nproc} processes finished in {result.elapsed:.1f} s; logs in {result.log_dir}"
    print(f"[launcher] {done}", file=sys.stderr)
    return 0


def free_port() -> int:
    """A TCP port that is free right now on this machine (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")
_MODULE_REPR = re.compile(r"<module '([\w.]+)' \(.*?\)>")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WORKER_DIED = re.compile(r"DataLoader worker .*?exited unexpectedly")
_PIDS = re.compile(r" \(pid(?:\(s\))?[^)]*\)")  # " (pid 42)", " (pid(s) 42, 43)"


def error_lines(text: str) -> list[str]:
    """The lines of `text` that name an exception (``ValueError: ...``), alike on every Python:
    without colours (3.13), a module's repr shortened to ``<module 'name'>`` (varies from 3.12)."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines()]
    return [_MODULE_REPR.sub(r"<module '\1'>", ln) for ln in lines if _ERROR_LINE.match(ln)]


def worker_failure(err: BaseException) -> str:
    """``Type: message``; a DataLoader's report that a worker died reads the same in every run:
    ``RuntimeError: DataLoader worker exited unexpectedly``, without the pids and exit details."""
    found = _WORKER_DIED.search(str(err))
    return f"{type(err).__name__}: {_PIDS.sub('', found.group(0)) if found else err}"


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
    can hold are refused unless `max_nprocs` allows them (see :func:`machine_capacity`). Returns how
    many it started."""
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
    _check_capacity(nprocs, max_nprocs, "nprocs")
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
            f"{len(late)} of {nprocs} spawned processes did not finish within {timeout:g} s and "
            "were stopped. A process waiting forever (in init_process_group, a collective, ...) "
            "usually means that another one never joined.",
            f"启动的 {nprocs} 个进程中有 {len(late)} 个没有在 {timeout:g} 秒内结束，已被终止。"
            "一个进程永远等下去（在 init_process_group、某个集合通信……中），通常说明另一个进程始终没有加入。",
        )
        raise SpawnFailed(msg, None, err.text)
    if codes:
        code, causes = max(set(codes), key=codes.count), error_lines(err.text)
        name = getattr(fn, "__name__", fn)
        msg = tr(f"{len(codes)} of {nprocs} child processes exited with code {code} before finishing "
                 f"{name}. The children's error: ",
                 f"{nprocs} 个子进程中有 {len(codes)} 个在 {name} 结束之前退出，退出码 {code}。子进程的报错：")
        raise SpawnFailed(msg + (causes[-1] if causes else "(no error message)"), code, err.text)
    return len(ctx.processes)
