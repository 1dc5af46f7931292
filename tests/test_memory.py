"""course_utils.memory: what autograd keeps alive for backward, counted (chapters 01 and 06)."""

from __future__ import annotations

import pytest
import torch

from course_utils import memory as MEM


def two_layers(x, w1, w2, detach_first=False):
    if detach_first:
        w1 = w1.detach()
    h = torch.relu(x @ w1)
    return ((h @ w2) ** 2).mean()


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return torch.randn(64, 784), torch.randn(784, 256, requires_grad=True), torch.randn(256, 10, requires_grad=True)


def test_saved_bytes_in_each_mode(mlp):
    x, w1, w2 = mlp
    with MEM.count_saved_tensors() as normal:
        out = two_layers(x, w1, w2)
    assert out.requires_grad
    # x (for dL/dw1), relu's output (saved twice: by relu and by the second matmul), w2, the matmul output
    assert normal.count == 5
    assert normal.bytes == 4 * (64 * 784 + 64 * 256 + 256 * 10 + 64 * 10) == 279_040
    # without `held`, nothing is known to live anyway: every saved byte counts as extra
    assert (normal.held_bytes, normal.extra_bytes) == (0, normal.bytes)
    for ctx in (torch.no_grad, torch.inference_mode):
        with MEM.count_saved_tensors() as log, ctx():
            out = two_layers(x, w1, w2)
        assert (log.count, log.bytes) == (0, 0) and not out.requires_grad
    with MEM.count_saved_tensors() as frozen:
        two_layers(x, w1, w2, detach_first=True)
    assert frozen.bytes == 4 * (64 * 256 + 64 * 10)


def test_held_tensors_are_split_from_activations(mlp):
    """x and w2 are saved by reference and live anyway; only h and the output cost extra memory."""
    x, w1, w2 = mlp
    with MEM.count_saved_tensors(held=(x, w1, w2)) as normal:
        two_layers(x, w1, w2)
    with MEM.count_saved_tensors(held=(x, w1, w2)) as frozen:
        two_layers(x, w1, w2, detach_first=True)  # w1.detach() shares w1's memory
    assert normal.held_bytes == 4 * (64 * 784 + 256 * 10)
    assert sorted(normal.held_shapes) == [(64, 784), (256, 10)]
    assert sorted(normal.extra_shapes) == [(64, 10), (64, 256)]
    # freezing the first layer of two drops the references to x and w2, but keeps h: no saving
    assert frozen.held_bytes == 0
    assert normal.extra_bytes == frozen.extra_bytes == 4 * (64 * 256 + 64 * 10)
    # a view or a detach() of a held tensor counts as held too
    with MEM.count_saved_tensors(held=(x,)) as log:
        (x.t().contiguous().t() @ w1).sum()  # a copy: not held
        (x[:10] @ w1).sum()                  # a view of x: held
    assert log.held_shapes == [(10, 784)]


def test_freezing_the_first_layers_saves_activations():
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    ws = [torch.randn(16, 16, requires_grad=True) for _ in range(3)]

    def three_layers(w1, w2, w3):
        h1 = torch.relu(x @ w1)
        h2 = torch.relu(h1 @ w2)
        return ((h2 @ w3) ** 2).mean()

    def extra(*weights):
        with MEM.count_saved_tensors(held=(x, *ws)) as log:
            three_layers(*weights)
        return log.extra_bytes

    w1, w2, w3 = ws
    act = 8 * 16 * 4
    assert extra(w1, w2, w3) == 3 * act                      # h1, h2, the last matmul's output
    assert extra(w1.detach(), w2, w3) == 3 * act             # frozen first layer: h1 still needed
    assert extra(w1, w2.detach(), w3) == 3 * act             # frozen middle: relu keeps h1 for w1
    assert extra(w1.detach(), w2.detach(), w3) == 2 * act    # frozen first two: h1 is not kept


def test_format_bytes():
    assert MEM.format_bytes(512) == "512 B"
    assert MEM.format_bytes(279_040) == "272.5 KiB"
    assert MEM.format_bytes(3 * 1024**3) == "3.0 GiB"
