"""course_utils.ch07_parallelism (the schedules in unit time, the batch plans, the plans of the
exercise, the measuring helpers, the pictures) and every script of chapter 07 run for real on gloo
ranks, each part's equality or measurement asserted."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys

import pytest
import torch
import torch.distributed as dist

from course_utils import ROOT
from course_utils import ch07_parallelism as ch07
from course_utils.dist import single_process_group
from course_utils.figures import alt_text, pyplot
from course_utils.i18n import speaking
from course_utils.launch import torchrun

SCRIPTS = ROOT / "notebooks" / "scripts"
# the launcher's warm server imports the chapter's modules once, as the notebook asks it to
pytestmark = pytest.mark.usefixtures("chapter_07_imports")


# ----------------------------------------------------------------------------- formulas and schedules


def test_ring_bytes_and_the_bubble():
    assert ch07.ring_allreduce_bytes(1000, 1) == 0
    assert ch07.ring_allreduce_bytes(1000, 2) == 1000
    assert math.isclose(ch07.ring_allreduce_bytes(3000, 3), 4000)
    assert ch07.bubble_fraction(1, 5) == 0 and ch07.bubble_fraction(2, 4) == 0.2
    with pytest.raises(ValueError, match="at least 1"):
        ch07.ring_allreduce_bytes(10, 0)
    with pytest.raises(ValueError, match="at least 1"):
        ch07.bubble_fraction(2, 0)


def test_schedule_orders_are_pytorchs():
    assert ch07.schedule_orders("GPipe", 2, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 2
    # 1F1B: stage s warms up with p - s forwards, then alternates backward and forward
    assert ch07.schedule_orders("1F1B", 2, 3) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)],
    ]
    with pytest.raises(ValueError, match="schedule must be one of"):
        ch07.schedule_orders("Interleaved", 2, 2)


@pytest.mark.parametrize("schedule", ch07.SCHEDULES)
@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 4), (4, 4), (4, 8), (3, 7)])
def test_unit_time_bubble_is_the_formula_and_1f1b_holds_less(schedule, p, m):
    facts = ch07.timeline_facts(ch07.run_in_unit_time(ch07.schedule_orders(schedule, p, m)))
    assert math.isclose(facts["bubble"], ch07.bubble_fraction(p, m))
    expected = [m] * p if schedule == "GPipe" else [min(m, p - s) for s in range(p)]
    assert facts["peak_in_flight"] == expected


def test_an_order_that_waits_on_itself_is_refused():
    with pytest.raises(RuntimeError, match="not a valid schedule"):
        ch07.run_in_unit_time([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])


# ----------------------------------------------------------------------------- batches of variable length


def test_batch_plans_read_every_sample_once_and_sorting_balances():
    lengths = [int(v) for v in torch.randint(8, 257, (64,), generator=torch.Generator().manual_seed(0))]
    for make in (ch07.random_batches, ch07.length_grouped_batches):
        plan = make(lengths, 2, 4, seed=0)
        assert sorted(i for rank in plan for b in rank for i in b) == list(range(64))
        assert {len(b) for rank in plan for b in rank} == {4} and len(plan[0]) == len(plan[1]) == 8
    assert ch07.imbalance(ch07.random_batches(lengths, 2, 4), lengths) > 1.05
    assert ch07.imbalance(ch07.length_grouped_batches(lengths, 2, 4), lengths) < 1.01
    with pytest.raises(ValueError, match="do not make one step"):
        ch07.random_batches(lengths[:5], 2, 4)


# ----------------------------------------------------------------------------- the exercise's plans


def test_plans_travel_as_data_and_come_back_the_same():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"q": ColwiseParallel(), "o": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
    spec = ch07.plan_to_spec(plan)
    assert json.loads(json.dumps(spec)) == spec
    back = ch07.plan_from_spec(spec)
    assert type(back["o"]) is RowwiseParallel and back["o"].output_layouts == (Shard(1),)
    assert back["o"].use_local_output is False and back["q"].input_layouts == (Replicate(),)


@pytest.mark.parametrize(("plan", "said"), [
    ([], "should be a dict"),
    ({"attn.q": None}, "not a layer of the attention"),
    ({"q": "ColwiseParallel"}, "should be ColwiseParallel() or RowwiseParallel()"),
])
def test_a_plan_that_is_not_one_is_refused_clearly(plan, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        ch07.plan_to_spec(plan)


def test_the_block_plans_name_real_layers():
    block = ch07.Block()
    names = dict(block.named_modules())
    for sp in (False, True):
        assert set(ch07.tp_plan(sp)) <= set(names)


# ----------------------------------------------------------------------------- measuring helpers


def test_max_diff_gathers_and_refuses_other_shapes():
    assert ch07.max_diff(torch.ones(3), torch.ones(3) * 1.5) == 0.5
    with pytest.raises(ValueError, match="shapes differ"):
        ch07.max_diff(torch.ones(3), torch.ones(4))


def test_the_collective_counter_counts_what_reaches_the_dispatcher():
    with single_process_group():
        with ch07.CollectiveCounter() as c:
            t = torch.ones(4)
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        assert c.counts == {"all_reduce": 1, "broadcast": 1}


def _script(name):
    """A script of notebooks/scripts imported as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(f"ch07_script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_all_reduces_in_no_sync_backward_unless_the_forward_ran_in_no_sync_too():
    """comm_overlap.py's baseline without overlap: DDP decides at the forward whether the backward will
    all-reduce, so a backward alone inside no_sync() still all-reduces."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    overlap = _script("comm_overlap")
    with single_process_group():
        model = DDP(overlap.make(torch.device("cpu")), bucket_cap_mb=1)
        state = {"calls": 0}
        model.register_comm_hook(state, overlap.counting_hook)
        x = torch.randn(4, overlap.WIDTH)
        calls = {}
        for inside in ("backward", "forward and backward", "backward"):
            state["calls"] = 0
            if inside == "backward":
                loss = model(x).pow(2).mean()
                with model.no_sync():
                    loss.backward()
            else:
                with model.no_sync():
                    model(x).pow(2).mean().backward()
            calls.setdefault(inside, []).append(state["calls"])
    # a backward alone in no_sync(): 1 bucket at the first step (DDP has not seen the order yet), then 8
    assert calls == {"backward": [1, 8], "forward and backward": [0]}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/io is Linux's")
def test_bytes_written_counts_this_process_writes(tmp_path):
    before = ch07.bytes_written()
    (tmp_path / "f").write_bytes(b"x" * 10_000)
    assert ch07.bytes_written() - before >= 10_000


def test_quiet_native_stderr_hides_what_libraries_write_to_fd_2(capfd):
    with ch07.quiet_native_stderr():
        os.write(2, b"profiler_start\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_records_round_trip_and_a_missing_one_says_what_to_do(tmp_path):
    ch07.write_record(None, "x", 0, {"a": 1})  # nothing, no error
    for r in (1, 0, 10, 2):
        ch07.write_record(tmp_path, "x", r, {"rank": r})
    assert [rec["rank"] for rec in ch07.load_records(tmp_path, "x")] == [0, 1, 2, 10]
    with pytest.raises(FileNotFoundError, match="did the script run with --out"):
        ch07.load_records(tmp_path, "y")


def test_chunk_rows_is_torch_chunks_split():
    for rows, n in ((256, 3), (10, 4), (5, 8), (64, 2)):
        sizes = [t.shape[0] for t in torch.arange(rows).chunk(n)] + [0] * n
        assert [b - a for a, b in (ch07.chunk_rows(rows, n, r) for r in range(n))] == sizes[:n]
    with pytest.raises(ValueError, match="rank must be in"):
        ch07.chunk_rows(10, 2, 2)


# ----------------------------------------------------------------------------- pictures (from fake records)


def _events(p, m):
    return [[(k, i, s / 1000, e / 1000) for k, i, s, e in stage]
            for stage in ch07.run_in_unit_time(ch07.schedule_orders("1F1B", p, m))]


FAKE = {
    "tp": {"shards": {"attn.q.weight": [[64, 64], [32, 64]], "attn.o.weight": [[64, 64], [64, 32]],
                      "mlp.up.weight": [[256, 64], [128, 64]], "mlp.down.weight": [[64, 256], [64, 128]]}},
    "pp": [{"microbatches": 4, "results": {name: {"events": _events(2, 4)[r], "peak_in_flight": 2 - r}
                                           for name in ("GPipe", "1F1B")}} for r in range(2)],
    "mesh": [{"rank": r, "fsdp_tp": {"rows": list(range(16 * r, 16 * r + 16)), "coords": [r // 2, r % 2]},
              "hsdp": {"rows": list(range(32 * (r % 2), 32 * (r % 2) + 32)), "coords": [r // 2, r % 2]}}
             for r in range(4)],
    "overlap": {"trace": {"compute": [(0.0, 5.0, "AddmmBackward0")], "comm": [(1.0, 3.0, "gloo:all_reduce")]},
                "sweep": {"1.0": {"overlapped": 0.002, "exposed": 0.001, "buckets": 8},
                          "25.0": {"overlapped": 0.0, "exposed": 0.004, "buckets": 1}}},
    "stragglers": [{"rank": r, "slow_rank": 1, "delay": 0.1, "base": {"compute": 0.01, "allreduce": 0.002},
                    "slowed": {"compute": 0.01 + 0.1 * r, "allreduce": 0.1 * (1 - r)}} for r in range(2)],
}


@pytest.mark.parametrize("draw", ["schedule", "tp", "pp", "mesh", "overlap", "stragglers"])
def test_every_picture_has_alternative_text(draw):
    plt = pyplot()
    fig = {
        "schedule": lambda: ch07.draw_schedule(**ch07.SCHEDULE_DEFAULTS),
        "tp": lambda: ch07.draw_tp_shards(FAKE["tp"], world=2),
        "pp": lambda: ch07.draw_pipeline(FAKE["pp"]),
        "mesh": lambda: ch07.draw_mesh(FAKE["mesh"]),
        "overlap": lambda: ch07.draw_overlap(FAKE["overlap"]),
        "stragglers": lambda: ch07.draw_stragglers(FAKE["stragglers"]),
    }[draw]()
    try:
        assert alt_text(fig) and len(alt_text(fig)) > 80
    finally:
        plt.close(fig)


def test_the_mesh_alt_text_names_the_rows_in_the_course_language():
    plt = pyplot()
    with speaking("en"):
        en = ch07.draw_mesh(FAKE["mesh"])
    with speaking("zh"):
        zh = ch07.draw_mesh(FAKE["mesh"])
    try:
        assert "FSDP x TP: rank 0 rows 0-15; rank 1 rows 16-31" in alt_text(en)
        assert "FSDP x TP：rank 0 第 0-15 行；rank 1 第 16-31 行" in alt_text(zh) and "rows" not in alt_text(zh)
    finally:
        plt.close(en)
        plt.close(zh)


def test_the_schedule_explorer_is_built_on_the_plain_function():
    widget = ch07.schedule_explorer()
    sliders = [w for w in widget.children[0].children if hasattr(w, "max")]
    assert [s.value for s in sliders] == [ch07.SCHEDULE_DEFAULTS["stages"], ch07.SCHEDULE_DEFAULTS["microbatches"]]


def test_draw_schedule_says_the_formula_it_met():
    plt = pyplot()
    fig = ch07.draw_schedule(4, 8, "GPipe")
    try:
        assert "0.273" in alt_text(fig) and "at most 8 micro-batches" in alt_text(fig)
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- the scripts, for real


def _run(script, nproc, tmp_path, *args, timeout=300):
    return torchrun(SCRIPTS / script, nproc=nproc, args=["--out", tmp_path, *args], backend="gloo", show=False,
                    timeout=timeout, cwd=ROOT / "notebooks")


@pytest.mark.slow
def test_tensor_parallel_equals_the_unsplit_block_and_issues_the_collectives_said(tmp_path):
    _run("tensor_parallel.py", 2, tmp_path)
    for rec in ch07.load_records(tmp_path, "tp"):
        by_name = {res["name"]: res for res in rec["results"]}
        assert all(max(res["output"], res["input_grad"], res["weight_grads"]) < 1e-12 for res in rec["results"])
        assert by_name["mlp"]["forward"] == {"all_reduce": 1} == by_name["mlp"]["backward"]
        assert by_name["attention"]["backward"] == {"all_reduce": 3}
        sp = by_name["block + sequence parallel"]
        assert set(sp["forward"]) == {"all_gather_into_tensor", "reduce_scatter_tensor"}
        assert sp["activation"] == [2, 4, 64] and sp["grad_placements"]["norm1.weight"] == ["P(sum)"]
        assert sp["shards"]["attn.q.weight"] == [[64, 64], [32, 64]]
        assert rec["sgd_step"]["diff"] < 1e-12 and rec["sgd_step"]["collectives"] == {"all_reduce": 4}


@pytest.mark.slow
def test_pipeline_schedules_equal_the_unsplit_model_and_meet_the_bubble_formula(tmp_path):
    _run("pipeline_parallel.py", 2, tmp_path, "--microbatches", "4")
    records = ch07.load_records(tmp_path, "pp")
    for name, held in (("GPipe", [4, 4]), ("1F1B", [2, 1])):
        res = [rec["results"][name] for rec in records]
        assert all(r["worst"] < 1e-12 and r["order_as_modelled"] for r in res)
        assert [r["peak_in_flight"] for r in res] == held
        assert math.isclose(res[0]["unit_bubble"], 0.2)
        assert 0.15 <= res[0]["measured_bubble"] < 1  # the ideal 0.2, plus messages and overheads


@pytest.mark.slow
def test_2d_mesh_fsdp_tp_and_hsdp_equal_one_process(tmp_path):
    _run("mesh_2d.py", 4, tmp_path)
    records = ch07.load_records(tmp_path, "mesh2d")
    assert [rec["fsdp_tp"]["rows"][0] for rec in records] == [0, 32, 16, 48]
    assert [rec["hsdp"]["rows"][0] for rec in records] == [0, 32, 0, 32]
    assert all(rec["fsdp_tp"]["diff"] < 1e-12 and rec["hsdp"]["diff"] < 1e-12 for rec in records)


@pytest.mark.slow
def test_overlap_on_3_ranks_sends_the_ring_models_bytes(tmp_path):
    _run("comm_overlap.py", 3, tmp_path, "--buckets-mb", "1,25", "--steps", "1")
    rec = ch07.load_records(tmp_path, "overlap")[0]
    ratios = {k: b["measured"] / b["ring"] for k, b in rec["bytes"].items()}
    assert all(abs(r - 1) < 0.01 for k, r in ratios.items() if not k.startswith("reduce_scatter"))
    assert abs(ratios["reduce_scatter 3 MiB"] - 2) < 0.01  # gloo: an all-reduce, then this rank's chunk
    assert {k: v["buckets"] for k, v in rec["sweep"].items()} == {"1.0": 8, "25.0": 1}
    assert rec["sweep"]["25.0"]["overlapped"] == 0.0
    assert rec["sequential"]["allreduces_in_backward"] == 0  # forward and backward inside no_sync()
    end = max(e for _, e, _ in rec["trace"]["compute"])
    assert sum(1 for s, _, _ in rec["trace"]["launch"] if s < end) >= 7


@pytest.mark.slow
def test_bytes_only_on_3_ranks_tells_a_ring_from_a_direct_exchange(tmp_path):
    _run("comm_overlap.py", 3, tmp_path, "--bytes-only")
    assert not list(tmp_path.glob("overlap_rank*.json"))  # nothing else ran
    for rec in ch07.load_records(tmp_path, "overlap_bytes"):
        assert "sweep" not in rec and rec["world"] == 3
        allreduce = rec["bytes"]["all_reduce 3 MiB"]["measured"] / (3 << 20)
        assert abs(allreduce - 4 / 3) < 0.01  # a ring; a direct exchange to each other rank would send 2


@pytest.mark.slow
def test_one_slow_rank_slows_every_rank_and_is_found(tmp_path):
    _run("stragglers.py", 2, tmp_path, "--delay", "0.1")
    records = ch07.load_records(tmp_path, "stragglers")
    slowed = [rec["slowed"] for rec in records]
    assert all(m["step"] >= 0.08 for m in slowed)  # every rank pays the 0.1 s of rank 1
    steps = [m["step"] for m in slowed]
    assert max(steps) - min(steps) <= 0.25 * max(steps)  # every rank runs at the slow rank's pace
    assert slowed[1]["compute"] - slowed[0]["compute"] >= 0.05 and slowed[0]["allreduce"] >= 0.05
    found = records[0]["found"]
    assert found["timings"] == found["flight_recorder"] == 1 and "Ranks 1 failed" in found["monitored_barrier"]
    balance = records[0]["balance"]
    assert balance["length-sorted"]["imbalance"] < 1.01 < balance["random"]["imbalance"]
    assert all(rec["join"]["same_weights"] for rec in records)


@pytest.mark.slow
def test_fsdp2_facts_and_a_checkpoint_of_2_ranks_loaded_on_3_and_on_1(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run("fsdp2_in_depth.py", 2, tmp_path, "--ckpt", ckpt)
    rec = ch07.load_records(tmp_path, "fsdp2")[0]
    sent = rec["mixed_precision"]["sent"]
    assert abs(sent["bf16 compute, bf16 reduce"] / sent["float32"] - 0.5) < 0.01
    counts = {k: v["counts"] for k, v in rec["resharding"].items()}
    assert (counts["reshard_after_forward=True"]["all_gather"] == 9
            and counts["reshard_after_forward=False"]["all_gather"] == 5)
    assert rec["resharding"]["True + forward prefetch"]["issued_before_block"] == [3, 4, 5, 5]
    assert rec["meta"]["all_meta"] and rec["meta"]["repeated_rows"] and rec["meta"]["after_load"] == 0
    accumulation = rec["accumulation"]["set_requires_gradient_sync(False)"]
    assert accumulation["counts"]["reduce_scatter"] == 5 and accumulation["diff"] < 1e-12
    assert rec["checkpointing"]["checkpoint"]["extra_bytes"] == 0 and rec["checkpointing"]["grad_diff"] == 0
    assert rec["zero"]["diff"] == 0
    _run("fsdp2_in_depth.py", 3, tmp_path, "--load", ckpt)
    loaded = ch07.load_records(tmp_path, "fsdp2_load")
    assert [r["load"]["rows"][0] for r in loaded] == [86, 86, 84] and all(r["load"]["diff"] == 0 for r in loaded)
    _run("fsdp2_in_depth.py", 1, tmp_path, "--load", ckpt)  # one rank: the whole model
    assert ch07.load_records(tmp_path, "fsdp2_load")[0]["load"]["rows"] == [256, 64]


def test_the_schedule_explorer_says_that_1f1b_refuses_fewer_micro_batches_than_stages(capsys):
    """PyTorch's Schedule1F1B raises ValueError when micro-batches < stages; the explorer says so
    instead of drawing a schedule that PyTorch does not run."""
    box = ch07.schedule_explorer()
    stages, micro, schedule = box.children[0].children
    schedule.value, stages.value, micro.value = "1F1B", 4, 2
    assert "needs at least as many micro-batches as stages (2 < 4)" in capsys.readouterr().out
    schedule.value = "GPipe"  # GPipe runs any number
    assert "needs at least" not in capsys.readouterr().out
