"""The hub lane's room: ``python tasks.py hub`` started on localhost with accounts, ports, a state
folder and an instructor's clone of its own, and everything it made taken away afterwards (the hub, the
proxy, every learner's process, the accounts and their homes, the group, the folders).

The learners' accounts must reach the course's .venv (its Python may live under a folder such as /root,
mode 700): ``make hub`` refuses such a set-up with the folder's name; the lane lets other accounts pass
those folders (o+x: no listing) for its duration and puts their modes back after.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from course_utils.launch import free_port
from deploy.hub import room as R

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 120


def _git(args: list[str], cwd: Path) -> str:
    r = subprocess.run(["git", "-c", "user.name=Instructor", "-c", "user.email=instructor@example.org", *args],
                       cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"git {' '.join(args)}: {r.stderr}"
    return r.stdout


def instructors_clone(folder: Path) -> Path:
    """The course as it is in this working tree (tracked and new files, not ignored ones), committed on
    the branch "course" of a new repository: the clone the learners pull."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, timeout=120, check=True).stdout.decode().split("\0")
    clone = folder / "course"
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            dst = clone / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    _git(["init", "-q", "-b", "course", "."], clone)
    _git(["add", "-A"], clone)
    _git(["commit", "-q", "-m", "the course"], clone)
    for p in [clone, *clone.rglob("*")]:  # readable by every account, as a clone made with umask 022 is
        p.chmod(p.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
    return clone


@dataclass
class Lane:
    """One room, its hub started and restarted on demand."""

    work: Path
    learners: int
    prefix: str = field(default_factory=lambda: f"t{secrets.token_hex(2)}-")
    room_password: str = field(default_factory=R.make_password)
    ports: dict[str, int] = field(default_factory=dict)
    granted: dict[Path, int] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    clone: Path | None = None
    starts: int = 0

    @property
    def group(self) -> str:
        return self.prefix + "room"

    @property
    def state(self) -> Path:
        return self.work / "state"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['port']}"

    def room(self) -> R.Room:
        return R.Room.load(self.state)

    def account(self, name: str) -> pwd.struct_passwd:
        return pwd.getpwnam(self.prefix + name)

    # --- set-up ---------------------------------------------------------------------------------

    def let_accounts_through(self, paths: list[Path]) -> None:
        """o+x on every folder on the way to `paths` that lacks it (modes kept, put back in close())."""
        for path in paths:
            found = R.unreachable(path)
            while found is not None:
                folder, missing = found
                if missing != "o+x" or folder in self.granted:
                    raise AssertionError(f"the learners' accounts cannot read {folder} ({missing} is missing)")
                self.granted[folder] = folder.stat().st_mode
                folder.chmod(folder.stat().st_mode | stat.S_IXOTH)
                print(f"hub lane: other accounts may pass {folder} (o+x) for the lane's duration", flush=True)
                found = R.unreachable(path)

    def prepare(self) -> None:
        self.work.chmod(0o755)
        self.clone = instructors_clone(self.work)
        venv = ROOT / ".venv"
        self.let_accounts_through([Path(os.path.realpath(venv / "bin" / "python")), venv.resolve(),
                                   ROOT / "deploy" / "hub" / "start_server.py", self.clone])
        self.ports = {k: free_port() for k in ("port", "hub_port", "proxy_api_port", "view_port")}

    # --- the hub --------------------------------------------------------------------------------

    def start(self, cull_after_s: int = 3600, cull_every_s: int = 0, activity_interval_s: int = 300) -> float:
        """``python tasks.py hub`` with this lane's settings; the seconds until the hub answers."""
        assert self.proc is None, "the hub is already running"
        self.starts += 1
        self.log = self.work / f"hub-{self.starts}.log"
        p = self.ports
        cmd = [sys.executable, str(ROOT / "tasks.py"), "hub", "--ip", "127.0.0.1", "--port", str(p["port"]),
               "--hub-port", str(p["hub_port"]), "--proxy-api-port", str(p["proxy_api_port"]),
               "--view-port", str(p["view_port"]), "--state", str(self.state), "--learners", str(self.learners),
               "--repo", str(self.clone), "--branch", "course", "--account-prefix", self.prefix,
               "--group", self.group, "--room-password", self.room_password,
               "--cull-after", str(cull_after_s), "--cull-every", str(cull_every_s),
               "--activity-interval", str(activity_interval_s)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_TOKEN")}
        t0 = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                raise RuntimeError(f"the hub exited with code {code}:\n{self.log.read_text()[-4000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/hub/api/", timeout=5).status_code == 200:
                    return time.monotonic() - t0
            if time.monotonic() - t0 > START_TIMEOUT_S:
                raise TimeoutError(f"the hub did not answer within {START_TIMEOUT_S} s:\n"
                                   f"{self.log.read_text()[-4000:]}")
            time.sleep(0.5)

    def stop(self) -> float:
        """Stop the hub as Ctrl-C would (it stops the servers, the services and the proxy); the seconds it
        took. Whatever its process group still runs after that is killed."""
        if self.proc is None:
            return 0.0
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        took = time.monotonic() - t0
        with contextlib.suppress(ProcessLookupError):  # a straggler left in the hub's group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None
        return took

    def accounts(self) -> list[pwd.struct_passwd]:
        return [e for e in pwd.getpwall() if e.pw_name.startswith(self.prefix)]

    def processes(self) -> dict[str, list[int]]:
        """The processes every account of this room runs now."""
        return {e.pw_name: pids for e in self.accounts() if (pids := R.processes_of(e.pw_uid))}

    def close(self) -> list[str]:
        """Take everything away; what could not be (for the report)."""
        problems = []
        try:
            self.stop()
        except Exception as exc:  # go on: the accounts and modes must still be put back
            problems.append(f"stopping the hub: {exc}")
        def remove(name: str) -> None:
            try:
                R.remove_account(name, self.group)
            except Exception as exc:
                problems.append(f"removing {name}: {exc}")

        accounts = self.accounts()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # each home holds a copy of the course
            list(pool.map(remove, [e.pw_name for e in accounts]))
        left = _owned_in_tmp({e.pw_uid for e in accounts})  # what their kernels left there goes with them
        if left:
            problems.append(f"left in /tmp by the removed accounts: {', '.join(left)}")
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(["groupdel", self.group], capture_output=True, timeout=60)
        for folder, mode in self.granted.items():
            try:
                folder.chmod(stat.S_IMODE(mode))
            except OSError as exc:
                problems.append(f"putting back the mode of {folder}: {exc}")
        self.granted.clear()
        return problems


def _owned_in_tmp(uids: set[int]) -> list[str]:
    """The names of the entries of /tmp that one of `uids` owns (an entry that goes while this looks is
    not one: the check above must not stop the rest of the clean-up)."""
    left = []
    with os.scandir("/tmp") as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid in uids:
                    left.append(entry.name)
    return sorted(left)


def pss_by_account(lane: Lane) -> dict[str, int]:
    """The proportional memory (PSS, bytes: shared pages divided among the processes that share them) of
    every account's processes now."""
    found = {}
    for name, pids in lane.processes().items():
        total = 0
        for pid in pids:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        found[name] = total
    return found


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class MemorySampler:
    """Every `every_s` seconds while the block runs, in a thread: each account's peak PSS, and the CPU
    seconds its processes used during the block (each process's last reading less its reading at the
    start, summed: a process that ends between two readings loses under `every_s` of its time)."""

    def __init__(self, lane: Lane, every_s: float = 1.0):
        import threading

        self.lane, self.every_s = lane, every_s
        self.peak: dict[str, int] = {}
        self._cpu: dict[str, dict[int, float]] = {}
        self._start: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pss in pss_by_account(self.lane).items():
                self.peak[name] = max(self.peak.get(name, 0), pss)
            for name, pids in self.lane.processes().items():
                seen = self._cpu.setdefault(name, {})
                for pid in pids:
                    with contextlib.suppress(OSError, IndexError, ValueError):
                        seen[pid] = cpu_seconds(pid)
            self._stop.wait(self.every_s)

    @property
    def cpu(self) -> dict[str, float]:
        return {name: sum(t - self._start.get(pid, 0.0) for pid, t in seen.items()) for name, seen in self._cpu.items()}

    def __enter__(self) -> MemorySampler:
        for pids in self.lane.processes().values():
            for pid in pids:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    self._start[pid] = cpu_seconds(pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {R.cpu_cores()} cores"


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def temporary_work() -> Path:
    return Path(tempfile.mkdtemp(prefix="course-hub-lane-"))
