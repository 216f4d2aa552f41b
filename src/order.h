/*
 * order.h -- the epoch's sample order: a seeded bijective permutation of
 * [0, n) computed on the fly (O(1) memory in n, random access to position k),
 * and the partition of an epoch across ranks.
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

#endif
