/*
 * records.c -- a file of fixed-size records (preprocessed tensors, token
 * blocks, CIFAR-style binaries): an optional header to skip, then records of
 * record_bytes, each optionally starting with a little-endian label. Reads use
 * pread on one shared descriptor (thread-safe, and a file truncated under us
 * gives a short read and a clear error rather than SIGBUS, as mmap would).
 */
#include "source/source.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct records {
    int fd;
    char *path;
    size_t record_bytes, header_bytes;
    unsigned label_bytes;
} records;

static int records_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                        int64_t *label, char *err, size_t errlen)
{
    records *r = s->impl;
    size_t n = r->record_bytes - r->label_bytes;
    int rc;
    uint8_t *buf = stk__sink_take(sink, n, "record", &rc, err, errlen);
    if (!buf)
        return rc;
    uint8_t lab[8] = {0};
    struct iovec iov[2] = {{lab, r->label_bytes}, {buf, n}};
    off_t off = (off_t)(r->header_bytes + i * r->record_bytes);
    size_t got = 0;
    while (got < r->record_bytes) {
        ssize_t k;
        if (got == 0)
            k = stk__preadv(r->fd, iov, 2, off);
        else if (got < r->label_bytes)
            k = stk__pread(r->fd, lab + got, r->label_bytes - got, off + (off_t)got);
        else
            k = stk__pread(r->fd, buf + (got - r->label_bytes), r->record_bytes - got,
                           off + (off_t)got);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            stk__fmt(err, errlen, "read of record %llu failed: %s", (unsigned long long)i,
                     strerror(errno));
            return STK_EIO;
        }
        if (k == 0) {
            stk__fmt(err, errlen, "record %llu: short read (%zu of %zu bytes; file truncated?)",
                     (unsigned long long)i, got, r->record_bytes);
            return STK_EIO;
        }
        got += (size_t)k;
    }
    uint64_t v = 0;
    for (unsigned k = 0; k < r->label_bytes; k++)
        v |= (uint64_t)lab[k] << (8 * k);
    if (v > INT64_MAX) {
        stk__fmt(err, errlen, "record %llu: label %llu does not fit an int64",
                 (unsigned long long)i, (unsigned long long)v);
        return STK_EFORMAT;
    }
    *label = r->label_bytes ? (int64_t)v : -1;
    *data = buf;
    *len = n;
    return STK_OK;
}

static void records_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const records *r = s->impl;
    stk__fmt(buf, n, "%s#%llu", r->path, (unsigned long long)i);
}

static void records_close(stk__source *s)
{
    records *r = s->impl;
    if (!r)
        return;
    if (r->fd >= 0)
        stk__close(r->fd);
    stk__free(r->path);
    stk__free(r);
    s->impl = NULL;
}

/* flags 0: a record is plain bytes, not an image. */
static const stk__source_ops k_records_ops = {
    .kind = "records", .read = records_read, .name = records_name, .close = records_close};

int stk__source_records_open(stk__source *s, const char *path, const stk__source_params *prm,
                             char *err, size_t errlen)
{
    int rc = STK_OK;
    records *r = NULL;
    unsigned lb = prm->label_bytes;
    if (lb != 0 && lb != 1 && lb != 2 && lb != 4 && lb != 8) {
        stk__fmt(err, errlen, "label bytes must be 0, 1, 2, 4 or 8 (got %u)", lb);
        return STK_EINVAL;
    }
    if (prm->record_bytes <= lb) {
        stk__fmt(err, errlen, "record size %zu leaves no payload after a %u-byte label",
                 prm->record_bytes, lb);
        return STK_EINVAL;
    }
    if (!(r = stk__calloc(1, sizeof *r)) || !(r->path = stk__strdup(path))) {
        rc = STK_ENOMEM;
        goto out;
    }
    r->record_bytes = prm->record_bytes;
    r->header_bytes = prm->header_bytes;
    r->label_bytes = lb;
    struct stat st;
    if ((r->fd = stk__open_regular(path, path, &st, err, errlen)) < 0) {
        rc = r->fd;
        r->fd = -1;
        goto out;
    }
    size_t size = (size_t)st.st_size;
    if (size < r->header_bytes || (size - r->header_bytes) % r->record_bytes) {
        stk__fmt(err, errlen,
                 "%s: %zu bytes is not a %zu-byte header plus whole %zu-byte records "
                 "(%zu bytes left over)",
                 path, size, r->header_bytes, r->record_bytes,
                 size < r->header_bytes ? size : (size - r->header_bytes) % r->record_bytes);
        rc = STK_EFORMAT;
        goto out;
    }
    s->ops = &k_records_ops;
    s->impl = r;
    s->count = (size - r->header_bytes) / r->record_bytes;
    s->fixed_len = r->record_bytes - lb;
    s->index_bytes = sizeof *r + strlen(path) + 1;
    if (!s->count) {
        stk__fmt(err, errlen, "%s: no records", path);
        rc = STK_EEMPTY;
        r = NULL; /* owned by s now; the caller closes s */
        goto out;
    }
    r = NULL;
    /* Fields: the payload, and the label when records carry one (records
     * have no classes, so the generic description would leave it out). */
    if (stk__source_add_field(s, "data", 4, STK_FIELD_BYTES, s->count) < 0 ||
        (lb && stk__source_add_field(s, "label", 5, STK_FIELD_INT, s->count) < 0)) {
        stk__fmt(err, errlen, "%s: out of memory", path);
        rc = STK_ENOMEM;
    }
out:
    if (r) {
        stk__source tmp = {.impl = r};
        if (!r->path)
            r->fd = -1;
        records_close(&tmp);
    }
    return rc;
}
