"""A learner of the workshop hub, driven over HTTP as a program would: the login form, the REST API, and
notebooks run cell by cell in a real kernel of the learner's server through the hub's proxy (the Jupyter
server's REST API and kernel websocket), as JupyterLab's Run All would, saved back to the server.

    hub = Hub("http://127.0.0.1:8000")
    ada = hub.sign_in("ada", "her-own-password", room_password="abcd-efgh")
    ada.start_server(); ada.wait_ready()
    result = ada.run_notebook("pytorch-in-depth/notebooks/00_start_here.ipynb")
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import quote

import requests
import websocket

HTTP_TIMEOUT_S = 60
CELL_TIMEOUT_S = 300


class SignInError(AssertionError):
    pass


@dataclass
class Hub:
    url: str

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")

    def form_sign_in(self, name: str, password: str, room_password: str = "") -> requests.Session:
        """The login form, posted as a browser would (its _xsrf field and cookie); the session is signed in."""
        s = requests.Session()
        page = s.get(f"{self.url}/hub/login", timeout=HTTP_TIMEOUT_S)
        page.raise_for_status()
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        data = {"username": name, "password": password, "otp": room_password, "_xsrf": xsrf.group(1) if xsrf else ""}
        r = s.post(f"{self.url}/hub/login", data=data, allow_redirects=False, timeout=HTTP_TIMEOUT_S)
        if r.status_code != 302:
            why = re.search(r'class="login_error">([^<]*)<', r.text)
            raise SignInError(f"{name}: sign-in refused ({r.status_code}): {why.group(1) if why else r.text[:300]}")
        return s

    def token(self, name: str, password: str, note: str = "workshop test") -> str:
        """An API token, asked of the REST API with the name and password in the request's body."""
        r = requests.post(f"{self.url}/hub/api/users/{name}/tokens", timeout=HTTP_TIMEOUT_S,
                          json={"auth": {"username": name, "password": password}, "note": note})
        if r.status_code != 201:
            raise SignInError(f"{name}: no token ({r.status_code}): {r.text[:300]}")
        return r.json()["token"]

    def sign_in(self, name: str, password: str, room_password: str = "") -> Learner:
        """The first (or a later) sign-in through the form, then a token through the REST API."""
        self.form_sign_in(name, password, room_password)
        return Learner(self, name, self.token(name, password))


@dataclass
class CellRun:
    index: int
    cell_id: str
    seconds: float
    error: str = ""
    expected_error: bool = False


@dataclass
class NotebookRun:
    learner: str
    path: str
    seconds: float = 0.0
    cells: list[CellRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class Learner:
    hub: Hub
    name: str
    token: str

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def hub_api(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, f"{self.hub.url}/hub/api/{path}", headers=self._headers(),
                                timeout=HTTP_TIMEOUT_S, **kw)

    def api(self, method: str, path: str, user: str | None = None, **kw) -> requests.Response:
        """The Jupyter server API of `user`'s server (default: this learner's), through the proxy."""
        return requests.request(method, f"{self.hub.url}/user/{user or self.name}/api/{path}",
                                headers=self._headers(), timeout=HTTP_TIMEOUT_S, **kw)

    def start_server(self) -> None:
        r = self.hub_api("POST", f"users/{self.name}/server")
        assert r.status_code in (201, 202, 400), f"{self.name}: starting the server: {r.status_code} {r.text[:300]}"

    def server_state(self) -> dict | None:
        r = self.hub_api("GET", f"users/{self.name}")
        r.raise_for_status()
        return (r.json().get("servers") or {}).get("")

    def wait_ready(self, timeout_s: float = 300) -> float:
        """Until the server is ready; the seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            state = self.server_state()
            if state and state.get("ready"):
                return time.monotonic() - t0
            if state is None and time.monotonic() - t0 > 5:
                raise AssertionError(f"{self.name}: the server is not starting (it stopped or failed)")
            time.sleep(0.5)
        raise TimeoutError(f"{self.name}: the server was not ready within {timeout_s:.0f} s")

    def read(self, path: str, user: str | None = None) -> requests.Response:
        return self.api("GET", "contents/" + quote(path), user=user, params={"content": "1"})

    # --- kernels ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def kernel(self, path: str):
        """A kernel for the notebook `path` (a session, as JupyterLab opens one: it runs in the notebook's
        folder), and its websocket; deleted afterwards."""
        r = self.api("POST", "sessions", json={"path": path, "type": "notebook", "name": path.rsplit("/", 1)[-1],
                                                "kernel": {"name": "python3"}})
        assert r.status_code == 201, f"{self.name}: no kernel for {path}: {r.status_code} {r.text[:300]}"
        session = r.json()
        ws_url = (self.hub.url.replace("http", "ws", 1)
                  + f"/user/{self.name}/api/kernels/{session['kernel']['id']}/channels")
        ws = websocket.create_connection(ws_url + f"?session_id={uuid.uuid4().hex}", header=self._headers(),
                                         timeout=CELL_TIMEOUT_S)
        try:
            yield Kernel(ws, self.name)
        finally:
            ws.close()
            with contextlib.suppress(requests.RequestException):
                self.api("DELETE", f"sessions/{session['id']}")

    def execute(self, path: str, code: str) -> tuple[list[dict], str]:
        """Run `code` in a fresh kernel in `path`'s folder: its outputs, and its error ("" if none)."""
        with self.kernel(path) as k:
            return k.execute(code)

    def run_notebook(self, path: str, edit: dict[str, str] | None = None) -> NotebookRun:
        """Run All, as JupyterLab does it: every code cell in order in a fresh kernel, going past an error
        only in a cell tagged raises-exception; then the notebook with its outputs saved to the server.
        `edit`: new sources for cells, by cell id (the learner's answers)."""
        run = NotebookRun(self.name, path)
        r = self.read(path)
        assert r.status_code == 200, f"{self.name}: cannot open {path}: {r.status_code}"
        nb = r.json()["content"]
        t0 = time.monotonic()
        with self.kernel(path) as k:
            count = 0
            for i, cell in enumerate(nb["cells"]):
                if edit and cell.get("id") in edit:
                    cell["source"] = edit[cell["id"]]
                if cell["cell_type"] != "code":
                    continue
                source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])
                count += 1
                c0 = time.monotonic()
                outputs, error = k.execute(source)
                cell["outputs"], cell["execution_count"] = outputs, count
                run.cells.append(CellRun(i, cell.get("id", ""), time.monotonic() - c0, error, expected))
                if error and not expected:
                    run.problems.append(f"cell {i} ({cell.get('id')}) raised {error}")
                    break
                if expected and not error:
                    run.problems.append(f"cell {i} ({cell.get('id')}) is tagged raises-exception but raised nothing")
        run.seconds = time.monotonic() - t0
        r = self.api("PUT", "contents/" + quote(path), json={"type": "notebook", "format": "json", "content": nb})
        if r.status_code != 200:
            run.problems.append(f"saving {path} failed: {r.status_code} {r.text[:200]}")
        return run


def _message(frame: str | bytes) -> dict:
    """A kernel message from a websocket frame: JSON text, or (a message with binary buffers, such as a
    widget's) a binary frame: the number of parts and their offsets as big-endian 32-bit integers, then
    the message's JSON, then the buffers."""
    if isinstance(frame, str):
        return json.loads(frame)
    count = int.from_bytes(frame[:4], "big")
    offsets = [int.from_bytes(frame[4 + 4 * i: 8 + 4 * i], "big") for i in range(count)] + [len(frame)]
    return json.loads(frame[offsets[0]:offsets[1]].decode())


class Kernel:
    """The kernel's websocket, in Jupyter's JSON message protocol."""

    def __init__(self, ws: websocket.WebSocket, username: str):
        self.ws, self.username, self.session = ws, username, uuid.uuid4().hex

    def execute(self, code: str, timeout_s: float = CELL_TIMEOUT_S) -> tuple[list[dict], str]:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.username, "session": self.session,
                       "msg_type": "execute_request", "version": "5.3", "date": dt.datetime.now(dt.UTC).isoformat()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        outputs: list[dict] = []
        error, idle, replied = "", False, False
        deadline = time.monotonic() + timeout_s
        while not (idle and replied):
            self.ws.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                msg = _message(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                raise TimeoutError(f"a cell ran over {timeout_s:.0f} s:\n{code[:300]}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"a cell ran over {timeout_s:.0f} s:\n{code[:300]}")
            if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg.get("content", {})
            if msg.get("channel") == "shell" and kind == "execute_reply":
                replied = True
                if content.get("status") == "error" and not error:
                    error = f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "status" and content.get("execution_state") == "idle":
                idle = True
            elif kind == "stream":
                outputs.append({"output_type": "stream", "name": content["name"], "text": content["text"]})
            elif kind in ("display_data", "execute_result"):
                out = {"output_type": kind, "data": content.get("data", {}), "metadata": content.get("metadata", {})}
                if kind == "execute_result":
                    out["execution_count"] = content.get("execution_count")
                outputs.append(out)
            elif kind == "error":
                error = f"{content.get('ename')}: {content.get('evalue')}"
                outputs.append({"output_type": "error", "ename": content.get("ename", ""),
                                "evalue": content.get("evalue", ""), "traceback": content.get("traceback", [])})
        return outputs, error
