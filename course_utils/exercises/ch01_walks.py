"""Chapter 01's Q5 (a backward walk as the engine does it), how it is checked: its cases, what a walk did
to the graph and to autograd's engine, and the mistaken walks it is compared with (a recursive walk per
path or per node, autograd called instead). The exercise itself, ``q5``, is declared in ``exercises/ch01``,
beside its model answer; used in the Exercises section of notebook 01.
"""

import torch

# autograd's names bound at import, as a learner's module may bind them: no patch of torch.autograd reaches these
from torch.autograd import backward as _bound_backward
from torch.autograd import grad as _bound_grad

from ..i18n import tr
from .core import Incorrect, as_tensor, kind, take
from .probes import counting_ops, engine_runs, graph_nodes


def per_path_walk(out):
    """The recursive walk chapter 01 once gave as its answer: it calls a node once for every path that
    reaches it (2**n calls after n reuses of an intermediate), and one gradient at a time."""
    return _recursive_walk(out)


def _recursive_walk(out, once=False):
    """The graph below `out` walked recursively, one gradient at a time: a node is called for every path
    that reaches it, or (`once`, a `visited` set) only with the first gradient that reaches it."""
    grads, seen = {}, set()

    def visit(node, grad):
        if node is None:
            return
        if hasattr(node, "variable"):
            leaf = node.variable
            grads[leaf] = grads[leaf] + grad if leaf in grads else grad
            return
        if once and node in seen:
            return
        seen.add(node)
        sent = node(grad)
        if isinstance(sent, torch.Tensor):
            sent = (sent,)
        for (next_node, _), g in zip(node.next_functions, sent, strict=True):
            visit(next_node, g)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


_CHAIN = 12  # reuses of an intermediate in the shared-node case: 2**12 paths


def _q5_case(name, build, leaves, per_path=False):
    """A case of Q5: `build(*leaves)` returns the scalar out; `leaves` are {name: (values, requires_grad)}."""
    made = {k: torch.tensor(v, requires_grad=r) for k, (v, r) in leaves.items()}
    out = build(**made)
    grads_of = {k: t for k, t in made.items() if t.requires_grad}
    shown = {k: t.tolist() for k, t in made.items() if t.numel() <= 4}
    return out, grads_of, name, shown, per_path


def _chain(x, w):
    h = x * w
    for _ in range(_CHAIN):
        h = h + h * 0.5  # h is used twice: two paths lead back through every step
    return h.sum()


def _cases_q5():
    g = torch.Generator().manual_seed(5)
    words = torch.randn(5, 2, generator=g).tolist()
    rows = torch.randn(6, 2, generator=g).tolist()
    return [
        _q5_case("sigmoid(w*x + b)", lambda x, w, b: torch.sigmoid(w * x + b),
                 {"x": ([2.0], True), "w": ([3.0], True), "b": ([1.0], True)}),
        _q5_case("sigmoid(w*x + b).sum(), x needing no gradient", lambda x, w, b: torch.sigmoid(w * x + b).sum(),
                 {"x": ([1.0, -2.0], False), "w": ([0.7, 0.2], True), "b": ([0.1, -0.4], True)}),
        _q5_case("sigmoid(w*x + b) * w", lambda x, w, b: torch.sigmoid(w * x + b) * w,
                 {"x": ([0.5], True), "w": ([-2.0], True), "b": ([1.0], True)}),
        _q5_case(f"h = x * w, then h = h + h * 0.5 ({_CHAIN} times), out = h.sum()", _chain,
                 {"x": ([0.3, -0.2], True), "w": ([1.5, 0.5], True)}, per_path=True),
        _q5_case("(x + w).sum() + (x * 3).sum()", lambda x, w: (x + w).sum() + (x * 3).sum(),
                 {"x": ([1.0, 2.0], True), "w": ([0.5, -1.0], True)}),
        _q5_case("v1, v2, v3, v4, v5 = words.unbind(); tanh(v1 * v2).sum() + v3.sum()",
                 lambda words: (lambda v: torch.tanh(v[0] * v[1]).sum() + v[2].sum())(words.unbind()),
                 {"words": (words, True)}),
        _q5_case("p1, p2, p3 = a.split(2); (p1 * p3).sum()",
                 lambda a: (lambda p: (p[0] * p[2]).sum())(a.split(2)), {"a": (rows, True)}),
    ]


def _graph_state(out, leaves, runs):
    """What a walk did: ask autograd's engine, fill the leaves' .grad, free the saved tensors, or nothing."""
    filled = any(leaf.grad is not None for leaf in leaves.values())
    if runs.nodes:
        return tr("called backward()", "调用了 backward()") if filled else tr(
            "asked autograd's engine (torch.autograd.grad)", "调用了 autograd 的引擎（torch.autograd.grad）")
    if filled:
        return tr("filled the leaves' .grad", "填充了叶子张量的 .grad")
    for node in graph_nodes(out):
        for attr in (a for a in dir(node) if a.startswith("_saved_")):
            try:
                getattr(node, attr)
            except RuntimeError:
                return tr("freed the graph's saved tensors", "释放了计算图保存的张量")
    return tr("left the graph and the leaves as they were", "没有改动计算图和叶子张量")


_PER_PATH_OPS = 1000  # a walk per path runs about 2**13 node calls on the shared-node case; the engine 2 * 26


def _observe_q5(fn, case):
    out, leaves, _, _, per_path = case
    with engine_runs(out) as runs, counting_ops() as count:  # the engine: whatever name it is called by
        grads = fn(out)
    if not isinstance(grads, dict):
        raise Incorrect(tr(
            "backward_walk(out) should return a dict {{leaf tensor: gradient}}, but it returns {kind}.",
            "backward_walk(out) 应该返回一个 dict {{叶子张量: 梯度}}，但它返回的是{kind}。", kind=kind(grads),
        ))
    yield tr("what your function did to the graph",
             "你的函数对计算图的影响"), _graph_state(out, leaves, runs)
    if per_path:
        yield tr("how often your walk ran each node", "你的遍历运行每个节点的次数"), (
            tr("once", "一次") if count.ops <= _PER_PATH_OPS else tr("once per path to it", "每条路径一次"))
    for name, leaf in leaves.items():
        if leaf not in grads:
            keys = take(grads.keys(), 3)
            if keys and all(isinstance(k, torch.Tensor) for k in keys):
                why = tr("your walk did not reach it. Follow every entry of node.next_functions, down to the "
                         "AccumulateGrad nodes.",
                         "你的遍历没有到达它。要沿着 node.next_functions 的每一项，一直走到 "
                         "AccumulateGrad 节点。")
            else:
                found = tr("its keys are: {kinds}.", "它的键是：{kinds}。", kinds=tr(", ", "、").join(map(kind, keys)))
                found = found if keys else tr("it is empty.", "它是空的。")
                why = tr("its keys should be the leaf tensors themselves (an AccumulateGrad node's .variable); {found}",
                         "它的键应该是叶子张量本身（AccumulateGrad 节点的 .variable）；{found}", found=found)
            raise Incorrect(tr("the dict has no entry for the leaf {name}: {why}",
                               "这个 dict 中没有叶子张量 {name} 的条目：{why}", name=name, why=why))
        gradient = tr("the gradient for {name}", "{name} 的梯度", name=name)
        yield gradient, as_tensor(grads[leaf], gradient)


def _leaves(out):
    found = {id(n.variable): n.variable for n in graph_nodes(out) if hasattr(n, "variable")}
    return list(found.values())


def _mistake_backward(out):
    leaves = _leaves(out)
    _bound_backward(out)
    return {leaf: leaf.grad for leaf in leaves}


def _autograd_grads(out):
    leaves = _leaves(out)
    return leaves, _bound_grad(out, leaves)


def _visited(out):
    """Enters each node once (a `visited` set), with the first gradient that reaches it."""
    return _recursive_walk(out, once=True)
