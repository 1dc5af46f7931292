"""Tests for course_utils.ch01_autograd: the graph as data, text, DOT source, pictures and steps."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import warnings
from pathlib import Path

import pytest
import torch

from course_utils import ch01_autograd as G
from course_utils.exercises import ch01
from course_utils.i18n import speaking, text_width

PNG = b"\x89PNG\r\n\x1a\n"


def sigmoid_example():
    x = torch.tensor([2.0], requires_grad=True)
    w = torch.tensor([3.0], requires_grad=True)
    b = torch.tensor([1.0], requires_grad=True)
    y = w * x + b
    z = torch.sigmoid(y)
    return x, w, b, y, z, {"x": x, "w": w, "b": b, "y": y, "z": z}


@pytest.fixture
def no_dot(monkeypatch, tmp_path):
    """Hide any Graphviz `dot` program: PATH holds only an empty folder."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert shutil.which("dot") is None


@pytest.fixture
def fake_dot(monkeypatch, tmp_path):
    """A stand-in `dot` that records the DOT source it is given and answers with a real PNG."""
    png = tmp_path / "reply.png"
    from matplotlib.figure import Figure

    Figure(figsize=(1, 1)).savefig(png, format="png")
    received = tmp_path / "received.dot"
    script = tmp_path / "bin" / "dot"
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(received)!r}, 'wb').write(sys.stdin.buffer.read())\n"
        f"sys.stdout.buffer.write(open({str(png)!r}, 'rb').read())\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(script.parent) + os.pathsep + os.environ.get("PATH", ""))
    return received


# ------------------------------------------------------------------ the graph as data and text


def test_as_text_of_the_source_example():
    _, _, _, _, z, params = sigmoid_example()
    assert G.as_text(z, params) == (
        "autograd graph of z: 6 nodes (backward starts at #0; '<-' lists a node's inputs)\n"
        "#0 SigmoidBackward0 -> z (1,)  <- #1\n"
        "#1 AddBackward0 -> y (1,)  <- #2, #3\n"
        "#2 MulBackward0  <- #4, #5\n"
        "#3 leaf b (1,)\n"
        "#4 leaf w (1,)\n"
        "#5 leaf x (1,)"
    )


def test_values_grads_and_saved_tensors():
    x, w, b, y, z, params = sigmoid_example()
    z.backward(retain_graph=True)
    text = G.as_text(z, params, show_values=True, show_saved=True)
    assert "#4 leaf w (1,) data=3 grad=0.00182" in text
    assert "#3 leaf b (1,) data=1 grad=0.0009102" in text
    assert "#1 AddBackward0 -> y (1,) data=7" in text
    assert "saved by #0: result = z (1,) data=0.9991" in text
    assert "saved by #2: other = x (1,)" in text and "saved by #2: self = w (1,)" in text
    g = G.build_graph(z, params, show_saved=True)
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("leaf") == 3 and kinds.count("saved") == 3
    assert ("saved") in {k for *_, k in g.edges}


def test_unnamed_tensors_and_the_default_root_name():
    a = torch.ones(2, 3, requires_grad=True)
    out = (a * 2).sum()
    text = G.as_text(out)
    assert text.splitlines()[0].startswith("autograd graph of output: 3 nodes")
    assert "#0 SumBackward0 -> output (scalar)" in text
    assert "#2 leaf (unnamed) (2, 3)" in text


def test_shared_inputs_are_one_node():
    x = torch.tensor([2.0], requires_grad=True)
    g = G.build_graph(x * x)
    assert len(g.nodes) == 2 and g.nodes[0].inputs == [1, 1]


def test_no_graph_and_leaf():
    t = torch.ones(3)
    assert "no grad_fn, autograd recorded nothing" in G.as_text(t, {"t": t})
    leaf = torch.ones(2, requires_grad=True)
    assert G.as_text(leaf, {"w": leaf}) == "autograd graph of w: 1 node\n#0 leaf w (2,)"


def test_freed_saved_tensors_are_reported_not_raised():
    _, _, _, _, z, params = sigmoid_example()
    z.backward()  # frees the saved tensors
    assert "(freed)" in G.as_text(z, params, show_saved=True)
    d = G.draw(z, params, show_saved=True)  # torchviz cannot read them: drawn by matplotlib
    assert d.engine == "matplotlib" and d.dot_source is None and "(freed)" in repr(d)


def test_learner_errors_are_explained():
    with pytest.raises(TypeError, match="tensor should be a torch.Tensor, but it is a list"):
        G.build_graph([1.0])
    with pytest.raises(TypeError, match=r"params\['w'\] should be a torch.Tensor"):
        G.build_graph(torch.ones(1, requires_grad=True) * 2, {"w": 3.0})


# ------------------------------------------------------------------ truncation of big graphs


def chain(n: int) -> torch.Tensor:
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.0001
    return y


def test_large_graph_is_truncated_with_a_note():
    y = chain(10_000)
    g = G.build_graph(y, max_nodes=40)
    assert g.truncated and g.total == 10_001
    assert g.nodes[-1].kind == "more" and g.nodes[-1].hidden == 10_001 - 40
    text = G.as_text(y, max_nodes=40)
    assert "10,001 nodes; showing the 40 nearest the output" in text
    assert text.endswith("#40 ... 9,961 more nodes not shown")


def test_graph_alt_text_names_the_leaves_or_says_none_is_shown():
    y = chain(10_000)
    hidden = G.build_graph(y, max_nodes=8)
    with speaking("en"):
        assert "lead from the leaf tensor(s) (none shown) to " in G.graph_alt_text(hidden, "t")
    with speaking("zh"):
        assert "从未显示的叶子张量通向 " in G.graph_alt_text(hidden, "t")
        x = torch.ones(1, requires_grad=True)
        shown = G.build_graph(x * 2, {"x": x})
        assert "从叶子张量 x 通向 " in G.graph_alt_text(shown, "t")


def test_drawing_10000_nodes_draws_a_bounded_picture(no_dot):
    """A huge graph is drawn as its DEFAULT_MAX_NODES nearest nodes and a note (the picture's size,
    and so the time to lay it out, does not grow with the graph)."""
    for big in (chain(10_000), sum(torch.full((1,), float(i), requires_grad=True) for i in range(10_000))):
        d = G.draw(big)
        assert d.graph.truncated and d.png.startswith(PNG)
        assert len(d.graph.nodes) == G.DEFAULT_MAX_NODES + 1 and d.graph.nodes[-1].kind == "more"
        assert d.graph.total > 10_000


# ------------------------------------------------------------------ DOT source and both renderers


def test_the_dot_source_is_torchvizs_and_drawing_is_quiet(fake_dot):
    import torchviz

    _, _, _, _, z, params = sigmoid_example()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchviz's own deprecation warning must not reach a notebook
        src = G.draw(z, params).dot_source
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = G.stable_dot(torchviz.make_dot(z, params=params).source)
    # every line of torchviz's is kept, but its graph attributes, to which the course adds a title
    assert set(plain.splitlines()) - set(src.splitlines()) == {'\tgraph [size="12,12"]'}


def test_stable_dot_renames_the_ids_that_change_every_run():
    import torchviz

    sources = []
    for _ in range(2):
        _, _, _, _, z, params = sigmoid_example()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sources.append(torchviz.make_dot(z, {"x": params["x"]}).source)
    assert sources[0] != sources[1]  # torchviz names nodes by id()
    stable = [G.stable_dot(s) for s in sources]
    assert stable[0] == stable[1]
    declared = set(re.findall(r"(?m)^\t(n\d+) \[", stable[0]))
    used = {n for pair in re.findall(r"(n\d+) -> (n\d+)", stable[0]) for n in pair}
    assert declared == used == {f"n{i}" for i in range(len(declared))}  # 6 nodes, 3 leaf tensors, z
    assert len(declared) == 10
    assert not re.search(r"\d{5,}", stable[0])


def test_dot_source_has_the_course_labels_highlight_and_gradients(no_dot):
    _, _, _, _, z, params = sigmoid_example()
    src = G.draw(z, params, show_saved=True).dot_source
    assert src == G.draw(z, params, show_saved=True).dot_source  # deterministic
    assert src.startswith("digraph {") and src.rstrip().endswith("}")
    assert "rankdir=LR" in src and 'label="autograd graph of z\n(6 nodes)"' in src
    assert "fillcolor=lightblue" in src and "fillcolor=darkolivegreen1" in src  # torchviz's colours
    assert src.count("AccumulateGrad") == 3 and "fillcolor=orange" in src  # saved tensors
    assert 'label="#0 SigmoidBackward0\n-> z (1,)"' in src and 'label="#4 leaf w (1,)"' in src
    step = G.step_view(z, params, step=3).dot_source  # MulBackward0 sends to w (#4) and x (#5)
    mul = re.search(r'(?m)^\t(n\d+) \[label="#2 MulBackward0', step).group(1)
    assert re.search(rf'(?m)^\t{mul} \[color="#D55E00" fillcolor="#fff3a3" penwidth=3\]$', step)
    assert re.search(rf'-> {mul} \[label=" 0.00182 " .*dir=back\]', step)
    assert "Highlighted: #2 MulBackward0, the node this step runs" in G.step_view(z, params, step=3).alt
    assert re.search(rf'-> {mul} \[label=" 0.002731 " .*dir=back\]', step)


def test_dot_labels_are_escaped(no_dot):
    leaf = torch.ones(1, requires_grad=True)
    assert 'label="#1 leaf a\\"b (1,)"' in G.draw(leaf * 2, {'a"b': leaf}).dot_source


def test_truncated_graphs_have_no_dot_source_and_draw_with_matplotlib(fake_dot):
    big = chain(100)
    d = G.draw(big)
    assert d.graph.truncated and d.engine == "matplotlib" and d.dot_source is None
    d = G.draw(big, max_nodes=200)
    assert d.engine == "graphviz" and "rankdir=TB" in d.dot_source  # a long graph runs top to bottom


def test_matplotlib_path_without_dot(no_dot):
    _, _, _, _, z, params = sigmoid_example()
    d = G.draw(z, params, show_values=True, show_saved=True)
    assert d.engine == "matplotlib"
    assert d.png.startswith(PNG) and d._repr_png_() == (d.png, {"alt": d.alt})  # Jupyter stores the alt text
    assert d.alt.startswith("autograd graph of z (6 nodes). An autograd graph drawn as boxes and arrows: "
                            "3 operation(s) (MulBackward0, AddBackward0, SigmoidBackward0) lead from the leaf "
                            "tensor(s) b, w, x to z.")
    assert repr(d) == G.as_text(z, params, show_values=True, show_saved=True)
    assert d.dot_source.startswith("digraph")  # the DOT source is there even without `dot`


def test_graphviz_path_sends_the_dot_source_to_dot(fake_dot):
    _, _, _, _, z, params = sigmoid_example()
    d = G.draw(z, params)
    assert d.engine == "graphviz"
    assert d.png.startswith(PNG)
    assert fake_dot.read_text() == d.dot_source


def test_a_failing_dot_falls_back_to_matplotlib(monkeypatch, tmp_path):
    bad = tmp_path / "dot"
    bad.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    bad.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    _, _, _, _, z, params = sigmoid_example()
    with pytest.warns(UserWarning, match=r"dot failed \(broken\); drawing with matplotlib"):
        d = G.draw(z, params)
    assert d.engine == "matplotlib" and d.png.startswith(PNG)


def _bundle(obj):
    from IPython.core.formatters import DisplayFormatter

    data, _ = DisplayFormatter().format(obj)
    return data


def test_both_paths_store_the_same_kinds_of_output(monkeypatch, tmp_path, fake_dot):
    """What a notebook stores: PNG (not compared by nbval) + identical text/plain; no SVG."""
    _, _, _, _, z, params = sigmoid_example()
    with_dot = _bundle(G.draw(z, params, show_values=True))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    without = _bundle(G.draw(z, params, show_values=True))
    assert set(with_dot) == set(without) == {"text/plain", "image/png"}
    assert with_dot["text/plain"] == without["text/plain"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")
def test_real_graphviz_renders_a_png():
    _, _, _, _, z, params = sigmoid_example()
    d = G.draw(z, params, show_values=True, show_saved=True)
    assert d.engine == "graphviz" and d.png.startswith(PNG) and len(d.png) > 2000
    s = G.step_view(z, params, step=3)
    assert s.engine == "graphviz" and s.png.startswith(PNG)


def test_no_distutils_anywhere():
    root = Path(G.__file__).resolve().parent
    for path in root.rglob("*.py"):
        assert "distutils" not in path.read_text(), f"{path.name} mentions distutils"


# ------------------------------------------------------------------ the backward pass, step by step


def test_backward_steps_follow_the_engine_order():
    x, w, b, y, z, params = sigmoid_example()
    steps = G.backward_steps(z, params)
    assert [(s.node, s.op, s.name) for s in steps] == [
        (0, "SigmoidBackward0", "z"),
        (1, "AddBackward0", "y"),
        (3, "AccumulateGrad", "b"),  # a leaf's gradient is stored as soon as it is complete
        (2, "MulBackward0", None),
        (4, "AccumulateGrad", "w"),
        (5, "AccumulateGrad", "x"),
    ]
    s = torch.sigmoid(torch.tensor(7.0))
    ds = (s * (1 - s)).item()
    assert steps[0].grad_output.item() == 1.0
    assert [t for t, _ in steps[0].grad_inputs] == [1]
    assert steps[0].grad_inputs[0][1].item() == pytest.approx(ds, rel=1e-5)
    assert [t for t, _ in steps[1].grad_inputs] == [2, 3]
    mul = steps[3]
    assert dict((t, g.item()) for t, g in mul.grad_inputs) == pytest.approx({4: 2 * ds, 5: 3 * ds}, rel=1e-5)
    assert steps[4].is_leaf and steps[4].grad_inputs == ()
    assert steps[4].grad_output.item() == pytest.approx(2 * ds, rel=1e-5)


def test_backward_steps_leave_grads_as_they_were():
    x, w, b, y, z, params = sigmoid_example()
    G.backward_steps(z, params)
    assert x.grad is None and w.grad is None and b.grad is None
    w.grad = torch.tensor([5.0])
    G.backward_steps(z, params)
    assert w.grad.item() == 5.0 and x.grad is None
    z.backward()  # the graph is still whole: backward_steps kept it
    assert w.grad.item() == pytest.approx(5.0 + 1.8203e-3, rel=1e-4)


def test_backward_steps_on_a_freed_graph_explain_what_to_do():
    _, _, _, _, z, params = sigmoid_example()
    z.backward()
    with pytest.raises(RuntimeError, match="Run the forward computation again"):
        G.backward_steps(z, params)
    with pytest.raises(ValueError, match="no grad_fn"):
        G.backward_steps(torch.ones(2, requires_grad=True))


def test_backward_steps_shared_input_and_size_limit():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    steps = G.backward_steps((x * x).sum(), {"x": x})
    assert [s.op for s in steps] == ["SumBackward0", "MulBackward0", "AccumulateGrad"]
    assert [t for t, _ in steps[1].grad_inputs] == [2, 2]  # both factors are x
    assert steps[2].grad_output.tolist() == [2.0, 4.0]
    with pytest.raises(ValueError, match="walks graphs of up to 60 nodes; this one has 101"):
        G.backward_steps(chain(100))


def test_format_step_text():
    _, _, _, _, z, params = sigmoid_example()
    g = G.build_graph(z, params)
    steps = G.backward_steps(z, params, graph=g)
    assert G.format_step(steps[1], g, len(steps)) == (
        "step 2 of 6: #1 AddBackward0 (y)\n"
        "  gradient in: dz/dy = 0.0009102\n"
        "  sends 0.0009102 to #2 MulBackward0\n"
        "  sends 0.0009102 to #3 leaf b"
    )
    assert G.format_step(steps[3], g).splitlines()[1] == "  gradient in: dz/d(result of #2) = 0.0009102"
    assert G.format_step(steps[4], g, 6).splitlines()[1].startswith("  w.grad += 0.00182")


def test_step_view_is_the_widget_view(no_dot):
    _, _, _, _, z, params = sigmoid_example()
    v = G.step_view(z, params, step=3)
    assert v.png.startswith(PNG) and v.engine == "matplotlib"
    assert repr(v).startswith("step 4 of 6: #2 MulBackward0")
    assert "penwidth=3" in v.dot_source and 'label=" 0.00182 "' in v.dot_source
    assert "grad=0.0009102" in v.dot_source  # the gradient the node received
    with pytest.raises(IndexError, match="between 0 and 5"):
        G.step_view(z, params, step=6)


def test_stepper_widget_moves_through_the_steps(no_dot):
    pytest.importorskip("ipywidgets")
    _, _, _, _, z, params = sigmoid_example()
    box = G.stepper_widget(z, params)
    controls, image, text = box.children
    play, slider = controls.children
    assert (slider.min, slider.max, slider.value) == (1, 6, 1)
    first = bytes(image.value)
    assert first.startswith(PNG) and "step 1 of 6" in text.value
    slider.value = 4
    assert "step 4 of 6: #2 MulBackward0" in text.value and bytes(image.value) != first


# ------------------------------------------------------------------ the sigmoid explorer


def test_the_source_example_has_the_right_gradients():
    rows = {r.split()[0]: r.split()[1:] for r in G.sigmoid_example_text(2.0, 3.0, 1.0).splitlines()[2:]}
    assert rows["dz/dw"][0].startswith("1.820") and rows["dz/db"][0].startswith("9.102")
    assert rows["dz/dx"] == ["2.7307e-03", "2.7305e-03"]  # by hand (float64), autograd (float32)
    assert abs(float(rows["dz/dw"][1]) - 0.0900) > 0.08  # the source's "about 0.0900" is wrong
    for x, w, b in ((2.0, 3.0, 1.0), (1.0, -2.0, 6.0), (-3.0, 0.5, 0.0)):
        for row in G.sigmoid_example_text(x, w, b).splitlines()[2:]:
            hand, auto = map(float, row.split()[1:])
            assert auto == pytest.approx(hand, rel=1e-3, abs=1e-7), row


def test_example_text_table():
    lines = G.sigmoid_example_text().splitlines()
    assert lines[0] == "x = 2, w = 3, b = 1"
    assert lines[5].split()[:2] == ["dz/dw", "1.8204e-03"]
    assert len(lines) == 7


def test_example_figure_is_labelled():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = G.sigmoid_example_figure(1.0, -2.0, 6.0)
    try:
        ax, bx = fig.axes
        assert "x=1, w=-2, b=6" in ax.get_title()
        assert ax.get_xlabel() and ax.get_ylabel() and bx.get_xlabel() and bx.get_title()
        legend = [t.get_text() for t in ax.get_legend().texts]
        assert "tangent at y = 4.00, slope sigmoid'(y) = 1.766e-02" in legend
    finally:
        plt.close(fig)


def test_explorer_builds():
    pytest.importorskip("ipywidgets")
    box = G.sigmoid_explorer()
    sliders = box.children[0].children
    assert [(s.description, s.value) for s in sliders] == [("x", 2.0), ("w", 3.0), ("b", 1.0)]
    # the notebook suggests b = -6 (y = 0, the steepest point): the slider must reach it
    sliders[2].value = -6.0
    assert sliders[2].value == -6.0



# ------------------------------------------------------------------ the Chinese edition


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_texts_speak_the_course_language(monkeypatch, no_dot, lang):
    """The Chinese edition's words (COURSE_LANG=zh), the English ones unchanged; node names, ids,
    shapes and values are the same in both."""
    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    _, _, _, _, z, params = sigmoid_example()
    text = G.as_text(z, params)
    assert text.splitlines()[0] == (
        "z 的计算图：6 个节点（反向传播从 #0 开始；“<-” 后面是节点的输入）" if zh
        else "autograd graph of z: 6 nodes (backward starts at #0; '<-' lists a node's inputs)")
    assert ("#4 叶子张量 w (1,)" if zh else "#4 leaf w (1,)") in text and "#2 MulBackward0  <- #4, #5" in text
    g = G.build_graph(z, params)
    steps = G.backward_steps(z, params, graph=g)
    step = G.format_step(steps[1], g, len(steps)).splitlines()
    assert step[0] == ("第 2 步（共 6 步）：#1 AddBackward0 (y)" if zh else "step 2 of 6: #1 AddBackward0 (y)")
    assert step[-1] == ("  向 #3 叶子张量 b 送出 0.0009102" if zh else "  sends 0.0009102 to #3 leaf b")
    title = 'label="z 的计算图\n（6 个节点）"' if zh else 'label="autograd graph of z\n(6 nodes)"'
    assert title in G.draw(z, params).dot_source
    assert _has_chinese(G.step_view(z, params, step=3).dot_source) == zh
    table = G.sigmoid_example_text().splitlines()
    assert ("手算" in table[1]) == zh and text_width(table[1]) == len(table[2])  # the columns line up


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_figure_and_widgets_speak_the_course_language(monkeypatch, no_dot, lang):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    fig = G.sigmoid_example_figure(1.0, -2.0, 6.0)
    ax, bx = fig.axes
    assert _has_chinese(ax.get_title()) == zh and "x=1, w=-2, b=6" in ax.get_title()
    assert bx.get_xlabel() == ("梯度（autograd）" if zh else "gradient (autograd)")
    assert ax.get_xlabel() == "y = w * x + b"  # formulas stay as they are
    assert _has_chinese(ax.get_legend().texts[1].get_text()) == zh
    plt.close(fig)
    pytest.importorskip("ipywidgets")
    _, _, _, _, z, params = sigmoid_example()
    box = G.stepper_widget(z, params)
    (play, slider), text = box.children[0].children, box.children[2]
    assert (slider.description, play.description) == (("步骤", "播放") if zh else ("step", "play"))
    assert ("第 1 步（共 6 步）" in text.value) == zh


def test_dot_draws_chinese_with_the_course_font(monkeypatch):
    """fontconfig does not know the mplfonts package's CJK font: in the Chinese edition `dot` is run
    with a fontconfig file that adds it (else Chinese labels are drawn as empty boxes)."""
    from course_utils.figures import course_font_file

    font = course_font_file()
    if font is None:
        pytest.skip("the mplfonts package is not installed")
    monkeypatch.setenv("COURSE_LANG", "en")
    assert G._dot_env() is None
    monkeypatch.setenv("COURSE_LANG", "zh")
    conf = Path(G._dot_env()["FONTCONFIG_FILE"]).read_text()
    assert f"<dir>{font.parent}</dir>" in conf and "<include" in conf
    if shutil.which("dot"):
        _, _, _, _, z, params = sigmoid_example()
        d = G.draw(z, params)
        assert d.engine == "graphviz" and d.png.startswith(PNG)


# ------------------------------------------------------------------ torch.export's graphs


def test_fx_code_from_a_traced_function():
    def f(x):
        return torch.sin(x) * 2 + 1

    code = G.fx_code(torch.fx.symbolic_trace(f))
    assert "= None" not in code and "\n\n" not in code
    assert code.splitlines()[0] == "def forward(self, x):"


# ------------------------------------------------------------------ chapter 01 exercises (the rest: test_exercises.py)


def test_a_function_whose_backward_raises_reads_not_attempted():
    class Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            r = 1 / (1 + torch.exp(-x))
            ctx.save_for_backward(r)
            return r

        @staticmethod
        def backward(ctx, grad_output):
            raise NotImplementedError

    assert ch01.q2.check(Stub).status == "not_attempted"


def test_backward_walk_matches_autograd_and_leaves_the_graph_alone():
    x, w, b = (torch.tensor([v], requires_grad=True) for v in (2.0, 3.0, 1.0))
    out = torch.sigmoid(w * x + b) * w  # w is reached by two paths: its gradients add up
    grads = ch01.backward_walk(out)
    assert {id(k) for k in grads} == {id(x), id(w), id(b)}
    assert all(t.grad is None for t in (x, w, b))  # nothing was accumulated into .grad
    expected = torch.autograd.grad(out, (x, w, b))  # the graph is still whole: autograd can run on it
    for leaf, g in zip((x, w, b), expected, strict=True):
        assert torch.allclose(grads[leaf], g)


def test_q5_tells_a_walk_from_autograd_itself():
    assert "autograd's engine itself" in ch01.q5.check(
        lambda out: dict(zip(*ch01._autograd_grads(out), strict=True))).message
    assert "called backward()" in ch01.q5.check(ch01._mistake_backward).message


def test_the_model_walk_runs_each_node_once_and_gives_zeros_to_unused_outputs():
    """The engine's algorithm: one call per node (counted through the ops it runs), and an unbind with
    outputs nobody used still gets a gradient for every output (zeros there)."""
    from course_utils.exercises.probes import counting_ops

    x = torch.tensor([0.5, -1.0], requires_grad=True)
    h = x
    for _ in range(16):
        h = h + h * 0.5  # 2**16 paths
    with counting_ops() as count:
        grads = ch01.backward_walk(h.sum())
    assert count.ops < 200
    assert torch.allclose(grads[x], torch.full((2,), 1.5**16))
    words = torch.randn(4, 3, requires_grad=True)
    a, _, c, _ = words.unbind()
    grads = ch01.backward_walk((a * c).sum())
    assert torch.equal(grads[words][1], torch.zeros(3)) and torch.equal(grads[words][3], torch.zeros(3))
    assert torch.allclose(grads[words][0], c.detach()) and torch.allclose(grads[words][2], a.detach())
