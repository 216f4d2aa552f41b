/*
 * tar.c -- WebDataset-style tar shards, read in place with random access.
 *
 * A sample is a run of consecutive regular-file members sharing a key: the
 * member's path up to the first dot of its file name ("dir/n0001.jpg" and
 * "dir/n0001.cls" form sample "dir/n0001"). Its bytes are its first image
 * member (.jpg .jpeg .png .webp .ppm .bmp .pgm .tif .tiff, any case), or if
 * it has none its first member that is not a label. Its label is the integer
 * in its .cls member, or else the "label" or "cls" integer field of its
 * .json member (a small purpose-built scan, not a JSON parser). A dataset in
 * which no sample has a label member is unlabeled (labels -1); otherwise a
 * sample without one fails when read, naming the sample and the reason.
 *
 * Building the index reads every member header (ustar, GNU long names and
 * pax "path"/"size" records are understood) and each label member's bytes.
 * The index is then cached next to the tar (X.tar.stkidx) or, when that
 * directory is not writable, under $XDG_CACHE_HOME/stoker/tar/ (by default
 * ~/.cache/stoker/tar/), keyed by the tar's size and modification time, so
 * later opens read one small file. A cache that does not match or fails any
 * check is rebuilt (docs/format.md describes it).
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
#define TIDX_MAGIC    "STKTIDX2"
#define TIDX_HEAD     88

enum label_state { L_OK = 0, L_MISSING = 1, L_BAD = 2, L_NODATA = 3, L_TRUNC = 4 };

typedef struct tentry {
    uint64_t off;
    uint32_t len;
    uint32_t key_len;
    uint64_t key_off;
    int64_t label;
    uint64_t state;
} tentry;

typedef struct tshard {
    char *path;
    int fd;
    tentry *e;
    uint64_t count;
    char *keys;
    uint64_t keys_len;
    uint64_t first, bytes;
} tshard;

typedef struct tarset {
    tshard *shards;
    size_t n;
    uint64_t total_bytes;
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
    bool open_sample; /* e[n-1] is still collecting members */
    bool has_image;
    bool has_cls;
} builder;

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
        cur->state &= ~(uint64_t)0x200;
        if (!ok)
            cur->state |= 0x200; /* unparsable */
        cur->label = ok ? v : -1;
        b->has_cls = cls;
        return STK_OK;
    }
    bool img = is_image_ext(ext);
    if ((cur->state & 0xff) == L_NODATA || (img && !b->has_image)) {
        if (size > UINT32_MAX)
            return STK_OK;
        cur->off = off;
        cur->len = (uint32_t)size;
        cur->state = (cur->state & ~(uint64_t)0xff) | L_OK;
        b->has_image = img;
    }
    return STK_OK;
}

/* Turns the build-time bits into the final state of each entry. */
static void finish_states(builder *b)
{
    for (size_t k = 0; k < b->n; k++) {
        tentry *e = &b->e[k];
        uint64_t s = e->state;
        uint64_t data = s & 0xff;
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
    if (rc != STK_EIO)
        goto out;
io:
    stk__fmt(err, errlen, "%s: %s", tag, why);
out:
    stk__free(name);
    stk__free(next_name);
    stk__free(ext);
    return rc;
}

int stk__tar_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err, size_t errlen)
{
    builder b = {0};
    src_rd r = {-1, buf, n};
    int rc = parse_tar(&r, &b, "tar", err, errlen);
    *samples = b.n;
    /* Every entry must point inside the buffer unless marked truncated: a
     * violation is a parser bug, reported as STK_EINVAL for the fuzzer. */
    for (size_t k = 0; rc == STK_OK && k < b.n; k++) {
        if ((b.e[k].state != L_TRUNC && b.e[k].state != L_NODATA &&
             (b.e[k].off > n || b.e[k].len > n - b.e[k].off)) ||
            b.e[k].key_off + b.e[k].key_len > b.klen) {
            stk__fmt(err, errlen, "internal: index entry %zu outside the input", k);
            rc = STK_EINVAL;
        }
    }
    stk__free(b.e);
    stk__free(b.keys);
    return rc;
}

/* ---- Index cache ------------------------------------------------------- */

static int cache_path(const char *tar, bool beside, char *out, size_t n)
{
    if (beside) {
        stk__fmt(out, n, "%s.stkidx", tar);
        return STK_OK;
    }
    char abs[4096];
    if (!realpath(tar, abs))
        return STK_EIO;
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char dir[4096];
    if (xdg && *xdg)
        stk__fmt(dir, sizeof dir, "%s/stoker/tar", xdg);
    else if (home && *home)
        stk__fmt(dir, sizeof dir, "%s/.cache/stoker/tar", home);
    else
        return STK_EIO;
    stk__fmt(out, n, "%s/%016llx.stkidx", dir, (unsigned long long)stk__xxh3(abs, strlen(abs)));
    return STK_OK;
}

static void mkdirs(const char *file)
{
    char p[4096];
    stk__fmt(p, sizeof p, "%s", file);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            (void)mkdir(p, 0755);
            *s = '/';
        }
    }
}

static int cache_load(const char *cpath, const struct stat *tst, tshard *t)
{
    int rc = STK_EFORMAT;
    uint8_t *buf = NULL;
    char why[128];
    int fd = stk__open(cpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return STK_ENOENT;
    struct stat st;
    if (stk__fstat(fd, &st) != 0 || st.st_size < TIDX_HEAD + 8 || st.st_size > (1LL << 40))
        goto out;
    size_t n = (size_t)st.st_size;
    if (!(buf = stk__malloc(n))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if (stk__pread_full(fd, buf, n, 0, why, sizeof why) || memcmp(buf, TIDX_MAGIC, 8) ||
        stk__get64(buf + n - 8) != stk__xxh3(buf, n - 8) ||
        stk__get64(buf + 8) != (uint64_t)tst->st_size ||
        (int64_t)stk__get64(buf + 16) != (int64_t)tst->st_mtim.tv_sec ||
        (int64_t)stk__get64(buf + 24) != (int64_t)tst->st_mtim.tv_nsec ||
        stk__get64(buf + 56) != (uint64_t)tst->st_ino ||
        stk__get64(buf + 64) != (uint64_t)tst->st_dev ||
        (int64_t)stk__get64(buf + 72) != (int64_t)tst->st_ctim.tv_sec ||
        (int64_t)stk__get64(buf + 80) != (int64_t)tst->st_ctim.tv_nsec)
        goto out; /* size and mtime alone can be restored by cp -p or tar x:
                     the inode and ctime cannot, so a replaced tar is noticed */
    uint64_t count = stk__get64(buf + 32), kb = stk__get64(buf + 40);
    uint64_t body = n - TIDX_HEAD - 8;
    if (count > body / STK_ENTRY_SIZE || kb != body - count * STK_ENTRY_SIZE)
        goto out;
    if (!(t->e = stk__malloc((size_t)(count ? count : 1) * sizeof *t->e)) ||
        !(t->keys = stk__malloc((size_t)(kb ? kb : 1)))) {
        rc = STK_ENOMEM;
        goto out;
    }
    const uint8_t *p = buf + TIDX_HEAD;
    uint64_t tsize = (uint64_t)tst->st_size;
    for (uint64_t k = 0; k < count; k++, p += STK_ENTRY_SIZE) {
        tentry *e = &t->e[k];
        e->off = stk__get64(p);
        e->len = stk__get32(p + 8);
        e->key_len = stk__get32(p + 12);
        e->key_off = stk__get64(p + 16);
        e->label = (int64_t)stk__get64(p + 24);
        e->state = stk__get64(p + 32);
        if (e->state > L_TRUNC || e->label < -1 || e->label > INT32_MAX || e->key_off > kb ||
            e->key_len > kb - e->key_off ||
            (e->state != L_TRUNC && e->state != L_NODATA &&
             (e->off > tsize || e->len > tsize - e->off)))
            goto out;
    }
    memcpy(t->keys, p, (size_t)kb);
    t->count = count;
    t->keys_len = kb;
    rc = STK_OK;
out:
    if (rc) {
        stk__free(t->e);
        stk__free(t->keys);
        t->e = NULL;
        t->keys = NULL;
    }
    stk__free(buf);
    stk__close(fd);
    return rc;
}

static int cache_store(const char *cpath, const struct stat *tst, const tshard *t)
{
    int rc = STK_EIO;
    size_t n = TIDX_HEAD + (size_t)t->count * STK_ENTRY_SIZE + (size_t)t->keys_len + 8;
    uint8_t *buf = stk__malloc(n);
    char tmp[4200];
    if (!buf)
        return STK_ENOMEM;
    memset(buf, 0, TIDX_HEAD);
    memcpy(buf, TIDX_MAGIC, 8);
    stk__put64(buf + 8, (uint64_t)tst->st_size);
    stk__put64(buf + 16, (uint64_t)tst->st_mtim.tv_sec);
    stk__put64(buf + 24, (uint64_t)tst->st_mtim.tv_nsec);
    stk__put64(buf + 32, t->count);
    stk__put64(buf + 40, t->keys_len);
    stk__put64(buf + 56, (uint64_t)tst->st_ino);
    stk__put64(buf + 64, (uint64_t)tst->st_dev);
    stk__put64(buf + 72, (uint64_t)tst->st_ctim.tv_sec);
    stk__put64(buf + 80, (uint64_t)tst->st_ctim.tv_nsec);
    uint8_t *p = buf + TIDX_HEAD;
    for (uint64_t k = 0; k < t->count; k++, p += STK_ENTRY_SIZE) {
        const tentry *e = &t->e[k];
        stk__put64(p, e->off);
        stk__put32(p + 8, e->len);
        stk__put32(p + 12, e->key_len);
        stk__put64(p + 16, e->key_off);
        stk__put64(p + 24, (uint64_t)e->label);
        stk__put64(p + 32, e->state);
    }
    if (t->keys_len)
        memcpy(p, t->keys, (size_t)t->keys_len);
    stk__put64(buf + n - 8, stk__xxh3(buf, n - 8));
    /* Unique per writer: two loaders of one process (or two processes with
     * the same pid in different containers sharing the directory) must not
     * write or unlink each other's temporary file. */
    static atomic_uint seq;
    unsigned writer = atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed);
    stk__fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u.%llx", cpath, (long)getpid(), writer,
             (unsigned long long)stk__now_ns());
    int fd = stk__open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        rc = stk__write_full(fd, buf, n);
        if (stk__close(fd) != 0)
            rc = STK_EIO;
        if (rc == STK_OK && rename(tmp, cpath) != 0)
            rc = STK_EIO;
        if (rc)
            unlink(tmp);
    }
    stk__free(buf);
    return rc;
}

/* Loads shard t's index from a cache, or builds and caches it. */
static int index_shard(tshard *t, int fd, const struct stat *st, char *err, size_t errlen)
{
    char cpath[4096];
    int rc;
    for (int beside = 1; beside >= 0; beside--) {
        if (cache_path(t->path, beside, cpath, sizeof cpath) == STK_OK &&
            (rc = cache_load(cpath, st, t)) != STK_ENOENT && rc != STK_EFORMAT)
            return rc;
    }
    builder b = {0};
    src_rd r = {fd, NULL, (uint64_t)st->st_size};
    if ((rc = parse_tar(&r, &b, t->path, err, errlen))) {
        stk__free(b.e);
        stk__free(b.keys);
        return rc;
    }
    t->e = b.e;
    t->count = b.n;
    t->keys = b.keys;
    t->keys_len = b.klen;
    for (int beside = 1; beside >= 0; beside--) {
        if (cache_path(t->path, beside, cpath, sizeof cpath) != STK_OK)
            continue;
        if (!beside)
            mkdirs(cpath);
        if (cache_store(cpath, st, t) == STK_OK)
            break;
    }
    return STK_OK;
}

/* ---- Source ------------------------------------------------------------ */

static const tshard *find_tshard(const tarset *d, uint64_t i)
{
    size_t lo = 0, hi = d->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->shards[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return &d->shards[lo];
}

static int tar_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                    int64_t *label, char *err, size_t errlen)
{
    const tarset *d = s->impl;
    const tshard *t = find_tshard(d, i);
    const tentry *e = &t->e[i - t->first];
    int rc;
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
    uint8_t *buf = stk__sink_reserve(sink, e->len, &rc);
    if (!buf) {
        if (rc == STK_ETOOBIG)
            stk__fmt(err, errlen, "sample of %u bytes does not fit its %zu-byte budget", e->len,
                     sink->grow ? sink->grow->limit : sink->cap);
        else
            stk__fmt(err, errlen, "out of memory for %u bytes", e->len);
        return rc;
    }
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
    const tshard *t = find_tshard(d, i);
    const tentry *e = &t->e[i - t->first];
    stk__fmt(buf, n, "%.*s", (int)(e->key_len > 4096 ? 4096 : e->key_len), t->keys + e->key_off);
}

static void tar_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const tarset *d = s->impl;
    const tshard *t = find_tshard(d, i);
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
        stk__free(d->shards[k].e);
        stk__free(d->shards[k].keys);
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
                                          .key = tar_key};

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
        int fd = stk__open(t->path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        int sr = fd < 0 ? -1 : stk__fstat(fd, &st);
        if (sr != 0 || !S_ISREG(st.st_mode)) {
            int e = errno;
            stk__fmt(err, errlen, "%s: %s", t->path, sr ? strerror(e) : "not a file");
            rc = fd < 0 && e == ENOENT ? STK_ENOENT : STK_EIO;
            if (fd >= 0)
                stk__close(fd);
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
        s->index_bytes += t->count * sizeof *t->e + t->keys_len + strlen(t->path) + 1;
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
    }
    return rc;
}
