"""Chapter 07 (parallelism), pipeline schedules in unit time: the order of each stage's forwards and backwards
under GPipe and 1F1B, their timelines, the bubble and the activations in flight, drawn, and the schedule
explorer widget. Used in the deep dive "Pipeline parallelism, GPipe and 1F1B" of notebook 07 and by
``scripts/pipeline_parallel.py`` (its "formula" line), through ``course_utils.ch07_parallelism``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .i18n import tr

# ---------------------------------------------------------------------------------------------
# Pipeline schedules in unit time (the widget, and the "formula" line of the script)
# ---------------------------------------------------------------------------------------------

SCHEDULES = ("GPipe", "1F1B")
#: The schedule explorer's default view (also what the notebook's static twin shows).
SCHEDULE_DEFAULTS = dict(stages=4, microbatches=8, schedule="1F1B")


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle fraction of a GPipe or 1F1B pipeline step when every stage takes the same time per
    micro-batch and communication is free: ``(p - 1) / (m + p - 1)``."""
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages and microbatches must be at least 1, got {stages} and {microbatches}")
    return (stages - 1) / (microbatches + stages - 1)


def schedule_orders(schedule: str, stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """The order in which each stage runs its forwards ("F", i) and backwards ("B", i), as PyTorch's
    ``ScheduleGPipe`` and ``Schedule1F1B`` run them: GPipe every forward then every backward; 1F1B
    ``stages - s`` forwards first on stage s, then one backward and one forward in turn, then the rest.
    ``Schedule1F1B`` refuses fewer micro-batches than stages (ValueError); :func:`schedule_explorer` says so."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages and microbatches must be at least 1, got {stages} and {microbatches}")
    orders = []
    for s in range(stages):
        if schedule == "GPipe":
            orders.append([("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)])
            continue
        warmup = min(microbatches, stages - s)
        order = [("F", i) for i in range(warmup)]
        f, b = warmup, 0
        while b < microbatches:
            order.append(("B", b))
            b += 1
            if f < microbatches:
                order.append(("F", f))
                f += 1
        orders.append(order)
    return orders


def run_in_unit_time(orders: Sequence[Sequence[tuple[str, int]]], backward_cost: int = 2) -> list[list[tuple]]:
    """Each stage's actions with their start and end, as if a forward took 1 unit of time, a backward
    `backward_cost`, and messages none: a stage starts an action when it has finished its previous one
    and the action's input exists (F of micro-batch i needs F of i on the stage before; B of i needs B of
    i on the stage after, or F of i on the last stage). ``[stage][k] = (kind, i, start, end)``."""
    stages = len(orders)
    done: dict[tuple[int, str, int], int] = {}
    position, clock = [0] * stages, [0] * stages
    out: list[list[tuple]] = [[] for _ in range(stages)]
    while any(position[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, mb = orders[s][position[s]]
            if kind == "F":
                need = (s - 1, "F", mb) if s > 0 else None
            else:
                need = (s + 1, "B", mb) if s < stages - 1 else (s, "F", mb)
            if need is not None and need not in done:
                continue
            start = max(clock[s], done[need] if need else 0)
            clock[s] = start + (1 if kind == "F" else backward_cost)
            done[(s, kind, mb)] = clock[s]
            out[s].append((kind, mb, start, clock[s]))
            position[s] += 1
            moved = True
        if not moved:
            raise RuntimeError("the stages' orders wait on each other: not a valid schedule")
    return out


def timeline_facts(timeline: Sequence[Sequence[tuple]]) -> dict:
    """The bubble (idle fraction of stages x step time) and the most micro-batches whose activations a
    stage holds at once (forwards done, backwards not yet), from a timeline of (kind, i, start, end)."""
    span = (max(end for stage in timeline for *_, end in stage)
            - min(start for stage in timeline for _, _, start, _ in stage))
    busy = sum(end - start for stage in timeline for _, _, start, end in stage)
    peaks = []
    for stage in timeline:
        held = peak = 0
        for kind, *_ in sorted(stage, key=lambda e: e[2]):
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return {"bubble": 1 - busy / (len(timeline) * span), "peak_in_flight": peaks, "span": span}


def _draw_timeline(ax: Any, timeline: Sequence[Sequence[tuple]], unit: str) -> None:
    from .figures import COLORS

    colors = {"F": COLORS["blue"], "B": COLORS["orange"]}
    for s, stage in enumerate(timeline):
        for kind, mb, start, end in stage:
            ax.barh(s, end - start, left=start, color=colors[kind], edgecolor="white", height=0.8)
            ax.text((start + end) / 2, s, f"{kind}{mb}", ha="center", va="center", fontsize=7,
                    color="white" if kind == "F" else "black")
    ax.set_yticks(range(len(timeline)), [tr("stage {s}", "阶段 {s}", s=s) for s in range(len(timeline))])
    ax.invert_yaxis()
    ax.set_xlabel(unit)


def draw_schedule(stages: int = 4, microbatches: int = 8, schedule: str = "1F1B", backward_cost: int = 2) -> Any:
    """The timeline of `schedule` on `stages` stages and `microbatches` micro-batches in unit time
    (a forward 1, a backward `backward_cost`), its bubble against ``(p-1)/(m+p-1)`` and the activations held."""
    from .figures import describe_figure, pyplot

    plt = pyplot()
    timeline = run_in_unit_time(schedule_orders(schedule, stages, microbatches), backward_cost)
    facts = timeline_facts(timeline)
    formula = bubble_fraction(stages, microbatches)
    fig, ax = plt.subplots(figsize=(9, 0.45 * stages + 1.4))
    _draw_timeline(ax, timeline, tr("time (a forward = 1 unit, a backward = 2)",
                                    "时间（前向 = 1 个单位，反向 = 2 个）"))
    ax.set_title(tr("{schedule}, {stages} stages, {microbatches} micro-batches: bubble {facts:.3f} (formula "
                    "{formula:.3f}); stage 0 holds at most {facts2} micro-batches",
                    "{schedule}，{stages} 个阶段，{microbatches} 个微批次：气泡 {facts:.3f}（公式 {formula:.3f}）；"
                    "阶段 0 最多同时持有 {facts2} 个微批次",
                    schedule=schedule, stages=stages, microbatches=microbatches, facts=facts['bubble'],
                    formula=formula, facts2=facts['peak_in_flight'][0]), fontsize=9)
    fig.tight_layout()
    return describe_figure(
        fig,
        "A timeline of the {schedule} pipeline schedule: {stages} rows (stages) of boxes, blue forwards F0 to "
        "F{last} and orange backwards, in unit time. Idle fraction {bubble:.3f}, equal to "
        "(p-1)/(m+p-1) = {formula:.3f}; stage 0 holds the activations of at most {peak} micro-batches at once.",
        "{schedule} 流水线调度的时间线：{stages} 行（阶段）方块，蓝色为前向 F0 到 F{last}，橙色为反向，"
        "单位时间。空闲比例 {bubble:.3f}，等于 (p-1)/(m+p-1) = {formula:.3f}；阶段 0 最多同时持有 "
        "{peak} 个微批次的激活。",
        schedule=schedule, stages=stages, last=microbatches - 1, bubble=facts["bubble"], formula=formula,
        peak=facts["peak_in_flight"][0])


def schedule_explorer() -> Any:
    """Sliders for the stages and micro-batches and a menu for the schedule; redraws :func:`draw_schedule`."""
    import ipywidgets as w

    from .figures import show_figure, widget_callback

    d = SCHEDULE_DEFAULTS
    stages = w.IntSlider(value=d["stages"], min=1, max=8, description=tr("stages", "阶段数"),
                         continuous_update=False)
    micro = w.IntSlider(value=d["microbatches"], min=1, max=16, description=tr("micro-batches", "微批次"),
                        continuous_update=False)
    schedule = w.Dropdown(options=list(SCHEDULES), value=d["schedule"], description=tr("schedule", "调度"))
    @widget_callback
    def redraw(stages: int, microbatches: int, schedule: str) -> None:
        if schedule == "1F1B" and microbatches < stages:  # Schedule1F1B raises ValueError there
            print(tr("PyTorch's Schedule1F1B needs at least as many micro-batches as stages ({microbatches} < "
                     "{stages}): it raises ValueError. Add micro-batches, or choose GPipe.",
                     "PyTorch 的 Schedule1F1B 要求微批次不少于阶段数（{microbatches} < {stages}），否则抛出 "
                     "ValueError。请增加微批次，或改用 GPipe。",
                     microbatches=microbatches, stages=stages))
            return
        show_figure(draw_schedule(stages, microbatches, schedule))

    out = w.interactive_output(redraw, {"stages": stages, "microbatches": micro, "schedule": schedule})
    return w.VBox([w.HBox([stages, micro, schedule]), out])
