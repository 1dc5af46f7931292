"""The gallery widget of chapter 00 and its static twin start from the same view."""

import inspect

import matplotlib
import matplotlib.pyplot as plt
import pytest

from course_utils import ch00_start_here as gallery

matplotlib.use("Agg")  # the widget calls plt.show(): never open a window


def test_pick_and_show_default_to_the_default_view():
    for fn in (gallery.pick, gallery.show):
        defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()}
        assert defaults == dict(gallery.GALLERY_DEFAULTS), fn.__name__


def test_the_widget_starts_at_the_default_view():
    ui = gallery.gallery_widget()
    plt.close("all")
    start = {c._kwarg: c.value for c in ui.kwargs_widgets}
    label = start.pop("label")
    assert start == {k: v for k, v in gallery.GALLERY_DEFAULTS.items() if k != "label"}
    assert (None if label < 0 else label) == gallery.GALLERY_DEFAULTS["label"]


def test_the_default_view_draws_n_images_reproducibly():
    images, labels, idx = gallery.pick(**gallery.GALLERY_DEFAULTS)
    n = gallery.GALLERY_DEFAULTS["n"]
    assert images.shape == (n, 28, 28) and len(labels) == len(idx) == n
    assert gallery.pick(**gallery.GALLERY_DEFAULTS)[2] == idx
    fig = gallery.show(**gallery.GALLERY_DEFAULTS)
    drawn = [ax for ax in fig.axes if ax.images]
    assert [int(ax.get_title()) for ax in drawn] == labels
    plt.close(fig)


def test_a_class_view_holds_only_that_class():
    _, labels, _ = gallery.pick("test", label=7, n=16, seed=3)
    assert labels == [7] * 16


@pytest.mark.parametrize("kwargs", [{"n": 0}, {"n": 201}, {"label": 10}, {"label": -1}])
def test_bad_requests_are_refused(kwargs):
    with pytest.raises(ValueError):
        gallery.pick(**kwargs)


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_gallery_speaks_the_course_language(monkeypatch, lang):
    """The Chinese edition's labels and title (COURSE_LANG=zh), the English ones unchanged; values stay."""
    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    ui = gallery.gallery_widget()
    plt.close("all")
    assert [c.description for c in ui.kwargs_widgets] == (
        ["数据集", "数字（-1：全部）", "图像数量", "随机种子"] if zh
        else ["split", "digit (-1: all)", "images", "seed"])
    split = ui.kwargs_widgets[0]
    assert split.options == ((("训练集", "train"), ("测试集", "test")) if zh
                             else (("train", "train"), ("test", "test")))
    assert split.value == "train" and split.label == ("训练集" if zh else "train")
    fig = gallery.show("test", 3, 8, 1)
    assert fig.get_suptitle() == ("测试集中的 8 张图像，数字 3（随机种子 1）" if zh
                                  else "8 test images, digit 3 (seed 1)")
    plt.close(fig)
