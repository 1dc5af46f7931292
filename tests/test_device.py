import random

import numpy as np
import pytest
import torch

from course_utils.device import describe, pick_device, seed_everything


def test_cpu_when_no_gpu(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")
    assert describe(torch.device("cpu")) == "device: cpu"


def test_cuda_preferred_when_present(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda")


def test_environment_override(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cpu")


def test_override_to_a_missing_device_is_explained(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="sees no CUDA GPU"):
        pick_device()
    monkeypatch.setenv("COURSE_DEVICE", "tpu")
    with pytest.raises(ValueError, match="not a device this course knows"):
        pick_device()


def test_seed_everything_repeats_every_generator():
    def draw():
        return random.random(), np.random.rand(), torch.rand(1).item()

    seed_everything(123)
    a = draw()
    seed_everything(123)
    assert draw() == a
    with pytest.raises(ValueError):
        seed_everything(-1)
