/*
 * common.c -- helpers every source kind may use: the sink a read fills, whole-
 * file and positioned reads, full writes, and freeing what all sources hold.
 * It depends on nothing in src/source/ but source.h, so every reader can use
 * it without importing another reader or the detection in detect.c.
 */
#include "source/source.h"
#include "cache/cache.h"
#include "io/remote.h"
#include "io/file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

void stk__warn(const stk__source_params *prm, const char *fmt, ...)
{
    char msg[STK_ERRMSG_MAX * 4];
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(msg, sizeof msg, fmt, ap) < 0)
        msg[0] = '\0';
    va_end(ap);
    if (prm && prm->warn)
        prm->warn(prm->warn_user, msg);
    else
        fprintf(stderr, "stoker: warning: %s\n", msg);
}

int stk__open_regular(const char *path, const char *shown, struct stat *st, char *err,
                      size_t errlen)
{
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    int sr = fd < 0 ? -1 : stk__fstat(fd, st);
    if (sr == 0 && S_ISREG(st->st_mode))
        return fd;
    int e = errno;
    stk__fmt(err, errlen, "%s: %s", shown, sr ? strerror(e) : "not a regular file");
    if (fd >= 0)
        stk__close(fd);
    return fd < 0 && e == ENOENT ? STK_ENOENT : STK_EIO;
}

int stk__write_replace(const char *path, const void *buf, size_t n)
{
    static atomic_uint seq;
    unsigned writer = atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed); /* a name only */
    char tmp[4200];
    stk__fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u.%llx", path, (long)getpid(), writer,
             (unsigned long long)stk__now_ns());
    int fd = stk__open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return STK_EIO;
    int rc = stk__write_full(fd, buf, n);
    if (stk__close(fd) != 0)
        rc = STK_EIO;
    if (rc == STK_OK && rename(tmp, path) != 0)
        rc = STK_EIO;
    if (rc)
        unlink(tmp);
    return rc;
}

int stk__sealed_read(const char *path, const char *magic, size_t min, uint8_t **buf, size_t *n)
{
    int rc = STK_EFORMAT;
    char why[128];
    *buf = NULL;
    *n = 0;
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return STK_ENOENT;
    struct stat st;
    if (stk__fstat(fd, &st) != 0 || st.st_size < (off_t)min || st.st_size < 16 ||
        st.st_size > (1LL << 40))
        goto out;
    size_t len = (size_t)st.st_size;
    uint8_t *b = stk__malloc(len);
    if (!b) {
        rc = STK_ENOMEM;
        goto out;
    }
    uint64_t sum = 0; /* the trailer, little-endian */
    bool whole = stk__pread_full(fd, b, len, 0, why, sizeof why) == STK_OK;
    for (int k = 0; whole && k < 8; k++)
        sum |= (uint64_t)b[len - 8 + (size_t)k] << (8 * k);
    if (!whole || memcmp(b, magic, 8) || sum != (uint64_t)XXH3_64bits(b, len - 8)) {
        stk__free(b);
        goto out;
    }
    *buf = b;
    *n = len;
    rc = STK_OK;
out:
    stk__close(fd);
    return rc;
}

void stk__source_free_common(stk__source *s)
{
    /* The I/O thread first: a download finishing now runs its completion,
     * which reads the shard names and sizes freed below. */
    stk__remote_close(s->remote);
    s->remote = NULL;
    if (s->shard_objs)
        for (size_t k = 0; k < s->nshards_objs_; k++)
            stk__free(s->shard_objs[k]);
    stk__free(s->shard_objs);
    if (s->shard_tags)
        for (size_t k = 0; k < s->nshards_objs_; k++)
            stk__free(s->shard_tags[k]);
    stk__free(s->shard_tags);
    if (s->shard_ids)
        for (size_t k = 0; k < s->nshards_objs_; k++)
            stk__free(s->shard_ids[k]);
    stk__free(s->shard_ids);
    stk__free(s->shard_bytes);
    stk__free(s->shard_first);
    stk__free(s->shard_remote); /* the stores are others' (a mixture's children) */
    s->shard_remote = NULL;
    stk__free(s->shard_nocache);
    s->shard_nocache = NULL;
    for (size_t k = 0; k < s->npins; k++)
        stk__cache_unpin(s->pins[k]);
    stk__free(s->pins);
    stk__cache_close(s->cache);
    s->pins = NULL;
    s->npins = 0;
    s->cache = NULL;
    s->shard_objs = NULL;
    s->shard_bytes = NULL;
    s->shard_tags = NULL;
    s->shard_ids = NULL;
    s->shard_first = NULL;
    s->remote = NULL;
    s->nshards = s->nshards_objs_ = 0;
    for (size_t k = 0; k < s->nfields; k++)
        stk__free(s->fields[k].name);
    stk__free(s->fields);
    s->fields = NULL;
    s->nfields = 0;
}

/* ---- Fields ----------------------------------------------------------------- */

int stk__source_add_field(stk__source *s, const char *name, size_t name_len, int kind,
                          uint64_t samples)
{
    if (s->nfields >= STK__MAX_FIELDS)
        return -1;
    if (!s->fields && !(s->fields = stk__calloc(STK__MAX_FIELDS, sizeof *s->fields)))
        return -1;
    char *copy = stk__malloc(name_len + 1);
    if (!copy)
        return -1;
    memcpy(copy, name, name_len);
    copy[name_len] = '\0';
    stk__field_desc *f = &s->fields[s->nfields];
    f->name = copy;
    f->kind = kind;
    f->samples = samples;
    f->nocopy = false;
    return (int)s->nfields++;
}

int stk__source_default_fields(stk__source *s)
{
    bool image = (s->ops->flags & STK__SRC_IMAGES) != 0;
    const char *name = image ? "image" : "data";
    if (stk__source_add_field(s, name, strlen(name), image ? STK_FIELD_IMAGE : STK_FIELD_BYTES,
                              s->count) < 0)
        return STK_ENOMEM;
    if (s->num_classes && stk__source_add_field(s, "label", 5, STK_FIELD_INT, s->count) < 0)
        return STK_ENOMEM;
    return STK_OK;
}

int stk__field_set_gen(stk__field_set *fs, uint32_t id, const void *data, size_t len)
{
    if (fs->n >= STK__MAX_FIELDS)
        return STK_EFORMAT;
    if (len > sizeof fs->gen - fs->gen_used)
        return STK_ETOOBIG;
    uint8_t *p = fs->gen + fs->gen_used;
    if (len)
        memcpy(p, data, len);
    fs->gen_used += len;
    fs->f[fs->n++] = (stk__field_ref){id, p, len};
    return STK_OK;
}

int stk__source_fields_generic(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                               int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    (void)i;
    (void)err;
    (void)errlen;
    fs->n = 0;
    fs->gen_used = 0;
    fs->f[fs->n++] = (stk__field_ref){0, bytes, len};
    if (label >= 0 && s->nfields > 1) {
        char digits[24];
        int n = snprintf(digits, sizeof digits, "%lld", (long long)label);
        return stk__field_set_gen(fs, 1, digits, (size_t)n);
    }
    return STK_OK;
}

void stk__source_close(stk__source *s)
{
    /* Before the reader's own state goes, for the same reason as above. */
    stk__remote_close(s->remote);
    s->remote = NULL;
    if (s->ops && s->ops->close)
        s->ops->close(s);
    stk__source_free_common(s);
    memset(s, 0, sizeof *s);
}

int stk__index_cache_path(const char *file, const char *kind, bool beside, char *out, size_t n)
{
    if (beside) {
        stk__fmt(out, n, "%s.stkidx", file);
        return STK_OK;
    }
    char abs[4096];
    if (!realpath(file, abs))
        return STK_EIO;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[4096];
    if (xdg && *xdg)
        stk__fmt(dir, sizeof dir, "%s/stoker/%s", xdg, kind);
    else if (home && *home)
        stk__fmt(dir, sizeof dir, "%s/.cache/stoker/%s", home, kind);
    else
        return STK_EIO;
    stk__fmt(out, n, "%s/%016llx.stkidx", dir, (unsigned long long)XXH3_64bits(abs, strlen(abs)));
    return STK_OK;
}

void stk__mkdirs_for(const char *file)
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

int stk__read_file(const char *path, stk__sink *sink, uint8_t **data, size_t *len, char *err,
                   size_t errlen)
{
    int rc = STK_OK;
    /* O_NONBLOCK: opening a FIFO (or a device) named like an image must not
     * block the worker forever; it has no effect on regular files, and the
     * fstat check below refuses anything else. */
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        stk__fmt(err, errlen, "cannot open: %s", strerror(errno));
        return STK_EIO;
    }
    struct stat st;
    if (stk__fstat(fd, &st) != 0) {
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
    if (!buf && rc == STK_ETOOBIG && !sink->grow && (sink->alloc || size <= sink->cap))
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
        ssize_t r = stk__read(fd, buf + got, cap - got);
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
    stk__close(fd);
    return rc;
}

int stk__pread_full(int fd, void *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = stk__pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));
        if (k < 0) {
            if (errno == EINTR)
                continue;
            stk__fmt(err, errlen, "read of %zu bytes at offset %llu failed: %s", n,
                     (unsigned long long)off, strerror(errno));
            return STK_EIO;
        }
        if (k == 0) {
            stk__fmt(err, errlen, "short read: %zu of %zu bytes at offset %llu (file truncated?)",
                     got, n, (unsigned long long)off);
            return STK_EIO;
        }
        got += (size_t)k;
    }
    return STK_OK;
}

int stk__pread_at(int fd, const char *path, void *buf, size_t n, uint64_t off, char *err,
                  size_t errlen)
{
    int own = fd;
    if (fd < 0 && (own = stk__open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        stk__fmt(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return STK_EIO;
    }
    int rc = stk__pread_full(own, buf, n, off, err, errlen);
    if (own != fd)
        stk__close(own);
    return rc;
}

size_t stk__source_shard_of(const stk__source *s, uint64_t i)
{
    return stk__run_of(s->shard_first, s->nshards, i);
}

int stk__write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = stk__write_fd(fd, (const uint8_t *)buf + done, n - done);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return STK_EIO;
        }
        done += (size_t)k;
    }
    return STK_OK;
}

/* fsyncs the directory holding path, so a rename in it is durable. */
void stk__fsync_parent(const char *path)
{
    char dir[4096];
    stk__fmt(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        stk__fmt(dir, sizeof dir, ".");
    int fd = stk__open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        stk__close(fd);
    }
}

int stk__read_text(const char *path, const char *shown, size_t limit, char **text, size_t *len,
                   char *err, size_t errlen)
{
    stk__scratch sc = {.limit = limit};
    stk__sink sink = {.grow = &sc};
    uint8_t *data = NULL;
    char why[STK_ERRMSG_MAX];
    *text = NULL;
    int rc = stk__read_file(path, &sink, &data, len, why, sizeof why);
    if (rc) {
        int e = errno;
        stk__fmt(err, errlen, "%s: %s", shown, why);
        stk__scratch_free(&sc);
        return rc == STK_EIO && e == ENOENT ? STK_ENOENT : rc;
    }
    if (!(*text = stk__malloc(*len + 1))) {
        stk__scratch_free(&sc);
        return STK_ENOMEM;
    }
    memcpy(*text, data, *len);
    (*text)[*len] = '\0';
    stk__scratch_free(&sc);
    return STK_OK;
}
