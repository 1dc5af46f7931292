"""Chapter 05: a metric across ranks, a full resume, an unpadded eval shard, a crash-safe save."""

import contextlib
import copy
import functools
import os
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from unittest import mock

import torch
from torch.utils.data import DistributedSampler

from ..i18n import tr
from .core import Exercise, Incorrect, as_ints, kind, variant
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
    describe=lambda s: tr("for (correct, total) = {s} on {n_s} ranks",
                          "当 {n_s} 个 rank 上的 (correct, total) = {s} 时", s=s, n_s=len(s)),
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
    try:  # what the training loop does with it
        resumed_epochs = range(start, epochs)
    except TypeError:
        resumed_epochs = None
    if resumed_epochs is None or isinstance(start, bool):
        raise Incorrect(tr(
            "the loop `for epoch in range(start, epochs)` cannot start from what you return ({kind}): range() needs "
            "a whole number of type int (a float like 3.0 raises TypeError). Return ckpt['epoch'] as it is.",
            "循环 `for epoch in range(start, epochs)` 无法从你返回的值（{kind}）开始：range() 需要一个 int "
            "类型的整数（像 3.0 这样的浮点数会引发 TypeError）。请原样返回 ckpt['epoch']。",
            kind=kind(start),
        ))
    yield tr("the start epoch", "起始 epoch"), resumed_epochs.start
    for epoch in resumed_epochs:
        _train(model, opt, sched, data[epoch * per_epoch : (epoch + 1) * per_epoch])
    yield tr("the weights at the end of the resumed run", "恢复训练结束时的权重"), model.weight.detach()


q2 = Exercise(
    "Q2",
    resume,
    cases=lambda: [(2, 5, 3), (3, 4, 1)],
    observe=_resume_facts,
    describe=lambda c: tr(
        "for a checkpoint after {c} of {c2} epochs ({c3} steps each)",
        "对于 {c2} 个 epoch 中训练完 {c} 个之后保存的检查点（每个 epoch {c3} 步）", c=c[2], c2=c[1], c3=c[0],
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
    yield tr("the indices on more than one rank",
             "出现在多个 rank 上的索引"), sorted(i for i, c in seen.items() if c > 1)[:10]
    yield tr("the indices on no rank", "不在任何 rank 上的索引"), sorted(set(range(n)) - set(seen))[:10]
    yield tr("the indices outside range(n)", "超出 range(n) 的索引"), sorted(set(seen) - set(range(n)))[:10]
    spread = tr("the largest shard size minus the smallest", "最大分片与最小分片的大小之差")
    yield spread, max(map(len, shards)) - min(map(len, shards))


q3 = Exercise(
    "Q3",
    eval_shard,
    cases=lambda: [(359, 2), (10, 3), (7, 4), (3, 8), (144, 2), (0, 2)],
    observe=_shard_facts,
    describe=lambda c: tr("with n={c} on {c2} ranks", "当 n={c}、共 {c2} 个 rank 时", c=c[0], c2=c[1]),
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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # same folder, a fresh name
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk
        os.replace(tmp, path)  # atomic: the old file or the new one, never half of one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a failed save (a full disk) leaves no half-written file behind
        raise
    if hasattr(os, "O_DIRECTORY"):  # POSIX: the rename itself on disk too
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _swallowing(obj, path):
    with contextlib.suppress(OSError):
        save_atomically(obj, path)


def _delete_then_rename(obj, path):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    path.unlink(missing_ok=True)  # no checkpoint at all from here ...
    os.rename(tmp, path)  # ... to here


def _temp_elsewhere(obj, path):
    fd, tmp = tempfile.mkstemp(suffix=".pt")  # the system's temporary folder
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
    os.replace(tmp, path)


# The operations that change what is on disk, as Python's audit events name them (a function bound
# under any name raises them: `from os import replace` too), and torch.save's own file writer, which
# opens a path in C++ and raises none: it is reported as an "open" while a check watches.
_CHANGES = {  # each event's arguments that name a path it changes
    "open": (0,), "os.rename": (0, 1), "os.remove": (0,), "os.truncate": (0,), "os.link": (1,), "os.symlink": (1,),
    "os.rmdir": (0,), "shutil.copyfile": (1,), "shutil.move": (0, 1), "shutil.rmtree": (0,),
}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_watch = threading.local()  # this thread's crash plan while a check runs it


class _Crash(OSError):
    """The simulated end of the process: what is on disk at that moment is what is left."""


def _opens_for_writing(event, args):
    if event != "open" or not isinstance(args[0], str | bytes | os.PathLike):
        return False
    mode, flags = args[1], args[2]
    return bool(flags & _WRITE) if isinstance(flags, int) and flags >= 0 else any(c in str(mode) for c in "wax+")


def _audit(event, args):
    plan = getattr(_watch, "plan", None)
    if (plan is None or plan["busy"] or event not in _CHANGES
            or (event == "open" and not _opens_for_writing(event, args))):
        return
    plan["busy"] = True
    try:
        paths = [Path(os.fsdecode(args[i])) for i in _CHANGES[event] if isinstance(args[i], str | bytes | os.PathLike)]
        plan["outside"] |= any(p.resolve().parent != plan["folder"] for p in paths if p.resolve() != plan["folder"])
        plan["seen"] += 1
        if plan["seen"] != plan["crash_at"]:
            return
        if plan["after"]:  # the operation happened, then the process died: a file opened for writing is empty
            flags = args[2] if event == "open" and isinstance(args[2], int) else 0
            if flags & os.O_TRUNC and not paths[0].is_dir():
                paths[0].write_bytes(b"")
        plan["held"] = _held(plan["path"])
    finally:
        plan["busy"] = False
    raise _Crash(tr("simulated crash: the process died here", "模拟的崩溃：进程在这里终止了"))


@functools.cache
def _install_audit_hook():
    """Once per process: audit hooks cannot be removed; outside a check this one returns at once."""
    sys.addaudithook(_audit)


def _watched_writer(real):
    def writer(name_or_buffer):
        if isinstance(name_or_buffer, str | os.PathLike):  # torch.save to a path: the file is opened in C++
            sys.audit("open", os.fspath(name_or_buffer), "wb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        return real(name_or_buffer)

    return writer


def _save_with_crash(fn, obj, arg, path, crash_at=0, after=False):
    """``fn(obj, arg)`` while the `crash_at`-th operation that changes the disk is the last one the process
    makes: the process "dies" just before it (or just after it, `after`). Returns (operations seen, what
    `path` held at the crash or at the end, whether the crash reached the caller, whether anything was
    written outside `path`'s folder)."""
    _install_audit_hook()
    plan = {"busy": False, "seen": 0, "crash_at": crash_at, "after": after, "path": path, "held": None,
            "folder": path.parent.resolve(), "outside": False}
    import torch.serialization as serialization

    reached = False
    _watch.plan = plan
    try:
        with mock.patch.object(serialization, "_open_zipfile_writer",
                               _watched_writer(serialization._open_zipfile_writer)):
            fn(obj, arg)
    except _Crash:
        reached = True
    finally:
        _watch.plan = None
    held = plan["held"] if plan["held"] is not None else _held(path)
    return plan["seen"], held, reached, plan["outside"]


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
        def fresh(k):  # a folder holding the checkpoint of epoch 1, as after a good save
            folder = Path(tmp) / f"ckpt{k}"
            folder.mkdir()
            torch.save({"epoch": 1, "w": torch.ones(500)}, folder / name)
            return folder / name

        path = Path(tmp) / "first" / name
        path.parent.mkdir()
        arg = str(path) if as_text else path
        fn({"epoch": 1, "w": torch.ones(500)}, arg)
        yield tr("after a save, the file at `path` holds epoch",
                 "保存之后，`path` 处的文件存的 epoch"), _held(path)
        path = fresh("clean")
        steps, held, _, outside = _save_with_crash(fn, {"epoch": 2, "w": torch.zeros(500)},
                                                   str(path) if as_text else path, path)
        lost, reached_all, next_ok = set(), True, True
        for k, after in [(k, after) for k in range(1, steps + 1) for after in (False, True)]:
            path = fresh(f"{k}-{after}")
            arg = str(path) if as_text else path
            _, state, reached, out = _save_with_crash(fn, {"epoch": 2, "w": torch.zeros(500)}, arg, path, k, after)
            outside |= out
            if state not in (1, 2):
                lost.add(state)
            reached_all &= reached
            fn({"epoch": 3, "w": torch.ones(500)}, arg)  # the run goes on: its next save must work
            next_ok &= _held(path) == 3
        yield (tr("what the file at `path` holds at a crash, at any point of the next save, when that is not a "
                  "whole checkpoint",
                  "在下一次保存的任意时刻崩溃时，`path` 处的文件（若不是完整的检查点）"),
               sorted(map(str, lost)))
        yield tr("every crash reached the caller (an OSError)",
                 "“每次崩溃（OSError）都传到了调用方”"), reached_all
        yield tr("the files it writes are in the checkpoint's folder",
                 "“它写入的文件都在检查点所在的文件夹中”"), not outside
        yield tr("after each crash, the next save holds epoch 3",
                 "“每次崩溃之后，下一次保存都存下了 epoch 3”"), next_ok


q4 = Exercise(
    "Q4",
    save_atomically,
    cases=lambda: [("last.pt", False), ("ckpt.pth", True)],
    observe=_save_facts,
    describe=lambda c: tr(
        "for path=.../ckpt/{c} (given as a {value})", "当 path=.../ckpt/{c}（以 {value} 的形式给出）时",
        c=c[0], value='str' if c[1] else 'Path',
    ),
    mistakes=dict(
        overwrites=lambda obj, path: torch.save(obj, path),
        delete_then_rename=_delete_then_rename,
        swallows_error=_swallowing,
        temp_elsewhere=_temp_elsewhere,
    ),
)

EXERCISES = [q1, q2, q3, q4]
