"""Test script: both ranks write many lines at once, some in several pieces (no torch needed).

Through one shared pipe these lines would interleave and glue together; the launcher keeps
each rank's lines whole and in order. With FAIL_FIRST_ATTEMPT=<an empty folder>, every rank
prints a line, waits for the others to get there too, then exits with code 3 on the first
attempt (for elastic restarts)."""

import os
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
flags = os.environ.get("FAIL_FIRST_ATTEMPT")
if flags and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    print(f"rank {rank} fails on attempt 0", flush=True)
    Path(flags, f"rank{rank}").touch()
    while len(os.listdir(flags)) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)
    sys.exit(3)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for i in range(n):
    if i % 2:
        print("rank", rank, "line", i)  # several writes per line (unbuffered)
    else:
        sys.stdout.write(f"rank {rank} ")
        sys.stdout.write(f"line {i}\n")
sys.stdout.write(f"rank {rank} done, no newline at the end")
