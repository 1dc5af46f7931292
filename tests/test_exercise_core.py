"""The exercise engine's robustness: what a check leaves behind (state), what the first check of a
session costs and imports, an interrupted check, and a failure of the checker's own code told apart
from the learner's (core, compare, state, display)."""

import functools
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from course_utils.exercises import state
from course_utils.exercises.core import Exercise

ROOT = Path(__file__).resolve().parents[1]


def _fn_ex() -> Exercise:
    def double(x):
        return 2 * x

    return Exercise("Q", double, prompt="p", hints=["h"], cases=lambda: [(torch.tensor([1.0, 2.0]),)])


def _fresh_python(code: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """`code` in a new interpreter (a fresh kernel: nothing imported yet), this course first on its path."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_PROGRESS": "0", **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=environ, cwd=ROOT)


def test_a_check_keeps_the_learners_deterministic_setting_and_its_warn_only():
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert _fn_ex().check(lambda x: 2 * x).correct
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()

        def changes_it(x):
            torch.use_deterministic_algorithms(False)
            return 2 * x

        assert _fn_ex().check(changes_it).correct
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_first_check_of_a_session_imports_no_compiler():
    """torch.use_deterministic_algorithms imports torch._inductor.config (dynamo, sympy: seconds, and an
    import an interrupt leaves half done); a check that changed nothing must not call it, nor wake dynamo."""
    run = _fresh_python("""
        import json, sys, time
        import torch
        from course_utils.exercises import ch01
        t = time.perf_counter()
        first = [ch01.q1.check(16.0).status, ch01.q3.check(ch01.hvp).status]
        took = time.perf_counter() - t
        heavy = [m for m in ("torch._inductor", "torch._dynamo", "sympy") if m in sys.modules]
        print(json.dumps({"first": first, "heavy": heavy, "took": took}))
    """)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["first"] == ["correct", "correct"] and found["heavy"] == [], found
    print(f"the first two checks of a fresh session: {found['took']:.2f} s")


_INTERRUPTED = """
    import json, signal, sys
    import torch
    from course_utils.exercises import ch00, ch01

    def interrupt(signum, frame):
        raise KeyboardInterrupt  # what the kernel's stop button does

    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, {delay})
    try:
        first = ch01.q3.check(ch01.hvp).status
    except KeyboardInterrupt:
        first = "interrupted"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    later = [ch01.q3.check(ch01.hvp), ch01.q1.check(16.0), ch00.q1.check(torch.arange(1, 11) ** 2)]
    print(json.dumps({{"first": first, "later": [[r.status, r.message[:300]] for r in later]}}))
"""


@pytest.mark.parametrize("delay", [0.001, 0.05, 0.2, 0.4])
def test_an_interrupted_first_check_leaves_later_checks_working(delay, tmp_path):
    """A KeyboardInterrupt delivered during the first check of a session (the tester's SIGALRM): that
    check is interrupted (or done), every later correct answer passes, and nothing is recorded wrong."""
    log = tmp_path / "progress.jsonl"
    run = _fresh_python(_INTERRUPTED.format(delay=delay),
                        env={"COURSE_PROGRESS": "1", "COURSE_PROGRESS_FILE": str(log)})
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["first"] in ("interrupted", "correct"), found
    assert [status for status, _ in found["later"]] == ["correct"] * 3, found
    recorded = [json.loads(line)["status"] for line in log.read_text().splitlines()] if log.exists() else []
    assert "incorrect" not in recorded, recorded


def test_a_failure_of_the_checkers_own_code_is_not_blamed_on_the_learner(monkeypatch, tmp_path):
    """An error raised with no line of the learner's code in it (here: putting the state back fails, as
    after a half-done import) says the check itself failed and to restart the kernel; not recorded."""
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "progress.jsonl"))

    # the import that fails when the state is put back, raised by the import system (no test code in it)
    broken = functools.partial(importlib.import_module, "torch._half_imported_in_this_test")
    monkeypatch.setattr(state, "_set_determinism", broken)
    result = _fn_ex().check(lambda x: 2 * x)
    assert result.status == "check_failed" and not result
    assert "the check itself failed" in result.message and "restart the kernel" in result.message
    assert "ModuleNotFoundError" in result.message and "your code" not in result.message
    assert "The check failed" in repr(result) and "The check failed" in result._repr_html_()
    assert not (tmp_path / "progress.jsonl").exists()  # nothing recorded, neither incorrect nor else
    monkeypatch.undo()

    def observe(answer, case):  # fails on the model answer too: the checker's failure, said so
        raise RuntimeError("the kernel is broken")

    ex = Exercise("Q", lambda: 3, prompt="p", hints=["h"], form="value", observe=observe)
    result = ex.check(3)
    assert result.status == "check_failed" and "restart the kernel" in result.message


def test_the_learners_own_line_is_quoted_never_a_library_frame():
    """The quoted line is the learner's, not the standard library's where the error surfaced."""

    def learner(x):
        return json.loads("not json")

    result = _fn_ex().check(learner)
    assert result.status == "incorrect" and "JSONDecodeError" in result.message
    assert "json.loads(\"not json\")" in result.message, result.message
    assert "raise JSONDecodeError" not in result.message and "decoder" not in result.message


def test_the_learners_exception_is_still_theirs_when_raised_through_a_library():
    def learner(x):
        return torch.ones(2) @ torch.ones(3)

    result = _fn_ex().check(learner)
    assert result.status == "incorrect" and "torch.ones(2) @ torch.ones(3)" in result.message


def test_a_complex_tensor_is_never_the_same_as_a_real_one():
    from course_utils.exercises import ch01
    from course_utils.exercises.compare import same

    real = torch.tensor([1.0, 2.0])
    assert not same(real + 1j, real, 1e-5, 1e-6) and not same(real, real + 0j, 1e-5, 1e-6)
    assert same(real + 1j, real + 1j, 1e-5, 1e-6) and not same(real + 1j, real + 2j, 1e-5, 1e-6)
    result = ch01.q3.check(lambda f, x, v: ch01.hvp(f, x, v) + 1j)
    assert result.status == "incorrect" and "complex" in result.message, result.message


def test_a_learners_huge_exception_message_is_cut():
    def learner(x):
        raise ValueError("y" * 5_000_000)

    result = _fn_ex().check(learner)
    assert result.status == "incorrect" and "ValueError" in result.message
    assert len(result.message) < 600 and "raise ValueError" in result.message


def test_switching_language_mid_session_gives_one_language(monkeypatch):
    """The words are looked up when shown: after COURSE_LANG changes, hint, reason and verdict all follow,
    both ways, whichever language the exercise was made in."""
    from course_utils.exercises import ch01
    from course_utils.exercises.core import _words

    en, zh = _words(ch01.__name__)["Q1"], _words(ch01.__name__, "zh-CN")["Q1"]
    name, mistake = next(iter(ch01.q3.mistakes.items()))
    for lang, words in (("zh", zh), ("en", en), ("zh", zh)):
        monkeypatch.setenv("COURSE_LANG", lang)
        assert ch01.q1.prompt == words["prompt"]  # read directly too (the instructor's guide does)
        assert ch01.q1.hint(1).body == words["hints"][0]
        assert ch01.q1.check(15.0).message.endswith(words["hints"][0])
        reason = (_words(ch01.__name__, "zh-CN") if lang == "zh" else _words(ch01.__name__))["Q3"]["mistakes"][name]
        assert ch01.q3.check(mistake).message == reason
