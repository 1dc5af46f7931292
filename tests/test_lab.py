"""course_utils.lab: `make lab`'s JupyterLab stops on a stop signal that comes while it is still binding its
socket (tests/test_tasks_lab.py runs the real lab in a terminal)."""

from __future__ import annotations

import socket
from unittest import mock

import pytest

serverapp = pytest.importorskip("jupyter_server.serverapp")
from tornado.httpserver import HTTPServer  # noqa: E402 - (jupyter_server installs tornado)


def _binding_server():
    """A ServerApp whose HTTP server holds a socket that tornado's add_sockets has not registered yet
    (what a signal handler sees when it interrupts the binding), and the callbacks it schedules."""
    app = serverapp.ServerApp()
    http = HTTPServer(lambda request: None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    http._sockets[sock.fileno()] = sock
    app._http_server = http
    scheduled = []
    app.io_loop = mock.Mock(add_callback_from_signal=scheduled.append, add_callback=scheduled.append)
    return app, sock, scheduled


def test_jupyter_server_alone_loses_a_stop_that_comes_while_it_binds():
    """Why the course's lab exists: without it the stop raises and is lost (if a later Jupyter Server
    stops here, course_utils.lab can go)."""
    app, sock, scheduled = _binding_server()
    with sock, pytest.raises(KeyError):
        app.stop(from_signal=True)
    assert scheduled == []


def test_the_courses_lab_stops_while_it_binds():
    from course_utils.lab import patch_stop

    with mock.patch.object(serverapp.ServerApp, "stop", serverapp.ServerApp.stop):  # undone after the test
        patch_stop()
        patch_stop()  # twice: patched once
        assert not hasattr(serverapp.ServerApp.stop.__wrapped__, "__wrapped__")
        app, sock, scheduled = _binding_server()
        with sock:
            app.stop(from_signal=True)
        assert scheduled == [app._stop]  # the server's own end: cleanup, then the loop stops
        assert app._stopping
