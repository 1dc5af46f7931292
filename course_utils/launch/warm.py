"""The warm engine: the ranks of a job forked from a server that imported torch once (``server.py``),
a fraction of a second a launch instead of seconds. This is the client side: the pool of servers, one
per set of start-up variables, and the :class:`Warm` engine (the contract is ``engine.Engine``).

Each rank is started as torchrun would start it: the same variables, the job's rendezvous store
hosted outside the ranks (``TORCHELASTIC_USE_AGENT_STORE=True``) and listening before they start.
What the warm engine skips is torchrun's agent: elastic restarts, health checks, several machines.
One difference a script could see: every rank has its server's string-hash seed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from ..i18n import tr
from . import processes
from .diagnosis import describe_exit
from .engine import JOB_VAR, Exits, Job, StartTimeout
from .server import THREAD_COUNTS, WARM_IMPORTS_VAR

# Variables that the interpreter, torch or its libraries may read once, at start-up or import
# (TORCH_DISTRIBUTED_DEBUG and TORCH_LOGS are read by ``import torch``; PYTHONHASHSEED by Python):
# a forked rank keeps what its server read, so a job runs on a server started with the same values.
IMPORT_TIME = (
    "TORCH", "PYTORCH", "PYTHON", "CUDA", "CUBLAS", "CUDNN", "NCCL", "GLOO", "OMP_", "MKL",
    "KMP_", "OPENBLAS", "LD_", "HIP", "ROCM", WARM_IMPORTS_VAR,
)
# Thread counts: a server imports torch with one thread (more would start a pool, and a process
# with threads cannot be forked safely); each rank then takes its own (server.thread_count).


def import_time(env: Mapping[str, str]) -> tuple:
    """The part of `env` that a server reads at start-up (see IMPORT_TIME): the pool's key."""
    return tuple(sorted(
        (k, v) for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in THREAD_COUNTS))


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a server for a job of environment `env` starts with: this process's environment with
    the job's start-up variables, and one thread (nothing of the job's other variables)."""
    own = {k: v for k, v in os.environ.items() if not k.startswith(IMPORT_TIME) and k != JOB_VAR}
    one = dict.fromkeys((k for k in THREAD_COUNTS if k in env), "1")
    return {**own, **dict(import_time(env)), **one}


class Server:
    """A warm server process and its pipes. Idle servers wait in a pool for the next job whose
    start-up variables are the same; one job at a time each (two jobs at once: two servers).
    Nothing starts before :meth:`start`."""

    idle: list[Server] = []
    unsafe: set[tuple] = set()  # start-up variables whose server had threads (see server._run_job)
    lock = threading.Lock()
    START_S = 180.0  # seconds to import torch on a slow, loaded machine
    KEEP = 3  # idle servers kept at most (each holds an imported torch: a few hundred MB)

    def __init__(self, env: Mapping[str, str]) -> None:
        self.key, self.env = import_time(env), server_env(env)
        self.proc: subprocess.Popen | None = None
        self.buf, self.thread, self.ready = b"", threading.get_ident(), False
        self.jobs = 0  # jobs it ran: one of the pool's has run one at least

    def start(self) -> Server:
        cmd = [sys.executable, "-c", "from course_utils.launch.server import serve; serve()"]
        self.errors = tempfile.TemporaryFile()
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(processes.with_parent_death_signal(cmd), stdin=pipe, stdout=pipe,
                                     stderr=self.errors, env=self.env, start_new_session=True)
        return self

    def wait_ready(self, deadline: float = float("inf")) -> None:
        """Wait until the server has imported torch; OSError (it is closed) if it does not,
        StartTimeout (it is killed) if `deadline` (time.monotonic()) comes first."""
        if self.ready:
            return
        try:
            msg = self.read(min(self.START_S, deadline - time.monotonic()))
        except EOFError:
            msg = None
        if msg is None and time.monotonic() >= deadline:
            self.close(now=True)
            raise StartTimeout
        if not msg or "ready" not in msg:
            self.close()
            self.errors.seek(0)
            why = self.errors.read().decode(errors="replace").strip().splitlines()[-1:]
            raise OSError(f"the warm launcher did not start{': ' + why[0] if why else ''}")
        self.ready = True

    @classmethod
    def acquire(cls, env: Mapping[str, str], deadline: float = float("inf")) -> Server:
        """An idle server (ready) started with the same start-up variables as `env`, or a new one
        (StartTimeout if it is not ready by `deadline`)."""
        key = import_time(env)
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
                server = cls(env).start()
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
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout: float) -> dict | None:
        """The server's next message, or None if none comes within `timeout` seconds; EOFError if
        the server is gone."""
        end, fd = time.monotonic() + timeout, self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
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
        if self.proc is None:
            return
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


def idle_servers() -> list[int]:
    """The process ids of the warm servers this process keeps for its next launches."""
    with Server.lock:
        return [s.proc.pid for s in Server.idle]


def warm_up(env: Mapping[str, str]) -> None:
    """Start a server for jobs of environment `env` in the background (torchrun's ``warm_up``)."""
    key = import_time(env)
    if key in Server.unsafe:
        return
    with Server.lock:
        if any(s.key == key for s in Server.idle):
            return
    Server(env).start().release()


@atexit.register
def close_servers() -> None:
    """End every idle warm server of this process (done at exit)."""
    while Server.idle:
        Server.idle.pop().close()


def rank_env(job: Job, rank: int, run_id: str, folder: Path) -> dict[str, str]:
    """Rank `rank`'s variables, as torchrun's agent sets them (``MASTER_PORT``: the server's store)."""
    n = str(job.nproc)
    return {
        **job.env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "ROLE_RANK": str(rank), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": n,
        "WORLD_SIZE": n, "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": n,
        "MASTER_ADDR": "localhost", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": str(folder / str(rank) / "error.json"),
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": job.env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


class Warm:
    """The warm engine (see ``engine.Engine``). No elastic restarts, one node: that is torchrun's."""

    name = "warm"

    def __init__(self, job: Job) -> None:
        if job.restarts:
            raise ValueError("elastic restarts are torchrun's")
        self.job, self.folder = job, job.logs / "warm" / "attempt_0"
        self.server: Server | None = None
        self.ranks: list[int] = []
        self.since: int | None = None
        self.rc: int | None = None
        self.codes: dict[int, int] = {}
        self.root: int | None = None
        self.note = ""

    def start(self, deadline: float) -> None:
        run_id = uuid.uuid4().hex
        for r in range(self.job.nproc):
            (self.folder / str(r)).mkdir(parents=True)
        envs = [rank_env(self.job, r, run_id, self.folder) for r in range(self.job.nproc)]
        cwd = os.path.abspath(self.job.cwd)  # (the server's working directory is not the kernel's)
        msg = {"script": self.job.script, "argv": list(self.job.argv), "cwd": cwd, "envs": envs,
               "logs": str(self.folder)}
        started = self._submit(msg, deadline)
        if started is None and time.monotonic() >= deadline:  # still forking at the job's timeout
            self._drop_server(now=True)
            raise StartTimeout
        if not started or "pids" not in started:
            if started and "threads" in started.get("error", ""):
                Server.unsafe.add(self.server.key)
            self._drop_server()
            raise OSError(f"the warm launcher failed: {(started or {}).get('error', 'no answer')}")
        self.ranks = started["pids"]
        self.since = min((t for t in map(processes.started, self.ranks) if t is not None),
                         default=None)  # the job's processes start from then on

    def _submit(self, msg: dict, deadline: float) -> dict | None:
        """Send the job to a server; its first answer (None: none by `deadline`). A server of the
        pool found dead (killed since its last job) is replaced once."""
        for attempt in (1, 2):
            self.server = Server.acquire(self.job.env, deadline)
            reused = self.server.jobs > 0
            try:
                self.server.send(msg)
                return self.server.read(min(Server.START_S, deadline - time.monotonic()))
            except BaseException as exc:  # an interrupt too: closing the server ends its ranks
                self._drop_server()
                if not isinstance(exc, OSError | EOFError | ValueError):
                    raise
                if attempt == 2 or not reused:
                    raise OSError(f"the warm launcher failed: {exc}") from exc
        return None  # (not reached)

    def poll(self) -> int | None:
        return self._answer(0.0)

    def wait(self, seconds: float) -> None:
        self._answer(seconds)

    def _answer(self, timeout: float) -> int | None:
        if self.rc is None and self.server is not None:
            try:
                msg = self.server.read(timeout)
            except (EOFError, OSError, ValueError):
                self.rc, self.note = 1, tr("The warm launcher's server died during the job.",
                                           "warm 启动器的服务进程在作业运行期间退出了。")
                self._drop_server()
                return self.rc
            if msg is not None:
                self.codes = {int(r): c for r, c in msg["codes"].items()}
                self.root = msg["root"]
                self.rc = 1 if any(self.codes.values()) else 0
                self.server.jobs += 1
                self.server.release()
                self.server = None
        return self.rc

    def _drop_server(self, now: bool = False) -> None:
        if self.server is not None:
            self.server.close(now=now)
            self.server = None

    def attempt_dirs(self) -> dict[int, Path]:
        return {0: self.folder}

    def output(self) -> str:
        lines = [tr("rank {r} exited with {describe_exit}", "rank {r} 已退出：{describe_exit}",
                    r=r, describe_exit=describe_exit(c))
                 for r, c in sorted(self.codes.items())]
        return "\n".join([*lines, self.note]).strip()

    def failures(self) -> Exits:
        files = {r: self.folder / str(r) / "error.json" for r in range(self.job.nproc)}
        return Exits({r: c for r, c in self.codes.items() if c}, self.root, files)

    def pids(self) -> set[int]:
        """Live processes of the job: the ranks and every process in their sessions, and any
        process whose environment holds the job's JOB_VAR (one that left the session)."""
        marker = f"{JOB_VAR}={self.job.job_id}"
        found = processes.find(marker, self.ranks, self.since) | set(self.ranks)
        return {p for p in found if processes.alive(p)}

    def stop(self, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stop every process of the job; the server, told by its ranks' ends, answers and goes back
        to the pool; one that does not answer is closed."""
        processes.stop(self.pids, hurry=hurry)
        if self.server is not None:
            self._answer(10.0)
        self._drop_server()  # no answer: not to be trusted with another job
