"""Check helpers that more than one chapter's exercises use: simulated ranks (chapters 04 and 05)
and the facts of a model class (chapters 02 and 06)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .core import Incorrect, as_number, as_tensor, stop_threads


class World:
    """Simulated ranks on threads: ``all_reduce(rank, t, op)`` reduces ``t`` over all ranks, in place."""

    def __init__(self, size: int, timeout: float = 2.0) -> None:
        self.size, self.calls = size, [0] * size
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)

    def all_reduce(
        self, rank: int, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, **_: Any
    ) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"all_reduce needs a tensor (it reduces in place), not a {type(tensor).__name__}"
            )
        self.calls[rank] += 1
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        stack, ops = torch.stack(self.slots), dist.ReduceOp
        result = (
            stack.amax(0) if op == ops.MAX else stack.amin(0) if op == ops.MIN else stack.sum(0)
        )
        result = result / self.size if op == ops.AVG else result
        self.barrier.wait()
        with torch.no_grad():
            tensor.copy_(result)
        return SimpleNamespace(
            wait=lambda *a, **k: True, is_completed=lambda: True
        )  # as with async_op=True


def run_on_ranks(fn: Callable[..., Any], world: World, args: Sequence[tuple]) -> list[Any]:
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
        raise Incorrect(
            f"the ranks called all_reduce a different number of times ({world.calls}): in a real job the ranks that call it wait forever for the others. Every rank must make the same calls."
        )
    return results


def fake_dist(rank: int, world: World) -> SimpleNamespace:
    """Enough of ``torch.distributed`` for a function written for real ranks to run on a simulated rank."""
    return SimpleNamespace(
        ReduceOp=dist.ReduceOp,
        get_rank=lambda: rank,
        get_world_size=lambda: world.size,
        all_reduce=functools.partial(world.all_reduce, rank),
        group=SimpleNamespace(WORLD=None),
    )


def numbers_on_ranks(
    fn: Callable[..., Any], shards: Sequence[tuple], args: Callable[..., tuple]
) -> list:
    """What each simulated rank returns, as a number: one rank per ``(correct, total)`` shard,
    calling ``fn(*args(rank, world, correct, total))``."""
    world = World(len(shards))
    results = run_on_ranks(fn, world, [args(r, world, c, t) for r, (c, t) in enumerate(shards)])
    return {
        "what the ranks return": [
            as_number(v, f"what rank {r} returns") for r, v in enumerate(results)
        ]
    }


def module_facts(cls: type, reference: type, x: torch.Tensor):
    """What a learner's model class does, next to `reference`: its parameters, its outputs on `x` with the
    reference's weights copied in (so another valid implementation passes), training, and ``.to()``."""
    model, ref = cls(), reference()
    if not isinstance(model, nn.Module):
        raise Incorrect(
            f"calling your class should give an nn.Module, but it gave {type(model).__name__}."
        )
    params = list(model.parameters())
    yield "the number of parameters that parameters() finds", sum(p.numel() for p in params)
    yield "the parameter shapes, in order", [tuple(p.shape) for p in params]
    with torch.no_grad():
        for p, r in zip(params, ref.parameters(), strict=True):
            p.copy_(r)
        model.eval()
        yield (
            "the model's output (with the reference's weights)",
            as_tensor(model(x.clone()), "the output"),
        )
    model.train()
    before = [p.detach().clone() for p in params]
    torch.nn.functional.cross_entropy(model(x.clone()), torch.arange(len(x)) % 10).backward()
    torch.optim.SGD(params, lr=0.1).step()
    yield (
        "how many parameters one SGD step leaves unchanged",
        sum(torch.equal(b, p) for b, p in zip(before, params, strict=True)),
    )
    with torch.no_grad():
        yield (
            "the output dtype after .to(torch.float64)",
            str(model.to(torch.float64)(x.double()).dtype),
        )
