"""A 2-D device mesh: FSDP across one dimension and tensor parallelism across the other (FSDP x TP),
then HSDP (FSDP within a group, replicas across groups), each trained two steps and proven equal to
one process on the whole batch.

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs), on 4 processes:

    python -m torch.distributed.run --standalone --nproc-per-node 4 scripts/mesh_2d.py --out /tmp/mesh
    # --out: a folder for each rank's JSON record (optional)
    # or, in a notebook: course_utils.launch.torchrun("scripts/mesh_2d.py", nproc=4)

The 4 ranks form a 2 x 2 mesh. FSDP x TP: mesh dimension "tp" (ranks {0,1} and {2,3}) splits every
block as the tensor-parallel script does; dimension "dp" (ranks {0,2} and {1,3}) shards what is left
of each parameter with FSDP and gives each row of the mesh its own half of the batch. HSDP: the
same mesh named ("replicate", "shard"): FSDP shards over "shard", and "replicate" holds two copies
that all-reduce their gradients. On 2 ranks the meshes are 1 x 2; on 1 rank, 1 x 1.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from course_utils.ch07_parallelism import Stack, max_diff, seeded, tp_plan, write_record
from course_utils.dist import cleanup, rprint, setup

BLOCKS, DIM, HEADS, HIDDEN, OUT = 2, 64, 4, 256, 10
TOL = 1e-12
STEPS = 2


def make(dev) -> Stack:
    return seeded(lambda: Stack(BLOCKS, DIM, HEADS, HIDDEN, OUT), 0, torch.float64).to(dev)


def train(model, x, y, steps: int = STEPS) -> None:
    """`steps` SGD steps (plain SGD: the same update as one process's, to the last bits that matter)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def rows_held(param, full: torch.Tensor) -> list[int]:
    """Which rows of the full weight `full` this rank's shard of `param` holds (found by value: every row
    of a freshly initialised weight is different)."""
    local = param.to_local()
    return [int((full == row).all(dim=1).nonzero()[0]) for row in local]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # (the output is a view; harmless here)
    # Gathering a 2-D-sharded weight to compare it takes two all-gathers, which DTensor logs as slow: fine here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    if n not in (1, 2, 4):
        if r == 0:
            rprint(f"error: the meshes are 2 x 2 on 4 ranks (1 x 2 on 2, 1 x 1 on 1); {n} ranks do not form one.")
        cleanup()
        raise SystemExit(2)
    rows, cols = (2, 2) if n == 4 else (1, n)
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(8, 8, DIM, generator=gen, dtype=torch.float64).to(dev)
    Y = torch.randn(8, 8, OUT, generator=gen, dtype=torch.float64).to(dev)
    reference = make(dev)
    train(reference, X, Y)
    record = {"rank": r, "world": n, "shape": [rows, cols]}

    # FSDP x TP: TP inside each row of the mesh, FSDP down each column.
    mesh = init_device_mesh(dev.type, (rows, cols), mesh_dim_names=("dp", "tp"))
    model = make(dev)
    for block in model.blocks.values():
        parallelize_module(block, mesh["tp"], tp_plan())
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    init_q = make(dev).blocks["0"].attn.q.weight.detach()
    held = rows_held(model.blocks["0"].attn.q.weight, init_q)
    dp_rank = mesh["dp"].get_local_rank()
    train(model, X.chunk(rows)[dp_rank], Y.chunk(rows)[dp_rank])
    q = model.blocks["0"].attn.q.weight
    diff = max(max_diff(p, ref) for p, ref in zip(model.parameters(), reference.parameters(), strict=True))
    coords = mesh.get_coordinate()
    rprint(f"FSDP x TP  rank {r} at (dp, tp) = {tuple(coords)}: attn.q.weight {list(q.shape)} placed "
           f"{[str(p) for p in q.placements]} -> holds {list(q.to_local().shape)}, rows {held[0]}-{held[-1]}; batch "
           f"rows {dp_rank * 8 // rows}-{(dp_rank + 1) * 8 // rows - 1}; max |diff| vs one process after {STEPS} steps "
           f"{diff:.1e} (< {TOL:.0e}: {diff < TOL})")
    assert diff < TOL, "FSDP x TP differs from one process"
    record["fsdp_tp"] = {"coords": list(coords), "placements": [str(p) for p in q.placements],
                         "local": list(q.to_local().shape), "global": list(q.shape), "diff": diff, "rows": held}

    # HSDP: shard within each row ("shard"), replicate across rows ("replicate"); all ranks get own data.
    mesh = init_device_mesh(dev.type, (rows, cols), mesh_dim_names=("replicate", "shard"))
    model = make(dev)
    for block in model.blocks.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    held = rows_held(model.blocks["0"].attn.q.weight, init_q)
    train(model, X.chunk(n)[r], Y.chunk(n)[r])
    q = model.blocks["0"].attn.q.weight
    diff = max(max_diff(p, ref) for p, ref in zip(model.parameters(), reference.parameters(), strict=True))
    rprint(f"HSDP       rank {r} at (replicate, shard) = {tuple(mesh.get_coordinate())}: attn.q.weight placed "
           f"{[str(p) for p in q.placements]} -> holds {list(q.to_local().shape)}; max |diff| vs one process "
           f"{diff:.1e} (< {TOL:.0e}: {diff < TOL})")
    assert diff < TOL, "HSDP differs from one process"
    record["hsdp"] = {"coords": list(mesh.get_coordinate()), "placements": [str(p) for p in q.placements],
                      "local": list(q.to_local().shape), "diff": diff, "rows": held}
    write_record(args.out, "mesh2d", r, record)
    cleanup()


if __name__ == "__main__":
    main()
