/*
 * cache.h -- the local disk cache of whole remote shards.
 *
 * The cache lives in DIR/stoker-cache/, a subdirectory the cache creates with
 * a version marker (DIR/stoker-cache/VERSION) and a lock file (.lock). It
 * only ever creates, reads, renames or removes files in that subdirectory
 * whose names it could have made: 16 hex digits, '-', a tail of
 * [A-Za-z0-9._-], and for a download in progress ".part". Anything else in
 * DIR or in the subdirectory (a user's file, a FIFO, a symlink) is neither
 * counted nor touched; a subdirectory that holds files but no marker is
 * refused rather than adopted.
 *
 * One directory is shared safely by every process on a node (file locks, no
 * shared memory): entries are whole objects named by a hash of the object's
 * identity (endpoint-qualified URL, size, and ETag or Last-Modified when the
 * server gives one) plus a readable tail. A download goes to KEY.part, whose
 * blocks are allocated at its full size before the download starts
 * (fallocate; a sparse file where the filesystem cannot), held under an
 * exclusive flock; complete entries are fsynced and renamed into place.
 * Readers pin an entry with a shared flock for as long as they use it;
 * eviction takes an exclusive lock without waiting, so a pinned entry is
 * never evicted. The sum of the entries' sizes never exceeds the limit:
 * space is reserved (and victims evicted) under the directory's lock file
 * before a download starts, and a download that does not fit, or that the
 * disk refuses, is not admitted (the caller then reads by ranges, uncached).
 *
 * Race-free hand-overs: the rename of KEY.part into place and the conversion
 * of the writer's exclusive lock into a shared pin run under the directory
 * lock, which every evictor and every check of a .part also holds, so no
 * one sees the moment between the two locks.
 *
 * Victims: an entry this process will not read again before the others
 * goes first (furthest next use: Belady), as told by the caller's next_use;
 * among entries no caller plans to read, the least recently used.
 *
 * Crash safety: a KEY.part whose owner died (its flock is free) is removed
 * when found; a complete entry is only ever a renamed, fully written and
 * fsynced file (power loss leaves the old state or the new one).
 *
 * Fork: pins and downloads are file descriptors whose locks a forked child
 * would share; in the child every one of them is replaced by /dev/null
 * (pthread_atfork), so a child never keeps a parent's entry pinned or its
 * .part locked. A child does not use its copy of a cache.
 */
#ifndef STK_CACHE_H
#define STK_CACHE_H

#include "internal.h"

typedef struct stk__cache stk__cache;

/* The subdirectory of the cache directory that holds the entries. */
#define STK__CACHE_SUBDIR "stoker-cache"

/* Opens (creating) DIR/stoker-cache; limit 0 = 90 % of the space free on its
 * filesystem now plus what the cache already holds. Removes stale partial
 * downloads (its own only). STK_EIO with the reason in err when the
 * directory cannot be made or used, or holds someone else's files. */
int stk__cache_open(stk__cache **out, const char *dir, uint64_t limit, char *err, size_t errlen);
void stk__cache_close(stk__cache *c);

/* The entry name of an object: id names it without credentials and with its
 * endpoint (stk__remote_object_id), size is its size, validator its ETag or
 * Last-Modified (NULL or "" when the server gave none). */
void stk__cache_key(const char *id, uint64_t size, const char *validator, char *out, size_t n);
/* Writes the entry's path (DIR/stoker-cache/KEY) into buf. */
void stk__cache_path(const stk__cache *c, const char *key, char *buf, size_t n);

/* A complete entry, pinned: *fd is open with a shared lock. STK_ENOENT when
 * there is none; STK_ENOMEM. Counts a hit. */
int stk__cache_pin(stk__cache *c, const char *key, int *fd);

/* For eviction: how soon the caller will read entry `key` again (smaller =
 * sooner; UINT64_MAX = not planned). */
typedef uint64_t (*stk__cache_next_use)(void *ctx, const char *key);

/* Reserves size bytes for a download of key and returns KEY.part's fd,
 * exclusively locked, its blocks allocated. STK_ETOOBIG: it cannot fit even
 * after evicting every unpinned entry, or the disk refused the space (counted
 * as a write error); STK_EBUSY: complete already, or another process is
 * downloading it (pin it later); STK_ECANCELED (stk__cache_cancel); STK_EIO
 * with reason. Counts a miss. Waits for the directory's lock: call it with
 * no lock of the caller's held. */
int stk__cache_begin(stk__cache *c, const char *key, uint64_t size, stk__cache_next_use next_use,
                     void *ctx, int *fd, char *err, size_t errlen);
/* The download in fd (from begin) is complete: fsyncs it and renames it into
 * place; fd stays open and becomes a pin (shared lock). On an error fd is
 * closed and the download removed (a failed fsync counts as a write error). */
int stk__cache_commit(stk__cache *c, const char *key, int fd, char *err, size_t errlen);
/* The download failed: removes KEY.part and closes fd. write_error: it
 * failed because the disk refused the bytes (counted). */
void stk__cache_abort(stk__cache *c, const char *key, int fd, bool write_error);
/* on: reservations (stk__cache_begin) stop waiting for the directory's
 * lock and return STK_ECANCELED, until called again with off. For a
 * loader closing or seeking while another process holds the lock. */
void stk__cache_cancel(stk__cache *c, bool on);
#ifdef STK_TEST
/* Tests only: every reservation holds the directory lock this many ms more
 * (a slow scan or disk), in slices that stk__cache_cancel ends. */
extern _Atomic unsigned stk__cache_test_begin_wait_ms;
#endif
/* Another process's download of key (STK_EBUSY from begin): how long ago it
 * last wrote (*idle_ns). STK_ENOENT when there is no download of key. */
int stk__cache_part_idle(const stk__cache *c, const char *key, uint64_t *idle_ns);
/* Releases a pin. */
void stk__cache_unpin(int fd);
/* The pinned entry in fd proved corrupt (a checksum failed): removes it from
 * the directory if the name still points at this file, so the next admission
 * downloads it again. The pin stays the caller's to release. */
void stk__cache_drop(stk__cache *c, const char *key, int fd);

typedef struct stk__cache_stats {
    uint64_t hits, misses, evictions;
    uint64_t bytes;        /* entries' size at the last reservation */
    uint64_t write_errors; /* downloads the disk refused (full, I/O error): read by ranges */
    uint64_t dropped;      /* entries removed because they failed their checksums */
} stk__cache_stats;
void stk__cache_stats_get(stk__cache *c, stk__cache_stats *st);

#endif
