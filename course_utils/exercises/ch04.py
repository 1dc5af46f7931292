"""Chapter 04: DistributedSampler shares, all_reduce built from its two halves on real processes,
set_epoch, the global batch size."""

import linecache
import marshal
import pickle
import tempfile
import types
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ..data import sampler_indices
from ..i18n import tr
from . import core
from .compare import stub_message
from .core import Exercise, Incorrect, NotAttempted, as_ints, as_number, take, variant


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


def two_step_all_reduce(t):
    world = dist.get_world_size()
    chunks = list(t.chunk(world))  # t's length is a multiple of the world size
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks)  # rank r: the sum over all ranks of chunk r
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)  # every rank: every rank's summed chunk, in rank order
    return torch.cat(parts)


def _all_reduce_itself(t):
    dist.all_reduce(t)
    return t


# What the ranks of the check run: each answer on 3 real gloo processes, then on ranks 0 and 1 as a group
# of 2 (``dist`` and ``torch.distributed`` are that group there), with three tensors each; every call
# to torch.distributed noted. Answers travel as code objects (marshal: the same Python), so a function
# typed in a notebook runs as typed. Written to a temporary file for each launch.
_HARNESS = r"""
import builtins, marshal, os, pickle, sys, traceback, types
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.dist import setup
from course_utils.exercises.time_limit import TimeUp, bounded

SHOWN = {"get_rank", "get_world_size", "ReduceOp", "is_initialized", "is_available", "group", "get_backend"}


class View:
    # torch.distributed as an answer sees it: `group` (None: everyone) by default, its calls noted
    def __init__(self, group, calls):
        self.group, self.calls, self.sent = group, calls, []

    def __getattr__(self, name):
        real = getattr(dist, name)
        if name in ("get_rank", "get_world_size"):
            return lambda group=None: real(group if group is not None else self.group)
        if name in SHOWN or not callable(real) or isinstance(real, type):
            return real

        def call(*args, **kwargs):
            self.calls.append(name)
            if name in ("all_gather", "all_gather_into_tensor"):  # what each rank sends: its numel
                sent = args[1] if len(args) > 1 else kwargs.get("tensor", kwargs.get("input_tensor"))
                self.sent.append(sent.numel() if isinstance(sent, torch.Tensor) else None)
            if self.group is not None and "group" not in kwargs:
                kwargs["group"] = self.group
            return real(*args, **kwargs)

        return call


class TorchView:
    def __init__(self, view):
        self.distributed = view

    def __getattr__(self, name):
        return getattr(torch, name)


def tensors(world, rank):
    g = torch.Generator().manual_seed(7 * world + rank)
    return [torch.arange(2 * world) + 10 * rank, torch.randn(3 * world, generator=g),
            torch.full((world,), rank + 1.0, dtype=torch.float64)]


def run(code, defaults, world, group):
    calls, out = [], []
    view = View(group, calls)
    fn = types.FunctionType(marshal.loads(code), {"torch": TorchView(view), "dist": view, "__builtins__": builtins})
    fn.__defaults__ = defaults
    sent = []
    for t in tensors(world, dist.get_rank(group)):
        view.sent = []
        try:  # the check's time limit, on each rank: an endless answer ends here, not at the launch's timeout
            got, _ = bounded(lambda: fn(t.clone()), job["limit"])
        except TimeUp:
            return {"calls": calls, "error": ("TimeUp", [], None, True)}
        except (Exception, SystemExit) as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            line = next((f.lineno for f in reversed(frames) if f.filename == fn.__code__.co_filename), None)
            own = bool(frames) and frames[-1].filename == fn.__code__.co_filename  # raised by the answer itself
            return {"calls": calls, "error": (type(exc).__name__, str(exc).strip().splitlines()[:1], line, own)}
        sent.append([f"{n}/{t.numel()}" if n is not None else "?" for n in view.sent])
        if not isinstance(got, torch.Tensor):
            out.append(type(got).__name__)
        elif got.numel() > 10**6:
            out.append(f"a tensor of shape {tuple(got.shape)}")
        else:
            out.append(got.detach().clone())
    return {"calls": calls, "error": None, "returned": out, "sent": sent}


job = pickle.loads(Path(sys.argv[1]).read_bytes())
ctx = setup(backend="gloo", timeout_s=job["timeout"])
pair = dist.new_group([0, 1])
found = {}
for key, (code, defaults) in job["answers"].items():
    found[key] = {3: run(code, defaults, 3, None)}
    if ctx.rank < 2:
        found[key][2] = run(code, defaults, 2, pair)
torch.save(found, Path(sys.argv[2]) / f"rank{ctx.rank}.pt")
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # at once: an interpreter that imported torch takes a second to finalise
"""
_ON_RANKS: dict = {}  # (code, defaults) -> what the ranks found (answers are deterministic)
_CASE_TEXT = ("t = torch.arange(2 * world) + 10 * rank (int64)",
              "t = 3 * world seeded float32 random numbers (a generator per rank)",
              "t = torch.full((world,), rank + 1.0, dtype=torch.float64)")


LAUNCH_ALLOWANCE_S = 10.0  # what starting 3 ranks may take on top of the time limit (the real torchrun: seconds)


def _key(fn):
    return marshal.dumps(fn.__code__), fn.__defaults__


def _runs_alone(fn) -> bool:
    """A function the ranks can run from its code alone: written with def or lambda, no closure."""
    return isinstance(fn, types.FunctionType) and not fn.__code__.co_freevars


def _launch(answers, timeout):
    """Run `answers` on 3 real ranks (through the course's launcher), in one job, at most `timeout`
    seconds; cache what the ranks found, or why the job failed, for each."""
    from ..launch import LaunchError, torchrun  # imports torch.distributed: only when checking

    with tempfile.TemporaryDirectory(prefix="ch04-q2-") as folder:
        job = {"answers": {i: _key(fn) for i, fn in enumerate(answers)}, "timeout": 8.0,
               "limit": core.TIME_LIMIT_S}
        Path(folder, "job.pkl").write_bytes(pickle.dumps(job))
        Path(folder, "on_ranks.py").write_text(_HARNESS)
        try:
            torchrun("on_ranks.py", nproc=3, args=["job.pkl", "."], timeout=timeout, backend="gloo", show=False,
                     cwd=folder)
        except LaunchError as exc:
            last = next((line for text in exc.stderr for line in reversed(text.splitlines()) if line.strip()), "")
            failed = {"incorrect": tr(
                "your function made a rank fail or hang on 3 real processes (within {timeout:g} s; {value}). Every "
                "rank must make the same collective calls, in the same order, and finish.",
                "你的函数让某个 rank 在 3 个真实进程上失败或卡住了（时限 {timeout:g} 秒；{value}）。每个 rank "
                "都必须以相同的顺序做相同的集合通信调用，并且能够结束。",
                timeout=timeout, value=last.strip()[:300] or type(exc).__name__,
            )}
            for fn in answers:
                _ON_RANKS[_key(fn)] = failed
            return
        ranks = [torch.load(Path(folder, f"rank{r}.pt"), weights_only=False) for r in range(3)]
    for i, fn in enumerate(answers):
        _ON_RANKS[_key(fn)] = {w: [ranks[r][i][w] for r in range(w)] for w in (2, 3)}


class OnRanks(Exercise):
    """An exercise checked on real processes. The learner's function is launched once, before the check
    proper, bounded by the launcher's timeout (the time limit plus LAUNCH_ALLOWANCE_S for starting the
    ranks), and what the ranks found is then judged like any answer: the time limit of the check does
    not pay for the start of the ranks (a fraction of a second with the warm engine, seconds with the
    real torchrun on macOS and Windows). Nothing of the learner's code runs in this process."""

    def check(self, answer=Ellipsis):  # noqa: D102 - Exercise.check, after the launch
        if _runs_alone(answer) and _key(answer) not in _ON_RANKS:
            try:
                _launch([answer], timeout=core.TIME_LIMIT_S + LAUNCH_ALLOWANCE_S)
            except Exception as exc:  # a check never raises: the judging below says what went wrong
                _ON_RANKS[_key(answer)] = {"incorrect": tr("the check could not start its ranks ({exc}).",
                                                           "检查程序无法启动它的 rank（{exc}）。", exc=exc)}
        return super().check(answer)


def _raise_rank_error(fn, world, rank, kind, text, line, own):
    """Incorrect (or NotAttempted, for the unfinished stub) for what rank `rank` of `world` raised."""
    if kind == "TimeUp":
        raise Incorrect(tr(
            "on {world} ranks, your function did not finish within {limit:g} s on rank {rank}: "
            "an endless loop, or a collective that another rank does not call?",
            "在 {world} 个 rank 上，你的函数在 rank {rank} 上没有在 {limit:g} 秒内结束："
            "是死循环，还是调用了其他 rank 没有调用的集合通信？",
            world=world, rank=rank, limit=core.TIME_LIMIT_S,
        ))
    code = linecache.getline(fn.__code__.co_filename, line).strip() if line else ""
    if kind == "NotImplementedError" and own and (code.startswith("raise") if code else not text):
        raise NotAttempted(stub_message())  # the learner's unfinished body, as compare._is_stub judges it
    where = tr(" (line {line}: `{code}`)", "（第 {line} 行：`{code}`）", line=line, code=code) if code else ""
    raise Incorrect(tr(
        "on {world} ranks, your function raised {kind}: {text} on rank {rank}{where}.",
        "在 {world} 个 rank 上，你的函数在 rank {rank} 上抛出了 {kind}: {text}{where}。",
        world=world, kind=kind, text=' '.join(text), rank=rank, where=where,
    ))


def _two_step_facts(fn, world):
    if not _runs_alone(fn):
        free = ", ".join(getattr(getattr(fn, "__code__", None), "co_freevars", ()))
        raise Incorrect(tr(
            "pass a function written with def whose code runs alone on each rank, with only `torch` and `dist`{free}.",
            "请传入一个用 def 定义的函数，它的代码要能在每个 rank 上单独运行，只用到 `torch` 和 `dist`{free}。",
            free=tr(" (yours uses names from the function around it: {free})",
                    "（你的函数用到了外层函数中的名字：{free}）", free=free) if free else "",
        ))
    if _key(fn) not in _ON_RANKS:
        own = [q2.model_answer, *q2.mistakes.values()]
        _launch(own if any(fn is f for f in own) else [fn], timeout=60.0)
    found = _ON_RANKS[_key(fn)]
    if "incorrect" in found:
        raise Incorrect(found["incorrect"])
    found = found[world]
    for rank, rec in enumerate(found):
        if rec["error"] is not None:
            _raise_rank_error(fn, world, rank, *rec["error"])
        bad = next((x for x in rec["returned"] if isinstance(x, str)), None)
        if bad is not None:
            raise Incorrect(tr("on {world} ranks, rank {rank} returned {bad}, not the tensor of sums.",
                               "在 {world} 个 rank 上，rank {rank} 返回的是 {bad}，而不是求和后的张量。",
                               world=world, rank=rank, bad=bad))
    for k, text in enumerate(_CASE_TEXT):
        yield (tr("what ranks 0..{value} return for {text}", "对于 {text}，rank 0..{value} 的返回值",
                  value=world - 1, text=text),
               [rec["returned"][k] for rec in found])
    calls = set(found[0]["calls"])  # after the results: a wrong result says more than a call
    yield (tr("the collectives it calls that do the job in one go (all_reduce, reduce, broadcast)",
              "它调用的一步到位的集合通信（all_reduce、reduce、broadcast）"),
           sorted(calls & {"all_reduce", "reduce", "broadcast"}))
    yield (tr("whether it calls reduce_scatter (or reduce_scatter_tensor)",
              "它是否调用了 reduce_scatter（或 reduce_scatter_tensor）"),
           bool(calls & {"reduce_scatter", "reduce_scatter_tensor"}))
    yield (tr("whether it calls all_gather (or all_gather_into_tensor)",
              "它是否调用了 all_gather（或 all_gather_into_tensor）"),
           bool(calls & {"all_gather", "all_gather_into_tensor"}))
    # An all_gather of the whole tensor, summed on each rank, returns the sums too (with a reduce_scatter
    # called for show): what each rank sends to all_gather tells them apart, the reduced chunk, 1/world of t.
    yield (tr("the elements rank 0 sends to all_gather, out of t's, for each tensor above",
              "rank 0 交给 all_gather 的元素个数（占 t "
              "的元素个数），依次对应上面的每个张量"),
           found[0].get("sent"))

q2 = OnRanks(
    "Q2",
    two_step_all_reduce,
    cases=lambda: [3, 2],
    observe=_two_step_facts,
    describe=lambda world: tr("on {world} real processes", "在 {world} 个真实进程上", world=world),
    mistakes=dict(
        all_reduce_itself=_all_reduce_itself,
        own_chunk_only=variant(two_step_all_reduce, "return torch.cat(parts)", "return mine"),
        averaged=variant(two_step_all_reduce, "return torch.cat(parts)", "return torch.cat(parts) / world"),
        gathered_unreduced=variant(two_step_all_reduce, "dist.reduce_scatter(mine, chunks)",
                                   "mine.copy_(chunks[dist.get_rank()])"),
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
        "for a sampler over {c} items, rank {c2} of {c3}, and epochs={c4}",
        "对于一个覆盖 {c} 个数据项的采样器，在 {c3} 个 rank 中的 rank {c2} 上，epochs={c4} 时",
        c=c[0], c2=c[2], c3=c[1], c4=c[3],
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
