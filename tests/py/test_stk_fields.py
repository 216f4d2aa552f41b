"""stoker.Writer.add(dict): samples of named fields in .stk shards (payload kind
"fields", docs/format.md). The shards are read back by a reader written here
from docs/format.md alone (every field byte-equal to what the writer was
given after its documented conversion), by `stoker info` (the fields, their
kinds and counts) and `stoker verify`, by stoker.Loader without fields (each
sample's image field and its label), and repacked by stoker.pack with every
field kept."""

import io
import json
import pathlib
import struct
import subprocess

import numpy as np
import pytest

import stoker
from conftest import stoker_bin  # noqa: E402


def _jpeg(i):
    from PIL import Image
    rng = np.random.default_rng(i)
    a = rng.integers(0, 256, (12 + i, 16 + 2 * i, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def _samples(n=17):
    out = []
    for i in range(n):
        s = {"jpg": _jpeg(i),
             "txt": f"caption {i}: naïve café 東京 😀",
             "json": {"i": i, "nested": {"a": [1, 2, {"b": "ü"}]}, "ok": True},
             "cls": i % 4,
             "score": i / 8}
        if i % 3 == 1:
            s["npy"] = np.arange(6, dtype=np.float32).reshape(2, 3) * i
        out.append(s)
    return out


def _expected_bytes(value):
    """The bytes Writer.add stores for a value (its documented conversion)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool) or isinstance(value, int):
        return str(int(value)).encode()
    if isinstance(value, float):
        return repr(value).encode()
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=False)
    return buf.getvalue()


def _read_shard(path):
    """A .stk fields shard read from docs/format.md alone: a list of
    (key, label, {field name: bytes})."""
    b = pathlib.Path(path).read_bytes()
    assert b[:8] == b"\x89STK\r\n\x1a\n"
    major, minor, flags, kind = struct.unpack_from("<HHII", b, 8)
    assert (major, kind) == (2, 3)
    foot = b[-64:]
    index_offset, count, keys_bytes, entry_size, meta_size = struct.unpack_from("<QQQII", foot)
    assert foot[56:] == b"STKEND\r\n" and entry_size == 40
    keys_at = index_offset + count * (entry_size + meta_size)
    table_at = keys_at + keys_bytes
    nfields, zero = struct.unpack_from("<II", b, table_at)
    assert zero == 0
    at = table_at + 8 + 12 * nfields
    names = []
    for k in range(nfields):
        name_len, fkind, _, samples = struct.unpack_from("<HBBQ", b, table_at + 8 + 12 * k)
        names.append(b[at:at + name_len].decode())
        at += name_len
    assert at == len(b) - 64
    out = []
    for i in range(count):
        off, length, key_len, key_off, label, _ = struct.unpack_from(
            "<QIIQqQ", b, index_offset + 40 * i)
        p = b[off:off + length]
        n, zero = struct.unpack_from("<II", p)
        assert zero == 0
        data_at = 8 + 8 * n
        fields = {}
        for k in range(n):
            fid, flen = struct.unpack_from("<II", p, 8 + 8 * k)
            fields[names[fid]] = p[data_at:data_at + flen]
            data_at += flen
        assert data_at == length
        key = b[keys_at + key_off:keys_at + key_off + key_len].decode()
        out.append((key, label, fields))
    return out


def _read_dataset(d):
    man = (pathlib.Path(d) / "stoker.manifest").read_text().splitlines()
    assert "kind fields" in man
    shards = [line.split()[1] for line in man if line.startswith("shard ")]
    return [s for name in shards for s in _read_shard(pathlib.Path(d) / name)]


def _write(out, samples, **kw):
    with stoker.Writer(out, num_classes=4, **kw) as w:
        for i, s in enumerate(samples):
            w.add(s, label=s["cls"], key=f"s{i:03d}")
    return out


def test_writer_dict_fields_byte_equal(tmp_path):
    samples = _samples()
    out = _write(tmp_path / "clip", samples, shard_size=3000)
    got = _read_dataset(out)
    assert len(got) == len(samples)
    assert len(list(out.glob("*.stk"))) > 2
    for i, (s, (key, label, fields)) in enumerate(zip(samples, got)):
        assert key == f"s{i:03d}" and label == i % 4
        assert set(fields) == set(s)
        for name, value in s.items():
            assert fields[name] == _expected_bytes(value), (i, name)
    # The .npy bytes are numpy's own: they load back as the array.
    arr = np.load(io.BytesIO(got[4][2]["npy"]))
    assert np.array_equal(arr, samples[4]["npy"]) and arr.dtype == np.float32


def test_info_verify_and_plain_loader(tmp_path):
    samples = _samples()
    out = _write(tmp_path / "clip", samples, shard_size=3000)
    exe = stoker_bin()
    if exe is not None:
        p = subprocess.run([exe, "info", str(out)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert "stk (fields payloads)" in p.stdout
        n = len(samples)
        for line in (f"field     jpg (image, by its name), {n} of {n} samples",
                     f"field     txt (text), {n} of {n} samples",
                     f"field     json (json), {n} of {n} samples",
                     f"field     cls (int), {n} of {n} samples",
                     f"field     score (float), {n} of {n} samples",
                     f"field     npy (npy), 6 of {n} samples"):
            assert line in p.stdout, p.stdout
        p = subprocess.run([exe, "verify", str(out)], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"{n} samples checked, 0 corrupt" in p.stdout
    # Without fields a sample is its image field and its label.
    with stoker.Loader(out, 5, shuffle=False, output="numpy", transform=None) as L:
        got = [(bytes(x), int(y)) for batch in L for x, y in zip(*batch)]
    assert got == [(s["jpg"], s["cls"]) for s in samples]


def test_pack_keeps_every_field(tmp_path):
    samples = _samples(9)
    src = _write(tmp_path / "clip", samples)
    r = stoker.pack(src, tmp_path / "again", threads=2, shard_size=2000)
    assert r["samples"] == 9 and r["payload"] == "fields"
    assert [f for _, _, f in _read_dataset(tmp_path / "again")] == \
        [f for _, _, f in _read_dataset(src)]
    with pytest.raises(ValueError, match="samples have fields"):
        stoker.pack(src, tmp_path / "resized", max_side=8)


def test_writer_dict_refusals(tmp_path):
    with stoker.Writer(tmp_path / "a") as w:
        w.add({"txt": "x"})
        with pytest.raises(TypeError, match="none of bytes, str"):
            w.add({"txt": object()})
        with pytest.raises(ValueError, match="field name"):
            w.add({"a,b": "x"})
        with pytest.raises(ValueError, match="is json here and was text"):
            w.add({"txt": ["a"]})
        with pytest.raises(stoker.Error, match="one layout"):
            w.add(b"plain bytes")
    with stoker.Writer(tmp_path / "b") as w:
        w.add(b"plain bytes")
        with pytest.raises(stoker.Error, match="one layout"):
            w.add({"txt": "x"})
