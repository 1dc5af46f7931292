"""Test script: what a rank sees of how it was started (no torch needed): its environment, argv,
working directory, __file__, sys.path[0], __name__, stdin, and whether stdout is line-buffered. One
JSON line."""

import json
import os
import sys

print(json.dumps({
    "env": dict(os.environ),
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "file": __file__,
    "path0": sys.path[0],
    "name": __name__,
    "stdin": sys.stdin.read(),
    "ppid_alive": os.getppid() != 1,
}))
