/*
 * ring.c -- the ring of batch buffers: see ring.h.
 */
#include "ring/ring.h"

#include "loader_core.h"

#include <string.h>

/* A variable sample's memory: exactly n bytes (rounded up to 64) from its
 * batch's arena, or STK_ETOOBIG with the numbers. Lock-free: the workers of
 * one batch take their ranges with a compare-and-swap. */
uint8_t *stk__ring_arena_alloc(stk__sink *s, size_t n, int *rc)
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
                     (unsigned long long)(b->g % c->sched.part.batches),
                     (unsigned long long)(b->g / c->sched.part.batches), c->batch_memory, off, n);
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

/* Takes the next run of slots to fill. Called and returns with c->lock held.
 * Returns false when the loader is closing. */
bool stk__ring_claim(core *c, const worker *w, buffer **bo, uint64_t *g, size_t *slot0,
                     size_t *count)
{
    stk__ring *r = &c->ring;
    for (;;) {
        if (c->cancel)
            return false;
        if (!c->seeking && w->id < r->at.active) {
            if (r->claim_g < r->assigned_end_g) {
                buffer *b = r->inflight[r->claim_g % r->nbufs];
                /* Guided sizes: runs shrink as the batch runs out, so the
                 * threads finish a batch together instead of one idling
                 * while another works through a long last run (which
                 * matters when no buffer is free for the next batch). */
                size_t left = b->size - r->claim_slot;
                size_t k = left / (2 * (size_t)r->at.active);
                k = k < 1 ? 1 : k > r->run ? r->run : k;
                *bo = b;
                *g = r->claim_g;
                *slot0 = r->claim_slot;
                *count = k;
                r->claim_slot += k;
                if (r->claim_slot == b->size) {
                    r->claim_g++;
                    r->claim_slot = 0;
                }
                r->busy++;
                return true;
            }
            if (r->claim_g < r->deliver_g + r->nbufs && r->free_count > 0) {
                /* free_count > 0 guarantees a FREE buffer exists. */
                unsigned f = 0;
                while (r->bufs[f].state != BUF_FREE)
                    f++;
                buffer *b = &r->bufs[f];
                b->state = BUF_FILLING;
                atomic_store_explicit(&b->vused, 0, memory_order_relaxed);
                atomic_store_explicit(&b->fused, 0, memory_order_relaxed);
                b->g = r->assigned_end_g;
                b->size = stk__schedule_batch_len(&c->sched, b->g);
                b->filled = b->failed = 0;
                b->reported = false;
                r->inflight[b->g % r->nbufs] = b;
                r->assigned_end_g++;
                r->free_count--;
                continue;
            }
        }
        stk__cond_wait_ns(&c->cond_work, &c->lock, WAIT_SLICE_NS);
    }
}

/* The worker is done with its claimed slots. Lock held. */
void stk__ring_unclaim(core *c)
{
    if (--c->ring.busy == 0 && c->seeking)
        pthread_cond_broadcast(&c->cond_idle);
}

/* The next batch in order if all its slots are filled. Lock held. */
buffer *stk__ring_ready(const core *c)
{
    const stk__ring *r = &c->ring;
    uint64_t g = r->deliver_g;
    buffer *b = g < r->assigned_end_g ? r->inflight[g % r->nbufs] : NULL;
    return b && b->filled == b->size ? b : NULL;
}

/* Hands the ready batch to the consumer. Lock held. */
void stk__ring_deliver(core *c, buffer *b)
{
    stk__ring *r = &c->ring;
    r->inflight[r->deliver_g % r->nbufs] = NULL;
    r->deliver_g++;
    b->state = BUF_HELD;
    c->refs++;
    pthread_cond_broadcast(&c->cond_work);
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
void stk__ring_publish(core *c, buffer *b)
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
    v->epoch = b->g / c->sched.part.batches;
    v->index = b->g % c->sched.part.batches;
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
    stk__fields_publish(c, b);
}

/* ---- autotune ------------------------------------------------------------- */

#define AT_WINDOW_NS (200ull * 1000 * 1000) /* at least this long per decision */
#define AT_STARVED   0.02                   /* waited over 2 % of a window: add a worker */
#define AT_CALM      0.005                  /* under 0.5 %, with batches to spare: */
#define AT_CALM_RUNS 3                      /* ... this many windows in a row: drop one */

/* Batches completely filled and waiting after the one at deliver_g. Lock held. */
static uint64_t ready_ahead(const core *c)
{
    uint64_t n = 0;
    for (uint64_t g = c->ring.deliver_g; g < c->ring.assigned_end_g; g++) {
        const buffer *b = c->ring.inflight[g % c->ring.nbufs];
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
    stk__autotune *a = &c->ring.at;
    uint64_t ahead = ready_ahead(c);
    if (ahead < a->min_ahead)
        a->min_ahead = ahead;
    uint64_t dt = now - a->t0;
    if (dt < AT_WINDOW_NS || c->delivered_batches - a->b0 < 2)
        return;
    double starved = (double)a->blocked / (double)dt;
    if (starved > AT_STARVED && a->active < c->nthreads) {
        a->active++;
        a->calm = 0;
        pthread_cond_broadcast(&c->cond_work);
    } else if (starved < AT_CALM && a->min_ahead >= 1) {
        if (++a->calm >= AT_CALM_RUNS && a->active > 1) {
            a->active--;
            a->calm = 0;
        }
    } else {
        a->calm = 0;
    }
    a->t0 = now;
    a->blocked = 0;
    a->b0 = c->delivered_batches;
    a->min_ahead = UINT64_MAX;
}

void stk__ring_autotune(core *c, uint64_t now, uint64_t blocked_ns, bool delivered)
{
    c->ring.at.blocked += blocked_ns;
    if (c->ring.at.on && delivered)
        autotune_step(c, now);
}

void stk__ring_autotune_init(stk__ring *r, bool on, unsigned nthreads, uint64_t now)
{
    r->at.on = on;
    r->at.active = nthreads;
    r->at.t0 = now;
    r->at.min_ahead = UINT64_MAX;
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

void stk__ring_release(buffer *b)
{
    core *c = b->core;
    pthread_mutex_lock(&c->lock);
    if (b->state != BUF_HELD) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    if (c->kind == STK_BATCH_VARIABLE || b->farena) {
        /* Compacted outside the lock (madvise): no worker touches a buffer
         * that is not free, and a second release sees RELEASING. */
        b->state = BUF_RELEASING;
        pthread_mutex_unlock(&c->lock);
        arena_compact(c, b);
        stk__fields_release(c, b);
        pthread_mutex_lock(&c->lock);
    }
    b->state = BUF_FREE;
    c->ring.free_count++;
    bool last = --c->refs == 0;
    pthread_cond_broadcast(&c->cond_work);
    pthread_mutex_unlock(&c->lock);
    if (last)
        stk__core_free(c);
}

/* Frees the ring's buffers (with a device, its page-locked memory). */
void stk__ring_free(core *c)
{
    if (c->ring.bufs) {
        for (unsigned k = 0; k < c->ring.nbufs; k++) {
            buffer *b = &c->ring.bufs[k];
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
            stk__slot_errs_free(b->errs);
            stk__fields_ring_free(c, b);
        }
    }
    stk__free(c->ring.bufs);
    stk__free(c->ring.inflight);
}

/* Frees the buffers being filled, forgets the batches in flight and moves
 * the cursors to g (seek, with no worker in a slot). Lock held. */
void stk__ring_seek(core *c, uint64_t g)
{
    for (unsigned k = 0; k < c->ring.nbufs; k++) {
        buffer *b = &c->ring.bufs[k];
        if (b->state == BUF_FILLING) {
            b->state = BUF_FREE;
            c->ring.free_count++;
            stk__slot_errs_free(b->errs);
            b->errs = NULL;
        }
        c->ring.inflight[k] = NULL;
    }
    c->ring.claim_g = c->ring.assigned_end_g = c->ring.deliver_g = g;
    c->ring.claim_slot = 0;
}

void stk__ring_set_depth(stk__ring *r, unsigned depth)
{
    r->depth = depth;
    r->nbufs = depth + 1;
}

int stk__ring_alloc(core *c)
{
    size_t B = c->batch_size;
    /* Runs of slots amortise the claim lock; small enough that the threads
     * still share one batch. */
    c->ring.run = B / (4 * (size_t)c->nthreads);
    c->ring.run = c->ring.run < 1 ? 1 : c->ring.run > 16 ? 16 : c->ring.run;
    if (c->sample_bytes && B > SIZE_MAX / c->sample_bytes)
        return STK_ETOOBIG;
    if (!(c->ring.bufs = stk__calloc(c->ring.nbufs, sizeof *c->ring.bufs)) ||
        !(c->ring.inflight = stk__calloc(c->ring.nbufs, sizeof *c->ring.inflight)))
        return STK_ENOMEM;
    for (unsigned k = 0; k < c->ring.nbufs; k++) {
        buffer *b = &c->ring.bufs[k];
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
        } else if (!(b->data = stk__malloc(c->sample_bytes ? B * c->sample_bytes : 1))) {
            return STK_ENOMEM; /* (fields without an image: no pixels) */
        }
        if (!(b->offsets = stk__malloc(B * sizeof *b->offsets)) ||
            !(b->lengths = stk__malloc(B * sizeof *b->lengths)) ||
            !(b->dims = stk__malloc(3 * B * sizeof *b->dims)) ||
            !(b->labels = stk__malloc(B * sizeof *b->labels)) ||
            !(b->indices = stk__malloc(B * sizeof *b->indices)) || !(b->ok = stk__malloc(B)))
            return STK_ENOMEM;
        int rc = stk__fields_ring_alloc(c, b);
        if (rc)
            return rc;
    }
    c->ring.free_count = c->ring.nbufs;
    return STK_OK;
}
