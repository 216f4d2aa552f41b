/*
 * resize.c -- antialiased separable resampling, bit-exact with PIL 9's
 * Image.resize(size, BILINEAR, box) (which is what torchvision 0.14 runs on
 * PIL images): a triangle filter whose support grows with the reduction
 * factor, weights normalised in double and rounded to 22-bit fixed point,
 * horizontal pass first with the intermediate rounded to uint8, then the
 * vertical pass. Matching PIL's arithmetic step by step is what makes our
 * output equal torchvision's for the same input pixels.
 *
 * Two implementations of each pass give the same bytes. The generic ones
 * (any CPU) are plain loops: the vertical pass over contiguous bytes of a row
 * block with int32 accumulators, the horizontal pass a short gather per
 * output pixel. On CPUs with AVX2 (picked at run time: the build targets
 * baseline x86-64) both passes run as the same int32 multiply-adds over
 * contiguous vectors: the vertical pass directly, the horizontal pass on
 * blocks of 8 rows whose source pixels are transposed first, so that a
 * source column of the block is one contiguous vector.
 */
#include "ops/ops.h"

#include <math.h>
#include <stdatomic.h>
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
     * sizes for the worst alignment), and the end of the span the outputs
     * read: what src/image.c decodes and sizes its buffers for. */
    uint32_t taps = 0;
    int end = 0;
    for (uint32_t k = 0; k < n; k++) {
        int xmin, xmax;
        bound_of(&c, in_size, center_of(&c, o0 + k), &xmin, &xmax);
        if ((uint32_t)xmax > taps)
            taps = (uint32_t)xmax;
        if (xmin + xmax > end)
            end = xmin + xmax;
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
         * fixed-length, fully unrolled loops. Near the end of the span the
         * window starts earlier instead of reading past it (past the input,
         * or past the rows and columns the caller decoded for this window of
         * outputs). It never starts before the span: the output that reads
         * `taps` inputs ends at or before `end` and starts after the first
         * output does. */
        if (ax->taps) {
            int t = (int)ax->taps;
            int start = xmin + t > end ? end - t : xmin;
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

static void resample_h_generic(const stk__view *in, uint32_t y0, const stk__axis *ax,
                               const stk__view *out)
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

static void resample_v_generic(const stk__view *in, const stk__axis *ax, const stk__view *out)
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

/* ---- AVX2 passes -------------------------------------------------------
 * The build targets baseline x86-64, so these are compiled for AVX2 per
 * function and chosen at run time. They do the same integer arithmetic as
 * the generic passes: each sum is the same set of exact int32 products, and
 * as the triangle filter has no negative weights every partial sum lies
 * between 0 and the final one (below 2^31), so the order of the additions
 * cannot change a bit of the result. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define STK_RESIZE_AVX2 1
#else
#define STK_RESIZE_AVX2 0
#endif

#if STK_RESIZE_AVX2
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2")))

/* 8 bytes zero-extended to 8 int32. */
AVX2_FN static inline __m256i load8u(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

/* Source columns held in the horizontal pass's block: 8 rows x HCOLS pixels
 * (12 KiB), so the block stays in L1 while every output of it is made. */
#define HCOLS 512
#define HROWS 8

/* 8 RGB pixels (24 bytes, read exactly) as 8 dwords R, G, B, 0. */
AVX2_FN static inline __m256i rgb_to_dw(const uint8_t *p)
{
    const __m256i m = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, /* */
                                       4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1);
    __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p)),
        _mm_loadu_si128((const __m128i *)(const void *)(p + 8)), 1);
    return _mm256_shuffle_epi8(v, m);
}

/* The inverse: 8 dwords R, G, B, x to 24 bytes (written exactly). */
AVX2_FN static inline void dw_to_rgb(uint8_t *p, __m256i v)
{
    const __m256i m = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, /* */
                                       0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, m),
                                    _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(v));
    _mm_storel_epi64((__m128i *)(void *)(p + 16), _mm256_extracti128_si256(v, 1));
}

/* Transposes 8 x 8 dwords in place (the usual unpack ladder). */
AVX2_FN static inline void tr8_dw(__m256i r[8])
{
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* Transposes an 8 x 8 block of RGB pixels: pixel j of line i (src[i] +
 * soff + 3j) goes to pixel i of line j (dst[j] + doff + 3i). */
AVX2_FN static inline void tr8(const uint8_t *const src[8], size_t soff, uint8_t *const dst[8],
                               size_t doff)
{
    __m256i r[8];
    for (int i = 0; i < 8; i++)
        r[i] = rgb_to_dw(src[i] + soff);
    tr8_dw(r);
    for (int i = 0; i < 8; i++)
        dw_to_rgb(dst[i] + doff, r[i]);
}

/* clip8 of 24 accumulators (a0, a1, a2: 8 RGB pixels in order) as 8 dwords
 * R, G, B, x. */
AVX2_FN static inline __m256i clip24_dw(__m256i a0, __m256i a1, __m256i a2)
{
    a0 = _mm256_srai_epi32(a0, PRECISION_BITS);
    a1 = _mm256_srai_epi32(a1, PRECISION_BITS);
    a2 = _mm256_srai_epi32(a2, PRECISION_BITS);
    /* Signed saturation to int16 is exact here (|v| < 2^10), unsigned
     * saturation to uint8 is clip8's clamp. The lane-wise packs leave the
     * 4-byte groups of the 24 bytes b[] as b0-3 b8-11 b16-19 - | b4-7
     * b12-15 b20-23 -; the permute makes them b0-15 | b12-27, from which
     * one shuffle per lane spreads pixels 0-3 and 4-7 to dwords. */
    __m256i v = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a2));
    v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 5, 2, 6, 6));
    const __m256i m = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, /* */
                                       0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    return _mm256_shuffle_epi8(v, m);
}

/* Outputs [g, g + ng) of a block of 8 rows (blk: the block's transposed
 * source, starting at column lo), each as 8 dwords R, G, B, x (one per
 * row). */
AVX2_FN static inline void hgroup(__m256i px[8], const uint8_t *blk, int32_t lo,
                                  const stk__axis *ax, uint32_t g, uint32_t ng, int32_t taps)
{
    const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    for (uint32_t j = 0; j < ng; j++) {
        const uint8_t *p = blk + (size_t)(ax->bounds[2 * (g + j)] - lo) * 24;
        const int32_t *k = ax->coef + (size_t)(g + j) * ax->ksize;
        __m256i a0 = half, a1 = half, a2 = half;
        for (int32_t t = 0; t < taps; t++, p += 24) {
            const __m256i w = _mm256_set1_epi32(k[t]);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8u(p), w));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(load8u(p + 8), w));
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(load8u(p + 16), w));
        }
        px[j] = clip24_dw(a0, a1, a2);
    }
}

/* Horizontal pass on blocks of 8 rows. The block's source columns are
 * transposed (blk[x][r][c], 24 bytes per column), so one output pixel of
 * the 8 rows is 3 x 8 int32 lanes accumulated over contiguous taps; 8 such
 * outputs are transposed back into the 8 output rows. Needs ax->taps (every
 * output reading the same number of taps) and taps <= HCOLS. */
AVX2_FN static void resample_h_avx2(const stk__view *in, uint32_t y0, const stk__axis *ax,
                                    const stk__view *out)
{
    _Alignas(32) uint8_t blk[HCOLS * 24];
    _Alignas(32) uint8_t tile[32];
    _Alignas(32) uint8_t part[HROWS * 24];
    const uint32_t n = ax->n, h = out->h;
    const size_t ostride = out->stride;
    const int32_t taps = (int32_t)ax->taps;
    const int32_t *b = ax->bounds;
    uint8_t *blks[HROWS];
    for (uint32_t i = 0; i < HROWS; i++)
        blks[i] = blk + 24 * i;
    for (uint32_t x0 = 0; x0 < n;) {
        /* The outputs [x0, x1) whose taps fit one block. */
        int32_t lo = b[2 * x0], hi = lo + taps;
        uint32_t x1 = x0 + 1;
        for (; x1 < n; x1++) {
            int32_t s = b[2 * x1];
            int32_t l2 = s < lo ? s : lo, h2 = s + taps > hi ? s + taps : hi;
            if (h2 - l2 > HCOLS)
                break;
            lo = l2;
            hi = h2;
        }
        const uint32_t cols = (uint32_t)(hi - lo);
        for (uint32_t r0 = 0; r0 < h; r0 += HROWS) {
            const uint32_t nr = h - r0 < HROWS ? h - r0 : HROWS;
            const uint8_t *rows[HROWS];
            uint8_t *orows[HROWS];
            /* A short last block repeats its first row as input, and its
             * 8-output groups go through `part`. */
            for (uint32_t r = 0; r < HROWS; r++) {
                const uint32_t rr = r < nr ? r : 0;
                rows[r] = in->p + (size_t)(y0 + r0 + rr) * in->stride + (size_t)lo * 3;
                orows[r] = out->p + (size_t)(r0 + rr) * ostride;
            }
            uint32_t x = 0;
            for (; x + 8 <= cols; x += 8)
                tr8(rows, (size_t)x * 3, blks, (size_t)x * 24);
            for (; x < cols; x++)
                for (uint32_t r = 0; r < HROWS; r++)
                    memcpy(blk + (size_t)x * 24 + 3 * r, rows[r] + (size_t)x * 3, 3);

            for (uint32_t g = x0; g < x1; g += 8) {
                const uint32_t ng = x1 - g < 8 ? x1 - g : 8;
                __m256i px[8];
                hgroup(px, blk, lo, ax, g, ng, taps);
                if (ng == 8) {
                    /* px[j]: output g + j of the 8 rows; transposed, px[r]
                     * is 8 outputs of row r. */
                    tr8_dw(px);
                    if (nr == HROWS) {
                        for (uint32_t r = 0; r < HROWS; r++)
                            dw_to_rgb(orows[r] + (size_t)g * 3, px[r]);
                    } else {
                        for (uint32_t r = 0; r < HROWS; r++)
                            dw_to_rgb(part + 24 * r, px[r]);
                        for (uint32_t r = 0; r < nr; r++)
                            memcpy(orows[r] + (size_t)g * 3, part + 24 * r, 24);
                    }
                } else {
                    for (uint32_t j = 0; j < ng; j++) {
                        _mm256_store_si256((__m256i *)(void *)tile, px[j]);
                        for (uint32_t r = 0; r < nr; r++)
                            memcpy(orows[r] + (size_t)(g + j) * 3, tile + 4 * r, 3);
                    }
                }
            }
        }
        x0 = x1;
    }
}

/* Vertical pass, 32 bytes of an output row at a time in 4 x 8 int32
 * registers; the row's last (< 32) bytes go through the scalar loop. */
AVX2_FN static void resample_v_avx2(const stk__view *in, const stk__axis *ax, const stk__view *out)
{
    const size_t rowbytes = (size_t)out->w * 3;
    const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (uint32_t y = 0; y < out->h; y++) {
        const int32_t *k = ax->coef + (size_t)y * ax->ksize;
        const int32_t first = ax->bounds[2 * y], n = ax->bounds[2 * y + 1];
        const uint8_t *src = in->p + (size_t)first * in->stride;
        uint8_t *dst = out->p + (size_t)y * out->stride;
        size_t i = 0;
        for (; i + 32 <= rowbytes; i += 32) {
            __m256i a0 = half, a1 = half, a2 = half, a3 = half;
            const uint8_t *s = src + i;
            for (int32_t t = 0; t < n; t++, s += in->stride) {
                const __m256i w = _mm256_set1_epi32(k[t]);
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8u(s), w));
                a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(load8u(s + 8), w));
                a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(load8u(s + 16), w));
                a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(load8u(s + 24), w));
            }
            a0 = _mm256_srai_epi32(a0, PRECISION_BITS);
            a1 = _mm256_srai_epi32(a1, PRECISION_BITS);
            a2 = _mm256_srai_epi32(a2, PRECISION_BITS);
            a3 = _mm256_srai_epi32(a3, PRECISION_BITS);
            /* Lane-wise packs leave 4-byte groups in the order
             * a0lo a1lo a2lo a3lo a0hi a1hi a2hi a3hi. */
            __m256i v = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
            _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                                _mm256_permutevar8x32_epi32(v, order));
        }
        for (; i < rowbytes; i++) {
            int32_t a = 1 << (PRECISION_BITS - 1);
            for (int32_t t = 0; t < n; t++)
                a += (int32_t)src[(size_t)t * in->stride + i] * k[t];
            dst[i] = clip8(a);
        }
    }
}
#endif

/* Test hook: relaxed is enough, the flag orders nothing else. */
static _Atomic int force_generic;

void stk__resize_force_generic(int on)
{
    atomic_store_explicit(&force_generic, on, memory_order_relaxed);
}

#if STK_RESIZE_AVX2
/* __builtin_cpu_supports also checks that the OS saves the AVX registers. */
static int use_avx2(void)
{
    if (atomic_load_explicit(&force_generic, memory_order_relaxed))
        return 0;
    return __builtin_cpu_supports("avx2");
}
#endif

void stk__resample_h(const stk__view *in, uint32_t y0, const stk__axis *ax, const stk__view *out)
{
#if STK_RESIZE_AVX2
    if (ax->taps > 0 && ax->taps <= HCOLS && use_avx2()) {
        resample_h_avx2(in, y0, ax, out);
        return;
    }
#endif
    resample_h_generic(in, y0, ax, out);
}

void stk__resample_v(const stk__view *in, const stk__axis *ax, const stk__view *out)
{
#if STK_RESIZE_AVX2
    if (use_avx2()) {
        resample_v_avx2(in, ax, out);
        return;
    }
#endif
    resample_v_generic(in, ax, out);
}
