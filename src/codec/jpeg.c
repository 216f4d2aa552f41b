/*
 * jpeg.c -- JPEG through libjpeg-turbo's libjpeg API, crop-aware and DCT
 * scaled.
 *
 * libjpeg reports fatal errors through error_exit, whose default calls
 * exit(): we install our own manager that records the message and longjmps
 * back to the codec entry point that called into libjpeg (each entry point
 * sets its own jump target, since a jmp_buf dies with its frame). Warnings
 * about corrupt or truncated data (libjpeg would carry on and return grey or
 * garbage pixels) are promoted to errors the same way.
 *
 * Decoding matches PIL's defaults (islow IDCT, fancy upsampling), so a full
 * decode is bit-exact with PIL. A region is decoded with jpeg_crop_scanline
 * (widened by one pixel each side, because fancy upsampling of 4:2:0 chroma
 * reads one neighbour column: with the margin the region is exact),
 * jpeg_skip_scanlines above it, and jpeg_abort_decompress after its last row.
 *
 * Memory: libjpeg allocates its working memory through its own allocator
 * (libjpeg-turbo has no allocator hooks), so it is capped instead: its memory
 * manager's max_memory_to_use (the jpeg_memory option). Row buffers are
 * small and bounded by the width (max_dim); what can be large is the
 * whole-image coefficient array of a progressive (or multi-scan) file, about
 * 2 bytes per sample of every component (a 24-megapixel 4:2:0 photo: 72 MB).
 * It is a "virtual array" that libjpeg sizes against the cap, minus what is
 * already allocated, and with no backing store (jmemnobs) a request over the
 * cap fails with JERR_NO_BACKING_STORE: STK_ETOOBIG with the numbers. Freed
 * by jpeg_destroy_decompress in close().
 */
#include "codec/codec.h"
#include "codec/jpeg_restart.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

/* A progressive file can have any number of scans; each costs a pass over
 * the coefficients. Real encoders use about 10; cap it like djpeg -maxscans
 * so a hostile file cannot make one sample take minutes. */
#define MAX_SCANS 500

typedef struct jstate {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr jerr;
    struct jpeg_progress_mgr prog;
    jmp_buf jb;
    int created;
    int code; /* STK_E* of the failure that longjmp'd */
    char msg[JMSG_LENGTH_MAX + 64];
    stk__rect r; /* region committed by start() */
    int cmyk;
    int strict;
    size_t max_memory;
    /* Restart-indexed files (jpeg_restart.h): the index, and the sub-image a
     * crop decodes instead of the whole file, at (dx, dy) in it. */
    stk__rst rst;
    uint8_t *sub;
    uint32_t dx, dy;
    const uint8_t *src; /* the file (the caller keeps it until close) */
    size_t src_len;
} jstate;

static int jpeg_sniff(const uint8_t *b, size_t n)
{
    return n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

static int code_for(int msg_code)
{
    switch (msg_code) {
    case JERR_BAD_PRECISION:
    case JERR_NOT_COMPILED:
    case JERR_NOTIMPL:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_CCIR601_NOTIMPL:
    case JERR_ARITH_NOTIMPL:
    case JERR_SOF_UNSUPPORTED:
    case JERR_BAD_J_COLORSPACE: return STK_EUNSUPPORTED;
    case JERR_OUT_OF_MEMORY: return STK_ENOMEM;
    case JERR_IMAGE_TOO_BIG:
    case JERR_WIDTH_OVERFLOW:
    case JERR_NO_BACKING_STORE: return STK_ETOOBIG;
    default: return STK_EFORMAT;
    }
}

static void fail(j_common_ptr c, int code)
{
    jstate *s = (jstate *)c->client_data;
    char buf[JMSG_LENGTH_MAX];
    c->err->format_message(c, buf);
    stk__fmt(s->msg, sizeof s->msg, "JPEG: %s", buf);
    s->code = code;
    longjmp(s->jb, 1);
}

static void on_error_exit(j_common_ptr c)
{
    jstate *s = (jstate *)c->client_data;
    if (c->err->msg_code == JERR_NO_BACKING_STORE && s->max_memory) {
        j_decompress_ptr d = (j_decompress_ptr)c;
        stk__fmt(s->msg, sizeof s->msg,
                 "JPEG: decoding this %ux%u %s image needs more than the jpeg_memory limit of "
                 "%zu bytes for libjpeg's working memory; raise jpeg_memory",
                 d->image_width, d->image_height,
                 d->progressive_mode ? "progressive" : "multi-scan", s->max_memory);
        s->code = STK_ETOOBIG;
        longjmp(s->jb, 1);
    }
    fail(c, code_for(c->err->msg_code));
}

static void on_emit_message(j_common_ptr c, int level)
{
    if (level >= 0)
        return; /* trace messages */
    switch (c->err->msg_code) {
    case JWRN_ADOBE_XFORM:
    case JWRN_JFIF_MAJOR:
    case JWRN_BOGUS_ICC:
    case JWRN_EXTRANEOUS_DATA:
        /* Harmless oddities: metadata, or stray bytes between two markers,
         * which libjpeg skips (PIL accepts such files, and a few ImageNet
         * images have them): the pixels are fine. */
        return;
    default:
        /* Corrupt/truncated entropy data, bad Huffman codes, premature end
         * of file: the pixels cannot be trusted. */
        fail(c, STK_EFORMAT);
    }
}

static void on_output_message(j_common_ptr c)
{
    (void)c;
}

static void on_progress(j_common_ptr c)
{
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->input_scan_number > MAX_SCANS) {
        jstate *s = (jstate *)c->client_data;
        stk__fmt(s->msg, sizeof s->msg, "JPEG: more than %d progressive scans", MAX_SCANS);
        s->code = STK_EFORMAT;
        longjmp(s->jb, 1);
    }
}

static void copy_err(jstate *s, char *err, size_t errlen)
{
    stk__fmt(err, errlen, "%s", s->msg);
}

static int jpeg_open(void **out, const uint8_t *b, size_t n, const stk__codec_opts *o,
                     stk__imginfo *info, char *err, size_t errlen)
{
    int rc = STK_OK;
    jstate *s = stk__calloc(1, sizeof *s);
    *out = s;
    if (!s) {
        stk__fmt(err, errlen, "out of memory for the JPEG decoder");
        rc = STK_ENOMEM;
        goto out;
    }
    if (n > (size_t)(unsigned long)-1) {
        stk__fmt(err, errlen, "JPEG file too large");
        rc = STK_ETOOBIG;
        goto out;
    }
    s->cinfo.err = jpeg_std_error(&s->jerr);
    s->jerr.error_exit = on_error_exit;
    s->jerr.emit_message = on_emit_message;
    s->jerr.output_message = on_output_message;
    s->cinfo.client_data = s;
    if (setjmp(s->jb)) {
        copy_err(s, err, errlen);
        rc = s->code;
        goto out;
    }
    jpeg_create_decompress(&s->cinfo);
    s->created = 1;
    s->max_memory = o->max_memory;
    if (o->max_memory)
        s->cinfo.mem->max_memory_to_use =
            o->max_memory > (size_t)LONG_MAX ? LONG_MAX : (long)o->max_memory;
    s->prog.progress_monitor = on_progress;
    s->cinfo.progress = &s->prog;
    jpeg_mem_src(&s->cinfo, b, (unsigned long)n);
    s->strict = o->strict;
    if (o->exif)
        jpeg_save_markers(&s->cinfo, JPEG_APP0 + 1, 0xffff);
    jpeg_read_header(&s->cinfo, TRUE);
    /* A restart index that does not match its file is the sample's error, so
     * a lying index can never decode to a wrong image. */
    int found = stk__rst_find(b, n, &s->rst, err, errlen);
    if (found < 0) {
        rc = found;
        goto out;
    }
    s->src = b;
    s->src_len = n;

    switch (s->cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        /* libjpeg-turbo converts all three to RGB itself (grey replicated,
         * as PIL's convert("RGB") does). */
        s->cinfo.out_color_space = JCS_RGB;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        /* libjpeg cannot go straight to RGB from these: decode to CMYK and
         * convert like PIL (see cmyk_row). */
        s->cinfo.out_color_space = JCS_CMYK;
        s->cmyk = 1;
        break;
    default:
        stk__fmt(err, errlen, "JPEG: unsupported colour space (%d components)",
                 s->cinfo.num_components);
        rc = STK_EUNSUPPORTED;
        goto out;
    }
    info->width = s->cinfo.image_width;
    info->height = s->cinfo.image_height;
    info->scalable = 1;
    info->grey = s->cinfo.jpeg_color_space == JCS_GRAYSCALE;
    info->exif = NULL;
    info->exif_len = 0;
    for (jpeg_saved_marker_ptr m = s->cinfo.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length > 6 && !memcmp(m->data, "Exif\0\0", 6)) {
            info->exif = m->data + 6;
            info->exif_len = m->data_length - 6;
            break;
        }
    }
out:
    return rc;
}

static void jpeg_scaled_size(void *st, unsigned m, uint32_t *w, uint32_t *h)
{
    jstate *s = st;
    /* The same rounding as jpeg_calc_output_dimensions (jdiv_round_up). */
    *w = (uint32_t)(((uint64_t)s->cinfo.image_width * m + 7) / 8);
    *h = (uint32_t)(((uint64_t)s->cinfo.image_height * m + 7) / 8);
}

/* For a restart-indexed file: when the region r (scaled pixels at m/8)
 * needs fewer MCUs than the whole image, switches the decoder to the
 * sub-image of the MCU rows and segment columns around it, with one MCU of
 * margin each side (fancy upsampling reads one chroma row and column beyond
 * a pixel; the margin keeps every pixel of r what a whole decode gives), and
 * moves r into the sub-image's coordinates. libjpeg's longjmp lands in the
 * caller's frame. */
static int use_sub(jstate *s, unsigned m, stk__rect *r, char *err, size_t errlen)
{
    const stk__rst *x = &s->rst;
    uint32_t mws = x->mcu_w * m / 8, mhs = x->mcu_h * m / 8;
    if (!mws || !mhs)
        return STK_OK;
    uint32_t x0 = r->x ? r->x - 1 : 0, x1 = r->x + r->w + 1;
    uint32_t r0 = r->y / mhs, r1 = (r->y + r->h + mhs - 1) / mhs;
    uint32_t c0 = x0 / mws, c1 = (x1 + mws - 1) / mws;
    r0 = r0 ? r0 - 1 : 0;
    c0 = c0 ? c0 - 1 : 0;
    r1 = r1 + 1 < x->mcus_h ? r1 + 1 : x->mcus_h;
    c1 = c1 + 1 < x->mcus_w ? c1 + 1 : x->mcus_w;
    c0 -= c0 % x->k;
    c1 = (c1 + x->k - 1) / x->k * x->k;
    if (c1 > x->mcus_w)
        c1 = x->mcus_w;
    if (r0 == 0 && r1 == x->mcus_h && c0 == 0 && c1 == x->mcus_w)
        return STK_OK; /* the whole image: nothing to gain */
    s->sub = stk__malloc(s->src_len);
    if (!s->sub) {
        stk__fmt(err, errlen, "out of memory for a JPEG sub-image");
        return STK_ENOMEM;
    }
    size_t len = 0;
    int rc =
        stk__rst_sub(s->src, s->src_len, x, r0, r1, c0, c1, s->sub, s->src_len, &len, err, errlen);
    if (rc)
        return rc;
    jpeg_abort_decompress(&s->cinfo);
    jpeg_mem_src(&s->cinfo, s->sub, (unsigned long)len);
    jpeg_read_header(&s->cinfo, TRUE);
    s->cinfo.out_color_space = s->cmyk ? JCS_CMYK : JCS_RGB;
    s->dx = c0 * mws;
    s->dy = r0 * mhs;
    r->x -= s->dx;
    r->y -= s->dy;
    return STK_OK;
}

static int jpeg_start(void *st, unsigned m, stk__rect *r, size_t *tmp_bytes, char *err,
                      size_t errlen)
{
    jstate *s = st;
    int rc = STK_OK;
    if (setjmp(s->jb)) {
        copy_err(s, err, errlen);
        rc = s->code;
        goto out;
    }
    /* Strict decoding checks the whole stream: the whole file it is. */
    if (s->rst.nseg && !s->strict && (rc = use_sub(s, m, r, err, errlen)))
        goto out;
    s->cinfo.scale_num = m;
    s->cinfo.scale_denom = 8;
    jpeg_start_decompress(&s->cinfo);
    {
        const uint32_t ow = s->cinfo.output_width;
        uint32_t x0 = r->x, x1 = r->x + r->w;
        if (x1 > ow || r->y + r->h > s->cinfo.output_height || !r->w || !r->h) {
            stk__fmt(err, errlen, "JPEG: region outside the %ux%u image", ow,
                     s->cinfo.output_height);
            rc = STK_EINVAL;
            goto out;
        }
        /* One pixel of margin each side keeps fancy-upsampled chroma exact
         * at the region's edges (see the file comment). */
        if (x0 > 0)
            x0--;
        if (x1 < ow)
            x1++;
        /* A window of one or two columns at the left edge of a 4:2:0 image
         * (one chroma column) comes out of libjpeg-turbo's upsampling
         * different from a whole decode (tests/c/test_restart.c found it):
         * decode at least four columns. */
        if (x1 - x0 < 4)
            x1 = x0 + 4 < ow ? x0 + 4 : ow;
        if (x0 > 0 || x1 < ow) {
            JDIMENSION xoff = x0, cw = x1 - x0;
            jpeg_crop_scanline(&s->cinfo, &xoff, &cw);
            x0 = xoff;
        }
        r->x = x0 + s->dx;
        r->w = s->cinfo.output_width;
        if (r->y > 0) {
            JDIMENSION skipped = jpeg_skip_scanlines(&s->cinfo, r->y);
            if (skipped != r->y) {
                stk__fmt(err, errlen, "JPEG: could not skip to row %u", r->y);
                rc = STK_EFORMAT;
                goto out;
            }
        }
        r->y += s->dy;
        s->r = *r;
        /* CMYK rows are converted from tmp; strict mode reads the image's
         * last row into it. */
        *tmp_bytes = s->cmyk || s->strict ? (size_t)r->w * (size_t)s->cinfo.output_components : 0;
    }
out:
    return rc;
}

/* PIL reads CMYK JPEGs as Adobe-inverted ("CMYK;I") and converts to RGB
 * with R = K' - K'*C/255 in its exact integer form, where C = 255 - stored C
 * and K' = 255 - K = stored K. */
static void cmyk_row(const uint8_t *in, uint8_t *out, uint32_t w)
{
    for (uint32_t x = 0; x < w; x++) {
        int nk = in[4 * x + 3];
        for (int c = 0; c < 3; c++) {
            int v = 255 - in[4 * x + (uint32_t)c];
            int t = v * nk + 128;
            int r = nk - (((t >> 8) + t) >> 8);
            out[3 * x + (uint32_t)c] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
        }
    }
}

static int jpeg_read(void *st, uint8_t *dst, size_t stride, uint8_t *tmp, char *err, size_t errlen)
{
    jstate *s = st;
    int rc = STK_OK;
    if (setjmp(s->jb)) {
        copy_err(s, err, errlen);
        rc = s->code;
        goto out;
    }
    for (uint32_t y = 0; y < s->r.h;) {
        JSAMPROW row = s->cmyk ? tmp : dst + (size_t)y * stride;
        JDIMENSION got = jpeg_read_scanlines(&s->cinfo, &row, 1);
        if (got != 1) {
            stk__fmt(err, errlen, "JPEG: decoder stopped at row %u", s->r.y + y);
            rc = STK_EFORMAT;
            goto out;
        }
        if (s->cmyk)
            cmyk_row(tmp, dst + (size_t)y * stride, s->r.w);
        y++;
    }
    /* Reading to the end checks the tail of the file (a truncated last
     * scan, a missing EOI); a region that ends earlier stops here and leaves
     * the rest of the file unread, which is the point of cropping. Strict
     * mode goes on to the end: jpeg_skip_scanlines runs the entropy decoder
     * over the skipped rows without the IDCT (a progressive file was read
     * whole by jpeg_start_decompress already), but a skip to the very end
     * takes a shortcut that reads nothing, so the last row is read. */
    if (s->strict && s->cinfo.output_scanline < s->cinfo.output_height) {
        JDIMENSION left = s->cinfo.output_height - s->cinfo.output_scanline;
        if (left > 1 && jpeg_skip_scanlines(&s->cinfo, left - 1) != left - 1) {
            stk__fmt(err, errlen, "JPEG: could not skip to the last row");
            rc = STK_EFORMAT;
            goto out;
        }
        JSAMPROW row = tmp;
        if (jpeg_read_scanlines(&s->cinfo, &row, 1) != 1) {
            stk__fmt(err, errlen, "JPEG: decoder stopped at the last row");
            rc = STK_EFORMAT;
            goto out;
        }
    }
    if (s->cinfo.output_scanline >= s->cinfo.output_height)
        jpeg_finish_decompress(&s->cinfo);
    else
        jpeg_abort_decompress(&s->cinfo);
out:
    return rc;
}

static void jpeg_close(void *st)
{
    jstate *s = st;
    if (!s)
        return;
    if (s->created)
        jpeg_destroy_decompress(&s->cinfo);
    stk__free(s->sub);
    stk__free(s);
}

const stk__codec stk__codec_jpeg = {
    "JPEG", jpeg_sniff, jpeg_open, jpeg_scaled_size, jpeg_start, jpeg_read, jpeg_close,
};
