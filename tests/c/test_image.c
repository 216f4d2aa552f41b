/*
 * test_image.c -- the image pipeline: decoding of every JPEG/PNG variant
 * (fixtures generated here with libjpeg and libspng), bad input of every
 * kind, crop-aware decoding being exact, the spec parser, transform shapes
 * and values, determinism, and RandomResizedCrop's sampling distribution
 * against torchvision's (tests/c/rrc_reference.h).
 */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <spng.h>

#include "image.h"
#include "ops/ops.h"
#include "rrc_reference.h"
#include "testutil.h"

/* ---- Fixture encoders ------------------------------------------------------ */

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

/* A smooth, textured test picture: gradients plus a checker, so both low
 * and high frequencies (and chroma edges) are present. */
static uint8_t pattern(uint32_t x, uint32_t y, int c)
{
    unsigned v = (x * 255u / 97u + y * 3u + (unsigned)c * 80u + (((x / 7) ^ (y / 5)) & 1) * 60u);
    return (uint8_t)(v & 255u);
}

typedef struct jopts {
    int comps; /* 1, 3 or 4 */
    J_COLOR_SPACE in_cs;
    J_COLOR_SPACE jpeg_cs;
    int hs, vs; /* luma sampling factors (2,2 = 4:2:0) */
    int progressive;
    int arith;
    int quality;
    int exif_orientation;  /* 0: no APP1 */
    const uint8_t *pixels; /* NULL: pattern() */
} jopts;

static buf enc_jpeg(uint32_t w, uint32_t h, const jopts *o)
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
    c.input_components = o->comps;
    c.in_color_space = o->in_cs;
    jpeg_set_defaults(&c);
    jpeg_set_colorspace(&c, o->jpeg_cs);
    jpeg_set_quality(&c, o->quality ? o->quality : 92, TRUE);
    if (o->comps >= 3 && o->jpeg_cs == JCS_YCbCr) {
        c.comp_info[0].h_samp_factor = o->hs ? o->hs : 2;
        c.comp_info[0].v_samp_factor = o->vs ? o->vs : 2;
    }
    if (o->progressive)
        jpeg_simple_progression(&c);
    c.arith_code = o->arith ? TRUE : FALSE;
    jpeg_start_compress(&c, TRUE);
    if (o->exif_orientation) {
        /* Exif\0\0 + little-endian TIFF with one IFD0 entry: Orientation. */
        uint8_t ex[6 + 8 + 2 + 12 + 4] = {'E', 'x',  'i',  'f', 0,
                                          0,   'I',  'I',  42,  0,
                                          8,   0,    0,    0,   1,
                                          0,   0x12, 0x01, 3,   0,
                                          1,   0,    0,    0,   (uint8_t)o->exif_orientation,
                                          0,   0,    0,    0,   0,
                                          0,   0};
        jpeg_write_marker(&c, JPEG_APP0 + 1, ex, sizeof ex);
    }
    uint8_t *row = malloc((size_t)w * (size_t)o->comps);
    while (c.next_scanline < h) {
        uint32_t y = c.next_scanline;
        for (uint32_t x = 0; x < w; x++)
            for (int k = 0; k < o->comps; k++)
                row[x * (uint32_t)o->comps + (uint32_t)k] =
                    o->pixels ? o->pixels[((size_t)y * w + x) * (size_t)o->comps + (size_t)k]
                              : pattern(x, y, k);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(row);
    buf b = {mem, len};
    return b;
}

static buf jpeg_rgb(uint32_t w, uint32_t h, int hs, int vs)
{
    jopts o = {3, JCS_RGB, JCS_YCbCr, hs, vs, 0, 0, 92, 0, NULL};
    return enc_jpeg(w, h, &o);
}

/* PNG of raw PNG-format rows (16-bit samples in host order). */
static buf enc_png(uint32_t w, uint32_t h, int color_type, int depth, int interlace,
                   const uint8_t *raw, size_t rawlen, const uint8_t *plte, int nplte,
                   const struct spng_trns *trns, int exif_orientation)
{
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    struct spng_ihdr ih = {w, h, (uint8_t)depth, (uint8_t)color_type, 0, 0, (uint8_t)interlace};
    spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    spng_set_ihdr(ctx, &ih);
    if (plte) {
        struct spng_plte p;
        memset(&p, 0, sizeof p);
        p.n_entries = (uint32_t)nplte;
        for (int k = 0; k < nplte; k++) {
            p.entries[k].red = plte[3 * k];
            p.entries[k].green = plte[3 * k + 1];
            p.entries[k].blue = plte[3 * k + 2];
            p.entries[k].alpha = 255;
        }
        spng_set_plte(ctx, &p);
    }
    if (trns)
        spng_set_trns(ctx, (struct spng_trns *)(uintptr_t)trns);
    if (exif_orientation) {
        static char ex[8 + 2 + 12 + 4] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3,
                                          0,   1,   0,  0, 0, 0, 0, 0, 0, 0, 0,    0,    0};
        ex[18] = (char)exif_orientation;
        struct spng_exif e = {sizeof ex, ex};
        spng_set_exif(ctx, &e);
    }
    int r = spng_encode_image(ctx, raw, rawlen, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    size_t len = 0;
    int err = 0;
    void *out = r ? NULL : spng_get_png_buffer(ctx, &len, &err);
    if (r || err)
        fprintf(stderr, "spng encode: %s\n", spng_strerror(r ? r : err));
    spng_ctx_free(ctx);
    buf b = {out, len};
    return b;
}

/* ---- Running the pipeline -------------------------------------------------- */

typedef struct result {
    int rc;
    int32_t dims[3];
    size_t len;
    uint8_t *out; /* malloc'd, len bytes */
    char err[STK_ERRMSG_MAX];
} result;

static stk__imgpipe_params params(int dtype, int nchw)
{
    stk__imgpipe_params p = {dtype, nchw, 0, 0, 0};
    return p;
}

static result run_full(const char *spec, const stk__imgpipe_params *prm, const uint8_t *b, size_t n,
                       uint64_t sample, size_t scratch_limit, size_t cap)
{
    result r;
    memset(&r, 0, sizeof r);
    stk__imgpipe *p = NULL;
    r.rc = stk__imgpipe_create(&p, spec, prm, r.err, sizeof r.err);
    if (r.rc)
        return r;
    stk__scratch sc = {NULL, 0, scratch_limit};
    stk__rng rng = stk__rng_for(42, 0, sample);
    r.out = malloc(cap ? cap : 1);
    r.rc = stk__imgpipe_run(p, b, n, &rng, &sc, r.out, cap, &r.len, r.dims, r.err, sizeof r.err);
    stk__scratch_free(&sc);
    stk__imgpipe_destroy(p);
    return r;
}

static result run(const char *spec, const uint8_t *b, size_t n, uint64_t sample)
{
    stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 0);
    return run_full(spec, &prm, b, n, sample, (size_t)64 << 20, (size_t)4 << 20);
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n)
{
    double se = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        se += d * d;
    }
    return se == 0 ? 99.0 : 10.0 * log10(255.0 * 255.0 / (se / (double)n));
}

/* ---- Decoding ---------------------------------------------------------------- */

static void test_jpeg_variants(void)
{
    /* Odd sizes: partial MCUs on both axes. The pattern has sharp chroma
     * edges, so subsampled variants lose more; exactness against PIL is
     * tests/py/test_image_parity.py's job, this checks the colour path. */
    const uint32_t W = 61, H = 45;
    uint8_t *ref = malloc((size_t)W * H * 3);
    for (uint32_t y = 0; y < H; y++)
        for (uint32_t x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                ref[((size_t)y * W + x) * 3 + (size_t)c] = pattern(x, y, c);
    struct {
        const char *name;
        jopts o;
        double min_psnr;
    } cases[] = {
        {"444", {3, JCS_RGB, JCS_YCbCr, 1, 1, 0, 0, 95, 0, NULL}, 28},
        {"422", {3, JCS_RGB, JCS_YCbCr, 2, 1, 0, 0, 95, 0, NULL}, 19},
        {"420", {3, JCS_RGB, JCS_YCbCr, 2, 2, 0, 0, 95, 0, NULL}, 16},
        {"progressive", {3, JCS_RGB, JCS_YCbCr, 2, 2, 1, 0, 95, 0, NULL}, 16},
        {"arithmetic", {3, JCS_RGB, JCS_YCbCr, 2, 2, 0, 1, 95, 0, NULL}, 16},
        {"adobe-rgb", {3, JCS_RGB, JCS_RGB, 1, 1, 0, 0, 95, 0, NULL}, 28},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        buf b = enc_jpeg(W, H, &cases[k].o);
        result r = run("decode", b.p, b.n, 0);
        CHECK_EQ(r.rc, STK_OK);
        CHECK_EQ(r.dims[0], H);
        CHECK_EQ(r.dims[1], W);
        CHECK_EQ(r.dims[2], 3);
        CHECK_EQ(r.len, (size_t)W * H * 3);
        if (!r.rc) {
            double q = psnr(r.out, ref, (size_t)W * H * 3);
            if (q < cases[k].min_psnr)
                fprintf(stderr, "%s: psnr %.1f\n", cases[k].name, q);
            CHECK(q >= cases[k].min_psnr);
        }
        free(r.out);
        free(b.p);
    }

    /* Greyscale: replicated into R, G and B. */
    jopts g = {1, JCS_GRAYSCALE, JCS_GRAYSCALE, 0, 0, 0, 0, 95, 0, NULL};
    buf b = enc_jpeg(W, H, &g);
    result r = run("decode", b.p, b.n, 0);
    CHECK_EQ(r.rc, STK_OK);
    int same = 1;
    for (size_t i = 0; !r.rc && i < (size_t)W * H; i++)
        same &= r.out[3 * i] == r.out[3 * i + 1] && r.out[3 * i] == r.out[3 * i + 2];
    CHECK(same);
    free(r.out);
    free(b.p);

    /* CMYK and YCCK (Adobe, inverted): a flat colour decodes to PIL's
     * conversion R = K - K * (255 - C) / 255 of the stored values. */
    const uint8_t cmyk[4] = {200, 120, 40, 180};
    uint8_t *flat = malloc(16 * 16 * 4);
    for (int i = 0; i < 16 * 16; i++)
        memcpy(flat + 4 * i, cmyk, 4);
    J_COLOR_SPACE spaces[2] = {JCS_CMYK, JCS_YCCK};
    for (int s = 0; s < 2; s++) {
        jopts o = {4, JCS_CMYK, spaces[s], 0, 0, 0, 0, 100, 0, flat};
        b = enc_jpeg(16, 16, &o);
        r = run("decode", b.p, b.n, 0);
        CHECK_EQ(r.rc, STK_OK);
        for (int c = 0; !r.rc && c < 3; c++) {
            int nk = cmyk[3], v = 255 - cmyk[c];
            int want = nk - (v * nk + 127) / 255;
            CHECK(abs(r.out[c] - want) <= 3);
        }
        free(r.out);
        free(b.p);
    }
    free(flat);
    free(ref);
}

/* Raw PNG rows for a colour type / depth, and the RGB PIL gives for them. */
static void png_case(int ct, int depth, int interlace, int with_trns)
{
    const uint32_t W = 23, H = 17;
    const int chans[7] = {1, 0, 3, 1, 2, 0, 4};
    const int nch = chans[ct];
    const size_t bits = (size_t)nch * (size_t)depth;
    const size_t stride = ((size_t)W * bits + 7) / 8;
    uint8_t *raw = calloc(stride * H, 1);
    uint8_t *want = malloc((size_t)W * H * 3);
    uint8_t plte[256 * 3];
    int nplte = depth <= 8 ? 1 << depth : 0;
    for (int k = 0; k < 256; k++) {
        plte[3 * k] = (uint8_t)(k * 7);
        plte[3 * k + 1] = (uint8_t)(255 - k);
        plte[3 * k + 2] = (uint8_t)(k * 13);
    }
    for (uint32_t y = 0; y < H; y++) {
        for (uint32_t x = 0; x < W; x++) {
            uint32_t v[4];
            uint8_t *wp = want + ((size_t)y * W + x) * 3;
            for (int c = 0; c < nch; c++) {
                uint32_t maxv = (1u << depth) - 1;
                v[c] = (x * 2654435761u + y * 40503u + (uint32_t)c * 977u) % (maxv + 1);
            }
            /* Pack sub-byte samples MSB first; spng's encoder takes 16-bit
             * samples in host order. */
            for (int c = 0; c < nch; c++) {
                size_t bit = ((size_t)x * (size_t)nch + (size_t)c) * (size_t)depth;
                uint8_t *row = raw + (size_t)y * stride;
                if (depth == 16) {
                    uint16_t s16 = (uint16_t)v[c];
                    memcpy(row + bit / 8, &s16, 2);
                } else if (depth == 8) {
                    row[bit / 8] = (uint8_t)v[c];
                } else {
                    row[bit / 8] |= (uint8_t)(v[c] << (8 - depth - (int)(bit % 8)));
                }
            }
            uint8_t g;
            switch (ct) {
            case 0: /* grey: scaled to 8 bits (1/2/4-bit by replication, 16 high byte) */
            case 4:
                g = (uint8_t)(depth == 16 ? v[0] >> 8 : v[0] * 255u / ((1u << depth) - 1));
                wp[0] = wp[1] = wp[2] = g;
                break;
            case 2:
            case 6:
                for (int c = 0; c < 3; c++)
                    wp[c] = depth == 16 ? (uint8_t)(v[c] >> 8) : (uint8_t)v[c];
                break;
            case 3: memcpy(wp, plte + 3 * v[0], 3); break;
            default: break;
            }
        }
    }
    struct spng_trns t;
    memset(&t, 0, sizeof t);
    if (ct == 3) {
        t.n_type3_entries = 2;
        t.type3_alpha[0] = 0;
        t.type3_alpha[1] = 128;
    } else {
        t.gray = 1;
        t.red = 1, t.green = 2, t.blue = 3;
    }
    buf b = enc_png(W, H, ct, depth, interlace, raw, stride * H, ct == 3 ? plte : NULL, nplte,
                    with_trns && (ct == 0 || ct == 2 || ct == 3) ? &t : NULL, 0);
    REQUIRE(b.p);
    result r = run("decode", b.p, b.n, 0);
    CHECK_EQ(r.rc, STK_OK);
    if (r.rc)
        fprintf(stderr, "png ct=%d depth=%d: %s\n", ct, depth, r.err);
    CHECK_EQ(r.dims[0], H);
    CHECK_EQ(r.dims[1], W);
    int ok = !r.rc && !memcmp(r.out, want, (size_t)W * H * 3);
    if (!ok)
        fprintf(stderr, "png ct=%d depth=%d interlace=%d trns=%d: pixels differ\n", ct, depth,
                interlace, with_trns);
    CHECK(ok);
    free(r.out);
    free(b.p);
    free(raw);
    free(want);
}

static void test_png_variants(void)
{
    static const struct {
        int ct, depth;
    } kinds[] = {{0, 1}, {0, 2}, {0, 4}, {0, 8}, {0, 16}, {2, 8}, {2, 16}, {3, 1},
                 {3, 2}, {3, 4}, {3, 8}, {4, 8}, {4, 16}, {6, 8}, {6, 16}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int il = 0; il < 2; il++)
            png_case(kinds[k].ct, kinds[k].depth, il, 0);
    png_case(0, 8, 0, 1);
    png_case(2, 8, 0, 1);
    png_case(3, 8, 1, 1);
}

/* A crop-aware decode must give exactly the pixels of a full decode. */
static void check_crops_exact(const buf *b, uint32_t W, uint32_t H, const char *what)
{
    result full = run("decode", b->p, b->n, 0);
    REQUIRE(full.rc == STK_OK);
    static const uint32_t sizes[][2] = {{1, 1}, {7, 9}, {16, 16}, {33, 21}, {40, 50}};
    int bad = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t th = sizes[s][0], tw = sizes[s][1];
        if (th > H || tw > W)
            continue;
        char spec[64];
        snprintf(spec, sizeof spec, "RandomCrop((%u,%u))", th, tw);
        for (uint64_t sample = 0; sample < 12; sample++) {
            result r = run(spec, b->p, b->n, sample);
            CHECK_EQ(r.rc, STK_OK);
            /* Replay the crop's draws (top, then left) from the same key. */
            stk__rng rng = stk__rng_for(42, 0, sample);
            uint32_t i = 0, j = 0;
            if (!(th == H && tw == W)) {
                i = (uint32_t)stk__rng_below(&rng, H - th + 1);
                j = (uint32_t)stk__rng_below(&rng, W - tw + 1);
            }
            for (uint32_t y = 0; !r.rc && y < th; y++)
                bad |= memcmp(r.out + (size_t)y * tw * 3, full.out + ((size_t)(i + y) * W + j) * 3,
                              (size_t)tw * 3) != 0;
            free(r.out);
        }
    }
    if (bad)
        fprintf(stderr, "%s: cropped decode differs from full decode\n", what);
    CHECK(!bad);
    free(full.out);
}

static void test_crop_aware_exact(void)
{
    const uint32_t W = 77, H = 59;
    buf b = jpeg_rgb(W, H, 2, 2);
    check_crops_exact(&b, W, H, "jpeg 4:2:0");
    free(b.p);
    b = jpeg_rgb(W, H, 1, 1);
    check_crops_exact(&b, W, H, "jpeg 4:4:4");
    free(b.p);
    b = jpeg_rgb(W, H, 2, 1);
    check_crops_exact(&b, W, H, "jpeg 4:2:2");
    free(b.p);
    jopts p = {3, JCS_RGB, JCS_YCbCr, 2, 2, 1, 0, 90, 0, NULL};
    b = enc_jpeg(W, H, &p);
    check_crops_exact(&b, W, H, "jpeg progressive");
    free(b.p);
    jopts g = {1, JCS_GRAYSCALE, JCS_GRAYSCALE, 0, 0, 0, 0, 90, 0, NULL};
    b = enc_jpeg(W, H, &g);
    check_crops_exact(&b, W, H, "jpeg grey");
    free(b.p);
    jopts k = {4, JCS_CMYK, JCS_YCCK, 0, 0, 0, 0, 90, 0, NULL};
    b = enc_jpeg(W, H, &k);
    check_crops_exact(&b, W, H, "jpeg ycck");
    free(b.p);
    uint8_t *raw = malloc((size_t)W * H * 3);
    for (size_t i = 0; i < (size_t)W * H * 3; i++)
        raw[i] = (uint8_t)(i * 31 % 251);
    b = enc_png(W, H, 2, 8, 0, raw, (size_t)W * H * 3, NULL, 0, NULL, 0);
    check_crops_exact(&b, W, H, "png");
    free(b.p);
    b = enc_png(W, H, 2, 8, 1, raw, (size_t)W * H * 3, NULL, 0, NULL, 0);
    check_crops_exact(&b, W, H, "png interlaced");
    free(b.p);
    free(raw);
}

/* Resizing through a DCT-scaled decode stays close to the exact path
 * (full decode + PIL-exact resampling, done here with the ops directly). */
static void test_dct_scaled_resize(void)
{
    const uint32_t W = 640, H = 480;
    buf b = jpeg_rgb(W, H, 2, 2);
    result full = run("decode", b.p, b.n, 0);
    REQUIRE(full.rc == STK_OK);
    const uint32_t OW = 100, OH = 75; /* 6.4x: decodes at 2/8 */
    stk__axis ax, ay;
    void *mx = malloc(stk__axis_bytes(OW, stk__axis_ksize(0, W, OW)));
    void *my = malloc(stk__axis_bytes(OH, stk__axis_ksize(0, H, OH)));
    stk__axis_init(&ax, mx, W, 0, W, OW, 0, OW);
    stk__axis_init(&ay, my, H, 0, H, OH, 0, OH);
    stk__view in = {full.out, (size_t)W * 3, W, H};
    uint8_t *tmp = malloc((size_t)OW * H * 3), *ref = malloc((size_t)OW * OH * 3);
    stk__view hv = {tmp, (size_t)OW * 3, OW, H}, ov = {ref, (size_t)OW * 3, OW, OH};
    stk__resample_h(&in, 0, &ax, &hv);
    stk__resample_v(&hv, &ay, &ov);
    result r = run("Resize((75,100))", b.p, b.n, 0);
    CHECK_EQ(r.rc, STK_OK);
    CHECK_EQ(r.dims[0], 75);
    CHECK_EQ(r.dims[1], 100);
    if (!r.rc) {
        double q = psnr(r.out, ref, (size_t)OW * OH * 3);
        if (q < 30)
            fprintf(stderr, "dct-scaled resize psnr %.1f\n", q);
        CHECK(q >= 30);
    }
    /* The same resize of a PNG (never DCT scaled) is the exact path. */
    buf pb = enc_png(W, H, 2, 8, 0, full.out, (size_t)W * H * 3, NULL, 0, NULL, 0);
    result rp = run("Resize((75,100))", pb.p, pb.n, 0);
    CHECK_EQ(rp.rc, STK_OK);
    CHECK(!rp.rc && !memcmp(rp.out, ref, (size_t)OW * OH * 3));
    free(rp.out);
    free(pb.p);
    free(r.out);
    free(tmp);
    free(ref);
    free(mx);
    free(my);
    free(full.out);
    free(b.p);
}

/* ---- Bad input ----------------------------------------------------------------- */

static void expect_fail(const char *what, const uint8_t *p, size_t n, int code, const char *spec,
                        uint32_t max_dim)
{
    stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 0);
    prm.max_dim = max_dim;
    result r = run_full(spec, &prm, p, n, 0, (size_t)64 << 20, (size_t)4 << 20);
    if (r.rc != code)
        fprintf(stderr, "%s: rc %d (%s), expected %d\n", what, r.rc, r.err, code);
    CHECK_EQ(r.rc, code);
    CHECK(strlen(r.err) > 5);
    free(r.out);
}

static void test_bad_inputs(void)
{
    buf j = jpeg_rgb(64, 48, 2, 2);
    uint8_t raw[32 * 32 * 3];
    memset(raw, 90, sizeof raw);
    buf p = enc_png(32, 32, 2, 8, 0, raw, sizeof raw, NULL, 0, NULL, 0);

    expect_fail("zero bytes", j.p, 0, STK_EFORMAT, "decode", 0);
    expect_fail("text", (const uint8_t *)"hello, world", 12, STK_EFORMAT, "decode", 0);
    expect_fail("gif", (const uint8_t *)"GIF89a\x01\x00\x01\x00\x00\x00\x00", 13, STK_EUNSUPPORTED,
                "decode", 0);
    expect_fail("bmp", (const uint8_t *)"BM\x3e\x00\x00\x00", 6, STK_EUNSUPPORTED, "decode", 0);
    expect_fail("soi only", j.p, 2, STK_EFORMAT, "decode", 0);
    expect_fail("jpeg header only", j.p, 200, STK_EFORMAT, "decode", 0);
    expect_fail("jpeg truncated", j.p, j.n / 2, STK_EFORMAT, "decode", 0);
    expect_fail("jpeg truncated (crop)", j.p, j.n * 3 / 4, STK_EFORMAT, "CenterCrop(60)", 0);
    expect_fail("jpeg no EOI", j.p, j.n - 2, STK_EFORMAT, "decode", 0);

    /* Corrupt entropy data: garbage in the middle of the scan. */
    uint8_t *c = malloc(j.n);
    memcpy(c, j.p, j.n);
    for (size_t i = j.n / 2; i < j.n / 2 + 40; i++)
        c[i] = (uint8_t)(i * 37);
    expect_fail("jpeg corrupt", c, j.n, STK_EFORMAT, "decode", 0);

    /* 12-bit (SOF1 with precision 12), and lossless (SOF3). */
    memcpy(c, j.p, j.n);
    for (size_t i = 2; i + 4 < j.n; i++) {
        if (c[i] == 0xFF && c[i + 1] == 0xC0) {
            c[i + 1] = 0xC1;
            c[i + 4] = 12;
            break;
        }
    }
    expect_fail("jpeg 12-bit", c, j.n, STK_EUNSUPPORTED, "decode", 0);
    memcpy(c, j.p, j.n);
    for (size_t i = 2; i + 4 < j.n; i++) {
        if (c[i] == 0xFF && c[i + 1] == 0xC0) {
            c[i + 1] = 0xC3;
            break;
        }
    }
    expect_fail("jpeg lossless", c, j.n, STK_EUNSUPPORTED, "decode", 0);

    /* Oversized: a header claiming 30000 x 20000, and max_dim. */
    memcpy(c, j.p, j.n);
    for (size_t i = 2; i + 9 < j.n; i++) {
        if (c[i] == 0xFF && c[i + 1] == 0xC0) {
            c[i + 5] = 20000 >> 8, c[i + 6] = 20000 & 255; /* height */
            c[i + 7] = 30000 >> 8, c[i + 8] = 30000 & 255; /* width */
            break;
        }
    }
    expect_fail("jpeg 30000x20000", c, j.n, STK_ETOOBIG, "decode", 0);
    expect_fail("jpeg over max_dim", j.p, j.n, STK_ETOOBIG, "imagenet-train", 50);
    expect_fail("png over max_dim", p.p, p.n, STK_ETOOBIG, "decode", 16);
    free(c);

    /* PNG: truncated, bad CRC, header only, bad IHDR. */
    expect_fail("png truncated", p.p, p.n - 30, STK_EFORMAT, "decode", 0);
    expect_fail("png signature only", p.p, 8, STK_EFORMAT, "decode", 0);
    c = malloc(p.n);
    memcpy(c, p.p, p.n);
    c[p.n - 20] ^= 0x55; /* inside IDAT */
    expect_fail("png corrupt", c, p.n, STK_EFORMAT, "decode", 0);
    memcpy(c, p.p, p.n);
    c[16] = 0, c[17] = 0, c[18] = 0, c[19] = 0; /* width 0 (CRC now wrong too) */
    expect_fail("png zero width", c, p.n, STK_EFORMAT, "decode", 0);
    free(c);

    /* An image smaller than RandomCrop without padding is the sample's fault. */
    expect_fail("too small for RandomCrop", p.p, p.n, STK_EFORMAT, "RandomCrop(40)", 0);

    /* Budgets: the slot and the scratch. */
    stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 0);
    result r = run_full("decode", &prm, j.p, j.n, 0, (size_t)64 << 20, 100);
    CHECK_EQ(r.rc, STK_ETOOBIG);
    CHECK(strstr(r.err, "slot") != NULL);
    free(r.out);
    r = run_full("decode", &prm, p.p, p.n, 0, 64, (size_t)1 << 20);
    CHECK_EQ(r.rc, STK_ETOOBIG);
    CHECK(strstr(r.err, "scratch") != NULL);
    free(r.out);
    free(j.p);
    free(p.p);
}

/* Random damage to valid files: any result but a crash, a leak, or an error
 * without a reason. Runs under ASan/UBSan. */
static void test_mutations(void)
{
    buf files[4];
    files[0] = jpeg_rgb(50, 40, 2, 2);
    jopts pj = {3, JCS_RGB, JCS_YCbCr, 2, 2, 1, 0, 85, 0, NULL};
    files[1] = enc_jpeg(50, 40, &pj);
    uint8_t raw[50 * 40 * 4];
    for (size_t i = 0; i < sizeof raw; i++)
        raw[i] = (uint8_t)(i * 7);
    files[2] = enc_png(50, 40, 6, 8, 0, raw, sizeof raw, NULL, 0, NULL, 0);
    files[3] = enc_png(50, 40, 6, 8, 1, raw, sizeof raw, NULL, 0, NULL, 0);
    const char *specs[3] = {"decode", "RandomResizedCrop(24)", "imagenet-val"};
    stk__rng g = stk__rng_for(7, 7, 7);
    int bad = 0;
    for (int f = 0; f < 4; f++) {
        uint8_t *m = malloc(files[f].n);
        for (int it = 0; it < 150; it++) {
            size_t n = files[f].n;
            memcpy(m, files[f].p, n);
            if (it % 3 == 0) {
                n = (size_t)stk__rng_below(&g, n);
            } else {
                int flips = 1 + (int)stk__rng_below(&g, 8);
                for (int k = 0; k < flips; k++)
                    m[stk__rng_below(&g, n)] = (uint8_t)stk__rng_u64(&g);
            }
            result r = run(specs[it % 3], m, n, (uint64_t)it);
            if (r.rc != STK_OK && r.rc != STK_EFORMAT && r.rc != STK_EUNSUPPORTED &&
                r.rc != STK_ETOOBIG)
                bad++;
            if (r.rc != STK_OK && !r.err[0])
                bad++;
            free(r.out);
        }
        free(m);
        free(files[f].p);
    }
    CHECK_EQ(bad, 0);
}

/* Every allocation failing in turn: an error (never a crash), no leak. */
static void test_alloc_failures(void)
{
    buf j = jpeg_rgb(40, 30, 2, 2);
    uint8_t raw[40 * 30 * 3];
    memset(raw, 50, sizeof raw);
    buf p = enc_png(40, 30, 2, 8, 0, raw, sizeof raw, NULL, 0, NULL, 0);
    buf *bs[2] = {&j, &p};
    for (int f = 0; f < 2; f++) {
        int ok_seen = 0;
        for (long k = 0; k < 60 && !ok_seen; k++) {
            long live = stk__alloc_live();
            stk__alloc_fail_after(k);
            result r = run("imagenet-train", bs[f]->p, bs[f]->n, 0);
            stk__alloc_fail_after(-1);
            if (r.rc == STK_OK)
                ok_seen = 1;
            else
                CHECK(r.rc == STK_ENOMEM || r.rc == STK_EFORMAT);
            CHECK_EQ(stk__alloc_live(), live);
            free(r.out);
        }
        CHECK(ok_seen);
    }
    free(j.p);
    free(p.p);
}

/* ---- Spec parsing --------------------------------------------------------------- */

static void test_spec_good(void)
{
    static const struct {
        const char *spec;
        int dense;
        int64_t h, w;
    } cases[] = {
        {"imagenet-train", 1, 224, 224},
        {"imagenet-val", 1, 224, 224},
        {"cifar-train", 1, 32, 32},
        {"decode", 0, 0, 0},
        {"RandomResizedCrop(224,scale=(0.08,1.0))|RandomHorizontalFlip(p=0.5)|"
         "Normalize(mean=(0.485,0.456,0.406),std=(0.229,0.224,0.225))",
         1, 224, 224},
        {" RandomResizedCrop( size = (128, 96), ratio=(3/4, 4/3), "
         "interpolation=InterpolationMode.BILINEAR, antialias=True ) ",
         1, 128, 96},
        {"Resize(256)|CenterCrop(224)", 1, 224, 224},
        {"Resize(256)", 0, 0, 0},
        {"Resize((100,200))", 1, 100, 200},
        {"Resize([64])|CenterCrop([48])", 1, 48, 48},
        {"Resize(64, max_size=100)", 0, 0, 0},
        {"RandomCrop(32, padding=4, pad_if_needed=True, fill=(1,2,3), padding_mode='constant')", 1,
         32, 32},
        {"CenterCrop(10)|Pad(2)", 1, 14, 14},
        {"CenterCrop(10)|Pad((1,2))|Pad((1,2,3,4),fill=255)", 1, 20, 16},
        {"RandomVerticalFlip()|RandomHorizontalFlip(1)|CenterCrop((5,7))", 1, 5, 7},
        {"CenterCrop(8)|ToTensor()|Normalize((0.5,),(0.25,))", 1, 8, 8},
        {"imagenet-train|Normalize(mean=0.5, std=0.5)", 1, 224, 224},
        {"CenterCrop(8)|Normalize(mean=[1e-1,2.5E-1,0],std=[1,1,1])|RandomHorizontalFlip()", 1, 8,
         8},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        stk__imgpipe *p = NULL;
        char err[STK_ERRMSG_MAX] = "";
        stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 0);
        int rc = stk__imgpipe_create(&p, cases[k].spec, &prm, err, sizeof err);
        if (rc)
            fprintf(stderr, "spec '%s': %s\n", cases[k].spec, err);
        CHECK_EQ(rc, STK_OK);
        if (rc)
            continue;
        unsigned ndim = 0;
        int64_t shape[4];
        int dtype = -1;
        size_t sb = 0;
        int dense = stk__imgpipe_dense(p, &ndim, shape, &dtype, &sb);
        CHECK_EQ(dense, cases[k].dense);
        if (dense) {
            CHECK_EQ(ndim, 3);
            CHECK_EQ(shape[0], cases[k].h);
            CHECK_EQ(shape[1], cases[k].w);
            CHECK_EQ(shape[2], 3);
            int norm = strstr(cases[k].spec, "Normalize") || strstr(cases[k].spec, "ToTensor");
            CHECK_EQ(dtype, norm ? STK_DTYPE_FLOAT32 : STK_DTYPE_UINT8);
            CHECK_EQ(sb, (size_t)(cases[k].h * cases[k].w * 3) * (norm ? 4u : 1u));
        }
        stk__imgpipe_destroy(p);
    }

    /* params.size scales the presets; layout and dtype shape the output. */
    stk__imgpipe_params prm = params(STK_DTYPE_BFLOAT16, 1);
    prm.size = 160;
    stk__imgpipe *p = NULL;
    char err[STK_ERRMSG_MAX];
    CHECK_EQ(stk__imgpipe_create(&p, "imagenet-val", &prm, err, sizeof err), STK_OK);
    unsigned ndim;
    int64_t shape[4];
    int dtype;
    size_t sb;
    CHECK_EQ(stk__imgpipe_dense(p, &ndim, shape, &dtype, &sb), 1);
    CHECK_EQ(shape[0], 3);
    CHECK_EQ(shape[1], 160);
    CHECK_EQ(shape[2], 160);
    CHECK_EQ(dtype, STK_DTYPE_BFLOAT16);
    CHECK_EQ(sb, 160 * 160 * 3 * 2);
    stk__imgpipe_destroy(p);
}

static void test_spec_bad(void)
{
    static const struct {
        const char *spec;
        const char *needle; /* must appear in the message */
    } cases[] = {
        {"", "expected a transform name"},
        {"Foo(3)", "unknown transform 'Foo'"},
        {"imagenet-tran", "supported:"},
        {"RandomResizedCrop()", "'size' is required"},
        {"RandomResizedCrop(224, scale=(1.0, 0.5))", "min <= max"},
        {"RandomResizedCrop(224, scale=(0.1, 2.0))", "(0, 1]"},
        {"RandomResizedCrop(224, bogus=1)", "has no argument 'bogus'"},
        {"RandomResizedCrop(224, interpolation=bicubic)", "only bilinear"},
        {"RandomResizedCrop(0)", "1..65535"},
        {"RandomResizedCrop(22.5)", "integers"},
        {"RandomResizedCrop(224, 1, 2, 3, 4, 5)", "at most"},
        {"RandomResizedCrop(size=224, 5)", "positional argument after"},
        {"RandomResizedCrop(224, size=3)", "given twice"},
        {"CenterCrop((1,2,3))", "(height, width)"},
        {"Pad(-1)", "0..65535"},
        {"Pad((1,2,3))", "tuple of 2 or 4"},
        {"Pad(2, padding_mode='reflect')", "only 'constant'"},
        {"RandomCrop(32, fill=300)", "0..255"},
        {"RandomHorizontalFlip(p=1.5)", "[0, 1]"},
        {"Normalize(mean=(0.5,0.5,0.5))", "'std' is required"},
        {"Normalize(mean=(0.5,0.5), std=1)", "tuple of 3"},
        {"Normalize(mean=0, std=(1,0,1))", "must not contain 0"},
        {"CenterCrop(8)|Normalize(0,1)|Normalize(0,1)", "twice"},
        {"Normalize(0,1)|CenterCrop(8)", "must come after"},
        {"Resize(256)|Normalize(0.5,0.5)", "varies per image"},
        {"Resize((1,2), max_size=10)", "only allowed when size is an int"},
        {"Resize(100, max_size=50)", "greater than size"},
        {"decode|CenterCrop(3)", "'decode' must be the whole spec"},
        {"CenterCrop(3) CenterCrop(4)", "expected '|'"},
        {"CenterCrop(3", "expected ',' or ')'"},
        {"CenterCrop((3,4)", "expected ',' or ')'"},
        {"RandomCrop(3, padding_mode='constant", "unterminated string"},
        {"CenterCrop(3)|", "expected a transform name"},
        {"CenterCrop(3/0)", "expected a value"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        stk__imgpipe *p = NULL;
        char err[STK_ERRMSG_MAX] = "";
        stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 0);
        int rc = stk__imgpipe_create(&p, cases[k].spec, &prm, err, sizeof err);
        CHECK_EQ(rc, STK_EINVAL);
        CHECK(p == NULL);
        if (!strstr(err, cases[k].needle)) {
            fprintf(stderr, "spec '%s': message '%s' lacks '%s'\n", cases[k].spec, err,
                    cases[k].needle);
            CHECK(0);
        }
        stk__imgpipe_destroy(p);
    }
    /* Non-uint8 dtype without a fixed size is refused too. */
    stk__imgpipe *p = NULL;
    char err[STK_ERRMSG_MAX];
    stk__imgpipe_params prm = params(STK_DTYPE_FLOAT16, 0);
    CHECK_EQ(stk__imgpipe_create(&p, "decode", &prm, err, sizeof err), STK_EINVAL);
    prm.dtype = 9;
    CHECK_EQ(stk__imgpipe_create(&p, "imagenet-train", &prm, err, sizeof err), STK_EINVAL);
}

/* ---- Transforms ---------------------------------------------------------------- */

static void check_dims(const char *spec, const buf *b, int32_t h, int32_t w)
{
    result r = run(spec, b->p, b->n, 3);
    if (r.rc || r.dims[0] != h || r.dims[1] != w)
        fprintf(stderr, "%s: rc %d (%s) dims %dx%d, expected %dx%d\n", spec, r.rc, r.err, r.dims[0],
                r.dims[1], h, w);
    CHECK_EQ(r.rc, STK_OK);
    CHECK_EQ(r.dims[0], h);
    CHECK_EQ(r.dims[1], w);
    CHECK_EQ(r.dims[2], 3);
    CHECK_EQ(r.len, (size_t)h * (size_t)w * 3);
    free(r.out);
}

static void test_shapes(void)
{
    buf b = jpeg_rgb(120, 90, 2, 2);
    check_dims("imagenet-train", &b, 224, 224);
    check_dims("imagenet-val", &b, 224, 224);
    check_dims("Resize(45)", &b, 45, 60);              /* shorter side 45, 120*45/90 = 60 */
    check_dims("Resize(50)", &b, 50, 66);              /* int(50*120/90) = 66 */
    check_dims("Resize(60, max_size=70)", &b, 52, 70); /* int(70*60/80) = 52 */
    check_dims("Resize((30,40))", &b, 30, 40);
    check_dims("CenterCrop(100)", &b, 100, 100); /* padded height */
    check_dims("CenterCrop((200,300))", &b, 200, 300);
    check_dims("CenterCrop((10,20))|Pad((1,2,3,4))", &b, 16, 24);
    check_dims("RandomCrop(32, padding=4)", &b, 32, 32);
    check_dims("RandomCrop((100,130), pad_if_needed=True)", &b, 100, 130);
    check_dims("RandomResizedCrop((20,30))|RandomVerticalFlip(1)", &b, 20, 30);
    check_dims("Pad(3)", &b, 96, 126);
    check_dims("RandomHorizontalFlip(1)|RandomResizedCrop(64)|Resize(32)", &b, 32, 32);
    free(b.p);

    /* A 32x32 CIFAR-like PNG through cifar-train. */
    uint8_t raw[32 * 32 * 3];
    for (size_t i = 0; i < sizeof raw; i++)
        raw[i] = (uint8_t)i;
    buf p = enc_png(32, 32, 2, 8, 0, raw, sizeof raw, NULL, 0, NULL, 0);
    check_dims("cifar-train", &p, 32, 32);
    free(p.p);
}

/* Geometry against hand-computed expectations on a PNG (exact pixels). */
static void test_geometry_values(void)
{
    enum { W = 9, H = 7 };
    uint8_t raw[H * W * 3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                raw[(y * W + x) * 3 + c] = (uint8_t)(y * 30 + x * 3 + c);
    buf b = enc_png(W, H, 2, 8, 0, raw, sizeof raw, NULL, 0, NULL, 0);
#define PX(img, w, x, y, c) ((img)[((size_t)(y) * (size_t)(w) + (size_t)(x)) * 3 + (size_t)(c)])

    /* CenterCrop (7-3)/2 = 2 rows down, round(2.5) = 2 (half to even) across. */
    result r = run("CenterCrop((3,4))", b.p, b.n, 0);
    CHECK_EQ(r.rc, STK_OK);
    CHECK_EQ(PX(r.out, 4, 0, 0, 0), PX(raw, W, 2, 2, 0));
    CHECK_EQ(PX(r.out, 4, 3, 2, 2), PX(raw, W, 5, 4, 2));
    free(r.out);

    /* CenterCrop larger than the image pads: left (11-9)//2 = 1, top
     * (10-7)//2 = 1, bottom 2. */
    r = run("CenterCrop((10,11))", b.p, b.n, 0);
    CHECK_EQ(r.rc, STK_OK);
    CHECK_EQ(PX(r.out, 11, 0, 0, 0), 0);
    CHECK_EQ(PX(r.out, 11, 1, 1, 0), PX(raw, W, 0, 0, 0));
    CHECK_EQ(PX(r.out, 11, 9, 7, 1), PX(raw, W, 8, 6, 1));
    CHECK_EQ(PX(r.out, 11, 10, 8, 0), 0);
    free(r.out);

    /* Pad with a fill colour, then flips applied by the writer. */
    r = run("Pad((1,2,3,4), fill=(7,8,9))|RandomHorizontalFlip(1)|RandomVerticalFlip(1)", b.p, b.n,
            0);
    CHECK_EQ(r.rc, STK_OK);
    CHECK_EQ(r.dims[0], H + 6);
    CHECK_EQ(r.dims[1], W + 4);
    /* The original (0,0) sat at (1,2); after both flips at (W+4-2, H+6-3). */
    CHECK_EQ(PX(r.out, W + 4, W + 2, H + 3, 0), PX(raw, W, 0, 0, 0));
    CHECK_EQ(PX(r.out, W + 4, 0, 0, 2), 9);
    free(r.out);

    /* A crop after a flip reads the mirrored window. */
    r = run("RandomHorizontalFlip(1)|CenterCrop((7,3))", b.p, b.n, 0);
    CHECK_EQ(r.rc, STK_OK);
    /* Flipped column x is original W-1-x; crop starts at column 3. */
    for (int x = 0; x < 3 && !r.rc; x++)
        CHECK_EQ(PX(r.out, 3, x, 0, 0), PX(raw, W, W - 1 - (3 + x), 0, 0));
    free(r.out);

    /* Flip probability 0 is the identity. */
    r = run("RandomHorizontalFlip(0)|RandomVerticalFlip(p=0)", b.p, b.n, 0);
    CHECK(!r.rc && !memcmp(r.out, raw, sizeof raw));
    free(r.out);
    free(b.p);
#undef PX
}

static void test_dtypes_and_layout(void)
{
    enum { W = 6, H = 4 };
    uint8_t raw[H * W * 3];
    for (size_t i = 0; i < sizeof raw; i++)
        raw[i] = (uint8_t)(i * 11);
    buf b = enc_png(W, H, 2, 8, 0, raw, sizeof raw, NULL, 0, NULL, 0);
    const char *spec =
        "CenterCrop((4,6))|Normalize(mean=(0.485,0.456,0.406),std=(0.229,0.224,0.225))";
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};

    stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 1); /* uint8 + Normalize -> float32 */
    result r = run_full(spec, &prm, b.p, b.n, 0, (size_t)1 << 20, (size_t)1 << 20);
    CHECK_EQ(r.rc, STK_OK);
    CHECK_EQ(r.len, (size_t)W * H * 3 * 4);
    int exact = 1;
    for (int c = 0; c < 3 && !r.rc; c++)
        for (int i = 0; i < W * H; i++) {
            float want = ((float)raw[i * 3 + c] / 255.0f - mean[c]) / std[c];
            float got;
            memcpy(&got, r.out + ((size_t)c * W * H + (size_t)i) * 4, 4);
            exact &= got == want;
        }
    CHECK(exact);
    free(r.out);

    /* float16 and bfloat16 of the same values, HWC. */
    int dts[2] = {STK_DTYPE_FLOAT16, STK_DTYPE_BFLOAT16};
    for (int d = 0; d < 2; d++) {
        prm = params(dts[d], 0);
        r = run_full(spec, &prm, b.p, b.n, 0, (size_t)1 << 20, (size_t)1 << 20);
        CHECK_EQ(r.rc, STK_OK);
        CHECK_EQ(r.len, (size_t)W * H * 3 * 2);
        int ok = 1;
        for (int i = 0; i < W * H * 3 && !r.rc; i++) {
            float f = ((float)raw[i] / 255.0f - mean[i % 3]) / std[i % 3];
            uint16_t want = d == 0 ? stk__f32_to_f16(f) : stk__f32_to_bf16(f), got;
            memcpy(&got, r.out + (size_t)i * 2, 2);
            ok &= got == want;
        }
        CHECK(ok);
        free(r.out);
    }

    /* Plain float32 without Normalize keeps 0..255; uint8 NCHW is planar. */
    prm = params(STK_DTYPE_FLOAT32, 0);
    r = run_full("CenterCrop((4,6))", &prm, b.p, b.n, 0, (size_t)1 << 20, (size_t)1 << 20);
    float f0;
    memcpy(&f0, r.out + 4 * 5, 4);
    CHECK(!r.rc && f0 == (float)raw[5]);
    free(r.out);
    prm = params(STK_DTYPE_UINT8, 1);
    r = run_full("CenterCrop((4,6))", &prm, b.p, b.n, 0, (size_t)1 << 20, (size_t)1 << 20);
    CHECK(!r.rc && r.out[W * H + 1] == raw[1 * 3 + 1] && r.out[2 * W * H] == raw[2]);
    free(r.out);
    free(b.p);

    /* Half-precision rounding: ties to even, subnormals, overflow, NaN. */
    CHECK_EQ(stk__f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ(stk__f32_to_f16(-2.0f), 0xc000);
    CHECK_EQ(stk__f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ(stk__f32_to_f16(65520.0f), 0x7c00);           /* rounds up to inf */
    CHECK_EQ(stk__f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie -> even */
    CHECK_EQ(stk__f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie -> even (up) */
    CHECK_EQ(stk__f32_to_f16(5.9604645e-08f), 0x0001);     /* smallest subnormal */
    CHECK_EQ(stk__f32_to_f16(2.9802322e-08f), 0x0000);     /* half of it: tie -> 0 */
    CHECK_EQ(stk__f32_to_f16(1e-10f), 0x0000);
    CHECK((stk__f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (stk__f32_to_f16(NAN) & 0x3ff));
    CHECK_EQ(stk__f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ(stk__f32_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: tie -> even */
    CHECK_EQ(stk__f32_to_bf16(1.01171875f), 0x3f82); /* 1 + 3*2^-8: tie -> even (up) */
    CHECK((stk__f32_to_bf16(NAN) & 0x7f80) == 0x7f80 && (stk__f32_to_bf16(NAN) & 0x7f));
}

static void test_determinism(void)
{
    buf b = jpeg_rgb(150, 110, 2, 2);
    const char *spec = "RandomResizedCrop(48)|RandomHorizontalFlip()|RandomVerticalFlip()";
    int differs = 0;
    for (uint64_t s = 0; s < 8; s++) {
        result a = run(spec, b.p, b.n, s), c = run(spec, b.p, b.n, s),
               d = run(spec, b.p, b.n, s + 100);
        CHECK(!a.rc && !c.rc && !d.rc);
        CHECK(!memcmp(a.out, c.out, a.len));
        differs += memcmp(a.out, d.out, a.len) != 0;
        free(a.out);
        free(c.out);
        free(d.out);
    }
    CHECK(differs >= 7);
    free(b.p);
}

static void test_exif(void)
{
    /* 64x32: left half red, right half blue. Orientation 6 = rotate 90
     * clockwise for display: 32 wide, 64 tall, red on top. */
    enum { W = 64, H = 32 };
    uint8_t *px = malloc(W * H * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *p = px + (y * W + x) * 3;
            p[0] = x < W / 2 ? 250 : 0;
            p[1] = 0;
            p[2] = x < W / 2 ? 0 : 250;
        }
    jopts o = {3, JCS_RGB, JCS_YCbCr, 1, 1, 0, 0, 95, 6, px};
    buf b = enc_jpeg(W, H, &o);
    result r = run("decode", b.p, b.n, 0); /* exif off: stored orientation */
    CHECK(!r.rc && r.dims[0] == H && r.dims[1] == W);
    free(r.out);
    stk__imgpipe_params prm = params(STK_DTYPE_UINT8, 0);
    prm.exif = 1;
    r = run_full("decode", &prm, b.p, b.n, 0, (size_t)1 << 20, (size_t)1 << 20);
    CHECK(!r.rc && r.dims[0] == W && r.dims[1] == H);
    CHECK(!r.rc && r.out[0] > 200 && r.out[2] < 50);          /* top: red */
    CHECK(!r.rc && r.out[(size_t)(W - 1) * H * 3 + 2] > 200); /* bottom: blue */
    free(r.out);
    r = run_full("Resize((16,8))", &prm, b.p, b.n, 0, (size_t)1 << 20, (size_t)1 << 20);
    CHECK(!r.rc && r.dims[0] == 16 && r.dims[1] == 8 && r.out[0] > 200);
    free(r.out);
    free(b.p);

    /* Orientation 3 (180 degrees) in a PNG eXIf chunk. */
    buf p = enc_png(W, H, 2, 8, 0, px, W * H * 3, NULL, 0, NULL, 3);
    r = run_full("decode", &prm, p.p, p.n, 0, (size_t)1 << 20, (size_t)1 << 20);
    CHECK(!r.rc && r.dims[0] == H && r.dims[1] == W);
    CHECK(!r.rc && r.out[2] == 250 && r.out[0] == 0); /* top-left now blue */
    free(r.out);
    free(p.p);
    free(px);
}

/* ---- RandomResizedCrop sampling ------------------------------------------------- */

static void test_rrc_properties(void)
{
    const double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
    int fallbacks = 0, outside = 0;
    for (uint64_t s = 0; s < 20000; s++) {
        stk__rng g = stk__rng_for(1, 2, s);
        uint32_t o[4];
        int fb;
        stk__rrc_params(&g, 400, 350, scale, ratio, o, &fb);
        fallbacks += fb;
        double area = (double)o[2] * o[3] / (400.0 * 350.0);
        double lr = log((double)o[3] / o[2]);
        /* Rounding w and h to integers moves area and ratio a little. */
        if (o[0] + o[2] > 350 || o[1] + o[3] > 400 || area < 0.075 || area > 1.0 ||
            (!fb && (lr < log(3.0 / 4.0) - 0.02 || lr > log(4.0 / 3.0) + 0.02)))
            outside++;
    }
    CHECK_EQ(outside, 0);
    CHECK(fallbacks < 5); /* P(10 misses) is ~1e-6 on this shape */

    /* A very wide image cannot fit any sampled crop: always the fallback,
     * the full height with the ratio clamped to 4/3, centred. */
    stk__rng g = stk__rng_for(1, 2, 3);
    uint32_t o[4];
    int fb;
    stk__rrc_params(&g, 1000, 20, scale, ratio, o, &fb);
    CHECK_EQ(fb, 1);
    CHECK_EQ(o[2], 20);
    CHECK_EQ(o[3], 27);
    CHECK_EQ(o[0], 0);
    CHECK_EQ(o[1], (1000 - 27) / 2);
}

/* Two-sample Kolmogorov-Smirnov bound against torchvision's draws, checked at
 * the reference quantiles (exact for distributions with ties). */
static int ks_ok(const double *vals, size_t n, const double *q, const char *what)
{
    const double crit = 1.95 * sqrt((double)(n + RRC_REF_DRAWS) / ((double)n * RRC_REF_DRAWS)) +
                        1.0 / (RRC_REF_QUANTILES - 1);
    double worst = 0;
    for (int k = 0; k < RRC_REF_QUANTILES; k++) {
        double p = (double)k / (RRC_REF_QUANTILES - 1);
        size_t le = 0, lt = 0;
        for (size_t i = 0; i < n; i++) {
            le += vals[i] <= q[k] + 1e-7;
            lt += vals[i] < q[k] - 1e-7;
        }
        double d1 = p - (double)le / (double)n, d2 = (double)lt / (double)n - p;
        if (d1 > worst)
            worst = d1;
        if (d2 > worst)
            worst = d2;
    }
    if (worst > crit)
        fprintf(stderr, "%s: KS distance %.4f > %.4f\n", what, worst, crit);
    return worst <= crit;
}

static void test_rrc_distribution(void)
{
    const double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
    const size_t n = 20000;
    double *area = malloc(n * sizeof *area), *lr = malloc(n * sizeof *lr);
    for (size_t r = 0; r < sizeof rrc_ref / sizeof rrc_ref[0]; r++) {
        const struct rrc_ref *ref = &rrc_ref[r];
        size_t fbs = 0;
        for (size_t s = 0; s < n; s++) {
            stk__rng g = stk__rng_for(99, r, s);
            uint32_t o[4];
            int fb;
            stk__rrc_params(&g, ref->width, ref->height, scale, ratio, o, &fb);
            area[s] = (double)o[3] * o[2] / ((double)ref->width * ref->height);
            lr[s] = log((double)o[3] / (double)o[2]);
            fbs += (size_t)fb;
        }
        char what[64];
        snprintf(what, sizeof what, "%ux%u area", ref->width, ref->height);
        CHECK(ks_ok(area, n, ref->area, what));
        snprintf(what, sizeof what, "%ux%u log ratio", ref->width, ref->height);
        CHECK(ks_ok(lr, n, ref->logratio, what));
        /* Fallback frequency within 4.5 binomial standard deviations. */
        double pr = ref->fallback_rate, pc = (double)fbs / (double)n;
        double sd = sqrt((pr * (1 - pr) + 1e-4) * 2.0 / (double)n);
        if (fabs(pc - pr) > 4.5 * sd + 1e-3)
            fprintf(stderr, "%ux%u fallback rate %.4f vs torchvision %.4f\n", ref->width,
                    ref->height, pc, pr);
        CHECK(fabs(pc - pr) <= 4.5 * sd + 1e-3);
    }
    free(area);
    free(lr);
}

/* The uint8 HWC -> CHW store (SIMD on x86, scalar elsewhere) against the
 * definition, for widths around the 16-pixel step, every flip, and padded
 * source strides. */
static void test_write_u8_chw(void)
{
    const uint32_t widths[] = {1, 2, 15, 16, 17, 31, 32, 33, 224, 225};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        for (int flips = 0; flips < 4; flips++) {
            const uint32_t W = widths[wi], H = 5;
            const size_t stride = (size_t)W * 3 + 7;
            uint8_t *src = malloc(stride * H), *out = malloc((size_t)W * H * 3);
            for (size_t k = 0; k < stride * H; k++)
                src[k] = (uint8_t)(k * 131 + 7);
            stk__view in = {src, stride, W, H};
            stk__writer wr = {STK_DTYPE_UINT8, 1, flips & 1, flips >> 1, NULL, NULL};
            stk__write(&in, &wr, out);
            int bad = 0;
            for (uint32_t c = 0; c < 3; c++)
                for (uint32_t y = 0; y < H; y++)
                    for (uint32_t x = 0; x < W; x++) {
                        uint32_t sy = wr.vflip ? H - 1 - y : y, sx = wr.hflip ? W - 1 - x : x;
                        bad += out[(size_t)c * W * H + (size_t)y * W + x] !=
                               src[sy * stride + (size_t)sx * 3 + c];
                    }
            CHECK_EQ(bad, 0);
            free(src);
            free(out);
        }
    }
}

int main(void)
{
    tu_begin("test_image", 300);
    RUN(test_write_u8_chw);
    RUN(test_jpeg_variants);
    RUN(test_png_variants);
    RUN(test_crop_aware_exact);
    RUN(test_dct_scaled_resize);
    RUN(test_bad_inputs);
    RUN(test_mutations);
    RUN(test_alloc_failures);
    RUN(test_spec_good);
    RUN(test_spec_bad);
    RUN(test_shapes);
    RUN(test_geometry_values);
    RUN(test_dtypes_and_layout);
    RUN(test_determinism);
    RUN(test_exif);
    RUN(test_rrc_properties);
    RUN(test_rrc_distribution);
    return tu_end();
}
