import random

import numpy as np
import pytest
import torch

from course_utils import device as D
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


def test_one_main_thread():
    assert D.cpu_cores() >= 1
    before = torch.get_num_threads()
    with D.one_main_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_cpu_load_line(monkeypatch):
    monkeypatch.setattr(D.os, "getloadavg", lambda: (0.1, 0.0, 0.0), raising=False)
    monkeypatch.setattr(D, "cpu_cores", lambda: 2)
    assert D.cpu_load() == "load average 0.1 on 2 cores"
    monkeypatch.setattr(D.os, "getloadavg", lambda: (1.9, 0.0, 0.0), raising=False)
    assert "busy" not in D.cpu_load() and D.load_average() == 1.9  # busy means more than the cores
    monkeypatch.setattr(D.os, "getloadavg", lambda: (5.0, 0.0, 0.0), raising=False)
    assert "busy" in D.cpu_load()
    assert D.busy_warning(5.0, 2).startswith("WARNING: this machine is busy: load average 5.0 on 2 cores")
    assert D.busy_warning(2.0, 2) == D.busy_warning(None, 2) == ""


def test_what_a_learner_reads_is_in_the_courses_language(monkeypatch):
    monkeypatch.setattr(D.os, "getloadavg", lambda: (5.0, 0.0, 0.0), raising=False)
    monkeypatch.setattr(D, "cpu_cores", lambda: 2)
    monkeypatch.setenv("COURSE_LANG", "en")
    assert describe(torch.device("cpu")) == "device: cpu"
    assert D.cpu_load().startswith("load average 5.0 on 2 cores (busy")
    monkeypatch.setenv("COURSE_LANG", "zh")
    assert describe(torch.device("cpu")) == "设备：cpu"
    assert D.cpu_load().startswith("负载均值 5.0（繁忙")  # the cores are printed beside it, once
    assert D.busy_warning(5.0, 2).startswith("警告：这台机器正忙：负载均值 5.0")
