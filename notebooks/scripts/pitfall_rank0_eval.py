"""Evaluating a DDP model on rank 0 only: the hang, and the two correct ways (chapter 06).

The model has BatchNorm, so it has *buffers* (running mean and variance). A DDP
wrapper broadcasts its buffers from rank 0 at the start of a forward pass that
follows a training step; that broadcast is a collective, so every rank must take
part. If only rank 0 calls the wrapper, rank 0 waits for the others forever.

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/pitfall_rank0_eval.py --eval rank0-wrapper
        the bug (the source chapter's pattern): hangs; stop it with Ctrl+C
    ... --eval shard     every rank evaluates its own slice of the test set through the
                         wrapper, the counts are summed with all_reduce
    ... --eval module    rank 0 evaluates the plain model, ``model.module`` (no collective)
                         while the other ranks wait at a barrier
    ... --eval both      the two correct ways, one after the other, in one run

All ranks train the same few steps first, so the two correct ways report the same accuracy.
The process group's timeout is 10 minutes here (PyTorch's default is 30): as in a real job, a
hang is not reported quickly; the launcher's own timeout is what stops it.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from course_utils.data import digits_tensors
from course_utils.dist import cleanup, rprint, setup

MODES = ("rank0-wrapper", "shard", "module", "both")


def make_model() -> nn.Module:
    """A small MLP with BatchNorm: BatchNorm's running statistics are buffers that DDP keeps in sync."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10)
    )


@torch.no_grad()
def count_correct(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[int, int]:
    """(correct, seen) over a loader, with the model in eval mode."""
    model.eval()
    correct = seen = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum().item()
        seen += y.numel()
    return correct, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", choices=MODES, default="shard", help="how to evaluate (see the module docstring)")
    parser.add_argument("--steps", type=int, default=20, help="training steps before the evaluation")
    args = parser.parse_args()

    ctx = setup(timeout_s=600.0)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = DDP(make_model().to(ctx.device), device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    train = TensorDataset(*digits_tensors("train"))
    sampler = DistributedSampler(train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    model.train()
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        x, y = x.to(ctx.device), y.to(ctx.device)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    rprint(f"trained {args.steps} steps")

    test = TensorDataset(*digits_tensors("test"))
    if args.eval == "rank0-wrapper":
        # The bug: only rank 0 runs the DDP wrapper's forward, whose first step is a buffer broadcast.
        if ctx.rank == 0:
            rprint("evaluating through the DDP wrapper ...")
            correct, seen = count_correct(model, DataLoader(test, batch_size=128), ctx.device)
            rprint(f"accuracy {correct / seen:.4f}")  # never reached
        else:
            rprint("waiting at the barrier for rank 0")
        dist.barrier()
    if args.eval in ("shard", "both"):
        # Every rank evaluates its own slice (no padding, unlike DistributedSampler) ...
        mine = Subset(test, range(ctx.rank, len(test), ctx.world_size))
        correct, seen = count_correct(model, DataLoader(mine, batch_size=128), ctx.device)
        rprint(f"{correct}/{seen} correct on its shard")
        # ... and the counts are summed, so every rank knows the accuracy on the whole test set.
        counts = torch.tensor([correct, seen], dtype=torch.int64, device=ctx.device)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        correct, seen = (int(v) for v in counts.tolist())
        rprint(f"all-reduced accuracy {correct}/{seen} = {correct / seen:.4f}")
    if args.eval in ("module", "both"):
        # model.module is the plain nn.Module inside the wrapper: its forward runs no collective.
        if ctx.rank == 0:
            correct, seen = count_correct(model.module, DataLoader(test, batch_size=128), ctx.device)
            rprint(f"model.module accuracy {correct}/{seen} = {correct / seen:.4f}")
        else:
            rprint("waiting at the barrier for rank 0")
        dist.barrier()
    cleanup()


if __name__ == "__main__":
    main()
