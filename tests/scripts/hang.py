"""Test script: every rank hangs (no torch needed). Each starts a child process too, and rank 0
ignores SIGTERM, so only a launcher that kills every process of the job, stubborn ones included,
leaves nothing behind. Pids go to files in $HANG_PID_DIR."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if rank == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = Path(os.environ["HANG_PID_DIR"])
(out / f"rank{rank}.tmp").write_text(f"{os.getpid()} {child.pid}")
os.replace(out / f"rank{rank}.tmp", out / f"rank{rank}.pid")
print(f"rank {rank} waiting forever", flush=True)
time.sleep(600)
