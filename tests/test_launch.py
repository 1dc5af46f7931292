"""course_utils.launch: real 2-rank jobs (success, a failing rank, a hung job), bad arguments, the CLI.

The real jobs run on both engines (the ``engine`` fixture): ranks forked from the warm server, and
``python -m torch.distributed.run`` (a few seconds a launch). The scripts live in tests/scripts/
and the ones that do not need torch (hang, two_ranks, env_dump) avoid importing it.
"""

from __future__ import annotations

import json
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
from torch.utils.data import DataLoader, Dataset

from course_utils import ROOT, launch
from course_utils.launch import (
    CapturedStderr,
    LaunchError,
    LaunchResult,
    LaunchTimeout,
    child_stderr,
    error_lines,
    free_port,
    spawn_bounded,
    torchrun,
    worker_failure,
)

SCRIPTS = "tests/scripts"
HAS_PROC = os.path.isdir("/proc/self")


# ----------------------------------------------------------------------------- helpers


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


WARM_RANKS: list[int] = []  # every rank the warm engine started in this process (see `engine`)


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment holds LAUNCH_TEST_TAG=tag (zombies show no environment),
    and those in the session of a rank the warm engine started (a forked rank's /proc environ is
    its server's: the variables it was given do not show there). Not the idle warm servers kept for
    the next job (one started for a job has that job's variables; it runs nothing of it any more)."""
    marker = f"LAUNCH_TEST_TAG={tag}\0".encode()
    sessions = {str(p).encode() for p in WARM_RANKS}
    idle = {str(s.proc.pid) for s in launch._Server.idle}
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and name not in idle:
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    env = fh.read()
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            rest = stat[stat.rfind(b")") + 2:].split()
            if rest[0] != b"Z" and (marker in env or rest[3] in sessions):
                found.append(int(name))
    return found


@pytest.fixture(params=launch.ENGINES)
def engine(request, monkeypatch):
    """Run the test once per engine (COURSE_LAUNCHER, which torchrun() reads when engine=None);
    the warm engine's ranks are recorded for tagged_processes."""
    monkeypatch.setenv("COURSE_LAUNCHER", request.param)
    init = launch._Warm.__init__

    def recording(self, *a, **k):
        init(self, *a, **k)
        WARM_RANKS.extend(self.ranks)

    monkeypatch.setattr(launch._Warm, "__init__", recording)
    return request.param


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def record_displays(monkeypatch) -> list:
    """IPython's display calls, recorded instead of sent to a frontend: [(name, args, kwargs)]."""
    pytest.importorskip("ipywidgets")
    import IPython.display

    calls = []
    for name in ("display", "update_display"):
        monkeypatch.setattr(IPython.display, name, lambda *a, _n=name, **k: calls.append((_n, a, k)))
    return calls


@pytest.fixture
def notebook_mode(monkeypatch):
    """torchrun() as in a Jupyter kernel: the real live view, refreshed at every look at the logs;
    returns its display calls and every HTML view it rendered."""
    monkeypatch.setattr(launch, "_in_notebook", lambda: True)
    monkeypatch.setattr(launch._Notebook, "refresh_s", 0.0)
    views, render = [], launch._Notebook._html
    monkeypatch.setattr(launch._Notebook, "_html", lambda self, *a: views.append(render(self, *a)) or views[-1])
    return record_displays(monkeypatch), views


def assert_view_emptied(calls) -> None:
    """The live view was displayed without text/plain, then emptied (nothing left that nbval compares)."""
    (shown, (bundle,), kw), *_, (emptied, (empty,), kw2) = calls
    assert shown == "display" and list(bundle) == ["application/vnd.jupyter.widget-view+json"] and kw["raw"]
    assert emptied == "update_display" and empty == {} and kw2["display_id"] == kw["display_id"] and kw2["raw"]


@pytest.fixture(autouse=True)
def _torch_imported():
    # torchrun() imports course_utils.dist (and torch) lazily; import it before any timing.
    import course_utils.dist  # noqa: F401


# ---------------------------------------------------------------------- no processes


def test_bad_arguments_are_refused_before_anything_starts(monkeypatch):
    def no_popen(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch.subprocess, "Popen", no_popen)
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


class _Started(Exception):
    pass


def test_engine_choice(monkeypatch):
    monkeypatch.delenv("COURSE_LAUNCHER", raising=False)
    linux = sys.platform.startswith("linux")
    assert launch._choose_engine(None, 0) == ("warm" if linux else "torchrun")
    assert launch._choose_engine(None, 1) == "torchrun"  # elastic restarts: torchrun's agent
    assert launch._choose_engine("torchrun", 0) == "torchrun"
    with pytest.raises(ValueError, match="elastic restarts .* are torchrun's"):
        launch._choose_engine("warm", 1)
    with pytest.raises(ValueError, match="engine must be one of"):
        launch._choose_engine("fast", 0)
    monkeypatch.setenv("COURSE_LAUNCHER", "torchrun")
    assert launch._choose_engine(None, 0) == "torchrun"
    monkeypatch.setenv("COURSE_LAUNCHER", "warm")
    assert launch._choose_engine(None, 2) == "torchrun"  # a preference, not a demand
    monkeypatch.setenv("COURSE_LAUNCHER", "tourchrun")
    with pytest.raises(ValueError, match="COURSE_LAUNCHER must be one of"):
        launch._choose_engine(None, 0)
    assert launch._command("s.py", 2, ["--out", "a b"], 0) == (
        "torchrun --standalone --nproc-per-node=2 s.py --out 'a b'")
    assert launch._command("s.py", 3, [], 1) == (
        "torchrun --standalone --nproc-per-node=3 --max-restarts=1 s.py")


def test_command_and_environment_of_the_ranks(monkeypatch):
    seen = {}

    def fake_popen(cmd, **kw):
        seen.update(cmd=cmd, **kw)
        raise _Started

    monkeypatch.setattr(launch.subprocess, "Popen", fake_popen)
    monkeypatch.setenv("COURSE_BACKEND", "gloo")  # honoured when backend=None
    monkeypatch.setenv("OMP_NUM_THREADS", "64")  # replaced: one thread per rank on any machine
    with pytest.raises(_Started):
        torchrun(f"{SCRIPTS}/two_ranks.py", nproc=3, args=[5, Path("x")], max_restarts=2,
                 env={"EXTRA": 1}, show=False, cwd=ROOT, engine="torchrun")
    cmd = seen["cmd"]
    run = cmd.index("torch.distributed.run")
    assert cmd[run - 1] == "-m" and cmd[-3:] == [f"{SCRIPTS}/two_ranks.py", "5", "x"]
    opts = " ".join(cmd[run + 1:-3])
    # --standalone: c10d rendezvous on localhost:0, a free port picked by the OS every time
    assert "--standalone" in opts and "--nproc-per-node 3" in opts and "--max-restarts 2" in opts
    assert "--redirects 3" in opts and "--log-dir" in opts
    env = seen["env"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["COURSE_BACKEND"] == "gloo" and env["PYTHONUNBUFFERED"] == "1" and env["EXTRA"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT) and env[launch.JOB_VAR]
    assert seen["start_new_session"] and str(seen["cwd"]) == str(ROOT)
    assert seen["stdin"] == subprocess.DEVNULL


def test_missing_script_message_is_deterministic_after_sanitizing():
    with pytest.raises(FileNotFoundError) as info:
        torchrun("scripts/nope.py", nproc=2, cwd=ROOT / "notebooks")
    assert sanitize(str(info.value)).startswith(
        "script not found: scripts/nope.py (looked for ./notebooks/scripts/nope.py)."
    )


def test_tail_reads_whole_lines_only(tmp_path):
    path = tmp_path / "log"
    tail = launch._Tail(path)
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
    failures, root = launch._failures(SUMMARY)
    assert failures == {0: -15, 1: 1} and root == 1
    boom = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "x.py", line 3', "[rank1]: ValueError: boom"]
    peer = ["[rank0]: Traceback (most recent call last):",
            "[rank0]: RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1671"]
    # The rank that crashed is named, not the one that only lost its peer.
    assert launch._blame({0: 1, 1: 1}, 0, [peer, boom]) == 1
    assert launch._blame(failures, root, [[], boom]) == 1
    # The same error on every rank (e.g. a bad argument): the lowest rank, whatever came first.
    same = [["Traceback (most recent call last):", "ValueError: bad"]] * 2
    assert launch._blame({0: 1, 1: 1}, 1, same) == 0
    # No summary at all: the lowest rank with a traceback.
    assert launch._blame({}, None, [[], boom]) == 1
    # Every rank stops with the same code, but only rank 0 said why (train.py refusing a checkpoint):
    # rank 0 is named, whichever exited first, and also when it was stopped (SIGTERM) after saying it.
    why = ["error: the checkpoint last.pt was made with another configuration (epochs: 4 -> 6)."]
    assert launch._blame({0: 2, 1: 2}, 1, [why, []]) == 0
    assert launch._blame({0: -15, 1: 2}, 1, [why, []]) == 0
    # A stopped rank's last words count only when they are an error, not a warning it printed earlier.
    assert launch._blame({0: -15, 1: 2}, 1, [["UserWarning: something"], []]) == 1
    assert launch._error_tail(["noise", *boom]) == [
        "Traceback (most recent call last):", '  File "x.py", line 3', "ValueError: boom"]
    assert "SIGKILL" in launch._describe_exit(-9) and launch._describe_exit(3) == "exit code 3"


def test_result_repr_is_deterministic():
    r = LaunchResult("scripts/a.py", 2, "gloo", 0, elapsed=1.234, logs=["x\n", "y\n"],
                     stderr=["", ""], log_dir="/tmp/tmpabc")
    assert repr(r) == "LaunchResult(script='scripts/a.py', nproc=2, backend='gloo', returncode=0)"
    assert r.lines(1) == ["y"]


def test_live_view_escapes_and_shows_the_last_lines_of_every_rank(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("<b>\nx\ny\n")
    (tmp_path / "0" / "stderr.log").write_text("[rank0]: z\n")
    logs = launch._Logs(2)
    logs.read({0: tmp_path})
    page = launch._Notebook("torchrun a.py")._html("running", logs.last())
    assert "rank 0" in page and "rank 1" in page and "&lt;b&gt;" not in page  # only the last 3 lines
    assert "x\ny\nz</pre>" in page  # stdout, then stderr without torch's "[rank0]:"


def test_live_view_leaves_nothing_that_nbval_compares(monkeypatch, tmp_path):
    """Shown without text/plain (nbval skips the widget view), emptied and closed at the end."""
    calls = record_displays(monkeypatch)
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("hello\n")
    view, logs = launch._Notebook("torchrun a.py"), launch._Logs(2)
    view.show(logs, logs.read({0: tmp_path}))
    assert "hello" in view.widget.value
    view.end(logs, None)  # stopped early: nothing printed
    assert_view_emptied(calls)
    assert view.widget is None and len(calls) == 2


def test_what_the_launcher_shows_speaks_the_course_language(monkeypatch, capsys, tmp_path):
    """Title, status lines and failure summaries in Chinese for the Chinese edition; the ranks' own
    output as they wrote it."""
    from types import SimpleNamespace

    monkeypatch.setenv("COURSE_LANG", "zh")
    title = launch._title("torchrun --standalone --nproc-per-node=2 a.py", "gloo", "warm")
    assert title == "torchrun --standalone --nproc-per-node=2 a.py   [gloo，warm 引擎]"
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("hello\n")
    logs = launch._Logs(2)
    logs.read({0: tmp_path})
    assert "</b>：运行中" in launch._Notebook(title)._html("运行中，1 秒", logs.last())
    launch._Terminal(title)
    launch._Notebook(title).end(logs, "failure")
    err = capsys.readouterr().err
    assert err == f"[启动器] {title}\n[启动器] 失败之前各 rank 打印的内容：\n[rank 0] hello\n"
    job = SimpleNamespace(failures=lambda: ({1: -9}, 1), output=lambda: "")
    info = {"log_dir": "/tmp/x", "logs": ["", ""], "stderr": ["", "boom\nValueError: bad\n"], "elapsed": 1.0}
    exc = launch._failure(job, 1, "a.py", 2, **info)
    assert str(exc).startswith("rank 1（共 2 个 rank）运行 a.py 时失败，退出码 -9（SIGKILL：")
    assert "    ValueError: bad" in str(exc) and exc.error == "ValueError: bad"
    monkeypatch.setenv("COURSE_LANG", "en")
    assert launch._title("torchrun a.py", "gloo", "warm") == "torchrun a.py   [gloo, warm engine]"
    assert str(launch._failure(job, 1, "a.py", 2, **info)).startswith(
        "rank 1 of 2 failed with exit code -9 (SIGKILL: killed, often")


def test_cli_exit_codes_without_launching(monkeypatch, capsys):
    def fake(exc):
        def run(*a, **k):
            raise exc
        return run

    monkeypatch.setattr(launch, "torchrun", fake(LaunchTimeout("too slow")))
    assert launch.main(["x.py"]) == 124
    monkeypatch.setattr(launch, "torchrun", fake(LaunchError("rank 1 failed", rank=1, exit_code=3)))
    assert launch.main(["x.py", "--nproc", "3"]) == 3
    monkeypatch.setattr(launch, "torchrun", fake(LaunchError("killed", rank=0, exit_code=-9)))
    assert launch.main(["x.py"]) == 1
    monkeypatch.setattr(launch, "torchrun", fake(ValueError("nproc must be ...")))
    assert launch.main(["x.py", "--nproc", "0"]) == 2
    err = capsys.readouterr().err
    assert "LaunchTimeout: too slow" in err and "LaunchError: rank 1 failed" in err
    seen = {}
    monkeypatch.setattr(launch, "torchrun", lambda script, **k: seen.update(script=script, **k) or
                        LaunchResult(script, 2, "gloo", 0, 1.0, ["", ""], ["", ""], "/tmp/tmpx"))
    assert launch.main(["s.py", "--nproc", "3", "--backend", "gloo", "--", "--epochs", "2", "--"]) == 0
    assert seen["script"] == "s.py" and seen["nproc"] == 3 and seen["backend"] == "gloo"
    assert seen["args"] == ["--epochs", "2", "--"]


# ------------------------------------------------------------------------- real jobs


@pytest.mark.slow
def test_success_per_rank_logs_and_grouped_output(notebook_mode, capsys, engine):
    from course_utils.dist import choose_backend

    result = torchrun(f"{SCRIPTS}/ok.py", nproc=2, args=["--lines", 3], env={"EXTRA": 7},
                      timeout=300, cwd=ROOT)
    assert result.returncode == 0 and result.nproc == 2 and result.restarts == 0
    assert result.elapsed > 0 and result.engine == engine
    assert result.command == f"torchrun --standalone --nproc-per-node=2 {SCRIPTS}/ok.py --lines 3"
    backend = choose_backend(2)
    omp = "1"
    for r in range(2):
        env = [("COURSE_BACKEND", backend), ("EXTRA", "7"), ("OMP_NUM_THREADS", omp),
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
    """Two jobs at the same time (each gets its own free port); lines stay whole and in order."""
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
@pytest.mark.skipif(not HAS_PROC, reason="checks processes through /proc")
def test_failing_rank_is_named_promptly(notebook_mode, capsys, engine):
    tag = uuid.uuid4().hex
    script = f"{SCRIPTS}/fail.py"
    with pytest.raises(LaunchError) as info:
        torchrun(script, nproc=2, timeout=300, env={"LAUNCH_TEST_TAG": tag}, cwd=ROOT)
    reported = time.time()
    exc = info.value
    assert not isinstance(exc, LaunchTimeout)
    assert exc.rank == 1 and exc.exit_code == 1 and exc.error == "ValueError: rank 1 cannot go on"
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
@pytest.mark.skipif(not HAS_PROC, reason="checks processes through /proc")
def test_hung_job_is_killed_at_its_timeout(tmp_path, engine):
    tag = uuid.uuid4().hex
    limit = 15.0
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        torchrun(f"{SCRIPTS}/hang.py", nproc=2, timeout=limit, show=False, cwd=ROOT,
                 env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag})
    took = time.monotonic() - t0
    assert limit <= took < limit + launch.GRACE_S + 5, took
    # On an idle machine both ranks are up within a few seconds; on a very busy one the
    # timeout may come while they start, and they must not survive that either.
    pid_files = sorted(tmp_path.glob("rank*.pid"))
    pids = [int(p) for f in pid_files for p in f.read_text().split()]  # ranks + their children
    assert [p for p in pids if alive(p)] == []  # rank 0 ignored SIGTERM: it was SIGKILLed
    assert tagged_processes(tag) == []  # nor the launcher, nor anything else of the job
    exc = info.value
    if len(pid_files) == 2:
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


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="checks processes through /proc")
def test_interrupt_stops_every_process(tmp_path, engine):
    """Interrupting the kernel (KeyboardInterrupt) while a job runs stops the job too."""
    tag = uuid.uuid4().hex
    main = threading.main_thread().ident

    def interrupt_when_started():
        end = time.monotonic() + 200
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        # A real SIGINT, as a kernel interrupt sends, to the main thread: it wakes the launcher's
        # wait. (_thread.interrupt_main() only sets a flag, which Python 3.11 can lose while other
        # threads of the process run.)
        signal.pthread_kill(main, signal.SIGINT)

    # In a kernel, Ctrl-C / "Interrupt" ends as a KeyboardInterrupt in the cell. Make this process do
    # the same, whatever an earlier test in this worker left installed for SIGINT.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_when_started, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            torchrun(f"{SCRIPTS}/hang.py", nproc=2, timeout=300, show=False, cwd=ROOT,
                     env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag})
    finally:
        signal.signal(signal.SIGINT, before)
        if before is not signal.default_int_handler:
            print(f"SIGINT handler found in place: {before!r}")
    assert len(list(tmp_path.glob("rank*.pid"))) == 2
    assert tagged_processes(tag) == []


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_job_stops_when_its_caller_dies(tmp_path, engine):
    """A killed or restarted kernel takes its job with it (no orphans running forever)."""
    tag = uuid.uuid4().hex
    code = ("from course_utils.launch import torchrun\n"
            f"torchrun('{SCRIPTS}/hang.py', nproc=2, timeout=300, show=False,"
            f" env={{'HANG_PID_DIR': {str(tmp_path)!r}, 'LAUNCH_TEST_TAG': {tag!r}}})\n")
    # The tag in the caller's environment: its launcher (or warm server) and their children show it.
    caller = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "LAUNCH_TEST_TAG": tag})
    try:
        end = time.monotonic() + 200
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        assert tagged_processes(tag), "the job did not start"
    finally:
        caller.kill()
        caller.wait()
    end = time.monotonic() + 30  # the launcher's own shut-down: SIGTERM, 5 s, then SIGKILL
    while tagged_processes(tag) and time.monotonic() < end:
        time.sleep(0.2)
    assert tagged_processes(tag) == []


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
def test_both_engines_start_a_rank_alike(tmp_path):
    """The same variables (values differ only where they must: port, run id, log paths, who hosts
    the store), argv, working directory, __file__, sys.path[0], __main__, empty stdin."""
    seen = {}
    for name in launch.ENGINES:
        files = tmp_path / name
        files.mkdir()
        r = torchrun(f"{SCRIPTS}/env_dump.py", nproc=2, args=["a", "b c"], show=False, cwd=ROOT,
                     engine=name, timeout=300, env={"UNCLOSED_DIR": files})
        assert r.engine == name
        seen[name] = [json.loads(r.logs[k]) for k in range(2)]
        # the interpreter shut down as usual: a file never closed was flushed
        assert [(files / f"rank{k}.txt").read_text() for k in range(2)] == ["written, never closed\n"] * 2
    for rank in range(2):
        warm, real = seen["warm"][rank], seen["torchrun"][rank]
        we, te = warm.pop("env"), real.pop("env")
        assert warm == real and real["argv"] == [f"{SCRIPTS}/env_dump.py", "a", "b c"]
        assert real["file"] == str(ROOT / SCRIPTS / "env_dump.py") and real["name"] == "__main__"
        assert set(we) == set(te)
        differ = {k for k in te if we[k] != te[k]}
        assert differ <= {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
                          "TORCHELASTIC_USE_AGENT_STORE", "UNCLOSED_DIR", launch.JOB_VAR}, differ
        assert real["annotations"] == "{'x': <class 'int'>, 'return': None}" and real["builtins"] == "module"
        assert we["RANK"] == te["RANK"] == we["LOCAL_RANK"] == str(rank)
        assert we["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the store itself


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_warm_launch_after_heavy_multithreaded_torch_work():
    """Fork-based launchers hang when the forking process holds thread pools and locks; the warm
    server is a fresh process that never runs torch work, so a kernel's threads do not matter."""
    code = (
        "import threading, torch\n"
        "torch.set_num_threads(4)\n"
        "def work():\n"
        "    for _ in range(20): torch.randn(300, 300) @ torch.randn(300, 300)\n"
        "threads = [threading.Thread(target=work) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "from course_utils.launch import torchrun\n"
        f"r = torchrun('{SCRIPTS}/two_ranks.py', nproc=2, args=[3], show=False, engine='warm')\n"
        "[t.join() for t in threads]\n"
        "r2 = torchrun('{SCRIPTS}/two_ranks.py', nproc=2, args=[3], show=False, engine='warm')\n"
        "print(r.engine, r2.engine, r.lines(1)[-1])\n"
    ).replace("{SCRIPTS}", SCRIPTS)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "warm warm rank 1 done, no newline at the end\n"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_warm_relative_cwd_is_the_kernels_not_the_servers(tmp_path, monkeypatch):
    launch.warm_up()  # a server started here, in the repository
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "where.py").write_text("import os\nprint(os.getcwd())\n")
    monkeypatch.chdir(tmp_path)  # then the kernel moves (%cd)
    r = torchrun("where.py", nproc=2, show=False, cwd="sub", engine="warm", timeout=300)
    assert r.logs == [f"{tmp_path / 'sub'}\n"] * 2


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_a_dead_warm_server_is_replaced():
    first = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[1], show=False, cwd=ROOT, engine="warm")
    assert first.engine == "warm" and launch._Server.idle
    for server in launch._Server.idle:
        server.proc.kill()
        server.proc.wait()
    again = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[1], show=False, cwd=ROOT, engine="warm")
    assert again.logs == first.logs and again.engine == "warm"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_variables_read_at_import_reach_warm_ranks():
    """TORCH_DISTRIBUTED_DEBUG is read by `import torch.distributed`: a job that sets it runs on a
    server started with it (the plain one stays in the pool for the other jobs)."""
    script = f"{SCRIPTS}/debug_level.py"
    for level in ("OFF", "DETAIL", "INFO", "OFF"):
        env = {} if level == "OFF" else {"TORCH_DISTRIBUTED_DEBUG": level}
        r = torchrun(script, nproc=2, env=env, show=False, cwd=ROOT, engine="warm", timeout=300)
        assert r.logs == [f"{level}\n"] * 2
    keys = [dict(s.key).get("TORCH_DISTRIBUTED_DEBUG") for s in launch._Server.idle]
    assert sorted(keys, key=str) == sorted([None, "DETAIL", "INFO"], key=str)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_warm_up_starts_the_server_that_the_next_launch_uses(monkeypatch):
    monkeypatch.delenv("COURSE_LAUNCHER", raising=False)
    _close = launch._close_servers
    _close()
    launch.warm_up()  # returns at once; the server imports torch in the background
    (server,) = launch._Server.idle
    assert not server.ready and server.proc.poll() is None
    r = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[1], show=False, cwd=ROOT)
    assert r.engine == "warm" and launch._Server.idle == [server] and server.ready
    launch.warm_up()  # a server is waiting already: nothing more is started
    assert launch._Server.idle == [server]
    monkeypatch.setenv("COURSE_LAUNCHER", "torchrun")
    _close()
    launch.warm_up()
    assert launch._Server.idle == []


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_warm_up_imports_reach_the_ranks_through_their_own_server(tmp_path, monkeypatch):
    """warm_up(imports=...) makes the server import more modules, which its ranks then have before their
    first line; the setting is kept in the environment, so that later launches find that server (a
    server without them is another one)."""
    monkeypatch.delenv(launch.WARM_IMPORTS_VAR, raising=False)
    monkeypatch.delenv("COURSE_LAUNCHER", raising=False)
    (tmp_path / "has.py").write_text("import sys\nprint('colorsys' in sys.modules)\n")
    plain = torchrun("has.py", nproc=2, show=False, cwd=tmp_path, engine="warm", timeout=300)
    assert plain.logs == ["False\n"] * 2
    launch.warm_up(imports=["colorsys"])  # a module nothing else imports
    assert os.environ[launch.WARM_IMPORTS_VAR] == "colorsys"
    warmed = torchrun("has.py", nproc=2, show=False, cwd=tmp_path, engine="warm", timeout=300)
    assert warmed.logs == ["True\n"] * 2
    with pytest.raises(ValueError, match="list of module names"):
        launch.warm_up(imports="colorsys")  # a string, not a list of names
    with pytest.raises(ValueError, match="list of module names"):
        launch.warm_up(imports=["a,b"])


def test_choose_backend_warns_when_a_gpu_node_has_fewer_gpus_than_processes():
    import warnings
    from unittest import mock

    from course_utils.dist import choose_backend

    with mock.patch("torch.cuda.is_available", return_value=True), \
         mock.patch("torch.cuda.device_count", return_value=1):
        with pytest.warns(UserWarning, match="2 processes on this node but 1 GPU"):
            assert choose_backend(2) == "gloo"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert choose_backend(2, warn=False) == "gloo"  # the notebooks' launcher: gloo on purpose
            assert choose_backend(1) == "nccl"
    with mock.patch("torch.cuda.is_available", return_value=False), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_backend(2) == "gloo"  # a CPU machine: nothing to warn about


def test_spawn_bounded_refuses_bad_arguments_before_anything_starts(monkeypatch):
    import torch.multiprocessing as mp

    def no_start(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp, "start_processes", no_start)
    # nprocs = torch.cuda.device_count() = 0 on a CPU machine: mp.spawn itself would return silently
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


# ----------------------------------------------------------------- free_port, spawn_bounded


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
    from course_utils.launch import SpawnFailed

    with pytest.raises(SpawnFailed, match="2 of 2 child processes exited with code 3") as info:
        spawn_bounded(_fail, nprocs=2, timeout=60, start_method="fork")
    assert info.value.exit_code == 3
    from course_utils.i18n import speaking

    with speaking("zh"), pytest.raises(SpawnFailed, match="2 个子进程中有 2 个在 _fail 结束之前退出，退出码 3"):
        spawn_bounded(_fail, nprocs=2, timeout=60, start_method="fork")


@pytest.mark.slow
def test_spawn_bounded_stops_children_at_the_deadline():
    t0 = time.monotonic()
    from course_utils.launch import SpawnFailed

    with pytest.raises(SpawnFailed, match="did not finish"):
        spawn_bounded(_sleep, nprocs=2, timeout=1.0, start_method="fork")
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_the_rank_that_said_why_is_named_whichever_exited_first(tmp_path, engine):
    """Rank 1 exits first and silently, rank 0 has said why (refuse.py, as train.py refusing a checkpoint):
    20 launches, half with rank 0 exiting by itself (both codes 2), half with rank 0 stopped by the
    launcher after saying why. The error always names rank 0 and quotes its reason."""
    for run in range(20):
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


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="checks processes through /proc")
def test_repeated_interrupts_still_stop_every_process(notebook_mode, tmp_path, engine, capsys):
    """Four interrupts 0.3-1 s apart while the ranks take longer than the grace period to stop (they
    save a checkpoint on SIGTERM): the stop goes on to the end whatever is pressed, so nothing of the
    job outlives the KeyboardInterrupt; and the interrupted cell says what the ranks printed and where
    their logs are."""
    tag = uuid.uuid4().hex
    main = threading.main_thread().ident

    def interrupt_four_times():
        end = time.monotonic() + 200
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(0.5)  # the ranks' first line is in their logs
        for pause in (0.3, 1.0, 0.5, 0.0):
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(pause)

    # As in a kernel: a press raises KeyboardInterrupt while the cell runs, and does nothing after it.
    running = [True]

    def kernel_like(signum, frame):
        if running[0]:
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, kernel_like)
    presser = threading.Thread(target=interrupt_four_times, daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            try:
                torchrun(f"{SCRIPTS}/slow_to_stop.py", nproc=2, timeout=300, cwd=ROOT,
                         env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag})
            finally:
                running[0] = False
        left = tagged_processes(tag)  # at once: no waiting for stragglers
        presser.join(10)
    finally:
        signal.signal(signal.SIGINT, before)
    pids = [int(f.read_text()) for f in tmp_path.glob("rank*.pid")]
    assert len(pids) == 2 and left == [] and not any(map(alive, pids))
    log_dir = re.search(r"logs: (\S+)", str(info.value)).group(1)
    assert (Path(log_dir) / "rank0.stdout.log").read_text() == "rank 0 working\n"
    err = capsys.readouterr().err
    assert "[rank 0] rank 0 working" in err and "[rank 1] rank 1 working" in err


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="checks processes through /proc")
def test_command_line_interrupted_says_so_without_a_traceback(tmp_path, engine):
    tag = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "course_utils", "launch", f"{SCRIPTS}/hang.py", "--nproc", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HANG_PID_DIR": str(tmp_path), "LAUNCH_TEST_TAG": tag})
    try:
        end = time.monotonic() + 200
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # Ctrl-C in a terminal (the whole group gets it; here the launcher)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted" in err and re.search(r"logs: \S+", err)
    assert tagged_processes(tag) == []


def test_more_processes_than_the_machine_can_hold_are_refused_with_what_to_do(monkeypatch, capsys):
    """nproc=1000 once filled the memory (each rank imports torch) and set off the OOM killer: refused
    up front, saying why and how to go beyond on purpose (max_nproc=, --max-nproc)."""
    def no_popen(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch.subprocess, "Popen", no_popen)
    ok = f"{SCRIPTS}/two_ranks.py"
    with pytest.raises(ValueError) as info:
        torchrun(ok, nproc=1000, cwd=ROOT)
    text = str(info.value)
    assert "nproc=1000" in text and "MB" in text and "max_nproc=1000" in text and "--max-nproc 1000" in text
    # The bound: the memory available (about RANK_MEMORY_MB a rank) and the cores (RANKS_PER_CORE each).
    monkeypatch.setattr(launch, "_memory_available", lambda: 10 * launch.RANK_MEMORY_MB * 2**20)
    monkeypatch.setattr(launch, "_cores", lambda: 1)
    limit, _ = launch.machine_capacity()
    assert limit == min(10, max(8, launch.RANKS_PER_CORE))
    with pytest.raises(ValueError, match=f"nproc={limit + 1} is more processes"):
        torchrun(ok, nproc=limit + 1, cwd=ROOT)
    with pytest.raises(ValueError, match="max_nproc must be"):
        torchrun(ok, nproc=2, max_nproc=0, cwd=ROOT)
    # An explicit max_nproc lets it through (to the start of the ranks, stopped here).
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(_Started()))
    with pytest.raises(_Started):
        torchrun(ok, nproc=limit + 1, max_nproc=limit + 1, cwd=ROOT, engine="torchrun", show=False)
    assert launch.main([ok, "--nproc", "1000"]) == 2
    assert "--max-nproc 1000" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_nprocs=1000"):  # mp.spawn, bounded: the same bound
        spawn_bounded(_ok, nprocs=1000)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm engine is for Linux")
def test_the_timeout_covers_the_start(tmp_path):
    """A job whose ranks are slow to start (here: a new warm server must import torch first) still
    ends at its timeout, counted from the call, with nothing left running."""
    tag = uuid.uuid4().hex
    limit = 1.0
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:  # a start-up variable never seen: a new server
        torchrun(f"{SCRIPTS}/hang.py", nproc=2, timeout=limit, show=False, cwd=ROOT, engine="warm",
                 env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag, "TORCH_TEST_FRESH": tag})
    took = time.monotonic() - t0
    assert took < limit + launch.GRACE_S + 1.5, took
    assert "did not finish within its timeout of 1 s" in str(info.value)
    assert tagged_processes(tag) == []
