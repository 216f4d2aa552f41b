/*
 * fetch.c -- the fetch stage (see fetch.h).
 *
 * State, all under f->lock:
 *   - a ring of `cap` entries indexed by seq % cap, covering the planned
 *     window [lo, plan_seq); an entry is LIVE (it holds a reference to the
 *     chunk its bytes come from), FAILED (no chunk: out of memory while
 *     planning) or FREE (consumed, or a slot past a short batch);
 *   - chunks, each the source of one or more entries' bytes: a ranged GET
 *     into memory (one shard, neighbouring samples merged), or, with a disk
 *     cache, one admission of a whole shard to the cache (a download into the
 *     cache, or a pinned complete entry). A chunk's state (in flight, ready,
 *     failed) is the state of all its entries, so a completion is O(1): it
 *     sets the chunk's state and wakes the waiters. A chunk is freed (its
 *     buffer, or its pin) when no entry references it and its request is
 *     done; an entry always releases the chunk it references, never "the
 *     shard's current one", so a shard admitted again after a failed
 *     download cannot lose the new admission's pin to the old entries.
 * With a disk cache, a sample whose shard is not usable from the cache is
 * read by a ranged request of its own (read_alone): when the shard's
 * download failed (the store's error, a local write error such as a full
 * disk, an object whose size or ETag/Last-Modified changed since open), and
 * when the cached copy fails the sample's checksum (the entry is then
 * dropped from the cache, and the chunk's other entries read by range too).
 * A failed sample's error starts with its own shard's reason (the chunk's).
 * The planner (plan_more) runs in whichever thread made room: a worker that
 * consumed an entry, or reset. It never blocks, and it only queues the
 * requests it creates: they are submitted after the lock is dropped
 * (unlock_and_submit), because the store may complete a request at once (out
 * of memory), running its callback, which takes this lock. Likewise a cache
 * admission is only decided there (the chunk is C_ADMIT, and queued): the
 * reservation (stk__cache_begin: the directory's flock, a scan, evictions,
 * fallocate) is I/O, made by one worker at a time with no lock held
 * (admit_pending), never by a seek, which holds the loader's lock.
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

/* E_LOCAL: a sample the source does not fetch (locate's shard SIZE_MAX: a
 * mixture's sample of a local child), read by the source's read op when
 * reached; planned only to keep the ring's order. */
enum { E_FREE = 0, E_LIVE, E_FAILED, E_LOCAL };
/* C_ADMIT: a cache admission decided under the lock, its reservation
 * (stk__cache_begin: directory lock, scan, evictions, fallocate) not yet
 * made; entries wait on it as on a download. */
enum { C_INFLIGHT = 0, C_READY, C_FAILED, C_ADMIT };
enum { K_RANGE = 0, K_CACHE };

typedef struct chunk chunk;

/* A shard's download into the cache (cold cache) is split into parts of
 * stk__fetch_part_bytes (8 MiB), each a ranged GET of its own writing at its place in the
 * cache file, PART_SLOTS of them in flight per shard: one connection's
 * bandwidth (an object store gives one ~100 MB/s) no longer bounds how fast
 * a shard fills, and the parts start in the order the epoch first needs
 * their samples. A part is readable once done (or, in flight, up to its
 * own high-water mark). */
#define PART_SLOTS 8u
uint64_t stk__fetch_part_bytes = 8ull << 20;
enum { P_IDLE = 0, P_INFLIGHT, P_DONE };

/* One part's state: need, the order in which the planner first wanted a
 * sample of it (0: not yet); rank, its place in that order within its shard
 * (which parts an admission starts first). */
typedef struct dlpart {
    uint64_t need;
    uint32_t rank;
    uint8_t st, slot; /* slot: its request while P_INFLIGHT */
} dlpart;

/* A request slot of a download: the part it fetches now. */
typedef struct dlslot {
    stk__req req;
    chunk *c;
    uint32_t part;
    bool busy;
    uint64_t t0;                /* when the part was submitted (ns) */
    struct dlslot *next_submit; /* the planner's queue of parts to submit */
} dlslot;

typedef struct entry {
    uint64_t sample;
    chunk *ch;    /* LIVE: the chunk holding (or fetching) the bytes */
    uint64_t off; /* into ch->buf (ranged), or into the shard (cached) */
    uint32_t len;
    uint8_t state;
} entry;

/* With a disk cache: the shard's current admission, which later entries
 * join (downloading or resident), or NULL. */
typedef struct shardst {
    chunk *cur;
    uint64_t retry_after_ns; /* admission refused or failed: ranged until then */
    char key[160];
} shardst;

struct chunk {
    stk__req req;
    stk__fetch *f;
    uint8_t *buf; /* K_RANGE: the bytes of the range */
    int fd;       /* K_CACHE: the download (exclusive lock), then the pin; -1 */
    uint32_t shard;
    uint8_t kind, state;
    bool inflight;  /* submitted (or queued for submission) and not completed */
    bool dropped;   /* K_CACHE: the entry failed a checksum and was dropped from the
                     * cache; the chunk's entries read their samples by range */
    unsigned refs;  /* entries referencing it */
    uint64_t bytes; /* buffered (K_RANGE) */
    chunk *next_all, *prev_all;
    chunk *next_submit; /* the planner's queue of requests to submit */
    chunk *next_admit;  /* the planner's queue of admissions to make */
    int admit_rc;       /* stk__cache_begin's result (the admitter's, off the lock) */
    uint64_t start;     /* K_RANGE: the shard offset of buf[0] */
    uint64_t useful;    /* block chunks: bytes of the samples planned from it */
    size_t block;       /* block chunks: its block; SIZE_MAX for other chunks */
    /* K_CACHE downloads in flight (cold cache): samples in parts done, or
     * below a part's high-water mark, are read from the file being written.
     * `partial` counts such reads under way (their pread uses fd without the
     * lock); `finishing`, set by the completion before it commits or aborts
     * the file (which closes or re-locks fd), stops new ones, and the
     * completion waits for `partial` to drain. */
    unsigned partial;
    bool finishing;
    unsigned hwm_waiters; /* entries waiting for the high-water mark */
    uint64_t dl_t0;       /* when the download was submitted (ns) */
    /* K_CACHE downloads: the parts (nparts of part_bytes; one part, the
     * whole object, when the shard's size is unknown), their request slots,
     * how many are done and in flight, and whether one failed for good (no
     * more start; the download fails when the others end). */
    dlpart *parts;
    dlslot *slots;
    uint64_t part_bytes;
    uint32_t nparts, parts_done, stamped;
    unsigned parts_busy;
    bool dl_failed;
    uint64_t t_queued; /* block chunks: when its request was queued (ns) */
};

struct stk__fetch {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    stk__source *src;
    stk__remote *remote;  /* the source's store; NULL with src->shard_remote */
    stk__remote **stores; /* every distinct store (stats, the memory bound) */
    size_t nstores;
    stk__fetch_plan plan;
    stk__fetch_cfg cfg;
    bool cancel;
    bool interrupt; /* a seek is coming: waits end until the next reset */

    entry *ring;
    uint64_t cap; /* power of two >= lookahead + batch_size */
    uint64_t lo, plan_seq;
    uint64_t buffered;             /* bytes of live chunks */
    chunk *chunks;                 /* every live chunk */
    chunk *pending, *pending_tail; /* planned requests not yet submitted */
    chunk *admit, *admit_tail;     /* planned admissions not yet made (C_ADMIT) */
    bool admitter;                 /* a thread makes admissions (off the lock) */
    dlslot *ppend, *ppend_tail;    /* download parts not yet submitted */
    uint64_t need_seq;             /* the last part "need" stamp */
    double part_rate;              /* bytes/ns of one part's request (moving mean) */

    stk__cache *cache; /* NULL: no disk cache */
    uint64_t *next;    /* per shard: next use (eviction), filled per admission */
    size_t *by_key;    /* shard indices sorted by cache key (keys in sh[k].key) */
    shardst *sh;
    size_t nshards; /* of sh (the source is closed before the stage is freed) */
    uint64_t fallbacks;
    chunk **blk;        /* order "blocks": per block, its live whole-block chunk or NULL */
    uint64_t block_max; /* the largest block's bytes */
    /* Order "blocks" with the default budget: the budget follows the measured
     * rate and latency (block_budget), up to cfg.buffer_bytes. */
    bool blk_auto;
    unsigned window;     /* blocks per window of the order */
    uint64_t blk_lat_ns; /* moving mean of a block request's time, queued to done */
    size_t blk_live;     /* block chunks alive (buffered or in flight) */
    uint64_t blk_target; /* the most block chunks alive now (block_budget) */
    uint64_t t_reset, sb_reset, wait_reset; /* at the last reset: time, sample_bytes, wait_ns */

    /* stats (under lock) */
    uint64_t samples, sample_bytes, overfetch, waits, wait_ns, buffered_peak;
    uint64_t partial_reads, cold_ranged, dl_parts;
};

/* ---- chunks ---------------------------------------------------------------- */

/* The store shard k is read from: its own (a mixture's children each have
 * theirs), else the source's. */
static stk__remote *store_of(const stk__fetch *f, size_t k)
{
    return f->src->shard_remote ? f->src->shard_remote[k] : f->remote;
}

static chunk *chunk_new(stk__fetch *f, uint8_t kind, uint32_t shard)
{
    chunk *c = stk__calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->f = f;
    c->fd = -1;
    c->block = SIZE_MAX;
    c->kind = kind;
    c->shard = shard;
    c->next_all = f->chunks;
    if (f->chunks)
        f->chunks->prev_all = c;
    f->chunks = c;
    return c;
}

/* Frees a chunk no entry references and no request uses. Lock held. */
static void chunk_free(stk__fetch *f, chunk *c)
{
    if (c->prev_all)
        c->prev_all->next_all = c->next_all;
    else
        f->chunks = c->next_all;
    if (c->next_all)
        c->next_all->prev_all = c->prev_all;
    f->buffered -= c->bytes;
    if (c->block != SIZE_MAX) {
        f->blk_live--;
        if (f->blk[c->block] == c)
            f->blk[c->block] = NULL;
        /* A block's samples that were never planned (another rank's, or
         * left when a seek dropped the plan) were fetched for nothing. */
        if (c->bytes > c->useful)
            f->overfetch += c->bytes - c->useful;
    }
    if (c->kind == K_CACHE) {
        if (f->sh[c->shard].cur == c)
            f->sh[c->shard].cur = NULL;
        if (c->state == C_READY && c->fd >= 0)
            stk__cache_unpin(c->fd);
    }
    stk__free(c->parts);
    stk__free(c->slots);
    stk__free(c->buf);
    stk__free(c);
}

/* Drops one entry's reference; frees the chunk when nothing needs it. */
static void chunk_put(stk__fetch *f, chunk *c)
{
    if (--c->refs == 0 && !c->inflight)
        chunk_free(f, c);
}

/* Queues c's request for submit_pending. Lock held. */
static void queue_submit(stk__fetch *f, chunk *c)
{
    c->inflight = true;
    c->next_submit = NULL;
    if (f->pending_tail)
        f->pending_tail->next_submit = c;
    else
        f->pending = c;
    f->pending_tail = c;
}

static void admit_pending(stk__fetch *f);

/* Unlocks f and submits the requests the planner queued, in order. A
 * queued chunk stays alive until its completion (inflight), which cannot
 * come before its submission, so the list is safe to walk unlocked.
 * admit: first make the queued cache admissions (admit_pending: the lock is
 * dropped around their I/O); false for a caller that holds the loader's lock
 * (a seek), whose admissions a worker makes. */
static void unlock_and_submit_ex(stk__fetch *f, bool admit)
{
    if (admit)
        admit_pending(f);
    chunk *c = f->pending;
    f->pending = f->pending_tail = NULL;
    dlslot *sl = f->ppend;
    f->ppend = f->ppend_tail = NULL;
    pthread_mutex_unlock(&f->lock);
    while (c) {
        chunk *n = c->next_submit; /* c may be freed by its completion */
        stk__remote_submit(store_of(f, c->shard), &c->req);
        c = n;
    }
    /* A download's chunk lives until its last part ends, and a part's slot
     * is reused only after its completion: both outlive the submission. */
    while (sl) {
        dlslot *n = sl->next_submit;
        stk__remote_submit(store_of(f, sl->c->shard), &sl->req);
        sl = n;
    }
}

static void unlock_and_submit(stk__fetch *f)
{
    unlock_and_submit_ex(f, true);
}

/* Still waiting for its bytes: admitting or downloading. */
static bool busy(const chunk *c)
{
    return c->state == C_INFLIGHT || c->state == C_ADMIT;
}

static void on_chunk_done(stk__req *q, void *ctx)
{
    chunk *c = ctx;
    stk__fetch *f = c->f;
    pthread_mutex_lock(&f->lock);
    /* A shard opened from the consolidated index (stk.c) has its size
     * first seen here: a shard replaced since the pack fails by name. */
    uint64_t want = f->src->shard_bytes ? f->src->shard_bytes[c->shard] : 0;
    bool ok = q->rc == STK_OK;
    if (ok && q->total && want && q->total != want) {
        stk__fmt(q->err, sizeof q->err,
                 "the shard is now %llu bytes, not the %llu it had when the dataset was opened "
                 "(replaced since the pack?)",
                 (unsigned long long)q->total, (unsigned long long)want);
        ok = false;
    }
    c->inflight = false;
    c->state = ok ? C_READY : C_FAILED;
    if (ok && c->t_queued) {
        /* A block's time from its planning to its last byte: the latency the
         * block budget must cover (a moving mean over about 8 blocks). */
        uint64_t lat = stk__now_ns() - c->t_queued;
        f->blk_lat_ns = f->blk_lat_ns ? (7 * f->blk_lat_ns + lat) / 8 : lat;
    }
    pthread_cond_broadcast(&f->cond);
    if (c->refs == 0)
        chunk_free(f, c);
    pthread_mutex_unlock(&f->lock);
}

/* ---- the disk cache ----------------------------------------------------------- */

/* A part's high-water mark moved (I/O thread): entries waiting for bytes
 * below it can read them from the file being written. */
static void on_download_progress(stk__req *q, void *ctx)
{
    (void)q;
    dlslot *sl = ctx;
    chunk *c = sl->c;
    stk__fetch *f = c->f;
    pthread_mutex_lock(&f->lock);
    if (c->hwm_waiters)
        pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

/* Bytes of part i that hold shard bytes [.., end): its own bytes up to end
 * (a sample may span parts; each covers its share). */
static uint64_t part_need(const chunk *c, uint32_t i, uint64_t end)
{
    uint64_t po = (uint64_t)i * c->part_bytes;
    return end - po < c->part_bytes ? end - po : c->part_bytes;
}

/* Whether shard bytes [off, end) of a download in flight can be read from
 * its file now: every part holding them done, or in flight with its
 * high-water mark past them. Lock held. */
static bool partial_ok(const chunk *c, uint64_t off, uint64_t end)
{
    if (c->kind != K_CACHE || c->state != C_INFLIGHT || c->finishing || !c->parts)
        return false;
    for (uint64_t i = off / c->part_bytes; i < c->nparts && i * c->part_bytes < end; i++) {
        const dlpart *p = &c->parts[i];
        if (p->st == P_DONE)
            continue;
        if (p->st != P_INFLIGHT ||
            atomic_load_explicit(&c->slots[p->slot].req.written, memory_order_acquire) <
                part_need(c, (uint32_t)i, end))
            return false;
    }
    return true;
}

/* Sets up the parts of download c (lock held); false when out of memory. */
static bool parts_alloc(stk__fetch *f, chunk *c)
{
    uint64_t size = f->src->shard_bytes[c->shard];
    uint64_t pb = stk__fetch_part_bytes ? stk__fetch_part_bytes : 1;
    uint64_t n = size ? (size + pb - 1) / pb : 1;
    if (n > UINT32_MAX)
        return false;
    c->parts = stk__calloc((size_t)n, sizeof *c->parts);
    c->slots = stk__calloc(PART_SLOTS, sizeof *c->slots);
    c->nparts = (uint32_t)n;
    c->part_bytes = size ? pb : UINT64_MAX / 2;
    return c->parts && c->slots;
}

static void on_part_done(stk__req *q, void *ctx);

/* Starts parts of download c into its free slots (lock held; queued for
 * unlock_and_submit): the idle part the planner needed first, else the
 * first idle one in the file. None after a part failed for good. */
static void start_parts(stk__fetch *f, chunk *c)
{
    uint64_t size = f->src->shard_bytes[c->shard];
    while (c->parts_busy < PART_SLOTS && !c->dl_failed) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < c->nparts; i++) {
            const dlpart *p = &c->parts[i];
            if (p->st != P_IDLE)
                continue;
            if (best == UINT32_MAX ||
                (p->need && (!c->parts[best].need || p->need < c->parts[best].need)))
                best = i;
        }
        if (best == UINT32_MAX)
            break;
        unsigned s = 0;
        while (c->slots[s].busy)
            s++;
        dlslot *sl = &c->slots[s];
        uint64_t po = (uint64_t)best * c->part_bytes;
        /* The slot's last request has completed (its callback is the one
         * running, if any, and touches it no more): it is reused. Its mark
         * is cleared here, under the lock, before the part is marked in
         * flight, so no reader sees the last part's mark as this one's. */
        memset(&sl->req, 0, sizeof sl->req);
        sl->req.name = f->src->shard_objs[c->shard];
        sl->req.off = po;
        sl->req.len = size ? (size - po < c->part_bytes ? size - po : c->part_bytes) : 0;
        sl->req.fd = c->fd;
        sl->req.done = on_part_done;
        sl->req.progress = on_download_progress;
        sl->req.ctx = sl;
        atomic_store_explicit(&sl->req.written, 0, memory_order_relaxed);
        sl->c = c;
        sl->part = best;
        sl->busy = true;
        sl->t0 = stk__now_ns();
        c->parts[best].st = P_INFLIGHT;
        c->parts[best].slot = (uint8_t)s;
        c->parts_busy++;
        f->dl_parts++;
        sl->next_submit = NULL;
        if (f->ppend_tail)
            f->ppend_tail->next_submit = sl;
        else
            f->ppend = sl;
        f->ppend_tail = sl;
    }
}

/* The last part of download c ended (I/O thread, no lock held): commits the
 * cache file when every part is done, else aborts it; the chunk becomes
 * READY or FAILED. */
static void download_finish(stk__fetch *f, chunk *c)
{
    /* Readers of the file in progress finish before it is committed (which
     * re-locks it) or aborted (which closes it); none start after. */
    pthread_mutex_lock(&f->lock);
    c->finishing = true;
    while (c->partial)
        pthread_cond_wait(&f->cond, &f->lock);
    bool ok = !c->dl_failed && c->parts_done == c->nparts;
    bool werr = c->req.write_errno != 0;
    if (!ok && !c->req.err[0])
        stk__fmt(c->req.err, sizeof c->req.err, "cancelled: the loader is closing");
    pthread_mutex_unlock(&f->lock);
    const shardst *h = &f->sh[c->shard]; /* key: immutable after create */
    char why[STK_ERRMSG_MAX] = "";
    /* Committing renames and re-locks a file: outside the stage's lock. The
     * fd is the chunk's alone until its state says otherwise. */
    if (ok && stk__cache_commit(f->cache, h->key, c->fd, why, sizeof why) != STK_OK) {
        ok = false;
        c->fd = -1; /* commit closed it */
    } else if (!ok) {
        /* A local write error (a full disk) is counted by the cache: the
         * shard is not admitted, its samples are read by ranges like those
         * of any failed download. */
        stk__cache_abort(f->cache, h->key, c->fd, werr);
        c->fd = -1;
    }
    pthread_mutex_lock(&f->lock);
    /* The chunk's request holds its own shard's reason: its entries report
     * it, not the last failed download of any shard. */
    if (why[0])
        stk__fmt(c->req.err, sizeof c->req.err, "%s", why);
    c->inflight = false;
    c->state = ok ? C_READY : C_FAILED;
    if (!ok) {
        if (!c->req.rc)
            c->req.rc = STK_EIO;
        /* The download used up its retries. Its entries read their samples
         * by range (stk__fetch_read), and so do later ones for a while: the
         * shard is admitted again only after retry_after. */
        if (f->sh[c->shard].cur == c)
            f->sh[c->shard].cur = NULL;
        f->sh[c->shard].retry_after_ns = stk__now_ns() + 1000000000ULL;
        f->fallbacks++;
    }
    pthread_cond_broadcast(&f->cond);
    if (c->refs == 0)
        chunk_free(f, c);
    pthread_mutex_unlock(&f->lock);
}

/* Why part q of download c is not the object opened (its size or
 * ETag/Last-Modified changed since open, or between parts), into why; ""
 * when it is. Lock held. */
static void part_check(stk__fetch *f, chunk *c, const stk__req *q, char *why, size_t n)
{
    const char *tag = f->src->shard_tags ? f->src->shard_tags[c->shard] : NULL;
    uint64_t want = f->src->shard_bytes[c->shard];
    uint64_t size = q->len ? q->total : q->got;
    why[0] = '\0';
    if ((q->len && q->total && q->total != want) || (!q->len && q->got != want))
        stk__fmt(why, n, "the object is now %llu bytes, not the %llu it had at open",
                 (unsigned long long)size, (unsigned long long)want);
    else if (tag && q->validator[0] && strcmp(tag, q->validator))
        stk__fmt(why, n, "the object changed since open (ETag/Last-Modified %s, was %s)",
                 q->validator, tag);
    else if (q->validator[0] && c->req.validator[0] && strcmp(c->req.validator, q->validator))
        stk__fmt(why, n, "the object changed during its download (ETag/Last-Modified %s, then %s)",
                 c->req.validator, q->validator);
    else if (q->validator[0] && !c->req.validator[0])
        stk__fmt(c->req.validator, sizeof c->req.validator, "%s", q->validator);
}

/* A part's request ended (I/O thread): the part is done, or the download
 * fails (the engine already retried it; the other parts end first). Starts
 * the next part; the last to end finishes the download. */
static void on_part_done(stk__req *q, void *ctx)
{
    dlslot *sl = ctx;
    chunk *c = sl->c;
    stk__fetch *f = c->f;
    char why[STK_ERRMSG_MAX] = "";
    pthread_mutex_lock(&f->lock);
    dlpart *p = &c->parts[sl->part];
    if (q->rc == STK_OK)
        part_check(f, c, q, why, sizeof why);
    if (q->rc == STK_OK && !why[0]) {
        p->st = P_DONE;
        c->parts_done++;
        double el = (double)(stk__now_ns() - sl->t0);
        if (el > 0 && q->got) {
            double r = (double)q->got / el;
            f->part_rate = f->part_rate > 0 ? (3 * f->part_rate + r) / 4 : r;
        }
    } else {
        p->st = P_IDLE;
        /* A write error (a full disk) is counted by the cache whichever
         * part saw it, even after another part failed on the network. */
        if (q->write_errno)
            c->req.write_errno = q->write_errno;
        if (!c->dl_failed) {
            c->dl_failed = true;
            c->req.rc = q->rc ? q->rc : STK_EIO;
            stk__fmt(c->req.err, sizeof c->req.err, "%s", why[0] ? why : q->err);
        }
    }
    sl->busy = false;
    c->parts_busy--;
    /* q is not touched after this: start_parts may reuse its slot. After
     * cancel no part starts (the store is about to end them all). */
    if (!f->cancel)
        start_parts(f, c);
    pthread_cond_broadcast(&f->cond);
    if (c->parts_busy == 0) {
        pthread_mutex_unlock(&f->lock);
        download_finish(f, c);
        return;
    }
    unlock_and_submit_ex(f, false);
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

/* How far ahead of a sample's read its entry is planned, for the guess
 * below: the default lookahead is a few hundred samples, well under this
 * at the rates a remote dataset is read. */
#define PLAN_HORIZON_NS 100000000ULL
/* Bytes past the high-water mark a download is trusted to cover before a
 * planned read with no rate measured yet: one request's worth of a
 * typical sample run. */
#define PARTIAL_SLACK (256u << 10)

/* Cold cache: whether a planned read of a shard's bytes [off, end) should
 * wait for the shard's download (admitting or in flight) rather than fetch
 * its sample by range. It waits when every part holding the bytes is done,
 * or will be past them within the planning horizon at the rate it has shown
 * (a part in flight), or at the rate parts have shown (a part an admission
 * will start first). A part not yet started is marked needed, so that it
 * starts before the parts no planned sample needs yet; its sample, unless
 * near the front of a part starting now, is fetched by range at once, so the
 * first batches of a cold epoch do not wait for whole parts. Lock held. */
static bool join_download(stk__fetch *f, chunk *c, uint64_t off, uint64_t end)
{
    if (c->state != C_ADMIT && c->state != C_INFLIGHT)
        return true;
    if (!c->parts || c->dl_failed)
        return false; /* failing: its samples go by range */
    uint64_t now = stk__now_ns();
    uint64_t ahead = (uint64_t)(f->part_rate * (double)PLAN_HORIZON_NS);
    bool join = true;
    for (uint64_t i = off / c->part_bytes; i < c->nparts && i * c->part_bytes < end; i++) {
        dlpart *p = &c->parts[i];
        uint64_t need = part_need(c, (uint32_t)i, end);
        if (p->st == P_DONE)
            continue;
        if (p->st == P_INFLIGHT) {
            const dlslot *sl = &c->slots[p->slot];
            uint64_t w = atomic_load_explicit(&sl->req.written, memory_order_acquire);
            uint64_t el = now - sl->t0, slack = ahead;
            if (el > 20000000ULL && w)
                slack = (uint64_t)((double)w * (double)PLAN_HORIZON_NS / (double)el);
            join &= need <= w + PARTIAL_SLACK + slack;
            continue;
        }
        if (!p->need) {
            p->need = ++f->need_seq;
            p->rank = c->stamped++;
        }
        join &= c->state == C_ADMIT && p->rank < PART_SLOTS && need <= PARTIAL_SLACK + ahead;
    }
    return join;
}

/* Decides how entry e (sample of shard k at bytes [off, off + e->len), not
 * yet requested) is read: from the cache (true: e references the shard's
 * admission, resident, downloading or being admitted) or by range (false). */
static bool plan_cached(stk__fetch *f, entry *e, uint32_t k, uint64_t off)
{
    shardst *h = &f->sh[k];
    chunk *c = h->cur;
    if (!c) {
        uint64_t now = stk__now_ns();
        if (h->retry_after_ns > now)
            return false;
        int fd = -1;
        if (stk__cache_pin(f->cache, h->key, &fd) == STK_OK) {
            if (!(c = chunk_new(f, K_CACHE, k))) {
                stk__cache_unpin(fd);
                return false; /* read by range (which may fail the same way) */
            }
            c->fd = fd;
            c->state = C_READY;
        } else {
            if (!(c = chunk_new(f, K_CACHE, k)) || !parts_alloc(f, c)) {
                if (c)
                    chunk_free(f, c);
                h->retry_after_ns = now + 500000000ULL;
                f->fallbacks++;
                return false;
            }
            /* The reservation is I/O (the directory's lock, a scan,
             * evictions, fallocate): queued, made by admit_pending off the
             * lock. Until then the chunk is C_ADMIT, and held (inflight). */
            c->state = C_ADMIT;
            c->inflight = true;
            if (f->admit_tail)
                f->admit_tail->next_admit = c;
            else
                f->admit = c;
            f->admit_tail = c;
        }
        h->cur = c;
    }
    if (!join_download(f, c, off, off + e->len)) {
        f->cold_ranged++;
        return false;
    }
    e->ch = c;
    c->refs++;
    e->state = E_LIVE;
    return true;
}

/* Installs admission c's result (lock held): a reservation starts its
 * download (queued for submission); a refusal fails the chunk, whose
 * entries read their samples by range, and so do later ones for a while.
 * A reset meanwhile only dropped entries: a reservation is downloaded all
 * the same (the shard is cached for later); the chunk is freed when nothing
 * needs it. */
static void admit_install(stk__fetch *f, chunk *c)
{
    shardst *h = &f->sh[c->shard];
    int rc = c->admit_rc;
    if (rc == STK_OK) {
        c->state = C_INFLIGHT;
        c->dl_t0 = stk__now_ns();
        start_parts(f, c);
        return;
    }
    c->fd = -1;
    c->inflight = false;
    c->state = C_FAILED;
    c->req.rc = rc == STK_ENOMEM ? STK_ENOMEM : STK_EIO;
    if (!c->req.err[0])
        stk__fmt(c->req.err, sizeof c->req.err, "%s",
                 rc == STK_EBUSY ? "another process is downloading the shard into the cache"
                                 : "the shard could not be admitted to the cache");
    if (h->cur == c)
        h->cur = NULL;
    /* Full of pinned entries, or another process downloads it: read by
     * ranges for a while, then ask again. Cancelled by a seek: ask again at
     * once. */
    if (rc == STK_ECANCELED)
        h->retry_after_ns = 0;
    else
        h->retry_after_ns = stk__now_ns() + (rc == STK_EBUSY ? 50000000ULL : 500000000ULL);
    if (rc != STK_EBUSY && rc != STK_ECANCELED)
        f->fallbacks++;
    if (c->refs == 0)
        chunk_free(f, c);
}

/* Makes the queued cache admissions (lock held on entry and on return; it
 * is dropped around the reservations' I/O, so that no thread waits on the
 * stage's lock while another waits on the disk or on another process's
 * directory lock). One thread at a time is the admitter: it takes the whole
 * queue, decides the eviction order (f->next, which only the admitter
 * writes and the cache's callback reads), reserves off the lock, retakes it
 * and installs the results, until the queue is empty. Others return at once;
 * their entries wait on C_ADMIT like on a download. A chunk being admitted
 * is inflight, so a reset meanwhile cannot free it. After cancel nothing
 * more is admitted: the chunks left are freed with the stage. */
static void admit_pending(stk__fetch *f)
{
    while (f->admit && !f->admitter && !f->cancel) {
        chunk *list = f->admit;
        f->admit = f->admit_tail = NULL;
        f->admitter = true;
        bool belady =
            f->plan.next_uses &&
            f->plan.next_uses(f->plan.ctx, f->lo / f->plan.batch_size, f->next, f->nshards);
        pthread_mutex_unlock(&f->lock);
        /* The chunks are the admitter's alone until installed: their fd,
         * admit_rc and req.err are read by others only in a later state. */
        for (chunk *c = list; c; c = c->next_admit)
            c->admit_rc = stk__cache_begin(
                f->cache, f->sh[c->shard].key, f->src->shard_bytes[c->shard],
                belady ? next_use_of : NULL, f, &c->fd, c->req.err, sizeof c->req.err);
        pthread_mutex_lock(&f->lock);
        for (chunk *c = list, *n; c; c = n) {
            n = c->next_admit;
            admit_install(f, c);
        }
        f->admitter = false;
        pthread_cond_broadcast(&f->cond);
    }
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

/* A ranged chunk for bytes [start, end) of shard k, its request queued
 * (none for an empty range: ready at once). NULL when out of memory. Lock
 * held. */
static chunk *range_chunk(stk__fetch *f, size_t k, uint64_t start, uint64_t end)
{
    uint8_t *buf = stk__malloc(end > start ? (size_t)(end - start) : 1);
    chunk *c = buf ? chunk_new(f, K_RANGE, (uint32_t)k) : NULL;
    if (!c) {
        stk__free(buf);
        return NULL;
    }
    c->buf = buf;
    c->start = start;
    c->bytes = end - start;
    c->state = end > start ? C_INFLIGHT : C_READY;
    f->buffered += c->bytes;
    if (f->buffered > f->buffered_peak)
        f->buffered_peak = f->buffered;
    if (end > start) {
        c->req.name = f->src->shard_objs[k];
        c->req.off = start;
        c->req.len = end - start;
        c->req.buf = buf;
        c->req.fd = -1;
        c->req.done = on_chunk_done;
        c->req.ctx = c;
        queue_submit(f, c);
    }
    return c;
}

/* The block holding sample i (order "blocks"). */
static size_t block_of(const stk__fetch *f, uint64_t i)
{
    return stk__run_of(f->cfg.block_first, f->cfg.nblocks, i);
}

/* Order "blocks": entry e (sample i at [off, off + len) of shard k) takes
 * its bytes from its block's chunk, fetched whole by one request when no
 * live one holds it. False when out of memory (the entry is then read on
 * its own). Lock held. */
static bool plan_block(stk__fetch *f, entry *e, uint64_t i, size_t k, uint64_t off, uint64_t len)
{
    size_t b = block_of(f, i);
    chunk *c = f->blk[b];
    if (c && c->state == C_FAILED) {
        f->blk[b] = NULL; /* a failed fetch: the next entries ask again */
        c = NULL;
    }
    if (!c) {
        size_t shard;
        uint64_t o0, l0, o1, l1;
        f->src->ops->locate(f->src, f->cfg.block_first[b], &shard, &o0, &l0);
        f->src->ops->locate(f->src, f->cfg.block_first[b + 1] - 1, &shard, &o1, &l1);
        if (!(c = range_chunk(f, k, o0, o1 + l1)))
            return false;
        c->block = b;
        c->t_queued = stk__now_ns();
        f->blk_live++;
        f->blk[b] = c;
    }
    e->ch = c;
    e->off = off - c->start;
    e->state = E_LIVE;
    c->refs++;
    c->useful += len;
    return true;
}

/* The block order's budget when the user gave none. A window's samples are
 * shuffled among its blocks, so every block of the window being consumed is
 * read from until near the window's end, and the next window's blocks are
 * all needed at its start. The blocks of window w - 1 are freed as window w
 * starts: only then is there room for window w + k, with k the whole windows
 * ahead that the budget holds, and it has k windows' time to arrive before
 * it is read. So the budget, counted in blocks alive (a byte count would let
 * one more block in, as blocks are mostly under block_max), is the window
 * being read and `ahead` windows, with ahead windows of consumption covering a block's
 * latency (a bandwidth-delay product in whole windows): ahead =
 * ceil(margin x rate x latency / window bytes), at least 1, from the rate
 * the workers consume bytes when they are not waiting for the network and
 * the measured time of a block request, queued to last byte. Before anything
 * is measured, ahead = 1. The bytes stay under cfg.buffer_bytes (the
 * memory bound counts it) as for any order. Lock held. */
static uint64_t block_budget(stk__fetch *f)
{
    uint64_t win = (uint64_t)f->window * f->block_max, ahead = 1;
    uint64_t el = stk__now_ns() - f->t_reset;
    uint64_t waited = (f->wait_ns - f->wait_reset) / (f->cfg.threads ? f->cfg.threads : 1);
    if (f->blk_lat_ns && win && el > waited + 50000000ULL && f->sample_bytes > f->sb_reset) {
        double rate = (double)(f->sample_bytes - f->sb_reset) / ((double)(el - waited) * 1e-9);
        /* The next window has one window's time (win / rate) to arrive: a
         * latency beyond that (with a margin of 1.5 for its spread) needs
         * whole windows more. */
        double need = 1.5 * rate * (double)f->blk_lat_ns * 1e-9 - (double)win;
        if (need > 0)
            ahead += (uint64_t)(need / (double)win) + 1;
    }
    return (uint64_t)f->window * (1 + ahead);
}

/* Plans one chunk for pends [a, b) (same shard, sorted by offset). */
static void issue(stk__fetch *f, pend *p, size_t a, size_t b)
{
    uint64_t start = p[a].off, end = p[a].off + p[a].len;
    for (size_t k = a; k < b; k++)
        if (p[k].off + p[k].len > end)
            end = p[k].off + p[k].len;
    chunk *c = range_chunk(f, p[a].shard, start, end);
    if (!c) {
        /* Out of memory: the entries are read on their own when reached. */
        for (size_t k = a; k < b; k++)
            f->ring[p[k].seq & (f->cap - 1)].state = E_FAILED;
        return;
    }
    uint64_t useful = 0;
    for (size_t k = a; k < b; k++) {
        entry *e = &f->ring[p[k].seq & (f->cap - 1)];
        e->ch = c;
        e->off = p[k].off - start;
        e->state = E_LIVE;
        c->refs++;
        useful += p[k].len;
    }
    if (c->bytes > useful)
        f->overfetch += c->bytes - useful;
}

/* Plans sequence numbers up to `upto` (exclusive) or until the budget or the
 * ring is full. force: plan at least up to `upto` whatever the budget.
 * Groups of at most 64 ranged entries are merged into requests one group at
 * a time, in a loop (a lookahead of millions of samples must not grow the
 * stack). Lock held; the requests are queued, the caller submits them. */
static void plan_more(stk__fetch *f, uint64_t upto, bool force)
{
    pend pb[64]; /* one group: requests go out in the order they are needed */
    uint64_t B = f->plan.batch_size;
    f->blk_target = f->blk_auto ? block_budget(f) : UINT64_MAX;
    bool full = true;
    while (full) {
        size_t np = 0;
        uint64_t pbytes = 0;
        full = false;
        while (!f->cancel) {
            uint64_t s = f->plan_seq;
            bool must = force && s < upto;
            if (s >= f->lo + f->cap)
                break;
            if (np == sizeof pb / sizeof *pb) {
                full = true;
                break;
            }
            if (!must &&
                (s - f->lo >= f->cfg.lookahead || f->buffered + pbytes >= f->cfg.buffer_bytes))
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
            /* Whether this shard may go to the disk cache (a mixture's
             * source may keep out of it: shard_nocache). */
            bool cached = f->cache && !(shard != SIZE_MAX && f->src->shard_nocache &&
                                        f->src->shard_nocache[shard]);
            if (!must && shard != SIZE_MAX && !cached && f->blk_live >= f->blk_target &&
                !f->blk[block_of(f, i)]) {
                /* The block budget is full and this sample needs a block not
                 * alive: planned when one is freed. Samples of live blocks
                 * are not held back by the count (only the bytes bound), so
                 * a window whose blocks are all alive is planned whole. */
                f->plan_seq--;
                memset(e, 0, sizeof *e);
                break;
            }
            e->sample = i;
            e->len = (uint32_t)len;
            if (shard == SIZE_MAX) {
                e->state = E_LOCAL; /* read by the source when reached */
                continue;
            }
            if (cached && plan_cached(f, e, (uint32_t)shard, off)) {
                e->off = off;
                continue;
            }
            if (f->blk) {
                if (!plan_block(f, e, i, shard, off, len))
                    e->state = E_FAILED;
                continue;
            }
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
    }
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

/* Order "blocks": the blocks per window and the largest block's bytes. */
static void blocks_measure(const stk__source *src, const stk__fetch_cfg *cfg, unsigned *window,
                           uint64_t *block_max)
{
    *window = cfg->block_window ? cfg->block_window : 8;
    if (*window > cfg->nblocks)
        *window = (unsigned)cfg->nblocks;
    *block_max = 0;
    for (size_t b = 0; b < cfg->nblocks; b++) {
        size_t shard;
        uint64_t o0, l0, o1, l1;
        src->ops->locate(src, cfg->block_first[b], &shard, &o0, &l0);
        src->ops->locate(src, cfg->block_first[b + 1] - 1, &shard, &o1, &l1);
        if (o1 + l1 - o0 > *block_max)
            *block_max = o1 + l1 - o0;
    }
}

/* Whether cfg gets the block order's default budget (block_budget): blocks,
 * no buffer_bytes given, and no mixture (shard_remote), which reads a
 * window of each source's blocks at once and keeps the byte budget. */
static bool blocks_auto(const stk__source *src, const stk__fetch_cfg *cfg)
{
    return cfg->block_first && cfg->nblocks && src->ops->locate && !cfg->buffer_bytes &&
           !src->shard_remote;
}

/* The block order's default budget: up to three windows and two blocks, so
 * that the next window is fetched while one is read, and a second one when
 * the latency needs it; at least the 64 MiB of any order. */
static uint64_t blocks_default_bytes(unsigned window, uint64_t block_max)
{
    uint64_t want = (3 * (uint64_t)window + 2) * block_max;
    return want > (64ULL << 20) ? want : 64ULL << 20;
}

/* Order "blocks": the window, the largest block, and the default budget
 * (block_budget). */
static void blocks_setup(stk__fetch *f, const stk__source *src, const stk__fetch_cfg *cfg)
{
    blocks_measure(src, cfg, &f->window, &f->block_max);
    if (blocks_auto(src, cfg)) {
        f->blk_auto = true;
        f->cfg.buffer_bytes = blocks_default_bytes(f->window, f->block_max);
    }
}

/* The stage's sizes (create; stk__fetch_bound): cfg with its defaults, the
 * lookahead, the blocks and the ring's capacity. */
static void fetch_size(stk__fetch *f, const stk__source *src, const stk__fetch_plan *plan,
                       const stk__fetch_cfg *cfg)
{
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
        if (f->cfg.lookahead > STK_FETCH_LOOKAHEAD_MAX)
            f->cfg.lookahead = STK_FETCH_LOOKAHEAD_MAX;
    }
    if (cfg->block_first && cfg->nblocks)
        blocks_setup(f, src, cfg);
    if (cfg->block_first && !cfg->lookahead) {
        /* Blocks: plan as far as the buffer holds, so that a window's blocks
         * are fetched while its first samples are decoded. */
        uint64_t total = 0;
        for (size_t k = 0; src->shard_bytes && k < src->nshards; k++)
            total += src->shard_bytes[k];
        uint64_t mean = src->count && total ? total / src->count : 0;
        uint64_t la = mean ? f->cfg.buffer_bytes / mean : 0;
        if (la > f->cfg.lookahead)
            f->cfg.lookahead = la < STK_FETCH_LOOKAHEAD_MAX ? la : STK_FETCH_LOOKAHEAD_MAX;
    }
    uint64_t need = f->cfg.lookahead + plan->batch_size + 256;
    f->cap = 1;
    while (f->cap < need)
        f->cap <<= 1;
}

/* ---- API ---------------------------------------------------------------------- */

int stk__fetch_create(stk__fetch **out, stk__source *src, const stk__fetch_plan *plan,
                      const stk__fetch_cfg *cfg, char *err, size_t errlen)
{
    *out = NULL;
    if ((!src->remote && !src->shard_remote) || !src->ops->locate || !src->ops->accept ||
        !src->shard_objs) {
        stk__fmt(err, errlen, "this source cannot be fetched ahead");
        return STK_EUNSUPPORTED;
    }
    if (cfg->lookahead > STK_FETCH_LOOKAHEAD_MAX) {
        stk__fmt(err, errlen, "fetch_lookahead %llu is more than %llu samples",
                 (unsigned long long)cfg->lookahead, (unsigned long long)STK_FETCH_LOOKAHEAD_MAX);
        return STK_EINVAL;
    }
    stk__fetch *f = stk__calloc(1, sizeof *f);
    if (!f)
        return STK_ENOMEM;
    f->src = src;
    f->remote = src->remote;
    /* The distinct stores (one, or a mixture's remote children's: each
     * child's shards are consecutive in the table, so a store is new when
     * it is not the last one's). */
    if (!(f->stores = stk__calloc(src->shard_remote ? src->nshards : 1, sizeof *f->stores))) {
        stk__free(f);
        return STK_ENOMEM;
    }
    for (size_t k = 0; k < (src->shard_remote ? src->nshards : 1); k++) {
        stk__remote *r = src->shard_remote ? src->shard_remote[k] : src->remote;
        if (r && (!f->nstores || f->stores[f->nstores - 1] != r))
            f->stores[f->nstores++] = r;
    }
    fetch_size(f, src, plan, cfg);
    if (pthread_mutex_init(&f->lock, NULL)) {
        stk__free(f->stores);
        stk__free(f);
        return STK_ENOMEM;
    }
    int r = stk__cond_init(&f->cond);
    if (r || !(f->ring = stk__calloc(f->cap, sizeof *f->ring))) {
        if (!r)
            pthread_cond_destroy(&f->cond);
        pthread_mutex_destroy(&f->lock);
        stk__free(f->stores);
        stk__free(f);
        return STK_ENOMEM;
    }
    if (cfg->block_first) {
        if (!(f->blk = stk__calloc(cfg->nblocks ? cfg->nblocks : 1, sizeof *f->blk))) {
            stk__free(f->ring);
            pthread_cond_destroy(&f->cond);
            pthread_mutex_destroy(&f->lock);
            stk__free(f->stores);
            stk__free(f);
            return STK_ENOMEM;
        }
        /* The largest block (block_max, above) is the slack a block request
         * adds to the budget. */
    }
    if (cfg->cache_dir && *cfg->cache_dir) {
        int rc = stk__cache_open(&f->cache, cfg->cache_dir, cfg->cache_limit, err, errlen);
        if (rc == STK_OK && !(f->sh = stk__calloc(src->nshards, sizeof *f->sh)))
            rc = STK_ENOMEM;
        if (rc) {
            stk__cache_close(f->cache);
            stk__free(f->ring);
            stk__free(f->blk);
            pthread_cond_destroy(&f->cond);
            pthread_mutex_destroy(&f->lock);
            stk__free(f->stores);
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
            stk__free(f->blk);
            pthread_cond_destroy(&f->cond);
            pthread_mutex_destroy(&f->lock);
            stk__free(f->stores);
            stk__free(f);
            return STK_ENOMEM;
        }
        for (size_t k = 0; k < src->nshards; k++) {
            char where[4096];
            stk__remote_object_id(store_of(f, k), src->shard_objs[k], where, sizeof where);
            const char *tag = src->shard_tags ? src->shard_tags[k] : NULL;
            if (!tag && src->shard_ids)
                tag = src->shard_ids[k]; /* no ETag known: the shard's content */
            stk__cache_key(where, src->shard_bytes[k], tag, f->sh[k].key, sizeof f->sh[k].key);
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
    stk__cache_cancel(f->cache, true); /* an admission waiting on the directory */
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

void stk__fetch_interrupt(stk__fetch *f)
{
    pthread_mutex_lock(&f->lock);
    f->interrupt = true;
    stk__cache_cancel(f->cache, true);
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

void stk__fetch_destroy(stk__fetch *f)
{
    if (!f)
        return;
    /* The store was closed first (stk__fetch_destroy's contract): it
     * completed every request, so no chunk is in flight any more; freeing a
     * cached shard's chunk releases its pin. */
    while (f->chunks)
        chunk_free(f, f->chunks);
    stk__free(f->sh);
    stk__free(f->next);
    stk__free(f->by_key);
    stk__cache_close(f->cache);
    stk__free(f->ring);
    stk__free(f->blk);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    stk__free(f->stores);
    stk__free(f);
}

void stk__fetch_reset(stk__fetch *f, uint64_t g)
{
    pthread_mutex_lock(&f->lock);
    for (uint64_t s = f->lo; s < f->plan_seq; s++) {
        entry *e = &f->ring[s & (f->cap - 1)];
        if (e->state == E_LIVE)
            chunk_put(f, e->ch);
        memset(e, 0, sizeof *e);
    }
    f->lo = f->plan_seq = g * f->plan.batch_size;
    f->interrupt = false;
    f->t_reset = stk__now_ns();
    f->sb_reset = f->sample_bytes;
    f->wait_reset = f->wait_ns;
    if (!f->cancel)
        stk__cache_cancel(f->cache, false);
    plan_more(f, 0, false);
    /* A seek holds the loader's lock: the admissions it planned are made by
     * the workers (stk__fetch_read), not here. */
    unlock_and_submit_ex(f, false);
}

/* Waits for chunk c's request (lock held), re-checking cancel and interrupt
 * every slice so that close and seeks are prompt whatever the network does. */
static void wait_chunk(stk__fetch *f, chunk *c)
{
    if (!busy(c))
        return;
    uint64_t t0 = stk__now_ns();
    f->waits++;
    while (busy(c) && !f->cancel && !f->interrupt)
        stk__cond_wait_ns(&f->cond, &f->lock, WAIT_SLICE_NS);
    f->wait_ns += stk__now_ns() - t0;
}

/* Waits for a planned entry's bytes [.., end) of chunk c: the chunk done, or
 * (a download into the cache) the parts holding bytes [off, end) written. Lock held. */
static void wait_entry(stk__fetch *f, chunk *c, uint64_t off, uint64_t end)
{
    if (!busy(c) || partial_ok(c, off, end))
        return;
    uint64_t t0 = stk__now_ns();
    f->waits++;
    c->hwm_waiters++;
    while (busy(c) && !partial_ok(c, off, end) && !f->cancel && !f->interrupt)
        stk__cond_wait_ns(&f->cond, &f->lock, WAIT_SLICE_NS);
    c->hwm_waiters--;
    f->wait_ns += stk__now_ns() - t0;
}

/* Copies sample i's n bytes (from buf, or from the cached shard fd at off)
 * into the sink and checks them. No lock held. */
static int deliver(stk__fetch *f, uint64_t i, stk__sink *sink, const uint8_t *src, int fd,
                   uint64_t off, uint32_t n, uint8_t **out, int64_t *label, char *err,
                   size_t errlen)
{
    int rc;
    uint8_t *buf = stk__sink_reserve(sink, n, &rc);
    if (!buf) {
        if (rc == STK_ETOOBIG)
            stk__fmt(err, errlen, "sample of %u bytes does not fit its %zu-byte budget", n,
                     sink->grow ? sink->grow->limit : sink->cap);
        else
            stk__fmt(err, errlen, "out of memory for %u bytes", n);
        return rc;
    }
    if (fd >= 0)
        rc = stk__pread_all(fd, buf, n, off, err, errlen);
    else if (n)
        memcpy(buf, src + off, n);
    if (rc == STK_OK)
        rc = f->src->ops->accept(f->src, i, buf, n, label, err, errlen);
    if (rc == STK_OK)
        *out = buf;
    return rc;
}

/* Reads sample i by a ranged request of its own, waited for like a planned
 * one (cancel re-checked), for a sample the plan does not hold or whose
 * planned read failed for a reason that is not the sample's. Only when even
 * that request cannot be set up for want of memory does it fall back to the
 * source's own (blocking) read. A sample the source does not fetch (E_LOCAL)
 * is read by the source (*local set). No lock held. */
static int read_alone(stk__fetch *f, uint64_t i, stk__sink *sink, uint8_t **data, uint32_t *len,
                      int64_t *label, bool *local, char *err, size_t errlen)
{
    size_t shard;
    uint64_t off, n;
    f->src->ops->locate(f->src, i, &shard, &off, &n);
    if (shard == SIZE_MAX) { /* not fetched: the source reads it */
        *local = true;
        size_t got = 0;
        int rc = f->src->ops->read(f->src, i, sink, data, &got, label, err, errlen);
        *len = (uint32_t)got;
        return rc;
    }
    pthread_mutex_lock(&f->lock);
    chunk *c = range_chunk(f, shard, off, off + n);
    if (c)
        c->refs = 1;
    unlock_and_submit(f);
    int rc = STK_OK;
    if (c) {
        pthread_mutex_lock(&f->lock);
        wait_chunk(f, c);
        if (c->state == C_INFLIGHT) {
            stk__fmt(err, errlen,
                     f->cancel ? "cancelled: the loader is closing"
                               : "interrupted: the loader is seeking");
            rc = STK_EIO;
        } else if (c->state == C_FAILED && c->req.rc != STK_ENOMEM) {
            stk__fmt(err, errlen, "%s", c->req.err[0] ? c->req.err : "fetch failed");
            rc = STK_EIO;
        } else if (c->state == C_FAILED) {
            rc = STK_ENOMEM;
        }
        pthread_mutex_unlock(&f->lock);
    }
    if (!c || rc == STK_ENOMEM) {
        size_t got = 0;
        rc = f->src->ops->read(f->src, i, sink, data, &got, label, err, errlen);
        *len = (uint32_t)got;
    } else if (rc == STK_OK) {
        rc = deliver(f, i, sink, c->buf, -1, 0, (uint32_t)n, data, label, err, errlen);
        *len = (uint32_t)n;
    }
    if (c) {
        pthread_mutex_lock(&f->lock);
        chunk_put(f, c);
        pthread_mutex_unlock(&f->lock);
    }
    return rc;
}

int stk__fetch_read(stk__fetch *f, uint64_t g, uint64_t slot, uint64_t i, stk__sink *sink,
                    uint8_t **data, size_t *len, int64_t *label, char *err, size_t errlen)
{
    uint64_t seq = g * f->plan.batch_size + slot;
    pthread_mutex_lock(&f->lock);
    entry *e = NULL;
    /* Outside the window cannot happen in order; be safe. */
    if (seq >= f->lo && seq < f->lo + f->cap) {
        if (seq >= f->plan_seq)
            plan_more(f, seq + 1, true);
        e = &f->ring[seq & (f->cap - 1)];
        if (e->sample != i || e->state == E_FREE)
            e = NULL;
    }
    int rc = STK_OK;
    int cfd = -1;
    bool alone = !e;
    chunk *c = NULL;
    /* Why a planned sample is read on its own by range (a failed download of
     * its shard, a dropped cache entry): the prefix of its error if that
     * read fails too. */
    char why[STK_ERRMSG_MAX] = "";
    uint64_t off = 0;
    uint32_t n = 0;
    bool partial = false; /* read from a download in progress */
    bool local = false;   /* not fetched: read by the source (E_LOCAL) */
    if (e) {
        c = e->state == E_LIVE ? e->ch : NULL;
        uint64_t end = c && c->kind == K_CACHE ? e->off + e->len : 0;
        if (c && busy(c) && !partial_ok(c, e->off, end) &&
            (f->pending || (f->admit && !f->admitter))) {
            /* The requests this thread planned go out before it waits, and
             * admissions no thread is making are made (a seek's). */
            unlock_and_submit(f);
            pthread_mutex_lock(&f->lock);
        }
        if (c)
            wait_entry(f, c, e->off, end);
        if (!c || (c->state == C_FAILED && c->req.rc == STK_ENOMEM)) {
            /* Reading ahead ran out of memory (planning, or the request):
             * that is no fault of the sample; it is read on its own. */
            alone = true;
        } else if (partial_ok(c, e->off, end)) {
            /* Its bytes are in the file being downloaded: read them there
             * (checked by checksum like any cached read). The completion
             * waits for this read before it commits or closes the file. */
            cfd = c->fd;
            c->partial++;
            partial = true;
        } else if (busy(c)) {
            stk__fmt(err, errlen,
                     f->cancel ? "cancelled: the loader is closing"
                               : "interrupted: the loader is seeking");
            rc = STK_EIO;
        } else if (c->state == C_FAILED && c->kind == K_CACHE) {
            /* The shard's download into the cache failed: its samples are
             * read by range, which may well work (a failed whole-object GET,
             * a local write error, an object of another size or version); if
             * it fails too, the sample's error names both reasons, its own
             * shard's download first. */
            alone = true;
            stk__fmt(why, sizeof why, "%s", c->req.err[0] ? c->req.err : "download failed");
        } else if (c->state == C_FAILED) {
            stk__fmt(err, errlen, "%s", c->req.err[0] ? c->req.err : "fetch failed");
            rc = STK_EIO;
        } else if (c->kind == K_CACHE && c->dropped) {
            /* Another sample found this cached copy corrupt. */
            alone = true;
            stk__fmt(why, sizeof why, "%s", c->req.err);
        } else if (c->kind == K_CACHE) {
            cfd = c->fd; /* pinned: stays open while this entry references c */
        }
        off = e->off;
        n = e->len;
        memset(e, 0, sizeof *e);
        advance_lo(f);
    }
    unlock_and_submit(f);

    /* The chunk stays alive: this entry's reference is dropped below. The
     * copy and the checksum run outside the lock, in parallel across
     * workers. */
    uint8_t *buf = NULL;
    if (!alone && rc == STK_OK) {
        rc = deliver(f, i, sink, c->buf, cfd, off, n, &buf, label, err, errlen);
        if (partial) {
            pthread_mutex_lock(&f->lock);
            if (--c->partial == 0 && c->finishing)
                pthread_cond_broadcast(&f->cond);
            if (rc == STK_OK)
                f->partial_reads++;
            pthread_mutex_unlock(&f->lock);
        }
        if (rc == STK_EFORMAT && partial) {
            /* Bytes of a download in progress failed their checksum: the
             * object changed under an attempt (the download will fail and
             * the shard is not cached). Nothing is dropped; the sample is
             * read by range. */
            stk__fmt(why, sizeof why, "read while its shard downloaded: %s", err);
            alone = true;
        } else if (rc == STK_EFORMAT && cfd >= 0) {
            /* The cached copy is corrupt (a bad disk, a copy cut by power
             * loss): drop it from the cache, so that the shard's next
             * admission downloads it again, and read this sample, and the
             * chunk's other entries, by range. The pin stays until the
             * chunk's last entry goes. */
            stk__cache_drop(f->cache, f->sh[c->shard].key, cfd);
            stk__fmt(why, sizeof why, "the cached shard failed its checksum (%s)", err);
            pthread_mutex_lock(&f->lock);
            if (!c->dropped) {
                c->dropped = true;
                stk__fmt(c->req.err, sizeof c->req.err, "%s", why);
            }
            pthread_mutex_unlock(&f->lock);
            alone = true;
        }
    }
    if (alone) {
        rc = read_alone(f, i, sink, &buf, &n, label, &local, err, errlen);
        if (rc != STK_OK && why[0]) {
            char tmp[STK_ERRMSG_MAX];
            stk__fmt(tmp, sizeof tmp, "%s", err);
            stk__fmt(err, errlen, "%s; reading the sample by range failed too: %s", why, tmp);
        }
    }
    pthread_mutex_lock(&f->lock);
    if (c)
        chunk_put(f, c);
    if (rc == STK_OK && !local) {
        f->samples++;
        f->sample_bytes += n;
    }
    plan_more(f, 0, false);
    unlock_and_submit(f);
    if (rc == STK_OK) {
        *data = buf;
        *len = n;
    }
    return rc;
}

void stk__fetch_stats_get(stk__fetch *f, stk__fetch_stats *st)
{
    memset(st, 0, sizeof *st);
    /* Summed over the stores (a mixture's remote children have one each):
     * the peak of requests in flight is then the sum of each store's peak,
     * a bound on the peak of them all; the rate, the governors' rates
     * together (0, none, when any store has none). */
    bool unlimited = false;
    for (size_t k = 0; k < f->nstores; k++) {
        stk__remote_counters rc;
        stk__remote_counters_get(f->stores[k], &rc);
        st->requests += rc.requests;
        st->retries += rc.retries;
        st->failures += rc.failures;
        st->bytes += rc.bytes;
        st->inflight += rc.inflight;
        st->inflight_peak += rc.inflight_peak;
        st->io_busy_ns += rc.busy_ns;
        st->completed += rc.completed;
        st->request_ns += rc.request_ns;
        st->first_byte_ns += rc.first_byte_ns;
        st->throttled += rc.throttled;
        unlimited |= rc.rate == 0;
        st->rate += rc.rate;
        st->hedges += rc.hedges;
        st->hedge_wins += rc.hedge_wins;
    }
    if (unlimited)
        st->rate = 0;
    pthread_mutex_lock(&f->lock);
    st->samples = f->samples;
    st->sample_bytes = f->sample_bytes;
    st->overfetch_bytes = f->overfetch;
    st->waits = f->waits;
    st->wait_ns = f->wait_ns;
    st->buffered = f->buffered;
    st->buffered_peak = f->buffered_peak;
    st->cache_fallbacks = f->fallbacks;
    st->cache_partial_reads = f->partial_reads;
    st->cache_cold_ranged = f->cold_ranged;
    st->cache_download_parts = f->dl_parts;
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

/* The bytes a hedge may duplicate: a request's slack per hedge slot of each
 * store (a mixture's children's shards are consecutive: a store is new when
 * it is not the last one's). */
static uint64_t hedge_bytes(const stk__source *src, uint64_t slack)
{
    uint64_t h = 0;
    const stk__remote *last = NULL;
    for (size_t k = 0; k < (src->shard_remote ? src->nshards : 1); k++) {
        const stk__remote *r = src->shard_remote ? src->shard_remote[k] : src->remote;
        if (r && r != last) {
            h += (uint64_t)stk__remote_hedge_slots(r) * slack;
            last = r;
        }
    }
    return h;
}

/* The peak bytes of a stage sized as f (fetch_size) over src. */
static uint64_t bound_of(const stk__fetch *f, const stk__source *src)
{
    /* The budget, plus what forced planning may add (threads x a claim run
     * of the largest sample), plus a request's worth of merging slack, the
     * ring and the chunk headers. */
    uint64_t maxs = src->max_len ? src->max_len : (1u << 20);
    uint64_t forced = (uint64_t)(f->cfg.threads ? f->cfg.threads : 1) * 16 * maxs;
    uint64_t chunks = f->cap * (sizeof(chunk) + 64);
    uint64_t slack = f->block_max > f->cfg.max_request ? f->block_max : f->cfg.max_request;
    /* A hedged request (io/remote.c) receives into a copy of its buffer. */
    uint64_t hedges = hedge_bytes(src, slack);
    return f->cfg.buffer_bytes + slack + hedges + forced + f->cap * sizeof(entry) + chunks +
           f->cfg.nblocks * sizeof *f->blk + sizeof *f;
}

uint64_t stk__fetch_memory_bound(const stk__fetch *f)
{
    return bound_of(f, f->src);
}

uint64_t stk__fetch_bound(const stk__source *src, const stk__fetch_plan *plan,
                          const stk__fetch_cfg *cfg)
{
    stk__fetch f;
    memset(&f, 0, sizeof f);
    fetch_size(&f, src, plan, cfg);
    return bound_of(&f, src);
}
