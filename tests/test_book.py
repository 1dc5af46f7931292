"""tools/book.py's staging: what each chapter page adds to the notebook, and the links between pages.
(The built site itself is checked in a browser: tests/book/, `make test-book`.)"""

from __future__ import annotations

import json

import pytest

from course_utils import ROOT
from tools import book


def test_the_readme_has_the_learner_sections_the_book_takes():
    found = book.sections((ROOT / "README.md").read_text(encoding="utf-8"))
    assert set(book.LEARNER_SECTIONS) | {book.CHINESE_SECTION, "Chapters"} <= set(found)


def test_a_chapter_says_when_its_outputs_were_made_or_that_it_is_not_recorded():
    nb = {"metadata": {"course": {"last_run": {"torch": "2.14.1+cu130", "date": "2026-12-06"}}}, "cells": []}
    cell = book.chapter_header(nb, "en", "_notebooks/01_autograd.ipynb")
    assert "Last run: torch 2.14.1+cu130, 2026-12-06" in cell["source"]
    assert "{download}`Download this notebook (01_autograd.ipynb) <_notebooks/01_autograd.ipynb>`" in cell["source"]
    zh = book.chapter_header(nb, "zh-CN", "_notebooks/01_autograd.ipynb")["source"]
    assert "最近一次运行：torch 2.14.1+cu130，2026-12-06" in zh
    for meta in ({}, {"course": {}}, {"course": {"last_run": {"torch": "2.14.1"}}}, {"course": {"last_run": "x"}}):
        assert book.last_run({"metadata": meta}) is None
        assert "Last run: not recorded" in book.chapter_header({"metadata": meta}, "en", "x.ipynb")["source"]
        assert "最近一次运行：未记录" in book.chapter_header({"metadata": meta}, "zh-CN", "x.ipynb")["source"]


def _notebook(tmp_path, cells):
    path = tmp_path / "notebooks" / "01_autograd.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"metadata": {}, "nbformat": 4, "nbformat_minor": 5, "cells": cells}))
    return path


def test_a_live_widget_gets_a_note_and_its_widget_output_goes(tmp_path):
    widget = {"output_type": "display_data", "metadata": {},
              "data": {book.WIDGET_MIME: {"model_id": "x"}, "text/plain": "VBox(...)"}}
    cells = [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# 01 · Title"},
             {"cell_type": "code", "id": "w", "metadata": {}, "source": "widget()", "outputs": [widget],
              "execution_count": 1},
             {"cell_type": "code", "id": "s", "metadata": {}, "source": "static()", "outputs": [],
              "execution_count": 2}]
    staged = book.stage_notebook(_notebook(tmp_path, cells), "en", {}, {})
    assert [c["id"] for c in staged["cells"]] == ["t", "course-book-meta", "w", "w-live", "s"]
    assert staged["cells"][2]["outputs"] == []
    assert "runs here in JupyterLab" in staged["cells"][3]["source"]


def test_a_chapter_that_shows_a_solution_is_refused(tmp_path):
    cells = [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# 01 · Title"},
             {"cell_type": "code", "id": "s", "metadata": {}, "source": "q1.solution()", "execution_count": 1,
              "outputs": [{"output_type": "display_data", "metadata": {}, "data": {"text/plain": "def ..."}}]}]
    with pytest.raises(SystemExit, match=r"notebooks/01_autograd.ipynb cell s shows an exercise's solution"):
        book.stage_notebook(_notebook(tmp_path, cells), "en", {}, {})
    cells[1]["source"] = "# q1.solution() shows a worked solution\nq1.hint()"
    book.stage_notebook(_notebook(tmp_path, cells), "en", {}, {})  # a comment, and a hint, are fine


def test_links_go_to_the_pages_that_hold_their_targets():
    pages = book.page_map("en")
    anchors = {"about.md": {"two-commands"}}
    errata = ROOT / "docs" / "errata.md"
    text = ("See [chapter 01](../notebooks/01_autograd.ipynb), [erratum 1](errata.md#1-the-first-example), "
            "[the day](instructor/README.md#the-day), [a script](../notebooks/scripts/train.py), "
            "[left out](../README.md#offline-install-for-a-workshop-room), [kept](../README.md#two-commands), "
            "[a typo](errata.md#no-such-heading), [the web](https://pytorch.org/) and `[code](x.md)`.")
    out = book.relink(text, errata, "errata.md", pages, anchors)
    assert "[chapter 01](01_autograd.ipynb)" in out
    assert "[erratum 1](errata.md#1-the-first-example)" in out
    assert "[the day](instructor/README.md#the-day)" in out
    assert "[a script](../notebooks/scripts/train.py)" not in out and "a script (`notebooks/scripts/train.py`)" in out
    assert "left out" in out and "offline-install" not in out and "[kept](about.md#two-commands)" in out
    assert "[a typo](errata.md#no-such-heading)" in out  # kept: the build fails on it
    assert "[the web](https://pytorch.org/)" in out and "`[code](x.md)`" in out
    # from a page one folder down
    back = book.relink("[errata](../errata.md)", ROOT / "docs" / "instructor" / "01_autograd.md",
                       "instructor/01_autograd.md", pages)
    assert back == "[errata](../errata.md)"


def test_a_link_label_with_code_in_it_is_rewritten_whole():
    pages = book.page_map("en")
    out = book.relink("[01 › 7. `retain_graph` versus `create_graph`](../notebooks/01_autograd.ipynb)",
                      ROOT / "docs" / "errata.md", "errata.md", pages)
    assert out == "[01 › 7. `retain_graph` versus `create_graph`](01_autograd.ipynb)"


def test_the_search_dictionary_holds_the_glossarys_chinese_terms():
    words = book.search_words((ROOT / "i18n" / "zh-CN" / "glossary.md").read_text(encoding="utf-8"))
    terms = {line.split()[0] for line in words.splitlines()}
    assert {"计算图", "叶子张量", "反向传播"} <= terms
    assert not any(ch.isascii() and ch.isalpha() for t in terms for ch in t)


@pytest.mark.parametrize("edition", book.EDITIONS)
def test_every_edition_stages_the_same_pages(tmp_path, edition):
    names = book.stage(edition, tmp_path / edition)
    chapters = [p.stem for p in book.chapters(book.SOURCES["en"])]
    assert set(chapters) <= set(names)
    assert {"index", "about", "errata", "glossary", "instructor/README", "instructor/answer-key"} <= set(names)
    # the glossary's page is in Chinese; the English sidebar names it in English
    entry = "Glossary of the Chinese edition (术语表) <glossary>" if edition == "en" else "术语表 <glossary>"
    assert entry in (tmp_path / edition / "index.md").read_text(encoding="utf-8")
    for nb in chapters:
        staged = json.loads((tmp_path / edition / f"{nb}.ipynb").read_text(encoding="utf-8"))
        assert staged["cells"][1]["id"] == "course-book-meta"
        assert (tmp_path / edition / "_notebooks" / f"{nb}.ipynb").is_file()
