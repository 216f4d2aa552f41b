/* order.c -- seeded bijective permutation and rank partition; see order.h. */
#include "order.h"

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
    p->batch_size = batch_size;
    p->per_rank = drop_last ? n / world : (n + world - 1) / world;
    p->batches = drop_last ? p->per_rank / batch_size : (p->per_rank + batch_size - 1) / batch_size;
    if (drop_last)
        p->per_rank = p->batches * batch_size;
    return p->batches ? STK_OK : STK_EEMPTY;
}
