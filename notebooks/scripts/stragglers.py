"""Stragglers, measured: one rank made slower by a known delay slows every rank; the straggler found
three ways (per-rank timings, ``monitored_barrier``, the flight recorder); and what balances the load
(length-sorted buckets instead of random batches, ``Join`` for ranks with fewer batches).

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/stragglers.py --out /tmp/stragglers
    # --out: a folder for each rank's JSON record (optional)
    # or, in a notebook: course_utils.launch.torchrun("scripts/stragglers.py", nproc=2)

A step is what data parallelism does: forward and backward on this rank's batch, then an all-reduce of
the gradients, which no rank can finish before every rank has joined it. Rank --slow-rank sleeps
--delay seconds in every step (a slow disk, a throttled GPU, a noisy neighbour). Each rank times its
compute and its wait in the all-reduce; the profiler and the flight recorder see the same from inside.
The profiler's view holds on gloo only: with nccl its CPU events ``nccl:all_reduce`` span the enqueue of
the all-reduce, not the GPU's wait for the slow rank (the script says so when it runs on nccl).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import statistics
import time
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the flight recorder: read when the group starts

import torch  # noqa: E402 - after the flight recorder's setting
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.algorithms.join import Join  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from course_utils.ch07_parallelism import (  # noqa: E402
    length_grouped_batches,
    quiet_native_stderr,
    random_batches,
    write_record,
)
from course_utils.dist import cleanup, rprint, setup  # noqa: E402

WIDTH = 256


def make(dev) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.Tanh(), nn.Linear(4 * WIDTH, WIDTH)).to(dev)


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step(model: nn.Module, x: torch.Tensor, delay: float, dev) -> tuple[float, float]:
    """One data-parallel step by hand: compute (plus `delay`), then the gradients' all-reduce.
    Returns (compute seconds, seconds in the all-reduce: waiting for the others, then communicating)."""
    t0 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    if delay:
        time.sleep(delay)
    sync(dev)
    t1 = time.perf_counter()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(flat)
    sync(dev)
    return t1 - t0, time.perf_counter() - t1


def timed_steps(model, x, delay: float, steps: int, dev) -> dict:
    """Median compute, all-reduce and whole-step seconds over `steps` steps (after one warm-up)."""
    rows = []
    for i in range(steps + 1):
        t = time.perf_counter()
        compute, wait = step(model, x, delay, dev)
        if i:
            rows.append((compute, wait, time.perf_counter() - t))
    return {k: statistics.median(r[i] for r in rows) for i, k in enumerate(("compute", "allreduce", "step"))}


def gather(obj, n: int) -> list:
    out: list = [None] * n
    dist.all_gather_object(out, obj)
    return out


def flight_record(backend: str) -> list[tuple[int, str, int]]:
    """This rank's flight recorder: (sequence number, collective, when the rank called it in ns). nccl keeps
    its own recorder (``_dump_nccl_trace``); gloo's is ``_dump_fr_trace``."""
    c10d = torch._C._distributed_c10d
    dump = c10d._dump_nccl_trace if backend == "nccl" else c10d._dump_fr_trace
    trace = pickle.loads(dump(includeStackTraces=False))
    return [(e["collective_seq_id"], e["profiling_name"], e["time_created_ns"]) for e in trace.get("entries", [])
            if e["process_group"][1] == "default_pg" and not e["is_p2p"]]


def run_plans(path: str, model: nn.Module, r: int, n: int, dev) -> list[dict]:
    """(The chapter's exercise.) Each plan in the JSON file at `path` (``{"lengths": [...], "plans":
    [plan, ...]}``, a plan being ``plan[rank][step]`` = sample indices) run for real: every rank reads its
    batches of the step (a sample of length L is L tokens of work), then the step's all-reduce; what each
    rank did, gathered. A plan that gives the ranks different numbers of steps is refused before any
    collective (a rank would wait forever for the others)."""
    job = json.loads(Path(path).read_text())
    lengths, results = job["lengths"], []
    for plan in job["plans"]:
        steps = [len(p) for p in plan]
        if len(plan) != n or len(set(steps)) != 1:
            results.append({"error": f"the plan must give each of the {n} ranks the same number of steps; it "
                                     f"gives {steps}"})
            continue
        if any(not 0 <= i < len(lengths) for p in plan for b in p for i in b):
            results.append({"error": f"a sample index is outside 0..{len(lengths) - 1}"})
            continue
        tokens, waited, seen = [], 0.0, []
        for batch in plan[r]:
            seen += batch
            count = sum(lengths[i] for i in batch)
            model.zero_grad(set_to_none=True)
            model(torch.randn(count, WIDTH, device=dev)).pow(2).mean().backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            t1 = time.perf_counter()
            dist.all_reduce(flat)
            sync(dev)
            waited += time.perf_counter() - t1
            tokens.append(count)
        results.append({"tokens": gather(tokens, n), "indices": gather(seen, n), "waited_ms": gather(1000 * waited, n)})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow-rank", type=int, default=1, help="the rank that is made slower")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds the slow rank sleeps in each step")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per measurement")
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    parser.add_argument("--plans", default=None, help="(the exercise) a JSON file of batch plans to run")
    args = parser.parse_args()
    if args.delay < 0 or args.steps < 1:
        parser.error("--delay must be 0 or more seconds and --steps at least 1")

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    slow = args.slow_rank if n > 1 else None
    if slow is not None and not 0 <= slow < n:
        if r == 0:
            rprint(f"error: --slow-rank {args.slow_rank} is not a rank of this job (0 to {n - 1}).")
        cleanup()
        raise SystemExit(2)
    # monitored_barrier is gloo's: with nccl it runs on a gloo group of its own. Made now, while every
    # rank is here (making a group is itself a collective).
    monitor = dist.new_group(backend="gloo") if n > 1 else None
    # A group of its own for staging the hang below: the flight recorder then sees only the training's
    # collectives on the default group.
    gate = dist.new_group(backend="gloo") if n > 1 else None
    model = make(dev)
    if args.plans is not None:
        results = run_plans(args.plans, model, r, n, dev)
        write_record(args.out, "straggler_plans", r, {"rank": r, "results": results})
        rprint(f"{len(results)} plan(s) run: " + ", ".join("refused" if "error" in res else "ran" for res in results))
        cleanup()
        return
    x = torch.randn(256, WIDTH, generator=torch.Generator().manual_seed(r)).to(dev)
    record = {"rank": r, "world": n, "slow_rank": slow, "delay": args.delay}

    # 1. Every rank's step time, without and with one slow rank.
    base = timed_steps(model, x, 0.0, args.steps, dev)
    slowed = timed_steps(model, x, args.delay if r == slow else 0.0, args.steps, dev)
    record["base"], record["slowed"] = base, slowed
    rprint(f"rank {r}{' (slowed)' if r == slow else ''}: step {1000 * base['step']:5.1f} ms -> "
           f"{1000 * slowed['step']:5.1f} ms (compute {1000 * slowed['compute']:5.1f} ms, in all_reduce "
           f"{1000 * slowed['allreduce']:5.1f} ms)")

    # 2. The profiler's view of the slowed steps: how long each rank's all-reduce took, per step. The median
    #    over --steps steps, as for the timings: one step alone can be off by a pause of the machine (a
    #    rank descheduled for a while on a loaded CPU waits that much less in the all-reduce).
    with quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.barrier()  # the steps start together (a profiler can take long to start on a loaded machine)
        for _ in range(args.steps):
            step(model, x, args.delay if r == slow else 0.0, dev)
    per_step = [e.time_range.elapsed_us() / 1000 for e in prof.events()
                if e.name.startswith(("gloo:all_reduce", "nccl:all_reduce"))]
    record["profiler_allreduce_ms"] = statistics.median(per_step)
    record["profiler_allreduce_steps_ms"] = per_step
    if ctx.backend == "nccl":
        rprint("nccl: profiler_allreduce_ms is the CPU's time in nccl:all_reduce, the enqueue only, not the GPU's "
               "all-reduce or its wait for the slow rank (a trace with ProfilerActivity.CUDA shows those)")

    # 3. Finding the straggler. (a) Per-rank timings, gathered: the one that computes longest.
    computes = gather(slowed["compute"], n)
    found_timings = max(range(n), key=computes.__getitem__)
    # (b) monitored_barrier: rank 0 waits for each rank in turn and names those that do not arrive in time.
    #     It finds a rank that is stuck or desynchronised (never reaches the barrier), not a slow one: a rank
    #     that arrives late but within the timeout passes. So the scene is staged: the slow rank comes to the
    #     barrier only once the others have left it, rank 0 having given up on it after a short timeout, as
    #     a hung rank would. (An event, not a sleep: however long a busy machine pauses rank 0, the slow
    #     rank cannot arrive in time.)
    #     Rank 0 is the one that reports: with --slow-rank 0 the scene is not staged (named stays None).
    named = None
    if monitor is not None and slow != 0:
        if r == slow:
            dist.barrier(group=gate)  # until the others are past the monitored barrier
        try:
            with quiet_native_stderr():  # (gloo also logs the report on stderr; rank 0 prints it below)
                dist.monitored_barrier(group=monitor, timeout=datetime.timedelta(seconds=0.3), wait_all_ranks=True)
        except RuntimeError as exc:  # rank 0: the report; the late rank: its peer gave up on it
            if r == 0:
                named = str(exc).splitlines()[0]
        if r != slow:
            dist.barrier(group=gate)  # lets the slow rank come
        dist.barrier()  # (on the default group: the monitor's is closed after a timeout)
    # (c) The flight recorder: for each collective that some rank waited for (the ranks called it more
    #     than half the delay apart), which rank called it last. The times are each host's clock: comparing
    #     them across ranks is sound on one machine, across nodes only with synchronised clocks. In a hang,
    #     the sequence ids suffice: the rank whose last collective_seq_id is behind the others' is stuck.
    records = gather(flight_record(ctx.backend), n)
    last: dict[int, int] = {}
    seqs = set.intersection(*[{s for s, _, _ in rec} for rec in records]) if n > 1 else set()
    waited_for = 0
    for seq in sorted(seqs):
        times = [next(t for s, _, t in rec if s == seq) for rec in records]
        if max(times) - min(times) < 0.5 * args.delay * 1e9:
            continue
        waited_for += 1
        latest = max(range(n), key=times.__getitem__)
        last[latest] = last.get(latest, 0) + 1
    found_fr = max(last, key=last.get) if last else None
    record["found"] = {"timings": found_timings, "monitored_barrier": named, "flight_recorder": found_fr,
                       "last_counts": {str(k): v for k, v in sorted(last.items())}}
    if r == 0:
        rprint(f"found by per-rank timings: rank {found_timings} (compute ms per rank "
               f"{[round(1000 * c, 1) for c in computes]})")
        rprint(f"found by monitored_barrier: {named}")
        rprint(f"found by the flight recorder: of the {waited_for} collectives whose calls were more than half "
               f"the delay apart, rank {found_fr} called {last.get(found_fr, 0)} last")

    # 4. Balancing variable-length samples: random batches against length-sorted buckets.
    lengths = [int(v) for v in torch.randint(8, 257, (32 * n,), generator=torch.Generator().manual_seed(0))]
    balance = {}
    for name, plan in (("random", random_batches(lengths, n, 4, seed=0)),
                       ("length-sorted", length_grouped_batches(lengths, n, 4, seed=0))):
        tokens, times = [], []
        for batch in plan[r]:
            seq = torch.randn(sum(lengths[i] for i in batch), WIDTH, device=dev)
            dist.barrier()
            t = time.perf_counter()
            model.zero_grad(set_to_none=True)
            model(seq).pow(2).mean().backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat)
            sync(dev)
            times.append(time.perf_counter() - t)
            tokens.append(seq.shape[0])
        per_rank = gather(tokens, n)
        worst = sum(max(col) for col in zip(*per_rank, strict=True))
        mean = sum(sum(col) / n for col in zip(*per_rank, strict=True))
        balance[name] = {"tokens": tokens, "imbalance": worst / mean, "seconds": sum(times)}
        if r == 0:
            rprint(f"{name:<14} batches: the slowest rank's tokens / the mean, over all steps: {worst / mean:.3f}; "
                   f"time {sum(times):.2f} s")
    record["balance"] = balance

    # 5. Uneven inputs: rank r has 3 + r batches. Join lets the ranks that run out shadow the others'
    #    all-reduces (with zeros) instead of leaving them waiting forever.
    ddp = DDP(make(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    batches = 3 + r
    with Join([ddp]):
        for _ in range(batches):
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
    weights = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    spread = weights.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    same = bool(torch.equal(spread, weights))
    same = all(gather(same, n))
    record["join"] = {"batches": batches, "same_weights": same}
    rprint(f"rank {r}: {batches} batches under Join; every rank ends with the same weights: {same}")
    write_record(args.out, "stragglers", r, record)
    cleanup()


if __name__ == "__main__":
    main()
