"""Chapter 04 exercises: DistributedSampler shares, a correctly all-reduced metric, set_epoch,
and the batch that one process needs to match data-parallel training."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ..dist_viz import sampler_indices
from .core import Exercise, Incorrect, expect_equal

# ------------------------------------------------------------------------------------------ q1

Q1 = {"n": 10, "world_size": 3, "rank": 1, "epoch": 3}


def _q1_expected() -> list[int]:
    return sampler_indices(Q1["n"], Q1["world_size"], epoch=Q1["epoch"])[Q1["rank"]]


def _check_q1(answer: Any) -> None:
    if isinstance(answer, torch.Tensor):
        answer = answer.tolist()
    if not isinstance(answer, list | tuple) or not all(isinstance(i, int) for i in answer):
        raise Incorrect(f"answer should be a list of whole numbers (indices), but it is a {type(answer).__name__}.")
    answer = list(answer)
    n, world, rank, epoch = Q1["n"], Q1["world_size"], Q1["rank"], Q1["epoch"]
    expected = _q1_expected()
    if answer == expected:
        return
    shares = sampler_indices(n, world, epoch=epoch)
    if answer == sampler_indices(n, world, epoch=0)[rank]:
        raise Incorrect("that is rank 1's share in epoch 0. After set_epoch(3) the shuffle is seeded with "
                        "seed + epoch = 0 + 3, so the order is different.")
    if answer in shares:
        raise Incorrect(f"that is rank {shares.index(answer)}'s share, not rank 1's.")
    order = [i for pos in range(len(shares[0])) for i in (s[pos] for s in shares)]
    per = len(expected)
    if answer == order[rank * per:(rank + 1) * per] or answer == order[rank * 3:(rank + 1) * 3]:
        raise Incorrect("DistributedSampler does not hand out contiguous chunks: rank r takes the indices at "
                        "positions r, r + world_size, r + 2*world_size, ... of the shuffled order.")
    if len(answer) != per:
        raise Incorrect(f"rank 1 reads {per} indices, not {len(answer)}: {n} items over {world} ranks means "
                        f"ceil({n}/{world}) = {per} each, and the order is padded with repeats to {per * world}.")
    raise Incorrect("not the indices rank 1 reads. Compute torch.randperm(10) with a generator seeded 0 + 3, "
                    "pad it to 12 by repeating its start, then take positions 1, 4, 7, 10.")


q1 = Exercise(
    name="Q1",
    prompt="With DistributedSampler(dataset of 10 items, num_replicas=3, shuffle=True, seed=0) and "
           "set_epoch(3), which indices does rank 1 read, in order? Answer with a list.",
    checker=_check_q1,
    hints=[
        "The shuffle of an epoch is torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).",
        "10 items over 3 ranks: every rank reads ceil(10/3) = 4 indices, so the order is padded to 12 by "
        "repeating its first 2 entries. Rank r then takes order[r::3].",
        "You may run code: course_utils.dist_viz.draw_sampler(10, world_size=3, epoch=3) draws it, but try "
        "with torch.randperm first.",
    ],
    solution_code="""g = torch.Generator().manual_seed(0 + 3)     # seed + epoch
order = torch.randperm(10, generator=g).tolist()
order += order[:12 - 10]                      # pad to a multiple of 3 ranks
answer = order[1::3]                          # rank 1: positions 1, 4, 7, 10""",
    solve=_q1_expected,
    wrong_answers=[
        ("forgot set_epoch: epoch 0's share", lambda: sampler_indices(10, 3, epoch=0)[1]),
        ("rank 0's share", lambda: sampler_indices(10, 3, epoch=3)[0]),
        ("a contiguous chunk of the order", lambda: [
            i for pos in range(4) for i in (s[pos] for s in sampler_indices(10, 3, epoch=3))][4:8]),
        ("no padding: only 3 indices", lambda: sampler_indices(10, 3, epoch=3)[1][:3]),
    ],
)

# ------------------------------------------------------------------------------------------ q2


class FakeDist:
    """Enough of ``torch.distributed`` for a function written for real ranks to run on threads.

    One instance per rank; ``all_reduce`` sums (or takes MAX/MIN/AVG over) the tensors of all
    the ranks' threads, in place, as ``dist.all_reduce`` does."""

    ReduceOp = dist.ReduceOp

    def __init__(self, rank: int, world: _World) -> None:
        self._rank, self._world = rank, world

    def get_rank(self) -> int:
        return self._rank

    def get_world_size(self) -> int:
        return self._world.size

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce needs a tensor (it reduces in place), got a {type(tensor).__name__}")
        self._world.calls[self._rank] += 1
        self._world.reduce(self._rank, tensor, op)


class _World:
    def __init__(self, size: int, timeout: float = 5.0) -> None:
        self.size = size
        self.calls = [0] * size
        self.slots: list[torch.Tensor | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.result: torch.Tensor | None = None

    def reduce(self, rank: int, tensor: torch.Tensor, op: Any) -> None:
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        if rank == 0:
            stack = torch.stack([s for s in self.slots])  # type: ignore[misc]
            if op == dist.ReduceOp.MAX:
                self.result = stack.max(0).values
            elif op == dist.ReduceOp.MIN:
                self.result = stack.min(0).values
            elif op == dist.ReduceOp.AVG:
                self.result = stack.sum(0) / self.size
            else:
                self.result = stack.sum(0)
        self.barrier.wait()
        tensor.copy_(self.result.to(tensor.dtype))  # type: ignore[union-attr]
        self.barrier.wait()


def run_on_ranks(fn: Callable[..., Any], shards: Sequence[tuple[int, int]]) -> list[Any]:
    """Call ``fn(correct, total, dist)`` once per simulated rank, on threads; return each result."""
    world = _World(len(shards))
    results: list[Any] = [None] * len(shards)
    errors: list[BaseException | None] = [None] * len(shards)

    def run(r: int) -> None:
        try:
            results[r] = fn(shards[r][0], shards[r][1], FakeDist(r, world))
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # the learner's error: re-raised below
            errors[r] = exc
            world.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(shards))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    for exc in errors:
        if exc is not None and not isinstance(exc, threading.BrokenBarrierError):
            raise exc
    if len(set(world.calls)) > 1 or any(t.is_alive() for t in threads):
        raise Incorrect(f"the ranks called all_reduce a different number of times ({world.calls}): in a real job "
                        "the ranks that call it wait forever for the others. Every rank must make the same calls.")
    return results


Q2_SHARDS = [(90, 100), (1, 10), (45, 60)]  # (correct, total) on each of 3 ranks: uneven shards


def _as_float(x: Any) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise Incorrect(f"global_accuracy should return one number, not a tensor of shape {tuple(x.shape)}.")
        return float(x.item())
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    raise Incorrect(f"global_accuracy should return a number (a fraction between 0 and 1), not a {type(x).__name__}.")


def _check_q2(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect("answer should be your function global_accuracy itself (without calling it).")
    results = [_as_float(x) for x in run_on_ranks(fn, Q2_SHARDS)]
    correct = sum(c for c, _ in Q2_SHARDS) / sum(t for _, t in Q2_SHARDS)
    mean_of_acc = sum(c / t for c, t in Q2_SHARDS) / len(Q2_SHARDS)
    local = [c / t for c, t in Q2_SHARDS]
    if max(results) - min(results) > 1e-9:
        if all(abs(a - b) < 1e-9 for a, b in zip(results, local, strict=True)):
            raise Incorrect("every rank returned its own accuracy: nothing was all-reduced, so the ranks disagree.")
        raise Incorrect(f"the ranks returned different values {[round(v, 4) for v in results]}: after the "
                        "all-reduce every rank should compute the same global number (did you divide by this "
                        "rank's own total?).")
    got = results[0]
    if abs(got - correct) < 1e-9:
        return
    if abs(got - mean_of_acc) < 1e-9:
        raise Incorrect(f"you averaged the ranks' accuracies ({got:.4f}). A rank with 10 images then weighs as "
                        "much as one with 100. Sum the correct counts and the totals over ranks, then divide: "
                        f"{correct:.4f} here.")
    if 0.0 <= got * 100 <= 100 and abs(got * 100 - correct) < 1e-9:
        raise Incorrect("return a fraction between 0 and 1, not a percentage.")
    raise Incorrect(f"your function returned {got:.4f}; the accuracy over all ranks' images is {correct:.4f} "
                    "(sum of correct counts / sum of totals).")


def _q2_solution(correct: int, total: int, dist: Any) -> float:
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)  # SUM over ranks, in place
    return (counts[0] / counts[1]).item()


def _q2_mean_of_accuracies(correct: int, total: int, dist: Any) -> float:
    acc = torch.tensor([correct / total], dtype=torch.float64)
    dist.all_reduce(acc)
    return (acc / dist.get_world_size()).item()


def _q2_local(correct: int, total: int, dist: Any) -> float:
    return correct / total


def _q2_local_total(correct: int, total: int, dist: Any) -> float:
    c = torch.tensor([correct], dtype=torch.float64)
    dist.all_reduce(c)
    return (c / total).item()


q2 = Exercise(
    name="Q2",
    prompt="Write global_accuracy(correct, total, dist): this rank's correct count and number of images "
           "in, the accuracy over ALL ranks' images out (every rank returns the same number). `dist` is "
           "torch.distributed (the check passes a stand-in that runs 3 ranks with uneven shards).",
    checker=_check_q2,
    hints=[
        "dist.all_reduce(t) sums the tensor t over all ranks, in place: every rank then holds the sum.",
        "Put both numbers in one tensor, torch.tensor([correct, total], dtype=torch.float64), all-reduce "
        "it once, then divide.",
        "The mean of the ranks' accuracies is wrong when the shards differ in size: 90/100 and 1/10 are "
        "91/110 = 0.8273 together, not (0.9 + 0.1) / 2 = 0.5.",
    ],
    solution_code="""def global_accuracy(correct, total, dist):
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)               # sum over ranks: [all correct, all images]
    return (counts[0] / counts[1]).item()""",
    solve=lambda: _q2_solution,
    wrong_answers=[
        ("mean of the ranks' accuracies", lambda: _q2_mean_of_accuracies),
        ("no all-reduce: each rank's own accuracy", lambda: _q2_local),
        ("all-reduced correct count over this rank's total", lambda: _q2_local_total),
    ],
)

# ------------------------------------------------------------------------------------------ q3


def _q3_sampler() -> DistributedSampler:
    return DistributedSampler(list(range(12)), num_replicas=2, rank=1, shuffle=True, seed=0)


def _q3_expected(epochs: int = 3) -> list[list[int]]:
    return [sampler_indices(12, 2, epoch=e)[1] for e in range(epochs)]


def _check_q3(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect("answer should be your function epoch_orders itself (without calling it).")
    got = fn(_q3_sampler(), 3)
    if not isinstance(got, list | tuple) or len(got) != 3:
        raise Incorrect("epoch_orders(sampler, 3) should return a list of 3 lists: the indices of each epoch.")
    got = [list(map(int, e)) for e in got]
    expected = _q3_expected()
    if got == expected:
        return
    if all(e == got[0] for e in got):
        raise Incorrect("every epoch has the same order: the sampler's shuffle is seeded with seed + epoch, and "
                        "its epoch stays 0 unless you call sampler.set_epoch(epoch) before reading the epoch.")
    if got[0] == got[1] and got[1:] == expected[:2]:
        raise Incorrect("epochs 0 and 1 are identical and then everything is one epoch late: set_epoch(epoch) must "
                        "come before the loop over the sampler, not after it.")
    raise Incorrect(f"epoch 0 should be {expected[0]}, epoch 1 {expected[1]}, epoch 2 {expected[2]}; "
                    f"yours are {got}. Call sampler.set_epoch(epoch) first, then list(sampler).")


def _q3_solution(sampler: Any, epochs: int) -> list[list[int]]:
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def _q3_forgot(sampler: Any, epochs: int) -> list[list[int]]:
    return [list(sampler) for _ in range(epochs)]


def _q3_after(sampler: Any, epochs: int) -> list[list[int]]:
    orders = []
    for epoch in range(epochs):
        orders.append(list(sampler))
        sampler.set_epoch(epoch)
    return orders


q3 = Exercise(
    name="Q3",
    prompt="Write epoch_orders(sampler, epochs): the list of indices the DistributedSampler yields in "
           "each epoch 0..epochs-1, as a training loop reads them (fix the source's pitfall).",
    checker=_check_q3,
    hints=[
        "`list(sampler)` runs one epoch of the sampler.",
        "Without sampler.set_epoch(epoch), every epoch is shuffled with the same seed: the same order.",
    ],
    solution_code="""def epoch_orders(sampler, epochs):
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)          # before reading the epoch
        orders.append(list(sampler))
    return orders""",
    solve=lambda: _q3_solution,
    wrong_answers=[
        ("set_epoch never called", lambda: _q3_forgot),
        ("set_epoch called after the epoch", lambda: _q3_after),
    ],
)

# ------------------------------------------------------------------------------------------ q4


def _check_q4(answer: Any) -> None:
    expected = 4 * 2 * 16
    if isinstance(answer, int) and not isinstance(answer, bool):
        if answer == 16:
            raise Incorrect("16 is one micro-batch on one rank. Each optimizer step averages the gradients of "
                            "2 micro-batches on each of 4 ranks.")
        if answer == 32:
            raise Incorrect("32 is what one rank sees per optimizer step (2 micro-batches of 16). DDP then "
                            "averages over the 4 ranks.")
        if answer == 64:
            raise Incorrect("64 = 4 ranks x 16 forgets the accumulation: each rank accumulates 2 micro-batches "
                            "before the step.")
    expect_equal(answer, expected, "the batch size",
                 why="Count every sample whose gradient goes into one optimizer step.")


q4 = Exercise(
    name="Q4",
    prompt="4 ranks under DDP, each accumulating 2 micro-batches of 16 samples per optimizer step "
           "(no_sync on the first, loss divided by 2), plain SGD. One process reaches the same weights "
           "with which batch size per step?",
    checker=_check_q4,
    hints=["DDP averages the ranks' gradients; accumulation with loss / 2 averages the micro-batches'."],
    solution_code="answer = 4 * 2 * 16   # ranks x micro-batches x micro-batch size = 128",
    solve=lambda: 128,
    wrong_answers=[
        ("one micro-batch", lambda: 16),
        ("one rank's step", lambda: 32),
        ("forgot accumulation", lambda: 64),
    ],
)

EXERCISES = [q1, q2, q3, q4]
