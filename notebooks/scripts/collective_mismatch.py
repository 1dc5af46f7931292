"""The end of the rank-0 evaluation hang, without DDP, for TORCH_DISTRIBUTED_DEBUG=DETAIL (chapter 06).

Rank 0 makes the collectives that the DDP wrapper makes in its first evaluation forward: a sync of
the model's buffers from rank 0 (BatchNorm1d(64)'s running mean, running variance and batch count),
which DDP broadcasts coalesced by dtype (``_broadcast_coalesced``): one broadcast of the float32
statistics as one flat tensor of 128 numbers, then one of the int64 ``num_batches_tracked``. Rank 1
has finished training and goes to the final barrier, as in the source's loop after its last epoch.

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/collective_mismatch.py
        hangs, like the DDP job (each rank waits for the other); stop it with Ctrl+C
    TORCH_DISTRIBUTED_DEBUG=DETAIL python -m torch.distributed.run --standalone --nproc-per-node 2 \
scripts/collective_mismatch.py
        fails at once: before every collective, each rank compares what it is about to run with
        what the other ranks run, and raises "Detected mismatch between collectives on ranks"; each
        rank prints what it was running, and the job fails as rank 0
    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/collective_mismatch.py --fixed
        every rank makes the broadcasts, as every rank runs the wrapper in the fix: the job ends

DETAIL costs a check (itself a collective) before every collective, so it is for debugging, not for
training runs. (On PyTorch 2.14.1 with gloo it cannot wrap the DDP job itself: building the DDP
wrapper under DETAIL crashes with SIGSEGV; the course's tests check that, so an upgrade that fixes
it shows.)
"""

from __future__ import annotations

import argparse
import re

import torch
import torch.distributed as dist
import torch.nn as nn

from course_utils.dist import cleanup, rprint, setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fixed", action="store_true", help="every rank syncs the buffers (the job ends)")
    fixed = parser.parse_args().fixed
    ctx = setup(timeout_s=600.0)
    bn = nn.BatchNorm1d(64).to(ctx.device)  # its buffers: running_mean, running_var, num_batches_tracked
    # What DDP's buffer sync broadcasts: the buffers coalesced by dtype, one flat tensor per dtype.
    by_dtype = [torch.cat([b.reshape(-1) for b in bn.buffers() if b.dtype == dtype])
                for dtype in (torch.float32, torch.int64)]
    mode = dist.get_debug_level().name
    rprint(f"TORCH_DISTRIBUTED_DEBUG={mode}")
    try:
        if ctx.rank == 0 or fixed:
            rprint("syncing the buffers, as the DDP wrapper's evaluation forward does: "
                   + ", ".join(f"{t.numel()} {str(t.dtype).removeprefix('torch.')}" for t in by_dtype) + " ...")
            for flat in by_dtype:
                dist.broadcast(flat, src=0)
        else:
            rprint("at the final barrier ...")
        dist.barrier()
        rprint("past the barrier")
    except RuntimeError as exc:
        first = str(exc).split(".")[0]
        mine = re.search(rf"Rank {ctx.rank} is running collective: \w+\(SequenceNumber=\d+,? ?OpType=(\w+)", str(exc))
        rprint(f"RuntimeError: {first}; this rank was running: {mine.group(1) if mine else str(exc)[:200]}")
        # Both ranks have their report; the job fails as rank 0, every time. (Had both exited with the
        # error, which one the launcher saw first, and so named, would be a race.) This barrier matches
        # on every rank, so DETAIL lets it through.
        dist.barrier()
        raise SystemExit(1 if ctx.rank == 0 else 0) from None
    cleanup()


if __name__ == "__main__":
    main()
