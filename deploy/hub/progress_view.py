"""The instructor's live view of the class: a JupyterHub service, for admins only, showing every
learner's exercises chapter by chapter as done / tried / not yet, refreshing on its own, with a CSV
export for the day's record, in English or Chinese.

    /services/course-progress/                 the page (?lang=zh or ?lang=en; else the browser's language)
    /services/course-progress/progress.csv     one row per learner and exercise
    /services/course-progress/progress.json    the same, for programs

It reads what the course already records: every ``q.check()`` appends a line to the learner's
``~/.pytorch-in-depth/progress.jsonl`` (``COURSE_PROGRESS=1``, set by the hub for every server;
course_utils/progress.py). Two ways to reach those files:

- ``--source files`` (one server, ``make hub``): the service runs as root and reads each learner's home;
- ``--source servers`` (Kubernetes, where homes are volumes the hub cannot mount): through each running
  server's contents API, with the service's token (scope ``access:servers``); a learner whose server is
  stopped shows what was last read.

Who may open it: the hub gives access to users holding ``access:services!service=course-progress``,
which only the admin role holds; any other user gets 403.

    python -m deploy.hub.progress_view --source files --lang en   # started by the hub, not by hand
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import datetime as dt
import html
import io
import json
import os
import pwd
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urlparse

from course_utils import progress
from course_utils.i18n import speaking, tr

PROGRESS_PATH = Path(".pytorch-in-depth") / "progress.jsonl"  # in a learner's home (progress.progress_file())
REFRESH_S = 10
STATES = ("done", "tried", "not yet")
MARKS = {"done": "●", "tried": "◐", "not yet": "○"}


def state_word(state: str) -> str:
    return {"done": tr("done", "已完成"), "tried": tr("tried", "已尝试"), "not yet": tr("not yet", "尚未作答")}[state]


@dataclasses.dataclass
class Learner:
    """One learner's records, as read now (or last read, when ``stale`` says why not now)."""

    name: str
    records: list[dict] = dataclasses.field(default_factory=list)
    unreadable_lines: int = 0
    error: str = ""  # why nothing could be read
    stale: str = ""  # why these are the records last read, not now

    @property
    def last_check(self) -> str:
        return max((str(r.get("time", "")) for r in self.records), default="")


def read_from_files(names: Iterable[str], account_prefix: str) -> list[Learner]:
    """Each learner's records, from the progress file in the home of their account (prefix + name)."""
    found = []
    for name in names:
        learner = Learner(name)
        try:
            home = Path(pwd.getpwnam(account_prefix + name).pw_dir)
            learner.records, learner.unreadable_lines = progress.read(home / PROGRESS_PATH)
        except KeyError:
            learner.error = "no account"
        except OSError as exc:
            learner.error = f"{type(exc).__name__}: {exc.strerror or exc}"
        found.append(learner)
    return found


def table(learners: list[Learner], known: dict[str, list[str]]) -> list[dict]:
    """One row per learner and exercise: state, number of checks, time of the last check."""
    rows = []
    for learner in learners:
        summary = progress.summarise(learner.records, known)
        for chapter, states in summary.states.items():
            for exercise, state in states.items():
                mine = [r for r in learner.records if r["chapter"] == chapter and r["exercise"] == exercise]
                rows.append({"learner": learner.name, "chapter": chapter, "exercise": exercise, "state": state,
                             "checks": len(mine),
                             "last_check": max((str(r.get("time", "")) for r in mine), default="")})
    return rows


def csv_text(learners: list[Learner], known: dict[str, list[str]], titles: dict[str, str]) -> str:
    """The CSV export, in the current language (tr): a header, then one row per learner and exercise."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([tr("learner", "学员"), tr("chapter", "章节"), tr("exercise", "练习"), tr("state", "状态"),
                tr("checks", "检查次数"), tr("last check (UTC)", "最后一次检查（UTC）")])
    for row in table(learners, known):
        w.writerow([row["learner"], titles.get(row["chapter"], row["chapter"]), row["exercise"],
                    state_word(row["state"]), row["checks"], row["last_check"]])
    return out.getvalue()


def json_model(learners: list[Learner], known: dict[str, list[str]]) -> dict:
    return {"learners": [{"name": x.name, "error": x.error, "stale": x.stale, "unreadable_lines": x.unreadable_lines,
                          "last_check": x.last_check,
                          "states": progress.summarise(x.records, known).states} for x in learners],
            "chapters": known}


_STYLE = """
body { font-family: system-ui, "Noto Sans CJK SC", sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.done { color: #1a7f37; } .tried { color: #c26100; } .not-yet { color: #999; }
.marks { font-size: 1.2em; letter-spacing: 0.1em; }
.note { color: #666; font-size: 0.9em; }
"""


def page_html(learners: list[Learner], known: dict[str, list[str]], titles: dict[str, str], *, lang: str,
              refresh_s: int, now: dt.datetime, base: str = "") -> str:
    """The page, in the current language (tr): learners down, chapters across, then exercise by exercise."""
    esc = html.escape
    other = ("en", "English") if lang.startswith("zh") else ("zh", "中文")
    states = {x.name: progress.summarise(x.records, known).states for x in learners}
    head = [f"<th>{esc(tr('learner', '学员'))}</th>", f"<th>{esc(tr('last check (UTC)', '最后一次检查（UTC）'))}</th>"]
    head += [f"<th>{esc(titles.get(ch, ch))}</th>" for ch in known]
    head.append(f"<th>{esc(tr('done', '已完成'))}</th>")
    body = []
    for x in learners:
        cells = [f"<td>{esc(x.name)}</td>"]
        last = x.last_check.replace("T", " ").rstrip("Z")
        note = x.error or x.stale
        cells.append(f"<td>{esc(last) or '-'}" + (f" <span class='note'>({esc(note)})</span>" if note else "")
                     + "</td>")
        done_all = total = 0
        for ch, names in known.items():
            row = states[x.name].get(ch, {})
            marks = "".join(f"<span class='{s.replace(' ', '-')}' title='{esc(ex)}: {esc(state_word(s))}'>"
                            f"{MARKS[s]}</span>"
                            for ex, s in ((ex, row.get(ex, 'not yet')) for ex in names))
            done = sum(row.get(ex) == "done" for ex in names)
            done_all, total = done_all + done, total + len(names)
            cells.append(f"<td><span class='marks'>{marks}</span> {done}/{len(names)}</td>")
        cells.append(f"<td>{done_all}/{total}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    by_ex = []
    for ch, names in known.items():
        for ex in names:
            counts = {s: sum(states[x.name].get(ch, {}).get(ex, "not yet") == s for x in learners) for s in STATES}
            who = ", ".join(x.name for x in learners if states[x.name].get(ch, {}).get(ex) == "tried")
            by_ex.append(f"<tr><td>{esc(titles.get(ch, ch))}</td><td>{esc(ex)}</td>"
                         + "".join(f"<td class='{s.replace(' ', '-')}'>{counts[s]}</td>" for s in STATES)
                         + f"<td>{esc(who)}</td></tr>")
    legend = " ".join(f"<span class='{s.replace(' ', '-')}'>{MARKS[s]}</span> {esc(state_word(s))}" for s in STATES)
    title = tr("Class progress", "全班进度")
    updated = tr(f"{len(learners)} learners · updated {now:%H:%M:%S} UTC · refreshes every {refresh_s} s",
                 f"{len(learners)} 名学员 · 更新于 {now:%H:%M:%S} UTC · 每 {refresh_s} 秒自动刷新")
    return f"""<!DOCTYPE html>
<html lang="{'zh-CN' if lang.startswith('zh') else 'en'}"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh_s}">
<title>{esc(title)}</title><style>{_STYLE}</style></head><body>
<h1>{esc(title)}</h1>
<p>{esc(updated)} · <a href="{esc(base)}progress.csv?lang={'zh' if lang.startswith('zh') else 'en'}">CSV</a>
 · <a href="{esc(base)}?lang={other[0]}">{other[1]}</a></p>
<p>{legend}</p>
<table id="learners"><tr>{''.join(head)}</tr>
{chr(10).join(body) or '<tr><td colspan="99">' + esc(tr('Nobody has signed in yet.', '还没有学员登录。'))
 + '</td></tr>'}
</table>
<h2>{esc(tr('Exercise by exercise', '逐题统计'))}</h2>
<table id="exercises"><tr><th>{esc(tr('chapter', '章节'))}</th><th>{esc(tr('exercise', '练习'))}</th>
{''.join(f'<th>{esc(state_word(s))}</th>' for s in STATES)}<th>{esc(tr('tried, not yet done',
                                                                        '尝试过但未完成'))}</th></tr>
{chr(10).join(by_ex)}
</table>
<p class="note">{esc(tr('From each learner’s own progress records (every q.check()); nothing else is read.',
                        '数据来自每位学员自己的进度记录（每次 q.check()），不读取其他内容。'))}</p>
</body></html>
"""


def choose_lang(asked: str | None, accept_language: str | None, default: str) -> str:
    """``"zh"`` or ``"en"``: ?lang= first, then the browser's first language, then the room's."""
    for value in (asked, (accept_language or "").split(",")[0].split(";")[0], default):
        value = (value or "").strip().lower()
        if value.startswith("zh"):
            return "zh"
        if value.startswith("en"):
            return "en"
    return "en"


# --- the service ----------------------------------------------------------------------------------


class Hub:
    """What the service asks of the hub's REST API, with its own token."""

    def __init__(self, api_url: str, token: str):
        from tornado.httpclient import AsyncHTTPClient

        self.api_url, self.token = api_url.rstrip("/"), token
        self.http = AsyncHTTPClient()

    async def get(self, url: str, **headers: str) -> bytes:
        resp = await self.http.fetch(url, headers={"Authorization": f"token {self.token}", **headers},
                                     request_timeout=20)
        return resp.body

    async def users(self) -> list[dict]:
        """Every user of the hub (the API's pages followed)."""
        found, offset = [], 0
        while True:
            body = json.loads(await self.get(f"{self.api_url}/users?offset={offset}&limit=200",
                                             Accept="application/jupyterhub-pagination+json"))
            items = body["items"] if isinstance(body, dict) else body
            found += items
            nxt = (body.get("_pagination") or {}).get("next") if isinstance(body, dict) else None
            if not nxt or not items:
                return found
            offset = nxt["offset"]


class View:
    def __init__(self, hub: Hub, source: str, account_prefix: str, servers_url: str, lang: str, refresh_s: int):
        self.hub, self.source, self.account_prefix = hub, source, account_prefix
        self.servers_url, self.lang, self.refresh_s = servers_url.rstrip("/"), lang, refresh_s
        self.known = progress.chapters(import_modules=False)
        self.titles = progress.chapter_titles()
        self.last_read: dict[str, Learner] = {}

    async def learners(self) -> list[Learner]:
        users = sorted((u for u in await self.hub.users() if not u.get("admin")), key=lambda u: u["name"])
        if self.source == "files":
            return await asyncio.to_thread(read_from_files, [u["name"] for u in users], self.account_prefix)
        return list(await asyncio.gather(*(self._through_server(u) for u in users)))

    async def _through_server(self, user: dict) -> Learner:
        from tornado.httpclient import HTTPClientError

        name, server = user["name"], user.get("server")
        if server:
            url = (f"{self.servers_url}{server.rstrip('/')}/api/contents/{quote(str(PROGRESS_PATH))}"
                   "?type=file&format=text&content=1")
            try:
                model = json.loads(await self.hub.get(url))
                records, bad = progress.parse((model.get("content") or "").encode())
                self.last_read[name] = Learner(name, records, bad)
                return self.last_read[name]
            except HTTPClientError as exc:
                if exc.code == 404:  # no check recorded yet
                    self.last_read[name] = Learner(name)
                    return self.last_read[name]
                why = f"server answered {exc.code}"
            except (OSError, ValueError) as exc:
                why = f"{type(exc).__name__}: {exc}"
        else:
            why = "server not running"
        old = self.last_read.get(name)
        if old is None:
            return Learner(name, error=why)
        return dataclasses.replace(old, stale=why)


def make_app(view: View, prefix: str):
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    class Base(HubOAuthenticated, web.RequestHandler):
        def lang(self) -> str:
            return choose_lang(self.get_argument("lang", None), self.request.headers.get("Accept-Language"), view.lang)

    class Page(Base):
        @web.authenticated
        async def get(self):
            learners = await view.learners()
            lang = self.lang()
            with speaking(lang):
                text = page_html(learners, view.known, view.titles, lang=lang, refresh_s=view.refresh_s,
                                 now=dt.datetime.now(dt.UTC), base=prefix)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            self.write(text)

    class Csv(Base):
        @web.authenticated
        async def get(self):
            learners = await view.learners()
            lang = self.lang()
            with speaking(lang):
                text = csv_text(learners, view.known, view.titles)
            day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", f'attachment; filename="class-progress-{day}.csv"')
            self.write(("\ufeff" if lang == "zh" else "") + text)  # the mark that tells spreadsheets it is UTF-8

    class Json(Base):
        @web.authenticated
        async def get(self):
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(json_model(await view.learners(), view.known)))

    return web.Application([
        (prefix, Page),
        (prefix + "progress.csv", Csv),
        (prefix + "progress.json", Json),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
    ], cookie_secret=secrets.token_bytes(32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.hub.progress_view", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=("files", "servers"), default="files")
    parser.add_argument("--servers-url", default="", help="where the proxy serves /user/... (--source servers)")
    parser.add_argument("--account-prefix", default="course-")
    parser.add_argument("--lang", default="en", help="the page's language when the browser does not ask: en or zh")
    parser.add_argument("--refresh", type=int, default=REFRESH_S, help="seconds between refreshes of the page")
    o = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if o.source == "servers" and not o.servers_url:
        parser.error("--source servers needs --servers-url (e.g. http://proxy-public on Kubernetes)")
    from tornado.ioloop import IOLoop

    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/course-progress/")
    view = View(Hub(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"]), o.source,
                o.account_prefix, o.servers_url, o.lang, o.refresh)
    make_app(view, prefix).listen(url.port, url.hostname)
    print(f"course-progress: serving {prefix} on {url.hostname}:{url.port} (source: {o.source})", flush=True)
    IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
