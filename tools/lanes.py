"""The course's test lanes, in one table: each lane's pytest arguments, environment and system needs.

    python -m tools.lanes LANE [ARGS]     # e.g. python -m tools.lanes test tests/test_launch.py
    python -m tools.lanes --missing LANE  # exit 2, saying what to install, if a program is missing

runs one lane with the Python that runs this (``make test-*`` reach it through ``tasks.py``, which
sets that environment up first: ``.venv``, ``.venv-book``, the hub's packages...). ARGS replace the
lane's targets, or come after them where the lane says so. CONTRIBUTING.md's "Test lanes" says what
each one is for. The GPU lane (``test-gpu``) runs in the GPU machine's own Python: lax nbval, then
every script once with nccl (``tools.stress.run_script``). Standard library and the inventory only.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import inventory

ROOT = inventory.ROOT
SANITIZE = ROOT / "nbval_sanitize.cfg"
KERNEL_START_TIMEOUT = 180  # seconds; a kernel starting on a loaded machine is slow, not dead
CELL_TIMEOUT = 300  # seconds; a hung cell fails the suite instead of waiting nbval's 2000 s
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
NO_CACHE = ("-p", "no:cacheprovider")
# One worker more than the cores (at most 4): many tests wait (a timeout, a sleeping answer, a rank
# starting) and the extra worker uses those seconds; each notebook whole on one worker (conftest.py)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
WORKERS = str(min(4, CORES + 1))
PARALLEL = ("-n", WORKERS, "--dist", "loadgroup")


@dataclass(frozen=True)
class Lane:
    """A test lane: pytest `options` and `nbval` mode over `targets` (ARGS replace them, or follow
    them with `args_follow`), in this environment plus `env` (every lane records no progress), with
    `unset` removed, `path` first on PYTHONPATH; the programs it `needs` (any one of them with
    `needs_any`), and what to do when they are missing (`missing`)."""

    name: str
    targets: tuple[str, ...]
    nbval: str | None = None  # "--nbval" (strict) or "--nbval-lax" (the tagged cells only)
    options: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    path: tuple[str, ...] = ()
    args_follow: bool = False
    venv_bin_first: bool = False  # on PATH: a job the lane starts runs `python`
    needs: tuple[str, ...] = ()
    needs_any: bool = False
    missing: str = ""


_SLURM = ("munged", "slurmctld", "slurmd", "sbatch")
LANES = {lane.name: lane for lane in (
    Lane("test", ("tests", "notebooks", "notebooks-zh"), "--nbval", PARALLEL),
    Lane("test-pythons", ("tests", "notebooks"), "--nbval", PARALLEL),
    Lane("test-spawn", tuple(f"notebooks/{c.notebook}" for c in inventory.CHAPTERS if c.starts_processes),
         "--nbval-lax", NO_CACHE + PARALLEL, path=("tests/spawn_only",)),
    Lane("test-gpu", ("notebooks",), "--nbval-lax", NO_CACHE, {"COURSE_GPU_LANE": "1"}, path=(".",)),
    Lane("test-slurm", ("tests/slurm",), None, (*NO_CACHE, "-s"), {"COURSE_SLURM_LANE": "1"},
         args_follow=True, venv_bin_first=True, needs=_SLURM,
         missing="the Slurm lane needs {missing}: on Debian or Ubuntu `apt-get install "
                 "--no-install-recommends slurm-wlm munge`."),
    Lane("test-browser", ("tests/browser",), None, (*NO_CACHE, "-s"), {"COURSE_BROWSER_LANE": "1"},
         ("JUPYTER_TOKEN",), args_follow=True, needs=CHROMIUM, needs_any=True,
         missing="the browser lane needs Chromium: on Debian or Ubuntu `apt-get install chromium`."),
    Lane("test-book", ("tests/book",), None, (*NO_CACHE, "-n", "2"), {"COURSE_BOOK_LANE": "1"},
         args_follow=True, needs=CHROMIUM, needs_any=True,
         missing="the book's checks need Chromium: on Debian or Ubuntu `apt-get install chromium`."),
    Lane("test-hub", ("tests/test_hub.py", "tests/hub"), None, (*NO_CACHE, "-s"),
         {"COURSE_HUB_LANE": "1"}, ("JUPYTER_TOKEN",), args_follow=True, needs=CHROMIUM,
         needs_any=True,
         missing="the hub lane needs Chromium: on Debian or Ubuntu `apt-get install chromium`."),
)}


def nbval_args(mode: str = "--nbval") -> list[str]:
    """nbval's options for every lane; `mode` "--nbval-lax" compares only the tagged cells."""
    return [mode, "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE),
            "--nbval-cell-timeout", str(CELL_TIMEOUT),
            "--nbval-kernel-startup-timeout", str(KERNEL_START_TIMEOUT)]


def pytest_command(lane: Lane, args: Sequence[str] = ()) -> list[str]:
    """The lane's pytest command line (`args`: see Lane)."""
    targets = [str(ROOT / t) if lane.args_follow else t for t in lane.targets]
    targets = [*targets, *args] if lane.args_follow else (list(args) or targets)
    mode = nbval_args(lane.nbval) if lane.nbval else []
    return [sys.executable, "-m", "pytest", *lane.options, *mode, *targets]


def environment(lane: Lane, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The lane's environment: `base` (this one), no progress recorded, the lane's own variables."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in lane.unset}
    env.update({"COURSE_PROGRESS": "0", **lane.env})
    if lane.path:
        paths = [str((ROOT / p).resolve()) for p in lane.path] + [env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if lane.venv_bin_first:
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def missing(lane: Lane) -> str | None:
    """What the lane needs that this computer lacks, in words; None when nothing is missing."""
    found = [p for p in lane.needs if shutil.which(p) or Path("/usr/sbin", p).exists()]
    if (found if lane.needs_any else len(found) == len(lane.needs)) or not lane.needs:
        return None
    return lane.missing.format(missing=", ".join(p for p in lane.needs if p not in found))


def gpu_lane(args: Sequence[str]) -> int:
    """Lax nbval over every notebook (only the cells tagged nbval-check-output are compared, stdout
    only; any error fails), then every script once with nccl where there is a GPU per rank (one
    GPU: one nccl rank, and the ranks on gloo), in this Python (the machine's own PyTorch)."""
    import subprocess

    from tools.stress import run_script

    try:
        import torch
    except ImportError:
        return _die("the GPU lane runs in the Python that has the machine's PyTorch; this one has no torch.")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"GPU lane: torch {torch.__version__}, {gpus} GPU(s), Python {sys.version.split()[0]}",
          flush=True)
    lane = LANES["test-gpu"]
    env = environment(lane)
    rc = subprocess.call(pytest_command(lane, args), cwd=str(ROOT), env=env)
    runs = []  # (script, processes, backend)
    for script in inventory.SCRIPTS:
        if script.nproc == 0 or gpus >= script.nproc:
            runs.append((script, script.nproc, None if script.nproc == 0 else "nccl"))
            continue
        runs += [(script, 1, "nccl")] if gpus >= 1 else []
        runs.append((script, script.nproc, "gloo"))
    failed = []
    for script, nproc, backend in runs:
        run = inventory.Script(script.name, nproc, script.args)
        ok, _, text, seconds, _ = run_script(run, dict(env, COURSE_BACKEND=backend) if backend else env)
        verdict = "ok" if ok else "FAIL"
        print(f"  {script.name:26s} {backend or '-':5s} x{max(nproc, 1)}  {verdict}  {seconds:5.1f} s",
              flush=True)
        if not ok:
            failed.append(script.name)
            print(text[-3000:])
    notebooks = "ok" if rc == 0 else "FAILED"
    print(f"GPU lane: notebooks {notebooks}; scripts {len(runs) - len(failed)}/{len(runs)} ok",
          flush=True)
    return 0 if rc == 0 and not failed else 1


def _die(message: str) -> int:
    sys.stderr.write("error: " + message + "\n")
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--missing"] and argv[1:2] and argv[1] in LANES:  # only what the lane lacks
        problem = missing(LANES[argv[1]])
        return _die(problem) if problem else 0
    if not argv or argv[0] not in LANES:
        return _die(f"name a lane: {', '.join(LANES)}")
    name, args = argv[0], argv[1:]
    if name == "test-gpu":
        return gpu_lane(args)
    lane = LANES[name]
    problem = missing(lane)
    if problem:
        return _die(problem)
    cmd, env = pytest_command(lane, args), environment(lane)
    sys.stdout.flush()
    if os.name == "posix":  # pytest itself, in this process: Ctrl-C reaches it alone
        os.chdir(ROOT)
        os.execve(cmd[0], cmd, env)
    import subprocess

    return subprocess.call(cmd, cwd=str(ROOT), env=env)


if __name__ == "__main__":
    sys.exit(main())
