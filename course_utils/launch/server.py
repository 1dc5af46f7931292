"""The warm server: the process that imports torch once and forks the ranks of each job (its client
is ``warm.py``). Everything here runs in the server or in a child it forked: a rank, or the job's
rendezvous store.

The server never runs torch work itself, so it has one thread and forking it is safe (forking a
kernel that computed is not). For each job it forks a store process first, which listens on a port
before any rank exists, as torchrun's agent does (so no rank 0 exiting early takes the store away, and
no other program can take the port between choosing and binding it); then one child per rank, which
becomes ``python -u SCRIPT ARGS`` as torchrun would start it and ends by :func:`shut_down`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from . import processes

IMPORTS = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data")
# More modules for the server to import (comma-separated), set by ``warm_up(imports=...)``: a chapter
# whose scripts import heavy parts of torch (DTensor, pipelining: seconds each) pays for them once, not
# per rank (chapter 07's CHAPTER_IMPORTS).
WARM_IMPORTS_VAR = "COURSE_WARM_IMPORTS"
STORE_START_S = 60.0  # seconds for the store process to listen, on a loaded machine
INTERRUPTED = -2  # a rank's status when it ended by an uncaught KeyboardInterrupt (CPython: SIGINT)
THREAD_COUNTS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_THREADS_SEEN: dict[tuple, int | None] = {}  # thread settings -> torch's threads (thread_count)


# --- a rank: becoming the script, running it, and leaving as CPython would ---------------------


def run_rank(job: dict, rank: int, reply_fd: int, server: int) -> NoReturn:
    """In a forked child of the server: become rank `rank` of `job` (own session, environment,
    working directory, ``__main__``, log files), run the script, and shut down. Never returns."""
    try:
        main, code = _become_rank(job, rank, reply_fd, server)
    except BaseException:  # the rank could not start: say why in its log
        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(1)
    shut_down(_run_script(code, main))


def _become_rank(job: dict, rank: int, reply_fd: int, server: int) -> tuple[Any, Any]:
    os.setsid()  # a process group of its own, as torchrun's workers: stopped as a whole
    processes.set_parent_death_signal(signal.SIGKILL)  # the server gone (killed): its ranks go too
    if os.getppid() != server:
        os._exit(1)
    _default_signals()
    os.close(reply_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        log = os.open(Path(job["logs"], str(rank), name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, fd)
        os.close(log)
    # The server's own streams: unbuffered (PYTHONUNBUFFERED), in the job's encoding.
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    os.chdir(job["cwd"])
    env = job["envs"][rank]
    os.environ.clear()
    os.environ.update(env)
    _set_threads(job.get("threads"))
    return _main_module(job["script"], job["argv"], env)


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # the server blocked them around fork


def thread_count(env: dict) -> int | None:
    """The threads torch uses in a fresh interpreter started with `env` (MKL caps
    ``OMP_NUM_THREADS`` at the physical cores), or None where that is this server's own one:
    asked of a fresh interpreter once per setting (the server imported torch with one thread, so
    that it has no thread pool to fork; see ``warm.server_env``)."""
    if all(env.get(k, "1") == "1" for k in THREAD_COUNTS):
        return None
    key = tuple(sorted((k, v) for k, v in env.items() if k in THREAD_COUNTS or k.startswith("MKL_")))
    if key not in _THREADS_SEEN:
        probe = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=300)
            _THREADS_SEEN[key] = int(done.stdout) if done.stdout.strip().isdigit() else None
    return _THREADS_SEEN.get(key)


def _set_threads(n: int | None) -> None:
    if n:
        import torch

        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def _main_module(script: str, argv: list, env: dict) -> tuple[Any, Any]:
    """``__main__`` for `script`, as ``python script`` makes it, and its compiled code."""
    import builtins
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    sys.argv = [script, *argv]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[0:1] = [os.path.dirname(os.path.realpath(path)), *extra]
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__, main.__cached__ = path, builtins, None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    with open(path, "rb") as fh:
        return main, compile(fh.read(), path, "exec", dont_inherit=True)


def _run_script(code: Any, main: Any) -> int:
    """Run the script; its exit status by CPython's rules: a SystemExit's code (None: 0, a number:
    itself, anything else: printed on stderr, then 1), 1 after an uncaught exception (its traceback
    printed), INTERRUPTED after an uncaught KeyboardInterrupt."""
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        return exit_status(exc)
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # from the script on
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def exit_status(exc: SystemExit) -> int:
    """The exit status CPython gives an uncaught SystemExit (it prints a code that is no number)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code if -(2**31) <= code < 2**31 else -1
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"{code}\n")
    return 1


def shut_down(status: int) -> NoReturn:
    """End the process as CPython's own shutdown would, keeping what a script can see: non-daemon
    threads joined, atexit handlers run, every file the rank opened flushed and closed, the standard
    streams flushed (an error there: status 120), the exit status; and an uncaught KeyboardInterrupt
    ends by SIGINT. What it skips is the teardown of every module and object, which touches the pages
    the rank shares with its server (copy-on-write copies them all) and takes about a second after
    ``import torch``; no script can see it. Never returns."""
    for step in (threading._shutdown, atexit._run_exitfuncs, close_files):  # CPython's order
        with contextlib.suppress(BaseException):
            step()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BaseException:
            status = 120 if stream is sys.stdout and status == 0 else status
    if status == INTERRUPTED:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + signal.SIGINT  # (what a shell reports, should the signal not end it)
    os._exit(status & 0xFF)


def close_files() -> None:
    """Close the files this process opened since its server froze its objects (``gc.freeze()``
    before every fork: ``gc.get_objects()`` then lists only the rank's own), outermost first: text
    files, then buffered ones, then raw ones, each flushing into the next. Types are read with
    ``type()``: ``isinstance`` may run an object's ``__class__`` property."""
    import _io

    objects = gc.get_objects()
    tempfile = sys.modules.get("tempfile")
    kinds: list[type] = [getattr(tempfile, "_TemporaryFileWrapper", None)] if tempfile else []
    kinds += [_io._TextIOBase, _io._BufferedIOBase, _io._RawIOBase, _io._IOBase]
    for kind in filter(None, kinds):
        for obj in objects:
            if issubclass(type(obj), kind):
                with contextlib.suppress(BaseException):
                    obj.close()


# --- the store of a job: listening before any rank starts -------------------------------------


def listening_socket() -> socket.socket:
    """A TCP socket already listening, on a port the system picked as it bound it, on every
    interface (as torch's store binds its own)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))
    sock.listen(512)
    return sock


def start_store(sock: socket.socket, reply_fd: int) -> tuple[int, int]:
    """Fork the job's rendezvous store, torch's TCPStore serving `sock` (which listens already, so
    ranks may connect at once: they wait in its backlog). Returns (its pid, the fd on which it says
    "ready" or why not). The ranks connect to it as clients, as they do to torchrun's agent
    (``TORCHELASTIC_USE_AGENT_STORE=True``); it lives until the job ends, whichever rank ends first."""
    read, write = os.pipe()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.close(reply_fd)  # (the client sees the end of its replies when the server ends)
        _serve_store(sock, write, server)
    os.close(write)
    return pid, read


def _serve_store(sock: socket.socket, reply: int, server: int) -> NoReturn:
    try:
        os.setsid()
        processes.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != server:
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        from torch.distributed import TCPStore

        port = sock.getsockname()[1]
        store = TCPStore("localhost", port, is_master=True, wait_for_workers=False,  # noqa: F841
                         multi_tenant=True, master_listen_fd=sock.fileno())
        os.write(reply, b"ready\n")
        os.close(reply)
        while True:
            signal.pause()  # until the server stops it at the end of the job
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(reply, f"{type(exc).__name__}: {exc}\n".encode())
        os._exit(1)


def stop_store(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _read_line(fd: int, timeout: float) -> str:
    end, data = time.monotonic() + timeout, b""
    while b"\n" not in data and (left := end - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


# --- the server's loop: one job at a time --------------------------------------------------------


class _Client:
    """The server's side of its pipes: jobs in on stdin (one JSON line each), replies out."""

    def __init__(self, reply_fd: int) -> None:
        self.reply_fd, self.buf = reply_fd, b""

    def send(self, **msg: object) -> None:
        os.write(self.reply_fd, (json.dumps(msg) + "\n").encode())

    def next_job(self) -> dict:
        while b"\n" not in self.buf:
            self._read()
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def watch(self, seconds: float) -> None:
        """Wait up to `seconds` for input (a client sends its next job only after this one's
        answer, so input now can only be its end)."""
        if select.select([0], [], [], seconds)[0]:
            self._read()

    def _read(self) -> None:
        data = os.read(0, 1 << 16)
        if not data:
            raise EOFError
        self.buf += data


def serve() -> None:
    """The server's main: import torch, say ready, then run each job the client sends (its reply:
    ``{"pids": [...]}`` once the ranks are forked, then ``{"codes": {rank: exit code}, "root":
    first failing rank}``). Its client gone (end of input, or SIGTERM from its parent's death): it
    kills every process of the running job and exits."""
    import importlib

    extra = [m.strip() for m in os.environ.get(WARM_IMPORTS_VAR, "").split(",") if m.strip()]
    for name in (*IMPORTS, *extra):
        importlib.import_module(name)
    client = _Client(os.dup(1))
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing but replies on the reply pipe
    os.close(null)
    running: list[int] = []  # the running job's processes: ranks, then its store

    def bye(*_: object) -> NoReturn:
        processes.signal_all(running, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt stops a job via its client
    client.send(ready=os.getpid())
    try:
        while True:
            _run_job(client.next_job(), client, running)
    except EOFError:
        bye()


def _run_job(job: dict, client: _Client, running: list[int]) -> None:
    if len(processes.threads()) > 1:  # e.g. OpenBLAS's pool, started by import torch
        client.send(error=f"the warm server has {len(processes.threads())} threads, so forking it "
                    "is unsafe")
        return
    with listening_socket() as sock:
        store, ready = start_store(sock, client.reply_fd)
        running[:] = [store]
        for env in job["envs"]:
            env["MASTER_PORT"] = str(sock.getsockname()[1])
        job["threads"] = thread_count(job["envs"][0])
        pids = _fork_ranks(job, client.reply_fd, (sock.fileno(), ready))
    running[:] = [*pids, store]
    said = _read_line(ready, STORE_START_S).strip()  # (while the ranks start)
    os.close(ready)
    if said != "ready":
        processes.stop(lambda: {p for p in pids if processes.alive(p)}, reap=lambda: _reap(pids, {}, []))
        stop_store(store)
        running.clear()
        client.send(error=f"the job's rendezvous store did not start: {said or 'no answer'}")
        return
    client.send(pids=pids)
    codes: dict[int, int] = {}
    root = _watch_ranks(pids, codes, client)
    client.send(codes=codes, root=root)
    stop_store(store)  # (after the answer: the client need not wait for it)
    running.clear()


def _fork_ranks(job: dict, reply_fd: int, not_theirs: tuple[int, ...]) -> list[int]:
    """Fork a child per rank (see run_rank); `not_theirs`: the server's files a rank closes."""
    server, pids = os.getpid(), []
    stop = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # no handler of ours runs in a new child
    for finalizer in list(weakref.finalize._registry):  # (torch.library's, made at import)
        finalizer.atexit = False  # the server's: a rank undoing them at its exit would be no use
    gc.collect()
    gc.freeze()  # a rank's gc.get_objects() is what it made (see close_files); no copy of these
    try:
        for rank in range(len(job["envs"])):
            pid = os.fork()
            if pid == 0:
                for fd in not_theirs:
                    os.close(fd)
                run_rank(job, rank, reply_fd, server)
            pids.append(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
    return pids


def _watch_ranks(pids: list[int], codes: dict[int, int], client: _Client) -> int | None:
    """Collect every rank's exit code into `codes`; when one fails, stop the others as torchrun
    does (SIGTERM, then SIGKILL after the grace period). Returns the first that failed."""
    failed: list[int] = []
    reap: Callable[[], None] = lambda: _reap(pids, codes, failed)  # noqa: E731
    while len(codes) < len(pids):
        reap()
        if failed:
            running = lambda: {p for r, p in enumerate(pids) if r not in codes}  # noqa: E731
            processes.stop(running, reap=lambda: (reap(), client.watch(0)))
            for r, pid in enumerate(pids):  # (anything left after SIGKILL: wait for it)
                if r not in codes:
                    codes[r] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        else:
            client.watch(0.005)
    return failed[0] if failed else None


def _reap(pids: list[int], codes: dict[int, int], failed: list[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in pids:
            rank = pids.index(pid)
            codes[rank] = os.waitstatus_to_exitcode(status)
            if codes[rank] != 0:
                failed.append(rank)
