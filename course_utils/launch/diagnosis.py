"""Why a job failed, and which rank to blame: the structured record behind every ``LaunchError``.

Each failed rank's record comes from torch's error file where the rank wrote one (a script whose
entry point is decorated with ``torch.distributed.elastic.multiprocessing.errors.record`` writes the
exception, its traceback and the time to ``TORCHELASTIC_ERROR_FILE``, which both engines set), else
from the last lines of its stderr. The exit codes come from the engine (``engine.Exits``).

The rank blamed is one that failed by itself, not one that only lost its peer or was stopped by the
launcher; of several that failed alike, the lowest; a rank that said why (wrote an error) before one
that stopped silently, whichever exited first.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..i18n import tr
from .engine import Exits

TAIL_LINES = 12  # lines of a failing rank's error output quoted in the exception
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
# The last words of a rank that only lost its peer, or was stopped by the launcher.
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|"
    r"DistBackendError|Socket Timeout|timed out|SIGTERM|Signal 15",
)
# A last line that says why a rank stopped: an exception, or a script's own "error: ..." line.
_SAYS_WHY = re.compile(r"^(error\b|[A-Za-z_][\w.]*(Error|Exception)\b)", re.IGNORECASE)


@dataclass(frozen=True)
class RankFailure:
    """What one failed rank left: its exit code, the line that says why (``"ValueError: bad"``,
    empty if it said nothing), the last lines of its error output, and where they were read
    (``"error file"``: torch's, ``"stderr"``: its log)."""

    rank: int
    exit_code: int
    error: str
    lines: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Diagnosis:
    """A failed job, worked out: every failed rank's record, the rank blamed (None when the
    launcher failed before any rank said anything), the exit code and error line to report, and
    the message for the learner."""

    failures: dict[int, RankFailure]
    rank: int | None
    exit_code: int | None
    error: str
    message: str


def strip(line: str) -> str:
    """A rank's stderr line without the ``[rankN]:`` that torch adds."""
    return _TORCH_RANK_PREFIX.sub("", line)


def describe_exit(code: int | None) -> str:
    """An exit code in words: ``exit code 3``, ``exit code -9 (SIGKILL: killed, often because ...)``."""
    if code is None:
        return tr("an unknown exit code", "未知的退出码")
    if code >= 0:
        return tr("exit code {code}", "退出码 {code}", code=code)
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    oom = ""
    if code == -signal.SIGKILL:
        oom = tr(": killed, often because the machine ran out of memory",
                 "：被强制终止，通常是因为机器内存不足")
    return tr("exit code {code} ({name}{oom})", "退出码 {code}（{name}{oom}）", code=code, name=name, oom=oom)


def error_tail(lines: Sequence[str], n: int = TAIL_LINES) -> list[str]:
    """The last `n` non-blank lines of a rank's stderr, from its last traceback on."""
    lines = [x for x in map(strip, lines) if x.strip()]
    starts = [i for i, x in enumerate(lines) if x.startswith("Traceback (most recent call last)")]
    return lines[starts[-1] if starts else 0 :][-n:]


def read_error_file(path: Path) -> tuple[str, list[str]] | None:
    """torch's error file (``ErrorHandler.record_exception``): its message (``"ValueError: bad"``)
    and traceback lines; None where there is none, or it cannot be read."""
    try:
        message = json.loads(Path(path).read_text())["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(message, str):  # the format of a signal-only failure
        return message, []
    info = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    return str(message.get("message", "")), str(info.get("py_callstack", "")).splitlines()


def last_words(exits: Exits, stderr: Sequence[str]) -> dict[int, tuple[str, list[str], str]]:
    """Every rank's (error line, last lines, source): its error file's, else its stderr's."""
    words = {}
    for rank, text in enumerate(stderr):
        recorded = read_error_file(exits.error_files[rank]) if rank in exits.error_files else None
        if recorded is not None and recorded[0]:
            message, callstack = recorded
            lines = error_tail(callstack) or [message]
            words[rank] = (message, lines, "error file")
        else:
            tail = error_tail(text.splitlines())
            words[rank] = ((tail or [""])[-1], tail, "stderr")
    return words


def blame(exits: Exits, said: dict[int, str]) -> int | None:
    """The rank to name (see the module's docstring); `said`: each rank's last error line. Every rank
    stopping because rank 0 refused something is the usual case: rank 0 says why and may even be
    stopped (SIGTERM) by the launcher after saying it, once a silent peer has exited."""
    codes, first = exits.codes, exits.first

    def last(r: int) -> str:
        return said.get(r, "")

    if not codes:
        return None
    genuine = [r for r in sorted(codes) if codes[r] != -signal.SIGTERM]
    genuine = [r for r in genuine if not _COLLATERAL.search(last(r))]
    said_why = [r for r in genuine if _SAYS_WHY.match(last(r))]
    if genuine and not any(map(last, genuine)):  # all silent: one stopped after saying why?
        stopped = [r for r in sorted(codes) if r not in genuine and _SAYS_WHY.match(last(r))]
        stopped = [r for r in stopped if not _COLLATERAL.search(last(r))]
        if stopped:
            return stopped[0]
    genuine = said_why or [r for r in genuine if last(r)] or genuine
    if not genuine:
        return first if first is not None else min(codes)
    if len({last(r) for r in genuine}) == 1 or first not in genuine:
        return genuine[0]
    return first


def diagnose(
    exits: Exits, rc: int, script: str, nproc: int, stderr: Sequence[str], log_dir: str,
    launcher_output: str = "",
) -> Diagnosis:
    """The diagnosis of a job that ended with exit code `rc` (`stderr`: each rank's)."""
    words = last_words(exits, stderr)
    failures = {}
    for r, c in sorted(exits.codes.items()):
        error, lines, source = words.get(r, ("", [], "stderr"))
        failures[r] = RankFailure(r, c, error, tuple(lines), source)
    said = {r: w[0] for r, w in words.items()}
    rank = blame(exits, said)
    if rank is None and not exits.codes:  # no exit codes at all: the lowest rank with a traceback
        rank = min((r for r, e in enumerate(stderr) if "Traceback" in e), default=None)
    if rank is None:
        tail = [x for x in launcher_output.splitlines() if x.strip()][-TAIL_LINES:]
        return Diagnosis(failures, None, rc, "", _launcher_message(rc, script, tail, log_dir))
    code, (error, tail, _) = exits.codes.get(rank), words.get(rank, ("", [], ""))
    first = next((r for r in sorted(exits.codes) if exits.codes[r] not in (0, -signal.SIGTERM)), None)
    stopped_after = code == -signal.SIGTERM and first is not None  # it said why, then was stopped
    if stopped_after:
        code = exits.codes[first]  # the job's own exit code: the one that ended it
    message = _rank_message(rank, nproc, script, code, first if stopped_after else None, tail, log_dir)
    return Diagnosis(failures, rank, code, error, message)


def _quoted(tail: Sequence[str]) -> str:
    nothing = tr("    (it wrote nothing to stderr)", "    （它没有向 stderr 写入任何内容）")
    return "\n".join("    " + x for x in tail) if tail else nothing


def _launcher_message(rc: int, script: str, tail: Sequence[str], where: str) -> str:
    exit_ = describe_exit(rc)
    head = tr("the launcher failed ({exit_}) running {script} before any rank reported an error. Its last lines:",
              "启动器运行 {script} 时失败（{exit_}），当时还没有任何 rank 报告错误。它输出的最后几行：",
              exit_=exit_, script=script)
    logs = tr("Logs: {where}", "日志：{where}", where=where)
    return f"{head}\n{_quoted(tail)}\n{logs}"


def _rank_message(
    rank: int, nproc: int, script: str, code: int | None, first: int | None, tail: Sequence[str],
    where: str,
) -> str:
    exit_ = describe_exit(code)
    if first is None:
        head = tr("rank {rank} of {nproc} failed with {exit_} running {script}\nLast lines of its error output:",
                  "rank {rank}（共 {nproc} 个 rank）运行 {script} 时失败，{exit_}\n其错误输出的最后几行：",
                  rank=rank, nproc=nproc, exit_=exit_, script=script)
    else:
        head = tr("rank {rank} of {nproc} failed running {script} (rank {first} exited first, with {exit_}; rank "
                  "{rank} was stopped as it ended)\nLast lines of its error output:",
                  "rank {rank}（共 {nproc} 个 rank）运行 {script} 时失败（rank {first} 先退出，{exit_}；rank {rank} "
                  "在结束时被停止）\n其错误输出的最后几行：",
                  rank=rank, nproc=nproc, script=script, first=first, exit_=exit_)
    log = Path(where, f"rank{rank}.stderr.log")
    foot = tr("Its full log: {log} (every rank's logs are in {where})",
              "它的完整日志：{log}（所有 rank 的日志都在 {where} 中）", log=log, where=where)
    return f"{head}\n{_quoted(tail)}\n{foot}"
