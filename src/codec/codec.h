/*
 * codec.h -- image decoders behind a small table of function pointers, the
 * way curl keeps its TLS backends. The pipeline (src/image.c) picks one by
 * sniffing the bytes (never the file name), then drives it in three steps so
 * that it can plan between them:
 *
 *   open()   parses the header: size, whether DCT scaling is possible, EXIF.
 *   start()  commits to a scale and a region; may widen the region (JPEG
 *            aligns to iMCU columns) and says how much temporary memory
 *            read() needs.
 *   read()   writes the region as RGB uint8 into the caller's buffer.
 *   close()  frees everything (safe after any failure, and on NULL).
 *
 * Every step returns STK_OK or a negative STK_E* code with the reason in err.
 * A decoder state belongs to one thread; different states are independent.
 */
#ifndef STK_CODEC_H
#define STK_CODEC_H

#include "internal.h"

typedef struct stk__imginfo {
    uint32_t width, height; /* as stored (before any EXIF orientation) */
    int scalable;           /* 1: start() accepts scales m/8 with m in {1,2,4,8} */
    const uint8_t *exif;    /* TIFF-structured EXIF payload or NULL (asked for only) */
    size_t exif_len;        /* valid until close() */
    int grey;               /* 1: one channel as stored; read() still writes RGB
                             * with the three equal (JPEG only, else 0) */
} stk__imginfo;

typedef struct stk__rect {
    uint32_t x, y, w, h;
} stk__rect;

/* Decoder settings, fixed for a pipeline. */
typedef struct stk__codec_opts {
    /* Also find the EXIF block. */
    int exif;
    /* read() checks the whole compressed stream, not only the part the
     * region needs, so damage anywhere fails the image. */
    int strict;
    /* JPEG: cap on libjpeg's own working memory, which does not go through
     * stk__malloc (0: no cap). */
    size_t max_memory;
    /* Raw images (stk__codec_raw): the shape the source knows, and whether
     * the channels are planes (CHW, CIFAR) or interleaved (HWC). raw_c 0:
     * not raw; the codec is chosen by the bytes' signature. */
    uint32_t raw_h, raw_w, raw_c;
    int raw_chw;
} stk__codec_opts;

typedef struct stk__codec {
    const char *name;
    /* 1 if the bytes start like this format. */
    int (*sniff)(const uint8_t *b, size_t n);
    /* Allocates a state (stk__malloc) and parses the header (o: see
     * stk__codec_opts). On failure *st may be non-NULL: close() it. */
    int (*open)(void **st, const uint8_t *b, size_t n, const stk__codec_opts *o, stk__imginfo *info,
                char *err, size_t errlen);
    /* Output size at scale m/8 (m = 8 for non-scalable codecs). */
    void (*scaled_size)(void *st, unsigned m, uint32_t *w, uint32_t *h);
    /* Commits to scale m/8 and region *r (in scaled pixels, inside the
     * scaled image). May widen r horizontally; sets *tmp_bytes. */
    int (*start)(void *st, unsigned m, stk__rect *r, size_t *tmp_bytes, char *err, size_t errlen);
    /* Writes r->h rows of r->w RGB pixels to dst (row stride in bytes). tmp
     * holds *tmp_bytes bytes. */
    int (*read)(void *st, uint8_t *dst, size_t stride, uint8_t *tmp, char *err, size_t errlen);
    void (*close)(void *st);
} stk__codec;

extern const stk__codec stk__codec_jpeg;
extern const stk__codec stk__codec_png;
extern const stk__codec stk__codec_raw;

/* ---- Encoding (packing with max_side, src/pack/) -------------------------
 * Encodes w x h pixels of c channels (1: grey, 3: RGB; rows packed, no
 * padding) as a baseline JPEG at quality 1..100 with libjpeg's defaults
 * (4:2:0 for RGB, islow DCT, standard tables), so the same pixels always give
 * the same bytes. On success *out (stk__malloc'd, the caller frees it) holds
 * *len bytes. STK_OK, STK_ENOMEM, or STK_EFORMAT with libjpeg's reason in
 * err. Thread-safe: no shared state. */
int stk__jpeg_encode(const uint8_t *px, uint32_t w, uint32_t h, uint32_t c, unsigned quality,
                     uint8_t **out, size_t *len, char *err, size_t errlen);

#endif
