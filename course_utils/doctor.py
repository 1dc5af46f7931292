"""Environment check for learners and workshop instructors.

    python -m course_utils doctor

One line per check, OK / WARN / FAIL, and an exit status of 1 when anything FAILs.
Every WARN and FAIL says what to run to fix it.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import ROOT

REQUIREMENTS = ROOT / "requirements.txt"
FIX_INSTALL = "run `make setup` (or `python tasks.py setup`) in the course folder"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | FAIL
    detail: str


def read_pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    """``{normalised-name: version}`` for every ``name==version`` line of a requirements file."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if m:
            pins[normalise(m.group(1))] = m.group(2)
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def check_python(version: tuple[int, int] = sys.version_info[:2]) -> Check:
    text = f"{version[0]}.{version[1]}"
    if version >= (3, 11):
        return Check("python", "OK", f"Python {text}")
    return Check("python", "FAIL", f"Python {text}; the course needs 3.11+: install it, then {FIX_INSTALL}")


def check_package(name: str, pinned: str | None, version_of: Callable[[str], str | None] = _installed) -> Check:
    got = version_of(name)
    if got is None:
        return Check(name, "FAIL", f"not installed: {FIX_INSTALL}")
    if pinned and got.split("+")[0] != pinned.split("+")[0]:
        return Check(name, "WARN", f"{got} installed; the course is tested with {pinned} (outputs may differ)")
    return Check(name, "OK", got)


def check_other_packages(pins: dict[str, str], version_of: Callable[[str], str | None] = _installed) -> Check:
    missing, different = [], []
    for name, want in sorted(pins.items()):
        if name in ("torch", "torchvision"):
            continue
        got = version_of(name)
        if got is None:
            missing.append(name)
        elif got != want:
            different.append(f"{name} {got} (tested: {want})")
    if missing:
        return Check("packages", "FAIL", f"missing: {', '.join(missing)}: {FIX_INSTALL}")
    if different:
        return Check("packages", "WARN", "other versions: " + ", ".join(different))
    return Check("packages", "OK", f"{len(pins) - 2} pinned packages at their tested versions")


def check_cpu() -> Check:
    try:
        from .device import cpu_cores  # the one core count of the course

        n = cpu_cores()
    except ImportError:  # torch does not import: the accelerator line says what to do
        n = os.cpu_count() or 1
    status = "OK" if n >= 2 else "WARN"
    extra = "" if n >= 2 else " (the distributed chapters start 2 processes: expect them to be slow)"
    return Check("cpu", status, f"{n} cores, {platform.machine()}{extra}")


def check_accelerator() -> Check:
    try:
        import torch
    except Exception:
        return Check("accelerator", "FAIL", f"torch does not import: {FIX_INSTALL}")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return Check("accelerator", "OK", f"CUDA: {names}")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return Check("accelerator", "OK", "Apple MPS")
    return Check("accelerator", "OK", "none: the course runs on the CPU (a GPU is optional)")


def check_widgets(version_of: Callable[[str], str | None] = _installed) -> Check:
    if version_of("ipywidgets") is None:
        return Check("widgets", "FAIL", f"ipywidgets is not installed: {FIX_INSTALL}")
    if version_of("jupyterlab-widgets") is None and version_of("jupyterlab_widgets") is None:
        return Check("widgets", "WARN", "the JupyterLab front end for widgets is missing: "
                     "`pip install jupyterlab_widgets`; sliders will show as text")
    return Check("widgets", "OK", "ipywidgets and its JupyterLab front end")


def check_graphviz(which: Callable[[str], str | None] = shutil.which) -> Check:
    if which("dot"):
        return Check("graphviz", "OK", "`dot` found: graphs are drawn by graphviz")
    return Check("graphviz", "WARN", "`dot` not found (optional): graphs use the built-in matplotlib layout; "
                 "for graphviz: apt-get install graphviz / brew install graphviz / conda install graphviz")


def check_data(root: Path | None = None) -> Check:
    from . import data

    root = root or data.DIGITS
    problems = data.verify(root)
    if problems:
        first = problems[0]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Check("data", "FAIL", f"{first}{more}: run `python -m course_utils.data build` to restore it")
    n = len(__import__("json").loads((root / data.MANIFEST).read_text())["files"])
    return Check("data", "OK", f"{n} images match the manifest")


def run_checks(pins: dict[str, str] | None = None) -> list[Check]:
    pins = read_pins() if pins is None else pins
    checks = [check_python()]
    for name in ("torch", "torchvision"):
        checks.append(check_package(name, pins.get(name)))
    checks.append(check_other_packages(pins))
    checks += [check_cpu(), check_accelerator(), check_widgets(), check_graphviz()]
    try:
        checks.append(check_data())
    except Exception as exc:  # e.g. Pillow missing
        checks.append(Check("data", "FAIL", f"could not check the data ({exc}): {FIX_INSTALL}"))
    return checks


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{c.status:4s}  {c.name:{width}s}  {c.detail}" for c in checks)


def main(argv: list[str] | None = None) -> int:
    checks = run_checks()
    print(format_table(checks))
    fails = sum(c.status == "FAIL" for c in checks)
    warns = sum(c.status == "WARN" for c in checks)
    print(f"\n{len(checks)} checks: {len(checks) - fails - warns} OK, {warns} WARN, {fails} FAIL")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
