"""Learntools-style exercises (``q1.check(answer)``, ``q1.hint()``, ``q1.solution()``), each declared
once: see :class:`Exercise` and CONTRIBUTING.md, "Exercises"."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import html
import inspect
import itertools
import math
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

TIME_LIMIT_S = 5.0  # the longest a check may take, learner's code included
MAX_ITEMS = 1000  # the most items a check takes from an iterable answer


class Incorrect(Exception):
    """The answer is wrong, and the message says why."""


class NotAttempted(Exception):
    """There is nothing to check yet."""


class _CheckerFailed(Exception):
    """The model answer itself failed: a bug of the checker, not of the learner."""


class TimeUp(BaseException):  # not an Exception: a learner's `except Exception` cannot swallow it
    """The learner's code ran past the check's time limit."""


_STYLE = {
    "correct": ("Correct", "#1b7f3a", "#e8f5ec"),
    "incorrect": ("Incorrect", "#b3261e", "#fdecea"),
    "not_attempted": ("Not attempted yet", "#6b5900", "#fff8e1"),
}


@dataclass(frozen=True)
class CheckResult:
    """What a check found. Prints as plain text, shows as a coloured box in Jupyter."""

    exercise: str
    status: str  # "correct" | "incorrect" | "not_attempted"
    message: str

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    def __bool__(self) -> bool:
        return self.correct

    def __repr__(self) -> str:
        return f"[{self.exercise}] {_STYLE[self.status][0]}: {self.message}"

    def _repr_html_(self) -> str:
        label, fg, bg = _STYLE[self.status]
        msg = html.escape(self.message).replace("\n", "<br>")
        return (f'<div style="border-left:4px solid {fg};background:{bg};padding:6px 10px">'
                f'<b style="color:{fg}">{html.escape(self.exercise)} · {label}</b>: {msg}</div>')


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


# ------------------------------------------------------------------ the learner's session, untouched


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Run with a known state (grad mode on, no inference mode, float32 by default) and restore, on
    the way out, everything of the session that running code may change: the torch (and CUDA, MPS),
    numpy and ``random`` generators, grad mode, the default dtype and the thread count."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    mps = torch.backends.mps.is_available()
    saved = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None, np.random.get_state(),
             random.getstate(), torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads(),
             torch.mps.get_rng_state() if mps else None)
    try:
        torch.set_default_dtype(torch.float32)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        torch.set_rng_state(saved[0])
        if saved[1] is not None:
            torch.cuda.set_rng_state_all(saved[1])
        if saved[7] is not None:
            torch.mps.set_rng_state(saved[7])
        np.random.set_state(saved[2])
        random.setstate(saved[3])
        torch.set_grad_enabled(saved[4])
        torch.set_default_dtype(saved[5])
        if torch.get_num_threads() != saved[6]:
            torch.set_num_threads(saved[6])


def stop_threads(threads: Sequence[threading.Thread], wait: float = 2.0) -> None:
    """Stop threads still running the learner's code (at their next Python instruction), so that a
    spinning answer does not keep a CPU and the GIL after its check. The request is repeated until the
    threads have ended, for up to `wait` seconds (a thread inside one long C call sees it only after);
    a thread asleep in C (``time.sleep``) uses no CPU and ends when it wakes. Callers wait for their
    threads with an Event, not ``Thread.join()``: on Python 3.11 a join() interrupted by the time limit
    marks a running thread as ended, and it would be skipped here."""
    deadline = time.monotonic() + wait
    alive = [t for t in threads if t.is_alive() and t.ident is not None]
    while alive and time.monotonic() < deadline:
        for t in alive:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(SystemExit))
        for t in alive:
            t.join(0.01)
        alive = [t for t in alive if t.is_alive() and not _asleep(t.native_id)]


def _cpu_wait(tid: int | None = None) -> float:
    """Seconds a thread of this process has spent ready to run but waiting for a CPU (Linux's
    schedstat); 0.0 where the system does not say."""
    path = "/proc/thread-self/schedstat" if tid is None else f"/proc/self/task/{tid}/schedstat"
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _asleep(tid: int | None) -> bool:
    """Whether thread `tid` is asleep (state S or D): it uses no CPU, and cannot be stopped until it wakes."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "SD"
    except (OSError, IndexError, TypeError):
        return False


MAX_STRETCH = 3.0  # on a busy machine a limit grows by the time spent waiting for a CPU, up to this factor


_NOT_LEARNERS = tuple({str(Path(__file__).resolve().parents[1]), *(
    sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))})


def learners_code(frame: Any) -> bool:
    """Whether `frame` runs the learner's code: not the course's package, the standard library or an
    installed package (whose cleanup must run even after a time limit)."""
    name = frame.f_code.co_filename
    return not name.startswith(_NOT_LEARNERS) and not name.startswith("<frozen")


def _stop_every_line(frame: Any, until: Any) -> None:
    """From now on, every line of the learner's code that runs in `frame` and its callers below
    `until`, or in a function they call, raises :class:`TimeUp`: code that swallows one (``except BaseException: pass``) gets
    the next one at its next line, which is outside the ``try`` that caught the first. (Python
    switches a trace function off once it raises, so code that swallows at two levels of ``try``
    in an endless loop cannot be stopped; nor can the kernel's interrupt stop it.)"""

    def trace(f: Any, event: str, arg: Any) -> Any:
        if not learners_code(f):  # the course's and the libraries' code runs untraced
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
    """``(fn(), seconds charged)``, stopped with :class:`TimeUp` once ``fn`` has run for `seconds`.
    Time spent waiting for a CPU is not charged (a right answer stays right on a busy machine), up to
    ``MAX_STRETCH`` times the limit. On the main thread a SIGALRM timer interrupts Python loops and
    sleeps (an outer timer is restored afterwards); elsewhere ``fn`` runs on a helper thread."""
    start = time.monotonic()

    def charged(waited: float) -> float:
        elapsed = time.monotonic() - start
        return elapsed if elapsed >= MAX_STRETCH * seconds else max(elapsed - waited, 0.0)

    def run(box: list) -> None:
        box.append(threading.get_native_id())
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed back to the caller's thread
            box.append((False, exc))

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        box: list[Any] = []
        t = threading.Thread(target=run, args=(box,), daemon=True)
        t.start()
        while t.is_alive() and charged(_cpu_wait(box[0]) if box else 0.0) < seconds:
            t.join(min(0.05, seconds))
        used = charged(_cpu_wait(box[0]) if box else 0.0)
        if t.is_alive():
            stop_threads([t])
            raise TimeUp() from None
        if not box[1][0]:
            raise box[1][1] from None
        return box[1][1], used

    wait0 = _cpu_wait()

    expired = []

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


# ------------------------------------------------------------------ the forms an answer may take


def kind(x: Any) -> str:
    """How an answer reads to a learner: "a tensor of shape (3,)", "a function", "a list"..."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, type):
        return f"the class {x.__name__}"
    if inspect.isroutine(x):
        return "a function"
    name = type(x).__name__
    return f"an {name}" if name[:1] in "aeiouAEIOU" or name == "ndarray" else f"a {name}"


def as_number(x: Any, what: str = "your answer", whole: bool = False) -> float | int:
    """A Python number from an int, a float, a numpy number or a one-element tensor."""
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_complex():
        x = x.item()
    elif isinstance(x, np.generic) and np.ndim(x) == 0:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise Incorrect(f"{what} should be a {'whole ' if whole else ''}number, but it is {kind(x)}.")
    if whole:
        if isinstance(x, float) and not x.is_integer():
            raise Incorrect(f"{what} should be a whole number, but it is {x!r}.")
        return int(x)
    return float(x)


def as_ints(x: Any, what: str = "your answer") -> list[int]:
    """Whole numbers from any finite iterable (list, tuple, range, tensor, array, generator); at most
    :data:`MAX_ITEMS` are taken, so an endless iterator ends up as too long a list."""
    if isinstance(x, torch.Tensor | np.ndarray) and x.ndim != 1:
        raise Incorrect(f"{what} should be a list of whole numbers, but it is {kind(x)}.")
    if isinstance(x, str | bytes | dict) or not isinstance(x, Iterator | Sequence | torch.Tensor | np.ndarray | range):
        raise Incorrect(f"{what} should be a list of whole numbers, but it is {kind(x)}.")
    return [as_number(i, f"each entry of {what}", whole=True) for i in take(x)]


def take(x: Any, n: int = MAX_ITEMS + 1) -> list[Any]:
    """At most `n` items of an iterable (never iterating a whole huge tensor, or an endless iterator)."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return list(x[:n]) if x.ndim else [x]
    try:
        return list(itertools.islice(iter(x), n))
    except TypeError:
        raise Incorrect(f"this should be a list, but it is {kind(x)}.") from None


def as_tensor(x: Any, what: str = "your answer") -> torch.Tensor:
    """The answer itself, detached, if it is a tensor; a clear Incorrect if it is not."""
    if not isinstance(x, torch.Tensor):
        tip = {"ndarray": " `torch.from_numpy(a)` turns a numpy array into one.",
               "list": " `torch.tensor(...)` turns a list into one."}.get(type(x).__name__, "")
        raise Incorrect(f"{what} should be a torch.Tensor, but it is {kind(x)}.{tip}")
    return x.detach()


def _copy(x: Any) -> Any:
    """A copy of a learner's value to work on, so that a check never modifies the learner's object."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if x.numel() <= 10**6 else x.detach()
    if isinstance(x, list | tuple):
        return type(x)(_copy(i) for i in x) if len(x) <= MAX_ITEMS else x
    return x


def variant(solution: Callable[..., Any] | type, *edits: str) -> Any:
    """A mistake declared as a change to the tested solution: its source with each ``old, new`` pair
    of `edits` replaced (each `old` must occur), run in the solution's module. ``variant(f, "a + b",
    "a - b")`` is `f` with that one slip, under the same name."""
    src = textwrap.dedent(inspect.getsource(solution))
    for old, new in zip(edits[::2], edits[1::2], strict=True):
        if old not in src:
            raise ValueError(f"variant of {solution.__name__}: {old!r} is not in its source")
        src = src.replace(old, new, 1)
    namespace = dict(inspect.getmodule(solution).__dict__)
    exec(compile(src, f"<{solution.__name__}, with a mistake>", "exec"), namespace)
    return namespace[solution.__name__]


# ------------------------------------------------------------------ comparing what was observed


@dataclass(frozen=True)
class _Raised:
    """An exception the code raised, comparable with another one."""

    type_name: str
    text: str
    explanation: str = field(compare=False)


def _same(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if a.numel() > 10**6:
            return False
        return bool(torch.allclose(a.detach().cpu().double(), b.detach().cpu().double(), rtol=rtol, atol=atol))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rtol, atol) for k in a)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _show(x: Any, other: Any = None) -> str:
    """A short text for a value; numbers get enough digits to differ from `other`."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 and (other is None or (
            isinstance(other, int | float) and float(other).is_integer())):
        return str(int(x))  # 14, not 14.0000
    if isinstance(x, float):
        short = f"{x:.4f}"
        return repr(x) if isinstance(other, int | float) and f"{float(other):.4f}" == short else short
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}" if x.numel() > 20 else repr(x.tolist())
    text = repr(x)
    return text if len(text) <= 160 else text[:150] + " ...]"


def _tensor_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"has shape {tuple(got.shape)}, but it should have shape {tuple(want.shape)}"
    diff = torch.nan_to_num((got.double() - want.double()).abs(), nan=float("inf"))
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.ndim else ()
    g, w = got[idx].item(), want[idx].item()
    where = f" at index {idx}" if idx else ""
    return f"holds {_show(g, w)}{where} where {_show(w, g)} was expected"


def _outcome(observe: Callable[[Any, Any], Any], answer: Any, case: Any, want: dict | None = None,
             tol: tuple[float, float] = (0, 0)) -> dict[str, Any]:
    """What `observe` sees of `answer` on `case`: an ordered dict of facts. An observer that yields
    ``(name, value)`` pairs keeps the facts it found before an exception (a fact too), and is stopped
    at the first fact that differs from `want` (so nothing more is computed on a wrong answer)."""
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
    except NotImplementedError:
        raise NotAttempted("your code still raises NotImplementedError: fill in its body.") from None
    except (NotAttempted, TimeUp):
        raise
    except (Exception, SystemExit) as exc:
        facts["error"] = _Raised(type(exc).__name__, str(exc), _explain_exception(exc))
        return facts
    return seen if isinstance(seen, dict) else {"result": seen}


def _first_diff(got: dict, want: dict, rtol: float, atol: float) -> str | None:
    """The first fact (in the order judged) where `got` differs from `want`; an error or a form
    problem counts where it stopped the observation."""
    extra = [k for k in got if k not in want]
    for key, w in want.items():
        if key not in got:
            return extra[0] if extra else key
        if not _same(got[key], w, rtol, atol):
            return key
    return extra[0] if extra else None


def _explain_exception(exc: BaseException) -> str:
    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):  # the learner's own frame
        path = fr.filename.replace("\\", "/")
        if "/course_utils/" not in path and "/torch/" not in path:
            where = f" (line {fr.lineno}: `{(fr.line or '').strip()}`)"
            break
    return f"your code raised {type(exc).__name__}: {exc}{where}. Fix that error first, then check again."


# ------------------------------------------------------------------ the exercise


@functools.cache
def _words(module: str) -> dict[str, Any]:
    """The words of a chapter's exercises (``chNN.en.toml`` beside ``chNN.py``), {} if it has none."""
    path = Path(__file__).with_name(f"{module.rpartition('.')[2]}.en.toml")
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


@dataclass
class Exercise:
    """One exercise, declared once: its code here, its words in the chapter's ``.en.toml``.

    name: short id shown to the learner ("Q1"), and the exercise's table in the words file.
    model_answer: the reference: a function or a class (``form`` "function" or a base class), or for a
        ``form="value"`` exercise a function that returns the value. ``.solution()`` shows its source.
    cases: ``cases()`` returns fresh inputs, one per case (value exercises have one case, None).
    observe: ``observe(answer, case)`` returns what is compared: a value, a dict of named facts, or
        yields ``(name, value)`` facts, in the order they are judged; it raises :class:`Incorrect`
        when the answer has the wrong form.
    mistakes: ``{name: answer}``: an answer that behaves like one of these gets the reason that the
        words file gives for that name.
    describe: ``describe(case)`` names an input in a message ("for n=10 on 3 ranks").
    tol: ``(rtol, atol)`` for floats; float32 precision unless the task asks for float64.
    form: "value", "function", or the base class a class answer must subclass.
    prompt, hints, reasons: the words (the task, the hints shown one at a time by :meth:`hint`, and
        ``{mistake name: reason}``); read from the words file of the model answer's module when
        not given.
    """

    name: str
    model_answer: Callable[..., Any]
    cases: Callable[[], Sequence[Any]] = lambda: [None]
    observe: Callable[[Any, Any], Any] = lambda answer, case: answer(*case)
    mistakes: dict[str, Any] = field(default_factory=dict)
    describe: Callable[[Any], str] = lambda case: ""
    tol: tuple[float, float] = (1e-5, 1e-6)
    form: str | type = "function"
    prompt: str = ""
    hints: Sequence[str] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    _hints_shown: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        words = _words(self.model_answer.__module__).get(self.name, {})
        self.prompt = self.prompt or words.get("prompt", "")
        self.hints = list(self.hints or words.get("hints", []))
        self.reasons = self.reasons or words.get("mistakes", {}) or {k: k for k in self.mistakes}
        if self.reasons.keys() != self.mistakes.keys() or not self.prompt or not self.hints:
            raise ValueError(f"{self.model_answer.__module__} {self.name}: the words file must give a prompt, "
                             f"hints, and a reason for each mistake {sorted(self.mistakes)} (it gives "
                             f"{sorted(self.reasons)})")

    def check(self, answer: Any = Ellipsis) -> CheckResult:
        """Check the learner's answer; never raises, returns within about TIME_LIMIT_S seconds."""
        if answer is None or answer is Ellipsis or (isinstance(answer, str) and answer == ""):
            return self._result("not_attempted", "replace the `...` placeholder with your answer, then run this cell again.")
        with untouched():
            torch.set_num_threads(1)  # tiny inputs: one thread is faster, and steady on a busy machine
            try:
                self._judge(answer)
            except NotAttempted as exc:
                return self._result("not_attempted", str(exc))
            except Incorrect as exc:
                return self._result("incorrect", str(exc))
            except TimeUp:
                return self._result("incorrect", f"your code did not finish within {TIME_LIMIT_S:g} seconds (an endless loop, a sleep, or an endless iterator?). Make it finish, then check again.")
            except _CheckerFailed as exc:
                return self._result("incorrect", f"the checker itself failed on its model answer ({exc}); please report it.")
            except (Exception, SystemExit) as exc:  # a check must never crash the notebook
                return self._result("incorrect", _explain_exception(exc))
        return self._result("correct", "well done." if self._hints_shown == 0 else "well done (with hints).")

    def hint(self, number: int | None = None) -> _Text:
        """Show the next hint (or hint `number`, counting from 1)."""
        if number is None:
            self._hints_shown = min(self._hints_shown + 1, len(self.hints))
            number = self._hints_shown
        if not 1 <= number <= len(self.hints):
            return _Text(f"{self.name}: there are {len(self.hints)} hints", f"Ask for hint 1 to {len(self.hints)}.")
        return _Text(f"{self.name} · hint {number}/{len(self.hints)}", self.hints[number - 1])

    def solution(self) -> _Text:
        """Show the worked solution: the source of the tested solution function."""
        return _Text(f"{self.name} · solution", self.solution_code, code=True)

    @property
    def solution_code(self) -> str:
        return textwrap.dedent(inspect.getsource(self.model_answer)).strip("\n")

    def reference(self) -> Any:
        """A correct answer, as a learner would pass it."""
        return self.model_answer() if self.form == "value" else self.model_answer

    def _case(self, i: int) -> Any:
        """Case `i`, built afresh (the code under test may modify its inputs) from the same seeds."""
        torch.manual_seed(0)
        return self.cases()[i]

    def _judge(self, answer: Any) -> None:
        self._check_form(answer)
        rtol, atol = self.tol
        budget = TIME_LIMIT_S  # only the learner's code counts against the limit
        for i in range(len(self.cases())):
            want = _outcome(self.observe, self.reference(), self._case(i))
            if "error" in want or "incorrect" in want:
                raise _CheckerFailed(str(want.get("error") or want.get("incorrect"))[:300])
            case = self._case(i)
            mine = _copy(answer) if self.form == "value" else answer
            got, used = _bounded(lambda a=mine, c=case, w=want: _outcome(self.observe, a, c, w, self.tol), max(budget, 0.01))
            budget -= used
            key = _first_diff(got, want, rtol, atol)
            if key is None:
                continue
            for mistake_name, mistake in self.mistakes.items():
                seen = _outcome(self.observe, mistake, self._case(i), want, self.tol)
                if _first_diff(seen, want, rtol, atol) == key and _same(seen[key], got[key], rtol, atol):
                    raise Incorrect(self.reasons[mistake_name])
            raise Incorrect(self._explain(self._case(i), key, got[key], want.get(key)))

    def _check_form(self, answer: Any) -> None:
        call = f"`{self.name.lower() if self.name.startswith('Q') else 'q1'}.check({self.model_answer.__name__})`"
        if self.form == "function" and (not callable(answer) or isinstance(answer, type)):
            raise Incorrect(f"pass your function itself, {call} (without calling it), not {kind(answer)}.")
        if isinstance(self.form, type) and not (isinstance(answer, type) and issubclass(answer, self.form)):
            raise Incorrect(f"pass the class itself, {call} (no parentheses), a subclass of {self.form.__name__}; this is {kind(answer)}.")

    def _explain(self, case: Any, key: str, got: Any, want: Any) -> str:
        if key == "incorrect":
            return got
        if key == "error":
            return got.explanation
        where = self.describe(case)
        where = f"{where[:1].upper()}{where[1:]}, " if where else ""
        if key == "result" and self.form == "value":
            return f"{_show(got, want)} is not right. {self.hints[0]}"
        if key == "result":
            key = f"what `{self.model_answer.__name__}` returns"
        while isinstance(got, list | tuple) and isinstance(want, list | tuple) and len(got) == len(want) and any(
                isinstance(w, torch.Tensor) for w in want):  # point at the first tensor that differs
            i = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _same(g, w, *self.tol))
            key, got, want = f"{key} (item {i})", got[i], want[i]
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            return f"{where}{key} {_tensor_diff(got, want)}."
        return f"{where}{key} is {_show(got, want)}, but it should be {_show(want, got)}."

    def _result(self, status: str, message: str) -> CheckResult:
        return CheckResult(self.name, status, message)
