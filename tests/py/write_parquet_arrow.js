// Writes Parquet files with list columns through the Rust Arrow project's
// Parquet writer (npm parquet-wasm, fed an Arrow table built with npm
// apache-arrow; both installed into build/node by scripts/install-deps.sh),
// for tests/py/test_parquet.py. Unlike DuckDB (one data page per column
// chunk below 100 MB), it cuts pages at a size limit we choose: small pages
// make a row group's lists span many pages. Beside each dataset folder it
// writes NAME.expected.json: every row as the Arrow table holds it.
//
//   node write_parquet_arrow.js NODE_MODULES OUTDIR
'use strict';
const path = require('path');
const fs = require('fs');
const mods = path.resolve(process.argv[2]);
const arrow = require(path.join(mods, 'apache-arrow'));
const pw = require(path.join(mods, 'parquet-wasm', 'node', 'parquet_wasm.js'));
const out = process.argv[3];

// HF's Sequence(Image()): list<struct<bytes: binary, path: string>>, with the
// list's child named "element" (pyarrow's compliant naming); tags is
// list<string> with Arrow's own child name "item".
function rows(n) {
  const r = [];
  for (let i = 0; i < n; i++) {
    let images = null;
    if (i % 11 !== 0) {
      images = [];
      for (let j = 0; j < (i * 3) % 5; j++) {
        if ((i + j) % 7 === 3) {
          images.push(null);
          continue;
        }
        const b = new Uint8Array(20 + ((i * 13 + j * 5) % 300));
        for (let k = 0; k < b.length; k++) b[k] = (i * 31 + j * 7 + k * 3) & 255;
        images.push({ bytes: (i + j) % 9 === 5 ? null : b, path: `img_${i}_${j}.png` });
      }
    }
    const tags = i % 6 === 0 ? null : Array.from({ length: i % 4 }, (_, j) =>
      (j === 1 && i % 5 === 0 ? null : `tag ${i}.${j}`));
    r.push({ id: i, images, tags });
  }
  return r;
}

function table(data) {
  const img = new arrow.Struct([
    new arrow.Field('bytes', new arrow.Binary(), true),
    new arrow.Field('path', new arrow.Utf8(), true),
  ]);
  const types = {
    id: new arrow.Int64(),
    images: new arrow.List(new arrow.Field('element', img, true)),
    tags: new arrow.List(new arrow.Field('item', new arrow.Utf8(), true)),
  };
  const cols = {};
  for (const [name, type] of Object.entries(types))
    cols[name] = arrow.vectorFromArray(data.map((r) => (name === 'id' ? BigInt(r.id) : r[name])),
                                       type);
  return new arrow.Table(cols);
}

const hex = (b) => Buffer.from(b).toString('hex').toUpperCase();

const VARIANTS = [
  // name, rows, writer version, compression, dictionaries (with them, a data
  // page holds only indices: few, large pages)
  ['arrow_v1', 1500, pw.WriterVersion.V1, pw.Compression.SNAPPY, false],
  ['arrow_v2', 1200, pw.WriterVersion.V2, pw.Compression.ZSTD, true],
];

for (const [name, n, version, codec, dict] of VARIANTS) {
  const t = table(rows(n));
  const props = new pw.WriterPropertiesBuilder()
    .setWriterVersion(version)
    .setCompression(codec)
    .setDictionaryEnabled(dict)
    .setMaxRowGroupSize(500)
    .setDataPageSizeLimit(4096)
    .setWriteBatchSize(64)
    .build();
  const bytes = pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(t, 'stream')), props);
  const dir = path.join(out, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'data.parquet'), bytes);
  // Every row read back from the Arrow table the file was written from.
  const exp = [];
  for (let i = 0; i < t.numRows; i++) {
    const r = t.get(i);
    const images = r.images === null ? null : [...r.images].map((e) => (e === null ? null :
      { hex: e.bytes === null ? null : hex(e.bytes), path: e.path }));
    exp.push({ id: Number(r.id), images, tags: r.tags === null ? null : [...r.tags] });
  }
  fs.writeFileSync(path.join(out, `${name}.expected.json`), JSON.stringify({ rows: exp }));
}
