/* raw.c -- uncompressed images as a codec: CIFAR batches (3x32x32 stored
 * planar, CHW) and raw .stk payloads (HWC uint8, stoker pack --raw), so every
 * transform of the image pipeline runs on them exactly as on a decoded image
 * (same plan, same random draws, same pixels as the same image stored as a
 * PNG). The shape comes from the source, through stk__codec_opts; nothing is
 * sniffed. One or three channels (one is replicated, as for grey JPEGs). */
#include "codec/codec.h"

#include <string.h>

typedef struct rstate {
    const uint8_t *b;
    uint32_t h, w, c;
    int chw;
    stk__rect r;
} rstate;

static int raw_sniff(const uint8_t *b, size_t n)
{
    (void)b;
    (void)n;
    return 0; /* chosen by the source's shape, never by the bytes */
}

static int raw_open(void **out, const uint8_t *b, size_t n, const stk__codec_opts *o,
                    stk__imginfo *info, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t need = (uint64_t)o->raw_h * o->raw_w * o->raw_c;
    if (!o->raw_h || !o->raw_w || (o->raw_c != 1 && o->raw_c != 3)) {
        stk__fmt(err, errlen, "raw image shape %ux%ux%u: 1 or 3 channels", o->raw_h, o->raw_w,
                 o->raw_c);
        return STK_EUNSUPPORTED;
    }
    if (n != need) {
        stk__fmt(err, errlen, "raw sample is %zu bytes; its shape %ux%ux%u needs %llu", n, o->raw_h,
                 o->raw_w, o->raw_c, (unsigned long long)need);
        return STK_EFORMAT;
    }
    rstate *s = stk__calloc(1, sizeof *s);
    if (!s) {
        stk__fmt(err, errlen, "out of memory");
        return STK_ENOMEM;
    }
    s->b = b;
    s->h = o->raw_h;
    s->w = o->raw_w;
    s->c = o->raw_c;
    s->chw = o->raw_chw;
    memset(info, 0, sizeof *info);
    info->width = s->w;
    info->height = s->h;
    info->scalable = 0;
    info->grey = 0;
    *out = s;
    return STK_OK;
}

static void raw_scaled_size(void *st, unsigned m, uint32_t *w, uint32_t *h)
{
    rstate *s = st;
    (void)m; /* not scalable: always 8/8 */
    *w = s->w;
    *h = s->h;
}

static int raw_start(void *st, unsigned m, stk__rect *r, size_t *tmp_bytes, char *err,
                     size_t errlen)
{
    rstate *s = st;
    if (m != 8 || !r->w || !r->h || r->x + r->w > s->w || r->y + r->h > s->h) {
        stk__fmt(err, errlen, "raw image: region outside the %ux%u image", s->w, s->h);
        return STK_EINVAL;
    }
    s->r = *r;
    *tmp_bytes = 0;
    return STK_OK;
}

static int raw_read(void *st, uint8_t *dst, size_t stride, uint8_t *tmp, char *err, size_t errlen)
{
    rstate *s = st;
    (void)tmp;
    (void)err;
    (void)errlen;
    const size_t plane = (size_t)s->h * s->w;
    for (uint32_t y = 0; y < s->r.h; y++) {
        uint8_t *d = dst + (size_t)y * stride;
        size_t row = (size_t)(s->r.y + y) * s->w + s->r.x;
        if (s->c == 1) {
            for (uint32_t x = 0; x < s->r.w; x++)
                d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = s->b[row + x];
        } else if (s->chw) {
            for (uint32_t x = 0; x < s->r.w; x++)
                for (int ch = 0; ch < 3; ch++)
                    d[3 * x + (uint32_t)ch] = s->b[(size_t)ch * plane + row + x];
        } else {
            memcpy(d, s->b + 3 * row, (size_t)s->r.w * 3);
        }
    }
    return STK_OK;
}

static void raw_close(void *st)
{
    stk__free(st);
}

const stk__codec stk__codec_raw = {
    "raw", raw_sniff, raw_open, raw_scaled_size, raw_start, raw_read, raw_close,
};
