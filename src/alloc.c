/* alloc.c -- the library's one allocator. In the test library (STK_TEST,
 * see internal.h) it counts live allocations and can be told to fail, so
 * tests prove there are no leaks and that every allocation failure is
 * handled; the installed library calls the C library's allocator directly. */
#include "internal.h"
#include <pthread.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifdef STK_TEST
/* Relaxed is enough: the counters are statistics read after threads joined,
 * and the failure countdown only needs each decrement to be atomic. */
static atomic_long g_live;
static atomic_long g_count;
static atomic_long g_fail_after = -1;

static bool should_fail(void)
{
    atomic_fetch_add_explicit(&g_count, 1, memory_order_relaxed);
    long f = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
    if (f < 0)
        return false;
    long prev = atomic_fetch_sub_explicit(&g_fail_after, 1, memory_order_relaxed);
    return prev == 0;
}

static void count_live(long d)
{
    atomic_fetch_add_explicit(&g_live, d, memory_order_relaxed);
}

long stk__alloc_live(void)
{
    return atomic_load_explicit(&g_live, memory_order_relaxed);
}

long stk__alloc_count(void)
{
    return atomic_load_explicit(&g_count, memory_order_relaxed);
}

void stk__alloc_fail_after(long n)
{
    atomic_store_explicit(&g_fail_after, n, memory_order_relaxed);
}
#else
static inline bool should_fail(void)
{
    return false;
}

static inline void count_live(long d)
{
    (void)d;
}
#endif

void *stk__malloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = malloc(n ? n : 1);
    if (p)
        count_live(1);
    return p;
}

void *stk__calloc(size_t count, size_t n)
{
    if (should_fail())
        return NULL;
    void *p = calloc(count ? count : 1, n ? n : 1);
    if (p)
        count_live(1);
    return p;
}

void *stk__realloc(void *p, size_t n)
{
    if (!p)
        return stk__malloc(n);
    if (should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

void stk__free(void *p)
{
    if (!p)
        return;
    count_live(-1);
    free(p);
}

void *stk__map(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    count_live(1);
    return p;
}

void stk__unmap(void *p, size_t n)
{
    if (!p)
        return;
    count_live(-1);
    munmap(p, n ? n : 1);
}

void stk__map_trim(void *p, size_t n)
{
    if (p && n)
        madvise(p, n, MADV_DONTNEED);
}

size_t stk__grow_cap(size_t cap, size_t need, size_t elem)
{
    if (need <= cap)
        return cap;
    /* No object may exceed PTRDIFF_MAX bytes (pointer differences within it
     * must be representable), so that also bounds n * elem below SIZE_MAX. */
    size_t max = elem ? (size_t)PTRDIFF_MAX / elem : 0;
    if (need > max)
        return 0;
    size_t c = cap > max / 2 ? max : cap * 2;
    if (c < 16)
        c = 16 < max ? 16 : max;
    return c < need ? need : c;
}

int stk__grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (!elem)
        return STK_EINVAL;
    if (need <= *cap)
        return STK_OK;
    size_t c = stk__grow_cap(*cap, need, elem);
    if (!c)
        return STK_ENOMEM;
    void *q = stk__realloc(*p, c * elem);
    if (!q)
        return STK_ENOMEM;
    *p = q;
    *cap = c;
    return STK_OK;
}

char *stk__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = stk__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int stk__scratch_reserve(stk__scratch *s, size_t n)
{
    if (n <= s->cap)
        return STK_OK;
    if (n > s->limit)
        return STK_ETOOBIG;
    /* Grow geometrically (bounded by the limit) so a run of growing samples
     * does not reallocate every time. */
    size_t want = s->cap * 2 > n ? s->cap * 2 : n;
    if (want > s->limit)
        want = s->limit;
    uint8_t *p = stk__malloc(want);
    if (!p)
        return STK_ENOMEM;
    stk__free(s->p);
    s->p = p;
    s->cap = want;
    return STK_OK;
}

void stk__scratch_free(stk__scratch *s)
{
    stk__free(s->p);
    s->p = NULL;
    s->cap = 0;
}

void stk__fmt(char *buf, size_t n, const char *fmt, ...)
{
    if (!n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (r < 0)
        buf[0] = '\0';
}

uint64_t stk__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void stk__cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / 1000000000ULL);
    ts.tv_nsec = (long)(t % 1000000000ULL);
    pthread_cond_timedwait(cv, m, &ts);
}

int stk__cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a))
        return -1;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int r = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return r;
}

uint8_t *stk__sink_reserve(stk__sink *s, size_t n, int *rc)
{
    if (s->alloc) {
        if (s->dst && n <= s->cap) {
            *rc = STK_OK;
            return s->dst;
        }
        return s->alloc(s, n, rc);
    }
    if (s->grow) {
        *rc = stk__scratch_reserve(s->grow, n ? n : 1);
        return *rc ? NULL : s->grow->p;
    }
    if (n > s->cap) {
        *rc = STK_ETOOBIG;
        return NULL;
    }
    *rc = STK_OK;
    return s->dst;
}

uint8_t *stk__sink_take(stk__sink *s, size_t n, const char *what, int *rc, char *err, size_t errlen)
{
    uint8_t *buf = stk__sink_reserve(s, n, rc);
    if (!buf && *rc == STK_ETOOBIG)
        stk__fmt(err, errlen, "%s of %zu bytes does not fit its %zu-byte budget", what, n,
                 s->grow ? s->grow->limit : s->cap);
    else if (!buf)
        stk__fmt(err, errlen, "out of memory for %zu bytes", n);
    return buf;
}
