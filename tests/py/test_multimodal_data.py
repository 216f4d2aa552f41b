"""scripts/make-multimodal.py, the generator of the CLIP-style multi-field tar
set the fields tests and bench/bench_multimodal.py use: the tars hold what the
manifest says, byte for byte (read back with tarfile, WebDataset's key and
extension rule), and the set is the same for a seed and differs for another;
bench_multimodal's PyTorch-side reader groups it as written, and
examples/train_clip.py trains from it (once stoker.Loader takes fields=)."""

import hashlib
import importlib.util
import io
import json
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "make-multimodal.py")

spec = importlib.util.spec_from_file_location("make_multimodal", SCRIPT)
mm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mm)

SMALL = dict(samples=23, shard_size=6, image_side=(40, 64))


def webdataset_split(name):
    """WebDataset's rule: the key is the path up to the first dot of the file
    name, the extension all after it (so key.seg.png has extension seg.png)."""
    d, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (d + "/" + stem if d else stem), ext


def read_set(out):
    """{key: {ext: bytes}} and the keys in tar order, from the tars alone."""
    samples, order = {}, []
    for name in sorted(f for f in os.listdir(out) if f.endswith(".tar")):
        with tarfile.open(os.path.join(out, name)) as tf:
            for m in tf.getmembers():
                assert m.isfile(), m.name
                key, ext = webdataset_split(m.name)
                if key not in samples:
                    samples[key] = {}
                    order.append((name, key))
                assert ext not in samples[key], f"duplicate member {m.name}"
                samples[key][ext] = tf.extractfile(m).read()
    return samples, order


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("mm") / "set"
    m = mm.make(out, seed=7, **SMALL)
    return out, m


def test_members_match_manifest(made):
    out, m = made
    assert m == mm.load_manifest(out)
    tars, order = read_set(out)
    # Every sample once, in dataset order, in the shard the manifest names.
    assert [(s["shard"], s["key"]) for s in m["samples"]] == order
    assert [s["index"] for s in m["samples"]] == list(range(SMALL["samples"]))
    assert len(m["shards"]) == 4 and [s["samples"] for s in m["shards"]] == [6, 6, 6, 5]
    for sh in m["shards"]:
        blob = open(os.path.join(out, sh["name"]), "rb").read()
        assert (len(blob), hashlib.sha256(blob).hexdigest()) == (sh["bytes"], sh["sha256"])
    captions = set()
    for s in m["samples"]:
        members = tars[s["key"]]
        assert sorted(members) == sorted(mm.ORDER) == sorted(s["fields"])
        for ext, f in s["fields"].items():
            b = members[ext]
            assert len(b) == f["size"] and hashlib.sha256(b).hexdigest() == f["sha256"]
            assert mm.member_bytes(out, s, ext) == b  # the offset is the data's
        # What each member holds, decoded the way a user's code would.
        txt = members["txt"].decode("utf-8")  # strict: valid UTF-8
        assert txt == s["fields"]["txt"]["text"] and not txt.isascii()
        captions.add(txt)
        meta = json.loads(members["json"].decode("utf-8"))
        assert meta == s["fields"]["json"]["value"] and meta["key"] == s["key"]
        assert isinstance(meta["nested"]["next"]["list"], list)
        assert int(members["cls"]) == s["fields"]["cls"]["value"] == s["label"]
        arr = np.load(io.BytesIO(members["npy"]), allow_pickle=False)
        assert arr.dtype == np.float32 and list(arr.shape) == s["fields"]["npy"]["shape"]
        assert arr.tolist() == s["fields"]["npy"]["values"]
        for ext, fmt in (("jpg", "JPEG"), ("seg.png", "PNG")):
            im = Image.open(io.BytesIO(members[ext]))
            f = s["fields"][ext]
            assert (im.format, im.width, im.height, im.mode) == (fmt, f["width"], f["height"],
                                                                 f["mode"])
            assert SMALL["image_side"][0] <= s["fields"]["jpg"]["width"] <= SMALL["image_side"][1]
        assert s["fields"]["seg.png"]["mode"] == "P"
    assert len(captions) == SMALL["samples"]  # unique captions
    assert len({s["label"] for s in m["samples"]}) > 1


def test_deterministic_for_a_seed(made, tmp_path):
    out, m = made
    again = mm.make(tmp_path / "again", seed=7, **SMALL)
    assert again == m
    for sh in m["shards"]:
        assert (open(os.path.join(out, sh["name"]), "rb").read() ==
                open(tmp_path / "again" / sh["name"], "rb").read())
    other = mm.make(tmp_path / "other", seed=8, **SMALL)
    assert other["shards"] != m["shards"]
    assert ([s["fields"]["jpg"]["sha256"] for s in other["samples"]] !=
            [s["fields"]["jpg"]["sha256"] for s in m["samples"]])


def test_options_drop_key_prefix_seg_mode(tmp_path):
    out = tmp_path / "opt"
    m = mm.make(out, samples=9, shard_size=4, image_side=(32, 40), seg_mode="L",
                drop={"seg.png": 3, "npy": 2}, key_prefix="part.1/")
    tars, order = read_set(out)
    for s in m["samples"]:
        i = s["index"]
        assert s["key"] == "part.1/%08d" % i  # a dotted directory stays in the key
        want = set(mm.ORDER) - ({"seg.png"} if i % 3 == 2 else set()) - \
            ({"npy"} if i % 2 == 1 else set())
        assert set(tars[s["key"]]) == set(s["fields"]) == want
        if "seg.png" in s["fields"]:
            assert Image.open(io.BytesIO(tars[s["key"]]["seg.png"])).mode == "L"
    with pytest.raises(ValueError):
        mm.make(tmp_path / "bad", samples=2, drop={"png": 2})


def test_command_line(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "cli"
    r = subprocess.run([sys.executable, SCRIPT, str(out), "--samples", "5", "--shard-size", "2",
                        "--side", "32,40", "--seed", "3", "--drop", "seg.png:2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 5 samples in 3 shards" in r.stdout
    m = mm.load_manifest(out)
    assert m["seed"] == 3 and "seg.png" not in m["samples"][1]["fields"]
    assert m == mm.make(tmp_path / "same", samples=5, shard_size=2, image_side=(32, 40), seed=3,
                        drop={"seg.png": 2})
    # An existing output is refused, not overwritten.
    r = subprocess.run([sys.executable, SCRIPT, str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and "exists" in r.stderr


# ---- its users: the benchmark's PyTorch reader and the CLIP example ----------------------

def load(name, *path):
    s = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def test_bench_reader_groups_as_the_manifest(tmp_path):
    """bench_multimodal's DataLoader side reads what was written: every
    sample once, its members under WebDataset's key and extension (a dotted
    directory, seg.png, samples missing a member)."""
    bench = load("bench_multimodal", "bench", "bench_multimodal.py")
    out = tmp_path / "set"
    m = mm.make(out, samples=11, shard_size=4, image_side=(32, 40), drop={"txt": 5},
                key_prefix="part.1/")
    got = [(os.path.basename(p), key, members) for p in bench.shards(str(out))
           for key, members in bench.tar_samples(p)]
    assert [(s["shard"], s["key"]) for s in m["samples"]] == [(sh, k) for sh, k, _ in got]
    for s, (_, _, members) in zip(m["samples"], got):
        assert sorted(members) == sorted(s["fields"])
        for ext in members:
            assert members[ext] == mm.member_bytes(out, s, ext)


def test_clip_example_trains_from_fields(tmp_path):
    import inspect

    import stoker
    if "fields" not in inspect.signature(stoker.Loader).parameters:
        pytest.skip("stoker.Loader has no fields= yet (issue 20's Python API)")
    ex = load("train_clip", "examples", "train_clip.py")
    data = tmp_path / "clip"
    mm.make(data, samples=96, shard_size=24, image_side=(48, 64))
    # main() returns 0 when the mean loss of the last steps is below the first's.
    assert ex.main(["--data", str(data), "--steps", "30", "--batch-size", "16", "--size", "32",
                    "--threads", "2"]) == 0
