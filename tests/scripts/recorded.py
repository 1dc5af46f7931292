"""Test script (no torch work): an entry point decorated with torch's ``@record``, which writes an
uncaught exception to the rank's TORCHELASTIC_ERROR_FILE as JSON. Rank 1 raises; rank 0 succeeds."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("recorded by rank 1")
    print("rank 0 done", flush=True)


if __name__ == "__main__":
    main()
