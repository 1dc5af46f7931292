"""Chapter 03 (data loading), how many workers: a loader measured in steady state (``measure_throughput``,
``LoaderRun``), the runs as a table, the curve against this machine's reference (``curve_summary``,
``plot_curves``) and an epoch with a training step (``training_seconds``). Used in section 7 ("How many
workers? Measure it") and the exercises of notebook 03, and by ``benchmarks/loader_throughput.py``, through
``course_utils.ch03_data_loading``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .device import busy_warning, one_main_thread
from .figures import describe_figure, pyplot
from .i18n import table, text_width, tr


class _WithIndex(Dataset):
    """Items as ``(index, item)``, so that a measurement can check each was delivered once."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, idx: int) -> tuple[int, Any]:
        return idx, self.dataset[idx]


@dataclass
class LoaderRun:
    """One measured loader setting: the wait for its very first batch (start-up) and its timed epochs."""

    num_workers: int
    loader_kw: dict[str, Any]  # what the DataLoader got beyond the batch size
    items: int  # per epoch
    first_batch_s: float = 0.0
    epoch_seconds: list[float] = field(default_factory=list)
    each_item_once: bool = True

    @property
    def median_s(self) -> float:
        return float(np.median(self.epoch_seconds))

    @property
    def items_per_s(self) -> float:
        """Items per second in the median epoch."""
        return self.items / self.median_s

    @property
    def spread(self) -> float:
        """(slowest - fastest epoch) / median: how much the repeats disagree."""
        return (max(self.epoch_seconds) - min(self.epoch_seconds)) / self.median_s


def measure_throughput(
    dataset: Dataset,
    num_workers: int,
    *,
    batch_size: int = 16,
    epochs: int = 3,
    warm_up: bool = True,
    step: Callable[[Any], None] | None = None,
    **loader_kw: Any,
) -> LoaderRun:
    """Time `epochs` epochs of a loader, after an untimed warm-up epoch unless ``warm_up=False``, with
    one torch thread in the main process like each worker; `step` (a training step) gets every batch.
    With workers, `loader_kw` goes to the DataLoader (default: persistent workers, 120 s timeout)."""
    kw = {"persistent_workers": True, "timeout": 120.0, **loader_kw} if num_workers else {}
    wrapped = _WithIndex(dataset)
    n = len(wrapped)
    loader = DataLoader(wrapped, batch_size=batch_size, num_workers=num_workers, **kw)
    run = LoaderRun(num_workers, kw, n)
    with one_main_thread():
        for epoch in range(epochs + warm_up):
            counts = torch.zeros(n, dtype=torch.int64)
            t0 = time.perf_counter()
            for k, (idx, item) in enumerate(loader):
                if epoch == 0 and k == 0:
                    run.first_batch_s = time.perf_counter() - t0
                if step is not None:
                    step(item)
                counts[idx] += 1
            if epoch >= warm_up:
                run.epoch_seconds.append(time.perf_counter() - t0)
            run.each_item_once = run.each_item_once and bool((counts == 1).all())
    del loader  # shuts persistent workers down
    return run


def format_runs(runs: Sequence[LoaderRun]) -> str:
    """A table: workers, start-up, median epoch, images/s, speed-up over 0 workers, spread, once."""
    zero = [r.items_per_s for r in runs if r.num_workers == 0]
    head = (tr("workers", "worker"), tr("1st batch s", "首批秒数"), tr("median epoch s", "epoch 中位秒数"),
            tr("images/s", "图像/秒"), tr("x vs 0", "相对 0"), tr("spread", "波动"), tr("once", "每张恰好一次"))
    rows = [head]
    for r in runs:
        speed = f"{r.items_per_s / zero[0]:.2f}" if zero else "-"
        once = tr("yes", "是") if r.each_item_once else tr("NO", "否")
        rows.append((r.num_workers, f"{r.first_batch_s:.3f}", f"{r.median_s:.3f}", f"{r.items_per_s:.1f}", speed,
                     f"{r.spread:.0%}", once))
    lines = table(rows, align=">" * 7, sep=" ", widths=(7, 11, 14, 9, 7, 7, 5))
    return "\n".join([lines[0], "-" * text_width(lines[0]), *lines[1:]])


def curve_summary(runs: Sequence[LoaderRun], cores: int, load: float | None) -> str:
    """What a measured curve says, in sentences computed from it (true whatever the numbers are)."""
    best = max(runs, key=lambda r: r.items_per_s)
    enough = min(r.num_workers for r in runs if r.items_per_s >= 0.95 * best.items_per_s)
    zero = [r for r in runs if r.num_workers == 0]
    times = best.items_per_s / zero[0].items_per_s if zero else 0.0
    gain = tr(", {times:.2f}x the main process alone", "，是只用主进程时的 {times:.2f} 倍", times=times) if zero else ""
    if best.num_workers < cores:
        than = tr("below", "少于")
    elif best.num_workers == cores:
        than = tr("at", "等于")
    else:
        than = tr("above", "多于")
    slow, spread = max(runs, key=lambda r: r.first_batch_s), max(r.spread for r in runs)
    lines = [
        tr("Fastest here: num_workers={num_workers} at {items_per_s:.1f} images/s{gain}; that is {than} this "
           "machine's {cores} cores.",
           "这里最快的是 num_workers={num_workers}，每秒 {items_per_s:.1f} 张图像{gain}；这个 worker 数{than}本机的 "
           "{cores} 个核心。",
           num_workers=best.num_workers, items_per_s=best.items_per_s, gain=gain, than=than, cores=cores),
        tr("The smallest num_workers within 5% of the fastest: {enough}.",
           "与最快速度相差不到 5% 的最小 num_workers：{enough}。", enough=enough),
        tr("The repeats of one setting differed by up to {spread:.0%} of their median: differences smaller than that "
           "are noise.",
           "同一设置的各次重复之间最多相差其中位数的 {spread:.0%}：比这更小的差异都是噪声。",
           spread=spread),
        tr("Start-up: the first batch took up to {first_batch_s:.3f} s (num_workers={num_workers}), paid once per "
           "loader with persistent workers.",
           "启动开销：第一个批次最多用了 {first_batch_s:.3f} 秒（num_workers={num_workers}），在 "
           "persistent_workers=True 时，每个加载器只付出一次。",
           first_batch_s=slow.first_batch_s, num_workers=slow.num_workers),
    ]
    if best.num_workers > cores:
        lines.append(tr("More workers than cores won here: check the load average; on a busy machine "
                        "extra processes take CPU from the neighbours.",
                        "这里 worker 数多于核心数时反而最快："
                        "请查看负载均值；在繁忙的机器上，"
                        "多出来的进程是在抢邻居的 CPU。"))
    return "\n".join(lines + [w for w in [busy_warning(load, cores)] if w])


def plot_curves(runs: Sequence[LoaderRun], cores: int, reference: dict | None = None) -> Any:
    """Images/s and the speed-up over 0 workers against num_workers: this machine beside a reference."""
    plt = pyplot()

    mine = {r.num_workers: r.items_per_s for r in runs}
    curves = {tr("this machine ({cores} cores)", "本机（{cores} 个核心）", cores=cores): (cores, mine)}
    if reference is not None:
        m, points = reference["machine"], reference["points"]
        label = tr("reference ({m} cores, load {m2})", "参考（{m} 个核心，负载 {m2}）",
                   m=m['cores'], m2=m['load_average_before'])
        curves[label] = (m["cores"], {p["num_workers"]: p["images_per_s"] for p in points})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for k, (label, (c, xy)) in enumerate(curves.items()):
        for ax, scale in zip(axes, (1.0, xy.get(0, np.nan)), strict=True):
            ax.plot(list(xy), [y / scale for y in xy.values()], "o-", color=f"C{k}", label=label)
            ax.axvline(c, color=f"C{k}", ls="--", alpha=0.6)
    axes[1].axhline(1.0, color="0.5", lw=0.8)
    axes[0].set(ylabel=tr("images per second (median epoch)", "每秒图像数（各 epoch 的中位数）"))
    axes[0].set_title(tr("Throughput (dashed: each machine's cores)", "吞吐量（虚线：各机器的核心数）"))
    axes[1].set(ylabel=tr("speed-up over num_workers=0", "相对 num_workers=0 的加速比"),
                title=tr("Relative to loading in the main process", "相对于在主进程中加载"))
    for ax in axes:
        ax.set(xlabel="num_workers", ylim=(0, None))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    points = tr("; ", "；").join(
        tr("{label}: {rates}", "{label}：{rates}", label=label, rates=tr(", ", "，").join(
            tr("{w} workers {v:.0f}/s", "{w} 个 worker {v:.0f}/s", w=w, v=v) for w, v in xy.items()))
        for label, (_, xy) in curves.items())
    return describe_figure(
        fig,
        "Two line charts against num_workers: images loaded per second, and the speed-up over loading in "
        "the main process, one line per machine, a dashed line at each machine's number of cores. "
        "Images per second: {points}.",
        "两幅以 num_workers 为横轴的折线图：每秒加载的图像数，以及相对于在主进程中加载的加速比；每台机器一条线，"
        "虚线标出各机器的核心数。每秒图像数：{points}。",
        points=points)


def training_seconds(
    dataset: Dataset, worker_counts: Sequence[int], epochs: int = 3
) -> dict[int, list[float]]:
    """``{num_workers: [seconds of each timed epoch]}`` with an SGD step of a tiny CNN on every batch
    (the same initial model for every setting; the caller's random stream is left alone)."""
    out = {}
    with torch.random.fork_rng(devices=[]):
        for w in worker_counts:
            torch.manual_seed(0)
            conv = nn.Sequential(nn.AdaptiveAvgPool2d(16), nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
            model = nn.Sequential(conv, nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)

            def step(batch: Any, model: nn.Module = model, opt: Any = opt) -> None:
                opt.zero_grad()
                nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
                opt.step()

            out[w] = measure_throughput(dataset, w, epochs=epochs, step=step).epoch_seconds
    return out
