"""Chapter 03 helpers: datasets, collate functions, samplers and loader measurements.

A ``DataLoader`` worker started with *spawn* (macOS, Windows) imports the code it runs by name, so
every ``Dataset`` and ``worker_init_fn`` the notebook sends to workers lives here, not in a cell.
"""

from __future__ import annotations

import io
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from .data import image_paths, load_image
from .device import busy_warning, one_main_thread
from .figures import COLORS, describe_figure, pyplot, show_figure
from .i18n import language, pad, text_width, tr

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
REFERENCE_PATH = Path(__file__).resolve().parent.parent / "data" / "loader_reference.json"


# Every DataLoader worker already runs one thread and has seeded torch, random and NumPy's global
# generator before a worker_init_fn runs (_worker_loop in torch/utils/data/_utils/worker.py).


class WorkerState(Dataset):
    """Item ``i``: ``(i, worker id or -1, threads, torch.initial_seed(), one draw from torch, random,
    NumPy's global generator and self.rng)``, as the process that fetched it sees them."""

    def __init__(self, n: int = 4, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)  # every worker gets a copy, in the same state

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[int, int, int, int, float, float, float, float]:
        info = get_worker_info()
        worker = -1 if info is None else info.id
        draws = (torch.rand(()).item(), random.random(), np.random.random(), self.rng.random())
        return (idx, worker, torch.get_num_threads(), torch.initial_seed(), *draws)


def write_digit_records(path: Path | str, split: str = "train") -> int:
    """Write a split of the digits as fixed-size binary records (1 label byte + 784 pixel bytes)."""
    paths, labels = image_paths(split)
    with open(path, "wb") as f:
        for p, y in zip(paths, labels, strict=True):
            f.write(bytes([int(y)]) + np.asarray(load_image(p), dtype=np.uint8).tobytes())
    return len(paths)


class DigitRecords(Dataset):
    """``(image, label, who opened the file handle)``, read with ``seek`` from a
    :func:`write_digit_records` file; the handle is opened on first use and never pickled."""

    record = 1 + 28 * 28

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.n = self.path.stat().st_size // self.record
        self.file: Any = None
        self.opened_by = "nobody"

    def open(self) -> None:
        """Open this process's own handle, and note which process it is."""
        info = get_worker_info()
        self.file = open(self.path, "rb")  # kept open for the life of the process
        self.opened_by = (tr("main process", "主进程") if info is None
                          else tr(f"worker {info.id}", f"{info.id} 号 worker"))

    def close(self) -> None:
        """Close this process's handle, if it has one."""
        if self.file is not None:
            self.file.close()
        self.file, self.opened_by = None, "nobody"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "file": None, "opened_by": "nobody"}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int, str]:
        if not 0 <= idx < self.n:
            raise IndexError(f"index {idx} is out of range for {self.n} records")
        if self.file is None:
            self.open()
        self.file.seek(idx * self.record)
        raw = self.file.read(self.record)
        image = torch.frombuffer(bytearray(raw[1:]), dtype=torch.uint8).view(1, 28, 28)
        return image.float() / 255.0, raw[0], self.opened_by


def open_per_worker(worker_id: int) -> None:
    """``worker_init_fn``: open the dataset's file handle in this worker (``dataset.open()``)."""
    info = get_worker_info()
    if info is not None and hasattr(info.dataset, "open"):
        info.dataset.open()


class Span(IterableDataset):
    """Yields ``start, ..., end - 1``, in full in every worker unless :func:`split_span` narrows it."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


def split_span(worker_id: int) -> None:
    """``worker_init_fn``: give this worker's copy of a :class:`Span` its own contiguous block.

    The pattern of PyTorch's documentation for ``IterableDataset``: ``get_worker_info()`` inside
    the worker gives its id, the number of workers and its copy of the dataset.
    """
    info = get_worker_info()
    span = info.dataset
    per_worker = -(-(span.end - span.start) // info.num_workers)  # ceiling division
    span.start = span.start + info.id * per_worker
    span.end = min(span.start + per_worker, span.end)


class ImageDataset(Dataset):
    """The notebook's ``ImageDataset``, in a module that spawned workers can import."""

    def __init__(self, paths: Sequence, labels: Sequence, transform: Any = None) -> None:
        self.paths = paths
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int) -> tuple[Any, int]:
        image = load_image(self.paths[idx])
        if self.transform:
            image = self.transform(image)
        return image, self.labels[idx]


def to_tensor(image: Image.Image) -> torch.Tensor:
    """``transforms.ToTensor()`` in NumPy: a spawned worker need not import torchvision (seconds)."""
    a = np.asarray(image, dtype=np.float32) / 255.0
    a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(a))


class SyntheticImages(Dataset):
    """Decode-heavy images made on the fly, the same per index in any process: item ``i`` (seeded by
    ``(seed, i)``) is a JPEG of a disc on a smooth background, decoded, resized and normalised."""

    def __init__(self, n: int = 1024, size: int = 256, out_size: int = 128, seed: int = 0) -> None:
        self.n, self.size, self.out_size, self.seed = n, size, out_size, seed

    def __len__(self) -> int:
        return self.n

    def encoded(self, idx: int) -> tuple[bytes, int]:
        """The JPEG bytes of item `idx` (what a file on disk would hold) and its label."""
        if not 0 <= idx < self.n:
            raise IndexError(f"index {idx} is out of range for a dataset of {self.n} images")
        rng = np.random.default_rng((self.seed, idx))
        label = int(rng.integers(10))
        corners = rng.random((4, 3), dtype=np.float32)  # the background blends 4 colours
        t = np.linspace(0.0, 1.0, self.size, dtype=np.float32)
        top = np.outer(1 - t, corners[0]) + np.outer(t, corners[1])
        bottom = np.outer(1 - t, corners[2]) + np.outer(t, corners[3])
        bg = (1 - t)[:, None, None] * top[None] + t[:, None, None] * bottom[None]
        img = Image.fromarray((bg * 255).astype(np.uint8), mode="RGB")
        cy, cx = rng.uniform(0.3, 0.7, size=2) * self.size
        r = rng.uniform(0.12, 0.3) * self.size
        hue = label / 10 * 2 * np.pi
        colour = tuple(int(255 * (0.5 + 0.5 * np.cos(hue + k))) for k in (0.0, 2.1, 4.2))
        ImageDraw.Draw(img).ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        return buf.getvalue(), label

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(idx)
        with Image.open(io.BytesIO(data)) as im:  # decode
            im = im.convert("RGB").resize((self.out_size, self.out_size), Image.Resampling.BILINEAR)
        # ToTensor + Normalize in NumPy: the measurement compares worker processes, not torch's threads
        x = np.asarray(im, dtype=np.float32) / 255.0
        x = (x - np.float32(IMAGENET_MEAN)) / np.float32(IMAGENET_STD)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), label


class ToySequences(Dataset):
    """Token sequences of length ``min_len..max_len`` (ids ``1..19``: 0 is padding), deterministic
    per index; the label is 1 when a sequence is longer than the middle of the length range."""

    def __init__(self, n: int = 100, min_len: int = 2, max_len: int = 12, seed: int = 0) -> None:
        self.n, self.min_len, self.max_len, self.seed = n, min_len, max_len, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        if not 0 <= idx < self.n:
            raise IndexError(f"index {idx} is out of range for {self.n} sequences")
        rng = np.random.default_rng((self.seed, idx))
        length = int(rng.integers(self.min_len, self.max_len + 1))
        tokens = torch.from_numpy(rng.integers(1, 20, size=length)).to(torch.int64)
        return tokens, int(length > (self.min_len + self.max_len) / 2)

    def lengths(self) -> list[int]:
        """Every item's length."""
        return [len(self[i][0]) for i in range(self.n)]


class PaddedBatch(NamedTuple):
    padded: torch.Tensor  # [B, T]
    lengths: torch.Tensor  # [B]
    mask: torch.Tensor  # [B, T], True on real tokens
    labels: torch.Tensor  # [B]


def pad_collate(batch: Sequence[tuple[torch.Tensor, int]]) -> PaddedBatch:
    """``collate_fn`` for ``(sequence, label)`` items: pad with 0 to the longest in the batch, keep the
    true lengths and a mask."""
    seqs = [s for s, _ in batch]
    lengths = torch.tensor([len(s) for s in seqs])
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    mask = torch.arange(padded.shape[1])[None, :] < lengths[:, None]
    return PaddedBatch(padded, lengths, mask, torch.tensor([y for _, y in batch]))


def write_digits_csv(path: Path | str, split: str = "train") -> int:
    """Write a split of the digits as text, one ``index,label,p0,...,p783`` line per image."""
    paths, labels = image_paths(split)
    with open(path, "w") as f:
        for i, (p, y) in enumerate(zip(paths, labels, strict=True)):
            pixels = np.asarray(load_image(p), dtype=np.uint8).ravel()
            f.write(f"{i},{y}," + ",".join(map(str, pixels.tolist())) + "\n")
    return len(paths)


def _parse_line(line: str) -> tuple[int, torch.Tensor, int]:
    values = np.array(line.rstrip("\n").split(","), dtype=np.int64)
    image = torch.from_numpy(values[2:].astype(np.float32) / 255.0).view(1, 28, 28)
    return int(values[0]), image, int(values[1])


class NaiveDigitsStream(IterableDataset):
    """Streams ``(index, image, label)`` lines of a digits text file. The classic bug: every worker
    runs ``__iter__`` from the top, so with N workers every item arrives N times."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _lines(self) -> Iterator[str]:
        with open(self.path) as f:
            yield from f  # the file is read as it is consumed, never loaded whole

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        for line in self._lines():
            yield _parse_line(line)


class ShardedDigitsStream(NaiveDigitsStream):
    """The fix: each worker (of each rank of a distributed job) keeps only its share of the lines."""

    def __init__(self, path: Path | str, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(path)
        self.rank, self.world_size = rank, world_size

    def shard(self) -> tuple[int, int]:
        """``(this shard, number of shards)`` for the calling process or worker."""
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self.rank * workers + worker, self.world_size * workers

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        shard, shards = self.shard()
        for i, line in enumerate(self._lines()):
            if i % shards == shard:  # the others' lines are read, but not parsed
                yield _parse_line(line)


def delivery_counts(indices: Sequence[int] | torch.Tensor, n: int) -> dict[str, int]:
    """How items ``0..n-1`` were delivered: total, distinct, duplicated, missing (the keys in the
    course's language: ``送达``, ``不同的``, ``重复的``, ``缺失的`` in Chinese)."""
    seen = Counter(torch.as_tensor(indices).tolist())
    return {
        tr("delivered", "送达"): sum(seen.values()),
        tr("distinct", "不同的"): len(seen),
        tr("duplicated", "重复的"): sum(1 for c in seen.values() if c > 1),
        tr("missing", "缺失的"): sum(1 for i in range(n) if i not in seen),
    }


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
    zh = ("worker", "首批秒数", "epoch 中位秒数", "图像/秒", "相对 0", "波动", "每张恰好一次")
    head = tr("workers 1st batch s median epoch s  images/s  x vs 0  spread  once",
              " ".join(pad(h, w, right=True) for h, w in zip(zh, (7, 11, 14, 9, 7, 7, 12), strict=True)))
    lines, width = [head, "-" * text_width(head)], 12 if language() == "zh-CN" else 5
    for r in runs:
        speed = f"{r.items_per_s / zero[0]:7.2f}" if zero else f"{'-':>7}"
        once = tr("yes", "是") if r.each_item_once else tr("NO", "否")
        lines.append(f"{r.num_workers:>7} {r.first_batch_s:11.3f} {r.median_s:14.3f} "
                     f"{r.items_per_s:9.1f} {speed} {r.spread:7.0%} {pad(once, width, right=True)}")
    return "\n".join(lines)


def curve_summary(runs: Sequence[LoaderRun], cores: int, load: float | None) -> str:
    """What a measured curve says, in sentences computed from it (true whatever the numbers are)."""
    best = max(runs, key=lambda r: r.items_per_s)
    enough = min(r.num_workers for r in runs if r.items_per_s >= 0.95 * best.items_per_s)
    zero = [r for r in runs if r.num_workers == 0]
    times = best.items_per_s / zero[0].items_per_s if zero else 0.0
    gain = tr(f", {times:.2f}x the main process alone", f"，是只用主进程时的 {times:.2f} 倍") if zero else ""
    where = "below" if best.num_workers < cores else "at" if best.num_workers == cores else "above"
    than = {"below": "少于", "at": "等于", "above": "多于"}[where]
    slow, spread = max(runs, key=lambda r: r.first_batch_s), max(r.spread for r in runs)
    lines = [
        tr(f"Fastest here: num_workers={best.num_workers} at {best.items_per_s:.1f} images/s{gain}; "
           f"that is {where} this machine's {cores} cores.",
           f"这里最快的是 num_workers={best.num_workers}，每秒 {best.items_per_s:.1f} 张图像{gain}；"
           f"这个 worker 数{than}本机的 {cores} 个核心。"),
        tr(f"The smallest num_workers within 5% of the fastest: {enough}.",
           f"与最快速度相差不到 5% 的最小 num_workers：{enough}。"),
        tr(f"The repeats of one setting differed by up to {spread:.0%} of their median: "
           "differences smaller than that are noise.",
           "同一设置的各次重复之间最多相差其中位数的 "
           f"{spread:.0%}：比这更小的差异都是噪声。"),
        tr(f"Start-up: the first batch took up to {slow.first_batch_s:.3f} s (num_workers={slow.num_workers}), "
           "paid once per loader with persistent workers.",
           f"启动开销：第一个批次最多用了 {slow.first_batch_s:.3f} "
           f"秒（num_workers={slow.num_workers}），"
           "在 persistent_workers=True 时，每个加载器只付出一次。"),
    ]
    if where == "above":
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
    curves = {tr(f"this machine ({cores} cores)", f"本机（{cores} 个核心）"): (cores, mine)}
    if reference is not None:
        m, points = reference["machine"], reference["points"]
        label = tr(f"reference ({m['cores']} cores, load {m['load_average_before']})",
                   f"参考（{m['cores']} 个核心，负载 {m['load_average_before']}）")
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
    points_en = "; ".join(f"{label}: " + ", ".join(f"{w} workers {v:.0f}/s" for w, v in xy.items())
                          for label, (_, xy) in curves.items())
    points_zh = "；".join(f"{label}：" + "，".join(f"{w} 个 worker {v:.0f}/s" for w, v in xy.items())
                          for label, (_, xy) in curves.items())
    return describe_figure(
        fig,
        f"Two line charts against num_workers: images loaded per second, and the speed-up over loading in "
        f"the main process, one line per machine, a dashed line at each machine's number of cores. "
        f"Images per second: {points_en}.",
        "两幅以 num_workers 为横轴的折线图：每秒加载的图像数，"
        "以及相对于在主进程中加载的加速比；每台机器一条线，"
        f"虚线标出各机器的核心数。每秒图像数：{points_zh}。")


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


SAMPLERS = ("default", "sequential", "random", "weighted")
BATCH_BROWSER_DEFAULTS = dict(batch_size=16, shuffle=True, seed=0, sampler="default", epoch=0, batch=0)


def _sampler_options() -> list[tuple[str, str]]:
    """The batch browser's sampler choices: (label in the course's language, value of SAMPLERS)."""
    labels = {"default": tr("default", "default（由 shuffle 决定）"), "sequential": tr("sequential", "顺序"),
              "random": tr("random", "随机"), "weighted": tr("weighted", "加权（类别均衡）")}
    return [(labels[s], s) for s in SAMPLERS]


def class_balanced_weights(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Per-sample weights ``1 / count(label)`` for ``WeightedRandomSampler``: every class drawn equally often."""
    y = torch.as_tensor(labels, dtype=torch.int64)
    return 1.0 / torch.bincount(y)[y].to(torch.float64)


class BatchView(NamedTuple):
    batches: list[list[int]]  # one epoch, as the DataLoader handed it out
    batch: int  # the batch picked out of it
    indices: list[int]
    labels: list[int]
    sampler: str
    epoch: int


def batch_view(
    labels: Sequence[int],
    batch_size: int = 16,
    shuffle: bool = True,
    seed: int = 0,
    sampler: str = "default",
    epoch: int = 0,
    batch: int = 0,
) -> BatchView:
    """The batches a real ``DataLoader`` with ``generator=torch.Generator().manual_seed(seed)`` yields in
    epoch `epoch` (from 0; each epoch continues the generator), and its batch `batch`. `sampler`:
    "default" (``shuffle`` decides), "sequential", "random" or "weighted" (class-balanced)."""
    if sampler != "default" and shuffle:
        raise ValueError(
            f"shuffle=True cannot be combined with sampler={sampler!r}: shuffle=True *is* a "
            "RandomSampler, and DataLoader refuses both ('sampler option is mutually exclusive "
            "with shuffle'). Untick shuffle, or pick sampler 'default'."
        )
    n, g, kw = len(labels), torch.Generator().manual_seed(seed), {"shuffle": shuffle}
    if sampler == "sequential":
        kw = {"sampler": torch.utils.data.SequentialSampler(range(n))}
    elif sampler == "random":
        kw = {"sampler": torch.utils.data.RandomSampler(range(n), generator=g)}
    elif sampler == "weighted":
        weights = class_balanced_weights(labels)
        kw = {"sampler": torch.utils.data.WeightedRandomSampler(weights, n, generator=g)}
    loader = DataLoader(range(n), batch_size, generator=g, collate_fn=list, **kw)
    for _ in range(epoch + 1):
        batches = list(loader)
    b = min(max(batch, 0), len(batches) - 1)
    picked = [int(labels[i]) for i in batches[b]]
    return BatchView(batches, b, batches[b], picked, type(loader.sampler).__name__, epoch)


def draw_batch_view(view: BatchView, images: torch.Tensor, classes: Sequence | None = None) -> Any:
    """The batch's images with their labels, and the epoch's index order with the batch highlighted."""
    plt = pyplot()

    k = len(view.indices)
    cols = min(16, k)
    rows = -(-k // cols)
    # a layout in inches: title, rows of images (each with a two-line title), then the order plot
    width, left, right, top, row_h, gap, plot_h, bottom = 10.0, 0.8, 0.2, 0.5, 0.95, 0.3, 2.2, 0.55
    height = top + rows * row_h + gap + plot_h + bottom
    fig = plt.figure(figsize=(width, height))
    cell = (width - left - right) / cols
    side = min(cell * 0.92, row_h - 0.35)
    for j, idx in enumerate(view.indices):
        r, c = divmod(j, cols)
        x0, y0 = left + c * cell + (cell - side) / 2, height - top - (r + 1) * row_h
        ax = fig.add_axes((x0 / width, y0 / height, side / width, side / height))
        img = images[idx].detach().cpu()
        ax.imshow((img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)).numpy(), cmap="gray_r")
        name = classes[view.labels[j]] if classes else view.labels[j]
        ax.set_title(f"#{idx}\ny={name}", fontsize=7)
        ax.axis("off")
    ax = fig.add_axes((left / width, bottom / height, (width - left - right) / width, plot_h / height))
    order = [i for bt in view.batches for i in bt]
    start = sum(len(b) for b in view.batches[: view.batch])
    ax.scatter(range(len(order)), order, s=2, color="0.6", label=tr("epoch order", "该 epoch 的顺序"))
    ax.scatter(range(start, start + k), view.indices, s=10, color=COLORS["vermilion"],
               label=tr(f"batch {view.batch}", f"批次 {view.batch}"))
    ax.set(xlabel=tr("position in the epoch", "在该 epoch 中的位置"),
           ylabel=tr("dataset index", "数据集索引"))
    ax.legend(loc="upper left", fontsize=7)
    b, n = view.batch, len(view.batches)
    title = tr(f"{view.sampler}, epoch {view.epoch}: batch {b} of {n} ({k} images)",
               f"{view.sampler}，epoch {view.epoch}：第 {b} 个批次，共 {n} 个（{k} 张图像）")
    fig.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    labels = ", ".join(str(classes[v] if classes else v) for v in view.labels)
    return describe_figure(
        fig,
        f"{title}. Top: the batch's {k} images, each titled with its dataset index and label (labels: "
        f"{labels}). Bottom: a scatter plot of the dataset index at each position of the epoch, the "
        f"batch's points highlighted.",
        f"{title}。上方：这个批次的 {k} 张图像，"
        f"每张标有数据集索引和标签（标签：{labels}）。"
        f"下方：该 epoch 每个位置上的数据集索引的散点图，这个批次的点被突出显示。")


def batch_browser(images: torch.Tensor, labels: Sequence[int]) -> Any:
    """An ipywidgets browser over :func:`batch_view`: batch size, shuffle, seed, sampler, epoch, batch."""
    import ipywidgets as w

    d, n = BATCH_BROWSER_DEFAULTS, len(labels)
    controls = dict(
        batch_size=w.IntSlider(d["batch_size"], 4, 64, 4, description=tr("batch size", "批次大小")),
        shuffle=w.Checkbox(d["shuffle"], description="shuffle"),
        seed=w.IntSlider(d["seed"], 0, 9, description=tr("seed", "种子")),
        sampler=w.Dropdown(options=_sampler_options(), value=d["sampler"], description=tr("sampler", "采样器")),
        epoch=w.IntSlider(d["epoch"], 0, 4, description="epoch"),
        batch=w.IntSlider(d["batch"], 0, -(-n // d["batch_size"]) - 1, description=tr("batch", "批次")),
    )

    def show(**kw: Any) -> None:
        controls["batch"].max = -(-n // kw["batch_size"]) - 1
        try:
            view = batch_view(labels, **kw)
        except ValueError as exc:
            print(tr(f"DataLoader would refuse this: {exc}", f"DataLoader 会拒绝这种组合：{exc}"))
            return
        print(tr(f"indices: {view.indices}", f"索引：{view.indices}"))
        show_figure(draw_batch_view(view, images))

    ctl = list(controls.values())
    return w.VBox([w.HBox(ctl[:3]), w.HBox(ctl[3:]), w.interactive_output(show, controls)])


_WORKER_DIED = re.compile(r"DataLoader worker .*?exited unexpectedly")
_PIDS = re.compile(r" \(pid(?:\(s\))?[^)]*\)")  # " (pid 42)", " (pid(s) 42, 43)"


def worker_failure(err: BaseException) -> str:
    """``Type: message``; a DataLoader's report that a worker died reads the same in every run:
    ``RuntimeError: DataLoader worker exited unexpectedly``, without the pids and exit details.
    Section 8 (a notebook-defined ``Dataset`` under spawn)."""
    found = _WORKER_DIED.search(str(err))
    return f"{type(err).__name__}: {_PIDS.sub('', found.group(0)) if found else err}"


# ------------------------------------------------------------------ what a loader holds in memory (deep dive)


class CountedItems(Dataset):
    """``n`` small items; counts the ``__getitem__`` calls of every process in a shared tensor (one slot per
    worker, so that no two processes write the same number)."""

    def __init__(self, n: int, slots: int = 16) -> None:
        self.n = n
        self.calls = torch.zeros(slots, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        self.calls[0 if info is None else info.id + 1] += 1
        return torch.zeros(3, 8, 8)


def batches_in_flight(num_workers: int, prefetch_factor: int, batch_size: int = 4, settle_s: float = 0.5,
                      timeout_s: float = 30.0) -> int:
    """How many batches a loader has fetched once its first batch is taken and its workers are idle
    again: the batches it keeps requested ahead (``num_workers * prefetch_factor``), plus the one taken.
    Waits until every worker has fetched something (a spawned worker may take seconds to start) and
    the count has not moved for `settle_s` seconds since (at most `timeout_s`)."""
    dataset = CountedItems(10_000, slots=num_workers + 1)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, prefetch_factor=prefetch_factor,
                        timeout=60)
    batches = iter(loader)
    next(batches)
    last, since, deadline = -1, time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = bool((dataset.calls[1:] > 0).all())
        now = int(dataset.calls.sum())
        if now != last or not started:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            break
        time.sleep(0.02)
    del batches  # shuts the workers down
    return last // batch_size


def private_dirty_mib() -> float | None:
    """This process's private memory that it has written to, in MiB (Linux's smaps_rollup); None elsewhere."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Dirty:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class TableReader(Dataset):
    """Item ``i`` sums chunk ``i`` of a table (a list or an array) and reports the reading process's private
    memory: how much of the table it has copied so far."""

    def __init__(self, table: Sequence[int] | np.ndarray, chunk: int) -> None:
        self.table, self.chunk = table, chunk

    def __len__(self) -> int:
        return -(-len(self.table) // self.chunk)

    def __getitem__(self, i: int) -> tuple[float, float | None]:
        part = self.table[i * self.chunk:(i + 1) * self.chunk]
        total = sum(part) if isinstance(part, list) else part.sum()
        return float(total), private_dirty_mib()


def worker_copy_mib(table: Sequence[int] | np.ndarray, chunk: int = 50_000) -> float | None:
    """How much a DataLoader worker's private memory grows while it reads all of `table`, in MiB; None
    where it cannot be measured (no /proc, or workers not started by fork, whose copy is whole from the start)."""
    import multiprocessing

    if private_dirty_mib() is None or multiprocessing.get_start_method() != "fork":
        return None
    seen = list(DataLoader(TableReader(table, chunk), batch_size=None, num_workers=1, timeout=60))
    return seen[-1][1] - seen[0][1]
