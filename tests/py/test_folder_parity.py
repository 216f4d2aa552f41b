"""ImageFolder parity: stoker's folder source lists the same samples, in the
same order, with the same class indices as torchvision.datasets.ImageFolder.

Each test builds an odd tree, asks torchvision for its sample list, computes
the checksum `stoker bench --no-shuffle --batch-size 1 --json` must print
(XXH3-64 over, per batch, the int64 labels and then each sample's uint64
length and bytes), and compares. The binary is $STOKER_BIN, else
build/release/stoker.
"""
import ctypes
import ctypes.util
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

torchvision = pytest.importorskip("torchvision")
from torchvision.datasets import ImageFolder  # noqa: E402

from conftest import stoker_bin  # noqa: E402


STOKER = stoker_bin()
pytestmark = pytest.mark.skipif(STOKER is None, reason="no stoker binary (build it or set STOKER_BIN)")


def _xxh3():
    name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
    lib = ctypes.CDLL(name)
    f = lib.XXH3_64bits
    f.restype = ctypes.c_uint64
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lambda data: f(data, len(data))


XXH3 = _xxh3()


def expected_checksum(samples):
    """Batch size 1: label (int64 LE), then length (uint64 LE) and bytes."""
    parts = []
    for path, label in samples:
        data = Path(path).read_bytes()
        parts.append(struct.pack("<q", label))
        parts.append(struct.pack("<Q", len(data)))
        parts.append(data)
    return XXH3(b"".join(parts))


def bench(root, *extra):
    cmd = [STOKER, "bench", str(root), "--no-shuffle", "--json", "--batch-size", "1",
           "--threads", "2", "--max-sample-bytes", "1M", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def torchvision_samples(root):
    ds = ImageFolder(str(root), loader=lambda p: p)
    return ds.samples, ds.classes


def check_parity(root):
    samples, classes = torchvision_samples(root)
    r = bench(root)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    listing = "\n".join(f"  {label} {os.path.relpath(p, root)}" for p, label in samples)
    assert out["samples"] == len(samples), f"torchvision's samples:\n{listing}"
    assert int(out["checksum"], 16) == expected_checksum(samples), (
        f"same count, different order, labels or bytes; torchvision's samples:\n{listing}")
    return samples, classes


def put(root, rel, content=None):
    p = Path(root) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content if content is not None else f"bytes of {rel}\n".encode() * (1 + len(rel) % 5))
    return p


def test_nested_mixed_case_and_other_files(tmp_path):
    root = tmp_path / "root"
    for rel in ["dog/a.jpg", "dog/B.JPG", "dog/c.Jpeg", "dog/d.PNG", "dog/e.tif", "dog/f.TIFF",
                "dog/g.webp", "dog/h.bmp", "dog/i.pgm", "dog/j.ppm", "dog/.hidden.jpg", "dog/.jpg",
                "dog/deep/er/x.jpg", "dog/deep/y.jpg", "dog/deep er/z.jpg", "dog/deep2/w.jpg",
                "cat/1.png", "cat/sub/2.png", "cat/sub/3.gif", "cat/notes.txt", "cat/jpg",
                "cat/x.jpg.txt", "cat/x.jpgx", "cat/README", "Cow/m.jpeg", "Cow/fake.jpg/inner.png",
                ".hiddenclass/q.jpg", "top-level.jpg"]:
        put(root, rel)
    samples, classes = check_parity(root)
    assert classes == [".hiddenclass", "Cow", "cat", "dog"]
    assert len(samples) == 21


def test_many_classes_sorting(tmp_path):
    root = tmp_path / "root"
    for k in range(12):
        put(root, f"class{k}/img{k}.jpg")
        put(root, f"class{k}/nested/img{k}b.png")
    put(root, "Class_upper/u.jpg")
    put(root, "_under/u.jpg")
    samples, classes = check_parity(root)
    assert classes[:2] == ["Class_upper", "_under"] and classes[2:5] == ["class0", "class1", "class10"]


def test_unicode_names(tmp_path):
    root = tmp_path / "root"
    for rel in ["é/à.jpg", "é/z.jpg", "e/é.png", "e/e.png", "日本/画像.jpg", "日本/ÄÖ.JPG",
                "emoji/😀.jpg", "emoji/\uff41.jpg", "emoji/a.jpg", "emoji/sub dir/ß.png"]:
        put(root, rel)
    check_parity(root)


def test_symlinked_dirs_and_files(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    put(outside, "o1.jpg")
    put(outside, "more/o2.png")
    put(root, "a/self.jpg")
    put(root, "b/b1.jpg")
    os.symlink(outside, root / "a" / "linked")        # a symlinked directory
    os.symlink(outside / "o1.jpg", root / "a" / "alias.jpg")  # a symlinked file
    os.symlink(outside, root / "linkclass")           # a class that is a symlink
    os.symlink(root / "b", root / "a" / "to_b")       # a sibling class, seen twice
    samples, classes = check_parity(root)
    assert classes == ["a", "b", "linkclass"]


def test_sizes_and_empty_files(tmp_path):
    root = tmp_path / "root"
    put(root, "c/empty.jpg", b"")
    put(root, "c/one.jpg", b"\x00")
    put(root, "c/big.jpg", os.urandom(300_000))
    put(root, "d/nul.png", b"\x00\xff" * 1000)
    check_parity(root)


def test_torchvision_errors_are_stoker_errors(tmp_path):
    # A class without valid files: torchvision raises, stoker exits 1 naming it.
    root = tmp_path / "root"
    put(root, "good/a.jpg")
    put(root, "textonly/readme.txt")
    with pytest.raises(FileNotFoundError):
        torchvision_samples(root)
    r = bench(root)
    assert r.returncode == 1 and "textonly" in r.stderr
    # An empty root.
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError):
        torchvision_samples(empty)
    r = bench(empty)
    assert r.returncode == 1 and str(empty) in r.stderr
    # A missing root.
    r = bench(tmp_path / "missing")
    assert r.returncode == 1 and str(tmp_path / "missing") in r.stderr


def test_symlink_loop_terminates(tmp_path):
    # torchvision's os.walk would follow the loop until the path is too long;
    # stoker detects it (a documented departure) and lists each file once.
    root = tmp_path / "root"
    put(root, "a/x.jpg")
    put(root, "a/sub/y.jpg")
    os.symlink("..", root / "a" / "sub" / "up")
    r = bench(root)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["samples"] == 2
    samples = [(str(root / "a/x.jpg"), 0), (str(root / "a/sub/y.jpg"), 0)]
    assert int(out["checksum"], 16) == expected_checksum(samples)
