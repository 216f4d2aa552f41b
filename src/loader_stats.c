/*
 * loader_stats.c -- stk_loader_info, statistics and the error accessors.
 */
#include "loader_core.h"

#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* Copies a result struct the library filled in full (`full`, `size` bytes,
 * struct_size first) into the caller's `out`, whose struct_size says how large
 * the caller's version is: the common prefix is copied, a tail the library
 * does not know is zeroed, and struct_size becomes the bytes filled. `min` is
 * the size of the struct's first version. */
int stk__put_sized(stk_loader *l, const char *type, void *out, const void *full, size_t size,
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

int stk_loader_info(stk_loader *l, stk_info *info)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    core *c = l->c;
    stk_info in = {.struct_size = sizeof in};
    in.num_samples = c->src.count;
    in.samples_per_epoch = c->sched.part.per_rank;
    in.batches_per_epoch = c->sched.part.batches;
    in.num_classes = c->src.num_classes;
    in.threads = c->nthreads;
    in.depth = c->ring.depth;
    in.batch_size = c->batch_size;
    in.kind = c->kind;
    in.source_kind = c->src.ops->kind;
    in.ring_buffers = c->ring.nbufs;
    return stk__put_sized(l, "stk_info", info, &in, sizeof in, INFO_V1);
}

const char *stk_loader_class_name(stk_loader *l, uint64_t c)
{
    return stk__check_handle(l) ? NULL : stk__source_class_name(&l->c->src, c);
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
    return stk__put_sized(l, "stk_stage_stats", out, &s, sizeof s, STAGE_V1);
}

int stk_loader_stage_stats(stk_loader *l, int stage, stk_stage_stats *out)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    return stage_sum(l, stage, 0, l->c->nthreads, out);
}

int stk_loader_thread_stats(stk_loader *l, unsigned thread, int stage, stk_stage_stats *out)
{
    int rc = stk__check_handle(l);
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
    int rc = stk__check_handle(l);
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
    s.threads_active = c->ring.at.active;
    pthread_mutex_unlock(&c->lock);
    if (c->dstage)
        stk__devstage_delivered(c->dstage, &s.batches_delivered, &s.samples_delivered);
    s.threads_max = c->nthreads;
    s.memory_bound_bytes = c->memory_bound;
    s.device_memory_bytes = c->dev_bytes;
    return stk__put_sized(l, "stk_stats", st, &s, sizeof s, STATS_V1);
}

int stk_loader_fetch_stats(stk_loader *l, stk_fetch_stats *st)
{
    int rc = stk__check_handle(l);
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
                            .cache_dropped = f.cache_dropped,
                            .throttled = f.throttled,
                            .rate_limit = f.rate,
                            .hedges = f.hedges,
                            .hedge_wins = f.hedge_wins,
                            .cache_partial_reads = f.cache_partial_reads,
                            .cache_cold_ranged = f.cache_cold_ranged,
                            .cache_download_parts = f.cache_download_parts};
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
    if (stk__check_handle(l))
        return 0;
    pthread_mutex_lock(&l->c->lock);
    size_t n = l->c->nerrors;
    pthread_mutex_unlock(&l->c->lock);
    return n;
}

int stk_loader_error_get(stk_loader *l, size_t i, stk_sample_error *e)
{
    int rc = stk__check_handle(l);
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
    int rc = stk__check_handle(l);
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
        .field = r && r->field ? r->field : "",
        .message = l->errmsg,
    };
    return stk__put_sized(l, "stk_error_info", info, &full, sizeof full, ERRINFO_V1);
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

size_t stk_loader_num_sources(stk_loader *l)
{
    return stk__check_handle(l) ? 0 : l->c->nsrc;
}

int stk_loader_source_stats(stk_loader *l, size_t source, uint64_t *samples, uint64_t *failed)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    core *c = l->c;
    if (source >= c->nsrc || !samples || !failed) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "source %zu: this loader has %zu mixture sources",
                 source, c->nsrc);
        return STK_EINVAL;
    }
    pthread_mutex_lock(&c->lock);
    *samples = c->src_samples[source];
    *failed = c->src_failed[source];
    pthread_mutex_unlock(&c->lock);
    return STK_OK;
}

int stk_loader_sample_source(stk_loader *l, uint64_t index, size_t *source, uint64_t *local)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    const stk__mix *m = l->c->sched.mix;
    if (!m || !source || !local || index >= m->offset[m->nsrc])
        return STK_EINVAL;
    /* The mixture is read-only after open: no lock. */
    *source = stk__mix_source_of(m, index);
    *local = index - m->offset[*source];
    return STK_OK;
}
