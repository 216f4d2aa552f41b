/*
 * stkformat.h -- the .stk shard format (docs/format.md): constants, little-
 * endian field access, header/footer parsing, the shard writer used by
 * `stoker pack`, the manifest, and the helpers the readers share.
 *
 * Everything that parses bytes from a file here treats them as untrusted:
 * every length and offset is checked before use, and a failure returns
 * STK_EFORMAT with the reason in err.
 */
#ifndef STK_STKFORMAT_H
#define STK_STKFORMAT_H

#include "source/source.h"

#include <string.h>

#define STK_MAGIC             "\x89STK\r\n\x1a\n"
#define STK_FOOT_MAGIC        "STKEND\r\n"
#define STK_VERSION_MAJOR_FMT 1
#define STK_VERSION_MINOR_FMT 0
#define STK_HEADER_SIZE       64
#define STK_FOOTER_SIZE       64
#define STK_ENTRY_SIZE        40
#define STK_META_SIZE         8
#define STK_KEY_MAX           4096
#define STK_FLAG_ALIGNED      1u
#define STK_FLAG_HAS_META     2u
#define STK_MANIFEST          "stoker.manifest"
/* Kept in the output directory while `stoker pack` works. */
#define STK_PACK_MARKER ".stoker-pack-incomplete"

enum stk__payload_kind { STK_PAYLOAD_ENCODED = 0, STK_PAYLOAD_RESIZED = 1, STK_PAYLOAD_RAW = 2 };

static inline uint16_t stk__get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}
static inline uint32_t stk__get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t stk__get64(const uint8_t *p)
{
    return (uint64_t)stk__get32(p) | (uint64_t)stk__get32(p + 4) << 32;
}
static inline void stk__put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void stk__put32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}
static inline void stk__put64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

/* The decoded header of a shard. */
typedef struct stk__stk_header {
    uint16_t major, minor;
    uint32_t flags;
    uint32_t kind; /* enum stk__payload_kind */
    uint32_t align;
    uint32_t raw_h, raw_w, raw_c;
    uint32_t max_side, quality;
} stk__stk_header;

/* The decoded footer of a shard. */
typedef struct stk__stk_footer {
    uint64_t index_offset, count, keys_bytes;
    uint32_t entry_size, meta_size;
    uint64_t index_sum, num_classes;
} stk__stk_footer;

/* One decoded index entry. */
typedef struct stk__stk_entry {
    uint64_t offset;
    uint32_t length;
    uint32_t key_len;
    uint64_t key_off;
    int64_t label;
    uint64_t sum;
} stk__stk_entry;

void stk__stk_header_encode(uint8_t out[STK_HEADER_SIZE], const stk__stk_header *h);
/* Checks magic, version, flags and checksum. STK_EFORMAT with a reason. */
int stk__stk_header_decode(const uint8_t in[STK_HEADER_SIZE], stk__stk_header *h, char *err,
                           size_t errlen);
/* Checks magic and checksum, and the size equation against file_size. */
int stk__stk_footer_decode(const uint8_t in[STK_FOOTER_SIZE], uint64_t file_size,
                           stk__stk_footer *f, char *err, size_t errlen);
void stk__stk_entry_decode(const uint8_t *p, stk__stk_entry *e);
/* Checks every entry of an index region (already checksummed) against the
 * footer: bounds, order, key ranges, labels. Sets *max_label (-1 if none). */
int stk__stk_index_check(const uint8_t *region, const stk__stk_footer *f, const stk__stk_header *h,
                         int64_t *max_label, char *err, size_t errlen);
/* Parses a whole shard held in memory (the fuzz target's entry point, and
 * `verify`'s model): header, footer, index, and every payload checksum.
 * Returns STK_OK or STK_EFORMAT; *bad counts payloads whose checksum fails. */
int stk__stk_parse_buffer(const uint8_t *buf, size_t n, uint64_t *count, uint64_t *bad, char *err,
                          size_t errlen);

uint64_t stk__xxh3(const void *p, size_t n);
const char *stk__payload_kind_name(uint32_t kind);

/* ---- Writer ------------------------------------------------------------ */
typedef struct stk__stk_writer stk__stk_writer;

/* Creates PATH.tmp and writes the header. STK_EIO/STK_ENOMEM with reason. */
int stk__stkw_open(stk__stk_writer **out, const char *path, const stk__stk_header *h, char *err,
                   size_t errlen);
/* Appends one sample. key may be NULL (empty key). */
int stk__stkw_add(stk__stk_writer *w, const uint8_t *data, size_t len, int64_t label,
                  const char *key, uint32_t width, uint32_t height, char *err, size_t errlen);
/* Bytes the shard's payloads take so far (for shard rotation). */
uint64_t stk__stkw_payload_bytes(const stk__stk_writer *w);
uint64_t stk__stkw_count(const stk__stk_writer *w);
/* Writes index and footer, fsyncs, renames PATH.tmp to PATH, frees w.
 * *file_size gets the shard's size. On failure removes the tmp file. */
int stk__stkw_finish(stk__stk_writer *w, uint64_t num_classes, uint64_t *file_size, char *err,
                     size_t errlen);
/* Removes the tmp file and frees w. NULL is harmless. */
void stk__stkw_abort(stk__stk_writer *w);

/* ---- Manifest ---------------------------------------------------------- */
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

/* ---- Helpers shared by readers ---------------------------------------- */
/* pread exactly n bytes at off. STK_EIO with reason (short read = truncated). */
int stk__pread_full(int fd, void *buf, size_t n, uint64_t off, char *err, size_t errlen);
/* Writes exactly n bytes. */
int stk__write_full(int fd, const void *buf, size_t n);

/* ---- Describing an open dataset (stoker info / pack) ------------------ */
typedef struct stk__dataset_info {
    const char *format;           /* "stk", "tar", "cifar", "folder", "records" */
    const char *payload;          /* stk: payload kind name; else NULL */
    uint64_t shards;              /* files behind the source */
    uint64_t bytes;               /* their total size */
    uint32_t raw_h, raw_w, raw_c; /* stk raw kind */
    int64_t restart_indexed;      /* stk: samples with a restart index per the
                                     manifest; -1 when it does not say */
} stk__dataset_info;

/* Fills di for a source opened by stk__source_open. */
void stk__source_describe(const stk__source *s, stk__dataset_info *di);
/* Writes a short key for sample i: the .stk or tar key, CIFAR's
 * "file#record", or for other kinds the name with the leading "root/"
 * removed (a folder's path relative to its root). */
void stk__source_key(const stk__source *s, const char *root, uint64_t i, char *buf, size_t n);

/* Per-kind accessors (implemented in stk.c, tar.c, cifar.c). */
void stk__stk_describe(const stk__source *s, stk__dataset_info *di);
void stk__stk_key(const stk__source *s, uint64_t i, char *buf, size_t n);
const char *stk__stk_class_name(const stk__source *s, uint64_t c);
int stk__stk_meta(const stk__source *s, uint64_t i, uint32_t *w, uint32_t *h);
void stk__tar_describe(const stk__source *s, stk__dataset_info *di);
void stk__tar_key(const stk__source *s, uint64_t i, char *buf, size_t n);
void stk__cifar_describe(const stk__source *s, stk__dataset_info *di);
void stk__cifar_key(const stk__source *s, uint64_t i, char *buf, size_t n);

/* Tar parsing on a memory buffer (fuzz entry point): walks the headers and
 * groups samples, then checks every entry lies inside buf. Returns STK_OK,
 * STK_EFORMAT, or STK_EINVAL if an entry does not (a parser bug). */
int stk__tar_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                          size_t errlen);

#endif
