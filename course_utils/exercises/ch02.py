"""Chapter 02: registration, buffers, counting parameters, hooks, and parameter groups (the deep dive on
sharing and the optimizer's structure)."""

import warnings
from collections.abc import Iterator

import torch
from torch import nn

from ..i18n import tr
from .core import Exercise, Incorrect, as_ints, as_number, as_tensor, kind, take, variant
from .probes import global_module_hooks
from .shared import module_facts


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


class _HalfFixed(ListNet):
    def __init__(self):
        nn.Module.__init__(self)
        self.first = nn.Linear(784, 64)  # registered; the other two are not
        self.layers = [self.first, nn.Linear(64, 64), nn.Linear(64, 10)]


_DROPOUT = "x = torch.nn.functional.dropout(torch.relu(layer(x)), 0.5, self.training)"

q1 = Exercise(
    "Q1",
    FixedNet,
    form=nn.Module,
    cases=lambda: [torch.rand(4, 1, 28, 28), torch.rand(3, 1, 28, 28) * 2 - 1],  # seeded
    observe=lambda cls, x: module_facts(cls, FixedNet, x),
    describe=lambda x: tr("for a batch of shape {shape}", "对于形状为 {shape} 的批次", shape=tuple(x.shape)),
    mistakes=dict(
        plain_list=ListNet,
        half_registered=_HalfFixed,
        layer_in_forward=variant(
            FixedNet, ", nn.Linear(64, 10)", "", "[:-1]", "", "self.layers[-1]", "nn.Linear(64, 10)"
        ),
        dropout_added=variant(FixedNet, "x = torch.relu(layer(x))", _DROPOUT),
    ),
)


class Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor, persistent=False)

    def forward(self, x):
        return x * self.factor


_BUFFER = 'register_buffer("factor", factor, persistent=False)'


def _scale_facts(cls, factor):
    m = cls(factor.clone())
    x = torch.linspace(-1, 1, 4 * factor.numel()).reshape(4, *factor.shape)
    x_before = x.clone()
    with torch.no_grad():
        out = as_tensor(m(x), "forward(x)")
    yield tr("the parameters", "参数"), [n for n, _ in m.named_parameters()]
    yield tr("the buffers", "缓冲区"), [n for n, _ in m.named_buffers()]
    yield "'factor' in state_dict()", "factor" in m.state_dict()
    yield "forward(x)", out.clone()
    yield tr("forward(x) leaves the caller's x as it was",
             "forward(x) 不改动调用者的 x"), torch.equal(x, x_before)
    try:  # a persistent buffer hidden by an overridden state_dict() is still expected by load_state_dict()
        cls(factor.clone()).load_state_dict(m.state_dict())
        loads = tr("works", "成功")
    except RuntimeError as exc:
        loads = str(exc).strip().splitlines()[-1].strip()
    yield tr("loading its own state_dict() into a new Scale",
             "把它自己的 state_dict() 载入一个新的 Scale"), loads
    moved = dict(m.to(torch.float64).named_buffers()).get("factor")
    buffer_dtype = tr("the buffer's dtype after .to(torch.float64)", ".to(torch.float64) 之后缓冲区的 dtype")
    yield buffer_dtype, None if moved is None else str(moved.dtype)
    with torch.no_grad():  # what forward uses must follow the module: an alias of the buffer stays behind
        half = as_tensor(m.half()(x_before.half()), "forward(x)")
    half_dtype = tr("the output's dtype after .half(), for a float16 x",
                    ".half() 之后，float16 的 x 得到的输出的 dtype")
    yield half_dtype, str(half.dtype)


class _HiddenScale(Scale):
    """A persistent buffer, hidden from state_dict() by an override."""

    def __init__(self, factor):
        nn.Module.__init__(self)
        self.register_buffer("factor", factor)

    def state_dict(self, *args, **kwargs):
        return {k: v for k, v in super().state_dict(*args, **kwargs).items() if not k.endswith("factor")}


q2 = Exercise(
    "Q2",
    Scale,
    form=nn.Module,
    cases=lambda: [torch.tensor([2.0, 3.0]), torch.tensor(0.5), torch.tensor([-1.0, 4.0, 0.25])],
    observe=_scale_facts,
    describe=lambda f: tr("for factor = {values}", "当 factor = {values} 时", values=f.tolist()),
    mistakes=dict(
        plain_attribute=variant(Scale, _BUFFER, "factor = factor"),
        persistent=variant(Scale, ", persistent=False", ""),
        parameter=variant(Scale, _BUFFER, "factor = nn.Parameter(factor, requires_grad=False)"),
        in_place=variant(Scale, "return x * self.factor", "x *= self.factor\n        return x"),
        hidden_buffer=_HiddenScale,
        alias=variant(Scale, _BUFFER, _BUFFER + "\n        self.alias = factor", "x * self.factor", "x * self.alias"),
    ),
)


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
    "Q3",
    count_q3,
    form="value",
    observe=lambda answer, _: as_number(answer, tr("your count", "你数出的个数"), whole=True),
    mistakes=dict(
        bias_on_conv2=Q3_ANSWER + 32,
        running_stats=Q3_ANSWER + 96,
        all_buffers=Q3_ANSWER + 98,
        no_batchnorm=Q3_ANSWER - 96,
        kernel_without_channels=Q3_ANSWER - 800,
        no_biases=Q3_ANSWER - 26,
    ),
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


class Residual(nn.Module):
    """A model of Q4's cases whose forward is not a chain of its leaves: one ReLU called twice, a skip."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(6, 6), nn.Linear(6, 3), nn.ReLU()

    def forward(self, x):
        h = self.act(self.fc1(x)) + x
        return self.fc2(self.act(h))


def _hook_cases():
    hidden = nn.Sequential(nn.Linear(784, 32), nn.ReLU())
    mlp = nn.Sequential(nn.Flatten(), hidden, nn.Linear(32, 10))
    x1, conv = torch.rand(5, 1, 28, 28), nn.Conv2d(1, 4, 3)
    deep = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(144, 8), nn.Tanh()))
    cnn = nn.Sequential(conv, nn.ReLU(), deep, nn.Linear(8, 3))
    return [(mlp, x1), (cnn, torch.rand(2, 1, 8, 8)), (Residual(), torch.rand(4, 6))]


def _pairs(fn, case):
    model, x = case
    with global_module_hooks() as left_global:  # a global hook left behind is noted, then removed
        out = fn(model, x)
    try:
        pairs = [(str(n), tuple(as_ints(take(s, 8)))) for n, s in take(out)]
    except (TypeError, ValueError, Incorrect):
        # the English names the type, the Chinese says what it is (一个列表)
        it = tr("{type}{kind:.0}", "{type:.0}{kind}", type=type(out).__name__, kind=kind(out))
        raise Incorrect(tr("return a list of (name, shape) pairs, e.g. [('0', (5, 784)), ...], not {it}.",
                           "请返回一个由 (name, shape) 对组成的列表，例如 [('0', (5, 784)), ...]，而不是{it}。",
                           it=it)) from None
    on_model = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return {tr("the (name, shape) pairs", "(name, shape) 对"): pairs,
            tr("the number of hooks left on the model", "模型上残留的钩子个数"): on_model,
            tr("the number of global module hooks left", "残留的全局模块钩子个数"): len(left_global.kinds)}


def _leaves_in_turn(model, x):
    """No hooks: each leaf called in turn, in the order named_modules() lists them."""
    shapes = []
    for name, module in model.named_modules():
        if not list(module.children()):
            x = module(x)
            shapes.append((name, tuple(x.shape)))
    return shapes


def _global_hook(model, x):
    """One global forward hook (every module of every model), never removed."""
    shapes, leaves = [], {m: name for name, m in model.named_modules() if not list(m.children())}

    def hook(module, inputs, output):
        if module in leaves:
            shapes.append((leaves[module], tuple(output.shape)))

    nn.modules.module.register_module_forward_hook(hook)
    model(x)
    return shapes


def _describe_q4(c):
    leaves = [n for n, m in c[0].named_modules() if not list(m.children())]
    return tr("for x of shape {shape} through a model with leaves {leaves}",
              "对于形状为 {shape} 的 x，经过叶子模块为 {leaves} 的模型时", shape=tuple(c[1].shape), leaves=leaves)


q4 = Exercise(
    "Q4",
    record_output_shapes,
    cases=_hook_cases,
    observe=_pairs,
    describe=_describe_q4,
    mistakes=dict(
        hooks_left=variant(record_output_shapes, "h.remove()", "pass"),
        input_shapes=variant(record_output_shapes, "output.shape", "inputs[0].shape"),
        late_binding=variant(record_output_shapes, "output, name=name):", "output):"),
        containers=variant(record_output_shapes, "if not list(module.children()):", "if True:"),
        global_hook=_global_hook,
        no_hooks=_leaves_in_turn,
    ),
)


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for p in model.parameters():  # each parameter once, a tied weight too (parameters() de-duplicates)
        if p.ndim >= 2:  # the weight matrices of Linear, Conv, Embedding layers
            decay.append(p)
        else:  # biases, and the scales and shifts of normalisation layers
            no_decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class TiedTagger(nn.Module):
    """Q5's model: an embedding whose weight the output layer shares, a LayerNorm, a hidden Linear with
    its bias, a BatchNorm1d."""

    def __init__(self, vocab=30, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.hidden = nn.Linear(dim, dim)
        self.bn = nn.BatchNorm1d(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # weight tying: one Parameter, two names

    def forward(self, tokens):
        h = torch.relu(self.hidden(self.norm(self.embed(tokens))))
        return self.head(self.bn(h.flatten(0, -2)))


def _groups_cases():
    convnet = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(36, 3))
    return [(TiedTagger(), 0.1), (convnet, 0.05)]


def _groups_facts(fn, case):
    model, wd = case
    names = {}
    for name, p in model.named_parameters():  # the first name of each parameter
        names.setdefault(id(p), name)
    groups = fn(model, wd)
    groups = take(groups, 20) if not isinstance(groups, dict) else [groups]
    listed, decay, given = [], {}, []
    for g in groups:
        if not isinstance(g, dict) or "params" not in g:
            raise Incorrect(tr(
                "return a list of dicts, each with a 'params' list and its 'weight_decay', not a list holding {kind}.",
                "请返回一个由 dict 组成的列表，每个 dict 有一个 'params' 列表和它的 'weight_decay'，"
                "而不是装着{kind}的列表。",
                kind=kind(g),
            ))
        params = [g["params"]] if isinstance(g["params"], torch.Tensor) else take(g["params"], 100)
        if isinstance(g["params"], Iterator):  # a generator is used up by take(): AdamW gets what it gave
            g = {**g, "params": params}
        given.append(g)
        listed += params
        for p in params:
            decay[names.get(id(p), tr("(not a parameter of the model)",
                                      "（不是模型的参数）"))] = g.get("weight_decay")
    yield tr("how many times the groups list each parameter", "各个参数在参数组中出现的次数"), sorted(
        {names.get(id(p), "?"): sum(q is p for q in listed) for p in listed}.items())
    yield tr("the parameters the groups leave out", "参数组漏掉的参数"), sorted(
        names[id(p)] for p in model.parameters() if not any(q is p for q in listed))
    yield tr("the weight decay of each parameter", "每个参数的权重衰减"), sorted(decay.items())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a duplicate within a group warns: judged by the first fact
        opt = torch.optim.AdamW(given, lr=1e-3, weight_decay=0.0)  # groups without a value get 0.0 here
    yield tr("the weight decay AdamW applies to each parameter", "AdamW 对每个参数使用的权重衰减"), sorted(
        (names[id(p)], g["weight_decay"]) for g in opt.param_groups for p in g["params"])


def _by_name(model, weight_decay):
    """Decides by the name alone: every '.bias' without decay; LayerNorm's and BatchNorm's weights decayed."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


q5 = Exercise(
    "Q5",
    param_groups,
    cases=_groups_cases,
    observe=_groups_facts,
    describe=lambda c: tr(
        "for {model} and weight_decay={weight_decay}", "对于 {model}、weight_decay={weight_decay}",
        model="TiedTagger()" if isinstance(c[0], TiedTagger)
        else tr("a small CNN with GroupNorm", "一个带 GroupNorm 的小 CNN"),
        weight_decay=c[1],
    ),
    mistakes=dict(
        tied_twice=variant(param_groups, "for p in model.parameters():",
                           "for _, p in model.named_parameters(remove_duplicate=False):"),
        norm_decayed=_by_name,
        all_decayed=variant(param_groups, '"weight_decay": 0.0}', '"weight_decay": weight_decay}'),
        swapped=variant(param_groups, "if p.ndim >= 2:", "if p.ndim < 2:"),
    ),
)


EXERCISES = [q1, q2, q3, q4, q5]
