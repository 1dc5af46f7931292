"""Chapter 05 (the full pipeline), checkpoints that survive a crash: written atomically (``atomic_save``), the
random state saved and restored for an exact resume, loaded with a clear error (``CheckpointError``), and
the metrics file read back (``read_metrics``). Used in sections 1, 3, 5 ("Checkpoints that survive a
crash"), 6 and the deep dive on stopping at the scheduler's warning of notebook 05, and by
``scripts/train.py``, through ``course_utils.ch05_full_pipeline``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .ch05_config import RESUME_KEYS, TrainConfig
from .i18n import tr

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
        kept = tr("the previous {name} is unchanged", "原来的 {name} 保持不变", name=path.name) if path.exists() else ""
        raise OSError(cause.errno, tr("could not write {name} in {parent}: {value}",
                                      "无法在 {parent} 中写入 {name}：{value}",
                                      name=path.name, parent=path.parent, value=cause.strerror or cause)
                      + (tr("; {kept}", "；{kept}", kept=kept) if kept else "")) from None
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
            "the checkpoint {name} cannot be read ({name2}) in {parent}: it is truncated (a run that crashed "
            "while saving without atomic_save) or not a checkpoint at all. Move it away (or delete it) to start "
            "again from scratch, or start a fresh run with --no-resume (the earlier run's files are kept in "
            "previous-N/) or another --out-dir. Do not load it with weights_only=False: a file that is not what you "
            "expect can run code when unpickled.",
            "检查点 {name} 无法读取（{name2}），位于 {parent}：它被截断了（某次运行在保存时崩溃，而保存没有用 "
            "atomic_save），或者根本不是检查点。把它移走（或删除）即可从头开始；也可以用 --no-resume "
            "开始一次新的运行（之前运行的文件保留在 previous-N/ 中），或者换一个 --out-dir。不要用 "
            "weights_only=False 加载它：一个不是你所预期的文件，在反序列化（unpickle）时可能会运行代码。",
            name=path.name, name2=type(exc).__name__, parent=path.parent
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
                "line {number} of {name} in {parent} is not a metrics row ({line!r}): the file was damaged or "
                "edited. Move it away (or delete it) to resume without the earlier rows, or start a fresh run with "
                "--no-resume (the earlier run's files are kept in previous-N/) or another --out-dir.",
                "{parent} 中 {name} 的第 {number} 行不是一行指标（{line!r}）：文件已损坏或被改动过。"
                "把它移走（或删除），就能在没有之前各行的情况下恢复训练；也可以用 --no-resume "
                "重新开始（之前那次运行的文件会保留在 previous-N/ 中），或者换一个 --out-dir。",
                number=number, name=path.name, parent=path.parent, line=line[:40])) from None
        rows.append(row)
    return rows
