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

/* How an epoch of n samples is split over world ranks.
 *
 * The ranks form world / local nodes of `local` ranks each (ranks
 * node * local .. node * local + local - 1, as torchrun numbers them). Each
 * node takes a contiguous chunk of per_rank * local positions of the epoch's
 * order, and the ranks of a node interleave within it: rank r's k-th sample
 * is position (r / local) * per_rank * local + r % local + k * local. With
 * one node (local = world, the default) that is k * world + r, torch's
 * DistributedSampler; with several, the ranks of a node read nearby parts of
 * the order (with the shard-aware order, the same windows of shards), so a
 * cache shared on the node fetches each shard about once. */
typedef struct stk__partition {
    uint64_t n;
    uint64_t per_rank; /* samples each rank delivers per epoch */
    uint64_t batches;  /* batches each rank delivers per epoch */
    uint64_t batch_size;
    unsigned rank, world, local;
} stk__partition;

/* drop_last: floor(n / world) per rank and whole batches only; otherwise
 * ceil(n / world) per rank (padding wraps around the epoch's order) and a
 * partial last batch. Returns STK_EEMPTY when a rank would get no batch.
 * local starts as world (one node). */
int stk__partition_init(stk__partition *p, uint64_t n, unsigned rank, unsigned world,
                        uint64_t batch_size, bool drop_last);

/* Position in the epoch's order of this rank's k-th sample (k < per_rank). */
static inline uint64_t stk__partition_pos(const stk__partition *p, uint64_t k)
{
    uint64_t pos =
        (uint64_t)(p->rank / p->local) * p->per_rank * p->local + p->rank % p->local + k * p->local;
    return pos < p->n ? pos : pos % p->n;
}

/* Samples in batch b (b < batches). */
static inline uint64_t stk__partition_batch_len(const stk__partition *p, uint64_t b)
{
    uint64_t start = b * p->batch_size;
    uint64_t left = p->per_rank - start;
    return left < p->batch_size ? left : p->batch_size;
}

/* ---- Elastic resume: an epoch continued by other worlds -------------------
 * A state saved mid-epoch is a few integers: in lockstep data parallelism
 * every rank has delivered the same number of batches, so what an epoch has
 * consumed follows from the worlds it ran under and their step counts.
 *
 * Generation 0 lays the epoch's order out as above. Generation i + 1 is what
 * generation i left: each node's chunk without the first steps * batch_size *
 * local positions its ranks delivered (and without padding), then (with
 * drop_last) the positions no rank was given, in that order; it is laid out
 * over its own world the same way. A lookup maps a position of the last
 * generation's sequence back through the pieces of each generation to the
 * epoch's order: O(generations x log nodes). */
#define STK_LAYOUT_MAX_GENS 17 /* 16 saved generations and the current one */

typedef struct stk__gen_spec {
    uint32_t world, local;
    uint64_t batch_size;
    uint64_t steps; /* batches each rank delivered (ignored for the last) */
} stk__gen_spec;

typedef struct stk__gen {
    stk__gen_spec spec;
    uint64_t R; /* positions in this generation's sequence */
    uint64_t per_rank, batches;
    size_t npieces;        /* pieces of the previous generation's sequence */
    uint64_t *start, *src; /* piece p: [start[p], start[p+1]) -> src[p] + ... */
} stk__gen;

typedef struct stk__layout {
    size_t ngens;
    stk__gen gens[STK_LAYOUT_MAX_GENS];
    unsigned rank;
    bool drop_last;
} stk__layout;

/* Builds the layout of an epoch of n positions from its generations
 * (ngens >= 1, the last one the loader's own) for rank `rank` of the last.
 * STK_OK; STK_EINVAL with the reason in err (a world or batch size of 0, a
 * local size that does not divide its world, steps past a generation's
 * batches, too many generations); STK_ENOMEM. The last generation may have
 * no batch (the epoch is over): batches 0. */
int stk__layout_build(stk__layout *lay, uint64_t n, const stk__gen_spec *gens, size_t ngens,
                      unsigned rank, bool drop_last, char *err, size_t errlen);
void stk__layout_free(stk__layout *lay);
/* Position in the epoch's order of this rank's k-th sample of the last
 * generation (k < its per_rank). */
uint64_t stk__layout_pos(const stk__layout *lay, uint64_t k);
/* Samples in batch b of the last generation. */
uint64_t stk__layout_batch_len(const stk__layout *lay, uint64_t b);

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
 * owns a copy of shard_first, shared by its tables, and allocates both
 * tables (one array of nshards + 1 uint64 each) at init: another epoch's
 * table is refilled in place, so a lookup never allocates and never fails
 * (one position of an epoch taken from another order than the rest would
 * repeat some samples and drop others).
 *
 * Locking: one mutex, held for a lookup or for building a missing table
 * (O(nshards), once per epoch); it takes no other lock and does no I/O, so
 * it may be taken under any other lock of the library (it is innermost). */
typedef struct stk__shard_orders stk__shard_orders;

/* Same arguments and codes as stk__shard_order_create, less the epoch. */
int stk__shard_orders_init(stk__shard_orders **out, const uint64_t *shard_first, size_t nshards,
                           unsigned window, uint64_t seed, bool shuffle);
void stk__shard_orders_destroy(stk__shard_orders *c); /* NULL is harmless */

/* The sample at position pos (pos < n) of epoch `epoch` in *sample, filling
 * that epoch's table when the cache does not hold it (the least recently
 * used of the two is replaced, in place). Any thread. Always STK_OK: it
 * allocates nothing. */
int stk__shard_orders_at(stk__shard_orders *c, uint64_t epoch, uint64_t pos, uint64_t *sample);

#endif
