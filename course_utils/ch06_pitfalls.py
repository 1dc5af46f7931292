"""Chapter 06: the pitfalls of PyTorch training. The ledger of the chapter's checks, the code that
worker processes import, the ranks' flight-recorder records read side by side. What the chapter trains
(a short run, the switchboard: one small training run with mistakes switched on) is in
``ch06_training``; its names are imported here, so the notebook imports everything from this module."""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .ch06_training import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    SWITCHES,
    LayerRun,
    SwitchboardRun,
    SwitchNet,
    _switchboard_cached,
    batches,
    graph_size,
    switch_label,
    switchboard_figure,
    switchboard_overview,
    switchboard_run,
    switchboard_summary,
    switchboard_widget,
    train_briefly,
)
from .dist import single_process_group
from .figures import describe_figure, pyplot
from .i18n import language, table, tr
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
                "{title}: the bug did not happen ({measure} = {fmt}), so this demonstration shows nothing. Did a "
                "PyTorch upgrade change this behaviour? Re-read the explanation.",
                "{title}：bug 没有出现（{measure} = {fmt}），所以这个演示什么也说明不了。是不是 PyTorch "
                "升级改变了这一行为？请重读上面的解释。",
                title=title, measure=measure, fmt=_fmt(bug)
            ))
        if not fixed:
            raise AssertionError(tr("{title}: the fix did not work ({measure} = {fmt}).",
                                    "{title}：修复没有奏效（{measure} = {fmt}）。",
                                    title=title, measure=measure, fmt=_fmt(fix)))
        bug, fix = _fmt(bug), _fmt(fix)
        print(tr("{title}: {measure}: with the bug {bug}, fixed {fix} (bug reproduced; fix works)",
                 "{title}：{measure}：有 bug 时{bug}，修复后{fix}。bug 已复现，修复有效。",
                 title=title, measure=measure, bug=bug, fix=fix))

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
                    "{key}: the expected {name} happened, but not for the reason this lesson shows: {exc}",
                    "{key}：预期的 {name} 出现了，但原因不是本节要展示的那个：{exc}",
                    key=key, name=type(exc).__name__, exc=exc
                )) from exc
            self.errors[key] = exc
            raise
        raise AssertionError(tr("{key}: expected {name}, but the code ran without error.",
                                "{key}：预期会出现 {name}，但代码运行时没有报错。", key=key, name=error.__name__))

    def summary(self) -> str:
        """The closing line: how many pitfalls were reproduced and fixed."""
        n = sum(row[-1] == "pass" for row in self.rows.values())
        return tr("{n} pitfalls reproduced and fixed", "{n} 个误区均已复现并修复", n=n)

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
        return "\n".join(table(rows, rule="-"))


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
        labels = [tr("epoch {e}, rank {r}", "epoch {e}，rank {r}", e=e, r=r)
                  for e in range(epochs) for r in range(world_size)]
        ax.set_yticks(range(len(labels)), labels)
    fig.suptitle(
        tr("Number in a cell = position at which that rank visits that sample; grey = never",
           "格中数字 = 该 rank 访问该样本的次序；灰色 = 从未访问"),
        fontsize=10,
    )
    fig.tight_layout()

    visits = tr("; ", "；").join(
        tr("{title}: {visits}", "{title}：{visits}", title=title, visits=tr(", ", "，").join(
            tr("epoch {e} rank {r} visits {order}", "epoch {e} rank {r} 访问 {order}", e=e, r=r, order=o[e][r])
            for e in range(epochs) for r in range(world_size)))
        for title, o in orders.items())
    return describe_figure(
        fig,
        "{count} grids, one per way of building the loaders, with a row per epoch and rank and a column "
        "per sample; a numbered cell is a sample that rank visits, the number its position. The samples "
        "each rank visits, in order: {visits}.",
        "{count} 个网格，每种构建加载器的方式一个：每个 epoch 的每个 rank 一行，每个样本一列；"
        "带数字的格子是该 rank 访问的样本，数字是访问次序。各 rank 按顺序访问的样本：{visits}。",
        count=len(orders), visits=visits)


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
    return "\n".join(table([head, *cells]))


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


