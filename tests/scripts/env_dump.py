"""Test script: what a rank sees of how it was started (no torch needed): its environment, argv,
working directory, __file__, sys.path[0], __name__, __builtins__, annotations (no inherited
``from __future__``), stdin, its stdio streams. One JSON line. With $UNCLOSED_DIR, it also leaves a
file written but never closed: the interpreter's shutdown must flush it."""

import json
import os
import sys


def f(x: int) -> None:
    pass


if os.environ.get("UNCLOSED_DIR"):
    leak = open(os.path.join(os.environ["UNCLOSED_DIR"], f"rank{os.environ['RANK']}.txt"), "w")  # noqa: SIM115
    leak.write("written, never closed\n")

print(json.dumps({
    "env": dict(os.environ),
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "file": __file__,
    "path0": sys.path[0],
    "name": __name__,
    "builtins": type(__builtins__).__name__,
    "annotations": repr(f.__annotations__),
    "stdin": sys.stdin.read(),
    "stdout": [sys.stdout.encoding, sys.stdout.errors, sys.stdout.write_through],
    "stderr": [sys.stderr.encoding, sys.stderr.errors],
}))
