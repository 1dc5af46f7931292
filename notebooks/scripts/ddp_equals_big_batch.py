"""The key fact of data parallelism, checked numerically, and what no_sync() and buckets change.

Run from the notebooks/ folder:

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ddp_equals_big_batch.py --out /tmp/big
    # --out: a folder for each rank's JSON record (optional)
    # or, in a notebook: course_utils.launch.torchrun("scripts/ddp_equals_big_batch.py", nproc=2)

1. N ranks with batch B each, under DDP, end with the same weights as ONE process that takes
   the N*B samples of the same step as one batch. Exact enough to mean something: float64, plain
   SGD (no momentum), no dropout or batch norm, a data set that divides evenly.
2. Gradient accumulation under DDP: k micro-batches per step, ``no_sync()`` on the first k-1,
   gives the same weights again, with one all-reduce per step instead of k.
3. Buckets: DDP all-reduces gradients in buckets, each one launched as soon as its gradients are
   ready, while backward is still computing the earlier layers (communication overlap).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, TensorDataset

from course_utils.data import digits_tensors
from course_utils.dist import cleanup, rprint, setup


def make_model(device: torch.device) -> nn.Module:
    """A small float64 MLP, the same initial weights every time (no dropout, no batch norm)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 32), nn.Tanh(), nn.Linear(32, 10)).double().to(device)


def flat(model: nn.Module) -> torch.Tensor:
    """All parameters as one float64 vector."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# No annotations on the hooks on purpose: DDP checks them, and `from __future__ import annotations`
# turns them into strings that fail its check.
def counting_hook(state, bucket):
    """A DDP communication hook: count one bucket all-reduce in `state`, then do the default all-reduce."""
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="per-rank batch size B")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per step for accumulation")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    B, S, k = args.batch, args.steps, args.micro
    X, y = digits_tensors("train")
    fits = len(X) // (n * B)  # whole steps of n ranks x B distinct samples in the data set
    problem = (f"--batch ({B}) must be divisible by --micro ({k})" if B % k else
               f"{n} ranks x batch {B} = {n * B} samples per step, but the data set has {len(X)} images: "
               f"the lesson needs at least 2 steps of distinct samples. Use a smaller --batch (at most "
               f"{len(X) // (2 * n)} for {n} ranks) or fewer ranks." if fits < 2 else "")
    if problem:  # refused by rank 0, once; every rank stops
        if r == 0:
            rprint(f"error: {problem}")
        cleanup()
        raise SystemExit(2)
    if fits < S:
        if r == 0:
            rprint(f"note: {n} ranks x batch {B} use {n * B} images a step, so the {len(X)} images give "
                   f"{fits} steps, not --steps {S}: running {fits}")
        S = fits

    # A data set that divides evenly: S steps of n ranks x B samples, no padding, nothing dropped.
    size = S * n * B
    X, y = X[:size].flatten(1).double().to(dev), y[:size].to(dev)
    dataset = TensorDataset(X, y)

    def batches_of(rank: int) -> list[list[int]]:
        """The index batches rank `rank` reads: DistributedSampler is deterministic, so any
        process can compute any rank's share."""
        sampler = DistributedSampler(dataset, num_replicas=n, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(0)
        idx = list(sampler)
        return [idx[s * B:(s + 1) * B] for s in range(S)]

    mine = batches_of(r)
    everyone = [batches_of(q) for q in range(n)]
    criterion = nn.CrossEntropyLoss()

    def train_ddp(accumulate: int, use_no_sync: bool) -> tuple[nn.Module, int]:
        model = make_model(dev)
        ddp = DDP(model, device_ids=[ctx.local_rank] if dev.type == "cuda" else None)
        counter = {"calls": 0}
        ddp.register_comm_hook(counter, counting_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
        m = B // accumulate
        for s in range(S):
            opt.zero_grad()
            for j in range(accumulate):
                idx = mine[s][j * m:(j + 1) * m]
                last = j == accumulate - 1
                sync = contextlib.nullcontext() if (last or not use_no_sync) else ddp.no_sync()
                with sync:  # inside no_sync(): gradients only accumulate locally, no all-reduce
                    (criterion(ddp(X[idx]), y[idx]) / accumulate).backward()
            opt.step()
        return model, counter["calls"] // S

    def train_single(batches: list[list[int]]) -> nn.Module:
        model = make_model(dev)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        for idx in batches:
            opt.zero_grad()
            criterion(model(X[idx]), y[idx]).backward()
            opt.step()
        return model

    ddp_model, calls_ddp = train_ddp(1, use_no_sync=False)
    acc_model, calls_acc = train_ddp(k, use_no_sync=True)
    acc_sync_model, calls_acc_sync = train_ddp(k, use_no_sync=False)
    # One process, one batch of n*B samples per step: the same samples every rank read at step s.
    big = train_single([sum((everyone[q][s] for q in range(n)), []) for s in range(S)])
    small = train_single(mine)  # for contrast: one process with rank r's batches of B only

    ref = flat(big)
    diffs = {
        "ddp": (flat(ddp_model) - ref).abs().max().item(),
        "no_sync": (flat(acc_model) - ref).abs().max().item(),
        "accumulate_without_no_sync": (flat(acc_sync_model) - ref).abs().max().item(),
        "single_small_batch": (flat(small) - ref).abs().max().item(),
    }
    gathered = [torch.zeros_like(ref) for _ in range(n)]
    dist.all_gather(gathered, flat(ddp_model))
    across = max((g - gathered[0]).abs().max().item() for g in gathered)

    rprint(f"{S} SGD steps, float64; DDP: {n} ranks x batch {B}; reference: 1 process x batch {n * B}")
    rprint(f"DDP vs one process with the {n * B}-sample batch: max |difference| < 1e-12: {diffs['ddp'] < 1e-12}")
    rprint(f"no_sync accumulation ({k} micro-batches of {B // k}) vs the same: "
           f"max |difference| < 1e-12: {diffs['no_sync'] < 1e-12}")
    rprint(f"for contrast, one process with only my {B}-sample batches: "
           f"max |difference| > 1e-3: {diffs['single_small_batch'] > 1e-3}")
    rprint(f"all ranks hold bit-identical DDP weights: {across == 0.0}")
    rprint(f"all-reduce calls per optimizer step: DDP {calls_ddp}, accumulation with no_sync {calls_acc}, "
           f"accumulation without no_sync {calls_acc_sync}")

    # 3. Buckets and overlap: tiny buckets, so each layer's gradients get their own all-reduce (from step 2).
    events: list[str] = []
    model = make_model(dev)
    names = {p: name for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(f"backward: gradient of {name} ready"))
    ddp = DDP(model, bucket_cap_mb=0.001, device_ids=[ctx.local_rank] if dev.type == "cuda" else None)

    def logging_hook(state, bucket):
        events.append(f"DDP: all-reduce of bucket {bucket.index()} launched {[names[p] for p in bucket.parameters()]}")
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, logging_hook)
    for step in range(2):  # after step 0, DDP rebuilds its buckets in the order gradients arrived
        events.clear()
        criterion(ddp(X[mine[step]]), y[mine[step]]).backward()
        events.append("backward() returned: every bucket is all-reduced")
    if r == 0:
        rprint("second step, in the order things happened on rank 0:")
        for e in events:
            rprint("  " + e)

    if args.out:
        Path(args.out, f"big_batch_rank{r}.json").write_text(json.dumps(
            {"rank": r, "diffs": diffs, "across_ranks": across,
             "calls": {"ddp": calls_ddp, "no_sync": calls_acc, "without_no_sync": calls_acc_sync},
             "events": events}))
    cleanup()


if __name__ == "__main__":
    main()
