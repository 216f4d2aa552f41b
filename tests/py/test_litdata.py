"""LitData datasets read in place through the Python API (issue 21; reader
src/source/litdata.c, docs/formats.md): the fixtures written by litdata's own
optimize() (../shared/fixtures/litdata/{plain,zstd,jpeg}) through
stoker.Loader(path, B, fields={...}): every leaf of every sample equal to its
manifest (image bytes by sha256 and size, caption, label, width, height and the
nested meta dict's leaves), exactly once an epoch over 1 and 3 threads with
identical batches; (images, labels) batches without fields; the dataset view;
pickle leaves refused with a clear message."""

import hashlib
import json
import os
import pathlib

import numpy as np
import pytest

import stoker

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _fixtures():
    env = os.environ.get("STOKER_FIXTURES")
    for c in ([env] if env else []) + [ROOT / "../shared/fixtures", ROOT / "../../shared/fixtures",
                                       "/work/shared/fixtures"]:
        p = pathlib.Path(c) / "litdata"
        if (p / "plain.manifest.json").is_file():
            return p
    pytest.fail("the LitData fixtures (../shared/fixtures/litdata or $STOKER_FIXTURES/litdata) "
                "are missing")


def _manifest(variant):
    return json.loads((_fixtures() / f"{variant}.manifest.json").read_text())["samples"]


FIELDS = {"image": "image", "caption": "caption", "label": "label"}
META = {"width": "width", "height": "height", "aspect": "meta.aspect", "even": "meta.even",
        "tag0": "meta.tags.0", "tag1": "meta.tags.1"}


def _epoch_fields(variant, threads):
    fields = dict(FIELDS, **({} if variant == "jpeg" else META))
    out, order = {}, []
    with stoker.Loader(str(_fixtures() / variant), 7, seed=5, threads=threads, output="numpy",
                       fields=fields, return_indices=True) as L:
        assert L.num_samples == 60
        for b in L:
            assert list(b)[:len(fields)] == list(fields)
            for k, i in enumerate(b["__index__"].tolist()):
                assert i not in out, f"sample {i} delivered twice"
                # Copies: batches are views of the ring.
                out[i] = {name: np.array(b[name][k]) if isinstance(b[name][k], np.ndarray)
                          else b[name][k] for name in fields}
                order.append(i)
    return out, order


@pytest.mark.parametrize("variant", ["plain", "zstd", "jpeg"])
def test_fields_equal_manifest(variant):
    man = _manifest(variant)
    one, order1 = _epoch_fields(variant, 1)
    three, order3 = _epoch_fields(variant, 3)
    assert sorted(one) == list(range(60))
    assert order1 == order3
    for i, m in enumerate(man):
        got = one[i]
        img = bytes(np.asarray(got["image"]).tobytes())
        assert len(img) == m["nbytes"] and hashlib.sha256(img).hexdigest() == m["sha256"], i
        assert got["caption"] == m["caption"]
        assert int(got["label"]) == m["label"]
        if variant != "jpeg":
            assert int(got["width"]) == m["width"] and int(got["height"]) == m["height"]
            assert got["aspect"] == np.float32(m["meta"]["aspect"])
            assert int(got["even"]) == int(m["meta"]["even"])
            assert [got["tag0"], got["tag1"]] == m["meta"]["tags"]
        for name in got:
            assert np.array_equal(np.asarray(got[name]), np.asarray(three[i][name])), (i, name)


@pytest.mark.parametrize("variant", ["plain", "zstd", "jpeg"])
def test_images_and_labels_without_fields(variant):
    man = _manifest(variant)
    seen = set()
    with stoker.Loader(str(_fixtures() / variant), 8, seed=3, threads=2, output="numpy",
                       transform="imagenet-val", return_indices=True) as L:
        for x, y, idx in L:
            assert x.shape[1:] == (3, 224, 224)
            for k, i in enumerate(idx.tolist()):
                assert y[k] == man[i]["label"]
                seen.add(i)
    assert seen == set(range(60))


def test_dataset_view():
    man = _manifest("plain")
    with stoker.Loader(str(_fixtures() / "plain"), 4, output="numpy") as L:
        ds = L.dataset
        assert ds.kind == "litdata"
        assert len(ds) == 60
        assert ds.num_classes == max(s["label"] for s in man) + 1


def test_pickle_refused(tmp_path):
    src = _fixtures() / "plain"
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    index = json.loads((tmp_path / "index.json").read_text())
    index["config"]["data_format"][1] = "pickle"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(Exception, match="leaf 'caption'.*pickle.*never unpickles"):
        stoker.Loader(str(tmp_path), 4)
