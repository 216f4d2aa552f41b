/*
 * loader_core.h -- the loader's shared state, for the files that make up the
 * engine: loader.c (open, close, next, seek and the wiring), loader_worker.c (the
 * workers), loader_errors.c (failed samples), loader_held.c (the table of
 * batches the user holds), loader_state.c (resume state) and loader_stats.c
 * (info and statistics). The ring's state is its own (stk__ring, ring/ring.h,
 * owned by ring/ring.c); which sample sits at a position is the schedule's
 * (schedule/schedule.h). Not included outside these files.
 */
#ifndef STK_LOADER_CORE_H
#define STK_LOADER_CORE_H

#include "device/stage.h"
#include "fetch/fetch.h"
#include "fields.h"
#include "image.h"
#include "internal.h"
#include "io/remote.h"
#include "options.h"
#include "order.h"
#include "ring/ring.h"
#include "schedule/schedule.h"
#include "source/dataset.h"
#include "trace/trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

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
    char *field; /* the output field that failed, or NULL */
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
    char *field;  /* owned; the output field that failed, or NULL */
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

/* A requested field's column in one buffer (fields.h; the primary image
 * field's pixels are the buffer's data, its shapes are here). */
typedef struct fcol {
    uint8_t *dense;              /* dense: batch_size x sample_bytes */
    uint64_t *offsets, *lengths; /* variable: into the buffer's field arena */
    int64_t *shapes;             /* variable IMAGE/NPY: STK_FIELD_MAXDIM + 1 a sample */
    int32_t *dtypes;             /* NPY */
    uint8_t *present;            /* optional fields */
} fcol;

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
    /* Fields (core.nfplan > 0): one column a field, their views, and the
     * arena of the variable ones (field_memory bytes of address space). */
    fcol *cols;
    stk_field *fviews;
    uint8_t *farena;
    _Atomic size_t fused;
    size_t fhigh;
} buffer;

typedef struct worker {
    core *core;
    unsigned id;
    pthread_t th;
    bool started;
    stk__scratch in, dec;
    stk__field_set fset; /* a sample's fields (fields only) */
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
    stk__fetch *fetch;   /* remote sources: reads ahead of the workers */
    stk__schedule sched; /* position -> sample (schedule/schedule.h) */
    stk__imgpipe *pipe;
    bool drop_last;
    uint64_t transform_hash; /* resume fingerprint of the transform */
    /* A mixture (docs/mixing.md): its fingerprint, whether a changed one
     * resumes (mix_resume "new"), and per source the samples delivered and
     * failed (lock held). */
    uint64_t mix_hash;
    uint64_t mix_hash_v1; /* the first version's (with paths) a state may hold; 0: none */
    bool mix_new;
    size_t nsrc;
    uint64_t *src_samples, *src_failed;
    stk__imgpipe **src_pipes; /* per source: its own transform, or NULL */
    /* Per source and field (nsrc x nfplan, NULL: none at all): its own
     * transform of a further image field, or NULL (the field's). */
    stk__imgpipe **src_fpipes;
    int on_error;
    int kind, dtype;
    unsigned ndim;
    int64_t shape[4];
    size_t sample_bytes; /* dense: one sample; variable: 0 */
    size_t batch_memory; /* variable: the most one batch's samples may take */
    size_t max_sample;   /* variable: the most one sample may take (0: batch_memory) */
    /* Fields (loader_fields.c): the plan of each requested field; primary is
     * the first image field (its pixels are the ring's data, made by pipe),
     * -1 when none; field_memory the field arena's size (0: none). */
    stk__fplan *fplan;
    stk__fspec *fspecs; /* the specs the plan points at (a copy of the options') */
    size_t nfplan;
    int primary;
    size_t field_memory;

    stk__ring ring; /* buffers, claim and delivery cursors, autotune (ring/ring.h) */
    unsigned nthreads;
    size_t batch_size;
    uint64_t cur_epoch; /* the epoch the consumer is in (deliver_g's, or its end) */
    worker *workers;

    uint64_t delivered_samples, delivered_batches, wait_ns, skipped, failed;
    stk_sample_error *errors; /* failures of epoch errors_epoch, in sample order */
    size_t nerrors;
    uint64_t errors_epoch;
    raised raised[RAISED_MAX]; /* oldest first */
    unsigned nraised;
    uint64_t memory_bound;
    stk__trace *trace; /* NULL: tracing off (docs/diagnosis.md) */
    /* Device stage (docs/gpu.md): with a device, the ring's buffers are the
     * device's page-locked memory, the copy thread is the ring's consumer,
     * and the user's position is where the device stage's consumer is. */
    stk__dev *dev;
    stk__devstage *dstage;
    uint64_t dev_bytes;          /* device memory of the stage */
    held *dnodes;                /* one a device buffer: the held table's nodes */
    held *dspare;                /* those not in the table (under g_held_lock) */
    uint64_t cons_epoch, cons_g; /* the user's position (lock held) */
    int convert;                 /* the device converts uint8 HWC to the output */
    stk__convert cv;
    size_t out_sample_bytes;  /* one sample as delivered */
    stk__devfield *devfields; /* with fields: how each travels (nfplan entries) */
};

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

/* The first version of each sized result struct (stk__put_sized). */
#define INFO_V1    (offsetof(stk_info, source_kind) + sizeof(const char *))
#define STATS_V1   (offsetof(stk_stats, memory_bound_bytes) + sizeof(uint64_t))
#define STAGE_V1   (offsetof(stk_stage_stats, busy_ns) + sizeof(uint64_t))
#define STATE_V1   (offsetof(stk_state, transform) + sizeof(uint64_t))
#define ERRINFO_V1 (offsetof(stk_error_info, message) + sizeof(const char *))

/* ---- loader.c ---- */
/* Frees the core (its last reference went: the handle's or a batch's). */
void stk__core_free(core *c);
/* STK_OK, or STK_EMISUSE (closed handle, forked child) with the message. */
int stk__check_handle(stk_loader *l);
/* Moves the production cursor to batch `batch` of `epoch` (set_lay: with
 * the resumed layout lay, NULL for none, from there on). */
void stk__seek_to(core *c, uint64_t epoch, uint64_t batch, stk__resumed *lay, bool set_lay);
/* loader_next.c: the device stage's source of host batches (its copy
 * thread's next and release; ctx is the core). */
int stk__loader_stage_host_next(void *ctx, stk_batch **out, uint64_t timeout_ns, char *err,
                                size_t errlen);
void stk__loader_stage_host_release(void *ctx, stk_batch *b);

/* The pipeline of the first image of sample i: its source's own in a
 * mixture with per-source transforms, else the loader's. */
static inline stk__imgpipe *stk__pipe_for(const core *c, uint64_t i)
{
    if (c->src_pipes) {
        stk__imgpipe *p = c->src_pipes[stk__mix_source_of(c->sched.mix, i)];
        if (p)
            return p;
    }
    return c->pipe;
}

/* The pipeline of further image field k (fplan) of sample i: its source's
 * own in a mixture with per-source field transforms, else the field's. */
static inline stk__imgpipe *stk__field_pipe_for(const core *c, size_t k, uint64_t i)
{
    if (c->src_fpipes) {
        stk__imgpipe *p = c->src_fpipes[stk__mix_source_of(c->sched.mix, i) * c->nfplan + k];
        if (p)
            return p;
    }
    return c->fplan[k].pipe;
}

/* ---- loader_mix.c: a mixture at open (docs/mixing.md) ---- */
/* The composite source over o's sources, the schedule, the per-source
 * orders, counters and fingerprints. */
int stk__open_mixture(core *c, const stk_options *o, const stk__source_params *sp, char *err,
                      size_t errlen);
/* After the output and fields: the per-source transforms' pipelines. */
int stk__setup_source_pipes(core *c, const stk_options *o, char *err, size_t errlen);
/* Every source gives each requested field that is not optional. */
int stk__check_mixture_fields(core *c, char *err, size_t errlen);

/* ---- loader_fields.c ---- */
/* Resolves o's fields against the source, chooses each one's column and
 * selects the source's fields to read; sets the primary's transform spec in
 * *spec (NULL: none). No fields: does nothing. */
int stk__fields_setup(core *c, const stk_options *o, const char **spec, char *err, size_t errlen);
/* Frees the plan (pipelines, specs). */
void stk__fields_free(core *c);
/* How each field travels through the device stage (out: nfplan entries). */
void stk__fields_devfields(const core *c, stk__devfield *out);
/* Bytes the fields' columns take in one buffer (memory bound). */
uint64_t stk__fields_buffer_bytes(const core *c);
/* Makes sample i's fields into slot s (worker). Returns the error, with
 * err and *field (static or the plan's) set. */
int stk__fields_make(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch,
                     const uint8_t *bytes, size_t len, int64_t label, char *err, size_t errlen,
                     const char **field);
/* The ring's part: allocate, free, compact after skips, views. */
int stk__fields_ring_alloc(core *c, buffer *b);
void stk__fields_ring_free(core *c, buffer *b);
void stk__fields_publish(core *c, buffer *b);
void stk__fields_release(core *c, buffer *b);

/* ---- loader_worker.c ---- */
void *stk__worker_main(void *arg);

/* ---- loader_errors.c: failed samples (lock held unless said) ---- */
void stk__slot_errs_free(slot_err *e); /* no lock needed */
void stk__errors_clear(core *c);
void stk__raised_free(raised *r); /* no lock needed */
void stk__raised_prune(core *c, uint64_t keep_from);
void stk__errors_follow(core *c, uint64_t epoch);
void stk__errors_record(core *c, buffer *b);
uint64_t stk__user_g(const core *c);
void stk__raise_batch(core *c, const buffer *b, uint64_t g, char *err, size_t errlen);

/* ---- loader_held.c: the process's table of batches the user holds ---- */
bool stk__held_put(held *h, held **spare, const stk_batch *v);
bool stk__held_find(const stk_batch *v, bool take);

/* ---- loader_stats.c / loader_state.c ---- */
int stk__put_sized(stk_loader *l, const char *type, void *out, const void *full, size_t size,
                   size_t min);
uint64_t stk__transform_hash(const stk_options *o);
/* The same fingerprint of one spec with o's image options. */
uint64_t stk__transform_hash_spec(const stk_options *o, const char *spec);

#endif
