/* fuzz_stkindex.c -- libFuzzer target for the consolidated index parser
 * (stoker.index, src/source/stkindex.c): the structure parser, then each
 * shard's part through the checks a remote open applies to it. Every input
 * is parsed twice: as it is, and with its checksums (the index's header and
 * trailer, then each part's header, footer and region checksums) recomputed,
 * so mutations reach the bounds checks behind the checksums instead of
 * stopping at the first. Built by scripts/test-fuzz.sh; linked with
 * replay_main.c it replays the corpus as a regular test. */
#include "source/stkindex.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse_and_check(uint8_t *p, size_t n, int fix)
{
    stk__stkindex ix;
    char err[STK_ERRMSG_MAX];
    int rc = stk__stkindex_parse(p, n, &ix, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_ENOMEM)
        abort();
    if (rc != STK_OK)
        return;
    uint64_t samples = 0;
    for (size_t k = 0; k < ix.n; k++) {
        stk__stkindex_shard *s = &ix.sh[k];
        if (s->name_len == 0 || s->region + s->region_len > p + n || s->hdr < p)
            abort();
        if (fix) {
            /* The parts point into p, which is ours to change. */
            uint8_t *hdr = (uint8_t *)(uintptr_t)s->hdr, *foot = (uint8_t *)(uintptr_t)s->foot;
            stk__put64(hdr + 56, stk__xxh3(hdr, 56));
            stk__put64(foot + 32, stk__xxh3(s->region, s->region_len));
            stk__put64(foot + 48, stk__xxh3(foot, 48));
        }
        stk__stk_header h;
        stk__stk_footer f;
        int64_t maxl = -1;
        rc = stk__stkindex_check_shard(s, &h, &f, &maxl, err, sizeof err);
        if (rc != STK_OK && rc != STK_EFORMAT)
            abort();
        if (rc == STK_OK && (f.count != s->count || maxl > INT32_MAX))
            abort();
        samples += s->count;
    }
    if (samples != ix.samples)
        abort();
    stk__stkindex_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *p = malloc(size ? size : 1);
    if (!p)
        return 0;
    memcpy(p, data, size);
    parse_and_check(p, size, 0);
    memcpy(p, data, size);
    if (size >= STK_INDEX_HEAD + STK_INDEX_TRAILER) {
        stk__put64(p + 40, size);
        stk__put64(p + 56, stk__xxh3(p, 56));
        memcpy(p + size - 8, STK_INDEX_END, 8);
        stk__put64(p + size - STK_INDEX_TRAILER, stk__xxh3(p, size - STK_INDEX_TRAILER));
        parse_and_check(p, size, 1);
    }
    free(p);
    return 0;
}
