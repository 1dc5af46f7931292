"""Chapter 06: "spot the bug": the learner fixes a pitfall, the check runs it and measures the symptom; and
the desynchronised collective found in the flight-recorder dumps of real jobs."""

import copy
import functools
import json
import tempfile
from collections import Counter
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from ..i18n import tr
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


def _reference_net():
    """The reference model from a generator of its own: however many random numbers the learner's class
    draws when it initialises itself (xavier_uniform_, hand-made parameters), the reference's weights,
    copied into it, are these."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return FixedNet()


q1 = Exercise(
    "Q1",
    FixedNet,
    form=nn.Module,
    cases=lambda: [torch.linspace(0, 1, 784 * 4).reshape(4, 784), torch.rand(6, 784)],
    observe=lambda cls, x: module_facts(cls, _reference_net, x),
    describe=lambda x: tr("for a batch of shape {shape}", "对于形状为 {shape} 的批次", shape=tuple(x.shape)),
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
    return {tr("the weights after two calls",
               "调用两次之后的权重"): [p.detach().clone() for p in model.parameters()]}


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
    describe=lambda c: tr("for {c} micro-batches of 4 samples with {c2} features",
                          "对于 {c} 个微批次，每个含 4 个样本、{c2} 个特征", c=c[0], c2=c[1]),
    mistakes=dict(
        no_scale=variant(accumulate_step, "(loss / k).backward()", "loss.backward()"),
        step_each=_step_each,
        no_zero_grad=variant(accumulate_step, "optimizer.zero_grad()", "pass"),
    ),
)


def evaluate(model, x, y):
    was_training = model.training  # the mode the training loop left it in
    model.eval()  # Dropout off, BatchNorm uses its running statistics
    with torch.no_grad():  # no graph, no saved activations (grad mode is back as it was afterwards)
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train(was_training)  # back to the mode it was in
    return acc


def _grad_switched_off(model, x, y):
    model.eval()
    torch.set_grad_enabled(False)  # off for everything after it, training included
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def _evaluate_facts(fn, case):
    seed, training, grad = case
    layers = [nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)]
    model = nn.Sequential(*layers)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(40, 8, generator=g), torch.randint(0, 3, (40,), generator=g)
    with torch.no_grad():  # give BatchNorm some running statistics
        for _ in range(5):
            model(x + 0.5)
    model.train(training)
    stats, grad_seen = model[1].running_mean.clone(), []
    model.register_forward_hook(lambda m, i, o: grad_seen.append(torch.is_grad_enabled()))
    torch.set_grad_enabled(grad)  # the session as the learner's loop has it when it calls evaluate
    try:
        result = fn(model, x, y)
        grad_after = torch.is_grad_enabled()  # judged before anything restores it
    finally:
        torch.set_grad_enabled(True)
    unchanged = tr("BatchNorm's running statistics are unchanged", "“BatchNorm 的滑动统计量保持不变”")
    yield unchanged, torch.equal(model[1].running_mean, stats)
    accuracy = tr("the accuracy", "准确率")
    yield accuracy, as_number(result, accuracy)
    yield tr("autograd recorded the forward pass", "“autograd 记录了前向传播”"), any(grad_seen)
    yield tr("the model is back in the mode it was in",
             "“模型已回到调用前的模式”"), model.training == training
    yield tr("grad mode is as it was before the call", "“梯度模式与调用前相同”"), grad_after == grad


q3 = Exercise(
    "Q3",
    evaluate,
    cases=lambda: [(1, True, True), (2, False, True), (3, True, False)],
    observe=_evaluate_facts,
    describe=lambda c: tr(
        "for the model and data of seed {seed}, the model in {mode} mode and grad mode {grad} when evaluate is called",
        "对于种子为 {seed} 的模型和数据，调用 evaluate 时模型处于{mode}模式、梯度模式{grad}",
        seed=c[0], mode=tr("train", "训练") if c[1] else tr("eval", "评估"),
        grad=tr("on", "开启") if c[2] else tr("off", "关闭"),
    ),
    mistakes=dict(
        train_mode=variant(evaluate, "model.eval()", "pass"),
        records_graph=variant(evaluate, "with torch.no_grad():", "if True:"),
        left_in_eval=variant(evaluate, "model.train(was_training)", "pass"),
        forces_train=variant(evaluate, "model.train(was_training)", "model.train()"),
        grad_left_off=_grad_switched_off,
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
                raise Incorrect(tr("make_loader should return a DataLoader, not {kind}.",
                                   "make_loader 应该返回一个 DataLoader，而不是{kind}。", kind=kind(loader)))
            batches = [torch.as_tensor(b).reshape(-1) for b in take(loader, n + 1)]
            sizes += [len(b) for b in batches]
            row.append([as_number(v, whole=True) for b in batches for v in b])
        orders.append(row)
    yield tr("the batch sizes", "批次大小"), sorted(set(sizes))
    visits = [Counter(i for r in row for i in set(r)) for row in orders]
    several = [sorted(i for i, c in v.items() if c > 1)[:10] for v in visits]
    yield tr("for each epoch, the samples that several ranks visit",
             "每个 epoch 中被多个 rank 访问的样本"), several
    once = [sorted(i for r in row for i in r) == list(range(n)) for row in orders]
    yield tr("for each epoch, every sample is visited once",
             "每个 epoch 是否每个样本都恰好被访问一次"), once
    same = [orders[e] == orders[e - 1] for e in range(1, epochs)]
    after_first = tr("for each epoch after the first, the order is the one of the epoch before",
                     "第一个之后的每个 epoch 的顺序是否与前一个 epoch 相同")
    yield after_first, same


q4 = Exercise(
    "Q4",
    make_loader,
    cases=lambda: [(20, 2, 2), (24, 3, 3)],
    observe=_loader_facts,
    describe=lambda c: tr("for {c} samples, {c2} ranks and {c3} epochs",
                          "对于 {c} 个样本、{c2} 个 rank 和 {c3} 个 epoch", c=c[0], c2=c[1], c3=c[2]),
    mistakes=dict(
        same_samples=lambda dataset, *_: DataLoader(dataset, batch_size=4, shuffle=True),
        same_order=variant(make_loader, "sampler.set_epoch(epoch)", "pass"),
    ),
)

def first_desync(records):
    ops = [{e["collective_seq_id"]: (e["profiling_name"], e["input_sizes"], e["input_dtypes"]) for e in entries}
           for entries in records.values()]
    start = max(min(seqs) for seqs in ops)  # older entries may have left a rank's ring buffer
    end = max(max(seqs) for seqs in ops)
    for seq in range(start, end + 1):
        first = ops[0].get(seq)
        if any(rank_ops.get(seq) != first for rank_ops in ops):  # another collective, or none at all
            return seq
    return None


def _two_ranks_only(records):
    zero, one = ({e["collective_seq_id"]: (e["profiling_name"], e["input_sizes"], e["input_dtypes"])
                  for e in records[r]} for r in (0, 1))
    return next((s for s in range(max(min(zero), min(one)), max(*zero, *one) + 1) if zero.get(s) != one.get(s)), None)


def _common_seqs_only(records):
    ops = [{e["collective_seq_id"]: (e["profiling_name"], e["input_sizes"], e["input_dtypes"]) for e in entries}
           for entries in records.values()]
    common = set.intersection(*(set(o) for o in ops))
    return next((s for s in sorted(common) if len({str(o[s]) for o in ops}) > 1), None)


def _by_position(records):
    for entries in zip(*records.values(), strict=False):
        if len({(e["profiling_name"], str(e["input_sizes"]), str(e["input_dtypes"])) for e in entries}) > 1:
            return entries[0]["collective_seq_id"]
    return None


# Real jobs that go out of step, each on its own ranks through the course's launcher, with the flight
# recorder on (TORCH_FR_BUFFER_SIZE=200, as chapter 06's job): first collectives every rank makes, then a
# tail that may differ between the ranks, enqueued without waiting (async_op=True: no rank hangs), then
# each rank's record as the dumps of section 7 hold it.
_FR_JOB = r"""
import json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.dist import setup

SCENARIOS = {  # name: (the collectives every rank makes, each rank's tail)
    "eval": ([("broadcast", "f", 128), ("broadcast", "l", 1), ("all_reduce", "f", 51018)] * 4,
             [[("broadcast", "f", 128), ("broadcast", "l", 1)], [("barrier",)]]),
    "sizes": ([("all_reduce", "f", 16)] * 5, [[("all_reduce", "f", 16)], [("all_reduce", "f", 15)]]),
    "ring": ([("all_reduce", "f", 1), ("broadcast", "f", 1)] * 115,
             [[("broadcast", "f", 8), ("broadcast", "f", 8)], [("barrier",)]]),
    "ahead": ([("all_reduce", "f", 2)] * 6, [[("all_reduce", "f", 2)], []]),
    "dtype": ([("all_gather", "f", 2)] * 3,
              [[("broadcast", "f", 4)], [("broadcast", "f", 4)], [("broadcast", "l", 4)]]),
    "agree": ([("all_reduce", "f", 3), ("all_gather", "l", 2)] * 3, [[("all_reduce", "f", 3)]] * 3),
}


def make(op, async_op, world):
    name, *rest = op
    if name == "barrier":
        return dist.barrier(async_op=async_op)
    kind, n = rest
    t = torch.ones(n, dtype=torch.float32 if kind == "f" else torch.int64)
    if name == "all_gather":
        return dist.all_gather([torch.zeros_like(t) for _ in range(world)], t, async_op=async_op)
    if name == "broadcast":
        return dist.broadcast(t, 0, async_op=async_op)
    return dist.all_reduce(t, async_op=async_op)


ctx = setup(backend="gloo", timeout_s=60.0)  # nothing waits on it but a start-up on a busy machine
common, tails = SCENARIOS[sys.argv[1]]
for op in common:
    make(op, False, ctx.world_size)
pending = [make(op, True, ctx.world_size) for op in tails[ctx.rank]]
record = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
keep = ("collective_seq_id", "profiling_name", "input_sizes", "input_dtypes", "state")
entries = [{k: e[k] for k in keep} for e in record["entries"]]
Path(sys.argv[2], f"rank{ctx.rank}.json").write_text(json.dumps(entries))
sys.stdout.flush()
os._exit(0)  # at once: the ranks' tails may never match
"""
_FR_CASES = (("eval", 2), ("sizes", 2), ("ring", 2), ("ahead", 2), ("dtype", 3), ("agree", 3))


def _fr_case_words(name: str) -> str:
    """What the job of case `name` does, in the course's language."""
    match name:
        case "eval":
            return tr("rank 0 evaluates through the DDP wrapper after the last epoch, rank 1 goes to the final barrier",
                      "最后一个 epoch 之后，rank 0 通过 DDP 包装器做评估，rank 1 进入最后的 barrier")
        case "sizes":
            return tr("the ranks all-reduce tensors of different sizes", "各 rank 对大小不同的张量做 all_reduce")
        case "ring":
            return tr("a long job: each rank's record holds only its last 200 collectives",
                      "一个很长的作业：每个 rank 的记录只保留最近 200 次集合通信")
        case "ahead":
            return tr("rank 0 makes one collective more than rank 1", "rank 0 比 rank 1 多做了一次集合通信")
        case "dtype":
            return tr("3 ranks: rank 2 broadcasts int64 where ranks 0 and 1 broadcast float32",
                      "3 个 rank：rank 0 和 rank 1 广播 float32 时，rank 2 广播的是 int64")
    return tr("3 ranks that stay in step", "3 个 rank 始终保持一致")


@functools.cache
def _flight_records():
    """Each case's records, from real ranks (a few tenths of a second each once the launcher is warm)."""
    from ..launch import LaunchError, torchrun  # imports torch.distributed: only when checking

    found = []
    with tempfile.TemporaryDirectory(prefix="ch06-q5-") as folder:
        Path(folder, "desync.py").write_text(_FR_JOB)
        for name, nproc in _FR_CASES:
            out = Path(folder, name)
            out.mkdir()
            for attempt in (1, 2, 3):  # a job of the check's own that failed on a busy machine: again
                try:
                    torchrun("desync.py", nproc=nproc, args=[name, out], env={"TORCH_FR_BUFFER_SIZE": "200"},
                             backend="gloo", show=False, timeout=120, cwd=folder)
                    break
                except LaunchError as exc:  # the check's own jobs: not the learner's fault, and not cached
                    if attempt == 3:
                        raise Incorrect(tr("the check could not run the job whose records it needs ({exc}); check "
                                           "again.",
                                           "检查程序无法运行它所需记录的那个作业（{exc}）；请再检查一次。",
                                           exc=exc)) from None
            found.append({r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)})
    return tuple(found)


def _desync_facts(fn, case):
    answer = fn(copy.deepcopy(_flight_records()[case]))
    what = tr("the first sequence number at which the ranks differ", "各 rank 开始不一致的第一个序号")
    yield what, None if answer is None else as_number(answer, what, whole=True)


q5 = Exercise(
    "Q5",
    first_desync,
    cases=lambda: range(len(_FR_CASES)),
    observe=_desync_facts,
    describe=lambda i: tr("for the dumps of a real job where {job}", "对于一个真实作业的转储（{job}）",
                          job=_fr_case_words(_FR_CASES[i][0])),
    mistakes=dict(
        two_ranks_only=_two_ranks_only,
        common_seqs_only=_common_seqs_only,
        name_only=variant(first_desync, 'e["input_sizes"], e["input_dtypes"]', "None"),
        by_position=_by_position,
    ),
)

EXERCISES = [q1, q2, q3, q4, q5]
