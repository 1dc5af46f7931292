"""Chapter 01: accumulated gradients, a custom backward, an HVP, finite differences, a backward walk."""

import functools
from unittest import mock

import torch

from ..i18n import spaced, tr
from .core import Exercise, Incorrect, as_number, as_tensor, kind, take, variant


def answer_q1():
    # dy/dx = 2x = 6, dz/dx = 4; backward() adds into x.grad: 6 + 4 + 6
    return 16.0


q1 = Exercise(
    "Q1",
    answer_q1,
    form="value",
    observe=lambda answer, _: as_number(answer, "x.grad"),
    mistakes=dict(one_call=6, y_once=10, no_z=12, last_graph_only=4, value_not_gradient=9),
)


class MySigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        result = 1 / (1 + torch.exp(-x))
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result * (1 - result)


def _apply(cls, case):
    x, grad_output = case[0].clone().requires_grad_(True), case[1]
    out = cls.apply(x)
    (grad,) = torch.autograd.grad(out, x, grad_output)
    yield "MySigmoid.apply(x)", out.detach()
    yield tr("the gradient your backward() returns", "你的 backward() 返回的梯度"), as_tensor(grad)


def _cases_q2():
    g = torch.Generator().manual_seed(2)
    randn = functools.partial(torch.randn, generator=g, dtype=torch.float64)
    return [(randn(n) * 3, randn(n)) for n in (5, 7, 3)]


q2 = Exercise(
    "Q2",
    MySigmoid,
    form=torch.autograd.Function,
    cases=_cases_q2,
    observe=_apply,
    describe=lambda c: tr(
        f"for x = {[round(v, 3) for v in c[0].tolist()]} and grad_output = {[round(v, 3) for v in c[1].tolist()]}",
        f"当 x = {[round(v, 3) for v in c[0].tolist()]}、grad_output = {[round(v, 3) for v in c[1].tolist()]} 时",
    ),
    mistakes=dict(
        ignores_grad_output=variant(MySigmoid, "grad_output * result", "result"),
        sigmoid_of_result=variant(
            MySigmoid, "result * (1 - result)", "result.sigmoid() * (1 - result.sigmoid())"
        ),
        sign_flipped=variant(MySigmoid, "(1 - result)", "(result - 1)"),
    ),
)


def hvp(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)  # g keeps its own graph
    (hv,) = torch.autograd.grad((g * v).sum(), x)  # d(g . v)/dx = H v
    return hv


def _f(expr, autograd=True):
    """The function f(x) = `expr` of a float64 tensor x; for Q4, without autograd and returning a float."""

    def f(x):
        with torch.set_grad_enabled(autograd and torch.is_grad_enabled()):
            return eval(expr, {"x": x}) if autograd else float(eval(expr, {"x": x}))

    f.__doc__ = expr
    return f


def _t(*v):
    return torch.tensor(v, dtype=torch.float64)


_CUBIC = "(x**3).sum() + x[0] * x[1]"
_SIN = "(x.sin() * x.roll(1)).sum()"
_EXP = "(x.exp() * x**2).sum()"


def _cases_q3():
    return [
        (_f(_CUBIC), _t(0.5, -1.0, 2.0), _t(1.0, 2.0, -0.5)),
        (_f(_SIN), _t(0.3, -1.2, 2.0, 0.7), _t(-1.0, 0.5, 2.0, 1.5)),
        (_f(_EXP), _t(-0.4, 0.9), _t(2.0, -3.0)),
    ]


def _grad(f, x):
    return torch.autograd.grad(f(x), x, create_graph=True)[0]


q3 = Exercise(
    "Q3",
    hvp,
    cases=_cases_q3,
    observe=lambda fn, c: as_tensor(
        fn(c[0], c[1].clone().requires_grad_(True), c[2].clone()), "hvp(f, x, v)"
    ),
    describe=lambda c: tr(
        f"for f(x) = {c[0].__doc__} at x = {c[1].tolist()}, v = {c[2].tolist()}",
        f"对于 f(x) = {c[0].__doc__}，在 x = {c[1].tolist()}、v = {c[2].tolist()} 处",
    ),
    mistakes=dict(
        retain_not_create=variant(hvp, "create_graph=True", "retain_graph=True"),
        first_derivative=_grad,
        v_missing=variant(hvp, "(g * v).sum()", "g.sum()"),
        entrywise_product=lambda f, x, v: _grad(f, x) * v,
    ),
)


def numerical_grad(f, x, eps=1e-6):
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        x_plus, x_minus = x.clone(), x.clone()
        x_plus.view(-1)[i] += eps
        x_minus.view(-1)[i] -= eps
        g.view(-1)[i] = (f(x_plus) - f(x_minus)) / (2 * eps)
    return g


def _cases_q4():
    return [
        (_f(_CUBIC, autograd=False), _t(0.3, -1.2, 2.0, 0.7)),
        (_f(_SIN, autograd=False), _t(1.5, -0.2, 0.9)),
        (_f(_EXP, autograd=False), _t(0.1, -2.0, 1.1, 0.4, -0.6)),
    ]


q4 = Exercise(
    "Q4",
    numerical_grad,
    cases=_cases_q4,
    observe=lambda fn, c: as_tensor(fn(c[0], c[1].clone()), "numerical_grad(f, x)"),
    describe=lambda c: tr(
        f"for f(x) = {c[0].__doc__} at x = {c[1].tolist()}", f"对于 f(x) = {c[0].__doc__}，在 x = {c[1].tolist()} 处"
    ),
    tol=(1e-7, 1e-9),  # float64, as the task asks
    mistakes=dict(
        one_sided=variant(numerical_grad, "f(x_minus)) / (2 * eps)", "f(x)) / eps"),
        one_sided_back=variant(numerical_grad, "f(x_plus) -", "f(x) -", "(2 * eps)", "eps"),
        twice_too_large=lambda f, x, eps=1e-6: 2 * numerical_grad(f, x, eps),
        all_at_once=lambda f, x, e=1e-6: torch.full_like(x, (f(x + e) - f(x - e)) / (2 * e)),
    ),
)


def backward_walk(out):
    grads = {}  # leaf tensor -> d out / d leaf

    def visit(node, grad):
        if node is None:  # an input that needs no gradient
            return
        if hasattr(node, "variable"):  # AccumulateGrad: a leaf. Add: a leaf may be reached twice
            leaf = node.variable
            grads[leaf] = grads[leaf] + grad if leaf in grads else grad
            return
        sent = node(grad)  # the node's own backward: grad times its local derivatives
        if isinstance(sent, torch.Tensor):  # a node with one input returns a tensor, not a tuple
            sent = (sent,)
        for (next_node, _), g in zip(node.next_functions, sent, strict=True):
            visit(next_node, g)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def _case_q5(x, w, b, x_grad=True, also_times_w=False):
    """Build the chapter's graph: out = sigmoid(w * x + b), optionally times w (w used twice)."""
    x = torch.tensor(x, requires_grad=x_grad)
    w, b = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    out = torch.sigmoid(w * x + b)
    if also_times_w:
        out = out * w
    if out.numel() > 1:
        out = out.sum()
    leaves = {"x": x, "w": w, "b": b} if x_grad else {"w": w, "b": b}
    formula = "sigmoid(w*x + b)" + " * w" * also_times_w + ".sum()" * (x.numel() > 1)
    return out, leaves, formula, {"x": x.tolist(), "w": w.tolist(), "b": b.tolist()}


def _cases_q5():
    return [
        _case_q5([2.0], [3.0], [1.0]),
        _case_q5([-1.5], [0.5], [0.3]),
        _case_q5([0.5], [-2.0], [1.0], also_times_w=True),
        _case_q5([1.0, -2.0], [0.7, 0.2], [0.1, -0.4], x_grad=False),
    ]


def _graph_state(out, leaves, calls):
    """What a walk did: call autograd, fill the leaves' .grad, free the saved tensors, or nothing."""
    if calls:
        return calls[0]
    if any(leaf.grad is not None for leaf in leaves.values()):
        return tr("filled the leaves' .grad", "填充了叶子张量的 .grad")
    for node in _nodes(out):
        for attr in (a for a in dir(node) if a.startswith("_saved_")):
            try:
                getattr(node, attr)
            except RuntimeError:
                return tr("freed the graph's saved tensors", "释放了计算图保存的张量")
    return tr("left the graph and the leaves as they were", "没有改动计算图和叶子张量")


def _nodes(out):
    stack = [out.grad_fn]
    while stack:
        yield (node := stack.pop())
        stack += [nxt for nxt, _ in node.next_functions if nxt is not None]


def _observe_q5(fn, case):
    out, leaves, _, _ = case
    with (  # backward() and torch.autograd.grad would do the walk themselves
        mock.patch("torch.autograd.backward", wraps=torch.autograd.backward) as backward,
        mock.patch("torch.autograd.grad", wraps=torch.autograd.grad) as grad,
    ):
        grads = fn(out)
    calls = [tr("called backward()", "调用了 backward()")] * backward.called
    calls += [tr("called torch.autograd.grad", "调用了 torch.autograd.grad")] * grad.called
    if not isinstance(grads, dict):
        raise Incorrect(tr(
            f"backward_walk(out) should return a dict {{leaf tensor: gradient}}, but it returns {kind(grads)}.",
            spaced("backward_walk(out) 应该返回一个 dict {叶子张量: 梯度}，但它返回的是", kind(grads), "。"),
        ))
    yield tr("what your function did to the graph", "你的函数对计算图的影响"), _graph_state(out, leaves, calls)
    for name, leaf in leaves.items():
        if leaf not in grads:
            keys = take(grads.keys(), 3)
            if keys and all(isinstance(k, torch.Tensor) for k in keys):
                why = tr("your walk did not reach it. Follow every entry of node.next_functions, down to the AccumulateGrad nodes.",
                         "你的遍历没有到达它。要沿着 node.next_functions 的每一项，一直走到 AccumulateGrad 节点。")
            else:
                found = tr(f"its keys are: {', '.join(map(kind, keys))}.", f"它的键是：{'、'.join(map(kind, keys))}。")
                found = found if keys else tr("it is empty.", "它是空的。")
                why = tr(f"its keys should be the leaf tensors themselves (an AccumulateGrad node's .variable); {found}",
                         f"它的键应该是叶子张量本身（AccumulateGrad 节点的 .variable）；{found}")
            raise Incorrect(tr(f"the dict has no entry for the leaf {name}: {why}", f"这个 dict 中没有叶子张量 {name} 的条目：{why}"))
        gradient = tr(f"the gradient for {name}", f"{name} 的梯度")
        yield gradient, as_tensor(grads[leaf], gradient)


def _leaves(out):
    found = {id(n.variable): n.variable for n in _nodes(out) if hasattr(n, "variable")}
    return list(found.values())


def _mistake_backward(out):
    leaves = _leaves(out)
    out.backward()
    return {leaf: leaf.grad for leaf in leaves}


def _autograd_grads(out):
    leaves = _leaves(out)
    return leaves, torch.autograd.grad(out, leaves)


q5 = Exercise(
    "Q5",
    backward_walk,
    cases=_cases_q5,
    observe=_observe_q5,
    describe=lambda c: tr(
        f"for out = {c[2]} at {', '.join(f'{k} = {v}' for k, v in c[3].items())}",
        f"对于 out = {c[2]}，在 {'、'.join(f'{k} = {v}' for k, v in c[3].items())} 处",
    ),
    mistakes=dict(
        called_backward=_mistake_backward,
        autograd_grad=lambda out: dict(zip(*_autograd_grads(out), strict=True)),
        overwrites_last=variant(backward_walk, "grads[leaf] + grad if", "grad if"),
        keeps_first=variant(backward_walk, "grads[leaf] + grad if", "grads[leaf] if"),
        no_chain_rule=variant(backward_walk, "node(grad)", "[grad] * len(node.next_functions)"),
    ),
)

EXERCISES = [q1, q2, q3, q4, q5]
