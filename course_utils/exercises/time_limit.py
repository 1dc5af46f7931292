"""The time limit of a check: the learner's code runs at most ``seconds`` (not counting time spent
waiting for a CPU, up to MAX_STRETCH times as long), then :class:`TimeUp` stops it: a SIGALRM timer
on the main thread, an asynchronous exception in a helper thread elsewhere, and, for code that
swallows it with a bare ``except:``, another at its next line (line tracing). This is what stops a
learner's endless loop; ``core.Exercise`` gives each check its budget (``core.TIME_LIMIT_S``)."""

import contextlib
import ctypes
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_STRETCH = 3.0  # a limit grows by the time spent waiting for a CPU, up to this factor


class TimeUp(BaseException):  # not an Exception: a learner's `except Exception` cannot swallow it
    """The learner's code ran past the check's time limit."""


_LIBRARIES = (str(Path(__file__).resolve().parents[1]), "<frozen")  # the course's package too
_LIBRARIES += tuple(map(sysconfig.get_paths().get, ("stdlib", "platstdlib", "purelib", "platlib")))


def learners_code(frame: Any) -> bool:
    """Whether `frame` runs the learner's code, not a library's (whose cleanup must run, time or not)."""
    return not frame.f_code.co_filename.startswith(_LIBRARIES)


def cpu_wait(tid: int | None = None) -> float:
    """Seconds a thread of this process has waited for a CPU (Linux's schedstat; 0.0 elsewhere)."""
    path = "/proc/thread-self/schedstat" if tid is None else f"/proc/self/task/{tid}/schedstat"
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class _Stopped(SystemExit):
    """Raised by LearnerThread.stop(), created where caught: a swallowing ``except`` then gets TimeUp."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        if learners_code(frame := sys._getframe(1)):
            _stop_every_line(frame, until=None)


class LearnerThread(threading.Thread):
    """``fn()`` on a daemon thread, ``outcome`` ``(True, result)`` or ``(False, exception)`` once ``done``
    is set. Wait with ``done``: on Python 3.11 an interrupted join() marks a running thread as ended."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.done = fn, threading.Event()

    def run(self) -> None:
        try:
            self.outcome = True, self.fn()
        except BaseException as exc:  # handed to whoever waits for this thread
            self.outcome = False, exc
        finally:
            # off before any call: 3.11 spins in traced calls while an exception is pending elsewhere
            sys.settrace(None)
            self.done.set()

    def stop(self) -> None:
        """Raise _Stopped in the thread at its next Python instruction (once a C call returns, such as a
        sleep), so that it does not keep a CPU and the GIL."""
        if self.ident is not None and not self.done.is_set():
            _raise_in(self.ident, _Stopped)
            # 3.11 keeps eval breakers on until one is handled (traced calls spin): handle one now
            with contextlib.suppress(_Stopped):
                _raise_in(threading.get_ident(), _Stopped)


def _raise_in(thread_id: int, exc: type) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


def _stop_every_line(frame: Any, until: Any) -> None:
    """The next line of the learner's code in `frame`, its callers below `until` or what they call raises
    TimeUp again, out of an ``except`` that swallowed one (once: two nested such ``try`` are not stopped)."""

    def trace(f: Any, event: str, arg: Any) -> Any:
        if not learners_code(f):
            return None
        if event == "line":
            raise TimeUp()
        return trace

    sys.settrace(trace)
    while frame is not None and frame is not until:
        if learners_code(frame):
            frame.f_trace = trace
        frame = frame.f_back


def bounded(fn: Callable[[], Any], seconds: float) -> tuple[Any, float]:
    """``(fn(), seconds charged)``, or TimeUp after `seconds` not counting waits for a CPU (up to MAX_STRETCH
    times): a SIGALRM timer on the main thread (an outer timer goes on after), else a LearnerThread."""
    start = time.monotonic()

    def charged(waited: float) -> float:
        elapsed = time.monotonic() - start
        return elapsed if elapsed >= MAX_STRETCH * seconds else max(elapsed - waited, 0.0)

    if threading.current_thread() != threading.main_thread() or not hasattr(signal, "setitimer"):
        t = LearnerThread(fn)
        t.start()
        while not t.done.wait(min(0.05, seconds)) and charged(cpu_wait(t.native_id)) < seconds:
            pass
        used = charged(cpu_wait(t.native_id))
        if not t.done.is_set():
            t.stop()
            raise TimeUp()
        ok, value = t.outcome
        if not ok:
            raise value
        return value, used

    wait0, expired = cpu_wait(), []

    def time_up(signum: int, frame: Any) -> None:
        left = seconds - charged(cpu_wait() - wait0)
        if left > 0.001 and not expired:  # the code waited for a CPU: give that time back
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        expired.append(True)
        if learners_code(frame):  # an `except:` that swallows this TimeUp gets another
            _stop_every_line(frame, until=here)
        raise TimeUp()

    here, old_trace = sys._getframe(), sys.gettrace()
    old = signal.signal(signal.SIGALRM, time_up)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        result = fn()
        if expired:  # the code caught TimeUp and finished late
            raise TimeUp()
        return result, charged(cpu_wait() - wait0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.settrace(old_trace)
        signal.signal(signal.SIGALRM, old)
        if outer:  # someone else's timer was running: let it go on
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))

