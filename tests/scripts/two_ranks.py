"""Test script: both ranks write many lines at once, some in several pieces (no torch needed).

Through one shared pipe these lines would interleave and glue together; the launcher keeps
each rank's lines whole and in order. With FAIL_FIRST_ATTEMPT set, every rank exits with
code 3 on the first attempt (for elastic restarts)."""

import os
import sys

rank = int(os.environ["RANK"])
if os.environ.get("FAIL_FIRST_ATTEMPT") and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    print(f"rank {rank} fails on attempt 0", flush=True)
    sys.exit(3)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for i in range(n):
    if i % 2:
        print("rank", rank, "line", i)  # several writes per line (unbuffered)
    else:
        sys.stdout.write(f"rank {rank} ")
        sys.stdout.write(f"line {i}\n")
sys.stdout.write(f"rank {rank} done, no newline at the end")
