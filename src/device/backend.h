/*
 * backend.h -- what the device stage needs from an accelerator, as a table
 * of function pointers (one folder a backend, as curl keeps its TLS
 * backends): page-locked host memory, device memory, streams, events,
 * asynchronous host-to-device copies and the output conversion.
 *
 * Backends:
 *   cuda.c  the CUDA driver API, loaded with dlopen("libcuda.so.1") at run
 *           time, so the library links and runs on machines without CUDA;
 *   fake.c  a CPU stand-in with the same semantics (work queued on a stream
 *           runs later, in order within the stream, on another thread, with
 *           delays the tests choose), used by the tests and the overlap
 *           benchmark.
 *
 * Semantics every backend keeps (CUDA's):
 * - Work queued on one stream runs in order; streams run independently.
 * - An event recorded on a stream completes when the work queued before it
 *   on that stream has run; an event never recorded counts as complete.
 * - stream_wait_event makes later work on the stream wait for the event as
 *   it was when the call was made (a later record does not move it).
 * - A failed copy or conversion makes the stream's later events fail:
 *   event_query and event_sync report the error (sticky, as CUDA's are).
 * - Host memory passed to copy_h2d must stay untouched until an event
 *   recorded after the copy has completed.
 *
 * All functions may be called from any thread. They return STK_OK or a
 * negative STK_E* code, with the backend's own words in err.
 */
#ifndef STK_DEVICE_BACKEND_H
#define STK_DEVICE_BACKEND_H

#include "internal.h"
#include "ops/convert.h"

typedef struct stk__dev stk__dev;
typedef void *stk__stream;  /* CUstream */
typedef void *stk__event;   /* CUevent */
typedef uint64_t stk__dptr; /* CUdeviceptr */

typedef struct stk__dev_ops {
    const char *name; /* "cuda", "fake" */
    /* Page-locked host memory (the host ring's buffers). */
    int (*host_alloc)(stk__dev *d, size_t n, void **out, char *err, size_t errlen);
    void (*host_free)(stk__dev *d, void *p);
    int (*dev_alloc)(stk__dev *d, size_t n, stk__dptr *out, char *err, size_t errlen);
    void (*dev_free)(stk__dev *d, stk__dptr p);
    /* A stream that does not synchronise with the default stream. */
    int (*stream_create)(stk__dev *d, stk__stream *out, char *err, size_t errlen);
    void (*stream_destroy)(stk__dev *d, stk__stream s);
    int (*event_create)(stk__dev *d, stk__event *out, char *err, size_t errlen);
    void (*event_destroy)(stk__dev *d, stk__event e);
    int (*copy_h2d)(stk__dev *d, stk__dptr dst, const void *src, size_t n, stk__stream s, char *err,
                    size_t errlen);
    /* Copies device memory to the host at once (waits for nothing: sync
     * the event of the work that wrote it first). For tests and tools. */
    int (*copy_d2h)(stk__dev *d, void *dst, stk__dptr src, size_t n, char *err, size_t errlen);
    /* Queues stk__convert_batch of n images from src to dst (device memory). */
    int (*convert)(stk__dev *d, const stk__convert *cv, stk__dptr src, stk__dptr dst, size_t n,
                   stk__stream s, char *err, size_t errlen);
    int (*event_record)(stk__dev *d, stk__event e, stk__stream s, char *err, size_t errlen);
    /* STK_OK when complete, 1 while pending, an error when the work failed. */
    int (*event_query)(stk__dev *d, stk__event e, char *err, size_t errlen);
    /* Blocks until the event completed; STK_OK or the work's error. */
    int (*event_sync)(stk__dev *d, stk__event e, char *err, size_t errlen);
    int (*stream_wait_event)(stk__dev *d, stk__stream s, stk__event e, char *err, size_t errlen);
    /* Makes d's context current on the calling thread for the calls that
     * follow; leave restores the caller's. May be NULL (nothing to do). */
    void (*enter)(stk__dev *d);
    void (*leave)(stk__dev *d);
    void (*close)(stk__dev *d);
} stk__dev_ops;

/* A device: the backend's table, its id, and the backend's own state after
 * this header (each backend allocates a larger struct starting with this). */
struct stk__dev {
    const stk__dev_ops *ops;
    int id;
    int kind; /* enum stk_device */
};

/* Opens device `id` of a backend. STK_EUNSUPPORTED (no driver, no such
 * device, no kernels for a conversion) or STK_EDEVICE with err saying why. */
int stk__dev_open_cuda(stk__dev **out, int id, char *err, size_t errlen);
int stk__dev_open_fake(stk__dev **out, int id, char *err, size_t errlen);
void stk__dev_close(stk__dev *d);

/* Whether this build carries compiled CUDA kernels (nvcc was found), and
 * whether an open CUDA device could load them (a kernel for its
 * architecture, or PTX it can compile). */
int stk__cuda_have_kernels(void);
int stk__cuda_device_has_kernel(const stk__dev *d);

/* The fake backend's knobs, for tests (process-wide; set before opening):
 * seed of the delays, the largest delay in microseconds before each queued
 * operation runs, and the number of the copy or conversion (counted from 1
 * across the process as they are queued, 0: none) that fails when it runs. Calling it also turns on
 * the host_changed check (a hash of each copy's source when queued and when run), which costs CPU
 * the overlap benchmark does not want. */
void stk__fake_config(uint64_t seed, unsigned max_delay_us, unsigned fail_at);
/* Counters of the fake backend since the last stk__fake_config: operations
 * run, and host buffers changed between a copy's queueing and its run (a
 * host slot reused before its copy completed: must stay 0). */
typedef struct stk__fake_counts {
    uint64_t copies, converts, host_changed;
    uint64_t checks, check_failed; /* stk__fake_check runs, and mismatches */
} stk__fake_counts;
void stk__fake_counts_get(stk__fake_counts *out);
/* Queues on a fake stream a stand-in for a consumer's kernel: when it runs,
 * it hashes n bytes at p (XXH3) and counts a mismatch with `hash` (device
 * memory rewritten before the consumer's stream was done with it). */
int stk__fake_check(stk__dev *d, stk__stream s, const void *p, size_t n, uint64_t hash);

#endif
