/* fuzz_tar.c -- libFuzzer target for the tar parser (member headers, GNU
 * long names, pax records, sample grouping, .cls/.json label scans) and the
 * multi-field grouping on its index (every member a field: extension ids,
 * the fields described, each sample's selected range and its field refs
 * with every field selected, duplicate members). stk__tar_parse_buffer
 * checks that every index entry, member, range and ref lies inside the
 * input and that the index passes the cache's own checks (STK_EINVAL
 * otherwise, which fails the run). Linked with replay_main.c it replays
 * corpus files given as arguments (the multifield-*.tar seeds hold
 * several fields, keys with dots, duplicates, empty members, upper-case
 * and more than 64 distinct extensions). */
#include "source/stkformat.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t samples = 0;
    char err[STK_ERRMSG_MAX];
    int rc = stk__tar_parse_buffer(data, size, &samples, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_ENOMEM)
        abort();
    if (samples > size / 512 + 1)
        abort();
    return 0;
}
