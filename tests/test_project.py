"""The project's own wiring: pinned stack, the two commands, CI, and that nbval really compares."""

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from course_utils import ROOT, inventory
from course_utils.doctor import read_pins

sys.path.insert(0, str(ROOT))
import tasks  # noqa: E402
from tools import lanes  # noqa: E402


def test_layout_one_module_per_chapter_and_the_map_is_complete():
    """course_utils has one module per notebook, named after it (chNN_topic.py for NN_topic.ipynb), each
    with its test file; every other module (a chapter module's parts included), every package and every
    module of a package (but a chapter's exercises, exercises/chNN) is listed in CONTRIBUTING.md's map, and
    nothing else is."""
    notebooks = [chapter.stem for chapter in inventory.CHAPTERS]
    package = ROOT / "course_utils"
    modules = sorted(p.stem for p in package.glob("*.py") if not p.stem.startswith("__"))
    parts = {m.rpartition(".")[2] for chapter in inventory.CHAPTERS for m in chapter.part_modules}
    chapters = [m for m in modules if re.fullmatch(r"ch\d\d_\w+", m) and m not in parts]
    assert chapters == [f"ch{nb}" for nb in notebooks]
    missing_tests = [m for m in chapters if not (ROOT / "tests" / f"test_{m}.py").exists()]
    assert not missing_tests, f"chapter modules without a test file: {missing_tests}"
    packages = sorted(p.name for p in package.iterdir() if (p / "__init__.py").exists())
    inside = {f"{pkg}/{m.stem}" for pkg in packages for m in (package / pkg).glob("*.py")
              if not m.stem.startswith("__") and not re.fullmatch(r"ch\d\d", m.stem)}
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    mapped = set(re.findall(r"^\| `([\w/]+)`", contributing, re.MULTILINE))
    shared = set(modules) - set(chapters)
    expected = shared | {f"{pkg}/" for pkg in packages} | inside
    assert expected == mapped - {"ch00_start_here"}, (
        f"CONTRIBUTING.md's map and course_utils differ: not in the map {sorted(expected - mapped)}, "
        f"not in course_utils {sorted(mapped - expected - {'ch00_start_here'})}")
    assert not (ROOT / "course_utils" / "notebook.py").exists(), "authors' tooling lives in tools/, not in the package"


def test_requirements_are_all_exact_pins():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[\w.+]+", ln) for ln in lines), lines
    pins = read_pins()
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"


def test_environment_yml_agrees_with_requirements():
    text = (ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    conda = {}
    for m in re.finditer(r"^\s*-\s*([A-Za-z0-9_.\-]+)==([\w.+]+)\s*$", pip_block, re.M):
        conda[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    assert conda == read_pins()
    assert re.search(r"^\s*-\s*python=3\.11\s*$", text, re.M)


def test_make_targets_call_the_task_runner():
    mk = (ROOT / "Makefile").read_text()
    for target in ("lab", "test", "execute", "bench", "stress", "test-spawn", "test-pythons", "test-gpu",
                   "test-slurm", "test-browser", "test-portable", "book", "test-book", "hub", "test-hub"):
        assert re.search(rf"^{target}:.*\n\t@\$\(PYTHON\) tasks.py {target}$", mk, re.M), target
        assert target in tasks.COMMANDS
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    lanes = [ln for ln in ci if ln.startswith(("make ", "python3 tasks.py"))]
    # (the one-core run beside the book lane on two cores or more, else one after the other)
    assert lanes == ["python3 tasks.py test-pythons --pythons 3.12,3.13 --setup-only >\"$logs/pythons\" 2>&1 &",
                     "make test", "make test-browser",
                     "python3 tasks.py test-portable --levels one-core notebooks >\"$logs/one-core\" 2>&1 &",
                     "make test-book", "python3 tasks.py test-portable --levels one-core notebooks",
                     "make test-book", "make test-spawn", "make test-slurm",
                     'python3 tasks.py test-pythons --pythons 3.13 --level default -m "not slow" tests notebooks',
                     'python3 tasks.py test-pythons --pythons 3.12 --level avx2 -m "not slow" tests notebooks',
                     "make test-hub"]


def test_test_command_is_strict_parallel_nbval():
    args = lanes.pytest_command(lanes.LANES["test"])
    assert "--nbval" in args and "--nbval-lax" not in args
    assert args[args.index("--nbval-sanitize-with") + 1].endswith("nbval_sanitize.cfg")
    assert int(args[args.index("--nbval-cell-timeout") + 1]) <= 600
    assert args[args.index("-n") + 1] == lanes.WORKERS and args[args.index("--dist") + 1] == "loadgroup"
    assert 2 <= int(lanes.WORKERS) <= 4
    assert args[-3:] == ["tests", "notebooks", "notebooks-zh"]


def test_stamp_is_keyed_on_requirements(tmp_path, monkeypatch):
    before = tasks.stamp_value()
    req = tmp_path / "requirements.txt"
    req.write_text((ROOT / "requirements.txt").read_text() + "six==1.16.0\n")
    monkeypatch.setattr(tasks, "REQUIREMENTS", req)
    assert tasks.stamp_value() != before


def test_an_up_to_date_venv_installs_nothing(monkeypatch):
    stamp = tasks.VENV / ".course-stamp"
    if not (stamp.exists() and stamp.read_text().strip() == tasks.stamp_value()):
        pytest.skip("this checkout's .venv was not made by tasks.py")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    assert tasks.ensure_venv() == tasks.venv_python()
    assert calls == []


def test_offline_install_is_one_clear_line():
    log = ("ERROR: Could not find a version that satisfies the requirement torch==2.14.1\n"
           "ERROR: No matching distribution found")
    msg = tasks._explain_pip_failure(log)
    assert "cannot reach a package index" in msg and "\n" not in msg


def test_old_python_is_refused_in_one_line():
    code = (
        f"import sys, shutil; sys.path.insert(0, {str(ROOT)!r}); import tasks; "
        "sys.version_info = (3, 8, 0, 'final', 0); shutil.which = lambda n: None; tasks.find_base_python()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the course needs Python 3.11 or newer") and proc.stderr.count("\n") == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_notebooks_on_localhost_with_a_token(tmp_path):
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    env.pop("JUPYTER_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tasks.py"), "lab", "--no-browser", f"--port={port}", "--ServerApp.port_retries=0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        page = None
        while time.time() < deadline and proc.poll() is None:
            try:
                page = urllib.request.urlopen(base + "/lab", timeout=30)  # follows the redirect to /login
                break
            except OSError:  # not listening yet (URLError), or a first page slow on a busy machine (TimeoutError)
                time.sleep(0.5)
        assert page is not None, "JupyterLab did not answer within 180 s"
        body = page.read().decode()
        assert page.url.startswith(base + "/login"), page.url
        assert "token" in body.lower() or "password" in body.lower()
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(base + "/api/contents", timeout=30)
        assert denied.value.code == 403
        # the token the server made works, and it serves notebooks/
        runtime = sorted(Path(tmp_path).glob("jpserver-*.json"))
        token = json.loads(runtime[0].read_text())["token"]
        assert token
        listing = json.load(urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=30))
        names = {item["name"] for item in listing["content"]}
        assert "00_start_here.ipynb" in names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_nbval_fails_when_a_stored_output_is_changed(tmp_path):
    """Strict nbval is a regression test: a hand-edited stored output of 00_start_here fails the suite.
    (Both copies end with the changed cell: the cells after it would only run again.)"""
    source = ROOT / "notebooks" / "00_start_here.ipynb"
    nb = json.loads(source.read_text())
    for i, cell in enumerate(nb["cells"]):
        streams = [o for o in cell.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stdout"]
        if cell["cell_type"] == "code" and streams and "NBVAL_IGNORE_OUTPUT" not in "".join(cell["source"]):
            del nb["cells"][i + 1:]
            (tmp_path / "unchanged.ipynb").write_text(json.dumps(nb))
            text = "".join(streams[0]["text"])
            streams[0]["text"] = text.replace("1", "7", 1) if "1" in text else text + "changed\n"
            break
    else:
        pytest.fail("00_start_here.ipynb has no compared stdout output to change")
    (tmp_path / "changed.ipynb").write_text(json.dumps(nb))
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir, whatever lies above
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "pytest.ini", "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
         "-p", "no:xdist", *lanes.nbval_args(),
         "changed.ipynb", "unchanged.ipynb"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert re.search(r"\b1 failed\b", summary), summary
    assert re.search(r"FAILED changed.ipynb::Cell \d+", proc.stdout), proc.stdout[-2000:]
    assert "Cell outputs differ" in proc.stdout and "unchanged.ipynb" not in summary


def _controls(widget):
    """Every slider, checkbox and menu inside a widget tree."""
    import ipywidgets as w

    if isinstance(widget, w.IntSlider | w.FloatSlider | w.Checkbox | w.Dropdown):
        yield widget
    for child in getattr(widget, "children", ()):
        yield from _controls(child)


def _widgets():
    import torch

    from course_utils import ch00_start_here as ch00
    from course_utils import ch01_autograd as ch01
    from course_utils import ch02_nn_module as ch02
    from course_utils import ch03_data_loading as ch03
    from course_utils import ch04_distributed as ch04
    from course_utils import ch06_pitfalls as ch06

    images, labels = torch.rand(40, 1, 28, 28), [i % 10 for i in range(40)]
    return {"sigmoid_explorer": ch01.sigmoid_explorer, "sampler_explorer": ch04.sampler_explorer,
            "gallery_widget": ch00.gallery_widget, "batch_browser": lambda: ch03.batch_browser(images, labels),
            "model_builder_widget": lambda: ch02.model_builder_widget(torch.randn(64, 784)),
            "switchboard_widget": lambda: ch06.switchboard_widget(default=())}


@pytest.mark.parametrize("name", ["sigmoid_explorer", "sampler_explorer", "gallery_widget", "batch_browser",
                                  "model_builder_widget", "switchboard_widget"])
def test_widget_callbacks_leave_no_figure_open(name, monkeypatch):
    """A widget draws its figure and closes it (course_utils.figures.show_figure). The comm layer runs IPython's
    post_execute hooks after every widget message, and in JupyterLab the inline backend's hook there
    showed a figure left open, blank, in place of the widget's real figure (found by the browser lane)."""
    import ipywidgets
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    plt.close("all")
    ui = _widgets()[name]()
    assert plt.get_fignums() == [], f"{name} left a figure open when it was built"
    control = next(c for c in _controls(ui) if not isinstance(c, ipywidgets.Dropdown))
    if isinstance(control.value, bool):
        control.value = not control.value
    else:
        control.value += control.step if control.value < control.max else -control.step
    assert plt.get_fignums() == [], f"{name} left a figure open after {control.description} changed"
    assert any(isinstance(o, matplotlib.figure.Figure) for o in shown), f"{name} showed no figure"
    plt.close("all")


def test_every_helper_that_seeds_torch_restores_the_global_rng():
    """Source check over the package modules (the exercise engine restores every generator itself, tested in
    test_exercises.py): a function that seeds torch's global generator runs inside torch.random.fork_rng, or is
    a seeding function by name."""
    import ast

    import course_utils

    allowed = {"seed_everything"}  # seeding is their job
    seeding = {"torch.manual_seed", "torch.random.manual_seed", "torch.default_generator.manual_seed"}
    offenders = []
    for path in sorted(Path(course_utils.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or fn.name in allowed:
                continue
            calls = [ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)]
            if seeding & set(calls) and "fork_rng" not in ast.unparse(fn):
                offenders.append(f"{path.name}:{fn.lineno} {fn.name}")
    assert not offenders, "these seed torch's global RNG without restoring it: " + ", ".join(offenders)


def test_no_tracked_text_file_holds_a_merge_conflict_marker():
    """A merge left half-done: both sides of a conflict, and the markers, in a file learners read."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    marked = []
    for name in files:
        path = ROOT / name
        if path.suffix in {".png", ".pt", ".npz", ".whl", ".ico", ".woff2"} or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if any(line.startswith(("<<<<<<< ", ">>>>>>> ")) for line in text.splitlines()):
            marked.append(name)
    assert not marked, f"merge conflict markers left in: {', '.join(marked)}"


def test_the_code_passes_make_lint():
    """`make lint` (ruff: the rules in pyproject.toml, lines of at most 120 columns) is part of the suite, so
    that the rules hold without anyone remembering to run it."""
    makefile = (ROOT / "Makefile").read_text()
    command = re.search(r"^lint:.*\n\t@\.venv/bin/python (-m ruff check .+)$", makefile, re.MULTILINE)
    assert command, "the Makefile's lint target is not the one this test runs"
    r = subprocess.run([sys.executable, *command.group(1).split()], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]


def test_no_course_module_over_450_lines_and_no_function_over_60():
    """CONTRIBUTING's "Style": a module of course_utils that grows splits along its seams."""
    too_long = []
    for path in sorted((ROOT / "course_utils").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        if source.count("\n") > 450:
            too_long.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_other_pythons_run_at_a_cpu_level_of_the_portability_lane(capsys):
    """CI's 3.13 and 3.12 runs carry the portability lane's `default` and `avx2` levels: the same switches."""
    from tools import portable

    for level in portable.LEVELS:
        if level.env:
            assert tasks.portable_level_env(level.name) == level.env
    for wrong in ("one-core", "own", "avx512"):
        with pytest.raises(SystemExit):
            tasks.portable_level_env(wrong)
        assert "--level takes default or avx2" in capsys.readouterr().err
