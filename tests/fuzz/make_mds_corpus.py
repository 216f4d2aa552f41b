#!/usr/bin/python3
"""Writes the seed corpus of fuzz_mds (tests/fuzz/corpus/mds/) from the MDS
fixtures written by MosaicML Streaming's MDSWriter (../shared/fixtures/mds):
each seed is a u32 length, index.json, then the bytes of the index's first
shard (fuzz_mds.c). The seeds keep a fixture shard's header and first
records (zstd ones decompressed) under an index that says that many
samples, so they stay small (libFuzzer's inputs are at most 64 KiB)."""
import json, os, struct, subprocess, sys

fx = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../shared/fixtures/mds")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus/mds")
os.makedirs(out, exist_ok=True)

def seed(name, index, shard):
    text = json.dumps(index, sort_keys=True).encode()
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<I", len(text)) + text + shard)

def shrink(shard, keep):
    """The shard's first `keep` records, with a count and offsets table that say so."""
    n = struct.unpack_from("<I", shard)[0]
    offs = struct.unpack_from("<%dI" % (n + 1), shard, 4)
    config = shard[4 + 4 * (n + 1):offs[0]]
    head = 4 + 4 * (keep + 1) + len(config)
    recs = [shard[offs[k]:offs[k + 1]] for k in range(keep)]
    new = [head]
    for r in recs:
        new.append(new[-1] + len(r))
    return struct.pack("<I", keep) + struct.pack("<%dI" % (keep + 1), *new) + config + b"".join(recs)

for v in ("plain", "jpeg", "zstd"):
    index = json.load(open(os.path.join(fx, v, "index.json")))
    sh = index["shards"][0]
    if sh["zip_data"]:
        raw = subprocess.run(["zstd", "-dc", os.path.join(fx, v, sh["zip_data"]["basename"])],
                             check=True, capture_output=True).stdout
    else:
        raw = open(os.path.join(fx, v, sh["raw_data"]["basename"]), "rb").read()
    seed("%s-one" % v, dict(index, shards=[dict(sh, samples=1)]), shrink(raw, 1))
    if v == "plain":
        seed("%s-two" % v, dict(index, shards=[dict(sh, samples=2)]), shrink(raw, 2))
