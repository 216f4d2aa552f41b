"""Parquet files read in place through stoker.Loader(fields=...) (issue 21;
reader src/source/parquet.c, docs/formats.md): files written at test time by
DuckDB's own Parquet writer (npm @duckdb/node-api, installed into build/node
by scripts/install-deps.sh; tests/py/write_parquet_duckdb.js), in the layouts
the fixtures lack -- many row groups, several files, dictionary-encoded
columns, nulls (values and whole structs), data page v2 with its DELTA and
BYTE_STREAM_SPLIT encodings, gzip, snappy, zstd, uncompressed, 3 MB binary
values -- every field of every row compared with what DuckDB's table held.
The fixtures (../shared/fixtures/parquet) are compared byte for byte in
tests/c/test_parquet.c."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import stoker

ROOT = pathlib.Path(__file__).resolve().parents[1].parent
NODE_MODULES = pathlib.Path(os.environ.get("STK_NODE_MODULES", ROOT / "build" / "node" / "node_modules"))
VARIANTS = ["v1_snappy", "v2_zstd", "v2_snappy", "v1_gzip", "v2_uncompressed"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    node = os.environ.get("STK_NODE") or shutil.which("node")
    if not node:
        pytest.skip("no node on PATH: the Parquet files of this test are written by DuckDB's "
                    "npm package (run scripts/install-deps.sh)")
    if not (NODE_MODULES / "@duckdb" / "node-api").is_dir():
        pytest.fail(f"@duckdb/node-api is not installed in {NODE_MODULES} (run scripts/install-deps.sh)")
    out = tmp_path_factory.mktemp("pq")
    subprocess.run([node, str(ROOT / "tests" / "py" / "write_parquet_duckdb.js"), str(NODE_MODULES),
                    str(out)], check=True, timeout=300)
    return out


def _expected(out, name):
    return json.loads((out / f"{name}.expected.json").read_text())


FIELDS = {
    "id": "id", "label": "label", "cat": "cat",
    "note": stoker.Field("note", optional=True),
    "image": stoker.Field("image", kind="bytes", optional=True),
    "image_path": stoker.Field("image.path", optional=True),
    "flag": "flag", "f": "f",
    "score": stoker.Field("score", optional=True),
    "small": "small", "u": "u", "data": "data",
}


def _check_row(b, s, w):
    assert int(b["id"][s]) == int(w["id"])
    assert int(b["label"][s]) == w["label"]
    assert b["cat"][s] == w["cat"]
    assert b["note"][s] == w["note"]                      # None where null
    img = b["image"][s]
    assert (None if img is None else bytes(img).hex().upper()) == w["image_hex"]
    assert b["image_path"][s] == w["image_path"]          # None where the struct is null
    assert int(b["flag"][s]) == w["flag"]
    assert float(b["f"][s]) == np.float32(w["f"])
    if w["score"] is None:
        assert not bool(b["score_present"][s])
    else:
        assert bool(b["score_present"][s]) and float(b["score"][s]) == np.float32(w["score"])
    assert int(b["small"][s]) == w["small"]
    assert int(b["u"][s]) == w["u"]                       # unsigned, past 2^31
    assert bytes(b["data"][s]).hex().upper() == w["data_hex"]


@pytest.mark.parametrize("name", VARIANTS)
def test_every_field_of_every_row(written, name):
    exp = _expected(written, name)
    rows = exp["rows"]
    seen = []
    with stoker.Loader(str(written / name), 128, fields=FIELDS, threads=3, seed=5,
                       return_indices=True, output="numpy") as L:
        for b in L:
            for s, i in enumerate(b["__index__"].tolist()):
                _check_row(b, s, rows[i])
                seen.append(i)
    assert sorted(seen) == list(range(len(rows)))


def test_the_files_have_the_layouts_this_test_is_about(written):
    """Guards the test itself: DuckDB wrote dictionaries, v2's encodings,
    several row groups and the codecs asked for."""
    assert "PLAIN_DICTIONARY" in _expected(written, "v1_snappy")["encodings"]
    assert "RLE_DICTIONARY" in _expected(written, "v2_zstd")["encodings"]
    v2 = set(_expected(written, "v2_zstd")["encodings"])
    assert {"DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "BYTE_STREAM_SPLIT"} <= v2
    assert _expected(written, "v1_snappy")["row_groups"] == 3       # 2048 + 952, 1300
    assert _expected(written, "v2_zstd")["row_groups"] == 3


def test_threads_give_the_same_batches(written):
    def run(threads):
        out = []
        with stoker.Loader(str(written / "v2_zstd"), 100, fields=FIELDS, threads=threads, seed=9,
                           return_indices=True, output="numpy") as L:
            for b in L:
                out.append((b["__index__"].tolist(), [bytes(x) for x in b["data"]], b["note"]))
        return out
    assert run(1) == run(3)


def test_large_binary_values(written):
    rows = _expected(written, "big")["rows"]
    seen = 0
    with stoker.Loader(str(written / "big"), 2, fields={"tag": "tag", "blob": "blob", "id": "id"},
                       return_indices=True, output="numpy", threads=2) as L:
        for b in L:
            for s, i in enumerate(b["__index__"].tolist()):
                w = rows[i]
                blob = bytes(b["blob"][s])
                assert len(blob) == int(w["nbytes"]) and len(blob) > 3_000_000
                assert hashlib.sha256(blob).hexdigest() == w["sha256"]
                assert b["tag"][s] == w["tag"] and int(b["id"][s]) == int(w["id"])
                seen += 1
    assert seen == 3


def test_a_null_in_a_required_field(written):
    """A null value is a field the sample lacks: required, the sample is an
    error naming the file and row; under skip the others are delivered."""
    rows = _expected(written, "v1_gzip")["rows"]
    with stoker.Loader(str(written / "v1_gzip"), 4000, fields={"note": "note"}, shuffle=False,
                       threads=1) as L:
        with pytest.raises(stoker.SampleError) as ei:
            next(iter(L))
        assert ei.value.field == "note" and "part-00000.parquet#0" in ei.value.path
    got = 0
    with stoker.Loader(str(written / "v1_gzip"), 500, fields={"note": "note", "id": "id"},
                       on_error="skip", threads=2, return_indices=True, output="numpy") as L:
        for b in L:
            for s, i in enumerate(b["__index__"].tolist()):
                assert b["note"][s] == rows[i]["note"]
                got += 1
        errs = L.stats()["errors"]
    want = sum(r["note"] is not None for r in rows)
    assert got == want and len(errs) > 0
    assert "has no field 'note'" in errs[0]["reason"]
