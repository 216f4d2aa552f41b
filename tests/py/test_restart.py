"""Restart-indexed JPEG payloads (`stoker pack --restart`, docs/images.md):
bit-identical batches against the folder and a plain .stk for every JPEG
variant and pipeline, deterministic packing, info and verify, and an index
that lies is a clear sample error."""

import os
import subprocess

import numpy as np
import pytest

import stoker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOKER = os.path.join(ROOT, "build", "release", "stoker")


def _photo(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                    ((x // 9 + y // 5) % 2) * 90 + 40], -1)
    return (img + rng.integers(0, 35, (h, w, 3))).clip(0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every JPEG variant in an ImageFolder, plus a PNG (kept as it is)."""
    from PIL import Image
    root = tmp_path_factory.mktemp("restart") / "src"
    variants = [("444", dict(quality=95, subsampling=0)), ("420", dict(quality=88)),
                ("422", dict(quality=90, subsampling=1)), ("prog", dict(quality=85,
                                                                       progressive=True))]
    sizes = [(375, 500), (333, 257), (64, 64), (17, 9), (480, 640), (1, 1)]
    n = 0
    for ci, (name, kw) in enumerate(variants):
        d = root / f"c{ci}_{name}"
        d.mkdir(parents=True)
        for si, (h, w) in enumerate(sizes):
            Image.fromarray(_photo(h, w, n)).save(d / f"{si}.jpg", **kw)
            n += 1
    d = root / "c4_other"
    d.mkdir()
    for si, (h, w) in enumerate(sizes[:4]):
        Image.fromarray(_photo(h, w, n).mean(-1).astype(np.uint8), "L").save(d / f"g{si}.jpg",
                                                                              quality=90)
        Image.fromarray(_photo(h, w, n + 1)).convert("CMYK").save(d / f"k{si}.jpg", quality=90)
        n += 2
    Image.fromarray(_photo(40, 50, 99)).save(d / "p.png")
    return root


def _pack(src, out, *args):
    r = subprocess.run([STOKER, "pack", str(src), str(out), *args], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def packed(corpus, tmp_path_factory):
    base = tmp_path_factory.mktemp("restart-packed")
    plain, indexed = base / "plain", base / "indexed"
    _pack(corpus, plain, "--quiet")
    out = _pack(corpus, indexed, "--restart")
    assert "restart-indexed 32 of 33 samples" in out  # every JPEG, not the PNG
    return plain, indexed


def _epochs(path, transform, epochs=2, **kw):
    out = []
    with stoker.Loader(str(path), 5, transform=transform, output="numpy", seed=4, threads=2,
                       **kw) as loader:
        for _ in range(epochs):
            for data, labels in loader:
                if isinstance(data, list):
                    out.append([np.array(d) for d in data] + [np.array(labels)])
                else:
                    out.append([np.array(data), np.array(labels)])
    return out


@pytest.mark.parametrize("transform", ["imagenet-train", "imagenet-val", "decode",
                                       "RandomResizedCrop(24,scale=(0.01,0.2))|RandomHorizontalFlip()"])
def test_same_batches_as_folder_and_plain_stk(corpus, packed, transform):
    kw = {"size": 48} if transform.startswith("imagenet") else {}
    want = _epochs(corpus, transform, **kw)
    for path in packed:
        got = _epochs(path, transform, **kw)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert np.array_equal(x, y)


def test_pack_is_deterministic_for_any_thread_count(corpus, tmp_path):
    _pack(corpus, tmp_path / "t1", "--restart", "--threads", "1", "--quiet")
    _pack(corpus, tmp_path / "t2", "--restart", "--threads", "2", "--quiet")
    names = sorted(os.listdir(tmp_path / "t1"))
    assert names == sorted(os.listdir(tmp_path / "t2"))
    for n in names:
        assert (tmp_path / "t1" / n).read_bytes() == (tmp_path / "t2" / n).read_bytes(), n


def test_info_and_verify(packed):
    plain, indexed = packed
    r = subprocess.run([STOKER, "info", str(indexed)], capture_output=True, text=True)
    assert "restart   32 of 33 samples restart-indexed" in r.stdout
    r = subprocess.run([STOKER, "info", str(plain)], capture_output=True, text=True)
    assert "not recorded" in r.stdout
    r = subprocess.run([STOKER, "verify", str(indexed)], capture_output=True, text=True)
    assert r.returncode == 0 and "32 restart indexes checked" in r.stdout, r.stdout


def test_lying_index_is_a_sample_error(packed, tmp_path):
    from PIL import Image
    _, indexed = packed
    # Take restart-indexed payloads out of the shards (transform None gives
    # the stored bytes) into a folder, and make one index lie.
    with stoker.Loader(str(indexed), 33, shuffle=False, output="numpy") as loader:
        data, labels = next(iter(loader))
    jpgs = [bytes(d) for d in data if bytes(d[:2]) == b"\xff\xd8" and b"STKRST" in bytes(d)]
    assert len(jpgs) == 32
    d = tmp_path / "f" / "c0"
    d.mkdir(parents=True)
    good = max(jpgs, key=len)  # the largest image: many segments
    (d / "good.jpg").write_bytes(good)
    tag = good.index(b"STKRST")
    bad = bytearray(good)
    bad[tag + 8] ^= 0x07  # k, the restart interval
    (d / "bad.jpg").write_bytes(bytes(bad))
    # Other decoders ignore the index: the lying file is still a valid JPEG.
    assert Image.open(d / "bad.jpg").convert("RGB").size == Image.open(d / "good.jpg").size
    with stoker.Loader(str(tmp_path / "f"), 2, transform="imagenet-train", size=32,
                       output="numpy", on_error="skip", shuffle=False) as loader:
        batches = list(loader)
        errors = loader.stats()["errors"]
    assert sum(len(lb) for _, lb in batches) == 1
    assert len(errors) == 1 and errors[0]["path"].endswith("bad.jpg")
    assert "restart index" in errors[0]["reason"]
    # An offset one byte off in the middle: verify checks every segment.
    off = bytearray(good)
    k_at = tag + 7 + 1 + 4 + 4 + 4 * 10
    off[k_at] = (off[k_at] + 1) & 255
    (d / "bad.jpg").write_bytes(bytes(off))
    r = subprocess.run([STOKER, "verify", str(tmp_path / "f")], capture_output=True, text=True)
    assert r.returncode == 1 and "bad.jpg" in r.stdout and "restart index" in r.stdout, r.stdout


def test_stoker_pack_restart_equals_the_cli(corpus, packed, tmp_path):
    _, indexed = packed
    r = stoker.pack(corpus, tmp_path / "py", restart=True)
    assert r["restart_indexed"] == 32
    names = sorted(os.listdir(indexed))
    assert names == sorted(os.listdir(tmp_path / "py"))
    for n in names:
        assert (tmp_path / "py" / n).read_bytes() == (indexed / n).read_bytes(), n
