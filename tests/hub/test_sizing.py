"""The sizing table of the instructor guide (docs/instructor/hub.md), measured on this machine:

    COURSE_HUB_SIZING=1,3,6 python3 tasks.py test-hub -k sizing

For each N: the hub restarted for N learners (threads per kernel = cores // N), N servers started at once
(until all are ready), chapter 01 run top to bottom in the N servers at once, then a distributed chapter's
first launch (`torchrun("scripts/hello_dist.py", nproc=2)`, 2 ranks, from a fresh kernel) in the N
servers at once; the CPU seconds and peak memory (PSS) of each learner's processes. The table is printed
and written to .hub-lane/sizing.md, with the load average before each round: measure on a quiet machine.
Skipped unless COURSE_HUB_SIZING names the rounds."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import statistics
import time

import pytest

ROUNDS = [int(n) for n in os.environ.get("COURSE_HUB_SIZING", "").split(",") if n.strip()]
if os.environ.get("COURSE_HUB_LANE") != "1" or not ROUNDS:
    pytest.skip("the sizing rounds: COURSE_HUB_SIZING=1,3,6 python3 tasks.py test-hub -k sizing",
                allow_module_level=True)

from .client import Hub, Learner  # noqa: E402
from .lane import ROOT, Lane, MemorySampler, load_line, temporary_work  # noqa: E402

COPY = "pytorch-in-depth"
LAUNCH = """import time
from course_utils.launch import torchrun
t0 = time.perf_counter()
torchrun("scripts/hello_dist.py", nproc=2)
print(f"LAUNCH {time.perf_counter() - t0:.2f}")
"""


def _mib(values) -> str:
    values = sorted(values)
    return f"{statistics.median(values) / 2**20:.0f} (max {values[-1] / 2**20:.0f})"


def _launch(who: Learner) -> float:
    outputs, error = who.execute(f"{COPY}/notebooks/04_distributed.ipynb", LAUNCH)
    assert not error, f"{who.name}: {error}"
    text = "".join(o.get("text", "") for o in outputs)
    return float(text.split("LAUNCH", 1)[1].split()[0])


def test_sizing_rounds():
    work = temporary_work()
    lane = Lane(work, learners=max(ROUNDS))
    rows = []
    try:
        lane.prepare()
        hub = Hub(lane.url)
        names = [f"s{i}" for i in range(1, max(ROUNDS) + 1)]
        passwords = {n: f"{n}-own-password" for n in names}
        for n in ROUNDS:
            lane.learners = n
            lane.start()
            threads = lane.room().threads
            time.sleep(5)  # let the hub's start settle before the load is read
            load = load_line().split(" on ")[0].replace("load average ", "")
            t0 = time.monotonic()

            def start(name: str) -> Learner:
                try:
                    who = Learner(hub, name, hub.token(name, passwords[name]))
                except AssertionError:  # first round: the name is taken now
                    who = hub.sign_in(name, passwords[name], lane.room_password)
                who.start_server()
                who.wait_ready()
                return who

            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                learners = list(pool.map(start, names[:n]))
            ready = time.monotonic() - t0
            with MemorySampler(lane) as run_sample, concurrent.futures.ThreadPoolExecutor(n) as pool:
                t0 = time.monotonic()
                runs = list(pool.map(lambda w: w.run_notebook(f"{COPY}/notebooks/01_autograd.ipynb"), learners))
                run_all = time.monotonic() - t0
            assert not [p for r in runs for p in r.problems], [p for r in runs for p in r.problems]
            with MemorySampler(lane) as launch_sample, concurrent.futures.ThreadPoolExecutor(n) as pool:
                launches = list(pool.map(_launch, learners))
            peak = {k: max(run_sample.peak.get(k, 0), launch_sample.peak.get(k, 0)) for k in run_sample.peak}
            rows.append((n, threads, load, ready, run_all, statistics.median(r.seconds for r in runs),
                         statistics.median(run_sample.cpu.values()), max(launches),
                         statistics.median(launch_sample.cpu.values()), _mib(peak.values())))
            lane.stop()
        header = ("| learners at once | threads per kernel | load average before | all servers ready (s) | "
                  "chapter 01 Run All, all done (s) | one learner's Run All, median (s) | CPU s per learner, "
                  "Run All | 2-rank launch, slowest (s) | CPU s per learner, launch | peak memory per learner, "
                  "PSS MiB, median (max) |")
        lines = [header, "|" + " --- |" * 10]
        for n, th, load, ready, run_all, one, cpu, launch, lcpu, mem in rows:
            lines.append(f"| {n} | {th} | {load} | {ready:.1f} | {run_all:.1f} | {one:.1f} | {cpu:.1f} | {launch:.1f} "
                         f"| {lcpu:.1f} | {mem} |")
        table = "\n".join(lines)
        (ROOT / ".hub-lane").mkdir(exist_ok=True)
        (ROOT / ".hub-lane" / "sizing.md").write_text(table + "\n")
        print("\n" + table, flush=True)
    finally:
        problems = lane.close()
        shutil.rmtree(work, ignore_errors=True)
        assert not problems, problems
        assert not lane.processes()
