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

#define STK_MAGIC                "\x89STK\r\n\x1a\n"
#define STK_FOOT_MAGIC           "STKEND\r\n"
#define STK_VERSION_MAJOR_FMT    1 /* shards of kinds encoded, resized, raw */
#define STK_VERSION_MINOR_FMT    0
#define STK_VERSION_MAJOR_FIELDS 2 /* shards of kind fields (docs/format.md) */
#define STK_HEADER_SIZE          64
#define STK_FOOTER_SIZE          64
#define STK_ENTRY_SIZE           40
#define STK_META_SIZE            8
#define STK_KEY_MAX              4096
#define STK_FLAG_ALIGNED         1u
#define STK_FLAG_HAS_META        2u

enum stk__payload_kind {
    STK_PAYLOAD_ENCODED = 0,
    STK_PAYLOAD_RESIZED = 1,
    STK_PAYLOAD_RAW = 2,
    STK_PAYLOAD_FIELDS = 3 /* samples of named fields: version 2 shards */
};

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
    /* Bytes of the index region after the keys: a version 2 shard's field
     * table; 0 in version 1 (stk__stk_index_check checks it against the
     * header's version). */
    uint64_t tail_bytes;
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
/* Checks magic and checksum, and the size equation against file_size (the
 * index region may end with a field table: f->tail_bytes). */
int stk__stk_footer_decode(const uint8_t in[STK_FOOTER_SIZE], uint64_t file_size,
                           stk__stk_footer *f, char *err, size_t errlen);
void stk__stk_entry_decode(const uint8_t *p, stk__stk_entry *e);
/* Checks every entry of an index region (already checksummed) against the
 * footer: bounds, order, key ranges, labels, and a version 2 shard's field
 * table. Sets *max_label (-1 if none). */
int stk__stk_index_check(const uint8_t *region, const stk__stk_footer *f, const stk__stk_header *h,
                         int64_t *max_label, char *err, size_t errlen);
/* Parses a whole shard held in memory (the fuzz target's entry point, and
 * `verify`'s model): header, footer, index, and every payload checksum.
 * Returns STK_OK or STK_EFORMAT; *bad counts payloads whose checksum fails. */
int stk__stk_parse_buffer(const uint8_t *buf, size_t n, uint64_t *count, uint64_t *bad, char *err,
                          size_t errlen);

/* ---- Fields (payload kind fields, version 2) ---------------------------- */
#define STK_FNAME_MAX     255 /* bytes of a field's name */
#define STK_FTABLE_HEAD   8   /* u32 nfields, u32 0 */
#define STK_FTABLE_ENTRY  12  /* u16 name length, u8 kind, u8 0, u64 samples */
#define STK_FPAYLOAD_HEAD 8   /* u32 n, u32 0 */
#define STK_FPAYLOAD_REF  8   /* u32 field id, u32 length */

/* One field of a shard's field table (name points into the table). */
typedef struct stk__stk_fdesc {
    const uint8_t *name;
    size_t name_len;
    int kind;         /* enum stk_field_kind, AUTO when the writer did not know */
    uint64_t samples; /* samples of this shard that have it */
} stk__stk_fdesc;

/* Decodes and checks the field table of n bytes at p (untrusted): 1 to
 * STK__MAX_FIELDS fields, names of 1..STK_FNAME_MAX bytes, distinct, kinds
 * known, the table exactly n bytes. STK_EFORMAT with the reason. */
int stk__stk_ftable_decode(const uint8_t *p, size_t n, stk__stk_fdesc *out, size_t *nf, char *err,
                           size_t errlen);
/* Bytes stk__stk_ftable_encode writes for these fields. */
size_t stk__stk_ftable_size(const stk__stk_fdesc *f, size_t nf);
void stk__stk_ftable_encode(uint8_t *out, const stk__stk_fdesc *f, size_t nf);

/* One field of one sample's payload, as the payload's table gives it. */
typedef struct stk__stk_fref {
    uint32_t id; /* index into the shard's field table */
    uint32_t len;
    size_t off; /* bytes from the payload's start */
} stk__stk_fref;

/* Parses a fields payload of n bytes at p (untrusted): the table (ids below
 * nfields and strictly increasing, lengths that add up to exactly the bytes
 * after it). Fills out[0..*nout) (room for STK__MAX_FIELDS). STK_EFORMAT
 * with the reason; never reads outside p[0..n). */
int stk__stk_fpayload_parse(const uint8_t *p, size_t n, size_t nfields, stk__stk_fref *out,
                            size_t *nout, char *err, size_t errlen);

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
/* Sets the bytes written after the keys at finish (a version 2 shard's field
 * table; copied, replacing any earlier). STK_ENOMEM. */
int stk__stkw_set_tail(stk__stk_writer *w, const uint8_t *p, size_t n);
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
