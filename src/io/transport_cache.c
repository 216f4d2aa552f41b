/*
 * transport_cache.c -- the disk cache as a transport layered over another
 * (transport.h): an object is opened by pinning its entry in the cache, or
 * by downloading it whole into a new entry through the inner transport's
 * copy slot, and then read where it lies, by preads of the pinned entry.
 * Readers that open their files by path (tar, MDS, LitData, TFRecord,
 * Parquet) get the entry's path from the path slot. Formats whose samples
 * cannot be read by byte ranges without an index of the whole file, or
 * whose shards are compressed as a whole, read a bucket this way; the
 * cache must then hold the dataset (cache_limit), and a dataset larger
 * than the disk should be packed as .stk, whose samples stream by ranged
 * reads of the store's own transport.
 *
 * For each object: its size and version (ETag or Last-Modified) from a
 * 1-byte ranged read, even when a listing or an index gave the size (the
 * version keys the cache entry, so an object replaced on the server is
 * never read from a copy of the old one); then a pin of the entry when the
 * cache holds it, else a download (all of a batch at once), or a wait for
 * another process that is downloading it.
 */
#include "io/transport.h"
#include "cache/cache.h"
#include "io/file.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How often a wait for another process's download looks again. */
#define WAIT_SLICE_US 50000

typedef struct cache_tp {
    stk__transport base;
    stk__transport *inner; /* owned */
    stk__cache *cache;     /* opened at the first open */
    char *dir, *shown;
    uint64_t limit, stall_ns;
    const _Atomic bool *cancel;
    char what[96];
} cache_tp;

/* What a stk__tobj points at here: a pinned entry. */
typedef struct cache_obj {
    char *path;
    int pin; /* the entry's pin (a descriptor open for reading), or -1 */
} cache_obj;

/* One object being opened. */
typedef struct dl {
    stk__tobj *o; /* the inner transport's */
    stk__tcopy c;
    const char *name;
    char key[192];
    char tag[128]; /* the object's ETag/Last-Modified at the probe ("" none) */
    uint64_t size;
    int fd;
    bool started;
} dl;

static cache_tp *ctp(stk__transport *t)
{
    return (cache_tp *)t;
}

static cache_obj *cobj(stk__tobj *o)
{
    return (cache_obj *)(void *)o;
}

/* Probes the objects d[0..n) for their sizes and versions: a 1-byte read
 * of each, all in flight together. */
static int probe(cache_tp *p, dl *d, size_t n, const uint64_t *sizes, const char *sizes_from,
                 char *err, size_t errlen)
{
    stk__transport *in = p->inner;
    int rc = STK_OK;
    size_t m = n ? n : 1;
    uint8_t *buf = stk__malloc(m);
    stk__trange *r = stk__calloc(m, sizeof *r);
    stk__trange **rp = stk__calloc(m, sizeof *rp);
    if (!buf || !r || !rp) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        stk__tinfo info;
        if ((rc = in->ops->open(in, d[k].name, &d[k].o, &info, err, errlen)))
            goto out;
        r[k] = (stk__trange){.obj = d[k].o, .off = 0, .len = 1, .buf = buf + k};
        rp[k] = &r[k];
    }
    in->ops->read(in, rp, n);
    for (size_t k = 0; k < n && !rc; k++) {
        char where[4096];
        in->ops->display(in, d[k].name, where, sizeof where);
        /* An empty object answers a ranged GET with 416 or an empty 200,
         * with no size: it is refused here, naming the object, as is an
         * object whose size the server does not say. */
        if (r[k].rc || !r[k].total) {
            stk__fmt(err, errlen, "%s: %s", where,
                     r[k].rc == STK_ENOENT ? "not found (HTTP 404)"
                     : r[k].rc             ? r[k].err
                                           : "the server did not say its size");
            rc = r[k].rc == STK_ENOENT || r[k].rc == STK_ENOMEM ? r[k].rc : STK_EIO;
        } else if (sizes && sizes[k] != r[k].total) {
            stk__fmt(err, errlen, "%s: is %llu bytes, %s says %llu (did it change?)", where,
                     (unsigned long long)r[k].total, sizes_from ? sizes_from : "the listing",
                     (unsigned long long)sizes[k]);
            rc = STK_EIO;
        } else {
            d[k].size = r[k].total;
            stk__fmt(d[k].tag, sizeof d[k].tag, "%s", r[k].version);
        }
    }
out:
    stk__free(rp);
    stk__free(r);
    stk__free(buf);
    return rc;
}

/* Waits while another process downloads d's entry: STK_OK to look again,
 * else why not. */
static int wait_other(cache_tp *p, dl *d, const char *where, char *err, size_t errlen)
{
    uint64_t idle = 0;
    if (p->cancel && *p->cancel) {
        stk__fmt(err, errlen, "%s: cancelled while waiting for another process's download", where);
        return STK_EIO;
    }
    if (stk__cache_part_idle(p->cache, d->key, &idle) == STK_OK && idle > p->stall_ns) {
        stk__fmt(err, errlen,
                 "%s: another process has been downloading it into the cache (%s) but "
                 "wrote nothing for %llu s; is that process hung?",
                 where, p->dir, (unsigned long long)(idle / 1000000000ULL));
        return STK_EIO;
    }
    usleep(WAIT_SLICE_US);
    return STK_OK;
}

/* Pins d's cache entry, or starts its download, or waits while another
 * process downloads it. */
static int pin_or_start(cache_tp *p, dl *d, char *err, size_t errlen)
{
    stk__transport *in = p->inner;
    char where[4096], id[4096];
    in->ops->display(in, d->name, where, sizeof where);
    in->ops->id(in, d->name, id, sizeof id);
    stk__cache_key(id, d->size, d->tag, d->key, sizeof d->key);
    for (;;) {
        int rc = stk__cache_pin(p->cache, d->key, &d->fd);
        if (rc == STK_OK)
            return STK_OK;
        if (rc == STK_ENOMEM)
            return rc;
        char why[STK_ERRMSG_MAX];
        rc = stk__cache_begin(p->cache, d->key, d->size, NULL, NULL, &d->fd, why, sizeof why);
        if (rc == STK_OK) {
            d->c = (stk__tcopy){.obj = d->o, .fd = d->fd};
            if ((rc = in->ops->copy_start(in, &d->c))) {
                stk__fmt(err, errlen, "%s: %s", where, d->c.err);
                stk__cache_abort(p->cache, d->key, d->fd, false);
                d->fd = -1;
                return rc;
            }
            d->started = true;
            return STK_OK;
        }
        if (rc != STK_EBUSY) {
            stk__fmt(err, errlen,
                     "%s: %s; %s are downloaded whole into the cache, which must hold the "
                     "dataset (raise cache_limit), or pack it as .stk to stream it",
                     where, why, p->what);
            return rc;
        }
        /* Another process is downloading it: wait for it, as long as it
         * makes progress and no one cancels the open. */
        if ((rc = wait_other(p, d, where, err, errlen)))
            return rc;
    }
}

/* Waits for d's download and commits it into the cache. */
static int finish(cache_tp *p, dl *d, char *err, size_t errlen)
{
    stk__transport *in = p->inner;
    in->ops->copy_wait(in, &d->c);
    int qrc = d->c.rc;
    d->started = false;
    char where[4096];
    in->ops->display(in, d->name, where, sizeof where);
    /* A download that is not exactly the object probed (replaced on the
     * server meanwhile: another size or version) is never committed under
     * the probe's key. */
    if (!qrc && d->c.got != d->size) {
        stk__fmt(d->c.err, sizeof d->c.err,
                 "the object is now %llu bytes, not the %llu it had a moment ago (it was "
                 "replaced while being read; try again)",
                 (unsigned long long)d->c.got, (unsigned long long)d->size);
        qrc = STK_EIO;
    } else if (!qrc && d->tag[0] && d->c.version[0] && strcmp(d->tag, d->c.version)) {
        stk__fmt(d->c.err, sizeof d->c.err,
                 "the object changed while being read (ETag/Last-Modified %s, was %s); try "
                 "again",
                 d->c.version, d->tag);
        qrc = STK_EIO;
    }
    if (qrc) {
        stk__fmt(err, errlen, "%s: %s", where, d->c.err);
        stk__cache_abort(p->cache, d->key, d->fd, d->c.write_errno != 0);
        d->fd = -1;
        return qrc;
    }
    int rc = stk__cache_commit(p->cache, d->key, d->fd, err, errlen);
    if (rc)
        d->fd = -1;
    return rc;
}

/* Makes the open objects of d[0..n), each taking its pin. */
static int make_objs(cache_tp *p, dl *d, size_t n, stk__tobj **objs)
{
    for (size_t k = 0; k < n; k++) {
        char path[4096];
        stk__cache_path(p->cache, d[k].key, path, sizeof path);
        cache_obj *o = stk__calloc(1, sizeof *o);
        if (!o || !(o->path = stk__strdup(path))) {
            stk__free(o);
            return STK_ENOMEM;
        }
        o->pin = d[k].fd;
        d[k].fd = -1;
        objs[k] = (stk__tobj *)(void *)o;
    }
    return STK_OK;
}

static void cache_close_obj(stk__transport *t, stk__tobj *obj)
{
    (void)t;
    if (!obj)
        return;
    cache_obj *o = cobj(obj);
    if (o->pin >= 0)
        stk__cache_unpin(o->pin);
    stk__free(o->path);
    stk__free(o);
}

int stk__tcache_open(stk__transport *t, const char *const *names, const uint64_t *sizes, size_t n,
                     const char *sizes_from, stk__tobj **objs, char *err, size_t errlen)
{
    cache_tp *p = ctp(t);
    stk__transport *in = p->inner;
    int rc = STK_OK;
    dl *d = NULL;
    for (size_t k = 0; k < n; k++)
        objs[k] = NULL;
    if (!p->dir) {
        stk__fmt(err, errlen,
                 "%s: %s over the network are downloaded whole into the disk cache: give a "
                 "cache directory (cache_dir / --cache-dir), or pack the dataset as .stk with "
                 "stoker pack to stream it",
                 p->shown, p->what);
        return STK_EINVAL;
    }
    if (!p->cache && (rc = stk__cache_open(&p->cache, p->dir, p->limit, err, errlen)))
        return rc;
    if (!(d = stk__calloc(n ? n : 1, sizeof *d)))
        return STK_ENOMEM;
    for (size_t k = 0; k < n; k++)
        d[k] = (dl){.name = names[k], .fd = -1};
    if ((rc = probe(p, d, n, sizes, sizes_from, err, errlen)))
        goto out;
    /* Pin what is cached; start downloads of the rest. */
    for (size_t k = 0; k < n; k++)
        if ((rc = pin_or_start(p, &d[k], err, errlen)))
            goto out;
    for (size_t k = 0; k < n; k++)
        if (d[k].started && (rc = finish(p, &d[k], err, errlen)))
            goto out;
    rc = make_objs(p, d, n, objs);
out:
    for (size_t k = 0; k < n; k++) {
        if (d[k].started) {
            in->ops->copy_wait(in, &d[k].c);
            stk__cache_abort(p->cache, d[k].key, d[k].fd, false);
        } else if (d[k].fd >= 0) {
            stk__cache_unpin(d[k].fd);
        }
        in->ops->close_obj(in, d[k].o);
        if (rc) {
            cache_close_obj(t, objs[k]);
            objs[k] = NULL;
        }
    }
    stk__free(d);
    return rc;
}

static int cache_open_one(stk__transport *t, const char *name, stk__tobj **out, stk__tinfo *info,
                          char *err, size_t errlen)
{
    char why[STK_ERRMSG_MAX];
    int rc = stk__tcache_open(t, &name, NULL, 1, NULL, out, why, sizeof why);
    if (rc) {
        stk__fmt(err, errlen, "%s", why);
        return rc;
    }
    struct stat st;
    if (stk__fstat(cobj(*out)->pin, &st) != 0) {
        stk__fmt(err, errlen, "the cached copy %s: %s", cobj(*out)->path, strerror(errno));
        cache_close_obj(t, *out);
        *out = NULL;
        return STK_EIO;
    }
    *info = (stk__tinfo){.sized = true,
                         .size = (uint64_t)st.st_size,
                         .dev = (uint64_t)st.st_dev,
                         .ino = (uint64_t)st.st_ino};
    return STK_OK;
}

/* A pinned entry must stay open: idle lets go of nothing. */
static void cache_idle(stk__transport *t, stk__tobj *o)
{
    (void)t;
    (void)o;
}

static void cache_read(stk__transport *t, stk__trange *const *rs, size_t n)
{
    (void)t;
    for (size_t k = 0; k < n; k++) {
        stk__trange *r = rs[k];
        r->rc = STK_OK;
        r->total = 0;
        r->version[0] = r->err[0] = '\0';
        if (!r->len)
            continue;
        ssize_t got = stk__pread_upto(cobj(r->obj)->pin, r->buf, (size_t)r->len, (off_t)r->off);
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
}

static int cache_get(stk__transport *t, const char *name, size_t limit, uint8_t **out, size_t *len,
                     char *err, size_t errlen)
{
    stk__transport *in = ctp(t)->inner;
    return in->ops->get(in, name, limit, out, len, err, errlen);
}

/* A cached object is read where it lies, never copied again. */
static int cache_copy_start(stk__transport *t, stk__tcopy *c)
{
    (void)t;
    return stk__tp_copy_refused(c, "a cached copy");
}

static void cache_display(const stk__transport *t, const char *name, char *buf, size_t n)
{
    const stk__transport *in = ((const cache_tp *)t)->inner;
    in->ops->display(in, name, buf, n);
}

static void cache_id(const stk__transport *t, const char *name, char *buf, size_t n)
{
    const stk__transport *in = ((const cache_tp *)t)->inner;
    in->ops->id(in, name, buf, n);
}

static int cache_path(stk__transport *t, stk__tobj *o, char *buf, size_t n)
{
    (void)t;
    stk__fmt(buf, n, "%s", cobj(o)->path);
    return STK_OK;
}

static void cache_close(stk__transport *t)
{
    cache_tp *p = ctp(t);
    stk__cache_close(p->cache);
    stk__transport_close(p->inner);
    stk__free(p->dir);
    stk__free(p->shown);
    stk__free(p);
}

static const stk__tp_ops k_cache_ops = {.kind = "cache",
                                        .batch = 1,
                                        .open = cache_open_one,
                                        .idle = cache_idle,
                                        .read = cache_read,
                                        .get = cache_get,
                                        .copy_start = cache_copy_start,
                                        .copy_wait = stk__tp_copy_wait_none,
                                        .display = cache_display,
                                        .id = cache_id,
                                        .path = cache_path,
                                        .close_obj = cache_close_obj,
                                        .close = cache_close};

int stk__transport_cache(stk__transport **out, stk__transport *inner, const stk__tcache_cfg *cfg)
{
    cache_tp *p = stk__calloc(1, sizeof *p);
    if (!p)
        return STK_ENOMEM;
    p->base.ops = &k_cache_ops;
    p->inner = inner;
    p->limit = cfg->limit;
    p->stall_ns = cfg->stall_ns;
    p->cancel = cfg->cancel;
    stk__fmt(p->what, sizeof p->what, "%s", cfg->what ? cfg->what : "objects");
    if ((cfg->dir && *cfg->dir && !(p->dir = stk__strdup(cfg->dir))) ||
        !(p->shown = stk__strdup(cfg->shown ? cfg->shown : ""))) {
        stk__free(p->dir);
        stk__free(p);
        return STK_ENOMEM;
    }
    *out = &p->base;
    return STK_OK;
}

void stk__tcache_set_what(stk__transport *t, const char *what)
{
    stk__fmt(ctp(t)->what, sizeof ctp(t)->what, "%s", what);
}

int stk__tcache_take_pin(stk__transport *t, stk__tobj *o)
{
    (void)t;
    int pin = cobj(o)->pin;
    cobj(o)->pin = -1;
    return pin;
}

stk__cache *stk__tcache_take_cache(stk__transport *t)
{
    stk__cache *c = ctp(t)->cache;
    ctp(t)->cache = NULL;
    return c;
}
