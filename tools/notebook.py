"""Execute notebooks in a fresh kernel (refreshing their stored outputs) and time them.

    python -m tools.notebook execute notebooks/01_autograd.ipynb ...
    python -m tools.notebook bench [--runs 3] [notebooks ...]
    python -m tools.notebook stress [--runs 3] [notebooks ...]

`execute` writes the notebook back with clean metadata: kernel ``python3``, no
widget state, execution counts 1..N, and every machine path in the outputs made
relative (repository root -> ``.``, site-packages -> ``<site-packages>``), the
same forms that ``nbval_sanitize.cfg`` produces when nbval re-runs a notebook.
It records the run that made the outputs in the notebook's metadata,
``course.last_run`` = ``{"torch": "2.14.1+cu130", "date": "2026-12-06"}`` (the
kernel's torch, the date in UTC): the book's "last run" line reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import site
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from course_utils import ROOT
from course_utils.inventory import notebooks_in

NOTEBOOKS = ROOT / "notebooks"


def chapters(folder: Path = NOTEBOOKS) -> list[Path]:
    """The chapters' notebooks in `folder`, in order (``course_utils.inventory``)."""
    return notebooks_in(folder)


def named_or_chapters(names: list[str]) -> list[Path] | None:
    """The notebooks a command names, else every chapter's; None, having said which, where a named
    notebook does not exist."""
    paths = [Path(p).resolve() for p in names] or chapters()
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print("no such notebook: " + ", ".join(missing), file=sys.stderr)
        return None
    return paths


def dumps(nb: dict) -> str:
    """A notebook as JupyterLab and nbformat store it: indent 1, sorted keys, characters as they are."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def _path_replacements() -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for sp in sorted({*site.getsitepackages(), site.getusersitepackages()}, key=len, reverse=True):
        pairs.append((str(Path(sp)) + os.sep, "<site-packages>/"))
    pairs.append((sysconfig.get_paths()["stdlib"] + os.sep, "<stdlib>/"))
    pairs.append((str(ROOT) + os.sep, "./"))
    pairs.append((str(ROOT), "."))
    pairs.append((str(Path.home()) + os.sep, "~/"))
    return pairs


_TMP = re.compile(re.escape(tempfile.gettempdir()) + r"(?:/(?:tmp|pymp-|torchelastic_)[\w\-]+)+")


def relativise(text: str) -> str:
    """Replace this machine's absolute paths in `text` by portable forms."""
    for old, new in _path_replacements():
        text = text.replace(old, new)
    return _TMP.sub("<tmp>", text)


def _clean_output(out: dict) -> None:
    for key in ("text", "traceback", "evalue"):
        if key in out:
            if isinstance(out[key], list):
                out[key] = [relativise(t) for t in out[key]]
            else:
                out[key] = relativise(out[key])
    data = out.get("data", {})
    for mime in ("text/plain", "text/html", "text/markdown", "image/svg+xml"):
        if mime in data:
            val = data[mime]
            data[mime] = [relativise(t) for t in val] if isinstance(val, list) else relativise(val)


MARKER = "# NBVAL_RAISES_EXCEPTION"
TAG = "raises-exception"


def mark_expected_failures(nb) -> int:
    """Turn nbval's comment marker into the ``raises-exception`` cell tag, which JupyterLab's
    Run All honours too (it stops at the first error of a cell without the tag); returns how
    many cells changed."""
    changed = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or MARKER not in cell.source:
            continue
        cell.source = "\n".join(ln for ln in cell.source.split("\n") if ln.strip() != MARKER)
        tags = cell.metadata.setdefault("tags", [])
        if TAG not in tags:
            tags.append(TAG)
        changed += 1
    return changed


def _prepare(nb) -> None:
    """nbclient lets a cell fail only when it carries the tag, as JupyterLab and nbval do."""
    mark_expected_failures(nb)


def torch_version() -> str:
    """``torch.__version__`` of this environment (the kernel's), read without importing torch."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        found = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
        if found:
            return found.group(1)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def last_run(date: float | None = None) -> dict[str, str]:
    """What ``execute`` records of a run: the torch version and the date (UTC, ``YYYY-MM-DD``)."""
    return {"torch": torch_version(), "date": time.strftime("%Y-%m-%d", time.gmtime(date))}


def _finish(nb, run: dict[str, str] | None = None) -> None:
    """Clean the executed notebook's metadata and outputs, and record `run` (default: this one)."""
    nb.metadata.pop("widgets", None)
    course = nb.metadata.setdefault("course", {})
    course["last_run"] = dict(run or last_run())
    nb.metadata["kernelspec"] = dict(KERNEL)
    lang = nb.metadata.setdefault("language_info", {})
    for key in list(lang):
        if key not in ("name", "pygments_lexer", "file_extension", "mimetype", "codemirror_mode", "nbconvert_exporter"):
            del lang[key]
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            _clean_output(out)


def _kernel_manager(folder: str):
    """A kernel manager whose kernel talks over Unix sockets in `folder` (IPC): no TCP port that a
    distributed job started by the notebook could take first. TCP on Windows."""
    from jupyter_client.manager import KernelManager

    if os.name == "nt":
        return KernelManager(kernel_name="python3")
    return KernelManager(kernel_name="python3", transport="ipc", connection_file=os.path.join(folder, "kernel.json"))


def execute(path: Path | str, timeout: int = 600, write: bool = True) -> float:
    """Run one notebook top to bottom in a fresh kernel; returns the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    _prepare(nb)
    with tempfile.TemporaryDirectory(prefix="nbk-") as folder:
        client = NotebookClient(
            nb,
            km=_kernel_manager(folder),
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
            store_widget_state=True,  # False breaks nbclient on Output widgets; _finish() drops the state
            record_timing=False,
        )
        client.owns_km = True  # shut the kernel down at the end, as nbclient does with a manager of its own
        t0 = time.perf_counter()
        client.execute()
        elapsed = time.perf_counter() - t0
    _finish(nb)
    if write:
        nbformat.write(nb, path)
    return elapsed


def bench(paths: list[Path], runs: int = 3) -> list[tuple[str, float, float, float]]:
    """Execute each notebook `runs` times (copies in its own folder); (name, median, min, max) seconds."""
    rows = []
    for p in paths:
        times = []
        for _ in range(runs):
            times.append(_run_copy(p))
        rows.append((p.name, statistics.median(times), min(times), max(times)))
    return rows


def _run_copy(p: Path) -> float:
    """Execute a hidden copy of notebook `p` in its own folder (relative paths work); seconds."""
    with tempfile.NamedTemporaryFile(suffix=".ipynb", dir=p.parent, prefix=".bench-", delete=False) as tmp:
        pass
    try:
        shutil.copy(p, tmp.name)
        return execute(Path(tmp.name), write=False)
    finally:
        os.unlink(tmp.name)


def stress(paths: list[Path], runs: int = 3) -> list:
    """Execute each notebook `runs` times, counting failures instead of stopping at the first
    (``tools.stress.repeat``); a failure's error goes to ``.stress/``. One row per notebook."""
    from tools.stress import repeat

    def once(p: Path) -> tuple[bool, str]:
        try:
            _run_copy(p)
        except Exception as exc:  # a cell error, a timeout, a dead kernel: all count
            return False, relativise(f"{type(exc).__name__}: {exc}")
        return True, ""

    return [repeat(p.name, p.name, runs, lambda p=p: once(p), lambda k, p=p: f"{p.stem}.run{k}.log")
            for p in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.notebook")
    sub = parser.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("execute", help="re-run notebooks in place in a fresh kernel")
    e.add_argument("notebooks", nargs="*")
    b = sub.add_parser("bench", help="time each notebook (median of a few runs)")
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("notebooks", nargs="*")
    st = sub.add_parser("stress", help="execute each notebook several times; count failures")
    st.add_argument("--runs", type=int, default=3)
    st.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    paths = named_or_chapters(args.notebooks)
    if paths is None:
        return 2
    if args.cmd == "execute":
        for p in paths:
            print(f"executing {p.relative_to(ROOT)} ...", end=" ", flush=True)
            print(f"{execute(p):.1f} s", flush=True)
        return 0
    if args.runs < 1:
        print("--runs must be at least 1", file=sys.stderr)
        return 2
    if args.cmd == "stress":
        from tools.stress import table

        srows = stress(paths, args.runs)
        print("\n" + table(srows, "notebook"))
        return 1 if any(r.failed for r in srows) else 0
    print(f"Executing each notebook {args.runs} time(s) in a fresh kernel on {os.cpu_count()} CPU cores ...",
          flush=True)
    rows = bench(paths, args.runs)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'notebook':{width}s}  {'median s':>8s}  {'min s':>6s}  {'max s':>6s}")
    for name, med, lo, hi in rows:
        print(f"{name:{width}s}  {med:8.1f}  {lo:6.1f}  {hi:6.1f}")
    print(f"{'total (medians)':{width}s}  {sum(r[1] for r in rows):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
