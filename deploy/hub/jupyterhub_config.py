"""JupyterHub's configuration for a workshop room, read by ``make hub`` (python tasks.py hub), which
writes the room's decisions to ``room.json`` in the hub's state folder ($COURSE_HUB_STATE) first.

- sign-in: the room password takes a name once, the learner's own password after that; the instructor
  is the admin (authenticator.py);
- one system account per learner, created at the first sign-in; each server runs as it, from the
  course's shared .venv (read-only for learners), on the learner's own copy of the course, pulled from
  the instructor's clone without losing their edits (spawner.py, start_server.py);
- threads per kernel from the cores and the learners (OMP_NUM_THREADS and friends);
- services: the idle culler, and the instructor's live view of the class (progress_view.py, admins only);
- the proxy: configurable-http-proxy from deploy/hub/node_modules (package-lock.json, `npm ci`).
"""

# ruff: noqa: F821  (`c` is the configuration object JupyterHub passes in)

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from course_utils import inventory  # noqa: E402
from deploy.hub import room as room_module  # noqa: E402

room = room_module.Room.load(os.environ.get("COURSE_HUB_STATE") or os.getcwd())
state = Path(room.state)
venv_python = str(Path(room.venv) / "bin" / "python")
here = Path(__file__).resolve().parent

# --- the hub, its database and its proxy ----------------------------------------------------------
c.JupyterHub.bind_url = f"{'https' if room.ssl_cert else 'http'}://{room.ip}:{room.port}"
if room.ssl_cert:
    c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = room.ssl_cert, room.ssl_key
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = room.hub_port
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [str(here / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{room.proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
c.JupyterHub.last_activity_interval = room.activity_interval_s  # how often the hub reads the proxy's activity
c.JupyterHub.cleanup_servers = True  # stopping the hub stops the learners' servers (their files stay)
c.JupyterHub.template_vars = {"announcement_login": (
    "First time here? Pick a name, choose your own password, and type the room password in the third "
    "field. Next time: your name and your own password.<br>第一次来？起一个名字，设置你自己的密码，并在第三个"
    "输入框填写教室密码。以后登录：你的名字和你自己的密码。")}

# --- who signs in ---------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "deploy.hub.authenticator.RoomAuthenticator"
c.RoomAuthenticator.user_password = room.room_password
c.RoomAuthenticator.admin_password = room.admin_password
c.RoomAuthenticator.admin_users = {room.instructor}
c.RoomAuthenticator.claims_file = str(state / "claims.json")
c.RoomAuthenticator.account_prefix = room.account_prefix
c.RoomAuthenticator.group = room.group
c.RoomAuthenticator.home_base = room.home_base
c.RoomAuthenticator.lang = room.lang

# --- the learners' servers ------------------------------------------------------------------------
c.JupyterHub.spawner_class = "deploy.hub.spawner.RoomSpawner"
c.RoomSpawner.account_prefix = room.account_prefix
c.RoomSpawner.group = room.group
c.RoomSpawner.home_base = room.home_base
c.Spawner.cmd = [venv_python, str(here / "start_server.py")]
c.Spawner.notebook_dir = "~"
edition = "notebooks-zh" if room.lang == "zh" else "notebooks"
first = inventory.CHAPTERS[0].notebook  # the first chapter (00_start_here.ipynb)
c.Spawner.default_url = f"/lab/tree/{room_module.COURSE_FOLDER}/{edition}/{first}"
c.Spawner.args = [
    # offline by design, as `make lab`: no news feed, no update check
    "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    # the progress file sits in a hidden folder: the view reads it through the server on Kubernetes
    "--ContentsManager.allow_hidden=True",
]
c.Spawner.start_timeout = 300  # the first start clones the course on a busy machine
c.Spawner.http_timeout = 180
threads = str(room.threads)
c.Spawner.environment = {
    "PATH": f"{Path(room.venv) / 'bin'}:/usr/local/bin:/usr/bin:/bin",  # a terminal's python is the course's
    "LANG": "C.UTF-8",
    "COURSE_PROGRESS": "1",  # every q.check() recorded in ~/.pytorch-in-depth/progress.jsonl, for the view
    "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
    "COURSE_HUB_REPO": room.repo,
    "COURSE_HUB_BRANCH": room.branch,
    "COURSE_HUB_FOLDER": room_module.COURSE_FOLDER,
    "COURSE_HUB_SAFE_DIRECTORIES": os.pathsep.join(room.safe_directories),
    "JUPYTERHUB_ACTIVITY_INTERVAL": str(room.activity_interval_s),
}
if room.lang == "zh":
    c.Spawner.environment["COURSE_LANG"] = "zh"

# --- services: the idle culler and the instructor's view ------------------------------------------
culler = [venv_python, "-m", "jupyterhub_idle_culler", f"--timeout={room.cull_after_s}"]
if room.cull_every_s:
    culler.append(f"--cull-every={room.cull_every_s}")
c.JupyterHub.services = [
    {"name": "idle-culler", "command": culler},
    {
        "name": "course-progress",
        "display": True,  # in the hub's Services menu, for those who may open it (admins)
        "url": f"http://127.0.0.1:{room.view_port}",
        "command": [venv_python, "-m", "deploy.hub.progress_view", "--source", "files",
                    "--lang", room.lang, "--account-prefix", room.account_prefix],
        "cwd": str(ROOT),
        "environment": {"PYTHONPATH": str(ROOT)},
        # who may open it: users with the scope access:services!service=course-progress (the hub's
        # default for a service), which only the admin role holds; learners get 403
        "oauth_no_confirm": True,
    },
]
c.JupyterHub.load_roles = [
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
    {"name": "course-progress", "services": ["course-progress"], "scopes": ["list:users", "read:users"]},
]
