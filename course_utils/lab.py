"""``make lab``'s JupyterLab: ``jupyter lab``, with one fix to how Jupyter Server stops.

    python -m course_utils.lab [jupyter lab's arguments]

Jupyter Server prints its address, and takes Ctrl-C, before it listens: it binds its socket a moment
later, in a callback of its event loop. A stop signal in between (Ctrl-C twice at once, or SIGTERM)
runs the server's ``stop()`` while tornado's ``TCPServer.add_sockets`` is halfway through registering the
socket. ``TCPServer.stop()`` then raises ``KeyError`` for the socket not yet registered, the server
has logged "received signal 2, stopping", and it never stops: it goes on running, listening nowhere.
``TCPServer.stop()`` marks itself stopped before it fails, so asking the server to stop once more
completes the stop; this module does that, and then runs JupyterLab as ``jupyter lab`` does.
"""

from __future__ import annotations

import functools
import sys


def patch_stop() -> None:
    """Make ``ServerApp.stop`` end the server even when a signal interrupts the socket's binding."""
    from jupyter_server.serverapp import ServerApp

    stop = ServerApp.stop
    if getattr(stop, "_course_patched", False):
        return

    @functools.wraps(stop)
    def stop_even_while_binding(self, *args, **kwargs):
        try:
            return stop(self, *args, **kwargs)
        except KeyError:  # tornado's TCPServer.stop(), on a socket add_sockets had not registered yet
            return stop(self, *args, **kwargs)  # stopped now: this time it goes on to end the server

    stop_even_while_binding._course_patched = True
    ServerApp.stop = stop_even_while_binding


def main() -> None:
    patch_stop()
    from jupyterlab.labapp import main as lab  # what the `jupyter lab` command runs

    sys.exit(lab())


if __name__ == "__main__":
    main()
