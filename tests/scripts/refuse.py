"""Test script (no torch): rank 0 says on stderr why the job cannot go on; then every rank exits with
code 2, rank 1 first and silently, as chapter 05's train.py does when rank 0 refuses a checkpoint.
$REFUSE_DIR: a folder for the "rank 0 has spoken" flag. $REFUSE_STUBBORN=1: rank 0 ignores SIGTERM
and exits by itself a moment after rank 1 (both exit codes are 2); otherwise rank 0 is still there
when the launcher stops the job (it dies of SIGTERM, having said why)."""

import os
import signal
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
flag = Path(os.environ["REFUSE_DIR"], "spoken")
if rank == 0:
    if os.environ.get("REFUSE_STUBBORN") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stderr.write("error: the checkpoint last.pt was made with another configuration (epochs: 4 -> 6). "
                     "Resume with the same settings, or start a fresh run with --no-resume.\n")
    sys.stderr.flush()
    flag.write_text("")
    time.sleep(0.5 if os.environ.get("REFUSE_STUBBORN") == "1" else 30)
else:
    end = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < end:
        time.sleep(0.01)
sys.exit(2)
