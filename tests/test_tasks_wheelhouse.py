"""The offline install (README, "Offline install for a workshop room"): `make wheelhouse` fills
wheelhouse/, setup then installs from it alone, and `make check-wheelhouse` proves that in a fresh venv
where nothing else can supply a package. Everything here runs pip nowhere: subprocess is replaced."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import ROOT

sys.path.insert(0, str(ROOT))
import tasks  # noqa: E402


def _done(cmd, stdout=""):
    return subprocess.CompletedProcess(cmd, 0, stdout=stdout)


@pytest.fixture
def course(tmp_path, monkeypatch):
    """tasks.py pointed at a .venv and a wheelhouse/ in tmp_path (neither exists yet); every
    subprocess.run recorded, and answered with success."""
    monkeypatch.setattr(tasks, "VENV", tmp_path / ".venv")
    monkeypatch.setattr(tasks, "WHEELHOUSE", tmp_path / "wheelhouse")
    monkeypatch.delenv("COURSE_WHEELHOUSE", raising=False)
    calls = []

    def run(cmd, **kw):
        calls.append((list(cmd), kw))
        if cmd[1:3] == ["-m", "venv"]:
            Path(cmd[3]).mkdir(parents=True, exist_ok=True)
        return _done(cmd)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def _pip_installs(calls):
    return [cmd for cmd, _ in calls if cmd[1:4] == ["-m", "pip", "install"]]


def test_setup_installs_from_the_wheelhouse_alone_and_says_so(course, capsys):
    tasks.WHEELHOUSE.mkdir()
    tasks.ensure_venv()
    installs = _pip_installs(course)
    assert len(installs) == 2
    for cmd in installs:
        i = cmd.index("--no-index")
        assert cmd[i + 1:i + 3] == ["--find-links", str(tasks.WHEELHOUSE)]
    out = capsys.readouterr().out
    assert "from " in out and "alone, no package index" in out


def test_without_a_wheelhouse_setup_uses_the_index_as_before(course, capsys):
    tasks.ensure_venv()
    installs = _pip_installs(course)
    assert len(installs) == 2 and not any("--no-index" in cmd or "--find-links" in cmd for cmd in installs)
    assert "no package index" not in capsys.readouterr().out


def test_other_venvs_ignore_the_wheelhouse(course, tmp_path):
    """test-pythons' .venv-3.X: a wheelhouse holds the wheels of one Python only."""
    tasks.WHEELHOUSE.mkdir()
    tasks.ensure_venv(venv=tmp_path / ".venv-3.13")
    assert not any("--no-index" in cmd for cmd in _pip_installs(course))


def test_course_wheelhouse_names_another_folder(course, tmp_path, monkeypatch):
    other = tmp_path / "wheelhouse-macos-arm64"
    other.mkdir()
    monkeypatch.setenv("COURSE_WHEELHOUSE", str(other))
    tasks.ensure_venv()
    assert all(cmd[cmd.index("--find-links") + 1] == str(other) for cmd in _pip_installs(course))


def test_a_course_wheelhouse_that_is_not_there_stops_with_one_line(course, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_WHEELHOUSE", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as exc:
        tasks.ensure_venv()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: COURSE_WHEELHOUSE names") and err.count("\n") == 1


def test_a_wheel_missing_from_the_wheelhouse_is_named(tmp_path):
    log = ("ERROR: Could not find a version that satisfies the requirement torch==2.14.1 (from versions: none)\n"
           "ERROR: No matching distribution found for torch==2.14.1\n")
    msg = tasks._explain_pip_failure(log, tmp_path)
    assert "torch==2.14.1" in msg and "make wheelhouse" in msg and "\n" not in msg
    assert "cannot reach a package index" in tasks._explain_pip_failure(log)


def test_pip_alone_env_leaves_pip_no_other_source(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/somewhere/wheels")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://example.invalid/simple")
    env = tasks.pip_alone_env()
    assert [k for k in env if k.upper().startswith("PIP_")] == ["PIP_CONFIG_FILE"]
    assert env["PIP_CONFIG_FILE"] == os.devnull
    assert env["PATH"] == os.environ["PATH"]


def test_wheelhouse_resolves_the_requirements_into_a_partial_folder_first(course, tmp_path, monkeypatch, capsys):
    py = tasks.venv_python(tasks.VENV)
    py.parent.mkdir(parents=True)
    py.write_text("")  # .venv's python: its pip makes the wheelhouse
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tasks, "_scratch", lambda prefix: (scratch, dict(os.environ)))
    seen = {}

    def run(cmd, **kw):
        if "-c" in cmd:
            return _done(cmd, "Python 3.11, linux-x86_64")
        assert cmd[:4] == [str(py), "-m", "pip", "wheel"]
        assert cmd[cmd.index("-r") + 1] == str(tasks.REQUIREMENTS)
        out = Path(cmd[cmd.index("--wheel-dir") + 1])
        seen["dir"], seen["target_existed"] = out, tasks.WHEELHOUSE.exists()
        (out / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 1000)
        (out / "b-2.0-py3-none-any.whl").write_bytes(b"y" * 2000)
        return _done(cmd)

    monkeypatch.setattr(subprocess, "run", run)
    assert tasks.cmd_wheelhouse([]) == 0
    assert seen["dir"].name == "wheelhouse.partial" and not seen["target_existed"]
    assert not seen["dir"].exists() and not scratch.exists()
    assert sorted(p.name for p in tasks.WHEELHOUSE.iterdir()) == [
        "a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl", "requirements.txt"]
    assert (tasks.WHEELHOUSE / "requirements.txt").read_text() == tasks.REQUIREMENTS.read_text()
    out = capsys.readouterr().out
    assert re.search(r"2 wheels, 0 MB, for Python 3\.11, linux-x86_64", out), out


def test_check_wheelhouse_installs_with_no_other_source_then_runs_the_doctor(course, tmp_path, monkeypatch, capsys):
    tasks.WHEELHOUSE.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", "/somewhere/wheels")
    monkeypatch.setattr(tasks, "_scratch", lambda prefix: (scratch, dict(os.environ)))
    got = {}

    def ensure_venv(**kw):
        got.update(kw)
        return tasks.venv_python(kw["venv"])

    monkeypatch.setattr(tasks, "ensure_venv", ensure_venv)
    for doctor, rc in (("OK    python  Python 3.11\nWARN  graphviz  `dot` not found\n", 0),
                       ("OK    python  Python 3.11\nFAIL  torch  not installed\n", 1)):
        scratch.mkdir(exist_ok=True)
        monkeypatch.setattr(subprocess, "run", lambda cmd, out=doctor, **kw: _done(cmd, out.encode()))
        assert tasks.cmd_check_wheelhouse([]) == rc
        assert got["wheels"] == tasks.WHEELHOUSE and got["venv"].parent == scratch
        assert [k for k in got["pip_env"] if k.upper().startswith("PIP_")] == ["PIP_CONFIG_FILE"]
        assert got["pip_env"]["PIP_CONFIG_FILE"] == os.devnull
        assert not scratch.exists()
    out = capsys.readouterr().out
    assert "check-wheelhouse: ok" in out and "check-wheelhouse: FAILED" in out


def test_check_wheelhouse_without_a_wheelhouse_says_what_to_run(course, capsys):
    with pytest.raises(SystemExit):
        tasks.cmd_check_wheelhouse([])
    assert "make wheelhouse" in capsys.readouterr().err


def test_lab_records_progress_and_the_tests_do_not(monkeypatch):
    from tools import lanes

    envs, commands = [], []
    monkeypatch.setattr(tasks, "ensure_venv", lambda *a, **k: Path("python"))
    monkeypatch.setattr(tasks, "run_foreground",
                        lambda args, **kw: commands.append(args) or envs.append(kw["env"]) or 0)
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    tasks.cmd_lab(["--no-browser"])
    tasks.cmd_test([])
    tasks.cmd_test_spawn([])
    assert envs[0]["COURSE_PROGRESS"] == "1"
    assert [c[1:4] for c in commands[1:]] == [["-m", "tools.lanes", "test"], ["-m", "tools.lanes", "test-spawn"]]
    assert {lanes.environment(lane, {})["COURSE_PROGRESS"] for lane in lanes.LANES.values()} == {"0"}
    monkeypatch.setenv("COURSE_PROGRESS", "0")  # a learner's (or the browser lane's) explicit 0 wins
    tasks.cmd_lab(["--no-browser"])
    assert envs[-1]["COURSE_PROGRESS"] == "0"


def test_make_targets_and_git_ignore():
    mk = (ROOT / "Makefile").read_text()
    for target in ("wheelhouse", "check-wheelhouse"):
        assert re.search(rf"^{target}:\n\t@\$\(PYTHON\) tasks.py {target}$", mk, re.M), target
        assert target in tasks.COMMANDS
    assert "check-wheelhouse" not in re.search(r"^test:.*\n(\t.*\n)*", mk, re.M).group(0)
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {"/wheelhouse*/", "/.wheelhouse-*/", "/.check-wheelhouse-*/"} <= set(ignored)


def test_every_venv_shows_slides_with_local_fonts(course):
    """jupyterlab-rise's default reveal.js theme loads Google Fonts; the course's venvs set "white"."""
    import json

    overrides = tasks.VENV / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    tasks.ensure_venv()
    assert json.loads(overrides.read_text()) == {"jupyterlab-rise:plugin": {"theme": "white"}}
    tasks.venv_python(tasks.VENV).parent.mkdir(parents=True, exist_ok=True)
    tasks.venv_python(tasks.VENV).write_text("")
    installs = len(_pip_installs(course))
    overrides.write_text(json.dumps({"jupyterlab-rise:plugin": {"theme": "black", "slideNumber": True},
                                     "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}))
    tasks.ensure_venv()  # current now: nothing installed, the setting restored, the rest kept
    assert len(_pip_installs(course)) == installs
    assert json.loads(overrides.read_text()) == {
        "jupyterlab-rise:plugin": {"theme": "white", "slideNumber": True},
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}
