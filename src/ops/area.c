/*
 * area.c -- area-average (box) resampling of c-channel uint8 images
 * (stk__area_resize in ops.h), which packing uses to bring images to
 * max_side or to a raw shape. The float arithmetic below is what the packed
 * bytes of existing datasets were made with: keep it as it is.
 */
#include "ops/ops.h"

/* One axis: for output o, the first source index, how many it reads, and
 * maxc weights (summing to 1) starting at w + o * maxc. */
typedef struct taps {
    uint32_t *first, *count;
    float *w;
    uint32_t maxc;
} taps;

static uint32_t taps_maxc(uint32_t src, uint32_t dst)
{
    return (uint32_t)((double)src / dst) + 2;
}

static size_t taps_bytes(uint32_t src, uint32_t dst)
{
    return (size_t)dst * 2 * sizeof(uint32_t) + (size_t)dst * taps_maxc(src, dst) * sizeof(float);
}

/* Carves the axis's tables from *mem (advancing it) and fills them. */
static void make_taps(taps *t, uint32_t src, uint32_t dst, uint8_t **mem)
{
    double s = (double)src / dst;
    uint32_t maxc = taps_maxc(src, dst);
    t->first = (uint32_t *)(void *)*mem;
    t->count = t->first + dst;
    t->w = (float *)(void *)(t->count + dst);
    t->maxc = maxc;
    *mem += taps_bytes(src, dst);
    for (uint32_t o = 0; o < dst; o++) {
        double a = o * s, b = (o + 1) * s;
        if (s < 1) { /* enlarging: sample the nearest source pixel */
            a = (o + 0.5) * s;
            uint32_t i = (uint32_t)a < src ? (uint32_t)a : src - 1;
            t->first[o] = i;
            t->count[o] = 1;
            t->w[(size_t)o * maxc] = 1;
            continue;
        }
        uint32_t i0 = (uint32_t)a, i1 = (uint32_t)b;
        if (i1 >= src)
            i1 = src - 1;
        uint32_t cnt = 0;
        for (uint32_t i = i0; i <= i1 && cnt < maxc; i++) {
            double lo = i > a ? i : a, hi = i + 1 < b ? i + 1 : b;
            if (hi > lo)
                t->w[(size_t)o * maxc + cnt++] = (float)((hi - lo) / s);
            else if (cnt == 0)
                i0 = i + 1;
        }
        t->first[o] = i0;
        t->count[o] = cnt ? cnt : 1;
        if (!cnt)
            t->w[(size_t)o * maxc] = 1;
    }
}

size_t stk__area_bytes(uint32_t sw, uint32_t sh, uint32_t c, uint32_t dw, uint32_t dh)
{
    return (size_t)sh * dw * c * sizeof(float) + taps_bytes(sw, dw) + taps_bytes(sh, dh);
}

void stk__area_resize(const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c, uint8_t *dst,
                      uint32_t dw, uint32_t dh, void *mem)
{
    taps tx, ty;
    float *tmp = mem;
    uint8_t *m = (uint8_t *)(tmp + (size_t)sh * dw * c);
    make_taps(&tx, sw, dw, &m);
    make_taps(&ty, sh, dh, &m);
    for (uint32_t y = 0; y < sh; y++) {
        const uint8_t *row = src + (size_t)y * sw * c;
        float *trow = tmp + (size_t)y * dw * c;
        for (uint32_t x = 0; x < dw; x++) {
            const float *w = tx.w + (size_t)x * tx.maxc;
            for (uint32_t ch = 0; ch < c; ch++) {
                float acc = 0;
                for (uint32_t k = 0; k < tx.count[x]; k++)
                    acc += w[k] * row[(size_t)(tx.first[x] + k) * c + ch];
                trow[(size_t)x * c + ch] = acc;
            }
        }
    }
    for (uint32_t y = 0; y < dh; y++) {
        const float *w = ty.w + (size_t)y * ty.maxc;
        uint8_t *drow = dst + (size_t)y * dw * c;
        for (size_t x = 0; x < (size_t)dw * c; x++) {
            float acc = 0;
            for (uint32_t k = 0; k < ty.count[y]; k++)
                acc += w[k] * tmp[(size_t)(ty.first[y] + k) * dw * c + x];
            int v = (int)(acc + 0.5f);
            drow[x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}
