"""Evaluating a DDP model on rank 0 only: why the source's loop survives its first epochs and
hangs at the end, and the two correct ways (chapter 06).

The model has BatchNorm, so it has *buffers* (running mean and variance). Before a forward pass
that follows a forward with gradients (a training step), the DDP wrapper broadcasts rank 0's
buffers to the other ranks (``DistributedDataParallel.will_sync_module_buffers()`` says whether the
next forward will). A broadcast is a collective: every rank must make it. Collectives are paired
by their order in the process group, not by the line of code that calls them, so:

- after epoch 0, rank 0 evaluates alone: its first evaluation batch broadcasts the buffers. Rank 1
  is already in epoch 1, whose first training step also broadcasts the buffers. The two
  broadcasts pair up, by accident; rank 0's own first step of epoch 1 then broadcasts nothing
  (its last forward had no gradients), and the ranks are in step again. Nothing is wrong yet.
- after the last epoch, rank 0's evaluation broadcast has no partner: rank 1 has finished and
  waits at the final barrier. Each waits for the other: the job hangs.

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/pitfall_rank0_eval.py
        the default, --eval shard (below): the job ends
    ... --eval rank0-wrapper
        the bug (the source chapter's loop: ``if rank == 0: evaluate(model)`` after every epoch):
        epoch 0 is evaluated, epoch 1 hangs; stop it with Ctrl+C
    ... --eval shard     every rank evaluates its own slice of the test set through the
                         wrapper, the counts are summed with all_reduce
    ... --eval module    rank 0 evaluates the plain model, ``model.module`` (no collective)
                         while the other ranks wait at a barrier
    ... --eval both      the two correct ways, one after the other, after every epoch

Every rank counts the collectives its DDP wrapper makes (buffer broadcasts, and gradient
all-reduces through a communication hook that does what DDP does by default) and prints the
counts after each epoch and each evaluation: the counts show the accidental pairing.
The process group's timeout is 10 minutes here (PyTorch's default: 30 with gloo, 10 with nccl): a
hang is not reported quickly; the launcher's own timeout is what stops it.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
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


class Counted(DDP):
    """A DDP wrapper that counts its own collectives: buffer broadcasts and gradient all-reduces."""

    def __init__(self, module: nn.Module, **kwargs) -> None:
        super().__init__(module, **kwargs)
        self.broadcasts = self.allreduces = 0

        def counting_allreduce(state, bucket):  # DDP's default: average the bucket over the ranks
            self.allreduces += 1
            return allreduce_hook(state, bucket)

        self.register_comm_hook(None, counting_allreduce)

    def forward(self, *args, **kwargs):
        self.broadcasts += self.will_sync_module_buffers()
        return super().forward(*args, **kwargs)

    def counts(self) -> str:
        return f"{self.broadcasts} buffer broadcasts, {self.allreduces} gradient all-reduces so far"


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


def evaluate(mode: str, model: Counted, test: TensorDataset, ctx, epoch: int) -> None:
    if mode == "rank0-wrapper":
        # The bug: only rank 0 runs the DDP wrapper's forward, whose first step may be a buffer broadcast.
        if ctx.rank == 0:
            rprint(f"epoch {epoch}: evaluating through the DDP wrapper ...")
            correct, seen = count_correct(model, DataLoader(test, batch_size=128), ctx.device)
            rprint(f"epoch {epoch}: accuracy {correct / seen:.4f} ({model.counts()})")
        return
    if mode in ("shard", "both"):
        # Every rank evaluates its own slice (no padding, unlike DistributedSampler) ...
        mine = Subset(test, range(ctx.rank, len(test), ctx.world_size))
        correct, seen = count_correct(model, DataLoader(mine, batch_size=128), ctx.device)
        # ... and the counts are summed, so every rank knows the accuracy on the whole test set.
        counts = torch.tensor([correct, seen], dtype=torch.int64, device=ctx.device)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        total, n = (int(v) for v in counts.tolist())
        rprint(f"epoch {epoch}: {correct}/{seen} correct on its shard, all-reduced accuracy {total}/{n} = {total / n:.4f}")
    if mode in ("module", "both"):
        # model.module is the plain nn.Module inside the wrapper: its forward runs no collective.
        if ctx.rank == 0:
            correct, seen = count_correct(model.module, DataLoader(test, batch_size=128), ctx.device)
            rprint(f"epoch {epoch}: model.module accuracy {correct}/{seen} = {correct / seen:.4f}")
        else:
            rprint(f"epoch {epoch}: waiting at the barrier for rank 0")
        dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", choices=MODES, default="shard", help="how to evaluate (see the module docstring)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs, each followed by an evaluation (at least 2)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per epoch")
    args = parser.parse_args()
    if args.epochs < 2 or args.steps < 1:
        parser.error("--epochs must be at least 2 (the hang shows after the last one) and --steps at least 1")

    ctx = setup(timeout_s=600.0)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = Counted(make_model().to(ctx.device), device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    train = TensorDataset(*digits_tensors("train"))
    test = TensorDataset(*digits_tensors("test"))
    sampler = DistributedSampler(train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(loader):
            if step == args.steps:
                break
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        rprint(f"epoch {epoch}: trained {args.steps} steps ({model.counts()})")
        evaluate(args.eval, model, test, ctx, epoch)
    if args.eval == "rank0-wrapper" and ctx.rank != 0:
        rprint("end: waiting at the final barrier for rank 0")
    cleanup()  # a barrier, then the process group is destroyed


if __name__ == "__main__":
    main()
