"""The warm engine against torchrun: the same rank (variables, argv, working directory, threads,
``__main__``), the same rendezvous store (hosted outside the ranks and listening before they start),
the same end of a script (atexit handlers, threads joined, files flushed, exit codes, SIGINT); and
the warm server's own life (its pool, a dead one replaced, variables read at import)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from launch_support import SCRIPTS, needs_linux

from course_utils import ROOT
from course_utils.launch import ENGINES, WARM_IMPORTS_VAR, LaunchError, torchrun, warm, warm_up

# Rank variables whose values differ between the engines, and must: the port, the run id, the
# paths of the job's own files, the launcher's job id.
EXPECTED_TO_DIFFER = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
                      "UNCLOSED_DIR", "COURSE_LAUNCH_ID"}


@pytest.mark.slow
def test_both_engines_start_a_rank_alike(tmp_path):
    """The same variables (values differ only where they must), argv, working directory, __file__,
    sys.path[0], __main__, empty stdin; the store is the launcher's on both (not rank 0's)."""
    seen = {}
    for name in ENGINES:
        files = tmp_path / name
        files.mkdir()
        r = torchrun(f"{SCRIPTS}/env_dump.py", nproc=2, args=["a", "b c"], show=False, cwd=ROOT,
                     engine=name, timeout=300, env={"UNCLOSED_DIR": files})
        assert r.engine == name
        seen[name] = [json.loads(r.logs[k]) for k in range(2)]
        # the interpreter shut down as usual: a file never closed was flushed
        written = [(files / f"rank{k}.txt").read_text() for k in range(2)]
        assert written == ["written, never closed\n"] * 2
    for rank in range(2):
        warm_rank, real = seen["warm"][rank], seen["torchrun"][rank]
        we, te = warm_rank.pop("env"), real.pop("env")
        assert warm_rank == real and real["argv"] == [f"{SCRIPTS}/env_dump.py", "a", "b c"]
        assert real["file"] == str(ROOT / SCRIPTS / "env_dump.py") and real["name"] == "__main__"
        assert set(we) == set(te)
        differ = {k for k in te if we[k] != te[k]}
        assert differ <= EXPECTED_TO_DIFFER, differ
        assert real["annotations"] == "{'x': <class 'int'>, 'return': None}"
        assert real["builtins"] == "module"
        assert we["RANK"] == te["RANK"] == we["LOCAL_RANK"] == str(rank)
        assert we["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the launcher hosts the store


@pytest.mark.slow
@pytest.mark.parametrize("caller", [None, "3"], ids=["unset", "set-to-3"])
def test_threads_per_rank_as_torchrun_gives_them(monkeypatch, caller):
    """OMP_NUM_THREADS: the caller's value is kept, one thread where it has none (torchrun's
    default); torch uses as many threads in the rank as in a fresh interpreter (MKL caps the value
    at the physical cores), on both engines. The terminal command shows the variable only where a
    terminal's torchrun would not set it (one rank, nothing set)."""
    if caller is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", caller)
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           env={**os.environ, "OMP_NUM_THREADS": caller or "1"},
                           capture_output=True, text=True, timeout=300).stdout.strip()
    want = f"OMP_NUM_THREADS={caller or '1'} torch threads={fresh}\n"
    for name in ENGINES:
        for nproc in (1, 2) if caller is None else (2,):  # (one rank: the case the command shows)
            r = torchrun(f"{SCRIPTS}/threads.py", nproc=nproc, show=False, cwd=ROOT, engine=name,
                         timeout=300)
            assert r.logs == [want] * nproc, (name, r.logs)
            shown = "OMP_NUM_THREADS=1 " if caller is None and nproc == 1 else ""
            assert r.command == (
                f"{shown}torchrun --standalone --nproc-per-node={nproc} {SCRIPTS}/threads.py")


@pytest.mark.slow
@needs_linux
def test_the_store_outlives_rank_0_and_listens_before_the_ranks_start(engine):
    """The rendezvous store is the launcher's, as under torchrun's agent: it listens before any rank
    runs (no window in which another program can take the port), and a rank 0 that ends early does
    not take it away from the others."""
    r = torchrun(f"{SCRIPTS}/store_host.py", nproc=2, show=False, cwd=ROOT, timeout=300)
    assert r.logs[1] == ("listening before rank 0 started: True\n"
                         "store after rank 0 exited: rank 0 is gone\n"), r.stderr[1]


MODES = {  # how shutdown.py ends: (the exit code the launch reports, what stderr says)
    "return": (0, ""),
    "exit-3": (3, ""),
    "exit-message": (1, "a message for stderr\n"),
    "raise": (1, "ValueError: an uncaught error\n"),
    "interrupt": (-2, "KeyboardInterrupt\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_what_a_script_can_count_on_when_it_ends(tmp_path, engine, mode):
    """However the script ends: its atexit handler ran, its non-daemon thread was joined (it wrote
    after the main code had ended), the files it never closed have their buffered data, the exit
    code follows SystemExit's rules, and a KeyboardInterrupt ends the rank by SIGINT."""
    code, said = MODES[mode]
    env = {"SHUTDOWN_DIR": tmp_path, "SHUTDOWN_MODE": mode}
    try:
        result = torchrun(f"{SCRIPTS}/shutdown.py", nproc=1, show=False, cwd=ROOT, env=env,
                          timeout=300)
        exit_code, stderr = result.returncode, result.stderr[0]
    except LaunchError as exc:
        exit_code, stderr = exc.exit_code, exc.stderr[0]
    assert exit_code == code, stderr
    assert stderr.endswith(said)
    files = {p.name: p.read_bytes() for p in (tmp_path / "0").iterdir()}
    assert files == {"atexit.txt": b"atexit ran\n", "thread.txt": b"the thread finished\n",
                     "unclosed.txt": b"text never closed\n", "unclosed.bin": b"bytes never closed\n"}


@pytest.mark.slow
@needs_linux
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
        f"r2 = torchrun('{SCRIPTS}/two_ranks.py', nproc=2, args=[3], show=False, engine='warm')\n"
        "print(r.engine, r2.engine, r.lines(1)[-1])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "warm warm rank 1 done, no newline at the end\n"


@pytest.mark.slow
@needs_linux
def test_warm_relative_cwd_is_the_kernels_not_the_servers(tmp_path, monkeypatch):
    warm_up()  # a server started here, in the repository
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "where.py").write_text("import os\nprint(os.getcwd())\n")
    monkeypatch.chdir(tmp_path)  # then the kernel moves (%cd)
    r = torchrun("where.py", nproc=2, show=False, cwd="sub", engine="warm", timeout=300)
    assert r.logs == [f"{tmp_path / 'sub'}\n"] * 2


@pytest.mark.slow
@needs_linux
def test_a_dead_warm_server_is_replaced():
    first = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[1], show=False, cwd=ROOT, engine="warm")
    assert first.engine == "warm" and warm.idle_servers()
    for pid in warm.idle_servers():  # killed (the OOM killer, a learner's kill -9): found dead
        os.kill(pid, signal.SIGKILL)
    again = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[1], show=False, cwd=ROOT, engine="warm")
    assert again.logs == first.logs and again.engine == "warm"


@pytest.mark.slow
@needs_linux
def test_variables_read_at_import_reach_warm_ranks():
    """TORCH_DISTRIBUTED_DEBUG is read by `import torch.distributed`: a job that sets it runs on a
    server started with it (the plain one stays in the pool for the other jobs)."""
    script = f"{SCRIPTS}/debug_level.py"
    for level in ("OFF", "DETAIL", "INFO", "OFF", "DETAIL"):
        env = {} if level == "OFF" else {"TORCH_DISTRIBUTED_DEBUG": level}
        r = torchrun(script, nproc=2, env=env, show=False, cwd=ROOT, engine="warm", timeout=300)
        assert r.logs == [f"{level}\n"] * 2
    assert len(warm.idle_servers()) == 3  # one per set of start-up variables


@pytest.mark.slow
@needs_linux
def test_warm_up_starts_the_server_that_the_next_launch_uses(monkeypatch):
    monkeypatch.delenv("COURSE_LAUNCHER", raising=False)
    warm.close_servers()
    warm_up()  # returns at once; the server imports torch in the background
    (server,) = warm.idle_servers()
    r = torchrun(f"{SCRIPTS}/two_ranks.py", nproc=2, args=[1], show=False, cwd=ROOT)
    assert r.engine == "warm" and warm.idle_servers() == [server]
    warm_up()  # a server is waiting already: nothing more is started
    assert warm.idle_servers() == [server]
    monkeypatch.setenv("COURSE_LAUNCHER", "torchrun")
    warm.close_servers()
    warm_up()
    assert warm.idle_servers() == []


@pytest.mark.slow
@needs_linux
def test_warm_up_imports_reach_the_ranks_through_their_own_server(tmp_path, monkeypatch):
    """warm_up(imports=...) makes the server import more modules, which its ranks then have before their
    first line; the setting is kept in the environment, so that later launches find that server (a
    server without them is another one)."""
    monkeypatch.setenv(WARM_IMPORTS_VAR, "")  # so that the test's end removes what warm_up sets
    monkeypatch.delenv(WARM_IMPORTS_VAR)
    monkeypatch.delenv("COURSE_LAUNCHER", raising=False)
    (tmp_path / "has.py").write_text("import sys\nprint('colorsys' in sys.modules)\n")
    plain = torchrun("has.py", nproc=2, show=False, cwd=tmp_path, engine="warm", timeout=300)
    assert plain.logs == ["False\n"] * 2
    warm_up(imports=["colorsys"])  # a module nothing else imports
    assert os.environ[WARM_IMPORTS_VAR] == "colorsys"
    warmed = torchrun("has.py", nproc=2, show=False, cwd=tmp_path, engine="warm", timeout=300)
    assert warmed.logs == ["True\n"] * 2
    with pytest.raises(ValueError, match="list of module names"):
        warm_up(imports="colorsys")  # a string, not a list of names
    with pytest.raises(ValueError, match="list of module names"):
        warm_up(imports=["a,b"])


@pytest.mark.slow
@needs_linux
def test_the_timeout_covers_the_start(tmp_path):
    """A job whose ranks are slow to start (here: a new warm server must import torch first) still
    ends at its timeout, counted from the call, with nothing left running."""
    import time
    import uuid

    from launch_support import tagged_processes

    from course_utils.launch import LaunchTimeout, processes

    tag = uuid.uuid4().hex
    limit = 1.0
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:  # a start-up variable never seen: a new server
        torchrun(f"{SCRIPTS}/hang.py", nproc=2, timeout=limit, show=False, cwd=ROOT, engine="warm",
                 env={"HANG_PID_DIR": tmp_path, "LAUNCH_TEST_TAG": tag, "TORCH_TEST_FRESH": tag})
    took = time.monotonic() - t0
    assert took < limit + processes.GRACE_S + 1.5, took
    assert "did not finish within its timeout of 1 s" in str(info.value)
    assert tagged_processes(tag) == []
