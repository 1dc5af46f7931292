"""Chapter 04 exercises: DistributedSampler shares, a correctly all-reduced metric, set_epoch,
and the batch that one process needs to match data-parallel training."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ..dist_viz import sampler_indices
from .core import Exercise, Incorrect, as_ints, as_number, stop_threads, take


def answer_q1():
    g = torch.Generator().manual_seed(0 + 3)  # seed + epoch
    order = torch.randperm(10, generator=g).tolist()
    order += order[: 12 - 10]  # pad to a multiple of 3 ranks
    return order[1::3]  # rank 1: positions 1, 4, 7, 10


_SHARES, _EPOCH0 = sampler_indices(10, 3, epoch=3), sampler_indices(10, 3, epoch=0)[1]
_CONTIGUOUS, _UNPADDED = [i for pos in range(4) for i in (s[pos] for s in _SHARES)][4:8], _SHARES[1][:3]

q1 = Exercise(
    name="Q1",
    prompt="With DistributedSampler(dataset of 10 items, num_replicas=3, shuffle=True, seed=0) and set_epoch(3), which indices does rank 1 read, in order? Answer with a list (a tuple or a 1-D tensor also works).",
    model_answer=answer_q1,
    form="value",
    observe=lambda answer, _: as_ints(answer, "your answer"),
    hints=[
        "The shuffle of an epoch is torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).",
        "10 items over 3 ranks: every rank reads ceil(10/3) = 4 indices, so the order is padded to 12 by repeating its first 2 entries. Rank r then takes order[r::3].",
        "You may run code: course_utils.dist_viz.draw_sampler(10, world_size=3, epoch=3) draws it, but try with torch.randperm first.",
    ],
    mistakes={
        "that is rank 1's share in epoch 0. After set_epoch(3) the shuffle is seeded with seed + epoch = 0 + 3, so the order is different.": _EPOCH0,
        "that is rank 0's share, not rank 1's.": _SHARES[0],
        "that is rank 2's share, not rank 1's.": _SHARES[2],
        "DistributedSampler does not hand out contiguous chunks: rank r takes the indices at positions r, r + world_size, r + 2*world_size, ... of the shuffled order.": _CONTIGUOUS,
        "rank 1 reads 4 indices, not 3: 10 items over 3 ranks means ceil(10/3) = 4 each, and the order is padded with repeats to 12.": _UNPADDED,
    },
)


class _World:
    """Simulated ranks on threads: ``all_reduce(rank, t, op)`` reduces ``t`` over all ranks, in place."""

    def __init__(self, size: int, timeout: float = 2.0) -> None:
        self.size, self.calls = size, [0] * size
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)

    def all_reduce(self, rank: int, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, **_: Any) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce needs a tensor (it reduces in place), not a {type(tensor).__name__}")
        self.calls[rank] += 1
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        stack, ops = torch.stack(self.slots), dist.ReduceOp
        result = stack.amax(0) if op == ops.MAX else stack.amin(0) if op == ops.MIN else stack.sum(0)
        result = result / self.size if op == ops.AVG else result
        self.barrier.wait()
        with torch.no_grad():
            tensor.copy_(result)


def run_on_ranks(fn: Callable[..., Any], world: _World, args: Sequence[tuple]) -> list[Any]:
    """Call ``fn(*args[r])`` for every simulated rank r, each on its own thread; return their results."""
    results: list[Any] = [None] * world.size
    errors: list[BaseException | None] = [None] * world.size

    finished = [threading.Event() for _ in range(world.size)]

    def run(r: int) -> None:
        try:
            results[r] = fn(*args[r])
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors[r] = exc
            world.barrier.abort()
        finally:
            finished[r].set()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world.size)]
    try:
        for t in threads:
            t.start()
        for done in finished:
            done.wait()  # the check's time limit interrupts this wait (not join(): an interrupted
            # join() can mark a running thread as ended, and then it is never stopped)
    finally:
        world.barrier.abort()
        stop_threads(threads)
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    if any(errors) or len(set(world.calls)) > 1:
        raise Incorrect(f"the ranks called all_reduce a different number of times ({world.calls}): in a real job the ranks that call it wait forever for the others. Every rank must make the same calls.")
    return results


def global_accuracy(correct, total, dist):
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)  # sum over ranks: [all correct, all images]
    return (counts[0] / counts[1]).item()


def fake_dist(rank: int, world: _World) -> SimpleNamespace:
    """Enough of ``torch.distributed`` for a function written for real ranks to run on a simulated rank."""
    return SimpleNamespace(ReduceOp=dist.ReduceOp, get_rank=lambda: rank, get_world_size=lambda: world.size,
                           all_reduce=functools.partial(world.all_reduce, rank))


def _on_ranks(fn, shards):
    world = _World(len(shards))
    results = run_on_ranks(fn, world, [(c, t, fake_dist(r, world)) for r, (c, t) in enumerate(shards)])
    return [as_number(v, f"what rank {r} returns") for r, v in enumerate(results)]


def _local_acc(correct, total, dist):
    acc = torch.tensor([correct / total], dtype=torch.float64)
    dist.all_reduce(acc)
    return acc


_SHARDS = lambda: [[(90, 100), (1, 10), (45, 60)], [(3, 4), (10, 40)], [(7, 7), (0, 5), (20, 30), (1, 2)]]  # noqa: E731

q2 = Exercise(
    name="Q2",
    prompt="Write global_accuracy(correct, total, dist): this rank's correct count and number of images in, the accuracy over ALL ranks' images out, as a number (every rank returns the same one). `dist` is torch.distributed (the check passes a stand-in that runs 2 to 4 ranks with uneven shards).",
    model_answer=global_accuracy,
    cases=_SHARDS,
    observe=_on_ranks,
    describe=lambda s: f"for (correct, total) = {s} on {len(s)} ranks, the values the ranks return",
    hints=[
        "dist.all_reduce(t) sums the tensor t over all ranks, in place: every rank then holds the sum.",
        "Put both numbers in one tensor, torch.tensor([correct, total], dtype=torch.float64), all-reduce it once, then divide.",
        "The mean of the ranks' accuracies is wrong when the shards differ in size: 90/100 and 1/10 are 91/110 = 0.8273 together, not (0.9 + 0.1) / 2 = 0.5.",
    ],
    mistakes={
        "you averaged the ranks' accuracies. A rank with 10 images then weighs as much as one with 100. Sum the correct counts and the totals over ranks, then divide.": lambda c, t, d: (_local_acc(c, t, d) / d.get_world_size()).item(),
        "every rank returned its own accuracy: nothing was all-reduced, so the ranks disagree.": lambda c, t, d: c / t,
        "you divided the summed correct count by this rank's own total: all-reduce the totals too.": lambda c, t, d: (lambda x: (d.all_reduce(x), (x / t).item())[1])(torch.tensor([float(c)])),
        "return a fraction between 0 and 1, not a percentage.": lambda c, t, d: 100 * global_accuracy(c, t, d),
    },
)


def epoch_orders(sampler, epochs):
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # before reading the epoch
        orders.append(list(sampler))
    return orders


def _orders(fn, c):
    n, world, rank, epochs = c
    out = fn(DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=True, seed=0), epochs)
    return [as_ints(e, "each epoch's indices") for e in take(out, epochs + 1)]


def _set_epoch_after(sampler, epochs):
    orders = []
    for epoch in range(epochs):
        orders.append(list(sampler))
        sampler.set_epoch(epoch)
    return orders


q3 = Exercise(
    name="Q3",
    prompt="Write epoch_orders(sampler, epochs): a list with, for each epoch 0..epochs-1, the list of indices the DistributedSampler yields in that epoch, as a training loop reads them (fix the source's pitfall).",
    model_answer=epoch_orders,
    cases=lambda: [(12, 2, 1, 3), (10, 3, 0, 2), (7, 2, 1, 4)],
    observe=_orders,
    describe=lambda c: f"for a sampler over {c[0]} items, rank {c[2]} of {c[1]}, and epochs={c[3]}, the orders",
    hints=[
        "`list(sampler)` runs one epoch of the sampler.",
        "Without sampler.set_epoch(epoch), every epoch is shuffled with the same seed: the same order.",
    ],
    mistakes={
        "every epoch has the same order: the sampler's shuffle is seeded with seed + epoch, and its epoch stays 0 unless you call sampler.set_epoch(epoch) before reading the epoch.": lambda sampler, epochs: [list(sampler) for _ in range(epochs)],
        "epochs 0 and 1 are identical and then everything is one epoch late: set_epoch(epoch) must come before the loop over the sampler, not after it.": _set_epoch_after,
    },
)


def answer_q4():
    return 4 * 2 * 16  # ranks x micro-batches x micro-batch size = 128


q4 = Exercise(
    name="Q4",
    prompt="4 ranks under DDP, each accumulating 2 micro-batches of 16 samples per optimizer step (no_sync on the first, loss divided by 2), plain SGD. One process reaches the same weights with which batch size per step (a whole number)?",
    model_answer=answer_q4,
    form="value",
    observe=lambda answer, _: as_number(answer, "the batch size", whole=True),
    hints=["DDP averages the ranks' gradients; accumulation with loss / 2 averages the micro-batches'."],
    mistakes={
        "16 is one micro-batch on one rank. Each optimizer step averages the gradients of 2 micro-batches on each of 4 ranks.": 16,
        "32 is what one rank sees per optimizer step (2 micro-batches of 16). DDP then averages over the 4 ranks.": 32,
        "64 = 4 ranks x 16 forgets the accumulation: each rank accumulates 2 micro-batches before the step.": 64,
    },
)

EXERCISES = [q1, q2, q3, q4]
