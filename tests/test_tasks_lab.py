"""`make lab` and `make lab-zh` in a terminal (a pseudo-terminal here), as a learner runs them: one Ctrl-C
reaches JupyterLab alone, which asks "Shut down this Jupyter server (y/[n])?" and goes on when the answer
is no, as plain `jupyter lab` does; neither the wrapper (tasks.py) nor `make` stops or prints a traceback.
A taken port is said before the lab moves to another one. Each lab runs with a configuration folder of
its own (no browser opened, a free port), from the course's own Makefile."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import urllib.request

import pytest

from course_utils import ROOT

pexpect = pytest.importorskip("pexpect")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.name != "posix" or not shutil.which("make"), reason="a POSIX terminal and make"),
]

URL = re.compile(r"http://127\.0\.0\.1:(\d+)/lab\?token=(\w+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def _lab(target: str, tmp_path, port: int):
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "jupyter_server_config.json").write_text('{"ServerApp": {"open_browser": false}}')
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_PORT": str(port), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "COURSE_PROGRESS": "0"}
    env.pop("JUPYTER_TOKEN", None)
    return pexpect.spawn("make", [target], cwd=str(ROOT), env=env, encoding="utf-8", timeout=180,
                         dimensions=(40, 200))


@pytest.mark.parametrize("target", ["lab", "lab-zh"])
def test_one_ctrl_c_asks_the_lab_and_no_goes_on(target, tmp_path):
    lab = _lab(target, tmp_path, _free_port())
    try:
        lab.expect(URL)
        port, token = int(lab.match.group(1)), lab.match.group(2)
        time.sleep(1)
        lab.sendintr()  # Ctrl-C
        lab.expect(r"Shut down this Jupyter server \(y/\[n\]\)\? ", timeout=60)
        lab.sendline("n")
        lab.expect("resuming operation", timeout=60)
        time.sleep(1)
        assert lab.isalive() and _answers(port, token)  # the lab and its wrappers go on
        lab.sendintr()
        lab.expect(r"Shut down this Jupyter server \(y/\[n\]\)\? ", timeout=60)
        lab.sendline("y")
        lab.expect(pexpect.EOF, timeout=120)
    finally:
        output = lab.before if isinstance(lab.before, str) else ""
        lab.close(force=True)
    assert lab.exitstatus == 0 and lab.signalstatus is None, (lab.exitstatus, lab.signalstatus, output)
    assert "Traceback" not in output and "make: ***" not in output and "Interrupt" not in output, output
    assert not _answers(port, token)


def test_a_taken_port_is_said_before_the_lab_moves(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lab = _lab("lab", tmp_path, port)
        try:
            lab.expect(f"Note: port {port} is taken")
            lab.expect(URL)
            assert int(lab.match.group(1)) != port
            lab.sendintr()
            lab.expect(r"Shut down this Jupyter server \(y/\[n\]\)\? ", timeout=60)
            lab.sendintr()  # twice: stop at once, as plain jupyter lab does
            lab.expect(pexpect.EOF, timeout=120)
        finally:
            lab.close(force=True)
    assert lab.exitstatus == 0, (lab.exitstatus, lab.signalstatus)


def test_ctrl_z_stops_the_whole_job_and_fg_resumes_it(tmp_path):
    """With the lab in a process group of its own, Ctrl-Z must still stop `make lab` as one job of the
    shell, and `fg` resume it (the wrapper stops itself and hands the terminal back and forth)."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text('{"ServerApp": {"open_browser": false}}')
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_PORT": str(_free_port()), "PS1": "PROMPT$ ", "COURSE_PROGRESS": "0"}
    env.pop("JUPYTER_TOKEN", None)
    shell = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], cwd=str(ROOT), env=env, encoding="utf-8",
                          timeout=180, dimensions=(40, 200))
    try:
        shell.expect(r"PROMPT\$ ")
        shell.sendline("make lab")
        shell.expect(URL)
        port, token = int(shell.match.group(1)), shell.match.group(2)
        time.sleep(1)
        shell.sendcontrol("z")
        shell.expect(r"Stopped\s+make lab", timeout=60)
        shell.expect(r"PROMPT\$ ")
        shell.sendline("fg")
        time.sleep(2)
        assert _answers(port, token)
        shell.sendintr()
        shell.expect(r"Shut down this Jupyter server \(y/\[n\]\)\? ", timeout=60)
        shell.sendline("y")
        shell.expect(r"PROMPT\$ ", timeout=120)
        shell.sendline("echo status=$?")
        shell.expect(r"status=(\d+)")
        assert shell.match.group(1) == "0"
    finally:
        shell.sendline("exit")
        shell.close(force=True)


def test_ctrl_c_on_the_tests_reaches_pytest_alone(tmp_path):
    """`python tasks.py test` (what `make test` runs): Ctrl-C goes to pytest, which stops and prints its
    summary as it does when run by hand; the wrapper neither kills it mid-way nor prints a traceback."""
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_waits():\n    time.sleep(120)\n")
    run = pexpect.spawn("python3", ["tasks.py", "test", str(slow)], cwd=str(ROOT), encoding="utf-8", timeout=180,
                        env={**os.environ, "COURSE_PROGRESS": "0"}, dimensions=(40, 200))
    try:
        run.expect(r"\[1 item\]", timeout=180)
        time.sleep(2)
        run.sendintr()
        run.expect(pexpect.EOF, timeout=120)
    finally:
        output = run.before if isinstance(run.before, str) else ""
        run.close(force=True)
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # (pytest's colours)
    assert "KeyboardInterrupt" in output and "no tests ran in" in output, output  # pytest's own summary
    assert "Traceback" not in output and "tasks.py" not in output, output
    assert run.exitstatus == 2, (run.exitstatus, run.signalstatus)
