"""course_utils.launch with real jobs, on both engines (the ``engine`` fixture): success, two jobs
at once, a failing rank named promptly, a hung job killed at its timeout, interrupts, a dead caller,
elastic restarts, the command line; and nothing of a job left running, whatever happened."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest
from launch_support import (
    SCRIPTS,
    assert_view_emptied,
    needs_linux,
    needs_proc,
    pids_written,
    sanitize,
    tagged_processes,
    wait_for_pid_files,
)

from course_utils import ROOT
from course_utils.launch import LaunchError, LaunchTimeout, processes, torchrun


@pytest.mark.slow
def test_success_per_rank_logs_and_grouped_output(notebook_mode, capsys, engine):
    from course_utils.dist import choose_backend

    result = torchrun(f"{SCRIPTS}/ok.py", nproc=2, args=["--lines", 3], env={"EXTRA": 7},
                      timeout=300, cwd=ROOT)
    assert result.returncode == 0 and result.nproc == 2 and result.restarts == 0
    assert result.elapsed > 0 and result.engine == engine
    # The terminal command that does the same: the variable the launch added, then torchrun.
    assert result.command == f"EXTRA=7 torchrun --standalone --nproc-per-node=2 {SCRIPTS}/ok.py --lines 3"
    backend = choose_backend(2)
    for r in range(2):
        env = [("COURSE_BACKEND", backend), ("EXTRA", "7"), ("OMP_NUM_THREADS", "1"),
               ("PYTHONUNBUFFERED", "1")]
        assert result.lines(r) == [f"line {i} from rank {r}" for i in range(3)] + [
            f"world 2 backend {backend} env {env}"]
        assert "a warning on stderr" in result.stderr[r]
        # per-rank log files, under stable names
        assert (Path(result.log_dir) / f"rank{r}.stdout.log").read_text() == result.logs[r]
        assert "a warning on stderr" in (Path(result.log_dir) / f"rank{r}.stderr.log").read_text()
    out = capsys.readouterr()
    # Grouped by rank, in rank order, whatever order the lines were written in.
    assert out.out == "".join(f"[rank {r}] {line}\n" for r in range(2) for line in result.lines(r))
    assert "[rank 1] a warning on stderr" in out.err
    calls, views = notebook_mode
    assert_view_emptied(calls)
    assert views[0].startswith(f"<b>{result.command}   [{backend}, {engine} engine]</b>")
    assert views[-1].endswith("a warning on stderr</pre></td></tr></table>")  # it saw the end


@pytest.mark.slow
def test_two_jobs_at_once_stream_whole_lines(capsys, engine):
    """Two jobs at the same time (each gets its own store); lines stay whole and in order."""
    other: dict[str, object] = {}

    def run_other():
        try:
            other["result"] = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[50], show=False,
                                       timeout=300, cwd=ROOT)
        except Exception as exc:  # reported below
            other["error"] = exc

    thread = threading.Thread(target=run_other)
    thread.start()
    result = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[200], timeout=300, cwd=ROOT)
    thread.join(timeout=400)
    assert "error" not in other, other.get("error")
    for res, n in ((result, 200), (other["result"], 50)):
        for r in range(2):
            assert res.logs[r] == "".join(f"rank {r} line {i}\n" for i in range(n)) + (
                f"rank {r} done, no newline at the end\n")
    # In a terminal (not Jupyter) lines stream live with a [rank N] prefix.
    streamed = capsys.readouterr().out.splitlines()
    for r in range(2):
        mine = [line for line in streamed if line.startswith(f"[rank {r}] ")]
        assert mine == [f"[rank {r}] {line}" for line in result.lines(r)]
    assert len(streamed) == 2 * 201


@pytest.mark.slow
@needs_proc
def test_failing_rank_is_named_promptly(notebook_mode, capsys, engine):
    tag = uuid.uuid4().hex
    script = f"{SCRIPTS}/fail.py"
    with pytest.raises(LaunchError) as info:
        torchrun(script, nproc=2, timeout=300, env={"LAUNCH_TEST_TAG": tag}, cwd=ROOT)
    reported = time.time()
    exc = info.value
    assert not isinstance(exc, LaunchTimeout)
    assert exc.rank == 1 and exc.exit_code == 1 and exc.error == "ValueError: rank 1 cannot go on"
    assert exc.failures[1].source == "stderr" and exc.failures[1].exit_code == 1
    # Promptly: rank 0 would wait in its barrier for 600 s; the error comes seconds after rank 1 died.
    failed_at = float(re.search(r"failing at ([\d.]+)", exc.logs[1]).group(1))
    assert reported - failed_at < 30, reported - failed_at
    assert exc.elapsed < 150
    log = Path(exc.log_dir) / "rank1.stderr.log"
    assert "ValueError: rank 1 cannot go on" in log.read_text()
    line = next(i for i, x in enumerate((ROOT / script).read_text().splitlines(), 1)
                if "raise ValueError" in x)
    # The message names rank, exit code, traceback tail and log, and is deterministic once sanitized.
    assert sanitize(str(exc)) == (
        f"rank 1 of 2 failed with exit code 1 running {script}\n"
        "Last lines of its error output:\n"
        "    Traceback (most recent call last):\n"
        f'      File "./{script}", line {line}, in <module>\n'
        '        raise ValueError("rank 1 cannot go on")\n'
        "    ValueError: rank 1 cannot go on\n"
        "Its full log: <tmp>/rank1.stderr.log (every rank's logs are in <tmp>)"
    )
    assert tagged_processes(tag) == []
    # In a notebook the output so far goes to stderr (not compared by nbval), the widget is gone.
    out = capsys.readouterr()
    assert out.out == "" and "[rank 0] rank 0 started" in out.err
    assert_view_emptied(notebook_mode[0])


@pytest.mark.slow
def test_a_rank_that_records_its_error_is_diagnosed_from_torchs_error_file(engine):
    """A script whose entry point has torch's @record: its error file is read on both engines."""
    with pytest.raises(LaunchError) as info:
        torchrun(f"{SCRIPTS}/recorded.py", nproc=2, timeout=300, show=False, cwd=ROOT)
    exc = info.value
    assert (exc.rank, exc.exit_code, exc.error) == (1, 1, "ValueError: recorded by rank 1")
    assert exc.failures[1].source == "error file"
    stopped = exc.failures.get(0)  # rank 0 may still have been ending when the launcher stopped it
    assert stopped is None or stopped.exit_code == -signal.SIGTERM, stopped
    assert exc.failures[1].lines[0] == "Traceback (most recent call last):"


@pytest.mark.slow
@needs_proc
def test_hung_job_is_killed_at_its_timeout(tmp_path, engine):
    tag = uuid.uuid4().hex
    limit = 8.0  # both engines have the ranks up well before this on an idle machine
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        torchrun(f"{SCRIPTS}/hang.py", nproc=2, timeout=limit, show=False, cwd=ROOT,
                 env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag})
    took = time.monotonic() - t0
    assert limit <= took < limit + processes.GRACE_S + 5, took
    # On an idle machine both ranks are up within a few seconds; on a very busy one the
    # timeout may come while they start, and they must not survive that either.
    pids = pids_written(tmp_path)  # ranks + their children
    assert [p for p in pids if processes.alive(p)] == []  # rank 0 ignored SIGTERM: SIGKILLed
    assert tagged_processes(tag, pids) == []  # nor the launcher, nor anything else of the job
    exc = info.value
    if len(list(tmp_path.glob("rank*.pid"))) == 2:
        assert exc.logs == ["rank 0 waiting forever\n", "rank 1 waiting forever\n"]
    else:
        warnings.warn("the ranks had not started at the timeout; only the clean-up was tested",
                      stacklevel=1)
    assert sanitize(str(exc)) == (
        f"{SCRIPTS}/hang.py (2 processes) did not finish within its timeout of T s, so every "
        "process of the job was stopped.\n"
        "A rank that waits forever (in all_reduce, barrier, ...) usually means that another "
        "rank never made the same call.\n"
        "Logs of each rank R: <tmp>/rankR.stdout.log and rankR.stderr.log"
    )


@pytest.mark.slow
def test_command_line(engine):
    cmd = [sys.executable, "-m", "course_utils", "launch", f"{SCRIPTS}/two_ranks.py", "--nproc", "2",
           "--timeout", "300", "--", "3"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for r in range(2):
        assert [x for x in lines if x.startswith(f"[rank {r}]")] == [
            f"[rank {r}] rank {r} line {i}" for i in range(3)] + [
            f"[rank {r}] rank {r} done, no newline at the end"]
    missing = subprocess.run([*cmd[:4], "nope.py"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "script not found: nope.py" in missing.stderr
    # The equivalent terminal command and the engine, first, on stderr.
    assert done.stderr.splitlines()[0] == (
        f"[launcher] torchrun --standalone --nproc-per-node=2 {SCRIPTS}/two_ranks.py 3   "
        f"[gloo, {engine} engine]")


def _interrupt_when_started(folder: Path, presses: tuple[float, ...] = (0.0,)) -> threading.Thread:
    """A thread that sends the main thread SIGINT (as a kernel interrupt does) once both ranks
    wrote their pid files, once per entry of `presses` (the pause after it)."""
    main = threading.main_thread().ident

    def press():
        wait_for_pid_files(folder)
        time.sleep(0.5 if len(presses) > 1 else 0)  # the ranks' first line is in their logs
        for pause in presses:
            # A real SIGINT to the main thread: it wakes the launcher's wait. (_thread.interrupt_main()
            # only sets a flag, which Python 3.11 can lose while other threads of the process run.)
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(pause)

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@needs_proc
def test_interrupt_stops_every_process(tmp_path, engine):
    """Interrupting the kernel (KeyboardInterrupt) while a job runs stops the job too."""
    tag = uuid.uuid4().hex
    # In a kernel, Ctrl-C / "Interrupt" ends as a KeyboardInterrupt in the cell. Make this process
    # do the same, whatever an earlier test in this worker left installed for SIGINT.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    _interrupt_when_started(tmp_path)
    try:
        with pytest.raises(KeyboardInterrupt):
            torchrun(f"{SCRIPTS}/hang.py", nproc=2, timeout=300, show=False, cwd=ROOT,
                     env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag})
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(list(tmp_path.glob("rank*.pid"))) == 2
    assert tagged_processes(tag, pids_written(tmp_path)) == []


@pytest.mark.slow
@needs_proc
def test_repeated_interrupts_still_stop_every_process(notebook_mode, tmp_path, engine, capsys):
    """Four interrupts 0.3-1 s apart while the ranks take longer than the grace period to stop
    (they save a checkpoint on SIGTERM): the stop goes on to the end whatever is pressed, so nothing
    of the job outlives the KeyboardInterrupt; and the interrupted cell says what the ranks printed
    and where their logs are."""
    tag = uuid.uuid4().hex
    running = [True]

    def kernel_like(signum, frame):  # a press raises while the cell runs, and does nothing after
        if running[0]:
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, kernel_like)
    presser = _interrupt_when_started(tmp_path, (0.3, 1.0, 0.5, 0.0))
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            try:
                torchrun(f"{SCRIPTS}/slow_to_stop.py", nproc=2, timeout=300, cwd=ROOT,
                         env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag})
            finally:
                running[0] = False
        left = tagged_processes(tag, pids_written(tmp_path))  # at once: no waiting for stragglers
        presser.join(10)
    finally:
        signal.signal(signal.SIGINT, before)
    pids = pids_written(tmp_path)
    assert len(pids) == 2 and left == [] and not any(map(processes.alive, pids))
    log_dir = re.search(r"logs: (\S+)", str(info.value)).group(1)
    assert (Path(log_dir) / "rank0.stdout.log").read_text() == "rank 0 working\n"
    err = capsys.readouterr().err
    assert "[rank 0] rank 0 working" in err and "[rank 1] rank 1 working" in err


@pytest.mark.slow
@needs_proc
def test_command_line_interrupted_says_so_without_a_traceback(tmp_path, engine):
    tag = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "course_utils", "launch", f"{SCRIPTS}/hang.py", "--nproc", "2"]
    env = {**os.environ, "HANG_PID_DIR": str(tmp_path), "LAUNCH_TEST_TAG": tag}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_for_pid_files(tmp_path)
        proc.send_signal(signal.SIGINT)  # Ctrl-C in a terminal (here to the launcher alone)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted" in err and re.search(r"logs: \S+", err)
    assert tagged_processes(tag, pids_written(tmp_path)) == []


@pytest.mark.slow
@needs_linux
def test_job_stops_when_its_caller_dies(tmp_path, engine):
    """A killed or restarted kernel takes its job with it (no orphans running forever)."""
    tag = uuid.uuid4().hex
    code = ("from course_utils.launch import torchrun\n"
            f"torchrun('{SCRIPTS}/hang.py', nproc=2, timeout=300, show=False,"
            f" env={{'HANG_PID_DIR': {str(tmp_path)!r}, 'LAUNCH_TEST_TAG': {tag!r}}})\n")
    # The tag in the caller's environment: its launcher (or warm server) and their children show it.
    env = {**os.environ, "LAUNCH_TEST_TAG": tag}
    caller = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for_pid_files(tmp_path)
        assert tagged_processes(tag), "the job did not start"
    finally:
        caller.kill()
        caller.wait()
    ranks = pids_written(tmp_path)
    end = time.monotonic() + 30  # the launcher's own shut-down: SIGTERM, 5 s, then SIGKILL
    while tagged_processes(tag, ranks) and time.monotonic() < end:
        time.sleep(0.2)
    assert tagged_processes(tag, ranks) == []


@pytest.mark.slow
def test_failure_without_traceback_then_elastic_restart(notebook_mode, capsys, tmp_path, engine):
    script = f"{SCRIPTS}/two_ranks.py"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Every rank exits with code 3 (no traceback). Which one the launcher saw first is a race
    # (the other may get SIGTERM first): the one named is one that failed by itself.
    with pytest.raises(LaunchError) as info:
        torchrun(script, nproc=2, args=[2], env={"FAIL_FIRST_ATTEMPT": tmp_path / "a"},
                 timeout=300, cwd=ROOT)
    assert info.value.exit_code == 3 and info.value.rank in (0, 1)
    assert sanitize(str(info.value)).splitlines()[:3] == [
        f"rank {info.value.rank} of 2 failed with exit code 3 running {script}",
        "Last lines of its error output:",
        "    (it wrote nothing to stderr)",
    ]
    capsys.readouterr()
    # With one restart allowed, the second attempt succeeds; every attempt's output is shown.
    result = torchrun(script, nproc=2, args=[2], env={"FAIL_FIRST_ATTEMPT": tmp_path / "b"},
                      max_restarts=1, timeout=300, cwd=ROOT)
    assert result.restarts == 1
    assert result.attempts[0] == [f"rank {r} fails on attempt 0\n" for r in range(2)]
    assert result.attempts[1] == result.logs
    assert result.lines(1) == ["rank 1 line 0", "rank 1 line 1", "rank 1 done, no newline at the end"]
    assert capsys.readouterr().out == (
        "--- attempt 0 ---\n[rank 0] rank 0 fails on attempt 0\n[rank 1] rank 1 fails on attempt 0\n"
        "--- attempt 1 ---\n"
        + "".join(f"[rank {r}] {line}\n" for r in range(2) for line in result.lines(r))
    )


@pytest.mark.slow
def test_the_rank_that_said_why_is_named_whichever_exited_first(tmp_path, engine):
    """Rank 1 exits first and silently, rank 0 has said why (refuse.py, as train.py refusing a
    checkpoint): 20 launches, half with rank 0 exiting by itself (both codes 2), half with rank 0
    stopped by the launcher after saying why. The error always names rank 0 and its reason. (4 launches
    on torchrun, whose every launch starts fresh interpreters: the same two orders, 8 s a launch.)"""
    for run in range(20 if engine == "warm" else 4):
        folder = tmp_path / str(run)
        folder.mkdir()
        stubborn = run % 2
        with pytest.raises(LaunchError) as info:
            torchrun(f"{SCRIPTS}/refuse.py", nproc=2, timeout=120, show=False, cwd=ROOT,
                     env={"REFUSE_DIR": folder, "REFUSE_STUBBORN": stubborn})
        exc = info.value
        assert exc.rank == 0 and exc.exit_code == 2, f"run {run} (stubborn={stubborn}): {exc}"
        assert exc.error.startswith("error: the checkpoint last.pt was made with another configuration")
        assert "(it wrote nothing to stderr)" not in str(exc)
        assert "epochs: 4 -> 6" in str(exc)
