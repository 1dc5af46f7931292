"""Look inside ``nn.Module``: counting and summaries, a miniature Module, hooks, initialisation.

Chapter 02 uses this module for

* :func:`summary` (and :func:`summarize`, :func:`format_summary`): a table of layer,
  output shape and parameter count, made with forward hooks;
* :class:`MiniModule`, :class:`MiniLinear`, :class:`MiniReLU`: the registration
  machinery of ``nn.Module`` (``__setattr__`` sorting values into parameters,
  buffers and sub-modules) re-implemented in a few dozen lines;
* :class:`ActivationRecorder` and :func:`activation_stats`: forward (and backward)
  hooks that record per-layer statistics, and remove themselves cleanly;
* :func:`init_linear_` and :func:`activation_scale_vs_depth`: how initialisation
  sets the scale of activations through a deep stack;
* :func:`build_mlp`, :func:`model_builder`, :func:`show_model_builder` and
  :func:`model_builder_widget`: the interactive model builder (the widget is a thin
  shell around the plain functions, which the unit tests call).

Importing this module has no side effects (ipywidgets and matplotlib's pyplot are
imported only by the functions that draw).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# --------------------------------------------------------------------------- counting


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters of `model` (each shared tensor counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def linear_params(in_features: int, out_features: int, bias: bool = True) -> int:
    """Parameters of ``nn.Linear(in_features, out_features)``: a weight matrix plus one bias per output."""
    return in_features * out_features + (out_features if bias else 0)


def conv2d_params(in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                  bias: bool = True, groups: int = 1) -> int:
    """Parameters of ``nn.Conv2d``: out x (in / groups) x kh x kw weights, plus one bias per output channel."""
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"groups={groups} must divide both in_channels={in_channels} and out_channels={out_channels}.")
    return out_channels * (in_channels // groups) * kh * kw + (out_channels if bias else 0)


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class SummaryRow:
    """One line of a model summary: a module that ran, its output shape and its own parameters."""

    name: str
    kind: str
    output_shape: tuple[int, ...]
    params: int
    trainable: int


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list | tuple):
        for item in x:
            t = _first_tensor(item)
            if t is not None:
                return t
    if isinstance(x, dict):
        return _first_tensor(list(x.values()))
    return None


def summarize(model: nn.Module, example_input: torch.Tensor | Sequence[torch.Tensor]) -> list[SummaryRow]:
    """Run `model` once on `example_input` and describe every module that ran and owns weights or has no children.

    The forward pass runs in eval mode under ``torch.no_grad()`` (so BatchNorm's running
    statistics are not touched and a batch of one is fine); the model's mode is restored.
    Rows come in the order the modules ran; a module that ran twice is listed once.
    """
    rows: dict[str, SummaryRow] = {}
    handles = []

    def make_hook(name: str, module: nn.Module) -> Callable:
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
            if name in rows:
                return
            t = _first_tensor(out)
            own = list(module.parameters(recurse=False))
            rows[name] = SummaryRow(
                name=name,
                kind=type(module).__name__,
                output_shape=tuple(t.shape) if t is not None else (),
                params=sum(p.numel() for p in own),
                trainable=sum(p.numel() for p in own if p.requires_grad),
            )

        return hook

    for name, module in model.named_modules():
        is_leaf = not any(True for _ in module.children())
        has_own = any(True for _ in module.parameters(recurse=False))
        if name and (is_leaf or has_own):
            handles.append(module.register_forward_hook(make_hook(name, module)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if isinstance(example_input, list | tuple):
                model(*example_input)
            else:
                model(example_input)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return list(rows.values())


def format_summary(rows: Sequence[SummaryRow], model: nn.Module | None = None) -> str:
    """Render summary rows as a fixed-width text table, with totals (taken from `model` when given)."""
    header = ("Layer (type)", "Output shape", "Param #")
    body = [(f"{r.name} ({r.kind})", str(list(r.output_shape)), f"{r.params:,}") for r in rows]
    w0 = max(len(header[0]), *(len(b[0]) for b in body)) if body else len(header[0])
    w1 = max(len(header[1]), *(len(b[1]) for b in body)) if body else len(header[1])
    w2 = max(len(header[2]), *(len(b[2]) for b in body), 11) if body else 11
    line = "-" * (w0 + w1 + w2 + 4)
    out = [line, f"{header[0]:<{w0}}  {header[1]:<{w1}}  {header[2]:>{w2}}", "=" * len(line)]
    out += [f"{a:<{w0}}  {b:<{w1}}  {c:>{w2}}" for a, b, c in body]
    out.append("=" * len(line))
    if model is not None:
        total = count_parameters(model, trainable_only=False)
        trainable = count_parameters(model, trainable_only=True)
    else:
        total = sum(r.params for r in rows)
        trainable = sum(r.trainable for r in rows)
    out.append(f"Total params: {total:,}")
    out.append(f"Trainable params: {trainable:,}")
    out.append(f"Non-trainable params: {total - trainable:,}")
    out.append(line)
    return "\n".join(out)


def summary(model: nn.Module, example_input: torch.Tensor | Sequence[torch.Tensor]) -> str:
    """A printable table (layer, output shape, parameters) for `model` run on `example_input`."""
    return format_summary(summarize(model, example_input), model)


# --------------------------------------------------------------------------- a miniature nn.Module


class MiniModule:
    """The registration machinery of ``nn.Module`` in miniature (for reading, not for training).

    Assigning an attribute goes through :meth:`__setattr__`, which files the value
    under ``_parameters`` (an ``nn.Parameter``), ``_modules`` (a ``MiniModule``) or
    ``_buffers`` (an ``nn.Buffer``, or any tensor assigned to a registered buffer's
    name). Like the real class it refuses (``TypeError``) any other value for a
    parameter's or child module's name, instead of silently unregistering it, while
    a value of a registering kind replaces whatever the name held (a Parameter even
    replaces a sub-module); anything else becomes a plain attribute. Everything else
    (``parameters()``, ``named_modules()``, ``state_dict()``) just walks those three
    dictionaries.
    """

    def __init__(self) -> None:
        # object.__setattr__ skips our own __setattr__: these dicts must exist before it can run.
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning attributes")
        if isinstance(value, nn.Parameter):
            self._forget(name)
            self._parameters[name] = value
        elif name in self._parameters:  # a parameter or child-module name accepts only its own kind (or None)
            if value is not None:
                raise self._wrong_kind(name, value, "parameter", "nn.Parameter or None")
            self._parameters[name] = None
        elif isinstance(value, MiniModule):
            self._forget(name)
            self._modules[name] = value
        elif name in self._modules:
            if value is not None:
                raise self._wrong_kind(name, value, "child module", "MiniModule or None")
            self._modules[name] = None
        elif isinstance(value, nn.Buffer):
            self.register_buffer(name, value, persistent=value.persistent)
        elif name in self._buffers:
            if value is not None and not isinstance(value, torch.Tensor):
                raise self._wrong_kind(name, value, "buffer", "Tensor or None")
            self._buffers[name] = value  # re-assigning a buffer keeps it a buffer
        else:
            self._forget(name)
            object.__setattr__(self, name, value)

    @staticmethod
    def _wrong_kind(name: str, value: Any, kind: str, expected: str) -> TypeError:
        return TypeError(f"cannot assign {type(value).__name__!r} as {kind} {name!r} ({expected} expected)")

    def _forget(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        self._non_persistent.discard(name)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        # Python calls this only when normal lookup fails: registered values live in the dicts.
        for store in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__.get(store, {})
            if name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_buffer(self, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        """A tensor that belongs to the module's state but is not trained (e.g. running statistics)."""
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def named_modules(self, prefix: str = "", memo: set[int] | None = None) -> Iterator[tuple[str, MiniModule]]:
        """This module and every sub-module, depth first, each one once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def _named(self, store: str) -> Iterator[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        for mod_name, mod in self.named_modules():
            for name, t in getattr(mod, store).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mod_name}.{name}" if mod_name else name), t

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Every parameter with its dotted name, each tensor once."""
        return self._named("_parameters")  # type: ignore[return-value]

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter, each tensor once."""
        return (p for _, p in self.named_parameters())

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every buffer (persistent or not) with its dotted name."""
        return self._named("_buffers")

    def children(self) -> Iterator[MiniModule]:
        """The direct sub-modules."""
        return (m for m in self._modules.values() if m is not None)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters and persistent buffers, by dotted name (the tensors themselves, detached)."""
        out: dict[str, torch.Tensor] = {}
        for mod_name, mod in self.named_modules():
            dot = f"{mod_name}." if mod_name else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[dot + name] = p.detach()
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent:
                    out[dot + name] = b.detach()
        return out

    def train(self, mode: bool = True) -> MiniModule:
        """Set ``training`` on this module and every sub-module."""
        for _, mod in self.named_modules():
            object.__setattr__(mod, "training", mode)
        return self

    def eval(self) -> MiniModule:
        """Same as ``train(False)``."""
        return self.train(False)

    def forward(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)  # the real one also runs hooks around this call

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items())
        return f"{type(self).__name__}({inner}\n)" if inner else f"{type(self).__name__}()"


class MiniLinear(MiniModule):
    """``y = x W^T + b`` on the miniature base class, initialised exactly like ``nn.Linear``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        ref = nn.Linear(in_features, out_features)  # borrow the real initialisation (same RNG draws)
        self.weight = nn.Parameter(ref.weight.detach().clone())
        self.bias = nn.Parameter(ref.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.bias


class MiniReLU(MiniModule):
    """ReLU on the miniature base class (no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


# --------------------------------------------------------------------------- hooks


@dataclass
class LayerStats:
    """Statistics of one module's output (and of the gradient flowing out of it, when recorded)."""

    name: str
    kind: str
    mean: float
    std: float
    frac_zero: float
    grad_norm: float | None = None


class ActivationRecorder:
    """Record per-layer output statistics with forward hooks (and gradient norms during backward).

    Use it as a context manager so the hooks are always removed::

        with ActivationRecorder(model, backward=True) as rec:
            loss = loss_fn(model(x), y)
            loss.backward()
        rec.stats  # one LayerStats per hooked module, in the order they ran

    By default every leaf module is hooked except ``nn.Flatten`` and ``nn.Identity``;
    pass `types` to hook only some kinds (``types=(nn.ReLU,)``). With ``backward=True`` the
    forward hook also puts a gradient hook on each output tensor, which records the norm of
    d loss / d output when ``backward()`` runs, for every layer and without a warning (a full
    backward hook on a first layer whose input needs no gradient warns and gets ``None``).
    """

    def __init__(self, model: nn.Module, types: tuple[type, ...] | None = None, backward: bool = False) -> None:
        self.model = model
        self.types = types
        self.backward = backward
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self._stats: dict[str, LayerStats] = {}

    def _wanted(self, name: str, module: nn.Module) -> bool:
        if not name:
            return False
        if self.types is not None:
            return isinstance(module, self.types)
        is_leaf = not any(True for _ in module.children())
        return is_leaf and not isinstance(module, nn.Flatten | nn.Identity)

    def attach(self) -> ActivationRecorder:
        """Register the hooks (idempotent)."""
        if self.handles:
            return self
        for name, module in self.model.named_modules():
            if self._wanted(name, module):
                self.handles.append(module.register_forward_hook(self._forward_hook(name)))
        return self

    def _forward_hook(self, name: str) -> Callable:
        def hook(module: nn.Module, _inp: Any, out: Any) -> None:
            t = _first_tensor(out)
            if t is None:
                return
            stats = LayerStats(
                name=name,
                kind=type(module).__name__,
                mean=t.detach().float().mean().item(),
                std=t.detach().float().std().item() if t.numel() > 1 else 0.0,
                frac_zero=(t.detach() == 0).float().mean().item(),
            )
            self._stats[name] = stats
            if self.backward and t.requires_grad:
                # A hook on the output tensor sees d loss / d output during backward(), and goes
                # away with the tensor. A module's full backward hook on a first layer whose input
                # needs no gradient also fires, but with grad_input all None and a UserWarning, and
                # it routes the output through an extra autograd Function (no in-place op after it).
                t.register_hook(self._grad_hook(stats))

        return hook

    @staticmethod
    def _grad_hook(stats: LayerStats) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            stats.grad_norm = grad.detach().float().norm().item()

        return hook

    def remove(self) -> None:
        """Remove every hook this recorder registered."""
        for h in self.handles:
            h.remove()
        self.handles.clear()

    @property
    def stats(self) -> list[LayerStats]:
        """The latest statistics of every hooked module that ran, in the order they first ran."""
        return list(self._stats.values())

    def __enter__(self) -> ActivationRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def activation_stats(model: nn.Module, x: torch.Tensor, types: tuple[type, ...] | None = None) -> list[LayerStats]:
    """Run `model` on `x` once (no gradients, current train/eval mode) and return per-layer statistics."""
    with ActivationRecorder(model, types=types) as rec, torch.no_grad():
        model(x)
    return rec.stats


def hook_count(model: nn.Module) -> int:
    """How many forward, forward-pre and backward hooks are attached anywhere in `model`."""
    total = 0
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            total += len(getattr(m, attr, {}) or {})
    return total


def format_stats(stats: Sequence[LayerStats]) -> str:
    """A fixed-precision text table of per-layer statistics."""
    if not stats:
        return "(no layer ran)"
    w = max(len("layer"), *(len(f"{s.name} ({s.kind})") for s in stats))
    has_grad = any(s.grad_norm is not None for s in stats)
    head = f"{'layer':<{w}}  {'mean':>8}  {'std':>8}  {'zeros':>6}" + (f"  {'grad norm':>10}" if has_grad else "")
    lines = [head]
    for s in stats:
        line = f"{s.name + ' (' + s.kind + ')':<{w}}  {s.mean:8.4f}  {s.std:8.4f}  {s.frac_zero:6.1%}"
        if has_grad:
            line += f"  {s.grad_norm:10.3e}" if s.grad_norm is not None else f"  {'-':>10}"
        lines.append(line)
    return "\n".join(lines)


def plot_activation_stats(stats: Sequence[LayerStats], title: str = "Activation statistics per layer"):
    """Bar charts of each layer's output std and fraction of zeros (and gradient norm, when recorded)."""
    import matplotlib.pyplot as plt

    has_grad = any(s.grad_norm is not None for s in stats)
    ncols = 3 if has_grad else 2
    fig, axes = plt.subplots(1, ncols, figsize=(4.2 * ncols, 3.6))
    labels = [f"{s.name}\n{s.kind}" for s in stats]
    pos = range(len(stats))
    colors = ["#3465a4" if s.kind in ("Linear", "Conv2d", "MiniLinear") else "#73a946" for s in stats]
    axes[0].bar(pos, [s.std for s in stats], color=colors)
    axes[0].set_ylabel("std of the layer's output")
    axes[0].set_title("spread")
    from matplotlib.patches import Patch

    axes[0].legend(handles=[Patch(color="#3465a4", label="Linear or Conv2d"),
                            Patch(color="#73a946", label="activation, norm, dropout")], fontsize=7)
    axes[1].bar(pos, [100 * s.frac_zero for s in stats], color=colors)
    axes[1].set_ylabel("outputs exactly 0 (%)")
    axes[1].set_ylim(0, 100)
    axes[1].set_title("zeros (ReLU, dropout)")
    if has_grad:
        axes[2].bar(pos, [s.grad_norm or 0.0 for s in stats], color=colors)
        axes[2].set_ylabel("norm of d loss / d output")
        axes[2].set_title("gradient (recorded during backward)")
    for ax in axes:
        ax.set_xticks(list(pos))
        ax.set_xticklabels(labels, fontsize=7 if len(stats) > 8 else 8, rotation=90 if len(stats) > 8 else 0)
        ax.set_xlabel("layer (in forward order)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- initialisation vs depth


def _init_default(m: nn.Linear) -> None:
    m.reset_parameters()


def _init_normal(std: float) -> Callable[[nn.Linear], None]:
    def init(m: nn.Linear) -> None:
        nn.init.normal_(m.weight, 0.0, std)
        nn.init.zeros_(m.bias)

    return init


def _init_xavier(m: nn.Linear) -> None:
    nn.init.xavier_normal_(m.weight)
    nn.init.zeros_(m.bias)


def _init_kaiming(m: nn.Linear) -> None:
    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    nn.init.zeros_(m.bias)


#: Initialisation schemes for ``nn.Linear`` layers, by the name the plots use.
INIT_SCHEMES: dict[str, Callable[[nn.Linear], None]] = {
    "PyTorch default": _init_default,
    "normal(0, 1)": _init_normal(1.0),
    "normal(0, 0.01)": _init_normal(0.01),
    "Xavier (Glorot)": _init_xavier,
    "Kaiming (He)": _init_kaiming,
}


def init_linear_(model: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise every ``nn.Linear`` in `model` in place with one of :data:`INIT_SCHEMES`."""
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"unknown initialisation {scheme!r}; choose one of {', '.join(INIT_SCHEMES)}.")
    fn = INIT_SCHEMES[scheme]
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                fn(m)
    return model


def activation_scale_vs_depth(scheme: str, activation: str = "tanh", depth: int = 20, width: int = 256,
                              batch: int = 256, seed: int = 0) -> list[float]:
    """How much the activations still vary from input to input after each of `depth` Linear+activation layers.

    The inputs are `batch` unit-variance random vectors. After each activation the function
    takes, for every unit, the standard deviation across the batch, and averages over the
    units: when this "signal" vanishes, every input gives the same output (whatever the biases
    add) and nothing can be learned. Runs on the CPU inside ``torch.random.fork_rng``, so the
    caller's random stream is untouched. The weights are drawn in float32 (the default) and the
    forward pass runs in float64: twenty layers amplify float32 rounding, whose last bits depend on
    the CPU's vector instructions, into the fourth digit.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), ACTIVATIONS[activation]()]
        net = nn.Sequential(*layers)
        init_linear_(net, scheme)
        x = torch.randn(batch, width).double()
    net = net.double()
    stds = []
    with torch.no_grad():
        for layer in net:
            x = layer(x)
            if not isinstance(layer, nn.Linear):
                stds.append(x.std(dim=0).mean().item())
    return stds


def init_depth_results(schemes: Sequence[str] | None = None, activations: Sequence[str] = ("tanh", "relu"),
                       depth: int = 20, width: int = 256) -> dict[str, dict[str, list[float]]]:
    """``results[activation][scheme]`` = :func:`activation_scale_vs_depth` for every combination."""
    schemes = list(schemes or INIT_SCHEMES)
    return {act: {s: activation_scale_vs_depth(s, act, depth=depth, width=width) for s in schemes}
            for act in activations}


def plot_init_vs_depth(results: dict[str, dict[str, list[float]]] | None = None, width: int = 256):
    """One panel per activation: the signal's std (log scale) against depth, one line per init scheme.

    `results` comes from :func:`init_depth_results` (computed here with its defaults when omitted).
    """
    import matplotlib.pyplot as plt

    results = results or init_depth_results(width=width)
    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 3.9), squeeze=False)
    for ax, (act, by_scheme) in zip(axes[0], results.items(), strict=True):
        depth = 0
        for scheme, stds in by_scheme.items():
            depth = len(stds)
            ax.plot(range(1, depth + 1), [max(v, 1e-30) for v in stds], marker="o", ms=3, label=scheme)
        ax.set_yscale("log")
        ax.set_xticks(range(0, depth + 1, 5 if depth > 10 else 1))
        ax.set_xlabel("layer (depth)")
        ax.set_ylabel("std across inputs (log scale)")
        ax.set_title(f"{depth} x [Linear({width}, {width}) + {act}]")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("How initialisation sets the scale of the signal through depth")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- model builder

#: Activations the builder offers.
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
#: Normalisations the builder offers.
NORMS = ("none", "batchnorm", "layernorm")
#: The builder's starting values (the widget's defaults and the static view below it).
BUILDER_DEFAULTS: dict[str, Any] = {"depth": 3, "width": 128, "activation": "relu", "dropout": 0.2, "norm": "none"}


def _check_builder_args(depth: int, width: int, activation: str, dropout: float, norm: str) -> None:
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"depth is the number of hidden layers: a whole number >= 0, not {depth!r}.")
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"width is the number of units per hidden layer: a whole number >= 1, not {width!r}.")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not offered; choose one of {', '.join(ACTIVATIONS)}.")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout is a probability of zeroing a unit: 0 <= p < 1, not {dropout!r}.")
    if norm not in NORMS:
        raise ValueError(f"norm {norm!r} is not offered; choose one of {', '.join(NORMS)}.")


def build_mlp(depth: int, width: int, activation: str = "relu", dropout: float = 0.0, norm: str = "none",
              in_features: int = 784, out_features: int = 10) -> nn.Sequential:
    """Flatten, then `depth` blocks of Linear -> [norm] -> activation -> [Dropout], then a Linear head."""
    _check_builder_args(depth, width, activation, dropout, norm)
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = in_features
    for _ in range(depth):
        layers.append(nn.Linear(fan_in, width))
        if norm == "batchnorm":
            layers.append(nn.BatchNorm1d(width))
        elif norm == "layernorm":
            layers.append(nn.LayerNorm(width))
        layers.append(ACTIVATIONS[activation]())
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        fan_in = width
    layers.append(nn.Linear(fan_in, out_features))
    return nn.Sequential(*layers)


def mlp_param_formula(depth: int, width: int, norm: str = "none", in_features: int = 784,
                      out_features: int = 10) -> int:
    """Parameters of :func:`build_mlp` by the formula (no model built): Linear layers plus 2 per normalised unit."""
    if depth == 0:
        return linear_params(in_features, out_features)
    total = linear_params(in_features, width) + (depth - 1) * linear_params(width, width)
    total += linear_params(width, out_features)
    if norm in ("batchnorm", "layernorm"):
        total += depth * 2 * width  # a scale (gamma) and a shift (beta) per unit
    return total


@dataclass
class BuilderResult:
    """What the model builder shows: the model, its summary rows, its size and its activation statistics."""

    model: nn.Sequential
    rows: list[SummaryRow]
    n_params: int
    formula: int
    stats: list[LayerStats] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def model_builder(depth: int = BUILDER_DEFAULTS["depth"], width: int = BUILDER_DEFAULTS["width"],
                  activation: str = BUILDER_DEFAULTS["activation"], dropout: float = BUILDER_DEFAULTS["dropout"],
                  norm: str = BUILDER_DEFAULTS["norm"], x: torch.Tensor | None = None, seed: int = 0) -> BuilderResult:
    """Build the MLP the settings describe and measure it; the widget's whole logic.

    `x` is a batch of inputs ``[N, 1, 28, 28]`` (default: 256 seeded uniform-noise images).
    Activation statistics come from one forward pass in training mode (dropout active,
    BatchNorm using the batch's statistics), at initialisation. Everything random happens
    inside ``torch.random.fork_rng`` with `seed`, so the result is reproducible and the
    caller's random stream is not disturbed.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_mlp(depth, width, activation, dropout, norm)
        if x is None:
            x = torch.rand(256, 1, 28, 28)
        if x.shape[0] < 2 and norm == "batchnorm":
            raise ValueError("BatchNorm in training mode needs a batch of at least 2 inputs.")
        rows = summarize(model, x[:1])
        model.train()
        stats = activation_stats(model, x)
    return BuilderResult(
        model=model,
        rows=rows,
        n_params=count_parameters(model),
        formula=mlp_param_formula(depth, width, norm),
        stats=stats,
        settings={"depth": depth, "width": width, "activation": activation, "dropout": dropout, "norm": norm},
    )


def format_builder(result: BuilderResult) -> str:
    """The builder's text view: settings, summary table, parameter count (checked against the formula), stats."""
    s = result.settings
    head = (f"depth={s['depth']} width={s['width']} activation={s['activation']} "
            f"dropout={s['dropout']:.2f} norm={s['norm']}")
    check = "matches" if result.n_params == result.formula else "DOES NOT match"
    return "\n".join([
        head,
        format_summary(result.rows, result.model),
        f"parameters: {result.n_params:,} ({check} the formula: {result.formula:,})",
        "",
        "activation statistics (one training-mode forward pass at initialisation):",
        format_stats(result.stats),
    ])


def show_model_builder(depth: int = BUILDER_DEFAULTS["depth"], width: int = BUILDER_DEFAULTS["width"],
                       activation: str = BUILDER_DEFAULTS["activation"], dropout: float = BUILDER_DEFAULTS["dropout"],
                       norm: str = BUILDER_DEFAULTS["norm"], x: torch.Tensor | None = None,
                       plot: bool = True) -> BuilderResult:
    """Print the builder's text view and draw its activation statistics (the widget's static twin)."""
    result = model_builder(depth, width, activation, dropout, norm, x=x)
    print(format_builder(result))
    if plot:
        from .figures import show_figure

        show_figure(plot_activation_stats(result.stats, title=f"{depth} hidden layers of {width}, {activation}, "
                                                              f"dropout {dropout:.2f}, norm: {norm}"))
    return result


def model_builder_widget(x: torch.Tensor | None = None):
    """An ipywidgets model builder: sliders and menus on top, the builder's view below."""
    import ipywidgets as widgets

    d = BUILDER_DEFAULTS
    controls = {
        "depth": widgets.IntSlider(value=d["depth"], min=0, max=12, description="depth"),
        "width": widgets.Dropdown(options=[16, 32, 64, 128, 256, 512], value=d["width"], description="width"),
        "activation": widgets.Dropdown(options=list(ACTIVATIONS), value=d["activation"], description="activation"),
        "dropout": widgets.FloatSlider(value=d["dropout"], min=0.0, max=0.8, step=0.05, description="dropout"),
        "norm": widgets.Dropdown(options=list(NORMS), value=d["norm"], description="norm"),
    }
    out = widgets.Output()

    def redraw(_change: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            show_model_builder(**{k: c.value for k, c in controls.items()}, x=x)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([widgets.HBox(list(controls.values())[:3]), widgets.HBox(list(controls.values())[3:]), out])
    return box

