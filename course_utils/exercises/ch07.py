"""Chapter 07: a tensor-parallel plan and balanced batches, both run on 2 real ranks by the check; the
pipeline bubble and the ring all-reduce's bytes, as formulas."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from .. import ROOT
from ..ch07_parallelism import CHAPTER_IMPORTS, Q3_LENGTHS, plan_to_spec, random_batches
from ..i18n import tr
from .core import Exercise, Incorrect, as_ints, as_number, take, variant

SCRIPTS = ROOT / "notebooks" / "scripts"
LAUNCH_TIMEOUT_S = 90.0  # one job of the check, started and stopped by the launcher
_RESULTS: dict[tuple[str, str], dict] = {}  # (script, the answer as JSON) -> what the ranks reported


def _run_on_ranks(script: str, stem: str, answers: list[Any], wrap=lambda items: items) -> None:
    """Run every answer of `answers` (JSON data) not yet run, in ONE job of 2 ranks of `script`
    (``--plans FILE --out DIR``), and keep what rank 0 reported for each. The job runs on the launcher's
    warm server that has imported the chapter's modules, as the notebook's first cell asks for (the
    same server, when that cell ran; else one started here, as the notebook's would be)."""
    from ..launch import WARM_IMPORTS_VAR, LaunchError, torchrun

    todo = []
    for a in answers:
        key = (script, json.dumps(a, sort_keys=True))
        if key not in _RESULTS and a not in todo:
            todo.append(a)
    if not todo:
        return
    with tempfile.TemporaryDirectory(prefix="course07-check-") as folder:
        plans = Path(folder, "plans.json")
        plans.write_text(json.dumps(wrap(todo)))
        try:
            torchrun(SCRIPTS / script, nproc=2, args=["--plans", plans, "--out", folder], timeout=LAUNCH_TIMEOUT_S,
                     backend="gloo", show=False, cwd=ROOT / "notebooks",
                     env={WARM_IMPORTS_VAR: ",".join(CHAPTER_IMPORTS)})
        except LaunchError as exc:
            raise Incorrect(tr("the check could not run on 2 ranks: {value}", "检查无法在 2 个 rank 上运行：{value}",
                               value=exc.error or exc)) from None
        results = json.loads(Path(folder, f"{stem}_rank0.json").read_text())["results"]
    for a, res in zip(todo, results, strict=True):
        _RESULTS[(script, json.dumps(a, sort_keys=True))] = res


def _ranks_said(script: str, stem: str, answer: Any, others: list[Any], wrap=lambda items: items) -> dict:
    """What the ranks reported for `answer`; `others` (the model answer, the declared mistakes) run in
    the same job when they have not run yet, so that a check starts at most two jobs."""
    _run_on_ranks(script, stem, [answer, *others], wrap)
    return _RESULTS[(script, json.dumps(answer, sort_keys=True))]


def _on_ranks(name: str, answer, observe, mistakes: dict) -> Exercise:
    """An exercise whose answer (a value) is run by the ranks of a script: its check has the time of a job."""
    return Exercise(name, answer, form="value", observe=observe, mistakes=mistakes, extra_time_s=LAUNCH_TIMEOUT_S)


# ----------------------------------------------------------------------------- Q1: a TP plan


def answer_q1():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}


def _styles(**kinds):
    """A plan of default styles, e.g. _styles(q="Colwise", o="Rowwise")."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    made = {"Colwise": ColwiseParallel, "Rowwise": RowwiseParallel}
    return {name: made[kind]() for name, kind in kinds.items()}


def _o_gathered():
    """o column-wise behind an all-gather of its input, its output gathered again: correct numbers, but
    two all-gathers in forward where Megatron's row-wise o needs one all-reduce."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate())


def _q1_mistakes() -> dict:
    return dict(
        all_colwise=_styles(q="Colwise", k="Colwise", v="Colwise", o="Colwise"),
        swapped=_styles(q="Rowwise", k="Rowwise", v="Rowwise", o="Colwise"),
        o_not_split=_styles(q="Colwise", k="Colwise", v="Colwise"),
        o_all_gathered={**_styles(q="Colwise", k="Colwise", v="Colwise"), "o": _o_gathered()},
        nothing_split={},
    )


def _observe_q1(answer, _):
    try:
        spec = plan_to_spec(answer)
    except ValueError as exc:
        raise Incorrect(tr("{exc}. Write the plan as a dict such as {{'q': ColwiseParallel(), ...}}.",
                           "{exc}。请把计划写成一个字典，例如 {{'q': ColwiseParallel(), ...}}。", exc=exc)) from None
    others = [plan_to_spec(answer_q1())] + [plan_to_spec(m) for m in _q1_mistakes().values()]
    res = _ranks_said("tensor_parallel.py", "tp_plans", spec, others)
    yield tr("the error on the ranks", "各 rank 上的报错"), res.get("error", tr("none", "无"))
    if "error" in res:
        return
    same = max(res["output"], res["input_grad"], res["weight_grads"]) < 1e-12
    yield tr("output and gradients equal to the unsplit attention", "输出与梯度等于未切分的注意力"), same
    yield tr("the part of q.weight (64 x 64) each rank holds", "每个 rank 持有的 q.weight（64 x 64）部分"), \
        res["shards"]["q.weight"][1]
    yield tr("all-reduces in one forward", "一次前向中的 all-reduce 次数"), res["forward"].get("all_reduce", 0)


q1 = _on_ranks("Q1", answer_q1, _observe_q1, _q1_mistakes())


# ----------------------------------------------------------------------------- Q2: the bubble


def bubble(stages, microbatches):
    return (stages - 1) / (microbatches + stages - 1)


_Q2_CASES = [(2, 4), (4, 8), (4, 4), (8, 32), (1, 5)]
q2 = Exercise(
    "Q2",
    bubble,
    cases=lambda: _Q2_CASES,
    observe=lambda fn, c: as_number(fn(*c), tr("the bubble fraction", "气泡比例")),
    describe=lambda c: tr("for {c} stages and {c2} micro-batches", "当有 {c} 个阶段、{c2} 个微批次时", c=c[0], c2=c[1]),
    mistakes=dict(
        per_microbatch=variant(bubble, "(microbatches + stages - 1)", "microbatches"),
        all_stages_wait=variant(bubble, "(stages - 1) /", "stages /"),
        percentage=variant(bubble, "return (stages - 1)", "return 100 * (stages - 1)"),
    ),
)


# ----------------------------------------------------------------------------- Q3: balanced batches


Q3_WORLD, Q3_STEPS, Q3_BATCH = 2, 4, 4


def answer_q3():
    from course_utils.ch07_parallelism import Q3_LENGTHS as lengths

    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    plan = [[], []]
    for step in range(len(order) // 8):  # 8 samples a step: 4 for each of the 2 ranks
        group = order[8 * step: 8 * step + 8]
        plan[0].append([group[0], group[3], group[4], group[7]])  # long, short, long, short:
        plan[1].append([group[1], group[2], group[5], group[6]])  # the same tokens on both ranks
    return plan


def _as_plan(answer) -> list:
    what = tr("your plan", "你的计划")
    ranks = take(answer, Q3_WORLD + 1)
    if len(ranks) != Q3_WORLD:
        raise Incorrect(tr("{what} should have one list of batches for each of the {world} ranks, not {n}.",
                           "{what}应当为 {world} 个 rank 各给出一个批次列表，而不是 {n} 个。",
                           what=what, world=Q3_WORLD, n=len(ranks)))
    plan = []
    for r, rank in enumerate(ranks):
        batches = take(rank, len(Q3_LENGTHS) + 1)
        plan.append([as_ints(b, tr("a batch of rank {r}", "rank {r} 的一个批次", r=r)) for b in batches])
        shape = [len(b) for b in plan[-1]]
        if shape != [Q3_BATCH] * Q3_STEPS:
            raise Incorrect(tr("rank {r} should read {Q3_STEPS} batches of {Q3_BATCH} samples each; its batches have "
                               "{shape} samples.",
                               "rank {r} 应当读取 {Q3_STEPS} 个批次，每批 {Q3_BATCH} 个样本；它的批次分别有 {shape} "
                               "个样本。",
                               r=r, Q3_STEPS=Q3_STEPS, Q3_BATCH=Q3_BATCH, shape=shape))
    if any(not 0 <= i < len(Q3_LENGTHS) for rank in plan for b in rank for i in b):
        raise Incorrect(tr("every index must be a sample of Q3_LENGTHS: 0 to {value}.",
                           "每个索引都必须是 Q3_LENGTHS 中的样本：0 到 {value}。", value=len(Q3_LENGTHS) - 1))
    return plan


def _observe_q3(answer, _):
    plan = [[sorted(b) for b in rank] for rank in _as_plan(answer)]  # (the order inside a batch changes nothing)
    others = [[[sorted(b) for b in rank] for rank in p] for p in [answer_q3(), *_q3_mistakes().values()]]
    res = _ranks_said("stragglers.py", "straggler_plans", plan, others,
                      wrap=lambda plans: {"lengths": Q3_LENGTHS, "plans": plans})
    yield tr("the ranks refused the plan", "各 rank 拒绝了该计划"), res.get("error", tr("no", "否"))
    if "error" in res:
        return
    read = sorted(i for rank in res["indices"] for i in rank)
    yield tr("every sample read exactly once",
             "每个样本恰好被读取一次"), read == list(range(len(Q3_LENGTHS)))
    steps = list(zip(*res["tokens"], strict=True))
    ratio = sum(max(s) for s in steps) / sum(sum(s) / len(s) for s in steps)
    balanced = (tr("yes", "是") if ratio <= 1.05
                else tr("no: {ratio:.2f} times the mean", "否：是平均值的 {ratio:.2f} 倍", ratio=ratio))
    yield tr("balanced (the busiest rank's tokens, summed over the steps, at most 1.05 times the mean's)",
             "是否均衡（各步中最忙 rank 的 token 数之和不超过平均值的 1.05 倍）"), balanced


def _q3_mistakes() -> dict:
    order = sorted(range(len(Q3_LENGTHS)), key=lambda i: Q3_LENGTHS[i], reverse=True)
    return dict(
        random=random_batches(Q3_LENGTHS, Q3_WORLD, Q3_BATCH, seed=0),
        longest_on_one_rank=[[order[i:i + 4] for i in range(0, 16, 4)], [order[i:i + 4] for i in range(16, 32, 4)]],
        sample_twice=[[answer_q3()[1][0]] + answer_q3()[0][1:], answer_q3()[1]],  # rank 1's first batch twice
    )


q3 = _on_ranks("Q3", answer_q3, _observe_q3, _q3_mistakes())


# ----------------------------------------------------------------------------- Q4: the ring's bytes


def ring_bytes(nbytes, world_size):
    return 2 * (world_size - 1) / world_size * nbytes


_Q4_CASES = [(4_000_000, 4), (4_000_000, 2), (1024, 3), (6_000, 8), (100, 1)]
q4 = Exercise(
    "Q4",
    ring_bytes,
    cases=lambda: _Q4_CASES,
    observe=lambda fn, c: as_number(fn(*c), tr("the bytes", "字节数")),
    describe=lambda c: tr("for a tensor of {c:,} bytes on {c2} ranks", "当张量为 {c:,} 字节、有 {c2} 个 rank 时",
                          c=c[0], c2=c[1]),
    mistakes=dict(
        reduce_scatter_only=variant(ring_bytes, "2 * (world_size - 1)", "(world_size - 1)"),
        whole_tensor_each_step=variant(ring_bytes, " / world_size * nbytes", " * nbytes"),
        twice_the_tensor=variant(ring_bytes, "2 * (world_size - 1) / world_size * nbytes", "2 * nbytes"),
    ),
)

EXERCISES = [q1, q2, q3, q4]
