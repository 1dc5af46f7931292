"""Pictures for chapter 04 (torch.distributed): the sampler, the collectives, FSDP's shards.

Boxes are coloured by rank (matplotlib's ``C0``, ``C1``, ...); grey is a sum over all ranks, or
an index dropped. The records come from the scripts of ``notebooks/scripts/`` (``--out``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .data import sampler_indices

GREY = "#c8c8c8"
#: The explorer's default view (also what the notebook's static twin shows).
EXPLORER_DEFAULTS = dict(n=10, world_size=3, epoch=0, shuffle=True, drop_last=False, seed=0)
#: What each collective does, in the collectives picture's titles.
COLLECTIVES = {
    "all_reduce": "every rank gets the sum",
    "reduce": "only rank 0 (dst) gets the sum",
    "broadcast": "every rank gets rank 0's (src) tensor",
    "all_gather": "every rank gets every rank's tensor, in rank order",
    "reduce_scatter": "rank k gets the sum of everybody's chunk k",
}


def _boxes(ax: Any, rows: Sequence[Sequence[tuple]], labels: Sequence[str]) -> None:
    """Draw rows of labelled boxes, the first row on top; a box is ``(x, text, colour, hatched)``."""
    from matplotlib.patches import Rectangle

    for k, row in enumerate(rows):
        y = len(rows) - 1 - k
        for x, text, color, hatched in row:
            hatch = "///" if hatched else None
            ax.add_patch(Rectangle((x, y), 0.9, 0.8, fc=color, ec="black", lw=0.6, hatch=hatch))
            ink = "black" if hatched or color == GREY else "white"
            ax.text(x + 0.45, y + 0.4, text, ha="center", va="center", size=9, weight="bold", color=ink)
    ax.set_xlim(-0.2, max((box[0] for row in rows for box in row), default=0) + 1.1)
    ax.set_ylim(-0.2, len(rows))
    ax.set_yticks([len(rows) - 0.6 - k for k in range(len(rows))], labels)
    ax.spines[["top", "right", "bottom"]].set_visible(False)
    ax.tick_params(axis="x", length=0)


def _rank_legend(fig: Any, world: int, label: str, *extra: tuple[str, str]) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=f"C{r % 10}", label=label.format(r)) for r in range(world)]
    handles += [Patch(color=color, label=text) for color, text in extra]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)


def draw_sampler(n: int = 10, world_size: int = 3, epoch: int = 0, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0) -> Any:
    """Print and draw one epoch of DistributedSampler: the epoch's order, then each rank's share."""
    from .figures import pyplot
    plt = pyplot()

    shares = sampler_indices(n, world_size, epoch, shuffle, seed, drop_last)
    order = [shares[p % world_size][p // world_size] for p in range(world_size * len(shares[0]))]
    dropped = sorted(set(range(n)) - set(order))
    print(f"DistributedSampler(n={n}, num_replicas={world_size}, shuffle={shuffle}, seed={seed}, "
          f"drop_last={drop_last}), set_epoch({epoch})")
    for r, share in enumerate(shares):
        print(f"  rank {r}: {share}")
    note = f"each rank reads {len(shares[0])} indices per epoch"
    if len(order) > n:
        note += f"; {len(order) - n} padded (repeated from the start of the order)"
    if dropped:
        note += f"; {len(dropped)} dropped this epoch: {dropped}"
    print("  " + note)

    top = [(p, str(i), f"C{p % world_size % 10}", p >= n) for p, i in enumerate(order)]
    top += [(len(order) + 0.3 + x, str(i), GREY, False) for x, i in enumerate(dropped)]
    rows = [top] + [[(k, str(i), f"C{r % 10}", r + k * world_size >= n) for k, i in enumerate(s)]
                    for r, s in enumerate(shares)]
    width = min(12.0, 2.6 + 0.5 * max(len(order), n))
    fig, ax = plt.subplots(figsize=(width, 1.4 + 0.45 * (world_size + 1.5)))
    order_label = f"order (seed {seed}+{epoch})" if shuffle else "order (no shuffle)"
    _boxes(ax, rows, [order_label] + [f"rank {r}" for r in range(world_size)])
    ax.set_xticks([])
    ax.set_xlabel("position in the epoch (hatched: padding, a repeated index; grey: dropped)")
    ax.set_title(f"DistributedSampler: {n} items, {world_size} ranks, epoch {epoch}, "
                 f"shuffle={shuffle}, drop_last={drop_last}", fontsize=10)
    fig.tight_layout()
    return fig


def draw_sampler_epochs(records: Sequence[Mapping[str, Any]]) -> Any:
    """From sampler_demo.py's records: which rank read each item (colour) and when (number)."""
    from .figures import pyplot
    plt = pyplot()

    n, modes = int(records[0]["small"]), ("with set_epoch", "without set_epoch")
    epochs = len(records[0][modes[0]])
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 0.9 + 0.55 * epochs))
    for ax, mode in zip(axes, modes, strict=True):
        rows = [[(i, str(pos), f"C{int(rec['rank']) % 10}", False)
                 for rec in records for pos, i in enumerate(rec[mode][e])] for e in range(epochs)]
        _boxes(ax, rows, [f"epoch {e}" for e in range(epochs)])
        ax.set_xticks([i + 0.45 for i in range(n)], [str(i) for i in range(n)])
        ax.set_xlabel("item of the data set")
        ax.set_title(f"DistributedSampler {mode}")
    _rank_legend(fig, len(records), "read by rank {}")
    fig.suptitle("Who reads which item (number: position in that rank's epoch)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def draw_collectives(records: Sequence[Mapping[str, Any]]) -> Any:
    """Before and after, on every rank, for each collective collectives.py recorded."""
    from .figures import pyplot
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
        ax.set_xticks([before_w / 2, after_x + len(after) / 2], ["before", "after"])
        ax.set_title(f"{name}: {COLLECTIVES[name]}", fontsize=10, loc="left")
    _rank_legend(fig, world, "rank {}'s data", (GREY, "a sum over all ranks"))
    fig.suptitle(f"Collectives on {world} real processes: what each rank holds before and after")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def draw_shards(full: Mapping[str, Sequence[int]], local: Sequence[Mapping[str, Sequence[int]]]) -> Any:
    """FSDP's sharding: which rows (dim 0) of each parameter (``full[name]``: its shape) rank r
    stores (``local[r][name]``: the shape of its shard)."""
    from .figures import pyplot
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.55 * len(full)))
    for i, name in enumerate(full):
        rows, start = int(full[name][0]), 0
        for r, shapes in enumerate(local):
            k = min(int(shapes[name][0]), rows - start)
            ax.barh(i, k / rows, left=start / rows, color=f"C{r % 10}", edgecolor="black")
            text = f"rank {r}: rows {start}-{start + k - 1}"
            ax.text((start + k / 2) / rows, i, text, ha="center", va="center", color="white", size=8)
            start += k
    ax.set_yticks(range(len(full)), [f"{name} {list(shape)}" for name, shape in full.items()])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of the parameter's rows (dim 0)")
    ax.set_title("fully_shard: every rank stores a slice of every parameter")
    fig.tight_layout()
    return fig


def sampler_explorer() -> Any:
    """Sliders and boxes for :func:`draw_sampler`'s arguments, redrawn on every change."""
    import ipywidgets as w

    from .figures import show_figure

    d = EXPLORER_DEFAULTS
    ranges = {"n": ("items", 1, 20), "world_size": ("world size", 1, 8), "epoch": ("epoch", 0, 9)}
    sliders = {key: w.IntSlider(value=d[key], min=low, max=high, description=text,
                                continuous_update=False) for key, (text, low, high) in ranges.items()}
    boxes = {key: w.Checkbox(value=d[key], description=key) for key in ("shuffle", "drop_last")}
    out = w.interactive_output(lambda **kw: show_figure(draw_sampler(**kw, seed=d["seed"])),
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
