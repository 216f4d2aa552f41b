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
 * band is used. `restart`: a restart marker every that many MCUs (0: none);
 * `comp_scans`: a sequential file with one scan per component (V444). */
static uint8_t *encode_ex(int w, int h, int v, unsigned restart, int comp_scans, size_t *len)
{
    int comps = v == VGREY ? 1 : v == VCMYK ? 4 : 3;
    uint8_t *px = malloc((size_t)w * (size_t)h * (size_t)comps);
    REQUIRE(px);
    uint32_t seed = (uint32_t)(w * 7919 + h * 31 + v);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < comps; c++) {
                seed = seed * 1103515245u + 12345u;
                int g =
                    (x * 255 / (w > 1 ? w - 1 : 1) * (c + 1) + y * 255 / (h > 1 ? h - 1 : 1)) / 2;
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
        static const int hv[VCOUNT][2] = {{1, 1}, {2, 2}, {2, 1}, {1, 2},
                                          {4, 1}, {1, 1}, {1, 1}, {2, 2}};
        c.comp_info[0].h_samp_factor = hv[v][0];
        c.comp_info[0].v_samp_factor = hv[v][1];
    }
    if (v == VPROG)
        jpeg_simple_progression(&c);
    jpeg_scan_info scans[3];
    if (comp_scans) {
        for (int k = 0; k < comps; k++)
            scans[k] = (jpeg_scan_info){
                .comps_in_scan = 1, .component_index = {k}, .Ss = 0, .Se = 63, .Ah = 0, .Al = 0};
        c.scan_info = scans;
        c.num_scans = comps;
    }
    c.restart_interval = restart;
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

static uint8_t *encode(int w, int h, int v, size_t *len)
{
    return encode_ex(w, h, v, 0, 0, len);
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
        uint32_t ow = (uint32_t)(((uint64_t)w * m + 7) / 8),
                 oh = (uint32_t)(((uint64_t)h * m + 7) / 8);
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
                    same2 = !memcmp(o2 + (size_t)y * r.w * 3,
                                    a + ((size_t)(r.y + y) * ow + r.x) * 3, (size_t)r.w * 3);
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
    static const int sizes[][2] = {{1, 1},    {9, 7},     {2, 40},    {16, 16},
                                   {131, 67}, {333, 257}, {640, 480}, {1000, 750}};
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
                same =
                    !memcmp(px + (size_t)y * part.w * 3,
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

static uint32_t be16_at(const uint8_t *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A JPEG written with a restart marker every k MCUs and an index attached as
 * the packer attaches it (jpeg_restart.h), whose segments are those of the
 * file's FIRST scan, the last one running to EOI over the later scans. Of a
 * progressive file or one scan per component, every offset, marker and count
 * matches; only the premise (one scan) is false. */
static uint8_t *first_scan_index(const uint8_t *b, size_t n, uint32_t nseg, uint32_t k,
                                 size_t *out_len)
{
    size_t i = 2, apps_end = 2, sos_end = 0;
    int apps = 1;
    while (!sos_end) {
        REQUIRE(i + 4 <= n && b[i] == 0xFF);
        int m = b[i + 1];
        size_t len = be16_at(b + i + 2);
        if (m == 0xDA)
            sos_end = i + 2 + len;
        else if (apps && m >= 0xE0 && m <= 0xEF)
            apps_end = i + 2 + len;
        else
            apps = 0;
        i += 2 + len;
    }
    uint32_t *offs = malloc((nseg + 1) * sizeof *offs);
    REQUIRE(offs);
    uint32_t s = 0;
    offs[s++] = (uint32_t)sos_end;
    for (i = sos_end; i + 1 < n; i++) {
        if (b[i] != 0xFF || b[i + 1] == 0x00)
            continue;
        if (b[i + 1] < 0xD0 || b[i + 1] > 0xD7)
            break; /* the end of the first scan */
        REQUIRE(s < nseg);
        offs[s++] = (uint32_t)(i + 2);
    }
    REQUIRE(s == nseg);
    REQUIRE(b[n - 2] == 0xFF && b[n - 1] == 0xD9);
    offs[nseg] = (uint32_t)(n - 2);
    size_t mlen = 4 + 8 + 8 + 4 * ((size_t)nseg + 1);
    uint8_t *out = malloc(n + mlen);
    REQUIRE(out);
    memcpy(out, b, apps_end);
    uint8_t *p = out + apps_end;
    p[0] = 0xFF;
    p[1] = 0xEF;
    p[2] = (uint8_t)((mlen - 2) >> 8);
    p[3] = (uint8_t)(mlen - 2);
    memcpy(p + 4, "STKRST", 7);
    p[11] = 1;
    put32(p + 12, k);
    put32(p + 16, nseg);
    for (uint32_t q = 0; q <= nseg; q++)
        put32(p + 20 + 4 * (size_t)q, offs[q] + (uint32_t)mlen);
    memcpy(out + apps_end + mlen, b + apps_end, n - apps_end);
    free(offs);
    *out_len = n + mlen;
    return out;
}

/* The two files whose first scan is not the whole image: progressive 4:2:0
 * (a DC-only first scan; MCUs 16x16) and sequential 4:4:4 with one scan per
 * component (a luma-only first scan; MCUs 8x8), w x h, k = MCUs a row / 4. */
static uint8_t *multi_scan_with_index(int prog, int w, int h, size_t *len)
{
    uint32_t mcu = prog ? 16 : 8;
    uint32_t mw = ((uint32_t)w + mcu - 1) / mcu, mh = ((uint32_t)h + mcu - 1) / mcu;
    REQUIRE(mw % 4 == 0);
    size_t n;
    uint8_t *orig = encode_ex(w, h, prog ? VPROG : V444, mw / 4, !prog, &n);
    uint8_t *t = first_scan_index(orig, n, 4 * mh, mw / 4, len);
    free(orig);
    return t;
}

/* A restart index over the first scan of a multi-scan file (issue 18): its
 * sub-images hold only that scan (DC only, or luma only) and decoded without
 * an error to pixels up to 174 away from the whole decode. Such an index is
 * refused as a lie, like any other. */
static void test_index_on_a_multi_scan_file_is_an_error(void)
{
    for (int prog = 1; prog >= 0; prog--) {
        size_t tn;
        uint8_t *t = multi_scan_with_index(prog, 320, 240, &tn);
        char err[256] = "";
        stk__rst x;
        CHECK_EQ(stk__rst_find(t, tn, &x, err, sizeof err), STK_EFORMAT);
        CHECK(strstr(err, prog ? "progressive" : "first scan") != NULL);
        stk__rect part = {100, 60, 50, 50};
        for (unsigned m = 2; m <= 8; m *= 2) {
            stk__rect r = {part.x * m / 8, part.y * m / 8, part.w * m / 8, part.h * m / 8};
            int rc = 0;
            err[0] = '\0';
            uint8_t *px = decode_region(t, tn, m, r, &rc, err, sizeof err);
            CHECK(px == NULL);
            CHECK_EQ(rc, STK_EFORMAT);
            if (!strstr(err, "restart index"))
                fprintf(stderr, "%s, m=%u: %s\n", prog ? "progressive" : "per-component scans", m,
                        err);
            CHECK(strstr(err, "restart index") != NULL);
            free(px);
        }
        free(t);
    }
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

/* `test_restart --write-seeds DIR` writes the multi-scan files with a first-
 * scan index into DIR: the fuzzer's oracle seeds (tests/fuzz/corpus/image). */
static int write_seeds(const char *dir)
{
    for (int prog = 1; prog >= 0; prog--) {
        size_t n;
        uint8_t *t = multi_scan_with_index(prog, 128, prog ? 128 : 96, &n);
        char path[1024];
        snprintf(path, sizeof path, "%s/restart-first-scan-%s.jpg", dir,
                 prog ? "progressive" : "per-component");
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(t, 1, n, f) != n || fclose(f)) {
            perror(path);
            return 1;
        }
        free(t);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-seeds"))
        return write_seeds(argv[2]);
    tu_begin("test_restart", 300);
    RUN(test_every_variant_every_scale_exact);
    RUN(test_sub_image_is_a_small_valid_jpeg);
    RUN(test_lying_index_is_an_error);
    RUN(test_index_on_a_multi_scan_file_is_an_error);
    RUN(test_not_rewritable);
    return tu_end();
}
