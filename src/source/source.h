/*
 * source.h -- the source interface: what a dataset format must provide.
 *
 * A source knows its samples: how many, each one's label, a name for error
 * messages (path or key), and how to read its bytes. Every source is random
 * access. Reads come from many worker threads at once, so read() must be
 * thread-safe (pread on a shared descriptor, or open/read/close per sample).
 * Formats live one per file in src/source/, each exporting one open function
 * that fills a stk__source with its ops table, the way curl keeps its TLS
 * backends.
 */
#ifndef STK_SOURCE_H
#define STK_SOURCE_H

#include "internal.h"

/* Where a read puts its bytes: straight into the sample's slot (dst/cap, when
 * no transform runs), or into the thread's growable scratch. */
typedef struct stk__sink {
    uint8_t *dst;
    size_t cap;
    stk__scratch *grow; /* non-NULL: grow this instead of using dst */
} stk__sink;

/* Returns a buffer of at least n bytes for the read, or NULL with *rc set:
 * STK_ETOOBIG if n exceeds the budget, STK_ENOMEM. */
uint8_t *stk__sink_reserve(stk__sink *s, size_t n, int *rc);

typedef struct stk__source stk__source;

typedef struct stk__source_ops {
    const char *kind; /* "folder", "records", ... */
    /* Reads sample i (i < count): on success *data points at its bytes (inside
     * the sink's buffer), *len is their length and *label the label (-1 if
     * none). On failure returns STK_EIO / STK_EFORMAT / STK_ETOOBIG /
     * STK_ENOMEM with the reason (without the name) in err. Thread-safe. */
    int (*read)(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                int64_t *label, char *err, size_t errlen);
    /* Writes sample i's name (path or key) into buf. */
    void (*name)(const stk__source *s, uint64_t i, char *buf, size_t n);
    void (*close)(stk__source *s);
} stk__source_ops;

struct stk__source {
    const stk__source_ops *ops;
    void *impl;
    uint64_t count;
    uint64_t num_classes;
    /* Bytes of every sample when all are the same size (records), else 0. */
    size_t fixed_len;
    /* Bytes the source keeps in memory (its index), for the memory bound. */
    uint64_t index_bytes;
};

/* Parameters a source may need beyond the path. */
typedef struct stk__source_params {
    size_t record_bytes, header_bytes;
    unsigned label_bytes;
} stk__source_params;

/* Opens the dataset at path, choosing the source kind from what is there.
 * On failure writes a message naming the path and the reason into err. */
int stk__source_open(stk__source *s, const char *path, const stk__source_params *prm, char *err,
                     size_t errlen);
void stk__source_close(stk__source *s);

int stk__source_folder_open(stk__source *s, const char *path, char *err, size_t errlen);
int stk__source_records_open(stk__source *s, const char *path, const stk__source_params *prm,
                             char *err, size_t errlen);
/* Sources over a list of shard files (a directory's, a brace pattern's, or one
 * file). The paths are copied. dir: the dataset directory when a directory
 * was named (the .stk reader reads its manifest there), else NULL. */
int stk__source_stk_open(stk__source *s, const char *const *paths, size_t n, const char *dir,
                         char *err, size_t errlen);
int stk__source_tar_open(stk__source *s, const char *const *paths, size_t n, char *err,
                         size_t errlen);
/* CIFAR-10 (3073-byte records: label, 3072 bytes CHW) or CIFAR-100 (3074:
 * coarse label, fine label, 3072 bytes CHW) batch files; samples are the
 * 3072 image bytes as stored (CHW), the label is the (fine) label. */
int stk__source_cifar_open(stk__source *s, const char *const *paths, size_t n, char *err,
                           size_t errlen);

/* Reads a whole file into a sink (open, fstat, read, close): the shared helper
 * for sources whose samples are files. */
int stk__read_file(const char *path, stk__sink *sink, uint8_t **data, size_t *len, char *err,
                   size_t errlen);

#endif
