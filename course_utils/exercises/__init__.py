"""Exercises with instant feedback, one module per chapter (``ch00``, ``ch01``, ...).

In a notebook::

    from course_utils.exercises.ch01 import q1, q2
    q1.check(my_answer)   # Correct / Incorrect (with a reason) / Not attempted yet
    q1.hint()             # the next hint
    q1.solution()         # a worked solution
"""

from __future__ import annotations

import importlib
import pkgutil

from .core import (
    CheckResult,
    Exercise,
    Incorrect,
    NotAttempted,
    as_ints,
    as_number,
    as_tensor,
    untouched,
    variant,
)

__all__ = ["CheckResult", "Exercise", "Incorrect", "NotAttempted", "all_exercises", "as_ints", "as_number",
           "as_tensor", "untouched", "variant"]


def all_exercises() -> dict[str, list[Exercise]]:
    """Every chapter module's ``EXERCISES``, keyed by module name (used by the tests)."""
    found: dict[str, list[Exercise]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("ch"):
            mod = importlib.import_module(f"{__name__}.{info.name}")
            found[info.name] = list(getattr(mod, "EXERCISES", []))
    return found
