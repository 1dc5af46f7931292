"""Evaluating a DDP model on rank 0 only: why the source's loop survives its first epochs and
hangs at the end, how the flight recorder names the collective out of step, and the two correct ways
(chapter 06).

The model has BatchNorm, so it has *buffers* (running mean and variance, and a batch count). Before a
forward pass that follows a forward with gradients (a training step), the DDP wrapper syncs rank 0's
buffers to the other ranks (``DistributedDataParallel.will_sync_module_buffers()`` says whether the
next forward will): it broadcasts them coalesced by dtype, so one sync here is two broadcasts (the
float32 running statistics as one flat tensor, then the int64 ``num_batches_tracked``). A broadcast is a
collective: every rank must make it. Collectives are paired by their order in the process group (their
sequence number), not by the line of code that calls them, so:

- after epoch 0, rank 0 evaluates alone: its first evaluation batch syncs the buffers. Rank 1 is
  already in epoch 1, whose first training step also syncs them. The two syncs pair up, by accident;
  rank 0's own first step of epoch 1 then syncs nothing (its last forward had no gradients), and the
  ranks are in step again. Nothing is wrong yet.
- after the last epoch, rank 0's evaluation sync has no partner: rank 1 has finished and waits at the
  final barrier. Each waits for the other: the job hangs.

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/pitfall_rank0_eval.py
        the default, --eval shard (below): the job ends
    ... --eval rank0-wrapper
        the bug (the source chapter's loop: ``if rank == 0: evaluate(model)`` after every epoch):
        epoch 0 is evaluated, epoch 1 hangs; stop it with Ctrl+C
    TORCH_FR_BUFFER_SIZE=200 python -m torch.distributed.run --standalone --nproc-per-node 2 \
        scripts/pitfall_rank0_eval.py --eval rank0-wrapper --timeout 5 --fr-dump fr
        the same hang, diagnosed: the flight recorder keeps each rank's last 200 collectives; after 5 s
        the stuck collective raises on each rank, which writes its record to fr/fr_rank<R>.json and
        exits; at the first sequence number where the ranks' records differ, rank 0 broadcast and
        rank 1 entered the barrier
    ... --eval shard     every rank evaluates its own slice of the test set through the
                         wrapper, the counts are summed with all_reduce
    ... --eval module    rank 0 evaluates the plain model, ``model.module`` (no collective)
                         while the other ranks wait at a barrier
    ... --eval both      the two correct ways, one after the other, after every epoch

Every rank counts the collectives its DDP wrapper makes (buffer syncs, and gradient all-reduces
through a communication hook that does what DDP does by default) and prints the counts after each
epoch and each evaluation: the counts show the accidental pairing. The process group's timeout is 10
minutes here unless ``--timeout`` says otherwise (PyTorch's default: 30 with gloo, 10 with nccl): a
hang is not reported quickly; the launcher's own timeout is what stops it.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path

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
    """A DDP wrapper that counts its own collectives: buffer syncs (one broadcast per buffer dtype
    each) and gradient all-reduces (one per bucket)."""

    def __init__(self, module: nn.Module, **kwargs) -> None:
        super().__init__(module, **kwargs)
        self.syncs = self.allreduces = 0

        def counting_allreduce(state, bucket):  # DDP's default: average the bucket over the ranks
            self.allreduces += 1
            return allreduce_hook(state, bucket)

        self.register_comm_hook(None, counting_allreduce)

    def forward(self, *args, **kwargs):
        self.syncs += self.will_sync_module_buffers()
        return super().forward(*args, **kwargs)

    def counts(self) -> str:
        return f"{self.syncs} buffer syncs, {self.allreduces} gradient all-reduces so far"


def dump_flight_recorder(folder: str, rank: int) -> Path:
    """This rank's flight-recorder record (its last TORCH_FR_BUFFER_SIZE collectives: sequence number,
    operation, sizes, dtypes) as JSON in `folder`: what PyTorch's watchdog writes at a timeout with
    nccl (TORCH_NCCL_DUMP_ON_TIMEOUT=1), written here by the rank itself, as gloo has no watchdog."""
    path = Path(folder, f"fr_rank{rank}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(torch._C._distributed_c10d._dump_fr_trace_json())
    return path


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
        rprint(f"epoch {epoch}: {correct}/{seen} correct on its shard, "
               f"all-reduced accuracy {total}/{n} = {total / n:.4f}")
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
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a collective may wait before it raises (the process group's timeout)")
    parser.add_argument("--fr-dump", default=None, metavar="DIR",
                        help="when a collective fails, write this rank's flight-recorder record to "
                             "DIR/fr_rank<R>.json (start with TORCH_FR_BUFFER_SIZE=200, say)")
    args = parser.parse_args()
    if args.epochs < 2 or args.steps < 1 or not args.timeout > 0:
        parser.error("--epochs must be at least 2 (the hang shows after the last one), --steps at least 1 "
                     "and --timeout positive")

    ctx = setup(timeout_s=args.timeout)
    try:
        run(args, ctx)
        cleanup()  # a barrier, then the process group is destroyed
    except RuntimeError:  # a collective that timed out, or whose peer left: this rank's record
        if args.fr_dump is None:
            raise
        path = dump_flight_recorder(args.fr_dump, ctx.rank)
        rprint(f"rank {ctx.rank}: a collective failed; flight recorder written to {path.name}")
        # Every rank writes its record before the job ends, and the job fails as rank 0, every time: had
        # each rank exited with its error at once, which failure the launcher saw first would be a race,
        # and the launcher would stop the ranks still writing. Rank 0 waits for the others' word on the
        # job's key-value store (the process group is broken; the store is not).
        store = dist.distributed_c10d._get_default_store()
        store.set(f"fr-dump/{ctx.rank}", "written")
        if ctx.rank == 0:
            store.wait([f"fr-dump/{r}" for r in range(ctx.world_size)], timedelta(seconds=60))
        sys.stdout.flush()
        os._exit(1 if ctx.rank == 0 else 0)  # at once: a process group whose peer left cannot be torn down


def run(args: argparse.Namespace, ctx) -> None:
    """Train, evaluating after every epoch as ``--eval`` says."""
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


if __name__ == "__main__":
    main()
