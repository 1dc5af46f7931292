"""The hub lane (``make test-hub``): the workshop room for real, on localhost.

One scenario, in order (each test uses what the ones before it did):

1. ``python tasks.py hub`` starts; 6 learners sign in, 5 through the REST API (the login form posted,
   then a token asked with their own password) and 1 through Chromium's login form; their servers start.
2. Chapters 00 and 01 run top to bottom in every learner's server at once, in real kernels, through the
   hub's proxy, as JupyterLab's Run All does; two learners answer 01's Q1 (one right, one wrong).
3. A learner cannot read another's files: the REST API says 403, the file system says no.
4. The instructor's view shows the two answers (page, CSV, JSON, in English and Chinese); a learner
   gets 403 from it.
5. The hub is stopped and started again (with the instructor's clone updated meanwhile): every learner
   signs in again and finds their work, and the update.
6. The idle culler stops the idle servers, and their processes with them.

Nothing stays: the hub, the proxy, every learner's process, the accounts and the group are removed at
the end (lane.py). The times are printed at the end and written to ``.hub-lane/times.json``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

if os.environ.get("COURSE_HUB_LANE") != "1":  # before the imports: the lane needs Linux and the hub's packages
    pytest.skip("the hub lane: make test-hub", allow_module_level=True)

import requests  # noqa: E402

from .client import Hub, Learner, NotebookRun, SignInError  # noqa: E402
from .lane import ROOT, Lane, MemorySampler, _git, load_line, temporary_work, write_json  # noqa: E402

NAMES = ["ada", "grace", "alan", "edsger", "barbara", "li-wei"]  # the last one signs in with Chromium
BROWSER = NAMES[-1]
NOTEBOOKS = ["00_start_here.ipynb", "01_autograd.ipynb"]
COPY = "pytorch-in-depth"
Q1_CELL = "66fba269"  # 01's Q1: `answer_q1 = ...  # a number` then `q1.check(answer_q1)`
ANSWERS = {"ada": "answer_q1 = 16.0\nq1.check(answer_q1)", "grace": "answer_q1 = 6\nq1.check(answer_q1)"}
EXPECTED_Q1 = {"ada": "done", "grace": "tried"}  # everyone else: "not yet"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
CULL_AFTER_S = 30
REPORT = ROOT / ".hub-lane"

times: dict[str, object] = {}
learners: dict[str, Learner] = {}
passwords = {name: f"{name}-own-password" for name in NAMES}
runs: list[NotebookRun] = []


@pytest.fixture(scope="module")
def lane():
    shutil.rmtree(REPORT, ignore_errors=True)
    REPORT.mkdir()
    work = temporary_work()
    room = Lane(work, learners=len(NAMES))
    t0 = time.monotonic()
    times["load at the start"] = load_line()
    try:
        room.prepare()
        times["hub start (s)"] = round(room.start(), 1)
        yield room
    finally:
        t1 = time.monotonic()
        times["hub stop at the end (s)"] = round(room.stop(), 1)
        problems = room.close()
        times["accounts and group removed (s)"] = round(time.monotonic() - t1 - times["hub stop at the end (s)"], 1)
        left = room.processes()
        if room.log and room.log.exists():
            shutil.copy(room.log, REPORT / "hub.log")
        shutil.rmtree(work, ignore_errors=True)
        times["lane wall time (s)"] = round(time.monotonic() - t0, 1)
        times["load"] = load_line()
        write_json(REPORT / "times.json", times)
        print("\nhub lane times:\n" + "\n".join(f"  {k}: {v}" for k, v in times.items()), flush=True)
        assert not problems, problems
        assert not left, f"processes left running: {left}"


@pytest.fixture(scope="module")
def hub(lane) -> Hub:
    return Hub(lane.url)


@pytest.fixture(scope="module")
def instructor(lane, hub) -> Learner:
    room = lane.room()
    return hub.sign_in(room.instructor, room.admin_password)


def _api(who: Learner, path: str) -> requests.Response:
    return requests.get(f"{who.hub.url}{path}", headers={"Authorization": f"token {who.token}"},
                        allow_redirects=False, timeout=60)


def browser_sign_in(url: str, name: str, password: str, room_password: str) -> float:
    """Chromium signs in through the login form; the seconds until the learner's JupyterLab shows chapter 00
    from their own copy with a kernel."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium", headless=True,
                              args=CHROMIUM_ARGS)
        try:
            page = b.new_page()
            page.set_default_timeout(180_000)
            t0 = time.monotonic()
            page.goto(f"{url}/hub/login")
            page.fill("#username_input", name)
            page.fill("#password_input", password)
            page.fill("#otp_input", room_password)
            page.click("#login_submit")
            page.wait_for_url(f"**/user/{name}/lab/tree/{COPY}/notebooks/00_start_here.ipynb*")
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_function("""() => { const el = document.querySelector('.jp-Notebook-ExecutionIndicator');
                return el && el.getAttribute('data-status') === 'idle'; }""")
            took = time.monotonic() - t0
            heading = page.wait_for_selector(".jp-Notebook .jp-MarkdownCell h1").inner_text()
            assert "Start here" in heading, f"the page does not show chapter 00: {heading!r}"
            return took
        finally:
            b.close()


def test_six_learners_sign_in_and_their_servers_start(lane, hub, instructor):
    rp = lane.room_password
    with pytest.raises(SignInError, match="room password is not right"):
        hub.form_sign_in("mallory", "mallory-own-password", "not-the-room-password")
    def through_the_api(name: str) -> Learner:
        who = hub.sign_in(name, passwords[name], rp)
        who.start_server()
        return who

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(NAMES) - 1) as pool:  # 5 at once, as in a room
        signing_in = {name: pool.submit(through_the_api, name) for name in NAMES[:-1]}
        browser = browser_sign_in(lane.url, BROWSER, passwords[BROWSER], rp)
        learners.update({name: f.result() for name, f in signing_in.items()})
    times["Chromium: login form to chapter 00 open with its kernel (s)"] = round(browser, 1)
    learners[BROWSER] = Learner(hub, BROWSER, hub.token(BROWSER, passwords[BROWSER]))
    for who in learners.values():
        who.wait_ready()
    times["all 6 servers ready, from the first sign-in (s)"] = round(time.monotonic() - t0, 1)
    # a taken name opens with its own password only, not with the room password
    with pytest.raises(SignInError, match="403"):
        hub.token("ada", rp)
    with pytest.raises(SignInError, match="taken"):
        hub.form_sign_in("ada", "something-else", rp)
    for name in NAMES:  # one account each, home mode 700, in the room's group
        entry = lane.account(name)
        assert oct(Path(entry.pw_dir).stat().st_mode & 0o777) == "0o700", entry
        assert (Path(entry.pw_dir) / COPY / "notebooks" / "01_autograd.ipynb").is_file()
        assert Path(entry.pw_dir, COPY).stat().st_uid == entry.pw_uid


def _run_both(who: Learner, out: list, errors: list) -> None:
    try:
        for nb in NOTEBOOKS:
            out.append(who.run_notebook(f"{COPY}/notebooks/{nb}", edit={Q1_CELL: ANSWERS[who.name]}
                                        if nb.startswith("01") and who.name in ANSWERS else None))
    except Exception as exc:  # reported by the test, with the learner's name
        errors.append(f"{who.name}: {type(exc).__name__}: {exc}")


def test_chapters_00_and_01_run_in_every_server_at_once(lane):
    errors: list[str] = []
    threads = [threading.Thread(target=_run_both, args=(who, runs, errors)) for who in learners.values()]
    t0 = time.monotonic()
    with MemorySampler(lane) as memory:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
    wall = time.monotonic() - t0
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a Run All did not finish within 15 minutes"
    problems = [f"{r.learner} {r.path}: {p}" for r in runs for p in r.problems]
    assert not problems, "\n".join(problems)
    assert sorted((r.learner, r.path.rsplit("/", 1)[1]) for r in runs) == sorted(
        (n, nb) for n in NAMES for nb in NOTEBOOKS), "not every notebook ran in every server"
    for r in runs:  # every code cell ran, in order, to the end
        nb = json.loads((Path(lane.account(r.learner).pw_dir) / r.path).read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), f"{r.learner} {r.path}"
    times["concurrent Run All of 00 + 01 in 6 servers, wall (s)"] = round(wall, 1)
    for nb in NOTEBOOKS:
        took = sorted(r.seconds for r in runs if r.path.endswith(nb))
        times[f"{nb} per learner, during it (s): min / max"] = f"{took[0]:.1f} / {took[-1]:.1f}"
    peak = sorted(memory.peak.values())
    times["memory per learner, peak PSS (MiB): min / median / max"] = (
        f"{peak[0] / 2**20:.0f} / {peak[len(peak) // 2] / 2**20:.0f} / {peak[-1] / 2**20:.0f}")
    cpu = sorted(memory.cpu.values())
    times["CPU seconds per learner during it: min / max"] = f"{cpu[0]:.0f} / {cpu[-1]:.0f}"
    times["load during the run"] = load_line()


def test_a_learner_cannot_read_another_learners_files(lane):
    ada = learners["ada"]
    # the REST API: another learner's server, and the hub's API about them
    assert ada.read(f"{COPY}/notebooks/01_autograd.ipynb", user="grace").status_code == 403
    assert ada.api("GET", "contents/", user="grace").status_code == 403
    # (the hub answers 404 about a user one may not see, so as not to say who exists)
    assert ada.hub_api("POST", "users/grace/server").status_code in (403, 404)
    assert ada.hub_api("GET", "users/grace").status_code in (403, 404)
    assert ada.hub_api("GET", "users").status_code == 403
    # the file system, from ada's own kernel
    other, venv = lane.account("grace").pw_dir, os.path.realpath(ROOT / ".venv")
    server_pid = max(lane.processes()[lane.prefix + "grace"])
    code = f"""
import os
tries = {{
    "list grace's home": lambda: os.listdir({other!r}),
    "read grace's notebook": lambda: open({other!r} + "/{COPY}/notebooks/01_autograd.ipynb").read(),
    "write into the shared .venv": lambda: open({venv!r} + "/pyvenv.cfg", "a"),
    "write into the instructor's clone": lambda: open({str(lane.clone)!r} + "/README.md", "a"),
    "signal grace's processes": lambda: os.kill({server_pid}, 0),
}}
for what, attempt in tries.items():
    try:
        attempt()
        print(what, "ALLOWED")
    except PermissionError:
        print(what, "refused")
"""
    outputs, error = ada.execute(f"{COPY}/notebooks/00_start_here.ipynb", code)
    assert not error, error
    text = "".join(o.get("text", "") for o in outputs)
    assert text.count("refused") == 5 and "ALLOWED" not in text, text
    # and ada's own work is hers
    assert ada.read(f"{COPY}/notebooks/01_autograd.ipynb").status_code == 200


def _view(who: Learner, what: str = "progress.json", lang: str = "en") -> requests.Response:
    return _api(who, f"/services/course-progress/{what}?lang={lang}")


def check_view(instructor: Learner) -> None:
    r = _view(instructor)
    assert r.status_code == 200, r.text[:300]
    states = {x["name"]: x["states"] for x in r.json()["learners"]}
    assert sorted(states) == sorted(NAMES), "the view lists the learners, not the instructor"
    assert {n: s["ch01"]["Q1"] for n, s in states.items()} == {n: EXPECTED_Q1.get(n, "not yet") for n in NAMES}
    page = _view(instructor, "")
    assert page.status_code == 200 and 'http-equiv="refresh"' in page.text
    assert "title='Q1: done'" in page.text and "title='Q1: tried'" in page.text
    zh = _view(instructor, "", lang="zh")
    assert "全班进度" in zh.text and "title='Q1: 已完成'" in zh.text and "title='Q1: 已尝试'" in zh.text
    rows = _view(instructor, "progress.csv").text.splitlines()
    assert rows[0] == "learner,chapter,exercise,state,checks,last check (UTC)"
    q1 = {row.split(",")[0]: row.split(",")[3] for row in rows if ",01_autograd,Q1," in row}
    assert q1 == {n: EXPECTED_Q1.get(n, "not yet") for n in NAMES}
    assert _view(instructor, "progress.csv", lang="zh").text.startswith("\ufeff学员,章节,练习,状态")


def test_the_instructors_view_shows_the_answers_and_refuses_learners(lane, instructor):
    check_view(instructor)
    # the hub's Services menu offers it to the instructor, not to a learner (pages, as in a browser)
    room = lane.room()
    teacher = instructor.hub.form_sign_in(room.instructor, room.admin_password)
    assert "/services/course-progress/" in teacher.get(f"{lane.url}/hub/home", timeout=60).text
    home = instructor.hub.form_sign_in("ada", passwords["ada"]).get(f"{lane.url}/hub/home", timeout=60)
    assert home.status_code == 200 and "/services/course-progress/" not in home.text
    for name in ("ada", BROWSER):
        for what in ("", "progress.csv", "progress.json"):
            assert _view(learners[name], what).status_code == 403, (name, what)


def test_the_view_reads_the_same_through_the_servers(lane, instructor):
    """Kubernetes' way (--source servers: each progress file through its learner's server, with a token
    that may access the servers) gives what the files give."""
    from deploy.hub import progress_view as V

    async def through_servers():
        view = V.View(V.Hub(f"{lane.url}/hub/api", instructor.token), "servers", lane.prefix, lane.url, "en", 10)
        return await view.learners()

    through = {x.name: (x.records, x.error) for x in asyncio.run(through_servers())}
    files = {x.name: (x.records, x.error) for x in V.read_from_files(NAMES, lane.prefix)}
    assert through == files and all(records for records, _ in files.values())


def _fingerprint(lane: Lane) -> dict[str, str]:
    """What every learner has made: their saved notebooks and their progress records, hashed."""
    found = {}
    for name in NAMES:
        home = Path(lane.account(name).pw_dir)
        for rel in [*(f"{COPY}/notebooks/{nb}" for nb in NOTEBOOKS), ".pytorch-in-depth/progress.jsonl"]:
            found[f"{name}:{rel}"] = hashlib.sha256((home / rel).read_bytes()).hexdigest()
    return found


def test_a_restarted_hub_keeps_every_learners_work(lane, hub, instructor):
    before = _fingerprint(lane)
    times["hub stop with 6 servers running (s)"] = round(lane.stop(), 1)
    assert not lane.processes(), f"the stopped hub left learners' processes: {lane.processes()}"
    for port in (lane.ports["port"], lane.ports["view_port"]):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers: the proxy or a service runs"
    # meanwhile the instructor updates the course: a new file, and a change to a file nobody edited
    (lane.clone / "notebooks" / "after-the-break.md").write_text("# After the break\n")
    errata = lane.clone / "docs" / "errata.md"
    errata.write_text(errata.read_text() + "\nUpdated during the workshop.\n")
    _git(["add", "-A"], lane.clone)
    _git(["commit", "-q", "-m", "after the break"], lane.clone)
    times["hub restart (s)"] = round(lane.start(cull_after_s=CULL_AFTER_S, cull_every_s=5, activity_interval_s=5), 1)

    def back(name: str) -> None:
        """The learner signs in again (their own password still opens their name), starts their server and
        finds their work at once (the culler, at 30 s, stops a server left idle)."""
        who = learners[name] = Learner(hub, name, hub.token(name, passwords[name], note="after the restart"))
        who.start_server()
        who.wait_ready()
        saved = who.read(f"{COPY}/notebooks/01_autograd.ipynb").json()["content"]
        q1 = next(c for c in saved["cells"] if c.get("id") == Q1_CELL)
        assert "".join(q1["source"]) == ANSWERS.get(name, "answer_q1 = ...  # a number\nq1.check(answer_q1)")
        assert q1["outputs"], f"{name}: the saved outputs are gone"
        assert who.read(f"{COPY}/notebooks/after-the-break.md").status_code == 200, f"{name}: no update"

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(NAMES)) as pool:
        for done in [pool.submit(back, name) for name in NAMES]:
            done.result()
    times["6 servers ready again after the restart (s)"] = round(time.monotonic() - t0, 1)
    assert _fingerprint(lane) == before, "a learner's notebook or progress changed across the restart"
    for name in NAMES:
        home = Path(lane.account(name).pw_dir)
        assert (home / COPY / "docs" / "errata.md").read_text() == errata.read_text(), f"{name}: update not merged"
    check_view(instructor)  # its token, like the learners' old ones, outlived the restart


def test_the_culler_stops_idle_servers(lane, instructor):
    t0 = time.monotonic()
    deadline = t0 + CULL_AFTER_S + 90
    running = set(NAMES)
    while running and time.monotonic() < deadline:
        users = {u["name"]: u for u in instructor.hub_api("GET", "users").json()}
        running = {n for n in NAMES if users[n].get("server") or users[n].get("pending")}
        time.sleep(2)
    assert not running, f"still running {time.monotonic() - t0:.0f} s after the last request: {sorted(running)}"
    times[f"culler: every idle server stopped (timeout {CULL_AFTER_S} s), after (s)"] = round(time.monotonic() - t0, 1)
    time.sleep(1)
    assert not lane.processes(), f"culled servers left processes: {lane.processes()}"
    log = lane.log.read_text()
    culled = {n for n in NAMES if f"DELETE /hub/api/users/{n}/server (idle-culler@" in log}
    assert culled == set(NAMES), f"the culler stopped {sorted(culled)}; the others stopped another way"
