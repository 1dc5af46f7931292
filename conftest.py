"""pytest set-up shared by the unit tests and nbval.

1. nbval's kernels talk over Unix sockets (IPC), not TCP ports. With two notebooks running in
   parallel, one of which starts distributed jobs (a launcher, ranks, a rendezvous store, each
   binding ports), a kernel that picked its five TCP ports a moment earlier could lose one of
   them before binding it, and die before replying to ``kernel_info``. Socket files in a private
   folder cannot collide. nbval builds its kernel manager itself, without Jupyter's config files,
   so this is done where it starts kernels. The kernel's own stderr, which nbval throws away,
   goes to a file that is quoted if the kernel fails to start.
2. stderr is compared like stdout (through ``nbval_sanitize.cfg``), in strict mode; lax mode (the
   GPU lane, where another PyTorch may warn differently) compares stdout only. In a cell whose output is
   not compared (``NBVAL_IGNORE_OUTPUT``), a warning that the stored output does not show fails
   the cell all the same: a PyTorch upgrade that starts warning is something to look at.
3. Tests record no learner progress (course_utils.progress), whatever this computer's setting.
4. Under ``--dist loadgroup`` (``make test``'s workers: one more than the cores, ``tools/lanes.py``): a
   notebook's cells share one kernel, so they go to one worker, in order; the notebooks are handed
   out first (they are the longest pieces of work), then the unit tests marked slow, and each unit
   test goes to whichever worker is free, so that the workers end together instead of one waiting
   while another runs a long test alone.
5. A warning raised from the course's own code (``course_utils``, ``tools``, the scripts of
   ``notebooks/scripts/`` that tests import as ``notebooks.scripts.NAME``) is an error in the unit
   tests, as a new warning is in the notebooks. A test that expects one says so with
   ``pytest.warns``, which sees it all the same.
6. A test run has a temporary folder of its own (``TMPDIR``, inside /tmp, inherited by the workers,
   the kernels, the jobs and their logs): a passing run leaves nothing in /tmp, where every launch's
   logs, every kernel's sockets and every chapter's work folder would otherwise stay; a failing run
   keeps it and says where, with the logs that its error messages point to. pytest's own ``tmp_path``
   folders stay where they always are (the three latest runs' are kept). Not in the hub lane, whose
   servers run as other users.
7. On Python 3.12 and later, ``os.fork()`` warns (``DeprecationWarning``) in a process that has more
   than one thread. A pytest-xdist worker always has two (the second carries its messages to the
   controller), so every DataLoader with workers that a test starts there (fork is Linux's default, the
   one the chapters teach) would warn, where the same test run alone in one process does not. That one
   warning is ignored in the workers only: a test run without xdist still shows it if the course's own
   code starts a thread before it forks.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import pytest

os.environ["COURSE_PROGRESS"] = "0"  # inherited by nbval's kernels and every process a test starts

_KERNEL_FOLDERS: list[str] = []
_WARNING = re.compile(r"^(?:.*?: )?(\w*Warning): (.*)$", re.MULTILINE)


def _start_new_kernel_over_ipc(startup_timeout=60, kernel_name="python", **kwargs):
    """nbval.kernel.start_new_kernel, with the IPC transport and the kernel's stderr kept."""
    from jupyter_client.manager import KernelManager
    from nbval.kernel import NbvalKernelspecManager

    folder = tempfile.mkdtemp(prefix="nbk-")  # short: a Unix socket path has ~100 characters at most
    km = KernelManager(
        kernel_name=kernel_name,
        kernel_spec_manager=NbvalKernelspecManager(),
        transport="ipc",
        connection_file=os.path.join(folder, "kernel.json"),
    )
    _KERNEL_FOLDERS.append(folder)
    log_path = os.path.join(folder, "stderr.log")
    kwargs["stderr"] = open(log_path, "w")  # noqa: SIM115 (the kernel process owns it)
    km.start_kernel(**kwargs)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=startup_timeout)
    except RuntimeError as exc:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        with open(log_path, errors="replace") as fh:
            tail = fh.read()[-3000:]
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"the kernel did not start ({exc}); its stderr:\n{tail}") from exc
    return km, kc


#: where a warning is an error: the modules the warning is attributed to (``warnings.warn``'s
#: stacklevel picks the frame), as regular expressions matched at the start of the module's name
OWN_MODULES = (r"course_utils(\.|$)", r"tools(\.|$)", r"notebooks\.scripts(\.|$)", r"benchmarks(\.|$)")


_OWN_TMP = pytest.StashKey[str]()
_KEPT = pytest.StashKey[bool]()


def _own_temporary_folder(config) -> None:
    """Give this run a temporary folder of its own (see 6. above); the controller makes it, before the
    workers start, and they inherit it."""
    if hasattr(config, "workerinput") or not os.path.isdir("/tmp") or os.environ.get("COURSE_HUB_LANE"):
        return
    from course_utils.launch.api import _log_root

    root = tempfile.gettempdir()
    # where the launches put their logs: /tmp whatever TMPDIR says (/tmp/user/1000, say), or the
    # folder of the run that started this one (a test's nested pytest), so "/tmp/tmp..." reads as <tmp>
    # in outputs (nbval_sanitize.cfg) and the launches put their logs in it
    folder = tempfile.mkdtemp(prefix="tmp-course-tests-", dir=_log_root())
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", root)  # tmp_path: where pytest always puts it
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    config.stash[_OWN_TMP] = folder


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A failing run keeps its temporary folder, and says so before the last line of the summary."""
    folder = config.stash.get(_OWN_TMP, None)
    if folder is not None and exitstatus in (pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.INTERNAL_ERROR):
        config.stash[_KEPT] = True
        terminalreporter.write_line(f"This run's temporary files (the launch logs that its errors name) "
                                    f"are kept in {folder}")


def pytest_unconfigure(config):
    folder = config.stash.get(_OWN_TMP, None)
    if folder is not None and not config.stash.get(_KEPT, False):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    _own_temporary_folder(config)
    for module in OWN_MODULES:
        config.addinivalue_line("filterwarnings", f"error::Warning:{module}")
    if hasattr(config, "workerinput"):  # see 7. above
        config.addinivalue_line("filterwarnings", r"ignore:This process \(pid=\d+\) is multi-threaded, use of "
                                                  r"fork\(\) may lead to deadlocks:DeprecationWarning")
    if os.name == "nt":  # no Unix sockets for ZeroMQ there: keep nbval's TCP kernels
        return
    try:
        import nbval.kernel
    except ImportError:
        return
    nbval.kernel.start_new_kernel = _start_new_kernel_over_ipc


def _notebook(nodeid: str) -> str | None:
    """The notebook a test is a cell of (``notebooks/01_autograd.ipynb``), or None."""
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") else None


def pytest_collection_modifyitems(config, items):
    """Notebooks first (see 4. above), then the unit tests marked slow (seconds each: handed out early,
    none of them is left to run alone at the end), then the rest; the order is the same in every worker,
    as xdist requires."""
    # stable: a notebook's cells stay in order
    items.sort(key=lambda item: (_notebook(item.nodeid) is None, item.get_closest_marker("slow") is None))


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: each notebook one piece of work, each unit test one (xdist's own loadgroup
    groups by a marker that it writes into the test's id, which pytest 9 no longer lets it change)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class NotebooksWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _notebook(nodeid) or nodeid

    return NotebooksWhole(config, log)


def pytest_collectstart(collector):
    """Lax mode (the GPU lane, another PyTorch): only stdout of the tagged cells is compared."""
    if getattr(collector, "fspath", None) is not None and collector.fspath.ext == ".ipynb":
        if collector.config.option.nbval_lax:
            collector.skip_compare += ("stderr",)


def _warnings(outputs) -> set[tuple[str, str]]:
    found = set()
    for out in outputs or []:
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            found.update(_WARNING.findall(out.get("text", "")))
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A new warning on stderr fails a cell even where its output is not compared."""
    result = yield  # re-raises if the cell itself failed
    if not hasattr(item, "test_outputs") or item.options.get("check", True) or item.config.option.nbval_lax:
        return result  # not a notebook cell, a compared one (nbval compares stderr), or lax mode
    sanitize = item.sanitize
    new = {(cat, sanitize(msg)) for cat, msg in _warnings(item.test_outputs)}
    stored = {(cat, sanitize(msg)) for cat, msg in _warnings(item.cell.get("outputs"))}
    unexpected = sorted(new - stored)
    if unexpected:
        lines = "\n".join(f"  {cat}: {msg}" for cat, msg in unexpected)
        item.raise_cell_error(
            "New warning(s) on stderr in a cell whose output is not compared",
            lines + "\nFix the cause, or, if the warning is the lesson, store it with the cell's output.",
        )
    return result


@pytest.fixture(scope="session", autouse=True)
def _remove_kernel_folders():
    yield
    for folder in _KERNEL_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)
