"""Every exercise of every chapter: its solution passes, the stub reads "not attempted",
and each plausible wrong answer is reported Incorrect with a reason. Plus the framework itself."""

import pytest
import torch

from course_utils.exercises import (
    Exercise,
    Incorrect,
    all_exercises,
    expect_close,
    expect_equal,
    expect_tensor,
)

ALL = [(mod, ex) for mod, exs in sorted(all_exercises().items()) for ex in exs]
IDS = [f"{mod}-{ex.name}" for mod, ex in ALL]


def test_every_chapter_module_lists_exercises():
    found = all_exercises()
    assert "ch00" in found
    for mod, exs in found.items():
        if mod != "ch00":
            assert 2 <= len(exs) <= 5, f"{mod} should have 3-4 exercises, has {len(exs)}"


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_solution_is_correct(mod, ex):
    result = ex.check(ex.solve())
    assert result.status == "correct", result


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_stub_is_not_attempted(mod, ex):
    assert ex.check(...).status == "not_attempted"
    assert ex.check().status == "not_attempted"


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_wrong_answers_are_incorrect_with_a_reason(mod, ex):
    assert len(ex.wrong_answers) >= 2, "each exercise needs at least two plausible wrong answers"
    for description, make in ex.wrong_answers:
        result = ex.check(make())
        assert result.status == "incorrect", f"{description!r} was not reported Incorrect: {result}"
        assert len(result.message) > 15, f"{description!r}: the reason is too thin: {result.message!r}"


@pytest.mark.parametrize(("mod", "ex"), ALL, ids=IDS)
def test_hints_and_solution_display(mod, ex):
    assert ex.hints, "every exercise has at least one hint"
    first = repr(ex.hint())
    assert "hint 1/" in first
    assert ex.solution_code.strip() in repr(ex.solution())
    assert "<pre>" in ex.solution()._repr_html_()


def _ex(checker):
    return Exercise("Q", "prompt", checker, ["h1", "h2"], "x = 1", lambda: 1, [])


def test_not_attempted_forms():
    ex = _ex(lambda a: expect_equal(a, 1))
    for stub in (..., None, ""):
        assert ex.check(stub).status == "not_attempted"

    def stub_fn():
        raise NotImplementedError

    ex2 = _ex(lambda f: expect_equal(f(), 1))
    assert ex2.check(stub_fn).status == "not_attempted"


def test_learner_exception_is_an_incorrect_with_its_message():
    def learner():
        return torch.ones(2) @ torch.ones(3)

    ex = _ex(lambda f: expect_equal(f(), 1))
    r = ex.check(learner)
    assert r.status == "incorrect"
    assert "RuntimeError" in r.message and "Fix that error" in r.message
    assert "torch.ones(2) @ torch.ones(3)" in r.message  # points at the learner's own line


def test_results_display_in_text_and_html():
    ex = _ex(lambda a: expect_equal(a, 1))
    r = ex.check(2)
    assert repr(r).startswith("[Q] Incorrect:")
    assert "Incorrect" in r._repr_html_() and not bool(r)
    assert bool(ex.check(1)) and "Correct" in repr(ex.check(1))


def test_hints_come_in_order_and_are_bounded():
    ex = _ex(lambda a: None)
    assert "h1" in repr(ex.hint()) and "h2" in repr(ex.hint()) and "h2" in repr(ex.hint())
    assert "1 to 2" in repr(ex.hint(7))
    assert "with hints" in repr(ex.check(1))


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        ([1.0, 2.0], "should be a torch.Tensor, but it is a list"),
        (torch.zeros(3), "shape (3,), but it should have shape (2,)"),
        (torch.tensor([1, 2]), "dtype torch.int64, but it should be torch.float32"),
        (torch.tensor([1.0, 5.0]), "wrong values: 5 at index (1,) where 2 was expected"),
    ],
)
def test_tensor_comparison_reasons(answer, fragment):
    with pytest.raises(Incorrect, match=None) as info:
        expect_tensor(answer, torch.tensor([1.0, 2.0]), "t")
    assert fragment in str(info.value)


def test_tensor_requires_grad_and_grad():
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(Incorrect, match="should have requires_grad=True"):
        expect_tensor(x, torch.tensor([1.0, 2.0], requires_grad=True), check_requires_grad=True)
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(Incorrect, match="grad is None"):
        expect_tensor(w, w.detach(), expected_grad=torch.ones(2))
    (w * 3).sum().backward()
    expect_tensor(w, w.detach(), expected_grad=torch.full((2,), 3.0))
    with pytest.raises(Incorrect, match="grad has the right shape but wrong values"):
        expect_tensor(w, w.detach(), expected_grad=torch.ones(2))


def test_scalar_comparisons():
    expect_equal(torch.tensor(3), 3)
    expect_equal(3.0, 3)
    with pytest.raises(Incorrect, match="whole number"):
        expect_equal("3", 3)
    with pytest.raises(Incorrect, match="True or False"):
        expect_equal(1, True)
    expect_close(0.1 + 0.2, 0.3)
    with pytest.raises(Incorrect, match="should be a number"):
        expect_close("0.3", 0.3)
    with pytest.raises(Incorrect, match="not right"):
        expect_close(float("nan"), 0.3)
