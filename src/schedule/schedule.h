/*
 * schedule.h -- which sample sits at each position of the loader's stream.
 *
 * Batches are numbered globally, g = epoch * batches_per_epoch + b. The
 * schedule answers, as pure functions of (g, slot): how many samples batch g
 * has, the position in its epoch's order of each slot (this rank's part of
 * the epoch, or a resumed epoch's elastic layout), and the dataset sample at
 * that position (the global order, or the shard-aware one). The workers ask
 * it which sample to make; the fetch stage asks it (through the plan it
 * builds, stk__schedule_plan) which samples are coming.
 *
 * Threads: every query runs without the loader's lock. The one mutable part,
 * the resumed epoch's layout, is published with release by
 * stk__schedule_resume (under the loader's lock, with no worker in a slot)
 * and kept until stk__schedule_free, so a reader never sees it freed.
 * The shard-order cache has its own mutex (lock 4 of internal.h).
 */
#ifndef STK_SCHEDULE_H
#define STK_SCHEDULE_H

#include "fetch/fetch.h"
#include "internal.h"
#include "order.h"
#include "schedule/mix.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* An epoch continued from a saved state under another world: its batches
 * [off, batches) of the epoch are the last generation's 0.. */
typedef struct stk__resumed {
    stk__layout lay;
    uint64_t epoch, off;
    struct stk__resumed *next; /* resumed_all */
} stk__resumed;

typedef struct stk__schedule {
    stk__partition part; /* this rank's batches of an epoch */
    size_t batch_size;
    uint64_t seed;
    bool shuffle;
    stk__shard_orders *sorder; /* shard-aware order, or NULL: global */
    unsigned shard_window;
    const uint64_t *shard_first; /* the source's shards (for next_uses); NULL
                                    with the block order (the cache's eviction
                                    then falls back to LRU) */
    size_t nshards;
    uint64_t *block_first; /* order "blocks": nblocks + 1 entries (owned) */
    size_t nblocks;
    /* Elastic resume: the epoch a restored state continued under another
     * world, laid out by its generations (order.h); `resumed_all` keeps
     * every one made. */
    _Atomic(stk__resumed *) resumed;
    stk__resumed *resumed_all;
    /* A mixture of sources (mix.h; owned), or NULL: part.n is then its
     * epoch, and positions map to the composite source's ids. */
    stk__mix *mix;
} stk__schedule;

/* The resumed epoch's layout now (NULL: none). */
static inline const stk__resumed *stk__schedule_resumed(const stk__schedule *s)
{
    return atomic_load_explicit(&s->resumed, memory_order_acquire);
}

/* The per-sample queries are inline: the workers ask them for every sample.
 *
 * The dataset sample at position pos of epoch `epoch`'s order (ord: the
 * global order of that epoch, used when the order is not shard-aware).
 * Shard-aware lookups never fail (their tables are allocated at open,
 * order.h), so no position of an epoch can take the global order. */
static inline uint64_t stk__schedule_sample_at(const stk__schedule *s, const stk__order *ord,
                                               uint64_t epoch, uint64_t pos);

/* The same, and the epoch that keys the sample's random draws (*draw): the
 * epoch itself, except for a mixture's repeated passes over a source, which
 * draw afresh (mix.h). A mixture maps positions by the layout the epoch
 * started in (its first generation when resumed under another world), so a
 * position keeps its sample whatever world reads it. */
static inline uint64_t stk__schedule_sample_draw(const stk__schedule *s, const stk__order *ord,
                                                 uint64_t epoch, uint64_t pos, uint64_t *draw)
{
    if (s->mix) {
        stk__mix_geom g = {s->part.n, s->part.per_rank, s->part.world, s->part.local};
        const stk__resumed *r = stk__schedule_resumed(s);
        if (r && r->epoch == epoch) {
            const stk__gen *g0 = &r->lay.gens[0];
            g.per_rank = g0->per_rank;
            g.world = g0->spec.world;
            g.local = g0->spec.local;
        }
        return stk__mix_sample(s->mix, &g, epoch, pos, draw);
    }
    *draw = epoch;
    return stk__schedule_sample_at(s, ord, epoch, pos);
}

static inline uint64_t stk__schedule_sample_at(const stk__schedule *s, const stk__order *ord,
                                               uint64_t epoch, uint64_t pos)
{
    uint64_t i;
    if (s->mix)
        return stk__schedule_sample_draw(s, ord, epoch, pos, &i);
    if (s->sorder && stk__shard_orders_at(s->sorder, epoch, pos, &i) == STK_OK)
        return i;
    return stk__order_at(ord, pos);
}

/* The resumed epoch's layout when global batch g belongs to it, else NULL;
 * *bi gets g's batch within its generation then. */
static inline const stk__resumed *stk__schedule_resumed_for(const stk__schedule *s, uint64_t g,
                                                            uint64_t *bi)
{
    const stk__resumed *r = stk__schedule_resumed(s);
    uint64_t e = g / s->part.batches, b = g % s->part.batches;
    if (!r || r->epoch != e)
        return NULL;
    *bi = b >= r->off ? b - r->off : UINT64_MAX;
    return r;
}

/* Samples in global batch g (0 for the batches a resumed epoch skips). */
static inline uint64_t stk__schedule_batch_len(const stk__schedule *s, uint64_t g)
{
    uint64_t bi;
    const stk__resumed *r = stk__schedule_resumed_for(s, g, &bi);
    if (r)
        return bi == UINT64_MAX ? 0 : stk__layout_batch_len(&r->lay, bi);
    return stk__partition_batch_len(&s->part, g % s->part.batches);
}

/* Position in its epoch's order of slot `slot` of global batch g. */
static inline uint64_t stk__schedule_pos(const stk__schedule *s, uint64_t g, uint64_t slot)
{
    uint64_t bi;
    const stk__resumed *r = stk__schedule_resumed_for(s, g, &bi);
    if (r)
        return stk__layout_pos(&r->lay, bi * s->batch_size + slot);
    return stk__partition_pos(&s->part, (g % s->part.batches) * s->batch_size + slot);
}

/* The dataset sample at slot `slot` of global batch g. */
uint64_t stk__schedule_sample(const stk__schedule *s, uint64_t g, uint64_t slot);
/* For the cache's eviction: how many sample positions after global batch g
 * each shard is next read (UINT64_MAX: unknown); false with a global order.
 * A mixture counts mixture positions, for its order-"shards" sources'
 * shards in the fetch stage's table (stk__mix_next_uses). */
bool stk__schedule_next_uses(const stk__schedule *s, uint64_t g, uint64_t *next, size_t nshards);
/* The fetch stage's plan: thin callbacks over the queries above. */
void stk__schedule_plan(stk__schedule *s, stk__fetch_plan *plan);

/* Makes r (owned from here; NULL: none) the resumed layout. Only while no
 * worker is in a slot and no batch is being assigned (the loader's seek). */
void stk__schedule_resume(stk__schedule *s, stk__resumed *r);
/* The block order's blocks of src (blocks.c): nblocks + 1 entries in *first
 * (block b holds samples [first[b], first[b+1])), each block a run of
 * consecutive samples of one shard within block_bytes (at least one
 * sample). STK_EINVAL (no shards), STK_ENOMEM. */
int stk__blocks_make(const stk__source *src, uint64_t block_bytes, uint64_t **first,
                     size_t *nblocks, char *err, size_t errlen);

/* Frees the shard-order cache and every resumed layout. */
void stk__schedule_free(stk__schedule *s);

#endif
