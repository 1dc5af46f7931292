"""Set-up (`make setup`, and the first `make lab` / `make test`) interrupted at any moment: the next run
finds the half-made venv, says so, makes it again and ends with a working one.

Each test fills a venv of its own in a temporary folder (never the course's .venv) through the real
`tasks.py setup`, with a tiny course: a wheelhouse of one generated package of 3,000 files and a
project whose build backend lives in its folder (so the editable install needs no download either).
The first run is slowed while pip unpacks files, and interrupted (Ctrl-C to its process group, or
SIGKILL) in each phase where a learner's Ctrl-C lands: about 1 s in (while `venv` installs pip), and while
pip installs the packages (about 20 s into a real set-up: here, as soon as pip has begun unpacking)."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from course_utils import ROOT

sys.path.insert(0, str(ROOT))
import tasks  # noqa: E402

FILES = 3000  # files in the generated package: pip unpacks them one by one


def make_wheel(folder: Path, name: str, version: str = "1.0", nfiles: int = FILES) -> Path:
    """A pure-Python wheel of `nfiles` small data files."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        def add(arc: str, data: bytes) -> None:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")

        add(f"{name}/__init__.py", b"")
        for i in range(nfiles):
            add(f"{name}/data/f{i}.txt", b"x" * 200)
        add(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


# A build backend in the project's own folder: an editable install of the project with no setuptools.
BACKEND = textwrap.dedent('''
    import base64, hashlib, os, zipfile

    NAME, VERSION = "tinycourse", "0.1"

    def _wheel(folder, files):
        name = f"{NAME}-{VERSION}-py3-none-any.whl"
        info, record = f"{NAME}-{VERSION}.dist-info", []
        files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
                 f"{info}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
        with zipfile.ZipFile(os.path.join(folder, name), "w") as z:
            for arc, text in files.items():
                data = text.encode()
                z.writestr(arc, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append(f"{arc},sha256={digest},{len(data)}")
            z.writestr(f"{info}/RECORD", "\\n".join([*record, f"{info}/RECORD,,"]) + "\\n")
        return name

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        return _wheel(wheel_directory, {f"{NAME}.pth": os.path.dirname(os.path.abspath(__file__)) + "\\n"})

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        return _wheel(wheel_directory, {})

    def build_sdist(sdist_directory, config_settings=None):
        raise NotImplementedError
''')

# In pip's processes that install the requirements (not the one that installs pip into the new venv):
# every unpacked file takes SLOW_PIP_S more (10 ms: 30 s for the package), so that the install lasts
# long enough to be interrupted, or to be waited for.
SLOW_PIP = textwrap.dedent('''
    import os, sys
    if "-r" in sys.argv:
        import shutil, time
        _copy, _delay = shutil.copyfileobj, float(os.environ.get("SLOW_PIP_S", "0.01"))
        def _slow(*a, **k):
            time.sleep(_delay)
            return _copy(*a, **k)
        shutil.copyfileobj = _slow
''')

DRIVER = textwrap.dedent('''
    import sys
    from pathlib import Path
    course, project, venv = sys.argv[1:4]
    sys.path.insert(0, course)
    import tasks
    tasks.ROOT, tasks.VENV = Path(project), Path(venv)
    tasks.REQUIREMENTS = Path(project) / "requirements.txt"
    sys.exit(tasks.main(["setup"]))
''')


@pytest.fixture
def tiny_course(tmp_path):
    """(a function that runs `tasks.py setup` on the tiny course, the venv's path)."""
    project, wheels, slow = tmp_path / "course", tmp_path / "wheelhouse", tmp_path / "slow"
    for folder in (project, wheels, slow):
        folder.mkdir()
    make_wheel(wheels, "coursedata")
    (project / "requirements.txt").write_text("coursedata==1.0\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "tinycourse"\nversion = "0.1"\n')
    (project / "backend.py").write_text(BACKEND)
    (project / "tinycourse.py").write_text("")  # what the editable install puts on the path
    (slow / "sitecustomize.py").write_text(SLOW_PIP)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    venv = tmp_path / "venv"

    def setup(slowly: float = 0.0, **popen) -> subprocess.Popen:
        """`slowly`: seconds added to each file pip unpacks (0: full speed)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
        env.update(COURSE_WHEELHOUSE=str(wheels), PIP_NO_CACHE_DIR="1", PIP_CONFIG_FILE=os.devnull)
        if slowly:
            env.update(PYTHONPATH=str(slow), SLOW_PIP_S=str(slowly))
        return subprocess.Popen([sys.executable, str(driver), str(ROOT), str(project), str(venv)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)

    return setup, venv


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def _complete(venv: Path) -> bool:
    """The venv works: its Python runs, with pip, and the package is whole (every file unpacked)."""
    code = (f"import os, pip, coursedata, tinycourse; d = os.path.join(os.path.dirname(coursedata.__file__), 'data');"
            f"assert len(os.listdir(d)) == {FILES}")
    return subprocess.run([str(tasks.venv_python(venv)), "-c", code], capture_output=True, timeout=60).returncode == 0


# (seconds, or the phase, after which the set-up is interrupted; the signal). "installing": pip has
# unpacked the first files of the packages (1 s after it said "Installing collected packages")
CASES = [(1.0, signal.SIGINT), ("installing", signal.SIGINT), ("installing", signal.SIGKILL)]


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="interrupts a process group")
@pytest.mark.parametrize(("after", "sig"), CASES,
                         ids=[f"{a:g}s-{s.name}" if isinstance(a, float) else f"{a}-{s.name}" for a, s in CASES])
def test_an_interrupted_setup_is_made_again_and_says_so(tiny_course, after, sig):
    setup, venv = tiny_course
    first = setup(slowly=0.01, start_new_session=True)
    start = time.monotonic()
    log = venv / "pip-install.log"
    # 1 s: `venv` is still installing pip; "installing": pip is unpacking the packages
    def ready() -> bool:
        if after != "installing":
            return time.monotonic() - start >= after
        return "Installing collected packages" in (log.read_text(errors="replace") if log.exists() else "")

    while not ready():
        assert first.poll() is None and time.monotonic() - start < 240, "the set-up ended before the interrupt"
        time.sleep(0.05)
    if after == "installing":
        time.sleep(1.0)  # some files unpacked, most not (30 s in all)
    assert log.exists() == (after == "installing"), "interrupted in another phase than meant"
    os.killpg(first.pid, sig)  # Ctrl-C in a terminal reaches the whole group; SIGKILL: nothing can clean up
    code, out = _finish(first, 120)
    assert code != 0 and not _complete(venv)
    if sig == signal.SIGINT:  # a Ctrl-C is answered in one line, not with a traceback
        assert "Traceback" not in out and "interrupted" in out, out

    code, out = _finish(setup())  # the next `make lab` / `make setup`
    assert code == 0, out
    assert "was left incomplete" in out and "again" in out, out
    assert _complete(venv)
    assert (venv / ".course-stamp").read_text().strip() == _stamp(venv)

    code, out = _finish(setup())  # and after that: ready at once
    assert code == 0 and "Installing" not in out and "incomplete" not in out, out


def _stamp(venv: Path) -> str:
    h = hashlib.sha256()
    project = venv.parent / "course"
    for f in (project / "requirements.txt", project / "pyproject.toml"):
        h.update(f.read_bytes())
    return h.hexdigest()


# ----------------------------------------------- without processes: what may be removed, and what not


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """tasks.py pointed at a .venv in tmp_path; every subprocess.run recorded and answered with success
    (a `-m venv` makes the folder), `import pip` in a venv answered as its `has_pip` file says."""
    monkeypatch.setattr(tasks, "VENV", tmp_path / ".venv")
    monkeypatch.setattr(tasks, "WHEELHOUSE", tmp_path / "wheelhouse")
    monkeypatch.delenv("COURSE_WHEELHOUSE", raising=False)
    calls = []

    def run(cmd, **kw):
        calls.append(list(cmd))
        if cmd[1:3] == ["-m", "venv"]:
            python = tasks.venv_python(Path(cmd[3]))
            python.parent.mkdir(parents=True, exist_ok=True)
            python.write_text("")
            (Path(cmd[3]) / "pyvenv.cfg").write_text("home = /usr/bin\n")
            (Path(cmd[3]) / "has_pip").write_text("")
        if cmd[1:3] == ["-c", "import pip"]:
            has = (Path(cmd[0]).parent.parent / "has_pip").exists()
            return subprocess.CompletedProcess(cmd, 0 if has else 1)
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_a_folder_that_is_not_a_venv_is_never_removed(scratch, capsys):
    """.venv holding something else (a learner's own files, no pyvenv.cfg): set-up stops and says so."""
    tasks.VENV.mkdir()
    (tasks.VENV / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        tasks.ensure_venv()
    assert (tasks.VENV / "notes.txt").read_text() == "mine"
    assert "not a Python venv" in capsys.readouterr().err


def test_a_venv_without_pip_is_made_again(scratch, capsys):
    """The state an interruption in the first seconds leaves: a Python, no pip, no stamp."""
    tasks.venv_python(tasks.VENV).parent.mkdir(parents=True)
    tasks.venv_python(tasks.VENV).write_text("")
    (tasks.VENV / "pyvenv.cfg").write_text("home = /usr/bin\n")
    tasks.ensure_venv()
    out = capsys.readouterr().out
    assert "was left incomplete" in out
    assert any(cmd[1:3] == ["-m", "venv"] for cmd in scratch)
    assert (tasks.VENV / ".course-stamp").exists() and not (tasks.VENV / tasks.SETUP_MARK).exists()


def test_an_update_of_a_complete_venv_is_made_in_place(scratch, capsys):
    """A complete venv whose requirements changed (its stamp differs) is updated, not made again."""
    tasks.ensure_venv()
    (tasks.VENV / ".course-stamp").write_text("an older requirements.txt\n")
    scratch.clear()
    tasks.ensure_venv()
    assert not any(cmd[1:3] == ["-m", "venv"] for cmd in scratch)
    assert "incomplete" not in capsys.readouterr().out
    assert (tasks.VENV / ".course-stamp").read_text().strip() == tasks.stamp_value()


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="locks a file with fcntl")
def test_two_setups_at_once_do_not_undo_each_other(tiny_course):
    """`make lab` typed in two terminals before .venv exists: the second waits for the first (and says
    so) instead of taking the first one's venv, half-made, for an interrupted one and removing it."""
    setup, venv = tiny_course
    first = setup(slowly=0.004)  # 12 s of unpacking: time for the second to start
    log = venv / "pip-install.log"
    end = time.monotonic() + 240
    while not log.exists() and time.monotonic() < end:
        time.sleep(0.05)
    second = setup()
    (code1, out1), (code2, out2) = _finish(first), _finish(second)
    assert (code1, code2) == (0, 0), out1 + out2
    assert "waiting" in out2 and "incomplete" not in out2, out2
    assert _complete(venv)


def test_a_full_disk_during_setup_says_so(tmp_path):
    log = "Installing collected packages: torch\nERROR: Could not install packages due to an OSError: " \
          "[Errno 28] No space left on device\n"
    msg = tasks._explain_pip_failure(log)
    assert "no space left" in msg.lower() and "GB" in msg and "again" in msg


def test_a_link_to_a_missing_venv_is_named(scratch, tmp_path, capsys):
    tasks.VENV.symlink_to(tmp_path / "gone")
    with pytest.raises(SystemExit):
        tasks.ensure_venv()
    err = capsys.readouterr().err
    assert "link" in err and "gone" in err


def test_interrupted_after_the_packages_only_the_last_steps_are_done_again(scratch, monkeypatch, capsys):
    """Ctrl-C while the font cache is built (after pip has installed everything): the next run does not
    install the packages again (minutes for PyTorch), it finishes."""
    def interrupted(py, venv):
        raise KeyboardInterrupt

    monkeypatch.setattr(tasks, "_build_font_cache", interrupted)
    with pytest.raises(SystemExit) as info:
        tasks.ensure_venv()
    assert info.value.code == 130 and "Set-up interrupted" in capsys.readouterr().err
    monkeypatch.setattr(tasks, "_build_font_cache", lambda py, venv: None)
    scratch.clear()
    tasks.ensure_venv()
    assert not any(cmd[1:3] in (["-m", "venv"], ["-m", "pip"]) for cmd in scratch), scratch
    assert "finishing a set-up" in capsys.readouterr().out
    assert (tasks.VENV / ".course-stamp").read_text().strip() == tasks.stamp_value()
    assert not (tasks.VENV / tasks.SETUP_MARK).exists()


def test_a_read_only_course_folder_says_so_in_one_sentence(scratch, monkeypatch, capsys):
    """The course folder mounted read-only: one clear sentence, no traceback."""
    import errno

    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".setup-lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(SystemExit) as info:
        tasks.ensure_venv()
    err = capsys.readouterr().err
    assert info.value.code == 2 and "read-only" in err and "copy it somewhere you can write" in err, err
    assert "Traceback" not in err and err.count("\n") == 1


_PIP_FAILED = """Collecting broken-package==1.0
  error: subprocess-exited-with-error

  × python setup.py egg_info did not run successfully.
  │ exit code: 1
  ╰─> [1 lines of output]
      ModuleNotFoundError: No module named 'distutils'
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed
See above for output.
hint: See above for details.
"""


def test_a_failed_install_points_at_the_log_and_is_not_called_interrupted_next_time(scratch, monkeypatch, capsys):
    answered = subprocess.run  # the scratch fixture's: success for everything

    def pip_fails(cmd, **kw):
        if "install" in cmd and "-r" in cmd:
            kw["stdout"].write(_PIP_FAILED)
            return subprocess.CompletedProcess(cmd, 1)
        return answered(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", pip_fails)
    with pytest.raises(SystemExit):
        tasks.ensure_venv()
    err = capsys.readouterr().err
    assert "pip-install.log" in err and "See above" not in err and "hint:" not in err, err
    assert "ModuleNotFoundError: No module named 'distutils'" in err and "lines of output" not in err, err
    monkeypatch.setattr(subprocess, "run", answered)
    tasks.ensure_venv()
    out = capsys.readouterr().out
    assert "was left incomplete" in out and "failed" in out and "interrupted" not in out, out
