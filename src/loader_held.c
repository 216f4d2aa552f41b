/*
 * loader_held.c -- the process-wide table of batches the user holds.
 */
#include "loader_core.h"

#include <unistd.h>

/* ---- held batches ------------------------------------------------------------
 * Every batch handed to the user is entered in one process-wide table, by its
 * address, until it is released. A release, wait or sync first takes the
 * batch out of (or looks it up in) the table, without reading the batch, so a
 * batch that is not held -- released already, perhaps after its loader was
 * closed and the ring freed with the last batch -- is STK_EMISUSE instead of
 * a use after free. The table is the process's because a batch pointer names
 * no loader. Its nodes live in the memory of the batches they stand for (a
 * host buffer's `hnode`, or the core's `dnodes` for device batches), which
 * outlives them: a batch holds its core. g_held_lock is taken under no other
 * lock and around no call that blocks; fork holds it (pthread_atfork), so a
 * child finds it free, and the child's lookups miss the parent's batches
 * (pid). */
#define HELD_BUCKETS 256

static pthread_mutex_t g_held_lock = PTHREAD_MUTEX_INITIALIZER;

static held *g_held[HELD_BUCKETS];

static pthread_once_t g_held_once = PTHREAD_ONCE_INIT;

static void held_fork_prepare(void)
{
    pthread_mutex_lock(&g_held_lock);
}

static void held_fork_after(void)
{
    pthread_mutex_unlock(&g_held_lock);
}

static void held_init(void)
{
    (void)pthread_atfork(held_fork_prepare, held_fork_after, held_fork_after);
}

static size_t held_bucket(const stk_batch *v)
{
    uint64_t x = (uint64_t)(uintptr_t)v;
    x ^= x >> 29;
    x *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(x >> 56) % HELD_BUCKETS;
}

/* Enters v with node h (or, h NULL, a node taken from *spare). false only
 * when *spare is empty, which the callers make impossible. */
bool stk__held_put(held *h, held **spare, const stk_batch *v)
{
    pthread_once(&g_held_once, held_init);
    pthread_mutex_lock(&g_held_lock);
    if (!h && spare && (h = *spare) != NULL) {
        *spare = h->next;
        h->spare = spare;
    }
    if (h) {
        size_t k = held_bucket(v);
        h->view = v;
        h->pid = getpid();
        h->next = g_held[k];
        g_held[k] = h;
    }
    pthread_mutex_unlock(&g_held_lock);
    return h != NULL;
}

/* Whether this process holds v; `take` also removes it (a device batch's
 * node goes back to its spare list at once, while the batch still holds its
 * core, so the next device batch finds one). */
bool stk__held_find(const stk_batch *v, bool take)
{
    pid_t me = getpid();
    bool found = false;
    pthread_once(&g_held_once, held_init); /* before the lock is first taken */
    pthread_mutex_lock(&g_held_lock);
    for (held **pp = &g_held[held_bucket(v)]; *pp; pp = &(*pp)->next) {
        held *h = *pp;
        if (h->view != v || h->pid != me)
            continue;
        found = true;
        if (take) {
            *pp = h->next;
            h->view = NULL;
            if (h->spare) {
                h->next = *h->spare;
                *h->spare = h;
            }
        }
        break;
    }
    pthread_mutex_unlock(&g_held_lock);
    return found;
}
