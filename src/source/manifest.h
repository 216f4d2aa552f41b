/*
 * manifest.h -- the manifest of a packed dataset (stoker.manifest,
 * docs/format.md). Below the readers: it uses only source.h's helpers.
 */
#ifndef STK_MANIFEST_H
#define STK_MANIFEST_H

#include "source/source.h"

#define STK_MANIFEST "stoker.manifest"
/* Kept in the output directory while packing works. */
#define STK_PACK_MARKER ".stoker-pack-incomplete"

typedef struct stk__manifest_shard {
    char *name;
    uint64_t count, bytes;
} stk__manifest_shard;

typedef struct stk__manifest {
    uint32_t kind;
    uint64_t samples, classes;
    stk__manifest_shard *shards;
    size_t nshards;
    char **class_names; /* classes entries, NULL where not named */
    /* "restart-indexed N": samples pack --restart rewrote with a restart
     * index (src/codec/jpeg_restart.h); has_restart false: no such line. */
    bool has_restart;
    uint64_t restart_indexed;
    /* "index stoker.index BYTES SUM": the consolidated index written with
     * the shards (stkindex.h), its size and XXH3-64 (16 hex digits);
     * has_index false: no such line (a pack from before it, or none). */
    bool has_index;
    uint64_t index_bytes, index_sum;
} stk__manifest;

/* Writes DIR/stoker.manifest atomically (tmp, fsync, rename, fsync dir). */
int stk__manifest_write(const char *dir, const stk__manifest *m, char *err, size_t errlen);
/* Reads DIR/stoker.manifest. STK_ENOENT if there is none (err untouched). */
int stk__manifest_read(const char *dir, stk__manifest *m, char *err, size_t errlen);
/* Parses a manifest's text (modified in place; NUL-terminated at tlen);
 * path names it in messages. */
int stk__manifest_parse(char *text, size_t tlen, const char *path, stk__manifest *m, char *err,
                        size_t errlen);
void stk__manifest_free(stk__manifest *m);
/* Does dir show a pack that stopped before its manifest: the marker
 * STK_PACK_MARKER that a pack or writer keeps while it works, or a shard
 * still being written (*.stk.tmp)? The one check that the .stk reader (which
 * refuses such a directory) and the writers (which refuse to write there)
 * share. */
bool stk__pack_unfinished(const char *dir);

#endif
