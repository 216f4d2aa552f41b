// Writes the seed corpus of fuzz_parquet (tests/fuzz/corpus/parquet/): each
// seed is one Parquet file written by DuckDB's own writer (npm
// @duckdb/node-api, installed into build/node by scripts/install-deps.sh),
// small enough for libFuzzer's 64 KiB: the first rows of the fixtures
// (../shared/fixtures/parquet, Hugging Face's Image layout) rewritten by the
// writer that wrote them, in each codec; and tables in the layouts the
// fixtures lack -- dictionaries, nulls and null structs, page v2 with its
// DELTA and BYTE_STREAM_SPLIT encodings, gzip, several row groups.
//
//   node tests/fuzz/make_parquet_corpus.js [NODE_MODULES [FIXTURES]]
'use strict';
const path = require('path');
const fs = require('fs');
const root = path.resolve(__dirname, '..', '..');
const nm = path.resolve(process.argv[2] || path.join(root, 'build', 'node', 'node_modules'));
const fx = process.argv[3] || path.resolve(root, '..', '..', 'shared', 'fixtures', 'parquet');
const { DuckDBInstance } = require(path.join(nm, '@duckdb/node-api'));
const out = path.join(__dirname, 'corpus', 'parquet');

const TABLE = (n) => `
  SELECT i AS id, (i % 10)::INTEGER AS label, ['red', 'green', 'blue'][(i % 3) + 1] AS cat,
         CASE WHEN i % 3 = 0 THEN NULL ELSE 'note ' || i END AS note,
         CASE WHEN i % 11 = 0 THEN NULL
              ELSE {'bytes': CASE WHEN i % 7 = 0 THEN NULL ELSE unhex(md5(i::VARCHAR)) END,
                    'path': 'img_' || i || '.jpg'} END AS image,
         (i % 2 = 0) AS flag, (i * 0.25)::REAL AS f,
         CASE WHEN i % 5 = 0 THEN NULL ELSE i / 7.0 END::DOUBLE AS score,
         (3000000000 + i)::UINTEGER AS u
  FROM range(${n}) r(i)`;

async function main() {
  fs.mkdirSync(out, { recursive: true });
  const inst = await DuckDBInstance.create(':memory:', { threads: '1' });
  const con = await inst.connect();
  for (const codec of ['snappy', 'zstd', 'uncompressed']) {
    const src = path.join(fx, codec, 'train-00000-of-00002.parquet');
    await con.run(`COPY (SELECT * FROM read_parquet('${src}') LIMIT 3)
                   TO '${out}/fixture-${codec}' (FORMAT parquet, COMPRESSION ${codec})`);
  }
  const seeds = [
    ['v1-snappy-nulls', 60, 'COMPRESSION snappy'],
    ['v1-gzip-nulls', 60, 'COMPRESSION gzip'],
    ['v2-zstd-delta', 60, 'COMPRESSION zstd, PARQUET_VERSION v2'],
    ['v2-uncompressed', 40, 'COMPRESSION uncompressed, PARQUET_VERSION v2'],
  ];
  for (const [name, n, opts] of seeds)
    await con.run(`COPY (${TABLE(n)}) TO '${out}/${name}' (FORMAT parquet, ${opts})`);
  // Several row groups: 3 of a small table (DuckDB cuts at 2048 rows).
  await con.run(`COPY (SELECT i::SMALLINT AS v, ['a', 'b'][(i % 2) + 1] AS t FROM range(4200) r(i))
                 TO '${out}/rowgroups-v2' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 2048,
                 PARQUET_VERSION v2)`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
