/* test_bench_api.c -- what the front ends need from the public API to stay
 * off the library's internals (issue 19): reading an option back
 * (stk_options_get), setting it back to its default (stk_options_reset), the
 * default thread count, and the decode stage alone on samples in memory
 * (stk_bench_decode, `stoker doctor`'s decode level). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* Every key of the table reads back from a fresh object, and what it reads
 * is taken back by stk_options_set and reads the same again ("" is "not
 * set": nothing to set). */
static void test_get_every_key_round_trips(void)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    int keys = 0;
    for (const stk_option_info *in = stk_option_next(NULL); in; in = stk_option_next(in)) {
        char v[512], again[512];
        CHECK_EQ(stk_options_get(o, in->name, v, sizeof v), STK_OK);
        if (*v) {
            if (stk_options_set(o, in->name, v) != STK_OK)
                fprintf(stderr, "%s: '%s' not taken back: %s\n", in->name, v,
                        stk_options_errmsg(o));
            CHECK_EQ(stk_options_set(o, in->name, v), STK_OK);
            CHECK_EQ(stk_options_get(o, in->name, again, sizeof again), STK_OK);
            CHECK(!strcmp(v, again));
        }
        keys++;
    }
    CHECK(keys > 20);
    stk_options_destroy(o);
}

static void check_get(stk_options *o, const char *key, const char *want)
{
    char v[256];
    CHECK_EQ(stk_options_get(o, key, v, sizeof v), STK_OK);
    if (strcmp(v, want))
        fprintf(stderr, "get %s: '%s', want '%s'\n", key, v, want);
    CHECK(!strcmp(v, want));
}

static void test_get_values(void)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    check_get(o, "layout", "nchw");
    check_get(o, "depth", "2");
    check_get(o, "fetch_retries", "6");
    check_get(o, "size", ""); /* the preset's: not set */
    check_get(o, "fields", "");
    check_get(o, "device", "cpu");
    REQUIRE(stk_options_set(o, "layout", "nhwc") == STK_OK);
    REQUIRE(stk_options_set(o, "depth", "auto") == STK_OK);
    REQUIRE(stk_options_set(o, "batch_memory", "16M") == STK_OK);
    REQUIRE(stk_options_set(o, "fetch_retries", "0") == STK_OK);
    REQUIRE(stk_options_set(o, "device", "fake:1") == STK_OK);
    REQUIRE(stk_options_set(o, "order", "shards") == STK_OK);
    REQUIRE(stk_options_set(o, "size", "96") == STK_OK);
    REQUIRE(stk_options_set(o, "trace", "t.json") == STK_OK);
    const char *fields = "image=jpg;png,caption=txt:text,extra?=npy,label";
    REQUIRE(stk_options_set(o, "fields", fields) == STK_OK);
    check_get(o, "layout", "nhwc");
    check_get(o, "depth", "auto");
    check_get(o, "batch_memory", "16777216");
    check_get(o, "fetch_retries", "0");
    check_get(o, "device", "fake:1");
    check_get(o, "order", "shards");
    check_get(o, "size", "96");
    check_get(o, "trace", "t.json");
    check_get(o, "fields", fields);
    /* A buffer too small: as much as fits, terminated. */
    char small[4];
    CHECK_EQ(stk_options_get(o, "batch_memory", small, sizeof small), STK_ETOOBIG);
    CHECK(!strcmp(small, "167"));
    char v[16];
    CHECK_EQ(stk_options_get(o, "no_such_key", v, sizeof v), STK_EINVAL);
    CHECK_EQ(stk_options_get(o, NULL, v, sizeof v), STK_EINVAL);
    CHECK_EQ(stk_options_get(NULL, "size", v, sizeof v), STK_EINVAL);
    CHECK_EQ(stk_options_get(o, "size", v, 0), STK_EINVAL);
    stk_options_destroy(o);
}

/* Reset gives back what a fresh object reads, key by key. */
static void test_reset_every_key(void)
{
    stk_options *o = NULL, *fresh = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_create(&fresh) == STK_OK);
    REQUIRE(stk_options_set(o, "layout", "nhwc") == STK_OK);
    REQUIRE(stk_options_set(o, "depth", "auto") == STK_OK);
    REQUIRE(stk_options_set(o, "size", "96") == STK_OK);
    REQUIRE(stk_options_set(o, "fields", "image,label") == STK_OK);
    REQUIRE(stk_options_set(o, "device", "fake") == STK_OK);
    REQUIRE(stk_options_set(o, "fetch_retries", "0") == STK_OK);
    REQUIRE(stk_options_set(o, "cache_dir", "/tmp/x") == STK_OK);
    REQUIRE(stk_options_set(o, "endpoint", "http://e") == STK_OK);
    REQUIRE(stk_options_set(o, "trace", "t.json") == STK_OK);
    REQUIRE(stk_options_set(o, "scratch_bytes", "1M") == STK_OK);
    REQUIRE(stk_options_set(o, "autotune", "1") == STK_OK);
    for (const stk_option_info *in = stk_option_next(NULL); in; in = stk_option_next(in)) {
        char a[512], b[512];
        CHECK_EQ(stk_options_reset(o, in->name), STK_OK);
        CHECK_EQ(stk_options_get(o, in->name, a, sizeof a), STK_OK);
        CHECK_EQ(stk_options_get(fresh, in->name, b, sizeof b), STK_OK);
        if (strcmp(a, b))
            fprintf(stderr, "reset %s: '%s', fresh '%s'\n", in->name, a, b);
        CHECK(!strcmp(a, b));
    }
    CHECK_EQ(stk_options_reset(o, "no_such_key"), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "no_such_key") != NULL);
    CHECK_EQ(stk_options_reset(NULL, "size"), STK_EINVAL);
    stk_options_destroy(o);
    stk_options_destroy(fresh);
}

static void test_default_threads(void)
{
    unsigned n = 0;
    CHECK_EQ(stk_default_threads(&n), STK_OK);
    CHECK(n >= 1 && n <= 256);
    CHECK_EQ(stk_default_threads(NULL), STK_EINVAL);
    /* MemAvailable, as /proc/meminfo gives it (Linux 3.14+). */
    unsigned long long kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "MemAvailable:", 13))
            kb = strtoull(line + 13, NULL, 10);
    if (f)
        fclose(f);
    uint64_t got = stk_mem_available();
    CHECK(kb > 0 && got > 0);
    /* It moves between the two reads: within 1 GiB of each other. */
    CHECK(got + (1ull << 30) > kb * 1024 && got < kb * 1024 + (1ull << 30));
}

/* Two JPEGs of different content, w x h. */
static uint8_t *jpeg_of(uint32_t w, uint32_t h, unsigned salt, size_t *n)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    for (size_t k = 0; k < (size_t)w * h * 3; k++)
        rgb[k] = (uint8_t)(k * 7 + salt * 31 + (k / 97) * salt);
    uint8_t *j = tu_jpeg(rgb, w, h, 90, n);
    free(rgb);
    REQUIRE(j);
    return j;
}

static void test_bench_decode(void)
{
    size_t n0, n1;
    uint8_t *a = jpeg_of(64, 48, 1, &n0), *b = jpeg_of(64, 48, 2, &n1);
    const void *samples[2] = {a, b};
    size_t lens[2] = {n0, n1};
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_transform(o, "Resize(16)|CenterCrop(16)") == STK_OK);
    size_t sb = 3 * 16 * 16;
    uint8_t *out = calloc(4, sb);
    REQUIRE(out);
    stk_bench_decode_result r = {.struct_size = sizeof r};
    char err[256];
    int rc = stk_bench_decode(o, samples, lens, 2, 2, 0.3, out, 4 * sb, &r, err, sizeof err);
    if (rc)
        fprintf(stderr, "stk_bench_decode: %s\n", err);
    CHECK_EQ(rc, STK_OK);
    CHECK_EQ(r.threads, 2);
    CHECK(r.samples >= 4);
    CHECK_EQ(r.failed, 0);
    CHECK(r.seconds >= 0.3 && r.seconds < 5);
    CHECK(r.cpu_seconds > 0);
    CHECK_EQ(r.kind, STK_BATCH_DENSE);
    CHECK_EQ(r.dtype, STK_DTYPE_UINT8);
    CHECK_EQ(r.ndim, 3);
    CHECK_EQ(r.shape[0], 3);
    CHECK_EQ(r.shape[1], 16);
    CHECK_EQ(r.shape[2], 16);
    CHECK_EQ(r.sample_bytes, sb);
    CHECK_EQ(r.outputs, 2); /* one per sample, though out holds 4 */
    CHECK_EQ(r.input_images, 2);
    CHECK_EQ(r.input_pixels, 2 * 64 * 48);
    CHECK(memcmp(out, out + sb, sb) != 0);
    /* A transform without randomness makes the same output of a sample in
     * every run: what the loader would put in its batch slot. */
    uint8_t *again = calloc(1, sb);
    REQUIRE(again);
    stk_bench_decode_result r1 = {.struct_size = sizeof r1};
    CHECK_EQ(stk_bench_decode(o, samples + 1, lens + 1, 1, 1, 0.1, again, sb, &r1, err, sizeof err),
             STK_OK);
    CHECK_EQ(r1.outputs, 1);
    CHECK(!memcmp(again, out + sb, sb));
    CHECK(out[2 * sb] == 0 && !memcmp(out + 2 * sb, out + 3 * sb, sb)); /* untouched */
    free(again);
    /* A sample that is no image fails, counted, and the run goes on. */
    static const uint8_t junk[64] = {0xff, 0xd8, 0xff, 0xe0};
    samples[1] = junk;
    lens[1] = sizeof junk;
    stk_bench_decode_result r2 = {.struct_size = sizeof r2};
    CHECK_EQ(stk_bench_decode(o, samples, lens, 2, 1, 0.2, NULL, 0, &r2, err, sizeof err), STK_OK);
    CHECK(r2.samples > 0 && r2.failed > 0);
    CHECK_EQ(r2.outputs, 0);
    /* Misuse: each refused with a reason. */
    stk_bench_decode_result bad = {.struct_size = 0};
    CHECK_EQ(stk_bench_decode(o, samples, lens, 2, 1, 0.2, NULL, 0, &bad, err, sizeof err),
             STK_EINVAL);
    CHECK(*err);
    CHECK_EQ(stk_bench_decode(o, samples, lens, 2, 300, 0.2, NULL, 0, &r2, err, sizeof err),
             STK_EINVAL);
    CHECK_EQ(stk_bench_decode(o, samples, lens, 0, 1, 0.2, NULL, 0, &r2, err, sizeof err),
             STK_EINVAL);
    CHECK_EQ(stk_bench_decode(o, samples, lens, 2, 1, 0, NULL, 0, &r2, err, sizeof err),
             STK_EINVAL);
    REQUIRE(stk_options_set_transform(o, "Resize(x)") == STK_OK);
    CHECK_EQ(stk_bench_decode(o, samples, lens, 2, 1, 0.2, NULL, 0, &r2, err, sizeof err),
             STK_EINVAL);
    CHECK(*err);
    REQUIRE(stk_options_set_transform(o, "none") == STK_OK);
    CHECK_EQ(stk_bench_decode(o, samples, lens, 2, 1, 0.2, NULL, 0, &r2, err, sizeof err),
             STK_EINVAL);
    CHECK(strstr(err, "no transform") != NULL);
    stk_options_destroy(o);
    free(out);
    free(a);
    free(b);
}

int main(void)
{
    tu_begin("test_bench_api", 60);
    RUN(test_get_every_key_round_trips);
    RUN(test_get_values);
    RUN(test_reset_every_key);
    RUN(test_default_threads);
    RUN(test_bench_decode);
    return tu_end();
}
