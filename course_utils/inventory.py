"""What the course is made of: its chapters (notebook, helper module, exercise module, the notebook's
exercise variables, whether it starts processes) and the scripts the chapters launch, with their
normal arguments.

Plain literals and the standard library only: ``tasks.py`` reads this before ``.venv`` exists, with
any Python 3.11+. Everything that needs the list of chapters or scripts reads it here (progress, the
instructor guide, the slides, the translation tool, the book, the test lanes, the tests);
``tests/test_inventory.py`` ties it to the files on disk and to each script's docstring command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EDITIONS = {"en": "notebooks", "zh-CN": "notebooks-zh"}  # language -> the folder of its notebooks


@dataclass(frozen=True)
class Chapter:
    """One chapter: ``notebooks/{number}_{topic}.ipynb``, ``course_utils/ch{number}_{topic}.py``
    (with its parts, ``course_utils/ch{number}_{part}.py``, whose names it re-exports) and
    ``course_utils/exercises/ch{number}.py`` (with its parts, ``exercises/ch{number}_{part}.py``)."""

    number: str  # "04"
    topic: str  # "distributed"
    exercises: tuple[str, ...]  # the notebook's variables, in the order of the module's EXERCISES
    starts_processes: bool = False  # DataLoader workers, mp.spawn or torchrun: the spawn lane runs it
    scripts: tuple[str, ...] = ()  # the scripts of notebooks/scripts/ it launches
    parts: tuple[str, ...] = ()  # the modules its helper module is split into, named after the chapter
    exercise_parts: tuple[str, ...] = ()  # the same for its exercise module

    @property
    def stem(self) -> str:
        return f"{self.number}_{self.topic}"

    @property
    def notebook(self) -> str:
        return f"{self.stem}.ipynb"

    @property
    def key(self) -> str:
        """The chapter's short name, as progress records and the exercise modules know it: "ch04"."""
        return f"ch{self.number}"

    @property
    def helper_module(self) -> str:
        return f"course_utils.ch{self.stem}"

    @property
    def part_modules(self) -> tuple[str, ...]:
        """The helper module's parts: ``course_utils.ch01_graph``, ..."""
        return tuple(f"course_utils.{self.key}_{part}" for part in self.parts)

    @property
    def exercise_module(self) -> str:
        return f"course_utils.exercises.{self.key}"

    @property
    def exercise_part_modules(self) -> tuple[str, ...]:
        """The exercise module's parts: ``course_utils.exercises.ch01_walks``, ..."""
        return tuple(f"course_utils.exercises.{self.key}_{part}" for part in self.exercise_parts)


@dataclass(frozen=True)
class Script:
    """A script of ``notebooks/scripts/`` in its normal mode, as its docstring's command runs it from
    ``notebooks/``: ``nproc`` ranks through torchrun (0: a plain ``python SCRIPT``), ``args`` with
    ``{out}`` standing for a fresh folder."""

    name: str
    nproc: int
    args: tuple[str, ...] = ()


CHAPTERS = (
    Chapter("00", "start_here", ("q1",)),
    Chapter("01", "autograd", ("q1", "q2", "q3", "q4", "q5", "q6"), parts=("graph", "drawing"),
            exercise_parts=("walks",)),
    Chapter("02", "nn_module", ("q1", "q2", "q3", "q4", "q5"), parts=("mini",)),
    Chapter("03", "data_loading", ("q1", "q2", "q3", "q4", "q5", "q6"), starts_processes=True,
            parts=("batches", "throughput")),
    Chapter("04", "distributed", ("q1", "q2", "q3", "q4"), starts_processes=True,
            scripts=("hello_dist.py", "collectives.py", "sampler_demo.py", "ddp_digits.py",
                     "ddp_equals_big_batch.py", "fsdp_demo.py", "spawn_demo.py")),
    Chapter("05", "full_pipeline", ("q1", "q2", "q3", "q4"), starts_processes=True,
            scripts=("train.py",), parts=("config", "checkpoints")),
    Chapter("06", "pitfalls", ("q1", "q2", "q3", "q4", "q5"), starts_processes=True,
            scripts=("pitfall_rank0_eval.py", "collective_mismatch.py"), parts=("training",)),
    Chapter("07", "parallelism", ("q1", "q2", "q3", "q4"), starts_processes=True,
            scripts=("tensor_parallel.py", "pipeline_parallel.py", "mesh_2d.py", "comm_overlap.py",
                     "stragglers.py", "fsdp2_in_depth.py"), parts=("schedules", "figures")),
)

SCRIPTS = (
    Script("hello_dist.py", 2),
    Script("collectives.py", 2),
    Script("sampler_demo.py", 2),
    Script("ddp_digits.py", 2, ("--epochs", "10")),
    Script("ddp_equals_big_batch.py", 2, ("--out", "{out}")),
    Script("fsdp_demo.py", 2, ("--ckpt", "{out}/ckpt")),
    Script("pitfall_rank0_eval.py", 2),
    Script("collective_mismatch.py", 2, ("--fixed",)),
    Script("spawn_demo.py", 0),
    Script("train.py", 2, ("--out-dir", "{out}")),
    Script("tensor_parallel.py", 2, ("--out", "{out}")),
    Script("pipeline_parallel.py", 2, ("--out", "{out}")),
    Script("mesh_2d.py", 4, ("--out", "{out}")),
    Script("comm_overlap.py", 2, ("--out", "{out}")),
    Script("stragglers.py", 2, ("--out", "{out}")),
    Script("fsdp2_in_depth.py", 2, ("--ckpt", "{out}/ckpt", "--out", "{out}")),
)
# notebooks/scripts/slurm_ddp.sbatch is a batch file, run by the Slurm lane (tests/slurm/).


def chapter(key: str) -> Chapter:
    """The chapter named by its number ("04"), key ("ch04"), stem or notebook file name."""
    for ch in CHAPTERS:
        if key in (ch.number, ch.key, ch.stem, ch.notebook):
            return ch
    raise KeyError(f"no chapter {key!r}; the chapters are {', '.join(ch.stem for ch in CHAPTERS)}")


def notebooks(edition: str = "en") -> list[Path]:
    """The chapters' notebooks of an edition ("en", "zh-CN"), in order (those that exist)."""
    return notebooks_in(ROOT / EDITIONS[edition])


def notebooks_in(folder: Path | str) -> list[Path]:
    """The chapters' notebooks in `folder` (an edition's, or a copy of one), in order (those that
    exist)."""
    return [Path(folder) / ch.notebook for ch in CHAPTERS if (Path(folder) / ch.notebook).exists()]


def script(name: str) -> Script:
    for s in SCRIPTS:
        if s.name == name:
            return s
    raise KeyError(f"no script {name!r}; the scripts are {', '.join(s.name for s in SCRIPTS)}")
