/*
 * fake.c -- a CPU stand-in for a CUDA device, with CUDA's semantics
 * (backend.h): "device memory" is host memory, and work queued on a stream
 * runs later on the backend's own thread (stk-fake), in order within its
 * stream, with streams interleaved in a seeded random order and a seeded
 * random delay before each operation. The device stage's tests run against
 * it, so reuse-before-completion bugs show up as wrong bytes or as the
 * host_changed counter, whatever the timing of the machine.
 *
 * One mutex (innermost: no other lock is taken under it) guards the streams,
 * their queues and the events; `cond` wakes the executor and the waiters.
 */
#include "device/backend.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <xxhash.h>

enum op_kind { OP_COPY, OP_CONVERT, OP_RECORD, OP_WAIT, OP_CHECK };

typedef struct fev {
    uint64_t recorded; /* records queued so far */
    uint64_t done;     /* the newest record that ran */
    int failed;        /* the newest record that ran followed a failure */
    char msg[160];
} fev;

typedef struct fop {
    struct fop *next;
    int kind;
    void *dst;
    const void *src;
    size_t n;
    uint64_t hash; /* OP_COPY: the source bytes when queued; OP_CHECK: expected */
    bool check;    /* OP_COPY: compare the hash when it runs */
    bool fail;     /* OP_COPY/OP_CONVERT: the injected failure (stk__fake_config) */
    stk__convert cv;
    fev *ev;
    uint64_t gen; /* OP_RECORD: this record's number; OP_WAIT: the record awaited */
} fop;

typedef struct fstream {
    struct fstream *next;
    fop *head, *tail;
    int failed;
    char msg[160];
    bool destroyed;
} fstream;

typedef struct fake {
    stk__dev base;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t th;
    bool stop;
    fstream *streams;
    uint64_t rng;
    unsigned max_delay_us;
    double copy_gbps; /* > 0: a copy of n bytes takes n / (copy_gbps * 1e9) s */
} fake;

/* The process-wide knobs and counters (stk__fake_config). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_seed = 1;
static unsigned g_delay_us, g_fail_at, g_ops;
static bool g_check_host; /* hash host buffers at copy time (tests only) */
static stk__fake_counts g_counts;

void stk__fake_config(uint64_t seed, unsigned max_delay_us, unsigned fail_at)
{
    pthread_mutex_lock(&g_mu);
    g_seed = seed;
    g_delay_us = max_delay_us;
    g_fail_at = fail_at;
    g_ops = 0;
    g_check_host = true;
    memset(&g_counts, 0, sizeof g_counts);
    pthread_mutex_unlock(&g_mu);
}

void stk__fake_counts_get(stk__fake_counts *out)
{
    pthread_mutex_lock(&g_mu);
    *out = g_counts;
    pthread_mutex_unlock(&g_mu);
}

static uint64_t next_rand(uint64_t *s)
{
    /* splitmix64: a fixed sequence per seed */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Whether the head of s may run now. Lock held. */
static bool runnable(const fstream *s)
{
    const fop *o = s->head;
    if (!o)
        return false;
    return o->kind != OP_WAIT || o->ev->done >= o->gen;
}

/* Runs one operation (lock not held for copies and conversions). */
static void run_op(fake *f, fstream *s, fop *o)
{
    if (o->kind == OP_COPY || o->kind == OP_CONVERT) {
        pthread_mutex_lock(&g_mu);
        bool fail = o->fail;
        if (o->kind == OP_COPY)
            g_counts.copies++;
        else
            g_counts.converts++;
        pthread_mutex_unlock(&g_mu);
        pthread_mutex_lock(&f->mu);
        bool skip = s->failed != 0;
        if (fail && !skip) {
            s->failed = STK_EDEVICE;
            stk__fmt(s->msg, sizeof s->msg, "fake device: operation %u failed (injected)",
                     g_fail_at);
            skip = true;
        }
        pthread_mutex_unlock(&f->mu);
        if (skip)
            return;
        if (o->kind == OP_COPY) {
            if (o->check && XXH3_64bits(o->src, o->n) != o->hash) {
                pthread_mutex_lock(&g_mu);
                g_counts.host_changed++;
                pthread_mutex_unlock(&g_mu);
            }
            memcpy(o->dst, o->src, o->n);
            if (f->copy_gbps > 0) {
                /* The time the bus would take (the overlap benchmark). */
                double s_ = (double)o->n / (f->copy_gbps * 1e9);
                struct timespec ts = {(time_t)s_, (long)((s_ - (double)(time_t)s_) * 1e9)};
                while (nanosleep(&ts, &ts) && errno == EINTR)
                    ;
            }
        } else {
            stk__convert_batch(&o->cv, o->src, o->dst, o->n);
        }
        return;
    }
    if (o->kind == OP_CHECK) {
        bool bad = XXH3_64bits(o->src, o->n) != o->hash;
        pthread_mutex_lock(&g_mu);
        g_counts.checks++;
        g_counts.check_failed += bad;
        pthread_mutex_unlock(&g_mu);
        return;
    }
    pthread_mutex_lock(&f->mu);
    if (o->kind == OP_RECORD && o->gen > o->ev->done) {
        o->ev->done = o->gen;
        o->ev->failed = s->failed;
        if (s->failed)
            memcpy(o->ev->msg, s->msg, sizeof o->ev->msg);
    }
    pthread_mutex_unlock(&f->mu);
}

static void *executor(void *arg)
{
    fake *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        unsigned n = 0;
        for (fstream *s = f->streams; s; s = s->next)
            n += runnable(s);
        if (!n) {
            if (f->stop)
                break;
            stk__cond_wait_ns(&f->cond, &f->mu, 50000000ULL);
            continue;
        }
        uint64_t r = next_rand(&f->rng);
        unsigned pick = (unsigned)(r % n);
        fstream *s = f->streams;
        for (;; s = s->next)
            if (runnable(s) && pick-- == 0)
                break;
        fop *o = s->head;
        unsigned delay = f->max_delay_us ? (unsigned)((r >> 32) % (f->max_delay_us + 1)) : 0;
        pthread_mutex_unlock(&f->mu);
        if (delay) {
            struct timespec ts = {0, (long)delay * 1000};
            while (nanosleep(&ts, &ts) && errno == EINTR)
                ;
        }
        /* The head stays queued while it runs, so a stream's work never
         * reorders; only this thread pops. */
        run_op(f, s, o);
        pthread_mutex_lock(&f->mu);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        stk__free(o);
        pthread_cond_broadcast(&f->cond);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static int push(fake *f, fstream *s, fop *o, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    if (o->kind == OP_COPY || o->kind == OP_CONVERT) {
        /* Counted as queued, so the Nth is the same operation whatever
         * order the streams then run in. */
        pthread_mutex_lock(&g_mu);
        o->fail = g_fail_at && ++g_ops == g_fail_at;
        pthread_mutex_unlock(&g_mu);
    }
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&f->cond);
    return STK_OK;
}

static fop *new_op(int kind, char *err, size_t errlen)
{
    fop *o = stk__calloc(1, sizeof *o);
    if (!o)
        stk__fmt(err, errlen, "fake device: out of memory");
    else
        o->kind = kind;
    return o;
}

static int f_host_alloc(stk__dev *d, size_t n, void **out, char *err, size_t errlen)
{
    (void)d;
    *out = stk__malloc(n ? n : 1);
    if (!*out) {
        stk__fmt(err, errlen, "fake device: cannot allocate %zu bytes of pinned memory", n);
        return STK_ENOMEM;
    }
    return STK_OK;
}

static void f_host_free(stk__dev *d, void *p)
{
    (void)d;
    stk__free(p);
}

static int f_dev_alloc(stk__dev *d, size_t n, stk__dptr *out, char *err, size_t errlen)
{
    void *p = NULL;
    int rc = f_host_alloc(d, n, &p, err, errlen);
    *out = (stk__dptr)(uintptr_t)p;
    return rc;
}

static void f_dev_free(stk__dev *d, stk__dptr p)
{
    (void)d;
    stk__free((void *)(uintptr_t)p);
}

static int f_stream_create(stk__dev *d, stk__stream *out, char *err, size_t errlen)
{
    fake *f = (fake *)d;
    fstream *s = stk__calloc(1, sizeof *s);
    if (!s) {
        stk__fmt(err, errlen, "fake device: out of memory");
        return STK_ENOMEM;
    }
    pthread_mutex_lock(&f->mu);
    s->next = f->streams;
    f->streams = s;
    pthread_mutex_unlock(&f->mu);
    *out = s;
    return STK_OK;
}

/* Waits for the stream's queued work, then frees it (CUDA lets the work
 * finish too; waiting keeps the memory simple). */
static void f_stream_destroy(stk__dev *d, stk__stream st)
{
    fake *f = (fake *)d;
    fstream *s = st;
    if (!s)
        return;
    pthread_mutex_lock(&f->mu);
    while (s->head)
        stk__cond_wait_ns(&f->cond, &f->mu, 50000000ULL);
    for (fstream **p = &f->streams; *p; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
    stk__free(s);
}

static int f_event_create(stk__dev *d, stk__event *out, char *err, size_t errlen)
{
    (void)d;
    fev *e = stk__calloc(1, sizeof *e);
    if (!e) {
        stk__fmt(err, errlen, "fake device: out of memory");
        return STK_ENOMEM;
    }
    *out = e;
    return STK_OK;
}

static void f_event_destroy(stk__dev *d, stk__event e)
{
    (void)d;
    stk__free(e);
}

static int f_copy(stk__dev *d, stk__dptr dst, const void *src, size_t n, stk__stream st, char *err,
                  size_t errlen)
{
    fake *f = (fake *)d;
    fop *o = new_op(OP_COPY, err, errlen);
    if (!o)
        return STK_ENOMEM;
    o->dst = (void *)(uintptr_t)dst;
    o->src = src;
    o->n = n;
    pthread_mutex_lock(&g_mu);
    o->check = g_check_host;
    pthread_mutex_unlock(&g_mu);
    if (o->check)
        o->hash = XXH3_64bits(src, n);
    pthread_mutex_lock(&f->mu);
    int rc = push(f, st, o, err, errlen);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int f_copy_d2h(stk__dev *d, void *dst, stk__dptr src, size_t n, char *err, size_t errlen)
{
    (void)d;
    (void)err;
    (void)errlen;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return STK_OK;
}

int stk__fake_check(stk__dev *d, stk__stream st, const void *p, size_t n, uint64_t hash)
{
    fake *f = (fake *)d;
    char err[64];
    fop *o = new_op(OP_CHECK, err, sizeof err);
    if (!o)
        return STK_ENOMEM;
    o->src = p;
    o->n = n;
    o->hash = hash;
    pthread_mutex_lock(&f->mu);
    int rc = push(f, st, o, err, sizeof err);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int f_convert(stk__dev *d, const stk__convert *cv, stk__dptr src, stk__dptr dst, size_t n,
                     stk__stream st, char *err, size_t errlen)
{
    fake *f = (fake *)d;
    fop *o = new_op(OP_CONVERT, err, errlen);
    if (!o)
        return STK_ENOMEM;
    o->cv = *cv;
    o->src = (const void *)(uintptr_t)src;
    o->dst = (void *)(uintptr_t)dst;
    o->n = n;
    pthread_mutex_lock(&f->mu);
    int rc = push(f, st, o, err, errlen);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int f_event_record(stk__dev *d, stk__event ev, stk__stream st, char *err, size_t errlen)
{
    fake *f = (fake *)d;
    fev *e = ev;
    fop *o = new_op(OP_RECORD, err, errlen);
    if (!o)
        return STK_ENOMEM;
    o->ev = e;
    pthread_mutex_lock(&f->mu);
    o->gen = ++e->recorded;
    int rc = push(f, st, o, err, errlen);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int event_state(fev *e, char *err, size_t errlen)
{
    if (e->done < e->recorded)
        return 1;
    if (e->failed) {
        stk__fmt(err, errlen, "%s", e->msg);
        return STK_EDEVICE;
    }
    return STK_OK;
}

static int f_event_query(stk__dev *d, stk__event ev, char *err, size_t errlen)
{
    fake *f = (fake *)d;
    pthread_mutex_lock(&f->mu);
    int rc = event_state(ev, err, errlen);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int f_event_sync(stk__dev *d, stk__event ev, char *err, size_t errlen)
{
    fake *f = (fake *)d;
    pthread_mutex_lock(&f->mu);
    int rc;
    while ((rc = event_state(ev, err, errlen)) == 1)
        stk__cond_wait_ns(&f->cond, &f->mu, 50000000ULL);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int f_stream_wait(stk__dev *d, stk__stream st, stk__event ev, char *err, size_t errlen)
{
    fake *f = (fake *)d;
    fev *e = ev;
    pthread_mutex_lock(&f->mu);
    int rc = STK_OK;
    if (e->recorded > e->done) {
        fop *o = new_op(OP_WAIT, err, errlen);
        if (!o) {
            rc = STK_ENOMEM;
        } else {
            o->ev = e;
            o->gen = e->recorded;
            rc = push(f, st, o, err, errlen);
        }
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void f_close(stk__dev *d)
{
    fake *f = (fake *)d;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->th, NULL);
    /* Streams the caller forgot: their work has run (the executor stops
     * only when nothing is runnable; a wait that can never be satisfied is
     * dropped). */
    for (fstream *s = f->streams, *n; s; s = n) {
        n = s->next;
        for (fop *o = s->head, *on; o; o = on) {
            on = o->next;
            stk__free(o);
        }
        stk__free(s);
    }
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cond);
    stk__free(f);
}

static const stk__dev_ops fake_ops = {
    .name = "fake",
    .host_alloc = f_host_alloc,
    .host_free = f_host_free,
    .dev_alloc = f_dev_alloc,
    .dev_free = f_dev_free,
    .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy,
    .event_create = f_event_create,
    .event_destroy = f_event_destroy,
    .copy_h2d = f_copy,
    .copy_d2h = f_copy_d2h,
    .convert = f_convert,
    .event_record = f_event_record,
    .event_query = f_event_query,
    .event_sync = f_event_sync,
    .stream_wait_event = f_stream_wait,
    .enter = NULL,
    .leave = NULL,
    .close = f_close,
};

int stk__dev_open_fake(stk__dev **out, int id, char *err, size_t errlen)
{
    *out = NULL;
    fake *f = stk__calloc(1, sizeof *f);
    if (!f) {
        stk__fmt(err, errlen, "fake device: out of memory");
        return STK_ENOMEM;
    }
    f->base.ops = &fake_ops;
    f->base.id = id;
    f->base.kind = STK_DEVICE_FAKE;
    pthread_mutex_lock(&g_mu);
    f->rng = g_seed;
    f->max_delay_us = g_delay_us;
    pthread_mutex_unlock(&g_mu);
    /* STOKER_FAKE_GBPS models the bus for bench/bench_device.py. */
    const char *gbps = getenv("STOKER_FAKE_GBPS");
    f->copy_gbps = gbps ? strtod(gbps, NULL) : 0;
    if (pthread_mutex_init(&f->mu, NULL)) {
        stk__free(f);
        stk__fmt(err, errlen, "fake device: cannot create a lock");
        return STK_ENOMEM;
    }
    if (stk__cond_init(&f->cond)) {
        pthread_mutex_destroy(&f->mu);
        stk__free(f);
        stk__fmt(err, errlen, "fake device: cannot create a condition variable");
        return STK_ENOMEM;
    }
    if (pthread_create(&f->th, NULL, executor, f)) {
        pthread_cond_destroy(&f->cond);
        pthread_mutex_destroy(&f->mu);
        stk__free(f);
        stk__fmt(err, errlen, "fake device: cannot start its thread");
        return STK_ENOMEM;
    }
    *out = &f->base;
    return STK_OK;
}

void stk__dev_close(stk__dev *d)
{
    if (d)
        d->ops->close(d);
}
