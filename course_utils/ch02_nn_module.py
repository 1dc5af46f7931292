"""Chapter 02 (nn.Module): a model summary, a miniature Module, hooks, initialisation, the model builder.

The miniature Module is in ``ch02_mini``; its names are imported here, so the notebook imports everything
from this module."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn

from .ch02_mini import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    MiniLinear,
    MiniModule,
    MiniReLU,
)
from .figures import COLORS, describe_figure, pyplot, show_figure, widget_callback
from .i18n import table, text_width, tr

# --------------------------------------------------------------------------- summary


def summary(model: nn.Module, example_input: Tensor) -> str:
    """A table of layer, output shape and own parameters, from one run of `model` with forward hooks.

    A row for each module that ran and has no children or owns parameters, in the order they ran.
    The run is in eval mode without gradients (running statistics untouched); the mode is restored.
    """
    names = {
        m: n
        for n, m in model.named_modules()
        if n and (not list(m.children()) or list(m.parameters(recurse=False)))
    }
    rows: dict[str, tuple[str, str, str]] = {}

    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        out = output if isinstance(output, Tensor) else output[0]  # RNNs return tuples
        own = sum(p.numel() for p in module.parameters(recurse=False))
        label = f"{names[module]} ({type(module).__name__})"
        rows.setdefault(names[module], (label, str(list(out.shape)), f"{own:,}"))

    handles = [m.register_forward_hook(hook) for m in names]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(example_input)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    head = (tr("Layer (type)", "层（类型）"), tr("Output shape", "输出形状"), tr("Param #", "参数量"))
    lines = table([head, *rows.values()], align="<<>", widths=(0, 0, 11))
    rule = "-" * text_width(lines[0])
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    totals = [
        tr("Total params: {total:,}", "参数总数：{total:,}", total=total),
        tr("Trainable params: {trainable:,}", "可训练参数：{trainable:,}", trainable=trainable),
        tr("Non-trainable params: {value:,}", "不可训练参数：{value:,}", value=total - trainable),
    ]
    return "\n".join([rule, lines[0], "=" * len(rule), *lines[1:], "=" * len(rule), *totals, rule])


# --------------------------------------------------------------------------- hooks and per-layer statistics
# Statistics are {layer name: {"kind", "mean", "std", "zeros" (a fraction), optionally "grad"}}.


def hook_count(model: nn.Module) -> int:
    """How many forward, forward-pre, backward and backward-pre hooks are attached anywhere in `model`."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, kind)) for m in model.modules() for kind in kinds)


def format_stats(stats: dict[str, dict[str, Any]]) -> str:
    """Per-layer statistics as a table (with the gradient norms when every layer has one)."""
    labels = [f"{name} ({s['kind']})" for name, s in stats.items()]
    layer, grad = tr("layer", "层"), all("grad" in s for s in stats.values())
    heads = [layer, tr("mean", "均值"), tr("std", "标准差"), tr("zeros", "零值")]
    heads += [tr("grad norm", "梯度范数")] if grad else []
    rows = [[label, f"{s['mean']:.4f}", f"{s['std']:.4f}", f"{s['zeros']:.1%}", *([f"{s['grad']:.3e}"] if grad else [])]
            for label, s in zip(labels, stats.values(), strict=True)]
    return "\n".join(table([heads, *rows], align="<>>>>", widths=(0, 8, 8, 6, 10)))


def plot_activation_stats(stats: dict[str, dict[str, Any]], title: str):
    """Bar charts of each layer's output std and zeros (and gradient norm, when recorded)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    panels = [
        ("std", 1, tr("std of the layer's output", "该层输出的标准差"), tr("spread", "离散程度")),
        ("zeros", 100, tr("outputs exactly 0 (%)", "恰好为 0 的输出（%）"),
         tr("zeros (ReLU, dropout)", "零值（ReLU、dropout）")),
    ]
    if all("grad" in s for s in stats.values()):
        panels.append(("grad", 1, tr("norm of d loss / d output", "d loss / d output 的范数"),
                       tr("gradient (recorded during backward)", "梯度（在反向传播中记录）")))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    blue, green, many = COLORS["blue"], COLORS["orange"], len(stats) > 8
    colors = [blue if s["kind"] in ("Linear", "Conv2d") else green for s in stats.values()]
    labels = [f"{name}\n{s['kind']}" for name, s in stats.items()]
    for ax, (key, scale, ylabel, panel) in zip(axes, panels, strict=True):
        ax.bar(range(len(stats)), [scale * s[key] for s in stats.values()], color=colors)
        ax.set(ylabel=ylabel, title=panel, xlabel=tr("layer (in forward order)", "层（按前向传播的顺序）"))
        ax.set_xticks(range(len(stats)), labels, fontsize=7 if many else 8, rotation=90 if many else 0)
    axes[1].set_ylim(0, 100)
    patches = [Patch(color=blue, label=tr("Linear or Conv2d", "Linear 或 Conv2d")),
               Patch(color=green, label=tr("activation, norm, dropout", "激活函数、归一化、dropout"))]
    axes[0].legend(handles=patches, fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    layers = list(stats.items())
    spreads = tr("; ", "；").join(tr("{name} ({kind}) std {std:.3f}, {zeros:.0%} zeros",
                                    "{name}（{kind}）标准差 {std:.3f}，零值 {zeros:.0%}",
                                    name=name, kind=s["kind"], std=s["std"], zeros=s["zeros"]) for name, s in layers)
    gradient = tr(" and the norm of its gradient", "以及梯度的范数") if len(panels) == 3 else ""
    return describe_figure(
        fig,
        "{count} bar charts, one bar per layer in forward order, of each layer's output spread, "
        "its share of exact zeros{gradient}: {spreads}.",
        "{count} 个柱状图，每层一根柱子，按前向传播的顺序，"
        "画出每层输出的标准差、恰好为 0 的比例{gradient}：{spreads}。",
        count=len(panels), gradient=gradient, spreads=spreads)


# --------------------------------------------------------------------------- initialisation vs depth

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}

#: How each scheme re-draws a Linear's weight (the bias is then zeroed); None: reset_parameters().
#: ``INIT_SCHEMES`` (below) is this table with the names in the course's language.
_INIT_SCHEMES: dict[str, Callable[[Tensor], Any] | None] = {
    "PyTorch default": None,
    "normal(0, 1)": partial(nn.init.normal_, std=1.0),
    "normal(0, 0.01)": partial(nn.init.normal_, std=0.01),
    "Xavier (Glorot)": nn.init.xavier_normal_,
    "Kaiming (He)": partial(nn.init.kaiming_normal_, nonlinearity="relu"),
}


def _default_names() -> tuple[str, str]:
    return "PyTorch default", "PyTorch 默认"


def scheme_name(scheme: str) -> str:
    """An initialisation scheme's name in the course's language (``PyTorch default`` is ``PyTorch 默认``
    in Chinese; the others are formulas); the name of either language is accepted."""
    return tr("PyTorch default", "PyTorch 默认") if scheme in _default_names() else scheme


def __getattr__(name: str) -> Any:
    if name == "INIT_SCHEMES":  # read when used: the names in the course's language (``scheme_name``)
        return {scheme_name(key): init for key, init in _INIT_SCHEMES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def activation_scale_vs_depth(scheme: str, activation: str, depth: int = 20, width: int = 256) -> list[float]:
    """After each Linear+activation layer: each unit's std across 256 inputs, averaged over units.

    Seeded inside ``torch.random.fork_rng``. The weights are drawn in float32 and the forward pass
    runs in float64: twenty layers amplify float32 rounding (whose last bits depend on the CPU's
    vector instructions) into the fourth digit. The draws themselves differ in their last bits
    between CPUs with and without AVX2 (``torch.randn``'s vectorised transform rounds differently),
    so the chaotic tanh + ``normal(0, 1)`` stack changes in its third digit: print two.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential()
        for _ in range(depth):
            net.extend([nn.Linear(width, width), ACTIVATIONS[activation]()])
        english = "PyTorch default" if scheme in _default_names() else scheme
        if english not in _INIT_SCHEMES:
            raise ValueError(f"unknown initialisation scheme {scheme!r}: one of {list(_INIT_SCHEMES)}")
        init = _INIT_SCHEMES[english]
        for linear in net[::2]:
            if init is None:
                linear.reset_parameters()
            else:
                init(linear.weight)
                nn.init.zeros_(linear.bias)
        x = torch.randn(256, width).double()
    stds = []
    with torch.no_grad():
        for layer in net.double():
            x = layer(x)
            if not isinstance(layer, nn.Linear):
                stds.append(x.std(dim=0).mean().item())
    return stds


def _legend_label(scheme: str) -> str:
    return tr("PyTorch default", "PyTorch 默认初始化") if scheme in _default_names() else scheme


def plot_init_vs_depth(results: dict[str, dict[str, list[float]]], width: int = 256):
    """One panel per activation: ``results[activation][scheme]`` (log scale) against depth."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 3.9), squeeze=False)
    for ax, (act, by_scheme) in zip(axes[0], results.items(), strict=True):
        for scheme, stds in by_scheme.items():
            depths = range(1, len(stds) + 1)
            label = _legend_label(scheme)
            ax.plot(depths, [max(v, 1e-30) for v in stds], marker="o", ms=3, label=label)
        ax.set_yscale("log")
        ax.set_xticks(range(0, len(depths) + 1, 5))
        title = f"{len(depths)} x [Linear({width}, {width}) + {act}]"
        ax.set(xlabel=tr("layer (depth)", "层（深度）"),
               ylabel=tr("std across inputs (log scale)", "各输入间的标准差（对数坐标）"), title=title)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(tr("How initialisation sets the scale of the signal through depth",
                    "初始化如何决定信号随深度变化的尺度"))
    fig.tight_layout()
    ends = {act: {scheme: stds[-1] for scheme, stds in by.items()} for act, by in results.items()}
    last = tr("; ", "；").join(
        tr("{act}: {spreads}", "{act}：{spreads}", act=act, spreads=tr(", ", "，").join(
            tr("{scheme} {std:.1e}{label:.0}", "{label} {std:.1e}{scheme:.0}", scheme=k, label=_legend_label(k), std=v)
            for k, v in by.items()))
        for act, by in ends.items())
    return describe_figure(
        fig,
        "Line charts, one per activation, of the signal's spread (log scale) after each of "
        "{depth} layers, one line per initialisation; after the last layer: {last}.",
        "折线图，每种激活函数一幅，画出信号的标准差（对数坐标）随 {depth} 层逐层的变化，"
        "每种初始化一条线；最后一层之后：{last}。",
        depth=len(depths), last=last)


# --------------------------------------------------------------------------- model builder

NORMS = {"none": None, "batchnorm": nn.BatchNorm1d, "layernorm": nn.LayerNorm}
BUILDER_DEFAULTS = {"depth": 3, "width": 128, "activation": "relu", "dropout": 0.2, "norm": "none"}


def build_mlp(depth: int, width: int, activation: str, dropout: float, norm: str) -> nn.Sequential:
    """Flatten, `depth` blocks of Linear -> [norm] -> activation -> [Dropout], a Linear head (10)."""
    if activation not in ACTIVATIONS or norm not in NORMS:
        raise ValueError(
            f"activation {activation!r}, norm {norm!r}: the builder offers the activations "
            f"{list(ACTIVATIONS)} and the norms {list(NORMS)}."
        )
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(depth):
        layers.append(nn.Linear(width if i else 784, width))
        if NORMS[norm]:
            layers.append(NORMS[norm](width))
        layers.append(ACTIVATIONS[activation]())
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(width if depth else 784, 10))
    return nn.Sequential(*layers)


def mlp_param_formula(depth: int, width: int, norm: str) -> int:
    """:func:`build_mlp`'s parameters by the formula: in*out + out per Linear, 2 per normalised unit."""
    sizes = [784] + [width] * depth + [10]
    linears = sum(n_in * n_out + n_out for n_in, n_out in pairwise(sizes))
    return linears + (2 * width * depth if NORMS[norm] else 0)


def model_builder(
    depth: int, width: int, activation: str, dropout: float, norm: str, x: Tensor | None = None
) -> tuple[nn.Sequential, dict[str, dict[str, Any]]]:
    """The widget's logic: the MLP the settings describe, and each layer's output statistics.

    One training-mode pass (dropout active, BatchNorm on the batch's statistics) at initialisation
    of `x` (default: 256 uniform-noise images), seeded inside ``torch.random.fork_rng``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_mlp(depth, width, activation, dropout, norm)
        h = torch.rand(256, 1, 28, 28) if x is None else x
        stats = {}
        with torch.no_grad():
            for name, layer in model.named_children():
                h = layer(h)
                if not isinstance(layer, nn.Flatten):
                    zeros = (h == 0).float().mean().item()
                    kind = type(layer).__name__
                    stats[name] = dict(kind=kind, mean=h.mean().item(), std=h.std().item(), zeros=zeros)
    return model, stats


def _norm_name(norm: str) -> str:
    """A normalisation's name as the builder shows it ("none" in the course's language)."""
    return tr("none", "无") if norm == "none" else norm


def show_model_builder(
    depth: int, width: int, activation: str, dropout: float, norm: str, x: Tensor | None = None
) -> None:
    """Print the builder's view (summary, count against the formula, statistics) and draw it."""
    model, stats = model_builder(depth, width, activation, dropout, norm, x=x)
    n, formula = sum(p.numel() for p in model.parameters()), mlp_param_formula(depth, width, norm)
    verdict = tr("matches", "与公式一致") if n == formula else tr("DOES NOT match", "与公式不一致")
    count = tr("parameters: {n:,} ({verdict} the formula: {formula:,})", "参数量：{n:,}（{verdict}：{formula:,}）",
               n=n, verdict=verdict, formula=formula)
    print(
        f"depth={depth} width={width} activation={activation} dropout={dropout:.2f} norm={norm}\n"
        f"{summary(model, torch.zeros(1, 784))}\n{count}\n\n"
        + tr("activation statistics (one training-mode forward pass at initialisation):",
             "激活统计量（初始化时，在训练模式下做一次前向传播）：")
        + f"\n{format_stats(stats)}"
    )
    title = tr("{depth} hidden layers of {width}, {activation}, dropout {dropout:.2f}, norm: {norm}",
               "{depth} 个宽度为 {width} 的隐藏层，{activation}，dropout {dropout:.2f}，归一化：{norm}",
               depth=depth, width=width, activation=activation, dropout=dropout, norm=_norm_name(norm))
    show_figure(plot_activation_stats(stats, title))


def model_builder_widget(x: Tensor | None = None):
    """Sliders and menus on top, :func:`show_model_builder`'s view below."""
    import ipywidgets as w

    controls = {
        "depth": w.IntSlider(min=0, max=12, description=tr("depth", "深度")),
        "width": w.Dropdown(options=[16, 32, 64, 128, 256, 512], description=tr("width", "宽度")),
        "activation": w.Dropdown(options=list(ACTIVATIONS), description=tr("activation", "激活函数")),
        "dropout": w.FloatSlider(min=0.0, max=0.8, step=0.05, description="dropout"),
        "norm": w.Dropdown(options=[(_norm_name(k), k) for k in NORMS],
                           description=tr("norm", "归一化")),
    }
    out = w.Output()

    @widget_callback
    def redraw(_change: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            show_model_builder(**{name: c.value for name, c in controls.items()}, x=x)

    for name, c in controls.items():
        c.value = BUILDER_DEFAULTS[name]
        c.observe(redraw, names="value")
    redraw()
    c = list(controls.values())
    return w.VBox([w.HBox(c[:3]), w.HBox(c[3:]), out])
