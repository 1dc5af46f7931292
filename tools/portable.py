"""The portability lane: strict nbval of both editions as other computers would run them.

    python -m tools.portable                      # every level this computer can emulate
    python -m tools.portable --levels default,one-core [notebooks ...]

The stored outputs must come out the same on any CPU that runs the pinned stack. PyTorch picks its
CPU kernels by the processor's instruction set, and a float32 sum then adds in another order; the
random draws of ``torch.randn`` themselves differ in their last bits with and without AVX2. Each
level below emulates a kind of computer on this one, through the switches the libraries read:

- ``default``: a processor without vector extensions (an old or unusual CPU): ATen's
  ``ATEN_CPU_CAPABILITY=default``, oneDNN's ``ONEDNN_MAX_CPU_ISA=SSE41`` (convolutions change) and
  MKL's ``MKL_ENABLE_INSTRUCTIONS=SSE4_2``;
- ``avx2``: a processor with AVX2 but not AVX-512 (most laptops), the same three switches at AVX2;
- ``own``: this computer as it is (what ``make test`` runs);
- ``one-core``: this computer restricted to its first core (``os.sched_setaffinity``, as
  ``taskset -c 0``): PyTorch then runs one thread, and parallel reductions split their work otherwise.

A level above what the processor has cannot be forced (ATen falls back to what the CPU supports), so
it is skipped and said so; on a processor other than x86-64 the x86 switches mean nothing and only
``own`` and ``one-core`` run. The report names, per level, the cells whose output differed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import ROOT
from tools import lanes

X86 = platform.machine().lower() in ("x86_64", "amd64", "x86-64")


@dataclass(frozen=True)
class Level:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    one_core: bool = False
    about: str = ""


LEVELS = (
    Level("default", {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                      "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, about="no vector extensions"),
    Level("avx2", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                   "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, about="AVX2, no AVX-512"),
    Level("own", about="this computer as it is"),
    Level("one-core", one_core=True, about="this computer's first core only"),
)
NAMES = tuple(level.name for level in LEVELS)


def own_capability() -> str:
    """What ATen uses here unforced: "AVX512", "AVX2", "DEFAULT" (x86), or another platform's name."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                       capture_output=True, text=True, env=env, timeout=300)
    return r.stdout.strip() or "unknown"


def plan(names: list[str], own: str) -> list[tuple[Level, str | None]]:
    """The levels to run, each with None or the reason it is skipped."""
    rank = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}
    out = []
    for level in LEVELS:
        if level.name not in names:
            continue
        why = None
        if level.env and not X86:
            why = f"an x86 instruction-set level; this processor is {platform.machine()}"
        elif level.name == "avx2" and rank.get(own, -1) < 1:
            why = f"this processor has no AVX2 (ATen uses {own})"
        elif level.name == "avx2" and own == "AVX2":
            why = "the same as own here (this processor's level is AVX2)"
        elif level.one_core and not hasattr(os, "sched_setaffinity"):
            why = "this system cannot restrict a process to one core"
        out.append((level, why))
    return out


def cell_ids(nodeid: str) -> str:
    """"notebooks/02_nn_module.ipynb::Cell 46" -> the same with the cell's id, as in the notebook."""
    path, _, cell = nodeid.partition("::")
    try:
        number = int(cell.split()[-1])
        code = [c for c in json.loads((ROOT / path).read_text())["cells"] if c["cell_type"] == "code"]
        return f"{path} cell {number} ({code[number].get('id')})"
    except (ValueError, IndexError, OSError, KeyError):
        return nodeid


def run_level(level: Level, targets: list[str], workers: int) -> tuple[int, list[str], float]:
    """Strict nbval of `targets` at `level`; (pytest's exit code, the cells that differed, seconds)."""
    env = {**lanes.environment(lanes.LANES["test"]), **level.env}
    with tempfile.TemporaryDirectory(prefix="portable-") as tmp:
        junit = Path(tmp) / "report.xml"
        options = ("-p", "no:cacheprovider", "-q", "-rN", "-n", str(workers), "--dist", "loadfile",
                   f"--junitxml={junit}", "-o", "junit_family=xunit1")
        cmd = lanes.pytest_command(dataclasses.replace(lanes.LANES["test"], options=options), targets)
        first = min(os.sched_getaffinity(0)) if level.one_core else None
        pin = (lambda: os.sched_setaffinity(0, {first})) if level.one_core else None
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=str(ROOT), env=env, preexec_fn=pin)
        seconds = time.perf_counter() - t0
        return rc, [cell_ids(n) for n in _failed_nodes(junit)], seconds


def _failed_nodes(junit: Path) -> list[str]:
    if not junit.exists():
        return []
    nodes = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is None and case.find("error") is None:
            continue
        file = case.get("file") or case.get("classname", "").replace(".", "/")
        nodes.append(f"{file}::{case.get('name')}")
    return nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.portable", description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default=",".join(NAMES),
                        help=f"comma-separated, from {', '.join(NAMES)} (default: all)")
    parser.add_argument("-n", "--workers", type=int, default=2, help="notebooks run at once (pytest-xdist)")
    parser.add_argument("targets", nargs="*", help="notebooks or folders (default: both editions)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.levels.split(",") if n.strip()]
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"unknown level(s) {', '.join(unknown)}; the levels are {', '.join(NAMES)}")
    targets = args.targets or [str(p.relative_to(ROOT)) for p in (ROOT / "notebooks", ROOT / "notebooks-zh")
                               if p.is_dir()]
    own = own_capability()
    print(f"Portability lane: this processor is {platform.machine()}, ATen's level here is {own}; "
          f"{os.cpu_count()} cores.", flush=True)
    rows = []
    for level, why in plan(names, own):
        if why:
            rows.append((level, "skipped", why, []))
            continue
        setting = " ".join(f"{k}={v}" for k, v in level.env.items()) or (
            "first core only" if level.one_core else "nothing forced")
        print(f"\n== {level.name} ({level.about}): {setting}", flush=True)
        rc, cells, seconds = run_level(level, targets, args.workers)
        result = "passed" if rc == 0 else ("FAILED" if cells else f"FAILED (pytest exit code {rc})")
        rows.append((level, result, f"{seconds:.0f} s", cells))
    print("\nlevel      result    time / reason")
    for level, result, note, cells in rows:
        print(f"{level.name:<10} {result:<9} {note}")
        for cell in cells:
            print(f"           differs: {cell}")
    return 1 if any(r[1].startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
