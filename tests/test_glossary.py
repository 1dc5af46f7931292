"""One vocabulary in the Chinese edition: the glossary (i18n/zh-CN/glossary.md) gives each term one
translation and, in its last column, the other translations not to use; none of them appears in the
Chinese text a reader sees (the notebooks' words, code comments and outputs, the exercises, the errata,
the README's section, the helpers' Chinese messages). Every chapter's opening links the glossary."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from course_utils import ROOT, inventory
from tests.test_chinese_text import chinese_texts

GLOSSARY = ROOT / "i18n" / "zh-CN" / "glossary.md"
CHINESE = re.compile(r"[\u4e00-\u9fff]")


def forbidden(glossary: str) -> dict[str, list[str]]:
    """The glossary's term (its Chinese column) -> the variants its last column forbids (in code font)."""
    found = {}
    for line in glossary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (variants := re.findall(r"`([^`]+)`", cells[3])):
            found[cells[1]] = variants
    return found


def texts() -> list[tuple[str, str]]:
    """(where, text) of every Chinese text a reader sees, but the glossary itself."""
    found = [(where, text) for where, text in chinese_texts() if not where.endswith("glossary.md")]
    for path in inventory.notebooks("zh-CN"):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            parts = ["".join(cell["source"])]
            for out in cell.get("outputs", []):
                parts += ["".join(out.get("text", "")), "".join(out.get("data", {}).get("text/plain", ""))]
            found.append((f"notebooks-zh/{path.name} cell {cell['id']}", "\n".join(parts)))
    for path in sorted((ROOT / "i18n" / "zh-CN").glob("*.toml")):
        for key, entry in tomllib.loads(path.read_text(encoding="utf-8")).items():
            if "code" in entry:
                found.append((f"{path.relative_to(ROOT)} [{key}] (code)", entry["code"]))
    for path in sorted((ROOT / "course_utils").rglob("*.py")):
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if CHINESE.search(line)]
        found.append((str(path.relative_to(ROOT)), "\n".join(lines)))
    return found


def variants_used(pairs: list[tuple[str, str]], banned: dict[str, list[str]]) -> list[str]:
    return [f"{where}: {variant!r} where the glossary says {term!r}"
            for where, text in pairs for term, variants in banned.items() for variant in variants
            if variant in text]


def test_the_glossary_is_in_chinese_and_forbids_variants_of_the_terms_that_drifted():
    text = GLOSSARY.read_text(encoding="utf-8")
    banned = forbidden(text)
    for term in ("作业", "会合（rendezvous）", "键值存储（store）", "梯度桶；桶", "守卫（guard）", "图中断", "锁页内存",
                 "滑动统计量；滑动均值、滑动方差", "token", "logits", "不平衡（的数据集）"):
        assert term in banned, f"the glossary has no row for {term!r} with variants not to use"
    assert "海森矩阵" in text and "黑塞矩阵" in text
    prose = re.sub(r"`[^`]*`|\([^)]*\)|\|[^|\n]*\|", "", text.split("| --- |")[0])  # the introduction
    assert len(CHINESE.findall(prose)) > 3 * len(re.findall(r"[A-Za-z]+", prose)), "explain the glossary in Chinese"


def test_the_chinese_text_uses_the_glossarys_terms():
    found = variants_used(texts(), forbidden(GLOSSARY.read_text(encoding="utf-8")))
    assert not found, (f"{len(found)} use(s) of a translation the glossary rules out "
                       "(i18n/zh-CN/glossary.md, last column):\n" + "\n".join(found))


def test_the_check_sees_a_forbidden_variant():
    banned = forbidden("| job | 作业 | 说明 | `训练任务`、`DDP 任务` |\n| tensor | 张量 | | |\n")
    assert banned == {"作业": ["训练任务", "DDP 任务"]}
    assert variants_used([("x", "一个 DDP 任务的每个 rank")], banned) == [
        "x: 'DDP 任务' where the glossary says '作业'"]
    assert variants_used([("x", "一个 DDP 作业的每个 rank")], banned) == []


@pytest.mark.parametrize("nb", [p.name for p in inventory.notebooks("zh-CN")])
def test_every_chapter_opening_links_the_glossary(nb):
    cells = json.loads((ROOT / "notebooks-zh" / nb).read_text(encoding="utf-8"))["cells"]
    opening = "".join(cells[0]["source"])
    assert "](../i18n/zh-CN/glossary.md)" in opening, f"notebooks-zh/{nb}: link the glossary from the first cell"
    assert Path(ROOT / "i18n" / "zh-CN" / "glossary.md").exists()


def test_an_imbalanced_dataset_is_banned_as_uneven_but_uneven_inputs_are_not():
    banned = forbidden(GLOSSARY.read_text(encoding="utf-8"))
    assert variants_used([("x", "不均衡数据集：796 张图像")], banned) == [
        "x: '不均衡数据集' where the glossary says '不平衡（的数据集）'"]
    assert variants_used([("x", "*训练*时的输入不均衡：`Join` 让批次较少的 rank 参与")], banned) == []
