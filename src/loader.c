/*
 * loader.c -- the engine: a fixed pool of worker threads fills a ring of
 * depth + 1 batch buffers (ring/ring.h: its states, cursors and protocol),
 * and one consumer takes complete batches strictly in order.
 *
 * Every sample's output depends only on (seed, epoch, sample index), never on
 * which thread made it or when, so batches are bit-identical for any thread
 * count and depth.
 *
 * Lifetime: the shared `core` is reference-counted by the loader handle and by
 * each held batch, so batches stay valid after stk_loader_close().
 *
 * This file keeps open, close, seek and the wiring; the consumer's side
 * (next, release, the device's waits) is loader_next.c; the parts live in
 * schedule/ (which sample sits at each position), ring/ (buffer states,
 * claim, publish, arenas, autotune), loader_worker.c, loader_errors.c,
 * loader_held.c, loader_next.c, loader_state.c, loader_stats.c and loader_mix.c (a
 * mixture's setup; loader_core.h: the shared state). docs/architecture.md draws the whole.
 */
#include "loader_core.h"
#include "ring/ring.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void stk__core_free(core *c)
{
    stk__raised_prune(c, UINT64_MAX);
    /* The device stage first: it waits for the copies that read the ring. */
    stk__devstage_destroy(c->dstage);
    stk__ring_free(c);
    stk__free(c->dnodes);
    stk__free(c->devfields);
    if (c->workers) {
        for (unsigned k = 0; k < c->nthreads; k++) {
            stk__scratch_free(&c->workers[k].in);
            stk__scratch_free(&c->workers[k].dec);
        }
    }
    stk__free(c->workers);
    stk__errors_clear(c);
    stk__free(c->errors);
    stk__imgpipe_destroy(c->pipe);
    /* (before the plan, which says how many fields there are) */
    for (size_t k = 0; c->src_fpipes && k < c->nsrc * c->nfplan; k++)
        stk__imgpipe_destroy(c->src_fpipes[k]);
    stk__free(c->src_fpipes);
    stk__fields_free(c);
    /* Closing the source closes its store, which completes the fetch
     * stage's requests still in flight; only then can the stage go. */
    stk__fetch_cancel(c->fetch);
    stk__source_close(&c->src);
    stk__fetch_destroy(c->fetch);
    stk__schedule_free(&c->sched);
    stk__free(c->src_samples);
    stk__free(c->src_failed);
    for (size_t k = 0; c->src_pipes && k < c->nsrc; k++)
        stk__imgpipe_destroy(c->src_pipes[k]);
    stk__free(c->src_pipes);
    stk__trace_destroy(c->trace);
    stk__dev_close(c->dev);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond_work);
    pthread_cond_destroy(&c->cond_ready);
    pthread_cond_destroy(&c->cond_idle);
    stk__free(c);
}

int stk__check_handle(stk_loader *l)
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

/* Moves the production cursor to batch `batch` of `epoch`, dropping work
 * prefetched elsewhere. Waits for workers to leave the slots they write. */
static void seek_to(core *c, uint64_t epoch, uint64_t batch, stk__resumed *lay, bool set_lay)
{
    uint64_t target = epoch * c->sched.part.batches + batch;
    bool dev_paused = false;
    if (c->dstage) {
        /* The copy thread is ahead of the user: unless the user is already
         * there, stop it and drop what it queued, then move the ring. */
        pthread_mutex_lock(&c->lock);
        const stk__resumed *cur = stk__schedule_resumed(&c->sched);
        bool here = target == c->cons_g && epoch == c->cons_epoch && !(set_lay && lay != cur);
        pthread_mutex_unlock(&c->lock);
        if (here)
            return;
        stk__devstage_pause(c->dstage);
        dev_paused = true;
    }
    pthread_mutex_lock(&c->lock);
    const stk__resumed *cur = stk__schedule_resumed(&c->sched);
    if (dev_paused || target != c->ring.deliver_g || epoch != c->cur_epoch ||
        (set_lay && lay != cur)) {
        c->seeking = true;
        /* Reads of the batches being dropped stop waiting on the network
         * (their failures are dropped with the batches); reset resumes. */
        if (c->fetch)
            stk__fetch_interrupt(c->fetch);
        while (c->ring.busy)
            stk__cond_wait_ns(&c->cond_idle, &c->lock, WAIT_SLICE_NS);
        stk__ring_seek(c, target);
        if (set_lay) {
            /* Workers are out of their slots (busy is 0) and no batch is
             * being assigned: the new layout takes effect from here. */
            stk__schedule_resume(&c->sched, lay);
        }
        c->cur_epoch = epoch;
        /* Lock order: loader lock, then the fetch stage's (which never
         * calls back into the loader). */
        if (c->fetch)
            stk__fetch_reset(c->fetch, target);
        /* The epoch (re)starts here: its failures are listed afresh. */
        stk__errors_clear(c);
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

/* For loader_state.c (see loader_core.h). */
void stk__seek_to(core *c, uint64_t epoch, uint64_t batch, stk__resumed *lay, bool set_lay)
{
    seek_to(c, epoch, batch, lay, set_lay);
}

/* Moves the production cursor to batch `batch` of `epoch` under the normal
 * layout (a resumed epoch's layout no longer applies). */
static void seek(core *c, uint64_t epoch, uint64_t batch)
{
    seek_to(c, epoch, batch, NULL, true);
}

int stk_loader_set_epoch(stk_loader *l, uint64_t epoch)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    if (epoch > UINT64_MAX / (l->c->sched.part.batches + 1) - 1) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "epoch %llu is too large", (unsigned long long)epoch);
        return STK_EINVAL;
    }
    seek(l->c, epoch, 0);
    return STK_OK;
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
            stk__core_free(c);
    }
    stk__raised_free(&l->last);
    stk__free(l);
}

/* ---- open ----------------------------------------------------------------- */

/* Decides the output kind and shape from the source and the transform. */
static int setup_output(core *c, const stk_options *o, char *err, size_t errlen)
{
    const char *spec = o->transform;
    int rc = stk__fields_setup(c, o, &spec, err, errlen);
    if (rc)
        return rc;
    if (o->nfields && c->primary < 0) {
        /* Fields without an image: the ring's data holds nothing. */
        c->kind = STK_BATCH_DENSE;
        c->dtype = STK_DTYPE_UINT8;
        return STK_OK;
    }
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
    rc = stk__imgpipe_from_options(&c->pipe, spec, o, err, errlen);
    if (rc)
        return rc;
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
    if (c->nfplan) {
        /* Which fields ride the copy to the device (stage.h). */
        if (!(c->devfields = stk__calloc(c->nfplan, sizeof *c->devfields))) {
            stk__fmt(err, errlen, "out of memory for the device stage's field plan");
            return STK_ENOMEM;
        }
        stk__fields_devfields(c, c->devfields);
    }
    return STK_OK;
}

/* The device stage's configuration for the loader as it now stands (the
 * memory bound reads it before the stage exists, with depth still open). */
static stk__devstage_cfg stage_cfg(const core *c)
{
    return (stk__devstage_cfg){.dev = c->dev,
                               .slots = c->ring.depth + 1,
                               .batch_size = c->batch_size,
                               .host_sample_bytes = c->sample_bytes,
                               .out_sample_bytes = c->out_sample_bytes,
                               .convert = c->convert,
                               .cv = c->cv,
                               .batches_per_epoch = c->sched.part.batches,
                               .fields = c->devfields,
                               .nfields = c->devfields ? c->nfplan : 0,
                               .field_memory = c->field_memory,
                               .ctx = (void *)(uintptr_t)c,
                               .host_next = stk__loader_stage_host_next,
                               .host_release = stk__loader_stage_host_release};
}

static int start_device(core *c, char *err, size_t errlen)
{
    if (!c->dev)
        return STK_OK;
    stk__devstage_cfg cfg = stage_cfg(c);
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

/* The fetch stage's configuration (setup_fetch; choose_depth sizes its
 * buffer with it before the stage exists). */
static stk__fetch_cfg fetch_cfg(const core *c, const stk_options *o)
{
    stk__fetch_cfg fc = {0};
    fc.buffer_bytes = o->fetch_buffer;
    fc.lookahead = o->fetch_lookahead;
    fc.threads = c->nthreads;
    fc.concurrency = o->fetch_concurrency ? o->fetch_concurrency : STK__FETCH_CONCURRENCY;
    fc.block_first = c->sched.block_first;
    fc.nblocks = c->sched.nblocks;
    fc.block_window = o->shard_window ? o->shard_window : 8;
    fc.cache_dir = o->cache_dir;
    fc.cache_limit = o->cache_limit;
    return fc;
}

static int setup_fetch(core *c, const stk_options *o, char *err, size_t errlen)
{
    /* A remote source, or a mixture with remote children (its shard table
     * names their stores; its local children's samples are read by it). */
    if ((!c->src.remote && !c->src.shard_remote) || !c->src.ops->locate)
        return STK_OK;
    stk__fetch_plan plan;
    stk__schedule_plan(&c->sched, &plan);
    stk__fetch_cfg fc = fetch_cfg(c, o);
    int rc = stk__fetch_create(&c->fetch, &c->src, &plan, &fc, err, errlen);
    if (rc)
        return rc;
    stk__fetch_reset(c->fetch, 0);
    return STK_OK;
}

static uint64_t memory_bound(const core *c, const stk_options *o)
{
    uint64_t B = c->batch_size;
    /* A variable batch's samples take at most batch_memory (sample_bytes is
     * 0 then); the arena gives back what a smaller batch leaves unused. */
    uint64_t per_batch = B * (c->sample_bytes + 8 + 8 + 12 + 8 + 8 + 1) + sizeof(buffer) +
                         (c->kind == STK_BATCH_VARIABLE ? c->batch_memory : 0) +
                         stk__fields_buffer_bytes(c);
    uint64_t per_thread = sizeof(worker);
    bool field_pipe = false; /* further image fields decode in the thread too */
    for (size_t k = 0; k < c->nfplan; k++)
        field_pipe |= c->fplan[k].pipe != NULL;
    if (c->pipe || field_pipe)
        /* the encoded input, and the sub-image a restart-indexed JPEG's crop
         * decodes from (never larger than the input) */
        per_thread += 2 * o->max_input_bytes + o->scratch_bytes + o->jpeg_memory;
    else if (c->nfplan)
        /* a sample's fields are read into the thread's input scratch */
        per_thread += o->max_input_bytes;
    /* With a device and fields: each device buffer's host columns. */
    stk__devstage_cfg scfg = stage_cfg(c);
    scfg.slots = c->ring.nbufs; /* (depth "auto" tries depths through nbufs) */
    uint64_t stage_host = c->dev ? stk__devstage_host_bytes(&scfg) : 0;
    return c->ring.nbufs * per_batch + stage_host + c->nthreads * per_thread + c->src.index_bytes +
           sizeof(core) + (c->sched.mix ? sizeof(stk__mix) + c->nsrc * 2 * sizeof(uint64_t) : 0) +
           (uint64_t)MAX_KEPT_ERRORS *
               (sizeof(stk_sample_error) + NAME_MAX_BYTES + STK_ERRMSG_MAX) +
           /* raised failures the user has not reached (their records are in core) */
           (uint64_t)RAISED_MAX * (NAME_MAX_BYTES + STK_ERRMSG_MAX) +
           /* failures waiting in ring buffers for delivery */
           (uint64_t)c->ring.nbufs * B * (sizeof(slot_err) + NAME_MAX_BYTES + STK_ERRMSG_MAX);
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
    if ((c->src.remote || c->src.shard_remote) && c->src.ops->locate) {
        /* What the stage will take (setup_fetch; order "blocks": windows of
         * blocks by default, past the 64 MiB of a byte budget). */
        stk__fetch_plan plan;
        stk__schedule_plan(&c->sched, &plan);
        stk__fetch_cfg fc = fetch_cfg(c, o);
        extra += stk__fetch_bound(&c->src, &plan, &fc);
    } else if (c->src.remote || c->src.shard_remote) {
        extra += o->fetch_buffer ? o->fetch_buffer : (uint64_t)64 << 20;
    }
    if (o->trace)
        extra += stk__trace_bytes(o->trace_events);
    unsigned best = 0;
    uint64_t need1 = 0;
    for (unsigned d = 1; d <= AUTO_DEPTH_MAX; d++) {
        stk__ring_set_depth(&c->ring, d);
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
                 o->source_shown, (unsigned long long)budget, (unsigned long long)need1,
                 c->batch_size, c->sample_bytes, c->nthreads);
        return STK_ETOOBIG;
    }
    stk__ring_set_depth(&c->ring, best);
    return STK_OK;
}

/* The shard-aware order, or the block order (the same over blocks of
 * consecutive samples, schedule/blocks.c). */
static int setup_order(core *c, const stk_options *o, char *err, size_t errlen)
{
    bool blocks = o->order == STK__ORDER_BLOCKS;
    if (!c->src.nshards) {
        stk__fmt(err, errlen,
                 "%s: order \"%s\" needs a dataset of shards (.stk or .tar); this one (%s) has "
                 "none",
                 o->source_shown, blocks ? "blocks" : "shards", c->src.ops->kind);
        return STK_EINVAL;
    }
    c->sched.shard_window = o->shard_window ? o->shard_window : 8;
    const uint64_t *units = c->src.shard_first;
    size_t nunits = c->src.nshards;
    if (blocks) {
        int rc = stk__blocks_make(&c->src, o->block_bytes, &c->sched.block_first, &c->sched.nblocks,
                                  err, errlen);
        if (rc)
            return rc;
        units = c->sched.block_first;
        nunits = c->sched.nblocks;
    } else {
        c->sched.shard_first = c->src.shard_first;
        c->sched.nshards = c->src.nshards;
    }
    return stk__shard_orders_init(&c->sched.sorder, units, nunits, c->sched.shard_window, o->seed,
                                  o->shuffle);
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
    c->sched.seed = o->seed;
    c->sched.shuffle = o->shuffle;
    c->drop_last = o->drop_last;
    c->transform_hash = stk__transform_hash(o);
    c->on_error = o->on_error;
    c->batch_size = o->batch_size;
    c->sched.batch_size = o->batch_size;
    stk__ring_set_depth(&c->ring, o->depth);
    c->nthreads = o->threads;
    if (!c->nthreads && (rc = stk__default_threads(&c->nthreads, err, errlen)))
        goto fail;
    stk__ring_autotune_init(&c->ring, o->autotune, c->nthreads, stk__now_ns());

    stk__remote_cfg rcfg;
    stk__source_params sp;
    stk__options_source_params(o, &sp, &rcfg);
    if ((rc = o->nmix ? stk__open_mixture(c, o, &sp, err, errlen)
                      : stk__source_open(&c->src, o->source, &sp, err, errlen)))
        goto fail;
    if ((rc = setup_output(c, o, err, errlen)) ||
        (rc = stk__check_mixture_fields(c, err, errlen)) ||
        (rc = stk__setup_source_pipes(c, o, err, errlen)) || (rc = setup_device(c, o, err, errlen)))
        goto fail;
    c->batch_memory = o->batch_memory;
    c->max_sample = o->max_sample_bytes;
    /* (A mixture's sources have their orders already: mixture_orders.) */
    if (o->order != STK__ORDER_GLOBAL && !o->nmix && (rc = setup_order(c, o, err, errlen)))
        goto fail;
    if (!o->nmix && c->src.ops->advise_order && o->order != STK__ORDER_BLOCKS)
        c->src.ops->advise_order(&c->src, &sp, o->shuffle, o->order == STK__ORDER_GLOBAL,
                                 o->shard_window ? o->shard_window : 8);
    if (o->local_world && (o->local_world > o->world || o->world % o->local_world)) {
        stk__fmt(err, errlen,
                 "local_world_size %u does not divide world_size %u: a world is a whole number "
                 "of nodes of local_world_size ranks each",
                 o->local_world, o->world);
        rc = STK_EINVAL;
        goto fail;
    }
    uint64_t epoch_n = c->sched.mix ? c->sched.mix->N : c->src.count;
    if ((rc = stk__partition_init(&c->sched.part, epoch_n, o->rank, o->world, o->batch_size,
                                  o->drop_last))) {
        stk__fmt(err, errlen, "%s: %llu samples give rank %u of %u no batch of %zu samples%s",
                 o->source_shown, (unsigned long long)epoch_n, o->rank, o->world, o->batch_size,
                 o->drop_last ? " with drop_last" : "");
        goto fail;
    }
    if (o->local_world)
        c->sched.part.local = o->local_world;
    if (c->sched.mix && c->sched.mix->block > 1 && c->sched.part.per_rank % c->batch_size) {
        stk__fmt(err, errlen,
                 "mix_batching \"per_source\" takes whole batches from each source, but %llu "
                 "samples an epoch over %u ranks give each rank %llu, not whole batches of %zu: "
                 "make samples_per_epoch a multiple of world_size x batch_size, or set drop_last",
                 (unsigned long long)c->sched.part.n, o->world,
                 (unsigned long long)c->sched.part.per_rank, c->batch_size);
        rc = STK_EINVAL;
        goto fail;
    }
    if (o->depth_auto && (rc = choose_depth(c, o, err, errlen)))
        goto fail;
    if ((rc = stk__ring_alloc(c))) {
        if (c->kind == STK_BATCH_VARIABLE)
            stk__fmt(err, errlen, "cannot allocate %u ring buffers of %zu bytes (batch_memory)",
                     c->ring.nbufs, c->batch_memory);
        else
            stk__fmt(err, errlen, "cannot allocate %u ring buffers of %zu x %zu bytes",
                     c->ring.nbufs, c->batch_size, c->sample_bytes);
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
        if (pthread_create(&c->workers[k].th, NULL, stk__worker_main, &c->workers[k])) {
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
    stk__core_free(c);
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
    bool any_url = o && o->source && stk__is_url(o->source);
    for (size_t k = 0; o && k < o->nmix; k++)
        any_url |= stk__is_url(o->mix[k].path);
    if (!o || (!o->source && !o->nmix)) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "no source: set one with stk_options_set_source");
        rc = STK_EINVAL;
    } else if (o->source && o->nmix) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "both a source (%s) and a mixture of %zu sources are set: a loader reads one "
                 "or the other",
                 o->source_shown, o->nmix);
        rc = STK_EINVAL;
    } else if (!o->nmix && (o->samples_per_epoch || o->mix_resume || o->mix_batching)) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "%s applies to a mixture of sources (stk_options_add_source, docs/mixing.md); "
                 "this loader reads one source, %s",
                 o->samples_per_epoch ? "samples_per_epoch"
                 : o->mix_resume      ? "mix_resume"
                                      : "mix_batching",
                 o->source_shown);
        rc = STK_EINVAL;
    } else if (o->remote_set && !any_url) {
        /* An option that would change nothing is refused, so a run never
         * silently differs from what was asked for. */
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "%s applies to remote datasets (http://, https://, s3://); %s is a local path, "
                 "which is read directly",
                 o->remote_set, o->source ? o->source_shown : "every mixture source");
        rc = STK_EINVAL;
    } else if (o->cache_limit_set && !o->cache_dir) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "cache_limit is the size limit of the disk cache: set cache_dir too");
        rc = STK_EINVAL;
    } else {
        rc = open_core(l, o);
    }
    l->status = rc;
    return rc;
}
