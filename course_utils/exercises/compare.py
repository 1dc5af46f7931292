"""What an answer did, and how it differs from the model answer's: :func:`outcome` runs ``observe``
on one case and keeps its facts (a value, or named facts in the order they are judged, or the error
it raised), :func:`first_diff` finds the first fact that differs (:func:`same`: at the exercise's
tolerance), and :func:`show`, :func:`tensor_diff` and :func:`explain_exception` say it in words."""

import inspect
import math
import random
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..i18n import is_chinese, tr
from .forms import Incorrect, NotAttempted, kind
from .time_limit import learners_code


def stub_message() -> str:
    """What a learner whose function still raises NotImplementedError (an unfinished body) is told."""
    return tr("your code still raises NotImplementedError: fill in its body.",
              "你的代码仍然抛出 NotImplementedError：请补全函数体。")


def same(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Whether `a` and `b` are the same answer: numbers and tensors within the tolerance, containers
    item by item, errors by type and text, anything else by type and ``==``."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.numel() > 10**6 or a.is_complex() != b.is_complex():
            return False  # (a complex tensor cast to real would lose its imaginary part unseen)
        dtype = torch.complex128 if a.is_complex() else torch.float64
        a, b = a.detach().cpu().to(dtype), b.detach().cpu().to(dtype)
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rtol, atol) for k in a)
    try:
        if isinstance(a, BaseException):  # an error the code raised: the same type and text
            return type(a) is type(b) and str(a) == str(b)
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def show(x: Any, other: Any = None) -> str:
    """A short text for a value; numbers get enough digits to differ from `other`."""
    if isinstance(x, float):
        whole = other is None or isinstance(other, int | float) and float(other).is_integer()
        if x.is_integer() and abs(x) < 1e15 and whole:
            return str(int(x))  # 14, not 14.0000
        short = f"{x:.4f}"
        alike = isinstance(other, int | float) and f"{float(other):.4f}" == short
        return repr(x) if alike else short
    if isinstance(x, torch.Tensor):
        return kind(x) if x.numel() > 20 else repr(x.tolist())
    if isinstance(x, str) and any(map(is_chinese, x)):  # a fact's Chinese value: in Chinese quotes
        return f"“{x}”"
    text = text_of(x, repr)
    return text if len(text) <= 160 else text[:150] + " ...]"


def tensor_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    """How tensor `got` differs from `want`, said after its name (``x.grad has shape ...``; Chinese: the
    name, then ``的形状是 ...`` or ``在索引 ... 处是 ...``: a field of a :func:`tr` template, which spaces it)."""
    if got.shape != want.shape:
        return tr("has shape {shape}, but it should have shape {want_shape}", "的形状是 {shape}，但应该是 {want_shape}",
                  shape=tuple(got.shape), want_shape=tuple(want.shape))
    if got.is_complex() != want.is_complex():
        complex_, real = tr("complex", "复数"), tr("real", "实数")
        it, other = (complex_, real) if got.is_complex() else (real, complex_)
        return tr("is a {it} tensor ({dtype}), but it should be {other} ({want_dtype})",
                  "是{it}张量（{dtype}），但应该是{other}张量（{want_dtype}）",
                  it=it, dtype=got.dtype, other=other, want_dtype=want.dtype)
    if got.is_complex():
        got, want = torch.view_as_real(got.resolve_conj()), torch.view_as_real(want.resolve_conj())
    diff = torch.nan_to_num((got.double() - want.double()).abs(), nan=float("inf"))
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.ndim else ()
    g, w, at = show(got[idx].item(), want[idx].item()), show(want[idx].item(), got[idx].item()), ""
    if idx:
        at = tr(" at index {idx}", "在索引 {idx} 处", idx=idx)
    return tr("holds {g}{at} where {w} was expected", "{at}是 {g}，而预期是 {w}", g=g, at=at, w=w)


def outcome(observe: Callable, answer: Any, case: Any, want: dict | None = None,
            tol: tuple[float, float] = (0, 0)) -> dict[str, Any]:
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
                if want is not None and (key not in want or not same(value, want[key], *tol)):
                    seen.close()
                    break
            return facts
    except Incorrect as exc:
        facts["incorrect"] = str(exc)
        return facts
    except NotAttempted:  # the observer found nothing to check yet (an unfinished body run elsewhere)
        raise
    except NotImplementedError as exc:
        if _is_stub(exc):
            raise NotAttempted(stub_message()) from None
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


def text_of(x: Any, how: Callable[[Any], str] = str) -> str:
    """``str(x)`` (or `how`), or a stand-in when the learner's object cannot give one (its method raises)."""
    try:
        return how(x)
    except Exception:
        return tr("<{name} that cannot be shown>", "<无法显示的 {name}>", name=type(x).__name__)


def first_diff(got: dict, want: dict, rtol: float, atol: float) -> str | None:
    """The first fact where `got` differs from `want` (an error or a form problem where it stopped)."""
    extra = [k for k in got if k not in want]  # "error" or "incorrect", where observing stopped
    for key, w in want.items():
        if key not in got or not same(got[key], w, rtol, atol):
            return extra[0] if extra and key not in got else key
    return extra[0] if extra else None


MAX_SAID = 300  # the most characters of an exception's message a verdict quotes


def learners_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of `exc`'s traceback that runs the learner's code (``learners_code``: not the
    standard library, torch, another installed package or the course's own), or None if none does."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        if learners_code(tb.tb_frame):
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    return traceback.extract_tb(found, limit=1)[0]


def explain_exception(exc: BaseException) -> str:
    """What the learner's code raised (its message cut to MAX_SAID characters), and on which of its
    lines."""
    where, fr = "", learners_frame(exc)
    if fr is not None:
        line = (fr.line or "").strip()
        line = line if len(line) <= 120 else line[:110] + " ..."
        where = tr(" (line {lineno}: `{line}`)", "（第 {lineno} 行：`{line}`）", lineno=fr.lineno, line=line)
    said = text_of(exc)
    said = said if len(said) <= MAX_SAID else said[:MAX_SAID] + tr(" ... (cut)", " ……（已截断）")
    return tr("your code raised {name}: {said}{where}. Fix that error first, then check again.",
              "你的代码抛出了 {name}: {said}{where}。请先修正这个错误，再检查。",
              name=type(exc).__name__, said=said, where=where)
