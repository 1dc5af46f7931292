"""Chapter 04: DistributedSampler shares, an all-reduced metric, set_epoch, the global batch size."""

import torch
from torch.utils.data import DistributedSampler

from ..data import sampler_indices
from ..i18n import tr
from .core import Exercise, as_ints, as_number, take, variant
from .shared import fake_dist, numbers_on_ranks


def answer_q1():
    g = torch.Generator().manual_seed(0 + 3)  # seed + epoch
    order = torch.randperm(10, generator=g).tolist()
    order += order[: 12 - 10]  # pad to a multiple of 3 ranks
    return order[1::3]  # rank 1: positions 1, 4, 7, 10


_SHARES, _EPOCH0 = sampler_indices(10, 3, epoch=3), sampler_indices(10, 3, epoch=0)[1]
_CONTIGUOUS = [i for pos in range(4) for i in (s[pos] for s in _SHARES)][4:8]  # positions 4-7

q1 = Exercise(
    "Q1",
    answer_q1,
    form="value",
    observe=lambda answer, _: as_ints(answer),  # named "your answer" in its message
    mistakes=dict(
        epoch_zero=_EPOCH0,
        rank_zero=_SHARES[0],
        rank_two=_SHARES[2],
        contiguous=_CONTIGUOUS,
        unpadded=_SHARES[1][:3],
    ),
)


def global_accuracy(correct, total, dist):
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)  # sum over ranks: [all correct, all images]
    return (counts[0] / counts[1]).item()


_SHARDS = ([(90, 100), (1, 10), (45, 60)], [(3, 4), (10, 40)], [(7, 7), (0, 5), (20, 30), (1, 2)])
q2 = Exercise(
    "Q2",
    global_accuracy,
    cases=lambda: _SHARDS,
    observe=lambda fn, s: numbers_on_ranks(fn, s, lambda r, w, c, t: (c, t, fake_dist(r, w))),
    describe=lambda s: tr(f"for (correct, total) = {s} on {len(s)} ranks", f"当 {len(s)} 个 rank 上的 (correct, total) = {s} 时"),
    mistakes=dict(
        mean_of_accuracies=variant(global_accuracy, "[correct, total]", "[correct / total, 1.0]"),
        not_reduced=variant(global_accuracy, "dist.all_reduce(counts)", "pass"),
        own_total=variant(global_accuracy, "counts[0] / counts[1]", "counts[0] / total"),
        percentage=lambda c, t, d: 100 * global_accuracy(c, t, d),
    ),
)


def epoch_orders(sampler, epochs):
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # before reading the epoch
        orders.append(list(sampler))
    return orders


def _orders(fn, c):
    n, world, r, epochs = c
    sampler = DistributedSampler(list(range(n)), num_replicas=world, rank=r, shuffle=True, seed=0)
    out = fn(sampler, epochs)
    orders = [as_ints(e, tr("each epoch's indices", "每个 epoch 的索引")) for e in take(out, epochs + 1)]
    return {tr("the orders", "各个 epoch 的顺序"): orders}


q3 = Exercise(
    "Q3",
    epoch_orders,
    cases=lambda: [(12, 2, 1, 3), (10, 3, 0, 2), (7, 2, 1, 4)],
    observe=_orders,
    describe=lambda c: tr(
        f"for a sampler over {c[0]} items, rank {c[2]} of {c[1]}, and epochs={c[3]}",
        f"对于一个覆盖 {c[0]} 个数据项的采样器，在 {c[1]} 个 rank 中的 rank {c[2]} 上，epochs={c[3]} 时",
    ),
    mistakes=dict(
        no_set_epoch=variant(epoch_orders, "sampler.set_epoch(epoch)", "pass"),
        set_epoch_after=variant(
            epoch_orders,
            "sampler.set_epoch(epoch)  # before reading the epoch\n        orders.append(list(sampler))",
            "orders.append(list(sampler))\n        sampler.set_epoch(epoch)",
        ),
    ),
)


def answer_q4():
    return 4 * 2 * 16  # ranks x micro-batches x micro-batch size = 128


q4 = Exercise(
    "Q4",
    answer_q4,
    form="value",
    observe=lambda answer, _: as_number(answer, tr("the batch size", "批次大小"), whole=True),
    mistakes=dict(one_micro_batch=16, one_rank=32, no_accumulation=64),
)

EXERCISES = [q1, q2, q3, q4]
