"""The answer forms a check accepts, and the clear ``Incorrect`` it gives for any other: a number
(:func:`as_number`), a list of whole numbers (:func:`as_ints`, :func:`take`), a tensor
(:func:`as_tensor`); how an answer reads to a learner (:func:`kind`). CONTRIBUTING.md's "answer-form
rule" says what each accepts. The chapters' ``observe`` functions use them (``exercises/chNN.py``)."""

import inspect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..i18n import tr

MAX_ITEMS = 1000  # the most items a check takes from an iterable answer


class Incorrect(Exception):
    """The answer is wrong, and the message says why."""


class NotAttempted(Exception):
    """There is nothing to check yet."""




def kind(x: Any) -> str:
    """How an answer reads to a learner: "a tensor of shape (3,)", "a function", "a list"... (in Chinese
    形状为 (3,) 的张量, 一个函数, 一个列表...: a field of a :func:`tr` template, which spaces it)."""
    if isinstance(x, torch.Tensor):
        return tr("a tensor of shape {shape}", "形状为 {shape} 的张量", shape=tuple(x.shape))
    if isinstance(x, type):
        return tr("the class {name}", "类 {name}", name=x.__name__)
    if inspect.isroutine(x):
        return tr("a function", "一个函数")
    name = type(x).__name__
    if x is None:
        return tr("a NoneType", "None")
    known = {  # Python's own types as the Chinese edition names them
        "list": tr("a list", "一个列表"), "tuple": tr("a tuple", "一个元组"), "dict": tr("a dict", "一个字典"),
        "set": tr("a set", "一个集合"), "str": tr("a str", "一个字符串"), "bytes": tr("a bytes", "一个 bytes 对象"),
        "int": tr("an int", "一个整数"), "float": tr("a float", "一个浮点数"), "bool": tr("a bool", "一个布尔值"),
        "complex": tr("a complex", "一个复数"), "ndarray": tr("an ndarray", "一个 numpy 数组"),
        "generator": tr("a generator", "一个生成器"), "range": tr("a range", "一个 range 对象"),
    }
    if name in known:
        return known[name]
    if name[:1] in "aeiouAEIOU":  # any other type keeps its name: "an Item", 一个 Item
        return tr("an {name}", "一个{name}", name=name)
    return tr("a {name}", "一个{name}", name=name)


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
        number = tr("whole number", "整数") if whole else tr("number", "数")
        raise Incorrect(tr("{what} should be a {number}, but it is {kind}.", "{what}应该是一个{number}，但它是{kind}。",
                           what=what, number=number, kind=kind(x)))
    if whole and isinstance(x, float) and not x.is_integer():
        raise Incorrect(tr("{what} should be a whole number, but it is {x!r}.", "{what}应该是一个整数，但它是{x!r}。",
                           what=what, x=x))
    return int(x) if whole else float(x)


def as_ints(x: Any, what: str | None = None) -> list[int]:
    """Whole numbers from a finite iterable (list, tuple, range, 1-D tensor or array, generator); at most
    ``MAX_ITEMS + 1`` are taken, so an endless iterator ends up as too long a list."""
    what = _your_answer(what)
    listlike = isinstance(x, Iterator | Sequence) and not isinstance(x, str | bytes)
    if not (x.ndim == 1 if isinstance(x, torch.Tensor | np.ndarray) else listlike):
        raise Incorrect(tr("{what} should be a list of whole numbers, but it is {kind}.",
                           "{what}应该是一个由整数组成的列表，但它是{kind}。", what=what, kind=kind(x)))
    each = tr("each entry of {what}", "{what}的每一项", what=what)
    return [as_number(i, each, whole=True) for i in take(x)]


def take(x: Any, n: int = MAX_ITEMS + 1) -> list[Any]:
    """At most `n` items of an iterable (never iterating a whole huge tensor, or an endless iterator)."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return list(x[:n]) if x.ndim else [x]
    try:
        return list(itertools.islice(iter(x), n))
    except TypeError:
        raise Incorrect(tr("this should be a list, but it is {kind}.", "这里应该是一个列表，但它是{kind}。",
                           kind=kind(x))) from None


def as_tensor(x: Any, what: str | None = None) -> torch.Tensor:
    """The answer itself, detached, if it is a tensor; a clear Incorrect if it is not."""
    what = _your_answer(what)
    if not isinstance(x, torch.Tensor):
        tip = {
            "ndarray": tr(" `torch.from_numpy(a)` turns a numpy array into one.",
                          "`torch.from_numpy(a)` 可以把 numpy 数组变成张量。"),
            "list": tr(" `torch.tensor(...)` turns a list into one.", "`torch.tensor(...)` 可以把列表变成张量。"),
        }.get(type(x).__name__, "")
        raise Incorrect(tr("{what} should be a torch.Tensor, but it is {kind}.{tip}",
                           "{what}应该是一个 torch.Tensor，但它是{kind}。{tip}", what=what, kind=kind(x), tip=tip))
    return x.detach()


def copy_answer(x: Any) -> Any:
    """A copy of a learner's value to work on, so that a check never modifies the learner's object."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if x.numel() <= 10**6 else x.detach()
    if isinstance(x, list | tuple):
        return type(x)(copy_answer(i) for i in x) if len(x) <= MAX_ITEMS else x
    return x

