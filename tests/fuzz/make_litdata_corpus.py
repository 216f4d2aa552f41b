#!/usr/bin/python3
"""Writes the seed corpus of fuzz_litdata (tests/fuzz/corpus/litdata/) from
the LitData fixtures written by litdata's optimize()
(../shared/fixtures/litdata): each seed is a u32 length, index.json, then
the bytes of the index's first chunk (fuzz_litdata.c). The seeds keep a
fixture chunk's header and first items (zstd ones decompressed) under an
index that says that many items, so they stay small (libFuzzer's inputs are
at most 64 KiB)."""
import json, os, struct, subprocess, sys

fx = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../shared/fixtures/litdata")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus/litdata")
os.makedirs(out, exist_ok=True)

def seed(name, index, chunk):
    text = json.dumps(index, sort_keys=True).encode()
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<I", len(text)) + text + chunk)

def shrink(chunk, keep):
    """The chunk's first `keep` items, with a count and offsets table that say so."""
    n = struct.unpack_from("<I", chunk)[0]
    offs = struct.unpack_from("<%dI" % (n + 1), chunk, 4)
    head = 4 + 4 * (keep + 1)
    items = [chunk[offs[k]:offs[k + 1]] for k in range(keep)]
    new = [head]
    for it in items:
        new.append(new[-1] + len(it))
    return struct.pack("<I", keep) + struct.pack("<%dI" % (keep + 1), *new) + b"".join(items)

for v in ("plain", "jpeg", "zstd"):
    index = json.load(open(os.path.join(fx, v, "index.json")))
    ch = index["chunks"][0]
    path = os.path.join(fx, v, ch["filename"])
    if index["config"]["compression"]:
        raw = subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
    else:
        raw = open(path, "rb").read()
    # The seeds' index is read uncompressed (the fuzz input holds the chunk
    # as decompressed).
    cfg = dict(index["config"], compression=None)
    for keep in ((1, 2) if v == "plain" else (1,)):
        small = shrink(raw, keep)
        seed("%s-%d" % (v, keep), dict(index, config=cfg,
             chunks=[dict(ch, chunk_size=keep, chunk_bytes=len(small))]), small)
    if v == "plain":
        # No data_spec: the leaves are leaf_0.. (a sample that is no dict).
        small = shrink(raw, 1)
        seed("plain-nospec", dict(index, config=dict(cfg, data_spec=None),
             chunks=[dict(ch, chunk_size=1, chunk_bytes=len(small))]), small)
