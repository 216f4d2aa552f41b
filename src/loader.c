/*
 * loader.c -- the engine: a fixed pool of worker threads fills a ring of
 * depth + 1 batch buffers (`nbufs`): `depth` batches prepared ahead of the one
 * the consumer holds. One consumer takes complete batches strictly in order.
 *
 * Batches are numbered globally, g = epoch * batches_per_epoch + b, so work
 * flows across epoch boundaries without a bubble. Workers claim small runs of
 * sample slots in order: the claim cursor (claim_g, claim_slot) only moves
 * forward, and a batch gets a ring buffer when the cursor first reaches it,
 * provided a buffer is free and the batch is less than `nbufs` ahead of the
 * consumer. Batches [deliver_g, assigned_end_g) own buffers, indexed by
 * g % nbufs in `inflight`; the consumer takes deliver_g once all its slots are
 * filled. A delivered buffer is HELD until stk_batch_release() frees it.
 *
 * Every sample's output depends only on (seed, epoch, sample index), never on
 * which thread made it or when, so batches are bit-identical for any thread
 * count and depth.
 *
 * Lifetime: the shared `core` is reference-counted by the loader handle and by
 * each held batch, so batches stay valid after stk_loader_close().
 */
#include "device/stage.h"
#include "fetch/fetch.h"
#include "image.h"
#include "internal.h"
#include "options.h"
#include "order.h"
#include "source/dataset.h"
#include "io/remote.h"
#include "trace/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEPT_ERRORS 1024         /* per epoch: the first failures in sample order */
#define NAME_MAX_BYTES  1024         /* a failed sample's path or key as reported */
#define RAISED_MAX      64           /* raised sample failures the user has not reached */
#define NSTAGES         2            /* stages counted by the workers: read, process */
#define WAIT_SLICE_NS   100000000ULL /* waits wake this often to re-check cancel */

enum { BUF_FREE, BUF_FILLING, BUF_HELD, BUF_RELEASING };

typedef struct slot_err {
    struct slot_err *next;
    size_t slot;
    uint64_t sample;
    int code;
    char *name;
    char *reason;
} slot_err;

/* A batch's failure reported under the raise policy (STK_ESAMPLE): the
 * lowest slot's, kept in structure for stk_loader_last_error until the user
 * reaches the batch at position g. With a device the copy thread reports
 * ahead of the user, so several may wait. */
typedef struct raised {
    uint64_t g, sample, epoch, nfailed;
    int code;     /* the sample's STK_E* code */
    bool known;   /* false: the batch's report was lost (out of memory) */
    char *path;   /* owned; NULL when its copy failed */
    char *reason; /* owned; NULL when its copy failed */
} raised;

typedef struct core core;

/* A batch the user holds, in the table of held batches (see "Held
 * batches" below). */
typedef struct held {
    struct held *next; /* in its bucket, or in its core's spare list */
    const stk_batch *view;
    pid_t pid;           /* the process it was handed to */
    struct held **spare; /* device batches: the list the node goes back to */
} held;

typedef struct buffer {
    stk_batch view; /* first member: stk_batch_release() casts back */
    held hnode;     /* while the user holds it */
    core *core;
    int state;
    uint64_t g;
    size_t size, filled, failed;
    uint8_t *data;
    uint64_t *offsets, *lengths;
    int32_t *dims;
    int64_t *labels;
    uint64_t *indices;
    uint8_t *ok;
    slot_err *errs;
    bool reported;
    /* Variable batches: data is an arena of batch_memory bytes of address
     * space; samples take exactly what they need from its start, in the
     * order they finish (offsets say where each is). */
    _Atomic size_t vused; /* bytes taken (CAS by the workers) */
    size_t vhigh;         /* bytes backed by memory so far (high water) */
} buffer;

typedef struct worker {
    core *core;
    unsigned id;
    pthread_t th;
    bool started;
    stk__scratch in, dec;
    /* Written by the worker, read by stats calls from the consumer: relaxed
     * atomics, since each counter is independent and only needs no tearing. */
    _Atomic uint64_t items[NSTAGES];
    _Atomic uint64_t ns[NSTAGES];
} worker;

struct core {
    pthread_mutex_t lock;
    pthread_cond_t cond_work, cond_ready, cond_idle;
    int refs;
    bool cancel, seeking;

    stk__source src;
    stk__fetch *fetch; /* remote sources: reads ahead of the workers */
    stk__partition part;
    stk__shard_orders *sorder; /* shard-aware order, or NULL: global */
    unsigned shard_window;
    stk__imgpipe *pipe;
    uint64_t seed;
    bool shuffle, drop_last;
    uint64_t transform_hash; /* resume fingerprint of the transform */
    int on_error;
    int kind, dtype;
    unsigned ndim;
    int64_t shape[4];
    size_t sample_bytes; /* dense: one sample; variable: 0 */
    size_t batch_memory; /* variable: the most one batch's samples may take */
    size_t max_sample;   /* variable: the most one sample may take (0: batch_memory) */

    unsigned depth, nbufs, nthreads; /* nbufs = depth + 1 ring buffers */
    size_t batch_size, run;
    buffer *bufs;
    buffer **inflight;
    unsigned free_count;
    uint64_t claim_g, claim_slot, deliver_g, assigned_end_g, cur_epoch;
    unsigned busy;
    worker *workers;

    uint64_t delivered_samples, delivered_batches, wait_ns, skipped, failed;
    stk_sample_error *errors; /* failures of epoch errors_epoch, in sample order */
    size_t nerrors;
    uint64_t errors_epoch;
    raised raised[RAISED_MAX]; /* oldest first */
    unsigned nraised;
    uint64_t memory_bound;
    stk__trace *trace; /* NULL: tracing off (docs/diagnosis.md) */
    /* Elastic resume: the epoch a restored state continued under another
     * world, laid out by its generations (order.h). Published with release
     * and never freed before close, since the fetch stage's planner reads it
     * without the lock; `resumed_all` keeps every one made. */
    _Atomic(struct resumed *) resumed;
    struct resumed *resumed_all;
    /* Autotune: workers with id >= active wait; the consumer's next() moves
     * active by one after windows of starvation (up) or of plenty (down). */
    bool autotune;
    unsigned active;
    uint64_t at_t0, at_b0;           /* the window's start */
    uint64_t at_blocked;             /* ns next() blocked in the window (overhead excluded) */
    unsigned at_calm;                /* consecutive windows with spare batches */
    uint64_t at_min_ahead;           /* fewest batches ready ahead seen in the window */
    /* Device stage (docs/gpu.md): with a device, the ring's buffers are the
     * device's page-locked memory, the copy thread is the ring's consumer,
     * and the user's position is where the device stage's consumer is. */
    stk__dev *dev;
    stk__devstage *dstage;
    uint64_t dev_bytes;           /* device memory of the stage */
    held *dnodes;                 /* one a device buffer: the held table's nodes */
    held *dspare;                 /* those not in the table (under g_held_lock) */
    uint64_t cons_epoch, cons_g;  /* the user's position (lock held) */
    int convert;                  /* the device converts uint8 HWC to the output */
    stk__convert cv;
    size_t out_sample_bytes;      /* one sample as delivered */
};

/* An epoch continued from a saved state under another world: its batches
 * [off, batches) of the epoch are the last generation's 0.. */
typedef struct resumed {
    stk__layout lay;
    uint64_t epoch, off;
    struct resumed *next; /* resumed_all */
} resumed;

struct stk_loader {
    core *c;
    int status; /* STK_OK, or the open error of a failed handle */
    pid_t pid;
    char errmsg[STK_ERRMSG_MAX];
    /* The last next() call's result, for stk_loader_last_error; touched only
     * by the consumer functions. */
    int last_code;
    raised last; /* last.known: has a sample (STK_ESAMPLE) */
};

/* ---- small helpers ------------------------------------------------------ */

static void free_slot_errs(slot_err *e)
{
    while (e) {
        slot_err *n = e->next;
        stk__free(e->name);
        stk__free(e->reason);
        stk__free(e);
        e = n;
    }
}

/* Empties the kept error list (its array stays for reuse). */
static void clear_errors(core *c)
{
    for (size_t k = 0; k < c->nerrors; k++) {
        stk__free((void *)(uintptr_t)c->errors[k].path);
        stk__free((void *)(uintptr_t)c->errors[k].reason);
    }
    c->nerrors = 0;
}

static void raised_free(raised *r)
{
    stk__free(r->path);
    stk__free(r->reason);
    *r = (raised){0};
}

/* Drops the raised failures of batches before position `keep_from`. Lock
 * held (or the core is being freed). */
static void raised_prune(core *c, uint64_t keep_from)
{
    unsigned n = 0;
    for (unsigned k = 0; k < c->nraised; k++) {
        if (c->raised[k].g < keep_from)
            raised_free(&c->raised[k]);
        else
            c->raised[n++] = c->raised[k];
    }
    c->nraised = n;
}

static void core_free(core *c)
{
    raised_prune(c, UINT64_MAX);
    /* The device stage first: it waits for the copies that read the ring. */
    stk__devstage_destroy(c->dstage);
    if (c->bufs) {
        for (unsigned k = 0; k < c->nbufs; k++) {
            buffer *b = &c->bufs[k];
            if (c->dev)
                c->dev->ops->host_free(c->dev, b->data);
            else if (c->kind == STK_BATCH_VARIABLE)
                stk__unmap(b->data, c->batch_memory);
            else
                stk__free(b->data);
            stk__free(b->offsets);
            stk__free(b->lengths);
            stk__free(b->dims);
            stk__free(b->labels);
            stk__free(b->indices);
            stk__free(b->ok);
            free_slot_errs(b->errs);
        }
    }
    stk__free(c->bufs);
    stk__free(c->inflight);
    stk__free(c->dnodes);
    if (c->workers) {
        for (unsigned k = 0; k < c->nthreads; k++) {
            stk__scratch_free(&c->workers[k].in);
            stk__scratch_free(&c->workers[k].dec);
        }
    }
    stk__free(c->workers);
    clear_errors(c);
    stk__free(c->errors);
    stk__imgpipe_destroy(c->pipe);
    /* Closing the source closes its store, which completes the fetch
     * stage's requests still in flight; only then can the stage go. */
    stk__fetch_cancel(c->fetch);
    stk__source_close(&c->src);
    stk__fetch_destroy(c->fetch);
    stk__shard_orders_destroy(c->sorder);
    stk__trace_destroy(c->trace);
    for (resumed *r = c->resumed_all, *n; r; r = n) {
        n = r->next;
        stk__layout_free(&r->lay);
        stk__free(r);
    }
    stk__dev_close(c->dev);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond_work);
    pthread_cond_destroy(&c->cond_ready);
    pthread_cond_destroy(&c->cond_idle);
    stk__free(c);
}

/* ---- workers -------------------------------------------------------------- */

static void stage_add(worker *w, int stage, uint64_t ns)
{
    atomic_fetch_add_explicit(&w->items[stage], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->ns[stage], ns, memory_order_relaxed);
}

/* Makes one sample: read its bytes, transform them into slot `s` of b.
 * Returns the error (with a slot_err appended to *errs) or STK_OK. */
typedef struct arena_req {
    core *c;
    buffer *b;
} arena_req;

/* A variable sample's memory: exactly n bytes (rounded up to 64) from its
 * batch's arena, or STK_ETOOBIG with the numbers. Lock-free: the workers of
 * one batch take their ranges with a compare-and-swap. */
static uint8_t *arena_alloc(stk__sink *s, size_t n, int *rc)
{
    arena_req *a = s->ctx;
    core *c = a->c;
    buffer *b = a->b;
    if (c->max_sample && n > c->max_sample) {
        stk__fmt(s->why, sizeof s->why,
                 "sample needs %zu bytes, over the per-sample budget (max_sample_bytes) of %zu "
                 "bytes",
                 n, c->max_sample);
        *rc = STK_ETOOBIG;
        return NULL;
    }
    if (n > c->batch_memory) {
        stk__fmt(s->why, sizeof s->why,
                 "sample needs %zu bytes, more than batch_memory (%zu bytes), the most one "
                 "batch's samples may take; raise batch_memory",
                 n, c->batch_memory);
        *rc = STK_ETOOBIG;
        return NULL;
    }
    size_t need = (n + 63) & ~(size_t)63;
    /* Relaxed: the range is this worker's once the exchange succeeds; the
     * bytes written into it reach the consumer through the loader's lock. */
    size_t off = atomic_load_explicit(&b->vused, memory_order_relaxed);
    do {
        if (need > c->batch_memory - off) {
            stk__fmt(s->why, sizeof s->why,
                     "batch %llu of epoch %llu needs more than batch_memory (%zu bytes): its "
                     "samples so far take %zu and this one %zu; raise batch_memory or lower "
                     "batch_size",
                     (unsigned long long)(b->g % c->part.batches),
                     (unsigned long long)(b->g / c->part.batches), c->batch_memory, off, n);
            *rc = STK_ETOOBIG;
            return NULL;
        }
    } while (!atomic_compare_exchange_weak_explicit(&b->vused, &off, off + need,
                                                    memory_order_relaxed, memory_order_relaxed));
    s->dst = b->data + off;
    s->cap = n;
    s->why[0] = '\0'; /* an earlier, larger ask may have failed */
    *rc = STK_OK;
    return s->dst;
}

static int make_sample(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch, slot_err **errs)
{
    core *c = w->core;
    char err[STK_ERRMSG_MAX];
    err[0] = '\0';
    const bool variable = c->kind == STK_BATCH_VARIABLE;
    uint8_t *slot = variable ? NULL : b->data + s * c->sample_bytes;
    arena_req ar = {c, b};
    stk__sink arena = {.alloc = arena_alloc, .ctx = &ar};
    stk__sink sink = {slot, c->sample_bytes, c->pipe ? &w->in : NULL, NULL, NULL, ""};
    stk__sink *rsink = variable && !c->pipe ? &arena : &sink;
    uint8_t *out = slot;
    uint8_t *bytes = NULL;
    size_t len = 0;
    int64_t label = -1;
    int32_t dims[3] = {0, 0, 0};

    uint64_t t0 = stk__now_ns();
    int rc = c->fetch ? stk__fetch_read(c->fetch, b->g, s, i, rsink, &bytes, &len, &label, err,
                                        sizeof err)
                      : c->src.ops->read(&c->src, i, rsink, &bytes, &len, &label, err, sizeof err);
    uint64_t t1 = stk__now_ns();
    if (rc == STK_ETOOBIG && rsink->grow == &w->in) {
        /* The budget the reader names is max_input_bytes: say so, and how to
         * raise it (issue 24.7). */
        size_t used = strlen(err);
        stk__fmt(err + used, sizeof err - used,
                 " (max_input_bytes, the largest encoded image a decode accepts: raise it with "
                 "--max-input-bytes or options={\"max_input_bytes\": N})");
    }
    stage_add(w, STK_STAGE_READ, t1 - t0);
    if (c->trace)
        stk__trace_event(c->trace, 1 + w->id, STK__TR_READ, t0, t1, i, b->g, (uint32_t)s);
    if (rc == STK_OK && c->pipe) {
        stk__rng rng = stk__rng_for(c->seed, epoch, i);
        stk__imgpipe_decoded_at = 0;
        size_t out_len = 0;
        /* Into the dense slot, or exactly the bytes the image needs from
         * the variable batch's arena. */
        stk__sink slot_sink = {slot, c->sample_bytes, NULL, NULL, NULL, ""};
        rc = stk__imgpipe_run_sink(c->pipe, bytes, len, &rng, &w->dec,
                                   variable ? &arena : &slot_sink, &out, &out_len, dims, err,
                                   sizeof err);
        len = out_len;
        uint64_t t2 = stk__now_ns();
        stage_add(w, STK_STAGE_PROCESS, t2 - t1);
        if (c->trace) {
            uint64_t td = stk__imgpipe_decoded_at;
            if (td >= t1 && td <= t2) {
                stk__trace_event(c->trace, 1 + w->id, STK__TR_DECODE, t1, td, i, b->g,
                                 (uint32_t)s);
                stk__trace_event(c->trace, 1 + w->id, STK__TR_TRANSFORM, td, t2, i, b->g,
                                 (uint32_t)s);
            } else { /* failed before the decode ended */
                stk__trace_event(c->trace, 1 + w->id, STK__TR_PROCESS, t1, t2, i, b->g,
                                 (uint32_t)s);
            }
        }
    } else if (rc == STK_OK && c->kind == STK_BATCH_DENSE && len != c->sample_bytes) {
        stk__fmt(err, sizeof err, "sample is %zu bytes, expected %zu", len, c->sample_bytes);
        rc = STK_EFORMAT;
    } else if (rc == STK_OK) {
        out = bytes; /* raw bytes: read straight into the slot or the arena */
    }
    if (rc == STK_ETOOBIG && arena.why[0])
        stk__fmt(err, sizeof err, "%s", arena.why);
    if (variable)
        b->offsets[s] = rc == STK_OK ? (uint64_t)(out - b->data) : 0;
    b->labels[s] = label;
    b->indices[s] = i;
    b->lengths[s] = rc == STK_OK ? len : 0;
    memcpy(&b->dims[3 * s], dims, sizeof dims);
    b->ok[s] = rc == STK_OK;
    if (rc != STK_OK) {
        char name[NAME_MAX_BYTES];
        c->src.ops->name(&c->src, i, name, sizeof name);
        /* If these allocations fail the failure is still counted and
         * reported; only its text is lost. */
        slot_err *e = stk__calloc(1, sizeof *e);
        if (e) {
            e->slot = s;
            e->sample = i;
            e->code = rc;
            e->name = stk__strdup(name);
            e->reason = stk__strdup(err[0] ? err : stk_strerror(rc));
            e->next = *errs;
            *errs = e;
        }
    }
    return rc;
}

/* The dataset sample at position pos of epoch `epoch`'s order (ord: the
 * global order of that epoch, used when the order is not shard-aware).
 * Shard-aware tables are built once per epoch; a failed build (out of
 * memory) falls back to the global order rather than repeat a sample. */
static uint64_t sample_at(core *c, const stk__order *ord, uint64_t epoch, uint64_t pos)
{
    uint64_t i;
    if (c->sorder && stk__shard_orders_at(c->sorder, epoch, pos, &i) == STK_OK)
        return i;
    return stk__order_at(ord, pos);
}

/* The resumed epoch's layout when global batch g belongs to it, else NULL;
 * *bi gets g's batch within its generation then. */
static const resumed *resumed_for(const core *c, uint64_t g, uint64_t *bi)
{
    const resumed *r = atomic_load_explicit(&c->resumed, memory_order_acquire);
    uint64_t e = g / c->part.batches, b = g % c->part.batches;
    if (!r || r->epoch != e)
        return NULL;
    *bi = b >= r->off ? b - r->off : UINT64_MAX;
    return r;
}

/* Samples in global batch g (0 for the batches a resumed epoch skips). */
static uint64_t batch_len_at(const core *c, uint64_t g)
{
    uint64_t bi;
    const resumed *r = resumed_for(c, g, &bi);
    if (r)
        return bi == UINT64_MAX ? 0 : stk__layout_batch_len(&r->lay, bi);
    return stk__partition_batch_len(&c->part, g % c->part.batches);
}

/* Position in its epoch's order of slot `slot` of global batch g. */
static uint64_t pos_at(const core *c, uint64_t g, uint64_t slot)
{
    uint64_t bi;
    const resumed *r = resumed_for(c, g, &bi);
    if (r)
        return stk__layout_pos(&r->lay, bi * c->batch_size + slot);
    return stk__partition_pos(&c->part, (g % c->part.batches) * c->batch_size + slot);
}

/* Takes the next run of slots to fill. Called and returns with c->lock held.
 * Returns false when the loader is closing. */
static bool claim(core *c, const worker *w, buffer **bo, uint64_t *g, size_t *slot0,
                  size_t *count)
{
    for (;;) {
        if (c->cancel)
            return false;
        if (!c->seeking && w->id < c->active) {
            if (c->claim_g < c->assigned_end_g) {
                buffer *b = c->inflight[c->claim_g % c->nbufs];
                /* Guided sizes: runs shrink as the batch runs out, so the
                 * threads finish a batch together instead of one idling
                 * while another works through a long last run (which
                 * matters when no buffer is free for the next batch). */
                size_t left = b->size - c->claim_slot;
                size_t k = left / (2 * (size_t)c->active);
                k = k < 1 ? 1 : k > c->run ? c->run : k;
                *bo = b;
                *g = c->claim_g;
                *slot0 = c->claim_slot;
                *count = k;
                c->claim_slot += k;
                if (c->claim_slot == b->size) {
                    c->claim_g++;
                    c->claim_slot = 0;
                }
                return true;
            }
            if (c->claim_g < c->deliver_g + c->nbufs && c->free_count > 0) {
                /* free_count > 0 guarantees a FREE buffer exists. */
                unsigned f = 0;
                while (c->bufs[f].state != BUF_FREE)
                    f++;
                buffer *b = &c->bufs[f];
                b->state = BUF_FILLING;
                atomic_store_explicit(&b->vused, 0, memory_order_relaxed);
                b->g = c->assigned_end_g;
                b->size = batch_len_at(c, b->g);
                b->filled = b->failed = 0;
                b->reported = false;
                c->inflight[b->g % c->nbufs] = b;
                c->assigned_end_g++;
                c->free_count--;
                continue;
            }
        }
        stk__cond_wait_ns(&c->cond_work, &c->lock, WAIT_SLICE_NS);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    core *c = w->core;
    char name[16];
    stk__fmt(name, sizeof name, "stk-work-%u", w->id);
    pthread_setname_np(pthread_self(), name);

    pthread_mutex_lock(&c->lock);
    buffer *b;
    uint64_t g;
    size_t slot0, count;
    while (claim(c, w, &b, &g, &slot0, &count)) {
        c->busy++;
        pthread_mutex_unlock(&c->lock);

        uint64_t epoch = g / c->part.batches;
        stk__order ord;
        stk__order_init(&ord, c->part.n, c->seed, epoch, c->shuffle);
        slot_err *errs = NULL;
        size_t nfailed = 0;
        for (size_t s = slot0; s < slot0 + count; s++) {
            uint64_t pos = pos_at(c, g, s);
            uint64_t i = sample_at(c, &ord, epoch, pos);
            if (make_sample(w, b, s, i, epoch, &errs) != STK_OK)
                nfailed++;
        }

        pthread_mutex_lock(&c->lock);
        b->filled += count;
        b->failed += nfailed;
        while (errs) {
            slot_err *n = errs->next;
            errs->next = b->errs;
            b->errs = errs;
            errs = n;
        }
        if (b->filled == b->size) {
            pthread_cond_broadcast(&c->cond_ready);
            if (c->trace) {
                uint64_t t = stk__now_ns();
                stk__trace_event(c->trace, 1 + w->id, STK__TR_READY, t, t, b->g, 0, 0);
            }
        }
        if (--c->busy == 0 && c->seeking)
            pthread_cond_broadcast(&c->cond_idle);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* ---- consumer ------------------------------------------------------------- */

/* Sorts a failure list by slot (merge sort: no allocation, O(k log k)).
 * Workers add failures in completion order. */
static slot_err *sort_by_slot(slot_err *list)
{
    if (!list || !list->next)
        return list;
    slot_err *half = list, *fast = list->next;
    while (fast && fast->next) {
        half = half->next;
        fast = fast->next->next;
    }
    slot_err *b = half->next;
    half->next = NULL;
    slot_err *a = sort_by_slot(list);
    b = sort_by_slot(b);
    slot_err head = {0}, *t = &head;
    while (a && b) {
        slot_err **lo = a->slot <= b->slot ? &a : &b;
        t->next = *lo;
        t = *lo;
        *lo = (*lo)->next;
    }
    t->next = a ? a : b;
    return head.next;
}

/* The kept error list follows the epoch being delivered: a batch of another
 * epoch than the list's restarts it. Lock held. */
static void errors_follow(core *c, uint64_t epoch)
{
    if (epoch != c->errors_epoch) {
        clear_errors(c);
        c->errors_epoch = epoch;
    }
}

/* Moves a delivered batch's failures into the loader's error list, in slot
 * order; batches are delivered in order, so the list keeps the first
 * MAX_KEPT_ERRORS failures of the epoch in sample order. Lock held. */
static void record_errors(core *c, buffer *b)
{
    b->errs = sort_by_slot(b->errs);
    for (slot_err *e = b->errs; e; e = e->next) {
        if (c->nerrors >= MAX_KEPT_ERRORS)
            break;
        if (!c->errors) {
            c->errors = stk__calloc(MAX_KEPT_ERRORS, sizeof *c->errors);
            if (!c->errors)
                break;
        }
        stk_sample_error *se = &c->errors[c->nerrors++];
        se->sample = e->sample;
        se->epoch = b->g / c->part.batches;
        se->code = e->code;
        se->path = e->name;
        se->reason = e->reason;
        e->name = e->reason = NULL;
    }
}

/* The failure of the lowest slot: errors are reported in sample order. */
static const slot_err *first_err(const buffer *b)
{
    const slot_err *best = NULL;
    for (const slot_err *e = b->errs; e; e = e->next)
        if (!best || e->slot < best->slot)
            best = e;
    return best;
}

/* The user's position: the batch the user's next next() returns (with a
 * device, the copy thread has taken batches ahead of it). Lock held. */
static uint64_t user_g(const core *c)
{
    return c->dstage ? c->cons_g : c->deliver_g;
}

/* Reports batch b at position g under the raise policy: keeps its first
 * failure (the lowest slot, as errors go in sample order) in structure, and
 * writes the message from that same record. Before record_errors(), which
 * takes the slot errors' strings. Lock held. */
static void raise_batch(core *c, const buffer *b, uint64_t g, char *err, size_t errlen)
{
    /* Failures of batches the user has passed were dropped by a seek. */
    raised_prune(c, user_g(c));
    if (c->nraised == RAISED_MAX) {
        raised_free(&c->raised[0]);
        memmove(&c->raised[0], &c->raised[1], (RAISED_MAX - 1) * sizeof c->raised[0]);
        c->nraised--;
    }
    const slot_err *e = first_err(b);
    raised *r = &c->raised[c->nraised++];
    *r = (raised){.g = g, .epoch = g / c->part.batches, .nfailed = b->failed, .known = e != NULL};
    if (e) {
        /* If these copies fail, the failure is still reported by index. */
        r->sample = e->sample;
        r->code = e->code;
        r->path = e->name ? stk__strdup(e->name) : NULL;
        r->reason = e->reason ? stk__strdup(e->reason) : NULL;
    }
    uint64_t more = b->failed > 1 ? b->failed - 1 : 0;
    char tail[96] = "";
    if (more)
        stk__fmt(tail, sizeof tail, " (and %llu more failed sample%s in this batch)",
                 (unsigned long long)more, more > 1 ? "s" : "");
    if (e)
        stk__fmt(err, errlen, "sample %llu (%s): %s%s", (unsigned long long)r->sample,
                 r->path ? r->path : "?", r->reason ? r->reason : stk_strerror(r->code), tail);
    else
        stk__fmt(err, errlen,
                 "a sample of batch %llu of epoch %llu failed (its report was lost: "
                 "out of memory)%s",
                 (unsigned long long)(g % c->part.batches), (unsigned long long)r->epoch, tail);
}

#ifdef STK_TEST
static void (*publish_hook)(void *);
static void *publish_hook_arg;

void stk__test_publish_hook(void (*fn)(void *), void *arg)
{
    publish_hook = fn;
    publish_hook_arg = arg;
}
#endif

/* Fills the public view, moving the surviving samples down over failed ones
 * (up to a whole batch of memmove). The buffer is HELD, the consumer's alone,
 * and everything else read here is fixed at open, so this runs without the
 * loader's lock: workers and other threads' releases go on meanwhile. */
static void publish(core *c, buffer *b)
{
#ifdef STK_TEST
    if (publish_hook)
        publish_hook(publish_hook_arg);
#endif
    size_t j = 0;
    for (size_t k = 0; k < b->size; k++) {
        if (!b->ok[k])
            continue;
        uint64_t off = (uint64_t)k * c->sample_bytes;
        if (j != k) {
            if (c->kind == STK_BATCH_DENSE)
                memmove(b->data + j * c->sample_bytes, b->data + off, c->sample_bytes);
            b->labels[j] = b->labels[k];
            b->indices[j] = b->indices[k];
            b->lengths[j] = b->lengths[k];
            memmove(&b->dims[3 * j], &b->dims[3 * k], 3 * sizeof *b->dims);
        }
        b->offsets[j] = c->kind == STK_BATCH_DENSE ? j * c->sample_bytes : b->offsets[k];
        j++;
    }
    stk_batch *v = &b->view;
    v->epoch = b->g / c->part.batches;
    v->index = b->g % c->part.batches;
    v->size = j;
    v->kind = c->kind;
    v->dtype = c->dtype;
    v->ndim = c->ndim;
    memcpy(v->shape, c->shape, sizeof v->shape);
    v->sample_bytes = c->kind == STK_BATCH_DENSE ? c->sample_bytes : 0;
    v->data = b->data;
    v->offsets = b->offsets;
    v->lengths = b->lengths;
    v->dims = b->dims;
    v->labels = b->labels;
    v->indices = b->indices;
}

static int check_handle(stk_loader *l)
{
    if (!l)
        return STK_EMISUSE;
    if (l->pid != getpid()) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "this loader was opened by process %d and cannot be used from a forked "
                 "child; open a new loader in the child",
                 (int)l->pid);
        return STK_EMISUSE;
    }
    if (!l->c) {
        if (l->status == STK_OK)
            stk__fmt(l->errmsg, sizeof l->errmsg, "the loader is closed");
        return STK_EMISUSE;
    }
    return STK_OK;
}

/* ---- held batches ------------------------------------------------------------
 * Every batch handed to the user is entered in one process-wide table, by its
 * address, until it is released. A release, wait or sync first takes the
 * batch out of (or looks it up in) the table, without reading the batch, so a
 * batch that is not held -- released already, perhaps after its loader was
 * closed and the ring freed with the last batch -- is STK_EMISUSE instead of
 * a use after free. The table is the process's because a batch pointer names
 * no loader. Its nodes live in the memory of the batches they stand for (a
 * host buffer's `hnode`, or the core's `dnodes` for device batches), which
 * outlives them: a batch holds its core. g_held_lock is taken under no other
 * lock and around no call that blocks; fork holds it (pthread_atfork), so a
 * child finds it free, and the child's lookups miss the parent's batches
 * (pid). */
#define HELD_BUCKETS 256

static pthread_mutex_t g_held_lock = PTHREAD_MUTEX_INITIALIZER;
static held *g_held[HELD_BUCKETS];
static pthread_once_t g_held_once = PTHREAD_ONCE_INIT;

static void held_fork_prepare(void)
{
    pthread_mutex_lock(&g_held_lock);
}

static void held_fork_after(void)
{
    pthread_mutex_unlock(&g_held_lock);
}

static void held_init(void)
{
    (void)pthread_atfork(held_fork_prepare, held_fork_after, held_fork_after);
}

static size_t held_bucket(const stk_batch *v)
{
    uint64_t x = (uint64_t)(uintptr_t)v;
    x ^= x >> 29;
    x *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(x >> 56) % HELD_BUCKETS;
}

/* Enters v with node h (or, h NULL, a node taken from *spare). false only
 * when *spare is empty, which the callers make impossible. */
static bool held_put(held *h, held **spare, const stk_batch *v)
{
    pthread_once(&g_held_once, held_init);
    pthread_mutex_lock(&g_held_lock);
    if (!h && spare && (h = *spare) != NULL) {
        *spare = h->next;
        h->spare = spare;
    }
    if (h) {
        size_t k = held_bucket(v);
        h->view = v;
        h->pid = getpid();
        h->next = g_held[k];
        g_held[k] = h;
    }
    pthread_mutex_unlock(&g_held_lock);
    return h != NULL;
}

/* Whether this process holds v; `take` also removes it (a device batch's
 * node goes back to its spare list at once, while the batch still holds its
 * core, so the next device batch finds one). */
static bool held_find(const stk_batch *v, bool take)
{
    pid_t me = getpid();
    bool found = false;
    pthread_once(&g_held_once, held_init); /* before the lock is first taken */
    pthread_mutex_lock(&g_held_lock);
    for (held **pp = &g_held[held_bucket(v)]; *pp; pp = &(*pp)->next) {
        held *h = *pp;
        if (h->view != v || h->pid != me)
            continue;
        found = true;
        if (take) {
            *pp = h->next;
            h->view = NULL;
            if (h->spare) {
                h->next = *h->spare;
                *h->spare = h;
            }
        }
        break;
    }
    pthread_mutex_unlock(&g_held_lock);
    return found;
}

/* ---- autotune ---------------------------------------------------------------- */

#define AT_WINDOW_NS (200ull * 1000 * 1000) /* at least this long per decision */
#define AT_STARVED   0.02                   /* waited over 2 % of a window: add a worker */
#define AT_CALM      0.005                  /* under 0.5 %, with batches to spare: */
#define AT_CALM_RUNS 3                      /* ... this many windows in a row: drop one */

/* Batches completely filled and waiting after the one at deliver_g. Lock held. */
static uint64_t ready_ahead(const core *c)
{
    uint64_t n = 0;
    for (uint64_t g = c->deliver_g; g < c->assigned_end_g; g++) {
        const buffer *b = c->inflight[g % c->nbufs];
        if (!b || b->filled != b->size)
            break;
        n++;
    }
    return n;
}

/* One step of the controller, after a delivery. The output never depends on
 * the number of active workers (each sample's bytes and random draws are
 * fixed by (seed, epoch, sample)), so only speed and CPU use change. Lock
 * held. */
static void autotune_step(core *c, uint64_t now)
{
    uint64_t ahead = ready_ahead(c);
    if (ahead < c->at_min_ahead)
        c->at_min_ahead = ahead;
    uint64_t dt = now - c->at_t0;
    if (dt < AT_WINDOW_NS || c->delivered_batches - c->at_b0 < 2)
        return;
    double starved = (double)c->at_blocked / (double)dt;
    if (starved > AT_STARVED && c->active < c->nthreads) {
        c->active++;
        c->at_calm = 0;
        pthread_cond_broadcast(&c->cond_work);
    } else if (starved < AT_CALM && c->at_min_ahead >= 1) {
        if (++c->at_calm >= AT_CALM_RUNS && c->active > 1) {
            c->active--;
            c->at_calm = 0;
        }
    } else {
        c->at_calm = 0;
    }
    c->at_t0 = now;
    c->at_blocked = 0;
    c->at_b0 = c->delivered_batches;
    c->at_min_ahead = UINT64_MAX;
}

/* The ring's next batch in order. `user`: the caller is the user (without a
 * device), whose waiting is counted as starvation and traced; otherwise it
 * is the device stage's copy thread. */
static int host_next(core *c, stk_batch **out, uint64_t timeout_ns, char *err, size_t errlen,
                     bool user)
{
    int rc;
    *out = NULL;
    buffer *pub = NULL;
    uint64_t start = stk__now_ns(), blocked_since = 0;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        if (c->deliver_g == (c->cur_epoch + 1) * c->part.batches) {
            c->cur_epoch++;
            rc = STK_END;
            break;
        }
        uint64_t g = c->deliver_g;
        buffer *b = g < c->assigned_end_g ? c->inflight[g % c->nbufs] : NULL;
        if (b && b->filled == b->size) {
            errors_follow(c, g / c->part.batches);
            if (b->failed && !b->reported) {
                b->reported = true;
                if (c->on_error == STK_ON_ERROR_RAISE) {
                    raise_batch(c, b, g, err, errlen);
                    record_errors(c, b);
                    c->failed += b->failed;
                    rc = STK_ESAMPLE;
                    break;
                }
                record_errors(c, b);
                c->skipped += b->failed;
            }
            free_slot_errs(b->errs);
            b->errs = NULL;
            c->inflight[g % c->nbufs] = NULL;
            c->deliver_g++;
            b->state = BUF_HELD;
            c->refs++;
            pthread_cond_broadcast(&c->cond_work);
            c->delivered_batches++;
            c->delivered_samples += b->size - b->failed;
            pub = b;
            rc = STK_OK;
            break;
        }
        if (!b && c->free_count == 0) {
            stk__fmt(err, errlen,
                     "all %u ring buffers are held by the consumer; release a batch before "
                     "asking for the next, or raise depth",
                     c->nbufs);
            rc = STK_EBUSY;
            break;
        }
        uint64_t now = stk__now_ns();
        uint64_t slice = stk__wait_slice(start, now, timeout_ns, WAIT_SLICE_NS);
        if (!slice) {
            rc = STK_TIMEOUT;
            break;
        }
        if (!blocked_since)
            blocked_since = now;
        stk__cond_wait_ns(&c->cond_ready, &c->lock, slice);
    }
    uint64_t end = stk__now_ns();
    if (user)
        c->wait_ns += end - start;
    if (blocked_since)
        c->at_blocked += end - blocked_since;
    if (c->autotune && rc == STK_OK)
        autotune_step(c, end);
    if (c->trace && user)
        stk__trace_event(c->trace, 0, STK__TR_NEXT, start, end, c->deliver_g - (pub != NULL),
                         rc == STK_OK ? 0 : rc == STK_END ? 1 : rc == STK_TIMEOUT ? 2 : 3, 0);
    pthread_mutex_unlock(&c->lock);
    if (pub) {
        publish(c, pub);
        *out = &pub->view;
        /* The user's, until stk_batch_release; the copy thread's batches
         * never leave the library. */
        if (user)
            (void)held_put(&pub->hnode, NULL, &pub->view);
    }
    return rc;
}

#define PAGE_ROUND(n) (((n) + 4095) & ~(size_t)4095)

/* A variable batch's arena keeps the memory its largest batch touched, so
 * the next batches do not fault it in again, until a batch uses under half
 * of it: then the rest goes back to the system. The buffer is the caller's
 * alone (held, or free with no worker in it). */
static void arena_compact(const core *c, buffer *b)
{
    if (c->kind != STK_BATCH_VARIABLE)
        return;
    size_t used = PAGE_ROUND(atomic_load_explicit(&b->vused, memory_order_relaxed));
    if (used > b->vhigh)
        b->vhigh = used;
    if (b->vhigh > 2 * used + ((size_t)1 << 20)) {
        stk__map_trim(b->data + used, b->vhigh - used);
        b->vhigh = used;
    }
}

static void release_host(buffer *b)
{
    core *c = b->core;
    pthread_mutex_lock(&c->lock);
    if (b->state != BUF_HELD) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    if (c->kind == STK_BATCH_VARIABLE) {
        /* Compacted outside the lock (madvise): no worker touches a buffer
         * that is not free, and a second release sees RELEASING. */
        b->state = BUF_RELEASING;
        pthread_mutex_unlock(&c->lock);
        arena_compact(c, b);
        pthread_mutex_lock(&c->lock);
    }
    b->state = BUF_FREE;
    c->free_count++;
    bool last = --c->refs == 0;
    pthread_cond_broadcast(&c->cond_work);
    pthread_mutex_unlock(&c->lock);
    if (last)
        core_free(c);
}

/* The device stage's view of the ring. */
static int stage_host_next(void *ctx, stk_batch **out, uint64_t timeout_ns, char *err,
                           size_t errlen)
{
    return host_next(ctx, out, timeout_ns, err, errlen, false);
}

static void stage_host_release(void *ctx, stk_batch *b)
{
    (void)ctx;
    release_host((buffer *)(void *)b);
}

/* The user's next batch from the device stage; the position, the wait and
 * the trace are the user's. */
static int device_next(stk_loader *l, stk_batch **out, uint64_t timeout_ns)
{
    core *c = l->c;
    uint64_t start = stk__now_ns();
    int rc = stk__devstage_next(c->dstage, out, timeout_ns, l->errmsg, sizeof l->errmsg);
    /* A node for each device buffer, and a batch's goes back before its
     * buffer can be handed out again: the spare list is never empty here. */
    if (rc == STK_OK && !held_put(NULL, &c->dspare, *out)) {
        (void)stk__devstage_release(*out, NULL);
        *out = NULL;
        stk__fmt(l->errmsg, sizeof l->errmsg, "internal error: no node for a held device batch");
        rc = STK_EMISUSE;
    }
    uint64_t end = stk__now_ns();
    pthread_mutex_lock(&c->lock);
    c->wait_ns += end - start;
    if (rc == STK_OK) {
        /* The batch holds the core alive, as a host batch does. */
        c->refs++;
        c->cons_g = (*out)->epoch * c->part.batches + (*out)->index + 1;
    } else if (rc == STK_END) {
        c->cons_epoch++;
    }
    if (c->trace)
        stk__trace_event(c->trace, 0, STK__TR_NEXT, start, end, c->cons_g - (rc == STK_OK),
                         rc == STK_OK ? 0 : rc == STK_END ? 1 : rc == STK_TIMEOUT ? 2 : 3, 0);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Keeps a next() call's result for stk_loader_last_error: after
 * STK_ESAMPLE the structured failure of the user's batch moves to the
 * handle. The newest record of that position wins: a seek may have left an
 * older one of the same position behind. */
static void keep_result(stk_loader *l, int rc)
{
    core *c = l->c;
    raised_free(&l->last);
    l->last_code = rc;
    if (rc != STK_ESAMPLE)
        return;
    pthread_mutex_lock(&c->lock);
    uint64_t g = user_g(c);
    for (unsigned k = c->nraised; k-- > 0;) {
        if (c->raised[k].g == g) {
            l->last = c->raised[k];
            c->raised[k] = (raised){.g = g};
            break;
        }
    }
    raised_prune(c, g + 1);
    pthread_mutex_unlock(&c->lock);
}

static int next_impl(stk_loader *l, stk_batch **out, uint64_t timeout_ns)
{
    int rc = check_handle(l);
    if (out)
        *out = NULL;
    if (rc)
        return rc;
    if (!out) {
        rc = STK_EINVAL;
    } else if (l->c->dstage) {
        rc = device_next(l, out, timeout_ns);
    } else {
        rc = host_next(l->c, out, timeout_ns, l->errmsg, sizeof l->errmsg, true);
    }
    keep_result(l, rc);
    return rc;
}

int stk_loader_next(stk_loader *l, stk_batch **out)
{
    return next_impl(l, out, 0);
}

int stk_loader_next_timeout(stk_loader *l, stk_batch **out, unsigned timeout_ms)
{
    return next_impl(l, out, timeout_ms ? (uint64_t)timeout_ms * 1000000ULL : 1);
}

int stk_batch_release_stream(stk_batch *bv, void *stream)
{
    if (!bv)
        return STK_OK;
    /* Nothing of bv is read before it is found held: a stale pointer's
     * memory may be gone with its loader. */
    if (!held_find(bv, true))
        return STK_EMISUSE;
    if (bv->device == STK_DEVICE_CPU) {
        release_host((buffer *)(void *)bv);
        return STK_OK;
    }
    core *c = stk__devstage_release(bv, stream);
    if (!c)
        return STK_EMISUSE; /* not held by the stage (cannot be, once found) */
    pthread_mutex_lock(&c->lock);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (last)
        core_free(c);
    return STK_OK;
}

int stk_batch_release(stk_batch *bv)
{
    return stk_batch_release_stream(bv, NULL);
}

stk__dev *stk__loader_device(stk_loader *l)
{
    return l && l->c ? l->c->dev : NULL;
}

int stk_batch_wait(stk_batch *b, void *stream)
{
    if (!b)
        return STK_EINVAL;
    if (!held_find(b, false))
        return STK_EMISUSE;
    return b->device == STK_DEVICE_CPU ? STK_OK : stk__devstage_wait(b, stream);
}

int stk_batch_record_stream(stk_batch *b, void *stream)
{
    if (!b)
        return STK_EINVAL;
    if (!held_find(b, false))
        return STK_EMISUSE;
    return b->device == STK_DEVICE_CPU ? STK_OK : stk__devstage_record_stream(b, stream);
}

int stk_batch_sync(stk_batch *b)
{
    if (!b)
        return STK_EINVAL;
    if (!held_find(b, false))
        return STK_EMISUSE;
    return b->device == STK_DEVICE_CPU ? STK_OK : stk__devstage_sync(b);
}

/* Moves the production cursor to batch `batch` of `epoch`, dropping work
 * prefetched elsewhere. Waits for workers to leave the slots they write. */
static void seek_to(core *c, uint64_t epoch, uint64_t batch, resumed *lay, bool set_lay)
{
    uint64_t target = epoch * c->part.batches + batch;
    bool dev_paused = false;
    if (c->dstage) {
        /* The copy thread is ahead of the user: unless the user is already
         * there, stop it and drop what it queued, then move the ring. */
        pthread_mutex_lock(&c->lock);
        const resumed *cur = atomic_load_explicit(&c->resumed, memory_order_relaxed);
        bool here = target == c->cons_g && epoch == c->cons_epoch && !(set_lay && lay != cur);
        pthread_mutex_unlock(&c->lock);
        if (here)
            return;
        stk__devstage_pause(c->dstage);
        dev_paused = true;
    }
    pthread_mutex_lock(&c->lock);
    const resumed *cur = atomic_load_explicit(&c->resumed, memory_order_relaxed);
    if (dev_paused || target != c->deliver_g || epoch != c->cur_epoch ||
        (set_lay && lay != cur)) {
        c->seeking = true;
        while (c->busy)
            stk__cond_wait_ns(&c->cond_idle, &c->lock, WAIT_SLICE_NS);
        for (unsigned k = 0; k < c->nbufs; k++) {
            buffer *b = &c->bufs[k];
            if (b->state == BUF_FILLING) {
                b->state = BUF_FREE;
                c->free_count++;
                free_slot_errs(b->errs);
                b->errs = NULL;
            }
            c->inflight[k] = NULL;
        }
        if (set_lay) {
            /* Workers are out of their slots (busy is 0) and no batch is
             * being assigned: the new layout takes effect from here. */
            if (lay) {
                lay->next = c->resumed_all;
                c->resumed_all = lay;
            }
            atomic_store_explicit(&c->resumed, lay, memory_order_release);
        }
        c->claim_g = c->assigned_end_g = c->deliver_g = target;
        c->claim_slot = 0;
        c->cur_epoch = epoch;
        /* Lock order: loader lock, then the fetch stage's (which never
         * calls back into the loader). */
        if (c->fetch)
            stk__fetch_reset(c->fetch, target);
        /* The epoch (re)starts here: its failures are listed afresh. */
        clear_errors(c);
        c->errors_epoch = epoch;
        c->seeking = false;
        c->cons_g = target;
        c->cons_epoch = epoch;
        pthread_cond_broadcast(&c->cond_work);
    }
    pthread_mutex_unlock(&c->lock);
    if (dev_paused)
        stk__devstage_resume(c->dstage);
}

/* Moves the production cursor to batch `batch` of `epoch` under the normal
 * layout (a resumed epoch's layout no longer applies). */
static void seek(core *c, uint64_t epoch, uint64_t batch)
{
    seek_to(c, epoch, batch, NULL, true);
}

int stk_loader_set_epoch(stk_loader *l, uint64_t epoch)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    if (epoch > UINT64_MAX / (l->c->part.batches + 1) - 1) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "epoch %llu is too large", (unsigned long long)epoch);
        return STK_EINVAL;
    }
    seek(l->c, epoch, 0);
    return STK_OK;
}

/* Copies a result struct the library filled in full (`full`, `size` bytes,
 * struct_size first) into the caller's `out`, whose struct_size says how large
 * the caller's version is: the common prefix is copied, a tail the library
 * does not know is zeroed, and struct_size becomes the bytes filled. `min` is
 * the size of the struct's first version. */
static int put_sized(stk_loader *l, const char *type, void *out, const void *full, size_t size,
                     size_t min)
{
    if (!out)
        return STK_EINVAL;
    size_t want;
    memcpy(&want, out, sizeof want);
    if (want < min) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "%s.struct_size is %zu; set it to sizeof(%s) (at least %zu)", type, want, type,
                 min);
        return STK_EINVAL;
    }
    size_t n = want < size ? want : size;
    memcpy(out, full, n);
    if (want > n)
        memset((char *)out + n, 0, want - n);
    memcpy(out, &n, sizeof n);
    return STK_OK;
}

/* Sizes of the first versions of the extensible structs: fields are only ever
 * appended, so these stay fixed as the structs grow. */
#define INFO_V1  (offsetof(stk_info, source_kind) + sizeof(const char *))
#define STATS_V1 (offsetof(stk_stats, memory_bound_bytes) + sizeof(uint64_t))
#define STAGE_V1 (offsetof(stk_stage_stats, busy_ns) + sizeof(uint64_t))
#define STATE_V1 (offsetof(stk_state, transform) + sizeof(uint64_t))
#define ERRINFO_V1 (offsetof(stk_error_info, message) + sizeof(const char *))

/* The loader's own state: position and fingerprint. Lock held. The position
 * is the user's: with a device, where the device stage's consumer is (the
 * copy thread has taken batches ahead of it). */
static stk_state own_state(const core *c)
{
    stk_state st = {.struct_size = sizeof st};
    uint64_t epoch = c->dstage ? c->cons_epoch : c->cur_epoch;
    uint64_t deliver_g = c->dstage ? c->cons_g : c->deliver_g;
    st.seed = c->seed;
    st.epoch = epoch;
    st.batch = deliver_g - epoch * c->part.batches;
    st.num_samples = c->src.count;
    st.batch_size = c->batch_size;
    st.world_size = c->part.world;
    st.local_world_size = c->part.local;
    st.rank = c->part.rank;
    st.shuffle = c->shuffle;
    st.drop_last = c->drop_last;
    st.transform = c->transform_hash;
    const resumed *r = atomic_load_explicit(&c->resumed, memory_order_relaxed);
    if (r && r->epoch == epoch) {
        if (st.batch >= c->part.batches) {
            /* The resumed epoch is over: the next one starts afresh. */
            st.epoch++;
            st.batch = 0;
        } else {
            st.batch -= r->off;
            st.history_len = (uint32_t)(r->lay.ngens - 1);
            for (size_t i = 0; i + 1 < r->lay.ngens; i++) {
                const stk__gen_spec *g = &r->lay.gens[i].spec;
                st.history[i] = (stk_state_generation){g->world, g->local, g->batch_size,
                                                       g->steps};
            }
        }
    }
    return st;
}

int stk_loader_get_state(stk_loader *l, stk_state *st)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    core *c = l->c;
    pthread_mutex_lock(&c->lock);
    stk_state own = own_state(c);
    pthread_mutex_unlock(&c->lock);
    return put_sized(l, "stk_state", st, &own, sizeof own, STATE_V1);
}

/* Names the first fingerprint field where a saved state differs from the
 * loader's, with both values. Returns STK_OK when all match. */
static int check_fingerprint(stk_loader *l, const stk_state *st, const stk_state *own)
{
    static const struct {
        const char *name;
        size_t off, size;
    } fields[] = {
        {"seed", offsetof(stk_state, seed), sizeof(uint64_t)},
        {"num_samples (the dataset's size)", offsetof(stk_state, num_samples), sizeof(uint64_t)},
        {"shuffle", offsetof(stk_state, shuffle), sizeof(uint32_t)},
        {"drop_last", offsetof(stk_state, drop_last), sizeof(uint32_t)},
        {"transform", offsetof(stk_state, transform), sizeof(uint64_t)},
    };
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        if (fields[k].off + fields[k].size > st->struct_size)
            continue; /* a field later than the caller's struct */
        uint64_t a = 0, b = 0;
        if (fields[k].size == sizeof(uint32_t)) {
            uint32_t a32, b32;
            memcpy(&a32, (const char *)st + fields[k].off, sizeof a32);
            memcpy(&b32, (const char *)own + fields[k].off, sizeof b32);
            a = a32, b = b32;
        } else {
            memcpy(&a, (const char *)st + fields[k].off, sizeof a);
            memcpy(&b, (const char *)own + fields[k].off, sizeof b);
        }
        if (a == b)
            continue;
        if (!strcmp(fields[k].name, "transform"))
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state was saved with another transform (fingerprint %016llx; this loader's "
                     "transform and image options give %016llx): resuming would not give the "
                     "same batches",
                     (unsigned long long)a, (unsigned long long)b);
        else
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state was saved with %s %llu but this loader has %llu: resuming would not "
                     "give the same batches",
                     fields[k].name, (unsigned long long)a, (unsigned long long)b);
        return STK_EINVAL;
    }
    return STK_OK;
}

int stk_loader_set_state(stk_loader *l, const stk_state *st)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    if (!st)
        return STK_EINVAL;
    if (st->struct_size < STATE_V1) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "stk_state.struct_size is %zu; set it to sizeof(stk_state) (at least %zu)",
                 st->struct_size, (size_t)STATE_V1);
        return STK_EINVAL;
    }
    core *c = l->c;
    pthread_mutex_lock(&c->lock);
    stk_state own = own_state(c);
    pthread_mutex_unlock(&c->lock);
    if ((rc = check_fingerprint(l, st, &own)))
        return rc;
    if (st->epoch > UINT64_MAX / (c->part.batches + 1) - 1) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "state epoch %llu is too large",
                 (unsigned long long)st->epoch);
        return STK_EINVAL;
    }
    /* The worlds of the saved epoch: its history, then its current world
     * (fields of later versions only when struct_size covers them). */
    size_t end = offsetof(stk_state, history);
    uint32_t nhist = 0, saved_local = st->world_size;
    if (st->struct_size >= offsetof(stk_state, local_world_size) + sizeof(uint32_t) &&
        st->local_world_size)
        saved_local = st->local_world_size;
    if (st->struct_size >= offsetof(stk_state, history_len) + sizeof(uint32_t))
        nhist = st->history_len;
    if (nhist > STK_STATE_HISTORY ||
        (nhist && st->struct_size < end + nhist * sizeof(stk_state_generation))) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "state history of %u worlds: at most %d fit in stk_state (struct_size %zu)",
                 nhist, STK_STATE_HISTORY, st->struct_size);
        return STK_EINVAL;
    }
    bool same = st->world_size == c->part.world && saved_local == c->part.local &&
                st->batch_size == c->batch_size;
    if (same && nhist == 0) {
        /* The same world: the plain position. */
        if (st->batch > c->part.batches) {
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state batch %llu is past this loader's %llu batches per epoch",
                     (unsigned long long)st->batch, (unsigned long long)c->part.batches);
            return STK_EINVAL;
        }
        seek(c, st->epoch, st->batch);
        return STK_OK;
    }
    stk__gen_spec gens[STK_STATE_HISTORY + 2];
    size_t ng = 0;
    for (uint32_t i = 0; i < nhist; i++)
        gens[ng++] = (stk__gen_spec){st->history[i].world_size, st->history[i].local_world_size,
                                     st->history[i].batch_size, st->history[i].batches};
    uint64_t steps = 0;
    if (same) {
        steps = st->batch; /* the saved world continues */
    } else {
        gens[ng++] = (stk__gen_spec){st->world_size, saved_local, st->batch_size, st->batch};
    }
    gens[ng++] = (stk__gen_spec){c->part.world, c->part.local, c->batch_size, 0};
    resumed *r = stk__calloc(1, sizeof *r);
    if (!r)
        return STK_ENOMEM;
    char why[STK_ERRMSG_MAX];
    if ((rc = stk__layout_build(&r->lay, c->part.n, gens, ng, c->part.rank, c->drop_last, why,
                                sizeof why))) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "cannot resume this state: %s", why);
        stk__free(r);
        return rc;
    }
    const stk__gen *last = &r->lay.gens[ng - 1];
    if (steps > last->batches || last->batches > c->part.batches) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "state batch %llu is past the %llu batches left of the epoch",
                 (unsigned long long)steps, (unsigned long long)last->batches);
        stk__layout_free(&r->lay);
        stk__free(r);
        return STK_EINVAL;
    }
    if (last->batches == steps) {
        /* Nothing left of that epoch for this world: the next one. */
        stk__layout_free(&r->lay);
        stk__free(r);
        seek(c, st->epoch + 1, 0);
        return STK_OK;
    }
    r->epoch = st->epoch;
    r->off = c->part.batches - last->batches;
    seek_to(c, st->epoch, r->off + steps, r, true);
    return STK_OK;
}

int stk_loader_info(stk_loader *l, stk_info *info)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    core *c = l->c;
    stk_info in = {.struct_size = sizeof in};
    in.num_samples = c->src.count;
    in.samples_per_epoch = c->part.per_rank;
    in.batches_per_epoch = c->part.batches;
    in.num_classes = c->src.num_classes;
    in.threads = c->nthreads;
    in.depth = c->depth;
    in.batch_size = c->batch_size;
    in.kind = c->kind;
    in.source_kind = c->src.ops->kind;
    in.ring_buffers = c->nbufs;
    return put_sized(l, "stk_info", info, &in, sizeof in, INFO_V1);
}

/* Sums stage `stage` over the threads [t0, t1). */
static int stage_sum(stk_loader *l, int stage, unsigned t0, unsigned t1, stk_stage_stats *out)
{
    if (stage < 0 || stage >= NSTAGES) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "stage %d is not in 0..%d", stage, NSTAGES - 1);
        return STK_EINVAL;
    }
    stk_stage_stats s = {.struct_size = sizeof s};
    for (unsigned t = t0; t < t1; t++) {
        worker *w = &l->c->workers[t];
        s.items += atomic_load_explicit(&w->items[stage], memory_order_relaxed);
        s.busy_ns += atomic_load_explicit(&w->ns[stage], memory_order_relaxed);
    }
    return put_sized(l, "stk_stage_stats", out, &s, sizeof s, STAGE_V1);
}

int stk_loader_stage_stats(stk_loader *l, int stage, stk_stage_stats *out)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    return stage_sum(l, stage, 0, l->c->nthreads, out);
}

int stk_loader_thread_stats(stk_loader *l, unsigned thread, int stage, stk_stage_stats *out)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    if (thread >= l->c->nthreads) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "thread %u is not in 0..%u", thread,
                 l->c->nthreads - 1);
        return STK_EINVAL;
    }
    return stage_sum(l, stage, thread, thread + 1, out);
}

int stk_loader_stats(stk_loader *l, stk_stats *st)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    core *c = l->c;
    stk_stats s = {.struct_size = sizeof s};
    pthread_mutex_lock(&c->lock);
    s.samples_delivered = c->delivered_samples;
    s.batches_delivered = c->delivered_batches;
    s.consumer_wait_ns = c->wait_ns;
    s.samples_skipped = c->skipped;
    s.samples_failed = c->failed;
    s.threads_active = c->active;
    pthread_mutex_unlock(&c->lock);
    if (c->dstage)
        stk__devstage_delivered(c->dstage, &s.batches_delivered, &s.samples_delivered);
    s.threads_max = c->nthreads;
    s.memory_bound_bytes = c->memory_bound;
    s.device_memory_bytes = c->dev_bytes;
    return put_sized(l, "stk_stats", st, &s, sizeof s, STATS_V1);
}

int stk_loader_fetch_stats(stk_loader *l, stk_fetch_stats *st)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    /* The first version of the struct ends after io_busy_ns. */
    if (!st || st->struct_size < offsetof(stk_fetch_stats, io_busy_ns) + sizeof st->io_busy_ns)
        return STK_EINVAL;
    if (!l->c->fetch)
        return STK_EUNSUPPORTED;
    stk__fetch_stats f;
    stk__fetch_stats_get(l->c->fetch, &f);
    stk_fetch_stats full = {.struct_size = 0,
                            .requests = f.requests,
                            .retries = f.retries,
                            .failures = f.failures,
                            .bytes = f.bytes,
                            .inflight = f.inflight,
                            .inflight_peak = f.inflight_peak,
                            .samples = f.samples,
                            .sample_bytes = f.sample_bytes,
                            .overfetch_bytes = f.overfetch_bytes,
                            .waits = f.waits,
                            .wait_ns = f.wait_ns,
                            .buffered_bytes = f.buffered,
                            .buffered_peak = f.buffered_peak,
                            .cache_hits = f.cache_hits,
                            .cache_misses = f.cache_misses,
                            .cache_evictions = f.cache_evictions,
                            .cache_fallbacks = f.cache_fallbacks,
                            .io_busy_ns = f.io_busy_ns,
                            .completed = f.completed,
                            .request_ns = f.request_ns,
                            .first_byte_ns = f.first_byte_ns,
                            .cache_write_errors = f.cache_write_errors,
                            .cache_dropped = f.cache_dropped};
    size_t n = st->struct_size < sizeof full ? st->struct_size : sizeof full;
    full.struct_size = n;
    memcpy(st, &full, n);
    return STK_OK;
}

uint64_t stk_loader_memory_bound(stk_loader *l)
{
    return l && l->c ? l->c->memory_bound : 0;
}

size_t stk_loader_error_count(stk_loader *l)
{
    if (check_handle(l))
        return 0;
    pthread_mutex_lock(&l->c->lock);
    size_t n = l->c->nerrors;
    pthread_mutex_unlock(&l->c->lock);
    return n;
}

int stk_loader_error_get(stk_loader *l, size_t i, stk_sample_error *e)
{
    int rc = check_handle(l);
    if (rc)
        return rc;
    if (!e)
        return STK_EINVAL;
    pthread_mutex_lock(&l->c->lock);
    if (i < l->c->nerrors) {
        *e = l->c->errors[i];
        if (!e->path)
            e->path = "?";
        if (!e->reason)
            e->reason = stk_strerror(e->code);
    } else {
        rc = STK_EINVAL;
    }
    pthread_mutex_unlock(&l->c->lock);
    return rc;
}

const char *stk_loader_errmsg(stk_loader *l)
{
    return l ? l->errmsg : "";
}

int stk_loader_last_error(stk_loader *l, stk_error_info *info)
{
    int rc = check_handle(l);
    /* A failed handle answers with its open error. */
    bool failed = rc && l && l->pid == getpid() && l->status != STK_OK;
    if (rc && !failed)
        return rc;
    const raised *r = l->last.known ? &l->last : NULL;
    stk_error_info full = {
        .struct_size = sizeof full,
        .code = failed ? l->status : l->last_code,
        .has_sample = r != NULL,
        .sample_code = r ? r->code : STK_OK,
        .sample = r ? r->sample : 0,
        .epoch = r ? r->epoch : 0,
        .nfailed = r ? r->nfailed : 0,
        .path = r ? (r->path ? r->path : "?") : "",
        .reason = r ? (r->reason ? r->reason : stk_strerror(r->code)) : "",
        .field = "",
        .message = l->errmsg,
    };
    return put_sized(l, "stk_error_info", info, &full, sizeof full, ERRINFO_V1);
}

/* Stops and joins the workers. */
static void stop_workers(core *c)
{
    pthread_mutex_lock(&c->lock);
    c->cancel = true;
    pthread_cond_broadcast(&c->cond_work);
    pthread_cond_broadcast(&c->cond_idle);
    pthread_cond_broadcast(&c->cond_ready);
    pthread_mutex_unlock(&c->lock);
    stk__fetch_cancel(c->fetch);
    for (unsigned k = 0; k < c->nthreads; k++)
        if (c->workers[k].started)
            pthread_join(c->workers[k].th, NULL);
}

void stk_loader_close(stk_loader *l)
{
    if (!l)
        return;
    if (l->pid != getpid()) {
        /* In a forked child the threads do not exist and the lock may be held
         * by one of the parent's: touching the core could deadlock. The
         * handle's memory is the parent's to free. */
        return;
    }
    core *c = l->c;
    if (c) {
        /* The copy thread first: it takes batches from the ring, and its
         * copies in flight read the ring's buffers. */
        stk__devstage_stop(c->dstage);
        stop_workers(c);
        pthread_mutex_lock(&c->lock);
        /* No thread records any more: the workers are joined and the handle
         * is going, so no next() can run. */
        stk__trace *t = c->trace;
        c->trace = NULL;
        if (t) {
            stk__trace_totals tot = {.batch_size = c->batch_size,
                                     .samples_delivered = c->delivered_samples,
                                     .batches_delivered = c->delivered_batches};
            for (unsigned k = 0; k < c->nthreads; k++) {
                tot.read_items += atomic_load(&c->workers[k].items[STK_STAGE_READ]);
                tot.process_items += atomic_load(&c->workers[k].items[STK_STAGE_PROCESS]);
            }
            stk__trace_finish(t, &tot);
        }
        stk__trace_destroy(t);
        bool last = --c->refs == 0;
        pthread_mutex_unlock(&c->lock);
        if (last)
            core_free(c);
    }
    raised_free(&l->last);
    stk__free(l);
}

/* ---- open ----------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const char *text)
{
    for (const char *p = text; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    return h;
}

/* The resume fingerprint of the transform: 64-bit FNV-1a of the spec text
 * and of the image options that change its output, written out as text so
 * the value is the same on every build and platform. No transform hashes as
 * "none". */
static uint64_t transform_hash(const stk_options *o)
{
    const uint64_t basis = 0xcbf29ce484222325ULL;
    const char *spec = o->transform;
    if (!spec || !*spec || !strcmp(spec, "none"))
        return fnv1a(basis, "none");
    char opts[128];
    /* strict changes which damaged samples fail, so which batches come. */
    stk__fmt(opts, sizeof opts, "|size=%d|layout=%s|dtype=%d|exif=%d|strict=%d", o->size,
             o->nchw ? "nchw" : "nhwc", o->dtype, o->exif, o->strict);
    return fnv1a(fnv1a(basis, spec), opts);
}

/* Decides the output kind and shape from the source and the transform. */
static int setup_output(core *c, const stk_options *o, char *err, size_t errlen)
{
    const char *spec = o->transform;
    if (!spec || !*spec || !strcmp(spec, "none")) {
        /* Without a transform samples are their stored bytes: a float dtype
         * would be silently ignored, so it is refused. */
        if (o->dtype != STK_DTYPE_UINT8) {
            static const char *const names[] = {"uint8", "float32", "float16", "bfloat16"};
            stk__fmt(err, errlen,
                     "%s: dtype %s needs an image transform (a preset or a spec, "
                     "docs/transforms.md); without one, samples are their stored bytes, "
                     "delivered as uint8",
                     o->source_shown, names[o->dtype & 3]);
            return STK_EINVAL;
        }
        if (c->src.fixed_len) {
            c->kind = STK_BATCH_DENSE;
            c->ndim = 1;
            c->shape[0] = (int64_t)c->src.fixed_len;
            c->sample_bytes = c->src.fixed_len;
        } else {
            c->kind = STK_BATCH_VARIABLE;
        }
        c->dtype = STK_DTYPE_UINT8;
        return STK_OK;
    }
    stk__imgpipe_params prm = {o->dtype, o->nchw, o->size, o->exif, o->max_dim};
    int rc = stk__imgpipe_create(&c->pipe, spec, &prm, err, errlen);
    if (rc)
        return rc;
    stk__imgpipe_set_strict(c->pipe, o->strict);
    stk__imgpipe_set_jpeg_memory(c->pipe, o->jpeg_memory);
    if (c->src.raw_c)
        stk__imgpipe_set_raw(c->pipe, c->src.raw_h, c->src.raw_w, c->src.raw_c, c->src.raw_chw);
    size_t sb = 0;
    if (stk__imgpipe_dense(c->pipe, &c->ndim, c->shape, &c->dtype, &sb)) {
        c->kind = STK_BATCH_DENSE;
        c->sample_bytes = sb;
    } else {
        c->kind = STK_BATCH_VARIABLE;
        c->dtype = STK_DTYPE_UINT8;
    }
    return STK_OK;
}

/* With a device (docs/gpu.md): opens it and decides what the ring holds.
 * Batches must be dense. A float output is converted on the device: the
 * pipeline then writes uint8 HWC (a quarter of float32's bytes on the bus)
 * and the device applies the same math (ops/convert.h). */
static int setup_device(core *c, const stk_options *o, char *err, size_t errlen)
{
    static const char *const kinds[] = {"cpu", "cuda", "fake"};
    const char *kind = kinds[o->device];
    c->out_sample_bytes = c->sample_bytes;
    if (o->device == STK_DEVICE_CPU)
        return STK_OK;
    if (c->kind != STK_BATCH_DENSE) {
        stk__fmt(err, errlen,
                 "%s: device \"%s:%d\" needs batches of one shape (an image transform with a "
                 "fixed output size, or fixed-size records); this loader's samples vary in size",
                 o->source_shown, kind, o->device_id);
        return STK_EINVAL;
    }
    int rc = o->device == STK_DEVICE_CUDA ? stk__dev_open_cuda(&c->dev, o->device_id, err, errlen)
                                          : stk__dev_open_fake(&c->dev, o->device_id, err, errlen);
    if (rc)
        return rc;
    if (c->pipe && c->dtype != STK_DTYPE_UINT8) {
        if (o->device == STK_DEVICE_CUDA && !stk__cuda_device_has_kernel(c->dev)) {
            stk__fmt(err, errlen,
                     "%s: device \"cuda:%d\" with a float dtype needs stoker's CUDA conversion "
                     "kernel, which %s; use dtype uint8 and convert on the GPU yourself",
                     o->source_shown, o->device_id,
                     stk__cuda_have_kernels() ? "does not load on this GPU (architecture)"
                                              : "this build lacks (built without nvcc)");
            return STK_EUNSUPPORTED;
        }
        stk__imgpipe_convert(c->pipe, &c->cv);
        stk__imgpipe_set_host_uint8(c->pipe);
        c->convert = 1;
        c->sample_bytes = (size_t)c->cv.h * c->cv.w * 3;
    }
    return STK_OK;
}

static int start_device(core *c, char *err, size_t errlen)
{
    if (!c->dev)
        return STK_OK;
    stk__devstage_cfg cfg = {.dev = c->dev,
                             .slots = c->depth + 1,
                             .batch_size = c->batch_size,
                             .host_sample_bytes = c->sample_bytes,
                             .out_sample_bytes = c->out_sample_bytes,
                             .convert = c->convert,
                             .cv = c->cv,
                             .batches_per_epoch = c->part.batches,
                             .ctx = c,
                             .host_next = stage_host_next,
                             .host_release = stage_host_release};
    c->dev_bytes = stk__devstage_device_bytes(&cfg);
    if (!(c->dnodes = stk__calloc(cfg.slots, sizeof *c->dnodes))) {
        stk__fmt(err, errlen, "out of memory for the device batches' table entries");
        return STK_ENOMEM;
    }
    for (unsigned k = 0; k < cfg.slots; k++) {
        c->dnodes[k].next = c->dspare;
        c->dspare = &c->dnodes[k];
    }
    return stk__devstage_create(&c->dstage, &cfg, err, errlen);
}

/* The fetch stage's view of the future (pure functions of g and slot). */
static uint64_t plan_batch_len(void *ctx, uint64_t g)
{
    return batch_len_at(ctx, g);
}

static uint64_t plan_sample_at(void *ctx, uint64_t g, uint64_t slot)
{
    core *c = ctx;
    uint64_t epoch = g / c->part.batches;
    stk__order ord;
    stk__order_init(&ord, c->part.n, c->seed, epoch, c->shuffle);
    return sample_at(c, &ord, epoch, pos_at(c, g, slot));
}

/* For the cache's eviction: how many sample positions after global batch
 * g each shard is next read, from the shard-aware order's windows (this
 * epoch's, else the next one's). O(shards). */
static bool plan_next_uses(void *ctx, uint64_t g, uint64_t *next, size_t nshards)
{
    core *c = ctx;
    if (!c->sorder)
        return false;
    uint64_t epoch = g / c->part.batches;
    /* This rank's position in the epoch's global order (positions grow with
     * its samples; with several nodes, within its node's part of it). */
    uint64_t now = batch_len_at(c, g) ? pos_at(c, g, 0) : 0;
    for (size_t k = 0; k < nshards; k++)
        next[k] = UINT64_MAX;
    for (uint64_t e = epoch; e < epoch + 2; e++) {
        stk__shard_order *t;
        if (stk__shard_order_create(&t, c->src.shard_first, c->src.nshards, c->shard_window,
                                    c->seed, e, c->shuffle))
            return false;
        size_t nw = stk__shard_order_windows(t);
        for (size_t w = 0; w < nw; w++) {
            size_t sb, se;
            uint64_t pb, pe;
            stk__shard_order_window(t, w, &sb, &se, &pb, &pe);
            if (e == epoch && pe <= now)
                continue; /* this window is behind us */
            uint64_t ahead = e == epoch ? (pb > now ? pb - now : 0) : c->part.n - now + pb;
            for (size_t j = sb; j < se; j++) {
                size_t k = stk__shard_order_shard(t, j);
                if (k < nshards && next[k] == UINT64_MAX)
                    next[k] = ahead;
            }
        }
        stk__shard_order_destroy(t);
    }
    return true;
}

static int setup_fetch(core *c, const stk_options *o, char *err, size_t errlen)
{
    if (!c->src.remote || !c->src.ops->locate)
        return STK_OK;
    stk__fetch_plan plan = {c, c->batch_size, plan_batch_len, plan_sample_at, plan_next_uses};
    stk__fetch_cfg fc = {0};
    fc.buffer_bytes = o->fetch_buffer;
    fc.lookahead = o->fetch_lookahead;
    fc.threads = c->nthreads;
    fc.concurrency = o->fetch_concurrency ? o->fetch_concurrency : 64;
    fc.cache_dir = o->cache_dir;
    fc.cache_limit = o->cache_limit;
    int rc = stk__fetch_create(&c->fetch, &c->src, &plan, &fc, err, errlen);
    if (rc)
        return rc;
    stk__fetch_reset(c->fetch, 0);
    return STK_OK;
}

static int alloc_ring(core *c)
{
    size_t B = c->batch_size;
    if (c->sample_bytes && B > SIZE_MAX / c->sample_bytes)
        return STK_ETOOBIG;
    if (!(c->bufs = stk__calloc(c->nbufs, sizeof *c->bufs)) ||
        !(c->inflight = stk__calloc(c->nbufs, sizeof *c->inflight)))
        return STK_ENOMEM;
    for (unsigned k = 0; k < c->nbufs; k++) {
        buffer *b = &c->bufs[k];
        b->core = c;
        b->state = BUF_FREE;
        if (c->dev) {
            /* Page-locked, so the device copies straight from it. */
            char err[STK_ERRMSG_MAX];
            if (c->dev->ops->host_alloc(c->dev, B * c->sample_bytes, (void **)&b->data, err,
                                        sizeof err))
                return STK_ENOMEM;
        } else if (c->kind == STK_BATCH_VARIABLE) {
            /* Address space only: memory is used as samples are written. */
            if (!(b->data = stk__map(c->batch_memory)))
                return STK_ENOMEM;
        } else if (!(b->data = stk__malloc(B * c->sample_bytes))) {
            return STK_ENOMEM;
        }
        if (!(b->offsets = stk__malloc(B * sizeof *b->offsets)) ||
            !(b->lengths = stk__malloc(B * sizeof *b->lengths)) ||
            !(b->dims = stk__malloc(3 * B * sizeof *b->dims)) ||
            !(b->labels = stk__malloc(B * sizeof *b->labels)) ||
            !(b->indices = stk__malloc(B * sizeof *b->indices)) || !(b->ok = stk__malloc(B)))
            return STK_ENOMEM;
    }
    c->free_count = c->nbufs;
    return STK_OK;
}

static uint64_t memory_bound(const core *c, const stk_options *o)
{
    uint64_t B = c->batch_size;
    /* A variable batch's samples take at most batch_memory (sample_bytes is
     * 0 then); the arena gives back what a smaller batch leaves unused. */
    uint64_t per_batch = B * (c->sample_bytes + 8 + 8 + 12 + 8 + 8 + 1) + sizeof(buffer) +
                         (c->kind == STK_BATCH_VARIABLE ? c->batch_memory : 0);
    uint64_t per_thread = sizeof(worker);
    if (c->pipe)
        /* the encoded input, and the sub-image a restart-indexed JPEG's crop
         * decodes from (never larger than the input) */
        per_thread += 2 * o->max_input_bytes + o->scratch_bytes + o->jpeg_memory;
    return c->nbufs * per_batch + c->nthreads * per_thread + c->src.index_bytes + sizeof(core) +
           (uint64_t)MAX_KEPT_ERRORS *
               (sizeof(stk_sample_error) + NAME_MAX_BYTES + STK_ERRMSG_MAX) +
           /* raised failures the user has not reached (their records are in core) */
           (uint64_t)RAISED_MAX * (NAME_MAX_BYTES + STK_ERRMSG_MAX) +
           /* failures waiting in ring buffers for delivery */
           (uint64_t)c->nbufs * B * (sizeof(slot_err) + NAME_MAX_BYTES + STK_ERRMSG_MAX);
}

/* depth "auto": the deepest ring, up to AUTO_DEPTH_MAX batches ahead, whose
 * memory bound (with the fetch stage's buffer and the trace) fits the budget:
 * memory_budget, or a quarter of MemAvailable divided among the ranks of the
 * node (LOCAL_WORLD_SIZE). */
#define AUTO_DEPTH_MAX 8
static int choose_depth(core *c, const stk_options *o, char *err, size_t errlen)
{
    uint64_t budget = o->memory_budget;
    if (!budget) {
        const char *lws = getenv("LOCAL_WORLD_SIZE");
        unsigned long ranks = lws ? strtoul(lws, NULL, 10) : 1;
        budget = stk__mem_available() / 4 / (ranks ? ranks : 1);
        if (!budget)
            budget = (uint64_t)1 << 30; /* no /proc: 1 GiB */
    }
    uint64_t extra = 0;
    if (c->src.remote)
        extra += o->fetch_buffer ? o->fetch_buffer : (uint64_t)64 << 20;
    if (o->trace)
        extra += stk__trace_bytes(o->trace_events);
    unsigned best = 0;
    uint64_t need1 = 0;
    for (unsigned d = 1; d <= AUTO_DEPTH_MAX; d++) {
        c->nbufs = d + 1;
        uint64_t need = memory_bound(c, o) + extra;
        if (d == 1)
            need1 = need;
        if (need <= budget)
            best = d;
    }
    if (!best) {
        stk__fmt(err, errlen,
                 "%s: depth \"auto\" finds no depth within the memory budget of %llu bytes: "
                 "depth 1 needs %llu (batch %zu x %zu bytes a sample, %u threads); raise "
                 "memory_budget or lower batch_size",
                 o->source_shown, (unsigned long long)budget, (unsigned long long)need1, c->batch_size,
                 c->sample_bytes, c->nthreads);
        return STK_ETOOBIG;
    }
    c->depth = best;
    c->nbufs = best + 1;
    return STK_OK;
}

static int open_core(stk_loader *l, const stk_options *o)
{
    char *err = l->errmsg;
    size_t errlen = sizeof l->errmsg;
    int rc;
    core *c = stk__calloc(1, sizeof *c);
    if (!c) {
        stk__fmt(err, errlen, "out of memory while opening %s", o->source_shown);
        return STK_ENOMEM;
    }
    c->refs = 1;
    if (pthread_mutex_init(&c->lock, NULL) || stk__cond_init(&c->cond_work) ||
        stk__cond_init(&c->cond_ready) || stk__cond_init(&c->cond_idle)) {
        stk__free(c);
        stk__fmt(err, errlen, "cannot create locks");
        return STK_ENOMEM;
    }
    c->seed = o->seed;
    c->shuffle = o->shuffle;
    c->drop_last = o->drop_last;
    c->transform_hash = transform_hash(o);
    c->on_error = o->on_error;
    c->batch_size = o->batch_size;
    c->depth = o->depth;
    c->nbufs = o->depth + 1;
    c->nthreads = o->threads;
    if (!c->nthreads && (rc = stk__default_threads(&c->nthreads, err, errlen)))
        goto fail;
    /* Autotune starts with every worker and gives back what is not needed:
     * starting small would starve the first batches. */
    c->active = c->nthreads;
    c->autotune = o->autotune;
    c->at_t0 = stk__now_ns();
    c->at_min_ahead = UINT64_MAX;

    stk__remote_cfg rcfg = {.endpoint = o->endpoint,
                            .region = o->region,
                            .addressing = o->addressing,
                            .concurrency = o->fetch_concurrency,
                            .retries = o->fetch_retries,
                            .timeout_s = o->fetch_timeout};
    stk__source_params sp = {.record_bytes = o->record_bytes,
                             .header_bytes = o->header_bytes,
                             .label_bytes = o->label_bytes,
                             .remote = &rcfg,
                             .cache_dir = o->cache_dir,
                             .cache_limit = o->cache_limit};
    if ((rc = stk__source_open(&c->src, o->source, &sp, err, errlen)))
        goto fail;
    if ((rc = setup_output(c, o, err, errlen)) || (rc = setup_device(c, o, err, errlen)))
        goto fail;
    c->batch_memory = o->batch_memory;
    c->max_sample = o->max_sample_bytes;
    if (o->shard_order) {
        if (!c->src.nshards) {
            stk__fmt(err, errlen,
                     "%s: order \"shards\" needs a dataset of shards (.stk or .tar); this one "
                     "(%s) has none",
                     o->source_shown, c->src.ops->kind);
            rc = STK_EINVAL;
            goto fail;
        }
        c->shard_window = o->shard_window ? o->shard_window : 8;
        if ((rc = stk__shard_orders_init(&c->sorder, c->src.shard_first, c->src.nshards,
                                         c->shard_window, o->seed, o->shuffle)))
            goto fail;
    }
    if (o->local_world && (o->local_world > o->world || o->world % o->local_world)) {
        stk__fmt(err, errlen,
                 "local_world_size %u does not divide world_size %u: a world is a whole number "
                 "of nodes of local_world_size ranks each",
                 o->local_world, o->world);
        rc = STK_EINVAL;
        goto fail;
    }
    if ((rc = stk__partition_init(&c->part, c->src.count, o->rank, o->world, o->batch_size,
                                  o->drop_last))) {
        stk__fmt(err, errlen, "%s: %llu samples give rank %u of %u no batch of %zu samples%s",
                 o->source_shown, (unsigned long long)c->src.count, o->rank, o->world, o->batch_size,
                 o->drop_last ? " with drop_last" : "");
        goto fail;
    }
    if (o->local_world)
        c->part.local = o->local_world;
    if (o->depth_auto && (rc = choose_depth(c, o, err, errlen)))
        goto fail;
    /* Runs of slots amortise the claim lock; small enough that the threads
     * still share one batch. */
    c->run = c->batch_size / (4 * (size_t)c->nthreads);
    c->run = c->run < 1 ? 1 : c->run > 16 ? 16 : c->run;
    if ((rc = alloc_ring(c))) {
        if (c->kind == STK_BATCH_VARIABLE)
            stk__fmt(err, errlen, "cannot allocate %u ring buffers of %zu bytes (batch_memory)",
                     c->nbufs, c->batch_memory);
        else
            stk__fmt(err, errlen, "cannot allocate %u ring buffers of %zu x %zu bytes",
                     c->nbufs, c->batch_size, c->sample_bytes);
        goto fail;
    }
    if (!(c->workers = stk__calloc(c->nthreads, sizeof *c->workers))) {
        rc = STK_ENOMEM;
        goto fail;
    }
    for (unsigned k = 0; k < c->nthreads; k++) {
        worker *w = &c->workers[k];
        w->core = c;
        w->id = k;
        w->in.limit = o->max_input_bytes;
        w->dec.limit = o->scratch_bytes;
    }
    if ((rc = setup_fetch(c, o, err, errlen)) || (rc = start_device(c, err, errlen)))
        goto fail;
    c->memory_bound = memory_bound(c, o) + c->dev_bytes;
    if (c->fetch)
        c->memory_bound += stk__fetch_memory_bound(c->fetch);
    if (o->trace) {
        if ((rc = stk__trace_create(&c->trace, o->trace, c->nthreads + 1, o->trace_events, err,
                                    errlen)))
            goto fail;
        c->memory_bound += stk__trace_bytes(o->trace_events);
    }
    for (unsigned k = 0; k < c->nthreads; k++) {
        if (pthread_create(&c->workers[k].th, NULL, worker_main, &c->workers[k])) {
            stk__fmt(err, errlen, "cannot start worker thread %u: %s", k, strerror(errno));
            rc = STK_ENOMEM;
            stop_workers(c);
            goto fail;
        }
        c->workers[k].started = true;
    }
    l->c = c;
    return STK_OK;
fail:
    if (rc == STK_ENOMEM && !err[0])
        stk__fmt(err, errlen, "out of memory while opening %s", o->source_shown);
    core_free(c);
    return rc;
}

int stk_loader_open(stk_loader **out, const stk_options *o)
{
    if (!out)
        return STK_EINVAL;
    stk_loader *l = stk__calloc(1, sizeof *l);
    *out = l;
    if (!l)
        return STK_ENOMEM;
    l->pid = getpid();
    int rc;
    if (!o || !o->source) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "no source: set one with stk_options_set_source");
        rc = STK_EINVAL;
    } else {
        rc = open_core(l, o);
    }
    l->status = rc;
    return rc;
}

_Static_assert(NSTAGES == STK_STAGE_PROCESS + 1, "NSTAGES counts every enum stk_stage");

int stk_stage_count(void)
{
    return NSTAGES;
}

const char *stk_stage_name(int stage)
{
    switch (stage) {
    case STK_STAGE_READ: return "read";
    case STK_STAGE_PROCESS: return "process";
    default: return "?";
    }
}
