/* test_restart.c -- restart-indexed JPEG (src/codec/jpeg_restart.c): the
 * rewrite is lossless, a crop decoded through the index gives exactly the
 * pixels of the whole file at every scale, on every JPEG variant (4:4:4,
 * 4:2:0, 4:2:2, 4:4:0, 4:1:1, greyscale, CMYK, progressive, sizes that are not
 * MCU multiples, crops touching every edge), and an index that lies is a
 * clear error, never a wrong image. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "codec/codec.h"
#include "codec/jpeg_restart.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

enum { V444, V420, V422, V440, V411, VGREY, VCMYK, VPROG, VCOUNT };
static const char *const vname[VCOUNT] = {"4:4:4", "4:2:0", "4:2:2", "4:4:0",
                                          "4:1:1", "grey",  "cmyk",  "progressive 4:2:0"};

/* A photo-like test image: gradients, edges and noise, so every coefficient
 * band is used. */
static uint8_t *encode(int w, int h, int v, size_t *len)
{
    int comps = v == VGREY ? 1 : v == VCMYK ? 4 : 3;
    uint8_t *px = malloc((size_t)w * (size_t)h * (size_t)comps);
    REQUIRE(px);
    uint32_t seed = (uint32_t)(w * 7919 + h * 31 + v);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < comps; c++) {
                seed = seed * 1103515245u + 12345u;
                int g = (x * 255 / (w > 1 ? w - 1 : 1) * (c + 1) + y * 255 / (h > 1 ? h - 1 : 1)) / 2;
                int edge = ((x / 11 + y / 7) & 1) * 40;
                int val = (g + edge + (int)((seed >> 16) % 24)) & 255;
                px[((size_t)y * (size_t)w + (size_t)x) * (size_t)comps + (size_t)c] = (uint8_t)val;
            }
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *buf = NULL;
    unsigned long blen = 0;
    jpeg_mem_dest(&c, &buf, &blen);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 92, TRUE);
    if (comps == 3) {
        static const int hv[VCOUNT][2] = {{1, 1}, {2, 2}, {2, 1}, {1, 2}, {4, 1}, {1, 1}, {1, 1}, {2, 2}};
        c.comp_info[0].h_samp_factor = hv[v][0];
        c.comp_info[0].v_samp_factor = hv[v][1];
    }
    if (v == VPROG)
        jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = px + (size_t)c.next_scanline * (size_t)w * (size_t)comps;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(px);
    uint8_t *out = malloc(blen);
    REQUIRE(out);
    memcpy(out, buf, blen);
    free(buf);
    *len = blen;
    return out;
}

/* Decodes region *r at scale m/8 through the codec (as the image pipeline
 * does); returns RGB rows of the region as asked (the codec may widen it),
 * or NULL with the error code in *rc. */
static uint8_t *decode_region(const uint8_t *b, size_t n, unsigned m, stk__rect want, int *rc,
                              char *err, size_t errlen)
{
    void *st = NULL;
    stk__imginfo info;
    stk__codec_opts o = {0};
    uint8_t *out = NULL, *rows = NULL, *tmp = NULL;
    *rc = stk__codec_jpeg.open(&st, b, n, &o, &info, err, errlen);
    if (*rc)
        goto done;
    stk__rect r = want;
    size_t tmp_bytes = 0;
    if ((*rc = stk__codec_jpeg.start(st, m, &r, &tmp_bytes, err, errlen)))
        goto done;
    REQUIRE(r.x <= want.x && r.x + r.w >= want.x + want.w && r.y == want.y && r.h == want.h);
    rows = malloc((size_t)r.w * r.h * 3);
    tmp = malloc(tmp_bytes + 1);
    REQUIRE(rows && tmp);
    if ((*rc = stk__codec_jpeg.read(st, rows, (size_t)r.w * 3, tmp, err, errlen)))
        goto done;
    out = malloc((size_t)want.w * want.h * 3);
    REQUIRE(out);
    for (uint32_t y = 0; y < want.h; y++)
        memcpy(out + (size_t)y * want.w * 3, rows + ((size_t)y * r.w + (want.x - r.x)) * 3,
               (size_t)want.w * 3);
done:
    free(rows);
    free(tmp);
    stk__codec_jpeg.close(st);
    return out;
}

static uint32_t rnd(uint32_t *s, uint32_t n)
{
    *s = *s * 1664525u + 1013904223u;
    return n ? (*s >> 8) % n : 0;
}

static void check_variant(int v, int w, int h)
{
    size_t n = 0, tn = 0;
    uint8_t *orig = encode(w, h, v, &n);
    uint8_t *t = NULL;
    uint32_t k = 0;
    char err[256];
    int rc = stk__rst_transcode(orig, n, &t, &tn, &k, err, sizeof err);
    if (rc) {
        fprintf(stderr, "%s %dx%d: %s\n", vname[v], w, h, err);
        CHECK_EQ(rc, STK_OK);
        free(orig);
        return;
    }
    stk__rst x;
    CHECK_EQ(stk__rst_find(t, tn, &x, err, sizeof err), 1);
    CHECK_EQ(stk__rst_verify(t, tn, &x, err, sizeof err), STK_OK);
    CHECK_EQ(x.k, k);
    CHECK_EQ(x.mcus_w % x.k, 0);
    uint32_t seed = (uint32_t)(v * 1000 + w + h);
    for (unsigned m = 1; m <= 8; m *= 2) {
        uint32_t ow = (uint32_t)(((uint64_t)w * m + 7) / 8), oh = (uint32_t)(((uint64_t)h * m + 7) / 8);
        /* The whole image: the rewrite changed no pixel. */
        stk__rect all = {0, 0, ow, oh};
        int ra, rb;
        uint8_t *a = decode_region(orig, n, m, all, &ra, err, sizeof err);
        uint8_t *bb = decode_region(t, tn, m, all, &rb, err, sizeof err);
        REQUIRE(a && bb);
        CHECK(!memcmp(a, bb, (size_t)ow * oh * 3));
        /* Regions: random ones, and ones at each edge and corner. */
        for (int i = 0; i < 24; i++) {
            stk__rect r;
            if (i < 4) {
                r.w = ow > 3 ? ow / 3 : ow;
                r.h = oh > 3 ? oh / 3 : oh;
                r.x = (i & 1) ? ow - r.w : 0;
                r.y = (i & 2) ? oh - r.h : 0;
            } else {
                r.x = rnd(&seed, ow);
                r.y = rnd(&seed, oh);
                r.w = 1 + rnd(&seed, ow - r.x);
                r.h = 1 + rnd(&seed, oh - r.y);
            }
            uint8_t *c = decode_region(t, tn, m, r, &rb, err, sizeof err);
            REQUIRE(c);
            int same = 1;
            for (uint32_t y = 0; y < r.h && same; y++)
                same = !memcmp(c + (size_t)y * r.w * 3, a + ((size_t)(r.y + y) * ow + r.x) * 3,
                               (size_t)r.w * 3);
            if (!same) {
                int ro;
                uint8_t *o2 = decode_region(orig, n, m, r, &ro, err, sizeof err);
                int same2 = 1;
                for (uint32_t y = 0; o2 && y < r.h && same2; y++)
                    same2 = !memcmp(o2 + (size_t)y * r.w * 3, a + ((size_t)(r.y + y) * ow + r.x) * 3,
                                    (size_t)r.w * 3);
                fprintf(stderr, "%s %dx%d m=%u region %u,%u %ux%u differs (original file: %s)\n",
                        vname[v], w, h, m, r.x, r.y, r.w, r.h, same2 ? "same" : "differs too");
                free(o2);
            }
            CHECK(same);
            free(c);
        }
        free(a);
        free(bb);
    }
    free(orig);
    stk__free(t);
}

static void test_every_variant_every_scale_exact(void)
{
    static const int sizes[][2] = {{1, 1},     {9, 7},     {2, 40},    {16, 16},
                                   {131, 67},  {333, 257}, {640, 480}, {1000, 750}};
    for (int v = 0; v < VCOUNT; v++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            check_variant(v, sizes[s][0], sizes[s][1]);
}

static void test_sub_image_is_a_small_valid_jpeg(void)
{
    size_t n, tn, sn;
    uint8_t *orig = encode(640, 480, V420, &n), *t;
    uint32_t k;
    char err[256];
    REQUIRE(stk__rst_transcode(orig, n, &t, &tn, &k, err, sizeof err) == STK_OK);
    stk__rst x;
    REQUIRE(stk__rst_find(t, tn, &x, err, sizeof err) == 1);
    CHECK_EQ(x.mcu_w, 16);
    CHECK_EQ(x.mcus_w, 40);
    CHECK_EQ(x.k, 10); /* four segments a row */
    uint8_t *sub = malloc(tn);
    REQUIRE(sub);
    CHECK_EQ(stk__rst_sub(t, tn, &x, 10, 20, 10, 30, sub, tn, &sn, err, sizeof err), STK_OK);
    CHECK(sn < tn / 5); /* 200 of 1200 MCUs */
    CHECK_EQ(sub[sn - 2], 0xFF);
    CHECK_EQ(sub[sn - 1], 0xD9);
    stk__rst y;
    CHECK_EQ(stk__rst_find(sub, sn, &y, err, sizeof err), 0); /* the index is not copied */
    /* Bad ranges. */
    CHECK_EQ(stk__rst_sub(t, tn, &x, 0, 1, 5, 10, sub, tn, &sn, err, sizeof err), STK_EINVAL);
    CHECK_EQ(stk__rst_sub(t, tn, &x, 0, 31, 0, 10, sub, tn, &sn, err, sizeof err), STK_EINVAL);
    CHECK_EQ(stk__rst_sub(t, tn, &x, 0, 1, 0, 10, sub, tn - 1, &sn, err, sizeof err), STK_EINVAL);
    /* Rewriting a rewritten file keeps one index. */
    uint8_t *t2;
    size_t tn2;
    REQUIRE(stk__rst_transcode(t, tn, &t2, &tn2, &k, err, sizeof err) == STK_OK);
    CHECK_EQ(tn2, tn);
    stk__free(t2);
    free(sub);
    free(orig);
    stk__free(t);
}

/* An index that lies: every corruption is an error from open or start,
 * never other pixels. */
static void test_lying_index_is_an_error(void)
{
    size_t n, tn;
    uint8_t *orig = encode(320, 240, V420, &n), *t;
    uint32_t k;
    char err[256];
    REQUIRE(stk__rst_transcode(orig, n, &t, &tn, &k, err, sizeof err) == STK_OK);
    stk__rst x;
    REQUIRE(stk__rst_find(t, tn, &x, err, sizeof err) == 1);
    size_t idx = (size_t)(x.offs - t);
    int ra;
    stk__rect all = {0, 0, 320, 240}, part = {100, 100, 50, 50};
    uint8_t *good = decode_region(t, tn, 8, all, &ra, err, sizeof err);
    REQUIRE(good);
    struct {
        size_t at;
        int delta;
    } edits[] = {
        {idx + 4 * 5, 1},              /* segment 5 starts one byte late */
        {idx + 4 * 5, -3},             /* ... or early */
        {idx - 8, 1},                  /* nseg */
        {idx - 12, 1},                 /* k */
        {idx + 4 * x.nseg, 1},         /* the end */
        {idx - 13, 1},                 /* the version */
        {stk__rst_off(&x, 40) - 1, 1}, /* a RST marker's number */
    };
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        uint8_t *bad = malloc(tn);
        REQUIRE(bad);
        memcpy(bad, t, tn);
        bad[edits[e].at] = (uint8_t)(bad[edits[e].at] + edits[e].delta);
        int rc;
        uint8_t *px = decode_region(bad, tn, 8, part, &rc, err, sizeof err);
        if (px) {
            /* Decoding went through: the pixels must be right. */
            int same = 1;
            for (uint32_t y = 0; y < part.h && same; y++)
                same = !memcmp(px + (size_t)y * part.w * 3,
                               good + ((size_t)(part.y + y) * 320 + part.x) * 3, (size_t)part.w * 3);
            if (!same)
                fprintf(stderr, "edit %zu decoded to other pixels\n", e);
            CHECK(same);
            free(px);
        } else {
            CHECK(rc == STK_EFORMAT);
            CHECK(strstr(err, "restart index") || strstr(err, "JPEG"));
        }
        free(bad);
    }
    free(good);
    free(orig);
    stk__free(t);
}

static void test_not_rewritable(void)
{
    uint8_t *t;
    size_t tn;
    uint32_t k;
    char err[256];
    static const uint8_t text[] = "hello, not a jpeg";
    CHECK_EQ(stk__rst_transcode(text, sizeof text, &t, &tn, &k, err, sizeof err), STK_EFORMAT);
    CHECK(t == NULL);
    size_t n;
    uint8_t *orig = encode(64, 64, V420, &n);
    CHECK(stk__rst_transcode(orig, n / 2, &t, &tn, &k, err, sizeof err) != STK_OK);
    CHECK(t == NULL);
    free(orig);
}

int main(void)
{
    tu_begin("test_restart", 300);
    RUN(test_every_variant_every_scale_exact);
    RUN(test_sub_image_is_a_small_valid_jpeg);
    RUN(test_lying_index_is_an_error);
    RUN(test_not_rewritable);
    return tu_end();
}
