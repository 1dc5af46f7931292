"""Test script (no torch work): what a script may count on when it ends, on both engines. Every
rank registers an atexit handler, starts a non-daemon thread that writes a file after a delay, and
leaves a text file and a binary file open with data still in their buffers; then it ends as
$SHUTDOWN_MODE says: "return" (the end of the script), "exit-3" (sys.exit(3)), "exit-message"
(sys.exit("a message")), "raise" (an uncaught ValueError) or "interrupt" (an uncaught
KeyboardInterrupt). The files go to $SHUTDOWN_DIR/<rank>/."""

import atexit
import os
import sys
import threading
import time
from pathlib import Path

out = Path(os.environ["SHUTDOWN_DIR"], os.environ["RANK"])
out.mkdir(parents=True, exist_ok=True)
atexit.register(lambda: (out / "atexit.txt").write_text("atexit ran\n"))


def late_writer() -> None:
    time.sleep(0.5)  # the script's main code has ended by then
    (out / "thread.txt").write_text("the thread finished\n")


threading.Thread(target=late_writer).start()
text = open(out / "unclosed.txt", "w")  # noqa: SIM115 (left open on purpose)
text.write("text never closed\n")
binary = open(out / "unclosed.bin", "wb", buffering=1 << 16)  # noqa: SIM115
binary.write(b"bytes never closed\n")
print("main code done", flush=True)
mode = os.environ["SHUTDOWN_MODE"]
if mode == "exit-3":
    sys.exit(3)
if mode == "exit-message":
    sys.exit("a message for stderr")
if mode == "raise":
    raise ValueError("an uncaught error")
if mode == "interrupt":
    raise KeyboardInterrupt
