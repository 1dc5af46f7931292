"""course_utils.ch05_full_pipeline and chapter 05's training script: configuration, models, evaluation across
ranks, atomic checkpoints, exact resume, and (slow) faults with real processes. The elastic restart after a
crash is the notebook's own check: its cell asserts one restart and the uninterrupted run's weights and losses,
to the bit, in both editions."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_utils import ROOT
from course_utils.ch05_full_pipeline import (
    CheckpointError,
    ShardSampler,
    TrainConfig,
    atomic_save,
    compare_lines,
    evaluate,
    format_config,
    get_rng_state,
    interrupted_save,
    load_checkpoint,
    load_splits,
    local_eval_sums,
    max_abs_diff,
    padding_report,
    parse_config,
    read_metrics,
    set_rng_state,
)
from course_utils.i18n import text_width
from course_utils.models import MLP, MODELS, SmallCNN

SCRIPT = ROOT / "notebooks" / "scripts" / "train.py"


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- configuration

def test_defaults_and_flags():
    assert parse_config([]) == TrainConfig()
    cfg = parse_config(["--model", "mlp", "--epochs", "3", "--no-resume", "--bf16", "--out-dir", "x"])
    assert (cfg.model, cfg.epochs, cfg.resume, cfg.bf16, cfg.out_dir) == ("mlp", 3, False, True, "x")


def test_bad_values_are_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--model", "resnet"])
    assert "model must be one of cnn, mlp, got 'resnet'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="val_fraction must be between 0 and 1, got 1.5"):
        TrainConfig(val_fraction=1.5)


def test_config_printout_has_no_machine_path():
    text = format_config(TrainConfig(out_dir="/some/where/run1"), world_size=2, global_batch=64, backend="gloo")
    assert "/some/where" not in text and ".../run1" in text
    assert "global_batch      64" in text and "backend           gloo" in text
    assert "runs/train" in format_config(TrainConfig())


# ------------------------------------------------------------------------------------ models

def test_models_by_name():
    assert sum(p.numel() for p in MLP().parameters()) == 203_530  # the source's count
    assert MODELS == {"cnn": SmallCNN, "mlp": MLP}
    x = torch.zeros(4, 1, 28, 28)
    for cls in MODELS.values():
        assert cls()(x).shape == (4, 10)


def test_splits_are_fixed_and_disjoint():
    s = load_splits(0.1, seed=0)
    assert (len(s.train), len(s.val), len(s.test)) == (1294, 144, 359)
    again = load_splits(0.1, seed=0)
    assert torch.equal(s.val.tensors[0], again.val.tensors[0])
    # no validation image is also a training image
    flat_train = {hash(t.numpy().tobytes()) for t in s.train.tensors[0]}
    assert not any(hash(v.numpy().tobytes()) in flat_train for v in s.val.tensors[0][:20])


# ------------------------------------------------------------------ evaluation across ranks

@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 5, 359])
def test_shards_cover_every_index_exactly_once(n, world):
    shards = [list(ShardSampler(n, r, world)) for r in range(world)]
    assert sorted(sum(shards, [])) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_padding_report_counts_the_duplicate():
    text = padding_report(359, 2)
    assert "DistributedSampler: 360 evaluated, 1 counted twice" in text
    assert "ShardSampler:       359 evaluated, 0 counted twice" in text


def test_padding_report_and_comparison_in_chinese(monkeypatch):
    monkeypatch.setenv("COURSE_LANG", "zh")
    lines = padding_report(359, 2).splitlines()
    assert lines[0] == "359 个样本分给 2 个 rank"
    assert "1 个被算了两次" in lines[3] and "359 个" in lines[4]
    shard, dist_ = lines[4].index("评估"), lines[3].index("评估")
    assert text_width(lines[4][:shard]) == text_width(lines[3][:dist_])  # the two totals line up
    out = compare_lines("a\nbb", "x\nbb y", [("a", "x"), ("", "bb")]).splitlines()
    assert out[2].startswith("[ 2] 骨架") and out[2].endswith("| （缺失）")
    assert all(text_width(line.split("|")[0]) == text_width(out[1].split("|")[0]) for line in out)
    monkeypatch.setenv("COURSE_LANG", "en")
    assert padding_report(359, 2).splitlines()[0] == "359 samples over 2 ranks"
    assert compare_lines("a", "x", [("", "x")]).splitlines()[0] == "[ 1] skeleton    - | (missing)"


def _predictable_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


def test_metric_summed_over_shards_counts_each_sample_once(one_thread):
    """What all_reduce does, done by hand for two ranks: sums of the shards = the whole set."""
    data = load_splits().test
    model = _predictable_model()
    dev = torch.device("cpu")
    whole = local_eval_sums(model, DataLoader(data, batch_size=128), dev)
    shards = sum(local_eval_sums(model, DataLoader(data, batch_size=128, sampler=ShardSampler(len(data), r, 2)), dev)
                 for r in range(2))
    assert shards[2].item() == len(data) == 359
    assert shards[1].item() == whole[1].item()
    assert shards[0].item() == pytest.approx(whole[0].item(), rel=1e-6)  # float32 sums per batch
    padded = sum(local_eval_sums(model, DataLoader(data, batch_size=128, sampler=DistributedSampler(
        data, num_replicas=2, rank=r, shuffle=False)), dev) for r in range(2))
    assert padded[2].item() == 360  # the sampler's padding: one image counted twice
    alone = evaluate(model, data, 0, 1, dev)  # no process group: no collective
    assert (alone.correct, alone.total) == (int(whole[1].item()), 359)
    assert alone.loss == pytest.approx(whole[0].item() / 359, rel=1e-6) and not model.training


def _eval_worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        r = evaluate(_predictable_model(), load_splits().test, rank, world, torch.device("cpu"), batch_size=64)
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"correct": r.correct, "total": r.total, "loss": r.loss}, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_all_reduced_metric_on_two_real_processes(tmp_path, one_thread):
    import torch.multiprocessing as mp

    out = str(tmp_path / "result")
    mp.spawn(_eval_worker, args=(2, f"file://{tmp_path / 'store'}", out), nprocs=2, join=True)
    results = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    whole = evaluate(_predictable_model(), load_splits().test, 0, 1, torch.device("cpu"))
    for r in results:  # every rank holds the global numbers, each image counted once
        assert (r["correct"], r["total"]) == (whole.correct, whole.total) and r["total"] == 359
        assert r["loss"] == pytest.approx(whole.loss, rel=1e-6)


def test_compare_lines_finds_each_fragment_and_refuses_drift():
    text = compare_lines("a = 1\nb = 2", "x = 1\ny = b + 1", [("b = 2", "y = b"), ("", "x =")])
    assert text.splitlines() == [
        "[ 1] skeleton    2 | b = 2",
        "     train.py    2 | y = b + 1",
        "[ 2] skeleton    - | (missing)",
        "     train.py    1 | x = 1",
    ]
    with pytest.raises(ValueError, match="'z' is not in train.py"):
        compare_lines("a", "b", [("a", "z")])
    with pytest.raises(ValueError, match="'save' is on lines 1, 3 of train.py"):  # which one was meant?
        compare_lines("a", "save(x)\nb\nsave(y)", [("a", "save")])


# ------------------------------------------------------------------------------ checkpoints

def test_interrupted_atomic_write_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    atomic_save({"epoch": 1, "w": torch.ones(1000)}, path)
    with interrupted_save(0.5), pytest.raises(OSError, match="simulated crash"):
        atomic_save({"epoch": 2, "w": torch.zeros(1000)}, path)
    ckpt = load_checkpoint(path)
    assert ckpt["epoch"] == 1 and torch.equal(ckpt["w"], torch.ones(1000))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # the partial temp file is gone


def test_crash_between_write_and_rename_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_save({"epoch": 1}, path)

    def dies(src, dst):
        raise KeyboardInterrupt  # the job is killed right before the rename

    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"epoch": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_plain_torch_save_interrupted_leaves_a_corrupt_file(tmp_path):
    path = tmp_path / "last.pt"
    torch.save({"epoch": 1, "w": torch.ones(1000)}, path)
    with interrupted_save(0.5), pytest.raises(OSError):
        torch.save({"epoch": 2, "w": torch.zeros(1000)}, path)
    with pytest.raises(CheckpointError, match="truncated") as info:
        load_checkpoint(path)
    assert "Do not load it with weights_only=False" in str(info.value)  # never a suggestion to


def test_a_file_that_is_not_a_checkpoint_is_refused_without_suggesting_unsafe_loading(tmp_path):
    path = tmp_path / "last.pt"
    torch.save({"epoch": 1, "obj": _NotAllowed()}, path)  # loads only with weights_only=False
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    text = str(info.value)
    assert "last.pt cannot be read" in text and "--no-resume" in text
    assert "weights_only=False" in text and "Do not load it with weights_only=False" in text
    assert "WeightsUnpickler" not in text and "trust" not in text  # PyTorch's own advice is not repeated


class _NotAllowed:
    """An object that weights_only loading refuses (any class outside the allowed list)."""


def test_checkpoint_roundtrip_with_rng_states_and_weights_only(tmp_path):
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=10)
    model(torch.randn(2, 784)).sum().backward()
    opt.step()
    sched.step()
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    state = get_rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    atomic_save({"epoch": 3, "model": model.state_dict(), "optimizer": opt.state_dict(),
                 "scheduler": sched.state_dict(), "rng": [state],
                 "config": dataclasses.asdict(TrainConfig(model="mlp"))}, tmp_path / "c.pt")
    ckpt = load_checkpoint(tmp_path / "c.pt", config=TrainConfig(model="mlp"))  # weights_only inside
    assert ckpt["epoch"] == 3 and ckpt["scheduler"]["last_epoch"] == 1
    assert max_abs_diff(ckpt["model"], model.state_dict()) == 0.0
    set_rng_state(ckpt["rng"][0])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


def test_resuming_with_another_configuration_is_refused(tmp_path):
    atomic_save({"epoch": 1, "config": dataclasses.asdict(TrainConfig(model="mlp"))}, tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match="model: 'mlp' -> 'cnn'"):
        load_checkpoint(tmp_path / "last.pt", config=TrainConfig(model="cnn"))
    assert load_checkpoint(tmp_path / "missing.pt") is None


def test_max_abs_diff():
    a = {"w": torch.zeros(3), "n": torch.tensor(2)}
    assert max_abs_diff(a, {"w": torch.tensor([0.0, 0.5, -1.0]), "n": torch.tensor(2)}) == 1.0


# ------------------------------------------------------------------------ the script itself

def _load_script():
    spec = importlib.util.spec_from_file_location("notebooks.scripts.train", SCRIPT)  # its warnings: errors
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world_of_one(monkeypatch, one_thread):
    """Run the script in this process as a world of one gloo rank (fast: no new processes)."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "COURSE_BACKEND": "gloo"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    script = _load_script()
    full = load_splits()

    def small_splits(val_fraction=0.1, seed=0):  # a quarter of the images: the same logic, faster
        def cut(ds, n):
            return TensorDataset(*(t[:n] for t in ds.tensors))
        return type(full)(cut(full.train, 320), cut(full.val, 64), cut(full.test, 90))

    monkeypatch.setattr(script, "load_splits", small_splits)

    def run(*argv):
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
        return script.main(["--no-progress", "--epochs", "3", *map(str, argv)])

    run.script = script
    return run


def test_resume_after_interruption_equals_uninterrupted(world_of_one, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a)
    b.mkdir()
    (b / "metrics.jsonl").write_text('{"epoch": 7}\n')  # an older run's: a fresh run drops it
    world_of_one("--out-dir", b, "--stop-after-epoch", 1)  # interrupted after epoch 1
    assert load_checkpoint(b / "last.pt")["epoch"] == 1 and not (b / "final.pt").exists()
    with open(b / "metrics.jsonl", "a") as f:  # a row beyond the checkpoint: the resume drops it
        f.write('{"epoch": 2, "train_loss": -1.0}\n')
    world_of_one("--out-dir", b)  # the same command again: resumes from epoch 1
    wa = torch.load(a / "final.pt", weights_only=True)
    wb = torch.load(b / "final.pt", weights_only=True)
    assert max_abs_diff(wa, wb) == 0.0
    ma, mb = read_metrics(a / "metrics.jsonl"), read_metrics(b / "metrics.jsonl")
    assert [r["epoch"] for r in mb] == [1, 2, 3]
    assert [r["train_loss"] for r in ma] == [r["train_loss"] for r in mb]
    summary = json.loads((b / "summary.json").read_text())
    assert summary["test_total"] == 90


def test_sigusr1_mid_epoch_saves_a_checkpoint_that_resumes_to_the_same_weights(world_of_one, tmp_path):
    """SIGUSR1 (a scheduler's warning) after step 7 of epoch 1: a clean stop (exit code 0, the previous
    SIGUSR1 handler back), a checkpoint of the middle of the epoch, and the same command resumes it to
    the weights, the metrics and the summary of an uninterrupted run."""
    import signal

    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a)
    before = signal.getsignal(signal.SIGUSR1)
    assert world_of_one("--out-dir", b, "--signal-at-step", 7, "--crash-rank", 0, "--stop-check-every", 1) == 0
    assert signal.getsignal(signal.SIGUSR1) is before
    ckpt = load_checkpoint(b / "last.pt")
    assert (ckpt["epoch"], ckpt["step"], len(ckpt["partial"])) == (0, 7, 1)
    assert ckpt["partial"][0]["sums"][1] == 7 * 32 and not (b / "final.pt").exists()
    assert read_metrics(b / "metrics.jsonl") == []
    assert world_of_one("--out-dir", b, "--signal-at-step", 7, "--crash-rank", 0,
                        "--stop-check-every", 1) == 0  # resumes, no new stop
    wa = torch.load(a / "final.pt", weights_only=True)
    wb = torch.load(b / "final.pt", weights_only=True)
    assert max_abs_diff(wa, wb) == 0.0
    ma, mb = read_metrics(a / "metrics.jsonl"), read_metrics(b / "metrics.jsonl")
    assert [(r["epoch"], r["train_loss"], r["last_batch_loss"]) for r in ma] == \
        [(r["epoch"], r["train_loss"], r["last_batch_loss"]) for r in mb]


def test_a_stop_after_the_last_step_of_an_epoch_resumes_too(world_of_one, tmp_path):
    """The signal after the epoch's last step: the resumed run reads no batch of it, evaluates it and
    goes on (320 training images in batches of 32: 10 steps an epoch; a check every 4 steps, and at the
    epoch's end, which is not a multiple of 4)."""
    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a)
    assert world_of_one("--out-dir", b, "--signal-at-step", 9, "--crash-rank", 0, "--stop-check-every", 4) == 0
    assert (load_checkpoint(b / "last.pt")["epoch"], load_checkpoint(b / "last.pt")["step"]) == (0, 10)
    world_of_one("--out-dir", b)
    wa = torch.load(a / "final.pt", weights_only=True)
    assert max_abs_diff(wa, torch.load(b / "final.pt", weights_only=True)) == 0.0
    assert [r["train_loss"] for r in read_metrics(a / "metrics.jsonl")] == \
        [r["train_loss"] for r in read_metrics(b / "metrics.jsonl")]


def test_the_stop_waits_for_the_next_check(world_of_one, tmp_path):
    """The ranks check for a stop every --stop-check-every steps (default 10), not every step: a signal
    after step 3 stops the run after step 5 with a check every 5, after step 10 with the default."""
    for every, stopped in ((5, 5), (None, 10)):
        out = tmp_path / f"every{every}"
        flags = ["--stop-check-every", every] if every else []
        assert world_of_one("--out-dir", out, "--signal-at-step", 3, "--crash-rank", 0, *flags) == 0
        assert load_checkpoint(out / "last.pt")["step"] == stopped


def test_a_mid_epoch_resume_with_a_random_augmentation_is_exact(world_of_one, tmp_path):
    """Random noise drawn as each image is loaded (in this process: --num-workers 0): the stop after step
    7 and the resume give the uninterrupted run's weights, as the skipped batches are not loaded."""
    common = ["--augment", 0.3, "--epochs", 2, "--stop-check-every", 1]
    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a, *common)
    assert world_of_one("--out-dir", b, "--signal-at-step", 7, "--crash-rank", 0, *common) == 0
    assert load_checkpoint(b / "last.pt")["step"] == 7
    world_of_one("--out-dir", b, *common)
    wa = torch.load(a / "final.pt", weights_only=True)
    assert max_abs_diff(wa, torch.load(b / "final.pt", weights_only=True)) == 0.0


def test_skipping_by_loading_would_draw_the_augmentation_again(world_of_one, tmp_path, monkeypatch):
    """The check above has teeth: skip the done batches by loading them (the random noise of 7 batches
    drawn again, after the random state was restored) and the weights differ."""
    script = world_of_one.script
    monkeypatch.setattr(script, "ResumableSampler", _LoadingSkip)
    common = ["--augment", 0.3, "--epochs", 2, "--stop-check-every", 1]
    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a, *common)
    world_of_one("--out-dir", b, "--signal-at-step", 7, "--crash-rank", 0, *common)
    world_of_one("--out-dir", b, *common)
    wa = torch.load(a / "final.pt", weights_only=True)
    assert max_abs_diff(wa, torch.load(b / "final.pt", weights_only=True)) > 0.0


class _LoadingSkip(torch.utils.data.Sampler):
    """A ResumableSampler that ignores ``start`` and says it skipped nothing: the loop loads every batch
    and drops the done ones (what happens with workers)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def set_epoch(self, epoch):
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self):
        return len(self.sampler)

    @property
    def start(self):
        return 0

    @start.setter
    def start(self, value):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_dataloader_workers_survive_the_stop_signal_and_resume_exactly(world_of_one, tmp_path, start):
    """A scheduler signals every process of the rank, its DataLoader workers too (the drill does the
    same). Workers started with spawn or forkserver do not inherit the script's handler, and SIGUSR1's
    default action would end them (the rank then fails: "DataLoader worker exited unexpectedly"): they
    ignore it. The resumed run, loading and dropping the done batches so that each worker's random
    stream goes on, ends with the uninterrupted run's weights."""
    common = ["--augment", 0.3, "--epochs", 1, "--num-workers", 2, "--worker-start", start,
              "--stop-check-every", 8]  # the signal after step 2, the stop after step 8: the workers load on
    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a, *common)
    assert world_of_one("--out-dir", b, "--signal-at-step", 2, "--crash-rank", 0, *common) == 0
    assert load_checkpoint(b / "last.pt")["step"] == 8
    world_of_one("--out-dir", b, *common)
    wa = torch.load(a / "final.pt", weights_only=True)
    assert max_abs_diff(wa, torch.load(b / "final.pt", weights_only=True)) == 0.0


@pytest.mark.slow
def test_sigusr1_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    """Two real ranks; only rank 1 gets SIGUSR1, after step 15: the ranks agree (one all-reduce every 4
    steps), both stop after step 16, and the resumed run ends with the weights of an uninterrupted one."""
    from course_utils.launch import torchrun

    common = ["--model", "mlp", "--epochs", "2", "--no-progress"]
    ref = torchrun(SCRIPT, nproc=2, args=[*common, "--out-dir", tmp_path / "ref"], timeout=240,
                   backend="gloo", show=False)
    stopped = torchrun(SCRIPT, nproc=2, args=[*common, "--out-dir", tmp_path / "b", "--signal-at-step", 15,
                                              "--stop-check-every", 4],
                       timeout=240, backend="gloo", show=False)
    assert "signal SIGUSR1: stopped after step 16 of epoch 1" in stopped.logs[0]
    ckpt = load_checkpoint(tmp_path / "b" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"]) == (0, 16)
    assert [p["sums"][1] for p in ckpt["partial"]] == [16 * 32, 16 * 32]
    resumed = torchrun(SCRIPT, nproc=2, args=[*common, "--out-dir", tmp_path / "b"], timeout=240,
                       backend="gloo", show=False)
    assert "resumed from last.pt: 0 epoch(s) and 16 step(s) done" in resumed.logs[0]
    assert "could not read this last.pt" not in resumed.logs[0]  # a shared folder: each rank loaded it itself
    wa = torch.load(tmp_path / "ref" / "final.pt", weights_only=True)
    wb = torch.load(tmp_path / "b" / "final.pt", weights_only=True)
    assert ref.restarts == 0 and max_abs_diff(wa, wb) == 0.0


def _processes_naming(text: str) -> list[int]:
    """The pids of this machine's processes whose command line contains `text`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("handled", [False, True], ids=["default", "signals-to-handle"])
def test_torchrun_passes_sigusr1_on_to_the_workers_only_when_told(tmp_path, handled):
    """SIGUSR1 to torchrun alone (the launcher a scheduler signals): by default it kills torchrun
    (exit -10) and the workers go on training, orphaned, without a checkpoint; with
    --signals-to-handle ...,SIGUSR1 torchrun passes it on, the workers save last.pt in the middle of
    an epoch and leave, and torchrun reports the signal (exit code 1)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / ("handled" if handled else "default")
    flags = ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"] if handled else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *flags,
           str(SCRIPT), "--model", "mlp", "--epochs", "40", "--no-progress", "--out-dir", str(out)]
    env = dict(os.environ, COURSE_BACKEND="gloo", PYTHONPATH=str(ROOT))
    log = tmp_path / "torchrun.log"
    with open(log, "w") as f:  # (a file: orphaned workers would keep a pipe open)
        launcher = subprocess.Popen(cmd, cwd=ROOT / "notebooks", env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        launcher.send_signal(signal.SIGUSR1)  # the launcher alone, not its process group
        launcher.wait(timeout=60)
        workers = _processes_naming(str(out))
        time.sleep(0.5)
        text = log.read_text()
        ckpt = load_checkpoint(out / "last.pt")
        if handled:
            assert launcher.returncode == 1 and "signal SIGUSR1: stopped after step" in text, text
            assert ckpt.get("step", 0) > 0 and workers == [], text
        else:
            assert launcher.returncode == -signal.SIGUSR1, text
            assert "stopped after step" not in text and "step" not in ckpt
            assert len(workers) == 2, f"the workers should still be running, orphaned: {workers}"
            assert all(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) != launcher.pid
                       for pid in workers)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        for pid in _processes_naming(str(out)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=30)


SBATCH = ROOT / "notebooks" / "scripts" / "slurm_ddp.sbatch"
_STOPPED = "signal SIGUSR1: stopped after step 16 of epoch 1; last.pt saved: the same command resumes from there"


@pytest.mark.skipif(shutil.which("bash") is None, reason="the sbatch file is a bash script")
@pytest.mark.parametrize(("said", "status", "stopped"), [
    ("test accuracy 97.49% (350/359), test loss 0.093", 0, False),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", 1, False),
    (_STOPPED, 1, True),  # torchrun exits 1 after passing the signal on; train.py saved last.pt
], ids=["finished", "failed", "stopped-at-the-signal"])
@pytest.mark.parametrize("requeue", [False, True], ids=["as-shipped", "requeue-uncommented"])
def test_sbatch_file_keeps_srun_status_and_requeues_only_after_a_stop(tmp_path, said, status, stopped, requeue):
    """Chapter 04's sbatch file past its srun, with stand-ins for srun and scontrol: srun's exit status
    does not end the script (set -e) before it can requeue; the job ends with that status; the stop at
    the signal is recognised by train.py's line (the one the tests above read in real runs), and only
    then does the requeue line, once uncommented as the file says, requeue the job."""
    import stat
    import subprocess

    assert "stopped after step" in SCRIPT.read_text() and "stopped after step" in _STOPPED
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {"srun": 'printf "%s\\n" "$SRUN_SAYS"\nexit "$SRUN_STATUS"\n',
             "scontrol": 'if [ "$1" = show ]; then echo node1; echo node2; else echo "$*" >> "$SCONTROL_LOG"; fi\n'}
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    text = SBATCH.read_text()
    line = '  # scontrol requeue "$SLURM_JOB_ID"\n'
    assert text.count(line) == 1, "the requeue line to uncomment"
    job = tmp_path / "job.sbatch"
    job.write_text(text.replace(line, line.replace("# ", "", 1)) if requeue else text)
    tmp, requeues = tmp_path / "tmp", tmp_path / "scontrol.log"
    tmp.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp),
               SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2",
               SLURM_CPUS_PER_TASK="2", NPROC_PER_NODE="2", SRUN_SAYS=said, SRUN_STATUS=str(status),
               SCONTROL_LOG=str(requeues))
    env.pop("SLURM_GPUS_ON_NODE", None)
    run = subprocess.run(["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == status, run.stdout + run.stderr
    assert said in run.stdout, run.stdout  # srun's output still reaches the job's output file
    assert ("the same sbatch command resumes from it" in run.stdout) == stopped, run.stdout
    assert (requeues.read_text() if requeues.exists() else "") == ("requeue 4242\n" if stopped and requeue else "")
    assert list(tmp.iterdir()) == []  # the copy of srun's output is removed


def test_resume_without_the_random_state_is_not_exact(world_of_one, tmp_path, monkeypatch):
    """The check above has teeth: skip restoring the RNG states (dropout masks) and the weights differ."""
    a, b = tmp_path / "a", tmp_path / "b"
    world_of_one("--out-dir", a)
    world_of_one("--out-dir", b, "--stop-after-epoch", 1)
    monkeypatch.setattr(world_of_one.script, "set_rng_state", lambda state: None)
    world_of_one("--out-dir", b)
    wa = torch.load(a / "final.pt", weights_only=True)
    wb = torch.load(b / "final.pt", weights_only=True)
    assert max_abs_diff(wa, wb) > 0.0


def test_a_damaged_checkpoint_is_refused_once_with_what_to_do(world_of_one, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes(b"not a checkpoint at all")
    assert world_of_one("--out-dir", out) == 2
    err = capsys.readouterr().err
    assert err.count("error: the checkpoint last.pt cannot be read") == 1
    assert "Move it away" in err and "--no-resume" in err and "Traceback" not in err
    assert not (out / "final.pt").exists()


@pytest.mark.slow
def test_resuming_with_another_number_of_processes_is_refused_clearly(world_of_one, tmp_path, capsys):
    """2 -> 1 and 1 -> 2: refused up front, by rank 0 alone, before any step of training."""
    from course_utils.launch import LaunchError, torchrun

    common = ["--model", "mlp", "--epochs", "3", "--no-progress"]
    two, one = tmp_path / "two", tmp_path / "one"
    torchrun(SCRIPT, nproc=2, args=[*common, "--out-dir", two, "--stop-after-epoch", 1], timeout=240,
             backend="gloo", show=False)
    assert world_of_one("--model", "mlp", "--out-dir", two) == 2  # 2 -> 1
    err = capsys.readouterr().err
    assert "written by a run of 2 processes, and this run has 1" in err and "Resume with 2 processes" in err
    assert load_checkpoint(two / "last.pt")["epoch"] == 1  # left as it was

    world_of_one("--model", "mlp", "--out-dir", one, "--stop-after-epoch", 1)
    with pytest.raises(LaunchError) as info:  # 1 -> 2
        torchrun(SCRIPT, nproc=2, args=[*common, "--out-dir", one], timeout=240, backend="gloo", show=False)
    said = [text.count("written by a run of 1 processes, and this run has 2") for text in info.value.stderr]
    assert said == [1, 0]  # rank 0 says it once; rank 1 stops without a word
    assert info.value.exit_code == 2 and not (one / "final.pt").exists()


def _two_nodes(out_dirs, args, timeout=240):
    """Two torchrun agents on this machine, as two nodes of one job (--nnodes 2, a c10d rendezvous
    on localhost), one rank each, each node with its own --out-dir (a node-local disk)."""
    import subprocess
    import sys

    port = _free_port()
    env = dict(os.environ, COURSE_BACKEND="gloo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
         "--rdzv-conf", f"is_host={int(node == 0)}", str(SCRIPT), *map(str, args), "--out-dir", str(out)],
        cwd=ROOT / "notebooks", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node, out in enumerate(out_dirs)]
    try:
        texts = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], texts
    return texts


@pytest.mark.slow
def test_two_nodes_with_node_local_disks_resume_as_one_run(tmp_path):
    """Only rank 0 writes checkpoints, so the other node's disk has none. Rank 0 decides whether to
    resume and sends its state, so the replicas never diverge: the resumed run ends with the weights
    of an uninterrupted one (whichever node rank 0 lands on)."""
    from course_utils.launch import torchrun

    common = ["--model", "mlp", "--epochs", "3", "--no-progress"]
    torchrun(SCRIPT, nproc=2, args=[*common, "--out-dir", tmp_path / "ref"], timeout=240, backend="gloo",
             show=False)
    disks = [tmp_path / "node0", tmp_path / "node1"]
    _two_nodes(disks, [*common, "--stop-after-epoch", 1])
    saved = [d for d in disks if (d / "last.pt").exists()]
    assert len(saved) == 1  # rank 0's node alone
    texts = _two_nodes(disks, common)
    finals = [d for d in disks if (d / "final.pt").exists()]
    assert len(finals) == 1
    resumed = any("resumed from last.pt: 1 epoch(s) done" in t for t in texts)
    assert resumed == (finals[0] == saved[0])  # rank 0 on the node with the checkpoint: it resumes
    sent = any("1 rank(s) could not read this last.pt" in t for t in texts)
    assert sent == resumed  # ...and sends it to the rank whose disk has none
    finals = [finals[0] / "final.pt"]
    wa = torch.load(tmp_path / "ref" / "final.pt", weights_only=True)
    assert max_abs_diff(wa, torch.load(finals[0], weights_only=True)) == 0.0


# ------------------------------------------------- the script under faults: crashes, damage, fresh starts

class _Killed(BaseException):
    """The process dies here (nothing of the script catches it, as nothing catches SIGKILL)."""


def _rows(out):
    return read_metrics(out / "metrics.jsonl")


@pytest.mark.parametrize("when", ["after the checkpoint's rename", "before the checkpoint"])
def test_checkpoint_and_metrics_agree_after_a_crash_at_any_point(world_of_one, tmp_path, monkeypatch, when):
    """A crash right after last.pt is renamed into place (or right before it is written) in epoch 2:
    the same command again ends with one metrics row per epoch, as the uninterrupted run's."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    world_of_one("--out-dir", ref)
    real = world_of_one.script.atomic_save

    def dies_at_epoch_2(obj, path):
        if isinstance(obj, dict) and obj.get("epoch") == 2:
            if when == "after the checkpoint's rename":
                real(obj, path)
            raise _Killed
        return real(obj, path)

    monkeypatch.setattr(world_of_one.script, "atomic_save", dies_at_epoch_2)
    with pytest.raises(_Killed):
        world_of_one("--out-dir", out)
    monkeypatch.setattr(world_of_one.script, "atomic_save", real)
    saved = load_checkpoint(out / "last.pt")["epoch"]
    assert saved == (2 if when == "after the checkpoint's rename" else 1)
    assert [r["epoch"] for r in _rows(out)][:saved] == list(range(1, saved + 1))  # the checkpoint's rows are there
    assert world_of_one("--out-dir", out) == 0  # the same command again
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3]
    assert [r["train_loss"] for r in _rows(out)] == [r["train_loss"] for r in _rows(ref)]


def test_a_torn_last_metrics_line_is_what_a_crash_leaves(world_of_one, tmp_path, capsys):
    """A crash while appending a row leaves a line cut short: resuming drops it, says so, and goes on."""
    out = tmp_path / "run"
    world_of_one("--out-dir", out, "--stop-after-epoch", 1)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "train_loss": 0.4')  # cut short, no newline
    capsys.readouterr()
    assert world_of_one("--out-dir", out) == 0
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3]
    assert "cut short" in capsys.readouterr().out


def test_a_damaged_metrics_file_is_refused_once_with_what_to_do(world_of_one, tmp_path, capsys):
    """Damage that is not a torn last line (a row in the middle): refused like a damaged last.pt, by rank 0,
    with what to do; no traceback."""
    out = tmp_path / "run"
    world_of_one("--out-dir", out, "--stop-after-epoch", 2)
    rows = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(["{not json", *rows[1:]]) + "\n")
    capsys.readouterr()
    assert world_of_one("--out-dir", out) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and "line 1 of metrics.jsonl" in err and "Traceback" not in err
    assert "--no-resume" in err


def test_read_metrics_drops_only_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2}\n{"epo')
    assert read_metrics(path) == [{"epoch": 1}, {"epoch": 2}]
    path.write_text('{"epoch": 1}\n{"epo\n{"epoch": 3}\n')
    with pytest.raises(CheckpointError, match="line 2 of metrics.jsonl"):
        read_metrics(path)
    path.write_text('{"epoch": 1}\n[1, 2]\n')  # valid JSON, not a row
    with pytest.raises(CheckpointError, match="line 2 of metrics.jsonl"):
        read_metrics(path)
    assert read_metrics(tmp_path / "none.jsonl") == []


def test_no_resume_keeps_the_earlier_run_aside(world_of_one, tmp_path, capsys):
    """--no-resume (the refusal's own advice) starts a fresh run without destroying the earlier one: its
    files move, untouched, to OUT_DIR/previous-1/, and the new run's files stand alone."""
    out = tmp_path / "run"
    world_of_one("--out-dir", out)
    before = {name: (out / name).read_bytes() for name in ("last.pt", "metrics.jsonl", "summary.json", "final.pt")}
    capsys.readouterr()
    assert world_of_one("--out-dir", out, "--no-resume", "--stop-after-epoch", 1) == 0
    kept = out / "previous-1"
    assert {name: (kept / name).read_bytes() for name in before} == before
    assert "previous-1" in capsys.readouterr().out
    assert [r["epoch"] for r in _rows(out)] == [1]
    assert not (out / "summary.json").exists() and not (out / "final.pt").exists()
    # Once more: the next fresh start takes the next number.
    assert world_of_one("--out-dir", out, "--no-resume", "--stop-after-epoch", 1) == 0
    assert (out / "previous-2" / "last.pt").exists() and (out / "previous-1" / "final.pt").exists()


def test_a_crash_while_saving_leaves_no_temporary_file_behind(tmp_path):
    """A process killed while writing last.pt (SIGKILL: nothing cleans up) leaves .last.pt.tmp-PID; the
    next save removes the ones of processes that are gone, and keeps a live one's."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = tmp_path / f".last.pt.tmp-{gone}"
    stale.write_bytes(b"x" * 1000)
    live = tmp_path / f".last.pt.tmp-{os.getppid()}"  # (a process that is alive: its write may be going on)
    live.write_bytes(b"y")
    atomic_save({"epoch": 1}, tmp_path / "last.pt")
    assert not stale.exists() and live.exists()


def test_a_full_disk_is_one_clear_error_and_the_checkpoint_is_kept(world_of_one, tmp_path, monkeypatch, capsys):
    """No space left while saving epoch 2: one line saying what happened and what to do (no chain of
    tracebacks), every rank stops, last.pt still holds epoch 1, and the same command resumes later."""
    import errno

    out = tmp_path / "run"
    real = torch.save

    def full_disk(obj, f, *a, **k):
        if isinstance(obj, dict) and obj.get("epoch") == 2:
            f.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    assert world_of_one("--out-dir", out) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and "No space left on device" in err and "Traceback" not in err
    assert "resume" in err
    assert load_checkpoint(out / "last.pt")["epoch"] == 1
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["last.pt", "metrics.jsonl"]
    assert not list(out.glob(".*.tmp*"))  # no temporary file left
    monkeypatch.setattr(torch, "save", real)
    assert world_of_one("--out-dir", out) == 0
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="holds the folder from another process")
def test_two_runs_in_one_folder_at_once_are_refused(world_of_one, tmp_path, capsys):
    """A second run started in a folder that a run is still using (two terminals, a cell run twice) would
    interleave both runs' checkpoints and rows: refused with what to do."""
    import subprocess
    import sys

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from course_utils.ch05_full_pipeline import hold_out_dir; "
         "lock = hold_out_dir(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert world_of_one("--out-dir", out) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and "another run is using" in err and str(holder.pid) in err
    assert "--out-dir" in err and not (out / "last.pt").exists()
    assert world_of_one("--out-dir", out, "--stop-after-epoch", 1) == 0  # free again once it is gone


def test_an_out_dir_that_is_a_file_is_refused_in_one_line(world_of_one, tmp_path, capsys):
    not_a_folder = tmp_path / "runs"
    not_a_folder.write_text("a file")
    assert world_of_one("--out-dir", not_a_folder) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and "cannot be used for this run" in err and "--out-dir" in err
    assert "Traceback" not in err
