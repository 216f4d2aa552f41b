/*
 * fetch.h -- the fetch stage: reads remote samples' bytes ahead of the
 * decode workers, in exactly the order the loader will ask for them.
 *
 * The loader's order is deterministic, so the stage knows its future: from
 * the production cursor it walks the coming batches slot by slot (a
 * "sequence number" seq = g * batch_size + slot), groups the samples it has
 * not yet asked for by shard, merges neighbours whose gap is small into one
 * ranged GET, and keeps those requests in flight on the remote store's I/O
 * thread. A worker that reaches slot (g, s) finds the bytes there already in
 * steady state; it waits only when the network is slower than decoding.
 *
 * Bounded: the bytes buffered and in flight stay under `buffer_bytes`,
 * except that a worker asking for a sample the planner has not reached yet
 * plans it at once (at most threads x one claim run of samples beyond the
 * budget; counted in the memory bound).
 *
 * With a disk cache (cache.h), whole shards are downloaded into the cache
 * (each in parallel ranged parts written at their place in the cache file)
 * and samples read from there, from a part as soon as it is on disk; a
 * shard the cache cannot admit, or whose download fails, is read by ranged
 * GETs as above.
 *
 * Threads: stk__fetch_read from any worker; stk__fetch_reset and cancel from
 * the loader with no worker inside read (reset) or any time (cancel,
 * interrupt). Lock order: stk_loader.lock may be held while calling reset or
 * interrupt (the stage never calls back into the loader); fetch.lock is never
 * held while calling the remote engine (a request may complete at once, and
 * its callback takes fetch.lock).
 */
#ifndef STK_FETCH_H
#define STK_FETCH_H

#include "source/source.h"

/* The loader's future: how many samples global batch g has, and which
 * dataset sample sits at slot `slot` of it. Pure functions of their
 * arguments; called with the fetch lock held. */
typedef struct stk__fetch_plan {
    void *ctx;
    uint64_t batch_size;
    uint64_t (*batch_len)(void *ctx, uint64_t g);
    uint64_t (*sample_at)(void *ctx, uint64_t g, uint64_t slot);
    /* Optional (shard-aware order): fills next[k] with how far ahead of
     * global batch g shard k is next read (in sample positions; UINT64_MAX
     * when unknown), for the cache's furthest-next-use eviction. Returns
     * false when it cannot tell (global order). */
    bool (*next_uses)(void *ctx, uint64_t g, uint64_t *next, size_t nshards);
} stk__fetch_plan;

/* The most samples planned ahead (fetch_lookahead): the ring of planned
 * entries and their chunk headers count in the memory bound, and a million
 * samples ahead is already far past what keeps every request slot busy. */
#define STK_FETCH_LOOKAHEAD_MAX ((uint64_t)1 << 20)

typedef struct stk__fetch_cfg {
    uint64_t buffer_bytes; /* budget for bytes buffered + in flight (default 64 MiB;
                              order "blocks": max(64 MiB, 3 windows + 2 blocks)) */
    uint64_t coalesce_gap; /* merge neighbours up to this gap (default 16 KiB) */
    uint64_t max_request;  /* largest merged request (default 8 MiB) */
    uint64_t lookahead;    /* most samples planned ahead (default: max(2 batches,
                              2 x concurrency, 256)) */
    unsigned concurrency;  /* the store's requests in flight (for the default) */
    unsigned threads;      /* workers (for the memory bound) */
    /* Order "blocks" (schedule/blocks.c): block b is samples [block_first[b],
     * block_first[b+1]), consecutive in one shard; a sample not read from the
     * cache comes with its whole block, one request, kept until the block's
     * planned samples are consumed. NULL: samples are merged by gap. */
    const uint64_t *block_first;
    size_t nblocks;
    /* Blocks per window of the order (shard_window; 0: 8). With blocks and
     * no buffer_bytes given, the default budget is sized in windows (see
     * fetch.c, "the block order's budget"). */
    unsigned block_window;
    const char *cache_dir; /* disk cache of whole shards, or NULL */
    uint64_t cache_limit;  /* bytes */
} stk__fetch_cfg;

typedef struct stk__fetch stk__fetch;

typedef struct stk__fetch_stats {
    uint64_t requests, retries, failures, bytes, inflight, inflight_peak;
    uint64_t samples, sample_bytes; /* samples delivered to workers, their bytes */
    uint64_t overfetch_bytes;       /* gap bytes fetched by merging */
    uint64_t waits, wait_ns;        /* reads that had to wait for the network */
    uint64_t buffered, buffered_peak;
    uint64_t cache_hits, cache_misses, cache_evictions, cache_bytes, cache_fallbacks;
    uint64_t io_busy_ns;
    uint64_t completed, request_ns, first_byte_ns; /* attempts ended, their summed times */
    uint64_t cache_write_errors, cache_dropped;
    uint64_t throttled, rate;
    uint64_t hedges, hedge_wins;
    uint64_t cache_partial_reads, cache_cold_ranged; /* cold cache: see stk_fetch_stats */
    uint64_t cache_download_parts;
} stk__fetch_stats;

/* The size of a download's parts (fetch.c): 8 MiB; tests set it smaller
 * before a loader opens, to split their small shards. */
extern uint64_t stk__fetch_part_bytes;

/* Creates the stage for a remote source (src->remote and ops->locate set).
 * Plans nothing until stk__fetch_reset. STK_EINVAL for a lookahead over
 * STK_FETCH_LOOKAHEAD_MAX. */
int stk__fetch_create(stk__fetch **out, stk__source *src, const stk__fetch_plan *plan,
                      const stk__fetch_cfg *cfg, char *err, size_t errlen);
/* stk__fetch_memory_bound of a stage that stk__fetch_create would make
 * with these arguments, for sizing memory before it exists (depth "auto":
 * order "blocks" buffers windows of blocks by default). Opens nothing. */
uint64_t stk__fetch_bound(const stk__source *src, const stk__fetch_plan *plan,
                          const stk__fetch_cfg *cfg);
/* Stops planning and wakes waiting workers (their reads fail). */
void stk__fetch_cancel(stk__fetch *f);
/* A seek is coming: reads waiting on the network now, or until the
 * following stk__fetch_reset, fail at once ("interrupted") instead of
 * waiting for their requests, so the loader need not wait for the network
 * to drop the batches they fill. Any thread. */
void stk__fetch_interrupt(stk__fetch *f);
/* Frees the stage, after the workers have stopped and the source's store has
 * been closed (which completes the stage's requests). NULL is harmless. */
void stk__fetch_destroy(stk__fetch *f);
/* Drops what was planned and plans from global batch g on (and ends an
 * interrupt). */
void stk__fetch_reset(stk__fetch *f, uint64_t g);
/* Reads sample i, at slot `slot` of global batch g, into the sink: the same
 * contract as stk__source_ops.read. */
int stk__fetch_read(stk__fetch *f, uint64_t g, uint64_t slot, uint64_t i, stk__sink *sink,
                    uint8_t **data, size_t *len, int64_t *label, char *err, size_t errlen);
void stk__fetch_stats_get(stk__fetch *f, stk__fetch_stats *st);
/* Peak bytes the stage allocates (its buffers and tables). */
uint64_t stk__fetch_memory_bound(const stk__fetch *f);

#endif
