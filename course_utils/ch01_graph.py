"""Chapter 01 (autograd), the graph as data and as text: the nodes autograd recorded below a tensor
(``build_graph``) and their numbered listing (``as_text``). Used in section 2 ("What autograd recorded") and
section 3 ("The backward pass, step by step") of notebook 01, through ``course_utils.ch01_autograd``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .i18n import tr

DEFAULT_MAX_NODES = 40


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
        if self.total == 1:
            total = tr("{total:,} node", "{total:,} 个节点", total=self.total)
        else:
            total = tr("{total:,} nodes", "{total:,} 个节点", total=self.total)
        shown = sum(n.kind in ("op", "leaf") for n in self.nodes)
        more = tr("{total}; showing the {shown:,} nearest the output", "{total}，只显示离输出最近的 {shown:,} 个",
                  total=total, shown=shown)
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


def _node_ref(n: GraphNode) -> str:
    if n.kind == "leaf":
        return tr("#{id} leaf {name}", "#{id} 叶子张量 {name}", id=n.id, name=n.name or tr("(unnamed)", "(未命名)"))
    return f"#{n.id} {n.op}" + (f" ({n.name})" if n.name else "")


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
        saved = tr("#{id} saved by #{saved_for}: {op}{who}",
                   "#{id} 由 #{saved_for} 保存：{op}{who}",
                   id=n.id, saved_for=n.saved_for, op=n.op, who=who)
        parts = [saved, shape or tr("(freed)", "(已释放)")]
    elif n.kind == "more":
        return [tr("#{id} ... {hidden:,} more nodes not shown", "#{id} ……另有 {hidden:,} 个节点未显示",
                   id=n.id, hidden=n.hidden)]
    else:
        parts = [tr("#{id} {name} {shape}: no grad_fn, autograd recorded nothing",
                    "#{id} {name} {shape}：没有 grad_fn，autograd 什么也没有记录",
                    id=n.id, name=n.name or tr("tensor", "张量"), shape=shape)]
    if show_values:
        no_grad = t is None or n.kind == "saved" or (t.grad_fn is not None and not t.retains_grad)
        grad = grads.get(n.id) if grads is not None else None if no_grad else _fmt_values(t.grad)
        parts += [f"{k}={v}" for k, v in (("data", _fmt_values(t)), ("grad", grad)) if v]
    return parts


def _graph_text(g: Graph) -> str:
    lines = [tr("autograd graph of {root_name}: {note}", "{root_name} 的计算图：{note}",
                root_name=g.root_name, note=g.note)]
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
