"""The Chinese text of the course, read as a Chinese editor would: typography (spacing between Chinese
and Latin letters or digits, full-width punctuation), checked with autocorrect and the project's
``.autocorrectrc``."""

from __future__ import annotations

import re
import tomllib

import autocorrect_py as autocorrect  # pinned in requirements.txt

from course_utils import ROOT


def chinese_texts() -> list[tuple[str, str]]:
    """(where, Markdown text) of every Chinese text a reader sees outside the helpers' code: the
    notebooks' translations, the exercises' words, the errata, the glossary, the README's section."""
    found = []
    for path in sorted((ROOT / "i18n" / "zh-CN").glob("*.toml")):
        for key, entry in tomllib.loads(path.read_text(encoding="utf-8")).items():
            if "zh" in entry:
                found.append((f"{path.relative_to(ROOT)} [{key}]", entry["zh"]))
    for path in sorted((ROOT / "course_utils" / "exercises").glob("*.zh-CN.toml")):
        for key, words in tomllib.loads(path.read_text(encoding="utf-8")).items():
            for field, text in _strings(words):
                found.append((f"{path.relative_to(ROOT)} [{key}.{field}]", text))
    for path in (ROOT / "docs" / "errata.zh-CN.md", ROOT / "i18n" / "zh-CN" / "glossary.md"):
        found.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## 中文.*?(?=^## |\Z)", readme, re.S | re.M)
    if section:
        found.append(("README.md (中文)", section.group(0)))
    return found


def _strings(value, prefix=""):
    if isinstance(value, str):
        yield prefix or "text", value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{prefix}[{i}]")


def test_chinese_typography():
    autocorrect.load_config((ROOT / ".autocorrectrc").read_text(encoding="utf-8"))
    found = []
    for where, text in chinese_texts():
        for line in autocorrect.lint_for(text, "text.md").lines:
            found.append(f"{where}, line {line.line}:\n    {line.old.strip()[:160]}\n -> {line.new.strip()[:160]}")
    assert not found, (f"{len(found)} line(s) of Chinese text break the typography rules (.autocorrectrc):\n"
                       + "\n".join(found))


def test_the_typography_check_sees_a_missing_space():
    autocorrect.load_config((ROOT / ".autocorrectrc").read_text(encoding="utf-8"))
    assert autocorrect.lint_for("用PyTorch训练模型,很快。", "text.md").lines
    assert not autocorrect.lint_for("用 PyTorch 训练模型，很快。", "text.md").lines
