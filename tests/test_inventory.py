"""course_utils.inventory against the files on disk: every chapter's notebook (both editions), helper
module and exercise module exists and nothing else looks like one; each exercise variable is in its
module's EXERCISES, in order; the scripts each notebook's code names are its chapter's; every script
of notebooks/scripts/ is listed, and its docstring's command is its normal mode."""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex

import pytest

from course_utils import ROOT, inventory

SCRIPTS = ROOT / "notebooks" / "scripts"
CHAPTER_IDS = [ch.stem for ch in inventory.CHAPTERS]
# A command of the course's launchers in a docstring, up to the end of its line.
LAUNCHER = re.compile(r"(?:python -m torch\.distributed\.run|torchrun)\s+((?:--[\w-]+[ =]?\S*\s+)*)"
                      r"scripts/([\w]+\.py)(?![\w/])([^\n#`]*)")
PLAIN = re.compile(r"python scripts/([\w]+\.py)(?![\w/])([^\n#`]*)")


def test_every_notebook_and_module_of_a_chapter_exists_and_nothing_else_does():
    for folder in inventory.EDITIONS.values():
        on_disk = sorted(p.name for p in (ROOT / folder).glob("*.ipynb"))
        assert on_disk == sorted(ch.notebook for ch in inventory.CHAPTERS), folder
        assert [p.name for p in inventory.notebooks_in(ROOT / folder)] == [
            ch.notebook for ch in inventory.CHAPTERS]
    helpers = sorted(p.stem for p in (ROOT / "course_utils").glob("ch*.py"))
    assert helpers == sorted(m.rpartition(".")[2] for ch in inventory.CHAPTERS
                             for m in (ch.helper_module, *ch.part_modules))
    exercises = sorted(p.stem for p in (ROOT / "course_utils" / "exercises").glob("ch*.py"))
    assert exercises == sorted(m.rpartition(".")[2] for ch in inventory.CHAPTERS
                               for m in (ch.exercise_module, *ch.exercise_part_modules))
    assert [ch.number for ch in inventory.CHAPTERS] == [f"{i:02d}" for i in range(len(inventory.CHAPTERS))]


@pytest.mark.parametrize("chapter", inventory.CHAPTERS, ids=CHAPTER_IDS)
def test_each_exercise_variable_is_in_the_modules_exercises_in_order(chapter):
    module = importlib.import_module(chapter.exercise_module)
    assert [getattr(module, name, None) for name in chapter.exercises] == list(module.EXERCISES)
    helpers = importlib.import_module(chapter.helper_module)
    for part in map(importlib.import_module, chapter.part_modules):  # a part's names stay the chapter's
        public = [name for name, value in vars(part).items()
                  if not name.startswith("_") and getattr(value, "__module__", None) == part.__name__]
        assert all(getattr(helpers, name, None) is getattr(part, name) for name in public), part.__name__
    assert inventory.chapter(chapter.key) is inventory.chapter(chapter.notebook) is chapter


def _code(notebook: str) -> str:
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("chapter", inventory.CHAPTERS, ids=CHAPTER_IDS)
def test_the_scripts_a_notebook_names_are_its_chapters(chapter):
    named = set(re.findall(r"scripts/(\w+\.py)", _code(chapter.notebook)))
    assert named == set(chapter.scripts)
    starts = bool(re.search(r"torchrun\(|spawn_bounded\(|num_workers=[1-9]|mp\.spawn", _code(
        chapter.notebook)))
    assert starts == chapter.starts_processes


def test_every_script_is_listed_once_and_launched_by_one_chapter():
    on_disk = sorted(p.name for p in SCRIPTS.glob("*.py"))
    assert sorted(s.name for s in inventory.SCRIPTS) == on_disk
    launched = [name for ch in inventory.CHAPTERS for name in ch.scripts]
    assert sorted(launched) == on_disk, "each script belongs to the one chapter that launches it"
    assert all(s.nproc >= 0 for s in inventory.SCRIPTS)


def _matches(args: list[str], wanted: tuple[str, ...]) -> bool:
    """`args` are `wanted`, where "{out}" in `wanted` stands for any path."""
    if len(args) != len(wanted):
        return False
    for arg, want in zip(args, wanted, strict=True):
        pattern = "".join(r"\S+" if part == "{out}" else re.escape(part)
                          for part in re.split(r"(\{out\})", want))
        if not re.fullmatch(pattern, arg):
            return False
    return True


def docstring_commands(name: str) -> list[tuple[int, list[str]]]:
    """The commands of a script's docstring that run it: (processes, arguments); 0 processes for
    a plain ``python scripts/NAME.py``."""
    text = ast.get_docstring(ast.parse((SCRIPTS / name).read_text(encoding="utf-8"))) or ""
    found = []
    for options, script, rest in LAUNCHER.findall(text):
        nproc = re.search(r"--nproc-per-node[ =](\d+)", options)
        if script == name and nproc:
            found.append((int(nproc.group(1)), shlex.split(rest.rstrip(" .,;:)"))))
    found += [(0, shlex.split(rest.rstrip(" .,;:)"))) for script, rest in PLAIN.findall(text)
              if script == name]
    return found


@pytest.mark.parametrize("script", inventory.SCRIPTS, ids=[s.name for s in inventory.SCRIPTS])
def test_each_scripts_docstring_runs_it_in_its_normal_mode(script):
    commands = docstring_commands(script.name)
    assert any(n == script.nproc and _matches(args, script.args) for n, args in commands), (
        f"{script.name}: no docstring command runs it on {script.nproc} process(es) with "
        f"{list(script.args)}; found {commands}")


def test_the_docstring_reader_tells_modes_apart():
    assert _matches(["--ckpt", "/tmp/ckpt"], ("--ckpt", "{out}/ckpt"))
    assert not _matches(["--ckpt", "/tmp/x"], ("--ckpt", "{out}/ckpt"))
    assert not _matches(["--epochs", "3"], ("--epochs", "10"))
    assert (2, ["--epochs", "10"]) in docstring_commands("ddp_digits.py")
    assert (0, []) in docstring_commands("spawn_demo.py")
