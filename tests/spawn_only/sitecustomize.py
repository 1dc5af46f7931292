"""Loaded at start-up by every Python of the spawn lane (this folder is put on PYTHONPATH):
processes start as on Windows and macOS, with spawn, and fork is not there at all."""

import multiprocessing
import multiprocessing.context as _context
import os

multiprocessing.set_start_method("spawn", force=True)
# The course's warm launch engine forks its ranks, so off Linux torchrun() uses the real torchrun.
os.environ["COURSE_LAUNCHER"] = "torchrun"


def _no_fork(method=None, _get=_context.DefaultContext.get_context):
    if method in ("fork", "forkserver"):
        raise ValueError(f"cannot find context for {method!r} (the spawn lane emulates a platform without fork)")
    return _get(multiprocessing.context._default_context, method)


multiprocessing.get_context = _no_fork
_context._default_context.get_context = _no_fork
