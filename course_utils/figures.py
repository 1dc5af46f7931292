"""Figures: how the course shows matplotlib figures, in cells and in widget callbacks, and the font
that draws Chinese text in the Chinese edition."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

from .i18n import language

#: Fonts with the Simplified Chinese glyphs, in order of preference: the one the course installs
#: (Noto Sans CJK SC, SIL Open Font License, shipped by the pinned ``mplfonts`` package), then ones
#: a computer may already have.
CJK_FAMILIES = ("Noto Sans CJK SC", "Source Han Sans SC", "Noto Sans SC", "WenQuanYi Zen Hei",
                "WenQuanYi Micro Hei", "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "SimSun")
_state = {"family": None, "done": False}


def course_font_file() -> Path | None:
    """The Noto Sans CJK SC file of the ``mplfonts`` package, found without importing it."""
    spec = importlib.util.find_spec("mplfonts")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "fonts" / "NotoSansCJKsc-Regular.otf"
        if path.is_file():
            return path
    return None


def cjk_family() -> str | None:
    """The name of a font family that draws Chinese (registering the course's own), or None."""
    from matplotlib import font_manager

    path = course_font_file()
    if path is not None:
        font_manager.fontManager.addfont(str(path))
        return font_manager.FontProperties(fname=str(path)).get_name()
    known = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FAMILIES if name in known), None)


def use_course_font() -> None:
    """In the Chinese edition, let matplotlib draw Chinese: the CJK font becomes the fallback of the
    sans-serif font (Latin letters and digits keep their usual font). Once per process; nothing in the
    English edition."""
    if _state["done"] or language() != "zh-CN":
        return
    _state["done"] = True
    import matplotlib

    family = cjk_family()
    if family is None:
        warnings.warn("No font with Chinese characters was found, so Chinese text in figures shows as "
                      "empty boxes. Install the course's requirements (`make lab` does: the mplfonts "
                      "package ships Noto Sans CJK SC) or a system CJK font (Debian: fonts-noto-cjk).",
                      stacklevel=2)
        return
    _state["family"] = family
    # Each character is drawn by the first family that has it: Latin by the usual font, Chinese by the CJK one.
    matplotlib.rcParams["font.family"] = ["sans-serif", family]


def pyplot():
    """``matplotlib.pyplot``, with the course's font for the chosen language (the helpers draw with it)."""
    import matplotlib.pyplot as plt

    use_course_font()
    return plt


def show_figure(fig) -> None:
    """Display a matplotlib figure now, in the current output (a widget's Output included), and close it.

    Widget callbacks use this instead of ``plt.show()``: the kernel's comm layer runs IPython's
    ``post_execute`` hooks after every widget message (``comm.base_comm.BaseComm.handle_msg``), so the
    inline backend's end-of-cell hook showed the figure left open there, and in JupyterLab that image
    was blank, in place of the real one. A closed figure is not shown again.
    """
    from IPython.display import display

    pyplot().close(fig)
    display(fig)
