/*
 * internal.h -- shared internals of libstoker: the allocator every module uses,
 * the per-thread scratch buffer, error-message helpers, and the lock order.
 *
 * Lock order (outer first; never hold a lock across I/O, decoding or waiting
 * on another thread except through the condition variables named here):
 *   1. core.lock (loader_core.h; the loader's one lock: the ring's state
 *                         (stk__ring, ring/ring.h: buffer states, claims,
 *                         cursors, autotune's controller), the delivered
 *                         position, errors (loader_errors.c), and
 *                         the schedule's resumed layout, which is only
 *                         written under it (schedule/schedule.c: its queries
 *                         take no lock); cond_work for workers, cond_ready for
 *                         the consumer, cond_idle for seek/close waiting on
 *                         in-flight work)
 *   2. stk__fetch.lock  (the fetch stage's plan; taken under the loader lock
 *                         only by seek; never calls back into the loader: its
 *                         plan queries the schedule, which takes no lock but
 *                         the shard-order cache's, 4.)
 *   3. stk__remote.lock (the transfer engine's queues; innermost for the
 *                         fetch stage; request callbacks run without it)
 *   4. stk__shard_orders' mutex (a table cache; takes no other lock)
 *   5. stk__cache.mu, then the cache directory's flock (only around a
 *      reservation; never while waiting on the network). Never taken under
 *      the loader's or the fetch stage's lock: admissions are decided under
 *      the stage's lock (chunk C_ADMIT), made with no lock held, installed
 *      under it again (fetch.c admit_pending); the cache's counters are
 *      atomics, so pins and stats never wait on a reservation
 *   stk__alloc's test counters are atomics, taken under no lock.
 *   loader_held.c's g_held_lock (the table of batches the user holds) is taken
 *   under no other lock and takes none.
 */
#ifndef STK_INTERNAL_H
#define STK_INTERNAL_H

#define STK_BUILDING_LIBRARY 1
#include "stoker.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STK_ERRMSG_MAX 512

/* ---- Allocator ---------------------------------------------------------
 * Every allocation of the library goes through these, so tests can count live
 * allocations and make the Nth one fail. Same contracts as the C library. */
void *stk__malloc(size_t n);
void *stk__calloc(size_t count, size_t n);
void *stk__realloc(void *p, size_t n);
void stk__free(void *p);
char *stk__strdup(const char *s);
/* Address space for a growable arena: n bytes reserved, backed by memory
 * only where written (MAP_NORESERVE), counted as one allocation. trim gives
 * the pages of [p, p + n) back (they read as zeros afterwards). */
void *stk__map(size_t n);
void stk__unmap(void *p, size_t n);
void stk__map_trim(void *p, size_t n);

/* The library's one growable array: makes the array *p of *cap elements of
 * elem bytes hold at least need elements. When need > *cap it is reallocated
 * (contents kept) to the larger of need, twice *cap and 16 elements, so n
 * appends make O(log n) allocations; the new capacity is written to *cap.
 * STK_OK (also when it was large enough); STK_ENOMEM when the allocation
 * fails or need elements of elem bytes exceed PTRDIFF_MAX bytes, *p and *cap
 * then unchanged; STK_EINVAL for elem 0. Callers pass a typed array as
 * (void **)&arr: GCC and Clang let void * alias every pointer type. */
int stk__grow(void **p, size_t *cap, size_t need, size_t elem);
/* The capacity stk__grow moves to (need <= cap: cap), 0 if none can hold
 * need elements. */
size_t stk__grow_cap(size_t cap, size_t need, size_t elem);

/* ---- Test hooks -----------------------------------------------------------
 * Built only with -DSTK_TEST (as SQLite's SQLITE_TEST): the installed
 * libstoker.a/.so have neither these functions nor the counting and fault
 * checks behind them; the C tests link build/MODE/libstoker_test.a, in which
 * every source that mentions STK_TEST is compiled again with it (Makefile).
 * So STK_TEST may select code in .c files only; headers use it around
 * declarations, never to change a type, an inline function or a macro that
 * other objects are compiled with. */
#ifdef STK_TEST
long stk__alloc_live(void);         /* live allocations now */
void stk__alloc_fail_after(long n); /* n-th next allocation fails; -1 = never */
long stk__alloc_count(void);        /* allocations made so far */
/* fn(arg) runs in stk_loader_next just before a delivered batch is compacted
 * and its view filled (NULL: none). Set it while no loader is open. */
void stk__test_publish_hook(void (*fn)(void *), void *arg);
#endif

/* ---- Scratch ------------------------------------------------------------
 * A growable per-thread buffer with a hard limit (part of the memory bound). */
typedef struct stk__scratch {
    uint8_t *p;
    size_t cap;
    size_t limit;
} stk__scratch;

/* Makes s->p hold at least n bytes. Contents are not preserved.
 * STK_OK, STK_ETOOBIG (n > limit), STK_ENOMEM. */
int stk__scratch_reserve(stk__scratch *s, size_t n);
void stk__scratch_free(stk__scratch *s);

/* ---- Sinks ---------------------------------------------------------------
 * Where a read or a decode puts a sample's bytes: a fixed buffer (dst/cap:
 * a dense batch's slot), the thread's growable scratch (grow), or exactly
 * the bytes asked for, taken from a variable batch's arena by `alloc`
 * (which sets dst/cap, and on failure explains in `why`). */
typedef struct stk__sink {
    uint8_t *dst;
    size_t cap;
    stk__scratch *grow;
    uint8_t *(*alloc)(struct stk__sink *s, size_t n, int *rc);
    void *ctx;
    char why[256];
} stk__sink;

/* Returns a buffer of at least n bytes for the sample, or NULL with *rc set:
 * STK_ETOOBIG if n exceeds the budget, STK_ENOMEM. Asking again for no more
 * than the last answer gives the same buffer. */
uint8_t *stk__sink_reserve(stk__sink *s, size_t n, int *rc);
/* stk__sink_reserve for a reader's sample, with the message the read fails
 * with in err: "WHAT of N bytes does not fit its B-byte budget"
 * (STK_ETOOBIG), "out of memory for N bytes" (STK_ENOMEM). what: "sample",
 * "record", ... */
uint8_t *stk__sink_take(stk__sink *s, size_t n, const char *what, int *rc, char *err,
                        size_t errlen);

/* ---- Messages ----------------------------------------------------------- */
/* snprintf into buf of size n, always terminated, never overflowing. */
void stk__fmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Which run of a partition holds i: the last k < n with first[k] <= i,
 * first ascending with first[0] <= i (shards' first samples, a mixture's
 * sources' first ids, blocks' first samples). O(log n). */
static inline size_t stk__run_of(const uint64_t *first, size_t n, uint64_t i)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (first[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* ---- Counter-based randomness ------------------------------------------
 * Every random decision for sample i in epoch e comes from a generator keyed by
 * (seed, epoch, i): SplitMix64's output function applied to key + counter *
 * golden gamma. Passes BigCrush as a stream; any draw is reproducible from the
 * key and its counter alone, so results never depend on which thread works. */
static inline uint64_t stk__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct stk__rng {
    uint64_t key;
    uint64_t counter;
} stk__rng;

static inline stk__rng stk__rng_for(uint64_t seed, uint64_t epoch, uint64_t sample)
{
    stk__rng r;
    r.key = stk__mix64(stk__mix64(stk__mix64(seed ^ 0x53544b524e47ULL) ^ epoch) ^ sample);
    r.counter = 0;
    return r;
}

static inline uint64_t stk__rng_u64(stk__rng *r)
{
    r->counter++;
    return stk__mix64(r->key + r->counter * 0x9e3779b97f4a7c15ULL);
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double stk__rng_uniform(stk__rng *r)
{
    return (double)(stk__rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n) (n >= 1), unbiased (Lemire's method). */
static inline uint64_t stk__rng_below(stk__rng *r, uint64_t n)
{
    uint64_t x = stk__rng_u64(r);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t l = (uint64_t)m;
    if (l < n) {
        uint64_t t = (0 - n) % n;
        while (l < t) {
            x = stk__rng_u64(r);
            m = (__uint128_t)x * n;
            l = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* ---- CPUs (cpus.c) ------------------------------------------------------
 * The default worker count: CPUs in this thread's affinity mask, capped by the
 * cgroup CPU quota, divided by LOCAL_WORLD_SIZE when set; 1..256. STK_OK, or
 * STK_EINVAL with a message for a malformed LOCAL_WORLD_SIZE. */
int stk__default_threads(unsigned *out, char *err, size_t errlen);
/* MemAvailable of /proc/meminfo in bytes (0 when it cannot be read). */
uint64_t stk__mem_available(void);
/* CPUs the cgroup quota allows (v2 cpu.max and v1 cfs quota, the tightest
 * along the cgroup's path; rounded up), reading the given /proc/self/cgroup
 * and mountinfo files; 0 when there is no limit. */
unsigned stk__cgroup_cpus(const char *proc_cgroup, const char *mountinfo);

/* Monotonic clock in nanoseconds. */
uint64_t stk__now_ns(void);

/* Condition variables on the monotonic clock: every wait of the library is
 * timed (a slice of at most ns) so it can re-check a cancel flag. */
int stk__cond_init(pthread_cond_t *cv); /* 0 or an errno value */
void stk__cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ns);
/* For a loop that waits at most timeout_ns (0: no limit) from start, in
 * slices of at most slice_ns so it re-checks its conditions: the next wait,
 * or 0 when the time is up (now is stk__now_ns()). */
static inline uint64_t stk__wait_slice(uint64_t start, uint64_t now, uint64_t timeout_ns,
                                       uint64_t slice_ns)
{
    if (!timeout_ns)
        return slice_ns;
    if (now - start >= timeout_ns)
        return 0;
    uint64_t left = timeout_ns - (now - start);
    return left < slice_ns ? left : slice_ns;
}

#endif
