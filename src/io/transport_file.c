/*
 * transport_file.c -- the transport table over local files (transport.h),
 * every call through file.h's wrappers. An object is a path and, until it
 * is idle, its open descriptor; reads are preads, one after the other
 * (batch 1: a local disk gains nothing from a queue of them here, and the
 * order of calls stays what the I/O-fault sweep expects of one reader).
 */
#include "io/transport.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

typedef struct file_tp {
    stk__transport base;
    char *root; /* NULL: names are paths */
} file_tp;

/* What a stk__tobj points at here. */
typedef struct file_obj {
    char *path;
    int fd; /* -1 once idle: each read opens the file */
} file_obj;

static file_obj *fobj(stk__tobj *o)
{
    return (file_obj *)(void *)o;
}

static void path_of(const stk__transport *t, const char *name, char *buf, size_t n)
{
    const file_tp *f = (const file_tp *)t;
    if (f->root)
        stk__fmt(buf, n, "%s/%s", f->root, name);
    else
        stk__fmt(buf, n, "%s", name);
}

static int file_open(stk__transport *t, const char *name, stk__tobj **out, stk__tinfo *info,
                     char *err, size_t errlen)
{
    char path[4096];
    int rc = STK_OK;
    path_of(t, name, path, sizeof path);
    file_obj *o = stk__calloc(1, sizeof *o);
    if (o)
        o->fd = -1;
    if (!o || !(o->path = stk__strdup(path))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((o->fd = stk__open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        int e = errno;
        stk__fmt(err, errlen, "%s", strerror(e));
        rc = e == ENOENT ? STK_ENOENT : STK_EIO;
        goto out;
    }
    struct stat st;
    int sr = stk__fstat(o->fd, &st);
    if (sr != 0 || !S_ISREG(st.st_mode)) {
        stk__fmt(err, errlen, "%s", sr ? strerror(errno) : "not a regular file");
        rc = STK_EIO;
        goto out;
    }
    *info = (stk__tinfo){.sized = true,
                         .size = (uint64_t)st.st_size,
                         .dev = (uint64_t)st.st_dev,
                         .ino = (uint64_t)st.st_ino};
    *out = (stk__tobj *)(void *)o;
    o = NULL;
out:
    if (o) {
        if (o->fd >= 0)
            stk__close(o->fd);
        stk__free(o->path);
        stk__free(o);
    }
    return rc;
}

static void file_idle(stk__transport *t, stk__tobj *obj)
{
    file_obj *o = fobj(obj);
    (void)t;
    if (o->fd >= 0)
        stk__close(o->fd);
    o->fd = -1;
}

/* Reads exactly r->len bytes at r->off from fd. */
static void pread_exact(int fd, stk__trange *r)
{
    ssize_t got = stk__pread_upto(fd, r->buf, (size_t)r->len, (off_t)r->off);
    if (got < 0) {
        stk__fmt(r->err, sizeof r->err, "read of %llu bytes at offset %llu failed: %s",
                 (unsigned long long)r->len, (unsigned long long)r->off, strerror(errno));
        r->rc = STK_EIO;
    } else if ((uint64_t)got < r->len) {
        stk__fmt(r->err, sizeof r->err,
                 "short read: %zd of %llu bytes at offset %llu (file truncated?)", got,
                 (unsigned long long)r->len, (unsigned long long)r->off);
        r->rc = STK_EIO;
    }
}

static void file_read(stk__transport *t, stk__trange *const *rs, size_t n)
{
    (void)t;
    for (size_t k = 0; k < n; k++) {
        stk__trange *r = rs[k];
        r->rc = STK_OK;
        r->total = 0;
        r->version[0] = r->err[0] = '\0';
        if (!r->len)
            continue;
        const file_obj *o = fobj(r->obj);
        int fd = o->fd;
        if (fd < 0 && (fd = stk__open(o->path, O_RDONLY | O_CLOEXEC)) < 0) {
            stk__fmt(r->err, sizeof r->err, "cannot open it again: %s", strerror(errno));
            r->rc = STK_EIO;
            continue;
        }
        pread_exact(fd, r);
        if (fd != o->fd)
            stk__close(fd);
    }
}

static int file_path(stk__transport *t, stk__tobj *o, char *buf, size_t n)
{
    (void)t;
    stk__fmt(buf, n, "%s", fobj(o)->path);
    return STK_OK;
}

static void file_close_obj(stk__transport *t, stk__tobj *o)
{
    if (!o)
        return;
    file_idle(t, o);
    stk__free(fobj(o)->path);
    stk__free(o);
}

static int file_get(stk__transport *t, const char *name, size_t limit, uint8_t **out, size_t *len,
                    char *err, size_t errlen)
{
    char path[4096], why[STK_ERRMSG_MAX];
    stk__tobj *o = NULL;
    stk__tinfo info;
    uint8_t *buf = NULL;
    stk__trange r = {0}, *rp = &r;
    path_of(t, name, path, sizeof path);
    int rc = file_open(t, name, &o, &info, why, sizeof why);
    if (rc) {
        if (rc != STK_ENOENT)
            stk__fmt(err, errlen, "%s: %s", path, why);
        return rc;
    }
    if (info.size > limit) {
        stk__fmt(err, errlen, "%s: is %llu bytes, more than the %zu read at most", path,
                 (unsigned long long)info.size, limit);
        rc = STK_ETOOBIG;
        goto out;
    }
    if (!(buf = stk__malloc((size_t)info.size + 1))) {
        rc = STK_ENOMEM;
        goto out;
    }
    r = (stk__trange){.obj = o, .off = 0, .len = info.size, .buf = buf};
    file_read(t, &rp, 1);
    if ((rc = r.rc)) {
        stk__fmt(err, errlen, "%s: %s", path, r.err);
        goto out;
    }
    buf[info.size] = '\0';
    *out = buf;
    *len = (size_t)info.size;
    buf = NULL;
out:
    stk__free(buf);
    file_close_obj(t, o);
    return rc;
}

static void file_close(stk__transport *t)
{
    file_tp *f = (file_tp *)t;
    stk__free(f->root);
    stk__free(f);
}

int stk__tp_copy_refused(stk__tcopy *c, const char *what)
{
    c->rc = STK_EUNSUPPORTED;
    stk__fmt(c->err, sizeof c->err, "%s is read where it is, never copied", what);
    return c->rc;
}

void stk__tp_copy_wait_none(stk__transport *t, stk__tcopy *c)
{
    (void)t;
    (void)c;
}

/* A local file needs no copy into the cache: readers open it where it is. */
static int file_copy_start(stk__transport *t, stk__tcopy *c)
{
    (void)t;
    return stk__tp_copy_refused(c, "a local file");
}

static const stk__tp_ops k_file_ops = {.kind = "file",
                                       .batch = 1,
                                       .open = file_open,
                                       .idle = file_idle,
                                       .read = file_read,
                                       .get = file_get,
                                       .copy_start = file_copy_start,
                                       .copy_wait = stk__tp_copy_wait_none,
                                       .display = path_of,
                                       .id = path_of,
                                       .path = file_path,
                                       .close_obj = file_close_obj,
                                       .close = file_close};

int stk__transport_file(stk__transport **out, const char *root)
{
    file_tp *f = stk__calloc(1, sizeof *f);
    if (!f || (root && !(f->root = stk__strdup(root)))) {
        stk__free(f);
        return STK_ENOMEM;
    }
    f->base.ops = &k_file_ops;
    *out = &f->base;
    return STK_OK;
}
