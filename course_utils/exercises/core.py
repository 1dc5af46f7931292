"""Learntools-style exercises (``q1.check(answer)``, ``q1.hint()``, ``q1.solution()``): see Exercise."""

import contextlib
import ctypes
import functools
import html
import inspect
import itertools
import math
import os
import random
import signal
import sys
import sysconfig
import textwrap
import threading
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import progress
from ..i18n import is_chinese, language, spaced, tr

TIME_LIMIT_S = 5.0  # the longest a check may take, learner's code included
MAX_STRETCH = 3.0  # a limit grows by the time spent waiting for a CPU, up to this factor
MAX_ITEMS = 1000  # the most items a check takes from an iterable answer
_STUB = ("your code still raises NotImplementedError: fill in its body.",
         "你的代码仍然抛出 NotImplementedError：请补全函数体。")
_PLACEHOLDER = ("replace the `...` placeholder with your answer, then run this cell again.",
                "请把占位符 `...` 换成你的答案，然后重新运行这个单元格。")


class Incorrect(Exception):
    """The answer is wrong, and the message says why."""


class NotAttempted(Exception):
    """There is nothing to check yet."""


class TimeUp(BaseException):  # not an Exception: a learner's `except Exception` cannot swallow it
    """The learner's code ran past the check's time limit."""


_STYLE = {
    "correct": ("Correct", "#1b7f3a", "#e8f5ec"),
    "incorrect": ("Incorrect", "#b3261e", "#fdecea"),
    "not_attempted": ("Not attempted yet", "#6b5900", "#fff8e1"),
}
_LABEL_ZH = {"correct": "正确", "incorrect": "不正确", "not_attempted": "尚未作答"}
_TITLE_ZH = {"Practice": "练习"}  # an exercise's name as the Chinese edition shows it (Q1... stay)


def _label(status: str) -> str:
    return tr(_STYLE[status][0], _LABEL_ZH[status])


def _title(name: str) -> str:
    """An exercise's name as shown: ``Q1``, or chapter 00's ``Practice`` (练习 in Chinese)."""
    return tr(name, _TITLE_ZH.get(name, name))


@dataclass(frozen=True)
class CheckResult:
    """What a check found. Prints as plain text, shows as a coloured box in Jupyter."""

    exercise: str
    status: str  # "correct" | "incorrect" | "not_attempted"
    message: str

    def __bool__(self) -> bool:
        return self.status == "correct"

    correct = property(__bool__)

    def __repr__(self) -> str:
        return f"[{_title(self.exercise)}] {_label(self.status)}{tr(': ', '：')}{self.message}"

    def _repr_html_(self) -> str:
        _, fg, bg = _STYLE[self.status]
        label = _label(self.status)
        msg = html.escape(self.message).replace("\n", "<br>")
        return (
            f'<div style="border-left:4px solid {fg};background:{bg};padding:6px 10px">'
            f'<b style="color:{fg}">{html.escape(_title(self.exercise))} · {label}</b>{tr(": ", "：")}{msg}</div>'
        )


@dataclass(frozen=True)
class _Text:
    """A hint or a solution: plain text in a terminal, formatted in Jupyter."""

    title: str
    body: str
    code: bool = False

    def __repr__(self) -> str:
        return f"{self.title}\n{self.body}"

    def _repr_html_(self) -> str:
        body = html.escape(self.body)
        inner = f"<pre>{body}</pre>" if self.code else f"<div>{body}</div>"
        return f'<div style="border-left:4px solid #3465a4;padding:6px 10px"><b>{html.escape(self.title)}</b>{inner}</div>'


def _set_default_device(device: torch.device) -> None:
    torch.set_default_device(None if device.type == "cpu" else device)


def _chdir(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):  # (the folder was deleted meanwhile: nowhere to go back to)
            os.chdir(path)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Run with grad mode on, no inference mode, float32 tensors on the CPU by default, as a fresh kernel;
    then restore what the block may have changed, the learner's settings before it included: the torch
    (CUDA, MPS), numpy and ``random`` generators, grad mode, the default dtype and device, the thread
    count, anomaly detection, deterministic algorithms, the working directory and ``sys.stdout``/``stderr``."""
    state = [(torch.get_rng_state, torch.set_rng_state), (np.random.get_state, np.random.set_state)]
    state += [(random.getstate, random.setstate), (torch.is_grad_enabled, torch.set_grad_enabled)]
    state += [(torch.get_default_dtype, torch.set_default_dtype)]
    state += [(torch.get_default_device, _set_default_device)]
    state += [(torch.get_num_threads, torch.set_num_threads)]
    state += [(torch.is_anomaly_enabled, torch.set_anomaly_enabled)]
    state += [(torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms)]
    state += [(_cwd, _chdir)]
    state += [(lambda: (sys.stdout, sys.stderr), lambda streams: setattr(sys, "stdout", streams[0])
               or setattr(sys, "stderr", streams[1]))]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state.append((torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all))
    if torch.backends.mps.is_available():
        state.append((torch.mps.get_rng_state, torch.mps.set_rng_state))
    saved = [(restore, get()) for get, restore in state]
    try:
        torch.set_default_dtype(torch.float32)
        torch.set_default_device(None)  # a set_default_device("meta") of an earlier cell: not in the check
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for restore, value in saved:
            restore(value)


_LIBRARIES = (str(Path(__file__).resolve().parents[1]), "<frozen")  # the course's package too
_LIBRARIES += tuple(map(sysconfig.get_paths().get, ("stdlib", "platstdlib", "purelib", "platlib")))


def learners_code(frame: Any) -> bool:
    """Whether `frame` runs the learner's code, not a library's (whose cleanup must run, time or not)."""
    return not frame.f_code.co_filename.startswith(_LIBRARIES)


def _cpu_wait(tid: int | None = None) -> float:
    """Seconds a thread of this process has waited for a CPU (Linux's schedstat; 0.0 elsewhere)."""
    path = "/proc/thread-self/schedstat" if tid is None else f"/proc/self/task/{tid}/schedstat"
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class _Stopped(SystemExit):
    """Raised by LearnerThread.stop(), created where caught: a swallowing ``except`` then gets TimeUp."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        if learners_code(frame := sys._getframe(1)):
            _stop_every_line(frame, until=None)


class LearnerThread(threading.Thread):
    """``fn()`` on a daemon thread, ``outcome`` ``(True, result)`` or ``(False, exception)`` once ``done``
    is set. Wait with ``done``: on Python 3.11 an interrupted join() marks a running thread as ended."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.done = fn, threading.Event()

    def run(self) -> None:
        try:
            self.outcome = True, self.fn()
        except BaseException as exc:  # handed to whoever waits for this thread
            self.outcome = False, exc
        finally:
            # off before any call: 3.11 spins in traced calls while an exception is pending elsewhere
            sys.settrace(None)
            self.done.set()

    def stop(self) -> None:
        """Raise _Stopped in the thread at its next Python instruction (once a C call returns, such as a
        sleep), so that it does not keep a CPU and the GIL."""
        if self.ident is not None and not self.done.is_set():
            _raise_in(self.ident, _Stopped)
            # 3.11 keeps eval breakers on until one is handled (traced calls spin): handle one now
            with contextlib.suppress(_Stopped):
                _raise_in(threading.get_ident(), _Stopped)


def _raise_in(thread_id: int, exc: type) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


def _stop_every_line(frame: Any, until: Any) -> None:
    """The next line of the learner's code in `frame`, its callers below `until` or what they call raises
    TimeUp again, out of an ``except`` that swallowed one (once: two nested such ``try`` are not stopped)."""

    def trace(f: Any, event: str, arg: Any) -> Any:
        if not learners_code(f):
            return None
        if event == "line":
            raise TimeUp()
        return trace

    sys.settrace(trace)
    while frame is not None and frame is not until:
        if learners_code(frame):
            frame.f_trace = trace
        frame = frame.f_back


def _bounded(fn: Callable[[], Any], seconds: float) -> tuple[Any, float]:
    """``(fn(), seconds charged)``, or TimeUp after `seconds` not counting waits for a CPU (up to MAX_STRETCH
    times): a SIGALRM timer on the main thread (an outer timer goes on after), else a LearnerThread."""
    start = time.monotonic()

    def charged(waited: float) -> float:
        elapsed = time.monotonic() - start
        return elapsed if elapsed >= MAX_STRETCH * seconds else max(elapsed - waited, 0.0)

    if threading.current_thread() != threading.main_thread() or not hasattr(signal, "setitimer"):
        t = LearnerThread(fn)
        t.start()
        while not t.done.wait(min(0.05, seconds)) and charged(_cpu_wait(t.native_id)) < seconds:
            pass
        used = charged(_cpu_wait(t.native_id))
        if not t.done.is_set():
            t.stop()
            raise TimeUp()
        ok, value = t.outcome
        if not ok:
            raise value
        return value, used

    wait0, expired = _cpu_wait(), []

    def time_up(signum: int, frame: Any) -> None:
        left = seconds - charged(_cpu_wait() - wait0)
        if left > 0.001 and not expired:  # the code waited for a CPU: give that time back
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        expired.append(True)
        if learners_code(frame):  # an `except:` that swallows this TimeUp gets another
            _stop_every_line(frame, until=here)
        raise TimeUp()

    here, old_trace = sys._getframe(), sys.gettrace()
    old = signal.signal(signal.SIGALRM, time_up)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        result = fn()
        if expired:  # the code caught TimeUp and finished late
            raise TimeUp()
        return result, charged(_cpu_wait() - wait0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.settrace(old_trace)
        signal.signal(signal.SIGALRM, old)
        if outer:  # someone else's timer was running: let it go on
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))


# Python's own types as the Chinese edition names them ("一个列表"); any other type keeps its name ("一个 Path")
_KIND_ZH = {
    "list": "列表", "tuple": "元组", "dict": "字典", "set": "集合", "str": "字符串", "bytes": "bytes 对象",
    "int": "整数", "float": "浮点数", "bool": "布尔值", "complex": "复数", "ndarray": "numpy 数组",
    "generator": "生成器", "range": "range 对象",
}


def kind(x: Any) -> str:
    """How an answer reads to a learner: "a tensor of shape (3,)", "a function", "a list"... (in Chinese
    形状为 (3,) 的张量, 一个函数, 一个列表...: join it to Chinese words with :func:`spaced`)."""
    if isinstance(x, torch.Tensor):
        return tr(f"a tensor of shape {tuple(x.shape)}", f"形状为 {tuple(x.shape)} 的张量")
    if isinstance(x, type):
        return tr(f"the class {x.__name__}", f"类 {x.__name__}")
    if inspect.isroutine(x):
        return tr("a function", "一个函数")
    name = type(x).__name__
    if x is None:
        return tr(f"a {name}", "None")
    english = f"an {name}" if name[:1] in "aeiouAEIOU" or name == "ndarray" else f"a {name}"
    return tr(english, spaced("一个", _KIND_ZH.get(name, name)))


def _your_answer(what: str | None) -> str:
    return tr("your answer", "你的答案") if what is None else what


def as_number(x: Any, what: str | None = None, whole: bool = False) -> float | int:
    """A Python number from an int, a float, a numpy number or a one-element tensor."""
    what = _your_answer(what)
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_complex():
        x = x.item()
    elif isinstance(x, np.generic) and np.ndim(x) == 0:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, int | float):
        adjective = "whole " if whole else ""
        raise Incorrect(tr(f"{what} should be a {adjective}number, but it is {kind(x)}.",
                           spaced(what, "应该是一个整数" if whole else "应该是一个数", "，但它是", kind(x), "。")))
    if whole and isinstance(x, float) and not x.is_integer():
        raise Incorrect(tr(f"{what} should be a whole number, but it is {x!r}.",
                           spaced(what, "应该是一个整数，但它是", repr(x), "。")))
    return int(x) if whole else float(x)


def as_ints(x: Any, what: str | None = None) -> list[int]:
    """Whole numbers from a finite iterable (list, tuple, range, 1-D tensor or array, generator); at most
    ``MAX_ITEMS + 1`` are taken, so an endless iterator ends up as too long a list."""
    what = _your_answer(what)
    listlike = isinstance(x, Iterator | Sequence) and not isinstance(x, str | bytes)
    if not (x.ndim == 1 if isinstance(x, torch.Tensor | np.ndarray) else listlike):
        raise Incorrect(tr(f"{what} should be a list of whole numbers, but it is {kind(x)}.",
                           spaced(what, "应该是一个由整数组成的列表，但它是", kind(x), "。")))
    each = tr(f"each entry of {what}", spaced(what, "的每一项"))
    return [as_number(i, each, whole=True) for i in take(x)]


def take(x: Any, n: int = MAX_ITEMS + 1) -> list[Any]:
    """At most `n` items of an iterable (never iterating a whole huge tensor, or an endless iterator)."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return list(x[:n]) if x.ndim else [x]
    try:
        return list(itertools.islice(iter(x), n))
    except TypeError:
        raise Incorrect(tr(f"this should be a list, but it is {kind(x)}.",
                           spaced("这里应该是一个列表，但它是", kind(x), "。"))) from None


_TO_TENSOR = {
    "ndarray": (" `torch.from_numpy(a)` turns a numpy array into one.", "`torch.from_numpy(a)` 可以把 numpy 数组变成张量。"),
    "list": (" `torch.tensor(...)` turns a list into one.", "`torch.tensor(...)` 可以把列表变成张量。"),
}


def as_tensor(x: Any, what: str | None = None) -> torch.Tensor:
    """The answer itself, detached, if it is a tensor; a clear Incorrect if it is not."""
    what = _your_answer(what)
    if not isinstance(x, torch.Tensor):
        tip = tr(*_TO_TENSOR.get(type(x).__name__, ("", "")))
        raise Incorrect(tr(f"{what} should be a torch.Tensor, but it is {kind(x)}.{tip}",
                           spaced(what, "应该是一个 torch.Tensor，但它是", kind(x), "。") + tip))
    return x.detach()


def _copy(x):
    """A copy of a learner's value to work on, so that a check never modifies the learner's object."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if x.numel() <= 10**6 else x.detach()
    if isinstance(x, list | tuple):
        return type(x)(_copy(i) for i in x) if len(x) <= MAX_ITEMS else x
    return x


def variant(solution: Callable[..., Any] | type, *edits: str) -> Any:
    """The solution with a slip: its source with each ``old, new`` pair of `edits` replaced (each `old`
    must occur), run in its module: ``variant(f, "a + b", "a - b")``."""
    src = textwrap.dedent(inspect.getsource(solution))
    for old, new in zip(edits[::2], edits[1::2], strict=True):
        if old not in src:
            raise ValueError(f"variant of {solution.__name__}: {old!r} is not in its source")
        src = src.replace(old, new, 1)
    namespace = dict(inspect.getmodule(solution).__dict__)
    exec(compile(src, f"<{solution.__name__}, with a mistake>", "exec"), namespace)
    return namespace[solution.__name__]


def _same(a, b, rtol, atol):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.numel() > 10**6:
            return False
        a, b = a.detach().cpu().double(), b.detach().cpu().double()
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rtol, atol) for k in a)
    try:
        if isinstance(a, BaseException):  # an error the code raised: the same type and text
            return type(a) is type(b) and str(a) == str(b)
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _show(x, other=None):
    """A short text for a value; numbers get enough digits to differ from `other`."""
    if isinstance(x, float):
        whole = other is None or isinstance(other, int | float) and float(other).is_integer()
        if x.is_integer() and abs(x) < 1e15 and whole:
            return str(int(x))  # 14, not 14.0000
        short = f"{x:.4f}"
        same = isinstance(other, int | float) and f"{float(other):.4f}" == short
        return repr(x) if same else short
    if isinstance(x, torch.Tensor):
        return kind(x) if x.numel() > 20 else repr(x.tolist())
    if isinstance(x, str) and any(map(is_chinese, x)):  # a fact's Chinese value: in Chinese quotes
        return f"“{x}”"
    text = _text(x, repr)
    return text if len(text) <= 160 else text[:150] + " ...]"


def _tensor_diff(got, want):
    """How tensor `got` differs from `want`, said after its name (``x.grad has shape ...``; Chinese: the
    name, then ``的形状是 ...`` or ``在索引 ... 处是 ...``, to join with :func:`spaced`)."""
    if got.shape != want.shape:
        return tr(f"has shape {tuple(got.shape)}, but it should have shape {tuple(want.shape)}",
                  f"的形状是 {tuple(got.shape)}，但应该是 {tuple(want.shape)}")
    diff = torch.nan_to_num((got.double() - want.double()).abs(), nan=float("inf"))
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.ndim else ()
    g, w, at = _show(got[idx].item(), want[idx].item()), _show(want[idx].item(), got[idx].item()), ""
    if idx:
        at = tr(f" at index {idx}", f"在索引 {idx} 处")
    return tr(f"holds {g}{at} where {w} was expected", f"{at}是 {g}，而预期是 {w}")


def _outcome(observe, answer, case, want=None, tol=(0, 0)):
    """The facts `observe` finds of `answer` on `case`, in order: yielded ``(name, value)`` facts are kept up
    to an exception (a fact too) or to the first that differs from `want` (which ends the observer)."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    facts: dict[str, Any] = {}
    try:
        seen = observe(answer, case)
        if inspect.isgenerator(seen):
            for key, value in seen:
                facts[key] = value
                if want is not None and (key not in want or not _same(value, want[key], *tol)):
                    seen.close()
                    break
            return facts
    except Incorrect as exc:
        facts["incorrect"] = str(exc)
        return facts
    except NotImplementedError as exc:
        if _is_stub(exc):
            raise NotAttempted(tr(*_STUB)) from None
        facts["error"] = exc  # torch's own (a misspelled forward, a Function without backward): a real error
        return facts
    except (Exception, SystemExit) as exc:
        facts["error"] = exc
        return facts
    return seen if isinstance(seen, dict) else {"result": seen}


def _is_stub(exc: NotImplementedError) -> bool:
    """Whether `exc` is the learner's own unfinished body: raised by a ``raise`` statement in the learner's
    code, not by a library (torch raises NotImplementedError for a misspelled ``forward``, a Function
    without ``backward``, an operation a device lacks)."""
    frames = traceback.extract_tb(exc.__traceback__)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not learners_code(tb.tb_frame):
        return False
    line = (frames[-1].line or "").strip() if frames else ""
    return line.startswith("raise") if line else not exc.args


def _text(x: Any, how: Callable[[Any], str] = str) -> str:
    """``str(x)`` (or `how`), or a stand-in when the learner's object cannot give one (its method raises)."""
    try:
        return how(x)
    except Exception:
        return tr(f"<{type(x).__name__} that cannot be shown>", f"<无法显示的 {type(x).__name__}>")


def _first_diff(got, want, rtol, atol):
    """The first fact where `got` differs from `want` (an error or a form problem where it stopped)."""
    extra = [k for k in got if k not in want]  # "error" or "incorrect", where observing stopped
    for key, w in want.items():
        if key not in got or not _same(got[key], w, rtol, atol):
            return extra[0] if extra and key not in got else key
    return extra[0] if extra else None


def _explain_exception(exc):
    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):  # the learner's own frame
        path = fr.filename.replace("\\", "/")
        if "/course_utils/" not in path and "/torch/" not in path:
            where = tr(f" (line {fr.lineno}: `{(fr.line or '').strip()}`)", f"（第 {fr.lineno} 行：`{(fr.line or '').strip()}`）")
            break
    said = _text(exc)
    return tr(f"your code raised {type(exc).__name__}: {said}{where}. Fix that error first, then check again.",
              f"你的代码抛出了 {type(exc).__name__}: {said}{where}。请先修正这个错误，再检查。")


@functools.cache
def _words(module, lang="en"):
    """The words of a chapter's exercises (``chNN.<lang>.toml`` beside ``chNN.py``), {} if it has none."""
    path = Path(__file__).with_name(f"{module.rpartition('.')[2]}.{lang}.toml")
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _words_of(module: str, name: str) -> dict:
    """An exercise's words in the course's language; English where a translation lacks them."""
    english = _words(module).get(name, {})
    lang = language()
    if lang == "en":
        return english
    local = _words(module, lang).get(name, {})
    if local.get("mistakes", {}).keys() != english.get("mistakes", {}).keys():
        local = {k: v for k, v in local.items() if k != "mistakes"}
    return {**english, **local}


@dataclass
class Exercise:
    """One exercise: its code here, its words in the chapter's ``.en.toml`` (CONTRIBUTING.md, Exercises)."""

    name: str
    model_answer: Callable[..., Any]
    cases: Callable[[], Sequence[Any]] = lambda: [None]
    observe: Callable[[Any, Any], Any] = lambda answer, case: answer(*case)
    mistakes: dict[str, Any] = field(default_factory=dict)
    describe: Callable[[Any], str] = lambda case: ""
    tol: tuple[float, float] = (1e-5, 1e-6)
    form: str | type = "function"
    extra_time_s: float = 0.0  # more seconds for a check that runs the answer on real ranks (a launch)
    prompt: str = ""
    hints: Sequence[str] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    _hints_shown: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        words = _words_of(self.model_answer.__module__, self.name)
        self.prompt = self.prompt or words.get("prompt", "")
        self.hints = list(self.hints or words.get("hints", []))
        self.reasons = self.reasons or words.get("mistakes", {}) or {k: k for k in self.mistakes}
        if self.reasons.keys() != self.mistakes.keys() or not self.prompt or not self.hints:
            raise ValueError(
                f"{self.model_answer.__module__} {self.name}: the words file must give a prompt, hints, and a reason for each mistake {sorted(self.mistakes)}"
            )

    def check(self, answer: Any = Ellipsis) -> CheckResult:
        """Check the learner's answer; never raises, returns within about TIME_LIMIT_S seconds."""
        status = "incorrect"
        try:
            if answer is None or answer is Ellipsis or (isinstance(answer, str) and answer == ""):
                raise NotAttempted(tr(*_PLACEHOLDER))
            with untouched():
                torch.set_num_threads(1)  # tiny inputs: faster, and steady on a busy machine
                self._judge(answer)
            message = tr("well done (with hints).", "做得好（用了提示）。") if self._hints_shown else tr("well done.", "做得好。")
            status = "correct"
        except NotAttempted as exc:
            status, message = "not_attempted", str(exc)
        except Incorrect as exc:
            message = str(exc)
        except TimeUp:
            limit = TIME_LIMIT_S + self.extra_time_s
            message = tr(
                f"your code did not finish within {limit:g} seconds (an endless loop, a sleep, or an endless iterator?). Make it finish, then check again.",
                f"你的代码没有在 {limit:g} 秒内结束（无限循环、sleep，还是无尽的迭代器？）。让它能够结束，然后再检查。",
            )
        except (Exception, SystemExit) as exc:  # a check must never crash the notebook
            message = _explain_exception(exc)
        # saved on this computer only when the learner turned recording on; never raises
        progress.record(self.model_answer.__module__.rpartition(".")[2], self.name, status)
        return CheckResult(self.name, status, message)

    def hint(self, number: int | None = None) -> _Text:
        """Show the next hint (or hint `number`, counting from 1)."""
        n = len(self.hints)
        if number is None:
            self._hints_shown = number = min(self._hints_shown + 1, n)
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= n:  # hint("2"), hint(0)
            return _Text(tr(f"{self.name}: there are {n} hints", f"{_title(self.name)}：共有 {n} 条提示"),
                         tr(f"Ask for hint 1 to {n}.", f"请查看第 1 到第 {n} 条提示。"))
        return _Text(tr(f"{self.name} · hint {number}/{n}", f"{_title(self.name)} · 提示 {number}/{n}"),
                     self.hints[number - 1])

    def solution(self) -> _Text:
        """Show the worked solution: the source of the tested solution function."""
        code = textwrap.dedent(inspect.getsource(self.model_answer)).strip("\n")
        return _Text(tr(f"{self.name} · solution", f"{_title(self.name)} · 参考答案"), code, code=True)

    def reference(self) -> Any:
        """A correct answer, as a learner would pass it."""
        return self.model_answer() if self.form == "value" else self.model_answer

    def _case(self, i):
        """Case `i`, built afresh (the code under test may modify its inputs) from the same seeds."""
        torch.manual_seed(0)
        return self.cases()[i]

    def _judge(self, answer):
        var, base, it = self.name.lower() if self.name[0] == "Q" else "q1", self.form, kind(answer)
        call = f"`{var}.check({self.model_answer.__name__})`"
        if base == "function" and (not callable(answer) or isinstance(answer, type)):
            raise Incorrect(tr(f"pass your function itself, {call} (without calling it), not {it}.",
                               spaced(f"请传入函数本身，{call}（不要调用它），而不是", it, "。")))
        if isinstance(base, type) and not (isinstance(answer, type) and issubclass(answer, base)):
            why = tr(f"pass the class itself, {call} (no parentheses), a subclass of {base.__name__}; this is {it}.",
                     spaced(f"请传入类本身，{call}（不带括号），它应是 {base.__name__} 的子类；这里传入的是", it, "。"))
            raise Incorrect(why)
        budget, tol = TIME_LIMIT_S + self.extra_time_s, self.tol  # only the learner's code counts against the limit
        for i in range(len(self.cases())):
            want = _outcome(self.observe, self.reference(), self._case(i))
            if "error" in want or "incorrect" in want:
                why = tr(f"the checker itself failed on its model answer ({str(want)[:300]}); please report it.",
                         f"检查程序在它自己的参考答案上出错了（{str(want)[:300]}）；请报告这个问题。")
                raise Incorrect(why)
            mine = _copy(answer) if self.form == "value" else answer
            observe = functools.partial(_outcome, self.observe, mine, self._case(i), want, tol)
            got, used = _bounded(observe, max(budget, 0.01))
            budget -= used
            key = _first_diff(got, want, *tol)
            if key is None:
                continue
            for name, mistake in self.mistakes.items():
                seen = _outcome(self.observe, mistake, self._case(i), want, tol)
                if _first_diff(seen, want, *tol) == key and _same(seen[key], got[key], *tol):
                    raise Incorrect(self.reasons[name])
            raise Incorrect(self._explain(self._case(i), key, got[key], want.get(key)))

    def _explain(self, case, key, got, want):
        if key in ("incorrect", "error"):
            return got if key == "incorrect" else _explain_exception(got)
        if key == "result" and self.form == "value":
            return tr(f"{_show(got, want)} is not right. {self.hints[0]}", f"{_show(got, want)} 不对。{self.hints[0]}")
        where, tol = self.describe(case), self.tol
        if where:
            where = tr(f"{where[:1].upper()}{where[1:]}, ", f"{where}，")
        if key == "result":
            name = self.model_answer.__name__
            key = tr(f"what `{name}` returns", f"`{name}` 的返回值")
        while all(isinstance(x, list | tuple) for x in (got, want)) and len(got) == len(want):
            if not any(isinstance(w, torch.Tensor) for w in want):
                break  # point at the first tensor that differs
            i = next(i for i, p in enumerate(zip(got, want, strict=True)) if not _same(*p, *tol))
            key, got, want = tr(f"{key} (item {i})", f"{key}（下标为 {i} 的一项）"), got[i], want[i]
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            diff = _tensor_diff(got, want)
            return tr(f"{where}{key} {diff}.", spaced(where, key, diff, "。"))
        return tr(f"{where}{key} is {_show(got, want)}, but it should be {_show(want, got)}.",
                  spaced(where, key, "是", _show(got, want), "，但应该是", _show(want, got), "。"))
