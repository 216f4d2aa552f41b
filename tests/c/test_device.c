/* test_device.c -- the device stage (docs/gpu.md) against the fake backend,
 * whose copies, conversions and events run late, on another thread, in a
 * seeded random order across streams: batches bit-identical to the CPU path
 * for every dtype and layout, in order; no host buffer reused before its
 * copy ran and no device buffer before the consumer's stream was done with
 * it; position and resume; prompt close with copies pending; a failed copy
 * named; the memory bound. Also run under ASan and TSan.
 *
 * STOKER_TEST_DEVICE=cuda (scripts/test-gpu.sh) runs the same checks that do
 * not need the fake's hooks against the real CUDA backend. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "device/stage.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
#include <unistd.h>
#include <xxhash.h>

#define NIMG 45
#define SIDE 24

static const char *g_dev = "fake"; /* or "cuda" */

static bool is_fake(void)
{
    return !strncmp(g_dev, "fake", 4);
}

/* An ImageFolder of NIMG small JPEGs of varied sizes in 3 classes. */
static const char *folder(void)
{
    static char path[512];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s", tu_path("imgs"));
    for (int i = 0; i < NIMG; i++) {
        uint32_t w = 20 + (uint32_t)(i * 7 % 41), h = 18 + (uint32_t)(i * 11 % 37);
        uint8_t *rgb = malloc((size_t)w * h * 3);
        REQUIRE(rgb);
        for (uint32_t k = 0; k < w * h * 3; k++)
            rgb[k] = (uint8_t)((k * 2654435761u + (uint32_t)i * 97u) >> 24);
        size_t n = 0;
        uint8_t *jpg = tu_jpeg(rgb, w, h, 90, &n);
        char dir[600], file[700];
        snprintf(dir, sizeof dir, "%s/c%d", path, i % 3);
        tu_mkdirs(dir);
        snprintf(file, sizeof file, "%s/img%03d.jpg", dir, i);
        tu_write_file(file, jpg, n);
        free(jpg);
        free(rgb);
    }
    return path;
}

#define SPEC_NORM                                                                                  \
    "RandomResizedCrop("                                                                           \
    "24"                                                                                           \
    ")|RandomHorizontalFlip()|Normalize(mean=(0.485,0.456,0.406), "                                \
    "std=(0.229,0.224,0.225))"

static int open_loader(stk_loader **l, const char *device, const char *dtype, const char *layout,
                       const char *spec, unsigned depth, uint64_t seed)
{
    tu_cfg c = {.path = folder(),
                .bs = 8,
                .threads = 2,
                .depth = depth,
                .seed = seed,
                .shuffle = 1,
                .transform = spec,
                .options = {"dtype", dtype, "layout", layout, "device", device, NULL}};
    return tu_open_cfg(l, &c);
}

/* The batch's data on the host (device batches: after their copy). */
static uint8_t *host_copy(stk_loader *l, stk_batch *b)
{
    size_t n = b->size * b->sample_bytes;
    uint8_t *p = malloc(n ? n : 1);
    REQUIRE(p);
    if (b->device == STK_DEVICE_CPU) {
        memcpy(p, b->data, n);
        return p;
    }
    REQUIRE(stk_batch_sync(b) == STK_OK);
    stk__dev *d = stk__loader_device(l);
    char err[256];
    REQUIRE(d && d->ops->copy_d2h(d, p, (stk__dptr)(uintptr_t)b->data, n, err, sizeof err) == 0);
    return p;
}

/* Hash of every batch of `epochs` epochs: data, labels, indices, shape. */
static uint64_t run_hash(const char *device, const char *dtype, const char *layout,
                         const char *spec, int epochs, size_t *batches)
{
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, device, dtype, layout, spec, 2, 7) == STK_OK);
    uint64_t h = 1469598103934665603ULL;
    size_t nb = 0;
    for (int e = 0; e < epochs; e++) {
        stk_batch *b;
        uint64_t want = 0;
        int rc;
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            CHECK_EQ(b->index, want); /* in order */
            CHECK_EQ(b->epoch, (uint64_t)e);
            want++;
            uint8_t *p = host_copy(l, b);
            h = tu_hash(h, p, b->size * b->sample_bytes);
            free(p);
            h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
            h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
            h = tu_hash(h, b->shape, sizeof b->shape);
            h = tu_hash(h, &b->dtype, sizeof b->dtype);
            stk_batch_release(b);
            nb++;
        }
        CHECK_EQ(rc, STK_END);
    }
    stk_loader_close(l);
    if (batches)
        *batches = nb;
    return h;
}

static void test_same_batches_as_cpu(void)
{
    static const char *const dtypes[] = {"uint8", "float32", "float16", "bfloat16"};
    static const char *const layouts[] = {"nchw", "nhwc"};
    stk__fake_config(3, 300, 0);
    for (int d = 0; d < 4; d++) {
        for (int y = 0; y < 2; y++) {
            const char *spec = d ? SPEC_NORM : "RandomResizedCrop(24)|RandomHorizontalFlip()";
            size_t n1 = 0, n2 = 0;
            uint64_t cpu = run_hash("cpu", dtypes[d], layouts[y], spec, 2, &n1);
            uint64_t dev = run_hash(g_dev, dtypes[d], layouts[y], spec, 2, &n2);
            CHECK(cpu == dev);
            CHECK_EQ(n1, n2);
            CHECK_EQ(n1, (size_t)2 * ((NIMG + 7) / 8));
        }
    }
    /* ToTensor alone (no Normalize), and the conversion off the fake's
     * thread order: another seed. */
    stk__fake_config(99, 1000, 0);
    const char *spec = "Resize(20)|CenterCrop(16)|ToTensor()";
    CHECK(run_hash("cpu", "float32", "nchw", spec, 1, NULL) ==
          run_hash(g_dev, "float32", "nchw", spec, 1, NULL));
    if (is_fake()) {
        stk__fake_counts fc;
        stk__fake_counts_get(&fc);
        CHECK(fc.copies > 0);
        CHECK(fc.converts > 0);
        CHECK_EQ(fc.host_changed, 0);
    }
}

/* The consumer uses each batch on a stream of its own (the fake runs a
 * check there later, as a kernel would) and releases it at once on that
 * stream. With copies, checks and events completing late and out of order,
 * no device buffer may be rewritten before the consumer's check ran, and no
 * host buffer before its copy ran. */
static void test_reuse_waits_for_copies_and_consumer(void)
{
    if (!is_fake())
        return;
    const char *spec = SPEC_NORM;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        /* The expected bytes of every batch, from the CPU path. */
        uint64_t want[2][16];
        stk_loader *l = NULL;
        REQUIRE(open_loader(&l, "cpu", "float16", "nchw", spec, 1, 5) == STK_OK);
        for (int e = 0; e < 2; e++) {
            stk_batch *b;
            for (int k = 0; stk_loader_next(l, &b) == STK_OK; k++) {
                REQUIRE(k < 16);
                want[e][k] = XXH3_64bits(b->data, b->size * b->sample_bytes);
                stk_batch_release(b);
            }
        }
        stk_loader_close(l);

        stk__fake_config(seed, 2000, 0);
        REQUIRE(open_loader(&l, "fake", "float16", "nchw", spec, 1, 5) == STK_OK);
        stk__dev *d = stk__loader_device(l);
        REQUIRE(d);
        stk__stream cs = NULL;
        char err[256];
        REQUIRE(d->ops->stream_create(d, &cs, err, sizeof err) == STK_OK);
        for (int e = 0; e < 2; e++) {
            stk_batch *b;
            for (int k = 0; stk_loader_next(l, &b) == STK_OK; k++) {
                CHECK_EQ(b->device, STK_DEVICE_FAKE);
                CHECK_EQ(stk_batch_wait(b, cs), STK_OK);
                REQUIRE(stk__fake_check(d, cs, b->data, b->size * b->sample_bytes, want[e][k]) ==
                        STK_OK);
                stk_batch_release_stream(b, cs);
            }
        }
        d->ops->stream_destroy(d, cs); /* waits for the checks */
        stk_loader_close(l);
        stk__fake_counts fc;
        stk__fake_counts_get(&fc);
        CHECK(fc.checks >= 12);
        CHECK_EQ(fc.check_failed, 0);
        CHECK_EQ(fc.host_changed, 0);
    }
}

/* A consumer that uses each batch on two streams (issue 18): it reads it on
 * cs2 (slow: several checks queued there) and on cs, adds cs2 with
 * stk_batch_record_stream and releases on cs. The buffer must not be
 * rewritten before cs2's checks ran either, though cs is done long before. */
static void test_record_stream_waits_for_every_stream(void)
{
    if (!is_fake())
        return;
    const char *spec = SPEC_NORM;
    uint64_t want[2][16];
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, "cpu", "float16", "nchw", spec, 1, 5) == STK_OK);
    for (int e = 0; e < 2; e++) {
        stk_batch *b;
        for (int k = 0; stk_loader_next(l, &b) == STK_OK; k++) {
            REQUIRE(k < 16);
            want[e][k] = XXH3_64bits(b->data, b->size * b->sample_bytes);
            stk_batch_release(b);
        }
    }
    stk_loader_close(l);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        stk__fake_config(seed, 1000, 0);
        REQUIRE(open_loader(&l, "fake", "float16", "nchw", spec, 1, 5) == STK_OK);
        stk__dev *d = stk__loader_device(l);
        REQUIRE(d);
        stk__stream cs = NULL, cs2 = NULL;
        char err[256];
        REQUIRE(d->ops->stream_create(d, &cs, err, sizeof err) == STK_OK);
        REQUIRE(d->ops->stream_create(d, &cs2, err, sizeof err) == STK_OK);
        for (int e = 0; e < 2; e++) {
            stk_batch *b;
            for (int k = 0; stk_loader_next(l, &b) == STK_OK; k++) {
                size_t n = b->size * b->sample_bytes;
                CHECK_EQ(stk_batch_wait(b, cs), STK_OK);
                CHECK_EQ(stk_batch_wait(b, cs2), STK_OK);
                CHECK_EQ(stk_batch_record_stream(b, cs2), STK_OK);
                CHECK_EQ(stk_batch_record_stream(b, cs2), STK_OK);  /* counts once */
                CHECK_EQ(stk_batch_record_stream(b, NULL), STK_OK); /* the host: nothing */
                for (int j = 0; j < 6; j++)
                    REQUIRE(stk__fake_check(d, cs2, b->data, n, want[e][k]) == STK_OK);
                REQUIRE(stk__fake_check(d, cs, b->data, n, want[e][k]) == STK_OK);
                CHECK_EQ(stk_batch_release_stream(b, cs), STK_OK);
                CHECK_EQ(stk_batch_record_stream(b, cs2), STK_EMISUSE); /* released */
            }
        }
        d->ops->stream_destroy(d, cs2); /* waits for the checks */
        d->ops->stream_destroy(d, cs);
        stk_loader_close(l);
        stk__fake_counts fc;
        stk__fake_counts_get(&fc);
        CHECK(fc.checks >= 7 * 12);
        CHECK_EQ(fc.check_failed, 0);
        CHECK_EQ(fc.host_changed, 0);
    }
    /* At most STK_BATCH_MAX_STREAMS streams a batch; a stale batch after
     * close is misuse, without reading it. */
    stk__fake_config(4, 100, 0);
    REQUIRE(open_loader(&l, "fake", "float32", "nchw", spec, 1, 5) == STK_OK);
    stk__dev *d = stk__loader_device(l);
    stk__stream ss[STK_BATCH_MAX_STREAMS + 1];
    char err[256];
    for (int k = 0; k <= STK_BATCH_MAX_STREAMS; k++)
        REQUIRE(d->ops->stream_create(d, &ss[k], err, sizeof err) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    for (int k = 0; k < STK_BATCH_MAX_STREAMS; k++)
        CHECK_EQ(stk_batch_record_stream(b, ss[k]), STK_OK);
    CHECK_EQ(stk_batch_record_stream(b, ss[0]), STK_OK);
    CHECK_EQ(stk_batch_record_stream(b, ss[STK_BATCH_MAX_STREAMS]), STK_EINVAL);
    CHECK_EQ(stk_batch_release_stream(b, ss[0]), STK_OK);
    for (int k = 0; k <= STK_BATCH_MAX_STREAMS; k++)
        d->ops->stream_destroy(d, ss[k]);
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    stk_loader_close(l);
    CHECK_EQ(stk_batch_release(b), STK_OK); /* the last: frees the loader */
    CHECK_EQ(stk_batch_release(b), STK_EMISUSE);
    CHECK_EQ(stk_batch_record_stream(b, NULL), STK_EMISUSE);
    CHECK_EQ(stk_batch_sync(b), STK_EMISUSE);
}

/* Holding batches: the consumer may hold depth + 1 device batches; one more
 * is EBUSY, not a hang; held batches keep their bytes while later ones are
 * copied. */
static void test_held_batches_stay_valid(void)
{
    stk__fake_config(8, 500, 0);
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, g_dev, "float32", "nhwc", SPEC_NORM, 2, 1) == STK_OK);
    stk_batch *held[3];
    uint8_t *copy[3];
    for (int k = 0; k < 3; k++) {
        REQUIRE(stk_loader_next(l, &held[k]) == STK_OK);
        copy[k] = host_copy(l, held[k]);
    }
    stk_batch *extra = NULL;
    CHECK_EQ(stk_loader_next_timeout(l, &extra, 300), STK_EBUSY);
    CHECK(strstr(stk_loader_errmsg(l), "device buffers") != NULL);
    for (int k = 0; k < 3; k++) {
        uint8_t *again = host_copy(l, held[k]);
        CHECK(memcmp(again, copy[k], held[k]->size * held[k]->sample_bytes) == 0);
        free(again);
        free(copy[k]);
    }
    stk_batch_release(held[0]);
    stk_batch_release(held[0]); /* a second release is harmless */
    CHECK_EQ(stk_loader_next(l, &extra), STK_OK);
    CHECK_EQ(extra->index, 3);
    stk_batch_release(extra);
    stk_batch_release(held[1]);
    stk_batch_release(held[2]);
    stk_loader_close(l);
}

/* The state is the consumer's position, not the copy thread's; resuming it
 * on the CPU gives the rest of the device run's batches, and set_epoch
 * drops what the copy thread had queued. */
static void test_state_is_the_consumers(void)
{
    stk__fake_config(5, 200, 0);
    const char *spec = SPEC_NORM;
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, g_dev, "float32", "nchw", spec, 3, 9) == STK_OK);
    stk_batch *b;
    for (int k = 0; k < 2; k++) {
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        stk_batch_release(b);
    }
    usleep(100000); /* let the copy thread run ahead */
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
    CHECK_EQ(st.epoch, 0);
    CHECK_EQ(st.batch, 2);
    uint64_t rest_dev = 1469598103934665603ULL;
    while (stk_loader_next(l, &b) == STK_OK) {
        uint8_t *p = host_copy(l, b);
        rest_dev = tu_hash(rest_dev, p, b->size * b->sample_bytes);
        free(p);
        stk_batch_release(b);
    }
    /* set_epoch back to 0 mid-flight: the epoch again from its start. */
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->epoch, 1);
    stk_batch_release(b);
    REQUIRE(stk_loader_set_epoch(l, 0) == STK_OK);
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->epoch, 0);
    CHECK_EQ(b->index, 0);
    stk_batch_release(b);
    stk_loader_close(l);

    stk_loader *c = NULL;
    REQUIRE(open_loader(&c, "cpu", "float32", "nchw", spec, 3, 9) == STK_OK);
    REQUIRE(stk_loader_set_state(c, &st) == STK_OK);
    uint64_t rest_cpu = 1469598103934665603ULL;
    while (stk_loader_next(c, &b) == STK_OK) {
        rest_cpu = tu_hash(rest_cpu, b->data, b->size * b->sample_bytes);
        stk_batch_release(b);
    }
    stk_loader_close(c);
    CHECK(rest_dev == rest_cpu);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Close with copies queued and slow: prompt, and a batch held across close
 * stays valid until released. */
static void test_close_with_copies_pending(void)
{
    if (!is_fake())
        return;
    stk__fake_config(2, 20000, 0); /* up to 20 ms an operation */
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, "fake", "float32", "nchw", SPEC_NORM, 4, 3) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    usleep(30000);
    double t0 = now_s();
    stk_loader_close(l);
    double dt = now_s() - t0;
    CHECK(dt < 2.0);
    CHECK_EQ(stk_batch_sync(b), STK_OK);
    volatile float first = ((const float *)b->data)[0];
    (void)first;
    stk_batch_release(b);
}

/* A copy that fails is an error naming the batch, at the next call, and
 * stays one; close is still prompt. */
static void test_copy_error_names_batch(void)
{
    if (!is_fake())
        return;
    /* The fifth operation queued is the third batch's copy (a copy and a
     * conversion each, queued in batch order); it fails when it runs. */
    stk__fake_config(4, 300, 5);
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, "fake", "float32", "nchw", SPEC_NORM, 2, 3) == STK_OK);
    stk_batch *b;
    int rc, got = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        /* Syncing a batch whose copy failed is the error too. */
        int s = stk_batch_sync(b);
        CHECK(s == STK_OK || (s == STK_EDEVICE && b->index == 2));
        stk_batch_release(b);
        got++;
        REQUIRE(got < 10);
    }
    CHECK_EQ(rc, STK_EDEVICE);
    CHECK(got >= 2 && got <= 3);
    const char *msg = stk_loader_errmsg(l);
    CHECK(strstr(msg, "batch 2 of epoch 0") != NULL);
    CHECK(strstr(msg, "injected") != NULL);
    CHECK_EQ(stk_loader_next(l, &b), STK_EDEVICE);
    stk_loader_close(l);
}

static void test_memory_bound_counts_the_device(void)
{
    stk__fake_config(1, 0, 0);
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, g_dev, "float32", "nchw", SPEC_NORM, 2, 1) == STK_OK);
    stk_stats st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_stats(l, &st) == STK_OK);
    /* 3 device buffers, each a uint8 staging batch and a float32 batch. */
    uint64_t want = 3ull * 8 * (24 * 24 * 3 + 24 * 24 * 3 * 4);
    CHECK_EQ(st.device_memory_bytes, want);
    CHECK(st.memory_bound_bytes > want + 3ull * 8 * 24 * 24 * 3);
    stk_loader_close(l);

    REQUIRE(open_loader(&l, "cpu", "float32", "nchw", SPEC_NORM, 2, 1) == STK_OK);
    REQUIRE(stk_loader_stats(l, &st) == STK_OK);
    CHECK_EQ(st.device_memory_bytes, 0);
    stk_loader_close(l);
}

static void test_bad_device_options(void)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "device", "tpu"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "device", "cuda:"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "device", "cuda:x"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "device", "cpu:0"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "device", "cuda:1"), STK_OK);
    CHECK_EQ(stk_options_set(o, "device", "cpu"), STK_OK);
    stk_options_destroy(o);

    /* Variable-size batches cannot go to a device. */
    stk_loader *l = NULL;
    tu_cfg c = {
        .path = folder(), .bs = 4, .transform = "decode", .options = {"device", "fake", NULL}};
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "one shape") != NULL);
    stk_loader_close(l);

    /* Without a GPU (or a driver), device "cuda" says why. */
    if (is_fake()) {
        int rc = open_loader(&l, "cuda", "float32", "nchw", SPEC_NORM, 2, 1);
        if (rc != STK_OK) {
            CHECK(rc == STK_EUNSUPPORTED || rc == STK_EDEVICE);
            CHECK(strstr(stk_loader_errmsg(l), "cuda") != NULL);
            printf("  device \"cuda\" here: %s\n", stk_loader_errmsg(l));
        }
        stk_loader_close(l);
        /* A library that is not CUDA's driver. */
        setenv("STOKER_LIBCUDA", "libm.so.6", 1);
        CHECK_EQ(open_loader(&l, "cuda", "uint8", "nchw", SPEC_NORM, 2, 1), STK_EUNSUPPORTED);
        CHECK(strstr(stk_loader_errmsg(l), "has no cuInit") != NULL);
        stk_loader_close(l);
        unsetenv("STOKER_LIBCUDA");
    }
}

/* ---- The CUDA backend against the mock driver (tests/c/mock_cuda.c) ----- */

static void *g_mock;

static long mock_call(const char *name)
{
    long (*fn)(void) = NULL;
    void *p = dlsym(g_mock, name);
    memcpy(&fn, &p, sizeof p);
    REQUIRE(fn);
    return fn();
}

/* A copy or a kernel that fails in the driver: the error names the batch
 * and the driver's words, and stays. */
static void test_cuda_failures_named(void)
{
    static const char *const calls[] = {"cuMemcpyHtoDAsync_v2", "cuLaunchKernel"};
    for (int k = 0; k < 2; k++) {
        setenv("MOCK_CUDA_FAIL", calls[k], 1);
        stk_loader *l = NULL;
        REQUIRE(open_loader(&l, "cuda", "float32", "nchw", SPEC_NORM, 2, 3) == STK_OK);
        stk_batch *b;
        int rc;
        while ((rc = stk_loader_next(l, &b)) == STK_OK)
            stk_batch_release(b);
        CHECK_EQ(rc, STK_EDEVICE);
        const char *m = stk_loader_errmsg(l);
        CHECK(strstr(m, "batch 0 of epoch 0") != NULL);
        CHECK(strstr(m, calls[k]) != NULL || strstr(m, k ? "cuLaunchKernel" : "cuMemcpyHtoD"));
        CHECK(strstr(m, "illegal memory access") != NULL);
        CHECK(strstr(m, k ? "conversion" : "copy") != NULL);
        CHECK_EQ(stk_loader_next(l, &b), STK_EDEVICE);
        stk_loader_close(l);
        unsetenv("MOCK_CUDA_FAIL");
    }
}

static void test_cuda_backend_leaves_nothing(void)
{
    CHECK_EQ(mock_call("mock_cuda_live"), 0);
    CHECK_EQ(mock_call("mock_cuda_depth_errors"), 0);
    CHECK_EQ(mock_call("mock_cuda_depth"), 0);
    if (stk__cuda_have_kernels())
        CHECK(mock_call("mock_cuda_launches") > 0);
}

static void run_on_mock_cuda(void)
{
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
    REQUIRE(n > 0);
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    REQUIRE(slash);
    strcpy(slash + 1, "libmockcuda.so");
    /* Held open here so its counters outlive each loader's dlclose. */
    g_mock = dlopen(exe, RTLD_NOW | RTLD_LOCAL);
    if (!g_mock) {
        printf("mock CUDA driver: skipped (%s)\n", dlerror());
        return;
    }
    printf("device under test: cuda, on the mock driver %s\n", exe);
    setenv("STOKER_LIBCUDA", exe, 1);
    g_dev = "cuda";
    if (stk__cuda_have_kernels()) {
        RUN(test_same_batches_as_cpu);
        RUN(test_held_batches_stay_valid);
        RUN(test_state_is_the_consumers);
        RUN(test_memory_bound_counts_the_device);
        RUN(test_cuda_failures_named);
    } else {
        printf("  (this build has no CUDA kernels: float conversions skipped)\n");
    }
    RUN(test_cuda_backend_leaves_nothing);
    unsetenv("STOKER_LIBCUDA");
    g_dev = "fake";
    dlclose(g_mock);
}

int main(void)
{
    const char *env = getenv("STOKER_TEST_DEVICE");
    if (env && *env)
        g_dev = env;
    tu_begin("test_device", 300);
    printf("device under test: %s\n", g_dev);
    RUN(test_same_batches_as_cpu);
    RUN(test_reuse_waits_for_copies_and_consumer);
    RUN(test_record_stream_waits_for_every_stream);
    RUN(test_held_batches_stay_valid);
    RUN(test_state_is_the_consumers);
    RUN(test_close_with_copies_pending);
    RUN(test_copy_error_names_batch);
    RUN(test_memory_bound_counts_the_device);
    RUN(test_bad_device_options);
    if (is_fake())
        run_on_mock_cuda();
    return tu_end();
}
