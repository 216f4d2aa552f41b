/* test_mt_lifecycle.c -- opening and closing from every state: right after
 * open, mid-epoch, while the consumer holds batches (they stay readable until
 * released; the last release frees), while workers wait for buffers or are
 * blocked in a read; STK_EBUSY, STK_TIMEOUT, double release, NULL arguments,
 * use after close or from a forked child, release from other threads. Also
 * run under ThreadSanitizer. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

long stk__alloc_live(void);
void stk__test_publish_hook(void (*fn)(void *), void *arg);

#define REC 64
#define N   200

static const char *g_records;

static void make_records(void)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/rec.bin", tu_tmpdir());
    uint8_t *buf = malloc(N * REC);
    REQUIRE(buf);
    for (uint64_t i = 0; i < N; i++)
        for (int j = 0; j < REC; j++)
            buf[i * REC + (uint64_t)j] = (uint8_t)(i * 3 + (uint64_t)j);
    tu_write_file(p, buf, N * REC);
    free(buf);
    g_records = p;
}

static int sample_ok(const stk_batch *b, size_t k)
{
    const uint8_t *p = (const uint8_t *)b->data + k * b->sample_bytes;
    for (int j = 0; j < REC; j++)
        if (p[j] != (uint8_t)(b->indices[k] * 3 + (uint64_t)j))
            return 0;
    return 1;
}

static int batch_ok(const stk_batch *b)
{
    int ok = b->size > 0;
    for (size_t k = 0; k < b->size; k++)
        ok &= sample_ok(b, k);
    return ok;
}

static stk_loader *open_records(unsigned threads, unsigned depth, size_t bs)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, g_records) == STK_OK);
    REQUIRE(stk_options_set_records(o, REC, 0, 0) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, bs) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_depth(o, depth) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 5) == STK_OK);
    stk_loader *l;
    int rc = stk_loader_open(&l, o);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_options_destroy(o);
    return l;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Close is prompt: well under the engine's 100 ms wait slices times a few. */
#define PROMPT_MS 500.0

static void timed_close(stk_loader *l, const char *what)
{
    double t0 = now_ms();
    stk_loader_close(l);
    double dt = now_ms() - t0;
    if (dt > PROMPT_MS)
        fprintf(stderr, "    close %s took %.0f ms\n", what, dt);
    CHECK(dt <= PROMPT_MS);
}

/* ---- close from every state ------------------------------------------------ */

static void test_close_right_after_open(void)
{
    static const unsigned threads[] = {1, 3, 8};
    for (int rep = 0; rep < 5; rep++)
        for (int t = 0; t < 3; t++)
            for (unsigned depth = 1; depth <= 3; depth += 2)
                timed_close(open_records(threads[t], depth, 8), "right after open");
}

static void test_close_mid_epoch(void)
{
    for (int stop = 1; stop < 6; stop++) {
        stk_loader *l = open_records(4, 3, 4);
        for (int k = 0; k < stop; k++) {
            stk_batch *b;
            REQUIRE(stk_loader_next(l, &b) == STK_OK);
            CHECK(batch_ok(b));
            stk_batch_release(b);
        }
        timed_close(l, "mid-epoch");
    }
    /* Across an epoch end, with the next epoch being prefetched. */
    stk_loader *l = open_records(2, 4, 64);
    stk_batch *b;
    while (stk_loader_next(l, &b) == STK_OK)
        stk_batch_release(b);
    timed_close(l, "at the end of an epoch");
}

typedef struct release_arg {
    stk_batch *b;
    int ok;
} release_arg;

static void *release_thread(void *p)
{
    release_arg *a = p;
    a->ok = batch_ok(a->b);
    stk_batch_release(a->b);
    return NULL;
}

/* Held batches outlive close: readable until released, from any thread, and
 * the last release frees everything (tu_run checks no allocation leaks). */
static void test_close_while_holding(void)
{
    long live0 = stk__alloc_live();
    stk_loader *l = open_records(3, 2, 8); /* depth 2: 3 buffers */
    stk_batch *b[3];
    for (int k = 0; k < 3; k++)
        REQUIRE(stk_loader_next(l, &b[k]) == STK_OK);
    timed_close(l, "while the consumer holds every buffer");
    /* The loader is gone but its batches are not. */
    CHECK(stk__alloc_live() > live0);
    for (int k = 0; k < 3; k++) {
        CHECK(batch_ok(b[k]));
        CHECK_EQ(b[k]->index, (uint64_t)k);
        CHECK_EQ(b[k]->size, 8);
    }
    stk_batch_release(b[0]);
    CHECK(batch_ok(b[1]));
    release_arg a = {b[1], 0};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, release_thread, &a) == 0);
    pthread_join(th, NULL);
    CHECK(a.ok);
    CHECK(stk__alloc_live() > live0);
    CHECK(batch_ok(b[2]));
    stk_batch_release(b[2]);
    CHECK_EQ(stk__alloc_live(), live0);
}

/* Workers waiting for a free buffer must not delay close. */
static void test_close_with_workers_waiting(void)
{
    stk_loader *l = open_records(4, 1, 4); /* depth 1: 2 buffers */
    stk_batch *b0, *b1;
    REQUIRE(stk_loader_next(l, &b0) == STK_OK);
    REQUIRE(stk_loader_next(l, &b1) == STK_OK);
    usleep(150000); /* past a wait slice: every worker is parked */
    timed_close(l, "with workers waiting for buffers");
    CHECK(batch_ok(b0) && batch_ok(b1));
    stk_batch_release(b1);
    stk_batch_release(b0);
}

/* ---- busy, timeout, double release ----------------------------------------- */

static void test_ebusy_when_all_held(void)
{
    for (unsigned depth = 1; depth <= 3; depth++) {
        stk_loader *l = open_records(2, depth, 4);
        /* depth + 1 buffers: the consumer can hold that many batches. */
        stk_batch *held[4];
        for (unsigned k = 0; k < depth + 1; k++)
            REQUIRE(stk_loader_next(l, &held[k]) == STK_OK);
        stk_batch *b = (stk_batch *)1;
        double t0 = now_ms();
        CHECK_EQ(stk_loader_next(l, &b), STK_EBUSY);
        CHECK(now_ms() - t0 < 100); /* answers at once, does not wait */
        CHECK(b == NULL);
        CHECK(strstr(stk_loader_errmsg(l), "release") != NULL);
        CHECK_EQ(stk_loader_next_timeout(l, &b, 50), STK_EBUSY);
        /* Nothing was lost: releasing one lets the next batch through. */
        stk_batch_release(held[0]);
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        CHECK_EQ(b->index, depth + 1);
        CHECK(batch_ok(b));
        stk_batch_release(b);
        for (unsigned k = 1; k < depth + 1; k++)
            stk_batch_release(held[k]);
        stk_loader_close(l);
    }
}

/* Releasing twice must not give a buffer back twice: afterwards the ring
 * still has exactly depth + 1 buffers (holding them all gives STK_EBUSY). */
static void test_double_release_harmless(void)
{
    stk_loader *l = open_records(3, 1, 4);
    stk_batch *b0, *b1, *b2;
    REQUIRE(stk_loader_next(l, &b0) == STK_OK);
    stk_batch_release(b0);
    stk_batch_release(b0);
    REQUIRE(stk_loader_next(l, &b1) == STK_OK);
    REQUIRE(stk_loader_next(l, &b2) == STK_OK);
    CHECK(b1 != b2);
    CHECK(b1->index == 1 && b2->index == 2);
    CHECK(batch_ok(b1) && batch_ok(b2));
    stk_batch *b3;
    CHECK_EQ(stk_loader_next(l, &b3), STK_EBUSY);
    stk_batch_release(b1);
    stk_batch_release(b2);
    /* The rest of the epoch is whole. */
    uint64_t samples = 12;
    int ok = 1;
    while (stk_loader_next(l, &b3) == STK_OK) {
        samples += b3->size;
        ok &= batch_ok(b3);
        stk_batch_release(b3);
        stk_batch_release(b3);
    }
    CHECK(ok);
    CHECK_EQ(samples, N);
    stk_loader_close(l);
}

/* A stale release (issue 18): a batch released already, also after close
 * freed the ring with the last batch, is STK_EMISUSE without touching its
 * freed memory (under ASan any read of it would be reported). So are wait,
 * sync and record_stream of a batch not held. */
static void test_stale_release_is_misuse(void)
{
    long live0 = stk__alloc_live();
    stk_loader *l = open_records(3, 2, 4);
    stk_batch *b0, *b1, *b2;
    REQUIRE(stk_loader_next(l, &b0) == STK_OK);
    REQUIRE(stk_loader_next(l, &b1) == STK_OK);
    REQUIRE(stk_loader_next(l, &b2) == STK_OK);
    CHECK_EQ(stk_batch_release(b0), STK_OK);
    CHECK_EQ(stk_batch_release(b0), STK_EMISUSE); /* twice while open */
    CHECK_EQ(stk_batch_sync(b0), STK_EMISUSE);
    CHECK_EQ(stk_batch_wait(b0, NULL), STK_EMISUSE);
    CHECK_EQ(stk_batch_record_stream(b0, NULL), STK_EMISUSE);
    CHECK_EQ(stk_batch_sync(b1), STK_OK); /* held: host batches are ready */
    CHECK_EQ(stk_batch_record_stream(b1, NULL), STK_OK);
    stk_loader_close(l);
    CHECK(batch_ok(b1) && batch_ok(b2)); /* held batches outlive close */
    CHECK_EQ(stk_batch_release(b1), STK_OK);
    CHECK_EQ(stk_batch_release(b1), STK_EMISUSE); /* after close, ring alive */
    CHECK_EQ(stk_batch_release(b2), STK_OK);      /* the last: frees the ring */
    CHECK_EQ(stk__alloc_live(), live0);
    /* Every pointer now points into freed memory. */
    CHECK_EQ(stk_batch_release(b2), STK_EMISUSE);
    CHECK_EQ(stk_batch_release(b1), STK_EMISUSE);
    CHECK_EQ(stk_batch_release_stream(b0, NULL), STK_EMISUSE);
    CHECK_EQ(stk_batch_sync(b2), STK_EMISUSE);
    CHECK_EQ(stk_batch_wait(b2, NULL), STK_EMISUSE);
    CHECK_EQ(stk_batch_record_stream(b2, NULL), STK_EMISUSE);
    CHECK_EQ(stk_batch_release(NULL), STK_OK);
    CHECK_EQ(stk_batch_record_stream(NULL, NULL), STK_EINVAL);
}

/* Many threads releasing the same batches at once: each is given back
 * exactly once (one STK_OK), the others are STK_EMISUSE. */
typedef struct race_arg {
    stk_batch **b;
    int n, oks;
    pthread_barrier_t *bar;
} race_arg;

static void *race_release(void *p)
{
    race_arg *a = p;
    pthread_barrier_wait(a->bar);
    for (int k = 0; k < a->n; k++)
        if (stk_batch_release(a->b[k]) == STK_OK)
            a->oks++;
    return NULL;
}

static void test_concurrent_double_release(void)
{
    stk_loader *l = open_records(3, 2, 4); /* depth 2: 3 buffers */
    for (int round = 0; round < 20; round++) {
        stk_batch *b[3];
        for (int k = 0; k < 3; k++) {
            int rc = stk_loader_next(l, &b[k]);
            if (rc == STK_END) /* the next epoch */
                rc = stk_loader_next(l, &b[k]);
            REQUIRE(rc == STK_OK);
        }
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 4);
        race_arg a[4];
        pthread_t th[4];
        for (int t = 0; t < 4; t++) {
            a[t] = (race_arg){b, 3, 0, &bar};
            REQUIRE(pthread_create(&th[t], NULL, race_release, &a[t]) == 0);
        }
        int oks = 0;
        for (int t = 0; t < 4; t++) {
            pthread_join(th[t], NULL);
            oks += a[t].oks;
        }
        pthread_barrier_destroy(&bar);
        CHECK_EQ(oks, 3);
        stk_batch *x;
        int rc = stk_loader_next(l, &x); /* the ring is whole: a batch or END */
        CHECK(rc == STK_OK || rc == STK_END);
        if (rc == STK_OK)
            stk_batch_release(x);
    }
    stk_loader_close(l);
}

static void test_null_arguments(void)
{
    stk_batch *b = (stk_batch *)1;
    CHECK_EQ(stk_loader_next(NULL, &b), STK_EMISUSE);
    CHECK_EQ(stk_loader_next_timeout(NULL, &b, 5), STK_EMISUSE);
    stk_batch_release(NULL);
    stk_loader_close(NULL);
    CHECK(stk_loader_errmsg(NULL) != NULL);
    CHECK_EQ(stk_loader_memory_bound(NULL), 0);
    CHECK_EQ(stk_loader_error_count(NULL), 0);
    stk_info info = {.struct_size = sizeof info};
    stk_stats st = {.struct_size = sizeof st};
    stk_state s = {.struct_size = sizeof s};
    CHECK_EQ(stk_loader_info(NULL, &info), STK_EMISUSE);
    CHECK_EQ(stk_loader_stats(NULL, &st), STK_EMISUSE);
    CHECK_EQ(stk_loader_get_state(NULL, &s), STK_EMISUSE);
    CHECK_EQ(stk_loader_set_epoch(NULL, 0), STK_EMISUSE);

    stk_loader *l = open_records(2, 2, 4);
    CHECK_EQ(stk_loader_next(l, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_next_timeout(l, NULL, 5), STK_EINVAL);
    CHECK_EQ(stk_loader_info(l, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_stats(l, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_get_state(l, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_set_state(l, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_thread_stats(l, 0, 0, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_stage_stats(l, 0, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_error_get(l, 0, NULL), STK_EINVAL);
    stk_sample_error e;
    CHECK_EQ(stk_loader_error_get(l, 0, &e), STK_EINVAL); /* no errors yet */
    CHECK(stk_loader_errmsg(l) != NULL);
    /* Still fully working after all that. */
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK(batch_ok(b));
    stk_batch_release(b);
    stk_loader_close(l);

    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_loader_open(&l, NULL), STK_EINVAL);
    CHECK_EQ(stk_loader_next(l, &b), STK_EMISUSE);
    stk_loader_close(l);
    stk_options_destroy(o);
}

/* A forked child cannot use its parent's loader: STK_EMISUSE with a message,
 * and close in the child is harmless (the parent still owns it). */
static void test_fork_child_misuse(void)
{
    stk_loader *l = open_records(3, 2, 4);
    stk_batch *held;
    REQUIRE(stk_loader_next(l, &held) == STK_OK);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        stk_batch *b = (stk_batch *)1;
        int code = 0;
        if (stk_loader_next(l, &b) != STK_EMISUSE || b != NULL)
            code |= 1;
        if (!strstr(stk_loader_errmsg(l), "fork"))
            code |= 2;
        stk_state s = {.struct_size = sizeof s};
        if (stk_loader_get_state(l, &s) != STK_EMISUSE)
            code |= 4;
        if (stk_loader_set_epoch(l, 3) != STK_EMISUSE)
            code |= 8;
        /* The parent's batch: never released by the child. */
        if (stk_batch_release(held) != STK_EMISUSE)
            code |= 16;
        stk_loader_close(l);
        _exit(code);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    /* The parent's loader is untouched. */
    CHECK(batch_ok(held));
    stk_batch_release(held);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->index, 1);
    stk_batch_release(b);
    stk_loader_close(l);
}

/* ---- a worker blocked in the kernel: a FIFO named like an image -------------- */

static const char *fifo_tree(const char **fifo)
{
    static char root[900], f[1000];
    snprintf(root, sizeof root, "%s/fifo", tu_tmpdir());
    snprintf(f, sizeof f, "%s/c/0pipe.jpg", root);
    *fifo = f;
    struct stat st;
    if (stat(root, &st) == 0)
        return root;
    char p[1100];
    snprintf(p, sizeof p, "%s/c", root);
    tu_mkdirs(p);
    for (int k = 1; k < 6; k++) {
        snprintf(p, sizeof p, "%s/c/%d.jpg", root, k);
        tu_write_file(p, "data", 4);
    }
    REQUIRE(mkfifo(f, 0600) == 0);
    return root;
}

static stk_loader *open_fifo_tree(void)
{
    const char *fifo;
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, fifo_tree(&fifo)) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 2) == STK_OK);
    REQUIRE(stk_options_set_threads(o, 2) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 0) == STK_OK);
    REQUIRE(stk_options_set_on_error(o, STK_ON_ERROR_SKIP) == STK_OK);
    stk_loader *l;
    REQUIRE(stk_loader_open(&l, o) == STK_OK);
    stk_options_destroy(o);
    return l;
}

/* Opens the FIFO so a reader blocked in open() goes on; returns the fd. */
static int unblock_fifo(void)
{
    const char *fifo;
    fifo_tree(&fifo);
    int fd = open(fifo, O_RDWR | O_NONBLOCK);
    REQUIRE(fd >= 0);
    return fd;
}

/* Freezing the workers: a signal handler that parks the thread it runs on
 * until released, so a test can make "nothing can arrive" hold for sure. */
static sem_t g_thaw;
static atomic_int g_frozen;

static void freeze_handler(int sig)
{
    (void)sig;
    atomic_fetch_add(&g_frozen, 1);
    while (sem_wait(&g_thaw) != 0)
        ;
    atomic_fetch_sub(&g_frozen, 1);
}

/* Sends every stk-work-* thread into freeze_handler; returns how many. */
static int freeze_workers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = freeze_handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    DIR *d = opendir("/proc/self/task");
    REQUIRE(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[300], comm[64] = "";
        snprintf(p, sizeof p, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        if (!fgets(comm, sizeof comm, f))
            comm[0] = 0;
        fclose(f);
        if (strncmp(comm, "stk-work-", 9))
            continue;
        if (syscall(SYS_tgkill, getpid(), atoi(e->d_name), SIGUSR1) == 0)
            n++;
    }
    closedir(d);
    double t0 = now_ms();
    while (atomic_load(&g_frozen) < n && now_ms() - t0 < 5000)
        usleep(1000);
    REQUIRE(atomic_load(&g_frozen) == n);
    return n;
}

static void thaw_workers(int n)
{
    for (int k = 0; k < n; k++)
        sem_post(&g_thaw);
    double t0 = now_ms();
    while (atomic_load(&g_frozen) > 0 && now_ms() - t0 < 5000)
        usleep(1000);
}

/* next_timeout returns STK_TIMEOUT, after about its timeout, when no batch
 * can arrive (the workers are frozen), and loses nothing: after the thaw the
 * epoch goes on with the next batch, every sample exactly once. */
static void test_next_timeout(void)
{
    REQUIRE(sem_init(&g_thaw, 0, 0) == 0);
    stk_loader *l = open_records(3, 1, 4); /* 2 ring buffers */
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    uint8_t seen[N] = {0};
    int ok = 1;
    for (size_t k = 0; k < b->size; k++)
        seen[b->indices[k]]++;
    stk_batch_release(b);
    /* Let the workers fill the ring and park in their timed wait, where the
     * signal finds them without the loader's lock held. */
    usleep(50000);
    int nth = freeze_workers();
    CHECK_EQ(nth, 3);
    /* At most depth + 1 = 2 batches were finished before the freeze. */
    int got = 1, timeouts = 0;
    double dt = 0;
    for (int k = 0; k < 4 && !timeouts; k++) {
        b = (stk_batch *)1;
        double t0 = now_ms();
        int rc = stk_loader_next_timeout(l, &b, 120);
        dt = now_ms() - t0;
        if (rc == STK_TIMEOUT) {
            timeouts++;
            CHECK(b == NULL);
            break;
        }
        REQUIRE(rc == STK_OK);
        CHECK_EQ(b->index, (uint64_t)got);
        got++;
        ok &= batch_ok(b);
        for (size_t s = 0; s < b->size; s++)
            seen[b->indices[s]]++;
        stk_batch_release(b);
    }
    CHECK_EQ(timeouts, 1);
    CHECK(got <= 3);
    CHECK(dt >= 115 && dt < 2000);
    /* A zero timeout polls. */
    double t0 = now_ms();
    CHECK_EQ(stk_loader_next_timeout(l, &b, 0), STK_TIMEOUT);
    CHECK(now_ms() - t0 < 50);
    thaw_workers(nth);
    for (;;) {
        int rc = stk_loader_next_timeout(l, &b, 5000);
        if (rc == STK_END)
            break;
        REQUIRE(rc == STK_OK);
        CHECK_EQ(b->index, (uint64_t)got);
        got++;
        ok &= batch_ok(b);
        for (size_t s = 0; s < b->size; s++)
            seen[b->indices[s]]++;
        stk_batch_release(b);
    }
    CHECK(ok);
    CHECK_EQ(got, N / 4);
    int once = 1;
    for (int i = 0; i < N; i++)
        once &= seen[i] == 1;
    CHECK(once);
    stk_loader_close(l);
    sem_destroy(&g_thaw);
}

/* A FIFO named like an image is a bad sample, not a hang: opening it must
 * not block a worker forever (nobody will ever write to it). Run in a helper
 * thread; if the epoch has not ended after 2 s, the test opens the FIFO
 * itself so the worker goes on, and reports the hang. */
typedef struct drainer {
    stk_loader *l;
    int samples, errors;
    atomic_int done;
} drainer;

static void *drain_thread(void *p)
{
    drainer *d = p;
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(d->l, &b)) == STK_OK) {
        d->samples += (int)b->size;
        stk_batch_release(b);
    }
    d->errors = (int)stk_loader_error_count(d->l);
    atomic_store(&d->done, 1);
    return NULL;
}

static void test_fifo_sample_is_an_error(void)
{
    const char *fifo;
    fifo_tree(&fifo);
    stk_loader *l = open_fifo_tree();
    drainer d = {l, 0, 0, 0};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, drain_thread, &d) == 0);
    double t0 = now_ms();
    while (!atomic_load(&d.done) && now_ms() - t0 < 2000)
        usleep(5000);
    int finished = atomic_load(&d.done);
    int fd = -1;
    if (!finished) {
        fprintf(stderr, "    a worker blocked for 2 s in open() of a FIFO named like an image\n");
        fd = unblock_fifo();
    }
    pthread_join(th, NULL);
    CHECK(finished);
    /* Skipped and named, the other five delivered. */
    CHECK_EQ(d.samples, 5);
    CHECK_EQ(d.errors, 1);
    stk_sample_error e;
    if (stk_loader_error_get(l, 0, &e) == STK_OK)
        CHECK(!strcmp(e.path, fifo));
    /* The next epoch is being prefetched, FIFO included: keep a writer
     * (so open() does not block) until closed. */
    if (fd < 0)
        fd = unblock_fifo();
    stk_loader_close(l);
    close(fd);
}

typedef struct closer {
    stk_loader *l;
    atomic_int done;
} closer;

static void *close_thread(void *p)
{
    closer *c = p;
    stk_loader_close(c->l);
    atomic_store(&c->done, 1);
    return NULL;
}

/* Close while a worker is stuck in open() on a FIFO no one writes: close
 * should still be prompt ("closing is prompt and clean from any state").
 * If it is not, the test unblocks the worker itself so the suite goes on,
 * and reports the hang. */
static void test_close_with_worker_blocked_in_open(void)
{
    stk_loader *l = open_fifo_tree();
    usleep(50000); /* let a worker reach the FIFO */
    closer c = {l, 0};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, close_thread, &c) == 0);
    double t0 = now_ms();
    while (!atomic_load(&c.done) && now_ms() - t0 < 2000)
        usleep(5000);
    int prompt = atomic_load(&c.done);
    int fd = -1;
    if (!prompt) {
        fprintf(stderr, "    close hung for 2 s with a worker blocked in open() of a FIFO\n");
        fd = unblock_fifo();
    }
    pthread_join(th, NULL);
    if (fd >= 0)
        close(fd);
    CHECK(prompt);
}

/* ---- other threads ------------------------------------------------------------ */

/* Batches released by another thread while the consumer keeps asking for
 * more: the contract lets any thread release at any time. */
typedef struct queue {
    pthread_mutex_t m;
    pthread_cond_t cv;
    stk_batch *items[8];
    int head, tail;
    int closed;
    int bad;
} queue;

static void *releaser(void *p)
{
    queue *q = p;
    pthread_mutex_lock(&q->m);
    for (;;) {
        while (q->head == q->tail && !q->closed)
            pthread_cond_wait(&q->cv, &q->m);
        if (q->head == q->tail)
            break;
        stk_batch *b = q->items[q->head++ % 8];
        pthread_mutex_unlock(&q->m);
        if (!batch_ok(b))
            q->bad++;
        usleep(200);
        stk_batch_release(b);
        pthread_mutex_lock(&q->m);
    }
    pthread_mutex_unlock(&q->m);
    return NULL;
}

static void test_release_from_other_thread(void)
{
    stk_loader *l = open_records(3, 4, 5);
    queue q = {.m = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, releaser, &q) == 0);
    uint64_t samples = 0;
    int busy = 0;
    for (int e = 0; e < 2; e++) {
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            if (rc == STK_EBUSY) { /* the releaser is behind: legitimately */
                busy++;
                usleep(500);
                continue;
            }
            REQUIRE(rc == STK_OK);
            samples += b->size;
            pthread_mutex_lock(&q.m);
            q.items[q.tail++ % 8] = b;
            pthread_cond_signal(&q.cv);
            pthread_mutex_unlock(&q.m);
        }
    }
    pthread_mutex_lock(&q.m);
    q.closed = 1;
    pthread_cond_signal(&q.cv);
    pthread_mutex_unlock(&q.m);
    pthread_join(th, NULL);
    CHECK_EQ(q.bad, 0);
    CHECK_EQ(samples, 2 * N);
    stk_loader_close(l);
}

/* Compacting a delivered batch (a memmove of up to the whole batch when
 * samples failed) runs without the loader's lock, so another thread's release
 * (and the workers) are not held up by it. The hook runs inside that
 * compaction and waits for a release made on another thread. */
typedef struct publish_probe {
    stk_batch *held;
    sem_t go, done;
    int armed, released_in_time;
} publish_probe;

static void *probe_releaser(void *p)
{
    publish_probe *pp = p;
    while (sem_wait(&pp->go) != 0)
        ;
    stk_batch_release(pp->held);
    sem_post(&pp->done);
    return NULL;
}

static void probe_hook(void *p)
{
    publish_probe *pp = p;
    if (!pp->armed)
        return;
    pp->armed = 0;
    sem_post(&pp->go);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 3;
    int rc;
    while ((rc = sem_timedwait(&pp->done, &ts)) != 0 && errno == EINTR)
        ;
    pp->released_in_time = rc == 0;
}

static void test_publish_outside_lock(void)
{
    publish_probe pp = {0};
    REQUIRE(sem_init(&pp.go, 0, 0) == 0 && sem_init(&pp.done, 0, 0) == 0);
    stk__test_publish_hook(probe_hook, &pp);
    stk_loader *l = open_records(2, 2, 4);
    stk_batch *b0, *b1;
    REQUIRE(stk_loader_next(l, &b0) == STK_OK);
    pp.held = b0;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, probe_releaser, &pp) == 0);
    pp.armed = 1;
    REQUIRE(stk_loader_next(l, &b1) == STK_OK);
    CHECK(pp.released_in_time);
    pthread_join(th, NULL);
    CHECK(batch_ok(b1));
    CHECK_EQ(b1->index, 1);
    stk_batch_release(b1);
    stk_loader_close(l);
    stk__test_publish_hook(NULL, NULL);
    sem_destroy(&pp.go);
    sem_destroy(&pp.done);
}

static void *consume_and_close(void *p)
{
    stk_loader *l = p;
    stk_batch *b;
    for (int k = 0; k < 7; k++) {
        if (stk_loader_next(l, &b) != STK_OK)
            return (void *)1;
        stk_batch_release(b);
    }
    stk_loader_close(l);
    return NULL;
}

/* The consumer functions may move between threads (not concurrently). */
static void test_consumer_on_another_thread(void)
{
    stk_loader *l = open_records(2, 2, 3);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    stk_batch_release(b);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, consume_and_close, l) == 0);
    void *ret;
    pthread_join(th, &ret);
    CHECK(ret == NULL);
}

/* Many short lives with random early stops: no hang, no leak. */
static void test_open_close_churn(void)
{
    uint64_t x = 88172645463325252ULL;
    for (int rep = 0; rep < 40; rep++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned threads = 1 + (unsigned)(x % 8), depth = 1 + (unsigned)((x >> 8) % 4);
        size_t bs = 1 + (size_t)((x >> 16) % 20);
        int stop = (int)((x >> 24) % 12);
        stk_loader *l = open_records(threads, depth, bs);
        stk_batch *held = NULL;
        for (int k = 0; k < stop; k++) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                continue;
            if (rc == STK_EBUSY) {
                stk_batch_release(held);
                held = NULL;
                continue;
            }
            REQUIRE(rc == STK_OK);
            CHECK(batch_ok(b));
            if (k == 1 && !held)
                held = b;
            else
                stk_batch_release(b);
        }
        if ((x >> 40) & 1) {
            timed_close(l, "in churn");
            stk_batch_release(held);
        } else {
            stk_batch_release(held);
            timed_close(l, "in churn");
        }
    }
}

/* Use after close of a handle is impossible to test safely (the handle is
 * freed); a closed loader's batches are covered above. */

/* ThreadSanitizer starts a background thread of its own with the first
 * thread the program creates; start one before the harness counts threads so
 * the count at the end compares like with like. */
static void *noop_thread(void *p)
{
    return p;
}
static void warm_up_threads(void)
{
    pthread_t th;
    if (pthread_create(&th, NULL, noop_thread, NULL) == 0)
        pthread_join(th, NULL);
    usleep(20000);
}

int main(void)
{
    warm_up_threads();
    tu_begin("test_mt_lifecycle", 120);
    make_records();
    RUN(test_close_right_after_open);
    RUN(test_close_mid_epoch);
    RUN(test_close_while_holding);
    RUN(test_close_with_workers_waiting);
    RUN(test_ebusy_when_all_held);
    RUN(test_double_release_harmless);
    RUN(test_stale_release_is_misuse);
    RUN(test_concurrent_double_release);
    RUN(test_null_arguments);
    RUN(test_fork_child_misuse);
    RUN(test_next_timeout);
    RUN(test_fifo_sample_is_an_error);
    RUN(test_close_with_worker_blocked_in_open);
    RUN(test_release_from_other_thread);
    RUN(test_publish_outside_lock);
    RUN(test_consumer_on_another_thread);
    RUN(test_open_close_churn);
    return tu_end();
}
