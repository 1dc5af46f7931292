"""Pictures and small tools for chapter 04 (torch.distributed).

    from course_utils.data import sampler_indices
    from course_utils.ch04_distributed import draw_sampler, sampler_explorer
    sampler_indices(10, world_size=3, epoch=1)       # what DistributedSampler gives every rank
    draw_sampler(10, world_size=3, epoch=1)           # the same, drawn (the explorer's static view)
    draw_collectives(records)                         # before/after per rank, from collectives.py
    spawn_bounded(fn, args=(2,), nprocs=2, timeout=60)  # mp.spawn that can never hang a notebook

:func:`sampler_indices` re-implements ``torch.utils.data.DistributedSampler`` in a few
lines (shuffle with seed + epoch, pad or drop to a multiple of the world size, then every
``world_size``-th index from position ``rank``); the tests check it against the real sampler.
Importing this module has no side effects (matplotlib, ipywidgets and torch.multiprocessing
are imported by the functions that need them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .data import _check_sampler_args, _order

#: One colour per rank (matplotlib's tab10), used by every picture of the chapter.
RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
_MIXED = "#c8c8c8"  # a value that combines every rank's data

#: The explorer's default view (also what the notebook's static twin shows).
EXPLORER_DEFAULTS = {"n": 10, "world_size": 3, "epoch": 0, "shuffle": True, "drop_last": False, "seed": 0}


# --------------------------------------------------------------------------------------------
# DistributedSampler, in plain Python
# --------------------------------------------------------------------------------------------








class SamplerView:
    """Everything the explorer shows for one setting: the epoch's order and each rank's share."""

    def __init__(self, n: int, world_size: int, epoch: int, shuffle: bool, drop_last: bool, seed: int = 0) -> None:
        _check_sampler_args(n, world_size, epoch)
        self.n, self.world_size, self.epoch = n, world_size, epoch
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.order, self.padding = _order(n, world_size, epoch, shuffle, seed, drop_last)
        self.per_rank = [self.order[r::world_size] for r in range(world_size)]
        self.dropped = sorted(set(range(n)) - set(self.order))

    def text(self) -> str:
        """A deterministic summary, printed by the explorer above its picture."""
        lines = [f"DistributedSampler(n={self.n}, num_replicas={self.world_size}, shuffle={self.shuffle}, "
                 f"seed={self.seed}, drop_last={self.drop_last}), set_epoch({self.epoch})"]
        lines += [f"  rank {r}: {idx}" for r, idx in enumerate(self.per_rank)]
        each = len(self.per_rank[0])
        note = f"each rank reads {each} indices per epoch"
        if self.padding:
            note += f"; {self.padding} padded (repeated from the start of the order)"
        if self.dropped:
            note += f"; {len(self.dropped)} dropped this epoch: {self.dropped}"
        lines.append("  " + note)
        return "\n".join(lines)


def sampler_view(n: int = 10, world_size: int = 3, epoch: int = 0, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0) -> SamplerView:
    """The explorer's logic as a plain function (see :class:`SamplerView`)."""
    return SamplerView(n, world_size, epoch, shuffle, drop_last, seed)


def draw_sampler(n: int = 10, world_size: int = 3, epoch: int = 0, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0) -> Any:
    """Draw one epoch of DistributedSampler: the epoch's order on top (each position coloured by
    the rank that reads it), then each rank's indices. Prints :meth:`SamplerView.text` first."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    view = sampler_view(n, world_size, epoch, shuffle, drop_last, seed)
    print(view.text())
    width = max(len(view.order), n)
    fig, ax = plt.subplots(figsize=(min(12.0, 2.6 + 0.5 * width), 1.4 + 0.45 * (world_size + 1.5)))

    def cell(x: float, y: float, text: str, color: str, padded: bool = False) -> None:
        ax.add_patch(Rectangle((x, y), 0.9, 0.8, facecolor=color, alpha=0.85, edgecolor="black",
                               hatch="///" if padded else None, lw=0.6))
        ax.text(x + 0.45, y + 0.4, text, ha="center", va="center", fontsize=9,
                color="white" if not padded else "black", fontweight="bold")

    top = world_size + 0.4
    for pos, idx in enumerate(view.order):
        cell(pos, top, str(idx), RANK_COLORS[pos % world_size % len(RANK_COLORS)], pos >= len(view.order) - view.padding)
    for x, idx in enumerate(view.dropped):  # shown in grey after the order
        cell(len(view.order) + 0.3 + x, top, str(idx), "#bbbbbb")
    for r, idx_list in enumerate(view.per_rank):
        y = world_size - 1 - r
        for pos, idx in enumerate(idx_list):
            global_pos = r + pos * world_size
            cell(pos, y, str(idx), RANK_COLORS[r % len(RANK_COLORS)], global_pos >= len(view.order) - view.padding)
    ax.set_xlim(-0.2, width + 0.5 + len(view.dropped))
    ax.set_ylim(-0.3, top + 0.9)
    ax.set_yticks([top + 0.4] + [world_size - 1 - r + 0.4 for r in range(world_size)])
    ax.set_yticklabels([f"order (seed {seed}+{epoch})" if shuffle else "order (no shuffle)"]
                       + [f"rank {r}" for r in range(world_size)])
    ax.set_xlabel("position in the epoch (hatched: padding, a repeated index; grey: dropped)")
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"DistributedSampler: {n} items, {world_size} ranks, epoch {epoch}, "
                 f"shuffle={shuffle}, drop_last={drop_last}", fontsize=10)
    fig.tight_layout()
    return fig


def draw_sampler_epochs(records: Sequence[Mapping[str, Any]], modes: Sequence[str] = ("with set_epoch", "without set_epoch")) -> Any:
    """From sampler_demo.py's per-rank records: which rank read each item, epoch by epoch.

    One panel per mode; a row per epoch, a column per item of the data set; the colour says
    which rank read the item, the number when (its position in that rank's epoch)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    n = int(records[0]["small"])
    world = len(records)
    epochs = len(records[0][modes[0]])
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 0.9 + 0.55 * epochs), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for e in range(epochs):
            y = epochs - 1 - e
            for rec in records:
                r = int(rec["rank"])
                for pos, idx in enumerate(rec[mode][e]):
                    ax.add_patch(Rectangle((idx, y), 0.92, 0.85, facecolor=RANK_COLORS[r % len(RANK_COLORS)],
                                           edgecolor="black", lw=0.5))
                    ax.text(idx + 0.46, y + 0.42, str(pos), ha="center", va="center", color="white", fontsize=8)
        ax.set_xlim(0, n)
        ax.set_ylim(0, epochs)
        ax.set_xticks([i + 0.46 for i in range(n)])
        ax.set_xticklabels([str(i) for i in range(n)])
        ax.set_yticks([epochs - 1 - e + 0.42 for e in range(epochs)])
        ax.set_yticklabels([f"epoch {e}" for e in range(epochs)])
        ax.set_xlabel("item of the data set")
        ax.set_title(f"DistributedSampler {mode}")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    handles = [Patch(color=RANK_COLORS[r % len(RANK_COLORS)], label=f"read by rank {r}") for r in range(world)]
    fig.legend(handles=handles, loc="lower center", ncol=world, frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Who reads which item (number: position in that rank's epoch)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def sampler_explorer() -> Any:
    """Sliders for data set size, world size and epoch, boxes for shuffle and drop_last: the
    view of :func:`draw_sampler`, redrawn on every change (ipywidgets)."""
    import ipywidgets as w

    from .figures import show_figure

    d = EXPLORER_DEFAULTS
    n = w.IntSlider(value=d["n"], min=1, max=20, description="items", continuous_update=False)
    world = w.IntSlider(value=d["world_size"], min=1, max=8, description="world size", continuous_update=False)
    epoch = w.IntSlider(value=d["epoch"], min=0, max=9, description="epoch", continuous_update=False)
    shuffle = w.Checkbox(value=d["shuffle"], description="shuffle")
    drop_last = w.Checkbox(value=d["drop_last"], description="drop_last")

    def show(n: int, world_size: int, epoch: int, shuffle: bool, drop_last: bool) -> None:
        show_figure(draw_sampler(n, world_size, epoch, shuffle, drop_last, d["seed"]))

    out = w.interactive_output(show, {"n": n, "world_size": world, "epoch": epoch, "shuffle": shuffle,
                                      "drop_last": drop_last})
    return w.VBox([w.HBox([n, world, epoch]), w.HBox([shuffle, drop_last]), out])


# --------------------------------------------------------------------------------------------
# collectives and shards
# --------------------------------------------------------------------------------------------

#: What each collective does, and where each value of its result comes from.
COLLECTIVES = {
    "all_reduce": "every rank gets the sum",
    "reduce": "only rank 0 (dst) gets the sum",
    "broadcast": "every rank gets rank 0's (src) tensor",
    "all_gather": "every rank gets every rank's tensor, in rank order",
    "reduce_scatter": "rank k gets the sum of everybody's chunk k",
}


def _sources(name: str, rank: int, world: int, n_after: int, n_before: int) -> list[int | None]:
    """For each value after the collective: the rank it came from (None: a sum over all ranks)."""
    if name == "all_reduce":
        return [None] * n_after
    if name == "reduce":
        return [None] * n_after if rank == 0 else [rank] * n_after
    if name == "broadcast":
        return [0] * n_after
    if name == "all_gather":
        return [i // n_before for i in range(n_after)]
    if name == "reduce_scatter":
        return [None] * n_after
    raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")


def draw_collectives(records: Sequence[Mapping[str, Any]]) -> Any:
    """Before/after per rank for every collective recorded by collectives.py (one record per rank).

    A box's colour says where its value came from: a rank's own colour, or grey for a sum of
    every rank's values."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    records = sorted(records, key=lambda rec: int(rec["rank"]))
    world = len(records)
    names = [k for k in COLLECTIVES if k in records[0]["collectives"]]
    fig, axes = plt.subplots(len(names), 1, figsize=(9.5, 0.5 + (0.45 * world + 0.55) * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        width_before = max(len(rec["collectives"][name]["before"]) for rec in records)
        x_after = width_before + 2.2
        for rec in records:
            r = int(rec["rank"])
            before, after = rec["collectives"][name]["before"], rec["collectives"][name]["after"]
            y = world - 1 - r
            for i, v in enumerate(before):
                src = r
                if name == "reduce_scatter":
                    src = r  # chunk i of rank r's input
                ax.add_patch(Rectangle((i, y), 0.9, 0.8, facecolor=RANK_COLORS[src % len(RANK_COLORS)], edgecolor="black", lw=0.5))
                ax.text(i + 0.45, y + 0.4, str(v), ha="center", va="center", color="white", fontsize=9, fontweight="bold")
            ax.annotate("", xy=(x_after - 0.3, y + 0.4), xytext=(width_before + 0.3, y + 0.4),
                        arrowprops={"arrowstyle": "->", "color": "0.4"})
            for i, (v, src) in enumerate(zip(after, _sources(name, r, world, len(after), len(before)), strict=True)):
                color = _MIXED if src is None else RANK_COLORS[src % len(RANK_COLORS)]
                ax.add_patch(Rectangle((x_after + i, y), 0.9, 0.8, facecolor=color, edgecolor="black", lw=0.5))
                ax.text(x_after + i + 0.45, y + 0.4, str(v), ha="center", va="center",
                        color="black" if src is None else "white", fontsize=9, fontweight="bold")
        width_after = max(len(rec["collectives"][name]["after"]) for rec in records)
        ax.set_xlim(-0.1, x_after + max(width_after, 4) + 0.2)
        ax.set_ylim(-0.1, world)
        ax.set_yticks([world - 1 - r + 0.4 for r in range(world)])
        ax.set_yticklabels([f"rank {r}" for r in range(world)])
        ax.set_xticks([width_before / 2, x_after + width_after / 2])
        ax.set_xticklabels(["before", "after"])
        ax.set_title(f"{name}: {COLLECTIVES[name]}", fontsize=10, loc="left")
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        ax.tick_params(axis="x", length=0)
    handles = [Patch(color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}'s data") for r in range(world)]
    handles.append(Patch(color=_MIXED, label="a sum over all ranks"))
    fig.legend(handles=handles, loc="lower center", ncol=world + 1, frameon=False)
    fig.suptitle(f"Collectives on {world} real processes: what each rank holds before and after")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def draw_shards(full: Mapping[str, Sequence[int]], local: Sequence[Mapping[str, Sequence[int]]]) -> Any:
    """FSDP's sharding: for every parameter, its rows (dim 0) and which rank stores which of them.

    `full`: name -> full shape; `local[r]`: name -> the shape rank r stores."""
    import matplotlib.pyplot as plt

    names = list(full)
    world = len(local)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.55 * len(names)))
    for i, name in enumerate(names):
        rows = int(full[name][0])
        start = 0
        for r in range(world):
            k = min(int(local[r][name][0]), rows - start)
            ax.barh(i, k / rows, left=start / rows, color=RANK_COLORS[r % len(RANK_COLORS)], edgecolor="black")
            ax.text((start + k / 2) / rows, i, f"rank {r}: rows {start}-{start + k - 1}", ha="center",
                    va="center", color="white", fontsize=8)
            start += k
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{n} {list(full[n])}" for n in names])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of the parameter's rows (dim 0)")
    ax.set_title("fully_shard: every rank stores a slice of every parameter")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


def load_rank_records(folder: str | Path, stem: str) -> list[dict]:
    """Read ``<folder>/<stem>_rank<R>.json`` for R = 0, 1, ... (what the scripts write), in rank order."""
    folder = Path(folder)
    records = []
    r = 0
    while (folder / f"{stem}_rank{r}.json").exists():
        records.append(json.loads((folder / f"{stem}_rank{r}.json").read_text()))
        r += 1
    if not records:
        raise FileNotFoundError(f"no {stem}_rank0.json in {folder}: did the script run with --out {folder}?")
    return records






