"""The Chinese edition (notebooks-zh/) is the build of the English notebooks and i18n/zh-CN/: every
Markdown cell has a current translation, and every code cell is the English one, token for token
but for comments and string literals (a code cell may be translated: its comments and printed labels)."""

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


def test_chinese_code_may_differ_in_comments_and_strings_only():
    english = 'x = torch.ones(3)  # three ones\nprint(f"sum: {x.sum():.1f}", "done")\n'
    assert translate.same_code(english, 'x = torch.ones(3)  # 三个 1\nprint(f"总和：{x.sum():.1f}", "完成")\n') is None
    assert translate.same_code(
        english, "# 先建张量\nx = torch.ones(3)\n# 再打印\nprint(f'总和：{x.sum():.1f}', '完成')\n") is None
    renamed = translate.same_code(english, 'y = torch.ones(3)  # 三个 1\nprint(f"sum: {x.sum():.1f}", "done")\n')
    assert renamed == "line 1: 'y' where the English code has 'x'"
    assert translate.same_code(english, 'x = torch.ones(4)\nprint(f"sum: {x.sum():.1f}", "done")\n').startswith(
        "line 1: '4'")
    assert translate.same_code(english, 'x = torch.ones(3)\n') is not None  # a line left out
    assert translate.same_code(english, 'x = (torch.ones(3)\n').startswith("not Python code")


def test_an_identifier_changed_inside_an_f_string_is_refused():
    """The expressions of an f-string are code on every Python (3.11 reads an f-string as one token)."""
    english = 'total = 3\nprint(f"sum: {total:>4} of {len(names)!r}")\n'
    assert translate.same_code(english, 'total = 3\nprint(f"总和：{total:>6}，共 {len(names)!r}")\n') is None
    assert translate.same_code(english, 'total = 3\nprint(f"总和：{totl:>4} of {len(names)!r}")\n') == (
        "line 2: 'totl' where the English code has 'total'")
    assert translate.same_code(english, 'total = 3\nprint(f"sum: {total:>4} of {len(names)!s}")\n') is not None
    assert translate.same_code('print(f"{\'ab\':<3}")', 'print(f"{\'中文\':<2}")') is None  # a string inside


def test_a_code_cells_translation_builds_and_an_identifier_changed_in_it_is_refused(tmp_path, monkeypatch):
    """A code cell's translation (comments and printed labels in Chinese) builds into the Chinese
    notebook; an identifier changed in it is refused, naming the cell and the line."""
    source, words = tmp_path / "notebooks", tmp_path / "i18n"
    source.mkdir()
    words.mkdir()
    english = 'total = sum(range(4))  # add them up\nprint("total:", total)\n'
    nb = {"cells": [
        {"cell_type": "markdown", "id": "aaaa0001", "metadata": {}, "source": ["# 09 · A test"]},
        {"cell_type": "code", "id": "cccc0001", "metadata": {}, "execution_count": None, "outputs": [],
         "source": english.splitlines(keepends=True)},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    nb_path = source / "09_test.ipynb"
    nb_path.write_text(json.dumps(nb), encoding="utf-8")
    monkeypatch.setattr(translate, "SOURCE", source)
    monkeypatch.setattr(translate, "TRANSLATIONS", words)

    def write(code: str) -> None:
        (words / "09_test.toml").write_text(
            f'["aaaa0001"]\nhash = "{translate.text_hash("# 09 · A test")}"\nzh = "# 09 · 测试"\n\n'
            f'["cccc0001"]\nhash = "{translate.text_hash(english)}"\nen = "total"\ncode = \'\'\'\n{code}\'\'\'\n',
            encoding="utf-8")

    write('total = sum(range(4))  # 全部加起来\nprint("总和：", total)\n')
    assert translate.problems(nb_path) == []
    built = translate.build_one(nb_path)["cells"][1]
    assert "".join(built["source"]) == 'total = sum(range(4))  # 全部加起来\nprint("总和：", total)'
    write('total = sum(range(5))  # 全部加起来\nprint("总和：", total)\n')
    (problem,) = translate.problems(nb_path)
    assert problem.startswith("the Chinese code differs from the English beyond comments and strings: "
                              "09_test.ipynb cell cccc0001 (")
    assert problem.endswith("line 1: '5' where the English code has '4'")
    nb["cells"][1]["source"] = ["total = sum(range(3))\n"]
    nb_path.write_text(json.dumps(nb), encoding="utf-8")
    (problem,) = translate.problems(nb_path)
    assert problem.startswith("stale translation (the English code changed): 09_test.ipynb cell cccc0001")
