/* fuzz_stk.c -- libFuzzer target for the .stk parser: the in-memory parser
 * (header, footer, index checks, payload checksums) and the real reader
 * (open through a memfd, then read every sample). Built by
 * scripts/test-fuzz.sh; with -DSTK_FUZZ_REPLAY it is a plain program that
 * replays corpus files given as arguments (the corpus as regular tests). */
#include "source/stkformat.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t count = 0, bad = 0;
    char err[STK_ERRMSG_MAX];
    int rc = stk__stk_parse_buffer(data, size, &count, &bad, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT)
        abort();
    int fd = memfd_create("fuzz.stk", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (stk__write_full(fd, data, size) == STK_OK) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        const char *p = path;
        stk__source s;
        rc = stk__source_stk_open(&s, &p, 1, NULL, err, sizeof err);
        if (rc == STK_OK) {
            /* The reader must agree with the in-memory parser. */
            if (s.count != count)
                abort();
            stk__scratch sc = {NULL, 0, 1u << 26};
            uint64_t failed = 0;
            for (uint64_t i = 0; i < s.count; i++) {
                stk__sink sink = {NULL, 0, &sc};
                uint8_t *d;
                size_t len;
                int64_t label;
                char name[512];
                if (s.ops->read(&s, i, &sink, &d, &len, &label, err, sizeof err) != STK_OK)
                    failed++;
                s.ops->name(&s, i, name, sizeof name);
            }
            if (failed != bad)
                abort();
            stk__scratch_free(&sc);
            stk__source_close(&s);
        } else if (rc != STK_EFORMAT && rc != STK_EEMPTY && rc != STK_EIO) {
            abort();
        }
    }
    close(fd);
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
