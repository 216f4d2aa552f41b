/* jpeg_restart.c -- restart-indexed JPEG: lossless rewrite with restart
 * markers and a segment index, and sub-image assembly; see jpeg_restart.h. */
#include "codec/jpeg_restart.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#define TAG     "STKRST"
#define TAG_LEN 7 /* with its NUL */
#define VERSION 1
/* Marker payload: tag, version, k, nseg, then the offsets. */
#define IDX_HEAD (TAG_LEN + 1 + 4 + 4)
#define MAX_SEGS ((65535u - 2u - IDX_HEAD) / 4u - 1u)

/* ---- Header walking -------------------------------------------------------- */

typedef struct hdr {
    uint32_t width, height, dri;
    int ncomp, sof;
    int hs[4], vs[4], cid[4];
    /* The first scan codes every component of the frame, each once, over
     * the whole spectrum at full precision: a sequential scan whose MCU is
     * the one mcu_geometry computes. */
    bool full_scan;
    size_t sof_at;          /* offset of the SOF marker */
    size_t apps_end;        /* offset after the APPn/COM markers that follow SOI */
    size_t sos_end;         /* first byte of entropy-coded data */
    size_t idx_at, idx_len; /* our APP15: offset and whole length (0: none) */
} hdr;

static uint32_t be16(const uint8_t *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Walks the markers from SOI to the end of the first SOS header. */
static int parse_header(const uint8_t *b, size_t n, hdr *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8) {
        stk__fmt(err, errlen, "not a JPEG file");
        return STK_EFORMAT;
    }
    size_t i = 2;
    bool apps = true;
    h->apps_end = 2;
    while (i + 4 <= n) {
        if (b[i] != 0xFF) {
            stk__fmt(err, errlen, "JPEG header: no marker at byte %zu", i);
            return STK_EFORMAT;
        }
        while (i + 4 <= n && b[i + 1] == 0xFF)
            i++; /* fill bytes */
        if (i + 4 > n)
            break;
        int m = b[i + 1];
        uint32_t len = be16(b + i + 2);
        if (len < 2 || i + 2 + len > n) {
            stk__fmt(err, errlen, "JPEG header: marker 0x%02X at byte %zu overruns the file", m, i);
            return STK_EFORMAT;
        }
        const uint8_t *p = b + i + 4;
        if ((m >= 0xE0 && m <= 0xEF) || m == 0xFE) {
            if (m == 0xEF && len >= 2 + IDX_HEAD && !memcmp(p, TAG, TAG_LEN)) {
                h->idx_at = i;
                h->idx_len = 2 + len;
            }
            if (apps)
                h->apps_end = i + 2 + len;
        } else {
            apps = false;
        }
        if (m == 0xC0 || m == 0xC1 || m == 0xC2) {
            if (len < 8 || p[0] != 8 || len != 8u + 3u * p[5] || p[5] < 1 || p[5] > 4) {
                stk__fmt(err, errlen, "JPEG header: unsupported or malformed frame header");
                return STK_EUNSUPPORTED;
            }
            h->sof = m;
            h->sof_at = i;
            h->height = be16(p + 1);
            h->width = be16(p + 3);
            h->ncomp = p[5];
            for (int c = 0; c < h->ncomp; c++) {
                h->cid[c] = p[6 + 3 * c];
                h->hs[c] = p[6 + 3 * c + 1] >> 4;
                h->vs[c] = p[6 + 3 * c + 1] & 15;
                if (h->hs[c] < 1 || h->hs[c] > 4 || h->vs[c] < 1 || h->vs[c] > 4) {
                    stk__fmt(err, errlen, "JPEG header: bad sampling factors");
                    return STK_EFORMAT;
                }
            }
        } else if ((m >= 0xC3 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)) {
            stk__fmt(err, errlen,
                     "JPEG: lossless, hierarchical or arithmetic-coded frame "
                     "(SOF 0x%02X)",
                     m);
            return STK_EUNSUPPORTED;
        } else if (m == 0xDD && len == 4) {
            h->dri = be16(p);
        } else if (m == 0xDA) {
            if (!h->sof_at) {
                stk__fmt(err, errlen, "JPEG header: scan before the frame header");
                return STK_EFORMAT;
            }
            h->sos_end = i + 2 + len;
            /* Ns, Ns (selector, tables) pairs, Ss, Se, Ah|Al. */
            uint32_t ns = p[0];
            if (ns == (uint32_t)h->ncomp && len == 6u + 2u * ns) {
                const uint8_t *q = p + 1 + 2 * ns;
                unsigned seen = 0;
                bool once = true;
                for (uint32_t j = 0; j < ns; j++) {
                    unsigned hit = 0;
                    for (int c = 0; c < h->ncomp; c++)
                        if (p[1 + 2 * j] == h->cid[c])
                            hit |= 1u << c;
                    once = once && hit && !(hit & (hit - 1)) && !(seen & hit);
                    seen |= hit;
                }
                h->full_scan = once && q[0] == 0 && q[1] == 63 && q[2] == 0;
            }
            return STK_OK;
        }
        i += 2 + len;
    }
    stk__fmt(err, errlen, "JPEG header: no scan");
    return STK_EFORMAT;
}

/* MCU geometry of a single interleaved scan (one block for one component). */
static void mcu_geometry(const hdr *h, uint32_t *mw, uint32_t *mh)
{
    int maxh = 1, maxv = 1;
    for (int c = 0; c < h->ncomp; c++) {
        maxh = h->hs[c] > maxh ? h->hs[c] : maxh;
        maxv = h->vs[c] > maxv ? h->vs[c] : maxv;
    }
    if (h->ncomp == 1) {
        /* A non-interleaved scan: an MCU is one block of the component. */
        *mw = (uint32_t)(8 * maxh / h->hs[0]);
        *mh = (uint32_t)(8 * maxv / h->vs[0]);
    } else {
        *mw = (uint32_t)(8 * maxh);
        *mh = (uint32_t)(8 * maxv);
    }
}

/* The restart interval for a row of w MCUs: about four segments a row, on a
 * divisor of w so no segment straddles two rows. Each segment costs a 2-byte
 * marker, up to 7 bits of padding, 4 bytes of index and an absolute DC value
 * per component; four a row kept the size within 1 % on ImageNet-like files
 * (docs/images.md) while letting a crop skip the MCUs left and right of it. */
static uint32_t choose_k(uint32_t w)
{
    if (w <= 4)
        return w;
    uint32_t want = (w + 3) / 4;
    for (uint32_t k = want; k < w; k++)
        if (w % k == 0)
            return k;
    return w;
}

/* ---- Transcoding ---------------------------------------------------------------- */

typedef struct tc_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} tc_err;

static void tc_error_exit(j_common_ptr c)
{
    tc_err *e = (tc_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

static void tc_emit(j_common_ptr c, int level)
{
    /* A warning about corrupt data would otherwise be copied into the
     * rewritten file unnoticed: fail instead. */
    if (level < 0 && c->err->msg_code != JWRN_ADOBE_XFORM && c->err->msg_code != JWRN_JFIF_MAJOR &&
        c->err->msg_code != JWRN_BOGUS_ICC && c->err->msg_code != JWRN_EXTRANEOUS_DATA)
        tc_error_exit(c);
}

/* The encoder's messages: a warning (level < 0) means the rewrite cannot be
 * trusted, so it fails; trace messages (level >= 0) are information and go
 * nowhere. libjpeg's default would print them on stderr from inside the
 * library, whatever the caller's --quiet: JTRC_16BIT_TABLES ("Caution:
 * quantization tables are too coarse for baseline JPEG") comes at level 0
 * for every image whose quantization tables do not fit in 8 bits, which is
 * then written as SOF1 (extended sequential), as its input was. */
static void tc_emit_encoder(j_common_ptr c, int level)
{
    if (level < 0)
        tc_error_exit(c);
}

/* Nothing libjpeg formats is printed: errors reach the caller's message
 * through tc_error_exit, everything else is dropped above. */
static void tc_output_message(j_common_ptr c)
{
    (void)c;
}

/* Finds each segment's first byte in the entropy-coded data of b from pos,
 * into offs[0..nseg], offs[nseg] = the EOI marker. STK_OK or STK_EFORMAT. */
static int scan_segments(const uint8_t *b, size_t n, size_t pos, uint32_t nseg, uint32_t *offs,
                         char *err, size_t errlen)
{
    uint32_t s = 0;
    offs[s++] = (uint32_t)pos;
    for (size_t i = pos; i + 1 < n; i++) {
        if (b[i] != 0xFF)
            continue;
        uint8_t m = b[i + 1];
        if (m == 0x00 || m == 0xFF)
            continue;
        if (m >= 0xD0 && m <= 0xD7) {
            if (s >= nseg || m != 0xD0 + ((s - 1) & 7)) {
                stk__fmt(err, errlen, "restart marker %u out of place", s);
                return STK_EFORMAT;
            }
            offs[s++] = (uint32_t)(i + 2);
            i++;
            continue;
        }
        if (m == 0xD9 && s == nseg) {
            offs[s] = (uint32_t)i;
            return STK_OK;
        }
        stk__fmt(err, errlen, "unexpected marker 0x%02X in the scan (segment %u of %u)", m, s,
                 nseg);
        return STK_EFORMAT;
    }
    stk__fmt(err, errlen, "the scan ends after %u of %u restart segments", s, nseg);
    return STK_EFORMAT;
}

int stk__rst_transcode(const uint8_t *in, size_t n, uint8_t **out, size_t *out_len, uint32_t *kout,
                       char *err, size_t errlen)
{
    struct jpeg_decompress_struct d;
    struct jpeg_compress_struct c;
    tc_err de, ce;
    unsigned char *buf = NULL;
    unsigned long blen = 0;
    uint32_t *volatile offs = NULL;
    int rc = STK_OK;
    volatile int dmade = 0, cmade = 0;
    *out = NULL;
    *out_len = 0;
    memset(&d, 0, sizeof d);
    memset(&c, 0, sizeof c);
    d.err = jpeg_std_error(&de.pub);
    de.pub.error_exit = tc_error_exit;
    de.pub.emit_message = tc_emit;
    de.pub.output_message = tc_output_message;
    c.err = jpeg_std_error(&ce.pub);
    ce.pub.error_exit = tc_error_exit;
    ce.pub.emit_message = tc_emit_encoder;
    ce.pub.output_message = tc_output_message;
    if (setjmp(de.jb)) {
        stk__fmt(err, errlen, "JPEG: %s", de.msg);
        rc = STK_EFORMAT;
        goto out;
    }
    if (setjmp(ce.jb)) {
        stk__fmt(err, errlen, "JPEG rewrite: %s", ce.msg);
        rc = STK_EUNSUPPORTED;
        goto out;
    }
    jpeg_create_decompress(&d);
    dmade = 1;
    jpeg_mem_src(&d, in, (unsigned long)n);
    jpeg_save_markers(&d, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++)
        jpeg_save_markers(&d, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&d, TRUE);
    if (d.data_precision != 8 || d.arith_code || d.num_components > 4 || d.num_components == 2) {
        stk__fmt(err, errlen, "JPEG: %d-bit, %s, %d components: not rewritten", d.data_precision,
                 d.arith_code ? "arithmetic-coded" : "Huffman-coded", d.num_components);
        rc = STK_EUNSUPPORTED;
        goto out;
    }
    jvirt_barray_ptr *coef = jpeg_read_coefficients(&d);
    hdr h = {.width = d.image_width, .height = d.image_height, .ncomp = d.num_components};
    for (int k = 0; k < d.num_components; k++) {
        h.hs[k] = d.comp_info[k].h_samp_factor;
        h.vs[k] = d.comp_info[k].v_samp_factor;
    }
    uint32_t mw, mh;
    mcu_geometry(&h, &mw, &mh);
    uint32_t mcus_w = (h.width + mw - 1) / mw, mcus_h = (h.height + mh - 1) / mh;
    uint32_t k = choose_k(mcus_w);
    uint64_t nseg = (uint64_t)mcus_w / k * mcus_h;
    if (nseg > MAX_SEGS) {
        stk__fmt(err, errlen, "JPEG: %llu restart segments do not fit in one index marker",
                 (unsigned long long)nseg);
        rc = STK_EUNSUPPORTED;
        goto out;
    }
    jpeg_create_compress(&c);
    cmade = 1;
    jpeg_mem_dest(&c, &buf, &blen);
    jpeg_copy_critical_parameters(&d, &c);
    c.restart_interval = k;
    c.optimize_coding = TRUE; /* smaller Huffman tables: lossless, pays for the markers */
    jpeg_write_coefficients(&c, coef);
    for (jpeg_saved_marker_ptr m = d.marker_list; m; m = m->next) {
        /* libjpeg writes its own JFIF and Adobe markers; an old index goes. */
        if (c.write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
            !memcmp(m->data, "JFIF", 5))
            continue;
        if (c.write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
            !memcmp(m->data, "Adobe", 5))
            continue;
        if (m->marker == JPEG_APP0 + 15 && m->data_length >= TAG_LEN &&
            !memcmp(m->data, TAG, TAG_LEN))
            continue;
        jpeg_write_marker(&c, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&c);
    jpeg_finish_decompress(&d);

    /* Index the rewritten file, then insert the index after its APPn markers
     * (every offset moves by the marker's length). */
    hdr o;
    if ((rc = parse_header(buf, blen, &o, err, errlen)))
        goto out;
    if (o.dri != k || o.width != h.width || o.height != h.height) {
        stk__fmt(err, errlen, "JPEG rewrite: unexpected header");
        rc = STK_EFORMAT;
        goto out;
    }
    offs = stk__malloc(((size_t)nseg + 1) * sizeof *offs);
    if (!offs) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = scan_segments(buf, blen, o.sos_end, (uint32_t)nseg, (uint32_t *)offs, err, errlen)))
        goto out;
    size_t mlen = 2 + 2 + IDX_HEAD + 4 * ((size_t)nseg + 1);
    uint8_t *res = stk__malloc(blen + mlen);
    if (!res) {
        rc = STK_ENOMEM;
        goto out;
    }
    size_t at = o.apps_end;
    memcpy(res, buf, at);
    uint8_t *p = res + at;
    p[0] = 0xFF;
    p[1] = 0xEF;
    p[2] = (uint8_t)((mlen - 2) >> 8);
    p[3] = (uint8_t)(mlen - 2);
    memcpy(p + 4, TAG, TAG_LEN);
    p[4 + TAG_LEN] = VERSION;
    put_le32(p + 4 + TAG_LEN + 1, k);
    put_le32(p + 4 + TAG_LEN + 5, (uint32_t)nseg);
    for (uint32_t s = 0; s <= nseg; s++)
        put_le32(p + 4 + IDX_HEAD + 4 * (size_t)s, offs[s] + (uint32_t)mlen);
    memcpy(res + at + mlen, buf + at, blen - at);
    *out = res;
    *out_len = blen + mlen;
    if (kout)
        *kout = k;
out:
    if (cmade)
        jpeg_destroy_compress(&c);
    if (dmade)
        jpeg_destroy_decompress(&d);
    free(buf);
    stk__free((uint32_t *)offs);
    return rc;
}

/* ---- Reading the index ------------------------------------------------------------ */

int stk__rst_find(const uint8_t *b, size_t n, stk__rst *x, char *err, size_t errlen)
{
    hdr h;
    memset(x, 0, sizeof *x);
    if (parse_header(b, n, &h, err, errlen) != STK_OK)
        return 0; /* not ours to judge: the decoder says what is wrong */
    if (!h.idx_at)
        return 0;
    const uint8_t *p = b + h.idx_at + 4;
    size_t plen = h.idx_len - 4;
    x->k = le32(p + TAG_LEN + 1);
    x->nseg = le32(p + TAG_LEN + 5);
    mcu_geometry(&h, &x->mcu_w, &x->mcu_h);
    x->width = h.width;
    x->height = h.height;
    x->mcus_w = (h.width + x->mcu_w - 1) / x->mcu_w;
    x->mcus_h = (h.height + x->mcu_h - 1) / x->mcu_h;
    x->offs = p + IDX_HEAD;
    const char *why = NULL;
    /* The index's premise: the entropy-coded data is one scan of restart
     * segments from the first SOS to EOI, each holding k whole MCUs of every
     * component. A progressive file, or a sequential one whose first scan
     * leaves a component to a later scan, would have its sub-images built
     * from the first scan alone (and the later scans' bytes taken for
     * segments), which decode without complaint to other pixels. A
     * sequential frame codes each component in exactly one scan, so a first
     * scan holding all of them is the only one (libjpeg refuses another). */
    if (h.sof != 0xC0 && h.sof != 0xC1)
        why = "the file is progressive (SOF2); an index needs a sequential (SOF0/SOF1) JPEG";
    else if (!h.full_scan)
        why = "the file's first scan is not one sequential scan of every component, as an "
              "index needs";
    else if (p[TAG_LEN] != VERSION)
        why = "unknown version";
    else if (!h.width || !h.height)
        why = "the image has no size";
    else if (!x->k || x->k != h.dri || x->mcus_w % x->k)
        why = "its restart interval does not match the file's";
    else if ((uint64_t)x->nseg != (uint64_t)x->mcus_w / x->k * x->mcus_h)
        why = "its segment count does not match the image's size";
    else if (plen != IDX_HEAD + 4 * ((size_t)x->nseg + 1))
        why = "its length does not match its segment count";
    else if (stk__rst_off(x, 0) != h.sos_end)
        why = "its first segment is not where the scan starts";
    for (uint32_t s = 1; !why && s <= x->nseg; s++) {
        uint32_t a = stk__rst_off(x, s - 1), z = stk__rst_off(x, s);
        if (z <= a || z > n - (s == x->nseg ? 2 : 0) || (s < x->nseg && z - a < 2))
            why = "its offsets are out of order or outside the file";
    }
    if (why) {
        stk__fmt(err, errlen, "restart index: %s", why);
        memset(x, 0, sizeof *x);
        return STK_EFORMAT;
    }
    return 1;
}

/* Segment s's entropy bytes: [*a, *z). Checks the marker that ends it. */
static int segment(const uint8_t *b, const stk__rst *x, uint32_t s, uint32_t *a, uint32_t *z,
                   char *err, size_t errlen)
{
    *a = stk__rst_off(x, s);
    uint32_t next = stk__rst_off(x, s + 1);
    if (s + 1 < x->nseg) {
        *z = next - 2;
        if (b[*z] != 0xFF || b[*z + 1] != 0xD0 + (s & 7)) {
            stk__fmt(err, errlen, "restart index: no RST%u marker at byte %u", s & 7, *z);
            return STK_EFORMAT;
        }
    } else {
        *z = next;
        if (b[*z] != 0xFF || b[*z + 1] != 0xD9) {
            stk__fmt(err, errlen, "restart index: no EOI marker at byte %u", *z);
            return STK_EFORMAT;
        }
    }
    return STK_OK;
}

int stk__rst_verify(const uint8_t *b, size_t n, const stk__rst *x, char *err, size_t errlen)
{
    (void)n;
    for (uint32_t s = 0; s < x->nseg; s++) {
        uint32_t a, z;
        int rc = segment(b, x, s, &a, &z, err, errlen);
        if (rc)
            return rc;
    }
    return STK_OK;
}

int stk__rst_sub(const uint8_t *b, size_t n, const stk__rst *x, uint32_t r0, uint32_t r1,
                 uint32_t c0, uint32_t c1, uint8_t *out, size_t cap, size_t *out_len, char *err,
                 size_t errlen)
{
    if (r0 >= r1 || r1 > x->mcus_h || c0 >= c1 || c1 > x->mcus_w || c0 % x->k || c1 % x->k ||
        cap < n) {
        stk__fmt(err, errlen, "restart sub-image: bad range");
        return STK_EINVAL;
    }
    hdr h;
    int rc = parse_header(b, n, &h, err, errlen);
    if (rc)
        return rc;
    /* The header without the index marker, the frame's size patched. */
    size_t o = 0;
    memcpy(out, b, h.idx_at);
    o = h.idx_at;
    memcpy(out + o, b + h.idx_at + h.idx_len, h.sos_end - h.idx_at - h.idx_len);
    size_t sof = h.sof_at > h.idx_at ? h.sof_at - h.idx_len : h.sof_at;
    o += h.sos_end - h.idx_at - h.idx_len;
    uint32_t w = (c1 == x->mcus_w ? x->width : c1 * x->mcu_w) - c0 * x->mcu_w;
    uint32_t ht = (r1 == x->mcus_h ? x->height : r1 * x->mcu_h) - r0 * x->mcu_h;
    out[sof + 5] = (uint8_t)(ht >> 8);
    out[sof + 6] = (uint8_t)ht;
    out[sof + 7] = (uint8_t)(w >> 8);
    out[sof + 8] = (uint8_t)w;
    uint32_t per_row = x->mcus_w / x->k, count = 0, total = (r1 - r0) * ((c1 - c0) / x->k);
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t s = c0 / x->k; s < c1 / x->k; s++) {
            uint32_t a, z;
            if ((rc = segment(b, x, r * per_row + s, &a, &z, err, errlen)))
                return rc;
            memcpy(out + o, b + a, z - a);
            o += z - a;
            if (++count < total) {
                out[o++] = 0xFF;
                out[o++] = (uint8_t)(0xD0 + ((count - 1) & 7));
            }
        }
    out[o++] = 0xFF;
    out[o++] = 0xD9;
    *out_len = o;
    return STK_OK;
}
