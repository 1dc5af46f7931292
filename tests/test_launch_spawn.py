"""course_utils.launch's ``spawn_bounded`` (``mp.spawn`` with a deadline and a clear error),
``child_stderr`` (the children's stderr kept, not interleaved under a cell) and ``free_port``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from course_utils.launch import (
    CapturedStderr,
    SpawnFailed,
    child_stderr,
    error_lines,
    free_port,
    spawn_bounded,
)


def test_spawn_bounded_refuses_bad_arguments_before_anything_starts(monkeypatch):
    import torch.multiprocessing as mp

    def no_start(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp, "start_processes", no_start)
    # nprocs = torch.cuda.device_count() = 0 on a CPU machine: mp.spawn itself returns silently
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"nprocs={bad}: mp.spawn would start no process"):
            spawn_bounded(print, nprocs=bad)
    for bad in (1.5, True, "2"):
        with pytest.raises(ValueError, match="nprocs must be a whole number"):
            spawn_bounded(print, nprocs=bad)
    with pytest.raises(ValueError, match="timeout must be"):
        spawn_bounded(print, nprocs=2, timeout=0)


def test_children_write_to_the_capture_not_to_our_stderr(capfd):
    with child_stderr() as err:
        for _ in range(2):
            subprocess.run([sys.executable, "-c", "raise ValueError('boom')"], timeout=60)
    assert capfd.readouterr().err == ""
    assert err.text.count("Traceback") == 2
    assert err.summary() == "2 x ValueError: boom"


def test_stderr_is_restored_after_an_error(capfd):
    try:
        with child_stderr():
            raise KeyError("x")
    except KeyError:
        pass
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('after')"], timeout=60)
    assert capfd.readouterr().err == "after"


def test_summary_orders_by_count_then_text():
    text = "Traceback\nZeroDivisionError: z\nAttributeError: a\nAttributeError: a\nnot an error\n"
    assert CapturedStderr(text).summary() == "2 x AttributeError: a\n1 x ZeroDivisionError: z"
    assert CapturedStderr("").summary() == "no error on the children's stderr"
    assert error_lines("  torch.distributed.DistBackendError: x\n") == [
        "torch.distributed.DistBackendError: x"]


def test_error_lines_read_the_same_on_every_python():
    py311 = "AttributeError: Can't get attribute 'w' on <module '__main__' (built-in)>"
    py313 = ("\x1b[1;35mAttributeError\x1b[0m: \x1b[35mCan't get attribute 'w' on <module "
             "'__main__' (<class '_frozen_importlib.BuiltinImporter'>)>\x1b[0m")
    assert error_lines(py311) == error_lines(py313) == [
        "AttributeError: Can't get attribute 'w' on <module '__main__'>"]


def test_free_port():
    p = free_port()
    assert 1024 <= p <= 65535


def _ok(index, folder):
    with open(os.path.join(folder, f"{index}.txt"), "w") as fh:
        fh.write(str(index))


def _fail(index):
    raise SystemExit(3)


def _sleep(index):
    time.sleep(60)


@pytest.mark.slow
def test_spawn_bounded_runs_and_joins(tmp_path):
    assert spawn_bounded(_ok, args=(str(tmp_path),), nprocs=2, timeout=60, start_method="fork") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.txt", "1.txt"]


@pytest.mark.slow
def test_spawn_bounded_reports_a_failing_child():
    with pytest.raises(SpawnFailed, match="2 of 2 child processes exited with code 3") as info:
        spawn_bounded(_fail, nprocs=2, timeout=60, start_method="fork")
    assert info.value.exit_code == 3
    from course_utils.i18n import speaking

    with speaking("zh"), pytest.raises(SpawnFailed, match="2 个子进程中有 2 个在 _fail 结束之前退出，退出码 3"):
        spawn_bounded(_fail, nprocs=2, timeout=60, start_method="fork")


@pytest.mark.slow
def test_spawn_bounded_stops_children_at_the_deadline():
    t0 = time.monotonic()
    with pytest.raises(SpawnFailed, match="did not finish"):
        spawn_bounded(_sleep, nprocs=2, timeout=1.0, start_method="fork")
    assert time.monotonic() - t0 < 30
