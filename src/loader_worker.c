/*
 * loader_worker.c -- the worker threads: claim a run of slots from the ring, ask the
 * schedule which sample sits at each, read and transform it into the slot.
 */
#include "loader_core.h"
#include "ring/ring.h"

#include <string.h>

static void stage_add(worker *w, int stage, uint64_t ns)
{
    atomic_fetch_add_explicit(&w->items[stage], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->ns[stage], ns, memory_order_relaxed);
}

/* Makes one sample: read its bytes, transform them into slot `s` of b.
 * Returns the error (with a slot_err appended to *errs) or STK_OK. */
static int make_sample(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch, slot_err **errs)
{
    core *c = w->core;
    char err[STK_ERRMSG_MAX];
    err[0] = '\0';
    const bool variable = c->kind == STK_BATCH_VARIABLE;
    uint8_t *slot = variable ? NULL : b->data + s * c->sample_bytes;
    arena_req ar = {c, b};
    stk__sink arena = {.alloc = stk__ring_arena_alloc, .ctx = &ar};
    stk__sink sink = {slot, c->sample_bytes, c->pipe ? &w->in : NULL, NULL, NULL, ""};
    stk__sink *rsink = variable && !c->pipe ? &arena : &sink;
    if (c->nfplan) /* all the sample's fields, into the thread's scratch */
        sink = (stk__sink){NULL, 0, &w->in, NULL, NULL, ""}, rsink = &sink;
    const char *field = NULL;
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
    if (rc == STK_OK && c->nfplan) {
        rc = stk__fields_make(w, b, s, i, epoch, bytes, len, label, err, sizeof err, &field);
        uint64_t t2 = stk__now_ns();
        stage_add(w, STK_STAGE_PROCESS, t2 - t1);
        if (c->trace)
            stk__trace_event(c->trace, 1 + w->id, STK__TR_PROCESS, t1, t2, i, b->g, (uint32_t)s);
    } else if (rc == STK_OK && c->pipe) {
        stk__rng rng = stk__rng_for(c->sched.seed, epoch, i);
        /* Into the dense slot, or exactly the bytes the image needs from
         * the variable batch's arena. */
        stk__sink slot_sink = {slot, c->sample_bytes, NULL, NULL, NULL, ""};
        stk__imgpipe_result res;
        rc = stk__imgpipe_run_sink(stk__pipe_for(c, i), bytes, len, &rng, &w->dec,
                                   variable ? &arena : &slot_sink, &res, err, sizeof err);
        out = res.out;
        len = res.len;
        memcpy(dims, res.dims, sizeof dims);
        uint64_t t2 = stk__now_ns();
        stage_add(w, STK_STAGE_PROCESS, t2 - t1);
        if (c->trace) {
            uint64_t td = res.decoded_at;
            if (td >= t1 && td <= t2) {
                stk__trace_event(c->trace, 1 + w->id, STK__TR_DECODE, t1, td, i, b->g, (uint32_t)s);
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
    if (c->nfplan) {
        /* the fields set the primary image's entries themselves */
        if (rc != STK_OK)
            b->offsets[s] = b->lengths[s] = 0;
    } else {
        if (variable)
            b->offsets[s] = rc == STK_OK ? (uint64_t)(out - b->data) : 0;
        b->lengths[s] = rc == STK_OK ? len : 0;
        memcpy(&b->dims[3 * s], dims, sizeof dims);
    }
    b->labels[s] = label;
    b->indices[s] = i;
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
            e->field = field ? stk__strdup(field) : NULL;
            e->next = *errs;
            *errs = e;
        }
    }
    return rc;
}

void *stk__worker_main(void *arg)
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
    while (stk__ring_claim(c, w, &b, &g, &slot0, &count)) {
        pthread_mutex_unlock(&c->lock);

        uint64_t epoch = g / c->sched.part.batches;
        stk__order ord;
        stk__order_init(&ord, c->sched.part.n, c->sched.seed, epoch, c->sched.shuffle);
        slot_err *errs = NULL;
        size_t nfailed = 0;
        for (size_t s = slot0; s < slot0 + count; s++) {
            uint64_t pos = stk__schedule_pos(&c->sched, g, s);
            uint64_t draw;
            uint64_t i = stk__schedule_sample_draw(&c->sched, &ord, epoch, pos, &draw);
            if (make_sample(w, b, s, i, draw, &errs) != STK_OK)
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
        stk__ring_unclaim(c);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}
