/*
 * transform.c -- one sample's payload for stk_pack (stk__pack_transform in
 * pack.h): read it from the source, then keep the bytes, or decode, resize
 * and re-encode or convert.
 *
 * Image work (only with max_side or raw): decoding through src/codec/ (JPEG
 * DCT-scaled to the smallest of 1/8, 2/8, 4/8, 8/8 that still covers the
 * target), then the area-average (box) filter of src/ops/area.c to the exact
 * size, then the JPEG encoder of src/codec/ or the raw layout. The box filter
 * is simple and alias-free for reductions; that is enough for packing, where
 * the training pipeline resizes again. A greyscale JPEG stays one channel
 * until the output (a grey re-encode, or a raw C of the caller's choice).
 *
 * The bytes depend only on the sample and the options, never on the thread
 * or on what the worker's buffers held before: that keeps packs
 * reproducible and the same whatever the thread count.
 */
#include "codec/codec.h"
#include "codec/jpeg_restart.h"
#include "ops/ops.h"
#include "pack/pack.h"
#include "source/dataset.h"

#include <string.h>

#define PACK_MAX_PIXELS (1ull << 28)

int stk__pack_buf_reserve(stk__pack_buf *b, size_t n)
{
    return stk__grow((void **)&b->p, &b->cap, n, 1) ? -1 : 0;
}

void stk__pack_worker_free(stk__pack_worker *wk)
{
    stk__scratch_free(&wk->scratch);
    stk__free(wk->px.p);
    stk__free(wk->px2.p);
    stk__free(wk->tmp.p);
    stk__free(wk->area.p);
}

void stk__pack_sniff_size(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h)
{
    *w = *h = 0;
    if (n >= 24 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8) && !memcmp(b + 12, "IHDR", 4)) {
        *w = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
        *h = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
        return;
    }
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8)
        return;
    size_t k = 2;
    while (k + 4 <= n) {
        if (b[k] != 0xFF) {
            k++;
            continue;
        }
        uint8_t m = b[k + 1];
        if (m == 0xFF) {
            k++;
            continue;
        }
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
            k += 2;
            continue;
        }
        size_t len = (size_t)b[k + 2] << 8 | b[k + 3];
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            if (k + 9 <= n) {
                *h = (uint32_t)b[k + 5] << 8 | b[k + 6];
                *w = (uint32_t)b[k + 7] << 8 | b[k + 8];
            }
            return;
        }
        if (m == 0xDA || len < 2)
            return;
        k += 2 + len;
    }
}

/* Pixels in a worker buffer: w x h x c (c 1 or 3), rows packed. */
typedef struct image {
    stk__pack_buf *buf;
    uint32_t w, h, c;
} image;

static unsigned pick_scale(uint32_t w, uint32_t h, uint32_t need_w, uint32_t need_h)
{
    static const unsigned ms[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        uint64_t sw = ((uint64_t)w * ms[k] + 7) / 8;
        uint64_t sh = ((uint64_t)h * ms[k] + 7) / 8;
        if (sw >= need_w && sh >= need_h)
            return ms[k];
    }
    return 8;
}

/* Decodes a JPEG or PNG (cd) into im so that it covers need_w x need_h (0:
 * full size); *ow x *oh is the size as stored. A decoder's failure is the
 * sample's STK_EFORMAT (STK_ENOMEM stays itself). */
static int decode(const stk__codec *cd, const uint8_t *b, size_t n, uint32_t need_w,
                  uint32_t need_h, stk__pack_worker *wk, image *im, uint32_t *ow, uint32_t *oh,
                  char *err, size_t errlen)
{
    /* strict: damage anywhere fails the image, even where a scaled decode
     * would not look; a damaged image is reported, not packed. */
    const stk__codec_opts co = {.strict = 1};
    stk__imginfo info;
    void *st = NULL;
    int rc = cd->open(&st, b, n, &co, &info, err, errlen);
    if (rc)
        goto out;
    *ow = info.width;
    *oh = info.height;
    if ((uint64_t)info.width * info.height > PACK_MAX_PIXELS) {
        stk__fmt(err, errlen, "%s of %ux%u pixels is too large", cd->name, info.width, info.height);
        rc = STK_EFORMAT;
        goto out;
    }
    unsigned m = info.scalable && need_w ? pick_scale(info.width, info.height, need_w, need_h) : 8;
    stk__rect r = {0, 0, 0, 0};
    cd->scaled_size(st, m, &r.w, &r.h);
    size_t tmp_bytes = 0;
    if ((rc = cd->start(st, m, &r, &tmp_bytes, err, errlen)))
        goto out;
    if (stk__pack_buf_reserve(im->buf, (size_t)r.w * r.h * 3) ||
        stk__pack_buf_reserve(&wk->tmp, tmp_bytes ? tmp_bytes : 1)) {
        stk__fmt(err, errlen, "out of memory for a %ux%u image", r.w, r.h);
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = cd->read(st, im->buf->p, (size_t)r.w * 3, wk->tmp.p, err, errlen)))
        goto out;
    im->w = r.w;
    im->h = r.h;
    im->c = 3;
    if (info.grey) { /* the decoder wrote it as RGB, all three equal */
        uint8_t *p = im->buf->p;
        for (size_t k = 0, np = (size_t)r.w * r.h; k < np; k++)
            p[k] = p[3 * k];
        im->c = 1;
    }
out:
    if (st)
        cd->close(st);
    return rc && rc != STK_ENOMEM ? STK_EFORMAT : rc;
}

static int keep_bytes(stk__pack_sample *s, const uint8_t *data, size_t len)
{
    if (stk__pack_buf_reserve(&s->out, len ? len : 1))
        return STK_ENOMEM;
    memcpy(s->out.p, data, len);
    s->out.len = len;
    return STK_OK;
}

/* The payload as read (records, or images stored as they are); images are
 * still checked to be images: a text file named .jpg must not reach the
 * shards unnoticed. */
static int as_stored(const stk__pack_plan *p, uint64_t i, const uint8_t *data, size_t len,
                     stk__pack_sample *s)
{
    if (p->in_kind == STK__IN_IMAGES) {
        char key[4096];
        if (p->images == 2)
            stk__source_key(p->src, p->root, i, key, sizeof key);
        if ((p->images == 1 || (p->images == 2 && stk__image_name(key))) &&
            stk__check_image(data, len, NULL, s->err, sizeof s->err))
            return STK_EFORMAT;
        stk__pack_sniff_size(data, len, &s->w, &s->h);
    }
    return keep_bytes(s, data, len);
}

/* A tensor sample of the known shape into im, as HWC (CIFAR stores CHW). */
static int from_tensor(const stk__pack_plan *p, const uint8_t *data, size_t len, image *im,
                       stk__pack_sample *s)
{
    uint32_t H = p->in_h, W = p->in_w, C = p->in_c;
    if (len != (size_t)H * W * C || stk__pack_buf_reserve(im->buf, len))
        return STK_EFORMAT;
    uint8_t *px = im->buf->p;
    if (p->in_kind == STK__IN_CIFAR) {
        for (uint32_t y = 0; y < H; y++)
            for (uint32_t x = 0; x < W; x++)
                for (uint32_t ch = 0; ch < C; ch++)
                    px[((size_t)y * W + x) * C + ch] = data[(size_t)ch * H * W + (size_t)y * W + x];
    } else {
        memcpy(px, data, len);
    }
    im->w = s->w = W;
    im->h = s->h = H;
    im->c = C;
    return STK_OK;
}

/* An encoded image into im, decoded large enough for the output. Returns 1
 * when a JPEG already fits max_side and its bytes were kept as they are. */
static int from_encoded(const stk__pack_plan *p, stk__pack_worker *wk, const uint8_t *data,
                        size_t len, image *im, stk__pack_sample *s)
{
    const stk_pack_options *o = p->o;
    bool jpeg = len >= 3 && data[0] == 0xFF && data[1] == 0xD8;
    bool png = len >= 8 && !memcmp(data, "\x89PNG\r\n\x1a\n", 8);
    uint32_t need_w = 0, need_h = 0;
    if (p->kind == STK_PAYLOAD_RAW) {
        need_w = o->raw_w;
        need_h = o->raw_h;
    } else if (jpeg) {
        uint32_t w0, h0;
        stk__pack_sniff_size(data, len, &w0, &h0);
        if (w0 && h0 && w0 <= o->max_side && h0 <= o->max_side) {
            /* Small enough already: keep the original bytes. */
            s->w = w0;
            s->h = h0;
            return keep_bytes(s, data, len) ? STK_ENOMEM : 1;
        }
        if (w0 && h0) {
            uint64_t mx = w0 > h0 ? w0 : h0;
            need_w = (uint32_t)((uint64_t)w0 * o->max_side / mx);
            need_h = (uint32_t)((uint64_t)h0 * o->max_side / mx);
        }
    }
    if (!jpeg && !png) {
        stk__fmt(s->err, sizeof s->err,
                 "cannot decode this image to resize it (only JPEG and PNG are re-encoded)");
        return STK_EUNSUPPORTED;
    }
    return decode(jpeg ? &stk__codec_jpeg : &stk__codec_png, data, len, need_w, need_h, wk, im,
                  &s->w, &s->h, s->err, sizeof s->err);
}

/* The output size: the raw shape, or the stored size s->w x s->h brought
 * within max_side (rounded, at least 1). */
static void target_size(const stk__pack_plan *p, const image *im, const stk__pack_sample *s,
                        uint32_t *dw, uint32_t *dh)
{
    const stk_pack_options *o = p->o;
    if (p->kind == STK_PAYLOAD_RAW) {
        *dw = o->raw_w;
        *dh = o->raw_h;
        return;
    }
    uint32_t mx = s->w > s->h ? s->w : s->h;
    if (mx <= o->max_side) {
        *dw = im->w;
        *dh = im->h;
    } else {
        *dw = (uint32_t)(((uint64_t)s->w * o->max_side + mx / 2) / mx);
        *dh = (uint32_t)(((uint64_t)s->h * o->max_side + mx / 2) / mx);
    }
    if (!*dw)
        *dw = 1;
    if (!*dh)
        *dh = 1;
}

/* Raw output: the pixels of rs with their channels converted to dc. */
static int to_raw(const image *rs, uint32_t dc, stk__pack_sample *s)
{
    size_t npx = (size_t)rs->w * rs->h;
    if (stk__pack_buf_reserve(&s->out, npx * dc))
        return STK_ENOMEM;
    const uint8_t *sp = rs->buf->p;
    for (size_t k = 0; k < npx; k++) {
        const uint8_t *q = sp + k * rs->c;
        uint8_t *d = s->out.p + k * dc;
        if (dc == rs->c)
            memcpy(d, q, dc);
        else if (dc == 1)
            d[0] = (uint8_t)((77u * q[0] + 150u * q[1] + 29u * q[2] + 128) >> 8);
        else
            d[0] = d[1] = d[2] = q[0];
    }
    s->out.len = npx * dc;
    return STK_OK;
}

bool stk__pack_keeps_fields(const stk__source *src)
{
    stk__dataset_info di;
    stk__source_describe(src, &di);
    if (di.payload && !strcmp(di.payload, stk__payload_kind_name(STK_PAYLOAD_FIELDS)))
        return true; /* a .stk dataset of fields: its layout is kept */
    /* Sources whose fields are their one payload and what the reader makes
     * up (a folder's label and path, CIFAR's and records' label) cannot
     * select: only those that store several fields per sample (tar) can. */
    if (!src->ops->fields || !src->ops->select)
        return false;
    size_t images = 0, ints = 0;
    for (size_t k = 0; k < src->nfields; k++) {
        const stk__field_desc *f = &src->fields[k];
        int fk = f->kind ? f->kind : stk_field_kind_for_name(f->name);
        if (f->nocopy)
            continue;
        if (fk == STK_FIELD_IMAGE)
            images++;
        else if (fk == STK_FIELD_INT)
            ints++;
        else
            return true;
    }
    return images > 1 || ints > 1;
}

/* IN_FIELDS: every field the source finds in sample i, as the fields op gives
 * it (bytes as stored, numbers as the text the reader writes); the label is
 * also in the index. */
static int fields_payload(const stk__pack_plan *p, stk__pack_worker *wk, uint64_t i,
                          const uint8_t *data, size_t len, stk__pack_sample *s)
{
    stk__field_set *fs = &wk->fs;
    const stk__source *src = p->src;
    int rc =
        src->ops->fields
            ? src->ops->fields(src, i, data, len, s->label, fs, s->err, sizeof s->err)
            : stk__source_fields_generic(src, i, data, len, s->label, fs, s->err, sizeof s->err);
    if (rc)
        return rc;
    stk__field_ref refs[STK__MAX_FIELDS];
    size_t n = 0;
    for (size_t k = 0; k < fs->n; k++) {
        /* Generated fields too: MDS and LitData deliver their stored
         * numbers as text the reader writes (a label's digits made up from
         * the index come only from sources packed in the old layout). */
        const stk__field_ref *r = &fs->f[k];
        if (r->id < src->nfields && src->fields[r->id].nocopy)
            continue; /* not written (stk__field_desc.nocopy) */
        /* Ids increase in a payload: insert in order, refusing repeats. */
        size_t at = n;
        while (at && refs[at - 1].id > r->id)
            at--;
        if ((at && refs[at - 1].id == r->id) || r->id >= src->nfields) {
            stk__fmt(s->err, sizeof s->err, "field '%s' appears twice in the sample",
                     r->id < src->nfields ? src->fields[r->id].name : "?");
            return STK_EFORMAT;
        }
        memmove(&refs[at + 1], &refs[at], (n - at) * sizeof *refs);
        refs[at] = *r;
        n++;
    }
    s->w = s->h = 0;
    for (size_t k = 0; k < n; k++) {
        const stk__field_desc *f = &src->fields[refs[k].id];
        int fk = f->kind ? f->kind : stk_field_kind_for_name(f->name);
        if (fk == STK_FIELD_IMAGE) {
            stk__pack_sniff_size(refs[k].data, refs[k].len, &s->w, &s->h);
            break;
        }
    }
    for (size_t k = 0; k < n; k++)
        refs[k].id = p->fmap[refs[k].id];
    return stk__pack_fields_payload(&s->out, refs, n, s->err, sizeof s->err);
}

static int make_payload(const stk__pack_plan *p, stk__pack_worker *wk, uint64_t i,
                        stk__pack_sample *s)
{
    stk__sink sink = {.grow = &wk->scratch};
    uint8_t *data;
    size_t len;
    int rc = p->src->ops->read(p->src, i, &sink, &data, &len, &s->label, s->err, sizeof s->err);
    if (rc)
        return rc;
    s->w = s->h = 0;
    if (p->in_kind == STK__IN_FIELDS)
        return fields_payload(p, wk, i, data, len, s);
    if (p->in_kind == STK__IN_BYTES ||
        (p->in_kind == STK__IN_IMAGES && p->kind == STK_PAYLOAD_ENCODED))
        return as_stored(p, i, data, len, s);
    image im = {.buf = &wk->px};
    if (p->in_kind == STK__IN_CIFAR || p->in_kind == STK__IN_RAW_STK)
        rc = from_tensor(p, data, len, &im, s);
    else
        rc = from_encoded(p, wk, data, len, &im, s);
    if (rc)
        return rc == 1 ? STK_OK : rc;
    uint32_t dw, dh;
    target_size(p, &im, s, &dw, &dh);
    image rs = im;
    if (dw != im.w || dh != im.h) {
        rs = (image){.buf = &wk->px2, .w = dw, .h = dh, .c = im.c};
        if (stk__pack_buf_reserve(rs.buf, (size_t)dw * dh * im.c) ||
            stk__pack_buf_reserve(&wk->area, stk__area_bytes(im.w, im.h, im.c, dw, dh)))
            return STK_ENOMEM;
        stk__area_resize(im.buf->p, im.w, im.h, im.c, rs.buf->p, dw, dh, wk->area.p);
    }
    if (p->kind == STK_PAYLOAD_RAW)
        return to_raw(&rs, p->o->raw_c, s);
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    rc = stk__jpeg_encode(rs.buf->p, rs.w, rs.h, rs.c, p->o->quality, &enc, &enc_len, s->err,
                          sizeof s->err);
    if (!rc)
        rc = keep_bytes(s, enc, enc_len);
    stk__free(enc);
    return rc == STK_ENOMEM ? rc : rc ? STK_EFORMAT : STK_OK;
}

/* restart: rewrites the JPEG payload in s->out with restart markers and
 * their index (src/codec/jpeg_restart.h), losslessly. A JPEG that cannot be
 * rewritten (12-bit, arithmetic-coded, ...) is kept as it is. */
static int add_restart_index(stk__pack_sample *s)
{
    s->indexed = false;
    if (s->out.len < 3 || s->out.p[0] != 0xFF || s->out.p[1] != 0xD8)
        return 0;
    uint8_t *t = NULL;
    size_t tn = 0;
    uint32_t k;
    char why[256];
    int rc = stk__rst_transcode(s->out.p, s->out.len, &t, &tn, &k, why, sizeof why);
    if (rc == STK_ENOMEM)
        return rc;
    if (rc == STK_OK) {
        if (stk__pack_buf_reserve(&s->out, tn)) {
            stk__free(t);
            return STK_ENOMEM;
        }
        memcpy(s->out.p, t, tn);
        s->out.len = tn;
        s->indexed = true;
    }
    stk__free(t);
    return 0;
}

void stk__pack_transform(const stk__pack_plan *p, stk__pack_worker *wk, uint64_t i,
                         stk__pack_sample *s)
{
    s->err[0] = '\0';
    s->indexed = false;
    int rc = make_payload(p, wk, i, s);
    if (rc == STK_OK && p->o->restart)
        rc = add_restart_index(s);
    if (rc && !s->err[0])
        stk__fmt(s->err, sizeof s->err, "%s", stk_strerror(rc));
    s->rc = rc;
}
