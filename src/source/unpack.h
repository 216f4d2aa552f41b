/*
 * unpack.h -- a reader's private temporary area for decompressed files.
 *
 * Some formats store their shards compressed as a whole (MDS .mds.zstd,
 * LitData .zstd.bin, TFRecord .gz): those are decompressed once, at open,
 * into a private directory $TMPDIR/stoker-TAG-XXXXXX (TMPDIR unset: /tmp)
 * and read from there; the directory and all it holds go at close. The
 * free space is checked before the area is made, a file decompressing to
 * other than the size its index gives is refused (so the index bounds the
 * area), and a copy with a known xxh64 is checked.
 *
 * The codec is an enum: a new one is a decoder function and a row in
 * unpack.c's table; the area, the size and hash checks stay shared.
 */
#ifndef STK_SOURCE_UNPACK_H
#define STK_SOURCE_UNPACK_H

#include "internal.h"

#include <stdint.h>

enum stk__codec { STK__CODEC_ZSTD };

/* One reader's area: zero-filled but for the three names, at open. */
typedef struct stk__unpack_area {
    const char *tag;  /* the directory's name: stoker-TAG-XXXXXX */
    const char *what; /* "the dataset's .mds.zstd shards": the free-space message */
    const char *hint; /* advice appended to that message after "a larger disk" */
    char *dir;        /* made at the first stk__unpack; NULL before */
} stk__unpack_area;

/* One compressed file to decompress into the area. */
typedef struct stk__unpack_job {
    int codec;             /* enum stk__codec */
    const char *src;       /* the compressed file, as messages name it */
    const char *local;     /* the file opened, when not src (a cached download) */
    const char *name;      /* its copy's name in the area (a plain file name) */
    uint64_t want;         /* the exact decompressed size the index gives */
    const char *want_from; /* the index's name for want ("raw_data.bytes") */
    const char *xxh64;     /* the copy's xxh64 as 16 hex digits, or NULL */
    uint64_t need;         /* bytes the whole area will hold: the free-space check */
} stk__unpack_job;

/* Decompresses j->src into the area (made on first use). On success *path
 * is the copy (the caller frees it) and *stored the compressed file's size.
 * Errors name j->src and the reason: STK_ENOENT, STK_EIO, STK_EFORMAT,
 * STK_ENOMEM. */
int stk__unpack(stk__unpack_area *a, const stk__unpack_job *j, char **path, uint64_t *stored,
                char *err, size_t errlen);

/* Removes the area and every file in it; a no-op when none was made. */
void stk__unpack_remove(stk__unpack_area *a);

#endif
