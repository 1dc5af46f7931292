"""The workshop hub's pieces that run without a hub (deploy/hub/): the room's settings, the learners' own
passwords, what the learners' accounts can reach, the threads per kernel, the sign-in rules, the
configuration JupyterHub reads, the instructor's view (page, CSV, languages), nbgitpuller keeping a
learner's edits, and the task runner's checks. The hub itself runs in the hub lane (tests/hub/,
``make test-hub``), which also runs this file after installing JupyterHub."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the workshop hub runs on a Linux server", allow_module_level=True)

from course_utils import ROOT, progress  # noqa: E402
from course_utils.i18n import speaking  # noqa: E402
from deploy.hub import room as R  # noqa: E402

sys.path.insert(0, str(ROOT))
import tasks  # noqa: E402


@pytest.mark.parametrize(("cores", "learners", "threads"), [(2, 6, 1), (16, 30, 1), (64, 30, 2), (32, 8, 4), (8, 1, 8)])
def test_threads_per_kernel_share_the_cores_among_the_learners(cores, learners, threads):
    assert R.threads_per_kernel(cores, learners) == threads


def test_threads_per_kernel_refuses_nonsense():
    with pytest.raises(ValueError, match="at least 1"):
        R.threads_per_kernel(0, 30)


@pytest.mark.parametrize(("name", "ok"), [("ada", True), ("li-wei", True), ("team_3", True), ("Ada", False),
                                          ("3ada", False), ("a" * 24, False), ("a" * 23, True), ("root/x", False),
                                          ("", False), ("ad a", False)])
def test_learner_names_fit_a_system_account(name, ok):
    assert R.valid_name(name) is ok
    if ok:
        assert len(R.ACCOUNT_PREFIX + name) <= 32


@pytest.fixture
def open_folder():
    """A temporary folder every account may pass (pytest's own is under a folder of mode 700)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="course-hub-reach-", dir="/tmp" if os.path.isdir("/tmp") else None))
    folder.chmod(0o755)
    if R.unreachable(folder) is not None:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"no temporary folder every account may pass here ({R.unreachable(folder)})")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_other_accounts_cannot_pass_is_named(open_folder):
    course = open_folder / "home" / "course"
    course.mkdir(parents=True)
    (course / "README.md").write_text("hi")
    (open_folder / "home").chmod(0o700)
    assert R.unreachable(course / "README.md") == (open_folder / "home", "o+x")
    problem = R.reach_problem(course, "the instructor's clone")
    assert f"{open_folder / 'home'} is drwx------" in problem and f"chmod o+x {open_folder / 'home'}" in problem
    (open_folder / "home").chmod(0o711)
    assert R.unreachable(course / "README.md") is None
    (course / "README.md").chmod(0o600)
    assert R.unreachable(course / "README.md") == (course / "README.md", "o+r")
    assert "let other accounts read it" in R.reach_problem(course / "README.md", "a file")


def test_the_rooms_settings_are_saved_for_root_alone(tmp_path):
    room = R.Room(state=str(tmp_path / "state"), root=str(ROOT), venv="/v", repo="/r", branch="main",
                  room_password="abcd-efgh", admin_password="x" * 40, learners=12)
    path = room.save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert R.Room.load(tmp_path / "state") == room
    with pytest.raises(SystemExit, match="make hub"):
        R.Room.load(tmp_path / "nowhere")


def test_a_learners_own_password_opens_their_name_and_nothing_else(tmp_path):
    claims = R.Claims(tmp_path / "claims.json")
    assert not claims.taken("ada")
    claims.claim("ada", "ada-own-password")
    assert stat.S_IMODE((tmp_path / "claims.json").stat().st_mode) == 0o600
    assert "ada-own-password" not in (tmp_path / "claims.json").read_text()
    assert claims.verify("ada", "ada-own-password")
    assert not claims.verify("ada", "ada-own-passwore") and not claims.verify("grace", "ada-own-password")
    with pytest.raises(ValueError, match="taken"):
        claims.claim("ada", "another-password")
    assert claims.release("ada") and not claims.taken("ada") and not claims.release("ada")
    (tmp_path / "claims.json").write_text(json.dumps({"bob": {"salt": "zz", "scrypt": 3}}))
    assert not claims.verify("bob", "anything")  # a damaged entry opens nothing


def test_a_whole_room_signing_in_at_once_loses_no_name(tmp_path):
    """The hub checks passwords in threads: 30 first sign-ins at once must leave 30 names taken."""
    import concurrent.futures

    claims = R.Claims(tmp_path / "claims.json")
    names = [f"learner{i}" for i in range(30)]
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        list(pool.map(lambda n: claims.claim(n, n + "-password"), names))
    assert claims.names() == sorted(names)
    assert all(claims.verify(n, n + "-password") for n in names[::7])


def test_a_room_password_is_easy_to_write_on_a_board():
    words = R.make_password()
    assert len(words) >= R.PASSWORD_MIN and all(c in "abcdefghjkmnpqrstuvwxyz23456789-" for c in words)
    assert words != R.make_password()


def test_stopping_processes_refuses_a_system_account():
    with pytest.raises(ValueError, match="system account"):
        R.stop_processes(0)
    with pytest.raises(ValueError, match="system account"):
        R.remove_temporary_files(0)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="gives files to another uid: root")
def test_a_removed_learners_files_in_tmp_go_and_no_one_elses(tmp_path):
    learner, other = 61001, 61002  # numbers no account has here
    (tmp_path / "torchinductor_course-ada").mkdir()
    (tmp_path / "torchinductor_course-ada" / "cache").write_text("x")
    (tmp_path / "kernel-notes.txt").write_text("x")
    (tmp_path / "someone-elses").mkdir()
    (tmp_path / "mine.txt").write_text("x")
    for name in ("torchinductor_course-ada", "torchinductor_course-ada/cache", "kernel-notes.txt"):
        os.chown(tmp_path / name, learner, learner)
    os.chown(tmp_path / "someone-elses", other, other)
    removed = R.remove_temporary_files(learner, str(tmp_path))
    assert removed == ["kernel-notes.txt", "torchinductor_course-ada"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt", "someone-elses"]


# --- the sign-in rules (RoomAuthenticator) ------------------------------------------------------


@pytest.fixture
def authenticator(tmp_path):
    pytest.importorskip("jupyterhub", reason="JupyterHub is installed by make hub / make test-hub")
    from deploy.hub.authenticator import RoomAuthenticator

    return RoomAuthenticator(user_password="room-pass-1", admin_password="a" * 32, admin_users={"teacher"},
                             claims_file=str(tmp_path / "claims.json"))


def _sign_in(auth, name, password, room=""):
    return asyncio.run(auth.get_authenticated_user(None, {"username": name, "password": password, "otp": room}))


def test_the_room_password_takes_a_free_name_once(authenticator):
    from deploy.hub.authenticator import SignInRefused

    with pytest.raises(SignInRefused, match="free. To take it"):
        _sign_in(authenticator, "ada", "ada-own-password")
    with pytest.raises(SignInRefused, match="room password is not right"):
        _sign_in(authenticator, "ada", "ada-own-password", "room-pass-2")
    with pytest.raises(SignInRefused, match="at least 8 characters"):
        _sign_in(authenticator, "ada", "short", "room-pass-1")
    with pytest.raises(SignInRefused, match="not the room password"):
        _sign_in(authenticator, "ada", "room-pass-1", "room-pass-1")
    assert _sign_in(authenticator, "ada", "ada-own-password", "room-pass-1")["name"] == "ada"
    assert _sign_in(authenticator, "ADA", "ada-own-password")["admin"] is False  # names are lower case
    with pytest.raises(SignInRefused, match="taken"):
        _sign_in(authenticator, "ada", "room-pass-1", "room-pass-1")  # the room password opens no taken name
    with pytest.raises(SignInRefused, match="lower-case letters"):
        _sign_in(authenticator, "../etc", "whatever-pass", "room-pass-1")


def test_the_instructor_signs_in_with_the_admin_password_only(authenticator):
    assert _sign_in(authenticator, "teacher", "a" * 32)["admin"] is True
    assert _sign_in(authenticator, "teacher", "room-pass-1", "room-pass-1") is None
    assert authenticator.request_otp and "Room password" in authenticator.otp_prompt


def test_refusals_speak_chinese_in_a_chinese_room(authenticator):
    from deploy.hub.authenticator import SignInRefused

    authenticator.lang = "zh"
    with pytest.raises(SignInRefused, match="教室密码不对"):
        _sign_in(authenticator, "ada", "ada-own-password", "wrong-room")


# --- the configuration JupyterHub reads -----------------------------------------------------------


def test_the_hub_configuration_reads_the_room(tmp_path, monkeypatch):
    pytest.importorskip("jupyterhub", reason="JupyterHub is installed by make hub / make test-hub")
    from traitlets.config import Config

    room = R.Room(state=str(tmp_path), root=str(ROOT), venv="/srv/course/.venv", repo="/srv/course", branch="main",
                  learners=30, cores=16, threads=1, room_password="abcd-efgh", admin_password="a" * 40,
                  instructor="teacher", cull_after_s=1800, lang="zh", safe_directories=["/srv/course/.git"])
    room.save()
    monkeypatch.setenv("COURSE_HUB_STATE", str(tmp_path))
    c = Config()
    code = (ROOT / "deploy" / "hub" / "jupyterhub_config.py").read_text()
    exec(compile(code, "jupyterhub_config.py", "exec"),
         {"c": c, "__file__": str(ROOT / "deploy/hub/jupyterhub_config.py")})
    assert c.JupyterHub.authenticator_class == "deploy.hub.authenticator.RoomAuthenticator"
    assert c.RoomAuthenticator.admin_users == {"teacher"} and c.RoomAuthenticator.user_password == "abcd-efgh"
    assert c.Spawner.cmd == ["/srv/course/.venv/bin/python", str(ROOT / "deploy" / "hub" / "start_server.py")]
    assert c.Spawner.default_url.endswith("/notebooks-zh/00_start_here.ipynb")
    env = c.Spawner.environment
    assert env["OMP_NUM_THREADS"] == "1" and env["COURSE_PROGRESS"] == "1" and env["COURSE_HUB_REPO"] == "/srv/course"
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert services["idle-culler"]["command"][-1] == "--timeout=1800"
    assert "--source" in services["course-progress"]["command"]
    roles = {r["name"]: set(r["scopes"]) for r in c.JupyterHub.load_roles}
    assert roles["idle-culler"] == {"list:users", "read:users:activity", "read:servers", "delete:servers"}
    assert "access:servers" not in roles["course-progress"], "reading files needs no access to the servers"
    assert c.ConfigurableHTTPProxy.command[0].endswith("deploy/hub/node_modules/.bin/configurable-http-proxy")


# --- the instructor's view ------------------------------------------------------------------------


def _records(*rows):
    return [{"time": f"2026-12-06T09:0{i}:00Z", "chapter": ch, "exercise": ex, "status": st}
            for i, (ch, ex, st) in enumerate(rows)]


@pytest.fixture
def view_data():
    from deploy.hub import progress_view as V

    known = {"ch00": ["Practice"], "ch01": ["Q1", "Q2"]}
    learners = [V.Learner("ada", _records(("ch01", "Q1", "incorrect"), ("ch01", "Q1", "correct"))),
                V.Learner("grace", _records(("ch01", "Q1", "incorrect"), ("ch01", "Q2", "not_attempted"))),
                V.Learner("alan", error="no account")]
    return V, learners, known, {"ch00": "00_start_here", "ch01": "01_autograd"}


def test_the_view_shows_done_tried_and_not_yet_per_learner_and_chapter(view_data):
    V, learners, known, titles = view_data
    with speaking("en"):
        page = V.page_html(learners, known, titles, lang="en", refresh_s=10, now=dt.datetime(2026, 12, 6, 9, 30))
    assert '<meta http-equiv="refresh" content="10">' in page
    ada = page.split("<td>ada</td>")[1].split("</tr>")[0]
    assert "title='Q1: done'" in ada and "title='Q2: not yet'" in ada and "1/2" in ada
    grace = page.split("<td>grace</td>")[1].split("</tr>")[0]
    assert "title='Q1: tried'" in grace and "0/2" in grace
    assert "(no account)" in page and 'href="progress.csv?lang=en"' in page and "?lang=zh" in page
    assert "<td>grace</td></tr>" in page  # the exercise table names who tried and is not done yet


def test_the_view_in_chinese(view_data):
    V, learners, known, titles = view_data
    with speaking("zh"):
        page = V.page_html(learners, known, titles, lang="zh", refresh_s=10, now=dt.datetime(2026, 12, 6, 9, 30))
        text = V.csv_text(learners, known, titles)
    assert '<html lang="zh-CN">' in page and "全班进度" in page and "title='Q1: 已完成'" in page
    assert text.splitlines()[0] == "学员,章节,练习,状态,检查次数,最后一次检查（UTC）"
    assert "ada,01_autograd,Q1,已完成,2,2026-12-06T09:01:00Z" in text


def test_the_csv_has_a_row_per_learner_and_exercise(view_data):
    V, learners, known, titles = view_data
    with speaking("en"):
        rows = V.csv_text(learners, known, titles).splitlines()
    assert rows[0] == "learner,chapter,exercise,state,checks,last check (UTC)"
    assert len(rows) == 1 + 3 * 3
    assert "grace,01_autograd,Q1,tried,1,2026-12-06T09:00:00Z" in rows
    assert "grace,01_autograd,Q2,not yet,1,2026-12-06T09:01:00Z" in rows
    assert "alan,00_start_here,Practice,not yet,0," in rows


def test_names_and_notes_are_escaped_in_the_page(view_data):
    V, _, known, titles = view_data
    with speaking("en"):
        page = V.page_html([V.Learner("x<script>", error="<b>")], known, titles, lang="en", refresh_s=5,
                           now=dt.datetime(2026, 12, 6))
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>" not in page


@pytest.mark.parametrize(("asked", "accept", "default", "want"), [
    ("zh", "en-US", "en", "zh"), (None, "zh-CN,zh;q=0.9", "en", "zh"), (None, "fr-FR", "zh", "zh"),
    ("en", "zh-CN", "zh", "en"), (None, None, "en", "en"), ("klingon", None, "en", "en")])
def test_the_views_language(asked, accept, default, want):
    from deploy.hub import progress_view as V

    assert V.choose_lang(asked, accept, default) == want


def test_the_view_reads_each_learners_own_progress_file(tmp_path, monkeypatch):
    from deploy.hub import progress_view as V

    home = tmp_path / "course-ada"
    path = home / ".pytorch-in-depth" / "progress.jsonl"
    for rec in _records(("ch01", "Q1", "correct")):
        progress.append(path, rec)
    accounts = {"course-ada": types.SimpleNamespace(pw_dir=str(home)),
                "course-grace": types.SimpleNamespace(pw_dir=str(tmp_path / "course-grace"))}

    def getpwnam(name):
        return accounts[name]

    monkeypatch.setattr(V.pwd, "getpwnam", getpwnam)
    ada, grace, alan = V.read_from_files(["ada", "grace", "alan"], "course-")
    assert [r["exercise"] for r in ada.records] == ["Q1"] and not ada.error
    assert grace.records == [] and not grace.error  # no check yet
    assert alan.error == "no account"


# --- nbgitpuller keeps a learner's edits ----------------------------------------------------------


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=I", "-c", "user.email=i@example.org", *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def test_an_update_never_loses_a_learners_edits(tmp_path, monkeypatch):
    """start_server.pull, twice: the first makes the copy, the second brings the instructor's changes
    (a changed file, a new one) and keeps the learner's (an edited file, one the instructor changed too,
    a new file of theirs)."""
    pytest.importorskip("nbgitpuller", reason="nbgitpuller is installed by make hub / make test-hub")
    from deploy.hub import start_server

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    origin, copy = tmp_path / "origin", tmp_path / "copy"
    origin.mkdir()
    (origin / "a.txt").write_text("one\ntwo\nthree\n")
    (origin / "b.txt").write_text("b\n")
    (origin / "c.txt").write_text("c\n")
    _git(origin, "init", "-q", "-b", "course", ".")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-q", "-m", "v1")
    assert start_server.pull(str(origin), "course", copy)
    (copy / "a.txt").write_text("one\nMY ANSWER\nthree\n")  # the learner's edit
    (copy / "c.txt").write_text("mine\n")  # the learner's edit of a file the instructor also changes
    (copy / "notes.txt").write_text("my notes\n")
    (origin / "b.txt").write_text("b, corrected\n")
    (origin / "c.txt").write_text("instructor's\n")
    (origin / "new.txt").write_text("new\n")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-q", "-m", "v2")
    assert start_server.pull(str(origin), "course", copy)
    assert (copy / "a.txt").read_text() == "one\nMY ANSWER\nthree\n"
    assert (copy / "c.txt").read_text() == "mine\n", "where both changed a line, the learner's line stays"
    assert (copy / "notes.txt").read_text() == "my notes\n"
    assert (copy / "b.txt").read_text() == "b, corrected\n" and (copy / "new.txt").read_text() == "new\n"


def test_a_failed_update_is_said_and_the_server_starts_anyway(tmp_path, capsys):
    pytest.importorskip("nbgitpuller", reason="nbgitpuller is installed by make hub / make test-hub")
    from deploy.hub import start_server

    assert not start_server.pull(str(tmp_path / "no-such-clone"), "course", tmp_path / "copy")
    assert "failed; starting on the copy as it is" in capsys.readouterr().err


# --- the task runner ------------------------------------------------------------------------------


def test_freeze_changes_tell_an_addition_from_a_change():
    before = ["numpy==2.3.0", "torch==2.14.1"]
    after = ["numpy==2.3.0", "torch==2.14.1", "jupyterhub==6.1.1", "SQLAlchemy==2.1.9"]
    assert tasks.freeze_changes(before, after) == (["jupyterhub==6.1.1", "SQLAlchemy==2.1.9"], [])
    assert tasks.freeze_changes(before, ["numpy==2.4.0", "torch==2.14.1"]) == (["numpy==2.4.0"], ["numpy==2.3.0"])


def test_the_hub_pins_are_exact_and_apart_from_the_courses():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "deploy/hub/requirements.txt").read_text().splitlines()]
    pins = [ln for ln in lines if ln]
    assert all("==" in p for p in pins) and {"jupyterhub==6.1.1", "jupyterhub-idle-culler==2.0.0",
                                              "nbgitpuller==1.3.0"} <= set(pins)
    course = {ln.split("==")[0].lower() for ln in (ROOT / "requirements.txt").read_text().splitlines() if "==" in ln}
    assert not course & {p.split("==")[0].lower() for p in pins}, "a hub pin would change a course pin"
    lock = json.loads((ROOT / "deploy/hub/package-lock.json").read_text())
    assert lock["packages"]["node_modules/configurable-http-proxy"]["version"] == "5.3.0"
    assert json.loads((ROOT / "deploy/hub/package.json").read_text())["dependencies"] == {
        "configurable-http-proxy": "5.3.0"}


def test_the_hub_needs_root_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(tasks.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit):
        tasks.cmd_hub(["--setup-only"])
    err = capsys.readouterr().err
    assert "must run as root" in err and "sudo make hub" in err


# --- beyond one server: Kubernetes and Binder -----------------------------------------------------


def test_the_kubernetes_files_name_what_exists():
    """values.yaml starts what the repository has, and the Dockerfiles copy files that exist."""
    yaml = pytest.importorskip("yaml")
    import re

    values = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "values.yaml").read_text())
    assert values["singleuser"]["cmd"] == ["/opt/course/.venv/bin/python", "/opt/course/deploy/hub/start_server.py"]
    assert {"COURSE_HUB_REPO", "COURSE_HUB_BRANCH", "COURSE_PROGRESS"} <= set(values["singleuser"]["extraEnv"])
    module, _, cls = values["hub"]["config"]["JupyterHub"]["authenticator_class"].rpartition(".")
    assert module == "deploy.hub.authenticator" and cls == "RoomPasswordAuthenticator"
    view = values["hub"]["services"]["course-progress"]
    assert view["command"][:3] == ["python3", "-m", "deploy.hub.progress_view"] and "servers" in view["command"]
    assert "access:servers" in values["hub"]["loadRoles"]["course-progress"]["scopes"]
    assert view["url"].endswith(":8090") and values["hub"]["service"]["extraPorts"][0]["port"] == 8090
    for dockerfile in ("singleuser.Dockerfile", "hub.Dockerfile"):
        text = (ROOT / "deploy" / "kubernetes" / dockerfile).read_text().replace("\\\n", " ")
        for line in re.findall(r"^COPY (.+)$", text, re.M):
            for src in line.split()[:-1]:
                assert (ROOT / src).exists(), f"{dockerfile} copies {src}, which does not exist"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "deploy/hub/node_modules" in ignored


def test_binder_installs_the_course_pins():
    lines = [ln.strip() for ln in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines == ["--extra-index-url https://download.pytorch.org/whl/cpu", "-r ../requirements.txt"]
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    for script in ("postBuild", "start"):
        assert os.access(ROOT / "binder" / script, os.X_OK), f"binder/{script} must be executable"
    assert 'exec "$@"' in (ROOT / "binder" / "start").read_text()
