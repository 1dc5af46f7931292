"""The instructor guide's generated parts, built from the exercises so that they cannot drift.

    python -m tools.workshop           # rewrite the generated sections and the answer key
    python -m tools.workshop --check   # exit 1, naming each stale file or section

The chapter pages in ``docs/instructor/`` are written by hand, except what lies between
``<!-- generated: NAME (python -m tools.workshop) -->`` and ``<!-- end generated -->``:

- ``stuck``, in each chapter page: for every exercise of the chapter, its prompt, each declared
  mistake with the reason the checker gives for it, and the hints in the order ``q.hint()`` gives
  them (all read from ``course_utils/exercises/chNN.py`` and ``chNN.en.toml``);
- ``selfstudy``, in each chapter page: the chapter's core path against its slot (words, reading and
  exercise minutes, from ``tools/corepath.py``) and its deep dives, which the slides skip, as
  self-study, each with the core section it follows and its reading time;
- ``answer-key.md``, whole: every exercise's prompt and the source that ``q.solution()`` shows.

Importing the exercises imports torch and builds a few small models; nothing is run, no process is
started.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from course_utils import ROOT, inventory
from tools import corepath

NOTEBOOKS = ROOT / "notebooks"
GUIDE = ROOT / "docs" / "instructor"
ANSWER_KEY = GUIDE / "answer-key.md"
COMMAND = "python -m tools.workshop"
END = "<!-- end generated -->"


def begin(name: str) -> str:
    return f"<!-- generated: {name} ({COMMAND}) -->"


def notebooks() -> list[Path]:
    """The chapters' notebooks, in order (``course_utils.inventory``)."""
    return inventory.notebooks_in(NOTEBOOKS)


def page(notebook: Path) -> Path:
    """A chapter's page in the guide: ``docs/instructor/NN_topic.md``."""
    return GUIDE / f"{notebook.stem}.md"


def title(notebook: Path) -> str:
    """The notebook's title, from its first line (``# 01 · Autograd and the dynamic graph``)."""
    cell = json.loads(notebook.read_text(encoding="utf-8"))["cells"][0]
    return "".join(cell["source"]).splitlines()[0].lstrip("# ").strip()


def exercises(notebook: Path) -> list[tuple[str, Any]]:
    """``(variable, exercise)`` for each exercise of the chapter, in its ``EXERCISES`` order; the
    variable is the name the notebook imports (``q1``...), as ``course_utils.inventory`` lists it."""
    chapter = inventory.chapter(notebook.name)
    if not chapter.exercises:
        return []
    module = importlib.import_module(chapter.exercise_module)
    return [(name, getattr(module, name)) for name in chapter.exercises]


_CODE = re.compile(r"(`+).+?\1")  # a code span, left as it is
# outside code spans: a backslash, a star, an underscore not inside a word (``__init__``, not
# ``grad_output``), and a ``<`` that would open an HTML tag
_ACTIVE = re.compile(r"[\\*]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|<(?=[A-Za-z/!?])")


def _line(text: str) -> str:
    """Plain words (a prompt, a hint, a reason) as one line of Markdown that shows them as written:
    ``x**2``, ``__init__`` or ``<module>`` outside backticks are not emphasis or HTML."""
    text, out, at = " ".join(str(text).split()), [], 0
    for m in [*_CODE.finditer(text), None]:
        end = m.start() if m else len(text)
        out.append(_ACTIVE.sub(r"\\\g<0>", text[at:end]))
        if m:
            out.append(m.group(0))
            at = m.end()
    return "".join(out)


def _cell(text: str) -> str:
    """Text that fits in one cell of a Markdown table."""
    return _line(text).replace("|", "\\|")


def _looks_like(mistake: Any) -> str:
    """How a declared mistake reads: the wrong value itself when short, else the kind of answer."""
    import torch

    if isinstance(mistake, bool | int | float):
        return f"`{mistake!r}`"
    if isinstance(mistake, torch.Tensor) and mistake.numel() <= 12:
        return f"`tensor({mistake.tolist()})`"
    short = isinstance(mistake, list | tuple) and len(mistake) <= 12
    if short and all(isinstance(v, int | float) for v in mistake):
        return f"`{mistake!r}`"
    members = vars(mistake).values() if isinstance(mistake, type) else [mistake]
    functions = [getattr(m, "__func__", m) for m in members]  # a staticmethod's function too
    if any(_slipped(f) for f in functions):
        return "the solution with one slip"
    if isinstance(mistake, type):
        return "a class"
    return "a function" if callable(mistake) else "a value"


def _slipped(function: Any) -> bool:
    """Whether `function` was made by ``core.variant()``: the model answer's source with a slip."""
    code = getattr(function, "__code__", None)
    return code is not None and code.co_filename.endswith(", with a mistake>")


def stuck(notebook: Path) -> str:
    """The ``stuck`` section of a chapter page: per exercise, its prompt, its declared mistakes with
    the checker's reasons, and its hints."""
    found = exercises(notebook)
    if not found:
        return "This chapter has no checked exercises.\n"
    parts = [
        "What the checker answers to each mistake it knows, word for word, and the hints in order. "
        "An answer that matches none of them gets the input, the expected value and what came "
        "back.\n"
    ]
    for var, q in found:
        parts.append(f"### `{var}` · {q.name}\n")
        parts.append(f"{_line(q.prompt)}\n")
        if q.mistakes:
            rows = ["| declared mistake | looks like | what the checker says |",
                    "| --- | --- | --- |"]
            for name, mistake in q.mistakes.items():
                rows.append(f"| `{name}` | {_looks_like(mistake)} | {_cell(q.reasons[name])} |")
            parts.append("\n".join(rows) + "\n")
        else:
            parts.append("No declared mistakes: a wrong answer gets the input, the expected value "
                         "and what came back.\n")
        hints = "\n".join(f"{i}. {_line(h)}" for i, h in enumerate(q.hints, 1))
        parts.append(f"Hints, in the order `{var}.hint()` gives them:\n\n{hints}\n")
    return "\n".join(parts)


def selfstudy(notebook: Path) -> str:
    """The ``selfstudy`` section of a chapter page: the core path against the slot, and the deep dives."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    b = corepath.budget(notebook)
    wpm = corepath.WORDS_PER_MINUTE
    reading = f"about {{:.0f}} min of reading at {wpm} words a minute, plus {b.exercises} min of exercises"
    if b.slot == 0:  # not in the workshop's day
        words = b.words + b.deep_words
        parts = [f"The whole chapter is self-study: the workshop does not teach it. {words:,} words, "
                 f"{reading.format(words / wpm)}.\n"]
    else:
        over = ("" if b.fits else " That is over the slot: the timed plan above says what to skim, until the "
                "chapter's longer material moves into deep dives.")
        parts = [f"The core path (what the slides show): {b.words:,} words, {reading.format(b.reading)}: "
                 f"{b.minutes} of the {b.slot}-min slot.{over}\n"]
    rows, after = [], ""
    for section in corepath.sections(nb):
        if section.deep:
            title = section.title.removeprefix(corepath.HEADING[3:])
            minutes = max(1, round(section.words / wpm))
            rows.append(f"| {_cell(title)} | {_cell(after)} | {section.words:,} | {minutes} |")
        elif section.title:
            after = section.title
    if not rows:
        parts.append("This chapter has no deep dives.\n")
        return "\n".join(parts)
    parts.append(
        "The deep dives are self-study: the slides skip them, and the timed plan above leaves them out. "
        "Point learners to them after the section they follow, for after the workshop or for those who "
        "finish early. In the notebook each opens with a `## Deep dive:` heading, and every cell of it "
        f"carries the cell tag `{corepath.TAG}`.\n"
    )
    head = ["| deep dive | after the section | words | reading (min) |", "| --- | --- | --- | --- |"]
    parts.append("\n".join(head + rows) + "\n")
    return "\n".join(parts)


def answer_key() -> str:
    """``answer-key.md``: per chapter and exercise, the prompt and what ``q.solution()`` shows."""
    parts = [
        "# Answer key\n",
        f"<!-- generated by `{COMMAND}` from the exercises: do not edit by hand -->\n",
        "The repository is public, so this key is a convenience for instructors, not a secret.\n",
        "Each solution is exactly what `q.solution()` shows a learner: the source of the model "
        "answer that the checker itself runs. Other correct answers pass too: the checker compares "
        "what answers do, not their text.\n",
    ]
    for nb in notebooks():
        notes = page(nb).name
        parts.append(f"## {title(nb)}\n\nThe chapter's notes: [{notes}]({notes}).\n")
        found = exercises(nb)
        if not found:
            parts.append("No checked exercises.\n")
        for var, q in found:
            code = q.solution().body  # the very text a learner sees
            parts.append(f"### `{var}` · {q.name}\n\n{_line(q.prompt)}\n\n```python\n{code}\n```\n")
    return "\n".join(parts)


SECTIONS = {"stuck": stuck, "selfstudy": selfstudy}  # the generated sections of every chapter page


def _span(text: str, name: str) -> tuple[int, int] | None:
    """Where the body of section `name` lies in `text` (between its two markers), or None."""
    start = text.find(begin(name))
    if start < 0:
        return None
    body = start + len(begin(name))
    end = text.find(END, body)
    return None if end < 0 else (body, end)


def with_section(text: str, name: str, body: str) -> str:
    """`text` with the body of its section `name` replaced by `body`."""
    span = _span(text, name)
    if span is None:
        raise ValueError(f"no section {name!r}: add the lines {begin(name)} and {END}")
    return text[: span[0]] + "\n" + body.strip("\n") + "\n" + text[span[1] :]


def expected() -> tuple[dict[Path, str], list[str]]:
    """What every generated file should hold now, and what keeps a file from being built."""
    files, problems = {}, []
    for nb in notebooks():
        path = page(nb)
        if not path.exists():
            problems.append(f"{_rel(path)}: missing (the guide has one page per notebook)")
            continue
        text = path.read_text(encoding="utf-8")
        for name, build in SECTIONS.items():
            try:
                text = with_section(text, name, build(nb))
            except ValueError as exc:
                problems.append(f"{_rel(path)}: {exc}")
        files[path] = text
    files[ANSWER_KEY] = answer_key()
    return files, problems


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def stale() -> list[str]:
    """One line per generated file or section that differs from what the exercises give now."""
    files, problems = expected()
    for path, text in files.items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        if path == ANSWER_KEY:
            problems.append(f"{_rel(path)}: {'missing' if old is None else 'stale'}")
            continue
        for name in SECTIONS:
            old_span, new_span = _span(old, name), _span(text, name)
            if old_span and new_span and old[slice(*old_span)] != text[slice(*new_span)]:
                problems.append(f"{_rel(path)}: section {name!r} is stale")
    return problems


def write() -> list[Path]:
    """Rewrite every generated section and the answer key; returns the files that changed."""
    files, problems = expected()
    if problems:
        raise SystemExit("\n".join(problems))
    changed = []
    for path, text in files.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1, naming each stale file or section")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print(f"run `{COMMAND}` to rewrite them", file=sys.stderr)
            return 1
        print("the instructor guide's generated parts are current")
        return 0
    changed = write()
    for path in changed:
        print(f"rewrote {_rel(path)}")
    if not changed:
        print("nothing to rewrite: the instructor guide's generated parts are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
