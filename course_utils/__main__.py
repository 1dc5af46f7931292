"""`python -m course_utils COMMAND ...`: doctor, launch, data, progress."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "doctor": ("course_utils.doctor", "check the environment (OK / WARN / FAIL per line)"),
    "launch": ("course_utils.launch", "run a distributed script on N local processes"),
    "data": ("course_utils.data", "build or verify the course's image data"),
    "progress": ("course_utils.progress", "your exercises: done / tried / not yet (this computer only)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m course_utils COMMAND [ARGS]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    try:
        module = importlib.import_module(COMMANDS[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (what a command started, it stopped)
        from .i18n import tr

        print(tr("\ninterrupted", "\n已中断"), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
