/*
 * mix.h -- a weighted mixture of sources (docs/mixing.md): which source, and
 * which of its samples, supplies each position of an epoch.
 *
 * An epoch is N positions; source s supplies exactly quota[s] of them
 * (sum quota = N). Which source supplies position t is a closed-form function
 * of (seed, epoch, t): a binary tree over the sources (built like a Huffman
 * code: the two smallest quotas merged first), and at each node of quota n
 * split into children of quotas na + nb, position p (0 <= p < n) goes to child
 * a iff floor(((p + 1) na + phi) / n) > floor((p na + phi) / n) -- a balanced
 * (Christoffel) word with phase phi in [0, n) drawn from (seed, epoch, node).
 * Its rank inside child a is floor((p na + phi) / n), inside b p minus that.
 * So the walk from the root gives the source and the rank k of t among that
 * source's positions in O(depth), with O(1) memory, and every window of L
 * consecutive positions holds within 2 of L quota[s] / N samples of s
 * (strictly: between floor(L q / N) - 1 and ceil(L q / N) + 1; at the root
 * the error is under 1, each level adds under 1 times the share below it;
 * tests/c/test_mix_schedule.c checks every window).
 *
 * The k-th position of source s in epoch e reads pass p = k / size[s] of it,
 * sample perm_{seed, e, s, p}(k % size[s]) (order.h's permutation): a quota
 * below the size takes a prefix of the epoch's permutation, a larger one
 * repeats with a fresh permutation per pass, so each pass reads each sample
 * exactly once. With order "shards" (or "blocks") that permutation is the
 * source's own shard-aware order over its shards (blocks) instead, keyed by
 * (seed, s) and by (e, p): the source's k-th samples then walk a window of
 * its shards at a time, whatever the other sources do.
 *
 * Positions: the schedule gives mixture positions t, not the epoch order's
 * positions directly. A rank reads epoch positions with a stride (order.h's
 * partition), and a balanced word is not balanced along a stride (weights
 * 1/2 + 1/2 and two ranks would give each rank one source). So position pos
 * of the epoch maps to t by the epoch's first layout (the world it started
 * in, stk__mix_geom): rank r's k-th sample is t = r * per_rank + k (counting
 * only real positions, not padding), so each rank's stream, and each of its
 * batches, is a window of t. A resumed epoch keeps its first world's map, so
 * positions keep their samples whatever world reads the rest (exactly once).
 *
 * Everything is read-only after init: any thread may query.
 */
#ifndef STK_MIX_H
#define STK_MIX_H

#include "internal.h"
#include "order.h"

#include <stdbool.h>
#include <stdint.h>

#define STK__MIX_MAX_SOURCES 256

typedef struct stk__mix_node {
    uint64_t n, na; /* quota of the node and of its child a */
    int32_t a, b;   /* children: >= 0 a node, < 0 leaf -(s + 1) */
} stk__mix_node;

typedef struct stk__mix {
    size_t nsrc;
    uint64_t N;                                /* positions per epoch */
    uint64_t quota[STK__MIX_MAX_SOURCES];      /* per source per epoch */
    uint64_t size[STK__MIX_MAX_SOURCES];       /* samples of source s */
    uint64_t offset[STK__MIX_MAX_SOURCES + 1]; /* composite id of source s's sample 0 */
    stk__mix_node nodes[STK__MIX_MAX_SOURCES]; /* nsrc - 1 used (sources with quota > 0) */
    int32_t root;                              /* node index, or a leaf -(s + 1) */
    uint64_t seed;
    bool shuffle;
    /* Mixture positions per schedule unit: 1, or with mix_batching
     * "per_source" the batch size (quota and N then count batches, and a
     * whole batch of consecutive positions comes from one source). */
    uint64_t block;
    /* Order "shards" / "blocks": per source, its shard-aware order over its
     * shards (or blocks), or NULL: its global permutation (a source of no
     * shards, or order "global"). Set after init (stk__mix_set_order). */
    stk__shard_orders *sorder[STK__MIX_MAX_SOURCES];
    /* The tree's parents (stk__mix_init): of node v, and of source s's leaf
     * (-1: the root), for the inverse walks of stk__mix_next_uses. */
    int32_t node_up[STK__MIX_MAX_SOURCES], leaf_up[STK__MIX_MAX_SOURCES];
    /* For the cache's eviction (stk__mix_next_uses): source s read in order
     * "shards" over its own shards (borrowed from the child source;
     * nshards[s] 0: not, as with order "global" or "blocks"), which are the
     * fetch stage's shards [fetch_off[s], fetch_off[s] + nshards[s]) when it
     * fetches them (SIZE_MAX: it does not). Set with stk__mix_set_order. */
    const uint64_t *shard_first[STK__MIX_MAX_SOURCES];
    size_t nshards[STK__MIX_MAX_SOURCES];
    unsigned window[STK__MIX_MAX_SOURCES];
    size_t fetch_off[STK__MIX_MAX_SOURCES];
} stk__mix;

/* Per-source quotas of an epoch of N positions (N 0: the default, see
 * below). samples[s] > 0 fixes source s's quota; the rest of N is split
 * among the others by weights[s] (> 0; a weight of 0 with samples 0 means
 * "in proportion to its size": weight = size) by largest remainder, so the
 * quotas sum to N exactly. Default N: the samples fixed plus the sizes of
 * the weighted sources. STK_EINVAL with the reason in err (fixed samples
 * above N, an epoch of 0 positions, a source with no samples, weights given
 * to some sources without fixed samples and not to others). */
int stk__mix_quotas(const double *weights, const uint64_t *samples, const uint64_t *sizes,
                    size_t nsrc, uint64_t *N, uint64_t *quota, char *err, size_t errlen);

/* Builds the tree over the quotas (sum = N > 0), block 1. sizes[s] >= 1.
 * STK_EINVAL past STK__MIX_MAX_SOURCES sources. For per-source batches, call
 * it with quotas in batches and set block to the batch size after. */
int stk__mix_init(stk__mix *m, const uint64_t *quota, const uint64_t *sizes, size_t nsrc,
                  uint64_t seed, bool shuffle);

/* The source of mixture position t (t < N) of epoch `epoch`, and t's rank
 * among that source's positions of the epoch. */
void stk__mix_at(const stk__mix *m, uint64_t epoch, uint64_t t, size_t *src, uint64_t *rank);

/* The k-th sample of source s in epoch `epoch` (k < quota[s]): its local
 * index in the source and its pass. */
uint64_t stk__mix_kth(const stk__mix *m, uint64_t epoch, size_t s, uint64_t k, uint64_t *pass);

/* Order "shards"/"blocks" for source s: units has nunits + 1 entries (its
 * shards' or blocks' first local samples, order.h's shard_first; copied),
 * window shards per window. STK_EINVAL/STK_ENOMEM (order.h). After init. */
int stk__mix_set_order(stk__mix *m, size_t s, const uint64_t *units, size_t nunits,
                       unsigned window);
/* For the disk cache's furthest-next-use eviction with order "shards":
 * source s's units are its shards (shard_first, borrowed: it must outlive
 * m), the fetch stage's shards from fetch_off (SIZE_MAX: not fetched). */
void stk__mix_set_shards(stk__mix *m, size_t s, const uint64_t *shard_first, size_t nshards,
                         unsigned window, size_t fetch_off);

/* Mixture position of source s's k-th sample of epoch `epoch` (k <
 * quota[s] x block): the inverse of stk__mix_at, O(depth). */
uint64_t stk__mix_pos_of(const stk__mix *m, uint64_t epoch, size_t s, uint64_t k);
/* Source s's samples at mixture positions before t (t <= N), O(depth). */
uint64_t stk__mix_count_before(const stk__mix *m, uint64_t epoch, size_t s, uint64_t t);

/* The cache's next uses (fetch.h's next_uses) from mixture position t of
 * epoch `epoch`: next[x] for each fetched shard x of a source set with
 * stk__mix_set_shards is how many mixture positions after t the first
 * position reading the shard's window (order.h) lies, in this epoch or the
 * next one (positions t.. N - 1, then the next epoch's 0..); UINT64_MAX
 * for a shard read in neither, and for every other shard. With a window of
 * one shard that is the shard's first read exactly. O(shards + sources x
 * depth); false when out of memory (the cache then evicts the least
 * recently used). */
bool stk__mix_next_uses(const stk__mix *m, uint64_t epoch, uint64_t t, uint64_t *next,
                        size_t nshards);
/* Tests set it before a loader opens to compare with the least recently
 * used eviction (stk__mix_next_uses then returns false); false. */
extern bool stk__mix_lru_only;

/* Frees the per-source orders (before m itself). */
void stk__mix_free_orders(stk__mix *m);

/* The epoch's first layout: n positions, world ranks in nodes of `local`,
 * per_rank samples each (order.h's partition). */
typedef struct stk__mix_geom {
    uint64_t n, per_rank;
    uint64_t world, local;
} stk__mix_geom;

/* The mixture position of epoch position pos (pos < n): see above. */
uint64_t stk__mix_t(const stk__mix_geom *g, uint64_t pos);

/* Composite sample id, source, local index and the key the sample's random
 * draws use for epoch position pos: a repeated pass draws afresh. */
uint64_t stk__mix_sample(const stk__mix *m, const stk__mix_geom *g, uint64_t epoch, uint64_t pos,
                         uint64_t *draw_epoch);

/* The source of composite id i. */
size_t stk__mix_source_of(const stk__mix *m, uint64_t i);

#endif
