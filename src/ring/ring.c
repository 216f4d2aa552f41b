/*
 * ring.c -- the ring of batch buffers: see ring.h.
 */
#include "ring/ring.h"

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
                atomic_store_explicit(&b->fused, 0, memory_order_relaxed);
                b->g = c->assigned_end_g;
                b->size = stk__schedule_batch_len(&c->sched, b->g);
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
void stk__ring_autotune(core *c, uint64_t now)
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
    c->free_count++;
    bool last = --c->refs == 0;
    pthread_cond_broadcast(&c->cond_work);
    pthread_mutex_unlock(&c->lock);
    if (last)
        stk__core_free(c);
}

/* Frees the ring's buffers (with a device, its page-locked memory). */
void stk__ring_free(core *c)
{
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
            stk__slot_errs_free(b->errs);
            stk__fields_ring_free(c, b);
        }
    }
    stk__free(c->bufs);
    stk__free(c->inflight);
}

/* Frees the buffers being filled and forgets the batches in flight (seek,
 * with no worker in a slot). Lock held. */
void stk__ring_drop_filling(core *c)
{
    for (unsigned k = 0; k < c->nbufs; k++) {
        buffer *b = &c->bufs[k];
        if (b->state == BUF_FILLING) {
            b->state = BUF_FREE;
            c->free_count++;
            stk__slot_errs_free(b->errs);
            b->errs = NULL;
        }
        c->inflight[k] = NULL;
    }
}

int stk__ring_alloc(core *c)
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
    c->free_count = c->nbufs;
    return STK_OK;
}
