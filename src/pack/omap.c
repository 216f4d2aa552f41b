/*
 * omap.c -- the ordered parallel map (pack.h): workers transform items
 * 0 .. n-1 into a window of slots, the consumer takes them strictly in
 * order. stk_pack is this map followed by the writer; because each item's
 * result depends only on the item, the output is the same whatever the
 * number of threads.
 *
 * Lock order: the map's one mutex is a leaf; it guards next, released,
 * done[] and stop, and is never held while fn runs. A slot's contents
 * belong to the worker from the moment it takes the item until it sets
 * done[] (under the mutex), then to the consumer until stk__omap_release;
 * the mutex orders those hand-overs.
 */
#include "pack/pack.h"

#include <pthread.h>
#include <stdio.h>

typedef struct omap_worker {
    stk__omap *m;
    unsigned id;
    pthread_t tid;
} omap_worker;

struct stk__omap {
    uint64_t n, window;
    stk__omap_fn fn;
    void *ctx;
    char name[12];
    pthread_mutex_t lock;
    pthread_cond_t cond_space; /* a slot came free, or stop */
    pthread_cond_t cond_done;  /* a result is there */
    uint64_t next;             /* the next item a worker takes */
    uint64_t released;         /* items the consumer gave back */
    bool *done;                /* per slot */
    bool stop;
    omap_worker *workers;
    unsigned started;
};

static void *omap_main(void *arg)
{
    omap_worker *wk = arg;
    stk__omap *m = wk->m;
    char name[16];
    snprintf(name, sizeof name, "%s-%u", m->name, wk->id);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&m->lock);
    for (;;) {
        while (!m->stop && m->next < m->n && m->next >= m->released + m->window)
            stk__cond_wait_ns(&m->cond_space, &m->lock, 100000000u);
        if (m->stop || m->next >= m->n)
            break;
        uint64_t i = m->next++;
        pthread_mutex_unlock(&m->lock);
        m->fn(m->ctx, wk->id, i, i % m->window);
        pthread_mutex_lock(&m->lock);
        m->done[i % m->window] = true;
        pthread_cond_broadcast(&m->cond_done);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

int stk__omap_start(stk__omap **out, uint64_t n, unsigned threads, uint64_t window,
                    const char *name, stk__omap_fn fn, void *ctx, char *err, size_t errlen)
{
    int rc = STK_ENOMEM;
    *out = NULL;
    stk__omap *m = stk__calloc(1, sizeof *m);
    if (!m || !(m->done = stk__calloc(window, sizeof *m->done)) ||
        !(m->workers = stk__calloc(threads, sizeof *m->workers))) {
        stk__fmt(err, errlen, "out of memory");
        goto fail;
    }
    m->n = n;
    m->window = window;
    m->fn = fn;
    m->ctx = ctx;
    stk__fmt(m->name, sizeof m->name, "%s", name);
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        stk__fmt(err, errlen, "cannot create a mutex");
        goto fail;
    }
    /* Monotonic clocks: both waits time out to re-check stop. */
    if (stk__cond_init(&m->cond_space) != 0) {
        pthread_mutex_destroy(&m->lock);
        stk__fmt(err, errlen, "cannot create a condition variable");
        goto fail;
    }
    if (stk__cond_init(&m->cond_done) != 0) {
        pthread_cond_destroy(&m->cond_space);
        pthread_mutex_destroy(&m->lock);
        stk__fmt(err, errlen, "cannot create a condition variable");
        goto fail;
    }
    for (unsigned k = 0; k < threads; k++) {
        m->workers[k] = (omap_worker){.m = m, .id = k};
        if (pthread_create(&m->workers[k].tid, NULL, omap_main, &m->workers[k]) != 0) {
            stk__fmt(err, errlen, "cannot start thread %u", k);
            stk__omap_stop(m);
            return STK_EIO;
        }
        m->started++;
    }
    *out = m;
    return STK_OK;
fail:
    if (m) {
        stk__free(m->done);
        stk__free(m->workers);
    }
    stk__free(m);
    return rc;
}

bool stk__omap_wait(stk__omap *m, uint64_t i, uint64_t timeout_ns)
{
    pthread_mutex_lock(&m->lock);
    bool done = m->done[i % m->window];
    if (!done) {
        stk__cond_wait_ns(&m->cond_done, &m->lock, timeout_ns);
        done = m->done[i % m->window];
    }
    pthread_mutex_unlock(&m->lock);
    return done;
}

void stk__omap_release(stk__omap *m, uint64_t i)
{
    pthread_mutex_lock(&m->lock);
    m->done[i % m->window] = false;
    m->released = i + 1;
    pthread_cond_broadcast(&m->cond_space);
    pthread_mutex_unlock(&m->lock);
}

void stk__omap_stop(stk__omap *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    m->stop = true;
    pthread_cond_broadcast(&m->cond_space);
    pthread_mutex_unlock(&m->lock);
    for (unsigned k = 0; k < m->started; k++)
        pthread_join(m->workers[k].tid, NULL);
    pthread_cond_destroy(&m->cond_done);
    pthread_cond_destroy(&m->cond_space);
    pthread_mutex_destroy(&m->lock);
    stk__free(m->done);
    stk__free(m->workers);
    stk__free(m);
}
