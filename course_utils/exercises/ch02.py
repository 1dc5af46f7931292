"""Chapter 02 exercises: registration, buffers, counting parameters, hooks."""

from __future__ import annotations

import torch
from torch import nn

from .core import Exercise, Incorrect, as_number, as_tensor, take


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


class FixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)])

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


def module_facts(cls: type, reference: type, x: torch.Tensor):
    """What a learner's model class does, next to `reference`: its parameters, its outputs on `x` with the
    reference's weights copied in (so another valid implementation passes), training, and ``.to()``."""
    model, ref = cls(), reference()
    if not isinstance(model, nn.Module):
        raise Incorrect(f"calling your class should give an nn.Module, but it gave {type(model).__name__}.")
    params = list(model.parameters())
    yield "the number of parameters that parameters() finds", sum(p.numel() for p in params)
    yield "the parameter shapes, in order", [tuple(p.shape) for p in params]
    with torch.no_grad():
        for p, r in zip(params, ref.parameters(), strict=True):
            p.copy_(r)
        model.eval()
        yield "the model's output (with the reference's weights)", as_tensor(model(x.clone()), "the output")
    model.train()
    before = [p.detach().clone() for p in params]
    torch.nn.functional.cross_entropy(model(x.clone()), torch.arange(len(x)) % 10).backward()
    torch.optim.SGD(params, lr=0.1).step()
    yield "how many parameters one SGD step leaves unchanged", sum(torch.equal(b, p) for b, p in zip(before, params, strict=True))
    with torch.no_grad():
        yield "the output dtype after .to(torch.float64)", str(model.to(torch.float64)(x.double()).dtype)


def _batches():
    return [torch.rand(4, 1, 28, 28), torch.rand(3, 1, 28, 28) * 2 - 1]  # seeded by the check


class _HalfFixed(ListNet):
    def __init__(self):
        nn.Module.__init__(self)
        self.first = nn.Linear(784, 64)  # registered; the other two are not
        self.layers = [self.first, nn.Linear(64, 64), nn.Linear(64, 10)]


def _forward_built():
    class ForwardBuilt(FixedNet):
        def forward(self, x):
            x = torch.relu(self.layers[1](torch.relu(self.layers[0](x.flatten(1)))))
            return nn.Linear(64, 10)(x)  # new random weights on every call

    return ForwardBuilt


q1 = Exercise(
    name="Q1",
    prompt="Write `FixedNet` (no constructor arguments): the same three layers and forward as `ListNet`, registered so that `parameters()`, `.to()` and the optimizer see them.",
    model_answer=FixedNet,
    form=nn.Module,
    cases=_batches,
    observe=lambda cls, x: module_facts(cls, FixedNet, x),
    describe=lambda x: f"for a batch of shape {tuple(x.shape)}",
    hints=[
        "nn.Module's __setattr__ files an attribute as a sub-module only if the value itself is an nn.Module. A Python list is not one, so nothing inside it is registered.",
        "`nn.ModuleList([...])` is an nn.Module that holds a list of modules; it indexes and iterates like a list.",
    ],
    mistakes={
        "model.parameters() finds no parameters at all: the layers are still in a plain Python list, which nn.Module does not look inside. Wrap the list in nn.ModuleList(...).": ListNet,
        "model.parameters() finds only some of the layers: the others are still in a plain Python list or dict, invisible to nn.Module. Register every layer (nn.ModuleList).": _HalfFixed,
        "a layer is created inside forward(): it gets new random weights on every call and never trains (even assigned to self, it is registered only when forward runs, and replaced on the next call). Create every layer in __init__.": _forward_built(),
    },
)


class Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor, persistent=False)

    def forward(self, x):
        return x * self.factor


def _scale_facts(cls, factor):
    m = cls(factor.clone())
    x = torch.linspace(-1, 1, 4 * factor.numel()).reshape(4, *factor.shape)
    with torch.no_grad():
        out = as_tensor(m(x), "forward(x)")
    moved = dict(m.to(torch.float64).named_buffers()).get("factor")
    return {"the parameters": [n for n, _ in m.named_parameters()], "the buffers": [n for n, _ in m.named_buffers()],
            "'factor' in state_dict()": "factor" in m.state_dict(), "forward(x)": out,
            "the buffer's dtype after .to(torch.float64)": None if moved is None else str(moved.dtype)}


def _scale_like(init):
    return type("Scale", (Scale,), {"__init__": lambda self, f: (nn.Module.__init__(self), init(self, f))[0]})


q2 = Exercise(
    name="Q2",
    prompt="Write `Scale(nn.Module)`: `Scale(factor)` keeps the tensor `factor` as a buffer named `factor` that follows `.to()` but is not saved in `state_dict()`; `forward(x)` returns `x * self.factor`.",
    model_answer=Scale,
    form=nn.Module,
    cases=lambda: [torch.tensor([2.0, 3.0]), torch.tensor(0.5), torch.tensor([-1.0, 4.0, 0.25])],
    observe=_scale_facts,
    describe=lambda f: f"for factor = {f.tolist()}",
    hints=[
        "A buffer is module state that is not trained: `self.register_buffer(name, tensor)`.",
        "`register_buffer` has a third argument, `persistent`: with `persistent=False` the buffer moves with `.to()` but is left out of `state_dict()`.",
    ],
    mistakes={
        "the module has no buffer named 'factor'. A tensor stored as a plain attribute (self.factor = t) is not registered, so .to(device) and .to(dtype) leave it behind. Use self.register_buffer('factor', t, ...).": _scale_like(lambda m, f: setattr(m, "factor", f)),
        "'factor' is in state_dict(), so it would be saved in every checkpoint: register it with persistent=False.": _scale_like(lambda m, f: m.register_buffer("factor", f)),
        "'factor' is a Parameter: it is listed by parameters() and saved in state_dict(), even with requires_grad=False. Use self.register_buffer(...) instead.": _scale_like(lambda m, f: setattr(m, "factor", nn.Parameter(f, requires_grad=False))),
    },
)


def q3_architecture() -> nn.Sequential:
    """The network of Q3 (for reading; the exercise is to count its parameters by hand)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    )


def count_q3():
    return (
        (16 * 3 * 5 * 5 + 16)  # Conv2d(3, 16, 5): 1,216
        + 2 * 16  # BatchNorm2d(16): 32
        + 32 * 16 * 3 * 3  # Conv2d(16, 32, 3, bias=False): 4,608
        + 2 * 32  # BatchNorm2d(32): 64
        + (32 * 8 * 8 * 10 + 10)  # Linear(2048, 10): 20,490
    )  # = 26,410


Q3_ANSWER = count_q3()

q3 = Exercise(
    name="Q3",
    prompt="Without building or running it, count the trainable parameters of `q3_architecture()` (for 3x32x32 images) and set `n_params` to that whole number.",
    model_answer=count_q3,
    form="value",
    observe=lambda answer, _: as_number(answer, "your count", whole=True),
    hints=[
        "Conv2d(in, out, k) holds out x in x k x k weights plus out biases (none with bias=False). BatchNorm2d(C) holds 2 x C parameters (weight and bias); its running statistics are buffers.",
        "Track the shape: 3x32x32 -> conv(pad 2) 16x32x32 -> pool 16x16x16 -> conv(pad 1) 32x16x16 -> pool 32x8x8 -> flatten 2048.",
    ],
    mistakes={
        "you gave the second convolution a bias, but it has bias=False (a bias just before BatchNorm is useless: BatchNorm's shift does the same job).": Q3_ANSWER + 32,
        "you counted BatchNorm's running_mean and running_var: they are buffers, not parameters (the optimizer never sees them).": Q3_ANSWER + 96,
        "you counted BatchNorm's buffers (running_mean, running_var, num_batches_tracked): they are not parameters.": Q3_ANSWER + 98,
        "you left out BatchNorm: each BatchNorm2d(C) has 2*C parameters (a scale and a shift per channel).": Q3_ANSWER - 96,
        "a convolution's kernel spans every input channel: the first one has 16 x 3 x 5 x 5 weights, not 16 x 5 x 5.": Q3_ANSWER - 800,
        "you left out the biases of the first convolution and of the Linear layer.": Q3_ANSWER - 26,
    },
)


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


def _hook_cases():
    return [
        (nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(784, 32), nn.ReLU()), nn.Linear(32, 10)), torch.rand(5, 1, 28, 28)),
        (nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(144, 8), nn.Tanh())),
                       nn.Linear(8, 3)), torch.rand(2, 1, 8, 8)),
    ]


def _pairs(fn, case):
    model, x = case
    out = fn(model, x)
    try:
        pairs = [(str(n), tuple(as_number(d, whole=True) for d in take(s, 8))) for n, s in take(out)]
    except (TypeError, ValueError, Incorrect):
        raise Incorrect(f"return a list of (name, shape) pairs, e.g. [('0', (5, 784)), ...], not {type(out).__name__}.") from None
    left = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return {"the (name, shape) pairs": pairs, "the number of hooks left on the model": left}


def _record(select, what, remove=True):
    def record(model, x):
        shapes = []
        handles = [m.register_forward_hook(lambda _m, i, o, name=name: shapes.append((name, tuple(what(i, o).shape))))
                   for name, m in model.named_modules() if select(m)]
        model(x)
        for h in handles if remove else ():
            h.remove()
        return shapes

    return record


q4 = Exercise(
    name="Q4",
    prompt="Write `record_output_shapes(model, x)`: run `model(x)` once and return a list of `(name, output_shape)` pairs (a shape as a tuple or torch.Size) for every leaf module in the order they ran, using forward hooks that are all removed before the function returns.",
    model_answer=record_output_shapes,
    cases=_hook_cases,
    observe=_pairs,
    describe=lambda c: f"for x of shape {tuple(c[1].shape)} through a model with leaves {[n for n, m in c[0].named_modules() if not list(m.children())]}",
    hints=[
        "`for name, module in model.named_modules()` visits every module; a leaf has no children: `not list(module.children())`.",
        "A forward hook is called as `hook(module, inputs, output)`. `register_forward_hook` returns a handle: collect them and call `handle.remove()` in a `finally:` block.",
        "Inside a loop, bind the name as a default argument (`def hook(m, i, o, name=name)`), otherwise every hook sees the last name.",
    ],
    mistakes={
        "after your function returned, hooks were still attached to the model, so every later forward pass keeps recording. Keep the handles that register_forward_hook returns and call .remove() on each (in a finally: block).": _record(lambda m: not list(m.children()), lambda i, o: o, remove=False),
        "these are the shapes of the layers' inputs: record the output of each layer (the hook's third argument).": _record(lambda m: not list(m.children()), lambda i, o: i[0]),
        "your list includes container modules (the model itself is named '', an inner Sequential '1'): hook only leaf modules, those with no children.": _record(lambda m: True, lambda i, o: o),
    },
)

EXERCISES = [q1, q2, q3, q4]
