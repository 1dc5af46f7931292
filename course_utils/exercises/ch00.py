"""Chapter 00: one practice exercise to learn how checks, hints and solutions work."""

from __future__ import annotations

import torch

from .core import Exercise, expect_tensor


def _check_q1(answer):
    expect_tensor(
        answer,
        torch.arange(1, 11, dtype=torch.int64).pow(2),
        "squares",
        why="It should hold 1, 4, 9, ..., 100: the squares of 1 to 10, in order.",
    )


q1 = Exercise(
    name="Practice",
    prompt="Make `squares`, a tensor holding the squares of the whole numbers 1 to 10.",
    checker=_check_q1,
    hints=[
        "`torch.arange(start, end)` counts from start up to, but not including, end.",
        "Tensors support arithmetic element by element: `t ** 2` squares every entry.",
    ],
    solution_code="squares = torch.arange(1, 11) ** 2",
    solve=lambda: torch.arange(1, 11) ** 2,
    wrong_answers=[
        ("off by one: 0 to 9", lambda: torch.arange(10) ** 2),
        ("a Python list instead of a tensor", lambda: [i * i for i in range(1, 11)]),
        ("floats instead of whole numbers", lambda: torch.arange(1.0, 11.0) ** 2),
    ],
)

EXERCISES = [q1]
