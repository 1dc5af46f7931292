"""course_utils.ch06_pitfalls: the ledger, the pieces the notebook and its workers use, the
switchboard, and the chapter's scripts. Fast except the tests marked slow (processes)."""

import os
import pickle
import re
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from course_utils import ROOT
from course_utils import ch06_pitfalls as pitfalls
from course_utils.data import reseed_rng, sampler_indices
from course_utils.figures import alt_text
from course_utils.i18n import speaking, text_width
from course_utils.launch import SpawnFailed, spawn_bounded
from course_utils.models import MLP

# --------------------------------------------------------------------------- ledger and table


def test_ledger_records_and_builds_the_table(capsys):
    book = pitfalls.PitfallLedger()
    book.check("a", "first", "loss", bug=2.3, fix=0.25, bug_seen=True, fixed=True)
    book.check("b", "second", "count", bug=4, fix=1, bug_seen=True, fixed=True)
    out = capsys.readouterr().out
    assert "first: loss: with the bug 2.3000, fixed 0.2500 (bug reproduced; fix works)" in out
    assert book.all_ok and list(book.rows) == ["a", "b"]
    lines = book.table().splitlines()
    assert lines[0].split() == ["#", "pitfall", "measured", "with", "the", "bug", "fixed", "check"]
    assert set(lines[1]) == {"-", " "} and lines[2].split() == ["1", "first", "loss", "2.3000", "0.2500", "pass"]


def test_ledger_fails_when_the_bug_does_not_happen_or_the_fix_does_not_work():
    book = pitfalls.PitfallLedger()
    with pytest.raises(AssertionError, match="the bug did not happen"):
        book.check("a", "t", "m", bug=1, fix=1, bug_seen=False, fixed=True)
    with pytest.raises(AssertionError, match="the fix did not work"):
        book.check("b", "t", "m", bug=1, fix=1, bug_seen=True, fixed=False)
    assert not book.all_ok and "FAIL" in book.table()  # failing rows are kept, and say FAIL


def test_rechecking_a_key_replaces_its_row():
    book = pitfalls.PitfallLedger()
    book.check("a", "t", "m", bug=1, fix=0, bug_seen=True, fixed=True)
    book.check("b", "t2", "m", bug=1, fix=0, bug_seen=True, fixed=True)
    book.check("a", "t", "m", bug=2, fix=0, bug_seen=True, fixed=True)
    assert [(key, row[2]) for key, row in book.rows.items()] == [("a", "2"), ("b", "1")]


def test_expect_error_records_and_reraises():
    book = pitfalls.PitfallLedger()
    with pytest.raises(ValueError, match="boom"), book.expect_error("k", ValueError):
        raise ValueError("boom")
    assert isinstance(book.errors["k"], ValueError)
    with pytest.raises(AssertionError, match="ran without error"), book.expect_error("n", ValueError):
        pass
    with pytest.raises(AssertionError, match="not for the reason"), book.expect_error(
        "c", ValueError, confirm=lambda e: "expected" in str(e)
    ):
        raise ValueError("something else")
    assert "n" not in book.errors and "c" not in book.errors


def test_formatting_is_stable():
    assert pitfalls._fmt(True) == "yes" and pitfalls._fmt(1438) == "1,438"
    assert pitfalls._fmt(0.25) == "0.2500" and pitfalls._fmt(0.0) == "0.0000"
    assert pitfalls._fmt(1.1e-16) == "1.100e-16" and pitfalls._fmt("hang") == "hang"


# ------------------------------------------------------------------------------ the pieces


class LayerInForward(nn.Module):  # pitfall 1, as the notebook writes it
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)

    def forward(self, x):
        return nn.Linear(256, 10)(torch.relu(self.fc1(x)))


def test_train_briefly_shows_a_layer_created_in_forward_never_trains():
    torch.manual_seed(0)
    bug = pitfalls.train_briefly(LayerInForward())
    torch.manual_seed(0)
    fix = pitfalls.train_briefly(MLP())
    assert (bug.n_params, fix.n_params) == (200_960, 203_530) and len(fix.losses) == 40
    assert bug.losses[-1] > 2.0 and bug.same_input_diff > 0
    assert fix.losses[-1] < 0.6 * fix.losses[0] and fix.same_input_diff == 0


def test_batches_are_seeded_and_reshuffled_every_pass():
    a, b = pitfalls.batches(10, 4, 5), pitfalls.batches(10, 4, 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) and all(len(x) == 4 for x in a)
    assert sorted(torch.cat(a[:2]).tolist()) == sorted(set(torch.cat(a[:2]).tolist()))  # no repeat in a pass


def test_sampler_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    orders = {f"epoch {e}": [sampler_indices(8, 2, epoch=e)] * 2 for e in range(3)}
    fig = pitfalls.sampler_figure(orders)
    assert [ax.get_title() for ax in fig.axes] == list(orders)
    assert alt_text(fig).count("epoch 0: epoch 0 rank 0 visits [") == 1
    plt.close(fig)
    with speaking("zh"):
        fig = pitfalls.sampler_figure(orders)
    assert "epoch 0：epoch 0 rank 0 访问 [" in alt_text(fig) and ", epoch" not in alt_text(fig)
    plt.close(fig)


def test_ddp_forward_on_meta_breaks_the_loss_with_cpu_labels():
    out, real = pitfalls.ddp_forward(torch.randn(4, 784), device="meta")
    assert out.device.type == "meta" and not real
    with pytest.raises(RuntimeError, match="device"):
        F.cross_entropy(out, torch.zeros(4, dtype=torch.long))
    assert F.cross_entropy(out, torch.zeros(4, dtype=torch.long, device="meta")).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_ddp_forward_on_a_gpu():
    out, real = pitfalls.ddp_forward(torch.randn(4, 784))
    assert real and out.device.type == "cuda" and not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="device"):
        F.cross_entropy(out, torch.zeros(4, dtype=torch.long))


def test_graph_size_grows_with_a_running_loss_total():
    assert pitfalls.graph_size(3.0) == (0, 0)
    x = torch.ones(10, requires_grad=True)
    nodes, nbytes = pitfalls.graph_size((x.exp() * 2).sum())
    assert nodes >= 3 and nbytes >= 40
    torch.manual_seed(0)
    model, total, sizes = MLP(), 0.0, []
    for _ in range(4):
        total += F.cross_entropy(model(torch.rand(8, 784)), torch.zeros(8, dtype=torch.long))
        sizes.append(pitfalls.graph_size(total))
    assert sizes[3][0] > sizes[0][0] and sizes[3][1] > 3 * sizes[0][1]
    total.backward()  # frees the saved tensors; the nodes stay chained
    nodes, nbytes = pitfalls.graph_size(total)
    assert nodes == sizes[3][0] and nbytes < sizes[3][1]


def test_untrusted_checkpoint_runs_code_only_without_weights_only(tmp_path):
    path, marker = pitfalls.make_untrusted_checkpoint(tmp_path)
    match = "GLOBAL course_utils.ch06_pitfalls.leave_marker"
    with pytest.raises(pickle.UnpicklingError, match=match):
        torch.load(path, weights_only=True)
    assert not marker.exists()
    loaded = torch.load(path, weights_only=False)
    assert marker.exists() and set(loaded) == {"model", "meta"}


def test_augment_dataset_in_workers_and_reseed_rng():
    def generator_draws(worker_init_fn):
        loader = DataLoader(pitfalls.AugmentDataset(4), batch_size=None, num_workers=2, timeout=60,
                            worker_init_fn=worker_init_fn)
        return [[t.tolist() for t in loader] for _ in range(2)]

    plain = generator_draws(None)
    for epoch in plain:  # items 0, 1 from the two workers: torch, random, numpy differ; the Generator not
        assert all(epoch[0][s] != epoch[1][s] for s in range(3)) and epoch[0][3] == epoch[1][3]
    assert plain[0][0][3] == plain[1][0][3]  # and the same again next epoch
    fixed = generator_draws(reseed_rng)
    assert fixed[0][0][3] != fixed[0][1][3] and fixed[0][0][3] != fixed[1][0][3]
    ds = pitfalls.AugmentDataset(4)
    assert ds[0].shape == (4,) and ds[0].dtype == torch.float64 and len(ds.SOURCES) == 4


def test_augment_sources_speak_the_course_language():
    with speaking("en"):
        assert pitfalls.AugmentDataset.SOURCES == ("torch", "random", "numpy global", "numpy Generator from __init__")
        assert pitfalls.AugmentDataset(2).SOURCES == pitfalls.AugmentDataset.SOURCES
    with speaking("zh"):
        names = pitfalls.AugmentDataset.SOURCES
    assert names[2] == "NumPy 全局生成器" and names[3] == "在 __init__ 中创建的 NumPy Generator"
    assert len({text_width(name) - len(name) for name in names}) == 1  # same Chinese width: a table lines up


# ----------------------------------------------------------------------------- switchboard


def test_switchboard_each_mistake_shows():
    clean = pitfalls.switchboard_run()
    assert clean.final_val_acc_true > 0.9 and clean.steps_in_train_mode == clean.bn_updates == 200
    assert len(clean.train_loss) == 200 and clean.val_steps == list(range(20, 201, 20))
    layer = pitfalls.switchboard_run(["layer_in_forward"])
    assert layer.final_val_acc_true < 0.3 and layer.train_loss[-1] > 2.0
    no_zero = pitfalls.switchboard_run(["no_zero_grad"])
    assert no_zero.final_val_loss_true > 2 * clean.final_val_loss_true
    in_train = pitfalls.switchboard_run(["eval_without_eval"])
    assert abs(in_train.val_loss[-1] - in_train.final_val_loss_true) > 0.01
    assert clean.val_loss[-1] == pytest.approx(clean.final_val_loss_true, abs=1e-6)
    forgot = pitfalls.switchboard_run(["no_train_after_eval"])
    assert forgot.steps_in_train_mode == forgot.bn_updates == 20


def test_switchboard_is_cached_deterministic_and_validates():
    a = pitfalls.switchboard_run(["no_zero_grad"])
    assert pitfalls.switchboard_run(("no_zero_grad",)) is a  # cached; order and container do not matter
    fresh = pitfalls._switchboard_cached.__wrapped__(("no_zero_grad",), 200, 20, 0)
    assert fresh.train_loss == a.train_loss  # the same numbers when recomputed
    with pytest.raises(ValueError, match="unknown mistake"):
        pitfalls.switchboard_run(["typo"])


def test_switchboard_leaves_the_learners_random_stream_alone():
    """The run seeds torch; the learner's generator is the same afterwards, computed or cached."""
    torch.manual_seed(123)
    state = torch.get_rng_state()
    pitfalls.switchboard_run(["no_zero_grad"], steps=4, eval_every=2)  # computed
    pitfalls.switchboard_run(["no_zero_grad"], steps=4, eval_every=2)  # from the cache
    assert torch.equal(torch.get_rng_state(), state)


def test_switchboard_figure_summary_and_widget():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = pitfalls.switchboard_figure()
    assert [ax.get_xlabel() for ax in fig.axes] == ["step", "step"]
    assert "optimizer.zero_grad() forgotten" in fig._suptitle.get_text()
    plt.close(fig)
    text = pitfalls.switchboard_summary().splitlines()
    assert text[1].startswith("no mistake") and text[2].startswith("with the mistakes")
    assert len(pitfalls.switchboard_overview().splitlines()) == 1 + 1 + len(pitfalls.SWITCHES)
    fig = pitfalls.switchboard_figure(())
    assert len(fig.axes[0].lines) == 1  # only the clean run
    plt.close(fig)
    ui = pitfalls.switchboard_widget(default=())
    boxes = [c for c in ui.children if c.__class__.__name__ == "Checkbox"]
    assert len(boxes) == len(pitfalls.SWITCHES) and not any(b.value for b in boxes)
    boxes[0].value = True  # redraws without error
    plt.close("all")


def test_the_chinese_edition_explains_in_chinese(monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils.i18n import text_width

    monkeypatch.setenv("COURSE_LANG", "en")
    assert pitfalls.switch_label("no_zero_grad") == "optimizer.zero_grad() forgotten"
    english = pitfalls.switchboard_summary().splitlines()
    monkeypatch.setenv("COURSE_LANG", "zh")
    book = pitfalls.PitfallLedger()
    book.check("a", "first", "loss", bug=True, fix=0.25, bug_seen=True, fixed=True)
    assert capsys.readouterr().out == "first：loss：有 bug 时是，修复后 0.2500。bug 已复现，修复有效。\n"
    table = book.table().splitlines()
    assert table[0].split() == ["#", "误区", "测量项", "有", "bug", "时", "修复后", "检查"]
    assert table[2].split() == ["1", "first", "loss", "是", "0.2500", "通过"] and book.all_ok
    assert text_width(table[1]) == text_width(table[0])  # the rule is as wide as the headings
    overview = pitfalls.switchboard_overview().splitlines()  # each mistake named in Chinese, columns aligned
    assert overview[2].startswith("在 forward() 中创建输出层 ") and "layer_in_forward" not in "".join(overview)
    assert len({text_width(line) for line in overview}) == 1
    monkeypatch.setenv("COURSE_LANG", "en")
    assert pitfalls.switchboard_overview().splitlines()[2].startswith("layer_in_forward ")  # English unchanged
    monkeypatch.setenv("COURSE_LANG", "zh")
    with pytest.raises(AssertionError, match="修复没有奏效"):
        book.check("b", "t", "m", bug=1, fix=1, bug_seen=True, fixed=False)
    assert book.table().splitlines()[-1].endswith("失败")
    summary = pitfalls.switchboard_summary().splitlines()
    assert summary[0].split()[:2] == ["运行", "最终训练损失"] and summary[1].startswith("无错误")
    assert len({text_width(line) for line in summary}) == 1  # numbers right-aligned under their headings
    assert summary[1].split()[1:] == english[1].split()[2:]  # the same numbers
    fig = pitfalls.switchboard_figure()
    assert [ax.get_xlabel() for ax in fig.axes] == ["步数", "步数"]
    assert fig._suptitle.get_text() == "打开的错误：忘记调用 optimizer.zero_grad()"
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["无错误（报告值）", "打开错误（报告值）"]
    plt.close(fig)
    ui = pitfalls.switchboard_widget()  # the default still switches the same mistake on
    boxes = [c for c in ui.children if c.__class__.__name__ == "Checkbox"]
    assert [(b.description, b.value) for b in boxes][1] == ("忘记调用 optimizer.zero_grad()", True)
    assert sum(b.value for b in boxes) == 1 and "打开或关闭错误" in ui.children[0].value
    plt.close("all")


# ------------------------------------------------------------------------------ processes


@pytest.mark.slow
def test_touch_worker_runs_under_spawn(tmp_path):
    assert spawn_bounded(pitfalls.touch_worker, args=(2, str(tmp_path)), nprocs=2, timeout=120) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0-of-2", "rank1-of-2"]


@pytest.mark.slow
def test_spawn_bounded_reports_a_main_module_function(tmp_path):
    # A function defined in a `python -c` program lives in a __main__ that a fresh process cannot
    # import: the same failure as a notebook-defined function.
    code = (
        "from course_utils.launch import SpawnFailed, spawn_bounded\n"
        "def worker(rank, n):\n    pass\n"
        "try:\n    spawn_bounded(worker, args=(2,), nprocs=2, timeout=120)\n"
        "except SpawnFailed as e:\n    print('FAILED:', e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env)
    assert "FAILED: 2 of 2 child processes exited with code 1" in out.stdout, out.stdout + out.stderr
    assert "Can't get attribute 'worker'" in out.stdout
    assert SpawnFailed.__module__ == "course_utils.launch"


@pytest.mark.slow
def test_rank0_eval_script_two_correct_ways_and_the_hang():
    from course_utils.launch import LaunchTimeout, torchrun

    def run(mode, timeout):
        return torchrun("scripts/pitfall_rank0_eval.py", nproc=2, args=["--eval", mode], timeout=timeout,
                        show=False, cwd=ROOT / "notebooks")

    both = run("both", 240)
    assert both.returncode == 0
    lines0, lines1 = both.lines(0), both.lines(1)
    shard = re.findall(r"all-reduced accuracy (\d+/\d+ = [\d.]+)", both.logs[0])
    assert len(shard) == 2 and f"epoch 1: model.module accuracy {shard[1]}" in lines0
    assert f"all-reduced accuracy {shard[1]}" in both.logs[1] and "epoch 1: waiting at the barrier for rank 0" in lines1
    # every rank makes the same collectives when every rank runs the wrapper
    assert "epoch 1: trained 10 steps (20 buffer syncs, 20 gradient all-reduces so far)" in lines0
    assert "epoch 1: trained 10 steps (20 buffer syncs, 20 gradient all-reduces so far)" in lines1
    # The bug, with a timeout scaled to this machine's speed (as the notebook did before it had the
    # flight recorder); on a machine so busy that rank 0 had not even reached the last evaluation, once
    # more with more time.
    for factor in (2, 5):
        with pytest.raises(LaunchTimeout) as info:
            run("rank0-wrapper", min(400, max(10, round(factor * both.elapsed))))
        if "epoch 1: evaluating through the DDP wrapper" in info.value.logs[0]:
            break
    logs0, logs1 = info.value.logs[0].splitlines(), info.value.logs[1].splitlines()
    # epoch 0: rank 0's evaluation sync (the 11th) pairs with rank 1's first of epoch 1
    assert "epoch 0: accuracy" in logs0[2] and "(11 buffer syncs, 10 gradient all-reduces so far)" in logs0[2]
    assert logs0[3] == logs1[1] == "epoch 1: trained 10 steps (20 buffer syncs, 20 gradient all-reduces so far)"
    assert logs0[4] == "epoch 1: evaluating through the DDP wrapper ..." and len(logs0) == 5
    assert logs1[2] == "end: waiting at the final barrier for rank 0"


@pytest.mark.slow
def test_the_flight_recorder_names_the_desynchronised_collective_of_the_real_ddp_job(tmp_path):
    """The hang of the rank-0 evaluation, with the flight recorder on and a 5-second process-group
    timeout: each rank writes its record, the job fails as rank 0 every time, and at the first sequence
    number where the records differ, rank 0 broadcast BatchNorm's float32 statistics (one flat tensor:
    DDP coalesces buffers by dtype, then broadcasts the int64 count) and rank 1 entered the barrier."""
    from course_utils.launch import LaunchError, torchrun

    with pytest.raises(LaunchError) as info:
        torchrun("scripts/pitfall_rank0_eval.py", nproc=2, env={"TORCH_FR_BUFFER_SIZE": "200"}, timeout=240,
                 args=["--eval", "rank0-wrapper", "--timeout", "5", "--fr-dump", tmp_path], show=False,
                 cwd=ROOT / "notebooks")
    assert info.value.rank == 0 and info.value.exit_code == 1
    assert [info.value.logs[r].splitlines()[-1] for r in (0, 1)] == [
        f"rank {r}: a collective failed; flight recorder written to fr_rank{r}.json" for r in (0, 1)]
    records = pitfalls.flight_records(tmp_path)
    ops = [{e["collective_seq_id"]: pitfalls.collective_name(e) for e in records[r]} for r in (0, 1)]
    first = next(s for s in sorted(ops[0]) if ops[0][s] != ops[1].get(s))
    assert (ops[0][first], ops[1][first]) == ("broadcast float32 [128]", "barrier")
    assert ops[0][first + 1] == "broadcast int64 [1]" and first + 1 not in ops[1]
    # every training step before it: one sync of the buffers (two broadcasts) and one gradient all-reduce
    step = [ops[0][first - k] for k in (3, 2, 1)]
    assert step == ["broadcast float32 [128]", "broadcast int64 [1]", "all_reduce float32 [51018]"]
    table = pitfalls.flight_table(records, last=3)
    assert table.splitlines()[0].split() == ["seq", "rank", "0", "rank", "1"] and "barrier" in table


@pytest.mark.slow
def test_detail_debug_names_the_collective_mismatch_and_the_fix_ends():
    from course_utils.launch import LaunchError, torchrun

    def run(*args, **env):
        return torchrun("scripts/collective_mismatch.py", nproc=2, args=list(args), env=env, timeout=240,
                        show=False, cwd=ROOT / "notebooks")

    with pytest.raises(LaunchError) as info:
        run(TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert ("syncing the buffers, as the DDP wrapper's evaluation forward does: 128 float32, 1 int64"
            in info.value.logs[0])
    assert "Detected mismatch between collectives on ranks; this rank was running: BROADCAST" in info.value.logs[0]
    assert "Detected mismatch between collectives on ranks; this rank was running: BARRIER" in info.value.logs[1]
    assert info.value.rank == 0, "the script makes rank 0 the failing rank, so chapter 06's stored error is stable"
    fixed = run("--fixed", TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert fixed.returncode == 0 and all("past the barrier" in fixed.logs[r] for r in (0, 1))


@pytest.mark.slow
def test_ddp_under_detail_debug_still_crashes_on_gloo():
    """PyTorch 2.14.1: building a DDP wrapper under TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo dies with
    SIGSEGV, which is why chapter 06 shows DETAIL on collective_mismatch.py instead of the DDP job.
    When an upgrade fixes it, this test fails: then show DETAIL on the DDP job itself."""
    from course_utils.launch import free_port

    code = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
            "print('built', flush=True)\n"
            "dist.destroy_process_group()\n")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0",
               TORCH_DISTRIBUTED_DEBUG="DETAIL")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == -signal.SIGSEGV and "built" not in out.stdout, (out.returncode, out.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shard", "module"])
def test_rank0_eval_script_each_correct_way_alone(mode):
    from course_utils.launch import torchrun

    r = torchrun("scripts/pitfall_rank0_eval.py", nproc=2, args=["--eval", mode], timeout=240, show=False,
                 cwd=ROOT / "notebooks")
    assert r.returncode == 0 and "accuracy" in r.logs[0]


def test_scripts_are_where_the_notebook_expects_them():
    script = ROOT / "notebooks" / "scripts" / "pitfall_rank0_eval.py"
    assert script.is_file()
    text = script.read_text()
    assert all(mode in text for mode in ("rank0-wrapper", "shard", "module", "both"))


def test_module_import_has_no_side_effects():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys; import course_utils.ch06_pitfalls; print('torch.distributed' in sys.modules and "
            "__import__('torch').distributed.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip() == "False", out.stderr


def test_the_notebooks_checks_have_chinese_names(capsys, monkeypatch):
    """The notebook's code names each check in English (the same code in both editions); the Chinese
    edition shows each one's Chinese name, its results' words in Chinese, and a Chinese closing line."""
    import json

    cells = json.loads((ROOT / "notebooks" / "06_pitfalls.ipynb").read_text())["cells"]
    keys = set(re.findall(r'book\.check\(\s*"([^"]+)"', "".join("".join(c["source"]) for c in cells)))
    assert len(keys) == 17 and keys <= set(pitfalls._ZH_CHECKS), keys - set(pitfalls._ZH_CHECKS)
    for lang, line, closing in [
        ("en", "DDP model evaluated on rank 0 only: evaluation result: with the bug hang (collective timeout), "
               "fixed 340/359 both ways (bug reproduced; fix works)", "1 pitfalls reproduced and fixed"),
        ("zh", "只在 rank 0 上评估 DDP 模型：评估结果：有 bug 时卡死（集合通信超时），"
               "修复后 340/359（两种做法结果相同）。bug 已复现，修复有效。", "1 个误区均已复现并修复"),
    ]:
        monkeypatch.setenv("COURSE_LANG", lang)
        book = pitfalls.PitfallLedger()
        book.check("rank0-eval", "DDP model evaluated on rank 0 only", "evaluation result",
                   bug="hang (collective timeout)", fix="340/359 both ways", bug_seen=True, fixed=True)
        assert capsys.readouterr().out == line + "\n"
        assert book.summary() == closing
