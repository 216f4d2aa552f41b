/* fuzz_tar.c -- libFuzzer target for the tar parser (member headers, GNU
 * long names, pax records, sample grouping, .cls/.json label scans). The
 * parser checks that every index entry it builds lies inside the input
 * (STK_EINVAL otherwise, which fails the run). With -DSTK_FUZZ_REPLAY it replays corpus files given
 * as arguments. */
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

#ifdef STK_FUZZ_REPLAY
int main(int argc, char **argv)
{
    int failed = 0;
    for (int k = 1; k < argc; k++) {
        FILE *f = fopen(argv[k], "rb");
        if (!f) {
            fprintf(stderr, "%s: cannot open\n", argv[k]);
            failed = 1;
            continue;
        }
        uint8_t *b = NULL;
        size_t n = 0, cap = 0, r;
        do {
            if (n == cap) {
                cap = cap ? cap * 2 : 65536;
                b = realloc(b, cap);
            }
            r = fread(b + n, 1, cap - n, f);
            n += r;
        } while (r > 0);
        fclose(f);
        LLVMFuzzerTestOneInput(b, n);
        free(b);
    }
    return failed;
}
#endif
