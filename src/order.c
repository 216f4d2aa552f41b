/* order.c -- seeded bijective permutation and rank partition; see order.h. */
#include "order.h"

#include <pthread.h>
#include <string.h>

void stk__order_init(stk__order *o, uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle)
{
    o->n = n;
    o->shuffle = shuffle;
    /* At least 8 bits: a Feistel network with 1- or 2-bit halves is far
     * from a uniform shuffle (measured: the first positions of n = 5..32 were
     * strongly biased). Cycle walking keeps the cost bounded: an epoch of
     * n < 256 needs at most 256 evaluations in all. */
    unsigned b = 8;
    while (b < 64 && (1ULL << b) < n)
        b++;
    o->lbits = b / 2;
    o->rbits = b - o->lbits;
    uint64_t k = stk__mix64(stk__mix64(seed ^ 0x4f52444552ULL) + epoch);
    for (int r = 0; r < STK_ORDER_ROUNDS; r++) {
        k = stk__mix64(k + 0x9e3779b97f4a7c15ULL);
        o->keys[r] = k;
    }
}

static uint64_t feistel(const stk__order *o, uint64_t x)
{
    const uint64_t lmask = (1ULL << o->lbits) - 1, rmask = (1ULL << o->rbits) - 1;
    uint64_t l = x >> o->rbits, r = x & rmask;
    for (int i = 0; i < STK_ORDER_ROUNDS; i++) {
        /* Alternate which half changes: each round is invertible on its own
         * (xor with a function of the untouched half), so the whole is a
         * bijection even with unequal halves. */
        if (i & 1)
            l ^= stk__mix64(o->keys[i] ^ r) & lmask;
        else
            r ^= stk__mix64(o->keys[i] ^ l) & rmask;
    }
    return (l << o->rbits) | r;
}

uint64_t stk__order_at(const stk__order *o, uint64_t k)
{
    if (!o->shuffle || o->n <= 1)
        return k;
    /* Cycle walking: the orbit of k < n under the domain permutation returns
     * to [0, n), so the walk ends, and restricting a permutation this way is
     * again a permutation of [0, n). */
    uint64_t x = feistel(o, k);
    while (x >= o->n)
        x = feistel(o, x);
    return x;
}

int stk__partition_init(stk__partition *p, uint64_t n, unsigned rank, unsigned world,
                        uint64_t batch_size, bool drop_last)
{
    p->n = n;
    p->rank = rank;
    p->world = world;
    p->local = world;
    p->batch_size = batch_size;
    p->per_rank = drop_last ? n / world : (n + world - 1) / world;
    p->batches = drop_last ? p->per_rank / batch_size : (p->per_rank + batch_size - 1) / batch_size;
    if (drop_last)
        p->per_rank = p->batches * batch_size;
    return p->batches ? STK_OK : STK_EEMPTY;
}

/* ---- Elastic layouts ---------------------------------------------------- */

static void gen_sizes(stk__gen *g, bool drop_last)
{
    uint64_t W = g->spec.world, B = g->spec.batch_size;
    g->per_rank = drop_last ? g->R / W : (g->R + W - 1) / W;
    g->batches = drop_last ? g->per_rank / B : (g->per_rank + B - 1) / B;
    if (drop_last)
        g->per_rank = g->batches * B;
}

void stk__layout_free(stk__layout *lay)
{
    for (size_t i = 0; i < lay->ngens; i++) {
        stk__free(lay->gens[i].start);
        stk__free(lay->gens[i].src);
    }
    memset(lay, 0, sizeof *lay);
}

int stk__layout_build(stk__layout *lay, uint64_t n, const stk__gen_spec *gens, size_t ngens,
                      unsigned rank, bool drop_last, char *err, size_t errlen)
{
    memset(lay, 0, sizeof *lay);
    if (!ngens || ngens > STK_LAYOUT_MAX_GENS) {
        stk__fmt(err, errlen, "a resumed epoch may change worlds at most %d times, not %zu",
                 STK_LAYOUT_MAX_GENS - 1, ngens ? ngens - 1 : 0);
        return STK_EINVAL;
    }
    lay->rank = rank;
    lay->drop_last = drop_last;
    for (size_t i = 0; i < ngens; i++) {
        stk__gen *g = &lay->gens[i];
        g->spec = gens[i];
        if (!g->spec.world || !g->spec.local || g->spec.world % g->spec.local ||
            !g->spec.batch_size) {
            stk__fmt(err, errlen,
                     "generation %zu of the state: world %u, %u ranks a node, batch size %llu "
                     "(the world must be a whole number of nodes)",
                     i, g->spec.world, g->spec.local, (unsigned long long)g->spec.batch_size);
            stk__layout_free(lay);
            return STK_EINVAL;
        }
        lay->ngens = i + 1;
        if (i == 0) {
            g->R = n;
        } else {
            /* What generation i - 1 left, piece by piece. */
            const stk__gen *p = &lay->gens[i - 1];
            uint64_t L = p->spec.local, nodes = p->spec.world / L, chunk = p->per_rank * L;
            uint64_t used = p->spec.steps * p->spec.batch_size * L;
            if (used > chunk)
                used = chunk;
            g->start = stk__malloc((nodes + 2) * sizeof *g->start);
            g->src = stk__malloc((nodes + 1) * sizeof *g->src);
            if (!g->start || !g->src) {
                stk__layout_free(lay);
                return STK_ENOMEM;
            }
            uint64_t at = 0;
            for (uint64_t j = 0; j <= nodes; j++) {
                uint64_t lo, hi;
                if (j < nodes) {
                    lo = j * chunk + used;
                    hi = (j + 1) * chunk;
                } else {
                    lo = nodes * chunk; /* never given to a rank (drop_last) */
                    hi = p->R;
                }
                if (hi > p->R)
                    hi = p->R;
                if (lo >= hi)
                    continue;
                g->start[g->npieces] = at;
                g->src[g->npieces] = lo;
                g->npieces++;
                at += hi - lo;
            }
            g->start[g->npieces] = at;
            g->R = at;
        }
        gen_sizes(g, drop_last);
        if (i + 1 < ngens && g->spec.steps > g->batches) {
            stk__fmt(err, errlen,
                     "generation %zu of the state delivered %llu batches, but it had only %llu", i,
                     (unsigned long long)g->spec.steps, (unsigned long long)g->batches);
            stk__layout_free(lay);
            return STK_EINVAL;
        }
    }
    if (rank >= lay->gens[ngens - 1].spec.world) {
        stk__fmt(err, errlen, "rank %u is outside the world of %u", rank,
                 lay->gens[ngens - 1].spec.world);
        stk__layout_free(lay);
        return STK_EINVAL;
    }
    return STK_OK;
}

uint64_t stk__layout_pos(const stk__layout *lay, uint64_t k)
{
    const stk__gen *g = &lay->gens[lay->ngens - 1];
    uint64_t L = g->spec.local;
    uint64_t x = (uint64_t)(lay->rank / L) * g->per_rank * L + lay->rank % L + k * L;
    if (g->R)
        x %= g->R; /* padding wraps around this generation's sequence */
    for (size_t i = lay->ngens - 1; i > 0; i--) {
        const stk__gen *c = &lay->gens[i];
        size_t lo = 0, hi = c->npieces;
        while (hi - lo > 1) { /* the piece holding x */
            size_t mid = lo + (hi - lo) / 2;
            if (c->start[mid] <= x)
                lo = mid;
            else
                hi = mid;
        }
        x = c->src[lo] + (x - c->start[lo]);
    }
    return x;
}

uint64_t stk__layout_batch_len(const stk__layout *lay, uint64_t b)
{
    const stk__gen *g = &lay->gens[lay->ngens - 1];
    uint64_t start = b * g->spec.batch_size;
    if (start >= g->per_rank)
        return 0;
    uint64_t left = g->per_rank - start;
    return left < g->spec.batch_size ? left : g->spec.batch_size;
}

/* ---- Shard-aware order ---------------------------------------------------- */

/* Distinct tags keep the shard and window levels, and the global sample
 * order, from sharing a key for the same (seed, epoch). */
#define SHARD_TAG  0x5348415244ULL /* "SHARD" */
#define WINDOW_TAG 0x57494e444fULL /* "WINDO" */

/* Largest j in [lo, hi) with prefix[j] <= x, given prefix[lo] <= x <
 * prefix[hi]. That slot's shard is not empty (prefix[j + 1] > x), so empty
 * shards are skipped without special cases. */
static size_t slot_of(const uint64_t *prefix, size_t lo, size_t hi, uint64_t x)
{
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (prefix[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Fills o for epoch `epoch`, into its prefix table of nshards + 1 entries
 * (allocated by the caller): allocates nothing, so it cannot fail. */
static void shard_order_fill(stk__shard_order *o, const uint64_t *first, size_t nshards,
                             unsigned window, uint64_t seed, uint64_t epoch, bool shuffle)
{
    o->first = first;
    o->nshards = nshards;
    o->window = window;
    o->shuffle = shuffle;
    o->epoch = epoch;
    o->n = first[nshards] - first[0];
    o->wkey = stk__mix64(stk__mix64(seed ^ WINDOW_TAG) + epoch);
    stk__order_init(&o->shards, nshards, stk__mix64(seed ^ SHARD_TAG), epoch, shuffle);
    o->prefix[0] = 0;
    for (size_t j = 0; j < nshards; j++) {
        size_t k = (size_t)stk__order_at(&o->shards, j);
        o->prefix[j + 1] = o->prefix[j] + (first[k + 1] - first[k]);
    }
}

/* Fills o (with o->first set) for epoch `epoch`. */
static int shard_order_build(stk__shard_order *o, const uint64_t *first, size_t nshards,
                             unsigned window, uint64_t seed, uint64_t epoch, bool shuffle)
{
    o->prefix = stk__malloc((nshards + 1) * sizeof *o->prefix);
    if (!o->prefix)
        return STK_ENOMEM;
    shard_order_fill(o, first, nshards, window, seed, epoch, shuffle);
    return STK_OK;
}

static bool shard_first_valid(const uint64_t *first, size_t nshards, unsigned window)
{
    if (!first || window == 0 || nshards > SIZE_MAX / sizeof(uint64_t) - 1)
        return false;
    for (size_t k = 0; k < nshards; k++)
        if (first[k + 1] < first[k])
            return false;
    return true;
}

int stk__shard_order_create(stk__shard_order **out, const uint64_t *shard_first, size_t nshards,
                            unsigned window, uint64_t seed, uint64_t epoch, bool shuffle)
{
    int rc = STK_OK;
    stk__shard_order *o = NULL;
    *out = NULL;
    if (!shard_first_valid(shard_first, nshards, window)) {
        rc = STK_EINVAL;
        goto out;
    }
    o = stk__calloc(1, sizeof *o);
    if (!o) {
        rc = STK_ENOMEM;
        goto out;
    }
    o->owned_first = stk__malloc((nshards + 1) * sizeof *o->owned_first);
    if (!o->owned_first) {
        rc = STK_ENOMEM;
        goto out;
    }
    memcpy(o->owned_first, shard_first, (nshards + 1) * sizeof *o->owned_first);
    rc = shard_order_build(o, o->owned_first, nshards, window, seed, epoch, shuffle);
out:
    if (rc != STK_OK)
        stk__shard_order_destroy(o);
    else
        *out = o;
    return rc;
}

void stk__shard_order_destroy(stk__shard_order *o)
{
    if (!o)
        return;
    stk__free(o->prefix);
    stk__free(o->owned_first);
    stk__free(o);
}

void stk__shard_order_window(const stk__shard_order *o, size_t w, size_t *slot_begin,
                             size_t *slot_end, uint64_t *pos_begin, uint64_t *pos_end)
{
    size_t b = w * o->window;
    size_t e = o->nshards - b > o->window ? b + o->window : o->nshards;
    *slot_begin = b;
    *slot_end = e;
    *pos_begin = o->prefix[b];
    *pos_end = o->prefix[e];
}

size_t stk__shard_order_window_of(const stk__shard_order *o, uint64_t pos)
{
    return slot_of(o->prefix, 0, o->nshards, pos) / o->window;
}

uint64_t stk__shard_order_at(const stk__shard_order *o, uint64_t pos)
{
    if (!o->shuffle)
        return o->first[0] + pos;
    size_t sb, se;
    uint64_t pb, pe;
    stk__shard_order_window(o, stk__shard_order_window_of(o, pos), &sb, &se, &pb, &pe);
    /* The window's own permutation, keyed by (seed, epoch, w): setting it up
     * is a handful of mixes, cheaper than keeping one per window. */
    stk__order q;
    stk__order_init(&q, pe - pb, o->wkey, sb / o->window, true);
    uint64_t x = pb + stk__order_at(&q, pos - pb);
    size_t j = slot_of(o->prefix, sb, se, x);
    return o->first[stk__shard_order_shard(o, j)] + (x - o->prefix[j]);
}

/* ---- The two-epoch cache ----------------------------------------------------- */

struct stk__shard_orders {
    pthread_mutex_t lock; /* guards slot[] and tick */
    uint64_t *first;      /* the copy of shard_first, borrowed by the tables */
    size_t nshards;
    unsigned window;
    uint64_t seed;
    bool shuffle;
    uint64_t tick; /* lookups so far, for least-recently-used replacement */
    /* Both tables' memory is allocated at init and refilled in place for
     * another epoch, so a lookup never allocates and never fails: a lookup
     * that could fail would leave its caller a position with no sample, or
     * one taken from another order than its neighbours' (samples repeated
     * and dropped). */
    struct {
        stk__shard_order t;
        bool built;    /* t holds epoch t.epoch */
        uint64_t used; /* tick of the last lookup */
    } slot[2];
};

int stk__shard_orders_init(stk__shard_orders **out, const uint64_t *shard_first, size_t nshards,
                           unsigned window, uint64_t seed, bool shuffle)
{
    int rc = STK_OK;
    stk__shard_orders *c = NULL;
    *out = NULL;
    if (!shard_first_valid(shard_first, nshards, window)) {
        rc = STK_EINVAL;
        goto out;
    }
    c = stk__calloc(1, sizeof *c);
    if (!c) {
        rc = STK_ENOMEM;
        goto out;
    }
    c->first = stk__malloc((nshards + 1) * sizeof *c->first);
    for (int i = 0; i < 2 && c->first; i++)
        if (!(c->slot[i].t.prefix = stk__malloc((nshards + 1) * sizeof *c->slot[i].t.prefix)))
            rc = STK_ENOMEM;
    if (!c->first || rc != STK_OK) {
        stk__free(c->slot[0].t.prefix);
        stk__free(c->slot[1].t.prefix);
        stk__free(c->first);
        stk__free(c);
        c = NULL;
        rc = STK_ENOMEM;
        goto out;
    }
    memcpy(c->first, shard_first, (nshards + 1) * sizeof *c->first);
    c->nshards = nshards;
    c->window = window;
    c->seed = seed;
    c->shuffle = shuffle;
    pthread_mutex_init(&c->lock, NULL);
out:
    *out = c;
    return rc;
}

void stk__shard_orders_destroy(stk__shard_orders *c)
{
    if (!c)
        return;
    for (int i = 0; i < 2; i++)
        stk__free(c->slot[i].t.prefix);
    pthread_mutex_destroy(&c->lock);
    stk__free(c->first);
    stk__free(c);
}

int stk__shard_orders_at(stk__shard_orders *c, uint64_t epoch, uint64_t pos, uint64_t *sample)
{
    pthread_mutex_lock(&c->lock);
    int i = 0;
    while (i < 2 && !(c->slot[i].built && c->slot[i].t.epoch == epoch))
        i++;
    if (i == 2) {
        /* Refill the least recently used table in place. The lookup and the
         * refill stay under the lock, so no reader is using it. */
        if (!c->slot[0].built)
            i = 0;
        else if (!c->slot[1].built)
            i = 1;
        else
            i = c->slot[0].used <= c->slot[1].used ? 0 : 1;
        shard_order_fill(&c->slot[i].t, c->first, c->nshards, c->window, c->seed, epoch,
                         c->shuffle);
        c->slot[i].built = true;
    }
    c->slot[i].used = ++c->tick;
    *sample = stk__shard_order_at(&c->slot[i].t, pos);
    pthread_mutex_unlock(&c->lock);
    return STK_OK;
}
