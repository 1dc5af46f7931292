"""Every exercise of every chapter: its model answer passes (also when run from the source that
`.solution()` shows, in its notebook's context), the stub reads "not attempted", and each declared
mistake gets its own reason. Plus the exercise core: bounds, forms, messages, no side effects.
(`test_exercise_simulation.py` tries many more answers.)"""

import ast
import contextlib
import importlib
import itertools
import json
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from course_utils import inventory, progress
from course_utils.exercises import core, time_limit
from course_utils.exercises.core import Exercise, Incorrect, as_ints, as_number, as_tensor
from course_utils.i18n import spaced


def all_exercises() -> dict:
    """Every chapter's ``EXERCISES`` (the chapters: ``course_utils.inventory``), keyed by module name."""
    return {ch.key: importlib.import_module(ch.exercise_module).EXERCISES for ch in inventory.CHAPTERS}

ALL = [(mod, ex) for mod, exs in sorted(all_exercises().items()) for ex in exs]
IDS = [f"{mod}-{ex.name}" for mod, ex in ALL]
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def test_every_chapter_module_lists_exercises():
    found = all_exercises()
    assert "ch00" in found
    for mod, exs in found.items():
        if mod != "ch00":
            assert 3 <= len(exs) <= 6, f"{mod} should have 3-6 exercises, has {len(exs)}"


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_model_answer_is_correct(mod, ex):
    result = ex.check(ex.reference())
    assert result.status == "correct", result


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_stub_is_not_attempted(mod, ex):
    assert ex.check(...).status == "not_attempted"
    assert ex.check().status == "not_attempted"
    if ex.form == "function":

        def stub(*args, **kwargs):
            raise NotImplementedError

        assert ex.check(stub).status == "not_attempted"


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_each_declared_mistake_gets_its_reason(mod, ex):
    assert len(ex.mistakes) >= 2, "each exercise declares at least two plausible mistakes"
    for name, answer in ex.mistakes.items():
        result = ex.check(answer)
        assert (result.status, result.message) == ("incorrect", ex.reasons[name])


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_hints_and_solution_display(mod, ex):
    assert ex.hints, "every exercise has at least one hint"
    assert "hint 1/" in repr(ex.hint(1))  # hint(1): other tests may already have asked for hints
    shown = repr(ex.solution())
    assert f"def {ex.model_answer.__name__}" in shown or f"class {ex.model_answer.__name__}" in shown
    assert "<pre>" in ex.solution()._repr_html_()


def _code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _imports(source: str) -> list[str]:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_shown_solution_runs_in_its_notebook(mod, ex):
    """Paste `.solution()` into the notebook at the exercise, after the notebook's own imports: it must pass."""
    notebook = NOTEBOOKS / inventory.chapter(mod).notebook
    var = ex.name.lower() if ex.name.startswith("Q") else "q1"
    cells = _code_cells(notebook)
    at = next(i for i, src in enumerate(cells) if f"{var}.check(" in src)
    namespace: dict = {}
    for statement in itertools.chain.from_iterable(_imports(src) for src in cells[: at + 1]):
        try:
            exec(statement, namespace)
        except ImportError:  # a script's module, importable only from the notebook's folder
            pass
    exec(ex.solution().body, namespace)
    answer = namespace[ex.model_answer.__name__]
    result = ex.check(answer() if ex.form == "value" else answer)
    assert result.status == "correct", result


# ------------------------------------------------------------------------------ the core


def _ex(observe=lambda a, _: as_number(a), **kw):
    def one():
        return 1

    return Exercise("Q", one, prompt="prompt", hints=["h1", "h2"], form="value", observe=observe, **kw)


def _fn_ex(**kw):
    def double(x):
        return 2 * x

    return Exercise("Q", double, prompt="prompt", hints=["h"], cases=lambda: [(1,), (2.5,)],
                    describe=lambda c: f"for x={c[0]}", **kw)


def test_not_attempted_forms():
    ex = _ex()
    for stub in (..., None, ""):
        assert ex.check(stub).status == "not_attempted"

    def stub_fn(x):
        raise NotImplementedError

    assert _fn_ex().check(stub_fn).status == "not_attempted"


def test_learner_exception_is_an_incorrect_with_its_line():
    def learner(x):
        return torch.ones(2) @ torch.ones(3)

    r = _fn_ex().check(learner)
    assert r.status == "incorrect"
    assert "RuntimeError" in r.message and "Fix that error" in r.message
    assert "torch.ones(2) @ torch.ones(3)" in r.message  # points at the learner's own line


def test_a_function_checks_several_inputs_and_says_which_failed():
    assert _fn_ex().check(lambda x: x + x).correct
    r = _fn_ex().check(lambda x: 2)  # right for x=1 only
    assert r.status == "incorrect" and "For x=2.5" in r.message and "should be 5." in r.message
    assert "pass your function itself" in _fn_ex().check(3).message


def test_a_declared_mistake_is_found_by_its_behaviour():
    ex = _fn_ex(mistakes={"you squared x": lambda x: x * x})
    assert ex.check(lambda x: x**2).message == "you squared x"  # another mistake that behaves the same
    assert ex.check(lambda x: x + 1).message != "you squared x"


def test_floats_compare_at_float32_precision_and_near_misses_show_their_digits():
    ex = _fn_ex()
    assert ex.check(lambda x: float(torch.tensor(2 * x, dtype=torch.float32))).correct
    r = ex.check(lambda x: 2 * x + 4e-5)
    assert r.status == "incorrect" and "2.00004" in r.message  # not "2.0000 ... should be 2.0000"


def test_answer_forms():
    assert as_number(np.int64(3)) == 3.0 and as_number(torch.tensor([2.5])) == 2.5
    assert as_number(4.0, whole=True) == 4
    for bad in ("3", True, [1], torch.zeros(2)):
        with pytest.raises(Incorrect):
            as_number(bad)
    assert as_ints(i for i in range(3)) == [0, 1, 2] == as_ints(torch.arange(3)) == as_ints(np.arange(3))
    assert len(as_ints(itertools.count())) == core.MAX_ITEMS + 1  # taken, not exhausted
    assert len(as_ints(torch.zeros(1, dtype=torch.int64).expand(10**9))) == core.MAX_ITEMS + 1
    with pytest.raises(Incorrect, match="torch.from_numpy"):
        as_tensor(np.zeros(2))


@pytest.mark.parametrize("answer", [lambda x: time.sleep(30), lambda x: [i for i in itertools.count()],
                                    lambda x: next(i for i in itertools.count() if i < 0)])
def test_a_check_is_bounded_in_time(answer, monkeypatch):
    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)
    start = time.monotonic()
    r = _fn_ex().check(answer)
    assert r.status == "incorrect" and "did not finish within 0.5 seconds" in r.message
    assert time.monotonic() - start < 0.5 * core.MAX_STRETCH + 3  # stretched only on a starved CPU


def test_a_check_that_launches_gets_its_extra_time_and_no_more(monkeypatch):
    """`extra_time_s` (a check that runs the answer on real ranks) adds to the limit; past it, the same
    message names the whole limit."""
    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)

    def slow_observe(answer, _):
        time.sleep(answer)  # a stand-in for a launch of `answer` seconds
        return as_number(answer)

    def ex(extra):
        return Exercise("Q", lambda: 1.0, prompt="p", hints=["h"], form="value", observe=slow_observe,
                        extra_time_s=extra)

    assert ex(0.0).check(1.0).message.startswith("your code did not finish within 0.5 seconds")
    assert ex(2.0).check(1.0).status == "correct"
    late = ex(1.0).check(3.0)
    assert late.status == "incorrect" and "did not finish within 1.5 seconds" in late.message


def test_a_check_off_the_main_thread_is_bounded_too(monkeypatch):
    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)
    box = []
    t = threading.Thread(target=lambda: box.append(_fn_ex().check(lambda x: time.sleep(30))))
    start = time.monotonic()
    t.start()
    t.join(10)
    assert box and "did not finish" in box[0].message and time.monotonic() - start < 0.5 * core.MAX_STRETCH + 3


def _spins(*args):
    while True:
        pass


def _swallows(*args):
    while True:
        try:
            time.sleep(0.05)
        except BaseException:  # noqa: BLE001 - the learner's code under test
            pass


@pytest.mark.parametrize("on_main_thread", [True, False], ids=["main", "thread"])
@pytest.mark.parametrize("answer", [_spins, _swallows], ids=["spins", "swallows"])
@pytest.mark.parametrize("exercise", ["ch04.q2", "ch05.q1"])
def test_an_endless_answer_on_simulated_ranks_leaves_no_thread_running(exercise, answer, on_main_thread, monkeypatch):
    """Chapters 04-05 run an answer on one thread per simulated rank; every rank must end with its
    check. A spinning thread left behind holds the GIL and slows every later check; one whose loop
    swallows every exception (the simulation once caught one awake) woke 20 times a second forever."""
    module, name = exercise.split(".")
    q = getattr(importlib.import_module(f"course_utils.exercises.{module}"), name)
    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)
    before, box = set(threading.enumerate()), []
    if on_main_thread:
        box.append(q.check(answer))
    else:
        t = threading.Thread(target=lambda: box.append(q.check(answer)))
        t.start()
        t.join(60)  # 0.5 s of CPU time per rank, stretched on a busy machine (core.MAX_STRETCH)
    assert box and box[0].status == "incorrect"
    deadline = time.monotonic() + 3
    while (left := [t for t in threading.enumerate() if t not in before]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"threads still running after the check: {left}"


def test_an_answer_on_real_ranks_is_stopped_on_each_rank_or_named_by_the_launch(monkeypatch):
    """Chapter 04 Q2 runs the answer on 3 real processes: an endless answer meets the check's time limit on
    each rank (not the launch's timeout, seconds later), and an answer that kills its process is named by
    the launch's failure."""
    from course_utils.exercises import ch04

    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)
    # first (it also starts the launcher's warm server, which the next check then finds ready)
    killed = ch04.q2.check(lambda t: __import__("os")._exit(3))
    assert killed.status == "incorrect" and "made a rank fail or hang" in killed.message
    start = time.monotonic()
    endless = ch04.q2.check(lambda t: [None for _ in iter(int, 1)])
    assert endless.status == "incorrect" and "did not finish within 0.5 s on rank" in endless.message
    assert time.monotonic() - start < ch04.LAUNCH_ALLOWANCE_S


def test_a_sleeping_answer_on_simulated_ranks_does_not_stall_later_checks(monkeypatch):
    """A rank asleep in the learner's code gets its stop when it wakes. Until then Python 3.11 kept every
    thread's eval breaker on, and a traced call spins on that: the trace that stops an answer swallowing
    the time limit hung the next checks until the sleeper woke."""
    from course_utils.exercises import ch04

    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)
    assert ch04.q2.check(lambda *args: time.sleep(20)).status == "incorrect"
    start = time.monotonic()
    assert "did not finish" in _fn_ex().check(_swallows).message
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("on_main_thread", [True, False])
def test_time_spent_waiting_for_a_cpu_is_not_charged(on_main_thread, monkeypatch):
    """A right answer on a starved machine stays right: only the time the code could run counts."""
    t0 = time.monotonic()
    monkeypatch.setattr(time_limit, "cpu_wait", lambda tid=None: 0.9 * (time.monotonic() - t0))  # 90% waiting
    box = []

    def work():
        # 1.5 times the limit: over it, and well under the most it can stretch to (MAX_STRETCH times), so a
        # late wake-up on a busy machine does not reach that cap
        box.append(time_limit.bounded(lambda: time.sleep(0.45) or "done", 0.3))

    if on_main_thread:
        work()
    else:
        t = threading.Thread(target=work)
        t.start()
        t.join(10)
    assert box and box[0][0] == "done" and box[0][1] < 0.3
    with pytest.raises(core.TimeUp):  # still bounded: at most MAX_STRETCH times the limit
        time_limit.bounded(lambda: time.sleep(30), 0.1)
    assert time.monotonic() - t0 < 0.45 + 0.1 * core.MAX_STRETCH + 2


def test_an_outer_timer_survives_a_check():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert _fn_ex().check(lambda x: x * 2).status == "correct"
        time.sleep(1)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_check_leaves_the_session_as_it_was():
    def meddler(x):
        torch.manual_seed(99)
        np.random.seed(99)
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(1)
        return 2 * x

    threads, state = torch.get_num_threads(), torch.get_rng_state()
    assert _fn_ex().check(meddler).correct
    assert torch.equal(torch.get_rng_state(), state) and torch.is_grad_enabled()
    assert torch.get_default_dtype() == torch.float32 and torch.get_num_threads() == threads


def test_a_value_answer_is_not_modified():
    def mutate(t, _):
        t.add_(1)
        return as_tensor(t)

    answer = torch.zeros(3)
    Exercise("Q", lambda: torch.ones(3), prompt="p", hints=["h"], form="value", observe=mutate).check(answer)
    assert torch.equal(answer, torch.zeros(3))


def test_results_display_in_text_and_html():
    ex = _ex()
    r = ex.check(2)
    assert repr(r).startswith("[Q] Incorrect:") and "h1" in r.message
    assert "Incorrect" in r._repr_html_() and not bool(r)
    assert bool(ex.check(1)) and "Correct" in repr(ex.check(1))


def test_hints_come_in_order_and_are_bounded():
    ex = _ex()
    assert "h1" in repr(ex.hint()) and "h2" in repr(ex.hint()) and "h2" in repr(ex.hint())
    assert "1 to 2" in repr(ex.hint(7))
    assert "with hints" in repr(ex.check(1))


# ------------------------------------------------------------------------------ the words files

WORDS = Path(core.__file__).parent


def test_every_words_file_belongs_to_a_chapter_and_every_table_to_an_exercise():
    import tomllib

    chapters = all_exercises()
    for path in sorted(WORDS.glob("*.en.toml")):
        mod = path.name.split(".")[0]
        assert mod in chapters, f"{path.name}: no chapter module {mod}.py"
        tables = set(tomllib.loads(path.read_text(encoding="utf-8")))
        assert tables == {ex.name for ex in chapters[mod]}, f"{path.name}: tables {sorted(tables)}"
    assert {p.name.split(".")[0] for p in WORDS.glob("*.en.toml")} == set(chapters)


def test_an_exercise_whose_words_are_missing_fails_at_import():
    from course_utils.exercises import ch01

    with pytest.raises(ValueError, match="a reason for each mistake"):
        Exercise("Q1", ch01.answer_q1, form="value", mistakes={"a_new_mistake": 3.0})
    with pytest.raises(ValueError, match="prompt"):
        Exercise("Q9", ch01.answer_q1, form="value")


def test_variant_edits_the_solution_source_and_refuses_an_edit_that_does_not_apply():
    from course_utils.exercises.core import variant

    def scaled(x):
        return 2 * x + 1

    slip = variant(scaled, "2 * x", "3 * x")
    assert (scaled(2), slip(2), slip.__name__) == (5, 7, "scaled")
    with pytest.raises(ValueError, match="is not in its source"):
        variant(scaled, "4 * x", "x")


# ------------------------------------------------------------------------------ found by a review


def test_a_check_runs_with_grad_on_whatever_the_learner_switched_off():
    from course_utils.exercises import ch01, ch02

    with torch.no_grad():
        assert ch01.q3.check(ch01.hvp).correct and ch02.q1.check(ch02.FixedNet).correct
        assert not torch.is_grad_enabled()
    with torch.inference_mode():
        assert ch01.q3.check(ch01.hvp).correct and torch.is_inference_mode_enabled()


@pytest.mark.slow
def test_an_answer_that_swallows_the_time_limit_is_still_stopped(monkeypatch):
    def swallows(x):
        while True:
            try:
                sum(range(10_000))
            except BaseException:  # noqa: BLE001 - the learner's code under test
                pass

    monkeypatch.setattr(core, "TIME_LIMIT_S", 0.5)  # what is tested is the stop, not the limit's length
    start = time.monotonic()
    result = _fn_ex().check(swallows)
    # stopped, not hung: on a busy machine the limit stretches by the time spent waiting for a CPU (up to
    # MAX_STRETCH times), and the check's own work comes on top
    assert "did not finish" in result.message
    assert time.monotonic() - start < core.MAX_STRETCH * core.TIME_LIMIT_S + 5
    assert sys.gettrace() is None


def test_sys_exit_in_an_answer_is_an_incorrect_not_a_crash():
    result = _fn_ex().check(lambda x: sys.exit(3))
    assert result.status == "incorrect" and "SystemExit" in result.message


def test_a_save_that_restores_the_old_file_after_the_crash_is_not_crash_safe():
    """A killed process runs no `except`: the checkpoint must be whole at the moment of the crash."""
    import os

    from course_utils.exercises import ch05

    def restore_after(obj, path):
        old = open(path, "rb").read() if os.path.exists(path) else None
        try:
            torch.save(obj, path)
        except BaseException:
            if old is not None:
                open(path, "wb").write(old)
            raise

    assert ch05.q4.check(restore_after).message == ch05.q4.reasons["overwrites"]


def test_backward_walk_that_asks_autograd_with_retain_graph_is_refused():
    from course_utils.exercises import ch01

    def asks_autograd(out):
        leaves = ch01._leaves(out)
        return dict(zip(leaves, torch.autograd.grad(out, leaves, retain_graph=True), strict=True))

    assert ch01.q5.check(asks_autograd).message == ch01.q5.reasons["autograd_grad"]
    assert torch.autograd.grad.__module__ == "torch.autograd"  # put back


# ------------------------------------------------------------------------------ the Chinese edition

# English that a Chinese verdict must not contain (code and API names, in or out of backticks, may stay)
_ENGLISH = ("should be", "but it is", "your answer", "was expected", "holds", "a tensor", "the ", " of ",
            "For ", "returns", "a function", "a list", "a str", "an int", "please", ": ")


def _wrong_answers():
    """A wrong answer of each kind of verdict the engine words itself: a form problem, a tip, values that
    differ (a tensor, a number, a named fact), an Incorrect raised by a chapter's code, a wrong form."""
    from course_utils.exercises import ch00, ch01, ch02, ch04, ch06

    return [
        (ch00.q1, "abc", "[练习] 不正确：squares 应该是一个 torch.Tensor，但它是一个字符串。",
         "[Practice] Incorrect: squares should be a torch.Tensor, but it is a str."),
        (ch00.q1, np.arange(1, 11) ** 2,
         "[练习] 不正确：squares 应该是一个 torch.Tensor，但它是一个 numpy 数组。"
         "`torch.from_numpy(a)` 可以把 numpy 数组变成张量。",
         "[Practice] Incorrect: squares should be a torch.Tensor, but it is an ndarray. "
         "`torch.from_numpy(a)` turns a numpy array into one."),
        (ch00.q1, torch.arange(1, 12) ** 2, "[练习] 不正确：squares 的形状是 (11,)，但应该是 (10,)。",
         "[Practice] Incorrect: the shape of squares is (11,), but it should be (10,)."),
        (ch01.q3, lambda f, x, v: torch.zeros_like(x),
         "[Q3] 不正确：对于 f(x) = (x**3).sum() + x[0] * x[1]，在 x = [0.5, -1.0, 2.0]、v = [1.0, 2.0, -0.5] 处，"
         "`hvp` 的返回值在索引 (1,) 处是 0，而预期是 -11。",
         "[Q3] Incorrect: For f(x) = (x**3).sum() + x[0] * x[1] at x = [0.5, -1.0, 2.0], v = [1.0, 2.0, -0.5], "
         "what `hvp` returns holds 0 at index (1,) where -11 was expected."),
        (ch01.q5, lambda out: {}, "[Q5] 不正确：这个 dict 中没有叶子张量 x 的条目：它的键应该是叶子张量本身"
         "（AccumulateGrad 节点的 .variable）；它是空的。",
         "[Q5] Incorrect: the dict has no entry for the leaf x: its keys should be the leaf tensors themselves "
         "(an AccumulateGrad node's .variable); it is empty."),
        (ch02.q3, 3.5, "[Q3] 不正确：你数出的个数应该是一个整数，但它是 3.5。",
         "[Q3] Incorrect: your count should be a whole number, but it is 3.5."),
        (ch04.q1, "0 3", "[Q1] 不正确：你的答案应该是一个由整数组成的列表，但它是一个字符串。",
         "[Q1] Incorrect: your answer should be a list of whole numbers, but it is a str."),
        (ch06.q3, lambda model, x, y: 0.5, "[Q3] 不正确：对于种子为 1 的模型和数据，"
         "调用 evaluate 时模型处于训练模式、梯度模式开启，准确率是 0.5000，但应该是 0.3750。",
         "[Q3] Incorrect: For the model and data of seed 1, the model in train mode and grad mode on when evaluate "
         "is called, the accuracy is 0.5000, but it should be 0.3750."),
        (ch06.q4, lambda *args: None, "[Q4] 不正确：make_loader 应该返回一个 DataLoader，而不是 None。",
         "[Q4] Incorrect: make_loader should return a DataLoader, not a NoneType."),
        (ch06.q2, 3, "[Q2] 不正确：请传入函数本身，`q2.check(accumulate_step)`（不要调用它），而不是一个整数。",
         "[Q2] Incorrect: pass your function itself, `q2.check(accumulate_step)` (without calling it), not an int."),
    ]


@pytest.mark.parametrize("i", range(len(_wrong_answers())))
def test_a_verdict_reads_in_chinese_in_the_chinese_edition_and_in_english_otherwise(i, monkeypatch):
    monkeypatch.setenv("COURSE_LANG", "zh")
    ex, answer, chinese, english = _wrong_answers()[i]
    result = ex.check(answer)
    assert repr(result) == chinese
    assert not [w for w in _ENGLISH if w in result.message], result.message
    assert "：" in result._repr_html_()
    monkeypatch.setenv("COURSE_LANG", "en")
    assert repr(ex.check(answer)) == english


def test_the_engines_own_words_in_chinese(monkeypatch):
    monkeypatch.setenv("COURSE_LANG", "zh")

    class Box:
        pass

    assert [core.kind(x) for x in (torch.zeros(3), Box, len, [1], 3, None, Box())] == [
        "形状为 (3,) 的张量", "类 Box", "一个函数", "一个列表", "一个整数", "None", "一个 Box"]
    with pytest.raises(Incorrect, match="^你的答案应该是一个数，但它是一个字符串。$"):
        as_number("3")
    with pytest.raises(Incorrect, match="^你的答案的每一项应该是一个整数，但它是 1.5。$"):
        as_ints([1, 1.5])
    with pytest.raises(Incorrect,
                       match=r"^x\.grad 应该是一个 torch\.Tensor，但它是一个 numpy 数组。`torch\.from_numpy"):
        as_tensor(np.zeros(2), "x.grad")
    assert spaced("x", "的梯度是", "0.5", "，而不是", "一个列表", "。") == "x 的梯度是 0.5，而不是一个列表。"
    def double(x):
        return 2 * x

    ex = Exercise("Q", double, prompt="p", hints=["h"], cases=lambda: [(1,)], describe=lambda c: f"当 x={c[0]} 时")
    assert ex.check(lambda x: [2 * x]).message == "当 x=1 时，`double` 的返回值是 [2]，但应该是 2。"
    assert ex.check(lambda x: "二").message == "当 x=1 时，`double` 的返回值是“二”，但应该是 2。"
    assert repr(_ex().hint(1)).startswith("Q · 提示 1/2")


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_in_chinese_the_model_answer_passes_and_each_mistake_still_gets_its_reason(mod, ex, monkeypatch):
    """The facts' names are Chinese there: the model answer's and the learner's must still line up."""
    monkeypatch.setenv("COURSE_LANG", "zh")
    assert ex.check(ex.reference()).status == "correct"
    for name, answer in ex.mistakes.items():
        assert ex.check(answer).message == ex.reasons[name]


# ----------------------------------------------------- verdicts that tell the truth, whatever the code does


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_bool_tensor_of_squares_is_told_its_values_in_plain_words(lang, monkeypatch):
    from course_utils.exercises import ch00

    monkeypatch.setenv("COURSE_LANG", lang)
    message = ch00.q1.check(torch.arange(1, 11) ** 2 > 0).message
    assert message == ch00.q1.reasons["booleans"]
    assert message.startswith(("its values are true/false", "其中的值是 true/false"))


def test_a_notimplementederror_from_torch_is_an_error_not_a_stub():
    """Only the learner's own `raise NotImplementedError` (the stub) is "not attempted": torch raises it for
    a misspelled `forward` or `backward`, and the learner must hear about that."""
    from course_utils.exercises import ch02

    class Misspelled(torch.nn.Module):  # `foward`: nn.Module's own forward raises NotImplementedError
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(784, 64), torch.nn.Linear(64, 64),
                                               torch.nn.Linear(64, 10)])

        def foward(self, x):
            return self.layers[-1](x)

    r = ch02.q1.check(Misspelled)
    assert r.status == "incorrect" and "forward" in r.message and "NotImplementedError" in r.message, r

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def bakward(ctx, grad):  # misspelled: torch's Function.backward raises NotImplementedError
            return grad

    def learner(x):
        t = torch.tensor(float(x), requires_grad=True)
        Square.apply(t).backward()
        return t.grad.item()

    r = _fn_ex().check(learner)
    assert r.status == "incorrect" and "backward" in r.message, r
    with progress_records() as records:
        _fn_ex().check(learner)
    assert [status for *_, status in records] == ["incorrect"]  # and recorded as tried, not as not attempted


@contextlib.contextmanager
def progress_records():
    calls = []
    real = progress.record
    progress.record = lambda *a: calls.append(a)
    try:
        yield calls
    finally:
        progress.record = real


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_a_default_device_set_earlier_does_not_change_the_verdict(mod, ex):
    """`torch.set_default_device("meta")` in an earlier cell: the model answer is still correct, and the
    learner's setting is there again afterwards. (A value answer is computed before: made after it, it is
    a meta tensor, which is the learner's to fix.)"""
    answer = ex.reference()
    torch.set_default_device("meta")
    try:
        result = ex.check(answer)
        assert torch.get_default_device().type == "meta"
    finally:
        torch.set_default_device(None)
    assert result.status == "correct", result


def test_what_an_answer_changes_is_put_back():
    """An answer that moves the kernel elsewhere (os.chdir) or sets a default device: the next cell
    (a `torchrun("scripts/...")` with a relative path) finds the kernel as it was."""
    import os
    import tempfile

    here = os.getcwd()
    with tempfile.TemporaryDirectory() as elsewhere:
        def wanders(x):
            os.chdir(elsewhere)
            torch.set_default_device("meta")
            return 2 * x

        assert _fn_ex().check(wanders).correct
        assert os.getcwd() == here
    assert torch.get_default_device().type == "cpu"


def test_check_never_raises_even_for_objects_that_cannot_be_shown():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text for you")

    def raises_it(x):
        raise Unprintable

    r = _fn_ex().check(raises_it)
    assert r.status == "incorrect" and "Unprintable" in r.message

    class NoRepr:
        def __repr__(self):
            raise RuntimeError("no repr for you")

    r = _fn_ex().check(lambda x: NoRepr())
    assert r.status == "incorrect" and "NoRepr" in r.message
    assert _ex().check(NoRepr()).status == "incorrect"


def test_a_hint_number_that_is_not_one_is_answered_not_raised():
    """q1.hint("1") or q1.hint(1.0) once raised a TypeError; a number out of range is answered the same way."""
    for bad in ("1", 1.0, 0, 5, True):
        assert "Ask for hint 1 to 1." in repr(_fn_ex().hint(bad)), bad
    assert "hint 1/1" in repr(_fn_ex().hint(1))
