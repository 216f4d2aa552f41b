/*
 * test_resize.c -- the resampler against a plain transcription of PIL 9's
 * antialiased bilinear resize (precompute_coeffs, normalize_coeffs_8bpc,
 * ImagingResampleHorizontal/Vertical_8bpc), kept here as the reference: on
 * many random sizes, boxes and output windows (1-pixel axes, upscales, large
 * reductions, odd widths, padded strides), the library's passes must give the
 * same bytes, on the AVX2 path where the CPU has one and on the generic path,
 * and must not write outside their output.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "testutil.h"

#define PB 22

/* ---- Reference: PIL 9, Resample.c, step by step ------------------------- */

typedef struct ref_axis {
    int ksize;
    int *bounds; /* xmin, count per output */
    int *kk;     /* ksize fixed-point weights per output */
} ref_axis;

static double ref_filter(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* PIL takes the box as float. */
static void ref_coeffs(ref_axis *a, int in_size, float in0, float in1, int out_size)
{
    double scale = ((double)in1 - (double)in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *k = calloc((size_t)out_size * (size_t)ksize, sizeof *k);
    a->ksize = ksize;
    a->bounds = calloc((size_t)out_size * 2, sizeof *a->bounds);
    a->kk = calloc((size_t)out_size * (size_t)ksize, sizeof *a->kk);
    REQUIRE(k && a->bounds && a->kk);
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        double *kx = k + (size_t)xx * (size_t)ksize;
        for (int x = 0; x < xmax; x++) {
            double w = ref_filter((x + xmin - center + 0.5) * ss);
            kx[x] = w;
            ww += w;
        }
        for (int x = 0; x < xmax; x++)
            if (ww != 0.0)
                kx[x] /= ww;
        a->bounds[2 * xx] = xmin;
        a->bounds[2 * xx + 1] = xmax;
    }
    for (size_t i = 0; i < (size_t)out_size * (size_t)ksize; i++)
        a->kk[i] = k[i] < 0 ? (int)(-0.5 + k[i] * (1 << PB)) : (int)(0.5 + k[i] * (1 << PB));
    free(k);
}

static void ref_axis_free(ref_axis *a)
{
    free(a->bounds);
    free(a->kk);
}

static uint8_t ref_clip8(int v)
{
    v >>= PB;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* Resizes the box [bx0, bx1) x [by0, by1) of a w x h image to ow x oh:
 * horizontal pass over every row, then vertical (PIL trims the rows of the
 * first pass to those the second reads, which changes no output). */
static uint8_t *ref_resize(const uint8_t *img, int w, int h, const float box[4], int ow, int oh)
{
    ref_axis ax, ay;
    ref_coeffs(&ax, w, box[0], box[2], ow);
    ref_coeffs(&ay, h, box[1], box[3], oh);
    uint8_t *tmp = malloc((size_t)ow * (size_t)h * 3), *out = malloc((size_t)ow * (size_t)oh * 3);
    REQUIRE(tmp && out);
    for (int y = 0; y < h; y++)
        for (int xx = 0; xx < ow; xx++) {
            const int *k = ax.kk + (size_t)xx * (size_t)ax.ksize;
            int xmin = ax.bounds[2 * xx], xmax = ax.bounds[2 * xx + 1];
            for (int c = 0; c < 3; c++) {
                int ss = 1 << (PB - 1);
                for (int x = 0; x < xmax; x++)
                    ss += img[((size_t)y * (size_t)w + (size_t)(x + xmin)) * 3 + (size_t)c] * k[x];
                tmp[((size_t)y * (size_t)ow + (size_t)xx) * 3 + (size_t)c] = ref_clip8(ss);
            }
        }
    for (int yy = 0; yy < oh; yy++) {
        const int *k = ay.kk + (size_t)yy * (size_t)ay.ksize;
        int ymin = ay.bounds[2 * yy], ymax = ay.bounds[2 * yy + 1];
        for (int i = 0; i < ow * 3; i++) {
            int ss = 1 << (PB - 1);
            for (int y = 0; y < ymax; y++)
                ss += tmp[(size_t)(y + ymin) * (size_t)ow * 3 + (size_t)i] * k[y];
            out[(size_t)yy * (size_t)ow * 3 + (size_t)i] = ref_clip8(ss);
        }
    }
    free(tmp);
    ref_axis_free(&ax);
    ref_axis_free(&ay);
    return out;
}

/* ---- The library's passes, driven as src/image.c drives them ---------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return n ? (uint32_t)(rng_state % n) : 0;
}

#define CANARY 0xA5
#define PADB   37 /* bytes after each output row, checked untouched */

/* Outputs [ox, ox + nx) x [oy, oy + ny) of resizing the box of img (w x h,
 * row stride `stride` bytes) to ow x oh. Only the source window the axes
 * read is handed to the passes, in a buffer of exactly its size, so any
 * read outside it trips ASan. Returns 0 if a guard byte was overwritten. */
static int lib_resize(const uint8_t *img, size_t stride, uint32_t w, uint32_t h, const float box[4],
                      uint32_t ow, uint32_t oh, uint32_t ox, uint32_t oy, uint32_t nx, uint32_t ny,
                      uint8_t *out)
{
    int32_t fx0, nx0, fx1, nx1, fy0, ny0, fy1, ny1;
    stk__axis_bound(w, box[0], box[2], ow, ox, &fx0, &nx0);
    stk__axis_bound(w, box[0], box[2], ow, ox + nx - 1, &fx1, &nx1);
    stk__axis_bound(h, box[1], box[3], oh, oy, &fy0, &ny0);
    stk__axis_bound(h, box[1], box[3], oh, oy + ny - 1, &fy1, &ny1);
    int32_t xlo = fx0, xhi = fx1 + nx1 > xlo ? fx1 + nx1 : xlo + 1;
    int32_t ylo = fy0, yhi = fy1 + ny1 > ylo ? fy1 + ny1 : ylo + 1;
    uint32_t sw = (uint32_t)(xhi - xlo), sh = (uint32_t)(yhi - ylo);

    /* Window copy with a random extra stride, in an exact-size buffer. */
    size_t sstride = (size_t)sw * 3 + rnd(3) * 7;
    size_t slen = sstride * (sh - 1) + (size_t)sw * 3;
    uint8_t *sbuf = malloc(slen);
    REQUIRE(sbuf);
    for (uint32_t y = 0; y < sh; y++)
        memcpy(sbuf + (size_t)y * sstride,
               img + (size_t)(ylo + (int32_t)y) * stride + (size_t)xlo * 3, (size_t)sw * 3);
    stk__view src = {sbuf, sstride, sw, sh};

    uint32_t kx = stk__axis_ksize(box[0], box[2], ow), ky = stk__axis_ksize(box[1], box[3], oh);
    void *mx = malloc(stk__axis_bytes(nx, kx)), *my = malloc(stk__axis_bytes(ny, ky));
    REQUIRE(mx && my);
    stk__axis ax, ay;
    stk__axis_init(&ax, mx, w, box[0], box[2], ow, ox, nx);
    stk__axis_shift(&ax, -xlo);
    stk__axis_init(&ay, my, h, box[1], box[3], oh, oy, ny);
    stk__axis_shift(&ay, -ylo);

    size_t hstride = (size_t)nx * 3 + PADB, ostride = (size_t)nx * 3 + PADB;
    uint8_t *hb = malloc(hstride * sh), *ob = malloc(ostride * ny);
    REQUIRE(hb && ob);
    memset(hb, CANARY, hstride * sh);
    memset(ob, CANARY, ostride * ny);
    stk__view hv = {hb, hstride, nx, sh}, ov = {ob, ostride, nx, ny};
    stk__resample_h(&src, 0, &ax, &hv);
    stk__resample_v(&hv, &ay, &ov);

    int guards = 1;
    for (uint32_t y = 0; y < sh; y++)
        for (size_t i = (size_t)nx * 3; i < hstride; i++)
            guards &= hb[(size_t)y * hstride + i] == CANARY;
    for (uint32_t y = 0; y < ny; y++) {
        memcpy(out + (size_t)y * nx * 3, ob + (size_t)y * ostride, (size_t)nx * 3);
        for (size_t i = (size_t)nx * 3; i < ostride; i++)
            guards &= ob[(size_t)y * ostride + i] == CANARY;
    }
    free(sbuf);
    free(mx);
    free(my);
    free(hb);
    free(ob);
    return guards;
}

/* Random picture: noise with flat black and white patches (which make the
 * fixed-point sums overshoot 255 and undershoot 0 where weights round up). */
static uint8_t *make_image(uint32_t w, uint32_t h, size_t stride)
{
    uint8_t *p = malloc(stride * h);
    REQUIRE(p);
    for (size_t i = 0; i < stride * h; i++)
        p[i] = (uint8_t)rnd(256);
    uint32_t px = rnd(w), py = rnd(h), pw = rnd(w / 2 + 1), ph = rnd(h / 2 + 1);
    uint8_t v = rnd(2) ? 255 : 0;
    for (uint32_t y = py; y < py + ph && y < h; y++)
        for (uint32_t x = px; x < px + pw && x < w; x++)
            memset(p + (size_t)y * stride + (size_t)x * 3, v, 3);
    return p;
}

static uint32_t rnd_size(void)
{
    switch (rnd(6)) {
    case 0: return 1 + rnd(3);
    case 1: return 1 + rnd(40);
    case 2: return 100 + rnd(300);
    default: return 1 + rnd(700);
    }
}

/* One random case, checked on the current path; returns 1 if it matched. */
static int one_case(int verbose)
{
    uint32_t w = rnd_size(), h = rnd_size();
    uint32_t ow = rnd(4) ? 1 + rnd(260) : rnd_size(), oh = rnd(4) ? 1 + rnd(260) : rnd_size();
    size_t stride = (size_t)w * 3 + rnd(2) * 5;
    uint8_t *img = make_image(w, h, stride);
    /* Boxes: the whole image, an integer crop (RandomResizedCrop) or a
     * fractional one (DCT-scaled decodes). */
    float box[4] = {0, 0, (float)w, (float)h};
    int kind = (int)rnd(3);
    if (kind) {
        uint32_t bw = 1 + rnd(w), bh = 1 + rnd(h);
        uint32_t bx = rnd(w - bw + 1), by = rnd(h - bh + 1);
        box[0] = (float)bx;
        box[1] = (float)by;
        box[2] = (float)(bx + bw);
        box[3] = (float)(by + bh);
        if (kind == 2) {
            box[0] += (float)rnd(100) / 128.0f;
            box[1] += (float)rnd(100) / 128.0f;
            box[2] -= box[2] - box[0] > 1 ? (float)rnd(100) / 128.0f : 0.0f;
            box[3] -= box[3] - box[1] > 1 ? (float)rnd(100) / 128.0f : 0.0f;
        }
    }
    /* The whole output or a window of it (a crop after the resize). */
    uint32_t ox = 0, oy = 0, nx = ow, ny = oh;
    if (rnd(2)) {
        nx = 1 + rnd(ow);
        ny = 1 + rnd(oh);
        ox = rnd(ow - nx + 1);
        oy = rnd(oh - ny + 1);
    }
    /* The reference reads a tightly packed copy. */
    uint8_t *packed = malloc((size_t)w * h * 3);
    REQUIRE(packed);
    for (uint32_t y = 0; y < h; y++)
        memcpy(packed + (size_t)y * w * 3, img + (size_t)y * stride, (size_t)w * 3);
    uint8_t *ref = ref_resize(packed, (int)w, (int)h, box, (int)ow, (int)oh);
    uint8_t *got = malloc((size_t)nx * ny * 3);
    REQUIRE(got);
    int guards = lib_resize(img, stride, w, h, box, ow, oh, ox, oy, nx, ny, got);
    int same = 1;
    for (uint32_t y = 0; y < ny && same; y++)
        same = !memcmp(got + (size_t)y * nx * 3, ref + ((size_t)(oy + y) * ow + ox) * 3,
                       (size_t)nx * 3);
    if ((!same || !guards) && verbose)
        fprintf(stderr, "mismatch%s: %ux%u box (%g,%g,%g,%g) -> %ux%u window %u,%u %ux%u\n",
                guards ? "" : " (guard bytes overwritten)", w, h, (double)box[0], (double)box[1],
                (double)box[2], (double)box[3], ow, oh, ox, oy, nx, ny);
    free(img);
    free(packed);
    free(ref);
    free(got);
    return same && guards;
}

static void run_cases(int generic, int count)
{
    stk__resize_force_generic(generic);
    int bad = 0;
    for (int i = 0; i < count; i++)
        bad += !one_case(bad < 5);
    stk__resize_force_generic(0);
    CHECK_EQ(bad, 0);
}

static void test_random_fast_path(void)
{
    run_cases(0, 400);
}

static void test_random_generic_path(void)
{
    run_cases(1, 150);
}

/* Fixed shapes the random draw may miss: the RandomResizedCrop sizes of a
 * 400x350 picture, widths around the SIMD block sizes, a 1-pixel source,
 * and a reduction whose filter is wider than the fast path's column block. */
static void test_edge_shapes(void)
{
    static const uint32_t shapes[][4] = {
        {400, 350, 224, 224}, {287, 231, 224, 224}, {1, 1, 1, 1},         {1, 1, 224, 224},
        {1, 300, 224, 1},     {300, 1, 5, 224},     {10, 10, 11, 10},     {2, 2, 3, 300},
        {31, 9, 10, 3},       {33, 17, 11, 11},     {64, 8, 32, 8},       {65, 9, 21, 9},
        {4000, 9, 3, 2},      {1500, 5, 1, 5},      {225, 225, 224, 224},
    };
    for (int generic = 0; generic < 2; generic++) {
        stk__resize_force_generic(generic);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            uint32_t w = shapes[s][0], h = shapes[s][1], ow = shapes[s][2], oh = shapes[s][3];
            uint8_t *img = make_image(w, h, (size_t)w * 3);
            float box[4] = {0, 0, (float)w, (float)h};
            uint8_t *ref = ref_resize(img, (int)w, (int)h, box, (int)ow, (int)oh);
            uint8_t *got = malloc((size_t)ow * oh * 3);
            REQUIRE(got);
            CHECK(lib_resize(img, (size_t)w * 3, w, h, box, ow, oh, 0, 0, ow, oh, got));
            int same = !memcmp(got, ref, (size_t)ow * oh * 3);
            if (!same)
                fprintf(stderr, "mismatch (%s path): %ux%u -> %ux%u\n",
                        generic ? "generic" : "fast", w, h, ow, oh);
            CHECK(same);
            free(img);
            free(ref);
            free(got);
        }
    }
    stk__resize_force_generic(0);
}

int main(void)
{
    tu_begin("test_resize", 300);
    RUN(test_edge_shapes);
    RUN(test_random_fast_path);
    RUN(test_random_generic_path);
    return tu_end();
}
