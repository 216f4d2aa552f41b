/*
 * schedule.c -- position -> sample: see schedule.h.
 */
#include "schedule/schedule.h"

#include "internal.h"

uint64_t stk__schedule_sample(const stk__schedule *s, uint64_t g, uint64_t slot)
{
    uint64_t epoch = g / s->part.batches;
    stk__order ord;
    stk__order_init(&ord, s->part.n, s->seed, epoch, s->shuffle);
    return stk__schedule_sample_at(s, &ord, epoch, stk__schedule_pos(s, g, slot));
}

/* From the shard-aware order's windows (this epoch's, else the next one's).
 * O(shards). */
bool stk__schedule_next_uses(const stk__schedule *s, uint64_t g, uint64_t *next, size_t nshards)
{
    uint64_t epoch = g / s->part.batches;
    if (s->mix) {
        /* In mixture positions (mix.h), by the layout the epoch started in,
         * as stk__schedule_sample_draw maps them. */
        stk__mix_geom geo = {s->part.n, s->part.per_rank, s->part.world, s->part.local};
        const stk__resumed *r = stk__schedule_resumed(s);
        if (r && r->epoch == epoch) {
            geo.per_rank = r->lay.gens[0].per_rank;
            geo.world = r->lay.gens[0].spec.world;
            geo.local = r->lay.gens[0].spec.local;
        }
        uint64_t t =
            stk__schedule_batch_len(s, g) ? stk__mix_t(&geo, stk__schedule_pos(s, g, 0)) : 0;
        return stk__mix_next_uses(s->mix, epoch, t, next, nshards);
    }
    if (!s->sorder || !s->shard_first)
        return false;
    /* This rank's position in the epoch's global order (positions grow with
     * its samples; with several nodes, within its node's part of it). */
    uint64_t now = stk__schedule_batch_len(s, g) ? stk__schedule_pos(s, g, 0) : 0;
    for (size_t k = 0; k < nshards; k++)
        next[k] = UINT64_MAX;
    for (uint64_t e = epoch; e < epoch + 2; e++) {
        stk__shard_order *t;
        if (stk__shard_order_create(&t, s->shard_first, s->nshards, s->shard_window, s->seed, e,
                                    s->shuffle))
            return false;
        size_t nw = stk__shard_order_windows(t);
        for (size_t w = 0; w < nw; w++) {
            size_t sb, se;
            uint64_t pb, pe;
            stk__shard_order_window(t, w, &sb, &se, &pb, &pe);
            if (e == epoch && pe <= now)
                continue; /* this window is behind us */
            uint64_t ahead = e == epoch ? (pb > now ? pb - now : 0) : s->part.n - now + pb;
            for (size_t j = sb; j < se; j++) {
                size_t k = stk__shard_order_shard(t, j);
                if (k < nshards && next[k] == UINT64_MAX)
                    next[k] = ahead;
            }
        }
        stk__shard_order_destroy(t);
    }
    return true;
}

/* The fetch stage's view of the future (pure functions of g and slot). */
static uint64_t plan_batch_len(void *ctx, uint64_t g)
{
    return stk__schedule_batch_len(ctx, g);
}

static uint64_t plan_sample_at(void *ctx, uint64_t g, uint64_t slot)
{
    return stk__schedule_sample(ctx, g, slot);
}

static bool plan_next_uses(void *ctx, uint64_t g, uint64_t *next, size_t nshards)
{
    return stk__schedule_next_uses(ctx, g, next, nshards);
}

void stk__schedule_plan(stk__schedule *s, stk__fetch_plan *plan)
{
    *plan = (stk__fetch_plan){s, s->batch_size, plan_batch_len, plan_sample_at, plan_next_uses};
}

void stk__schedule_resume(stk__schedule *s, stk__resumed *r)
{
    if (r) {
        r->next = s->resumed_all;
        s->resumed_all = r;
    }
    atomic_store_explicit(&s->resumed, r, memory_order_release);
}

void stk__schedule_free(stk__schedule *s)
{
    stk__shard_orders_destroy(s->sorder);
    s->sorder = NULL;
    stk__free(s->block_first);
    s->block_first = NULL;
    stk__mix_free_orders(s->mix);
    stk__free(s->mix);
    s->mix = NULL;
    for (stk__resumed *r = s->resumed_all, *n; r; r = n) {
        n = r->next;
        stk__layout_free(&r->lay);
        stk__free(r);
    }
    s->resumed_all = NULL;
    atomic_store_explicit(&s->resumed, NULL, memory_order_relaxed);
}
