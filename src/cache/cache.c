/* cache.c -- the local disk cache of whole remote shards (see cache.h). */
#include "cache/cache.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define LOCK_NAME   ".lock"
#define MARKER_NAME "VERSION"
#define MARKER_TEXT "stoker-cache 2\n"
#define PART_SUFFIX ".part"
#define HASH_DIGITS 16

/* Every descriptor the cache hands out (pins and downloads) holds a flock
 * that a forked child would share; they are listed here so the child can
 * let go of them (see cache.h). */
static pthread_mutex_t g_fds_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_fds_once = PTHREAD_ONCE_INIT;
static int *g_fds;
static size_t g_nfds, g_capfds;

struct stk__cache {
    char *dir; /* DIR/stoker-cache */
    uint64_t limit;
    int lockfd;
    pthread_mutex_t mu; /* serialises this process's use of the directory lock */
    /* Atomics: read by stats and bumped by pins without mu, which a slow
     * reservation holds (a pin runs under the fetch stage's lock). */
    _Atomic uint64_t hits, misses, evictions, bytes, write_errors, dropped;
    atomic_bool cancel; /* stk__cache_cancel: reservations stop waiting */
};

#ifdef STK_TEST
_Atomic unsigned stk__cache_test_begin_wait_ms;
#endif

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static bool tail_char(char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_';
}

/* Is name one the cache could have made? *part: it is a download. */
static bool own_name(const char *name, bool *part)
{
    size_t n = strlen(name);
    *part = false;
    if (n < HASH_DIGITS + 1 || n > 200 || name[HASH_DIGITS] != '-')
        return false;
    for (size_t k = 0; k < HASH_DIGITS; k++)
        if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'f')))
            return false;
    for (size_t k = HASH_DIGITS + 1; k < n; k++)
        if (!tail_char(name[k]))
            return false;
    *part = ends_with(name, PART_SUFFIX);
    return true;
}

/* ---- fork -------------------------------------------------------------------- */

static void fds_prepare(void)
{
    pthread_mutex_lock(&g_fds_mu);
}

static void fds_parent(void)
{
    pthread_mutex_unlock(&g_fds_mu);
}

/* In the child: each listed descriptor is pointed at /dev/null (dup2 drops
 * the child's reference to the locked file and keeps the number taken, so a
 * later unpin in the child closes a harmless descriptor rather than one
 * that was reused). Only async-signal-safe calls. */
static void fds_child(void)
{
    int null = g_nfds ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
    for (size_t k = 0; k < g_nfds; k++) {
        if (null >= 0)
            dup2(null, g_fds[k]);
        else
            close(g_fds[k]);
    }
    if (null >= 0)
        close(null);
    g_nfds = 0;
    pthread_mutex_unlock(&g_fds_mu);
}

static void fds_init(void)
{
    pthread_atfork(fds_prepare, fds_parent, fds_child);
}

static int fd_register(int fd)
{
    int rc = STK_OK;
    pthread_once(&g_fds_once, fds_init);
    pthread_mutex_lock(&g_fds_mu);
    if ((rc = stk__grow((void **)&g_fds, &g_capfds, g_nfds + 1, sizeof *g_fds)))
        goto out;
    g_fds[g_nfds++] = fd;
out:
    pthread_mutex_unlock(&g_fds_mu);
    return rc;
}

/* Forgets fd and closes it (under the list's lock, so a fork never sees a
 * listed number that was already closed and perhaps reused). */
static void fd_close(int fd)
{
    pthread_mutex_lock(&g_fds_mu);
    for (size_t k = 0; k < g_nfds; k++) {
        if (g_fds[k] == fd) {
            g_fds[k] = g_fds[--g_nfds];
            break;
        }
    }
    if (!g_nfds) {
        /* The last one: give the list back, so a test's allocation count
         * ends where it began. */
        stk__free(g_fds);
        g_fds = NULL;
        g_capfds = 0;
    }
    stk__close(fd);
    pthread_mutex_unlock(&g_fds_mu);
}

/* ---- names ------------------------------------------------------------------- */

void stk__cache_key(const char *id, uint64_t size, const char *validator, char *out, size_t n)
{
    XXH64_hash_t h = XXH3_64bits_withSeed(id, strlen(id), size);
    if (validator && *validator)
        h = XXH3_64bits_withSeed(validator, strlen(validator), h);
    const char *q = strchr(id, '?');
    size_t idlen = q ? (size_t)(q - id) : strlen(id);
    const char *base = id + idlen;
    while (base > id && base[-1] != '/')
        base--;
    char tail[96];
    size_t k = 0;
    for (const char *p = base; p < id + idlen && k < sizeof tail - 1; p++)
        tail[k++] = tail_char(*p) ? *p : '_';
    tail[k] = '\0';
    stk__fmt(out, n, "%016llx-%s", (unsigned long long)h, tail);
}

void stk__cache_path(const stk__cache *c, const char *key, char *buf, size_t n)
{
    stk__fmt(buf, n, "%s/%s", c->dir, key);
}

/* Opens one of the cache's files for locking or reading: never follows a
 * symlink, never blocks (a FIFO), and only a regular file is accepted.
 * -1 otherwise. */
static int open_entry(const char *path, int flags)
{
    int fd = stk__open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    struct stat st;
    if (fd >= 0 && (stk__fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        stk__close(fd);
        fd = -1;
    }
    return fd;
}

void stk__cache_cancel(stk__cache *c, bool on)
{
    if (c)
        atomic_store(&c->cancel, on);
}

/* Sleeps 10 ms unless cancelled: false when cancelled. */
static bool wait_slice(stk__cache *c)
{
    if (atomic_load(&c->cancel))
        return false;
    struct timespec ts = {0, 10000000L};
    nanosleep(&ts, NULL);
    return true;
}

/* The directory lock. cancellable (a reservation): another process holding
 * it is waited for in slices that re-check stk__cache_cancel (STK_ECANCELED
 * then); the other users hold it briefly and wait as long as it takes. */
static int lock_dir_ex(stk__cache *c, bool cancellable)
{
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (flock(c->lockfd, cancellable ? LOCK_EX | LOCK_NB : LOCK_EX) == 0)
            return STK_OK;
        if (errno == EINTR)
            continue;
        if (cancellable && errno == EWOULDBLOCK && wait_slice(c))
            continue;
        bool cancelled = cancellable && errno == EWOULDBLOCK;
        pthread_mutex_unlock(&c->mu);
        return cancelled ? STK_ECANCELED : STK_EIO;
    }
}

static int lock_dir(stk__cache *c)
{
    return lock_dir_ex(c, false);
}

static void unlock_dir(stk__cache *c)
{
    flock(c->lockfd, LOCK_UN);
    pthread_mutex_unlock(&c->mu);
}

/* Removes KEY.part files whose writer is gone (their flock is free). The
 * directory lock is held. */
static void remove_stale_parts(stk__cache *c)
{
    DIR *d = stk__opendir(c->dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    bool part;
    while ((e = stk__readdir(d))) {
        if (!own_name(e->d_name, &part) || !part)
            continue;
        stk__fmt(path, sizeof path, "%s/%s", c->dir, e->d_name);
        int fd = open_entry(path, O_RDONLY);
        if (fd < 0)
            continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            unlink(path);
        stk__close(fd);
    }
    stk__closedir(d);
}

/* Makes dir (mkdir -p). */
static int make_dirs(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    stk__fmt(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        stk__fmt(err, errlen, "cache directory %s: %s", dir, strerror(errno));
        return STK_EIO;
    }
    return STK_OK;
}

/* Checks (or, in an empty subdirectory, writes) the version marker. The
 * directory lock is held. */
static int check_marker(stk__cache *c, char *err, size_t errlen)
{
    char path[4096], buf[64];
    stk__fmt(path, sizeof path, "%s/%s", c->dir, MARKER_NAME);
    int fd = open_entry(path, O_RDONLY);
    if (fd >= 0) {
        ssize_t n = stk__pread_upto(fd, buf, sizeof buf - 1, 0);
        stk__close(fd);
        buf[n > 0 ? n : 0] = '\0';
        if (strcmp(buf, MARKER_TEXT)) {
            stk__fmt(err, errlen,
                     "cache directory %s: its %s says \"%.*s\", not this version's \"%.*s\" "
                     "(remove the directory, or give another cache_dir)",
                     c->dir, MARKER_NAME, (int)strcspn(buf, "\n"), buf,
                     (int)strcspn(MARKER_TEXT, "\n"), MARKER_TEXT);
            return STK_EIO;
        }
        return STK_OK;
    }
    /* No marker: adopt the subdirectory only when it holds nothing but our
     * lock file, so a directory someone else made is never emptied. */
    DIR *d = stk__opendir(c->dir);
    if (!d) {
        stk__fmt(err, errlen, "cache directory %s: %s", c->dir, strerror(errno));
        return STK_EIO;
    }
    struct dirent *e;
    bool empty = true;
    while ((e = stk__readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, LOCK_NAME))
            empty = false;
    stk__closedir(d);
    if (!empty) {
        stk__fmt(err, errlen,
                 "cache directory %s holds files but no %s marker: it is not a stoker cache "
                 "(stoker will not use or delete them; give another cache_dir)",
                 c->dir, MARKER_NAME);
        return STK_EIO;
    }
    fd = stk__open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    size_t len = strlen(MARKER_TEXT);
    bool ok = fd >= 0 && stk__write_fd(fd, MARKER_TEXT, len) == (ssize_t)len;
    if (fd >= 0)
        stk__close(fd);
    if (!ok) {
        stk__fmt(err, errlen, "cache directory %s: cannot write its %s marker: %s", c->dir,
                 MARKER_NAME, strerror(errno));
        unlink(path);
        return STK_EIO;
    }
    return STK_OK;
}

/* The sizes of the cache's own regular files. */
static uint64_t held_bytes(const char *dir)
{
    uint64_t held = 0;
    DIR *d = stk__opendir(dir);
    struct dirent *e;
    char path[4096];
    bool part;
    while (d && (e = stk__readdir(d))) {
        struct stat st;
        if (!own_name(e->d_name, &part))
            continue;
        stk__fmt(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stk__lstat(path, &st) == 0 && S_ISREG(st.st_mode))
            held += (uint64_t)st.st_size;
    }
    if (d)
        stk__closedir(d);
    return held;
}

int stk__cache_open(stk__cache **out, const char *dir, uint64_t limit, char *err, size_t errlen)
{
    int rc = STK_OK;
    char path[4096];
    stk__cache *c = NULL;
    *out = NULL;
    if ((rc = make_dirs(dir, err, errlen)))
        return rc;
    if (!(c = stk__calloc(1, sizeof *c)))
        return STK_ENOMEM;
    c->lockfd = -1;
    stk__fmt(path, sizeof path, "%s/%s", dir, STK__CACHE_SUBDIR);
    if (!(c->dir = stk__strdup(path))) {
        stk__free(c);
        return STK_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    if (mkdir(c->dir, 0755) != 0 && errno != EEXIST) {
        stk__fmt(err, errlen, "cache directory %s: %s", c->dir, strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    stk__fmt(path, sizeof path, "%s/%s", c->dir, LOCK_NAME);
    c->lockfd = stk__open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    struct stat st;
    if (c->lockfd < 0 || stk__fstat(c->lockfd, &st) != 0 || !S_ISREG(st.st_mode)) {
        stk__fmt(err, errlen, "cache directory %s: cannot open its lock file: %s", c->dir,
                 c->lockfd < 0 ? strerror(errno) : "not a regular file");
        rc = STK_EIO;
        goto out;
    }
    if ((rc = lock_dir(c))) {
        stk__fmt(err, errlen, "cannot lock the cache directory %s", c->dir);
        goto out;
    }
    rc = check_marker(c, err, errlen);
    if (rc == STK_OK)
        remove_stale_parts(c);
    unlock_dir(c);
    if (rc)
        goto out;
    if (!limit) {
        struct statvfs v;
        limit = held_bytes(c->dir);
        if (statvfs(c->dir, &v) == 0)
            limit += (uint64_t)v.f_bavail * v.f_frsize / 10 * 9;
    }
    c->limit = limit;
    *out = c;
    c = NULL;
out:
    stk__cache_close(c);
    return rc;
}

void stk__cache_close(stk__cache *c)
{
    if (!c)
        return;
    if (c->lockfd >= 0)
        stk__close(c->lockfd);
    pthread_mutex_destroy(&c->mu);
    stk__free(c->dir);
    stk__free(c);
}

int stk__cache_pin(stk__cache *c, const char *key, int *fd)
{
    char path[4096];
    stk__cache_path(c, key, path, sizeof path);
    int f = open_entry(path, O_RDONLY);
    if (f < 0)
        return STK_ENOENT;
    while (flock(f, LOCK_SH) != 0 && errno == EINTR) {
    }
    /* Evicted between open and lock? Then the name no longer points here. */
    struct stat a, b;
    if (stk__fstat(f, &a) != 0 || stk__lstat(path, &b) != 0 || a.st_ino != b.st_ino ||
        a.st_dev != b.st_dev) {
        stk__close(f);
        return STK_ENOENT;
    }
    if (fd_register(f) != STK_OK) {
        stk__close(f);
        return STK_ENOMEM;
    }
    futimens(f, NULL); /* recency for LRU; best effort */
    c->hits++;
    *fd = f;
    return STK_OK;
}

void stk__cache_unpin(int fd)
{
    if (fd >= 0)
        fd_close(fd); /* releases the shared lock */
}

typedef struct victim {
    char name[256];
    uint64_t size, next;
    int64_t mtime;
} victim;

static int cmp_victim(const void *a, const void *b)
{
    const victim *x = a, *y = b;
    if (x->next != y->next)
        return x->next > y->next ? -1 : 1; /* furthest next use first */
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

int stk__cache_begin(stk__cache *c, const char *key, uint64_t size, stk__cache_next_use next_use,
                     void *ctx, int *fd_out, char *err, size_t errlen)
{
    int rc = STK_OK, fd = -1;
    victim *v = NULL;
    size_t nv = 0, cap = 0;
    char path[4096], part[4096];
    if (size > c->limit) {
        stk__fmt(err, errlen, "%llu bytes do not fit the cache's limit of %llu bytes",
                 (unsigned long long)size, (unsigned long long)c->limit);
        return STK_ETOOBIG;
    }
    if ((rc = lock_dir_ex(c, true))) {
        if (rc == STK_ECANCELED)
            stk__fmt(err, errlen, "cancelled while waiting for the cache directory's lock");
        else
            stk__fmt(err, errlen, "cannot lock the cache directory %s", c->dir);
        return rc;
    }
#ifdef STK_TEST
    /* Tests: a slow reservation (a long scan, a slow disk), cancellable. */
    for (unsigned ms = atomic_load(&stk__cache_test_begin_wait_ms); ms >= 10; ms -= 10)
        if (!wait_slice(c)) {
            unlock_dir(c);
            stk__fmt(err, errlen, "cancelled while reserving space in the cache");
            return STK_ECANCELED;
        }
#endif
    stk__cache_path(c, key, path, sizeof path);
    stk__fmt(part, sizeof part, "%s%s", path, PART_SUFFIX);
    struct stat pst;
    if (stk__lstat(path, &pst) == 0 && S_ISREG(pst.st_mode)) {
        rc = STK_EBUSY; /* complete already: the caller pins it */
        goto out;
    }
    /* Someone downloading it? (Its writer holds the exclusive lock until the
     * commit, which hands it over to a pin under the directory lock we hold
     * now: a live download never looks stale here.) */
    if (stk__lstat(part, &pst) == 0) {
        int pf = open_entry(part, O_RDONLY);
        bool live = pf < 0 || flock(pf, LOCK_EX | LOCK_NB) != 0;
        if (!live)
            unlink(part);
        if (pf >= 0)
            stk__close(pf);
        if (live) {
            rc = STK_EBUSY;
            goto out;
        }
    }
    /* Usage now, and the candidates. */
    uint64_t used = 0;
    DIR *d = stk__opendir(c->dir);
    if (!d) {
        stk__fmt(err, errlen, "cannot list the cache directory %s: %s", c->dir, strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    struct dirent *e;
    bool ispart;
    while ((e = stk__readdir(d))) {
        if (!own_name(e->d_name, &ispart))
            continue;
        char p[4096];
        struct stat st;
        stk__fmt(p, sizeof p, "%s/%s", c->dir, e->d_name);
        if (stk__lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        used += (uint64_t)st.st_size;
        if (ispart || strlen(e->d_name) >= sizeof v->name)
            continue;
        if ((rc = stk__grow((void **)&v, &cap, nv + 1, sizeof *v))) {
            stk__closedir(d);
            goto out;
        }
        stk__fmt(v[nv].name, sizeof v[nv].name, "%s", e->d_name);
        v[nv].size = (uint64_t)st.st_size;
        v[nv].mtime = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        v[nv].next = next_use ? next_use(ctx, e->d_name) : UINT64_MAX;
        nv++;
    }
    stk__closedir(d);
    if (used + size > c->limit) {
        if (nv)
            qsort(v, nv, sizeof *v, cmp_victim);
        for (size_t k = 0; k < nv && used + size > c->limit; k++) {
            char p[4096];
            stk__fmt(p, sizeof p, "%s/%s", c->dir, v[k].name);
            int vf = open_entry(p, O_RDONLY);
            if (vf < 0)
                continue;
            if (flock(vf, LOCK_EX | LOCK_NB) == 0 && unlink(p) == 0) {
                used -= v[k].size;
                c->evictions++;
            }
            stk__close(vf);
        }
    }
    if (used + size > c->limit) {
        stk__fmt(err, errlen,
                 "the cache (%s, limit %llu bytes) is full of entries in use; %llu more bytes do "
                 "not fit",
                 c->dir, (unsigned long long)c->limit, (unsigned long long)size);
        rc = STK_ETOOBIG;
        goto out;
    }
    fd = stk__open(part, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) {
        stk__fmt(err, errlen, "cannot create %s: %s", part, strerror(errno));
        rc = STK_EIO;
        goto fail;
    }
    /* Reserve the blocks, not just the size: a sparse file would let the
     * download run into a full disk halfway. */
    if (size && stk__fallocate(fd, 0, (off_t)size) != 0) {
        int e0 = errno;
        if (e0 == EOPNOTSUPP || e0 == ENOSYS || e0 == EINVAL) {
            if (ftruncate(fd, (off_t)size) == 0)
                goto reserved;
            e0 = errno;
        }
        stk__fmt(err, errlen, "the cache's disk (%s) refused %llu bytes: %s", c->dir,
                 (unsigned long long)size, strerror(e0));
        c->write_errors++;
        rc = STK_ETOOBIG;
        goto fail;
    }
reserved:
    if ((rc = fd_register(fd)) != STK_OK)
        goto fail;
    c->misses++;
    c->bytes = used + size;
    *fd_out = fd;
    goto out;
fail:
    if (fd >= 0) {
        unlink(part);
        stk__close(fd);
    }
out:
    unlock_dir(c);
    stk__free(v);
    return rc;
}

/* Makes the directory's entries (a rename) durable. Best effort: if it
 * fails, power loss can at worst lose the entry, never corrupt it. */
static void sync_dir(const stk__cache *c)
{
    int d = stk__open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        stk__fsync(d);
        stk__close(d);
    }
}

int stk__cache_commit(stk__cache *c, const char *key, int fd, char *err, size_t errlen)
{
    int rc = STK_OK;
    char path[4096], part[4096];
    stk__cache_path(c, key, path, sizeof path);
    stk__fmt(part, sizeof part, "%s%s", path, PART_SUFFIX);
    /* The bytes reach the disk before the name does, so power loss never
     * leaves a complete-looking entry with a zero-filled tail. */
    if (stk__fsync(fd) != 0) {
        stk__fmt(err, errlen, "cannot write %s to the disk: %s", part, strerror(errno));
        stk__cache_abort(c, key, fd, true);
        return STK_EIO;
    }
    /* Rename and lock conversion under the directory lock: flock's EX -> SH
     * conversion drops the lock for a moment, and every evictor and every
     * stale-.part check holds this lock, so none can see that moment. */
    if ((rc = lock_dir(c))) {
        stk__fmt(err, errlen, "cannot lock the cache directory %s", c->dir);
        stk__cache_abort(c, key, fd, false);
        return rc;
    }
    if (rename(part, path) != 0) {
        stk__fmt(err, errlen, "cannot rename %s into place: %s", part, strerror(errno));
        unlock_dir(c);
        stk__cache_abort(c, key, fd, false);
        return STK_EIO;
    }
    flock(fd, LOCK_SH); /* exclusive (writer) becomes shared (pin) */
    unlock_dir(c);
    sync_dir(c);
    return STK_OK;
}

void stk__cache_abort(stk__cache *c, const char *key, int fd, bool write_error)
{
    char part[4096];
    stk__cache_path(c, key, part, sizeof part - 8);
    size_t n = strlen(part);
    stk__fmt(part + n, sizeof part - n, "%s", PART_SUFFIX);
    /* Unlinked while still locked: no one can take it for stale meanwhile. */
    unlink(part);
    if (fd >= 0)
        fd_close(fd);
    if (write_error) {
        c->write_errors++;
    }
}

int stk__cache_part_idle(const stk__cache *c, const char *key, uint64_t *idle_ns)
{
    char part[4096];
    struct stat st;
    struct timespec now;
    stk__cache_path(c, key, part, sizeof part - 8);
    size_t n = strlen(part);
    stk__fmt(part + n, sizeof part - n, "%s", PART_SUFFIX);
    if (stk__lstat(part, &st) != 0 || !S_ISREG(st.st_mode))
        return STK_ENOENT;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t d = ((int64_t)now.tv_sec - (int64_t)st.st_mtim.tv_sec) * 1000000000LL +
                ((int64_t)now.tv_nsec - (int64_t)st.st_mtim.tv_nsec);
    *idle_ns = d > 0 ? (uint64_t)d : 0;
    return STK_OK;
}

void stk__cache_drop(stk__cache *c, const char *key, int fd)
{
    char path[4096];
    stk__cache_path(c, key, path, sizeof path);
    if (lock_dir(c) != STK_OK)
        return;
    struct stat a, b;
    bool same = stk__fstat(fd, &a) == 0 && stk__lstat(path, &b) == 0 && a.st_ino == b.st_ino &&
                a.st_dev == b.st_dev;
    if (same && unlink(path) == 0)
        c->dropped++;
    unlock_dir(c);
}

void stk__cache_stats_get(stk__cache *c, stk__cache_stats *st)
{
    st->hits = c->hits;
    st->misses = c->misses;
    st->evictions = c->evictions;
    st->bytes = c->bytes;
    st->write_errors = c->write_errors;
    st->dropped = c->dropped;
}
