"""Chapter 03 exercises: a file-list Dataset, a padding collate_fn, a sharded stream, sampler weights, and
the rule that picks num_workers from epoch times measured with a model in the loop."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ..data import image_paths, load_image
from .core import Exercise, Incorrect, as_ints, as_number, as_tensor, kind, take


class MyDataset(Dataset):
    def __init__(self, paths, labels, transform=None):
        self.paths, self.labels, self.transform = paths, labels, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, idx):
        image = load_image(self.paths[idx])
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[idx]


def _files():
    paths, labels = image_paths("test")
    return [([paths[i] for i in pick], [labels[i] for i in pick]) for pick in ([0, 40, 80, 120, 160], [300, 10, 210])]


def _item(pair: Any, i: int) -> tuple:
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise Incorrect(f"`dataset[{i}]` should return a pair `(image, label)`, but it returns {kind(pair)}. Without the label the DataLoader has nothing to train against.")
    image, label = pair
    image = image if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image))
    return image.detach(), as_number(label, f"the label of `dataset[{i}]`", whole=True)


def _dataset_facts(cls, case):
    from torchvision.transforms import ToTensor

    paths, labels = case
    ds = cls(list(paths), list(labels))
    yield "len(dataset)", as_number(len(ds), "len(dataset)", whole=True)
    yield "each (image, label) of the dataset", [_item(ds[i], i) for i in range(len(paths))]
    ds = cls(list(paths), list(labels), transform=ToTensor())
    yield "each (image, label) with transform=ToTensor()", [_item(ds[i], i) for i in range(len(paths))]


def _dataset_like(getitem=None, length=None):
    return type("MyDataset", (MyDataset,), {k: v for k, v in (("__getitem__", getitem), ("__len__", length)) if v})


q1 = Exercise(
    name="Q1",
    prompt="Write `MyDataset(paths, labels, transform=None)`: `__len__` and `__getitem__` returning `(image, label)`.",
    model_answer=MyDataset,
    form=Dataset,
    cases=_files,
    observe=_dataset_facts,
    describe=lambda c: f"for the {len(c[0])} files {[p.name for p in c[0]]}",
    hints=[
        "`__len__` returns how many items there are: the number of paths.",
        "`__getitem__(self, idx)` opens `self.paths[idx]` with `load_image`, applies `self.transform` if there is one, and returns `(image, self.labels[idx])`.",
    ],
    mistakes={
        "with `transform=ToTensor()` the image should come back as a tensor: apply `self.transform` to the image when it is not None.": _dataset_like(lambda s, i: (load_image(s.paths[i]), s.labels[i])),
        "`dataset[i]` should return a pair `(image, label)`: without the label the DataLoader has nothing to train against.": _dataset_like(lambda s, i: load_image(s.paths[i])),
        "`__len__` is off by one: it should return len(self.paths).": _dataset_like(length=lambda s: len(s.paths) - 1),
    },
)


def collate(batch):
    seqs = [s for s, _ in batch]
    lengths = torch.tensor([len(s) for s in seqs])
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
    labels = torch.tensor([y for _, y in batch])
    return padded, lengths, labels


def _batches():
    def b(*items):
        return [(torch.tensor(s), y) for s, y in items]

    return [b(([3, 1, 4], 0), ([1, 5], 1), ([9, 2, 6, 5], 1)), b(([7], 2), ([8, 8, 8, 8, 8], 0)), b(([4, 2], 1),)]


def _collate_facts(fn, batch):
    out = fn([(s.clone(), y) for s, y in batch])
    if not isinstance(out, tuple | list):
        raise Incorrect(f"`collate(batch)` should return `(padded, lengths, labels)`, not {kind(out)}.")
    yield "the number of things returned", len(out)
    padded, lengths, labels = out
    yield "padded", as_tensor(padded, "`padded`")
    yield "lengths", as_ints(as_tensor(lengths, "`lengths`"), "`lengths`")
    yield "labels", as_ints(as_tensor(labels, "`labels`"), "`labels`")


q2 = Exercise(
    name="Q2",
    prompt="Write `collate(batch)` for `(sequence, label)` items: return `(padded, lengths, labels)`, all tensors.",
    model_answer=collate,
    cases=_batches,
    observe=_collate_facts,
    describe=lambda b: f"for the batch {[(s.tolist(), y) for s, y in b]}",
    hints=[
        "`torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)` pads a list of 1-D tensors.",
        "Record `len(s)` of every sequence *before* padding: `torch.tensor([len(s) for s in seqs])`.",
    ],
    mistakes={
        "`collate(batch)` should return 3 things: `(padded, lengths, labels)`. Padding destroys each sequence's true length: return the lengths too, or nothing downstream can tell a padded 0 from a real token.": lambda batch: collate(batch)[::2],
        "you cut every sequence to the shortest one: pad them at the end to the longest one instead (nothing cut off).": lambda batch: (torch.stack([s[: min(len(t) for t, _ in batch)] for s, _ in batch]),
                        torch.full((len(batch),), min(len(t) for t, _ in batch)), torch.tensor([y for _, y in batch])),
    },
)


def _as_workers(ds: Any, num_workers: int, limit: int | None = None) -> list[int]:
    """Iterate `ds` as `num_workers` DataLoader workers would (each on its own copy), in this process;
    at most `limit` items per worker."""
    from torch.utils.data._utils import worker as _w

    def items(d: Any) -> list[int]:
        return [int(x) for x in (d if limit is None else take(d, limit))]

    if num_workers == 0:
        return items(ds)
    saved, out = _w._worker_info, []
    try:
        for wid in range(num_workers):
            copy_ = copy.deepcopy(ds)
            _w._worker_info = _w.WorkerInfo(id=wid, num_workers=num_workers, seed=wid, dataset=copy_)
            out += items(copy_)
    finally:
        _w._worker_info = saved
    return out


class ShardedRange(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, self.n, workers))


def _shard_like(share):
    return type("ShardedRange", (ShardedRange,), {"__iter__": lambda self: iter(share(self.n, *(
        (0, 1) if get_worker_info() is None else (get_worker_info().id, get_worker_info().num_workers))))})


q3 = Exercise(
    name="Q3",
    prompt="Write `ShardedRange(n)`, an IterableDataset yielding 0..n-1 once in total, whatever num_workers is.",
    model_answer=ShardedRange,
    form=IterableDataset,
    cases=lambda: [(10, 0), (10, 2), (10, 3), (11, 4), (3, 4)],
    observe=lambda cls, c: sorted(_as_workers(cls(c[0]), c[1], limit=c[0] + 1)),
    describe=lambda c: f"for n={c[0]} with num_workers={c[1]}, the items delivered (sorted)",
    hints=[
        "`torch.utils.data.get_worker_info()` returns None in the main process, and an object with `.id` and `.num_workers` inside a worker.",
        "Worker `id` out of `k` workers can take `range(id, n, k)`: every k-th item, starting at its own id.",
    ],
    mistakes={
        "some items came more than once: every worker runs `__iter__` on its own copy of the dataset, so each one must keep only its share (use `get_worker_info()`).": _shard_like(lambda n, w, k: range(n)),
        "some items never came: the shares must cover every item, including the remainder when n is not a multiple of the number of workers.": _shard_like(lambda n, w, k: range(w * (n // k), (w + 1) * (n // k))),
    },
)


def balanced_weights(labels):
    counts = torch.bincount(labels)
    return 1.0 / counts[labels].double()


def _weight_facts(fn, labels):
    w = as_tensor(fn(labels.clone()), "`balanced_weights(labels)`")
    yield "the shape of the weights", tuple(w.shape)
    w = w.double()
    yield "every weight is positive", bool((w > 0).all())
    per_class = torch.stack([w[labels == c].sum() for c in labels.unique()])
    yield "the share of draws each class gets", per_class / per_class.sum()


q4 = Exercise(
    name="Q4",
    prompt="Write `balanced_weights(labels)`: a 1-D tensor with one weight per sample, so that WeightedRandomSampler draws every class equally.",
    model_answer=balanced_weights,
    cases=lambda: [torch.tensor([0, 0, 0, 0, 1, 2, 2, 0, 1, 0]), torch.tensor([3, 1, 1, 3, 3, 3, 3]), torch.tensor([2, 0, 2, 2])],
    observe=_weight_facts,
    describe=lambda labels: f"for labels {labels.tolist()}",
    hints=[
        "`torch.bincount(labels)` counts how many samples each class has.",
        "Index that count tensor with `labels` to get each sample's class size, then take 1 / it.",
    ],
    mistakes={
        "WeightedRandomSampler wants one weight per *sample* (shape [N]), not one per class.": lambda labels: 1.0 / torch.bincount(labels).double(),
        "with your weights the big classes are drawn more often, not less: a sample's weight should be 1 / (how many samples share its label).": lambda labels: torch.bincount(labels)[labels].double(),
    },
)


def pick_num_workers(seconds):
    medians = {w: sorted(times)[len(times) // 2] for w, times in seconds.items()}
    best = min(medians.values())
    return min(w for w, m in medians.items() if m <= 1.05 * best)


def _timings():
    # {num_workers: seconds of each timed epoch}: what `loading.training_seconds` returns
    return [
        {0: [2.0, 2.1, 2.05], 1: [1.2, 1.1, 1.15], 2: [0.80, 0.82, 0.81], 4: [0.79, 0.80, 0.95]},  # 4 fastest, 2 close
        {0: [1.0, 1.0, 1.0], 1: [0.60, 3.0, 0.62], 2: [0.70, 0.71, 0.69]},  # one slow epoch of 1 worker
        {0: [1.0, 1.02, 0.98], 2: [0.70, 0.92, 0.94], 4: [0.80, 0.82, 0.81]},  # one lucky epoch of 2 workers
        {8: [0.50, 0.50, 0.50], 0: [2.0, 2.0, 2.0], 3: [0.52, 0.51, 0.50], 1: [0.54, 0.53, 0.54]},  # keys unsorted
        {0: [1.3], 1: [0.9], 2: [1.1]},  # one epoch each
        {0: [0.40, 0.41, 0.40], 1: [0.45, 0.44, 0.46], 2: [0.60, 0.58, 0.59]},  # workers only cost here
    ]


def _pick_facts(fn, seconds):
    shown = {w: list(t) for w, t in seconds.items()}
    yield "the num_workers picked", as_number(fn(shown), "`pick_num_workers(seconds)`", whole=True)


def _median(times):
    return sorted(times)[len(times) // 2]


q5 = Exercise(
    name="Q5",
    prompt=("Write `pick_num_workers(seconds)`: `seconds` maps each num_workers tried to the seconds of its timed "
            "epochs (an odd number of them). Return, as a whole number, the smallest num_workers whose median "
            "epoch time is at most 1.05 x the best median."),
    model_answer=pick_num_workers,
    cases=_timings,
    observe=_pick_facts,
    describe=lambda s: f"for seconds = {s}",
    hints=[
        "Judge each setting by the median of its epochs (`sorted(times)[len(times) // 2]`): one slow or lucky epoch "
        "must not decide. Then find the best median.",
        "Among the settings whose median is at most 1.05 x the best one, return the smallest num_workers: "
        "`min(w for w, m in medians.items() if m <= 1.05 * best)`. More workers that buy under 5% cost memory and "
        "cores for nothing.",
    ],
    mistakes={
        "you returned the fastest setting; return the *smallest* num_workers whose median is within 5% of the best: "
        "more workers that buy less than 5% cost memory and cores for nothing.":
            lambda seconds: min(seconds, key=lambda w: _median(seconds[w])),
        "you judged each setting by its mean: one slow epoch (another program woke up) drags a mean, not a median. "
        "Use the median of each setting's epochs.":
            lambda seconds: (lambda m: min(w for w in m if m[w] <= 1.05 * min(m.values())))(
                {w: sum(t) / len(t) for w, t in seconds.items()}),
        "you judged each setting by its fastest epoch: one lucky epoch is not what training will see. Use the median "
        "of each setting's epochs.":
            lambda seconds: (lambda m: min(w for w in m if m[w] <= 1.05 * min(m.values())))(
                {w: min(t) for w, t in seconds.items()}),
    },
)

EXERCISES = [q1, q2, q3, q4, q5]
