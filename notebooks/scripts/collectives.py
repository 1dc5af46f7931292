"""Join a process group from ``env://``, say what the launcher told this process, then run the
collectives of torch.distributed: what every rank holds before and after.

Run from the notebooks/ folder (any number of ranks):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/collectives.py
    # or, in a notebook: course_utils.launch.torchrun("scripts/collectives.py", nproc=2)

``init_method="env://"`` means: read MASTER_ADDR and MASTER_PORT (where the key-value store
listens: under torchrun, by default, a launcher hosts it; else rank 0), RANK and WORLD_SIZE
from the environment. torchrun sets them for every process; nobody does under ``mp.spawn``.

Each rank prints its environment, then one line per collective; with ``--out DIR`` it also
writes ``DIR/collectives_rank<R>.json`` (the notebook draws it). Integer tensors keep the
numbers exact; gloo runs them on the CPU, nccl on one GPU per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.dist import cleanup, rprint, setup

# The variables torchrun sets for each worker (printed in this order).
LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK",
                 "GROUP_RANK")


def _shown(name: str, value: str) -> str:
    """The value as printed; a machine's own host name is replaced so the output reads the same anywhere."""
    if name == "MASTER_ADDR" and value in {socket.gethostname(), socket.getfqdn()} - {"localhost"}:
        return "<this machine's host name>"
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()

    ctx = setup()  # init_process_group("gloo" on CPU / "nccl" on GPU, init_method="env://")
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    env = "  ".join(f"{k}={_shown(k, os.environ.get(k, '(unset)'))}" for k in LAUNCHER_VARS)
    rprint(f"environment: {env}")
    rprint(f"process group: rank {dist.get_rank()} of world size {dist.get_world_size()}, "
           f"local rank {ctx.local_rank}, backend {dist.get_backend()}, device {dev.type}")
    record: dict[str, dict[str, list]] = {}

    def show(name: str, before: list, after: list) -> None:
        record[name] = {"before": before, "after": after}
        rprint(f"{name:<14} before {before}  after {after}")

    def mine() -> torch.Tensor:
        """What rank r holds: [r+1, 10(r+1)], so every sum is easy to check by eye."""
        return torch.tensor([r + 1, 10 * (r + 1)], device=dev)

    # all_reduce: every rank ends with the element-wise sum (DDP does this to gradients).
    t = mine()
    before = t.tolist()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    show("all_reduce", before, t.tolist())

    # reduce: only the destination rank receives the sum. What the other ranks' buffer holds
    # afterwards is not specified (gloo leaves it alone; do not rely on it).
    t = mine()
    before = t.tolist()
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    show("reduce", before, t.tolist())

    # broadcast: rank 0's tensor is copied into every rank's tensor (DDP does this to the
    # initial weights and to buffers, so all replicas start identical).
    t = mine()
    before = t.tolist()
    dist.broadcast(t, src=0)
    show("broadcast", before, t.tolist())

    # all_gather: every rank ends with the list of everybody's tensors, in rank order.
    t = mine()
    gathered = [torch.zeros_like(t) for _ in range(n)]
    dist.all_gather(gathered, t)
    show("all_gather", t.tolist(), torch.cat(gathered).tolist())

    # reduce_scatter: every rank holds n chunks; rank k receives the sum of everybody's chunk k.
    chunks = [torch.tensor([(r + 1) * 10**k], device=dev) for k in range(n)]
    out = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
    show("reduce_scatter", torch.cat(chunks).tolist(), out.tolist())

    # Ring all-reduce = reduce_scatter, then all_gather of the reduced chunks: the same
    # numbers as all_reduce, and the pattern FSDP uses for its gradients and weights.
    data = torch.arange(1, 2 * n + 1, device=dev) * (r + 1)
    pieces = list(data.chunk(n))
    mine_reduced = torch.zeros_like(pieces[0])
    dist.reduce_scatter(mine_reduced, pieces, op=dist.ReduceOp.SUM)
    parts = [torch.zeros_like(mine_reduced) for _ in range(n)]
    dist.all_gather(parts, mine_reduced)
    two_step = torch.cat(parts)
    dist.all_reduce(data, op=dist.ReduceOp.SUM)
    rprint(f"reduce_scatter then all_gather equals all_reduce: {torch.equal(two_step, data)}")

    if args.out:
        path = Path(args.out) / f"collectives_rank{r}.json"
        path.write_text(json.dumps({"rank": r, "world_size": n, "collectives": record}))
    cleanup()


if __name__ == "__main__":
    main()
