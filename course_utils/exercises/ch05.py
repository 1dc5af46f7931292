"""Chapter 05: a metric across ranks, a full resume, an unpadded eval shard, a crash-safe save."""

import contextlib
import copy
import functools
import io
import os
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

import torch
from torch.utils.data import DistributedSampler

from ..i18n import tr
from .core import Exercise, as_ints, as_number, variant
from .shared import numbers_on_ranks


def global_accuracy(correct, total, all_reduce, world_size):
    counts = torch.stack([correct, total]).double()  # one tensor, one collective call
    all_reduce(counts)  # now the sums over every rank
    return (counts[0] / counts[1]).item()


def _mismatched_calls(correct, total, all_reduce, world_size):
    all_reduce(correct)
    if total.item() >= 50:  # only some ranks reduce the total: the others never join
        all_reduce(total)
    return (correct / total).item()


def _rank_args(r, world, correct, total):  # rank r's arguments, on the simulated world
    c, t = torch.tensor(float(correct)), torch.tensor(float(total))
    return c, t, functools.partial(world.all_reduce, r), world.size


_SHARDS = ([(90, 100), (45, 50), (10, 20)], [(3, 4), (30, 40)], [(1, 1), (0, 3), (60, 80), (5, 9)])
q1 = Exercise(
    "Q1",
    global_accuracy,
    cases=lambda: _SHARDS,
    observe=lambda fn, s: numbers_on_ranks(fn, s, _rank_args),
    describe=lambda s: tr(f"for (correct, total) = {s} on {len(s)} ranks", f"当 {len(s)} 个 rank 上的 (correct, total) = {s} 时"),
    mistakes=dict(
        mean_of_accuracies=variant(
            global_accuracy, "[correct, total]", "[correct / total, total / total]"
        ),
        not_reduced=variant(global_accuracy, "all_reduce(counts)", "pass"),
        mismatched_calls=_mismatched_calls,
    ),
)


def resume(ckpt, model, optimizer, scheduler):
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    return ckpt["epoch"]  # epochs done = the next 0-based epoch


def _run(seed, steps):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)


def _train(model, opt, sched, batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


def _resume_facts(fn, case):
    per_epoch, epochs, done = case
    g, n = torch.Generator().manual_seed(0), per_epoch * epochs
    data = [(torch.randn(8, 4, generator=g), torch.randint(2, [8], generator=g)) for _ in range(n)]
    model, opt, sched = _run(0, len(data))
    _train(model, opt, sched, data[: done * per_epoch])
    ckpt = {"epoch": done, "model": model.state_dict(), "optimizer": opt.state_dict()}
    ckpt = copy.deepcopy({**ckpt, "scheduler": sched.state_dict()})
    model, opt, sched = _run(1, len(data))  # a fresh run: other weights, the schedule at step 0
    start = fn(ckpt, model, opt, sched)
    yield tr("the model's weights", "模型的权重"), model.weight.detach().clone()
    exp_avg = opt.state_dict()["state"].get(0, {}).get("exp_avg")
    running = tr("AdamW's running average of the gradients", "AdamW 的梯度滑动平均")
    yield running, None if exp_avg is None else exp_avg.clone()
    yield tr("the scheduler's step", "学习率调度器的步数"), sched.last_epoch
    yield tr("the learning rate", "学习率"), opt.param_groups[0]["lr"]
    start = as_number(start, tr("the start epoch you return", "你返回的起始 epoch"), whole=True)
    yield tr("the start epoch", "起始 epoch"), start
    _train(model, opt, sched, data[start * per_epoch :])
    yield tr("the weights at the end of the resumed run", "恢复训练结束时的权重"), model.weight.detach()


q2 = Exercise(
    "Q2",
    resume,
    cases=lambda: [(2, 5, 3), (3, 4, 1)],
    observe=_resume_facts,
    describe=lambda c: tr(
        f"for a checkpoint after {c[2]} of {c[1]} epochs ({c[0]} steps each)",
        f"对于 {c[1]} 个 epoch 中训练完 {c[2]} 个之后保存的检查点（每个 epoch {c[0]} 步）",
    ),
    mistakes=dict(
        no_scheduler=variant(resume, 'scheduler.load_state_dict(ckpt["scheduler"])', "pass"),
        one_epoch_late=lambda c, m, o, s: resume(c, m, o, s) + 1,
        no_optimizer=variant(resume, 'optimizer.load_state_dict(ckpt["optimizer"])', "pass"),
    ),
)


def eval_shard(n, rank, world_size):
    return list(range(rank, n, world_size))  # shards differ in size by at most one


def _shard_facts(fn, case):
    n, world = case
    shards = [as_ints(fn(n, r, world), f"eval_shard({n}, {r}, {world})") for r in range(world)]
    seen = Counter(i for s in shards for i in s)
    yield tr("the indices on more than one rank", "出现在多个 rank 上的索引"), sorted(i for i, c in seen.items() if c > 1)[:10]
    yield tr("the indices on no rank", "不在任何 rank 上的索引"), sorted(set(range(n)) - set(seen))[:10]
    yield tr("the indices outside range(n)", "超出 range(n) 的索引"), sorted(set(seen) - set(range(n)))[:10]
    spread = tr("the largest shard size minus the smallest", "最大分片与最小分片的大小之差")
    yield spread, max(map(len, shards)) - min(map(len, shards))


q3 = Exercise(
    "Q3",
    eval_shard,
    cases=lambda: [(359, 2), (10, 3), (7, 4), (3, 8), (144, 2), (0, 2)],
    observe=_shard_facts,
    describe=lambda c: tr(f"with n={c[0]} on {c[1]} ranks", f"当 n={c[0]}、共 {c[1]} 个 rank 时"),
    mistakes=dict(
        padded=lambda n, r, w: list(DistributedSampler(range(n), w, r, shuffle=False)),
        remainder_lost=variant(
            eval_shard,
            "range(rank, n, world_size)",
            "range(rank * (n // world_size), (rank + 1) * (n // world_size))",
        ),
    ),
)


def save_atomically(obj, path):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")  # same folder, same file system
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk
    os.replace(tmp, path)  # atomic: the old file or the new one, never half of one


def _swallowing(obj, path):
    with contextlib.suppress(OSError):
        save_atomically(obj, path)


def _crash(fn, obj, arg, path, call, renames):
    """``fn(obj, arg)`` while the `call`-th torch.save writes half its bytes and raises OSError: did the error
    reach the caller, and what did `path` hold at the crash (a real crash runs no ``except``)?"""
    real_save, calls, held = torch.save, [0], []

    def save(obj, f, *args, **kwargs):
        calls[0] += 1
        if calls[0] != call:
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf)
        data = buf.getvalue()[: len(buf.getvalue()) // 2]
        if isinstance(f, str | os.PathLike):
            Path(f).write_bytes(data)
        else:
            f.write(data)
            f.flush()
        held.append(_held(path))
        raise OSError(tr("simulated crash: the process died half-way through torch.save",
                         "模拟的崩溃：进程在 torch.save 写到一半时终止了"))

    def recording(real):
        return lambda src, dst, *a, **k: (renames.append(Path(src)), real(src, dst, *a, **k))[1]

    crashed, replace, rename = True, recording(os.replace), recording(os.rename)
    with mock.patch("torch.save", save), mock.patch.multiple(os, replace=replace, rename=rename):
        with contextlib.suppress(OSError):
            fn(obj, arg)
            crashed = False
    return crashed, held[0] if held else _held(path)


def _held(path: Path):
    if not path.exists():
        return tr("no file", "没有文件")
    try:
        return torch.load(path, weights_only=True)["epoch"]
    except Exception:
        return tr("a corrupt file", "一个损坏的文件")


def _save_facts(fn, case):
    name, as_text = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        folder.mkdir()
        path = folder / name
        arg, renames = (str(path) if as_text else path), []
        fn({"epoch": 1, "w": torch.ones(500)}, arg)
        yield tr("after a save, the file at `path` holds epoch", "保存之后，`path` 处的文件存的 epoch"), _held(path)
        crashed, held = _crash(fn, {"epoch": 2, "w": torch.zeros(500)}, arg, path, 1, renames)
        yield tr("the crash reached the caller (an OSError)", "“崩溃（一个 OSError）传到了调用方”"), crashed
        next_save = tr("at a crash in the next save, the file at `path` holds epoch",
                       "在下一次保存中崩溃时，`path` 处的文件存的 epoch")
        yield next_save, held
        _, held = _crash(fn, {"epoch": 3, "w": torch.ones(500)}, arg, path, 2, renames)
        second_call = tr("at a crash in a save's second torch.save call, the file holds epoch",
                         "在一次保存的第二次 torch.save 调用中崩溃时，文件存的 epoch")
        yield second_call, held
        inside = all(p.resolve().parent == folder.resolve() for p in renames)
        yield tr("the temporary file is in the checkpoint's folder", "“临时文件与检查点在同一个文件夹中”"), inside


q4 = Exercise(
    "Q4",
    save_atomically,
    cases=lambda: [("last.pt", False), ("ckpt.pth", True)],
    observe=_save_facts,
    describe=lambda c: tr(
        f"for path=.../ckpt/{c[0]} (given as a {'str' if c[1] else 'Path'})",
        f"当 path=.../ckpt/{c[0]}（以 {'str' if c[1] else 'Path'} 的形式给出）时",
    ),
    mistakes=dict(overwrites=lambda obj, path: torch.save(obj, path), swallows_error=_swallowing),
)

EXERCISES = [q1, q2, q3, q4]
