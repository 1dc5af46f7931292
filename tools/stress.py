"""What starts processes, run again and again (``make stress``; 0 failures allowed): every script of
``notebooks/scripts/`` in its normal mode from a terminal (``course_utils.inventory.SCRIPTS``), with
torchrun and with the course's warm launcher, and every notebook in a fresh kernel.

    python -m tools.stress [--script-runs N] [--notebook-runs M] [--only scripts|notebooks]
                           [--script NAME]

Both go through one loop (:func:`repeat`); the GPU lane runs each script once (:func:`run_script`).
Standard library and the inventory only at import: the GPU lane runs it outside ``.venv``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from course_utils.inventory import ROOT, SCRIPTS, Script

NOTEBOOKS = ROOT / "notebooks"
LOGS = ROOT / ".stress"  # a failed run's output


@dataclass
class Row:
    """One thing run again and again: its name (a command, a notebook), each run's seconds, and
    the logs of the runs that failed."""

    name: str
    times: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def repeat(name: str, label: str, runs: int, once: Callable[[], tuple[bool, str]],
           log: Callable[[int], str]) -> Row:
    """Run `once` `runs` times, counting failures instead of stopping at the first: it returns (ok,
    what to keep of a failed run), which goes to ``.stress/<log(run)>``. A line per run."""
    row = Row(name)
    LOGS.mkdir(exist_ok=True)
    for k in range(1, runs + 1):
        t0 = time.perf_counter()
        ok, text = once()
        row.times.append(time.perf_counter() - t0)
        if not ok:
            path = LOGS / log(k)
            path.write_text(text, encoding="utf-8")
            row.failed.append(str(path.relative_to(ROOT)))
        print(f"  {label:35s} run {k:2d}/{runs}  {'ok  ' if ok else 'FAIL'}  {row.times[-1]:5.1f} s",
              flush=True)
    return row


def table(rows: Iterable[Row], what: str) -> str:
    """The summary: one line per row (runs, failures, median seconds), each failure's log below."""
    rows = list(rows)
    width = max(len(what), *(len(r.name) for r in rows))
    lines = [f"{what:<{width}s}  {'runs':>5s}  {'failures':>8s}  {'median s':>8s}"]
    for r in rows:
        lines.append(f"{r.name:<{width}s}  {len(r.times):5d}  {len(r.failed):8d}  {r.median:8.1f}")
        lines += [f"    log: {log}" for log in r.failed]
    return "\n".join(lines)


def script_command(script: Script, out: str, py: str | None = None, engine: str = "torchrun") -> list[str]:
    """The terminal command of a script's normal mode, run from notebooks/ ("{out}": `out`);
    engine "warm": the course's launcher with ranks forked from its warm server."""
    py = py or sys.executable
    args = [a.replace("{out}", out) for a in script.args]
    path = "scripts/" + script.name
    if script.nproc and engine == "warm":
        return [py, "-m", "course_utils", "launch", path, "--nproc", str(script.nproc),
                "--engine", "warm", "--quiet", "--", *args]
    if script.nproc == 0:
        return [py, path, *args]
    return [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(script.nproc),
            path, *args]


def shown(cmd: list[str]) -> str:
    """A command as the summary shows it: "python", and DIR for its fresh folder."""
    words = ["python" if c == sys.executable else c for c in cmd]
    return " ".join(re.sub(r".*[/\\]stress-[^/\\]*", "DIR", c) for c in words)


def run_script(script: Script, env: dict | None = None, py: str | None = None, timeout: float = 600,
               engine: str = "torchrun") -> tuple[bool, int, str, float, str]:
    """Run one script in its normal mode, in a fresh folder for "{out}"; (ok, exit code, output,
    seconds, the command shown). It fails on a non-zero exit, a timeout, or an abort message."""
    out = tempfile.mkdtemp(prefix="stress-")
    cmd = script_command(script, out, py=py, engine=engine)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=str(NOTEBOOKS), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        text, rc = r.stdout.decode("utf-8", "replace"), r.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = (exc.stdout or b"").decode("utf-8", "replace") + "\n[timed out]", -1
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ok = rc == 0 and "terminate called" not in text
    return ok, rc, text, time.time() - t0, shown(cmd)


def stress_scripts(runs: int, names: Iterable[str] = ()) -> list[Row]:
    """Every script (or those `names`) `runs` times with torchrun, and the distributed ones `runs`
    times more with the warm launcher."""
    rows = []
    for script in SCRIPTS:
        if names and script.name not in names:
            continue
        for engine in ("torchrun", "warm") if script.nproc else ("torchrun",):
            def once(script: Script = script, engine: str = engine) -> tuple[bool, str]:
                ok, rc, text, _, cmd = run_script(script, engine=engine)
                return ok, f"$ {cmd}\nexit code {rc}\n{text}"

            name = shown(script_command(script, "/stress-DIR", engine=engine))
            label = f"{script.name} {engine}"
            log = lambda k, s=script, e=engine: f"{s.name}.{e}.run{k}.log"  # noqa: E731
            rows.append(repeat(name, label, runs, once, log))
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tasks.py stress")
    p.add_argument("--script-runs", type=int, default=10)
    p.add_argument("--notebook-runs", type=int, default=3)
    p.add_argument("--only", choices=["scripts", "notebooks"], default=None)
    p.add_argument("--script", action="append", default=[], metavar="NAME",
                   help="only this script (repeatable), e.g. --script train.py")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    unknown = sorted(set(opts.script) - {s.name for s in SCRIPTS})
    if unknown:
        names = ", ".join(s.name for s in SCRIPTS)
        print(f"error: unknown script(s) {', '.join(unknown)}; the scripts are: {names}", file=sys.stderr)
        return 2
    if opts.script_runs < 1 or opts.notebook_runs < 1:
        print("error: --script-runs and --notebook-runs must be at least 1", file=sys.stderr)
        return 2
    failures = 0
    if opts.only != "notebooks":
        print(f"Scripts, {opts.script_runs} run(s) each, from notebooks/ ...", flush=True)
        rows = stress_scripts(opts.script_runs, opts.script)
        print("\n" + table(rows, "command"))
        failures += sum(len(r.failed) for r in rows)
    if opts.only != "scripts":
        from tools.notebook import chapters, stress

        print(f"\nNotebooks, {opts.notebook_runs} run(s) each, in a fresh kernel ...", flush=True)
        rows = stress(chapters(), opts.notebook_runs)
        print("\n" + table(rows, "notebook"))
        failures += sum(len(r.failed) for r in rows)
    print(f"\nstress: {'no failure' if failures == 0 else 'FAILED'}", flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
