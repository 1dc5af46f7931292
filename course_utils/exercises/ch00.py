"""Chapter 00: one practice exercise to learn how checks, hints and solutions work."""

from __future__ import annotations

import torch

from .core import Exercise, as_tensor


def make_squares():
    return torch.arange(1, 11) ** 2  # 1, 4, 9, ..., 100


def _facts(answer, _):
    t = as_tensor(answer, "squares")
    whole = not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)
    return {"the shape of squares": tuple(t.shape), "its numbers": "whole" if whole else "fractional", "squares": t}


q1 = Exercise(
    name="Practice",
    prompt="Make `squares`, a tensor (of any integer dtype) holding the squares of the whole numbers 1 to 10.",
    model_answer=make_squares,
    form="value",
    observe=_facts,
    hints=[
        "`torch.arange(start, end)` counts from start up to, but not including, end.",
        "Tensors support arithmetic element by element: `t ** 2` squares every entry.",
    ],
    mistakes={
        "off by one: `torch.arange(10)` counts 0 to 9; the squares of 1 to 10 start at 1.": torch.arange(10) ** 2,
        "squares should be a torch.Tensor, but it is a list. `torch.tensor(...)` turns a list into one.": [i * i for i in range(1, 11)],
        "these are floating-point numbers; the squares of whole numbers should be whole numbers (an integer dtype).": torch.arange(1.0, 11.0) ** 2,
    },
)

EXERCISES = [q1]
