"""A real Slurm cluster of two emulated nodes on this one machine, started and stopped by the tests.

Debian's Slurm (``slurm-wlm``, with ``munge``) can run several node daemons on one host. Everything
(configuration, munge key and socket, state, spool, logs) lives in one temporary folder, and every
daemon runs in the foreground as a child of this process, in a process group of its own, so that
:func:`cluster` stops all of them (and whatever a job left) on the way out.

    with cluster() as c:
        job = c.submit(["scripts/slurm_ddp.sbatch"], cwd="notebooks", env={...})
        state, output = c.wait(job, timeout=300)
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def missing_programs() -> list[str]:
    """The programs of the Slurm lane that this machine lacks (``apt-get install slurm-wlm munge``)."""
    return [p for p in DAEMONS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Cluster:
    dir: Path
    host: str
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return [self.host, f"{self.host}-2"]

    def run(self, args: Sequence[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([_exe(args[0]), *args[1:]], env={**os.environ, **self.env, **kw.pop("env", {})},
                              capture_output=True, text=True, timeout=timeout, **kw)

    def start_daemon(self, args: Sequence[str], log: str) -> None:
        out = open(self.dir / log, "w")  # noqa: SIM115 (the daemon owns it)
        self.procs.append(subprocess.Popen([_exe(args[0]), *args[1:]], env={**os.environ, **self.env},
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def wait_idle(self, timeout: float = 60) -> None:
        """Until both nodes report idle (the controller has heard from both node daemons)."""
        deadline, states = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            self.check_alive()
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
            states = r.stdout.strip()
            if r.returncode == 0 and states.count("idle") == len(self.nodes):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes did not become idle in {timeout:.0f} s: {states!r}\n{self.logs()}")

    def check_alive(self) -> None:
        dead = [p.args[0] for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a Slurm daemon exited: {dead}\n{self.logs()}")

    def submit(self, argv: Sequence[str], cwd: str | os.PathLike, env: Mapping[str, str] | None = None) -> str:
        r = self.run(["sbatch", "--parsable", *argv], cwd=cwd, env=dict(env or {}))
        if r.returncode != 0:
            raise RuntimeError(f"sbatch refused the job: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        r = self.run(["scontrol", "show", "job", "-o", job_id])
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def wait(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """The job's fields once it has finished (``sbatch --wait`` polls too slowly: 2, 8, 32 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            info = self.job(job_id)
            if info.get("JobState") in FINISHED:
                return info
            time.sleep(0.5)
        self.run(["scancel", job_id])
        raise TimeoutError(f"job {job_id} did not finish in {timeout:.0f} s: {self.job(job_id)}")

    def logs(self) -> str:
        parts = []
        for f in sorted(self.dir.glob("*.log")):
            parts.append(f"--- {f.name} (last lines)\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


@contextlib.contextmanager
def cluster(host: str | None = None) -> Iterator[Cluster]:
    """Start munged, slurmctld and two slurmd (nodes ``HOST`` and ``HOST-2``); stop them all afterwards."""
    missing = missing_programs()
    if missing:
        raise RuntimeError(f"the Slurm lane needs {', '.join(missing)}: apt-get install slurm-wlm munge")
    host = host or socket.gethostname().split(".")[0]
    folder = Path(tempfile.mkdtemp(prefix="slurm-"))
    folder.chmod(0o700)
    ctld_port, port1, port2 = _free_ports(3)
    conf = (HERE / "slurm.conf.in").read_text().format(dir=folder, host=host, user=getpass.getuser(),
                                                       ctld_port=ctld_port, port1=port1, port2=port2)
    (folder / "slurm.conf").write_text(conf)
    (folder / "state").mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    c = Cluster(folder, host, {"SLURM_CONF": str(folder / "slurm.conf")})
    try:
        c.start_daemon(["munged", "-F", "--force", f"--socket={folder}/munge.socket", f"--key-file={key}",
                        f"--pid-file={folder}/munged.pid", f"--seed-file={folder}/munged.seed",
                        f"--log-file={folder}/munged.log"], "munged.out")
        deadline = time.monotonic() + 20
        while not (folder / "munge.socket").exists() and time.monotonic() < deadline:
            c.check_alive()
            time.sleep(0.1)
        c.start_daemon(["slurmctld", "-D", "-i"], "slurmctld.out")
        for node in c.nodes:
            c.start_daemon(["slurmd", "-D", "-N", node], f"slurmd-{node}.out")
        c.wait_idle()
        yield c
    finally:
        c.stop()
        shutil.rmtree(folder, ignore_errors=True)
