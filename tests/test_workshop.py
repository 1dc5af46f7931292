"""The instructor guide (docs/instructor/): its generated parts match the exercises, each chapter's
timed plan adds up to the chapter's slot in the course map, and its failure tables name the doctor's
real checks."""

import json
import re
import sys

import pytest

from course_utils import ROOT, doctor, inventory

sys.path.insert(0, str(ROOT))
from tools import workshop  # noqa: E402

GUIDE = ROOT / "docs" / "instructor"
PAGES = "docs/instructor"  # as the check names them
NOTEBOOKS = inventory.notebooks("en")
CHAPTERS = [nb.stem for nb in NOTEBOOKS]
FAILURES = "When a laptop fails"
DOCTOR = "python -m course_utils doctor --workshop"


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown page, up to the next ``## `` heading."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, f"no '## {heading}' section"
    return m.group(1)


def _tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in `text`: its rows (header first, no separator) as lists of cells."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _page(chapter: str) -> str:
    return (GUIDE / f"{chapter}.md").read_text(encoding="utf-8")


def course_map() -> dict[str, int]:
    """``{notebook: minutes}`` from the course map table of 00_start_here.ipynb."""
    nb = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith("## The course map"):
            header, *rows = _tables(text)[0]
            name, time = header.index("notebook"), header.index("time")
            minutes = [0 if row[time] == "self-study" else int(re.fullmatch(r"(\d+) min", row[time]).group(1))
                       for row in rows]  # a self-study chapter: no slot in the workshop
            return {row[name].strip("`"): m for row, m in zip(rows, minutes, strict=True)}
    raise AssertionError("00_start_here.ipynb has no '## The course map' cell")


def _headings(notebook) -> list[str]:
    """The notebook's ``## `` section headings of its core path: without its "You will learn" list and
    without its deep dives (self-study, outside the timed plan)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    lines = ["".join(c["source"]).splitlines() for c in cells if c["cell_type"] == "markdown"]
    found = [ln[3:].strip() for cell in lines for ln in cell if ln.startswith("## ")]
    return [h for h in found if h != "You will learn" and not h.startswith("Deep dive: ")]


def test_one_page_per_notebook_and_an_index():
    pages = sorted(p.stem for p in GUIDE.glob("*.md") if re.fullmatch(r"\d\d_\w+", p.stem))
    assert pages == CHAPTERS
    index = (GUIDE / "README.md").read_text(encoding="utf-8")
    for page in [*CHAPTERS, "answer-key"]:
        assert f"({page}.md)" in index, f"README.md does not link {page}.md"


def test_generated_parts_are_current():
    problems = workshop.stale()
    assert not problems, "\n".join(problems) + f"\nrun `{workshop.COMMAND}` to rewrite them"


def test_the_check_fails_when_a_reason_changes(monkeypatch):
    """A reason edited in the words file (here in memory) makes the chapter's section stale."""
    nb = ROOT / "notebooks" / "01_autograd.ipynb"
    _, q = workshop.exercises(nb)[0]
    name = next(iter(q.reasons))
    before = set(workshop.stale())
    monkeypatch.setitem(q.reasons, name, q.reasons[name] + " (reworded)")
    assert set(workshop.stale()) - before == {f"{PAGES}/01_autograd.md: section 'stuck' is stale"}
    assert workshop.main(["--check"]) == 1


def test_the_check_fails_when_a_prompt_or_a_solution_changes(monkeypatch):
    nb = ROOT / "notebooks" / "04_distributed.ipynb"
    _, q = workshop.exercises(nb)[-1]
    before = set(workshop.stale())
    monkeypatch.setattr(q, "prompt", q.prompt + " (reworded)")
    page, key = f"{PAGES}/04_distributed.md", f"{PAGES}/answer-key.md"
    assert set(workshop.stale()) - before == {f"{page}: section 'stuck' is stale", f"{key}: stale"}
    monkeypatch.undo()
    monkeypatch.setattr(q, "model_answer", lambda: 128)  # another solution, another shown source
    assert set(workshop.stale()) - before == {f"{key}: stale"}


def test_stuck_sections_quote_every_mistake_and_hint_and_the_key_every_solution():
    key = (GUIDE / "answer-key.md").read_text(encoding="utf-8")
    assert "not a secret" in key.split("\n## ")[0]
    for nb in NOTEBOOKS:
        stuck = _section(_page(nb.stem), "Where learners get stuck")
        assert workshop.begin("stuck") in stuck and workshop.END in stuck
        for var, q in workshop.exercises(nb):
            assert f"### `{var}` · {q.name}" in stuck
            for name in q.mistakes:
                assert f"| `{name}` |" in stuck
            assert q.solution().body in key


def test_a_page_without_markers_is_reported():
    with pytest.raises(ValueError, match="no section 'stuck'"):
        workshop.with_section("# a page\n", "stuck", "body")
    text = f"before\n{workshop.begin('stuck')}\nold\n{workshop.END}\nafter\n"
    once = workshop.with_section(text, "stuck", "new")
    assert once == f"before\n{workshop.begin('stuck')}\nnew\n{workshop.END}\nafter\n"
    assert workshop.with_section(once, "stuck", "new") == once


def test_the_course_map_lists_every_chapter():
    assert sorted(course_map()) == CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_timed_plan_adds_up_to_the_chapter_slot(chapter):
    slot = course_map()[chapter]
    header, *rows = _tables(_section(_page(chapter), "Timed plan"))[0]
    assert header[:3] == ["section", "teach", "exercises"]
    *plan, total = rows
    assert total[0] == "**total**", "the plan's last row is its total"
    teach, exercises = sum(int(r[1]) for r in plan), sum(int(r[2]) for r in plan)
    planned = f"{chapter}: {teach} + {exercises} minutes planned, the course map says {slot}"
    assert teach + exercises == slot, planned
    assert (int(total[1]), int(total[2])) == (teach, exercises)
    assert f"{slot} min" in total[3]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_timed_plan_follows_the_notebook_sections(chapter):
    _, *rows = _tables(_section(_page(chapter), "Timed plan"))[0]
    planned = [r[0] for r in rows[:-1]]
    assert planned == _headings(ROOT / "notebooks" / f"{chapter}.ipynb")


def _doctor_checks() -> set[str]:
    """Every check name that `python -m course_utils doctor --workshop` can print."""
    return {c.name for c in doctor.run_checks()} | {item.name for item in doctor.WORKSHOP}


def _failure_rows(page: str) -> list[list[str]]:
    rows = [row for table in _tables(_section(page, FAILURES)) for row in table[1:]]
    assert rows, f"no table under '## {FAILURES}'"
    return rows


def test_failure_tables_name_real_doctor_checks():
    checks = _doctor_checks()
    paths = [GUIDE / "README.md", *(GUIDE / f"{chapter}.md" for chapter in CHAPTERS)]
    pages = {p.name: p.read_text(encoding="utf-8") for p in paths}
    for name, page in pages.items():
        for row in _failure_rows(page):
            check = row[0].strip("`")
            assert check in checks, f"{name}: `{check}` is not a line of `{DOCTOR}`"
            assert row[1] in ("WARN", "FAIL"), f"{name}: {row[:2]}"


def test_every_doctor_check_has_an_entry():
    readme = (GUIDE / "README.md").read_text(encoding="utf-8")
    listed = {row[0].strip("`") for row in _failure_rows(readme)}
    missing = _doctor_checks() - listed
    assert not missing, f"README.md's '{FAILURES}' table has no row for {sorted(missing)}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_guide_names_every_deep_dive_as_self_study(chapter):
    from tools import corepath

    nb = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    part = _section(_page(chapter), "Self-study: the deep dives")
    assert workshop.begin("selfstudy") in part and workshop.END in part
    deep = [s.title.removeprefix("Deep dive: ") for s in corepath.sections(nb) if s.deep]
    for title in deep:
        assert f"| {workshop._cell(title)} |" in part, f"{chapter}: the guide does not list the deep dive {title!r}"
    if not deep:
        assert "no deep dives" in part


def test_selfstudy_lists_a_deep_dive_after_its_section(tmp_path, monkeypatch):
    """On a small notebook: the deep dive is listed with the core section before it and its words."""
    from tools import corepath

    cells = [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "# 09 · Test\n\nintro"},
        {"cell_type": "markdown", "id": "b", "metadata": {}, "source": "## 1. Core part\n\none two three"},
        {"cell_type": "markdown", "id": "c", "metadata": {"tags": ["deep-dive"]},
         "source": "## Deep dive: the long story\n\n" + "word " * 300},
        {"cell_type": "markdown", "id": "d", "metadata": {}, "source": "## Recap\n\n- done"},
    ]
    nb = tmp_path / "09_test.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    monkeypatch.setattr(corepath, "exercise_minutes", lambda chapter: 5)
    monkeypatch.setattr(corepath, "course_map", lambda: {"09_test": 10})
    text = workshop.selfstudy(nb)
    assert "| the long story | 1. Core part | 306 | 2 |" in text
    assert "of the 10-min slot" in text
