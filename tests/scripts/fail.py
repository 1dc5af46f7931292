"""Test script: rank 1 raises while rank 0 waits for it in a barrier (rank 0 would wait for minutes)."""

import time

import torch.distributed as dist

from course_utils.dist import cleanup, rprint, setup

ctx = setup(timeout_s=600)
rprint(f"rank {ctx.rank} started")
if ctx.rank == 1:
    rprint(f"failing at {time.time():.3f}")
    raise ValueError("rank 1 cannot go on")
dist.barrier()
rprint("never printed")
cleanup()
