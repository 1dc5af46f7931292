"""Learntools-style exercises (``q1.check(answer)``, ``q1.hint()``, ``q1.solution()``): an exercise
is declared once (:class:`Exercise`: its code in ``chNN.py``, its words in ``chNN.en.toml``) and
judged here, on every case, against its model answer and its declared mistakes.

The rest of the engine, by what each module decides: ``forms`` (the answer forms a check accepts),
``compare`` (what an answer did and how it differs), ``time_limit`` (what stops a learner's endless
loop), ``state`` (what a check puts back), ``display`` (what the learner sees, and the hooks called
after every check: progress recording). Their public names are importable from here too.
"""

import functools
import inspect
import textwrap
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..i18n import language, tr
from .compare import (
    MAX_SAID,
    explain_exception,
    first_diff,
    learners_frame,
    outcome,
    same,
    show,
    tensor_diff,
    text_of,
)
from .display import CheckResult, ExerciseView, Text
from .forms import (
    MAX_ITEMS,
    Incorrect,
    NotAttempted,
    as_ints,
    as_number,
    as_tensor,
    copy_answer,
    kind,
    take,
)
from .state import untouched
from .time_limit import MAX_STRETCH, LearnerThread, TimeUp, bounded, learners_code

__all__ = [
    "MAX_ITEMS", "MAX_STRETCH", "TIME_LIMIT_S", "CheckResult", "Exercise", "Incorrect",
    "LearnerThread", "NotAttempted", "Text", "TimeUp", "as_ints", "as_number", "as_tensor", "kind",
    "learners_code", "take", "untouched", "variant",
]

TIME_LIMIT_S = 5.0  # the longest a check may take, learner's code included


def _check_failed(why: object) -> str:
    """What a learner is told when the check's own code failed with `why`."""
    return tr("the check itself failed ({why}), not your answer: restart the kernel (Kernel > Restart), "
              "run the cells again, then check again. If it fails again after a restart, please report it.",
              "检查程序本身出错了（{why}），不是你的答案的问题：请重启内核（Kernel > Restart），"
              "重新运行各个单元格，然后再检查。如果重启后仍然出错，请报告这个问题。", why=why)


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



_WORDS = ("prompt", "hints", "reasons")  # an exercise's words, read in the course's language when used


class _CheckFailed(Exception):
    """The checker's own code failed (its model answer did): not the learner's answer."""


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
class Exercise(ExerciseView):
    """One exercise: its code here, its words in the chapter's ``.en.toml`` (CONTRIBUTING.md,
    Exercises). It declares and judges (:meth:`judge`); ``check``, ``hint`` and ``solution`` are the
    learner's side (``display.ExerciseView``)."""

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

    def __post_init__(self) -> None:
        # the words given here are kept; the others come from the words file, in the language of the moment
        given = functools.partial(object.__getattribute__, self)
        self._given = {name: bool(given(name)) for name in _WORDS}
        self._lang = None
        self.hints = list(given("hints"))
        self.words()
        if self.reasons.keys() != self.mistakes.keys() or not self.prompt or not self.hints:
            raise ValueError(
                f"{self.model_answer.__module__} {self.name}: the words file must give a prompt, "
                f"hints, and a reason for each mistake {sorted(self.mistakes)}"
            )

    def __getattribute__(self, name: str) -> Any:
        if name in _WORDS:  # whoever reads them (a check, a hint, the instructor's guide) gets today's language
            object.__getattribute__(self, "words")()
        return object.__getattribute__(self, name)

    def words(self) -> None:
        """Prompt, hints and reasons in the course's language now (read again when COURSE_LANG changed
        since they were last shown: a session that switches language gets one language, not a mix)."""
        lang = language()
        if lang == self._lang:
            return
        words = _words_of(self.model_answer.__module__, self.name)
        if not self._given["prompt"]:
            self.prompt = words.get("prompt", "")
        if not self._given["hints"]:
            self.hints = list(words.get("hints", []))
        if not self._given["reasons"]:
            self.reasons = dict(words.get("mistakes", {}) or {k: k for k in self.mistakes})
        self._lang = lang

    def judge(self, answer: Any) -> tuple[str, str]:
        """(status, why) of the learner's answer: "correct" (why: ""), "incorrect", "not_attempted", or
        "check_failed" when the checker's own code failed (no line of the learner's code in the
        error: the answer is not to blame). Never raises; returns within about TIME_LIMIT_S seconds."""
        self.words()
        try:
            if answer is None or answer is Ellipsis or (isinstance(answer, str) and answer == ""):
                raise NotAttempted(tr("replace the `...` placeholder with your answer, then run this cell again.",
                                      "请把占位符 `...` 换成你的答案，然后重新运行这个单元格。"))
            with untouched():
                torch.set_num_threads(1)  # tiny inputs: faster, and steady on a busy machine
                self._judge(answer)
            return "correct", ""
        except NotAttempted as exc:
            return "not_attempted", str(exc)
        except Incorrect as exc:
            return "incorrect", str(exc)
        except TimeUp:
            limit = TIME_LIMIT_S + self.extra_time_s
            return "incorrect", tr(
                "your code did not finish within {limit:g} seconds (an endless loop, a sleep, or an endless "
                "iterator?). Make it finish, then check again.",
                "你的代码没有在 {limit:g} 秒内结束（无限循环、sleep，还是无尽的迭代器？）。让它能够结束，然后再检查。",
                limit=limit,
            )
        except _CheckFailed as exc:
            return "check_failed", _check_failed(exc)
        except (Exception, SystemExit) as exc:  # a check must never crash the notebook
            if learners_frame(exc) is not None:
                return "incorrect", explain_exception(exc)
            said = f"{type(exc).__name__}: {text_of(exc)}"
            shortened = said if len(said) <= MAX_SAID else said[:MAX_SAID] + " ..."
            return "check_failed", _check_failed(shortened)

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
            raise Incorrect(tr("pass your function itself, {call} (without calling it), not {it}.",
                               "请传入函数本身，{call}（不要调用它），而不是{it}。", call=call, it=it))
        if isinstance(base, type) and not (isinstance(answer, type) and issubclass(answer, base)):
            why = tr("pass the class itself, {call} (no parentheses), a subclass of {name}; this is {it}.",
                     "请传入类本身，{call}（不带括号），它应是 {name} 的子类；这里传入的是{it}。",
                     call=call, name=base.__name__, it=it)
            raise Incorrect(why)
        # only the learner's code counts against the limit
        budget, tol = TIME_LIMIT_S + self.extra_time_s, self.tol
        for i in range(len(self.cases())):
            want = outcome(self.observe, self.reference(), self._case(i))
            if "error" in want or "incorrect" in want:  # (a kernel left broken, or a bug of the checker)
                raise _CheckFailed(tr("on its model answer: {s}", "在它自己的参考答案上：{s}", s=str(want)[:MAX_SAID]))
            mine = copy_answer(answer) if self.form == "value" else answer
            observe = functools.partial(outcome, self.observe, mine, self._case(i), want, tol)
            got, used = bounded(observe, max(budget, 0.01))
            budget -= used
            key = first_diff(got, want, *tol)
            if key is None:
                continue
            for name, mistake in self.mistakes.items():
                seen = outcome(self.observe, mistake, self._case(i), want, tol)
                if first_diff(seen, want, *tol) == key and same(seen[key], got[key], *tol):
                    raise Incorrect(self.reasons[name])
            raise Incorrect(self._explain(self._case(i), key, got[key], want.get(key)))

    def _explain(self, case, key, got, want):
        if key in ("incorrect", "error"):
            return got if key == "incorrect" else explain_exception(got)
        if key == "result" and self.form == "value":
            return tr("{show} is not right. {hints}", "{show} 不对。{hints}", show=show(got, want), hints=self.hints[0])
        where, tol = self.describe(case), self.tol
        if where:
            # a sentence's first letter in capitals (a Chinese one is left as it is)
            where = tr("{where}, ", "{where}，", where=where[:1].upper() + where[1:])
        if key == "result":
            name = self.model_answer.__name__
            key = tr("what `{name}` returns", "`{name}` 的返回值", name=name)
        while all(isinstance(x, list | tuple) for x in (got, want)) and len(got) == len(want):
            if not any(isinstance(w, torch.Tensor) for w in want):
                break  # point at the first tensor that differs
            i = next(i for i, p in enumerate(zip(got, want, strict=True)) if not same(*p, *tol))
            key, got, want = tr("{key} (item {i})", "{key}（下标为 {i} 的一项）", key=key, i=i), got[i], want[i]
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            diff = tensor_diff(got, want)
            return tr("{where}{key} {diff}.", "{where}{key}{diff}。", where=where, key=key, diff=diff)
        return tr("{where}{key} is {show}, but it should be {show2}.", "{where}{key}是{show}，但应该是{show2}。",
                  where=where, key=key, show=show(got, want), show2=show(want, got))
