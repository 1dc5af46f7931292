"""Which samples does each rank read? DistributedSampler with and without set_epoch, and a plain
shuffling DataLoader under DDP (every rank reads the whole data set: duplicates).

Run from the notebooks/ folder:

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/sampler_demo.py
    # or, in a notebook: course_utils.launch.torchrun("scripts/sampler_demo.py", nproc=2)

With ``--out DIR`` each rank writes ``DIR/sampler_rank<R>.json`` for the notebook's pictures.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.data import image_paths
from course_utils.device import seed_everything
from course_utils.dist import cleanup, rprint, setup


def epoch_indices(loader: DataLoader) -> list[int]:
    """Every index one pass over the loader reads, in order."""
    return [int(i) for batch in loader for i in batch]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=10, help="size of the small data set that is drawn")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()

    ctx = setup()
    r, n = ctx.rank, ctx.world_size
    seed_everything(0)  # the usual first line of a training script: the same seed on every rank
    record: dict[str, object] = {"rank": r, "world_size": n, "small": args.small}

    # 1. DistributedSampler on a small data set, with and without set_epoch. A range is a data set
    #    (it has len() and [i]) whose item i is i: a loader over it shows which samples it reads.
    small = range(args.small)
    for mode in ("with set_epoch", "without set_epoch"):
        sampler = DistributedSampler(small, num_replicas=n, rank=r, shuffle=True, seed=0)
        loader = DataLoader(small, batch_size=4, sampler=sampler)
        per_epoch = []
        for epoch in range(args.epochs):
            if mode == "with set_epoch":
                sampler.set_epoch(epoch)  # the seed of this epoch's shuffle is seed + epoch
            per_epoch.append(epoch_indices(loader))
        record[mode] = per_epoch
        rprint(f"{mode:<18} " + "  ".join(f"epoch {e}: {idx}" for e, idx in enumerate(per_epoch)))

    # 2. The whole training set (its size only: we look at indices, not pixels), one epoch.
    full = range(len(image_paths("train")[0]))
    plain = epoch_indices(DataLoader(full, batch_size=64, shuffle=True))  # the source's pitfall
    sampler = DistributedSampler(full, num_replicas=n, rank=r, shuffle=True, seed=0)
    sampler.set_epoch(0)
    sharded = epoch_indices(DataLoader(full, batch_size=64, sampler=sampler))
    rprint(f"one epoch over {len(full)} digits: plain DataLoader(shuffle=True) reads {len(plain)}, "
           f"DataLoader(sampler=DistributedSampler) reads {len(sharded)}")
    record["plain_first_batch"] = plain[:64]

    # 3. Rank 0 collects everybody's indices and counts samples read by more than one rank.
    everyone: list[list[list[int]]] = [[] for _ in range(n)]
    dist.all_gather_object(everyone, [plain, sharded])
    if r == 0:
        for name, k in (("plain shuffle", 0), ("DistributedSampler", 1)):
            reads = Counter(i for lists in everyone for i in lists[k])
            dup = sum(c - 1 for c in reads.values())
            same = all(lists[k][:64] == everyone[0][k][:64] for lists in everyone)
            rprint(f"{name:<18} reads {sum(reads.values())} in all, {len(reads)} distinct samples, "
                   f"{dup} duplicate reads; every rank's first batch identical: {same}")
            record[name] = {"reads": sum(reads.values()), "distinct": len(reads), "duplicates": dup,
                            "same_first_batch": same}
    if args.out:
        (Path(args.out) / f"sampler_rank{r}.json").write_text(json.dumps(record))
    cleanup()


if __name__ == "__main__":
    main()
