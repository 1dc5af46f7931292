"""Chapter 04's helpers: course_utils.data.sampler_indices against the real DistributedSampler, the
pictures and the explorer of course_utils.ch04_distributed, and the launch helpers the chapter uses."""

import json

import matplotlib
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from course_utils.ch04_distributed import (
    COLLECTIVES,
    EXPLORER_DEFAULTS,
    draw_collectives,
    draw_sampler,
    draw_sampler_epochs,
    draw_shards,
    load_rank_records,
    sampler_explorer,
)
from course_utils.data import sampler_indices
from course_utils.figures import OKABE_ITO

matplotlib.use("Agg")


def test_draw_sampler_prints_the_shares_padding_and_drop(capsys):
    fig = draw_sampler(**EXPLORER_DEFAULTS)
    out = capsys.readouterr().out
    assert out.count("  rank ") == 3 and "; 2 padded" in out and "dropped" not in out
    assert fig.axes[0].get_title().startswith("DistributedSampler")
    plt.close(fig)
    plt.close(draw_sampler(10, 3, 0, True, True))
    out = capsys.readouterr().out
    shares = sampler_indices(10, 3, 0, True, 0, True)
    assert all(f"rank {r}: {s}" in out for r, s in enumerate(shares))
    (dropped,) = set(range(10)) - {i for s in shares for i in s}
    assert f"1 dropped this epoch: [{dropped}]" in out and "padded" not in out
    plt.close(draw_sampler(3, 4, drop_last=True))  # every rank reads nothing: still a picture
    assert "each rank reads 0 indices" in capsys.readouterr().out


def test_draw_sampler_epochs():
    records = []
    for r in range(2):
        rec = {"rank": r, "small": 10}
        rec["with set_epoch"] = [sampler_indices(10, 2, e)[r] for e in range(3)]
        rec["without set_epoch"] = [sampler_indices(10, 2, 0)[r] for _ in range(3)]
        records.append(rec)
    fig = draw_sampler_epochs(records)
    assert len(fig.axes) == 2
    plt.close(fig)


def collective_records():
    return [
        {"rank": 0, "collectives": {
            "all_reduce": {"before": [1, 10], "after": [3, 30]}, "reduce": {"before": [1, 10], "after": [3, 30]},
            "broadcast": {"before": [1, 10], "after": [1, 10]},
            "all_gather": {"before": [1, 10], "after": [1, 10, 2, 20]},
            "reduce_scatter": {"before": [1, 10], "after": [3]}}},
        {"rank": 1, "collectives": {
            "all_reduce": {"before": [2, 20], "after": [3, 30]}, "reduce": {"before": [2, 20], "after": [2, 20]},
            "broadcast": {"before": [2, 20], "after": [1, 10]},
            "all_gather": {"before": [2, 20], "after": [1, 10, 2, 20]},
            "reduce_scatter": {"before": [2, 20], "after": [30]}}},
    ]


def test_draw_collectives_one_panel_per_collective():
    fig = draw_collectives(list(reversed(collective_records())))  # any order: sorted by rank
    assert len(fig.axes) == len(COLLECTIVES)
    assert fig.axes[0].get_title(loc="left").startswith("all_reduce")
    colours = {ax.get_title(loc="left").split(":")[0]: [to_hex(p.get_facecolor()) for p in ax.patches]
               for ax in fig.axes[:len(COLLECTIVES)]}
    c0, c1, grey = OKABE_ITO[0].lower(), OKABE_ITO[1].lower(), "#c8c8c8"  # rank 0's data, rank 1's, a sum
    assert colours["reduce"] == [c0, c0, grey, grey, c1, c1, c1, c1]  # rank 1 keeps its own
    assert colours["all_gather"][2:6] == [c0, c0, c1, c1]
    assert colours["broadcast"][6:] == [c0, c0] and colours["reduce_scatter"][2] == grey
    plt.close(fig)


def test_draw_shards():
    full = {"fc1.weight": [256, 784], "fc2.bias": [10]}
    local = [{"fc1.weight": [128, 784], "fc2.bias": [5]}, {"fc1.weight": [128, 784], "fc2.bias": [5]}]
    fig = draw_shards(full, local)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "rank 1: rows 128-255" in texts
    plt.close(fig)


def test_load_rank_records(tmp_path):
    for r in range(3):
        (tmp_path / f"x_rank{r}.json").write_text(json.dumps({"rank": r}))
    assert [rec["rank"] for rec in load_rank_records(tmp_path, "x")] == [0, 1, 2]
    with pytest.raises(FileNotFoundError, match="--out"):
        load_rank_records(tmp_path, "missing")


def test_explorer_builds():
    pytest.importorskip("ipywidgets")
    w = sampler_explorer()
    assert len(w.children) == 3


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_pictures_and_explorer_speak_the_course_language(monkeypatch, capsys, lang):
    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    fig = draw_sampler(**EXPLORER_DEFAULTS)
    out = capsys.readouterr().out
    assert "  rank 0: [" in out and "set_epoch(0)" in out  # the sampler's own words: code and indices
    assert ("每个 rank 每个 epoch 读取 4 个索引" in out) == zh and ("each rank reads 4 indices" in out) != zh
    assert _has_chinese(fig.axes[0].get_title()) == zh and _has_chinese(fig.axes[0].get_xlabel()) == zh
    assert fig.axes[0].get_title().startswith("DistributedSampler")
    plt.close(fig)
    fig = draw_collectives(collective_records())
    title = fig.axes[0].get_title(loc="left")
    assert title == ("all_reduce：每个 rank 都得到总和" if zh else "all_reduce: every rank gets the sum")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == (
        ["调用前", "调用后"] if zh else ["before", "after"])
    plt.close(fig)
    fig = draw_shards({"w": [4, 2]}, [{"w": [2, 2]}, {"w": [2, 2]}])
    assert fig.axes[0].texts[1].get_text() == ("rank 1：第 2-3 行" if zh else "rank 1: rows 2-3")
    assert _has_chinese(fig.axes[0].get_title()) == zh
    plt.close(fig)
    pytest.importorskip("ipywidgets")
    sliders = sampler_explorer().children[0].children
    assert [s.description for s in sliders] == (
        ["样本数", "world size", "epoch"] if zh else ["items", "world size", "epoch"])
    plt.close("all")


# ---------------------------------------------------------------------------- processes
