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
    assert links, (f"erratum {number}: link at least one notebook section as "
                   "[NN_name › heading](../notebooks/NN_name.ipynb)")
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


ERRATA_ZH = ROOT / "docs" / "errata.zh-CN.md"
# [01_autograd › 1. 原样运行原文的示例](../notebooks-zh/01_autograd.ipynb)
SHOWN_AT_ZH = re.compile(r"\[(\d\d_[a-z0-9_]+) › (.+?)\]\(\.\./notebooks-zh/(\d\d_[a-z0-9_]+\.ipynb)\)")
ANCHOR = re.compile(r'^<a id="(erratum-\d+)"></a>\n\n## (\d+)\. ', re.M)
# a link to an errata page: [text](path/errata.md#anchor) or errata.zh-CN.md
ERRATA_LINK = re.compile(r"\[([^\]]+)\]\(((?:[^)\s]*/)?errata(?:\.zh-CN)?\.md)(?:#([^)\s]*))?\)")
# the erratum a link text names: "erratum 6", "Clarification 4", "勘误 6", "澄清 4"
NAMED = re.compile(r"(?:\b(?:errat(?:um|a)|clarifications?)|勘误|澄清)\s*(\d+)", re.I)


def test_the_chinese_errata_name_the_chinese_sections():
    """Each "课程中的演示" link of the Chinese errata names, as its text, a heading of the Chinese notebook."""
    text = ERRATA_ZH.read_text(encoding="utf-8")
    links = SHOWN_AT_ZH.findall(text)
    assert len(links) >= len(entries()), (
        "link every entry's sections as [NN_name › heading](../notebooks-zh/NN_name.ipynb)")
    wrong = [f"{target}: {heading!r}" for stem, heading, target in links
             if target != f"{stem}.ipynb" or heading not in headings(ROOT / "notebooks-zh" / target)]
    assert not wrong, "docs/errata.zh-CN.md links sections the Chinese notebooks do not have:\n" + "\n".join(wrong)


@pytest.mark.parametrize("page", [ERRATA, ERRATA_ZH], ids=["en", "zh-CN"])
def test_every_entry_has_a_stable_anchor(page):
    """`<a id="erratum-N"></a>` before entry N's heading: links survive a reworded heading."""
    text = page.read_text(encoding="utf-8")
    found = [(a, int(n)) for a, n in ANCHOR.findall(text)]
    assert found == [(f"erratum-{n}", n) for n in entries()], f"{page.name}: anchors {found}"


def _linking_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "notebooks-zh").glob("*.ipynb"))]
    return [p for p in files if p.exists()]


def errata_links(path: Path) -> list[tuple[str, Path, str]]:
    """(link text, errata page, anchor or "") of every link from `path` to an errata page."""
    text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
    return [(label, (path.parent / target).resolve(), anchor or "")
            for label, target, anchor in ERRATA_LINK.findall(text)]


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the links from `path` to the errata pages: a page or an anchor that does not
    exist, a text that names one erratum ("勘误 1", "erratum 6") and links elsewhere, a text that shows
    one file's name and links another."""
    wrong = []
    where = path.relative_to(root)
    for label, page, anchor in errata_links(path):
        if not page.exists():
            wrong.append(f"{where}: [{label}] links {page.name}, which does not exist")
            continue
        have = set(re.findall(r'<a id="([^"]+)"></a>', page.read_text(encoding="utf-8")))
        named = NAMED.search(label)
        if anchor and anchor not in have:
            wrong.append(f"{where}: [{label}] links {page.name}#{anchor}, an anchor the page does not have")
        elif named and anchor != f"erratum-{named.group(1)}":
            wrong.append(f"{where}: [{label}] names erratum {named.group(1)} but links {page.name}#{anchor}")
        elif label.endswith(".md") and label.rsplit("/", 1)[-1] != page.name:
            wrong.append(f"{where}: [{label}] shows one file's name and links another, {page.name}")
    return wrong


def test_every_link_to_an_erratum_reaches_its_anchor():
    """Every link into an errata page, from the README, the docs and both editions' notebooks, holds."""
    wrong = [problem for path in _linking_files() for problem in link_problems(path)]
    assert not wrong, "\n".join(wrong)


def test_the_link_check_sees_a_missing_anchor_a_wrong_number_and_a_wrong_name(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "errata.zh-CN.md").write_text('<a id="erratum-1"></a>\n\n## 1. 一\n', encoding="utf-8")
    (tmp_path / "docs" / "errata.md").write_text('<a id="erratum-1"></a>\n\n## 1. One\n', encoding="utf-8")
    (tmp_path / "nb").mkdir()
    page = tmp_path / "nb" / "notes.md"
    page.write_text("[勘误 1](../docs/errata.zh-CN.md#erratum-1) [勘误表](../docs/errata.zh-CN.md)", encoding="utf-8")
    assert link_problems(page, tmp_path) == []
    page.write_text("[勘误 1](../docs/errata.zh-CN.md#erratum-2) [勘误 2](../docs/errata.zh-CN.md#erratum-1)"
                    " [docs/errata.md](../docs/errata.zh-CN.md) [errata](../docs/missing.md)", encoding="utf-8")
    assert link_problems(page, tmp_path) == [
        "nb/notes.md: [勘误 1] links errata.zh-CN.md#erratum-2, an anchor the page does not have",
        "nb/notes.md: [勘误 2] names erratum 2 but links errata.zh-CN.md#erratum-1",
        "nb/notes.md: [docs/errata.md] shows one file's name and links another, errata.zh-CN.md",
    ]
