"""course_utils.figures: the colour-blind-safe style, and alternative text from where a figure is made
to the metadata of the notebook output that shows it."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from course_utils import figures  # noqa: E402
from course_utils.figures import alt_text, carry_alt_text, describe_figure, pyplot  # noqa: E402


def test_pyplot_cycles_through_the_okabe_ito_palette():
    from matplotlib.colors import to_hex

    with matplotlib.rc_context():
        plt = pyplot()
        colours = [to_hex(c).upper() for c in matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]]
        assert colours == list(figures.OKABE_ITO[:7])
        fig, ax = plt.subplots()
        (line,) = ax.plot([0, 1])
        assert to_hex(line.get_color()).upper() == figures.OKABE_ITO[0]
        plt.close(fig)
    with matplotlib.rc_context({"axes.prop_cycle": matplotlib.cycler(color=["#123456", "#654321"])}):
        pyplot()  # a cycle of the reader's own stays
        assert matplotlib.rcParams["axes.prop_cycle"].by_key()["color"] == ["#123456", "#654321"]
    pyplot()  # and after matplotlib's defaults came back, the course's palette again
    assert to_hex(matplotlib.rcParams["axes.prop_cycle"].by_key()["color"][0]).upper() == figures.OKABE_ITO[0]


def test_describe_in_each_language(monkeypatch):
    plt = pyplot()
    fig = plt.figure()
    monkeypatch.setenv("COURSE_LANG", "en")
    assert describe_figure(fig, "A  line\n chart.", "一幅折线图。") is fig
    assert alt_text(fig) == "A line chart."  # one line, single spaces
    monkeypatch.setenv("COURSE_LANG", "zh")
    describe_figure(fig, "A line chart.", "一幅折线图。")
    assert alt_text(fig) == "一幅折线图。"
    assert alt_text(plt.figure()) is None
    plt.close("all")


def test_describe_fills_templates_with_fields_and_keeps_finished_texts(monkeypatch):
    fig = pyplot().figure()
    args = ("{n} bars, the last {v:.2f}", "{n} 个条，最后一个是 {v:.2f}")
    monkeypatch.setenv("COURSE_LANG", "en")
    assert alt_text(describe_figure(fig, *args, n=3, v=0.125)) == "3 bars, the last 0.12"
    assert alt_text(describe_figure(fig, "A dict {'a': 1}.", "一个 dict {'a': 1}。")) == "A dict {'a': 1}."
    monkeypatch.setenv("COURSE_LANG", "zh")
    assert alt_text(describe_figure(fig, *args, n=3, v=0.125)) == "3 个条，最后一个是 0.12"
    with pytest.raises(KeyError):  # a template whose field is not given
        describe_figure(fig, "{n} bars", "{n} 个条", count=3)
    pyplot().close("all")


def test_describe_refuses_empty_text_and_what_is_not_a_figure(monkeypatch):
    monkeypatch.setenv("COURSE_LANG", "en")
    with pytest.raises(ValueError, match="alternative text"):
        describe_figure(pyplot().figure(), "  ", "一幅图")
    with pytest.raises(TypeError, match="matplotlib figure, not list"):
        describe_figure([1, 2], "A chart.", "一幅图。")
    pyplot().close("all")


class _Shell:
    """What carry_alt_text uses of an IPython shell: its display formatter."""

    def __init__(self):
        from IPython.core.formatters import DisplayFormatter

        self.display_formatter = DisplayFormatter()


def _inline_backend(shell, retina=False):
    """The PNG formatter of figures that matplotlib-inline registers (IPython's select_figure_formats)."""
    from functools import partial

    from IPython.core.pylabtools import print_figure, retina_figure
    from matplotlib.figure import Figure

    png = partial(retina_figure, base64=True) if retina else partial(print_figure, fmt="png", base64=True)
    shell.display_formatter.formatters["image/png"].for_type(Figure, png)


@pytest.mark.parametrize("retina", [False, True])
def test_the_alt_text_reaches_the_outputs_metadata(monkeypatch, retina):
    monkeypatch.setenv("COURSE_LANG", "en")
    shell = _Shell()
    _inline_backend(shell, retina)
    plt = pyplot()
    described, plain = plt.subplots()[0], plt.subplots()[0]  # IPython shows no figure without axes
    describe_figure(described, "A described figure.", "一幅有说明的图。")
    assert carry_alt_text(shell) is True
    data, metadata = shell.display_formatter.format(described)
    assert data["image/png"] and metadata["image/png"]["alt"] == "A described figure."
    if retina:  # the formatter's own metadata (the image's size) is kept beside the alt text
        assert {"width", "height"} <= set(metadata["image/png"])
    data, metadata = shell.display_formatter.format(plain)
    assert data["image/png"] and "alt" not in metadata.get("image/png", {})
    plt.close("all")


def test_the_formatter_is_wrapped_once_and_again_after_the_backend_replaced_it(monkeypatch):
    from matplotlib.figure import Figure

    monkeypatch.setenv("COURSE_LANG", "en")
    shell = _Shell()
    _inline_backend(shell)
    png = shell.display_formatter.formatters["image/png"]
    carry_alt_text(shell)
    wrapped = png.lookup_by_type(Figure)
    carry_alt_text(shell)
    assert png.lookup_by_type(Figure) is wrapped  # not a wrapper of a wrapper
    _inline_backend(shell)  # e.g. %config InlineBackend.figure_formats: the backend registers anew
    fig = describe_figure(pyplot().subplots()[0], "Again.", "再次。")
    carry_alt_text(shell)
    assert shell.display_formatter.format(fig)[1]["image/png"]["alt"] == "Again."
    pyplot().close("all")


def test_nothing_happens_outside_ipython():
    assert carry_alt_text() is False  # pytest is no IPython shell


@pytest.mark.slow
def test_a_kernel_stores_the_alt_text_of_every_way_a_figure_is_shown(tmp_path):
    """In a real kernel, as ``make execute`` runs a notebook: ``plt.show()``, a figure left open at the
    end of a cell, ``show_figure`` and a figure never described (no alt text)."""
    import nbformat
    from nbclient import NotebookClient

    from tools.notebook import _kernel_manager

    cells = [
        "from course_utils.figures import describe_figure, pyplot, show_figure\nplt = pyplot()",
        "fig, ax = plt.subplots()\nax.plot([1, 2])\n"
        "describe_figure(fig, 'Shown by plt.show.', '由 plt.show 显示。')\nplt.show()",
        "fig, ax = plt.subplots()\ndescribe_figure(fig, 'Left open.', '留着没关。');",
        "fig, ax = plt.subplots()\nshow_figure(describe_figure(fig, 'By show_figure.', '由 show_figure 显示。'))",
        "fig, ax = plt.subplots()\nplt.show()",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    folder = tmp_path / "k"
    folder.mkdir()
    client = NotebookClient(nb, km=_kernel_manager(str(folder)), timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.owns_km = True
    client.execute()
    alts = []
    for cell in nb.cells[1:]:
        (out,) = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        alts.append(out.get("metadata", {}).get("image/png", {}).get("alt"))
    assert alts == ["Shown by plt.show.", "Left open.", "By show_figure.", None]


def _half_built_figure_redrawn_by_the_hook(callback_wrapper) -> tuple[int, bool]:
    """A widget callback that builds a figure while pyplot's post_execute hook (what the comm layer runs
    after a widget message that arrived meanwhile) fires halfway; how often the hook drew the figure,
    and whether interactive mode was on inside the callback."""
    from matplotlib import pyplot as plt

    draws, seen = [], {}

    def redraw(x: float) -> None:
        seen["interactive"] = matplotlib.is_interactive()
        fig, ax = plt.subplots()
        fig.canvas.mpl_connect("draw_event", lambda _event: draws.append(x))
        plt._draw_all_if_interactive()  # the hook: `ip.events.register("post_execute", ...)` in pyplot
        ax.plot([0, x])
        plt.close(fig)

    with plt.ion():
        callback_wrapper(redraw)(1.0)
    return len(draws), seen["interactive"]


def test_a_widget_callback_draws_its_figure_with_no_hook_in_between():
    assert _half_built_figure_redrawn_by_the_hook(lambda f: f) == (1, True)  # the hazard, unwrapped
    assert _half_built_figure_redrawn_by_the_hook(figures.widget_callback) == (0, False)
    assert not matplotlib.is_interactive()  # the mode is given back


def test_the_wrapped_callback_keeps_its_signature_for_ipywidgets():
    import inspect

    def redraw(stages: int, microbatches: int = 4) -> str:
        return f"{stages}x{microbatches}"

    wrapped = figures.widget_callback(redraw)
    assert list(inspect.signature(wrapped).parameters) == ["stages", "microbatches"]  # interactive() reads them
    assert wrapped(2, microbatches=8) == "2x8" and wrapped.__name__ == "redraw"


WIDGET_CALLS = ("observe", "interactive", "interactive_output")


def test_every_widget_callback_of_the_course_is_wrapped():
    """A function or lambda that a widget calls back (``x.observe(f)``, ``interactive(f, ...)``,
    ``interactive_output(f, ...)``) is ``widget_callback``'s: else a figure it builds can be redrawn
    half-built by a hook (the test above)."""
    import ast
    from pathlib import Path

    root = Path(figures.__file__).parent
    unwrapped = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        wrapped = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                   and any(getattr(d, "id", None) == "widget_callback" for d in f.decorator_list)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and call.args):
                continue
            name = getattr(call.func, "attr", None) or getattr(call.func, "id", None)
            if name not in WIDGET_CALLS or (name == "observe" and not isinstance(call.func, ast.Attribute)):
                continue  # (a plain `observe(...)` is the exercises' observer, not a widget's method)
            target = call.args[0]
            if isinstance(target, ast.Lambda) and "show_figure" not in ast.dump(target):
                continue  # a lambda that only passes the change on, to a wrapped function
            if isinstance(target, ast.Name) and target.id in wrapped:
                continue
            if isinstance(target, ast.Call) and getattr(target.func, "id", None) == "widget_callback":
                continue
            unwrapped.append(f"{path.relative_to(root)}:{call.lineno}")
    assert not unwrapped, f"widget callbacks without @widget_callback: {unwrapped}"
