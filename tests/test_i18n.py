"""course_utils.i18n: one language setting (COURSE_LANG, else the notebook's metadata), English by default."""

from __future__ import annotations

import json

import pytest

from course_utils import i18n


def _notebook(folder, language=None):
    meta = {"kernelspec": {"name": "python3"}}
    if language:
        meta["course"] = {"language": language}
    path = folder / "01_x.ipynb"
    path.write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_english_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert i18n.language() == "en" and i18n.tr("Correct", "正确") == "Correct"


def test_the_notebooks_metadata_sets_it(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    _notebook(tmp_path, "zh-CN")
    monkeypatch.chdir(tmp_path)  # a kernel runs in its notebook's folder
    assert i18n.language() == "zh-CN" and i18n.tr("Correct", "正确") == "正确"
    other = tmp_path / "lab"
    other.mkdir()
    monkeypatch.chdir(other)
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "01_x.ipynb"))  # JupyterLab names the notebook
    assert i18n.language() == "zh-CN"


@pytest.mark.parametrize(("value", "want"), [("zh", "zh-CN"), ("zh_CN.UTF-8", "zh-CN"), ("en", "en"), ("EN", "en")])
def test_the_environment_wins(tmp_path, monkeypatch, value, want):
    _notebook(tmp_path, "zh-CN")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COURSE_LANG", value)
    assert i18n.language() == want


def test_an_unknown_language_warns_and_uses_english(monkeypatch):
    monkeypatch.setenv("COURSE_LANG", "klingon")
    with pytest.warns(UserWarning, match="not a language of the course"):
        assert i18n.language() == "en"
