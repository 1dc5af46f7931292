"""Chapter 03: a Dataset, a padding collate_fn, a sharded stream, sampler weights, num_workers, and a
reproducible train/validation split (the deep dive on splitting datasets)."""

import copy
import random
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ..data import image_paths, load_image
from ..i18n import tr
from .core import Exercise, Incorrect, as_ints, as_number, as_tensor, kind, take, variant


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
    picks = ([0, 40, 80, 120, 160], [300, 10, 210])
    return [([paths[i] for i in pick], [labels[i] for i in pick]) for pick in picks]


def _item(pair: Any, i: int) -> tuple:
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise Incorrect(tr(
            "`dataset[{i}]` should return a pair `(image, label)`, but it returns {kind}. Without the label the "
            "DataLoader has nothing to train against.",
            "`dataset[{i}]` 应该返回一个二元组 `(image, label)`，但它返回的是{kind}。没有标签，DataLoader "
            "就没有可以用来训练的目标。",
            i=i, kind=kind(pair),
        ))
    image, label = pair
    image = image.detach() if isinstance(image, torch.Tensor) else image
    return image, as_number(label, tr("the label of `dataset[{i}]`", "`dataset[{i}]` 的标签", i=i), whole=True)


def _dataset_facts(cls, case):
    from torchvision.transforms import ToTensor

    paths, labels = case
    ds = cls(list(paths), list(labels))
    yield "len(dataset)", as_number(len(ds), "len(dataset)", whole=True)
    for transform in (None, ToTensor()):
        ds = cls(list(paths), list(labels), transform=transform)
        w = tr(" with transform=ToTensor()", "使用 transform=ToTensor() 时，") if transform else ""
        for i in range(len(paths)):
            image, label = _item(ds[i], i)
            yield tr("the label of dataset[{i}]{w}", "{w}dataset[{i}] 的标签", i=i, w=w), label
            if isinstance(image, torch.Tensor):
                what = tr("a tensor", "张量")
            else:
                what = tr("a PIL image or array", "PIL 图像或数组")
            yield tr("the kind of image dataset[{i}] returns{w}", "{w}dataset[{i}] 返回的图像类型", i=i, w=w), what
            yield (tr("the image shape of dataset[{i}]{w}", "{w}dataset[{i}] 的图像形状", i=i, w=w),
                   tuple(np.shape(image)))
            yield tr("the image of dataset[{i}]{w}", "{w}dataset[{i}] 的图像", i=i, w=w), _pixels(image)


def _pixels(image) -> torch.Tensor:
    """The image's values as a tensor (a copy), whether it is a tensor, a PIL image or an array."""
    if isinstance(image, torch.Tensor):
        return image.detach().cpu().clone()
    return torch.as_tensor(np.array(image))


q1 = Exercise(
    "Q1",
    MyDataset,
    form=Dataset,
    cases=_files,
    observe=_dataset_facts,
    describe=lambda c: tr("for the {n_c} files {value}", "对于 {n_c} 个文件 {value}",
                          n_c=len(c[0]), value=[p.name for p in c[0]]),
    mistakes=dict(
        no_transform=variant(MyDataset, "if self.transform is not None:", "if False:"),
        no_label=variant(MyDataset, "return image, self.labels[idx]", "return image"),
        len_off_by_one=variant(MyDataset, "return len(self.paths)", "return len(self.paths) - 1"),
    ),
)


def collate(batch):
    seqs = [s for s, _ in batch]
    lengths = torch.tensor([len(s) for s in seqs])
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
    labels = torch.tensor([y for _, y in batch])
    return padded, lengths, labels


def _zeros_then_filled(batch):
    """Pads into torch.zeros(...), which is float32 when no dtype is given."""
    seqs = [s for s, _ in batch]
    padded = torch.zeros(len(seqs), max(len(s) for s in seqs))
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    return padded, torch.tensor([len(s) for s in seqs]), torch.tensor([y for _, y in batch])


def _batches():
    def b(*items):
        return [(torch.tensor(s), y) for s, y in items]

    return [
        b(([3, 1, 4], 0), ([1, 5], 1), ([9, 2, 6, 5], 1)),
        b(([7], 2), ([8, 8, 8, 8, 8], 0)),
        b(([4, 2], 1)),
    ]


def _collate_facts(fn, batch):
    out = fn([(s.clone(), y) for s, y in batch])
    if not isinstance(out, tuple | list):
        it = kind(out)
        raise Incorrect(tr("`collate(batch)` should return `(padded, lengths, labels)`, not {it}.",
                           "`collate(batch)` 应该返回 `(padded, lengths, labels)`，而不是{it}。", it=it))
    yield tr("the number of things returned", "返回值的个数"), len(out)
    padded, lengths, labels = out
    padded = as_tensor(padded, "`padded`")
    yield "padded", padded
    if padded.dtype in (torch.int64, torch.int32):  # the index dtypes nn.Embedding accepts
        dtype = tr("int64 or int32 (token ids an nn.Embedding accepts)",
                   "int64 或 int32（nn.Embedding 接受的 token id）")
    else:
        dtype = tr("floating point", "浮点") if padded.is_floating_point() else str(padded.dtype)
    yield tr("the dtype of padded", "padded 的 dtype"), dtype
    yield "lengths", as_ints(as_tensor(lengths, "`lengths`"), "`lengths`")
    yield "labels", as_ints(as_tensor(labels, "`labels`"), "`labels`")


q2 = Exercise(
    "Q2",
    collate,
    cases=_batches,
    observe=_collate_facts,
    describe=lambda b: tr("for the batch {value}", "对于批次 {value}", value=[(s.tolist(), y) for s, y in b]),
    mistakes=dict(
        no_lengths=lambda batch: collate(batch)[::2],
        float_ids=_zeros_then_filled,
        truncated=variant(
            collate,
            "torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)",
            "torch.stack([s[: min(lengths)] for s in seqs])",
        ),
    ),
)


def _as_workers(ds: Any, num_workers: int, limit: int | None = None) -> list[int]:
    """The items `num_workers` DataLoader workers would deliver from copies of `ds` (at most `limit` each)."""
    from torch.utils.data._utils import worker as _w

    def items(d: Any) -> list[int]:
        return [int(x) for x in (d if limit is None else take(d, limit))]

    if num_workers == 0:
        return items(ds)
    out = []
    for wid in range(num_workers):
        d = copy.deepcopy(ds)
        info = _w.WorkerInfo(id=wid, num_workers=num_workers, seed=wid, dataset=d)
        with mock.patch.object(_w, "_worker_info", info):
            out += items(d)
    return out


class ShardedRange(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, self.n, workers))


q3 = Exercise(
    "Q3",
    ShardedRange,
    form=IterableDataset,
    cases=lambda: [(10, 0), (10, 2), (10, 3), (11, 4), (3, 4)],
    observe=lambda cls, c: {
        tr("the items delivered (sorted)",
           "产出的数据项（排序后）"): sorted(_as_workers(cls(c[0]), c[1], limit=c[0] + 1))
    },
    describe=lambda c: tr("for n={c} with num_workers={c2}", "当 n={c}、num_workers={c2} 时", c=c[0], c2=c[1]),
    mistakes=dict(
        every_worker_all=variant(ShardedRange, "range(worker, self.n, workers)", "range(self.n)"),
        remainder_lost=variant(
            ShardedRange,
            "range(worker, self.n, workers)",
            "range(worker * (self.n // workers), (worker + 1) * (self.n // workers))",
        ),
    ),
)


def balanced_weights(labels):
    counts = torch.bincount(labels)
    return 1.0 / counts[labels].double()


def _weight_facts(fn, labels):
    w = as_tensor(fn(labels.clone()), "`balanced_weights(labels)`")
    yield tr("the shape of the weights", "权重的形状"), tuple(w.shape)
    w = w.double()
    yield tr("every weight is positive", "“所有权重都为正”"), bool((w > 0).all())
    per_class = torch.stack([w[labels == c].sum() for c in labels.unique()])
    yield tr("the share of draws each class gets", "每个类别被抽中的比例"), per_class / per_class.sum()


_LABELS = ([0, 0, 0, 0, 1, 2, 2, 0, 1, 0], [3, 1, 1, 3, 3, 3, 3], [2, 0, 2, 2])
q4 = Exercise(
    "Q4",
    balanced_weights,
    cases=lambda: [torch.tensor(labels) for labels in _LABELS],
    observe=_weight_facts,
    describe=lambda labels: tr("for labels {values}", "对于标签 {values}", values=labels.tolist()),
    mistakes=dict(
        per_class=lambda labels: 1.0 / torch.bincount(labels).double(),
        proportional=lambda labels: torch.bincount(labels)[labels].double(),
    ),
)


def pick_num_workers(seconds):
    medians = {w: sorted(times)[len(times) // 2] for w, times in seconds.items()}
    best = min(medians.values())
    return min(w for w, m in medians.items() if m <= 1.05 * best)


def _random_timings(n_tables: int = 24, seed: int = 5) -> list[dict[int, list[float]]]:
    """More timing tables, drawn from their own seeded generator: curves that rise, dip, plateau and rise
    again, with noisy epochs; no median within 1% of a boundary of the rule, so float rounding cannot
    decide. A rule right on a few boundaries must also be right on these."""
    rng, tables = random.Random(seed), []
    while len(tables) < n_tables:
        workers = sorted(rng.sample([0, 1, 2, 3, 4, 6, 8], rng.randint(3, 6)))
        if len(tables) % 2:  # anywhere
            medians = {w: round(rng.uniform(0.3, 2.0), 3) for w in workers}
        else:  # a curve of small steps: many under 5%, adding up to more
            medians, m = {}, rng.uniform(0.8, 2.0)
            for w in workers:
                medians[w], m = round(m, 3), m * rng.uniform(0.9, 1.06)
        best = min(medians.values())
        if any(abs(m - 1.05 * best) < 0.01 * best for m in medians.values()):
            continue
        table = {}
        for w in rng.sample(workers, len(workers)):  # keys in no particular order
            m, k = medians[w], rng.choice((1, 3, 5))
            low = [round(m - rng.uniform(0, 0.3 * m), 3) for _ in range(k // 2)]
            high = [round(m + rng.uniform(0, 0.6 * m), 3) for _ in range(k // 2)]
            table[w] = rng.sample([*low, m, *high], k)  # the median is m; one slow or lucky epoch each side
        if len({_pick(table, stat) for stat in (_median, _mean, min)}) == 1:  # the statistic cannot decide:
            tables.append(table)  # these tables judge the rule; the fixed ones judge the statistic
    return tables


def _median(times):
    return sorted(times)[len(times) // 2]


def _mean(times):
    return sum(times) / len(times)


def _pick(seconds, stat):
    by = {w: stat(t) for w, t in seconds.items()}
    return min(w for w, m in by.items() if m <= 1.05 * min(by.values()))


def _greedy(seconds):
    """Adds workers while the next setting is more than 5% faster than the one kept."""
    medians = {w: sorted(t)[len(t) // 2] for w, t in sorted(seconds.items())}
    pick, *rest = medians
    for w in rest:
        if medians[w] * 1.05 >= medians[pick]:
            break
        pick = w
    return pick


def _timings():
    # {num_workers: seconds of each epoch}: the first key within 5% is neither the answer nor the fastest;
    # 4 fastest, 2 close; a slow epoch; a lucky epoch; keys unsorted; one epoch each; workers only cost;
    # gains under 5% a step that add up to more; then the drawn tables
    return [
        {4: [0.8] * 3, 0: [2.0] * 3, 2: [0.81] * 3, 8: [0.79] * 3},
        {0: [2.0, 2.1, 2.05], 1: [1.2, 1.1, 1.15], 2: [0.80, 0.82, 0.81], 4: [0.79, 0.80, 0.95]},
        {0: [1.0, 1.0, 1.0], 1: [0.60, 3.0, 0.62], 2: [0.70, 0.71, 0.69]},
        {0: [1.0, 1.02, 0.98], 2: [0.70, 0.92, 0.94], 4: [0.80, 0.82, 0.81]},
        {8: [0.5] * 3, 0: [2.0] * 3, 3: [0.52, 0.51, 0.50], 1: [0.54, 0.53, 0.54]},
        {0: [1.3], 1: [0.9], 2: [1.1]},
        {0: [0.40, 0.41, 0.40], 1: [0.45, 0.44, 0.46], 2: [0.60, 0.58, 0.59]},
        {0: [1.0] * 3, 1: [0.97] * 3, 2: [0.90] * 3},  # one small step, then a large one: 2
        {0: [1.0] * 3, 1: [0.90] * 3, 2: [0.86] * 3, 3: [0.82] * 3},  # a staircase of small steps: 2
        *_random_timings(),
    ]


def _pick_facts(fn, seconds):
    shown = {w: list(t) for w, t in seconds.items()}
    picked = as_number(fn(shown), "`pick_num_workers(seconds)`", whole=True)
    yield tr("the num_workers picked", "选出的 num_workers"), picked


q5 = Exercise(
    "Q5",
    pick_num_workers,
    cases=_timings,
    observe=_pick_facts,
    describe=lambda s: tr("for seconds = {s}", "当 seconds = {s} 时", s=s),
    mistakes=dict(
        greedy=_greedy,
        fastest=variant(pick_num_workers, "m <= 1.05 * best", "m == best"),
        mean=variant(pick_num_workers, "sorted(times)[len(times) // 2]", "sum(times) / len(times)"),
        best_epoch=variant(pick_num_workers, "sorted(times)[len(times) // 2]", "min(times)"),
    ),
)

def train_val_split(dataset, val_fraction, seed):
    n_val = int(len(dataset) * val_fraction)
    g = torch.Generator().manual_seed(seed)  # its own generator: the global random streams are left alone
    return torch.utils.data.random_split(dataset, [len(dataset) - n_val, n_val], generator=g)


class Numbered(Dataset):
    """Q6's dataset: item i is the number i, so that a split shows which items went where."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


def _items(part: Any, what: str) -> list[int]:
    n = as_number(len(part), f"len({what})", whole=True)
    return [as_number(part[i], tr("an item of {what}", "{what} 中的一项",
                                  what=what), whole=True) for i in range(min(n, 1000))]


_GLOBAL = (  # the global generators a split could draw from or reseed: (name, get state, set state, seed)
    ("torch", torch.get_rng_state, torch.set_rng_state, torch.manual_seed),
    ("random", random.getstate, random.setstate, random.seed),
    ("numpy", np.random.get_state, np.random.set_state, np.random.seed),
)


def _global_states() -> list:
    return [get() for _, get, _, _ in _GLOBAL]


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple) and a and isinstance(a[0], str):  # numpy's ('MT19937', keys, pos, ...)
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _streams(before: list[list], after: list[list]) -> str:
    """What the calls did to the global generators, from their states before and after two calls made
    from two different states: left alone, reseeded (the state after does not depend on the state
    before), or drawn from."""
    left = all(_same_state(b, a) for bs, as_ in zip(before, after, strict=True) for b, a in zip(bs, as_, strict=True))
    if left:
        return tr("left as they were", "保持原样")
    for k in range(len(_GLOBAL)):
        moved = not all(_same_state(before[i][k], after[i][k]) for i in range(len(before)))
        if moved and _same_state(after[0][k], after[1][k]):
            return tr("reseeded", "被重新设了种子")
    return tr("drawn from", "被抽取了随机数")


def _split_facts(fn, case):
    n, fraction = case
    before, after, vals = [], [], []
    for start in (0, 1):  # the second call from other global states: a reseed makes them equal again
        for _, _, _, seed in _GLOBAL:
            seed(start)
        before.append(_global_states())
        out = fn(Numbered(n), fraction, 7)
        after.append(_global_states())
        parts = take(out, 3)
        if len(parts) != 2:
            raise Incorrect(tr("train_val_split should return two datasets (train, val), not {kind}.",
                               "train_val_split 应该返回两个数据集 (train, val)，而不是{kind}。", kind=kind(out)))
        if start == 0:
            train, val = _items(parts[0], "train"), _items(parts[1], "val")
        else:
            vals.append(_items(parts[1], "val"))
    yield tr("the sizes (train, val)", "(train, val) 的大小"), (len(train), len(val))
    yield tr("every item once, in train or in val",
             "每一项恰好出现一次，不在 train 就在 val"), sorted(train + val) == list(range(n))
    yield tr("the global random streams (torch, random, numpy)",
             "全局随机数流（torch、random、numpy）"), _streams(before, after)
    yield tr("val is simply the last items", "val 只是最后那几项"), val == list(range(n - len(val), n))
    yield tr("the same seed gives the same split", "同一个种子得到同样的划分"), vals == [val]
    other = [_items(p, "val") for p in take(fn(Numbered(n), fraction, 8), 3)[1:2]]
    yield tr("another seed gives another split", "换一个种子得到不同的划分"), other != [val]


q6 = Exercise(
    "Q6",
    train_val_split,
    cases=lambda: [(40, 0.25), (30, 0.25), (11, 0.3)],
    observe=_split_facts,
    describe=lambda c: tr("for a dataset of {c} items and val_fraction={c2}",
                          "对于一个有 {c} 项的数据集、val_fraction={c2}", c=c[0], c2=c[1]),
    mistakes=dict(
        global_generator=variant(train_val_split, ", generator=g)", ")"),
        not_shuffled=lambda dataset, val_fraction, seed: (
            torch.utils.data.Subset(dataset, range(len(dataset) - int(len(dataset) * val_fraction))),
            torch.utils.data.Subset(dataset, range(len(dataset) - int(len(dataset) * val_fraction), len(dataset)))),
        seed_ignored=variant(train_val_split, "manual_seed(seed)", "manual_seed(0)"),
        reseeded=variant(train_val_split, "g = torch.Generator().manual_seed(seed)  # its own generator: the global",
                         "torch.manual_seed(seed)  # the global generator, reseeded: the global",
                         ", generator=g)", ")"),
        rounded=variant(train_val_split, "int(len(dataset) * val_fraction)", "round(len(dataset) * val_fraction)"),
        swapped=lambda dataset, val_fraction, seed: train_val_split(dataset, val_fraction, seed)[::-1],
    ),
)


EXERCISES = [q1, q2, q3, q4, q5, q6]
