"""Chapter 05: the pieces of the training script ``notebooks/scripts/train.py`` that the notebook
shows on their own: its configuration, the data splits, atomic checkpoints and exact resume, and its
output folder (one run at a time, an earlier run kept aside, what a crash leaves cleaned up)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import random
import signal
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
        f"DistributedSampler：评估了 {len(seen)} 个，其中 {twice} 个被算了两次（{per_rank} x "
        f"{world_size} - {n}）",
    ))
    label = pad(tr("ShardSampler:", "ShardSampler："), text_width(tr("DistributedSampler:", "DistributedSampler：")))
    lines.append(label + tr(f" {n} evaluated, 0 counted twice", f"评估了 {n} 个，其中 0 个被算了两次"))
    return "\n".join(lines)


# --------------------------------------------------------------------------------- checkpoints


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (damaged, or made with another configuration)."""


def _process_gone(pid: int) -> bool:
    """True if no process `pid` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # (it exists, and is not ours)
        return False
    return False


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` (itself, or what it was raised from or while handling), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` that never leaves a half-written file at ``path``: write a temporary file in
    the same folder, ``fsync`` it, then ``os.replace`` it over ``path`` (atomic on one file system:
    a reader sees the old file or the new one). A crash before the rename leaves the old file, and
    the temporary files of processes killed while saving (``.NAME.tmp-PID``) are removed by the next
    save. A failed write (a full disk) raises one ``OSError`` that says so."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f".{path.name}.tmp-*"):  # what a killed save left (SIGKILL, power cut)
        pid = old.name.rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and _process_gone(int(pid)):
            with contextlib.suppress(OSError):
                old.unlink()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        cause = _os_error(exc) if isinstance(exc, Exception) else None
        if cause is None:
            raise
        kept = tr(f"the previous {path.name} is unchanged",
                  f"原来的 {path.name} 保持不变") if path.exists() else ""
        raise OSError(cause.errno, tr(f"could not write {path.name} in {path.parent}: {cause.strerror or cause}",
                                      f"无法在 {path.parent} 中写入 {path.name}：{cause.strerror or cause}")
                      + (tr(f"; {kept}", f"；{kept}") if kept else "")) from None
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
        raise CheckpointError(tr(
            f"the checkpoint {path.name} cannot be read ({type(exc).__name__}) in {path.parent}: "
            "it is truncated (a run that crashed while saving without atomic_save) or not a "
            "checkpoint at all. Move it away (or delete it) to start again from scratch, or start "
            "a fresh run with --no-resume (the earlier run's files are kept in previous-N/) or another "
            "--out-dir. Do not load it with "
            "weights_only=False: a file that is not what you expect can run code when unpickled.",
            f"检查点 {path.name} 无法读取（{type(exc).__name__}），位于 {path.parent}："
            "它被截断了（某次运行在保存时崩溃，而保存没有用 "
            "atomic_save），或者根本不是检查点。"
            "把它移走（或删除）即可从头开始；也可以用 --no-resume "
            "开始一次新的运行（之前运行的文件保留在 "
            "previous-N/ 中），或者换一个 --out-dir。不要用 weights_only=False 加载它："
            "一个不是你所预期的文件，在反序列化（unpickle）时可能会运行代码。"
        )) from None
    if config is not None:
        saved = ckpt.get("config", {})
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # a setting added since
        diff = [
            f"{k}: {saved.get(k, defaults[k])!r} -> {getattr(config, k)!r}"
            for k in RESUME_KEYS
            if saved.get(k, defaults[k]) != getattr(config, k)
        ]
        if diff:
            raise CheckpointError(
                f"the checkpoint {path.name} was made with another configuration ({'; '.join(diff)}). "
                "Resume with the same settings, or start a fresh run with --no-resume (the earlier run's "
                "files are kept in previous-N/) or another --out-dir."
            )
    return ckpt


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys (0.0: identical)."""
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def read_metrics(path: str | os.PathLike, torn: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a metrics file, one JSON object per line (none when there is no file). A last line
    cut short (no newline at its end, not JSON: what a crash while appending leaves) is dropped, and
    appended to `torn` when given; any other line that is not a row raises ``CheckpointError`` saying
    what to do, as a damaged checkpoint does."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends with a newline
    rows = []
    for number, line in enumerate([*lines, last] if last else lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a row")
        except ValueError:
            if number == len(lines) + 1:  # the last line, without its newline: cut short by a crash
                if torn is not None:
                    torn.append(line)
                break
            raise CheckpointError(tr(
                f"line {number} of {path.name} in {path.parent} is not a metrics row ({line[:40]!r}): the file "
                "was damaged or edited. Move it away (or delete it) to resume without the earlier rows, or start "
                "a fresh run with --no-resume (the earlier run's files are kept in previous-N/) or another --out-dir.",
                f"{path.parent} 中 {path.name} 的第 {number} "
                f"行不是一行指标（{line[:40]!r}）：文件已损坏或被改动过。"
                "把它移走（或删除），就能在没有之前各行的情况下恢复训练；也可以用 "
                "--no-resume 重新开始"
                "（之前那次运行的文件会保留在 previous-N/ 中），"
                "或者换一个 --out-dir。")) from None
        rows.append(row)
    return rows


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
            f"another run is using {out} right now (process {holder}): two runs in one folder would mix their "
            "checkpoints and metrics. Wait for it to finish (or stop it), or give this run another --out-dir.",
            f"另一次运行正在使用 {out}（进程 {holder}）：两次运行共用一个文件夹，"
            "会把各自的检查点和指标混在一起。"
            "请等它结束（或停止它），或者给这次运行换一个 --out-dir。")) from None
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
