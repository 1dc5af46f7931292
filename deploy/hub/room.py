"""The workshop room's settings and the system work behind them, with the standard library only (the
task runner imports this module before anything is installed; the hub's own classes are in
``authenticator.py`` and ``spawner.py``).

- ``Room``: what ``make hub`` decided (address, learners, passwords, limits), saved as ``room.json`` in
  the hub's state folder (mode 600) and read by ``jupyterhub_config.py``;
- ``threads_per_kernel``: the threads one kernel may use, from the cores and the learners;
- ``unreachable``: the first folder on a path that other accounts cannot pass (the learners' accounts
  must reach the course's ``.venv`` and the instructor's clone);
- ``Claims``: the learners' own passwords, set at their first sign-in (scrypt hashes, mode 600);
- accounts: one system account per learner (``course-NAME``, home mode 700, in the room's group), and
  the processes an account runs, to stop them all when its server stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import grp
import hashlib
import hmac
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

ACCOUNT_PREFIX = "course-"  # system account of the hub user "ada": course-ada (never "root" or another real account)
GROUP = "course-learners"  # every learner's account is in it; an existing account outside it is never used
NAME_PATTERN = r"[a-z][a-z0-9_-]{0,22}"  # hub names; with the prefix, within Linux's 32 characters
COURSE_FOLDER = "pytorch-in-depth"  # the learner's copy of the course, in their home
PASSWORD_MIN = 8  # SharedPasswordAuthenticator's minimum for the room password; the same for learners' own
ADMIN_PASSWORD_MIN = 32  # SharedPasswordAuthenticator's minimum for the admin password
MIN_UID = 1000  # accounts below this are the system's own: never a learner's
COMMAND_TIMEOUT_S = 60


@dataclasses.dataclass
class Room:
    """Everything the hub's configuration needs, decided once by ``make hub`` (see tasks.py)."""

    state: str  # the hub's state folder: database, secrets, this file
    root: str  # the course folder that runs the hub (deploy/hub/ lives in it)
    venv: str  # the course's .venv, resolved: every learner's server and kernels run from it
    repo: str  # the instructor's clone, pulled into every learner's home
    branch: str
    ip: str = "127.0.0.1"
    port: int = 8000
    hub_port: int = 8081  # the hub's own API, on 127.0.0.1
    proxy_api_port: int = 8001  # the proxy's REST API, on 127.0.0.1
    view_port: int = 8090  # the instructor's view (a hub service), on 127.0.0.1
    learners: int = 30
    cores: int = 1
    threads: int = 1
    instructor: str = "instructor"
    room_password: str = ""
    admin_password: str = ""
    account_prefix: str = ACCOUNT_PREFIX
    group: str = GROUP
    home_base: str = "/home"
    cull_after_s: int = 3600
    cull_every_s: int = 0  # 0: the culler's default (half the timeout)
    activity_interval_s: int = 300  # how often servers and the proxy report activity to the hub
    lang: str = "en"  # the room's language: "en" or "zh" (the Chinese notebooks, the view in Chinese)
    ssl_cert: str = ""
    ssl_key: str = ""
    safe_directories: list[str] = dataclasses.field(default_factory=list)  # git may read these though root owns them

    @classmethod
    def load(cls, state: str | os.PathLike) -> Room:
        path = Path(state) / "room.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SystemExit(f"{path} does not exist: start the room with `make hub` (python tasks.py hub)") from None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self) -> Path:
        folder = Path(self.state)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        path = folder / "room.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
        return path

    @property
    def url(self) -> str:
        host = "localhost" if self.ip in ("127.0.0.1", "0.0.0.0", "") else self.ip
        return f"{'https' if self.ssl_cert else 'http'}://{host}:{self.port}/"

    def account(self, name: str) -> str:
        """The system account of the hub user `name`."""
        return self.account_prefix + name


def threads_per_kernel(cores: int, learners: int) -> int:
    """The threads each kernel may use so that `learners` kernels computing at once share `cores`
    without oversubscribing them: the cores divided by the learners, at least 1."""
    if cores < 1 or learners < 1:
        raise ValueError(f"cores and learners must be at least 1, not {cores} and {learners}")
    return max(1, cores // learners)


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def valid_name(name: str) -> bool:
    """Whether `name` can be a learner's hub name (lower case letters, digits, - and _, starting with a
    letter, at most 23 characters: with the account prefix it fits Linux's 32)."""
    return re.fullmatch(NAME_PATTERN, name) is not None


# --- what the learners' accounts can reach --------------------------------------------------------


def unreachable(path: str | os.PathLike) -> tuple[Path, str] | None:
    """The first folder on the way to `path` that an account other than its owner (and outside its
    group) cannot pass, or `path` itself if such an account cannot read it, with the permission that
    is missing ("o+x", "o+r"); None when every account can reach and read it. Links are followed."""
    target = Path(path).resolve()
    folders = [*reversed(target.parents), *([target] if target.is_dir() else [])]
    for folder in folders:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder, "o+x"
    if not target.stat().st_mode & stat.S_IROTH:
        return target, "o+r"
    return None


def reach_problem(path: str | os.PathLike, what: str) -> str | None:
    """A sentence for the instructor when the learners' accounts cannot reach `path` (what: "the course's
    .venv"), else None."""
    found = unreachable(path)
    if found is None:
        return None
    folder, missing = found
    mode = stat.filemode(folder.stat().st_mode)
    let = ((f"let other accounts pass it (`chmod {missing} {folder}`: they can then open the files below it whose "
            "names they know, not list it)") if missing == "o+x"
           else f"let other accounts read it (`chmod {missing} {folder}`)")
    return (f"the learners' accounts cannot reach {what} ({Path(path).resolve()}): {folder} is {mode}, and every "
            f"learner's server runs as its own account. Either {let}, or clone the course to a shared place such "
            "as /srv/pytorch-in-depth, run `make setup` there and start the room from that folder.")


# --- the learners' own passwords ------------------------------------------------------------------


class Claims:
    """Names taken in the room, each with its learner's own password (scrypt), in one JSON file (mode
    600). The room password lets a learner take a free name once; after that only their own password
    opens it, so that nobody can sign in as someone else with the room password."""

    N, R, P = 2**14, 8, 1  # scrypt: 16 MiB, a few tens of milliseconds per check
    _thread_lock = threading.Lock()  # the hub checks passwords in threads: one change of the file at a time

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @contextlib.contextmanager
    def _changing(self):
        """The file to ourselves while it is read, changed and written back: a whole room signing in at
        once must not lose a name (the hub's threads, and any other process, such as `--release`)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._thread_lock:
            fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, dict[str, str]]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    @classmethod
    def _hash(cls, password: str, salt: bytes) -> bytes:
        return hashlib.scrypt(password.encode(), salt=salt, n=cls.N, r=cls.R, p=cls.P, dklen=32)

    def taken(self, name: str) -> bool:
        return name in self._load()

    def names(self) -> list[str]:
        return sorted(self._load())

    def claim(self, name: str, password: str) -> None:
        """Give `name` the password `password`; ValueError if the name is taken."""
        salt = secrets.token_bytes(16)
        entry = {"salt": salt.hex(), "scrypt": self._hash(password, salt).hex(),
                 "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with self._changing():
            data = self._load()
            if name in data:
                raise ValueError(f"the name {name!r} is taken")
            data[name] = entry
            self._save(data)

    def verify(self, name: str, password: str) -> bool:
        entry = self._load().get(name)
        if not isinstance(entry, dict):
            return False
        try:
            salt, want = bytes.fromhex(entry["salt"]), bytes.fromhex(entry["scrypt"])
        except (KeyError, ValueError, TypeError):
            return False
        return hmac.compare_digest(self._hash(password, salt), want)

    def release(self, name: str) -> bool:
        """Forget `name`'s password (the learner takes the name again with the room password; their
        account and files stay). Returns whether it was taken."""
        with self._changing():
            data = self._load()
            if data.pop(name, None) is None:
                return False
            self._save(data)
            return True


# --- accounts ------------------------------------------------------------------------------------


_accounts_lock = threading.Lock()  # useradd, groupadd and userdel lock /etc/passwd: one at a time, not a failed try


def _run(cmd: list[str]) -> None:
    with _accounts_lock:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")


def in_group(entry: pwd.struct_passwd, group: str) -> bool:
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return False
    return entry.pw_gid == g.gr_gid or entry.pw_name in g.gr_mem


def ensure_account(account: str, group: str = GROUP, home_base: str = "/home") -> pwd.struct_passwd:
    """The system account `account`, created if it does not exist (its own group, a member of `group`,
    a home of its own with mode 700). An existing account is used only if it is a learner's (in
    `group`, uid >= 1000): the room never starts a server as a system or personal account."""
    try:
        grp.getgrnam(group)
    except KeyError:
        with contextlib.suppress(RuntimeError):  # created meanwhile by another sign-in
            _run(["groupadd", group])
        grp.getgrnam(group)
    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        home = Path(home_base) / account
        _run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group",
              "--groups", group, "--comment", "pytorch-in-depth learner", account])
        entry = pwd.getpwnam(account)
    if entry.pw_uid < MIN_UID or not in_group(entry, group):
        raise PermissionError(f"the system account {account!r} exists and is not a learner's account (group "
                              f"{group!r}, uid >= {MIN_UID}); the room will not start a server as it")
    home = Path(entry.pw_dir)
    if not home.is_dir():
        home.mkdir(mode=0o700, parents=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)  # other learners cannot list or read it
    return entry


def remove_account(account: str, group: str = GROUP) -> bool:
    """Delete a learner's account, its home and its files in /tmp (only an account in `group`). Returns
    whether it existed."""
    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        return False
    if entry.pw_uid < MIN_UID or not in_group(entry, group):
        raise PermissionError(f"{account!r} is not a learner's account; not removing it")
    stop_processes(entry.pw_uid)
    home = Path(entry.pw_dir)
    if home.is_dir() and home.stat().st_uid == entry.pw_uid:  # their home, with its copy of the course
        shutil.rmtree(home)
    remove_temporary_files(entry.pw_uid)
    _run(["userdel", account])
    return True


def remove_temporary_files(uid: int, folder: str = "/tmp") -> list[str]:
    """Remove the entries of `folder` that `uid` owns (PyTorch's ``torchinductor_<name>`` folder, what a
    kernel left there): userdel leaves them, owned by a number that the next account made may be given.
    Returns their names."""
    if uid < MIN_UID:
        raise ValueError(f"uid {uid} is a system account's; refusing to remove its files")
    removed = []
    with os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.name)
    return sorted(removed)


def processes_of(uid: int) -> list[int]:
    """The processes running as `uid` (from /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid == uid:
                found.append(int(entry.name))
    return found


def stop_processes(uid: int, grace_s: float = 5.0) -> list[int]:
    """Stop every process of `uid` (a learner's account runs nothing but its server, its kernels and
    what they started): SIGTERM, then SIGKILL after `grace_s`. Returns the pids that were running."""
    if uid < MIN_UID:
        raise ValueError(f"uid {uid} is a system account's; refusing to stop its processes")
    pids = processes_of(uid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and processes_of(uid):
        time.sleep(0.1)
    for pid in processes_of(uid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and processes_of(uid):
        time.sleep(0.1)
    return pids


def make_password(words: int = 3) -> str:
    """A room password to write on a board: groups of 4 letters and digits without look-alikes."""
    alphabet = "abcdefghjkmnpqrstuvwxyz23456789"
    return "-".join("".join(secrets.choice(alphabet) for _ in range(4)) for _ in range(words))
