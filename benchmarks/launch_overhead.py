"""How long does one launch of a small 2-rank job take: plain torchrun, and the course's torchrun()
on each of its engines (torchrun, and ranks forked from the warm server)?

Runs notebooks/scripts/hello_dist.py (set-up, one all_reduce, tear-down) each way, interleaved in a
rotating order (A B C D, B C D A, ...) so that load from other programs hits all alike, and prints
the medians and the ratio of the warm engine to plain torchrun. A fourth row times
``python -c "import torch"``: the start-up that every process of a torchrun job pays.

    python benchmarks/launch_overhead.py [--runs 7] [--nproc 2] [--save-reference]

torch is imported in this process before timing (a notebook has it already), and the warm server
is started by an untimed first launch (a kernel pays that once). ``--save-reference`` writes
data/launch_reference.json (chapter 04 quotes it), and refuses to on a busy machine (the load
average after the runs is mostly the benchmark's own jobs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.device import cpu_cores  # noqa: E402
from course_utils.launch import torchrun  # noqa: E402

REFERENCE = ROOT / "data" / "launch_reference.json"
LABELS = {
    "plain": "python -m torch.distributed.run",
    "torchrun": 'torchrun(..., engine="torchrun")',
    "warm": 'torchrun(..., engine="warm")',
    "import": 'python -c "import torch"',
}


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=600)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {done.returncode}")
    return elapsed


def runner(name: str, script: str, nproc: int, cwd: Path):
    """A function that runs the job one way and returns its seconds."""
    if name == "plain":  # as a learner would type it
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), script]
        return lambda: _timed(cmd, cwd)
    if name == "import":
        return lambda: _timed([sys.executable, "-c", "import torch"], cwd)

    def ours() -> float:
        t0 = time.perf_counter()
        torchrun(script, nproc=nproc, timeout=600, show=False, cwd=cwd, engine=name)
        return time.perf_counter() - t0

    return ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each (default 7)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--script", default="scripts/hello_dist.py", help="relative to notebooks/")
    parser.add_argument("--save-reference", action="store_true", help=f"write {REFERENCE.name}")
    opts = parser.parse_args(argv)
    if opts.runs < 5:
        parser.error("--runs must be at least 5")
    cores, load0 = cpu_cores(), os.getloadavg()[0]
    if opts.save_reference and load0 > 0.3 * cores:
        parser.error(f"load average {load0:.2f} on {cores} cores: not a quiet machine; "
                     "wait until `uptime` shows it idle to save a reference")
    cwd = ROOT / "notebooks"
    import course_utils.dist  # noqa: F401  (imports torch, as a notebook already has)

    print(f"{opts.nproc}-rank job {opts.script}, {opts.runs} runs each, interleaved, "
          f"{cores} CPU cores, load average before: {load0:.2f}", flush=True)
    runs = {name: runner(name, opts.script, opts.nproc, cwd) for name in LABELS}
    for run in runs.values():  # warm-up (file caches, the warm server), not counted
        run()
    times: dict[str, list[float]] = {name: [] for name in LABELS}
    names = list(LABELS)
    for i in range(opts.runs):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            times[name].append(runs[name]())
        print(f"  run {i + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names), flush=True)
    load1 = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{'launch':34s} {'median s':>8s} {'min s':>6s} {'max s':>6s}")
    for k, v in times.items():
        print(f"{LABELS[k]:34s} {med[k]:8.2f} {min(v):6.2f} {max(v):6.2f}")
    ratio = med["warm"] / med["plain"]
    print(f"warm engine / plain torchrun: {ratio:.3f}x ({1 / ratio:.0f} times faster); "
          f"torchrun engine / plain: {med['torchrun'] / med['plain']:.2f}x; "
          f"load average after: {load1:.2f}")
    if opts.save_reference:
        record = {
            "what": f"seconds for one launch of {opts.script} on {opts.nproc} ranks "
                    "(benchmarks/launch_overhead.py), medians of interleaved runs",
            "machine": {
                "cores": cores, "system": f"{platform.system()} {platform.machine()}",
                "python": platform.python_version(), "torch": __import__("torch").__version__,
                "load_average_before": round(load0, 2), "load_average_after": round(load1, 2),
                "date": datetime.date.today().isoformat(),
            },
            "runs": opts.runs,
            "median_s": {k: round(v, 3) for k, v in med.items()},
            "labels": LABELS,
        }
        REFERENCE.write_text(json.dumps(record, indent=1) + "\n")
        print(f"saved {REFERENCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
