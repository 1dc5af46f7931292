"""Chapter 05: the pieces of the training script ``notebooks/scripts/train.py`` that the notebook
shows on their own: its configuration, the data splits, atomic checkpoints and exact resume, and its
output folder (one run at a time, an earlier run kept aside, what a crash leaves cleaned up). The
configuration is in ``ch05_config`` and the checkpoints in ``ch05_checkpoints``; their names are imported
here, so the notebook and the script import everything from this module."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from .ch05_checkpoints import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    CheckpointError,
    atomic_save,
    get_rng_state,
    interrupted_save,
    load_checkpoint,
    max_abs_diff,
    read_metrics,
    set_rng_state,
)
from .ch05_config import (  # noqa: F401  (re-exported: the chapter's names stay importable from here)
    RESUME_KEYS,
    TrainConfig,
    format_config,
    parse_config,
)
from .data import digits_tensors
from .i18n import pad, text_width, tr

# ---------------------------------------------------------------------------------------- data


class Splits(NamedTuple):
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset


def load_splits(val_fraction: float = 0.1, seed: int = 0) -> Splits:
    """The digits as in-memory tensors (decoding the PNGs every epoch would cost more than training):
    train less a seeded random ``val_fraction`` of it held out for validation, and test."""
    x, y = digits_tensors("train")
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = round(val_fraction * len(y))
    val, train = perm[:n_val].sort().values, perm[n_val:].sort().values
    test = TensorDataset(*digits_tensors("test"))
    return Splits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), test)


def padding_report(n: int = 359, world_size: int = 2) -> str:
    """How ``DistributedSampler`` and ``ShardSampler`` split ``n`` samples over ranks."""
    lines = [tr("{n} samples over {world_size} ranks", "{n} 个样本分给 {world_size} 个 rank",
                n=n, world_size=world_size)]
    seen: list[int] = []
    for r in range(world_size):
        idx = list(DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=False))
        seen += idx
        k, shard = len(idx), len(ShardSampler(n, r, world_size))
        lines.append(tr("  rank {r}: DistributedSampler {k:>4} samples | ShardSampler {shard:>4} samples",
                        "  rank {r}：DistributedSampler {k:>4} 个样本 | ShardSampler {shard:>4} 个样本",
                        r=r, k=k, shard=shard))
    twice, per_rank = len(seen) - len(set(seen)), math.ceil(n / world_size)
    lines.append(tr(
        "DistributedSampler: {n_seen} evaluated, {twice} counted twice ({per_rank} x {world_size} - {n})",
        "DistributedSampler：评估了 {n_seen} 个，其中 {twice} 个被算了两次（{per_rank} x {world_size} - {n}）",
        n_seen=len(seen), twice=twice, per_rank=per_rank, world_size=world_size, n=n,
    ))
    label = pad(tr("ShardSampler:", "ShardSampler："), text_width(tr("DistributedSampler:", "DistributedSampler：")))
    lines.append(label + tr(" {n} evaluated, 0 counted twice", "评估了 {n} 个，其中 0 个被算了两次", n=n))
    return "\n".join(lines)


# ------------------------------------------------------------------------------- the output folder

#: The files of one run in its folder (``--out-dir``).
RUN_FILES = ("last.pt", "metrics.jsonl", "summary.json", "final.pt")


def set_aside(out: str | os.PathLike) -> Path | None:
    """Move the files of an earlier run (RUN_FILES) out of the way, into ``out/previous-N/`` (the next
    free N), before a fresh run starts there; returns that folder (None: there was nothing)."""
    out = Path(out)
    found = [out / name for name in RUN_FILES if (out / name).exists()]
    if not found:
        return None
    n = 1 + max((int(d.name[9:]) for d in out.glob("previous-*") if d.name[9:].isdigit()), default=0)
    keep = out / f"previous-{n}"
    keep.mkdir()
    for f in found:
        os.replace(f, keep / f.name)
    return keep


class _Held:
    """A lock on a run's folder, held until ``release()`` or the end of the process."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # (closing the file releases the lock)
            self.fd = None


def hold_out_dir(out: str | os.PathLike) -> _Held:
    """Take the folder `out` for one run: ``CheckpointError`` (saying which process has it and what
    to do) while another process holds it; released when this process ends, however it ends. Where
    the filesystem cannot lock (some network filesystems, Windows), nothing is held."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows
        return _Held(None)
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise CheckpointError(tr(
            "another run is using {out} right now (process {holder}): two runs in one folder would mix their "
            "checkpoints and metrics. Wait for it to finish (or stop it), or give this run another --out-dir.",
            "另一次运行正在使用 {out}（进程 {holder}）：两次运行共用一个文件夹，会把各自的检查点和指标混在一起。"
            "请等它结束（或停止它），或者给这次运行换一个 --out-dir。",
            out=out, holder=holder)) from None
    except OSError:  # a filesystem without locks
        os.close(fd)
        return _Held(None)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return _Held(fd)


# ------------------------------------------------------ a script beside the snippet it grew from


def compare_lines(skeleton: str, script: str, pairs: Sequence[tuple[str, str]]) -> str:
    """Pairs of lines, found in each text by a fragment (``""``: missing from the skeleton), with
    their line numbers. A fragment not found, or found on several lines, raises ``ValueError``: the
    comparison cannot drift, nor land on another line that happens to share the fragment."""

    def find(text: str, fragment: str, name: str) -> tuple[int | str, str]:
        if not fragment:
            return "-", tr("(missing)", "（缺失）")
        found = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if fragment in line]
        if not found:
            raise ValueError(f"{fragment!r} is not in {name} any more: update the comparison")
        if len(found) > 1:
            raise ValueError(f"{fragment!r} is on lines {', '.join(str(n) for n, _ in found)} of {name}: give a "
                             "fragment of one line only")
        return found[0]

    out = []
    for i, (a, b) in enumerate(pairs, 1):
        (na, la), (nb, lb) = find(skeleton, a, "skeleton"), find(script, b, "train.py")
        out.append(f"[{i:>2}] {pad(tr('skeleton', '骨架'), len('skeleton'))} {na:>4} | {la}")
        out.append(f"     train.py {nb:>4} | {lb}")
    return "\n".join(out)


class NoisyImages(Dataset):
    """A dataset of (image, label) pairs with random noise added to each image as it is loaded: a random
    augmentation, drawn from the random stream of the process that loads (the main process, or a
    DataLoader worker)."""

    def __init__(self, data: TensorDataset, std: float) -> None:
        self.data, self.std = data, std

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.data[i]
        return x + self.std * torch.randn_like(x), y


class ResumableSampler(Sampler[int]):
    """Another sampler's indices from the ``start``-th on: a resumed epoch skips the batches it has done
    by index, without loading them (``start`` = steps done x batch size). ``set_epoch`` is passed on."""

    def __init__(self, sampler: Sampler[int]) -> None:
        self.sampler, self.start = sampler, 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.start, 0)  # type: ignore[arg-type]


_STOP = getattr(signal, "SIGUSR1", None)  # (Windows has no SIGUSR1)


def ignore_stop_signal(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: the worker ignores SIGUSR1. A scheduler or torchrun sends it to
    every process of the rank (Slurm: the job step; torchrun: the rank's process group), and its default
    action ends a process: a worker not forked from a process that handles it (spawn, forkserver) would
    die, and the rank with it. The worker started with the signal blocked (:func:`stop_signal_blocked`):
    a signal pending since then is discarded here."""
    if _STOP is not None:
        signal.signal(_STOP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {_STOP})


@contextlib.contextmanager
def stop_signal_blocked() -> Iterator[None]:
    """SIGUSR1 held back in this thread while DataLoader workers start (``iter(loader)``): they inherit the
    block (fork, and the exec of spawn keep the signal mask), so that one arriving before their
    ``worker_init_fn`` cannot end them. A signal for this process waits, and is handled on leaving."""
    if _STOP is None:
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {_STOP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class ShardSampler(Sampler[int]):
    """Rank r evaluates samples r, r + W, r + 2W, ...: unlike ``DistributedSampler``, no sample is
    repeated to even out the shards (counted twice); shards may differ by one sample."""

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, n, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@torch.inference_mode()
def local_eval_sums(
    model: nn.Module, loader: DataLoader, device: torch.device, bf16: bool = False
) -> torch.Tensor:
    """``[sum of losses, number correct, number of samples]`` over this rank's loader (float64)."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y, reduction="sum")
        sums[0] += loss
        sums[1] += (logits.argmax(1) == y).sum()
        sums[2] += len(y)
    return sums


@dataclass(frozen=True)
class EvalResult:
    loss: float
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    rank: int,
    world_size: int,
    device: torch.device,
    batch_size: int = 256,
    bf16: bool = False,
) -> EvalResult:
    """Evaluate ``model`` on ``dataset``: each rank its own shard, counts all-reduced, each sample once.

    Pass the plain model (``ddp_model.module``) with the same weights and buffers on every rank
    (:func:`sync_buffers`). Every rank must call it: it ends in a collective (none without a group).
    """
    # A generator of its own: creating a DataLoader iterator draws a seed from it, and drawing from
    # the global one would change the training run's random stream (dropout) from then on.
    sampler = ShardSampler(len(dataset), rank, world_size)
    loader = DataLoader(dataset, batch_size, sampler=sampler, generator=torch.Generator())
    was_training = model.training
    sums = local_eval_sums(model.eval(), loader, device, bf16)
    model.train(was_training)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums)  # [loss, correct, total] summed over the ranks
    loss_sum, correct, total = sums.tolist()
    return EvalResult(loss_sum / max(total, 1.0), int(correct), int(total))


def sync_buffers(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (BatchNorm running statistics) to every rank, before evaluating or
    saving: DDP broadcasts them before each training forward, which then updates them per rank."""
    if dist.is_available() and dist.is_initialized():
        for b in model.buffers():
            dist.broadcast(b, src)
