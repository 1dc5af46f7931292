"""torchrun itself, as the torchrun engine runs it: ``python -m course_utils.launch.agent REPORT
ARGS`` is ``python -m torch.distributed.run ARGS`` (the same agent, output and exit code), which also
writes what the agent knows of each failed rank (torch's ``ChildFailedError.failures``: exit code,
pid, time, its error file where it wrote one) to the JSON file REPORT, for the diagnosis."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path


def agent(report: str, args: list[str]) -> None:
    """torchrun with `args`, in this process; when ranks fail, what torch knows of each (its
    ``ChildFailedError``) is written to `report` before the error goes on (its summary printed)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(args)
    except ChildFailedError as exc:
        first, _ = exc.get_first_failure()
        failures = {
            rank: {"exit_code": f.exitcode, "pid": f.pid, "timestamp": f.timestamp,
                   "error_file": f.error_file if os.path.isfile(f.error_file) else ""}
            for rank, f in exc.failures.items()
        }
        with contextlib.suppress(OSError):
            Path(report + ".tmp").write_text(json.dumps({"first": first, "failures": failures}))
            os.replace(report + ".tmp", report)
        raise


if __name__ == "__main__":
    agent(sys.argv[1], sys.argv[2:])
