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

/* How often a wait for another process's download looks again. */
#define WAIT_SLICE_US 50000

typedef struct dl {
    stk__req q;
    char key[192];
    char tag[128]; /* the object's ETag/Last-Modified at the probe ("" none) */
    uint64_t size;
    int fd;
    bool pinned, started;
} dl;

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

int stk__source_tar_open_remote(stk__source *s, stk__remote *r, const char *const *names,
                                const uint64_t *sizes, size_t n, const stk__source_params *prm,
                                char *err, size_t errlen)
{
    int rc = STK_OK;
    stk__cache *cache = NULL;
    dl *d = NULL;
    char **paths = NULL;
    uint8_t *probe = NULL;
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
    if (!(d = stk__calloc(n, sizeof *d)) || !(paths = stk__calloc(n, sizeof *paths)) ||
        !(probe = stk__malloc(n ? n : 1))) {
        rc = STK_ENOMEM;
        goto out;
    }
    /* Each object's size and version (ETag or Last-Modified) from a 1-byte
     * ranged GET, even when a listing gave the sizes: the version keys the
     * cache entry, so an object replaced on the server is never read from a
     * copy of the old one. */
    for (size_t k = 0; k < n; k++) {
        d[k].fd = -1;
        d[k].q = (stk__req){.name = names[k], .fd = -1, .off = 0, .len = 1, .buf = probe + k};
    }
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
        if (sizes && sizes[k] != d[k].q.total) {
            stk__fmt(err, errlen, "%s: is %llu bytes, the listing says %llu (did it change?)",
                     where, (unsigned long long)d[k].q.total, (unsigned long long)sizes[k]);
            rc = STK_EIO;
            goto out;
        }
        d[k].size = d[k].q.total;
        stk__fmt(d[k].tag, sizeof d[k].tag, "%s", d[k].q.validator);
    }
    /* Pin what is cached; start downloads of the rest. */
    for (size_t k = 0; k < n; k++) {
        char where[4096], id[4096];
        stk__remote_object_display(r, names[k], where, sizeof where);
        stk__remote_object_id(r, names[k], id, sizeof id);
        stk__cache_key(id, d[k].size, d[k].tag, d[k].key, sizeof d[k].key);
        for (;;) {
            int prc = stk__cache_pin(cache, d[k].key, &d[k].fd);
            if (prc == STK_OK) {
                d[k].pinned = true;
                break;
            }
            if (prc == STK_ENOMEM) {
                rc = prc;
                goto out;
            }
            char why[STK_ERRMSG_MAX];
            rc =
                stk__cache_begin(cache, d[k].key, d[k].size, NULL, NULL, &d[k].fd, why, sizeof why);
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
            /* Another process is downloading it: wait for it, as long as
             * it makes progress and no one cancels the open. */
            uint64_t idle = 0;
            if (prm->cancel && *prm->cancel) {
                stk__fmt(err, errlen, "%s: cancelled while waiting for another process's download",
                         where);
                rc = STK_EIO;
                goto out;
            }
            if (stk__cache_part_idle(cache, d[k].key, &idle) == STK_OK &&
                idle > stall_limit_ns(prm)) {
                stk__fmt(err, errlen,
                         "%s: another process has been downloading it into the cache (%s) but "
                         "wrote nothing for %llu s; is that process hung?",
                         where, prm->cache_dir, (unsigned long long)(idle / 1000000000ULL));
                rc = STK_EIO;
                goto out;
            }
            usleep(WAIT_SLICE_US);
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
        /* A download that is not exactly the object probed (replaced on the
         * server meanwhile: another size or version) is never committed
         * under the probe's key. */
        if (!qrc && d[k].q.got != d[k].size) {
            stk__fmt(d[k].q.err, sizeof d[k].q.err,
                     "the object is now %llu bytes, not the %llu it had a moment ago (it was "
                     "replaced while being read; try again)",
                     (unsigned long long)d[k].q.got, (unsigned long long)d[k].size);
            qrc = STK_EIO;
        } else if (!qrc && d[k].tag[0] && d[k].q.validator[0] &&
                   strcmp(d[k].tag, d[k].q.validator)) {
            stk__fmt(d[k].q.err, sizeof d[k].q.err,
                     "the object changed while being read (ETag/Last-Modified %s, was %s); try "
                     "again",
                     d[k].q.validator, d[k].tag);
            qrc = STK_EIO;
        }
        if (qrc) {
            stk__fmt(err, errlen, "%s: %s", where, d[k].q.err);
            stk__cache_abort(cache, d[k].key, d[k].fd, d[k].q.write_errno != 0);
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
            stk__cache_abort(cache, d[k].key, d[k].fd, false);
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
    stk__free(probe);
    stk__free(d);
    stk__cache_close(cache);
    stk__remote_close(r);
    return rc;
}
