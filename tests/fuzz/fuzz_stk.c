/* fuzz_stk.c -- libFuzzer target for the .stk parser: the in-memory parser
 * (header, footer, index checks, payload checksums, and for version 2 the
 * field table and each payload's table) and the real reader (open through a
 * memfd, then read every sample; a fields shard is read twice: its first
 * image field without select, then whole with every field found by the
 * `fields` op). Built by
 * scripts/test-fuzz.sh; linked with replay_main.c it is a plain program that
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
                stk__sink sink = {.grow = &sc};
                uint8_t *d;
                size_t len;
                int64_t label;
                char name[512];
                if (s.ops->read(&s, i, &sink, &d, &len, &label, err, sizeof err) != STK_OK)
                    failed++;
                s.ops->name(&s, i, name, sizeof name);
            }
            if (s.ops->fields) {
                /* A fields shard: the reads above gave each sample's first
                 * image field (failing where a sample has none); whole
                 * samples, then their fields, fail exactly where the
                 * parser's checksum or table checks did. */
                failed = 0;
                if (s.ops->select(&s, ~(uint64_t)0, err, sizeof err) != STK_OK)
                    abort();
                stk__field_set *fs = malloc(sizeof *fs);
                if (!fs)
                    abort();
                for (uint64_t i = 0; i < s.count; i++) {
                    stk__sink sink = {.grow = &sc};
                    uint8_t *d;
                    size_t len;
                    int64_t label;
                    if (s.ops->read(&s, i, &sink, &d, &len, &label, err, sizeof err) != STK_OK ||
                        s.ops->fields(&s, i, d, len, label, fs, err, sizeof err) != STK_OK) {
                        failed++;
                        continue;
                    }
                    for (size_t k = 0; k < fs->n; k++)
                        if (fs->f[k].id >= s.nfields || fs->f[k].data < d ||
                            fs->f[k].data + fs->f[k].len > d + len)
                            abort();
                }
                free(fs);
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
