"""Core path and deep dives (tools/corepath.py): the convention holds in both editions, each shaped
chapter's core path fits its slot in the course map, and the rules on small notebooks."""

import json
import sys

import pytest

from course_utils import ROOT, inventory

sys.path.insert(0, str(ROOT))
from tools import corepath  # noqa: E402

NOTEBOOKS = inventory.notebooks("en")
CHINESE = inventory.notebooks("zh-CN")


def md(text, tags=()):
    return {"cell_type": "markdown", "id": "m", "metadata": {"tags": list(tags)}, "source": text}


def code(text, tags=()):
    return {"cell_type": "code", "id": "c", "metadata": {"tags": list(tags)}, "outputs": [], "source": text}


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", NOTEBOOKS + CHINESE, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS + CHINESE])
def test_every_deep_dive_cell_is_tagged_and_no_other(path):
    problems = corepath.problems(load(path), path.name)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", CHINESE, ids=[p.name for p in CHINESE])
def test_the_chinese_edition_marks_the_same_deep_dives(path):
    english = load(ROOT / "notebooks" / path.name)
    chinese = load(path)
    assert corepath.deep_dive_cells(chinese) == corepath.deep_dive_cells(english)
    for i in corepath.deep_dive_cells(english):
        if corepath.opens_deep_dive(english["cells"][i]):
            assert corepath.first_line(chinese["cells"][i]).startswith(corepath.HEADING_ZH)


@pytest.mark.parametrize("chapter", corepath.SHAPED)
def test_the_core_path_fits_the_chapter_slot(chapter):
    b = corepath.budget(ROOT / "notebooks" / f"{chapter}.ipynb")
    assert b.fits, (f"{chapter}: {b.words:,} core words ({b.reading:.1f} min at {corepath.WORDS_PER_MINUTE} words a "
                    f"minute) + {b.exercises} min of exercises = {b.minutes} min, over the {b.slot}-min slot")


def test_every_shaped_chapter_but_the_first_has_deep_dives():
    for chapter in corepath.SHAPED[1:]:
        nb = load(ROOT / "notebooks" / f"{chapter}.ipynb")
        assert any(s.deep for s in corepath.sections(nb)), f"{chapter} has no deep dive"


def test_sections_and_words():
    nb = {"cells": [md("# 01 · T\n\none two"), md("## 1. Core\n\nthree"), code("x = 1  # four"),
                    md("## Deep dive: the rest\n\nfive six", ["deep-dive"]), code("y = 2", ["deep-dive"]),
                    md("### Inside it", ["deep-dive"]), md("## Recap\n\n- seven")]}
    found = corepath.sections(nb)
    assert [(s.title, s.deep) for s in found] == [("01 · T", False), ("1. Core", False),
                                                  ("Deep dive: the rest", True), ("Recap", False)]
    assert corepath.deep_dive_cells(nb) == {3, 4, 5}
    assert corepath.core_words(nb) == 6 + 4 + 5 + 4
    assert corepath.problems(nb) == []


def test_a_missing_or_stray_tag_is_reported():
    nb = {"cells": [md("# T"), md("## Deep dive: x\n\ntext", ["deep-dive"]), code("y = 2"),
                    md("## 2. Core"), code("z = 3", ["deep-dive"])]}
    problems = corepath.problems(nb, "nb")
    assert len(problems) == 2
    assert "inside a deep dive, without the cell tag" in problems[0]
    assert "outside a deep dive" in problems[1]


def test_the_course_map_and_the_exercise_minutes_are_read_from_their_sources():
    slots = corepath.course_map()
    assert slots["01_autograd"] == 60 and set(slots) == {p.stem for p in NOTEBOOKS}
    assert slots["07_parallelism"] == 0  # self-study
    assert all(0 < corepath.exercise_minutes(p.stem) < slots[p.stem] for p in NOTEBOOKS if slots[p.stem])


def test_check_fails_for_a_shaped_chapter_over_its_slot(tmp_path, monkeypatch, capsys):
    long = tmp_path / "01_autograd.ipynb"
    long.write_text(json.dumps({"cells": [md("# 01 · T\n\n" + "word " * 20_000)], "metadata": {}}))
    assert corepath.main(["--check", str(long)]) == 1
    assert "over its 60-min slot" in capsys.readouterr().err
    assert corepath.main(["--check", str(ROOT / "notebooks" / "01_autograd.ipynb")]) == 0
