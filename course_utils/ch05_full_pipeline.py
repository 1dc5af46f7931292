"""Chapter 05: the pieces of the training script ``notebooks/scripts/train.py`` that the notebook
shows on their own: its configuration, the data splits, atomic checkpoints and exact resume."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from .data import digits_tensors
from .i18n import pad, text_width, tr
from .models import MODELS

# --------------------------------------------------------------------------------- configuration


def _opt(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    """Everything a run depends on. Each field is a command-line flag (``out_dir``: ``--out-dir``)."""

    model: str = _opt("cnn", "'cnn' (a small CNN) or 'mlp' (the source's MLP(784, 256, 10))")
    epochs: int = _opt(6, "passes over the training split")
    batch_size: int = _opt(32, "batch size per rank (the global batch is this x world size)")
    lr: float = _opt(4e-3, "peak learning rate of the one-cycle schedule")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    clip_grad_norm: float = _opt(1.0, "clip the gradient norm to this value (0: no clipping)")
    val_fraction: float = _opt(0.1, "fraction of the training images held out for validation")
    seed: int = _opt(0, "seed of every random number generator")
    num_workers: int = _opt(0, "DataLoader worker processes per rank (0: the main process)")
    eval_batch_size: int = _opt(256, "batch size for evaluation")
    out_dir: str = _opt("runs/train", "folder of last.pt, metrics.jsonl, final.pt, summary.json")
    resume: bool = _opt(True, "resume from OUT_DIR/last.pt when it exists")
    bf16: bool = _opt(False, "bf16 autocast (mixed precision; for GPUs)")
    compile: bool = _opt(False, "torch.compile the model (for GPUs; the first compile is slow)")
    progress: bool = _opt(True, "tqdm progress bar on rank 0 (only in a terminal)")
    test_every_epoch: bool = _opt(False, "evaluate the test split after every epoch too")
    crash_at_epoch: int = _opt(0, "fault drill: rank CRASH_RANK dies in this epoch, 1st attempt")
    crash_rank: int = _opt(1, "fault drill: which rank dies")
    stop_after_epoch: int = _opt(0, "stop cleanly after this epoch, as a job at its time limit")
    signal_at_step: int = _opt(0, "drill: rank CRASH_RANK sends itself SIGUSR1 after this step (counted over the run)")

    def __post_init__(self) -> None:
        for name, ok, rule in (
            ("model", self.model in MODELS, f"one of {', '.join(MODELS)}"),
            ("epochs", self.epochs >= 1, "at least 1"),
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("eval_batch_size", self.eval_batch_size >= 1, "at least 1"),
            ("val_fraction", 0 < self.val_fraction < 1, "between 0 and 1"),
            ("lr", self.lr > 0, "positive"),
            ("num_workers", self.num_workers >= 0, "0 or more"),
        ):
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


#: What must match between a checkpoint and the run that resumes from it (the rest may change).
RESUME_KEYS = "model epochs batch_size lr weight_decay clip_grad_norm val_fraction seed".split()


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from command-line flags, one per field (``--no-...`` for booleans)."""
    parser = argparse.ArgumentParser(
        description="Train a digits classifier with DDP (chapter 05's full pipeline).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in dataclasses.fields(TrainConfig):
        kind = type(f.default)
        how = {"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, default=f.default, help=f.metadata["help"], **how)
    try:
        return TrainConfig(**vars(parser.parse_args(argv)))
    except ValueError as exc:
        parser.error(str(exc))  # exits with the usage and the reason


def format_config(cfg: TrainConfig, **extra: object) -> str:
    """The configuration and ``extra``, one ``name  value`` per line (an absolute out_dir shortened)."""
    items = {**dataclasses.asdict(cfg), **extra}
    if Path(cfg.out_dir).is_absolute():  # no machine path in logs
        items["out_dir"] = f".../{Path(cfg.out_dir).name}"
    width = max(map(len, items))
    return "\n".join(f"{k:<{width}}  {v}" for k, v in items.items())


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
    lines = [tr(f"{n} samples over {world_size} ranks", f"{n} 个样本分给 {world_size} 个 rank")]
    seen: list[int] = []
    for r in range(world_size):
        idx = list(DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=False))
        seen += idx
        k, shard = len(idx), len(ShardSampler(n, r, world_size))
        lines.append(tr(f"  rank {r}: DistributedSampler {k:>4} samples | ShardSampler {shard:>4} samples",
                        f"  rank {r}：DistributedSampler {k:>4} 个样本 | ShardSampler {shard:>4} 个样本"))
    twice, per_rank = len(seen) - len(set(seen)), math.ceil(n / world_size)
    lines.append(tr(
        f"DistributedSampler: {len(seen)} evaluated, {twice} counted twice "
        f"({per_rank} x {world_size} - {n})",
        f"DistributedSampler：评估了 {len(seen)} 个，其中 {twice} 个被算了两次（{per_rank} x {world_size} - {n}）",
    ))
    label = pad(tr("ShardSampler:", "ShardSampler："), text_width(tr("DistributedSampler:", "DistributedSampler：")))
    lines.append(label + tr(f" {n} evaluated, 0 counted twice", f"评估了 {n} 个，其中 0 个被算了两次"))
    return "\n".join(lines)


# --------------------------------------------------------------------------------- checkpoints


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (damaged, or made with another configuration)."""


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` that never leaves a half-written file at ``path``: write a temporary file in
    the same folder, ``fsync`` it, then ``os.replace`` it over ``path`` (atomic on one file system:
    a reader sees the old file or the new one). A crash before the rename leaves the old file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):  # POSIX: fsync the folder too, so the rename itself is durable
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


@contextlib.contextmanager
def interrupted_save(fraction: float = 0.5) -> Iterator[None]:
    """Inside the block, ``torch.save(obj, f)`` (f a path or a file) writes the first ``fraction``
    of its bytes, then raises ``OSError``: a crash mid-write (a killed job, a full disk)."""
    real_save = torch.save

    def dying_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()[: int(len(buf.getvalue()) * fraction)]
        with open(f, "wb") if isinstance(f, str | os.PathLike) else contextlib.nullcontext(f) as fh:
            fh.write(data)
        raise OSError(f"simulated crash: the process died after writing {len(data):,} bytes")

    torch.save = dying_save
    try:
        yield
    finally:
        torch.save = real_save


def get_rng_state() -> dict[str, Any]:
    """This process's random states, as tensors and plain data (what ``weights_only`` loads)."""
    name, keys, *rest = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, keys.tolist(), *rest),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states saved by :func:`get_rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda", [])
    if cuda and len(cuda) == torch.cuda.device_count():  # the GPUs it was saved with
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def load_checkpoint(
    path: str | os.PathLike, map_location: Any = "cpu", config: TrainConfig | None = None
) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None when there is none), loaded with ``weights_only=True``
    (tensors and plain data: unpickling it runs no code). With ``config``, a checkpoint made with
    another configuration is refused (``CheckpointError``): the run cannot continue it."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        # Not PyTorch's message: for a file that is not a checkpoint it suggests weights_only=False.
        raise CheckpointError(
            f"the checkpoint {path.name} cannot be read ({type(exc).__name__}) in {path.parent}: "
            "it is truncated (a run that crashed while saving without atomic_save) or not a "
            "checkpoint at all. Move it away (or delete it) to start again from scratch, or start "
            "a fresh run with --no-resume or another --out-dir. Do not load it with "
            "weights_only=False: a file that is not what you expect can run code when unpickled."
        ) from None
    if config is not None:
        saved = ckpt.get("config", {})
        diff = [
            f"{k}: {saved.get(k)!r} -> {getattr(config, k)!r}"
            for k in RESUME_KEYS
            if saved.get(k) != getattr(config, k)
        ]
        if diff:
            raise CheckpointError(
                f"the checkpoint {path.name} was made with another configuration ({'; '.join(diff)}). "
                "Resume with the same settings, or start a fresh run with --no-resume or another --out-dir."
            )
    return ckpt


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys (0.0: identical)."""
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a metrics file, one JSON object per line (none when there is no file)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------ a script beside the snippet it grew from


def compare_lines(skeleton: str, script: str, pairs: Sequence[tuple[str, str]]) -> str:
    """Pairs of lines, found in each text by a fragment (``""``: missing from the skeleton), with
    their line numbers. A fragment not found raises ``ValueError``: the comparison cannot drift."""

    def find(text: str, fragment: str, name: str) -> tuple[int | str, str]:
        if not fragment:
            return "-", tr("(missing)", "（缺失）")
        for number, line in enumerate(text.splitlines(), 1):
            if fragment in line:
                return number, line.strip()
        raise ValueError(f"{fragment!r} is not in {name} any more: update the comparison")

    out = []
    for i, (a, b) in enumerate(pairs, 1):
        (na, la), (nb, lb) = find(skeleton, a, "skeleton"), find(script, b, "train.py")
        out.append(f"[{i:>2}] {pad(tr('skeleton', '骨架'), len('skeleton'))} {na:>4} | {la}")
        out.append(f"     train.py {nb:>4} | {lb}")
    return "\n".join(out)


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
