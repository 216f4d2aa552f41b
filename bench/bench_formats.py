#!/usr/bin/python3
"""Other loaders' formats read in place, side by side in one run: stoker.Loader
on each format against the usual Python way of reading that format, and
against stoker's own .stk.

    /usr/bin/python3 bench/bench_formats.py [--quick] [--repeat 3] [--epochs 2]

The data: the same photos (data/bench-web: 2000 JPEGs, ~400x350, quality 85-90,
~28 KB, 10 classes, made by scripts/make-dataset.py from Debian's
mate-backgrounds when missing) stored seven ways, in one shuffled order (seed 0)
of the photos for every format but the folder, each JPEG byte for byte and its
class as an int64 label:

  folder    the ImageFolder tree itself
  stk       `stoker pack` of the folder
  tar       WebDataset shards (4 x 500 samples: KEY.jpg, KEY.cls), by tarfile
  mds       MosaicML Streaming MDS (index.json + shard.NNNNN.mds, columns image:
            jpeg, label: int, size_limit a quarter of the data: 4 shards)
  litdata   LitData (index.json + chunk-0-K.bin, PyTreeLoader, {"image": jpeg,
            "label": int}, chunk_bytes a quarter of the data: 4 chunks)
  parquet   Hugging Face datasets' layout (image: struct<bytes: binary, path:
            string>, label: int64), snappy, 4 files x 500 rows in row groups of
            100 (datasets' row-group size for image datasets), written by DuckDB
            (npm @duckdb/node-api, installed into build/node)
  tfrecord  tf.train.Example records (image/encoded, image/format,
            image/class/label), 4 files x 500, masked CRC32C framing

Neither mosaicml-streaming, litdata, pyarrow nor tensorflow is installable here
(no PyPI), so the MDS and LitData sets are written by the small writers below in
exactly the layout of the real writers' files in /work/shared/fixtures (stoker's
readers are tested against those fixtures, which the real writers made), and
the TFRecord set by a small writer of the spec's framing and example.proto's
fields. The made formats are kept under data/bench-formats/ and reused.

The two sides, for each format (imagenet-train: RandomResizedCrop(224) +
RandomHorizontalFlip, uint8 NCHW, batch 64, int64 labels):

  - stoker: stoker.Loader(PATH, 64, threads=2, transform=T.Compose(
    [T.RandomResizedCrop(224), T.RandomHorizontalFlip()])) -- the path as it
    is, no fields= (every format gives one image and its label by itself).
  - Python: a torch DataLoader (2 workers, persistent, batch 64) over the
    format's usual Python reader, decoding with PIL and applying torchvision's
    RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor:
      folder    torchvision.datasets.ImageFolder (map-style, shuffle=True)
      stk       none: no Python reader of .stk exists besides stoker ("-")
      tar       an IterableDataset over `tarfile` (webdataset's recipe: shards
                shuffled and split among workers, a shuffle buffer)
      mds       a map-style Dataset reading index.json and each shard's offsets
                table, a sample by one read (as StreamingDataset's reader does)
      litdata   the same over index.json and each chunk's header
      parquet   an IterableDataset over row groups (as `datasets` streaming or
                pyarrow's iter_batches): a pure-Python Parquet reader (footer,
                Thrift compact metadata, PLAIN and dictionary pages, definition
                levels) with Debian's python3-snappy for the pages; row groups
                shuffled and split among workers, a shuffle buffer
      tfrecord  an IterableDataset over the record framing with a minimal
                protobuf parse of tf.train.Example (as tf.data's
                TFRecordDataset + shuffle(buffer), or the `tfrecord` package);
                it does not check the CRCs (a pure-Python CRC32C would cost
                more than the decode: the `tfrecord` package skips them too),
                while stoker checks both on every read
    The shuffle buffer of the iterable readers is --shuffle-buffer undecoded
    samples a worker (default 1000).

Each configuration runs in its own process, --repeat times, interleaved, and
the best run counts (the machine is shared; the best run is the least
disturbed). The clock covers what a user waits for: from before the loader is
made (the DataLoader's workers started, stoker's open: listing, indexes,
footers) to the last batch of --epochs epochs; imports are done before it. The
page cache is warmed once before all runs. Every run checks its first batch
(a uint8 (64, 3, 224, 224) tensor, int64 labels) and that each epoch delivered
every sample once (the count and the labels' sum).

It also counts each run's CPU time (user + system of its whole process tree,
the DataLoader's workers included, imports left out) a sample, median of the
runs: on a shared machine that moves far less than samples/s.

Prints one table: format, stoker samples/s, Python samples/s, stoker/Python,
stoker/.stk, CPU ms a sample of both sides. Issue 21's targets: every in-place format within 10 % of stoker's
.stk, and >= 4x the Python reader.

When stoker cannot open a format (Parquet before its reader is merged), or the
Parquet set cannot be written (no DuckDB in build/node), that row says so and
the rest runs. --quick: 200 photos (data/bench-formats-quick), 1 epoch, 1 run,
to check the script end to end (its figures mean little).
--check-fixtures: read /work/shared/fixtures (written by the formats' own
writers) with this script's Python readers and compare every image and label
with the manifests, to show they read the real layouts.
"""
import argparse
import io
import json
import os
import random
import resource
import struct
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STOKER = os.path.join(ROOT, "build", "release", "stoker")
NODE_MODULES = os.path.join(ROOT, "build", "node", "node_modules")
FIXTURES = [os.path.join(ROOT, "..", "shared", "fixtures"),
            os.path.join(ROOT, "..", "..", "shared", "fixtures"), "/work/shared/fixtures"]

FORMATS = ["folder", "stk", "tar", "mds", "litdata", "parquet", "tfrecord"]
PYTHON_READER = {
    "folder": "torchvision ImageFolder",
    "stk": "-",
    "tar": "tarfile IterableDataset",
    "mds": "MDS map-style (offsets)",
    "litdata": "LitData map-style (header)",
    "parquet": "Parquet row groups (snappy)",
    "tfrecord": "TFRecord + Example parse",
}
MADE_VERSION = 1  # bump when a writer changes: the made sets are rebuilt


# ---- the photos -----------------------------------------------------------------------------

def photos(folder):
    """(path, label) of every image of an ImageFolder tree, classes in sorted
    order as torchvision numbers them."""
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    out = []
    for label, c in enumerate(classes):
        d = os.path.join(folder, c)
        out += [(os.path.join(d, f), label) for f in sorted(os.listdir(d))]
    return classes, out


def split(items, n):
    """n nearly equal consecutive parts."""
    k, r = divmod(len(items), n)
    out, at = [], 0
    for i in range(n):
        out.append(items[at:at + k + (i < r)])
        at += k + (i < r)
    return [p for p in out if p]


# ---- writers --------------------------------------------------------------------------------

def write_tar(out, items, files):
    """WebDataset shards: KEY.jpg (the file) and KEY.cls (the label as text)."""
    key = 0
    for f, part in enumerate(split(items, files)):
        with tarfile.open(os.path.join(out, f"shard-{f:06d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            for path, label in part:
                for ext, data in (("jpg", open(path, "rb").read()), ("cls", str(label).encode())):
                    ti = tarfile.TarInfo(f"{key:06d}.{ext}")
                    ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
                    tf.addfile(ti, io.BytesIO(data))
                key += 1


def offsets_file(records, head=b""):
    """u32 count, u32 offsets of the count + 1 record boundaries (absolute),
    `head`, the records: the shard layout MDS and LitData share."""
    start = 4 + 4 * (len(records) + 1) + len(head)
    offs = [start]
    for r in records:
        offs.append(offs[-1] + len(r))
    return struct.pack(f"<I{len(offs)}I", len(records), *offs) + head + b"".join(records)


def write_mds(out, items, size_limit):
    """MDSWriter's layout (mosaicml/streaming, as the fixtures): columns sorted
    by name, image: jpeg (the file's bytes), label: int (int64); a record is the
    u32 size of each variable-size column, then every column's bytes; a new
    shard when the next sample would pass size_limit; index.json version 2."""
    config = {"column_encodings": ["jpeg", "int"], "column_names": ["image", "label"],
              "column_sizes": [None, 8], "compression": None, "format": "mds", "hashes": [],
              "size_limit": size_limit, "version": 2}
    head = json.dumps(config, sort_keys=True).encode()
    shards, records, size = [], [], 0

    def flush():
        name = f"shard.{len(shards):05d}.mds"
        data = offsets_file(records, head)
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        shards.append(dict(config, raw_data={"basename": name, "bytes": len(data), "hashes": {}},
                           samples=len(records), zip_data=None))

    for path, label in items:
        img = open(path, "rb").read()
        rec = struct.pack("<I", len(img)) + img + struct.pack("<q", label)
        if records and size + len(rec) + 4 > size_limit:
            flush()
            records, size = [], 0
        records.append(rec)
        size += len(rec) + 4
    if records:
        flush()
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"shards": shards, "version": 2}, f, sort_keys=True)


def write_litdata(out, items, chunk_bytes):
    """litdata.optimize()'s layout (its BinaryWriter, PyTreeLoader, as the
    fixtures): a sample {"image": jpeg, "label": int}; an item is the u32 size of
    every leaf, then the leaves; chunk-0-K.bin; index.json with the pytree spec."""
    leaf = {"type": None, "context": None, "children_spec": []}
    spec = json.dumps([1, {"type": "builtins.dict", "context": json.dumps(["image", "label"]),
                           "children_spec": [leaf, leaf]}])
    chunks, items_, size = [], [], 0

    def flush():
        name = f"chunk-0-{len(chunks)}.bin"
        data = offsets_file(items_)
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        chunks.append({"chunk_bytes": len(data), "chunk_size": len(items_), "dim": None,
                       "filename": name})

    for path, label in items:
        img = open(path, "rb").read()
        it = struct.pack("<II", len(img), 8) + img + struct.pack("<q", label)
        if items_ and size + len(it) > chunk_bytes:
            flush()
            items_, size = [], 0
        items_.append(it)
        size += len(it)
    if items_:
        flush()
    config = {"chunk_bytes": chunk_bytes, "chunk_size": None, "compression": None,
              "data_format": ["jpeg", "int"], "data_spec": spec, "encryption": None,
              "item_loader": "PyTreeLoader"}
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"chunks": chunks, "config": config, "updated_at": "0"}, f, sort_keys=True)


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_TABLE = None


def masked_crc32c(data):
    """TFRecord's masked CRC32C (Castagnoli). Pure Python, table-driven: only
    the writer uses it, once."""
    global _CRC_TABLE
    try:
        import crc32c  # Debian's python3-crc32c, when installed
        c = crc32c.crc32c(data)
    except ImportError:
        if _CRC_TABLE is None:
            _CRC_TABLE = _crc32c_table()
        t, c = _CRC_TABLE, 0xFFFFFFFF
        for b in data:
            c = t[(c ^ b) & 0xFF] ^ (c >> 8)
        c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field, payload):
    """A length-delimited protobuf field."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def example(features):
    """A serialized tf.train.Example (example.proto / feature.proto field
    numbers), map entries sorted by key as protobuf's deterministic mode."""
    entries = b""
    for key in sorted(features):
        kind, value = features[key]
        if kind == "bytes":
            feat = _ld(1, _ld(1, value))                           # Feature.bytes_list
        else:
            feat = _ld(3, _ld(1, _varint(value & (2**64 - 1))))   # Feature.int64_list, packed
        entries += _ld(1, _ld(1, key.encode()) + _ld(2, feat))     # Features.feature map entry
    return _ld(1, entries)                                          # Example.features


def write_tfrecord(out, items, files):
    for f, part in enumerate(split(items, files)):
        with open(os.path.join(out, f"train-{f:05d}-of-{files:05d}.tfrecord"), "wb") as fo:
            for path, label in part:
                data = example({"image/encoded": ("bytes", open(path, "rb").read()),
                                "image/format": ("bytes", b"jpeg"),
                                "image/class/label": ("int64", label)})
                length = struct.pack("<Q", len(data))
                fo.write(length + struct.pack("<I", masked_crc32c(length)) + data +
                         struct.pack("<I", masked_crc32c(data)))


DUCKDB_JS = r"""
const { DuckDBInstance } = require('@duckdb/node-api');
(async () => {
  const [csv, out, files, group, features] = process.argv.slice(2);
  const inst = await DuckDBInstance.create(':memory:');
  const con = await inst.connect();
  await con.run("SET threads = 1");
  const q = (s) => "'" + s.replace(/'/g, "''") + "'";
  await con.run(`CREATE TABLE m AS SELECT * FROM read_csv(${q(csv)}, header = true,
                 columns = {'idx': 'BIGINT', 'file': 'VARCHAR', 'name': 'VARCHAR', 'label': 'BIGINT'})`);
  // read_blob takes a constant list: the files, from the CSV's second column
  const files_ = require('fs').readFileSync(csv, 'utf8').trim().split('\n').slice(1)
    .map((line) => q(line.split(',')[1]));
  await con.run(`CREATE TABLE t AS SELECT m.idx AS idx, {'bytes': b.content, 'path': m.name} AS image,
                 m.label AS label FROM m JOIN read_blob([${files_.join(', ')}]) b ON b.filename = m.file`);
  const n = Number((await con.runAndReadAll("SELECT count(*) FROM t")).getRows()[0][0]);
  const per = Math.ceil(n / Number(files));
  for (let f = 0; f < Number(files); f++) {
    // DuckDB cuts row groups at its vectors (2048 rows), not at ROW_GROUP_SIZE
    // below that: one UNION ALL part per row group gives the groups asked for.
    const parts = [];
    for (let a = f * per; a < Math.min(n, (f + 1) * per); a += Number(group)) {
      const b = Math.min(a + Number(group), (f + 1) * per, n);
      parts.push(`(SELECT image, label FROM (SELECT * FROM t WHERE idx >= ${a} AND idx < ${b} ORDER BY idx))`);
    }
    const name = `${out}/train-${String(f).padStart(5, '0')}-of-${String(files).padStart(5, '0')}.parquet`;
    await con.run(`COPY (${parts.join(' UNION ALL ')}) TO ${q(name)} (FORMAT parquet,
                   COMPRESSION snappy, ROW_GROUP_SIZE ${group}, KV_METADATA {huggingface: ${q(features)}})`);
  }
})().catch((e) => { console.error(String(e)); process.exit(1); });
"""


def write_parquet(out, items, classes, files, group):
    """Hugging Face datasets' image layout by DuckDB. Returns None, or why it
    could not be written."""
    if not os.path.isdir(os.path.join(NODE_MODULES, "@duckdb", "node-api")):
        return ("DuckDB's npm @duckdb/node-api is not installed in build/node (npm install "
                "--prefix build/node @duckdb/node-api)")
    csv = os.path.join(out, "..", "parquet-input.csv")
    with open(csv, "w") as f:
        f.write("idx,file,name,label\n")
        for i, (path, label) in enumerate(items):
            f.write(f"{i},{os.path.abspath(path)},{os.path.basename(path)},{label}\n")
    features = json.dumps({"info": {"features": {
        "image": {"_type": "Image"},
        "label": {"_type": "ClassLabel", "names": classes}}}})
    js = os.path.join(out, "..", "write-parquet.cjs")
    with open(js, "w") as f:
        f.write(DUCKDB_JS)
    r = subprocess.run(["node", js, csv, os.path.abspath(out), str(files), str(group), features],
                       env=dict(os.environ, NODE_PATH=NODE_MODULES), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    os.remove(js)
    os.remove(csv)
    if r.returncode:
        return "DuckDB failed: " + r.stdout.strip()[-300:]
    return None


def prepare(a):
    """The folder and the formats made from it; {format: path or None}, and
    {format: why it is missing}."""
    if a.quick:
        base = os.path.join(ROOT, "data", "bench-formats-quick")
        folder = os.path.join(base, "folder")
        per_class = 20
    else:
        base = os.path.join(ROOT, "data", "bench-formats")
        folder = a.folder
        per_class = 200
    if not os.path.isdir(folder):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make-dataset.py"), folder,
                        "--kind", "web", "--per-class", str(per_class)], check=True)
    classes, items = photos(folder)
    order = list(items)
    random.Random(0).shuffle(order)
    stamp = os.path.join(base, "made.json")
    want = {"version": MADE_VERSION, "folder": os.path.realpath(folder), "samples": len(items)}
    made = {}
    if os.path.exists(stamp):
        with open(stamp) as f:
            made = json.load(f)
        if made.get("want") != want:
            made = {}
    paths, missing = {"folder": folder}, {}
    files = 4
    size_limit = max(1 << 16, sum(os.path.getsize(p) for p, _ in items) // files + (1 << 16))
    writers = {
        "stk": lambda out: pack(folder, out),
        "tar": lambda out: write_tar(out, order, files),
        "mds": lambda out: write_mds(out, order, min(size_limit, 1 << 24)),
        "litdata": lambda out: write_litdata(out, order, min(size_limit, 1 << 24)),
        "parquet": lambda out: write_parquet(out, order, classes, files, 100),
        "tfrecord": lambda out: write_tfrecord(out, order, files),
    }
    for fmt, write in writers.items():
        out = os.path.join(base, fmt)
        if fmt in made.get("done", {}) and os.path.isdir(out):
            paths[fmt] = out
            continue
        if os.path.isdir(out):
            subprocess.run(["rm", "-rf", "--", out], check=True)
        os.makedirs(out)
        print(f"bench_formats: writing {fmt} ({len(items)} samples) to {out}", flush=True)
        why = write(out)
        if why:
            missing[fmt] = why
            subprocess.run(["rm", "-rf", "--", out], check=True)
            continue
        paths[fmt] = out
        made.setdefault("done", {})[fmt] = True
        made["want"] = want
        with open(stamp, "w") as f:
            json.dump(made, f)
    return paths, missing, len(items)


def pack(folder, out):
    if not os.path.exists(STOKER):
        subprocess.run(["make", "-s", "-C", ROOT, "-j2", "MODE=release", "lib", "tools"], check=True)
    os.rmdir(out)
    subprocess.run([STOKER, "pack", folder, out, "--quiet"], check=True)


# ---- minimal Python readers of the formats ----------------------------------------------------

def read_offsets(path):
    """The u32 count and count + 1 absolute offsets at the head of an MDS shard
    or a LitData chunk."""
    with open(path, "rb") as f:
        n = struct.unpack("<I", f.read(4))[0]
        return struct.unpack(f"<{n + 1}I", f.read(4 * (n + 1)))


class OffsetsDataset:
    """Map-style reader of MDS shards / LitData chunks: each file's offsets
    table read at init, a sample's record by one pread; split into columns by
    the format's rule. Subclasses give files() and columns(record)."""

    def __init__(self, root, transform=None):
        self.root, self.transform = root, transform
        self.where = []  # (file index, start, end)
        self.paths = []
        for fi, name in enumerate(self.files()):
            p = os.path.join(root, name)
            self.paths.append(p)
            offs = read_offsets(p)
            self.where += [(fi, offs[k], offs[k + 1]) for k in range(len(offs) - 1)]
        self.fds = None

    def __len__(self):
        return len(self.where)

    def record(self, i):
        if self.fds is None:  # opened in each worker, after the fork
            self.fds = [os.open(p, os.O_RDONLY) for p in self.paths]
        fi, a, b = self.where[i]
        return os.pread(self.fds[fi], b - a, a)

    def __getitem__(self, i):
        image, label = self.columns(self.record(i))
        return decode(image, self.transform), label


class MDSDataset(OffsetsDataset):
    """MosaicML Streaming's MDS: index.json (version 2) lists the shards and
    their columns; a record is one u32 size per variable-size column (column
    order), then each column's bytes."""

    def files(self):
        with open(os.path.join(self.root, "index.json")) as f:
            index = json.load(f)
        sh = index["shards"][0]
        self.names, self.encodings = sh["column_names"], sh["column_encodings"]
        self.sizes = sh["column_sizes"]
        return [s["raw_data"]["basename"] for s in index["shards"]]

    def columns(self, rec):
        nvar = sum(s is None for s in self.sizes)
        var = struct.unpack_from(f"<{nvar}I", rec)
        at, k, cols = 4 * nvar, 0, {}
        for name, enc, size in zip(self.names, self.encodings, self.sizes):
            if size is None:
                size, k = var[k], k + 1
            cols[name] = (enc, rec[at:at + size])
            at += size
        enc, label = cols["label"]
        return cols["image"][1], struct.unpack("<q", label)[0] if enc == "int" else int(label)


class LitDataDataset(OffsetsDataset):
    """LitData's chunks (PyTreeLoader): index.json lists the chunks, the leaves'
    serializers and the pytree spec; an item is one u32 size per leaf, then the
    leaves."""

    def files(self):
        with open(os.path.join(self.root, "index.json")) as f:
            index = json.load(f)
        cfg = index["config"]
        self.formats = cfg["data_format"]
        spec = json.loads(cfg["data_spec"])[1]
        keys = json.loads(spec["context"]) if spec["type"] == "builtins.dict" else None
        # Only flat dicts here (the bench set and the fixtures' first leaves).
        self.leaves = keys if keys and len(keys) == len(self.formats) else None
        self.keys = keys or []
        return [c["filename"] for c in index["chunks"]]

    def columns(self, rec):
        n = len(self.formats)
        sizes = struct.unpack_from(f"<{n}I", rec)
        at, vals = 4 * n, []
        for s in sizes:
            vals.append(rec[at:at + s])
            at += s
        leaves = self.leaves or [f"leaf_{i}" for i in range(n)]
        if self.leaves is None and self.keys:  # nested dict: the first leaves follow the keys
            leaves = self.keys[:n] + leaves[len(self.keys):]
        cols = dict(zip(leaves, vals))
        return cols["image"], struct.unpack("<q", cols["label"])[0]


def tfrecord_records(path):
    """(data) of each record of a TFRecord file, the framing walked in Python;
    the CRCs are not checked (see the module's docstring)."""
    with open(path, "rb") as f:
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise ValueError(f"{path}: truncated record header")
            n = struct.unpack_from("<Q", head)[0]
            data = f.read(n)
            if len(f.read(4)) < 4 or len(data) < n:
                raise ValueError(f"{path}: truncated record")
            yield data


def _read_varint(b, at):
    n = shift = 0
    while True:
        c = b[at]
        at += 1
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return n, at
        shift += 7


def _fields(b, at=0, end=None):
    """(field number, wire type, value) of a protobuf message: the value is the
    varint, or (start, end) of a length-delimited field."""
    end = len(b) if end is None else end
    while at < end:
        key, at = _read_varint(b, at)
        wt = key & 7
        if wt == 0:
            v, at = _read_varint(b, at)
        elif wt == 2:
            n, at = _read_varint(b, at)
            v, at = (at, at + n), at + n
        elif wt == 5:
            v, at = b[at:at + 4], at + 4
        elif wt == 1:
            v, at = b[at:at + 8], at + 8
        else:
            raise ValueError(f"protobuf wire type {wt}")
        yield key >> 3, wt, v


def parse_example(b):
    """{feature name: bytes or [int...]} of a tf.train.Example (bytes_list and
    int64_list; float_list left out)."""
    out = {}
    for fn, wt, v in _fields(b):
        if fn != 1 or wt != 2:
            continue
        for fn2, wt2, entry in _fields(b, *v):                  # Features.feature
            if fn2 != 1 or wt2 != 2:
                continue
            key = feat = None
            for fn3, wt3, kv in _fields(b, *entry):
                if fn3 == 1:
                    key = b[kv[0]:kv[1]].decode()
                elif fn3 == 2:
                    feat = kv
            if key is None or feat is None:
                continue
            for kind, wt4, lst in _fields(b, *feat):            # Feature oneof
                vals = []
                for fn5, wt5, val in _fields(b, *lst):
                    if kind == 1:
                        vals.append(b[val[0]:val[1]])
                    elif kind == 3 and wt5 == 2:                # packed int64
                        at = val[0]
                        while at < val[1]:
                            x, at = _read_varint(b, at)
                            vals.append(x - (1 << 64) if x >= 1 << 63 else x)
                    elif kind == 3:
                        vals.append(val - (1 << 64) if val >= 1 << 63 else val)
                if kind in (1, 3):
                    out[key] = vals
    return out


# -- Parquet: Thrift compact protocol, footer, pages -------------------------------------------

def _zigzag(n):
    return (n >> 1) ^ -(n & 1)


def thrift_struct(b, at):
    """A Thrift compact-protocol struct at `at`: ({field id: value}, end)."""
    out, last = {}, 0
    while True:
        h = b[at]
        at += 1
        if h == 0:
            return out, at
        delta, t = h >> 4, h & 0x0F
        if delta:
            fid = last + delta
        else:
            z, at = _read_varint(b, at)
            fid = _zigzag(z)
        last = fid
        out[fid], at = _thrift_value(b, at, t)


def _thrift_value(b, at, t):
    if t == 1:
        return True, at
    if t == 2:
        return False, at
    if t == 3:
        return b[at], at + 1
    if t in (4, 5, 6):
        z, at = _read_varint(b, at)
        return _zigzag(z), at
    if t == 7:
        return struct.unpack_from("<d", b, at)[0], at + 8
    if t == 8:
        n, at = _read_varint(b, at)
        return bytes(b[at:at + n]), at + n
    if t in (9, 10):
        h = b[at]
        at += 1
        n, et = h >> 4, h & 0x0F
        if n == 15:
            n, at = _read_varint(b, at)
        vals = []
        for _ in range(n):
            if et in (1, 2):  # bools in a list: one byte each
                v, at = b[at] == 1, at + 1
            else:
                v, at = _thrift_value(b, at, et)
            vals.append(v)
        return vals, at
    if t == 11:
        n, at = _read_varint(b, at)
        if not n:
            return {}, at
        kt, vt = b[at] >> 4, b[at] & 0x0F
        at += 1
        m = {}
        for _ in range(n):
            k, at = _thrift_value(b, at, kt)
            m[k], at = _thrift_value(b, at, vt)
        return m, at
    if t == 12:
        return thrift_struct(b, at)
    raise ValueError(f"Thrift compact type {t}")


def _bit_width(n):
    return n.bit_length()


def rle_hybrid(b, at, end, width, count):
    """count values of Parquet's RLE / bit-packed hybrid encoding."""
    out = []
    nbytes = (width + 7) // 8
    while len(out) < count and at < end:
        h, at = _read_varint(b, at)
        if h & 1:
            groups = h >> 1
            n = groups * 8
            bits = int.from_bytes(b[at:at + groups * width], "little")
            at += groups * width
            mask = (1 << width) - 1
            out += [(bits >> (k * width)) & mask for k in range(n)]
        else:
            v = int.from_bytes(b[at:at + nbytes], "little")
            at += nbytes
            out += [v] * (h >> 1)
    return out[:count]


def _plain(b, at, end, ptype, n):
    if ptype == 6:  # BYTE_ARRAY
        vals = []
        for _ in range(n):
            k = struct.unpack_from("<I", b, at)[0]
            vals.append(bytes(b[at + 4:at + 4 + k]))
            at += 4 + k
        return vals
    if ptype == 2:  # INT64
        return list(struct.unpack_from(f"<{n}q", b, at))
    if ptype == 1:  # INT32
        return list(struct.unpack_from(f"<{n}i", b, at))
    raise ValueError(f"Parquet physical type {ptype} not read by this bench")


def _uncompress(codec, data, size):
    if codec == 0:
        return data
    if codec == 1:
        import snappy  # Debian's python3-snappy
        return snappy.uncompress(data)
    if codec == 2:
        import zlib
        return zlib.decompress(data, 31)
    if codec == 6:
        import zstandard  # Debian's python3-zstandard
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    raise ValueError(f"Parquet codec {codec} not read by this bench")


class ParquetFile:
    """The footer of a Parquet file and its columns by dotted path, with their
    maximum definition level (OPTIONAL nodes on the path)."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            f.seek(-8, 2)
            tail = f.read(8)
            if tail[4:] != b"PAR1":
                raise ValueError(f"{path}: not a Parquet file")
            n = struct.unpack("<I", tail[:4])[0]
            f.seek(-8 - n, 2)
            meta, _ = thrift_struct(f.read(n), 0)
        self.row_groups = meta[4]
        schema = meta[2]
        self.maxdef = {}
        self.types = {}

        def walk(i, prefix, d):
            el = schema[i]
            kids = el.get(5, 0)
            i += 1
            for _ in range(kids):
                c = schema[i]
                name = prefix + [c[4].decode()]
                dd = d + (c.get(3, 0) == 1)
                if c.get(5, 0):
                    i = walk(i, name, dd)
                else:
                    self.maxdef[".".join(name)] = dd
                    self.types[".".join(name)] = c.get(1)
                    i += 1
            return i

        walk(0, [], 0)

    def column(self, rg, name, f):
        """The values of column `name` in row group `rg` (None for nulls)."""
        for cc in self.row_groups[rg][1]:
            md = cc[3]
            if ".".join(p.decode() for p in md[3]) == name:
                break
        else:
            raise KeyError(f"{self.path}: no column {name}")
        start = md.get(11) or md[9]
        f.seek(start)
        buf = f.read(md[7])
        maxdef, ptype, codec = self.maxdef[name], md[1], md[4]
        vals, dictionary, at, want = [], None, 0, md[5]
        while len(vals) < want and at < len(buf):
            ph, at = thrift_struct(buf, at)
            csize, usize = ph[3], ph[2]
            body = buf[at:at + csize]
            at += csize
            if ph[1] == 2:  # dictionary page
                dictionary = _plain(_uncompress(codec, body, usize), 0, usize, ptype, ph[7][1])
                continue
            if ph[1] == 0:  # data page v1: levels and values compressed together
                dh = ph[5]
                n, enc = dh[1], dh[2]
                page = _uncompress(codec, body, usize)
                p = 0
                defs = [maxdef] * n
                if maxdef:
                    k = struct.unpack_from("<I", page, p)[0]
                    defs = rle_hybrid(page, p + 4, p + 4 + k, _bit_width(maxdef), n)
                    p += 4 + k
            elif ph[1] == 3:  # data page v2: levels uncompressed, before the values
                dh = ph[8]
                n, enc, dlen, rlen = dh[1], dh[4], dh[5], dh[6]
                defs = (rle_hybrid(body, rlen, rlen + dlen, _bit_width(maxdef), n)
                        if maxdef else [maxdef] * n)
                rest = body[rlen + dlen:]
                page = _uncompress(codec, rest, usize - rlen - dlen) if dh.get(7, True) else rest
                p = 0
            else:
                continue
            present = sum(d == maxdef for d in defs)
            if enc == 0:
                got = _plain(page, p, len(page), ptype, present)
            elif enc in (2, 8):  # PLAIN_DICTIONARY / RLE_DICTIONARY
                width = page[p]
                idx = rle_hybrid(page, p + 1, len(page), width, present)
                got = [dictionary[i] for i in idx]
            else:
                raise ValueError(f"{self.path}: encoding {enc} of {name} not read by this bench")
            it = iter(got)
            vals += [next(it) if d == maxdef else None for d in defs]
        return vals


# -- the iterable readers (tar, Parquet, TFRecord) ----------------------------------------------

def decode(image, transform):
    from PIL import Image
    im = Image.open(io.BytesIO(image)).convert("RGB")
    return transform(im) if transform else im


def make_iterable(units, read_unit, transform, shuffle_buffer, seed):
    """An IterableDataset over `units` (shards, row groups): shuffled per
    epoch and split among the workers, samples through a shuffle buffer of
    undecoded samples, then decoded and transformed."""
    import torch

    class Iterable(torch.utils.data.IterableDataset):
        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            order = list(units)
            random.Random(seed * 1000003 + self.epoch).shuffle(order)
            rng = random.Random((seed * 1000003 + self.epoch) * 64 + wid)
            self.epoch += 1
            buf = []
            for u in order[wid::nw]:
                for s in read_unit(u):
                    if len(buf) < shuffle_buffer:
                        buf.append(s)
                        continue
                    k = rng.randrange(len(buf))
                    buf[k], s = s, buf[k]
                    yield decode(s[0], transform), s[1]
            rng.shuffle(buf)
            for s in buf:
                yield decode(s[0], transform), s[1]

    return Iterable()


def tar_units(path):
    shards = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".tar"))

    def read(p):
        sys.path.insert(0, HERE)
        from bench_multimodal import tar_samples  # webdataset's grouping rule
        for _, m in tar_samples(p):
            yield m["jpg"], int(m["cls"])
    return shards, read


def parquet_units(path):
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet"))
    units = []
    for p in files:
        pf = ParquetFile(p)
        units += [(p, rg) for rg in range(len(pf.row_groups))]
    cache = {}

    def read(u):
        p, rg = u
        if p not in cache:
            cache[p] = ParquetFile(p)
        pf = cache[p]
        with open(p, "rb") as f:
            images = pf.column(rg, "image.bytes", f)
            labels = pf.column(rg, "label", f)
        return list(zip(images, labels))
    return units, read


def tfrecord_units(path):
    files = sorted(os.path.join(path, f) for f in os.listdir(path)
             if f.endswith((".tfrecord", ".tfrecords")))  # not stoker's .stkidx beside them

    def read(p):
        for data in tfrecord_records(p):
            ex = parse_example(data)
            yield ex["image/encoded"][0], ex["image/class/label"][0]
    return files, read


def python_dataset(fmt, path, transform, a):
    """(dataset, map-style?) of the usual Python reader of a format."""
    if fmt == "folder":
        import torchvision
        return torchvision.datasets.ImageFolder(path, transform=transform), True
    if fmt == "mds":
        return MDSDataset(path, transform), True
    if fmt == "litdata":
        return LitDataDataset(path, transform), True
    units, read = {"tar": tar_units, "parquet": parquet_units, "tfrecord": tfrecord_units}[fmt](path)
    return make_iterable(units, read, transform, a.shuffle_buffer, a.seed), False


# ---- one measured run (in a child process) --------------------------------------------------

def check_batch(batch, a, side):
    import torch
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        sys.exit(f"bench_formats ({side}): a batch should be (images, labels), got {type(batch)}")
    im, lab = batch
    n = len(lab)
    if not (isinstance(im, torch.Tensor) and im.dtype == torch.uint8 and
            tuple(im.shape) == (n, 3, a.size, a.size)):
        sys.exit(f"bench_formats ({side}): images should be a uint8 tensor ({n}, 3, {a.size}, "
                 f"{a.size}), got {type(im).__name__} {getattr(im, 'dtype', '')} "
                 f"{tuple(getattr(im, 'shape', ()))}")
    if not (isinstance(lab, torch.Tensor) and lab.dtype == torch.int64):
        sys.exit(f"bench_formats ({side}): labels should be an int64 tensor, got {lab!r:.80}")


def iterate(loader, a, t0, side):
    epoch_s, samples, sums, first = [], [], [], None
    for _ in range(a.epochs):
        t = time.perf_counter()
        k = s = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
                check_batch(batch, a, side)
            k += len(batch[1])
            s += int(batch[1].sum())
        epoch_s.append(time.perf_counter() - t)
        samples.append(k)
        sums.append(s)
    return {"all_s": time.perf_counter() - t0, "first_batch_s": first, "epoch_s": epoch_s,
            "samples": samples, "label_sums": sums}


def run_child(a, fmt, side, path):
    import torch
    if side == "python":
        import torchvision  # noqa: F401 (imports are the process's cost, not the loader's)
        import torchvision.transforms as TV
        torch.set_num_threads(1)
        tf = TV.Compose([TV.RandomResizedCrop(a.size), TV.RandomHorizontalFlip(), TV.PILToTensor()])
        cpu0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
        ds, mapstyle = python_dataset(fmt, path, tf, a)
        g = torch.Generator()
        g.manual_seed(a.seed)
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=mapstyle,
                                         num_workers=a.workers, generator=g if mapstyle else None,
                                         persistent_workers=a.workers > 0)
        r = iterate(dl, a, t0, f"{fmt}, Python")
        r["cpu_before_s"] = cpu0
        del dl  # shuts the workers down and reaps them: their CPU time counts
        return r
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import stoker
        from stoker import transforms as T
    except ImportError as e:
        sys.exit(f"bench_formats: cannot import stoker ({e}); build it first: "
                 f"make -j2 MODE=release python")
    cpu0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    try:
        L = stoker.Loader(path, a.batch_size, seed=a.seed, threads=a.workers,
                          transform=T.Compose([T.RandomResizedCrop(a.size),
                                               T.RandomHorizontalFlip()]),
                          output="torch")
    except stoker.Error as e:
        return {"skipped": f"stoker cannot open it in this build: {e}"}
    r = iterate(L, a, t0, f"{fmt}, stoker")
    r["cpu_before_s"] = cpu0
    L.close()
    return r


# ---- the parent -----------------------------------------------------------------------------

def cpu_s(who):
    """User + system CPU seconds of this process (RUSAGE_SELF: all its
    threads) or of its waited-for descendants (RUSAGE_CHILDREN)."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def measure(a, fmt, side, path):
    cmd = [sys.executable, os.path.abspath(__file__), "--run", f"{fmt}:{side}:{path}",
           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--size", str(a.size),
           "--workers", str(a.workers), "--shuffle-buffer", str(a.shuffle_buffer),
           "--seed", str(a.seed)]
    cpu0 = cpu_s(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit(f"bench_formats: the {fmt} run of the {side} side failed (exit {p.returncode})")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if "cpu_before_s" in r:
        # CPU time of the run's whole process tree (the DataLoader's workers
        # included), less what the child spent before its clock (imports).
        r["cpu_s"] = cpu_s(resource.RUSAGE_CHILDREN) - cpu0 - r["cpu_before_s"]
    return r


def warm(path):
    total = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            with open(os.path.join(d, f), "rb") as fo:
                while True:
                    b = fo.read(1 << 20)
                    if not b:
                        break
                    total += len(b)
    return total


def same_batches(a, formats, paths):
    """stoker must deliver bit-identical batches from every format holding the
    samples in the same order: the folder and its .stk (ImageFolder order),
    and the in-place formats (one shuffled order). One epoch of `stoker bench`
    each (its checksum covers every pixel and label), outside the clock."""
    sums = {}
    for f in formats:
        if f not in paths:
            continue
        p = subprocess.run([STOKER, "bench", paths[f], "--transform", "imagenet-train",
                            "--epochs", "1", "--batch-size", str(a.batch_size), "--threads",
                            str(a.workers), "--seed", str(a.seed), "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode == 0:
            sums[f] = json.loads(p.stdout)["checksum"]
    groups = [[f for f in ("folder", "stk") if f in sums],
              [f for f in ("tar", "mds", "litdata", "parquet", "tfrecord") if f in sums]]
    for g in groups:
        if len({sums[f] for f in g}) > 1:
            sys.exit("bench_formats: stoker's batches differ between formats holding the same "
                     "samples in the same order: " + ", ".join(f"{f} {sums[f]}" for f in g))
    print("  stoker's batches are bit-identical (stoker bench checksums, 1 epoch): " +
          "; ".join(" = ".join(g) + f" ({sums[g[0]]})" for g in groups if g))


def rate(r):
    return sum(r["samples"]) / r["all_s"]


def check_fixtures():
    """Reads the real writers' fixtures with the Python readers above and
    compares every image (sha256) and label with their manifests."""
    import hashlib
    root = next((p for p in FIXTURES if os.path.isdir(p)), None)
    if root is None:
        sys.exit("bench_formats: no fixtures directory found")
    bad = 0

    def compare(name, got, manifest):
        nonlocal bad
        with open(manifest) as f:
            want = json.load(f)["samples"]
        ok = len(got) == len(want) and all(
            hashlib.sha256(img).hexdigest() == w["sha256"] and lab == w["label"]
            for (img, lab), w in zip(got, want))
        bad += not ok
        print(f"  {name:22} {len(got):3d} samples  {'match' if ok else 'DIFFER'}")

    for v in ("plain", "jpeg"):
        d = os.path.join(root, "mds", v)
        ds = MDSDataset(d)
        compare(f"mds/{v}", [ds.columns(ds.record(i)) for i in range(len(ds))], d + ".manifest.json")
    for v in ("plain", "jpeg"):
        d = os.path.join(root, "litdata", v)
        ds = LitDataDataset(d)
        compare(f"litdata/{v}", [ds.columns(ds.record(i)) for i in range(len(ds))],
                d + ".manifest.json")
    d = os.path.join(root, "tfrecord", "plain")
    units, read = tfrecord_units(d)
    compare("tfrecord/plain", [s for u in units for s in read(u)], d + ".manifest.json")
    for v in ("uncompressed", "snappy", "zstd"):
        d = os.path.join(root, "parquet", v)
        if v == "zstd":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                print(f"  parquet/{v:14} skipped (no python3-zstandard)")
                continue
        units, read = parquet_units(d)
        compare(f"parquet/{v}", [s for u in units for s in read(u)], d + ".manifest.json")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", default=os.path.join(ROOT, "data", "bench-web"),
                    help="the photos, an ImageFolder tree (made when missing: 2000 'web' JPEGs)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed, open included")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=2, help="stoker threads = DataLoader workers")
    ap.add_argument("--shuffle-buffer", type=int, default=1000,
                    help="the iterable Python readers' shuffle buffer, samples a worker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset")
    ap.add_argument("--skip-python", action="store_true", help="measure stoker's side alone")
    ap.add_argument("--quick", action="store_true",
                    help="200 photos, 1 epoch, 1 run: checks the script end to end")
    ap.add_argument("--check-fixtures", action="store_true",
                    help="read the real writers' fixtures with the Python readers and compare")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.run:
        fmt, side, path = a.run.split(":", 2)
        print(json.dumps(run_child(a, fmt, side, path)))
        return 0
    if a.check_fixtures:
        return check_fixtures()
    if a.quick:
        a.epochs, a.repeat = 1, 1
    formats = [f for f in a.formats.split(",") if f]
    for f in formats:
        if f not in FORMATS:
            sys.exit(f"bench_formats: unknown format {f!r} (known: {', '.join(FORMATS)})")
    paths, missing, n = prepare(a)
    nbytes = {f: warm(p) for f, p in paths.items() if f in formats}
    print(f"bench_formats: {n} photos, imagenet-train (RandomResizedCrop({a.size}) + flip, "
          f"uint8), batch {a.batch_size}, {a.workers} threads / DataLoader workers, {a.epochs} "
          f"epoch(s) timed from before the loader is made, best of {a.repeat} interleaved runs")
    for f in formats:
        if f in missing:
            print(f"  {f}: not written, skipped: {missing[f]}")
    same_batches(a, formats, paths)
    runs = {}
    skipped = {}
    todo = [(f, s) for f in formats if f in paths for s in ("stoker", "python")
            if not (s == "python" and (a.skip_python or f == "stk"))]
    for _ in range(a.repeat):
        for f, s in todo:
            if (f, s) in skipped:
                continue
            r = measure(a, f, s, paths[f])
            if "skipped" in r:
                skipped[(f, s)] = r["skipped"]
                hint = (" (run again once stoker's Parquet reader is merged)"
                        if f == "parquet" else "")
                print(f"  {f}: {s} side skipped: {r['skipped']}{hint}", flush=True)
                continue
            if any(k != n for k in r["samples"]) or len(set(r["label_sums"])) != 1:
                sys.exit(f"bench_formats: {f} ({s}) delivered {r['samples']} samples with label "
                         f"sums {r['label_sums']}; expected {n} each epoch, every sample once")
            runs.setdefault((f, s), []).append(r)
    # every side of every format must deliver the same labels
    sums = {k: rs[0]["label_sums"][0] for k, rs in runs.items()}
    if len(set(sums.values())) > 1:
        sys.exit(f"bench_formats: the label sums differ between runs: {sums}")
    best = {k: max(rs, key=rate) for k, rs in runs.items()}
    stk = rate(best[("stk", "stoker")]) if ("stk", "stoker") in best else None

    def cpu(k):
        # CPU ms a sample, the median run: other work on a shared machine slows
        # every run down but leaves its CPU time a sample nearly as it is.
        v = sorted(r["cpu_s"] / sum(r["samples"]) for r in runs[k])
        return 1000 * v[len(v) // 2]

    print(f"  {'format':9} {'MiB':>6} {'stoker/s':>9} {'Python/s':>9} {'stoker/Python':>13} "
          f"{'stoker/.stk':>11} {'CPU ms/sample':>14}  Python reader")
    for f in formats:
        if f not in paths:
            continue
        s, p = best.get((f, "stoker")), best.get((f, "python"))
        sr = f"{rate(s):9.0f}" if s else f"{'skipped':>9}"
        pr = f"{rate(p):9.0f}" if p else f"{'-':>9}"
        ratio = f"{rate(s) / rate(p):12.2f}x" if s and p else f"{'-':>13}"
        vs = f"{rate(s) / stk:10.2f}x" if s and stk else f"{'-':>11}"
        c = ((f"{cpu((f, 'stoker')):6.2f} /" if s else f"{'-':>6} /") +
             (f"{cpu((f, 'python')):6.2f}" if p else f"{'-':>6}"))
        print(f"  {f:9} {nbytes[f] / 2**20:6.1f} {sr} {pr} {ratio} {vs} {c:>14}  "
              f"{PYTHON_READER[f]}")
    print("    all runs, samples/s: " + " | ".join(
        f"{f}/{s} " + " ".join(f"{rate(r):.0f}" for r in rs) for (f, s), rs in runs.items()))
    print("  CPU ms/sample: stoker / Python, the whole process tree (workers included), "
          "imports left out, median run")
    print("  targets (issue 21): every in-place format within 10 % of .stk (stoker/.stk >= "
          "0.90x) and >= 4x the Python reader")
    return 0


if __name__ == "__main__":
    sys.exit(main())
