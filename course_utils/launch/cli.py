"""``python -m course_utils launch SCRIPT --nproc 2 [--backend gloo] [--timeout S] -- ARGS``: the
launcher from a terminal (the ranks' lines streamed with a ``[rank N]`` prefix)."""

from __future__ import annotations

import argparse
import sys

from ..i18n import tr
from .api import ENGINES, LaunchError, LaunchTimeout, torchrun


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course_utils launch",
        description="Run a distributed script on N local processes (torchrun with safe defaults). "
        "Arguments after -- go to the script.",
    )
    add = p.add_argument
    add("script", help="the script to run, relative to the current directory")
    add("--nproc", type=int, default=2, help="number of processes (default 2)")
    add("--backend", choices=["gloo", "nccl"], help="default: nccl with a GPU per rank, else gloo")
    add("--timeout", type=float, default=300.0, help="seconds (default 300)")
    add("--quiet", action="store_true", help="do not stream the ranks' output")
    add("--engine", choices=ENGINES, help="default: warm on Linux (ranks forked from a server "
        "that imported torch once), else torchrun; $COURSE_LAUNCHER sets it too")
    add("--max-nproc", type=int, help="allow up to this many processes (default: what this machine "
        "can hold, by its memory and cores)")
    return p


def main(argv: list[str]) -> int:
    """Run the job; the exit code: 0, the failing rank's (1 for a signal), 124 past the timeout,
    130 interrupted, 2 for bad arguments."""
    cut = argv.index("--") if "--" in argv else len(argv)
    o = parser().parse_args(argv[:cut])
    try:
        kw = {"nproc": o.nproc, "timeout": o.timeout, "backend": o.backend, "show": not o.quiet}
        kw["engine"], kw["max_nproc"] = o.engine, o.max_nproc
        result = torchrun(o.script, args=argv[cut + 1 :], **kw)
    except LaunchError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        code = 124 if isinstance(exc, LaunchTimeout) else exc.exit_code
        return code if code is not None and 0 < code < 256 else 1
    except KeyboardInterrupt as exc:  # Ctrl-C: the job is stopped; no traceback of the launcher
        print(tr("[launcher] {why}", "[启动器] {why}", why=str(exc) or tr("interrupted", "已中断")),
              file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = f"{o.nproc} processes finished in {result.elapsed:.1f} s; logs in {result.log_dir}"
    print(f"[launcher] {done}", file=sys.stderr)
    return 0
