/*
 * stkformat.h -- the .stk shard format (docs/format.md): constants, little-
 * endian field access, header/footer parsing, and the shard writer used by
 * packing. The manifest is manifest.h's.
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

#endif
