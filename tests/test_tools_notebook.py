"""tools/notebook.py: what `make execute` records of a run (the book's "last run" line reads it), and
tools/translate.py keeping it for the Chinese notebook whose outputs it keeps."""

from __future__ import annotations

import json
import re
import time

import nbformat

from tools import notebook, translate


def test_finish_records_the_run_that_made_the_outputs():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")],
                                  metadata={"language_info": {"name": "python"}})
    notebook._finish(nb, run={"torch": "2.14.1+cu130", "date": "2026-12-06"})
    assert nb.metadata["course"]["last_run"] == {"torch": "2.14.1+cu130", "date": "2026-12-06"}
    nbformat.validate(nb)  # still a valid notebook


def test_finish_keeps_the_rest_of_the_course_metadata():
    nb = nbformat.v4.new_notebook(metadata={"course": {"language": "zh-CN", "built_from": "notebooks/x.ipynb"}})
    notebook._finish(nb)
    course = nb.metadata["course"]
    assert course["language"] == "zh-CN" and course["built_from"] == "notebooks/x.ipynb"
    assert set(course["last_run"]) == {"torch", "date"}


def test_the_run_recorded_by_default_is_this_environments_torch_and_todays_date():
    import torch

    run = notebook.last_run()
    assert run["torch"] == torch.__version__  # the kernel runs in this environment
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", run["date"])
    assert run["date"] == time.strftime("%Y-%m-%d", time.gmtime())
    assert notebook.last_run(0.0)["date"] == "1970-01-01"


def _english(tmp_path, run):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    nb.cells[0].execution_count = 1
    if run:
        nb.metadata["course"] = {"last_run": run}
    path = tmp_path / "en" / "99_x.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_translate_keeps_the_chinese_notebooks_own_last_run(tmp_path, monkeypatch):
    monkeypatch.setattr(translate, "TARGET", tmp_path / "zh")
    (tmp_path / "zh").mkdir()
    english = _english(tmp_path, {"torch": "2.14.1", "date": "2026-12-01"})
    built = translate.build_one(english)  # no Chinese notebook yet: no run made its outputs
    assert "last_run" not in built["metadata"]["course"]
    built["metadata"]["course"]["last_run"] = {"torch": "2.14.1", "date": "2026-12-05"}
    (tmp_path / "zh" / english.name).write_text(json.dumps(built), encoding="utf-8")
    again = translate.build_one(english)
    assert again["metadata"]["course"]["last_run"] == {"torch": "2.14.1", "date": "2026-12-05"}
    assert again["metadata"]["course"]["language"] == "zh-CN"
