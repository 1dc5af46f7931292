"""Chapter 06: the pitfalls of PyTorch training. The ledger of the chapter's checks, the code that
worker processes import, the ranks' flight-recorder records read side by side, and the switchboard
(one small training run with mistakes switched on)."""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from .device import one_main_thread
from .dist import single_process_group
from .figures import COLORS, describe_figure, pyplot, show_figure
from .i18n import language, pad, spaced, text_width, tr
from .models import MLP

# ---------------------------------------------------------------------------------------------
# The ledger: every check of the chapter, and the summary table built from them
# ---------------------------------------------------------------------------------------------


# The notebook's checks in Chinese: the notebook's code (the same in both editions) names each check and
# describes its results in English; the Chinese edition shows these words instead.
_ZH_CHECKS = {
    "pitfall-1": ("在 forward() 中创建层", "第 40 步的训练损失"),
    "pitfall-2": ("DDP 下使用 shuffle=True", "rank 0 的样本中 rank 1 也读到的比例"),
    "pitfall-2b": ("DistributedSampler 未调用 set_epoch", "epoch 0 与 epoch 1 中位置相同的比例"),
    "pitfall-3": ("评估时未调用 eval()/no_grad()", "测试准确率（每批 32 个）"),
    "forgot-train": ("评估后忘记调用 train()", "在训练模式下运行的训练步数"),
    "pitfall-4": ("DDP 下标签留在 CPU 上", "使用 CPU 上的标签 / 类别权重时的损失"),
    "pitfall-5": ("忘记调用 zero_grad", ".grad 范数：3 次反向传播后 / 1 次后"),
    "accumulate": ("梯度累积时 loss 未除以 k", "max |grad - 大批次 grad|"),
    "no_sync": ("DDP 下梯度累积未用 no_sync", "每个优化器步的 all-reduce 次数"),
    "retain-graph": ("用 retain_graph=True 求二阶导数", "x**3 在 x = 2 处的 d2z/dx2"),
    "rank0-eval": ("只在 rank 0 上评估 DDP 模型", "评估结果"),
    "spawn-zero": ("在 CPU 上 mp.spawn(nprocs=device_count())", "nprocs=0 时启动的进程数"),
    "spawn-notebook": ("用 mp.spawn 启动笔记本中定义的函数", "实际运行的 worker 进程数"),
    "inplace": ("对已保存的张量做原地（in-place）操作", "backward()"),
    "loss-sum": ("total += loss（而不是 loss.item()）", "40 个批次后仍被占用的 MiB"),
    "pickle": ("加载不可信的 pickle 时用 weights_only=False", "加载时恶意代码是否运行"),
    "worker-rng": ("随机数生成器对象被复制进每个 worker", "抽到重复随机数的样本比例"),
}
_ZH_RESULTS = (("hang (collective timeout)", "卡死（集合通信超时）"),
               ("device error", "设备不一致错误"), ("loss computed", "正常算出损失"),
               (" both ways", "（两种做法结果相同）"), (", no error", "，没有报错"),
               ("correct gradient", "梯度正确"))


def _fmt(value: Any) -> str:
    """A measurement as short, stable text."""
    if isinstance(value, bool):
        return tr("yes", "是") if value else tr("no", "否")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3e}" if 0 < abs(value) < 1e-3 else f"{value:,.4f}"
    text = str(value)
    for english, chinese in _ZH_RESULTS if language() == "zh-CN" else ():
        text = text.replace(english, chinese)
    return text


class PitfallLedger:
    """Records each pitfall's measurements with the bug and with the fix; ``table()`` sums them up."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, ...]] = {}  # re-checking a key replaces its row in place
        self.errors: dict[str, BaseException] = {}

    def check(
        self, key: str, title: str, measure: str, *, bug: Any, fix: Any, bug_seen: bool, fixed: bool
    ) -> None:
        """Record and print one check; raise AssertionError unless the bug showed and the fix worked."""
        ok = "pass" if bug_seen and fixed else "FAIL"
        if language() == "zh-CN":
            title, measure = _ZH_CHECKS.get(key, (title, measure))
        self.rows[key] = (title, measure, _fmt(bug), _fmt(fix), ok)
        if not bug_seen:
            raise AssertionError(tr(
                f"{title}: the bug did not happen ({measure} = {_fmt(bug)}), so this demonstration "
                "shows nothing. Did a PyTorch upgrade change this behaviour? Re-read the explanation.",
                f"{title}：bug 没有出现（{measure} = {_fmt(bug)}），所以这个演示什么也说明不了。"
                "是不是 PyTorch 升级改变了这一行为？请重读上面的解释。"
            ))
        if not fixed:
            raise AssertionError(tr(f"{title}: the fix did not work ({measure} = {_fmt(fix)}).",
                                    f"{title}：修复没有奏效（{measure} = {_fmt(fix)}）。"))
        bug, fix = _fmt(bug), _fmt(fix)
        print(tr(f"{title}: {measure}: with the bug {bug}, fixed {fix} (bug reproduced; fix works)",
                 spaced(f"{title}：{measure}：有 bug 时", bug) + "，" + spaced("修复后", fix)
                 + "。bug 已复现，修复有效。"))

    @contextlib.contextmanager
    def expect_error(
        self,
        key: str,
        error: type[BaseException],
        confirm: Callable[[BaseException], bool] | None = None,
    ) -> Iterator[None]:
        """The block must raise `error` (for the reason `confirm(exc)` checks): record it, re-raise it."""
        try:
            yield
        except error as exc:
            if confirm is not None and not confirm(exc):
                raise AssertionError(tr(
                    f"{key}: the expected {type(exc).__name__} happened, but not for the reason this "
                    f"lesson shows: {exc}",
                    f"{key}：预期的 {type(exc).__name__} 出现了，"
                    f"但原因不是本节要展示的那个：{exc}"
                )) from exc
            self.errors[key] = exc
            raise
        raise AssertionError(tr(f"{key}: expected {error.__name__}, but the code ran without error.",
                                f"{key}：预期会出现 {error.__name__}，但代码运行时没有报错。"))

    def summary(self) -> str:
        """The closing line: how many pitfalls were reproduced and fixed."""
        n = sum(row[-1] == "pass" for row in self.rows.values())
        return tr(f"{n} pitfalls reproduced and fixed", f"{n} 个误区均已复现并修复")

    @property
    def all_ok(self) -> bool:
        return bool(self.rows) and all(row[-1] == "pass" for row in self.rows.values())

    def table(self) -> str:
        """The checks as a plain-text table, in the order they were made (a verdict: pass or FAIL)."""
        head = ("#", tr("pitfall", "误区"), tr("measured", "测量项"), tr("with the bug", "有 bug 时"),
                tr("fixed", "修复后"), tr("check", "检查"))
        verdict = {"pass": tr("pass", "通过"), "FAIL": tr("FAIL", "失败")}
        rows = [head, *((str(i), *row[:-1], verdict[row[-1]])
                        for i, row in enumerate(self.rows.values(), 1))]
        widths = [max(text_width(row[c]) for row in rows) for c in range(len(head))]
        rows.insert(1, tuple("-" * w for w in widths))
        lines = ("  ".join(pad(c, w) for c, w in zip(row, widths, strict=True)) for row in rows)
        return "\n".join(line.rstrip() for line in lines)


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
# Pitfall 2's figure: which rank visits which sample, and when
# ---------------------------------------------------------------------------------------------


def sampler_figure(orders: dict[str, list[list[list[int]]]]):
    """One panel per way of building the loaders; ``orders[title][epoch][rank]`` lists the samples."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap

    first = next(iter(orders.values()))
    epochs, world_size = len(first), len(first[0])
    n = 1 + max(i for o in orders.values() for ranks in o for order in ranks for i in order)
    fig, axes = plt.subplots(1, len(orders), figsize=(4 * len(orders), 3.2), sharey=True)
    cmap = ListedColormap(["#f2f2f2", *plt.get_cmap("viridis")(np.linspace(0.1, 0.95, n))])
    for ax, (title, o) in zip(axes, orders.items(), strict=True):
        grid = np.zeros((epochs * world_size, n))  # 0: never visited; else 1 + position
        for e in range(epochs):
            for r in range(world_size):
                for pos, idx in enumerate(o[e][r]):
                    grid[e * world_size + r, idx] = pos + 1
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=n, aspect="auto")
        for (row, col), v in np.ndenumerate(grid):
            if v:
                colour = "black" if v > 0.6 * n else "white"
                ax.text(col, row, int(v) - 1, ha="center", va="center", fontsize=7, color=colour)
        for e in range(1, epochs):
            ax.axhline(e * world_size - 0.5, color="black", lw=1.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(tr("sample index", "样本索引"))
        ax.set_xticks(range(0, n, 4))
        labels = [tr(f"epoch {e}, rank {r}", f"epoch {e}，rank {r}")
                  for e in range(epochs) for r in range(world_size)]
        ax.set_yticks(range(len(labels)), labels)
    fig.suptitle(
        tr("Number in a cell = position at which that rank visits that sample; grey = never",
           "格中数字 = 该 rank 访问该样本的次序；灰色 = 从未访问"),
        fontsize=10,
    )
    fig.tight_layout()

    def visits(sep: str, word: str, colon: str = ": ", comma: str = ", ") -> str:
        return sep.join(f"{title}{colon}" + comma.join(f"epoch {e} rank {r} {word} {o[e][r]}" for e in range(epochs)
                                                       for r in range(world_size)) for title, o in orders.items())
    return describe_figure(
        fig,
        f"{len(orders)} grids, one per way of building the loaders, with a row per epoch and rank and a column "
        f"per sample; a numbered cell is a sample that rank visits, the number its position. The samples "
        f"each rank visits, in order: {visits('; ', 'visits')}.",
        f"{len(orders)} 个网格，每种构建加载器的方式一个：每个 epoch 的每个 "
        "rank 一行，每个样本一列；"
        "带数字的格子是该 rank 访问的样本，数字是访问次序。各 rank "
        f"按顺序访问的样本：{visits('；', '访问', '：', '，')}。")


# ---------------------------------------------------------------------------------------------
# Pitfall 4: a DDP forward, for tensors left on the CPU
# ---------------------------------------------------------------------------------------------




def ddp_forward(x: torch.Tensor, device: str | None = None) -> tuple[torch.Tensor, bool]:
    """The source's MLP on `x` as a DDP model on a GPU runs it: ``(output, a real DDP model?)``.

    With ``cuda``: a real one-process DDP model, which moves `x` itself. Without a GPU (or with
    ``device="meta"``) the ``meta`` device stands in for it, and `x` is moved as DDP's input
    mover does (``x.to(device)``): DDP cannot be built on ``meta``.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "meta")
    with torch.device(device):
        model = MLP()
    if device.startswith("cuda"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        with single_process_group():
            return DDP(model, device_ids=[model.fc1.weight.device.index])(x), True
    return model(x.to(device)), False


# ---------------------------------------------------------------------------------------------
# What worker processes import: mp.spawn's worker, the pickle payload, the augmenting dataset
# ---------------------------------------------------------------------------------------------


def flight_records(folder: str | os.PathLike) -> dict[int, list[dict[str, Any]]]:
    """Each rank's flight-recorder entries (``fr_rank<R>.json`` in `folder`, as
    ``scripts/pitfall_rank0_eval.py --fr-dump`` writes them), oldest first, keyed by rank."""
    records = {}
    for path in sorted(Path(folder).glob("fr_rank*.json")):
        rank = int(path.stem.removeprefix("fr_rank"))
        records[rank] = json.loads(path.read_text())["entries"]
    if not records:
        raise FileNotFoundError(f"no fr_rank<R>.json in {folder}: did the job run with --fr-dump and "
                                "TORCH_FR_BUFFER_SIZE not 0 (on by default)?")
    return records


def collective_name(entry: dict[str, Any]) -> str:
    """One flight-recorder entry as a short text: ``broadcast float32 [128]`` (the backend's prefix,
    ``gloo:`` or ``nccl:``, dropped)."""
    op = entry["profiling_name"].split(":", 1)[-1]
    dtypes = {"Float": "float32", "Long": "int64", "Double": "float64", "Int": "int32", "BFloat16": "bfloat16",
              "Half": "float16"}
    parts = [op] + [f"{dtypes.get(d, d)} {list(size)}" for d, size in zip(entry["input_dtypes"],
                                                                           entry["input_sizes"], strict=False)]
    return " ".join(parts)


def flight_table(records: dict[int, list[dict[str, Any]]], last: int = 5) -> str:
    """The last `last` sequence numbers that any rank recorded, one row each: what every rank ran
    with that number (``-``: nothing recorded)."""
    by_seq = {r: {e["collective_seq_id"]: collective_name(e) for e in entries} for r, entries in records.items()}
    seqs = sorted(set().union(*by_seq.values()))[-last:]
    ranks = sorted(by_seq)
    cells = [[str(s), *(by_seq[r].get(s, "-") for r in ranks)] for s in seqs]
    head = [tr("seq", "序号"), *(f"rank {r}" for r in ranks)]
    widths = [max(text_width(row[c]) for row in [head, *cells]) for c in range(len(head))]
    return "\n".join("  ".join(pad(c, w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [head, *cells])


def touch_worker(rank: int, world_size: int, folder: str) -> None:
    """An ``mp.spawn`` worker that child processes can import: leaves one file per rank in `folder`."""
    Path(folder, f"rank{rank}-of-{world_size}").touch()


def leave_marker(path: str) -> None:
    """What the untrusted checkpoint's payload calls: create an empty file (harmless)."""
    Path(path).touch()


class _Payload:
    """Unpickling this calls :func:`leave_marker`; an attacker would name any function (``os.system``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (leave_marker, (self.marker,))


def make_untrusted_checkpoint(folder: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``checkpoint.pt`` (a state dict plus a pickled payload) into `folder`.

    Returns ``(checkpoint path, marker path)``; the marker file appears if the payload runs.
    """
    path, marker = Path(folder, "checkpoint.pt"), Path(folder, "PAYLOAD_RAN")
    state = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    torch.save({"model": state, "meta": _Payload(str(marker))}, path)
    return path, marker


class _SourceNames:
    """:attr:`AugmentDataset.SOURCES`: the names of its random sources, in the course's language when read."""

    def __get__(self, obj: object, owner: type | None = None) -> tuple[str, ...]:
        return (tr("torch", "torch 全局生成器"), tr("random", "random 全局生成器"),
                tr("numpy global", "NumPy 全局生成器"),
                tr("numpy Generator from __init__", "在 __init__ 中创建的 NumPy Generator"))


class AugmentDataset(Dataset):
    """Per item, one "random augmentation" from each RNG a dataset might use."""

    SOURCES = _SourceNames()  # the order of each item's draws

    def __init__(self, n: int = 8, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)  # copied, in this state, into every worker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> torch.Tensor:
        draws = [torch.rand(1).item(), random.random(), np.random.rand(), self.rng.random()]
        return torch.tensor(draws, dtype=torch.float64)


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
                 label=tr(f"{name} (as reported)", f"{name}（报告值）"))
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
    fig.suptitle(tr(f"Mistakes on: {', '.join(switch_label(m) for m in on) or 'none'}",
                    f"打开的错误：{'；'.join(switch_label(m) for m in on) or '无'}"), fontsize=10)
    fig.tight_layout()
    title = fig.get_suptitle()
    ends_en = "; ".join(f"{name}: training loss {run.train_loss[-1]:.3f} at the end, validation loss as "
                        f"reported {run.val_loss[-1]:.3f}" for run, _, name in runs)
    ends_zh = "；".join(f"{name}：最终训练损失 {run.train_loss[-1]:.3f}，"
                        f"报告的验证损失 {run.val_loss[-1]:.3f}" for run, _, name in runs)
    return describe_figure(
        fig,
        f"{title}. Two line charts against the training step: the training loss (moving average of 5 steps) "
        f"and the validation loss, one line per run. {ends_en}.",
        f"{title}。两幅以训练步数为横轴的折线图：训练损失（5 步滑动平均）和验证损失，"
        f"每次运行一条线。{ends_zh}。")


def _summary_lines(rows: Sequence[tuple[str, SwitchboardRun]]) -> str:
    """One row per run; each column as wide as its heading (in terminal columns: Chinese counts two)."""
    head = [tr("final train loss", "最终训练损失"), tr("reported val loss", "报告的验证损失"),
            tr("true val loss", "真实验证损失"), tr("true val acc", "真实验证准确率"),
            tr("steps in train()", "train() 模式步数")]
    widths = [text_width(h) for h in head]
    w = max(18, *(text_width(name) for name, _ in rows))
    headings = (pad(h, c, right=True) for h, c in zip(head, widths, strict=True))
    lines = [" ".join([pad(tr("run", "运行"), w), *headings])]
    for name, r in rows:
        losses = (r.train_loss[-1], r.val_loss[-1], r.final_val_loss_true, r.final_val_acc_true)
        cells = [f"{v:{c}.4f}" for v, c in zip(losses, widths[:-1], strict=True)]
        lines.append(" ".join([pad(name, w), *cells, f"{r.steps_in_train_mode:{widths[-1]}d}"]))
    return "\n".join(lines)


def switchboard_summary(mistakes: Sequence[str] | None = ("no_zero_grad",)) -> str:
    """The switchboard's numbers as text: the same run without and with the mistakes."""
    rows = [(tr("no mistake", "无错误"), switchboard_run()),
            (tr("with the mistakes", "有错误"), switchboard_run(mistakes))]
    return _summary_lines(rows)


def switchboard_overview() -> str:
    """One row per mistake switched on alone, under the clean run."""
    rows = [(tr("no mistake", "无错误"), switchboard_run())]
    return _summary_lines(rows + [(tr(key, switch_label(key)), switchboard_run((key,))) for key in SWITCHES])


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
