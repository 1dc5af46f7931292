"""Tests for course_utils.ch03_data_loading (chapter 03)."""

from __future__ import annotations

import os
import pickle
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_utils import ch03_data_loading as L
from course_utils import data as DATA
from course_utils.data import image_paths, load_image
from course_utils.exercises.ch03 import _as_workers
from course_utils.i18n import speaking, text_width


@pytest.fixture(scope="module")
def digits_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "digits_test.csv"
    n = L.write_digits_csv(path, "test")
    return path, n


# ----------------------------------------------------------------- ImageDataset


def test_image_dataset_matches_files():
    paths, labels = image_paths("test")
    ds = L.ImageDataset(paths, labels)
    assert len(ds) == len(paths)
    img, y = ds[7]
    assert y == labels[7]
    assert np.array_equal(np.asarray(img), np.asarray(load_image(paths[7])))


def test_image_dataset_applies_transform_to_image_only():
    paths, labels = image_paths("test")
    ds = L.ImageDataset(paths[:3], labels[:3], transform=lambda im: np.asarray(im).sum())
    value, y = ds[1]
    assert value == np.asarray(load_image(paths[1])).sum()
    assert y == labels[1]


def test_image_dataset_pickles_by_module_name():
    """What a spawned worker needs: the class can be found by importing course_utils.ch03_data_loading."""
    paths, labels = image_paths("test")
    data = pickle.dumps(L.ImageDataset(paths[:2], labels[:2]))
    assert b"course_utils.ch03_data_loading" in data
    assert len(pickle.loads(data)) == 2


# ----------------------------------------------------------------- synthetic images


def test_synthetic_images_deterministic_per_index():
    a, b = L.SyntheticImages(20, size=64, out_size=32), L.SyntheticImages(20, size=64, out_size=32)
    x1, y1 = a[5]
    _ = a[3]  # order does not matter
    x2, y2 = b[5]
    assert torch.equal(x1, x2) and y1 == y2
    assert x1.shape == (3, 32, 32) and x1.dtype == torch.float32
    assert not torch.equal(a[5][0], a[6][0])
    assert a.encoded(5)[1] == y1
    assert L.SyntheticImages(20, size=64, seed=1).encoded(5)[0] != a.encoded(5)[0]


def test_synthetic_images_index_errors_and_labels():
    ds = L.SyntheticImages(50, size=32, out_size=16)
    with pytest.raises(IndexError):
        ds[50]
    labels = {ds.encoded(i)[1] for i in range(50)}
    assert labels <= set(range(10)) and len(labels) > 5


# ----------------------------------------------------------------- sequences and collate


def test_toy_sequences_deterministic_and_lengths():
    ds = L.ToySequences(30, min_len=2, max_len=9, seed=4)
    s, y = ds[3]
    assert torch.equal(s, L.ToySequences(30, min_len=2, max_len=9, seed=4)[3][0])
    assert ds.lengths() == [len(ds[i][0]) for i in range(30)]
    assert all(2 <= n <= 9 for n in ds.lengths())
    assert y == int(len(s) > 5.5)
    assert int(s.min()) >= 1  # 0 is reserved for padding


def test_pad_collate_pads_and_keeps_lengths_and_mask():
    batch = [(torch.tensor([3, 1, 4]), 0), (torch.tensor([1, 5]), 1), (torch.tensor([9, 2, 6, 5]), 1)]
    out = L.pad_collate(batch)
    assert out.padded.tolist() == [[3, 1, 4, 0], [1, 5, 0, 0], [9, 2, 6, 5]]
    assert out.lengths.tolist() == [3, 2, 4]
    assert out.mask.tolist() == [[True, True, True, False], [True, True, False, False], [True] * 4]
    assert out.labels.tolist() == [0, 1, 1]


def test_pad_collate_in_a_loader():
    loader = DataLoader(L.ToySequences(10), batch_size=4, collate_fn=L.pad_collate)
    batches = list(loader)
    assert [len(b.labels) for b in batches] == [4, 4, 2]
    assert sum(int(b.mask.sum()) for b in batches) == sum(L.ToySequences(10).lengths())


# ----------------------------------------------------------------- streams


def test_streams_in_main_process(digits_csv):
    path, n = digits_csv
    naive = [i for i, _, _ in L.NaiveDigitsStream(path)]
    sharded = [i for i, _, _ in L.ShardedDigitsStream(path)]
    assert naive == sharded == list(range(n))
    i, x, y = next(iter(L.ShardedDigitsStream(path)))
    paths, labels = image_paths("test")
    assert x.shape == (1, 28, 28) and y == labels[0]
    assert torch.allclose(x[0], torch.from_numpy(np.asarray(load_image(paths[0]), dtype=np.float32) / 255))


def test_streams_as_simulated_workers(digits_csv):
    """Each worker's copy: the naive stream duplicates, the sharded one covers each line once."""
    path, n = digits_csv

    class Idx(torch.utils.data.IterableDataset):
        def __init__(self, inner):
            self.inner = inner

        def __iter__(self):
            return (i for i, _, _ in self.inner)

    naive = Counter(_as_workers(Idx(L.NaiveDigitsStream(path)), 3))
    sharded = Counter(_as_workers(Idx(L.ShardedDigitsStream(path)), 3))
    assert L.delivery_counts(list(naive.elements()), n) == {
        "delivered": 3 * n, "distinct": n, "duplicated": n, "missing": 0}
    assert L.delivery_counts(list(sharded.elements()), n) == {
        "delivered": n, "distinct": n, "duplicated": 0, "missing": 0}


def test_sharded_stream_across_ranks(digits_csv):
    path, n = digits_csv
    seen = []
    for rank in range(2):
        seen += [i for i, _, _ in L.ShardedDigitsStream(path, rank=rank, world_size=2)]
    assert sorted(seen) == list(range(n))


@pytest.mark.slow
def test_streams_with_real_workers(digits_csv):
    path, n = digits_csv
    kw = dict(batch_size=64, num_workers=2, timeout=60)
    naive = torch.cat([b[0] for b in DataLoader(L.NaiveDigitsStream(path), **kw)])
    sharded = torch.cat([b[0] for b in DataLoader(L.ShardedDigitsStream(path), **kw)])
    assert L.delivery_counts(naive, n)["duplicated"] == n
    assert sorted(sharded.tolist()) == list(range(n))


def test_delivery_counts():
    assert L.delivery_counts([0, 1, 1, 3], 4) == {"delivered": 4, "distinct": 3, "duplicated": 1, "missing": 1}
    assert L.delivery_counts(torch.tensor([1, 0]), 2)["missing"] == 0


def test_delivery_counts_speak_the_course_language():
    with speaking("en"):
        assert list(L.delivery_counts([0, 0], 2)) == ["delivered", "distinct", "duplicated", "missing"]
    with speaking("zh"):
        assert L.delivery_counts([0, 0], 2) == {"送达": 2, "不同的": 1, "重复的": 1, "缺失的": 1}


# ----------------------------------------------------------------- workers


def test_dataloader_itself_gives_workers_one_thread_and_seeds():
    """The claims of chapter 03's worker section, checked in PyTorch's own worker loop (source and behaviour)."""
    import inspect

    from torch.utils.data._utils import worker

    src = inspect.getsource(worker._worker_loop)
    order = [src.index(s) for s in ("torch.set_num_threads(1)", "random.seed(seed)", "torch.manual_seed(seed)",
                                    "np.random.seed(np_seed)", "init_fn(worker_id)")]
    assert order == sorted(order)  # threads and seeds are set before the user's worker_init_fn runs


@pytest.mark.slow
def test_worker_state_and_reseed_rng():
    def rows(init):
        loader = DataLoader(L.WorkerState(n=4), batch_size=None, num_workers=2, timeout=60, worker_init_fn=init,
                            generator=torch.Generator().manual_seed(0))
        return [list(r) for _ in range(2) for r in loader]  # 2 epochs

    plain = rows(None)
    assert all(r[2] == 1 for r in plain)  # one thread in every worker, without any worker_init_fn
    w0, w1 = plain[0], plain[1]
    assert (w0[1], w1[1]) == (0, 1) and w1[3] == w0[3] + 1  # torch seed = base seed + worker id
    assert len({r[4] for r in plain}) == len({r[5] for r in plain}) == len({r[6] for r in plain}) == 8
    assert w0[7] == w1[7] and plain[0][7] == plain[4][7]  # the dataset's own Generator: copied, same draws
    reseeded = rows(DATA.reseed_rng)
    assert len({r[7] for r in reseeded}) == 8
    assert [r[4] for r in reseeded] == [r[4] for r in plain]  # nothing else changed


@pytest.mark.slow
def test_persistent_workers_are_seeded_once():
    def rows(init, persistent):
        loader = DataLoader(L.WorkerState(n=4), batch_size=None, num_workers=2, timeout=60, worker_init_fn=init,
                            persistent_workers=persistent, generator=torch.Generator().manual_seed(0))
        return [list(r) for _ in range(2) for r in loader]  # 2 epochs

    fresh, kept = rows(None, False), rows(None, True)
    assert kept[:4] == fresh[:4]  # the first epoch is the same either way
    assert [r[3] for r in fresh[:4]] != [r[3] for r in fresh[4:]]  # new workers: new seeds each epoch
    assert [r[3] for r in kept[:4]] == [r[3] for r in kept[4:]]  # persistent workers: seeded once
    assert len({r[4] for r in kept}) == len({r[6] for r in kept}) == 8  # ...but their draws carry on
    assert kept[0][7] == kept[1][7] and kept[0][7] != kept[4][7]  # self.rng: same in both workers, not repeated
    reseeded = rows(DATA.reseed_rng, True)
    assert len({r[7] for r in reseeded}) == 8  # worker_init_fn ran once per worker, and still fixes it


def test_digit_records(tmp_path):
    path = tmp_path / "d.bin"
    n = L.write_digit_records(path, "test")
    records = L.DigitRecords(path)
    assert len(records) == n == 359
    x, y = DATA.digits_tensors("test")
    image, label, who = records[5]
    assert torch.equal(image, x[5]) and label == int(y[5]) and who == "main process"
    clone = pickle.loads(pickle.dumps(records))  # the handle stays behind
    assert clone.file is None and clone.opened_by == "nobody"
    assert torch.equal(clone[358][0], x[358])
    records.close()
    assert records.file is None
    with pytest.raises(IndexError):
        records[n]
    with speaking("zh"):  # the Chinese edition names the process in Chinese
        assert records[5][2] == "主进程"
    records.close()


@pytest.mark.slow
def test_open_per_worker(tmp_path):
    path = tmp_path / "d.bin"
    L.write_digit_records(path, "test")
    records = L.DigitRecords(path)
    records[0]  # the main process opens a handle first
    loader = DataLoader(records, batch_size=4, sampler=range(32), num_workers=2, timeout=60,
                        worker_init_fn=L.open_per_worker)
    batches = list(loader)
    assert Counter(w for _, _, who in batches for w in who) == {"worker 0": 16, "worker 1": 16}
    records.close()


def test_split_span_shares_a_stream():
    from torch.utils.data._utils import worker as w

    for n, k in ((10, 2), (10, 3), (11, 4), (3, 4)):
        got = []
        saved = w._worker_info
        try:
            for wid in range(k):
                span = L.Span(0, n)
                w._worker_info = w.WorkerInfo(id=wid, num_workers=k, seed=wid, dataset=span)
                L.split_span(wid)
                got += list(span)
        finally:
            w._worker_info = saved
        assert sorted(got) == list(range(n)), (n, k)


# ----------------------------------------------------------------- batch browser logic


def test_batch_view_matches_a_real_dataloader_over_epochs():
    labels = [i % 3 for i in range(50)]
    g = torch.Generator().manual_seed(7)
    loader = DataLoader(range(50), batch_size=8, shuffle=True, generator=g)
    epochs = [[b.tolist() for b in loader] for _ in range(3)]
    for e in range(3):
        view = L.batch_view(labels, batch_size=8, shuffle=True, seed=7, epoch=e, batch=2)
        assert view.batches == epochs[e]
        assert view.indices == epochs[e][2]
        assert view.labels == [labels[i] for i in epochs[e][2]]
        assert view.sampler == "RandomSampler"
    assert epochs[0] != epochs[1]


def test_batch_view_samplers():
    def order(view):
        return [i for b in view.batches for i in b]

    labels = [0] * 90 + [1] * 10
    seq = L.batch_view(labels, batch_size=10, shuffle=False)
    assert order(seq) == list(range(100)) and seq.sampler == "SequentialSampler"
    assert order(L.batch_view(labels, shuffle=False, sampler="sequential")) == list(range(100))
    rnd = order(L.batch_view(labels, shuffle=False, sampler="random", seed=1))
    assert sorted(rnd) == list(range(100)) and rnd != list(range(100))
    w = L.batch_view(labels, batch_size=100, shuffle=False, sampler="weighted", seed=0)
    assert w.sampler == "WeightedRandomSampler"
    minority = sum(1 for i in order(w) if labels[i] == 1)
    assert 30 <= minority <= 70  # balanced on average, not 10 in 100
    assert len(set(order(w))) < 100  # drawn with replacement
    assert L.batch_view(labels, batch_size=16, batch=99).batch == 6  # clamped to the last batch
    assert len(L.batch_view(labels, batch_size=16, batch=6).indices) == 4


def test_batch_view_refuses_shuffle_with_a_sampler():
    with pytest.raises(ValueError, match="mutually exclusive"):
        L.batch_view([0, 1], shuffle=True, sampler="weighted")


def test_class_balanced_weights():
    w = L.class_balanced_weights([0, 0, 0, 1])
    assert w.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])


def test_draw_batch_view_and_widget():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images = torch.rand(40, 1, 28, 28)
    labels = [i % 10 for i in range(40)]
    view = L.batch_view(labels, **L.BATCH_BROWSER_DEFAULTS)
    fig = L.draw_batch_view(view, images)
    assert "RandomSampler, epoch 0: batch 0 of 3 (16 images)" in fig.texts[0].get_text()
    plt.close("all")
    box = L.batch_browser(images, labels)
    assert len(box.children) == 3
    plt.close("all")


def test_to_tensor_matches_torchvision():
    from PIL import Image
    from torchvision.transforms import ToTensor

    gray = load_image(image_paths("test")[0][0])
    rgb = Image.fromarray((np.arange(2 * 3 * 3) * 9 % 256).astype(np.uint8).reshape(2, 3, 3), mode="RGB")
    for img in (gray, rgb):
        assert torch.equal(L.to_tensor(img), ToTensor()(img))


# ----------------------------------------------------------------- measuring loaders


def _run(w, seconds, first=0.1, items=64):
    return L.LoaderRun(w, {}, items, first_batch_s=first, epoch_seconds=list(seconds))


def test_loader_run_median_and_table():
    runs = [_run(0, [1.0, 3.0, 1.2]), _run(2, [0.5, 0.5, 0.6])]
    assert runs[0].median_s == 1.2 and runs[0].items_per_s == pytest.approx(64 / 1.2)
    assert runs[0].spread == pytest.approx((3.0 - 1.0) / 1.2)
    table = L.format_runs(runs).splitlines()
    assert table[0].split()[:3] == ["workers", "1st", "batch"]
    assert table[-1].split()[0] == "2" and "2.40" in table[-1] and table[-1].endswith("yes")


def test_curve_summary_reads_the_numbers():
    runs = [_run(0, [1.0] * 3), _run(1, [0.6] * 3), _run(2, [0.5] * 3), _run(4, [0.49] * 3, first=0.7)]
    text = L.curve_summary(runs, cores=2, load=0.3)
    assert "Fastest here: num_workers=4" in text and "above this machine's 2 cores" in text
    assert "The smallest num_workers within 5% of the fastest: 2." in text
    assert "up to 0.700 s (num_workers=4)" in text and "WARNING" not in text
    text = L.curve_summary(runs[:3], cores=2, load=9.0)
    assert "num_workers=2" in text and "at this machine's 2 cores" in text and "WARNING: this machine is busy" in text
    assert "below this machine's 4 cores" in L.curve_summary(runs[:3], cores=4, load=None)


def test_measure_throughput_in_process():
    ds = L.SyntheticImages(24, size=32, out_size=16)
    seen = []
    run = L.measure_throughput(ds, 0, batch_size=8, epochs=3, timeout=60, step=lambda b: seen.append(len(b[1])))
    assert run.each_item_once and len(run.epoch_seconds) == 3 and run.first_batch_s > 0
    assert seen == [8, 8, 8] * 4  # warm-up + 3 timed epochs, the step called on every batch
    assert run.loader_kw == {}  # no worker options (nor a timeout) without workers
    whole = L.measure_throughput(ds, 0, batch_size=8, epochs=2, warm_up=False)
    assert len(whole.epoch_seconds) == 2 and whole.each_item_once


@pytest.mark.slow
def test_measure_throughput_with_workers_and_training_seconds():
    ds = L.SyntheticImages(32, size=32, out_size=16)
    run = L.measure_throughput(ds, 2, batch_size=8, epochs=2, timeout=60)
    assert run.each_item_once and len(run.epoch_seconds) == 2 and run.loader_kw["persistent_workers"]
    fresh = L.measure_throughput(ds, 2, epochs=2, warm_up=False, persistent_workers=False, prefetch_factor=4)
    assert fresh.each_item_once and fresh.loader_kw["prefetch_factor"] == 4
    seconds = L.training_seconds(ds, [0, 2])
    assert sorted(seconds) == [0, 2] and all(len(t) == 3 and min(t) > 0 for t in seconds.values())


def test_training_seconds_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    seconds = L.training_seconds(L.SyntheticImages(16, size=32, out_size=16), [0], epochs=1)
    assert len(seconds[0]) == 1
    assert torch.equal(torch.get_rng_state(), before)


def _reference():
    import json

    return json.loads(L.REFERENCE_PATH.read_text())


def test_stored_reference_describes_its_machine():
    ref = _reference()
    m = ref["machine"]
    for key in ("cores", "system", "torch", "date", "load_average_before", "load_average_after", "quiet"):
        assert key in m
    if not m["quiet"]:  # stored with --force: the file must say the load was above the cores
        assert max(m["load_average_before"], m["load_average_after"]) > m["cores"]
    workers = [p["num_workers"] for p in ref["points"]]
    assert workers[0] == 0 and workers == sorted(workers) and {0, 1, 2, 4} <= set(workers)
    assert all(p["images_per_s"] > 0 and p["first_batch_s"] >= 0 for p in ref["points"])
    assert ref["settings"]["items"] == 128 and ref["settings"]["batch_size"] == 16  # the notebook's settings


def test_plot_curves_with_and_without_reference():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [_run(w, [1.0 / (w + 1)] * 3) for w in (0, 1, 2)]
    fig = L.plot_curves(runs, 2, _reference())
    labels = fig.axes[1].get_legend_handles_labels()[1]
    assert labels[0] == "this machine (2 cores)" and labels[1].startswith("reference (")
    assert fig.axes[1].lines[0].get_ydata().tolist() == pytest.approx([1.0, 2.0, 3.0])  # speed-up over 0 workers
    assert len(L.plot_curves(runs, 2).axes[0].lines) == 2  # without a reference: one curve and its core mark
    plt.close("all")


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_chapter_03_displays_speak_the_course_language(monkeypatch, lang):
    """The Chinese edition's words (COURSE_LANG=zh), the English ones unchanged; option values stay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    runs = [_run(0, [1.0] * 3), _run(1, [0.6] * 3), _run(2, [0.5] * 3), _run(4, [0.49] * 3)]
    summary = L.curve_summary(runs, cores=2, load=None)
    assert _has_chinese(summary) == zh and ("最快" in summary) == zh and ("Fastest here" in summary) != zh
    table = L.format_runs(runs).splitlines()
    if zh:  # Chinese column names, each over its column (a Chinese character takes two columns)
        assert table[0].split() == [
            "worker", "首批秒数", "epoch", "中位秒数", "图像/秒", "相对", "0", "波动", "每张恰好一次"]
        assert text_width(table[0]) == text_width(table[1]) == text_width(table[2]) and table[2].endswith(" 是")
    else:  # the English table unchanged
        assert table[0] == "workers 1st batch s median epoch s  images/s  x vs 0  spread  once"
        assert len(table[1]) == len(table[2]) == len(table[0]) and table[2].endswith("  yes")
    fig = L.plot_curves(runs, 2, _reference())
    title, legend = fig.axes[0].get_title(), fig.axes[0].get_legend_handles_labels()[1]
    assert title == ("吞吐量（虚线：各机器的核心数）" if zh else "Throughput (dashed: each machine's cores)")
    assert legend[0] == ("本机（2 个核心）" if zh else "this machine (2 cores)")
    assert fig.axes[0].get_xlabel() == "num_workers"
    images, labels = torch.rand(40, 1, 28, 28), [i % 10 for i in range(40)]
    fig = L.draw_batch_view(L.batch_view(labels, **L.BATCH_BROWSER_DEFAULTS), images)
    assert _has_chinese(fig.texts[0].get_text()) == zh and _has_chinese(fig.axes[-1].get_xlabel()) == zh
    plt.close("all")
    box = L.batch_browser(images, labels)
    controls = [c for row in box.children[:2] for c in row.children]
    assert [c.description for c in controls] == (
        ["批次大小", "shuffle", "种子", "采样器", "epoch", "批次"] if zh
        else ["batch size", "shuffle", "seed", "sampler", "epoch", "batch"])
    sampler = controls[3]
    assert [value for _, value in sampler.options] == list(L.SAMPLERS) and sampler.value == "default"
    assert _has_chinese(sampler.label) == zh and _has_chinese(sampler.options[2][0]) == zh
    plt.close("all")


def _benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "loader_throughput.py"
    spec = importlib.util.spec_from_file_location("benchmarks.loader_throughput", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_refuses_a_busy_reference_unless_forced(tmp_path, monkeypatch, capsys):
    import json

    bench = _benchmark()
    monkeypatch.setattr(bench, "load_average", lambda: bench.cpu_cores() + 5.0)
    out = tmp_path / "ref.json"
    small = ["--workers", "0", "--repeats", "1", "--items", "8", "--size", "32", "--out-size", "16",
             "--batch-size", "4"]
    assert bench.main(small + ["--save-reference", str(out)]) == 2
    assert not out.exists() and "not measuring a reference" in capsys.readouterr().err
    assert bench.main(small + ["--save-reference", str(out), "--force"]) == 0
    ref = json.loads(out.read_text())
    assert ref["machine"]["quiet"] is False and ref["machine"]["load_average_before"] > ref["machine"]["cores"]
    assert ref["points"][0]["num_workers"] == 0 and ref["points"][0]["images_per_s"] > 0
    monkeypatch.setattr(bench, "load_average", lambda: 0.0)
    assert bench.main(small + ["--save-reference", str(out)]) == 0
    assert json.loads(out.read_text())["machine"]["quiet"] is True


class _DiesInWorker(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        os._exit(3)  # the worker process ends without a Python traceback


def test_worker_failure_reads_the_same_in_every_run():
    # the loader's two wordings: its own liveness check, and the SIGCHLD handler's
    for message in ("DataLoader worker (pid(s) 4242, 4243) exited unexpectedly",
                    "DataLoader worker (pid 4242) exited unexpectedly with exit code 1. Details are lost"):
        assert L.worker_failure(RuntimeError(message)) == "RuntimeError: DataLoader worker exited unexpectedly"
    assert L.worker_failure(ValueError("something else")) == "ValueError: something else"


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX only")
def test_worker_failure_of_a_real_dead_worker():
    from course_utils.launch import child_stderr

    loader = DataLoader(_DiesInWorker(), batch_size=2, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(RuntimeError) as info, child_stderr():
        next(iter(loader))
    assert L.worker_failure(info.value) == "RuntimeError: DataLoader worker exited unexpectedly"


def test_a_loader_keeps_num_workers_times_prefetch_factor_batches_in_flight():
    assert L.batches_in_flight(2, 2) == 2 * 2 + 1
    assert L.batches_in_flight(1, 3) == 1 * 3 + 1


def test_counted_items_count_every_process_without_sharing_a_slot():
    ds = L.CountedItems(6, slots=3)
    list(DataLoader(ds, batch_size=2, num_workers=2, timeout=60))
    assert int(ds.calls.sum()) == 6 and ds.calls[0] == 0  # the main process fetched nothing


def test_a_worker_reading_a_list_copies_it_and_reading_an_array_does_not():
    import multiprocessing

    table = list(range(1_000_000))
    grown = L.worker_copy_mib(table)
    if grown is None:
        assert L.private_dirty_mib() is None or multiprocessing.get_start_method() != "fork"
        return
    assert grown > 20  # about 28 MiB of int objects, touched by reading them
    assert L.worker_copy_mib(np.arange(1_000_000)) < 5


@pytest.mark.parametrize("edition", ["notebooks", "notebooks-zh"])
def test_the_notebooks_cleanup_cell_can_be_run_twice(edition, tmp_path):
    """Section 5's cleanup cell (which removes the stream's and the records' folders) run again, as a
    learner re-running cells does: no FileNotFoundError the second time."""
    import json
    import shutil

    from course_utils import ROOT

    cells = json.loads((ROOT / edition / "03_data_loading.ipynb").read_text(encoding="utf-8"))["cells"]
    source = "".join(next(c for c in cells if c.get("id") == "6f8bfff7")["source"])
    assert "shutil.rmtree(stream_dir" in source
    stream_dir, records_dir = tmp_path / "stream", tmp_path / "records"
    for folder in (stream_dir, records_dir):
        folder.mkdir()
        (folder / "a.txt").write_text("x")
    namespace = {"shutil": shutil, "stream_dir": stream_dir, "records_dir": records_dir}
    for _ in range(2):
        exec(compile(source, "cleanup cell", "exec"), namespace)
    assert not stream_dir.exists() and not records_dir.exists()
