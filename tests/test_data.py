import itertools
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler

from course_utils import data
from course_utils.data import sampler_indices


def test_committed_files_match_the_manifest():
    assert data.verify() == []
    manifest = json.loads((data.DIGITS / data.MANIFEST).read_text())
    assert manifest["counts"] == {"train": 1438, "test": 359}
    assert len(manifest["files"]) == 1797


def test_build_is_reproducible(tmp_path):
    """Rebuilding from scikit-learn's bundled scans gives the same pixels as the committed files."""
    built = data.build(tmp_path)
    committed = json.loads((data.DIGITS / data.MANIFEST).read_text())
    assert built["files"] == committed["files"]
    assert data.verify(tmp_path) == []


def test_an_altered_pixel_is_detected(tmp_path):
    root = tmp_path / "digits"
    shutil.copytree(data.DIGITS, root)
    victim = sorted(root.glob("train/3/*.png"))[0]
    pixels = np.asarray(Image.open(victim)).copy()
    pixels[14, 14] ^= 0xFF
    Image.fromarray(pixels).save(victim)
    (root / "test" / "7" / "9999.png").write_bytes(victim.read_bytes())
    problems = data.verify(root)
    assert f"altered: train/3/{victim.name}" in problems
    assert "not in the manifest: test/7/9999.png" in problems
    (root / data.MANIFEST).unlink()
    assert "MANIFEST.json is missing" in data.verify(root)[0]


def test_paths_labels_and_images():
    paths, labels = data.image_paths("test")
    assert len(paths) == len(labels) == 359
    assert sorted(set(labels)) == list(range(10))
    assert all(int(p.parent.name) == y for p, y in zip(paths, labels, strict=True))
    img = data.load_image(paths[0])
    assert img.mode == "L" and img.size == (28, 28)
    # digits are centred: the 4-pixel frame is empty, the middle has ink
    arr = np.asarray(img)
    assert arr[:4].max() == 0 and arr[-4:].max() == 0 and arr[8:20, 8:20].max() > 128


def test_ready_made_datasets():
    x, y = data.digits_tensors("train")
    assert x.shape == (1438, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0.0 <= x.min() and x.max() <= 1.0
    x[0] += 1  # callers get their own copy
    assert data.digits_tensors("train")[0].max() <= 1.0
    folder = data.digits_folder("test")
    assert folder.classes == data.CLASSES and len(folder) == 359
    ds = data.digits_dataset("test")
    assert len(ds) == 359 and ds[0][0].shape == (1, 28, 28)


def test_bad_split_is_explained():
    with pytest.raises(ValueError, match="'train' or 'test'"):
        data.image_paths("validation")


def test_cli_verify(capsys):
    assert data.main(["verify"]) == 0
    assert "data OK" in capsys.readouterr().out


# ----------------------------------------------------------------- what DistributedSampler gives each rank


def real(n, world, epoch, shuffle, seed, drop_last):
    out = []
    for r in range(world):
        s = DistributedSampler(list(range(n)), num_replicas=world, rank=r, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize(("shuffle", "drop_last"), list(itertools.product([True, False], [True, False])))
def test_sampler_indices_match_torch(shuffle, drop_last):
    for n, world, epoch, seed in itertools.product([1, 2, 3, 7, 10, 12, 13], [1, 2, 3, 4, 8], [0, 1, 5], [0, 3]):
        if drop_last and n < world:
            continue  # torch's sampler then yields nothing on every rank; so do we (checked below)
        assert (sampler_indices(n, world, epoch, shuffle, seed, drop_last)
                == real(n, world, epoch, shuffle, seed, drop_last)), (n, world, epoch, shuffle, seed, drop_last)


def test_sampler_indices_tiny_data_with_drop_last_matches_torch():
    assert sampler_indices(3, 4, drop_last=True) == real(3, 4, 0, True, 0, True) == [[], [], [], []]


def test_padding_wraps_round_when_world_is_bigger_than_data():
    assert sampler_indices(2, 5, shuffle=False) == real(2, 5, 0, False, 0, False) == [[0], [1], [0], [1], [0]]


def test_sampler_indices_partition_the_data():
    shares = sampler_indices(12, 3, epoch=4)
    flat = sorted(i for s in shares for i in s)
    assert flat == list(range(12))
    assert sampler_indices(12, 3, epoch=4) != sampler_indices(12, 3, epoch=5)


@pytest.mark.parametrize("bad", [{"n": 0}, {"world_size": 0}, {"epoch": -1}])
def test_sampler_indices_refuses_nonsense(bad):
    kw = {"n": 10, "world_size": 2, "epoch": 0} | bad
    with pytest.raises(ValueError):
        sampler_indices(**kw)


def test_problems_are_explained_in_the_courses_language(tmp_path, monkeypatch, capsys):
    root = tmp_path / "digits"
    root.mkdir()
    monkeypatch.setenv("COURSE_LANG", "en")
    assert data.verify(root) == [f"MANIFEST.json is missing in {root}: run `python -m course_utils.data build`"]
    monkeypatch.setenv("COURSE_LANG", "zh")
    assert data.verify(root) == [f"{root} 中缺少 MANIFEST.json：请运行 `python -m course_utils.data build`"]
    assert data.main(["verify"]) == 0
    assert "数据完好" in capsys.readouterr().out
