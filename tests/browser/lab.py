"""The course's own JupyterLab, started the way ``make lab`` starts it, on a copy of the notebooks, and
driven by Debian's Chromium through Playwright (the browser lane, ``make test-browser``).

    with course_lab(tmp_path) as lab, browser() as b:
        page = lab.open(b, "00_start_here.ipynb")
        lab.run_all(page)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
START_TIMEOUT_S = 180  # a first start on a loaded 2-core machine is slow, not dead
RUN_TIMEOUT_S = 420  # Run All of the slowest notebook, with room for a loaded machine


def chromium_path() -> str | None:
    """The system browser (Playwright's own download is not reachable offline)."""
    for name in CHROMIUM:
        found = shutil.which(name)
        if found:
            return found
    return None


# JupyterLab renders only the cells in view of a long notebook by default ("windowing"): every cell
# must be in the page for the checks to see it. The news feed and update check are off in the
# course's lab itself (tasks.py); these settings keep the page from asking for them too.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def _outside(url: str) -> bool:
    """A request to a host other than this machine (data:, blob: and about: URLs are no requests)."""
    if url.startswith(("data:", "blob:", "about:")):
        return False
    host = url.split("/")[2] if "://" in url else ""
    return host.rsplit(":", 1)[0].strip("[]") not in ("127.0.0.1", "localhost", "::1")


@dataclass
class Lab:
    url: str
    token: str
    root: Path  # the copy of notebooks/ the lab serves
    proc: subprocess.Popen
    log: Path

    def open(self, browser, notebook: str):
        """A new page on `notebook` in a context of its own, in which every request to a host other than
        localhost (from any tab or worker of the context) is recorded in ``page.outside_requests``.
        (Refusing them with ``context.route`` would be stricter, but with request interception on, the
        lab never starts its kernel.)"""
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        outside: list[str] = []
        context.on("request", lambda r: outside.append(r.url) if _outside(r.url) and r.url not in outside else None)
        page = context.new_page()
        page.outside_requests = outside
        page.console_lines = []
        page.on("console", lambda m: page.console_lines.append(f"{m.type}: {m.text}"))
        page.on("crash", lambda _: page.console_lines.append("the page's renderer crashed"))
        page.set_default_timeout(START_TIMEOUT_S * 1000)
        # a workspace of its own, reset: the page shows this notebook alone (the default workspace would
        # reopen every notebook opened before, each with its kernel)
        workspace = notebook.removesuffix(".ipynb").replace("_", "-")
        page.goto(f"{self.url}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=START_TIMEOUT_S * 1000)
        self.wait_for_kernel(notebook, START_TIMEOUT_S)  # the page shows "idle" before it has a kernel
        self.wait_idle(page, timeout_s=START_TIMEOUT_S)
        return page

    def api(self, path: str, token: bool = True):
        url = f"{self.url}/api/{path}" + (f"?token={self.token}" if token else "")
        return json.loads(urllib.request.urlopen(url, timeout=30).read())

    def wait_for_kernel(self, notebook: str, timeout_s: float) -> None:
        """Until the server has a session for `notebook` whose kernel is idle."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                for sess in self.api("sessions"):
                    names = (sess.get("path") or "", sess.get("name") or "",
                             (sess.get("notebook") or {}).get("path") or "")
                    if (any(n.endswith(notebook) for n in names)
                            and (sess.get("kernel") or {}).get("execution_state") == "idle"):
                        return
            time.sleep(0.5)
        raise TimeoutError(f"{notebook}: the lab started no kernel within {timeout_s:.0f} s; its log ends:\n"
                           + self.log.read_text()[-2000:])

    def shutdown_kernels(self) -> None:
        """Stop every kernel the lab runs (a closed page leaves its kernel running)."""
        for k in self.api("kernels"):
            urllib.request.urlopen(urllib.request.Request(
                f"{self.url}/api/kernels/{k['id']}?token={self.token}", method="DELETE"), timeout=60)

    @staticmethod
    def kernel_status(page) -> str:
        return page.evaluate("""() => {
            const el = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return el ? (el.getAttribute('data-status') || '') : '';
        }""")

    def wait_idle(self, page, timeout_s: float) -> None:
        """Until the kernel is idle and no cell is queued or running (``[*]``)."""
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while time.monotonic() < deadline:
            busy = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
                .some(p => p.textContent.includes('*'))""")
            status = self.kernel_status(page)
            quiet = quiet + 1 if (not busy and status == "idle") else 0
            if quiet >= 3:
                return
            time.sleep(0.5)
        running = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]
            .findIndex(c => (c.querySelector('.jp-InputPrompt') || {textContent: ''}).textContent.includes('*'))""")
        raise TimeoutError(f"the notebook did not finish within {timeout_s:.0f} s (kernel: {self.kernel_status(page)}; "
                           f"first cell still waiting or running: {running}); the lab's log ends:\n"
                           + self.log.read_text()[-1500:])

    def run_all(self, page, timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Run > Run All Cells, from the menu, as a learner would; the seconds until it is done."""
        t0 = time.monotonic()
        page.click("li.lm-MenuBar-item:has-text('Run')")
        page.click(".lm-Menu-item:has-text('Run All Cells')")
        # the copy has no outputs and no execution counts: a prompt with a number or a star is this run's
        page.wait_for_function("""() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
            .some(p => p.textContent.includes('*') || /\\[\\d+\\]/.test(p.textContent))""",
                               timeout=START_TIMEOUT_S * 1000)
        self.wait_idle(page, timeout_s)
        return time.monotonic() - t0


@contextlib.contextmanager
def course_lab(tmp: Path, notebooks: Path | None = None, command: str = "lab") -> Iterator[Lab]:
    """``python tasks.py lab`` (or `command`: ``lab-zh``) on a copy of notebooks/ (the lab saves what it
    runs), on a free port with a token of our own; stopped, with every process it started, on the way out."""
    root = tmp / "notebooks"
    shutil.copytree(notebooks or ROOT / "notebooks", root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "runs", "*.out"))
    for nb in root.glob("*.ipynb"):  # as a learner's "Clear All Outputs": what the page shows, this run made
        data = json.loads(nb.read_text())
        for cell in data["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        nb.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    settings = tmp / "lab-settings"
    for name, value in SETTINGS.items():
        f = settings / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    from course_utils.launch import free_port

    port, token = free_port(), secrets.token_hex(16)
    log = tmp / "lab.log"
    env = dict(os.environ, JUPYTER_TOKEN=token, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "config"))
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tasks.py"), command, "--no-browser", f"--port={port}",
             "--ServerApp.port_retries=0", f"--notebook-dir={root}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except urllib.error.HTTPError as exc:
                raise RuntimeError(f"JupyterLab answered {exc.code} to its own token:\n"
                                   f"{log.read_text()[-3000:]}") from None
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"JupyterLab did not answer within {START_TIMEOUT_S} s") from None
                time.sleep(0.5)
        yield Lab(url, token, root, proc, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise RuntimeError("no Chromium: apt-get install chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True,
                              args=["--no-sandbox", "--disable-dev-shm-usage"])  # a container's /dev/shm is small
        try:
            yield b
        finally:
            b.close()
