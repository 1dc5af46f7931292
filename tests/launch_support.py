"""What the launcher's tests share (test_launch*.py; their fixtures are in conftest.py): the test
scripts' folder, nbval's sanitizing, and finding every process a job left."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from course_utils import ROOT
from course_utils.launch import processes, warm

SCRIPTS = "tests/scripts"
LINUX = sys.platform.startswith("linux")
needs_proc = pytest.mark.skipif(not processes.HAS_PROC, reason="checks processes through /proc")
needs_linux = pytest.mark.skipif(not LINUX, reason="the warm engine is for Linux")


def sanitize(text: str) -> str:
    """Apply nbval_sanitize.cfg the way nbval does (to see what a notebook would compare)."""
    pairs, regex = [], None
    for line in (ROOT / "nbval_sanitize.cfg").read_text().splitlines():
        if line.startswith("regex:"):
            regex = line[len("regex:"):].strip()
        elif line.startswith("replace:") and regex is not None:
            pairs.append((regex, line[len("replace:"):].strip()))
            regex = None
    for regex, replace in pairs:
        text = re.sub(regex, replace, text)
    return text


def tagged_processes(tag: str, ranks: list[int] = ()) -> list[int]:
    """Live processes whose environment holds LAUNCH_TEST_TAG=tag, `ranks` and those in their
    sessions (a rank forked by the warm server shows its server's environment in /proc, not the
    variables it was given); not the idle warm servers kept for the next job."""
    found = processes.find(f"LAUNCH_TEST_TAG={tag}", ranks) | set(ranks)
    return sorted(p for p in found - set(warm.idle_servers()) if processes.alive(p))


def pids_written(folder: Path) -> list[int]:
    """The pids the test scripts wrote to `folder` (rank<R>.pid: the rank, then its children)."""
    return [int(p) for f in sorted(folder.glob("rank*.pid")) for p in f.read_text().split()]


def wait_for_pid_files(folder: Path, n: int = 2, seconds: float = 200) -> None:
    end = time.monotonic() + seconds
    while len(list(folder.glob("rank*.pid"))) < n and time.monotonic() < end:
        time.sleep(0.1)


def record_displays(monkeypatch) -> list:
    """IPython's display calls, recorded instead of sent to a frontend: [(name, args, kwargs)]."""
    pytest.importorskip("ipywidgets")
    import IPython.display

    calls = []
    for name in ("display", "update_display"):
        monkeypatch.setattr(IPython.display, name, lambda *a, _n=name, **k: calls.append((_n, a, k)))
    return calls


def assert_view_emptied(calls) -> None:
    """The live view was displayed without text/plain, then emptied (nothing left that nbval
    compares)."""
    (shown, (bundle,), kw), *_, (emptied, (empty,), kw2) = calls
    assert shown == "display" and list(bundle) == ["application/vnd.jupyter.widget-view+json"]
    assert kw["raw"] and emptied == "update_display" and empty == {} and kw2["raw"]
    assert kw2["display_id"] == kw["display_id"]
