/*
 * stage.h -- the device stage: after the batch ring, before the consumer.
 *
 * A copy thread (stk-copy) takes the host ring's batches in order, queues
 * each one's host-to-device copy on one of two streams of its own into one
 * of `slots` device buffers, then the conversion to the user's dtype and
 * layout (ops/convert.h) when there is one, records events, and queues the
 * device batch for the consumer at once: the consumer's stream waits for the
 * batch's `ready` event on the device (stk_batch_wait), so the copy overlaps
 * both the decoding of later batches and the consumer's own work.
 *
 * Reuse rules (what the tests check with the fake backend):
 * - a host ring buffer goes back to the workers only after the event
 *   recorded right after its copy has completed;
 * - a device buffer is written again only after the consumer released it,
 *   and the copy stream waits on the device for the event recorded on the
 *   consumer's stream at release, for those recorded then on the streams
 *   it added with stk_batch_record_stream, and for the buffer's previous
 *   copy.
 *
 * Batches with fields (docs/gpu.md, docs/multimodal.md): the dense numeric
 * fields ride the same copy into device memory of their own (the first
 * image field is the batch's data, converted as without fields; further
 * images of one size, int64 and float32 columns are copied as they are; an
 * .npy column whose samples all have one dtype and shape is packed into
 * one dense array). Everything else (text, JSON, bytes, images of varied
 * size or without a transform, ragged .npy) stays in host memory: the copy
 * thread packs those columns into the device buffer's own host arena when
 * it issues the copy, so the host ring buffer still goes back to the
 * workers as soon as its copy ran, and the host columns live exactly as
 * long as the device batch. Both are sized at open from the plan and
 * field_memory (stk__devstage_host_bytes, stk__devstage_device_bytes).
 *
 * Lock order: the stage's lock is taken under no other; the host callbacks
 * (which take the loader's lock) and the backend are called without it.
 */
#ifndef STK_DEVICE_STAGE_H
#define STK_DEVICE_STAGE_H

#include "device/backend.h"

typedef struct stk__devstage stk__devstage;

/* Where the stage puts one field of the batches (stk_batch.fields[k]). */
enum {
    STK__DF_PRIMARY, /* the batch's data: copied (and converted) as without fields */
    STK__DF_DENSE,   /* a dense column: copied to device memory as it is */
    STK__DF_NPY,     /* .npy: to the device, dense, when the batch's samples are uniform */
    STK__DF_HOST     /* a variable column: packed into the buffer's host arena */
};
typedef struct stk__devfield {
    int where;           /* STK__DF_* */
    size_t sample_bytes; /* DENSE: one sample's bytes */
    bool optional;       /* has a present column */
    bool shapes, dtypes; /* HOST and NPY: has per-sample shapes / dtypes */
} stk__devfield;

typedef struct stk__devstage_cfg {
    stk__dev *dev;  /* borrowed: outlives the stage */
    unsigned slots; /* device buffers: the consumer's + depth ahead */
    size_t batch_size;
    size_t host_sample_bytes; /* one sample in the host ring */
    size_t out_sample_bytes;  /* one sample on the device */
    int convert;              /* 1: out = cv applied to the host bytes */
    stk__convert cv;
    uint64_t batches_per_epoch; /* to name a batch in messages */
    /* Batches with fields: how each field travels (copied by create), and
     * the size of the host arena a device buffer packs its variable columns
     * into (the host ring's field_memory: they always fit); 0 and NULL
     * without fields. */
    const stk__devfield *fields;
    size_t nfields;
    size_t field_memory;
    /* The host ring, read as the consumer would (without the handle checks
     * and without counting the wait as the consumer's). */
    void *ctx;
    int (*host_next)(void *ctx, stk_batch **out, uint64_t timeout_ns, char *err, size_t errlen);
    void (*host_release)(void *ctx, stk_batch *b);
} stk__devstage_cfg;

/* Device memory the stage allocates for cfg, and host memory for the
 * fields' host columns (for the memory bound). */
uint64_t stk__devstage_device_bytes(const stk__devstage_cfg *cfg);
uint64_t stk__devstage_host_bytes(const stk__devstage_cfg *cfg);

/* Allocates the device buffers, streams and events and starts the copy
 * thread. STK_OK, or an error with err saying why. */
int stk__devstage_create(stk__devstage **out, const stk__devstage_cfg *cfg, char *err,
                         size_t errlen);

/* The consumer's next batch, in order: STK_OK (*out held until released),
 * STK_END, STK_ESAMPLE and the other host errors as stk_loader_next has them
 * (err gets the message), STK_TIMEOUT after timeout_ns (0: no limit),
 * STK_EBUSY when the consumer holds every device buffer, STK_EDEVICE once a
 * copy or conversion failed (sticky). */
int stk__devstage_next(stk__devstage *st, stk_batch **out, uint64_t timeout_ns, char *err,
                       size_t errlen);

/* Gives a device batch back: its buffer is rewritten only after the work
 * queued on `stream` so far has run (for the fake device, NULL is the host,
 * done at once). Returns the stage's ctx, or NULL when b was not held (a
 * second release). */
void *stk__devstage_release(stk_batch *b, void *stream);
/* stk_batch_record_stream for a held device batch: `stream` is added to the
 * streams its release records an event on, which the next copy into its
 * buffer waits for. STK_OK, STK_EINVAL (STK_BATCH_MAX_STREAMS already),
 * STK_EMISUSE (not held), or the backend's error making the event. */
int stk__devstage_record_stream(stk_batch *b, void *stream);
int stk__devstage_wait(stk_batch *b, void *stream);
int stk__devstage_sync(stk_batch *b);

/* Seeking: pause stops the copy thread from taking host batches and drops
 * the batches queued for the consumer (their buffers become free); resume
 * lets it go on from wherever the host ring now is. */
void stk__devstage_pause(stk__devstage *st);
void stk__devstage_resume(stk__devstage *st);

/* Stops the copy thread and waits for every copy in flight, giving their
 * host batches back. Held device batches stay valid. */
void stk__devstage_stop(stk__devstage *st);
/* Frees everything; the consumer must hold no batch and stop must have run. */
void stk__devstage_destroy(stk__devstage *st);

/* Batches delivered to the consumer so far, and their samples. */
void stk__devstage_delivered(stk__devstage *st, uint64_t *batches, uint64_t *samples);

/* The device a loader delivers to, or NULL (for tests and tools). */
stk__dev *stk__loader_device(stk_loader *l);

#endif
