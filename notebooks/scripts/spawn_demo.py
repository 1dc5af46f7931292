"""mp.spawn done right (a worker function that lives in a file, MASTER_ADDR/MASTER_PORT set by
the parent), and what happens when torchrun and mp.spawn are combined.

Run from the notebooks/ folder:

    python scripts/spawn_demo.py                  # this process spawns 2 workers: fine
    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/spawn_demo.py
                                                  # every torchrun worker spawns 2 more: 2 x 2

A notebook can ``mp.spawn`` :func:`worker` after ``from spawn_demo import worker``: the children
find it by importing this file, which they cannot do for a function defined in a notebook cell.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.dist import check_backend, choose_backend, cleanup
from course_utils.launch import free_port, spawn_bounded


def worker(index: int, world_size: int, out_dir: str) -> None:
    """What every spawned process runs: mp.spawn passes its index (0..nprocs-1) first.

    ``init_method="env://"`` reads MASTER_ADDR and MASTER_PORT from the environment, which the
    children inherit from the parent: the parent must set them before calling mp.spawn."""
    backend = choose_backend(world_size)
    check_backend(backend, world_size)
    device = torch.device("cuda", index) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method="env://", rank=index, world_size=world_size)
    t = torch.tensor([index + 1], device=device)
    dist.all_reduce(t)
    Path(out_dir, f"spawn_{index}.json").write_text(json.dumps(
        {"index": index, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
         "backend": backend, "sum": int(t.item())}))
    cleanup()


def report(index: int, out_dir: str) -> None:
    """A spawned child under torchrun: only say who it is (no process group: two children per
    torchrun worker claiming ranks 0 and 1 of one group would clash)."""
    Path(out_dir, f"child_{index}.json").write_text(json.dumps(
        {"index": index, "inherited_rank": os.environ.get("RANK"), "inherited_port": os.environ.get("MASTER_PORT")}))


def main() -> None:
    nprocs = 2
    out = tempfile.mkdtemp()
    try:
        if "RANK" in os.environ:  # started by torchrun, and about to mp.spawn as well
            rank = os.environ["RANK"]
            print(f"I am torchrun's worker RANK={rank} (WORLD_SIZE={os.environ['WORLD_SIZE']}); "
                  f"now starting {nprocs} processes as mp.spawn(nprocs={nprocs}) would", flush=True)
            # What mp.spawn(report, nprocs=2) does, with a time limit: 2 fresh processes per worker.
            started = spawn_bounded(report, args=(out,), nprocs=nprocs, timeout=120)
            kids = [json.loads(Path(out, f"child_{i}.json").read_text()) for i in range(started)]
            same_port = all(k["inherited_port"] == os.environ["MASTER_PORT"] for k in kids)
            print(f"it started {started} more processes: "
                  + ", ".join(f"spawn index {k['index']} with RANK={k['inherited_rank']}" for k in kids)
                  + f" (inherited); same MASTER_PORT as mine: {same_port}", flush=True)
        else:
            os.environ["MASTER_ADDR"] = "127.0.0.1"  # nobody else sets them under mp.spawn
            os.environ["MASTER_PORT"] = str(free_port())
            started = spawn_bounded(worker, args=(nprocs, out), nprocs=nprocs, timeout=120)
            for i in range(started):
                rec = json.loads(Path(out, f"spawn_{i}.json").read_text())
                print(f"spawned process {i}: rank {rec['rank']} of {rec['world_size']} ({rec['backend']}), "
                      f"all_reduce of (rank + 1) = {rec['sum']}")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
