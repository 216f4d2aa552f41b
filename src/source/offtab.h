/*
 * offtab.h -- shards that begin with an offsets table: a u32 count, then
 * count + 1 u32 offsets (little-endian) of the items that follow. MDS
 * shards and LitData chunks are laid out so; mds.c and litdata.c read
 * them through these helpers and say "shard"/"record" or "chunk"/"item".
 */
#ifndef STK_SOURCE_OFFTAB_H
#define STK_SOURCE_OFFTAB_H

#include "internal.h"

#include <stdbool.h>
#include <stdint.h>

/* One shard: its files, its samples, its offsets table. */
typedef struct stk__otshard {
    char *shown; /* the file as the user knows it (messages) */
    char *path;  /* the file read: the shard, or its decompressed copy */
    int fd;      /* kept open, or -1: opened per read */
    uint64_t first, count, bytes;
    uint64_t stored; /* bytes of the file as stored (the compressed one) */
    uint32_t *off;   /* count + 1 item offsets */
} stk__otshard;

/* Where the parser's bytes come from: a descriptor (buf NULL) or memory. */
typedef struct stk__otrd {
    int fd;
    const uint8_t *buf;
    uint64_t size;
} stk__otrd;

/* The words a format's messages use. */
typedef struct stk__otwords {
    const char *file;       /* "shard" */
    const char *item;       /* "record" */
    const char *items;      /* "samples" */
    const char *count_from; /* appended to "index.json says N": "" or " (chunk_size)" */
} stk__otwords;

static inline uint32_t stk__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* n bytes at off; STK_EFORMAT past the end, STK_EIO on a failed read. */
int stk__ot_get(const stk__otrd *r, uint64_t off, void *out, size_t n, char *why, size_t wn);

/* Reads the count and offsets table into t (t->off, t->count); checks them
 * against the index's count want and the file. An item reaching past the
 * end of the file (a truncated shard) is left for its read to report. */
int stk__ot_head(const stk__otrd *r, uint64_t want, stk__otshard *t, const stk__otwords *w,
                 char *why, size_t n);

/* Item j's range in t; STK_EFORMAT when it ends past the file. */
int stk__ot_range(const stk__otshard *t, uint64_t j, uint64_t *off, size_t *len,
                  const stk__otwords *w, char *why, size_t wn);

/* Reads item j of t into memory the sink gives: *buf, its *n bytes, at
 * *off in the file. Errors as stk__ot_range, stk__sink_take (the item
 * named by w) and stk__pread_at. */
int stk__ot_read(const stk__otshard *t, uint64_t j, const stk__otwords *w, stk__sink *sink,
                 uint8_t **buf, size_t *n, uint64_t *off, char *err, size_t errlen);

/* Item j of t for messages: "SHOWN#j". */
void stk__ot_name(const stk__otshard *t, uint64_t j, char *buf, size_t n);

/* Opens t->path (a regular file) and reads its offsets table (want items);
 * sets t->bytes, and t->stored when still 0. keep: t->fd stays open, else
 * reads open the file each time. Errors name t->shown. */
int stk__ot_open(stk__otshard *t, uint64_t want, bool keep, const stk__otwords *w, char *err,
                 size_t errlen);

/* "dir/name", allocated; NULL when out of memory. */
char *stk__ot_join(const char *dir, const char *name);

/* Closes and frees n shards' descriptors, names and tables (not the array). */
void stk__ot_free(stk__otshard *t, size_t n);

#endif
