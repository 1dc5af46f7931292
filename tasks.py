#!/usr/bin/env python3
"""The course's task runner: the Makefile calls it, and so can anyone without `make`.

    python tasks.py lab          # set up .venv if needed, open JupyterLab on notebooks/
    python tasks.py test [ARGS]  # set up .venv if needed, run the whole test suite
    python tasks.py execute [NB] # re-run notebooks in place in a fresh kernel
    python tasks.py bench [NB]   # time each notebook's execution (median of a few runs)
    python tasks.py test-spawn   # the process-starting notebooks with spawn only (as on Windows/macOS)
    python tasks.py test-pythons # the suite on Python 3.11, 3.12 and 3.13, each in .venv-3.X
    python tasks.py test-gpu     # the GPU lane, in the Python that runs it (no .venv)
    python tasks.py test-slurm   # chapter 04's sbatch file on a real two-node Slurm on this machine
    python tasks.py test-browser # every notebook run and its widgets used in JupyterLab, in headless Chromium
    python tasks.py test-portable [--levels L,...]
                                 # strict nbval of both editions as other CPUs compute (tools/portable.py)
    python tasks.py hub [--ip 0.0.0.0 --learners 30 ...]
                                 # a JupyterHub for a workshop room on this Linux server (as root; --help)
    python tasks.py test-hub     # the room for real: 6 learners, chapters 00-01 at once, the view, the culler
    python tasks.py stress [--script-runs N] [--notebook-runs M] [--only scripts|notebooks] [--script NAME]
                                 # every script N times from a terminal, every notebook M times
    python tasks.py setup        # only create/update .venv
    python tasks.py book         # both editions as one static website in _build/book/, from the stored outputs
    python tasks.py test-book    # the book built, then every page checked in headless Chromium
    python tasks.py wheelhouse   # every pinned package as wheels for this computer, in wheelhouse/
    python tasks.py check-wheelhouse  # a fresh venv from wheelhouse/ alone, then the doctor in it

When wheelhouse/ exists (or $COURSE_WHEELHOUSE names a folder), .venv is installed from it alone,
with no package index: the offline install for a workshop room (README).

Works with any Python 3 to print a clear message; the course itself needs 3.11+.
"""

import contextlib
import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOKS_ZH = ROOT / "notebooks-zh"  # the Chinese edition, built by `python -m tools.translate build`
REQUIREMENTS = ROOT / "requirements.txt"
WHEELHOUSE = ROOT / "wheelhouse"
MIN_PY = (3, 11)
PIP_TIMEOUT = 3600  # seconds for one pip step: PyTorch on a slow connection takes long, a stalled one forever
SETUP_MARK = ".course-setup-incomplete"  # in a venv while set-up fills it: still there means interrupted


def die(msg):
    sys.stderr.write("error: " + msg + "\n")
    sys.exit(2)


def venv_python(venv=None):
    venv = venv or VENV
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def find_base_python():
    """A Python >= 3.11 to build .venv with: this one, or one on PATH."""
    if sys.version_info[:2] >= MIN_PY:
        return sys.executable
    for name in ("python3.13", "python3.12", "python3.11"):
        exe = shutil.which(name)
        if exe:
            return exe
    die(
        "the course needs Python 3.11 or newer, and this is Python %d.%d with no python3.11+ "
        "on PATH. Install Python 3.11 (python.org, your package manager or conda: "
        "`conda env create -f environment.yml`), then run this again." % sys.version_info[:2]
    )


def stamp_value():
    h = hashlib.sha256()
    for f in (REQUIREMENTS, ROOT / "pyproject.toml"):
        h.update(f.read_bytes())
    return h.hexdigest()


def find_wheelhouse():
    """The folder of wheels to install from, with no index: $COURSE_WHEELHOUSE (relative to the
    course folder, or absolute), else wheelhouse/ when it exists; None: install from the index."""
    named = os.environ.get("COURSE_WHEELHOUSE", "").strip()
    if not named:
        return WHEELHOUSE if WHEELHOUSE.is_dir() else None
    wheels = ROOT / Path(named).expanduser()
    if not wheels.is_dir():
        die("COURSE_WHEELHOUSE names %s, which is not a folder; unset it to install from %s."
            % (wheels, "wheelhouse/" if WHEELHOUSE.is_dir() else "a package index"))
    return wheels


def shown_path(path):
    """`path` as the course folder's people see it: relative to it (with a slash for a folder)."""
    try:
        return str(path.relative_to(ROOT)).replace(os.sep, "/") + ("/" if path.is_dir() else "")
    except ValueError:
        return str(path)


def pip_alone_env(base=None):
    """An environment in which pip reads no configuration file and no PIP_* variable: what it
    installs then comes only from the sources on its command line."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.upper().startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip's documented switch: no pip.conf at all
    return env


# pip's lines that say nothing of the cause ("See above for output.", "hint: See above for details.", ...)
_PIP_NOISE = re.compile(r"see above|^\s*(hint|note):|subprocess-exited-with-error|^\s*[|│╰─]+\s*$|"
                        r"lines of output\]|^\s*\[end of output\]",
                        re.IGNORECASE)


def _explain_pip_failure(log_text, wheels=None, log=None):
    """One paragraph on why pip failed, from its log (`log`: where that log is, to point at it)."""
    if re.search(r"No space left on device|\[Errno 28\]", log_text):
        return ("there is no space left on the disk (pip: \"No space left on device\"). The course's packages "
                "need about 7 GB (PyTorch is large): free some space, then run the same command again (set-up "
                "starts over).")
    if wheels is not None:
        missing = re.search(r"No matching distribution found for (\S+)", log_text)
        if missing or re.search(r"Could not find a version", log_text):
            return (
                "could not install the pinned packages from %s alone: it has no wheel of %s for this "
                "computer (its system, processor and Python). Make it on a computer like this one with "
                "`make wheelhouse` (for other platforms, see the README's \"Offline install for a "
                "workshop room\"), or %s to install from a package index."
                % (shown_path(wheels), missing.group(1) if missing else "a pinned package",
                   "unset COURSE_WHEELHOUSE" if os.environ.get("COURSE_WHEELHOUSE", "").strip() else "remove it")
            )
    offline = re.search(
        r"(No matching distribution found|Could not find a version|Failed to establish|"
        r"Temporary failure in name resolution|Network is unreachable|ProxyError|"
        r"Max retries exceeded|Connection refused)",
        log_text,
    )
    if offline:
        return (
            "could not install the pinned packages: pip cannot reach a package index "
            "(or the index lacks a pinned version). Connect to the internet or set "
            "PIP_INDEX_URL to a mirror, then run the same command again."
        )
    lines = [ln.strip() for ln in log_text.strip().splitlines() if ln.strip()]
    last = [ln for ln in lines if not _PIP_NOISE.search(ln)][-3:] or lines[-1:]
    where = (" pip's whole output is in %s." % shown_path(log)) if log is not None else ""
    said = " | ".join(last)
    return "installing the pinned packages failed: " + said + ("" if said.endswith((".", "!", "?")) else ".") + where


def _has_pip(py):
    """Whether the venv's Python runs and can import pip."""
    try:
        r = subprocess.run([str(py), "-c", "import pip"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _remove_venv(venv):
    """Delete a half-made venv (the folder a link points to stays, emptied), but never a folder that is not
    one: no pyvenv.cfg and no set-up mark in it."""
    target = venv.resolve() if venv.is_symlink() else venv
    if not target.is_dir():
        return
    if not ((target / "pyvenv.cfg").exists() or (target / SETUP_MARK).exists() or not any(target.iterdir())):
        die("%s is not a Python venv (no pyvenv.cfg in it), so it is left as it is: move it away (or delete it), "
            "then run this again." % shown_path(venv))
    try:
        shutil.rmtree(str(target))
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        die("could not remove the incomplete %s (%s): delete it by hand, then run this again." % (venv.name, exc))


def _interrupted(venv):
    """Ctrl-C during set-up: one line, not a traceback (the next run makes the venv again)."""
    sys.stderr.write("\nSet-up interrupted: %s is incomplete. The next `make setup` (or `make lab`, `make test`; "
                     "`python tasks.py setup`) makes it again.\n" % venv.name)
    sys.exit(130)


def ensure_venv(quiet=False, venv=None, base=None, wheels=None, pip_env=None):
    """Create a venv (.venv unless `venv` is given, with the Python `base`) and install
    requirements + course_utils into it, unless its stamp says it is current. The packages come from
    the folder `wheels` alone (for .venv, by default: the wheelhouse, when there is one), else from
    the index; `pip_env`: the environment pip runs in (default: this one).

    Any interruption is recovered from: a mark file sits in the venv from the moment set-up starts
    filling it until its stamp is written, so the next run finds a venv that an interrupted set-up
    left (the mark, or a Python without pip), says so, and makes it again from scratch; once pip has
    installed everything, the mark says so, and only the last steps are done again. A complete venv
    whose requirements changed is updated in place. One set-up of a venv at a time (a lock)."""
    venv = venv or VENV
    py = venv_python(venv)
    stamp = venv / ".course-stamp"
    mark = venv / SETUP_MARK
    want = stamp_value()
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want and not mark.exists():
        _build_font_cache(py, venv)
        _write_lab_overrides(venv)
        return py
    base = base or find_base_python()
    if venv.is_symlink() and not venv.exists():
        die("%s is a link to %s, which does not exist: create that folder (or remove the link), then run this "
            "again." % (shown_path(venv), os.readlink(str(venv))))
    try:
        with _setup_lock(venv):
            return _make_venv(venv, py, stamp, mark, want, base, wheels, pip_env)
    except KeyboardInterrupt:
        _interrupted(venv)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        die("cannot write in %s (%s): the course folder is read-only for you; copy it somewhere you can write "
            "(your home folder), then run this again there." % (venv.parent, exc.strerror or exc))


@contextlib.contextmanager
def _setup_lock(venv):
    """One set-up of `venv` at a time (`make lab` typed in two terminals): a second one waits, and says so.
    A lock file beside the venv, released however the process ends; none where files cannot be locked."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    fd = os.open(str(venv.parent / (".%s.setup-lock" % venv.name)), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("Another set-up of %s is running (in another terminal?): waiting for it to finish ..." % venv.name,
                  flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks
            pass
        yield
    finally:
        os.close(fd)


def _make_venv(venv, py, stamp, mark, want, base, wheels, pip_env):
    """ensure_venv's work, under the set-up lock: the venv made again when an interrupted set-up left it."""
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want and not mark.exists():
        return py  # made meanwhile, by the set-up this one waited for
    installed = mark.exists() and mark.read_text().split() == ["installed", want]
    if venv.exists() or venv.is_symlink():
        why = None
        if installed:  # interrupted after pip had installed everything: only the last steps are left
            print("%s: finishing a set-up that was interrupted after its packages were installed ..." % venv.name,
                  flush=True)
            return _finish_venv(venv, py, stamp, mark, want, time.time())
        if mark.exists() and mark.read_text().startswith("failed"):
            why = "its last set-up failed: pip could not install the packages, as it said then"
        elif mark.exists():
            why = "its set-up was interrupted"
        elif not (py.exists() and _has_pip(py)):
            why = "it has no working Python with pip: a set-up interrupted in its first seconds?"
        if why:
            print("%s was left incomplete (%s): making it again from scratch ..." % (venv.name, why),
                  flush=True)
            _remove_venv(venv)
    if not py.exists():
        print("Creating %s with %s ..." % (venv.name, base), flush=True)
        venv.mkdir(parents=True, exist_ok=True)
        mark.write_text("set-up started %s\n" % time.strftime("%Y-%m-%d %H:%M:%S"))
        # (its output kept: a Ctrl-C makes `venv` print a traceback of its own, which says nothing useful)
        r = subprocess.run([base, "-m", "venv", str(venv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        if r.returncode != 0:
            last = [ln for ln in (r.stdout or "").splitlines() if ln.strip()][-1:]
            die("could not create %s (on Debian/Ubuntu: apt-get install python3-venv)%s." % (
                venv.name, ": " + last[0] if last else ""))
    else:
        mark.write_text("update started %s\n" % time.strftime("%Y-%m-%d %H:%M:%S"))
    return _fill_venv(venv, py, stamp, mark, want, wheels, pip_env)


def _fill_venv(venv, py, stamp, mark, want, wheels, pip_env):
    """ensure_venv's second half: the packages, the font cache, the lab's settings, then the stamp."""
    log = venv / "pip-install.log"
    if wheels is None and venv == VENV:  # the README's .venv only: a wheelhouse is for one Python
        wheels = find_wheelhouse()
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    if wheels:
        made_for = wheels / "requirements.txt"  # written by `make wheelhouse`
        if made_for.exists() and made_for.read_bytes() != REQUIREMENTS.read_bytes():
            print("Note: %s was made for another requirements.txt; if a package is missing, run "
                  "`make wheelhouse` again." % shown_path(wheels), flush=True)
    print("Installing the pinned requirements into %s%s (several minutes the first time;"
          " log: %s/pip-install.log) ..." % (
              venv.name, " from %s alone, no package index" % shown_path(wheels) if wheels else "",
              venv.name), flush=True)
    t0 = time.time()
    with open(log, "w") as fh:
        steps = [
            [str(py), "-m", "pip", "install", "--disable-pip-version-check"] + source + ["-r", str(REQUIREMENTS)],
            [str(py), "-m", "pip", "install", "--disable-pip-version-check"] + source + [
             "--no-deps", "--no-build-isolation", "-e", str(ROOT)],
        ]
        for cmd in steps:
            try:
                r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT), env=pip_env,
                                   timeout=PIP_TIMEOUT)
            except subprocess.TimeoutExpired:
                die("pip did not finish within %d minutes (a stalled download?): see %s/pip-install.log, then run "
                    "the same command again (set-up starts over)." % (PIP_TIMEOUT // 60, venv.name))
            if r.returncode != 0:
                fh.flush()
                # not interrupted: said so next time
                mark.write_text("failed %s\n" % time.strftime("%Y-%m-%d %H:%M:%S"))
                die(_explain_pip_failure(log.read_text(errors="replace"), wheels, log))
    mark.write_text("installed %s\n" % want)  # interrupted from here on, the packages need not be made again
    return _finish_venv(venv, py, stamp, mark, want, t0)


def _finish_venv(venv, py, stamp, mark, want, t0):
    """The last steps of set-up, once the packages are installed: the font cache, the lab's settings, the
    stamp (and the mark goes)."""
    _build_font_cache(py, venv)
    _write_lab_overrides(venv)
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text(want + "\n")
    os.replace(str(tmp), str(stamp))  # the stamp first, then the mark goes: never neither
    mark.unlink()
    print("Environment ready in %.0f s." % (time.time() - t0), flush=True)
    return py


def venv_env(venv=None, base=None):
    """The environment every command runs with: matplotlib keeps its font cache inside the venv.

    matplotlib's default cache (~/.cache/matplotlib) is shared by every venv of the user and names
    font files inside the venv that wrote it; from another venv, or once that one is deleted,
    every figure then writes "findfont: Font family ... not found" on stderr."""
    env = dict(os.environ if base is None else base)
    env["MPLCONFIGDIR"] = str((venv or VENV) / "mplconfig")
    return env


def _build_font_cache(py, venv):
    """Build matplotlib's font cache now, so that no notebook prints "building the font cache"."""
    if not list((venv / "mplconfig").glob("fontlist-*.json")):
        subprocess.run([str(py), "-c", "import matplotlib.font_manager"], env=venv_env(venv),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)


# Settings every venv's JupyterLab starts with: its share/jupyter/lab/settings/overrides.json, read by the
# lab and by jupyterlab-rise's slideshow page. reveal.js's theme "simple", RISE's default, loads Google
# Fonts from the internet; "white" uses local fonts, so slides work offline.
LAB_OVERRIDES = {"jupyterlab-rise:plugin": {"theme": "white"}}


def _write_lab_overrides(venv):
    import json

    path = venv / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    try:
        current = json.loads(path.read_text())
    except (OSError, ValueError):
        current = {}
    merged = dict(current) if isinstance(current, dict) else {}
    for plugin, values in LAB_OVERRIDES.items():
        merged[plugin] = dict(merged.get(plugin) or {}, **values)
    if merged != current:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=2) + "\n")


def _terminal():
    """The file descriptor of the terminal this process runs in the foreground of (its stdin), or None: no
    terminal, in the background (`make lab &`), or not POSIX."""
    if os.name != "posix":
        return None
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _give_terminal(fd, pgrp):
    """Make process group `pgrp` the terminal's foreground group (from the background too: SIGTTOU ignored)."""
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgrp)
    except OSError:  # (the group is gone already)
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _exit_code(status):
    """A wait status as an exit code; a signal N as 128 + N, as shells report it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def run_foreground(args, **kw):
    """Run the command `args` (Popen's keywords) as a shell runs one, and return its exit code.

    When this process owns the terminal, the command gets a process group of its own and the terminal
    with it: Ctrl-C and Ctrl-Z reach the command alone, not this wrapper nor `make` above it. (GNU
    make, given Ctrl-C, waits for its command and then reports "Interrupt" and fails, even when the
    command chose to go on, as JupyterLab does: "Shut down this Jupyter server (y/[n])?".) Ctrl-Z stops
    the whole job (`fg` resumes it); SIGINT, SIGTERM or SIGHUP sent to this process go on to the
    command. Without a terminal (or off POSIX), the command shares this process group, which gets any
    Ctrl-C itself: this process ignores Ctrl-C while it waits."""
    tty = _terminal()
    if tty is None:
        proc = subprocess.Popen(args, **kw)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return proc.wait()
        finally:
            signal.signal(signal.SIGINT, old)

    def own_group_and_terminal():  # in the child, before it runs the command
        os.setpgid(0, 0)
        _give_terminal(tty, os.getpgrp())

    proc = subprocess.Popen(args, preexec_fn=own_group_and_terminal, **kw)
    _give_terminal(tty, proc.pid)  # (as shells do: in both, whichever comes first)
    forward = {sig: signal.signal(sig, lambda signum, frame: os.killpg(proc.pid, signum))
               for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            _, status = os.waitpid(proc.pid, os.WUNTRACED)
            if not os.WIFSTOPPED(status):
                proc.returncode = _exit_code(status)
                return proc.returncode
            _give_terminal(tty, os.getpgrp())  # Ctrl-Z: the whole job stops, as in a shell ...
            os.killpg(os.getpgrp(), signal.SIGTSTP)
            _give_terminal(tty, proc.pid)  # ... and `fg` goes on here
            os.killpg(proc.pid, signal.SIGCONT)
    finally:
        for sig, old in forward.items():
            signal.signal(sig, old)
        _give_terminal(tty, os.getpgrp())


def in_venv(args, **kw):
    py = ensure_venv()
    kw["env"] = venv_env(base=kw.get("env"))
    return run_foreground([str(py)] + list(args), cwd=str(ROOT), **kw)


def cmd_setup(argv):
    ensure_venv()
    return 0


def cmd_lab_zh(argv):
    """JupyterLab in Chinese (its language pack) on the Chinese notebooks."""
    # the lab's own settings folder, with its language set (a JUPYTERLAB_SETTINGS_DIR of the caller's is used)
    folder = Path(os.environ.get("JUPYTERLAB_SETTINGS_DIR", "").strip() or ROOT / ".lab-zh" / "settings")
    settings = folder / "@jupyterlab" / "translation-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"locale": "zh_CN"}\n')
    return cmd_lab(["--LabApp.user_settings_dir=" + str(folder)] + list(argv), notebooks=NOTEBOOKS_ZH)


def cmd_lab(argv, notebooks=NOTEBOOKS):
    """JupyterLab on `notebooks` (unless the arguments name a folder)."""
    py = ensure_venv()
    if os.environ.get("JUPYTER_TOKEN", None) == "":
        die("JUPYTER_TOKEN is set but empty; unset it so Jupyter makes a token for you.")
    own_dir = any(a.startswith(("--notebook-dir", "--ServerApp.root_dir")) for a in argv)
    # `jupyter lab`, with a fix to how it stops (course_utils/lab.py)
    args = [str(py), "-m", "course_utils.lab"] + ([] if own_dir else ["--notebook-dir=" + str(notebooks)]) + [
            "--ServerApp.ip=127.0.0.1",
            # offline by design: no news feed, no update check (both are requests to the internet)
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")  # containers and CI run as root; Jupyter refuses that without the flag
    args += list(argv)
    env = venv_env()
    env["COURSE_PROGRESS"] = os.environ.get("COURSE_PROGRESS", "").strip() or "1"  # record checks; an explicit 0 wins
    port = _lab_port(argv)
    if port is not None and not _port_free(port):
        print("Note: port %d is taken (a JupyterLab still running? `jupyter server list` shows them), so this lab "
              "listens on another port: open the address it prints below." % port, flush=True)
    return run_foreground(args, cwd=str(ROOT), env=env)


def _lab_port(argv):
    """The port the lab will ask for: --port / --ServerApp.port in `argv`, else $JUPYTER_PORT, else Jupyter's
    8888 (None: named some other way that we cannot read)."""
    for i, a in enumerate(argv):
        for flag in ("--port", "--ServerApp.port"):
            if a == flag and i + 1 < len(argv):
                a = flag + "=" + argv[i + 1]
            if a.startswith(flag + "="):
                value = a.split("=", 1)[1]
                return int(value) if value.isdigit() else None
    value = os.environ.get("JUPYTER_PORT", "").strip()
    if value:
        return int(value) if value.isdigit() else None
    return 8888


def _port_free(port):
    """Whether 127.0.0.1:`port` can be listened on now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_lane(name, argv, py=None):
    """A test lane of tools/lanes.py (its pytest arguments, environment and system needs), run by `py`
    (default: .venv's Python, set up first)."""
    py = py or ensure_venv()
    venv = Path(str(py)).parent.parent
    return run_foreground([str(py), "-m", "tools.lanes", name] + list(argv), cwd=str(ROOT), env=venv_env(venv))


def lane_lacks(name, py, say=False):
    """Whether this computer lacks a program the lane `name` needs (tools/lanes.py; `say`: print why)."""
    out = None if say else subprocess.DEVNULL
    return subprocess.call([str(py), "-m", "tools.lanes", "--missing", name], cwd=str(ROOT), stderr=out) != 0


def cmd_test(argv):
    """Unit tests + hygiene tests + strict nbval over every notebook, notebooks in parallel."""
    return run_lane("test", argv)


def cmd_test_portable(argv):
    """Strict nbval of both editions at each CPU level this computer can emulate (no vector extensions,
    AVX2, its own, one core): the stored outputs must hold on every learner's computer."""
    ensure_venv()
    return in_venv(["-m", "tools.portable"] + list(argv))


def notebooks_from(argv):
    """The notebooks named, else both editions (the Chinese one rebuilt from the English first)."""
    if argv:
        return [Path(a).resolve() for a in argv]
    from course_utils import inventory  # (read once the course's Python is known to run)

    english = inventory.notebooks("en")
    if NOTEBOOKS_ZH.is_dir() and in_venv(["-m", "tools.translate", "build"]) == 0:
        return english + inventory.notebooks("zh-CN")
    return english


NO_PROGRESS = {"COURSE_PROGRESS": "0"}  # executions and timings record no learner progress


def cmd_execute(argv):
    ensure_venv()
    paths = [str(p) for p in notebooks_from(argv)]
    return in_venv(["-m", "tools.notebook", "execute"] + paths, env=dict(os.environ, **NO_PROGRESS))


def cmd_bench(argv):
    ensure_venv()
    return in_venv(["-m", "tools.notebook", "bench"] + list(argv), env=dict(os.environ, **NO_PROGRESS))


def cmd_slides(argv):
    """Each cell's slide type (RISE) from the notebook's structure: tools/slides.py."""
    return in_venv(["-m", "tools.slides"] + list(argv))


def cmd_guide(argv):
    """The instructor guide's generated parts and answer key, from the exercises: tools/workshop.py."""
    return in_venv(["-m", "tools.workshop"] + list(argv))


def cmd_stress(argv):
    """Every script N times from a terminal, every notebook M times in a fresh kernel; 0 failures allowed
    (tools/stress.py)."""
    ensure_venv()
    return in_venv(["-m", "tools.stress"] + list(argv), env=dict(os.environ, **NO_PROGRESS))


def cmd_test_gpu(argv):
    """The GPU lane (tools/lanes.py), in the Python that runs this: a GPU machine brings its own PyTorch;
    .venv's pins are not installed there."""
    return subprocess.call([sys.executable, "-m", "tools.lanes", "test-gpu"] + list(argv), cwd=str(ROOT))


def cmd_test_spawn(argv):
    """The notebooks that start processes, run as on Windows and macOS: every process starts with
    spawn and fork does not exist (tests/spawn_only/sitecustomize.py). Outputs that name the start
    method differ there, so the run is lax: any error fails, and the tagged cells are compared."""
    return run_lane("test-spawn", argv)


def cmd_test_slurm(argv):
    """Chapter 04's sbatch file, unmodified, on a real Slurm cluster of two emulated nodes on this
    machine (tests/slurm/): needs Debian's `slurm-wlm` and `munge`; run as the user the daemons may
    run as (root in CI)."""
    return run_lane("test-slurm", argv)


def cmd_test_browser(argv):
    """Every notebook in the course's own JupyterLab, in headless Chromium through Playwright: Run All
    as a learner would, then every widget used (tests/browser/). Needs Chromium (`apt-get install
    chromium`); Playwright is in the pinned requirements and drives the system browser."""
    return run_lane("test-browser", argv)


# --- the workshop room: JupyterHub on one server (deploy/hub/, docs/instructor/hub.md) ---------------
HUB = ROOT / "deploy" / "hub"
HUB_REQUIREMENTS = HUB / "requirements.txt"
HUB_STATE = ROOT / ".hub"
NODE_MIN = (20, 19)  # configurable-http-proxy 5.3's commander loads ES modules with require()


def _freeze(py):
    r = subprocess.run([str(py), "-m", "pip", "freeze", "--disable-pip-version-check", "--exclude-editable"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    if r.returncode != 0:
        die("pip freeze failed in %s: %s" % (shown_path(VENV), r.stderr.strip()[-500:]))
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]


def freeze_changes(before, after):
    """What a pip install did to a venv, from `pip freeze` before and after: (the packages added, the
    lines of `before` that changed or went)."""
    return sorted(set(after) - set(before), key=str.lower), sorted(set(before) - set(after), key=str.lower)


def ensure_hub_packages(py):
    """The hub's pins (deploy/hub/requirements.txt) in .venv, where the learners' servers run: installed
    with the current `pip freeze` of .venv as constraints, so pip may add packages but change none; the
    freeze before and after proves it (and a change stops everything)."""
    stamp = VENV / ".hub-stamp"
    want = hashlib.sha256(HUB_REQUIREMENTS.read_bytes() + stamp_value().encode()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want:
        return
    before = _freeze(py)
    constraints = VENV / "hub-constraints.txt"
    constraints.write_text("".join(ln + "\n" for ln in before))
    log = VENV / "pip-hub-install.log"
    print("Installing the hub's packages (%s) into %s, with its current versions as constraints "
          "(log: %s) ..." % (shown_path(HUB_REQUIREMENTS), shown_path(VENV), shown_path(log)), flush=True)
    with open(log, "w") as fh:
        r = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(HUB_REQUIREMENTS),
                            "--constraint", str(constraints)], stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT),
                           timeout=1800)
    text = log.read_text(errors="replace")
    if r.returncode != 0:
        if "conflict" in text.lower() or "ResolutionImpossible" in text:
            die("the hub's packages (%s) need other versions of packages already in %s, and the course's own "
                "versions win: update the hub's pins to ones that fit (log: %s)." % (
                    shown_path(HUB_REQUIREMENTS), shown_path(VENV), shown_path(log)))
        die(_explain_pip_failure(text) + " (log: %s)" % shown_path(log))
    added, changed = freeze_changes(before, _freeze(py))
    if changed:
        die("installing the hub's packages changed %s in %s: %s. Run `make setup` to restore the pinned "
            "versions." % ("a package" if len(changed) == 1 else "packages", shown_path(VENV), ", ".join(changed)))
    print("Added to %s: %s. pip freeze before and after: no installed package changed its version." % (
        shown_path(VENV), ", ".join(added) or "nothing"), flush=True)
    stamp.write_text(want + "\n")


def ensure_proxy():
    """configurable-http-proxy, pinned by deploy/hub/package-lock.json, in deploy/hub/node_modules (`npm ci`)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        die("the hub's proxy needs Node.js %d.%d or newer and npm: on Debian or Ubuntu `apt-get install nodejs "
            "npm` (or nodejs.org), then run this again." % NODE_MIN)
    version = subprocess.run([node, "--version"], stdout=subprocess.PIPE, universal_newlines=True, timeout=60).stdout
    found = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if found < NODE_MIN:
        die("the hub's proxy needs Node.js %d.%d or newer; this is %s." % (NODE_MIN + (version.strip(),)))
    lock = HUB / "package-lock.json"
    stamp = HUB / "node_modules" / ".course-lock"
    want = hashlib.sha256(lock.read_bytes()).hexdigest()
    if (HUB / "node_modules" / ".bin" / "configurable-http-proxy").exists() and stamp.exists() \
            and stamp.read_text().strip() == want:
        return
    print("Installing the hub's proxy from %s (npm ci) ..." % shown_path(lock), flush=True)
    r = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=str(HUB), timeout=900)
    if r.returncode != 0:
        die("`npm ci` failed in %s: npm needs its registry (or a mirror: `npm config set registry URL`)."
            % shown_path(HUB))
    stamp.write_text(want + "\n")


def _git(args, cwd):
    r = subprocess.run(["git"] + list(args), cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else None


def _hub_checks():
    if not sys.platform.startswith("linux"):
        die("the workshop hub runs on a Linux server (one system account per learner).")
    if os.geteuid() != 0:
        die("the workshop hub must run as root: it creates one system account per learner and starts each "
            "learner's server as that account. Run `sudo make hub` (or `sudo python3 tasks.py hub`).")
    missing = [t for t in ("git", "useradd", "groupadd", "userdel") if not shutil.which(t)
               and not Path("/usr/sbin", t).exists()]
    if missing:
        die("the workshop hub needs %s (on Debian or Ubuntu: apt-get install git passwd)." % ", ".join(missing))


def hub_parser():
    import argparse

    p = argparse.ArgumentParser(prog="python tasks.py hub", description=(
        "A JupyterHub for a workshop room on this server (docs/instructor/hub.md). Learners sign in with a "
        "name, their own password and, the first time, the room password; each gets a system account and "
        "a copy of the course from this clone. Ctrl-C stops it (the learners' files stay)."))
    a = p.add_argument
    env = os.environ.get
    a("--ip", default=env("COURSE_HUB_IP", "127.0.0.1"), help="the address to listen on: 0.0.0.0 for every "
      "network of this server (default: $COURSE_HUB_IP, else this machine only)")
    a("--port", type=int, default=int(env("COURSE_HUB_PORT", "8000")), help="default: $COURSE_HUB_PORT, else 8000")
    a("--learners", type=int, default=int(env("COURSE_HUB_LEARNERS", "30")),
      help="how many learners at once, for the threads per kernel (default: $COURSE_HUB_LEARNERS, else 30)")
    a("--instructor", default="instructor", help="the admin's name (signs in with the admin password)")
    a("--room-password", default=os.environ.get("COURSE_HUB_ROOM_PASSWORD", ""),
      help="the password for the board (default: $COURSE_HUB_ROOM_PASSWORD, the last one, or a new one)")
    a("--lang", choices=("en", "zh"), default=None, help="zh: the Chinese notebooks, the view in Chinese")
    a("--cull-after", type=int, default=None, help="stop a server idle for this many seconds (default 3600)")
    a("--ssl-cert", default="")
    a("--ssl-key", default="")
    a("--state", default=str(HUB_STATE), help="the hub's folder: database, passwords, room.json (default .hub/)")
    a("--home-base", default="/home", help="where the learners' homes are made")
    a("--account-prefix", default=None, help="system account = prefix + name (default course-)")
    a("--group", default=None, help="the learners' system group (default course-learners)")
    a("--release", metavar="NAME", help="forget NAME's own password (they take the name again with the room "
                                        "password; their files stay), then exit")
    # for the test lane and unusual machines
    a("--repo", default="", help="the clone learners pull (default: this course folder)")
    a("--branch", default="", help="its branch (default: the one checked out)")
    a("--hub-port", type=int, default=8081)
    a("--proxy-api-port", type=int, default=8001)
    a("--view-port", type=int, default=8090)
    a("--cull-every", type=int, default=0)
    a("--activity-interval", type=int, default=300)
    a("--setup-only", action="store_true", help="install and check everything, write room.json, do not start")
    return p


def cmd_hub(argv):
    """A JupyterHub for a workshop room on this server (see hub_parser and docs/instructor/hub.md)."""
    o = hub_parser().parse_args(argv)
    _hub_checks()
    sys.path.insert(0, str(ROOT))
    from deploy.hub import room as R

    state = Path(o.state).resolve()
    if o.release:
        if R.Claims(state / "claims.json").release(o.release):
            print("%s's own password is forgotten: they sign in again with the room password and a new "
                  "password of their own, and find their files." % o.release)
            return 0
        die("nobody has taken the name %r in %s." % (o.release, state))
    old = R.Room.load(state) if (state / "room.json").exists() else None
    py = ensure_venv()
    ensure_hub_packages(py)
    ensure_proxy()
    repo = Path(o.repo or ROOT).resolve()
    branch = o.branch or _git(["symbolic-ref", "--short", "HEAD"], repo)
    if not branch:
        die("%s has no branch checked out (a detached HEAD): learners pull a branch. `git switch main` there "
            "(or name one with --branch)." % repo)
    git_dirs = [_git(["rev-parse", "--absolute-git-dir"], repo), _git(["rev-parse", "--path-format=absolute",
                                                                       "--git-common-dir"], repo)]
    if not all(git_dirs):
        die("%s is not a git clone: learners' copies are pulled from one." % repo)
    venv = VENV.resolve()
    reach = [(venv, "the course's .venv"), (Path(os.path.realpath(str(venv_python()))), "the .venv's Python"),
             (repo, "the instructor's clone"), (Path(git_dirs[1]), "the clone's git folder"),
             (HUB / "start_server.py", "the hub's start script")]
    for path, what in reach:
        problem = R.reach_problem(path, what)
        if problem:
            die(problem)
    room_password = o.room_password or (old.room_password if old else "") or R.make_password()
    if len(room_password) < R.PASSWORD_MIN:
        die("the room password must have at least %d characters." % R.PASSWORD_MIN)
    admin_password = (old.admin_password if old else "") or secrets_token(R.ADMIN_PASSWORD_MIN)
    if room_password == admin_password:
        die("the room password must not be the admin password.")
    cores = R.cpu_cores()
    room = R.Room(
        state=str(state), root=str(ROOT), venv=str(venv), repo=str(repo), branch=branch, ip=o.ip, port=o.port,
        hub_port=o.hub_port, proxy_api_port=o.proxy_api_port, view_port=o.view_port, learners=o.learners,
        cores=cores, threads=R.threads_per_kernel(cores, o.learners), instructor=o.instructor.lower(),
        room_password=room_password, admin_password=admin_password,
        account_prefix=(o.account_prefix if o.account_prefix is not None
                        else (old.account_prefix if old else R.ACCOUNT_PREFIX)),
        group=o.group if o.group is not None else (old.group if old else R.GROUP),
        home_base=o.home_base, lang=o.lang or (old.lang if old else "en"),
        cull_after_s=o.cull_after or (old.cull_after_s if old else 3600), cull_every_s=o.cull_every,
        activity_interval_s=o.activity_interval, ssl_cert=o.ssl_cert, ssl_key=o.ssl_key,
        safe_directories=sorted({str(repo), str(repo / ".git")} | set(git_dirs)),
    )
    if not R.valid_name(room.instructor):
        die("the instructor's name must be 1 to 23 lower-case letters, digits, - or _, starting with a letter.")
    path = room.save()
    print("The room: %s (learners sign in there)\n"
          "  room password (for the board): %s\n"
          "  instructor: %s, with the admin password in %s (admin_password)\n"
          "  %d learners on %d cores: %d thread%s per kernel; an idle server stops after %d min\n"
          "  learners' copies from %s (%s); the view of the class: %sservices/course-progress/"
          % (room.url, room.room_password, room.instructor, path, room.learners, cores, room.threads,
             "" if room.threads == 1 else "s", room.cull_after_s // 60, repo, branch, room.url), flush=True)
    if room.ip not in ("127.0.0.1", "localhost", "::1") and not room.ssl_cert:
        print("Note: passwords travel in clear over plain HTTP. On a network you do not control, give the hub a "
              "certificate (--ssl-cert, --ssl-key) or put it behind an HTTPS proxy.", flush=True)
    if o.setup_only:
        return 0
    env = venv_env()
    env["COURSE_HUB_STATE"] = str(state)
    env.pop("PYTHONPATH", None)
    os.chdir(str(state))
    cmd = [str(py), "-m", "jupyterhub", "-f", str(HUB / "jupyterhub_config.py")]
    sys.stdout.flush()
    import signal

    # a program started in the background by a shell ignores SIGINT, and its children would too: the hub
    # stops its services and servers with SIGINT
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execve(str(py), cmd, env)


def secrets_token(min_chars):
    import secrets

    token = secrets.token_urlsafe(min_chars)
    return token if len(token) >= min_chars else token + secrets.token_urlsafe(min_chars)


def cmd_test_hub(argv):
    """The workshop room for real (tests/hub/): the hub on localhost, 6 learners (5 through the REST API,
    1 through Chromium's login form), chapters 00 and 01 run in every learner's server at once, isolation,
    the instructor's view, the culler, a restart; everything it started is stopped and its accounts removed."""
    _hub_checks()
    py = ensure_venv()
    ensure_hub_packages(py)
    ensure_proxy()
    if lane_lacks("test-hub", py):
        if shutil.which("apt-get"):
            print("Installing Chromium (apt-get install chromium) for the login through the browser ...", flush=True)
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            subprocess.run(["apt-get", "update", "-qq"], env=env, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"], env=env,
                           timeout=900)
    return run_lane("test-hub", argv, py=py)
BOOK_VENV = ROOT / ".venv-book"
BOOK_REQUIREMENTS = ROOT / "docs" / "book" / "requirements.txt"


def ensure_book_venv():
    """The book's own venv (.venv-book) with docs/book/requirements.txt: Sphinx, MyST-NB and the browser
    checks' packages, apart from the course's .venv (which the book does not need)."""
    py = venv_python(BOOK_VENV)
    stamp = BOOK_VENV / ".book-stamp"
    want = hashlib.sha256(BOOK_REQUIREMENTS.read_bytes()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return py
    if not py.exists():
        print("Creating %s ..." % BOOK_VENV.name, flush=True)
        if subprocess.run([find_base_python(), "-m", "venv", str(BOOK_VENV)]).returncode != 0:
            die("could not create %s (on Debian/Ubuntu: apt-get install python3-venv)." % BOOK_VENV.name)
    log = BOOK_VENV / "pip-install.log"
    print("Installing the book's pinned packages (docs/book/requirements.txt) into %s (about a minute the "
          "first time; log: %s/pip-install.log) ..." % (BOOK_VENV.name, BOOK_VENV.name), flush=True)
    with open(log, "w") as fh:
        r = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-r",
                            str(BOOK_REQUIREMENTS)], stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT))
    if r.returncode != 0:
        die(_explain_pip_failure(log.read_text(errors="replace"), log=log))
    stamp.write_text(want + "\n")
    return py


def cmd_book(argv):
    """Both editions as one static website in _build/book/ (tools/book.py), built from the notebooks' stored
    outputs in .venv-book; nothing is executed."""
    py = ensure_book_venv()
    return subprocess.call([str(py), "-m", "tools.book", "build"] + list(argv), cwd=str(ROOT))


def cmd_test_book(argv):
    """The book built, then checked in headless Chromium (tests/book/): every page of both editions served
    on localhost with no request leaving it, images, math, console, search, the language switch, axe-core's
    scan and every internal link. Needs Chromium (`apt-get install chromium`)."""
    py = ensure_book_venv()
    if lane_lacks("test-book", py, say=True):
        return 2
    rc = subprocess.call([str(py), "-m", "tools.book", "build"], cwd=str(ROOT))
    if rc != 0:
        return rc
    return run_lane("test-book", argv, py=py)


PYTHONS = ("3.11", "3.12", "3.13")


def _venv_base(venv):
    """The interpreter a venv was made from (pyvenv.cfg's `executable`, else its `home`)."""
    cfg = venv / "pyvenv.cfg"
    if not cfg.exists():
        return ""
    keys = dict(ln.split("=", 1) for ln in cfg.read_text().splitlines() if "=" in ln)
    keys = {k.strip(): v.strip() for k, v in keys.items()}
    return keys.get("executable") or str(Path(keys.get("home", "")) / "python3")


def find_python(version):
    """An interpreter of `version` ("3.12") that really runs: python3.12 on PATH (a pyenv shim
    there may refuse), else one that pyenv installed."""
    candidates = [shutil.which("python" + version)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += [str(f / "bin" / ("python" + version)) for f in sorted(pyenv.glob(version + ".*"), reverse=True)]
    for exe in candidates:
        if not exe or not Path(exe).exists():
            continue
        try:
            r = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == version:
            return exe
    return None


def portable_level_env(name):
    """The switches of the portability lane's CPU level `name` (``tools/portable.py``), for a whole lane:
    CI runs the other Pythons' notebooks at the levels other than its own (standard library only)."""
    from tools import portable

    levels = {level.name: level for level in portable.LEVELS if level.env}
    if name not in levels:
        die("--level takes %s (one core is the portability lane's own), not %r." % (" or ".join(levels), name))
    return dict(levels[name].env)


def cmd_test_pythons(argv):
    """The whole suite on each Python the README names, each in its own venv (.venv-3.X)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python tasks.py test-pythons")
    parser.add_argument("--pythons", default=",".join(PYTHONS), help="comma-separated, e.g. 3.12,3.13")
    parser.add_argument("--setup-only", action="store_true", help="create and fill the venvs, run nothing")
    parser.add_argument("--level", help="a CPU level of the portability lane to run at (python -m tools.portable): "
                                        "default or avx2; CI runs each Python at one")
    opts, rest = parser.parse_known_args(argv)
    level_env = portable_level_env(opts.level) if opts.level else {}
    versions = [v.strip() for v in opts.pythons.split(",") if v.strip()]
    missing = [v for v in versions if not find_python(v)]
    if missing:
        die("no interpreter for Python %s: install it (python.org, pyenv, your package manager)." % ", ".join(missing))
    rows = []
    for v in versions:
        t0 = time.time()
        base = find_python(v)
        # The README's own .venv serves for the version it is (or would be) made with; others get .venv-3.X.
        own = _venv_base(VENV) if venv_python().exists() else find_base_python()
        same = Path(base).resolve() == Path(own).resolve() or (
            not venv_python().exists() and "%d.%d" % sys.version_info[:2] == v)
        py = ensure_venv(venv=VENV if same else ROOT / (".venv-" + v), base=base if not same else None)
        t1 = time.time()
        if opts.setup_only:
            rows.append((v, 0, t1 - t0, 0.0))
            continue
        rc = subprocess.call([str(py), "-m", "tools.lanes", "test-pythons"] + rest, cwd=str(ROOT),
                             env={**venv_env(py.parent.parent), **level_env})
        rows.append((v, rc, t1 - t0, time.time() - t1))
    print("\n%-8s %-8s %10s %10s" % ("Python", "result", "install s", "suite s"))
    for v, rc, inst, suite in rows:
        print("%-8s %-8s %10.0f %10.0f" % (v, "ok" if rc == 0 else "FAILED", inst, suite))
    return 0 if all(r[1] == 0 for r in rows) else 1


def _size(nbytes):
    return "%.1f GB" % (nbytes / 1e9) if nbytes >= 1e9 else "%.0f MB" % (nbytes / 1e6)


def _scratch(prefix):
    """A scratch folder inside the course folder (on the disk that holds the venvs: a system temporary
    folder may be a small RAM disk), and an environment whose temporary files go there too."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=str(ROOT)))
    return tmp, dict(os.environ, TMPDIR=str(tmp), TEMP=str(tmp), TMP=str(tmp))


def cmd_wheelhouse(argv):
    """Every pinned package with its dependencies, as wheels for this computer's system, processor and
    Python, in wheelhouse/ ($COURSE_WHEELHOUSE names another folder): what setup installs, resolved by
    the pip that fills .venv. A current .venv fixes the versions of the dependencies to its own.
    Made in a .partial folder first, so that wheelhouse/ exists only complete."""
    named = os.environ.get("COURSE_WHEELHOUSE", "").strip()
    target = ROOT / Path(named).expanduser() if named else WHEELHOUSE
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(str(partial), ignore_errors=True)
    partial.mkdir(parents=True)
    tmp, env = _scratch(".wheelhouse-")
    try:
        py = venv_python()
        if not py.exists():  # a venv with only pip, made as .venv would be
            r = subprocess.run([find_base_python(), "-m", "venv", str(tmp / "pip")])
            if r.returncode != 0:
                die("could not create a venv (on Debian/Ubuntu: apt-get install python3-venv).")
            py = venv_python(tmp / "pip")
        where = subprocess.run([str(py), "-c", "import sys, sysconfig; print('Python %d.%d, %s' % "
                                "(sys.version_info[:2] + (sysconfig.get_platform(),)))"],
                               stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
        cmd = [str(py), "-m", "pip", "wheel", "--disable-pip-version-check", "-r", str(REQUIREMENTS),
               "--wheel-dir", str(partial)]
        stamp = VENV / ".course-stamp"
        if stamp.exists() and stamp.read_text().strip() == stamp_value():
            pinned = set(re.sub(r"[-_.]+", "-", ln.split("==")[0].strip()).lower()
                         for ln in REQUIREMENTS.read_text().splitlines() if "==" in ln.split("#")[0])
            listed = subprocess.run([str(py), "-m", "pip", "list", "--disable-pip-version-check",
                                     "--format=freeze", "--exclude-editable"],
                                    stdout=subprocess.PIPE, universal_newlines=True).stdout.splitlines()
            (tmp / "venv-versions.txt").write_text("".join(
                ln + "\n" for ln in listed
                if "==" in ln and re.sub(r"[-_.]+", "-", ln.split("==")[0]).lower() not in pinned))
            cmd += ["--constraint", str(tmp / "venv-versions.txt")]
            print("The dependencies' versions: those of .venv.", flush=True)
        log = partial / "pip-wheel.log"
        print("Downloading every pinned package and its dependencies for %s into %s (several minutes; "
              "log: %s) ..." % (where, shown_path(partial), shown_path(log)), flush=True)
        t0 = time.time()
        with open(log, "w") as fh:
            r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env)
        if r.returncode != 0:
            die(_explain_pip_failure(log.read_text(errors="replace")) + " (log: %s)" % shown_path(log))
        log.unlink()
        shutil.copyfile(str(REQUIREMENTS), str(partial / "requirements.txt"))  # what it was made for
        shutil.rmtree(str(target), ignore_errors=True)
        partial.rename(target)
    finally:
        shutil.rmtree(str(tmp), ignore_errors=True)
    wheels = sorted(target.glob("*.whl"))
    total = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
    print("%s: %d wheels, %s, for %s, in %.0f s. `make lab`, `make test` and `make setup` now install "
          "from it alone; copy the course folder with it to a computer like this one." % (
              shown_path(target), len(wheels), _size(total), where, time.time() - t0), flush=True)
    return 0


def cmd_check_wheelhouse(argv):
    """A fresh venv in a temporary folder, filled from the wheelhouse alone: no index, no pip
    configuration file and no PIP_* variable (nothing else on this computer can supply a package),
    then `python -m course_utils doctor` in it, which must report no FAIL."""
    wheels = find_wheelhouse()
    if wheels is None:
        die("there is no wheelhouse/ to check: make it first with `make wheelhouse`.")
    tmp, env = _scratch(".check-wheelhouse-")
    try:
        print("A fresh venv from %s alone: no package index, PIP_CONFIG_FILE=%s, no PIP_* variable ..." % (
            shown_path(wheels), os.devnull), flush=True)
        t0 = time.time()
        py = ensure_venv(venv=tmp / "venv", wheels=wheels, pip_env=pip_alone_env(env))
        took = time.time() - t0
        r = subprocess.run([str(py), "-m", "course_utils", "doctor"], cwd=str(ROOT),
                           env=venv_env(tmp / "venv", base=pip_alone_env(env)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = r.stdout.decode("utf-8", "replace")
        sys.stdout.write(text)
        ok = r.returncode == 0 and not any(ln.startswith("FAIL") for ln in text.splitlines())
    finally:
        shutil.rmtree(str(tmp), ignore_errors=True)
    print("check-wheelhouse: %s (installed from %s alone in %.0f s; the doctor %s)" % (
        "ok" if ok else "FAILED", shown_path(wheels), took, "reports no FAIL" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


COMMANDS = {
    "setup": cmd_setup,
    "wheelhouse": cmd_wheelhouse,
    "check-wheelhouse": cmd_check_wheelhouse,
    "test-browser": cmd_test_browser,
    "test-portable": cmd_test_portable,
    "book": cmd_book,
    "test-book": cmd_test_book,
    "lab": cmd_lab,
    "lab-zh": cmd_lab_zh,
    "test": cmd_test,
    "execute": cmd_execute,
    "slides": cmd_slides,
    "guide": cmd_guide,
    "bench": cmd_bench,
    "stress": cmd_stress,
    "test-gpu": cmd_test_gpu,
    "test-pythons": cmd_test_pythons,
    "test-spawn": cmd_test_spawn,
    "test-slurm": cmd_test_slurm,
    "hub": cmd_hub,
    "test-hub": cmd_test_hub,
}


def main(argv):
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if not argv else 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except KeyboardInterrupt:  # Ctrl-C between two steps: one line, not a traceback
        sys.stderr.write("\ninterrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
