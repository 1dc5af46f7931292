"""Chapter 07 (parallelism), the pictures of what the scripts measured: the tensor-parallel shards, the two
pipeline timelines, the 2-D mesh's rows, the overlap of communication with backward, and the stragglers.
Used in the deep dives of notebook 07 ("Tensor parallelism", "Pipeline parallelism", "A 2-D mesh",
"Overlap of communication and computation", "Stragglers"), through ``course_utils.ch07_parallelism``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .ch07_schedules import _draw_timeline
from .i18n import tr

# ---------------------------------------------------------------------------------------------
# The chapter's pictures of what the scripts measured
# ---------------------------------------------------------------------------------------------


def draw_tp_shards(record: Mapping[str, Any], world: int) -> Any:
    """The block's four big weights, each drawn as its full matrix cut into the parts the ranks hold:
    column-wise layers by rows (output features), row-wise layers by columns (input features)."""
    from matplotlib.patches import Rectangle

    from .figures import OKABE_ITO, describe_figure, pyplot

    plt = pyplot()
    shards = record["shards"]
    names = [("attn.q.weight", "ColwiseParallel"), ("attn.o.weight", "RowwiseParallel"),
             ("mlp.up.weight", "ColwiseParallel"), ("mlp.down.weight", "RowwiseParallel")]
    fig, axes = plt.subplots(1, 4, figsize=(10, 3.2))
    for ax, (name, style) in zip(axes, names, strict=True):
        (rows, cols), (lr, lc) = shards[name]
        by_rows = lr != rows
        for k in range(world):
            if by_rows:
                ax.add_patch(Rectangle((0, k * lr), cols, lr, color=OKABE_ITO[k % 7], alpha=0.85))
            else:
                ax.add_patch(Rectangle((k * lc, 0), lc, rows, color=OKABE_ITO[k % 7], alpha=0.85))
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_title(f"{name}\n{style}: {[lr, lc]} {tr('per rank', '每个 rank')}", fontsize=8)
        ax.set_xlabel(tr("input features", "输入特征"), fontsize=8)
        ax.set_ylabel(tr("output features", "输出特征"), fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [Rectangle((0, 0), 1, 1, color=OKABE_ITO[k % 7]) for k in range(world)]
    fig.legend(handles, [f"rank {k}" for k in range(world)], loc="lower center", ncol=world, fontsize=8)
    fig.suptitle(tr("What each rank holds of the block's weights under tensor parallelism",
                    "张量并行下每个 rank 持有块中权重的哪一部分"), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    parts = "; ".join(f"{n} {shards[n][0]} -> {shards[n][1]}" for n, _ in names)
    return describe_figure(
        fig, "Four weight matrices drawn as rectangles, each cut into {world} coloured parts, one per rank: q and up "
        "are cut by rows (output features, ColwiseParallel), o and down by columns (input features, RowwiseParallel). "
        "Full shape -> each rank's part: {parts}.",
        "四个权重矩阵画成矩形，每个切成 {world} 个彩色部分，每个 rank 一份："
        "q 和 up 按行切分（输出特征，ColwiseParallel），"
        "o 和 down 按列切分（输入特征，RowwiseParallel）。完整形状 -> 每个 rank 的部分：{parts}。",
        world=world, parts=parts)


def draw_pipeline(records: Sequence[Mapping[str, Any]]) -> Any:
    """The measured timeline of one training step of each schedule: every stage's forwards and backwards
    of every micro-batch, in milliseconds from the step's start."""
    from .figures import describe_figure, pyplot

    plt = pyplot()
    names = list(records[0]["results"])
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 + 1.1 * len(names) * len(records) / 2 + 0.6), sharex=True)
    for ax, name in zip(axes, names, strict=True):
        timeline = [[(k, mb, 1000 * s, 1000 * e) for k, mb, s, e in rec["results"][name]["events"]] for rec in records]
        _draw_timeline(ax, timeline, tr("milliseconds from the start of the step",
                                        "从这一步开始算起的毫秒数"))
        held = [rec["results"][name]["peak_in_flight"] for rec in records]
        ax.set_title(tr("{name}: micro-batches held at once per stage {held}",
                        "{name}：每个阶段同时持有的微批次 {held}", name=name, held=held), fontsize=9)
    fig.tight_layout()
    m, n = records[0]["microbatches"], len(records)
    return describe_figure(
        fig, "Two timelines measured on {n} ranks, GPipe above and 1F1B below: for each stage a row of blue forward "
        "boxes and orange backward boxes of micro-batches 0 to {last}. GPipe runs every forward before any backward; "
        "{interleaved}",
        "在 {n} 个 rank 上测得的两条时间线，上为 GPipe，下为 1F1B：每个阶段一行，蓝色为微批次 0 到 {last} 的前向，"
        "橙色为反向。GPipe 先做完所有前向再做反向；{interleaved}",
        n=n, last=m - 1, interleaved=tr("1F1B interleaves them, so stage 0 holds fewer micro-batches at once.",
                                        "1F1B 让两者交替，因此阶段 0 同时持有的微批次更少。") if m > n else
        tr("1F1B interleaves them; with no more micro-batches than stages, stage 0 still holds all of them at once.",
           "1F1B 让两者交替；但微批次不多于阶段数时，阶段 0 仍会同时持有全部微批次。"))


def draw_mesh(records: Sequence[Mapping[str, Any]]) -> Any:
    """Which rows of attn.q.weight (64 x 64) each rank of the 2-D mesh holds, under FSDP x TP and HSDP."""
    from matplotlib.patches import Rectangle

    from .figures import OKABE_ITO, describe_figure, pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, key, title in ((axes[0], "fsdp_tp", tr("FSDP x TP (dp, tp)", "FSDP x TP (dp, tp)")),
                           (axes[1], "hsdp", tr("HSDP (replicate, shard)", "HSDP (replicate, shard)"))):
        for rec in records:
            rows, r = rec[key]["rows"], rec["rank"]
            ax.add_patch(Rectangle((r, rows[0]), 0.9, len(rows), color=OKABE_ITO[r % 7]))
            ax.text(r + 0.45, rows[0] + len(rows) / 2, f"{rows[0]}-{rows[-1]}", ha="center", va="center", fontsize=8,
                    rotation=90)
        ax.set_xlim(-0.1, len(records))
        ax.set_ylim(64, 0)
        ax.set_xticks([r + 0.45 for r in range(len(records))],
                      [f"rank {rec['rank']}\n{tuple(rec[key]['coords'])}" for rec in records], fontsize=8)
        ax.set_ylabel(tr("row of attn.q.weight", "attn.q.weight 的行"))
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    def held(key: str) -> str:
        return tr("; ", "；").join(tr("rank {r} rows {first}-{last}", "rank {r} 第 {first}-{last} 行", r=rec["rank"],
                                     first=rec[key]["rows"][0], last=rec[key]["rows"][-1]) for rec in records)

    return describe_figure(
        fig, "Two panels of {count} bars, one per rank, marking the rows of the 64-row attn.q.weight that the "
        "rank holds. FSDP x TP: {fsdp_tp}. HSDP: {hsdp} (two copies).",
        "两幅图，各有 {count} 个条，每个 rank 一条，标出该 rank 持有 64 行的 attn.q.weight 中的哪些行。"
        "FSDP x TP：{fsdp_tp}。HSDP：{hsdp}（两份副本）。",
        count=len(records), fsdp_tp=held("fsdp_tp"), hsdp=held("hsdp"))


def draw_overlap(record: Mapping[str, Any]) -> Any:
    """The profiler's timeline of one DDP backward (the autograd nodes that compute, the all-reduces that
    communicate) and, for each bucket size, how much communication ran during backward and after it."""
    from .figures import COLORS, describe_figure, pyplot

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    trace = record["trace"]
    for start, end, _ in trace["compute"]:
        ax.barh(1, end - start, left=start, color=COLORS["blue"], height=0.6)
    for start, end, _ in trace["comm"]:
        ax.barh(0, end - start, left=start, color=COLORS["orange"], height=0.6, edgecolor="black", linewidth=0.5)
    ax.set_yticks([0, 1], [tr("all-reduces\n(gloo's thread)", "all-reduce\n（gloo 的线程）"),
                           tr("backward\n(main thread)", "反向传播\n（主线程）")])
    ax.set_xlabel(tr("milliseconds", "毫秒"))
    ax.set_title(tr("One DDP backward, 1 MiB buckets (torch.profiler, rank 0)",
                    "一次 DDP 反向传播，1 MiB 桶（torch.profiler，rank 0）"), fontsize=9)
    caps = list(record["sweep"])
    over = [1000 * record["sweep"][c]["overlapped"] for c in caps]
    exposed = [1000 * record["sweep"][c]["exposed"] for c in caps]
    xs = range(len(caps))
    bx.bar(xs, over, color=COLORS["green"], label=tr("during backward", "反向传播期间"))
    bx.bar(xs, exposed, bottom=over, color=COLORS["vermilion"],
           label=tr("exposed after backward", "反向传播之后暴露的"))
    bx.set_xticks(list(xs), [f"{float(c):g}\n({record['sweep'][c]['buckets']})" for c in caps])
    bx.set_xlabel(tr("bucket_cap_mb (buckets)", "bucket_cap_mb（桶数）"))
    bx.set_ylabel(tr("communication, ms (median)", "通信，毫秒（中位数）"))
    bx.legend(fontsize=8)
    bx.set_title(tr("Where the all-reduces ran", "all-reduce 在何时运行"), fontsize=9)
    fig.tight_layout()
    return describe_figure(
        fig, "Left: a timeline of one DDP backward on rank 0, blue bars for the autograd nodes computing on the main "
        "thread and orange bars for the {count} gradient all-reduces on gloo's thread, the first of them "
        "beside the blue ones. Right: for each bucket_cap_mb, stacked bars of the communication time that ran during "
        "backward (green) and after it (red).",
        "左：rank 0 上一次 DDP 反向传播的时间线，蓝条是主线程上计算的 autograd 节点，橙条是 gloo 线程上的 "
        "{count} 次梯度 all-reduce，其中最先的几次与蓝条并排。右：每种 bucket_cap_mb 下，"
        "堆叠的条形表示在反向传播期间（绿）和之后（红）运行的通信时间。",
        count=len(trace["comm"]))


def draw_stragglers(records: Sequence[Mapping[str, Any]]) -> Any:
    """Each rank's step time before and after one rank was slowed, split into compute and the time in the
    all-reduce (waiting for the others, then communicating)."""
    from .figures import COLORS, describe_figure, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.38
    for rec in records:
        r = rec["rank"]
        for k, (key, hatch) in enumerate((("base", ""), ("slowed", "//"))):
            m = rec[key]
            x = r + (k - 0.5) * width
            ax.bar(x, 1000 * m["compute"], width, color=COLORS["blue"], hatch=hatch, edgecolor="white")
            ax.bar(x, 1000 * m["allreduce"], width, bottom=1000 * m["compute"], color=COLORS["orange"], hatch=hatch,
                   edgecolor="white")
    slow, delay = records[0]["slow_rank"], records[0]["delay"]
    ax.set_xticks(range(len(records)),
                  [f"rank {rec['rank']}" + (tr(" (slowed)", "（被减速）") if rec["rank"] == slow else "")
                   for rec in records])
    ax.set_ylabel(tr("milliseconds per step (median)", "每步毫秒数（中位数）"))
    ax.bar(0, 0, color=COLORS["blue"], label=tr("compute", "计算"))
    ax.bar(0, 0, color=COLORS["orange"], label=tr("in the all-reduce", "在 all-reduce 中"))
    ax.legend(fontsize=8, title=tr("left: no delay; right, hatched: one rank slowed",
                                   "左：无延迟；右（斜线）：一个 rank 被减速"), title_fontsize=8)
    ax.set_title(tr("Rank {slow} sleeps {value:.0f} ms a step: every rank's step grows by about as much",
                    "rank {slow} 每步多睡 {value:.0f} 毫秒：每个 rank 的每一步都变长了差不多同样多",
                    slow=slow, value=1000 * delay), fontsize=9)
    fig.tight_layout()
    return describe_figure(
        fig, "Grouped stacked bars per rank: a step's compute (blue) and time in the all-reduce (orange), without a "
        "delay and with rank {slow} sleeping {ms:.0f} ms per step. With the delay every rank's bar grows "
        "by about {ms:.0f} ms: the slowed rank's in compute, the others' in the all-reduce, where they wait.",
        "每个 rank 一组堆叠条形：一步中的计算（蓝）和在 all-reduce 中的时间（橙），分别是无延迟时和 rank {slow} "
        "每步多睡 {ms:.0f} 毫秒时。有延迟时每个 rank 的条都增长了约 {ms:.0f} 毫秒："
        "被减速的 rank 增长在计算上，其他 rank 增长在 all-reduce 中的等待上。",
        slow=slow, ms=1000 * delay)
