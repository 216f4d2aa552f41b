/*
 * pack.c -- stk_pack (include/stoker.h), behind `stoker pack SRC OUT` and
 * stoker.pack() in Python: writes any dataset stoker can read
 * (ImageFolder tree, WebDataset tars, CIFAR batches, .stk shards, records)
 * as .stk shards plus a manifest (docs/format.md, docs/shards.md).
 *
 * Threads: `threads` workers read and transform samples (the source's read
 * is thread-safe) into a window of slots; the calling thread writes them to
 * the shards strictly in sample order. The bytes of each sample depend only
 * on the sample and the options, and shard boundaries only on those bytes, so
 * the output is byte-identical whatever the thread count. Lock order: one
 * mutex (pack.lock) guards the window; it is never held across I/O, decoding
 * or encoding.
 *
 * Crash safety: the empty marker OUT/.stoker-pack-incomplete exists from
 * before the first shard until after the manifest; each shard is written to
 * NAME.tmp, fsynced and renamed; the manifest last. A reader refuses a
 * directory with the marker and no manifest.
 *
 * Image work (only with --max-side or --raw): JPEG through libjpeg (DCT
 * scaling to the smallest of 1/8, 2/8, 4/8, 8/8 that still covers the target,
 * then an area-average (box) filter to the exact size), PNG through libspng.
 * The box filter is simple and alias-free for reductions; that is enough for
 * packing, where the training pipeline resizes again.
 */
#include "codec/jpeg_restart.h"
#include "pack/pack.h"
#include "source/dataset.h"
#include "source/manifest.h"
#include "source/stkformat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <jpeglib.h>
#include <pthread.h>
#include <setjmp.h>
#include <stddef.h>
#include <spng.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PACK_READ_LIMIT (1u << 30)
#define PACK_ERR        512

/* ---- Small helpers ------------------------------------------------------ */

typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
} bytes;

static int bytes_reserve(bytes *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    size_t c = b->cap ? b->cap : 4096;
    while (c < n)
        c *= 2;
    uint8_t *q = stk__realloc(b->p, c);
    if (!q)
        return -1;
    b->p = q;
    b->cap = c;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Image size from the header alone (JPEG SOF, PNG IHDR); 0x0 if unknown. */
static void sniff_size(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h)
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

/* ---- Decoding ------------------------------------------------------------ */

typedef struct image {
    bytes px; /* HWC uint8 */
    uint32_t w, h, c;
} image;

typedef struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    /* The encoder's output buffer lives here, in memory whose address
     * libjpeg holds, so it is still known after a longjmp and can be freed. */
    unsigned char *mem;
    unsigned long memlen;
} jerr;

static void jerr_exit(j_common_ptr c)
{
    jerr *e = (jerr *)(void *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

/* Corrupt-data warnings are errors: a damaged image is reported, not packed. */
static void jerr_emit(j_common_ptr c, int level)
{
    if (level < 0)
        jerr_exit(c);
}

static int pick_scale(uint32_t w, uint32_t h, uint32_t need_w, uint32_t need_h)
{
    static const int ms[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        uint64_t sw = ((uint64_t)w * (unsigned)ms[k] + 7) / 8;
        uint64_t sh = ((uint64_t)h * (unsigned)ms[k] + 7) / 8;
        if (sw >= need_w && sh >= need_h)
            return ms[k];
    }
    return 8;
}

/* Decodes a JPEG so that the result covers need_w x need_h (0: full size). */
static int decode_jpeg(const uint8_t *b, size_t n, uint32_t need_w, uint32_t need_h, image *im,
                       uint32_t *ow, uint32_t *oh, char *err, size_t errlen)
{
    struct jpeg_decompress_struct cinfo;
    jerr je;
    uint8_t *volatile cmyk = NULL;
    volatile int rc = 0;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    je.pub.emit_message = jerr_emit;
    if (setjmp(je.jb)) {
        stk__fmt(err, errlen, "JPEG: %s", je.msg);
        rc = -1;
        goto out;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, b, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    *ow = cinfo.image_width;
    *oh = cinfo.image_height;
    if ((uint64_t)cinfo.image_width * cinfo.image_height > (1ull << 28)) {
        stk__fmt(err, errlen, "JPEG of %ux%u pixels is too large", cinfo.image_width,
                 cinfo.image_height);
        rc = -1;
        goto out;
    }
    bool is_cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = is_cmyk                                   ? JCS_CMYK
                            : cinfo.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE
                                                                      : JCS_RGB;
    int m = need_w ? pick_scale(cinfo.image_width, cinfo.image_height, need_w, need_h) : 8;
    cinfo.scale_num = (unsigned)m;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    uint32_t w = cinfo.output_width, h = cinfo.output_height;
    uint32_t c = cinfo.out_color_space == JCS_GRAYSCALE ? 1 : 3;
    if (bytes_reserve(&im->px, (size_t)w * h * c)) {
        stk__fmt(err, errlen, "out of memory");
        rc = -1;
        goto out;
    }
    if (is_cmyk && !(cmyk = stk__malloc((size_t)w * 4))) {
        stk__fmt(err, errlen, "out of memory");
        rc = -1;
        goto out;
    }
    while (cinfo.output_scanline < h) {
        uint8_t *row = im->px.p + (size_t)cinfo.output_scanline * w * c;
        JSAMPROW rp = is_cmyk ? cmyk : row;
        jpeg_read_scanlines(&cinfo, &rp, 1);
        if (is_cmyk) {
            /* Adobe writes CMYK inverted: channel * K / 255 gives RGB. */
            for (uint32_t x = 0; x < w; x++) {
                unsigned k = cmyk[4 * x + 3];
                for (int ch = 0; ch < 3; ch++)
                    row[3 * x + (unsigned)ch] =
                        (uint8_t)((cmyk[4 * x + (unsigned)ch] * k + 127) / 255);
            }
        }
    }
    jpeg_finish_decompress(&cinfo);
    im->w = w;
    im->h = h;
    im->c = c;
out:
    jpeg_destroy_decompress(&cinfo);
    stk__free(cmyk);
    return rc;
}

static int decode_png(const uint8_t *b, size_t n, image *im, char *err, size_t errlen)
{
    int rc = -1, e;
    spng_ctx *ctx = spng_ctx_new(0);
    struct spng_ihdr ihdr;
    size_t len;
    if (!ctx) {
        stk__fmt(err, errlen, "out of memory");
        return -1;
    }
    spng_set_image_limits(ctx, 32768, 32768);
    spng_set_chunk_limits(ctx, 64u << 20, 64u << 20);
    if ((e = spng_set_png_buffer(ctx, b, n)) || (e = spng_get_ihdr(ctx, &ihdr)) ||
        (e = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &len))) {
        stk__fmt(err, errlen, "PNG: %s", spng_strerror(e));
        goto out;
    }
    if (len > (1u << 30) || bytes_reserve(&im->px, len)) {
        stk__fmt(err, errlen, "PNG of %ux%u pixels is too large", ihdr.width, ihdr.height);
        goto out;
    }
    if ((e = spng_decode_image(ctx, im->px.p, len, SPNG_FMT_RGB8, 0))) {
        stk__fmt(err, errlen, "PNG: %s", spng_strerror(e));
        goto out;
    }
    im->w = ihdr.width;
    im->h = ihdr.height;
    im->c = 3;
    rc = 0;
out:
    spng_ctx_free(ctx);
    return rc;
}

/* ---- Resizing and encoding ----------------------------------------------- */

/* Area-average resampling weights: output pixel o covers source interval
 * [o*s, (o+1)*s) with s = src/dst; each source pixel contributes its overlap.
 * Stored as (first source index, count) and weights summing to 1. */
typedef struct taps {
    uint32_t *first, *count;
    float *w;
    uint32_t maxc;
} taps;

static int make_taps(taps *t, uint32_t src, uint32_t dst)
{
    double s = (double)src / dst;
    uint32_t maxc = (uint32_t)s + 2;
    t->first = stk__malloc(dst * sizeof *t->first);
    t->count = stk__malloc(dst * sizeof *t->count);
    t->w = stk__malloc((size_t)dst * maxc * sizeof *t->w);
    t->maxc = maxc;
    if (!t->first || !t->count || !t->w)
        return -1;
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
    return 0;
}

static void free_taps(taps *t)
{
    stk__free(t->first);
    stk__free(t->count);
    stk__free(t->w);
}

/* Resizes src (sw x sh x c) into dst (dw x dh x c). */
static int area_resize(const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c, uint8_t *dst,
                       uint32_t dw, uint32_t dh)
{
    int rc = -1;
    taps tx = {0}, ty = {0};
    float *tmp = stk__malloc((size_t)sh * dw * c * sizeof *tmp);
    if (!tmp || make_taps(&tx, sw, dw) || make_taps(&ty, sh, dh))
        goto out;
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
    rc = 0;
out:
    stk__free(tmp);
    free_taps(&tx);
    free_taps(&ty);
    return rc;
}

static int encode_jpeg(const image *im, unsigned quality, bytes *out, char *err, size_t errlen)
{
    struct jpeg_compress_struct cinfo;
    jerr je;
    volatile int rc = 0;
    memset(&cinfo, 0, sizeof cinfo);
    je.mem = NULL;
    je.memlen = 0;
    cinfo.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    if (setjmp(je.jb)) {
        stk__fmt(err, errlen, "JPEG encode: %s", je.msg);
        rc = -1;
        goto out;
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, &je.mem, &je.memlen);
    cinfo.image_width = im->w;
    cinfo.image_height = im->h;
    cinfo.input_components = (int)im->c;
    cinfo.in_color_space = im->c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, (int)quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < im->h) {
        JSAMPROW rp = im->px.p + (size_t)cinfo.next_scanline * im->w * im->c;
        jpeg_write_scanlines(&cinfo, &rp, 1);
    }
    jpeg_finish_compress(&cinfo);
    if (bytes_reserve(out, je.memlen)) {
        stk__fmt(err, errlen, "out of memory");
        rc = -1;
        goto out;
    }
    memcpy(out->p, je.mem, je.memlen);
    out->len = je.memlen;
out:
    jpeg_destroy_compress(&cinfo);
    free(je.mem) /* libjpeg allocated it */;
    return rc;
}

/* ---- The pack job ------------------------------------------------------- */

enum in_kind { IN_IMAGES, IN_CIFAR, IN_RAW_STK, IN_BYTES };

typedef struct slot {
    bytes out;
    int64_t label;
    uint32_t w, h;
    int rc;
    bool done;
    bool indexed; /* restart: the payload carries a restart index */
    char err[PACK_ERR];
} slot;

typedef struct pack {
    const stk_pack_options *o; /* with defaults filled in */
    const char *root;          /* the source path, for sample keys */
    stk__source src;
    int in_kind;
    uint32_t kind;             /* payload kind written */
    uint32_t in_h, in_w, in_c; /* IN_RAW_STK / IN_CIFAR sample shape */
    int images;                /* check as images: 0 none, 1 all, 2 keys with image names */
    slot *slots;
    uint64_t window;
    pthread_mutex_t lock;
    pthread_cond_t cond_space, cond_done;
    uint64_t next, written;
    bool stop;
} pack;

typedef struct worker {
    pack *p;
    unsigned id;
    stk__scratch scratch;
    image im, im2;
} worker;

/* restart: rewrites the JPEG payload in s->out with restart markers and
 * their index (src/codec/jpeg_restart.h), losslessly. A JPEG that cannot be
 * rewritten (12-bit, arithmetic-coded, ...) is kept as it is. */
static int add_restart_index(slot *s)
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
        if (bytes_reserve(&s->out, tn)) {
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

static int make_sample_payload(worker *wk, uint64_t i, slot *s);

/* Produces sample i's payload into s. */
static int make_sample(worker *wk, uint64_t i, slot *s)
{
    int rc = make_sample_payload(wk, i, s);
    if (rc == 0 && wk->p->o->restart)
        rc = add_restart_index(s);
    else
        s->indexed = false;
    return rc;
}

static int make_sample_payload(worker *wk, uint64_t i, slot *s)
{
    pack *p = wk->p;
    const stk_pack_options *o = p->o;
    stk__sink sink = {.grow = &wk->scratch};
    uint8_t *data;
    size_t len;
    int rc = p->src.ops->read(&p->src, i, &sink, &data, &len, &s->label, s->err, sizeof s->err);
    if (rc)
        return rc;
    s->w = s->h = 0;
    image *im = &wk->im;
    if (p->in_kind == IN_BYTES || (p->in_kind == IN_IMAGES && p->kind == STK_PAYLOAD_ENCODED)) {
        if (p->in_kind == IN_IMAGES) {
            char key[4096];
            if (p->images == 2)
                stk__source_key(&p->src, p->root, i, key, sizeof key);
            /* Stored as they are, images are still checked to be images: a
             * text file named .jpg must not reach the shards unnoticed. */
            if ((p->images == 1 || (p->images == 2 && stk__image_name(key))) &&
                stk__check_image(data, len, NULL, s->err, sizeof s->err))
                return STK_EFORMAT;
            sniff_size(data, len, &s->w, &s->h);
        }
        if (bytes_reserve(&s->out, len ? len : 1))
            return STK_ENOMEM;
        memcpy(s->out.p, data, len);
        s->out.len = len;
        return 0;
    }
    /* Pixels: from the shape we know, or by decoding. */
    uint32_t need_w = 0, need_h = 0;
    if (p->kind == STK_PAYLOAD_RAW) {
        need_w = o->raw_w;
        need_h = o->raw_h;
    }
    if (p->in_kind == IN_CIFAR || p->in_kind == IN_RAW_STK) {
        uint32_t H = p->in_h, W = p->in_w, C = p->in_c;
        if (len != (size_t)H * W * C || bytes_reserve(&im->px, len))
            return STK_EFORMAT;
        if (p->in_kind == IN_CIFAR) { /* CHW as stored -> HWC */
            for (uint32_t y = 0; y < H; y++)
                for (uint32_t x = 0; x < W; x++)
                    for (uint32_t ch = 0; ch < C; ch++)
                        im->px.p[((size_t)y * W + x) * C + ch] =
                            data[(size_t)ch * H * W + (size_t)y * W + x];
        } else {
            memcpy(im->px.p, data, len);
        }
        im->w = W;
        im->h = H;
        im->c = C;
        s->w = W;
        s->h = H;
    } else {
        bool jpeg = len >= 3 && data[0] == 0xFF && data[1] == 0xD8;
        bool png = len >= 8 && !memcmp(data, "\x89PNG\r\n\x1a\n", 8);
        if (p->kind == STK_PAYLOAD_RESIZED) {
            uint32_t w0, h0;
            sniff_size(data, len, &w0, &h0);
            if (jpeg && w0 && h0 && w0 <= o->max_side && h0 <= o->max_side) {
                /* Small enough already: keep the original bytes. */
                s->w = w0;
                s->h = h0;
                if (bytes_reserve(&s->out, len))
                    return STK_ENOMEM;
                memcpy(s->out.p, data, len);
                s->out.len = len;
                return 0;
            }
            if (jpeg && w0 && h0) {
                uint64_t mx = w0 > h0 ? w0 : h0;
                need_w = (uint32_t)((uint64_t)w0 * o->max_side / mx);
                need_h = (uint32_t)((uint64_t)h0 * o->max_side / mx);
            }
        }
        if (jpeg) {
            if (decode_jpeg(data, len, need_w, need_h, im, &s->w, &s->h, s->err, sizeof s->err))
                return STK_EFORMAT;
        } else if (png) {
            if (decode_png(data, len, im, s->err, sizeof s->err))
                return STK_EFORMAT;
            s->w = im->w;
            s->h = im->h;
        } else {
            stk__fmt(s->err, sizeof s->err,
                     "cannot decode this image to resize it (only JPEG and PNG are re-encoded)");
            return STK_EUNSUPPORTED;
        }
    }
    /* Target size and channels. */
    uint32_t dw, dh, dc = im->c;
    if (p->kind == STK_PAYLOAD_RAW) {
        dw = o->raw_w;
        dh = o->raw_h;
        dc = o->raw_c;
    } else {
        uint32_t mx = s->w > s->h ? s->w : s->h;
        if (mx <= o->max_side) {
            dw = im->w;
            dh = im->h;
        } else {
            dw = (uint32_t)(((uint64_t)s->w * o->max_side + mx / 2) / mx);
            dh = (uint32_t)(((uint64_t)s->h * o->max_side + mx / 2) / mx);
        }
        if (!dw)
            dw = 1;
        if (!dh)
            dh = 1;
    }
    image *rs = im;
    if (dw != im->w || dh != im->h) {
        rs = &wk->im2;
        if (bytes_reserve(&rs->px, (size_t)dw * dh * im->c) ||
            area_resize(im->px.p, im->w, im->h, im->c, rs->px.p, dw, dh))
            return STK_ENOMEM;
        rs->w = dw;
        rs->h = dh;
        rs->c = im->c;
    }
    if (p->kind == STK_PAYLOAD_RESIZED)
        return encode_jpeg(rs, o->quality, &s->out, s->err, sizeof s->err) ? STK_EFORMAT : 0;
    /* Raw: convert channels into the output buffer. */
    size_t npx = (size_t)dw * dh;
    if (bytes_reserve(&s->out, npx * dc))
        return STK_ENOMEM;
    const uint8_t *sp = rs->px.p;
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
    return 0;
}

static void *worker_main(void *arg)
{
    worker *wk = arg;
    pack *p = wk->p;
    char name[16];
    snprintf(name, sizeof name, "stk-pack-%u", wk->id);
    pthread_setname_np(pthread_self(), name);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->stop && p->next < p->src.count && p->next >= p->written + p->window)
            pthread_cond_wait(&p->cond_space, &p->lock);
        if (p->stop || p->next >= p->src.count) {
            pthread_mutex_unlock(&p->lock);
            break;
        }
        uint64_t i = p->next++;
        slot *s = &p->slots[i % p->window];
        pthread_mutex_unlock(&p->lock);
        s->err[0] = '\0';
        s->rc = make_sample(wk, i, s);
        if (s->rc && !s->err[0])
            stk__fmt(s->err, sizeof s->err, "%s", stk_strerror(s->rc));
        pthread_mutex_lock(&p->lock);
        s->done = true;
        pthread_cond_broadcast(&p->cond_done);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

/* Does dir show a pack that stopped before its manifest: the marker, or a
 * shard still being written? (The .stk reader refuses such a directory.) */
static bool unfinished_pack(const char *dir)
{
    bool found = false;
    DIR *dp = opendir(dir);
    struct dirent *e;
    while (dp && !found && (e = readdir(dp))) {
        size_t l = strlen(e->d_name);
        found = !strcmp(e->d_name, STK_PACK_MARKER) ||
                (l > 8 && !strcmp(e->d_name + l - 8, ".stk.tmp"));
    }
    if (dp)
        closedir(dp);
    return found;
}

/* Resolves p to an absolute path without symbolic links, for a p that need
 * not exist yet: its nearest existing ancestor is resolved and the rest of
 * p appended (with "." and ".." taken lexically). False if nothing resolves. */
static bool resolve_path(const char *p, char *out, size_t n)
{
    char head[4096], rest[4096] = "";
    stk__fmt(head, sizeof head, "%s", p);
    for (;;) {
        char *r = realpath(head[0] ? head : ".", NULL);
        if (r) {
            stk__fmt(out, n, "%s", r);
            free(r);
            break;
        }
        if (errno != ENOENT && errno != ENOTDIR)
            return false;
        /* Move head's last component to the front of rest. */
        size_t l = strlen(head);
        while (l > 1 && head[l - 1] == '/')
            head[--l] = '\0';
        char *slash = strrchr(head, '/');
        if (!head[0] || (slash == head && !slash[1]))
            return false;
        const char *last = slash ? slash + 1 : head;
        char tmp[4096];
        stk__fmt(tmp, sizeof tmp, "%s%s%s", last, rest[0] ? "/" : "", rest);
        stk__fmt(rest, sizeof rest, "%s", tmp);
        if (slash)
            slash[slash == head ? 1 : 0] = '\0';
        else
            head[0] = '\0';
    }
    for (char *c = rest, *next; *c; c = next) {
        next = strchr(c, '/');
        if (next)
            *next++ = '\0';
        else
            next = c + strlen(c);
        if (!*c || !strcmp(c, "."))
            continue;
        if (!strcmp(c, "..")) {
            char *slash = strrchr(out, '/');
            if (slash)
                slash[slash == out ? 1 : 0] = '\0';
        } else {
            size_t l = strlen(out);
            stk__fmt(out + l, n - l, "%s%s", l && out[l - 1] == '/' ? "" : "/", c);
        }
    }
    return true;
}

/* Is path a inside directory b, or b itself? */
static bool path_within(const char *a, const char *b)
{
    size_t n = strlen(b);
    if (n == 1 && b[0] == '/')
        return true;
    return !strncmp(a, b, n) && (a[n] == '\0' || a[n] == '/');
}

/* Refuses an OUT that is SRC or inside it (the shards would land in the
 * dataset being read, which then mixes kinds and no longer opens), and a SRC
 * inside OUT (the shards would land around it). Real paths are compared, so
 * symbolic links and spellings like "a/../a" do not slip through. */
static int check_paths(const char *src, const char *out, char *err, size_t errlen)
{
    char rs[4096], ro[4096];
    struct stat st;
    if (!resolve_path(src, rs, sizeof rs) || !resolve_path(out, ro, sizeof ro))
        return 0; /* the open or mkdir that follows reports what is wrong */
    bool src_dir = stat(rs, &st) == 0 && S_ISDIR(st.st_mode);
    if (!strcmp(rs, ro)) {
        stk__fmt(err, errlen,
                 "OUT %s is the source dataset itself (%s); the shards would be written into "
                 "the dataset being read: choose an OUT outside SRC",
                 out, rs);
        return 1;
    }
    if (src_dir && path_within(ro, rs)) {
        stk__fmt(err, errlen,
                 "OUT %s (%s) is inside the source dataset %s (%s); the shards would be "
                 "written into the dataset being read: choose an OUT outside SRC",
                 out, ro, src, rs);
        return 1;
    }
    if (path_within(rs, ro)) {
        stk__fmt(err, errlen,
                 "the source dataset %s (%s) is inside OUT %s (%s); the shards would be "
                 "written around the dataset being read: choose an OUT that does not hold SRC",
                 src, rs, out, ro);
        return 1;
    }
    return 0;
}

static int check_out_dir(const char *out, bool *created, char *err, size_t errlen)
{
    struct stat st;
    *created = false;
    if (stat(out, &st) != 0) {
        if (mkdir(out, 0755) != 0) {
            stk__fmt(err, errlen, "%s: cannot create: %s", out, strerror(errno));
            return STK_EIO;
        }
        *created = true;
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        stk__fmt(err, errlen, "%s: exists and is not a directory", out);
        return STK_EINVAL;
    }
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, STK_MANIFEST);
    bool manifest = access(path, F_OK) == 0;
    if (!manifest && unfinished_pack(out)) {
        stk__fmt(err, errlen,
                 "%s holds an interrupted pack (no manifest, and the marker %s or a *.stk.tmp "
                 "file is there): its shards are incomplete; remove the directory and run stoker "
                 "pack again",
                 out, STK_PACK_MARKER);
        return STK_EINVAL;
    }
    stk__fmt(path, sizeof path, "%s/part-000000.stk", out);
    bool taken = manifest || access(path, F_OK) == 0;
    if (taken) {
        stk__fmt(err, errlen,
                 "%s already holds a packed dataset; remove it or choose another "
                 "directory",
                 out);
        return STK_EINVAL;
    }
    return 0;
}

/* The output directory's writer lock: a file inside it that a writer (or a
 * pack) holds flock()ed for as long as it writes there, so that a second one
 * is told another writer is at work, instead of taking the live writer's
 * marker for an interrupted pack and being told to remove the directory. The
 * holder removes the file when done, while still holding it; a process that
 * dies loses its flock with it, so a file left behind never blocks anyone.
 * Taking the lock checks that the file locked is still the one at the path:
 * if its holder removed it meanwhile, the next try takes the new file. */
#define OUT_LOCK ".stoker-pack.lock"

/* Creates out if missing (*created) and takes its writer lock into *fd.
 * Leaves a path that is not a directory to check_out_dir, which says so.
 * STK_OK, STK_EBUSY (another writer holds it), STK_EIO. */
static int out_lock(const char *out, bool *created, int *fd, char *err, size_t errlen)
{
    struct stat st;
    *fd = -1;
    if (stat(out, &st) != 0) {
        if (mkdir(out, 0755) == 0)
            *created = true;
        else if (errno != EEXIST) {
            stk__fmt(err, errlen, "%s: cannot create: %s", out, strerror(errno));
            return STK_EIO;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        return STK_OK;
    }
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, OUT_LOCK);
    for (int tries = 0; tries < 64; tries++) {
        int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (f < 0) {
            stk__fmt(err, errlen, "%s: cannot create the writer lock %s: %s", out, path,
                     strerror(errno));
            return STK_EIO;
        }
        if (flock(f, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(f);
            if (e == EWOULDBLOCK) {
                stk__fmt(err, errlen,
                         "%s is in use by another stoker writer or pack, which is still "
                         "writing there (it holds %s); wait for it to finish, or choose another "
                         "directory",
                         out, path);
                return STK_EBUSY;
            }
            stk__fmt(err, errlen, "%s: cannot lock %s: %s", out, path, strerror(e));
            return STK_EIO;
        }
        struct stat a, b;
        if (fstat(f, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            *fd = f;
            return STK_OK;
        }
        close(f); /* removed by its holder after we opened it: take the new one */
    }
    stk__fmt(err, errlen, "%s: cannot take the writer lock %s: it keeps being replaced", out, path);
    return STK_EIO;
}

/* Gives the writer lock back (removing its file first, see out_lock). */
static void out_unlock(const char *out, int *fd)
{
    if (*fd < 0)
        return;
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, OUT_LOCK);
    unlink(path);
    close(*fd);
    *fd = -1;
}

/* The source's name for class c: a folder's class subfolder, the name a .stk
 * dataset's manifest gives; NULL for sources without names. */
static const char *source_class_name(const stk__source *src, uint64_t c)
{
    if (!strcmp(src->ops->kind, "folder"))
        return stk__folder_class_name(src, c);
    if (!strcmp(src->ops->kind, "stk"))
        return stk__stk_class_name(src, c);
    return NULL;
}

/* The manifest stores a class name as the rest of its line: a name with a
 * newline cannot be stored. Says which class, showing the newline as \n. */
static int check_class_name(uint64_t c, const char *name, const char *what, char *err,
                            size_t errlen)
{
    if (!strchr(name, '\n'))
        return STK_OK;
    char shown[256];
    size_t k = 0;
    for (const char *q = name; *q && k + 3 < sizeof shown; q++) {
        if (*q == '\n') {
            shown[k++] = '\\';
            shown[k++] = 'n';
        } else {
            shown[k++] = *q;
        }
    }
    shown[k] = '\0';
    stk__fmt(err, errlen,
             "class %llu: the name \"%s\" contains a newline, which the manifest cannot store "
             "(one record per line, docs/format.md); %s",
             (unsigned long long)c, shown, what);
    return STK_EINVAL;
}

static int set_marker(const char *out, bool on)
{
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, STK_PACK_MARKER);
    if (!on)
        return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    fsync(fd);
    close(fd);
    int dfd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

static unsigned online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
}

/* Decides the input kind and the payload kind. */
static int plan(pack *p, char *err, size_t errlen)
{
    const stk_pack_options *o = p->o;
    stk__dataset_info di;
    stk__source_describe(&p->src, &di);
    const char *kind = p->src.ops->kind;
    p->in_kind = IN_IMAGES;
    if (!strcmp(kind, "cifar")) {
        p->in_kind = IN_CIFAR;
        p->in_h = p->in_w = 32;
        p->in_c = 3;
    } else if (!strcmp(kind, "stk") && di.raw_c) {
        p->in_kind = IN_RAW_STK;
        p->in_h = di.raw_h;
        p->in_w = di.raw_w;
        p->in_c = di.raw_c;
    } else if (!strcmp(kind, "records")) {
        p->in_kind = IN_BYTES;
    }
    p->images = stk__images_of(&p->src);
    if (o->raw_c && o->max_side) {
        stk__fmt(err, errlen, "--raw and --max-side exclude each other");
        return 1;
    }
    if (o->raw_c) {
        if (o->raw_c != 1 && o->raw_c != 3) {
            stk__fmt(err, errlen, "--raw HxWxC needs C = 1 or 3");
            return 1;
        }
        p->kind = STK_PAYLOAD_RAW;
    } else if (o->max_side) {
        p->kind = STK_PAYLOAD_RESIZED;
    } else if (p->in_kind == IN_CIFAR || p->in_kind == IN_RAW_STK) {
        p->kind = STK_PAYLOAD_RAW; /* keep the tensors, as HWC */
    } else {
        p->kind = STK_PAYLOAD_ENCODED;
    }
    if (p->in_kind == IN_BYTES && p->kind != STK_PAYLOAD_ENCODED) {
        stk__fmt(err, errlen, "records are packed as they are (no --raw or --max-side)");
        return 1;
    }
    if (p->in_kind != IN_IMAGES && p->kind == STK_PAYLOAD_RESIZED) {
        stk__fmt(err, errlen,
                 "--max-side applies to encoded images; this input holds raw "
                 "tensors (use --raw HxWxC)");
        return 1;
    }
    return 0;
}


/* The options a caller passed, checked, with the defaults filled in. The
 * first version of the struct ends with progress_user: a smaller struct_size
 * is not one this library knows. */
#define PACK_OPTIONS_V1 (offsetof(stk_pack_options, progress_user) + sizeof(void *))

static int normalize(const stk_pack_options *in, stk_pack_options *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (in) {
        if (in->struct_size < PACK_OPTIONS_V1) {
            stk__fmt(err, errlen,
                     "stk_pack_options.struct_size is %zu, below the first version's %zu "
                     "(set it to sizeof(stk_pack_options))",
                     in->struct_size, (size_t)PACK_OPTIONS_V1);
            return STK_EINVAL;
        }
        memcpy(o, in, in->struct_size < sizeof *o ? in->struct_size : sizeof *o);
    }
    o->struct_size = sizeof *o;
    if (!o->shard_size)
        o->shard_size = 256ull << 20;
    if (!o->quality)
        o->quality = 90;
    if (o->quality > 100) {
        stk__fmt(err, errlen, "quality must be in 1..100, got %u", o->quality);
        return STK_EINVAL;
    }
    if (o->max_side > 65535) {
        stk__fmt(err, errlen, "max_side must be in 1..65535 (0: keep sizes), got %u", o->max_side);
        return STK_EINVAL;
    }
    if ((o->raw_h || o->raw_w || o->raw_c) &&
        (!o->raw_h || !o->raw_w || !o->raw_c || o->raw_h > 65535 || o->raw_w > 65535)) {
        stk__fmt(err, errlen, "raw shape %ux%ux%u: H and W must be in 1..65535 and C 1 or 3",
                 o->raw_h, o->raw_w, o->raw_c);
        return STK_EINVAL;
    }
    if (o->threads > 256) {
        stk__fmt(err, errlen, "threads must be in 0..256 (0: one per online core), got %u",
                 o->threads);
        return STK_EINVAL;
    }
    if (o->align && (o->align < 512 || o->align > (1u << 20) || (o->align & (o->align - 1)))) {
        stk__fmt(err, errlen, "align takes 0 or a power of two in 512..1048576, got %u",
                 o->align);
        return STK_EINVAL;
    }
    if (o->label_bytes > 8 || (o->label_bytes & (o->label_bytes - 1))) {
        stk__fmt(err, errlen, "label_bytes must be 0, 1, 2, 4 or 8, got %u", o->label_bytes);
        return STK_EINVAL;
    }
    if ((o->header_bytes || o->label_bytes) && !o->record_bytes) {
        stk__fmt(err, errlen, "%s applies to record files; give a record size too",
                 o->header_bytes ? "header_bytes" : "label_bytes");
        return STK_EINVAL;
    }
    return STK_OK;
}

/* ---- The shards being written ---------------------------------------------
 * stk_pack and stk_writer write shards the same way: part-NNNNNN.stk, one at
 * a time, each ended when the next payload would take it past shard_size,
 * each recorded in the manifest with its count and size. */
typedef struct shardout {
    const char *dir;
    const stk__stk_header *h;
    uint64_t shard_size, num_classes;
    stk__manifest *man;
    stk__stk_writer *w; /* the shard being written, or NULL */
    size_t cap;         /* entries allocated in man->shards */
    uint64_t bytes;     /* size of the finished shards */
} shardout;

/* Finishes the shard being written and records its count and size. The
 * reason of a failure goes to err. */
static int shardout_end(shardout *so, char *err, size_t errlen)
{
    uint64_t fsize, cnt = stk__stkw_count(so->w);
    int rc = stk__stkw_finish(so->w, so->num_classes, &fsize, err, errlen);
    so->w = NULL;
    if (rc)
        return rc;
    so->man->shards[so->man->nshards - 1].count = cnt;
    so->man->shards[so->man->nshards - 1].bytes = fsize;
    so->bytes += fsize;
    return STK_OK;
}

/* Makes a shard ready for a payload of len bytes: ends the current one when
 * the payload would take it past shard_size (a shard always takes at least
 * one), starts the next one when none is open. The reason of a failure goes
 * to err. */
static int shardout_room(shardout *so, size_t len, char *err, size_t errlen)
{
    int rc;
    if (so->w && stk__stkw_count(so->w) &&
        stk__stkw_payload_bytes(so->w) + len > so->shard_size &&
        (rc = shardout_end(so, err, errlen)))
        return rc;
    if (so->w)
        return STK_OK;
    stk__manifest *m = so->man;
    if (m->nshards == so->cap) {
        size_t cap = so->cap ? 2 * so->cap : 64;
        stk__manifest_shard *q = stk__realloc(m->shards, cap * sizeof *q);
        if (!q) {
            stk__fmt(err, errlen, "out of memory");
            return STK_ENOMEM;
        }
        m->shards = q;
        so->cap = cap;
    }
    char name[64], path[4096];
    snprintf(name, sizeof name, "part-%06zu.stk", m->nshards);
    stk__manifest_shard *ms = &m->shards[m->nshards];
    ms->count = ms->bytes = 0;
    if (!(ms->name = stk__strdup(name))) {
        stk__fmt(err, errlen, "out of memory");
        return STK_ENOMEM;
    }
    m->nshards++;
    stk__fmt(path, sizeof path, "%s/%s", so->dir, name);
    return stk__stkw_open(&so->w, path, so->h, err, errlen);
}

/* Calls the progress callback; nonzero when it asks to stop. */
static int tell(const pack *p, stk_pack_progress *pr, double t0)
{
    if (!p->o->progress)
        return 0;
    pr->seconds = now_s() - t0;
    return p->o->progress(pr, p->o->progress_user);
}

int stk_pack(const char *src, const char *out_dir, const stk_pack_options *opts,
             stk_pack_result *res, char *err, size_t errlen)
{
    int status = STK_EINVAL, rc;
    pack p;
    memset(&p, 0, sizeof p);
    stk_pack_options eff;
    worker *wks = NULL;
    pthread_t *tids = NULL;
    unsigned started = 0;
    stk__manifest man;
    memset(&man, 0, sizeof man);
    shardout so = {.man = &man};
    char why[STK_ERRMSG_MAX], path[4096], key[4096], dummy[1];
    bool locks = false, marker = false, created = false, existed = false;
    int lock_fd = -1;
    uint64_t skipped = 0, indexed = 0;
    double t0 = now_s(), last = 0; /* the first sample done is reported at once */
    stk_pack_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.struct_size = sizeof pr;
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';

    if (!src || !*src || !out_dir || !*out_dir) {
        stk__fmt(err, errlen, "stk_pack needs a source and an output directory");
        goto out;
    }
    if ((status = normalize(opts, &eff, err, errlen)))
        goto out;
    if (res && res->struct_size < offsetof(stk_pack_result, seconds) + sizeof(double)) { /* the first version's size */
        stk__fmt(err, errlen, "stk_pack_result.struct_size is %zu; set it to sizeof(stk_pack_result)",
                 res->struct_size);
        status = STK_EINVAL;
        goto out;
    }
    status = STK_EINVAL;
    p.o = &eff;
    p.root = src;
    const stk_pack_options *o = &eff;
    if (check_paths(src, out_dir, err, errlen))
        goto out;
    stk__source_params sp = {
        .record_bytes = o->record_bytes, .header_bytes = o->header_bytes, .label_bytes = o->label_bytes};
    if ((rc = stk__source_open(&p.src, src, &sp, why, sizeof why))) {
        stk__fmt(err, errlen, "cannot open %s: %s (%s)", src, why, stk_strerror(rc));
        status = rc;
        goto out;
    }
    pr.total = p.src.count;
    if (plan(&p, err, errlen))
        goto out;
    /* Every class name goes into the manifest, so a name it cannot store is
     * refused before anything is written (it used to be left out, and a
     * partial list of names reads as none). */
    for (uint64_t c = 0; c < p.src.num_classes; c++) {
        const char *cn = source_class_name(&p.src, c);
        if (cn && (rc = check_class_name(c, cn, "rename the class folder", err, errlen)))
            goto out;
    }
    if ((rc = out_lock(out_dir, &created, &lock_fd, err, errlen)) ||
        (rc = check_out_dir(out_dir, &existed, err, errlen))) {
        status = rc;
        goto out;
    }
    if (set_marker(out_dir, true)) {
        stk__fmt(err, errlen, "%s: cannot write: %s", out_dir, strerror(errno));
        status = STK_EIO;
        goto out;
    }
    marker = true;
    status = STK_ENOMEM;
    unsigned nt = o->threads ? o->threads : online_cores();
    p.window = (uint64_t)nt * 4 < 16 ? 16 : (uint64_t)nt * 4;
    if (!(p.slots = stk__calloc(p.window, sizeof *p.slots)) ||
        !(wks = stk__calloc(nt, sizeof *wks)) || !(tids = stk__calloc(nt, sizeof *tids)) ||
        (p.src.num_classes &&
         !(man.class_names = stk__calloc(p.src.num_classes, sizeof(char *))))) {
        stk__fmt(err, errlen, "out of memory");
        goto out;
    }
    man.classes = p.src.num_classes;
    man.kind = p.kind;
    man.has_restart = o->restart != 0;
    /* All of the source's class names, those of classes without samples too. */
    for (uint64_t c = 0; c < man.classes; c++) {
        const char *cn = source_class_name(&p.src, c);
        if (cn && !(man.class_names[c] = stk__strdup(cn))) {
            stk__fmt(err, errlen, "out of memory");
            goto out;
        }
    }
    if (pthread_mutex_init(&p.lock, NULL) != 0) {
        stk__fmt(err, errlen, "cannot create a mutex");
        goto out;
    }
    pthread_cond_init(&p.cond_space, NULL);
    stk__cond_init(&p.cond_done); /* monotonic: the writer waits with a timeout */
    locks = true;
    stk__stk_header h = {0};
    h.kind = p.kind;
    h.flags = STK_FLAG_HAS_META | (o->align ? STK_FLAG_ALIGNED : 0);
    h.align = o->align;
    if (p.kind == STK_PAYLOAD_RAW) {
        h.raw_h = o->raw_c ? o->raw_h : p.in_h;
        h.raw_w = o->raw_c ? o->raw_w : p.in_w;
        h.raw_c = o->raw_c ? o->raw_c : p.in_c;
    }
    if (p.kind == STK_PAYLOAD_RESIZED) {
        h.max_side = o->max_side;
        h.quality = o->quality;
    }
    so.dir = out_dir;
    so.h = &h;
    so.shard_size = o->shard_size;
    so.num_classes = p.src.num_classes;
    if (p.kind == STK_PAYLOAD_RAW && !o->raw_c) { /* CIFAR/raw input without a raw shape */
        eff.raw_h = h.raw_h;
        eff.raw_w = h.raw_w;
        eff.raw_c = h.raw_c;
    }
    for (unsigned k = 0; k < nt; k++) {
        wks[k].p = &p;
        wks[k].id = k;
        wks[k].scratch.limit = PACK_READ_LIMIT;
        if (pthread_create(&tids[k], NULL, worker_main, &wks[k]) != 0) {
            stk__fmt(err, errlen, "cannot start thread %u", k);
            goto out;
        }
        started++;
    }
    for (uint64_t i = 0; i < p.src.count; i++) {
        slot *s = &p.slots[i % p.window];
        bool cancel = false;
        pthread_mutex_lock(&p.lock);
        while (!s->done && !cancel) {
            if (!o->progress) {
                pthread_cond_wait(&p.cond_done, &p.lock);
                continue;
            }
            /* A slow sample must not make the caller deaf to its own
             * cancellation: report (and ask) every 100 ms meanwhile. */
            stk__cond_wait_ns(&p.cond_done, &p.lock, 100000000u);
            if (!s->done && now_s() - last >= 0.1) {
                pthread_mutex_unlock(&p.lock);
                last = now_s();
                cancel = tell(&p, &pr, t0) != 0;
                pthread_mutex_lock(&p.lock);
            }
        }
        pthread_mutex_unlock(&p.lock);
        if (cancel)
            goto canceled;
        stk__source_key(&p.src, src, i, key, sizeof key);
        if (s->rc) {
            if (!o->skip_bad) {
                stk__fmt(err, errlen, "sample %" PRIu64 " (%s): %s", i, key, s->err);
                status = s->rc;
                goto out;
            }
            skipped++;
            pr.done = i + 1;
            pr.skipped = skipped;
            pr.skipped_index = i;
            pr.skipped_key = key;
            pr.skipped_reason = s->err;
            cancel = tell(&p, &pr, t0) != 0;
            pr.skipped_key = pr.skipped_reason = NULL;
            if (cancel)
                goto canceled;
        } else {
            indexed += s->indexed;
            if ((rc = shardout_room(&so, s->out.len, why, sizeof why))) {
                stk__fmt(err, errlen, "%s", why);
                status = rc;
                goto out;
            }
            if ((rc = stk__stkw_add(so.w, s->out.p, s->out.len, s->label, key, s->w, s->h, why,
                                    sizeof why))) {
                stk__fmt(err, errlen, "sample %" PRIu64 " (%s): %s", i, key, why);
                status = rc;
                goto out;
            }
            man.samples++;
        }
        pthread_mutex_lock(&p.lock);
        s->done = false;
        p.written++;
        pthread_cond_broadcast(&p.cond_space);
        pthread_mutex_unlock(&p.lock);
        if (o->progress && now_s() - last >= 0.1) {
            last = now_s();
            pr.done = i + 1;
            pr.bytes = so.bytes + (so.w ? stk__stkw_payload_bytes(so.w) : 0);
            pr.shards = man.nshards;
            if (tell(&p, &pr, t0))
                goto canceled;
        }
    }
    if (!so.w) {
        stk__fmt(err, errlen, "no samples to pack (all %" PRIu64 " skipped)", skipped);
        status = STK_EEMPTY;
        goto out;
    }
    if ((rc = shardout_end(&so, why, sizeof why))) {
        stk__fmt(err, errlen, "%s", why);
        status = rc;
        goto out;
    }
    man.restart_indexed = indexed;
    if ((rc = stk__manifest_write(out_dir, &man, why, sizeof why))) {
        stk__fmt(err, errlen, "%s", why);
        status = rc;
        goto out;
    }
    set_marker(out_dir, false);
    marker = false;
    status = STK_OK;
    pr.done = p.src.count;
    pr.skipped = skipped;
    pr.bytes = so.bytes;
    pr.shards = man.nshards;
    /* The pack is complete: a stop asked for now comes too late to matter. */
    (void)tell(&p, &pr, t0);
    if (res) {
        stk_pack_result r = {0};
        r.struct_size = sizeof r;
        r.samples = man.samples;
        r.skipped = skipped;
        r.shards = man.nshards;
        r.bytes = so.bytes;
        r.payload = p.kind;
        r.seconds = now_s() - t0;
        r.restart_indexed = indexed;
        size_t n = res->struct_size < sizeof r ? res->struct_size : sizeof r;
        r.struct_size = n;
        memcpy(res, &r, n);
    }
    goto out;
canceled:
    stk__fmt(err, errlen, "canceled by the progress callback after %" PRIu64 " of %" PRIu64
             " samples; the shards written are removed",
             pr.done, pr.total);
    status = STK_ECANCELED;
out:
    if (locks) {
        pthread_mutex_lock(&p.lock);
        p.stop = true;
        pthread_cond_broadcast(&p.cond_space);
        pthread_mutex_unlock(&p.lock);
    }
    for (unsigned k = 0; k < started; k++)
        pthread_join(tids[k], NULL);
    if (locks) {
        pthread_mutex_destroy(&p.lock);
        pthread_cond_destroy(&p.cond_space);
        pthread_cond_destroy(&p.cond_done);
    }
    stk__stkw_abort(so.w);
    if (status && marker) {
        /* A pack that failed (not one that was killed) takes back what it
         * wrote, so running it again, say with skip_bad, just works. */
        for (size_t k = 0; k < man.nshards; k++) {
            stk__fmt(path, sizeof path, "%s/%s", out_dir, man.shards[k].name);
            unlink(path);
        }
        set_marker(out_dir, false);
    }
    if (out_dir)
        out_unlock(out_dir, &lock_fd);
    if (status && created)
        rmdir(out_dir);
    for (uint64_t k = 0; p.slots && k < p.window; k++)
        stk__free(p.slots[k].out.p);
    stk__free(p.slots);
    for (unsigned k = 0; wks && k < started; k++) {
        stk__scratch_free(&wks[k].scratch);
        stk__free(wks[k].im.px.p);
        stk__free(wks[k].im2.px.p);
    }
    stk__free(wks);
    stk__free(tids);
    for (size_t k = 0; k < man.nshards; k++)
        stk__free(man.shards[k].name);
    stk__free(man.shards);
    for (uint64_t c = 0; man.class_names && c < man.classes; c++)
        stk__free(man.class_names[c]);
    stk__free(man.class_names);
    stk__source_close(&p.src);
    return status;
}

/* ---- stk_writer: samples added one by one ------------------------------- */

struct stk_writer {
    char *dir;
    stk_writer_options o;
    stk__stk_header h;
    stk__manifest man;
    shardout so; /* the shards, the one being written, their bytes */
    double t0;
    bool created, marker, finished, failed;
    int lock_fd; /* the directory's writer lock (out_lock), -1 once given back */
    char err[STK_ERRMSG_MAX];
};

int stk_writer_open(stk_writer **out, const char *dir, const stk_writer_options *opts, char *err,
                    size_t errlen)
{
    char dummy[1];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
    if (!out) {
        stk__fmt(err, errlen, "stk_writer_open needs somewhere to put the writer");
        return STK_EINVAL;
    }
    *out = NULL;
    stk_writer_options o;
    memset(&o, 0, sizeof o);
    if (opts) {
        if (opts->struct_size < offsetof(stk_writer_options, num_classes) + sizeof(uint64_t)) {
            stk__fmt(err, errlen,
                     "stk_writer_options.struct_size is %zu; set it to "
                     "sizeof(stk_writer_options)",
                     opts->struct_size);
            return STK_EINVAL;
        }
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    }
    o.struct_size = sizeof o;
    if (!o.shard_size)
        o.shard_size = 256ull << 20;
    if (!dir || !*dir) {
        stk__fmt(err, errlen, "stk_writer_open needs an output directory");
        return STK_EINVAL;
    }
    if (o.align && (o.align < 512 || o.align > (1u << 20) || (o.align & (o.align - 1)))) {
        stk__fmt(err, errlen, "align takes 0 or a power of two in 512..1048576, got %u", o.align);
        return STK_EINVAL;
    }
    if ((o.raw_h || o.raw_w || o.raw_c) &&
        (!o.raw_h || !o.raw_w || o.raw_h > 65535 || o.raw_w > 65535 ||
         (o.raw_c != 1 && o.raw_c != 3))) {
        stk__fmt(err, errlen, "raw shape %ux%ux%u: H and W must be in 1..65535 and C 1 or 3",
                 o.raw_h, o.raw_w, o.raw_c);
        return STK_EINVAL;
    }
    if (o.num_classes > (1u << 24)) {
        stk__fmt(err, errlen, "num_classes %llu is more than the format's %u",
                 (unsigned long long)o.num_classes, 1u << 24);
        return STK_EINVAL;
    }
    stk_writer *w = stk__calloc(1, sizeof *w);
    if (!w || !(w->dir = stk__strdup(dir)) ||
        (o.num_classes && !(w->man.class_names = stk__calloc(o.num_classes, sizeof(char *))))) {
        if (w)
            stk__free(w->dir);
        stk__free(w);
        stk__fmt(err, errlen, "out of memory");
        return STK_ENOMEM;
    }
    w->o = o;
    w->lock_fd = -1;
    w->t0 = now_s();
    w->man.classes = o.num_classes;
    w->man.kind = o.raw_c ? STK_PAYLOAD_RAW : STK_PAYLOAD_ENCODED;
    w->h.kind = w->man.kind;
    w->h.flags = STK_FLAG_HAS_META | (o.align ? STK_FLAG_ALIGNED : 0);
    w->h.align = o.align;
    w->h.raw_h = o.raw_h;
    w->h.raw_w = o.raw_w;
    w->h.raw_c = o.raw_c;
    w->so = (shardout){.dir = w->dir, .h = &w->h, .shard_size = o.shard_size,
                       .num_classes = o.num_classes, .man = &w->man};
    bool existed = false; /* check_out_dir finds the directory out_lock made */
    int rc = out_lock(dir, &w->created, &w->lock_fd, err, errlen);
    if (!rc)
        rc = check_out_dir(dir, &existed, err, errlen);
    if (!rc && set_marker(dir, true)) {
        stk__fmt(err, errlen, "%s: cannot write: %s", dir, strerror(errno));
        rc = STK_EIO;
    }
    if (rc) {
        out_unlock(dir, &w->lock_fd);
        if (w->created)
            rmdir(dir);
        w->created = false;
        stk_writer_close(w);
        return rc;
    }
    w->marker = true;
    *out = w;
    return STK_OK;
}

int stk_writer_add(stk_writer *w, const void *data, size_t len, int64_t label, const char *key)
{
    if (!w)
        return STK_EINVAL;
    w->err[0] = '\0';
    if (w->finished || w->failed) {
        stk__fmt(w->err, sizeof w->err, "the writer has %s",
                 w->finished ? "finished" : "failed; close it");
        return STK_EMISUSE;
    }
    uint64_t i = w->man.samples;
    if (!data && len) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": no data for %zu bytes", i, len);
        return STK_EINVAL;
    }
    if (label < -1 || (label >= 0 && (uint64_t)label >= w->o.num_classes)) {
        stk__fmt(w->err, sizeof w->err,
                 "sample %" PRIu64 " (%s): label %lld is outside -1..%lld (num_classes %llu)", i,
                 key ? key : "", (long long)label, (long long)w->o.num_classes - 1,
                 (unsigned long long)w->o.num_classes);
        return STK_EINVAL;
    }
    if (key && strlen(key) >= STK_KEY_MAX) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": key of %zu bytes (at most %d)", i,
                 strlen(key), STK_KEY_MAX - 1);
        return STK_EINVAL;
    }
    uint32_t sw = 0, sh = 0;
    if (w->o.raw_c) {
        size_t want = (size_t)w->o.raw_h * w->o.raw_w * w->o.raw_c;
        if (len != want) {
            stk__fmt(w->err, sizeof w->err,
                     "sample %" PRIu64 " (%s): %zu bytes, but a raw %ux%ux%u sample has %zu", i,
                     key ? key : "", len, w->o.raw_h, w->o.raw_w, w->o.raw_c, want);
            return STK_EINVAL;
        }
        sw = w->o.raw_w;
        sh = w->o.raw_h;
    } else {
        sniff_size(data, len, &sw, &sh);
    }
    int rc = STK_OK;
    char why[STK_ERRMSG_MAX];
    if ((rc = shardout_room(&w->so, len, w->err, sizeof w->err)))
        goto fail;
    if ((rc = stk__stkw_add(w->so.w, data, len, label, key, sw, sh, why, sizeof why))) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 " (%s): %s", i, key ? key : "", why);
        goto fail;
    }
    w->man.samples++;
    return STK_OK;
fail:
    w->failed = true;
    return rc;
}

int stk_writer_set_class_name(stk_writer *w, uint64_t c, const char *name)
{
    if (!w)
        return STK_EINVAL;
    w->err[0] = '\0';
    if (w->finished || w->failed) {
        stk__fmt(w->err, sizeof w->err, "the writer has %s",
                 w->finished ? "finished" : "failed; close it");
        return STK_EMISUSE;
    }
    if (c >= w->o.num_classes || !name || !*name || strchr(name, '\n')) {
        stk__fmt(w->err, sizeof w->err,
                 "class %llu: needs a non-empty name without a newline and a class below "
                 "num_classes %llu",
                 (unsigned long long)c, (unsigned long long)w->o.num_classes);
        return STK_EINVAL;
    }
    char *copy = stk__strdup(name);
    if (!copy) {
        stk__fmt(w->err, sizeof w->err, "out of memory");
        return STK_ENOMEM;
    }
    stk__free(w->man.class_names[c]);
    w->man.class_names[c] = copy;
    return STK_OK;
}

int stk_writer_finish(stk_writer *w, stk_pack_result *res)
{
    if (!w)
        return STK_EINVAL;
    w->err[0] = '\0';
    if (w->finished || w->failed) {
        stk__fmt(w->err, sizeof w->err, "the writer has %s",
                 w->finished ? "finished" : "failed; close it");
        return STK_EMISUSE;
    }
    if (res && res->struct_size < offsetof(stk_pack_result, seconds) + sizeof(double)) { /* the first version's size */
        stk__fmt(w->err, sizeof w->err,
                 "stk_pack_result.struct_size is %zu; set it to sizeof(stk_pack_result)",
                 res->struct_size);
        return STK_EINVAL;
    }
    if (!w->so.w) {
        stk__fmt(w->err, sizeof w->err, "%s: no samples were added", w->dir);
        return STK_EEMPTY;
    }
    /* Readers take a dataset's class names all or none (a list with holes
     * cannot say which label a name belongs to once it is a list), so a
     * partial naming is refused here, where it can still be completed. */
    uint64_t named = 0, missing = 0, first_missing = 0;
    for (uint64_t c = 0; w->man.class_names && c < w->man.classes; c++) {
        if (w->man.class_names[c])
            named++;
        else if (!missing++)
            first_missing = c;
    }
    if (named && missing) {
        stk__fmt(w->err, sizeof w->err,
                 "%s: %llu of %llu classes are named, and class %llu%s is not: name every class "
                 "(set_class_name) or none, then finish again",
                 w->dir, (unsigned long long)named, (unsigned long long)w->man.classes,
                 (unsigned long long)first_missing,
                 missing > 1 ? " (with others)" : "");
        return STK_EINVAL;
    }
    int rc = shardout_end(&w->so, w->err, sizeof w->err);
    if (!rc)
        rc = stk__manifest_write(w->dir, &w->man, w->err, sizeof w->err);
    if (rc) {
        w->failed = true;
        return rc;
    }
    set_marker(w->dir, false);
    w->marker = false;
    w->finished = true;
    out_unlock(w->dir, &w->lock_fd);
    if (res) {
        stk_pack_result r = {0};
        r.samples = w->man.samples;
        r.shards = w->man.nshards;
        r.bytes = w->so.bytes;
        r.payload = w->man.kind;
        r.seconds = now_s() - w->t0;
        size_t n = res->struct_size < sizeof r ? res->struct_size : sizeof r;
        r.struct_size = n;
        memcpy(res, &r, n);
    }
    return STK_OK;
}

const char *stk_writer_errmsg(const stk_writer *w)
{
    return w ? w->err : "";
}

void stk_writer_close(stk_writer *w)
{
    if (!w)
        return;
    stk__stkw_abort(w->so.w);
    if (!w->finished && w->marker) {
        char path[4096];
        for (size_t k = 0; k < w->man.nshards; k++) {
            stk__fmt(path, sizeof path, "%s/%s", w->dir, w->man.shards[k].name);
            unlink(path);
        }
        set_marker(w->dir, false);
        out_unlock(w->dir, &w->lock_fd);
        if (w->created)
            rmdir(w->dir);
    }
    out_unlock(w->dir, &w->lock_fd);
    for (size_t k = 0; k < w->man.nshards; k++)
        stk__free(w->man.shards[k].name);
    stk__free(w->man.shards);
    for (uint64_t c = 0; w->man.class_names && c < w->man.classes; c++)
        stk__free(w->man.class_names[c]);
    stk__free(w->man.class_names);
    stk__free(w->dir);
    stk__free(w);
}
