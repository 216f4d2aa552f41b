/*
 * tfrecord.c -- TFRecord files of tf.train.Example records, read in place
 * from local paths: .tfrecord files, or .tfrecord.gz files decompressed once
 * into a private temporary area (docs/formats.md, "Reading TFRecord in
 * place"). Remote files are downloaded whole into the disk cache first
 * (remote_files.c) and read here from there; messages name their URLs.
 *
 * The framing (tensorflow/core/lib/io/record_writer.cc):
 *
 *   record = u64 length | u32 masked CRC32C of the length bytes
 *            | data (length bytes) | u32 masked CRC32C of the data
 *
 * little-endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Each
 * record's data is a serialized tf.train.Example (example.proto,
 * feature.proto):
 *
 *   Example  { Features features = 1; }
 *   Features { map<string, Feature> feature = 1; }   (entries: key = 1, value = 2)
 *   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
 *                           Int64List int64_list = 3; } }
 *   BytesList { repeated bytes value = 1; }
 *   FloatList { repeated float value = 1 [packed = true]; }
 *   Int64List { repeated int64 value = 1 [packed = true]; }
 *
 * read by a small strict wire-format reader (no protobuf library is
 * packaged for C here): packed and unpacked repeated values are accepted,
 * unknown fields skipped, anything that does not parse is a sample error.
 *
 * TFRecord has no index: the first open walks the framing (12 bytes per
 * record) and reads every record once to learn its features, then caches
 * the result beside the file (X.stkidx) or under
 * $XDG_CACHE_HOME/stoker/tfrecord/, keyed by the file's size, mtime, inode
 * and ctime as the tar reader does. A DALI tfrecord2idx index ("offset
 * size" per line, in DIR/idx/STEM.idx, DIR/STEM.idx or DIR/FILE.idx) gives
 * the offsets without the walk when one is there and agrees with the file.
 *
 * Each feature is a field (id = its place in the table the scan builds);
 * bytes_list as its bytes, a single int64/float as decimal text (INT,
 * FLOAT), a multi-valued int64_list/float_list as a JSON array text (JSON:
 * it keeps every value, and Python gets a list back). A read without fields
 * gives the first image-named bytes feature and the label (an int64 feature
 * named "label", "cls" or "image/class/label").
 *
 * Bad input: a bad data CRC or an Example that does not parse is an error
 * of that sample (naming the file and record); a length whose CRC does not
 * match, or that runs past the end of the file, ends the file's index with
 * one sample that fails with the reason, so under skip the rest is read.
 */
#include "source/stkformat.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define TF_KEEP_FDS   256
#define TF_MAX_RECORD (1ull << 32) /* bytes of one record's data */
#define TF_MAGIC      "STKFIDX1"
#define TF_HEAD       96
#define TF_REC        24
#define TF_FEAT       32

/* Record states: what the walk found where a record should be. */
enum { RS_OK, RS_LEN_CRC, RS_PAST_END, RS_TRUNC_HEAD, RS_STATES };
/* Feature types: the Feature oneof's field numbers. */
enum { T_NONE = 0, T_BYTES = 1, T_FLOAT = 2, T_INT = 3 };

typedef struct trec {
    uint64_t off, len; /* the record's start and its data length */
    uint32_t state;
} trec;

typedef struct tfeat {
    char *name;
    uint8_t type;
    bool multi;       /* some record holds other than one value */
    uint64_t samples; /* records holding it */
    int64_t minv, maxv;
    uint64_t seen; /* scan: record number + 1 last holding it */
} tfeat;

typedef struct tfile {
    char *shown; /* the file as named */
    char *path;  /* the file read: it, or its decompressed copy */
    int fd;
    uint64_t first, count, bytes, stored;
    trec *r;
    tfeat *feats; /* this file's features (scan or cache), merged at open */
    size_t nfeat;
} tfile;

typedef struct tfr {
    tfile *files;
    size_t n;
    tfeat *feats; /* the dataset's features: field ids */
    size_t nfeat;
    uint64_t total_bytes;
    int payload, label;
    bool whole;
    char *tmpdir;
} tfr;

/* ---- CRC32C ---------------------------------------------------------------
 * zlib has crc32 (IEEE), not CRC32C (Castagnoli), and Debian packages no C
 * library for it that stoker links already: a slicing-by-8 table here, and
 * the SSE4.2 instruction where the CPU has it (the check runs per record on
 * the read path, so it must keep up with the disk). */

static uint32_t g_crc[8][256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        g_crc[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            g_crc[t][i] = (g_crc[t - 1][i] >> 8) ^ g_crc[0][g_crc[t - 1][i] & 0xff];
}

static void crc_init(void)
{
    pthread_once(&g_crc_once, crc_tables);
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = g_crc[7][lo & 0xff] ^ g_crc[6][(lo >> 8) & 0xff] ^ g_crc[5][(lo >> 16) & 0xff] ^
            g_crc[4][lo >> 24] ^ g_crc[3][p[4]] ^ g_crc[2][p[5]] ^ g_crc[1][p[6]] ^ g_crc[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ g_crc[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#define TF_HAVE_HW 1
#endif

uint32_t stk__crc32c(const void *data, size_t n)
{
    const uint8_t *p = data;
#ifdef TF_HAVE_HW
    if (__builtin_cpu_supports("sse4.2"))
        return ~crc_hw(~0u, p, n);
#endif
    crc_init();
    return ~crc_sw(~0u, p, n);
}

uint32_t stk__crc32c_table(const void *data, size_t n)
{
    crc_init();
    return ~crc_sw(~0u, data, n);
}

static uint32_t masked_crc(const void *data, size_t n)
{
    uint32_t c = stk__crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- Protobuf wire format ------------------------------------------------ */

typedef struct pb {
    const uint8_t *p, *end;
} pb;

static bool pb_varint(pb *b, uint64_t *v)
{
    uint64_t x = 0;
    for (int s = 0; s < 70; s += 7) {
        if (b->p >= b->end)
            return false;
        uint8_t c = *b->p++;
        if (s == 63 && c > 1)
            return false; /* past 64 bits */
        x |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

static bool pb_tag(pb *b, uint32_t *field, uint32_t *wt)
{
    uint64_t t;
    if (!pb_varint(b, &t) || (t >> 3) == 0 || (t >> 3) > 0x1fffffff)
        return false;
    *field = (uint32_t)(t >> 3);
    *wt = (uint32_t)(t & 7);
    return true;
}

static bool pb_bytes(pb *b, pb *out)
{
    uint64_t n;
    if (!pb_varint(b, &n) || n > (uint64_t)(b->end - b->p))
        return false;
    out->p = b->p;
    out->end = b->p + n;
    b->p += n;
    return true;
}

/* Skips a field of wire type wt (groups, 3 and 4, are not proto3). */
static bool pb_skip(pb *b, uint32_t wt)
{
    uint64_t v;
    pb sub;
    switch (wt) {
    case 0: return pb_varint(b, &v);
    case 1:
        if (b->end - b->p < 8)
            return false;
        b->p += 8;
        return true;
    case 2: return pb_bytes(b, &sub);
    case 5:
        if (b->end - b->p < 4)
            return false;
        b->p += 4;
        return true;
    default: return false;
    }
}

/* One feature of an Example: its type and its list message's body. */
typedef struct tval {
    const uint8_t *name;
    size_t name_len;
    int type;
    pb list;        /* the BytesList/FloatList/Int64List body */
    uint64_t count; /* values */
    pb first;       /* bytes_list: the first value */
    int64_t i0;     /* int64_list: the first value */
} tval;

/* Counts and checks a list's values (and notes the first). */
static bool list_scan(tval *v, char *why, size_t wn)
{
    pb b = v->list;
    v->count = 0;
    while (b.p < b.end) {
        uint32_t f, wt;
        if (!pb_tag(&b, &f, &wt))
            goto bad;
        if (f != 1) {
            if (!pb_skip(&b, wt))
                goto bad;
            continue;
        }
        if (v->type == T_BYTES) {
            pb s;
            if (wt != 2 || !pb_bytes(&b, &s))
                goto bad;
            if (!v->count)
                v->first = s;
            v->count++;
        } else if (v->type == T_FLOAT && wt == 5) {
            if (!pb_skip(&b, 5))
                goto bad;
            v->count++;
        } else if (v->type == T_FLOAT && wt == 2) {
            pb s;
            if (!pb_bytes(&b, &s) || (s.end - s.p) % 4)
                goto bad;
            v->count += (uint64_t)(s.end - s.p) / 4;
        } else if (v->type == T_INT && (wt == 0 || wt == 2)) {
            /* Unpacked: one varint; packed: a run of them (maybe none). */
            pb s = b;
            if (wt == 2 && !pb_bytes(&b, &s))
                goto bad;
            for (bool one = wt == 0; one || (wt == 2 && s.p < s.end); one = false) {
                uint64_t x;
                if (!pb_varint(&s, &x))
                    goto bad;
                if (!v->count)
                    v->i0 = (int64_t)x;
                v->count++;
            }
            if (wt == 0)
                b.p = s.p;
        } else {
            goto bad;
        }
    }
    return true;
bad:
    stk__fmt(why, wn, "feature '%.*s': its %s does not parse",
             (int)(v->name_len < 80 ? v->name_len : 80), (const char *)v->name,
             v->type == T_BYTES   ? "bytes_list"
             : v->type == T_FLOAT ? "float_list"
                                  : "int64_list");
    return false;
}

/* Parses one map entry (key = 1, value = 2 a Feature) into v. */
static bool parse_entry(pb e, tval *v, char *why, size_t wn)
{
    memset(v, 0, sizeof *v);
    bool have_key = false;
    while (e.p < e.end) {
        uint32_t f, wt;
        pb s;
        if (!pb_tag(&e, &f, &wt))
            goto bad;
        if (f == 1 && wt == 2 && pb_bytes(&e, &s)) {
            v->name = s.p;
            v->name_len = (size_t)(s.end - s.p);
            have_key = true;
        } else if (f == 2 && wt == 2 && pb_bytes(&e, &s)) {
            /* A Feature: one of fields 1..3; another later one replaces it
             * (protobuf's oneof), an unknown field is skipped. */
            v->type = T_NONE;
            while (s.p < s.end) {
                uint32_t ff, fwt;
                pb l;
                if (!pb_tag(&s, &ff, &fwt))
                    goto bad;
                if (ff >= 1 && ff <= 3) {
                    if (fwt != 2 || !pb_bytes(&s, &l))
                        goto bad;
                    v->type = (int)ff;
                    v->list = l;
                } else if (!pb_skip(&s, fwt)) {
                    goto bad;
                }
            }
        } else if (f == 1 || f == 2 || !pb_skip(&e, wt)) {
            goto bad;
        }
    }
    if (!have_key || !v->name_len) {
        stk__fmt(why, wn, "a feature has no name");
        return false;
    }
    if (memchr(v->name, 0, v->name_len)) {
        stk__fmt(why, wn, "a feature's name holds a NUL byte");
        return false;
    }
    return v->type == T_NONE || list_scan(v, why, wn);
bad:
    stk__fmt(why, wn, "a feature entry does not parse (not a tf.train.Example?)");
    return false;
}

typedef int (*feat_fn)(void *ctx, const tval *v, char *why, size_t wn);

/* Walks an Example's features, calling fn for each. STK_EFORMAT with the
 * reason when the bytes are no Example. */
static int walk_example(const uint8_t *p, size_t n, feat_fn fn, void *ctx, char *why, size_t wn)
{
    pb ex = {p, p + n};
    while (ex.p < ex.end) {
        uint32_t f, wt;
        pb feats;
        if (!pb_tag(&ex, &f, &wt))
            goto bad;
        if (f != 1) {
            if (!pb_skip(&ex, wt))
                goto bad;
            continue;
        }
        if (wt != 2 || !pb_bytes(&ex, &feats))
            goto bad;
        while (feats.p < feats.end) {
            pb e;
            uint32_t ff, fwt;
            if (!pb_tag(&feats, &ff, &fwt))
                goto bad;
            if (ff != 1) {
                if (!pb_skip(&feats, fwt))
                    goto bad;
                continue;
            }
            if (fwt != 2 || !pb_bytes(&feats, &e))
                goto bad;
            tval v;
            if (!parse_entry(e, &v, why, wn))
                return STK_EFORMAT;
            int rc = fn(ctx, &v, why, wn);
            if (rc)
                return rc;
        }
    }
    return STK_OK;
bad:
    stk__fmt(why, wn,
             "the record is not a tf.train.Example (its protobuf does not parse near byte %zu)",
             (size_t)(ex.p - p));
    return STK_EFORMAT;
}

/* ---- Values as text ------------------------------------------------------- */

/* Writes a feature's values into buf: one value as its decimal text, a
 * multi-valued one (json) as a JSON array. Returns the length, or -1 when
 * buf is too small. */
static int values_text(const tval *v, bool json, char *buf, size_t n)
{
    size_t at = 0;
    pb b = v->list;
    if (json)
        buf[at++] = '[';
    bool first = true;
    while (b.p < b.end) {
        uint32_t f, wt;
        if (!pb_tag(&b, &f, &wt))
            return -1;
        pb s = b;
        if (f != 1) {
            (void)pb_skip(&b, wt);
            continue;
        }
        if (wt == 2 && !pb_bytes(&b, &s))
            return -1;
        if (wt == 5) {
            s.end = s.p + 4;
            b.p += 4;
        }
        /* s: one value (unpacked) or a run of them (packed, maybe empty);
         * list_scan has checked the lengths. */
        for (bool once = wt != 2; once || (wt == 2 && s.p < s.end); once = false) {
            char one[40];
            int l;
            if (v->type == T_INT) {
                uint64_t x;
                if (!pb_varint(&s, &x))
                    return -1;
                l = snprintf(one, sizeof one, "%" PRId64, (int64_t)x);
            } else {
                uint32_t u = stk__get32(s.p);
                float fv;
                memcpy(&fv, &u, 4);
                s.p += 4;
                l = json && !isfinite(fv) ? snprintf(one, sizeof one, "null")
                                          : snprintf(one, sizeof one, "%.9g", (double)fv);
            }
            if (wt == 0)
                b.p = s.p;
            if ((size_t)l + 2 > n - at)
                return -1;
            if (!first)
                buf[at++] = ',';
            memcpy(buf + at, one, (size_t)l);
            at += (size_t)l;
            first = false;
        }
    }
    if (json) {
        if (n - at < 2)
            return -1;
        buf[at++] = ']';
    }
    return (int)at;
}

/* ---- The feature scan ---------------------------------------------------- */

typedef struct scan {
    tfeat **feats;
    size_t *n, cap;
    uint64_t rec; /* the record's number + 1 */
} scan;

static const char *type_name(int t)
{
    return t == T_BYTES ? "bytes_list" : t == T_FLOAT ? "float_list" : "int64_list";
}

static int scan_feature(void *ctx, const tval *v, char *why, size_t wn)
{
    scan *sc = ctx;
    if (v->type == T_NONE || !v->count)
        return STK_OK; /* an empty feature: the field is absent here */
    tfeat *f = NULL;
    for (size_t k = 0; k < *sc->n && !f; k++)
        if (strlen((*sc->feats)[k].name) == v->name_len &&
            !memcmp((*sc->feats)[k].name, v->name, v->name_len))
            f = &(*sc->feats)[k];
    if (!f) {
        if (*sc->n >= STK__MAX_FIELDS) {
            stk__fmt(why, wn, "holds more than %d features, stoker's limit of fields",
                     STK__MAX_FIELDS);
            return STK_EUNSUPPORTED;
        }
        int rc = stk__grow((void **)sc->feats, &sc->cap, *sc->n + 1, sizeof **sc->feats);
        if (rc)
            return rc;
        f = &(*sc->feats)[(*sc->n)++];
        memset(f, 0, sizeof *f);
        if (!(f->name = stk__malloc(v->name_len + 1)))
            return STK_ENOMEM;
        memcpy(f->name, v->name, v->name_len);
        f->name[v->name_len] = '\0';
        f->type = (uint8_t)v->type;
        f->minv = INT64_MAX;
        f->maxv = INT64_MIN;
    }
    if (f->type != v->type) {
        stk__fmt(why, wn, "feature '%s' is a %s here but a %s in an earlier record", f->name,
                 type_name(v->type), type_name(f->type));
        return STK_EUNSUPPORTED;
    }
    if (f->seen == sc->rec) {
        stk__fmt(why, wn, "feature '%s' appears twice", f->name);
        return STK_EFORMAT;
    }
    f->seen = sc->rec;
    f->samples++;
    if (v->count != 1)
        f->multi = true;
    if (v->type == T_INT) {
        if (v->i0 < f->minv)
            f->minv = v->i0;
        if (v->i0 > f->maxv)
            f->maxv = v->i0;
    }
    return STK_OK;
}

static void feats_free(tfeat *f, size_t n)
{
    for (size_t k = 0; k < n; k++)
        stk__free(f[k].name);
    stk__free(f);
}

/* ---- Reading records ------------------------------------------------------- */

typedef struct trd {
    int fd;
    const uint8_t *buf;
    uint64_t size;
} trd;

static int rd_get(const trd *r, uint64_t off, void *out, size_t n, char *why, size_t wn)
{
    if (off > r->size || n > r->size - off) {
        stk__fmt(why, wn, "%zu bytes at offset %" PRIu64 " lie past the end of the file", n, off);
        return STK_EFORMAT;
    }
    if (r->buf) {
        memcpy(out, r->buf + off, n);
        return STK_OK;
    }
    return stk__pread_full(r->fd, out, n, off, why, wn);
}

/* The reason record j cannot be read, from the state the walk left. */
static int record_state(const tfile *t, uint64_t j, char *why, size_t wn)
{
    const trec *r = &t->r[j];
    switch (r->state) {
    case RS_OK: return STK_OK;
    case RS_LEN_CRC:
        stk__fmt(why, wn,
                 "record %" PRIu64 " at offset %" PRIu64
                 ": its length's CRC does not match (the file is damaged here; the records "
                 "after it cannot be found)",
                 j, r->off);
        break;
    case RS_PAST_END:
        stk__fmt(why, wn,
                 "record %" PRIu64 " at offset %" PRIu64 ": its length %" PRIu64
                 " runs past the end of the file (%" PRIu64 " bytes; truncated?)",
                 j, r->off, r->len, t->bytes);
        break;
    default:
        stk__fmt(why, wn,
                 "the file ends %" PRIu64 " bytes into record %" PRIu64
                 "'s 12-byte header at offset %" PRIu64 " (truncated?)",
                 t->bytes - r->off, j, r->off);
        break;
    }
    return STK_EFORMAT;
}

/* Checks a framed record in buf (len + 16 bytes): its length field against
 * the index, both CRCs. */
static int check_frame(const uint8_t *buf, uint64_t len, uint64_t j, uint64_t off, char *why,
                       size_t wn)
{
    uint64_t l = stk__get64(buf);
    if (stk__get32(buf + 8) != masked_crc(buf, 8)) {
        stk__fmt(why, wn,
                 "record %" PRIu64 " at offset %" PRIu64 ": its length's CRC does not match", j,
                 off);
        return STK_EFORMAT;
    }
    if (l != len) {
        stk__fmt(why, wn,
                 "record %" PRIu64 " at offset %" PRIu64 ": its length is %" PRIu64
                 ", the index says %" PRIu64 " (the file changed?)",
                 j, off, l, len);
        return STK_EFORMAT;
    }
    if (stk__get32(buf + 12 + len) != masked_crc(buf + 12, (size_t)len)) {
        stk__fmt(why, wn,
                 "record %" PRIu64 " at offset %" PRIu64 ": its data CRC does not match (%" PRIu64
                 " bytes damaged)",
                 j, off, len);
        return STK_EFORMAT;
    }
    return STK_OK;
}

static const tfile *find_file(const tfr *d, uint64_t i)
{
    size_t lo = 0, hi = d->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->files[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return &d->files[lo];
}

/* Finds feature name among the dataset's features: its id, or -1. */
static int feat_id(const tfr *d, const uint8_t *name, size_t n)
{
    for (size_t k = 0; k < d->nfeat; k++)
        if (strlen(d->feats[k].name) == n && !memcmp(d->feats[k].name, name, n))
            return (int)k;
    return -1;
}

typedef struct pick {
    const tfr *d;
    pb payload;
    bool have;
    int64_t label;
} pick;

static int pick_feature(void *ctx, const tval *v, char *why, size_t wn)
{
    pick *pk = ctx;
    int id = feat_id(pk->d, v->name, v->name_len);
    if (id < 0 || v->type == T_NONE || !v->count)
        return STK_OK;
    if (id == pk->d->payload) {
        if (v->type != T_BYTES || v->count != 1) {
            stk__fmt(why, wn,
                     "feature '%s' holds %" PRIu64
                     " %s values; a sample's payload is one byte string",
                     pk->d->feats[id].name, v->count, type_name(v->type));
            return STK_EFORMAT;
        }
        pk->payload = v->first;
        pk->have = true;
    } else if (id == pk->d->label && v->type == T_INT && v->count == 1) {
        pk->label = v->i0;
    }
    return STK_OK;
}

static int tf_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                   int64_t *label, char *err, size_t errlen)
{
    const tfr *d = s->impl;
    const tfile *t = find_file(d, i);
    uint64_t j = i - t->first;
    const trec *r = &t->r[j];
    int rc = record_state(t, j, err, errlen);
    if (rc)
        return rc;
    size_t n = (size_t)r->len + 16;
    uint8_t *buf = stk__sink_take(sink, n, "record", &rc, err, errlen);
    if (!buf)
        return rc;
    int fd = t->fd;
    if (fd < 0 && (fd = stk__open(t->path, O_RDONLY | O_CLOEXEC)) < 0) {
        stk__fmt(err, errlen, "cannot open %s: %s", t->path, strerror(errno));
        return STK_EIO;
    }
    rc = stk__pread_full(fd, buf, n, r->off, err, errlen);
    if (fd != t->fd)
        stk__close(fd);
    if (rc || (rc = check_frame(buf, r->len, j, r->off, err, errlen)))
        return rc;
    *label = -1;
    if (d->whole) {
        *data = buf + 12;
        *len = (size_t)r->len;
        pick pk = {d, {0}, false, -1};
        char why[STK_ERRMSG_MAX];
        if (d->label >= 0 &&
            walk_example(buf + 12, (size_t)r->len, pick_feature, &pk, why, sizeof why) == STK_OK)
            *label = pk.label;
        return STK_OK;
    }
    if (d->payload < 0) {
        stk__fmt(err, errlen,
                 "the records hold no bytes_list feature (only numbers): read them with fields");
        return STK_EUNSUPPORTED;
    }
    pick pk = {d, {0}, false, -1};
    char why[STK_ERRMSG_MAX];
    if ((rc = walk_example(buf + 12, (size_t)r->len, pick_feature, &pk, why, sizeof why))) {
        stk__fmt(err, errlen, "record %" PRIu64 " at offset %" PRIu64 ": %s", j, r->off, why);
        return rc;
    }
    if (!pk.have) {
        stk__fmt(err, errlen, "record %" PRIu64 " has no feature '%s'", j,
                 d->feats[d->payload].name);
        return STK_EFORMAT;
    }
    *data = (uint8_t *)(uintptr_t)pk.payload.p;
    *len = (size_t)(pk.payload.end - pk.payload.p);
    *label = d->label >= 0 ? pk.label : -1;
    return STK_OK;
}

static int tf_select(stk__source *s, uint64_t mask, char *err, size_t errlen)
{
    (void)mask;
    (void)err;
    (void)errlen;
    ((tfr *)s->impl)->whole = true;
    return STK_OK;
}

typedef struct emit {
    const tfr *d;
    stk__field_set *fs;
    uint64_t done; /* bit id: emitted */
} emit;

static int emit_feature(void *ctx, const tval *v, char *why, size_t wn)
{
    emit *em = ctx;
    int id = feat_id(em->d, v->name, v->name_len);
    if (v->type == T_NONE || !v->count)
        return STK_OK;
    if (id < 0) {
        /* Features are scanned at open: one the scan did not see means the
         * file changed (or its record did not parse then). */
        stk__fmt(why, wn, "feature '%.*s' was not in the file when it was indexed",
                 (int)(v->name_len < 80 ? v->name_len : 80), (const char *)v->name);
        return STK_EFORMAT;
    }
    const tfeat *f = &em->d->feats[id];
    if (em->done >> id & 1) {
        stk__fmt(why, wn, "feature '%s' appears twice", f->name);
        return STK_EFORMAT;
    }
    em->done |= 1ull << id;
    if (f->type != v->type) {
        stk__fmt(why, wn, "feature '%s' is a %s, but a %s in other records", f->name,
                 type_name(v->type), type_name(f->type));
        return STK_EFORMAT;
    }
    if (v->type == T_BYTES) {
        if (v->count != 1) {
            stk__fmt(why, wn,
                     "feature '%s' holds %" PRIu64
                     " byte strings; stoker reads bytes_list features of one value",
                     f->name, v->count);
            return STK_EUNSUPPORTED;
        }
        if (em->fs->n >= STK__MAX_FIELDS)
            return STK_EFORMAT;
        em->fs->f[em->fs->n++] =
            (stk__field_ref){(uint32_t)id, v->first.p, (size_t)(v->first.end - v->first.p)};
        return STK_OK;
    }
    char text[STK__FIELD_GEN];
    int l = values_text(v, f->multi, text, sizeof text);
    if (l < 0) {
        stk__fmt(why, wn, "feature '%s': its %" PRIu64 " values do not fit %d bytes of text",
                 f->name, v->count, STK__FIELD_GEN);
        return STK_ETOOBIG;
    }
    int rc = stk__field_set_gen(em->fs, (uint32_t)id, text, (size_t)l);
    if (rc)
        stk__fmt(why, wn, "feature '%s': the sample's generated fields exceed %d bytes", f->name,
                 STK__FIELD_GEN);
    return rc;
}

static int fields_of_example(const tfr *d, const uint8_t *p, size_t n, stk__field_set *fs,
                             char *why, size_t wn)
{
    fs->n = 0;
    fs->gen_used = 0;
    emit em = {d, fs, 0};
    return walk_example(p, n, emit_feature, &em, why, wn);
}

static int tf_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                     int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    const tfr *d = s->impl;
    const tfile *t = find_file(d, i);
    uint64_t j = i - t->first;
    (void)label;
    char why[STK_ERRMSG_MAX];
    int rc = fields_of_example(d, bytes, len, fs, why, sizeof why);
    if (rc)
        stk__fmt(err, errlen, "record %" PRIu64 " at offset %" PRIu64 ": %s", j, t->r[j].off, why);
    return rc;
}

static void tf_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const tfr *d = s->impl;
    const tfile *t = find_file(d, i);
    stk__fmt(buf, n, "%s#%" PRIu64, t->shown, i - t->first);
}

static void tf_describe(const stk__source *s, stk__dataset_info *di)
{
    const tfr *d = s->impl;
    if (s->ops->flags & STK__SRC_IMAGES)
        di->payload = "encoded";
    di->shards = d->n;
    di->bytes = d->total_bytes;
}

static void tf_free(tfr *d)
{
    if (!d)
        return;
    for (size_t k = 0; k < d->n; k++) {
        tfile *t = &d->files[k];
        if (t->fd >= 0)
            stk__close(t->fd);
        if (d->tmpdir && t->path && !strncmp(t->path, d->tmpdir, strlen(d->tmpdir)))
            (void)unlink(t->path);
        stk__free(t->shown);
        stk__free(t->path);
        stk__free(t->r);
        feats_free(t->feats, t->nfeat);
    }
    if (d->tmpdir)
        (void)rmdir(d->tmpdir);
    stk__free(d->tmpdir);
    stk__free(d->files);
    feats_free(d->feats, d->nfeat);
    stk__free(d);
}

static void tf_close(stk__source *s)
{
    tf_free(s->impl);
    s->impl = NULL;
}

/* With and without STK__SRC_IMAGES: the payload (the first image-named
 * bytes feature, else the first bytes feature) decides. */
static const stk__source_ops k_tf_ops = {.kind = "tfrecord",
                                         .read = tf_read,
                                         .name = tf_name,
                                         .close = tf_close,
                                         .select = tf_select,
                                         .fields = tf_fields,
                                         .flags = STK__SRC_IMAGES,
                                         .describe = tf_describe};
static const stk__source_ops k_tf_bytes_ops = {.kind = "tfrecord",
                                               .read = tf_read,
                                               .name = tf_name,
                                               .close = tf_close,
                                               .select = tf_select,
                                               .fields = tf_fields,
                                               .describe = tf_describe};

/* ---- Building a file's index -------------------------------------------- */

static int add_rec(tfile *t, size_t *cap, uint64_t off, uint64_t len, uint32_t state)
{
    int rc = stk__grow((void **)&t->r, cap, t->count + 1, sizeof *t->r);
    if (rc)
        return rc;
    t->r[t->count++] = (trec){off, len, state};
    return STK_OK;
}

/* Walks the framing: 12 header bytes per record. A bad length CRC, a
 * length past the file, or a cut header ends the walk with one record in
 * that state. */
static int walk_frames(const trd *rd, tfile *t, char *why, size_t wn)
{
    size_t cap = 0;
    uint64_t off = 0;
    int rc = STK_OK;
    while (off < rd->size && !rc) {
        uint8_t h[12];
        if (rd->size - off < 12)
            return add_rec(t, &cap, off, 0, RS_TRUNC_HEAD);
        if ((rc = rd_get(rd, off, h, 12, why, wn)))
            return rc;
        uint64_t len = stk__get64(h);
        if (stk__get32(h + 8) != masked_crc(h, 8))
            return add_rec(t, &cap, off, len, RS_LEN_CRC);
        if (len > TF_MAX_RECORD || len + 16 > rd->size - off)
            return add_rec(t, &cap, off, len, RS_PAST_END);
        rc = add_rec(t, &cap, off, len, RS_OK);
        off += len + 16;
    }
    return rc;
}

/* Reads a DALI tfrecord2idx index ("offset size" lines): true when it is
 * there, parses, and agrees with a file of fsize bytes (records contiguous
 * from 0 to the end). Otherwise the framing is walked. */
static bool read_dali_idx(const char *ipath, uint64_t fsize, tfile *t)
{
    FILE *f = fopen(ipath, "re");
    if (!f)
        return false;
    size_t cap = 0;
    uint64_t next = 0;
    bool ok = true;
    char line[128];
    while (ok && fgets(line, sizeof line, f)) {
        char *e1, *e2;
        errno = 0;
        unsigned long long o = strtoull(line, &e1, 10), sz = strtoull(e1, &e2, 10);
        if (e1 == line && (*line == '\n' || !*line))
            continue;
        ok = !errno && e1 != line && e2 != e1 && (*e2 == '\n' || !*e2) && o == next && sz >= 16 &&
             sz <= TF_MAX_RECORD + 16 && sz <= fsize - o &&
             add_rec(t, &cap, o, sz - 16, RS_OK) == STK_OK;
        next = o + sz;
    }
    fclose(f);
    if (!ok || next != fsize || !t->count) {
        stk__free(t->r);
        t->r = NULL;
        t->count = 0;
        return false;
    }
    return true;
}

/* Where a DALI index for file `shown` may be: DIR/idx/STEM.idx,
 * DIR/STEM.idx, DIR/FILE.idx (STEM: the name without .tfrecord[.gz]). */
static bool find_dali_idx(const char *shown, uint64_t fsize, tfile *t)
{
    const char *slash = strrchr(shown, '/');
    size_t dl = slash ? (size_t)(slash - shown) : 1;
    const char *dir = slash ? shown : ".";
    const char *base = slash ? slash + 1 : shown;
    char stem[1024];
    stk__fmt(stem, sizeof stem, "%s", base);
    char *dot = strstr(stem, ".tfrecord");
    if (dot)
        *dot = '\0';
    char p[4096];
    for (int k = 0; k < 3; k++) {
        stk__fmt(p, sizeof p, "%.*s/%s%s.idx", (int)dl, dir, k == 0 ? "idx/" : "",
                 k == 2 ? base : stem);
        if (read_dali_idx(p, fsize, t))
            return true;
    }
    return false;
}

/* Reads every good record once and learns its features. A record that
 * cannot be read, fails its CRC or does not parse is left for its read to
 * report; features that disagree in type across records fail the open.
 * crc false (the fuzz entry only): data CRCs are not checked, so mutated
 * Examples reach the parser. */
static int scan_file(const trd *rd, tfile *t, bool crc, char *why, size_t wn)
{
    scan sc = {&t->feats, &t->nfeat, 0, 0};
    stk__scratch buf = {.limit = TF_MAX_RECORD + 16};
    int rc = STK_OK;
    for (uint64_t j = 0; j < t->count && !rc; j++) {
        const trec *r = &t->r[j];
        if (r->state != RS_OK)
            continue;
        size_t n = (size_t)r->len + 16;
        if ((rc = stk__scratch_reserve(&buf, n)))
            break;
        char w2[STK_ERRMSG_MAX];
        if (rd_get(rd, r->off, buf.p, n, w2, sizeof w2) ||
            (crc && check_frame(buf.p, r->len, j, r->off, w2, sizeof w2)))
            continue;
        sc.rec = j + 1;
        rc = walk_example(buf.p + 12, (size_t)r->len, scan_feature, &sc, w2, sizeof w2);
        if (rc == STK_EFORMAT)
            rc = STK_OK; /* a malformed record: its read says why */
        else if (rc)
            stk__fmt(why, wn, "record %" PRIu64 ": %s", j, w2);
    }
    stk__scratch_free(&buf);
    return rc;
}

/* ---- Index cache ----------------------------------------------------------- */

static void put_stat(uint8_t *b, const struct stat *st)
{
    stk__put64(b + 8, (uint64_t)st->st_size);
    stk__put64(b + 16, (uint64_t)st->st_mtim.tv_sec);
    stk__put64(b + 24, (uint64_t)st->st_mtim.tv_nsec);
    stk__put64(b + 32, (uint64_t)st->st_ino);
    stk__put64(b + 40, (uint64_t)st->st_dev);
    stk__put64(b + 48, (uint64_t)st->st_ctim.tv_sec);
    stk__put64(b + 56, (uint64_t)st->st_ctim.tv_nsec);
}

/* Checks a loaded index against the file read (size bytes). */
static bool index_valid(const tfile *t, uint64_t size)
{
    uint64_t next = 0;
    for (uint64_t j = 0; j < t->count; j++) {
        const trec *r = &t->r[j];
        if (r->state >= RS_STATES || r->off != next || (r->state != RS_OK && j + 1 != t->count))
            return false;
        if (r->state == RS_OK) {
            if (r->len > TF_MAX_RECORD || r->len + 16 > size - r->off)
                return false;
            next = r->off + r->len + 16;
        } else if (r->off >= size) {
            return false;
        }
    }
    if (t->count && t->r[t->count - 1].state == RS_OK && next != size)
        return false;
    if (t->nfeat > STK__MAX_FIELDS)
        return false;
    for (size_t k = 0; k < t->nfeat; k++)
        if (t->feats[k].type < T_BYTES || t->feats[k].type > T_INT ||
            t->feats[k].samples > t->count || !t->feats[k].name[0])
            return false;
    return true;
}

/* The cache: magic | stat of the file as stored (size, mtime, inode, dev,
 * ctime) | bytes read | count | nfeat | names bytes | records (off, len,
 * state) | features (type, multi, samples, min, max) | names | xxh3. */
static int cache_load(const char *cpath, const struct stat *fst, uint64_t size, tfile *t)
{
    uint8_t *buf = NULL;
    uint8_t want[TF_HEAD] = {0};
    put_stat(want, fst);
    size_t n;
    int rc = stk__sealed_read(cpath, TF_MAGIC, TF_HEAD + 8, &buf, &n);
    if (rc == STK_ENOENT)
        return rc;
    if (rc)
        goto out;
    rc = STK_EFORMAT;
    if (memcmp(buf + 8, want + 8, 56) || stk__get64(buf + 64) != size)
        goto out;
    uint64_t count = stk__get64(buf + 72), nfeat = stk__get64(buf + 80);
    uint64_t nb = stk__get64(buf + 88), body = n - TF_HEAD - 8;
    if (count > body / TF_REC || nfeat > STK__MAX_FIELDS || nb > body ||
        count * TF_REC + nfeat * TF_FEAT + nb != body || (nb && buf[TF_HEAD + body - 1]))
        goto out;
    if (!(t->r = stk__calloc((size_t)(count ? count : 1), sizeof *t->r)) ||
        !(t->feats = stk__calloc((size_t)(nfeat ? nfeat : 1), sizeof *t->feats))) {
        rc = STK_ENOMEM;
        goto out;
    }
    const uint8_t *p = buf + TF_HEAD;
    for (uint64_t j = 0; j < count; j++, p += TF_REC)
        t->r[j] = (trec){stk__get64(p), stk__get64(p + 8), stk__get32(p + 16)};
    t->count = count;
    const uint8_t *names = p + nfeat * TF_FEAT, *nend = names + nb;
    for (uint64_t k = 0; k < nfeat; k++, p += TF_FEAT) {
        tfeat *f = &t->feats[k];
        size_t l = names < nend ? strlen((const char *)names) : 0;
        if (names >= nend || !(f->name = stk__malloc(l + 1))) {
            rc = names >= nend ? STK_EFORMAT : STK_ENOMEM;
            goto out;
        }
        t->nfeat = k + 1;
        memcpy(f->name, names, l + 1);
        names += l + 1;
        f->type = p[0];
        f->multi = p[1] != 0;
        f->samples = stk__get64(p + 8);
        f->minv = (int64_t)stk__get64(p + 16);
        f->maxv = (int64_t)stk__get64(p + 24);
    }
    rc = names == nend && index_valid(t, size) ? STK_OK : STK_EFORMAT;
out:
    if (rc) {
        stk__free(t->r);
        t->r = NULL;
        t->count = 0;
        feats_free(t->feats, t->nfeat);
        t->feats = NULL;
        t->nfeat = 0;
    }
    stk__free(buf);
    return rc;
}

static int cache_store(const char *cpath, const struct stat *fst, uint64_t size, const tfile *t)
{
    size_t nb = 0;
    for (size_t k = 0; k < t->nfeat; k++)
        nb += strlen(t->feats[k].name) + 1;
    size_t n = TF_HEAD + (size_t)t->count * TF_REC + t->nfeat * TF_FEAT + nb + 8;
    uint8_t *buf = stk__calloc(1, n);
    if (!buf)
        return STK_ENOMEM;
    memcpy(buf, TF_MAGIC, 8);
    put_stat(buf, fst);
    stk__put64(buf + 64, size);
    stk__put64(buf + 72, t->count);
    stk__put64(buf + 80, t->nfeat);
    stk__put64(buf + 88, nb);
    uint8_t *p = buf + TF_HEAD;
    for (uint64_t j = 0; j < t->count; j++, p += TF_REC) {
        stk__put64(p, t->r[j].off);
        stk__put64(p + 8, t->r[j].len);
        stk__put32(p + 16, t->r[j].state);
    }
    for (size_t k = 0; k < t->nfeat; k++, p += TF_FEAT) {
        p[0] = t->feats[k].type;
        p[1] = t->feats[k].multi;
        stk__put64(p + 8, t->feats[k].samples);
        stk__put64(p + 16, (uint64_t)t->feats[k].minv);
        stk__put64(p + 24, (uint64_t)t->feats[k].maxv);
    }
    for (size_t k = 0; k < t->nfeat; k++) {
        size_t l = strlen(t->feats[k].name) + 1;
        memcpy(p, t->feats[k].name, l);
        p += l;
    }
    stk__put64(buf + n - 8, stk__xxh3(buf, n - 8));
    /* Renamed into place: readers never see a half-written cache. */
    int rc = stk__write_replace(cpath, buf, n);
    stk__free(buf);
    return rc;
}

/* Loads file t's index from a cache, else a DALI index or the walk, then
 * the scan, and caches it. fst: the stat of the file as stored (the .gz
 * for a compressed one). */
static int index_file(tfile *t, const char *src, int fd, const struct stat *fst, char *err,
                      size_t errlen)
{
    char cpath[4096];
    int rc;
    for (int beside = 1; beside >= 0; beside--)
        if (stk__index_cache_path(src, "tfrecord", beside, cpath, sizeof cpath) == STK_OK &&
            (rc = cache_load(cpath, fst, t->bytes, t)) != STK_ENOENT && rc != STK_EFORMAT)
            return rc;
    trd rd = {fd, NULL, t->bytes};
    char why[STK_ERRMSG_MAX];
    if (!(t->stored == t->bytes && find_dali_idx(src, t->bytes, t)) &&
        (rc = walk_frames(&rd, t, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", t->shown, why);
        return rc;
    }
    if ((rc = scan_file(&rd, t, true, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", t->shown, why);
        return rc;
    }
    for (int beside = 1; beside >= 0; beside--) {
        if (stk__index_cache_path(src, "tfrecord", beside, cpath, sizeof cpath) != STK_OK)
            continue;
        if (!beside)
            stk__mkdirs_for(cpath);
        if (cache_store(cpath, fst, t->bytes, t) == STK_OK)
            break;
    }
    return STK_OK;
}

/* ---- gzip ------------------------------------------------------------------
 * A .tfrecord.gz file is decompressed once, at open, into a private
 * directory $TMPDIR/stoker-tfrecord-XXXXXX (TMPDIR unset: /tmp), removed at
 * close. Concatenated gzip members are one stream, as TensorFlow's
 * ZlibInputStream reads them. */

static int gunzip(int zfd, int ofd, char *why, size_t wn)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK)
        return STK_ENOMEM;
    enum { CH = 1 << 16 };
    uint8_t *ib = stk__malloc(CH), *ob = stk__malloc(CH);
    uint64_t at = 0;
    int rc = STK_OK, zr = Z_OK;
    if (!ib || !ob) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t r = stk__pread(zfd, ib, CH, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            stk__fmt(why, wn, "read failed at offset %" PRIu64 ": %s", at, strerror(errno));
            rc = STK_EIO;
            goto out;
        }
        if (r == 0)
            break;
        at += (uint64_t)r;
        z.next_in = ib;
        z.avail_in = (uInt)r;
        while (z.avail_in) {
            if (zr == Z_STREAM_END && inflateReset(&z) != Z_OK) {
                rc = STK_ENOMEM;
                goto out;
            }
            z.next_out = ob;
            z.avail_out = CH;
            zr = inflate(&z, Z_NO_FLUSH);
            if (zr != Z_OK && zr != Z_STREAM_END && !(zr == Z_BUF_ERROR && z.avail_out)) {
                stk__fmt(why, wn, "not a valid gzip stream (near compressed byte %" PRIu64 "): %s",
                         at - z.avail_in, z.msg ? z.msg : "corrupt");
                rc = STK_EFORMAT;
                goto out;
            }
            size_t got = CH - z.avail_out;
            if (got && stk__write_full(ofd, ob, got)) {
                stk__fmt(why, wn, "cannot write its decompressed copy: %s", strerror(errno));
                rc = STK_EIO;
                goto out;
            }
        }
    }
    if (zr != Z_STREAM_END) {
        stk__fmt(why, wn, "the gzip stream is cut off (truncated?)");
        rc = STK_EFORMAT;
    }
out:
    inflateEnd(&z);
    stk__free(ib);
    stk__free(ob);
    return rc;
}

static int decompress(tfr *d, tfile *t, const char *src, size_t k, char *err, size_t errlen)
{
    if (!d->tmpdir) {
        const char *base = getenv("TMPDIR");
        if (!base || !*base)
            base = "/tmp";
        char tmpl[4096];
        stk__fmt(tmpl, sizeof tmpl, "%s/stoker-tfrecord-XXXXXX", base);
        if (!mkdtemp(tmpl)) {
            stk__fmt(err, errlen, "cannot make a temporary directory in %s: %s", base,
                     strerror(errno));
            return STK_EIO;
        }
        if (!(d->tmpdir = stk__strdup(tmpl))) {
            (void)rmdir(tmpl);
            return STK_ENOMEM;
        }
    }
    size_t pl = strlen(d->tmpdir) + 32;
    if (!(t->path = stk__malloc(pl)))
        return STK_ENOMEM;
    stk__fmt(t->path, pl, "%s/%zu.tfrecord", d->tmpdir, k);
    int zfd = stk__open(src, O_RDONLY | O_CLOEXEC);
    if (zfd < 0) {
        int e = errno;
        stk__fmt(err, errlen, "%s: %s", t->shown, strerror(e));
        return e == ENOENT ? STK_ENOENT : STK_EIO;
    }
    int ofd = stk__open(t->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (ofd < 0) {
        stk__fmt(err, errlen, "%s: cannot create %s: %s", t->shown, t->path, strerror(errno));
        stk__close(zfd);
        return STK_EIO;
    }
    char why[STK_ERRMSG_MAX];
    int rc = gunzip(zfd, ofd, why, sizeof why);
    stk__close(zfd);
    stk__close(ofd);
    if (rc)
        stk__fmt(err, errlen, "%s: %s", t->shown, why);
    return rc;
}

/* ---- Open --------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Opens file k: src the local file as stored (t->shown names it). */
static int open_file(tfr *d, tfile *t, const char *src, size_t k, bool keep, char *err,
                     size_t errlen)
{
    struct stat fst, st;
    if (stk__stat(src, &fst) != 0) {
        int e = errno;
        stk__fmt(err, errlen, "%s: %s", t->shown, strerror(e));
        return e == ENOENT ? STK_ENOENT : STK_EIO;
    }
    t->stored = (uint64_t)fst.st_size;
    int rc;
    if (ends_with(t->shown, ".gz") || ends_with(src, ".gz")) {
        if ((rc = decompress(d, t, src, k, err, errlen)))
            return rc;
    } else if (!(t->path = stk__strdup(src))) {
        return STK_ENOMEM;
    }
    int fd = stk__open_regular(t->path, t->shown, &st, err, errlen);
    if (fd < 0)
        return fd;
    t->bytes = (uint64_t)st.st_size;
    rc = index_file(t, src, fd, &fst, err, errlen);
    if (keep && !rc)
        t->fd = fd;
    else
        stk__close(fd);
    return rc;
}

/* Merges file t's features into the dataset's. */
static int merge_feats(tfr *d, const tfile *t, size_t *cap, char *err, size_t errlen)
{
    for (size_t k = 0; k < t->nfeat; k++) {
        const tfeat *f = &t->feats[k];
        int id = feat_id(d, (const uint8_t *)f->name, strlen(f->name));
        if (id >= 0) {
            tfeat *g = &d->feats[id];
            if (g->type != f->type) {
                stk__fmt(err, errlen, "%s: feature '%s' is a %s, but a %s in the files before it",
                         t->shown, f->name, type_name(f->type), type_name(g->type));
                return STK_EUNSUPPORTED;
            }
            g->multi |= f->multi;
            g->samples += f->samples;
            g->minv = f->minv < g->minv ? f->minv : g->minv;
            g->maxv = f->maxv > g->maxv ? f->maxv : g->maxv;
            continue;
        }
        if (d->nfeat >= STK__MAX_FIELDS) {
            stk__fmt(err, errlen, "%s: the files hold more than %d features, stoker's limit",
                     t->shown, STK__MAX_FIELDS);
            return STK_EUNSUPPORTED;
        }
        int rc = stk__grow((void **)&d->feats, cap, d->nfeat + 1, sizeof *d->feats);
        if (rc)
            return rc;
        tfeat *g = &d->feats[d->nfeat];
        *g = *f;
        if (!(g->name = stk__strdup(f->name)))
            return STK_ENOMEM;
        d->nfeat++;
    }
    return STK_OK;
}

static bool image_named(const char *name)
{
    const char *last = strrchr(name, '/');
    last = last ? last + 1 : name;
    return stk_field_kind_for_name(name) == STK_FIELD_IMAGE ||
           stk_field_kind_for_name(last) == STK_FIELD_IMAGE || !strcmp(name, "image/encoded");
}

static int feat_kind(const tfeat *f)
{
    if (f->type == T_BYTES)
        return image_named(f->name) ? STK_FIELD_IMAGE : STK_FIELD_AUTO;
    if (f->multi)
        return STK_FIELD_JSON;
    return f->type == T_INT ? STK_FIELD_INT : STK_FIELD_FLOAT;
}

/* The payload, the label and the fields, from the merged features. */
static int finish(stk__source *s, tfr *d, char *err, size_t errlen)
{
    d->payload = d->label = -1;
    for (size_t k = 0; k < d->nfeat && d->payload < 0; k++)
        if (d->feats[k].type == T_BYTES && image_named(d->feats[k].name))
            d->payload = (int)k;
    for (size_t k = 0; k < d->nfeat && d->payload < 0; k++)
        if (d->feats[k].type == T_BYTES)
            d->payload = (int)k;
    for (size_t k = 0; k < d->nfeat && d->label < 0; k++) {
        const tfeat *f = &d->feats[k];
        if ((!strcmp(f->name, "label") || !strcmp(f->name, "cls") ||
             !strcmp(f->name, "image/class/label")) &&
            f->type == T_INT && !f->multi && f->minv >= 0 && f->maxv <= INT32_MAX)
            d->label = (int)k;
    }
    s->num_classes = d->label >= 0 ? (uint64_t)d->feats[d->label].maxv + 1 : 0;
    for (size_t k = 0; k < d->nfeat; k++)
        if (stk__source_add_field(s, d->feats[k].name, strlen(d->feats[k].name),
                                  feat_kind(&d->feats[k]), d->feats[k].samples) < 0)
            return STK_ENOMEM;
    s->ops =
        d->payload >= 0 && image_named(d->feats[d->payload].name) ? &k_tf_ops : &k_tf_bytes_ops;
    (void)err;
    (void)errlen;
    return STK_OK;
}

int stk__source_tfrecord_open(stk__source *s, const char *const *paths, const char *const *shown,
                              size_t n, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int rc = STK_OK;
    size_t fcap = 0;
    tfr *d = stk__calloc(1, sizeof *d);
    if (!d || !(d->files = stk__calloc(n ? n : 1, sizeof *d->files)) ||
        !(s->shard_first = stk__calloc(n + 1, sizeof *s->shard_first))) {
        rc = STK_ENOMEM;
        goto out;
    }
    uint64_t total = 0, maxlen = 0;
    for (size_t k = 0; k < n; k++) {
        tfile *t = &d->files[k];
        t->fd = -1;
        d->n = k + 1;
        if (!(t->shown = stk__strdup(shown ? shown[k] : paths[k]))) {
            rc = STK_ENOMEM;
            goto out;
        }
        if ((rc = open_file(d, t, paths[k], k, n <= TF_KEEP_FDS, err, errlen)) ||
            (rc = merge_feats(d, t, &fcap, err, errlen)))
            goto out;
        feats_free(t->feats, t->nfeat);
        t->feats = NULL;
        t->nfeat = 0;
        t->first = total;
        total += t->count;
        s->shard_first[k] = t->first;
        d->total_bytes += t->stored;
        for (uint64_t j = 0; j < t->count; j++)
            if (t->r[j].state == RS_OK && t->r[j].len + 16 > maxlen)
                maxlen = t->r[j].len + 16;
        s->index_bytes += t->count * sizeof *t->r + strlen(t->shown) + strlen(t->path) + 2;
    }
    s->shard_first[n] = total;
    s->nshards = n;
    s->count = total;
    s->max_len = maxlen;
    if (!total) {
        stk__fmt(err, errlen, "%s: the %zu TFRecord files hold no records",
                 n ? d->files[0].shown : "", n);
        rc = STK_EEMPTY;
        goto out;
    }
    if ((rc = finish(s, d, err, errlen)))
        goto out;
    s->index_bytes += sizeof *d + n * sizeof *d->files + d->nfeat * sizeof *d->feats;
    s->impl = d;
out:
    if (rc) {
        tf_free(d);
        s->impl = NULL;
        stk__source_free_common(s); /* the shard table and the fields */
    }
    return rc;
}

/* ---- Fuzz entry point --------------------------------------------------------- */

int stk__tfrecord_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                               size_t errlen)
{
    *samples = 0;
    tfile t = {.fd = -1, .bytes = n};
    tfr d = {.label = -1, .payload = -1};
    trd rd = {-1, buf, n};
    size_t fcap = 0;
    stk__field_set *fs = NULL;
    int rc = walk_frames(&rd, &t, err, errlen);
    if (!rc)
        rc = scan_file(&rd, &t, false, err, errlen);
    if (!rc)
        rc = merge_feats(&d, &t, &fcap, err, errlen);
    if (rc)
        goto out;
    *samples = t.count;
    if (!(fs = stk__malloc(sizeof *fs))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (uint64_t j = 0; j < t.count; j++) {
        const trec *r = &t.r[j];
        char why[STK_ERRMSG_MAX];
        if (r->state != RS_OK)
            continue;
        /* The CRCs are checked (as a read does) but a mismatch does not
         * stop the parse: a fuzzer's mutations seldom fix a CRC. */
        (void)check_frame(buf + r->off, r->len, j, r->off, why, sizeof why);
        const uint8_t *rec = buf + r->off + 12;
        size_t len = (size_t)r->len;
        if (fields_of_example(&d, rec, len, fs, why, sizeof why))
            continue;
        for (size_t k = 0; k < fs->n; k++) {
            const stk__field_ref *f = &fs->f[k];
            bool in_rec =
                f->data >= rec && f->len <= len && f->data - rec <= (ptrdiff_t)(len - f->len);
            bool in_gen = f->data >= fs->gen && f->data + f->len <= fs->gen + fs->gen_used;
            if (f->id >= d.nfeat || !(in_rec || in_gen)) {
                stk__fmt(err, errlen, "field %zu of record %" PRIu64 " lies outside it", k, j);
                rc = STK_EINVAL;
            }
        }
    }
out:
    stk__free(fs);
    stk__free(t.r);
    feats_free(t.feats, t.nfeat);
    feats_free(d.feats, d.nfeat);
    return rc;
}
