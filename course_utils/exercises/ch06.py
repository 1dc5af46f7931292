"""Chapter 06 (pitfalls): "spot the bug". Each exercise shows a short program with one pitfall;
the learner writes the fixed version, and the check *runs* it and measures the symptom."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from .ch02 import module_facts
from .core import Exercise, Incorrect, as_number, kind, take


class FixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)  # declared once, registered, seen by the optimizer

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _Buggy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)

    def forward(self, x):
        return nn.Linear(32, 10)(torch.relu(self.fc1(x)))


class _InAList(FixedNet):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = [nn.Linear(784, 32), nn.Linear(32, 10)]  # a plain list: not registered

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


q1 = Exercise(
    name="Q1",
    prompt="Fix `Net` so that both layers train: write `FixedNet` (no constructor arguments).",
    model_answer=FixedNet,
    form=nn.Module,
    cases=lambda: [torch.linspace(0, 1, 784 * 4).reshape(4, 784), torch.rand(6, 784)],
    observe=lambda cls, x: module_facts(cls, FixedNet, x),
    describe=lambda x: f"for a batch of shape {tuple(x.shape)}",
    hints=[
        "Count the parameters: `sum(p.numel() for p in Net().parameters())`. Which layer is missing?",
        "Every layer that has weights must be created once, in __init__, and assigned to `self.<name>`.",
    ],
    mistakes={
        "the optimizer sees only fc1: fc2 is still created in forward(), so it is never registered and gets new random weights on every call. Create it in __init__ as `self.fc2`.": _Buggy,
        "the optimizer would see 0 parameters: layers kept in a plain Python list are not registered. Assign each layer to `self.<name>` (or use nn.ModuleList) in __init__.": _InAList,
    },
)


def accumulate_step(model, optimizer, micro_batches):
    optimizer.zero_grad()  # nothing left over from the previous step
    k = len(micro_batches)
    for x, y in micro_batches:
        loss = F.cross_entropy(model(x), y)
        (loss / k).backward()  # gradients add up in .grad: scale each by 1/k
    optimizer.step()  # one step for the whole big batch


def _accumulate_facts(fn, case):
    k, features = case
    g = torch.Generator().manual_seed(k)
    model = nn.Linear(features, 3).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # two accumulation steps in a row, as in a training loop
        fn(model, opt, [(torch.randn(4, features, generator=g, dtype=torch.float64),
                         torch.randint(0, 3, (4,), generator=g)) for _ in range(k)])
    return {"the weights after two calls": [p.detach().clone() for p in model.parameters()]}


def _accumulate_wrong(mistake):
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
    prompt="Write `accumulate_step(model, optimizer, micro_batches)`: one optimizer step that equals one step on all the (equal-sized) micro-batches together (cross-entropy loss).",
    model_answer=accumulate_step,
    cases=lambda: [(4, 6), (2, 5), (3, 4)],
    observe=_accumulate_facts,
    describe=lambda c: f"for {c[0]} micro-batches of 4 samples with {c[1]} features",
    hints=[
        "Three things: start from clean gradients, make each micro-batch count 1/k, step once at the end.",
        "The mean loss over k equal micro-batches is the mean of their means: backward `loss / k`.",
    ],
    mistakes={
        "the step is k times too large: divide each micro-batch's loss by k (the number of micro-batches) so that the summed gradient is the mean over the big batch.": _accumulate_wrong("no_scale"),
        "you stepped after every micro-batch; accumulation steps once, after the last one.": _accumulate_wrong("step_each"),
        "the second step still contained the first step's gradients: clear them with optimizer.zero_grad() before accumulating (or right after step()).": _accumulate_wrong("no_zero"),
    },
)


def evaluate(model, x, y):
    model.eval()  # Dropout off, BatchNorm uses its running statistics
    with torch.no_grad():  # no graph, no saved activations
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()  # back to training mode for the next step
    return acc


def _evaluate_facts(fn, seed):
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(40, 8, generator=g), torch.randint(0, 3, (40,), generator=g)
    with torch.no_grad():  # give BatchNorm some running statistics
        for _ in range(5):
            model(x + 0.5)
    stats, grad_seen = model[1].running_mean.clone(), []
    model.register_forward_hook(lambda m, i, o: grad_seen.append(torch.is_grad_enabled()))
    result = fn(model, x, y)
    yield "BatchNorm's running statistics are unchanged", torch.equal(model[1].running_mean, stats)
    yield "the accuracy", as_number(result, "the accuracy")
    yield "autograd recorded the forward pass", any(grad_seen)
    yield "the model is back in train mode", model.training


def _evaluate_wrong(eval_mode=True, no_grad=True, train=True):
    def evaluate_(model, x, y):
        model.train(not eval_mode)
        with torch.set_grad_enabled(not no_grad):
            acc = (model(x).argmax(1) == y).float().mean().item()
        model.train(train)
        return acc

    return evaluate_


q3 = Exercise(
    name="Q3",
    prompt="Write `evaluate(model, x, y)` returning the accuracy as a number, for a model with Dropout and BatchNorm that is in the middle of training.",
    model_answer=evaluate,
    cases=lambda: [1, 2],
    observe=_evaluate_facts,
    describe=lambda seed: f"for the model and data of seed {seed}",
    hints=[
        "Two switches for evaluation: one for the layers (Dropout, BatchNorm), one for autograd.",
        "And one for afterwards: the training loop expects the model back in the mode it was in.",
    ],
    mistakes={
        "BatchNorm's running statistics changed during evaluation, and Dropout was on: the model was in train mode. Call model.eval() first.": _evaluate_wrong(eval_mode=False),
        "autograd recorded the forward pass (a graph built for nothing): wrap the evaluation in `with torch.no_grad():`.": _evaluate_wrong(no_grad=False),
        "the model came back in eval mode: training would continue without Dropout and with frozen BatchNorm statistics. Call model.train() before returning.": _evaluate_wrong(train=False),
    },
)


def make_loader(dataset, rank, world_size, epoch):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
    return DataLoader(dataset, batch_size=4, sampler=sampler)  # no shuffle=True with a sampler


def _loader_facts(fn, case):
    n, world, epochs = case
    orders, sizes = [], []
    for epoch in range(epochs):
        row = []
        for rank in range(world):
            torch.manual_seed(0)  # every rank seeds the same way
            loader = fn(list(range(n)), rank, world, epoch)
            if not isinstance(loader, DataLoader):
                raise Incorrect(f"make_loader should return a DataLoader, not {kind(loader)}.")
            batches = [torch.as_tensor(b).reshape(-1) for b in take(loader, n + 1)]
            sizes += [len(b) for b in batches]
            row.append([as_number(v, whole=True) for b in batches for v in b])
        orders.append(row)
    yield "the batch sizes", sorted(set(sizes))
    yield "for each epoch, the samples that several ranks visit", [
        sorted(i for i, c in Counter(i for r in row for i in set(r)).items() if c > 1)[:10] for row in orders]
    yield "for each epoch, every sample is visited once", [sorted(i for r in row for i in r) == list(range(n)) for row in orders]
    yield "for each epoch after the first, the order is the one of the epoch before", [orders[e] == orders[e - 1] for e in range(1, epochs)]


q4 = Exercise(
    name="Q4",
    prompt="Write `make_loader(dataset, rank, world_size, epoch)`: the DataLoader one DDP rank uses in one epoch (batch size 4, shuffled).",
    model_answer=make_loader,
    cases=lambda: [(20, 2, 2), (24, 3, 3)],
    observe=_loader_facts,
    describe=lambda c: f"for {c[0]} samples, {c[1]} ranks and {c[2]} epochs",
    hints=[
        "Under DDP each rank must see a different slice: `DistributedSampler(dataset, num_replicas, rank)`.",
        "A sampler shuffles with a seed that only changes when you tell it the epoch.",
    ],
    mistakes={
        "the ranks visit the same samples: each rank must get its own slice of the data (a DistributedSampler), not a shuffle of all of it.": lambda dataset, rank, world_size, epoch: DataLoader(dataset, batch_size=4, shuffle=True),
        "every epoch visits the samples in exactly the same order: call sampler.set_epoch(epoch) so that the shuffle changes every epoch.": lambda d, r, w, e: DataLoader(d, batch_size=4, sampler=DistributedSampler(d, num_replicas=w, rank=r)),
    },
)

EXERCISES = [q1, q2, q3, q4]
