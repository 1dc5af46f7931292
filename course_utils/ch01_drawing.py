"""Chapter 01 (autograd), the graph as a picture: torchviz's graph rendered by Graphviz's ``dot`` when it is on
the PATH, else a small matplotlib drawing of the same nodes, with its alternative text (``draw``,
``stable_dot``, ``graph_alt_text``). Used in section 2 ("The graph as a picture") and sections 3, 4, 6 and
the vector-Jacobian deep dive of notebook 01, through ``course_utils.ch01_autograd``.
"""

from __future__ import annotations

import html
import io
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .ch01_graph import (
    DEFAULT_MAX_NODES,
    Graph,
    _graph_text,
    _label,
    _node_ref,
    build_graph,
)
from .figures import COLORS, course_font_file, use_course_font
from .i18n import language, text_width, tr

_COLORS = dict(op="#e9ecef", root="#c9f0d1", leaf="#cfe2ff", saved="#ffe2b8", more="#ffffff")
_COLORS.update(tensor="#f8d7da", highlight="#fff3a3", hot=COLORS["vermilion"], edge="#555555")
_LINES = {"saved": "--", "more": ":"}  # line styles of the edges that are not data


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
    sep = tr(", ", "、")
    if leaves:
        from_leaves = tr("the leaf tensor(s) {leaves}", "叶子张量 {leaves} ", leaves=sep.join(leaves))
    else:
        from_leaves = tr("the leaf tensor(s) (none shown)", "未显示的叶子张量")
    text = tr("{title}. An autograd graph drawn as boxes and arrows: {n_ops} operation(s) ({ops}) lead from "
              "{from_leaves} to {root}.",
              "{title}。以方框和箭头画出的计算图：{n_ops} 个运算（{ops}），从{from_leaves}通向 {root}。",
              title=title, n_ops=len(ops), ops=sep.join(shown) or tr("none", "无"), from_leaves=from_leaves,
              root=g.root_name)
    if g.truncated:
        text += tr(" The nodes farther from the output are left out.", "离输出较远的节点没有画出。")
    if hot is not None:
        text += tr(" Highlighted: {node_ref}, the node this step runs; the gradients it sends are written on its "
                   "arrows (the text below gives them).",
                   "高亮的是这一步运行的节点 {node_ref}；它送出的梯度写在箭头上（下方文字列出）。",
                   node_ref=_node_ref(g.nodes[hot]))
    return text


def _picture(g: Graph, text: str, title: str, grads=None, hot=None, sent=None) -> GraphDrawing:
    """torchviz's graph rendered by Graphviz's ``dot`` where it can, else drawn by matplotlib."""
    alt = graph_alt_text(g, tr("{title} ({note})", "{title}（{note}）", title=title, note=g.note), hot)
    title, sent = tr("{title}\n({note})", "{title}\n（{note}）", title=title, note=g.note), sent or {}
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
    title = title or tr("autograd graph of {root_name}", "{root_name} 的计算图", root_name=g.root_name)
    return _picture(g, _graph_text(g), title)
