"""Check helpers of two chapters: simulated ranks (chapters 04 and 05), a model class's facts (02, 06)."""

import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.distributed import ReduceOp
from torch.overrides import TorchFunctionMode

from ..i18n import tr
from .core import Incorrect, LearnerThread, as_number, as_tensor


class World:
    """Simulated ranks on threads: ``all_reduce(rank, t, op)`` reduces ``t`` over all ranks, in place."""

    def __init__(self, size: int) -> None:
        self.size, self.calls, self.slots = size, [0] * size, [None] * size
        self.barrier = threading.Barrier(size)

    def all_reduce(self, rank: int, tensor: torch.Tensor, op: Any = ReduceOp.SUM, **_: Any) -> Any:
        if not isinstance(tensor, torch.Tensor):
            name = type(tensor).__name__
            raise TypeError(tr("all_reduce needs a tensor (it reduces in place), not a {name}",
                               "all_reduce 需要一个张量（它原地归约），而不是 {name}", name=name))
        self.calls[rank] += 1
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        s = torch.stack(self.slots)
        result = s.amax(0) if op == ReduceOp.MAX else s.amin(0) if op == ReduceOp.MIN else s.sum(0)
        self.barrier.wait()
        with torch.no_grad():
            tensor.copy_(result / self.size if op == ReduceOp.AVG else result)
        # what all_reduce(..., async_op=True) returns
        return SimpleNamespace(wait=lambda *a, **k: True, is_completed=lambda: True)


def fake_dist(rank: int, world: World) -> SimpleNamespace:
    """Enough of ``torch.distributed`` for a function written for real ranks to run on a simulated rank."""
    return SimpleNamespace(
        ReduceOp=ReduceOp,
        get_rank=lambda: rank,
        get_world_size=lambda: world.size,
        all_reduce=partial(world.all_reduce, rank),
        group=SimpleNamespace(WORLD=None),
    )


def numbers_on_ranks(fn: Callable[..., Any], shards: Sequence[tuple], args: Callable) -> dict:
    """What ``fn(*args(rank, world, correct, total))`` returns on each simulated rank, one per shard."""
    world = World(len(shards))
    threads = [LearnerThread(partial(fn, *args(r, world, *s))) for r, s in enumerate(shards)]
    try:
        for t in threads:
            t.start()
        while not all(t.done.wait(0.05) for t in threads):  # the time limit stops this wait
            done = sum(t.done.is_set() for t in threads)
            if done and world.barrier.n_waiting + done == world.size:
                world.barrier.abort()  # the others wait for ranks that have returned: forever
    finally:
        world.barrier.abort()
        for t in threads:
            t.stop()
    errors = [value for ok, value in (t.outcome for t in threads) if not ok]
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    if errors or len(set(world.calls)) > 1:
        raise Incorrect(tr(
            "the ranks called all_reduce a different number of times ({calls}): in a real job the ranks that call it "
            "wait forever for the others. Every rank must make the same calls.",
            "各个 rank 调用 all_reduce 的次数不同（{calls}）：在真实的任务中，调用了它的 rank 会一直等待其他 rank。"
            "每个 rank 都必须做相同的调用。",
            calls=world.calls,
        ))
    returned = [as_number(t.outcome[1], tr("what rank {r} returns", "rank {r} 的返回值",
                                           r=r)) for r, t in enumerate(threads)]
    return {tr("what the ranks return", "各个 rank 的返回值"): returned}


class _FirstUse(TorchFunctionMode):
    """Notes the order in which the code run inside it first hands each of `params` to a torch function."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.pending, self.order = {id(p) for p in params}, []

    def _note(self, value: Any) -> None:
        if isinstance(value, list | tuple):
            for item in value:
                self._note(item)
        elif isinstance(value, dict):
            self._note(list(value.values()))
        elif id(value) in self.pending:
            self.pending.discard(id(value))
            self.order.append(id(value))

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self._note(args)
        self._note(kwargs or {})
        return func(*args, **(kwargs or {}))


def _by_role(model: nn.Module, x: torch.Tensor) -> list[nn.Parameter]:
    """`model`'s parameters in an order that does not depend on how they were declared: by shape, and
    among equal shapes (two biases of 64) by when `model(x)` first uses each, in eval mode. Two models
    with the same layers used in the same way list their parameters in the same order."""
    params = list(model.parameters())
    was_training = model.training
    model.eval()
    with _FirstUse(params) as seen, torch.no_grad():
        model(x.clone())
    model.train(was_training)
    first = {pid: i for i, pid in enumerate(seen.order)}
    return sorted(params, key=lambda p: (tuple(p.shape), first.get(id(p), len(first))))


def module_facts(cls: type, reference: type, x: torch.Tensor) -> Iterator[tuple[str, Any]]:
    """What a learner's model class does, next to `reference`: its parameters, its outputs on `x` with the
    reference's weights copied in, each to the parameter of the same role (so another valid implementation,
    its layers declared in any order, passes), in eval mode and, random numbers seeded, in training mode
    (a Dropout added shows there), training, and ``.to()``."""
    with torch.random.fork_rng(devices=[]):  # the reference's own generator: however the learner's model
        torch.manual_seed(0)  # initialises itself (kaiming_uniform_ draws more numbers), its weights are these
        ref = reference()
    model = cls()
    if not isinstance(model, nn.Module):
        name = type(model).__name__
        raise Incorrect(tr("calling your class should give an nn.Module, but it gave {name}.",
                           "调用你的类应该得到一个 nn.Module，但得到的是 {name}。", name=name))
    params = list(model.parameters())
    yield tr("the number of parameters that parameters() finds",
             "parameters() 找到的参数个数"), sum(p.numel() for p in params)
    yield tr("the parameter shapes (sorted)",
             "各个参数的形状（排序后）"), sorted(tuple(p.shape) for p in params)
    with torch.no_grad():
        for p, r in zip(_by_role(model, x), _by_role(ref, x), strict=True):
            p.copy_(r)
        model.eval()
        out = as_tensor(model(x.clone()), tr("the output", "输出"))
        yield tr("the model's output (with the reference's weights)",
                 "模型的输出（使用参考答案的权重）"), out
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            out = as_tensor(model(x.clone()), tr("the output", "输出"))
        yield tr("the model's output in training mode (with the reference's weights, random numbers seeded)",
                 "训练模式下模型的输出（使用参考答案的权重，随机数已设种子）"), out
    before = [p.detach().clone() for p in params]
    torch.nn.functional.cross_entropy(model(x.clone()), torch.arange(len(x)) % 10).backward()
    torch.optim.SGD(params, lr=0.1).step()
    unchanged = sum(torch.equal(b, p) for b, p in zip(before, params, strict=True))
    yield tr("how many parameters one SGD step leaves unchanged",
             "一次 SGD 更新后保持不变的参数个数"), unchanged
    with torch.no_grad():
        dtype = str(model.to(torch.float64)(x.double()).dtype)
    yield tr("the output dtype after .to(torch.float64)", ".to(torch.float64) 之后输出的 dtype"), dtype
