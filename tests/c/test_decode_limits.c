/* test_decode_limits.c -- decoding through the loader where the codecs'
 * shortcuts and limits show: strict mode (a truncated file fails in every
 * epoch, whatever part of it the crop needs). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <spng.h>

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

static uint8_t *enc_jpeg(uint32_t w, uint32_t h, int progressive, size_t *n)
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
    uint8_t *px = noise_pixels(w, h);
    while (c.next_scanline < h) {
        JSAMPROW r = px + (size_t)c.next_scanline * w * 3;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(px);
    *n = len;
    return mem;
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

static void test_strict_option_values(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "strict", "1"), STK_OK);
    CHECK_EQ(stk_options_set(o, "strict", "0"), STK_OK);
    CHECK_EQ(stk_options_set(o, "strict", "yes"), STK_EINVAL);
    stk_options_destroy(o);
}

int main(void)
{
    tu_begin("test_decode_limits", 300);
    RUN(test_strict_truncated_jpeg);
    RUN(test_strict_truncated_png);
    RUN(test_strict_option_values);
    return tu_end();
}
