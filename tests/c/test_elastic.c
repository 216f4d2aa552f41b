/* test_elastic.c -- elastic resume (docs/engine.md): a state saved by one
 * world (from rank 0 alone) restored onto another delivers the rest of the
 * epoch exactly once across the new ranks, with equal batch counts, through
 * several changes of world, for shuffle on and off, global and shard-aware
 * order, one node or several; and the node-aware layout gives the ranks of a
 * node disjoint, nearby parts of the order. Ranks are in-process loaders. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "source/stkformat.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define REC 16 /* 8 label bytes (the sample's index) + 8 more */

static const char *records(uint64_t n)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s", tu_path("elastic.rec"));
    uint8_t *buf = calloc(n, REC);
    REQUIRE(buf);
    for (uint64_t i = 0; i < n; i++) {
        memcpy(buf + i * REC, &i, 8);
        uint64_t x = i * 0x9e3779b97f4a7c15ULL;
        memcpy(buf + i * REC + 8, &x, 8);
    }
    tu_write_file(path, buf, n * REC);
    free(buf);
    return path;
}

/* A .stk set of n samples in shards of 7 (for the shard-aware order),
 * written with the library's shard writer; labels are the indices. */
static const char *stk_set(uint64_t n)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", tu_path("elastic-stk"));
    tu_mkdirs(dir);
    char err[256];
    for (uint64_t s = 0; s * 7 < n; s++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/part-%06llu.stk", dir, (unsigned long long)s);
        stk__stk_header h = {.kind = STK_PAYLOAD_ENCODED};
        stk__stk_writer *w = NULL;
        REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
        for (uint64_t i = s * 7; i < n && i < s * 7 + 7; i++) {
            uint8_t payload[8];
            memcpy(payload, &i, 8);
            REQUIRE(stk__stkw_add(w, payload, sizeof payload, (int64_t)i, NULL, 0, 0, err,
                                  sizeof err) == STK_OK);
        }
        uint64_t size;
        REQUIRE(stk__stkw_finish(w, n, &size, err, sizeof err) == STK_OK);
    }
    return dir;
}

typedef struct world {
    unsigned size, local;
    size_t bs;
} world;

typedef struct cfg {
    const char *path;
    int stk; /* path is a .stk set (else records) */
    uint64_t n, seed;
    int shuffle, drop_last, shards;
} cfg;

static int open_rank(stk_loader **l, const cfg *c, world w, unsigned rank)
{
    char local[16];
    snprintf(local, sizeof local, "%u", w.local);
    tu_cfg t = {.path = c->path,
                .record = c->stk ? 0 : REC,
                .label = c->stk ? 0 : 8,
                .bs = w.bs,
                .threads = 2,
                .seed = c->seed,
                .shuffle = c->shuffle,
                .drop_last = c->drop_last,
                .rank = rank,
                .world = w.size,
                .options = {"local_world_size", local, "order", c->shards ? "shards" : "global",
                            "shard_window", "2", NULL}};
    return tu_open_cfg(l, &t);
}

/* Runs every rank of w for `steps` batches (all if steps is UINT64_MAX),
 * counting each delivered sample in seen[]; returns rank 0's state in *st
 * (after restoring `from` on every rank when given). batches[r] gets the
 * batches rank r delivered. */
static void run_world(const cfg *c, world w, const stk_state *from, uint64_t steps, uint32_t *seen,
                      stk_state *st, uint64_t *batches)
{
    for (unsigned r = 0; r < w.size; r++) {
        stk_loader *l = NULL;
        REQUIRE(open_rank(&l, c, w, r) == STK_OK);
        if (from) {
            int rc = stk_loader_set_state(l, from);
            if (rc)
                fprintf(stderr, "set_state: %s\n", stk_loader_errmsg(l));
            REQUIRE(rc == STK_OK);
        }
        uint64_t epoch0 = 0, k = 0;
        stk_state s0 = {.struct_size = sizeof s0};
        REQUIRE(stk_loader_get_state(l, &s0) == STK_OK);
        epoch0 = s0.epoch;
        for (; k < steps; k++) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            REQUIRE(rc == STK_OK);
            REQUIRE(b->epoch == epoch0);
            for (size_t j = 0; j < b->size; j++)
                seen[b->labels[j]]++;
            stk_batch_release(b);
        }
        batches[r] = k;
        if (r == 0) {
            st->struct_size = sizeof *st;
            REQUIRE(stk_loader_get_state(l, st) == STK_OK);
        }
        stk_loader_close(l);
    }
}

/* A whole epoch through the worlds w[0..nw), cut after cut[i] steps of
 * world i (the last runs to the end): every sample exactly once, but for
 * the padding and dropping the docs describe; equal batches in a world. */
static void check_epoch(const cfg *c, const world *w, const uint64_t *cut, size_t nw)
{
    uint32_t *seen = calloc(c->n, sizeof *seen);
    REQUIRE(seen);
    stk_state st = {.struct_size = sizeof st}, prev;
    uint64_t pad = 0;
    for (size_t i = 0; i < nw; i++) {
        uint64_t batches[64];
        run_world(c, w[i], i ? &prev : NULL, i + 1 < nw ? cut[i] : UINT64_MAX, seen, &st, batches);
        for (unsigned r = 1; r < w[i].size; r++)
            CHECK_EQ(batches[r], batches[0]);
        pad += w[i].size - 1;
        prev = st;
    }
    uint64_t missing = 0, extra = 0;
    for (uint64_t i = 0; i < c->n; i++) {
        if (!seen[i])
            missing++;
        else
            extra += seen[i] - 1;
    }
    const world *last = &w[nw - 1];
    if (c->drop_last) {
        CHECK_EQ(extra, 0);
        CHECK(missing < (uint64_t)last->size * last->bs);
    } else {
        CHECK_EQ(missing, 0);
        CHECK(extra <= pad); /* ceil(R / W) per rank: < W repeats a world */
    }
    if (missing >= (c->drop_last ? (uint64_t)last->size * last->bs : 1) ||
        extra > (c->drop_last ? 0 : pad))
        fprintf(stderr, "n %llu seed %llu shuffle %d drop %d shards %d: missing %llu extra %llu\n",
                (unsigned long long)c->n, (unsigned long long)c->seed, c->shuffle, c->drop_last,
                c->shards, (unsigned long long)missing, (unsigned long long)extra);
    free(seen);
}

static void test_world_changes_deliver_each_sample_once(void)
{
    static const struct {
        world w[3];
        uint64_t cut[2];
        size_t nw;
    } plans[] = {
        {{{3, 3, 4}, {2, 2, 4}}, {5}, 2},               /* 3 -> 2 */
        {{{3, 3, 4}, {4, 4, 4}}, {3}, 2},               /* 3 -> 4 */
        {{{3, 3, 4}, {2, 2, 4}, {4, 4, 4}}, {4, 6}, 3}, /* 3 -> 2 -> 4 */
        {{{4, 2, 3}, {2, 1, 6}}, {7}, 2},               /* 2 nodes of 2 -> 2 of 1, batch x2 */
        {{{2, 2, 5}, {6, 3, 2}}, {2}, 2},               /* 1 node -> 2 nodes of 3 */
        {{{3, 3, 4}, {3, 3, 4}}, {0}, 2},               /* a cut before any batch */
        {{{3, 3, 4}, {2, 2, 4}}, {UINT64_MAX}, 2},      /* after the epoch: the next */
    };
    const char *rec = records(203);
    for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++)
        for (int shuffle = 0; shuffle < 2; shuffle++)
            for (int drop = 0; drop < 2; drop++)
                for (uint64_t seed = 1; seed <= 3; seed++) {
                    cfg c = {rec, 0, 203, seed, shuffle, drop, 0};
                    if (plans[p].cut[0] == UINT64_MAX) {
                        /* Run the first world to the end: the state says the
                         * next epoch, and the new world starts it afresh. */
                        uint32_t *seen = calloc(203, sizeof *seen);
                        stk_state st;
                        uint64_t batches[8];
                        run_world(&c, plans[p].w[0], NULL, UINT64_MAX, seen, &st, batches);
                        CHECK_EQ(st.epoch, 1); /* the END was returned */
                        CHECK_EQ(st.batch, 0);
                        free(seen);
                        continue;
                    }
                    check_epoch(&c, plans[p].w, plans[p].cut, plans[p].nw);
                }
}

static void test_shard_order_world_changes(void)
{
    const char *dir = stk_set(150);
    world w3[] = {{3, 3, 4}, {2, 2, 4}, {4, 2, 2}};
    uint64_t cut[] = {3, 5};
    for (int drop = 0; drop < 2; drop++)
        for (uint64_t seed = 1; seed <= 2; seed++) {
            cfg c = {dir, 1, 150, seed, 1, drop, 1};
            check_epoch(&c, w3, cut, 3);
        }
}

/* The same world, state from rank 0 restored on every rank: exactly the
 * batches an uninterrupted run gives (the plain resume). */
static void test_same_world_resume_is_the_uninterrupted_run(void)
{
    const char *rec = records(97);
    cfg c = {rec, 0, 97, 5, 1, 0, 0};
    world w = {3, 3, 4};
    for (unsigned r = 0; r < 3; r++) {
        stk_loader *a = NULL, *b = NULL;
        REQUIRE(open_rank(&a, &c, w, r) == STK_OK);
        uint64_t want[64];
        size_t nw = 0;
        stk_batch *x;
        while (stk_loader_next(a, &x) == STK_OK) {
            want[nw++] = tu_hash(0, x->labels, x->size * sizeof *x->labels);
            stk_batch_release(x);
        }
        stk_loader_close(a);
        /* Rank 0 ran 4 steps and saved. */
        stk_loader *z = NULL;
        REQUIRE(open_rank(&z, &c, w, 0) == STK_OK);
        for (int k = 0; k < 4; k++) {
            REQUIRE(stk_loader_next(z, &x) == STK_OK);
            stk_batch_release(x);
        }
        stk_state st = {.struct_size = sizeof st};
        REQUIRE(stk_loader_get_state(z, &st) == STK_OK);
        stk_loader_close(z);
        REQUIRE(open_rank(&b, &c, w, r) == STK_OK);
        REQUIRE(stk_loader_set_state(b, &st) == STK_OK);
        size_t k = 4;
        while (stk_loader_next(b, &x) == STK_OK) {
            CHECK(k < nw && want[k] == tu_hash(0, x->labels, x->size * sizeof *x->labels));
            k++;
            stk_batch_release(x);
        }
        CHECK_EQ(k, nw);
        stk_loader_close(b);
    }
}

/* A state of a resumed epoch carries its history, and a loader of that
 * world continues it (save again, restore again). */
static void test_resave_inside_a_resumed_epoch(void)
{
    const char *rec = records(211);
    cfg c = {rec, 0, 211, 9, 1, 0, 0};
    world a = {3, 3, 4}, b = {2, 2, 4};
    uint32_t seen[211] = {0};
    stk_state s1, s2;
    uint64_t batches[8];
    run_world(&c, a, NULL, 6, seen, &s1, batches);
    run_world(&c, b, &s1, 3, seen, &s2, batches);
    CHECK_EQ(s2.history_len, 1);
    CHECK_EQ(s2.history[0].world_size, 3);
    CHECK_EQ(s2.history[0].batches, 6);
    CHECK_EQ(s2.batch, 3);
    stk_state s3;
    run_world(&c, b, &s2, UINT64_MAX, seen, &s3, batches); /* the same world goes on */
    for (int i = 0; i < 211; i++)
        CHECK(seen[i] >= 1);
    uint64_t extra = 0;
    for (int i = 0; i < 211; i++)
        extra += seen[i] - 1;
    CHECK(extra <= 1 + 2); /* padding of two worlds */
}

static void test_refusals(void)
{
    const char *rec = records(64);
    cfg c = {rec, 0, 64, 1, 1, 0, 0};
    stk_loader *l = NULL;
    world w = {2, 2, 4};
    REQUIRE(open_rank(&l, &c, w, 0) == STK_OK);
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
    stk_state bad = st;
    bad.seed = 2;
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "seed"));
    bad = st;
    bad.world_size = 3;
    bad.history_len = STK_STATE_HISTORY + 1;
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "history"));
    bad = st;
    bad.world_size = 4;
    bad.local_world_size = 3; /* not a whole number of nodes */
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "whole number of nodes"));
    bad = st;
    bad.world_size = 4;
    bad.batch = 999; /* past that world's batches */
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    stk_loader_close(l);
    /* local_world_size must divide the world. */
    world odd = {4, 3, 4};
    CHECK_EQ(open_rank(&l, &c, odd, 0), STK_EINVAL);
    CHECK(l && strstr(stk_loader_errmsg(l), "local_world_size"));
    stk_loader_close(l);
}

/* Two nodes of two ranks, shard-aware order: each node reads its own half
 * of the order, so the shards the two nodes read in an epoch barely overlap
 * (only a window at the boundary), while one node of four reads them all. */
static void test_node_aware_shards(void)
{
    const char *dir = stk_set(280); /* 40 shards of 7 */
    for (int nodes = 1; nodes <= 2; nodes++) {
        cfg c = {dir, 1, 280, 3, 1, 0, 1};
        world w = {4, (unsigned)(4 / nodes), 5};
        uint8_t read_by[2][40];
        memset(read_by, 0, sizeof read_by);
        for (unsigned r = 0; r < 4; r++) {
            stk_loader *l = NULL;
            REQUIRE(open_rank(&l, &c, w, r) == STK_OK);
            stk_batch *b;
            while (stk_loader_next(l, &b) == STK_OK) {
                for (size_t j = 0; j < b->size; j++)
                    read_by[r / 2][b->indices[j] / 7] = 1; /* ranks 0-1 vs 2-3 */
                stk_batch_release(b);
            }
            stk_loader_close(l);
        }
        int both = 0, any = 0;
        for (int k = 0; k < 40; k++) {
            both += read_by[0][k] && read_by[1][k];
            any += read_by[0][k] || read_by[1][k];
        }
        CHECK_EQ(any, 40);
        if (nodes == 2)
            CHECK(both <= 4); /* a window of 2 shards at the boundary, or so */
        else
            CHECK(both >= 30); /* interleaved ranks all read every window */
        fprintf(stderr, "  %d node(s): %d of 40 shards read by both halves of the ranks\n", nodes,
                both);
    }
}

int main(void)
{
    tu_begin("test_elastic", 600);
    RUN(test_world_changes_deliver_each_sample_once);
    RUN(test_shard_order_world_changes);
    RUN(test_same_world_resume_is_the_uninterrupted_run);
    RUN(test_resave_inside_a_resumed_epoch);
    RUN(test_refusals);
    RUN(test_node_aware_shards);
    return tu_end();
}
