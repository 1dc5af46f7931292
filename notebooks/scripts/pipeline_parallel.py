"""Pipeline parallelism: a stack of transformer blocks cut into one stage per rank with
``torch.distributed.pipelining``, trained one step with GPipe and with 1F1B, proven equal to the
unsplit model, and each stage's work timed for a timeline.

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/pipeline_parallel.py --out /tmp/pp
    # --out: a folder for each rank's JSON record (optional)
    # or, in a notebook: course_utils.launch.torchrun("scripts/pipeline_parallel.py", nproc=2)

Rank s holds blocks [s*B/N, (s+1)*B/N) (the last rank the head too) as a ``PipelineStage``. A batch is
cut into micro-batches; the schedule streams them through the stages: GPipe runs every forward, then
every backward; 1F1B starts the backward of a micro-batch as soon as the last stage has its loss,
so that a stage holds the activations of at most N - s micro-batches instead of all of them.
Every rank also runs the unsplit model on the whole batch (float64): the pipeline's loss, output and
each stage's weight gradients must equal it. The forward and backward of every micro-batch on
every stage are timed (after a barrier, each rank's clock from there), for the timeline and the
bubble: the fraction of a step a stage waits, against the formula (N - 1) / (M + N - 1).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from course_utils.ch07_parallelism import (
    Stack,
    bubble_fraction,
    max_diff,
    run_in_unit_time,
    schedule_orders,
    seeded,
    timeline_facts,
    write_record,
)
from course_utils.dist import cleanup, rprint, setup

SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
TOL = 1e-12


def stage_module(full: nn.Module, stage: int, stages: int) -> nn.Module:
    """Stage `stage`'s part of `full` (a copy): its blocks, and the head on the last stage only."""
    part = copy.deepcopy(full)
    names = list(part.blocks.keys())
    per = len(names) // stages
    for name in names[:stage * per] + names[(stage + 1) * per:]:
        del part.blocks[name]
    if stage != stages - 1:
        part.head = None
    return part


def timed(stage: PipelineStage, events: list, clock: Callable[[], float]) -> None:
    """Record (kind, micro-batch, start, end) of every forward and backward the schedule runs on `stage`."""
    for kind, method in (("F", "forward_one_chunk"), ("B", "backward_one_chunk")):
        original = getattr(stage, method)

        def wrapper(chunk, *args, _original=original, _kind=kind, **kwargs):
            if stage.device.type == "cuda":  # (kernels run asynchronously: time them, not their launch)
                torch.cuda.synchronize(stage.device)
            start = clock()
            result = _original(chunk, *args, **kwargs)
            if stage.device.type == "cuda":
                torch.cuda.synchronize(stage.device)
            events.append((_kind, int(chunk), start, clock()))
            return result

        setattr(stage, method, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (M)")
    parser.add_argument("--blocks", type=int, default=4, help="transformer blocks (a multiple of the ranks)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    problem = ""
    if args.blocks % n:
        problem = f"--blocks {args.blocks} cannot be cut into {n} equal stages: use a multiple of {n}."
    elif args.batch % args.microbatches:
        problem = f"--batch {args.batch} must be a multiple of --microbatches {args.microbatches}."
    elif args.microbatches < n:
        problem = f"1F1B needs at least as many micro-batches as stages: --microbatches {args.microbatches} < {n}."
    if problem:
        if r == 0:
            rprint(f"error: {problem}")
        cleanup()
        raise SystemExit(2)

    m = args.microbatches
    full = seeded(lambda: Stack(args.blocks, args.dim, 4, 4 * args.dim, 10), 0).to(dev)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.dim, generator=gen, dtype=torch.float64).to(dev)
    y = torch.randn(args.batch, args.seq, 10, generator=gen, dtype=torch.float64).to(dev)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, target)  # a mean: the schedule divides the gradients by M (scale_grads)

    # The reference: the whole model, the whole batch, on every rank.
    ref_out = full(x)
    ref_loss = loss_fn(ref_out, y)
    ref_loss.backward()
    ref_grads = {name: p.grad for name, p in full.named_parameters()}

    results = {}
    for name, schedule_class in SCHEDULES.items():
        part = stage_module(full, r, n)
        part.zero_grad(set_to_none=True)
        stage = PipelineStage(part, r, n, dev)
        schedule = schedule_class(stage, n_microbatches=m, loss_fn=loss_fn)
        for _step in range(2):  # step 0 also sets the stages up (shapes exchanged): time step 1
            part.zero_grad(set_to_none=True)
            events: list = []
            dist.barrier()
            t0 = time.perf_counter()
            timed(stage, events, lambda t0=t0: time.perf_counter() - t0)
            losses: list = []
            if r == 0 and r == n - 1:
                out = schedule.step(x, target=y, losses=losses)
            elif r == 0:
                out = schedule.step(x)
            elif r == n - 1:
                out = schedule.step(target=y, losses=losses)
            else:
                out = schedule.step()
            span = time.perf_counter() - t0
            for method in ("forward_one_chunk", "backward_one_chunk"):
                delattr(stage, method)  # back to the class's method
        diffs = {"grads": max(max_diff(p.grad, ref_grads[pname]) for pname, p in part.named_parameters())}
        if r == n - 1:
            diffs["output"] = max_diff(out, ref_out)
            diffs["loss"] = abs(torch.stack(losses).mean().item() - ref_loss.item())
        worst = torch.tensor([max(diffs.values())], dtype=torch.float64, device=dev)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        busy = sum(end - start for _, _, start, end in events)
        in_flight = peak = 0
        for kind, _, _, _ in sorted(events, key=lambda e: e[2]):
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        order = [(k, mb) for k, mb, _, _ in sorted(events, key=lambda e: e[2])]
        orders: list = [None] * n
        dist.all_gather_object(orders, order)
        orders = [[tuple(a) for a in o] for o in orders]
        results[name] = {"diffs": diffs, "worst": worst.item(), "events": events, "span": span,
                         "busy": busy, "peak_in_flight": peak,
                         "unit_bubble": timeline_facts(run_in_unit_time(orders))["bubble"],
                         "order_as_modelled": orders == schedule_orders(name, n, m)}
        assert results[name]["order_as_modelled"], f"{name} ran its actions in an order the course does not model"
        rprint(f"{name:<5} stage {r}: max |diff| vs unsplit {worst.item():.1e} (< {TOL:.0e}: "
               f"{worst.item() < TOL}); micro-batches held at once: {peak} of {m}; "
               f"busy {1000 * busy:.0f} ms of a {1000 * span:.0f} ms step")
        assert worst.item() < TOL, f"{name}: the pipeline differs from the unsplit model"

    formula = bubble_fraction(n, m)
    for name, res in results.items():
        spans = [0.0] * n
        busies = [0.0] * n
        dist.all_gather_object(spans, res["span"])
        dist.all_gather_object(busies, res["busy"])
        res["measured_bubble"] = 1 - sum(busies) / (n * max(spans))
        if r == 0:
            rprint(f"{name:<5} bubble: measured {res['measured_bubble']:.2f}, the order run in unit time "
                   f"{res['unit_bubble']:.3f}, formula (N-1)/(M+N-1) = {formula:.3f}")
    write_record(args.out, "pp", r, {"rank": r, "world": n, "microbatches": m, "formula": formula,
                                     "results": results})
    cleanup()


if __name__ == "__main__":
    main()
