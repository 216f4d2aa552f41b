/*
 * pixel.c -- geometry on RGB uint8 views (pad, flips, crop) and the final
 * writer that turns a view into the sample's output element type and layout.
 */
#include "ops/ops.h"
#include "ops/convert.h"

#include <string.h>

void stk__pad(const stk__view *in, const stk__view *out, uint32_t left, uint32_t top,
              const uint8_t fill[3])
{
    for (uint32_t y = 0; y < out->h; y++) {
        uint8_t *d = out->p + (size_t)y * out->stride;
        int inside = y >= top && y - top < in->h;
        for (uint32_t x = 0; x < out->w; x++) {
            if (inside && x == left) {
                memcpy(d + (size_t)x * 3, in->p + (size_t)(y - top) * in->stride,
                       (size_t)in->w * 3);
                x += in->w - 1;
                continue;
            }
            d[3 * x + 0] = fill[0];
            d[3 * x + 1] = fill[1];
            d[3 * x + 2] = fill[2];
        }
    }
}

void stk__flip_h(const stk__view *v)
{
    for (uint32_t y = 0; y < v->h; y++) {
        uint8_t *r = v->p + (size_t)y * v->stride;
        for (uint32_t a = 0, b = v->w ? v->w - 1 : 0; a < b; a++, b--) {
            for (int c = 0; c < 3; c++) {
                uint8_t t = r[3 * a + (uint32_t)c];
                r[3 * a + (uint32_t)c] = r[3 * b + (uint32_t)c];
                r[3 * b + (uint32_t)c] = t;
            }
        }
    }
}

void stk__flip_v(const stk__view *v)
{
    size_t n = (size_t)v->w * 3;
    for (uint32_t a = 0, b = v->h ? v->h - 1 : 0; a < b; a++, b--) {
        uint8_t *ra = v->p + (size_t)a * v->stride, *rb = v->p + (size_t)b * v->stride;
        /* Swap through a small stack block so no row buffer is needed. */
        uint8_t tmp[256];
        for (size_t o = 0; o < n; o += sizeof tmp) {
            size_t k = n - o < sizeof tmp ? n - o : sizeof tmp;
            memcpy(tmp, ra + o, k);
            memcpy(ra + o, rb + o, k);
            memcpy(rb + o, tmp, k);
        }
    }
}

stk__view stk__crop(const stk__view *v, uint32_t x, uint32_t y, uint32_t w, uint32_t h)
{
    stk__view r;
    r.p = v->p + (size_t)y * v->stride + (size_t)x * 3;
    r.stride = v->stride;
    r.w = w;
    r.h = h;
    return r;
}

size_t stk__dtype_size(int dtype)
{
    switch (dtype) {
    case STK_DTYPE_FLOAT32: return 4;
    case STK_DTYPE_FLOAT16:
    case STK_DTYPE_BFLOAT16: return 2;
    default: return 1;
    }
}

/* Each element type gets its own loop so the per-element work is one table
 * load and one store. Rows are walked in output order; hflip/vflip pick the
 * source row and column. */
#define WRITE_LOOP(T, VALUE)                                                                       \
    do {                                                                                           \
        T *o = out;                                                                                \
        const size_t plane = (size_t)W * H;                                                        \
        for (uint32_t y = 0; y < H; y++) {                                                         \
            const uint8_t *row = in->p + (size_t)(wr->vflip ? H - 1 - y : y) * in->stride;         \
            for (uint32_t x = 0; x < W; x++) {                                                     \
                const uint8_t *px = row + (size_t)(wr->hflip ? W - 1 - x : x) * 3;                 \
                if (wr->nchw) {                                                                    \
                    size_t i = (size_t)y * W + x;                                                  \
                    o[i] = VALUE(0, px[0]);                                                        \
                    o[plane + i] = VALUE(1, px[1]);                                                \
                    o[2 * plane + i] = VALUE(2, px[2]);                                            \
                } else {                                                                           \
                    size_t i = ((size_t)y * W + x) * 3;                                            \
                    o[i] = VALUE(0, px[0]);                                                        \
                    o[i + 1] = VALUE(1, px[1]);                                                    \
                    o[i + 2] = VALUE(2, px[2]);                                                    \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define V_U8(c, v)  (v)
#define V_F32(c, v) (wr->lut32[(c)*256 + (v)])
#define V_U16(c, v) (wr->lut16[(c)*256 + (v)])

/* uint8 HWC -> CHW, the default output. The scalar loop does one byte per
 * store; on x86 an SSSE3 path splits 16 pixels (48 bytes) into three 16-byte
 * planes with pshufb, several times faster. Both give the same bytes. */
static void chw_row_scalar(const uint8_t *row, uint32_t x0, uint32_t W, int hflip, uint8_t *r,
                           uint8_t *g, uint8_t *b)
{
    for (uint32_t x = x0; x < W; x++) {
        const uint8_t *px = row + (size_t)(hflip ? W - 1 - x : x) * 3;
        r[x] = px[0];
        g[x] = px[1];
        b[x] = px[2];
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STK_CHW_SSSE3 1

/* m[c][v]: bytes of channel c held by source vector v, moved to their place
 * in the 16-pixel output (0x80 elsewhere, which pshufb turns into 0). */
static void chw_masks(uint8_t m[3][3][16], int reverse)
{
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 3; v++)
            for (int k = 0; k < 16; k++) {
                int idx = 3 * (reverse ? 15 - k : k) + c;
                m[c][v][k] = (uint8_t)(idx >= 16 * v && idx < 16 * v + 16 ? idx - 16 * v : 0x80);
            }
}

__attribute__((target("ssse3"))) static void write_u8_chw_ssse3(const stk__view *in,
                                                                const stk__writer *wr, uint8_t *out)
{
    const uint32_t W = in->w, H = in->h;
    const size_t plane = (size_t)W * H;
    uint8_t mb[3][3][16];
    chw_masks(mb, wr->hflip);
    __m128i m[3][3];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 3; v++)
            m[c][v] = _mm_loadu_si128((const __m128i *)(const void *)mb[c][v]);
    const uint32_t full = W & ~15u;
    for (uint32_t y = 0; y < H; y++) {
        const uint8_t *row = in->p + (size_t)(wr->vflip ? H - 1 - y : y) * in->stride;
        uint8_t *r = out + (size_t)y * W, *g = r + plane, *b = g + plane;
        for (uint32_t x = 0; x < full; x += 16) {
            /* Output pixels x..x+15 come from source pixels x..x+15, or with
             * hflip from W-16-x..W-1-x in reverse (the masks reverse them). */
            const uint8_t *src = row + (size_t)(wr->hflip ? W - 16 - x : x) * 3;
            __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)src);
            __m128i v1 = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
            __m128i v2 = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
            uint8_t *dst[3] = {r + x, g + x, b + x};
            for (int c = 0; c < 3; c++) {
                __m128i o = _mm_or_si128(
                    _mm_or_si128(_mm_shuffle_epi8(v0, m[c][0]), _mm_shuffle_epi8(v1, m[c][1])),
                    _mm_shuffle_epi8(v2, m[c][2]));
                _mm_storeu_si128((__m128i *)(void *)dst[c], o);
            }
        }
        chw_row_scalar(row, full, W, wr->hflip, r, g, b);
    }
}
#else
#define STK_CHW_SSSE3 0
#endif

static void write_u8_chw(const stk__view *in, const stk__writer *wr, uint8_t *out)
{
#if STK_CHW_SSSE3
    if (__builtin_cpu_supports("ssse3")) {
        write_u8_chw_ssse3(in, wr, out);
        return;
    }
#endif
    const uint32_t W = in->w, H = in->h;
    const size_t plane = (size_t)W * H;
    for (uint32_t y = 0; y < H; y++) {
        const uint8_t *row = in->p + (size_t)(wr->vflip ? H - 1 - y : y) * in->stride;
        uint8_t *r = out + (size_t)y * W;
        chw_row_scalar(row, 0, W, wr->hflip, r, r + plane, r + 2 * plane);
    }
}

void stk__write(const stk__view *in, const stk__writer *wr, void *out)
{
    const uint32_t W = in->w, H = in->h;
    if (wr->dtype == STK_DTYPE_UINT8 && !wr->nchw && !wr->hflip) {
        /* The common uint8 HWC case is row copies. */
        uint8_t *o = out;
        for (uint32_t y = 0; y < H; y++)
            memcpy(o + (size_t)y * W * 3, in->p + (size_t)(wr->vflip ? H - 1 - y : y) * in->stride,
                   (size_t)W * 3);
        return;
    }
    if (wr->dtype == STK_DTYPE_UINT8 && wr->nchw) {
        write_u8_chw(in, wr, out);
        return;
    }
    switch (wr->dtype) {
    case STK_DTYPE_FLOAT32: WRITE_LOOP(float, V_F32); break;
    case STK_DTYPE_FLOAT16:
    case STK_DTYPE_BFLOAT16: WRITE_LOOP(uint16_t, V_U16); break;
    default: WRITE_LOOP(uint8_t, V_U8); break;
    }
}

uint16_t stk__f32_to_f16(float f)
{
    return stk__f16_from_f32(f);
}

uint16_t stk__f32_to_bf16(float f)
{
    return stk__bf16_from_f32(f);
}
