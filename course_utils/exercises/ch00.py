"""Chapter 00: one practice exercise to learn how checks, hints and solutions work."""

import torch

from ..i18n import tr
from .core import Exercise, as_tensor


def make_squares():
    return torch.arange(1, 11) ** 2  # 1, 4, 9, ..., 100


def _facts(answer, _):
    t = as_tensor(answer, "squares")
    whole = not (t.is_floating_point() or t.is_complex())
    yield tr("the shape of squares", "squares 的形状"), tuple(t.shape)
    values = tr("whole numbers", "整数") if whole else tr("fractional numbers", "小数")
    values = tr("true/false values", "布尔值（true/false）") if t.dtype == torch.bool else values
    yield tr("the kind of values it holds", "其中的值的种类"), values
    yield "squares", t


q1 = Exercise(
    "Practice",
    make_squares,
    form="value",
    observe=_facts,
    mistakes=dict(
        starts_at_zero=torch.arange(10) ** 2,
        a_list=[i * i for i in range(1, 11)],
        floats=torch.arange(1.0, 11.0) ** 2,
        booleans=(torch.arange(1, 11) ** 2).bool(),
    ),
)

EXERCISES = [q1]
