"""Run a real distributed script on N local processes, from a notebook or a terminal, safely.

A notebook cannot ``mp.spawn`` a function it defines, and ``torchrun`` is a terminal
command. ``torchrun()`` starts PyTorch's own launcher (``python -m torch.distributed.run``)
on a script file and watches it::

    from course_utils.launch import torchrun, LaunchError, LaunchTimeout
    result = torchrun("scripts/hello_dist.py", nproc=2, timeout=120)
    result.returncode, result.elapsed, result.logs[0], result.logs[1]

- A free rendezvous port every time (the OS picks it), so two jobs never collide.
- ``OMP_NUM_THREADS=1`` (torchrun's default; the same numbers on any machine), ``COURSE_BACKEND`` (read by ``course_utils.dist``)
  and ``PYTHONUNBUFFERED=1`` are set for the ranks.
- Each rank writes to its own log files, so lines are never glued together. In Jupyter a
  live widget shows progress (it leaves nothing that nbval compares) and, at the end, the
  output is printed grouped by rank, in rank order. In a terminal, lines stream with a
  ``[rank N]`` prefix.
- A failing rank raises ``LaunchError`` (rank, exit code, last traceback lines, log path)
  as soon as the launcher sees it; a job past ``timeout`` is killed, every process of it,
  and raises ``LaunchTimeout``. Bad arguments are refused before anything starts.

Command line: ``python -m course_utils launch SCRIPT --nproc 2 -- ARGS``.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Environment variable that marks every process of one job (to find and stop them all).
JOB_VAR = "COURSE_LAUNCH_ID"
#: Seconds between two looks at the logs (the launcher's exit is seen at once where the
#: system can say so, Linux pidfd; elsewhere at this interval).
POLL_S = 0.1
#: Seconds a process gets between SIGTERM and SIGKILL when a job is stopped.
GRACE_S = 2.0
#: Threads per rank (OMP_NUM_THREADS): fixed, so results do not depend on the core count.
RANK_THREADS = 1
#: How many lines of a failing rank's error output go into the exception message.
TAIL_LINES = 12

# Linux: the launcher gets SIGTERM if the process that started it dies (a killed or restarted
# kernel), and then stops its ranks itself. Set in a tiny stdlib-only shim that execs the
# launcher, because preexec_fn is unsafe in a threaded process such as a Jupyter kernel.
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the process that started the launcher is gone')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|"
    r"DistBackendError|Socket Timeout|timed out|SIGTERM|Signal 15",
)


class LaunchError(RuntimeError):
    """A rank of a distributed job failed (or the launcher itself did).

    Attributes: ``rank`` (None if no rank is to blame), ``exit_code``, ``log_dir``,
    ``logs`` (stdout text per rank), ``stderr`` (stderr text per rank), ``elapsed`` (seconds
    from the launcher's start to the end of the job), ``error`` (the last line of the failing
    rank's error output, e.g. ``"ValueError: bad shape"``; "" if none).

    Which rank is named: the one that failed by itself (not one that only lost its peer or
    was stopped by the launcher); among several that failed the same way, the lowest. When
    every rank would hit the same error, the launcher may stop the slower ones before they
    get there, so the rank named can vary from run to run; ``error`` does not.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exit_code: int | None = None,
        log_dir: str = "",
        logs: Sequence[str] = (),
        stderr: Sequence[str] = (),
        elapsed: float = 0.0,
        error: str = "",
    ) -> None:
        super().__init__(message)
        self.elapsed = elapsed
        self.error = error
        self.rank = rank
        self.exit_code = exit_code
        self.log_dir = log_dir
        self.logs = list(logs)
        self.stderr = list(stderr)


class LaunchTimeout(LaunchError):
    """The job ran past its timeout; every process of it was stopped."""


@dataclass
class LaunchResult:
    """What a finished job left: exit code, wall time, and each rank's output.

    ``logs[r]`` is rank r's stdout, ``stderr[r]`` its stderr (last attempt when the job
    was restarted; ``attempts`` holds the stdout of every attempt).
    """

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

    def lines(self, rank: int) -> list[str]:
        """Rank `rank`'s stdout as a list of lines."""
        return self.logs[rank].splitlines()


# --------------------------------------------------------------------------- helpers


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (not a terminal, not a plain IPython shell)."""
    if "IPython" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def _strip_torch_prefix(line: str) -> str:
    return _TORCH_RANK_PREFIX.sub("", line)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "an unknown exit code"
    if code < 0:
        text = f"exit code {code} ({_signal_name(code)}"
        if code == -signal.SIGKILL:
            text += ": killed, often because the machine ran out of memory"
        return text + ")"
    return f"exit code {code}"


class _Tail:
    """Reads whole new lines from a growing file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = b""
        self.lines: list[str] = []

    def read(self, final: bool = False) -> list[str]:
        new: list[str] = []
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = self.pos
        if size > self.pos:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read(size - self.pos)
            self.pos += len(data)
            self.buf += data
            *whole, self.buf = self.buf.split(b"\n")
            new = [w.decode("utf-8", "replace").rstrip("\r") for w in whole]
        if final and self.buf:
            new.append(self.buf.decode("utf-8", "replace").rstrip("\r"))
            self.buf = b""
        self.lines.extend(new)
        return new

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


# ------------------------------------------------------------------ the job's processes


def _proc_table() -> dict[int, tuple[int, bool]] | None:
    """{pid: (ppid, is_zombie)} for this user's processes via /proc (None where there is none)."""
    if not os.path.isdir("/proc/self"):
        return None
    table: dict[int, tuple[int, bool]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2 :].split()
        if len(rest) < 2:
            continue
        table[int(name)] = (int(rest[1]), rest[0] == b"Z")
    return table


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read()
    except OSError:
        return False


def _ps_table() -> dict[int, tuple[int, bool]]:
    try:
        out = subprocess.run(
            ["ps", "-A", "-o", "pid=,ppid=,stat="], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    table = {}
    for row in out.splitlines():
        parts = row.split()
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
            table[int(parts[0])] = (int(parts[1]), parts[2].startswith("Z"))
    return table


def _job_pids(proc: subprocess.Popen, job_id: str) -> set[int]:
    """Live (non-zombie) processes of the job: marked by its environment variable or
    descended from the launcher. Workers run in sessions of their own, so the launcher's
    process group alone does not reach them."""
    # Walk the launcher's descendants only while its pid is still ours (not yet reaped).
    launcher_pid = proc.pid if proc.returncode is None else -1
    table = _proc_table()
    marker = f"{JOB_VAR}={job_id}\0".encode()
    found: set[int] = set()
    if table is None:
        table = _ps_table()
    else:
        found = {pid for pid, (_, zombie) in table.items() if not zombie and _has_marker(pid, marker)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = [launcher_pid]
    while stack:
        pid = stack.pop()
        if pid in table and not table[pid][1]:
            found.add(pid)
        stack.extend(children.get(pid, []))
    found.discard(os.getpid())
    return found


def _alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
    except OSError:
        return True


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        for send in (os.killpg, os.kill):  # each worker leads its own process group
            try:
                if send is os.killpg and os.getpgid(pid) != pid:
                    continue
                send(pid, sig)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _stop_job(proc: subprocess.Popen, job_id: str, grace: float = GRACE_S) -> None:
    """SIGTERM every process of the job, SIGKILL what is left after `grace` seconds, reap the launcher."""
    if os.name != "posix":  # pragma: no cover - the course runs on Linux and macOS
        proc.kill()
        proc.wait()
        return
    pids = _job_pids(proc, job_id)
    if proc.poll() is None:
        pids.add(proc.pid)
    _signal_all(pids, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        proc.poll()
        if not any(_alive(p) for p in pids):
            break
        time.sleep(0.05)
    for _ in range(5):  # a launcher in the middle of a restart may have started new workers
        left = {p for p in pids | _job_pids(proc, job_id) if _alive(p)}
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        pids = left
        time.sleep(0.05)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


# ------------------------------------------------------------------------ live display


class _Widget:
    """A live HTML widget in Jupyter; replaced by an empty output when the job ends.

    Its display carries no text/plain (only the widget view, which nbval skips), and it
    is emptied at the end, so the stored notebook keeps nothing that varies.
    """

    def __init__(self, title: str, nproc: int) -> None:
        import ipywidgets
        from IPython.display import display

        self.title, self.nproc = title, nproc
        self.widget = ipywidgets.HTML(value=self._html("starting", {}))
        bundle = self.widget._repr_mimebundle_()
        bundle = {k: v for k, v in bundle.items() if k != "text/plain"}
        self.display_id = uuid.uuid4().hex
        display(bundle, raw=True, display_id=self.display_id)
        self.last = 0.0

    def _html(self, status: str, tails: Mapping[int, list[str]]) -> str:
        rows = []
        for r in range(self.nproc):
            lines = tails.get(r, [])
            text = html.escape("\n".join(lines[-3:])) or "&nbsp;"
            rows.append(
                f"<tr><td style='vertical-align:top;padding-right:1em'><b>rank {r}</b></td>"
                f"<td><pre style='margin:0'>{text}</pre></td></tr>"
            )
        return (
            f"<div><b>{html.escape(self.title)}</b>: {html.escape(status)}"
            f"<table>{''.join(rows)}</table></div>"
        )

    def due(self) -> bool:
        """At most four refreshes a second."""
        return time.monotonic() - self.last >= 0.25

    def update(self, status: str, tails: Mapping[int, list[str]]) -> None:
        self.last = time.monotonic()
        value = self._html(status, tails)
        if value != self.widget.value:
            self.widget.value = value

    def close(self) -> None:
        from IPython.display import update_display

        try:
            update_display({}, raw=True, display_id=self.display_id)
        finally:
            self.widget.close()


# ------------------------------------------------------------------------------- job


class _Job:
    """One run of the launcher: its process, its log files, what to show."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str], log_dir: Path,
                 nproc: int, mode: str, title: str, job_id: str) -> None:
        self.nproc, self.mode, self.log_dir, self.job_id = nproc, mode, log_dir, job_id
        self.tl_dir = log_dir / "torchrun"
        self.launcher_log = log_dir / "launcher.log"
        self.attempts: dict[int, list[tuple[_Tail, _Tail]]] = {}
        self.widget: _Widget | None = None
        if mode == "notebook":
            try:
                self.widget = _Widget(title, nproc)
            except Exception:  # no ipywidgets / no frontend: the final print still comes
                self.widget = None
        if sys.platform.startswith("linux"):
            cmd = [sys.executable, "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *cmd]
        try:
            with open(self.launcher_log, "wb") as fh:
                self.t0 = time.monotonic()
                self.proc = subprocess.Popen(
                    cmd, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=fh,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
        except BaseException:
            self.close_widget()
            raise
        self.pidfd = -1
        if hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(self.proc.pid)
            except OSError:  # an old kernel: poll instead
                self.pidfd = -1

    def wait_exit(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking as soon as the launcher exits."""
        if self.pidfd >= 0:
            select.select([self.pidfd], [], [], seconds)
        else:
            time.sleep(seconds)

    def close_pidfd(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    # logs -------------------------------------------------------------------------
    def _find_attempts(self) -> None:
        try:
            runs = [d for d in os.scandir(self.tl_dir) if d.is_dir()]
        except OSError:
            return
        for run in runs:
            for a in os.scandir(run.path):
                if a.name.startswith("attempt_") and a.name[8:].isdigit():
                    n = int(a.name[8:])
                    if n not in self.attempts:
                        base = Path(a.path)
                        self.attempts[n] = [
                            (_Tail(base / str(r) / "stdout.log"), _Tail(base / str(r) / "stderr.log"))
                            for r in range(self.nproc)
                        ]
                        if n > 0 and self.mode == "terminal":
                            print(f"[launcher] restarting the job (attempt {n})", flush=True)

    def pump(self, final: bool = False) -> None:
        """Read new lines of every rank; stream them (terminal) or refresh the widget."""
        self._find_attempts()
        for n in sorted(self.attempts):
            for r, (out, err) in enumerate(self.attempts[n]):
                new_out, new_err = out.read(final), err.read(final)
                if self.mode == "terminal":
                    if new_out:
                        sys.stdout.write("".join(f"[rank {r}] {line}\n" for line in new_out))
                        sys.stdout.flush()
                    if new_err:
                        sys.stderr.write(
                            "".join(f"[rank {r}] {_strip_torch_prefix(line)}\n" for line in new_err)
                        )
                        sys.stderr.flush()
        if self.widget is not None and self.widget.due():
            tails = {r: (o.lines[-3:] + [_strip_torch_prefix(x) for x in e.lines[-3:]])[-3:]
                     for r, (o, e) in enumerate(self.last_attempt())}
            n = max(self.attempts) if self.attempts else 0
            status = f"running, {time.monotonic() - self.t0:.0f} s"
            if n:
                status += f" (attempt {n})"
            self.widget.update(status, tails)

    def last_attempt(self) -> list[tuple[_Tail, _Tail]]:
        if not self.attempts:
            return [(_Tail(Path(os.devnull)), _Tail(Path(os.devnull))) for _ in range(self.nproc)]
        return self.attempts[max(self.attempts)]

    def stdout(self) -> list[str]:
        return [o.text() for o, _ in self.last_attempt()]

    def stderr(self) -> list[str]:
        return [e.text() for _, e in self.last_attempt()]

    def flat_logs(self) -> None:
        """Give the last attempt's logs stable names: <log_dir>/rank<R>.{stdout,stderr}.log."""
        if not self.attempts:
            return
        for r, (out, err) in enumerate(self.last_attempt()):
            for tail, kind in ((out, "stdout"), (err, "stderr")):
                dst = self.log_dir / f"rank{r}.{kind}.log"
                dst.unlink(missing_ok=True)  # a log_dir used before keeps only this job's
                if tail.path.exists():
                    try:
                        os.link(tail.path, dst)
                    except OSError:
                        shutil.copyfile(tail.path, dst)

    def close_widget(self) -> None:
        if self.widget is not None:
            widget, self.widget = self.widget, None
            try:
                widget.close()
            except Exception:
                pass

    # diagnosis --------------------------------------------------------------------
    def launcher_text(self) -> str:
        try:
            return self.launcher_log.read_text(errors="replace")
        except OSError:
            return ""

    def show_grouped(self, stream) -> None:
        """Every attempt's output, grouped by rank in rank order."""
        chunks = []
        several = len(self.attempts) > 1
        for n in sorted(self.attempts):
            if several:
                chunks.append(f"--- attempt {n} ---\n")
            for r, (out, _) in enumerate(self.attempts[n]):
                chunks.extend(f"[rank {r}] {line}\n" for line in out.lines)
        if chunks:
            stream.write("".join(chunks))
            stream.flush()

    def show_errors(self, stream) -> None:
        chunks = []
        for r, (_, err) in enumerate(self.last_attempt()):
            chunks.extend(f"[rank {r}] {_strip_torch_prefix(line)}\n" for line in err.lines)
        if chunks:
            stream.write("".join(chunks))
            stream.flush()


def _failures(launcher_text: str) -> tuple[dict[int, int], int | None]:
    """Parse torchrun's failure summary: ({rank: exit code}, root-cause rank)."""
    pattern = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
    failures: dict[int, int] = {}
    root = None
    head, sep, tail = launcher_text.rpartition("Root Cause")
    for m in pattern.finditer(head if sep else launcher_text):
        failures[int(m.group(1))] = int(m.group(2))
    if sep:
        m = pattern.search(tail)
        if m:
            root = int(m.group(1))
            failures[root] = int(m.group(2))
    return failures, root


def _error_tail(lines: Sequence[str], n: int = TAIL_LINES) -> list[str]:
    lines = [_strip_torch_prefix(x) for x in lines]
    lines = [x for x in lines if x.strip()]
    starts = [i for i, x in enumerate(lines) if x.startswith("Traceback (most recent call last)")]
    if starts:
        lines = lines[starts[-1]:]
    return lines[-n:]


def _blame(failures: dict[int, int], root: int | None, stderr: list[list[str]]) -> int | None:
    """The rank to name: a real failure rather than one that only followed another rank's crash.

    When several ranks failed with the same last error line, the lowest one (deterministic)."""
    def last_line(r: int) -> str:
        tail = _error_tail(stderr[r]) if r < len(stderr) else []
        return tail[-1] if tail else ""

    def collateral(r: int) -> bool:
        code = failures.get(r)
        return code == -signal.SIGTERM or bool(_COLLATERAL.search(last_line(r)))

    if not failures:
        with_tb = [r for r in range(len(stderr)) if any("Traceback" in x for x in stderr[r])]
        return min(with_tb) if with_tb else None
    genuine = sorted(r for r in failures if not collateral(r))
    if not genuine:
        return root if root is not None else min(failures)
    if len({last_line(r) for r in genuine}) == 1:
        return genuine[0]
    return root if root in genuine else genuine[0]


# --------------------------------------------------------------------------------- API


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
    log_dir: str | os.PathLike | None = None,
) -> LaunchResult:
    """Run `script` on `nproc` local processes with ``python -m torch.distributed.run``.

    - `script`: relative to `cwd` (default: the current directory; a notebook's is
      ``notebooks/``); `args`: the script's command-line arguments.
    - `backend`: None means ``COURSE_BACKEND`` if set, else ``course_utils.dist.choose_backend``
      (nccl with a GPU per rank, else gloo); it reaches the ranks as ``COURSE_BACKEND``.
    - `timeout`: seconds for the whole job (None: no limit). `max_restarts`: elastic restarts.
    - `env`: extra environment variables for the ranks.
    - `show`: in Jupyter a live widget, then the output grouped by rank in rank order (the
      ranks' stderr goes to stderr); in a terminal, lines streamed with a ``[rank N]`` prefix.
      On a failure the output so far goes to stderr, then the exception.
    - `log_dir`: where the logs go (default: a new temporary folder); each rank's are
      ``rank<R>.stdout.log`` and ``rank<R>.stderr.log`` there.

    Raises ``LaunchError`` when a rank fails, ``LaunchTimeout`` past `timeout`, and
    ``FileNotFoundError`` / ``ValueError`` / ``RuntimeError`` (nccl without a GPU per rank)
    before starting anything when the arguments cannot work.
    """
    base = Path(cwd) if cwd is not None else Path.cwd()
    script_str = os.fspath(script)
    full = Path(script_str) if Path(script_str).is_absolute() else base / script_str
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a whole number of processes, at least 1; got {nproc!r}.")
    if not full.is_file():
        where = full.resolve()
        raise FileNotFoundError(
            f"script not found: {script_str} (looked for {where}). Paths are relative to the "
            "current directory, which is notebooks/ in a course notebook: e.g. 'scripts/hello_dist.py'."
        )
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds (or None); got {timeout!r}.")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more; got {max_restarts!r}.")
    from .dist import check_backend, choose_backend  # imports torch: only when launching

    backend = (backend or (env or {}).get("COURSE_BACKEND") or os.environ.get("COURSE_BACKEND")
               or choose_backend(nproc, warn=False))
    check_backend(str(backend), nproc)
    backend = str(backend)

    job_id = uuid.uuid4().hex
    if log_dir is None:
        tmp_root = "/tmp" if os.name == "posix" and os.path.isdir("/tmp") else None
        logs_path = Path(tempfile.mkdtemp(dir=tmp_root))
    else:
        logs_path = Path(log_dir)
        logs_path.mkdir(parents=True, exist_ok=True)

    run_env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, run_env.get("PYTHONPATH")) if p)
    # One thread per rank, whatever this machine's core count, as torchrun's own default: the
    # numbers a lesson prints (losses, sums) then do not depend on the machine.
    run_env["OMP_NUM_THREADS"] = str(RANK_THREADS)
    run_env["PYTHONUNBUFFERED"] = "1"
    if max_restarts > 0:
        # Restarted ranks otherwise read the previous attempt's keys (gloo's addresses, and so on for
        # any backend) from the shared rendezvous store and fail to connect or hang (pytorch/pytorch#135712).
        run_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    run_env.update({k: str(v) for k, v in (env or {}).items()})
    run_env["COURSE_BACKEND"] = backend
    run_env[JOB_VAR] = job_id

    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone",  # c10d rendezvous on localhost:0, i.e. a free port chosen by the OS
        "--nnodes", "1",
        "--nproc-per-node", str(nproc),
        "--max-restarts", str(max_restarts),
        "--redirects", "3",
        "--log-dir", str(logs_path / "torchrun"),
        "--shutdown-timeout", "5",
        script_str, *[str(a) for a in args],
    ]
    mode = ("notebook" if _in_notebook() else "terminal") if show else "quiet"
    title = f"torchrun {script_str} on {nproc} processes ({backend})"
    job = _Job(cmd, base, run_env, logs_path, nproc, mode, title, job_id)
    deadline = None if timeout is None else job.t0 + timeout
    finished = False
    try:
        while True:
            rc = job.proc.poll()
            job.pump()
            if rc is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                _stop_job(job.proc, job_id)
                rc = None
                break
            wait = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            job.wait_exit(wait)
        elapsed = time.monotonic() - job.t0
        if rc is not None:
            _stop_job(job.proc, job_id)  # leftovers (e.g. a process a rank started)
        finished = True
    finally:
        job.close_pidfd()
        if not finished:  # KeyboardInterrupt (kernel interrupt) or an error of ours
            for _ in range(3):  # a second interrupt while stopping must not leave orphans
                try:
                    _stop_job(job.proc, job_id)
                    break
                except KeyboardInterrupt:
                    continue
            job.close_widget()
    job.pump(final=True)
    job.flat_logs()
    job.close_widget()
    stdout, stderr = job.stdout(), job.stderr()
    restarts = max(job.attempts) if job.attempts else 0
    common = {"log_dir": str(logs_path), "logs": stdout, "stderr": stderr, "elapsed": elapsed}

    if rc is None:
        if mode == "notebook":
            sys.stderr.write("[launcher] what the ranks printed before the timeout:\n")
            job.show_grouped(sys.stderr)
            job.show_errors(sys.stderr)
        raise LaunchTimeout(
            f"{script_str} ({nproc} processes) did not finish within its timeout of {timeout:g} s, "
            "so every process of the job was stopped.\n"
            "A rank that waits forever (in all_reduce, barrier, ...) usually means that another "
            "rank never made the same call.\n"
            f"Logs of each rank R: {logs_path}/rankR.stdout.log and rankR.stderr.log",
            **common,
        )
    if rc != 0:
        if mode == "notebook":
            sys.stderr.write("[launcher] what the ranks printed before the failure:\n")
            job.show_grouped(sys.stderr)
        failures, root = _failures(job.launcher_text())
        err_lines = [e.splitlines() for e in stderr]
        rank = _blame(failures, root, err_lines)
        if rank is None:
            tail = [x for x in job.launcher_text().splitlines() if x.strip()][-TAIL_LINES:]
            raise LaunchError(
                f"the launcher failed ({_describe_exit(rc)}) running {script_str} before any rank "
                "reported an error. Its last lines:\n"
                + "\n".join("    " + x for x in tail)
                + f"\nLogs: {logs_path}",
                exit_code=rc,
                **common,
            )
        code = failures.get(rank)
        tail = _error_tail(err_lines[rank])
        shown = "\n".join("    " + x for x in tail) if tail else "    (it wrote nothing to stderr)"
        raise LaunchError(
            f"rank {rank} of {nproc} failed with {_describe_exit(code)} running {script_str}\n"
            f"Last lines of its error output:\n{shown}\n"
            f"Its full log: {logs_path / f'rank{rank}.stderr.log'} (every rank's logs are in {logs_path})",
            rank=rank,
            exit_code=code,
            error=tail[-1] if tail else "",
            **common,
        )
    if mode == "notebook":
        job.show_grouped(sys.stdout)
        job.show_errors(sys.stderr)
    return LaunchResult(
        script=script_str, nproc=nproc, backend=backend, returncode=rc, elapsed=elapsed,
        logs=stdout, stderr=stderr, log_dir=str(logs_path), restarts=restarts,
        attempts=[[o.text() for o, _ in job.attempts[n]] for n in sorted(job.attempts)],
    )


# -------------------------------------------------------------------------------- CLI


def main(argv: list[str]) -> int:
    """``python -m course_utils launch SCRIPT --nproc 2 [--backend gloo] [--timeout S] -- ARGS``."""
    argv = list(argv)
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="python -m course_utils launch",
        description="Run a distributed script on N local processes (torchrun with safe defaults). "
        "Arguments after -- go to the script.",
    )
    parser.add_argument("script", help="the script to run, relative to the current directory")
    parser.add_argument("--nproc", type=int, default=2, help="number of processes (default 2)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                        help="default: nccl with a GPU per rank, else gloo")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--max-restarts", type=int, default=0, help="elastic restarts (default 0)")
    parser.add_argument("--quiet", action="store_true", help="do not stream the ranks' output")
    opts = parser.parse_args(argv)
    try:
        result = torchrun(opts.script, nproc=opts.nproc, args=script_args, timeout=opts.timeout,
                          backend=opts.backend, max_restarts=opts.max_restarts, show=not opts.quiet)
    except LaunchTimeout as exc:
        print(f"LaunchTimeout: {exc}", file=sys.stderr)
        return 124
    except LaunchError as exc:
        print(f"LaunchError: {exc}", file=sys.stderr)
        code = exc.exit_code
        return code if code is not None and 0 < code < 256 else 1
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[launcher] {opts.nproc} processes finished in {result.elapsed:.1f} s; "
          f"logs in {result.log_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


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


def free_port() -> int:
    """A TCP port that is free right now on this machine (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SpawnFailed(RuntimeError):
    """Child processes of :func:`spawn_bounded` failed (``exit_code``, ``children_stderr``) or
    outlived their time limit (``exit_code`` None)."""

    def __init__(self, msg: str, exit_code: int | None = None, children_stderr: str = "") -> None:
        super().__init__(msg)
        self.exit_code = exit_code
        self.children_stderr = children_stderr


def spawn_bounded(fn: Callable[..., Any], args: tuple = (), nprocs: int = 2, timeout: float = 60.0,
                  start_method: str = "spawn") -> int:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` that cannot hang a notebook, and whose
    outcome does not depend on which child was faster. Returns the number of processes started.

    Every child is waited for (not only the first to fail) until `timeout` seconds; those still
    running then are stopped and :class:`SpawnFailed` is raised. A failing child raises
    :class:`SpawnFailed` naming the children's own error line; their full stderr (captured, not
    interleaved in the notebook) is in its ``children_stderr``.

    `start_method` "spawn" is ``mp.spawn`` itself (fresh interpreters); "fork" copies the
    parent instead (Linux and macOS only: faster, but unsafe after the parent ran torch work)."""
    import torch.multiprocessing as mp

    with child_stderr() as err:
        context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method=start_method)
        deadline = time.monotonic() + timeout
        for p in context.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        late = [p for p in context.processes if p.is_alive()]
        for p in late:
            p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    if late:
        raise SpawnFailed(
            f"{len(late)} of {nprocs} spawned processes did not finish within {timeout:g} s and were stopped. "
            "A process waiting forever (in init_process_group, a collective, ...) usually means "
            "that another one never joined.", None, err.text)
    codes = [p.exitcode for p in context.processes if p.exitcode != 0]
    if codes:
        causes = error_lines(err.text)
        code = max(set(codes), key=codes.count)
        raise SpawnFailed(
            f"{len(codes)} of {nprocs} child processes exited with code {code} before finishing "
            f"{getattr(fn, '__name__', fn)!s}. The children's error: {causes[-1] if causes else '(no error message)'}",
            code, err.text)
    return len(context.processes)
