"""The chapters as slideshows (tools/slides.py): every notebook's slide types are the rules' (and a run
changes nothing else), every slideshow starts on a slide, and the rules themselves on small notebooks."""

import base64
import json
import struct
import sys

import pytest

from course_utils import ROOT

sys.path.insert(0, str(ROOT))
from tools import slides  # noqa: E402
from tools.notebook import chapters  # noqa: E402

NOTEBOOKS = chapters()
IDS = [p.name for p in NOTEBOOKS]


def md(text: str) -> dict:
    return {"cell_type": "markdown", "id": "m", "metadata": {}, "source": text}


def code(text: str, outputs: list | None = None) -> dict:
    return {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": 1, "outputs": outputs or [],
            "source": text}


def stream(lines: int) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": [f"line {i}\n" for i in range(lines)]}


def png(height: int, width: int = 600) -> dict:
    """A display_data output with a PNG of `height` pixels (its header: what the rules read)."""
    ihdr = struct.pack(">II", width, height) + bytes([8, 6, 0, 0, 0])
    data = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0" * 40
    return {"output_type": "display_data", "metadata": {},
            "data": {"image/png": base64.b64encode(data).decode(), "text/plain": ["<Figure>"]}}


def types(*cells) -> list[str]:
    return slides.slide_types({"cells": list(cells)})


# ------------------------------------------------------------------ the committed notebooks


def test_there_are_notebooks_to_present():
    assert len(NOTEBOOKS) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_slide_types_are_current(path):
    stale = slides.update(path, write=False)
    assert stale == 0, (f"{path.name}: {stale} cell(s) with a slide type that is not the rules': "
                        "run `python -m tools.slides`")


def test_check_passes_on_the_committed_notebooks(capsys):
    assert slides.main(["--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_slideshow_starts_with_a_slide(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    kinds = [c["metadata"].get("slideshow", {}).get("slide_type") for c in cells]
    assert all(k in slides.SLIDE_TYPES for k in kinds), "every cell has a slide type"
    shown = [(c, k) for c, k in zip(cells, kinds, strict=True) if k != "skip"]
    first, kind = shown[0]
    assert kind == "slide" and slides.heading_level(first) == 1, "the first cell shown: the title, on a slide"
    assert cells.index(first) == 0


def test_a_run_changes_slide_types_and_nothing_else(tmp_path):
    """A copy whose slide types are wrong or missing comes back byte for byte as committed."""
    committed = (ROOT / "notebooks" / "01_autograd.ipynb").read_text(encoding="utf-8")
    nb = json.loads(committed)
    for i, cell in enumerate(nb["cells"]):
        if i % 2:
            cell["metadata"].pop("slideshow", None)
        else:
            cell["metadata"]["slideshow"] = {"slide_type": "notes"}
    copy = tmp_path / "01_autograd.ipynb"
    copy.write_text(slides.dumps(nb), encoding="utf-8")
    assert slides.update(copy) == len(nb["cells"])
    assert copy.read_text(encoding="utf-8") == committed
    assert slides.update(copy) == 0  # a second run: nothing to do
    assert copy.read_text(encoding="utf-8") == committed


def test_check_names_a_stale_notebook_and_changes_nothing(tmp_path, capsys):
    nb = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text(encoding="utf-8"))
    nb["cells"][0]["metadata"]["slideshow"] = {"slide_type": "-"}
    stale = tmp_path / "00_start_here.ipynb"
    stale.write_text(slides.dumps(nb), encoding="utf-8")
    before = stale.read_bytes()
    assert slides.main(["--check", str(stale)]) == 1
    assert "00_start_here.ipynb (1 cell)" in capsys.readouterr().err
    assert stale.read_bytes() == before


def test_a_notebook_in_another_json_form_is_left_alone(tmp_path, capsys):
    nb = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text(encoding="utf-8"))
    other = tmp_path / "00_start_here.ipynb"
    other.write_text(json.dumps(nb, indent=2), encoding="utf-8")
    before = other.read_bytes()
    assert slides.main([str(other)]) == 2
    assert "not in the form JupyterLab saves" in capsys.readouterr().err
    assert other.read_bytes() == before


# ------------------------------------------------------------------ the rules


def test_headings_start_slides_and_subslides():
    assert types(md("# 01 · Title\n\nintro"), md("**You will learn**\n\n- a"), md("## 1. A section"),
                 md("text"), md("### A subsection\n\nmore"), md("#### smaller"), md("#no space")) == [
        "slide", "-", "slide", "-", "subslide", "-", "-"]


def test_plumbing_is_skipped():
    setup = code("import torch\nfrom course_utils.device import pick_device\n\ndevice = pick_device()\nprint(device)",
                 [stream(1)])
    later_imports = code("import pickle\nfrom pathlib import Path\n%matplotlib inline")
    cleanup = code("shutil.rmtree(folder)  # done with it\ntmp.cleanup()\nPath(f).unlink()")
    cleanup_that_prints = code("shutil.rmtree(folder)", [stream(1)])
    widget = code("explorer()", [{"output_type": "display_data", "metadata": {}, "data": {
        slides.WIDGET: {"model_id": "0", "version_major": 2, "version_minor": 0}, "text/plain": ["VBox()"]}}])
    static_twin = code("show(defaults)", [png(300)])
    assert types(md("# T"), setup, md("## S"), code("x = 1"), later_imports, cleanup, cleanup_that_prints,
                 widget, static_twin) == ["slide", "skip", "slide", "-", "skip", "skip", "-", "skip", "-"]


def test_only_the_first_code_cell_is_the_setup_cell():
    assert types(md("# T"), code("x = 1"), code("import math\nprint(math.pi)", [stream(1)])) == ["slide", "-", "-"]
    assert types(md("# T"), code("x = (")) == ["slide", "-"]  # not Python: shown


def test_a_cell_taller_than_a_screen_gets_a_screen_of_its_own():
    n = slides.TALL_OUTPUT_LINES
    assert types(md("# T"), md("text"), code("print(s)", [stream(n)])) == ["slide", "-", "-"]
    assert types(md("# T"), md("text"), code("print(s)", [stream(n + 1)])) == ["slide", "-", "subslide"]
    assert types(md("# T"), md("text"), code("x", [png(slides.LINE_PX * n)])) == ["slide", "-", "-"]
    assert types(md("# T"), md("text"), code("x", [png(slides.LINE_PX * (n + 1))])) == ["slide", "-", "subslide"]
    long_code = "\n".join(f"x{i} = {i}" for i in range(slides.TALL_CELL_LINES))
    assert types(md("# T"), md("text"), code(long_code, [stream(1)])) == ["slide", "-", "subslide"]
    # right after a heading alone, it stays on the heading's screen; after a heading with text, it moves
    assert types(md("# T"), md("## Section"), code("print(s)", [stream(n + 1)])) == ["slide", "slide", "-"]
    assert types(md("# T"), md("## Section\n\ntext"), code("print(s)", [stream(n + 1)])) == [
        "slide", "slide", "subslide"]


def test_output_lines_counts_text_tracebacks_and_images():
    error = {"output_type": "error", "ename": "E", "evalue": "", "traceback": ["a\nb", "c"]}
    result = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
              "data": {"text/plain": ["(1,\n", " 2)"]}}
    assert slides.output_lines(code("x", [stream(3), error, result, png(180)])) == 3 + 3 + 2 + 10
    assert slides.png_height(png(437)["data"]["image/png"]) == 437
    assert slides.png_height(base64.b64encode(b"GIF89a" + b"\0" * 40).decode()) == 0


def test_exercises_one_a_screen_and_predictions_answered_on_a_click():
    assert types(md("## Exercises\n\n**Q1.** first"), code("q1.check(...)"),
                 md("Stuck? `q1.hint()`.\n\n**Q2.** second"), code("q2.check(...)")) == [
        "slide", "-", "subslide", "-"]
    assert types(md("# T"), md("Why? **Predict, then run.** Will it fail?"), code("f()"), md("It did."),
                 code("g()")) == ["slide", "-", "fragment", "-", "-"]


def test_every_rule_gives_a_known_slide_type():
    nb = json.loads((ROOT / "notebooks" / "01_autograd.ipynb").read_text(encoding="utf-8"))
    found = set(slides.slide_types(nb))
    assert found <= set(slides.SLIDE_TYPES)
    assert {"slide", "subslide", "fragment", "skip", "-"} <= found  # chapter 01 uses every rule


def deep(cell: dict) -> dict:
    cell["metadata"]["tags"] = ["deep-dive"]
    return cell


def test_deep_dives_are_skipped_and_the_core_path_goes_on_around_them():
    cells = [md("# T"), md("## 1. Core"), code("x = 1"), deep(md("## Deep dive: more\n\ntext")),
             deep(code("print(s)", [stream(40)])), deep(md("### A part of it")),
             md("## 2. Core again\n\n**Predict, then run.** What?"), code("f()")]
    assert types(*cells) == ["slide", "slide", "-", "skip", "skip", "skip", "slide", "fragment"]


def test_a_prediction_in_a_deep_dive_does_not_make_the_next_core_cell_a_fragment():
    assert types(md("# T"), deep(md("## Deep dive: x\n\n**Predict, then run.** ?")), md("## 2. Next"),
                 code("g()")) == ["slide", "skip", "slide", "-"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_cell_of_a_deep_dive_is_skipped_in_the_committed_slides(path):
    from tools import corepath

    nb = json.loads(path.read_text(encoding="utf-8"))
    inside = corepath.deep_dive_cells(nb)
    kinds = [c["metadata"].get("slideshow", {}).get("slide_type") for c in nb["cells"]]
    assert all(kinds[i] == "skip" for i in inside)
    assert not corepath.problems(nb, path.name)
