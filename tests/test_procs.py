"""Children's stderr captured and summarised the same way whatever their timing."""

import subprocess
import sys

from course_utils.procs import CapturedStderr, child_stderr, error_lines


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
