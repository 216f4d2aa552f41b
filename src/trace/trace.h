/*
 * trace.h -- a bounded record of what the loader's threads did, written as
 * Chrome trace-event JSON (Perfetto, chrome://tracing) when the loader closes.
 *
 * One track per thread that records: track 0 is the consumer (next() calls,
 * recorded with the loader's lock held), tracks 1..n the workers (each written
 * only by its own thread). Each track is a ring of fixed-size events: when it
 * is full the oldest event is overwritten and counted as dropped, so memory is
 * fixed at creation and a long run keeps its latest events. Timestamps come
 * from one clock (stk__now_ns, CLOCK_MONOTONIC), relative to creation.
 *
 * PATH is never opened for writing: at creation a temporary file
 * ".NAME.XXXXXXXXXXXX" (random suffix, O_EXCL | O_NOFOLLOW) is created in
 * PATH's directory, so a path that cannot be written fails the open with its
 * reason; at finish the events go to it and it is renamed over PATH once
 * complete. Until then PATH keeps what it held, and a PATH that exists and is
 * not a stoker trace (nor an empty file) is refused at creation and again
 * before the rename, so a trace never replaces anything else.
 */
#ifndef STK_TRACE_H
#define STK_TRACE_H

#include "internal.h"

typedef struct stk__trace stk__trace;

enum {
    STK__TR_READ,      /* span: a worker read a sample's bytes (file or fetch stage) */
    STK__TR_PROCESS,   /* span: decode + transform (when they cannot be told apart) */
    STK__TR_READY,     /* instant: a worker filled a batch's last slot */
    STK__TR_NEXT,      /* span: the consumer's next() call, waiting included */
    STK__TR_DECODE,    /* span: decoding the image (its needed region) */
    STK__TR_TRANSFORM, /* span: crops, resizes, flips, normalisation, into the slot */
    STK__TR_KINDS
};

/* Creates a trace of `tracks` tracks holding `events` events in all (at least
 * 16 per track). STK_OK, STK_EIO (path: err names it and the reason),
 * STK_EINVAL (PATH holds something that is not a trace: err says so),
 * STK_ENOMEM. */
int stk__trace_create(stk__trace **out, const char *path, unsigned tracks, uint64_t events,
                      char *err, size_t errlen);
/* Bytes the trace holds (for the memory bound). */
uint64_t stk__trace_bytes(uint64_t events);
/* Records an event on a track; only that track's owner may call it.
 * a: the sample (read, process) or the batch (ready, next); b: the batch
 * (read, process) or a status (next); slot: the slot in the batch. */
void stk__trace_event(stk__trace *t, unsigned track, int kind, uint64_t t0, uint64_t t1, uint64_t a,
                      uint64_t b, uint32_t slot);
/* The loader's counters at the moment the trace ends, written into the file
 * beside the events so a reader can check one against the other. */
typedef struct stk__trace_totals {
    uint64_t batch_size;
    uint64_t read_items, process_items; /* the stage counters (stk_loader_stage_stats) */
    uint64_t samples_delivered, batches_delivered;
} stk__trace_totals;

/* Writes the JSON file (no thread may record any more): the temporary file,
 * then renamed over PATH. STK_OK, STK_EIO (PATH unchanged, no temporary file
 * left). */
int stk__trace_finish(stk__trace *t, const stk__trace_totals *tot);
void stk__trace_destroy(stk__trace *t);

#endif
