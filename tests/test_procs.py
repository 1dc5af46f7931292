"""Children's stderr captured and summarised the same way whatever their timing."""

import os
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader, Dataset

from course_utils.procs import CapturedStderr, child_stderr, error_lines, worker_failure


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
    text = "Traceback\nZeroDivisionError: z\nAttributeError: a\nAttributeError: a\nnot an error line\n"
    assert CapturedStderr(text).summary() == "2 x AttributeError: a\n1 x ZeroDivisionError: z"
    assert CapturedStderr("").summary() == "no error on the children's stderr"
    assert error_lines("  torch.distributed.DistBackendError: x\n") == ["torch.distributed.DistBackendError: x"]


def test_error_lines_read_the_same_on_every_python():
    py311 = "AttributeError: Can't get attribute 'w' on <module '__main__' (built-in)>"
    py313 = ("\x1b[1;35mAttributeError\x1b[0m: \x1b[35mCan't get attribute 'w' on <module '__main__' "
             "(<class '_frozen_importlib.BuiltinImporter'>)>\x1b[0m")
    assert error_lines(py311) == error_lines(py313) == ["AttributeError: Can't get attribute 'w' on <module '__main__'>"]


class _DiesInWorker(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        os._exit(3)  # the worker process ends without a Python traceback


def test_worker_failure_reads_the_same_in_every_run():
    # the loader's two wordings: its own liveness check, and the SIGCHLD handler's
    for message in ("DataLoader worker (pid(s) 4242, 4243) exited unexpectedly",
                    "DataLoader worker (pid 4242) exited unexpectedly with exit code 1. Details are lost"):
        assert worker_failure(RuntimeError(message)) == "RuntimeError: DataLoader worker exited unexpectedly"
    assert worker_failure(ValueError("something else")) == "ValueError: something else"


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX only")
def test_worker_failure_of_a_real_dead_worker():
    loader = DataLoader(_DiesInWorker(), batch_size=2, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(RuntimeError) as info, child_stderr():
        next(iter(loader))
    assert worker_failure(info.value) == "RuntimeError: DataLoader worker exited unexpectedly"
