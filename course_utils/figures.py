"""Figures: how the course shows matplotlib figures, in cells and in widget callbacks; the font that
draws Chinese text in the Chinese edition; the colour-blind-safe palette; and each figure's
alternative text.

Alternative text is written where a figure is made, in both languages: ``describe_figure(fig, english,
chinese, **fields)``, two templates filled as :func:`~course_utils.i18n.tr` fills them. When Jupyter
shows the figure (``plt.show()``, the end of a cell, :func:`show_figure`), the text goes into the
output's metadata, ``{"image/png": {"alt": ...}}``, where the course's book
(``make book``) reads it into ``<img alt>``; a test fails on a stored image without it.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from pathlib import Path

from .i18n import language, tr

#: Fonts with the Simplified Chinese glyphs, in order of preference: the one the course installs
#: (Noto Sans CJK SC, SIL Open Font License, shipped by the pinned ``mplfonts`` package), then ones
#: a computer may already have.
CJK_FAMILIES = ("Noto Sans CJK SC", "Source Han Sans SC", "Noto Sans SC", "WenQuanYi Zen Hei",
                "WenQuanYi Micro Hei", "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "SimSun")
_state = {"family": None, "done": False}

#: Okabe and Ito's palette ("Color Universal Design", 2002): eight colours told apart with every common
#: kind of colour blindness, in the order the course's figures take them (black last: it is for text).
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
#: Named roles, so that a figure says what a colour means rather than which colour it is.
COLORS = {"blue": OKABE_ITO[0], "orange": OKABE_ITO[1], "green": OKABE_ITO[2], "vermilion": OKABE_ITO[3],
          "sky": OKABE_ITO[4], "purple": OKABE_ITO[5], "yellow": OKABE_ITO[6], "grey": "#7F7F7F"}
ALT_ATTRIBUTE = "_course_alt_text"


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


def use_course_style() -> None:
    """The course's plotting style: colours cycle through the Okabe-Ito palette (colour-blind safe)
    instead of matplotlib's default ``tab10``, whose red and green look alike to one reader in twelve.
    Only over matplotlib's default cycle: a cycle of the reader's own is left alone."""
    import matplotlib
    from cycler import cycler

    if matplotlib.rcParams["axes.prop_cycle"] == matplotlib.rcParamsDefault["axes.prop_cycle"]:
        matplotlib.rcParams["axes.prop_cycle"] = cycler(color=list(OKABE_ITO[:7]))


def pyplot():
    """``matplotlib.pyplot``, with the course's font for the chosen language and its colour-blind-safe
    style (the helpers draw with it; a notebook's own figures too, when it imports ``plt`` from here)."""
    import matplotlib.pyplot as plt

    use_course_font()
    use_course_style()
    return plt


def describe_figure(fig, en: str, zh: str, /, **fields: object):
    """Give the figure `fig` its alternative text, in the course's language: one or two sentences saying
    what the figure shows, for a reader who cannot see it. Returns `fig`.

    With `fields`, `en` and `zh` are templates filled as ``tr(en, zh, **fields)`` fills them, each value
    computed once (the course's helpers write them so; :func:`~course_utils.i18n.tr`). Without, they are
    the finished texts (a notebook's two f-strings), and a brace in them is kept as it is. Jupyter then
    stores the text in the metadata of the figure's output, wherever it is shown."""
    text = " ".join((tr(en, zh, **fields) if fields else zh if language() == "zh-CN" else en).split())
    if not text:
        raise ValueError("describe_figure() needs the figure's alternative text in both languages, not empty text.")
    if not hasattr(fig, "savefig"):
        raise TypeError(f"describe_figure() takes a matplotlib figure, not {type(fig).__name__}.")
    setattr(fig, ALT_ATTRIBUTE, text)
    carry_alt_text()
    return fig


def alt_text(fig) -> str | None:
    """The alternative text :func:`describe_figure` gave `fig`, or None."""
    return getattr(fig, ALT_ATTRIBUTE, None)


def with_alt_text(metadata: dict | None, alt: str | None) -> dict | None:
    """An output's metadata for one image, with `alt` added (unchanged where `alt` is None)."""
    if not alt:
        return metadata
    return {**(metadata or {}), "alt": alt}


def _alt_formatter(format_figure):
    """IPython's formatter of a figure (PNG, JPEG...), returning the figure's alternative text with the
    image: a formatter may return ``(data, metadata)``, and IPython stores that metadata under the
    image's type in the output."""
    def formatter(fig):
        out = format_figure(fig)
        alt = alt_text(fig)
        if out is None or not alt:
            return out
        data, metadata = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        return data, with_alt_text(metadata, alt)

    formatter.course_alt_text = True
    return formatter


def carry_alt_text(shell=None) -> bool:
    """Wrap the running IPython's image formatters of matplotlib figures (which the inline backend
    registers) so that they carry each figure's alternative text; again after the backend replaced
    them. Returns whether a formatter carries it now; nothing happens outside IPython."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    from matplotlib.figure import Figure

    carried = False
    for mime in ("image/png", "image/jpeg", "image/svg+xml"):
        formatter = shell.display_formatter.formatters.get(mime)
        try:
            current = formatter.lookup_by_type(Figure)
        except (AttributeError, KeyError):
            continue
        if not getattr(current, "course_alt_text", False):
            formatter.for_type(Figure, _alt_formatter(current))
        carried = True
    return carried


def show_figure(fig) -> None:
    """Display a matplotlib figure now, in the current output (a widget's Output included), and close it.

    Widget callbacks use this instead of ``plt.show()``: the kernel's comm layer runs IPython's
    ``post_execute`` hooks after every widget message (``comm.base_comm.BaseComm.handle_msg``), so the
    inline backend's end-of-cell hook showed the figure left open there, and in JupyterLab that image
    was blank, in place of the real one. A closed figure is not shown again.
    """
    from IPython.display import display

    pyplot().close(fig)
    carry_alt_text()
    display(fig)


def widget_callback(redraw):
    """`redraw`, a widget's callback that draws with matplotlib, run with pyplot's interactive mode off.

    The kernel dispatches a widget message that arrives while another is being handled without waiting
    for it, and after each one the comm layer runs IPython's ``post_execute`` hooks; pyplot's hook redraws
    every open figure when interactive mode is on. One such redraw could fall between a callback's
    ``plt.subplots`` and its ``show_figure``: the half-built figure lost its ``tight_layout`` and the
    widget showed it narrower, its labels over the next panel. With interactive mode off while the
    callback runs, no hook draws or shows its figure before ``show_figure`` does."""

    @functools.wraps(redraw)
    def run(*args, **kwargs):
        with pyplot().ioff():
            return redraw(*args, **kwargs)

    return run
