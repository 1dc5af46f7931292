"""docs/errata.md and the notebooks agree: every "erratum N" (or "clarification N") a notebook cites is an
entry of the errata, every entry is cited by a notebook, a clarification is cited as one, and every
"where the course shows it" link names a real section."""

import json
import re
from pathlib import Path

import pytest

from course_utils import ROOT, inventory

ERRATA = ROOT / "docs" / "errata.md"
NOTEBOOKS = inventory.notebooks("en")

# "erratum 7", "Erratum 10", "errata 3 and 4", "errata 5, 8, 9, 10", "clarification 4"
CITATION = re.compile(r"\b(?:errat(?:um|a)|clarifications?)\s+(\d+(?:(?:\s*,\s*|\s+and\s+)\d+)*)", re.I)
CLARIFICATION = re.compile(r"\bclarifications?\s+(\d+(?:(?:\s*,\s*|\s+and\s+)\d+)*)", re.I)
ENTRY = re.compile(r"^## (\d+)\. (.+)$", re.M)
# [01_autograd › 7. `retain_graph` versus `create_graph`](../notebooks/01_autograd.ipynb)
SHOWN_AT = re.compile(r"\[(\d\d_[a-z0-9_]+) › (.+?)\]\(\.\./notebooks/(\d\d_[a-z0-9_]+\.ipynb)\)")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def notebook_text(path: Path) -> str:
    """Everything a reader sees: the cells' sources and their text outputs."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        parts.append(_text(cell.get("source")))
        for out in cell.get("outputs", []):
            parts.append(_text(out.get("text")))
            parts.append(_text(out.get("data", {}).get("text/plain")))
            parts.append(_text(out.get("evalue")))
    return "\n".join(parts)


def citations() -> dict[int, set[str]]:
    """Erratum number -> the notebooks that cite it."""
    found: dict[int, set[str]] = {}
    for path in NOTEBOOKS:
        for m in CITATION.finditer(notebook_text(path)):
            for number in re.findall(r"\d+", m.group(1)):
                found.setdefault(int(number), set()).add(path.name)
    return found


def entries() -> dict[int, str]:
    """Erratum number -> the entry's text, from its heading to the next one."""
    text = ERRATA.read_text()
    heads = list(ENTRY.finditer(text))
    return {int(h.group(1)): text[h.start(): heads[k + 1].start() if k + 1 < len(heads) else len(text)]
            for k, h in enumerate(heads)}


def headings(path: Path) -> set[str]:
    cells = json.loads(path.read_text())["cells"]
    md = "\n".join(_text(c.get("source")) for c in cells if c["cell_type"] == "markdown")
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", md, re.M)}


def test_entries_are_numbered_from_one_without_gaps():
    numbers = list(entries())
    assert numbers == list(range(1, len(numbers) + 1)), f"errata entries out of order: {numbers}"


def test_every_citation_names_an_entry():
    known = entries()
    wrong = {n: sorted(nbs) for n, nbs in citations().items() if n not in known}
    assert not wrong, f"notebooks cite errata that docs/errata.md does not have: {wrong}"


def test_every_entry_is_cited_by_a_notebook():
    cited = citations()
    orphans = [n for n in entries() if n not in cited]
    assert not orphans, f"errata that no notebook cites (add '(erratum N)' where the course shows it): {orphans}"


@pytest.mark.parametrize("number", sorted(entries()))
def test_entry_says_what_the_source_says_what_is_true_and_where_it_is_shown(number):
    entry = entries()[number]
    for part in ("**The source**", "**What is true**", "**Where the course shows it**"):
        assert part in entry, f"erratum {number} has no {part}"
    shown = entry.split("**Where the course shows it**", 1)[1]
    links = SHOWN_AT.findall(shown)
    assert links, f"erratum {number}: link at least one notebook section as [NN_name › heading](../notebooks/NN_name.ipynb)"
    for stem, heading, target in links:
        path = ROOT / "notebooks" / target
        assert target == f"{stem}.ipynb" and path.exists(), f"erratum {number}: no notebook {target}"
        assert heading in headings(path), f"erratum {number}: {target} has no section {heading!r}"


def test_the_citation_pattern_reads_every_form():
    text = ("(erratum 7) ... (errata 3 and 4) ... (errata 5, 8, 9, 10) ... Erratum 10 ... erratic, errata list"
            " ... (clarification 12) ... clarifications 4 and 12")
    assert [re.findall(r"\d+", m.group(1)) for m in CITATION.finditer(text)] == [
        ["7"], ["3", "4"], ["5", "8", "9", "10"], ["10"], ["12"], ["4", "12"]]


def test_a_clarification_is_cited_as_one_and_marked_as_one():
    """An entry whose heading says "Clarification:" corrects nothing: the notebooks that cite it by its
    own name find that word in its heading, and each one is cited as a clarification somewhere."""
    known = entries()
    marked = {n for n, text in known.items() if text.split("\n", 1)[0].startswith(f"## {n}. Clarification: ")}
    cited = set()
    for path in NOTEBOOKS:
        for m in CLARIFICATION.finditer(notebook_text(path)):
            cited |= {int(n) for n in re.findall(r"\d+", m.group(1))}
    assert cited <= marked, f"cited as clarifications but not marked as ones: {sorted(cited - marked)}"
    assert marked <= cited, f"clarifications that no notebook cites as one: {sorted(marked - cited)}"
    assert marked == {4, 12, 13}, f"the errata page's clarifications are 4, 12 and 13, not {sorted(marked)}"
