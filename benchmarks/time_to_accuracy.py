"""Time-to-accuracy of chapter 05's training script: how long until the test accuracy reaches 97%?

Runs ``notebooks/scripts/train.py`` (default configuration unless you pass flags after ``--``)
on N ranks through ``course_utils.launch.torchrun``, with ``--test-every-epoch`` so that the
test accuracy is known after each epoch, and reads the metrics file it writes. Prints, per run:

- time to target: training seconds (wall clock, from the first step, evaluation and
  checkpoints included) until the first epoch whose test accuracy reaches the target;
- the same in CPU seconds of rank 0 (its training loops only): on a busy machine the wall
  clock counts other people's programs too, and CPU time is what an idle machine would take;
- samples/s: training images per second of training loop, over all ranks;
- the final test accuracy, and the wall time of the whole launch (start-up included).

    python benchmarks/time_to_accuracy.py [--runs 3] [--nproc 2] [--target 0.97] [--budget 15] [-- FLAGS]

Exit status 0 when the median time to target is within the budget, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.ch05_full_pipeline import read_metrics  # noqa: E402
from course_utils.launch import torchrun  # noqa: E402

SCRIPT = "scripts/train.py"


def one_run(nproc: int, target: float, extra: list[str]) -> dict:
    """Train once in a fresh folder; the figures of that run."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        torchrun(SCRIPT, nproc=nproc, args=["--out-dir", tmp, "--no-progress", "--test-every-epoch", *extra],
                 timeout=900, show=False, cwd=ROOT / "notebooks")
        wall = time.perf_counter() - t0
        rows = read_metrics(Path(tmp) / "metrics.jsonl")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    hit = next((r for r in rows if r["test_acc"] >= target), None)
    seen = summary["train_samples"] * summary["epochs"]  # images trained on, all ranks together
    return {
        "rows": rows,
        "epoch": hit["epoch"] if hit else None,
        "tta_s": hit["elapsed_s"] if hit else float("inf"),
        "tta_cpu_s": hit["train_cpu_s"] if hit else float("inf"),
        "final_acc": summary["test_acc"],
        "train_s": summary["train_s"],
        "samples_per_s": summary["samples_per_s"],
        "samples_per_cpu_s": seen / rows[-1]["train_cpu_s"],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--target", type=float, default=0.97, help="test accuracy to reach (default 0.97)")
    p.add_argument("--budget", type=float, default=15.0, help="seconds allowed to reach it (default 15)")
    opts = p.parse_args(argv)

    print(f"train.py {' '.join(extra) or '(default configuration)'} on {opts.nproc} ranks, "
          f"{os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.1f}")
    runs = []
    for i in range(opts.runs):
        r = one_run(opts.nproc, opts.target, extra)
        runs.append(r)
        if i == 0:
            print(f"{'epoch':>5} {'test acc':>9} {'elapsed s':>10} {'rank-0 CPU s':>13} {'samples/s':>10}")
            for row in r["rows"]:
                print(f"{row['epoch']:>5} {100 * row['test_acc']:>8.2f}% {row['elapsed_s']:>10.2f} "
                      f"{row['train_cpu_s']:>13.2f} {row['samples_per_s']:>10.0f}")
        reached = f"epoch {r['epoch']}" if r["epoch"] else "never"
        print(f"run {i + 1}: {100 * opts.target:.0f}% reached at {reached}: {r['tta_s']:.2f} s wall "
              f"({r['tta_cpu_s']:.2f} CPU s of rank 0); final test accuracy {100 * r['final_acc']:.2f}%; "
              f"{r['samples_per_s']:.0f} samples/s ({r['samples_per_cpu_s']:.0f} per CPU s); "
              f"whole launch {r['wall_s']:.1f} s")
    tta = statistics.median(r["tta_s"] for r in runs)
    cpu = statistics.median(r["tta_cpu_s"] for r in runs)
    sps = statistics.median(r["samples_per_s"] for r in runs)
    ok = tta <= opts.budget
    print(f"median time to {100 * opts.target:.0f}% test accuracy: {tta:.2f} s wall, {cpu:.2f} CPU s "
          f"(budget {opts.budget:g} s: {'PASS' if ok else 'FAIL'}); median {sps:.0f} samples/s; "
          f"load average after: {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
