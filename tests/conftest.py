"""Fixtures of the launcher's tests (test_launch*.py; their helpers are in launch_support.py), and of the
tests that run chapter 07's scripts on ranks."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess

import pytest
from launch_support import record_displays

from course_utils.launch import ENGINES, display

# A suite started in the background without job control (`make test &` in a script, nohup) inherits
# SIGINT ignored, and so would every process the interrupt tests start: they could not see Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch):
    """Run the test once per engine (COURSE_LAUNCHER, which torchrun() reads when engine=None)."""
    monkeypatch.setenv("COURSE_LAUNCHER", request.param)
    return request.param


@pytest.fixture
def notebook_mode(monkeypatch):
    """torchrun() as in a Jupyter kernel: the real live view, refreshed at every look at the logs;
    returns its display calls and every HTML view it rendered."""
    monkeypatch.setattr(display, "in_notebook", lambda: True)
    monkeypatch.setattr(display.Notebook, "refresh_s", 0.0)
    views, render = [], display.view
    monkeypatch.setattr(display, "view", lambda *a: views.append(render(*a)) or views[-1])
    return record_displays(monkeypatch), views


@pytest.fixture
def no_process_starts(monkeypatch):
    """Fail the test if anything starts a process (Popen or fork)."""
    def refuse(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "fork", refuse)


@pytest.fixture(autouse=True)
def _torch_imported():
    # torchrun() imports course_utils.dist (and torch) lazily; import it before any timing (not in a
    # lane whose venv has no torch: the book's)
    if importlib.util.find_spec("torch") is not None:
        import course_utils.dist  # noqa: F401


@pytest.fixture
def chapter_07_imports(monkeypatch):
    """The launcher's warm server imports chapter 07's modules (DTensor, pipelining...: seconds) once, as the
    notebook asks it to, instead of both ranks of every job its scripts run."""
    from course_utils.ch07_parallelism import CHAPTER_IMPORTS
    from course_utils.launch import WARM_IMPORTS_VAR

    monkeypatch.setenv(WARM_IMPORTS_VAR, ",".join(CHAPTER_IMPORTS))
