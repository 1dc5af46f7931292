"""Chapter 06 (pitfalls): "spot the bug". Each exercise shows a short program with one pitfall;
the learner writes the fixed version, and the check *runs* it and measures the symptom."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from .core import Exercise, Incorrect, NotAttempted, _kind

# --------------------------------------------------------------------------------------------
# Q1: a layer created in forward()
# --------------------------------------------------------------------------------------------

Q1_PARAMS = 784 * 32 + 32 + 32 * 10 + 10  # 25,450


def _make(cls):
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise Incorrect(f"pass the class itself (e.g. `q1.check(FixedNet)`), an nn.Module subclass; got {_kind(cls)}.")
    torch.manual_seed(0)
    try:
        return cls()
    except TypeError as exc:
        raise Incorrect(f"`FixedNet()` should work without arguments: {exc}") from exc


def _check_q1(cls):
    model = _make(cls)
    n = sum(p.numel() for p in model.parameters())
    if n == 0:
        raise Incorrect(
            "the optimizer would see 0 parameters: layers kept in a plain Python list, a dict, or created in "
            "forward() are not registered. Assign each layer to `self.<name>` (or use nn.ModuleList) in __init__."
        )
    if n != Q1_PARAMS:
        missing = Q1_PARAMS - n
        raise Incorrect(
            f"the optimizer sees {n:,} parameters, but Linear(784, 32) + Linear(32, 10) have {Q1_PARAMS:,}"
            + (f" ({missing:,} missing: a layer is still created in forward(), so it is never registered)."
               if missing > 0 else ".")
        )
    x = torch.linspace(0, 1, 784 * 4).reshape(4, 784)
    with torch.no_grad():
        out1, out2 = model(x), model(x)
    if tuple(out1.shape) != (4, 10):
        raise Incorrect(f"the output for 4 images should have shape (4, 10), not {tuple(out1.shape)}.")
    if not torch.equal(out1, out2):
        raise Incorrect("the same input gave two different outputs: forward() still makes new random weights.")
    # It trains: every parameter moves, and 30 full-batch steps bring the loss down.
    g = torch.Generator().manual_seed(0)
    xs = torch.rand(64, 784, generator=g)
    ys = (xs[:, :10] * torch.arange(1.0, 11.0)).argmax(1)  # a learnable rule
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if any(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)):
        raise Incorrect("some parameters did not change during training: is every layer used in forward()?")
    if not losses[-1] < 0.9 * losses[0]:
        raise Incorrect(f"the model does not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f} in 30 steps.")


class _Q1Buggy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)

    def forward(self, x):
        fc2 = nn.Linear(32, 10)
        return fc2(torch.relu(self.fc1(x)))


class _Q1List(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(784, 32), nn.Linear(32, 10)]  # a plain list: not registered

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


class _Q1Fixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


q1 = Exercise(
    name="Q1",
    prompt="Fix `Net` so that both layers train: write `FixedNet` (no constructor arguments).",
    checker=_check_q1,
    hints=[
        "Count the parameters: `sum(p.numel() for p in Net().parameters())`. Which layer is missing?",
        "Every layer that has weights must be created once, in __init__, and assigned to `self.<name>`.",
    ],
    solution_code="""\
class FixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)     # declared once, registered, seen by the optimizer

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))""",
    solve=lambda: _Q1Fixed,
    wrong_answers=[
        ("the buggy class itself", lambda: _Q1Buggy),
        ("layers in a plain Python list", lambda: _Q1List),
        ("an instance instead of the class", lambda: _Q1Fixed()),
    ],
)

# --------------------------------------------------------------------------------------------
# Q2: gradient accumulation on purpose
# --------------------------------------------------------------------------------------------


def _q2_problem():
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = nn.Linear(6, 3).double()
    batches = [
        [(torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g))
         for _ in range(4)]
        for _ in range(2)
    ]
    return model, batches


def _q2_reference(model, batches, mistake=""):
    """Two optimizer steps of 4 micro-batches each; `mistake` simulates a known error."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for micro in batches:
        if mistake != "no_zero":
            opt.zero_grad()
        for x, y in micro:
            loss = F.cross_entropy(model(x), y)
            (loss if mistake == "no_scale" else loss / len(micro)).backward()
            if mistake == "step_each":
                opt.step()
        if mistake != "step_each":
            opt.step()
    return [p.detach() for p in model.parameters()]


def _check_q2(fn):
    if not callable(fn):
        raise Incorrect(f"pass your function `accumulate_step` itself, not {_kind(fn)}.")
    model, batches = _q2_problem()
    start = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for micro in batches:  # two accumulation steps in a row, as in a training loop
        fn(model, opt, micro)
    got = [p.detach() for p in model.parameters()]
    if all(torch.equal(a, b) for a, b in zip(got, start.parameters(), strict=True)):
        raise Incorrect("the weights did not change: call optimizer.step() once the micro-batches are done.")

    def same(params):
        return all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(got, params, strict=True))

    if same(_q2_reference(start, batches)):
        return
    reasons = {
        "no_scale": "the step is k times too large: divide each micro-batch's loss by k (the number of "
                    "micro-batches) so that the summed gradient is the mean over the big batch.",
        "step_each": "you stepped after every micro-batch; accumulation steps once, after the last one.",
        "no_zero": "the second step still contained the first step's gradients: clear them with "
                   "optimizer.zero_grad() before accumulating (or right after step()).",
    }
    for mistake, why in reasons.items():
        if same(_q2_reference(start, batches, mistake)):
            raise Incorrect(why)
    raise Incorrect("after two calls the weights differ from two steps on the matching big batches. "
                    "Zero the gradients, backward each micro-batch's loss / k, then step once.")


def _q2_solution(model, optimizer, micro_batches):
    optimizer.zero_grad()
    k = len(micro_batches)
    for x, y in micro_batches:
        loss = F.cross_entropy(model(x), y)
        (loss / k).backward()
    optimizer.step()


def _q2_wrong(mistake):
    def fn(model, optimizer, micro_batches):
        if mistake != "no_zero":
            optimizer.zero_grad()
        for x, y in micro_batches:
            loss = F.cross_entropy(model(x), y)
            (loss if mistake == "no_scale" else loss / len(micro_batches)).backward()
            if mistake == "step_each":
                optimizer.step()
        if mistake != "step_each":
            optimizer.step()
    return fn


q2 = Exercise(
    name="Q2",
    prompt="Write `accumulate_step(model, optimizer, micro_batches)`: one optimizer step that equals one "
           "step on all the micro-batches together (cross-entropy loss).",
    checker=_check_q2,
    hints=[
        "Three things: start from clean gradients, make each micro-batch count 1/k, step once at the end.",
        "The mean loss over k equal micro-batches is the mean of their means: backward `loss / k`.",
    ],
    solution_code="""\
def accumulate_step(model, optimizer, micro_batches):
    optimizer.zero_grad()                       # nothing left over from the previous step
    k = len(micro_batches)
    for x, y in micro_batches:
        loss = F.cross_entropy(model(x), y)
        (loss / k).backward()                   # gradients add up in .grad: scale each by 1/k
    optimizer.step()                            # one step for the whole big batch""",
    solve=lambda: _q2_solution,
    wrong_answers=[
        ("loss not divided by k", lambda: _q2_wrong("no_scale")),
        ("a step after every micro-batch", lambda: _q2_wrong("step_each")),
        ("zero_grad forgotten", lambda: _q2_wrong("no_zero")),
    ],
)

# --------------------------------------------------------------------------------------------
# Q3: an evaluation function with every mode right
# --------------------------------------------------------------------------------------------


def _q3_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 8, generator=g)
    model.train()
    with torch.no_grad():  # give BatchNorm some running statistics
        for _ in range(5):
            model(x + 0.5)
    y = torch.randint(0, 3, (40,), generator=g)
    return model, x, y


def _check_q3(fn):
    if not callable(fn):
        raise Incorrect(f"pass your function `evaluate` itself, not {_kind(fn)}.")
    model, x, y = _q3_model()
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():
        expected = (ref(x).argmax(1) == y).float().mean().item()
    stats = model[1].running_mean.clone()
    grad_seen = []
    model.register_forward_hook(lambda m, i, o: grad_seen.append(torch.is_grad_enabled()))
    model.train()
    result = fn(model, x, y)
    if isinstance(result, torch.Tensor):
        if result.requires_grad:
            raise Incorrect("the accuracy you return still requires grad: compute it under torch.no_grad().")
        result = result.item()
    if not isinstance(result, float | int) or isinstance(result, bool):
        raise Incorrect(f"evaluate should return the accuracy as a number, not {_kind(result)}.")
    if not torch.equal(model[1].running_mean, stats):
        raise Incorrect("BatchNorm's running statistics changed during evaluation: the model was in train mode. "
                        "Call model.eval() first.")
    if abs(result - expected) > 1e-9:
        raise Incorrect(f"accuracy {result:.4f}, but the model in eval mode scores {expected:.4f}: "
                        "Dropout and BatchNorm must be in eval mode.")
    if any(grad_seen):
        raise Incorrect("autograd recorded the forward pass (a graph built for nothing): "
                        "wrap the evaluation in `with torch.no_grad():`.")
    if not model.training:
        raise Incorrect("the model came back in eval mode: training would continue without Dropout and with "
                        "frozen BatchNorm statistics. Call model.train() before returning.")


def _q3_solution(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def _q3_no_eval(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def _q3_no_grad_off(model, x, y):
    model.eval()
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def _q3_no_train(model, x, y):
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


q3 = Exercise(
    name="Q3",
    prompt="Write `evaluate(model, x, y)` returning the accuracy, for a model with Dropout and BatchNorm "
           "that is in the middle of training.",
    checker=_check_q3,
    hints=[
        "Two switches for evaluation: one for the layers (Dropout, BatchNorm), one for autograd.",
        "And one for afterwards: the training loop expects the model back in the mode it was in.",
    ],
    solution_code="""\
def evaluate(model, x, y):
    model.eval()                                # Dropout off, BatchNorm uses its running statistics
    with torch.no_grad():                       # no graph, no saved activations
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()                               # back to training mode for the next step
    return acc""",
    solve=lambda: _q3_solution,
    wrong_answers=[
        ("model.eval() forgotten", lambda: _q3_no_eval),
        ("torch.no_grad() forgotten", lambda: _q3_no_grad_off),
        ("model.train() forgotten afterwards", lambda: _q3_no_train),
    ],
)

# --------------------------------------------------------------------------------------------
# Q4: each rank's DataLoader under DDP
# --------------------------------------------------------------------------------------------


def _q4_orders(fn, n=20, world=2, epochs=2):
    data = list(range(n))
    orders = []
    for epoch in range(epochs):
        row = []
        for rank in range(world):
            torch.manual_seed(0)  # every rank seeds the same way
            loader = fn(data, rank, world, epoch)
            if not isinstance(loader, DataLoader):
                raise Incorrect(f"make_loader should return a DataLoader, not {_kind(loader)}.")
            row.append([int(v) for batch in loader for v in torch.as_tensor(batch).reshape(-1)])
        orders.append(row)
    return orders


def _check_q4(fn):
    if not callable(fn):
        raise Incorrect(f"pass your function `make_loader` itself, not {_kind(fn)}.")
    orders = _q4_orders(fn)
    for epoch, (r0, r1) in enumerate(orders):
        both = set(r0) & set(r1)
        if both:
            raise Incorrect(f"in epoch {epoch} both ranks visit {len(both)} of the same samples: each rank must get "
                            "its own slice of the data (a DistributedSampler), not a shuffle of all of it.")
        if sorted(r0 + r1) != list(range(20)):
            raise Incorrect(f"in epoch {epoch} the two ranks together do not visit every sample exactly once.")
    if orders[0] == orders[1]:
        raise Incorrect("epoch 1 visits the samples in exactly the same order as epoch 0: call "
                        "sampler.set_epoch(epoch) so that the shuffle changes every epoch.")


def _q4_solution(dataset, rank, world_size, epoch):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def _q4_shuffle(dataset, rank, world_size, epoch):
    return DataLoader(dataset, batch_size=4, shuffle=True)


def _q4_no_set_epoch(dataset, rank, world_size, epoch):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def _q4_stub_guard(fn):
    if fn is None:
        raise NotAttempted("write make_loader first.")
    return _check_q4(fn)


q4 = Exercise(
    name="Q4",
    prompt="Write `make_loader(dataset, rank, world_size, epoch)`: the DataLoader one DDP rank uses in one "
           "epoch (batch size 4, shuffled).",
    checker=_q4_stub_guard,
    hints=[
        "Under DDP each rank must see a different slice: `DistributedSampler(dataset, num_replicas, rank)`.",
        "A sampler shuffles with a seed that only changes when you tell it the epoch.",
    ],
    solution_code="""\
def make_loader(dataset, rank, world_size, epoch):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    sampler.set_epoch(epoch)                    # a new shuffle every epoch, the same on every rank
    return DataLoader(dataset, batch_size=4, sampler=sampler)   # no shuffle=True with a sampler""",
    solve=lambda: _q4_solution,
    wrong_answers=[
        ("shuffle=True instead of a DistributedSampler", lambda: _q4_shuffle),
        ("set_epoch forgotten", lambda: _q4_no_set_epoch),
    ],
)

EXERCISES = [q1, q2, q3, q4]
