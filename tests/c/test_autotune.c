/* test_autotune.c -- threads "auto" (docs/diagnosis.md): batches bit-identical
 * to fixed thread counts whatever the controller does, and a consumer slower
 * than the pool makes it give workers back; depth "auto" from a memory
 * budget. Also run under TSan. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REC 40

static const char *records(uint64_t n)
{
    const char *path = tu_path("data.rec");
    uint8_t *buf = calloc(n, REC);
    REQUIRE(buf);
    for (uint64_t i = 0; i < n; i++) {
        buf[i * REC] = (uint8_t)(i % 7);
        for (int j = 1; j < REC; j++)
            buf[i * REC + (uint64_t)j] = (uint8_t)(i * 31 + (uint64_t)j);
    }
    tu_write_file(path, buf, n * REC);
    free(buf);
    return path;
}

static void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Hash of `epochs` epochs; sleeps nap us per batch; the active count at the end. */
static uint64_t run(const char *src, unsigned threads, int autotune, int epochs, long nap,
                    unsigned *active)
{
    stk_loader *l = NULL;
    tu_cfg c = {.path = src,
                .record = REC,
                .label = 1,
                .bs = 16,
                .threads = threads,
                .depth = 3,
                .seed = 11,
                .options = {"autotune", autotune ? "1" : "0", NULL}};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    uint64_t h = 1469598103934665603ULL;
    for (int e = 0; e < epochs; e++) {
        stk_batch *b;
        while (stk_loader_next(l, &b) == STK_OK) {
            h = tu_hash(h, b->data, b->size * b->sample_bytes);
            h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
            h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
            stk_batch_release(b);
            if (nap)
                nap_us(nap);
        }
    }
    stk_stats st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_stats(l, &st) == STK_OK);
    CHECK_EQ(st.threads_max, threads);
    CHECK(st.threads_active >= 1 && st.threads_active <= threads);
    if (active)
        *active = st.threads_active;
    stk_loader_close(l);
    return h;
}

static void test_same_batches_as_fixed_threads(void)
{
    const char *src = records(2000);
    uint64_t one = run(src, 1, 0, 2, 0, NULL), three = run(src, 3, 0, 2, 0, NULL);
    CHECK(one == three);
    /* A slow consumer makes the controller move while the batches go by. */
    unsigned active = 0;
    CHECK(run(src, 4, 1, 2, 1500, &active) == one);
    CHECK(run(src, 4, 1, 2, 0, NULL) == one);
}

static void test_slow_consumer_gives_workers_back(void)
{
    const char *src = records(4000);
    unsigned active = 0;
    /* 250 batches a 10 ms: 2.5 s, far more than the 9 windows of 200 ms it
     * takes to go from 4 workers to 1. */
    run(src, 4, 1, 1, 10000, &active);
    CHECK_EQ(active, 1);
    /* Without autotune every worker stays. */
    run(src, 4, 0, 1, 2000, &active);
    CHECK_EQ(active, 4);
}

/* depth "auto": the deepest ring (1..8) whose bound fits memory_budget. */
static void test_depth_from_memory_budget(void)
{
    const char *src = records(4000);
    uint64_t bound_of[9] = {0};
    for (unsigned d = 1; d <= 8; d++) {
        stk_loader *l = NULL;
        char depth[8];
        snprintf(depth, sizeof depth, "%u", d);
        tu_cfg c = {
            .path = src, .record = REC, .bs = 64, .threads = 2, .options = {"depth", depth, NULL}};
        REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
        bound_of[d] = stk_loader_memory_bound(l);
        stk_loader_close(l);
    }
    CHECK(bound_of[8] > bound_of[1]);
    struct {
        uint64_t budget;
        unsigned depth; /* 0: refused */
    } cases[] = {{bound_of[8] * 4, 8}, {bound_of[8], 8}, {bound_of[5], 5},
                 {bound_of[5] + 1, 5}, {bound_of[1], 1}, {bound_of[1] - 1, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char budget[32];
        snprintf(budget, sizeof budget, "%llu", (unsigned long long)cases[k].budget);
        stk_loader *l = NULL;
        tu_cfg c = {.path = src,
                    .record = REC,
                    .bs = 64,
                    .threads = 2,
                    .options = {"depth", "auto", "memory_budget", budget, NULL}};
        int rc = tu_open_cfg(&l, &c);
        if (cases[k].depth) {
            CHECK_EQ(rc, STK_OK);
            stk_info in = {.struct_size = sizeof in};
            stk_loader_info(l, &in);
            CHECK_EQ(in.depth, cases[k].depth);
            CHECK(stk_loader_memory_bound(l) <= cases[k].budget);
        } else {
            CHECK_EQ(rc, STK_ETOOBIG);
            CHECK(strstr(stk_loader_errmsg(l), "memory budget"));
        }
        stk_loader_close(l);
    }
}

static void test_option_values(void)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "autotune", "1"), STK_OK);
    CHECK_EQ(stk_options_set(o, "autotune", "yes"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "depth", "auto"), STK_OK);
    CHECK_EQ(stk_options_set(o, "depth", "0"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "depth", "64"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "memory_budget", "0"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "memory_budget", "2G"), STK_OK);
    stk_options_destroy(o);
}

int main(void)
{
    tu_begin("test_autotune", 300);
    RUN(test_same_batches_as_fixed_threads);
    RUN(test_slow_consumer_gives_workers_back);
    RUN(test_depth_from_memory_budget);
    RUN(test_option_values);
    return tu_end();
}
