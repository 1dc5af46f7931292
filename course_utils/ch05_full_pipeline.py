"""The reusable pieces of chapter 05's training script (``notebooks/scripts/train.py``).

Each piece is small and tested on its own, so the script itself reads like the
source chapter's ``main_worker`` skeleton made whole:

- :class:`TrainConfig` and :func:`parse_config`: configuration from the command line;
- :func:`build_model`: a model by name (the source's ``MLP`` and a small CNN);
- :func:`load_splits`: the course digits in memory, with a validation split held out of train;
- :class:`ShardSampler`, :func:`evaluate`, :func:`all_reduce_sums`: evaluation on every rank's
  shard, counts summed across ranks, no sample counted twice;
- :func:`atomic_save`, :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`get_rng_state`,
  :func:`set_rng_state`: checkpoints that survive a crash mid-write and resume exactly;
- :func:`seed_worker`, :func:`epoch_seed`: seeded DataLoader workers;
- :class:`MetricsWriter`, :func:`read_metrics`: one JSON line per epoch.
"""

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from .dist import shard_indices
from .models import MODELS

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Everything a run depends on. Each field is a command-line flag (``out_dir`` -> ``--out-dir``)."""

    model: str = _opt("cnn", "model name: 'cnn' (small CNN) or 'mlp' (the source's MLP(784, 256, 10))")
    epochs: int = _opt(6, "number of passes over the training split")
    batch_size: int = _opt(32, "batch size per rank (the global batch is batch_size x world_size)")
    lr: float = _opt(4e-3, "peak learning rate of the one-cycle schedule")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    clip_grad_norm: float = _opt(1.0, "clip the gradient norm to this value (0 turns clipping off)")
    val_fraction: float = _opt(0.1, "fraction of the training images held out for validation")
    seed: int = _opt(0, "seed of every random number generator")
    num_workers: int = _opt(0, "DataLoader worker processes per rank (0: load in the main process)")
    eval_batch_size: int = _opt(256, "batch size for evaluation")
    out_dir: str = _opt("runs/train", "folder for the checkpoint (last.pt), metrics.jsonl and summary.json")
    resume: bool = _opt(True, "resume from OUT_DIR/last.pt when it exists")
    bf16: bool = _opt(False, "bf16 autocast (mixed precision; for GPUs)")
    compile: bool = _opt(False, "torch.compile the model (for GPUs; the first compile takes a while)")
    progress: bool = _opt(True, "tqdm progress bar on rank 0 (only when writing to a terminal)")
    test_every_epoch: bool = _opt(False, "also evaluate the test split after every epoch (benchmarks)")
    crash_at_epoch: int = _opt(0, "fault drill: rank CRASH_RANK dies half-way through this epoch (1-based) on the first attempt")
    crash_rank: int = _opt(1, "fault drill: which rank dies")
    stop_after_epoch: int = _opt(0, "stop cleanly after this epoch (1-based), as a job that hit its time limit")

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: choose one of {', '.join(MODELS)}")
        for name in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be between 0 and 1, got {self.val_fraction}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers cannot be negative, got {self.num_workers}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Fields that must match between a checkpoint and the run resuming from it (others may change,
#: e.g. the fault-drill flags, the progress bar or the number of workers).
RESUME_KEYS = ("model", "epochs", "batch_size", "lr", "weight_decay", "clip_grad_norm", "val_fraction", "seed")


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one flag per :class:`TrainConfig` field (booleans get ``--no-...``)."""
    parser = argparse.ArgumentParser(
        description="Train a digits classifier with DDP (chapter 05's full pipeline).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str, "bool": bool}[f.type if isinstance(f.type, str) else f.type.__name__]
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])
    return parser


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse command-line flags into a :class:`TrainConfig` (argparse reports bad values)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return TrainConfig(**vars(args))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _show_path(p: str) -> str:
    """Relative paths as they are; an absolute one by its last part only (no machine paths in logs)."""
    path = Path(p)
    return p if not path.is_absolute() else f".../{path.name}"


def format_config(cfg: TrainConfig, world_size: int | None = None, backend: str | None = None) -> str:
    """The configuration, one ``name: value`` per line (absolute paths shortened)."""
    items = cfg.to_dict()
    items["out_dir"] = _show_path(cfg.out_dir)
    if world_size is not None:
        items["world_size"] = world_size
        items["global_batch"] = cfg.batch_size * world_size
    if backend is not None:
        items["backend"] = backend
    width = max(len(k) for k in items)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in items.items())


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------









# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Splits:
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset


def load_splits(val_fraction: float = 0.1, seed: int = 0) -> Splits:
    """The course digits as in-memory tensors: train minus a held-out validation part, and test.

    The validation images are a seeded random ``val_fraction`` of the train split, the same on
    every rank and in every run with the same seed. Tensors, not PNG files: decoding 1,438 images
    per epoch would cost more than training on them.
    """
    from .data import digits_tensors

    x, y = digits_tensors("train")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_val = round(val_fraction * len(y))
    val_idx, train_idx = perm[:n_val].sort().values, perm[n_val:].sort().values
    xt, yt = digits_tensors("test")
    return Splits(TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx]),
                  TensorDataset(xt, yt))


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` of the training script: NumPy and ``random`` reseeded from the worker's torch seed.

    This restates what PyTorch's worker loop (``torch/utils/data/_utils/worker.py``) has already done
    before it calls a ``worker_init_fn``: one intra-op thread, and torch, ``random`` and NumPy's global
    generator seeded per worker, each time workers start. Without ``persistent_workers`` that is every
    epoch, as in the training script; with ``persistent_workers=True`` the workers start once and this
    function runs once per worker, not per epoch: their streams simply go on. The reseeding only swaps
    the seeds for others that also differ per worker; a plain ``DataLoader`` needs no
    ``worker_init_fn`` for this.
    """
    s = torch.initial_seed() % 2**32  # base seed + worker id, drawn when the workers start
    np.random.seed(s)
    random.seed(s)
    torch.set_num_threads(1)  # already 1: DataLoader set it before calling this function


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """A seed for the DataLoader generator of one rank in one epoch (worker seeds follow from it)."""
    return (seed * 1_000_003 + epoch * 1009 + rank) % 2**63


# --------------------------------------------------------------------------------------------
# Evaluation across ranks
# --------------------------------------------------------------------------------------------





def padding_report(n: int = 359, world_size: int = 2) -> str:
    """How ``DistributedSampler`` and :class:`ShardSampler` split ``n`` samples over ranks."""
    from torch.utils.data import DistributedSampler

    per_rank = math.ceil(n / world_size)
    lines = [f"{n} samples over {world_size} ranks"]
    seen: list[int] = []
    for r in range(world_size):
        idx = list(DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=False))
        seen += idx
        lines.append(f"  rank {r}: DistributedSampler {len(idx):>4} samples | ShardSampler "
                     f"{len(shard_indices(n, r, world_size)):>4} samples")
    dup = len(seen) - len(set(seen))
    lines.append(f"DistributedSampler: {len(seen)} evaluated, {dup} counted twice "
                 f"({per_rank} x {world_size} - {n})")
    lines.append(f"ShardSampler:       {n} evaluated, 0 counted twice")
    return "\n".join(lines)












def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, n_classes: int = 10) -> torch.Tensor:
    """``cm[t, p]``: how many samples of true class t were predicted as p."""
    idx = target.long() * n_classes + pred.long()
    return torch.bincount(idx, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------

class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be used (corrupt, or made with another configuration)."""


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` that never leaves a half-written file at ``path``.

    Writes to a temporary file in the same folder, flushes it to disk (``fsync``), then renames
    it over ``path`` with ``os.replace``, which is atomic on one file system: a reader (or the
    run restarted after a crash) sees the old file or the new one, never a mixture. A crash
    before the rename leaves the previous checkpoint untouched.
    """
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
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable (POSIX)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


@contextlib.contextmanager
def interrupted_save(fraction: float = 0.5) -> Iterator[None]:
    """Make ``torch.save`` die part-way through a write (a crash, a full disk, a killed job).

    Inside the ``with`` block, ``torch.save(obj, f)`` writes the first ``fraction`` of the bytes
    it would write to ``f`` (a path or a file object), then raises ``OSError``. For demos and tests.
    """
    real_save = torch.save

    def dying_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()[: int(len(buf.getvalue()) * fraction)]
        if isinstance(f, str | os.PathLike):
            with open(f, "wb") as fh:
                fh.write(data)
        else:
            f.write(data)
        raise OSError(f"simulated crash: the process died after writing {len(data):,} bytes")

    torch.save = dying_save
    try:
        yield
    finally:
        torch.save = real_save


def get_rng_state() -> dict[str, Any]:
    """This process's random number generator states, in types that ``weights_only`` loading accepts."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states saved by :func:`get_rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, epoch: int, rng_states: Sequence[Mapping[str, Any]],
                    config: TrainConfig, extra: Mapping[str, Any] | None = None) -> Path:
    """Write everything a resumed run needs, atomically.

    ``epoch`` is the number of *completed* epochs (the resumed run starts its loop there);
    ``rng_states`` holds one :func:`get_rng_state` per rank (index = rank).
    """
    ckpt = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": list(rng_states),
        "config": config.to_dict(),
        "extra": dict(extra or {}),
    }
    return atomic_save(ckpt, path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    config: TrainConfig | None = None) -> dict[str, Any] | None:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain data, no arbitrary code).

    Returns ``None`` when there is no file. With ``config``, refuses (``CheckpointError``) a
    checkpoint made with a configuration that the run cannot continue.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        # PyTorch's own message is not repeated: for a file that is not a checkpoint it suggests
        # weights_only=False, which would run whatever code the file holds.
        raise CheckpointError(
            f"the checkpoint {path.name} cannot be read ({type(exc).__name__}) in {path.parent}: it is "
            "truncated (a run that crashed while saving without atomic_save) or not a checkpoint at all. "
            "Move it away (or delete it) to start again from scratch, or start a fresh run with "
            "--no-resume or another --out-dir. Do not load it with weights_only=False: a file that is "
            "not what you expect can run code when it is unpickled."
        ) from None
    if config is not None:
        saved = ckpt.get("config", {})
        diff = [f"{k}: {saved.get(k)!r} -> {getattr(config, k)!r}" for k in RESUME_KEYS
                if saved.get(k) != getattr(config, k)]
        if diff:
            raise CheckpointError(
                f"the checkpoint {path.name} was made with another configuration ({'; '.join(diff)}). "
                "Resume with the same settings, or start a fresh run with --no-resume or another --out-dir."
            )
    return ckpt


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys (0.0: identical)."""
    if a.keys() != b.keys():
        raise ValueError(f"the state dicts have different keys: {sorted(set(a) ^ set(b))}")
    worst = 0.0
    for k in a:
        if a[k].shape != b[k].shape:
            raise ValueError(f"{k}: shapes differ, {tuple(a[k].shape)} vs {tuple(b[k].shape)}")
        if a[k].numel():
            worst = max(worst, (a[k].double() - b[k].double()).abs().max().item())
    return worst


def restart_count() -> int:
    """How many times this node's elastic launcher has restarted its workers (0 on the first attempt; on
    several nodes only the launcher of the node whose worker failed counts up)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

class MetricsWriter:
    """Appends one JSON object per epoch to a ``.jsonl`` file (rank 0 only).

    Opened with ``keep_through=k`` it first drops any row with ``epoch > k``: after a resume from
    the checkpoint of epoch k, the rows of the epochs that are re-run are not written twice.
    """

    def __init__(self, path: str | os.PathLike, keep_through: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = [r for r in read_metrics(self.path) if r.get("epoch", 0) <= keep_through] if keep_through else []
        atomic_text = "".join(json.dumps(r) + "\n" for r in rows)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(atomic_text)
        os.replace(tmp, self.path)

    def write(self, row: Mapping[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(row)) + "\n")
            f.flush()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a metrics file (an empty list when there is none)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# Reading a script beside the snippet it grew from
# --------------------------------------------------------------------------------------------

def _find_line(text: str, fragment: str, what: str) -> tuple[int, str]:
    for number, line in enumerate(text.splitlines(), 1):
        if fragment in line:
            return number, line.strip()
    raise ValueError(f"{fragment!r} is not in {what} any more: update the comparison")


def compare_lines(left: str, right: str, pairs: Sequence[tuple[str, str]],
                  names: tuple[str, str] = ("skeleton", "train.py")) -> str:
    """Pairs of lines, one from each text, found by a fragment of each, with their line numbers.

    A fragment of ``""`` on the left means "missing from the left text". Raises ``ValueError``
    when a fragment is not found, so the comparison cannot drift away from the files.
    """
    width = max(len(n) for n in names)
    out = []
    for i, (a, b) in enumerate(pairs, 1):
        na, la = _find_line(left, a, names[0]) if a else (0, "(missing)")
        nb, lb = _find_line(right, b, names[1])
        out.append(f"[{i:>2}] {names[0]:<{width}} {na or '-':>4} | {la}")
        out.append(f"     {names[1]:<{width}} {nb:>4} | {lb}")
    return "\n".join(out)
