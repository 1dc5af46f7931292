"""Chapter 01 (autograd): gradients that accumulate, a custom backward, a Hessian-vector
product with ``create_graph=True``, and finite differences."""

from __future__ import annotations

import torch

from .core import Exercise, as_number, as_tensor


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

EXERCISES = [q1, q2, q3, q4]
