"""Chapter 03 helpers: datasets, collate functions, samplers and loader measurements.

A ``DataLoader`` worker started with *spawn* (macOS, Windows) imports the code it runs by name, so
every ``Dataset`` and ``worker_init_fn`` the notebook sends to workers lives here, not in a cell.
The batch browser is in ``ch03_batches`` and the throughput measurements in ``ch03_throughput``; their
names are imported here, so the notebook imports everything from this module.
"""

from __future__ import annotations

import io
import random
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from .ch03_batches import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    BATCH_BROWSER_DEFAULTS,
    SAMPLERS,
    BatchView,
    batch_browser,
    batch_view,
    class_balanced_weights,
    draw_batch_view,
)
from .ch03_throughput import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    LoaderRun,
    curve_summary,
    format_runs,
    measure_throughput,
    plot_curves,
    training_seconds,
)
from .data import image_paths, load_image
from .i18n import tr

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
                          else tr("worker {id}", "{id} 号 worker", id=info.id))

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
