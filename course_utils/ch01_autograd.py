"""Chapter 01 (autograd): the autograd graph as text, as a picture and as a backward pass to step
through; the sigmoid explorer; the code of graphs that ``torch.compile``/``torch.export`` capture.

The graph as data and as text is in ``ch01_graph``, the graph as a picture in ``ch01_drawing``; their
names are imported here, so the notebook imports everything from this module. A picture is torchviz's
graph rendered by Graphviz's ``dot`` when it is on the PATH, else a small matplotlib drawing of the same
nodes. Either way Jupyter shows a PNG whose text form is the :func:`as_text` listing, so a notebook
stores the same kinds of output with or without ``dot``.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .ch01_drawing import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    GraphDrawing,
    _dot_env,
    _picture,
    draw,
    graph_alt_text,
    stable_dot,
)
from .ch01_graph import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    DEFAULT_MAX_NODES,
    Graph,
    GraphNode,
    _fmt_shape,
    _fmt_values,
    _node_ref,
    as_text,
    build_graph,
)
from .figures import COLORS, describe_figure, pyplot, show_figure, widget_callback
from .i18n import table, tr

# ---------------------------------------------------------------- the backward pass, step by step


@dataclass(frozen=True)
class Step:
    """One node the engine ran: the gradient that arrived (d output / d its result) and, for each
    input, ``(its node id, the gradient sent to it)``; ids are :func:`build_graph`'s (``#n``)."""

    index: int
    node: int
    op: str
    name: str | None
    grad_output: torch.Tensor | None
    grad_inputs: tuple[tuple[int, torch.Tensor], ...]

    @property
    def is_leaf(self) -> bool:
        return self.op == "AccumulateGrad"


def backward_steps(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    graph: Graph | None = None,
) -> list[Step]:
    """Run backward with a hook on every node (``Node.register_hook``); return the steps in the
    order the engine ran them. The graph is kept, and every leaf's ``.grad`` put back."""
    if tensor.grad_fn is None:
        raise ValueError(
            "This tensor has no grad_fn, so backward() has nothing to run: it is a leaf, "
            "or it was computed from tensors that do not require grad."
        )
    g = graph or build_graph(tensor, params, max_nodes=60)
    if g.truncated:
        raise ValueError(f"The stepper walks graphs of up to 60 nodes; this one has {g.total:,}.")
    leaves = [n.tensor for n in g.nodes if n.kind == "leaf"]
    old = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    record = []
    # Node hooks get (grad_inputs, grad_outputs): what the node sends on, what it received
    hook = lambda n: lambda grad_inputs, grad_outputs: record.append((n, grad_inputs, grad_outputs))  # noqa: E731
    handles = [n.fn.register_hook(hook(n)) for n in g.nodes if n.fn is not None]
    try:
        tensor.backward(retain_graph=True)
    except RuntimeError as exc:
        if "second time" not in str(exc) and "freed" not in str(exc):
            raise
        raise RuntimeError(
            "This graph was already used by a backward() call without retain_graph=True, so its "
            "saved tensors are gone. Run the forward computation again to build a fresh graph, "
            "then step through that one."
        ) from None
    finally:
        for h in handles:
            h.remove()
        for t, grad in zip(leaves, old, strict=True):
            t.grad = grad
    steps = []
    for i, (n, grad_inputs, grad_outputs) in enumerate(record):
        nxt = [f for f, _ in n.fn.next_functions]  # n.inputs: one per entry that is not None
        sent = [gi for f, gi in zip(nxt, grad_inputs, strict=False) if f is not None]
        sent = zip(n.inputs, sent, strict=False)
        sent = tuple((j, gi.detach().clone()) for j, gi in sent if gi is not None)
        got = grad_outputs[0].detach().clone() if grad_outputs and grad_outputs[0] is not None else None
        steps.append(Step(i, n.id, n.op, n.name, got, sent))
    return steps


def _grad_str(t: torch.Tensor | None) -> str:
    shape = _fmt_shape(t)
    return "None" if t is None else _fmt_values(t) or tr("a {shape} tensor", "形状为 {shape} 的张量", shape=shape)


def format_step(step: Step, graph: Graph, n_steps: int | None = None) -> str:
    """A few lines saying what one step of the backward pass does."""
    i, ref = step.index + 1, _node_ref(graph.nodes[step.node])
    of = tr(" of {n_steps}", "（共 {n_steps} 步）", n_steps=n_steps) if n_steps else ""
    head = tr("step {i}{of}: {ref}", "第 {i} 步{of}：{ref}", i=i, of=of, ref=ref)
    name, out, got = graph.nodes[step.node].name, graph.root_name, _grad_str(step.grad_output)
    if step.is_leaf:
        why = tr("(AccumulateGrad stores d{out}/d{value})", "（AccumulateGrad 存下 d{out}/d{value}）",
                 out=out, value=name or 'leaf')
        return f"{head}\n  {name or tr('the leaf', '叶子张量')}.grad += {got}   {why}"
    wrt = name or tr("(result of #{node})", "(#{node} 的结果)", node=step.node)
    lines = [head, tr("  gradient in: d{out}/d{wrt} = {got}", "  收到的梯度：d{out}/d{wrt} = {got}",
                      out=out, wrt=wrt, got=got)]
    for t, gi in step.grad_inputs:
        to, sent = _node_ref(graph.nodes[t]), _grad_str(gi)
        lines.append(tr("  sends {sent} to {to}", "  向 {to} 送出 {sent}", sent=sent, to=to))
    return "\n".join(lines if step.grad_inputs else [*lines, tr("  sends nothing further", "  不再向下传递")])


def _step_picture(g: Graph, steps: Sequence[Step], index: int) -> GraphDrawing:
    """Step `index`: its node highlighted, the gradients it sends written on its input edges,
    and the gradient each node has received so far."""
    if not 0 <= index < len(steps):
        raise IndexError(f"step must be between 0 and {len(steps) - 1}, not {index}.")
    i, n, step = index + 1, len(steps), steps[index]
    title = tr("backward pass of {root_name}, step {i} of {n}", "{root_name} 的反向传播：第 {i} 步（共 {n} 步）",
               root_name=g.root_name, i=i, n=n)
    grads = {s.node: _fmt_values(s.grad_output) for s in steps[: index + 1]}
    sent = {(t, step.node): _grad_str(gi) for t, gi in step.grad_inputs}
    return _picture(g, format_step(step, g, len(steps)), title, grads, step.node, sent)


def step_view(
    tensor: torch.Tensor, params: Mapping[str, torch.Tensor] | None = None, step: int = 0
) -> GraphDrawing:
    """What the stepper shows at `step` (0-based), without a widget: a PNG and the step's text."""
    g = build_graph(tensor, params, show_values=True, max_nodes=60)
    return _step_picture(g, backward_steps(tensor, params, graph=g), step)


def stepper_widget(tensor: torch.Tensor, params: Mapping[str, torch.Tensor] | None = None) -> Any:
    """A slider (and play button) that walks the backward pass node by node."""
    import ipywidgets as widgets

    g = build_graph(tensor, params, show_values=True, max_nodes=60)
    steps = backward_steps(tensor, params, graph=g)
    views: dict[int, GraphDrawing] = {}
    slider = widgets.IntSlider(1, 1, len(steps), description=tr("step", "步骤"), continuous_update=False)
    play = widgets.Play(1, min=1, max=len(steps), interval=1500, description=tr("play", "播放"))
    widgets.jslink((play, "value"), (slider, "value"))
    image, text = widgets.Image(format="png"), widgets.HTML()

    @widget_callback
    def show(i: int) -> None:
        if i not in views:
            views[i] = _step_picture(g, steps, i)
        image.value = views[i].png
        text.value = f"<pre style='line-height:1.3'>{html.escape(views[i].text)}</pre>"

    slider.observe(lambda change: show(change["new"] - 1), names="value")
    show(0)
    return widgets.VBox([widgets.HBox([play, slider]), image, text])


# ---------------------------------------------------------------- z = sigmoid(w*x + b), explored


def _sigmoid_numbers(x: float, w: float, b: float) -> tuple[dict[str, float], dict[str, float]]:
    """``y``, ``z`` and the gradients by the chain rule (float64) and by autograd (float32)."""
    y = w * x + b
    z = 1 / (1 + math.exp(-y))
    s = z * (1 - z)  # sigmoid'(y) = sigmoid(y) * (1 - sigmoid(y))
    hand = {"y": y, "z": z, "dz/dy": s, "dz/dx": s * w, "dz/dw": s * x, "dz/db": s}
    xt, wt, bt = (torch.tensor([float(v)], requires_grad=True) for v in (x, w, b))
    yt = wt * xt + bt
    zt = torch.sigmoid(yt)
    zt.backward()
    grads = {"dz/dx": xt.grad.item(), "dz/dw": wt.grad.item(), "dz/db": bt.grad.item()}
    return hand, {"y": yt.item(), "z": zt.item(), **grads}


def sigmoid_example_text(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> str:
    """A small table: each quantity by hand (float64) and by autograd (float32)."""
    hand, auto = _sigmoid_numbers(x, w, b)
    rows = [("", tr("by hand", "手算"), "autograd")]
    rows += [(k, f"{hand[k]:.4e}", f"{auto[k]:.4e}") for k in ("y", "z", "dz/dx", "dz/dw", "dz/db")]
    return "\n".join([f"x = {x:g}, w = {w:g}, b = {b:g}", *table(rows, align="<>>", sep=" ", widths=(6, 11, 11))])


def sigmoid_example_figure(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """The sigmoid with the point ``(y, z)`` and its tangent, beside the three gradients."""
    plt = pyplot()

    hand, auto = _sigmoid_numbers(x, w, b)
    y, z, slope = hand["y"], hand["z"], hand["dz/dy"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    lo, hi = min(-8.0, y - 2.0), max(8.0, y + 2.0)
    t = torch.linspace(lo, hi, 400, dtype=torch.float64)
    ax.plot(t.numpy(), torch.sigmoid(t).numpy(), color=COLORS["blue"], label="z = sigmoid(y)")
    tangent = tr("tangent at y = {y:.2f}, slope sigmoid'(y) = {slope:.3e}",
                 "y = {y:.2f} 处的切线，斜率 sigmoid'(y) = {slope:.3e}", y=y, slope=slope)
    ax.plot([y - 3, y + 3], [z - 3 * slope, z + 3 * slope], "--", color=COLORS["vermilion"], label=tangent)
    ax.plot([y], [z], "o", color=COLORS["vermilion"], zorder=3)
    ax.set(xlim=(lo, hi), ylim=(-0.1, 1.1), xlabel="y = w * x + b", ylabel="z = sigmoid(y)")
    ax.set_title(tr("z = sigmoid(w*x + b) at x={x:g}, w={w:g}, b={b:g}",
                    "x={x:g}, w={w:g}, b={b:g} 时的 z = sigmoid(w*x + b)", x=x, w=w, b=b))
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    keys = ["dz/db", "dz/dw", "dz/dx"]  # bottom to top
    vals = [auto[k] for k in keys]
    colors = [COLORS["blue"] if v >= 0 else COLORS["vermilion"] for v in vals]
    bx.barh([f"{k}\n{v:.3e}" for k, v in zip(keys, vals, strict=True)], vals, color=colors)
    span = max(abs(v) for v in vals) or 1.0
    bx.set_xlim(-1.1 * span if min(vals) < 0 else 0, 1.1 * span if max(vals) > 0 else 0.1 * span)
    bx.axvline(0, color="0.3", lw=0.8)
    bx.set(xlabel=tr("gradient (autograd)", "梯度（autograd）"),
           title="dz/dx = w*s'(y), dz/dw = x*s'(y), dz/db = s'(y)")
    bx.ticklabel_format(axis="x", style="sci", scilimits=(-2, 2))
    fig.tight_layout()
    grads = ", ".join(f"{k} = {auto[k]:.3e}" for k in keys[::-1])
    return describe_figure(
        fig,
        "Left: the S-shaped curve z = sigmoid(y), with the point y = {y:.2f}, z = {z:.4f} (x = {x:g}, w = {w:g}, "
        "b = {b:g}) and its tangent, of slope {slope:.3e}. Right: a bar chart of the three gradients that "
        "autograd gives: {grads}.",
        "左图：S 形曲线 z = sigmoid(y)，标出点 y = {y:.2f}，z = {z:.4f}（x = {x:g}，w = {w:g}，b = {b:g}）"
        "及其切线，斜率 {slope:.3e}。右图：autograd 给出的三个梯度的柱状图：{grads}。",
        y=y, z=z, x=x, w=w, b=b, slope=slope, grads=grads)


def sigmoid_explorer(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """Sliders for x, w and b; shows z, the three gradients and the tangent."""
    import ipywidgets as widgets

    def slider(name: str, value: float) -> Any:
        kw = dict(step=0.1, continuous_update=False, readout_format=".1f")
        return widgets.FloatSlider(value, min=-10.0, max=10.0, description=name, **kw)

    @widget_callback
    def show(x: float, w: float, b: float) -> None:
        print(sigmoid_example_text(x, w, b))
        show_figure(sigmoid_example_figure(x, w, b))

    sliders = {"x": slider("x", x), "w": slider("w", w), "b": slider("b", b)}
    controls = widgets.HBox(list(sliders.values()))
    return widgets.VBox([controls, widgets.interactive_output(show, sliders)])


# ---------------------------------------------------------------- the graphs torch.compile captures


_CLEANUP = re.compile(r";\s+(?:\w+ = )+None$")


def fx_code(gm: Any) -> str:
    """The Python code of an FX ``GraphModule``, without blank lines and ``x = None`` clean-ups."""
    lines = (_CLEANUP.sub("", line.rstrip()) for line in gm.code.splitlines())
    return "\n".join(line for line in lines if line.strip())
