"""course_utils.launch: real 2-rank jobs (success, a failing rank, a hung job), bad arguments, the
command line, what a script can count on when it ends, and the two engines against each other.

The real jobs run on both engines (the ``engine`` fixture): ranks forked from the warm server, and
``python -m torch.distributed.run`` (a few seconds a launch). The scripts live in tests/scripts/
and the ones that do not need torch (hang, two_ranks, env_dump, shutdown) avoid importing it.
Everything goes through the package's public names.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
from launch_support import LINUX, SCRIPTS, assert_view_emptied, record_displays, sanitize

from course_utils import ROOT
from course_utils.launch import (
    LaunchError,
    LaunchResult,
    LaunchTimeout,
    choose_engine,
    cli,
    display,
    main,
    spawn_bounded,
    torchrun,
    warm,
)
from course_utils.launch.api import command
from course_utils.launch.capacity import RANK_MEMORY_MB, RANKS_PER_CORE, capacity
from course_utils.launch.diagnosis import blame, describe_exit, diagnose, error_tail
from course_utils.launch.engine import Exits, Job
from course_utils.launch.torchrun_engine import Torchrun, summary_exits
from course_utils.launch.watch import Logs, Tail

# ---------------------------------------------------------------------- no processes


def test_bad_arguments_are_refused_before_anything_starts(no_process_starts):
    ok = f"{SCRIPTS}/two_ranks.py"
    with pytest.raises(FileNotFoundError, match=r"script not found: scripts/nope\.py"):
        torchrun("scripts/nope.py", nproc=2, cwd=ROOT / "notebooks")
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="nproc must be"):
            torchrun(ok, nproc=bad, cwd=ROOT)
    with pytest.raises(ValueError, match="timeout must be"):
        torchrun(ok, nproc=2, timeout=0, cwd=ROOT)
    with pytest.raises(ValueError, match="max_restarts"):
        torchrun(ok, nproc=2, max_restarts=-1, cwd=ROOT)
    with pytest.raises(ValueError, match="backend must be"):
        torchrun(ok, nproc=2, backend="mpi", cwd=ROOT)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(RuntimeError, match="nccl needs one GPU per rank"):
        torchrun(ok, nproc=gpus + 1, backend="nccl", cwd=ROOT)


def test_engine_choice(monkeypatch):
    monkeypatch.delenv("COURSE_LAUNCHER", raising=False)
    assert choose_engine(None, 0) == ("warm" if LINUX else "torchrun")
    assert choose_engine(None, 1) == "torchrun"  # elastic restarts: torchrun's agent
    assert choose_engine("torchrun", 0) == "torchrun"
    with pytest.raises(ValueError, match="elastic restarts .* are torchrun's"):
        choose_engine("warm", 1)
    with pytest.raises(ValueError, match="engine must be one of"):
        choose_engine("fast", 0)
    monkeypatch.setenv("COURSE_LAUNCHER", "torchrun")
    assert choose_engine(None, 0) == "torchrun"
    monkeypatch.setenv("COURSE_LAUNCHER", "warm")
    assert choose_engine(None, 2) == "torchrun"  # a preference, not a demand
    monkeypatch.setenv("COURSE_LAUNCHER", "tourchrun")
    with pytest.raises(ValueError, match="COURSE_LAUNCHER must be one of"):
        choose_engine(None, 0)


def test_the_terminal_command_of_a_launch():
    assert command("s.py", 2, ["--out", "a b"]) == (
        "torchrun --standalone --nproc-per-node=2 s.py --out 'a b'")
    assert command("s.py", 3, [], 1) == "torchrun --standalone --nproc-per-node=3 --max-restarts=1 s.py"
    # Variables the launch set that a terminal's torchrun would not: before the command, quoted.
    assert command("s.py", 1, [], 0, {"OMP_NUM_THREADS": "1", "A": "x y"}) == (
        "A='x y' OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=1 s.py")


def test_engines_start_nothing_until_started(no_process_starts, tmp_path):
    """An engine is made without starting anything; torchrun's command line is torchrun's."""
    job = Job(f"{SCRIPTS}/two_ranks.py", 3, ("5", "x"), ROOT, {"COURSE_LAUNCH_ID": "x"}, tmp_path, 2)
    warm.Warm(dataclasses.replace(job, restarts=0))  # made, not started
    cmd = Torchrun(job).command()
    assert cmd[-3:] == [f"{SCRIPTS}/two_ranks.py", "5", "x"]
    opts = " ".join(cmd)
    assert "--standalone" in opts and "--nproc-per-node 3" in opts and "--max-restarts 2" in opts
    assert "--redirects 3" in opts and f"--log-dir {tmp_path / 'torchrun'}" in opts
    with pytest.raises(ValueError, match="elastic restarts are torchrun's"):
        warm.Warm(job)


def test_missing_script_message_is_deterministic_after_sanitizing():
    with pytest.raises(FileNotFoundError) as info:
        torchrun("scripts/nope.py", nproc=2, cwd=ROOT / "notebooks")
    assert sanitize(str(info.value)).startswith(
        "script not found: scripts/nope.py (looked for ./notebooks/scripts/nope.py)."
    )


def test_tail_reads_whole_lines_only(tmp_path):
    path = tmp_path / "log"
    tail = Tail(path)
    assert tail.read() == []  # not there yet
    path.write_bytes(b"one\ntw")
    assert tail.read() == ["one"]
    with open(path, "ab") as fh:
        fh.write("o \u00e9\nthree".encode())
    assert tail.read() == ["two \u00e9"]
    assert tail.read(final=True) == ["three"]
    assert tail.text() == "one\ntwo \u00e9\nthree\n"


SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
scripts/x.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-01_00:00:00
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 6227)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 6227
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 6228)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_failure_summary_and_blame():
    exits = summary_exits(SUMMARY)  # torchrun's printed summary: the fallback of its report
    assert exits.codes == {0: -15, 1: 1} and exits.first == 1
    boom = "ValueError: boom"
    peer = "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1671"
    # The rank that crashed is named, not the one that only lost its peer.
    assert blame(Exits({0: 1, 1: 1}, 0), {0: peer, 1: boom}) == 1
    assert blame(exits, {0: "", 1: boom}) == 1
    # The same error on every rank (e.g. a bad argument): the lowest rank, whatever came first.
    assert blame(Exits({0: 1, 1: 1}, 1), {0: "ValueError: bad", 1: "ValueError: bad"}) == 0
    # Every rank stops with the same code, but only rank 0 said why (train.py refusing a
    # checkpoint): rank 0 is named, whichever exited first, and also when it was stopped (SIGTERM)
    # after saying it.
    why = "error: the checkpoint last.pt was made with another configuration (epochs: 4 -> 6)."
    assert blame(Exits({0: 2, 1: 2}, 1), {0: why, 1: ""}) == 0
    assert blame(Exits({0: -15, 1: 2}, 1), {0: why, 1: ""}) == 0
    # A stopped rank's last words count only when they are an error, not a warning printed earlier.
    assert blame(Exits({0: -15, 1: 2}, 1), {0: "UserWarning: something", 1: ""}) == 1
    lines = ["[rank1]: noise", "[rank1]: Traceback (most recent call last):",
             '[rank1]:   File "x.py", line 3', f"[rank1]: {boom}"]
    assert error_tail(lines) == ["Traceback (most recent call last):", '  File "x.py", line 3', boom]
    # No exit codes at all: the lowest rank with a traceback.
    assert diagnose(Exits(), 1, "x.py", 2, ["", "\n".join(lines)], "/tmp/x").rank == 1
    assert "SIGKILL" in describe_exit(-9) and describe_exit(3) == "exit code 3"


def test_torchs_error_file_is_read_before_stderr(tmp_path, monkeypatch):
    """A rank whose entry point is decorated with torch's @record leaves its error in JSON in its
    TORCHELASTIC_ERROR_FILE (written by torch's own ErrorHandler here): the diagnosis quotes it."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise ValueError("written down")
    except ValueError as exc:
        ErrorHandler().record_exception(exc)
    found = diagnose(Exits({1: 1}, 1, {1: path}), 1, "x.py", 2, ["", "noise\n"], "/tmp/x")
    record = found.failures[1]
    assert (found.rank, record.error, record.source) == (1, "ValueError: written down", "error file")
    assert record.lines[-1] == "ValueError: written down" and record.lines[0].startswith("Traceback")
    assert "    ValueError: written down" in found.message
    path.write_text("{not json")  # unreadable: the rank's stderr instead
    again = diagnose(Exits({1: 1}, 1, {1: path}), 1, "x.py", 2, ["", "ValueError: b\n"], "/tmp/x")
    assert (again.failures[1].source, again.error) == ("stderr", "ValueError: b")


def test_result_repr_is_deterministic():
    r = LaunchResult("scripts/a.py", 2, "gloo", 0, elapsed=1.234, logs=["x\n", "y\n"],
                     stderr=["", ""], log_dir="/tmp/tmpabc")
    assert repr(r) == "LaunchResult(script='scripts/a.py', nproc=2, backend='gloo', returncode=0)"
    assert r.lines(1) == ["y"]


def _logs_of(tmp_path: Path, stdout: str, stderr: str = "") -> Logs:
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text(stdout)
    (tmp_path / "0" / "stderr.log").write_text(stderr)
    logs = Logs(2)
    logs.read({0: tmp_path})
    return logs


def test_live_view_escapes_and_shows_the_last_lines_of_every_rank(tmp_path):
    logs = _logs_of(tmp_path, "<b>\nx\ny\n", "[rank0]: z\n")
    page = display.view("torchrun a.py", "running", logs.last())
    assert "rank 0" in page and "rank 1" in page and "&lt;b&gt;" not in page  # the last 3 lines
    assert "x\ny\nz</pre>" in page  # stdout, then stderr without torch's "[rank0]:"


def test_live_view_leaves_nothing_that_nbval_compares(monkeypatch, tmp_path):
    """Shown without text/plain (nbval skips the widget view), emptied and closed at the end."""
    calls = record_displays(monkeypatch)
    logs = Logs(2)
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("hello\n")
    view = display.Notebook("torchrun a.py")
    view.show(logs, logs.read({0: tmp_path}))
    assert "hello" in view.widget.value
    view.end(logs, None)  # stopped early: nothing printed
    assert_view_emptied(calls)
    assert view.widget is None and len(calls) == 2


def test_what_the_launcher_shows_speaks_the_course_language(monkeypatch, capsys, tmp_path):
    """Title, status lines and failure summaries in Chinese for the Chinese edition; the ranks' own
    output as they wrote it."""
    monkeypatch.setenv("COURSE_LANG", "zh")
    title = display.title("torchrun --standalone --nproc-per-node=2 a.py", "gloo", "warm")
    assert title == "torchrun --standalone --nproc-per-node=2 a.py   [gloo，warm 引擎]"
    logs = _logs_of(tmp_path, "hello\n")
    assert "</b>：运行中" in display.view(title, "运行中，1 秒", logs.last())
    display.Terminal(title)
    display.Notebook(title).end(logs, "failure")
    err = capsys.readouterr().err
    assert err == f"[启动器] {title}\n[启动器] 失败之前各 rank 打印的内容：\n[rank 0] hello\n"
    stderr = ["", "boom\nValueError: bad\n"]
    found = diagnose(Exits({1: -9}, 1), 1, "a.py", 2, stderr, "/tmp/x")
    assert found.message.startswith("rank 1（共 2 个 rank）运行 a.py 时失败，退出码 -9（SIGKILL：")
    assert "    ValueError: bad" in found.message and found.error == "ValueError: bad"
    monkeypatch.setenv("COURSE_LANG", "en")
    assert display.title("torchrun a.py", "gloo", "warm") == "torchrun a.py   [gloo, warm engine]"
    assert diagnose(Exits({1: -9}, 1), 1, "a.py", 2, stderr, "/tmp/x").message.startswith(
        "rank 1 of 2 failed with exit code -9 (SIGKILL: killed, often")


def test_cli_exit_codes_without_launching(monkeypatch, capsys):
    def fake(exc):
        def run(*a, **k):
            raise exc
        return run

    monkeypatch.setattr(cli, "torchrun", fake(LaunchTimeout("too slow")))
    assert main(["x.py"]) == 124
    monkeypatch.setattr(cli, "torchrun", fake(LaunchError("rank 1 failed", rank=1, exit_code=3)))
    assert main(["x.py", "--nproc", "3"]) == 3
    monkeypatch.setattr(cli, "torchrun", fake(LaunchError("killed", rank=0, exit_code=-9)))
    assert main(["x.py"]) == 1
    monkeypatch.setattr(cli, "torchrun", fake(ValueError("nproc must be ...")))
    assert main(["x.py", "--nproc", "0"]) == 2
    err = capsys.readouterr().err
    assert "LaunchTimeout: too slow" in err and "LaunchError: rank 1 failed" in err
    seen = {}
    monkeypatch.setattr(cli, "torchrun", lambda script, **k: seen.update(script=script, **k) or
                        LaunchResult(script, 2, "gloo", 0, 1.0, ["", ""], ["", ""], "/tmp/tmpx"))
    assert main(["s.py", "--nproc", "3", "--backend", "gloo", "--", "--epochs", "2", "--"]) == 0
    assert seen["script"] == "s.py" and seen["nproc"] == 3 and seen["backend"] == "gloo"
    assert seen["args"] == ["--epochs", "2", "--"]


def test_more_processes_than_the_machine_can_hold_are_refused_with_what_to_do(
        no_process_starts, capsys):
    """nproc=1000 once filled the memory (each rank imports torch) and set off the OOM killer:
    refused up front, saying why and how to go beyond on purpose (max_nproc=, --max-nproc)."""
    ok = f"{SCRIPTS}/two_ranks.py"
    with pytest.raises(ValueError) as info:
        torchrun(ok, nproc=1000, cwd=ROOT)
    text = str(info.value)
    assert "nproc=1000" in text and "MB" in text and "max_nproc=1000" in text
    assert "--max-nproc 1000" in text
    # The bound: the memory available (about RANK_MEMORY_MB a rank) and the cores.
    assert capacity(1, 10 * RANK_MEMORY_MB * 2**20)[0] == min(10, max(8, RANKS_PER_CORE))
    assert capacity(16, None)[0] == 16 * RANKS_PER_CORE and capacity(1, 1)[0] == 1
    with pytest.raises(ValueError, match="max_nproc must be"):
        torchrun(ok, nproc=2, max_nproc=0, cwd=ROOT)
    with pytest.raises(ValueError, match="nproc=3 is more than max_nproc=2"):
        torchrun(ok, nproc=3, max_nproc=2, cwd=ROOT)
    # An explicit max_nproc lets it through, to the start of the ranks (refused here).
    with pytest.raises(AssertionError, match="a process was started"):
        torchrun(ok, nproc=1000, max_nproc=1000, cwd=ROOT, engine="torchrun", show=False)
    assert main([ok, "--nproc", "1000"]) == 2
    assert "--max-nproc 1000" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_nprocs=1000"):  # mp.spawn, bounded: the same bound
        spawn_bounded(print, nprocs=1000)


def test_choose_backend_warns_when_a_gpu_node_has_fewer_gpus_than_processes():
    from unittest import mock

    from course_utils.dist import choose_backend

    with mock.patch("torch.cuda.is_available", return_value=True), \
         mock.patch("torch.cuda.device_count", return_value=1):
        with pytest.warns(UserWarning, match="2 processes on this node but 1 GPU"):
            assert choose_backend(2) == "gloo"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert choose_backend(2, warn=False) == "gloo"  # the notebooks' launcher: on purpose
            assert choose_backend(1) == "nccl"
    with mock.patch("torch.cuda.is_available", return_value=False), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_backend(2) == "gloo"  # a CPU machine: nothing to warn about


@pytest.mark.skipif(not LINUX, reason="a test run's own temporary folder is made on Unix (conftest.py)")
def test_a_test_runs_launch_logs_stay_in_its_own_temporary_folder(monkeypatch):
    """conftest.py gives a test run a temporary folder inside /tmp, which a passing run removes: the
    launches' log folders go there, and read as <tmp> in outputs as the stored ones do."""
    import tempfile

    from course_utils.launch import api

    own = tempfile.gettempdir()
    assert own.startswith("/tmp/tmp-course-tests-")
    assert api._log_root() == own
    assert sanitize(f"Its full log: {own}/tmpab_c1z/rank1.stderr.log") == "Its full log: <tmp>/rank1.stderr.log"
    assert sanitize("every rank's logs are in /tmp/tmpab_c1z)") == "every rank's logs are in <tmp>)"
    for elsewhere in ("/var/tmp", "/tmp/user/1000"):  # a learner's TMPDIR that would not read as <tmp>
        monkeypatch.setattr(tempfile, "tempdir", elsewhere)
        assert api._log_root() == "/tmp"
