/* fuzz_parquet.c -- libFuzzer target for the Parquet reader's parsing of
 * untrusted bytes (src/source/parquet.c): the footer, the Thrift compact
 * FileMetaData (schema tree, row groups, column chunks), then every row of
 * every field read as the loader reads it -- page headers, the snappy,
 * gzip and zstd codecs, definition levels, dictionaries, PLAIN, DELTA and
 * BYTE_STREAM_SPLIT values -- and the reader's record split back into its
 * fields. The input is one Parquet file's bytes. The entry point fails with
 * STK_EINVAL (an abort here) when its own record does not split. Seeds:
 * tests/fuzz/make_parquet_corpus.js. Linked with replay_main.c it replays
 * corpus files given as arguments. */
#include "source/source.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t samples = 0;
    char err[STK_ERRMSG_MAX];
    int rc = stk__parquet_parse_buffer(data, size, &samples, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_EUNSUPPORTED && rc != STK_EEMPTY &&
        rc != STK_ENOMEM)
        abort();
    /* Rows come from row groups of at most 2^16 rows (the entry point's
     * limit), each described by some footer bytes. */
    if (samples > ((uint64_t)size << 16))
        abort();
    return 0;
}
