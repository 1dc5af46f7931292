"""The spelling of the course's English prose: codespell (``codespell==2.4.3``, pinned in
requirements.txt) over the English notebooks' Markdown cells, the README, CONTRIBUTING, the errata,
the instructor guide, the data's README, the exercises' words (``chNN.en.toml``) and the glossary.

Code is not prose: fenced blocks and inline code are blanked before the check (line numbers kept).
Words that are right but that codespell's dictionaries take for misspellings go in the project's
word list, ``docs/spelling-words.txt`` (one a line, lower case). The course spells British English
("initialisation", "licence"), which codespell's default dictionaries accept.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import ROOT, inventory

WORDS = ROOT / "docs" / "spelling-words.txt"
DICTIONARIES = "clear,rare,informal,usage,code"  # codespell's own; "code" also knows programmers' slips
PIN = "codespell==2.4.3"
TIMEOUT_S = 120


def prose_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "data" / "README.md",
             ROOT / "docs" / "errata.md", ROOT / "i18n" / "zh-CN" / "glossary.md"]
    files += sorted((ROOT / "docs" / "instructor").glob("*.md"))
    files += sorted((ROOT / "course_utils" / "exercises").glob("*.en.toml"))
    return [f for f in files if f.is_file()]


def notebooks() -> list[Path]:
    return inventory.notebooks("en")


_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """`text` with fenced code blocks and inline code blanked, line for line."""
    out, fence = [], False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fence = not fence
            out.append("")
        elif fence:
            out.append("")
        else:
            out.append(_INLINE.sub(lambda m: " " * len(m.group(0)), line))
    return "\n".join(out)


def stage(folder: Path) -> dict[Path, tuple[str, list[str] | None]]:
    """The prose to check, written into `folder`: ``{copy: (what it is, the cell id of each line of a
    notebook's copy, or None)}``."""
    staged = {}
    for f in prose_files():
        copy = folder / f.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(prose(f.read_text(encoding="utf-8")), encoding="utf-8")
        staged[copy] = (f.relative_to(ROOT).as_posix(), None)
    for nb in notebooks():
        lines, cells = [], []
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                text = prose("".join(cell["source"])).split("\n")
                lines += text
                cells += [cell.get("id", "?")] * len(text)
        copy = folder / "notebooks" / (nb.stem + ".md")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text("\n".join(lines), encoding="utf-8")
        staged[copy] = (nb.relative_to(ROOT).as_posix(), cells)
    return staged


def codespell(paths: list[Path], words: Path = WORDS) -> list[str]:
    """codespell's findings in `paths` (``path:line: word ==> fix``)."""
    if importlib.util.find_spec("codespell_lib") is None:
        pytest.fail(f"codespell is not installed in this Python: it is pinned in requirements.txt ({PIN}); "
                    "run `python tasks.py setup` (make test does) to install it.")
    cmd = [sys.executable, "-m", "codespell_lib", "--builtin", DICTIONARIES, "--ignore-words", str(words),
           *map(str, paths)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode not in (0, 65):  # 65: misspellings found
        pytest.fail(f"codespell failed (exit {r.returncode}): {r.stderr.strip()[-1000:]}")
    return [line for line in r.stdout.splitlines() if "==>" in line]


def located(finding: str, staged: dict[Path, tuple[str, list[str] | None]]) -> str:
    """A finding named by its real file (and a notebook's cell id)."""
    path, line, rest = finding.split(":", 2)
    name, cells = staged[Path(path)]
    where = f"{name} cell {cells[int(line) - 1]}" if cells else f"{name}:{line}"
    return f"{where}:{rest}"


def test_the_english_prose_is_spelled_right(tmp_path):
    staged = stage(tmp_path)
    found = [located(f, staged) for f in codespell(list(staged))]
    assert not found, (f"{len(found)} misspelling(s) (a word that is right: add it to "
                       f"{WORDS.relative_to(ROOT)}):\n  " + "\n  ".join(found))


def test_the_check_finds_a_misspelling_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(prose("We recieve the gradient.\n```python\nteh = 1\n```\nThe `teh` variable.\n"), encoding="utf-8")
    found = codespell([page])
    assert len(found) == 1 and ":1: recieve ==> receive" in found[0]


def test_the_word_list_is_sorted_lower_case_and_used():
    words = WORDS.read_text(encoding="utf-8").split()
    assert words == sorted(set(words)) and all(w == w.lower() for w in words)
