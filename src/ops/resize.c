/*
 * resize.c -- antialiased separable resampling, bit-exact with PIL 9's
 * Image.resize(size, BILINEAR, box) (which is what torchvision 0.14 runs on
 * PIL images): a triangle filter whose support grows with the reduction
 * factor, weights normalised in double and rounded to 22-bit fixed point,
 * horizontal pass first with the intermediate rounded to uint8, then the
 * vertical pass. Matching PIL's arithmetic step by step is what makes our
 * output equal torchvision's for the same input pixels.
 *
 * The loops are written for the auto-vectoriser: the vertical pass runs over
 * contiguous bytes of a row block with int32 accumulators (vectorises fully);
 * the horizontal pass is a short gather per output pixel.
 */
#include "ops/ops.h"

#include <math.h>
#include <string.h>

/* gcc enables the loop vectoriser only from -O3 (gcc 12: a "very cheap"
 * subset at -O2 that skips these loops); this file is the hot path of
 * augmentation, so ask for it here rather than raising the whole build.
 * clang vectorises at -O2 already. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize")
#endif

#define PRECISION_BITS 22

static double bilinear(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

/* PIL passes the box as float: rounding it the same way keeps fractional
 * boxes (DCT-scaled decodes) on the same grid as PIL would put them. */
static double span_scale(double in0, double in1, uint32_t out_size)
{
    float a = (float)in0, b = (float)in1;
    return (double)(b - a) / (double)out_size;
}

uint32_t stk__axis_ksize(double in0, double in1, uint32_t out_size)
{
    double filterscale = span_scale(in0, in1, out_size);
    if (filterscale < 1.0)
        filterscale = 1.0;
    return (uint32_t)ceil(filterscale) * 2 + 1;
}

size_t stk__axis_bytes(uint32_t n, uint32_t ksize)
{
    return (size_t)n * 2 * sizeof(int32_t) + (size_t)n * ksize * sizeof(int32_t);
}

/* Per-output constants of an axis, computed once as PIL does. */
typedef struct axis_consts {
    double scale, support, ss, fin0;
    uint32_t ksize;
} axis_consts;

static void consts(axis_consts *c, double in0, double in1, uint32_t out_size)
{
    c->scale = span_scale(in0, in1, out_size);
    double filterscale = c->scale < 1.0 ? 1.0 : c->scale;
    c->support = 1.0 * filterscale;
    c->ss = 1.0 / filterscale;
    c->fin0 = (double)(float)in0;
    c->ksize = (uint32_t)ceil(c->support) * 2 + 1;
}

static double center_of(const axis_consts *c, uint32_t xx)
{
    return c->fin0 + ((double)xx + 0.5) * c->scale;
}

/* Truncating casts and clamps as in PIL's precompute_coeffs. */
static void bound_of(const axis_consts *c, uint32_t in_size, double center, int *xmin_out,
                     int *count_out)
{
    int xmin = (int)(center - c->support + 0.5);
    if (xmin < 0)
        xmin = 0;
    int xmax = (int)(center + c->support + 0.5);
    if (xmax > (int)in_size)
        xmax = (int)in_size;
    xmax -= xmin;
    if (xmax < 0)
        xmax = 0;
    if ((uint32_t)xmax > c->ksize)
        xmax = (int)c->ksize;
    *xmin_out = xmin;
    *count_out = xmax;
}

void stk__axis_bound(uint32_t in_size, double in0, double in1, uint32_t out_size, uint32_t xx,
                     int32_t *first, int32_t *count)
{
    axis_consts c;
    int a, n;
    consts(&c, in0, in1, out_size);
    bound_of(&c, in_size, center_of(&c, xx), &a, &n);
    *first = a;
    *count = n;
}

void stk__axis_init(stk__axis *ax, void *mem, uint32_t in_size, double in0, double in1,
                    uint32_t out_size, uint32_t o0, uint32_t n)
{
    axis_consts c;
    consts(&c, in0, in1, out_size);
    const uint32_t ksize = c.ksize;
    ax->bounds = mem;
    ax->coef = ax->bounds + (size_t)n * 2;
    ax->n = n;
    ax->ksize = ksize;
    /* The most taps any output reads (often fewer than ksize, which PIL
     * sizes for the worst alignment). */
    uint32_t taps = 0;
    for (uint32_t k = 0; k < n; k++) {
        int xmin, xmax;
        bound_of(&c, in_size, center_of(&c, o0 + k), &xmin, &xmax);
        if ((uint32_t)xmax > taps)
            taps = (uint32_t)xmax;
    }
    ax->taps = in_size >= taps ? taps : 0;
    for (uint32_t k = 0; k < n; k++) {
        double center = center_of(&c, o0 + k);
        int xmin, xmax;
        bound_of(&c, in_size, center, &xmin, &xmax);
        int32_t *kk = ax->coef + (size_t)k * ksize;
        /* Weights are computed twice (sum, then normalised value) instead of
         * being stored as doubles: same arithmetic as PIL, no extra buffer. */
        double ww = 0.0;
        for (int x = 0; x < xmax; x++)
            ww += bilinear(((double)(x + xmin) - center + 0.5) * c.ss);
        for (int x = 0; x < xmax; x++) {
            double w = bilinear(((double)(x + xmin) - center + 0.5) * c.ss);
            if (ww != 0.0)
                w /= ww;
            kk[x] = w < 0 ? (int32_t)(-0.5 + w * (1 << PRECISION_BITS))
                          : (int32_t)(0.5 + w * (1 << PRECISION_BITS));
        }
        for (uint32_t x = (uint32_t)xmax; x < ksize; x++)
            kk[x] = 0;
        /* Give every output exactly `taps` taps (zero weights add exactly
         * nothing, so the result stays PIL's): the passes can then use
         * fixed-length, fully unrolled loops. Near the right edge the window
         * starts earlier instead of reading past the input. */
        if (ax->taps) {
            int t = (int)ax->taps;
            int start = xmin + t > (int)in_size ? (int)in_size - t : xmin;
            int shift = xmin - start;
            if (shift > 0) {
                memmove(kk + shift, kk, (size_t)(t - shift) * sizeof *kk);
                for (int x = 0; x < shift; x++)
                    kk[x] = 0;
            }
            xmin = start;
            xmax = t;
        }
        ax->bounds[2 * k] = xmin;
        ax->bounds[2 * k + 1] = xmax;
    }
}

void stk__axis_shift(stk__axis *ax, int32_t delta)
{
    for (uint32_t k = 0; k < ax->n; k++)
        ax->bounds[2 * k] += delta;
}

void stk__axis_span(const stk__axis *ax, int32_t *lo, int32_t *hi)
{
    int32_t a = INT32_MAX, b = INT32_MIN;
    for (uint32_t k = 0; k < ax->n; k++) {
        int32_t s = ax->bounds[2 * k], e = s + ax->bounds[2 * k + 1];
        if (ax->bounds[2 * k + 1] == 0)
            continue;
        if (s < a)
            a = s;
        if (e > b)
            b = e;
    }
    if (a > b)
        a = b = 0;
    *lo = a;
    *hi = b;
}

static inline uint8_t clip8(int32_t v)
{
    v >>= PRECISION_BITS;
    if (v < 0)
        return 0;
    if (v > 255)
        return 255;
    return (uint8_t)v;
}

/* One output pixel from n taps; with n a constant the loop unrolls. */
#define HPIXEL(n)                                                                                  \
    do {                                                                                           \
        const uint8_t *s = src + (size_t)ax->bounds[2 * x] * 3;                                    \
        const int32_t *k = ax->coef + (size_t)x * ks;                                              \
        int32_t a0 = 1 << (PRECISION_BITS - 1), a1 = a0, a2 = a0;                                  \
        for (int32_t t = 0; t < (n); t++) {                                                        \
            a0 += s[3 * t + 0] * k[t];                                                             \
            a1 += s[3 * t + 1] * k[t];                                                             \
            a2 += s[3 * t + 2] * k[t];                                                             \
        }                                                                                          \
        dst[3 * x + 0] = clip8(a0);                                                                \
        dst[3 * x + 1] = clip8(a1);                                                                \
        dst[3 * x + 2] = clip8(a2);                                                                \
    } while (0)

#define HROW_FIXED(K)                                                                              \
    static void hrow##K(const uint8_t *src, uint8_t *dst, const stk__axis *ax)                     \
    {                                                                                              \
        const uint32_t ks = ax->ksize;                                                             \
        for (uint32_t x = 0; x < ax->n; x++)                                                       \
            HPIXEL(K);                                                                             \
    }
HROW_FIXED(2)
HROW_FIXED(3)
HROW_FIXED(4)
HROW_FIXED(5)
HROW_FIXED(6)
HROW_FIXED(7)
HROW_FIXED(8)

static void hrow_any(const uint8_t *src, uint8_t *dst, const stk__axis *ax)
{
    const uint32_t ks = ax->ksize;
    for (uint32_t x = 0; x < ax->n; x++)
        HPIXEL(ax->bounds[2 * x + 1]);
}

void stk__resample_h(const stk__view *in, uint32_t y0, const stk__axis *ax, const stk__view *out)
{
    void (*row)(const uint8_t *, uint8_t *, const stk__axis *) = hrow_any;
    switch (ax->taps) {
    case 2: row = hrow2; break;
    case 3: row = hrow3; break;
    case 4: row = hrow4; break;
    case 5: row = hrow5; break;
    case 6: row = hrow6; break;
    case 7: row = hrow7; break;
    case 8: row = hrow8; break;
    default: break;
    }
    for (uint32_t r = 0; r < out->h; r++)
        row(in->p + (size_t)(y0 + r) * in->stride, out->p + (size_t)r * out->stride, ax);
}

/* Bytes of a row processed per block: the int32 accumulators of one block
 * stay in L1 while every tap row streams through. */
#define VBLOCK 512

void stk__resample_v(const stk__view *in, const stk__axis *ax, const stk__view *out)
{
    const size_t rowbytes = (size_t)out->w * 3;
    int32_t acc[VBLOCK];
    for (uint32_t y = 0; y < out->h; y++) {
        const int32_t *k = ax->coef + (size_t)y * ax->ksize;
        const int32_t first = ax->bounds[2 * y], n = ax->bounds[2 * y + 1];
        uint8_t *dst = out->p + (size_t)y * out->stride;
        for (size_t b0 = 0; b0 < rowbytes; b0 += VBLOCK) {
            size_t bn = rowbytes - b0 < VBLOCK ? rowbytes - b0 : VBLOCK;
            for (size_t i = 0; i < bn; i++)
                acc[i] = 1 << (PRECISION_BITS - 1);
            for (int32_t t = 0; t < n; t++) {
                const uint8_t *s = in->p + (size_t)(first + t) * in->stride + b0;
                const int32_t w = k[t];
                for (size_t i = 0; i < bn; i++)
                    acc[i] += (int32_t)s[i] * w;
            }
            for (size_t i = 0; i < bn; i++)
                dst[b0 + i] = clip8(acc[i]);
        }
    }
}
