"""The book's checks in a real browser (``make test-book``): the built site (``_build/book/``, or the
folder ``COURSE_BOOK_SITE`` names) served on localhost and every page of both editions opened in
headless Chromium (Debian's, driven by Playwright; no browser download), with

- no request leaving localhost (each one is refused and reported), no request failing;
- every image loaded, and with alternative text (not empty, not its file name: what Sphinx writes
  when an output carries none);
- the math typeset by MathJax, without a MathJax error;
- no console error and no uncaught exception;
- axe-core's accessibility scan (``axe-playwright-python``) reporting no serious or critical
  violation;

and the search (a term returns its chapter in each edition), the language switch (to the same
chapter and back) and every internal link and anchor of the site (read from the HTML files).
Skipped outside the lane (``COURSE_BOOK_LANE=1``, which ``make test-book`` sets)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import posixpath
import re
import shutil
import threading
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import pytest

from course_utils import inventory

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("COURSE_BOOK_SITE") or ROOT / "_build" / "book").resolve()
EDITIONS = ("en", "zh-CN")
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-dev-shm-usage"]  # a container's /dev/shm is small
SERIOUS = ("serious", "critical")
#: a term, the edition searched, and the chapter it must return
SEARCHES = [("DistributedSampler", "en", "04_distributed"), ("DistributedSampler", "zh-CN", "04_distributed"),
            ("计算图", "zh-CN", "01_autograd"), ("gradcheck", "en", "01_autograd")]
TIMEOUT_MS = 60_000

pytestmark = pytest.mark.skipif(os.environ.get("COURSE_BOOK_LANE") != "1", reason="the book's lane: make test-book")


def pages(site: Path = SITE) -> list[str]:
    """Every HTML page of the site, as a path relative to it."""
    skip = ("_static/", "_images/", "_downloads/", "_sources/")
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not any(part in p.relative_to(site).as_posix() for part in skip))


def chapters() -> list[str]:
    """The chapters' page names (``course_utils.inventory``): ``00_start_here``..."""
    return [chapter.stem for chapter in inventory.CHAPTERS]


def _outside(url: str) -> bool:
    """A request to a host other than this machine (data:, blob: and about: URLs are no requests)."""
    if url.startswith(("data:", "blob:", "about:")):
        return False
    host = urllib.parse.urlsplit(url).hostname or ""
    return host not in ("127.0.0.1", "localhost", "::1")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test reports what matters
        pass


@pytest.fixture(scope="module")
def site() -> Path:
    assert (SITE / "index.html").is_file(), f"no book in {SITE}: build it with `make book` (make test-book does)"
    return SITE


@pytest.fixture(scope="module")
def server(site):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    path = next((shutil.which(b) for b in CHROMIUM if shutil.which(b)), None)
    assert path, "the book's checks need Chromium: apt-get install chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def opened(browser, url: str):
    """A page in a fresh context, at `url`, with what went wrong while loading it in ``page.problems``: a
    request to another host (refused), a failed request or response, a console error, an exception."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.problems = []
    page.set_default_timeout(TIMEOUT_MS)

    def route(r):
        if _outside(r.request.url):
            page.problems.append(f"a request left localhost: {r.request.url}")
            r.abort()
        else:
            r.continue_()

    context.route("**/*", route)
    page.on("response", lambda r: page.problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: None if _outside(r.url) else page.problems.append(
        f"request failed ({r.failure}): {r.url}"))
    page.on("console", lambda m: page.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(f"uncaught exception: {e}"))
    try:
        page.goto(url, wait_until="load")
        yield page
    finally:
        context.close()


IMAGES = """() => [...document.images].map(i => ({src: i.getAttribute('src') || '', alt: i.getAttribute('alt'),
    loaded: i.complete && i.naturalWidth > 0}))"""
MATH = """() => {
    const math = [...document.querySelectorAll('.math')];
    return {count: math.length,
            untypeset: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 60)),
            errors: [...document.querySelectorAll('mjx-merror')]\
.map(e => e.getAttribute('data-mjx-error') || e.textContent)};
}"""
MATHJAX_READY = """() => window.MathJax && MathJax.startup && MathJax.startup.promise
    ? MathJax.startup.promise.then(() => true) : true"""


def image_problems(images: list[dict]) -> list[str]:
    """Images not loaded, or without alternative text (none, blank, or the image's file name)."""
    found = []
    for img in images:
        src, alt = img["src"], (img["alt"] or "").strip()
        if not img["loaded"]:
            found.append(f"image not loaded: {src}")
        if not alt or alt == src or alt == posixpath.basename(src) or alt.endswith(posixpath.basename(src) or "\0"):
            found.append(f"image without alternative text: {src}")
    return found


def axe_problems(page) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    found = []
    for v in results.response.get("violations", []):
        if v.get("impact") in SERIOUS:
            targets = ", ".join(str(n.get("target")) for n in v.get("nodes", [])[:3])
            found.append(f"axe {v['impact']} {v['id']}: {v['help']} ({len(v.get('nodes', []))} element(s), "
                         f"e.g. {targets})")
    return found


@pytest.mark.parametrize("path", pages())
def test_every_page(browser, server, path):
    with opened(browser, f"{server}/{path}") as page:
        page.evaluate(MATHJAX_READY)
        problems = list(page.problems)
        problems += image_problems(page.evaluate(IMAGES))
        math = page.evaluate(MATH)
        problems += [f"math not typeset: {m!r}" for m in math["untypeset"]]
        problems += [f"MathJax error: {e}" for e in math["errors"]]
        # axe-core fetches the stylesheets itself, resolving their @import against the page (a 404 of
        # its own): what the page did is read before the scan
        problems += axe_problems(page)
    assert not problems, f"{path}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("term, edition, chapter", SEARCHES)
def test_search_finds_the_chapter(browser, server, term, edition, chapter):
    url = f"{server}/{edition}/search.html?q={urllib.parse.quote(term)}"
    with opened(browser, url) as page:
        page.wait_for_selector("#search-results ul.search li a", timeout=TIMEOUT_MS)
        page.wait_for_function("() => document.querySelector('#search-results .search-summary')"
                               " && document.querySelector('#search-results .search-summary').textContent.trim()")
        found = page.evaluate("() => [...document.querySelectorAll('#search-results ul.search li a')]"
                              ".map(a => a.getAttribute('href'))")
        problems = page.problems
    hits = [urllib.parse.urlsplit(h).path for h in found]
    assert f"{chapter}.html" in hits, f"searching {edition}/ for {term!r} found {hits}, not {chapter}.html"
    assert not problems, problems


@pytest.mark.parametrize("chapter", chapters())
def test_the_language_switch_lands_on_the_same_chapter(browser, server, chapter):
    def settled(page) -> None:  # leaving a page still loading (MathJax's fonts) would abort its requests
        page.evaluate(MATHJAX_READY)
        page.wait_for_load_state("networkidle")

    with opened(browser, f"{server}/en/{chapter}.html") as page:
        settled(page)
        title_en = page.inner_text("h1")
        page.click("a.course-lang-switch")
        page.wait_for_url(f"**/zh-CN/{chapter}.html")
        settled(page)
        assert page.get_attribute("html", "lang") == "zh-CN"
        title_zh = page.inner_text("h1")
        assert title_zh.split("·")[0].strip() == title_en.split("·")[0].strip()  # "01 · ..." in both
        page.click("a.course-lang-switch")
        page.wait_for_url(f"**/en/{chapter}.html")
        settled(page)
        assert page.get_attribute("html", "lang") == "en"
        assert not page.problems, page.problems


# ---------------------------------------------------------------- links, from the HTML files


class _Page(HTMLParser):
    """The ids of a page and the URLs it refers to (``(tag, attribute, url)``)."""

    REFS = {"a": "href", "link": "href", "script": "src", "img": "src", "iframe": "src", "source": "src"}

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str]] = []
        self.switch: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        url = attrs.get(self.REFS.get(tag, ""))
        if url:
            self.refs.append((tag, url))
            if tag == "a" and "course-lang-switch" in (attrs.get("class") or "").split():
                self.switch.append(url)


@functools.cache
def parsed(file: Path) -> _Page:
    page = _Page()
    page.feed(file.read_text(encoding="utf-8", errors="replace"))
    return page


def broken_links(site: Path) -> list[str]:
    """Every internal URL of every page whose file, or whose anchor in it, does not exist."""
    found = []
    for path in pages(site):
        here = site / path
        for tag, url in parsed(here).refs:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith(("mailto:", "javascript:")):
                continue
            target = here if not parts.path else (here.parent / urllib.parse.unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_relative_to(site) or not target.is_file():
                found.append(f"{path}: <{tag}> {url}: no such file")
            elif parts.fragment and target.suffix == ".html" and \
                    urllib.parse.unquote(parts.fragment) not in parsed(target).ids:
                found.append(f"{path}: <{tag}> {url}: no such anchor")
    return found


def test_every_internal_link_and_anchor_resolves(site):
    broken = broken_links(site)
    assert not broken, f"{len(broken)} broken link(s):\n  " + "\n  ".join(broken[:50])


def test_every_page_of_an_edition_switches_to_the_same_page_of_the_other(site):
    problems = []
    for path in pages(site):
        edition, _, rest = path.partition("/")
        if edition not in EDITIONS:
            continue  # the site's own front page, a choice of edition
        links = parsed(site / path).switch
        other = "zh-CN" if edition == "en" else "en"
        want = (site / other / rest).resolve()
        got = [((site / path).parent / link).resolve() for link in links]
        if got != [want]:
            problems.append(f"{path}: switch {links}, expected one link to {other}/{rest}")
    assert not problems, "\n".join(problems)


_LOADED = re.compile(r"""<(?:script|img|iframe|source|audio|video)\b[^>]*\bsrc\s*=\s*["']?(https?:)?//"""
                     r"""|<link\b[^>]*\bhref\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//"""
                     r"""|@import\s+(url\()?\s*["']?(https?:)?//""", re.I)


def test_no_file_of_the_site_loads_anything_from_elsewhere(site):
    """What a browser would load (scripts, images, stylesheets, fonts, CSS imports) is never a web
    address: every page, stylesheet and script of the site, read as text."""
    found = []
    for f in sorted(site.rglob("*")):
        if f.suffix in (".html", ".css") and f.is_file():
            for m in _LOADED.finditer(f.read_text(encoding="utf-8", errors="replace")):
                found.append(f"{f.relative_to(site)}: {m.group(0)[:120]}")
    assert not found, "\n".join(found[:30])


def test_both_editions_have_the_same_pages(site):
    en = {p.partition("/")[2] for p in pages(site) if p.startswith("en/")}
    zh = {p.partition("/")[2] for p in pages(site) if p.startswith("zh-CN/")}
    assert en == zh and {f"{c}.html" for c in chapters()} <= en
