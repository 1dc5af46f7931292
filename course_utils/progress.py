"""Your progress through the exercises, kept on this computer only.

    python -m course_utils progress             # the table: done / tried / not yet, per chapter
    python -m course_utils progress --enable    # record every check() from now on
    python -m course_utils progress --disable   # stop recording (what is recorded stays)
    python -m course_utils progress --reset --yes

When recording is on, every ``q1.check(answer)`` appends one line (time, chapter, exercise, status) to
``~/.pytorch-in-depth/progress.jsonl`` (``COURSE_PROGRESS_FILE`` names another file). Nothing is sent
anywhere. Recording is on when ``COURSE_PROGRESS=1`` (``make lab`` sets it), or when ``--enable`` left
its flag file beside the progress file; ``COURSE_PROGRESS=0`` always turns it off (the tests set it).
A check never fails because its result could not be saved: it warns once and goes on.

Only the standard library: the exercise engine imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import inventory
from .i18n import table, tr

ENV_SWITCH = "COURSE_PROGRESS"  # 1: record, 0: never record (wins over the flag file)
ENV_FILE = "COURSE_PROGRESS_FILE"  # another progress file (tests point it at a temporary folder)
STATUSES = ("correct", "incorrect", "not_attempted")
_ON, _OFF = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}

try:
    import fcntl
except ImportError:  # Windows: appends of one line in one write, without a lock
    fcntl = None  # type: ignore[assignment]

_warned = False


def progress_file() -> Path:
    """Where the records are: $COURSE_PROGRESS_FILE, else ``~/.pytorch-in-depth/progress.jsonl``."""
    override = os.environ.get(ENV_FILE, "").strip()
    if override:
        return Path(override).expanduser()
    return Path.home() / ".pytorch-in-depth" / "progress.jsonl"


def flag_file() -> Path:
    """The setting that ``--enable`` writes and ``--disable`` removes, beside the progress file (in it,
    if $COURSE_PROGRESS_FILE names a folder such as ``.`` or ``/``: never an error)."""
    path = progress_file()
    return path.with_suffix(".enabled") if path.name else path / "progress.enabled"


def recording() -> tuple[bool, str]:
    """Whether checks are recorded now, and why (in words)."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in _OFF:
        return False, tr("off ({ENV_SWITCH}={value} in the environment)", "已关闭（环境变量 {ENV_SWITCH}={value}）",
                         ENV_SWITCH=ENV_SWITCH, value=value)
    if value in _ON:
        return True, tr("on ({ENV_SWITCH}={value} in the environment)", "已开启（环境变量 {ENV_SWITCH}={value}）",
                        ENV_SWITCH=ENV_SWITCH, value=value)
    try:
        flagged = flag_file().is_file()
    except OSError:
        flagged = False
    if flagged:
        return True, tr("on (turned on with `python -m course_utils progress --enable`)",
                        "已开启（由 `python -m course_utils progress --enable` 打开）")
    return False, tr("off (turn it on with `python -m course_utils progress --enable`)",
                     "已关闭（用 `python -m course_utils progress --enable` 打开）")


@contextlib.contextmanager
def _locked(fd: int, exclusive: bool) -> Iterator[None]:
    """An advisory lock on the whole file, for as long as the block runs; none where there is no
    fcntl (Windows) or the file system refuses locks (some network drives)."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            locked = True
        else:
            locked = False
    except OSError:
        locked = False
    try:
        yield
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _byte_at(fd: int, offset: int) -> bytes:
    if hasattr(os, "pread"):
        return os.pread(fd, 1, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # (appends still go to the end)
    return os.read(fd, 1)


def append(path: Path, record: dict) -> None:
    """Append `record` as one JSON line, under an exclusive lock: writers in several kernels at once
    never interleave. A line cut short earlier (a full disk) is ended first, so it stays one bad line;
    a write that fails is undone, so it leaves none."""
    data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with _locked(fd, exclusive=True):
            size = os.fstat(fd).st_size
            if size and _byte_at(fd, size - 1) != b"\n":
                data = b"\n" + data
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
    finally:
        os.close(fd)


def record(chapter: str, exercise: str, status: str) -> bool:
    """Save one check's result if recording is on. Never raises: a failure warns once per process.
    Returns whether a line was written."""
    global _warned
    path = None
    try:
        if not recording()[0]:
            return False
        path = progress_file()
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        append(path, {"time": now, "chapter": chapter, "exercise": exercise, "status": status})
        return True
    except Exception as exc:  # a read-only home, a full disk...: the check itself must go on
        if not _warned:
            _warned = True
            with contextlib.suppress(Exception):
                where = path or tr("its file", "进度文件")
                sys.stderr.write(tr(
                    "Your progress could not be saved to {where} ({name}: {exc}); checks work as before. To stop "
                    "trying, set {ENV_SWITCH}=0 or run `python -m course_utils progress --disable`.\n",
                    "无法把你的进度保存到 {where}（{name}: {exc}）；检查功能照常可用。如果不想再尝试保存，请设置 "
                    "{ENV_SWITCH}=0，或运行 `python -m course_utils progress --disable`。\n",
                    where=where, name=type(exc).__name__, exc=exc, ENV_SWITCH=ENV_SWITCH,
                ))
        return False


def read(path: Path | None = None) -> tuple[list[dict], int]:
    """The records of the progress file (none if it does not exist) and how many lines were skipped
    as unreadable."""
    path = progress_file() if path is None else path
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        return [], 0
    try:
        with _locked(fd, exclusive=False), os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    finally:
        os.close(fd)
    return parse(raw)


def parse(raw: bytes) -> tuple[list[dict], int]:
    """The records in the bytes of a progress file, and how many of its lines were unreadable."""
    records, bad = [], 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            ok = isinstance(rec, dict) and rec.get("status") in STATUSES
            ok = ok and all(isinstance(rec.get(k), str) and rec[k] for k in ("chapter", "exercise"))
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond reason
            ok = False
        if ok:
            records.append(rec)
        else:
            bad += 1
    return records, bad


def reset(path: Path | None = None) -> int:
    """Empty the progress file (under the lock, so that a kernel appending now loses nothing after);
    returns how many lines it held."""
    path = progress_file() if path is None else path
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        with _locked(fd, exclusive=True):
            with os.fdopen(os.dup(fd), "rb") as f:
                lines = sum(1 for line in f if line.strip())
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    return lines


def chapters(import_modules: bool = True) -> dict[str, list[str]]:
    """Every chapter's exercises in order (the chapters: ``inventory.CHAPTERS``), ``{"ch01": ["Q1",
    ...]}``, from the exercise modules (their ``EXERCISES``; importing them imports torch). A module
    that does not import, or every module when `import_modules` is False (a program without torch:
    the instructor's view), is read from its words file instead, which names the same exercises."""
    found = {}
    for chapter in inventory.CHAPTERS:
        try:
            if not import_modules:
                raise ImportError("read from the words file")
            exercises = importlib.import_module(chapter.exercise_module).EXERCISES
            found[chapter.key] = [ex.name for ex in exercises]
        except Exception:
            words = inventory.ROOT / "course_utils" / "exercises" / f"{chapter.key}.en.toml"
            with contextlib.suppress(OSError, ValueError):
                found[chapter.key] = list(tomllib.loads(words.read_text(encoding="utf-8")))
    return found


def chapter_titles() -> dict[str, str]:
    """``{"ch01": "01_autograd", ...}``: each chapter named after its notebook."""
    return {chapter.key: chapter.stem for chapter in inventory.CHAPTERS}


@dataclass
class Summary:
    """Per chapter, each exercise's state: "done" (correct at least once), "tried" (checked, never
    correct) or "not yet" (never checked, or only with the placeholder or a stub: "not attempted")."""

    states: dict[str, dict[str, str]] = field(default_factory=dict)

    def count(self, state: str) -> int:
        return sum(s == state for row in self.states.values() for s in row.values())

    @property
    def total(self) -> int:
        return sum(len(row) for row in self.states.values())


def summarise(records: Iterable[dict], known: dict[str, list[str]]) -> Summary:
    """The state of every exercise of `known`, plus any exercise the records name that `known` lacks
    (a renamed one), after it."""
    states = {ch: dict.fromkeys(names, "not yet") for ch, names in known.items()}
    for rec in records:
        row = states.setdefault(rec["chapter"], {})
        before = row.setdefault(rec["exercise"], "not yet")
        if rec["status"] == "correct":
            row[rec["exercise"]] = "done"
        elif rec["status"] == "incorrect" and before == "not yet":
            row[rec["exercise"]] = "tried"
    return Summary(dict(sorted(states.items())))


def format_table(summary: Summary, titles: dict[str, str] | None = None) -> str:
    """Chapters down, exercises across (in the order they first appear), a done count per chapter."""
    titles = titles or {}
    shown = {"done": tr("done", "已完成"), "tried": tr("tried", "已尝试"),
             "not yet": tr("not yet", "尚未作答")}
    columns: list[str] = []
    for row in summary.states.values():
        columns += [name for name in row if name not in columns]
    header = [tr("chapter", "章节"), *columns, tr("done", "已完成")]
    rows = [header]
    for ch, row in summary.states.items():
        done = sum(s == "done" for s in row.values())
        cells = (shown[row[c]] if c in row else "" for c in columns)
        rows.append([titles.get(ch, ch), *cells, f"{done}/{len(row)}"])
    return "\n".join(table(rows))


def _show_path(path: Path) -> str:
    with contextlib.suppress(ValueError, RuntimeError):
        return str(Path("~") / path.relative_to(Path.home()))
    return str(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils progress",
        description="Your progress through the exercises, kept on this computer only.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--enable", action="store_true", help="record every check() from now on")
    action.add_argument("--disable", action="store_true", help="stop recording (keeps what is recorded)")
    action.add_argument("--reset", action="store_true", help="clear what is recorded (with --yes)")
    parser.add_argument("--yes", action="store_true", help="confirm --reset")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    o = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if o.yes and not o.reset:
        parser.error("--yes confirms --reset; use them together")
    path, flag = progress_file(), flag_file()
    if not path.name or path.is_dir():
        print(tr("error: {ENV_FILE}={get} names a folder, not a file: name a file for your progress (such as "
                 "~/progress.jsonl), or unset {ENV_FILE} to use the usual one.",
                 "错误：{ENV_FILE}={get} 指向的是一个文件夹，而不是文件：请指定一个保存进度的文件（例如 "
                 "~/progress.jsonl），或者取消设置 {ENV_FILE}，使用默认文件。",
                 ENV_FILE=ENV_FILE, get=os.environ.get(ENV_FILE, '').strip()),
              file=sys.stderr)
        return 2
    if o.enable or o.disable or o.reset:
        return _change(o, path, flag)
    return _report(path)


def _change(o: argparse.Namespace, path: Path, flag: Path) -> int:
    """--enable, --disable or --reset (--yes): what it changed, said; the command's exit status."""
    try:
        if o.enable:
            flag.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flag.write_text("Checks are recorded in the progress file beside this one.\n")
        elif o.disable:
            flag.unlink(missing_ok=True)
        elif o.reset:
            if not o.yes:
                print(tr("This clears your recorded progress in {show_path}. To do it, run:\n",
                         "这会清除 {show_path} 中记录的进度。确定要清除，请运行：\n", show_path=_show_path(path))
                      + "  python -m course_utils progress --reset --yes")
                return 1
            n = reset(path)
            print(tr("Progress cleared ({n} lines removed from {show_path}).",
                     "进度已清除（从 {show_path} 删除了 {n} 行）。", n=n, show_path=_show_path(path)))
            return 0
    except OSError as exc:
        print(tr("error: {exc}. Check that you can write to {show_path}.",
                 "错误：{exc}。请检查你能否写入 {show_path}。",
                 exc=exc, show_path=_show_path(path.parent)), file=sys.stderr)
        return 1
    print(tr("Recording is now {state}.", "进度记录现在{state}。", state=recording()[1]))
    print(tr("Records stay on this computer, in {show_path}.", "记录只保存在这台电脑上：{show_path}。",
             show_path=_show_path(path)))
    return 0


def _report(path: Path) -> int:
    """The table of the progress recorded in `path`, its totals and where it is kept."""
    try:
        records, bad = read(path)
    except OSError as exc:
        print(tr("error: cannot read {show_path} ({exc}).", "错误：无法读取 {show_path}（{exc}）。",
                 show_path=_show_path(path), exc=exc), file=sys.stderr)
        return 1
    summary = summarise(records, chapters())
    print(format_table(summary, chapter_titles()))
    done, tried, not_yet = (summary.count(state) for state in ("done", "tried", "not yet"))
    print(tr("\ntotal: {done} done, {tried} tried, {not_yet} not yet, of {total} exercises",
             "\n合计：共 {total} 道练习，已完成 {done} 道，已尝试 {tried} 道，尚未作答 {not_yet} 道",
             done=done, tried=tried, not_yet=not_yet, total=summary.total))
    if bad == 1:
        skipped = tr(" ({bad} unreadable line skipped)", "（跳过了 {bad} 行无法读取的记录）", bad=bad)
    else:
        skipped = tr(" ({bad} unreadable lines skipped)", "（跳过了 {bad} 行无法读取的记录）", bad=bad) if bad else ""
    print(tr("{n} checks recorded in {where}{skipped}; this computer only.",
             "{where} 中记录了 {n} 次检查{skipped}；只保存在这台电脑上。",
             n=len(records), where=_show_path(path), skipped=skipped))
    print(tr("Recording is {state}.", "进度记录{state}。", state=recording()[1]))
    return 0

if __name__ == "__main__":
    sys.exit(main())
