/*
 * stkformat.c -- the .stk format shared by the reader (stk.c), the writer
 * (packing, src/pack/) and the fuzz target: header, footer and index coding
 * and checks, and the crash-safe shard writer. docs/format.md is the
 * specification this follows. The manifest is manifest.c's.
 */
#include "source/stkformat.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t stk__xxh3(const void *p, size_t n)
{
    return (uint64_t)XXH3_64bits(p, n);
}

const char *stk__payload_kind_name(uint32_t kind)
{
    switch (kind) {
    case STK_PAYLOAD_ENCODED: return "encoded";
    case STK_PAYLOAD_RESIZED: return "resized";
    case STK_PAYLOAD_RAW: return "raw";
    case STK_PAYLOAD_FIELDS: return "fields";
    default: return "unknown";
    }
}

void stk__stk_header_encode(uint8_t out[STK_HEADER_SIZE], const stk__stk_header *h)
{
    memset(out, 0, STK_HEADER_SIZE);
    memcpy(out, STK_MAGIC, 8);
    /* Version 1 for the kinds it has always had, so their shards stay
     * byte-identical and older readers keep reading them; version 2 only for
     * the layout they cannot read (a field table after the keys). */
    stk__put16(out + 8,
               h->kind == STK_PAYLOAD_FIELDS ? STK_VERSION_MAJOR_FIELDS : STK_VERSION_MAJOR_FMT);
    stk__put16(out + 10, STK_VERSION_MINOR_FMT);
    stk__put32(out + 12, h->flags);
    stk__put32(out + 16, h->kind);
    stk__put32(out + 20, h->align);
    stk__put32(out + 24, h->raw_h);
    stk__put32(out + 28, h->raw_w);
    stk__put32(out + 32, h->raw_c);
    stk__put32(out + 36, h->max_side);
    stk__put32(out + 40, h->quality);
    stk__put64(out + 56, stk__xxh3(out, 56));
}

int stk__stk_header_decode(const uint8_t in[STK_HEADER_SIZE], stk__stk_header *h, char *err,
                           size_t errlen)
{
    if (memcmp(in, STK_MAGIC, 8) != 0) {
        stk__fmt(err, errlen, "not a .stk shard (wrong magic)");
        return STK_EFORMAT;
    }
    h->major = stk__get16(in + 8);
    h->minor = stk__get16(in + 10);
    if (h->major != STK_VERSION_MAJOR_FMT && h->major != STK_VERSION_MAJOR_FIELDS) {
        stk__fmt(err, errlen, "unsupported .stk version %u.%u (this build reads %d.x and %d.x)",
                 h->major, h->minor, STK_VERSION_MAJOR_FMT, STK_VERSION_MAJOR_FIELDS);
        return STK_EFORMAT;
    }
    if (stk__get64(in + 56) != stk__xxh3(in, 56)) {
        stk__fmt(err, errlen, "header checksum mismatch (corrupt header)");
        return STK_EFORMAT;
    }
    h->flags = stk__get32(in + 12);
    h->kind = stk__get32(in + 16);
    h->align = stk__get32(in + 20);
    h->raw_h = stk__get32(in + 24);
    h->raw_w = stk__get32(in + 28);
    h->raw_c = stk__get32(in + 32);
    h->max_side = stk__get32(in + 36);
    h->quality = stk__get32(in + 40);
    if (h->flags & ~(STK_FLAG_ALIGNED | STK_FLAG_HAS_META)) {
        stk__fmt(err, errlen, "unknown header flags 0x%x", h->flags);
        return STK_EFORMAT;
    }
    if (h->kind > STK_PAYLOAD_FIELDS) {
        stk__fmt(err, errlen, "unknown payload kind %u", h->kind);
        return STK_EFORMAT;
    }
    if ((h->kind == STK_PAYLOAD_FIELDS) != (h->major == STK_VERSION_MAJOR_FIELDS)) {
        stk__fmt(err, errlen, "payload kind %s in a version %u shard (fields is version 2 only)",
                 stk__payload_kind_name(h->kind), h->major);
        return STK_EFORMAT;
    }
    if ((h->flags & STK_FLAG_ALIGNED) &&
        (h->align < 512 || h->align > (1u << 20) || (h->align & (h->align - 1)))) {
        stk__fmt(err, errlen, "bad alignment %u (a power of two from 512 to 1 MiB)", h->align);
        return STK_EFORMAT;
    }
    if (h->kind == STK_PAYLOAD_RAW) {
        uint64_t n = (uint64_t)h->raw_h * h->raw_w * h->raw_c;
        if (!n || n > UINT32_MAX) {
            stk__fmt(err, errlen, "bad raw shape %ux%ux%u", h->raw_h, h->raw_w, h->raw_c);
            return STK_EFORMAT;
        }
    }
    return STK_OK;
}

static void footer_encode(uint8_t out[STK_FOOTER_SIZE], const stk__stk_footer *f)
{
    memset(out, 0, STK_FOOTER_SIZE);
    stk__put64(out, f->index_offset);
    stk__put64(out + 8, f->count);
    stk__put64(out + 16, f->keys_bytes);
    stk__put32(out + 24, f->entry_size);
    stk__put32(out + 28, f->meta_size);
    stk__put64(out + 32, f->index_sum);
    stk__put64(out + 40, f->num_classes);
    stk__put64(out + 48, stk__xxh3(out, 48));
    memcpy(out + 56, STK_FOOT_MAGIC, 8);
}

int stk__stk_footer_decode(const uint8_t in[STK_FOOTER_SIZE], uint64_t file_size,
                           stk__stk_footer *f, char *err, size_t errlen)
{
    if (memcmp(in + 56, STK_FOOT_MAGIC, 8) != 0) {
        stk__fmt(err, errlen,
                 "no footer at the end of the file: the shard is truncated or "
                 "was not finished");
        return STK_EFORMAT;
    }
    if (stk__get64(in + 48) != stk__xxh3(in, 48)) {
        stk__fmt(err, errlen, "footer checksum mismatch (corrupt footer)");
        return STK_EFORMAT;
    }
    f->index_offset = stk__get64(in);
    f->count = stk__get64(in + 8);
    f->keys_bytes = stk__get64(in + 16);
    f->entry_size = stk__get32(in + 24);
    f->meta_size = stk__get32(in + 28);
    f->index_sum = stk__get64(in + 32);
    f->num_classes = stk__get64(in + 40);
    if (f->entry_size != STK_ENTRY_SIZE || (f->meta_size != 0 && f->meta_size != STK_META_SIZE)) {
        stk__fmt(err, errlen, "unsupported index entry size %u / meta size %u", f->entry_size,
                 f->meta_size);
        return STK_EFORMAT;
    }
    uint64_t avail = file_size - STK_HEADER_SIZE - STK_FOOTER_SIZE; /* caller: size >= 128 */
    uint64_t per = (uint64_t)f->entry_size + f->meta_size;
    if (f->index_offset < STK_HEADER_SIZE || f->index_offset - STK_HEADER_SIZE > avail ||
        f->count > avail / per || f->keys_bytes > avail) {
        stk__fmt(err, errlen,
                 "footer points outside the file (index at %llu, %llu samples, "
                 "file %llu bytes)",
                 (unsigned long long)f->index_offset, (unsigned long long)f->count,
                 (unsigned long long)file_size);
        return STK_EFORMAT;
    }
    uint64_t region = f->count * per + f->keys_bytes;
    if (region > avail || f->index_offset + region + STK_FOOTER_SIZE > file_size) {
        stk__fmt(err, errlen,
                 "index size does not match the file (index at %llu + %llu bytes + footer != "
                 "%llu bytes): truncated or corrupt",
                 (unsigned long long)f->index_offset, (unsigned long long)region,
                 (unsigned long long)file_size);
        return STK_EFORMAT;
    }
    f->tail_bytes = file_size - STK_FOOTER_SIZE - f->index_offset - region;
    return STK_OK;
}

void stk__stk_entry_decode(const uint8_t *p, stk__stk_entry *e)
{
    e->offset = stk__get64(p);
    e->length = stk__get32(p + 8);
    e->key_len = stk__get32(p + 12);
    e->key_off = stk__get64(p + 16);
    e->label = (int64_t)stk__get64(p + 24);
    e->sum = stk__get64(p + 32);
}

/* The index region's tail: nothing in version 1 (the size equation of
 * docs/format.md), the field table in version 2. */
static int check_tail(const uint8_t *region, const stk__stk_footer *f, const stk__stk_header *h,
                      char *err, size_t errlen)
{
    uint64_t before = f->count * ((uint64_t)f->entry_size + f->meta_size) + f->keys_bytes;
    if (h->major == STK_VERSION_MAJOR_FMT) {
        if (!f->tail_bytes)
            return STK_OK;
        stk__fmt(err, errlen,
                 "index size does not match the file (index at %llu + %llu bytes + footer != "
                 "%llu bytes): truncated or corrupt",
                 (unsigned long long)f->index_offset, (unsigned long long)before,
                 (unsigned long long)(f->index_offset + before + f->tail_bytes + STK_FOOTER_SIZE));
        return STK_EFORMAT;
    }
    stk__stk_fdesc fd[STK__MAX_FIELDS];
    size_t nf;
    char why[STK_ERRMSG_MAX];
    int rc =
        stk__stk_ftable_decode(region + before, (size_t)f->tail_bytes, fd, &nf, why, sizeof why);
    if (rc)
        stk__fmt(err, errlen, "field table: %s", why);
    return rc;
}

int stk__stk_index_check(const uint8_t *region, const stk__stk_footer *f, const stk__stk_header *h,
                         int64_t *max_label, char *err, size_t errlen)
{
    uint64_t prev_end = STK_HEADER_SIZE;
    int64_t maxl = -1;
    uint64_t raw_len = (uint64_t)h->raw_h * h->raw_w * h->raw_c;
    int rc = check_tail(region, f, h, err, errlen);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < f->count; i++) {
        stk__stk_entry e;
        stk__stk_entry_decode(region + i * STK_ENTRY_SIZE, &e);
        if (e.offset < prev_end || e.offset > f->index_offset ||
            e.length > f->index_offset - e.offset) {
            stk__fmt(err, errlen,
                     "index entry %llu points outside the payload area or overlaps the "
                     "previous sample (offset %llu, length %u, payloads end at %llu)",
                     (unsigned long long)i, (unsigned long long)e.offset, e.length,
                     (unsigned long long)f->index_offset);
            return STK_EFORMAT;
        }
        if (e.key_len > STK_KEY_MAX || e.key_off > f->keys_bytes ||
            e.key_len > f->keys_bytes - e.key_off) {
            stk__fmt(err, errlen, "index entry %llu: key outside the key table",
                     (unsigned long long)i);
            return STK_EFORMAT;
        }
        if (e.label < -1 || e.label > INT32_MAX) {
            stk__fmt(err, errlen, "index entry %llu: invalid label %lld", (unsigned long long)i,
                     (long long)e.label);
            return STK_EFORMAT;
        }
        if (h->kind == STK_PAYLOAD_RAW && e.length != raw_len) {
            stk__fmt(err, errlen, "index entry %llu: raw sample of %u bytes, expected %llu",
                     (unsigned long long)i, e.length, (unsigned long long)raw_len);
            return STK_EFORMAT;
        }
        if (h->kind == STK_PAYLOAD_FIELDS && e.length < STK_FPAYLOAD_HEAD) {
            stk__fmt(err, errlen,
                     "index entry %llu: a fields payload of %u bytes is shorter than its table",
                     (unsigned long long)i, e.length);
            return STK_EFORMAT;
        }
        if (e.label > maxl)
            maxl = e.label;
        prev_end = e.offset + e.length;
    }
    *max_label = maxl;
    return STK_OK;
}

int stk__stk_parse_buffer(const uint8_t *buf, size_t n, uint64_t *count, uint64_t *bad, char *err,
                          size_t errlen)
{
    stk__stk_header h;
    stk__stk_footer f;
    int64_t maxl;
    int rc;
    *count = 0;
    *bad = 0;
    if (n < STK_HEADER_SIZE + STK_FOOTER_SIZE) {
        stk__fmt(err, errlen, "file of %zu bytes is too short for a shard (truncated)", n);
        return STK_EFORMAT;
    }
    if ((rc = stk__stk_header_decode(buf, &h, err, errlen)) ||
        (rc = stk__stk_footer_decode(buf + n - STK_FOOTER_SIZE, n, &f, err, errlen)))
        return rc;
    const uint8_t *region = buf + f.index_offset;
    size_t rlen = n - STK_FOOTER_SIZE - (size_t)f.index_offset;
    if (stk__xxh3(region, rlen) != f.index_sum) {
        stk__fmt(err, errlen, "index checksum mismatch (corrupt index)");
        return STK_EFORMAT;
    }
    if ((rc = stk__stk_index_check(region, &f, &h, &maxl, err, errlen)))
        return rc;
    for (uint64_t i = 0; i < f.count; i++) {
        stk__stk_entry e;
        stk__stk_entry_decode(region + i * STK_ENTRY_SIZE, &e);
        if (stk__xxh3(buf + e.offset, e.length) != e.sum) {
            (*bad)++;
        } else if (h.kind == STK_PAYLOAD_FIELDS) {
            /* A table the checksum vouches for is still untrusted: the
             * writer that made it may have lied. */
            stk__stk_fdesc fd[STK__MAX_FIELDS];
            stk__stk_fref refs[STK__MAX_FIELDS];
            size_t nf, nr;
            uint64_t before = f.count * ((uint64_t)f.entry_size + f.meta_size) + f.keys_bytes;
            char why[STK_ERRMSG_MAX];
            if (stk__stk_ftable_decode(region + before, (size_t)f.tail_bytes, fd, &nf, why,
                                       sizeof why) ||
                stk__stk_fpayload_parse(buf + e.offset, e.length, nf, refs, &nr, why, sizeof why))
                (*bad)++;
        }
    }
    *count = f.count;
    return STK_OK;
}

/* ---- Fields ---------------------------------------------------------------- */

int stk__stk_ftable_decode(const uint8_t *p, size_t n, stk__stk_fdesc *out, size_t *nf, char *err,
                           size_t errlen)
{
    *nf = 0;
    if (n < STK_FTABLE_HEAD) {
        stk__fmt(err, errlen, "%zu bytes, too short for a field table", n);
        return STK_EFORMAT;
    }
    uint32_t cnt = stk__get32(p);
    if (!cnt || cnt > STK__MAX_FIELDS || stk__get32(p + 4)) {
        stk__fmt(err, errlen, "%u fields (a shard has 1 to %d) or a reserved word not 0", cnt,
                 STK__MAX_FIELDS);
        return STK_EFORMAT;
    }
    size_t names = STK_FTABLE_HEAD + (size_t)cnt * STK_FTABLE_ENTRY;
    if (names > n) {
        stk__fmt(err, errlen, "%u entries do not fit in its %zu bytes", cnt, n);
        return STK_EFORMAT;
    }
    size_t at = names;
    for (uint32_t k = 0; k < cnt; k++) {
        const uint8_t *e = p + STK_FTABLE_HEAD + (size_t)k * STK_FTABLE_ENTRY;
        stk__stk_fdesc *d = &out[k];
        d->name_len = stk__get16(e);
        d->kind = e[2];
        d->samples = stk__get64(e + 4);
        if (!d->name_len || d->name_len > STK_FNAME_MAX || d->name_len > n - at) {
            stk__fmt(err, errlen, "field %u: a name of %zu bytes (1 to %d, inside the table)", k,
                     d->name_len, STK_FNAME_MAX);
            return STK_EFORMAT;
        }
        if (d->kind > STK_FIELD_NPY || e[3]) {
            stk__fmt(err, errlen, "field %u: unknown kind %d", k, d->kind);
            return STK_EFORMAT;
        }
        d->name = p + at;
        at += d->name_len;
        if (memchr(d->name, '\0', d->name_len)) {
            stk__fmt(err, errlen, "field %u: a name with a NUL byte", k);
            return STK_EFORMAT;
        }
        for (uint32_t j = 0; j < k; j++)
            if (out[j].name_len == d->name_len && !memcmp(out[j].name, d->name, d->name_len)) {
                stk__fmt(err, errlen, "fields %u and %u have the same name '%.*s'", j, k,
                         (int)d->name_len, (const char *)d->name);
                return STK_EFORMAT;
            }
    }
    if (at != n) {
        stk__fmt(err, errlen, "%zu bytes after the last name", n - at);
        return STK_EFORMAT;
    }
    *nf = cnt;
    return STK_OK;
}

size_t stk__stk_ftable_size(const stk__stk_fdesc *f, size_t nf)
{
    size_t n = STK_FTABLE_HEAD + nf * STK_FTABLE_ENTRY;
    for (size_t k = 0; k < nf; k++)
        n += f[k].name_len;
    return n;
}

void stk__stk_ftable_encode(uint8_t *out, const stk__stk_fdesc *f, size_t nf)
{
    stk__put32(out, (uint32_t)nf);
    stk__put32(out + 4, 0);
    size_t at = STK_FTABLE_HEAD + nf * STK_FTABLE_ENTRY;
    for (size_t k = 0; k < nf; k++) {
        uint8_t *e = out + STK_FTABLE_HEAD + k * STK_FTABLE_ENTRY;
        stk__put16(e, (uint16_t)f[k].name_len);
        e[2] = (uint8_t)f[k].kind;
        e[3] = 0;
        stk__put64(e + 4, f[k].samples);
        memcpy(out + at, f[k].name, f[k].name_len);
        at += f[k].name_len;
    }
}

int stk__stk_fpayload_parse(const uint8_t *p, size_t n, size_t nfields, stk__stk_fref *out,
                            size_t *nout, char *err, size_t errlen)
{
    *nout = 0;
    if (n < STK_FPAYLOAD_HEAD) {
        stk__fmt(err, errlen, "field table: a payload of %zu bytes is shorter than its table", n);
        return STK_EFORMAT;
    }
    uint32_t cnt = stk__get32(p);
    if (cnt > nfields || stk__get32(p + 4)) {
        stk__fmt(err, errlen,
                 "field table: %u fields in a sample of a shard that has %zu (or a reserved word "
                 "not 0)",
                 cnt, nfields);
        return STK_EFORMAT;
    }
    /* cnt <= STK__MAX_FIELDS here, so this cannot overflow. */
    size_t at = STK_FPAYLOAD_HEAD + (size_t)cnt * STK_FPAYLOAD_REF;
    if (at > n) {
        stk__fmt(err, errlen, "field table: %u entries do not fit in the payload's %zu bytes", cnt,
                 n);
        return STK_EFORMAT;
    }
    for (uint32_t k = 0; k < cnt; k++) {
        const uint8_t *e = p + STK_FPAYLOAD_HEAD + (size_t)k * STK_FPAYLOAD_REF;
        uint32_t id = stk__get32(e), len = stk__get32(e + 4);
        if (id >= nfields || (k && id <= out[k - 1].id)) {
            stk__fmt(err, errlen,
                     "field table: entry %u names field %u (the shard has %zu; ids must increase)",
                     k, id, nfields);
            return STK_EFORMAT;
        }
        if (len > n - at) {
            stk__fmt(err, errlen,
                     "field table: field %u of %u bytes runs past the payload's end (%zu bytes "
                     "left)",
                     id, len, n - at);
            return STK_EFORMAT;
        }
        out[k] = (stk__stk_fref){id, len, at};
        at += len;
    }
    if (at != n) {
        stk__fmt(err, errlen, "field table: %zu bytes after the last field", n - at);
        return STK_EFORMAT;
    }
    *nout = cnt;
    return STK_OK;
}

/* ---- Writer -------------------------------------------------------------- */

#define WBUF_SIZE (1u << 20)

struct stk__stk_writer {
    int fd;
    char *path, *tmp;
    stk__stk_header h;
    uint64_t pos; /* bytes written or buffered so far */
    uint8_t *buf;
    size_t blen;
    uint8_t *index; /* entries */
    size_t index_len, index_cap;
    uint8_t *meta;
    size_t meta_len, meta_cap;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    uint8_t *tail; /* written after the keys (a field table) */
    size_t tail_len;
    uint64_t count;
};

static int grow_append(uint8_t **p, size_t *len, size_t *cap, const void *data, size_t n)
{
    if (n > SIZE_MAX - *len)
        return STK_ENOMEM;
    int rc = stk__grow((void **)p, cap, *len + n, 1);
    if (rc)
        return rc;
    if (n)
        memcpy(*p + *len, data, n);
    *len += n;
    return STK_OK;
}

static int wflush(stk__stk_writer *w)
{
    if (!w->blen)
        return STK_OK;
    int rc = stk__write_full(w->fd, w->buf, w->blen);
    w->blen = 0;
    return rc;
}

static int wput(stk__stk_writer *w, const uint8_t *data, size_t n)
{
    w->pos += n;
    if (n >= WBUF_SIZE) {
        int rc = wflush(w);
        return rc ? rc : stk__write_full(w->fd, data, n);
    }
    if (w->blen + n > WBUF_SIZE) {
        int rc = wflush(w);
        if (rc)
            return rc;
    }
    if (n) /* data may be NULL for an empty key or region */
        memcpy(w->buf + w->blen, data, n);
    w->blen += n;
    return STK_OK;
}

static int wzero(stk__stk_writer *w, uint64_t n)
{
    static const uint8_t zeros[4096];
    while (n) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        int rc = wput(w, zeros, k);
        if (rc)
            return rc;
        n -= k;
    }
    return STK_OK;
}

static void writer_free(stk__stk_writer *w)
{
    if (w->fd >= 0)
        stk__close(w->fd);
    stk__free(w->path);
    stk__free(w->tmp);
    stk__free(w->buf);
    stk__free(w->index);
    stk__free(w->meta);
    stk__free(w->keys);
    stk__free(w->tail);
    stk__free(w);
}

int stk__stkw_open(stk__stk_writer **out, const char *path, const stk__stk_header *h, char *err,
                   size_t errlen)
{
    int rc = STK_OK;
    stk__stk_writer *w = stk__calloc(1, sizeof *w);
    *out = NULL;
    if (!w)
        return STK_ENOMEM;
    w->fd = -1;
    w->h = *h;
    size_t pl = strlen(path);
    if (!(w->path = stk__strdup(path)) || !(w->tmp = stk__malloc(pl + 5)) ||
        !(w->buf = stk__malloc(WBUF_SIZE))) {
        rc = STK_ENOMEM;
        goto out;
    }
    memcpy(w->tmp, path, pl);
    memcpy(w->tmp + pl, ".tmp", 5);
    w->fd = stk__open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        stk__fmt(err, errlen, "%s: cannot create: %s", w->tmp, strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    uint8_t hdr[STK_HEADER_SIZE];
    stk__stk_header_encode(hdr, h);
    if ((rc = wput(w, hdr, sizeof hdr))) {
        stk__fmt(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        goto out;
    }
    *out = w;
    w = NULL;
out:
    if (w) {
        if (w->fd >= 0)
            unlink(w->tmp);
        writer_free(w);
    }
    return rc;
}

int stk__stkw_add(stk__stk_writer *w, const uint8_t *data, size_t len, int64_t label,
                  const char *key, uint32_t width, uint32_t height, char *err, size_t errlen)
{
    int rc;
    size_t klen = key ? strlen(key) : 0;
    if (len > UINT32_MAX) {
        stk__fmt(err, errlen, "sample of %zu bytes is over the 4 GiB limit of a .stk sample", len);
        return STK_ETOOBIG;
    }
    if (klen > STK_KEY_MAX)
        klen = STK_KEY_MAX;
    if (label < -1 || label > INT32_MAX) {
        stk__fmt(err, errlen, "label %lld out of range", (long long)label);
        return STK_EINVAL;
    }
    if (w->h.flags & STK_FLAG_ALIGNED) {
        uint64_t a = w->h.align, in = w->pos % a;
        if (in && (len > a || in + len > a) && len)
            if ((rc = wzero(w, a - in)))
                goto io;
    }
    uint8_t ent[STK_ENTRY_SIZE];
    stk__put64(ent, w->pos);
    stk__put32(ent + 8, (uint32_t)len);
    stk__put32(ent + 12, (uint32_t)klen);
    stk__put64(ent + 16, w->keys_len);
    stk__put64(ent + 24, (uint64_t)label);
    stk__put64(ent + 32, stk__xxh3(data, len));
    uint8_t meta[STK_META_SIZE];
    stk__put32(meta, width);
    stk__put32(meta + 4, height);
    if ((rc = grow_append(&w->index, &w->index_len, &w->index_cap, ent, sizeof ent)) ||
        (rc = grow_append(&w->keys, &w->keys_len, &w->keys_cap, key, klen)) ||
        ((w->h.flags & STK_FLAG_HAS_META) &&
         (rc = grow_append(&w->meta, &w->meta_len, &w->meta_cap, meta, sizeof meta))))
        return rc;
    if ((rc = wput(w, data, len)))
        goto io;
    w->count++;
    return STK_OK;
io:
    stk__fmt(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
    return rc;
}

int stk__stkw_set_tail(stk__stk_writer *w, const uint8_t *p, size_t n)
{
    uint8_t *t = stk__malloc(n ? n : 1);
    if (!t)
        return STK_ENOMEM;
    if (n)
        memcpy(t, p, n);
    stk__free(w->tail);
    w->tail = t;
    w->tail_len = n;
    return STK_OK;
}

uint64_t stk__stkw_payload_bytes(const stk__stk_writer *w)
{
    return w->pos - STK_HEADER_SIZE;
}

uint64_t stk__stkw_count(const stk__stk_writer *w)
{
    return w->count;
}

int stk__stkw_finish(stk__stk_writer *w, uint64_t num_classes, uint64_t *file_size, char *err,
                     size_t errlen)
{
    int rc;
    if ((rc = wzero(w, (8 - w->pos % 8) % 8)))
        goto io;
    stk__stk_footer f = {0};
    f.index_offset = w->pos;
    f.count = w->count;
    f.keys_bytes = w->keys_len;
    f.entry_size = STK_ENTRY_SIZE;
    f.meta_size = (w->h.flags & STK_FLAG_HAS_META) ? STK_META_SIZE : 0;
    f.num_classes = num_classes;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        rc = STK_ENOMEM;
        goto fail;
    }
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, w->index, w->index_len);
    XXH3_64bits_update(st, w->meta, w->meta_len);
    XXH3_64bits_update(st, w->keys, w->keys_len);
    XXH3_64bits_update(st, w->tail, w->tail_len);
    f.index_sum = (uint64_t)XXH3_64bits_digest(st);
    XXH3_freeState(st);
    uint8_t foot[STK_FOOTER_SIZE];
    footer_encode(foot, &f);
    if ((rc = wput(w, w->index, w->index_len)) || (rc = wput(w, w->meta, w->meta_len)) ||
        (rc = wput(w, w->keys, w->keys_len)) || (rc = wput(w, w->tail, w->tail_len)) ||
        (rc = wput(w, foot, sizeof foot)) || (rc = wflush(w)))
        goto io;
    if (fsync(w->fd) != 0)
        goto io;
    if (stk__close(w->fd) != 0) {
        w->fd = -1;
        goto io;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        stk__fmt(err, errlen, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
        rc = STK_EIO;
        goto fail;
    }
    stk__fsync_parent(w->path);
    if (file_size)
        *file_size = w->pos;
    writer_free(w);
    return STK_OK;
io:
    stk__fmt(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
    rc = STK_EIO;
fail:
    stk__stkw_abort(w);
    return rc;
}

void stk__stkw_abort(stk__stk_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        stk__close(w->fd);
        w->fd = -1;
    }
    unlink(w->tmp);
    writer_free(w);
}
