"""The course's data: handwritten digits as 28x28 PNG files in an ImageFolder layout, and what every
chapter that loads them shares (what ``DistributedSampler`` gives each rank, a worker's own seed).

Source: the 1,797 8x8 scans of handwritten digits that scikit-learn ships inside
its wheel (`sklearn.datasets.load_digits`, from the UCI "Optical Recognition of
Handwritten Digits" set), upsampled to 20x20 and centred in 28x28 like MNIST so
that the source chapter's ``MLP(784, 256, 10)`` applies as written.

    python -m course_utils.data build     # (re)write data/digits/ and its manifest
    python -m course_utils.data verify    # check every file against the manifest

Layout: ``data/digits/{train,test}/<class>/<index>.png`` plus ``MANIFEST.json``
(SHA-256 of each image's decoded pixels, so a re-encoded but identical PNG still
verifies, and an altered pixel does not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import get_worker_info

from . import ROOT
from .i18n import tr

DATA_DIR = Path(os.environ.get("COURSE_DATA", ROOT / "data"))
DIGITS = DATA_DIR / "digits"
MANIFEST = "MANIFEST.json"
CLASSES = [str(i) for i in range(10)]
SPLITS = ("train", "test")
TEST_FRACTION = 0.2
SEED = 0
SIZE = 28
INNER = 20  # the digit itself; 4 pixels of margin on every side, as in MNIST


def _resize_bilinear(img: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of a 2-D float array (half-pixel centres), in plain NumPy: same pixels everywhere."""
    h, w = img.shape

    def coords(n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = (np.arange(size) + 0.5) * n_in / size - 0.5
        src = np.clip(src, 0, n_in - 1)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, src - lo

    y0, y1, fy = coords(h)
    x0, x1, fx = coords(w)
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


def _to_28x28(scan: np.ndarray) -> np.ndarray:
    """One 8x8 scan (values 0..16) to a 28x28 uint8 image (0 = background, 255 = ink)."""
    inner = _resize_bilinear(scan.astype(np.float64) / 16.0, INNER)
    out = np.zeros((SIZE, SIZE), dtype=np.float64)
    m = (SIZE - INNER) // 2
    out[m : m + INNER, m : m + INNER] = inner
    return np.rint(np.clip(out, 0, 1) * 255).astype(np.uint8)


def _split_indices(targets: np.ndarray) -> dict[str, list[int]]:
    """A fixed, stratified train/test split: 20% of each class to test, chosen by a seeded RandomState."""
    rng = np.random.RandomState(SEED)  # RandomState's stream is frozen by NumPy's policy
    split: dict[str, list[int]] = {"train": [], "test": []}
    for c in range(10):
        idx = np.flatnonzero(targets == c)
        perm = rng.permutation(idx)
        n_test = int(round(TEST_FRACTION * len(idx)))
        split["test"] += sorted(int(i) for i in perm[:n_test])
        split["train"] += sorted(int(i) for i in perm[n_test:])
    return {k: sorted(v) for k, v in split.items()}


def pixel_digest(pixels: np.ndarray) -> str:
    """SHA-256 of an image's decoded pixels (with its shape), independent of PNG encoding."""
    h = hashlib.sha256(str(pixels.shape).encode())
    h.update(np.ascontiguousarray(pixels, dtype=np.uint8).tobytes())
    return h.hexdigest()


def build(out_dir: Path | str = DIGITS) -> dict:
    """Write the PNG files and MANIFEST.json under `out_dir`; returns the manifest. Reproducible."""
    from sklearn.datasets import load_digits  # imported here: only the build needs scikit-learn

    out = Path(out_dir)
    bunch = load_digits()
    images, targets = bunch.images, bunch.target
    files: dict[str, str] = {}
    for split, indices in _split_indices(targets).items():
        for i in indices:
            rel = f"{split}/{int(targets[i])}/{i:04d}.png"
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pixels = _to_28x28(images[i])
            Image.fromarray(pixels, mode="L").save(path, optimize=False)
            files[rel] = pixel_digest(pixels)
    manifest = {
        "name": "digits",
        "source": "scikit-learn sklearn.datasets.load_digits (UCI Optical Recognition of Handwritten Digits)",
        "licence": "CC BY 4.0 (UCI Machine Learning Repository); scikit-learn itself is BSD-3-Clause",
        "size": [SIZE, SIZE],
        "split": {"seed": SEED, "test_fraction": TEST_FRACTION},
        "counts": {s: sum(1 for k in files if k.startswith(s + "/")) for s in SPLITS},
        "files": dict(sorted(files.items())),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify(root: Path | str = DIGITS) -> list[str]:
    """Check every file against the manifest. Returns a list of problems (empty when intact)."""
    root = Path(root)
    mf = root / MANIFEST
    if not mf.exists():
        return [tr("{name} is missing in {root}: run `python -m course_utils.data build`",
                   "{root} 中缺少 {name}：请运行 `python -m course_utils.data build`", name=mf.name, root=root)]
    manifest = json.loads(mf.read_text())
    problems = []
    for rel, digest in manifest["files"].items():
        path = root / rel
        if not path.exists():
            problems.append(tr("missing: {rel}", "缺失：{rel}", rel=rel))
            continue
        try:
            pixels = np.asarray(Image.open(path).convert("L"))
        except Exception as exc:  # unreadable file
            problems.append(tr("unreadable: {rel} ({exc})", "无法读取：{rel}（{exc}）", rel=rel, exc=exc))
            continue
        if pixel_digest(pixels) != digest:
            problems.append(tr("altered: {rel}", "已被改动：{rel}", rel=rel))
    extra = {p.relative_to(root).as_posix() for p in root.rglob("*.png")} - set(manifest["files"])
    problems += [tr("not in the manifest: {rel}", "不在清单（manifest）中：{rel}", rel=rel) for rel in sorted(extra)]
    return problems


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    if not (DIGITS / split).is_dir():
        raise FileNotFoundError(tr(
            "The course data is missing ({value} does not exist). Run `python -m course_utils.data build` from the "
            "course folder.",
            "课程数据缺失（{value} 不存在）。请在课程文件夹中运行 `python -m course_utils.data build`。",
            value=DIGITS / split
        ))


def image_paths(split: str = "train") -> tuple[list[Path], list[int]]:
    """Paths of the PNG files of a split, and their integer labels, in a fixed order."""
    _check_split(split)
    paths = sorted((DIGITS / split).glob("*/*.png"))
    return paths, [int(p.parent.name) for p in paths]


def load_image(path: Path | str) -> Image.Image:
    """Open one image file as a grayscale PIL image (the source chapter's ``load_image``)."""
    with Image.open(path) as im:
        return im.convert("L")


def digits_folder(split: str = "train", transform: Callable | None = None):
    """The split as a ``torchvision.datasets.ImageFolder`` (grayscale images)."""
    from torchvision.datasets import ImageFolder

    _check_split(split)
    return ImageFolder(str(DIGITS / split), transform=transform, loader=load_image)


@lru_cache(maxsize=4)
def _tensors(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    paths, labels = image_paths(split)
    x = np.stack([np.asarray(load_image(p)) for p in paths]).astype(np.float32) / 255.0
    return torch.from_numpy(x).unsqueeze(1), torch.tensor(labels, dtype=torch.int64)


def digits_tensors(split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split in memory: images as float32 ``[N, 1, 28, 28]`` in [0, 1], labels int64 ``[N]``."""
    x, y = _tensors(split)
    return x.clone(), y.clone()


def digits_dataset(split: str = "train") -> torch.utils.data.TensorDataset:
    """The split as an in-memory ``TensorDataset`` (fast: no decoding per item)."""
    return torch.utils.data.TensorDataset(*digits_tensors(split))


def _check_sampler_args(n: int, world_size: int, epoch: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the data set needs at least one item, got n={n!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size!r}")
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be 0 or more, got {epoch!r}")


def _order(n: int, world_size: int, epoch: int, shuffle: bool, seed: int, drop_last: bool) -> tuple[list[int], int]:
    """The epoch's full index list after padding or dropping, and how many entries are padding."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)  # what set_epoch changes: without it, epoch stays 0
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    if drop_last and n % world_size:
        per_rank = math.ceil((n - world_size) / world_size)
    else:
        per_rank = math.ceil(n / world_size)
    total = per_rank * world_size
    if total >= n:  # pad by repeating the start of the order (wrapping round if it is short)
        pad = total - n
        order = order + (order * math.ceil(pad / n))[:pad] if pad else order
        return order, pad
    return order[:total], 0


def sampler_indices(n: int, world_size: int, epoch: int = 0, shuffle: bool = True, seed: int = 0,
                    drop_last: bool = False) -> list[list[int]]:
    """The indices ``DistributedSampler(dataset_of_n, world_size, rank, shuffle, seed, drop_last)``
    yields on every rank after ``set_epoch(epoch)``: ``result[rank]`` is rank's list, in order."""
    _check_sampler_args(n, world_size, epoch)
    order, _ = _order(n, world_size, epoch, shuffle, seed, drop_last)
    return [order[r::world_size] for r in range(world_size)]


def reseed_rng(worker_id: int) -> None:
    """``worker_init_fn``: give the dataset's own NumPy Generator (``dataset.rng``) this worker's seed.

    DataLoader seeds torch, ``random`` and NumPy's global generator in every worker, but not a generator
    object the dataset holds: each worker's copy would draw the same numbers. ``get_worker_info().seed``
    differs per worker (and per epoch unless the workers are persistent).
    """
    info = get_worker_info()
    if info is not None and hasattr(info.dataset, "rng"):
        info.dataset.rng = np.random.default_rng(info.seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write data/digits/ and its manifest")
    b.add_argument("--out", default=str(DIGITS))
    v = sub.add_parser("verify", help="check the files against the manifest")
    v.add_argument("--root", default=str(DIGITS))
    args = parser.parse_args(argv)
    if args.cmd == "build":
        m = build(args.out)
        train, test = m["counts"]["train"], m["counts"]["test"]
        print(tr("wrote {train} train and {test} test images to {out}",
                 "已向 {out} 写入 {train} 张训练图像和 {test} 张测试图像", train=train, test=test, out=args.out))
        return 0
    problems = verify(args.root)
    for p in problems[:20]:
        print(p)
    if problems:
        print(tr("{n_problems} problem(s); rebuild with `python -m course_utils.data build`",
                 "共 {n_problems} 处问题；请用 `python -m course_utils.data build` 重新生成", n_problems=len(problems)))
        return 1
    print(tr("data OK", "数据完好"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
