#!/usr/bin/env python3
"""DataLoader throughput against num_workers on this machine: the curve behind chapter 03.

    python benchmarks/loader_throughput.py                        # the curve, in steady state
    python benchmarks/loader_throughput.py --workers 0,2 --repeats 3   # a quick look
    python benchmarks/loader_throughput.py --plot curve.png       # also save the curve
    python benchmarks/loader_throughput.py --grid                 # also persistent_workers x prefetch_factor
    python benchmarks/loader_throughput.py --save-reference       # store the reference curve of chapter 03

The data set is ``course_utils.ch03_data_loading.SyntheticImages``: JPEG images generated on the fly
(deterministic per index), decoded, resized and normalised per item, so the work per item
resembles a real image pipeline. The defaults are the notebook's settings, so that the two
curves can be compared.

The curve is measured in steady state (``course_utils.ch03_data_loading.measure_throughput``): for
each ``num_workers``, one warm-up epoch whose first batch gives the start-up time (reported on its
own), then ``--repeats`` timed epochs with persistent workers; the table shows the median epoch
and how much the repeats disagreed. The "once" column checks that every epoch delivered every
image exactly once. ``--grid`` adds whole epochs, start-up included, for ``persistent_workers``
off and on and each ``prefetch_factor`` in ``--prefetch``.

Measure on an otherwise idle machine: when other programs keep the cores busy (load average
above the number of cores; the script prints it before and after), more worker processes simply
win a larger share of the CPU from them, and the curve keeps rising past the core count. So
``--save-reference`` refuses to store a curve measured with a load above the core count, unless
``--force`` is given; the stored file then says so (``"quiet": false``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch  # noqa: E402

from course_utils.ch03_data_loading import (
    REFERENCE_PATH,
    LoaderRun,
    SyntheticImages,
    curve_summary,
    format_runs,
    measure_throughput,
)
from course_utils.device import busy_warning, cpu_cores, load_average


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def grid(workers: list[int], prefetch: list[int]) -> list[tuple[int, bool, int | None]]:
    """The configurations of ``--grid``: (num_workers, persistent_workers, prefetch_factor)."""
    configs: list[tuple[int, bool, int | None]] = []
    for w in workers:
        if w == 0:
            configs.append((0, False, None))
            continue
        for persistent in (False, True):
            for pf in prefetch:
                configs.append((w, persistent, pf))
    return configs


def reference_record(runs: list[LoaderRun], settings: dict, load_before: float | None,
                     load_after: float | None, busy: bool) -> dict:
    """The JSON record of a reference curve: the machine, the load, the settings and the points."""
    return {
        "what": "DataLoader steady-state throughput against num_workers (benchmarks/loader_throughput.py)",
        "machine": {
            "cores": cpu_cores(),
            "processor": platform.processor() or platform.machine(),
            "system": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "torch": torch.__version__.split("+")[0],
            "load_average_before": None if load_before is None else round(load_before, 2),
            "load_average_after": None if load_after is None else round(load_after, 2),
            "quiet": not busy,
            "date": datetime.date.today().isoformat(),
        },
        "settings": settings,
        "points": [
            {"num_workers": r.num_workers, "images_per_s": round(r.items_per_s, 1),
             "first_batch_s": round(r.first_batch_s, 3), "epoch_seconds": [round(s, 4) for s in r.epoch_seconds]}
            for r in runs
        ],
    }


def _load_text(load: float | None, cores: int) -> str:
    return "no load average on this system" if load is None else f"load average {load:.2f} on {cores} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=_ints, default=[0, 1, 2, 4, 8], help="num_workers values (default 0,1,2,4,8)")
    parser.add_argument("--items", type=int, default=128, help="images per epoch (default 128, as in the notebook)")
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs per setting, after a warm-up (default 5)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=256, help="side of the encoded JPEG (default 256)")
    parser.add_argument("--out-size", type=int, default=128, help="side after resizing (default 128)")
    parser.add_argument("--timeout", type=float, default=120.0, help="DataLoader timeout in seconds")
    parser.add_argument("--plot", type=Path, help="also save the curve to this PNG")
    parser.add_argument("--grid", action="store_true", help="also measure persistent_workers x prefetch_factor")
    parser.add_argument("--prefetch", type=_ints, default=[2, 4], help="prefetch_factor values of --grid (default 2,4)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per configuration of --grid (default 2)")
    parser.add_argument("--save-reference", nargs="?", const=REFERENCE_PATH, type=Path, metavar="JSON",
                        help="store the curve as the notebook's reference "
                             f"(default {REFERENCE_PATH.relative_to(REFERENCE_PATH.parents[1])})")
    parser.add_argument("--force", action="store_true", help="store a reference even when the machine is busy")
    args = parser.parse_args(argv)
    if any(w < 0 for w in args.workers) or any(p < 1 for p in args.prefetch) or args.repeats < 1:
        parser.error("num_workers must be >= 0, prefetch_factor >= 1 and --repeats >= 1")

    ds = SyntheticImages(args.items, size=args.size, out_size=args.out_size)
    cores = cpu_cores()
    print(
        f"machine: {platform.machine()} {platform.system()}, {cores} CPU cores usable; "
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads in the main process"
    )
    print(
        f"data: {args.items} synthetic JPEGs {args.size}x{args.size} -> "
        f"decode, resize {args.out_size}x{args.out_size}, "
        f"normalise; batch {args.batch_size}; a warm-up epoch then {args.repeats} timed epochs per setting"
    )
    print(f"the source's rule 'num_workers = 2-4x cores' means {2 * cores}-{4 * cores} here")
    before = load_average()
    print(f"before: {_load_text(before, cores)}", flush=True)
    if args.save_reference and before is not None and before > cores and not args.force:
        print(f"\nnot measuring a reference: {busy_warning(before, cores)}\n"
              "Wait for an idle machine, or pass --force to store it anyway, labelled as busy.", file=sys.stderr)
        return 2
    print()

    runs: list[LoaderRun] = []
    with warnings.catch_warnings():
        # torch warns when num_workers exceeds the cores it counts; the table shows the effect instead
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        for w in args.workers:
            runs.append(measure_throughput(ds, w, batch_size=args.batch_size, epochs=args.repeats,
                                           timeout=args.timeout))
            table = format_runs(runs).splitlines()
            print("\n".join(table if len(runs) == 1 else table[-1:]), flush=True)
        grid_runs: list[LoaderRun] = []
        if args.grid:
            print(f"\nwhole epochs, start-up included ({args.epochs} per configuration):")
            print(f"{'workers':>7} {'persistent':>10} {'prefetch':>8}  once  seconds of each epoch")
            for w, persistent, pf in grid(args.workers, args.prefetch):
                kw = {"persistent_workers": persistent, "prefetch_factor": pf} if w else {}
                r = measure_throughput(ds, w, batch_size=args.batch_size, epochs=args.epochs, warm_up=False,
                                       timeout=args.timeout, **kw)
                grid_runs.append(r)
                pers, pf_text = ("yes" if persistent else "no", str(pf)) if w else ("-", "-")
                print(f"{w:>7} {pers:>10} {pf_text:>8} {'yes' if r.each_item_once else 'NO':>5}  "
                      + ", ".join(f"{t:.3f}" for t in r.epoch_seconds), flush=True)

    after = load_average()
    print(f"\nafter: {_load_text(after, cores)}\n")
    print(curve_summary(runs, cores, max(x for x in (before, after, 0.0) if x is not None)))

    status = 0 if all(r.each_item_once for r in runs) and all(r.each_item_once for r in grid_runs) else 1
    if args.save_reference:
        busy = any(x is not None and x > cores for x in (before, after))
        if busy and not args.force:
            print(f"\nnot stored: the load rose above {cores} during the run. Measure again on an idle machine, "
                  "or pass --force.", file=sys.stderr)
            return 2
        settings = {"items": args.items, "size": args.size, "out_size": args.out_size, "batch_size": args.batch_size,
                    "repeats": args.repeats, "warm_up_epochs": 1, "persistent_workers": True}
        record = reference_record(runs, settings, before, after, busy=busy)
        args.save_reference.parent.mkdir(parents=True, exist_ok=True)
        args.save_reference.write_text(json.dumps(record, indent=1) + "\n")
        print(f"\nreference stored in {args.save_reference}"
              + (" (labelled as measured on a BUSY machine)" if busy else ""))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from course_utils.ch03_data_loading import plot_curves

        ref = json.loads(REFERENCE_PATH.read_text()) if REFERENCE_PATH.exists() and not args.save_reference else None
        fig = plot_curves(runs, cores, ref)
        fig.savefig(args.plot, dpi=100, bbox_inches="tight")
        plt.close(fig)
        print(f"curve saved to {args.plot}")
    return status


if __name__ == "__main__":
    sys.exit(main())
