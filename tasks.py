#!/usr/bin/env python3
"""The course's task runner: the Makefile calls it, and so can anyone without `make`.

    python tasks.py lab          # set up .venv if needed, open JupyterLab on notebooks/
    python tasks.py test [ARGS]  # set up .venv if needed, run the whole test suite
    python tasks.py execute [NB] # re-run notebooks in place in a fresh kernel
    python tasks.py bench [NB]   # time each notebook's execution (median of a few runs)
    python tasks.py setup        # only create/update .venv

Works with any Python 3 to print a clear message; the course itself needs 3.11+.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
NOTEBOOKS = ROOT / "notebooks"
REQUIREMENTS = ROOT / "requirements.txt"
STAMP = VENV / ".course-stamp"
SANITIZE = ROOT / "nbval_sanitize.cfg"
MIN_PY = (3, 11)
CELL_TIMEOUT = 300  # seconds; a hung cell fails the suite instead of waiting nbval's 2000 s


def die(msg):
    sys.stderr.write("error: " + msg + "\n")
    sys.exit(2)


def venv_python():
    if os.name == "nt":
        return VENV / "Scripts" / "python.exe"
    return VENV / "bin" / "python"


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


def _explain_pip_failure(log_text):
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
    last = [ln for ln in log_text.strip().splitlines() if ln.strip()][-3:]
    return "installing the pinned packages failed: " + " | ".join(last)


def ensure_venv(quiet=False):
    """Create .venv and install requirements + course_utils unless the stamp says it is current."""
    py = venv_python()
    want = stamp_value()
    if py.exists() and STAMP.exists() and STAMP.read_text().strip() == want:
        return py
    base = find_base_python()
    if not py.exists():
        print("Creating .venv with %s ..." % base, flush=True)
        r = subprocess.run([base, "-m", "venv", str(VENV)])
        if r.returncode != 0:
            die("could not create .venv (on Debian/Ubuntu: apt-get install python3-venv).")
    log = VENV / "pip-install.log"
    print("Installing the pinned requirements into .venv (several minutes the first time;"
          " log: .venv/pip-install.log) ...", flush=True)
    t0 = time.time()
    with open(log, "w") as fh:
        steps = [
            [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
            [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
             "--no-build-isolation", "-e", str(ROOT)],
        ]
        for cmd in steps:
            r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT))
            if r.returncode != 0:
                fh.flush()
                die(_explain_pip_failure(log.read_text(errors="replace")))
    STAMP.write_text(want + "\n")
    print("Environment ready in %.0f s." % (time.time() - t0), flush=True)
    return py


def in_venv(args, **kw):
    py = ensure_venv()
    return subprocess.call([str(py)] + list(args), cwd=str(ROOT), **kw)


def cmd_setup(argv):
    ensure_venv()
    return 0


def cmd_lab(argv):
    py = ensure_venv()
    if os.environ.get("JUPYTER_TOKEN", None) == "":
        die("JUPYTER_TOKEN is set but empty; unset it so Jupyter makes a token for you.")
    args = [str(py), "-m", "jupyter", "lab", "--notebook-dir=" + str(NOTEBOOKS),
            "--ServerApp.ip=127.0.0.1"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")  # containers and CI run as root; Jupyter refuses that without the flag
    args += list(argv)
    return subprocess.call(args, cwd=str(ROOT))


def nbval_args():
    return ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE),
            "--nbval-cell-timeout", str(CELL_TIMEOUT)]


def cmd_test(argv):
    """Unit tests + hygiene tests + strict nbval over every notebook, notebooks in parallel."""
    ensure_venv()
    targets = list(argv) or ["tests", "notebooks"]
    args = ["-m", "pytest"] + nbval_args() + ["-n", "2", "--dist", "loadfile"] + targets
    return in_venv(args)


def notebooks_from(argv):
    if argv:
        return [Path(a).resolve() for a in argv]
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def cmd_execute(argv):
    ensure_venv()
    return in_venv(["-m", "course_utils.notebook", "execute"] + [str(p) for p in notebooks_from(argv)])


def cmd_bench(argv):
    ensure_venv()
    return in_venv(["-m", "course_utils.notebook", "bench"] + list(argv))


COMMANDS = {
    "setup": cmd_setup,
    "lab": cmd_lab,
    "test": cmd_test,
    "execute": cmd_execute,
    "bench": cmd_bench,
}


def main(argv):
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if not argv else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
