"""Chapter 05 (the full pipeline), the training script's configuration: ``TrainConfig`` (every setting a run
depends on, each a command-line flag), the settings a resume must keep (``RESUME_KEYS``), and the
configuration parsed and shown. Used in sections 1 and 2 ("The pieces, each testable on its own") of
notebook 05, and by ``scripts/train.py``, through ``course_utils.ch05_full_pipeline``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    resume: bool = _opt(True, "resume from OUT_DIR/last.pt when it exists (--no-resume: start afresh, "
                        "the earlier run's files kept in OUT_DIR/previous-N/)")
    bf16: bool = _opt(False, "bf16 autocast (mixed precision; for GPUs)")
    compile: bool = _opt(False, "torch.compile the model (for GPUs; the first compile is slow)")
    progress: bool = _opt(True, "tqdm progress bar on rank 0 (only in a terminal)")
    test_every_epoch: bool = _opt(False, "evaluate the test split after every epoch too")
    crash_at_epoch: int = _opt(0, "fault drill: rank CRASH_RANK dies in this epoch, 1st attempt")
    crash_rank: int = _opt(1, "fault drill: which rank dies")
    stop_after_epoch: int = _opt(0, "stop cleanly after this epoch, as a job at its time limit")
    signal_at_step: int = _opt(0, "drill: rank CRASH_RANK sends SIGUSR1 to itself and its DataLoader workers "
                               "after this step (counted over the run)")
    stop_check_every: int = _opt(10, "steps between the ranks' checks for a stop signal (each check: one "
                                 "all-reduce, and on a GPU a wait for the step to finish); an epoch's last step "
                                 "is always checked")
    augment: float = _opt(0.0, "random noise of this standard deviation added to each training image as it is "
                          "loaded, drawn from the loading process's random stream (0: none)")
    worker_start: str = _opt("default", "how DataLoader workers start: default (the platform's), fork, spawn "
                             "or forkserver")

    def __post_init__(self) -> None:
        for name, ok, rule in (
            ("model", self.model in MODELS, f"one of {', '.join(MODELS)}"),
            ("epochs", self.epochs >= 1, "at least 1"),
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("eval_batch_size", self.eval_batch_size >= 1, "at least 1"),
            ("val_fraction", 0 < self.val_fraction < 1, "between 0 and 1"),
            ("lr", self.lr > 0, "positive"),
            ("num_workers", self.num_workers >= 0, "0 or more"),
            ("stop_check_every", self.stop_check_every >= 1, "at least 1"),
            ("augment", self.augment >= 0, "0 or more"),
            ("worker_start", self.worker_start in ("default", "fork", "spawn", "forkserver"),
             "default, fork, spawn or forkserver"),
        ):
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


#: What must match between a checkpoint and the run that resumes from it (the rest may change).
RESUME_KEYS = "model epochs batch_size lr weight_decay clip_grad_norm val_fraction seed augment".split()


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
