/*
 * stkindex.h -- the consolidated index of a packed dataset (stoker.index,
 * docs/format.md#the-consolidated-index): every shard's header, footer and
 * index region in one object, so a remote open reads the whole dataset's
 * index with one request (or a few ranged ones in parallel) instead of three
 * round trips per shard. The writer (src/pack/writer.c) writes it from the
 * finished shards, before the manifest, which names it with its size and
 * checksum; the .stk reader uses it only for remote datasets.
 *
 * The bytes are untrusted: the parser checks every length and offset and
 * the file's checksum before anything points into it, and
 * stk__stkindex_check_shard applies the same checks to each shard's part as
 * a shard's own open does (header, footer, index checksum, every entry).
 */
#ifndef STK_STKINDEX_H
#define STK_STKINDEX_H

#include "source/manifest.h"
#include "source/stkformat.h"

#define STK_INDEX_NAME    "stoker.index"
#define STK_INDEX_MAGIC   "STKINDEX"
#define STK_INDEX_END     "STKIEND\n"
#define STK_INDEX_VERSION 1
#define STK_INDEX_HEAD    64
#define STK_INDEX_REC     32
#define STK_INDEX_TRAILER 16

/* One shard's part of a parsed index; the pointers point into the buffer
 * that was parsed. */
typedef struct stk__stkindex_shard {
    const char *name; /* not NUL-terminated: name_len bytes */
    size_t name_len;
    uint64_t bytes, count; /* the shard file's size and samples */
    const uint8_t *hdr;    /* STK_HEADER_SIZE bytes: the shard's header */
    const uint8_t *foot;   /* STK_FOOTER_SIZE bytes: its footer */
    const uint8_t *region; /* its index region (entries, meta, keys, field table) */
    size_t region_len;
} stk__stkindex_shard;

typedef struct stk__stkindex {
    stk__stkindex_shard *sh; /* n entries (stk__free) */
    size_t n;
    uint64_t samples;
    uint64_t sum; /* XXH3-64 of the file before its trailer: what the manifest names */
} stk__stkindex;

/* Parses n bytes at p (untrusted): header, shard table, names, every part's
 * bounds, the trailer and the checksum. Checks the structure only; each
 * shard's own bytes are checked by stk__stkindex_check_shard. STK_EFORMAT
 * with the reason in err, STK_ENOMEM. On success ix->sh is the caller's
 * (stk__stkindex_free). */
int stk__stkindex_parse(const uint8_t *p, size_t n, stk__stkindex *ix, char *err, size_t errlen);
void stk__stkindex_free(stk__stkindex *ix);

/* Checks one shard's part as a shard's open checks its own bytes: header,
 * footer against the recorded size, the region's length and checksum, every
 * entry, and the count. Fills *h, *f and *max_label. STK_EFORMAT with the
 * reason. */
int stk__stkindex_check_shard(const stk__stkindex_shard *s, stk__stk_header *h, stk__stk_footer *f,
                              int64_t *max_label, char *err, size_t errlen);

/* Builds in memory the index of the shards the manifest m lists in DIR
 * (what stk__stkindex_write writes): *out (stk__free) of *len bytes, *sum
 * its checksum. Errors as stk__stkindex_write's. */
int stk__stkindex_build(const char *dir, const stk__manifest *m, uint8_t **out, size_t *len,
                        uint64_t *sum, char *err, size_t errlen);
/* Writes DIR/stoker.index from the finished shards the manifest m lists
 * (read back from DIR: the bytes a reader will see), to a .tmp file that is
 * fsynced and renamed. *bytes and *sum get the file's size and checksum, for
 * the manifest's index line. STK_EIO, STK_EFORMAT (a shard that is not what
 * m says), STK_ENOMEM, with the reason in err. */
int stk__stkindex_write(const char *dir, const stk__manifest *m, uint64_t *bytes, uint64_t *sum,
                        char *err, size_t errlen);

#endif
