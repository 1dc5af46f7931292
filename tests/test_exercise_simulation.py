"""A simulated class of learners: for every exercise, other correct forms, plausible mistakes that
are not in its declared list, and hostile inputs. A check must call every correct form Correct,
every mistake Incorrect (with a reason), answer the hostile inputs within a few seconds without
calling them Correct, and leave the learner's session (random states, grad mode, default dtype,
thread count, the learner's objects) as it was. Run as a script to print every verdict."""

from __future__ import annotations

import importlib
import itertools
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# autograd's names bound at import, as a learner's module may bind them
from torch.autograd import backward as backward_bound_at_import
from torch.autograd import grad as grad_bound_at_import
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Subset,
    get_worker_info,
)

from course_utils import inventory
from course_utils.data import load_image
from course_utils.exercises.core import MAX_STRETCH
from course_utils.launch import processes

# torch's forward-mode rules (torch.func.jvp, hessian: simulated answers) warn once that torch.jit.script is deprecated
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.* is deprecated:FutureWarning")
_bound_save = torch.save  # a name bound before any check runs (as `from torch import save` is)

LIMIT_S = 5.0  # the exercises' time limit during the simulation (a sleeping answer costs this much)
# On a busy machine a spinning answer's limit stretches (time spent waiting for a CPU is not
# charged), up to core.MAX_STRETCH times: slower than that is "slow", much slower a hang.
SLOW_S = MAX_STRETCH * LIMIT_S + 5
# Hostile answers (sleeping, spinning, ...) meet the same limit mechanism with a shorter limit: any verdict
# but Correct is right for them, so a check that runs out of time is fine, and a sleeping answer costs 0.5 s.
HOSTILE_LIMIT_S = 0.5
HANG_S = float(os.environ.get("SIM_HANG_S", SLOW_S + 10))


def all_exercises():
    """Every chapter's ``EXERCISES`` (the chapters: ``course_utils.inventory``), keyed by module name."""
    return {ch.key: importlib.import_module(ch.exercise_module).EXERCISES for ch in inventory.CHAPTERS}


def _asleep(tid):
    """Whether thread `tid` is asleep (state S or D): it uses no CPU, and ends when it wakes."""
    fields = processes.stat("self", tid)
    return fields is not None and fields[0] in "SD"


# ------------------------------------------------------------------------------ hostile answers


class BadEq:
    """An object that fails whenever it is compared, hashed, tested or printed."""

    def __eq__(self, other):
        raise RuntimeError("__eq__ exploded")

    __ne__ = __lt__ = __gt__ = __eq__

    def __bool__(self):
        raise RuntimeError("__bool__ exploded")

    def __len__(self):
        raise RuntimeError("__len__ exploded")

    def __hash__(self):
        raise RuntimeError("__hash__ exploded")

    def __float__(self):
        raise RuntimeError("__float__ exploded")

    def __index__(self):
        raise RuntimeError("__index__ exploded")


def _sleeper(*args, **kwargs):
    time.sleep(60)


def _spinner(*args, **kwargs):
    while True:
        pass


def _swallower(*args, **kwargs):
    while True:
        try:
            time.sleep(0.05)
        except BaseException:  # noqa: BLE001 - swallows the time limit, as a bare `except:` would
            pass


def _exits(*args, **kwargs):
    raise SystemExit(3)


class _SlowModule(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        time.sleep(60)


class _SlowFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(60)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _EndlessDataset(IterableDataset):
    def __init__(self, n=0):
        self.n = n

    def __iter__(self):
        return itertools.count()


HOSTILE = {
    "itertools.count()": lambda: itertools.count(),
    "an endless generator": lambda: (i for i in itertools.count()),
    "a sleeping function": lambda: _sleeper,
    "a spinning function": lambda: _spinner,
    "a function whose loop swallows every exception": lambda: _swallower,
    "a function calling sys.exit": lambda: _exits,
    "a function returning an endless iterator": lambda: lambda *a, **k: itertools.count(),
    "a huge tensor": lambda: torch.zeros(1).expand(10**9),
    "a function returning a huge tensor": lambda: lambda *a, **k: torch.zeros(1).expand(10**9),
    "an object whose __eq__ and __bool__ raise": lambda: BadEq(),
    "a function returning such an object": lambda: lambda *a, **k: BadEq(),
    "a class whose constructor sleeps": lambda: _SlowModule,
    "an autograd.Function that sleeps": lambda: _SlowFunction,
    "an IterableDataset that never ends": lambda: _EndlessDataset,
    "a string": lambda: "16",
}

# ------------------------------------------------------------------------------ ch00


_SQ = [i * i for i in range(1, 11)]
CH00_Q1 = {
    "right": {
        "a tensor from a list": lambda: torch.tensor(_SQ),
        "arange then pow, as int32": lambda: torch.arange(1, 11).pow(2).int(),
        "a slice of a longer tensor": lambda: (torch.arange(12) ** 2)[1:11],
        "a product of two aranges": lambda: torch.arange(1, 11) * torch.arange(1, 11),
        "a non-contiguous column": lambda: torch.stack([torch.arange(1, 11) ** 2] * 2, 1)[:, 0],
        "int16": lambda: torch.arange(1, 11, dtype=torch.int16) ** 2,
    },
    "wrong": {
        "1 to 9 only": lambda: torch.arange(1, 10) ** 2,
        "doubles instead of squares": lambda: torch.arange(1, 11) * 2,
        "cubes": lambda: torch.arange(1, 11) ** 3,
        "not squared": lambda: torch.arange(1, 11),
        "reversed": lambda: (torch.arange(1, 11) ** 2).flip(0),
        "a column (10, 1)": lambda: (torch.arange(1, 11) ** 2).reshape(10, 1),
        "a numpy array": lambda: np.arange(1, 11) ** 2,
        "a bool tensor (a comparison)": lambda: torch.arange(1, 11) ** 2 > 0,
    },
}

# ------------------------------------------------------------------------------ ch01

CH01_Q1 = {
    "right": {
        "int": lambda: 16,
        "float": lambda: 16.0,
        "0-d tensor": lambda: torch.tensor(16.0),
        "numpy float32": lambda: np.float32(16),
        "numpy int64": lambda: np.int64(16),
        "one-element tensor": lambda: torch.tensor([16.0]),
        "int tensor": lambda: torch.tensor(16),
    },
    "wrong": {
        "15": lambda: 15,
        "three times dy/dx": lambda: 18.0,
        "8": lambda: 8,
        "32": lambda: 32.0,
        "16.5": lambda: 16.5,
        "True": lambda: True,
        "a list": lambda: [16],
    },
}


def _sigmoid_cls(backward, forward=None):
    class MySigmoid(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            result = forward(x) if forward else 1 / (1 + torch.exp(-x))
            ctx.save_for_backward(result)
            return result

        @staticmethod
        def backward(ctx, grad_output):
            (result,) = ctx.saved_tensors
            return backward(result, grad_output)

    return MySigmoid


CH01_Q2 = {
    "right": {
        "r - r**2": lambda: _sigmoid_cls(lambda r, g: g * (r - r**2)),
        "a one-element tuple": lambda: _sigmoid_cls(lambda r, g: (g * r * (1 - r),)),
        "mul chain": lambda: _sigmoid_cls(lambda r, g: r.mul(1 - r).mul(g)),
        "computed in float32": lambda: _sigmoid_cls(lambda r, g: (g.float() * r.float() * (1 - r.float()))),
        "forward with torch.sigmoid": lambda: _sigmoid_cls(lambda r, g: g * r * (1 - r), torch.sigmoid),
        "via exp": lambda: _sigmoid_cls(lambda r, g: g * torch.exp(torch.log(r) + torch.log1p(-r))),
    },
    "wrong": {
        "forgot (1 - result)": lambda: _sigmoid_cls(lambda r, g: g * r),
        "forgot result": lambda: _sigmoid_cls(lambda r, g: g * (1 - r)),
        "returns grad_output": lambda: _sigmoid_cls(lambda r, g: g),
        "r * (1 + r)": lambda: _sigmoid_cls(lambda r, g: g * r * (1 + r)),
        "summed to a scalar": lambda: _sigmoid_cls(lambda r, g: (g * r * (1 - r)).sum()),
        "hard-coded for the old check's input": lambda: _sigmoid_cls(
            lambda r, g: torch.tensor([0.104994, -0.470007, 0.125, 0.589835, 0.045177], dtype=g.dtype)
        ),
    },
}


def _hv(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return g, torch.autograd.grad((g * v).sum(), x)[0]


def _hessian_rows(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return torch.stack([torch.autograd.grad(gi, x, retain_graph=True)[0] @ v for gi in g])


def _hvp_backward(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (g * v).sum().backward()
    return x.grad


CH01_Q3 = {
    "right": {
        "grad_outputs=v": lambda: lambda f, x, v: torch.autograd.grad(
            torch.autograd.grad(f(x), x, create_graph=True)[0], x, grad_outputs=v
        )[0],
        "a dot product": lambda: lambda f, x, v: torch.autograd.grad(
            torch.dot(torch.autograd.grad(f(x), x, create_graph=True)[0], v), x
        )[0],
        "torch.autograd.functional.hvp": lambda: lambda f, x, v: torch.autograd.functional.hvp(f, x, v)[1],
        "torch.autograd.functional.vhp": lambda: lambda f, x, v: torch.autograd.functional.vhp(f, x, v)[1],
        "backward into x.grad": lambda: _hvp_backward,
        "g @ v": lambda: lambda f, x, v: torch.autograd.grad(
            torch.autograd.grad(f(x), x, create_graph=True)[0] @ v, x
        )[0],
        "torch.func: forward over reverse": lambda: lambda f, x, v: torch.func.jvp(torch.func.grad(f), (x,), (v,))[1],
        "torch.func: reverse over reverse": lambda: lambda f, x, v: torch.func.vjp(torch.func.grad(f), x)[1](v)[0],
    },
    "wrong": {
        "hard-coded for the old check's input": lambda: lambda f, x, v: torch.tensor(
            [4.0, 12.25, -6.0], dtype=torch.float64
        ),
        "the Hessian from torch.func, then @ v": lambda: lambda f, x, v: torch.func.hessian(f)(x) @ v,
        "the Hessian row by row, each row @ v": lambda: _hessian_rows,
        "the Hessian, vectorised, then @ v": lambda: lambda f, x, v: torch.autograd.functional.hessian(
            f, x, vectorize=True) @ v,
        "returns (g * v).sum()": lambda: lambda f, x, v: (_hv(f, x, v)[0] * v).sum().detach(),
        "hv * v": lambda: lambda f, x, v: _hv(f, x, v)[1] * v,
        "half of it": lambda: lambda f, x, v: _hv(f, x, v)[1] / 2,
        "sign flipped": lambda: lambda f, x, v: -_hv(f, x, v)[1],
    },
}


def _central(f, x, i, eps):
    xp, xm = x.clone(), x.clone()
    xp[i] += eps
    xm[i] -= eps
    return f(xp), f(xm)


def _num_eye(f, x, eps=1e-6):
    eye = torch.eye(x.numel(), dtype=x.dtype)
    return torch.stack([torch.as_tensor((f(x + eps * e) - f(x - eps * e)) / (2 * eps), dtype=x.dtype) for e in eye])


def _num_list(f, x, eps=1e-6):
    vals = []
    for i in range(len(x)):
        fp, fm = _central(f, x, i, eps)
        vals.append((fp - fm) / (2 * eps))
    return torch.tensor(vals, dtype=x.dtype)


def _num_inplace(f, x, eps=1e-6):
    g = torch.empty_like(x)
    for i in range(len(x)):
        old = x[i].item()
        x[i] = old + eps
        fp = f(x)
        x[i] = old - eps
        fm = f(x)
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


def _num_five_point(f, x, eps=1e-3):
    g = torch.zeros_like(x)
    for i in range(len(x)):
        def at(k, i=i):
            y = x.clone()
            y[i] += k * eps
            return f(y)

        g[i] = (-at(2) + 8 * at(1) - 8 * at(-1) + at(-2)) / (12 * eps)
    return g


def _num_eps(eps_used, kind="central", only_first=False):
    def numerical_grad(f, x, eps=1e-6):
        g = torch.zeros_like(x)
        for i in range(1 if only_first else len(x)):
            fp, fm = _central(f, x, i, eps_used)
            if kind == "backward":
                g[i] = (f(x) - fm) / eps_used
            elif kind == "swapped":
                g[i] = (fm - fp) / (2 * eps_used)
            else:
                g[i] = (fp - fm) / (2 * eps_used)
        return g

    return numerical_grad


def _num_into(dtype):
    def numerical_grad(f, x, eps=1e-6):
        g = torch.empty(x.shape, dtype=dtype)
        for i in range(x.numel()):
            fp, fm = _central(f, x, i, eps)
            g[i] = (fp - fm) / (2 * eps)
        return g

    return numerical_grad


CH01_Q4 = {
    "right": {
        "rows of the identity": lambda: _num_eye,
        "a list of floats turned into a tensor": lambda: _num_list,
        "in place, restored": lambda: _num_inplace,
        "a five-point stencil": lambda: _num_five_point,
        "eps = 1e-5": lambda: _num_eps(1e-5),
    },
    "wrong": {
        "hard-coded for the old check's input": lambda: lambda f, x, eps=1e-6: torch.tensor(
            [0.3075, -0.4184, 1.9726, 1.3286], dtype=torch.float64
        ),
        "a backward difference": lambda: _num_eps(1e-6, "backward"),
        "eps far too large": lambda: _num_eps(1e-2),
        "only the first coordinate": lambda: _num_eps(1e-6, only_first=True),
        "sign swapped": lambda: _num_eps(1e-6, "swapped"),
        "a float32 result (torch.tensor of a list of floats)": lambda: lambda f, x, eps=1e-6: torch.tensor(
            [(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in torch.eye(x.numel(), dtype=x.dtype)]),
        "a float32 result (torch.empty(x.shape))": lambda: _num_into(torch.float32),
    },
}


# ------------------------------------------------------------------------------ ch02


def _net(layers, forward):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            layers(self)

        def forward(self, x):
            return forward(self, x)

    return Net


def _three_attr(m, sizes=(784, 64, 64, 10)):
    m.fc1, m.fc2, m.fc3 = (nn.Linear(a, b) for a, b in itertools.pairwise(sizes))


CH02_Q1 = {
    "right": {
        "nn.Sequential": lambda: _net(
            lambda m: setattr(m, "body", nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(),
                                                       nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))),
            lambda m, x: m.body(x),
        ),
        "three attributes and F.relu": lambda: _net(
            _three_attr, lambda m, x: m.fc3(F.relu(m.fc2(F.relu(m.fc1(x.flatten(1))))))
        ),
        "an OrderedDict Sequential": lambda: _net(
            lambda m: setattr(m, "body", nn.Sequential(OrderedDict(
                a=nn.Linear(784, 64), r=nn.ReLU(), b=nn.Linear(64, 64), r2=nn.ReLU(), c=nn.Linear(64, 10)))),
            lambda m, x: m.body(x.flatten(1)),
        ),
        "nn.ModuleDict": lambda: _net(
            lambda m: setattr(m, "d", nn.ModuleDict({"a": nn.Linear(784, 64), "b": nn.Linear(64, 64),
                                                     "c": nn.Linear(64, 10)})),
            lambda m, x: m.d["c"](torch.relu(m.d["b"](torch.relu(m.d["a"](x.reshape(len(x), -1)))))),
        ),
        "its own initialisation (kaiming_uniform_ on the hidden layers)": lambda: _net(
            lambda m: (_three_attr(m), [nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
                                        for layer in (m.fc1, m.fc2)]),
            lambda m, x: m.fc3(torch.relu(m.fc2(torch.relu(m.fc1(x.flatten(1)))))),
        ),
        "the output layer declared first": lambda: _net(
            lambda m: [setattr(m, k, nn.Linear(a, b))
                       for k, a, b in (("out", 64, 10), ("h1", 784, 64), ("h2", 64, 64))],
            lambda m, x: m.out(torch.relu(m.h2(torch.relu(m.h1(x.flatten(1)))))),
        ),
        "the hidden layers declared in reverse": lambda: _net(
            lambda m: [setattr(m, k, nn.Linear(a, b))
                       for k, a, b in (("fc2", 64, 64), ("fc1", 784, 64), ("fc3", 64, 10))],
            lambda m, x: m.fc3(torch.relu(m.fc2(torch.relu(m.fc1(x.flatten(1)))))),
        ),
        "add_module in a loop": lambda: _net(
            lambda m: [m.add_module(f"l{i}", nn.Linear(a, b))
                       for i, (a, b) in enumerate([(784, 64), (64, 64), (64, 10)])],
            lambda m, x: m.l2(m.l1(x.flatten(1)).relu_() if False
                              else torch.relu(m.l1(torch.relu(m.l0(x.flatten(1)))))),
        ),
    },
    "wrong": {
        "layers in a plain dict": lambda: _net(
            lambda m: setattr(m, "d", {"a": nn.Linear(784, 64), "b": nn.Linear(64, 64), "c": nn.Linear(64, 10)}),
            lambda m, x: m.d["c"](torch.relu(m.d["b"](torch.relu(m.d["a"](x.flatten(1)))))),
        ),
        "no activation": lambda: _net(_three_attr, lambda m, x: m.fc3(m.fc2(m.fc1(x.flatten(1))))),
        "sigmoid instead of ReLU": lambda: _net(
            _three_attr, lambda m, x: m.fc3(torch.sigmoid(m.fc2(torch.sigmoid(m.fc1(x.flatten(1))))))
        ),
        "ReLU on the output too": lambda: _net(
            _three_attr, lambda m, x: torch.relu(m.fc3(torch.relu(m.fc2(torch.relu(m.fc1(x.flatten(1)))))))
        ),
        "no flatten": lambda: _net(_three_attr, lambda m, x: m.fc3(torch.relu(m.fc2(torch.relu(m.fc1(x)))))),
        "a hidden layer of 128": lambda: _net(
            lambda m: _three_attr(m, (784, 128, 64, 10)),
            lambda m, x: m.fc3(torch.relu(m.fc2(torch.relu(m.fc1(x.flatten(1)))))),
        ),
        "a Dropout(0.5) after each hidden layer": lambda: _net(
            lambda m: (_three_attr(m), setattr(m, "drop", nn.Dropout(0.5))),
            lambda m, x: m.fc3(m.drop(torch.relu(m.fc2(m.drop(torch.relu(m.fc1(x.flatten(1)))))))),
        ),
        "a Dropout(0.2) before the output layer, declared output first": lambda: _net(
            lambda m: [setattr(m, k, v) for k, v in (("out", nn.Linear(64, 10)), ("drop", nn.Dropout(0.2)),
                                                     ("body", nn.Sequential(nn.Linear(784, 64), nn.ReLU(),
                                                                            nn.Linear(64, 64), nn.ReLU())))],
            lambda m, x: m.out(m.drop(m.body(x.flatten(1)))),
        ),
    },
}


def _scale(init, forward):
    class Scale(nn.Module):
        def __init__(self, factor):
            super().__init__()
            init(self, factor)

        def forward(self, x):
            return forward(self, x)

    return Scale


def _buf(name="factor", persistent=False, prep=lambda t: t):
    return lambda m, f: m.register_buffer(name, prep(f), persistent=persistent)


CH02_Q2 = {
    "right": {
        "a clone of factor": lambda: _scale(_buf(prep=torch.clone), lambda m, x: x * m.factor),
        "factor * x": lambda: _scale(_buf(), lambda m, x: m.factor * x),
        "torch.mul": lambda: _scale(_buf(), lambda m, x: torch.mul(x, m.factor)),
        "a detached factor": lambda: _scale(_buf(prep=lambda t: t.detach()), lambda m, x: x.mul(m.factor)),
        "a keyword argument": lambda: _scale(
            lambda m, f: m.register_buffer(name="factor", tensor=f, persistent=False), lambda m, x: x * m.factor
        ),
        "nn.Buffer(..., persistent=False)": lambda: _scale(
            lambda m, f: setattr(m, "factor", nn.Buffer(f, persistent=False)), lambda m, x: x * m.factor
        ),
    },
    "wrong": {
        "adds instead of multiplying": lambda: _scale(_buf(), lambda m, x: x + m.factor),
        "hard-coded factor": lambda: _scale(_buf(), lambda m, x: x * torch.tensor([2.0, 3.0])),
        "a buffer named scale": lambda: _scale(_buf("scale"), lambda m, x: x * m.scale),
        "multiplies by the sum": lambda: _scale(_buf(), lambda m, x: x * m.factor.sum()),
        "identity forward": lambda: _scale(_buf(), lambda m, x: x),
        "multiplies by a plain alias of the buffer": lambda: _scale(
            lambda m, f: (m.register_buffer("factor", f, persistent=False), setattr(m, "f", f)),
            lambda m, x: x * m.f),
        "x *= self.factor": lambda: _scale(_buf(), lambda m, x: x.mul_(m.factor)),
        "a persistent buffer hidden by state_dict()": lambda: _HiddenStateDict,
    },
}


class _HiddenStateDict(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor)

    def state_dict(self, *args, **kwargs):
        out = super().state_dict(*args, **kwargs)
        out.pop("factor", None)
        return out

    def forward(self, x):
        return x * self.factor

CH02_Q3 = {
    "right": {
        "int": lambda: 26_410,
        "float": lambda: 26_410.0,
        "numpy int": lambda: np.int64(26_410),
        "0-d tensor": lambda: torch.tensor(26_410),
        "one-element tensor": lambda: torch.tensor([26_410]),
        "numpy float": lambda: np.float64(26_410),
    },
    "wrong": {
        "Linear's bias forgotten": lambda: 26_400,
        "first conv's bias forgotten": lambda: 26_394,
        "only the Linear layer": lambda: 20_490,
        "twice the count": lambda: 52_820,
        "a string": lambda: "26410",
        "one more": lambda: 26_411,
    },
}


def _rec(select=lambda m: not list(m.children()), what=lambda i, o: tuple(o.shape), late=False,
         top=False, fmt=list, drop_batch=False, remove=True):
    def record_output_shapes(model, x):
        shapes, handles = [], []
        mods = model.named_children() if top else model.named_modules()
        for name, module in mods:
            if select(module) or top:
                if late:
                    def hook(m, i, o):
                        shapes.append((name, what(i, o)))  # noqa: B023 (the mistake)
                else:
                    def hook(m, i, o, name=name):
                        shapes.append((name, what(i, o)[1:] if drop_batch else what(i, o)))
                handles.append(module.register_forward_hook(hook))
        model(x)
        if remove:
            for h in handles:
                h.remove()
        return fmt(shapes)

    return record_output_shapes


CH02_Q4 = {
    "right": {
        "torch.Size shapes": lambda: _rec(what=lambda i, o: o.shape),
        "lists instead of tuples": lambda: _rec(what=lambda i, o: list(o.shape), fmt=lambda s: [list(p) for p in s]),
        "a tuple of pairs": lambda: _rec(fmt=tuple),
        "len(children) == 0": lambda: _rec(select=lambda m: len(list(m.children())) == 0),
        "sizes via size()": lambda: _rec(what=lambda i, o: tuple(o.size())),
        "a context manager that removes its hooks": lambda: _rec_context,
    },
    "wrong": {
        "hard-coded for the old check's input": lambda: lambda model, x: (
            model(x), [("0", (5, 784)), ("1.0", (5, 32)), ("1.1", (5, 32)), ("2", (5, 10))]
        )[1],
        "late-binding name": lambda: _rec(late=True),
        "only the top-level children": lambda: _rec(top=True),
        "batch dimension dropped": lambda: _rec(drop_batch=True),
        "a dict": lambda: _rec(fmt=dict),
        "a global forward hook, never removed": lambda: _rec_global,
        "no hooks: each leaf called in turn": lambda: _rec_by_hand,
        "hooks never removed": lambda: _rec(remove=False),
    },
}


def _rec_context(model, x):
    from contextlib import ExitStack

    shapes = []
    with ExitStack() as stack:
        for name, module in model.named_modules():
            if next(module.children(), None) is None:
                handle = module.register_forward_hook(lambda m, i, o, name=name: shapes.append((name, o.shape)))
                stack.callback(handle.remove)
        model(x)
    return shapes


def _rec_global(model, x):
    shapes, names = [], {m: n for n, m in model.named_modules() if not list(m.children())}
    nn.modules.module.register_module_forward_hook(
        lambda m, i, o: shapes.append((names[m], tuple(o.shape))) if m in names else None)
    model(x)
    return shapes


def _rec_by_hand(model, x):
    shapes = []
    for name, module in model.named_modules():
        if not list(module.children()):
            x = module(x)
            shapes.append((name, tuple(x.shape)))
    return shapes

# ------------------------------------------------------------------------------ ch03


def _ds(getitem, length=lambda s: len(s.paths)):
    class MyDataset(Dataset):
        def __init__(self, paths, labels, transform=None):
            self.paths, self.labels, self.transform = list(paths), list(labels), transform

        def __len__(self):
            return length(self)

        def __getitem__(self, idx):
            return getitem(self, idx)

    return MyDataset


def _img(s, idx):
    image = load_image(s.paths[idx])
    return s.transform(image) if s.transform else image


CH03_Q1 = {
    "right": {
        "if self.transform:": lambda: _ds(lambda s, i: (_img(s, i), s.labels[i])),
        "a list pair": lambda: _ds(lambda s, i: [_img(s, i), s.labels[i]]),
        "a tensor label": lambda: _ds(lambda s, i: (_img(s, i), torch.tensor(s.labels[i]))),
        "len of the labels": lambda: _ds(lambda s, i: (_img(s, i), s.labels[i]), lambda s: len(s.labels)),
        "numpy int label": lambda: _ds(lambda s, i: (_img(s, i), np.int64(s.labels[i]))),
    },
    "wrong": {
        "label always 0": lambda: _ds(lambda s, i: (_img(s, i), 0)),
        "the next file": lambda: _ds(lambda s, i: (_img(s, (i + 1) % len(s.paths)), s.labels[i])),
        "label and image swapped": lambda: _ds(lambda s, i: (s.labels[i], _img(s, i))),
        "a fixed length of 5": lambda: _ds(lambda s, i: (_img(s, i), s.labels[i]), lambda s: 5),
        "transform always applied": lambda: _ds(lambda s, i: (s.transform(load_image(s.paths[i])), s.labels[i])),
    },
}


def _collate(pad=0, left=False, lengths_after=False, sort=False, lengths_dtype=torch.int64, out=tuple):
    def collate(batch):
        if sort:
            batch = sorted(batch, key=lambda b: -len(b[0]))
        seqs = [s for s, _ in batch]
        longest = max(len(s) for s in seqs)
        padded = torch.full((len(seqs), longest), pad, dtype=seqs[0].dtype)
        for i, s in enumerate(seqs):
            if left:
                padded[i, longest - len(s):] = s
            else:
                padded[i, : len(s)] = s
        lengths = torch.tensor([longest if lengths_after else len(s) for s in seqs], dtype=lengths_dtype)
        return out((padded, lengths, torch.as_tensor([y for _, y in batch])))

    return collate


CH03_Q2 = {
    "right": {
        "manual padding": lambda: _collate(),
        "a list of three": lambda: _collate(out=list),
        "int32 lengths": lambda: _collate(lengths_dtype=torch.int32),
        "pad_sequence and torch.tensor": lambda: lambda batch: (
            torch.nn.utils.rnn.pad_sequence([s for s, _ in batch], batch_first=True),
            torch.tensor([s.numel() for s, _ in batch]),
            torch.tensor([y for _, y in batch]),
        ),
        "zip": lambda: lambda batch: (lambda seqs, ys: (
            torch.nn.utils.rnn.pad_sequence(list(seqs), batch_first=True),
            torch.tensor(list(map(len, seqs))), torch.tensor(ys)))(*zip(*batch, strict=True)),
    },
    "wrong": {
        "hard-coded for the old check's batch": lambda: lambda batch: (
            torch.tensor([[3, 1, 4, 0], [1, 5, 0, 0], [9, 2, 6, 5]]), torch.tensor([3, 2, 4]), torch.tensor([0, 1, 1])
        ),
        "padded at the front": lambda: _collate(left=True),
        "padded with -1": lambda: _collate(pad=-1),
        "lengths after padding": lambda: _collate(lengths_after=True),
        "sorted by length": lambda: _collate(sort=True),
        "padded as float32": lambda: lambda batch: (lambda p, n, y: (p.float(), n, y))(*_collate()(batch)),
        "padded as int16": lambda: lambda batch: (lambda p, n, y: (p.short(), n, y))(*_collate()(batch)),
    },
}


def _sharded(share):
    class ShardedRange(IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            info = get_worker_info()
            w, k = (0, 1) if info is None else (info.id, info.num_workers)
            return iter(share(self.n, w, k))

    return ShardedRange


def _ceil_chunk(n, w, k):
    per = -(-n // k)
    return range(w * per, min(n, (w + 1) * per))


def _gen_share(n, w, k):
    yield from range(w, n, k)


class _NoneCrash(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        return iter(range(info.id, self.n, info.num_workers))


CH03_Q3 = {
    "right": {
        "contiguous chunks, ceil": lambda: _sharded(_ceil_chunk),
        "islice": lambda: _sharded(lambda n, w, k: itertools.islice(range(n), w, None, k)),
        "a generator": lambda: _sharded(_gen_share),
        "numpy array_split": lambda: _sharded(lambda n, w, k: [int(i) for i in np.array_split(np.arange(n), k)[w]]),
        "modulo filter": lambda: _sharded(lambda n, w, k: (i for i in range(n) if i % k == w)),
    },
    "wrong": {
        "crashes in the main process": lambda: _NoneCrash,
        "stops at n - 1": lambda: _sharded(lambda n, w, k: range(w, n - 1, k)),
        "1 to n": lambda: _sharded(lambda n, w, k: range(w + 1, n + 1, k)),
        "chunks overlap by one": lambda: _sharded(lambda n, w, k: range(w * (n // k), min(n, (w + 1) * (n // k) + 1))),
        "ceil chunks past n": lambda: _sharded(lambda n, w, k: range(w * -(-n // k), (w + 1) * -(-n // k))),
    },
}


def _bw_unique(labels):
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].double()


CH03_Q4 = {
    "right": {
        "float32": lambda: lambda labels: 1.0 / torch.bincount(labels)[labels].float(),
        "scaled by N": lambda: lambda labels: len(labels) / torch.bincount(labels)[labels],
        "a Python loop": lambda: lambda labels: torch.tensor(
            [1.0 / int((labels == y).sum()) for y in labels.tolist()]
        ),
        "torch.unique": lambda: _bw_unique,
        "normalised to sum 1": lambda: lambda labels: (lambda w: w / w.sum())(
            1.0 / torch.bincount(labels)[labels].double()),
    },
    "wrong": {
        "hard-coded for the old check's labels": lambda: lambda labels: 1.0 / torch.tensor(
            [6, 6, 6, 6, 2, 2, 2, 6, 2, 6], dtype=torch.float64
        ),
        "all ones": lambda: lambda labels: torch.ones(len(labels)),
        "1 / (count + 1)": lambda: lambda labels: 1.0 / (torch.bincount(labels)[labels] + 1.0),
        "1 / sqrt(count)": lambda: lambda labels: torch.bincount(labels)[labels].double().rsqrt(),
        "a numpy array": lambda: lambda labels: 1.0 / np.bincount(labels.numpy())[labels.numpy()],
    },
}

# ------------------------------------------------------------------------------ ch04

_Q1_RIGHT = [0, 8, 9, 6]
CH04_Q1 = {
    "right": {
        "a tuple": lambda: tuple(_Q1_RIGHT),
        "a tensor": lambda: torch.tensor(_Q1_RIGHT),
        "a numpy array": lambda: np.array(_Q1_RIGHT),
        "numpy ints in a list": lambda: [np.int64(i) for i in _Q1_RIGHT],
        "a generator": lambda: (i for i in _Q1_RIGHT),
        "0-d tensors in a list": lambda: [torch.tensor(i) for i in _Q1_RIGHT],
    },
    "wrong": {
        "reversed": lambda: _Q1_RIGHT[::-1],
        "sorted": lambda: sorted(_Q1_RIGHT),
        "rank 2's share": lambda: [3, 5, 2, 0],
        "epoch 4": lambda: __import__("course_utils.data", fromlist=["x"]).sampler_indices(10, 3, epoch=4)[1],
        "the first four of the order": lambda: [6, 0, 3, 7],
        "positions shifted by one": lambda: [3, 5, 2, 0][:3] + [6],
    },
}


# Answers that run on the check's real ranks: module-level functions (the check runs their code alone
# on each rank, with `torch` and `dist` as its only names), no closures.


def _ar_tensor_api(t):
    world = dist.get_world_size()
    mine = torch.empty(t.numel() // world, dtype=t.dtype)
    dist.reduce_scatter_tensor(mine, t)
    out = torch.empty_like(t)
    dist.all_gather_into_tensor(out, mine)
    return out


def _ar_async(t):
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(t.split(len(t) // world))
    mine = torch.zeros_like(chunks[rank])
    dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, async_op=True).wait()
    parts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, async_op=True).wait()
    return torch.cat(parts)


def _ar_torch_distributed(t):
    d = torch.distributed
    world = d.get_world_size()
    chunks = list(t.chunk(world))
    mine = chunks[0].clone()
    d.reduce_scatter(mine, chunks)
    parts = [mine.clone() for _ in range(world)]
    d.all_gather(parts, mine)
    return torch.stack(parts).flatten()


def _ar_in_place(t):
    world = dist.get_world_size()
    chunks = [c.clone() for c in t.chunk(world)]
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks)
    dist.all_gather(list(t.chunk(world)), mine)  # the chunks are views of t: t holds the sums
    return t


def _ar_float64_then_back(t):
    world = dist.get_world_size()
    wide = t.double()
    mine = torch.empty(len(t) // world, dtype=torch.float64)
    dist.reduce_scatter(mine, list(wide.chunk(world)))
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return torch.cat(parts).to(t.dtype)


def _ar_hard_coded_two(t):
    chunks = list(t.chunk(2))
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks)
    parts = [torch.empty_like(mine) for _ in range(2)]
    dist.all_gather(parts, mine)
    return torch.cat(parts)


def _ar_reversed(t):
    world = dist.get_world_size()
    chunks = list(t.chunk(world))
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return torch.cat(parts[::-1])


def _ar_max(t):
    world = dist.get_world_size()
    chunks = list(t.chunk(world))
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.MAX)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return torch.cat(parts)


def _ar_unchanged(t):
    return t


def _ar_gather_and_sum(t):
    world = dist.get_world_size()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)  # right sums, but all_gather alone: world times the data of reduce_scatter
    return sum(parts)


def _ar_mine_repeated(t):
    world = dist.get_world_size()
    chunks = list(t.chunk(world))
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return mine.repeat(world)


CH04_Q2 = {
    "right": {
        "reduce_scatter_tensor and all_gather_into_tensor": lambda: _ar_tensor_api,
        "async ops, split, an explicit SUM": lambda: _ar_async,
        "torch.distributed by its full name, stacked": lambda: _ar_torch_distributed,
        "gathered into t's own chunks": lambda: _ar_in_place,
        "summed in float64, returned in t's dtype": lambda: _ar_float64_then_back,
    },
    "wrong": {
        "two chunks, whatever the world size": lambda: _ar_hard_coded_two,
        "the chunks in reverse rank order": lambda: _ar_reversed,
        "MAX instead of SUM": lambda: _ar_max,
        "t returned unchanged": lambda: _ar_unchanged,
        "all_gather of t, summed (no reduce_scatter)": lambda: _ar_gather_and_sum,
        "its own chunk repeated": lambda: _ar_mine_repeated,
    },
}


def _orders(first=0, sort=False, out=list, count=lambda e: e):
    def epoch_orders(sampler, epochs):
        orders = []
        for epoch in range(count(epochs)):
            sampler.set_epoch(epoch + first)
            orders.append(sorted(sampler) if sort else out(sampler))
        return orders

    return epoch_orders


def _orders_gen(sampler, epochs):
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        yield list(sampler)


CH04_Q3 = {
    "right": {
        "tuples": lambda: _orders(out=tuple),
        "tensors": lambda: _orders(out=lambda s: torch.tensor(list(s))),
        "a generator": lambda: _orders_gen,
        "list(iter(sampler))": lambda: lambda s, n: [(s.set_epoch(e), list(iter(s)))[1] for e in range(n)],
        "numpy arrays": lambda: _orders(out=lambda s: np.array(list(s))),
    },
    "wrong": {
        "hard-coded for the old check's sampler": lambda: lambda sampler, epochs: [
            [5, 0, 3, 9, 10, 7], [11, 3, 5, 9, 6, 1], [4, 7, 11, 6, 0, 1]
        ],
        "set_epoch(epoch + 1)": lambda: _orders(first=1),
        "sorted": lambda: _orders(sort=True),
        "one epoch too few": lambda: _orders(count=lambda e: e - 1),
        "one epoch too many": lambda: _orders(count=lambda e: e + 1),
    },
}

CH04_Q4 = {
    "right": {
        "int": lambda: 128,
        "float": lambda: 128.0,
        "numpy int": lambda: np.int64(128),
        "0-d tensor": lambda: torch.tensor(128),
        "an expression": lambda: 4 * 2 * 16,
    },
    "wrong": {"256": lambda: 256, "8": lambda: 8, "48": lambda: 48, "512": lambda: 512, "130": lambda: 130},
}

# ------------------------------------------------------------------------------ ch05


def _ga5(kind):
    def global_accuracy(correct, total, all_reduce, world_size):
        if kind == "two":
            c, t = correct.clone().double(), total.clone().double()
            all_reduce(c)
            all_reduce(t)
            return float(c / t)
        counts = torch.stack([correct, total])
        if kind == "only_total":
            t = total.clone()
            all_reduce(t)
            return (correct / t).item()
        if kind == "sum_acc":
            acc = (correct / total).clone()
            all_reduce(acc)
            return acc.item()
        all_reduce(counts)
        acc = counts[0] / counts[1]
        return {"float32": acc.item(), "tensor": acc, "over_world": acc.item() / world_size,
                "percent": 100 * acc.item(), "python": float(acc), "numpy": acc.numpy()[()]}[kind]

    return global_accuracy


CH05_Q1 = {
    "right": {k: (lambda k=k: _ga5(k)) for k in ("two", "float32", "tensor", "python", "numpy")},
    "wrong": {
        "hard-coded for the old check's shards": lambda: lambda c, t, ar, w: 145 / 170,
        **{k: (lambda k=k: _ga5(k)) for k in ("only_total", "sum_acc", "over_world", "percent")},
    },
}


def _resume(model=True, opt=True, sched=True, start=lambda e: e, step_after=False, order="mos"):
    def resume(ckpt, model_, optimizer, scheduler):
        loads = {"m": (model, lambda: model_.load_state_dict(ckpt["model"])),
                 "o": (opt, lambda: optimizer.load_state_dict(ckpt["optimizer"])),
                 "s": (sched, lambda: scheduler.load_state_dict(ckpt["scheduler"]))}
        for key in order:
            if loads[key][0]:
                loads[key][1]()
        if step_after:
            scheduler.step()
        return start(ckpt["epoch"])

    return resume


CH05_Q2 = {
    "right": {
        "scheduler first": lambda: _resume(order="smo"),
        "int()": lambda: _resume(start=int),
        "a 0-d tensor": lambda: _resume(start=torch.tensor),
        "optimizer first": lambda: _resume(order="oms"),
        "a numpy int": lambda: _resume(start=np.int64),
    },
    "wrong": {
        "model forgotten": lambda: _resume(model=False),
        "one epoch too early": lambda: _resume(start=lambda e: e - 1),
        "scheduler stepped after loading": lambda: _resume(step_after=True),
        "hard-coded start epoch": lambda: _resume(start=lambda e: 3),
        "only the optimizer": lambda: _resume(model=False, sched=False),
        "a float start epoch (range refuses it)": lambda: _resume(start=float),
        "a one-element list": lambda: _resume(start=lambda e: [e]),
    },
}

CH05_Q3 = {
    "right": {
        "array_split chunks": lambda: lambda n, r, w: [int(i) for i in np.array_split(np.arange(n), w)[r]],
        "a range": lambda: lambda n, r, w: range(r, n, w),
        "a strided tensor": lambda: lambda n, r, w: torch.arange(n)[r::w],
        "modulo filter": lambda: lambda n, r, w: [i for i in range(n) if i % w == r],
        "tensor_split": lambda: lambda n, r, w: torch.tensor_split(torch.arange(n), w)[r],
        "a generator": lambda: lambda n, r, w: (i for i in range(r, n, w)),
    },
    "wrong": {
        "ceil-sized chunks": lambda: lambda n, r, w: list(_ceil_chunk(n, r, w)),
        "includes n": lambda: lambda n, r, w: list(range(r, n + 1, w)),
        "shifted by one": lambda: lambda n, r, w: list(range(r + 1, n, w)),
        "everything on rank 0": lambda: lambda n, r, w: list(range(n)) if r == 0 else [],
        "stride world_size - 1": lambda: lambda n, r, w: list(range(r, n, max(1, w - 1))),
    },
}


def _save_via(kind):
    def save_atomically(obj, path):
        path = Path(path)
        if kind == "delete_first":
            if path.exists():
                path.unlink()
            torch.save(obj, path)
            return
        if kind == "other_dir":
            fd, tmp = tempfile.mkstemp(suffix=".pt")
            os.close(fd)
            torch.save(obj, tmp)
            shutil.move(tmp, path)
            return
        if kind == "bound_save":  # torch.save under a name bound before any check
            tmp = path.with_name(path.name + ".partial")
            _bound_save(obj, tmp)
            os.replace(tmp, path)
            return
        if kind == "copyfile":
            tmp = path.with_name(path.name + ".partial")
            torch.save(obj, tmp)
            shutil.copy(tmp, path)
            return
        if kind == "backup_first":  # keeps a backup, but `path` itself is missing in between
            if path.exists():
                os.replace(path, path.with_name(path.name + ".bak"))
            tmp = path.with_name(path.name + ".partial")
            torch.save(obj, tmp)
            os.replace(tmp, path)
            return
        if kind == "exclusive_tmp":  # a fixed name opened with "xb": after a crash, every save fails
            tmp = path.with_name(path.name + ".partial")
            with open(tmp, "xb") as f:
                torch.save(obj, f)
            os.replace(tmp, path)
            return
        if kind == "named_tmp":
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
                torch.save(obj, f)
            os.replace(f.name, path)
            return
        tmp = path.with_name(path.name + ".partial")
        if kind == "never_renames":
            torch.save(obj, tmp)
            return
        if kind == "swapped":
            torch.save(obj, tmp)
            os.replace(path, tmp)
            return
        torch.save(obj, tmp)
        if kind == "rename":
            os.rename(tmp, path)
        elif kind == "path_replace":
            tmp.replace(path)
        elif kind == "str_paths":
            os.replace(str(tmp), str(path))
        elif kind == "save_again":
            os.replace(tmp, path)
            torch.save(obj, path)
        elif kind == "pid":
            pid_tmp = path.parent / f".{path.name}.{os.getpid()}"
            os.replace(tmp, pid_tmp)
            os.replace(pid_tmp, path)

    return save_atomically


CH05_Q4 = {
    "right": {k: (lambda k=k: _save_via(k))
              for k in ("named_tmp", "rename", "path_replace", "str_paths", "pid", "bound_save")},
    "wrong": {k: (lambda k=k: _save_via(k)) for k in (
        "delete_first", "other_dir", "never_renames", "swapped", "save_again", "copyfile", "backup_first",
        "exclusive_tmp")},
}

# ------------------------------------------------------------------------------ ch06


def _net6(layers, forward):
    return _net(layers, forward)


def _two(m, hidden=32):
    m.fc1, m.fc2 = nn.Linear(784, hidden), nn.Linear(hidden, 10)


CH06_Q1 = {
    "right": {
        "nn.Sequential": lambda: _net6(
            lambda m: setattr(m, "net", nn.Sequential(nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))),
            lambda m, x: m.net(x),
        ),
        "nn.ModuleList": lambda: _net6(
            lambda m: setattr(m, "layers", nn.ModuleList([nn.Linear(784, 32), nn.Linear(32, 10)])),
            lambda m, x: m.layers[1](torch.relu(m.layers[0](x))),
        ),
        "F.relu": lambda: _net6(_two, lambda m, x: m.fc2(F.relu(m.fc1(x)))),
        "an nn.ReLU module": lambda: _net6(
            lambda m: (_two(m), setattr(m, "act", nn.ReLU())), lambda m, x: m.fc2(m.act(m.fc1(x)))
        ),
        "its own initialisation (kaiming_normal_)": lambda: _net6(
            lambda m: (_two(m), nn.init.kaiming_normal_(m.fc1.weight, nonlinearity="relu")),
            lambda m, x: m.fc2(torch.relu(m.fc1(x))),
        ),
        "add_module": lambda: _net6(
            lambda m: (m.add_module("a", nn.Linear(784, 32)), m.add_module("b", nn.Linear(32, 10))),
            lambda m, x: m.b(m.a(x).clamp(min=0)),
        ),
        "xavier_uniform_ initialisation": lambda: _net6(
            lambda m: (_two(m), nn.init.xavier_uniform_(m.fc1.weight), nn.init.xavier_uniform_(m.fc2.weight)),
            lambda m, x: m.fc2(torch.relu(m.fc1(x))),
        ),
        "hand-made nn.Parameter layers": lambda: _net6(
            lambda m: [setattr(m, n, nn.Parameter(torch.randn(*shape) * 0.05)) for n, shape in
                       (("w1", (32, 784)), ("b1", (32,)), ("w2", (10, 32)), ("b2", (10,)))],
            lambda m, x: torch.relu(x @ m.w1.T + m.b1) @ m.w2.T + m.b2,
        ),
    },
    "wrong": {
        "sigmoid instead of ReLU": lambda: _net6(_two, lambda m, x: m.fc2(torch.sigmoid(m.fc1(x)))),
        "no activation": lambda: _net6(_two, lambda m, x: m.fc2(m.fc1(x))),
        "ReLU on the output": lambda: _net6(_two, lambda m, x: torch.relu(m.fc2(torch.relu(m.fc1(x))))),
        "hidden layer detached": lambda: _net6(_two, lambda m, x: m.fc2(torch.relu(m.fc1(x)).detach())),
        "a hidden layer of 64": lambda: _net6(lambda m: _two(m, 64), lambda m, x: m.fc2(torch.relu(m.fc1(x)))),
    },
}


def _acc(kind):
    def accumulate_step(model, optimizer, micro_batches):
        k = len(micro_batches)
        if kind == "cat":
            optimizer.zero_grad()
            x = torch.cat([x for x, _ in micro_batches])
            y = torch.cat([y for _, y in micro_batches])
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            return
        if kind != "zero_after":
            optimizer.zero_grad(set_to_none=(kind != "zero_false"))
        for j, (x, y) in enumerate(micro_batches):
            if kind == "zero_inside":
                optimizer.zero_grad()
            if kind == "only_last" and j < k - 1:
                continue
            if kind == "step_early" and j == k - 1:
                optimizer.step()
            loss = F.cross_entropy(model(x), y)
            if kind == "sum":
                loss = F.cross_entropy(model(x), y, reduction="sum") / (k * len(x))
            scale = {"by_size": len(x), "times_k": 1 / k, "sum": 1}.get(kind, k)
            loss.div(scale).backward()
        if kind != "step_early":
            optimizer.step()
        if kind == "zero_after":
            optimizer.zero_grad()

    return accumulate_step


CH06_Q2 = {
    "right": {k: (lambda k=k: _acc(k)) for k in ("cat", "zero_after", "zero_false", "sum", "plain")},
    "wrong": {k: (lambda k=k: _acc(k)) for k in ("by_size", "times_k", "only_last", "zero_inside", "step_early")},
}


def _eval(kind):
    def evaluate(model, x, y):
        was = model.training
        if kind == "eval_attr":
            model.eval  # noqa: B018 (the mistake: not called)
        elif kind == "train_false":
            model.train(False)
        else:
            model.eval()
        ctx = torch.inference_mode() if kind == "inference" else (
            torch.set_grad_enabled(False) if kind == "set_grad" else torch.no_grad())
        if kind == "no_grad_call":
            torch.no_grad()
            ctx = torch.enable_grad()
        with ctx:
            out = model(x)
        if kind == "grad_off":
            torch.set_grad_enabled(False)
            out = model(x)
        dim = 0 if kind == "dim0" else 1
        hits = (out.argmax(dim) == y) if kind != "dim0" else (out.argmax(dim)[: len(y)] == y[: out.shape[1]])
        value = {"count": hits.sum().item(), "error": 1 - hits.float().mean().item(),
                 "tensor": hits.float().mean(), "sum_len": hits.sum().item() / len(y)}.get(
                     kind, hits.float().mean().item())
        model.train() if kind == "forces_train" else model.train(was)
        return value

    return evaluate


CH06_Q3 = {
    "right": {k: (lambda k=k: _eval(k)) for k in ("inference", "set_grad", "train_false", "tensor", "sum_len")},
    "wrong": {k: (lambda k=k: _eval(k))
              for k in ("eval_attr", "no_grad_call", "count", "error", "dim0", "grad_off", "forces_train")},
}


def _loader(kind):
    def make_loader(dataset, rank, world_size, epoch):
        if kind == "subset":
            return DataLoader(Subset(dataset, range(rank, len(dataset), world_size)), batch_size=4, shuffle=True)
        sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=kind != "no_shuffle",
            seed={"seed_rank": rank, "common_seed": 1234}.get(kind, 0), drop_last=kind == "drop_last")
        sampler.set_epoch(0 if kind == "epoch0" else epoch)
        if kind == "positional":
            return DataLoader(dataset, 4, False, sampler)
        if kind == "plain":
            sampler = DistributedSampler(dataset, world_size, rank)
            sampler.set_epoch(epoch)
        return DataLoader(dataset, batch_size=8 if kind == "batch8" else 4, sampler=sampler,
                          num_workers=0, shuffle=None)

    return make_loader


CH06_Q4 = {
    "right": {k: (lambda k=k: _loader(k)) for k in ("plain", "drop_last", "positional", "common_seed", "explicit")},
    "wrong": {k: (lambda k=k: _loader(k)) for k in ("no_shuffle", "epoch0", "seed_rank", "subset", "batch8")},
}

def _fr_ops(records):
    return {r: {e["collective_seq_id"]: (e["profiling_name"], str(e["input_sizes"]), str(e["input_dtypes"]))
                for e in entries} for r, entries in records.items()}


def _desync_merge(records):
    """A sorted walk over every rank's numbers from the latest first one."""
    ops = _fr_ops(records)
    start = max(min(o) for o in ops.values())
    for seq in sorted(set().union(*ops.values())):
        if seq >= start and len({o.get(seq, "none") for o in ops.values()}) > 1:
            return seq
    return None


def _desync_numpy(records):
    seq = _desync_merge(records)
    return None if seq is None else np.int64(seq)


def _desync_tensor(records):
    seq = _desync_merge(records)
    return None if seq is None else torch.tensor(seq)


def _desync_float(records):
    seq = _desync_merge(records)
    return None if seq is None else float(seq)


def _desync_tuples(records):
    rows = {}
    for rank, entries in records.items():
        for e in entries:
            rows.setdefault(e["collective_seq_id"], {})[rank] = (e["profiling_name"],
                                                                 tuple(map(tuple, e["input_sizes"])),
                                                                 tuple(e["input_dtypes"]))
    start = max(entries[0]["collective_seq_id"] for entries in records.values())
    for seq in sorted(rows):
        if seq >= start and (len(rows[seq]) < len(records) or len(set(rows[seq].values())) > 1):
            return seq
    return None


def _desync_last(records):
    return max(e["collective_seq_id"] for entries in records.values() for e in entries)


def _desync_rank(records):
    """The rank that ran something else there, instead of the sequence number."""
    seq = _desync_merge(records)
    if seq is None:
        return None
    ops = _fr_ops(records)
    return next((r for r in ops if ops[r].get(seq) != ops[0].get(seq)), 0)


def _desync_one_late(records):
    seq = _desync_merge(records)
    return None if seq is None else seq - 1


def _desync_dtype_only(records):
    ops = {r: {e["collective_seq_id"]: str(e["input_dtypes"]) for e in entries} for r, entries in records.items()}
    start = max(min(o) for o in ops.values())
    for seq in sorted(set().union(*ops.values())):
        if seq >= start and len({o.get(seq) for o in ops.values()}) > 1:
            return seq
    return None


def _desync_from_zero(records):
    ops = _fr_ops(records)  # no allowance for the ring buffer: numbers one rank dropped count as a difference
    for seq in sorted(set().union(*ops.values())):
        if len({o.get(seq, "none") for o in ops.values()}) > 1:
            return seq
    return None


def _desync_zero(records):
    seq = _desync_merge(records)
    return 0 if seq is None else seq


CH06_Q5 = {
    "right": {
        "a sorted walk from the latest first number": lambda: _desync_merge,
        "a numpy int": lambda: _desync_numpy,
        "a 0-d tensor": lambda: _desync_tensor,
        "a float": lambda: _desync_float,
        "rows of tuples per sequence number": lambda: _desync_tuples,
    },
    "wrong": {
        "the last number any rank recorded": lambda: _desync_last,
        "the rank instead of the number": lambda: _desync_rank,
        "the last number that agreed": lambda: _desync_one_late,
        "dtypes only": lambda: _desync_dtype_only,
        "the ring buffer's dropped numbers counted": lambda: _desync_from_zero,
        "0 when the ranks agree": lambda: _desync_zero,
    },
}


# ------------------------------------------------------------------------------ ch07
# Q1 and Q3 run the answer on 2 real ranks (one launch per answer the check has not seen yet).


def _tp(**kinds):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    made = {"col": ColwiseParallel, "row": RowwiseParallel,
            "col_explicit": lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1)),
            "row_explicit": lambda: RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()),
            "row_dtensor": lambda: RowwiseParallel(use_local_output=False),
            "row_sharded_out": lambda: RowwiseParallel(output_layouts=Shard(-1)),
            "col_replicated_out": lambda: ColwiseParallel(output_layouts=Replicate())}
    return {name: made[kind]() for name, kind in kinds.items()}


CH07_Q1 = {
    "right": {
        "keys in another order": lambda: _tp(o="row", v="col", k="col", q="col"),
        "the layouts written out": lambda: _tp(q="col_explicit", k="col_explicit", v="col_explicit", o="row_explicit"),
        "o's output left a DTensor": lambda: _tp(q="col", k="col", v="col", o="row_dtensor"),
        "built with dict()": lambda: dict(_tp(q="col", k="col", v="col", o="row")),
        "an OrderedDict": lambda: OrderedDict(_tp(q="col", k="col", v="col", o="row")),
    },
    "wrong": {
        "only q split": lambda: _tp(q="col"),
        "only o split": lambda: _tp(o="row"),
        "o's output left sharded": lambda: _tp(q="col", k="col", v="col", o="row_sharded_out"),
        "every layer row-wise": lambda: _tp(q="row", k="row", v="row", o="row"),
        "q, k, v gathered after their split": lambda: _tp(q="col_replicated_out", k="col_replicated_out",
                                                          v="col_replicated_out", o="row"),
        "o column-wise behind an all-gather": lambda: {**_tp(q="col", k="col", v="col"), "o": _o_gathered()},
        "layer names of the whole block": lambda: {f"attn.{k}": v
                                                   for k, v in _tp(q="col", k="col", v="col", o="row").items()},
    },
}


def _o_gathered():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate())


def _bubble(expr):
    def bubble(stages, microbatches):
        return eval(expr, {"np": np, "torch": torch}, {"p": stages, "m": microbatches})  # noqa: S307 - a formula

    return bubble


CH07_Q2 = {
    "right": {
        "one minus the busy part": lambda: _bubble("1 - m / (m + p - 1)"),
        "idle slots over all slots": lambda: _bubble("p * (p - 1) / (p * (m + p - 1))"),
        "a numpy float": lambda: _bubble("np.float64(p - 1) / (m + p - 1)"),
        "a 0-d tensor": lambda: _bubble("torch.tensor(p - 1.0) / (m + p - 1)"),
        "fill and drain counted apart": lambda: _bubble("((p - 1) / 2 + (p - 1) / 2) / (m + p - 1)"),
    },
    "wrong": {
        "m + p in the denominator": lambda: _bubble("(p - 1) / (m + p)"),
        "the busy fraction": lambda: _bubble("m / (m + p - 1)"),
        "m - 1 in the denominator": lambda: _bubble("(p - 1) / (m - 1)"),
        "twice the bubble (forward and backward)": lambda: _bubble("2 * (p - 1) / (m + p - 1)"),
        "stages over micro-batches": lambda: _bubble("p / m"),
    },
}


def _q3_plan(kind):
    from course_utils.ch07_parallelism import Q3_LENGTHS, random_batches
    from course_utils.exercises.ch07 import answer_q3

    model = answer_q3()
    order = sorted(range(32), key=lambda i: Q3_LENGTHS[i], reverse=True)
    if kind == "reversed inside batches":
        return [[b[::-1] for b in rank] for rank in model]
    if kind == "tuples":
        return tuple(tuple(tuple(b) for b in rank) for rank in model)
    if kind == "tensors":
        return [[torch.tensor(b) for b in rank] for rank in model]
    if kind == "round robin":
        return [[[order[8 * s + j] for j in range(r, 8, 2)] for s in range(4)] for r in range(2)]
    if kind == "longest with shortest":
        asc = sorted(range(32), key=lambda i: Q3_LENGTHS[i])
        flat = [[], []]
        for k in range(16):
            flat[k % 2] += [asc[k], asc[31 - k]]
        return [[f[4 * s:4 * s + 4] for s in range(4)] for f in flat]
    if kind == "the data set's order":
        return [[list(range(8 * s, 8 * s + 4)) for s in range(4)],
                [list(range(8 * s + 4, 8 * s + 8)) for s in range(4)]]
    if kind == "another random split":
        return random_batches(Q3_LENGTHS, 2, 4, seed=1)
    if kind == "neighbours, the longer half to rank 0":
        return [[[order[8 * s + j] for j in range(4 * r, 4 * r + 4)] for s in range(4)] for r in range(2)]
    if kind == "one sample twice, another never":
        return [model[0], model[1][:3] + [model[1][3][:3] + [model[0][0][0]]]]
    if kind == "one rank with 3 steps":
        return [model[0], model[1][:3]]
    if kind == "2 steps of 8 samples":
        return [[rank[0] + rank[1], rank[2] + rank[3]] for rank in model]
    raise AssertionError(kind)


CH07_Q3 = {
    "right": {k: (lambda k=k: _q3_plan(k)) for k in ("reversed inside batches", "tuples", "tensors", "round robin",
                                                      "longest with shortest")},
    "wrong": {k: (lambda k=k: _q3_plan(k)) for k in ("the data set's order", "another random split",
                                                      "neighbours, the longer half to rank 0",
                                                      "one sample twice, another never",
                                                      "one rank with 3 steps", "2 steps of 8 samples")},
}


def _ring(expr):
    def ring_bytes(nbytes, world_size):
        return eval(expr, {"np": np, "torch": torch, "max": max}, {"n": world_size, "b": nbytes})  # noqa: S307

    return ring_bytes


CH07_Q4 = {
    "right": {
        "2 b - 2 b / n": lambda: _ring("2 * b - 2 * b / n"),
        "two halves": lambda: _ring("(n - 1) / n * b + (n - 1) / n * b"),
        "chunks times steps": lambda: _ring("2 * (n - 1) * (b / n)"),
        "a numpy float": lambda: _ring("np.float64(2 * (n - 1) * b) / n"),
        "a 0-d tensor": lambda: _ring("torch.tensor(2.0 * (n - 1) * b / n)"),
    },
    "wrong": {
        "n + 1 instead of n - 1": lambda: _ring("2 * (n + 1) / n * b"),
        "the whole tensor in each reduce-scatter step": lambda: _ring("(n - 1) * b"),
        "the tensor once": lambda: _ring("b"),
        "divided by n - 1": lambda: _ring("2 * b / max(n - 1, 1)"),
        "bits, not bytes": lambda: _ring("8 * 2 * (n - 1) / n * b"),
    },
}

SIMULATION = {
    ("ch00", "q1"): CH00_Q1,
    ("ch01", "q1"): CH01_Q1, ("ch01", "q2"): CH01_Q2, ("ch01", "q3"): CH01_Q3, ("ch01", "q4"): CH01_Q4,
    ("ch02", "q1"): CH02_Q1, ("ch02", "q2"): CH02_Q2, ("ch02", "q3"): CH02_Q3, ("ch02", "q4"): CH02_Q4,
    ("ch03", "q1"): CH03_Q1, ("ch03", "q2"): CH03_Q2, ("ch03", "q3"): CH03_Q3, ("ch03", "q4"): CH03_Q4,
    ("ch04", "q1"): CH04_Q1, ("ch04", "q2"): CH04_Q2, ("ch04", "q3"): CH04_Q3, ("ch04", "q4"): CH04_Q4,
    ("ch05", "q1"): CH05_Q1, ("ch05", "q2"): CH05_Q2, ("ch05", "q3"): CH05_Q3, ("ch05", "q4"): CH05_Q4,
    ("ch06", "q1"): CH06_Q1, ("ch06", "q2"): CH06_Q2, ("ch06", "q3"): CH06_Q3, ("ch06", "q4"): CH06_Q4,
    ("ch06", "q5"): CH06_Q5,
    ("ch07", "q1"): CH07_Q1, ("ch07", "q2"): CH07_Q2, ("ch07", "q3"): CH07_Q3, ("ch07", "q4"): CH07_Q4,
}

# ------------------------------------------------------------------------------ ch03 q5 (num_workers from epoch times)


def _q5_rule(stat=lambda t: sorted(t)[len(t) // 2], tol=1.05, pick=min, keys=sorted, out=int):
    def pick_num_workers(seconds):
        medians = {w: stat(seconds[w]) for w in keys(seconds)}
        best = min(medians.values())
        within = [w for w, m in medians.items() if m <= tol * best]
        return out(pick(within))

    return pick_num_workers


def _q5_in_place(seconds):
    for times in seconds.values():
        times.sort()
    medians = {w: t[len(t) // 2] for w, t in seconds.items()}
    return min(w for w, m in medians.items() if m / min(medians.values()) <= 1.05)


CH03_Q5 = {
    "right": {
        "statistics.median": lambda: _q5_rule(stat=__import__("statistics").median),
        "numpy median, numpy int": lambda: _q5_rule(stat=np.median, out=np.int64),
        "torch median, a 0-d tensor": lambda: _q5_rule(stat=lambda t: torch.tensor(t).median().item(),
                                                       out=torch.tensor),
        "a float result": lambda: _q5_rule(out=float),
        "sorts the lists in place, ratio test": lambda: _q5_in_place,
        "first within, walking sorted keys": lambda: _q5_rule(pick=lambda within: within[0]),
    },
    "wrong": {
        "the largest num_workers within 5%": lambda: _q5_rule(pick=max),
        "10% instead of 5%": lambda: _q5_rule(tol=1.10),
        "first within, in the dict's order": lambda: _q5_rule(keys=list, pick=lambda within: within[0]),
        "never 0 workers": lambda: _q5_rule(keys=lambda s: sorted(w for w in s if w > 0)),
        "the slowest epoch of each setting": lambda: _q5_rule(stat=max),
        "returns the best median time": lambda: lambda seconds: min(sorted(t)[len(t) // 2] for t in seconds.values()),
        "returns every candidate": lambda: _q5_rule(pick=lambda within: within, out=list),
        "greedy: more workers while the next is 5% faster, stop at the first that is not":
            lambda: _q5_greedy(stop=True),
        "greedy: more workers while the next is 5% faster than the kept one": lambda: _q5_greedy(stop=False),
    },
}


def _q5_greedy(stop):
    def pick_num_workers(seconds):
        medians = {w: sorted(t)[len(t) // 2] for w, t in sorted(seconds.items())}
        order = list(medians)
        pick = order[0]
        for w in order[1:]:
            if medians[w] < medians[pick] / 1.05:
                pick = w
            elif stop:
                break
        return pick

    return pick_num_workers
SIMULATION[("ch03", "q5")] = CH03_Q5


# -------------------------------------------------------------------------- ch01, Q5: the backward pass walked by hand


def _bw(start=1.0, leaf_of=lambda n: n.variable if hasattr(n, "variable") else None, skip_none=True,
        sign=1.0, key=lambda leaf: leaf, first_input_only=False, grad_mode=False):
    """A recursive walk of out.grad_fn, once per path (the simulated learners' answers vary its parts)."""

    def backward_walk(out):
        grads = {}

        def visit(node, grad):
            if node is None and skip_none:
                return
            leaf = leaf_of(node)
            if leaf is not None:
                k = key(leaf)
                grads[k] = grads[k] + sign * grad if k in grads else sign * grad
                return
            sent = node(grad)
            sent = (sent,) if isinstance(sent, torch.Tensor) else sent
            pairs = list(zip(node.next_functions, sent, strict=True))
            for (nxt, _), g in pairs[:1] if first_input_only else pairs:
                visit(nxt, g)

        with torch.set_grad_enabled(grad_mode):
            visit(out.grad_fn, start * torch.ones_like(out))
        return grads

    return backward_walk


def _zeros(meta):
    return torch.zeros(meta.shape, dtype=meta.dtype, device=meta.device)


def _engine(order="stack", missing="zeros", grad_mode=False, flat=False):
    """The engine's algorithm (dependencies, a buffer slot per (node, input_nr), one call per node), in the
    forms a learner may write it: ready nodes from a stack, a queue or a heap by sequence number; unreached
    slots as zeros or None (the engine's undefined gradient); one dict per node or one flat dict."""
    import heapq
    from collections import deque

    def backward_walk(out):
        deps, seen, todo = {}, {out.grad_fn}, [out.grad_fn]
        while todo:
            for child, _ in todo.pop().next_functions:
                if child is not None:
                    deps[child] = deps.get(child, 0) + 1
                    if child not in seen:
                        seen.add(child)
                        todo.append(child)
        slots = {}  # (node, input_nr) -> gradient, when flat; node -> {input_nr: gradient} otherwise

        def put(node, i, g):
            if flat:
                slots[node, i] = slots[node, i] + g if (node, i) in slots else g
            else:
                box = slots.setdefault(node, {})
                box[i] = box[i] + g if i in box else g

        def take_all(node, n):
            got = [slots.pop((node, i), None) for i in range(n)] if flat else [
                slots.get(node, {}).get(i) for i in range(n)]
            return got

        put(out.grad_fn, 0, torch.ones_like(out))
        ready, tick = deque([out.grad_fn]) if order == "queue" else [], 0
        if order == "heap":
            ready = [(-out.grad_fn._sequence_nr(), 0, out.grad_fn)]
        elif order == "stack":
            ready = [out.grad_fn]
        grads = {}
        with torch.set_grad_enabled(grad_mode):
            while ready:
                if order == "heap":
                    node = heapq.heappop(ready)[2]
                elif order == "queue":
                    node = ready.popleft()
                else:
                    node = ready.pop()
                metas = node._input_metadata
                inputs = take_all(node, len(metas))
                if type(node).__name__ == "AccumulateGrad":
                    grads[node.variable] = inputs[0]
                    continue
                if missing == "zeros":
                    inputs = [_zeros(m) if g is None else g for g, m in zip(inputs, metas, strict=True)]
                sent = node(*inputs)
                for (child, i), g in zip(node.next_functions, sent if isinstance(sent, tuple) else (sent,),
                                         strict=True):
                    if child is None:
                        continue
                    put(child, i, g)
                    deps[child] -= 1
                    if deps[child] == 0:
                        tick += 1
                        if order == "heap":
                            heapq.heappush(ready, (-child._sequence_nr(), tick, child))
                        else:
                            ready.append(child)
        return grads

    return backward_walk


def _bw_topological_one_slot(out):
    """Engine order, but one gradient per node: a node with several outputs (unbind) gets one argument."""
    order, seen = [], set()

    def dfs(node):
        if node is None or node in seen:
            return
        seen.add(node)
        for nxt, _ in node.next_functions:
            dfs(nxt)
        order.append(node)

    dfs(out.grad_fn)
    incoming = {out.grad_fn: torch.ones_like(out)}
    grads = {}
    with torch.no_grad():
        for node in reversed(order):
            grad = incoming.pop(node)
            if type(node).__name__ == "AccumulateGrad":
                grads[node.variable] = grad
                continue
            sent = node(grad)
            for (nxt, _), g in zip(node.next_functions, sent if isinstance(sent, tuple) else (sent,), strict=True):
                if nxt is not None:
                    incoming[nxt] = incoming[nxt] + g if nxt in incoming else g
    return grads


def _bw_topological(out):
    """Engine-style through a topological order (depth-first post-order, reversed), a slot per input_nr."""
    order, seen = [], set()

    def dfs(node):
        if node is None or node in seen:
            return
        seen.add(node)
        for nxt, _ in node.next_functions:
            dfs(nxt)
        order.append(node)

    dfs(out.grad_fn)
    incoming = {(out.grad_fn, 0): torch.ones_like(out)}
    grads = {}
    with torch.no_grad():
        for node in reversed(order):
            metas = node._input_metadata
            grads_in = [incoming.pop((node, i), None) for i in range(len(metas))]
            if type(node).__name__ == "AccumulateGrad":
                grads[node.variable] = grads_in[0]
                continue
            sent = node(*[_zeros(m) if g is None else g for g, m in zip(grads_in, metas, strict=True)])
            for (nxt, i), g in zip(node.next_functions, sent if isinstance(sent, tuple) else (sent,), strict=True):
                if nxt is not None:
                    incoming[nxt, i] = incoming[nxt, i] + g if (nxt, i) in incoming else g
    return grads


def _bw_stack(out):
    """An explicit stack of (node, gradient) pairs instead of recursion, zeros_like then +=: per path."""
    grads, stack = {}, [(out.grad_fn, torch.ones_like(out))]
    with torch.no_grad():
        while stack:
            node, grad = stack.pop()
            if node.name().endswith("AccumulateGrad"):
                grads.setdefault(node.variable, torch.zeros_like(node.variable))
                grads[node.variable] += grad
                continue
            sent = node(grad)
            if not isinstance(sent, tuple):
                sent = (sent,)
            stack += [(nxt, g) for (nxt, _), g in zip(node.next_functions, sent, strict=True) if nxt is not None]
    return grads


def _bw_visited(out):
    grads, seen = {}, set()

    def visit(node, grad):
        if node is None:
            return
        if hasattr(node, "variable"):
            grads[node.variable] = grads[node.variable] + grad if node.variable in grads else grad
            return
        if node in seen:
            return
        seen.add(node)
        sent = node(grad)
        for (nxt, _), g in zip(node.next_functions, (sent,) if isinstance(sent, torch.Tensor) else sent, strict=True):
            visit(nxt, g)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def _bw_plus_equals(out):
    grads = {}

    def visit(node, grad):
        if node is None:
            return
        if hasattr(node, "variable"):
            if node.variable in grads:
                grads[node.variable] += grad  # into a tensor AddBackward0 may have handed to another leaf
            else:
                grads[node.variable] = grad
            return
        sent = node(grad)
        for (nxt, _), g in zip(node.next_functions, (sent,) if isinstance(sent, torch.Tensor) else sent, strict=True):
            visit(nxt, g)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def _bw_engine_plus_equals(out):
    """The engine's algorithm, summing into the buffer in place."""
    grads_ = {}
    deps, seen, todo = {}, {out.grad_fn}, [out.grad_fn]
    while todo:
        for child, _ in todo.pop().next_functions:
            if child is not None:
                deps[child] = deps.get(child, 0) + 1
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
    slots, ready = {out.grad_fn: {0: torch.ones_like(out)}}, [out.grad_fn]
    with torch.no_grad():
        while ready:
            node = ready.pop()
            box = slots.pop(node)
            if hasattr(node, "variable"):
                grads_[node.variable] = box[0]
                continue
            sent = node(*[box[i] if i in box else _zeros(m) for i, m in enumerate(node._input_metadata)])
            for (child, i), g in zip(node.next_functions, sent if isinstance(sent, tuple) else (sent,), strict=True):
                if child is None:
                    continue
                b = slots.setdefault(child, {})
                if i in b:
                    b[i] += g
                else:
                    b[i] = g
                deps[child] -= 1
                if deps[child] == 0:
                    ready.append(child)
    return grads_


def _bw_bound_grad(out):
    """torch.autograd.grad through a name bound when this module was imported: no patch reaches it."""
    leaves = [n.variable for n in _all_nodes(out) if hasattr(n, "variable")]
    return dict(zip(leaves, grad_bound_at_import(out, leaves, retain_graph=True), strict=True))


def _bw_bound_backward(out):
    leaves = [n.variable for n in _all_nodes(out) if hasattr(n, "variable")]
    backward_bound_at_import(out)
    return {leaf: leaf.grad.clone() for leaf in leaves}


def _all_nodes(out):
    found, stack = {}, [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and id(node) not in found:
            found[id(node)] = node
            stack += [n for n, _ in node.next_functions]
    return list(found.values())


CH01_Q5 = {
    "right": {
        "the engine: ready nodes from a stack, zeros for unreached slots": lambda: _engine(),
        "the engine: ready nodes from a queue, None for unreached slots":
            lambda: _engine(order="queue", missing="none"),
        "the engine: a heap by sequence number, as the real engine orders them": lambda: _engine(order="heap"),
        "the engine: one flat dict keyed by (node, input_nr)": lambda: _engine(flat=True),
        "the engine, grad mode on (the gradients carry a grad_fn)": lambda: _engine(grad_mode=True),
        "a topological order (depth-first), a slot per input_nr": lambda: _bw_topological,
    },
    "wrong": {
        "per path, recursive, under no_grad (the old model answer)": lambda: _bw(),
        "per path, an explicit stack, zeros_like then +=": lambda: _bw_stack,
        "per path, grad mode on": lambda: _bw(grad_mode=True),
        "a visited set: each inner node entered once": lambda: _bw_visited,
        "per path, grads[leaf] += g": lambda: _bw_plus_equals,
        "the engine, summing in place (+=)": lambda: _bw_engine_plus_equals,
        "engine order, one gradient per node (no slots)": lambda: _bw_topological_one_slot,
        "torch.autograd.grad bound before the check": lambda: _bw_bound_grad,
        "torch.autograd.backward bound before the check": lambda: _bw_bound_backward,
        "starts from a zero gradient": lambda: _bw(start=0.0),
        "starts from 2": lambda: _bw(start=2.0),
        "signs flipped (a descent step, not a gradient)": lambda: _bw(sign=-1.0),
        "keyed by id(leaf)": lambda: _bw(key=id),
        "keyed by the AccumulateGrad node": lambda: _bw(leaf_of=lambda n: n if hasattr(n, "variable") else None),
        "follows only the first input of each node": lambda: _bw(first_input_only=True),
        "does not skip None inputs": lambda: _bw(skip_none=False),
    },
}
SIMULATION[("ch01", "q5")] = CH01_Q5

# ------------------------------------------------------------------------------ ch01 q6, ch02 q5, ch03 q6 (deep dives)


def _vjp_backward(f, x, u):
    f(x).backward(gradient=u)
    return x.grad


def _vjp_rows(f, x, u):
    """The Jacobian row by row (one backward pass per output), then u^T J."""
    y = f(x)
    rows = [torch.autograd.grad(y[i], x, retain_graph=True)[0] for i in range(len(y))]
    return u @ torch.stack(rows)


CH01_Q6 = {
    "right": {
        "backward(gradient=u), then x.grad": lambda: _vjp_backward,
        "torch.autograd.functional.vjp": lambda: lambda f, x, u: torch.autograd.functional.vjp(f, x, u)[1],
        "torch.func.vjp": lambda: lambda f, x, u: torch.func.vjp(f, x)[1](u)[0],
        "grad of a dot product": lambda: lambda f, x, u: torch.autograd.grad(torch.dot(f(x), u), x)[0],
        "grad of (f(x) * u).sum()": lambda: lambda f, x, u: torch.autograd.grad((f(x) * u).sum(), x)[0],
    },
    "wrong": {
        "the Jacobian from torch.func.jacrev, then u @ J": lambda: lambda f, x, u: u @ torch.func.jacrev(f)(x),
        "the Jacobian row by row, then u @ J": lambda: _vjp_rows,
        "f(x) * u, not differentiated": lambda: lambda f, x, u: (f(x) * u).detach(),
        "the gradient of f(x).sum() times u.sum()":
            lambda: lambda f, x, u: torch.autograd.grad(f(x).sum(), x)[0] * u.sum(),
        "half of it": lambda: lambda f, x, u: torch.autograd.grad(f(x), x, grad_outputs=u)[0] / 2,
        "u reversed": lambda: lambda f, x, u: torch.autograd.grad(f(x), x, grad_outputs=u.flip(0))[0],
    },
}
SIMULATION[("ch01", "q6")] = CH01_Q6


def _groups(rule=lambda name, p: p.ndim >= 2, wd0=0.0, source="parameters", out=list, keys=("params", "weight_decay")):
    def param_groups(model, weight_decay):
        decay, no_decay = [], []
        pairs = model.named_parameters() if source == "named" else (
            model.named_parameters(remove_duplicate=False) if source == "all" else
            ((None, p) for p in model.parameters()))
        for name, p in pairs:
            (decay if rule(name, p) else no_decay).append(p)
        return out([{keys[0]: decay, keys[1]: weight_decay}, {keys[0]: no_decay, keys[1]: wd0}])

    return param_groups


def _groups_by_type(model, weight_decay):
    """By module type: Linear, Conv and Embedding weights decay; everything else not."""
    decay, seen = [], set()
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d | nn.Embedding):
            if id(module.weight) not in seen:
                seen.add(id(module.weight))
                decay.append(module.weight)
    no_decay = [p for p in model.parameters() if id(p) not in seen]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


CH02_Q5 = {
    "right": {
        "named_parameters (which de-duplicates too)": lambda: _groups(source="named"),
        "a tuple of groups": lambda: _groups(out=tuple),
        "by module type": lambda: _groups_by_type,
        "dim() > 1": lambda: _groups(rule=lambda n, p: p.dim() > 1),
        "no-decay group first": lambda: lambda model, wd: _groups()(model, wd)[::-1],
        "generators, not lists": lambda: lambda model, wd: [
            {"params": (p for p in model.parameters() if p.ndim >= 2), "weight_decay": wd},
            {"params": (p for p in model.parameters() if p.ndim < 2), "weight_decay": 0.0}],
    },
    "wrong": {
        "every name ending in 'weight' decayed":
            lambda: _groups(rule=lambda n, p: n.endswith("weight"), source="named"),
        "the tied weight once per name": lambda: _groups(source="all"),
        "no group for the rest": lambda: lambda model, wd: [{"params": [p for p in model.parameters() if p.ndim >= 2],
                                                              "weight_decay": wd}],
        "the rest decayed at half the rate": lambda: _groups(wd0=0.05),
        "everything in one group": lambda: lambda model, wd: [{"params": list(model.parameters()), "weight_decay": wd}],
        "a dict of name -> parameter": lambda: lambda model, wd: dict(model.named_parameters()),
    },
}
SIMULATION[("ch02", "q5")] = CH02_Q5


def _split(kind):
    def train_val_split(dataset, val_fraction, seed):
        n = len(dataset)
        k = int(n * val_fraction)
        g = torch.Generator().manual_seed(seed)
        if kind == "fractions":
            return torch.utils.data.random_split(dataset, [1 - val_fraction, val_fraction], generator=g)
        if kind == "randperm":
            order = torch.randperm(n, generator=g).tolist()
            return Subset(dataset, order[k:]), Subset(dataset, order[:k])
        if kind == "numpy":
            order = np.random.default_rng(seed).permutation(n).tolist()
            return [Subset(dataset, order[k:]), Subset(dataset, order[:k])]
        if kind == "random":
            order = list(range(n))
            random.Random(seed).shuffle(order)
            return Subset(dataset, order[:n - k]), Subset(dataset, order[n - k:])
        if kind == "sorted":
            order = torch.randperm(n, generator=g).tolist()
            return Subset(dataset, sorted(order[k:])), Subset(dataset, sorted(order[:k]))
        if kind == "global_numpy":
            order = np.random.permutation(n).tolist()
            return Subset(dataset, order[k:]), Subset(dataset, order[:k])
        if kind == "overlap":
            order = torch.randperm(n, generator=g).tolist()
            return Subset(dataset, order[k - 1:]), Subset(dataset, order[:k])
        if kind == "ceil":
            k2 = -(-n * 100 * int(val_fraction * 100) // 10000)
            order = torch.randperm(n, generator=g).tolist()
            return Subset(dataset, order[k2:]), Subset(dataset, order[:k2])
        if kind == "first":
            order = torch.randperm(n, generator=g).tolist()
            return Subset(dataset, order[:n - k]), Subset(dataset, order[:k])
        if kind == "seed_plus_global":
            torch.manual_seed(seed)
            return torch.utils.data.random_split(dataset, [n - k, k])
        if kind == "random_seed":
            order = list(range(n))
            random.seed(seed)
            random.shuffle(order)
            return Subset(dataset, order[k:]), Subset(dataset, order[:k])
        if kind == "numpy_seed":
            np.random.seed(seed)
            order = np.random.permutation(n).tolist()
            return Subset(dataset, order[k:]), Subset(dataset, order[:k])
        if kind == "forked":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return torch.utils.data.random_split(dataset, [n - k, k])
        raise AssertionError(kind)

    return train_val_split


CH03_Q6 = {
    "right": {k: (lambda k=k: _split(k)) for k in ("fractions", "randperm", "numpy", "random", "sorted", "forked")},
    "wrong": {
        "numpy's global generator": lambda: _split("global_numpy"),
        "train and val overlap by one": lambda: _split("overlap"),
        "val rounded up": lambda: _split("ceil"),
        "val drawn from the same front as train": lambda: _split("first"),
        "torch.manual_seed(seed), then the global generator": lambda: _split("seed_plus_global"),
        "random.seed(seed), then random.shuffle": lambda: _split("random_seed"),
        "np.random.seed(seed), then np.random.permutation": lambda: _split("numpy_seed"),
    },
}
SIMULATION[("ch03", "q6")] = CH03_Q6

# ------------------------------------------------------------------------------ the simulation


class Hang(BaseException):
    pass


def _session_state():
    return {
        "global module hooks": sum(len(getattr(nn.modules.module, d)) for d in (
            "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
            "_global_backward_hooks")),
        "torch rng": torch.get_rng_state(),
        "numpy rng": np.random.get_state()[1].copy(),
        "random state": random.getstate(),
        "grad mode": torch.is_grad_enabled(),
        "default dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
    }


def _changed(before, after):
    out = []
    for key, old in before.items():
        new = after[key]
        same = torch.equal(old, new) if isinstance(old, torch.Tensor) else (
            np.array_equal(old, new) if isinstance(old, np.ndarray) else old == new)
        if not same:
            out.append(key)
    return out


def _snapshot(answer):
    """A copy of a learner's small tensor or container, to see whether a check changed it."""
    if isinstance(answer, torch.Tensor) and answer.numel() < 10**6:
        return answer.clone()
    if isinstance(answer, list | np.ndarray):
        return [x.clone() if isinstance(x, torch.Tensor) else x for x in answer]
    return None


def _same_snapshot(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else np.array_equal(x, y)
               for x, y in zip(a, b, strict=True))


def _timed(call):
    def on_alarm(signum, frame):
        raise Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    start = time.perf_counter()
    try:
        return call(), time.perf_counter() - start
    except Hang:
        return None, time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def simulate(mod_name, q_name):
    """Every answer of the simulation for one exercise: a list of (kind, label, problem or None, message)."""
    ex = getattr(importlib.import_module(f"course_utils.exercises.{mod_name}"), q_name)
    plan = SIMULATION[(mod_name, q_name)]
    rows = []
    from course_utils.exercises import core

    limit = core.TIME_LIMIT_S
    threads_before = set(threading.enumerate())
    answers = [("right", k, f) for k, f in plan["right"].items()]
    answers += [("wrong", k, f) for k, f in plan["wrong"].items()]
    answers += [("hostile", k, f) for k, f in HOSTILE.items()] + [("hostile", "None", lambda: None)]
    for kind, label, make in answers:
        answer = make()
        snap = _snapshot(answer)
        torch.manual_seed(1234)
        before = _session_state()
        core.TIME_LIMIT_S = HOSTILE_LIMIT_S if kind == "hostile" else limit
        try:
            result, took = _timed(lambda answer=answer: ex.check(answer))
        finally:
            core.TIME_LIMIT_S = limit
        changed = _changed(before, _session_state())
        problem = None
        if result is None:
            problem = f"hang (no verdict after {HANG_S:.0f} s)"
        elif kind == "right" and result.status != "correct":
            problem = f"false Incorrect: {result.message}"
        elif kind == "wrong" and (result.status != "incorrect" or len(result.message) < 20):
            problem = f"false {result.status}: {result.message}"
        elif kind == "hostile" and result.status == "correct":
            problem = "hostile answer called Correct"
        elif kind == "hostile" and label == "None" and result.status != "not_attempted":
            problem = f"None is not 'not attempted': {result.message}"
        elif took > SLOW_S:
            problem = f"slow: {took:.1f} s"
        elif changed:
            problem = f"side effect: changed {', '.join(changed)}"
        elif snap is not None and not _same_snapshot(snap, answer):
            problem = "side effect: changed the learner's answer"
        rows.append((kind, label, problem, "" if result is None else f"{result.status}: {result.message}"))
    time.sleep(0.2)
    running = [t.name for t in threading.enumerate()
               if t not in threads_before and t.is_alive() and not _asleep(t.native_id)]
    rows.append(("threads", "left running",
                 f"threads still running after the checks: {running}" if running else None, ""))
    for what in ("hint", "solution"):
        before = _session_state()
        getattr(ex, what)()
        changed = _changed(before, _session_state())
        rows.append(("display", what, f"side effect: changed {', '.join(changed)}" if changed else None, ""))
    return rows


@pytest.fixture
def short_limit():
    from course_utils.exercises import core

    old = getattr(core, "TIME_LIMIT_S", None)
    core.TIME_LIMIT_S = LIMIT_S
    yield
    if old is not None:
        core.TIME_LIMIT_S = old


def test_every_exercise_is_simulated():
    listed = {(mod, name) for mod, exs in all_exercises().items()
              for name in (f"q{i}" for i in range(1, len(exs) + 1))}
    assert listed == set(SIMULATION)
    for plan in SIMULATION.values():
        assert len(plan["right"]) >= 5 and len(plan["wrong"]) >= 5


def test_simulated_mistakes_are_not_the_declared_ones():
    """The simulation's mistakes must be new to the checker: none is the same object as a declared one."""
    declared = {id(m) for exs in all_exercises().values() for ex in exs for m in getattr(ex, "mistakes", {}).values()}
    for plan in SIMULATION.values():
        for make in plan["wrong"].values():
            assert id(make()) not in declared


@pytest.mark.parametrize(("mod", "q"), sorted(SIMULATION), ids=[f"{m}-{q}" for m, q in sorted(SIMULATION)])
def test_simulated_learners_get_fair_bounded_verdicts_without_side_effects(mod, q, short_limit):
    problems = [f"{kind} {label!r}: {problem}" for kind, label, problem, _ in simulate(mod, q) if problem]
    assert not problems, "\n".join(problems)


if __name__ == "__main__":  # print every verdict: python tests/test_exercise_simulation.py [chNN]
    import sys

    from course_utils.exercises import core

    core.TIME_LIMIT_S = LIMIT_S
    total = found = 0
    for mod, q in sorted(SIMULATION):
        if len(sys.argv) > 1 and mod not in sys.argv[1:]:
            continue
        rows = simulate(mod, q)
        tried = sum(1 for r in rows if r[0] != "display")
        total += tried
        bad = [r for r in rows if r[2]]
        found += len(bad)
        print(f"== {mod}.{q}: {tried} answers, {len(bad)} problems")
        for kind, label, problem, _message in bad:
            print(f"   {kind:8s} {label}: {problem}")
    print(f"TOTAL {total} answers, {found} problems")
