"""Chapter 03 exercises: a file-list Dataset, a padding collate_fn, a sharded stream, sampler weights."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from .core import Exercise, Incorrect, expect_tensor, expect_type

# --------------------------------------------------------------------------- Q1: a Dataset over a file list


def _q1_files() -> tuple[list, list[int]]:
    from ..data import image_paths

    paths, labels = image_paths("test")
    pick = [0, 40, 80, 120, 160]  # five files of different classes
    return [paths[i] for i in pick], [labels[i] for i in pick]


def _check_q1(cls: Any) -> None:
    from torchvision.transforms import ToTensor

    from ..data import load_image

    if not isinstance(cls, type):
        raise Incorrect(
            f"pass the class itself (`q1.check(MyDataset)`, no parentheses), not {type(cls).__name__!r}."
        )
    paths, labels = _q1_files()
    ds = cls(paths, labels)
    n = len(ds)
    if n != len(paths):
        raise Incorrect(f"with {len(paths)} paths, len(dataset) is {n}: `__len__` should return len(self.paths).")
    item = ds[2]
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise Incorrect(
            "`dataset[i]` should return a pair `(image, label)`; yours returns "
            f"a {type(item).__name__}. Without the label the DataLoader has nothing to train against."
        )
    image, label = item
    want = np.asarray(load_image(paths[2]))
    got = np.asarray(image)
    if got.shape != want.shape or not np.array_equal(got, want):
        raise Incorrect("`dataset[2]` does not hold the image of `paths[2]`: open `self.paths[idx]` with `load_image`.")
    if int(label) != labels[2]:
        raise Incorrect(f"`dataset[2]` has label {label!r}, but `labels[2]` is {labels[2]}: return `self.labels[idx]`.")
    ds_t = cls(paths, labels, transform=ToTensor())
    image_t, label_t = ds_t[3]
    if not isinstance(image_t, torch.Tensor):
        raise Incorrect(
            "with `transform=ToTensor()` the image should come back as a tensor, but it is "
            f"of type {type(image_t).__name__}: apply `self.transform` to the image when it is not None."
        )
    expect_tensor(image_t, ToTensor()(load_image(paths[3])), "the transformed image of item 3")
    if int(label_t) != labels[3]:
        raise Incorrect("the label changed when a transform was given: transform the image only, never the label.")


def _q1_solution() -> type:
    from ..data import load_image

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

    return MyDataset


def _q1_no_transform() -> type:
    base = _q1_solution()

    class ForgetsTransform(base):  # type: ignore[misc, valid-type]
        def __getitem__(self, idx):
            from ..data import load_image

            return load_image(self.paths[idx]), self.labels[idx]

    return ForgetsTransform


def _q1_image_only() -> type:
    base = _q1_solution()

    class ImageOnly(base):  # type: ignore[misc, valid-type]
        def __getitem__(self, idx):
            return super().__getitem__(idx)[0]

    return ImageOnly


def _q1_off_by_one() -> type:
    base = _q1_solution()

    class OffByOne(base):  # type: ignore[misc, valid-type]
        def __len__(self):
            return len(self.paths) - 1

    return OffByOne


q1 = Exercise(
    name="Q1",
    prompt="Write `MyDataset(paths, labels, transform=None)`: `__len__` and `__getitem__` returning `(image, label)`.",
    checker=_check_q1,
    hints=[
        "`__len__` returns how many items there are: the number of paths.",
        "`__getitem__(self, idx)` opens `self.paths[idx]` with `load_image`, applies `self.transform` "
        "if there is one, and returns `(image, self.labels[idx])`.",
    ],
    solution_code='''
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

q1.check(MyDataset)''',
    solve=_q1_solution,
    wrong_answers=[
        ("forgets to apply the transform", _q1_no_transform),
        ("returns the image without its label", _q1_image_only),
        ("__len__ off by one", _q1_off_by_one),
    ],
)

# --------------------------------------------------------------------------- Q2: a padding collate_fn

_Q2_BATCH = [(torch.tensor([3, 1, 4]), 0), (torch.tensor([1, 5]), 1), (torch.tensor([9, 2, 6, 5]), 1)]


def _check_q2(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect(f"pass your function itself (`q2.check(collate)`), not a {type(fn).__name__}.")
    out = fn([(s.clone(), y) for s, y in _Q2_BATCH])
    if not isinstance(out, tuple | list):
        raise Incorrect(f"`collate(batch)` should return `(padded, lengths, labels)`, not a {type(out).__name__}.")
    if len(out) != 3:
        raise Incorrect(
            f"`collate(batch)` returned {len(out)} things; it should return 3: `(padded, lengths, labels)`. "
            "Padding destroys each sequence's true length: return the lengths too, or nothing downstream "
            "can tell a padded 0 from a real token."
        )
    padded, lengths, labels = out
    want = torch.tensor([[3, 1, 4, 0], [1, 5, 0, 0], [9, 2, 6, 5]])
    expect_type(padded, torch.Tensor, "`padded`")
    if tuple(padded.shape) != (3, 4):
        raise Incorrect(
            f"`padded` has shape {tuple(padded.shape)}; for sequences of lengths 3, 2, 4 it should be (3, 4): "
            "one row per sequence, padded at the end to the longest one in the batch (nothing cut off)."
        )
    expect_tensor(padded, want, "`padded`", check_dtype=False, why="Pad with 0 at the end of each row.")
    expect_tensor(lengths, torch.tensor([3, 2, 4]), "`lengths`", check_dtype=False, why="The lengths before padding, in batch order.")
    expect_tensor(labels, torch.tensor([0, 1, 1]), "`labels`", check_dtype=False, why="One label per item, in batch order.")
    from ..loading import ToySequences

    loader = DataLoader(ToySequences(10, seed=3), batch_size=4, collate_fn=fn)
    total = sum(int(torch.as_tensor(b[1]).sum()) for b in loader)
    if total != sum(len(ToySequences(10, seed=3)[i][0]) for i in range(10)):
        raise Incorrect("inside a DataLoader your lengths do not add up to the sequences' true lengths.")


def _q2_solution() -> Callable:
    def collate(batch):
        seqs = [s for s, _ in batch]
        lengths = torch.tensor([len(s) for s in seqs])
        padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
        labels = torch.tensor([y for _, y in batch])
        return padded, lengths, labels

    return collate


def _q2_drops_lengths() -> Callable:
    def collate(batch):
        padded = torch.nn.utils.rnn.pad_sequence([s for s, _ in batch], batch_first=True)
        return padded, torch.tensor([y for _, y in batch])

    return collate


def _q2_truncates() -> Callable:
    def collate(batch):
        shortest = min(len(s) for s, _ in batch)
        padded = torch.stack([s[:shortest] for s, _ in batch])
        lengths = torch.full((len(batch),), shortest)
        return padded, lengths, torch.tensor([y for _, y in batch])

    return collate


q2 = Exercise(
    name="Q2",
    prompt="Write `collate(batch)` for `(sequence, label)` items: return `(padded, lengths, labels)`.",
    checker=_check_q2,
    hints=[
        "`torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)` pads a list of 1-D tensors.",
        "Record `len(s)` of every sequence *before* padding: `torch.tensor([len(s) for s in seqs])`.",
    ],
    solution_code='''
def collate(batch):
    seqs = [s for s, _ in batch]
    lengths = torch.tensor([len(s) for s in seqs])
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
    labels = torch.tensor([y for _, y in batch])
    return padded, lengths, labels

q2.check(collate)''',
    solve=_q2_solution,
    wrong_answers=[
        ("drops the lengths", _q2_drops_lengths),
        ("truncates every sequence to the shortest", _q2_truncates),
    ],
)

# --------------------------------------------------------------------------- Q3: shard an IterableDataset


def _as_workers(ds: Any, num_workers: int) -> list[int]:
    """Iterate `ds` as `num_workers` DataLoader workers would (each on its own copy), in this process."""
    from torch.utils.data._utils import worker as _w

    if num_workers == 0:
        return [int(x) for x in ds]
    saved = _w._worker_info
    out: list[int] = []
    try:
        for wid in range(num_workers):
            copy_ = copy.deepcopy(ds)
            _w._worker_info = _w.WorkerInfo(id=wid, num_workers=num_workers, seed=wid, dataset=copy_)
            out += [int(x) for x in copy_]
    finally:
        _w._worker_info = saved
    return out


def _check_q3(cls: Any) -> None:
    if not isinstance(cls, type):
        raise Incorrect(f"pass the class itself (`q3.check(ShardedRange)`), not a {type(cls).__name__}.")
    ds0 = cls(10)
    if not isinstance(ds0, IterableDataset):
        raise Incorrect("your class should subclass `torch.utils.data.IterableDataset`.")
    for n in (10, 11):
        for workers in (0, 2, 3, 4):
            got = Counter(_as_workers(cls(n), workers))
            dup = sorted(i for i, c in got.items() if c > 1)
            missing = [i for i in range(n) if i not in got]
            extra = sorted(i for i in got if not 0 <= i < n)
            who = "in the main process (num_workers=0)" if workers == 0 else f"with num_workers={workers}"
            if dup:
                raise Incorrect(
                    f"{who}, items {dup[:6]} came more than once: every worker runs `__iter__` on its own "
                    "copy of the dataset, so each one must keep only its share (use `get_worker_info()`)."
                )
            if missing:
                raise Incorrect(
                    f"for n={n} {who}, items {missing[:6]} never came: the shares must cover every item, "
                    "including the remainder when n is not a multiple of the number of workers."
                )
            if extra:
                raise Incorrect(f"for n={n} {who}, items {extra[:6]} are outside range(n).")


class _Q3Solution(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, self.n, workers))


class _Q3Everyone(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class _Q3DropsRemainder(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        per = self.n // workers
        return iter(range(worker * per, (worker + 1) * per))


q3 = Exercise(
    name="Q3",
    prompt="Write `ShardedRange(n)`, an IterableDataset yielding 0..n-1 once in total, whatever num_workers is.",
    checker=_check_q3,
    hints=[
        "`torch.utils.data.get_worker_info()` returns None in the main process, and an object with "
        "`.id` and `.num_workers` inside a worker.",
        "Worker `id` out of `k` workers can take `range(id, n, k)`: every k-th item, starting at its own id.",
    ],
    solution_code='''
class ShardedRange(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, self.n, workers))

q3.check(ShardedRange)''',
    solve=lambda: _Q3Solution,
    wrong_answers=[
        ("every worker yields everything (duplicates)", lambda: _Q3Everyone),
        ("contiguous chunks of n // workers (loses the remainder)", lambda: _Q3DropsRemainder),
    ],
)

# --------------------------------------------------------------------------- Q4: weights for WeightedRandomSampler

_Q4_LABELS = torch.tensor([0, 0, 0, 0, 1, 2, 2, 0, 1, 0])


def _check_q4(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect(f"pass your function itself (`q4.check(balanced_weights)`), not a {type(fn).__name__}.")
    w = fn(_Q4_LABELS.clone())
    expect_type(w, torch.Tensor, "`balanced_weights(labels)`")
    if w.ndim != 1 or w.numel() != len(_Q4_LABELS):
        raise Incorrect(
            f"for {len(_Q4_LABELS)} labels your weights have shape {tuple(w.shape)}; WeightedRandomSampler "
            "wants one weight per *sample* (shape [N]), not one per class."
        )
    w = w.to(torch.float64)
    if not bool((w > 0).all()):
        raise Incorrect("every weight must be positive, or some samples can never be drawn.")
    counts = torch.bincount(_Q4_LABELS).to(torch.float64)
    per_class = torch.stack([w[_Q4_LABELS == c].sum() for c in range(len(counts))])
    if not torch.allclose(per_class / per_class.sum(), torch.full_like(per_class, 1 / len(counts)), atol=1e-6):
        share = ", ".join(f"{v:.2f}" for v in (per_class / per_class.sum()).tolist())
        raise Incorrect(
            f"with your weights the classes are drawn with probabilities [{share}], not equally: "
            "a sample's weight should be 1 / (how many samples share its label)."
        )


def _q4_solution() -> Callable:
    def balanced_weights(labels):
        counts = torch.bincount(labels)
        return 1.0 / counts[labels].double()

    return balanced_weights


def _q4_per_class() -> Callable:
    def balanced_weights(labels):
        return 1.0 / torch.bincount(labels).double()

    return balanced_weights


def _q4_inverted() -> Callable:
    def balanced_weights(labels):
        return torch.bincount(labels)[labels].double()

    return balanced_weights


q4 = Exercise(
    name="Q4",
    prompt="Write `balanced_weights(labels)`: one weight per sample so WeightedRandomSampler draws every class equally.",
    checker=_check_q4,
    hints=[
        "`torch.bincount(labels)` counts how many samples each class has.",
        "Index that count tensor with `labels` to get each sample's class size, then take 1 / it.",
    ],
    solution_code='''
def balanced_weights(labels):
    counts = torch.bincount(labels)
    return 1.0 / counts[labels].double()

q4.check(balanced_weights)''',
    solve=_q4_solution,
    wrong_answers=[
        ("one weight per class instead of per sample", _q4_per_class),
        ("weights proportional to the class size (favours the big classes)", _q4_inverted),
    ],
)

EXERCISES = [q1, q2, q3, q4]
