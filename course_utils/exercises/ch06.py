"""Chapter 06: "spot the bug": the learner fixes a pitfall, the check runs it and measures the symptom."""

from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from .core import Exercise, Incorrect, as_number, kind, take, variant
from .shared import module_facts


class FixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)  # declared once, registered, seen by the optimizer

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _InAList(FixedNet):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = [nn.Linear(784, 32), nn.Linear(32, 10)]  # a plain list: not registered

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


q1 = Exercise(
    "Q1",
    FixedNet,
    form=nn.Module,
    cases=lambda: [torch.linspace(0, 1, 784 * 4).reshape(4, 784), torch.rand(6, 784)],
    observe=lambda cls, x: module_facts(cls, FixedNet, x),
    describe=lambda x: f"for a batch of shape {tuple(x.shape)}",
    mistakes=dict(
        layer_in_forward=variant(
            FixedNet, "nn.Linear(32, 10)", "None", "self.fc2(", "nn.Linear(32, 10)("
        ),
        plain_list=_InAList,
    ),
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

    def micro_batch():
        x = torch.randn(4, features, generator=g, dtype=torch.float64)
        return x, torch.randint(0, 3, (4,), generator=g)

    for _ in range(2):  # two accumulation steps in a row, as in a training loop
        fn(model, opt, [micro_batch() for _ in range(k)])
    return {"the weights after two calls": [p.detach().clone() for p in model.parameters()]}


def _step_each(model, optimizer, micro_batches):
    for x, y in micro_batches:  # the ordinary loop: no accumulation at all
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


q2 = Exercise(
    "Q2",
    accumulate_step,
    cases=lambda: [(4, 6), (2, 5), (3, 4)],
    observe=_accumulate_facts,
    describe=lambda c: f"for {c[0]} micro-batches of 4 samples with {c[1]} features",
    mistakes=dict(
        no_scale=variant(accumulate_step, "(loss / k).backward()", "loss.backward()"),
        step_each=_step_each,
        no_zero_grad=variant(accumulate_step, "optimizer.zero_grad()", "pass"),
    ),
)


def evaluate(model, x, y):
    model.eval()  # Dropout off, BatchNorm uses its running statistics
    with torch.no_grad():  # no graph, no saved activations
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()  # back to training mode for the next step
    return acc


def _evaluate_facts(fn, seed):
    layers = [nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)]
    model = nn.Sequential(*layers)
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


q3 = Exercise(
    "Q3",
    evaluate,
    cases=lambda: [1, 2],
    observe=_evaluate_facts,
    describe=lambda seed: f"for the model and data of seed {seed}",
    mistakes=dict(
        train_mode=variant(evaluate, "model.eval()", "pass"),
        records_graph=variant(evaluate, "with torch.no_grad():", "if True:"),
        left_in_eval=variant(evaluate, "model.train()", "pass"),
    ),
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
    visits = [Counter(i for r in row for i in set(r)) for row in orders]
    several = [sorted(i for i, c in v.items() if c > 1)[:10] for v in visits]
    yield "for each epoch, the samples that several ranks visit", several
    once = [sorted(i for r in row for i in r) == list(range(n)) for row in orders]
    yield "for each epoch, every sample is visited once", once
    same = [orders[e] == orders[e - 1] for e in range(1, epochs)]
    yield "for each epoch after the first, the order is the one of the epoch before", same


q4 = Exercise(
    "Q4",
    make_loader,
    cases=lambda: [(20, 2, 2), (24, 3, 3)],
    observe=_loader_facts,
    describe=lambda c: f"for {c[0]} samples, {c[1]} ranks and {c[2]} epochs",
    mistakes=dict(
        same_samples=lambda dataset, *_: DataLoader(dataset, batch_size=4, shuffle=True),
        same_order=variant(make_loader, "sampler.set_epoch(epoch)", "pass"),
    ),
)

EXERCISES = [q1, q2, q3, q4]
