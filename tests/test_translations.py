"""The Chinese edition (notebooks-zh/) is the build of the English notebooks and i18n/zh-CN/: every
Markdown cell has a current translation, and the code cells are the English ones."""

from __future__ import annotations

import json
import shutil

import pytest

from course_utils import ROOT
from tools import translate


def test_every_markdown_cell_has_a_current_translation_and_the_build_is_current():
    found = [p for nb in translate.notebooks() for p in translate.problems(nb)]
    found += [p for nb in translate.notebooks() for p in translate.code_drift(nb)]
    assert not found, "\n".join(found) + "\nsee tools/translate.py: `python -m tools.translate build`"


def test_a_changed_english_word_makes_the_translation_stale(tmp_path, monkeypatch):
    source = tmp_path / "notebooks"
    source.mkdir()
    nb_path = source / "01_autograd.ipynb"
    shutil.copy(ROOT / "notebooks" / "01_autograd.ipynb", nb_path)
    monkeypatch.setattr(translate, "SOURCE", source)
    assert translate.problems(nb_path) == []
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and "graph" in "".join(c["source"]))
    cell["source"] = "".join(cell["source"]).replace("graph", "grahp", 1).splitlines(keepends=True)
    nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (problem,) = translate.problems(nb_path)
    assert problem.startswith(f"stale translation (the English text changed): 01_autograd.ipynb cell {cell['id']} (")
    assert translate.main(["check"]) == 1


@pytest.mark.parametrize("nb", [p.name for p in translate.notebooks()])
def test_chinese_notebook_metadata_names_its_language(nb):
    meta = json.loads((translate.TARGET / nb).read_text(encoding="utf-8"))["metadata"]
    assert meta["course"]["language"] == "zh-CN"
