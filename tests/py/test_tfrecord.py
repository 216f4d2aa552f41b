"""TFRecord files of tf.train.Example records read in place through the
Python API (issue 21; reader src/source/tfrecord.c, docs/formats.md): the
fixtures (../shared/fixtures/tfrecord/{plain,gzip}, Examples serialized by
protobuf from TensorFlow's own .proto files) as dict batches with
fields={...}, every field of every sample equal to its manifest (the image
bytes by SHA-256, captions, filenames, labels, widths, heights, the float32
aspect, the multi-valued int64 lists as lists), exactly once an epoch over 1
and 3 threads with identical batches; the gzip files read alike; without
fields, (images, labels) batches; a damaged record skipped under
on_error="skip" with the rest delivered."""

import hashlib
import json
import os
import pathlib
import shutil

import numpy as np
import pytest

import stoker

ROOT = pathlib.Path(__file__).resolve().parents[2]

FIELDS = {
    "image": "image/encoded",
    "caption": ("caption", "text"),
    "filename": ("image/filename", "text"),
    "label": "image/class/label",
    "width": "image/width",
    "height": "image/height",
    "aspect": "image/aspect",
    "size": "image/size",
    "sample_index": "sample/index",
}


def _fixtures():
    env = os.environ.get("STOKER_FIXTURES")
    for c in ([env] if env else []) + [ROOT / "../shared/fixtures", ROOT / "../../shared/fixtures",
                                       "/work/shared/fixtures"]:
        p = pathlib.Path(c) / "tfrecord"
        if (p / "plain.manifest.json").is_file():
            return p
    pytest.fail("the TFRecord fixtures (../shared/fixtures/tfrecord or $STOKER_FIXTURES/tfrecord) are missing")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    # The fixtures are read-only: their indexes go to the user cache.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _manifest(variant):
    return json.loads((_fixtures() / f"{variant}.manifest.json").read_text())["samples"]


def _epoch(path, threads, **kw):
    out, order = {}, []
    with stoker.Loader(str(path), 7, seed=5, threads=threads, output="numpy", fields=FIELDS,
                       return_indices=True, **kw) as L:
        assert L.num_samples == 60
        for batch in L:
            for k, i in enumerate(batch["__index__"].tolist()):
                assert i not in out, f"sample {i} delivered twice"
                # Copies: batches are views of the ring.
                out[i] = {name: (np.array(batch[name][k]) if isinstance(batch[name][k], np.ndarray)
                                 else batch[name][k]) for name in FIELDS}
                order.append(i)
    return out, order


def _check(got, man):
    assert sorted(got) == list(range(60))
    for i, s in enumerate(man):
        g = got[i]
        img = bytes(np.asarray(g["image"]).tobytes())
        assert len(img) == s["nbytes"] and hashlib.sha256(img).hexdigest() == s["sha256"], i
        assert g["caption"] == s["caption"]
        assert g["filename"] == s["filename"]
        assert int(g["label"]) == s["label"]
        assert int(g["width"]) == s["width"] and int(g["height"]) == s["height"]
        assert np.float32(g["aspect"]) == np.float32(s["aspect"])
        assert g["size"] == s["size"]
        assert g["sample_index"] == s["sample_index"]


@pytest.mark.parametrize("variant", ["plain", "gzip"])
def test_fields_match_manifest(variant):
    man = _manifest(variant)
    one, order1 = _epoch(_fixtures() / variant, 1)
    three, order3 = _epoch(_fixtures() / variant, 3)
    _check(one, man)
    _check(three, man)
    assert order1 == order3


def test_without_fields():
    man = _manifest("plain")
    seen = set()
    with stoker.Loader(str(_fixtures() / "plain"), 8, threads=2, output="numpy",
                       transform="imagenet-val", return_indices=True) as L:
        assert L.dataset.kind == "tfrecord"
        assert L.dataset.num_classes == max(s["label"] for s in man) + 1
        for x, y, idx in L:
            assert x.shape[1:] == (3, 224, 224) or x.shape[-3:] == (224, 224, 3)
            for k, i in enumerate(idx.tolist()):
                assert int(y[k]) == man[i]["label"]
                seen.add(i)
    assert seen == set(range(60))


def test_damaged_record_skipped(tmp_path):
    man = _manifest("plain")
    d = tmp_path / "ds"
    d.mkdir()
    for f in (_fixtures() / "plain").glob("*.tfrecord"):
        shutil.copyfile(f, d / f.name)
    loc = man[33]["location"]
    p = d / loc["file"]
    b = bytearray(p.read_bytes())
    b[loc["offset"] + 12 + 200] ^= 0x55
    p.write_bytes(bytes(b))
    got = []
    with stoker.Loader(str(d), 8, output="numpy", fields={"caption": ("caption", "text")},
                       on_error="skip", return_indices=True) as L:
        for batch in L:
            got += batch["__index__"].tolist()
    assert sorted(got) == [i for i in range(60) if i != 33]
    with stoker.Loader(str(d), 8, output="numpy", fields={"caption": ("caption", "text")}) as L:
        with pytest.raises(Exception, match=r"train-00001-of-00002\.tfrecord#3.*data CRC"):
            for _ in L:
                pass
