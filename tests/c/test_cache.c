/*
 * test_cache.c -- the disk cache (src/cache/) on its own: which files it
 * touches, FIFOs and symlinks, a full disk, the commit's hand-over of its
 * lock against a concurrent evictor, fsync before the rename, forked
 * children, and keys that tell endpoints and object versions apart.
 * tests/c/test_remote.c runs the cache end to end under a loader.
 */
#include "testutil.h"

#include "../../src/cache/cache.h"
#include "../../src/io/file.h"
#include "../../src/io/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static const char *sub(const char *dir, const char *name)
{
    static char buf[4][2048];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/" STK__CACHE_SUBDIR "/%s", dir, name);
    return buf[k];
}

/* Downloads `size` bytes of `fill` into entry key and commits it; the pin is
 * returned (or -1 when begin refused, its code in *rc). */
static int put(stk__cache *c, const char *key, size_t size, int fill, int *rc)
{
    char err[512];
    int fd = -1;
    *rc = stk__cache_begin(c, key, size, NULL, NULL, &fd, err, sizeof err);
    if (*rc)
        return -1;
    uint8_t *b = malloc(size ? size : 1);
    memset(b, fill, size);
    REQUIRE(pwrite(fd, b, size, 0) == (ssize_t)size);
    free(b);
    *rc = stk__cache_commit(c, key, fd, err, sizeof err);
    return *rc ? -1 : fd;
}

static void key_of(const char *name, char *key, size_t n)
{
    char id[256];
    snprintf(id, sizeof id, "http://127.0.0.1:1/ds/%s", name);
    stk__cache_key(id, 1, NULL, key, n);
}

/* Issue 18: every non-dot file in cache_dir was taken for an entry; a
 * browser's .part was deleted at open and a .tex evicted. */
static void test_foreign_files_survive_open_and_eviction(void)
{
    const char *dir = tu_path("foreign");
    tu_mkdirs(dir);
    char p[4][2048];
    snprintf(p[0], sizeof p[0], "%s/x.tex", dir);
    snprintf(p[1], sizeof p[1], "%s/browser.part", dir);
    /* Even names of the cache's own shape are left alone outside its
     * subdirectory (an older layout's entries, or someone else's). */
    snprintf(p[2], sizeof p[2], "%s/0123456789abcdef-train.stk", dir);
    snprintf(p[3], sizeof p[3], "%s/0123456789abcdef-train.stk.part", dir);
    for (int k = 0; k < 4; k++)
        tu_write_file(p[k], "mine", 4);
    stk__cache *c;
    char err[512], key[192];
    REQUIRE(stk__cache_open(&c, dir, 3000, err, sizeof err) == STK_OK);
    CHECK(exists(sub(dir, "VERSION")));
    /* A user's file that found its way into the subdirectory. */
    tu_write_file(sub(dir, "notes.txt"), "mine", 4);
    /* Fill the cache twice over: eviction must find victims among its own
     * entries only. */
    for (int k = 0; k < 6; k++) {
        char name[32];
        int rc;
        snprintf(name, sizeof name, "s%d.stk", k);
        key_of(name, key, sizeof key);
        int fd = put(c, key, 1000, k, &rc);
        CHECK_EQ(rc, STK_OK);
        stk__cache_unpin(fd);
    }
    stk__cache_stats st;
    stk__cache_stats_get(c, &st);
    CHECK(st.evictions >= 3);
    stk__cache_close(c);
    /* Open again (stale .part removal runs). */
    REQUIRE(stk__cache_open(&c, dir, 3000, err, sizeof err) == STK_OK);
    stk__cache_close(c);
    for (int k = 0; k < 4; k++)
        CHECK(exists(p[k]));
    CHECK(exists(sub(dir, "notes.txt")));

    /* A stoker-cache directory someone else made (files, no marker) is
     * refused, not adopted. */
    const char *dir2 = tu_path("foreign2");
    char theirs[2048];
    snprintf(theirs, sizeof theirs, "%s/" STK__CACHE_SUBDIR, dir2);
    tu_mkdirs(theirs);
    tu_write_file(sub(dir2, "0123456789abcdef-a.part"), "x", 1);
    CHECK_EQ(stk__cache_open(&c, dir2, 3000, err, sizeof err), STK_EIO);
    CHECK(strstr(err, "not a stoker cache") != NULL);
    CHECK(exists(sub(dir2, "0123456789abcdef-a.part")));
}

/* Issue 18: a FIFO named *.part hung the open (with the node-wide lock
 * held); a FIFO or symlink where an entry should be must not be followed. */
static void test_fifo_and_symlink_entries_are_skipped(void)
{
    const char *dir = tu_path("fifo");
    stk__cache *c;
    char err[512], key[192], key2[192];
    REQUIRE(stk__cache_open(&c, dir, 1 << 20, err, sizeof err) == STK_OK);
    stk__cache_close(c);
    key_of("f.stk", key, sizeof key);
    key_of("g.stk", key2, sizeof key2);
    char part[256], ent[256];
    snprintf(part, sizeof part, "%s.part", key);
    snprintf(ent, sizeof ent, "%s", key2);
    REQUIRE(mkfifo(sub(dir, part), 0644) == 0);
    REQUIRE(mkfifo(sub(dir, ent), 0644) == 0);
    /* A symlink named like an entry, pointing at a user's file. */
    const char *target = tu_path("precious");
    tu_write_file(target, "keep", 4);
    char key3[192];
    key_of("h.stk", key3, sizeof key3);
    REQUIRE(symlink(target, sub(dir, key3)) == 0);
    time_t t0 = time(NULL);
    REQUIRE(stk__cache_open(&c, dir, 1 << 20, err, sizeof err) == STK_OK);
    int fd = -1;
    CHECK_EQ(stk__cache_pin(c, key2, &fd), STK_ENOENT);
    CHECK_EQ(stk__cache_pin(c, key3, &fd), STK_ENOENT);
    /* begin on the FIFO .part's key: not a live download, not a hang. */
    int rc = stk__cache_begin(c, key, 10, NULL, NULL, &fd, err, sizeof err);
    CHECK(rc == STK_EBUSY || rc == STK_OK);
    if (rc == STK_OK)
        stk__cache_abort(c, key, fd, false);
    /* Eviction with a limit that needs every byte: the symlink's target
     * survives. */
    stk__cache_close(c);
    REQUIRE(stk__cache_open(&c, dir, 100, err, sizeof err) == STK_OK);
    char k4[192];
    key_of("big.stk", k4, sizeof k4);
    fd = put(c, k4, 100, 1, &rc);
    CHECK_EQ(rc, STK_OK);
    stk__cache_unpin(fd);
    stk__cache_close(c);
    CHECK(time(NULL) - t0 < 5);
    size_t n = 0;
    char *keep = tu_read_file(target, &n);
    CHECK(keep && n == 4);
    free(keep);
}

/* Issue 18: the reservation was a sparse ftruncate, so a full disk only
 * showed up halfway through the download. A disk that refuses the space is
 * "not admitted" (STK_ETOOBIG: the caller reads by ranges), counted, and
 * leaves nothing behind. */
static void test_full_disk_is_refused_at_reservation(void)
{
    const char *dir = tu_path("enospc");
    stk__cache *c;
    char err[512], key[192];
    REQUIRE(stk__cache_open(&c, dir, 1 << 20, err, sizeof err) == STK_OK);
    key_of("full.stk", key, sizeof key);
    int fd = -1;
    stk__iofault_arm(STK__IOF_ENOSPC, 0, 1);
    int rc = stk__cache_begin(c, key, 4096, NULL, NULL, &fd, err, sizeof err);
    stk__iofault_arm(0, -1, 0);
    CHECK_EQ(rc, STK_ETOOBIG);
    CHECK(strstr(err, "refused") != NULL);
    stk__cache_stats st;
    stk__cache_stats_get(c, &st);
    CHECK_EQ(st.write_errors, 1);
    char part[256];
    snprintf(part, sizeof part, "%s.part", key);
    CHECK(!exists(sub(dir, part)));
    /* A write error during the download, reported by the caller. */
    REQUIRE(stk__cache_begin(c, key, 4096, NULL, NULL, &fd, err, sizeof err) == STK_OK);
    stk__cache_abort(c, key, fd, true);
    stk__cache_stats_get(c, &st);
    CHECK_EQ(st.write_errors, 2);
    CHECK(!exists(sub(dir, part)));
    stk__cache_close(c);

    /* The same on a real full disk: a 1 MiB tmpfs with a 4 MiB limit. */
    const char *mnt = tu_path("tmpfs");
    tu_mkdirs(mnt);
    if (mount("stoker-test", mnt, "tmpfs", 0, "size=1m") != 0) {
        fprintf(stderr, "    (skipped the tmpfs part: mount: %s)\n", strerror(errno));
        return;
    }
    REQUIRE(stk__cache_open(&c, mnt, 4u << 20, err, sizeof err) == STK_OK);
    rc = stk__cache_begin(c, key, 2u << 20, NULL, NULL, &fd, err, sizeof err);
    CHECK_EQ(rc, STK_ETOOBIG);
    if (rc == STK_OK)
        stk__cache_abort(c, key, fd, false);
    /* What fits still goes in. */
    char k2[192];
    key_of("small.stk", k2, sizeof k2);
    fd = put(c, k2, 64 << 10, 3, &rc);
    CHECK_EQ(rc, STK_OK);
    stk__cache_unpin(fd);
    stk__cache_close(c);
    CHECK(umount(mnt) == 0);
}

/* Issue 18: no fsync before the rename, so power loss could leave a
 * complete-looking entry with a zero-filled tail. A failed fsync must fail
 * the commit (and so proves the commit calls it). */
static void test_commit_fsyncs_before_rename(void)
{
    const char *dir = tu_path("fsync");
    stk__cache *c;
    char err[512], key[192];
    REQUIRE(stk__cache_open(&c, dir, 1 << 20, err, sizeof err) == STK_OK);
    key_of("sync.stk", key, sizeof key);
    int fd = -1;
    REQUIRE(stk__cache_begin(c, key, 100, NULL, NULL, &fd, err, sizeof err) == STK_OK);
    uint8_t b[100] = {0};
    REQUIRE(pwrite(fd, b, sizeof b, 0) == 100);
    stk__iofault_arm(STK__IOF_EIO, 0, 0); /* the next applicable call: the fsync */
    int rc = stk__cache_commit(c, key, fd, err, sizeof err);
    long fired = stk__iofault_fired();
    stk__iofault_arm(0, -1, 0);
    CHECK_EQ(fired, 1);
    CHECK_EQ(rc, STK_EIO);
    CHECK(!exists(sub(dir, key)));
    stk__cache_stats st;
    stk__cache_stats_get(c, &st);
    CHECK_EQ(st.write_errors, 1);
    stk__cache_close(c);
}

/* ---- the commit's hand-over ------------------------------------------------ */

typedef struct commit_arg {
    stk__cache *c;
    const char *key;
    int fd, rc;
    atomic_int done;
} commit_arg;

static void *commit_main(void *p)
{
    commit_arg *a = p;
    char err[512];
    a->rc = stk__cache_commit(a->c, a->key, a->fd, err, sizeof err);
    atomic_store(&a->done, 1);
    return NULL;
}

typedef struct evict_arg {
    stk__cache *c;
    atomic_int stop;
    int rounds;
} evict_arg;

/* Asks for the whole cache again and again: every unpinned entry is
 * evicted each time. */
static void *evict_main(void *p)
{
    evict_arg *a = p;
    char err[512], key[192];
    key_of("evictor.stk", key, sizeof key);
    while (!atomic_load(&a->stop)) {
        int fd;
        if (stk__cache_begin(a->c, key, 2000, NULL, NULL, &fd, err, sizeof err) == STK_OK)
            stk__cache_abort(a->c, key, fd, false);
        a->rounds++;
    }
    return NULL;
}

/* Issue 18: flock's EX -> SH conversion at commit drops the lock for a
 * moment, in which an evictor could unlink the entry just committed (and a
 * begin take the download for stale). The hand-over runs under the
 * directory lock: a commit waits for a holder of that lock, and under a
 * concurrent evictor every committed entry is still in place, pinned. */
static void test_commit_hands_over_under_the_directory_lock(void)
{
    const char *dir = tu_path("race");
    stk__cache *c, *c2;
    char err[512], key[192];
    REQUIRE(stk__cache_open(&c, dir, 2000, err, sizeof err) == STK_OK);
    REQUIRE(stk__cache_open(&c2, dir, 2000, err, sizeof err) == STK_OK);
    key_of("held.stk", key, sizeof key);
    commit_arg a = {.c = c, .key = key};
    REQUIRE(stk__cache_begin(c, key, 1000, NULL, NULL, &a.fd, err, sizeof err) == STK_OK);
    /* Another process holds the directory lock. */
    int lk = open(sub(dir, ".lock"), O_RDWR | O_CLOEXEC);
    REQUIRE(lk >= 0);
    REQUIRE(flock(lk, LOCK_EX) == 0);
    pthread_t t;
    pthread_create(&t, NULL, commit_main, &a);
    usleep(200000);
    CHECK_EQ(atomic_load(&a.done), 0); /* waits for the lock */
    flock(lk, LOCK_UN);
    close(lk);
    pthread_join(t, NULL);
    CHECK_EQ(a.rc, STK_OK);
    CHECK(exists(sub(dir, key)));
    stk__cache_unpin(a.fd);

    /* Commits against an evictor (its own descriptors: as another process). */
    evict_arg ev = {.c = c2};
    pthread_t te;
    pthread_create(&te, NULL, evict_main, &ev);
    int lost = 0;
    for (int k = 0; k < 300; k++) {
        char name[32], k2[192];
        int rc;
        snprintf(name, sizeof name, "r%d.stk", k);
        key_of(name, k2, sizeof k2);
        int fd = put(c, k2, 1000, k, &rc);
        if (rc)
            continue; /* the evictor's reservation filled the cache */
        struct stat x, y;
        if (fstat(fd, &x) != 0 || lstat(sub(dir, k2), &y) != 0 || x.st_ino != y.st_ino)
            lost++;
        stk__cache_unpin(fd);
    }
    atomic_store(&ev.stop, 1);
    pthread_join(te, NULL);
    CHECK_EQ(lost, 0);
    CHECK(ev.rounds > 0);
    stk__cache_close(c2);
    stk__cache_close(c);
}

typedef struct begin_arg {
    stk__cache *c;
    const char *key;
    int fd, rc;
    atomic_int done;
} begin_arg;

static void *begin_main(void *p)
{
    begin_arg *a = p;
    char err[512];
    a->rc = stk__cache_begin(a->c, a->key, 1000, NULL, NULL, &a->fd, err, sizeof err);
    atomic_store(&a->done, 1);
    return NULL;
}

/* A reservation waits for another process's directory lock in slices that
 * re-check stk__cache_cancel (a loader closing or seeking must not wait for
 * another process's scan), and the counters (pins, stats) never wait for a
 * reservation in progress. */
static void test_reservation_wait_is_cancellable(void)
{
    const char *dir = tu_path("cancel");
    stk__cache *c;
    char err[512], key[192], k2[192];
    REQUIRE(stk__cache_open(&c, dir, 4000, err, sizeof err) == STK_OK);
    key_of("slow.stk", key, sizeof key);
    key_of("pinned.stk", k2, sizeof k2);
    int rc, pin = put(c, k2, 1000, 7, &rc);
    REQUIRE(rc == STK_OK);
    stk__cache_unpin(pin);
    int lk = open(sub(dir, ".lock"), O_RDWR | O_CLOEXEC);
    REQUIRE(lk >= 0);
    REQUIRE(flock(lk, LOCK_EX) == 0);
    begin_arg a = {.c = c, .key = key, .fd = -1};
    pthread_t t;
    pthread_create(&t, NULL, begin_main, &a);
    usleep(200000);
    CHECK_EQ(atomic_load(&a.done), 0); /* waits for the lock */
    /* Meanwhile a pin and the stats do not wait. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk__cache_pin(c, k2, &pin), STK_OK);
    stk__cache_stats st;
    stk__cache_stats_get(c, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(t1.tv_sec - t0.tv_sec < 1);
    CHECK(st.hits >= 1);
    stk__cache_unpin(pin);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stk__cache_cancel(c, true);
    pthread_join(t, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(secs < 0.5);
    CHECK_EQ(a.rc, STK_ECANCELED);
    CHECK(!exists(sub(dir, key)));
    /* Off again: the reservation waits for the lock, and then succeeds. */
    stk__cache_cancel(c, false);
    a.done = 0;
    pthread_create(&t, NULL, begin_main, &a);
    usleep(100000);
    CHECK_EQ(atomic_load(&a.done), 0);
    flock(lk, LOCK_UN);
    close(lk);
    pthread_join(t, NULL);
    CHECK_EQ(a.rc, STK_OK);
    stk__cache_abort(c, key, a.fd, false);
    stk__cache_close(c);
}

/* Issue 18: a forked child (a DataLoader worker) shared the parent's pins
 * and .part locks: the parent's unpin did not free the entry, and a dead
 * parent's download stayed locked while the child lived. */
static void test_forked_child_lets_go_of_pins_and_downloads(void)
{
    const char *dir = tu_path("fork");
    stk__cache *c;
    char err[512], k1[192], k2[192];
    REQUIRE(stk__cache_open(&c, dir, 1 << 20, err, sizeof err) == STK_OK);
    key_of("pinned.stk", k1, sizeof k1);
    key_of("loading.stk", k2, sizeof k2);
    int rc;
    int pin = put(c, k1, 100, 1, &rc);
    REQUIRE(rc == STK_OK);
    int dl = -1;
    REQUIRE(stk__cache_begin(c, k2, 100, NULL, NULL, &dl, err, sizeof err) == STK_OK);
    int go[2], ready[2];
    REQUIRE(pipe(go) == 0 && pipe(ready) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        /* The fork handlers have run by the time fork returns here. */
        char ch = 'r';
        close(go[1]);
        close(ready[0]);
        if (write(ready[1], &ch, 1) != 1)
            _exit(2);
        while (read(go[0], &ch, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    close(go[0]);
    close(ready[1]);
    char ch;
    REQUIRE(read(ready[0], &ch, 1) == 1);
    close(ready[0]);
    /* The parent lets go of both (as a parent that died would). */
    stk__cache_unpin(pin);
    stk__cache_unpin(dl);
    char part[256];
    snprintf(part, sizeof part, "%s.part", k2);
    int a = open(sub(dir, k1), O_RDONLY | O_CLOEXEC);
    int b = open(sub(dir, part), O_RDONLY | O_CLOEXEC);
    REQUIRE(a >= 0 && b >= 0);
    CHECK_EQ(flock(a, LOCK_EX | LOCK_NB), 0); /* the entry is evictable */
    CHECK_EQ(flock(b, LOCK_EX | LOCK_NB), 0); /* the download is stale */
    close(a);
    close(b);
    close(go[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    stk__cache_close(c);
    REQUIRE(stk__cache_open(&c, dir, 1 << 20, err, sizeof err) == STK_OK);
    CHECK(!exists(sub(dir, part))); /* removed as stale */
    stk__cache_close(c);
}

/* Issue 18: an s3:// entry was keyed without its endpoint, and any entry by
 * URL and size only, so the same bucket on another endpoint, or an object
 * republished with the same size, hit the old entry. */
static void test_keys_tell_endpoints_and_versions_apart(void)
{
    stk__remote *r1, *r2;
    stk__remote_cfg c1 = {.endpoint = "http://127.0.0.1:9001"};
    stk__remote_cfg c2 = {.endpoint = "http://127.0.0.1:9002"};
    char err[512], id1[1024], id2[1024], k1[192], k2[192];
    setenv("AWS_ACCESS_KEY_ID", "k", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "s", 1);
    REQUIRE(stk__remote_open(&r1, "s3://bucket/train", &c1, err, sizeof err) == STK_OK);
    REQUIRE(stk__remote_open(&r2, "s3://bucket/train", &c2, err, sizeof err) == STK_OK);
    stk__remote_object_id(r1, "part-000000.stk", id1, sizeof id1);
    stk__remote_object_id(r2, "part-000000.stk", id2, sizeof id2);
    CHECK(strstr(id1, "9001") != NULL);
    stk__cache_key(id1, 100, NULL, k1, sizeof k1);
    stk__cache_key(id2, 100, NULL, k2, sizeof k2);
    CHECK(strcmp(k1, k2) != 0);
    CHECK(strstr(k1, "part-000000.stk") != NULL);
    stk__remote_close(r1);
    stk__remote_close(r2);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    stk__cache_key(id1, 100, "\"etag-1\"", k1, sizeof k1);
    stk__cache_key(id1, 100, "\"etag-2\"", k2, sizeof k2);
    CHECK(strcmp(k1, k2) != 0);
    /* No credentials or query in a key's readable tail. */
    stk__cache_key("http://h/ds/a.stk?X-Amz-Signature=secret", 1, NULL, k1, sizeof k1);
    CHECK(strstr(k1, "secret") == NULL);
}

int main(void)
{
    tu_begin("test_cache", 120);
    RUN(test_foreign_files_survive_open_and_eviction);
    RUN(test_fifo_and_symlink_entries_are_skipped);
    RUN(test_full_disk_is_refused_at_reservation);
    RUN(test_commit_fsyncs_before_rename);
    RUN(test_commit_hands_over_under_the_directory_lock);
    RUN(test_reservation_wait_is_cancellable);
    RUN(test_forked_child_lets_go_of_pins_and_downloads);
    RUN(test_keys_tell_endpoints_and_versions_apart);
    return tu_end();
}
