/* cache.c -- the local disk cache of whole remote shards (see cache.h). */
#include "cache/cache.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#define LOCK_NAME ".stoker-cache.lock"
#define PART_SUFFIX ".part"

struct stk__cache {
    char *dir;
    uint64_t limit;
    int lockfd;
    pthread_mutex_t mu; /* serialises this process's reservations */
    uint64_t hits, misses, evictions, bytes;
};

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

void stk__cache_key(const char *url, uint64_t size, char *out, size_t n)
{
    XXH64_hash_t h = XXH3_64bits_withSeed(url, strlen(url), size);
    const char *base = strrchr(url, '/');
    base = base ? base + 1 : url;
    char tail[96];
    size_t k = 0;
    for (const char *p = base; *p && k < sizeof tail - 1; p++) {
        char ch = *p;
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '-' || ch == '_';
        tail[k++] = ok ? ch : '_';
    }
    tail[k] = '\0';
    stk__fmt(out, n, "%016llx-%s", (unsigned long long)h, tail);
}

void stk__cache_path(const stk__cache *c, const char *key, char *buf, size_t n)
{
    stk__fmt(buf, n, "%s/%s", c->dir, key);
}

uint64_t stk__cache_limit(const stk__cache *c)
{
    return c->limit;
}

static int lock_dir(stk__cache *c)
{
    pthread_mutex_lock(&c->mu);
    while (flock(c->lockfd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            pthread_mutex_unlock(&c->mu);
            return STK_EIO;
        }
    }
    return STK_OK;
}

static void unlock_dir(stk__cache *c)
{
    flock(c->lockfd, LOCK_UN);
    pthread_mutex_unlock(&c->mu);
}

/* Removes KEY.part files whose writer is gone (their flock is free). */
static void remove_stale_parts(stk__cache *c)
{
    DIR *d = stk__opendir(c->dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    while ((e = stk__readdir(d))) {
        if (!ends_with(e->d_name, PART_SUFFIX))
            continue;
        stk__fmt(path, sizeof path, "%s/%s", c->dir, e->d_name);
        int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            unlink(path);
        stk__close(fd);
    }
    stk__closedir(d);
}

int stk__cache_open(stk__cache **out, const char *dir, uint64_t limit, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    /* mkdir -p */
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
    stk__cache *c = stk__calloc(1, sizeof *c);
    if (!c || !(c->dir = stk__strdup(dir))) {
        stk__free(c);
        return STK_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    stk__fmt(path, sizeof path, "%s/%s", dir, LOCK_NAME);
    c->lockfd = stk__open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c->lockfd < 0) {
        stk__fmt(err, errlen, "cache directory %s: cannot create its lock file: %s", dir,
                 strerror(errno));
        pthread_mutex_destroy(&c->mu);
        stk__free(c->dir);
        stk__free(c);
        return STK_EIO;
    }
    if (lock_dir(c) == STK_OK) {
        remove_stale_parts(c);
        unlock_dir(c);
    }
    if (!limit) {
        struct statvfs v;
        uint64_t held = 0;
        DIR *d = stk__opendir(dir);
        struct dirent *e;
        while (d && (e = stk__readdir(d))) {
            struct stat st;
            stk__fmt(path, sizeof path, "%s/%s", dir, e->d_name);
            if (e->d_name[0] != '.' && stk__stat(path, &st) == 0 && S_ISREG(st.st_mode))
                held += (uint64_t)st.st_size;
        }
        if (d)
            stk__closedir(d);
        limit = held;
        if (statvfs(dir, &v) == 0)
            limit += (uint64_t)v.f_bavail * v.f_frsize / 10 * 9;
    }
    c->limit = limit;
    *out = c;
    return STK_OK;
}

void stk__cache_close(stk__cache *c)
{
    if (!c)
        return;
    stk__close(c->lockfd);
    pthread_mutex_destroy(&c->mu);
    stk__free(c->dir);
    stk__free(c);
}

int stk__cache_pin(stk__cache *c, const char *key, int *fd)
{
    char path[4096];
    stk__cache_path(c, key, path, sizeof path);
    int f = stk__open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return STK_ENOENT;
    while (flock(f, LOCK_SH) != 0 && errno == EINTR) {
    }
    /* Evicted between open and lock? Then the name no longer points here. */
    struct stat a, b;
    if (stk__fstat(f, &a) != 0 || stk__stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
        stk__close(f);
        return STK_ENOENT;
    }
    futimens(f, NULL); /* recency for LRU; best effort */
    pthread_mutex_lock(&c->mu);
    c->hits++;
    pthread_mutex_unlock(&c->mu);
    *fd = f;
    return STK_OK;
}

void stk__cache_unpin(int fd)
{
    if (fd >= 0)
        stk__close(fd); /* releases the shared lock */
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
    if ((rc = lock_dir(c))) {
        stk__fmt(err, errlen, "cannot lock the cache directory %s", c->dir);
        return rc;
    }
    stk__cache_path(c, key, path, sizeof path);
    stk__fmt(part, sizeof part, "%s%s", path, PART_SUFFIX);
    if (access(path, F_OK) == 0) {
        rc = STK_EBUSY; /* complete already: the caller pins it */
        goto out;
    }
    /* Someone downloading it? */
    int pf = stk__open(part, O_RDONLY | O_CLOEXEC);
    if (pf >= 0) {
        bool live = flock(pf, LOCK_EX | LOCK_NB) != 0;
        if (!live)
            unlink(part);
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
    while ((e = stk__readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        struct stat st;
        stk__fmt(p, sizeof p, "%s/%s", c->dir, e->d_name);
        if (stk__stat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        used += (uint64_t)st.st_size;
        if (ends_with(e->d_name, PART_SUFFIX) || strlen(e->d_name) >= sizeof v->name)
            continue;
        if (nv == cap) {
            size_t nc = cap ? cap * 2 : 64;
            victim *q = stk__realloc(v, nc * sizeof *q);
            if (!q) {
                stk__closedir(d);
                rc = STK_ENOMEM;
                goto out;
            }
            v = q;
            cap = nc;
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
            int vf = stk__open(p, O_RDONLY | O_CLOEXEC);
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
    fd = stk__open(part, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0 || ftruncate(fd, (off_t)size) != 0) {
        stk__fmt(err, errlen, "cannot create %s: %s", part, strerror(errno));
        if (fd >= 0) {
            unlink(part);
            stk__close(fd);
        }
        fd = -1;
        rc = STK_EIO;
        goto out;
    }
    c->misses++;
    c->bytes = used + size;
    *fd_out = fd;
out:
    unlock_dir(c);
    stk__free(v);
    return rc;
}

int stk__cache_commit(stk__cache *c, const char *key, int fd, char *err, size_t errlen)
{
    char path[4096], part[4096];
    stk__cache_path(c, key, path, sizeof path);
    stk__fmt(part, sizeof part, "%s%s", path, PART_SUFFIX);
    if (rename(part, path) != 0) {
        stk__fmt(err, errlen, "cannot rename %s into place: %s", part, strerror(errno));
        stk__cache_abort(c, key, fd);
        return STK_EIO;
    }
    /* Exclusive (writer) becomes shared (pin). */
    flock(fd, LOCK_SH);
    return STK_OK;
}

void stk__cache_abort(stk__cache *c, const char *key, int fd)
{
    char part[4096];
    stk__cache_path(c, key, part, sizeof part - 8);
    size_t n = strlen(part);
    stk__fmt(part + n, sizeof part - n, "%s", PART_SUFFIX);
    unlink(part);
    if (fd >= 0)
        stk__close(fd);
}

void stk__cache_stats_get(stk__cache *c, stk__cache_stats *st)
{
    pthread_mutex_lock(&c->mu);
    st->hits = c->hits;
    st->misses = c->misses;
    st->evictions = c->evictions;
    st->bytes = c->bytes;
    pthread_mutex_unlock(&c->mu);
}
