/* fuzz_tar.c -- libFuzzer target for the tar parser (member headers, GNU
 * long names, pax records, sample grouping, .cls/.json label scans). The
 * parser checks that every index entry it builds lies inside the input
 * (STK_EINVAL otherwise, which fails the run). Linked with replay_main.c it
 * replays corpus files given as arguments. */
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
