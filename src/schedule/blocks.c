/*
 * blocks.c -- the block order's blocks (docs/engine.md, "order blocks"): runs
 * of consecutive samples of one shard holding about block_bytes, so that a
 * remote dataset read without a cache takes one request per block instead of
 * one per sample (the fetch stage fetches a block whole and keeps it until
 * its samples are consumed). The order itself is the shard-aware one with
 * blocks in place of shards: blocks shuffled, samples shuffled within
 * windows of shard_window blocks.
 */
#include "schedule/schedule.h"

int stk__blocks_make(const stk__source *src, uint64_t block_bytes, uint64_t **out, size_t *nout,
                     char *err, size_t errlen)
{
    *out = NULL;
    *nout = 0;
    if (!src->nshards || !src->shard_first) {
        stk__fmt(err, errlen,
                 "order \"blocks\" needs a dataset of shards (.stk or .tar); this one (%s) has "
                 "none",
                 src->ops->kind);
        return STK_EINVAL;
    }
    uint64_t *first = NULL;
    size_t n = 0, cap = 0;
    /* Without locate (a local tar), sample sizes are unknown: blocks of a
     * count that gives about block_bytes at the shards' mean sample size. */
    uint64_t total = 0;
    for (size_t k = 0; src->shard_bytes && k < src->nshards; k++)
        total += src->shard_bytes[k];
    uint64_t mean = src->count && total ? total / src->count : 0;
    uint64_t per = mean ? block_bytes / mean : 64;
    per = per < 1 ? 1 : per;
    for (size_t k = 0; k < src->nshards; k++) {
        uint64_t i = src->shard_first[k], end = src->shard_first[k + 1];
        while (i < end) {
            if (stk__grow((void **)&first, &cap, n + 2, sizeof *first)) {
                stk__free(first);
                stk__fmt(err, errlen, "out of memory for the block order's blocks");
                return STK_ENOMEM;
            }
            first[n++] = i;
            if (!src->ops->locate) {
                i = end - i > per ? i + per : end;
                continue;
            }
            /* Grow the block while the next sample still fits (a block
             * always takes at least one sample). */
            size_t shard;
            uint64_t off0, len, off;
            src->ops->locate(src, i, &shard, &off0, &len);
            for (i++; i < end; i++) {
                src->ops->locate(src, i, &shard, &off, &len);
                if (off + len - off0 > block_bytes)
                    break;
            }
        }
    }
    first[n] = src->shard_first[src->nshards];
    *out = first;
    *nout = n;
    return STK_OK;
}
