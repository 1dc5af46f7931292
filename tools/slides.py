"""Each chapter is also a slideshow: the RISE slide type of every cell, set by rules.

    python -m tools.slides                  # set the slide types of every notebook in notebooks/
    python -m tools.slides --check          # exit 1, naming each notebook whose slide types are not current
    python -m tools.slides notebooks/01_autograd.ipynb ...

In JupyterLab, the toolbar's "Render as Reveal Slideshow" button (or Alt+R, or View > Render as Reveal
Slideshow; the jupyterlab-rise extension) shows the open notebook as a reveal.js slideshow beside it.
Space moves on through every screen in order (slides, their subslides, fragments), Shift+Space goes
back; Right and Left arrows jump from slide to slide, past the subslides between them (a section at
a time). The slideshow shows what the notebook holds: run it first (Run All), or present the
committed outputs as they are.

The rules, for each cell, the first that applies:

0. A cell of a **deep dive** (tagged ``deep-dive``: a section that opens with ``## Deep dive:``, see
   ``tools/corepath.py``) is **skip**ped: deep dives are self-study, and the slideshow is the core path.
1. A Markdown cell that opens with a ``# `` or ``## `` heading starts a **slide** (the chapter's title,
   its sections, the recap, the exercises).
2. A Markdown cell that opens with a ``### `` heading starts a **subslide**: a screen of its
   section, reached with Space (Right arrow skips it, for a talk short of time).
3. Plumbing, and what the slideshow cannot show, is **skip**ped (not shown; it still runs with
   Run All):
   - the chapter's setup cell: its first code cell, when it opens with an import (imports, seeding,
     device choice);
   - any other code cell made of imports alone;
   - a clean-up cell: a code cell with no output whose every statement removes files
     (``shutil.rmtree``, ``os.remove``, ``os.unlink``, ``<path>.unlink()``,
     ``<folder>.cleanup()``);
   - a widget cell (its output an ipywidgets view): the slideshow cannot show it (jupyterlab-rise
     presents in an app of its own, built on an older JupyterLab, that fails to load this lab's
     ipywidgets manager), and the static view after every widget cell shows the same picture.
4. A code cell taller than a screen starts a **subslide**, so that it has a screen of its own
   instead of running off the bottom of one (reveal.js does not scroll a slide by default). Taller
   than a screen is: its committed output has more than 25 lines (an image counts as its height in
   pixels / 18, the height of a line of output), or its code and output together have more than
   45 lines. An exception: right after a cell that holds only a heading, the cell stays on that
   heading's screen (a heading alone on a screen says nothing).
5. A Markdown cell with a paragraph that opens with an exercise's number (``**Q2.**``) starts a
   **subslide**: one exercise a screen.
6. The answer to a prediction: the code cell right after a Markdown cell that asks the room to
   predict (``**Predict, then run``) is a **fragment**, shown on the next Space, once the room has
   answered.
7. Every other cell is ``-``: it continues the screen above it.

Nothing else is written: only ``metadata.slideshow`` of each cell changes, and a notebook is written
back in the form JupyterLab and ``tools.notebook`` save it in (``json.dumps(nb, indent=1,
sort_keys=True, ensure_ascii=False)`` and a newline), only when one of its slide types changed. A
slide type set by hand is put back by the next run (and ``--check`` fails until then): to change
the slides, change the rules here or the headings in the notebook.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import re
import struct
import sys
from pathlib import Path

from tools.notebook import dumps, named_or_chapters

TALL_OUTPUT_LINES = 25  # rule 4: more output than this starts a screen of its own
TALL_CELL_LINES = 45  # rule 4: more code and output together than this, too
LINE_PX = 18  # the height of a line of output, in pixels: an image of 450 px counts as 25 lines
CLEANUP_CALLS = {"shutil.rmtree", "os.remove", "os.unlink", "cleanup", "unlink"}
PREDICT = re.compile(r"\*\*Predict\b")
EXERCISE = re.compile(r"^\*\*Q\d+\.\*\*", re.M)  # a paragraph that opens with **Q2.**
WIDGET = "application/vnd.jupyter.widget-view+json"
DEEP_DIVE = "deep-dive"  # rule 0: the cell tag of every cell of a deep dive (tools/corepath.py)
SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")


def source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _lines(text: str) -> int:
    return len(text.rstrip("\n").split("\n")) if text.strip() else 0


def heading_level(cell: dict) -> int:
    """1, 2, 3 ... for a Markdown cell that opens with a heading (``# ``, ``## ``, ``### ``); else 0."""
    if cell.get("cell_type") != "markdown":
        return 0
    first = source(cell).lstrip("\n").split("\n", 1)[0]
    m = re.match(r"(#{1,6}) \S", first)
    return len(m.group(1)) if m else 0


def heading_only(cell: dict) -> bool:
    return heading_level(cell) > 0 and "\n" not in source(cell).strip()


def png_height(data: str) -> int:
    """The height in pixels of a base64 PNG (from its header); 0 if it is not one."""
    try:
        head = base64.b64decode("".join(data.split())[:44])  # 33 bytes: the signature and the IHDR chunk
    except ValueError:  # binascii.Error: not base64, or too short
        return 0
    if head[:8] != b"\x89PNG\r\n\x1a\n" or len(head) < 24:
        return 0
    return struct.unpack(">I", head[20:24])[0]


def output_lines(cell: dict) -> float:
    """How tall the committed output of a code cell is, in lines of text (an image: its height / LINE_PX)."""
    total = 0.0
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            total += _lines(_text(out.get("text", "")))
        elif kind == "error":
            total += sum(_lines(_text(t)) for t in out.get("traceback", []))
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            if "image/png" in data:
                height = out.get("metadata", {}).get("image/png", {}).get("height")
                total += (height or png_height(_text(data["image/png"]))) / LINE_PX
            elif "text/plain" in data:
                total += _lines(_text(data["text/plain"]))
    return total


def _statements(cell: dict) -> list[ast.stmt] | None:
    """The top-level statements of a code cell (IPython's % and ! lines left out); None if it is not Python."""
    code = "\n".join(ln for ln in source(cell).split("\n") if not ln.lstrip().startswith(("%", "!")))
    try:
        return ast.parse(code).body
    except SyntaxError:
        return None


def _called(stmt: ast.stmt) -> str:
    """What a call statement calls: ``shutil.rmtree`` for ``shutil.rmtree(x)``, ``cleanup`` for
    ``tmp.cleanup()``, ``f`` for ``f(x)``; '' for a statement that is not a call."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return ""
    func = stmt.value.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and f"{func.value.id}.{func.attr}" in CLEANUP_CALLS:
            return f"{func.value.id}.{func.attr}"
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def shows_widget(cell: dict) -> bool:
    return any(WIDGET in out.get("data", {}) for out in cell.get("outputs", []))


def is_skipped(cell: dict, first_code: bool) -> bool:
    """Rule 3: a widget cell, the setup cell, an imports-only cell, or a clean-up cell without output."""
    if shows_widget(cell):
        return True
    body = _statements(cell)
    if not body:
        return False
    imports = [isinstance(s, ast.Import | ast.ImportFrom) for s in body]
    if (first_code and imports[0]) or all(imports):
        return True
    return not cell.get("outputs") and all(_called(s) in CLEANUP_CALLS for s in body)


def is_tall(cell: dict) -> bool:
    """Rule 4: a code cell taller than a screen."""
    out = output_lines(cell)
    return out > TALL_OUTPUT_LINES or _lines(source(cell)) + out > TALL_CELL_LINES


def slide_types(nb: dict) -> list[str]:
    """The slide type of each cell of notebook `nb` (a dict as json.load gives it), by the rules above."""
    types: list[str] = []
    first_code = True
    shown: dict | None = None  # the last cell that is not skipped
    after_predict = False
    for cell in nb["cells"]:
        kind = cell.get("cell_type")
        level = heading_level(cell)
        if DEEP_DIVE in cell.get("metadata", {}).get("tags", []):
            t = "skip"
        elif level in (1, 2):
            t = "slide"
        elif level == 3:
            t = "subslide"
        elif kind == "code" and is_skipped(cell, first_code):
            t = "skip"
        elif kind == "code" and is_tall(cell) and not (shown is not None and heading_only(shown)):
            t = "subslide"
        elif kind == "markdown" and EXERCISE.search(source(cell)):
            t = "subslide"
        elif kind == "code" and after_predict:
            t = "fragment"
        else:
            t = "-"
        if kind == "code":
            first_code = False
        if t != "skip":
            shown = cell
            after_predict = kind == "markdown" and bool(PREDICT.search(source(cell)))
        types.append(t)
    return types


def apply(nb: dict) -> int:
    """Set every cell's ``metadata.slideshow`` by the rules; how many cells changed."""
    changed = 0
    for cell, t in zip(nb["cells"], slide_types(nb), strict=True):
        meta = cell.setdefault("metadata", {})
        if meta.get("slideshow") != {"slide_type": t}:
            meta["slideshow"] = {"slide_type": t}
            changed += 1
    return changed


def update(path: Path, write: bool = True) -> int:
    """Apply the rules to the notebook at `path`; the number of cells whose slide type was not
    current (written back when `write`). Raises ValueError for a file not in the stored form, which
    a rewrite would reformat."""
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    if dumps(nb) != text:
        raise ValueError(f"{path.name} is not in the form JupyterLab saves (indent 1, sorted keys); "
                         "save it from JupyterLab or re-run it with tools.notebook first")
    changed = apply(nb)
    if changed and write:
        path.write_text(dumps(nb), encoding="utf-8")
    return changed


def outline(path: Path) -> str:
    """The slideshow of a notebook in a few lines of text: one line a screen, with its first words."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    rows = []
    for i, (cell, t) in enumerate(zip(nb["cells"], slide_types(nb), strict=True)):
        if t in ("slide", "subslide", "fragment"):
            first = source(cell).strip().split("\n", 1)[0][:70]
            rows.append(f"{'' if t == 'slide' else '  '}{t:9s} cell {i:3d}  {first}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.slides", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook's slide types are not current")
    parser.add_argument("--outline", action="store_true", help="print each notebook's slides and subslides")
    parser.add_argument("notebooks", nargs="*", help="default: every notebook in notebooks/")
    args = parser.parse_args(argv)
    paths = named_or_chapters(args.notebooks)
    if paths is None:
        return 2
    if args.outline:
        for p in paths:
            print(f"== {p.name}\n{outline(p)}")
        return 0
    stale, status = [], 0
    for p in paths:
        try:
            changed = update(p, write=not args.check)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            status = 2
            continue
        if changed:
            stale.append(f"{p.name} ({changed} cell{'s' if changed > 1 else ''})")
    if args.check:
        if stale:
            print("slide types not current in: " + ", ".join(stale) + "; run `python -m tools.slides`",
                  file=sys.stderr)
            return 1
        return status
    print("slide types updated: " + (", ".join(stale) if stale else "none (all current)"))
    return status


if __name__ == "__main__":
    sys.exit(main())
