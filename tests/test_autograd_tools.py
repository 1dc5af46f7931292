"""Tests for course_utils.autograd_tools and the chapter 01 exercises."""

from __future__ import annotations

import pytest
import torch

from course_utils import autograd_tools as A
from course_utils.exercises import ch01


def test_the_source_example_has_the_right_gradients():
    auto = A.sigmoid_example(2.0, 3.0, 1.0)
    hand = A.sigmoid_by_hand(2.0, 3.0, 1.0)
    assert f"{auto['dz/dw']:.3e}" == f"{hand['dz/dw']:.3e}" == "1.820e-03"
    assert f"{auto['dz/db']:.3e}" == f"{hand['dz/db']:.3e}" == "9.102e-04"
    assert f"{auto['dz/dx']:.3e}" == "2.731e-03"
    assert abs(auto["dz/dw"] - 0.0900) > 0.08  # the source's "about 0.0900" is wrong
    for key in ("y", "z", "dz/dx", "dz/dw", "dz/db"):
        assert auto[key] == pytest.approx(hand[key], rel=1e-3)


def test_example_text_table():
    lines = A.sigmoid_example_text().splitlines()
    assert lines[0] == "x = 2, w = 3, b = 1"
    assert lines[5].split()[:2] == ["dz/dw", "1.8204e-03"]
    assert len(lines) == 7


def test_example_figure_is_labelled():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = A.sigmoid_example_figure(1.0, -2.0, 6.0)
    try:
        ax, bx = fig.axes
        assert "x=1, w=-2, b=6" in ax.get_title()
        assert ax.get_xlabel() and ax.get_ylabel() and bx.get_xlabel() and bx.get_title()
        assert "tangent at y, slope sigmoid'(y) = 1.766e-02" in [t.get_text() for t in ax.get_legend().texts]
    finally:
        plt.close(fig)


def test_explorer_builds():
    pytest.importorskip("ipywidgets")
    box = A.sigmoid_explorer()
    sliders = box.children[0].children
    assert [(s.description, s.value) for s in sliders] == [("x", 2.0), ("w", 3.0), ("b", 1.0)]
    # the notebook suggests b = -6 (y = 0, the steepest point): the slider must reach it
    sliders[2].value = -6.0
    assert sliders[2].value == -6.0


def two_layers(x, w1, w2, detach_first=False):
    if detach_first:
        w1 = w1.detach()
    h = torch.relu(x @ w1)
    return ((h @ w2) ** 2).mean()


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return torch.randn(64, 784), torch.randn(784, 256, requires_grad=True), torch.randn(256, 10, requires_grad=True)


def test_saved_bytes_in_each_mode(mlp):
    x, w1, w2 = mlp
    with A.count_saved_tensors() as normal:
        out = two_layers(x, w1, w2)
    assert out.requires_grad
    # x (for dL/dw1), relu's output (saved twice: by relu and by the second matmul), w2, the matmul output
    assert normal.count == 5
    assert normal.bytes == 4 * (64 * 784 + 64 * 256 + 256 * 10 + 64 * 10) == 279_040
    # without `held`, nothing is known to live anyway: every saved byte counts as extra
    assert (normal.held_bytes, normal.extra_bytes) == (0, normal.bytes)
    for ctx in (torch.no_grad, torch.inference_mode):
        with A.count_saved_tensors() as log, ctx():
            out = two_layers(x, w1, w2)
        assert (log.count, log.bytes) == (0, 0) and not out.requires_grad
    with A.count_saved_tensors() as frozen:
        two_layers(x, w1, w2, detach_first=True)
    assert frozen.bytes == 4 * (64 * 256 + 64 * 10)


def test_held_tensors_are_split_from_activations(mlp):
    """x and w2 are saved by reference and live anyway; only h and the output cost extra memory."""
    x, w1, w2 = mlp
    with A.count_saved_tensors(held=(x, w1, w2)) as normal:
        two_layers(x, w1, w2)
    with A.count_saved_tensors(held=(x, w1, w2)) as frozen:
        two_layers(x, w1, w2, detach_first=True)  # w1.detach() shares w1's memory
    assert normal.held_bytes == 4 * (64 * 784 + 256 * 10)
    assert sorted(normal.held_shapes) == [(64, 784), (256, 10)]
    assert sorted(normal.extra_shapes) == [(64, 10), (64, 256)]
    # freezing the first layer of two drops the references to x and w2, but keeps h: no saving
    assert frozen.held_bytes == 0
    assert normal.extra_bytes == frozen.extra_bytes == 4 * (64 * 256 + 64 * 10)
    # a view or a detach() of a held tensor counts as held too
    with A.count_saved_tensors(held=(x,)) as log:
        (x.t().contiguous().t() @ w1).sum()  # a copy: not held
        (x[:10] @ w1).sum()                  # a view of x: held
    assert log.held_shapes == [(10, 784)]


def test_freezing_the_first_layers_saves_activations():
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    ws = [torch.randn(16, 16, requires_grad=True) for _ in range(3)]

    def three_layers(w1, w2, w3):
        h1 = torch.relu(x @ w1)
        h2 = torch.relu(h1 @ w2)
        return ((h2 @ w3) ** 2).mean()

    def extra(*weights):
        with A.count_saved_tensors(held=(x, *ws)) as log:
            three_layers(*weights)
        return log.extra_bytes

    w1, w2, w3 = ws
    act = 8 * 16 * 4
    assert extra(w1, w2, w3) == 3 * act                      # h1, h2, the last matmul's output
    assert extra(w1.detach(), w2, w3) == 3 * act             # frozen first layer: h1 still needed
    assert extra(w1, w2.detach(), w3) == 3 * act             # frozen middle: relu keeps h1 for w1
    assert extra(w1.detach(), w2.detach(), w3) == 2 * act    # frozen first two: h1 is not kept


def test_format_bytes():
    assert A.format_bytes(512) == "512 B"
    assert A.format_bytes(279_040) == "272.5 KiB"
    assert A.format_bytes(3 * 1024**3) == "3.0 GiB"


def test_fx_code_and_ops_from_a_traced_function():
    def f(x):
        return torch.sin(x) * 2 + 1

    gm = torch.fx.symbolic_trace(f)
    code = A.fx_code(gm)
    assert "= None" not in code and "\n\n" not in code
    assert code.splitlines()[0] == "def forward(self, x):"
    assert A.fx_ops(gm) == ["sin", "mul", "add"]


@pytest.mark.slow  # Dynamo's first capture takes seconds
def test_graph_printer_shows_loops_unrolled_and_graph_breaks(capsys):
    import torch._dynamo

    torch._dynamo.reset()
    printer = A.GraphPrinter()

    def f(x, n):
        for _ in range(n):
            x = torch.sin(x) * 2
        if x.sum() > 0:  # depends on data: Dynamo breaks the graph here
            return x.relu()
        return -x

    cf = torch.compile(f, backend=printer)
    x = torch.ones(3)
    assert torch.equal(cf(x, 2), f(x, 2))
    assert len(printer.graphs) == 2
    assert A.fx_ops(printer.graphs[0]).count("sin") == 2
    out = capsys.readouterr().out
    assert out.startswith("--- captured graph 1: 6 ops ---")
    assert "--- captured graph 2: 1 ops ---" in out
    torch._dynamo.reset()


# ------------------------------------------------------------------ chapter 01 exercises


@pytest.mark.parametrize("q", ch01.EXERCISES, ids=lambda q: q.name)
def test_exercise_solution_stub_and_mistakes(q):
    assert q.check(q.reference()).correct
    assert q.check(...).status == "not_attempted"
    assert len(q.mistakes) >= 2
    for name, answer in q.mistakes.items():
        assert q.check(answer).message == q.reasons[name]


def test_function_stubs_read_not_attempted():
    class Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            r = 1 / (1 + torch.exp(-x))
            ctx.save_for_backward(r)
            return r

        @staticmethod
        def backward(ctx, grad_output):
            raise NotImplementedError

    def stub(*args, **kwargs):
        raise NotImplementedError

    assert ch01.q2.check(Stub).status == "not_attempted"
    assert ch01.q3.check(stub).status == "not_attempted"
    assert ch01.q4.check(stub).status == "not_attempted"
    assert ch01.q5.check(stub).status == "not_attempted"


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
    assert "autograd itself" in ch01.q5.check(lambda out: dict(zip(*ch01._autograd_grads(out), strict=True))).message
    assert "called backward()" in ch01.q5.check(ch01._mistake_backward).message
