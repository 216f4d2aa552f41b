/* test_soak.c -- many open/close cycles and many epochs in one process: the
 * resident set, open descriptors (/proc/self/fd), threads (/proc/self/task)
 * and live library allocations stay flat.
 *
 * One cycle opens a loader on each local source kind (folder, records, .stk,
 * tar, CIFAR, and a folder of JPEGs and PNGs decoded and augmented), runs two
 * epochs (the second after a seek back to epoch 0 via
 * set_epoch), reads stats and errors, and closes; a loader that stays open for
 * the whole soak runs one more epoch per cycle. After a warm-up (a fifth of
 * the cycles, at least 3), every checkpoint must show the warm-up's fds,
 * threads and live allocations exactly, and an RSS within 8 MiB + 10% of it.
 * (Under ASan/TSan the RSS is printed but not judged: their allocators keep
 * freed memory in quarantine.)
 *
 * Short by default (`make test`: 60 cycles). Long: STK_SOAK_SECONDS=3600
 * build/release/tests/test_soak runs cycles for an hour (or STK_SOAK_CYCLES=n
 * for a count), printing a checkpoint line every 10 s. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "source/stkformat.h"

#include <jpeglib.h>
#include <spng.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

long stk__alloc_live(void);

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define JUDGE_RSS 0
#else
#define JUDGE_RSS 1
#endif

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (uint8_t)((k * 31 + seed * 17) ^ (k >> 3));
}

static const char *make_folder(void)
{
    const char *root = tu_path("folder");
    char p[1024];
    uint8_t buf[4096];
    for (int k = 0; k < 60; k++) {
        snprintf(p, sizeof p, "%s/c%d", root, k % 4);
        tu_mkdirs(p);
        snprintf(p + strlen(p), sizeof p - strlen(p), "/f%03d.png", k);
        size_t n = 500 + (size_t)k * 57;
        fill(buf, n, (unsigned)k);
        tu_write_file(p, buf, n);
    }
    return root;
}

/* 24 JPEGs (baseline and progressive) and 8 PNGs of 40..100 x 30..75. */
static void write_jpeg(const char *path, uint32_t w, uint32_t h, int progressive, unsigned seed)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *mem = NULL;
    unsigned long len = 0;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &mem, &len);
    c.image_width = w;
    c.image_height = h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    if (progressive)
        jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    uint8_t row[300];
    while (c.next_scanline < h) {
        fill(row, (size_t)w * 3, seed + c.next_scanline);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    tu_write_file(path, mem, len);
    free(mem);
}

static void write_png(const char *path, uint32_t w, uint32_t h, unsigned seed)
{
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    struct spng_ihdr ih = {w, h, 8, SPNG_COLOR_TYPE_TRUECOLOR, 0, 0, 0};
    spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    spng_set_ihdr(ctx, &ih);
    size_t n = (size_t)w * h * 3;
    uint8_t *px = malloc(n);
    fill(px, n, seed);
    REQUIRE(spng_encode_image(ctx, px, n, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) == 0);
    size_t len = 0;
    int err = 0;
    void *out = spng_get_png_buffer(ctx, &len, &err);
    REQUIRE(out && !err);
    tu_write_file(path, out, len);
    free(out);
    free(px);
    spng_ctx_free(ctx);
}

static const char *make_images(void)
{
    const char *root = tu_path("images");
    char p[1024];
    for (int k = 0; k < 32; k++) {
        snprintf(p, sizeof p, "%s/c%d", root, k % 3);
        tu_mkdirs(p);
        uint32_t w = 40 + (uint32_t)(k * 7) % 61, h = 30 + (uint32_t)(k * 11) % 46;
        snprintf(p + strlen(p), sizeof p - strlen(p), "/f%03d.%s", k, k < 24 ? "jpg" : "png");
        if (k < 24)
            write_jpeg(p, w, h, k % 2, (unsigned)k);
        else
            write_png(p, w, h, (unsigned)k);
    }
    return root;
}

static const char *make_records(void)
{
    const char *p = tu_path("rec.bin");
    static uint8_t buf[400 * 65];
    fill(buf, sizeof buf, 5);
    tu_write_file(p, buf, sizeof buf);
    return p;
}

static const char *make_stk(void)
{
    const char *dir = tu_path("stk");
    tu_mkdirs(dir);
    char err[512], path[1024];
    snprintf(path, sizeof path, "%s/train-000000.stk", dir);
    stk__stk_header h = {.kind = STK_PAYLOAD_RAW, .align = 64, .raw_h = 8, .raw_w = 8, .raw_c = 3};
    stk__stk_writer *w;
    REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
    for (int k = 0; k < 200; k++) {
        uint8_t px[192];
        fill(px, sizeof px, (unsigned)k);
        REQUIRE(stk__stkw_add(w, px, sizeof px, k % 10, NULL, 8, 8, err, sizeof err) == STK_OK);
    }
    uint64_t size;
    REQUIRE(stk__stkw_finish(w, 10, &size, err, sizeof err) == STK_OK);
    return dir;
}

static const char *make_tar(void)
{
    const char *p = tu_path("train-000000.tar");
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int k = 0; k < 100; k++) {
        char name[64], lab[16];
        uint8_t img[2000];
        size_t n = 300 + (size_t)k * 17;
        fill(img, n, (unsigned)k);
        snprintf(name, sizeof name, "s%04d.png", k);
        tu_tar_add(&t, &tn, name, img, n);
        snprintf(name, sizeof name, "s%04d.cls", k);
        snprintf(lab, sizeof lab, "%d\n", k % 5);
        tu_tar_add(&t, &tn, name, lab, strlen(lab));
    }
    t = realloc(t, tn + 1024);
    memset(t + tn, 0, 1024);
    tu_write_file(p, t, tn + 1024);
    free(t);
    return p;
}

static const char *make_cifar(void)
{
    const char *dir = tu_path("cifar");
    tu_mkdirs(dir);
    static uint8_t b[50 * 3073];
    for (int r = 0; r < 50; r++) {
        b[r * 3073] = (uint8_t)(r % 10);
        fill(b + r * 3073 + 1, 3072, (unsigned)r);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/data_batch_1.bin", dir);
    tu_write_file(path, b, sizeof b);
    return dir;
}

/* Runs the loader's current epoch to its end; returns samples delivered. */
static uint64_t epoch(stk_loader *l)
{
    uint64_t n = 0;
    for (;;) {
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (rc == STK_END)
            return n;
        REQUIRE(rc == STK_OK);
        n += b->size;
        stk_batch_release(b);
    }
}

typedef struct figures {
    long rss;
    int fds, threads;
    long live;
} figures;

static figures measure(void)
{
    figures f = {tu_rss_bytes(), tu_count_fds(), tu_count_threads(), stk__alloc_live()};
    return f;
}

static void test_soak(void)
{
    enum { NCFG = 6 };
    tu_cfg cfgs[NCFG];
    memset(cfgs, 0, sizeof cfgs);
    cfgs[0].path = make_folder();
    cfgs[1].path = make_records();
    cfgs[1].record = 65;
    cfgs[1].label = 1;
    cfgs[2].path = make_stk();
    cfgs[3].path = make_tar();
    cfgs[4].path = make_cifar();
    const uint64_t samples[NCFG] = {60, 400, 200, 100, 50, 32};
    for (int k = 0; k < NCFG; k++) {
        cfgs[k].bs = 7;
        cfgs[k].threads = 3;
        cfgs[k].depth = 2;
        cfgs[k].seed = 11;
        cfgs[k].shuffle = 1;
        cfgs[k].max_sample = 8192;
    }
    /* Decoded and augmented images: the codecs' and the pipeline's memory. */
    cfgs[5].path = make_images();
    cfgs[5].transform = "RandomResizedCrop(24)|RandomHorizontalFlip()|Normalize(0.5, 0.25)";
    /* The loader that stays open: its threads count in every checkpoint. */
    stk_loader *stay;
    REQUIRE(tu_open_cfg(&stay, &cfgs[1]) == STK_OK);

    long seconds = getenv("STK_SOAK_SECONDS") ? atol(getenv("STK_SOAK_SECONDS")) : 0;
    long cycles = getenv("STK_SOAK_CYCLES") ? atol(getenv("STK_SOAK_CYCLES")) : 60;
    uint64_t t0 = (uint64_t)time(NULL), last = t0;
    long warm = seconds ? -1 : (cycles / 5 > 3 ? cycles / 5 : 3);
    figures base = {0}, peak = {0};
    int have_base = 0;
    long c;
    uint64_t total = 0;
    for (c = 0;; c++) {
        uint64_t now = (uint64_t)time(NULL);
        if (seconds ? now - t0 >= (uint64_t)seconds : c >= cycles)
            break;
        for (int k = 0; k < NCFG; k++) {
            stk_loader *l;
            REQUIRE(tu_open_cfg(&l, &cfgs[k]) == STK_OK);
            CHECK_EQ(epoch(l), samples[k]);
            CHECK_EQ(stk_loader_set_epoch(l, 0), STK_OK);
            CHECK_EQ(epoch(l), samples[k]);
            stk_stats st = {.struct_size = sizeof st};
            CHECK_EQ(stk_loader_stats(l, &st), STK_OK);
            CHECK_EQ(stk_loader_error_count(l), 0);
            stk_loader_close(l);
            total += 2 * samples[k];
        }
        CHECK_EQ(epoch(stay), 400);
        total += 400;
        /* Warm-up ends after `warm` cycles (long runs: after 60 s). */
        if (!have_base && (warm >= 0 ? c + 1 == warm : now - t0 >= 60)) {
            base = peak = measure();
            have_base = 1;
            last = now;
            printf("    warm after %ld cycles: RSS %.1f MiB, %d fds, %d threads, %ld live "
                   "allocations\n",
                   c + 1, (double)base.rss / 1048576.0, base.fds, base.threads, base.live);
            continue;
        }
        bool checkpoint = seconds ? now - last >= 10 : (c + 1) % 5 == 0;
        if (!have_base || !checkpoint)
            continue;
        last = now;
        figures f = measure();
        if (f.rss > peak.rss)
            peak.rss = f.rss;
        printf("    cycle %5ld, %5llus, %9llu samples: RSS %.1f MiB, %d fds, %d threads, %ld "
               "live allocations\n",
               c + 1, (unsigned long long)(now - t0), (unsigned long long)total,
               (double)f.rss / 1048576.0, f.fds, f.threads, f.live);
        CHECK_EQ(f.fds, base.fds);
        CHECK_EQ(f.threads, base.threads);
        CHECK_EQ(f.live, base.live);
        if (JUDGE_RSS)
            CHECK(f.rss <= base.rss + (8L << 20) + base.rss / 10);
    }
    stk_loader_close(stay);
    REQUIRE(have_base);
    printf("    %ld cycles (%ld loaders opened and closed), %llu samples: RSS %.1f MiB after "
           "warm-up, peak %.1f MiB (+%.1f)%s; fds %d, threads %d flat\n",
           c, c * NCFG, (unsigned long long)total, (double)base.rss / 1048576.0,
           (double)peak.rss / 1048576.0, (double)(peak.rss - base.rss) / 1048576.0,
           JUDGE_RSS ? "" : " (not judged under a sanitizer)", base.fds, base.threads);
}

int main(void)
{
    long seconds = getenv("STK_SOAK_SECONDS") ? atol(getenv("STK_SOAK_SECONDS")) : 0;
    tu_begin("test_soak", (unsigned)(seconds > 0 ? seconds + 300 : 300));
    RUN(test_soak);
    return tu_end();
}
