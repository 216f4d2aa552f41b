/*
 * listcache.c -- the listing of unpacked objects in a bucket (bucket.c),
 * kept on disk in the cache directory so that the next open, by this process
 * or another rank of the node, does not list the prefix again: ListObjectsV2
 * returns 1000 keys a page, so a 1.2 M object ImageFolder is 1200 sequential
 * requests (minutes at cloud latency) before the first sample.
 *
 * Where: DIR/stoker-listing/H.stklist, H the XXH3-64 of the prefix's id (the
 * request URL with the endpoint and bucket for s3://, the display URL for
 * http), which the file also holds and a read compares, so two prefixes never
 * share one. Written to a temporary file and renamed; a reader takes a file
 * only whole (its XXH3 trailer, its bounds and every entry check), and a
 * damaged one is ignored with a warning and listed again.
 *
 * Validity: S3 has no bucket-level ETag or version that would say a prefix
 * changed without listing it, and nginx sends none for its index pages, so a
 * listing is trusted for listing_ttl seconds from when it was taken (a day by
 * default; 0 lists on every open, and rewrites the cached copy). What that
 * leaves stale is in docs/remote.md "Unpacked objects in a bucket": objects
 * added after the listing are not read; a removed object fails its sample,
 * named; an object whose size changed fails its sample (the GET's size
 * differs from the listed one); one rewritten with the same size is read as
 * it is now.
 *
 * Bounded: at most LISTINGS_MAX files are kept (the oldest go when a new one
 * is written), and none over LISTING_MAX_BYTES is read or written.
 *
 * Layout (little-endian): "STKLIST1", u64 listed-at (Unix seconds), u64
 * count, u32 id length, the id, then per object u64 size, u32 name length,
 * the name; a u64 XXH3-64 of everything before it.
 */
#include "io/file.h"
#include "io/remote.h"
#include "source/source.h"
#include "source/stkformat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC             "STKLIST1"
#define LISTINGS_MAX      32
#define LISTING_MAX_BYTES (2ull << 30) /* some 30 M objects of 60-byte names */
#define NAME_MAX_BYTES    4096         /* an S3 key is at most 1024 bytes */
#define ID_MAX            4096
/* A rank waits this long for another that is listing the same prefix, then
 * lists for itself (a lock holder that died releases it at once). */
#define LOCK_WAIT_MS (30 * 60 * 1000)

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int k = 3; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

static bool enabled(const stk__source_params *prm)
{
    return prm && prm->cache_dir && *prm->cache_dir;
}

/* The prefix's id and its file's path. */
static void listing_path(stk__remote *r, const stk__source_params *prm, char *id, size_t idn,
                         char *path, size_t n)
{
    stk__remote_object_id(r, "", id, idn);
    stk__fmt(path, n, "%s/stoker-listing/%016llx.stklist", prm->cache_dir,
             (unsigned long long)stk__xxh3(id, strlen(id)));
}

static void warn(const stk__source_params *prm, const char *path, const char *why)
{
    /* The open goes on (it lists again): no return code would show it. */
    stk__warn(prm, "cached listing %s: %s; listing the objects again", path, why);
}

int stk__listing_parse(const uint8_t *buf, size_t len, const char *id, uint64_t *listed_at,
                       char ***names_out, uint64_t **sizes_out, size_t *n_out, char *why, size_t wn)
{
    int rc = STK_OK;
    char **names = NULL;
    uint64_t *sizes = NULL;
    uint64_t n = 0;
    size_t have = 0;
    if (len < 8 + 8 + 8 + 4 + 8 || memcmp(buf, MAGIC, 8)) {
        stk__fmt(why, wn, "not a stoker listing (%zu bytes, no %s header)", len, MAGIC);
        return STK_EFORMAT;
    }
    if (stk__xxh3(buf, len - 8) != get_u64(buf + len - 8)) {
        stk__fmt(why, wn, "its checksum does not match (damaged on disk?)");
        return STK_EFORMAT;
    }
    size_t end = len - 8, at = 8;
    *listed_at = get_u64(buf + at);
    n = get_u64(buf + at + 8);
    uint32_t il = get_u32(buf + at + 16);
    at += 20;
    if (il > end - at || il != strlen(id) || memcmp(buf + at, id, il)) {
        stk__fmt(why, wn, "it lists another prefix");
        return STK_EFORMAT;
    }
    at += il;
    if (n > (end - at) / 13) { /* an entry is at least 13 bytes */
        stk__fmt(why, wn, "it says %llu objects, more than its %zu bytes hold",
                 (unsigned long long)n, len);
        return STK_EFORMAT;
    }
    if (!(names = stk__calloc(n ? (size_t)n : 1, sizeof *names)) ||
        !(sizes = stk__calloc(n ? (size_t)n : 1, sizeof *sizes))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (; have < n; have++) {
        if (end - at < 12) {
            stk__fmt(why, wn, "object %zu lies past its end", have);
            rc = STK_EFORMAT;
            goto out;
        }
        sizes[have] = get_u64(buf + at);
        uint32_t nl = get_u32(buf + at + 8);
        at += 12;
        if (!nl || nl > NAME_MAX_BYTES || nl > end - at || memchr(buf + at, '\0', nl)) {
            stk__fmt(why, wn, "object %zu has a name of %u bytes that is not one", have, nl);
            rc = STK_EFORMAT;
            goto out;
        }
        if (!(names[have] = stk__malloc(nl + 1))) {
            rc = STK_ENOMEM;
            goto out;
        }
        memcpy(names[have], buf + at, nl);
        names[have][nl] = '\0';
        at += nl;
    }
    if (at != end) {
        stk__fmt(why, wn, "%zu bytes after its last object", end - at);
        rc = STK_EFORMAT;
    }
out:
    if (rc) {
        stk__remote_list_free(names, sizes, have);
        return rc;
    }
    *names_out = names;
    *sizes_out = sizes;
    *n_out = (size_t)n;
    return STK_OK;
}

/* The cached listing at path when it is whole and younger than the TTL:
 * STK_OK; STK_ENOENT (none, stale, or damaged: warned through loud's
 * channel, quietly when loud is NULL); STK_ENOMEM. */
static int load(const char *path, const char *id, uint64_t ttl, const stk__source_params *loud,
                char ***names, uint64_t **sizes, size_t *n)
{
    int rc = STK_ENOENT;
    uint8_t *buf = NULL;
    char why[STK_ERRMSG_MAX] = "";
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return STK_ENOENT;
    struct stat st;
    if (stk__fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        stk__fmt(why, sizeof why, "not a regular file");
        goto out;
    }
    if ((uint64_t)st.st_size > LISTING_MAX_BYTES) {
        stk__fmt(why, sizeof why, "%lld bytes, over the %llu a listing may have",
                 (long long)st.st_size, (unsigned long long)LISTING_MAX_BYTES);
        goto out;
    }
    size_t len = (size_t)st.st_size;
    if (!(buf = stk__malloc(len ? len : 1))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if (stk__pread_full(fd, buf, len, 0, why, sizeof why))
        goto out;
    uint64_t listed_at = 0;
    int prc = stk__listing_parse(buf, len, id, &listed_at, names, sizes, n, why, sizeof why);
    if (prc == STK_ENOMEM) {
        rc = prc;
        goto out;
    }
    if (prc)
        goto out;
    uint64_t now = (uint64_t)time(NULL);
    if (now < listed_at || now - listed_at >= ttl) {
        /* Stale (or from a clock ahead of ours): listed again, silently. */
        stk__remote_list_free(*names, *sizes, *n);
        *names = NULL;
        *sizes = NULL;
        *n = 0;
        goto out;
    }
    rc = STK_OK;
out:
    if (rc == STK_ENOENT && why[0] && loud)
        warn(loud, path, why);
    stk__free(buf);
    stk__close(fd);
    return rc;
}

static uint64_t ttl_of(const stk__source_params *prm)
{
    return prm->listing_ttl ? prm->listing_ttl : STK__LISTING_TTL_DEFAULT;
}

int stk__listing_load(stk__remote *r, const stk__source_params *prm, char ***names,
                      uint64_t **sizes, size_t *n)
{
    char id[ID_MAX], path[4400];
    if (!enabled(prm) || prm->listing_ttl == STK__LISTING_RELIST)
        return STK_ENOENT;
    listing_path(r, prm, id, sizeof id, path, sizeof path);
    return load(path, id, ttl_of(prm), prm, names, sizes, n);
}

/* Keeps at most LISTINGS_MAX listings: the oldest others go. */
static void prune(const char *dir, const char *keep)
{
    DIR *d = stk__opendir(dir);
    if (!d)
        return;
    char old[4400] = "";
    time_t oldest = 0;
    size_t count = 0;
    struct dirent *e;
    while ((e = stk__readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl < 8 || strcmp(e->d_name + nl - 8, ".stklist"))
            continue;
        count++;
        char p[4400];
        struct stat st;
        stk__fmt(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strcmp(p, keep) && stk__stat(p, &st) == 0 && (!old[0] || st.st_mtime < oldest)) {
            oldest = st.st_mtime;
            stk__fmt(old, sizeof old, "%s", p);
        }
    }
    stk__closedir(d);
    if (count > LISTINGS_MAX && old[0]) {
        stk__unlink(old);
        char lock[4500];
        stk__fmt(lock, sizeof lock, "%s.lock", old);
        stk__unlink(lock);
        if (count - 1 > LISTINGS_MAX)
            prune(dir, keep);
    }
}

/* Writes the listing (tmp file, rename): best effort, a listing that cannot
 * be kept costs the next open a listing, no more. */
static void store(const char *path, const char *id, char *const *names, const uint64_t *sizes,
                  size_t n)
{
    size_t il = strlen(id), len = 8 + 8 + 8 + 4 + il + 8;
    for (size_t k = 0; k < n; k++) {
        size_t nl = strlen(names[k]);
        if (!nl || nl > NAME_MAX_BYTES)
            return; /* not one a reader would take */
        len += 12 + nl;
    }
    if (len > LISTING_MAX_BYTES)
        return;
    uint8_t *buf = stk__malloc(len);
    if (!buf)
        return;
    memcpy(buf, MAGIC, 8);
    put_u64(buf + 8, (uint64_t)time(NULL));
    put_u64(buf + 16, n);
    put_u32(buf + 24, (uint32_t)il);
    memcpy(buf + 28, id, il);
    size_t at = 28 + il;
    for (size_t k = 0; k < n; k++) {
        size_t nl = strlen(names[k]);
        put_u64(buf + at, sizes[k]);
        put_u32(buf + at + 8, (uint32_t)nl);
        memcpy(buf + at + 12, names[k], nl);
        at += 12 + nl;
    }
    put_u64(buf + at, stk__xxh3(buf, at));
    (void)stk__write_replace(path, buf, len); /* best effort: the next open lists again */
    stk__free(buf);
    char dir[4400];
    stk__fmt(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        prune(dir, path);
    }
}

int stk__listing_tree(stk__remote *r, const stk__source_params *prm, char ***names,
                      uint64_t **sizes, size_t *n, char *err, size_t errlen)
{
    if (!enabled(prm))
        return stk__remote_list_tree(r, names, sizes, n, err, errlen);
    char id[ID_MAX], path[4400], lpath[4500];
    int lock_fd = -1, rc;
    listing_path(r, prm, id, sizeof id, path, sizeof path);
    stk__mkdirs_for(path);
    /* One rank of the node lists; the others wait for its file. */
    stk__fmt(lpath, sizeof lpath, "%s.lock", path);
    lock_fd = stk__open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    for (int t = 0; lock_fd >= 0 && t < LOCK_WAIT_MS / 10; t++) {
        if (stk__flock(lock_fd, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK ||
            (prm->cancel && atomic_load_explicit(prm->cancel, memory_order_relaxed))) {
            stk__close(lock_fd);
            lock_fd = -1;
            break;
        }
        usleep(10000);
    }
    /* Listed by another rank while this one waited (quiet: a damaged file
     * was reported by the first look). A relist (TTL 0) lists anyway. */
    if (prm->listing_ttl != STK__LISTING_RELIST &&
        (rc = load(path, id, ttl_of(prm), NULL, names, sizes, n)) != STK_ENOENT)
        goto out;
    if ((rc = stk__remote_list_tree(r, names, sizes, n, err, errlen)))
        goto out;
    if (stk__bucket_samples(*names, *n))
        store(path, id, *names, *sizes, *n);
out:
    if (lock_fd >= 0)
        stk__close(lock_fd); /* releases the lock */
    return rc;
}
