"""Unit tests for course_utils.ch02_nn_module (chapter 02) and the chapter's exercises."""

import re
from collections import OrderedDict

import matplotlib
import pytest
import torch
from torch import nn

from course_utils import ch02_nn_module as cm
from course_utils.exercises import ch02
from course_utils.figures import alt_text
from course_utils.i18n import speaking, text_width

matplotlib.use("Agg")


class MLP(nn.Module):
    def __init__(self, in_dim=784, hidden_dim=256, out_dim=10):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_dim, out_dim)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class MiniMLP(cm.MiniModule):
    def __init__(self, in_dim=784, hidden_dim=256, out_dim=10):
        super().__init__()
        self.fc1 = cm.MiniLinear(in_dim, hidden_dim)
        self.relu = cm.MiniReLU()
        self.fc2 = cm.MiniLinear(hidden_dim, out_dim)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


# --------------------------------------------------------------------------- summary


def test_summary_of_the_mlp():
    model = MLP()
    text = cm.summary(model, torch.zeros(1, 784))
    assert text.splitlines()[3:6] == [
        "fc1 (Linear)  [1, 256]          200,960",
        "relu (ReLU)   [1, 256]                0",
        "fc2 (Linear)  [1, 10]             2,570",
    ]
    assert "Total params: 203,530" in text and "Non-trainable params: 0" in text
    model.fc1.requires_grad_(False)
    assert "Trainable params: 2,570" in cm.summary(model, torch.zeros(1, 784))
    assert cm.hook_count(model) == 0


def test_summary_of_a_cnn_keeps_mode_and_running_stats():
    cnn = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 14 * 14, 10),
    )
    cnn.train()
    before = cnn[1].running_mean.clone()
    text = cm.summary(cnn, torch.rand(1, 1, 28, 28))
    assert cnn.training and torch.equal(cnn[1].running_mean, before)
    shapes = [re.split(r"\s{2,}", line)[1] for line in text.splitlines()[3:9]]
    assert shapes == ["[1, 8, 28, 28]"] * 3 + ["[1, 8, 14, 14]", "[1, 1568]", "[1, 10]"]
    assert f"Total params: {80 + 16 + 15_690:,}" in text
    assert cm.hook_count(cnn) == 0


def test_summary_lists_a_module_with_its_own_parameters_and_children_and_removes_hooks_on_error():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.gain = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.lin(x) * self.gain

    model = nn.Sequential(Scaled(), nn.LSTM(3, 4, batch_first=True))
    lines = cm.summary(model, torch.zeros(2, 5, 3)).splitlines()
    assert [line.split()[0] for line in lines[3:6]] == ["0.lin", "0", "1"]
    assert lines[5].split()[2:5] == ["[2,", "5,", "4]"]  # an RNN's tuple: the output's shape
    with pytest.raises(RuntimeError):
        cm.summary(model, torch.zeros(2, 5, 4))
    assert cm.hook_count(model) == 0 and model.training


# --------------------------------------------------------------------------- the miniature Module


def test_mini_module_matches_the_real_one():
    torch.manual_seed(0)
    real = MLP()
    torch.manual_seed(0)
    mini = MiniMLP()
    assert [n for n, _ in mini.named_parameters()] == [n for n, _ in real.named_parameters()]
    assert [n for n, _ in mini.named_modules()] == [n for n, _ in real.named_modules()]
    assert sum(p.numel() for p in mini.parameters()) == 203_530
    for (_, a), (_, b) in zip(mini.named_parameters(), real.named_parameters(), strict=True):
        assert torch.equal(a, b)
    x = torch.rand(3, 784)
    with torch.no_grad():
        assert torch.allclose(mini(x), real(x), atol=1e-6)
    assert list(mini.state_dict()) == list(real.state_dict())
    assert "fc1" not in mini.__dict__ and "fc1" in mini._modules


def test_mini_module_buffers_persistent_and_not():
    class M(cm.MiniModule):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))
            self.register_buffer("running", torch.zeros(2))
            self.register_buffer("cache", torch.zeros(2), persistent=False)
            self.note = torch.zeros(2)

    m = M()
    assert [n for n, _ in m.named_parameters()] == ["w"]
    assert [n for n, _ in m.named_buffers()] == ["running", "cache"]
    assert list(m.state_dict()) == ["w", "running"]
    m.running = torch.ones(2)  # re-assigning a buffer keeps it a buffer
    assert torch.equal(m._buffers["running"], torch.ones(2))
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = m.missing


@pytest.mark.parametrize("base", [nn.Module, cm.MiniModule])
def test_registered_names_keep_their_kind_like_the_real_module(base):
    child_type = nn.ReLU if base is nn.Module else cm.MiniReLU

    class M(base):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))
            self.register_buffer("running", torch.zeros(2))
            self.act = child_type()

    m = M()
    with pytest.raises(TypeError, match="as parameter 'w'"):
        m.w = torch.zeros(2)  # a plain tensor for a parameter's name is refused, not silently unregistered
    with pytest.raises(TypeError, match="as buffer 'running'"):
        m.running = 3
    with pytest.raises(TypeError, match="as child module 'act'"):
        m.act = "relu"
    assert [n for n, _ in m.named_parameters()] == ["w"]
    assert [n for n, _ in m.named_buffers()] == ["running"]
    assert [n for n, _ in m.named_modules()] == ["", "act"]
    m.running = torch.ones(2)  # a tensor for a buffer's name stays a buffer
    assert "running" in m._buffers and "running" not in m.__dict__
    m.w = None  # None is allowed, and keeps the name registered (with no tensor)
    m.act = None
    assert "w" in m._parameters and m.w is None and list(m.named_parameters()) == []
    assert list(m.state_dict()) == ["running"] and [n for n, _ in m.named_modules()] == [""]
    m.w = nn.Parameter(torch.zeros(3))  # a new Parameter replaces it
    assert [n for n, _ in m.named_parameters()] == ["w"]


@pytest.mark.parametrize("base", [nn.Module, cm.MiniModule])
def test_nn_buffer_registers_and_a_parameter_replaces_a_submodule_like_the_real_module(base):
    child_type = nn.ReLU if base is nn.Module else cm.MiniReLU

    class M(base):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))
            self.act = child_type()
            self.x = nn.Buffer(torch.zeros(2))  # assigning an nn.Buffer registers a buffer
            self.y = nn.Buffer(torch.ones(1), persistent=False)

    m = M()
    assert [n for n, _ in m.named_buffers()] == ["x", "y"]
    assert list(m.state_dict()) == ["w", "x"] and "x" not in m.__dict__
    with pytest.raises(TypeError, match="as parameter 'w'"):
        m.w = nn.Buffer(torch.zeros(2))
    with pytest.raises(TypeError, match="as parameter 'w'"):
        m.w = child_type()  # a module for a parameter's name is refused too
    m.act = nn.Parameter(torch.zeros(3))  # but a Parameter silently replaces a sub-module
    assert [n for n, _ in m.named_modules()] == [""]
    assert [n for n, _ in m.named_parameters()] == ["w", "act"]


def test_mini_module_shared_submodule_listed_once_and_train_eval():
    class M(cm.MiniModule):
        def __init__(self):
            super().__init__()
            self.a = cm.MiniLinear(2, 2)
            self.b = self.a

    m = M()
    assert [n for n, _ in m.named_modules()] == ["", "a"]
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias"]
    m.eval()
    assert not m.training and not m.a.training
    m.train()
    assert m.a.training


def test_mini_module_needs_super_init():
    class Bad(cm.MiniModule):
        def __init__(self):
            self.x = 1

    with pytest.raises(AttributeError, match="super"):
        Bad()


# --------------------------------------------------------------------------- hooks


def test_hook_count_sees_every_kind_of_module_hook():
    model = MLP(4, 4, 2)
    handles = [
        model.fc1.register_forward_hook(lambda m, i, o: None),
        model.fc1.register_forward_pre_hook(lambda m, i: None),
        model.fc2.register_full_backward_hook(lambda m, gi, go: None),
        model.register_full_backward_pre_hook(lambda m, go: None),
    ]
    assert cm.hook_count(model) == 4
    for h in handles:
        h.remove()
    assert cm.hook_count(model) == 0


def test_format_stats_and_plot_with_and_without_gradients():
    stats = {"fc1": dict(kind="Linear", mean=0.0, std=1.0, zeros=0.0, grad=0.1),
             "relu": dict(kind="ReLU", mean=0.4, std=0.6, zeros=0.5, grad=0.2)}
    assert cm.format_stats(stats).splitlines() == [
        "layer             mean       std   zeros   grad norm",
        "fc1 (Linear)    0.0000    1.0000    0.0%   1.000e-01",
        "relu (ReLU)     0.4000    0.6000   50.0%   2.000e-01",
    ]
    assert len(cm.plot_activation_stats(stats, "t").axes) == 3
    del stats["relu"]["grad"]
    assert "grad" not in cm.format_stats(stats)
    assert len(cm.plot_activation_stats(stats, "t").axes) == 2
    matplotlib.pyplot.close("all")


# --------------------------------------------------------------------------- initialisation


def test_activation_scale_vs_depth_tells_the_known_story():
    kaiming = cm.activation_scale_vs_depth("Kaiming (He)", "relu", depth=12, width=128)
    tiny = cm.activation_scale_vs_depth("normal(0, 0.01)", "relu", depth=12, width=128)
    big = cm.activation_scale_vs_depth("normal(0, 1)", "relu", depth=12, width=128)
    default = cm.activation_scale_vs_depth("PyTorch default", "relu", depth=12, width=128)
    assert len(kaiming) == 12
    assert 0.05 < kaiming[-1] < 2
    assert tiny[-1] < 1e-12 < 1e8 < big[-1]
    assert default[-1] < kaiming[-1] / 10
    saturated = cm.activation_scale_vs_depth("normal(0, 1)", "tanh", depth=5, width=128)
    assert saturated[-1] > 0.9
    # reproducible, and the caller's random stream is untouched
    state = torch.get_rng_state()
    assert cm.activation_scale_vs_depth("Kaiming (He)", "relu", depth=12, width=128) == kaiming
    assert torch.equal(torch.get_rng_state(), state)


def test_init_schemes_speak_the_course_language():
    with speaking("en"):
        assert list(cm.INIT_SCHEMES) == ["PyTorch default", "normal(0, 1)", "normal(0, 0.01)", "Xavier (Glorot)",
                                         "Kaiming (He)"]
    with speaking("zh"):
        names = list(cm.INIT_SCHEMES)
        fig = cm.plot_init_vs_depth({"relu": {names[0]: [1.0, 0.5]}})
    assert names[0] == "PyTorch 默认" and names[1:] == [
        "normal(0, 1)", "normal(0, 0.01)", "Xavier (Glorot)", "Kaiming (He)"]
    assert "relu：PyTorch 默认初始化 5.0e-01" in alt_text(fig)
    assert (cm.activation_scale_vs_depth("PyTorch 默认", "relu", depth=3, width=16)
            == cm.activation_scale_vs_depth("PyTorch default", "relu", depth=3, width=16))
    with pytest.raises(ValueError, match="unknown initialisation scheme"):
        cm.activation_scale_vs_depth("He", "relu", depth=3, width=16)


def test_init_plot_draws_one_line_per_scheme():
    results = {"relu": {s: cm.activation_scale_vs_depth(s, "relu", depth=4, width=16)
                        for s in ("Kaiming (He)", "Xavier (Glorot)")}}
    fig = cm.plot_init_vs_depth(results, width=16)
    (ax,) = fig.axes
    assert len(ax.lines) == 2 and ax.get_yscale() == "log" and ax.get_title() == "4 x [Linear(16, 16) + relu]"
    matplotlib.pyplot.close(fig)


# --------------------------------------------------------------------------- model builder


@pytest.mark.parametrize("norm", cm.NORMS)
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_builder_parameter_count_matches_the_formula(depth, norm):
    model = cm.build_mlp(depth, 32, "gelu", 0.1, norm)
    assert sum(p.numel() for p in model.parameters()) == cm.mlp_param_formula(depth, 32, norm)


def test_build_mlp_layers():
    model = cm.build_mlp(2, 16, "tanh", 0.3, "batchnorm")
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Flatten", "Linear", "BatchNorm1d", "Tanh", "Dropout",
                     "Linear", "BatchNorm1d", "Tanh", "Dropout", "Linear"]
    assert [type(m).__name__ for m in cm.build_mlp(1, 8, "relu", 0.0, "none")] == [
        "Flatten", "Linear", "ReLU", "Linear"]


@pytest.mark.parametrize(("kwargs", "match"),
                         [({"activation": "swish"}, "swish"), ({"norm": "groupnorm"}, "groupnorm")])
def test_builder_rejects_bad_settings_with_a_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cm.build_mlp(**{**cm.BUILDER_DEFAULTS, **kwargs})


def test_model_builder_defaults_are_reproducible_and_leave_rng_alone():
    state = torch.get_rng_state()
    model, stats = cm.model_builder(**cm.BUILDER_DEFAULTS)
    _, again = cm.model_builder(**cm.BUILDER_DEFAULTS)
    assert torch.equal(torch.get_rng_state(), state)
    assert stats == again and model.training
    kinds = [s["kind"] for s in stats.values()]
    assert kinds.count("Dropout") == 3 and "Flatten" not in kinds
    drop = [s for s in stats.values() if s["kind"] == "Dropout"]
    relu = [s for s in stats.values() if s["kind"] == "ReLU"]
    assert all(d["zeros"] > r["zeros"] for d, r in zip(drop, relu, strict=True))  # dropout zeroes more
    assert cm.hook_count(model) == 0


def test_model_builder_normalisation_keeps_the_signal():
    x = torch.rand(64, 1, 28, 28)
    plain = list(cm.model_builder(10, 64, "relu", 0.0, "none", x=x)[1].values())
    normed = list(cm.model_builder(10, 64, "relu", 0.0, "layernorm", x=x)[1].values())
    assert normed[-2]["std"] > 5 * plain[-2]["std"]


def test_show_model_builder_prints_and_shows_one_figure(capsys, monkeypatch):
    shown = []
    monkeypatch.setattr(cm, "show_figure", shown.append)
    cm.show_model_builder(**cm.BUILDER_DEFAULTS)
    out = capsys.readouterr().out
    assert out.startswith("depth=3 width=128 activation=relu dropout=0.20 norm=none\n")
    assert "parameters: 134,794 (matches the formula: 134,794)" in out and "10 (Linear)   [1, 10]" in out
    assert "9 (Dropout)" in out.split("activation statistics")[1]
    assert len(shown) == 1 and len(shown[0].axes) == 2
    matplotlib.pyplot.close("all")


def test_model_builder_widget_builds_and_reacts(monkeypatch):
    pytest.importorskip("ipywidgets")
    shown = []
    monkeypatch.setattr(cm, "show_figure", shown.append)
    box = cm.model_builder_widget(x=torch.rand(16, 1, 28, 28))
    top, _, _ = box.children
    depth = top.children[0]
    assert depth.description == "depth" and depth.value == cm.BUILDER_DEFAULTS["depth"] and len(shown) == 1
    depth.value = 1
    assert len(shown) == 2 and shown[-1].get_suptitle().startswith("1 hidden layers of 128")
    matplotlib.pyplot.close("all")



# --------------------------------------------------------------------------- the Chinese edition


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tables_speak_the_course_language_and_stay_aligned(monkeypatch, lang):
    """Chinese headers take two columns a character: the tables still line up (text_width counts columns)."""
    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    lines = cm.summary(MLP(), torch.zeros(1, 784)).splitlines()
    assert lines[1].split()[0] == ("层（类型）" if zh else "Layer")
    assert lines[3].split() == ["fc1", "(Linear)", "[1,", "256]", "200,960"]
    assert lines[-4] == ("参数总数：203,530" if zh else "Total params: 203,530")
    assert {text_width(line) for line in lines[:7]} == {len(lines[0])}
    stats = {"fc1": dict(kind="Linear", mean=0.0, std=1.0, zeros=0.0, grad=0.1)}
    head, row = cm.format_stats(stats).splitlines()
    assert _has_chinese(head) == zh and text_width(head) == len(row)
    assert row == "fc1 (Linear)    0.0000    1.0000    0.0%   1.000e-01"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_figures_and_the_builder_speak_the_course_language(monkeypatch, capsys, lang):
    pytest.importorskip("ipywidgets")
    monkeypatch.setenv("COURSE_LANG", lang)
    zh = lang == "zh"
    stats = {"fc1": dict(kind="Linear", mean=0.0, std=1.0, zeros=0.0, grad=0.1)}
    axes = cm.plot_activation_stats(stats, "t").axes
    assert axes[0].get_xlabel() == ("层（按前向传播的顺序）" if zh else "layer (in forward order)")
    assert all(_has_chinese(ax.get_title() + ax.get_ylabel()) == zh for ax in axes)
    assert _has_chinese(axes[0].get_legend().texts[1].get_text()) == zh
    fig = cm.plot_init_vs_depth({"relu": {"PyTorch default": [1.0, 0.5], "Kaiming (He)": [1.0, 1.0]}})
    ax = fig.axes[0]
    assert _has_chinese(fig.get_suptitle() + ax.get_xlabel() + ax.get_ylabel()) == zh
    assert [t.get_text() for t in ax.get_legend().texts] == [
        ("PyTorch 默认初始化" if zh else "PyTorch default"), "Kaiming (He)"]
    shown = []
    monkeypatch.setattr(cm, "show_figure", shown.append)
    box = cm.model_builder_widget(x=torch.rand(16, 1, 28, 28))
    controls = [c for row in box.children[:2] for c in row.children]
    assert [c.description for c in controls] == (
        ["深度", "宽度", "激活函数", "dropout", "归一化"] if zh
        else ["depth", "width", "activation", "dropout", "norm"])
    norm = controls[-1]
    assert ([v for _, v in norm.options] == list(cm.NORMS) and norm.value == "none"
            and norm.label == ("无" if zh else "none"))
    assert shown[-1].get_suptitle().startswith("3 个宽度为 128 的隐藏层" if zh else "3 hidden layers of 128")
    out = capsys.readouterr().out
    assert ("参数量：134,794（与公式一致：134,794）" in out) == zh and ("matches the formula" in out) != zh
    assert "depth=3 width=128 activation=relu dropout=0.20 norm=none\n" in out  # the settings: code names
    matplotlib.pyplot.close("all")


# --------------------------------------------------------------------------- exercises


def test_q3_answer_is_the_real_count():
    assert ch02.Q3_ANSWER == sum(p.numel() for p in ch02.q3_architecture().parameters()) == 26_410
    x = torch.zeros(2, 3, 32, 32)
    assert ch02.q3_architecture()(x).shape == (2, 10)


def test_q1_answers_and_the_starting_point():
    assert sum(p.numel() for p in ch02.ListNet().parameters()) == 0
    assert sum(p.numel() for p in ch02.FixedNet().parameters()) == 55_050
    assert ch02.q1.check(ch02.ListNet).status == "incorrect"
    assert ch02.q1.check(ch02.FixedNet).status == "correct"

    class SeqNet(nn.Module):  # another correct answer: nn.Sequential with named layers
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(OrderedDict(a=nn.Linear(784, 64), r=nn.ReLU(), b=nn.Linear(64, 64),
                                                  r2=nn.ReLU(), c=nn.Linear(64, 10)))

        def forward(self, x):
            return self.body(x.flatten(1))

    assert ch02.q1.check(SeqNet).status == "correct"
    assert ch02.q1.check(ch02.FixedNet()).status == "incorrect"  # an instance, not the class


def test_checks_leave_the_learners_random_stream_alone():
    state = torch.get_rng_state()
    for q in ch02.EXERCISES:
        q.check(q.reference())
    assert torch.equal(torch.get_rng_state(), state)
