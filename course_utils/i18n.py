"""The course's language: English, or Chinese ("zh-CN") in the Chinese edition (notebooks-zh/).

One setting, read in this order: the language of a :func:`speaking` block (a server that answers each
request in the language it asks for); else the environment variable ``COURSE_LANG`` (``en`` or ``zh``); else
the ``course.language`` metadata of the running notebook (JupyterLab names it in
``JPY_SESSION_NAME``), else of the notebooks in the working directory (a kernel runs in its
notebook's folder); else English. Code cells are the same in both editions: the helpers choose
their words with :func:`tr`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import string
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from . import inventory

LANGUAGES = ("en", "zh-CN")
_ALIASES = {"en": "en", "english": "en", "zh": "zh-CN", "zh-cn": "zh-CN", "zh_cn": "zh-CN", "chinese": "zh-CN"}


def _normalise(value: str) -> str | None:
    key = value.strip().lower().split(".")[0]  # zh_CN.UTF-8 -> zh_cn
    return _ALIASES.get(key)


@functools.lru_cache(maxsize=32)
def _notebook_language(path: str, mtime: float) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            meta = json.load(fh).get("metadata", {})
    except (OSError, ValueError):
        return None
    lang = meta.get("course", {}).get("language")
    return _normalise(lang) if isinstance(lang, str) else None


def _from_notebook(path: Path) -> str | None:
    try:
        return _notebook_language(str(path), path.stat().st_mtime)
    except OSError:
        return None


_speaking: contextvars.ContextVar[str | None] = contextvars.ContextVar("course_language", default=None)


@contextlib.contextmanager
def speaking(lang: str) -> Iterator[str]:
    """Within the block, :func:`tr` answers in `lang` (``en``, ``zh``, ``zh-CN``...) whatever the
    environment says; each thread and each asyncio task has its own. ValueError for another language."""
    code = _normalise(lang)
    if code is None:
        raise ValueError(f"{lang!r} is not a language of the course (en, zh)")
    token = _speaking.set(code)
    try:
        yield code
    finally:
        _speaking.reset(token)


def language() -> str:
    """``"en"`` or ``"zh-CN"`` (see the module's docstring)."""
    chosen = _speaking.get()
    if chosen is not None:
        return chosen
    env = os.environ.get("COURSE_LANG", "").strip()
    if env:
        lang = _normalise(env)
        if lang is None:
            warnings.warn(f"COURSE_LANG={env!r} is not a language of the course (en, zh); using English",
                          stacklevel=2)
            return "en"
        return lang
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session.endswith(".ipynb"):
        lang = _from_notebook(Path(session))
        if lang:
            return lang
    for path in inventory.notebooks_in(Path.cwd())[:1]:
        lang = _from_notebook(path)
        if lang:
            return lang
    return "en"


_FORMATTER = string.Formatter()


def tr(en: str, zh: str, /, **fields: object) -> str:
    """`en` or `zh`, in the course's language, filled with `fields` as :meth:`str.format` fills a template.

    Both templates are plain string literals that name the same fields, and each value is computed once,
    as a keyword: ``tr("epoch {e}: loss {loss:.3f}", "第 {e} 轮：损失 {loss:.3f}", e=epoch, loss=r.loss)``.
    A template is always a format string: a literal brace is written twice (``{{`` and ``}}``), with fields
    or without. Where a value meets a Chinese letter of its template, or another value, a Chinese letter
    and a Latin letter, digit or code on either side are set apart by a space, as :func:`spaced` does:
    ``"而不是{it}。"`` gives ``而不是 None。`` and ``而不是一个列表。`` (Latin punctuation of the template, as
    in ``"`{name}`"``, stays next to its value). Where the languages need different words (a plural, a
    clause in one language only), pass a phrase made by its own ``tr()`` as a field; where one language
    leaves a value out, its template names it cut to nothing, ``{cores:.0}`` (a string value), so that
    both still name the same fields (``tests/test_i18n.py`` checks that they do).
    """
    return _fill(zh if language() == "zh-CN" else en, fields)


def _fill(template: str, fields: dict[str, object]) -> str:
    out: list[str] = []
    last, from_value = "", False  # the last character written, and whether a value (not the template) wrote it
    # spaced()'s rule, where the Latin side is a value: the template's own text is written as it is
    for text, name, spec, conversion in _FORMATTER.parse(template):
        if text:
            if from_value and _latin_side(last, text[0]) == "left":
                out.append(" ")
            out.append(text)
            last, from_value = text[-1], False
        if name is None:
            continue
        value, _ = _FORMATTER.get_field(name, (), fields)
        value = _FORMATTER.format_field(_FORMATTER.convert_field(value, conversion),
                                        _FORMATTER.vformat(spec or "", (), fields))
        if value:
            side = _latin_side(last, value[0]) if last else None
            if side == "right" or side == "left" and from_value:
                out.append(" ")
            out.append(value)
            last, from_value = value[-1], True
    return "".join(out)


def text_width(text: str) -> int:
    """The columns `text` takes in a monospace font: a Chinese (wide or full-width) character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int, right: bool = False) -> str:
    """`text` padded with spaces to `width` columns (on the left when `right`): ``:<`` / ``:>`` that count
    a Chinese character as two columns, so tables line up in both languages."""
    space = " " * (width - text_width(text))
    return space + text if right else text + space


def table(rows: Iterable[Sequence[object]], align: str = "", sep: str = "  ", widths: Sequence[int] = (),
          rule: str = "") -> list[str]:
    """The lines of a plain-text table of `rows`: each cell (``str()`` of it) padded to its column's width,
    the widest cell's (at least ``widths[i]``) in terminal columns, a Chinese character taking two (see
    :func:`pad`); on the left where `align` has ``>`` for the column (one character per column, ``<`` or
    none: on the right); the columns joined by `sep`; no line ends in spaces. With `rule` (``"-"``), a
    line of it under the first row, as wide as each column."""
    cells = [[str(c) for c in row] for row in rows]
    n = max(map(len, cells), default=0)
    cols = [max([*(text_width(row[i]) for row in cells if i < len(row)), *widths[i:i + 1]]) for i in range(n)]
    if rule and cells:
        cells.insert(1, [rule * w for w in cols])
    return [sep.join(pad(c, w, right=align[i:i + 1] == ">") for i, (c, w) in enumerate(zip(row, cols, strict=False)))
            .rstrip() for row in cells]


def is_chinese(c: str) -> bool:
    """Whether character `c` is a Chinese (wide, full-width) letter: punctuation and digits are not."""
    return unicodedata.east_asian_width(c) in "WF" and unicodedata.category(c).startswith("L")


def _latin(c: str) -> bool:
    return c.isascii() and c.isprintable() and not c.isspace()


def _latin_side(left: str, right: str) -> str | None:
    """Where characters `left` and `right` are a Chinese letter and a Latin letter, digit or code, which
    of them is the Latin one (``"left"`` or ``"right"``): a space goes between them. Else None."""
    if is_chinese(left) and _latin(right):
        return "right"
    if _latin(left) and is_chinese(right):
        return "left"
    return None


def spaced(*parts: str) -> str:
    """`parts` joined, with a space where a Chinese character meets a Latin letter, a digit or code
    (``x 的梯度是 0.5``, not ``x的梯度是0.5``): for Chinese sentences built around names and values."""
    out = ""
    for part in parts:
        if out and part and _latin_side(out[-1], part[0]):
            out += " "
        out += part
    return out
