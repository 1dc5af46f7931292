"""The torchrun engine: PyTorch's own launcher, ``torch.distributed.run``, in a session of its own
(the contract is ``engine.Engine``), started through ``agent.py``, which also writes what torchrun's
agent knows of the failed ranks to a report; its printed summary of them stays the fallback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from . import processes
from .engine import JOB_VAR, Exits, Job

REPORT = "failures.json"  # in the job's log folder


class Torchrun:
    """``python -m torch.distributed.run --standalone`` on the job (see ``engine.Engine``)."""

    name = "torchrun"

    def __init__(self, job: Job) -> None:
        self.job, self.proc, self.since = job, None, None

    def command(self) -> list[str]:
        """The launcher's command line (--standalone: the rendezvous on a port the system picks)."""
        job = self.job
        opts = f"--standalone --nnodes 1 --nproc-per-node {job.nproc} --max-restarts {job.restarts} "
        opts += "--redirects 3 --shutdown-timeout 5"
        cmd = [sys.executable, "-m", "course_utils.launch.agent", str(job.logs / REPORT), *opts.split()]
        return [*cmd, "--log-dir", str(job.logs / "torchrun"), job.script, *job.argv]

    def start(self, deadline: float) -> None:
        env = dict(self.job.env)
        if self.job.restarts > 0:
            # Restarted ranks otherwise read the previous attempt's keys from the shared rendezvous
            # store and fail to connect or hang (pytorch/pytorch#135712).
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        with open(self.job.logs / "launcher.log", "wb") as out:
            kw = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": subprocess.STDOUT}
            self.proc = subprocess.Popen(processes.with_parent_death_signal(self.command()),
                                         cwd=self.job.cwd, env=env, start_new_session=True, **kw)
        self.since = processes.started(self.proc.pid)  # the job's processes start from then on

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, seconds: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(seconds)

    def attempt_dirs(self) -> dict[int, Path]:
        folders = (self.job.logs / "torchrun").glob("*/attempt_*")
        return {int(d.name[8:]): d for d in folders if d.name[8:].isdigit()}

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return (self.job.logs / "launcher.log").read_text(errors="replace")
        return ""

    def failures(self) -> Exits:
        """From the agent's report; from its printed summary where there is none."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            report = json.loads((self.job.logs / REPORT).read_text())
            ranks = report["failures"]
            codes = {int(r): int(f["exit_code"]) for r, f in ranks.items()}
            files = {int(r): Path(f["error_file"]) for r, f in ranks.items() if f["error_file"]}
            return Exits(codes, report["first"], files)
        return summary_exits(self.output())

    def pids(self) -> set[int]:
        """Live processes of the job (workers run in sessions of their own: the launcher's process
        group misses them). Linux: those whose environment holds its JOB_VAR (a zombie's shows
        none), orphans too. Elsewhere: the launcher's descendants, as ``ps`` lists them."""
        if processes.HAS_PROC:
            return processes.find(f"{JOB_VAR}={self.job.job_id}", since=self.since)
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
        if self.proc is None:
            return
        if os.name != "posix":  # pragma: no cover - the course runs on Linux and macOS
            self.proc.kill()
            return
        launcher = {self.proc.pid} if self.poll() is None else set()  # not reaped yet
        processes.stop(self.pids, launcher, self.poll, hurry)  # (poll reaps the launcher)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def summary_exits(launcher_text: str) -> Exits:
    """The exits that torchrun's printed failure summary lists (the fallback of its report)."""
    head, sep, tail = launcher_text.rpartition("Root Cause")
    codes = {int(m[1]): int(m[2]) for m in _FAILURE.finditer(head if sep else launcher_text)}
    first = None
    if sep and (m := _FAILURE.search(tail)):
        first, codes[int(m[1])] = int(m[1]), int(m[2])
    return Exits(codes, first)
