#!/usr/bin/env python3
"""DataLoader throughput on this machine: the table behind chapter 03's curve.

    python benchmarks/loader_throughput.py                  # the full grid (about a minute on 2 cores)
    python benchmarks/loader_throughput.py --workers 0,2 --items 128   # a quick look
    python benchmarks/loader_throughput.py --plot curve.png            # also save the curve

The data set is ``course_utils.loading.SyntheticImages``: JPEG images generated
on the fly (deterministic per index), decoded, resized and normalised per item,
so the work per item resembles a real image pipeline. Every configuration runs
``--epochs`` epochs from a fresh loader; the clock includes starting the workers,
which is what ``persistent_workers`` saves from the second epoch on. The grid:
``num_workers`` in --workers; for each value above 0, ``persistent_workers``
off and on, and each ``prefetch_factor`` in --prefetch. The "once" column checks
that every epoch delivered every image exactly once.

Measure on an otherwise idle machine: when other programs keep the cores busy (the
script prints the load average before and after), more worker processes simply win a
larger share of the CPU from them, and the curve keeps rising past the core count.
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch  # noqa: E402

from course_utils.loading import (  # noqa: E402
    LoaderRun,
    SyntheticImages,
    cpu_cores,
    cpu_load,
    format_runs,
    measure_throughput,
)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def grid(workers: list[int], prefetch: list[int]) -> list[tuple[int, bool, int | None]]:
    """The configurations to measure: (num_workers, persistent_workers, prefetch_factor)."""
    configs: list[tuple[int, bool, int | None]] = []
    for w in workers:
        if w == 0:
            configs.append((0, False, None))
            continue
        for persistent in (False, True):
            for pf in prefetch:
                configs.append((w, persistent, pf))
    return configs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=_ints, default=[0, 1, 2, 4, 8], help="num_workers values (default 0,1,2,4,8)")
    parser.add_argument("--prefetch", type=_ints, default=[2, 4], help="prefetch_factor values (default 2,4)")
    parser.add_argument("--items", type=int, default=256, help="images per epoch (default 256)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per configuration (default 2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=256, help="side of the encoded JPEG (default 256)")
    parser.add_argument("--out-size", type=int, default=128, help="side after resizing (default 128)")
    parser.add_argument("--timeout", type=float, default=120.0, help="DataLoader timeout in seconds")
    parser.add_argument("--plot", type=Path, help="also save the throughput curve to this PNG")
    args = parser.parse_args(argv)
    if any(w < 0 for w in args.workers) or any(p < 1 for p in args.prefetch):
        parser.error("num_workers must be >= 0 and prefetch_factor >= 1")

    ds = SyntheticImages(args.items, size=args.size, out_size=args.out_size)
    cores = cpu_cores()
    print(
        f"machine: {platform.machine()} {platform.system()}, {cores} CPU cores usable; "
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads in the main process"
    )
    print(
        f"data: {args.items} synthetic JPEGs {args.size}x{args.size} -> decode, resize {args.out_size}x{args.out_size}, "
        f"normalise; batch {args.batch_size}; {args.epochs} epochs per row"
    )
    print(f"the source's rule 'num_workers = 2-4x cores' means {2 * cores}-{4 * cores} here")
    print(f"before: {cpu_load() or 'no load average on this system'}\n", flush=True)

    runs: list[LoaderRun] = []
    with warnings.catch_warnings():
        # torch warns when num_workers exceeds the cores it counts; the table shows the effect instead
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        for w, persistent, pf in grid(args.workers, args.prefetch):
            runs.append(
                measure_throughput(
                    ds, w, batch_size=args.batch_size, epochs=args.epochs,
                    persistent_workers=persistent, prefetch_factor=pf, timeout=args.timeout,
                )
            )
            print(format_runs(runs).splitlines()[-1] if len(runs) > 1 else format_runs(runs), flush=True)

    print(f"after: {cpu_load() or 'no load average on this system'}")
    print("\nsorted by images/s:")
    print(format_runs(sorted(runs, key=lambda r: -r.items_per_s), baseline=runs[0].items_per_s if runs[0].num_workers == 0 else None))
    best = max(runs, key=lambda r: r.items_per_s)
    print(
        f"\nbest: num_workers={best.num_workers}, persistent_workers={best.persistent_workers}, "
        f"prefetch_factor={best.prefetch_factor} at {best.items_per_s:.1f} images/s ({cores} cores)."
    )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from course_utils.loading import plot_throughput

        ax = None
        for persistent in (False, True):
            pf = args.prefetch[0]
            curve = [r for r in runs if r.num_workers == 0 or (r.persistent_workers == persistent and r.prefetch_factor == pf)]
            ax = plot_throughput(curve, cores, ax=ax, label=f"persistent_workers={persistent}, prefetch_factor={pf}",
                                 marks=ax is None)
        plt.savefig(args.plot, dpi=100, bbox_inches="tight")
        print(f"curve saved to {args.plot}")
    return 0 if all(r.each_item_once for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
