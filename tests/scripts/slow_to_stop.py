"""Test script (no torch): every rank, told to stop (SIGTERM), takes 4 s to do so, as a script that
saves a checkpoint first; longer than the launcher's grace period. Pids go to $HANG_PID_DIR."""

import os
import signal
import sys
import time
from pathlib import Path


def save_then_exit(signum, frame):
    time.sleep(4)  # "saving a checkpoint"
    sys.exit(143)


signal.signal(signal.SIGTERM, save_then_exit)
rank = int(os.environ["RANK"])
out = Path(os.environ["HANG_PID_DIR"])
print(f"rank {rank} working", flush=True)  # before the pid file, which tells the test to interrupt the job
(out / f"rank{rank}.tmp").write_text(f"{os.getpid()}")
os.replace(out / f"rank{rank}.tmp", out / f"rank{rank}.pid")
time.sleep(600)
