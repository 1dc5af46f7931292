"""Overlap, measured: a DDP step traced with ``torch.profiler`` (the gradient all-reduces run while
backward computes), a ``bucket_cap_mb`` sweep, the communication that stays exposed after backward, a
step without overlap (forward and backward inside ``no_sync()``, then one all-reduce of every gradient),
and the ring model of an all-reduce held against the bytes each rank really sent.

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/comm_overlap.py --out /tmp/overlap
    python -m torch.distributed.run --standalone --nproc-per-node 3 scripts/comm_overlap.py --bytes-only
    # --out: a folder for each rank's JSON record (optional)
    # or, in a notebook: course_utils.launch.torchrun("scripts/comm_overlap.py", nproc=2)

What gloo over loopback can and cannot show: the timing of overlap (an all-reduce launched while
backward still computes) is real, and so are the bytes (Linux counts what each process writes to its
sockets). The speed is not a network's: the "link" is the kernel copying memory, and gloo's thread
that copies runs on the same CPU cores as the ranks' compute, so the time overlap saves here depends
on how busy those cores are and changes from run to run. On GPUs nccl moves the data with its own
kernels over NVLink or the network while the compute kernels run.

The timings mean something on gloo only. With nccl the totals (backward, the sequential baseline) are
taken after ``torch.cuda.synchronize``, but a bucket's interval is when the CPU handed it to nccl and
when its future's callback ran on the CPU, not when the GPU ran the all-reduce, and the profiler's CPU
events ``nccl:all_reduce`` span the enqueue only (for the GPU's time, a profiler trace with
``ProfilerActivity.CUDA``); the script says so when it runs on nccl. The bytes are measured
on gloo only. On 2 ranks a ring sends each rank's whole tensor once (2(N - 1)/N = 1), as a direct
exchange would: ``--bytes-only`` on 3 or more ranks tells them apart (a ring 4/3, a direct exchange 2).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

from course_utils.ch07_parallelism import (
    bytes_written,
    quiet_native_stderr,
    ring_allreduce_bytes,
    write_record,
)
from course_utils.dist import cleanup, rprint, setup

LAYERS, WIDTH, BATCH = 8, 512, 64


def make(dev) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(LAYERS)]).to(dev)


# No annotations on the hook on purpose: DDP checks them, and `from __future__ import annotations` turns
# them into strings that fail its check.
def timing_hook(state, bucket):
    """A DDP communication hook: the default all-reduce, with the time it was launched and completed."""
    entry = [time.perf_counter() - state["t0"], None, bucket.buffer().numel() * bucket.buffer().element_size()]
    state["buckets"].append(entry)
    fut = default_hooks.allreduce_hook(None, bucket)

    def done(f):
        entry[1] = time.perf_counter() - state["t0"]
        return f.value()

    return fut.then(done)


def counting_hook(state, bucket):
    """A DDP communication hook: the default all-reduce, counted in ``state["calls"]``."""
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The time covered by at least one of `spans`, as disjoint (start, end) pairs."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def sync(dev) -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that a clock read after it means something."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step_times(model: DDP, x: torch.Tensor, dev, steps: int) -> dict:
    """Median over `steps` of: the backward's wall time, when its last gradient was computed, and the
    buckets' launch and completion times (seconds from the start of backward)."""
    state = {"t0": 0.0, "buckets": []}
    model.register_comm_hook(state, timing_hook)
    first_layer = model.module[0][0].weight  # its gradient is the last one backward computes
    marks: dict[str, float] = {}
    first_layer.register_post_accumulate_grad_hook(lambda p: marks.__setitem__("grads", time.perf_counter()))
    rows = []
    # 1 warm-up step: DDP's first backward puts every gradient in ONE bucket (it does not know the order
    # backward produces them yet) and rebuilds its buckets in that order at the second forward.
    for _ in range(steps + 1):
        model.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        sync(dev)
        dist.barrier()
        state["buckets"] = []
        state["t0"] = t0 = time.perf_counter()
        loss.backward()
        sync(dev)
        t_end = time.perf_counter() - t0
        t_grads = marks["grads"] - t0
        buckets = state["buckets"]
        spans = union([(start, done) for start, done, _ in buckets])  # (gloo runs them one after another)
        overlapped = sum(max(0.0, min(done, t_grads) - start) for start, done in spans)
        comm = sum(done - start for start, done in spans)
        rows.append({"backward": t_end, "compute_end": t_grads, "exposed": max(0.0, t_end - t_grads),
                     "overlapped": overlapped, "comm": comm, "buckets": len(buckets),
                     "bucket_bytes": [b for _, _, b in buckets]})
    rows = rows[1:]
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("backward", "compute_end", "exposed", "overlapped", "comm")}
    return {**med, "buckets": rows[-1]["buckets"], "bucket_bytes": rows[-1]["bucket_bytes"]}


def trace(model: DDP, x: torch.Tensor) -> dict:
    """One backward under ``torch.profiler``: the intervals of backward's compute (the main thread's
    autograd nodes) and of the all-reduces (gloo's or nccl's own events), in ms from the first."""
    for _ in range(2):
        model(x).pow(2).mean().backward()
    loss = model(x).pow(2).mean()
    dist.barrier()
    with quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    found: dict[str, list] = {"compute": [], "launch": [], "comm": []}
    for e in prof.events():
        name, span = e.name, (e.time_range.start / 1000, e.time_range.end / 1000)
        if name.startswith("autograd::engine::evaluate_function:"):
            found["compute"].append((*span, name.split(": ")[1]))
        elif name == "c10d::allreduce_":  # the call that hands a bucket to the process group (main thread)
            found["launch"].append((*span, name))
        elif name.startswith(("gloo:all_reduce", "nccl:all_reduce")):  # the all-reduce itself (its own thread)
            found["comm"].append((*span, name))
    t0 = min(s for spans in found.values() for s, _, _ in spans)
    return {k: [(s - t0, e - t0, n) for s, e, n in sorted(v)] for k, v in found.items()}


def bytes_of(fn) -> int | None:
    """Bytes this rank wrote while `fn` ran (between two barriers): what it sent on gloo's sockets."""
    dist.barrier()
    before = bytes_written()
    fn()
    after = bytes_written()
    dist.barrier()
    return None if before is None or after is None else after - before


def ring_bytes(dev, x: torch.Tensor, n: int, grad_bytes: int) -> dict:
    """(gloo) The bytes this rank sent in a DDP backward and in three collectives of 3 MiB, each with the
    ring algorithm's bytes per rank; printed, and returned as {name: {"measured", "ring"}}."""
    model = DDP(make(dev), bucket_cap_mb=1)
    for _ in range(2):
        model(x).pow(2).mean().backward()
    loss = model(x).pow(2).mean()
    sent = bytes_of(loss.backward)
    t = torch.ones(3 << 18, device=dev)  # 3 MiB: divides evenly over 1, 2, 3 or 4 ranks
    nb = t.numel() * t.element_size()
    gathered, scattered = torch.empty(n * t.numel(), device=dev), torch.empty(t.numel() // n, device=dev)
    measured = {  # (bytes sent, the ring algorithm's bytes per rank)
        "DDP backward": (sent, ring_allreduce_bytes(grad_bytes, n)),
        "all_reduce 3 MiB": (bytes_of(lambda: dist.all_reduce(t)), ring_allreduce_bytes(nb, n)),
        "all_gather 3 MiB": (bytes_of(lambda: dist.all_gather_single(gathered, t)), (n - 1) * nb),
        "reduce_scatter 3 MiB": (bytes_of(lambda: dist.reduce_scatter_single(scattered, t)), (n - 1) / n * nb),
    }
    for k, (m, ring) in measured.items():
        ratio = f"{m / ring:.3f}" if m is not None and ring else "-"
        rprint(f"bytes sent by this rank, {k:<20}: measured {m if m is not None else 'n/a':>10}, "
               f"ring model {ring:>12,.0f}, ratio {ratio}")
    return {k: {"measured": m, "ring": ring} for k, (m, ring) in measured.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buckets-mb", default="1,4,25", help="bucket_cap_mb values to sweep, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting (after 2 warm-up steps)")
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    parser.add_argument("--bytes-only", action="store_true",
                        help="measure only the bytes sent against the ring model (gloo), record 'overlap_bytes'")
    args = parser.parse_args()
    try:
        caps = [float(c) for c in args.buckets_mb.split(",")]
    except ValueError:
        parser.error(f"--buckets-mb must be numbers separated by commas, e.g. 0.25,1,4,25; got {args.buckets_mb!r}")
    if not caps or min(caps) <= 0:
        parser.error("--buckets-mb values must be positive")

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    gloo = ctx.backend == "gloo"
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(r)).to(dev)
    grad_bytes = sum(p.numel() * p.element_size() for p in make(dev).parameters())
    record = {"rank": r, "world": n, "backend": ctx.backend, "grad_bytes": grad_bytes}
    if args.bytes_only:
        if gloo:
            record["bytes"] = ring_bytes(dev, x, n, grad_bytes)
        else:
            rprint("bytes: not measured with nccl (it does not send through this process's sockets)")
        write_record(args.out, "overlap_bytes", r, record)
        cleanup()
        return
    if not gloo:
        rprint("nccl: the profiler's nccl:all_reduce events and the bucket intervals below are CPU-side (the "
               "enqueue; launch, then the future's callback), not the GPU's all-reduces; only the synchronised "
               "totals are GPU time")

    # 1. The profiler's view of one step with 1 MiB buckets.
    model = DDP(make(dev), bucket_cap_mb=1)
    record["trace"] = trace(model, x)
    tr = record["trace"]
    end = max(e for _, e, _ in tr["compute"])
    launched = sum(1 for s, _, _ in tr["launch"] if s < end)
    ran = sum(1 for s, _, _ in tr["comm"] if s < end)
    rprint(f"profiler: backward computed for {end:.1f} ms; {len(tr['launch'])} all-reduces, {launched} of them "
           f"launched and {ran} running before backward's last node ended")

    # 2. The sweep: how many buckets, how much communication overlapped backward, how much was left after it.
    record["sweep"] = {}
    for cap in caps:
        res = step_times(DDP(make(dev), bucket_cap_mb=cap), x, dev, args.steps)
        record["sweep"][str(cap)] = res
        rprint(f"bucket_cap_mb={cap:<5g} {res['buckets']:>2} buckets; backward {1000 * res['backward']:6.1f} ms, "
               f"all-reduces {1000 * res['comm']:5.1f} ms of which {1000 * res['overlapped']:5.1f} ms during "
               f"backward's compute; exposed after it {1000 * res['exposed']:5.1f} ms")
    # Without overlap: backward alone, then one all-reduce of every gradient at the end. DDP decides at the
    # forward whether the backward will all-reduce (the forward prepares the reducer unless no_sync() is on),
    # so the forward runs inside no_sync() too: with only the backward inside, every bucket would still be
    # all-reduced during it. A counting hook checks that none is.
    model = DDP(make(dev), bucket_cap_mb=1)
    hooked = {"calls": 0}
    model.register_comm_hook(hooked, counting_hook)
    times, calls = [], []
    for _ in range(args.steps + 1):
        model.zero_grad(set_to_none=True)
        hooked["calls"] = 0
        with model.no_sync():
            loss = model(x).pow(2).mean()
            sync(dev)
            dist.barrier()
            t0 = time.perf_counter()
            loss.backward()
            sync(dev)
            t1 = time.perf_counter()
        calls.append(hooked["calls"])
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)
        sync(dev)
        times.append((t1 - t0, time.perf_counter() - t1))
    compute, comm = (statistics.median(t[i] for t in times[1:]) for i in (0, 1))
    record["sequential"] = {"compute": compute, "comm": comm, "allreduces_in_backward": max(calls)}
    rprint(f"no overlap: backward alone {1000 * compute:.1f} ms ({max(calls)} all-reduces during it), then one "
           f"all-reduce of all gradients {1000 * comm:.1f} ms")

    # 3. The ring model against the bytes sent.
    if gloo:
        record["bytes"] = ring_bytes(dev, x, n, grad_bytes)
    else:
        rprint("bytes: not measured with nccl (it does not send through this process's sockets)")
    write_record(args.out, "overlap", r, record)
    cleanup()


if __name__ == "__main__":
    main()
