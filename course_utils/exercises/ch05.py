"""Chapter 05 exercises: a metric correct across ranks, a resume that restores the schedule,
an evaluation shard without padding, and a checkpoint write that survives a crash."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from .core import Exercise, Incorrect

# ------------------------------------------------------------------ Q1: accuracy across ranks

_Q1_COUNTS = [(90, 100), (45, 50), (10, 20)]  # (correct, total) of three ranks; uneven shards


class _FakeWorld:
    """Runs one function per simulated rank in threads; ``all_reduce(t)`` sums ``t`` over them in place."""

    def __init__(self, world_size: int, timeout: float = 2.0) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[Any] = [None] * world_size
        self.calls = [0] * world_size

    def all_reduce_for(self, rank: int) -> Callable[[torch.Tensor], None]:
        def all_reduce(t: torch.Tensor) -> None:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"all_reduce works on tensors, not on a {type(t).__name__}: wrap the number in torch.tensor(...)")
            self.calls[rank] += 1
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.slots)
            self.barrier.wait()
            t.copy_(total)

        return all_reduce

    def run(self, fn: Callable[..., Any], args_for: Callable[[int], tuple]) -> list[Any]:
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException | None] = [None] * self.world_size

        def target(rank: int) -> None:
            try:
                results[rank] = fn(*args_for(rank))
            except BaseException as exc:  # reported below
                errors[rank] = exc
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
        if real:
            raise real[0]
        if any(e is not None for e in errors) or len(set(self.calls)) > 1:
            raise Incorrect(
                f"the ranks made different numbers of all_reduce calls ({', '.join(map(str, self.calls))}), "
                "so one rank waited for the others: in a real job that hangs forever. Every rank must make "
                "the same collective calls, in the same order."
            )
        return results


def _check_q1(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect(f"pass your function itself (`q1.check(global_accuracy)`), not a {type(fn).__name__}.")
    world = _FakeWorld(len(_Q1_COUNTS))
    results = world.run(fn, lambda r: (torch.tensor(float(_Q1_COUNTS[r][0])),
                                       torch.tensor(float(_Q1_COUNTS[r][1])),
                                       world.all_reduce_for(r), len(_Q1_COUNTS)))
    want = sum(c for c, _ in _Q1_COUNTS) / sum(t for _, t in _Q1_COUNTS)
    mean_of_acc = sum(c / t for c, t in _Q1_COUNTS) / len(_Q1_COUNTS)
    values = []
    for rank, res in enumerate(results):
        if isinstance(res, torch.Tensor) and res.numel() == 1:
            res = res.item()
        if not isinstance(res, int | float):
            raise Incorrect(f"rank {rank} returned a {type(res).__name__}; return the accuracy as a number (a float).")
        values.append(float(res))
    if len({round(v, 9) for v in values}) > 1:
        shown = ", ".join(f"{v:.4f}" for v in values)
        raise Incorrect(
            f"the ranks disagree ({shown}): each returned its own shard's accuracy. All-reduce the counts "
            "first, so that every rank reports the accuracy of the whole set."
        )
    got = values[0]
    if abs(got - mean_of_acc) < 1e-6:
        raise Incorrect(
            f"you returned the mean of the ranks' accuracies ({got:.4f}). The shards are not the same size "
            f"(100, 50 and 20 samples), so that mean is not the accuracy of the whole set ({want:.4f}): "
            "sum the correct counts and the totals, then divide."
        )
    if abs(got - want) > 1e-6:
        raise Incorrect(f"every rank returned {got:.4f}, but the accuracy over all {sum(t for _, t in _Q1_COUNTS)} samples is {want:.4f}.")


def _q1_solution(correct, total, all_reduce, world_size):
    counts = torch.stack([correct, total]).double()
    all_reduce(counts)
    return (counts[0] / counts[1]).item()


def _q1_mean_of_accuracies(correct, total, all_reduce, world_size):
    acc = correct / total
    all_reduce(acc)
    return (acc / world_size).item()


def _q1_local_only(correct, total, all_reduce, world_size):
    return (correct / total).item()


def _q1_mismatched_calls(correct, total, all_reduce, world_size):
    all_reduce(correct)
    if total.item() >= 50:  # only some ranks reduce the total: the others never join
        all_reduce(total)
    return (correct / total).item()


q1 = Exercise(
    name="Q1",
    prompt="Write `global_accuracy(correct, total, all_reduce, world_size)` that every rank calls with its "
           "own counts (0-d tensors) and that returns the accuracy over all ranks' samples.",
    checker=_check_q1,
    hints=[
        "`all_reduce(t)` replaces the tensor `t`, on every rank, by the sum of all the ranks' `t`.",
        "Reduce the *counts*, not the ratio: sum `correct` and `total` over the ranks, then divide once.",
        "One call is enough: `counts = torch.stack([correct, total]); all_reduce(counts)`.",
    ],
    solution_code='''def global_accuracy(correct, total, all_reduce, world_size):
    counts = torch.stack([correct, total]).double()   # one tensor, one collective call
    all_reduce(counts)                                # now the sums over every rank
    return (counts[0] / counts[1]).item()''',
    solve=lambda: _q1_solution,
    wrong_answers=[
        ("the mean of the ranks' accuracies", lambda: _q1_mean_of_accuracies),
        ("each rank's own accuracy, no all_reduce", lambda: _q1_local_only),
        ("an all_reduce that only some ranks make", lambda: _q1_mismatched_calls),
    ],
)

# ------------------------------------------------------------- Q2: resume restores everything

_Q2_STEPS_PER_EPOCH, _Q2_EPOCHS, _Q2_DONE = 2, 5, 3


def _q2_setup(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=_Q2_STEPS_PER_EPOCH * _Q2_EPOCHS)
    return model, opt, sched


def _q2_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    n = _Q2_STEPS_PER_EPOCH * _Q2_EPOCHS
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(n)]


def _q2_train(model, opt, sched, batches) -> None:
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


def _check_q2(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect(f"pass your function itself (`q2.check(resume)`), not a {type(fn).__name__}.")
    batches = _q2_batches()
    done = _Q2_DONE * _Q2_STEPS_PER_EPOCH
    ref_model, ref_opt, ref_sched = _q2_setup(0)
    _q2_train(ref_model, ref_opt, ref_sched, batches[:done])
    ckpt = {"epoch": _Q2_DONE, "model": ref_model.state_dict(), "optimizer": ref_opt.state_dict(),
            "scheduler": ref_sched.state_dict()}
    import copy

    ckpt = copy.deepcopy(ckpt)
    lr_at_resume = ref_opt.param_groups[0]["lr"]
    _q2_train(ref_model, ref_opt, ref_sched, batches[done:])

    model, opt, sched = _q2_setup(1)  # a fresh run: other initial weights, the schedule at step 0
    start = fn(ckpt, model, opt, sched)
    if start is None:
        raise Incorrect("your function returns None: return the epoch the training loop should start from.")
    if not isinstance(start, int) or isinstance(start, bool):
        raise Incorrect(f"return the start epoch as an int, not a {type(start).__name__}.")
    if not torch.equal(model.weight, ckpt["model"]["weight"]):
        raise Incorrect("the model's weights are not the checkpoint's: `model.load_state_dict(ckpt['model'])`.")
    state = opt.state_dict()["state"]
    if not state or not torch.equal(state[0]["exp_avg"], ckpt["optimizer"]["state"][0]["exp_avg"]):
        raise Incorrect(
            "the optimizer starts from scratch: AdamW's running averages of the gradients (exp_avg, "
            "exp_avg_sq) and its step count are lost. `optimizer.load_state_dict(ckpt['optimizer'])`."
        )
    if sched.last_epoch != ckpt["scheduler"]["last_epoch"]:
        raise Incorrect(
            f"the scheduler is at step {sched.last_epoch}, not at step {ckpt['scheduler']['last_epoch']} where "
            "the checkpoint left it: the learning rate will follow the wrong part of its schedule (with "
            "OneCycleLR, warm up again, then run past its end and fail). `scheduler.load_state_dict(ckpt['scheduler'])`."
        )
    if abs(opt.param_groups[0]["lr"] - lr_at_resume) > 1e-12:
        raise Incorrect(
            f"the learning rate after resuming is {opt.param_groups[0]['lr']:.4g}, but it was {lr_at_resume:.4g} "
            "when the checkpoint was written: load the optimizer's state too (it holds the current lr)."
        )
    if start != _Q2_DONE:
        more = "skip" if start > _Q2_DONE else "repeat"
        raise Incorrect(
            f"you return {start}, but the checkpoint says {_Q2_DONE} epochs are done, and the loop is "
            f"`for epoch in range(start, epochs)`: starting at {start} would {more} an epoch. Return ckpt['epoch']."
        )
    remaining = (_Q2_EPOCHS - start) * _Q2_STEPS_PER_EPOCH
    _q2_train(model, opt, sched, batches[len(batches) - remaining:])
    if not torch.equal(model.weight, ref_model.weight):
        raise Incorrect("after resuming and finishing, the weights differ from those of the uninterrupted run.")


def _q2_solution(ckpt, model, optimizer, scheduler):
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    return ckpt["epoch"]


def _q2_no_scheduler(ckpt, model, optimizer, scheduler):
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["epoch"]


def _q2_off_by_one(ckpt, model, optimizer, scheduler):
    _q2_solution(ckpt, model, optimizer, scheduler)
    return ckpt["epoch"] + 1


def _q2_no_optimizer(ckpt, model, optimizer, scheduler):
    model.load_state_dict(ckpt["model"])
    scheduler.load_state_dict(ckpt["scheduler"])
    return ckpt["epoch"]


q2 = Exercise(
    name="Q2",
    prompt="Write `resume(ckpt, model, optimizer, scheduler)` that restores a run from a checkpoint dict "
           "(keys 'epoch', 'model', 'optimizer', 'scheduler'; 'epoch' counts completed epochs) and returns "
           "the epoch the loop `for epoch in range(start, epochs)` starts from.",
    checker=_check_q2,
    hints=[
        "Three objects carry state: the model (weights), the optimizer (AdamW's moments, step count, current "
        "lr) and the scheduler (where it is in its schedule). Each has `load_state_dict`.",
        "ckpt['epoch'] is the number of epochs already done; with 0-based epochs that is the next one to run.",
    ],
    solution_code='''def resume(ckpt, model, optimizer, scheduler):
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    return ckpt["epoch"]            # epochs done = the next 0-based epoch''',
    solve=lambda: _q2_solution,
    wrong_answers=[
        ("forgets the scheduler", lambda: _q2_no_scheduler),
        ("starts one epoch too late", lambda: _q2_off_by_one),
        ("forgets the optimizer", lambda: _q2_no_optimizer),
    ],
)

# ------------------------------------------------------------- Q3: evaluation without padding

_Q3_CASES = [(359, 2), (10, 3), (7, 4), (3, 8), (144, 2), (0, 2)]


def _check_q3(fn: Any) -> None:
    if not callable(fn):
        raise Incorrect(f"pass your function itself (`q3.check(eval_shard)`), not a {type(fn).__name__}.")
    for n, world in _Q3_CASES:
        shards = [list(fn(n, rank, world)) for rank in range(world)]
        flat = [int(i) for s in shards for i in s]
        seen: dict[int, int] = {}
        for i in flat:
            seen[i] = seen.get(i, 0) + 1
        twice = sorted(i for i, c in seen.items() if c > 1)
        if twice:
            raise Incorrect(
                f"with n={n} and {world} ranks, index {twice[0]} is on more than one rank: it is counted "
                f"twice ({len(flat)} evaluations for {n} samples). That is DistributedSampler's padding; "
                "an evaluation shard must not pad."
            )
        missing = sorted(set(range(n)) - set(flat))
        if missing:
            raise Incorrect(
                f"with n={n} and {world} ranks, {len(missing)} sample(s) are on no rank (e.g. index {missing[0]}): "
                "the metric would ignore them. Every index must be on exactly one rank."
            )
        extra = sorted(set(flat) - set(range(n)))
        if extra:
            raise Incorrect(f"with n={n}, your shards contain index {extra[0]}, which does not exist.")
        sizes = [len(s) for s in shards]
        if max(sizes) - min(sizes) > 1:
            raise Incorrect(
                f"with n={n} and {world} ranks the shard sizes are {sizes}: one rank does most of the work. "
                "Balance them (sizes may differ by at most one)."
            )


def _q3_solution(n, rank, world_size):
    return list(range(rank, n, world_size))


def _q3_distributed_sampler(n, rank, world_size):
    return list(DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False))


def _q3_floor_chunks(n, rank, world_size):
    per = n // world_size
    return list(range(rank * per, (rank + 1) * per))


q3 = Exercise(
    name="Q3",
    prompt="Write `eval_shard(n, rank, world_size)` returning the indices that `rank` evaluates, so that "
           "over all ranks every one of the n samples is evaluated exactly once.",
    checker=_check_q3,
    hints=[
        "DistributedSampler pads to ceil(n / world_size) samples per rank by repeating the first indices: "
        "with 359 test images on 2 ranks, image 0 is evaluated twice.",
        "Striding needs no padding: rank r takes r, r + world_size, r + 2 * world_size, ...",
    ],
    solution_code='''def eval_shard(n, rank, world_size):
    return list(range(rank, n, world_size))   # shards differ in size by at most one''',
    solve=lambda: _q3_solution,
    wrong_answers=[
        ("DistributedSampler's padded shard", lambda: _q3_distributed_sampler),
        ("equal chunks of n // world_size (drops the remainder)", lambda: _q3_floor_chunks),
    ],
)

# ------------------------------------------------------------------ Q4: an atomic checkpoint write


def _check_q4(fn: Any) -> None:
    from ..pipeline import interrupted_save

    if not callable(fn):
        raise Incorrect(f"pass your function itself (`q4.check(save_atomically)`), not a {type(fn).__name__}.")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt" / "last.pt"
        path.parent.mkdir()
        fn({"epoch": 1, "w": torch.ones(500)}, path)
        if not path.exists():
            raise Incorrect("after `save_atomically(obj, path)` there is no file at `path`.")
        first = torch.load(path, weights_only=True)
        if first.get("epoch") != 1:
            raise Incorrect("the file at `path` does not hold the object that was saved.")
        real_replace = os.replace
        renames: list[tuple[str, str]] = []

        def recording_replace(src, dst, *a, **k):
            renames.append((os.fspath(src), os.fspath(dst)))
            return real_replace(src, dst, *a, **k)

        os.replace = recording_replace
        try:
            crashed = False
            with interrupted_save(0.5):
                try:
                    fn({"epoch": 2, "w": torch.zeros(500)}, path)
                except OSError:
                    crashed = True
        finally:
            os.replace = real_replace
        if not crashed:
            raise Incorrect("your function swallowed the write error: let it propagate, so that the caller knows the save failed.")
        if not path.exists():
            raise Incorrect(
                "after a crash during the second save, there is no checkpoint at all: the old one was "
                "deleted before the new one was complete. Write the new file elsewhere first, then rename it over."
            )
        try:
            again = torch.load(path, weights_only=True)
        except Exception:
            raise Incorrect(
                "after a crash half-way through the second save, the file at `path` is corrupt: the new "
                "checkpoint was written directly at `path`, and the crash left it half-written. Write to a "
                "temporary file next to it, then `os.replace` it over `path`."
            ) from None
        if again.get("epoch") != 1:
            raise Incorrect("after the crash, `path` should still hold the previous checkpoint (epoch 1).")
        # a normal save must then go through with a rename in the same folder
        renames.clear()
        os.replace = recording_replace
        try:
            fn({"epoch": 3}, path)
        finally:
            os.replace = real_replace
        if torch.load(path, weights_only=True).get("epoch") != 3:
            raise Incorrect("the third save did not replace the checkpoint.")
        if renames and Path(renames[-1][0]).parent.resolve() != path.parent.resolve():
            raise Incorrect(
                "the temporary file is not in the checkpoint's folder: a rename is only atomic within one "
                "file system (across two it fails, or turns into a copy). Create it next to `path`."
            )


def _q4_solution(obj, path):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _q4_in_place(obj, path):
    torch.save(obj, path)


def _q4_delete_first(obj, path):
    if os.path.exists(path):
        os.remove(path)
    torch.save(obj, path)


q4 = Exercise(
    name="Q4",
    prompt="Write `save_atomically(obj, path)` so that a crash in the middle of a save never leaves a "
           "corrupt or missing checkpoint at `path` (the previous one survives).",
    checker=_check_q4,
    hints=[
        "Never write over the only good copy: write the new checkpoint to another file first.",
        "`os.replace(src, dst)` swaps a finished file in with one atomic rename, if both are on the same file "
        "system: put the temporary file in the same folder. `f.flush(); os.fsync(f.fileno())` before renaming "
        "makes sure the bytes are on disk.",
    ],
    solution_code='''def save_atomically(obj, path):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")     # same folder, same file system
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())                     # the bytes are on disk
    os.replace(tmp, path)                        # atomic: old file or new file, never half''',
    solve=lambda: _q4_solution,
    wrong_answers=[
        ("torch.save straight over the old file", lambda: _q4_in_place),
        ("delete the old file, then save", lambda: _q4_delete_first),
    ],
)

EXERCISES = [q1, q2, q3, q4]
