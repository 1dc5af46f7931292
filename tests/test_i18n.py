"""course_utils.i18n: one language setting (COURSE_LANG, else the notebook's metadata), English by default."""

from __future__ import annotations

import ast
import json
import re
import string
from pathlib import Path

import pytest

from course_utils import i18n, inventory


def _notebook(folder, language=None):
    meta = {"kernelspec": {"name": "python3"}}
    if language:
        meta["course"] = {"language": language}
    path = folder / inventory.CHAPTERS[1].notebook  # a chapter's notebook, as a kernel's folder holds
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
    # JupyterLab names the notebook
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / inventory.CHAPTERS[1].notebook))
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


def _draw_chinese(tmp_path):
    import warnings

    from course_utils.figures import pyplot

    plt = pyplot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.set(title="计算图与反向传播 loss = -1.5", xlabel="步数 (step)", ylabel="梯度")
        ax.plot([-1, 1], [-2, 2], label="叶子张量")
        ax.legend()
        fig.savefig(tmp_path / "zh.png")
        plt.close(fig)
    return [str(w.message) for w in caught]


def test_chinese_text_in_figures_has_its_glyphs(tmp_path, monkeypatch):
    """No tofu: in the Chinese edition every character of a figure's text is drawn by a font that has
    it (matplotlib warns "Glyph ... missing from font(s)" for each one it cannot draw)."""
    import matplotlib

    from course_utils import figures

    monkeypatch.setenv("COURSE_LANG", "zh")
    monkeypatch.setattr(figures, "_state", {"family": None, "done": False})
    with matplotlib.rc_context():
        missing = _draw_chinese(tmp_path)
        family = figures._state["family"]
    assert family is not None, "no font with Chinese characters (is mplfonts installed?)"
    assert family in figures.CJK_FAMILIES
    assert not [m for m in missing if "missing from font" in m], missing


def test_english_figures_keep_matplotlibs_fonts(monkeypatch):
    import matplotlib

    from course_utils import figures

    monkeypatch.setenv("COURSE_LANG", "en")
    monkeypatch.setattr(figures, "_state", {"family": None, "done": False})
    with matplotlib.rc_context():
        before = list(matplotlib.rcParams["font.family"])
        figures.pyplot()
        assert matplotlib.rcParams["font.family"] == before and figures._state["family"] is None


def test_no_chinese_font_is_a_clear_warning(monkeypatch):
    import matplotlib

    from course_utils import figures

    monkeypatch.setenv("COURSE_LANG", "zh")
    monkeypatch.setattr(figures, "_state", {"family": None, "done": False})
    monkeypatch.setattr(figures, "cjk_family", lambda: None)
    with matplotlib.rc_context(), pytest.warns(UserWarning, match="No font with Chinese characters"):
        figures.use_course_font()


def test_chinese_figures_ask_only_for_the_fonts_weight(tmp_path, monkeypatch, caplog):
    """matplotlib logs "findfont: Failed to find font weight bold for Noto Sans CJK SC, now using 400"
    (on stderr, under the figure) when a figure asks for a weight the Chinese font does not ship:
    the course's pictures are drawn in the weight it has."""
    import logging

    import matplotlib

    from course_utils import figures
    from course_utils.ch04_distributed import draw_sampler

    monkeypatch.setenv("COURSE_LANG", "zh")
    monkeypatch.setattr(figures, "_state", {"family": None, "done": False})
    with matplotlib.rc_context(), caplog.at_level(logging.WARNING, logger="matplotlib.font_manager"):
        plt = figures.pyplot()
        fig = draw_sampler(10, 3, 0, True)
        fig.savefig(tmp_path / "sampler.png")
        plt.close(fig)
    assert not [r.getMessage() for r in caplog.records if "findfont" in r.getMessage()]


def test_speaking_wins_over_the_environment_and_ends_with_its_block(monkeypatch):
    """A server answers each request in the language it asks for: speaking() sets it for one block, in
    one thread or task only, over COURSE_LANG, and the setting before it comes back after it."""
    import threading

    monkeypatch.setenv("COURSE_LANG", "en")
    with i18n.speaking("zh") as code:
        assert code == "zh-CN" and i18n.tr("done", "已完成") == "已完成"
        seen = []
        worker = threading.Thread(target=lambda: seen.append(i18n.tr("done", "已完成")))
        worker.start()
        worker.join()
        assert seen == ["done"], "another thread kept its own language"
        with i18n.speaking("en"):
            assert i18n.tr("done", "已完成") == "done"
        assert i18n.language() == "zh-CN"
    assert i18n.language() == "en"
    with pytest.raises(ValueError, match="not a language of the course"):
        with i18n.speaking("fr"):
            pass


def test_a_checkpoint_refused_and_a_backend_warning_speak_chinese(tmp_path, monkeypatch):
    """What the Chinese edition's chapter 05 prints from the helpers: a damaged checkpoint's refusal and
    the backend's warning, in Chinese; in English as before."""
    from unittest import mock

    from course_utils import dist
    from course_utils.ch05_full_pipeline import CheckpointError, load_checkpoint

    bad = tmp_path / "last.pt"
    bad.write_bytes(b"not a checkpoint")
    for lang, words, warned in (("zh", "检查点 last.pt 无法读取", "本节点上有 2 个进程，却只有 1 块 GPU"),
                                ("en", "the checkpoint last.pt cannot be read",
                                 "2 processes on this node but 1 GPU(s)")):
        monkeypatch.setenv("COURSE_LANG", lang)
        with pytest.raises(CheckpointError, match=re.escape(words)):
            load_checkpoint(bad)
        with mock.patch("torch.cuda.is_available", return_value=True), \
             mock.patch("torch.cuda.device_count", return_value=1), pytest.warns(UserWarning, match=re.escape(warned)):
            assert dist.choose_backend(2) == "gloo"


# --- tr(en, zh, **fields): two templates, each value computed once ----------------------------------

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("course_utils", "notebooks/scripts", "tools")


def _fields(template: str) -> set[str]:
    """The field names of a format template, those inside a format spec (``{x:{width}}``) included."""
    names = set()
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is not None:
            names.add(name)
            names |= _fields(spec or "")
    return names


#: the calls that take a text in each language, and how many positional arguments come before the two
TEMPLATE_CALLS = {"tr": 0, "describe_figure": 1}


def tr_problems(source: str, where: str = "<source>") -> list[str]:
    """What is wrong with the tr() and describe_figure() calls of Python `source`: each takes two string
    literals (no f-string, no ``+``, no variable) and, as keywords, exactly the fields both templates name."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in TEMPLATE_CALLS:
            continue
        at, texts = f"{where}:{node.lineno}", node.args[TEMPLATE_CALLS[name]:]
        if len(texts) != 2 or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in texts):
            given = ", ".join(ast.unparse(a) for a in texts)
            problems.append(f"{at}: {name}() takes two string literals, not {given}")
            continue
        keywords = [k.arg for k in node.keywords]
        if None in keywords:
            problems.append(f"{at}: {name}() names its fields one by one (no **mapping)")
            continue
        for template in (a.value for a in texts):
            try:
                names = _fields(template)
            except ValueError as exc:
                problems.append(f"{at}: {template!r} is not a format template ({exc}): write a brace twice")
                continue
            if names != set(keywords):
                problems.append(f"{at}: {template!r} names the fields {sorted(names)}, "
                                f"the call gives {sorted(keywords)}")
    return problems


# Calls whose source lines a stored output quotes, kept as they are: chapter 06's traceback of a spawned
# function that fails shows the lines around spawn.py:138 (this call included) in both editions.
QUOTED = ("course_utils/launch/spawn.py:135:",)
# describe_figure() hands its caller's templates (checked where it is called) on to tr(): that call alone
FORWARDED = ("course_utils/figures.py:", ": tr() takes two string literals, not en, zh")


def test_every_tr_call_has_two_templates_with_the_fields_it_gives():
    files = sorted(p for folder in SOURCES for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 50
    problems = [x for p in files for x in tr_problems(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
                if not (x.startswith(FORWARDED[0]) and x.endswith(FORWARDED[1]))]
    assert not [x for x in problems if not x.startswith(QUOTED)], "\n".join(problems)
    assert len(problems) == len(QUOTED), "a quoted call moved or was converted: update QUOTED (and the outputs)"


@pytest.mark.parametrize("call", [
    'tr(f"epoch {e}", f"第 {e} 轮")',  # f-strings: each expression written twice
    'tr("epoch " + str(e), "第 " + str(e) + " 轮")',  # concatenation
    'tr(*PAIR)',  # not literals
    'tr("epoch {e}", "第 {e} 轮")',  # a field and no keyword
    'tr("epoch", "轮", e=e)',  # a keyword and no field
    'tr("epoch {e}", "第 {n} 轮", e=e, n=n)',  # the templates name different fields
    'tr("a dict {}", "一个 dict {}")',  # a brace not written twice
    'tr("epoch {e", "第 {e 轮", e=e)',  # not a template
    'i18n.tr("{e}", "{e}", **fields)',
    'describe_figure(fig, f"{n} bars", f"{n} 个条")',
    'describe_figure(fig, "A chart: " + said, "图：" + said_zh)',
    'describe_figure(fig, "{n} bars", "{n} 个条")',
])
def test_the_check_refuses(call):
    assert tr_problems(call)


@pytest.mark.parametrize("call", [
    'tr("done", "已完成")',
    'tr("epoch {e}: loss {loss:.3f}", "第 {e} 轮：损失 {loss:.3f}", e=epoch, loss=r.loss)',
    'tr("a dict {{key: value}}", "一个 dict {{键: 值}}")',
    'tr("{x:>{width}}", "{x:>{width}}", x=x, width=w)',
    'i18n.tr("the " "{n} " "files", "{n} 个" "文件", n=n)',  # implicit concatenation is one literal
    'describe_figure(fig, "{n} bars: {said}", "{n} 个条：{said}", n=len(bars), said=said)',
])
def test_the_check_accepts(call):
    assert not tr_problems(call)


def test_tr_fills_the_template_of_the_language():
    args = ("epoch {e}: loss {loss:.3f} ({name!r})", "第 {e} 轮：损失 {loss:.3f}（{name!r}）")
    with i18n.speaking("en"):
        assert i18n.tr(*args, e=3, loss=0.12345, name="mlp") == "epoch 3: loss 0.123 ('mlp')"
        assert i18n.tr("{n:,} nodes, {x:>{w}}|", "", n=12345, x="a", w=3) == "12,345 nodes,   a|"
    with i18n.speaking("zh"):
        assert i18n.tr(*args, e=3, loss=0.12345, name="mlp") == "第 3 轮：损失 0.123（'mlp'）"


def test_a_template_is_always_a_format_string():
    """Braces are written twice, with fields or without; a value's braces are the value's."""
    for lang in ("en", "zh"):
        with i18n.speaking(lang):
            assert i18n.tr("{{a}}", "{{a}}") == "{a}"
            assert i18n.tr("{{{x}}}", "{{{x}}}", x="{y}") == "{{y}}"
    with pytest.raises(KeyError):
        i18n.tr("epoch {e}", "第 {e} 轮")


def test_a_value_next_to_a_chinese_letter_is_spaced_as_spaced_does():
    with i18n.speaking("zh"):
        for it in ("None", "一个列表", "", "`x`", "3"):
            assert i18n.tr("", "而不是{it}。", it=it) == i18n.spaced("而不是", it, "。")
            assert i18n.tr("", "{it}的每一项", it=it) == i18n.spaced(it, "的每一项")
            for key in ("x.grad", "的返回值", ""):  # two values side by side
                assert i18n.tr("", "{where}{key}{it}。", where="对于 x，", key=key, it=it) == \
                    i18n.spaced("对于 x，", key, it, "。")
        # Latin punctuation of the template stays next to its value; so does text written around it
        assert i18n.tr("", "`{name}` 的值", name="损失") == "`损失` 的值"
        assert i18n.tr("", "第 {i} 步", i=2) == "第 2 步"
    with i18n.speaking("en"):
        assert i18n.tr("the {it}", "", it="张量") == "the 张量"


def test_a_field_one_language_leaves_out():
    args = ("load {load:.1f} on {cores} cores", "负载 {load:.1f}{cores:.0}")
    with i18n.speaking("en"):
        assert i18n.tr(*args, load=1.25, cores="4") == "load 1.2 on 4 cores"
    with i18n.speaking("zh"):
        assert i18n.tr(*args, load=1.25, cores="4") == "负载 1.2"


def test_table_pads_by_terminal_columns():
    rows = [("章节", "Q1", "done"), ("01 autograd", "已完成", "1/1"), ("02", "", "0/1")]
    assert i18n.table(rows) == ["章节         Q1      done",
                                "01 autograd  已完成  1/1",
                                "02                   0/1"]
    assert i18n.table([("a", 1), ("bbb", 22)], align="<>", sep=" ", widths=(0, 4), rule="-") == \
        ["a      1", "--- ----", "bbb   22"]
    assert i18n.table([]) == []
