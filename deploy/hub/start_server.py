"""A learner's server, started by the hub as the learner's own account with the course's .venv Python:

1. their copy of the course, ``~/pytorch-in-depth``, made from the instructor's clone on the first start
   and brought up to date on every later start by nbgitpuller, which never loses the learner's edits
   (their changed files are committed locally and merged with ``-Xours``: where the learner and the
   instructor changed the same lines, the learner's lines stay; a file the learner deleted comes back;
   a file of theirs that the instructor's update would overwrite is renamed first);
2. their kernels import the course's helpers and data from that copy (PYTHONPATH), so helpers and
   notebooks always come from the same commit;
3. matplotlib's font cache, copied from the .venv once (the .venv is read-only for learners);
4. JupyterLab's news and update prompts off in the learner's settings, once (the course is offline by
   design, as ``make lab``; the learner may turn them on);
5. then ``jupyterhub-singleuser`` (JupyterLab) with the hub's arguments.

A failed update is written to the hub's log and the server starts anyway, on the copy the learner has.
Standard library only, until the last step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PULL_TIMEOUT_S = 300


def _log(message: str) -> None:
    sys.stderr.write(f"[course-hub start] {message}\n")
    sys.stderr.flush()


def trust(folders: list[str]) -> None:
    """Let git read the instructor's clone, which another account (root) owns: git refuses such a
    repository ("dubious ownership") unless the user's own configuration names it."""
    have = subprocess.run(["git", "config", "--global", "--get-all", "safe.directory"],
                          capture_output=True, text=True, timeout=30).stdout.split()
    for folder in folders:
        if folder and folder not in have:
            subprocess.run(["git", "config", "--global", "--add", "safe.directory", folder],
                           capture_output=True, timeout=30, check=True)


def pull(repo: str, branch: str, target: Path) -> bool:
    """The learner's copy brought up to date with nbgitpuller (see the module's docstring)."""
    url = repo if "://" in repo else "file://" + repo  # file://: a real fetch, not a local clone's hard links
    cmd = [sys.executable, "-m", "nbgitpuller.pull", url, branch, str(target)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=PULL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _log(f"updating {target} from {repo} took over {PULL_TIMEOUT_S} s; starting on the copy as it is")
        return False
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()][-12:]
        _log(f"updating {target} from {repo} ({branch}) failed; starting on the copy as it is:\n  "
             + "\n  ".join(lines))
        return False
    _log(f"{target} is up to date with {repo} ({branch})")
    return True


def font_cache(venv: Path, config: Path) -> None:
    """Copy the .venv's matplotlib font list to the learner's own matplotlib folder, once: the .venv is
    read-only, and without the list every first figure prints "Matplotlib is building the font cache"."""
    config.mkdir(parents=True, exist_ok=True)
    if any(config.glob("fontlist-*.json")):
        return
    for f in (venv / "mplconfig").glob("fontlist-*.json"):
        shutil.copy(f, config / f.name)


# JupyterLab's settings that ask for the internet, off (tasks.py turns off the server's side)
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False}}


def lab_settings(home: Path) -> None:
    folder = home / ".jupyter" / "lab" / "user-settings"
    for name, value in LAB_SETTINGS.items():
        path = folder / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value) + "\n")


def main(argv: list[str]) -> None:
    home = Path.home()
    target = home / os.environ.get("COURSE_HUB_FOLDER", "pytorch-in-depth")
    repo, branch = os.environ.get("COURSE_HUB_REPO", ""), os.environ.get("COURSE_HUB_BRANCH", "")
    if repo and branch:
        try:
            trust([d for d in os.environ.get("COURSE_HUB_SAFE_DIRECTORIES", "").split(os.pathsep) if d])
            pull(repo, branch, target)
        except (OSError, subprocess.SubprocessError) as exc:
            _log(f"could not update {target}: {exc}; starting on the copy as it is")
    os.environ["PYTHONPATH"] = str(target)
    config = home / ".config" / "matplotlib"
    os.environ["MPLCONFIGDIR"] = str(config)
    try:
        font_cache(Path(sys.prefix), config)
        lab_settings(home)
    except OSError as exc:
        _log(f"could not prepare the learner's settings: {exc}")
    os.chdir(home)
    os.execv(sys.executable, [sys.executable, "-m", "jupyterhub.singleuser", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
