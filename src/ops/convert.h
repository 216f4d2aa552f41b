/*
 * convert.h -- the output conversion of an image batch, element by element:
 * uint8 pixels to float32/float16/bfloat16 (ToTensor's x / 255, Normalize's
 * (x - mean) / std), and HWC to NCHW or NHWC.
 *
 * This is the one definition of that math. The CPU path builds its lookup
 * tables from stk__norm_value (image.c), the CPU reference of the device
 * stage and the fake backend run stk__convert_element over a batch, and the
 * CUDA kernel (src/device/kernels.cu) runs the same function, one thread an
 * element. Every operation is an IEEE float32 operation that rounds the same
 * way on both sides (division is correctly rounded in CUDA unless fast math is
 * asked for, which the build never does; there is no a*b+c to contract into a
 * fused multiply-add), so the GPU's output equals the CPU's bit for bit, for
 * every dtype.
 *
 * Plain C99 and CUDA C++ both compile this header: no allocation, no state,
 * no libc beyond memcpy's semantics (done with unions here).
 */
#ifndef STK_OPS_CONVERT_H
#define STK_OPS_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define STK_HD static inline __host__ __device__
#else
#define STK_HD static inline
#endif

/* Element types, as enum stk_dtype in stoker.h (not included here so that
 * nvcc needs nothing but this header). */
#define STK__CV_UINT8    0
#define STK__CV_FLOAT32  1
#define STK__CV_FLOAT16  2
#define STK__CV_BFLOAT16 3

/* One conversion: a batch of n uint8 HWC images of h x w x 3 to n outputs of
 * dtype in NCHW (nchw) or NHWC layout. */
typedef struct stk__convert {
    int dtype;     /* STK__CV_* */
    int nchw;      /* 1: NCHW output, 0: NHWC */
    int scaled;    /* ToTensor/Normalize: x / 255 first */
    int normalize; /* (x - mean[c]) / std[c] */
    float mean[3], std[3];
    uint32_t h, w;
} stk__convert;

STK_HD uint32_t stk__f32_bits(float f)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = f;
    return v.u;
}

/* IEEE binary16 from float32, round to nearest even (as torch's .half());
 * NaN stays NaN, overflow gives infinity. */
STK_HD uint16_t stk__f16_from_f32(float f)
{
    uint32_t x = stk__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;
    if (exp == 0xff) /* infinity stays infinity; NaN keeps a set quiet bit */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* Subnormal half (or zero): shift the full mantissa into place and
         * round to nearest even on the dropped bits. */
        if (e < -10)
            return (uint16_t)sign;
        uint32_t m = man | 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    /* A carry out of the mantissa bumps the exponent, and out of the top
     * exponent it becomes infinity, both of which are right. */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

/* bfloat16 from float32, round to nearest even (as torch's .bfloat16()). */
STK_HD uint16_t stk__bf16_from_f32(float f)
{
    uint32_t x = stk__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* The float value of level v of channel c, in torchvision's order:
 * ToTensor's v / 255, then Normalize's (x - mean) / std, in float32. */
STK_HD float stk__norm_value(const stk__convert *cv, int c, unsigned v)
{
    float f = (float)v;
    if (cv->scaled)
        f = f / 255.0f;
    if (cv->normalize)
        f = (f - cv->mean[c]) / cv->std[c];
    return f;
}

/* Bytes of one element of dtype. */
STK_HD size_t stk__cv_esize(int dtype)
{
    return dtype == STK__CV_FLOAT32 ? 4 : dtype == STK__CV_UINT8 ? 1 : 2;
}

/* Writes output element i (in output order) of the batch at src (n images of
 * h x w x 3, HWC) into dst. */
STK_HD void stk__convert_element(const stk__convert *cv, const uint8_t *src, void *dst, size_t i)
{
    const size_t hw = (size_t)cv->h * cv->w;
    size_t img = i / (hw * 3), rest = i % (hw * 3), pix;
    int c;
    if (cv->nchw) {
        c = (int)(rest / hw);
        pix = rest % hw;
    } else {
        c = (int)(rest % 3);
        pix = rest / 3;
    }
    unsigned v = src[(img * hw + pix) * 3 + (size_t)c];
    switch (cv->dtype) {
    case STK__CV_FLOAT32: ((float *)dst)[i] = stk__norm_value(cv, c, v); break;
    case STK__CV_FLOAT16:
        ((uint16_t *)dst)[i] = stk__f16_from_f32(stk__norm_value(cv, c, v));
        break;
    case STK__CV_BFLOAT16:
        ((uint16_t *)dst)[i] = stk__bf16_from_f32(stk__norm_value(cv, c, v));
        break;
    default: ((uint8_t *)dst)[i] = (uint8_t)v; break;
    }
}

/* The whole conversion of n images on the CPU: the reference the device's
 * kernel is tested against. */
STK_HD void stk__convert_batch(const stk__convert *cv, const uint8_t *src, void *dst, size_t n)
{
    const size_t total = n * cv->h * cv->w * 3;
    for (size_t i = 0; i < total; i++)
        stk__convert_element(cv, src, dst, i);
}

#endif
