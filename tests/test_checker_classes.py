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
    assert ch01.q3.check(lambda f, x, v: torch.autograd.functional.vhp(f, x, v)[1]).correct  # the prompt's
    assert ch01.q3.check(lambda f, x, v: torch.autograd.functional.hvp(f, x, v)[1]).correct  # slower, also right
    for pair in (torch.autograd.functional.vhp, torch.autograd.functional.hvp):
        assert ch01.q3.check(pair).message == ch01.q3.reasons["functional_pair"]


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


# ------------------------------------------------------------------ a correct answer in another form


class OutputDeclaredFirst(nn.Module):
    """Q1 of chapter 02, correct, its output layer declared before the hidden ones."""

    def __init__(self):
        super().__init__()
        self.out, self.fc1, self.fc2 = nn.Linear(64, 10), nn.Linear(784, 64), nn.Linear(64, 64)

    def forward(self, x):
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))


class HiddenReversed(nn.Module):
    """Correct, the hidden layers declared in reverse: two biases of 64 swap places in parameters()."""

    def __init__(self):
        super().__init__()
        self.fc2 = nn.Linear(64, 64)
        self.fc1 = nn.Linear(784, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))


class RawParameters(nn.Module):
    """Correct, with bare Parameters declared last layer first, the first layer through addmm (bias first)."""

    def __init__(self):
        super().__init__()
        for name, shape in (("b3", (10,)), ("w3", (10, 64)), ("b2", (64,)), ("w2", (64, 64)),
                            ("b1", (64,)), ("w1", (64, 784))):
            setattr(self, name, nn.Parameter(torch.randn(shape) * 0.05))

    def forward(self, x):
        h = torch.relu(torch.addmm(self.b1, x.flatten(1), self.w1.t()))
        h = torch.relu(h @ self.w2.T + self.b2)
        return nn.functional.linear(h, self.w3, self.b3)


@pytest.mark.parametrize("answer", [OutputDeclaredFirst, HiddenReversed, RawParameters])
def test_a_model_whose_layers_are_declared_in_another_order_is_accepted(answer):
    result = ch02.q1.check(answer)
    assert result.correct, result


class SmallReversed(nn.Module):
    """Q1 of chapter 06, correct, its output layer declared first."""

    def __init__(self):
        super().__init__()
        self.fc2, self.fc1 = nn.Linear(32, 10), nn.Linear(784, 32)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_chapter_06s_model_is_matched_by_role_too():
    assert ch06.q1.check(SmallReversed).correct


class WithDropout(nn.Module):
    """ListNet's layers registered, plus a Dropout: the same as the reference in eval mode only."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 64), nn.Linear(64, 64), nn.Linear(64, 10)])
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers[:-1]:
            x = self.drop(torch.relu(layer(x)))
        return self.layers[-1](x)


def test_a_model_that_adds_a_dropout_is_refused():
    result = ch02.q1.check(WithDropout)
    assert result.message == ch02.q1.reasons["dropout_added"], result


def groups_of_generators(model, weight_decay):
    """Correct: AdamW lists a generator itself (add_param_group calls list(params))."""
    return [{"params": (p for p in model.parameters() if p.ndim >= 2), "weight_decay": weight_decay},
            {"params": (p for p in model.parameters() if p.ndim < 2), "weight_decay": 0.0}]


def test_parameter_groups_given_as_generators_are_accepted():
    result = ch02.q5.check(groups_of_generators)
    assert result.correct, result


# ------------------------------------------------------------------ what the prompt asks, all of it


def split_after_random_seed(dataset, val_fraction, seed):
    import random

    order = list(range(len(dataset)))
    random.seed(seed)  # reproducible, but Python's global stream restarts from the seed
    random.shuffle(order)
    n_val = int(len(dataset) * val_fraction)
    return torch.utils.data.Subset(dataset, order[n_val:]), torch.utils.data.Subset(dataset, order[:n_val])


def split_after_numpy_seed(dataset, val_fraction, seed):
    import numpy as np

    np.random.seed(seed)
    order = np.random.permutation(len(dataset)).tolist()
    n_val = int(len(dataset) * val_fraction)
    return torch.utils.data.Subset(dataset, order[n_val:]), torch.utils.data.Subset(dataset, order[:n_val])


def split_after_torch_seed(dataset, val_fraction, seed):
    torch.manual_seed(seed)
    order = torch.randperm(len(dataset)).tolist()
    n_val = int(len(dataset) * val_fraction)
    return torch.utils.data.Subset(dataset, order[n_val:]), torch.utils.data.Subset(dataset, order[:n_val])


@pytest.mark.parametrize("answer", [split_after_random_seed, split_after_numpy_seed, split_after_torch_seed])
def test_a_split_that_reseeds_a_global_generator_is_refused_for_that_reason(answer):
    result = ch03.q6.check(answer)
    assert result.message == ch03.q6.reasons["reseeded"], result


def split_with_its_own_python_generator(dataset, val_fraction, seed):
    import random

    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    n_val = int(len(dataset) * val_fraction)
    return torch.utils.data.Subset(dataset, order[n_val:]), torch.utils.data.Subset(dataset, order[:n_val])


def test_a_split_with_a_generator_of_its_own_is_accepted():
    assert ch03.q6.check(split_with_its_own_python_generator).correct


def collate_into_float_zeros(batch):
    seqs = [s for s, _ in batch]
    padded = torch.zeros(len(seqs), max(len(s) for s in seqs))  # float32: no dtype given
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    return padded, torch.tensor([len(s) for s in seqs]), torch.tensor([y for _, y in batch])


def collate_as_int32(batch):
    padded, lengths, labels = ch03.collate(batch)
    return padded.int(), lengths, labels  # int32 ids: nn.Embedding takes them


def test_padded_token_ids_must_stay_integers_an_embedding_takes():
    assert ch03.q2.check(collate_into_float_zeros).message == ch03.q2.reasons["float_ids"]
    assert ch03.q2.check(collate_as_int32).correct
    assert nn.Embedding(10, 2)(collate_as_int32([(torch.tensor([1, 2]), 0)])[0]).shape == (1, 2, 2)


def numerical_grad_in_float32(f, x, eps=1e-6):
    values = []
    for i in range(x.numel()):
        x_plus, x_minus = x.clone(), x.clone()
        x_plus[i] += eps
        x_minus[i] -= eps
        values.append((f(x_plus) - f(x_minus)) / (2 * eps))
    return torch.tensor(values)  # float32, the default dtype: the task asks for float64


def test_a_finite_difference_gradient_in_float32_is_refused():
    assert ch01.q4.check(numerical_grad_in_float32).message == ch01.q4.reasons["float32"]


def test_a_walk_that_passes_none_for_unreached_slots_is_the_model_answer():
    import inspect

    assert "torch.zeros(" not in inspect.getsource(ch01.backward_walk)
    assert ch01.q5.check(ch01.backward_walk).correct
