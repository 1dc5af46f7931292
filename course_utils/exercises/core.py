"""Learntools-style exercises: ``q1.check(answer)``, ``q1.hint()``, ``q1.solution()``.

A chapter module (``course_utils.exercises.ch01`` ...) builds its exercises with
:class:`Exercise` and lists them in ``EXERCISES``. A checker is a plain function
that receives the learner's answer and raises :class:`Incorrect` with a reason a
beginner understands; everything else (not attempted, a crash in the learner's
code, rich display) is handled here, so a check never raises in a notebook.
"""

from __future__ import annotations

import html
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CheckResult",
    "Exercise",
    "Incorrect",
    "NotAttempted",
    "expect_close",
    "expect_equal",
    "expect_tensor",
    "expect_type",
]


class Incorrect(Exception):
    """Raised by a checker: the answer is wrong, and the message says why."""


class NotAttempted(Exception):
    """Raised by a checker (or the learner's stub) when there is nothing to check yet."""


_STUBS = (None, Ellipsis, "")

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
        label = _STYLE[self.status][0]
        return f"[{self.exercise}] {label}: {self.message}"

    def _repr_html_(self) -> str:
        label, fg, bg = _STYLE[self.status]
        msg = html.escape(self.message).replace("\n", "<br>")
        return (
            f'<div style="border-left:4px solid {fg};background:{bg};padding:6px 10px">'
            f'<b style="color:{fg}">{html.escape(self.exercise)} · {label}</b>: {msg}</div>'
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


@dataclass
class Exercise:
    """One exercise.

    name: short id shown to the learner ("Q1").
    prompt: one sentence recalling the task.
    checker: ``checker(answer)`` raises :class:`Incorrect` with a reason, or returns.
    hints: shown one at a time, in order, by :meth:`hint`.
    solution_code: the code shown by :meth:`solution`.
    solve: returns a correct answer (used by the tests, never shown).
    wrong_answers: ``(description, make_answer)`` pairs of plausible mistakes that
        the checker must call Incorrect (used by the tests).
    """

    name: str
    prompt: str
    checker: Callable[[Any], None]
    hints: Sequence[str]
    solution_code: str
    solve: Callable[[], Any]
    wrong_answers: Sequence[tuple[str, Callable[[], Any]]] = ()
    _hints_shown: int = field(default=0, repr=False)

    def check(self, answer: Any = Ellipsis) -> CheckResult:
        """Check the learner's answer; never raises."""
        if _is_stub(answer):
            return self._result("not_attempted", "replace the `...` placeholder with your answer, then run this cell again.")
        try:
            self.checker(answer)
        except NotAttempted as exc:
            return self._result("not_attempted", str(exc) or "fill in the code first.")
        except NotImplementedError:
            return self._result("not_attempted", "your function still raises NotImplementedError: fill in its body.")
        except Incorrect as exc:
            return self._result("incorrect", str(exc))
        except Exception as exc:  # the learner's code crashed: explain, do not crash the notebook
            return self._result("incorrect", _explain_exception(exc))
        return self._result("correct", "well done." if self._hints_shown == 0 else "well done (with hints).")

    def hint(self, number: int | None = None) -> _Text:
        """Show the next hint (or hint `number`, counting from 1)."""
        if not self.hints:
            return _Text(f"{self.name}: no hint for this one", "Try `.solution()`.")
        if number is None:
            self._hints_shown = min(self._hints_shown + 1, len(self.hints))
            number = self._hints_shown
        if not 1 <= number <= len(self.hints):
            return _Text(f"{self.name}: there are {len(self.hints)} hints", f"Ask for hint 1 to {len(self.hints)}.")
        return _Text(f"{self.name} · hint {number}/{len(self.hints)}", self.hints[number - 1])

    def solution(self) -> _Text:
        """Show a worked solution."""
        return _Text(f"{self.name} · solution", self.solution_code.strip("\n"), code=True)

    def _result(self, status: str, message: str) -> CheckResult:
        return CheckResult(self.name, status, message)


def _is_stub(answer: Any) -> bool:
    if isinstance(answer, torch.Tensor):
        return False
    try:
        return any(answer is s or (isinstance(answer, str) and answer == s) for s in _STUBS)
    except Exception:
        return False


def _explain_exception(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for fr in reversed(frames):  # the learner's own frame: the last one outside course_utils
        if "course_utils" not in fr.filename.replace("\\", "/"):
            where = f" (line {fr.lineno}: `{(fr.line or '').strip()}`)"
            break
    return f"your code raised {type(exc).__name__}: {exc}{where}. Fix that error first, then check again."


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def expect_type(answer: Any, types: type | tuple[type, ...], what: str = "your answer") -> None:
    """Raise Incorrect unless `answer` is an instance of `types`."""
    if not isinstance(answer, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise Incorrect(f"{what} should be a {names}, but it is {_kind(answer)}.")


def expect_equal(answer: Any, expected: Any, what: str = "your answer", why: str = "") -> None:
    """Raise Incorrect unless ``answer == expected`` (with the same type family)."""
    if isinstance(expected, bool) and not isinstance(answer, bool):
        raise Incorrect(f"{what} should be True or False, but it is {_kind(answer)}.")
    if isinstance(expected, int | float) and isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if isinstance(expected, int) and not isinstance(expected, bool):
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)
        if not isinstance(answer, int):
            raise Incorrect(f"{what} should be a whole number, but it is {_kind(answer)}.")
    if answer != expected:
        extra = f" {why}" if why else ""
        raise Incorrect(f"{what} is {answer!r}, which is not right.{extra}")


def expect_close(answer: Any, expected: float, what: str = "your answer", rtol: float = 1e-4,
                 atol: float = 1e-6, why: str = "") -> None:
    """Raise Incorrect unless `answer` is a number within tolerance of `expected`."""
    if isinstance(answer, torch.Tensor):
        if answer.numel() != 1:
            raise Incorrect(f"{what} should be a single number, but it is {_kind(answer)}.")
        answer = answer.item()
    if not isinstance(answer, int | float) or isinstance(answer, bool):
        raise Incorrect(f"{what} should be a number, but it is {_kind(answer)}.")
    if math.isnan(answer) or not math.isclose(answer, expected, rel_tol=rtol, abs_tol=atol):
        extra = f" {why}" if why else ""
        raise Incorrect(f"{what} is {answer:.6g}, which is not right.{extra}")


def expect_tensor(
    answer: Any,
    expected: torch.Tensor,
    what: str = "your tensor",
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    check_dtype: bool = True,
    check_requires_grad: bool = False,
    expected_grad: torch.Tensor | None = None,
    why: str = "",
) -> None:
    """Compare a learner's tensor with the expected one: type, shape, dtype, values, autograd state."""
    if not isinstance(answer, torch.Tensor):
        tip = " `torch.tensor(...)` turns a list or number into a tensor." if isinstance(answer, list | tuple | int | float) else ""
        raise Incorrect(f"{what} should be a torch.Tensor, but it is {_kind(answer)}.{tip}")
    if tuple(answer.shape) != tuple(expected.shape):
        raise Incorrect(f"{what} has shape {tuple(answer.shape)}, but it should have shape {tuple(expected.shape)}.")
    if check_dtype and answer.dtype != expected.dtype:
        raise Incorrect(f"{what} has dtype {answer.dtype}, but it should be {expected.dtype}.")
    a = answer.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if not torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        diff = (a - e).abs()
        diff = torch.nan_to_num(diff, nan=float("inf"))
        idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.ndim else ()
        where = f" at index {idx}" if idx else ""
        got = a[idx].item() if idx else a.item()
        want = e[idx].item() if idx else e.item()
        extra = f" {why}" if why else ""
        raise Incorrect(f"{what} has the right shape but wrong values: {got:.6g}{where} where {want:.6g} was expected.{extra}")
    if check_requires_grad and answer.requires_grad != expected.requires_grad:
        want = "should" if expected.requires_grad else "should not"
        raise Incorrect(f"{what} {want} have requires_grad=True (it is {answer.requires_grad}).")
    if expected_grad is not None:
        if answer.grad is None:
            raise Incorrect(f"{what}.grad is None: did you call .backward() on something that depends on it?")
        expect_tensor(answer.grad, expected_grad, f"{what}.grad", rtol=rtol, atol=atol, check_dtype=False)
