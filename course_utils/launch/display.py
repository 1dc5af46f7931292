"""How a running job is shown: not at all (:class:`Quiet`), in a terminal (:class:`Terminal`: lines
as they come, with a ``[rank N]`` prefix) or in Jupyter (:class:`Notebook`: a live widget, then the
output grouped by rank). :func:`for_here` picks one."""

from __future__ import annotations

import contextlib
import html
import sys
import time
import uuid
from typing import Any

from ..i18n import tr
from .diagnosis import strip
from .watch import Logs, Tail


def in_notebook() -> bool:
    """True inside a Jupyter kernel (not a terminal, not a plain IPython shell)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return "IPKernelApp" in getattr(shell, "config", {})


def title(command: str, backend: str, engine: str) -> str:
    """The headline of a job's display: its terminal command, the backend and the engine."""
    return tr("{command}   [{backend}, {engine} engine]", "{command}   [{backend}，{engine} 引擎]",
              command=command, backend=backend, engine=engine)


def for_here(headline: str, show: bool) -> Quiet:
    """The display for this process: Notebook in Jupyter, else Terminal; Quiet if not `show`."""
    if not show:
        return Quiet()
    return Notebook(headline) if in_notebook() else Terminal(headline)


def _write(stream: Any, lines: list[str]) -> None:
    if lines:
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()


class Quiet:
    """How a job is shown: not at all (``show=False``). The other displays override these."""

    def show(self, logs: Logs, new: list[tuple]) -> None:
        """After every look at the logs: `new` lines as (attempt, rank, stdout, stderr)."""

    def end(self, logs: Logs, outcome: str | None) -> None:
        """Once the job is over: "ok", "failure", "timeout", "interrupted", or None if it stopped
        early."""


class Terminal(Quiet):
    """The job's command first, then every line as it comes, with a ``[rank N]`` prefix; the ranks'
    stderr to stderr."""

    attempt = 0

    def __init__(self, headline: str) -> None:
        print(tr("[launcher] {headline}", "[启动器] {headline}", headline=headline), file=sys.stderr, flush=True)

    def show(self, logs: Logs, new: list[tuple]) -> None:
        for n, r, out, err in new:
            if n > self.attempt:
                self.attempt = n
                print(tr("[launcher] restarting the job (attempt {n})", "[启动器] 正在重启作业（尝试 {n}）",
                         n=n), flush=True)
            _write(sys.stdout, [f"[rank {r}] {line}" for line in out])
            _write(sys.stderr, [f"[rank {r}] {strip(line)}" for line in err])


def view(headline: str, status: str, ranks: list[tuple[Tail, Tail]]) -> str:
    """The live view's HTML: the headline, the status, and the last three lines of every rank."""
    rows = ""
    for r, (out, err) in enumerate(ranks):
        last = (out.lines[-3:] + [strip(x) for x in err.lines[-3:]])[-3:]
        text = html.escape("\n".join(last)) or "&nbsp;"
        rows += f"<tr><td style='vertical-align:top'><b>rank {r}</b></td>"
        rows += f"<td><pre style='margin:0'>{text}</pre></td></tr>"
    headline, status = html.escape(headline), html.escape(status)
    return tr("<b>{headline}</b>: {status}<table>{rows}</table>", "<b>{headline}</b>：{status}<table>{rows}</table>",
              headline=headline, status=status, rows=rows)


class Notebook(Quiet):
    """Jupyter: a live widget (shown without text/plain, which nbval skips, and emptied at the end),
    then the output grouped by rank, in rank order (after a failure or a timeout, to stderr)."""

    refresh_s = 0.25  # at most four refreshes a second

    def __init__(self, headline: str) -> None:
        self.headline, self.t0, self.last = headline, time.monotonic(), 0.0
        self.widget = self.display_id = None

    def show(self, logs: Logs, new: list[tuple]) -> None:
        if self.display_id is None:  # the first look (inside supervise, which cleans up)
            self.display_id = uuid.uuid4().hex
            with contextlib.suppress(Exception):  # no ipywidgets or no frontend: no live view
                import ipywidgets
                from IPython.display import display

                widget = ipywidgets.HTML(view(self.headline, tr("starting", "正在启动"), logs.last()))
                bundle = {k: v for k, v in widget._repr_mimebundle_().items() if k != "text/plain"}
                display(bundle, raw=True, display_id=self.display_id)
                self.widget = widget
        if self.widget is None or time.monotonic() - self.last < self.refresh_s:
            return
        self.last = time.monotonic()
        n = max(logs.attempts, default=0)
        s = self.last - self.t0
        status = tr("running, {s:.0f} s", "运行中，{s:.0f} 秒", s=s)
        status += tr(" (attempt {n})", "（尝试 {n}）", n=n) if n else ""
        self.widget.value = view(self.headline, status, logs.last())  # (unchanged: nothing sent)

    def end(self, logs: Logs, outcome: str | None) -> None:
        if self.widget is not None:
            from IPython.display import update_display

            with contextlib.suppress(Exception):
                update_display({}, raw=True, display_id=self.display_id)
                self.widget.close()
            self.widget = None
        grouped = []
        for n, ranks in sorted(logs.attempts.items()):
            grouped += [tr("--- attempt {n} ---", "--- 尝试 {n} ---", n=n)] if len(logs.attempts) > 1 else []
            grouped += [f"[rank {r}] {x}" for r, (out, _) in enumerate(ranks) for x in out.lines]
        errs = [f"[rank {r}] {strip(x)}" for r, (_, e) in enumerate(logs.last()) for x in e.lines]
        if outcome == "ok":
            _write(sys.stdout, grouped)
            _write(sys.stderr, errs)
        elif outcome is not None:
            what = {"failure": tr("failure", "失败"), "timeout": tr("timeout", "超时"),
                    "interrupted": tr("interrupt", "中断")}[outcome]
            sys.stderr.write(tr("[launcher] what the ranks printed before the {what}:\n",
                                "[启动器] {what}之前各 rank 打印的内容：\n", what=what))
            _write(sys.stderr, grouped + (errs if outcome != "failure" else []))
