"""Chapter 01: accumulated gradients, a custom backward, an HVP, finite differences, a backward walk as the
engine does it, and a vector-Jacobian product (the deep dive on VJPs)."""

import functools

import torch

from ..i18n import tr
from .ch01_walks import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    _autograd_grads,
    _cases_q5,
    _leaves,
    _mistake_backward,
    _observe_q5,
    _visited,
    per_path_walk,
)
from .core import Exercise, as_number, as_tensor, variant
from .probes import counting_ops


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
        "for x = {value} and grad_output = {value2}", "当 x = {value}、grad_output = {value2} 时",
        value=[round(v, 3) for v in c[0].tolist()], value2=[round(v, 3) for v in c[1].tolist()],
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
_WIDE = "(x**3).sum() + (x.sin() * x.roll(1)).sum()"
_WIDE_N = 64  # the case where the constraint is judged: a 64 x 64 Hessian is 4,096 numbers


def _cases_q3():
    g = torch.Generator().manual_seed(3)
    wide_x, wide_v = (torch.randn(_WIDE_N, generator=g, dtype=torch.float64) for _ in range(2))
    return [
        (_f(_CUBIC), _t(0.5, -1.0, 2.0), _t(1.0, 2.0, -0.5)),
        (_f(_SIN), _t(0.3, -1.2, 2.0, 0.7), _t(-1.0, 0.5, 2.0, 1.5)),
        (_f(_EXP), _t(-0.4, 0.9), _t(2.0, -3.0)),
        (_f(_WIDE), wide_x, wide_v),
    ]


def _grad(f, x):
    return torch.autograd.grad(f(x), x, create_graph=True)[0]


def _observe_product(fn, case, call: str, wide: int, matrix: str):
    """What ``fn(f, x, w)`` returned for a product of a matrix of derivatives with a vector w (Q3: the
    Hessian and v, Q6: u and the Jacobian); for an x of `wide` entries or more, also whether it built
    the whole `matrix` (its name) on the way: an m x n tensor (m: w's entries, n: x's), or a backward pass
    per entry of w."""
    f, x, w = case[0], case[1].clone().requires_grad_(True), case[2].clone()
    with counting_ops() as count:
        out = fn(f, x, w)
    got = as_tensor(out, call)
    m, n = w.numel(), x.numel()
    if n >= wide:
        whole = count.largest >= m * n or count.ops > 10 * m
        yield tr("whether it computed all {m} x {n} entries of the {matrix}",
                 "它是否算出了{matrix}的全部 {m} x {n} 个元素", m=m, n=n, matrix=matrix), whole
    yield "result", got


def _observe_q3(fn, case):  # "without building the Hessian": v has as many entries as x
    return _observe_product(fn, case, "hvp(f, x, v)", _WIDE_N, tr("Hessian", "黑塞矩阵"))


def _describe_product(c, w: str) -> str:
    """A case (f, x, w) of Q3 (`w`: "v") or Q6 ("u") in words: x and w to 4 decimals, or, past 8 entries,
    their sizes."""
    doc, x, vec = c[0].__doc__, [round(v, 4) for v in c[1].tolist()], [round(v, 4) for v in c[2].tolist()]
    if len(x) > 8 and len(vec) == len(x):
        return tr("for f(x) = {doc} at a random x and {w} of {n_x} entries each",
                  "对于 f(x) = {doc}，在各有 {n_x} 个元素的随机 x 和 {w} 处", doc=doc, w=w, n_x=len(x))
    if len(x) > 8:
        return tr("for f(x) = {doc} at a random x of {n_x} entries and {w} of {n_vec}",
                  "对于 f(x) = {doc}，在随机的 x（{n_x} 个元素）和 {w}（{n_vec} 个元素）处",
                  doc=doc, n_x=len(x), w=w, n_vec=len(vec))
    return tr("for f(x) = {doc} at x = {x}, {w} = {vec}", "对于 f(x) = {doc}，在 x = {x}、{w} = {vec} 处",
              doc=doc, x=x, w=w, vec=vec)


q3 = Exercise(
    "Q3",
    hvp,
    cases=_cases_q3,
    observe=_observe_q3,
    describe=lambda c: _describe_product(c, "v"),
    mistakes=dict(
        retain_not_create=variant(hvp, "create_graph=True", "retain_graph=True"),
        first_derivative=_grad,
        v_missing=variant(hvp, "(g * v).sum()", "g.sum()"),
        entrywise_product=lambda f, x, v: _grad(f, x) * v,
        functional_pair=torch.autograd.functional.vhp,
        whole_hessian=lambda f, x, v: torch.autograd.functional.hessian(f, x) @ v,
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


def _observe_q4(fn, case):
    g = as_tensor(fn(case[0], case[1].clone()), "numerical_grad(f, x)")
    yield tr("the dtype of what `numerical_grad` returns", "`numerical_grad` 返回值的 dtype"), str(g.dtype)
    yield "result", g


q4 = Exercise(
    "Q4",
    numerical_grad,
    cases=_cases_q4,
    observe=_observe_q4,
    describe=lambda c: tr(
        "for f(x) = {doc} at x = {values}", "对于 f(x) = {doc}，在 x = {values} 处",
        doc=c[0].__doc__, values=c[1].tolist()
    ),
    tol=(1e-7, 1e-9),  # float64, as the task asks
    mistakes=dict(
        one_sided=variant(numerical_grad, "f(x_minus)) / (2 * eps)", "f(x)) / eps"),
        one_sided_back=variant(numerical_grad, "f(x_plus) -", "f(x) -", "(2 * eps)", "eps"),
        twice_too_large=lambda f, x, eps=1e-6: 2 * numerical_grad(f, x, eps),
        all_at_once=lambda f, x, e=1e-6: torch.full_like(x, (f(x + e) - f(x - e)) / (2 * e)),
        float32=variant(numerical_grad, "torch.zeros_like(x)", "torch.zeros(x.shape)"),
    ),
)


def backward_walk(out):
    # 1. Each node's dependencies: how many edges lead into it (one per use of one of its outputs).
    dependencies, stack = {out.grad_fn: 0}, [out.grad_fn]
    while stack:
        for child, _ in stack.pop().next_functions:
            if child is None:  # an input that needs no gradient
                continue
            if child not in dependencies:
                dependencies[child] = 0
                stack.append(child)
            dependencies[child] += 1

    # 2. One input buffer per node, a slot per gradient it takes (input_nr); run a node once, when its
    #    last gradient has arrived: with every path's contribution summed in its buffer.
    buffers = {out.grad_fn: {0: torch.ones_like(out)}}
    ready, grads = [out.grad_fn], {}
    with torch.no_grad():  # calling the nodes must record nothing
        while ready:  # the engine picks the most recent node first; any ready node gives the same sums
            node = ready.pop()
            buffer = buffers.pop(node)
            if hasattr(node, "variable"):  # AccumulateGrad: the leaf's whole gradient
                grads[node.variable] = buffer[0]
                continue
            # one gradient per output of the forward op (len(node._input_metadata)); where none arrived,
            # None: an undefined gradient, what the engine passes there, which the node reads as zeros
            inputs = [buffer.get(i) for i in range(len(node._input_metadata))]
            sent = node(*inputs)  # the node's own backward: a vector-Jacobian product
            if isinstance(sent, torch.Tensor):  # a node with one input returns a tensor, not a tuple
                sent = (sent,)
            for (child, input_nr), grad in zip(node.next_functions, sent, strict=True):
                if child is None:
                    continue
                slot = buffers.setdefault(child, {})
                if input_nr in slot:
                    slot[input_nr] = slot[input_nr] + grad  # a new tensor: a node may send one to two inputs
                else:
                    slot[input_nr] = grad
                dependencies[child] -= 1
                if dependencies[child] == 0:
                    ready.append(child)
    return grads


q5 = Exercise(
    "Q5",
    backward_walk,
    cases=_cases_q5,
    observe=_observe_q5,
    describe=lambda c: tr(
        "for out = {out}{at}", "对于 out = {out}{at}", out=c[2],
        at=tr(" at {points}", "，在 {points} 处", points=tr(", ", "、").join(f"{k} = {v}" for k, v in c[3].items()))
        if c[3] else "",
    ),
    mistakes=dict(  # in the order they are tried: the first that behaves like the answer gives its reason
        called_backward=_mistake_backward,
        autograd_grad=lambda out: dict(zip(*_autograd_grads(out), strict=True)),
        one_slot=variant(backward_walk, "[buffer.get(i) for i in range(len(node._input_metadata))]", "[buffer[0]]"),
        visited=_visited,
        overwrites_last=variant(backward_walk, "slot[input_nr] + grad  #", "grad  #"),
        keeps_first=variant(backward_walk, "slot[input_nr] + grad  #", "slot[input_nr]  #"),
        no_chain_rule=variant(backward_walk, "sent = node(*inputs)", "sent = [inputs[0]] * len(node.next_functions)"),
        in_place_sum=variant(backward_walk, "slot[input_nr] = slot[input_nr] + grad", "slot[input_nr] += grad"),
        per_path=per_path_walk,
    ),
)

def vjp(f, x, u):
    (g,) = torch.autograd.grad(f(x), x, grad_outputs=u)  # u^T J in one backward pass: no Jacobian
    return g


_ROT = "torch.stack([x[0] * x[1], x[1].sin(), x.sum() ** 2, x[2]])"
_SOFT = "torch.softmax(x, 0) * torch.arange(1.0, 6.0, dtype=x.dtype)"


def _vector_f(expr, matrix=None):
    """The vector function f(x) = `expr` of a float64 tensor x (with A, a fixed matrix, where it is used)."""

    def f(x):
        return eval(expr, {"x": x, "torch": torch, "A": matrix})

    f.__doc__ = expr
    return f


_WIDE_M, _WIDE_K = 48, 64  # the case where the constraint is judged: a 48 x 64 Jacobian is 3,072 numbers
_WIDE_F = "x[:48] * x[16:].cos() + torch.tanh(x).sum()"  # every output depends on every input; no matrix inside


def _cases_q6():
    g = torch.Generator().manual_seed(6)
    r = functools.partial(torch.randn, generator=g, dtype=torch.float64)
    a = r(6, 4)
    return [
        (_vector_f(_ROT), _t(0.5, -1.0, 2.0), _t(1.0, -2.0, 0.5, 3.0)),
        (_vector_f(_SOFT), _t(0.3, -1.2, 2.0, 0.7, 0.0), _t(1.0, 0.0, -1.0, 2.0, 0.5)),
        (_vector_f("torch.tanh(A @ x)", a), r(4), r(6)),
        (_vector_f(_WIDE_F), r(_WIDE_K), r(_WIDE_M)),
    ]


def _observe_q6(fn, case):  # "without building the Jacobian": u has an entry per output
    return _observe_product(fn, case, "vjp(f, x, u)", _WIDE_K, tr("Jacobian", "雅可比矩阵"))


q6 = Exercise(
    "Q6",
    vjp,
    cases=_cases_q6,
    observe=_observe_q6,
    describe=lambda c: _describe_product(c, "u"),
    mistakes=dict(
        no_grad_outputs=variant(vjp, ", grad_outputs=u", ""),
        ones_not_u=variant(vjp, "grad(f(x), x, grad_outputs=u)", "grad(f(x).sum(), x)"),
        jvp_not_vjp=lambda f, x, u: torch.autograd.functional.jvp(f, x, u)[1],
        whole_jacobian=lambda f, x, u: u @ torch.autograd.functional.jacobian(f, x),
    ),
)


EXERCISES = [q1, q2, q3, q4, q5, q6]
