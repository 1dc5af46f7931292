"""Helpers for chapter 01 (autograd): the x/w/b explorer, saved-tensor accounting, graph capture.

- :func:`sigmoid_example`, :func:`sigmoid_by_hand`, :func:`sigmoid_example_figure`,
  :func:`sigmoid_explorer`: the source's ``z = sigmoid(w*x + b)`` with autograd, by hand, as a
  picture and as a widget with sliders.
- :func:`count_saved_tensors`: the tensors autograd saves for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` (not process memory, which is noisy), split into
  those the program holds anyway and those kept alive only for backward.
- :class:`GraphPrinter` and :func:`fx_code`: a ``torch.compile`` backend that prints each FX
  graph Dynamo captures and runs it as is (no compiler, so it takes a second, not a minute).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "GraphPrinter",
    "SavedLog",
    "count_saved_tensors",
    "format_bytes",
    "fx_code",
    "fx_ops",
    "sigmoid_by_hand",
    "sigmoid_example",
    "sigmoid_example_figure",
    "sigmoid_example_text",
    "sigmoid_explorer",
]

GRAD_KEYS = ("dz/dx", "dz/dw", "dz/db")


# --------------------------------------------------------------------------------------------
# the source's example: z = sigmoid(w * x + b)
# --------------------------------------------------------------------------------------------


def sigmoid_example(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> dict[str, float]:
    """``y = w*x + b``, ``z = sigmoid(y)`` and the three gradients, computed by autograd."""
    xt, wt, bt = (torch.tensor([float(v)], requires_grad=True) for v in (x, w, b))
    y = wt * xt + bt
    z = torch.sigmoid(y)
    z.backward()
    return {"y": y.item(), "z": z.item(), "dz/dx": xt.grad.item(), "dz/dw": wt.grad.item(),
            "dz/db": bt.grad.item()}


def sigmoid_by_hand(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> dict[str, float]:
    """The same numbers from the chain rule, in float64: ``dz/dw = sigmoid'(y) * x`` and so on."""
    y = w * x + b
    z = 1.0 / (1.0 + math.exp(-y))
    dz_dy = z * (1.0 - z)  # sigmoid'(y) = sigmoid(y) * (1 - sigmoid(y))
    return {"y": y, "z": z, "dz/dy": dz_dy, "dz/dx": dz_dy * w, "dz/dw": dz_dy * x, "dz/db": dz_dy}


def sigmoid_example_text(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> str:
    """A small table: each quantity by hand (float64) and by autograd (float32)."""
    auto, hand = sigmoid_example(x, w, b), sigmoid_by_hand(x, w, b)
    rows = [f"x = {x:g}, w = {w:g}, b = {b:g}", f"{'':6s} {'by hand':>11s} {'autograd':>11s}"]
    for key in ("y", "z", *GRAD_KEYS):
        rows.append(f"{key:6s} {hand[key]:11.4e} {auto[key]:11.4e}")
    return "\n".join(rows)


def sigmoid_example_figure(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """The sigmoid curve with the point ``(y, z)`` and its tangent, beside the three gradients.

    Returns the matplotlib Figure (made with pyplot, so ``plt.show()`` displays it).
    """
    import matplotlib.pyplot as plt

    auto, hand = sigmoid_example(x, w, b), sigmoid_by_hand(x, w, b)
    y, z, slope = hand["y"], hand["z"], hand["dz/dy"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    lo, hi = min(-8.0, y - 2.0), max(8.0, y + 2.0)
    t = torch.linspace(lo, hi, 400, dtype=torch.float64)
    ax.plot(t.numpy(), torch.sigmoid(t).numpy(), color="#1f77b4", label="z = sigmoid(y)")
    tt = torch.linspace(y - 3.0, y + 3.0, 2, dtype=torch.float64)
    ax.plot(tt.numpy(), (z + slope * (tt - y)).numpy(), "--", color="#d62728",
            label=f"tangent at y, slope sigmoid'(y) = {slope:.3e}")
    ax.plot([y], [z], "o", color="#d62728", zorder=3)
    ax.annotate(f"y = {y:.2f}\nz = {z:.4f}", (y, z), textcoords="offset points",
                xytext=(12, -60) if z > 0.5 else (12, 45), fontsize=9,
                arrowprops=dict(arrowstyle="-", color="0.5"))
    ax.set_ylim(-0.1, 1.1)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("y = w * x + b")
    ax.set_ylabel("z = sigmoid(y)")
    ax.set_title(f"z = sigmoid(w*x + b) at x={x:g}, w={w:g}, b={b:g}")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)

    vals = [auto[k] for k in GRAD_KEYS]
    colors = ["#2ca02c" if v >= 0 else "#d62728" for v in vals]
    names = [f"{k}\n{v:.3e}" for k, v in zip(GRAD_KEYS, vals, strict=True)]
    bx.barh(names[::-1], vals[::-1], color=colors[::-1])
    span = max(abs(v) for v in vals) or 1.0
    bx.set_xlim(-1.1 * span if min(vals) < 0 else 0, 1.1 * span if max(vals) > 0 else 0.1 * span)
    bx.axvline(0, color="0.3", lw=0.8)
    bx.set_xlabel("gradient (autograd)")
    bx.set_title("dz/dx = w*s'(y), dz/dw = x*s'(y), dz/db = s'(y)")
    bx.ticklabel_format(axis="x", style="sci", scilimits=(-2, 2))
    fig.tight_layout()
    return fig


def sigmoid_explorer(x: float = 2.0, w: float = 3.0, b: float = 1.0) -> Any:
    """Sliders for x, w and b; shows z, the three gradients and the tangent (ipywidgets)."""
    import ipywidgets as widgets

    from . import show_figure

    def slider(name: str, value: float) -> Any:
        return widgets.FloatSlider(value=value, min=-10.0, max=10.0, step=0.1, description=name,
                                   continuous_update=False, readout_format=".1f")

    sx, sw, sb = slider("x", x), slider("w", w), slider("b", b)

    def show(x: float, w: float, b: float) -> None:
        print(sigmoid_example_text(x, w, b))
        show_figure(sigmoid_example_figure(x, w, b))

    out = widgets.interactive_output(show, {"x": sx, "w": sw, "b": sb})
    return widgets.VBox([widgets.HBox([sx, sw, sb]), out])


# --------------------------------------------------------------------------------------------
# what autograd keeps for backward
# --------------------------------------------------------------------------------------------


@dataclass
class SavedLog:
    """Tensors that autograd saved for backward while the context was open.

    ``count`` counts every save; ``bytes`` counts each distinct tensor once (two ops that save
    the same tensor keep one copy alive). Autograd saves a *reference*, not a copy, so a saved
    tensor costs memory only if nothing else keeps it alive. ``held_bytes`` is the part that
    shares memory with a tensor the caller said it holds anyway (the input batch, the weights);
    ``extra_bytes`` is the rest: intermediate results kept alive only for the backward pass.
    """

    count: int = 0
    bytes: int = 0
    held_bytes: int = 0
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    held_shapes: list[tuple[int, ...]] = field(default_factory=list)
    extra_shapes: list[tuple[int, ...]] = field(default_factory=list)
    _seen: set = field(default_factory=set, repr=False)
    _held: set = field(default_factory=set, repr=False)

    @property
    def extra_bytes(self) -> int:
        """Bytes of saved tensors that would have been freed without the backward pass."""
        return self.bytes - self.held_bytes

    def add(self, t: torch.Tensor) -> None:
        self.count += 1
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in self._seen:
            self._seen.add(key)
            size = t.numel() * t.element_size()
            self.bytes += size
            self.shapes.append(tuple(t.shape))
            if ptr in self._held:
                self.held_bytes += size
                self.held_shapes.append(tuple(t.shape))
            else:
                self.extra_shapes.append(tuple(t.shape))


@contextmanager
def count_saved_tensors(held: Iterable[torch.Tensor] = ()) -> Iterator[SavedLog]:
    """Count the tensors autograd saves for backward inside the ``with`` block.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: the pack hook sees every tensor an op
    saves, and returns it unchanged (nothing is copied or moved). ``held`` lists the tensors the
    program keeps anyway (inputs, parameters); a saved tensor that shares memory with one of them
    (itself, a view, a ``detach()``) counts in ``held_bytes``, everything else in ``extra_bytes``.
    """
    log = SavedLog(_held={t.untyped_storage().data_ptr() for t in held})

    def pack(t: torch.Tensor) -> torch.Tensor:
        log.add(t)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield log


def format_bytes(n: int) -> str:
    """``1536 -> '1.5 KiB'`` (binary units, one decimal)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# the dynamic graph captured as a static one
# --------------------------------------------------------------------------------------------

_CLEANUP = re.compile(r";\s+(?:\w+ = )+None$")


def fx_code(gm: Any) -> str:
    """The Python code of an FX ``GraphModule``, without blank lines and ``x = None`` clean-ups."""
    lines = []
    for line in gm.code.splitlines():
        line = _CLEANUP.sub("", line.rstrip())
        if line.strip():
            lines.append(line)
    return "\n".join(lines)


def fx_ops(gm: Any) -> list[str]:
    """The operations of an FX graph, in order (``'sin'``, ``'mul'``, ...)."""
    ops = []
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            t = node.target
            ops.append(t if isinstance(t, str) else getattr(t, "__name__", str(t)))
    return ops


class GraphPrinter:
    """A ``torch.compile`` backend that prints every FX graph Dynamo captures, then runs it as is.

        printer = GraphPrinter()
        f_compiled = torch.compile(f, backend=printer)
        f_compiled(x)          # prints the captured graph(s)
        printer.graphs         # the GraphModules, one per capture (a graph break makes two)
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self.graphs: list[Any] = []

    def __call__(self, gm: Any, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append(gm)
        if self.verbose:
            print(f"--- captured graph {len(self.graphs)}: {len(fx_ops(gm))} ops ---")
            print(fx_code(gm))
        return gm.forward
