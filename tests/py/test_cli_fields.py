"""Samples with fields on the command line (issue 20): `stoker bench --fields`
prints one checksum per field, `stoker info` lists a dataset's fields, and
`stoker doctor --fields` runs on a multi-field dataset, saying which levels
measure what. Folder data (its fields: image, label) works today; the tar
tests need the multi-field tar reader and are skipped by a build without it
(`stoker info` then lists no 'txt' field)."""

import ctypes
import io
import json
import os
import struct
import subprocess
import tarfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOKER = os.path.join(ROOT, "build", "release", "stoker")

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(data):
    return "%016x" % _xxh.XXH3_64bits(data, len(data))


def run(*args, check=True):
    r = subprocess.run([STOKER, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def _jpeg(h, w, seed):
    from PIL import Image
    rng = np.random.default_rng(seed)
    b = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(b, "JPEG")
    return b.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("fields") / "ds"
    files = []
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for k in range(5):
            p = root / f"c{c}" / f"{k}.jpg"
            p.write_bytes(_jpeg(40 + k, 56, 10 * c + k))
            files.append((p, c))
    return root, files


def _fields(out):
    return {f["name"]: f for f in json.loads(out)["fields"]}


def test_bench_field_checksums_are_the_fields_bytes(folder):
    root, files = folder
    r = run("bench", str(root), "--fields", "image,label", "--no-shuffle", "--batch-size", "3",
            "--json")
    f = _fields(r.stdout)
    assert list(f) == ["image", "label"]
    assert f["image"]["kind"] == "image" and f["label"]["kind"] == "int"
    assert f["image"]["present"] == f["label"]["present"] == len(files)
    assert f["image"]["absent"] == f["label"]["absent"] == 0
    # Without a transform an image is its stored bytes, a variable field:
    # each sample's length (8 bytes) then its bytes, in delivery order.
    want = b"".join(struct.pack("=Q", len(p.read_bytes())) + p.read_bytes() for p, _ in files)
    assert f["image"]["checksum"] == xxh3(want)
    # A dense int64 field: its bytes.
    labels = np.array([c for _, c in files], dtype=np.int64).tobytes()
    assert f["label"]["checksum"] == xxh3(labels)
    # The text report shows the same.
    t = run("bench", str(root), "--fields", "image,label", "--no-shuffle", "--batch-size", "3")
    assert "fields image,label" in t.stdout
    assert f"field        label (int): checksum {xxh3(labels)}, {len(files)} samples" in t.stdout


def test_bench_field_checksums_follow_the_batches(folder):
    root, _ = folder
    args = ("bench", str(root), "--fields", "image,label", "--transform", "imagenet-train",
            "--size", "32", "--batch-size", "4", "--json", "--seed", "7")
    one = _fields(run(*args, "--threads", "1").stdout)
    two = _fields(run(*args, "--threads", "2").stdout)
    assert one == two  # the same batches whatever the thread count
    other = _fields(run(*args[:-1], "8", "--threads", "2").stdout)
    assert other["image"]["checksum"] != one["image"]["checksum"]  # another draw, another hash
    # The shuffle changes the order, which the label checksum sees.
    assert other["label"]["checksum"] != one["label"]["checksum"]
    # Without --fields: no per-field checksums.
    plain = json.loads(run("bench", str(root), "--transform", "imagenet-train", "--size", "32",
                           "--json").stdout)
    assert "fields" not in plain and plain["checksum"]


def test_info_lists_fields(folder):
    root, files = folder
    out = run("info", str(root)).stdout
    lines = [l.split() for l in out.splitlines() if l.startswith("field ")]
    assert lines[0][:3] == ["field", "image", "image"]
    assert lines[1][:3] == ["field", "label", "int"]
    for l in lines:
        assert l[-2:] == [str(len(files)), "samples"]


def _doctor(path, *args):
    r = run("doctor", str(path), "--json", "--seconds", "0.3", "--batch-size", "4", *args)
    assert "\r" not in r.stderr
    return json.loads(r.stdout)


def test_doctor_with_fields(folder):
    root, _ = folder
    d = _doctor(root, "--fields", "image,label", "--transform", "imagenet-val", "--size", "32")
    assert d["fields"] == "image,label"
    lv = d["levels"]
    for name in ("storage", "storage_warm", "decode", "batching", "full"):
        assert lv[name]["measured"], (name, lv[name])
    # The levels that hold bytes or processed samples say which field they took.
    assert "image field 'image' only" in lv["decode"]["note"]
    assert "image field 'image'" in lv["batching"]["note"]
    assert d["verdict"]["bound"] in ("storage", "decode", "batching")
    plain = _doctor(root, "--transform", "imagenet-val", "--size", "32")
    assert "fields" not in plain
    assert plain["levels"]["decode"]["measured"] and "image field" not in plain["levels"]["decode"]["note"]


def test_doctor_fields_without_image(folder):
    root, _ = folder
    d = _doctor(root, "--fields", "label", "--transform", "imagenet-val", "--size", "32")
    lv = d["levels"]
    assert lv["storage"]["measured"] and lv["full"]["measured"]
    assert not lv["decode"]["measured"] and "no image field" in lv["decode"]["note"]
    assert not lv["batching"]["measured"] and "no image field" in lv["batching"]["note"]


def test_bad_fields_are_refused(folder):
    root, _ = folder
    r = run("bench", str(root), "--fields", "image,nosuch", check=False)
    assert r.returncode == 1 and "nosuch" in r.stderr and "image, label" in r.stderr
    r = run("bench", str(root), "--fields", "image:nokind", check=False)
    assert r.returncode == 2 and "--fields" in r.stderr and "nokind" in r.stderr


# ---- Multi-field tar (needs the multi-field tar reader) ---------------------

@pytest.fixture(scope="module")
def tar(tmp_path_factory):
    path = tmp_path_factory.mktemp("fields-tar") / "shard-000000.tar"
    members = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for k in range(8):
            key = f"s{k:03d}"
            items = [("jpg", _jpeg(32, 40, k)), ("cls", str(k % 3).encode())]
            if k % 2 == 0:  # half the samples have a caption
                items.append(("txt", f"caption {k} é".encode()))
            for ext, data in items:
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            members.append(dict(items))
    out = run("info", str(path)).stdout
    if not any(l.split()[:2] == ["field", "txt"] for l in out.splitlines()):
        pytest.skip("this build's tar reader does not describe multi-field samples")
    return path, members


def test_info_counts_fields_of_a_tar(tar):
    path, members = tar
    out = run("info", str(path)).stdout
    counts = {l.split()[1]: int(l.split()[-2]) for l in out.splitlines() if l.startswith("field ")}
    assert counts["jpg"] == len(members) and counts["cls"] == len(members)
    assert counts["txt"] == sum("txt" in m for m in members)


def test_bench_optional_field_counts_absent_samples(tar):
    path, members = tar
    r = run("bench", str(path), "--fields", "image=jpg,caption?=txt,label=cls", "--no-shuffle",
            "--batch-size", "3", "--json")
    f = _fields(r.stdout)
    have = [m for m in members if "txt" in m]
    assert f["caption"]["present"] == len(have)
    assert f["caption"]["absent"] == len(members) - len(have)
    want = b"".join(struct.pack("=Q", len(m["txt"])) + m["txt"] if "txt" in m
                    else struct.pack("=Q", 2**64 - 1) for m in members)
    assert f["caption"]["checksum"] == xxh3(want)
    assert f["label"]["checksum"] == xxh3(np.array([k % 3 for k in range(len(members))],
                                                  dtype=np.int64).tobytes())
