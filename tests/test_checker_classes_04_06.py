"""Classes of wrong verdicts in the checks of chapters 04-06, one test each (each failed on the checker
before its fix): a reference that shared the learner's random stream (06 Q1), a crash simulated by
patching one name instead of judging the file on disk after a crash at any point (05 Q4), an answer
judged by its form instead of what the training loop does with it (05 Q2), and the learner's session
restored by the check before it was judged (06 Q3), and an all_gather of the whole tensor, summed on
each rank, passed off as the two-step all-reduce (04 Q2)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch import save as bound_before_the_check  # a name that patching torch.save cannot reach

from course_utils.exercises import ch04, ch05, ch06

# ------------------------------------------------------------------ 06 Q1: a reference with its own generator


class XavierNet(nn.Module):
    """Correct: both layers registered, initialised with xavier_uniform_ (other draws than nn.Linear's)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 32), nn.Linear(32, 10)
        for layer in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(layer.weight)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class HandMadeNet(nn.Module):
    """Correct: the two layers written as parameters by hand, in nn.Linear's order and shapes."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(32, 784) * 0.01)
        self.b1 = nn.Parameter(torch.zeros(32))
        self.w2 = nn.Parameter(torch.randn(10, 32) * 0.1)
        self.b2 = nn.Parameter(torch.zeros(10))

    def forward(self, x):
        return torch.relu(x @ self.w1.T + self.b1) @ self.w2.T + self.b2


@pytest.mark.parametrize("net", [XavierNet, HandMadeNet])
def test_a_model_that_initialises_itself_is_judged_with_the_references_weights(net):
    result = ch06.q1.check(net)
    assert result.correct, result


# ------------------------------------------------------------------ 05 Q4: the file on disk after a crash at any point


def save_with_a_name_bound_earlier(obj, path):
    """Crash-safe: the temporary file is written with a `save` bound before any check could patch torch."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        bound_before_the_check(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def copy_over(obj, path):
    """Not crash-safe: the copy rewrites the checkpoint in place (a crash during it leaves half a file)."""
    tmp = tempfile.NamedTemporaryFile(dir=Path(path).parent, delete=False)
    with tmp:
        torch.save(obj, tmp)
    shutil.copyfile(tmp.name, path)
    os.remove(tmp.name)


def delete_then_rename(obj, path):
    """Not crash-safe: between the delete and the rename there is no checkpoint at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".new")
    torch.save(obj, tmp)
    if path.exists():
        os.remove(path)
    os.rename(tmp, path)


def torch_save_bound_earlier(obj, path):
    """Not crash-safe (it writes over the checkpoint), whatever name torch.save goes by."""
    bound_before_the_check(obj, path)


def test_a_crash_safe_save_is_correct_whatever_name_torch_save_goes_by():
    result = ch05.q4.check(save_with_a_name_bound_earlier)
    assert result.correct, result


@pytest.mark.parametrize("answer", [copy_over, delete_then_rename, torch_save_bound_earlier])
def test_a_save_that_loses_the_checkpoint_at_some_crash_point_is_refused(answer):
    result = ch05.q4.check(answer)
    assert result.status == "incorrect", result
    assert "corrupt" in result.message or "no checkpoint" in result.message or "deleted" in result.message, result


# ------------------------------------------------------------------ 05 Q2: what the training loop does with the answer


def resume_returning_a_float(ckpt, model, optimizer, scheduler):
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    return float(ckpt["epoch"])  # range(start, epochs) refuses a float


def test_a_start_epoch_that_range_refuses_is_refused():
    result = ch05.q2.check(resume_returning_a_float)
    assert result.status == "incorrect" and "range(" in result.message, result


# ------------------------------------------------------------------ 06 Q3: the learner's session after the call


def evaluate_leaving_grad_off(model, x, y):
    model.eval()
    torch.set_grad_enabled(False)  # switched off for the rest of the session
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def evaluate_forcing_train_mode(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()  # even when the model was in eval mode before
    return acc


@pytest.mark.parametrize("answer", [evaluate_leaving_grad_off, evaluate_forcing_train_mode])
def test_an_evaluate_that_leaves_the_session_changed_is_refused(answer):
    before = torch.is_grad_enabled()
    result = ch06.q3.check(answer)
    assert torch.is_grad_enabled() == before
    assert result.status == "incorrect", result


# --------------------------------------------------- 04 Q2: the sums, but not by reduce-scatter then all-gather


def gather_then_sum(t):
    """Wrong: every rank gathers every rank's whole tensor and sums locally (world x the traffic); the
    reduce_scatter is called only for show."""
    world = dist.get_world_size()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    mine = torch.empty_like(t.chunk(world)[0])
    dist.reduce_scatter(mine, list(t.chunk(world)))
    return torch.stack(parts).sum(0)


def tensor_forms(t):
    """Correct: the same two steps with the single-tensor collectives."""
    world = dist.get_world_size()
    mine = torch.empty(t.numel() // world, dtype=t.dtype)
    dist.reduce_scatter_tensor(mine, t)
    out = torch.empty_like(t)
    dist.all_gather_into_tensor(out, mine)
    return out


def async_form(t):
    """Correct: the list collectives, asynchronous, each waited for."""
    world = dist.get_world_size()
    chunks = list(t.chunk(world))
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks, async_op=True).wait()
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, async_op=True).wait()
    return torch.cat(parts)


@pytest.mark.slow
def test_an_all_gather_of_the_whole_tensor_is_not_the_two_step_all_reduce():
    result = ch04.q2.check(gather_then_sum)
    assert result.status == "incorrect" and "all_gather" in result.message, result
    for answer in (tensor_forms, async_form):
        result = ch04.q2.check(answer)
        assert result.correct, result
