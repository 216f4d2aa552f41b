/*
 * remote_files.c -- the files a dataset names, as local files: for a local
 * dataset "DIR/NAME"; for one in an object store, each object downloaded
 * whole into the disk cache (many at once) and pinned there for the
 * source's life, so the format's local reader opens it. Formats whose
 * samples cannot be read by byte ranges without an index of the whole file
 * (tar, TFRecord) or whose shards are compressed as a whole (MDS .mds.zstd,
 * LitData .zstd.bin) open remotely this way; the cache must then hold the
 * dataset (cache_limit), and a dataset larger than the disk should be packed
 * as .stk (stoker pack), whose samples stream by ranged reads.
 *
 * Names, messages, probes and downloads go through the transport
 * (io/transport.h): its ranged reads probe, its copy downloads into the
 * cache entry's file. The cache is not yet a transport itself over the
 * store's (docs/architecture.md says what is left).
 *
 * For each object: its size and version (ETag or Last-Modified) from a
 * 1-byte ranged read, even when a listing or an index gave the size (the
 * version keys the cache entry, so an object replaced on the server is
 * never read from a copy of the old one); then a pin of the entry when the
 * cache holds it, else a download (all at once), or a wait for another
 * process that is downloading it. A name asked for twice (a sniff, then the
 * reader) is fetched once.
 */
#include "cache/cache.h"
#include "io/remote.h"
#include "io/transport.h"
#include "source/source.h"

#include <string.h>
#include <unistd.h>

/* How often a wait for another process's download looks again. */
#define WAIT_SLICE_US 50000

typedef struct fentry {
    char *name, *path, *shown;
    int pin; /* the cache entry's pin (remote), or -1 */
} fentry;

struct stk__files {
    stk__transport *t;   /* the files (local: under the dataset's directory, or
                            paths) or the store's objects: names, probes */
    stk__remote *remote; /* remote: the store (owned; the transport borrows it) */
    stk__cache *cache;   /* opened at the first remote get */
    const stk__source_params *prm;
    char what[96]; /* what is downloaded, for the no-cache message */
    fentry *e;
    size_t n, cap;
};

/* One download in progress. */
typedef struct dl {
    stk__tobj *o;
    stk__tcopy c;
    const char *name;
    char key[192];
    char tag[128]; /* the object's ETag/Last-Modified at the probe ("" none) */
    uint64_t size;
    int fd;
    bool pinned, started;
} dl;

int stk__files_open_local(stk__files **out, const char *dir)
{
    stk__files *f = stk__calloc(1, sizeof *f);
    if (!f || stk__transport_file(&f->t, dir)) {
        stk__free(f);
        return STK_ENOMEM;
    }
    *out = f;
    return STK_OK;
}

int stk__files_open_remote(stk__files **out, stk__remote *r, const stk__source_params *prm,
                           const char *what)
{
    stk__files *f = stk__calloc(1, sizeof *f);
    if (!f || stk__transport_remote(&f->t, r)) {
        stk__free(f);
        stk__remote_close(r);
        return STK_ENOMEM;
    }
    f->remote = r;
    f->prm = prm;
    stk__fmt(f->what, sizeof f->what, "%s", what);
    *out = f;
    return STK_OK;
}

bool stk__files_is_remote(const stk__files *f)
{
    return f->remote != NULL;
}

void stk__files_set_what(stk__files *f, const char *what)
{
    stk__fmt(f->what, sizeof f->what, "%s", what);
}

static const fentry *find(const stk__files *f, const char *name)
{
    for (size_t k = 0; k < f->n; k++)
        if (!strcmp(f->e[k].name, name))
            return &f->e[k];
    return NULL;
}

/* Appends an entry (the strings copied). */
static int add(stk__files *f, const char *name, const char *path, const char *shown, int pin)
{
    int rc = stk__grow((void **)&f->e, &f->cap, f->n + 1, sizeof *f->e);
    if (rc)
        return rc;
    fentry *e = &f->e[f->n];
    *e = (fentry){stk__strdup(name), stk__strdup(path), stk__strdup(shown), pin};
    f->n++; /* freed by stk__files_close, also half-made */
    return e->name && e->path && e->shown ? STK_OK : STK_ENOMEM;
}

static int get_local(stk__files *f, const char *name)
{
    char p[4096];
    f->t->ops->display(f->t, name, p, sizeof p);
    return add(f, name, p, p, -1);
}

/* How long another process's download may write nothing before this one
 * stops waiting for it: every attempt it may make timing out, plus the
 * backoffs between them. */
static uint64_t stall_limit_ns(const stk__source_params *prm)
{
    const stk__remote_cfg *rc = prm->remote;
    uint64_t timeout = rc && rc->timeout_s ? rc->timeout_s : 30;
    uint64_t retries = !rc || !rc->retries ? 6 : rc->retries == UINT32_MAX ? 0 : rc->retries;
    return (retries + 1) * (timeout + 10) * 1000000000ULL;
}

/* Probes the objects d[0..n) for their sizes and versions: a 1-byte read
 * of each, all in flight together. */
static int probe(stk__files *f, dl *d, size_t n, const uint64_t *sizes, const char *sizes_from,
                 char *err, size_t errlen)
{
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
        if ((rc = f->t->ops->open(f->t, d[k].name, &d[k].o, &info, err, errlen)))
            goto out;
        r[k] = (stk__trange){.obj = d[k].o, .off = 0, .len = 1, .buf = buf + k};
        rp[k] = &r[k];
    }
    f->t->ops->read(f->t, rp, n);
    for (size_t k = 0; k < n && !rc; k++) {
        char where[4096];
        f->t->ops->display(f->t, d[k].name, where, sizeof where);
        /* An empty object answers a ranged GET with 416 or an empty 200:
         * its size is then 0, which the readers report as they do a local
         * empty file. */
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

/* Pins object k's cache entry, or starts its download, or waits while
 * another process downloads it. */
static int pin_or_start(stk__files *f, dl *d, char *err, size_t errlen)
{
    const stk__source_params *prm = f->prm;
    char where[4096], id[4096];
    f->t->ops->display(f->t, d->name, where, sizeof where);
    f->t->ops->id(f->t, d->name, id, sizeof id);
    stk__cache_key(id, d->size, d->tag, d->key, sizeof d->key);
    for (;;) {
        int rc = stk__cache_pin(f->cache, d->key, &d->fd);
        if (rc == STK_OK) {
            d->pinned = true;
            return STK_OK;
        }
        if (rc == STK_ENOMEM)
            return rc;
        char why[STK_ERRMSG_MAX];
        rc = stk__cache_begin(f->cache, d->key, d->size, NULL, NULL, &d->fd, why, sizeof why);
        if (rc == STK_OK) {
            d->c = (stk__tcopy){.obj = d->o, .fd = d->fd};
            if ((rc = f->t->ops->copy_start(f->t, &d->c))) {
                stk__fmt(err, errlen, "%s: %s", where, d->c.err);
                stk__cache_abort(f->cache, d->key, d->fd, false);
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
                     where, why, f->what);
            return rc;
        }
        /* Another process is downloading it: wait for it, as long as it
         * makes progress and no one cancels the open. */
        uint64_t idle = 0;
        if (prm->cancel && *prm->cancel) {
            stk__fmt(err, errlen, "%s: cancelled while waiting for another process's download",
                     where);
            return STK_EIO;
        }
        if (stk__cache_part_idle(f->cache, d->key, &idle) == STK_OK && idle > stall_limit_ns(prm)) {
            stk__fmt(err, errlen,
                     "%s: another process has been downloading it into the cache (%s) but "
                     "wrote nothing for %llu s; is that process hung?",
                     where, prm->cache_dir, (unsigned long long)(idle / 1000000000ULL));
            return STK_EIO;
        }
        usleep(WAIT_SLICE_US);
    }
}

/* Waits for object k's download and commits it into the cache. */
static int finish(stk__files *f, dl *d, char *err, size_t errlen)
{
    f->t->ops->copy_wait(f->t, &d->c);
    int qrc = d->c.rc;
    d->started = false;
    char where[4096];
    f->t->ops->display(f->t, d->name, where, sizeof where);
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
        stk__cache_abort(f->cache, d->key, d->fd, d->c.write_errno != 0);
        d->fd = -1;
        return qrc == STK_ENOENT ? STK_ENOENT : qrc;
    }
    int rc = stk__cache_commit(f->cache, d->key, d->fd, err, errlen);
    if (rc) {
        d->fd = -1;
        return rc;
    }
    d->pinned = true;
    return STK_OK;
}

static int get_remote(stk__files *f, const char *const *names, const uint64_t *sizes, size_t n,
                      const char *sizes_from, char *err, size_t errlen)
{
    int rc = STK_OK;
    dl *d = NULL;
    uint64_t *want = NULL;
    size_t m = 0;
    if (!f->prm->cache_dir || !*f->prm->cache_dir) {
        stk__fmt(err, errlen,
                 "%s: %s over the network are downloaded whole into the disk cache: give a "
                 "cache directory (cache_dir / --cache-dir), or pack the dataset as .stk with "
                 "stoker pack to stream it",
                 stk__remote_display(f->remote), f->what);
        return STK_EINVAL;
    }
    if (!f->cache &&
        (rc = stk__cache_open(&f->cache, f->prm->cache_dir, f->prm->cache_limit, err, errlen)))
        return rc;
    if (!(d = stk__calloc(n ? n : 1, sizeof *d)) ||
        (sizes && !(want = stk__calloc(n ? n : 1, sizeof *want)))) {
        rc = STK_ENOMEM;
        goto out;
    }
    /* The names not fetched yet, each once. */
    for (size_t k = 0; k < n; k++) {
        bool seen = find(f, names[k]) != NULL;
        for (size_t j = 0; j < m && !seen; j++)
            seen = !strcmp(d[j].name, names[k]);
        if (seen)
            continue;
        d[m] = (dl){.name = names[k], .fd = -1};
        if (want)
            want[m] = sizes[k];
        m++;
    }
    if ((rc = probe(f, d, m, want, sizes_from, err, errlen)))
        goto out;
    /* Pin what is cached; start downloads of the rest. */
    for (size_t k = 0; k < m; k++)
        if ((rc = pin_or_start(f, &d[k], err, errlen)))
            goto out;
    for (size_t k = 0; k < m; k++)
        if (d[k].started && (rc = finish(f, &d[k], err, errlen)))
            goto out;
    for (size_t k = 0; k < m; k++) {
        char p[4096], shown[4096];
        stk__cache_path(f->cache, d[k].key, p, sizeof p);
        f->t->ops->display(f->t, d[k].name, shown, sizeof shown);
        size_t before = f->n;
        rc = add(f, d[k].name, p, shown, d[k].fd);
        if (f->n > before)
            d[k].fd = -1; /* the entry's pin now, also when half-made */
        if (rc)
            goto out;
    }
out:
    for (size_t k = 0; k < m; k++) {
        if (d[k].started) {
            f->t->ops->copy_wait(f->t, &d[k].c);
            stk__cache_abort(f->cache, d[k].key, d[k].fd, false);
        } else if (d[k].fd >= 0) {
            stk__cache_unpin(d[k].fd);
        }
        f->t->ops->close_obj(f->t, d[k].o);
    }
    stk__free(want);
    stk__free(d);
    return rc;
}

int stk__files_get(stk__files *f, const char *const *names, const uint64_t *sizes, size_t n,
                   const char *sizes_from, const char **paths, const char **shown, char *err,
                   size_t errlen)
{
    int rc = STK_OK;
    if (f->remote)
        rc = get_remote(f, names, sizes, n, sizes_from, err, errlen);
    for (size_t k = 0; k < n && !rc; k++) {
        const fentry *e = find(f, names[k]);
        if (!e && !f->remote) {
            if ((rc = get_local(f, names[k])))
                break;
            e = &f->e[f->n - 1];
        }
        if (paths)
            paths[k] = e->path;
        if (shown)
            shown[k] = e->shown;
    }
    return rc;
}

const char *stk__files_shown(const stk__files *f, const char *name, char *buf, size_t n)
{
    f->t->ops->display(f->t, name, buf, n);
    return buf;
}

int stk__files_keep(stk__files *f, stk__source *s)
{
    size_t pins = 0;
    for (size_t k = 0; k < f->n; k++)
        pins += f->e[k].pin >= 0;
    if (!pins)
        return STK_OK;
    int *p = stk__malloc((s->npins + pins) * sizeof *p);
    if (!p)
        return STK_ENOMEM;
    if (s->npins)
        memcpy(p, s->pins, s->npins * sizeof *p);
    for (size_t k = 0; k < f->n; k++)
        if (f->e[k].pin >= 0) {
            p[s->npins++] = f->e[k].pin;
            f->e[k].pin = -1;
        }
    stk__free(s->pins);
    s->pins = p;
    /* The pins belong to this cache: it lives as long as they do. A source
     * that already has one (none of these readers) keeps its own. */
    if (!s->cache) {
        s->cache = f->cache;
        f->cache = NULL;
    }
    return STK_OK;
}

void stk__files_close(stk__files *f)
{
    if (!f)
        return;
    for (size_t k = 0; k < f->n; k++) {
        if (f->e[k].pin >= 0)
            stk__cache_unpin(f->e[k].pin);
        stk__free(f->e[k].name);
        stk__free(f->e[k].path);
        stk__free(f->e[k].shown);
    }
    stk__free(f->e);
    stk__cache_close(f->cache);
    stk__transport_close(f->t); /* before the store it borrows */
    stk__remote_close(f->remote);
    stk__free(f);
}
