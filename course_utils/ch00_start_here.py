"""Picture grids of the course's digits, and a small widget to browse them by class."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import data
from .figures import describe_figure, pyplot, show_figure, widget_callback
from .i18n import tr

#: The gallery's default view: the widget's starting values and the defaults of `pick` and `show`, so
#: `show(**GALLERY_DEFAULTS)` (the notebook's static twin) draws what the widget first shows.
GALLERY_DEFAULTS: dict[str, Any] = {"split": "train", "label": None, "n": 24, "seed": 0}
_D = GALLERY_DEFAULTS  # short name for the signatures below


def pick(
    split: str = _D["split"], label: int | None = _D["label"], n: int = _D["n"], seed: int = _D["seed"]
) -> tuple[torch.Tensor, list[int], list[int]]:
    """Choose `n` images of a split (of one class if `label` is given), reproducibly.

    Returns ``(images [n, 28, 28], labels, indices into the split)``.
    """
    if not 1 <= n <= 200:
        raise ValueError(f"n must be between 1 and 200 images, got {n}")
    if label is not None and label not in range(10):
        raise ValueError(f"label must be a digit 0-9 or None, got {label!r}")
    x, y = data.digits_tensors(split)
    pool = torch.arange(len(y)) if label is None else torch.nonzero(y == label).flatten()
    g = torch.Generator().manual_seed(seed)
    chosen = pool[torch.randperm(len(pool), generator=g)[: min(n, len(pool))]].sort().values
    return x[chosen, 0], [int(v) for v in y[chosen]], [int(i) for i in chosen]


def draw_grid(images: torch.Tensor, labels: list[int], title: str = "", cols: int = 8, ax_size: float = 1.1):
    """Draw images in a grid, each titled with its label. Returns the matplotlib figure."""
    plt = pyplot()

    n = len(images)
    rows = max(1, int(np.ceil(n / cols)))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * ax_size, rows * ax_size * 1.15), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < n:
            ax.imshow(images[i].numpy(), cmap="gray_r", vmin=0, vmax=1)
            ax.set_title(str(labels[i]), fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    shown = ", ".join(map(str, labels))
    return describe_figure(fig, "A grid of {n} handwritten digit images, each titled with its label: {shown}.",
                           "{n} 张手写数字图像排成的网格，每张图上方标有它的标签：{shown}。", n=n, shown=shown)


def _split_name(split: str) -> str:
    """The split's name in the course's language (the gallery's buttons and title)."""
    return {"train": tr("train", "训练集"), "test": tr("test", "测试集")}.get(split, split)


def show(split: str = _D["split"], label: int | None = _D["label"], n: int = _D["n"], seed: int = _D["seed"]):
    """The gallery's view: pick images, draw them, return the figure."""
    images, labels, _ = pick(split, label, n, seed)
    which = tr("all digits", "全部数字") if label is None else tr("digit {label}", "数字 {label}", label=label)
    title = tr("{n} {split} images, {which} (seed {seed})", "{split}中的 {n} 张图像，{which}（随机种子 {seed}）",
               n=n, split=_split_name(split), which=which, seed=seed)
    fig = draw_grid(images, labels, title)
    shown = ", ".join(map(str, labels))
    return describe_figure(fig, "{count} handwritten digits from the {split} split ({which}, seed {seed}), "
                           "28x28 pixels each, dark strokes on white, in a grid; their labels in order: {shown}.",
                           "{split}中的 {count} 个手写数字（{which}，随机种子 {seed}），每张 28x28 像素，"
                           "白底深色笔画，排成网格；按顺序的标签：{shown}。",
                           count=len(labels), split=_split_name(split), which=which, seed=seed, shown=shown)


def gallery_widget():
    """Sliders for split, class, count and seed over :func:`show`, starting at :data:`GALLERY_DEFAULTS`."""
    import ipywidgets as w

    @widget_callback
    def update(split, label, n, seed):
        show_figure(show(split, None if label < 0 else label, n, seed))

    d = GALLERY_DEFAULTS
    return w.interactive(
        update,
        split=w.ToggleButtons(options=[(_split_name(s), s) for s in data.SPLITS],
                              value=d["split"], description=tr("split", "数据集")),
        label=w.IntSlider(value=-1 if d["label"] is None else d["label"], min=-1, max=9,
                          description=tr("digit (-1: all)", "数字（-1：全部）")),
        n=w.IntSlider(value=d["n"], min=8, max=64, step=8, description=tr("images", "图像数量")),
        seed=w.IntSlider(value=d["seed"], min=0, max=20, description=tr("seed", "随机种子")),
    )
