"""Every figure stored in the notebooks of both editions carries alternative text, in its edition's
language, in the output's metadata (``{"image/png": {"alt": ...}}``): the book shows it as the
image's ``alt`` for readers who cannot see the picture.

This reads the stored notebooks: a figure gets its text where it is made (a helper's
``course_utils.figures.describe_figure(fig, english, chinese)``, or the same call in the cell that draws it),
and the stored output gets it when the notebook is executed again (``python tasks.py execute``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_utils import ROOT, inventory
from course_utils.i18n import is_chinese

NOTEBOOKS = inventory.notebooks("en") + inventory.notebooks("zh-CN")
IMAGES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")


def images_without_alt_text(nb: dict) -> list[str]:
    """``"cell <id>, output <k> (<type>)"`` for each stored image that has no alternative text."""
    missing = []
    for cell in nb["cells"]:
        for k, out in enumerate(cell.get("outputs", [])):
            for mime in IMAGES:
                if mime not in out.get("data", {}):
                    continue
                alt = (out.get("metadata", {}).get(mime) or {}).get("alt")
                if not isinstance(alt, str) or not alt.strip():
                    missing.append(f"cell {cell.get('id')}, output {k} ({mime})")
    return missing


def alt_texts(nb: dict) -> list[str]:
    return [(out.get("metadata", {}).get(mime) or {}).get("alt") or ""
            for cell in nb["cells"] for out in cell.get("outputs", [])
            for mime in IMAGES if mime in out.get("data", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_stored_image_has_alt_text(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    missing = images_without_alt_text(nb)
    assert not missing, (
        f"{path.relative_to(ROOT)}: {len(missing)} stored image(s) without alternative text: "
        + "; ".join(missing)
        + ". Give each figure its text where it is made (course_utils.figures.describe_figure(fig, english, "
        f"chinese)), then re-execute it: python tasks.py execute {path.relative_to(ROOT)}")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.parent.name == "notebooks-zh"], ids=lambda p: p.name)
def test_the_chinese_editions_alt_text_is_chinese(path: Path):
    english = [t for t in alt_texts(json.loads(path.read_text(encoding="utf-8")))
               if t and not any(is_chinese(c) for c in t)]
    assert not english, f"{path.relative_to(ROOT)}: alternative text in English only: {english[:3]}"


def test_the_check_finds_an_image_without_alt_text():
    png = {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}
    nb = {"cells": [{"id": "a", "cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": png, "metadata": {"image/png": {"alt": "A chart."}}},
        {"output_type": "display_data", "data": png, "metadata": {}},
        {"output_type": "display_data", "data": png, "metadata": {"image/png": {"alt": "  "}}},
    ]}]}
    assert images_without_alt_text(nb) == ["cell a, output 1 (image/png)", "cell a, output 2 (image/png)"]
