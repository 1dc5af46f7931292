"""FSDP2 (``torch.distributed.fsdp.fully_shard``): every rank stores only a shard of each parameter,
its gradient and its optimizer state; a sharded checkpoint is saved and loaded back.

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/fsdp_demo.py \
--ckpt /tmp/ckpt  # on several nodes: a shared folder
    # or, in a notebook: course_utils.launch.torchrun("scripts/fsdp_demo.py", nproc=2, args=[...])

The checkpoint is written with ``torch.distributed.checkpoint`` (one file per rank plus
``.metadata``); any number of processes, one included, can load it back.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.data import digits_dataset, digits_tensors
from course_utils.device import seed_everything
from course_utils.dist import cleanup, rprint, setup
from course_utils.models import MLP  # the source's MLP, the model of ddp_digits.py too


def build(mesh) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The source's MLP(784, 256, 10), sharded layer by layer, and its AdamW optimizer."""
    seed_everything(0)
    model = MLP(784, 256, 10).to(mesh.device_type)
    fully_shard(model.fc1, mesh=mesh)  # each layer is one unit: all-gathered just before it runs
    fully_shard(model.fc2, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root
    return model, torch.optim.AdamW(model.parameters(), lr=2e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True,
                        help="folder for the sharded checkpoint (on several nodes: one every node shares)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    mesh = init_device_mesh(dev.type, (n,))
    full_shapes = {name: list(p.shape) for name, p in MLP(784, 256, 10).named_parameters()}
    model, opt = build(mesh)

    # 1. What this rank stores: a DTensor per parameter, of which it holds one slice (Shard(0)).
    shards = {}
    for name, p in model.named_parameters():
        local = list(p.to_local().shape)
        shards[name] = local
        rprint(f"{name:<10} full {str(full_shapes[name]):<10} -> this rank holds {str(local):<10} "
               f"placement {p.placements[0]}")
    held = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())  # the DTensor's global size
    rprint(f"parameters stored on this rank: {held:,} of {total:,}")

    # 2. Train: the same loop as DDP. Forward and backward all-gather each layer's weights,
    #    backward reduce-scatters the gradients, so each rank updates only its own shard.
    dataset = digits_dataset("train")
    sampler = DistributedSampler(dataset, num_replicas=n, rank=r, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        sums = torch.zeros(2, dtype=torch.float64, device=dev)
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            sums += torch.stack([loss.detach().double() * len(y), torch.tensor(len(y), device=dev)])
        dist.all_reduce(sums)
        rprint(f"epoch {epoch}: mean loss over all ranks {(sums[0] / sums[1]).item():.3f}")
    exp_avg = opt.state[model.fc1.weight]["exp_avg"]
    rprint(f"AdamW state exp_avg of fc1.weight on this rank: {list(exp_avg.to_local().shape)} "
           f"(full {list(exp_avg.shape)})")

    # Evaluate: every rank runs the same forward (FSDP's all-gathers need all ranks).
    xt, yt = digits_tensors("test")
    with torch.no_grad():
        acc = (model(xt.to(dev)).argmax(1) == yt.to(dev)).double().mean().item()
    rprint(f"test accuracy after {args.epochs} epochs: {100 * acc:.2f}%")

    # 3. A sharded checkpoint: each rank writes its own shards; rank 0 writes the .metadata.
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=args.ckpt)
    dist.barrier()
    files = sorted(os.listdir(args.ckpt))
    rprint(f"checkpoint files: {files}")

    # ... and loaded back into a fresh sharded model and optimizer.
    model2, opt2 = build(mesh)
    m2, o2 = get_state_dict(model2, opt2)
    state = {"model": m2, "optim": o2}
    dcp.load(state, checkpoint_id=args.ckpt)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same = all(torch.equal(a.to_local(), b.to_local())
               for a, b in zip(model.parameters(), model2.parameters(), strict=True))
    x, y = next(iter(loader))
    losses = []
    for mdl, o in ((model, opt), (model2, opt2)):  # one more step on each: optimizer state restored too
        o.zero_grad()
        loss = criterion(mdl(x.to(dev)), y.to(dev))
        loss.backward()
        o.step()
        losses.append(loss.item())
    after = all(torch.equal(a.to_local(), b.to_local())
                for a, b in zip(model.parameters(), model2.parameters(), strict=True))
    rprint(f"reloaded shards equal the saved ones: {same}; one more AdamW step on both: equal again: {after}")

    if args.out:
        Path(args.out, f"fsdp_rank{r}.json").write_text(json.dumps(
            {"rank": r, "full": full_shapes, "local": shards, "held": held, "total": total,
             "test_acc": acc, "files": files}))
    cleanup()


if __name__ == "__main__":
    main()
