/*
 * tar.c -- WebDataset-style tar shards, read in place with random access.
 *
 * A sample is a run of consecutive regular-file members sharing a key: the
 * member's path up to the first dot of its file name ("dir/n0001.jpg" and
 * "dir/n0001.cls" form sample "dir/n0001"; a file name that starts with a
 * dot or has none is no member of a sample). This is WebDataset's rule, so
 * directories may hold dots ("v1.2/n0001.jpg" has key "v1.2/n0001") and an
 * extension may have several ("n0001.seg.png": field "seg.png").
 *
 * Fields (samples with several fields, docs/multimodal.md): every member of
 * a sample is a field named by its extension, lowercased as WebDataset does
 * ("A.TXT" is field "txt"). The source describes one field per distinct
 * extension (at most STK__MAX_FIELDS, in order of first appearance, kind
 * AUTO: the name decides) with how many samples have it. After select(mask)
 * a read returns one range of bytes spanning the sample's selected members
 * (the members of a tar sample are adjacent; unselected ones between them
 * come along), and the `fields` op points into it, one ref per selected
 * member present. A sample with a selected field twice (two members with
 * the same key and extension) fails with "duplicate field 'txt'", as
 * WebDataset refuses it; an empty member is a field of 0 bytes. After
 * select, a missing or unparsable label member no longer fails the read
 * (the fields asked for decide what a sample needs); the label is still
 * the one below, or -1.
 *
 * Without select, a read is what it always was: the sample's bytes are its
 * first image member (.jpg .jpeg .png .webp .ppm .bmp .pgm .tif .tiff, any
 * case), or if it has none its first member that is not a label. Its label
 * is the integer in its .cls member, or else the "label" or "cls" integer
 * field of its .json member (a small purpose-built scan, not a JSON
 * parser). A dataset in which no sample has a label member is unlabeled
 * (labels -1); otherwise a sample without one fails when read, naming the
 * sample and the reason.
 *
 * Building the index reads every member header (ustar, GNU long names and
 * pax "path"/"size" records are understood) and each label member's bytes.
 * It keeps per sample its key, payload and label (48 bytes) and per member
 * its extension id, offset in the sample and length (12 bytes), so a tar of
 * 100k tiny members needs a few MB. The index is then cached next to the
 * tar (X.tar.stkidx, magic STKTIDX3) or, when that directory is not
 * writable, under $XDG_CACHE_HOME/stoker/tar/ (by default
 * ~/.cache/stoker/tar/), keyed by the tar's size, modification time, inode
 * and ctime, so later opens read one small file. A cache that does not
 * match or fails any check (an older format included) is rebuilt
 * (docs/format.md describes it).
 *
 * Bad input: a corrupt header (checksum mismatch) fails the open, naming the
 * shard and offset. A tar cut short keeps the samples before the cut; the
 * sample whose bytes the cut reaches fails when read, with the reason. Tar
 * has no payload checksums, so corruption inside member bytes passes through
 * to the decoder (which reports what it can).
 */
#include "source/stkformat.h"
#include "io/file.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define TAR_KEEP_FDS  256
#define TAR_NAME_MAX  4096
#define TAR_LABEL_MAX 65536 /* bytes of a .cls/.json member that are scanned */
#define TIDX_MAGIC    "STKTIDX3"
#define TIDX_HEAD     112
#define TIDX_ENTRY    48
#define TIDX_MEMBER   12
#define TAR_MAX_EXTS  1024   /* distinct extensions one shard's index names */
#define EXT_SLOTS     2048   /* the builder's extension hash table (> 2 x TAR_MAX_EXTS) */
#define EXT_NONE      0xffff /* a member that is no field (see describe_fields) */
#define MF_FAR        1u     /* member's offset in its sample or size over 4 GiB */

enum label_state { L_OK = 0, L_MISSING = 1, L_BAD = 2, L_NODATA = 3, L_TRUNC = 4 };

/* One sample. off/len: its payload member (what a read without select
 * gives); members [m0, m0 + nm) of the shard are all its regular-file
 * members, in tar order, at offsets relative to mbase (the data offset of
 * its first member). 48 bytes. */
typedef struct tentry {
    uint64_t off;
    uint64_t key_off;
    uint64_t mbase;
    uint32_t len;
    uint32_t key_len;
    uint32_t m0, nm;
    int32_t label;  /* -1 .. INT32_MAX */
    uint32_t state; /* enum label_state (build-time bits above 0xff) */
} tentry;

/* One member of a sample, compact (12 bytes) so that a tar of many tiny
 * members keeps a small index. field: the shard's extension id in the
 * builder and the cache, the source's field id once open (EXT_NONE: not a
 * field). */
typedef struct tmember {
    uint32_t rel;
    uint32_t len;
    uint16_t field;
    uint16_t flags; /* MF_FAR: rel and len are 0 and unusable */
} tmember;

typedef struct tshard {
    char *path;
    int fd;
    tentry *e;
    uint64_t count;
    char *keys;
    uint64_t keys_len;
    tmember *m;
    uint64_t nmem;
    char *exts; /* nexts NUL-terminated lowercase extensions; freed at open */
    uint64_t exts_len;
    uint32_t nexts;
    uint64_t first, bytes;
} tshard;

typedef struct tarset {
    tshard *shards;
    size_t n;
    uint64_t total_bytes;
    uint64_t mask; /* the fields reads return (select); 0: the payload */
} tarset;

/* ---- Parsing ----------------------------------------------------------- */

/* Where the parser's bytes come from: a descriptor or a memory buffer. */
typedef struct src_rd {
    int fd;
    const uint8_t *buf;
    uint64_t size;
} src_rd;

static int rd_get(const src_rd *r, uint64_t off, void *out, size_t n, char *err, size_t errlen)
{
    if (off > r->size || n > r->size - off) {
        stk__fmt(err, errlen, "read past the end");
        return STK_EIO;
    }
    if (r->buf) {
        memcpy(out, r->buf + off, n);
        return STK_OK;
    }
    return stk__pread_full(r->fd, out, n, off, err, errlen);
}

/* The index being built. */
typedef struct builder {
    tentry *e;
    size_t n, cap;
    char *keys;
    size_t klen, kcap;
    tmember *m;
    size_t nm, mcap;
    char *exts; /* NUL-terminated lowercase extensions, in order of appearance */
    size_t elen, ecap;
    uint32_t *ext_at; /* where each extension starts in exts */
    size_t next, xcap;
    uint16_t slot[EXT_SLOTS]; /* hash of extensions: id + 1, 0 empty */
    bool open_sample;         /* e[n-1] is still collecting members */
    bool has_image;
    bool has_cls;
} builder;

static void builder_free(builder *b)
{
    stk__free(b->e);
    stk__free(b->keys);
    stk__free(b->m);
    stk__free(b->exts);
    stk__free(b->ext_at);
}

/* The id of extension ext (lowercased, as WebDataset does), added when new.
 * Past TAR_MAX_EXTS distinct extensions, and for an empty one ("key."),
 * EXT_NONE: such members are not fields (a hash table, so an adversarial
 * tar with a new extension per member stays linear). */
static int ext_id(builder *b, const char *ext, uint16_t *id)
{
    char low[TAR_NAME_MAX];
    size_t n = strnlen(ext, sizeof low - 1);
    *id = EXT_NONE;
    if (!n)
        return STK_OK;
    for (size_t k = 0; k < n; k++)
        low[k] = (char)(ext[k] >= 'A' && ext[k] <= 'Z' ? ext[k] - 'A' + 'a' : ext[k]);
    low[n] = '\0';
    size_t h = (size_t)stk__xxh3(low, n) & (EXT_SLOTS - 1);
    for (; b->slot[h]; h = (h + 1) & (EXT_SLOTS - 1)) {
        uint16_t k = (uint16_t)(b->slot[h] - 1);
        if (!strcmp(b->exts + b->ext_at[k], low)) {
            *id = k;
            return STK_OK;
        }
    }
    if (b->next >= TAR_MAX_EXTS)
        return STK_OK;
    int rc;
    if ((rc = stk__grow((void **)&b->exts, &b->ecap, b->elen + n + 1, 1)) ||
        (rc = stk__grow((void **)&b->ext_at, &b->xcap, b->next + 1, sizeof *b->ext_at)))
        return rc;
    memcpy(b->exts + b->elen, low, n + 1);
    b->ext_at[b->next] = (uint32_t)b->elen;
    b->elen += n + 1;
    *id = (uint16_t)b->next;
    b->slot[h] = (uint16_t)++b->next;
    return STK_OK;
}

/* Appends a member of sample cur (data at off, size bytes). */
static int add_field_member(builder *b, tentry *cur, const char *ext, uint64_t off, uint64_t size,
                            char *why, size_t wl)
{
    uint16_t id;
    int rc;
    if (b->nm >= UINT32_MAX) {
        stk__fmt(why, wl, "more than %u members in one tar", UINT32_MAX);
        return STK_EFORMAT;
    }
    if ((rc = ext_id(b, ext, &id)) ||
        (rc = stk__grow((void **)&b->m, &b->mcap, b->nm + 1, sizeof *b->m)))
        return rc;
    /* Members come in file order, so off >= mbase. */
    uint64_t rel = off - cur->mbase;
    tmember *m = &b->m[b->nm++];
    memset(m, 0, sizeof *m);
    m->field = id;
    if (rel > UINT32_MAX || size > UINT32_MAX) {
        m->flags = MF_FAR;
    } else {
        m->rel = (uint32_t)rel;
        m->len = (uint32_t)size;
    }
    cur->nm++;
    return STK_OK;
}

static const char *const k_img_exts[] = {"jpg", "jpeg", "png", "webp", "ppm",
                                         "bmp", "pgm",  "tif", "tiff"};

static bool is_image_ext(const char *ext)
{
    const char *last = strrchr(ext, '.');
    last = last ? last + 1 : ext;
    for (size_t k = 0; k < sizeof k_img_exts / sizeof k_img_exts[0]; k++)
        if (!strcasecmp(last, k_img_exts[k]))
            return true;
    return false;
}

/* Parses an optionally signed decimal integer, surrounded by whitespace. */
static bool parse_int_text(const uint8_t *p, size_t n, int64_t *v)
{
    size_t k = 0;
    while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\n' || p[k] == '\r'))
        k++;
    bool neg = k < n && p[k] == '-';
    if (neg)
        k++;
    size_t d0 = k;
    int64_t x = 0;
    while (k < n && p[k] >= '0' && p[k] <= '9') {
        if (x > (INT32_MAX - 9) / 10 + 1)
            return false;
        x = x * 10 + (p[k] - '0');
        k++;
    }
    if (k == d0)
        return false;
    *v = neg ? -x : x;
    while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\n' || p[k] == '\r'))
        k++;
    return k == n || p[k] == '\0';
}

/* Finds "label" or "cls" followed by ':' and an integer in JSON text. */
static bool json_label(const uint8_t *p, size_t n, int64_t *v)
{
    static const char *const keys[] = {"\"label\"", "\"cls\""};
    for (int kk = 0; kk < 2; kk++) {
        size_t kl = strlen(keys[kk]);
        for (size_t i = 0; i + kl <= n; i++) {
            if (memcmp(p + i, keys[kk], kl) != 0)
                continue;
            size_t k = i + kl;
            while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\n' || p[k] == '\r'))
                k++;
            if (k >= n || p[k] != ':')
                continue;
            k++;
            while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\n' || p[k] == '\r'))
                k++;
            size_t s = k;
            if (k < n && p[k] == '-')
                k++;
            while (k < n && p[k] >= '0' && p[k] <= '9')
                k++;
            if (k < n && (p[k] == '.' || p[k] == 'e' || p[k] == 'E'))
                continue; /* not an integer */
            if (k > s && parse_int_text(p + s, k - s, v))
                return true;
        }
    }
    return false;
}

static bool is_label_ext(const char *ext)
{
    return !strcmp(ext, "cls") || !strcmp(ext, "json");
}

/* Adds one regular-file member (name, data offset, size) to the index. */
/* STK_EIO (reason in why) when a label member cannot be read: an I/O error
 * must fail the index, never be recorded (and cached) as a bad label. */
static int add_member(builder *b, const src_rd *r, const char *name, uint64_t off, uint64_t size,
                      bool truncated, char *why, size_t wl)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base)
        return STK_OK; /* no key.extension: not part of a sample */
    size_t klen = (size_t)(dot - name);
    const char *ext = dot + 1;
    int rc;
    tentry *cur = b->open_sample ? &b->e[b->n - 1] : NULL;
    if (!cur || cur->key_len != klen || memcmp(b->keys + cur->key_off, name, klen) != 0) {
        if ((rc = stk__grow((void **)&b->e, &b->cap, b->n + 1, sizeof *b->e)) ||
            (rc = stk__grow((void **)&b->keys, &b->kcap, b->klen + klen + 1, 1)))
            return rc;
        cur = &b->e[b->n++];
        memset(cur, 0, sizeof *cur);
        cur->key_off = b->klen;
        cur->key_len = (uint32_t)klen;
        cur->m0 = (uint32_t)b->nm;
        cur->mbase = off;
        cur->label = -1;
        cur->state = L_NODATA;
        memcpy(b->keys + b->klen, name, klen);
        b->klen += klen;
        b->open_sample = true;
        b->has_image = false;
        b->has_cls = false;
        cur->len = 0;
        /* Label state lives in the high bits while building: bit 8 = a
         * label member was seen. */
    }
    if (truncated) {
        cur->state = L_TRUNC;
        cur->off = off;
        cur->len = (uint32_t)(size > UINT32_MAX ? UINT32_MAX : size);
        return STK_OK;
    }
    if (cur->state == L_TRUNC)
        return STK_OK;
    if ((rc = add_field_member(b, cur, ext, off, size, why, wl)))
        return rc;
    if (is_label_ext(ext)) {
        bool cls = !strcmp(ext, "cls");
        if (b->has_cls || (!cls && (cur->state & 0x100)))
            return STK_OK; /* .cls wins over .json; first of each kind */
        uint8_t small[TAR_LABEL_MAX];
        size_t n = size > TAR_LABEL_MAX ? TAR_LABEL_MAX : (size_t)size;
        int64_t v = -1;
        if ((rc = rd_get(r, off, small, n, why, wl)))
            return rc;
        bool ok = (cls ? parse_int_text(small, n, &v) : json_label(small, n, &v)) && v >= 0 &&
                  v <= INT32_MAX;
        cur->state |= 0x100;
        cur->state &= ~(uint32_t)0x200;
        if (!ok)
            cur->state |= 0x200; /* unparsable */
        cur->label = ok ? (int32_t)v : -1;
        b->has_cls = cls;
        return STK_OK;
    }
    bool img = is_image_ext(ext);
    if ((cur->state & 0xff) == L_NODATA || (img && !b->has_image)) {
        if (size > UINT32_MAX)
            return STK_OK;
        cur->off = off;
        cur->len = (uint32_t)size;
        cur->state = (cur->state & ~(uint32_t)0xff) | L_OK;
        b->has_image = img;
    }
    return STK_OK;
}

/* Turns the build-time bits into the final state of each entry. */
static void finish_states(builder *b)
{
    for (size_t k = 0; k < b->n; k++) {
        tentry *e = &b->e[k];
        uint32_t s = e->state;
        uint32_t data = s & 0xff;
        if (data == L_TRUNC || data == L_NODATA)
            e->state = data;
        else if (!(s & 0x100))
            e->state = L_MISSING;
        else if (s & 0x200)
            e->state = L_BAD;
        else
            e->state = L_OK;
    }
}

static uint64_t parse_octal(const uint8_t *p, size_t n, bool *ok)
{
    uint64_t v = 0;
    size_t k = 0;
    *ok = true;
    if (n && (p[0] & 0x80)) { /* GNU base-256 */
        if (p[0] != 0x80)
            *ok = false;
        for (k = 1; k < n; k++) {
            if (v >> 56)
                *ok = false;
            v = v << 8 | p[k];
        }
        return v;
    }
    while (k < n && p[k] == ' ')
        k++;
    size_t d = 0;
    for (; k < n && p[k] >= '0' && p[k] <= '7'; k++, d++) {
        if (v >> 60)
            *ok = false;
        v = v * 8 + (uint64_t)(p[k] - '0');
    }
    if (k < n && p[k] != ' ' && p[k] != '\0')
        *ok = false;
    if (!d)
        *ok = false;
    return v;
}

static bool block_ok(const uint8_t *b)
{
    unsigned long sum = 0;
    for (int k = 0; k < 512; k++)
        sum += (k >= 148 && k < 156) ? ' ' : b[k];
    bool ok;
    uint64_t want = parse_octal(b + 148, 8, &ok);
    return ok && sum == want;
}

static bool all_zero(const uint8_t *b, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (b[k])
            return false;
    return true;
}

/* Reads pax records ("LEN key=value\n"), taking path and size. */
static void parse_pax(const uint8_t *p, size_t n, char *name, bool *have_name, uint64_t *size,
                      bool *have_size)
{
    size_t k = 0;
    while (k < n) {
        size_t len = 0, s = k;
        while (k < n && p[k] >= '0' && p[k] <= '9' && len < n)
            len = len * 10 + (size_t)(p[k++] - '0');
        if (k >= n || p[k] != ' ' || len == 0 || len > n - s)
            return;
        const uint8_t *rec = p + k + 1, *end = p + s + len;
        if (end[-1] != '\n')
            return;
        const uint8_t *eq = memchr(rec, '=', (size_t)(end - rec));
        if (eq) {
            size_t kl = (size_t)(eq - rec), vl = (size_t)(end - 1 - eq - 1);
            if (kl == 4 && !memcmp(rec, "path", 4) && vl < TAR_NAME_MAX) {
                memcpy(name, eq + 1, vl);
                name[vl] = '\0';
                *have_name = true;
            } else if (kl == 4 && !memcmp(rec, "size", 4)) {
                uint64_t v = 0;
                bool ok = vl > 0 && vl < 20;
                for (size_t q = 0; ok && q < vl; q++) {
                    ok = eq[1 + q] >= '0' && eq[1 + q] <= '9';
                    v = v * 10 + (uint64_t)(eq[1 + q] - '0');
                }
                if (ok) {
                    *size = v;
                    *have_size = true;
                }
            }
        }
        k = s + len;
    }
}

/* Walks the archive and builds the index. tag names the shard in errors. */
static int parse_tar(const src_rd *r, builder *b, const char *tag, char *err, size_t errlen)
{
    int rc = STK_OK;
    uint8_t h[512];
    char *name = NULL, *next_name = NULL;
    uint8_t *ext = NULL;
    bool have_next = false, have_size = false;
    uint64_t next_size = 0, off = 0;
    char why[256];
    if (!(name = stk__malloc(TAR_NAME_MAX)) || !(next_name = stk__malloc(TAR_NAME_MAX)) ||
        !(ext = stk__malloc(TAR_LABEL_MAX))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (;;) {
        if (off >= r->size)
            break;
        if (r->size - off < 512) {
            size_t rest = (size_t)(r->size - off);
            if ((rc = rd_get(r, off, h, rest, why, sizeof why)))
                goto io;
            if (!all_zero(h, rest)) {
                /* Cut inside a member's header: the samples before it are
                 * whole. The cut member is reported as a truncated sample,
                 * under its own name when the header kept it, so nothing is
                 * lost silently. */
                size_t nl = strnlen((const char *)h, rest < 100 ? rest : 100);
                if (nl > 0 && (nl < rest || nl == 100)) {
                    memcpy(name, h, nl);
                    name[nl] = '\0';
                } else {
                    stk__fmt(name, TAR_NAME_MAX, "truncated-member-at-%llu.bin",
                             (unsigned long long)off);
                }
                if ((rc = add_member(b, r, name, off, 0, true, why, sizeof why)))
                    goto member_failed;
            }
            break;
        }
        if ((rc = rd_get(r, off, h, 512, why, sizeof why)))
            goto io;
        if (all_zero(h, 512))
            break; /* end-of-archive marker */
        if (!block_ok(h)) {
            stk__fmt(err, errlen, "%s: corrupt tar header at offset %llu (checksum mismatch)", tag,
                     (unsigned long long)off);
            rc = STK_EFORMAT;
            goto out;
        }
        bool ok;
        uint64_t size = parse_octal(h + 124, 12, &ok);
        if (!ok) {
            stk__fmt(err, errlen, "%s: bad size field in the tar header at offset %llu", tag,
                     (unsigned long long)off);
            rc = STK_EFORMAT;
            goto out;
        }
        if (have_size)
            size = next_size;
        char type = (char)h[156];
        uint64_t data = off + 512;
        bool truncated = size > r->size - data;
        uint64_t padded = size + (512 - size % 512) % 512;
        if (type == 'L' || type == 'x') {
            if (truncated || size >= TAR_NAME_MAX * 4) {
                stk__fmt(err, errlen, "%s: bad extended header at offset %llu", tag,
                         (unsigned long long)off);
                rc = STK_EFORMAT;
                goto out;
            }
            size_t n = (size_t)size;
            uint8_t *tmp = ext;
            if (n > TAR_LABEL_MAX)
                n = TAR_LABEL_MAX;
            if ((rc = rd_get(r, data, tmp, n, why, sizeof why)))
                goto io;
            if (type == 'L') {
                size_t l = strnlen((const char *)tmp, n);
                if (l < TAR_NAME_MAX) {
                    memcpy(next_name, tmp, l);
                    next_name[l] = '\0';
                    have_next = true;
                }
            } else {
                parse_pax(tmp, n, next_name, &have_next, &next_size, &have_size);
            }
            off = data + padded;
            continue;
        }
        if (have_next) {
            memcpy(name, next_name, TAR_NAME_MAX);
        } else {
            size_t pl = 0;
            if (!memcmp(h + 257, "ustar\0", 6) && h[345]) {
                pl = strnlen((const char *)h + 345, 155);
                memcpy(name, h + 345, pl);
                name[pl++] = '/';
            }
            size_t nl = strnlen((const char *)h, 100);
            memcpy(name + pl, h, nl);
            name[pl + nl] = '\0';
        }
        have_next = have_size = false;
        if (type == '0' || type == '\0' || type == '7') {
            if ((rc = add_member(b, r, name, data, size, truncated, why, sizeof why)))
                goto member_failed;
        } else if (truncated) {
            /* Another kind of member running past the end: the tar was cut
             * (or lies); report it as a failed sample rather than dropping
             * whatever followed without a word. */
            stk__fmt(name, TAR_NAME_MAX, "truncated-member-at-%llu.bin", (unsigned long long)off);
            if ((rc = add_member(b, r, name, off, 0, true, why, sizeof why)))
                goto member_failed;
        }
        if (truncated)
            break;
        if (padded > r->size - data) {
            off = r->size;
            break;
        }
        off = data + padded;
    }
    finish_states(b);
    goto out;
member_failed:
    if (rc == STK_ENOMEM)
        goto out;
io:
    stk__fmt(err, errlen, "%s: %s", tag, why);
out:
    stk__free(name);
    stk__free(next_name);
    stk__free(ext);
    return rc;
}

/* ---- Index cache ------------------------------------------------------- */

static void shard_free_index(tshard *t)
{
    stk__free(t->e);
    stk__free(t->keys);
    stk__free(t->m);
    stk__free(t->exts);
    t->e = NULL;
    t->keys = NULL;
    t->m = NULL;
    t->exts = NULL;
    t->count = t->keys_len = t->nmem = t->exts_len = 0;
    t->nexts = 0;
}

/* Checks a loaded index against the tar (tsize bytes): every entry, member
 * and extension as the builder makes them, so a cache that passed its
 * checksum but lies (or was written by a buggy build) is rebuilt rather
 * than trusted. */
static bool index_valid(const tshard *t, uint64_t tsize)
{
    uint64_t kb = t->keys_len, next_m = 0;
    for (uint64_t k = 0; k < t->count; k++) {
        const tentry *e = &t->e[k];
        if (e->state > L_TRUNC || e->label < -1 || e->key_off > kb ||
            e->key_len > kb - e->key_off ||
            (e->state != L_TRUNC && e->state != L_NODATA &&
             (e->off > tsize || e->len > tsize - e->off)))
            return false;
        /* Members are contiguous and in sample order. */
        if (e->m0 != next_m || e->nm > t->nmem - next_m || e->mbase > tsize)
            return false;
        next_m += e->nm;
        for (uint32_t j = 0; j < e->nm; j++) {
            const tmember *m = &t->m[e->m0 + j];
            if ((m->field != EXT_NONE && m->field >= t->nexts) || m->flags > MF_FAR ||
                ((m->flags & MF_FAR) ? (m->rel || m->len)
                                     : (uint64_t)m->rel + m->len > tsize - e->mbase))
                return false;
        }
    }
    if (next_m != t->nmem || t->nexts > TAR_MAX_EXTS)
        return false;
    /* nexts non-empty names, each NUL-terminated, filling exts exactly. */
    uint64_t names = 0;
    for (uint64_t k = 0; k < t->exts_len; k++) {
        if (t->exts[k])
            continue;
        if (k == 0 || !t->exts[k - 1])
            return false;
        names++;
    }
    return names == t->nexts && (!t->exts_len || !t->exts[t->exts_len - 1]);
}

static void get_entry(const uint8_t *p, tentry *e)
{
    e->off = stk__get64(p);
    e->key_off = stk__get64(p + 8);
    e->mbase = stk__get64(p + 16);
    e->len = stk__get32(p + 24);
    e->key_len = stk__get32(p + 28);
    e->m0 = stk__get32(p + 32);
    e->nm = stk__get32(p + 36);
    e->label = (int32_t)stk__get32(p + 40);
    e->state = stk__get32(p + 44);
}

static void put_entry(uint8_t *p, const tentry *e)
{
    stk__put64(p, e->off);
    stk__put64(p + 8, e->key_off);
    stk__put64(p + 16, e->mbase);
    stk__put32(p + 24, e->len);
    stk__put32(p + 28, e->key_len);
    stk__put32(p + 32, e->m0);
    stk__put32(p + 36, e->nm);
    stk__put32(p + 40, (uint32_t)e->label);
    stk__put32(p + 44, e->state);
}

static int cache_load(const char *cpath, const struct stat *tst, tshard *t)
{
    uint8_t *buf = NULL;
    size_t n;
    int rc = stk__sealed_read(cpath, TIDX_MAGIC, TIDX_HEAD + 8, &buf, &n);
    if (rc == STK_ENOENT)
        return rc;
    if (rc)
        goto out;
    rc = STK_EFORMAT;
    if (stk__get64(buf + 8) != (uint64_t)tst->st_size ||
        (int64_t)stk__get64(buf + 16) != (int64_t)tst->st_mtim.tv_sec ||
        (int64_t)stk__get64(buf + 24) != (int64_t)tst->st_mtim.tv_nsec ||
        stk__get64(buf + 56) != (uint64_t)tst->st_ino ||
        stk__get64(buf + 64) != (uint64_t)tst->st_dev ||
        (int64_t)stk__get64(buf + 72) != (int64_t)tst->st_ctim.tv_sec ||
        (int64_t)stk__get64(buf + 80) != (int64_t)tst->st_ctim.tv_nsec)
        goto out; /* size and mtime alone can be restored by cp -p or tar x:
                     the inode and ctime cannot, so a replaced tar is noticed */
    uint64_t count = stk__get64(buf + 32), kb = stk__get64(buf + 40);
    uint64_t nmem = stk__get64(buf + 48), nexts = stk__get64(buf + 88);
    uint64_t eb = stk__get64(buf + 96);
    /* Each part no larger than the body, so the sum below cannot wrap. */
    uint64_t body = n - TIDX_HEAD - 8;
    if (count > body / TIDX_ENTRY || nmem > body / TIDX_MEMBER || kb > body || eb > body ||
        nexts > TAR_MAX_EXTS || count * TIDX_ENTRY + nmem * TIDX_MEMBER + eb + kb != body)
        goto out;
    if (!(t->e = stk__malloc((size_t)(count ? count : 1) * sizeof *t->e)) ||
        !(t->m = stk__malloc((size_t)(nmem ? nmem : 1) * sizeof *t->m)) ||
        !(t->exts = stk__malloc((size_t)(eb ? eb : 1))) ||
        !(t->keys = stk__malloc((size_t)(kb ? kb : 1)))) {
        rc = STK_ENOMEM;
        goto out;
    }
    const uint8_t *p = buf + TIDX_HEAD;
    for (uint64_t k = 0; k < count; k++, p += TIDX_ENTRY)
        get_entry(p, &t->e[k]);
    for (uint64_t k = 0; k < nmem; k++, p += TIDX_MEMBER) {
        t->m[k].rel = stk__get32(p);
        t->m[k].len = stk__get32(p + 4);
        t->m[k].field = (uint16_t)(p[8] | p[9] << 8);
        t->m[k].flags = (uint16_t)(p[10] | p[11] << 8);
    }
    memcpy(t->exts, p, (size_t)eb);
    memcpy(t->keys, p + eb, (size_t)kb);
    t->count = count;
    t->keys_len = kb;
    t->nmem = nmem;
    t->exts_len = eb;
    t->nexts = (uint32_t)nexts;
    rc = index_valid(t, (uint64_t)tst->st_size) ? STK_OK : STK_EFORMAT;
out:
    if (rc)
        shard_free_index(t);
    stk__free(buf);
    return rc;
}

static int cache_store(const char *cpath, const struct stat *tst, const tshard *t)
{
    size_t n = TIDX_HEAD + (size_t)t->count * TIDX_ENTRY + (size_t)t->nmem * TIDX_MEMBER +
               (size_t)t->exts_len + (size_t)t->keys_len + 8;
    uint8_t *buf = stk__malloc(n);
    if (!buf)
        return STK_ENOMEM;
    memset(buf, 0, TIDX_HEAD);
    memcpy(buf, TIDX_MAGIC, 8);
    stk__put64(buf + 8, (uint64_t)tst->st_size);
    stk__put64(buf + 16, (uint64_t)tst->st_mtim.tv_sec);
    stk__put64(buf + 24, (uint64_t)tst->st_mtim.tv_nsec);
    stk__put64(buf + 32, t->count);
    stk__put64(buf + 40, t->keys_len);
    stk__put64(buf + 48, t->nmem);
    stk__put64(buf + 56, (uint64_t)tst->st_ino);
    stk__put64(buf + 64, (uint64_t)tst->st_dev);
    stk__put64(buf + 72, (uint64_t)tst->st_ctim.tv_sec);
    stk__put64(buf + 80, (uint64_t)tst->st_ctim.tv_nsec);
    stk__put64(buf + 88, t->nexts);
    stk__put64(buf + 96, t->exts_len);
    uint8_t *p = buf + TIDX_HEAD;
    for (uint64_t k = 0; k < t->count; k++, p += TIDX_ENTRY)
        put_entry(p, &t->e[k]);
    for (uint64_t k = 0; k < t->nmem; k++, p += TIDX_MEMBER) {
        const tmember *m = &t->m[k];
        stk__put32(p, m->rel);
        stk__put32(p + 4, m->len);
        p[8] = (uint8_t)m->field, p[9] = (uint8_t)(m->field >> 8);
        p[10] = (uint8_t)m->flags, p[11] = (uint8_t)(m->flags >> 8);
    }
    if (t->exts_len)
        memcpy(p, t->exts, (size_t)t->exts_len);
    p += t->exts_len;
    if (t->keys_len)
        memcpy(p, t->keys, (size_t)t->keys_len);
    stk__put64(buf + n - 8, stk__xxh3(buf, n - 8));
    int rc = stk__write_replace(cpath, buf, n);
    stk__free(buf);
    return rc;
}

/* Moves a finished builder's index into t. */
static void shard_take(tshard *t, builder *b)
{
    t->e = b->e;
    t->count = b->n;
    t->keys = b->keys;
    t->keys_len = b->klen;
    t->m = b->m;
    t->nmem = b->nm;
    t->exts = b->exts;
    t->exts_len = b->elen;
    t->nexts = (uint32_t)b->next;
    stk__free(b->ext_at);
    memset(b, 0, sizeof *b);
}

/* Loads shard t's index from a cache, or builds and caches it. */
static int index_shard(tshard *t, int fd, const struct stat *st, char *err, size_t errlen)
{
    char cpath[4096];
    int rc;
    for (int beside = 1; beside >= 0; beside--) {
        if (stk__index_cache_path(t->path, "tar", beside, cpath, sizeof cpath) == STK_OK &&
            (rc = cache_load(cpath, st, t)) != STK_ENOENT && rc != STK_EFORMAT)
            return rc;
    }
    builder *b = stk__calloc(1, sizeof *b);
    if (!b)
        return STK_ENOMEM;
    src_rd r = {fd, NULL, (uint64_t)st->st_size};
    if ((rc = parse_tar(&r, b, t->path, err, errlen))) {
        builder_free(b);
        stk__free(b);
        return rc;
    }
    shard_take(t, b);
    stk__free(b);
    for (int beside = 1; beside >= 0; beside--) {
        if (stk__index_cache_path(t->path, "tar", beside, cpath, sizeof cpath) != STK_OK)
            continue;
        if (!beside)
            stk__mkdirs_for(cpath);
        if (cache_store(cpath, st, t) == STK_OK)
            break;
    }
    return STK_OK;
}

/* ---- Source ------------------------------------------------------------ */

/* ---- Fields ------------------------------------------------------------ */

static bool selected(uint64_t mask, uint16_t field)
{
    return field < 64 && (mask >> field & 1);
}

/* The bytes [*lo, *hi) relative to e->mbase that span e's members whose
 * field is in mask (members of a tar sample are adjacent, so this is one
 * read; unselected members between two selected ones come along). *far:
 * a selected member the compact index cannot address, else NULL. */
static void sel_range(const tshard *t, const tentry *e, uint64_t mask, uint64_t *lo, uint64_t *hi,
                      const tmember **far)
{
    *lo = UINT64_MAX;
    *hi = 0;
    *far = NULL;
    for (uint32_t j = 0; j < e->nm; j++) {
        const tmember *m = &t->m[e->m0 + j];
        if (!selected(mask, m->field))
            continue;
        if (m->flags & MF_FAR) {
            *far = m;
            continue;
        }
        if (m->rel < *lo)
            *lo = m->rel;
        if ((uint64_t)m->rel + m->len > *hi)
            *hi = (uint64_t)m->rel + m->len;
    }
    if (*lo > *hi)
        *lo = *hi = 0;
}

/* The fields of sample e found in bytes/len (what a read gave): with a mask,
 * one ref per selected member (a field twice in one sample is refused, as
 * WebDataset refuses it); without, the payload member's. names: the field
 * names by id, for messages. */
static int sample_fields(const stk__field_desc *names, const tshard *t, const tentry *e,
                         uint64_t mask, const uint8_t *bytes, size_t len, stk__field_set *fs,
                         char *err, size_t errlen)
{
    fs->n = 0;
    fs->gen_used = 0;
    if (!mask) {
        for (uint32_t j = 0; e->state != L_TRUNC && e->state != L_NODATA && j < e->nm; j++) {
            const tmember *m = &t->m[e->m0 + j];
            if (!(m->flags & MF_FAR) && m->field != EXT_NONE && e->mbase + m->rel == e->off &&
                m->len == len) {
                fs->f[fs->n++] = (stk__field_ref){m->field, bytes, len};
                break;
            }
        }
        return STK_OK;
    }
    uint64_t lo, hi;
    const tmember *far;
    sel_range(t, e, mask, &lo, &hi, &far);
    if (len != hi - lo) {
        stk__fmt(err, errlen, "the read gave %zu bytes, the index says the fields span %llu", len,
                 (unsigned long long)(hi - lo));
        return STK_EFORMAT;
    }
    fs->nothers = 0;
    for (uint32_t j = 0; j < e->nm; j++) {
        const tmember *m = &t->m[e->m0 + j];
        if (!selected(mask, m->field) && m->field != EXT_NONE && m->field < STK__MAX_FIELDS) {
            bool seen = false;
            for (size_t k = 0; k < fs->nothers && !seen; k++)
                seen = fs->others[k] == m->field;
            if (!seen)
                fs->others[fs->nothers++] = m->field;
        }
        if (!selected(mask, m->field) || (m->flags & MF_FAR))
            continue;
        for (size_t k = 0; k < fs->n; k++) {
            if (fs->f[k].id == m->field) {
                stk__fmt(err, errlen,
                         "duplicate field '%s' (two members named %.*s.%s; a sample has each "
                         "field once)",
                         names[m->field].name, (int)(e->key_len > 1024 ? 1024 : e->key_len),
                         t->keys + e->key_off, names[m->field].name);
                return STK_EFORMAT;
            }
        }
        if (fs->n >= STK__MAX_FIELDS) /* unreachable: at most 64 distinct ids */
            break;
        fs->f[fs->n++] = (stk__field_ref){m->field, bytes + (m->rel - lo), m->len};
    }
    return STK_OK;
}

/* Describes the source's fields, one per distinct extension across the
 * shards in order of first appearance (at most STK__MAX_FIELDS; members
 * with further extensions are no fields), turns every member's shard
 * extension id into the source's field id, counts the samples that have
 * each, and frees the shards' extension tables. */
static int describe_fields(stk__source *s, tarset *d)
{
    uint64_t stamp[STK__MAX_FIELDS] = {0}, have[STK__MAX_FIELDS] = {0};
    uint16_t *map = stk__malloc(TAR_MAX_EXTS * sizeof *map);
    if (!map)
        return STK_ENOMEM;
    uint64_t sample = 0;
    for (size_t k = 0; k < d->n; k++) {
        tshard *t = &d->shards[k];
        const char *name = t->exts;
        for (uint32_t x = 0; x < t->nexts; x++, name += strlen(name) + 1) {
            size_t f = 0;
            while (f < s->nfields && strcmp(s->fields[f].name, name))
                f++;
            map[x] = EXT_NONE;
            if (f < s->nfields) {
                map[x] = (uint16_t)f;
            } else if (s->nfields < STK__MAX_FIELDS) {
                int id = stk__source_add_field(s, name, strlen(name), STK_FIELD_AUTO, 0);
                if (id < 0) {
                    stk__free(map);
                    return STK_ENOMEM;
                }
                map[x] = (uint16_t)id;
            }
        }
        for (uint64_t j = 0; j < t->nmem; j++)
            if (t->m[j].field != EXT_NONE)
                t->m[j].field = t->m[j].field < t->nexts ? map[t->m[j].field] : EXT_NONE;
        for (uint64_t j = 0; j < t->count; j++) {
            const tentry *e = &t->e[j];
            sample++;
            for (uint32_t q = 0; q < e->nm; q++) {
                uint16_t f = t->m[e->m0 + q].field;
                if (f < STK__MAX_FIELDS && stamp[f] != sample) {
                    stamp[f] = sample;
                    have[f]++;
                }
            }
        }
        stk__free(t->exts);
        t->exts = NULL;
        t->exts_len = 0;
        t->nexts = 0;
    }
    for (size_t f = 0; f < s->nfields; f++)
        s->fields[f].samples = have[f];
    stk__free(map);
    return STK_OK;
}

static int tar_select(stk__source *s, uint64_t mask, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    tarset *d = s->impl;
    d->mask = mask;
    return STK_OK;
}

static int tar_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                      int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    (void)label;
    const tarset *d = s->impl;
    const tshard *t = &d->shards[stk__source_shard_of(s, i)];
    return sample_fields(s->fields, t, &t->e[i - t->first], d->mask, bytes, len, fs, err, errlen);
}

/* pread n bytes at off of shard t into the sink. */
static int read_span(const tshard *t, uint64_t off, uint64_t n, stk__sink *sink, uint8_t **data,
                     char *err, size_t errlen)
{
    int rc;
    static uint8_t empty[1];
    uint8_t *buf = n > SIZE_MAX ? NULL : stk__sink_reserve(sink, (size_t)n, &rc);
    if (n > SIZE_MAX)
        rc = STK_ETOOBIG;
    if (!buf && rc == STK_OK && n == 0)
        buf = empty; /* a fixed sink of no bytes */
    if (!buf) {
        if (rc == STK_ETOOBIG)
            stk__fmt(err, errlen, "sample of %llu bytes does not fit its %zu-byte budget",
                     (unsigned long long)n, sink->grow ? sink->grow->limit : sink->cap);
        else
            stk__fmt(err, errlen, "out of memory for %llu bytes", (unsigned long long)n);
        return rc;
    }
    int fd = t->fd;
    if (fd < 0 && (fd = stk__open(t->path, O_RDONLY | O_CLOEXEC)) < 0) {
        stk__fmt(err, errlen, "cannot open shard: %s", strerror(errno));
        return STK_EIO;
    }
    rc = stk__pread_full(fd, buf, (size_t)n, off, err, errlen);
    if (fd != t->fd)
        stk__close(fd);
    if (rc == STK_OK)
        *data = buf;
    return rc;
}

/* A read after select: one range spanning the selected members. Label
 * members that are missing or unparsable do not fail it (the fields asked
 * for decide what a sample needs); the label is what the index holds (-1
 * then). */
static int read_selected(const stk__source *s, const tshard *t, const tentry *e, uint64_t mask,
                         stk__sink *sink, uint8_t **data, size_t *len, int64_t *label, char *err,
                         size_t errlen)
{
    uint64_t lo, hi;
    const tmember *far;
    sel_range(t, e, mask, &lo, &hi, &far);
    if (far) {
        stk__fmt(err, errlen,
                 "member %.*s.%s is over 4 GiB or starts over 4 GiB into its sample (not "
                 "supported as a field)",
                 (int)(e->key_len > 1024 ? 1024 : e->key_len), t->keys + e->key_off,
                 s->fields[far->field].name);
        return STK_ETOOBIG;
    }
    int rc = read_span(t, e->mbase + lo, hi - lo, sink, data, err, errlen);
    if (rc)
        return rc;
    *len = (size_t)(hi - lo);
    *label = e->label;
    return STK_OK;
}

static int tar_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                    int64_t *label, char *err, size_t errlen)
{
    const tarset *d = s->impl;
    const tshard *t = &d->shards[stk__source_shard_of(s, i)];
    const tentry *e = &t->e[i - t->first];
    int rc;
    if (d->mask && e->state != L_TRUNC)
        return read_selected(s, t, e, d->mask, sink, data, len, label, err, errlen);
    switch (e->state) {
    case L_OK: break;
    case L_MISSING:
        stk__fmt(err, errlen, "sample has no label (no .cls or .json member)");
        return STK_EFORMAT;
    case L_BAD:
        stk__fmt(err, errlen,
                 "label member is not an integer (.cls) or has no integer \"label\"/\"cls\" "
                 "field (.json)");
        return STK_EFORMAT;
    case L_NODATA:
        stk__fmt(err, errlen, "sample has no data member (only label members)");
        return STK_EFORMAT;
    default:
        stk__fmt(err, errlen,
                 "the tar is truncated: this sample's members are cut off at offset %llu "
                 "(file is %llu bytes)",
                 (unsigned long long)e->off, (unsigned long long)t->bytes);
        return STK_EFORMAT;
    }
    uint8_t *buf = stk__sink_take(sink, e->len, "sample", &rc, err, errlen);
    if (!buf)
        return rc;
    int fd = t->fd;
    if (fd < 0 && (fd = stk__open(t->path, O_RDONLY | O_CLOEXEC)) < 0) {
        stk__fmt(err, errlen, "cannot open shard: %s", strerror(errno));
        return STK_EIO;
    }
    rc = stk__pread_full(fd, buf, e->len, e->off, err, errlen);
    if (fd != t->fd)
        stk__close(fd);
    if (rc)
        return rc;
    *data = buf;
    *len = e->len;
    *label = e->label;
    return STK_OK;
}

static void tar_key(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const tarset *d = s->impl;
    const tshard *t = &d->shards[stk__source_shard_of(s, i)];
    const tentry *e = &t->e[i - t->first];
    stk__fmt(buf, n, "%.*s", (int)(e->key_len > 4096 ? 4096 : e->key_len), t->keys + e->key_off);
}

static void tar_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const tarset *d = s->impl;
    const tshard *t = &d->shards[stk__source_shard_of(s, i)];
    char key[512];
    tar_key(s, i, key, sizeof key);
    stk__fmt(buf, n, "%s#%llu key '%s'", t->path, (unsigned long long)(i - t->first), key);
}

static void tar_describe(const stk__source *s, stk__dataset_info *di)
{
    const tarset *d = s->impl;
    di->format = "tar";
    di->payload = "encoded";
    di->shards = d->n;
    di->bytes = d->total_bytes;
}

static void tar_close(stk__source *s)
{
    tarset *d = s->impl;
    if (!d)
        return;
    for (size_t k = 0; k < d->n; k++) {
        if (d->shards[k].fd >= 0)
            stk__close(d->shards[k].fd);
        stk__free(d->shards[k].path);
        shard_free_index(&d->shards[k]);
    }
    stk__free(d->shards);
    stk__free(d);
    s->impl = NULL;
}

static const stk__source_ops k_tar_ops = {.kind = "tar",
                                          .read = tar_read,
                                          .name = tar_name,
                                          .close = tar_close,
                                          .flags = STK__SRC_IMAGES,
                                          .describe = tar_describe,
                                          .key = tar_key,
                                          .select = tar_select,
                                          .fields = tar_fields};

int stk__source_tar_open(stk__source *s, const char *const *paths, size_t n, char *err,
                         size_t errlen)
{
    int rc = STK_OK;
    tarset *d = NULL;
    memset(s, 0, sizeof *s);
    if (!n) {
        stk__fmt(err, errlen, "no tar shards");
        return STK_EEMPTY;
    }
    if (!(d = stk__calloc(1, sizeof *d)) || !(d->shards = stk__calloc(n, sizeof *d->shards))) {
        rc = STK_ENOMEM;
        goto out;
    }
    bool keep = n <= TAR_KEEP_FDS, labeled = false;
    uint64_t total = 0;
    int64_t maxl = -1;
    for (size_t k = 0; k < n; k++) {
        tshard *t = &d->shards[k];
        t->fd = -1;
        d->n = k + 1;
        if (!(t->path = stk__strdup(paths[k]))) {
            rc = STK_ENOMEM;
            goto out;
        }
        struct stat st;
        int fd = stk__open_regular(t->path, t->path, &st, err, errlen);
        if (fd < 0) {
            rc = fd;
            goto out;
        }
        t->bytes = (uint64_t)st.st_size;
        rc = index_shard(t, fd, &st, err, errlen);
        if (keep && rc == STK_OK)
            t->fd = fd;
        else
            stk__close(fd);
        if (rc)
            goto out;
        t->first = total;
        total += t->count;
        d->total_bytes += t->bytes;
        for (uint64_t j = 0; j < t->count; j++) {
            if (t->e[j].state == L_OK || t->e[j].state == L_BAD)
                labeled = true;
            if (t->e[j].label > maxl)
                maxl = t->e[j].label;
        }
        s->index_bytes +=
            t->count * sizeof *t->e + t->nmem * sizeof *t->m + t->keys_len + strlen(t->path) + 1;
    }
    if (!labeled) {
        /* No sample has a label member: an unlabeled dataset, not n errors. */
        for (size_t k = 0; k < d->n; k++)
            for (uint64_t j = 0; j < d->shards[k].count; j++)
                if (d->shards[k].e[j].state == L_MISSING)
                    d->shards[k].e[j].state = L_OK;
    }
    if (!total) {
        stk__fmt(err, errlen, "%s%s: no samples (members named KEY.EXT)", d->shards[0].path,
                 n > 1 ? " and the other shards" : "");
        rc = STK_EEMPTY;
        goto out;
    }
    if ((rc = describe_fields(s, d))) {
        stk__fmt(err, errlen, "out of memory describing the fields of %s", d->shards[0].path);
        goto out;
    }
    /* Shard boundaries, for the shard-aware order. */
    if (!(s->shard_first = stk__calloc(d->n + 1, sizeof *s->shard_first))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < d->n; k++)
        s->shard_first[k] = d->shards[k].first;
    s->shard_first[d->n] = total;
    s->nshards = d->n;
    s->ops = &k_tar_ops;
    s->impl = d;
    s->count = total;
    s->num_classes = (uint64_t)(maxl + 1);
    s->index_bytes += sizeof *d + n * sizeof *d->shards + (d->n + 1) * sizeof *s->shard_first;
    d = NULL;
out:
    if (d) {
        stk__source tmp = {.impl = d};
        tar_close(&tmp);
        stk__source_free_common(s);
    }
    return rc;
}

/* ---- Fuzz entry -------------------------------------------------------- */

/* Runs the field grouping of every sample of a parsed buffer with all
 * fields selected, as a loader after select would: each sample's range and
 * each field's bytes must lie inside the buffer (STK_EINVAL otherwise). A
 * sample's own errors (duplicate fields) are data, not failures. */
static int check_fields(const uint8_t *buf, size_t n, tarset *d, char *err, size_t errlen)
{
    stk__source src = {0};
    stk__field_set *fs = stk__malloc(sizeof *fs);
    int rc = fs ? describe_fields(&src, d) : STK_ENOMEM;
    const tshard *t = &d->shards[0];
    uint64_t mask = src.nfields >= 64 ? UINT64_MAX : ((uint64_t)1 << src.nfields) - 1;
    for (uint64_t k = 0; rc == STK_OK && k < t->count; k++) {
        const tentry *e = &t->e[k];
        uint64_t lo, hi;
        const tmember *far;
        char why[STK_ERRMSG_MAX];
        if (e->state == L_TRUNC)
            continue;
        sel_range(t, e, mask, &lo, &hi, &far);
        if (e->mbase > n || hi > n - e->mbase) {
            stk__fmt(err, errlen, "internal: sample %llu's fields outside the input",
                     (unsigned long long)k);
            rc = STK_EINVAL;
            break;
        }
        const uint8_t *p = buf + e->mbase + lo;
        if (sample_fields(src.fields, t, e, mask, p, (size_t)(hi - lo), fs, why, sizeof why))
            continue;
        /* A member's data follows its 512-byte header, on a block boundary. */
        for (size_t f = 0; f < fs->n; f++)
            if (fs->f[f].id >= src.nfields || fs->f[f].data < p ||
                fs->f[f].len > (size_t)(buf + n - fs->f[f].data) ||
                (size_t)(fs->f[f].data - buf) % 512) {
                stk__fmt(err, errlen, "internal: sample %llu's field %zu outside the input",
                         (unsigned long long)k, f);
                rc = STK_EINVAL;
            }
    }
    stk__free(fs);
    stk__source_free_common(&src);
    return rc;
}

int stk__tar_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err, size_t errlen)
{
    builder *b = stk__calloc(1, sizeof *b);
    if (!b)
        return STK_ENOMEM;
    src_rd r = {-1, buf, n};
    int rc = parse_tar(&r, b, "tar", err, errlen);
    *samples = b->n;
    tshard t = {0};
    shard_take(&t, b);
    stk__free(b);
    /* Every entry must point inside the buffer unless marked truncated: a
     * violation is a parser bug, reported as STK_EINVAL for the fuzzer. The
     * index must also pass the checks a cached one passes. */
    for (uint64_t k = 0; rc == STK_OK && k < t.count; k++) {
        const tentry *e = &t.e[k];
        if ((e->state != L_TRUNC && e->state != L_NODATA && (e->off > n || e->len > n - e->off)) ||
            e->key_off + e->key_len > t.keys_len) {
            stk__fmt(err, errlen, "internal: index entry %llu outside the input",
                     (unsigned long long)k);
            rc = STK_EINVAL;
        }
    }
    if (rc == STK_OK && !index_valid(&t, n)) {
        stk__fmt(err, errlen, "internal: the index fails the cache's checks");
        rc = STK_EINVAL;
    }
    tarset d = {&t, 1, n, 0};
    if (rc == STK_OK)
        rc = check_fields(buf, n, &d, err, errlen);
    shard_free_index(&t);
    return rc;
}
