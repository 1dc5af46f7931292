"""The source's section 4.4 DDP script, made whole and correct: the MLP on the course's digits.

Run from the notebooks/ folder (the same file on a laptop CPU and on a GPU machine):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ddp_digits.py --epochs 10
    # or, in a notebook: course_utils.launch.torchrun("scripts/ddp_digits.py", nproc=2, args=[...])

What changed from the printed snippet (errata 5, 8, 9, 10 of the course):
- the backend is chosen, not hard-coded: gloo on the CPU, nccl when every rank has a GPU
  (``course_utils.dist.setup``); ``backend='nccl'`` on a CPU machine fails at once;
- torchrun starts the processes and sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, so there is
  no ``mp.spawn`` and no ``world_size = torch.cuda.device_count()`` (0 on a CPU machine: zero
  processes, a silent no-op);
- every name is defined: imports (``DistributedSampler`` included), data, model, optimizer, criterion;
- labels move to the device with the inputs; the loss is averaged over the whole epoch and over
  all ranks; the test set is evaluated on every rank's shard and the counts all-reduced.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from course_utils.data import digits_dataset
from course_utils.device import seed_everything
from course_utils.dist import cleanup, rprint, setup
from course_utils.models import MLP  # the source's section 4.2 model: fc1 -> ReLU -> fc2


def train_worker(rank: int, world_size: int, epochs: int = 10, batch_size: int = 64, lr: float = 0.05,
                 out: str | None = None) -> None:
    # Initialise the process group: init_process_group(backend, init_method="env://") with the
    # backend that fits this machine (gloo on CPU, nccl + torch.cuda.set_device(local_rank) on GPU).
    ctx = setup()
    if (ctx.rank, ctx.world_size) != (rank, world_size):
        raise RuntimeError(f"launcher says rank {ctx.rank} of {ctx.world_size}, caller said {rank} of {world_size}")
    device = ctx.device

    seed_everything(0)  # same initial weights everywhere (DDP also broadcasts rank 0's at wrap time)
    model = MLP(784, 256, 10).to(device)
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if device.type == "cuda" else None)

    # DistributedSampler splits the data set: rank r reads every world_size-th index of the shuffle.
    dataset = digits_dataset("train")
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    dataloader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)

    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    history = []

    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        ddp_model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of losses, samples]
        for batch_x, batch_y in dataloader:
            batch_x, batch_y = batch_x.to(device), batch_y.to(device)
            optimizer.zero_grad()
            loss = criterion(ddp_model(batch_x), batch_y)
            loss.backward()  # DDP all-reduces (averages) the gradients here, bucket by bucket
            optimizer.step()
            sums += torch.stack([loss.detach().double() * len(batch_y), torch.tensor(len(batch_y), device=device)])
        local = (sums[0] / sums[1]).item()
        dist.all_reduce(sums)  # sum over ranks, then divide: the epoch's mean loss over all samples
        mean = (sums[0] / sums[1]).item()
        history.append({"epoch": epoch, "local_loss": local, "loss": mean})
        rprint(f"epoch {epoch}: loss on my {len(sampler)} samples {local:.3f}, on all {int(sums[1])} {mean:.3f}")

    # Evaluate on every rank: each takes every world_size-th test image (no padding), then the
    # correct counts and totals are summed over ranks. Not the mean of the ranks' accuracies.
    test = digits_dataset("test")
    shard = Subset(test, range(rank, len(test), world_size))
    model.eval()
    counts = torch.zeros(2, dtype=torch.int64, device=device)  # [correct, total]
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=256):
            pred = model(x.to(device)).argmax(1)
            counts += torch.stack([(pred == y.to(device)).sum(), torch.tensor(len(y), device=device)])
    local_acc = (counts[0] / counts[1]).item()
    dist.all_reduce(counts)
    acc = (counts[0] / counts[1]).item()
    rprint(f"test accuracy: my {len(shard)} images {100 * local_acc:.2f}%, all {int(counts[1])} images "
           f"{100 * acc:.2f}%")
    # The replicas never diverge: compare every rank's weights with rank 0's, bit for bit.
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = weights.clone()
    dist.broadcast(reference, src=0)
    same = torch.equal(weights, reference)
    rprint(f"my weights are bit-identical to rank 0's: {same}")
    checksum = weights.double().sum().item()

    if out:
        Path(out, f"ddp_digits_rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "world_size": world_size, "history": history, "test_acc": acc,
             "local_test_acc": local_acc, "checksum": checksum, "same_as_rank0": same}))
    cleanup()  # dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("Start this script with a launcher, e.g. "
                         "`python -m torch.distributed.run --nproc-per-node 2 scripts/ddp_digits.py`.")
    # torchrun passes rank and world size through the environment (mp.spawn would pass the rank
    # as the first argument): one launcher, not both.
    train_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.epochs, args.batch_size,
                 args.lr, args.out)


if __name__ == "__main__":
    main()
