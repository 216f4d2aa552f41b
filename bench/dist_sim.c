/* dist_sim.c -- what each node of a data-parallel job fetches from an object
 * store in one epoch, driven by stoker's own order code (src/order.c): the
 * shard-aware order and the rank layout, one node (ranks interleaved, as
 * DistributedSampler) against node-aware (each node a contiguous part of the
 * order). Every node has an LRU cache of whole shards shared by its ranks;
 * the ranks of a node take their batches in lockstep.
 *
 *   dist_sim SHARDS SAMPLES_PER_SHARD SHARD_MB NODES RANKS_PER_NODE BATCH
 *            CACHE_SHARDS WINDOW NODE_AWARE
 *
 * Prints: shards fetched per node (mean, max), GB per node, and the cache hit
 * rate of sample reads. Built by bench/bench_distributed.py. */
#include "order.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lru {
    size_t cap, n;
    uint64_t *key;  /* shard */
    uint64_t *used; /* tick */
} lru;

/* 1 on a hit; on a miss, inserts (evicting the least recently used). */
static int lru_get(lru *c, uint64_t shard, uint64_t tick)
{
    size_t old = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->key[i] == shard) {
            c->used[i] = tick;
            return 1;
        }
        if (c->used[i] < c->used[old])
            old = i;
    }
    if (c->n < c->cap) {
        c->key[c->n] = shard;
        c->used[c->n++] = tick;
    } else {
        c->key[old] = shard;
        c->used[old] = tick;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 10) {
        fprintf(stderr, "usage: dist_sim SHARDS PER_SHARD SHARD_MB NODES RANKS_PER_NODE BATCH "
                        "CACHE_SHARDS WINDOW NODE_AWARE\n");
        return 2;
    }
    uint64_t nsh = strtoull(argv[1], 0, 10), per = strtoull(argv[2], 0, 10);
    double mb = atof(argv[3]);
    unsigned nodes = (unsigned)atoi(argv[4]), L = (unsigned)atoi(argv[5]);
    uint64_t B = strtoull(argv[6], 0, 10);
    size_t cache = (size_t)atoll(argv[7]);
    unsigned window = (unsigned)atoi(argv[8]);
    int aware = atoi(argv[9]);
    unsigned W = nodes * L;
    uint64_t n = nsh * per;
    uint64_t *first = malloc((nsh + 1) * sizeof *first);
    for (uint64_t k = 0; k <= nsh; k++)
        first[k] = k * per;
    stk__shard_order *so;
    if (stk__shard_order_create(&so, first, nsh, window, 1, 0, 1))
        return 1;
    stk__partition *part = calloc(W, sizeof *part);
    for (unsigned r = 0; r < W; r++) {
        stk__partition_init(&part[r], n, r, W, B, false);
        if (aware)
            part[r].local = L;
    }
    lru *c = calloc(nodes, sizeof *c);
    uint64_t *fetched = calloc(nodes, sizeof *fetched);
    for (unsigned j = 0; j < nodes; j++) {
        c[j].cap = cache;
        c[j].key = calloc(cache, sizeof *c[j].key);
        c[j].used = calloc(cache, sizeof *c[j].used);
    }
    uint64_t hits = 0, reads = 0, tick = 0;
    for (uint64_t b = 0; b < part[0].batches; b++)
        for (unsigned r = 0; r < W; r++) {
            uint64_t len = stk__partition_batch_len(&part[r], b);
            unsigned j = r / L;
            for (uint64_t s = 0; s < len; s++) {
                uint64_t pos = stk__partition_pos(&part[r], b * B + s);
                uint64_t shard = stk__shard_order_at(so, pos) / per;
                int h = lru_get(&c[j], shard, ++tick);
                hits += (uint64_t)h;
                fetched[j] += (uint64_t)!h;
                reads++;
            }
        }
    uint64_t tot = 0, mx = 0;
    for (unsigned j = 0; j < nodes; j++) {
        tot += fetched[j];
        if (fetched[j] > mx)
            mx = fetched[j];
    }
    double mean = (double)tot / nodes;
    printf("{\"nodes\":%u,\"ranks_per_node\":%u,\"node_aware\":%d,\"shards_per_node\":%.1f,"
           "\"max_shards_per_node\":%" PRIu64 ",\"gb_per_node\":%.1f,\"gb_total\":%.1f,"
           "\"hit_rate\":%.5f}\n",
           nodes, L, aware, mean, mx, mean * mb / 1024.0, (double)tot * mb / 1024.0,
           reads ? (double)hits / (double)reads : 0.0);
    stk__shard_order_destroy(so);
    return 0;
}
