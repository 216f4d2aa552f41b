/*
 * parquet.c -- Parquet files read in place: one file or a directory of
 * *.parquet files (sorted by name), the subset Hugging Face datasets and
 * DuckDB write (docs/formats.md, "Reading Parquet in place").
 *
 * A file is  "PAR1" | column chunks | FileMetaData | u32 footer length | "PAR1".
 * FileMetaData is a Thrift struct in the compact protocol: the schema (a
 * flattened tree, each element with its repetition), the row groups and in
 * each the column chunks (codec, offsets, sizes, value counts). A column
 * chunk is a run of pages: an optional dictionary page, then data pages (v1
 * or v2), each a Thrift PageHeader followed by its (compressed) bytes.
 *
 * Every leaf column that is not repeated is a field named by its dotted path
 * ("caption", "image.path"). Hugging Face's Image feature, a struct<bytes:
 * binary, path: string>, is also the field "image" (its bytes, an image):
 * so fields={"image": ..., "caption": ...} read HF datasets as they are. A
 * null value (or a null struct) is a field the sample lacks. Numbers are
 * given as decimal text (source.h's stk__field_ref).
 *
 * Random access: the row groups are indexed at open (first row of each, in
 * every file, and each column chunk's range), so row i's row group is a
 * binary search. Within a row group, a column chunk's page headers are
 * walked on its first use (one small read a page, bodies unread) into a
 * page index; a row then reads and decodes only the data page holding it
 * (after the chunk's dictionary page, when it has one). Page indexes and
 * decoded pages live in one cache shared by the worker threads, bounded
 * (PQ_CACHE_BYTES, least recently used first out; entries being read are
 * pinned by a count). A row group is also the source's shard, so the
 * shard-aware order reads a row group's rows together.
 *
 * Everything in the file is untrusted: the footer and every offset and size
 * are checked against the file, the Thrift parser against its buffer (and a
 * nesting limit), page headers against their chunk, levels and values
 * against their page, counts against the row group's. Errors name the file
 * and the offset (at open) or the row group and page (at read).
 *
 * The bytes come through pq_fetch(), the one place that reads a file. A
 * remote file (stk__source_parquet_open_remote) is read through the store's
 * transport (io/transport.h) by byte ranges, never downloaded whole: at the
 * open its first 4 bytes and its tail (the footer), many files in flight;
 * then, for a row group, its unit: the chunks of the columns reads need
 * (the selected fields and the label), near ranges merged, fetched by one
 * batched read at the first pq_fetch touching the row group while other
 * threads wait for it, and kept in a second LRU (PQ_UNIT_BYTES, counted in
 * the memory bound; a larger unit is fetched alone). pq_fetch copies from
 * the unit, so the page cache above works as for a local file. With
 * cache_dir each unit is also an entry of the disk cache (cache/cache.h),
 * read before the network. A remote file's size and version are those its
 * first read saw; a read that sees others (the file was replaced), or a
 * 404, fails that file's rows by name from then on (file_dead).
 */
#include "source/source.h"
#include "source/offtab.h"
#include "io/file.h"
#include "cache/cache.h"
#include "io/remote.h"
#include "io/transport.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <snappy-c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define PQ_KEEP_FDS     256          /* files whose descriptors stay open */
#define PQ_FOOTER_MAX   (64u << 20)  /* bytes of FileMetaData read */
#define PQ_PAGE_MAX     (512u << 20) /* bytes of one page, decompressed */
#define PQ_CHUNK_MAX    (1ull << 32) /* bytes of one column chunk as stored */
#define PQ_RG_ROWS_MAX  (1ull << 26) /* rows of one row group */
#define PQ_CACHE_BYTES  (64u << 20)  /* decoded column chunks kept */
#define PQ_SPARE_MAX    (8u << 20)   /* the read buffer kept between page loads */
#define PQ_THRIFT_DEPTH 24
#define PQ_MAX_COLUMNS  4096
#define PQ_MAX_RGS      (1u << 24)
#define PQ_MAX_PAGES    (1u << 20)   /* data pages of one column chunk */
#define PQ_UNIT_BYTES   (256u << 20) /* remote: row-group units kept in memory */
#define PQ_UNIT_GAP     (1u << 20)   /* remote: chunks this close are fetched as one range */
#define PQ_TAIL_READ    (64u << 10)  /* remote: a file's tail read at open (its footer) */
#define PQ_OPEN_BATCH   64           /* remote: files whose footers are read at once */
#define PQ_NO_RG        SIZE_MAX     /* pq_fetch outside any row group (the open) */

/* Physical types, encodings, codecs, page types (parquet.thrift). */
enum { T_BOOLEAN, T_INT32, T_INT64, T_INT96, T_FLOAT, T_DOUBLE, T_BYTE_ARRAY, T_FIXED };
enum {
    EN_PLAIN = 0,
    EN_PLAIN_DICT = 2,
    EN_RLE = 3,
    EN_BIT_PACKED = 4,
    EN_DELTA_BINARY = 5,
    EN_DELTA_LENGTH = 6,
    EN_DELTA_BYTES = 7,
    EN_RLE_DICT = 8,
    EN_BYTE_SPLIT = 9
};
enum { C_NONE = 0, C_SNAPPY = 1, C_GZIP = 2, C_ZSTD = 6 };
enum { P_DATA = 0, P_INDEX = 1, P_DICT = 2, P_DATA_V2 = 3 };
enum { R_REQUIRED = 0, R_OPTIONAL = 1, R_REPEATED = 2 };

/* A file as the reader sees it. */
typedef struct pqfile {
    char *path;
    char *name; /* for messages: the path, or a remote file's URL without secrets */
    int fd;     /* -1: opened for each read */
    uint64_t size;
    const uint8_t *mem; /* the fuzz entry point's bytes, instead of a file */
    /* A file in a store (pq->tp's object), else NULL; the version its first
     * read saw (ETag or Last-Modified; "" when the server gave none): every
     * later read must see the same size and version. */
    stk__tobj *obj;
    char version[128];
    /* While the open reads the footer: the file's first 4 bytes and its
     * tail (tail_len bytes at tail_at), fetched in batches of files. */
    uint8_t head[4];
    uint8_t *tail;
    uint64_t tail_at;
    size_t tail_len;
    /* Remote: not STK_OK once a read found the file gone or replaced
     * (file_dead; under pq.umu), with the message. */
    int dead_rc;
    char *dead_why;
} pqfile;

/* A remote file's row-group unit: the byte ranges of one row group's
 * column chunks that reads need (the selected fields' and the label's),
 * near ones merged, fetched together by the first read that touches the
 * row group and kept in a bounded LRU (pq.units). */
typedef struct pqrange {
    uint64_t off, len;
    uint8_t *p; /* into the unit's data */
} pqrange;

typedef struct pqunit {
    size_t g;
    uint32_t refs;
    bool ready;  /* fetched (or failed: rc) */
    bool linked; /* in the LRU list; a failed unit leaves it at once */
    int rc;
    char *why; /* rc's reason */
    struct pqunit *prev, *next;
    pqrange *r;
    size_t nr;
    uint8_t *data;
    size_t bytes;
} pqunit;

/* A leaf column (a schema leaf). */
typedef struct pqcol {
    char *path; /* dotted: "image.bytes" */
    int type, type_length;
    int max_def, max_rep;
    bool is_unsigned;
    int kind;        /* enum stk_field_kind */
    const char *bad; /* why it is not a field (NULL: it is) */
    /* A column inside one LIST (max_rep 1): the list's name is path[0,
     * list_len), the element's member path[elem_len..] ("" or ".bytes");
     * a level entry holds an element when its definition level reaches
     * elem_def (below it: a null or empty list). */
    bool list;
    size_t list_len, elem_len;
    int elem_def;
} pqcol;

/* A column chunk as the index keeps it. */
typedef struct pqchunk {
    uint64_t start, size; /* the stored bytes: dictionary page (if any) onward */
    uint64_t values;      /* num_values */
    int codec;
} pqchunk;

typedef struct pqrg {
    uint32_t file;
    uint32_t index; /* within its file */
    uint64_t first; /* global row */
    uint64_t rows;
    uint64_t file_first; /* first row within its file */
} pqrg;

/* A field: a column, under a name. A list column's fields are its
 * elements: "images[3]" (elem 3), resolved on demand (pq_field_named); the
 * description lists each list column once as "images[]" (elem PQ_ELEM_ANY),
 * which no sample has. alias: HF's Image struct under its own name (the
 * bytes of "image.bytes" as "image"). */
#define PQ_ELEM_NONE (-1)
#define PQ_ELEM_ANY  (-2)
#define PQ_ELEM_MAX  (1 << 30)
typedef struct pqfield {
    uint32_t col;
    int32_t elem;
    bool alias;
} pqfield;

/* A decoded column chunk: row r's value is data[off[r], off[r + 1]), or,
 * when len is set, len[r] bytes at data + off[r] (a PLAIN byte-array page
 * kept as it decompressed: see decode_chunk); null when isnull[r]. Numbers
 * are decimal text. Read values through dec_ptr and dec_len. */
typedef struct pqdec {
    uint64_t key;
    uint32_t refs;
    struct pqdec *prev, *next;
    uint64_t rows;
    uint64_t *off;
    uint32_t *len;
    uint8_t *isnull;
    uint8_t *data;
    size_t dlen, dcap;
    size_t bytes;
    /* A list column's chunk (decoded whole): row r's elements are values
     * [rowstart[r], rowstart[r + 1]); null and empty lists have none. */
    uint64_t *rowstart;
    uint64_t records, vcap; /* rowstart's records so far, and its capacity */
    size_t ocap, ncap;      /* off's and isnull's capacities */
    int rc;                 /* not STK_OK: the chunk does not decode (remembered, so the
                               row group's other rows fail without decoding it again) */
    char *why;              /* then the message */
    /* A chunk's page index (an entry of its own in the cache): where each
     * data page lies, its first row and rows; the dictionary page. */
    struct pqpage *pages;
    uint32_t npages;
    uint64_t dict_off;
    size_t dict_len; /* header and body; 0: none */
} pqdec;

typedef struct pqpage {
    uint64_t off, first;
    size_t len; /* header and body */
    uint64_t rows;
} pqpage;

/* Row r's value in a decoded chunk (not null). */
static inline const uint8_t *dec_ptr(const pqdec *e, uint64_t r)
{
    return e->data + e->off[r];
}

static inline size_t dec_len(const pqdec *e, uint64_t r)
{
    return e->len ? e->len[r] : (size_t)(e->off[r + 1] - e->off[r]);
}

typedef struct pq {
    pqfile *files;
    size_t nfiles;
    pqcol *cols;
    size_t ncols;
    pqrg *rgs;
    size_t nrgs;
    pqchunk *chunks; /* nrgs * ncols */
    pqfield fields[STK__MAX_FIELDS];
    size_t nfields;
    uint64_t total_bytes;
    uint64_t warned; /* the last warning's hash (pq_warn), 0: none yet */
    /* each_value's pins of the row before (page index and page of each
     * field): kept until the next row's are taken, so that stoker verify,
     * which asks row after row, decodes a chunk once and not once a row
     * (a list column's chunk is decoded whole, and a cache smaller than it
     * would drop it between two rows). Released at close. */
    pqdec *held[2 * STK__MAX_FIELDS];
    /* Columns the first file's "huggingface" metadata calls Audio, Video or
     * Pdf (hf_media): structs of bytes and path like an Image, but no image.
     * Names past the table's size are typed as images, as without it. */
    char hf_other[16][64];
    unsigned nhf_other;
    int payload; /* field a read without fields gives, or -1 */
    int label;   /* column of labels, or -1 */
    uint64_t mask;
    bool selected;
    uint64_t rows_max; /* PQ_RG_ROWS_MAX, smaller for the fuzz entry point */
    uint64_t page_max; /* PQ_PAGE_MAX, the same */
    /* The cache of decoded chunks (lock order: alone; held only to look up,
     * insert, pin and unpin, never while reading or decoding). */
    pthread_mutex_t mu;
    bool mu_ok;
    pqdec *head, *tail;
    size_t cached, budget;
    /* A page's stored bytes are read into a buffer that is kept for the
     * next page load (under mu; at most PQ_SPARE_MAX, counted in
     * index_bytes): a fresh one of a few MB would be page-faulted in
     * each time, which costs more than its decompression. */
    uint8_t *spare;
    size_t spare_cap;
    /* Remote files: the store's transport (NULL: local files), and the
     * units (lock order: umu alone, never with mu; held only to look up,
     * insert, pin and unpin units, never while fetching). ucached counts
     * the units' bytes, loading ones included; a unit is admitted when it
     * fits ubudget after evicting idle ones, or when no other is held (a
     * unit larger than the budget is fetched alone). */
    stk__transport *tp;
    pthread_mutex_t umu;
    pthread_cond_t ucv;
    bool u_ok;
    pqunit *uhead, *utail;
    size_t ucached, ubudget;
    const _Atomic bool *cancel;
    /* cache_dir's cache (the source's s->cache, which closes it), or NULL:
     * each unit is also an entry there, read from it before the network. */
    stk__cache *cache;
} pq;

static void hf_media(pq *d, const uint8_t *js, size_t n);

/* ---- Reading bytes --------------------------------------------------------------- */

size_t stk__parquet_unit_bytes = PQ_UNIT_BYTES;

static int fetch_remote(pq *d, const pqfile *f, size_t g, void *buf, size_t n, uint64_t off,
                        char *err, size_t errlen);

/* Reads n bytes at off of f, for row group g (PQ_NO_RG: the open): the one
 * place the reader touches a file. A remote file's bytes come from g's
 * unit (fetch_remote). */
static int pq_fetch(pq *d, const pqfile *f, size_t g, void *buf, size_t n, uint64_t off, char *err,
                    size_t errlen)
{
    if (off > f->size || n > f->size - off) {
        stk__fmt(err, errlen,
                 "%zu bytes at offset %" PRIu64 " run past the end of the %" PRIu64 "-byte file", n,
                 off, f->size);
        return STK_EFORMAT;
    }
    if (f->mem) {
        memcpy(buf, f->mem + off, n);
        return STK_OK;
    }
    if (f->obj)
        return fetch_remote(d, f, g, buf, n, off, err, errlen);
    return stk__pread_at(f->fd, f->path, buf, n, off, err, errlen);
}

/* ---- Thrift compact protocol ---------------------------------------------------- */

typedef struct tr {
    const uint8_t *p, *end, *base;
    bool bad;
    const char *why;
} tr;

static void tr_fail(tr *t, const char *why)
{
    if (!t->bad)
        t->why = why;
    t->bad = true;
    t->p = t->end;
}

static uint64_t tr_varint(tr *t)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (t->p >= t->end) {
            tr_fail(t, "ends inside a number");
            return 0;
        }
        uint8_t b = *t->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    tr_fail(t, "holds a number longer than 64 bits");
    return 0;
}

static int64_t tr_zz(tr *t)
{
    uint64_t u = tr_varint(t);
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static int32_t tr_i32(tr *t)
{
    int64_t v = tr_zz(t);
    if (v < INT32_MIN || v > INT32_MAX) {
        tr_fail(t, "holds an i32 out of range");
        return 0;
    }
    return (int32_t)v;
}

static uint8_t tr_byte(tr *t)
{
    if (t->p >= t->end) {
        tr_fail(t, "ends early");
        return 0;
    }
    return *t->p++;
}

static void tr_bin(tr *t, const uint8_t **s, size_t *n)
{
    uint64_t len = tr_varint(t);
    if (len > (uint64_t)(t->end - t->p)) {
        tr_fail(t, "holds a string longer than its buffer");
        *s = NULL;
        *n = 0;
        return;
    }
    *s = t->p;
    *n = (size_t)len;
    t->p += len;
}

/* A list's header: its element type and size. */
static uint64_t tr_list(tr *t, int *etype)
{
    uint8_t b = tr_byte(t);
    uint64_t n = b >> 4;
    *etype = b & 15;
    if (n == 15)
        n = tr_varint(t);
    /* Every element takes at least one byte (bools in lists too). */
    if (n > (uint64_t)(t->end - t->p))
        tr_fail(t, "holds a list longer than its buffer");
    return t->bad ? 0 : n;
}

/* The next field's id and type; false at the struct's end (or an error). */
static bool tr_field(tr *t, int16_t *last, int16_t *id, int *type)
{
    uint8_t b = tr_byte(t);
    if (t->bad || b == 0)
        return false;
    *type = b & 15;
    int delta = b >> 4;
    if (delta) {
        *id = (int16_t)(*last + delta);
    } else {
        int64_t v = tr_zz(t);
        if (v < INT16_MIN || v > INT16_MAX) {
            tr_fail(t, "holds a field id out of range");
            return false;
        }
        *id = (int16_t)v;
    }
    *last = *id;
    return !t->bad;
}

static void tr_skip(tr *t, int type, int depth);

static void tr_skip_struct(tr *t, int depth)
{
    if (depth > PQ_THRIFT_DEPTH) {
        tr_fail(t, "nests structures too deeply");
        return;
    }
    int16_t last = 0, id;
    int type;
    while (tr_field(t, &last, &id, &type))
        tr_skip(t, type, depth + 1);
}

static void tr_skip(tr *t, int type, int depth)
{
    const uint8_t *s;
    size_t n;
    int et;
    switch (type) {
    case 1: /* BOOLEAN_TRUE */
    case 2: /* BOOLEAN_FALSE */ return;
    case 3: tr_byte(t); return;
    case 4:
    case 5:
    case 6: tr_varint(t); return;
    case 7:
        if (t->end - t->p < 8)
            tr_fail(t, "ends inside a double");
        else
            t->p += 8;
        return;
    case 8: tr_bin(t, &s, &n); return;
    case 9:
    case 10: {
        uint64_t c = tr_list(t, &et);
        if (depth > PQ_THRIFT_DEPTH) {
            tr_fail(t, "nests structures too deeply");
            return;
        }
        for (uint64_t k = 0; k < c && !t->bad; k++) {
            if (et == 1 || et == 2)
                tr_byte(t); /* a bool element is a byte */
            else
                tr_skip(t, et, depth + 1);
        }
        return;
    }
    case 11: {
        uint64_t c = tr_varint(t);
        if (c > (uint64_t)(t->end - t->p)) {
            tr_fail(t, "holds a map longer than its buffer");
            return;
        }
        if (!c)
            return;
        uint8_t kv = tr_byte(t);
        for (uint64_t k = 0; k < c && !t->bad; k++) {
            tr_skip(t, kv >> 4, depth + 1);
            tr_skip(t, kv & 15, depth + 1);
        }
        return;
    }
    case 12: tr_skip_struct(t, depth + 1); return;
    default: tr_fail(t, "holds an unknown type");
    }
}

static bool tr_bool(tr *t, int type)
{
    if (type == 1 || type == 2)
        return type == 1;
    tr_fail(t, "holds a field of the wrong type");
    return false;
}

static int32_t tr_want_i32(tr *t, int type)
{
    if (type != 5) {
        tr_fail(t, "holds a field of the wrong type (wanted i32)");
        return 0;
    }
    return tr_i32(t);
}

static int64_t tr_want_i64(tr *t, int type)
{
    if (type != 6 && type != 5) {
        tr_fail(t, "holds a field of the wrong type (wanted i64)");
        return 0;
    }
    return tr_zz(t);
}

/* ---- FileMetaData ------------------------------------------------------------------ */

typedef struct pqschema {
    int type, type_length, rep, children, converted;
    int logical;    /* LogicalType's set member id, or 0 */
    int int_signed; /* LogicalType INTEGER's isSigned: 1, 0, or -1 unknown */
    const uint8_t *name;
    size_t name_len;
} pqschema;

typedef struct pqmeta_chunk {
    bool has_meta, file_path;
    int type, codec;
    int64_t values, comp, data_off, dict_off;
} pqmeta_chunk;

typedef struct pqmeta {
    pqschema *schema;
    size_t nschema;
    int64_t num_rows;
    size_t nrgs;
    int64_t *rg_rows;
    pqmeta_chunk *chunks; /* nrgs * ncols_seen */
    size_t ncols_seen;
    /* The "huggingface" key's value (the datasets library's features, as
     * JSON), pointing into the footer's buffer; NULL when absent. */
    const uint8_t *hf;
    size_t hf_len;
} pqmeta;

static void meta_free(pqmeta *m)
{
    stk__free(m->schema);
    stk__free(m->rg_rows);
    stk__free(m->chunks);
    memset(m, 0, sizeof *m);
}

static void parse_logical(tr *t, pqschema *e)
{
    int16_t last = 0, id;
    int type;
    while (tr_field(t, &last, &id, &type)) {
        if (type != 12) {
            tr_fail(t, "holds a LogicalType member that is not a struct");
            return;
        }
        e->logical = id;
        if (id == 10) { /* IntType { 1: i8 bitWidth, 2: bool isSigned } */
            int16_t l2 = 0, i2;
            int t2;
            while (tr_field(t, &l2, &i2, &t2)) {
                if (i2 == 2)
                    e->int_signed = tr_bool(t, t2);
                else
                    tr_skip(t, t2, 2);
            }
        } else {
            tr_skip_struct(t, 2);
        }
    }
}

static void parse_schema_elem(tr *t, pqschema *e)
{
    int16_t last = 0, id;
    int type;
    *e = (pqschema){.type = -1, .rep = -1, .converted = -1, .int_signed = -1};
    while (tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1: e->type = tr_want_i32(t, type); break;
        case 2: e->type_length = tr_want_i32(t, type); break;
        case 3: e->rep = tr_want_i32(t, type); break;
        case 4:
            if (type != 8)
                tr_fail(t, "holds a schema name that is not a string");
            else
                tr_bin(t, &e->name, &e->name_len);
            break;
        case 5: e->children = tr_want_i32(t, type); break;
        case 6: e->converted = tr_want_i32(t, type); break;
        case 10:
            if (type == 12)
                parse_logical(t, e);
            else
                tr_skip(t, type, 1);
            break;
        default: tr_skip(t, type, 1);
        }
    }
}

static void parse_col_meta(tr *t, pqmeta_chunk *c)
{
    int16_t last = 0, id;
    int type;
    c->has_meta = true;
    c->dict_off = -1;
    c->data_off = -1;
    while (tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1: c->type = tr_want_i32(t, type); break;
        case 4: c->codec = tr_want_i32(t, type); break;
        case 5: c->values = tr_want_i64(t, type); break;
        case 7: c->comp = tr_want_i64(t, type); break;
        case 9: c->data_off = tr_want_i64(t, type); break;
        case 11: c->dict_off = tr_want_i64(t, type); break;
        default: tr_skip(t, type, 3);
        }
    }
}

static void parse_chunk(tr *t, pqmeta_chunk *c)
{
    int16_t last = 0, id;
    int type;
    while (tr_field(t, &last, &id, &type)) {
        if (id == 1 && type == 8) {
            c->file_path = true;
            tr_skip(t, type, 2);
        } else if (id == 3 && type == 12) {
            parse_col_meta(t, c);
        } else {
            tr_skip(t, type, 2);
        }
    }
}

/* FileMetaData's key_value_metadata: keeps the "huggingface" value. */
static void parse_kv(tr *t, pqmeta *m)
{
    int et;
    uint64_t n = tr_list(t, &et);
    if (!t->bad && et != 12)
        tr_fail(t, "has a key-value list of something other than structs");
    for (uint64_t k = 0; k < n && !t->bad; k++) {
        int16_t last = 0, id;
        int type;
        const uint8_t *key = NULL, *val = NULL;
        size_t kn = 0, vn = 0;
        while (tr_field(t, &last, &id, &type)) {
            if (id == 1 && type == 8)
                tr_bin(t, &key, &kn);
            else if (id == 2 && type == 8)
                tr_bin(t, &val, &vn);
            else
                tr_skip(t, type, 2);
        }
        if (!t->bad && key && val && kn == 11 && !memcmp(key, "huggingface", 11)) {
            m->hf = val;
            m->hf_len = vn;
        }
    }
}

/* Parses FileMetaData. ncols: leaves the schema has (known after field 2,
 * which writers put first; a row group before the schema is refused). */
static int parse_meta(tr *t, pqmeta *m, size_t (*count_leaves)(const pqmeta *), char *why,
                      size_t wn)
{
    int16_t last = 0, id;
    int type, et;
    bool have_rows = false;
    while (tr_field(t, &last, &id, &type)) {
        if (id == 2 && type == 9) {
            uint64_t n = tr_list(t, &et);
            if (t->bad || et != 12 || !n || n > 4 * PQ_MAX_COLUMNS || m->schema) {
                tr_fail(t, "has a bad schema list");
                break;
            }
            if (!(m->schema = stk__calloc(n, sizeof *m->schema)))
                return STK_ENOMEM;
            m->nschema = n;
            for (uint64_t k = 0; k < n && !t->bad; k++)
                parse_schema_elem(t, &m->schema[k]);
            if (!t->bad)
                m->ncols_seen = count_leaves(m);
        } else if (id == 3) {
            m->num_rows = tr_want_i64(t, type);
            have_rows = true;
        } else if (id == 5 && type == 9) {
            parse_kv(t, m);
        } else if (id == 4 && type == 9) {
            uint64_t n = tr_list(t, &et);
            if (t->bad || et != 12 || n > PQ_MAX_RGS || !m->schema || m->rg_rows) {
                tr_fail(t, "has a bad row group list (or one before the schema)");
                break;
            }
            size_t nc = m->ncols_seen;
            if (!(m->rg_rows = stk__calloc(n ? n : 1, sizeof *m->rg_rows)) ||
                !(m->chunks = stk__calloc(n && nc ? n * nc : 1, sizeof *m->chunks)))
                return STK_ENOMEM;
            m->nrgs = n;
            for (uint64_t g = 0; g < n && !t->bad; g++) {
                int16_t l2 = 0, i2;
                int t2;
                bool rows = false;
                m->rg_rows[g] = -1;
                while (tr_field(t, &l2, &i2, &t2)) {
                    if (i2 == 1 && t2 == 9) {
                        uint64_t nch = tr_list(t, &et);
                        if (t->bad || et != 12 || nch != nc) {
                            if (!t->bad) {
                                stk__fmt(why, wn,
                                         "row group %" PRIu64 " has %" PRIu64
                                         " column chunks; the schema has %zu columns",
                                         g, nch, nc);
                                return STK_EFORMAT;
                            }
                            break;
                        }
                        for (uint64_t c = 0; c < nch && !t->bad; c++)
                            parse_chunk(t, &m->chunks[g * nc + c]);
                    } else if (i2 == 3) {
                        m->rg_rows[g] = tr_want_i64(t, t2);
                        rows = true;
                    } else {
                        tr_skip(t, t2, 2);
                    }
                }
                if (!t->bad && !rows)
                    tr_fail(t, "has a row group without num_rows");
            }
        } else {
            tr_skip(t, type, 1);
        }
    }
    if (t->bad) {
        stk__fmt(why, wn, "the footer's metadata %s (at byte %td of it)", t->why, t->p - t->base);
        return STK_EFORMAT;
    }
    if (!m->schema || !have_rows || !m->rg_rows) {
        stk__fmt(why, wn, "the footer's metadata lacks its schema, num_rows or row groups");
        return STK_EFORMAT;
    }
    return STK_OK;
}

/* ---- The schema tree ------------------------------------------------------------- */

typedef struct walk {
    const pqmeta *m;
    size_t at;
    pqcol *cols;
    size_t ncols;
    int rc;
    char *why;
    size_t wn;
} walk;

static size_t leaves_of(const pqmeta *m)
{
    size_t n = 0;
    for (size_t k = 1; k < m->nschema; k++)
        n += m->schema[k].children <= 0;
    return n;
}

/* The kind a leaf's values are given as, or why it is no field. */
static void col_kind(pqcol *c, const pqschema *e)
{
    c->kind = STK_FIELD_AUTO;
    if (c->max_rep > 0 && !c->list) {
        c->bad = "a column repeated more than once (a list of lists)";
        return;
    }
    switch (e->type) {
    case T_BOOLEAN:
    case T_INT32:
    case T_INT64:
        /* DECIMAL (converted 5, logical 5) scales the integer: not read. */
        if (e->converted == 5 || e->logical == 5)
            c->bad = "a DECIMAL column";
        c->kind = STK_FIELD_INT;
        c->is_unsigned = (e->converted >= 11 && e->converted <= 14) || e->int_signed == 0;
        return;
    case T_FLOAT:
    case T_DOUBLE: c->kind = STK_FIELD_FLOAT; return;
    case T_BYTE_ARRAY:
    case T_FIXED:
        if (e->type == T_FIXED && (e->type_length <= 0 || e->type_length > (1 << 20)))
            c->bad = "a FIXED_LEN_BYTE_ARRAY column without a length";
        if (e->converted == 0 || e->logical == 1 || e->converted == 16 || e->logical == 4)
            c->kind = STK_FIELD_TEXT; /* UTF8 / STRING, ENUM */
        else if (e->converted == 19 || e->logical == 12)
            c->kind = STK_FIELD_JSON;
        else if (e->converted == 5 || e->logical == 5)
            c->bad = "a DECIMAL column";
        return;
    case T_INT96: c->bad = "an INT96 (legacy timestamp) column"; return;
    default: c->bad = "a column of an unknown physical type"; return;
    }
}

/* Where a column lies in a list (pqcol.list...): state 0 outside one, 1
 * below the repeated group whose one child is the element (the 3-level
 * LIST: NAME.list.element), 2 at or below the element. */
typedef struct lctx {
    int state;
    bool nested;
    size_t list_len, elem_len;
    int elem_def;
} lctx;

/* The LIST encodings (parquet-format LogicalTypes.md, backward
 * compatibility): a repeated group of one child is the 3-level form (its
 * child is the element) unless it is named "array" or "<list>_tuple"
 * (2-level, legacy writers); a repeated leaf or a repeated group of several
 * children is the element itself. */
static lctx list_enter(const lctx *up, const pqschema *e, const char *prefix, const char *path,
                       int def)
{
    lctx h = *up;
    if (e->rep == R_REPEATED) {
        if (up->state) {
            h.nested = true;
            return h;
        }
        const char *parent = strrchr(prefix, '.');
        parent = parent ? parent + 1 : prefix;
        size_t pl = strlen(parent);
        bool tuple = e->name_len == pl + 6 && !memcmp(e->name, parent, pl) &&
                     !memcmp(e->name + pl, "_tuple", 6);
        bool array = e->name_len == 5 && !memcmp(e->name, "array", 5);
        h.list_len = *prefix ? strlen(prefix) : strlen(path);
        h.elem_def = def;
        if (e->children == 1 && !tuple && !array) {
            h.state = 1;
        } else {
            h.state = 2;
            h.elem_len = strlen(path);
        }
    } else if (up->state == 1) {
        h.state = 2;
        h.elem_len = strlen(path);
    }
    return h;
}

static void walk_node(walk *w, const char *prefix, int def, int rep, int depth, const lctx *lc)
{
    if (w->rc)
        return;
    if (w->at >= w->m->nschema || depth > 32) {
        stk__fmt(w->why, w->wn, "the schema's tree is malformed (children past its end)");
        w->rc = STK_EFORMAT;
        return;
    }
    const pqschema *e = &w->m->schema[w->at++];
    char path[1024];
    if (!e->name || !e->name_len || memchr(e->name, 0, e->name_len)) {
        stk__fmt(w->why, w->wn, "schema element %zu has no name", w->at - 1);
        w->rc = STK_EFORMAT;
        return;
    }
    stk__fmt(path, sizeof path, "%s%s%.*s", prefix, *prefix ? "." : "", (int)e->name_len,
             (const char *)e->name);
    if (e->rep == R_OPTIONAL)
        def++;
    else if (e->rep == R_REPEATED)
        def++, rep++;
    else if (e->rep != R_REQUIRED) {
        stk__fmt(w->why, w->wn, "schema element '%s' has repetition %d", path, e->rep);
        w->rc = STK_EFORMAT;
        return;
    }
    lctx here = list_enter(lc, e, prefix, path, def);
    if (e->children > 0) {
        for (int k = 0; k < e->children && !w->rc; k++)
            walk_node(w, path, def, rep, depth + 1, &here);
        return;
    }
    if (w->ncols >= w->m->ncols_seen) {
        stk__fmt(w->why, w->wn, "the schema's tree is malformed");
        w->rc = STK_EFORMAT;
        return;
    }
    pqcol *c = &w->cols[w->ncols++];
    if (!(c->path = stk__strdup(path))) {
        w->rc = STK_ENOMEM;
        return;
    }
    c->type = e->type;
    c->type_length = e->type_length;
    c->max_def = def;
    c->max_rep = rep;
    if (rep == 1 && here.state == 2 && !here.nested) {
        c->list = true;
        c->list_len = here.list_len;
        c->elem_len = here.elem_len;
        c->elem_def = here.elem_def;
    }
    col_kind(c, e);
}

static int build_columns(const pqmeta *m, pqcol **cols, size_t *ncols, char *why, size_t wn)
{
    size_t nc = m->ncols_seen;
    if (!nc || nc > PQ_MAX_COLUMNS || m->schema[0].children <= 0) {
        stk__fmt(why, wn, "the schema has %zu columns", nc);
        return STK_EFORMAT;
    }
    walk w = {m, 1, stk__calloc(nc, sizeof(pqcol)), 0, STK_OK, why, wn};
    if (!w.cols)
        return STK_ENOMEM;
    for (int k = 0; k < m->schema[0].children && !w.rc; k++)
        walk_node(&w, "", 0, 0, 0, &(lctx){0});
    if (!w.rc && (w.at != m->nschema || w.ncols != nc)) {
        stk__fmt(why, wn, "the schema's tree does not cover its %zu elements", m->nschema);
        w.rc = STK_EFORMAT;
    }
    *cols = w.cols;
    *ncols = w.ncols;
    return w.rc;
}

static void free_cols(pqcol *c, size_t n)
{
    for (size_t k = 0; c && k < n; k++)
        stk__free(c[k].path);
    stk__free(c);
}

/* ---- Levels and values ----------------------------------------------------------- */

/* The RLE / bit-packed hybrid (levels and dictionary indices). */
typedef struct rle {
    const uint8_t *p, *end;
    unsigned bw;
    uint64_t left; /* values left in the current run */
    bool packed;
    uint32_t value;    /* an RLE run's */
    const uint8_t *pk; /* a bit-packed run's bytes */
    uint64_t bit;
} rle;

static int rle_next(rle *r, uint32_t *v)
{
    while (!r->left) {
        tr t = {r->p, r->end, r->p, false, NULL};
        uint64_t h = tr_varint(&t);
        if (t.bad)
            return -1;
        r->p = t.p;
        if (h & 1) {
            uint64_t groups = h >> 1, avail = (uint64_t)(r->end - r->p);
            if (groups > (1ull << 32))
                return -1;
            uint64_t bytes = groups * r->bw;
            /* The last run may stop where its page does: count the values
             * its bytes hold. */
            if (bytes > avail) {
                bytes = avail;
                r->left = avail * 8 / r->bw;
            } else {
                r->left = groups * 8;
            }
            r->packed = true;
            r->pk = r->p;
            r->bit = 0;
            r->p += bytes;
        } else {
            unsigned nb = (r->bw + 7) / 8;
            if ((size_t)(r->end - r->p) < nb)
                return -1;
            uint32_t val = 0;
            for (unsigned k = 0; k < nb; k++)
                val |= (uint32_t)r->p[k] << (8 * k);
            r->p += nb;
            r->left = h >> 1;
            r->packed = false;
            r->value = val;
        }
    }
    r->left--;
    if (!r->packed) {
        *v = r->value;
        return 0;
    }
    uint32_t val = 0;
    for (unsigned k = 0; k < r->bw; k++, r->bit++)
        val |= (uint32_t)((r->pk[r->bit >> 3] >> (r->bit & 7)) & 1) << k;
    *v = val;
    return 0;
}

static unsigned bits_for(int max)
{
    unsigned b = 0;
    while (max >> b)
        b++;
    return b;
}

/* DELTA_BINARY_PACKED: a stream of int64s. */
typedef struct dbp {
    const uint8_t *p, *end;
    uint64_t block, minis, per_mini, total, done;
    int64_t last, min_delta;
    uint64_t mini, in_mini;
    uint8_t widths[256];
    const uint8_t *mp;
    uint64_t bit;
    bool first;
} dbp;

static int dbp_init(dbp *d, const uint8_t *p, const uint8_t *end)
{
    tr t = {p, end, p, false, NULL};
    memset(d, 0, sizeof *d);
    d->block = tr_varint(&t);
    d->minis = tr_varint(&t);
    d->total = tr_varint(&t);
    d->last = tr_zz(&t);
    if (t.bad || !d->minis || d->minis > 256 || !d->block || d->block % 128 ||
        d->block > (1u << 20) || (d->block / d->minis) % 32)
        return -1;
    d->per_mini = d->block / d->minis;
    d->p = t.p;
    d->end = end;
    d->first = true;
    d->mini = d->minis; /* a block header comes first */
    d->mp = NULL;
    return 0;
}

/* The next value; -1 past the end or on bad input. Miniblocks are read
 * when their first value is: a last block's unused miniblocks have no
 * bytes (their widths are arbitrary). */
static int dbp_next(dbp *d, int64_t *v)
{
    if (d->done >= d->total)
        return -1;
    d->done++;
    if (d->first) {
        d->first = false;
        *v = d->last;
        return 0;
    }
    if (d->in_mini == d->per_mini) {
        d->mini++;
        d->in_mini = 0;
        d->mp = NULL;
    }
    if (d->mini >= d->minis) {
        tr t = {d->p, d->end, d->p, false, NULL};
        d->min_delta = tr_zz(&t);
        if (t.bad || (size_t)(d->end - t.p) < d->minis)
            return -1;
        memcpy(d->widths, t.p, d->minis);
        d->p = t.p + d->minis;
        d->mini = 0;
        d->in_mini = 0;
        d->mp = NULL;
    }
    if (!d->mp) {
        unsigned w = d->widths[d->mini];
        if (w > 64 || d->per_mini * w / 8 > (uint64_t)(d->end - d->p))
            return -1;
        d->mp = d->p;
        d->bit = 0;
        d->p += d->per_mini * w / 8;
    }
    unsigned w = d->widths[d->mini];
    uint64_t u = 0;
    for (unsigned k = 0; k < w; k++, d->bit++)
        u |= (uint64_t)((d->mp[d->bit >> 3] >> (d->bit & 7)) & 1) << k;
    d->in_mini++;
    d->last = (int64_t)((uint64_t)d->last + (uint64_t)d->min_delta + u);
    *v = d->last;
    return 0;
}

/* Where the stream's bytes end (after all its values were read). */
static const uint8_t *dbp_end(const dbp *d)
{
    return d->p;
}

/* Appends bytes to a decoded chunk's data. */
static int dec_append(pqdec *o, const void *v, size_t n)
{
    if (n > o->dcap - o->dlen) {
        if (o->dlen + n > PQ_CHUNK_MAX * 4)
            return STK_ETOOBIG;
        int rc = stk__grow((void **)&o->data, &o->dcap, o->dlen + n, 1);
        if (rc)
            return rc;
    }
    if (n)
        memcpy(o->data + o->dlen, v, n);
    o->dlen += n;
    return STK_OK;
}

/* A value as the field gives it: numbers as decimal text. */
static int dec_value(pqdec *o, const pqcol *c, const uint8_t *v, size_t n)
{
    char text[48];
    int tl;
    switch (c->type) {
    case T_INT32: {
        uint32_t u = stk__le32(v);
        tl = c->is_unsigned ? snprintf(text, sizeof text, "%" PRIu32, u)
                            : snprintf(text, sizeof text, "%" PRId32, (int32_t)u);
        break;
    }
    case T_INT64: {
        uint64_t u = (uint64_t)stk__le32(v) | (uint64_t)stk__le32(v + 4) << 32;
        tl = c->is_unsigned ? snprintf(text, sizeof text, "%" PRIu64, u)
                            : snprintf(text, sizeof text, "%" PRId64, (int64_t)u);
        break;
    }
    case T_FLOAT: {
        uint32_t u = stk__le32(v);
        float f;
        memcpy(&f, &u, 4);
        tl = snprintf(text, sizeof text, "%.9g", (double)f);
        break;
    }
    case T_DOUBLE: {
        uint64_t u = (uint64_t)stk__le32(v) | (uint64_t)stk__le32(v + 4) << 32;
        double f;
        memcpy(&f, &u, 8);
        tl = snprintf(text, sizeof text, "%.17g", f);
        break;
    }
    case T_BOOLEAN: tl = snprintf(text, sizeof text, "%d", v[0] ? 1 : 0); break;
    default: return dec_append(o, v, n);
    }
    return dec_append(o, text, (size_t)tl);
}

/* The fixed size of a PLAIN value (0: BYTE_ARRAY, length-prefixed). */
static size_t plain_size(const pqcol *c)
{
    switch (c->type) {
    case T_INT32:
    case T_FLOAT: return 4;
    case T_INT64:
    case T_DOUBLE: return 8;
    case T_FIXED: return (size_t)c->type_length;
    default: return 0;
    }
}

/* A dictionary: its values, decoded as a chunk's are. */
typedef struct pqdict {
    pqdec v; /* rows = entries */
    bool have;
} pqdict;

/* The value decoder of one page. */
typedef struct vit {
    const pqcol *c;
    int enc;
    const uint8_t *p, *end;
    uint64_t bit; /* PLAIN booleans */
    rle r;        /* dictionary indices, RLE booleans */
    const pqdict *dict;
    dbp d, d2;         /* DELTA_*: values or lengths; prefix lengths */
    const uint8_t *dp; /* DELTA_LENGTH_BYTE_ARRAY: the next bytes */
    int64_t *lens;     /* DELTA_*_BYTE_ARRAY lengths, all decoded first */
    int64_t *prefix;
    uint64_t nlens, at;
    uint8_t *prev; /* DELTA_BYTE_ARRAY: the previous value */
    size_t prev_len, prev_cap;
    uint64_t nvals, k; /* BYTE_STREAM_SPLIT */
} vit;

static void vit_free(vit *v)
{
    stk__free(v->lens);
    stk__free(v->prefix);
    stk__free(v->prev);
}

/* Decodes all n values of a DELTA_BINARY_PACKED stream into *out. */
static int dbp_all(const uint8_t *p, const uint8_t *end, int64_t **out, uint64_t *n,
                   const uint8_t **after, uint64_t most)
{
    dbp d;
    if (dbp_init(&d, p, end) || d.total > most)
        return STK_EFORMAT;
    int64_t *a = stk__malloc((d.total ? d.total : 1) * sizeof *a);
    if (!a)
        return STK_ENOMEM;
    for (uint64_t k = 0; k < d.total; k++)
        if (dbp_next(&d, &a[k])) {
            stk__free(a);
            return STK_EFORMAT;
        }
    *out = a;
    *n = d.total;
    *after = dbp_end(&d);
    return STK_OK;
}

static int vit_init(vit *v, const pqcol *c, int enc, const uint8_t *p, const uint8_t *end,
                    const pqdict *dict, uint64_t nvals, char *why, size_t wn)
{
    memset(v, 0, sizeof *v);
    v->c = c;
    v->enc = enc;
    v->p = p;
    v->end = end;
    v->nvals = nvals;
    switch (enc) {
    case EN_PLAIN: return STK_OK;
    case EN_PLAIN_DICT:
    case EN_RLE_DICT:
        if (!dict || !dict->have) {
            stk__fmt(why, wn, "a dictionary-encoded page without a dictionary page");
            return STK_EFORMAT;
        }
        if (p >= end) {
            if (!nvals)
                return STK_OK;
            stk__fmt(why, wn, "a dictionary-encoded page without its bit width");
            return STK_EFORMAT;
        }
        v->dict = dict;
        v->r = (rle){.p = p + 1, .end = end, .bw = p[0]};
        if (p[0] > 32) {
            stk__fmt(why, wn, "dictionary indices of %u bits", p[0]);
            return STK_EFORMAT;
        }
        return STK_OK;
    case EN_RLE:
        if (c->type != T_BOOLEAN)
            break;
        if (end - p < 4 || stk__le32(p) > (uint64_t)(end - p - 4)) {
            stk__fmt(why, wn, "RLE booleans with a bad length");
            return STK_EFORMAT;
        }
        v->r = (rle){.p = p + 4, .end = p + 4 + stk__le32(p), .bw = 1};
        return STK_OK;
    case EN_DELTA_BINARY:
        if (c->type != T_INT32 && c->type != T_INT64)
            break;
        if (dbp_init(&v->d, p, end)) {
            stk__fmt(why, wn, "a DELTA_BINARY_PACKED header that is not one");
            return STK_EFORMAT;
        }
        return STK_OK;
    case EN_DELTA_LENGTH:
    case EN_DELTA_BYTES: {
        if (c->type != T_BYTE_ARRAY)
            break;
        const uint8_t *q = p;
        int rc;
        if (enc == EN_DELTA_BYTES &&
            (rc = dbp_all(q, end, &v->prefix, &v->nlens, &q, nvals)) != STK_OK) {
            stk__fmt(why, wn, "bad DELTA_BYTE_ARRAY prefix lengths");
            return rc;
        }
        uint64_t np = v->nlens;
        if ((rc = dbp_all(q, end, &v->lens, &v->nlens, &q, nvals)) != STK_OK ||
            (enc == EN_DELTA_BYTES && np != v->nlens)) {
            stk__fmt(why, wn, "bad DELTA_*_BYTE_ARRAY lengths");
            return rc ? rc : STK_EFORMAT;
        }
        v->dp = q;
        return STK_OK;
    }
    case EN_BYTE_SPLIT:
        if (!plain_size(c) || c->type == T_FIXED)
            break;
        if ((uint64_t)(end - p) / plain_size(c) < nvals) {
            stk__fmt(why, wn, "BYTE_STREAM_SPLIT values shorter than their count");
            return STK_EFORMAT;
        }
        return STK_OK;
    default: break;
    }
    stk__fmt(why, wn, "values in encoding %d, which this reader does not read for column '%s'", enc,
             c->path);
    return STK_EUNSUPPORTED;
}

/* Appends the next value to o. */
static int vit_next(vit *v, pqdec *o, char *why, size_t wn)
{
    const pqcol *c = v->c;
    switch (v->enc) {
    case EN_PLAIN: {
        if (c->type == T_BOOLEAN) {
            if (v->bit >= (uint64_t)(v->end - v->p) * 8)
                goto short_;
            uint8_t b = (v->p[v->bit >> 3] >> (v->bit & 7)) & 1;
            v->bit++;
            return dec_value(o, c, &b, 1);
        }
        size_t n = plain_size(c), skip = 0;
        if (!n) {
            if (v->end - v->p < 4)
                goto short_;
            n = stk__le32(v->p);
            skip = 4;
        }
        if (n > (size_t)(v->end - v->p) - skip)
            goto short_;
        int rc = dec_value(o, c, v->p + skip, n);
        v->p += skip + n;
        return rc;
    }
    case EN_PLAIN_DICT:
    case EN_RLE_DICT: {
        uint32_t ix;
        if (rle_next(&v->r, &ix))
            goto short_;
        const pqdec *d = &v->dict->v;
        if (ix >= d->rows) {
            stk__fmt(why, wn, "dictionary index %" PRIu32 " past its %" PRIu64 " entries", ix,
                     d->rows);
            return STK_EFORMAT;
        }
        return dec_append(o, dec_ptr(d, ix), dec_len(d, ix));
    }
    case EN_RLE: {
        uint32_t b;
        if (rle_next(&v->r, &b))
            goto short_;
        uint8_t bb = (uint8_t)(b & 1);
        return dec_value(o, c, &bb, 1);
    }
    case EN_DELTA_BINARY: {
        int64_t x;
        if (dbp_next(&v->d, &x))
            goto short_;
        uint8_t raw[8];
        uint64_t u = (uint64_t)x;
        for (int k = 0; k < 8; k++)
            raw[k] = (uint8_t)(u >> (8 * k));
        return dec_value(o, c, raw, plain_size(c));
    }
    case EN_DELTA_LENGTH:
    case EN_DELTA_BYTES: {
        if (v->at >= v->nlens)
            goto short_;
        int64_t l = v->lens[v->at];
        int64_t pre = v->prefix ? v->prefix[v->at] : 0;
        v->at++;
        if (l < 0 || (uint64_t)l > (uint64_t)(v->end - v->dp) || pre < 0 ||
            (size_t)pre > v->prev_len) {
            stk__fmt(why, wn, "a DELTA byte-array length past its page");
            return STK_EFORMAT;
        }
        if (v->enc == EN_DELTA_LENGTH) {
            int rc = dec_append(o, v->dp, (size_t)l);
            v->dp += l;
            return rc;
        }
        size_t tot = (size_t)pre + (size_t)l;
        if (tot > v->prev_cap && stk__grow((void **)&v->prev, &v->prev_cap, tot, 1))
            return STK_ENOMEM;
        if (l)
            memcpy(v->prev + pre, v->dp, (size_t)l);
        v->dp += l;
        v->prev_len = tot;
        return dec_append(o, v->prev, tot);
    }
    case EN_BYTE_SPLIT: {
        size_t n = plain_size(c);
        uint8_t raw[8];
        if (v->k >= v->nvals)
            goto short_;
        for (size_t b = 0; b < n; b++)
            raw[b] = v->p[b * v->nvals + v->k];
        v->k++;
        return dec_value(o, c, raw, n);
    }
    default: break;
    }
short_:
    stk__fmt(why, wn, "the page's values end before its level count says");
    return STK_EFORMAT;
}

/* ---- Pages ----------------------------------------------------------------------- */

typedef struct pghdr {
    int type;
    int64_t usize, csize;
    int64_t nvalues, nulls, nrows;
    int enc, def_enc, rep_enc;
    int64_t def_len, rep_len;
    bool compressed, has_sub;
} pghdr;

static void parse_sub(tr *t, pghdr *h, int which)
{
    int16_t last = 0, id;
    int type;
    h->has_sub = true;
    while (tr_field(t, &last, &id, &type)) {
        if (which == P_DATA_V2) {
            switch (id) {
            case 1: h->nvalues = tr_want_i32(t, type); break;
            case 2: h->nulls = tr_want_i32(t, type); break;
            case 3: h->nrows = tr_want_i32(t, type); break;
            case 4: h->enc = tr_want_i32(t, type); break;
            case 5: h->def_len = tr_want_i32(t, type); break;
            case 6: h->rep_len = tr_want_i32(t, type); break;
            case 7: h->compressed = tr_bool(t, type); break;
            default: tr_skip(t, type, 2);
            }
        } else if (which == P_DICT) {
            /* DictionaryPageHeader: 3 is is_sorted, a bool (the Rust
             * writer sets it). */
            switch (id) {
            case 1: h->nvalues = tr_want_i32(t, type); break;
            case 2: h->enc = tr_want_i32(t, type); break;
            default: tr_skip(t, type, 2);
            }
        } else {
            switch (id) {
            case 1: h->nvalues = tr_want_i32(t, type); break;
            case 2: h->enc = tr_want_i32(t, type); break;
            case 3: h->def_enc = tr_want_i32(t, type); break;
            case 4: h->rep_enc = tr_want_i32(t, type); break;
            default: tr_skip(t, type, 2);
            }
        }
    }
}

static void parse_page_header(tr *t, pghdr *h)
{
    int16_t last = 0, id;
    int type;
    memset(h, 0, sizeof *h);
    h->type = -1;
    h->compressed = true;
    h->def_enc = EN_RLE;
    while (tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1: h->type = tr_want_i32(t, type); break;
        case 2: h->usize = tr_want_i32(t, type); break;
        case 3: h->csize = tr_want_i32(t, type); break;
        case 5:
        case 7:
        case 8:
            if (type != 12) {
                tr_fail(t, "holds a page sub-header that is not a struct");
                break;
            }
            parse_sub(t, h, id == 8 ? P_DATA_V2 : id == 7 ? P_DICT : P_DATA);
            break;
        default: tr_skip(t, type, 1);
        }
    }
}

static int decompress(int codec, const uint8_t *src, size_t n, uint8_t *dst, size_t want, char *why,
                      size_t wn)
{
    switch (codec) {
    case C_NONE:
        if (n != want)
            break;
        memcpy(dst, src, n);
        return STK_OK;
    case C_SNAPPY: {
        size_t got = 0;
        if (snappy_uncompressed_length((const char *)src, n, &got) != SNAPPY_OK || got != want)
            break;
        if (snappy_uncompress((const char *)src, n, (char *)dst, &got) != SNAPPY_OK || got != want)
            break;
        return STK_OK;
    }
    case C_GZIP: {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) != Z_OK)
            return STK_ENOMEM;
        z.next_in = (Bytef *)(uintptr_t)src;
        z.avail_in = (uInt)n;
        z.next_out = dst;
        z.avail_out = (uInt)want;
        int zr = inflate(&z, Z_FINISH);
        bool ok = zr == Z_STREAM_END && z.total_out == want;
        inflateEnd(&z);
        if (!ok)
            break;
        return STK_OK;
    }
    case C_ZSTD: {
        size_t got = ZSTD_decompress(dst, want, src, n);
        if (ZSTD_isError(got) || got != want)
            break;
        return STK_OK;
    }
    default:
        stk__fmt(why, wn,
                 "pages compressed with codec %d; stoker reads uncompressed, snappy, gzip "
                 "and zstd pages",
                 codec);
        return STK_EUNSUPPORTED;
    }
    stk__fmt(why, wn,
             "a page of %zu compressed bytes does not decompress to the %zu bytes its "
             "header says (codec %d)",
             n, want, codec);
    return STK_EFORMAT;
}

/* Reads level entries: n of them at most max into lv (NULL: all max). */
static int read_levels(rle *r, uint8_t *lv, uint64_t n, int max)
{
    for (uint64_t k = 0; k < n; k++) {
        uint32_t v;
        if (rle_next(r, &v) || v > (uint32_t)max)
            return -1;
        lv[k] = (uint8_t)v;
    }
    return 0;
}

/* A list column's page of n level entries (definition levels lv,
 * repetition levels rl; values from p): each entry at repetition level 0
 * starts a record (a row); an entry below elem_def is a null or empty
 * list and holds no element; the others are elements, null below max_def.
 * Elements go to o as values (o->rows counts them), records to rowstart
 * (at most o's capacity for them, the row group's rows). A record may go
 * on into the next page. */
static int list_page(const pqcol *c, const pghdr *h, const uint8_t *lv, const uint8_t *rl,
                     const uint8_t *p, const uint8_t *end, const pqdict *dict, pqdec *o,
                     uint64_t rows_max, char *why, size_t wn)
{
    uint64_t n = (uint64_t)h->nvalues, elems = 0, nonnull = 0;
    int rc;
    for (uint64_t k = 0; k < n; k++) {
        elems += lv[k] >= c->elem_def;
        nonnull += lv[k] == c->max_def;
        if (lv[k] < c->elem_def && rl[k]) {
            stk__fmt(why, wn, "level entry %" PRIu64 " continues a list that it says is empty", k);
            return STK_EFORMAT;
        }
    }
    if (n && !o->records && rl[0]) {
        stk__fmt(why, wn, "the column chunk starts inside a list (repetition level %u)", rl[0]);
        return STK_EFORMAT;
    }
    if (elems > rows_max - o->rows) {
        stk__fmt(why, wn, "%" PRIu64 " list elements, past the %" PRIu64 " read", o->rows + elems,
                 rows_max);
        return STK_EFORMAT;
    }
    if ((rc = stk__grow((void **)&o->off, &o->ocap, (size_t)(o->rows + elems + 1),
                        sizeof *o->off)) ||
        (rc = stk__grow((void **)&o->isnull, &o->ncap, (size_t)(o->rows + elems + 1), 1)))
        return rc;
    vit v;
    if ((rc = vit_init(&v, c, h->enc, p, end, dict, nonnull, why, wn)))
        return rc;
    for (uint64_t k = 0; k < n && !rc; k++) {
        if (!rl[k]) {
            if (o->records >= o->vcap) {
                stk__fmt(why, wn, "more lists than the row group's %" PRIu64 " rows", o->vcap);
                rc = STK_EFORMAT;
                break;
            }
            o->rowstart[o->records++] = o->rows;
        }
        if (lv[k] < c->elem_def)
            continue;
        uint64_t r = o->rows++;
        o->off[r] = o->dlen;
        o->isnull[r] = lv[k] != c->max_def;
        if (!o->isnull[r])
            rc = vit_next(&v, o, why, wn);
    }
    vit_free(&v);
    return rc;
}

/* Decodes one data page's values into o (rows so far in o->rows). */
static int data_page(const pqcol *c, const pghdr *h, const uint8_t *body, size_t blen,
                     const pqdict *dict, pqdec *o, uint64_t rows_max, uint8_t **lvbuf,
                     size_t *lvcap, char *why, size_t wn)
{
    uint64_t n = (uint64_t)h->nvalues;
    if (h->nvalues < 0 || n > rows_max - o->rows) {
        stk__fmt(why, wn, "a page of %" PRId64 " values, past the row group's %" PRIu64 " rows",
                 h->nvalues, rows_max);
        return STK_EFORMAT;
    }
    /* v1: [u32 length, levels] when the column has them, then values
     * (all of it decompressed); v2: repetition levels, definition levels
     * (lengths in the header, never compressed), then values. */
    const uint8_t *p = body, *end = body + blen;
    const uint8_t *lp = p, *lend = p, *rp = p, *rend = p;
    if (h->type == P_DATA_V2) {
        rend = body + h->rep_len;
        lp = rend;
        lend = lp + h->def_len;
        p = lend;
    } else if (c->max_rep > 0) {
        if (h->rep_enc != EN_RLE || h->def_enc != EN_RLE) {
            stk__fmt(why, wn, "levels in encodings %d/%d (RLE is read)", h->rep_enc, h->def_enc);
            return STK_EUNSUPPORTED;
        }
        if (end - p < 4 || stk__le32(p) > (uint64_t)(end - p - 4)) {
            stk__fmt(why, wn, "repetition levels longer than their page");
            return STK_EFORMAT;
        }
        rp = p + 4;
        rend = rp + stk__le32(p);
        p = rend;
    }
    if (h->type != P_DATA_V2 && c->max_def > 0) {
        if (h->def_enc != EN_RLE) {
            stk__fmt(why, wn, "definition levels in encoding %d (RLE is read)", h->def_enc);
            return STK_EUNSUPPORTED;
        }
        if (end - p < 4 || stk__le32(p) > (uint64_t)(end - p - 4)) {
            stk__fmt(why, wn, "definition levels longer than their page");
            return STK_EFORMAT;
        }
        lp = p + 4;
        lend = lp + stk__le32(p);
        p = lend;
    }
    uint8_t *lv = NULL;
    int rc;
    if (c->max_def > 0) {
        if (2 * n > *lvcap && (rc = stk__grow((void **)lvbuf, lvcap, 2 * n, 1)))
            return rc;
        lv = *lvbuf;
        rle r = {.p = lp, .end = lend, .bw = bits_for(c->max_def)};
        if (read_levels(&r, lv, n, c->max_def)) {
            stk__fmt(why, wn, "the definition levels end early or exceed %d", c->max_def);
            return STK_EFORMAT;
        }
    }
    if (c->list) {
        rle r = {.p = rp, .end = rend, .bw = bits_for(c->max_rep)};
        if (!lv || read_levels(&r, lv + n, n, c->max_rep)) {
            stk__fmt(why, wn, "the repetition levels end early or exceed %d", c->max_rep);
            return STK_EFORMAT;
        }
        return list_page(c, h, lv, lv + n, p, end, dict, o, rows_max, why, wn);
    }
    if (o->len) {
        /* In place (decode_chunk): the page is o->data, PLAIN byte arrays
         * (u32 length, bytes); a row's value is where it lies. */
        for (uint64_t k = 0; k < n; k++) {
            uint64_t r = o->rows + k;
            o->isnull[r] = lv && lv[k] != c->max_def;
            o->off[r] = (uint64_t)(p - o->data);
            o->len[r] = 0;
            if (o->isnull[r])
                continue;
            if (end - p < 4 || stk__le32(p) > (uint64_t)(end - p - 4)) {
                stk__fmt(why, wn, "the page's values end before its level count says");
                return STK_EFORMAT;
            }
            o->len[r] = stk__le32(p);
            o->off[r] += 4;
            p += 4 + o->len[r];
        }
        o->rows += n;
        return STK_OK;
    }
    uint64_t nonnull = 0;
    for (uint64_t k = 0; k < n; k++)
        nonnull += !lv || lv[k] == c->max_def;
    vit v;
    if ((rc = vit_init(&v, c, h->enc, p, end, dict, nonnull, why, wn)))
        return rc;
    for (uint64_t k = 0; k < n && !rc; k++) {
        uint64_t r = o->rows + k;
        o->off[r] = o->dlen;
        o->isnull[r] = lv && lv[k] != c->max_def;
        if (!o->isnull[r])
            rc = vit_next(&v, o, why, wn);
    }
    vit_free(&v);
    if (!rc)
        o->rows += n;
    return rc;
}

static void dec_free(pqdec *o)
{
    if (!o)
        return;
    stk__free(o->pages);
    stk__free(o->why);
    stk__free(o->off);
    stk__free(o->len);
    stk__free(o->isnull);
    stk__free(o->rowstart);
    stk__free(o->data);
    stk__free(o);
}

/* Bytes of a column chunk read into memory: a whole chunk, or a dictionary
 * page followed by one data page. Offsets in messages are the file's:
 * buffer position pos lies at start_a + pos before split, else at
 * start_b + (pos - split). */
typedef struct pqspan {
    uint64_t start_a, start_b;
    size_t split, len;
    int codec;
} pqspan;

static uint64_t span_at(const pqspan *sp, uint64_t pos)
{
    return pos < sp->split ? sp->start_a + pos : sp->start_b + (pos - sp->split);
}

/* Decodes the rows values of column c from the pages in buf (the span
 * sp): a whole chunk, or a dictionary page and one data page. */
/* decode_chunk's dictionary page (h, its us decompressed bytes at page):
 * its values into *dict. A dictionary after data (rows_done) or a second
 * one is refused. The reason in why. */
static int dict_page(const pqcol *c, const pghdr *h, const uint8_t *page, size_t us,
                     uint64_t rows_done, pqdict *dict, uint64_t at, char *why, size_t wn)
{
    char pw[256];
    int rc = STK_OK;
    if (dict->have || rows_done) {
        stk__fmt(why, wn, "a second dictionary page, or one after data, at offset %" PRIu64, at);
        return STK_EFORMAT;
    }
    if (h->nvalues < 0 || (uint64_t)h->nvalues > (uint64_t)us * 8 + 8 ||
        (h->enc != EN_PLAIN && h->enc != EN_PLAIN_DICT)) {
        stk__fmt(why, wn,
                 "the dictionary page at offset %" PRIu64 " has %" PRId64 " values in encoding %d",
                 at, h->nvalues, h->enc);
        return STK_EFORMAT;
    }
    uint64_t dn = (uint64_t)h->nvalues;
    if (!(dict->v.off = stk__malloc((dn + 1) * sizeof *dict->v.off)) ||
        !(dict->v.isnull = stk__malloc(dn ? dn : 1)))
        return STK_ENOMEM;
    vit v;
    vit_init(&v, c, EN_PLAIN, page, page + us, NULL, dn, pw, sizeof pw);
    for (uint64_t k = 0; k < dn && !rc; k++) {
        dict->v.off[k] = dict->v.dlen;
        rc = vit_next(&v, &dict->v, pw, sizeof pw);
    }
    dict->v.off[dn] = dict->v.dlen;
    dict->v.rows = dn;
    dict->have = true;
    if (rc)
        stk__fmt(why, wn, "the dictionary page at offset %" PRIu64 ": %s", at, pw);
    return rc;
}

static int decode_chunk(const pqcol *c, const pqspan *ch, const uint8_t *buf, uint64_t rows,
                        uint64_t rows_max, uint64_t page_max, pqdec **out, char *why, size_t wn)
{
    pqdec *o = stk__calloc(1, sizeof *o);
    pqdict dict = {.have = false};
    uint8_t *page = NULL, *lv = NULL;
    size_t pcap = 0, lvcap = 0;
    int rc = STK_OK;
    if (!o)
        return STK_ENOMEM;
    if (rows > rows_max) {
        stk__fmt(why, wn, "%" PRIu64 " rows in one row group", rows);
        rc = STK_EFORMAT;
        goto out;
    }
    if (!(o->off = stk__malloc((rows + 1) * sizeof *o->off)) ||
        !(o->isnull = stk__malloc(rows ? rows : 1)) ||
        (c->list && !(o->rowstart = stk__malloc((rows + 1) * sizeof *o->rowstart)))) {
        rc = STK_ENOMEM;
        goto out;
    }
    o->ocap = (size_t)rows + 1;
    o->ncap = rows ? (size_t)rows : 1;
    o->vcap = rows;
    /* A list column's pages are read to the chunk's end: a row's list may
     * go on in the next page, so the row count does not say where to stop. */
    uint64_t pos = 0;
    while (c->list ? pos < ch->len : o->rows < rows) {
        if (pos >= ch->len) {
            stk__fmt(why, wn, "its pages hold %" PRIu64 " of the %" PRIu64 " rows they should",
                     o->rows, rows);
            rc = STK_EFORMAT;
            goto out;
        }
        tr t = {buf + pos, buf + ch->len, buf + pos, false, NULL};
        pghdr h;
        parse_page_header(&t, &h);
        uint64_t at = span_at(ch, pos);
        if (t.bad) {
            stk__fmt(why, wn, "the page header at offset %" PRIu64 " %s", at, t.why);
            rc = STK_EFORMAT;
            goto out;
        }
        size_t hl = (size_t)(t.p - (buf + pos));
        if (h.csize < 0 || h.usize < 0 || (uint64_t)h.csize > ch->len - pos - hl ||
            (uint64_t)h.usize > page_max) {
            stk__fmt(why, wn,
                     "the page at offset %" PRIu64 " claims %" PRId64 " bytes (%" PRId64
                     " uncompressed), past its column chunk's end",
                     at, h.csize, h.usize);
            rc = STK_EFORMAT;
            goto out;
        }
        const uint8_t *body = buf + pos + hl;
        size_t cs = (size_t)h.csize, us = (size_t)h.usize;
        pos += hl + cs;
        if (h.type == P_INDEX)
            continue;
        if ((h.type != P_DATA && h.type != P_DICT && h.type != P_DATA_V2) || !h.has_sub) {
            stk__fmt(why, wn, "the page at offset %" PRIu64 " has type %d (or no sub-header)", at,
                     h.type);
            rc = STK_EFORMAT;
            goto out;
        }
        char pw[256];
        size_t lvl = 0;
        bool comp = ch->codec != C_NONE;
        if (h.type == P_DATA_V2) {
            if (h.def_len < 0 || h.rep_len < 0 || (uint64_t)h.def_len + (uint64_t)h.rep_len > cs ||
                (uint64_t)h.def_len + (uint64_t)h.rep_len > us) {
                stk__fmt(why, wn, "the v2 page at offset %" PRIu64 " has level lengths past it",
                         at);
                rc = STK_EFORMAT;
                goto out;
            }
            lvl = (size_t)(h.def_len + h.rep_len);
            comp = comp && h.compressed;
        }
        if ((!page || us > pcap) && (rc = stk__grow((void **)&page, &pcap, us ? us : 1, 1)))
            goto out;
        memcpy(page, body, lvl);
        if (comp)
            rc = decompress(ch->codec, body + lvl, cs - lvl, page + lvl, us - lvl, pw, sizeof pw);
        else
            rc = decompress(C_NONE, body + lvl, cs - lvl, page + lvl, us - lvl, pw, sizeof pw);
        if (rc) {
            stk__fmt(why, wn, "the page at offset %" PRIu64 ": %s", at, pw);
            goto out;
        }
        if (h.type == P_DICT) {
            if ((rc = dict_page(c, &h, page, us, o->rows, &dict, at, why, wn)))
                goto out;
            continue;
        }
        /* A PLAIN byte-array page holding all the rows (load_page's one
         * page: the usual image column) is kept as it decompressed, each
         * row's value found where it lies, rather than copied value by
         * value into a second buffer of the same size. */
        if (c->type == T_BYTE_ARRAY && h.enc == EN_PLAIN && h.type == P_DATA && !o->rows &&
            !c->list && !o->dlen && h.nvalues >= 0 && (uint64_t)h.nvalues == rows) {
            if (!(o->len = stk__malloc(rows ? rows * sizeof *o->len : 1))) {
                rc = STK_ENOMEM;
                goto out;
            }
            o->data = page;
            o->dcap = pcap;
            o->dlen = us;
            page = NULL;
            pcap = 0;
        }
        /* A page's byte arrays take at most its decompressed size: reserve it
         * once rather than grow (and copy) the values buffer as they come. */
        else if ((c->type == T_BYTE_ARRAY || c->type == T_FIXED) && !dict.have &&
                 us > o->dcap - o->dlen &&
                 (rc = stk__grow((void **)&o->data, &o->dcap, o->dlen + us, 1)))
            goto out;
        if ((rc = data_page(c, &h, o->len ? o->data : page, us, &dict, o, c->list ? rows_max : rows,
                            &lv, &lvcap, pw, sizeof pw))) {
            stk__fmt(why, wn, "the data page at offset %" PRIu64 ": %s", at, pw);
            goto out;
        }
    }
    if (c->list && o->records != rows) {
        stk__fmt(why, wn, "its pages hold %" PRIu64 " of the %" PRIu64 " lists they should",
                 o->records, rows);
        rc = STK_EFORMAT;
        goto out;
    }
    if (c->list)
        o->rowstart[rows] = o->rows;
    o->off[o->rows] = o->dlen;
    o->bytes = sizeof *o + o->ocap * sizeof *o->off + o->ncap + o->dcap +
               (o->len ? rows * sizeof *o->len : 0) +
               (o->rowstart ? (rows + 1) * sizeof *o->rowstart : 0);
out:
    stk__free(page);
    stk__free(lv);
    stk__free(dict.v.off);
    stk__free(dict.v.isnull);
    stk__free(dict.v.data);
    if (rc) {
        dec_free(o);
        o = NULL;
    }
    *out = o;
    return rc;
}

/* Reads and decodes chunk (g, c). */
static int load_chunk(pq *d, size_t g, size_t c, pqdec **out, char *err, size_t errlen)
{
    const pqrg *rg = &d->rgs[g];
    const pqchunk *ch = &d->chunks[g * d->ncols + c];
    const pqfile *f = &d->files[rg->file];
    char why[STK_ERRMSG_MAX];
    uint8_t *buf = stk__malloc(ch->size ? (size_t)ch->size : 1);
    *out = NULL;
    if (!buf) {
        stk__fmt(err, errlen, "out of memory for a %" PRIu64 "-byte column chunk", ch->size);
        return STK_ENOMEM;
    }
    int rc = pq_fetch(d, f, g, buf, (size_t)ch->size, ch->start, why, sizeof why);
    pqspan sp = {ch->start, ch->start, (size_t)ch->size, (size_t)ch->size, ch->codec};
    if (!rc)
        rc = decode_chunk(&d->cols[c], &sp, buf, rg->rows, d->rows_max, d->page_max, out, why,
                          sizeof why);
    if (rc)
        stk__fmt(err, errlen,
                 "row group %" PRIu32 ", column '%s' (chunk at offset %" PRIu64 "): %s", rg->index,
                 d->cols[c].path, ch->start, why);
    stk__free(buf);
    return rc;
}

/* ---- The cache of decoded chunks ------------------------------------------------- */

static void lru_unlink(pq *d, pqdec *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        d->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        d->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_front(pq *d, pqdec *e)
{
    e->next = d->head;
    e->prev = NULL;
    if (d->head)
        d->head->prev = e;
    d->head = e;
    if (!d->tail)
        d->tail = e;
}

/* Frees unpinned entries, oldest first, while the cache is over budget. */
static void lru_trim(pq *d)
{
    pqdec *e = d->tail;
    while (e && d->cached > d->budget) {
        pqdec *prev = e->prev;
        if (!e->refs) {
            lru_unlink(d, e);
            d->cached -= e->bytes;
            dec_free(e);
        }
        e = prev;
    }
}

/* A pinned entry's answer: STK_OK, or the remembered failure. */
static int entry_rc(const pqdec *e, char *err, size_t errlen)
{
    if (e->rc)
        stk__fmt(err, errlen, "%s", e->why ? e->why : "it does not decode");
    return e->rc;
}

typedef struct loadarg {
    size_t g, c;
    const pqdec *idx; /* load_page: the chunk's page index (pinned) */
    uint32_t page;
} loadarg;

typedef int (*load_fn)(pq *d, const loadarg *a, pqdec **out, char *err, size_t errlen);

/* The cache entry under key, made by load when missing, pinned (also when
 * it failed to load: then its error is returned): release with put_chunk. */
static int cache_get(pq *d, uint64_t key, load_fn load, const loadarg *a, pqdec **out, char *err,
                     size_t errlen)
{
    pthread_mutex_lock(&d->mu);
    for (pqdec *e = d->head; e; e = e->next)
        if (e->key == key) {
            e->refs++;
            lru_unlink(d, e);
            lru_front(d, e);
            pthread_mutex_unlock(&d->mu);
            *out = e;
            return entry_rc(e, err, errlen);
        }
    pthread_mutex_unlock(&d->mu);
    /* Loaded without the lock: two threads may load the same entry at
     * once; the second to finish uses the first's and frees its own. */
    pqdec *n;
    int rc = load(d, a, &n, err, errlen);
    if (rc == STK_ENOMEM || rc == STK_EIO)
        return rc; /* not the file's bytes: a later read may succeed */
    if (rc) {
        /* A chunk or page that does not decode is remembered as such. */
        if (!(n = stk__calloc(1, sizeof *n)) || !(n->why = stk__strdup(err))) {
            stk__free(n);
            return rc;
        }
        n->rc = rc;
        n->bytes = sizeof *n + strlen(n->why) + 1;
    }
    n->key = key;
    pthread_mutex_lock(&d->mu);
    for (pqdec *e = d->head; e; e = e->next)
        if (e->key == key) {
            e->refs++;
            pthread_mutex_unlock(&d->mu);
            dec_free(n);
            *out = e;
            return entry_rc(e, err, errlen);
        }
    n->refs = 1;
    lru_front(d, n);
    d->cached += n->bytes;
    lru_trim(d);
    pthread_mutex_unlock(&d->mu);
    *out = n;
    return entry_rc(n, err, errlen);
}

/* Walks chunk (g, c)'s page headers (one small read each, the bodies are
 * not read): where each data page lies and which rows it holds, and where
 * the dictionary page is. */
static int load_index(pq *d, const loadarg *a, pqdec **out, char *err, size_t errlen)
{
    const pqrg *rg = &d->rgs[a->g];
    const pqchunk *ch = &d->chunks[a->g * d->ncols + a->c];
    const pqfile *f = &d->files[rg->file];
    char why[STK_ERRMSG_MAX];
    pqdec *o = stk__calloc(1, sizeof *o);
    uint8_t *hb = NULL;
    size_t hcap = 0, cap = 0;
    uint64_t pos = 0, rows = 0;
    int rc = STK_OK;
    *out = NULL;
    if (!o)
        return STK_ENOMEM;
    why[0] = '\0';
    while (rows < rg->rows) {
        if (pos >= ch->size) {
            stk__fmt(why, sizeof why,
                     "its pages hold %" PRIu64 " of the row group's %" PRIu64 " rows", rows,
                     rg->rows);
            rc = STK_EFORMAT;
            break;
        }
        uint64_t left = ch->size - pos, at = ch->start + pos;
        size_t win = left < 1024 ? (size_t)left : 1024;
        tr t;
        pghdr h;
        /* A header is small unless its statistics are not: a longer read
         * when it does not parse in a short one. */
        for (;;) {
            if (win > hcap && (rc = stk__grow((void **)&hb, &hcap, win, 1)))
                goto out;
            if ((rc = pq_fetch(d, f, a->g, hb, win, at, why, sizeof why)))
                break;
            t = (tr){hb, hb + win, hb, false, NULL};
            parse_page_header(&t, &h);
            if (!t.bad || win == left || win >= (1u << 20))
                break;
            win = left < (uint64_t)win * 16 ? (size_t)left : win * 16;
        }
        if (rc)
            break;
        if (t.bad) {
            stk__fmt(why, sizeof why, "the page header at offset %" PRIu64 " %s", at, t.why);
            rc = STK_EFORMAT;
            break;
        }
        size_t hl = (size_t)(t.p - hb);
        if (h.csize < 0 || (uint64_t)h.csize > left - hl) {
            stk__fmt(why, sizeof why,
                     "the page at offset %" PRIu64 " claims %" PRId64
                     " bytes, past its column chunk's end",
                     at, h.csize);
            rc = STK_EFORMAT;
            break;
        }
        size_t plen = hl + (size_t)h.csize;
        if (h.type == P_DICT) {
            if (o->dict_len || o->npages) {
                stk__fmt(why, sizeof why,
                         "a second dictionary page, or one after data, at "
                         "offset %" PRIu64,
                         at);
                rc = STK_EFORMAT;
                break;
            }
            o->dict_off = at;
            o->dict_len = plen;
        } else if (h.type == P_DATA || h.type == P_DATA_V2) {
            if (!h.has_sub || h.nvalues < 0 || (uint64_t)h.nvalues > rg->rows - rows ||
                o->npages >= PQ_MAX_PAGES) {
                stk__fmt(why, sizeof why,
                         "the page at offset %" PRIu64 " holds %" PRId64
                         " values, past the row group's %" PRIu64 " rows",
                         at, h.nvalues, rg->rows);
                rc = STK_EFORMAT;
                break;
            }
            if (h.nvalues) {
                if ((rc = stk__grow((void **)&o->pages, &cap, o->npages + 1, sizeof *o->pages)))
                    goto out;
                o->pages[o->npages++] = (pqpage){at, rows, plen, (uint64_t)h.nvalues};
                rows += (uint64_t)h.nvalues;
            }
        } else if (h.type != P_INDEX) {
            stk__fmt(why, sizeof why, "the page at offset %" PRIu64 " has type %d", at, h.type);
            rc = STK_EFORMAT;
            break;
        }
        pos += plen;
    }
    o->bytes = sizeof *o + cap * sizeof *o->pages;
out:
    if (rc && rc != STK_ENOMEM)
        stk__fmt(err, errlen,
                 "row group %" PRIu32 ", column '%s' (chunk at offset %" PRIu64 "): %s", rg->index,
                 d->cols[a->c].path, ch->start, why);
    stk__free(hb);
    if (rc) {
        dec_free(o);
        o = NULL;
    }
    *out = o;
    return rc;
}

/* A buffer of at least n bytes for a page's stored bytes: the spare one
 * when it is large enough (its capacity in *cap). */
static uint8_t *buf_take(pq *d, size_t n, size_t *cap)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&d->mu);
    if (d->spare && d->spare_cap >= n) {
        b = d->spare;
        *cap = d->spare_cap;
        d->spare = NULL;
        d->spare_cap = 0;
    }
    pthread_mutex_unlock(&d->mu);
    if (!b) {
        *cap = n ? n : 1;
        b = stk__malloc(*cap);
    }
    return b;
}

/* Gives a buffer from buf_take back: kept as the spare if it is the larger
 * (and not over PQ_SPARE_MAX), else freed. */
static void buf_give(pq *d, uint8_t *b, size_t cap)
{
    pthread_mutex_lock(&d->mu);
    if (cap <= PQ_SPARE_MAX && (!d->spare || d->spare_cap < cap)) {
        uint8_t *old = d->spare;
        d->spare = b;
        d->spare_cap = cap;
        b = old;
    }
    pthread_mutex_unlock(&d->mu);
    stk__free(b);
}

/* Reads and decodes one data page (after the chunk's dictionary page, when
 * it has one). */
static int load_page(pq *d, const loadarg *a, pqdec **out, char *err, size_t errlen)
{
    const pqrg *rg = &d->rgs[a->g];
    const pqchunk *ch = &d->chunks[a->g * d->ncols + a->c];
    const pqfile *f = &d->files[rg->file];
    const pqpage *pg = &a->idx->pages[a->page];
    size_t dl = a->idx->dict_len, total = dl + pg->len, cap;
    char why[STK_ERRMSG_MAX];
    uint8_t *buf = buf_take(d, total, &cap);
    *out = NULL;
    if (!buf)
        return STK_ENOMEM;
    int rc = dl ? pq_fetch(d, f, a->g, buf, dl, a->idx->dict_off, why, sizeof why) : STK_OK;
    if (!rc)
        rc = pq_fetch(d, f, a->g, buf + dl, pg->len, pg->off, why, sizeof why);
    pqspan sp = {a->idx->dict_off, pg->off, dl, total, ch->codec};
    if (!rc)
        rc = decode_chunk(&d->cols[a->c], &sp, buf, pg->rows, d->rows_max, d->page_max, out, why,
                          sizeof why);
    if (rc && rc != STK_ENOMEM)
        stk__fmt(err, errlen,
                 "row group %" PRIu32 ", column '%s' (chunk at offset %" PRIu64 "): %s", rg->index,
                 d->cols[a->c].path, ch->start, why);
    buf_give(d, buf, cap);
    return rc;
}

/* A list column's whole chunk, decoded. */
static int load_whole(pq *d, const loadarg *a, pqdec **out, char *err, size_t errlen)
{
    return load_chunk(d, a->g, a->c, out, err, errlen);
}

/* Row r of chunk (g, c): the decoded page holding it (pinned, with the
 * chunk's page index: release both with put_chunk) and its row in it. A
 * list column's chunk is decoded whole (a record may span pages, and a
 * v1 page's row count is in its compressed levels): *idx stays NULL. */
static int get_row(pq *d, size_t g, size_t c, uint64_t r, pqdec **idx, pqdec **page, uint64_t *rr,
                   char *err, size_t errlen)
{
    uint64_t base = ((uint64_t)g * d->ncols + c) * (PQ_MAX_PAGES + 1);
    loadarg a = {g, c, NULL, 0};
    if (d->cols[c].list) {
        *rr = r;
        return cache_get(d, base, load_whole, &a, page, err, errlen);
    }
    int rc = cache_get(d, base + PQ_MAX_PAGES, load_index, &a, idx, err, errlen);
    if (rc)
        return rc;
    const pqdec *x = *idx;
    uint32_t lo = 0, hi = x->npages;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (x->pages[mid].first <= r)
            lo = mid;
        else
            hi = mid;
    }
    a.idx = x;
    a.page = lo;
    if ((rc = cache_get(d, base + lo, load_page, &a, page, err, errlen)))
        return rc;
    *rr = r - x->pages[lo].first;
    if (*rr >= (*page)->rows) {
        stk__fmt(err, errlen,
                 "row group %" PRIu32 ", column '%s': its page at offset %" PRIu64
                 " decodes to fewer rows than its header says",
                 d->rgs[g].index, d->cols[c].path, x->pages[lo].off);
        return STK_EFORMAT;
    }
    return STK_OK;
}

static void put_chunk(pq *d, pqdec *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&d->mu);
    e->refs--;
    lru_trim(d);
    pthread_mutex_unlock(&d->mu);
}

/* ---- Remote files: row-group units ------------------------------------------------ */

static size_t needed_cols(const pq *d, uint32_t *cols);

/* Checks what a read of remote file f said: its own failure, or a size or
 * version other than the open saw (the file was replaced under the reader). */
/* check_read's answer for a file whose size or version changed (an EIO
 * that file_dead remembers). */
#define STK_ECHANGED_ (-1000)

static int check_read(const pqfile *f, const stk__trange *r, char *why, size_t wn)
{
    /* A size the answer gave first: a read past a shorter file's end fails
     * for that reason. */
    bool vdiff = !r->rc && f->version[0] && r->version[0] && strcmp(f->version, r->version) != 0;
    if (r->rc && !(r->total && r->total != f->size)) {
        stk__fmt(why, wn, "%s", r->err[0] ? r->err : stk_strerror(r->rc));
        return r->rc;
    }
    if ((r->total && r->total != f->size) || vdiff) {
        stk__fmt(why, wn,
                 "it changed on the server since it was opened (%" PRIu64 " bytes, version %s; "
                 "was %" PRIu64 " bytes, version %s)",
                 r->total ? r->total : f->size, r->version[0] ? r->version : "none", f->size,
                 f->version[0] ? f->version : "none");
        return STK_ECHANGED_;
    }
    return STK_OK;
}

/* Remembers that file f is gone (404) or was replaced (rc STK_ENOENT or
 * STK_ECHANGED_, why the message): its later reads fail at once, naming
 * it, instead of each asking the server again. Under umu. */
static void file_dead(pqfile *f, int rc, const char *why)
{
    if (f->dead_rc || (rc != STK_ENOENT && rc != STK_ECHANGED_))
        return;
    if ((f->dead_why = stk__strdup(why)))
        f->dead_rc = rc == STK_ECHANGED_ ? STK_EIO : rc;
}

/* One ranged read of remote file f, outside any unit. */
static int read_direct(pq *d, const pqfile *f, void *buf, size_t n, uint64_t off, char *why,
                       size_t wn)
{
    pqfile *fw = &d->files[f - d->files];
    pthread_mutex_lock(&d->umu);
    int rc = f->dead_rc;
    if (rc)
        stk__fmt(why, wn, "%s", f->dead_why);
    pthread_mutex_unlock(&d->umu);
    if (rc)
        return rc;
    stk__trange r = {.obj = f->obj, .off = off, .len = n, .buf = buf};
    stk__trange *rp = &r;
    d->tp->ops->read(d->tp, &rp, 1);
    if ((rc = check_read(f, &r, why, wn))) {
        pthread_mutex_lock(&d->umu);
        file_dead(fw, rc, why);
        pthread_mutex_unlock(&d->umu);
    }
    return rc == STK_ECHANGED_ ? STK_EIO : rc;
}

/* Row group g's unit: the ranges of the needed columns' chunks, sorted,
 * those less than PQ_UNIT_GAP apart merged (one request for the usual row
 * group). Returns the number of ranges (in r, of STK__MAX_FIELDS + 1). */
static size_t unit_plan(const pq *d, size_t g, pqrange *r, size_t *bytes)
{
    uint32_t cols[STK__MAX_FIELDS + 1];
    size_t nc = needed_cols(d, cols), n = 0;
    for (size_t k = 0; k < nc; k++) {
        const pqchunk *ch = &d->chunks[g * d->ncols + cols[k]];
        if (!ch->size)
            continue;
        size_t j = n++;
        while (j > 0 && r[j - 1].off > ch->start) {
            r[j] = r[j - 1];
            j--;
        }
        r[j] = (pqrange){ch->start, ch->size, NULL};
    }
    size_t m = 0;
    *bytes = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t end = r[k].off + r[k].len;
        if (m && r[k].off <= r[m - 1].off + r[m - 1].len + PQ_UNIT_GAP) {
            uint64_t have = r[m - 1].off + r[m - 1].len;
            if (end > have)
                r[m - 1].len = end - r[m - 1].off;
        } else {
            r[m++] = r[k];
        }
    }
    for (size_t k = 0; k < m; k++)
        *bytes += (size_t)r[k].len;
    return m;
}

static void unit_free(pqunit *u)
{
    if (!u)
        return;
    stk__free(u->data);
    stk__free(u->r);
    stk__free(u->why);
    stk__free(u);
}

static void unit_unlink(pq *d, pqunit *u)
{
    if (u->prev)
        u->prev->next = u->next;
    else
        d->uhead = u->next;
    if (u->next)
        u->next->prev = u->prev;
    else
        d->utail = u->prev;
    u->prev = u->next = NULL;
    u->linked = false;
    d->ucached -= u->bytes;
}

static void unit_front(pq *d, pqunit *u)
{
    u->next = d->uhead;
    u->prev = NULL;
    if (d->uhead)
        d->uhead->prev = u;
    d->uhead = u;
    if (!d->utail)
        d->utail = u;
    u->linked = true;
}

/* Evicts idle units, oldest first, until want more bytes fit the budget.
 * Whether they fit now (or nothing else is held: a unit over the budget is
 * then fetched alone). Under umu. */
static bool unit_room(pq *d, size_t want)
{
    for (pqunit *u = d->utail, *prev; u && d->ucached + want > d->ubudget; u = prev) {
        prev = u->prev;
        if (u->ready && !u->refs) {
            unit_unlink(d, u);
            unit_free(u);
        }
    }
    return d->ucached + want <= d->ubudget || !d->ucached;
}

/* Waits on ucv for a while (under umu): STK_ECANCELED when the loader is
 * closing, else STK_OK (the caller looks again). */
static int unit_wait(pq *d)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&d->ucv, &d->umu, &ts);
    /* relaxed: the flag is polled; a late look costs one more wait. */
    return d->cancel && atomic_load_explicit(d->cancel, memory_order_relaxed) ? STK_ECANCELED
                                                                              : STK_OK;
}

static void unit_put(pq *d, pqunit *u)
{
    pthread_mutex_lock(&d->umu);
    bool gone = --u->refs == 0 && !u->linked;
    pthread_cond_broadcast(&d->ucv);
    pthread_mutex_unlock(&d->umu);
    if (gone)
        unit_free(u);
}

/* Unit u's entry name in the disk cache: the object's id, its size and the
 * unit's ranges, with the file's version (an entry of a replaced file is
 * never read). */
static void unit_key(const pq *d, const pqfile *f, const pqrange *r, size_t nr, size_t bytes,
                     char *key, size_t kn)
{
    char id[4096];
    d->tp->ops->id(d->tp, f->path, id, sizeof id);
    size_t at = strlen(id);
    stk__fmt(id + at, sizeof id - at, "#parquet:%" PRIu64, f->size);
    for (size_t k = 0; k < nr; k++) {
        at = strlen(id);
        stk__fmt(id + at, sizeof id - at, ":%" PRIu64 "+%" PRIu64, r[k].off, r[k].len);
    }
    stk__cache_key(id, bytes, f->version, key, kn);
}

/* The bytes of entry key (n of them) into buf, when the disk cache holds a
 * whole one: true. */
static bool unit_from_cache(pq *d, const char *key, uint8_t *buf, size_t n)
{
    int fd;
    struct stat st;
    if (stk__cache_pin(d->cache, key, &fd))
        return false;
    bool ok = stk__fstat(fd, &st) == 0 && (uint64_t)st.st_size == n &&
              stk__pread_upto(fd, buf, n, 0) == (ssize_t)n;
    stk__cache_unpin(fd);
    return ok;
}

/* Stores n fetched bytes as entry key of the disk cache, evicting the
 * least recently used ones; bytes that do not fit, or that another process
 * is storing, are just not stored. */
static void unit_to_cache(pq *d, const char *key, const uint8_t *buf, size_t n)
{
    int fd;
    char why[STK_ERRMSG_MAX];
    if (stk__cache_begin(d->cache, key, n, NULL, NULL, &fd, why, sizeof why))
        return;
    size_t done = 0;
    while (done < n) {
        ssize_t w = stk__pwrite(fd, buf + done, n - done, (off_t)done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    if (done < n) {
        stk__cache_abort(d->cache, key, fd, true);
        return;
    }
    if (stk__cache_commit(d->cache, key, fd, why, sizeof why) == STK_OK)
        stk__cache_unpin(fd);
}

/* Fetches unit u of file f (made, pinned and counted by unit_get): from
 * the disk cache when it holds it, else all its ranges in one batch of
 * requests (then stored there). */
static int unit_fetch(pq *d, const pqfile *f, pqunit *u, char *why, size_t wn)
{
    stk__trange *rs = stk__calloc(u->nr, sizeof *rs);
    stk__trange **rp = stk__calloc(u->nr, sizeof *rp);
    int rc = STK_OK;
    if (!rs || !rp || !(u->data = stk__malloc(u->bytes ? u->bytes : 1))) {
        stk__fmt(why, wn, "out of memory for its %zu bytes", u->bytes);
        rc = STK_ENOMEM;
        goto out;
    }
    size_t at = 0;
    for (size_t k = 0; k < u->nr; k++) {
        u->r[k].p = u->data + at;
        at += (size_t)u->r[k].len;
        rs[k] =
            (stk__trange){.obj = f->obj, .off = u->r[k].off, .len = u->r[k].len, .buf = u->r[k].p};
        rp[k] = &rs[k];
    }
    char key[256];
    if (d->cache && u->nr) {
        unit_key(d, f, u->r, u->nr, u->bytes, key, sizeof key);
        if (unit_from_cache(d, key, u->data, u->bytes))
            goto out;
    }
    d->tp->ops->read(d->tp, rp, u->nr);
    for (size_t k = 0; k < u->nr && !rc; k++)
        rc = check_read(f, &rs[k], why, wn);
    if (!rc && d->cache && u->nr)
        unit_to_cache(d, key, u->data, u->bytes);
out:
    stk__free(rp);
    stk__free(rs);
    return rc;
}

/* Row group g's unit, pinned (unit_put), fetched by the first reader that
 * asks for it while the others wait for that fetch (one request, not one
 * a thread). A failed fetch is not kept: the next read tries again. */
static int unit_get(pq *d, size_t g, pqunit **out, char *why, size_t wn)
{
    pqfile *f = &d->files[d->rgs[g].file];
    pqrange plan[STK__MAX_FIELDS + 1];
    size_t bytes = 0, nr = unit_plan(d, g, plan, &bytes);
    pqunit *u = NULL;
    int rc = STK_OK;
    *out = NULL;
    pthread_mutex_lock(&d->umu);
    if (f->dead_rc) {
        rc = f->dead_rc;
        stk__fmt(why, wn, "fetching row group %" PRIu32 " of %s: %s", d->rgs[g].index, f->name,
                 f->dead_why);
        pthread_mutex_unlock(&d->umu);
        return rc;
    }
    for (;;) {
        for (u = d->uhead; u && u->g != g; u = u->next)
            ;
        if (u || unit_room(d, bytes))
            break;
        if ((rc = unit_wait(d))) {
            pthread_mutex_unlock(&d->umu);
            stk__fmt(why, wn, "the loader is closing");
            return rc;
        }
    }
    if (u) {
        u->refs++;
        while (!u->ready && !rc)
            rc = unit_wait(d);
        if (!rc && u->rc)
            stk__fmt(why, wn, "%s", u->why ? u->why : stk_strerror(u->rc));
        rc = rc ? rc : u->rc;
        pthread_mutex_unlock(&d->umu);
        if (rc) {
            if (rc == STK_ECANCELED)
                stk__fmt(why, wn, "the loader is closing");
            unit_put(d, u);
            return rc;
        }
        *out = u;
        return STK_OK;
    }
    if (!(u = stk__calloc(1, sizeof *u)) || !(u->r = stk__calloc(nr ? nr : 1, sizeof *u->r))) {
        pthread_mutex_unlock(&d->umu);
        stk__free(u);
        stk__fmt(why, wn, "out of memory");
        return STK_ENOMEM;
    }
    memcpy(u->r, plan, nr * sizeof *plan);
    *u = (pqunit){.g = g, .refs = 1, .r = u->r, .nr = nr, .bytes = bytes};
    unit_front(d, u);
    d->ucached += bytes;
    pthread_mutex_unlock(&d->umu);
    char r[STK_ERRMSG_MAX];
    rc = unit_fetch(d, f, u, r, sizeof r);
    if (rc)
        stk__fmt(why, wn, "fetching row group %" PRIu32 " (%zu bytes) of %s: %s", d->rgs[g].index,
                 bytes, f->name, r);
    pthread_mutex_lock(&d->umu);
    file_dead(f, rc, r);
    rc = rc == STK_ECHANGED_ ? STK_EIO : rc;
    u->ready = true;
    u->rc = rc;
    if (rc) {
        u->why = stk__strdup(why);
        unit_unlink(d, u);
    }
    pthread_cond_broadcast(&d->ucv);
    pthread_mutex_unlock(&d->umu);
    if (rc) {
        unit_put(d, u);
        return rc;
    }
    *out = u;
    return STK_OK;
}

/* pq_fetch for a remote file: at the open, the head and tail read for the
 * footer; in row group g, its unit (a range outside it, a column the unit
 * lacks, by a request of its own). */
static int fetch_remote(pq *d, const pqfile *f, size_t g, void *buf, size_t n, uint64_t off,
                        char *err, size_t errlen)
{
    if (g == PQ_NO_RG) {
        if (off + n <= sizeof f->head) {
            memcpy(buf, f->head + off, n);
            return STK_OK;
        }
        if (f->tail && off >= f->tail_at && off + n <= f->tail_at + f->tail_len) {
            memcpy(buf, f->tail + (off - f->tail_at), n);
            return STK_OK;
        }
        return read_direct(d, f, buf, n, off, err, errlen);
    }
    pqunit *u;
    int rc = unit_get(d, g, &u, err, errlen);
    if (rc)
        return rc;
    for (size_t k = 0; k < u->nr; k++)
        if (off >= u->r[k].off && off + n <= u->r[k].off + u->r[k].len) {
            memcpy(buf, u->r[k].p + (off - u->r[k].off), n);
            unit_put(d, u);
            return STK_OK;
        }
    unit_put(d, u);
    char why[STK_ERRMSG_MAX];
    if ((rc = read_direct(d, f, buf, n, off, why, sizeof why)))
        stk__fmt(err, errlen, "fetching %zu bytes at offset %" PRIu64 " of %s: %s", n, off, f->name,
                 why);
    return rc;
}

/* ---- Reads ----------------------------------------------------------------------- */

static size_t rg_of(const pq *d, uint64_t i)
{
    size_t lo = 0, hi = d->nrgs;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->rgs[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Parses decimal text (an INT column's value). */
static bool text_int(const uint8_t *p, size_t n, int64_t *v)
{
    char b[32];
    if (!n || n >= sizeof b)
        return false;
    memcpy(b, p, n);
    b[n] = '\0';
    char *e;
    errno = 0;
    long long x = strtoll(b, &e, 10);
    if (errno || *e)
        return false;
    *v = x;
    return true;
}

/* The columns a read needs, as a list: the selected fields' columns, else
 * the payload's and the label's. */
static size_t needed_cols(const pq *d, uint32_t *cols)
{
    size_t n = 0;
    uint64_t have[PQ_MAX_COLUMNS / 64] = {0};
    for (size_t f = 0; f < d->nfields; f++) {
        bool want = d->selected ? (d->mask >> f) & 1 : (int)f == d->payload;
        uint32_t c = d->fields[f].col;
        if (want && !(have[c / 64] >> (c % 64) & 1)) {
            have[c / 64] |= 1ull << (c % 64);
            cols[n++] = c;
        }
    }
    if (d->label >= 0 && !(have[d->label / 64] >> (d->label % 64) & 1))
        cols[n++] = (uint32_t)d->label;
    return n;
}

/* Field fd's value in row r of its column's decoded chunk (or page) e:
 * false when the row lacks it (null; a list without that element). */
static bool field_value(const pqfield *fd, const pqdec *e, uint64_t r, const uint8_t **p, size_t *n)
{
    if (fd->elem != PQ_ELEM_NONE) {
        if (fd->elem < 0 || !e->rowstart ||
            (uint64_t)fd->elem >= e->rowstart[r + 1] - e->rowstart[r])
            return false;
        r = e->rowstart[r] + (uint64_t)fd->elem;
    }
    if (e->isnull[r])
        return false;
    *p = dec_ptr(e, r);
    *n = dec_len(e, r);
    return true;
}

static int pq_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                   int64_t *label, char *err, size_t errlen)
{
    pq *d = s->impl;
    size_t g = rg_of(d, i);
    uint32_t cols[STK__MAX_FIELDS + 1];
    pqdec *dec[STK__MAX_FIELDS + 1] = {0}, *idx[STK__MAX_FIELDS + 1] = {0};
    uint64_t rr[STK__MAX_FIELDS + 1];
    size_t nc = needed_cols(d, cols);
    int rc = STK_OK;
    *label = -1;
    /* Each column's value for the row: from the one page holding it. */
    for (size_t k = 0; k < nc && !rc; k++)
        rc = get_row(d, g, cols[k], i - d->rgs[g].first, &idx[k], &dec[k], &rr[k], err, errlen);
    if (rc)
        goto out;
    size_t need = 4;
    for (size_t f = 0; f < d->nfields; f++) {
        if (d->selected && !((d->mask >> f) & 1))
            continue;
        if (!d->selected && (int)f != d->payload)
            continue;
        size_t k = 0;
        while (cols[k] != d->fields[f].col)
            k++;
        const uint8_t *v;
        size_t n = 0;
        field_value(&d->fields[f], dec[k], rr[k], &v, &n);
        need += 8 + n;
    }
    if (d->label >= 0) {
        size_t k = 0;
        while (cols[k] != (uint32_t)d->label)
            k++;
        const pqdec *e = dec[k];
        int64_t v;
        if (!e->isnull[rr[k]] && text_int(dec_ptr(e, rr[k]), dec_len(e, rr[k]), &v))
            *label = v;
    }
    uint8_t *buf = stk__sink_reserve(sink, need, &rc);
    if (!buf) {
        if (rc == STK_ETOOBIG)
            stk__fmt(err, errlen, "sample of %zu bytes does not fit its %zu-byte budget", need,
                     sink->grow ? sink->grow->limit : sink->cap);
        else
            stk__fmt(err, errlen, "out of memory for %zu bytes", need);
        goto out;
    }
    if (!d->selected) {
        size_t k = 0;
        if (d->payload < 0) {
            *data = buf;
            *len = 0;
            goto out;
        }
        while (cols[k] != d->fields[d->payload].col)
            k++;
        const uint8_t *v;
        size_t n;
        if (!field_value(&d->fields[d->payload], dec[k], rr[k], &v, &n)) {
            stk__fmt(err, errlen, "its '%s' is null", d->cols[cols[k]].path);
            rc = STK_EFORMAT;
            goto out;
        }
        memcpy(buf, v, n);
        *data = buf;
        *len = n;
        goto out;
    }
    /* The record the fields op splits: u32 count, then per selected field
     * u32 id, u32 length (UINT32_MAX: null) and its bytes. */
    size_t at = 4;
    uint32_t cnt = 0;
    for (size_t f = 0; f < d->nfields; f++) {
        if (!((d->mask >> f) & 1))
            continue;
        size_t k = 0;
        while (cols[k] != d->fields[f].col)
            k++;
        const uint8_t *v = NULL;
        size_t vn;
        uint32_t n = field_value(&d->fields[f], dec[k], rr[k], &v, &vn) ? (uint32_t)vn : UINT32_MAX;
        uint32_t id = (uint32_t)f;
        memcpy(buf + at, &id, 4);
        memcpy(buf + at + 4, &n, 4);
        at += 8;
        if (n != UINT32_MAX) {
            memcpy(buf + at, v, n);
            at += n;
        }
        cnt++;
    }
    memcpy(buf, &cnt, 4);
    *data = buf;
    *len = at;
out:
    for (size_t k = 0; k < nc; k++) {
        put_chunk(d, dec[k]);
        put_chunk(d, idx[k]);
    }
    return rc;
}

static int pq_select(stk__source *s, uint64_t mask, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    pq *d = s->impl;
    /* "images[]" stands for the list in the description: no sample has it. */
    for (size_t f = 0; f < d->nfields && f < 64; f++)
        if (d->fields[f].elem == PQ_ELEM_ANY)
            mask &= ~((uint64_t)1 << f);
    d->mask = mask;
    d->selected = true;
    return STK_OK;
}

/* Splits a record pq_read made into its fields (nulls left out). */
static int split_record(size_t nfields, const uint8_t *bytes, size_t len, stk__field_set *fs,
                        char *why, size_t wn)
{
    fs->n = 0;
    fs->gen_used = 0;
    if (len < 4)
        goto bad;
    uint32_t cnt;
    memcpy(&cnt, bytes, 4);
    size_t at = 4;
    for (uint32_t k = 0; k < cnt; k++) {
        uint32_t id, n;
        if (len - at < 8)
            goto bad;
        memcpy(&id, bytes + at, 4);
        memcpy(&n, bytes + at + 4, 4);
        at += 8;
        if (id >= nfields || fs->n >= STK__MAX_FIELDS)
            goto bad;
        if (n == UINT32_MAX)
            continue;
        if (n > len - at)
            goto bad;
        fs->f[fs->n++] = (stk__field_ref){id, bytes + at, n};
        at += n;
    }
    if (at != len)
        goto bad;
    return STK_OK;
bad:
    stk__fmt(why, wn, "its record of fields is malformed");
    return STK_EFORMAT;
}

static int pq_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                     int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    const pq *d = s->impl;
    (void)i;
    (void)label;
    return split_record(d->nfields, bytes, len, fs, err, errlen);
}

static void pq_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const pq *d = s->impl;
    const pqrg *rg = &d->rgs[rg_of(d, i)];
    stk__fmt(buf, n, "%s#%" PRIu64, d->files[rg->file].name, rg->file_first + (i - rg->first));
}

static void pq_key(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const pq *d = s->impl;
    const pqrg *rg = &d->rgs[rg_of(d, i)];
    const char *p = d->files[rg->file].name, *slash = strrchr(p, '/');
    stk__fmt(buf, n, "%s#%" PRIu64, slash ? slash + 1 : p, rg->file_first + (i - rg->first));
}

static void pq_describe(const stk__source *s, stk__dataset_info *di)
{
    const pq *d = s->impl;
    if (s->ops->flags & STK__SRC_IMAGES)
        di->payload = "encoded";
    di->shards = d->nfiles;
    di->bytes = d->total_bytes;
}

static void pq_free(pq *d)
{
    if (!d)
        return;
    for (size_t k = 0; d->mu_ok && k < 2 * STK__MAX_FIELDS; k++)
        put_chunk(d, d->held[k]);
    for (pqdec *e = d->head, *nx; e; e = nx) {
        nx = e->next;
        dec_free(e);
    }
    for (pqunit *u = d->uhead, *nx; u; u = nx) {
        nx = u->next;
        unit_free(u);
    }
    for (size_t k = 0; k < d->nfiles; k++) {
        if (d->files[k].fd >= 0)
            stk__close(d->files[k].fd);
        if (d->files[k].obj)
            d->tp->ops->close_obj(d->tp, d->files[k].obj);
        stk__free(d->files[k].tail);
        stk__free(d->files[k].dead_why);
        stk__free(d->files[k].path);
        stk__free(d->files[k].name);
    }
    stk__transport_close(d->tp); /* borrows the store, never touches it */
    stk__free(d->files);
    free_cols(d->cols, d->ncols);
    stk__free(d->rgs);
    stk__free(d->chunks);
    stk__free(d->spare);
    if (d->mu_ok)
        pthread_mutex_destroy(&d->mu);
    if (d->u_ok) {
        pthread_cond_destroy(&d->ucv);
        pthread_mutex_destroy(&d->umu);
    }
    stk__free(d);
}

static void pq_close(stk__source *s)
{
    pq_free(s->impl);
    s->impl = NULL;
}

static int pq_field_named(stk__source *s, const char *name, size_t len);
static int pq_each_value(stk__source *s, uint64_t i,
                         int (*fn)(void *, const char *, int, const uint8_t *, size_t), void *user,
                         char *err, size_t errlen);
static void pq_advise_order(stk__source *s, const stk__source_params *prm, bool shuffle,
                            bool global, unsigned window);

static const stk__source_ops k_pq_ops = {.kind = "parquet",
                                         .read = pq_read,
                                         .name = pq_name,
                                         .close = pq_close,
                                         .select = pq_select,
                                         .fields = pq_fields,
                                         .flags = STK__SRC_IMAGES,
                                         .describe = pq_describe,
                                         .key = pq_key,
                                         .field_named = pq_field_named,
                                         .each_value = pq_each_value,
                                         .advise_order = pq_advise_order};
static const stk__source_ops k_pq_bytes_ops = {.kind = "parquet",
                                               .read = pq_read,
                                               .name = pq_name,
                                               .close = pq_close,
                                               .select = pq_select,
                                               .fields = pq_fields,
                                               .describe = pq_describe,
                                               .key = pq_key,
                                               .field_named = pq_field_named,
                                               .each_value = pq_each_value,
                                               .advise_order = pq_advise_order};

/* ---- Advice on the order ------------------------------------------------------------ */

/* The same warning only once in a row from one open: each open (each
 * loader, each warning callback) is told, however many came before it
 * (stoker doctor, which opens the dataset for each level it measures,
 * drops the repeats itself). */
static void pq_warn(pq *d, const stk__source_params *prm, const char *msg)
{
    uint64_t h = 0x5741524eULL; /* "WARN" */
    for (const char *q = msg; *q; q++)
        h = stk__mix64(h ^ (uint8_t)*q);
    if (d->warned == h)
        return;
    d->warned = h;
    stk__warn(prm, "%s", msg);
}

static void human(uint64_t b, char *buf, size_t n)
{
    if (b >= (1ull << 30))
        stk__fmt(buf, n, "%.1f GiB", (double)b / (double)(1ull << 30));
    else
        stk__fmt(buf, n, "%.1f MiB", (double)b / (double)(1ull << 20));
}

/* The most rows one page of the needed columns holds in the first row
 * group (its page index read now, as the first read would; a list column
 * is decoded whole: all its rows). */
static uint64_t rows_a_page(pq *d, const uint32_t *cols, size_t nc)
{
    uint64_t most = 0;
    for (size_t k = 0; k < nc; k++) {
        if (d->cols[cols[k]].list) {
            most = d->rgs[0].rows > most ? d->rgs[0].rows : most;
            continue;
        }
        pqdec *idx = NULL;
        char why[STK_ERRMSG_MAX];
        uint64_t base = (uint64_t)cols[k] * (PQ_MAX_PAGES + 1);
        loadarg a = {0, cols[k], NULL, 0};
        if (cache_get(d, base + PQ_MAX_PAGES, load_index, &a, &idx, why, sizeof why) == STK_OK &&
            idx->npages) {
            uint64_t rp = d->rgs[0].rows / idx->npages;
            most = rp > most ? rp : most;
        }
        put_chunk(d, idx);
    }
    return most;
}

/* A shuffled read decodes, for each sample, the page of each column it
 * reads: cheap while those pages stay in the cache, a whole page for one
 * row when they do not. Warned when pages hold several rows and what the
 * order keeps in play (the whole dataset, or shard_window row groups: their
 * column chunks' stored sizes, a lower bound of what they decode to)
 * exceeds the cache. */
static void pq_advise_order(stk__source *s, const stk__source_params *prm, bool shuffle,
                            bool global, unsigned window)
{
    pq *d = s->impl;
    uint32_t cols[STK__MAX_FIELDS + 1];
    size_t nc = needed_cols(d, cols);
    if (!shuffle || !nc)
        return;
    uint64_t all = 0;
    for (size_t k = 0; k < nc; k++)
        for (size_t g = 0; g < d->nrgs; g++)
            all += d->chunks[g * d->ncols + cols[k]].size;
    uint64_t per_rg = all / d->nrgs, held = global ? all : per_rg * window;
    if (held <= d->budget)
        return;
    uint64_t rows_page = rows_a_page(d, cols, nc);
    if (rows_page < 4)
        return;
    char msg[1024], a1[32], a2[32], a3[32], a4[32];
    human(all, a1, sizeof a1);
    human(per_rg * window, a4, sizeof a4);
    human(per_rg, a2, sizeof a2);
    human(d->budget, a3, sizeof a3);
    uint64_t fit = per_rg ? d->budget / per_rg : 1;
    fit = fit > 2 ? 2 : fit;
    char advice[256];
    if (!fit)
        stk__fmt(advice, sizeof advice,
                 "a row group (%s stored) alone exceeds the cache: pack it (stoker pack), or "
                 "write it with smaller row groups",
                 a2);
    else if (global)
        stk__fmt(advice, sizeof advice,
                 "use order=\"shards\" with shard_window %" PRIu64
                 " (row groups of %s), or pack it (stoker pack) for a global shuffle",
                 fit, a2);
    else
        stk__fmt(advice, sizeof advice, "use shard_window %" PRIu64 " (row groups of %s)", fit, a2);
    stk__fmt(msg, sizeof msg,
             "%s: %s will be slow: its pages hold about %" PRIu64 " rows each and %s (%s "
             "stored) exceed the %s page cache, so most samples decode a whole page to use "
             "one row; %s (docs/formats.md)",
             d->files[0].name,
             global ? "a global shuffle of this Parquet dataset"
                    : "a shuffle in shards of this Parquet dataset",
             rows_page, global ? "the columns read" : "shard_window row groups", global ? a1 : a4,
             a3, advice);
    pq_warn(d, prm, msg);
}

/* ---- Open ------------------------------------------------------------------------ */

/* Reads and parses file f's footer; on the first file, builds the columns;
 * on the others, checks they have the same ones. Appends its row groups. */
static int open_file(pq *d, size_t fi, char *err, size_t errlen)
{
    pqfile *f = &d->files[fi];
    uint8_t tail[8], head[4];
    char why[STK_ERRMSG_MAX];
    uint8_t *foot = NULL;
    pqmeta m = {0};
    pqcol *cols = NULL;
    size_t ncols = 0;
    int rc;
    if (f->size < 12) {
        stk__fmt(err, errlen, "%s: %" PRIu64 " bytes is too short for a Parquet file", f->name,
                 f->size);
        return STK_EFORMAT;
    }
    if ((rc = pq_fetch(d, f, PQ_NO_RG, head, 4, 0, why, sizeof why)) ||
        (rc = pq_fetch(d, f, PQ_NO_RG, tail, 8, f->size - 8, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", f->name, why);
        return rc;
    }
    if (memcmp(head, "PAR1", 4) || memcmp(tail + 4, "PAR1", 4)) {
        stk__fmt(err, errlen, "%s: not a Parquet file (no PAR1 magic at %s)", f->name,
                 memcmp(head, "PAR1", 4) ? "its start" : "its end; truncated?");
        return STK_EFORMAT;
    }
    uint32_t fl = stk__le32(tail);
    if (fl > f->size - 12 || fl > PQ_FOOTER_MAX || fl < 2) {
        stk__fmt(err, errlen,
                 "%s: the footer length %" PRIu32 " (at offset %" PRIu64
                 ") does not fit the %" PRIu64 "-byte file",
                 f->name, fl, f->size - 8, f->size);
        return STK_EFORMAT;
    }
    uint64_t foot_at = f->size - 8 - fl;
    if (!(foot = stk__malloc(fl))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = pq_fetch(d, f, PQ_NO_RG, foot, fl, foot_at, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", f->name, why);
        goto out;
    }
    tr t = {foot, foot + fl, foot, false, NULL};
    if ((rc = parse_meta(&t, &m, leaves_of, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: footer at offset %" PRIu64 ": %s", f->name, foot_at, why);
        goto out;
    }
    if ((rc = build_columns(&m, &cols, &ncols, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", f->name, why);
        goto out;
    }
    if (fi == 0) {
        hf_media(d, m.hf, m.hf_len);
        d->cols = cols;
        d->ncols = ncols;
        cols = NULL;
    } else {
        bool same = ncols == d->ncols;
        for (size_t c = 0; same && c < ncols; c++)
            same = !strcmp(cols[c].path, d->cols[c].path) && cols[c].type == d->cols[c].type &&
                   cols[c].max_def == d->cols[c].max_def && cols[c].max_rep == d->cols[c].max_rep;
        if (!same) {
            stk__fmt(err, errlen,
                     "%s: has other columns than %s; stoker reads files that share one schema",
                     f->name, d->files[0].name);
            rc = STK_EUNSUPPORTED;
            goto out;
        }
    }
    if (m.nrgs > PQ_MAX_RGS - d->nrgs) {
        rc = STK_EFORMAT;
        goto out;
    }
    size_t nr = d->nrgs + m.nrgs;
    pqrg *rgs = stk__realloc(d->rgs, (nr ? nr : 1) * sizeof *rgs);
    if (!rgs) {
        rc = STK_ENOMEM;
        goto out;
    }
    d->rgs = rgs;
    pqchunk *chs = stk__realloc(d->chunks, (nr && d->ncols ? nr * d->ncols : 1) * sizeof *chs);
    if (!chs) {
        rc = STK_ENOMEM;
        goto out;
    }
    d->chunks = chs;
    uint64_t first = d->nrgs ? d->rgs[d->nrgs - 1].first + d->rgs[d->nrgs - 1].rows : 0;
    uint64_t in_file = 0;
    for (size_t g = 0; g < m.nrgs; g++) {
        int64_t rows = m.rg_rows[g];
        if (rows < 0 || (uint64_t)rows > d->rows_max) {
            stk__fmt(err, errlen, "%s: row group %zu claims %" PRId64 " rows", f->name, g, rows);
            rc = STK_EFORMAT;
            goto out;
        }
        for (size_t c = 0; c < d->ncols; c++) {
            const pqmeta_chunk *mc = &m.chunks[g * d->ncols + c];
            pqchunk *ch = &chs[(d->nrgs + g) * d->ncols + c];
            int64_t start =
                mc->dict_off > 0 && mc->dict_off < mc->data_off ? mc->dict_off : mc->data_off;
            if (!mc->has_meta || mc->file_path) {
                stk__fmt(err, errlen, "%s: row group %zu, column '%s': %s", f->name, g,
                         d->cols[c].path,
                         mc->file_path ? "its chunk lives in another file (file_path), which "
                                         "stoker does not read"
                                       : "the chunk has no metadata");
                rc = mc->file_path ? STK_EUNSUPPORTED : STK_EFORMAT;
                goto out;
            }
            if (start < 4 || mc->comp < 0 || (uint64_t)mc->comp > PQ_CHUNK_MAX ||
                (uint64_t)start > foot_at || (uint64_t)mc->comp > foot_at - (uint64_t)start ||
                mc->values < 0 || mc->type != d->cols[c].type) {
                stk__fmt(err, errlen,
                         "%s: row group %zu, column '%s': its chunk (%" PRId64
                         " bytes at offset %" PRId64 ", type %d) lies outside the file's data "
                         "(offsets 4 to %" PRIu64 ") or does not match the schema",
                         f->name, g, d->cols[c].path, mc->comp, start, mc->type, foot_at);
                rc = STK_EFORMAT;
                goto out;
            }
            if (d->cols[c].max_rep == 0 && (uint64_t)mc->values != (uint64_t)rows) {
                stk__fmt(err, errlen,
                         "%s: row group %zu, column '%s': its chunk holds %" PRId64
                         " values, the row group %" PRId64 " rows",
                         f->name, g, d->cols[c].path, mc->values, rows);
                rc = STK_EFORMAT;
                goto out;
            }
            *ch = (pqchunk){(uint64_t)start, (uint64_t)mc->comp, (uint64_t)mc->values, mc->codec};
        }
        pqrg *rg = &rgs[d->nrgs + g];
        *rg = (pqrg){(uint32_t)fi, (uint32_t)g, first, (uint64_t)rows, in_file};
        first += (uint64_t)rows;
        in_file += (uint64_t)rows;
    }
    if (m.num_rows < 0 || (uint64_t)m.num_rows != in_file) {
        stk__fmt(err, errlen, "%s: the footer says %" PRId64 " rows; its row groups hold %" PRIu64,
                 f->name, m.num_rows, in_file);
        rc = STK_EFORMAT;
        goto out;
    }
    d->nrgs = nr;
out:
    free_cols(cols, ncols);
    meta_free(&m);
    stk__free(foot);
    return rc;
}

/* The _type of a Hugging Face feature (a Sequence's or a list's element's). */
static const char *hf_type(json_t *f)
{
    for (int depth = 0; depth < 4 && f; depth++) {
        if (json_is_array(f)) {
            f = json_array_get(f, 0);
            continue;
        }
        const char *ty = json_string_value(json_object_get(f, "_type"));
        if (!ty || (strcmp(ty, "Sequence") && strcmp(ty, "List") && strcmp(ty, "LargeList")))
            return ty;
        f = json_object_get(f, "feature");
    }
    return NULL;
}

/* Which columns the "huggingface" metadata (the datasets library's
 * {"info": {"features": {NAME: {"_type": ...}}}}) says hold Audio, Video or
 * Pdf: their {bytes, path} structs are no images. Metadata that does not
 * parse is ignored (the columns are typed by their layout alone). */
static void hf_media(pq *d, const uint8_t *js, size_t n)
{
    json_t *root = js ? json_loadb((const char *)js, n, 0, NULL) : NULL;
    json_t *feats = json_object_get(json_object_get(root, "info"), "features");
    const char *name;
    json_t *f;
    json_object_foreach(feats, name, f)
    {
        const char *ty = hf_type(f);
        if (ty && (!strcmp(ty, "Audio") || !strcmp(ty, "Video") || !strcmp(ty, "Pdf")) &&
            d->nhf_other < 16 && strlen(name) < sizeof d->hf_other[0])
            strcpy(d->hf_other[d->nhf_other++], name);
    }
    json_decref(root);
}

/* Whether column path's top-level name is one hf_media found. */
static bool hf_not_image(const pq *d, const char *path)
{
    size_t top = strcspn(path, ".");
    for (unsigned k = 0; k < d->nhf_other; k++)
        if (strlen(d->hf_other[k]) == top && !memcmp(d->hf_other[k], path, top))
            return true;
    return false;
}

/* The fields: every leaf column that is not repeated, by its path, and for
 * Hugging Face's Image struct (G.bytes, G.path) also G itself. */
static int make_fields(pq *d)
{
    d->nfields = 0;
    d->payload = -1;
    for (size_t c = 0; c < d->ncols && d->nfields < STK__MAX_FIELDS; c++) {
        pqcol *col = &d->cols[c];
        if (col->bad)
            continue;
        size_t pl = strlen(col->path);
        /* HF's Image: a struct whose members are bytes then path. */
        bool img_bytes = pl > 6 && !strcmp(col->path + pl - 6, ".bytes") &&
                         col->type == T_BYTE_ARRAY && c + 1 < d->ncols &&
                         !strncmp(d->cols[c + 1].path, col->path, pl - 5) &&
                         !strcmp(d->cols[c + 1].path + pl - 5, "path");
        int32_t elem = col->list ? PQ_ELEM_ANY : PQ_ELEM_NONE;
        if (img_bytes) {
            /* The struct's own name (its path less ".bytes") gives the bytes:
             * an image, unless the metadata says it is HF's Audio, Video or
             * Pdf (then its bytes as stored). */
            bool media = hf_not_image(d, col->path);
            col->kind = media ? STK_FIELD_BYTES : STK_FIELD_IMAGE;
            d->fields[d->nfields++] = (pqfield){(uint32_t)c, elem, true};
            if (d->payload < 0 && !col->list && !media)
                d->payload = (int)d->nfields - 1;
            if (d->nfields >= STK__MAX_FIELDS)
                break;
        }
        d->fields[d->nfields++] = (pqfield){(uint32_t)c, elem, false};
        if (col->list)
            continue;
        if (d->payload < 0 && (col->kind == STK_FIELD_IMAGE ||
                               (col->kind == STK_FIELD_AUTO &&
                                stk_field_kind_for_name(col->path) == STK_FIELD_IMAGE)))
            d->payload = (int)d->nfields - 1;
    }
    if (d->payload < 0)
        for (size_t f = 0; f < d->nfields && d->payload < 0; f++)
            if (d->cols[d->fields[f].col].kind == STK_FIELD_AUTO && !d->cols[d->fields[f].col].list)
                d->payload = (int)f;
    return STK_OK;
}

/* Field fd's name: the column's path; the image struct's own field the
 * path less ".bytes"; a list's element "images[3]", "images[3].path" (the
 * description's "images[]"). */
static void field_name(const pq *d, const pqfield *fd, char *buf, size_t n)
{
    const pqcol *c = &d->cols[fd->col];
    size_t pl = strlen(c->path);
    if (fd->elem == PQ_ELEM_NONE) {
        stk__fmt(buf, n, "%.*s", (int)(fd->alias ? pl - 6 : pl), c->path);
        return;
    }
    const char *member = c->path + c->elem_len;
    size_t ml = fd->alias ? strlen(member) - 6 : strlen(member);
    char at[16] = "";
    if (fd->elem >= 0)
        stk__fmt(at, sizeof at, "%" PRId32, fd->elem);
    stk__fmt(buf, n, "%.*s[%s]%.*s", (int)c->list_len, c->path, at, (int)ml, member);
}

static int describe_fields(stk__source *s, const pq *d)
{
    for (size_t f = 0; f < d->nfields; f++) {
        char name[1100];
        field_name(d, &d->fields[f], name, sizeof name);
        int id = stk__source_add_field(s, name, strlen(name), d->cols[d->fields[f].col].kind,
                                       UINT64_MAX);
        if (id < 0)
            return STK_ENOMEM;
        /* "image.bytes" repeats "image" (made just before it); "images[]"
         * stands for a list. */
        s->fields[id].nocopy = d->fields[f].elem == PQ_ELEM_ANY ||
                               (f && !d->fields[f].alias && d->fields[f - 1].alias &&
                                d->fields[f - 1].col == d->fields[f].col &&
                                d->fields[f - 1].elem == d->fields[f].elem);
    }
    return STK_OK;
}

/* The source's field_named op: a list's element, "images[3]" (or
 * "images[3].path"), added to the fields when the dataset has the list
 * ("images[]" in the description). Nothing is read: a row whose list is
 * shorter lacks the field. */
static int pq_field_named(stk__source *s, const char *name, size_t len)
{
    pq *d = s->impl;
    const char *lb = memchr(name, '[', len);
    if (!lb || d->nfields >= STK__MAX_FIELDS || s->nfields != d->nfields)
        return -1;
    const char *q = lb + 1, *end = name + len;
    uint64_t i = 0;
    if (q == end || *q < '0' || *q > '9')
        return -1;
    while (q < end && *q >= '0' && *q <= '9' && i < PQ_ELEM_MAX)
        i = i * 10 + (uint64_t)(*q++ - '0');
    if (q == end || *q != ']' || i >= PQ_ELEM_MAX)
        return -1;
    q++;
    for (size_t f = 0; f < d->nfields; f++) {
        const pqfield *fd = &d->fields[f];
        if (fd->elem != PQ_ELEM_ANY)
            continue;
        char want[1100];
        field_name(d, fd, want, sizeof want);
        /* want is "LIST[]MEMBER": the name must be LIST[i]MEMBER. */
        size_t ll = (size_t)(lb - name), ml = (size_t)(end - q);
        if (strlen(want) != ll + 2 + ml || memcmp(want, name, ll) || memcmp(want + ll, "[]", 2) ||
            memcmp(want + ll + 2, q, ml))
            continue;
        int id = stk__source_add_field(s, name, len, d->cols[fd->col].kind, UINT64_MAX);
        if (id < 0)
            return -1;
        d->fields[d->nfields++] = (pqfield){fd->col, (int32_t)i, fd->alias};
        return id;
    }
    return -1;
}

/* The source's each_value op (stoker verify): every element of each list
 * column of row i, named "images[3]", "images[3].path" (a read gives only
 * the elements asked for by name), and the value of each image column that
 * is no list (a read gives it unchecked). "images[].bytes" after the
 * struct's own "images[]" is the same column: given once. Null values and
 * elements are left out (a field the row lacks). */
static int pq_each_value(stk__source *s, uint64_t i,
                         int (*fn)(void *, const char *, int, const uint8_t *, size_t), void *user,
                         char *err, size_t errlen)
{
    pq *d = s->impl;
    size_t g = rg_of(d, i);
    uint64_t r = i - d->rgs[g].first;
    int rc = STK_OK;
    for (size_t f = 0; f < d->nfields && !rc; f++) {
        const pqfield *fd = &d->fields[f];
        const pqcol *c = &d->cols[fd->col];
        char name[1100], why[STK_ERRMSG_MAX] = "";
        field_name(d, fd, name, sizeof name);
        bool again = f && !fd->alias && d->fields[f - 1].alias && d->fields[f - 1].col == fd->col;
        bool image =
            c->kind == STK_FIELD_IMAGE ||
            (c->kind == STK_FIELD_AUTO && stk_field_kind_for_name(name) == STK_FIELD_IMAGE);
        if (again || fd->elem >= 0 || (fd->elem == PQ_ELEM_NONE && !image))
            continue;
        pqdec *idx = NULL, *e = NULL;
        uint64_t rr;
        if ((rc = get_row(d, g, fd->col, r, &idx, &e, &rr, why, sizeof why))) {
            stk__fmt(err, errlen, "field '%s': %s", name, why);
        } else {
            /* A list's elements are checked when they are images (an
             * element's name, "tokens[3]", never makes it one): the others
             * only had to decode, which get_row did. */
            uint64_t n = 1;
            if (fd->elem == PQ_ELEM_ANY)
                n = e->rowstart && c->kind == STK_FIELD_IMAGE
                        ? e->rowstart[rr + 1] - e->rowstart[rr]
                        : 0;
            for (uint64_t j = 0; j < n && j < PQ_ELEM_MAX && !rc; j++) {
                pqfield one = *fd;
                if (fd->elem == PQ_ELEM_ANY) {
                    one.elem = (int32_t)j;
                    field_name(d, &one, name, sizeof name);
                }
                const uint8_t *p;
                size_t len;
                if (field_value(&one, e, rr, &p, &len))
                    rc = fn(user, name, c->kind, p, len);
            }
        }
        /* The new pins first, then the row before's: a chunk both use
         * stays in the cache. */
        put_chunk(d, d->held[2 * f]);
        put_chunk(d, d->held[2 * f + 1]);
        d->held[2 * f] = e;
        d->held[2 * f + 1] = idx;
    }
    return rc;
}

/* Folds chunk e's labels into *maxl; a value that is no class (not 0 to
 * 2^31) makes the dataset unlabeled. */
static void labels_of(pq *d, const pqdec *e, int64_t *maxl)
{
    for (uint64_t r = 0; r < e->rows; r++) {
        int64_t v;
        if (e->isnull[r])
            continue;
        if (!text_int(dec_ptr(e, r), dec_len(e, r), &v) || v < 0 || v > INT32_MAX) {
            d->label = -1;
            *maxl = -1;
            return;
        }
        if (v > *maxl)
            *maxl = v;
    }
}

/* Remote: the label chunks of row groups [g0, g0 + n) read in one batch of
 * requests (not through the units, which would fetch the whole dataset),
 * then decoded. One that cannot be read or decoded is left for its rows'
 * reads to report. */
static int scan_labels_remote(pq *d, size_t g0, size_t n, int64_t *maxl)
{
    stk__trange *rs = stk__calloc(n, sizeof *rs);
    stk__trange **rp = stk__calloc(n, sizeof *rp);
    int rc = rs && rp ? STK_OK : STK_ENOMEM;
    char(*keys)[256] = d->cache ? stk__calloc(n, sizeof *keys) : NULL, kwhy[STK_ERRMSG_MAX];
    size_t m = 0;
    if (d->cache && !keys)
        rc = STK_ENOMEM;
    for (size_t k = 0; k < n && !rc; k++) {
        const pqchunk *ch = &d->chunks[(g0 + k) * d->ncols + (size_t)d->label];
        const pqfile *f = &d->files[d->rgs[g0 + k].file];
        rs[k] = (stk__trange){.obj = f->obj, .off = ch->start, .len = ch->size};
        if (!(rs[k].buf = stk__malloc(ch->size ? (size_t)ch->size : 1)))
            rc = STK_ENOMEM;
        /* With a disk cache, the chunk is an entry there (a second open
         * reads none of them from the network). */
        if (!rc && keys) {
            pqrange one = {ch->start, ch->size, NULL};
            unit_key(d, f, &one, 1, (size_t)ch->size, keys[k], sizeof keys[k]);
            if (ch->size && unit_from_cache(d, keys[k], rs[k].buf, (size_t)ch->size)) {
                keys[k][0] = '\0'; /* read: not stored again */
                continue;
            }
        }
        rp[m++] = &rs[k];
    }
    if (!rc)
        d->tp->ops->read(d->tp, rp, m);
    for (size_t k = 0; k < n && !rc && keys; k++)
        if (keys[k][0] && rs[k].len &&
            check_read(&d->files[d->rgs[g0 + k].file], &rs[k], kwhy, sizeof kwhy) == STK_OK)
            unit_to_cache(d, keys[k], rs[k].buf, (size_t)rs[k].len);
    for (size_t k = 0; k < n && !rc && d->label >= 0; k++) {
        const pqrg *rg = &d->rgs[g0 + k];
        const pqchunk *ch = &d->chunks[(g0 + k) * d->ncols + (size_t)d->label];
        char why[STK_ERRMSG_MAX];
        pqdec *e = NULL;
        pqspan sp = {ch->start, ch->start, (size_t)ch->size, (size_t)ch->size, ch->codec};
        if (check_read(&d->files[rg->file], &rs[k], why, sizeof why))
            continue;
        rc = decode_chunk(&d->cols[d->label], &sp, rs[k].buf, rg->rows, d->rows_max, d->page_max,
                          &e, why, sizeof why);
        if (!rc)
            labels_of(d, e, maxl);
        dec_free(e);
        rc = rc == STK_ENOMEM ? rc : STK_OK;
    }
    for (size_t k = 0; rs && k < n; k++)
        stk__free(rs[k].buf);
    stk__free(keys);
    stk__free(rp);
    stk__free(rs);
    return rc;
}

/* Scans the label column for num_classes: values 0..2^31, else unlabeled.
 * Row groups that cannot be decoded are left for their reads to report. */
static int scan_labels(pq *d, int64_t *maxl)
{
    *maxl = -1;
    for (size_t g = 0; g < d->nrgs && d->label >= 0; g++) {
        if (d->tp) {
            size_t n = d->nrgs - g < PQ_OPEN_BATCH ? d->nrgs - g : PQ_OPEN_BATCH;
            int rc = scan_labels_remote(d, g, n, maxl);
            if (rc)
                return rc;
            g += n - 1;
            continue;
        }
        pqdec *e;
        char why[STK_ERRMSG_MAX];
        int rc = load_chunk(d, g, (size_t)d->label, &e, why, sizeof why);
        if (rc == STK_ENOMEM)
            return rc;
        if (rc)
            continue;
        labels_of(d, e, maxl);
        dec_free(e);
    }
    return STK_OK;
}

/* Every file's footer (local files, or the fuzz entry point's bytes). */
static int open_files(pq *d, char *err, size_t errlen)
{
    int rc = STK_OK;
    for (size_t k = 0; k < d->nfiles && !rc; k++)
        rc = open_file(d, k, err, errlen);
    return rc;
}

/* What follows reading the footers: the fields, the labels, the shards. */
static int open_all(stk__source *s, pq *d, char *err, size_t errlen)
{
    int rc;
    if (!d->nrgs || !(d->rgs[d->nrgs - 1].first + d->rgs[d->nrgs - 1].rows)) {
        stk__fmt(err, errlen, "%s: its %zu Parquet files hold no rows", d->files[0].name,
                 d->nfiles);
        return STK_EEMPTY;
    }
    make_fields(d);
    d->label = -1;
    for (size_t c = 0; c < d->ncols; c++)
        if (!strcmp(d->cols[c].path, "label") && !d->cols[c].bad && !d->cols[c].list &&
            (d->cols[c].type == T_INT32 || d->cols[c].type == T_INT64))
            d->label = (int)c;
    int64_t maxl = -1;
    if ((rc = scan_labels(d, &maxl))) {
        stk__fmt(err, errlen, "out of memory while reading the labels of %s", d->files[0].name);
        return rc;
    }
    s->num_classes = (uint64_t)(maxl + 1);
    s->count = d->rgs[d->nrgs - 1].first + d->rgs[d->nrgs - 1].rows;
    if (!(s->shard_first = stk__calloc(d->nrgs + 1, sizeof *s->shard_first)))
        return STK_ENOMEM;
    for (size_t g = 0; g < d->nrgs; g++)
        s->shard_first[g] = d->rgs[g].first;
    s->shard_first[d->nrgs] = s->count;
    s->nshards = d->nrgs;
    bool image =
        d->payload >= 0 &&
        (d->cols[d->fields[d->payload].col].kind == STK_FIELD_IMAGE ||
         (d->cols[d->fields[d->payload].col].kind == STK_FIELD_AUTO &&
          stk_field_kind_for_name(d->cols[d->fields[d->payload].col].path) == STK_FIELD_IMAGE));
    s->ops = image ? &k_pq_ops : &k_pq_bytes_ops;
    /* The cache needs no more than the dataset could decode to (numbers as
     * text may take more than their stored bytes: it then evicts more). */
    if (d->budget > 2 * d->total_bytes + (1u << 20))
        d->budget = (size_t)(2 * d->total_bytes + (1u << 20));
    s->index_bytes = sizeof *d + d->nfiles * sizeof *d->files + d->ncols * sizeof *d->cols +
                     d->nrgs * (sizeof *d->rgs + d->ncols * sizeof *d->chunks) +
                     (d->nrgs + 1) * sizeof *s->shard_first + d->budget;
    for (size_t k = 0; k < d->nfiles; k++)
        s->index_bytes += strlen(d->files[k].path) + strlen(d->files[k].name) + 2;
    for (size_t c = 0; c < d->ncols; c++)
        s->index_bytes += strlen(d->cols[c].path) + 1;
    uint64_t big = 0; /* the spare read buffer: a chunk's stored bytes at most */
    for (size_t k = 0; k < d->nrgs * d->ncols; k++)
        if (d->chunks[k].size > big)
            big = d->chunks[k].size;
    s->index_bytes += (size_t)(big < PQ_SPARE_MAX ? big : PQ_SPARE_MAX);
    if (d->tp) {
        /* Remote: the units kept, no more than the dataset's bytes. */
        if (d->ubudget > d->total_bytes)
            d->ubudget = (size_t)d->total_bytes;
        s->index_bytes += d->ubudget;
    }
    return STK_OK;
}

static pq *pq_new(size_t nfiles)
{
    pq *d = stk__calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->payload = -1;
    d->label = -1;
    d->rows_max = PQ_RG_ROWS_MAX;
    d->page_max = PQ_PAGE_MAX;
    d->budget = PQ_CACHE_BYTES;
    d->ubudget = stk__parquet_unit_bytes;
    if (!(d->files = stk__calloc(nfiles ? nfiles : 1, sizeof *d->files)) ||
        pthread_mutex_init(&d->mu, NULL)) {
        stk__free(d->files);
        stk__free(d);
        return NULL;
    }
    d->mu_ok = true;
    if (pthread_mutex_init(&d->umu, NULL)) {
        pq_free(d);
        return NULL;
    }
    if (pthread_cond_init(&d->ucv, NULL)) {
        pthread_mutex_destroy(&d->umu);
        pq_free(d);
        return NULL;
    }
    d->u_ok = true;
    return d;
}

int stk__source_parquet_open(stk__source *s, const char *const *paths, const char *const *shown,
                             size_t n, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    pq *d = pq_new(n);
    int rc = STK_OK;
    if (!d)
        return STK_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        pqfile *f = &d->files[k];
        f->fd = -1;
        d->nfiles = k + 1;
        if (!(f->path = stk__strdup(paths[k])) ||
            !(f->name = stk__strdup(shown ? shown[k] : paths[k]))) {
            rc = STK_ENOMEM;
            goto out;
        }
        int fd = stk__open(f->path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || stk__fstat(fd, &st) != 0) {
            int e = errno;
            if (fd >= 0)
                stk__close(fd);
            stk__fmt(err, errlen, "%s: %s", f->name, strerror(e));
            rc = e == ENOENT ? STK_ENOENT : STK_EIO;
            goto out;
        }
        f->size = (uint64_t)st.st_size;
        d->total_bytes += f->size;
        if (n <= PQ_KEEP_FDS)
            f->fd = fd;
        else
            stk__close(fd);
    }
    if ((rc = open_files(d, err, errlen)) || (rc = open_all(s, d, err, errlen)))
        goto out;
    s->impl = d;
    if ((rc = describe_fields(s, d))) {
        stk__fmt(err, errlen, "out of memory while opening %s", paths[0]);
        stk__source_close(s);
        return rc;
    }
    return STK_OK;
out:
    pq_free(d);
    s->impl = NULL;
    stk__source_free_common(s);
    return rc;
}

/* ---- Remote open ------------------------------------------------------------------ */

/* Reads ranges rs[0..n) of files [k0, k0 + n) in one batch; each checked
 * (against the size and version the probe saw, once it has). */
static int read_batch(pq *d, size_t k0, stk__trange *rs, size_t n, bool probe,
                      const uint64_t *sizes, char *err, size_t errlen)
{
    stk__trange *rp[PQ_OPEN_BATCH] = {0};
    for (size_t k = 0; k < n; k++)
        rp[k] = &rs[k];
    d->tp->ops->read(d->tp, rp, n);
    for (size_t k = 0; k < n; k++) {
        pqfile *f = &d->files[k0 + k];
        char why[STK_ERRMSG_MAX];
        if (probe && !rs[k].rc) {
            /* The first read learns the size and version. */
            f->size = rs[k].total;
            stk__fmt(f->version, sizeof f->version, "%s", rs[k].version);
            if (!rs[k].total) {
                stk__fmt(err, errlen, "%s: the server did not say its size (Content-Range)",
                         f->name);
                return STK_EIO;
            }
            if (sizes && sizes[k0 + k] != f->size) {
                stk__fmt(err, errlen,
                         "%s: the listing says %" PRIu64 " bytes, the server sends %" PRIu64,
                         f->name, sizes[k0 + k], f->size);
                return STK_EIO;
            }
        }
        int rc = check_read(f, &rs[k], why, sizeof why);
        if (rc) {
            /* A file of fewer than 4 bytes: its probe is a short read. */
            stk__fmt(err, errlen, "%s: %s", f->name, why);
            return rc == STK_ECHANGED_ ? STK_EIO : rc;
        }
    }
    return STK_OK;
}

/* The footers of files [k0, k0 + n): each file's first 4 bytes (its size
 * and version with them), then its last PQ_TAIL_READ bytes, then, only
 * when its footer is longer, the whole footer; each step one batch of
 * requests in flight together. */
static int read_tails(pq *d, size_t k0, size_t n, const uint64_t *sizes, char *err, size_t errlen)
{
    stk__trange *rs = stk__calloc(n, sizeof *rs);
    int rc = STK_OK;
    if (!rs)
        return STK_ENOMEM;
    for (size_t k = 0; k < n; k++)
        rs[k] = (stk__trange){.obj = d->files[k0 + k].obj, .len = 4, .buf = d->files[k0 + k].head};
    if ((rc = read_batch(d, k0, rs, n, true, sizes, err, errlen)))
        goto out;
    for (size_t k = 0; k < n; k++) {
        pqfile *f = &d->files[k0 + k];
        uint64_t want = f->size < PQ_TAIL_READ ? f->size : PQ_TAIL_READ;
        if (!(f->tail = stk__malloc((size_t)want))) {
            rc = STK_ENOMEM;
            goto out;
        }
        f->tail_at = f->size - want;
        f->tail_len = (size_t)want;
        rs[k] = (stk__trange){.obj = f->obj, .off = f->tail_at, .len = want, .buf = f->tail};
    }
    if ((rc = read_batch(d, k0, rs, n, false, NULL, err, errlen)))
        goto out;
    /* A footer longer than the tail (rare: thousands of row groups) is read
     * whole by a request of its own; a length open_file refuses is left
     * for it to report. */
    for (size_t k = 0; k < n; k++) {
        pqfile *f = &d->files[k0 + k];
        if (f->tail_len < 12)
            continue;
        uint32_t fl = stk__le32(f->tail + f->tail_len - 8);
        if ((uint64_t)fl + 8 <= f->tail_len || fl > PQ_FOOTER_MAX || fl > f->size - 12)
            continue;
        size_t want = (size_t)fl + 8;
        uint8_t *b = stk__malloc(want);
        if (!b) {
            rc = STK_ENOMEM;
            goto out;
        }
        stk__free(f->tail);
        f->tail = b;
        f->tail_at = f->size - want;
        f->tail_len = want;
        rs[0] = (stk__trange){.obj = f->obj, .off = f->tail_at, .len = want, .buf = b};
        if ((rc = read_batch(d, k0 + k, rs, 1, false, NULL, err, errlen)))
            goto out;
    }
out:
    stk__free(rs);
    return rc;
}

/* Parquet files names[0..n) in the store r (taken over: closed with the
 * source, also on failure), read by ranges through its transport: the
 * footers at the open (read_tails), then a row group's unit at its first
 * read. sizes (NULL: none) are the listing's. */
int stk__source_parquet_open_remote(stk__source *s, struct stk__remote *r, const char *const *names,
                                    const uint64_t *sizes, size_t n, const stk__source_params *prm,
                                    char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->remote = r;
    pq *d = pq_new(n);
    int rc = STK_OK;
    if (!d || stk__transport_remote(&d->tp, r)) {
        rc = STK_ENOMEM;
        goto out;
    }
    d->cancel = prm ? prm->cancel : NULL;
    if (prm && prm->cache_dir && prm->cache_dir[0]) {
        char why[STK_ERRMSG_MAX];
        if ((rc = stk__cache_open(&s->cache, prm->cache_dir, prm->cache_limit, why, sizeof why))) {
            stk__fmt(err, errlen, "%s: cache_dir %s: %s", stk__remote_display(r), prm->cache_dir,
                     why);
            goto out;
        }
        d->cache = s->cache;
    }
    for (size_t k = 0; k < n; k++) {
        pqfile *f = &d->files[k];
        char shown[4096];
        stk__tinfo info;
        f->fd = -1;
        d->nfiles = k + 1;
        d->tp->ops->display(d->tp, names[k], shown, sizeof shown);
        if (!(f->path = stk__strdup(names[k])) || !(f->name = stk__strdup(shown)) ||
            d->tp->ops->open(d->tp, names[k], &f->obj, &info, err, errlen)) {
            rc = STK_ENOMEM;
            goto out;
        }
    }
    for (size_t k0 = 0; k0 < n; k0 += PQ_OPEN_BATCH) {
        size_t m = n - k0 < PQ_OPEN_BATCH ? n - k0 : PQ_OPEN_BATCH;
        if ((rc = read_tails(d, k0, m, sizes, err, errlen)))
            goto out;
        for (size_t k = k0; k < k0 + m; k++) {
            d->total_bytes += d->files[k].size;
            rc = open_file(d, k, err, errlen);
            stk__free(d->files[k].tail); /* the footer is parsed */
            d->files[k].tail = NULL;
            if (rc)
                goto out;
        }
    }
    if ((rc = open_all(s, d, err, errlen)))
        goto out;
    s->impl = d;
    if ((rc = describe_fields(s, d))) {
        stk__fmt(err, errlen, "out of memory while opening %s", d->files[0].name);
        stk__source_close(s);
        return rc;
    }
    return STK_OK;
out:
    if (rc == STK_ENOMEM)
        stk__fmt(err, errlen, "out of memory while opening %s", stk__remote_display(r));
    pq_free(d);
    s->impl = NULL;
    stk__source_free_common(s);
    return rc;
}

/* ---- Fuzz entry point ----------------------------------------------------------- */

int stk__parquet_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                              size_t errlen)
{
    stk__source s;
    memset(&s, 0, sizeof s);
    *samples = 0;
    pq *d = pq_new(1);
    if (!d)
        return STK_ENOMEM;
    d->files[0] = (pqfile){.path = stk__strdup("fuzz.parquet"),
                           .name = stk__strdup("fuzz.parquet"),
                           .fd = -1,
                           .size = n,
                           .mem = buf};
    d->nfiles = 1;
    d->rows_max = 1u << 16; /* bounded memory under the fuzzer */
    d->page_max = 16u << 20;
    d->budget = 1u << 20;
    int rc = d->files[0].path && d->files[0].name ? open_files(d, err, errlen) : STK_ENOMEM;
    if (!rc)
        rc = open_all(&s, d, err, errlen);
    if (rc)
        goto out;
    s.impl = d;
    *samples = s.count;
    /* Every row through every field, as the loader would read it, and the
     * first two elements of each list. */
    for (size_t f = 0, nf = d->nfields; f < nf && d->nfields + 2 <= STK__MAX_FIELDS; f++)
        if (d->fields[f].elem == PQ_ELEM_ANY) {
            d->fields[d->nfields++] = (pqfield){d->fields[f].col, 0, d->fields[f].alias};
            d->fields[d->nfields++] = (pqfield){d->fields[f].col, 1, d->fields[f].alias};
        }
    pq_select(&s, d->nfields >= 64 ? UINT64_MAX : ((uint64_t)1 << d->nfields) - 1, err, errlen);
    stk__scratch sc = {.limit = 64u << 20};
    stk__sink sink = {.grow = &sc};
    stk__field_set *fs = stk__malloc(sizeof *fs);
    if (!fs) {
        rc = STK_ENOMEM;
        goto done;
    }
    /* At most about 4096 rows, spread over the file: a row's cost is bounded
     * (one page), the number of rows is not. */
    uint64_t step = s.count > 4096 ? s.count / 4096 : 1;
    for (uint64_t i = 0; i < s.count; i += step) {
        uint8_t *data;
        size_t len;
        int64_t label;
        char why[STK_ERRMSG_MAX];
        if (pq_read(&s, i, &sink, &data, &len, &label, why, sizeof why))
            continue;
        if (split_record(d->nfields, data, len, fs, why, sizeof why)) {
            stk__fmt(err, errlen, "row %" PRIu64 ": the reader's own record does not split", i);
            rc = STK_EINVAL;
            break;
        }
    }
    stk__free(fs);
done:
    stk__scratch_free(&sc);
out:
    pq_free(d);
    stk__free(s.shard_first);
    return rc;
}
