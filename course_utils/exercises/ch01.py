"""Chapter 01 (autograd): gradients that accumulate, a custom backward, a Hessian-vector
product with ``create_graph=True``, and finite differences."""

from __future__ import annotations

import math

import torch

from .core import Exercise, Incorrect, _kind, expect_close, expect_tensor

# --------------------------------------------------------------------------------------------
# Q1: predict x.grad after several backward calls
# --------------------------------------------------------------------------------------------


def _check_q1(answer):
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    reasons = {
        6.0: "6 is dy/dx = 2x from one call. `.grad` is not overwritten: every backward() adds to it.",
        10.0: "you counted dy/dx once and dz/dx once, but `y.backward()` runs twice (6 + 4 + 6).",
        12.0: "you counted y's two backward calls (6 + 6) but left out z = 4x, which adds 4.",
        4.0: "4 is dz/dx from the last graph alone; the earlier calls left 6 + 6 in x.grad already.",
        9.0: "9 is the value of y = x**2, not a gradient.",
    }
    if isinstance(answer, int | float) and not isinstance(answer, bool) and float(answer) in reasons:
        raise Incorrect(f"x.grad is not {answer:g}: {reasons[float(answer)]}")
    expect_close(answer, 16.0, "x.grad", why="Add up dy/dx = 6 (twice) and dz/dx = 4.")


q1 = Exercise(
    name="Q1",
    prompt="Predict the number that x.grad holds after the three backward() calls in the cell.",
    checker=_check_q1,
    hints=[
        "Work out each derivative at x = 3 first: dy/dx for y = x**2, dz/dx for z = 4*x.",
        "backward() adds into .grad (it accumulates); nothing zeroes it between the calls.",
    ],
    solution_code="""\
# dy/dx = 2x = 6, dz/dx = 4. Three backward calls add 6 + 4 + 6 into x.grad.
answer_q1 = 16.0""",
    solve=lambda: 16.0,
    wrong_answers=[
        ("only one backward counted", lambda: 6.0),
        ("y counted once", lambda: 10.0),
        ("the value of y", lambda: 9.0),
        ("z forgotten", lambda: torch.tensor(12.0)),
    ],
)


# --------------------------------------------------------------------------------------------
# Q2: the backward of a custom autograd.Function
# --------------------------------------------------------------------------------------------


def _q2_class(backward):
    class MySigmoid(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            result = 1 / (1 + torch.exp(-x))
            ctx.save_for_backward(result)
            return result

        @staticmethod
        def backward(ctx, grad_output):
            (result,) = ctx.saved_tensors
            return backward(result, grad_output)

    return MySigmoid


def _check_q2(answer):
    if not (isinstance(answer, type) and issubclass(answer, torch.autograd.Function)):
        raise Incorrect("pass the class itself, `q2.check(MySigmoid)`, a subclass of "
                        f"torch.autograd.Function, not {_kind(answer)}.")
    x = torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0], dtype=torch.float64, requires_grad=True)
    out = answer.apply(x)
    s = torch.sigmoid(x.detach())
    expect_tensor(out, s, "MySigmoid.apply(x)", rtol=1e-10, atol=1e-12,
                  why="Only change backward(); forward() was already right.")
    g_out = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0], dtype=torch.float64)
    (got,) = torch.autograd.grad(out, x, g_out)
    if got is None:
        raise Incorrect("backward() returned None: return the gradient with respect to x.")
    want = g_out * s * (1 - s)

    def near(t: torch.Tensor) -> bool:
        return got.shape == t.shape and torch.allclose(got, t, rtol=1e-8, atol=1e-12)

    if near(want):
        if not torch.autograd.gradcheck(answer.apply, (x,)):
            raise Incorrect("torch.autograd.gradcheck does not agree with your backward().")
        return
    if near(s * (1 - s)):
        raise Incorrect("your backward() ignores grad_output. It must return grad_output times the "
                        "local derivative (the chain rule); the check used a grad_output that is not 1.")
    sr = torch.sigmoid(s)
    if near(g_out * sr * (1 - sr)):
        raise Incorrect("you applied sigmoid to `result`, but `result` already is sigmoid(x): "
                        "the derivative is result * (1 - result).")
    if near(-want):
        raise Incorrect("the sign is flipped: sigmoid'(x) = result * (1 - result), which is positive.")
    expect_tensor(got, want, "the gradient your backward() returns",
                  why="It should be grad_output * result * (1 - result).")


q2 = Exercise(
    name="Q2",
    prompt="Write MySigmoid.backward: return the gradient of the loss with respect to x.",
    checker=_check_q2,
    hints=[
        "sigmoid'(x) = sigmoid(x) * (1 - sigmoid(x)), and forward() saved sigmoid(x) as `result`.",
        "backward receives grad_output = dLoss/dresult; the chain rule multiplies it by dresult/dx.",
    ],
    solution_code="""\
class MySigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        result = 1 / (1 + torch.exp(-x))
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result * (1 - result)""",
    solve=lambda: _q2_class(lambda r, g: g * r * (1 - r)),
    wrong_answers=[
        ("grad_output forgotten", lambda: _q2_class(lambda r, g: r * (1 - r))),
        ("sigmoid applied to result again", lambda: _q2_class(lambda r, g: g * torch.sigmoid(r) * (1 - torch.sigmoid(r)))),
        ("sign flipped", lambda: _q2_class(lambda r, g: g * r * (r - 1))),
        ("its output instead of the class",
         lambda: _q2_class(lambda r, g: g * r * (1 - r)).apply(torch.zeros(3))),
    ],
)


# --------------------------------------------------------------------------------------------
# Q3: a Hessian-vector product with create_graph=True
# --------------------------------------------------------------------------------------------


def _q3_cases():
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    v = torch.tensor([1.0, 2.0, -0.5], dtype=torch.float64)
    return [
        (lambda t: (t ** 3).sum() + t[0] * t[1], x, v),
        (lambda t: (t.sin() * t.roll(1)).sum(), x, v),
    ]


def _check_q3(answer):
    if not callable(answer):
        raise Incorrect("pass your function itself: `q3.check(hvp)`.")
    for f, x0, v in _q3_cases():
        x = x0.clone().requires_grad_(True)
        try:
            got = answer(f, x, v.clone())
        except RuntimeError as exc:
            if "does not require grad" in str(exc):
                raise Incorrect(
                    "autograd says the gradient has no graph (\"does not require grad\"). The first "
                    "torch.autograd.grad call needs create_graph=True so that the gradient is itself "
                    "differentiable; retain_graph=True only keeps the graph for a second backward."
                ) from None
            raise
        if got is None or not isinstance(got, torch.Tensor):
            raise Incorrect(f"hvp should return a tensor shaped like x, but it returned {type(got).__name__}.")
        got = got.detach()
        H = torch.autograd.functional.hessian(f, x0)
        want = H @ v
        xg = x0.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(f(xg), xg)
        if got.shape == want.shape and torch.allclose(got, want, rtol=1e-8, atol=1e-10):
            continue
        if got.shape == grad.shape and torch.allclose(got, grad, rtol=1e-8, atol=1e-10):
            raise Incorrect("that is the gradient (first derivative). Differentiate once more: take "
                            "the gradient of (g * v).sum() with respect to x.")
        if got.shape == want.shape and torch.allclose(got, H.sum(1), rtol=1e-8, atol=1e-10):
            raise Incorrect("you computed H @ [1, 1, 1]: v is missing. Differentiate (g * v).sum(), "
                            "not g.sum().")
        if got.shape == want.shape and torch.allclose(got, grad * v, rtol=1e-8, atol=1e-10):
            raise Incorrect("g * v multiplies the gradient by v entry by entry; the Hessian-vector "
                            "product needs one more differentiation: grad((g * v).sum(), x).")
        expect_tensor(got, want, "hvp(f, x, v)", check_dtype=False, rtol=1e-8, atol=1e-10,
                      why="It should equal the Hessian of f at x times v.")


def _hvp_solution(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * v).sum(), x)
    return hv


def _hvp_retain(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, retain_graph=True)
    (hv,) = torch.autograd.grad((g * v).sum(), x)
    return hv


def _hvp_grad(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return g


def _hvp_no_v(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (h1,) = torch.autograd.grad(g.sum(), x)
    return h1


q3 = Exercise(
    name="Q3",
    prompt="Write hvp(f, x, v): the Hessian of the scalar f at x, times the vector v, "
           "without building the Hessian.",
    checker=_check_q3,
    hints=[
        "First g = dF/dx with torch.autograd.grad(f(x), x, create_graph=True): create_graph makes "
        "g part of a graph you can differentiate again.",
        "The derivative of (g * v).sum() with respect to x is H @ v.",
    ],
    solution_code="""\
def hvp(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)   # g keeps its own graph
    (hv,) = torch.autograd.grad((g * v).sum(), x)             # d(g . v)/dx = H v
    return hv""",
    solve=lambda: _hvp_solution,
    wrong_answers=[
        ("retain_graph instead of create_graph", lambda: _hvp_retain),
        ("returns the gradient", lambda: _hvp_grad),
        ("forgets v", lambda: _hvp_no_v),
        ("g * v without a second derivative",
         lambda: lambda f, x, v: torch.autograd.grad(f(x), x)[0] * v),
    ],
)


# --------------------------------------------------------------------------------------------
# Q4: a gradient by finite differences, one coordinate at a time
# --------------------------------------------------------------------------------------------


def _q4_f(x: torch.Tensor) -> float:
    """sum(sin(x) * x**2), computed without autograd (so only finite differences work)."""
    with torch.no_grad():
        return float((x.sin() * x ** 2).sum())


def _check_q4(answer):
    if not callable(answer):
        raise Incorrect("pass your function itself: `q4.check(numerical_grad)`.")
    x = torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=torch.float64)
    got = answer(_q4_f, x.clone())
    if isinstance(got, list | tuple):
        raise Incorrect("return a tensor shaped like x (e.g. fill `torch.zeros_like(x)`), not a list.")
    if not isinstance(got, torch.Tensor):
        raise Incorrect(f"numerical_grad should return a tensor, but it returned {type(got).__name__}.")
    got = got.detach().to(torch.float64)
    want = torch.cos(x) * x ** 2 + 2 * x * torch.sin(x)
    if got.shape != want.shape:
        raise Incorrect(f"the result has shape {tuple(got.shape)}; it should have x's shape {tuple(x.shape)}.")
    if torch.allclose(got, want, rtol=1e-7, atol=1e-9):
        return
    if torch.allclose(got, 2 * want, rtol=1e-4) or torch.allclose(got, want / 2, rtol=1e-4):
        raise Incorrect("off by a factor of 2: the central difference (f(x+eps) - f(x-eps)) spans "
                        "2 * eps, so divide by 2 * eps.")
    if got.numel() > 1 and torch.allclose(got, got[0].expand_as(got)) and math.isclose(
            float(got[0]), float(want.sum()), rel_tol=1e-3):
        raise Incorrect("every entry is the same: you moved all coordinates at once. Perturb one "
                        "coordinate at a time (x[i] += eps), so entry i measures df/dx_i.")
    if torch.allclose(got, want, rtol=1e-3, atol=1e-6):
        err = float((got - want).abs().max())
        raise Incorrect(f"close, but off by up to {err:.1e}. A one-sided difference (f(x+eps) - f(x)) / eps "
                        "has an error proportional to eps; the central difference "
                        "(f(x+eps) - f(x-eps)) / (2*eps) is far more accurate.")
    expect_tensor(got, want, "numerical_grad(f, x)", rtol=1e-7, atol=1e-9,
                  why="Entry i should be (f(x + eps*e_i) - f(x - eps*e_i)) / (2*eps).")


def _numgrad(f, x, eps=1e-6):
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        xp, xm = x.clone(), x.clone()
        xp.view(-1)[i] += eps
        xm.view(-1)[i] -= eps
        g.view(-1)[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def _numgrad_forward(f, x, eps=1e-6):
    g = torch.zeros_like(x)
    fx = f(x)
    for i in range(x.numel()):
        xp = x.clone()
        xp.view(-1)[i] += eps
        g.view(-1)[i] = (f(xp) - fx) / eps
    return g


def _numgrad_no_2(f, x, eps=1e-6):
    return 2 * _numgrad(f, x, eps)


def _numgrad_all_at_once(f, x, eps=1e-6):
    return torch.full_like(x, (f(x + eps) - f(x - eps)) / (2 * eps))


q4 = Exercise(
    name="Q4",
    prompt="Write numerical_grad(f, x, eps=1e-6): the gradient of the scalar f at x by central "
           "differences, one coordinate at a time.",
    checker=_check_q4,
    hints=[
        "Loop over i in range(x.numel()); make two copies of x, add eps to entry i of one and "
        "subtract it from the other.",
        "Entry i of the gradient is (f(x_plus) - f(x_minus)) / (2 * eps); x is float64, so "
        "eps = 1e-6 is accurate to about 1e-10.",
    ],
    solution_code="""\
def numerical_grad(f, x, eps=1e-6):
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        x_plus, x_minus = x.clone(), x.clone()
        x_plus.view(-1)[i] += eps
        x_minus.view(-1)[i] -= eps
        g.view(-1)[i] = (f(x_plus) - f(x_minus)) / (2 * eps)
    return g""",
    solve=lambda: _numgrad,
    wrong_answers=[
        ("one-sided difference", lambda: _numgrad_forward),
        ("divides by eps instead of 2*eps", lambda: _numgrad_no_2),
        ("moves every coordinate at once", lambda: _numgrad_all_at_once),
    ],
)


EXERCISES = [q1, q2, q3, q4]
