/* test_decode_limits.c -- decoding through the loader where the codecs'
 * shortcuts and limits show: strict mode (a truncated file fails in every
 * epoch, whatever part of it the crop needs), and libjpeg's own memory
 * (capped by jpeg_memory and counted in the memory bound). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <spng.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#else
#define UNDER_SANITIZER 0
#endif
#define FIXED_OVERHEAD (16u << 20) /* docs/memory.md */

/* A noisy RGB image, so that the compressed bytes spread evenly over rows. */
static uint8_t *noise_pixels(uint32_t w, uint32_t h)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    REQUIRE(p);
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)((i / 3 % w) + (x & 63));
    }
    return p;
}

/* progressive: 1 progressive; 2 progressive and 4:4:4. noise: 0 gives a
 * smooth gradient (a small file whatever the size). */
static uint8_t *enc_jpeg_x(uint32_t w, uint32_t h, int progressive, int noise, size_t *n)
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
    if (progressive == 2)
        c.comp_info[0].h_samp_factor = c.comp_info[0].v_samp_factor = 1;
    jpeg_start_compress(&c, TRUE);
    uint8_t *px = noise ? noise_pixels(w, h) : NULL, *row = malloc((size_t)w * 3);
    REQUIRE(row);
    while (c.next_scanline < h) {
        uint32_t y = c.next_scanline;
        JSAMPROW r = row;
        if (px)
            r = px + (size_t)y * w * 3;
        else
            for (uint32_t x = 0; x < w; x++)
                row[3 * x] = (uint8_t)x, row[3 * x + 1] = (uint8_t)y, row[3 * x + 2] = 128;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(px);
    free(row);
    *n = len;
    return mem;
}

static uint8_t *enc_jpeg(uint32_t w, uint32_t h, int progressive, size_t *n)
{
    return enc_jpeg_x(w, h, progressive, 1, n);
}

static uint8_t *enc_png(uint32_t w, uint32_t h, size_t *n)
{
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    REQUIRE(ctx);
    spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {0};
    ih.width = w;
    ih.height = h;
    ih.bit_depth = 8;
    ih.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
    spng_set_ihdr(ctx, &ih);
    uint8_t *px = noise_pixels(w, h);
    REQUIRE(spng_encode_image(ctx, px, (size_t)w * h * 3, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) == 0);
    int err = 0;
    uint8_t *out = spng_get_png_buffer(ctx, n, &err);
    REQUIRE(out && !err);
    spng_ctx_free(ctx);
    free(px);
    return out;
}

/* A folder with one class holding `bytes` cut to `keep` bytes as bad.jpg
 * (the name does not matter: formats are sniffed). */
static const char *folder_with(const char *name, const uint8_t *bytes, size_t keep)
{
    static char root[1100];
    char dir[1200], f[1300];
    snprintf(root, sizeof root, "%s/%s", tu_tmpdir(), name);
    snprintf(dir, sizeof dir, "%s/c0", root);
    tu_mkdirs(dir);
    snprintf(f, sizeof f, "%s/bad.jpg", dir);
    tu_write_file(f, bytes, keep);
    return root;
}

/* Runs `epochs` epochs of one-sample batches and counts the epochs whose
 * sample failed; *msg gets the last failure's message. */
static int failing_epochs(const char *root, const char *spec, int strict, int epochs, char *msg,
                          size_t n)
{
    tu_cfg c = {.path = root, .bs = 1, .threads = 1, .seed = 7, .transform = spec};
    if (strict) {
        c.options[0] = "strict";
        c.options[1] = "1";
    }
    stk_loader *l;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    int failed = 0;
    for (int e = 0; e < epochs; e++) {
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (rc == STK_ESAMPLE) {
            failed++;
            snprintf(msg, n, "%s", stk_loader_errmsg(l));
            rc = stk_loader_next(l, &b); /* the batch without it */
            REQUIRE(rc == STK_OK);
            CHECK_EQ(b->size, 0);
        }
        REQUIRE(rc == STK_OK);
        stk_batch_release(b);
        REQUIRE(stk_loader_next(l, &b) == STK_END);
    }
    stk_loader_close(l);
    return failed;
}

/* A baseline JPEG cut at 70%: a crop of its middle never reaches the cut, so
 * by default the sample decodes (the fast path reads only the rows the crop
 * needs); in strict mode it fails in every epoch. Random crops: by default
 * only the epochs whose crop reaches the cut fail; strict, all of them. */
static void test_strict_truncated_jpeg(void)
{
    size_t n;
    uint8_t *j = enc_jpeg(64, 512, 0, &n);
    const char *root = folder_with("trunc-jpeg", j, n * 7 / 10);
    char msg[512] = "";
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 0, 3, msg, sizeof msg), 0);
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 1, 3, msg, sizeof msg), 3);
    CHECK(strstr(msg, "bad.jpg") != NULL && strstr(msg, "JPEG") != NULL);
    printf("    strict: %s\n", msg);
    const char *rrc = "RandomResizedCrop(16, scale=(0.01, 0.02))";
    int lax = failing_epochs(root, rrc, 0, 12, msg, sizeof msg);
    CHECK_EQ(failing_epochs(root, rrc, 1, 12, msg, sizeof msg), 12);
    printf("    random crops: %d of 12 epochs fail by default, 12 of 12 strict\n", lax);
    CHECK(lax < 12);
    /* Whole: fine in both modes. */
    root = folder_with("whole-jpeg", j, n);
    CHECK_EQ(failing_epochs(root, rrc, 0, 3, msg, sizeof msg), 0);
    CHECK_EQ(failing_epochs(root, rrc, 1, 3, msg, sizeof msg), 0);
    /* Progressive: libjpeg reads every scan before the first row, so a cut
     * file fails in both modes. */
    free(j);
    j = enc_jpeg(64, 512, 1, &n);
    root = folder_with("trunc-prog", j, n * 7 / 10);
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 0, 2, msg, sizeof msg), 2);
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 1, 2, msg, sizeof msg), 2);
    free(j);
}

/* The same for PNG, whose rows are decoded in order and stop after the
 * crop's last row unless strict. */
static void test_strict_truncated_png(void)
{
    size_t n;
    uint8_t *p = enc_png(64, 512, &n);
    const char *root = folder_with("trunc-png", p, n * 7 / 10);
    char msg[512] = "";
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 0, 2, msg, sizeof msg), 0);
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 1, 2, msg, sizeof msg), 2);
    CHECK(strstr(msg, "PNG") != NULL);
    root = folder_with("whole-png", p, n);
    CHECK_EQ(failing_epochs(root, "CenterCrop(32)", 1, 2, msg, sizeof msg), 0);
    free(p);
}

/* libjpeg's own memory does not go through the library's allocator. A
 * 4000x3000 progressive 4:4:4 JPEG makes libjpeg hold every coefficient of
 * the image at once (2 bytes x 3 x 12 M = 72 MB) before the first row, even
 * for a small crop. With the default cap (64 MiB) that sample fails cleanly
 * with STK_ETOOBIG and says what to raise; with the cap raised it decodes,
 * and the cap is in the memory bound, which the process's peak RSS stays
 * under (with the other per-thread budgets small, so that without the cap in
 * the bound the coefficients alone would break it). */
static void test_jpeg_memory_bound(void)
{
    size_t n;
    uint8_t *j = enc_jpeg_x(4000, 3000, 2, 0, &n);
    const char *root = folder_with("big-progressive", j, n);
    free(j);
    printf("    4000x3000 progressive 4:4:4 JPEG, %zu bytes\n", n);

    tu_cfg c = {.path = root,
                .bs = 1,
                .threads = 1,
                .depth = 1,
                .transform = "imagenet-val",
                .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->size, 0);
    stk_batch_release(b);
    stk_sample_error e;
    REQUIRE(stk_loader_error_count(l) == 1 && stk_loader_error_get(l, 0, &e) == STK_OK);
    CHECK_EQ(e.code, STK_ETOOBIG);
    CHECK(strstr(e.reason, "jpeg_memory") != NULL && strstr(e.reason, "4000x3000") != NULL);
    CHECK(strstr(e.reason, "67108864") != NULL);
    printf("    default cap: %s\n", e.reason);
    stk_loader_close(l);

    /* Reset the peak (Linux: "5" to clear_refs) and take the baseline. */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    int reset = cr && fputs("5", cr) >= 0;
    if (cr)
        reset &= fclose(cr) == 0;
    long base = reset ? tu_rss_bytes() : tu_peak_rss_bytes();
    tu_cfg big = c;
    big.on_error = STK_ON_ERROR_RAISE;
    const char *opts[] = {"jpeg_memory", "80M", "scratch_bytes", "2M", "max_input_bytes", "4M"};
    memcpy(big.options, opts, sizeof opts);
    REQUIRE(tu_open_cfg(&l, &big) == STK_OK);
    uint64_t bound = stk_loader_memory_bound(l);
    CHECK(bound >= (80u << 20) + (6u << 20));
    for (int epoch = 0; epoch < 2; epoch++) {
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        CHECK_EQ(b->size, 1);
        stk_batch_release(b);
        REQUIRE(stk_loader_next(l, &b) == STK_END);
    }
    long peak = tu_peak_rss_bytes();
    stk_loader_close(l);
    long growth = peak - base;
    printf("    cap 80 MiB: memory bound %.1f MiB, peak RSS growth %.1f MiB%s\n",
           (double)bound / 1048576.0, (double)growth / 1048576.0, reset ? "" : " (peak not reset)");
    if (UNDER_SANITIZER)
        printf("    (RSS not checked under a sanitizer)\n");
    else
        CHECK(growth <= (long)(bound + FIXED_OVERHEAD));

    /* A wide baseline image needs no coefficient array: the smallest cap
     * still decodes it. */
    j = enc_jpeg_x(16384, 64, 0, 0, &n);
    root = folder_with("wide-baseline", j, n);
    free(j);
    tu_cfg wide = c;
    wide.path = root;
    wide.transform = "CenterCrop(32)";
    wide.on_error = STK_ON_ERROR_RAISE;
    wide.options[0] = "jpeg_memory";
    wide.options[1] = "4M";
    REQUIRE(tu_open_cfg(&l, &wide) == STK_OK);
    int rc = stk_loader_next(l, &b);
    if (rc)
        fprintf(stderr, "    %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    CHECK_EQ(b->size, 1);
    stk_batch_release(b);
    stk_loader_close(l);
}

static void test_strict_option_values(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "strict", "1"), STK_OK);
    CHECK_EQ(stk_options_set(o, "strict", "0"), STK_OK);
    CHECK_EQ(stk_options_set(o, "strict", "yes"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "jpeg_memory", "128M"), STK_OK);
    CHECK_EQ(stk_options_set(o, "jpeg_memory", "1M"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "jpeg_memory", "lots"), STK_EINVAL);
    stk_options_destroy(o);
}

int main(void)
{
    tu_begin("test_decode_limits", 300);
    RUN(test_strict_truncated_jpeg);
    RUN(test_strict_truncated_png);
    RUN(test_jpeg_memory_bound);
    RUN(test_strict_option_values);
    return tu_end();
}
