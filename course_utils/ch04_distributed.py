"""Pictures for chapter 04 (torch.distributed): the sampler, the collectives, FSDP's shards.

Boxes are coloured by rank (matplotlib's ``C0``, ``C1``, ...); grey is a sum over all ranks, or
an index dropped. The records come from the scripts of ``notebooks/scripts/`` (``--out``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .data import sampler_indices
from .figures import describe_figure, pyplot, show_figure, widget_callback
from .i18n import tr

GREY = "#c8c8c8"
#: The explorer's default view (also what the notebook's static twin shows).
EXPLORER_DEFAULTS = dict(n=10, world_size=3, epoch=0, shuffle=True, drop_last=False, seed=0)
#: The collectives of the collectives picture, in its order (what each does: :func:`collective_effect`).
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")


def collective_effect(name: str) -> str:
    """What collective `name` does, in the course's language (the collectives picture's titles)."""
    return {
        "all_reduce": tr("every rank gets the sum", "每个 rank 都得到总和"),
        "reduce": tr("only rank 0 (dst) gets the sum", "只有 rank 0（dst）得到总和"),
        "broadcast": tr("every rank gets rank 0's (src) tensor", "每个 rank 都得到 rank 0（src）的张量"),
        "all_gather": tr("every rank gets every rank's tensor, in rank order",
                         "每个 rank 都得到所有 rank 的张量，按 rank 顺序排列"),
        "reduce_scatter": tr("rank k gets the sum of everybody's chunk k", "rank k 得到所有 rank 第 k 块之和"),
    }[name]


def _ink(color: str) -> str:
    """Black or white, whichever reads better on `color` (its relative luminance)."""
    from matplotlib.colors import to_rgb

    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(color))
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.18 else "white"


def _boxes(ax: Any, rows: Sequence[Sequence[tuple]], labels: Sequence[str]) -> None:
    """Draw rows of labelled boxes, the first row on top; a box is ``(x, text, colour, hatched)``."""
    from matplotlib.patches import Rectangle

    for k, row in enumerate(rows):
        y = len(rows) - 1 - k
        for x, text, color, hatched in row:
            hatch = "///" if hatched else None
            ax.add_patch(Rectangle((x, y), 0.9, 0.8, fc=color, ec="black", lw=0.6, hatch=hatch))
            ink = "black" if hatched else _ink(color)
            # regular weight, the only one the Chinese edition's font ships: a bold request there makes
            # matplotlib write "findfont: Failed to find font weight bold ..." under the figure
            ax.text(x + 0.45, y + 0.4, text, ha="center", va="center", size=9.5, color=ink)
    ax.set_xlim(-0.2, max((box[0] for row in rows for box in row), default=0) + 1.1)
    ax.set_ylim(-0.2, len(rows))
    ax.set_yticks([len(rows) - 0.6 - k for k in range(len(rows))], labels)
    ax.spines[["top", "right", "bottom"]].set_visible(False)
    ax.tick_params(axis="x", length=0)


def _rank_legend(fig: Any, world: int, label: Callable[[int], str], *extra: tuple[str, str]) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=f"C{r % 10}", label=label(r)) for r in range(world)]
    handles += [Patch(color=color, label=text) for color, text in extra]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)


def draw_sampler(n: int = 10, world_size: int = 3, epoch: int = 0, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0) -> Any:
    """Print and draw one epoch of DistributedSampler: the epoch's order, then each rank's share."""
    plt = pyplot()

    shares = sampler_indices(n, world_size, epoch, shuffle, seed, drop_last)
    order = [shares[p % world_size][p // world_size] for p in range(world_size * len(shares[0]))]
    dropped = sorted(set(range(n)) - set(order))
    print(f"DistributedSampler(n={n}, num_replicas={world_size}, shuffle={shuffle}, seed={seed}, "
          f"drop_last={drop_last}), set_epoch({epoch})")
    for r, share in enumerate(shares):
        print(f"  rank {r}: {share}")
    k = len(shares[0])
    note = tr("each rank reads {k} indices per epoch", "每个 rank 每个 epoch 读取 {k} 个索引", k=k)
    if len(order) > n:
        note += tr("; {value} padded (repeated from the start of the order)",
                   "；其中 {value} 个是填充（从顺序开头重复取的）", value=len(order) - n)
    if dropped:
        d = len(dropped)
        note += tr("; {d} dropped this epoch: {dropped}", "；本 epoch 丢弃了 {d} 个：{dropped}", d=d, dropped=dropped)
    print("  " + note)

    top = [(p, str(i), f"C{p % world_size % 10}", p >= n) for p, i in enumerate(order)]
    top += [(len(order) + 0.3 + x, str(i), GREY, False) for x, i in enumerate(dropped)]
    rows = [top] + [[(k, str(i), f"C{r % 10}", r + k * world_size >= n) for k, i in enumerate(s)]
                    for r, s in enumerate(shares)]
    width = min(12.0, 2.6 + 0.5 * max(len(order), n))
    fig, ax = plt.subplots(figsize=(width, 1.4 + 0.45 * (world_size + 1.5)))
    order_label = (tr("order (seed {seed}+{epoch})", "顺序（种子 {seed}+{epoch}）", seed=seed, epoch=epoch) if shuffle
                   else tr("order (no shuffle)", "顺序（不打乱）"))
    _boxes(ax, rows, [order_label] + [f"rank {r}" for r in range(world_size)])
    ax.set_xticks([])
    ax.set_xlabel(tr("position in the epoch (hatched: padding, a repeated index; grey: dropped)",
                     "在该 epoch 中的位置（斜线：填充，即重复的索引；灰色：丢弃）"))
    ax.set_title(tr("DistributedSampler: {n} items, {world_size} ranks, epoch {epoch}, shuffle={shuffle}, "
                    "drop_last={drop_last}",
                    "DistributedSampler：{n} 个样本，{world_size} 个 rank，epoch {epoch}，shuffle={shuffle}，"
                    "drop_last={drop_last}",
                    n=n, world_size=world_size, epoch=epoch, shuffle=shuffle, drop_last=drop_last), fontsize=10)
    fig.tight_layout()
    title = " ".join(ax.get_title().split())
    said = tr("; ", "；").join(tr("rank {r}: {share}", "rank {r}：{share}", r=r, share=share)
                              for r, share in enumerate(shares))
    return describe_figure(
        fig,
        "{title}. Rows of numbered boxes: the top row is the epoch's order of the data set's indices "
        "{order}; below it, one row per rank with its share: {said}. {note}.",
        "{title}。一行行带编号的方框：最上面一行是该 epoch 中数据集索引的顺序 {order}；下面每个 rank 一行，"
        "是它分到的部分：{said}。{note}。",
        title=title, order=order, said=said, note=note)


def draw_sampler_epochs(records: Sequence[Mapping[str, Any]]) -> Any:
    """From sampler_demo.py's records: which rank read each item (colour) and when (number)."""
    plt = pyplot()

    n, modes = int(records[0]["small"]), ("with set_epoch", "without set_epoch")
    epochs = len(records[0][modes[0]])
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 0.9 + 0.55 * epochs))
    for ax, mode in zip(axes, modes, strict=True):
        rows = [[(i, str(pos), f"C{int(rec['rank']) % 10}", False)
                 for rec in records for pos, i in enumerate(rec[mode][e])] for e in range(epochs)]
        _boxes(ax, rows, [f"epoch {e}" for e in range(epochs)])
        ax.set_xticks([i + 0.45 for i in range(n)], [str(i) for i in range(n)])
        ax.set_xlabel(tr("item of the data set", "数据集中的样本"))
        if mode == modes[0]:
            ax.set_title(tr("DistributedSampler with set_epoch", "DistributedSampler（调用 set_epoch）"))
        else:
            ax.set_title(tr("DistributedSampler without set_epoch", "DistributedSampler（不调用 set_epoch）"))
    _rank_legend(fig, len(records), lambda r: tr("read by rank {r}", "由 rank {r} 读取", r=r))
    fig.suptitle(tr("Who reads which item (number: position in that rank's epoch)",
                    "谁读取了哪个样本（数字：在该 rank 的 epoch 中的位置）"))
    fig.tight_layout(rect=(0, 0.08, 1, 1))

    def reads(mode: str) -> str:
        return tr("; ", "；").join(
            f"epoch {e}: " + ", ".join(f"rank {rec['rank']} {list(rec[mode][e])}" for rec in records)
            for e in range(epochs))
    return describe_figure(
        fig,
        "Two grids of boxes, one per mode, with a row per epoch and a column per item of the {n}-item data "
        "set, each box coloured by the rank that read the item. With set_epoch, the items each rank "
        "reads: {with_epoch}. Without set_epoch: {without}.",
        "两组方框网格，每种做法一组：每个 epoch 一行，{n} 个样本的数据集中每个样本一列，"
        "方框的颜色表示读取它的 rank。"
        "调用 set_epoch 时，各 rank 读取的样本：{with_epoch}。不调用 set_epoch 时：{without}。",
        n=n, with_epoch=reads(modes[0]), without=reads(modes[1]))


def draw_collectives(records: Sequence[Mapping[str, Any]]) -> Any:
    """Before and after, on every rank, for each collective collectives.py recorded."""
    plt = pyplot()

    results = [rec["collectives"] for rec in sorted(records, key=lambda rec: int(rec["rank"]))]
    world, names = len(results), [name for name in COLLECTIVES if name in results[0]]
    before_w = max(len(res[name]["before"]) for res in results for name in names)
    after_x = before_w + 2.2
    after_w = max(len(res[name]["after"]) for res in results for name in names)
    height = 0.5 + (0.45 * world + 0.55) * len(names)
    fig, axes = plt.subplots(len(names), 1, figsize=(9.5, height), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        rows = []
        for r, res in enumerate(results):
            before, after = res[name]["before"], res[name]["after"]
            # where value i of the result comes from: a rank, or None for a sum over every rank
            src = [{"broadcast": 0, "all_gather": i // len(before), "reduce": r or None}.get(name)
                   for i in range(len(after))]
            rows.append([(i, str(v), f"C{r % 10}", False) for i, v in enumerate(before)]
                        + [(after_x + i, str(v), GREY if s is None else f"C{s % 10}", False)
                           for i, (v, s) in enumerate(zip(after, src, strict=True))])
            y = world - 0.6 - r
            ax.annotate("", xy=(after_x - 0.3, y), xytext=(before_w + 0.3, y),
                        arrowprops={"arrowstyle": "->", "color": "0.4"})
        _boxes(ax, rows, [f"rank {r}" for r in range(world)])
        ax.set_xlim(-0.1, after_x + after_w + 0.1)
        ax.set_xticks([before_w / 2, after_x + len(after) / 2], [tr("before", "调用前"), tr("after", "调用后")])
        effect = collective_effect(name)
        ax.set_title(tr("{name}: {effect}", "{name}：{effect}", name=name, effect=effect), fontsize=10, loc="left")
    summed = (GREY, tr("a sum over all ranks", "所有 rank 之和"))
    _rank_legend(fig, world, lambda r: tr("rank {r}'s data", "rank {r} 的数据", r=r), summed)
    fig.suptitle(tr("Collectives on {world} real processes: what each rank holds before and after",
                    "在 {world} 个真实进程上运行集合通信：每个 rank 调用前后持有的数据", world=world))
    fig.tight_layout(rect=(0, 0.04, 1, 1))

    held = tr("; ", "；").join(f"{name}: " + ", ".join(
        tr("rank {r} {before} becomes {after}", "rank {r} {before} 变为 {after}",
           r=r, before=list(res[name]["before"]), after=list(res[name]["after"])) for r, res in enumerate(results))
        for name in names)
    return describe_figure(
        fig,
        "For each of {count} collectives on {world} processes, rows of boxes with the values each rank "
        "holds before and after the call: {held}.",
        "{count} 种集合通信在 {world} 个进程上运行，每种画出一行行方框：每个 rank 调用前后持有的值：{held}。",
        count=len(names), world=world, held=held)


def draw_shards(full: Mapping[str, Sequence[int]], local: Sequence[Mapping[str, Sequence[int]]]) -> Any:
    """FSDP's sharding: which rows (dim 0) of each parameter (``full[name]``: its shape) rank r
    stores (``local[r][name]``: the shape of its shard)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.55 * len(full)))
    for i, name in enumerate(full):
        rows, start = int(full[name][0]), 0
        for r, shapes in enumerate(local):
            k = min(int(shapes[name][0]), rows - start)
            ax.barh(i, k / rows, left=start / rows, color=f"C{r % 10}", edgecolor="black")
            text = tr("rank {r}: rows {start}-{value}", "rank {r}：第 {start}-{value} 行",
                      r=r, start=start, value=start + k - 1)
            ax.text((start + k / 2) / rows, i, text, ha="center", va="center", color=_ink(f"C{r % 10}"), size=8)
            start += k
    ax.set_yticks(range(len(full)), [f"{name} {list(shape)}" for name, shape in full.items()])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel(tr("fraction of the parameter's rows (dim 0)", "占参数各行（第 0 维）的比例"))
    ax.set_title(tr("fully_shard: every rank stores a slice of every parameter",
                    "fully_shard：每个 rank 只存储每个参数的一个分片"))
    fig.tight_layout()
    params = []
    for name in full:
        rows, start, parts = int(full[name][0]), 0, []
        for r, shapes in enumerate(local):
            k = min(int(shapes[name][0]), rows - start)
            parts.append(tr("rank {r} rows {start}-{end}", "rank {r} 第 {start}-{end} 行", r=r, start=start,
                            end=start + k - 1))
            start += k
        params.append(tr("{name} {shape}: {parts}", "{name} {shape}：{parts}", name=name, shape=list(full[name]),
                         parts=tr(", ", "，").join(parts)))
    return describe_figure(
        fig,
        "Horizontal bars, one per parameter of the model, each split into the rows (dim 0) that each rank "
        "stores under fully_shard: {params}.",
        "水平条形图，模型的每个参数一条，按 fully_shard 下每个 rank 存储的行（第 0 维）分段：{params}。",
        params=tr("; ", "；").join(params))


def sampler_explorer() -> Any:
    """Sliders and boxes for :func:`draw_sampler`'s arguments, redrawn on every change."""
    import ipywidgets as w

    d = EXPLORER_DEFAULTS
    ranges = {"n": (tr("items", "样本数"), 1, 20), "world_size": ("world size", 1, 8), "epoch": ("epoch", 0, 9)}
    sliders = {key: w.IntSlider(value=d[key], min=low, max=high, description=text,
                                continuous_update=False) for key, (text, low, high) in ranges.items()}
    boxes = {key: w.Checkbox(value=d[key], description=key) for key in ("shuffle", "drop_last")}
    out = w.interactive_output(widget_callback(lambda **kw: show_figure(draw_sampler(**kw, seed=d["seed"]))),
                               sliders | boxes)
    return w.VBox([w.HBox(list(sliders.values())), w.HBox(list(boxes.values())), out])


def load_rank_records(folder: str | Path, stem: str) -> list[dict]:
    """Read ``<folder>/<stem>_rank<R>.json`` for R = 0, 1, ... (what the scripts write), in rank order."""
    records, path = [], Path(folder) / f"{stem}_rank0.json"
    while path.exists():
        records.append(json.loads(path.read_text()))
        path = Path(folder) / f"{stem}_rank{len(records)}.json"
    if not records:
        raise FileNotFoundError(f"no {stem}_rank0.json in {folder}: did the script run with --out {folder}?")
    return records
