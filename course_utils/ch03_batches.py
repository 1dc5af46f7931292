"""Chapter 03 (data loading), the batches a sampler makes, shown: the sampler choices, class-balanced weights,
one batch of an epoch (``batch_view``, ``draw_batch_view``) and the batch browser widget. Used in sections 4
("`shuffle` versus samplers, and `drop_last`") and 5 ("Browse the batches") of notebook 03, through
``course_utils.ch03_data_loading``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader

from .figures import COLORS, describe_figure, pyplot, show_figure, widget_callback
from .i18n import tr

SAMPLERS = ("default", "sequential", "random", "weighted")
BATCH_BROWSER_DEFAULTS = dict(batch_size=16, shuffle=True, seed=0, sampler="default", epoch=0, batch=0)


def _sampler_options() -> list[tuple[str, str]]:
    """The batch browser's sampler choices: (label in the course's language, value of SAMPLERS)."""
    labels = {"default": tr("default", "default（由 shuffle 决定）"), "sequential": tr("sequential", "顺序"),
              "random": tr("random", "随机"), "weighted": tr("weighted", "加权（类别均衡）")}
    return [(labels[s], s) for s in SAMPLERS]


def class_balanced_weights(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Per-sample weights ``1 / count(label)`` for ``WeightedRandomSampler``: every class drawn equally often."""
    y = torch.as_tensor(labels, dtype=torch.int64)
    return 1.0 / torch.bincount(y)[y].to(torch.float64)


class BatchView(NamedTuple):
    batches: list[list[int]]  # one epoch, as the DataLoader handed it out
    batch: int  # the batch picked out of it
    indices: list[int]
    labels: list[int]
    sampler: str
    epoch: int


def batch_view(
    labels: Sequence[int],
    batch_size: int = 16,
    shuffle: bool = True,
    seed: int = 0,
    sampler: str = "default",
    epoch: int = 0,
    batch: int = 0,
) -> BatchView:
    """The batches a real ``DataLoader`` with ``generator=torch.Generator().manual_seed(seed)`` yields in
    epoch `epoch` (from 0; each epoch continues the generator), and its batch `batch`. `sampler`:
    "default" (``shuffle`` decides), "sequential", "random" or "weighted" (class-balanced)."""
    if sampler != "default" and shuffle:
        raise ValueError(
            f"shuffle=True cannot be combined with sampler={sampler!r}: shuffle=True *is* a "
            "RandomSampler, and DataLoader refuses both ('sampler option is mutually exclusive "
            "with shuffle'). Untick shuffle, or pick sampler 'default'."
        )
    n, g, kw = len(labels), torch.Generator().manual_seed(seed), {"shuffle": shuffle}
    if sampler == "sequential":
        kw = {"sampler": torch.utils.data.SequentialSampler(range(n))}
    elif sampler == "random":
        kw = {"sampler": torch.utils.data.RandomSampler(range(n), generator=g)}
    elif sampler == "weighted":
        weights = class_balanced_weights(labels)
        kw = {"sampler": torch.utils.data.WeightedRandomSampler(weights, n, generator=g)}
    loader = DataLoader(range(n), batch_size, generator=g, collate_fn=list, **kw)
    for _ in range(epoch + 1):
        batches = list(loader)
    b = min(max(batch, 0), len(batches) - 1)
    picked = [int(labels[i]) for i in batches[b]]
    return BatchView(batches, b, batches[b], picked, type(loader.sampler).__name__, epoch)


def draw_batch_view(view: BatchView, images: torch.Tensor, classes: Sequence | None = None) -> Any:
    """The batch's images with their labels, and the epoch's index order with the batch highlighted."""
    plt = pyplot()

    k = len(view.indices)
    cols = min(16, k)
    rows = -(-k // cols)
    # a layout in inches: title, rows of images (each with a two-line title), then the order plot
    width, left, right, top, row_h, gap, plot_h, bottom = 10.0, 0.8, 0.2, 0.5, 0.95, 0.3, 2.2, 0.55
    height = top + rows * row_h + gap + plot_h + bottom
    fig = plt.figure(figsize=(width, height))
    cell = (width - left - right) / cols
    side = min(cell * 0.92, row_h - 0.35)
    for j, idx in enumerate(view.indices):
        r, c = divmod(j, cols)
        x0, y0 = left + c * cell + (cell - side) / 2, height - top - (r + 1) * row_h
        ax = fig.add_axes((x0 / width, y0 / height, side / width, side / height))
        img = images[idx].detach().cpu()
        ax.imshow((img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)).numpy(), cmap="gray_r")
        name = classes[view.labels[j]] if classes else view.labels[j]
        ax.set_title(f"#{idx}\ny={name}", fontsize=7)
        ax.axis("off")
    ax = fig.add_axes((left / width, bottom / height, (width - left - right) / width, plot_h / height))
    order = [i for bt in view.batches for i in bt]
    start = sum(len(b) for b in view.batches[: view.batch])
    ax.scatter(range(len(order)), order, s=2, color="0.6", label=tr("epoch order", "该 epoch 的顺序"))
    ax.scatter(range(start, start + k), view.indices, s=10, color=COLORS["vermilion"],
               label=tr("batch {batch}", "批次 {batch}", batch=view.batch))
    ax.set(xlabel=tr("position in the epoch", "在该 epoch 中的位置"),
           ylabel=tr("dataset index", "数据集索引"))
    ax.legend(loc="upper left", fontsize=7)
    b, n = view.batch, len(view.batches)
    title = tr("{sampler}, epoch {epoch}: batch {b} of {n} ({k} images)",
               "{sampler}，epoch {epoch}：第 {b} 个批次，共 {n} 个（{k} 张图像）",
               sampler=view.sampler, epoch=view.epoch, b=b, n=n, k=k)
    fig.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    labels = ", ".join(str(classes[v] if classes else v) for v in view.labels)
    return describe_figure(
        fig,
        "{title}. Top: the batch's {k} images, each titled with its dataset index and label (labels: "
        "{labels}). Bottom: a scatter plot of the dataset index at each position of the epoch, the "
        "batch's points highlighted.",
        "{title}。上方：这个批次的 {k} 张图像，每张标有数据集索引和标签（标签：{labels}）。"
        "下方：该 epoch 每个位置上的数据集索引的散点图，这个批次的点被突出显示。",
        title=title, k=k, labels=labels)


def batch_browser(images: torch.Tensor, labels: Sequence[int]) -> Any:
    """An ipywidgets browser over :func:`batch_view`: batch size, shuffle, seed, sampler, epoch, batch."""
    import ipywidgets as w

    d, n = BATCH_BROWSER_DEFAULTS, len(labels)
    controls = dict(
        batch_size=w.IntSlider(d["batch_size"], 4, 64, 4, description=tr("batch size", "批次大小")),
        shuffle=w.Checkbox(d["shuffle"], description="shuffle"),
        seed=w.IntSlider(d["seed"], 0, 9, description=tr("seed", "种子")),
        sampler=w.Dropdown(options=_sampler_options(), value=d["sampler"], description=tr("sampler", "采样器")),
        epoch=w.IntSlider(d["epoch"], 0, 4, description="epoch"),
        batch=w.IntSlider(d["batch"], 0, -(-n // d["batch_size"]) - 1, description=tr("batch", "批次")),
    )

    @widget_callback
    def show(**kw: Any) -> None:
        controls["batch"].max = -(-n // kw["batch_size"]) - 1
        try:
            view = batch_view(labels, **kw)
        except ValueError as exc:
            print(tr("DataLoader would refuse this: {exc}", "DataLoader 会拒绝这种组合：{exc}", exc=exc))
            return
        print(tr("indices: {indices}", "索引：{indices}", indices=view.indices))
        show_figure(draw_batch_view(view, images))

    ctl = list(controls.values())
    return w.VBox([w.HBox(ctl[:3]), w.HBox(ctl[3:]), w.interactive_output(show, controls)])
