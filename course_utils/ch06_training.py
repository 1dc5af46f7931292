"""Chapter 06 (pitfalls), what the chapter trains: the digits as tensors, a training run of a few steps
(``train_briefly``), the size of an autograd graph, and the switchboard (one small training run with any
mistakes switched on, its figure, summary and widget). Used in sections 1, 3, 10 and 11 ("The pitfall
switchboard") of notebook 06, through ``course_utils.ch06_pitfalls``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .device import one_main_thread
from .figures import COLORS, describe_figure, pyplot, show_figure, widget_callback
from .i18n import table, tr

# ---------------------------------------------------------------------------------------------
# Data, a short training run, the size of an autograd graph
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The course's digits, flattened: (x_train, y_train, x_test, y_test). Never modified."""
    from .data import digits_tensors

    (x, y), (xt, yt) = digits_tensors("train"), digits_tensors("test")
    return x.flatten(1), y, xt.flatten(1), yt


def batches(n: int, batch_size: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """`steps` mini-batches of indices into `n` items, reshuffled every pass (a seeded generator)."""
    g = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    perm, pos = torch.randperm(n, generator=g), 0
    while len(out) < steps:
        if pos + batch_size > n:
            perm, pos = torch.randperm(n, generator=g), 0
        out.append(perm[pos : pos + batch_size])
        pos += batch_size
    return out


@dataclass
class LayerRun:
    n_params: int  # parameters the optimizer sees
    losses: list[float]
    same_input_diff: float  # max |f(x) - f(x)|, the same 8 images twice


def train_briefly(model: nn.Module, steps: int = 40, lr: float = 0.1, batch: int = 64) -> LayerRun:
    """A few plain SGD steps on the digits; what the optimizer saw, the losses, and repeatability."""
    x, y, _, _ = _digits()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    with one_main_thread():  # tiny model: one thread is fastest, and core counts do not matter
        for idx in batches(len(x), batch, steps):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():
            diff = (model(x[:8]) - model(x[:8])).abs().max().item()
    return LayerRun(sum(p.numel() for p in model.parameters()), losses, diff)


def graph_size(t: Any) -> tuple[int, int]:
    """(nodes, bytes of saved tensors) of the autograd graph that `t` keeps alive; (0, 0) for a float.

    Walks ``grad_fn.next_functions`` and reads each node's ``_saved_*`` properties (which the
    generated Python bindings of autograd's nodes expose); a storage is counted once.
    """
    if not isinstance(t, torch.Tensor) or t.grad_fn is None:
        return 0, 0
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except RuntimeError:  # already freed by a backward pass
                    continue
                for v in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(v, torch.Tensor) and v.numel():
                        storages[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
        stack.extend(fn for fn, _ in node.next_functions)
    return len(seen), sum(storages.values())


# ---------------------------------------------------------------------------------------------
# The switchboard: one small training run with any mistakes switched on
# ---------------------------------------------------------------------------------------------

SWITCHES = ("layer_in_forward", "no_zero_grad", "eval_without_eval", "no_train_after_eval")


def switch_label(key: str) -> str:
    """What the mistake `key` of ``SWITCHES`` is, in words (the checkbox's label)."""
    return {
        "layer_in_forward": tr("output layer created in forward()", "在 forward() 中创建输出层"),
        "no_zero_grad": tr("optimizer.zero_grad() forgotten", "忘记调用 optimizer.zero_grad()"),
        "eval_without_eval": tr("validation without model.eval() / no_grad()",
                                "验证时不用 model.eval() / no_grad()"),
        "no_train_after_eval": tr("model.train() forgotten after validation", "验证后忘记调用 model.train()"),
    }[key]


class SwitchNet(nn.Module):
    """A digits classifier with BatchNorm and Dropout; ``layer_in_forward`` plants pitfall 1."""

    def __init__(self, layer_in_forward: bool = False, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(784, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.3)
        )
        self.layer_in_forward = layer_in_forward
        self.hidden = hidden
        if not layer_in_forward:
            self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = nn.Linear(self.hidden, 10) if self.layer_in_forward else self.head
        return head(self.body(x))


@dataclass
class SwitchboardRun:
    train_loss: list[float]  # per step
    val_steps: list[int]
    val_loss: list[float]  # as the (possibly buggy) validation reported it
    final_val_loss_true: float  # the final model evaluated correctly (eval + no_grad)
    final_val_acc_true: float
    steps_in_train_mode: int
    bn_updates: int  # steps after which BatchNorm's running mean had changed
    model: nn.Module  # shared by every caller of a cached run: copy it before changing it


def _normalise(mistakes: Sequence[str] | None) -> tuple[str, ...]:
    mistakes = tuple(sorted(set(mistakes or ())))
    unknown = [m for m in mistakes if m not in SWITCHES]
    if unknown:
        raise ValueError(f"unknown mistake(s) {unknown}; choose from {sorted(SWITCHES)}")
    return mistakes


def switchboard_run(
    mistakes: Sequence[str] | None = (), steps: int = 200, eval_every: int = 20, seed: int = 0
) -> SwitchboardRun:
    """Train :class:`SwitchNet` on the digits with the given mistakes switched on (see ``SWITCHES``)."""
    return _switchboard_cached(_normalise(mistakes), steps, eval_every, seed)


@lru_cache(maxsize=64)
def _switchboard_cached(on: tuple[str, ...], steps: int, eval_every: int, seed: int):
    x, y, xt, yt = _digits()
    # Seeds torch's CPU generator (the run is on the CPU) and gives the learner's state back after.
    with one_main_thread(), torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = SwitchNet(layer_in_forward="layer_in_forward" in on)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        bn = model.body[1]
        train_loss, val_steps, val_loss = [], [], []
        in_train_mode = bn_updates = 0
        model.train()
        for step, idx in enumerate(batches(len(x), 64, steps, seed), 1):
            in_train_mode += int(model.training)
            before = bn.running_mean.clone()
            if "no_zero_grad" not in on:
                opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            bn_updates += int(not torch.equal(before, bn.running_mean))
            train_loss.append(loss.item())
            if step % eval_every == 0:
                if "eval_without_eval" in on:
                    out = model(xt)  # train mode, graph built, BatchNorm updated with test data
                else:
                    model.eval()
                    with torch.no_grad():
                        out = model(xt)
                    if "no_train_after_eval" not in on:
                        model.train()
                val_steps.append(step)
                val_loss.append(F.cross_entropy(out, yt).item())
        model.eval()
        with torch.no_grad():
            out = model(xt)
    true_loss = F.cross_entropy(out, yt).item()
    true_acc = (out.argmax(1) == yt).float().mean().item()
    return SwitchboardRun(
        train_loss, val_steps, val_loss, true_loss, true_acc, in_train_mode, bn_updates, model
    )


def switchboard_figure(mistakes: Sequence[str] | None = ("no_zero_grad",)):
    """Loss curves of the clean run and of the run with `mistakes` switched on (a matplotlib Figure)."""
    plt = pyplot()

    on = _normalise(mistakes)
    runs = [(switchboard_run(), COLORS["blue"], tr("no mistake", "无错误"))]
    if on:
        runs.append((switchboard_run(on), COLORS["vermilion"], tr("mistakes on", "打开错误")))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for run, colour, name in runs:
        smooth = np.convolve(run.train_loss, np.ones(5) / 5, mode="valid")  # moving average of 5
        ax1.plot(np.arange(5, len(run.train_loss) + 1), smooth, color=colour, label=name)
        ax2.plot(run.val_steps, run.val_loss, "o-", color=colour,
                 label=tr("{name} (as reported)", "{name}（报告值）", name=name))
    ax1.set_title(tr("Training loss (moving average of 5 steps)", "训练损失（5 步滑动平均）"))
    ax2.set_title(tr("Validation loss", "验证损失"))
    worst = runs[-1][0]
    top = max(3.0, min(10.0, max(*worst.train_loss, *worst.val_loss) * 1.05))
    for ax in (ax1, ax2):
        ax.set_xlabel(tr("step", "步数"))
        ax.set_ylabel(tr("cross-entropy loss", "交叉熵损失"))
        ax.set_ylim(0, top)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    labels = tr(", ", "；").join(switch_label(m) for m in on) or tr("none", "无")
    fig.suptitle(tr("Mistakes on: {labels}", "打开的错误：{labels}", labels=labels), fontsize=10)
    fig.tight_layout()
    title = fig.get_suptitle()
    ends = tr("; ", "；").join(
        tr("{name}: training loss {train:.3f} at the end, validation loss as reported {val:.3f}",
           "{name}：最终训练损失 {train:.3f}，报告的验证损失 {val:.3f}",
           name=name, train=run.train_loss[-1], val=run.val_loss[-1]) for run, _, name in runs)
    return describe_figure(
        fig,
        "{title}. Two line charts against the training step: the training loss (moving average of 5 steps) "
        "and the validation loss, one line per run. {ends}.",
        "{title}。两幅以训练步数为横轴的折线图：训练损失（5 步滑动平均）和验证损失，每次运行一条线。{ends}。",
        title=title, ends=ends)


def _summary_lines(rows: Sequence[tuple[str, SwitchboardRun]]) -> str:
    """One row per run; each column as wide as its heading (in terminal columns: Chinese counts two)."""
    head = [tr("final train loss", "最终训练损失"), tr("reported val loss", "报告的验证损失"),
            tr("true val loss", "真实验证损失"), tr("true val acc", "真实验证准确率"),
            tr("steps in train()", "train() 模式步数")]
    lines = [[tr("run", "运行"), *head]]
    for name, r in rows:
        losses = (r.train_loss[-1], r.val_loss[-1], r.final_val_loss_true, r.final_val_acc_true)
        lines.append([name, *(f"{v:.4f}" for v in losses), r.steps_in_train_mode])
    return "\n".join(table(lines, align="<>>>>>", sep=" ", widths=(18,)))


def switchboard_summary(mistakes: Sequence[str] | None = ("no_zero_grad",)) -> str:
    """The switchboard's numbers as text: the same run without and with the mistakes."""
    rows = [(tr("no mistake", "无错误"), switchboard_run()),
            (tr("with the mistakes", "有错误"), switchboard_run(mistakes))]
    return _summary_lines(rows)


def _row_name(key: str) -> str:
    """A mistake's row in the overview: its key in English, its label in Chinese."""
    return tr("{key}{label:.0}", "{key:.0}{label}", key=key, label=switch_label(key))


def switchboard_overview() -> str:
    """One row per mistake switched on alone, under the clean run."""
    rows = [(tr("no mistake", "无错误"), switchboard_run())]
    return _summary_lines(rows + [(_row_name(key), switchboard_run((key,))) for key in SWITCHES])


def switchboard_widget(default: Sequence[str] = ("no_zero_grad",)):
    """Checkboxes, one per mistake; the figure and numbers redraw when one is switched."""
    import ipywidgets as widgets
    from IPython.display import display

    layout = widgets.Layout(width="auto")
    boxes = {
        k: widgets.Checkbox(value=k in default, description=switch_label(k), indent=False, layout=layout)
        for k in SWITCHES
    }
    out = widgets.Output()

    @widget_callback
    def redraw(_: object = None) -> None:
        chosen = [k for k, b in boxes.items() if b.value]
        with out:
            out.clear_output(wait=True)
            show_figure(switchboard_figure(chosen))
            print(switchboard_summary(chosen))

    for b in boxes.values():
        b.observe(redraw, names="value")
    redraw()
    ui = widgets.VBox([widgets.HTML(tr("<b>Switch mistakes on and off:</b>", "<b>打开或关闭错误：</b>")),
                       *boxes.values(), out])
    display(ui)
    return ui
