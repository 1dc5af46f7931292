"""Test script: a job that succeeds. Each rank prints a few lines in lock-step, its environment, and a warning."""

import argparse
import os
import sys

import torch.distributed as dist

from course_utils.dist import cleanup, rprint, setup

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=3)
opts = parser.parse_args()

ctx = setup()
for i in range(opts.lines):
    rprint(f"line {i} from rank {ctx.rank}")
    dist.barrier()  # the ranks print in lock-step, so their lines interleave in time
env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "COURSE_BACKEND", "PYTHONUNBUFFERED", "EXTRA")}
rprint(f"world {ctx.world_size} backend {ctx.backend} env {sorted(env.items())}")
print("a warning on stderr", file=sys.stderr)
cleanup()
