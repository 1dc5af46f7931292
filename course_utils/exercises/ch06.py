"""Chapter 06: "spot the bug": the learner fixes a pitfall, the check runs it and measures the symptom."""

from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from ..i18n import spaced, tr
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
    describe=lambda x: tr(f"for a batch of shape {tuple(x.shape)}", f"对于形状为 {tuple(x.shape)} 的批次"),
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
    return {tr("the weights after two calls", "调用两次之后的权重"): [p.detach().clone() for p in model.parameters()]}


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
    describe=lambda c: tr(f"for {c[0]} micro-batches of 4 samples with {c[1]} features",
                          f"对于 {c[0]} 个微批次，每个含 4 个样本、{c[1]} 个特征"),
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
    unchanged = tr("BatchNorm's running statistics are unchanged", "“BatchNorm 的滑动统计量保持不变”")
    yield unchanged, torch.equal(model[1].running_mean, stats)
    accuracy = tr("the accuracy", "准确率")
    yield accuracy, as_number(result, accuracy)
    yield tr("autograd recorded the forward pass", "“autograd 记录了前向传播”"), any(grad_seen)
    yield tr("the model is back in train mode", "“模型已回到训练模式”"), model.training


q3 = Exercise(
    "Q3",
    evaluate,
    cases=lambda: [1, 2],
    observe=_evaluate_facts,
    describe=lambda seed: tr(f"for the model and data of seed {seed}", f"对于种子为 {seed} 的模型和数据"),
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
                raise Incorrect(tr(f"make_loader should return a DataLoader, not {kind(loader)}.",
                                   spaced("make_loader 应该返回一个 DataLoader，而不是", kind(loader), "。")))
            batches = [torch.as_tensor(b).reshape(-1) for b in take(loader, n + 1)]
            sizes += [len(b) for b in batches]
            row.append([as_number(v, whole=True) for b in batches for v in b])
        orders.append(row)
    yield tr("the batch sizes", "批次大小"), sorted(set(sizes))
    visits = [Counter(i for r in row for i in set(r)) for row in orders]
    several = [sorted(i for i, c in v.items() if c > 1)[:10] for v in visits]
    yield tr("for each epoch, the samples that several ranks visit", "每个 epoch 中被多个 rank 访问的样本"), several
    once = [sorted(i for r in row for i in r) == list(range(n)) for row in orders]
    yield tr("for each epoch, every sample is visited once", "每个 epoch 是否每个样本都恰好被访问一次"), once
    same = [orders[e] == orders[e - 1] for e in range(1, epochs)]
    after_first = tr("for each epoch after the first, the order is the one of the epoch before",
                     "第一个之后的每个 epoch 的顺序是否与前一个 epoch 相同")
    yield after_first, same


q4 = Exercise(
    "Q4",
    make_loader,
    cases=lambda: [(20, 2, 2), (24, 3, 3)],
    observe=_loader_facts,
    describe=lambda c: tr(f"for {c[0]} samples, {c[1]} ranks and {c[2]} epochs",
                          f"对于 {c[0]} 个样本、{c[1]} 个 rank 和 {c[2]} 个 epoch"),
    mistakes=dict(
        same_samples=lambda dataset, *_: DataLoader(dataset, batch_size=4, shuffle=True),
        same_order=variant(make_loader, "sampler.set_epoch(epoch)", "pass"),
    ),
)

EXERCISES = [q1, q2, q3, q4]
