/*
 * remote_files.c -- the files a dataset names, as local files: a transport
 * and the names got through it. A local dataset's transport is its files
 * ("DIR/NAME"); an object store's is the disk cache layered over the
 * store's transport (io/transport_cache.c), whose open pins each object's
 * entry or downloads it whole (many at once), so the format's local reader
 * opens the entry's file by path. Formats whose samples cannot be read by
 * byte ranges without an index of the whole file (tar, TFRecord) or whose
 * shards are compressed as a whole (MDS .mds.zstd, LitData .zstd.bin) open
 * remotely this way (Parquet does not: parquet.c reads its row groups by
 * range); the cache must then hold the dataset (cache_limit),
 * and a dataset larger than the disk should be packed as .stk (stoker
 * pack), whose samples stream by ranged reads.
 *
 * A name asked for twice (a sniff, then the reader) is opened once; its
 * object (and so its pin) is kept until the set closes or the source takes
 * the pins (stk__files_keep).
 */
#include "cache/cache.h"
#include "io/remote.h"
#include "io/transport.h"
#include "source/source.h"

#include <string.h>

typedef struct fentry {
    char *name, *path, *shown;
    stk__tobj *obj; /* remote: the cached object (its pin), else NULL */
} fentry;

struct stk__files {
    stk__transport *t;   /* the files (local: under the dataset's directory, or
                            paths) or the cache over the store's objects */
    stk__remote *remote; /* remote: the store (owned; the transport borrows it) */
    fentry *e;
    size_t n, cap;
};

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

int stk__files_open_remote(stk__files **out, stk__remote *r, const stk__source_params *prm,
                           const char *what)
{
    stk__transport *inner = NULL;
    stk__files *f = stk__calloc(1, sizeof *f);
    stk__tcache_cfg cfg = {.dir = prm->cache_dir,
                           .limit = prm->cache_limit,
                           .cancel = prm->cancel,
                           .stall_ns = stall_limit_ns(prm),
                           .shown = stk__remote_display(r),
                           .what = what};
    if (!f || stk__transport_remote(&inner, r) || stk__transport_cache(&f->t, inner, &cfg)) {
        stk__transport_close(inner);
        stk__free(f);
        stk__remote_close(r);
        return STK_ENOMEM;
    }
    f->remote = r;
    *out = f;
    return STK_OK;
}

bool stk__files_is_remote(const stk__files *f)
{
    return f->remote != NULL;
}

void stk__files_set_what(stk__files *f, const char *what)
{
    if (f->remote)
        stk__tcache_set_what(f->t, what);
}

static const fentry *find(const stk__files *f, const char *name)
{
    for (size_t k = 0; k < f->n; k++)
        if (!strcmp(f->e[k].name, name))
            return &f->e[k];
    return NULL;
}

/* Appends an entry (the strings copied). */
static int add(stk__files *f, const char *name, const char *path, const char *shown, stk__tobj *obj)
{
    int rc = stk__grow((void **)&f->e, &f->cap, f->n + 1, sizeof *f->e);
    if (rc)
        return rc;
    fentry *e = &f->e[f->n];
    *e = (fentry){stk__strdup(name), stk__strdup(path), stk__strdup(shown), obj};
    f->n++; /* freed by stk__files_close, also half-made */
    return e->name && e->path && e->shown ? STK_OK : STK_ENOMEM;
}

static int get_local(stk__files *f, const char *name)
{
    char p[4096];
    f->t->ops->display(f->t, name, p, sizeof p);
    return add(f, name, p, p, NULL);
}

static int get_remote(stk__files *f, const char *const *names, const uint64_t *sizes, size_t n,
                      const char *sizes_from, char *err, size_t errlen)
{
    int rc = STK_OK;
    const char **todo = NULL;
    uint64_t *want = NULL;
    stk__tobj **objs = NULL;
    size_t m = 0;
    if (!(todo = stk__calloc(n ? n : 1, sizeof *todo)) ||
        !(objs = stk__calloc(n ? n : 1, sizeof *objs)) ||
        (sizes && !(want = stk__calloc(n ? n : 1, sizeof *want)))) {
        rc = STK_ENOMEM;
        goto out;
    }
    /* The names not fetched yet, each once. */
    for (size_t k = 0; k < n; k++) {
        bool seen = find(f, names[k]) != NULL;
        for (size_t j = 0; j < m && !seen; j++)
            seen = !strcmp(todo[j], names[k]);
        if (seen)
            continue;
        todo[m] = names[k];
        if (want)
            want[m] = sizes[k];
        m++;
    }
    /* Also with nothing new: the cache's own checks (a cache_dir) come
     * first, whatever was got before. */
    if ((rc = stk__tcache_open(f->t, todo, want, m, sizes_from, objs, err, errlen)))
        goto out;
    for (size_t k = 0; k < m; k++) {
        char p[4096], shown[4096];
        f->t->ops->path(f->t, objs[k], p, sizeof p);
        f->t->ops->display(f->t, todo[k], shown, sizeof shown);
        size_t before = f->n;
        rc = add(f, todo[k], p, shown, objs[k]);
        if (f->n > before)
            objs[k] = NULL; /* the entry's now, also when half-made */
        if (rc)
            goto out;
    }
out:
    for (size_t k = 0; objs && k < m; k++)
        f->t->ops->close_obj(f->t, objs[k]);
    stk__free(want);
    stk__free(objs);
    stk__free(todo);
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
        pins += f->e[k].obj != NULL;
    if (!pins)
        return STK_OK;
    int *p = stk__malloc((s->npins + pins) * sizeof *p);
    if (!p)
        return STK_ENOMEM;
    if (s->npins)
        memcpy(p, s->pins, s->npins * sizeof *p);
    for (size_t k = 0; k < f->n; k++)
        if (f->e[k].obj) {
            int pin = stk__tcache_take_pin(f->t, f->e[k].obj);
            if (pin >= 0)
                p[s->npins++] = pin;
            f->t->ops->close_obj(f->t, f->e[k].obj);
            f->e[k].obj = NULL;
        }
    stk__free(s->pins);
    s->pins = p;
    /* The pins belong to this cache: it lives as long as they do. A source
     * that already has one (none of these readers) keeps its own. */
    if (!s->cache)
        s->cache = stk__tcache_take_cache(f->t);
    return STK_OK;
}

void stk__files_close(stk__files *f)
{
    if (!f)
        return;
    for (size_t k = 0; k < f->n; k++) {
        f->t->ops->close_obj(f->t, f->e[k].obj); /* unpins */
        stk__free(f->e[k].name);
        stk__free(f->e[k].path);
        stk__free(f->e[k].shown);
    }
    stk__free(f->e);
    stk__transport_close(f->t); /* the cache, then the store's transport, before the
                                   store it borrows */
    stk__remote_close(f->remote);
    stk__free(f);
}
