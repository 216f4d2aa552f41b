/*
 * offtab.c -- shards that begin with an offsets table (offtab.h).
 */
#include "source/offtab.h"
#include "source/source.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int stk__ot_get(const stk__otrd *r, uint64_t off, void *out, size_t n, char *why, size_t wn)
{
    if (off > r->size || n > r->size - off) {
        stk__fmt(why, wn,
                 "%zu bytes at offset %" PRIu64 " lie past the end of the file (%" PRIu64
                 " bytes; truncated?)",
                 n, off, r->size);
        return STK_EFORMAT;
    }
    if (r->buf) {
        memcpy(out, r->buf + off, n);
        return STK_OK;
    }
    return stk__pread_full(r->fd, out, n, off, why, wn);
}

int stk__ot_head(const stk__otrd *r, uint64_t want, stk__otshard *t, const stk__otwords *w,
                 char *why, size_t n)
{
    uint8_t b4[4];
    int rc = stk__ot_get(r, 0, b4, 4, why, n);
    if (rc)
        return rc;
    uint32_t count = stk__le32(b4);
    if (count != want) {
        stk__fmt(why, n, "holds %" PRIu32 " %s, but index.json says %" PRIu64 "%s", count, w->items,
                 want, w->count_from);
        return STK_EFORMAT;
    }
    uint64_t head = 4 + 4 * ((uint64_t)count + 1);
    if (head > r->size) {
        stk__fmt(why, n,
                 "its offsets table (%" PRIu64 " bytes) is cut off: the file is %" PRIu64
                 " bytes (truncated?)",
                 head, r->size);
        return STK_EFORMAT;
    }
    if (!(t->off = stk__malloc(((size_t)count + 1) * sizeof *t->off)))
        return STK_ENOMEM;
    if ((rc = stk__ot_get(r, 4, t->off, ((size_t)count + 1) * 4, why, n)))
        return rc;
    for (size_t k = 0; k <= count; k++) {
        t->off[k] = stk__le32((const uint8_t *)&t->off[k]);
        if ((k == 0 && t->off[0] < head) || (k && t->off[k] < t->off[k - 1])) {
            stk__fmt(why, n,
                     "its offsets table is corrupt: entry %zu is %" PRIu32 " (%s %" PRIu64 ")", k,
                     t->off[k], k ? "below the one before," : "inside the header,",
                     k ? (uint64_t)t->off[k - 1] : head);
            return STK_EFORMAT;
        }
    }
    t->count = count;
    return STK_OK;
}

int stk__ot_range(const stk__otshard *t, uint64_t j, uint64_t *off, size_t *len,
                  const stk__otwords *w, char *why, size_t wn)
{
    *off = t->off[j];
    uint64_t end = t->off[j + 1];
    if (end > t->bytes) {
        stk__fmt(why, wn,
                 "the %s is truncated: %s %" PRIu64 " ends at offset %" PRIu64
                 ", but the file is %" PRIu64 " bytes",
                 w->file, w->item, j, end, t->bytes);
        return STK_EFORMAT;
    }
    *len = (size_t)(end - *off);
    return STK_OK;
}

int stk__ot_open(stk__otshard *t, uint64_t want, bool keep, const stk__otwords *w, char *err,
                 size_t errlen)
{
    struct stat st;
    int fd = stk__open_regular(t->path, t->shown, &st, err, errlen);
    if (fd < 0)
        return fd;
    t->bytes = (uint64_t)st.st_size;
    if (!t->stored) /* not decompressed: the file read is the one stored */
        t->stored = t->bytes;
    stk__otrd r = {fd, NULL, t->bytes};
    char why[STK_ERRMSG_MAX];
    int rc = stk__ot_head(&r, want, t, w, why, sizeof why);
    if (rc)
        stk__fmt(err, errlen, "%s: %s", t->shown, why);
    if (keep && !rc)
        t->fd = fd;
    else
        stk__close(fd);
    return rc;
}

char *stk__ot_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = stk__malloc(n);
    if (p)
        stk__fmt(p, n, "%s/%s", dir, name);
    return p;
}

void stk__ot_free(stk__otshard *t, size_t n)
{
    for (size_t k = 0; t && k < n; k++) {
        if (t[k].fd >= 0)
            stk__close(t[k].fd);
        stk__free(t[k].shown);
        stk__free(t[k].path);
        stk__free(t[k].off);
    }
}

int stk__ot_read(const stk__otshard *t, uint64_t j, const stk__otwords *w, stk__sink *sink,
                 uint8_t **buf, size_t *n, uint64_t *off, char *err, size_t errlen)
{
    int rc = stk__ot_range(t, j, off, n, w, err, errlen);
    if (rc)
        return rc;
    if (!(*buf = stk__sink_take(sink, *n, w->item, &rc, err, errlen)))
        return rc;
    return stk__pread_at(t->fd, t->path, *buf, *n, *off, err, errlen);
}

void stk__ot_name(const stk__otshard *t, uint64_t j, char *buf, size_t n)
{
    stk__fmt(buf, n, "%s#%" PRIu64, t->shown, j);
}
