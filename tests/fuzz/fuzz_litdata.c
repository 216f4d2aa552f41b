/* fuzz_litdata.c -- libFuzzer target for the LitData reader's parsing of
 * untrusted bytes (src/source/litdata.c): index.json (JSON, the config, the
 * serializer names, the pytree spec that names the leaves, the chunk
 * entries), a chunk's item count and offsets table, and the splitting of
 * every item into its leaves by its size header. The input is a u32
 * (little-endian) length, that many bytes of index.json, then the first
 * chunk's (decompressed) bytes. The parser checks that every field it gives
 * lies inside its item (STK_EINVAL otherwise, which fails the run). Linked
 * with replay_main.c it replays corpus files given as arguments. */
#include "source/source.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t samples = 0;
    char err[STK_ERRMSG_MAX];
    int rc = stk__litdata_parse_buffer(data, size, &samples, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_EUNSUPPORTED && rc != STK_EEMPTY &&
        rc != STK_ENOMEM)
        abort();
    /* Each item has an offsets entry of 4 bytes. */
    if (samples > size / 4)
        abort();
    return 0;
}
