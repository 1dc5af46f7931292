"""Hello from every rank: the smallest distributed script of the course.

Each process joins the process group and prints who it is. Run it from a notebook with
``course_utils.launch.torchrun("scripts/hello_dist.py", nproc=2)`` or from a terminal in
``notebooks/`` with ``python -m torch.distributed.run --standalone --nproc-per-node 2
scripts/hello_dist.py``.
"""

import torch
import torch.distributed as dist

from course_utils.dist import cleanup, rprint, setup


def main() -> None:
    ctx = setup()
    rprint(f"hello from rank {ctx.rank} of {ctx.world_size} (backend {ctx.backend}, device {ctx.device.type})")
    # One collective, to show the ranks really talk to each other: sum of (rank + 1).
    total = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(total)
    rprint(f"rank {ctx.rank}: all_reduce sum of (rank + 1) = {total.item():.0f}")
    cleanup()


if __name__ == "__main__":
    main()
