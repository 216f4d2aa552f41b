// Writes Parquet files with DuckDB's own writer (npm @duckdb/node-api), for
// tests/py/test_parquet.py: layouts the fixtures lack -- many row groups,
// dictionary-encoded columns, nulls (a null value, a null struct), data page
// v2 (DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, BYTE_STREAM_SPLIT values),
// gzip, several files, large binary values. Beside each dataset folder it
// writes NAME.expected.json: every row as DuckDB holds it in the table the
// files were written from (read back from the table, never from the files).
//
//   node write_parquet_duckdb.js NODE_MODULES OUTDIR
'use strict';
const path = require('path');
const fs = require('fs');
const { DuckDBInstance } = require(path.join(path.resolve(process.argv[2]), '@duckdb/node-api'));
const out = process.argv[3];

// Deterministic rows: label 0..9 (dictionary), cat from 3 strings
// (dictionary), note null every 3rd row, image null bytes every 7th row
// and a null struct every 11th, score null every 5th, unsigned values past
// 2^31, negative smallints, binary of varying length.
const TABLE = (n, first) => `
  SELECT i AS id, (i % 10)::INTEGER AS label,
         ['red', 'green', 'blue'][(i % 3) + 1] AS cat,
         CASE WHEN i % 3 = 0 THEN NULL ELSE 'note ' || i || ' é€😀' END AS note,
         CASE WHEN i % 11 = 0 THEN NULL
              ELSE {'bytes': CASE WHEN i % 7 = 0 THEN NULL
                                  ELSE unhex(md5(i::VARCHAR) || md5((i * 31)::VARCHAR)) END,
                    'path': 'img_' || i || '.jpg'} END AS image,
         (i % 2 = 0) AS flag, (i * 0.25 - 100)::REAL AS f,
         CASE WHEN i % 5 = 0 THEN NULL ELSE i / 7.0 END::DOUBLE AS score,
         (-(i % 300))::SMALLINT AS small, (3000000000 + i)::UINTEGER AS u,
         unhex(repeat(md5(i::VARCHAR), (i % 4) + 1)) AS data
  FROM range(${first}, ${first + n}) r(i)`;

const VARIANTS = [
  // name, [ [first, rows] per file ], COPY options
  // (DuckDB cuts row groups at multiples of 2048 rows.)
  ['v1_snappy', [[0, 3000], [3000, 1300]], 'COMPRESSION snappy, ROW_GROUP_SIZE 2048'],
  ['v2_zstd', [[0, 2500], [2500, 1000]], 'COMPRESSION zstd, ROW_GROUP_SIZE 2048, PARQUET_VERSION v2'],
  ['v2_snappy', [[0, 2100]], 'COMPRESSION snappy, ROW_GROUP_SIZE 2048, PARQUET_VERSION v2'],
  ['v1_gzip', [[0, 2100]], 'COMPRESSION gzip, ROW_GROUP_SIZE 2048'],
  ['v2_uncompressed', [[0, 1500]], 'COMPRESSION uncompressed, PARQUET_VERSION v2'],
];

async function main() {
  const inst = await DuckDBInstance.create(':memory:', { threads: '1' });
  const con = await inst.connect();
  const q = async (sql) => (await con.runAndReadAll(sql)).getRowObjectsJson();
  for (const [name, files, opts] of VARIANTS) {
    const dir = path.join(out, name);
    fs.mkdirSync(dir, { recursive: true });
    const rows = [];
    for (let k = 0; k < files.length; k++) {
      const [first, n] = files[k];
      await con.run(`CREATE OR REPLACE TABLE t AS ${TABLE(n, first)}`);
      const f = path.join(dir, `part-${String(k).padStart(5, '0')}.parquet`);
      await con.run(`COPY t TO '${f}' (FORMAT parquet, ${opts})`);
      rows.push(...await q(`SELECT id, label, cat, note, hex(image.bytes) AS image_hex,
          image.path AS image_path, flag::INTEGER AS flag, f::DOUBLE AS f, score, small, u,
          hex(data) AS data_hex FROM t ORDER BY id`));
    }
    const meta = await q(`SELECT DISTINCT encodings FROM parquet_metadata('${dir}/*.parquet')`);
    const encodings = meta.map((m) => m.encodings).sort();
    const rowGroups = Number((await q(`SELECT count(*) AS n FROM (SELECT DISTINCT file_name,
        row_group_id FROM parquet_metadata('${dir}/*.parquet'))`))[0].n);
    fs.writeFileSync(path.join(out, `${name}.expected.json`),
                     JSON.stringify({ options: opts, encodings, row_groups: rowGroups, rows }));
  }
  // Large binary values: 3 rows of 3.2 MB, uncompressed, and a
  // dictionary-encoded string column beside them.
  const big = path.join(out, 'big');
  fs.mkdirSync(big, { recursive: true });
  await con.run(`CREATE OR REPLACE TABLE b AS
      SELECT i AS id, ['x', 'y'][(i % 2) + 1] AS tag,
             unhex(repeat(md5(i::VARCHAR), 200000 + i)) AS blob FROM range(3) r(i)`);
  await con.run(`COPY b TO '${big}/big.parquet' (FORMAT parquet, COMPRESSION uncompressed)`);
  const brows = await q(`SELECT id, tag, sha256(blob) AS sha256, octet_length(blob) AS nbytes
                         FROM b ORDER BY id`);
  fs.writeFileSync(path.join(out, 'big.expected.json'), JSON.stringify({ rows: brows }));
  await writeLists(con, q);
}

// Lists (HF's Sequence(Image()) is list<struct<bytes, path>>): empty lists
// (every 6th-ish row), null lists (every 13th), null elements, elements
// whose bytes are null, list<varchar> with null elements, list<int>; values
// large enough that a row group's list column takes several pages (rows'
// lists then span page boundaries); several row groups; v1 and v2 pages.
const LISTS = (n, first) => `
  SELECT i AS id,
         CASE WHEN i % 13 = 0 THEN NULL
              ELSE list_transform(range((i * 7) % 6), j ->
                     CASE WHEN (i + j) % 9 = 4 THEN NULL
                          ELSE {'bytes': CASE WHEN (i + j) % 10 = 3 THEN NULL
                                   ELSE unhex(repeat(md5((i * 16 + j)::VARCHAR), 1 + (i * 5 + j) % 700))
                                   END,
                                'path': 'img_' || i || '_' || j || '.jpg'} END) END AS images,
         CASE WHEN i % 17 = 0 THEN NULL
              ELSE list_transform(range(i % 5), j ->
                     CASE WHEN j = 2 THEN NULL ELSE 't' || i || '_' || j END) END AS tags,
         list_transform(range(i % 4), j -> (i * 10 + j)::INTEGER) AS nums
  FROM range(${first}, ${first + n}) r(i)`;

const LIST_VARIANTS = [
  ['lists_v1', [[0, 2600], [2600, 700]], 'COMPRESSION snappy, ROW_GROUP_SIZE 2048'],
  ['lists_v2', [[0, 2300]], 'COMPRESSION zstd, ROW_GROUP_SIZE 2048, PARQUET_VERSION v2'],
];

async function writeLists(con, q) {
  for (const [name, files, opts] of LIST_VARIANTS) {
    const dir = path.join(out, name);
    fs.mkdirSync(dir, { recursive: true });
    const rows = [];
    const chunks = [];
    for (let k = 0; k < files.length; k++) {
      const [first, n] = files[k];
      await con.run(`CREATE OR REPLACE TABLE t AS ${LISTS(n, first)}`);
      const f = path.join(dir, `part-${String(k).padStart(5, '0')}.parquet`);
      await con.run(`COPY t TO '${f}' (FORMAT parquet, ${opts})`);
      // Each element as DuckDB's table holds it (never read from the files).
      rows.push(...await q(`SELECT id,
          CASE WHEN images IS NULL THEN NULL ELSE
            list_transform(images, e -> CASE WHEN e IS NULL THEN NULL
                           ELSE {'hex': hex(e.bytes), 'path': e.path} END) END AS images,
          tags, nums FROM t ORDER BY id`));
      chunks.push(...await q(`SELECT '${f}' AS file, path_in_schema AS col,
          coalesce(dictionary_page_offset, data_page_offset) AS start,
          total_compressed_size AS size FROM parquet_metadata('${f}')`));
    }
    fs.writeFileSync(path.join(out, `${name}.expected.json`),
                     JSON.stringify({ options: opts, rows, chunks }));
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
