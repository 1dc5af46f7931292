"""Test script: who hosts the job's rendezvous store (torch's TCPStore, which ``init_process_group``
with ``env://`` uses). Rank 1 looks, before rank 0 has done anything, whether MASTER_PORT is already
listening (it is under a launcher that hosts the store itself, as torchrun's agent does); both
ranks join through ``env://``; rank 0 puts a key and exits; rank 1, once rank 0 is gone, uses the
store again (which fails if rank 0 hosted it). Rank 1 prints what it saw."""

import os
import time
from datetime import timedelta

import torch.distributed as dist


def listening(port: int) -> bool:
    """Whether a socket of this machine listens on `port` (Linux's /proc/net/tcp{,6}: state 0A)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for row in fh.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":
                    return True
    return False


rank = int(os.environ["RANK"])
if rank == 0:
    time.sleep(1.0)  # rank 1 looks at the port first
else:
    print(f"listening before rank 0 started: {listening(int(os.environ['MASTER_PORT']))}", flush=True)
store, _, _ = next(dist.rendezvous("env://", rank, 2, timeout=timedelta(seconds=60)))
if rank == 0:
    store.set("rank0_pid", str(os.getpid()))
    raise SystemExit(0)
pid = int(store.get("rank0_pid"))
end = time.monotonic() + 60
while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
    with open(f"/proc/{pid}/stat") as fh:
        if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
            break
    time.sleep(0.05)
store.set_timeout(timedelta(seconds=10))
store.set("after", "rank 0 is gone")
print(f"store after rank 0 exited: {store.get('after').decode()}", flush=True)
