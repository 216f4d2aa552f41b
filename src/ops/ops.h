/*
 * ops.h -- pixel operations of the image pipeline on RGB uint8 images:
 * antialiased separable resampling with PIL's exact coefficients, constant
 * padding, flips, the final dtype/layout/normalisation writer, and the random
 * parameter samplers of the torchvision transforms.
 *
 * All functions are pure (no allocation, no global state) and safe from any
 * number of threads at once; buffers are provided by the caller (the
 * pipeline carves them from its per-thread scratch).
 */
#ifndef STK_OPS_H
#define STK_OPS_H

#include "internal.h"

/* An RGB uint8 image (3 bytes per pixel, interleaved) that may be a window of
 * a larger buffer: row y starts at p + y * stride. */
typedef struct stk__view {
    uint8_t *p;
    size_t stride;
    uint32_t w, h;
} stk__view;

/* ---- Resampling (PIL's "reduce-aware" bilinear, Image.resize(BILINEAR)) ----
 * One axis of a resize: for each output index, the first input index it reads
 * (bounds[2k]), how many it reads (bounds[2k+1]), and ksize fixed-point
 * weights (coef[k * ksize ...], 22 fractional bits as PIL). */
typedef struct stk__axis {
    int32_t *bounds;
    int32_t *coef;
    uint32_t n;     /* outputs described */
    uint32_t ksize; /* weights stored per output */
    uint32_t taps;  /* when every output reads exactly this many: fixed-length loops */
} stk__axis;

/* Weights per output for resizing the span [in0, in1) to out_size outputs. */
uint32_t stk__axis_ksize(double in0, double in1, uint32_t out_size);
/* Bytes of bounds + coef storage for n outputs of that ksize. */
size_t stk__axis_bytes(uint32_t n, uint32_t ksize);

/* The taps of output xx alone (the first input index and the count); the
 * first index and the end are non-decreasing in xx, so the span a window of
 * outputs reads is known without building the table. */
void stk__axis_bound(uint32_t in_size, double in0, double in1, uint32_t out_size, uint32_t xx,
                     int32_t *first, int32_t *count);
/* Fills ax (whose storage is mem, stk__axis_bytes large) with the weights of
 * outputs [o0, o0 + n) of a resize of the span [in0, in1) of an axis of
 * in_size pixels to out_size pixels, exactly as PIL 9 computes them (taps
 * clamped to [0, in_size)). Taking a window of the outputs gives the same
 * pixels as resizing everything and cropping afterwards. */
void stk__axis_init(stk__axis *ax, void *mem, uint32_t in_size, double in0, double in1,
                    uint32_t out_size, uint32_t o0, uint32_t n);
/* Adds delta to every first-input index (re-bases the axis on a buffer that
 * starts elsewhere). */
void stk__axis_shift(stk__axis *ax, int32_t delta);

/* Horizontal pass: out row r = resample of in row (y0 + r), r < out->h;
 * out->w == ax->n. */
void stk__resample_h(const stk__view *in, uint32_t y0, const stk__axis *ax, const stk__view *out);
/* Vertical pass: out row r reads in rows from ax->bounds; out->h == ax->n,
 * out->w == in->w. */
void stk__resample_v(const stk__view *in, const stk__axis *ax, const stk__view *out);
/* Both passes use AVX2 code where the CPU has it (same results bit for bit);
 * a non-zero `on` makes them use the generic code instead, so tests can
 * compare the two. For tests only: not meant to be flipped while passes run
 * elsewhere (harmless if it is, either path being exact). */
void stk__resize_force_generic(int on);

/* ---- Area-average (box) resampling (packing, src/pack/) -----------------
 * Output pixel o of an axis covers the source interval [o*s, (o+1)*s) with
 * s = src/dst, each source pixel weighted by its overlap (alias-free for
 * reductions); an enlarged axis takes the nearest source pixel. Unlike the
 * functions above it works on c channels (1 or 3), rows packed. The pack
 * format's bytes depend on this arithmetic: do not change it.
 * stk__area_bytes: scratch the resize needs; stk__area_resize writes
 * dw x dh x c bytes to dst using mem (that many bytes, 4-byte aligned). */
size_t stk__area_bytes(uint32_t sw, uint32_t sh, uint32_t c, uint32_t dw, uint32_t dh);
void stk__area_resize(const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c, uint8_t *dst,
                      uint32_t dw, uint32_t dh, void *mem);

/* ---- Geometry ---------------------------------------------------------- */
/* Copies in into out at (left, top) and fills the rest of out with fill. */
void stk__pad(const stk__view *in, const stk__view *out, uint32_t left, uint32_t top,
              const uint8_t fill[3]);
void stk__flip_h(const stk__view *v);
void stk__flip_v(const stk__view *v);
/* A window of v (must lie inside it). */
stk__view stk__crop(const stk__view *v, uint32_t x, uint32_t y, uint32_t w, uint32_t h);

/* ---- Output ------------------------------------------------------------- */
/* How the last stage writes a sample: element type, layout, and a table of
 * the output value of each channel's 256 input levels (float32 bits, or
 * float16/bfloat16 bits; unused for uint8). Flips are folded in here because
 * they are free while writing. */
typedef struct stk__writer {
    int dtype; /* enum stk_dtype */
    int nchw;
    int hflip, vflip;
    const float *lut32;    /* [3][256] when dtype is FLOAT32 */
    const uint16_t *lut16; /* [3][256] when dtype is FLOAT16/BFLOAT16 */
} stk__writer;

size_t stk__dtype_size(int dtype);
/* Writes in to out (in->h * in->w * 3 elements). */
void stk__write(const stk__view *in, const stk__writer *wr, void *out);

/* IEEE binary16 and bfloat16 from float32, round to nearest even (as
 * torch's .half() / .bfloat16()); NaN stays NaN, overflow gives infinity. */
uint16_t stk__f32_to_f16(float f);
uint16_t stk__f32_to_bf16(float f);

/* ---- Random parameters (torchvision 0.14 algorithms) -------------------
 * RandomResizedCrop.get_params on a width x height image: up to 10 attempts of
 * area fraction ~ U(scale) and log aspect ratio ~ U(log ratio), else the
 * centred fallback with the ratio clamped. Writes top, left, h, w; *fallback
 * says whether the fallback was taken (may be NULL). Draws only from rng. */
void stk__rrc_params(stk__rng *rng, uint32_t width, uint32_t height, const double scale[2],
                     const double ratio[2], uint32_t out[4], int *fallback);

#endif
