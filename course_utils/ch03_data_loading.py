"""Chapter 03 helpers: datasets, collate functions, samplers and loader measurements.

Everything a ``DataLoader`` worker has to run lives here, in a module, on purpose:
a worker started with the *spawn* method (the default on macOS and Windows) is a
fresh Python that imports the code it runs by name, so a ``Dataset`` defined
inside a notebook cannot be found there. Classes and functions in this module can.

Contents:

- :class:`ImageDataset`: the source chapter's path-based dataset, made whole.
- :func:`pad_collate` / :class:`PaddedBatch`, :class:`ToySequences`,
  :class:`LengthBucketBatchSampler`: variable-length items in batches.
- :func:`write_digits_csv`, :class:`NaiveDigitsStream` (the classic bug: every
  worker yields the whole file) and :class:`ShardedDigitsStream` (the fix).
- :class:`SyntheticImages`: a decode-heavy image set generated on the fly,
  deterministic per index, for throughput work.
- :func:`measure_steady`, :func:`format_steady`, :func:`curve_summary`,
  :func:`plot_curves`, :func:`load_reference`: the ``num_workers`` curve, in steady
  state, beside a reference curve stored in ``data/``; :func:`measure_throughput`,
  :func:`format_runs`, :func:`plot_throughput`: whole epochs, start-up included.
- :func:`training_seconds` and :class:`TinyNet`: the same with a model in the loop.
- :func:`batch_view`, :func:`draw_batch_view`, :func:`batch_browser`: the batch
  browser widget and the plain functions behind it.
- What ``worker_init_fn`` is for: :class:`WorkerState` (what PyTorch already set up
  in a worker), :func:`reseed_rng` (a dataset's own generator), :class:`DigitRecords`
  and :func:`open_per_worker` (a file handle per worker), :class:`Span` and
  :func:`split_span` (a stream shared out between workers).
"""

from __future__ import annotations

import io
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    WeightedRandomSampler,
    get_worker_info,
)

from .data import load_image
from .device import busy_warning, cpu_cores, one_main_thread

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------- workers
#
# What every DataLoader worker already gets from PyTorch, before any ``worker_init_fn`` runs
# (``torch/utils/data/_utils/worker.py``, ``_worker_loop``): ``torch.set_num_threads(1)``;
# ``torch.manual_seed(base_seed + worker_id)`` and ``random.seed`` with the same number; NumPy's
# global generator seeded from ``(base_seed, worker_id)``. ``base_seed`` is drawn from the
# loader's generator each time an iterator is made: each epoch, unless ``persistent_workers=True``,
# where one iterator and its workers serve every epoch, seeded once (``DataLoader.__iter__`` and
# ``_BaseDataLoaderIter.__init__`` in ``torch/utils/data/dataloader.py``). So a ``worker_init_fn`` is for
# what PyTorch cannot know about: a generator object the dataset holds, a file or connection
# each worker must open for itself, a share of a stream set up per worker.


def worker_kwargs(num_workers: int, timeout: float = 60.0) -> dict[str, Any]:
    """``DataLoader`` keyword arguments for `num_workers` processes, the course's way.

    With workers: a ``timeout`` (a stuck worker raises instead of hanging). Without: no
    timeout (``DataLoader`` requires ``timeout=0`` then).
    """
    if num_workers < 0:
        raise ValueError("num_workers must be 0 (load in the main process) or more")
    if num_workers == 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers, "timeout": timeout}


class WorkerState(Dataset):
    """Item ``i`` reports, from whichever process fetched it, what that process's random state gives.

    ``(index, worker id or -1 in the main process, intra-op threads, torch.initial_seed(),
    one draw from torch, random, NumPy's global generator, and self.rng)``. ``self.rng`` is a
    NumPy ``Generator`` made in ``__init__``: every worker gets a copy of it, in the same state.
    """

    FIELDS = ("index", "worker", "threads", "torch seed", "torch.rand", "random", "np.random", "self.rng")

    def __init__(self, n: int = 4, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[int, int, int, int, float, float, float, float]:
        info = get_worker_info()
        return (idx, -1 if info is None else info.id, torch.get_num_threads(), torch.initial_seed(),
                torch.rand(()).item(), random.random(), float(np.random.random()), float(self.rng.random()))




RECORD_SIDE = 28


def write_digit_records(path: Path | str, split: str = "train") -> int:
    """Write a split of the course digits as fixed-size binary records: 1 label byte + 784 pixel bytes.

    Fixed-size records can be read at any index with ``seek``: a stand-in for a large file, an
    LMDB or HDF5 file, or a database, that a dataset reads from through an open handle.
    """
    from .data import image_paths

    paths, labels = image_paths(split)
    with open(path, "wb") as f:
        for p, y in zip(paths, labels, strict=True):
            f.write(bytes([int(y)]) + np.asarray(load_image(p), dtype=np.uint8).tobytes())
    return len(paths)


class DigitRecords(Dataset):
    """Reads ``(image, label, who opened the handle)`` from a :func:`write_digit_records` file.

    The file handle is opened on first use, not in ``__init__``, and left out of the pickle that
    spawned workers receive (a handle cannot be pickled). Forked workers, though, inherit the
    handle the main process opened, if it used the dataset: one file position shared by every
    worker, so one worker's ``seek`` can move another's read. :func:`open_per_worker` as
    ``worker_init_fn`` gives each worker a handle of its own, whatever the start method.
    """

    record = 1 + RECORD_SIDE * RECORD_SIDE

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.n = self.path.stat().st_size // self.record
        self.file: Any = None
        self.opened_by = "nobody"

    def open(self) -> None:
        """Open this process's own handle (and note which process it is)."""
        info = get_worker_info()
        self.file = open(self.path, "rb")  # kept open for the life of the process
        self.opened_by = "main process" if info is None else f"worker {info.id}"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "file": None, "opened_by": "nobody"}  # a handle cannot be pickled

    def close(self) -> None:
        """Close this process's handle, if it has one."""
        if self.file is not None:
            self.file.close()
            self.file, self.opened_by = None, "nobody"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int, str]:
        if not 0 <= idx < self.n:
            raise IndexError(f"index {idx} is out of range for {self.n} records")
        if self.file is None:
            self.open()
        self.file.seek(idx * self.record)
        raw = self.file.read(self.record)
        image = torch.frombuffer(bytearray(raw[1:]), dtype=torch.uint8).view(1, RECORD_SIDE, RECORD_SIDE)
        return image.float() / 255.0, raw[0], self.opened_by


def open_per_worker(worker_id: int) -> None:
    """``worker_init_fn``: open the dataset's file handle in this worker, once (``dataset.open()``)."""
    info = get_worker_info()
    if info is not None and hasattr(info.dataset, "open"):
        info.dataset.open()


class Span(IterableDataset):
    """Yields ``start, start + 1, ..., end - 1``. On its own, every worker would yield all of them:
    :func:`split_span` as ``worker_init_fn`` narrows each worker's copy to a contiguous block."""

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












# --------------------------------------------------------------------------- map-style datasets


class ImageDataset(Dataset):
    """The source chapter's path-based dataset, made whole: one image file per item.

    ``paths`` and ``labels`` are parallel sequences; ``loader`` opens one file
    (default: :func:`course_utils.data.load_image`, a grayscale PIL image);
    ``transform`` (optional) is applied to the image, never to the label.
    """

    def __init__(
        self,
        paths: Sequence[Path | str],
        labels: Sequence[int],
        transform: Callable | None = None,
        loader: Callable[[Path | str], Any] = load_image,
    ) -> None:
        if len(paths) != len(labels):
            raise ValueError(
                f"ImageDataset got {len(paths)} paths but {len(labels)} labels: "
                "they must be parallel lists, one label per image file."
            )
        self.paths = list(paths)
        self.labels = list(labels)
        self.transform = transform
        self.loader = loader

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int) -> tuple[Any, int]:
        image = self.loader(self.paths[idx])
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[idx]


def to_tensor(image: Image.Image) -> torch.Tensor:
    """A PIL image as a float32 tensor ``[C, H, W]`` in [0, 1], like ``transforms.ToTensor()``.

    Written with NumPy only, so that a worker started with *spawn* does not have to
    import torchvision (seconds) just to unpickle the transform.
    """
    a = np.asarray(image, dtype=np.float32) / 255.0
    if a.ndim == 2:
        a = a[None]
    else:
        a = a.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(a))


class WithIndex(Dataset):
    """Wrap a map-style dataset so each item comes back as ``(index, item)``.

    Used to prove that a loader delivered every item exactly once.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, idx: int) -> tuple[int, Any]:
        return idx, self.dataset[idx]


class SyntheticImages(Dataset):
    """A decode-heavy synthetic image set, generated on the fly and deterministic per index.

    Item ``i`` is made from a NumPy generator seeded with ``(seed, i)``: a smooth
    random colour background and a disc whose colour is set by the label. The image is
    encoded as JPEG bytes (what a file on disk would hold), then the loader does
    what a real one does: decode, resize to ``out_size``, convert to a float
    tensor, normalise with the ImageNet statistics. The same index gives the same
    tensor in any process, with any number of workers, in any order.
    """

    def __init__(
        self,
        n: int = 1024,
        size: int = 256,
        out_size: int = 128,
        num_classes: int = 10,
        seed: int = 0,
        quality: int = 90,
    ) -> None:
        if n < 1 or size < 8 or out_size < 1:
            raise ValueError("SyntheticImages needs n >= 1, size >= 8 and out_size >= 1")
        self.n, self.size, self.out_size = n, size, out_size
        self.num_classes, self.seed, self.quality = num_classes, seed, quality
        self._mean = np.array(IMAGENET_MEAN, dtype=np.float32)
        self._std = np.array(IMAGENET_STD, dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def label(self, idx: int) -> int:
        """The label of item `idx` (cheap: no image is made)."""
        return int(np.random.default_rng((self.seed, idx)).integers(self.num_classes))

    def encoded(self, idx: int) -> bytes:
        """The JPEG bytes of item `idx`: what would sit in a file on disk."""
        if not 0 <= idx < self.n:
            raise IndexError(f"index {idx} is out of range for a dataset of {self.n} images")
        rng = np.random.default_rng((self.seed, idx))
        label = int(rng.integers(self.num_classes))
        corners = rng.random((4, 3), dtype=np.float32)  # a background blending 4 random corner colours
        t = np.linspace(0.0, 1.0, self.size, dtype=np.float32)
        top = np.outer(1 - t, corners[0]) + np.outer(t, corners[1])  # [size, 3] along x
        bottom = np.outer(1 - t, corners[2]) + np.outer(t, corners[3])
        bg = (1 - t)[:, None, None] * top[None] + t[:, None, None] * bottom[None]
        img = Image.fromarray((bg * 255).astype(np.uint8), mode="RGB")
        cy, cx = rng.uniform(0.3, 0.7, size=2) * self.size
        r = rng.uniform(0.12, 0.3) * self.size
        hue = label / self.num_classes * 2 * np.pi
        colour = tuple(int(255 * (0.5 + 0.5 * np.cos(hue + k))) for k in (0.0, 2.1, 4.2))
        ImageDraw.Draw(img).ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=self.quality)
        return buf.getvalue()

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        with Image.open(io.BytesIO(self.encoded(idx))) as im:  # decode
            im = im.convert("RGB").resize((self.out_size, self.out_size), Image.Resampling.BILINEAR)
        # ToTensor + Normalize, done in NumPy so that the measurement compares worker
        # processes, not the main process's intra-op thread pool.
        x = np.asarray(im, dtype=np.float32) / 255.0
        x = (x - self._mean) / self._std
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), self.label(idx)


# --------------------------------------------------------------------------- variable-length items


class ToySequences(Dataset):
    """Variable-length token sequences, deterministic per index.

    Item ``i`` is ``(tokens, label)``: ``tokens`` an int64 tensor of length
    ``min_len..max_len`` with values ``1..vocab-1`` (0 is kept free for padding),
    ``label`` 1 when the sequence is longer than the midpoint of the length range,
    else 0. A model that cannot tell padding from content cannot learn it.
    """

    def __init__(self, n: int = 100, min_len: int = 2, max_len: int = 12, vocab: int = 20, seed: int = 0) -> None:
        if not 1 <= min_len <= max_len:
            raise ValueError("ToySequences needs 1 <= min_len <= max_len")
        self.n, self.min_len, self.max_len, self.vocab, self.seed = n, min_len, max_len, vocab, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        if not 0 <= idx < self.n:
            raise IndexError(f"index {idx} is out of range for {self.n} sequences")
        rng = np.random.default_rng((self.seed, idx))
        length = int(rng.integers(self.min_len, self.max_len + 1))
        tokens = torch.from_numpy(rng.integers(1, self.vocab, size=length)).to(torch.int64)
        return tokens, int(length > (self.min_len + self.max_len) / 2)

    def lengths(self) -> list[int]:
        """Every item's length, without building the items."""
        return [int(np.random.default_rng((self.seed, i)).integers(self.min_len, self.max_len + 1)) for i in range(self.n)]


class PaddedBatch(NamedTuple):
    """A batch of variable-length sequences: ``padded [B, T]``, ``lengths [B]``, ``mask [B, T]``, ``labels [B]``."""

    padded: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor


def pad_collate(batch: Sequence[tuple[torch.Tensor, int]], padding_value: int | float = 0) -> PaddedBatch:
    """``collate_fn`` for ``(sequence, label)`` items of different lengths.

    Pads every sequence to the longest one *in this batch* with `padding_value`,
    and keeps what padding destroys: each sequence's true length and a boolean
    mask (True on real tokens). Use ``functools.partial(pad_collate, padding_value=-1)``
    for another padding value.
    """
    if len(batch) == 0:
        raise ValueError("pad_collate got an empty batch")
    seqs = [torch.as_tensor(s) for s, _ in batch]
    if any(s.ndim != 1 for s in seqs):
        raise ValueError("pad_collate expects 1-D sequences (one token id per position)")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=padding_value)
    mask = torch.arange(padded.shape[1])[None, :] < lengths[:, None]
    labels = torch.tensor([int(y) for _, y in batch], dtype=torch.int64)
    return PaddedBatch(padded, lengths, mask, labels)


class LengthBucketBatchSampler(Sampler[list[int]]):
    """A batch sampler that puts items of similar length together (less padding).

    Each epoch: shuffle the indices, cut them into pools of ``pool_batches``
    batches, sort each pool by length, cut it into batches and shuffle the
    batches. Pass it as ``DataLoader(..., batch_sampler=...)``.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        pool_batches: int = 8,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.lengths = list(lengths)
        self.batch_size, self.pool_batches, self.drop_last = batch_size, pool_batches, drop_last
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        pool = self.batch_size * self.pool_batches
        batches: list[list[int]] = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: self.lengths[i])
            for b in range(0, len(chunk), self.batch_size):
                batches.append(chunk[b : b + self.batch_size])
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        for j in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[j]

    def __len__(self) -> int:
        n, pool = len(self.lengths), self.batch_size * self.pool_batches
        full, rest = divmod(n, pool)
        per_pool = pool // self.batch_size
        if self.drop_last:
            return full * per_pool + rest // self.batch_size
        return full * per_pool + -(-rest // self.batch_size)


# --------------------------------------------------------------------------- streaming


def write_digits_csv(path: Path | str, split: str = "train") -> int:
    """Write a split of the course digits as a text file, one image per line.

    Line format: ``index,label,p0,...,p783`` (pixels 0..255). Returns the number
    of lines. This stands in for data too large to hold in memory: the streams
    below read it one line at a time.
    """
    from .data import image_paths

    paths, labels = image_paths(split)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, (p, y) in enumerate(zip(paths, labels, strict=True)):
            pixels = np.asarray(load_image(p), dtype=np.uint8).ravel()
            f.write(f"{i},{y}," + ",".join(map(str, pixels.tolist())) + "\n")
    return len(paths)


def _parse_line(line: str) -> tuple[int, torch.Tensor, int]:
    values = np.array(line.rstrip("\n").split(","), dtype=np.int64)
    side = int(round((len(values) - 2) ** 0.5))
    image = torch.from_numpy(values[2:].astype(np.float32) / 255.0).view(1, side, side)
    return int(values[0]), image, int(values[1])


class NaiveDigitsStream(IterableDataset):
    """Streams ``(index, image, label)`` from a digits text file, lazily, one line at a time.

    **The classic bug**: every DataLoader worker gets its own copy of this object
    and runs ``__iter__`` from the top, so with N workers every item arrives N times.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _lines(self) -> Iterator[str]:
        with open(self.path) as f:
            yield from f  # the file is read as it is consumed, never loaded whole

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        for line in self._lines():
            yield _parse_line(line)


class ShardedDigitsStream(NaiveDigitsStream):
    """The fix: each worker keeps only its share of the lines (``line % shards == shard``).

    ``torch.utils.data.get_worker_info()`` says which worker this is (``None``
    in the main process). ``rank`` and ``world_size`` shard across processes of a
    distributed job too: shard = rank * workers + worker id.
    """

    def __init__(self, path: Path | str, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(path)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
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
    """How a stream or loader delivered items ``0..n-1``: total, distinct, duplicated, missing."""
    seen = Counter(int(i) for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices))
    return {
        "delivered": sum(seen.values()),
        "distinct": len(seen),
        "duplicated": sum(1 for c in seen.values() if c > 1),
        "missing": sum(1 for i in range(n) if i not in seen),
    }


# --------------------------------------------------------------------------- measuring loaders


@dataclass
class LoaderRun:
    """One measured loader configuration."""

    num_workers: int
    persistent_workers: bool
    prefetch_factor: int | None
    batch_size: int
    items: int
    epoch_seconds: list[float] = field(default_factory=list)
    each_item_once: bool = True

    @property
    def seconds(self) -> float:
        return float(sum(self.epoch_seconds))

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


def measure_throughput(
    dataset: Dataset,
    num_workers: int,
    *,
    batch_size: int = 32,
    epochs: int = 1,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    timeout: float = 120.0,
    multiprocessing_context: str | None = None,
) -> LoaderRun:
    """Time full epochs of a loader over `dataset`, from creating the iterator to the last batch.

    The clock includes starting the workers (that is what ``persistent_workers``
    saves from the second epoch on). Items come back with their index, so the
    run also records whether every epoch delivered every item exactly once.
    Loaders with workers get ``timeout``; the main process runs with one intra-op thread
    (:func:`one_main_thread`), like the workers.
    """
    if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
        raise ValueError(
            "persistent_workers and prefetch_factor only mean something with worker processes; "
            "use num_workers >= 1, or leave them at their defaults."
        )
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra = dict(
            timeout=timeout,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=multiprocessing_context,
        )
    wrapped = WithIndex(dataset)
    loader = DataLoader(wrapped, batch_size=batch_size, shuffle=False, num_workers=num_workers, **extra)
    n = len(wrapped)
    run = LoaderRun(num_workers, persistent_workers, prefetch_factor, batch_size, items=0)
    with one_main_thread():
        for _ in range(epochs):
            counts = torch.zeros(n, dtype=torch.int64)
            t0 = time.perf_counter()
            for idx, _item in loader:
                counts[idx] += 1
            run.epoch_seconds.append(time.perf_counter() - t0)
            run.items += int(counts.sum())
            run.each_item_once = run.each_item_once and bool((counts == 1).all())
    del loader  # shuts persistent workers down
    return run


@dataclass
class SteadyRun:
    """One ``num_workers`` setting measured in steady state.

    ``first_batch_s``: from creating the first iterator (which starts the workers) to the first
    batch: the start-up cost, paid once. ``epoch_seconds``: the timed epochs that followed a
    warm-up epoch, with persistent workers (nothing left to start).
    """

    num_workers: int
    batch_size: int
    items: int  # per epoch
    first_batch_s: float
    epoch_seconds: list[float] = field(default_factory=list)
    each_item_once: bool = True

    @property
    def median_s(self) -> float:
        return float(np.median(self.epoch_seconds))

    @property
    def items_per_s(self) -> float:
        """Images per second of the median epoch."""
        return self.items / self.median_s if self.median_s > 0 else float("inf")

    @property
    def spread(self) -> float:
        """(slowest - fastest epoch) / median: how much the repeats disagree."""
        return (max(self.epoch_seconds) - min(self.epoch_seconds)) / self.median_s if self.median_s > 0 else 0.0


def measure_steady(
    dataset: Dataset,
    num_workers: int,
    *,
    batch_size: int = 16,
    repeats: int = 3,
    timeout: float = 120.0,
    step: Callable[[Any], None] | None = None,
) -> SteadyRun:
    """Measure a loader in steady state: start-up separately, then the median of `repeats` epochs.

    One warm-up epoch first (its first batch gives ``first_batch_s``), then `repeats` timed
    epochs; workers are persistent, so the timed epochs start none. The main process runs with
    one intra-op thread, like the workers. `step`, if given, is called on every batch (a training
    step: the model in the loop). Every epoch must deliver every item exactly once.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra = dict(timeout=timeout, persistent_workers=True)
    wrapped = WithIndex(dataset)
    n = len(wrapped)
    loader = DataLoader(wrapped, batch_size=batch_size, shuffle=False, num_workers=num_workers, **extra)
    run = SteadyRun(num_workers, batch_size, n, first_batch_s=0.0)
    with one_main_thread():
        for epoch in range(repeats + 1):
            counts = torch.zeros(n, dtype=torch.int64)
            t0 = time.perf_counter()
            for k, (idx, item) in enumerate(loader):
                if epoch == 0 and k == 0:
                    run.first_batch_s = time.perf_counter() - t0
                if step is not None:
                    step(item)
                counts[idx] += 1
            if epoch > 0:
                run.epoch_seconds.append(time.perf_counter() - t0)
            run.each_item_once = run.each_item_once and bool((counts == 1).all())
    del loader  # shuts the persistent workers down
    return run


def format_steady(runs: Sequence[SteadyRun]) -> str:
    """A plain-text table: workers, start-up, median epoch, images/s, speed-up over 0 workers, spread."""
    zero = [r.items_per_s for r in runs if r.num_workers == 0]
    head = (f"{'workers':>7} {'1st batch s':>11} {'median epoch s':>14} {'images/s':>9} "
            f"{'x vs 0':>7} {'spread':>7} {'once':>5}")
    lines = [head, "-" * len(head)]
    for r in runs:
        speed = f"{r.items_per_s / zero[0]:7.2f}" if zero else f"{'-':>7}"
        lines.append(f"{r.num_workers:>7} {r.first_batch_s:11.3f} {r.median_s:14.3f} {r.items_per_s:9.1f} "
                     f"{speed} {r.spread:7.0%} {'yes' if r.each_item_once else 'NO':>5}")
    return "\n".join(lines)


def curve_summary(runs: Sequence[SteadyRun], cores: int, load: float | None, tolerance: float = 0.05) -> str:
    """What a measured curve says, in sentences computed from it (true whatever the numbers are)."""
    best = max(runs, key=lambda r: r.items_per_s)
    enough = min(r.num_workers for r in runs if r.items_per_s >= (1 - tolerance) * best.items_per_s)
    zero = [r for r in runs if r.num_workers == 0]
    gain = f", {best.items_per_s / zero[0].items_per_s:.2f}x the main process alone" if zero else ""
    where = ("below" if best.num_workers < cores else "at" if best.num_workers == cores else "above")
    lines = [
        f"Fastest here: num_workers={best.num_workers} at {best.items_per_s:.1f} images/s{gain}; "
        f"that is {where} this machine's {cores} cores.",
        f"The smallest num_workers within {tolerance:.0%} of the fastest: {enough}.",
    ]
    noise = max(r.spread for r in runs)
    lines.append(f"The repeats of one setting differed by up to {noise:.0%} of their median: "
                 f"differences smaller than that are noise.")
    slow_start = max(runs, key=lambda r: r.first_batch_s)
    lines.append(f"Start-up: the first batch took up to {slow_start.first_batch_s:.3f} s "
                 f"(num_workers={slow_start.num_workers}), paid once per loader with persistent workers.")
    if where == "above":
        lines.append("More workers than cores won here: check the load average; on a busy machine extra "
                     "processes take CPU from the neighbours.")
    warning = busy_warning(load, cores)
    if warning:
        lines.append(warning)
    return "\n".join(lines)


REFERENCE_PATH = Path(__file__).resolve().parent.parent / "data" / "loader_reference.json"


def reference_record(runs: Sequence[SteadyRun], settings: dict[str, Any], load_before: float | None,
                     load_after: float | None, busy: bool) -> dict[str, Any]:
    """The JSON record of a reference curve: the machine, the load, the settings and the points."""
    import datetime
    import platform

    return {
        "what": "DataLoader steady-state throughput against num_workers (benchmarks/loader_throughput.py)",
        "machine": {
            "cores": cpu_cores(),
            "processor": platform.processor() or platform.machine(),
            "system": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "torch": torch.__version__.split("+")[0],
            "load_average_before": None if load_before is None else round(load_before, 2),
            "load_average_after": None if load_after is None else round(load_after, 2),
            "quiet": not busy,
            "date": datetime.date.today().isoformat(),
        },
        "settings": settings,
        "points": [
            {"num_workers": r.num_workers, "images_per_s": round(r.items_per_s, 1),
             "first_batch_s": round(r.first_batch_s, 3), "epoch_seconds": [round(s, 4) for s in r.epoch_seconds]}
            for r in runs
        ],
    }


def load_reference(path: Path | str = REFERENCE_PATH) -> dict[str, Any]:
    """The stored reference curve (see :func:`reference_record`)."""
    import json

    return json.loads(Path(path).read_text())


def describe_reference(ref: dict[str, Any]) -> str:
    """One line about the machine and conditions a reference curve was measured on."""
    m = ref["machine"]
    load = m.get("load_average_before")
    state = "a quiet machine" if m.get("quiet") else "a BUSY machine (stored with --force: re-measure it on a quiet one)"
    return (f"reference: {m['cores']} cores, {m['system']}, torch {m['torch']}, {m['date']}, "
            f"load average {load} before the run: {state}")


def plot_curves(runs: Sequence[SteadyRun], cores: int, reference: dict[str, Any] | None = None) -> Any:
    """Two panels: images/s and speed-up over 0 workers against num_workers, this machine beside a reference."""
    import matplotlib.pyplot as plt

    fig, (ax_abs, ax_rel) = plt.subplots(1, 2, figsize=(11, 3.8))
    curves = [(f"this machine ({cores} cores)", [r.num_workers for r in runs], [r.items_per_s for r in runs], cores)]
    if reference is not None:
        pts = reference["points"]
        curves.append((f"reference ({reference['machine']['cores']} cores, load "
                       f"{reference['machine'].get('load_average_before')})",
                       [p["num_workers"] for p in pts], [p["images_per_s"] for p in pts], reference["machine"]["cores"]))
    for k, (label, xs, ys, c) in enumerate(curves):
        colour = f"C{k}"
        ax_abs.plot(xs, ys, "o-", color=colour, label=label)
        if 0 in xs:
            base = ys[xs.index(0)]
            ax_rel.plot(xs, [y / base for y in ys], "o-", color=colour, label=label)
        for ax in (ax_abs, ax_rel):
            ax.axvline(c, color=colour, ls="--", alpha=0.6)
    ax_rel.axhline(1.0, color="0.5", lw=0.8)
    ax_abs.set_ylabel("images per second (median epoch)")
    ax_rel.set_ylabel("speed-up over num_workers=0")
    ax_abs.set_title("Throughput (dashed: each machine's cores)")
    ax_rel.set_title("Relative to loading in the main process")
    for ax in (ax_abs, ax_rel):
        ax.set_xlabel("num_workers")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


class TinyNet(torch.nn.Module):
    """A tiny image classifier for "the model in the loop": pool to 16x16, one conv, one linear layer."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(16)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 16 * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(self.pool(x))).flatten(1))


def training_seconds(
    dataset: Dataset, worker_counts: Sequence[int], *, batch_size: int = 16, repeats: int = 3, timeout: float = 120.0
) -> dict[int, list[float]]:
    """``{num_workers: [seconds of each timed training epoch]}`` with :class:`TinyNet` trained in the loop.

    Each setting: a warm-up epoch, then `repeats` timed epochs (persistent workers), every batch
    a forward, backward and SGD step, so the workers compete with training for the cores.
    """
    out: dict[int, list[float]] = {}
    with torch.random.fork_rng(devices=[]):  # seeded models; the caller's random stream is left alone
        for w in worker_counts:
            torch.manual_seed(0)
            model = TinyNet()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)

            def step(batch: Any, model: TinyNet = model, opt: torch.optim.Optimizer = opt) -> None:
                x, y = batch
                loss = torch.nn.functional.cross_entropy(model(x), torch.as_tensor(y))
                opt.zero_grad()
                loss.backward()
                opt.step()

            out[w] = measure_steady(dataset, w, batch_size=batch_size, repeats=repeats, timeout=timeout, step=step).epoch_seconds
    return out


def format_seconds(seconds: dict[int, Sequence[float]]) -> str:
    """``{num_workers: [epoch seconds]}`` as a small table with each setting's median."""
    lines = [f"{'workers':>7}  {'median s':>8}  epochs s"]
    for w in sorted(seconds):
        times = list(seconds[w])
        lines.append(f"{w:>7}  {float(np.median(times)):8.3f}  " + ", ".join(f"{t:.3f}" for t in times))
    return "\n".join(lines)


def format_runs(runs: Sequence[LoaderRun], baseline: float | None = None) -> str:
    """A plain-text table of runs: workers, persistent, prefetch, epochs' seconds, images/s, speed-up."""
    if baseline is None:
        zero = [r.items_per_s for r in runs if r.num_workers == 0]
        baseline = zero[0] if zero else None
    head = f"{'workers':>7} {'persistent':>10} {'prefetch':>8} {'epoch 1 s':>9} {'later s':>8} {'images/s':>9} {'x vs 0':>7} {'once':>5}"
    lines = [head, "-" * len(head)]
    for r in runs:
        later = sum(r.epoch_seconds[1:]) / max(1, len(r.epoch_seconds) - 1) if len(r.epoch_seconds) > 1 else float("nan")
        later_s = f"{later:8.3f}" if later == later else f"{'-':>8}"
        pf = "-" if r.num_workers == 0 else str(r.prefetch_factor if r.prefetch_factor is not None else 2)
        pers = "-" if r.num_workers == 0 else ("yes" if r.persistent_workers else "no")
        speed = f"{r.items_per_s / baseline:7.2f}" if baseline else f"{'-':>7}"
        lines.append(
            f"{r.num_workers:>7} {pers:>10} {pf:>8} {r.epoch_seconds[0]:9.3f} {later_s} "
            f"{r.items_per_s:9.1f} {speed} {'yes' if r.each_item_once else 'NO':>5}"
        )
    return "\n".join(lines)


def plot_throughput(
    runs: Sequence[LoaderRun], cores: int | None = None, ax: Any = None, label: str | None = None, marks: bool = True
) -> Any:
    """Images per second against ``num_workers``, with the core count and the source's "2-4x cores" band.

    Pass an existing `ax` and ``marks=False`` to add a second curve without repeating the marks.
    """
    import matplotlib.pyplot as plt

    cores = cores or cpu_cores()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    xs = [r.num_workers for r in runs]
    ys = [r.items_per_s for r in runs]
    ax.plot(xs, ys, "o-", label=label or "measured")
    lo, hi = 2 * cores, 4 * cores
    if marks:
        ax.axvline(cores, color="tab:red", ls="--", label=f"CPU cores on this machine ({cores})")
        ax.axvspan(lo, hi, color="tab:orange", alpha=0.15, label=f"source's rule: 2-4x cores ({lo}-{hi})")
    ax.set_xlim(-0.5, max(max(xs), hi, ax.get_xlim()[1] - 0.5) + 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("images per second")
    ax.set_title("DataLoader throughput against num_workers (decode-heavy images)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def tensor_stats(x: torch.Tensor, name: str = "") -> str:
    """One deterministic line: shape, dtype, min, max and the mean of each channel (4 decimals)."""
    x = x.detach()
    xf = x.to(torch.float64)
    means = xf.reshape(x.shape[0], -1).mean(dim=1).tolist() if x.ndim == 3 else [xf.mean().item()]
    m = ", ".join(f"{v:.4f}" for v in means)
    prefix = f"{name:<12} " if name else ""
    return f"{prefix}shape {tuple(x.shape)} {str(x.dtype).replace('torch.', '')} min {xf.min().item():.4f} max {xf.max().item():.4f} mean/channel [{m}]"


# --------------------------------------------------------------------------- batch browser

SAMPLERS = ("default", "sequential", "random", "weighted")
BATCH_BROWSER_DEFAULTS: dict[str, Any] = dict(batch_size=16, shuffle=True, seed=0, sampler="default", epoch=0, batch=0)


def class_balanced_weights(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Per-sample weights ``1 / count(label)`` for ``WeightedRandomSampler``: every class drawn equally often."""
    y = torch.as_tensor(labels, dtype=torch.int64)
    counts = torch.bincount(y)
    return 1.0 / counts[y].to(torch.float64)


class _Range(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> int:
        return idx


def _as_list(batch: list[int]) -> list[int]:
    return list(batch)


@dataclass
class BatchView:
    """What a DataLoader hands out in one epoch, and the batch picked out of it."""

    order: list[int]
    batches: list[list[int]]
    batch: int
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
    drop_last: bool = False,
) -> BatchView:
    """The indices a real ``DataLoader`` yields in epoch `epoch` (counting from 0), and batch `batch`.

    ``sampler``: ``"default"`` lets ``shuffle`` decide (True -> RandomSampler,
    False -> SequentialSampler), ``"sequential"``, ``"random"``, or ``"weighted"``
    (``WeightedRandomSampler`` with class-balanced weights, with replacement).
    One ``torch.Generator`` seeded with `seed` drives the loader, as in
    ``DataLoader(..., generator=torch.Generator().manual_seed(seed))``; each
    epoch continues its stream, which is why epochs differ.
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, not {sampler!r}")
    if sampler != "default" and shuffle:
        raise ValueError(
            f"shuffle=True cannot be combined with sampler={sampler!r}: shuffle=True *is* a "
            "RandomSampler, and DataLoader refuses both ('sampler option is mutually exclusive "
            "with shuffle'). Untick shuffle, or pick sampler 'default'."
        )
    n = len(labels)
    g = torch.Generator().manual_seed(seed)
    ds = _Range(n)
    smp: Sampler | None = None
    if sampler == "sequential":
        smp = SequentialSampler(ds)
    elif sampler == "random":
        smp = RandomSampler(ds, generator=g)
    elif sampler == "weighted":
        smp = WeightedRandomSampler(class_balanced_weights(labels), num_samples=n, replacement=True, generator=g)
    loader = DataLoader(ds, batch_size=batch_size, shuffle=shuffle if smp is None else None, sampler=smp,
                        drop_last=drop_last, generator=g, collate_fn=_as_list)
    batches: list[list[int]] = []
    for _ in range(epoch + 1):
        batches = list(loader)
    if not batches:
        raise ValueError(f"no batch at all: {n} items with batch_size={batch_size} and drop_last={drop_last}")
    b = min(max(batch, 0), len(batches) - 1)
    order = [i for bt in batches for i in bt]
    used = type(loader.sampler).__name__
    return BatchView(order, batches, b, batches[b], [int(labels[i]) for i in batches[b]], used, epoch)


def draw_batch_view(view: BatchView, images: torch.Tensor, classes: Sequence[str] | None = None) -> Any:
    """Draw the batch's images with their labels, and the epoch's index order with the batch highlighted."""
    import matplotlib.pyplot as plt

    k = len(view.indices)
    cols = min(16, k)
    rows = -(-k // cols)
    # explicit layout in inches: title, rows of images (each with a two-line title), then the order plot
    width, left, right, top, row_h, gap, plot_h, bottom = 10.0, 0.8, 0.2, 0.5, 0.95, 0.3, 2.2, 0.55
    height = top + rows * row_h + gap + plot_h + bottom
    fig = plt.figure(figsize=(width, height))
    cell = (width - left - right) / cols
    side = min(cell * 0.92, row_h - 0.35)
    for j, idx in enumerate(view.indices):
        r, c = divmod(j, cols)
        x0 = left + c * cell + (cell - side) / 2
        y0 = height - top - (r + 1) * row_h
        ax = fig.add_axes((x0 / width, y0 / height, side / width, side / height))
        img = images[idx].detach().cpu()
        ax.imshow((img.squeeze(0) if img.shape[0] == 1 else img.permute(1, 2, 0)).numpy(), cmap="gray_r")
        name = classes[view.labels[j]] if classes else str(view.labels[j])
        ax.set_title(f"#{idx}\ny={name}", fontsize=7)
        ax.axis("off")
    ax = fig.add_axes((left / width, bottom / height, (width - left - right) / width, plot_h / height))
    pos = np.arange(len(view.order))
    ax.scatter(pos, view.order, s=2, color="0.6", label="epoch order")
    start = sum(len(b) for b in view.batches[: view.batch])
    ax.scatter(pos[start : start + k], view.indices, s=10, color="tab:red", label=f"batch {view.batch}")
    ax.set_xlabel("position in the epoch")
    ax.set_ylabel("dataset index")
    ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(
        f"{view.sampler}, epoch {view.epoch}: batch {view.batch} of {len(view.batches)} ({k} images)",
        fontsize=10, y=1 - 0.12 / height, va="top",
    )
    return fig


def batch_browser(images: torch.Tensor, labels: Sequence[int], classes: Sequence[str] | None = None) -> Any:
    """An ipywidgets browser over :func:`batch_view`: batch size, shuffle, seed, sampler, epoch, batch."""
    import ipywidgets as w

    from .figures import show_figure

    d = BATCH_BROWSER_DEFAULTS
    n = len(labels)
    bs = w.IntSlider(value=d["batch_size"], min=4, max=64, step=4, description="batch size")
    shuffle = w.Checkbox(value=d["shuffle"], description="shuffle")
    seed = w.IntSlider(value=d["seed"], min=0, max=9, description="seed")
    sampler = w.Dropdown(options=list(SAMPLERS), value=d["sampler"], description="sampler")
    epoch = w.IntSlider(value=d["epoch"], min=0, max=4, description="epoch")
    batch = w.IntSlider(value=d["batch"], min=0, max=-(-n // d["batch_size"]) - 1, description="batch")
    out = w.Output()

    def redraw(*_: Any) -> None:
        batch.max = -(-n // bs.value) - 1
        with out:
            out.clear_output(wait=True)
            try:
                view = batch_view(labels, bs.value, shuffle.value, seed.value, sampler.value, epoch.value, batch.value)
            except ValueError as exc:
                print(f"DataLoader would refuse this: {exc}")
                return
            print("indices:", view.indices)
            show_figure(draw_batch_view(view, images, classes))

    for ctl in (bs, shuffle, seed, sampler, epoch, batch):
        ctl.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([bs, shuffle, seed]), w.HBox([sampler, epoch, batch]), out])

