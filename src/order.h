/*
 * order.h -- the epoch's sample order: a seeded bijective permutation of
 * [0, n) computed on the fly (O(1) memory in n, random access to position k),
 * the shard-aware order (shuffled shards read a window at a time, samples
 * shuffled within each window) with its two-epoch cache, and the partition
 * of an epoch across ranks.
 *
 * The permutation is a 6-round Feistel network on the smallest power-of-two
 * domain 2^b >= max(n, 256) (halves of floor(b/2) and ceil(b/2) bits, each round xors one
 * half with a keyed hash of the other), walked in cycles until the value falls
 * inside [0, n). For n >= 256 the domain is less than 2n, so a lookup costs
 * under two Feistel evaluations on average.
 */
#ifndef STK_ORDER_H
#define STK_ORDER_H

#include "internal.h"

#define STK_ORDER_ROUNDS 6

typedef struct stk__order {
    uint64_t n;
    bool shuffle;
    unsigned lbits, rbits;
    uint64_t keys[STK_ORDER_ROUNDS];
} stk__order;

/* The order of epoch `epoch` for a dataset of n samples. shuffle false gives
 * the natural order. */
void stk__order_init(stk__order *o, uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle);

/* The sample at position k (k < n). */
uint64_t stk__order_at(const stk__order *o, uint64_t k);

/* How an epoch of n samples is split over world ranks. */
typedef struct stk__partition {
    uint64_t n;
    uint64_t per_rank; /* samples each rank delivers per epoch */
    uint64_t batches;  /* batches each rank delivers per epoch */
    uint64_t batch_size;
    unsigned rank, world;
} stk__partition;

/* drop_last: floor(n / world) per rank and whole batches only; otherwise
 * ceil(n / world) per rank (padding wraps around the epoch's order) and a
 * partial last batch. Returns STK_EEMPTY when a rank would get no batch. */
int stk__partition_init(stk__partition *p, uint64_t n, unsigned rank, unsigned world,
                        uint64_t batch_size, bool drop_last);

/* Position in the epoch's order of this rank's k-th sample (k < per_rank):
 * ranks interleave (rank, rank + world, ...), as torch's DistributedSampler. */
static inline uint64_t stk__partition_pos(const stk__partition *p, uint64_t k)
{
    uint64_t pos = k * p->world + p->rank;
    return pos < p->n ? pos : pos % p->n;
}

/* Samples in batch b (b < batches). */
static inline uint64_t stk__partition_batch_len(const stk__partition *p, uint64_t b)
{
    uint64_t start = b * p->batch_size;
    uint64_t left = p->per_rank - start;
    return left < p->batch_size ? left : p->batch_size;
}

/* ---- Shard-aware order ----------------------------------------------------
 * For a dataset read from shards through a cache much smaller than the
 * dataset: epoch e visits the shards in a shuffled order, taken W at a time
 * (a window), and mixes the samples of a window's shards together. Every
 * position of a window maps to a sample of that window's shards, so a reader
 * needs only about W shards at a time, and the order is still a bijection of
 * the epoch's samples (exactly once) and a function of (seed, epoch) alone.
 *
 * Both levels use the Feistel permutation above, so nothing is materialised
 * but one prefix sum per shard:
 *   - shard level: slot j of the epoch holds shard P(j), P keyed by
 *     (seed, epoch);
 *   - window w holds slots [wW, min(wW + W, nshards)), that is positions
 *     [prefix[wW], prefix[min(wW + W, nshards)]), and position
 *     prefix[wW] + q is the window's Q_w(q)-th sample, counting through its
 *     shards in slot order; Q_w is keyed by (seed, epoch, w).
 * A lookup is two binary searches over the prefix sums (the second only over
 * the window's W slots) and one walk of each permutation (under two Feistel
 * evaluations each on average for 256 or more samples in the window and
 * shards in the epoch; fewer items walk a 256-value domain). */
typedef struct stk__shard_order {
    uint64_t n;      /* samples in the epoch */
    size_t nshards;  /* shards, empty ones included */
    unsigned window; /* W: shards per window */
    bool shuffle;    /* false: the natural order (identity) */
    uint64_t epoch;
    uint64_t wkey;         /* the window level's key, from (seed, epoch) */
    const uint64_t *first; /* nshards + 1 entries: shard k is [first[k], first[k+1]) */
    uint64_t *owned_first; /* first when the table owns it (NULL: borrowed from a cache) */
    stk__order shards;     /* P: slot -> shard */
    /* prefix[j]: samples in slots [0, j), nshards + 1 entries; the window
     * boundaries are the entries at multiples of W, so they need no table. */
    uint64_t *prefix;
} stk__shard_order;

/* Shard-aware order for epoch `epoch`: shuffle the shards (a seeded bijective
 * permutation of [0, nshards), keyed by (seed, epoch)), group the shuffled
 * shards into consecutive windows of `window` shards, and within each window
 * shuffle the samples of its shards together (a permutation keyed by
 * (seed, epoch, window index)). shard_first has nshards + 1 non-decreasing
 * entries: shard k holds samples [shard_first[k], shard_first[k+1]) (empty
 * shards are allowed; the epoch is the n = shard_first[nshards] -
 * shard_first[0] samples from shard_first[0] on). The array is copied.
 * shuffle == false gives the natural order (identity). Memory: two arrays of
 * nshards + 1 uint64 (the copy of shard_first and the prefix sums in shuffled
 * order), built once in O(nshards); lookups O(log nshards).
 * Returns STK_OK; STK_EINVAL (NULL shard_first, window 0, entries
 * decreasing); STK_ENOMEM. *out is NULL on error. */
int stk__shard_order_create(stk__shard_order **out, const uint64_t *shard_first, size_t nshards,
                            unsigned window, uint64_t seed, uint64_t epoch, bool shuffle);
void stk__shard_order_destroy(stk__shard_order *o); /* NULL is harmless */

/* The sample at position pos (pos < n) of the epoch. The table is read-only:
 * any number of threads may look up at once. */
uint64_t stk__shard_order_at(const stk__shard_order *o, uint64_t pos);

/* Samples in the epoch. */
static inline uint64_t stk__shard_order_len(const stk__shard_order *o)
{
    return o->n;
}

/* Windows in the epoch: ceil(nshards / W) (a window of empty shards only
 * has no positions). */
static inline size_t stk__shard_order_windows(const stk__shard_order *o)
{
    return o->nshards / o->window + (o->nshards % o->window != 0);
}

/* The shard in slot j (j < nshards) of the epoch's shard order. */
static inline size_t stk__shard_order_shard(const stk__shard_order *o, size_t j)
{
    return (size_t)stk__order_at(&o->shards, j);
}

/* Window w (w < windows): its slots [*slot_begin, *slot_end) and its
 * positions [*pos_begin, *pos_end). Positions in that range read only the
 * shards of those slots, and every sample of those shards once. */
void stk__shard_order_window(const stk__shard_order *o, size_t w, size_t *slot_begin,
                             size_t *slot_end, uint64_t *pos_begin, uint64_t *pos_end);

/* The window of position pos (pos < n). */
size_t stk__shard_order_window_of(const stk__shard_order *o, uint64_t pos);

/* A thread-safe cache of the tables of the last two epochs used (claims of
 * the workers cross an epoch boundary, so two epochs are live at once). It
 * owns a copy of shard_first, shared by its tables, so each held epoch costs
 * one more array of nshards + 1 uint64.
 *
 * Locking: one mutex, held for a lookup or for building a missing table
 * (O(nshards), once per epoch); it takes no other lock and does no I/O, so
 * it may be taken under any other lock of the library (it is innermost). */
typedef struct stk__shard_orders stk__shard_orders;

/* Same arguments and codes as stk__shard_order_create, less the epoch. */
int stk__shard_orders_init(stk__shard_orders **out, const uint64_t *shard_first, size_t nshards,
                           unsigned window, uint64_t seed, bool shuffle);
void stk__shard_orders_destroy(stk__shard_orders *c); /* NULL is harmless */

/* The sample at position pos (pos < n) of epoch `epoch` in *sample, building
 * that epoch's table when the cache does not hold it (the least recently
 * used of the two is replaced). Any thread. STK_OK, or STK_ENOMEM when the
 * table cannot be built (the cache is unchanged then). */
int stk__shard_orders_at(stk__shard_orders *c, uint64_t epoch, uint64_t pos, uint64_t *sample);

#endif
