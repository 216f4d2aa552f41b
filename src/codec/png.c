/*
 * png.c -- PNG through libspng, every colour type and depth to RGB uint8 as
 * PIL's convert("RGB") does: grey replicated, palette looked up, alpha
 * dropped (not composited), 1/2/4-bit grey scaled to 0..255, 16-bit samples
 * reduced to their high byte. (PIL opens 16-bit grey as mode "I" and clips it
 * to 255 when converting; we take the high byte there too, see
 * docs/images.md.)
 *
 * libspng allocates through our allocator (spng_ctx_new2). Non-interlaced
 * images are decoded row by row, keeping only the rows and columns of the
 * region and stopping after its last row (in strict mode, going on to the
 * last row of the image); interlaced ones (whose rows arrive
 * in seven passes) are decoded whole into the temporary buffer.
 */
#include "codec/codec.h"

#include <string.h>

#include <spng.h>

typedef struct pstate {
    spng_ctx *ctx;
    struct spng_ihdr ihdr;
    stk__rect r;
    int fmt;
    size_t bpp; /* bytes per pixel of fmt */
    int strict;
} pstate;

static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

static int png_sniff(const uint8_t *b, size_t n)
{
    return n >= 8 && !memcmp(b, png_sig, 8);
}

static void *a_malloc(size_t n)
{
    return stk__malloc(n);
}
static void *a_realloc(void *p, size_t n)
{
    return stk__realloc(p, n);
}
static void *a_calloc(size_t c, size_t n)
{
    return stk__calloc(c, n);
}
static void a_free(void *p)
{
    stk__free(p);
}

static int code_for(int e)
{
    switch (e) {
    case SPNG_EMEM: return STK_ENOMEM;
    case SPNG_EUSER_WIDTH:
    case SPNG_EUSER_HEIGHT:
    case SPNG_ECHUNK_LIMITS:
    case SPNG_EOVERFLOW: return STK_ETOOBIG;
    default: return STK_EFORMAT;
    }
}

static int fail(int e, const char *what, char *err, size_t errlen)
{
    stk__fmt(err, errlen, "PNG: %s: %s", what, spng_strerror(e));
    return code_for(e);
}

static int png_open(void **out, const uint8_t *b, size_t n, const stk__codec_opts *o,
                    stk__imginfo *info, char *err, size_t errlen)
{
    int rc = STK_OK, e;
    struct spng_alloc alloc = {a_malloc, a_realloc, a_calloc, a_free};
    pstate *s = stk__calloc(1, sizeof *s);
    *out = s;
    if (!s || !(s->ctx = spng_ctx_new2(&alloc, 0))) {
        stk__fmt(err, errlen, "out of memory for the PNG decoder");
        rc = STK_ENOMEM;
        goto out;
    }
    /* Ancillary chunks (text, ICC...) are not needed for pixels: bound what
     * a hostile file can make the decoder hold. */
    spng_set_chunk_limits(s->ctx, (size_t)1 << 24, (size_t)1 << 26);
    if ((e = spng_set_png_buffer(s->ctx, b, n))) {
        rc = fail(e, "reading", err, errlen);
        goto out;
    }
    if ((e = spng_get_ihdr(s->ctx, &s->ihdr))) {
        rc = fail(e, "bad header", err, errlen);
        goto out;
    }
    info->width = s->ihdr.width;
    info->height = s->ihdr.height;
    info->scalable = 0;
    info->grey = 0;
    info->exif = NULL;
    info->exif_len = 0;
    s->strict = o->strict;
    if (o->exif) {
        struct spng_exif ex;
        if (!spng_get_exif(s->ctx, &ex) && ex.data && ex.length) {
            info->exif = (const uint8_t *)ex.data;
            info->exif_len = ex.length;
        }
    }
out:
    return rc;
}

static void png_scaled_size(void *st, unsigned m, uint32_t *w, uint32_t *h)
{
    pstate *s = st;
    (void)m;
    *w = s->ihdr.width;
    *h = s->ihdr.height;
}

static int png_start(void *st, unsigned m, stk__rect *r, size_t *tmp_bytes, char *err,
                     size_t errlen)
{
    pstate *s = st;
    int rc = STK_OK;
    (void)m;
    if (!r->w || !r->h || r->x + r->w > s->ihdr.width || r->y + r->h > s->ihdr.height) {
        stk__fmt(err, errlen, "PNG: region outside the image");
        rc = STK_EINVAL;
        goto out;
    }
    s->r = *r;
    s->fmt = s->ihdr.bit_depth == 16 ? SPNG_FMT_RGBA16 : SPNG_FMT_RGBA8;
    s->bpp = s->ihdr.bit_depth == 16 ? 8 : 4;
    if (s->ihdr.interlace_method)
        *tmp_bytes = (size_t)s->ihdr.width * s->ihdr.height * s->bpp;
    else
        *tmp_bytes = (size_t)s->ihdr.width * s->bpp;
out:
    return rc;
}

/* Converts columns [x, x + w) of one decoded RGBA8/RGBA16 row to RGB8. */
static void to_rgb(const pstate *s, const uint8_t *row, uint8_t *dst)
{
    if (s->bpp == 4) {
        const uint8_t *p = row + (size_t)s->r.x * 4;
        for (uint32_t i = 0; i < s->r.w; i++) {
            dst[3 * i + 0] = p[4 * i + 0];
            dst[3 * i + 1] = p[4 * i + 1];
            dst[3 * i + 2] = p[4 * i + 2];
        }
    } else {
        /* Host-endian 16-bit samples: keep the high byte, as PIL's
         * "RGB;16B" unpacker does. */
        uint16_t px[4];
        const uint8_t *p = row + (size_t)s->r.x * 8;
        for (uint32_t i = 0; i < s->r.w; i++) {
            memcpy(px, p + 8 * (size_t)i, 8);
            dst[3 * i + 0] = (uint8_t)(px[0] >> 8);
            dst[3 * i + 1] = (uint8_t)(px[1] >> 8);
            dst[3 * i + 2] = (uint8_t)(px[2] >> 8);
        }
    }
}

static int png_read(void *st, uint8_t *dst, size_t stride, uint8_t *tmp, char *err, size_t errlen)
{
    pstate *s = st;
    int rc = STK_OK, e;
    const size_t rowlen = (size_t)s->ihdr.width * s->bpp;
    if (s->ihdr.interlace_method) {
        size_t len = rowlen * s->ihdr.height;
        if ((e = spng_decode_image(s->ctx, tmp, len, s->fmt, 0))) {
            rc = fail(e, "decoding", err, errlen);
            goto out;
        }
        for (uint32_t y = 0; y < s->r.h; y++)
            to_rgb(s, tmp + (size_t)(s->r.y + y) * rowlen, dst + (size_t)y * stride);
        goto out;
    }
    if ((e = spng_decode_image(s->ctx, NULL, 0, s->fmt, SPNG_DECODE_PROGRESSIVE))) {
        rc = fail(e, "decoding", err, errlen);
        goto out;
    }
    /* Rows below the region are decoded only in strict mode, where damage
     * anywhere in the image data must fail it. */
    const uint32_t rows = s->strict ? s->ihdr.height : s->r.y + s->r.h;
    for (uint32_t y = 0; y < rows; y++) {
        e = spng_decode_row(s->ctx, tmp, rowlen);
        /* SPNG_EOI comes with the last row's pixels. */
        if (e && !(e == SPNG_EOI && y + 1 == s->ihdr.height)) {
            rc = fail(e, "decoding", err, errlen);
            goto out;
        }
        if (y >= s->r.y && y < s->r.y + s->r.h)
            to_rgb(s, tmp, dst + (size_t)(y - s->r.y) * stride);
    }
out:
    return rc;
}

static void png_close(void *st)
{
    pstate *s = st;
    if (!s)
        return;
    spng_ctx_free(s->ctx);
    stk__free(s);
}

const stk__codec stk__codec_png = {
    "PNG", png_sniff, png_open, png_scaled_size, png_start, png_read, png_close,
};
