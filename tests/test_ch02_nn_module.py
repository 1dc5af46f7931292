"""Unit tests for course_utils.ch02_nn_module (chapter 02) and the chapter's exercises."""

import warnings
from collections import OrderedDict

import matplotlib
import pytest
import torch
from torch import nn

from course_utils import ch02_nn_module as cm
from course_utils.exercises import ch02

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


# --------------------------------------------------------------------------- counting and summary


def test_counts_match_the_source_and_the_formulas():
    model = MLP()
    assert cm.count_parameters(model) == 203_530
    assert cm.linear_params(784, 256) + cm.linear_params(256, 10) == 203_530
    assert cm.linear_params(3, 4, bias=False) == 12
    assert cm.conv2d_params(3, 16, 5) == sum(p.numel() for p in nn.Conv2d(3, 16, 5).parameters())
    assert cm.conv2d_params(8, 16, (3, 1), bias=False, groups=2) == nn.Conv2d(8, 16, (3, 1), groups=2, bias=False).weight.numel()
    with pytest.raises(ValueError, match="groups"):
        cm.conv2d_params(3, 16, 3, groups=2)


def test_count_trainable_only_and_shared_weights_once():
    lin = nn.Linear(4, 4)
    shared = nn.Sequential(lin, nn.ReLU(), lin)
    assert cm.count_parameters(shared) == 20
    lin.bias.requires_grad_(False)
    assert cm.count_parameters(shared) == 16
    assert cm.count_parameters(shared, trainable_only=False) == 20


def test_summary_of_the_mlp():
    model = MLP()
    rows = cm.summarize(model, torch.zeros(1, 784))
    assert [(r.name, r.kind, r.output_shape, r.params) for r in rows] == [
        ("fc1", "Linear", (1, 256), 200_960),
        ("relu", "ReLU", (1, 256), 0),
        ("fc2", "Linear", (1, 10), 2_570),
    ]
    text = cm.summary(model, torch.zeros(1, 784))
    assert "Total params: 203,530" in text and "Non-trainable params: 0" in text
    assert cm.hook_count(model) == 0


def test_summary_of_a_cnn_keeps_mode_and_running_stats():
    cnn = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 14 * 14, 10),
    )
    cnn.train()
    before = cnn[1].running_mean.clone()
    rows = cm.summarize(cnn, torch.rand(1, 1, 28, 28))
    assert cnn.training and torch.equal(cnn[1].running_mean, before)
    assert [r.output_shape for r in rows] == [(1, 8, 28, 28), (1, 8, 28, 28), (1, 8, 28, 28), (1, 8, 14, 14), (1, 1568), (1, 10)]
    assert sum(r.params for r in rows) == cm.count_parameters(cnn) == 80 + 16 + 15_690
    assert cm.hook_count(cnn) == 0


def test_summary_lists_a_module_with_its_own_parameters_and_children():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.gain = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.lin(x) * self.gain

    rows = cm.summarize(nn.Sequential(Scaled()), torch.zeros(2, 3))
    assert {r.name: r.params for r in rows} == {"0.lin": 12, "0": 3}


def test_format_summary_without_model_sums_rows():
    rows = [cm.SummaryRow("a", "Linear", (1, 2), 6, 4)]
    text = cm.format_summary(rows)
    assert "Total params: 6" in text and "Trainable params: 4" in text and "Non-trainable params: 2" in text


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
    assert len(list(mini.children())) == 3


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
    assert list(m.state_dict()) == ["running"] and list(m.children()) == []
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
    assert "MiniLinear" in repr(m)


def test_mini_module_needs_super_init():
    class Bad(cm.MiniModule):
        def __init__(self):
            self.x = 1

    with pytest.raises(AttributeError, match="super"):
        Bad()


# --------------------------------------------------------------------------- hooks


def test_activation_recorder_records_and_removes():
    torch.manual_seed(0)
    model = MLP(8, 16, 3)
    x = torch.randn(32, 8)
    with cm.ActivationRecorder(model, backward=True) as rec:
        assert cm.hook_count(model) == 3
        loss = model(x).pow(2).mean()
        loss.backward()
    assert cm.hook_count(model) == 0
    names = [s.name for s in rec.stats]
    assert names == ["fc1", "relu", "fc2"]
    relu = rec.stats[1]
    h = torch.relu(model.fc1(x)).detach()
    assert relu.mean == pytest.approx(h.mean().item(), rel=1e-5)
    assert relu.std == pytest.approx(h.std().item(), rel=1e-5)
    assert relu.frac_zero == pytest.approx((h == 0).float().mean().item())
    out = model(x).detach()
    assert rec.stats[2].grad_norm == pytest.approx((2 * out / out.numel()).norm().item(), rel=1e-5)
    assert all(s.grad_norm is not None for s in rec.stats)
    assert "grad norm" in cm.format_stats(rec.stats)


def test_first_layer_full_backward_hook_fires_with_none_but_the_recorder_does_not_warn():
    """What chapter 02 teaches: when no input needs a gradient, a full backward hook on the first
    layer still fires, with grad_input all None and a UserWarning; the recorder's tensor hook sees
    the same d loss / d output, without a warning."""
    torch.manual_seed(0)
    model = MLP(8, 16, 3)
    x = torch.randn(32, 8)  # like a batch of images: requires_grad is False
    calls = []
    handle = model.fc1.register_full_backward_hook(lambda m, gi, go: calls.append((gi, go[0].norm().item())))
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        model(x).pow(2).mean().backward()
    handle.remove()
    assert len(calls) == 1 and calls[0][0] == (None,)
    model.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cm.ActivationRecorder(model, backward=True) as rec:
            model(x).pow(2).mean().backward()
    assert rec.stats[0].name == "fc1"
    assert rec.stats[0].grad_norm == pytest.approx(calls[0][1], rel=1e-6)


def test_activation_stats_types_filter_and_no_grad():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    stats = cm.activation_stats(model, torch.rand(5, 2, 2), types=(nn.ReLU,))
    assert [s.kind for s in stats] == ["ReLU"]
    stats = cm.activation_stats(model, torch.rand(5, 2, 2))
    assert [s.name for s in stats] == ["1", "2", "3"]  # Flatten is skipped
    assert all(s.grad_norm is None for s in stats)
    assert cm.format_stats([]) == "(no layer ran)"
    assert cm.hook_count(model) == 0


def test_recorder_removes_hooks_even_on_error():
    model = MLP(4, 4, 2)
    with pytest.raises(RuntimeError), cm.ActivationRecorder(model):
        model(torch.zeros(1, 5))  # wrong input size
    assert cm.hook_count(model) == 0


# --------------------------------------------------------------------------- initialisation


def test_init_schemes_set_the_expected_scale():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(400, 400), nn.ReLU(), nn.Linear(400, 400))
    cm.init_linear_(net, "Kaiming (He)")
    assert net[0].weight.std().item() == pytest.approx((2 / 400) ** 0.5, rel=0.02)
    assert torch.count_nonzero(net[0].bias) == 0
    cm.init_linear_(net, "normal(0, 0.01)")
    assert net[2].weight.std().item() == pytest.approx(0.01, rel=0.02)
    with pytest.raises(ValueError, match="unknown initialisation"):
        cm.init_linear_(net, "ones")


def test_activation_scale_vs_depth_tells_the_known_story():
    kaiming = cm.activation_scale_vs_depth("Kaiming (He)", "relu", depth=12, width=128)
    tiny = cm.activation_scale_vs_depth("normal(0, 0.01)", "relu", depth=12, width=128)
    big = cm.activation_scale_vs_depth("normal(0, 1)", "relu", depth=12, width=128)
    assert len(kaiming) == 12
    assert 0.05 < kaiming[-1] < 2
    assert tiny[-1] < 1e-12 < 1e8 < big[-1]
    saturated = cm.activation_scale_vs_depth("normal(0, 1)", "tanh", depth=5, width=128)
    assert saturated[-1] > 0.9
    # reproducible, and the caller's random stream is untouched
    state = torch.get_rng_state()
    assert cm.activation_scale_vs_depth("Kaiming (He)", "relu", depth=12, width=128) == kaiming
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="unknown activation"):
        cm.activation_scale_vs_depth("Kaiming (He)", "swish")


def test_init_plot_draws_one_line_per_scheme():
    results = cm.init_depth_results(["Kaiming (He)", "Xavier (Glorot)"], ("relu",), depth=4, width=16)
    fig = cm.plot_init_vs_depth(results, width=16)
    (ax,) = fig.axes
    assert len(ax.lines) == 2 and ax.get_yscale() == "log" and ax.get_title()
    matplotlib.pyplot.close(fig)


# --------------------------------------------------------------------------- model builder


@pytest.mark.parametrize("norm", cm.NORMS)
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_builder_parameter_count_matches_the_formula(depth, norm):
    model = cm.build_mlp(depth, 32, "gelu", 0.1, norm)
    assert cm.count_parameters(model) == cm.mlp_param_formula(depth, 32, norm)


def test_build_mlp_layers():
    model = cm.build_mlp(2, 16, "tanh", 0.3, "batchnorm")
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Flatten", "Linear", "BatchNorm1d", "Tanh", "Dropout",
                     "Linear", "BatchNorm1d", "Tanh", "Dropout", "Linear"]
    assert [type(m).__name__ for m in cm.build_mlp(1, 8, "relu", 0.0, "none")] == ["Flatten", "Linear", "ReLU", "Linear"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"depth": -1}, "depth"),
        ({"width": 0}, "width"),
        ({"activation": "swish"}, "activation"),
        ({"dropout": 1.0}, "dropout"),
        ({"norm": "groupnorm"}, "norm"),
    ],
)
def test_builder_rejects_bad_settings_with_a_message(kwargs, match):
    args = {**cm.BUILDER_DEFAULTS, **kwargs}
    with pytest.raises(ValueError, match=match):
        cm.build_mlp(**args)


def test_model_builder_defaults_are_reproducible_and_leave_rng_alone():
    state = torch.get_rng_state()
    a = cm.model_builder()
    b = cm.model_builder()
    assert torch.equal(torch.get_rng_state(), state)
    assert a.n_params == a.formula == 134_794
    assert [s.std for s in a.stats] == [s.std for s in b.stats]
    assert a.rows[1].params == 100_480 and a.rows[-1].output_shape == (1, 10)
    kinds = [s.kind for s in a.stats]
    assert kinds.count("Dropout") == 3 and "Flatten" not in kinds
    drop = [s for s in a.stats if s.kind == "Dropout"]
    relu = [s for s in a.stats if s.kind == "ReLU"]
    assert all(d.frac_zero > r.frac_zero for d, r in zip(drop, relu, strict=True))  # dropout zeroes more
    text = cm.format_builder(a)
    assert "parameters: 134,794 (matches the formula: 134,794)" in text
    assert cm.hook_count(a.model) == 0


def test_model_builder_normalisation_keeps_the_signal():
    x = torch.rand(64, 1, 28, 28)
    plain = cm.model_builder(10, 64, "relu", 0.0, "none", x=x)
    normed = cm.model_builder(10, 64, "relu", 0.0, "layernorm", x=x)
    assert normed.stats[-2].std > 5 * plain.stats[-2].std
    with pytest.raises(ValueError, match="batch of at least 2"):
        cm.model_builder(2, 8, "relu", 0.0, "batchnorm", x=torch.rand(1, 1, 28, 28))


def test_show_model_builder_prints_and_plots(capsys):
    res = cm.show_model_builder(depth=1, width=16, activation="sigmoid", dropout=0.0, norm="batchnorm")
    out = capsys.readouterr().out
    assert "depth=1 width=16 activation=sigmoid dropout=0.00 norm=batchnorm" in out
    assert f"{res.n_params:,}" in out and "BatchNorm1d" in out
    matplotlib.pyplot.close("all")


def test_model_builder_widget_builds_and_reacts():
    pytest.importorskip("ipywidgets")
    box = cm.model_builder_widget(x=torch.rand(16, 1, 28, 28))
    top, bottom, out = box.children
    depth = top.children[0]
    assert depth.value == cm.BUILDER_DEFAULTS["depth"]
    depth.value = 1  # triggers a redraw without error
    assert out is not None
    matplotlib.pyplot.close("all")


def test_plot_activation_stats_panels():
    stats = [cm.LayerStats("fc1", "Linear", 0.0, 1.0, 0.0, 0.1), cm.LayerStats("relu", "ReLU", 0.4, 0.6, 0.5, 0.2)]
    fig = cm.plot_activation_stats(stats)
    assert len(fig.axes) == 3
    fig2 = cm.plot_activation_stats([cm.LayerStats("fc1", "Linear", 0.0, 1.0, 0.0)])
    assert len(fig2.axes) == 2
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
