"""How much does course_utils.launch.torchrun() cost over plain `python -m torch.distributed.run`?

Runs the same trivial 2-rank job (notebooks/scripts/hello_dist.py: set-up, one all_reduce,
tear-down) both ways, interleaved (A B, B A, ...) so that load from other programs hits
both alike, and prints the medians and the overhead in percent: of the wall time, and of
the CPU time used (this process + all the job's processes), which other programs' load on
a shared machine disturbs much less than the wall time.

    python benchmarks/launch_overhead.py [--runs 7] [--nproc 2] [--script scripts/hello_dist.py]

torch is imported in this process before timing (a notebook has it already), so both
timings are the cost of one launch: launcher start, rendezvous, ranks' ``import torch``,
the job, shut-down (and, for torchrun(), watching the logs and checking for leftovers).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.launch import torchrun  # noqa: E402


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (and theirs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def plain(script: str, nproc: int, cwd: Path) -> float:
    """`python -m torch.distributed.run --standalone` as a learner would type it; seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), script]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=600)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"plain torchrun failed with exit code {done.returncode}")
    return elapsed


def ours(script: str, nproc: int, cwd: Path) -> float:
    """course_utils.launch.torchrun(); seconds from the call to its return."""
    t0 = time.perf_counter()
    torchrun(script, nproc=nproc, timeout=600, show=False, cwd=cwd)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each (default 7)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--script", default="scripts/hello_dist.py", help="relative to notebooks/")
    opts = parser.parse_args(argv)
    if opts.runs < 5:
        parser.error("--runs must be at least 5")
    cwd = ROOT / "notebooks"
    import course_utils.dist  # noqa: F401  (imports torch, as a notebook already has)

    print(f"{opts.nproc}-rank job {opts.script}, {opts.runs} runs each, interleaved, "
          f"{os.cpu_count()} CPU cores, load average before: {os.getloadavg()[0]:.2f}", flush=True)
    plain(opts.script, opts.nproc, cwd)  # warm-up (file caches), not counted
    ours(opts.script, opts.nproc, cwd)
    times: dict[str, list[float]] = {"plain": [], "torchrun()": []}
    cpus: dict[str, list[float]] = {"plain": [], "torchrun()": []}
    for i in range(opts.runs):
        order = [("plain", plain), ("torchrun()", ours)]
        if i % 2:
            order.reverse()
        for name, fn in order:
            c0 = cpu_seconds()
            times[name].append(fn(opts.script, opts.nproc, cwd))
            cpus[name].append(cpu_seconds() - c0)
        print(f"  run {i + 1}: plain {times['plain'][-1]:.2f} s (CPU {cpus['plain'][-1]:.2f} s), "
              f"torchrun() {times['torchrun()'][-1]:.2f} s (CPU {cpus['torchrun()'][-1]:.2f} s)",
              flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpus.items()}
    print(f"\n{'launcher':34s} {'median s':>8s} {'min s':>6s} {'max s':>6s} {'CPU s':>6s}")
    labels = {"plain": "python -m torch.distributed.run", "torchrun()": "course_utils.launch.torchrun()"}
    for k, v in times.items():
        print(f"{labels[k]:34s} {med[k]:8.2f} {min(v):6.2f} {max(v):6.2f} {cmed[k]:6.2f}")
    overhead = 100.0 * (med["torchrun()"] - med["plain"]) / med["plain"]
    cpu_overhead = 100.0 * (cmed["torchrun()"] - cmed["plain"]) / cmed["plain"]
    print(f"overhead of torchrun(): wall {med['torchrun()'] - med['plain']:+.2f} s ({overhead:+.1f}%), "
          f"CPU {cmed['torchrun()'] - cmed['plain']:+.2f} s ({cpu_overhead:+.1f}%) "
          f"(target: within 10%); load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
