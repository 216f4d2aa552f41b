/*
 * mix.c -- the mixture's schedule: see mix.h.
 */
#include "schedule/mix.h"

#include <math.h>
#include <string.h>

int stk__mix_quotas(const double *weights, const uint64_t *samples, const uint64_t *sizes,
                    size_t nsrc, uint64_t *N, uint64_t *quota, char *err, size_t errlen)
{
    if (!nsrc || nsrc > STK__MIX_MAX_SOURCES) {
        stk__fmt(err, errlen, "a mixture needs 1 to %d sources (has %zu)", STK__MIX_MAX_SOURCES,
                 nsrc);
        return STK_EINVAL;
    }
    uint64_t fixed = 0, weighted_size = 0;
    double wsum = 0;
    size_t by_weight = 0, by_size = 0;
    for (size_t s = 0; s < nsrc; s++) {
        if (!samples[s] && weights[s] > 0)
            by_weight++;
        else if (!samples[s])
            by_size++;
    }
    if (by_weight && by_size) {
        /* A weight and a size are not in one unit: 0.5 beside 1000 samples
         * would silently give the sized source nearly everything. */
        stk__fmt(err, errlen,
                 "%zu mixture sources have a weight and %zu have neither a weight nor a number "
                 "of samples: give every source without a number of samples a weight, or none "
                 "of them (then each is weighted by its size)",
                 by_weight, by_size);
        return STK_EINVAL;
    }
    for (size_t s = 0; s < nsrc; s++) {
        if (!sizes[s]) {
            stk__fmt(err, errlen, "mixture source %zu has no samples", s);
            return STK_EINVAL;
        }
        if (samples[s]) {
            if (fixed > UINT64_MAX - samples[s])
                goto too_many;
            fixed += samples[s];
        } else {
            if (weighted_size > UINT64_MAX - sizes[s])
                goto too_many;
            weighted_size += sizes[s];
            wsum += weights[s] > 0 ? weights[s] : (double)sizes[s];
        }
    }
    if (!*N) {
        if (fixed > UINT64_MAX - weighted_size)
            goto too_many;
        *N = fixed + weighted_size;
    }
    if (fixed > *N) {
        stk__fmt(err, errlen,
                 "the mixture's sources ask for %llu samples an epoch in all, more than "
                 "samples_per_epoch %llu",
                 (unsigned long long)fixed, (unsigned long long)*N);
        return STK_EINVAL;
    }
    uint64_t rest = *N - fixed;
    if (rest && wsum <= 0) {
        stk__fmt(err, errlen,
                 "every mixture source has a fixed number of samples (%llu in all), which must "
                 "then equal samples_per_epoch %llu",
                 (unsigned long long)fixed, (unsigned long long)*N);
        return STK_EINVAL;
    }
    /* Largest remainder (Hamilton): floors, then one more to the sources
     * with the largest fractional parts (ties to the lower index), so the
     * quotas sum to N exactly and none is off its share by a whole sample. */
    long double frac[STK__MIX_MAX_SOURCES];
    uint64_t given = 0;
    for (size_t s = 0; s < nsrc; s++) {
        frac[s] = -1;
        if (samples[s]) {
            quota[s] = samples[s];
            continue;
        }
        double w = weights[s] > 0 ? weights[s] : (double)sizes[s];
        long double x = (long double)rest * (long double)w / (long double)wsum;
        long double f = floorl(x);
        quota[s] = f >= (long double)rest ? rest : (uint64_t)f;
        frac[s] = x - f;
        given += quota[s];
    }
    while (given > rest) { /* rounding of long double near 2^64 */
        for (size_t s = 0; s < nsrc && given > rest; s++)
            if (!samples[s] && quota[s])
                quota[s]--, given--;
    }
    while (given < rest) {
        size_t best = SIZE_MAX;
        for (size_t s = 0; s < nsrc; s++)
            if (!samples[s] && (best == SIZE_MAX || frac[s] > frac[best]))
                best = s;
        quota[best]++;
        frac[best] = -1;
        given++;
        bool any = false;
        for (size_t s = 0; s < nsrc; s++)
            any |= !samples[s] && frac[s] >= 0;
        if (!any) /* more to give than sources (cannot happen: < nsrc left) */
            for (size_t s = 0; s < nsrc; s++)
                frac[s] = samples[s] ? -1 : 0;
    }
    if (!*N) {
        stk__fmt(err, errlen, "the mixture's epoch has no samples");
        return STK_EINVAL;
    }
    return STK_OK;
too_many:
    stk__fmt(err, errlen, "the mixture's sources have more than 2^64 samples in all");
    return STK_EINVAL;
}

int stk__mix_init(stk__mix *m, const uint64_t *quota, const uint64_t *sizes, size_t nsrc,
                  uint64_t seed, bool shuffle)
{
    if (!nsrc || nsrc > STK__MIX_MAX_SOURCES)
        return STK_EINVAL;
    memset(m, 0, sizeof *m);
    m->nsrc = nsrc;
    m->seed = seed;
    m->shuffle = shuffle;
    m->block = 1;
    /* The live subtrees: a leaf or a node each, with its quota. Sources of
     * quota 0 never appear. */
    int32_t live[STK__MIX_MAX_SOURCES];
    uint64_t lq[STK__MIX_MAX_SOURCES];
    size_t nlive = 0, nnodes = 0;
    for (size_t s = 0; s < nsrc; s++) {
        m->quota[s] = quota[s];
        m->size[s] = sizes[s];
        m->offset[s + 1] = m->offset[s] + sizes[s];
        m->N += quota[s];
        if (quota[s]) {
            live[nlive] = -(int32_t)s - 1;
            lq[nlive++] = quota[s];
        }
    }
    if (!nlive)
        return STK_EINVAL;
    /* Huffman-like: merge the two smallest (ties: the earlier). Small shares
     * sit deep, where the window error a level adds is scaled by their small
     * share of the node above (mix.h). */
    while (nlive > 1) {
        size_t i1 = 0, i2 = 1;
        if (lq[i2] < lq[i1])
            i1 = 1, i2 = 0;
        for (size_t k = 2; k < nlive; k++) {
            if (lq[k] < lq[i1])
                i2 = i1, i1 = k;
            else if (lq[k] < lq[i2])
                i2 = k;
        }
        stk__mix_node *nd = &m->nodes[nnodes];
        nd->a = live[i1];
        nd->b = live[i2];
        nd->na = lq[i1];
        nd->n = lq[i1] + lq[i2];
        size_t lo = i1 < i2 ? i1 : i2, hi = i1 < i2 ? i2 : i1;
        live[lo] = (int32_t)nnodes++;
        lq[lo] = nd->n;
        live[hi] = live[nlive - 1];
        lq[hi] = lq[nlive - 1];
        nlive--;
    }
    m->root = live[0];
    for (size_t k = 0; k < nsrc; k++) {
        m->leaf_up[k] = -1;
        m->fetch_off[k] = SIZE_MAX;
    }
    for (size_t v = 0; v < nnodes; v++) {
        int32_t ch[2] = {m->nodes[v].a, m->nodes[v].b};
        for (int j = 0; j < 2; j++) {
            if (ch[j] >= 0)
                m->node_up[ch[j]] = (int32_t)v;
            else
                m->leaf_up[-(ch[j] + 1)] = (int32_t)v;
        }
    }
    if (m->root >= 0)
        m->node_up[m->root] = -1;
    return STK_OK;
}

/* The phases' key of epoch `epoch`, and node v's phase under it (mix.h). */
static uint64_t phase_key(const stk__mix *m, uint64_t epoch)
{
    return stk__mix64(stk__mix64(m->seed ^ 0x4d49585048ULL) ^ epoch);
}

static uint64_t node_phase(const stk__mix *m, uint64_t key, int32_t v)
{
    return stk__mix64(key ^ ((uint64_t)v + 1) * 0x9e3779b97f4a7c15ULL) % m->nodes[v].n;
}

void stk__mix_at(const stk__mix *m, uint64_t epoch, uint64_t t, size_t *src, uint64_t *rank)
{
    uint64_t key = phase_key(m, epoch);
    int32_t v = m->root;
    uint64_t p = t;
    while (v >= 0) {
        const stk__mix_node *nd = &m->nodes[v];
        uint64_t phi = node_phase(m, key, v);
        unsigned __int128 x = (unsigned __int128)p * nd->na + phi;
        uint64_t lo = (uint64_t)(x / nd->n);
        uint64_t hi = (uint64_t)((x + nd->na) / nd->n);
        if (hi > lo) {
            p = lo;
            v = nd->a;
        } else {
            p -= lo;
            v = nd->b;
        }
    }
    *src = (size_t)(-(v + 1));
    *rank = p;
}

uint64_t stk__mix_kth(const stk__mix *m, uint64_t epoch, size_t s, uint64_t k, uint64_t *pass)
{
    uint64_t n = m->size[s];
    *pass = k / n;
    if (m->sorder[s]) {
        /* The source's shard-aware order, its table keyed by (epoch, pass)
         * in place of the epoch (pass 0: the epoch itself; the cache holds
         * two such tables, refilled in place, so a lookup never fails). */
        uint64_t key =
            *pass ? stk__mix64(epoch ^ *pass * 0x9e3779b97f4a7c15ULL) | (1ULL << 63) : epoch;
        uint64_t i = 0;
        stk__shard_orders_at(m->sorder[s], key, k % n, &i);
        return i;
    }
    stk__order o;
    /* A permutation per (seed, source, pass) of each epoch. */
    uint64_t seed = stk__mix64(m->seed ^ ((uint64_t)s + 1) * 0xd1b54a32d192ed03ULL) ^
                    stk__mix64(*pass + 0x50415353ULL);
    stk__order_init(&o, n, seed, epoch, m->shuffle);
    return stk__order_at(&o, k % n);
}

uint64_t stk__mix_t(const stk__mix_geom *g, uint64_t pos)
{
    uint64_t P = g->per_rank * g->world, C = g->per_rank * g->local;
    if (P <= g->n) {
        /* drop_last (or an exact split): positions past the ranks' are never
         * read by this world (a later one reads them in their order). */
        if (pos >= P)
            return pos;
        uint64_t m = pos / C, o = pos % C;
        return m * C + (o % g->local) * g->per_rank + o / g->local;
    }
    /* Padding: the last node's chunk is partly past n; count only the real
     * positions of its ranks (those below n). */
    uint64_t nf = g->n / C;
    if (pos < nf * C) {
        uint64_t m = pos / C, o = pos % C;
        return m * C + (o % g->local) * g->per_rank + o / g->local;
    }
    uint64_t real = g->n - nf * C, o = pos - nf * C;
    uint64_t j = o % g->local, k = o / g->local;
    uint64_t kfull = real / g->local, j0 = real % g->local;
    return nf * C + j * kfull + (j < j0 ? j : j0) + k;
}

uint64_t stk__mix_sample(const stk__mix *m, const stk__mix_geom *g, uint64_t epoch, uint64_t pos,
                         uint64_t *draw_epoch)
{
    size_t s;
    uint64_t k, pass, t = stk__mix_t(g, pos);
    stk__mix_at(m, epoch, t / m->block, &s, &k);
    k = k * m->block + t % m->block; /* per-source batches: whole units */
    uint64_t local = stk__mix_kth(m, epoch, s, k, &pass);
    /* Pass 0 keeps the epoch's draws; a repeat of a sample in the same
     * epoch draws its augmentations afresh. */
    *draw_epoch = pass ? stk__mix64(epoch ^ pass * 0x9e3779b97f4a7c15ULL) : epoch;
    return m->offset[s] + local;
}

size_t stk__mix_source_of(const stk__mix *m, uint64_t i)
{
    return stk__run_of(m->offset, m->nsrc, i);
}

int stk__mix_set_order(stk__mix *m, size_t s, const uint64_t *units, size_t nunits, unsigned window)
{
    /* Keyed by the source too: two sources of as many shards must not walk
     * their shards in step. */
    uint64_t seed = stk__mix64(m->seed ^ ((uint64_t)s + 1) * 0xd1b54a32d192ed03ULL);
    return stk__shard_orders_init(&m->sorder[s], units, nunits, window, seed, m->shuffle);
}

void stk__mix_set_shards(stk__mix *m, size_t s, const uint64_t *shard_first, size_t nshards,
                         unsigned window, size_t fetch_off)
{
    m->shard_first[s] = shard_first;
    m->nshards[s] = nshards;
    m->window[s] = window;
    m->fetch_off[s] = fetch_off;
}

/* In units of the schedule (block positions each): the inverse of the walk
 * of stk__mix_at from source s's leaf up. At a node of quota n whose child a
 * has na, child a's r-th position is the smallest p with
 * floor(((p + 1) na + phi) / n) = r + 1, p = ceil(((r + 1) n - phi) / na) - 1;
 * child b's r-th is the smallest p with p + 1 - floor(((p + 1) na + phi) / n)
 * = r + 1, p = floor((r n + phi) / (n - na)). */
static uint64_t unit_pos_of(const stk__mix *m, uint64_t epoch, size_t s, uint64_t r)
{
    uint64_t key = phase_key(m, epoch);
    int32_t child = -(int32_t)s - 1;
    for (int32_t v = m->leaf_up[s]; v >= 0; child = v, v = m->node_up[v]) {
        const stk__mix_node *nd = &m->nodes[v];
        unsigned __int128 phi = node_phase(m, key, v);
        if (nd->a == child) {
            unsigned __int128 x = ((unsigned __int128)r + 1) * nd->n - phi;
            r = (uint64_t)((x + nd->na - 1) / nd->na) - 1;
        } else {
            r = (uint64_t)(((unsigned __int128)r * nd->n + phi) / (nd->n - nd->na));
        }
    }
    return r;
}

/* Source s's units among the first u of the epoch: the walk of stk__mix_at
 * from the root, counting. Child a's positions before p at a node are
 * floor((p na + phi) / n) (its phase is under n, so none before 0). */
static uint64_t unit_count_before(const stk__mix *m, uint64_t epoch, size_t s, uint64_t u)
{
    int32_t path[STK__MIX_MAX_SOURCES], child = -(int32_t)s - 1;
    size_t depth = 0;
    if (!m->quota[s])
        return 0; /* not in the tree */
    for (int32_t v = m->leaf_up[s]; v >= 0; child = v, v = m->node_up[v])
        path[depth++] = child; /* the child taken at each node, leaf first */
    uint64_t key = phase_key(m, epoch);
    int32_t v = m->root;
    while (depth--) {
        const stk__mix_node *nd = &m->nodes[v];
        uint64_t a = (uint64_t)(((unsigned __int128)u * nd->na + node_phase(m, key, v)) / nd->n);
        u = nd->a == path[depth] ? a : u - a;
        v = path[depth];
    }
    return u;
}

uint64_t stk__mix_pos_of(const stk__mix *m, uint64_t epoch, size_t s, uint64_t k)
{
    return unit_pos_of(m, epoch, s, k / m->block) * m->block + k % m->block;
}

uint64_t stk__mix_count_before(const stk__mix *m, uint64_t epoch, size_t s, uint64_t t)
{
    uint64_t u = t / m->block, c = unit_count_before(m, epoch, s, u) * m->block;
    if (t % m->block && u * m->block < m->N) {
        size_t at;
        uint64_t r;
        stk__mix_at(m, epoch, u, &at, &r);
        c += at == s ? t % m->block : 0; /* inside one of s's batches */
    }
    return c;
}

/* Source s's windows read from its rank `from` on (from < quota) in epoch
 * `epoch`, in the order read: next[] of each shard not given yet gets the
 * distance from position t (+ base, the positions to the epoch's start) to
 * its window's first read. Ranks [p n, p n + n) are pass p of the source
 * (keyed as in stk__mix_kth); a pass after the first reads every shard, so
 * two passes are enough. *left counts the shards not given yet. */
static bool source_next_uses(const stk__mix *m, size_t s, uint64_t epoch, uint64_t from, uint64_t t,
                             uint64_t base, uint64_t *next, size_t *left)
{
    uint64_t n = m->size[s], q = m->quota[s] * m->block;
    uint64_t seed = stk__mix64(m->seed ^ ((uint64_t)s + 1) * 0xd1b54a32d192ed03ULL);
    uint64_t *out = next + m->fetch_off[s];
    for (uint64_t p = from / n; p * n < q && p <= from / n + 1 && *left; p++) {
        uint64_t key = p ? stk__mix64(epoch ^ p * 0x9e3779b97f4a7c15ULL) | (1ULL << 63) : epoch;
        stk__shard_order *o;
        if (stk__shard_order_create(&o, m->shard_first[s], m->nshards[s], m->window[s], seed, key,
                                    m->shuffle))
            return false;
        size_t nw = stk__shard_order_windows(o);
        for (size_t w = 0; w < nw && *left; w++) {
            size_t sb, se;
            uint64_t pb, pe;
            stk__shard_order_window(o, w, &sb, &se, &pb, &pe);
            uint64_t kb = p * n + pb, ke = p * n + pe;
            if (ke > q)
                ke = q;
            if (kb < from)
                kb = from;
            if (kb >= ke)
                continue; /* read before `from`, past the quota, or empty */
            uint64_t at = base + stk__mix_pos_of(m, epoch, s, kb) - t;
            for (size_t j = sb; j < se; j++) {
                size_t x = stk__shard_order_shard(o, j);
                if (out[x] == UINT64_MAX) {
                    out[x] = at;
                    --*left;
                }
            }
        }
        stk__shard_order_destroy(o);
    }
    return true;
}

bool stk__mix_lru_only = false;

bool stk__mix_next_uses(const stk__mix *m, uint64_t epoch, uint64_t t, uint64_t *next,
                        size_t nshards)
{
    if (stk__mix_lru_only)
        return false;
    for (size_t x = 0; x < nshards; x++)
        next[x] = UINT64_MAX;
    for (size_t s = 0; s < m->nsrc; s++) {
        if (!m->nshards[s] || m->fetch_off[s] == SIZE_MAX || !m->quota[s] ||
            m->fetch_off[s] > nshards || m->nshards[s] > nshards - m->fetch_off[s])
            continue;
        size_t left = m->nshards[s];
        uint64_t from = stk__mix_count_before(m, epoch, s, t);
        if ((from < m->quota[s] * m->block &&
             !source_next_uses(m, s, epoch, from, t, 0, next, &left)) ||
            !source_next_uses(m, s, epoch + 1, 0, t, m->N, next, &left))
            return false;
    }
    return true;
}

void stk__mix_free_orders(stk__mix *m)
{
    for (size_t s = 0; m && s < m->nsrc; s++) {
        stk__shard_orders_destroy(m->sorder[s]);
        m->sorder[s] = NULL;
    }
}
