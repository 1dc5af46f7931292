"""The browser lane (``make test-browser``): every notebook opened in the course's own JupyterLab in
headless Chromium, run with Run > Run All Cells as a learner would, then checked: the run reached the
end, the only errors are in the cells marked as expected failures, every widget and image rendered, and
the page asked nothing of any host but localhost. Then each widget is used (``WIDGETS``) and its view
compared with the plain function behind it, run in a new cell of the same kernel. On a failure, a
screenshot (and of the widget being checked), the console log and any differing images are left in
``.browser-failures/<notebook>/``. Apart from those runs, chapter 01 is opened as a slideshow
(jupyterlab-rise), moved on a slide and a subslide, and closed.
Skipped outside the lane."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from course_utils import inventory

from .lab import ROOT, START_TIMEOUT_S, browser, chromium_path, course_lab

pytestmark = pytest.mark.skipif(os.environ.get("COURSE_BROWSER_LANE") != "1",
                                reason="the browser lane: make test-browser")

NOTEBOOKS = [chapter.notebook for chapter in inventory.CHAPTERS]
FAILURES = ROOT / ".browser-failures"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    assert chromium_path(), "install the lane's browser: apt-get install chromium"
    with course_lab(tmp_path_factory.mktemp("lab")) as running:
        yield running


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


def keep_evidence(page, name: str) -> Path:
    """A screenshot and the console log of `page`, in .browser-failures/<name>/."""
    folder = FAILURES / name
    folder.mkdir(parents=True, exist_ok=True)
    cell = getattr(page, "widget_cell", None)  # the widget being checked, if any: in view in the screenshot
    if cell is not None:
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(folder / "widget.png"))
    page.screenshot(path=str(folder / "screenshot.png"), full_page=True)
    (folder / "console.log").write_text("\n".join(page.console_lines) + "\n")
    return folder


def save(page) -> None:
    page.click("li.lm-MenuBar-item:has-text('File')")
    page.click(".lm-Menu-item:has-text('Save Notebook')")
    page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.jp-mod-dirty')", timeout=60_000)


CELLS = ".jp-Notebook .jp-WindowedPanel-viewport > .jp-Cell"  # the notebook's own cells, not cells shown in outputs
DOM_CELLS = """() => [...document.querySelectorAll('""" + CELLS + """')].map(c => ({
    code: c.classList.contains('jp-CodeCell'),
    widgetError: (c.querySelector('.jp-OutputArea') || {textContent: ''})\
.textContent.includes('Error displaying widget'),
    widgetLoading: (c.querySelector('.jp-OutputArea') || {textContent: ''}).textContent.includes('Loading widget'),
    widgetTraceback: [...c.querySelectorAll('.jp-OutputArea .widget-output')]\
.some(o => o.innerText.includes('Traceback')),
    widgets: c.querySelectorAll('.jp-OutputArea .jupyter-widgets').length,
    images: [...c.querySelectorAll('.jp-OutputArea img')].map(i => i.complete && i.naturalWidth > 0),
}))"""


def problems(saved: dict, dom: list[dict]) -> list[str]:
    """What is wrong after Run All: cell by cell, the saved notebook next to what the page shows."""
    found, counts = [], []
    cells = saved["cells"]
    if len(cells) != len(dom):
        return [f"the page shows {len(dom)} cells, the notebook has {len(cells)}"]
    for i, (cell, view) in enumerate(zip(cells, dom, strict=True)):
        if cell["cell_type"] != "code":
            continue
        where = f"cell {i} ({cell.get('id')})"
        expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if cell.get("execution_count") is None and "".join(cell.get("source", "")).strip():
            found.append(f"{where} never ran: Run All stopped before it")
        elif cell.get("execution_count") is not None:
            counts.append(cell["execution_count"])
        if errors and not expected:
            found.append(f"{where} raised {errors[0].get('ename')}: {errors[0].get('evalue', '')[:200]}")
        if expected and not errors:
            found.append(f"{where} is tagged raises-exception but raised nothing: the lesson's error did not happen")
        if view["widgetTraceback"]:
            found.append(f"{where}: a traceback inside a widget's output")
        wants_widget = any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                           for o in cell.get("outputs", []))
        if view["widgetError"]:
            found.append(f"{where}: 'Error displaying widget'")
        if view["widgetLoading"]:
            found.append(f"{where}: a widget still loading")
        if wants_widget and not view["widgets"]:
            found.append(f"{where}: a widget output, but no widget on the page")
        if not all(view["images"]):
            found.append(f"{where}: an image did not render")
    if counts != list(range(1, len(counts) + 1)):  # one fresh kernel, every cell once, in order
        found.append(f"the execution counts are {counts[:12]}..., not 1, 2, 3, ... in order: "
                     "not one Run All in a fresh kernel")
    return found


RENDERED = """() => ![...document.querySelectorAll('.jp-Notebook .jp-OutputArea')]\
.some(a => a.textContent.includes('Loading widget'))
    && [...document.querySelectorAll('.jp-Notebook .jp-OutputArea img')].every(i => i.complete)"""


@pytest.fixture(scope="module", autouse=True)
def fresh_evidence():
    shutil.rmtree(FAILURES, ignore_errors=True)  # what a failure leaves is this run's alone


def close(page, lab) -> None:
    """Close the page's context and stop the lab's kernels; a failure here does not hide the test's."""
    for step in (page.context.close, lab.shutdown_kernels):
        try:
            step()
        except Exception as exc:  # noqa: BLE001
            print(f"teardown: {step.__name__} failed: {exc}")


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_run_all_in_jupyterlab(lab, chromium, notebook):
    name = notebook.removesuffix(".ipynb")
    page = None
    try:
        page = lab.open(chromium, notebook)
        seconds = lab.run_all(page)
        page.wait_for_function(RENDERED, timeout=60_000)  # widget views render a moment after their output
        save(page)
        saved = json.loads((lab.root / notebook).read_text())
        found = problems(saved, page.evaluate(DOM_CELLS))
        used = 0 if found else use_widgets(lab, page, notebook, saved)
        if page.outside_requests:
            found.append(f"requests to other hosts: {page.outside_requests[:5]}")
        if found:
            pytest.fail(f"{notebook} after Run All ({seconds:.0f} s):\n  " + "\n  ".join(found)
                        + f"\nscreenshots and console log: {evidence(page, name)}")
        print(f"{notebook}: Run All in {seconds:.1f} s, {used} widget interaction(s) checked")
    except pytest.fail.Exception:
        raise
    except Exception as exc:
        pytest.fail(f"{notebook}: {type(exc).__name__}: {exc}\nscreenshots and console log: {evidence(page, name)}")
    finally:
        if page is not None:
            close(page, lab)


def evidence(page, name: str) -> str:
    if page is None:
        return "none (the page did not open)"
    try:
        return str(keep_evidence(page, name))
    except Exception as exc:  # noqa: BLE001  (a crashed page has no screenshot)
        return f"none ({type(exc).__name__}: {exc})"


@contextlib.contextmanager
def opened(lab, chromium, notebook: str, name: str):
    """`notebook` open in `lab` for a test's steps: a failure among them fails the test with the page's
    screenshots and console log (in .browser-failures/`name`/); the page is closed after."""
    page = None
    try:
        page = lab.open(chromium, notebook)
        yield page
    except Exception as exc:
        pytest.fail(f"{name}: {type(exc).__name__}: {exc}\nscreenshots and console log: {evidence(page, name)}")
    finally:
        if page is not None:
            close(page, lab)


def test_the_lab_is_offline_and_runs_the_course_kernel(lab, chromium):
    """`make lab`'s server: news feed and update check off; the page asks only localhost; the kernel is
    the course's .venv Python, with course_utils importable; the login page asks for the token."""
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        lab.api("kernels", token=False)  # nothing without the token
    assert refused.value.code == 403
    login = urllib.request.urlopen(f"{lab.url}/lab")
    assert "/login" in login.geturl(), login.geturl()  # the page asks for the token
    page = lab.open(chromium, "00_start_here.ipynb")
    try:
        config = page.evaluate("() => JSON.parse(document.getElementById('jupyter-config-data').textContent)")
        assert config.get("news", {}).get("disabled") is True, config.get("news")
        # a new cell at the end: which Python runs the kernel, and course_utils imports
        out = run_reference(page, "import sys, course_utils; print('KERNEL', sys.prefix)", "kernel")
        assert out["text"].strip() == f"KERNEL {ROOT / '.venv'}", out["text"]
        assert not page.outside_requests, page.outside_requests
    finally:
        close(page, lab)


# ------------------------------------------------------------------ using every widget
# Each spec: the widget's cell, what a learner does to it, and the plain function behind it for
# that setting, run in a new cell of the same kernel. The widget's view must then show what that
# cell shows: the same text, and the same images where both are inline PNGs.

PLT = "import matplotlib.pyplot as plt; "
WIDGETS = {
    "00_start_here.ipynb": [
        ("f857490b", [("slider", "seed", "3")],
         PLT + "from course_utils import ch00_start_here as gallery; d = gallery.GALLERY_DEFAULTS; "
               "gallery.show(d['split'], d['label'], d['n'], 3); plt.show()"),
        ("f857490b", [("toggle", "test")],
         PLT + "from course_utils import ch00_start_here as gallery; d = gallery.GALLERY_DEFAULTS; "
               "gallery.show('test', d['label'], d['n'], 3); plt.show()"),
    ],
    "01_autograd.ipynb": [
        ("226d7a89", [("slider", "x", "1.0")],
         PLT + "from course_utils.ch01_autograd import sigmoid_example_text as t, sigmoid_example_figure as f; "
               "print(t(1.0, 3.0, 1.0)); f(1.0, 3.0, 1.0); plt.show()"),
        ("92dbbc30", [("slider", "step", "3")],
         "import torch; from course_utils.ch01_autograd import step_view; "
         "x, w, b = (torch.tensor([v], requires_grad=True) for v in (2.0, 3.0, 1.0)); "
         "y = w * x + b; z = torch.sigmoid(y); "
         "print(step_view(z, {'x': x, 'w': w, 'b': b, 'y': y, 'z': z}, 2).text)"),
    ],
    "02_nn_module.ipynb": [
        ("962d3551", [("slider", "depth", "1")],
         PLT + "cm.show_model_builder(**{**cm.BUILDER_DEFAULTS, 'depth': 1}, x=X_test[:256]);"),
        ("962d3551", [("dropdown", "activation", "tanh")],
         PLT + "cm.show_model_builder(**{**cm.BUILDER_DEFAULTS, 'depth': 1, 'activation': 'tanh'}, x=X_test[:256]);"),
    ],
    "03_data_loading.ipynb": [
        ("96c4b707", [("slider", "seed", "2")],
         PLT + "d = loading.BATCH_BROWSER_DEFAULTS; "
               "v = loading.batch_view(y_imb.tolist(), d['batch_size'], d['shuffle'], 2, d['sampler'], d['epoch'], "
               "d['batch']); "
               "print('indices:', v.indices); loading.draw_batch_view(v, X[keep], None); plt.show()"),
    ],
    "04_distributed.ipynb": [
        ("a91a555d", [("checkbox", "shuffle")],
         PLT + "from course_utils.ch04_distributed import draw_sampler, EXPLORER_DEFAULTS as d; "
               "draw_sampler(d['n'], d['world_size'], d['epoch'], not d['shuffle'], d['drop_last'], d['seed']); "
               "plt.show()"),
    ],
    "05_full_pipeline.ipynb": [
        ("b025e670", [("slider", "samples", "100")], "print(padding_report(100, 2))"),
    ],
    "06_pitfalls.ipynb": [
        ("50adadd5", [("checkbox", "model.train() forgotten after validation")],
         "from IPython.display import display; import matplotlib.pyplot as plt; "
         "c = ['no_zero_grad', 'no_train_after_eval']; f = pitfalls.switchboard_figure(c); display(f); plt.close(f); "
         "print(pitfalls.switchboard_summary(c))"),
    ],
    "07_parallelism.ipynb": [
        ("a306bad7", [("slider", "micro-batches", "4")],
         PLT + "from course_utils.ch07_parallelism import draw_schedule, SCHEDULE_DEFAULTS as d; "
               "draw_schedule(d['stages'], 4, d['schedule']); plt.show()"),
        ("a306bad7", [("dropdown", "schedule", "GPipe")],
         PLT + "from course_utils.ch07_parallelism import draw_schedule, SCHEDULE_DEFAULTS as d; "
               "draw_schedule(d['stages'], 4, 'GPipe'); plt.show()"),
    ],
}

VIEW = """(cell) => {
    const area = cell.querySelector('.jp-OutputArea');
    const outs = [...area.querySelectorAll('.widget-output')];
    const roots = outs.length ? outs : [area];
    // stdout and rich outputs; stderr (a warning shown once per process) is not part of the view
    const text = roots.map(o => [...o.querySelectorAll('.jp-OutputArea-output')]
        .filter(e => e.getAttribute('data-mime-type') !== 'application/vnd.jupyter.stderr')
        .map(e => e.innerText).join('\\n')).join('\\n');
    const pre = [...area.querySelectorAll('.widget-html pre')].map(p => p.innerText).join('\\n');
    const images = [...area.querySelectorAll('img')]\
.map(i => i.src.startsWith('data:') ? i.src : 'rendered:' + (i.naturalWidth > 0));
    const error = area.innerText.includes('Traceback') || area.innerText.includes('Error displaying widget');
    return {text: outs.length ? text : pre, images, error, shown: error ? area.innerText.slice(-1500) : ''};
}"""


def _cell(page, index):
    return page.locator(CELLS).nth(index)


def act(cell, op) -> None:
    kind, label, *value = op
    if kind == "slider":
        widget = cell.locator(".widget-slider", has=cell.page.locator(f".widget-label:text-is('{label}')"))
        readout = widget.locator(".widget-readout")
        readout.click()
        readout.press("Control+a")
        readout.type(value[0])
        readout.press("Enter")
    elif kind == "dropdown":
        cell.locator(".widget-dropdown", has=cell.page.locator(f".widget-label:text-is('{label}')")).locator(
            "select").select_option(label=value[0])
    elif kind == "checkbox":
        cell.locator(".widget-checkbox", has_text=label).locator("input").click()
    elif kind == "toggle":
        cell.locator(".widget-toggle-button", has_text=label).click()
    else:
        raise ValueError(kind)


def settle(lab, page, cell, before: dict, timeout: float = 60) -> None:
    """Wait until the widget's view has changed from `before` and the kernel is idle again."""
    deadline = time.monotonic() + timeout
    while cell.evaluate(VIEW) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    lab.wait_idle(page, timeout_s=timeout)


def run_reference(page, code: str, marker: str):
    """A new cell at the end with `code`, run with Shift+Enter; its rendered output."""
    page.locator(CELLS).last.locator(".jp-InputPrompt").click()  # the prompt: never a link in a Markdown cell
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.type(f"# {marker}\n")
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    cell = page.locator(".jp-CodeCell", has=page.locator(f".cm-content:has-text('# {marker}')")).last
    cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(timeout=180_000)
    time.sleep(0.5)
    return cell.evaluate("""(cell) => {
        const area = cell.querySelector('.jp-OutputArea');
        return {text: [...area.querySelectorAll('.jp-OutputArea-output')]
                    .filter(e => e.getAttribute('data-mime-type') !== 'application/vnd.jupyter.stderr')
                    .map(o => o.innerText).join('\\n'),
                images: [...area.querySelectorAll('img')].map(i => i.src),
                error: area.innerText.includes('Traceback')};
    }""")


def _norm(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())


def _matches(now: dict, want: dict) -> bool:
    inline = [i for i in now["images"] if i.startswith("data:")]
    same_images = inline == want["images"] if (inline or want["images"]) else True
    return _norm(now["text"]) == _norm(want["text"]) and same_images


def use_widgets(lab, page, notebook: str, saved: dict) -> int:
    """Every widget of `notebook` used as specified; the number of interactions checked. The widget
    redraws in the kernel while the reference cell runs; its view is then polled until it shows what
    the reference shows (or a minute has passed)."""
    ids = [c.get("id") for c in saved["cells"]]
    done = 0
    for k, (cell_id, ops, code) in enumerate(WIDGETS.get(notebook, [])):
        cell = page.widget_cell = _cell(page, ids.index(cell_id))
        before = cell.evaluate(VIEW)
        for op in ops:
            act(cell, op)
        settle(lab, page, cell, before)  # the widget's update has run before the reference cell starts
        want = run_reference(page, code, f"reference {k}")
        assert not want["error"], f"the reference cell failed: {want['text'][-1500:]}"
        assert want["images"] or _norm(want["text"]), f"the reference for {cell_id} shows nothing: nothing to compare"
        deadline = time.monotonic() + 60
        now = cell.evaluate(VIEW)
        while not _matches(now, want) and not now["error"] and time.monotonic() < deadline:
            time.sleep(0.5)
            now = cell.evaluate(VIEW)
        assert not now["error"], f"{cell_id}: the widget shows an error after {ops}:\n{now['shown']}"
        assert now != before, f"{cell_id}: the widget did not change after {ops}"
        assert _norm(now["text"]) == _norm(want["text"]), (
            f"{cell_id} after {ops}: the widget shows\n{now['text'][:1500]}\n"
            f"but the plain function gives\n{want['text'][:1500]}")
        if not _matches(now, want):
            folder = FAILURES / notebook.removesuffix(".ipynb")
            folder.mkdir(parents=True, exist_ok=True)
            for who, images in (("widget", now["images"]), ("plain", want["images"])):
                for j, src in enumerate(i for i in images if i.startswith("data:image/png;base64,")):
                    (folder / f"{cell_id}-{k}-{who}-{j}.png").write_bytes(base64.b64decode(src.split(",", 1)[1]))
        assert _matches(now, want), (f"{cell_id} after {ops}: the widget's images ({len(now['images'])}) are not "
                                     f"the plain function's ({len(want['images'])}); both are in {FAILURES}")
        done += 1
    page.widget_cell = None
    return done


# ------------------------------------------------------------------ a chapter as a slideshow
# The slide types come from tools/slides.py; jupyterlab-rise shows the open notebook as a reveal.js
# slideshow in a frame beside it: one <section> a slide, holding a <section id="slide-H-V"> a subslide.

PRESENT = ".reveal .slides section.present[id^='slide-']"  # the screen on show


def screens(notebook: str) -> list[tuple[str, str]]:
    """(slide type, first line as the page shows it) of each cell of `notebook` that starts a slide or a
    subslide, from its committed slide types."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    kinds = [c["metadata"].get("slideshow", {}).get("slide_type") for c in cells]
    return [(k, "".join(c["source"]).strip().split("\n", 1)[0].lstrip("#").strip().replace("`", ""))
            for c, k in zip(cells, kinds, strict=True) if k in ("slide", "subslide")]


def test_slides_of_chapter_01_in_rise(lab, chromium):
    """Chapter 01 presented as an instructor would: the notebook toolbar's "Render as Reveal Slideshow"
    button opens the slideshow beside the notebook on the title slide; Right arrow moves on to the
    next slide (section 1), Space to its first subslide; closing the slideshow's tab leaves the
    notebook open."""
    from playwright.sync_api import expect

    if importlib.util.find_spec("jupyterlab_rise") is None:
        pytest.fail("jupyterlab-rise is not installed: it is in the pinned stack (requirements.txt); run `make setup`")
    notebook = "01_autograd.ipynb"
    (_, title), (_, section_1), (kind, subsection) = screens(notebook)[:3]
    assert kind == "subslide", "chapter 01's section 1 has a subsection: what Space moves to"
    with opened(lab, chromium, notebook, "slides-" + notebook.removesuffix(".ipynb")) as page:
        page.locator(".jp-NotebookPanel-toolbar [data-command='RISE:preview']").click()
        frame = page.frame_locator("iframe[src*='/rise/']")
        present = frame.locator(PRESENT)
        expect(frame.locator(".reveal .slides")).to_be_visible(timeout=START_TIMEOUT_S * 1000)
        expect(present.locator("h1")).to_contain_text(title, timeout=START_TIMEOUT_S * 1000)
        expect(present).to_have_id("slide-0-0")
        present.locator("h1").click(position={"x": 4, "y": 4})  # the slideshow has the keyboard (not the ¶ link)
        page.keyboard.press("ArrowRight")
        expect(present).to_have_id("slide-1-0", timeout=30_000)
        expect(present.locator("h2")).to_contain_text(section_1)
        expect(present).not_to_contain_text(title)
        page.keyboard.press("Space")
        expect(present).to_have_id("slide-1-1", timeout=30_000)
        expect(present.locator("h3")).to_contain_text(subsection)
        panel = page.locator(".lm-DockPanel-widget", has=page.locator("iframe[src*='/rise/']"))
        page.locator(f".lm-TabBar-tab[data-id='{panel.get_attribute('id')}'] .lm-TabBar-tabCloseIcon").click()
        expect(page.locator("iframe[src*='/rise/']")).to_have_count(0, timeout=30_000)
        expect(page.locator(".jp-NotebookPanel .jp-Notebook")).to_be_visible()
        assert not page.outside_requests, (
            f"the slideshow asked other hosts: {page.outside_requests[:5]}. (reveal.js's theme 'simple', RISE's "
            "default, imports Google Fonts: the course's lab sets jupyterlab-rise's theme to 'white', whose fonts "
            "are local, in .venv/share/jupyter/lab/settings/overrides.json)")
        print(f"{notebook}: slideshow on {title!r}; Right arrow: {section_1!r}; Space: {subsection!r}; closed")


def test_the_chinese_edition_in_a_chinese_lab(tmp_path, chromium):
    """`make lab-zh`: JupyterLab's own menus in Chinese (its language pack), a Chinese notebook open,
    and the course's helpers answering in Chinese in its kernel, a figure's Chinese title drawn."""
    from playwright.sync_api import expect

    notebook = "01_autograd.ipynb"
    with course_lab(tmp_path, ROOT / "notebooks-zh", command="lab-zh") as zh:
        with opened(zh, chromium, notebook, "lab-zh") as page:
            menus = page.locator("li.lm-MenuBar-item")
            for word in ("文件", "内核", "运行"):  # File, Kernel, Run
                expect(menus.filter(has_text=word)).to_have_count(1, timeout=60_000)
            title = json.loads((ROOT / "notebooks-zh" / notebook).read_text())["cells"][0]["source"][0]
            expect(page.locator(".jp-MarkdownCell h1").first).to_contain_text(title.lstrip("#").strip()[:6])
            out = run_reference(page, (
                "import warnings; warnings.simplefilter('error')\n"  # a missing glyph would be an error
                "from course_utils.i18n import language; from course_utils.figures import pyplot\n"
                "plt = pyplot(); fig, ax = plt.subplots(figsize=(3, 2)); ax.set_title('计算图'); plt.show()\n"
                "print('LANG', language())"), "lang")
            assert not out["error"], out
            assert "LANG zh-CN" in out["text"], out["text"]
            assert out["images"] and out["images"][0].startswith("data:image/png"), out["images"]
            assert not page.outside_requests, page.outside_requests
            print(f"lab-zh: Chinese menus, {notebook} open, the kernel's language zh-CN, a Chinese title drawn")
