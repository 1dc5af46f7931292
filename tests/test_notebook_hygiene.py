"""Fast checks on the committed notebooks themselves (no kernel): executed, clean, portable, complete."""

import json
import re
from pathlib import Path

import pytest

from course_utils import ROOT, inventory

NOTEBOOKS = inventory.notebooks("en")
IDS = [p.name for p in NOTEBOOKS]
# Both editions: the English notebooks and the Chinese ones built from them (notebooks-zh/).
EDITIONS = NOTEBOOKS + inventory.notebooks("zh-CN")
EDITION_IDS = [f"{p.parent.name}/{p.name}" for p in EDITIONS]
README = (ROOT / "README.md").read_text()

# The snippet ids of the source chapter ("Every snippet of the source, accounted for" in the course
# blueprint). The home notebook of an id is the chapter of its section: 4.1 -> 01 ... 4.6 -> 06.
SEED_IDS = [
    "4.1-autograd",
    "4.2-mlp",
    "4.3-dataset",
    "4.3-transforms",
    "4.3-loader",
    "4.4-ddp-worker",
    "4.4-spawn",
    "4.5-main-worker",
    "4.6-pitfall-1",
    "4.6-pitfall-2",
    "4.6-pitfall-3",
    "4.6-pitfall-4",
    "4.6-pitfall-5",
    "4.6-retain-graph",
]
BLUEPRINT = ROOT.parent / "shared" / "COURSE.md"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def test_there_are_notebooks():
    assert any(p.name.startswith("00_") for p in NOTEBOOKS)


def chapter_table_notebooks() -> set[str]:
    return set(re.findall(r"\|\s*\[?`?(\d\d_[a-z0-9_]+\.ipynb)", README))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_listed_in_the_readme_chapter_table(path):
    assert path.name in chapter_table_notebooks(), f"add {path.name} to the chapter table in README.md"


def test_readme_lists_no_missing_notebook():
    missing = sorted(n for n in chapter_table_notebooks() if not (ROOT / "notebooks" / n).exists())
    assert not missing, f"README.md lists notebooks that do not exist: {missing}"


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_executed_in_order_from_one(path):
    counts = [c.get("execution_count") for c in code_cells(load(path))]
    assert None not in counts, "some code cells were never executed: run `make execute`"
    assert counts == list(range(1, len(counts) + 1)), "execution counts must be 1..N: re-run in a fresh kernel"


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_errors_only_where_expected(path):
    """An expected failure carries the cell tag `raises-exception`: JupyterLab's Run All goes on
    past such a cell (and stops at any other error); nbval honours the tag too."""
    for i, cell in enumerate(code_cells(load(path)), 1):
        errors = [o for o in cell.get("outputs", []) if o["output_type"] == "error"]
        expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        assert "NBVAL_RAISES_EXCEPTION" not in src(cell), (
            f"code cell {i}: use the cell tag `raises-exception` instead of the comment marker "
            "(JupyterLab's Run All stops at a cell without the tag)")
        assert not (errors and not expected), f"code cell {i} stores an error but has no `raises-exception` tag"
        assert not (expected and not errors), f"code cell {i} is tagged `raises-exception` but stores no error"


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_kernel_is_python3(path):
    assert load(path)["metadata"]["kernelspec"]["name"] == "python3"


def _machine_path_patterns() -> list[str]:
    pats = [
        r"/home/[A-Za-z0-9_.-]+/",
        r"/Users/[A-Za-z0-9_.-]+/",
        r"[A-Za-z]:\\\\Users\\\\",
        r"/root/",
        r"/tmp/tmp[\w-]+",
        r"/(?:site|dist)-packages/",
        re.escape(str(ROOT)),
        re.escape(str(Path.home())) + r"/",
    ]
    return pats


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_no_machine_paths(path):
    text = path.read_text()
    for pat in _machine_path_patterns():
        m = re.search(pat, text)
        assert not m, f"{path.name} contains a path of the author's machine: {m.group(0)!r} (run `make execute`)"


# A line that looks like a warning: Python's (UserWarning: ...), a lower-case "warning:" prefix (in the
# Chinese edition "警告：" at the start of a line, but for the busy-machine advice that the English edition
# writes "WARNING: this machine is busy"), or matplotlib's font messages (findfont: ...).
WARNING_LINE = re.compile(r"\w*Warning:|\bwarning:|^\s*警告：(?!这台机器正忙)|findfont:", re.M)
WARNING_TAG = "warning-lesson"  # the cell teaches a warning: showing it is the point


def _output_text(out: dict) -> str:
    if out["output_type"] == "stream":
        return src({"source": out.get("text", "")})
    if out["output_type"] == "error":
        return f"{out.get('ename')}: {out.get('evalue')}"
    return src({"source": out.get("data", {}).get("text/plain", "")})


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_no_stored_warning_unless_it_is_the_lesson(path):
    """A warning in a stored output is either a lesson (the cell is tagged `warning-lesson`) or a
    defect that the reference hides: strict nbval passes as long as it comes back every time."""
    found = []
    for i, cell in enumerate(code_cells(load(path))):
        if WARNING_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            found += [f"code cell {i} ({cell.get('id')}): {line.strip()[:120]}"
                      for line in _output_text(out).splitlines() if WARNING_LINE.search(line)]
    assert not found, ("stored output with a warning; fix its cause, or tag the cell "
                       f"`{WARNING_TAG}` if the warning is what it teaches:\n" + "\n".join(found))


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_warning_lessons_show_their_warning(path):
    """The tag is not a blanket: a cell tagged `warning-lesson` stores the warning it teaches."""
    for i, cell in enumerate(code_cells(load(path))):
        if WARNING_TAG in cell.get("metadata", {}).get("tags", []):
            text = "\n".join(_output_text(out) for out in cell.get("outputs", []))
            assert WARNING_LINE.search(text), (
                f"code cell {i} ({cell.get('id')}) is tagged `{WARNING_TAG}` but shows no warning")


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_no_widget_state(path):
    nb = load(path)
    assert "widgets" not in nb["metadata"], "widget state stored in the metadata: run `make execute`"
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-state+json" not in out.get("data", {})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_title_learning_goals_and_recap(path):
    cells = load(path)["cells"]
    md = [(i, src(c)) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]
    assert cells[0]["cell_type"] == "markdown" and src(cells[0]).lstrip().startswith("# "), "first cell: a '# Title'"
    top = "\n".join(src(c) for c in cells[:3] if c["cell_type"] == "markdown")
    m = re.search(r"you will learn", top, re.I)
    assert m and re.search(r"^\s*[-*] ", top[m.end():], re.M), "a 'You will learn' list in the first three cells"
    recap = [i for i, s in md if re.search(r"^#+ .*recap", s, re.I | re.M)]
    assert recap and recap[-1] >= len(cells) // 2, "a '## Recap' section near the end"


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_widget_cells_are_ignored_and_have_a_static_twin(path):
    cells = code_cells(load(path))
    for i, cell in enumerate(cells):
        shows_widget = any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                           for o in cell.get("outputs", []))
        if shows_widget:
            assert "NBVAL_IGNORE_OUTPUT" in src(cell), f"code cell {i + 1} shows a widget but is compared by nbval"
            assert i + 1 < len(cells), f"code cell {i + 1} shows a widget and has no static twin after it"


def seed_tags() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in NOTEBOOKS:
        for cell in load(path)["cells"]:
            for tag in cell.get("metadata", {}).get("tags", []):
                if tag.startswith("seed:"):
                    found.setdefault(tag[5:], []).append(path.name)
    return found


def home_notebook(seed_id: str) -> str:
    return "0" + seed_id.split(".")[1][0]  # "4.3-loader" -> "03"


def test_seed_ids_match_the_blueprint():
    if not BLUEPRINT.exists():
        pytest.skip("the course blueprint is not beside this checkout")
    table = re.findall(r"^\| (4\.\d-[a-z0-9-]+(?: \.\.\. 4\.\d-[a-z0-9-]+)?) \|", BLUEPRINT.read_text(), re.M)
    ids = []
    for entry in table:
        if " ... " in entry:  # "4.6-pitfall-1 ... 4.6-pitfall-5"
            first, last = entry.split(" ... ")
            stem = first.rsplit("-", 1)[0]
            ids += [f"{stem}-{k}" for k in range(int(first.rsplit("-", 1)[1]), int(last.rsplit("-", 1)[1]) + 1)]
        else:
            ids.append(entry)
    assert ids == SEED_IDS


def test_every_source_snippet_is_carried():
    tags = seed_tags()
    missing = [i for i in SEED_IDS if i not in tags]
    homes = {p.name[:2] for p in NOTEBOOKS}
    due = [i for i in missing if home_notebook(i) in homes]
    unknown = sorted(set(tags) - set(SEED_IDS))
    assert not unknown, f"seed tags that name no snippet of the source: {unknown}"
    assert not due, (f"source snippets not yet carried by their chapter (tag a cell seed:<id>): {due}; "
                     f"all missing: {missing}")
