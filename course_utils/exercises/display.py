"""What a learner sees of an exercise: ``q1.check(answer)`` as a coloured box (:class:`CheckResult`),
``q1.hint()`` and ``q1.solution()`` (:class:`Text`), each in plain text in a terminal. The
learner-facing methods are :class:`ExerciseView`'s, which ``core.Exercise`` takes on; after every
check it calls the hooks in :data:`CHECK_HOOKS` (the first records the learner's progress, see
``course_utils.progress``), as learntools keeps showing and tracking apart from checking."""

import html
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import progress
from ..i18n import tr

_STYLE = {  # (text colour, background)
    "correct": ("#1b7f3a", "#e8f5ec"),
    "incorrect": ("#b3261e", "#fdecea"),
    "not_attempted": ("#6b5900", "#fff8e1"),
    "check_failed": ("#4a4a4a", "#f0f0f0"),  # the checker's fault: not recorded
}


def label(status: str) -> str:
    return {
        "correct": tr("Correct", "正确"),
        "incorrect": tr("Incorrect", "不正确"),
        "not_attempted": tr("Not attempted yet", "尚未作答"),
        "check_failed": tr("The check failed", "检查出错"),
    }[status]


def title(name: str) -> str:
    """An exercise's name as shown: ``Q1``, or chapter 00's ``Practice`` (练习 in Chinese; Q1... stay)."""
    return tr("Practice", "练习") if name == "Practice" else name


@dataclass(frozen=True)
class CheckResult:
    """What a check found. Prints as plain text, shows as a coloured box in Jupyter."""

    exercise: str
    status: str  # "correct" | "incorrect" | "not_attempted" | "check_failed"
    message: str

    def __bool__(self) -> bool:
        return self.status == "correct"

    correct = property(__bool__)

    def __repr__(self) -> str:
        return f"[{title(self.exercise)}] {label(self.status)}{tr(': ', '：')}{self.message}"

    def _repr_html_(self) -> str:
        fg, bg = _STYLE[self.status]
        msg = html.escape(self.message).replace("\n", "<br>")
        name = html.escape(title(self.exercise))
        return (
            f'<div style="border-left:4px solid {fg};background:{bg};padding:6px 10px">'
            f'<b style="color:{fg}">{name} · {label(self.status)}</b>{tr(": ", "：")}{msg}</div>'
        )


@dataclass(frozen=True)
class Text:
    """A hint or a solution: plain text in a terminal, formatted in Jupyter."""

    title: str
    body: str
    code: bool = False

    def __repr__(self) -> str:
        return f"{self.title}\n{self.body}"

    def _repr_html_(self) -> str:
        body = html.escape(self.body)
        inner = f"<pre>{body}</pre>" if self.code else f"<div>{body}</div>"
        return (f'<div style="border-left:4px solid #3465a4;padding:6px 10px">'
                f"<b>{html.escape(self.title)}</b>{inner}</div>")


def record_progress(chapter: str, exercise: str, status: str) -> None:
    """The first hook: the check saved on this computer, when the learner turned recording on
    (``progress.record`` never raises). A check that failed itself says nothing of the learner's
    answer: it is not recorded."""
    if status in progress.STATUSES:
        progress.record(chapter, exercise, status)


# Called after every check with (chapter "ch01", exercise "Q1", status); a hook that fails is ignored.
CHECK_HOOKS: list[Callable[[str, str, str], None]] = [record_progress]


class ExerciseView:
    """The learner's side of an exercise: check, hint, solution. Needs ``name``, ``hints``,
    ``model_answer`` and ``judge(answer) -> (status, message)`` (``core.Exercise``)."""

    name: str
    hints: Any
    model_answer: Callable[..., Any]
    hints_shown = 0  # hints asked for so far: a correct answer then reads "well done (with hints)"

    def judge(self, answer: Any) -> tuple[str, str]:
        raise NotImplementedError

    def words(self) -> None:
        """Bring ``hints`` (and the other words) to the course's language of the moment."""

    def check(self, answer: Any = Ellipsis) -> CheckResult:
        """Check the learner's answer; never raises, returns within about TIME_LIMIT_S seconds."""
        status, message = self.judge(answer)
        if status == "correct":
            message = (tr("well done (with hints).", "做得好（用了提示）。") if self.hints_shown
                       else tr("well done.", "做得好。"))
        chapter = self.model_answer.__module__.rpartition(".")[2]
        for hook in CHECK_HOOKS:
            try:
                hook(chapter, self.name, status)
            except Exception:  # a hook never costs the learner their verdict
                pass
        return CheckResult(self.name, status, message)

    def hint(self, number: int | None = None) -> Text:
        """Show the next hint (or hint `number`, counting from 1)."""
        self.words()
        n = len(self.hints)
        if number is None:
            self.hints_shown = number = min(self.hints_shown + 1, n)
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= n:
            return Text(tr("{name}: there are {n} hints", "{name}：共有 {n} 条提示", name=title(self.name), n=n),
                        tr("Ask for hint 1 to {n}.", "请查看第 1 到第 {n} 条提示。", n=n))
        return Text(tr("{name} · hint {number}/{n}", "{name} · 提示 {number}/{n}", name=title(self.name), number=number,
                       n=n),
                    self.hints[number - 1])

    def solution(self) -> Text:
        """Show the worked solution: the source of the tested solution function."""
        code = textwrap.dedent(inspect.getsource(self.model_answer)).strip("\n")
        return Text(tr("{name} · solution", "{name} · 参考答案", name=title(self.name)), code, code=True)
