/*
 * loader_next.c -- the consumer's side of the loader: the next batch in
 * order from the ring (or from the device stage's copy thread, which takes
 * host batches through stk__loader_stage_host_next), the result a call
 * leaves on the handle, and a held batch's release and device waits. The
 * ring's protocol is in ring/ring.h.
 */
#include "loader_core.h"
#include "ring/ring.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ---- consumer ------------------------------------------------------------- */

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
        if (c->ring.deliver_g == (c->cur_epoch + 1) * c->sched.part.batches) {
            c->cur_epoch++;
            rc = STK_END;
            break;
        }
        uint64_t g = c->ring.deliver_g;
        buffer *b = stk__ring_ready(c);
        if (b) {
            stk__errors_follow(c, g / c->sched.part.batches);
            if (b->failed && !b->reported) {
                b->reported = true;
                if (c->on_error == STK_ON_ERROR_RAISE) {
                    stk__raise_batch(c, b, g, err, errlen);
                    stk__errors_record(c, b);
                    c->failed += b->failed;
                    rc = STK_ESAMPLE;
                    break;
                }
                stk__errors_record(c, b);
                c->skipped += b->failed;
            }
            if (c->sched.mix) {
                for (size_t k = 0; k < b->size; k++) {
                    size_t src = stk__mix_source_of(c->sched.mix, b->indices[k]);
                    if (b->ok[k])
                        c->src_samples[src]++;
                    else
                        c->src_failed[src]++;
                }
            }
            stk__slot_errs_free(b->errs);
            b->errs = NULL;
            stk__ring_deliver(c, b);
            c->delivered_batches++;
            c->delivered_samples += b->size - b->failed;
            pub = b;
            rc = STK_OK;
            break;
        }
        if (g >= c->ring.assigned_end_g && c->ring.free_count == 0) {
            stk__fmt(err, errlen,
                     "all %u ring buffers are held by the consumer; release a batch before "
                     "asking for the next, or raise depth",
                     c->ring.nbufs);
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
    stk__ring_autotune(c, end, blocked_since ? end - blocked_since : 0, rc == STK_OK);
    if (c->trace && user)
        stk__trace_event(c->trace, 0, STK__TR_NEXT, start, end, c->ring.deliver_g - (pub != NULL),
                         rc == STK_OK        ? 0
                         : rc == STK_END     ? 1
                         : rc == STK_TIMEOUT ? 2
                                             : 3,
                         0);
    pthread_mutex_unlock(&c->lock);
    if (pub) {
        stk__ring_publish(c, pub);
        *out = &pub->view;
        /* The user's, until stk_batch_release; the copy thread's batches
         * never leave the library. */
        if (user)
            (void)stk__held_put(&pub->hnode, NULL, &pub->view);
    }
    return rc;
}

/* The device stage's view of the ring. */
int stk__loader_stage_host_next(void *ctx, stk_batch **out, uint64_t timeout_ns, char *err,
                                size_t errlen)
{
    return host_next(ctx, out, timeout_ns, err, errlen, false);
}

void stk__loader_stage_host_release(void *ctx, stk_batch *b)
{
    (void)ctx;
    stk__ring_release((buffer *)(void *)b);
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
    if (rc == STK_OK && !stk__held_put(NULL, &c->dspare, *out)) {
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
        c->cons_g = (*out)->epoch * c->sched.part.batches + (*out)->index + 1;
    } else if (rc == STK_END) {
        c->cons_epoch++;
    }
    if (c->trace)
        stk__trace_event(c->trace, 0, STK__TR_NEXT, start, end, c->cons_g - (rc == STK_OK),
                         rc == STK_OK        ? 0
                         : rc == STK_END     ? 1
                         : rc == STK_TIMEOUT ? 2
                                             : 3,
                         0);
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
    stk__raised_free(&l->last);
    l->last_code = rc;
    if (rc != STK_ESAMPLE)
        return;
    pthread_mutex_lock(&c->lock);
    uint64_t g = stk__user_g(c);
    for (unsigned k = c->nraised; k-- > 0;) {
        if (c->raised[k].g == g) {
            l->last = c->raised[k];
            c->raised[k] = (raised){.g = g};
            break;
        }
    }
    stk__raised_prune(c, g + 1);
    pthread_mutex_unlock(&c->lock);
}

static int next_impl(stk_loader *l, stk_batch **out, uint64_t timeout_ns)
{
    int rc = stk__check_handle(l);
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
    if (!stk__held_find(bv, true))
        return STK_EMISUSE;
    if (bv->device == STK_DEVICE_CPU) {
        stk__ring_release((buffer *)(void *)bv);
        return STK_OK;
    }
    core *c = stk__devstage_release(bv, stream);
    if (!c)
        return STK_EMISUSE; /* not held by the stage (cannot be, once found) */
    pthread_mutex_lock(&c->lock);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (last)
        stk__core_free(c);
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
    if (!stk__held_find(b, false))
        return STK_EMISUSE;
    return b->device == STK_DEVICE_CPU ? STK_OK : stk__devstage_wait(b, stream);
}

int stk_batch_record_stream(stk_batch *b, void *stream)
{
    if (!b)
        return STK_EINVAL;
    if (!stk__held_find(b, false))
        return STK_EMISUSE;
    return b->device == STK_DEVICE_CPU ? STK_OK : stk__devstage_record_stream(b, stream);
}

int stk_batch_sync(stk_batch *b)
{
    if (!b)
        return STK_EINVAL;
    if (!stk__held_find(b, false))
        return STK_EMISUSE;
    return b->device == STK_DEVICE_CPU ? STK_OK : stk__devstage_sync(b);
}
