/*
 * fetch.c -- the fetch stage (see fetch.h).
 *
 * State, all under f->lock:
 *   - a ring of `cap` entries indexed by seq % cap, covering the planned
 *     window [lo, plan_seq); an entry is PLANNED (its chunk in flight),
 *     READY, FAILED, or FREE (consumed, or a slot past a short batch);
 *   - chunks: one ranged GET each, covering one or more entries of one
 *     shard; a chunk's buffer is freed when its last entry is consumed and
 *     its request is done.
 * The planner (plan_more) runs in whichever thread made room: a worker that
 * consumed an entry, or reset. It never blocks.
 */
#include "fetch/fetch.h"
#include "io/remote.h"
#include "cache/cache.h"
#include "io/file.h"

#include <unistd.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_SLICE_NS 100000000ULL

enum { E_FREE = 0, E_PLANNED, E_READY, E_FAILED };

typedef struct chunk chunk;

typedef struct entry {
    uint64_t sample;
    chunk *ch;    /* ranged read, or NULL: read from the cached shard */
    uint64_t off; /* into ch->buf, or into the shard (cached) */
    uint32_t len;
    uint32_t shard;
    uint8_t state;
} entry;

/* With a disk cache: each shard's state in this process. */
enum { SH_NONE = 0, SH_DOWNLOADING, SH_RESIDENT };

typedef struct shardst {
    int fd;         /* pinned entry (shared lock) or download (exclusive) */
    uint8_t st;
    uint32_t users; /* planned entries reading it: pinned while > 0 */
    uint64_t retry_after_ns; /* admission refused (full or busy): ranged until then */
    stk__req *dl;
    char *err; /* why its last download failed (owned), or NULL */
    char key[160];
} shardst;

struct chunk {
    stk__req req;
    stk__fetch *f;
    uint8_t *buf;
    uint64_t bytes;
    unsigned refs; /* entries not yet consumed */
    bool inflight;
    uint64_t gen;
    chunk *next_all, *prev_all;
};

struct stk__fetch {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    stk__source *src;
    stk__remote *remote;
    stk__fetch_plan plan;
    stk__fetch_cfg cfg;
    bool cancel;
    uint64_t gen;

    entry *ring;
    uint64_t cap; /* power of two >= lookahead + batch_size */
    uint64_t lo, plan_seq;
    uint64_t buffered; /* bytes of live chunks */
    chunk *chunks;     /* every live chunk */

    stk__cache *cache; /* NULL: no disk cache */
    uint64_t *next;    /* per shard: next use (eviction), filled per admission */
    size_t *by_key;    /* shard indices sorted by cache key (keys in sh[k].key) */
    shardst *sh;
    size_t nshards; /* of sh (the source is closed before the stage is freed) */
    uint64_t fallbacks;

    /* stats (under lock) */
    uint64_t samples, sample_bytes, overfetch, waits, wait_ns, buffered_peak;
};

/* ---- chunks ---------------------------------------------------------------- */

static void chunk_unlink_free(stk__fetch *f, chunk *c)
{
    if (c->prev_all)
        c->prev_all->next_all = c->next_all;
    else
        f->chunks = c->next_all;
    if (c->next_all)
        c->next_all->prev_all = c->prev_all;
    f->buffered -= c->bytes;
    stk__free(c->buf);
    stk__free(c);
}

/* Drops one entry's reference; frees the chunk when nothing needs it. */
static void chunk_put(stk__fetch *f, chunk *c)
{
    if (--c->refs == 0 && !c->inflight)
        chunk_unlink_free(f, c);
}

static void on_chunk_done(stk__req *q, void *ctx)
{
    chunk *c = ctx;
    stk__fetch *f = c->f;
    pthread_mutex_lock(&f->lock);
    c->inflight = false;
    if (c->gen == f->gen) {
        for (uint64_t s = f->lo; s < f->plan_seq; s++) {
            entry *e = &f->ring[s & (f->cap - 1)];
            if (e->ch == c && e->state == E_PLANNED)
                e->state = q->rc == STK_OK ? E_READY : E_FAILED;
        }
        pthread_cond_broadcast(&f->cond);
    }
    if (c->refs == 0)
        chunk_unlink_free(f, c);
    pthread_mutex_unlock(&f->lock);
}

/* ---- the disk cache ----------------------------------------------------------- */

typedef struct dlreq {
    stk__req q;
    stk__fetch *f;
    uint32_t shard;
    uint64_t gen;
} dlreq;

static void unpin(shardst *h)
{
    if (h->st == SH_RESIDENT && h->users == 0) {
        stk__cache_unpin(h->fd);
        h->fd = -1;
        h->st = SH_NONE;
    }
}

static void on_download_done(stk__req *q, void *ctx)
{
    dlreq *d = ctx;
    stk__fetch *f = d->f;
    shardst *h = &f->sh[d->shard];
    char why[STK_ERRMSG_MAX] = "";
    const char *tag = f->src->shard_tags ? f->src->shard_tags[d->shard] : NULL;
    bool ok = q->rc == STK_OK;
    if (!ok)
        stk__fmt(why, sizeof why, "%s", q->err[0] ? q->err : "download failed");
    if (ok && q->got != f->src->shard_bytes[d->shard]) {
        stk__fmt(why, sizeof why, "the object is now %llu bytes, not the %llu it had at open",
                 (unsigned long long)q->got, (unsigned long long)f->src->shard_bytes[d->shard]);
        ok = false;
    }
    if (ok && tag && q->validator[0] && strcmp(tag, q->validator)) {
        stk__fmt(why, sizeof why, "the object changed since open (ETag/Last-Modified %s, was %s)",
                 q->validator, tag);
        ok = false;
    }
    if (ok && stk__cache_commit(f->cache, h->key, h->fd, why, sizeof why) != STK_OK) {
        ok = false;
        h->fd = -1; /* commit closed it */
    } else if (!ok) {
        /* A local write error (a full disk): the shard is not admitted, and
         * its samples are read by ranges like those of any failed download. */
        stk__cache_abort(f->cache, h->key, h->fd, q->write_errno != 0);
        h->fd = -1;
    }
    char *msg = ok ? NULL : stk__strdup(why);
    pthread_mutex_lock(&f->lock);
    h->dl = NULL;
    h->st = ok ? SH_RESIDENT : SH_NONE;
    for (uint64_t s = f->lo; s < f->plan_seq; s++) {
        entry *e = &f->ring[s & (f->cap - 1)];
        if (e->state == E_PLANNED && !e->ch && e->shard == d->shard)
            e->state = ok ? E_READY : E_FAILED;
    }
    if (!ok) {
        /* Entries waiting for it are read by ranges (stk__fetch_read), as
         * are later ones until admission is tried again. */
        h->users = 0;
        h->retry_after_ns = stk__now_ns() + 1000000000ULL;
        stk__free(h->err);
        h->err = msg; /* NULL when out of memory: a generic text then */
    }
    unpin(h);
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    stk__free(d);
}

static int cmp_key_ix_ctx(const void *a, const void *b, void *ctx)
{
    const shardst *sh = ctx;
    return strcmp(sh[*(const size_t *)a].key, sh[*(const size_t *)b].key);
}

/* The cache's eviction callback: how soon this loader reads entry `key`
 * again (Belady: the furthest goes first). Keys of other datasets, and all
 * keys under the global order, are UINT64_MAX: LRU decides among those. */
static uint64_t next_use_of(void *ctx, const char *key)
{
    stk__fetch *f = ctx;
    size_t lo = 0, hi = f->nshards;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->sh[f->by_key[mid]].key, key);
        if (!c)
            return f->next[f->by_key[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return UINT64_MAX;
}

/* Decides how entry e (sample of shard k, not yet requested) is read: from
 * the cache (true: e is planned as a cached read) or by range (false). */
static bool plan_cached(stk__fetch *f, entry *e, uint32_t k)
{
    shardst *h = &f->sh[k];
    if (h->st == SH_NONE) {
        uint64_t now = stk__now_ns();
        if (h->retry_after_ns > now)
            return false;
        if (stk__cache_pin(f->cache, h->key, &h->fd) == STK_OK) {
            h->st = SH_RESIDENT;
        } else {
            char why[STK_ERRMSG_MAX];
            dlreq *d = stk__calloc(1, sizeof *d);
            bool belady = f->plan.next_uses &&
                          f->plan.next_uses(f->plan.ctx, f->lo / f->plan.batch_size, f->next,
                                            f->nshards);
            int rc = d ? stk__cache_begin(f->cache, h->key, f->src->shard_bytes[k],
                                          belady ? next_use_of : NULL, f, &h->fd, why, sizeof why)
                       : STK_ENOMEM;
            if (rc) {
                stk__free(d);
                /* Full of pinned entries, or another process downloads it:
                 * read by ranges for a while, then ask again. */
                h->retry_after_ns = now + (rc == STK_EBUSY ? 50000000ULL : 500000000ULL);
                if (rc != STK_EBUSY)
                    f->fallbacks++;
                return false;
            }
            d->f = f;
            d->shard = k;
            d->q.name = f->src->shard_objs[k];
            d->q.fd = h->fd;
            d->q.done = on_download_done;
            d->q.ctx = d;
            h->dl = &d->q;
            h->st = SH_DOWNLOADING;
            stk__remote_submit(f->remote, &d->q);
        }
    }
    e->ch = NULL;
    e->shard = k;
    h->users++;
    e->state = h->st == SH_RESIDENT ? E_READY : E_PLANNED;
    return true;
}

/* ---- planning --------------------------------------------------------------- */

typedef struct pend {
    uint64_t seq, off, len;
    size_t shard;
} pend;

static int cmp_pend(const void *a, const void *b)
{
    const pend *x = a, *y = b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Issues one chunk for pends [a, b) (same shard, sorted by offset). */
static void issue(stk__fetch *f, pend *p, size_t a, size_t b)
{
    uint64_t start = p[a].off, end = p[a].off + p[a].len;
    for (size_t k = a; k < b; k++)
        if (p[k].off + p[k].len > end)
            end = p[k].off + p[k].len;
    chunk *c = stk__calloc(1, sizeof *c);
    uint8_t *buf = c ? stk__malloc(end > start ? (size_t)(end - start) : 1) : NULL;
    if (!buf) {
        stk__free(c);
        /* Out of memory: the entries fail like a failed read. */
        for (size_t k = a; k < b; k++)
            f->ring[p[k].seq & (f->cap - 1)].state = E_FAILED;
        return;
    }
    c->f = f;
    c->buf = buf;
    c->bytes = end - start;
    c->inflight = end > start;
    c->gen = f->gen;
    c->next_all = f->chunks;
    if (f->chunks)
        f->chunks->prev_all = c;
    f->chunks = c;
    f->buffered += c->bytes;
    if (f->buffered > f->buffered_peak)
        f->buffered_peak = f->buffered;
    uint64_t useful = 0;
    for (size_t k = a; k < b; k++) {
        entry *e = &f->ring[p[k].seq & (f->cap - 1)];
        e->ch = c;
        e->off = p[k].off - start;
        c->refs++;
        useful += p[k].len;
        if (end == start)
            e->state = E_READY;
    }
    if (c->bytes > useful)
        f->overfetch += c->bytes - useful;
    if (end == start)
        return;
    c->req.name = f->src->shard_objs[p[a].shard];
    c->req.off = start;
    c->req.len = end - start;
    c->req.buf = buf;
    c->req.fd = -1;
    c->req.done = on_chunk_done;
    c->req.ctx = c;
    stk__remote_submit(f->remote, &c->req);
}

/* Plans sequence numbers up to `upto` (exclusive) or until the budget or the
 * ring is full. force: plan at least up to `upto` whatever the budget.
 * Lock held. */
static void plan_more(stk__fetch *f, uint64_t upto, bool force)
{
    pend pb[64]; /* one group: requests go out in the order they are needed */
    size_t np = 0;
    uint64_t pbytes = 0;
    uint64_t B = f->plan.batch_size;
    while (!f->cancel) {
        uint64_t s = f->plan_seq;
        bool must = force && s < upto;
        if (s >= f->lo + f->cap || np == sizeof pb / sizeof *pb)
            break;
        if (!must && (s - f->lo >= f->cfg.lookahead ||
                      f->buffered + pbytes >= f->cfg.buffer_bytes))
            break;
        uint64_t g = s / B, slot = s % B;
        entry *e = &f->ring[s & (f->cap - 1)];
        memset(e, 0, sizeof *e);
        f->plan_seq++;
        if (slot >= f->plan.batch_len(f->plan.ctx, g)) {
            /* Past a short batch: skip to the next batch. */
            e->state = E_FREE;
            continue;
        }
        uint64_t i = f->plan.sample_at(f->plan.ctx, g, slot);
        size_t shard;
        uint64_t off, len;
        f->src->ops->locate(f->src, i, &shard, &off, &len);
        e->sample = i;
        e->len = (uint32_t)len;
        e->state = E_PLANNED;
        if (f->cache && plan_cached(f, e, (uint32_t)shard)) {
            e->off = off;
            continue;
        }
        e->shard = (uint32_t)shard;
        pb[np++] = (pend){s, off, len, shard};
        pbytes += len;
    }
    if (!np)
        return;
    qsort(pb, np, sizeof *pb, cmp_pend);
    size_t a = 0;
    for (size_t k = 1; k <= np; k++) {
        bool split = k == np || pb[k].shard != pb[a].shard;
        if (!split) {
            uint64_t end = pb[k - 1].off + pb[k - 1].len;
            split = pb[k].off > end + f->cfg.coalesce_gap ||
                    pb[k].off + pb[k].len - pb[a].off > f->cfg.max_request;
        }
        if (split) {
            issue(f, pb, a, k);
            a = k;
        }
    }
    /* More may fit: keep planning in bounded batches. */
    if (f->plan_seq < f->lo + f->cap && (force ? f->plan_seq < upto : true))
        plan_more(f, upto, force);
}

/* Moves lo past consumed entries. Lock held. */
static void advance_lo(stk__fetch *f)
{
    while (f->lo < f->plan_seq && f->ring[f->lo & (f->cap - 1)].state == E_FREE)
        f->lo++;
}

static int stk__pread_all(int fd, uint8_t *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = stk__pread(fd, buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            stk__fmt(err, errlen, "reading the cached shard failed at byte %llu: %s",
                     (unsigned long long)(off + got), r < 0 ? strerror(errno) : "short file");
            return STK_EIO;
        }
        got += (size_t)r;
    }
    return STK_OK;
}

/* ---- API ---------------------------------------------------------------------- */

int stk__fetch_create(stk__fetch **out, stk__source *src, const stk__fetch_plan *plan,
                      const stk__fetch_cfg *cfg, char *err, size_t errlen)
{
    *out = NULL;
    if (!src->remote || !src->ops->locate || !src->ops->accept || !src->shard_objs) {
        stk__fmt(err, errlen, "this source cannot be fetched ahead");
        return STK_EUNSUPPORTED;
    }
    stk__fetch *f = stk__calloc(1, sizeof *f);
    if (!f)
        return STK_ENOMEM;
    f->src = src;
    f->remote = src->remote;
    f->plan = *plan;
    f->cfg = *cfg;
    if (!f->cfg.buffer_bytes)
        f->cfg.buffer_bytes = 64ULL << 20;
    if (!f->cfg.coalesce_gap)
        f->cfg.coalesce_gap = 16ULL << 10;
    if (!f->cfg.max_request)
        f->cfg.max_request = 8ULL << 20;
    /* Enough samples ahead to keep every request slot busy and two batches
     * ready; more only buys over-fetch when the run stops. */
    if (!f->cfg.lookahead) {
        uint64_t la = 2 * plan->batch_size, conc = 2 * (uint64_t)f->cfg.concurrency;
        f->cfg.lookahead = la > conc ? la : conc;
        if (f->cfg.lookahead < 256)
            f->cfg.lookahead = 256;
    }
    uint64_t need = f->cfg.lookahead + plan->batch_size + 256;
    f->cap = 1;
    while (f->cap < need)
        f->cap <<= 1;
    if (pthread_mutex_init(&f->lock, NULL)) {
        stk__free(f);
        return STK_ENOMEM;
    }
    int r = stk__cond_init(&f->cond);
    if (r || !(f->ring = stk__calloc(f->cap, sizeof *f->ring))) {
        if (!r)
            pthread_cond_destroy(&f->cond);
        pthread_mutex_destroy(&f->lock);
        stk__free(f);
        return STK_ENOMEM;
    }
    if (cfg->cache_dir && *cfg->cache_dir) {
        int rc = stk__cache_open(&f->cache, cfg->cache_dir, cfg->cache_limit, err, errlen);
        if (rc == STK_OK && !(f->sh = stk__calloc(src->nshards, sizeof *f->sh)))
            rc = STK_ENOMEM;
        if (rc) {
            stk__cache_close(f->cache);
            stk__free(f->ring);
            pthread_cond_destroy(&f->cond);
            pthread_mutex_destroy(&f->lock);
            stk__free(f);
            return rc;
        }
        f->nshards = src->nshards;
        f->next = stk__calloc(src->nshards ? src->nshards : 1, sizeof *f->next);
        f->by_key = stk__calloc(src->nshards ? src->nshards : 1, sizeof *f->by_key);
        if (!f->next || !f->by_key) {
            stk__free(f->next);
            stk__free(f->by_key);
            stk__free(f->sh);
            stk__cache_close(f->cache);
            stk__free(f->ring);
            pthread_cond_destroy(&f->cond);
            pthread_mutex_destroy(&f->lock);
            stk__free(f);
            return STK_ENOMEM;
        }
        for (size_t k = 0; k < src->nshards; k++) {
            char where[4096];
            f->sh[k].fd = -1;
            stk__remote_object_id(f->remote, src->shard_objs[k], where, sizeof where);
            stk__cache_key(where, src->shard_bytes[k], src->shard_tags ? src->shard_tags[k] : NULL,
                           f->sh[k].key, sizeof f->sh[k].key);
            f->by_key[k] = k;
        }
        qsort_r(f->by_key, src->nshards, sizeof *f->by_key, cmp_key_ix_ctx, f->sh);
    }
    *out = f;
    return STK_OK;
}

void stk__fetch_cancel(stk__fetch *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    f->cancel = true;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

void stk__fetch_destroy(stk__fetch *f)
{
    if (!f)
        return;
    /* The store was closed first (stk__fetch_destroy's contract): it
     * completed every request, so no chunk is in flight any more. */
    while (f->chunks)
        chunk_unlink_free(f, f->chunks);
    for (size_t k = 0; f->sh && k < f->nshards; k++) {
        if (f->sh[k].st == SH_RESIDENT)
            stk__cache_unpin(f->sh[k].fd);
        stk__free(f->sh[k].err);
    }
    stk__free(f->sh);
    stk__free(f->next);
    stk__free(f->by_key);
    stk__cache_close(f->cache);
    stk__free(f->ring);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    stk__free(f);
}

void stk__fetch_reset(stk__fetch *f, uint64_t g)
{
    pthread_mutex_lock(&f->lock);
    for (uint64_t s = f->lo; s < f->plan_seq; s++) {
        entry *e = &f->ring[s & (f->cap - 1)];
        if (e->state != E_FREE && e->ch)
            chunk_put(f, e->ch);
        else if (e->state != E_FREE && f->cache && f->sh[e->shard].users) {
            f->sh[e->shard].users--;
            unpin(&f->sh[e->shard]);
        }
        memset(e, 0, sizeof *e);
    }
    f->gen++;
    f->lo = f->plan_seq = g * f->plan.batch_size;
    plan_more(f, 0, false);
    pthread_mutex_unlock(&f->lock);
}

int stk__fetch_read(stk__fetch *f, uint64_t g, uint64_t slot, uint64_t i, stk__sink *sink,
                    uint8_t **data, size_t *len, int64_t *label, char *err, size_t errlen)
{
    uint64_t seq = g * f->plan.batch_size + slot;
    pthread_mutex_lock(&f->lock);
    if (seq < f->lo || seq >= f->lo + f->cap) {
        /* Not in the window (cannot happen in order; be safe): read directly. */
        pthread_mutex_unlock(&f->lock);
        return f->src->ops->read(f->src, i, sink, data, len, label, err, errlen);
    }
    if (seq >= f->plan_seq)
        plan_more(f, seq + 1, true);
    entry *e = &f->ring[seq & (f->cap - 1)];
    if (e->sample != i || e->state == E_FREE) {
        pthread_mutex_unlock(&f->lock);
        return f->src->ops->read(f->src, i, sink, data, len, label, err, errlen);
    }
    if (e->state == E_PLANNED) {
        uint64_t t0 = stk__now_ns();
        f->waits++;
        while (e->state == E_PLANNED && !f->cancel) {
            stk__cond_wait_ns(&f->cond, &f->lock, WAIT_SLICE_NS);
        }
        f->wait_ns += stk__now_ns() - t0;
    }
    int rc = STK_OK;
    chunk *c = e->ch;
    int cfd = -1;
    uint32_t shard = e->shard;
    bool cached = f->cache && !c && e->state != E_FAILED;
    /* A sample planned from a shard whose download failed (or that the disk
     * refused) is read by range instead: the shard was not admitted. */
    bool by_range = f->cache && !c && e->state == E_FAILED;
    char dlwhy[STK_ERRMSG_MAX] = "";
    if (e->state == E_PLANNED) {
        stk__fmt(err, errlen, "cancelled: the loader is closing");
        rc = STK_EIO;
    } else if (by_range) {
        const char *w = f->sh[shard].err;
        stk__fmt(dlwhy, sizeof dlwhy, "%s", w ? w : "download failed");
    } else if (e->state == E_FAILED) {
        stk__fmt(err, errlen, "%s", c && c->req.err[0] ? c->req.err : "fetch failed");
        rc = c && c->req.rc == STK_ENOMEM ? STK_ENOMEM : STK_EIO;
    }
    bool release = cached || rc != STK_OK || by_range;
    if (cached && rc == STK_OK)
        cfd = f->sh[shard].fd; /* pinned: stays open while users > 0 */
    uint64_t off = e->off;
    uint32_t n = e->len;
    e->state = E_FREE;
    e->ch = NULL;
    advance_lo(f);
    pthread_mutex_unlock(&f->lock);

    /* The chunk stays alive: this entry still holds its reference. The copy
     * and the checksum run outside the lock, in parallel across workers. */
    uint8_t *buf = NULL;
    if (rc == STK_OK) {
        buf = stk__sink_reserve(sink, n, &rc);
        if (!buf) {
            if (rc == STK_ETOOBIG)
                stk__fmt(err, errlen, "sample of %u bytes does not fit its %zu-byte budget", n,
                         sink->grow ? sink->grow->limit : sink->cap);
            else
                stk__fmt(err, errlen, "out of memory for %u bytes", n);
        } else {
            if (by_range)
                ; /* read below */
            else if (cfd >= 0)
                rc = stk__pread_all(cfd, buf, n, off, err, errlen);
            else if (n)
                memcpy(buf, c->buf + off, n);
            if (rc == STK_OK && !by_range) {
                rc = f->src->ops->accept(f->src, i, buf, n, label, err, errlen);
                if (rc == STK_EFORMAT && cfd >= 0) {
                    /* The cached copy is corrupt (a bad disk, a copy cut by
                     * power loss): drop it so the shard is downloaded again,
                     * and fetch this sample from the store once more. */
                    stk__cache_drop(f->cache, f->sh[shard].key, cfd);
                    stk__fmt(dlwhy, sizeof dlwhy, "the cached shard failed its checksum (%s)", err);
                    by_range = true;
                }
            }
            if (by_range) {
                size_t rn = 0;
                uint8_t *rb = NULL;
                rc = f->src->ops->read(f->src, i, sink, &rb, &rn, label, err, errlen);
                if (rc == STK_OK) {
                    buf = rb;
                    n = (uint32_t)rn;
                } else {
                    char tmp[STK_ERRMSG_MAX];
                    stk__fmt(tmp, sizeof tmp, "%s", err);
                    stk__fmt(err, errlen, "%s; reading the sample by range failed too: %s", dlwhy,
                             tmp);
                }
            }
        }
    }
    pthread_mutex_lock(&f->lock);
    if (c)
        chunk_put(f, c);
    else if (f->cache && f->sh[shard].users && release) {
        f->sh[shard].users--;
        unpin(&f->sh[shard]);
    }
    if (rc == STK_OK) {
        f->samples++;
        f->sample_bytes += n;
    }
    plan_more(f, 0, false);
    pthread_mutex_unlock(&f->lock);
    if (rc == STK_OK) {
        *data = buf;
        *len = n;
    }
    return rc;
}

void stk__fetch_stats_get(stk__fetch *f, stk__fetch_stats *st)
{
    memset(st, 0, sizeof *st);
    stk__remote_counters rc;
    stk__remote_counters_get(f->remote, &rc);
    st->requests = rc.requests;
    st->retries = rc.retries;
    st->failures = rc.failures;
    st->bytes = rc.bytes;
    st->inflight = rc.inflight;
    st->inflight_peak = rc.inflight_peak;
    st->io_busy_ns = rc.busy_ns;
    st->completed = rc.completed;
    st->request_ns = rc.request_ns;
    st->first_byte_ns = rc.first_byte_ns;
    pthread_mutex_lock(&f->lock);
    st->samples = f->samples;
    st->sample_bytes = f->sample_bytes;
    st->overfetch_bytes = f->overfetch;
    st->waits = f->waits;
    st->wait_ns = f->wait_ns;
    st->buffered = f->buffered;
    st->buffered_peak = f->buffered_peak;
    st->cache_fallbacks = f->fallbacks;
    pthread_mutex_unlock(&f->lock);
    if (f->cache) {
        stk__cache_stats cs;
        stk__cache_stats_get(f->cache, &cs);
        st->cache_hits = cs.hits;
        st->cache_misses = cs.misses;
        st->cache_evictions = cs.evictions;
        st->cache_bytes = cs.bytes;
        st->cache_write_errors = cs.write_errors;
        st->cache_dropped = cs.dropped;
    }
}

uint64_t stk__fetch_memory_bound(const stk__fetch *f)
{
    /* The budget, plus what forced planning may add (threads x a claim run
     * of the largest sample), plus a request's worth of merging slack, the
     * ring and the chunk headers. */
    uint64_t maxs = f->src->max_len ? f->src->max_len : (1u << 20);
    uint64_t forced = (uint64_t)(f->cfg.threads ? f->cfg.threads : 1) * 16 * maxs;
    uint64_t chunks = f->cap * (sizeof(chunk) + 64);
    return f->cfg.buffer_bytes + f->cfg.max_request + forced + f->cap * sizeof(entry) + chunks +
           sizeof *f;
}
