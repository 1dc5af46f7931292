"""Test script: both ranks write many lines at once, some in several pieces (no torch needed).

Through one shared pipe these lines would interleave and glue together; the launcher keeps
each rank's lines whole and in order."""

import os
import sys

rank = int(os.environ["RANK"])
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for i in range(n):
    if i % 2:
        print("rank", rank, "line", i)  # several writes per line (unbuffered)
    else:
        sys.stdout.write(f"rank {rank} ")
        sys.stdout.write(f"line {i}\n")
sys.stdout.write(f"rank {rank} done, no newline at the end")
