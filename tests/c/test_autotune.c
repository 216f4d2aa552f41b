/* test_autotune.c -- threads "auto" (docs/diagnosis.md): batches bit-identical
 * to fixed thread counts whatever the controller does, and a consumer slower
 * than the pool makes it give workers back. Also run under TSan. */
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
    tu_cfg c = {.path = src, .record = REC, .label = 1, .bs = 16, .threads = threads,
                .depth = 3, .seed = 11, .options = {"autotune", autotune ? "1" : "0", NULL}};
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

static void test_option_values(void)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "autotune", "1"), STK_OK);
    CHECK_EQ(stk_options_set(o, "autotune", "yes"), STK_EINVAL);
    stk_options_destroy(o);
}

int main(void)
{
    tu_begin("test_autotune", 300);
    RUN(test_same_batches_as_fixed_threads);
    RUN(test_slow_consumer_gives_workers_back);
    RUN(test_option_values);
    return tu_end();
}
