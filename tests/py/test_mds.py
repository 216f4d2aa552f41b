"""MosaicML Streaming (MDS) datasets read in place through the Python API
(issue 21; reader src/source/mds.c, docs/formats.md): the fixtures written by
Streaming's own MDSWriter (../shared/fixtures/mds/{plain,zstd,jpeg}) as
(images, labels) batches without fields, every sample's label equal to its
manifest's, exactly once an epoch over 1 and 3 threads, identical batches for
both; decoded images equal between the `bytes` and `jpeg` column encodings and
the zstd shards; the dataset view's kind and classes. Every field of every
sample is compared byte for byte in tests/c/test_mds.c (the Python dict-batch
API comes with the fields work)."""

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
        p = pathlib.Path(c) / "mds"
        if (p / "plain.manifest.json").is_file():
            return p
    pytest.fail("the MDS fixtures (../shared/fixtures/mds or $STOKER_FIXTURES/mds) are missing")


def _manifest(variant):
    return json.loads((_fixtures() / f"{variant}.manifest.json").read_text())["samples"]


def _epoch(variant, threads, transform="imagenet-val"):
    out = {}
    order = []
    with stoker.Loader(str(_fixtures() / variant), 8, seed=3, threads=threads, output="numpy",
                       transform=transform, return_indices=True) as L:
        assert L.num_samples == 60
        for x, y, idx in L:
            for k, i in enumerate(idx.tolist()):
                assert i not in out, f"sample {i} delivered twice"
                out[i] = (x[k].copy(), int(y[k]))
                order.append(i)
    return out, order


@pytest.mark.parametrize("variant", ["plain", "zstd", "jpeg"])
def test_labels_once_per_epoch(variant):
    man = _manifest(variant)
    one, order1 = _epoch(variant, 1)
    three, order3 = _epoch(variant, 3)
    assert sorted(one) == list(range(60))
    assert order1 == order3
    for i in range(60):
        assert one[i][1] == man[i]["label"]
        assert np.array_equal(one[i][0], three[i][0]) and one[i][1] == three[i][1]


def test_encodings_decode_alike():
    plain, _ = _epoch("plain", 2)
    for variant in ("zstd", "jpeg"):
        other, _ = _epoch(variant, 2)
        for i in range(60):
            assert np.array_equal(plain[i][0], other[i][0]), (variant, i)


def test_dataset_view():
    man = _manifest("plain")
    with stoker.Loader(str(_fixtures() / "plain"), 4, output="numpy") as L:
        ds = L.dataset
        assert ds.kind == "mds"
        assert len(ds) == 60
        assert ds.num_classes == max(s["label"] for s in man) + 1


def test_pkl_refused(tmp_path):
    src = _fixtures() / "plain"
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    index = json.loads((tmp_path / "index.json").read_text())
    for sh in index["shards"]:
        sh["column_encodings"][5] = "pkl"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(Exception, match="pkl.*never unpickles"):
        stoker.Loader(str(tmp_path), 4)


def test_pack_keeps_every_column(tmp_path):
    """stoker.pack of an MDS dataset keeps its columns as fields, numbers
    included (the reader writes them as text: they used to be dropped), and
    the packed .stk delivers the same fields as the MDS dataset."""
    src = str(_fixtures() / "plain")
    out = str(tmp_path / "packed")
    stoker.pack(src, out)
    fields = {"caption": "caption", "label": "label", "width": "width", "aspect": "aspect",
              "meta": "meta"}
    got = []
    for path in (src, out):
        rows = {}
        with stoker.Loader(path, 10, shuffle=False, fields=fields, output="numpy",
                           return_indices=True) as L:
            for b in L:
                for k, i in enumerate(b["__index__"].tolist()):
                    rows[i] = (b["caption"][k], int(b["label"][k]), int(b["width"][k]),
                               float(b["aspect"][k]), json.dumps(b["meta"][k], sort_keys=True))
        got.append(rows)
    assert len(got[0]) == 60 and got[0] == got[1]
    man = _manifest("plain")
    for i, s in enumerate(man):
        assert got[1][i][0] == s["caption"] and got[1][i][1] == s["label"]
