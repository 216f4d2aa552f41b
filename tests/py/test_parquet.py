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
import warnings
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
    for pkg in ("parquet-wasm", "apache-arrow"):
        if not (NODE_MODULES / pkg).is_dir():
            pytest.fail(f"{pkg} is not installed in {NODE_MODULES} (run scripts/install-deps.sh)")
    out = tmp_path_factory.mktemp("pq")
    subprocess.run([node, str(ROOT / "tests" / "py" / "write_parquet_duckdb.js"), str(NODE_MODULES),
                    str(out)], check=True, timeout=300)
    subprocess.run([node, str(ROOT / "tests" / "py" / "write_parquet_arrow.js"), str(NODE_MODULES),
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


# ---- Lists (HF's Sequence(Image()): list<struct<bytes, path>>) ----------------------

LIST_VARIANTS = ["lists_v1", "lists_v2", "arrow_v1", "arrow_v2"]
MAXLEN = 6  # the writer's longest list is 5 elements: element 5 is always missing


def _list_fields(nums):
    f = {"id": "id"}
    for j in range(MAXLEN):
        f[f"img{j}"] = stoker.Field(f"images[{j}]", kind="bytes", optional=True)
        f[f"path{j}"] = stoker.Field(f"images[{j}].path", optional=True)
        f[f"tag{j}"] = stoker.Field(f"tags[{j}]", optional=True)
        if nums:
            f[f"num{j}"] = stoker.Field(f"nums[{j}]", optional=True)
    return f


def _element(lst, j):
    return lst[j] if lst is not None and j < len(lst) else None


def _varint(b, p):
    r = s = 0
    while True:
        x = b[p]
        p += 1
        r |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return r, p


def _thrift(b, p, t):
    """A Thrift compact value of type t at p: (value, next position)."""
    if t in (1, 2):
        return t == 1, p
    if t == 3:
        return b[p], p + 1
    if t in (4, 5, 6):
        z, p = _varint(b, p)
        return (z >> 1) ^ -(z & 1), p
    if t == 7:
        return None, p + 8
    if t == 8:
        n, p = _varint(b, p)
        return bytes(b[p:p + n]), p + n
    if t in (9, 10):
        h = b[p]
        p += 1
        n = h >> 4
        if n == 15:
            n, p = _varint(b, p)
        out = []
        for _ in range(n):
            v, p = _thrift(b, p, h & 15)
            out.append(v)
        return out, p
    if t == 12:
        out, last = {}, 0
        while True:
            h = b[p]
            p += 1
            if h == 0:
                return out, p
            ft, d = h & 15, h >> 4
            if d:
                fid = last + d
            else:
                z, p = _varint(b, p)
                fid = (z >> 1) ^ -(z & 1)
            last = fid
            out[fid], p = _thrift(b, p, ft)
    raise ValueError(f"thrift type {t}")


def _list_chunk_pages(file, column):
    """Data pages of each of column's chunks (its dotted path_in_schema),
    walked from the file's own footer: FileMetaData 4 row_groups, RowGroup 1
    columns, ColumnChunk 3 meta_data (3 path, 7 compressed size, 9 data and
    11 dictionary page offsets); PageHeader 1 type, 3 compressed size."""
    b = pathlib.Path(file).read_bytes()
    flen = int.from_bytes(b[-8:-4], "little")
    meta, _ = _thrift(b, len(b) - 8 - flen, 12)
    counts = []
    for rg in meta[4]:
        for cc in rg[1]:
            m = cc[3]
            if ".".join(x.decode() for x in m[3]) != column:
                continue
            p = m.get(11) or m[9]
            end, pages = p + m[7], 0
            while p < end:
                h, p = _thrift(b, p, 12)
                pages += h[1] in (0, 3)
                p += h[3]
            counts.append(pages)
    return counts


@pytest.mark.parametrize("name", LIST_VARIANTS)
def test_every_element_of_every_list(written, name):
    """images[j] (the element struct's bytes), images[j].path, tags[j] and
    nums[j] of every row, against the writer's own table: a null list, an empty
    one, a shorter one, a null element or a null member is a missing field."""
    rows = _expected(written, name)["rows"]
    seen = []
    with stoker.Loader(str(written / name), 97, fields=_list_fields("nums" in rows[0]), threads=3, seed=2,
                       return_indices=True, output="numpy") as L:
        for b in L:
            for s, i in enumerate(b["__index__"].tolist()):
                w = rows[i]
                assert int(b["id"][s]) == int(w["id"])
                for j in range(MAXLEN):
                    e = _element(w["images"], j)
                    img = b[f"img{j}"][s]
                    assert (None if img is None else bytes(img).hex().upper()) == \
                        (e and e["hex"]), (i, j)
                    assert b[f"path{j}"][s] == (e and e["path"])
                    assert bool(b[f"img{j}_present"][s]) == (e is not None and e["hex"] is not None)
                    assert b[f"tag{j}"][s] == _element(w["tags"], j)
                    if "nums" not in w:
                        continue
                    n = _element(w["nums"], j)
                    assert bool(b[f"num{j}_present"][s]) == (n is not None)
                    if n is not None:
                        assert int(b[f"num{j}"][s]) == n
                seen.append(i)
    assert sorted(seen) == list(range(len(rows)))


def test_the_list_files_have_the_layouts_this_test_is_about(written):
    """Guards the test: empty, null and long lists, null elements, and list
    columns whose rows span several pages, in several row groups."""
    for name in LIST_VARIANTS:
        exp = _expected(written, name)
        lens = [len(w["images"]) for w in exp["rows"] if w["images"] is not None]
        assert 0 in lens and max(lens) >= 4
        assert any(w["images"] is None for w in exp["rows"])
        assert any(e is None for w in exp["rows"] if w["images"] for e in w["images"])
        assert any(w["tags"] and None in w["tags"] for w in exp["rows"])
        # Several row groups, and (Arrow's writer, small pages) rows whose
        # lists lie in many pages.
        files = sorted((written / name).glob("*.parquet"))
        pages = [n for f in files for n in _list_chunk_pages(f, "images.list.element.bytes")]
        assert len(pages) >= 2, name
        if name == "arrow_v1":
            assert min(pages) >= 5, (name, pages)


def test_a_missing_element_is_a_sample_error(written):
    """Required, a row whose list is shorter (or null) is a sample error
    naming the row and the field; optional, it is None."""
    with stoker.Loader(str(written / "lists_v1"), 64, fields={"first": "images[0]"},
                       shuffle=False, threads=1) as L:
        with pytest.raises(stoker.SampleError) as ei:
            next(iter(L))
        assert ei.value.field == "first" and "part-00000.parquet#0" in ei.value.path


def test_list_fields_in_the_description(written):
    """stoker info lists each list column once, as NAME[] (an element's
    kind); a name that is not an element of a list is refused at open."""
    exe = os.environ.get("STOKER_BIN") or str(ROOT / "build" / "release" / "stoker")
    if not os.access(exe, os.X_OK):
        pytest.skip("no stoker binary (build it or set STOKER_BIN)")
    out = subprocess.run([exe, "info", str(written / "lists_v2")], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    kinds = {ln.split()[1]: ln.split()[2] for ln in out.splitlines() if ln.startswith("field ")}
    assert kinds["images[]"] == "image" and kinds["images[].path"] == "text"
    assert "tags[]" in kinds and "nums[]" in kinds
    for bad in ("images[x]", "images[1", "tags[0].path", "nope[0]"):
        with pytest.raises(ValueError, match="no field"):
            stoker.Loader(str(written / "lists_v2"), 4, fields={"a": bad})


def test_lists_in_a_mixture(written):
    """A mixture of a DuckDB and an Arrow list file resolves images[j],
    images[j].path and tags[j] through each source: every element of every
    sample against its own writer's table. A source without the list fails
    the open naming the source and the field; asked as optional, its samples
    give None."""
    names = ["lists_v1", "arrow_v2"]
    rows = [{int(w["id"]): w for w in _expected(written, n)["rows"]} for n in names]
    fields = dict(_list_fields(False), source="source")
    seen = []
    with stoker.Loader([stoker.Source(written / n) for n in names], 61, fields=fields, threads=2,
                       seed=5, output="numpy") as L:
        for b in L:
            for s in range(len(b["id"])):
                src, i = int(b["source"][s]), int(b["id"][s])
                w = rows[src][i]
                for j in range(MAXLEN):
                    e = _element(w["images"], j)
                    img = b[f"img{j}"][s]
                    assert (None if img is None else bytes(img).hex().upper()) == \
                        (e and e["hex"]), (src, i, j)
                    assert b[f"path{j}"][s] == (e and e["path"])
                    assert b[f"tag{j}"][s] == _element(w["tags"], j)
                seen.append((src, i))
    assert sorted(seen) == [(k, i) for k in range(2) for i in sorted(rows[k])]

    plain = written / "v1_snappy"  # DuckDB's table without lists
    with pytest.raises(ValueError, match=r"field 'first'.*mixture source 1.*v1_snappy"):
        stoker.Loader([stoker.Source(written / "lists_v1"), stoker.Source(plain)], 8,
                      fields={"id": "id", "first": "images[0]"})
    fields = {"id": "id", "source": "source",
              "first": stoker.Field("images[0].path", optional=True)}
    got = {0: 0, 1: 0}
    with stoker.Loader([stoker.Source(written / "lists_v1"), stoker.Source(plain)], 50,
                       fields=fields, output="numpy") as L:
        for b in L:
            for s in range(len(b["id"])):
                src, i = int(b["source"][s]), int(b["id"][s])
                got[src] += 1
                want = None if src else _element(rows[0][i]["images"], 0)
                assert b["first"][s] == (want and want["path"]), (src, i)
    assert got[0] == len(rows[0]) and got[1] > 0


def test_lists_of_real_images_are_decoded_and_transformed(tmp_path):
    """HF's Sequence(Image()) written by DuckDB from real PNG and JPEG files:
    images[0] and images[1] are image fields, each with its own transform;
    a row with one image lacks the optional second (zeros, present False)."""
    from PIL import Image
    node = os.environ.get("STK_NODE") or shutil.which("node")
    if not node or not (NODE_MODULES / "@duckdb" / "node-api").is_dir():
        pytest.skip("no node / DuckDB's npm package (run scripts/install-deps.sh)")
    import io
    pics = []
    for k in range(6):
        im = Image.new("RGB", (40 + 8 * k, 30 + 4 * k), (40 * k, 255 - 30 * k, 90))
        buf = io.BytesIO()
        im.save(buf, "PNG" if k % 2 else "JPEG")
        pics.append(buf.getvalue().hex())
    # Row r holds images 2r and 2r + 1; row 2 only image 4.
    lists = ["[" + ", ".join(f"{{'bytes': unhex('{pics[j]}'), 'path': 'p{j}'}}"
                             for j in ((2 * r, 2 * r + 1) if r < 2 else (4,))) + "]"
             for r in range(3)]
    sql = " UNION ALL ".join(f"SELECT {r} AS id, {lst} AS images" for r, lst in enumerate(lists))
    out = tmp_path / "seq.parquet"
    js = (f"const {{ DuckDBInstance }} = require({json.dumps(str(NODE_MODULES / '@duckdb' / 'node-api'))});"
          f"(async () => {{ const c = await (await DuckDBInstance.create(':memory:')).connect();"
          f"await c.run({json.dumps(f'COPY ({sql}) TO {chr(39)}{out}{chr(39)} (FORMAT parquet)')}); }})()"
          f".catch((e) => {{ console.error(e); process.exit(1); }});")
    subprocess.run([node, "-e", js], check=True, timeout=120)
    fields = {"id": "id", "first": ("images[0]", "image"),
              "second": stoker.Field("images[1]", kind="image", optional=True)}
    tf = {"first": stoker.transforms.Resize((16, 16)), "second": stoker.transforms.Resize((8, 12))}
    with stoker.Loader(str(out), 3, fields=fields, transform=tf, shuffle=False, output="numpy",
                       threads=2) as L:
        b = next(iter(L))
    assert b["id"].tolist() == [0, 1, 2]
    assert b["first"].shape == (3, 3, 16, 16)
    assert list(b["second_present"]) == [True, True, False]
    for r in range(3):
        ref = np.asarray(Image.open(io.BytesIO(bytes.fromhex(pics[2 * r]))).convert("RGB"))
        # A flat colour survives the resize: the decoded pixels are the file's.
        assert np.abs(b["first"][r].transpose(1, 2, 0)[8, 8].astype(int) - ref[5, 5]).max() <= 3
    # A fixed-size image field: zeros where the row lacks it.
    assert b["second"].shape == (3, 3, 8, 12) and not b["second"][2].any() and b["second"][1].any()


def _duckdb(sql):
    """Runs sql in DuckDB (its npm package): the real writer of these files."""
    node = os.environ.get("STK_NODE") or shutil.which("node")
    if not node or not (NODE_MODULES / "@duckdb" / "node-api").is_dir():
        pytest.skip("no node / DuckDB's npm package (run scripts/install-deps.sh)")
    js = (f"const {{ DuckDBInstance }} = require({json.dumps(str(NODE_MODULES / '@duckdb' / 'node-api'))});"
          f"(async () => {{ const c = await (await DuckDBInstance.create(':memory:')).connect();"
          f"await c.run({json.dumps(sql)}); }})().catch((e) => {{ console.error(e); process.exit(1); }});")
    subprocess.run([node, "-e", js], check=True, timeout=120)


def test_verify_checks_every_list_element(tmp_path):
    """stoker verify reads every element of every list: a list of real PNG and
    JPEG files passes; an element that is no image, and a list column whose
    page does not decode, are each reported naming the file, the row and the
    field, and verify exits 1."""
    import io
    from PIL import Image
    exe = os.environ.get("STOKER_BIN") or str(ROOT / "build" / "release" / "stoker")
    if not os.access(exe, os.X_OK):
        pytest.skip("no stoker binary (build it or set STOKER_BIN)")
    pics = []
    for k in range(5):
        buf = io.BytesIO()
        Image.new("RGB", (24 + 4 * k, 16 + 2 * k), (50 * k, 90, 200 - 30 * k)).save(
            buf, "PNG" if k % 2 else "JPEG")
        pics.append(buf.getvalue().hex())

    def write(name, bad_hex=None):
        lists = []
        for r in range(3):
            hexes = [pics[(r + j) % 5] for j in range(r + 1)]
            if bad_hex and r == 1:
                hexes[1] = bad_hex
            lists.append("[" + ", ".join(f"{{'bytes': unhex('{h}'), 'path': 'p{j}'}}"
                                         for j, h in enumerate(hexes)) + "]")
        sql = " UNION ALL ".join(f"SELECT {r} AS id, {lst} AS images, ['t{r}', 'u{r}'] AS tags"
                                 for r, lst in enumerate(lists))
        out = tmp_path / name
        _duckdb(f"COPY ({sql} ORDER BY id) TO '{out}' (FORMAT parquet, COMPRESSION snappy)")
        return out

    def verify(path):
        p = subprocess.run([exe, "verify", str(path)], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout

    good = write("good.parquet")
    rc, out = verify(good)
    assert rc == 0 and "3 samples checked, 0 corrupt" in out, out

    rc, out = verify(write("bad.parquet", bad_hex="00112233445566778899"))
    bad = [ln for ln in out.splitlines() if ln.startswith("corrupt")]
    assert rc == 1 and len(bad) == 1, out
    assert "bad.parquet#1: field 'images[1]': not an image" in bad[0], out

    # The tags list's data page, its snappy body overwritten: every row of
    # the row group fails, naming the list.
    b = bytearray(good.read_bytes())
    flen = int.from_bytes(b[-8:-4], "little")
    meta, _ = _thrift(b, len(b) - 8 - flen, 12)
    (m,) = [cc[3] for cc in meta[4][0][1]
            if ".".join(x.decode() for x in cc[3][3]) == "tags.list.element"]
    h, p = _thrift(b, m[9], 12)
    assert h[1] == 0 and m[4] == 1, (h, m[4])  # a v1 data page, snappy
    b[p:p + h[3]] = b"\xff" * h[3]
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(b))
    rc, out = verify(damaged)
    bad = [ln for ln in out.splitlines() if ln.startswith("corrupt")]
    assert rc == 1 and len(bad) == 3, out
    for r in range(3):
        assert f"damaged.parquet#{r}: field 'tags[]': " in bad[r], out


def test_hf_audio_struct_is_no_image(tmp_path):
    """A {bytes, path} struct that the file's "huggingface" metadata calls
    Audio (or a Sequence of Audio) is bytes, not an image: stoker verify
    passes the file, and a loader gives the WAV bytes as stored. The same
    struct with Image metadata stays an image (a bad one is reported)."""
    import stoker
    exe = os.environ.get("STOKER_BIN") or str(ROOT / "build" / "release" / "stoker")
    if not os.access(exe, os.X_OK):
        pytest.skip("no stoker binary (build it or set STOKER_BIN)")
    wav = ("52494646" "24000000" "57415645" "666d7420" "10000000"
           "0100010044ac000088580100020010006461746100000000")

    def write(name, features):
        hf = json.dumps({"info": {"features": features}}).replace("'", "''")
        out = tmp_path / name
        _duckdb(f"COPY (SELECT {{'bytes': unhex('{wav}'), 'path': 'a.wav'}} AS audio, "
                f"[{{'bytes': unhex('{wav}'), 'path': 'b.wav'}}] AS clips, 'hi' AS text "
                f"FROM range(3)) TO '{out}' (FORMAT parquet, KV_METADATA {{huggingface: '{hf}'}})")
        return out

    audio = write("audio.parquet", {"audio": {"_type": "Audio"},
                                    "clips": {"_type": "Sequence", "feature": {"_type": "Audio"}},
                                    "text": {"dtype": "string", "_type": "Value"}})
    p = subprocess.run([exe, "verify", str(audio)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "3 samples checked, 0 corrupt" in p.stdout, p.stdout
    loader = stoker.Loader(str(audio), 3, fields={"audio": "audio", "clip": "clips[0]"},
                           shuffle=False)
    b = next(iter(loader))
    assert [bytes(x) for x in b["audio"]] == [bytes.fromhex(wav)] * 3
    assert [bytes(x) for x in b["clip"]] == [bytes.fromhex(wav)] * 3
    loader.close()

    image = write("image.parquet", {"audio": {"_type": "Image"}, "clips": [{"_type": "Image"}]})
    p = subprocess.run([exe, "verify", str(image)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "field 'audio': not an image" in p.stdout, p.stdout


def test_a_shuffle_larger_than_the_page_cache_is_warned(tmp_path, capfd):
    """A global shuffle over more stored bytes than the 64 MiB page cache,
    with pages of many rows, decodes a page per row: each open says so once,
    with the order to use; shard order with a window that fits, and no
    shuffle, are not warned."""
    node = os.environ.get("STK_NODE") or shutil.which("node")
    if not node or not (NODE_MODULES / "@duckdb" / "node-api").is_dir():
        pytest.skip("no node / DuckDB's npm package (run scripts/install-deps.sh)")
    out = tmp_path / "big.parquet"
    sql = (f"COPY (SELECT i AS id, {{'bytes': unhex(repeat(md5(i::VARCHAR), 1500)), "
           f"'path': 'p' || i}} AS image FROM range(3000) r(i)) TO '{out}' "
           f"(FORMAT parquet, COMPRESSION uncompressed, ROW_GROUP_SIZE 2048)")
    js = (f"const {{ DuckDBInstance }} = require({json.dumps(str(NODE_MODULES / '@duckdb' / 'node-api'))});"
          f"(async () => {{ const c = await (await DuckDBInstance.create(':memory:')).connect();"
          f"await c.run({json.dumps(sql)}); }})().catch((e) => {{ console.error(e); process.exit(1); }});")
    subprocess.run([node, "-e", js], check=True, timeout=120)
    fields = {"image": ("image", "bytes")}

    def warned(**kw):
        """The open's warnings, as Python warnings (stoker.StokerWarning);
        nothing may reach stderr."""
        capfd.readouterr()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            stoker.Loader(str(out), 8, fields=fields, **kw).close()
        assert capfd.readouterr().err == ""
        msgs = [str(w.message) for w in got if issubclass(w.category, stoker.StokerWarning)]
        assert len(msgs) <= 1, msgs
        return msgs[0] if msgs else ""

    err = warned()
    assert "global shuffle" in err
    # Each open warns: a second loader on the same dataset too.
    assert warned() == err
    assert 'order="shards" with shard_window 1' in err and "big.parquet" in err
    err = warned(order="shards")                      # 8 row groups of up to 47 MiB
    assert "shuffle in shards" in err and "use shard_window 1" in err
    assert warned(order="shards", shard_window=1) == ""
    assert warned(shuffle=False) == ""
    fields = {"id": "id"}                             # the small column fits
    assert warned() == ""
    out.unlink()
