/* test_arena.c -- variable-size batches without a per-slot budget (issue 13,
 * item 12; docs/memory.md): a batch's samples take exactly what they need
 * from its arena, up to batch_memory. A photo folder with one large image
 * decodes with the defaults; raw files of a few MB load with the defaults;
 * a sample over batch_memory, or a batch whose samples overflow it, fails
 * with the numbers; content and order do not depend on the thread count;
 * the memory bound counts batch_memory once per ring buffer; an arena gives
 * memory back after a large batch. Also run under ASan and TSan. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "image.h"

#include <stdlib.h>
#include <string.h>

/* w x h pixels of a smooth pattern, as a JPEG. */
static uint8_t *make_jpeg(uint32_t w, uint32_t h, uint32_t seed, size_t *n)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++)
            for (uint32_t c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] =
                    (uint8_t)((x * (c + 1) + y * (3 - c) + seed * 40) / 5);
    uint8_t *j = tu_jpeg(rgb, w, h, 85, n);
    free(rgb);
    return j;
}

/* An ImageFolder: 7 small images and one of big_w x big_h. */
static const char *photo_folder(uint32_t big_w, uint32_t big_h)
{
    static char root[600];
    snprintf(root, sizeof root, "%s", tu_path("photos"));
    tu_mkdirs(tu_path("photos/a"));
    tu_mkdirs(tu_path("photos/b"));
    for (uint32_t k = 0; k < 8; k++) {
        uint32_t w = k == 5 ? big_w : 40 + k * 9, h = k == 5 ? big_h : 30 + k * 7;
        size_t n = 0;
        uint8_t *j = make_jpeg(w, h, k, &n);
        char p[800];
        snprintf(p, sizeof p, "%s/%c/img%u.jpg", root, k % 2 ? 'b' : 'a', k);
        tu_write_file(p, j, n);
        free(j);
    }
    return root;
}

/* The reference decode of a file: the same pipeline into a buffer of its own. */
static uint8_t *decode_file(const char *path, size_t *len, int32_t dims[3])
{
    size_t n = 0;
    uint8_t *bytes = tu_read_file(path, &n);
    REQUIRE(bytes);
    stk__imgpipe *p = NULL;
    char err[256];
    stk__imgpipe_params prm = {0};
    REQUIRE(stk__imgpipe_create(&p, "decode", &prm, err, sizeof err) == STK_OK);
    stk__scratch sc = {NULL, 0, (size_t)256 << 20};
    size_t cap = (size_t)64 << 20;
    uint8_t *out = malloc(cap);
    REQUIRE(out);
    stk__rng rng = stk__rng_for(0, 0, 0);
    REQUIRE(stk__imgpipe_run(p, bytes, n, &rng, &sc, out, cap, len, dims, err, sizeof err) ==
            STK_OK);
    stk__scratch_free(&sc);
    stk__imgpipe_destroy(p);
    free(bytes);
    return out;
}

static void test_decode_photo_folder_with_defaults(void)
{
    const char *root = photo_folder(3000, 2000); /* 18 MB decoded: 17x the old 1 MiB slot */
    stk_loader *l = NULL;
    tu_cfg c = {.path = root, .bs = 4, .threads = 2, .transform = "decode"};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    int rc, seen = 0, big = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->kind, STK_BATCH_VARIABLE);
        for (size_t k = 0; k < b->size; k++) {
            const int32_t *d = &b->dims[3 * k];
            char p[800];
            uint64_t i = b->indices[k];
            /* Indices follow the sorted paths: a/img0,2,4,6 then b/img1,3,5,7. */
            unsigned img = i < 4 ? (unsigned)(2 * i) : (unsigned)(2 * (i - 4) + 1);
            snprintf(p, sizeof p, "%s/%c/img%u.jpg", root, img % 2 ? 'b' : 'a', img);
            size_t len = 0;
            int32_t dims[3];
            uint8_t *want = decode_file(p, &len, dims);
            CHECK_EQ(b->lengths[k], len);
            CHECK(d[0] == dims[0] && d[1] == dims[1] && d[2] == 3);
            CHECK(!memcmp((const uint8_t *)b->data + b->offsets[k], want, len));
            CHECK_EQ(b->offsets[k] % 64, 0);
            big += d[1] == 3000;
            free(want);
            seen++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, 8);
    CHECK_EQ(big, 1);
    stk_loader_close(l);
}

/* Raw bytes (no transform) of mixed sizes, one of 5 MB, with the defaults. */
static const char *raw_folder(void)
{
    static char root[600];
    snprintf(root, sizeof root, "%s", tu_path("raw"));
    tu_mkdirs(tu_path("raw/x"));
    static const size_t sizes[] = {0, 1, 4000, 5u << 20, 70000, 333, 1u << 20, 12};
    for (size_t k = 0; k < 8; k++) {
        uint8_t *d = malloc(sizes[k] + 1);
        REQUIRE(d);
        for (size_t j = 0; j < sizes[k]; j++)
            d[j] = (uint8_t)(j * 7 + k);
        char p[800];
        snprintf(p, sizeof p, "%s/x/f%zu.jpg", root, k);
        tu_write_file(p, d, sizes[k]);
        free(d);
    }
    return root;
}

static uint64_t raw_hash(const char *root, unsigned threads, const char *batch_memory, int *failed)
{
    stk_loader *l = NULL;
    tu_cfg c = {.path = root,
                .bs = 3,
                .threads = threads,
                .shuffle = 1,
                .seed = 5,
                .on_error = STK_ON_ERROR_SKIP,
                .options = {"batch_memory", batch_memory ? batch_memory : "512M", NULL}};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    uint64_t h = 1469598103934665603ULL;
    stk_batch *b;
    for (int e = 0; e < 2; e++) {
        while (stk_loader_next(l, &b) == STK_OK) {
            for (size_t k = 0; k < b->size; k++) {
                h = tu_hash(h, &b->indices[k], sizeof b->indices[k]);
                h = tu_hash(h, &b->lengths[k], sizeof b->lengths[k]);
                h = tu_hash(h, (const uint8_t *)b->data + b->offsets[k], b->lengths[k]);
                size_t n = b->lengths[k];
                for (size_t j = 0; j < n; j += 4099)
                    CHECK_EQ(((const uint8_t *)b->data)[b->offsets[k] + j],
                             (uint8_t)(j * 7 + b->indices[k]));
            }
            stk_batch_release(b);
        }
    }
    if (failed)
        *failed = (int)stk_loader_error_count(l);
    stk_loader_close(l);
    return h;
}

static void test_raw_bytes_with_defaults_any_thread_count(void)
{
    const char *root = raw_folder();
    int failed = -1;
    uint64_t one = raw_hash(root, 1, NULL, &failed);
    CHECK_EQ(failed, 0);
    CHECK(raw_hash(root, 4, NULL, NULL) == one);
    /* A tight arena (the 5 MB file and a 1 MB one may share a batch, and
     * fit together) changes nothing. */
    CHECK(raw_hash(root, 3, "7M", &failed) == one);
    CHECK_EQ(failed, 0);
}

static void test_too_big_names_the_numbers(void)
{
    const char *root = raw_folder();
    /* One sample over batch_memory: always that sample, with both numbers. */
    stk_loader *l = NULL;
    tu_cfg c = {
        .path = root, .bs = 8, .threads = 2, .shuffle = 0, .options = {"batch_memory", "4M", NULL}};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    CHECK_EQ(stk_loader_next(l, &b), STK_ESAMPLE);
    const char *m = stk_loader_errmsg(l);
    CHECK(strstr(m, "f3.jpg") != NULL);
    CHECK(strstr(m, "5242881 bytes") != NULL || strstr(m, "5242880 bytes") != NULL);
    CHECK(strstr(m, "batch_memory (4194304 bytes)") != NULL);
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->size, 7);
    stk_batch_release(b);
    stk_loader_close(l);

    /* A batch whose samples fit one by one but not together. */
    c.options[1] = "5400K";
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    CHECK_EQ(stk_loader_next(l, &b), STK_ESAMPLE);
    m = stk_loader_errmsg(l);
    CHECK(strstr(m, "batch 0 of epoch 0 needs more than batch_memory (5529600 bytes)") != NULL);
    stk_loader_close(l);

    /* max_sample_bytes still caps one sample. */
    tu_cfg c2 = {.path = root,
                 .bs = 8,
                 .threads = 1,
                 .shuffle = 0,
                 .max_sample = 70000,
                 .on_error = STK_ON_ERROR_SKIP};
    REQUIRE(tu_open_cfg(&l, &c2) == STK_OK);
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->size, 6); /* the 5 MB and 1 MB files fail; 70000 bytes fit exactly */
    stk_batch_release(b);
    stk_sample_error e;
    REQUIRE(stk_loader_error_get(l, 0, &e) == STK_OK);
    CHECK_EQ(e.code, STK_ETOOBIG);
    CHECK(strstr(e.reason, "max_sample_bytes") != NULL);
    stk_loader_close(l);
}

static void test_bound_counts_batch_memory(void)
{
    const char *root = raw_folder();
    uint64_t bound[2];
    const char *bm[2] = {"16M", "64M"};
    for (int k = 0; k < 2; k++) {
        stk_loader *l = NULL;
        tu_cfg c = {.path = root,
                    .bs = 256,
                    .threads = 2,
                    .depth = 2,
                    .options = {"batch_memory", bm[k], NULL}};
        REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
        bound[k] = stk_loader_memory_bound(l);
        stk_loader_close(l);
    }
    /* Three ring buffers of batch_memory each, plus what does not depend
     * on it (not 256 slots x a per-sample budget). */
    CHECK_EQ(bound[1] - bound[0], 3ull * (48u << 20));
    CHECK(bound[0] > 3ull * (16u << 20));
    CHECK(bound[0] < 3ull * (16u << 20) + (16u << 20));
}

/* After a batch of 40 MB, batches of a few bytes: the arenas give the
 * memory back (RSS falls), and the large batch's bytes were right. */
static void test_arena_gives_memory_back(void)
{
    tu_mkdirs(tu_path("shrink/x"));
    for (int k = 0; k < 40; k++) {
        size_t n = k < 2 ? (20u << 20) : 16;
        uint8_t *d = malloc(n);
        REQUIRE(d);
        memset(d, 0x5a + k, n);
        char p[800];
        snprintf(p, sizeof p, "%s/x/f%02d.jpg", tu_path("shrink"), k);
        tu_write_file(p, d, n);
        free(d);
    }
    stk_loader *l = NULL;
    tu_cfg c = {.path = tu_path("shrink"), .bs = 2, .threads = 1, .depth = 1, .shuffle = 0};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->lengths[0], 20u << 20);
    CHECK_EQ(((const uint8_t *)b->data)[b->offsets[1] + 12345], 0x5b);
    long peak = tu_rss_bytes();
    stk_batch_release(b);
    for (int k = 0; k < 10; k++) {
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        CHECK_EQ(b->lengths[0], 16);
        stk_batch_release(b);
    }
    long after = tu_rss_bytes();
    printf("  RSS with the 40 MB batch %ld MB, after small ones %ld MB\n", peak >> 20, after >> 20);
    CHECK(peak - after > (30l << 20));
    stk_loader_close(l);
}

int main(void)
{
    tu_begin("test_arena", 300);
    RUN(test_decode_photo_folder_with_defaults);
    RUN(test_raw_bytes_with_defaults_any_thread_count);
    RUN(test_too_big_names_the_numbers);
    RUN(test_bound_counts_batch_memory);
    RUN(test_arena_gives_memory_back);
    return tu_end();
}
