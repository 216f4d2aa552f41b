/*
 * cache.h -- the local disk cache of whole remote shards.
 *
 * One directory, shared safely by every process on a node (file locks, no
 * shared memory): entries are whole objects named by a hash of their URL and
 * size plus a readable tail. A download goes to KEY.part, which is created
 * at its full size (so the directory's apparent size counts it from the
 * start) and held under an exclusive flock; complete entries are renamed
 * into place. Readers pin an entry with a shared flock for as long as they
 * use it; eviction takes an exclusive lock without waiting, so a pinned
 * entry is never evicted. The sum of the directory's file sizes never
 * exceeds the limit: space is reserved (and victims evicted) under the
 * directory's lock file before a download starts, and a download that does
 * not fit is refused (the caller then reads by ranges, uncached).
 *
 * Victims: an entry this process will not read again before the others
 * goes first (furthest next use: Belady), as told by the caller's next_use;
 * among entries no caller plans to read, the least recently used.
 *
 * Crash safety: a KEY.part whose owner died (its flock is free) is removed
 * when found; a complete entry is only ever a renamed, fully written file.
 */
#ifndef STK_CACHE_H
#define STK_CACHE_H

#include "internal.h"

typedef struct stk__cache stk__cache;

/* Opens (creating) the cache directory; limit 0 = 90 % of the space free on
 * its filesystem now plus what the cache already holds. Removes stale
 * partial downloads. */
int stk__cache_open(stk__cache **out, const char *dir, uint64_t limit, char *err, size_t errlen);
void stk__cache_close(stk__cache *c);
uint64_t stk__cache_limit(const stk__cache *c);

/* The entry name of an object (its credential-free URL and size). */
void stk__cache_key(const char *url, uint64_t size, char *out, size_t n);
/* Writes DIR/KEY into buf. */
void stk__cache_path(const stk__cache *c, const char *key, char *buf, size_t n);

/* A complete entry, pinned: *fd is open with a shared lock. STK_ENOENT when
 * there is none. Counts a hit. */
int stk__cache_pin(stk__cache *c, const char *key, int *fd);

/* For eviction: how soon the caller will read entry `key` again (smaller =
 * sooner; UINT64_MAX = not planned). */
typedef uint64_t (*stk__cache_next_use)(void *ctx, const char *key);

/* Reserves size bytes for a download of key and returns KEY.part's fd,
 * exclusively locked, sized to `size`. STK_ETOOBIG: it cannot fit even
 * after evicting every unpinned entry; STK_EBUSY: another process is
 * downloading it (pin it later); STK_EIO with reason. Counts a miss. */
int stk__cache_begin(stk__cache *c, const char *key, uint64_t size, stk__cache_next_use next_use,
                     void *ctx, int *fd, char *err, size_t errlen);
/* The download in fd (from begin) is complete: renames it into place; fd
 * stays open and becomes a pin (shared lock). */
int stk__cache_commit(stk__cache *c, const char *key, int fd, char *err, size_t errlen);
/* The download failed: removes KEY.part and closes fd. */
void stk__cache_abort(stk__cache *c, const char *key, int fd);
/* Releases a pin. */
void stk__cache_unpin(int fd);

typedef struct stk__cache_stats {
    uint64_t hits, misses, evictions, bytes; /* bytes: directory size at the last reservation */
} stk__cache_stats;
void stk__cache_stats_get(stk__cache *c, stk__cache_stats *st);

#endif
