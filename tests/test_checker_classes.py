"""Classes of wrong verdicts that came from how the checks of chapters 01-03 were built, one test per
class (each failed on the checker before its fix): a reference that shared the learner's random
stream, graphs too simple to tell a walk from the engine, a stated constraint that no case tested,
after-effects of an answer left unjudged, and a rule tried on one table per boundary."""

import statistics

import pytest
import torch
from torch import nn
from torch.autograd import grad as bound_before_the_check  # a name the check cannot patch

from course_utils.exercises import ch01, ch02, ch03, ch06

# ------------------------------------------------------------------ a reference with its own generator


class KaimingNet(nn.Module):
    """Q1 of chapter 02, correct, initialising its hidden layers as chapter 02's section on
    initialisation teaches: it draws more random numbers than nn.Linear's default."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        for layer in (self.fc1, self.fc2):
            nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class KaimingSmall(nn.Module):
    """Q1 of chapter 06 (784 -> 32 -> 10), correct, with its own initialisation."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 32), nn.Linear(32, 10)
        nn.init.kaiming_normal_(self.fc1.weight, nonlinearity="relu")

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_model_with_its_own_initialisation_is_judged_with_the_references_weights():
    assert ch02.q1.check(KaimingNet).correct, ch02.q1.check(KaimingNet)
    assert ch06.q1.check(KaimingSmall).correct, ch06.q1.check(KaimingSmall)


# ------------------------------------------------------------------ a walk is not the engine


def per_path_walk(out):
    """The walk chapter 01 once gave as its model answer: a node is called once per path to it."""
    grads = {}

    def visit(node, g):
        if node is None:
            return
        if hasattr(node, "variable"):
            grads[node.variable] = grads[node.variable] + g if node.variable in grads else g
            return
        sent = node(g)
        for (nxt, _), s in zip(node.next_functions, (sent,) if isinstance(sent, torch.Tensor) else sent,
                               strict=True):
            visit(nxt, s)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def visited_walk(out):
    """Enters each inner node once (a `visited` set): the second path's gradient is lost."""
    grads, seen = {}, set()

    def visit(node, g):
        if node is None:
            return
        if hasattr(node, "variable"):
            grads[node.variable] = grads[node.variable] + g if node.variable in grads else g
            return
        if node in seen:
            return
        seen.add(node)
        sent = node(g)
        for (nxt, _), s in zip(node.next_functions, (sent,) if isinstance(sent, torch.Tensor) else sent,
                               strict=True):
            visit(nxt, s)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def plus_equals_walk(out):
    """Adds in place into the tensor it stored: AddBackward0 hands the same tensor to both inputs."""
    grads = {}

    def visit(node, g):
        if node is None:
            return
        if hasattr(node, "variable"):
            if node.variable in grads:
                grads[node.variable] += g
            else:
                grads[node.variable] = g
            return
        sent = node(g)
        for (nxt, _), s in zip(node.next_functions, (sent,) if isinstance(sent, torch.Tensor) else sent,
                               strict=True):
            visit(nxt, s)

    with torch.no_grad():
        visit(out.grad_fn, torch.ones_like(out))
    return grads


def grad_through_an_earlier_name(out):
    """autograd itself, through a name bound at import (the check's patch of torch.autograd.grad missed it)."""
    leaves = ch01._leaves(out)
    return dict(zip(leaves, bound_before_the_check(out, leaves, retain_graph=True), strict=True))


@pytest.mark.parametrize("walk", [per_path_walk, visited_walk, plus_equals_walk, grad_through_an_earlier_name])
def test_walks_that_are_not_the_engine_are_refused(walk):
    result = ch01.q5.check(walk)
    assert result.status == "incorrect", result


def test_the_engine_algorithm_handles_shared_nodes_and_nodes_with_several_outputs():
    torch.manual_seed(0)
    words = torch.randn(5, 2, requires_grad=True)
    v1, v2, v3, _, _ = words.unbind()
    pieces = words.split(2)
    h = words[0]
    for _ in range(20):  # 2**20 paths: a walk per path does not finish
        h = h + h * 0.5
    out = torch.tanh(v1 * v2).sum() + v3.sum() + (pieces[0] ** 2).sum() + h.sum()
    got = ch01.backward_walk(out)
    (want,) = torch.autograd.grad(out, words)
    assert torch.allclose(got[words], want)


# ------------------------------------------------------------------ a stated constraint, tested


def hessian_then_product(f, x, v):
    return torch.autograd.functional.hessian(f, x) @ v


def hessian_row_by_row(f, x, v):
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return torch.stack([torch.autograd.grad(gi, x, retain_graph=True)[0] @ v for gi in g])


@pytest.mark.parametrize("answer", [hessian_then_product, hessian_row_by_row])
def test_an_hvp_that_computes_the_whole_hessian_is_refused(answer):
    result = ch01.q3.check(answer)
    assert result.status == "incorrect", result


def test_ready_made_hvp_is_accepted_as_the_prompt_says():
    assert ch01.q3.check(lambda f, x, v: torch.autograd.functional.hvp(f, x, v)[1]).correct
    assert ch01.q3.check(torch.autograd.functional.hvp).message == ch01.q3.reasons["functional_pair"]


# ------------------------------------------------------------------ an answer's after-effects, judged


class AliasScale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor, persistent=False)
        self.f = factor  # a plain alias: .half() and .to() replace the buffer, not this

    def forward(self, x):
        return x * self.f


class InPlaceScale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor, persistent=False)

    def forward(self, x):
        x *= self.factor  # overwrites the caller's tensor
        return x


class HiddenScale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", factor)  # persistent, then hidden

    def state_dict(self, *args, **kwargs):
        sd = super().state_dict(*args, **kwargs)
        return {k: v for k, v in sd.items() if not k.endswith("factor")}

    def forward(self, x):
        return x * self.factor


@pytest.mark.parametrize("answer", [AliasScale, InPlaceScale, HiddenScale])
def test_a_scale_whose_after_effects_are_wrong_is_refused(answer):
    result = ch02.q2.check(answer)
    assert result.status == "incorrect", result


def global_hook_recorder(model, x):
    shapes = []
    leaves = {m: name for name, m in model.named_modules() if not list(m.children())}

    def hook(module, inputs, output):
        if module in leaves:
            shapes.append((leaves[module], tuple(output.shape)))

    nn.modules.module.register_module_forward_hook(hook)  # global, never removed
    model(x)
    return shapes


def leaves_in_turn(model, x):
    """No hooks at all: call each leaf in turn (wrong when the forward is not a plain chain)."""
    shapes = []
    for name, module in model.named_modules():
        if not list(module.children()):
            x = module(x)
            shapes.append((name, tuple(x.shape)))
    return shapes


@pytest.mark.parametrize("answer", [global_hook_recorder, leaves_in_turn])
def test_hooks_left_anywhere_or_no_hooks_at_all_are_refused(answer):
    before = dict(nn.modules.module._global_forward_hooks)
    result = ch02.q4.check(answer)
    assert result.status == "incorrect", result
    assert dict(nn.modules.module._global_forward_hooks) == before, "the check cleans up after the answer"


# ------------------------------------------------------------------ a rule on many tables


def _medians(seconds):
    return {w: statistics.median(t) for w, t in sorted(seconds.items())}


def greedy_stop(seconds):
    """Add workers while the next setting is more than 5% faster; stop at the first that is not."""
    medians = _medians(seconds)
    order = sorted(medians)
    pick = order[0]
    for w in order[1:]:
        if medians[w] * 1.05 < medians[pick]:
            pick = w
        else:
            break
    return pick


def greedy_scan(seconds):
    """The same, but it keeps scanning past a setting that was not faster."""
    medians = _medians(seconds)
    order = sorted(medians)
    pick = order[0]
    for w in order[1:]:
        if medians[w] * 1.05 < medians[pick]:
            pick = w
    return pick


@pytest.mark.parametrize("rule", [greedy_stop, greedy_scan])
def test_greedy_rules_are_refused(rule):
    result = ch03.q5.check(rule)
    assert result.status == "incorrect", result
