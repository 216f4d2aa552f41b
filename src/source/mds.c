/*
 * mds.c -- MosaicML Streaming (MDS) datasets, read in place from a local
 * directory: index.json (version 2) and its shard.NNNNN.mds shards, or
 * .mds.zstd shards decompressed once into a private temporary area
 * (docs/formats.md, "Reading MDS in place").
 *
 * The layout, as mosaicml/streaming writes it (streaming/base/format/mds/
 * writer.py, reader.py, encodings.py):
 *
 *   shard   = u32 n | u32 offsets[n + 1] | config JSON | records
 *   record  = u32 size of each variable-size column, in column order
 *             | each column's bytes, in column order
 *
 * All integers are little-endian; offsets are absolute positions in the
 * (decompressed) shard, record k being [offsets[k], offsets[k + 1]).
 * index.json lists every shard with its columns (names in sorted order, the
 * encodings, and the fixed size of each fixed-size column or null), its
 * sample count and its files (raw_data, and zip_data when compressed).
 *
 * A sample is its whole record: one range, located from the offsets table
 * kept in memory; the `fields` op splits it into its columns. Without
 * fields, a read gives the payload column (the first image column, else the
 * first bytes column) and the label (an integer column named "label" or
 * "cls"), so a loader without fields reads an MDS image dataset as it reads
 * any other.
 *
 * Everything in index.json and the shards is untrusted: sample counts are
 * checked against the shard's own, the offsets table against the file, the
 * column sizes against the record (a sample whose sizes disagree fails with
 * its shard and offset), encodings against the list this reader knows. pkl
 * columns (Python pickles) are refused at open: stoker never unpickles.
 */
#include "source/source.h"
#include "source/offtab.h"
#include "source/unpack.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MDS_KEEP_FDS          256          /* shards whose descriptors stay open */
#define MDS_INDEX_MAX         (256u << 20) /* bytes of index.json read */
#define MDS_MAX_SHARD_SAMPLES (1u << 28)

/* Column encodings (encodings.py's _encodings). */
enum {
    E_BYTES,
    E_STR,
    E_JSON,
    E_JPEG,
    E_PNG,
    E_PIL,
    E_LIST,
    E_NDARRAY,
    E_STR_INT,
    E_STR_FLOAT,
    E_STR_DECIMAL,
    E_INT,
    E_UINT,
    E_FLOAT16,
    E_FLOAT32,
    E_FLOAT64
};

typedef struct mcol {
    char *name;
    char *encoding; /* as index.json writes it, for messages */
    int enc;
    uint32_t size; /* fixed size in bytes; 0: variable (a u32 in the header) */
    int kind;      /* enum stk_field_kind the source gives it */
} mcol;

typedef stk__otshard mshard; /* offtab.h */
typedef stk__otrd mrd;
static const stk__otwords k_mds_words = {"shard", "record", "samples", ""};

typedef struct mds {
    mcol *cols;
    size_t ncols, nvar;
    mshard *shards;
    size_t n;
    uint64_t total_bytes; /* the shard files as stored */
    int payload;          /* column a read without fields gives */
    int label;            /* column giving labels, or -1 */
    bool whole;           /* select was called: reads give the whole record */
    stk__unpack_area tmp; /* the decompressed shards' area */
} mds;

/* One shard as index.json describes it. */
typedef struct mshard_info {
    const char *raw, *zip;
    uint64_t raw_bytes, zip_bytes, samples;
    const char *raw_xxh64;
} mshard_info;

/* ---- Encodings ------------------------------------------------------------ */

static const struct {
    const char *name;
    int enc;
    uint32_t size;
    int kind;
} k_encs[] = {
    {"bytes", E_BYTES, 0, STK_FIELD_AUTO},
    {"str", E_STR, 0, STK_FIELD_TEXT},
    {"json", E_JSON, 0, STK_FIELD_JSON},
    {"jpeg", E_JPEG, 0, STK_FIELD_IMAGE},
    {"png", E_PNG, 0, STK_FIELD_IMAGE},
    {"pil", E_PIL, 0, STK_FIELD_BYTES},
    {"list[pil]", E_LIST, 0, STK_FIELD_BYTES},
    {"list[jpeg]", E_LIST, 0, STK_FIELD_BYTES},
    {"list[png]", E_LIST, 0, STK_FIELD_BYTES},
    {"jpeg_array", E_LIST, 0, STK_FIELD_BYTES},
    {"jpegarray", E_LIST, 0, STK_FIELD_BYTES},
    {"str_int", E_STR_INT, 0, STK_FIELD_INT},
    {"str_float", E_STR_FLOAT, 0, STK_FIELD_FLOAT},
    {"str_decimal", E_STR_DECIMAL, 0, STK_FIELD_TEXT},
    {"int", E_INT, 8, STK_FIELD_INT},
    {"int8", E_INT, 1, STK_FIELD_INT},
    {"int16", E_INT, 2, STK_FIELD_INT},
    {"int32", E_INT, 4, STK_FIELD_INT},
    {"int64", E_INT, 8, STK_FIELD_INT},
    {"uint8", E_UINT, 1, STK_FIELD_INT},
    {"uint16", E_UINT, 2, STK_FIELD_INT},
    {"uint32", E_UINT, 4, STK_FIELD_INT},
    {"uint64", E_UINT, 8, STK_FIELD_INT},
    {"float16", E_FLOAT16, 2, STK_FIELD_FLOAT},
    {"float32", E_FLOAT32, 4, STK_FIELD_FLOAT},
    {"float64", E_FLOAT64, 8, STK_FIELD_FLOAT},
};

/* NDArray's value dtypes and their sizes. */
static uint32_t ndarray_itemsize(const char *dt, size_t n)
{
    static const struct {
        const char *name;
        uint32_t size;
    } t[] = {{"uint8", 1},   {"int8", 1},   {"uint16", 2}, {"int16", 2},
             {"float16", 2}, {"uint32", 4}, {"int32", 4},  {"float32", 4},
             {"uint64", 8},  {"int64", 8},  {"float64", 8}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (strlen(t[k].name) == n && !memcmp(t[k].name, dt, n))
            return t[k].size;
    return 0;
}

/* "ndarray", "ndarray:DTYPE" or "ndarray:DTYPE:D1,D2,...": *size is the
 * fixed size when both are given (else 0). */
static bool parse_ndarray(const char *e, uint32_t *size)
{
    *size = 0;
    if (strncmp(e, "ndarray", 7))
        return false;
    e += 7;
    if (!*e)
        return true;
    if (*e++ != ':')
        return false;
    const char *colon = strchr(e, ':');
    size_t dl = colon ? (size_t)(colon - e) : strlen(e);
    uint64_t item = ndarray_itemsize(e, dl);
    if (!item)
        return false;
    if (!colon)
        return true;
    uint64_t total = item;
    const char *p = colon + 1;
    for (;;) {
        uint64_t d = 0;
        int digits = 0;
        for (; *p >= '0' && *p <= '9' && digits < 10; p++, digits++)
            d = d * 10 + (uint64_t)(*p - '0');
        if (!digits || !d || total > UINT32_MAX / d)
            return false;
        total *= d;
        if (!*p)
            break;
        if (*p++ != ',')
            return false;
    }
    *size = (uint32_t)total;
    return true;
}

/* Fills c's encoding from its name; a message naming what is wrong. */
static int parse_encoding(mcol *c, char *why, size_t n)
{
    if (!strcmp(c->encoding, "pkl")) {
        stk__fmt(why, n,
                 "column '%s' is encoded 'pkl' (Python pickle), which can run arbitrary code "
                 "when read: stoker never unpickles; rewrite the column with a safe encoding "
                 "(bytes, str, json, ndarray, ...)",
                 c->name);
        return STK_EUNSUPPORTED;
    }
    for (size_t k = 0; k < sizeof k_encs / sizeof k_encs[0]; k++) {
        if (!strcmp(c->encoding, k_encs[k].name)) {
            c->enc = k_encs[k].enc;
            c->size = k_encs[k].size;
            c->kind = k_encs[k].kind;
            return STK_OK;
        }
    }
    if (parse_ndarray(c->encoding, &c->size)) {
        c->enc = E_NDARRAY;
        c->kind = STK_FIELD_BYTES;
        return STK_OK;
    }
    stk__fmt(why, n, "column '%s' has encoding '%.64s', which stoker does not know", c->name,
             c->encoding);
    return STK_EUNSUPPORTED;
}

/* ---- index.json ------------------------------------------------------------ */

static const char *jstr(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A non-negative integer member; false when missing or not one. */
static bool juint(const json_t *o, const char *key, uint64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* A shard file's name: a plain name inside the dataset directory. */
static bool good_basename(const char *b)
{
    return b && *b && !strchr(b, '/') && strcmp(b, ".") && strcmp(b, "..");
}

static void free_cols(mcol *c, size_t n)
{
    for (size_t k = 0; c && k < n; k++) {
        stk__free(c[k].name);
        stk__free(c[k].encoding);
    }
    stk__free(c);
}

/* The columns of shard object sh (its column_names, column_encodings,
 * column_sizes) into *cols. */
static int parse_columns(const json_t *sh, mcol **cols, size_t *ncols, size_t *nvar, char *why,
                         size_t n)
{
    const json_t *names = json_object_get(sh, "column_names");
    const json_t *encs = json_object_get(sh, "column_encodings");
    const json_t *sizes = json_object_get(sh, "column_sizes");
    if (!json_is_array(names) || !json_is_array(encs) || !json_is_array(sizes) ||
        json_array_size(names) != json_array_size(encs) ||
        json_array_size(names) != json_array_size(sizes) || !json_array_size(names)) {
        stk__fmt(why, n,
                 "column_names, column_encodings and column_sizes must be arrays of one "
                 "length (at least one column)");
        return STK_EFORMAT;
    }
    size_t nc = json_array_size(names);
    if (nc > STK__MAX_FIELDS) {
        stk__fmt(why, n, "%zu columns; stoker reads at most %d", nc, STK__MAX_FIELDS);
        return STK_EUNSUPPORTED;
    }
    mcol *c = stk__calloc(nc, sizeof *c);
    if (!c)
        return STK_ENOMEM;
    int rc = STK_OK;
    size_t v = 0;
    for (size_t k = 0; k < nc && !rc; k++) {
        const json_t *nm = json_array_get(names, k), *en = json_array_get(encs, k);
        const json_t *sz = json_array_get(sizes, k);
        if (!json_is_string(nm) || !json_is_string(en) || !*json_string_value(nm)) {
            stk__fmt(why, n, "column %zu: its name and encoding must be strings", k);
            rc = STK_EFORMAT;
            break;
        }
        if (!(c[k].name = stk__strdup(json_string_value(nm))) ||
            !(c[k].encoding = stk__strdup(json_string_value(en)))) {
            rc = STK_ENOMEM;
            break;
        }
        for (size_t j = 0; j < k; j++)
            if (!strcmp(c[j].name, c[k].name)) {
                stk__fmt(why, n, "column '%s' is named twice", c[k].name);
                rc = STK_EFORMAT;
            }
        if (rc || (rc = parse_encoding(&c[k], why, n)))
            break;
        /* The size index.json gives must be the encoding's: a reader that
         * trusted a wrong one would split every record at the wrong place. */
        bool fixed = json_is_integer(sz);
        if ((!fixed && !json_is_null(sz)) || (fixed && c[k].size != json_integer_value(sz)) ||
            (!fixed && c[k].size)) {
            char said[32], want[32];
            if (fixed)
                stk__fmt(said, sizeof said, "%lld", (long long)json_integer_value(sz));
            else
                stk__fmt(said, sizeof said, "%s", json_is_null(sz) ? "null" : "not a number");
            if (c[k].size)
                stk__fmt(want, sizeof want, "%u", c[k].size);
            else
                stk__fmt(want, sizeof want, "variable (null)");
            stk__fmt(why, n,
                     "column '%s' (%s) has column_sizes entry %s, but the encoding's size "
                     "is %s",
                     c[k].name, c[k].encoding, said, want);
            rc = STK_EFORMAT;
        }
        v += c[k].size == 0;
    }
    if (rc) {
        free_cols(c, nc);
        return rc;
    }
    *cols = c;
    *ncols = nc;
    *nvar = v;
    return STK_OK;
}

static bool same_columns(const json_t *a, const json_t *b)
{
    static const char *const keys[] = {"column_names", "column_encodings", "column_sizes"};
    for (size_t k = 0; k < 3; k++)
        if (!json_equal(json_object_get(a, keys[k]), json_object_get(b, keys[k])))
            return false;
    return true;
}

/* One shard object: its files, count and compression. */
static int parse_shard(const json_t *sh, size_t k, mshard_info *si, char *why, size_t n)
{
    const char *fmt = jstr(sh, "format"), *comp = jstr(sh, "compression");
    const json_t *ver = json_object_get(sh, "version");
    const json_t *raw = json_object_get(sh, "raw_data"), *zip = json_object_get(sh, "zip_data");
    memset(si, 0, sizeof *si);
    if (!fmt || strcmp(fmt, "mds")) {
        stk__fmt(why, n, "shard %zu has format '%s'; this reader reads 'mds' shards", k,
                 fmt ? fmt : "(none)");
        return STK_EUNSUPPORTED;
    }
    if (!json_is_integer(ver) || json_integer_value(ver) != 2) {
        stk__fmt(why, n, "shard %zu has version %lld; MDS version 2 is supported", k,
                 json_is_integer(ver) ? json_integer_value(ver) : -1);
        return STK_EUNSUPPORTED;
    }
    if (!json_is_object(raw) || !good_basename(si->raw = jstr(raw, "basename")) ||
        !juint(raw, "bytes", &si->raw_bytes) || !juint(sh, "samples", &si->samples)) {
        stk__fmt(why, n,
                 "shard %zu: raw_data needs a file name (basename) and a size (bytes), "
                 "and the shard a sample count (samples)",
                 k);
        return STK_EFORMAT;
    }
    const json_t *hashes = json_object_get(raw, "hashes");
    si->raw_xxh64 = jstr(hashes, "xxh64");
    if (comp && !json_is_null(json_object_get(sh, "compression"))) {
        if (strcmp(comp, "zstd") && strncmp(comp, "zstd:", 5)) {
            stk__fmt(why, n,
                     "shard %zu is compressed with '%s'; stoker reads zstd-compressed "
                     "shards only (decompress the others beside index.json, under their "
                     "raw_data names)",
                     k, comp);
            return STK_EUNSUPPORTED;
        }
        if (!json_is_object(zip) || !good_basename(si->zip = jstr(zip, "basename")) ||
            !juint(zip, "bytes", &si->zip_bytes)) {
            stk__fmt(why, n, "shard %zu is compressed but zip_data has no file name or size", k);
            return STK_EFORMAT;
        }
    }
    if (si->samples > MDS_MAX_SHARD_SAMPLES) {
        stk__fmt(why, n, "shard %zu claims %" PRIu64 " samples", k, si->samples);
        return STK_EFORMAT;
    }
    return STK_OK;
}

/* Parses index.json's text: the columns (one set for every shard) and the
 * shards. *root owns the strings si points into (json_decref when done). */
static int parse_index(const char *text, size_t len, json_t **root, mcol **cols, size_t *ncols,
                       size_t *nvar, mshard_info **si, size_t *nsh, char *why, size_t n)
{
    json_error_t je;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!*root) {
        stk__fmt(why, n, "not valid JSON (line %d, column %d: %s)", je.line, je.column, je.text);
        return STK_EFORMAT;
    }
    const json_t *ver = json_object_get(*root, "version");
    const json_t *shards = json_object_get(*root, "shards");
    if (!json_is_integer(ver) || json_integer_value(ver) != 2 || !json_is_array(shards)) {
        stk__fmt(why, n, "not an MDS index (wants {\"version\": 2, \"shards\": [...]})");
        return STK_EFORMAT;
    }
    size_t ns = json_array_size(shards);
    if (!ns) {
        stk__fmt(why, n, "lists no shards");
        return STK_EEMPTY;
    }
    const json_t *first = json_array_get(shards, 0);
    int rc = parse_columns(first, cols, ncols, nvar, why, n);
    if (rc)
        return rc;
    if (!(*si = stk__calloc(ns, sizeof **si)))
        return STK_ENOMEM;
    *nsh = ns;
    for (size_t k = 0; k < ns; k++) {
        const json_t *sh = json_array_get(shards, k);
        if (!json_is_object(sh)) {
            stk__fmt(why, n, "shard %zu is not an object", k);
            return STK_EFORMAT;
        }
        if ((rc = parse_shard(sh, k, &(*si)[k], why, n)))
            return rc;
        if (k && !same_columns(first, sh)) {
            stk__fmt(why, n,
                     "shard %zu (%s) has other columns than shard 0; stoker reads "
                     "datasets whose shards share one set of columns",
                     k, (*si)[k].raw);
            return STK_EUNSUPPORTED;
        }
    }
    return STK_OK;
}

/* ---- Records ------------------------------------------------------------------ */

/* Splits a record into its columns: pos[c]/len[c] inside rec. STK_EFORMAT
 * with the reason when the sizes do not add up to the record. */
static int split_record(const mds *d, const uint8_t *rec, size_t n, size_t *pos, size_t *len,
                        char *why, size_t wn)
{
    size_t head = 4 * d->nvar;
    if (n < head) {
        stk__fmt(why, wn, "record of %zu bytes is shorter than its %zu-byte size header", n, head);
        return STK_EFORMAT;
    }
    size_t at = head, v = 0;
    for (size_t c = 0; c < d->ncols; c++) {
        size_t sz = d->cols[c].size ? d->cols[c].size : stk__le32(rec + 4 * v++);
        if (sz > n - at) {
            stk__fmt(why, wn,
                     "column '%s' (%zu bytes at byte %zu) runs past the end of the "
                     "%zu-byte record",
                     d->cols[c].name, sz, at, n);
            return STK_EFORMAT;
        }
        pos[c] = at;
        len[c] = sz;
        at += sz;
    }
    if (at != n) {
        stk__fmt(why, wn,
                 "the columns take %zu of the record's %zu bytes (sizes and offsets "
                 "table disagree)",
                 at, n);
        return STK_EFORMAT;
    }
    return STK_OK;
}

/* A fixed-size integer column's value. false: a uint64 past INT64_MAX. */
static bool int_value(const mcol *c, const uint8_t *p, int64_t *out)
{
    uint64_t u = 0;
    for (uint32_t k = 0; k < c->size; k++)
        u |= (uint64_t)p[k] << (8 * k);
    if (c->enc == E_INT && c->size < 8 && (u >> (8 * c->size - 1)) & 1)
        u |= ~(uint64_t)0 << (8 * c->size); /* sign-extend */
    if (c->enc == E_UINT && u > (uint64_t)INT64_MAX) {
        *out = 0;
        return false;
    }
    memcpy(out, &u, sizeof u);
    return true;
}

static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h >> 15) ? -v : v;
}

/* A binary number column's value as decimal text that reads back exactly
 * (%.9g for float32 and float16, %.17g for float64). Returns its length. */
static int number_text(const mcol *c, const uint8_t *p, char *buf, size_t n)
{
    if (c->enc == E_INT || c->enc == E_UINT) {
        uint64_t u = 0;
        for (uint32_t k = 0; k < c->size; k++)
            u |= (uint64_t)p[k] << (8 * k);
        int64_t v;
        if (c->enc == E_UINT || !int_value(c, p, &v))
            return snprintf(buf, n, "%" PRIu64, u);
        return snprintf(buf, n, "%" PRId64, v);
    }
    if (c->enc == E_FLOAT16) {
        uint16_t h = (uint16_t)(p[0] | p[1] << 8);
        return snprintf(buf, n, "%.9g", half_value(h));
    }
    if (c->enc == E_FLOAT32) {
        uint32_t u = stk__le32(p);
        float f;
        memcpy(&f, &u, 4);
        return snprintf(buf, n, "%.9g", (double)f);
    }
    uint64_t u = (uint64_t)stk__le32(p) | (uint64_t)stk__le32(p + 4) << 32;
    double v;
    memcpy(&v, &u, 8);
    return snprintf(buf, n, "%.17g", v);
}

static bool is_binary_number(int enc)
{
    return enc >= E_INT;
}

static int mds_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                    int64_t *label, char *err, size_t errlen)
{
    const mds *d = s->impl;
    const mshard *t = &d->shards[stk__source_shard_of(s, i)];
    uint64_t off;
    size_t n;
    uint8_t *buf;
    int rc = stk__ot_read(t, i - t->first, &k_mds_words, sink, &buf, &n, &off, err, errlen);
    if (rc)
        return rc;
    size_t pos[STK__MAX_FIELDS], clen[STK__MAX_FIELDS];
    char why[STK_ERRMSG_MAX];
    if ((rc = split_record(d, buf, n, pos, clen, why, sizeof why))) {
        stk__fmt(err, errlen, "record at offset %" PRIu64 " (%zu bytes): %s", off, n, why);
        return rc;
    }
    *label = -1;
    if (d->label >= 0 && !int_value(&d->cols[d->label], buf + pos[d->label], label))
        *label = -1;
    if (d->whole) {
        *data = buf;
        *len = n;
    } else {
        *data = buf + pos[d->payload];
        *len = clen[d->payload];
    }
    return STK_OK;
}

static int mds_select(stk__source *s, uint64_t mask, char *err, size_t errlen)
{
    (void)mask;
    (void)err;
    (void)errlen;
    ((mds *)s->impl)->whole = true;
    return STK_OK;
}

/* Fills fs from a record: every column a field (field id = column index);
 * binary numbers as their decimal text in the gen area. */
static int fields_of_record(const mds *d, const uint8_t *rec, size_t n, stk__field_set *fs,
                            char *why, size_t wn)
{
    size_t pos[STK__MAX_FIELDS], len[STK__MAX_FIELDS];
    fs->n = 0;
    fs->gen_used = 0;
    int rc = split_record(d, rec, n, pos, len, why, wn);
    for (size_t c = 0; c < d->ncols && !rc; c++) {
        const mcol *col = &d->cols[c];
        if (is_binary_number(col->enc)) {
            char text[40];
            int tl = number_text(col, rec + pos[c], text, sizeof text);
            rc = stk__field_set_gen(fs, (uint32_t)c, text, (size_t)tl);
        } else {
            fs->f[fs->n++] = (stk__field_ref){(uint32_t)c, rec + pos[c], len[c]};
        }
    }
    return rc;
}

static int mds_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                      int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    const mds *d = s->impl;
    const mshard *t = &d->shards[stk__source_shard_of(s, i)];
    (void)label;
    char why[STK_ERRMSG_MAX];
    int rc = fields_of_record(d, bytes, len, fs, why, sizeof why);
    if (rc)
        stk__fmt(err, errlen, "record at offset %" PRIu32 " (%zu bytes): %s", t->off[i - t->first],
                 len, why);
    return rc;
}

static void mds_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const mds *d = s->impl;
    const mshard *t = &d->shards[stk__source_shard_of(s, i)];
    stk__ot_name(t, i - t->first, buf, n);
}

static void mds_describe(const stk__source *s, stk__dataset_info *di)
{
    const mds *d = s->impl;
    if (s->ops->flags & STK__SRC_IMAGES)
        di->payload = "encoded";
    di->shards = d->n;
    di->bytes = d->total_bytes;
}

static void mds_free(mds *d)
{
    if (!d)
        return;
    stk__ot_free(d->shards, d->n);
    stk__unpack_remove(&d->tmp);
    stk__free(d->shards);
    free_cols(d->cols, d->ncols);
    stk__free(d);
}

static void mds_close(stk__source *s)
{
    mds_free(s->impl);
    s->impl = NULL;
}

/* The payload a loader without fields reads is the first image column
 * (k_mds_ops), else the first bytes column (k_mds_bytes_ops). */
static const stk__source_ops k_mds_ops = {.kind = "mds",
                                          .read = mds_read,
                                          .name = mds_name,
                                          .close = mds_close,
                                          .select = mds_select,
                                          .fields = mds_fields,
                                          .flags = STK__SRC_IMAGES,
                                          .describe = mds_describe};
static const stk__source_ops k_mds_bytes_ops = {.kind = "mds",
                                                .read = mds_read,
                                                .name = mds_name,
                                                .close = mds_close,
                                                .select = mds_select,
                                                .fields = mds_fields,
                                                .describe = mds_describe};

/* ---- Compressed shards ----------------------------------------------------------
 * A .mds.zstd shard is decompressed once, at open, into the private area
 * $TMPDIR/stoker-mds-XXXXXX (unpack.h), removed at close; a shard with an
 * xxh64 hash is checked. */

/* Decompresses shard t (zip file t->shown, read from zpath) into the
 * temporary area. */
static int decompress_shard(mds *d, mshard *t, const char *zpath, const mshard_info *si,
                            uint64_t need, char *err, size_t errlen)
{
    stk__unpack_job j = {.codec = STK__CODEC_ZSTD,
                         .src = t->shown,
                         .local = zpath,
                         .name = si->raw,
                         .want = si->raw_bytes,
                         .want_from = "raw_data.bytes",
                         .xxh64 = si->raw_xxh64,
                         .need = need};
    return stk__unpack(&d->tmp, &j, &t->path, &t->stored, err, errlen);
}

/* ---- Open ---------------------------------------------------------------------- */

/* Opens shard k from the file fs got for it (path, shown): its zip when
 * compressed and the raw file is not there (locally Streaming's own cache
 * keeps the raw one beside the zip; a remote dataset has the zip only),
 * else the raw file; reads its offsets table. */
static int open_shard(mds *d, mshard *t, stk__files *fs, const mshard_info *si, const char *path,
                      const char *shown, uint64_t need, bool keep, char *err, size_t errlen)
{
    struct stat st;
    int rc;
    bool remote = stk__files_is_remote(fs);
    if (si->zip && (remote || stk__stat(path, &st) != 0 || (uint64_t)st.st_size != si->raw_bytes)) {
        const char *zpath = path, *zshown = shown;
        if (!remote &&
            (rc = stk__files_get(fs, &si->zip, NULL, 1, NULL, &zpath, &zshown, err, errlen)))
            return rc;
        if (!(t->shown = stk__strdup(zshown)))
            return STK_ENOMEM;
        if ((rc = decompress_shard(d, t, zpath, si, need, err, errlen)))
            return rc;
    } else if (!(t->shown = stk__strdup(shown)) || !(t->path = stk__strdup(path))) {
        return STK_ENOMEM;
    }
    return stk__ot_open(t, si->samples, keep, &k_mds_words, err, errlen);
}

/* The column a read without fields gives: the first image column, else the
 * first bytes column, else the first column. */
static int pick_payload(const mds *d)
{
    for (size_t c = 0; c < d->ncols; c++) {
        int k = d->cols[c].kind;
        if (k == STK_FIELD_IMAGE ||
            (k == STK_FIELD_AUTO && stk_field_kind_for_name(d->cols[c].name) == STK_FIELD_IMAGE))
            return (int)c;
    }
    for (size_t c = 0; c < d->ncols; c++)
        if (d->cols[c].enc == E_BYTES)
            return (int)c;
    return 0;
}

/* Reads every sample's label (two small reads each: the size header, then
 * the value) for num_classes. A label column holding a negative value, or
 * one past 2^31, is no class label: the dataset is then unlabeled. Records
 * that cannot be read are left for their reads to report. */
static int scan_labels(mds *d, int64_t *maxl, char *err, size_t errlen)
{
    const mcol *lc = &d->cols[d->label];
    size_t vbefore = 0, fixed = 0;
    for (int c = 0; c < d->label; c++) {
        vbefore += d->cols[c].size == 0;
        fixed += d->cols[c].size;
    }
    uint32_t sizes[STK__MAX_FIELDS];
    *maxl = -1;
    for (size_t k = 0; k < d->n; k++) {
        const mshard *t = &d->shards[k];
        for (uint64_t j = 0; j < t->count; j++) {
            uint64_t off;
            size_t n;
            char why[STK_ERRMSG_MAX];
            if (stk__ot_range(t, j, &off, &n, &k_mds_words, why, sizeof why) || n < 4 * d->nvar)
                continue;
            int rc = vbefore
                         ? stk__pread_at(t->fd, t->path, sizes, 4 * vbefore, off, why, sizeof why)
                         : 0;
            uint64_t at = 4 * d->nvar + fixed;
            for (size_t v = 0; v < vbefore && !rc; v++)
                at += stk__le32((const uint8_t *)&sizes[v]);
            uint8_t val[8];
            if (!rc && at + lc->size > n)
                continue; /* sizes past the record: its read reports it */
            if (!rc)
                rc = stk__pread_at(t->fd, t->path, val, lc->size, off + at, why, sizeof why);
            if (rc) {
                stk__fmt(err, errlen, "%s#%" PRIu64 ": reading its label: %s", t->shown, j, why);
                return rc;
            }
            int64_t v;
            if (!int_value(lc, val, &v) || v < 0 || v > INT32_MAX) {
                d->label = -1;
                *maxl = -1;
                return STK_OK;
            }
            if (v > *maxl)
                *maxl = v;
        }
    }
    return STK_OK;
}

static int describe_fields(stk__source *s, const mds *d)
{
    for (size_t c = 0; c < d->ncols; c++)
        if (stk__source_add_field(s, d->cols[c].name, strlen(d->cols[c].name), d->cols[c].kind,
                                  s->count) < 0)
            return STK_ENOMEM;
    return STK_OK;
}

/* Gets every shard through fs (all at once: remote ones download in
 * parallel) and opens it; fills s's shard tables. Remote: the file as
 * stored (the zip when compressed); local: the raw file first. */
static int open_shards(stk__source *s, mds *d, stk__files *fs, const mshard_info *si, size_t ns,
                       char *err, size_t errlen)
{
    uint64_t need = 0, total = 0;
    bool remote = stk__files_is_remote(fs);
    for (size_t k = 0; k < ns; k++)
        need += si[k].zip ? si[k].raw_bytes : 0;
    const char **names = stk__calloc(3 * ns + 1, sizeof *names);
    if (!names || !(d->shards = stk__calloc(ns, sizeof *d->shards)) ||
        !(s->shard_first = stk__calloc(ns + 1, sizeof *s->shard_first))) {
        stk__free(names);
        return STK_ENOMEM;
    }
    const char **paths = names + ns, **shown = names + 2 * ns;
    for (size_t k = 0; k < ns; k++)
        names[k] = remote && si[k].zip ? si[k].zip : si[k].raw;
    int rc = stk__files_get(fs, names, NULL, ns, NULL, paths, shown, err, errlen);
    for (size_t k = 0; k < ns && !rc; k++) {
        mshard *t = &d->shards[k];
        t->fd = -1;
        d->n = k + 1;
        if ((rc = open_shard(d, t, fs, &si[k], paths[k], shown[k], need, ns <= MDS_KEEP_FDS, err,
                             errlen)))
            break;
        t->first = total;
        total += t->count;
        s->shard_first[k] = t->first;
        d->total_bytes += t->stored;
        s->index_bytes += (t->count + 1) * sizeof *t->off + strlen(t->shown) + strlen(t->path) + 2;
    }
    stk__free(names);
    if (rc)
        return rc;
    s->shard_first[ns] = total;
    s->nshards = ns;
    s->count = total;
    return STK_OK;
}

int stk__source_mds_open(stk__source *s, stk__files *fs, char *err, size_t errlen)
{
    char *text = NULL;
    const char *ipath = NULL, *ishown = NULL, *iname = "index.json";
    size_t tlen = 0, ns = 0;
    json_t *root = NULL;
    mshard_info *si = NULL;
    mds *d = NULL;
    char why[STK_ERRMSG_MAX];
    int rc = STK_OK;
    memset(s, 0, sizeof *s);
    if (!(d = stk__calloc(1, sizeof *d))) {
        rc = STK_ENOMEM;
        goto out;
    }
    d->label = -1;
    d->tmp = (stk__unpack_area){.tag = "mds",
                                .what = "the dataset's .mds.zstd shards",
                                .hint = ", or decompress the shards beside index.json (zstd -d, "
                                        "under their raw_data names)"};
    if ((rc = stk__files_get(fs, &iname, NULL, 1, NULL, &ipath, &ishown, err, errlen)) ||
        (rc = stk__read_text(ipath, ishown, MDS_INDEX_MAX, &text, &tlen, err, errlen)))
        goto out;
    if ((rc = parse_index(text, tlen, &root, &d->cols, &d->ncols, &d->nvar, &si, &ns, why,
                          sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", ishown, why);
        goto out;
    }
    if ((rc = open_shards(s, d, fs, si, ns, err, errlen)))
        goto out;
    if (!s->count) {
        stk__fmt(err, errlen, "%s: its %zu shards hold no samples", ishown, ns);
        rc = STK_EEMPTY;
        goto out;
    }
    d->payload = pick_payload(d);
    for (size_t c = 0; c < d->ncols && d->label < 0; c++)
        if ((!strcmp(d->cols[c].name, "label") || !strcmp(d->cols[c].name, "cls")) &&
            (d->cols[c].enc == E_INT || d->cols[c].enc == E_UINT))
            d->label = (int)c;
    int64_t maxl = -1;
    if (d->label >= 0 && (rc = scan_labels(d, &maxl, err, errlen)))
        goto out;
    s->num_classes = (uint64_t)(maxl + 1);
    {
        const mcol *pc = &d->cols[d->payload];
        bool image =
            pc->kind == STK_FIELD_IMAGE ||
            (pc->kind == STK_FIELD_AUTO && stk_field_kind_for_name(pc->name) == STK_FIELD_IMAGE);
        s->ops = image ? &k_mds_ops : &k_mds_bytes_ops;
    }
    s->impl = d;
    s->index_bytes += sizeof *d + d->ncols * sizeof *d->cols + ns * sizeof *d->shards +
                      (ns + 1) * sizeof *s->shard_first;
    d = NULL; /* the source's now: stk__source_close frees it */
    if ((rc = describe_fields(s, s->impl))) {
        stk__fmt(err, errlen, "out of memory while opening %s", ishown);
        stk__source_close(s);
        goto out;
    }
out:
    if (rc && d) {
        mds_free(d);
        s->impl = NULL;
        stk__source_free_common(s);
    }
    if (root)
        json_decref(root);
    stk__free(si);
    stk__free(text);
    return rc;
}

int stk__mds_sniff_text(const char *text, size_t len)
{
    json_t *root = json_loadb(text, len, 0, NULL);
    const json_t *sh = json_array_get(json_object_get(root, "shards"), 0);
    const char *fmt = jstr(sh, "format");
    /* An index that does not parse but names MDS shards is still MDS: the
     * reader then says what is wrong with it. */
    int rc = (root ? fmt && !strcmp(fmt, "mds") : strstr(text, "\"mds\"") != NULL) ? 1 : 0;
    if (root)
        json_decref(root);
    return rc;
}

/* ---- Fuzz entry point --------------------------------------------------------- */

int stk__mds_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err, size_t errlen)
{
    *samples = 0;
    if (n < 4) {
        stk__fmt(err, errlen, "input too short");
        return STK_EFORMAT;
    }
    uint32_t il = stk__le32(buf);
    if (il > n - 4) {
        stk__fmt(err, errlen, "index length past the input");
        return STK_EFORMAT;
    }
    json_t *root = NULL;
    mshard_info *si = NULL;
    size_t ns = 0;
    mds d = {.label = -1};
    mshard t = {.fd = -1};
    int rc = parse_index((const char *)buf + 4, il, &root, &d.cols, &d.ncols, &d.nvar, &si, &ns,
                         err, errlen);
    if (rc)
        goto out;
    mrd r = {-1, buf + 4 + il, n - 4 - il};
    t.bytes = r.size;
    if ((rc = stk__ot_head(&r, si[0].samples, &t, &k_mds_words, err, errlen)))
        goto out;
    *samples = t.count;
    stk__field_set *fs = stk__malloc(sizeof *fs);
    if (!fs) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (uint64_t j = 0; j < t.count; j++) {
        uint64_t off;
        size_t len;
        char why[STK_ERRMSG_MAX];
        if (stk__ot_range(&t, j, &off, &len, &k_mds_words, why, sizeof why))
            continue;
        const uint8_t *rec = r.buf + off;
        if (fields_of_record(&d, rec, len, fs, why, sizeof why))
            continue;
        for (size_t k = 0; k < fs->n; k++) {
            const stk__field_ref *f = &fs->f[k];
            bool in_rec =
                f->data >= rec && f->len <= len && f->data - rec <= (ptrdiff_t)(len - f->len);
            bool in_gen = f->data >= fs->gen && f->data + f->len <= fs->gen + fs->gen_used;
            if (f->id >= d.ncols || !(in_rec || in_gen)) {
                stk__fmt(err, errlen, "field %zu of record %" PRIu64 " lies outside it", k, j);
                rc = STK_EINVAL;
            }
        }
    }
    stk__free(fs);
out:
    stk__free(t.off);
    free_cols(d.cols, d.ncols);
    stk__free(si);
    if (root)
        json_decref(root);
    return rc;
}
