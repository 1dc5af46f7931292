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
