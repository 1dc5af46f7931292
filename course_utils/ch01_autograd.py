"""Chapter 01 (autograd): the autograd graph as text, as a picture and as a backward pass to step
through; the sigmoid explorer; the code of graphs that ``torch.compile``/``torch.export`` capture.

A picture is torchviz's graph rendered by Graphviz's ``dot`` when it is on the PATH, else a small
matplotlib drawing of the same nodes. Either way Jupyter shows a PNG whose text form is the
:func:`as_text` listing, so a notebook stores the same kinds of output with or without ``dot``.
"""

from __future__ import annotations

import html
import io
import math
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .figures import COLORS, course_font_file, describe_figure, pyplot, show_figure, use_course_font
from .i18n import language, text_width, tr

DEFAULT_MAX_NODES = 40
_COLORS = dict(op="#e9ecef", root="#c9f0d1", leaf="#cfe2ff", saved="#ffe2b8", more="#ffffff")
_COLORS.update(tensor="#f8d7da", highlight="#fff3a3", hot=COLORS["vermilion"], edge="#555555")
_LINES = {"saved": "--", "more": ":"}  # line styles of the edges that are not data


# ---------------------------------------------------------------- the graph as data


@dataclass(eq=False)
class GraphNode:
    """One node. kind: "op" (a backward function), "leaf" (a leaf tensor, reached through its
    AccumulateGrad node), "saved" (a tensor an op saved for backward), "more" (the nodes left out)
    or "tensor" (a tensor without a graph). `tensor`: what it shows the shape and values of."""

    id: int
    kind: str
    op: str = ""
    name: str | None = None
    tensor: torch.Tensor | None = None
    fn: Any = None  # the autograd node
    inputs: list[int] = field(default_factory=list)
    saved_for: int | None = None
    hidden: int = 0


@dataclass
class Graph:
    """The autograd graph below `tensor`, breadth first from its ``grad_fn`` (node #0)."""

    nodes: list[GraphNode]
    root_name: str
    tensor: torch.Tensor
    params: dict[str, torch.Tensor]
    show_values: bool = False
    show_saved: bool = False
    total: int = 1
    truncated: bool = False

    @property
    def edges(self) -> list[tuple[int, int, str]]:
        """``(input, consumer, kind)`` triples; kind is "data", "saved" or "more"."""
        kind = {n.id: "more" if n.kind == "more" else "data" for n in self.nodes}
        out = [(i, n.id, kind[i]) for n in self.nodes for i in n.inputs]
        return out + [(n.id, n.saved_for, "saved") for n in self.nodes if n.kind == "saved"]

    @property
    def note(self) -> str:
        """How many nodes there are, and how many are shown."""
        total = tr(f"{self.total:,} node" + ("" if self.total == 1 else "s"), f"{self.total:,} 个节点")
        shown = sum(n.kind in ("op", "leaf") for n in self.nodes)
        more = tr(f"{total}; showing the {shown:,} nearest the output",
                  f"{total}，只显示离输出最近的 {shown:,} 个")
        return more if self.truncated else total


def _count_nodes(tensor: torch.Tensor) -> int:
    seen = {id(tensor.grad_fn): tensor.grad_fn}  # holding each node keeps its id() unique
    stack = [tensor.grad_fn]
    while stack:
        for nxt, _ in getattr(stack.pop(), "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                seen[id(nxt)] = nxt
                stack.append(nxt)
    return len(seen)


def _saved_tensors(fn: Any) -> list[tuple[str, torch.Tensor | None]]:
    """``(name, tensor)`` for each tensor a backward node saved; tensor None once freed."""
    if hasattr(fn, "saved_tensors"):  # a custom autograd.Function's ctx.save_for_backward
        try:
            return [(f"tensor {i}", t) for i, t in enumerate(fn.saved_tensors)]
        except RuntimeError:
            return [("tensors", None)]
    out = []
    for attr in sorted(a for a in dir(fn) if a.startswith("_saved_")):
        try:
            val = getattr(fn, attr)
        except RuntimeError:  # freed by an earlier backward()
            val = None
        if val is None or isinstance(val, torch.Tensor):
            out.append((attr.removeprefix("_saved_"), val))
    return out


def _same(p: torch.Tensor, t: torch.Tensor) -> bool:
    """`t` is `p`, or a new tensor object on its memory (as autograd gives back a saved output)."""
    meta = (p.shape, p.stride(), p.dtype, p.data_ptr())
    return p is t or (meta == (t.shape, t.stride(), t.dtype, t.data_ptr()) and p.numel() > 0)


def build_graph(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = False,
    show_saved: bool = False,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> Graph:
    """Walk ``tensor.grad_fn`` to the leaves, breadth first, keeping at most `max_nodes` nodes;
    `params` names leaves (``{"w": w}``) and intermediate results (``{"y": y}``)."""
    params = dict(params or {})
    checks = {"draw/as_text's tensor": tensor, **{f"params[{k!r}]": v for k, v in params.items()}}
    for k, v in checks.items():
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{k} should be a torch.Tensor, but it is a {type(v).__name__}.")
    root_name = next((k for k, t in params.items() if t is tensor), "output")
    g = Graph([], root_name, tensor, params, show_values, show_saved)
    if tensor.grad_fn is None:  # a leaf, or a tensor that autograd did not record
        kind, op = ("leaf", "AccumulateGrad") if tensor.requires_grad else ("tensor", "")
        g.nodes.append(GraphNode(0, kind, op, root_name, tensor))
        return g
    cut, hidden = _walk(g, max_nodes)
    if show_saved:
        _add_saved(g)
    g.total = _count_nodes(tensor)
    if cut:
        shown = sum(n.kind in ("op", "leaf") for n in g.nodes)
        g.nodes.append(GraphNode(len(g.nodes), "more", hidden=max(g.total - shown, hidden)))
        for n in cut:
            n.inputs.append(len(g.nodes) - 1)
        g.truncated = True
    return g


def _walk(g: Graph, max_nodes: int) -> tuple[list[GraphNode], int]:
    """Add to `g` the nodes below ``g.tensor.grad_fn``, breadth first, up to `max_nodes`, each with its
    inputs; returns the nodes that lost an input to that limit and how many inputs they lost."""
    params, tensor = g.params, g.tensor
    # id(grad_fn) -> (name, tensor, grad_fn), held so that its id() stays unique; the first
    # name wins, the output's over all
    named = {}
    for k, t in [*reversed(params.items()), (g.root_name, tensor)]:
        if t.grad_fn is not None:
            named[id(t.grad_fn)] = (k, t, t.grad_fn)
    ids: dict[int, int] = {}

    def add(fn: Any) -> GraphNode:
        nid = ids[id(fn)] = len(g.nodes)
        if type(fn).__name__ == "AccumulateGrad":
            name = next((k for k, t in params.items() if t is fn.variable), None)
            g.nodes.append(GraphNode(nid, "leaf", "AccumulateGrad", name, fn.variable, fn))
        else:
            name, t, _ = named.get(id(fn), (None, None, None))
            g.nodes.append(GraphNode(nid, "op", type(fn).__name__, name, t, fn))
        return g.nodes[-1]

    queue, cut, hidden = deque([add(tensor.grad_fn)]), [], 0  # cut: lost an input to truncation
    while queue:
        n = queue.popleft()
        for nxt in (f for f, _ in n.fn.next_functions if f is not None):
            if id(nxt) in ids:
                n.inputs.append(ids[id(nxt)])
            elif len(g.nodes) < max_nodes:
                queue.append(add(nxt))
                n.inputs.append(queue[-1].id)
            else:
                hidden += 1
                cut += [] if n in cut else [n]
    return cut, hidden


def _add_saved(g: Graph) -> None:
    """Add to `g` a "saved" node for each tensor that one of its ops saved for backward, named after
    the entry of ``g.params`` it is."""
    for n in [n for n in g.nodes if n.kind == "op"]:
        for what, t in _saved_tensors(n.fn):
            who = None if t is None else next((k for k, p in g.params.items() if _same(p, t)), None)
            g.nodes.append(GraphNode(len(g.nodes), "saved", what, who, t, saved_for=n.id))


# ---------------------------------------------------------------- the graph as text


def _fmt_shape(t: torch.Tensor | None) -> str:
    if t is None:
        return ""
    s = tuple(t.shape)
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")" if s else tr("(scalar)", "(标量)")


def _fmt_values(t: torch.Tensor | None) -> str | None:
    """Up to 4 values at 4 significant digits; None for a larger tensor."""
    if t is None or t.numel() > 4:
        return None
    vals = [f"{v:.4g}" for v in t.detach().to("cpu", torch.float64).flatten().tolist()]
    return vals[0] if len(vals) == 1 else "[" + ", ".join(vals) + "]"


def _label(n: GraphNode, show_values: bool, grads: Mapping | None = None) -> list[str]:
    """A node's description: joined by spaces in the text, by line breaks in the picture.
    `grads` replaces the ``.grad`` shown (the stepper shows the gradient each node received)."""
    t, shape = n.tensor, _fmt_shape(n.tensor)
    if n.kind == "op":
        parts = [f"#{n.id} {n.op}"] + ([f"-> {n.name} {shape}"] if n.name else [])
    elif n.kind == "leaf":
        parts = [f"{_node_ref(n)} {shape}"]
    elif n.kind == "saved":
        who = f" = {n.name}" if n.name else ""
        saved = tr(f"#{n.id} saved by #{n.saved_for}: {n.op}{who}", f"#{n.id} 由 #{n.saved_for} 保存：{n.op}{who}")
        parts = [saved, shape or tr("(freed)", "(已释放)")]
    elif n.kind == "more":
        return [tr(f"#{n.id} ... {n.hidden:,} more nodes not shown",
                   f"#{n.id} ……另有 {n.hidden:,} 个节点未显示")]
    else:
        parts = [tr(f"#{n.id} {n.name or 'tensor'} {shape}: no grad_fn, autograd recorded nothing",
                    f"#{n.id} {n.name or '张量'} {shape}：没有 grad_fn，autograd 什么也没有记录")]
    if show_values:
        no_grad = t is None or n.kind == "saved" or (t.grad_fn is not None and not t.retains_grad)
        grad = grads.get(n.id) if grads is not None else None if no_grad else _fmt_values(t.grad)
        parts += [f"{k}={v}" for k, v in (("data", _fmt_values(t)), ("grad", grad)) if v]
    return parts


def _graph_text(g: Graph) -> str:
    lines = [tr(f"autograd graph of {g.root_name}: {g.note}", f"{g.root_name} 的计算图：{g.note}")]
    if len(g.nodes) > 1:
        lines[0] += tr(" (backward starts at #0; '<-' lists a node's inputs)",
                       "（反向传播从 #0 开始；“<-” 后面是节点的输入）")
    for n in g.nodes:
        inputs = "  <- " + ", ".join(f"#{i}" for i in n.inputs) if n.inputs else ""
        lines.append(" ".join(_label(n, g.show_values)) + inputs)
    return "\n".join(lines)


def as_text(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = False,
    show_saved: bool = False,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> str:
    """The graph below `tensor` as deterministic text, one numbered line per node."""
    kw = dict(show_values=show_values, show_saved=show_saved, max_nodes=max_nodes)
    return _graph_text(build_graph(tensor, params, **kw))


# ---------------------------------------------------------------- the graph as a picture

_DOT_ID = re.compile(r"(?m)(^\t|-> )(\d+)\b")


def stable_dot(source: str) -> str:
    """DOT source with torchviz's node names (``id()``s, new every run) renamed n0, n1, ..."""
    names: dict[str, str] = {}
    rename = lambda m: m.group(1) + names.setdefault(m.group(2), f"n{len(names)}")  # noqa: E731
    return _DOT_ID.sub(rename, source)


def _ranks(g: Graph) -> list[int]:
    """Each node's layer: the longest path from the output (layer 0) down to it."""
    rank, changed = [0] * len(g.nodes), True
    while changed:  # one pass for most graphs: the nodes are in breadth-first order
        changed = False
        for src, dst, _ in g.edges:
            if rank[src] <= rank[dst]:
                rank[src], changed = rank[dst] + 1, True
    return rank


def _to_dot(g: Graph, labels: Mapping, title: str, hot: Any, sent: Mapping) -> str:
    """torchviz's DOT source for `g` with the course's labels and title, the node `hot`
    highlighted and the gradients it `sent` written on its input edges."""
    import torchviz

    with warnings.catch_warnings():  # torchviz 0.0.3's version check is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        dot = torchviz.make_dot(g.tensor, params=g.params, show_saved=g.show_saved)
    for n in g.nodes:  # torchviz draws a leaf as its tensor feeding its AccumulateGrad node
        if n.fn is not None:
            dot.node(str(id(n.tensor if n.kind == "leaf" else n.fn)), label=labels[n.id])
    rankdir = "LR" if max(_ranks(g)) < 10 else "TB"
    dot.graph_attr.update(rankdir=rankdir, label=title, labelloc="t")
    if hot is not None:
        attrs = dict(fillcolor=_COLORS["highlight"], color=_COLORS["hot"], penwidth="3")
        dot.node(str(id(g.nodes[hot].fn)), **attrs)
    for (src, dst), text in sent.items():  # the gradient flows back, to the input: dir=back
        edge = f"\t{id(g.nodes[src].fn)} -> {id(g.nodes[dst].fn)}"
        attrs = f' [label=" {text} " color="{_COLORS["hot"]}" fontcolor="{_COLORS["hot"]}"'
        attrs += " penwidth=2.2 dir=back]"
        dot.body = [edge + attrs + "\n" if line == edge + "\n" else line for line in dot.body]
    return stable_dot(dot.source)


def _draw_matplotlib(g: Graph, labels: Mapping, title: str, hot: Any, sent: Mapping) -> bytes:
    """The same graph without Graphviz: a column of boxes per layer (a row, if that is too wide)."""
    from matplotlib.figure import Figure

    use_course_font()

    rank = _ranks(g)
    depth = max(rank) + 1
    layers = [[n.id for n in g.nodes if rank[n.id] == r] for r in range(depth)]
    box_w = 0.07 * max(text_width(s) for lab in labels.values() for s in lab.splitlines()) + 0.5  # inches
    box_h = 0.17 * max(lab.count("\n") for lab in labels.values()) + 0.5
    lr, half = depth * box_w <= 16, max(map(len, layers)) / 2 + 0.5  # half: room to go round
    pos = {}
    for r, layer in enumerate(layers):  # the output at the right (or at the bottom)
        for i, u in enumerate(layer):
            q = (len(layer) - 1) / 2 - i
            pos[u] = (depth - 1 - r, q) if lr else (-q, r)
    w, h = (depth * box_w, 2 * half * box_h) if lr else (2 * half * box_w, depth * box_h)
    fig = Figure(figsize=(max(w, 4.5), h + 0.6), dpi=96)
    fig.suptitle(title, y=1 - 0.05 / (h + 0.6), va="top", fontsize=10)
    ax = fig.add_axes((0, 0, 1, h / (h + 0.6)))
    lims = [(-0.5, depth - 0.5), (-half, half)]
    ax.set(xlim=lims[not lr], ylim=lims[lr])
    ax.axis("off")
    boxes, font = {}, dict(ha="center", va="center", fontsize=8)
    for n in g.nodes:
        fill = _COLORS["root" if n.id == 0 and n.kind == "op" else n.kind]
        box = dict(boxstyle="round,pad=0.4", fc=fill, ec=_COLORS["edge"], lw=0.8)
        if n.id == hot:
            box.update(fc=_COLORS["highlight"], ec=_COLORS["hot"], lw=2.5)
        box["ls"] = "--" if n.kind == "more" else "-"
        boxes[n.id] = ax.text(*pos[n.id], labels[n.id], bbox=box, **font)
    fig.draw_without_rendering()  # sizes the boxes, which the arrows are clipped to
    for src, dst, kind in g.edges:
        text = sent.get((src, dst))
        color = _COLORS["hot" if text else "edge"] if kind != "saved" else "#d9822b"
        style = "<|-" if text else "-" if kind == "saved" else "-|>"  # a gradient points back
        span = rank[src] - rank[dst]  # an edge that skips layers bends round them, outwards
        bend = 0 if span == 1 else 1.4 * (box_h / box_w if lr else box_w / box_h) / span
        bend = -bend if pos[src][lr] >= 0 else bend
        arrow = dict(arrowstyle=style, color=color, lw=2.2 if text else 1, ls=_LINES.get(kind, "-"))
        arrow.update(connectionstyle=f"arc3,rad={bend}")
        arrow.update(patchA=boxes[src].get_bbox_patch(), patchB=boxes[dst].get_bbox_patch())
        ax.annotate("", pos[dst], pos[src], arrowprops=arrow, zorder=2)
        if text:
            mid = [(a + b) / 2 for a, b in zip(pos[src], pos[dst], strict=True)]
            ax.text(*mid, text, color=color, bbox=dict(fc="w", ec="none"), **font)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


@dataclass(repr=False)
class GraphDrawing:
    """A drawn graph: Jupyter shows the PNG, with its alternative text; its text form (``repr``) is the
    text listing."""

    graph: Graph
    png: bytes
    engine: str  # "graphviz" or "matplotlib"
    text: str
    dot_source: str | None  # None for a truncated graph: torchviz draws whole graphs only
    alt: str = ""  # what the picture shows, for a reader who cannot see it (graph_alt_text)

    def _repr_png_(self) -> bytes | tuple[bytes, dict[str, str]]:
        return (self.png, {"alt": self.alt}) if self.alt else self.png

    def __repr__(self) -> str:  # the same whichever engine drew the PNG
        return self.text


def _dot_env() -> dict[str, str] | None:
    """In the Chinese edition, ``dot``'s environment with the course's CJK font (the ``mplfonts``
    package's, which fontconfig does not know) added to fontconfig's fonts; else None (inherit)."""
    font = course_font_file() if language() == "zh-CN" else None
    if font is None:
        return None
    base = os.environ.get("FONTCONFIG_FILE", "/etc/fonts/fonts.conf")
    text = (f'<?xml version="1.0"?>\n<fontconfig><include ignore_missing="yes">{html.escape(base)}</include>'
            f"<dir>{html.escape(str(font.parent))}</dir></fontconfig>\n")
    conf = Path(tempfile.gettempdir()) / f"course_fonts_{getattr(os, 'getuid', int)()}.conf"
    if not conf.is_file() or conf.read_text() != text:
        part = conf.with_suffix(f".{os.getpid()}")
        part.write_text(text)
        part.replace(conf)  # atomic: another process never reads half a file
    return {**os.environ, "FONTCONFIG_FILE": str(conf)}


def graph_alt_text(g: Graph, title: str, hot: Any = None) -> str:
    """The alternative text of a drawn graph: its title, its operations from the leaves to the output,
    and the node a step of the backward pass highlights."""
    ops = [n.op for n in g.nodes if n.kind == "op"][::-1]  # from the inputs to the output
    leaves = [n.name or tr("(unnamed)", "（未命名）") for n in g.nodes if n.kind == "leaf"]
    shown = ops if len(ops) <= 12 else [*ops[:5], "…", *ops[-5:]]
    title = " ".join(title.split())
    from_leaves = f"叶子张量 {'、'.join(leaves)} " if leaves else "未显示的叶子张量"
    text = tr(f"{title}. An autograd graph drawn as boxes and arrows: {len(ops)} operation(s) "
              f"({', '.join(shown) or 'none'}) lead from the leaf tensor(s) {', '.join(leaves) or '(none shown)'} "
              f"to {g.root_name}.",
              f"{title}。以方框和箭头画出的计算图：{len(ops)} "
              f"个运算（{'、'.join(shown) or '无'}），"
              f"从{from_leaves}通向 {g.root_name}。")
    if g.truncated:
        text += tr(" The nodes farther from the output are left out.", "离输出较远的节点没有画出。")
    if hot is not None:
        text += tr(f" Highlighted: {_node_ref(g.nodes[hot])}, the node this step runs; the gradients it sends "
                   "are written on its arrows (the text below gives them).",
                   f"高亮的是这一步运行的节点 {_node_ref(g.nodes[hot])}；"
                   "它送出的梯度写在箭头上（下方文字列出）。")
    return text


def _picture(g: Graph, text: str, title: str, grads=None, hot=None, sent=None) -> GraphDrawing:
    """torchviz's graph rendered by Graphviz's ``dot`` where it can, else drawn by matplotlib."""
    alt = graph_alt_text(g, tr(f"{title} ({g.note})", f"{title}（{g.note}）"), hot)
    title, sent = tr(f"{title}\n({g.note})", f"{title}\n（{g.note}）"), sent or {}
    labels = {n.id: "\n".join(_label(n, g.show_values, grads)) for n in g.nodes}
    src = None
    if not g.truncated:
        try:
            src = _to_dot(g, labels, title, hot, sent)
        except RuntimeError:  # it read freed saved tensors, or recursed too deep
            pass
    if src is not None and shutil.which("dot"):
        cmd = [shutil.which("dot"), "-Tpng", "-Gdpi=96"]
        try:
            png = subprocess.run(
                cmd, input=src.encode(), capture_output=True, timeout=60, check=True, env=_dot_env()
            )
            return GraphDrawing(g, png.stdout, "graphviz", text, src, alt)
        except (OSError, subprocess.SubprocessError) as exc:
            why = (getattr(exc, "stderr", None) or str(exc).encode()).decode(errors="replace")
            warnings.warn(
                f"dot failed ({why.strip():.300}); drawing with matplotlib.", stacklevel=3
            )
    return GraphDrawing(g, _draw_matplotlib(g, labels, title, hot, sent), "matplotlib", text, src, alt)


def draw(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = False,
    show_saved: bool = False,
    max_nodes: int = DEFAULT_MAX_NODES,
    title: str | None = None,
) -> GraphDrawing:
    """Draw the graph below `tensor`: names from `params`, small tensors' data and ``.grad``
    (`show_values`), the tensors each op saved (`show_saved`), at most `max_nodes` nodes."""
    kw = dict(show_values=show_values, show_saved=show_saved, max_nodes=max_nodes)
    g = build_graph(tensor, params, **kw)
    title = title or tr(f"autograd graph of {g.root_name}", f"{g.root_name} 的计算图")
    return _picture(g, _graph_text(g), title)


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


def _node_ref(n: GraphNode) -> str:
    if n.kind == "leaf":
        return tr(f"#{n.id} leaf {n.name or '(unnamed)'}", f"#{n.id} 叶子张量 {n.name or '(未命名)'}")
    return f"#{n.id} {n.op}" + (f" ({n.name})" if n.name else "")


def _grad_str(t: torch.Tensor | None) -> str:
    shape = _fmt_shape(t)
    return "None" if t is None else _fmt_values(t) or tr(f"a {shape} tensor", f"形状为 {shape} 的张量")


def format_step(step: Step, graph: Graph, n_steps: int | None = None) -> str:
    """A few lines saying what one step of the backward pass does."""
    i, ref = step.index + 1, _node_ref(graph.nodes[step.node])
    of = tr(f" of {n_steps}", f"（共 {n_steps} 步）") if n_steps else ""
    head = tr(f"step {i}{of}: {ref}", f"第 {i} 步{of}：{ref}")
    name, out, got = graph.nodes[step.node].name, graph.root_name, _grad_str(step.grad_output)
    if step.is_leaf:
        why = tr(f"(AccumulateGrad stores d{out}/d{name or 'leaf'})",
                 f"（AccumulateGrad 存下 d{out}/d{name or 'leaf'}）")
        return f"{head}\n  {name or tr('the leaf', '叶子张量')}.grad += {got}   {why}"
    wrt = name or tr(f"(result of #{step.node})", f"(#{step.node} 的结果)")
    lines = [head, tr(f"  gradient in: d{out}/d{wrt} = {got}", f"  收到的梯度：d{out}/d{wrt} = {got}")]
    for t, gi in step.grad_inputs:
        to, sent = _node_ref(graph.nodes[t]), _grad_str(gi)
        lines.append(tr(f"  sends {sent} to {to}", f"  向 {to} 送出 {sent}"))
    return "\n".join(lines if step.grad_inputs else [*lines, tr("  sends nothing further", "  不再向下传递")])


def _step_picture(g: Graph, steps: Sequence[Step], index: int) -> GraphDrawing:
    """Step `index`: its node highlighted, the gradients it sends written on its input edges,
    and the gradient each node has received so far."""
    if not 0 <= index < len(steps):
        raise IndexError(f"step must be between 0 and {len(steps) - 1}, not {index}.")
    i, n, step = index + 1, len(steps), steps[index]
    title = tr(f"backward pass of {g.root_name}, step {i} of {n}",
               f"{g.root_name} 的反向传播：第 {i} 步（共 {n} 步）")
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
    head = tr(f"{'':6s} {'by hand':>11s} {'autograd':>11s}",
              f"{'':6s} {'手算':>9s} {'autograd':>11s}")  # 手算: 4 columns
    rows = [f"x = {x:g}, w = {w:g}, b = {b:g}", head]
    for k in ("y", "z", "dz/dx", "dz/dw", "dz/db"):
        rows.append(f"{k:6s} {hand[k]:11.4e} {auto[k]:11.4e}")
    return "\n".join(rows)


def sigmoid_example_figure(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """The sigmoid with the point ``(y, z)`` and its tangent, beside the three gradients."""
    plt = pyplot()

    hand, auto = _sigmoid_numbers(x, w, b)
    y, z, slope = hand["y"], hand["z"], hand["dz/dy"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    lo, hi = min(-8.0, y - 2.0), max(8.0, y + 2.0)
    t = torch.linspace(lo, hi, 400, dtype=torch.float64)
    ax.plot(t.numpy(), torch.sigmoid(t).numpy(), color=COLORS["blue"], label="z = sigmoid(y)")
    tangent = tr(f"tangent at y = {y:.2f}, slope sigmoid'(y) = {slope:.3e}",
                 f"y = {y:.2f} 处的切线，斜率 sigmoid'(y) = {slope:.3e}")
    ax.plot([y - 3, y + 3], [z - 3 * slope, z + 3 * slope], "--", color=COLORS["vermilion"], label=tangent)
    ax.plot([y], [z], "o", color=COLORS["vermilion"], zorder=3)
    ax.set(xlim=(lo, hi), ylim=(-0.1, 1.1), xlabel="y = w * x + b", ylabel="z = sigmoid(y)")
    ax.set_title(tr(f"z = sigmoid(w*x + b) at x={x:g}, w={w:g}, b={b:g}",
                    f"x={x:g}, w={w:g}, b={b:g} 时的 z = sigmoid(w*x + b)"))
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
        f"Left: the S-shaped curve z = sigmoid(y), with the point y = {y:.2f}, z = {z:.4f} (x = {x:g}, w = {w:g}, "
        f"b = {b:g}) and its tangent, of slope {slope:.3e}. Right: a bar chart of the three gradients that "
        f"autograd gives: {grads}.",
        f"左图：S 形曲线 z = sigmoid(y)，标出点 y = {y:.2f}，z = {z:.4f}（x = {x:g}，w = "
        f"{w:g}，b = {b:g}）"
        f"及其切线，斜率 {slope:.3e}。右图：autograd 给出的三个梯度的柱状图：{grads}。")


def sigmoid_explorer(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """Sliders for x, w and b; shows z, the three gradients and the tangent."""
    import ipywidgets as widgets

    def slider(name: str, value: float) -> Any:
        kw = dict(step=0.1, continuous_update=False, readout_format=".1f")
        return widgets.FloatSlider(value, min=-10.0, max=10.0, description=name, **kw)

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
