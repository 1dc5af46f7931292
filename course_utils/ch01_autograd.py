"""The autograd graph as a picture, as text, and as a backward pass you can step through.

    from course_utils.ch01_autograd import draw, as_text, backward_steps, stepper_widget

    draw(z, params={"x": x, "w": w, "b": b}, show_values=True)   # PNG + text in Jupyter
    print(as_text(z, params={"x": x, "w": w, "b": b}))           # the same graph, as text
    backward_steps(z, params=...)                                # what backward() runs, in order

The Graphviz picture is torchviz's: :func:`make_dot` is ``torchviz.make_dot`` (its DOT source
needs no system package), and :func:`draw` adds what the course shows on top of it (names,
values, the stepper's highlights) and renders it when Graphviz's ``dot`` program is on the PATH.
Without ``dot`` it draws the same graph with a small layered layout in matplotlib, so it works
on a laptop with no system package. Either way the result shows as a PNG in Jupyter and its
plain-text form is the deterministic :func:`as_text` listing, so a notebook stores the same
kinds of output with or without ``dot``. Huge graphs are drawn truncated (``max_nodes``), by the
matplotlib layout, with a note saying so (torchviz draws whole graphs only).
"""

from __future__ import annotations

import html
import io
import math
import re
import shutil
import subprocess
import sys
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

#: How many nodes a picture shows before it is truncated with a note.
DEFAULT_MAX_NODES = 40
#: Counting stops here, so that measuring a gigantic graph stays quick.
COUNT_LIMIT = 100_000
#: More layers than this and the picture runs top-to-bottom instead of left-to-right.
_LR_MAX_LAYERS = 10

_COLORS = {
    "op": "#e9ecef",
    "root": "#c9f0d1",
    "leaf": "#cfe2ff",
    "saved": "#ffe2b8",
    "more": "#ffffff",
    "tensor": "#f8d7da",
    "highlight": "#fff3a3",
    "edge": "#555555",
    "hot": "#d62728",
    "saved_edge": "#d9822b",
}


# --------------------------------------------------------------------------------------------
# the graph as data
# --------------------------------------------------------------------------------------------


@dataclass
class GraphNode:
    """One box of the picture.

    kind: ``"op"`` (a backward function such as ``MulBackward0``), ``"leaf"`` (a leaf tensor,
    reached through its ``AccumulateGrad`` node), ``"saved"`` (a tensor an op saved for
    backward), ``"more"`` (stands for the nodes a truncated picture leaves out) or ``"tensor"``
    (a tensor with no graph at all).
    """

    id: int
    kind: str
    op: str
    name: str | None = None
    shape: tuple[int, ...] | None = None
    value: str | None = None
    grad: str | None = None
    inputs: list[int] = field(default_factory=list)
    saved_for: int | None = None
    is_root: bool = False
    hidden: int = 0

    def lines(self, show_values: bool = True) -> list[str]:
        """The label of this node's box, one string per line."""
        shape = _fmt_shape(self.shape)
        if self.kind == "op":
            out = [self.op]
            if self.name:
                out.append(f"-> {self.name} {shape}")
        elif self.kind == "leaf":
            out = [f"{self.name or 'leaf'} {shape}"]
        elif self.kind == "saved":
            who = f" = {self.name}" if self.name else ""
            out = [f"saved {self.op}{who}", shape] if self.shape is not None else [f"saved {self.op}", "(freed)"]
        elif self.kind == "more":
            return [f"... {self.hidden:,} more", "nodes not drawn"]
        else:  # a tensor without a graph
            return [f"{self.name or 'tensor'} {shape}", "no grad_fn:", "nothing recorded"]
        if show_values and self.value is not None:
            out.append(f"data {self.value}")
        if show_values and self.grad is not None:
            out.append(f"grad {self.grad}")
        return out


@dataclass
class Graph:
    """The autograd graph reachable from a tensor, in breadth-first order from its ``grad_fn``."""

    nodes: list[GraphNode]
    root_name: str
    total: int
    total_capped: bool = False
    truncated: bool = False
    show_values: bool = False
    _fns: list[Any] = field(default_factory=list, repr=False)  # node id -> autograd Node (or None)
    show_saved: bool = False
    _tensor: torch.Tensor | None = field(default=None, repr=False)  # what torchviz draws from
    _params: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def edges(self) -> list[tuple[int, int, str]]:
        """``(input, consumer, kind)`` triples; kind is ``"data"``, ``"saved"`` or ``"more"``."""
        out = []
        for n in self.nodes:
            for i in n.inputs:
                out.append((i, n.id, "more" if self.nodes[i].kind == "more" else "data"))
            if n.kind == "saved" and n.saved_for is not None:
                out.append((n.id, n.saved_for, "saved"))
        return out

    @property
    def note(self) -> str:
        """A one-line summary: how many nodes there are and how many are shown."""
        counted = sum(1 for n in self.nodes if n.kind in ("op", "leaf", "tensor"))
        total = f"more than {self.total:,}" if self.total_capped else f"{self.total:,}"
        noun = "node" if self.total == 1 and not self.total_capped else "nodes"
        if self.truncated:
            return f"{total} {noun}; showing the {counted:,} nearest the output"
        return f"{total} {noun}"


def _fmt_shape(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return ""
    return "(scalar)" if len(shape) == 0 else "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _fmt_number(v: float) -> str:
    return f"{v:.4g}"


def fmt_values(t: torch.Tensor | None, max_numel: int = 4) -> str | None:
    """Up to `max_numel` values of a tensor, rounded to 4 significant digits; None if larger."""
    if t is None or t.numel() > max_numel:
        return None
    vals = t.detach().to("cpu", torch.float64).flatten().tolist()
    if t.numel() == 1:
        return _fmt_number(vals[0])
    return "[" + ", ".join(_fmt_number(v) for v in vals) + "]"


def _safe_grad(t: torch.Tensor) -> torch.Tensor | None:
    """`t.grad` without the warning PyTorch gives for non-leaf tensors that do not retain it."""
    if t.grad_fn is not None and not t.retains_grad:
        return None
    return t.grad


def _saved_tensors(fn: Any) -> list[tuple[str, torch.Tensor | None]]:
    """The tensors a backward node saved, as ``(name, tensor)``; tensor None once freed."""
    out: list[tuple[str, torch.Tensor | None]] = []
    if hasattr(fn, "saved_tensors") and not type(fn).__name__.endswith("AccumulateGrad"):
        try:  # a custom autograd.Function (ctx.save_for_backward)
            return [(f"tensor {i}", t) for i, t in enumerate(fn.saved_tensors)]
        except RuntimeError:
            return [("tensors", None)]
    for attr in sorted(a for a in dir(fn) if a.startswith("_saved_")):
        try:
            val = getattr(fn, attr)
        except RuntimeError:  # freed by an earlier backward()
            out.append((attr[len("_saved_"):], None))
            continue
        if isinstance(val, torch.Tensor):
            out.append((attr[len("_saved_"):], val))
    return out


def count_nodes(tensor: torch.Tensor, limit: int = COUNT_LIMIT) -> tuple[int, bool]:
    """How many autograd nodes hang below `tensor` (stops at `limit`); ``(count, capped)``."""
    fn = tensor.grad_fn
    if fn is None:
        return 1, False
    seen = {id(fn)}
    keep = [fn]
    stack = [fn]
    while stack:
        cur = stack.pop()
        for nxt, _ in getattr(cur, "next_functions", ()):
            if nxt is None or id(nxt) in seen:
                continue
            if len(seen) >= limit:
                return len(seen), True
            seen.add(id(nxt))
            keep.append(nxt)
            stack.append(nxt)
    return len(seen), False


def build_graph(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = False,
    show_saved: bool = False,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> Graph:
    """Walk ``tensor.grad_fn`` down to the leaves (breadth first) and return a :class:`Graph`.

    `params` names tensors: leaves (``{"w": w}``) and, optionally, intermediate results
    (``{"y": y}``), whose backward node is then labelled with the name. `max_nodes` bounds the
    nodes kept; the rest are summarised by one ``"more"`` node.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"draw/as_text need a torch.Tensor, but got a {type(tensor).__name__}.")
    if max_nodes < 1:
        raise ValueError("max_nodes must be at least 1.")
    params = dict(params or {})
    for k, v in params.items():
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"params[{k!r}] should be a tensor, but it is a {type(v).__name__}.")
    leaf_names = {id(t): k for k, t in params.items() if t.grad_fn is None}
    fn_names: dict[int, tuple[str, torch.Tensor]] = {}
    keep_alive: list[Any] = []
    for k, t in params.items():
        if t.grad_fn is not None:
            keep_alive.append(t.grad_fn)
            fn_names.setdefault(id(t.grad_fn), (k, t))
    root_name = next((k for k, t in params.items() if t is tensor), "output")

    def values(t: torch.Tensor) -> tuple[str | None, str | None]:
        if not show_values:
            return None, None
        return fmt_values(t), fmt_values(_safe_grad(t))

    root_fn = tensor.grad_fn
    if root_fn is None:  # a leaf, or a tensor that autograd did not record
        kind = "leaf" if tensor.requires_grad else "tensor"
        val, grad = values(tensor)
        node = GraphNode(0, kind, "AccumulateGrad" if kind == "leaf" else "", root_name,
                         tuple(tensor.shape), val, grad, is_root=True)
        return Graph([node], root_name, 1, show_values=show_values, _fns=[None], show_saved=show_saved,
                     _tensor=tensor, _params=params)

    total, capped = count_nodes(tensor)
    nodes: list[GraphNode] = []
    fns: list[Any] = []
    ids: dict[int, int] = {}
    truncated_at: list[int] = []  # consumers that lost an input to truncation
    hidden_inputs = 0

    def add(fn: Any) -> int:
        nid = len(nodes)
        ids[id(fn)] = nid
        fns.append(fn)
        op = type(fn).__name__
        if op == "AccumulateGrad":
            var = fn.variable
            val, grad = values(var)
            name = leaf_names.get(id(var)) or (root_name if var is tensor else None)
            nodes.append(GraphNode(nid, "leaf", op, name, tuple(var.shape), val, grad))
        else:
            name, shape, val, grad = None, None, None, None
            if fn is root_fn:
                name, shape = root_name, tuple(tensor.shape)
                val, grad = values(tensor)
            elif id(fn) in fn_names:
                name, t = fn_names[id(fn)]
                shape = tuple(t.shape)
                val, grad = values(t)
            nodes.append(GraphNode(nid, "op", op, name, shape, val, grad, is_root=fn is root_fn))
        return nid

    add(root_fn)
    queue = deque([root_fn])
    while queue:
        fn = queue.popleft()
        me = ids[id(fn)]
        for nxt, _ in getattr(fn, "next_functions", ()):
            if nxt is None:
                continue
            if id(nxt) in ids:
                nodes[me].inputs.append(ids[id(nxt)])
            elif len(nodes) < max_nodes:
                nodes[me].inputs.append(add(nxt))
                queue.append(nxt)
            else:
                hidden_inputs += 1
                if me not in truncated_at:
                    truncated_at.append(me)

    if show_saved:
        for nid in range(len(nodes)):
            if nodes[nid].kind != "op":
                continue
            for sname, t in _saved_tensors(fns[nid]):
                who = None
                if t is not None:
                    who = next((k for k, p in params.items() if p is t), None)
                    if who is None:
                        who = next((k for k, p in params.items()
                                    if p.shape == t.shape and p.dtype == t.dtype and p.numel() > 0
                                    and p.data_ptr() == t.data_ptr() and p.stride() == t.stride()), None)
                val = fmt_values(t) if (show_values and t is not None) else None
                sid = len(nodes)
                nodes.append(GraphNode(sid, "saved", sname, who, tuple(t.shape) if t is not None else None,
                                       val, None, saved_for=nid))
                fns.append(None)

    truncated = bool(truncated_at)
    if truncated:
        shown = sum(1 for n in nodes if n.kind in ("op", "leaf"))
        more = GraphNode(len(nodes), "more", "", hidden=max(total - shown, hidden_inputs))
        nodes.append(more)
        fns.append(None)
        for me in truncated_at:
            nodes[me].inputs.append(more.id)
    return Graph(nodes, root_name, total, capped, truncated, show_values, fns, show_saved, tensor, params)


# --------------------------------------------------------------------------------------------
# the graph as text
# --------------------------------------------------------------------------------------------


def _text_line(n: GraphNode, show_values: bool) -> str:
    shape = _fmt_shape(n.shape)
    vals = ""
    if show_values:
        if n.value is not None:
            vals += f" data={n.value}"
        if n.grad is not None:
            vals += f" grad={n.grad}"
    if n.kind == "op":
        s = f"#{n.id} {n.op}" + (f" -> {n.name} {shape}" if n.name else "") + vals
    elif n.kind == "leaf":
        s = f"#{n.id} leaf {n.name or '(unnamed)'} {shape}{vals}"
    elif n.kind == "saved":
        who = f" = {n.name}" if n.name else ""
        s = f"#{n.id} saved by #{n.saved_for}: {n.op}{who} {shape or '(freed)'}{vals}"
    elif n.kind == "more":
        s = f"#{n.id} ... {n.hidden:,} more nodes not shown"
    else:
        s = f"#{n.id} {n.name or 'tensor'} {shape}: no grad_fn, autograd recorded nothing{vals}"
    if n.inputs:
        s += "  <- " + ", ".join(f"#{i}" for i in n.inputs)
    return s


def _graph_text(g: Graph, show_values: bool | None = None) -> str:
    sv = g.show_values if show_values is None else show_values
    head = f"autograd graph of {g.root_name}: {g.note}"
    if len(g.nodes) > 1:
        head += " (backward starts at #0; '<-' lists a node's inputs)"
    return "\n".join([head] + [_text_line(n, sv) for n in g.nodes])


def as_text(
    tensor: torch.Tensor | Graph,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = False,
    show_saved: bool = False,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> str:
    """The graph below `tensor` as deterministic text, one numbered line per node.

    Node #0 is the output's backward function; each line lists its inputs (``<- #2, #3``), so
    the listing reads like the picture and can be compared or read aloud.
    """
    g = tensor if isinstance(tensor, Graph) else build_graph(
        tensor, params, show_values=show_values, show_saved=show_saved, max_nodes=max_nodes)
    return _graph_text(g)


# --------------------------------------------------------------------------------------------
# the graph as a picture: Graphviz DOT, or a matplotlib layered layout
# --------------------------------------------------------------------------------------------


def has_dot() -> bool:
    """True when Graphviz's ``dot`` program is on the PATH."""
    return shutil.which("dot") is not None


def _layers(g: Graph) -> list[int]:
    """Rank of each node: longest path from the output (0) towards the leaves."""
    n = len(g.nodes)
    feeds: list[list[int]] = [[] for _ in range(n)]  # consumer -> its inputs (and saved tensors)
    indeg = [0] * n
    for src, dst, _ in g.edges:
        feeds[dst].append(src)
        indeg[src] += 1
    rank = [0] * n
    queue = deque(i for i in range(n) if indeg[i] == 0)
    while queue:
        u = queue.popleft()
        for v in feeds[u]:
            rank[v] = max(rank[v], rank[u] + 1)
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    return rank


def _direction(g: Graph) -> str:
    return "LR" if max(_layers(g), default=0) + 1 <= _LR_MAX_LAYERS else "TB"


def _title(g: Graph, title: str | None) -> str:
    t = title or f"autograd graph of {g.root_name}"
    return f"{t}\n({g.note})"


def _fill(n: GraphNode) -> str:
    if n.kind == "op":
        return _COLORS["root"] if n.is_root else _COLORS["op"]
    return _COLORS[n.kind]


def make_dot(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_saved: bool = False,
) -> Any:
    """``torchviz.make_dot(tensor, params, show_saved=...)``: a ``graphviz.Digraph`` of the graph.

    Building it needs no ``dot`` program (``.source`` is the DOT text); rendering it does. This
    wrapper only hides the deprecation warning torchviz 0.0.3 triggers on every call (its
    version check), and lets it walk deep graphs (it recurses once per node).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(Version classes|package) (are|is) deprecated",
                                category=DeprecationWarning)
        import torchviz

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 2 * count_nodes(tensor)[0] + 1000))
        try:
            return torchviz.make_dot(tensor, params=dict(params or {}), show_saved=show_saved)
        finally:
            sys.setrecursionlimit(limit)


_DOT_ID = re.compile(r"(?m)(^\t|-> )(\d+)\b")


def stable_dot(source: str) -> str:
    """DOT source with torchviz's node names, the Python ``id()`` of each object (new on every run),
    renamed ``n0``, ``n1``, ... in order of first appearance: the same graph gives the same text."""
    names: dict[str, str] = {}
    return _DOT_ID.sub(lambda m: m.group(1) + names.setdefault(m.group(2), f"n{len(names)}"), source)


def to_dot(
    graph: Graph,
    *,
    title: str | None = None,
    highlight: int | None = None,
    edge_labels: Mapping[tuple[int, int], str] | None = None,
) -> str:
    """The DOT source that :func:`draw` renders with Graphviz: torchviz's graph of `graph`'s tensor,
    with the course's labels (names, values), a title, the highlighted node and the labelled edges
    of a backward step. Deterministic (:func:`stable_dot`); needs no ``dot`` program.
    """
    if graph._tensor is None or graph.truncated:
        raise ValueError(
            f"torchviz draws whole graphs, and this one has {graph.note.split(';')[0]}: draw it with "
            "engine='matplotlib' (which draws the nodes nearest the output), or raise max_nodes.")
    dot = make_dot(graph._tensor, graph._params, show_saved=graph.show_saved)
    name = {n.id: str(id(fn)) for n, fn in zip(graph.nodes, graph._fns, strict=True) if fn is not None}
    for n, fn in zip(graph.nodes, graph._fns, strict=True):
        if fn is None:
            continue
        label = "\n".join(n.lines(graph.show_values))
        if n.kind == "leaf":  # torchviz draws the leaf tensor, then its AccumulateGrad node
            dot.node(str(id(fn.variable)), label=label)
        elif n.name or graph.show_values:
            dot.node(name[n.id], label=label)
    dot.graph_attr.update(rankdir=_direction(graph), label=_title(graph, title), labelloc="t")
    if highlight is not None and highlight in name:
        dot.node(name[highlight], fillcolor=_COLORS["highlight"], color=_COLORS["hot"], penwidth="3")
    for (src, dst), text in dict(edge_labels or {}).items():  # the gradient flows back: dir=back
        plain = f"\t{name[src]} -> {name[dst]}\n"
        attrs = (f'[label=" {text} " color="{_COLORS["hot"]}" fontcolor="{_COLORS["hot"]}" '
                 f"penwidth=2.2 dir=back]")
        dot.body = [f"\t{name[src]} -> {name[dst]} {attrs}\n" if line == plain else line for line in dot.body]
    return stable_dot(dot.source)


def _render_graphviz(dot_source: str, dot: str | None = None) -> bytes:
    exe = dot or shutil.which("dot")
    if exe is None:
        raise FileNotFoundError("Graphviz's `dot` program is not on the PATH.")
    proc = subprocess.run([exe, "-Tpng", "-Gdpi=96"], input=dot_source.encode(),
                          capture_output=True, timeout=60, check=False)
    if proc.returncode != 0 or not proc.stdout.startswith(b"\x89PNG"):
        raise RuntimeError(f"dot failed: {proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout


def _order_layers(rank: list[int], links: list[tuple[int, int]]) -> list[list[int]]:
    """Items of each layer, ordered to reduce edge crossings (barycenter sweeps).

    `links` join an item to one in the next layer down: ``(a, b)`` with ``rank[a] == rank[b] + 1``.
    """
    nlayers = max(rank) + 1
    layers: list[list[int]] = [[] for _ in range(nlayers)]
    for u, r in enumerate(rank):
        layers[r].append(u)
    down: dict[int, list[int]] = {u: [] for u in range(len(rank))}
    up: dict[int, list[int]] = {u: [] for u in range(len(rank))}
    for a, b in links:
        down[a].append(b)
        up[b].append(a)
    pos = {u: i for layer in layers for i, u in enumerate(layer)}

    def sweep(order: range, neighbours: dict[int, list[int]]) -> None:
        for k in order:
            def key(u: int) -> tuple[float, int]:
                nb = [pos[v] for v in neighbours[u]]
                return (sum(nb) / len(nb) if nb else pos[u], pos[u])
            layers[k].sort(key=key)
            for i, u in enumerate(layers[k]):
                pos[u] = i

    for _ in range(3):
        sweep(range(1, nlayers), down)
        sweep(range(nlayers - 2, -1, -1), up)
    return layers


def _render_matplotlib(
    g: Graph,
    *,
    title: str | None = None,
    highlight: int | None = None,
    edge_labels: Mapping[tuple[int, int], str] | None = None,
    dpi: int = 96,
) -> bytes:
    """A layered drawing of `g` with matplotlib alone (no system package needed).

    Edges that skip layers are routed through invisible waypoints, one per layer they cross,
    so that they go around boxes instead of through them (Sugiyama-style layout).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    edge_labels = dict(edge_labels or {})
    rank = _layers(g)
    lr = _direction(g) == "LR"
    fs = 9.0  # points
    char_w, line_h, pad_w, pad_h = 0.62 * fs / 72, 1.35 * fs / 72, 0.16, 0.10  # inches
    labels = {n.id: n.lines(g.show_values) for n in g.nodes}
    size = {u: (max(len(s) for s in lab) * char_w + pad_w, len(lab) * line_h + pad_h) for u, lab in labels.items()}

    # waypoints: items len(nodes).. stand for an edge crossing a layer
    item_rank = list(rank)
    links: list[tuple[int, int]] = []
    routes: list[tuple[int, int, str, list[int]]] = []
    for src, dst, kind in g.edges:
        chain = []
        for r in range(rank[src] - 1, rank[dst], -1):
            chain.append(len(item_rank))
            item_rank.append(r)
            size[chain[-1]] = (0.05, 0.12) if lr else (0.12, 0.05)
        hops = [src, *chain, dst]
        links += [(hops[i], hops[i + 1]) for i in range(len(hops) - 1) if item_rank[hops[i]] == item_rank[hops[i + 1]] + 1]
        routes.append((src, dst, kind, chain))
    layers = _order_layers(item_rank, links)

    gap_layer, gap_node, margin, title_h = (0.55 if lr else 0.45), (0.22 if lr else 0.18), 0.2, 0.6
    if edge_labels:  # room for the gradient written on the highlighted edges
        longest = max(len(v) for v in edge_labels.values())
        gap_layer = max(gap_layer, longest * 0.62 * 8 / 72 + 0.5) if lr else max(gap_layer, 0.6)
    title_text = _title(g, title)
    title_w = max(len(s) for s in title_text.splitlines()) * 0.6 * 11 / 72 + 0.4

    # centre of every box, in inches; layer 0 (the output) is at the right (LR) or bottom (TB)
    centre: dict[int, tuple[float, float]] = {}
    along = [max((size[u][0] if lr else size[u][1]) for u in layer) for layer in layers]
    across = [sum((size[u][1] if lr else size[u][0]) for u in layer) + gap_node * (len(layer) - 1) for layer in layers]
    span = max(across)
    total_along = sum(along) + gap_layer * (len(layers) - 1)
    offset = 0.0
    for k in range(len(layers) - 1, -1, -1):  # from the leaves' side
        c = offset + along[k] / 2
        t = (span - across[k]) / 2
        for u in layers[k]:
            ext = size[u][1] if lr else size[u][0]
            if lr:
                centre[u] = (margin + c, margin + span - (t + ext / 2))
            else:
                centre[u] = (margin + t + ext / 2, margin + total_along - c)
            t += ext + gap_node
        offset += along[k] + gap_layer
    width = 2 * margin + (total_along if lr else span)
    height = 2 * margin + (span if lr else total_along) + title_h
    width = max(width, 4.0, title_w)
    scale = min(1.0, 16.0 / width, 22.0 / height)

    fig = Figure(figsize=(width * scale, height * scale), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    fig.text(0.5, 1 - (title_h * 0.5) / height, title_text, ha="center", va="center",
             fontsize=11 * scale, family="DejaVu Sans", linespacing=1.3)

    def anchor(u: int, outgoing: bool) -> tuple[float, float]:
        x, y = centre[u]
        w, h = size[u]
        if lr:
            return (x + w / 2, y) if outgoing else (x - w / 2, y)
        return (x, y - h / 2) if outgoing else (x, y + h / 2)

    for src, dst, kind, chain in routes:
        hot = (src, dst) in edge_labels
        points = [anchor(src, True), *(centre[d] for d in chain), anchor(dst, False)]
        color = _COLORS["hot"] if hot else (_COLORS["saved_edge"] if kind == "saved" else _COLORS["edge"])
        style = "--" if kind == "saved" else (":" if kind == "more" else "-")
        lw = (2.2 if hot else 1.0) * scale
        if len(points) > 2:
            xs, ys = zip(*points[:-1], strict=True)
            ax.plot(xs, ys, color=color, lw=lw, linestyle=style, zorder=1, solid_capstyle="round")
        p, q = points[-2], points[-1]
        if hot:  # the gradient flows backwards: the arrow points at the input
            ax.annotate("", xy=points[0], xytext=points[1], zorder=1,
                        arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=0, shrinkB=0,
                                        mutation_scale=10 * scale))
            ax.plot([p[0], q[0]], [p[1], q[1]], color=color, lw=lw, zorder=1)
        else:
            ax.annotate("", xy=q, xytext=p, zorder=1,
                        arrowprops=dict(arrowstyle="-" if kind == "saved" else "-|>", color=color,
                                        lw=lw, linestyle=style, shrinkA=0, shrinkB=0,
                                        mutation_scale=10 * scale))
        if hot:
            p, q = points[0], points[1]
            ax.text((p[0] + q[0]) / 2, (p[1] + q[1]) / 2, edge_labels[(src, dst)], ha="center",
                    va="center", fontsize=8 * scale, color=_COLORS["hot"], zorder=4,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))

    for n in g.nodes:
        x, y = centre[n.id]
        w, h = size[n.id]
        hot = n.id == highlight
        ax.add_patch(FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.06", zorder=2,
            facecolor=_COLORS["highlight"] if hot else _fill(n),
            edgecolor=_COLORS["hot"] if hot else "#555555",
            linewidth=(2.5 if hot else 0.8) * scale, linestyle="--" if n.kind == "more" else "-"))
        ax.text(x, y, "\n".join(labels[n.id]), ha="center", va="center", fontsize=fs * scale,
                family="DejaVu Sans", zorder=3, linespacing=1.2)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def _render(
    graph: Graph,
    engine: str = "auto",
    title: str | None = None,
    highlight: int | None = None,
    edge_labels: Mapping[tuple[int, int], str] | None = None,
) -> tuple[bytes, str, str | None]:
    """``(png, engine used, DOT source or None)``: torchviz + ``dot`` where they can, else matplotlib."""
    if engine not in ("auto", "graphviz", "matplotlib"):
        raise ValueError(f"engine must be 'auto', 'graphviz' or 'matplotlib', not {engine!r}.")
    if engine == "graphviz" and not has_dot():
        raise FileNotFoundError(
            "engine='graphviz' needs Graphviz's `dot` program, which is not on the PATH. "
            "Install Graphviz (e.g. `apt-get install graphviz`, `brew install graphviz`, "
            "`conda install graphviz`) or use engine='auto' to draw with matplotlib instead.")
    src = None
    if engine == "graphviz" or not (graph.truncated or graph._tensor is None):
        try:
            src = to_dot(graph, title=title, highlight=highlight, edge_labels=edge_labels)
        except RuntimeError:  # torchviz reads saved tensors, which an earlier backward() freed
            if engine == "graphviz":
                raise
    if src is not None and engine in ("auto", "graphviz") and has_dot():
        try:
            return _render_graphviz(src), "graphviz", src
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            if engine == "graphviz":
                raise
            warnings.warn(f"Graphviz could not draw the graph ({exc}); drawing with matplotlib instead.",
                          stacklevel=4)
    png = _render_matplotlib(graph, title=title, highlight=highlight, edge_labels=edge_labels)
    return png, "matplotlib", src


def render_png(
    graph: Graph,
    *,
    engine: str = "auto",
    title: str | None = None,
    highlight: int | None = None,
    edge_labels: Mapping[tuple[int, int], str] | None = None,
) -> tuple[bytes, str]:
    """PNG bytes of `graph` and the engine that drew it (``"graphviz"`` or ``"matplotlib"``).

    Graphviz draws torchviz's graph (:func:`to_dot`) when ``dot`` is installed and the graph is
    whole; matplotlib draws the rest, truncated graphs included.
    """
    png, used, _ = _render(graph, engine, title, highlight, edge_labels)
    return png, used


class GraphDrawing:
    """A drawn graph. Jupyter shows the PNG; its text form (``repr``) is the :func:`as_text` listing.

    Attributes: ``png`` (bytes), ``engine`` (which renderer drew it), ``text``, ``graph``,
    ``dot_source`` (torchviz's DOT source as :func:`to_dot` makes it, available even without the
    ``dot`` program; None for a truncated graph, which torchviz cannot draw in part).
    """

    def __init__(self, graph: Graph, png: bytes, engine: str, text: str, dot_source: str | None) -> None:
        self.graph, self.png, self.engine, self.text, self.dot_source = graph, png, engine, text, dot_source

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:  # identical whichever engine drew the PNG
        return self.text

    def save(self, path: Any) -> None:
        """Write the PNG to `path`."""
        with open(path, "wb") as f:
            f.write(self.png)


def draw(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = False,
    show_saved: bool = False,
    max_nodes: int = DEFAULT_MAX_NODES,
    engine: str = "auto",
    title: str | None = None,
    highlight: int | None = None,
) -> GraphDrawing:
    """Draw the autograd graph below `tensor`, from its ``grad_fn`` down to the leaves.

    params: names for tensors, e.g. ``{"x": x, "w": w, "b": b, "y": y}``.
    show_values: print data (and ``.grad`` where there is one) on small tensors' boxes.
    show_saved: add the tensors each op saved for backward (orange, dashed).
    max_nodes: draw at most this many nodes; a note says how many were left out.
    engine: ``"auto"`` (torchviz's graph rendered by Graphviz if ``dot`` is installed, else
        matplotlib; truncated graphs always by matplotlib), ``"graphviz"`` or ``"matplotlib"``.
    highlight: the id (``#n`` in the text form) of a node to highlight.
    """
    g = build_graph(tensor, params, show_values=show_values, show_saved=show_saved, max_nodes=max_nodes)
    png, used, src = _render(g, engine, title, highlight)
    return GraphDrawing(g, png, used, _graph_text(g), src)


# --------------------------------------------------------------------------------------------
# the backward pass, step by step
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One node that the autograd engine ran during ``backward()``.

    node: the node's id in :func:`build_graph`'s numbering (``#n`` in :func:`as_text`).
    grad_output: the gradient that arrived at the node (d output / d this node's result).
    grad_inputs: ``(input node id, gradient sent to it)`` for each input that needs one.
    """

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
    gradient: torch.Tensor | None = None,
    *,
    max_nodes: int = 60,
    graph: Graph | None = None,
) -> list[Step]:
    """Run backward on `tensor` with a hook on every node and return the steps, in the order run.

    The graph is kept (``retain_graph=True``) and every named tensor's ``.grad`` is put back
    afterwards, so calling this changes nothing a learner can see. (The ``.grad`` of an unnamed
    non-leaf tensor that called ``retain_grad()`` does accumulate: name it in `params`.)
    """
    if tensor.grad_fn is None:
        raise ValueError("This tensor has no grad_fn, so backward() has nothing to run: "
                         "it is a leaf, or it was computed from tensors that do not require grad.")
    g = graph or build_graph(tensor, params, max_nodes=max_nodes)
    if g.truncated:
        raise ValueError(f"The stepper walks graphs of up to {max_nodes} nodes, and this one has "
                         f"{g.note.split(';')[0]}. Step through a smaller example, or raise max_nodes.")
    keep: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for fn in g._fns:
        if fn is not None and type(fn).__name__ == "AccumulateGrad":
            keep.append((fn.variable, fn.variable.grad))
    for t in (params or {}).values():
        if t.grad_fn is not None and t.retains_grad:
            keep.append((t, t.grad))
    for t, _ in keep:
        t.grad = None

    record: list[tuple[int, tuple, tuple]] = []
    handles = []
    for nid, fn in enumerate(g._fns):
        if fn is None:
            continue

        def hook(grad_inputs: tuple, grad_outputs: tuple, nid: int = nid) -> None:
            record.append((nid, grad_inputs, grad_outputs))

        handles.append(fn.register_hook(hook))
    try:
        torch.autograd.backward(tensor, gradient, retain_graph=True)
    except RuntimeError as exc:
        if "second time" in str(exc) or "freed" in str(exc):
            raise RuntimeError(
                "This graph was already used by a backward() call without retain_graph=True, so its "
                "saved tensors are gone. Run the forward computation again to build a fresh graph, "
                "then step through that one.") from None
        raise
    finally:
        for h in handles:
            h.remove()
        for t, old in keep:
            t.grad = old

    steps = []
    for i, (nid, gin, gout) in enumerate(record):
        node = g.nodes[nid]
        sent = []
        inputs = iter(node.inputs)
        for (nxt, _), gi in zip(g._fns[nid].next_functions, gin, strict=False) if node.kind == "op" else ():
            if nxt is None:
                continue
            target = next(inputs)
            if gi is not None:
                sent.append((target, gi.detach().clone()))
        go = gout[0].detach().clone() if gout and gout[0] is not None else None
        steps.append(Step(i, nid, node.op, node.name, go, tuple(sent)))
    return steps


def _node_ref(g: Graph, nid: int) -> str:
    n = g.nodes[nid]
    if n.kind == "leaf":
        return f"#{nid} leaf {n.name or '(unnamed)'}"
    return f"#{nid} {n.op}" + (f" ({n.name})" if n.name else "")


def _grad_str(t: torch.Tensor | None) -> str:
    if t is None:
        return "None"
    return fmt_values(t) or f"a {_fmt_shape(tuple(t.shape))} tensor"


def format_step(step: Step, graph: Graph, n_steps: int | None = None) -> str:
    """A few lines saying what one step of the backward pass does."""
    out_name = graph.root_name
    head = f"step {step.index + 1}" + (f" of {n_steps}" if n_steps else "") + f": {_node_ref(graph, step.node)}"
    node = graph.nodes[step.node]
    lines = [head]
    if step.is_leaf:
        lines.append(f"  {node.name or 'the leaf'}.grad += {_grad_str(step.grad_output)}"
                     f"   (AccumulateGrad stores d{out_name}/d{node.name or 'leaf'})")
        return "\n".join(lines)
    wrt = node.name or f"(result of #{step.node})"
    lines.append(f"  gradient in: d{out_name}/d{wrt} = {_grad_str(step.grad_output)}")
    if not step.grad_inputs:
        lines.append("  sends nothing further")
    for target, gi in step.grad_inputs:
        lines.append(f"  sends {_grad_str(gi)} to {_node_ref(graph, target)}")
    return "\n".join(lines)


def _edge_labels(step: Step) -> dict[tuple[int, int], str]:
    return {(target, step.node): _grad_str(gi) for target, gi in step.grad_inputs}


def _graph_at_step(graph: Graph, steps: Sequence[Step], index: int) -> Graph:
    """A copy of `graph` whose nodes show the gradient they have received by step `index`."""
    visited = {s.node: s for s in steps[: index + 1]}
    nodes = []
    for n in graph.nodes:
        n2 = replace(n, inputs=list(n.inputs))
        if n.kind in ("op", "leaf"):
            n2.grad = fmt_values(visited[n.id].grad_output) if n.id in visited else None
        nodes.append(n2)
    return replace(graph, nodes=nodes)


def _render_step(graph: Graph, steps: Sequence[Step], index: int, engine: str = "auto") -> GraphDrawing:
    if not 0 <= index < len(steps):
        raise IndexError(f"step must be between 0 and {len(steps) - 1}, not {index}.")
    step = steps[index]
    if graph.show_values:
        graph = _graph_at_step(graph, steps, index)
    title = f"backward pass of {graph.root_name}, step {index + 1} of {len(steps)}"
    labels = _edge_labels(step)
    png, used, src = _render(graph, engine, title, step.node, labels)
    return GraphDrawing(graph, png, used, format_step(step, graph, len(steps)), src)


def step_view(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    step: int = 0,
    *,
    show_values: bool = True,
    engine: str = "auto",
) -> GraphDrawing:
    """The stepper's view of one step (0-based), without a widget: PNG + text of that step."""
    g = build_graph(tensor, params, show_values=show_values, max_nodes=60)
    steps = backward_steps(tensor, params, graph=g)
    return _render_step(g, steps, step, engine)


def stepper_widget(
    tensor: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_values: bool = True,
    engine: str = "auto",
) -> Any:
    """An ipywidgets slider (and play button) that walks the backward pass node by node."""
    import ipywidgets as widgets

    g = build_graph(tensor, params, show_values=show_values, max_nodes=60)
    steps = backward_steps(tensor, params, graph=g)
    cache: dict[int, GraphDrawing] = {}
    slider = widgets.IntSlider(value=1, min=1, max=len(steps), description="step",
                               continuous_update=False)
    play = widgets.Play(value=1, min=1, max=len(steps), interval=1500, description="play")
    widgets.jslink((play, "value"), (slider, "value"))
    image = widgets.Image(format="png")
    text = widgets.HTML()

    def show(i: int) -> None:
        if i not in cache:
            cache[i] = _render_step(g, steps, i, engine)
        image.value = cache[i].png
        text.value = f"<pre style='line-height:1.3'>{html.escape(cache[i].text)}</pre>"

    slider.observe(lambda change: show(change["new"] - 1), names="value")
    show(0)
    return widgets.VBox([widgets.HBox([play, slider]), image, text])


GRAD_KEYS = ("dz/dx", "dz/dw", "dz/db")


# --------------------------------------------------------------------------------------------
# the source's example: z = sigmoid(w * x + b)
# --------------------------------------------------------------------------------------------


def sigmoid_example(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> dict[str, float]:
    """``y = w*x + b``, ``z = sigmoid(y)`` and the three gradients, computed by autograd."""
    xt, wt, bt = (torch.tensor([float(v)], requires_grad=True) for v in (x, w, b))
    y = wt * xt + bt
    z = torch.sigmoid(y)
    z.backward()
    return {"y": y.item(), "z": z.item(), "dz/dx": xt.grad.item(), "dz/dw": wt.grad.item(),
            "dz/db": bt.grad.item()}


def sigmoid_by_hand(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> dict[str, float]:
    """The same numbers from the chain rule, in float64: ``dz/dw = sigmoid'(y) * x`` and so on."""
    y = w * x + b
    z = 1.0 / (1.0 + math.exp(-y))
    dz_dy = z * (1.0 - z)  # sigmoid'(y) = sigmoid(y) * (1 - sigmoid(y))
    return {"y": y, "z": z, "dz/dy": dz_dy, "dz/dx": dz_dy * w, "dz/dw": dz_dy * x, "dz/db": dz_dy}


def sigmoid_example_text(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> str:
    """A small table: each quantity by hand (float64) and by autograd (float32)."""
    auto, hand = sigmoid_example(x, w, b), sigmoid_by_hand(x, w, b)
    rows = [f"x = {x:g}, w = {w:g}, b = {b:g}", f"{'':6s} {'by hand':>11s} {'autograd':>11s}"]
    for key in ("y", "z", *GRAD_KEYS):
        rows.append(f"{key:6s} {hand[key]:11.4e} {auto[key]:11.4e}")
    return "\n".join(rows)


def sigmoid_example_figure(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """The sigmoid curve with the point ``(y, z)`` and its tangent, beside the three gradients.

    Returns the matplotlib Figure (made with pyplot, so ``plt.show()`` displays it).
    """
    import matplotlib.pyplot as plt

    auto, hand = sigmoid_example(x, w, b), sigmoid_by_hand(x, w, b)
    y, z, slope = hand["y"], hand["z"], hand["dz/dy"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    lo, hi = min(-8.0, y - 2.0), max(8.0, y + 2.0)
    t = torch.linspace(lo, hi, 400, dtype=torch.float64)
    ax.plot(t.numpy(), torch.sigmoid(t).numpy(), color="#1f77b4", label="z = sigmoid(y)")
    tt = torch.linspace(y - 3.0, y + 3.0, 2, dtype=torch.float64)
    ax.plot(tt.numpy(), (z + slope * (tt - y)).numpy(), "--", color="#d62728",
            label=f"tangent at y, slope sigmoid'(y) = {slope:.3e}")
    ax.plot([y], [z], "o", color="#d62728", zorder=3)
    ax.annotate(f"y = {y:.2f}\nz = {z:.4f}", (y, z), textcoords="offset points",
                xytext=(12, -60) if z > 0.5 else (12, 45), fontsize=9,
                arrowprops=dict(arrowstyle="-", color="0.5"))
    ax.set_ylim(-0.1, 1.1)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("y = w * x + b")
    ax.set_ylabel("z = sigmoid(y)")
    ax.set_title(f"z = sigmoid(w*x + b) at x={x:g}, w={w:g}, b={b:g}")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)

    vals = [auto[k] for k in GRAD_KEYS]
    colors = ["#2ca02c" if v >= 0 else "#d62728" for v in vals]
    names = [f"{k}\n{v:.3e}" for k, v in zip(GRAD_KEYS, vals, strict=True)]
    bx.barh(names[::-1], vals[::-1], color=colors[::-1])
    span = max(abs(v) for v in vals) or 1.0
    bx.set_xlim(-1.1 * span if min(vals) < 0 else 0, 1.1 * span if max(vals) > 0 else 0.1 * span)
    bx.axvline(0, color="0.3", lw=0.8)
    bx.set_xlabel("gradient (autograd)")
    bx.set_title("dz/dx = w*s'(y), dz/dw = x*s'(y), dz/db = s'(y)")
    bx.ticklabel_format(axis="x", style="sci", scilimits=(-2, 2))
    fig.tight_layout()
    return fig


def sigmoid_explorer(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """Sliders for x, w and b; shows z, the three gradients and the tangent (ipywidgets)."""
    import ipywidgets as widgets

    from .figures import show_figure

    def slider(name: str, value: float) -> Any:
        return widgets.FloatSlider(value=value, min=-10.0, max=10.0, step=0.1, description=name,
                                   continuous_update=False, readout_format=".1f")

    sx, sw, sb = slider("x", x), slider("w", w), slider("b", b)

    def show(x: float, w: float, b: float) -> None:
        print(sigmoid_example_text(x, w, b))
        show_figure(sigmoid_example_figure(x, w, b))

    out = widgets.interactive_output(show, {"x": sx, "w": sw, "b": sb})
    return widgets.VBox([widgets.HBox([sx, sw, sb]), out])


# --------------------------------------------------------------------------------------------
# what autograd keeps for backward
# --------------------------------------------------------------------------------------------








# --------------------------------------------------------------------------------------------
# the dynamic graph captured as a static one
# --------------------------------------------------------------------------------------------

_CLEANUP = re.compile(r";\s+(?:\w+ = )+None$")


def fx_code(gm: Any) -> str:
    """The Python code of an FX ``GraphModule``, without blank lines and ``x = None`` clean-ups."""
    lines = []
    for line in gm.code.splitlines():
        line = _CLEANUP.sub("", line.rstrip())
        if line.strip():
            lines.append(line)
    return "\n".join(lines)


def fx_ops(gm: Any) -> list[str]:
    """The operations of an FX graph, in order (``'sin'``, ``'mul'``, ...)."""
    ops = []
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            t = node.target
            ops.append(t if isinstance(t, str) else getattr(t, "__name__", str(t)))
    return ops


class GraphPrinter:
    """A ``torch.compile`` backend that prints every FX graph Dynamo captures, then runs it as is.

        printer = GraphPrinter()
        f_compiled = torch.compile(f, backend=printer)
        f_compiled(x)          # prints the captured graph(s)
        printer.graphs         # the GraphModules, one per capture (a graph break makes two)
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self.graphs: list[Any] = []

    def __call__(self, gm: Any, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append(gm)
        if self.verbose:
            print(f"--- captured graph {len(self.graphs)}: {len(fx_ops(gm))} ops ---")
            print(fx_code(gm))
        return gm.forward
