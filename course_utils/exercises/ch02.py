"""Chapter 02 exercises: registration, buffers, counting parameters, hooks."""

from __future__ import annotations

import torch
from torch import nn

from .core import Exercise, Incorrect, NotAttempted, expect_equal

# --------------------------------------------------------------------------- Q1: fix a list-based model

Q1_PARAMS = (784 * 64 + 64) + (64 * 64 + 64) + (64 * 10 + 10)  # 55,050


class ListNet(nn.Module):
    """The broken starting point of Q1: its layers sit in a plain Python list."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


class _FixedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


class _HalfFixedNet(nn.Module):
    """A plausible mistake: the first layer is an attribute, the rest still in a list."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(784, 64)
        self.rest = [nn.Linear(64, 64), nn.Linear(64, 10)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x.flatten(1)))
        x = torch.relu(self.rest[0](x))
        return self.rest[1](x)


class _ForwardBuiltNet(nn.Module):
    """A plausible mistake: registered layers, but (re)created inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.layers[0](x.flatten(1)))
        x = torch.relu(self.layers[1](x))
        head = nn.Linear(64, 10)  # new random weights on every call
        return head(x)


def _instantiate(cls, *args):
    if isinstance(cls, nn.Module) or not callable(cls):
        raise Incorrect("pass the class itself, e.g. `q1.check(FixedNet)`, not an instance (no parentheses).")
    model = cls(*args)  # NotImplementedError from a stub becomes "not attempted"
    if not isinstance(model, nn.Module):
        raise Incorrect(f"calling it should give an nn.Module, but it gave a {type(model).__name__}.")
    return model


def _own_rng(checker):
    """Run a checker with its own seeded random stream, leaving the learner's stream untouched."""

    def wrapped(answer) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            checker(answer)

    wrapped.__doc__ = checker.__doc__
    return wrapped


@_own_rng
def _check_q1(answer) -> None:
    model = _instantiate(answer)
    n = sum(p.numel() for p in model.parameters())
    if n == 0:
        raise Incorrect(
            "model.parameters() finds no parameters at all: the layers are still in a plain Python list, "
            "which nn.Module does not look inside. Wrap the list in nn.ModuleList(...)."
        )
    if n != Q1_PARAMS:
        raise Incorrect(
            f"model.parameters() finds {n:,} parameters, but the three layers hold {Q1_PARAMS:,}: "
            "some layers are still invisible to nn.Module (kept in a plain list or dict?)."
        )
    x = torch.rand(4, 1, 28, 28)
    model.eval()
    with torch.no_grad():
        y1, y2 = model(x), model(x)
    if tuple(y1.shape) != (4, 10):
        raise Incorrect(f"for a batch of 4 images the output should have shape (4, 10), not {tuple(y1.shape)}.")
    if not torch.equal(y1, y2):
        raise Incorrect(
            "two calls on the same input gave different outputs: a layer is created inside forward(), "
            "so it gets new random weights on every call and never trains. Create every layer in __init__."
        )
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [m.weight.detach().clone() for m in model.modules() if isinstance(m, nn.Linear)]
    nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    after = [m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear)]
    if any(torch.equal(b, a) for b, a in zip(before, after, strict=True)):
        raise Incorrect("after one optimizer step some Linear layer did not change: it is not being trained.")
    model.to(torch.float64)
    with torch.no_grad():
        out = model(x.double())
    if out.dtype != torch.float64:
        raise Incorrect("after model.to(torch.float64) the output is not float64: some layer did not move.")


q1 = Exercise(
    name="Q1",
    prompt="Write `FixedNet`: the same three layers and forward as `ListNet`, registered so that "
    "`parameters()`, `.to()` and the optimizer see them.",
    checker=_check_q1,
    hints=[
        "nn.Module's __setattr__ files an attribute as a sub-module only if the value itself is an "
        "nn.Module. A Python list is not one, so nothing inside it is registered.",
        "`nn.ModuleList([...])` is an nn.Module that holds a list of modules; it indexes and iterates like a list.",
    ],
    solution_code='''
class FixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)])

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)
''',
    solve=lambda: _FixedNet,
    wrong_answers=[
        ("the unchanged list-based model", lambda: ListNet),
        ("first layer registered, the others still in a list", lambda: _HalfFixedNet),
        ("the output layer created inside forward", lambda: _ForwardBuiltNet),
    ],
)

# --------------------------------------------------------------------------- Q2: a non-persistent buffer


class _Scale(nn.Module):
    def __init__(self, factor: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("factor", factor, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class _ScalePlainAttribute(nn.Module):
    def __init__(self, factor: torch.Tensor) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class _ScalePersistent(nn.Module):
    def __init__(self, factor: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("factor", factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class _ScaleFrozenParameter(nn.Module):
    def __init__(self, factor: torch.Tensor) -> None:
        super().__init__()
        self.factor = nn.Parameter(factor, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


@_own_rng
def _check_q2(answer) -> None:
    factor = torch.tensor([2.0, 3.0])
    model = _instantiate(answer, factor.clone())
    params = [name for name, _ in model.named_parameters()]
    if params:
        raise Incorrect(
            f"the module has parameter(s) {params}: a Parameter is listed by parameters() and saved in "
            "state_dict(), even with requires_grad=False. Use self.register_buffer(...) instead."
        )
    buffers = dict(model.named_buffers())
    if "factor" not in buffers:
        raise Incorrect(
            "the module has no buffer named 'factor'. A tensor stored as a plain attribute "
            "(self.factor = t) is not registered, so .to(device) and .to(dtype) leave it behind. "
            "Use self.register_buffer('factor', t, ...)."
        )
    if "factor" in model.state_dict():
        raise Incorrect(
            "'factor' is in state_dict(), so it would be saved in every checkpoint: "
            "register it with persistent=False."
        )
    x = torch.tensor([[1.0, 1.0], [0.5, -1.0]])
    expected = x * factor
    with torch.no_grad():
        y = model(x)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (2, 2) or not torch.allclose(y, expected):
        raise Incorrect("forward(x) should return x * factor (element by element).")
    model.to(torch.float64)
    if model.factor.dtype != torch.float64:
        raise Incorrect("after .to(torch.float64) the buffer is still float32: is it registered as a buffer?")


q2 = Exercise(
    name="Q2",
    prompt="Write `Scale(nn.Module)`: `Scale(factor)` keeps the tensor `factor` as a buffer named `factor` "
    "that follows `.to()` but is not saved in `state_dict()`; `forward(x)` returns `x * self.factor`.",
    checker=_check_q2,
    hints=[
        "A buffer is module state that is not trained: `self.register_buffer(name, tensor)`.",
        "`register_buffer` has a third argument, `persistent`: with `persistent=False` the buffer moves "
        "with `.to()` but is left out of `state_dict()`.",
    ],
    solution_code='''
class Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor, persistent=False)

    def forward(self, x):
        return x * self.factor
''',
    solve=lambda: _Scale,
    wrong_answers=[
        ("a plain tensor attribute", lambda: _ScalePlainAttribute),
        ("a persistent buffer (the default)", lambda: _ScalePersistent),
        ("a Parameter with requires_grad=False", lambda: _ScaleFrozenParameter),
    ],
)

# --------------------------------------------------------------------------- Q3: count without running


def q3_architecture() -> nn.Sequential:
    """The network of Q3 (for reading; the exercise is to count its parameters by hand)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=5, padding=2),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


Q3_ANSWER = (16 * 3 * 5 * 5 + 16) + 2 * 16 + (32 * 16 * 3 * 3) + 2 * 32 + (32 * 8 * 8 * 10 + 10)  # 26,410

_Q3_MISTAKES = {
    Q3_ANSWER + 32: "you gave the second convolution a bias, but it has bias=False (a bias just before "
    "BatchNorm is useless: BatchNorm's shift does the same job).",
    Q3_ANSWER + 96: "you counted BatchNorm's running_mean and running_var: they are buffers, not parameters "
    "(the optimizer never sees them).",
    Q3_ANSWER + 98: "you counted BatchNorm's buffers (running_mean, running_var, num_batches_tracked): "
    "they are not parameters.",
    Q3_ANSWER - 96: "you left out BatchNorm: each BatchNorm2d(C) has 2*C parameters (a scale and a shift per channel).",
    Q3_ANSWER - 16 * 2 * 25: "a convolution's kernel spans every input channel: the first one has "
    "16 x 3 x 5 x 5 weights, not 16 x 5 x 5.",
    Q3_ANSWER - 16 - 10: "you left out the biases of the first convolution and of the Linear layer.",
}


def _check_q3(answer) -> None:
    if isinstance(answer, float | int) and not isinstance(answer, bool) and answer in _Q3_MISTAKES:
        raise Incorrect(f"{int(answer):,} is not right: {_Q3_MISTAKES[int(answer)]}")
    expect_equal(answer, Q3_ANSWER, "your count",
                 why="Count each layer with the formulas: Conv2d out*in*k*k (+out if it has a bias), "
                     "BatchNorm 2*C, Linear in*out+out; ReLU, pooling and Flatten have none.")


q3 = Exercise(
    name="Q3",
    prompt="Without building or running it, count the trainable parameters of `q3_architecture()` "
    "(for 3x32x32 images) and set `n_params` to that whole number.",
    checker=_check_q3,
    hints=[
        "Conv2d(in, out, k) holds out x in x k x k weights plus out biases (none with bias=False). "
        "BatchNorm2d(C) holds 2 x C parameters (weight and bias); its running statistics are buffers.",
        "Track the shape: 3x32x32 -> conv(pad 2) 16x32x32 -> pool 16x16x16 -> conv(pad 1) 32x16x16 -> "
        "pool 32x8x8 -> flatten 2048.",
    ],
    solution_code='''
n_params = (
    (16 * 3 * 5 * 5 + 16)      # Conv2d(3, 16, 5): 1,216
    + 2 * 16                   # BatchNorm2d(16): 32
    + 32 * 16 * 3 * 3          # Conv2d(16, 32, 3, bias=False): 4,608
    + 2 * 32                   # BatchNorm2d(32): 64
    + (32 * 8 * 8 * 10 + 10)   # Linear(2048, 10): 20,490
)                              # = 26,410
''',
    solve=lambda: Q3_ANSWER,
    wrong_answers=[
        ("counted BatchNorm's running statistics", lambda: Q3_ANSWER + 96),
        ("ignored bias=False", lambda: Q3_ANSWER + 32),
        ("forgot the input channels of the first kernel", lambda: Q3_ANSWER - 800),
        ("a rough guess", lambda: 26_000),
    ],
)

# --------------------------------------------------------------------------- Q4: hooks that clean up


def _hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _record_output_shapes(model: nn.Module, x: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    shapes: list[tuple[str, tuple[int, ...]]] = []
    handles = []
    for name, module in model.named_modules():
        if not list(module.children()):
            def hook(_m, _inp, out, name=name):
                shapes.append((name, tuple(out.shape)))
            handles.append(module.register_forward_hook(hook))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return shapes


def _record_no_remove(model, x):
    shapes = []
    for name, module in model.named_modules():
        if not list(module.children()):
            module.register_forward_hook(lambda _m, _i, out, name=name: shapes.append((name, tuple(out.shape))))
    model(x)
    return shapes


def _record_inputs(model, x):
    shapes = []
    handles = []
    for name, module in model.named_modules():
        if not list(module.children()):
            handles.append(module.register_forward_hook(
                lambda _m, inp, _out, name=name: shapes.append((name, tuple(inp[0].shape)))))
    model(x)
    for h in handles:
        h.remove()
    return shapes


def _record_all_modules(model, x):
    shapes = []
    handles = [m.register_forward_hook(lambda _m, _i, out, name=name: shapes.append((name, tuple(out.shape))))
               for name, m in model.named_modules()]
    model(x)
    for h in handles:
        h.remove()
    return shapes


def _q4_model() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Sequential(nn.Linear(784, 32), nn.ReLU()),
        nn.Linear(32, 10),
    )


@_own_rng
def _check_q4(answer) -> None:
    if not callable(answer):
        raise Incorrect("pass your function itself: `q4.check(record_output_shapes)`.")
    model = _q4_model()
    x = torch.rand(5, 1, 28, 28)
    got = answer(model, x)
    if got is None:
        raise NotAttempted("your function returns None: return the list of (name, shape) pairs.")
    expected = [("0", (5, 784)), ("1.0", (5, 32)), ("1.1", (5, 32)), ("2", (5, 10))]
    left = _hooks_left(model)
    try:
        got = [(str(n), tuple(int(d) for d in s)) for n, s in got]
    except (TypeError, ValueError) as exc:
        raise Incorrect("return a list of (name, shape) pairs, e.g. [('0', (5, 784)), ...].") from exc
    names = [n for n, _ in got]
    if "" in names or "1" in names:
        raise Incorrect(
            "your list includes container modules (the model itself is named '', the inner Sequential '1'): "
            "hook only leaf modules, those with no children."
        )
    if names != [n for n, _ in expected]:
        raise Incorrect(f"the layer names should be {[n for n, _ in expected]} (in the order they ran), not {names}.")
    if got != expected:
        raise Incorrect(
            f"the shapes should be {[s for _, s in expected]}, not {[s for _, s in got]}: record the "
            "output of each layer (the hook's third argument), not its input."
        )
    if left:
        raise Incorrect(
            f"after your function returned, {left} hook(s) were still attached to the model, so every later "
            "forward pass keeps recording. Keep the handles that register_forward_hook returns and call "
            ".remove() on each (in a finally: block)."
        )


q4 = Exercise(
    name="Q4",
    prompt="Write `record_output_shapes(model, x)`: run `model(x)` once and return "
    "`[(name, output_shape), ...]` for every leaf module in the order they ran, using forward hooks "
    "that are all removed before the function returns.",
    checker=_check_q4,
    hints=[
        "`for name, module in model.named_modules()` visits every module; a leaf has no children: "
        "`not list(module.children())`.",
        "A forward hook is called as `hook(module, inputs, output)`. `register_forward_hook` returns a "
        "handle: collect them and call `handle.remove()` in a `finally:` block.",
        "Inside a loop, bind the name as a default argument (`def hook(m, i, o, name=name)`), otherwise "
        "every hook sees the last name.",
    ],
    solution_code='''
def record_output_shapes(model, x):
    shapes, handles = [], []
    for name, module in model.named_modules():
        if not list(module.children()):
            def hook(module, inputs, output, name=name):
                shapes.append((name, tuple(output.shape)))
            handles.append(module.register_forward_hook(hook))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return shapes
''',
    solve=lambda: _record_output_shapes,
    wrong_answers=[
        ("hooks never removed", lambda: _record_no_remove),
        ("records input shapes", lambda: _record_inputs),
        ("hooks every module, containers too", lambda: _record_all_modules),
    ],
)

EXERCISES = [q1, q2, q3, q4]
