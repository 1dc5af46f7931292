"""Chapter 01 (autograd): gradients that accumulate, a custom backward, a Hessian-vector
product with ``create_graph=True``, finite differences, and the backward pass walked by hand."""

from __future__ import annotations

import torch

from .core import Exercise, Incorrect, as_number, as_tensor, kind, take


def answer_q1():
    # dy/dx = 2x = 6, dz/dx = 4; backward() adds into x.grad: 6 + 4 + 6
    return 16.0


q1 = Exercise(
    name="Q1",
    prompt="Predict the number (a Python number or a one-element tensor) that x.grad holds after the three backward() calls in the cell.",
    model_answer=answer_q1,
    form="value",
    observe=lambda answer, _: as_number(answer, "x.grad"),
    hints=[
        "Work out each derivative at x = 3 first: dy/dx for y = x**2, dz/dx for z = 4*x.",
        "backward() adds into .grad (it accumulates); nothing zeroes it between the calls.",
    ],
    mistakes={
        "6 is dy/dx = 2x from one call. `.grad` is not overwritten: every backward() adds to it.": 6.0,
        "you counted dy/dx once and dz/dx once, but `y.backward()` runs twice (6 + 4 + 6).": 10.0,
        "you counted y's two backward calls (6 + 6) but left out z = 4x, which adds 4.": 12.0,
        "4 is dz/dx from the last graph alone; the earlier calls left 6 + 6 in x.grad already.": 4.0,
        "9 is the value of y = x**2, not a gradient.": 9.0,
    },
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


def _sigmoid(backward):
    return type("MySigmoid", (MySigmoid,), {"backward": staticmethod(lambda ctx, g: backward(ctx.saved_tensors[0], g))})


def _apply(cls, case):
    x, grad_output = case[0].clone().requires_grad_(True), case[1]
    out = cls.apply(x)
    (grad,) = torch.autograd.grad(out, x, grad_output)
    return {"MySigmoid.apply(x)": out.detach(), "the gradient your backward() returns": as_tensor(grad)}


def _cases_q2():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(n, generator=g, dtype=torch.float64) * 3, torch.randn(n, generator=g, dtype=torch.float64))
            for n in (5, 7, 3)]


q2 = Exercise(
    name="Q2",
    prompt="Write MySigmoid.backward: return the gradient of the loss with respect to x (a tensor shaped like x).",
    model_answer=MySigmoid,
    form=torch.autograd.Function,
    cases=_cases_q2,
    observe=_apply,
    describe=lambda c: f"for x = {[round(v, 3) for v in c[0].tolist()]} and grad_output = {[round(v, 3) for v in c[1].tolist()]}",
    hints=[
        "sigmoid'(x) = sigmoid(x) * (1 - sigmoid(x)), and forward() saved sigmoid(x) as `result`.",
        "backward receives grad_output = dLoss/dresult; the chain rule multiplies it by dresult/dx.",
    ],
    mistakes={
        "your backward() ignores grad_output. It must return grad_output times the local derivative (the chain rule); the check uses a grad_output that is not 1.": _sigmoid(lambda r, g: r * (1 - r)),
        "you applied sigmoid to `result`, but `result` already is sigmoid(x): the derivative is result * (1 - result).": _sigmoid(lambda r, g: g * torch.sigmoid(r) * (1 - torch.sigmoid(r))),
        "the sign is flipped: sigmoid'(x) = result * (1 - result), which is positive.": _sigmoid(lambda r, g: g * r * (r - 1)),
    },
)


def hvp(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)  # g keeps its own graph
    (hv,) = torch.autograd.grad((g * v).sum(), x)  # d(g . v)/dx = H v
    return hv


def _f_cubic(t):
    """sum(x**3) + x[0] * x[1]"""
    return (t**3).sum() + t[0] * t[1]


def _f_sin(t):
    """sum(sin(x) * roll(x, 1))"""
    return (t.sin() * t.roll(1)).sum()


def _f_exp(t):
    """sum(exp(x) * x**2)"""
    return (t.exp() * t**2).sum()


def _cases_q3():
    def t(*v):
        return torch.tensor(v, dtype=torch.float64)

    return [(_f_cubic, t(0.5, -1.0, 2.0), t(1.0, 2.0, -0.5)), (_f_sin, t(0.3, -1.2, 2.0, 0.7), t(-1.0, 0.5, 2.0, 1.5)),
            (_f_exp, t(-0.4, 0.9), t(2.0, -3.0))]


def _grad(f, x):
    return torch.autograd.grad(f(x), x, create_graph=True)[0]


q3 = Exercise(
    name="Q3",
    prompt="Write hvp(f, x, v): the Hessian of the scalar f at x, times the vector v, as a tensor shaped like x, without building the Hessian.",
    model_answer=hvp,
    cases=_cases_q3,
    observe=lambda fn, c: as_tensor(fn(c[0], c[1].clone().requires_grad_(True), c[2].clone()), "hvp(f, x, v)"),
    describe=lambda c: f"for f(x) = {c[0].__doc__} at x = {c[1].tolist()}, v = {c[2].tolist()}",
    hints=[
        "First g = dF/dx with torch.autograd.grad(f(x), x, create_graph=True): create_graph makes g part of a graph you can differentiate again.",
        "The derivative of (g * v).sum() with respect to x is H @ v.",
    ],
    mistakes={
        "autograd says the gradient has no graph (\"does not require grad\"). The first torch.autograd.grad call needs create_graph=True so that the gradient is itself differentiable; retain_graph=True only keeps the graph for a second backward.": lambda f, x, v: torch.autograd.grad((torch.autograd.grad(f(x), x, retain_graph=True)[0] * v).sum(), x)[0],
        "that is the gradient (first derivative). Differentiate once more: take the gradient of (g * v).sum() with respect to x.": _grad,
        "you computed H @ [1, 1, ...]: v is missing. Differentiate (g * v).sum(), not g.sum().": lambda f, x, v: torch.autograd.grad(_grad(f, x).sum(), x)[0],
        "g * v multiplies the gradient by v entry by entry; the Hessian-vector product needs one more differentiation: grad((g * v).sum(), x).": lambda f, x, v: _grad(f, x) * v,
    },
)


def numerical_grad(f, x, eps=1e-6):
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        x_plus, x_minus = x.clone(), x.clone()
        x_plus.view(-1)[i] += eps
        x_minus.view(-1)[i] -= eps
        g.view(-1)[i] = (f(x_plus) - f(x_minus)) / (2 * eps)
    return g


def _no_autograd(fn):
    def f(x):
        with torch.no_grad():
            return float(fn(x))

    f.__doc__ = fn.__doc__
    return f


def _cases_q4():
    def t(*v):
        return torch.tensor(v, dtype=torch.float64)

    return [(_no_autograd(_f_cubic), t(0.3, -1.2, 2.0, 0.7)), (_no_autograd(_f_sin), t(1.5, -0.2, 0.9)),
            (_no_autograd(_f_exp), t(0.1, -2.0, 1.1, 0.4, -0.6))]


def _one_sided(f, x, eps=1e-6):
    g, fx = torch.zeros_like(x), f(x)
    for i in range(x.numel()):
        xp = x.clone()
        xp[i] += eps
        g[i] = (f(xp) - fx) / eps
    return g


q4 = Exercise(
    name="Q4",
    prompt="Write numerical_grad(f, x, eps=1e-6): the gradient of the scalar f at the float64 tensor x by central differences, one coordinate at a time, as a float64 tensor shaped like x.",
    model_answer=numerical_grad,
    cases=_cases_q4,
    observe=lambda fn, c: as_tensor(fn(c[0], c[1].clone()), "numerical_grad(f, x)"),
    describe=lambda c: f"for f(x) = {c[0].__doc__} at x = {c[1].tolist()}",
    tol=(1e-7, 1e-9),  # float64, as the task asks
    hints=[
        "Loop over i in range(x.numel()); make two copies of x, add eps to entry i of one and subtract it from the other.",
        "Entry i of the gradient is (f(x_plus) - f(x_minus)) / (2 * eps); x is float64, so eps = 1e-6 is accurate to about 1e-10.",
    ],
    mistakes={
        "close, but not accurate enough: a one-sided difference (f(x+eps) - f(x)) / eps has an error proportional to eps; the central difference (f(x+eps) - f(x-eps)) / (2*eps) is far more accurate.": _one_sided,
        "off by a factor of 2: the central difference (f(x+eps) - f(x-eps)) spans 2 * eps, so divide by 2 * eps.": lambda f, x, eps=1e-6: 2 * numerical_grad(f, x, eps),
        "every entry is the same: you moved all coordinates at once. Perturb one coordinate at a time (x[i] += eps), so entry i measures df/dx_i.": lambda f, x, eps=1e-6: torch.full_like(x, (f(x + eps) - f(x - eps)) / (2 * eps)),
    },
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
    formula = "sigmoid(w*x + b)" + (" * w" if also_times_w else "") + (".sum()" if x.numel() > 1 else "")
    return out, leaves, formula, {"x": x.tolist(), "w": w.tolist(), "b": b.tolist()}


def _cases_q5():
    return [_case_q5([2.0], [3.0], [1.0]), _case_q5([-1.5], [0.5], [0.3]),
            _case_q5([0.5], [-2.0], [1.0], also_times_w=True),
            _case_q5([1.0, -2.0], [0.7, 0.2], [0.1, -0.4], x_grad=False)]


def _graph_state(out, leaves):
    """What a walk left behind: backward() fills the leaves' .grad, autograd.grad frees saved tensors."""
    if any(leaf.grad is not None for leaf in leaves.values()):
        return "filled the leaves' .grad"
    stack = [out.grad_fn]
    while stack:
        node = stack.pop()
        for attr in (a for a in dir(node) if a.startswith("_saved_")):
            try:
                getattr(node, attr)
            except RuntimeError:
                return "freed the graph's saved tensors"
        stack += [nxt for nxt, _ in node.next_functions if nxt is not None and not hasattr(nxt, "variable")]
    return "left the graph and the leaves as they were"


def _observe_q5(fn, case):
    out, leaves, _, _ = case
    grads = fn(out)
    if not isinstance(grads, dict):
        raise Incorrect(f"backward_walk(out) should return a dict {{leaf tensor: gradient}}, but it returns {kind(grads)}.")
    yield "what your function did to the graph", _graph_state(out, leaves)
    for name, leaf in leaves.items():
        if leaf not in grads:
            keys = take(grads.keys(), 3)
            if keys and all(isinstance(k, torch.Tensor) for k in keys):
                raise Incorrect(f"the dict has no entry for the leaf {name}: your walk did not reach it. Follow "
                                "every entry of node.next_functions, down to the AccumulateGrad nodes.")
            raise Incorrect(f"the dict has no entry for the leaf {name}: its keys should be the leaf tensors "
                            "themselves (an AccumulateGrad node's .variable); "
                            + (f"its keys are: {', '.join(kind(k) for k in keys)}." if keys else "it is empty."))
        yield f"the gradient for {name}", as_tensor(grads[leaf], f"the gradient for {name}")


def _leaves(out):
    found, stack = [], [out.grad_fn]
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is not None and hasattr(nxt, "variable"):
                if all(nxt.variable is not leaf for leaf in found):
                    found.append(nxt.variable)
            elif nxt is not None:
                stack.append(nxt)
    return found


def _mistake_backward(out):
    leaves = _leaves(out)
    out.backward()
    return {leaf: leaf.grad for leaf in leaves}


def _autograd_grads(out):
    leaves = _leaves(out)
    return leaves, torch.autograd.grad(out, leaves)


def _walk(out, combine=lambda old, new: old + new, local=None):
    """A walk like backward_walk, with a mistake: how a leaf reached twice combines, or a local step."""
    grads = {}

    def visit(node, grad):
        if node is None:
            return
        if hasattr(node, "variable"):
            grads[node.variable] = combine(grads[node.variable], grad) if node.variable in grads else grad
            return
        sent = local(node, grad) if local else node(grad)
        sent = (sent,) if isinstance(sent, torch.Tensor) else sent
        for (nxt, _), g in zip(node.next_functions, sent, strict=True):
            visit(nxt, g)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def _passes_grad_on(node, grad):
    """Sends each input the incoming gradient unchanged: the local derivatives are forgotten."""
    return tuple(grad if nxt is not None else None for nxt, _ in node.next_functions)


q5 = Exercise(
    name="Q5",
    prompt=("Write backward_walk(out): the gradient of the scalar `out` with respect to each leaf that requires grad, "
            "by walking out.grad_fn and next_functions yourself, without backward() or torch.autograd.grad. "
            "Return a dict whose keys are the leaf tensors (an AccumulateGrad node's .variable) and whose values "
            "are tensors shaped like them."),
    model_answer=backward_walk,
    cases=_cases_q5,
    observe=_observe_q5,
    describe=lambda c: f"for out = {c[2]} at {', '.join(f'{k} = {v}' for k, v in c[3].items())}",
    hints=[
        "Start with visit(out.grad_fn, torch.ones_like(out)). Calling a node, node(grad), runs its backward: it returns "
        "one gradient per entry of node.next_functions (a lone tensor when there is one entry).",
        "next_functions holds (node, index) pairs. Skip a None node (an input that needs no gradient); at an "
        "AccumulateGrad node (it has .variable) add the gradient into your dict: a leaf reached by two paths "
        "gets the sum.",
        "Work under torch.no_grad() so that calling the nodes records nothing.",
    ],
    mistakes={
        "the numbers are right, but your function filled the leaves' .grad: it called backward() (or an "
        "AccumulateGrad node). Walk the nodes yourself and collect the gradients in the dict instead.": _mistake_backward,
        "the numbers are right, but they come from autograd itself (the graph's saved tensors were freed, as "
        "backward() and torch.autograd.grad do): walk the nodes yourself, calling node(grad) at each.":
            lambda out: dict(zip(*_autograd_grads(out), strict=True)),
        "a leaf reached by two paths (here w, in w*x and in the final * w) must get the sum of both gradients; "
        "your dict keeps only the last one. Add, do not overwrite.": lambda out: _walk(out, lambda old, new: new),
        "a leaf reached by two paths must get the sum of both gradients; your dict keeps only the first one.":
            lambda out: _walk(out, lambda old, new: old),
        "each node must multiply the incoming gradient by its local derivative (call node(grad)); passing the "
        "incoming gradient on unchanged forgets the chain rule.": lambda out: _walk(out, local=_passes_grad_on),
    },
)

EXERCISES = [q1, q2, q3, q4, q5]
