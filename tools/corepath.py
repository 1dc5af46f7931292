"""A chapter's core path and its deep dives, and whether the core path fits the chapter's slot.

    python -m tools.corepath            # per chapter: core-path words, reading and exercise minutes, slot
    python -m tools.corepath --check    # exit 1, naming each shaped chapter whose core path overruns its slot

The convention (CONTRIBUTING.md, "Core path and deep dives"): a **deep dive** opens with a Markdown cell
whose first line is a level-2 heading ``## Deep dive: <title>`` (``## 深入专题：<title>`` in the Chinese
edition), and runs to the next level-1 or level-2 heading; every cell of it, the heading's included,
carries the cell tag ``deep-dive``, and no other cell does. Everything else is the **core path**: what a
workshop teaches and the slides show (``tools/slides.py`` skips the tagged cells; ``tools/workshop.py``
lists the deep dives as self-study in the instructor guide).

A core path fits its slot in the course map (the table in ``00_start_here.ipynb``) when its words, read
at ``WORDS_PER_MINUTE``, plus the minutes its exercises take in the instructor guide's timed plan, come
to at most the slot. Words are the whitespace-separated words of the cells' sources, Markdown and code
alike; outputs are not counted (the prose quotes what matters in them).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import ROOT
from tools.notebook import named_or_chapters

NOTEBOOKS = ROOT / "notebooks"
GUIDE = ROOT / "docs" / "instructor"
TAG = "deep-dive"
HEADING = "## Deep dive: "
HEADING_ZH = "## 深入专题："
WORDS_PER_MINUTE = 150
# The chapters split into a core path and deep dives so far; the others are reported, not yet held to it.
SHAPED = ("00_start_here", "01_autograd", "02_nn_module", "03_data_loading")


def source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def first_line(cell: dict) -> str:
    return source(cell).lstrip("\n").split("\n", 1)[0]


def tagged(cell: dict) -> bool:
    return TAG in cell.get("metadata", {}).get("tags", [])


def opens_deep_dive(cell: dict) -> bool:
    """A Markdown cell whose first line is ``## Deep dive: ...`` (or the Chinese edition's heading)."""
    return cell.get("cell_type") == "markdown" and first_line(cell).startswith((HEADING, HEADING_ZH))


def _opens_section(cell: dict) -> bool:
    return cell.get("cell_type") == "markdown" and bool(re.match(r"#{1,2} \S", first_line(cell)))


def words(cell: dict) -> int:
    return len(source(cell).split())


@dataclass
class Section:
    """A run of cells under one ``#``/``##`` heading (the first one: the cells before any heading)."""

    title: str
    cells: list[int] = field(default_factory=list)
    deep: bool = False
    words: int = 0


def sections(nb: dict) -> list[Section]:
    """The notebook's sections, in order; a section that opens with ``## Deep dive:`` is a deep dive."""
    found = [Section("")]
    for i, cell in enumerate(nb["cells"]):
        if _opens_section(cell):
            line = first_line(cell)
            title = line.split(" ", 1)[1].strip()
            found.append(Section(title, deep=opens_deep_dive(cell)))
        found[-1].cells.append(i)
        found[-1].words += words(cell)
    return [s for s in found if s.cells]


def deep_dive_cells(nb: dict) -> set[int]:
    """The indices of the cells that belong to deep dives (by their headings)."""
    return {i for s in sections(nb) if s.deep for i in s.cells}


def problems(nb: dict, name: str = "") -> list[str]:
    """Where a notebook breaks the convention: a deep dive's cell without the tag, a tagged cell outside."""
    inside, out = deep_dive_cells(nb), []
    for i, cell in enumerate(nb["cells"]):
        where = f"{name} cell {i} ({cell.get('id')}: {first_line(cell)[:50]!r})"
        if i in inside and not tagged(cell):
            out.append(f"{where}: inside a deep dive, without the cell tag {TAG!r}")
        elif i not in inside and tagged(cell):
            out.append(f"{where}: tagged {TAG!r} outside a deep dive (a deep dive opens with {HEADING!r})")
    return out


def core_words(nb: dict) -> int:
    return sum(s.words for s in sections(nb) if not s.deep)


def course_map() -> dict[str, int]:
    """``{notebook: minutes}`` from the course map table of 00_start_here.ipynb."""
    nb = json.loads((NOTEBOOKS / "00_start_here.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] == "markdown" and text.startswith("## The course map"):
            rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                    for line in text.splitlines() if line.startswith("|")]
            header, body = rows[0], [r for r in rows[2:]]
            name, time = header.index("notebook"), header.index("time")
            # a self-study chapter has no slot (0): the workshop does not teach it
            return {r[name].strip("`"): int(r[time].split()[0]) if r[time][0].isdigit() else 0 for r in body}
    raise ValueError("00_start_here.ipynb has no '## The course map' cell")


def exercise_minutes(chapter: str) -> int:
    """The exercise minutes of a chapter's timed plan: the total row of its instructor page's table."""
    text = (GUIDE / f"{chapter}.md").read_text(encoding="utf-8")
    plan = text.split("## Timed plan", 1)[1].split("\n## ", 1)[0]
    total = next(line for line in plan.splitlines() if line.startswith("| **total**"))
    return int(total.strip("|").split("|")[2])


@dataclass
class Budget:
    """A chapter's core path against its slot, in words and minutes."""

    chapter: str
    words: int
    deep_words: int
    exercises: int
    slot: int

    @property
    def reading(self) -> float:
        return self.words / WORDS_PER_MINUTE

    @property
    def minutes(self) -> int:
        return math.ceil(self.reading) + self.exercises

    @property
    def fits(self) -> bool:
        return self.slot == 0 or self.minutes <= self.slot  # slot 0: self-study, no workshop slot to fit


def budget(notebook: Path) -> Budget:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    core = core_words(nb)
    total = sum(words(c) for c in nb["cells"])
    return Budget(notebook.stem, core, total - core, exercise_minutes(notebook.stem), course_map()[notebook.stem])


def table(paths: list[Path]) -> str:
    head = (f"{'chapter':<18} {'core words':>10} {'reading':>8} {'exercises':>9} {'total':>6} {'slot':>5}  "
            f"{'deep-dive words':>15}")
    rows = [head, "-" * len(head)]
    for p in paths:
        b = budget(p)
        mark = "" if b.fits else ("  OVER" if b.chapter in SHAPED else "  over (not yet shaped)")
        rows.append(f"{b.chapter:<18} {b.words:>10,} {b.reading:>7.1f}m {b.exercises:>8}m {b.minutes:>5}m "
                    f"{b.slot:>4}m  {b.deep_words:>15,}{mark}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.corepath", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a shaped chapter's core path overruns its slot or breaks the convention")
    parser.add_argument("notebooks", nargs="*", help="default: every chapter in notebooks/")
    args = parser.parse_args(argv)
    paths = named_or_chapters(args.notebooks)
    if paths is None:
        return 2
    print(table(paths))
    if not args.check:
        return 0
    bad = []
    for p in paths:
        nb = json.loads(p.read_text(encoding="utf-8"))
        bad += problems(nb, p.name)
        b = budget(p)
        if b.chapter in SHAPED and not b.fits:
            bad.append(f"{p.name}: core path {b.minutes} min ({b.words:,} words + {b.exercises} min of exercises) "
                       f"over its {b.slot}-min slot: move longer material into deep dives")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
