/*
 * loader_errors.c -- failed samples: the per-batch lists the workers fill, the epoch's kept list
 * (stk_loader_error_get) and the raised failures (stk_loader_last_error).
 */
#include "loader_core.h"

#include <string.h>

void stk__slot_errs_free(slot_err *e)
{
    while (e) {
        slot_err *n = e->next;
        stk__free(e->name);
        stk__free(e->reason);
        stk__free(e->field);
        stk__free(e);
        e = n;
    }
}

/* Empties the kept error list (its array stays for reuse). */
void stk__errors_clear(core *c)
{
    for (size_t k = 0; k < c->nerrors; k++) {
        stk__free((void *)(uintptr_t)c->errors[k].path);
        stk__free((void *)(uintptr_t)c->errors[k].reason);
    }
    c->nerrors = 0;
}

void stk__raised_free(raised *r)
{
    stk__free(r->path);
    stk__free(r->reason);
    stk__free(r->field);
    *r = (raised){0};
}

/* Drops the raised failures of batches before position `keep_from`. Lock
 * held (or the core is being freed). */
void stk__raised_prune(core *c, uint64_t keep_from)
{
    unsigned n = 0;
    for (unsigned k = 0; k < c->nraised; k++) {
        if (c->raised[k].g < keep_from)
            stk__raised_free(&c->raised[k]);
        else
            c->raised[n++] = c->raised[k];
    }
    c->nraised = n;
}

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
void stk__errors_follow(core *c, uint64_t epoch)
{
    if (epoch != c->errors_epoch) {
        stk__errors_clear(c);
        c->errors_epoch = epoch;
    }
}

/* Moves a delivered batch's failures into the loader's error list, in slot
 * order; batches are delivered in order, so the list keeps the first
 * MAX_KEPT_ERRORS failures of the epoch in sample order. Lock held. */
void stk__errors_record(core *c, buffer *b)
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
        se->epoch = b->g / c->sched.part.batches;
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
uint64_t stk__user_g(const core *c)
{
    return c->dstage ? c->cons_g : c->ring.deliver_g;
}

/* Reports batch b at position g under the raise policy: keeps its first
 * failure (the lowest slot, as errors go in sample order) in structure, and
 * writes the message from that same record. Before stk__errors_record(), which
 * takes the slot errors' strings. Lock held. */
void stk__raise_batch(core *c, const buffer *b, uint64_t g, char *err, size_t errlen)
{
    /* Failures of batches the user has passed were dropped by a seek. */
    stk__raised_prune(c, stk__user_g(c));
    if (c->nraised == RAISED_MAX) {
        stk__raised_free(&c->raised[0]);
        memmove(&c->raised[0], &c->raised[1], (RAISED_MAX - 1) * sizeof c->raised[0]);
        c->nraised--;
    }
    const slot_err *e = first_err(b);
    raised *r = &c->raised[c->nraised++];
    *r = (raised){
        .g = g, .epoch = g / c->sched.part.batches, .nfailed = b->failed, .known = e != NULL};
    if (e) {
        /* If these copies fail, the failure is still reported by index. */
        r->sample = e->sample;
        r->code = e->code;
        r->path = e->name ? stk__strdup(e->name) : NULL;
        r->reason = e->reason ? stk__strdup(e->reason) : NULL;
        r->field = e->field ? stk__strdup(e->field) : NULL;
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
                 (unsigned long long)(g % c->sched.part.batches), (unsigned long long)r->epoch,
                 tail);
}
