/*
 * tar_remote.c -- WebDataset .tar shards in an object store. A tar shard has
 * no index, so each one is downloaded whole into the disk cache (many at
 * once), pinned there for the loader's life, and read by the local tar
 * reader, which indexes it. The cache must therefore hold the dataset; a
 * dataset larger than the disk should be packed as .stk (stoker pack), whose
 * samples stream by ranged reads.
 */
#include "cache/cache.h"
#include "io/remote.h"
#include "source/source.h"

#include <string.h>
#include <unistd.h>

typedef struct dl {
    stk__req q;
    char key[192];
    int fd;
    bool pinned, started;
} dl;

int stk__source_tar_open_remote(stk__source *s, stk__remote *r, const char *const *names,
                                const uint64_t *sizes, size_t n, const stk__source_params *prm,
                                char *err, size_t errlen)
{
    int rc = STK_OK;
    stk__cache *cache = NULL;
    dl *d = NULL;
    char **paths = NULL;
    uint8_t probe[512];
    memset(s, 0, sizeof *s);
    if (!prm->cache_dir || !*prm->cache_dir) {
        stk__fmt(err, errlen,
                 "%s: .tar shards over the network are downloaded whole into the disk cache "
                 "(they have no index to read samples by range): give a cache directory "
                 "(cache_dir / --cache-dir), or pack the dataset as .stk with stoker pack to "
                 "stream it",
                 stk__remote_display(r));
        stk__remote_close(r);
        return STK_EINVAL;
    }
    if ((rc = stk__cache_open(&cache, prm->cache_dir, prm->cache_limit, err, errlen)))
        goto out;
    if (!(d = stk__calloc(n, sizeof *d)) || !(paths = stk__calloc(n, sizeof *paths))) {
        rc = STK_ENOMEM;
        goto out;
    }
    /* Sizes: from the listing, else a 1-byte ranged GET's Content-Range. */
    for (size_t k = 0; k < n; k++) {
        d[k].fd = -1;
        d[k].q = (stk__req){.name = names[k], .fd = -1};
        if (!sizes) {
            d[k].q.off = 0;
            d[k].q.len = 1;
            d[k].q.buf = probe;
        }
    }
    if (!sizes) {
        for (size_t k = 0; k < n; k++)
            stk__remote_submit(r, &d[k].q);
        for (size_t k = 0; k < n; k++)
            stk__remote_wait(r, &d[k].q);
        for (size_t k = 0; k < n; k++) {
            char where[4096];
            stk__remote_object_display(r, names[k], where, sizeof where);
            if (d[k].q.rc || !d[k].q.total) {
                stk__fmt(err, errlen, "%s: %s", where,
                         d[k].q.rc == STK_ENOENT ? "not found (HTTP 404)"
                         : d[k].q.rc             ? d[k].q.err
                                                 : "the server did not say its size");
                rc = d[k].q.rc == STK_ENOENT ? STK_ENOENT : STK_EIO;
                goto out;
            }
        }
    }
    /* Pin what is cached; start downloads of the rest. */
    for (size_t k = 0; k < n; k++) {
        uint64_t size = sizes ? sizes[k] : d[k].q.total;
        char where[4096];
        stk__remote_object_display(r, names[k], where, sizeof where);
        stk__cache_key(where, size, d[k].key, sizeof d[k].key);
        for (;;) {
            if (stk__cache_pin(cache, d[k].key, &d[k].fd) == STK_OK) {
                d[k].pinned = true;
                break;
            }
            char why[STK_ERRMSG_MAX];
            rc = stk__cache_begin(cache, d[k].key, size, NULL, NULL, &d[k].fd, why, sizeof why);
            if (rc == STK_OK) {
                d[k].q = (stk__req){.name = names[k], .fd = d[k].fd};
                stk__remote_submit(r, &d[k].q);
                d[k].started = true;
                break;
            }
            if (rc != STK_EBUSY) {
                stk__fmt(err, errlen,
                         "%s: %s; the tar dataset must fit the cache (raise cache_limit), or "
                         "pack it as .stk to stream it",
                         where, why);
                goto out;
            }
            /* Another process is downloading it: wait for it. */
            usleep(20000);
        }
        rc = STK_OK;
    }
    for (size_t k = 0; k < n; k++) {
        if (!d[k].started)
            continue;
        int qrc = stk__remote_wait(r, &d[k].q);
        d[k].started = false;
        char where[4096];
        stk__remote_object_display(r, names[k], where, sizeof where);
        if (qrc) {
            stk__fmt(err, errlen, "%s: %s", where, d[k].q.err);
            stk__cache_abort(cache, d[k].key, d[k].fd);
            d[k].fd = -1;
            rc = qrc == STK_ENOENT ? STK_ENOENT : qrc;
            goto out;
        }
        if ((rc = stk__cache_commit(cache, d[k].key, d[k].fd, err, errlen))) {
            d[k].fd = -1;
            goto out;
        }
        d[k].pinned = true;
    }
    for (size_t k = 0; k < n; k++) {
        char p[4096];
        stk__cache_path(cache, d[k].key, p, sizeof p);
        if (!(paths[k] = stk__strdup(p))) {
            rc = STK_ENOMEM;
            goto out;
        }
    }
    rc = stk__source_tar_open(s, (const char *const *)paths, n, err, errlen);
    if (rc)
        goto out;
    /* The pins (and the cache) live as long as the source. */
    if (!(s->pins = stk__malloc(n * sizeof *s->pins))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        s->pins[k] = d[k].fd;
        d[k].fd = -1;
    }
    s->npins = n;
    s->cache = cache;
    s->remote = r;
    cache = NULL;
    r = NULL;
out:
    for (size_t k = 0; d && k < n; k++) {
        if (d[k].started) {
            stk__remote_wait(r, &d[k].q);
            stk__cache_abort(cache, d[k].key, d[k].fd);
        } else if (d[k].fd >= 0) {
            stk__cache_unpin(d[k].fd);
        }
        stk__free(d[k].q.body);
    }
    if (rc && s->ops)
        stk__source_close(s);
    for (size_t k = 0; paths && k < n; k++)
        stk__free(paths[k]);
    stk__free(paths);
    stk__free(d);
    stk__cache_close(cache);
    stk__remote_close(r);
    return rc;
}
