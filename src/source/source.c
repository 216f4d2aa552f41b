/* source.c -- picks the source kind for a path, and helpers shared by sources. */
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint8_t *stk__sink_reserve(stk__sink *s, size_t n, int *rc)
{
    if (s->grow) {
        *rc = stk__scratch_reserve(s->grow, n ? n : 1);
        return *rc ? NULL : s->grow->p;
    }
    if (n > s->cap) {
        *rc = STK_ETOOBIG;
        return NULL;
    }
    *rc = STK_OK;
    return s->dst;
}

int stk__source_open(stk__source *s, const char *path, const stk__source_params *prm, char *err,
                     size_t errlen)
{
    memset(s, 0, sizeof *s);
    struct stat st;
    if (stat(path, &st) != 0) {
        stk__fmt(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT || errno == ENOTDIR ? STK_ENOENT : STK_EIO;
    }
    if (S_ISDIR(st.st_mode)) {
        if (prm->record_bytes) {
            stk__fmt(err, errlen, "%s: is a directory, but a record size was given", path);
            return STK_EINVAL;
        }
        return stk__source_folder_open(s, path, err, errlen);
    }
    if (prm->record_bytes)
        return stk__source_records_open(s, path, prm, err, errlen);
    stk__fmt(err, errlen,
             "%s: is a file; give its record size (--record-size) to read it as fixed-size "
             "records, or name a directory in ImageFolder layout",
             path);
    return STK_EINVAL;
}

void stk__source_close(stk__source *s)
{
    if (s->ops && s->ops->close)
        s->ops->close(s);
    memset(s, 0, sizeof *s);
}

int stk__read_file(const char *path, stk__sink *sink, uint8_t **data, size_t *len, char *err,
                   size_t errlen)
{
    int rc = STK_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        stk__fmt(err, errlen, "cannot open: %s", strerror(errno));
        return STK_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        stk__fmt(err, errlen, "cannot stat: %s", strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        stk__fmt(err, errlen, "not a regular file");
        rc = STK_EIO;
        goto out;
    }
    size_t size = (size_t)st.st_size;
    /* One byte more than the size, so a file that grew since fstat is noticed
     * instead of being silently truncated. */
    uint8_t *buf = stk__sink_reserve(sink, size + 1, &rc);
    if (!buf && rc == STK_ETOOBIG && !sink->grow && size <= sink->cap)
        buf = stk__sink_reserve(sink, size, &rc);
    if (!buf) {
        if (rc == STK_ETOOBIG)
            stk__fmt(err, errlen, "file is %zu bytes, over the per-sample budget of %zu bytes",
                     size, sink->grow ? sink->grow->limit : sink->cap);
        else
            stk__fmt(err, errlen, "out of memory for %zu bytes", size);
        goto out;
    }
    size_t cap = sink->grow ? sink->grow->cap : sink->cap;
    size_t got = 0;
    while (got < cap) {
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            stk__fmt(err, errlen, "read failed at byte %zu: %s", got, strerror(errno));
            rc = STK_EIO;
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got != size) {
        stk__fmt(err, errlen, "file changed size while reading (%zu bytes, read %zu)", size, got);
        rc = got > size && got >= cap ? STK_ETOOBIG : STK_EIO;
        goto out;
    }
    *data = buf;
    *len = got;
out:
    close(fd);
    return rc;
}
