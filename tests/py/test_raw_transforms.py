"""Transforms on raw tensors (issue 13 item 11, docs/transforms.md): CIFAR
batches (3x32x32 planar) and raw .stk payloads (HWC, `stoker pack --raw`) go
through the same image pipeline as decoded images: the same plan, the same
random draws, and the same pixels as the same images stored as PNG files."""

import json
import os
import subprocess

import numpy as np
import pytest

import stoker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOKER = os.path.join(ROOT, "build", "release", "stoker")
N = 40


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The same N 32x32 images as a CIFAR-10 batch, a one-class PNG folder
    (same order) and a raw .stk packed from the folder."""
    from PIL import Image
    base = tmp_path_factory.mktemp("raw")
    rng = np.random.default_rng(11)
    y, x = np.mgrid[0:32, 0:32]
    imgs = []
    for i in range(N):
        img = np.stack([x * 8, y * 8, (x + y + i) * 4], -1) + rng.integers(0, 40, (32, 32, 3))
        imgs.append(np.clip(img, 0, 255).astype(np.uint8))
    cifar = base / "cifar"
    cifar.mkdir()
    with open(cifar / "data_batch_1.bin", "wb") as f:
        for i, img in enumerate(imgs):
            f.write(bytes([i % 10]) + img.transpose(2, 0, 1).tobytes())  # CHW
    folder = base / "folder" / "c0"
    folder.mkdir(parents=True)
    for i, img in enumerate(imgs):
        Image.fromarray(img).save(folder / f"{i:03d}.png")
    stk = base / "stk"
    subprocess.run([STOKER, "pack", str(base / "folder"), str(stk), "--raw", "32x32x3",
                    "--quiet"], check=True)
    return {"cifar": cifar, "folder": base / "folder", "stk": stk, "imgs": imgs}


def _images(path, transform, **kw):
    with stoker.Loader(str(path), 8, transform=transform, seed=5, output="numpy",
                       threads=2, **kw) as L:
        return [np.array(d) for e in range(2) for d, _ in L]


@pytest.mark.parametrize("transform", [
    "cifar-train",
    "RandomCrop(32,padding=4)|RandomHorizontalFlip()",
    "RandomCrop(28,padding=2,fill=7)|RandomVerticalFlip()",
    "RandomResizedCrop(24)|RandomHorizontalFlip()",
    "Resize(40)|CenterCrop(36)",
])
def test_same_pixels_as_the_same_images_decoded(sets, transform):
    want = _images(sets["folder"], transform)
    for kind in ("cifar", "stk"):
        got = _images(sets[kind], transform)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert np.array_equal(a, b), kind


def test_normalize_and_float_layouts(sets):
    t = ("RandomCrop(32,padding=4)|RandomHorizontalFlip()|"
         "Normalize(mean=(0.4914,0.4822,0.4465),std=(0.247,0.243,0.261))")
    for layout in ("nchw", "nhwc"):
        want = _images(sets["folder"], t, dtype="float32", layout=layout)
        got = _images(sets["cifar"], t, dtype="float32", layout=layout)
        assert got[0].dtype == np.float32
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_center_crop_against_a_reference(sets):
    """A transform with no randomness, checked against NumPy directly."""
    with stoker.Loader(str(sets["cifar"]), N, transform="CenterCrop(24)", shuffle=False,
                       output="numpy", layout="nhwc") as L:
        data, labels = next(iter(L))
    for i in range(N):
        assert np.array_equal(data[i], sets["imgs"][i][4:28, 4:28])
        assert labels[i] == i % 10


def test_cli_bench_cifar_train(sets):
    r = subprocess.run([STOKER, "bench", str(sets["cifar"]), "--transform", "cifar-train",
                        "--batch-size", "8", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["samples"] == N and rep["skipped"] == 0
