/*
 * litdata.c -- LitData datasets (Lightning-AI/litData's optimize()), read in
 * place from a local directory: index.json and its chunk-R-K.bin chunks, or
 * chunk-R-K.zstd.bin chunks decompressed once into a private temporary area
 * (docs/formats.md, "Reading LitData in place"). Remote paths come with the
 * transport table.
 *
 * The layout, as litdata writes it (streaming/writer.py, item_loader.py's
 * PyTreeLoader, serializers.py):
 *
 *   chunk = u32 n | u32 offsets[n + 1] | items
 *   item  = u32 size of each pytree leaf, in leaf order | each leaf's bytes
 *
 * All integers are little-endian; offsets are absolute positions in the
 * (decompressed) chunk, item k being [offsets[k], offsets[k + 1]). A
 * compressed chunk is the whole chunk compressed as one zstd frame.
 * index.json holds {"chunks": [{"chunk_bytes", "chunk_size", "filename",
 * "dim"}...], "config": {"compression", "data_format", "data_spec",
 * "encryption", "item_loader", ...}}: chunk_size is a chunk's item count,
 * chunk_bytes its size before compression; data_format names the serializer
 * of each leaf ("int", "str", "bytes", "jpeg", "numpy", "no_header_numpy:7",
 * "file:jpg", ...); data_spec is the pytree's treespec as torch's pytree
 * serializes it (a JSON text: [protocol 1, {"type", "context",
 * "children_spec"}]), which names the leaves: a dict's keys (joined with '.'
 * when nested, list and tuple positions as numbers), or leaf_K when the
 * sample is no dict.
 *
 * A sample is its whole item: one range, located from the offsets table
 * kept in memory; the `fields` op splits it into its leaves. Without
 * fields, a read gives the payload leaf (the first image leaf, else the
 * first bytes leaf) and the label (an int leaf named "label" or "cls").
 *
 * Everything in index.json and the chunks is untrusted: item counts are
 * checked against the chunk's own, the offsets table against the file, leaf
 * sizes against the item and the serializer (an int is 8 bytes), serializer
 * names against the list this reader knows. pickle leaves (and graph, which
 * holds pickles) are refused at open: stoker never unpickles.
 */
#include "source/source.h"
#include "source/offtab.h"
#include "source/unpack.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LD_KEEP_FDS          256          /* chunks whose descriptors stay open */
#define LD_INDEX_MAX         (256u << 20) /* bytes of index.json read */
#define LD_MAX_CHUNK_SAMPLES (1u << 28)
#define LD_SPEC_DEPTH        32 /* pytree nesting accepted */
#define LD_NAME_MAX          128

/* Serializers (serializers.py's _SERIALIZERS), as this reader treats them. */
enum { S_BYTES, S_STR, S_INT, S_FLOAT, S_BOOL, S_IMAGE, S_OPAQUE };

typedef struct lleaf {
    char *name;
    char *format; /* as index.json writes it, for messages */
    int ser;
    uint32_t size; /* fixed size in bytes (int, float, bool); 0: any */
    int kind;      /* enum stk_field_kind the source gives it */
} lleaf;

typedef stk__otshard lchunk; /* offtab.h */
typedef stk__otrd lrd;
static const stk__otwords k_ld_words = {"chunk", "item", "items", " (chunk_size)"};

typedef struct ld {
    lleaf *leaves;
    size_t nleaves;
    lchunk *chunks;
    size_t n;
    uint64_t total_bytes; /* the chunk files as stored */
    int payload;          /* leaf a read without fields gives */
    int label;            /* leaf giving labels, or -1 */
    bool whole;           /* select was called: reads give the whole item */
    bool zstd;            /* the chunks are zstd-compressed */
    stk__unpack_area tmp; /* the decompressed chunks' area */
} ld;

/* One chunk as index.json describes it. */
typedef struct lchunk_info {
    const char *file;
    uint64_t bytes, samples;
} lchunk_info;

/* ---- Serializers ------------------------------------------------------------ */

static const struct {
    const char *name;
    int ser;
    uint32_t size;
    int kind;
} k_sers[] = {
    {"bytes", S_BYTES, 0, STK_FIELD_AUTO},
    {"str", S_STR, 0, STK_FIELD_TEXT},
    {"text", S_STR, 0, STK_FIELD_TEXT},
    {"int", S_INT, 8, STK_FIELD_INT},
    {"float", S_FLOAT, 8, STK_FIELD_FLOAT},
    {"bool", S_BOOL, 1, STK_FIELD_INT},
    {"jpeg", S_IMAGE, 0, STK_FIELD_IMAGE},  /* the JPEG file's bytes */
    {"image", S_IMAGE, 0, STK_FIELD_IMAGE}, /* an encoded image file */
    /* Bytes stoker hands over as stored: pil is u32 width, height, mode
     * length, the mode and raw pixels; numpy and tensor carry a dtype and
     * shape header; the no_header ones only the values. */
    {"pil", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"numpy", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"no_header_numpy", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"tensor", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"no_header_tensor", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"jpeg_array", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"video", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"audio", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"file", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"tifffile", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"nifti", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"mesh", S_OPAQUE, 0, STK_FIELD_BYTES},
    {"pdf", S_OPAQUE, 0, STK_FIELD_BYTES},
};

static int ser_index(const char *name, size_t n)
{
    for (size_t k = 0; k < sizeof k_sers / sizeof k_sers[0]; k++)
        if (strlen(k_sers[k].name) == n && !memcmp(k_sers[k].name, name, n))
            return (int)k;
    return -1;
}

static bool is_pickle(const char *name, size_t n)
{
    return (n == 6 && !memcmp(name, "pickle", 6)) || (n == 5 && !memcmp(name, "graph", 5));
}

/* Fills leaf l's serializer from its data_format entry. "X:Y" names
 * serializer Y when Y is one, else X (item_loader.py's
 * _data_format_to_key): "no_header_numpy:7" is no_header_numpy,
 * "graph:pickle" is pickle. */
static int parse_format(lleaf *l, char *why, size_t n)
{
    const char *f = l->format, *colon = strchr(f, ':');
    size_t pl = colon ? (size_t)(colon - f) : strlen(f);
    const char *key = f;
    size_t kl = pl;
    if (colon) {
        const char *sub = colon + 1;
        size_t sl = strlen(sub);
        if (ser_index(sub, sl) >= 0 || is_pickle(sub, sl)) {
            key = sub;
            kl = sl;
        }
    }
    if (is_pickle(key, kl)) {
        stk__fmt(why, n,
                 "leaf '%s' is serialized with '%.64s' (Python pickle), which can run arbitrary "
                 "code when read: stoker never unpickles; write the leaf with a safe serializer "
                 "(bytes, str, int, numpy, ...)",
                 l->name, f);
        return STK_EUNSUPPORTED;
    }
    int k = ser_index(key, kl);
    if (k < 0) {
        stk__fmt(why, n, "leaf '%s' has serializer '%.64s', which stoker does not know", l->name,
                 f);
        return STK_EUNSUPPORTED;
    }
    l->ser = k_sers[k].ser;
    l->size = k_sers[k].size;
    l->kind = k_sers[k].kind;
    return STK_OK;
}

/* ---- The pytree spec ------------------------------------------------------------- */

/* The name builder: the path of dict keys and positions down to a leaf. */
typedef struct namer {
    char **names;  /* one per leaf found so far */
    size_t n, cap; /* leaves found; names' size */
    char path[LD_NAME_MAX];
    bool keyed;   /* the root is a dict: leaves are named by their path */
    int too_long; /* inside a subtree whose path does not fit: leaf_K */
} namer;

static bool dict_type(const char *t)
{
    return !strcmp(t, "builtins.dict") || !strcmp(t, "collections.OrderedDict") ||
           !strcmp(t, "collections.defaultdict");
}

/* A dict node's keys: its context is a JSON text, the list of keys (a
 * defaultdict's under "dict_context"). NULL when it is not one; the caller
 * decrefs. */
static json_t *dict_keys(const char *type, const json_t *ctx, size_t nchildren)
{
    if (!json_is_string(ctx))
        return NULL;
    json_t *v = json_loads(json_string_value(ctx), JSON_DECODE_ANY, NULL);
    if (v && !strcmp(type, "collections.defaultdict")) {
        json_t *inner = json_incref(json_object_get(v, "dict_context"));
        json_decref(v);
        v = inner;
    }
    if (!json_is_array(v) || json_array_size(v) != nchildren) {
        json_decref(v);
        return NULL;
    }
    return v;
}

static int add_name(namer *nm, const char *name)
{
    if (nm->n == nm->cap) {
        size_t cap = nm->cap ? 2 * nm->cap : 16;
        char **v = stk__realloc(nm->names, cap * sizeof *v);
        if (!v)
            return STK_ENOMEM;
        nm->names = v;
        nm->cap = cap;
    }
    char def[32];
    stk__fmt(def, sizeof def, "leaf_%zu", nm->n);
    if (!nm->keyed || !*name || nm->too_long)
        name = def;
    if (!(nm->names[nm->n] = stk__strdup(name)))
        return STK_ENOMEM;
    nm->n++;
    return STK_OK;
}

/* Walks spec node v (depth levels down), naming its leaves. */
static int walk_spec(namer *nm, const json_t *v, int depth, char *why, size_t wn)
{
    if (depth > LD_SPEC_DEPTH || !json_is_object(v)) {
        stk__fmt(why, wn, "data_spec: %s",
                 depth > LD_SPEC_DEPTH ? "nested too deep" : "a node is no object");
        return STK_EFORMAT;
    }
    const json_t *type = json_object_get(v, "type"), *kids = json_object_get(v, "children_spec");
    if (json_is_null(type) || !type) {
        if (nm->n >= STK__MAX_FIELDS) {
            stk__fmt(why, wn, "data_spec has more than %d leaves; stoker reads at most %d",
                     STK__MAX_FIELDS, STK__MAX_FIELDS);
            return STK_EUNSUPPORTED;
        }
        return add_name(nm, nm->path);
    }
    if (!json_is_string(type) || !json_is_array(kids)) {
        stk__fmt(why, wn, "data_spec: a node has no type name or children_spec");
        return STK_EFORMAT;
    }
    const char *t = json_string_value(type);
    size_t nk = json_array_size(kids);
    json_t *keys = dict_type(t) ? dict_keys(t, json_object_get(v, "context"), nk) : NULL;
    if (depth == 0)
        nm->keyed = keys != NULL;
    size_t base = strlen(nm->path);
    int rc = STK_OK;
    for (size_t k = 0; k < nk && !rc; k++) {
        const json_t *key = keys ? json_array_get(keys, k) : NULL;
        char part[LD_NAME_MAX];
        if (json_is_string(key))
            stk__fmt(part, sizeof part, "%s", json_string_value(key));
        else if (json_is_integer(key))
            stk__fmt(part, sizeof part, "%lld", (long long)json_integer_value(key));
        else
            stk__fmt(part, sizeof part, "%zu", k);
        /* A name that does not fit, or a key that is empty, falls back to
         * leaf_K (add_name) rather than being cut into a wrong name. */
        int w = snprintf(nm->path + base, sizeof nm->path - base, "%s%s", base ? "." : "", part);
        bool bad = w < 0 || (size_t)w >= sizeof nm->path - base || !*part;
        nm->too_long += bad;
        rc = walk_spec(nm, json_array_get(kids, k), depth + 1, why, wn);
        nm->too_long -= bad;
        nm->path[base] = '\0';
    }
    json_decref(keys);
    return rc;
}

static void free_names(char **v, size_t n)
{
    for (size_t k = 0; v && k < n; k++)
        stk__free(v[k]);
    stk__free(v);
}

/* The leaves' names from data_spec (a JSON text, or null), nleaves of them.
 * Names that repeat fall back to leaf_K. */
static int leaf_names(const json_t *spec, size_t nleaves, char ***out, char *why, size_t wn)
{
    namer nm = {0};
    int rc = STK_OK;
    json_t *root = NULL;
    if (json_is_string(spec)) {
        json_error_t je;
        root = json_loads(json_string_value(spec), JSON_DECODE_ANY, &je);
        const json_t *proto = json_array_get(root, 0);
        if (!json_is_array(root) || json_array_size(root) != 2 || !json_is_integer(proto) ||
            json_integer_value(proto) != 1) {
            stk__fmt(why, wn,
                     "data_spec is not a pytree spec of protocol 1 ([1, {\"type\": ...}])");
            rc = STK_EFORMAT;
            goto out;
        }
        if ((rc = walk_spec(&nm, json_array_get(root, 1), 0, why, wn)))
            goto out;
        if (nm.n != nleaves) {
            stk__fmt(why, wn, "data_spec has %zu leaves, but data_format names %zu", nm.n, nleaves);
            rc = STK_EFORMAT;
            goto out;
        }
    } else if (json_is_null(spec) || !spec) {
        for (size_t k = 0; k < nleaves && !rc; k++)
            rc = add_name(&nm, "");
        if (rc)
            goto out;
    } else {
        stk__fmt(why, wn, "data_spec is neither a string nor null");
        rc = STK_EFORMAT;
        goto out;
    }
    for (size_t k = 1; k < nm.n; k++)
        for (size_t j = 0; j < k; j++)
            if (!strcmp(nm.names[j], nm.names[k])) {
                char def[32];
                stk__fmt(def, sizeof def, "leaf_%zu", k);
                char *d = stk__strdup(def);
                if (!d) {
                    rc = STK_ENOMEM;
                    goto out;
                }
                stk__free(nm.names[k]);
                nm.names[k] = d;
                break;
            }
out:
    json_decref(root);
    if (rc) {
        free_names(nm.names, nm.n);
        return rc;
    }
    *out = nm.names;
    return STK_OK;
}

/* ---- index.json ------------------------------------------------------------------ */

static const char *jstr(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool juint(const json_t *o, const char *key, uint64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* A chunk file's name: a plain name inside the dataset directory. */
static bool good_basename(const char *b)
{
    return b && *b && !strchr(b, '/') && strcmp(b, ".") && strcmp(b, "..");
}

static void free_leaves(lleaf *l, size_t n)
{
    for (size_t k = 0; l && k < n; k++) {
        stk__free(l[k].name);
        stk__free(l[k].format);
    }
    stk__free(l);
}

/* The config object: what this reader can read, and the leaves. */
static int parse_config(const json_t *cfg, ld *d, char *why, size_t n)
{
    const json_t *enc = json_object_get(cfg, "encryption");
    const json_t *comp = json_object_get(cfg, "compression");
    const char *loader = jstr(cfg, "item_loader");
    if (enc && !json_is_null(enc)) {
        stk__fmt(why, n, "the chunks are encrypted; stoker reads unencrypted LitData datasets");
        return STK_EUNSUPPORTED;
    }
    if (loader && strcmp(loader, "PyTreeLoader")) {
        stk__fmt(why, n,
                 "item_loader is '%.64s'; stoker reads the PyTreeLoader layout (optimize() "
                 "without a TokensLoader or ParquetLoader)",
                 loader);
        return STK_EUNSUPPORTED;
    }
    if (comp && !json_is_null(comp)) {
        if (!json_is_string(comp) || strcmp(json_string_value(comp), "zstd")) {
            stk__fmt(why, n,
                     "the chunks are compressed with '%.32s'; stoker reads zstd-compressed "
                     "chunks only",
                     json_is_string(comp) ? json_string_value(comp) : "?");
            return STK_EUNSUPPORTED;
        }
        d->zstd = true;
    }
    const json_t *fmt = json_object_get(cfg, "data_format");
    size_t nl = json_array_size(fmt);
    if (!json_is_array(fmt) || !nl) {
        stk__fmt(why, n, "config.data_format must be a list of at least one serializer name");
        return STK_EFORMAT;
    }
    if (nl > STK__MAX_FIELDS) {
        stk__fmt(why, n, "%zu leaves; stoker reads at most %d", nl, STK__MAX_FIELDS);
        return STK_EUNSUPPORTED;
    }
    char **names = NULL;
    int rc = leaf_names(json_object_get(cfg, "data_spec"), nl, &names, why, n);
    if (rc)
        return rc;
    if (!(d->leaves = stk__calloc(nl, sizeof *d->leaves))) {
        free_names(names, nl);
        return STK_ENOMEM;
    }
    d->nleaves = nl;
    for (size_t k = 0; k < nl; k++) {
        d->leaves[k].name = names[k]; /* taken over */
        names[k] = NULL;
    }
    free_names(names, nl);
    for (size_t k = 0; k < nl; k++) {
        const json_t *f = json_array_get(fmt, k);
        if (!json_is_string(f)) {
            stk__fmt(why, n, "data_format entry %zu is not a string", k);
            return STK_EFORMAT;
        }
        if (!(d->leaves[k].format = stk__strdup(json_string_value(f))))
            return STK_ENOMEM;
        if ((rc = parse_format(&d->leaves[k], why, n)))
            return rc;
    }
    return STK_OK;
}

/* Parses index.json's text into d's leaves and the chunk list *ci (whose
 * strings *root owns: json_decref when done). */
static int parse_index(const char *text, size_t len, json_t **root, ld *d, lchunk_info **ci,
                       size_t *nch, char *why, size_t n)
{
    json_error_t je;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!*root) {
        stk__fmt(why, n, "not valid JSON (line %d, column %d: %s)", je.line, je.column, je.text);
        return STK_EFORMAT;
    }
    const json_t *chunks = json_object_get(*root, "chunks");
    const json_t *cfg = json_object_get(*root, "config");
    if (!json_is_array(chunks) || !json_is_object(cfg)) {
        stk__fmt(why, n, "not a LitData index (wants {\"chunks\": [...], \"config\": {...}})");
        return STK_EFORMAT;
    }
    int rc = parse_config(cfg, d, why, n);
    if (rc)
        return rc;
    size_t nc = json_array_size(chunks);
    if (!nc) {
        stk__fmt(why, n, "lists no chunks");
        return STK_EEMPTY;
    }
    if (!(*ci = stk__calloc(nc, sizeof **ci)))
        return STK_ENOMEM;
    *nch = nc;
    for (size_t k = 0; k < nc; k++) {
        const json_t *c = json_array_get(chunks, k);
        lchunk_info *t = &(*ci)[k];
        if (!json_is_object(c) || !good_basename(t->file = jstr(c, "filename")) ||
            !juint(c, "chunk_size", &t->samples) || !juint(c, "chunk_bytes", &t->bytes)) {
            stk__fmt(why, n,
                     "chunk %zu needs a file name (filename), an item count (chunk_size) and "
                     "a size (chunk_bytes)",
                     k);
            return STK_EFORMAT;
        }
        if (t->samples > LD_MAX_CHUNK_SAMPLES) {
            stk__fmt(why, n, "chunk %zu (%s) claims %" PRIu64 " items", k, t->file, t->samples);
            return STK_EFORMAT;
        }
    }
    return STK_OK;
}

/* ---- Items ------------------------------------------------------------------------ */

/* Splits an item into its leaves: pos[k]/len[k] inside it. STK_EFORMAT with
 * the reason when the sizes do not add up to the item or a fixed-size leaf
 * has another size. */
static int split_item(const ld *d, const uint8_t *it, size_t n, size_t *pos, size_t *len, char *why,
                      size_t wn)
{
    size_t head = 4 * d->nleaves;
    if (n < head) {
        stk__fmt(why, wn, "item of %zu bytes is shorter than its %zu-byte size header", n, head);
        return STK_EFORMAT;
    }
    size_t at = head;
    for (size_t k = 0; k < d->nleaves; k++) {
        const lleaf *l = &d->leaves[k];
        size_t sz = stk__le32(it + 4 * k);
        if (sz > n - at) {
            stk__fmt(why, wn,
                     "leaf '%s' (%zu bytes at byte %zu) runs past the end of the %zu-byte item",
                     l->name, sz, at, n);
            return STK_EFORMAT;
        }
        if (l->size && sz != l->size) {
            stk__fmt(why, wn, "leaf '%s' (%s) is %zu bytes; the serializer writes %u", l->name,
                     l->format, sz, l->size);
            return STK_EFORMAT;
        }
        pos[k] = at;
        len[k] = sz;
        at += sz;
    }
    if (at != n) {
        stk__fmt(why, wn,
                 "the leaves take %zu of the item's %zu bytes (sizes and offsets table "
                 "disagree)",
                 at, n);
        return STK_EFORMAT;
    }
    return STK_OK;
}

static int64_t i64_value(const uint8_t *p)
{
    uint64_t u = (uint64_t)stk__le32(p) | (uint64_t)stk__le32(p + 4) << 32;
    int64_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* An int, float or bool leaf's value as decimal text that reads back
 * exactly (%.17g for the float64 the float serializer writes). */
static int number_text(const lleaf *l, const uint8_t *p, char *buf, size_t n)
{
    if (l->ser == S_INT)
        return snprintf(buf, n, "%" PRId64, i64_value(p));
    if (l->ser == S_BOOL)
        return snprintf(buf, n, "%d", p[0] != 0);
    uint64_t u = (uint64_t)stk__le32(p) | (uint64_t)stk__le32(p + 4) << 32;
    double v;
    memcpy(&v, &u, 8);
    return snprintf(buf, n, "%.17g", v);
}

static bool is_number(int ser)
{
    return ser == S_INT || ser == S_FLOAT || ser == S_BOOL;
}

static int ld_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                   int64_t *label, char *err, size_t errlen)
{
    const ld *d = s->impl;
    const lchunk *t = &d->chunks[stk__source_shard_of(s, i)];
    uint64_t off;
    size_t n;
    uint8_t *buf;
    int rc = stk__ot_read(t, i - t->first, &k_ld_words, sink, &buf, &n, &off, err, errlen);
    if (rc)
        return rc;
    size_t pos[STK__MAX_FIELDS], ll[STK__MAX_FIELDS];
    char why[STK_ERRMSG_MAX];
    if ((rc = split_item(d, buf, n, pos, ll, why, sizeof why))) {
        stk__fmt(err, errlen, "item at offset %" PRIu64 " (%zu bytes): %s", off, n, why);
        return rc;
    }
    *label = -1;
    if (d->label >= 0) {
        int64_t v = i64_value(buf + pos[d->label]);
        *label = v >= 0 && v <= INT32_MAX ? v : -1;
    }
    if (d->whole) {
        *data = buf;
        *len = n;
    } else {
        *data = buf + pos[d->payload];
        *len = ll[d->payload];
    }
    return STK_OK;
}

static int ld_select(stk__source *s, uint64_t mask, char *err, size_t errlen)
{
    (void)mask;
    (void)err;
    (void)errlen;
    ((ld *)s->impl)->whole = true;
    return STK_OK;
}

/* Fills fs from an item: every leaf a field (field id = leaf index);
 * numbers as their decimal text in the gen area. */
static int fields_of_item(const ld *d, const uint8_t *it, size_t n, stk__field_set *fs, char *why,
                          size_t wn)
{
    size_t pos[STK__MAX_FIELDS], len[STK__MAX_FIELDS];
    fs->n = 0;
    fs->gen_used = 0;
    int rc = split_item(d, it, n, pos, len, why, wn);
    for (size_t k = 0; k < d->nleaves && !rc; k++) {
        const lleaf *l = &d->leaves[k];
        if (is_number(l->ser)) {
            char text[40];
            int tl = number_text(l, it + pos[k], text, sizeof text);
            rc = stk__field_set_gen(fs, (uint32_t)k, text, (size_t)tl);
        } else {
            fs->f[fs->n++] = (stk__field_ref){(uint32_t)k, it + pos[k], len[k]};
        }
    }
    return rc;
}

static int ld_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                     int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    const ld *d = s->impl;
    const lchunk *t = &d->chunks[stk__source_shard_of(s, i)];
    (void)label;
    char why[STK_ERRMSG_MAX];
    int rc = fields_of_item(d, bytes, len, fs, why, sizeof why);
    if (rc)
        stk__fmt(err, errlen, "item at offset %" PRIu32 " (%zu bytes): %s", t->off[i - t->first],
                 len, why);
    return rc;
}

static void ld_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const ld *d = s->impl;
    const lchunk *t = &d->chunks[stk__source_shard_of(s, i)];
    stk__ot_name(t, i - t->first, buf, n);
}

static void ld_describe(const stk__source *s, stk__dataset_info *di)
{
    const ld *d = s->impl;
    if (s->ops->flags & STK__SRC_IMAGES)
        di->payload = "encoded";
    di->shards = d->n;
    di->bytes = d->total_bytes;
}

static void ld_free(ld *d)
{
    if (!d)
        return;
    stk__ot_free(d->chunks, d->n);
    stk__unpack_remove(&d->tmp);
    stk__free(d->chunks);
    free_leaves(d->leaves, d->nleaves);
    stk__free(d);
}

static void ld_close(stk__source *s)
{
    ld_free(s->impl);
    s->impl = NULL;
}

/* The payload a loader without fields reads is the first image leaf
 * (k_ld_ops), else the first bytes leaf (k_ld_bytes_ops). */
static const stk__source_ops k_ld_ops = {.kind = "litdata",
                                         .read = ld_read,
                                         .name = ld_name,
                                         .close = ld_close,
                                         .select = ld_select,
                                         .fields = ld_fields,
                                         .flags = STK__SRC_IMAGES,
                                         .describe = ld_describe};
static const stk__source_ops k_ld_bytes_ops = {.kind = "litdata",
                                               .read = ld_read,
                                               .name = ld_name,
                                               .close = ld_close,
                                               .select = ld_select,
                                               .fields = ld_fields,
                                               .describe = ld_describe};

/* ---- Compressed chunks --------------------------------------------------------------
 * A .zstd.bin chunk is decompressed once, at open, into the private area
 * $TMPDIR/stoker-litdata-XXXXXX (unpack.h), removed at close. */

/* Decompresses chunk t (file t->shown, read from zpath) into the temporary
 * area. */
static int decompress_chunk(ld *d, lchunk *t, const char *zpath, const lchunk_info *ci,
                            uint64_t need, char *err, size_t errlen)
{
    stk__unpack_job j = {.codec = STK__CODEC_ZSTD,
                         .src = t->shown,
                         .local = zpath,
                         .name = ci->file,
                         .want = ci->bytes,
                         .want_from = "chunk_bytes",
                         .need = need};
    return stk__unpack(&d->tmp, &j, &t->path, &t->stored, err, errlen);
}

/* ---- Open ------------------------------------------------------------------------ */

/* Opens chunk t from the file stk__files got for it (path; shown in
 * messages), decompressed first when compressed; reads its offsets table. */
static int open_chunk(ld *d, lchunk *t, const char *path, const char *shown, const lchunk_info *ci,
                      uint64_t need, bool keep, char *err, size_t errlen)
{
    int rc;
    if (!(t->shown = stk__strdup(shown)))
        return STK_ENOMEM;
    if (d->zstd) {
        if ((rc = decompress_chunk(d, t, path, ci, need, err, errlen)))
            return rc;
    } else if (!(t->path = stk__strdup(path))) {
        return STK_ENOMEM;
    }
    return stk__ot_open(t, ci->samples, keep, &k_ld_words, err, errlen);
}

static bool leaf_is_image(const lleaf *l)
{
    return l->kind == STK_FIELD_IMAGE ||
           (l->kind == STK_FIELD_AUTO && stk_field_kind_for_name(l->name) == STK_FIELD_IMAGE);
}

/* The leaf a read without fields gives: the first image leaf, else the
 * first bytes leaf, else the first leaf that is no number (a file, an
 * array, a string), else the first leaf. */
static int pick_payload(const ld *d)
{
    for (size_t k = 0; k < d->nleaves; k++)
        if (leaf_is_image(&d->leaves[k]))
            return (int)k;
    for (size_t k = 0; k < d->nleaves; k++)
        if (d->leaves[k].ser == S_BYTES)
            return (int)k;
    for (size_t k = 0; k < d->nleaves; k++)
        if (!is_number(d->leaves[k].ser))
            return (int)k;
    return 0;
}

/* Reads every sample's label (the item's size header, then the value) for
 * num_classes. A label leaf holding a negative value, or one past 2^31, is
 * no class label: the dataset is then unlabeled. Items that cannot be read
 * are left for their reads to report. */
static int scan_labels(ld *d, int64_t *maxl, char *err, size_t errlen)
{
    uint32_t sizes[STK__MAX_FIELDS];
    size_t lab = (size_t)d->label, hn = 4 * d->nleaves;
    *maxl = -1;
    for (size_t k = 0; k < d->n; k++) {
        const lchunk *t = &d->chunks[k];
        for (uint64_t j = 0; j < t->count; j++) {
            uint64_t off;
            size_t n;
            char why[STK_ERRMSG_MAX];
            if (stk__ot_range(t, j, &off, &n, &k_ld_words, why, sizeof why) || n < hn)
                continue;
            int rc = stk__pread_at(t->fd, t->path, sizes, hn, off, why, sizeof why);
            uint64_t at = hn;
            for (size_t v = 0; v < lab && !rc; v++)
                at += stk__le32((const uint8_t *)&sizes[v]);
            uint8_t val[8];
            if (!rc && (stk__le32((const uint8_t *)&sizes[lab]) != 8 || at + 8 > n))
                continue; /* sizes past the item: its read reports it */
            if (!rc)
                rc = stk__pread_at(t->fd, t->path, val, 8, off + at, why, sizeof why);
            if (rc) {
                stk__fmt(err, errlen, "%s#%" PRIu64 ": reading its label: %s", t->shown, j, why);
                return rc;
            }
            int64_t v = i64_value(val);
            if (v < 0 || v > INT32_MAX) {
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

/* Gets every chunk through fs (all at once: remote ones download in
 * parallel) and opens it; fills s's shard tables (a chunk is a shard). */
static int open_chunks(stk__source *s, ld *d, stk__files *fs, const lchunk_info *ci, size_t nc,
                       char *err, size_t errlen)
{
    uint64_t need = 0, total = 0;
    for (size_t k = 0; k < nc && d->zstd; k++)
        need += ci[k].bytes;
    const char **names = stk__calloc(3 * nc + 1, sizeof *names);
    if (!names || !(d->chunks = stk__calloc(nc, sizeof *d->chunks)) ||
        !(s->shard_first = stk__calloc(nc + 1, sizeof *s->shard_first))) {
        stk__free(names);
        return STK_ENOMEM;
    }
    const char **paths = names + nc, **shown = names + 2 * nc;
    for (size_t k = 0; k < nc; k++)
        names[k] = ci[k].file;
    int rc = stk__files_get(fs, names, NULL, nc, NULL, paths, shown, err, errlen);
    for (size_t k = 0; k < nc && !rc; k++) {
        lchunk *t = &d->chunks[k];
        t->fd = -1;
        d->n = k + 1;
        if ((rc = open_chunk(d, t, paths[k], shown[k], &ci[k], need, nc <= LD_KEEP_FDS, err,
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
    s->shard_first[nc] = total;
    s->nshards = nc;
    s->count = total;
    return STK_OK;
}

static int describe_fields(stk__source *s, const ld *d)
{
    for (size_t k = 0; k < d->nleaves; k++)
        if (stk__source_add_field(s, d->leaves[k].name, strlen(d->leaves[k].name),
                                  d->leaves[k].kind, s->count) < 0)
            return STK_ENOMEM;
    return STK_OK;
}

int stk__source_litdata_open(stk__source *s, stk__files *fs, char *err, size_t errlen)
{
    char *text = NULL;
    const char *ipath = NULL, *ishown = NULL, *iname = "index.json";
    size_t tlen = 0, nc = 0;
    json_t *root = NULL;
    lchunk_info *ci = NULL;
    ld *d = NULL;
    char why[STK_ERRMSG_MAX];
    int rc = STK_OK;
    memset(s, 0, sizeof *s);
    if (!(d = stk__calloc(1, sizeof *d))) {
        rc = STK_ENOMEM;
        goto out;
    }
    d->label = -1;
    d->tmp =
        (stk__unpack_area){.tag = "litdata", .what = "the dataset's .zstd.bin chunks", .hint = ""};
    if ((rc = stk__files_get(fs, &iname, NULL, 1, NULL, &ipath, &ishown, err, errlen)) ||
        (rc = stk__read_text(ipath, ishown, LD_INDEX_MAX, &text, &tlen, err, errlen)))
        goto out;
    if ((rc = parse_index(text, tlen, &root, d, &ci, &nc, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", ishown, why);
        goto out;
    }
    if ((rc = open_chunks(s, d, fs, ci, nc, err, errlen)))
        goto out;
    if (!s->count) {
        stk__fmt(err, errlen, "%s: its %zu chunks hold no samples", ishown, nc);
        rc = STK_EEMPTY;
        goto out;
    }
    d->payload = pick_payload(d);
    for (size_t k = 0; k < d->nleaves && d->label < 0; k++)
        if ((!strcmp(d->leaves[k].name, "label") || !strcmp(d->leaves[k].name, "cls")) &&
            d->leaves[k].ser == S_INT)
            d->label = (int)k;
    int64_t maxl = -1;
    if (d->label >= 0 && (rc = scan_labels(d, &maxl, err, errlen)))
        goto out;
    s->num_classes = (uint64_t)(maxl + 1);
    s->ops = leaf_is_image(&d->leaves[d->payload]) ? &k_ld_ops : &k_ld_bytes_ops;
    s->impl = d;
    s->index_bytes += sizeof *d + d->nleaves * sizeof *d->leaves + nc * sizeof *d->chunks +
                      (nc + 1) * sizeof *s->shard_first;
    d = NULL; /* the source's now: stk__source_close frees it */
    if ((rc = describe_fields(s, s->impl))) {
        stk__fmt(err, errlen, "out of memory while opening %s", ishown);
        stk__source_close(s);
        goto out;
    }
out:
    if (rc && d) {
        ld_free(d);
        s->impl = NULL;
        stk__source_free_common(s);
    }
    if (root)
        json_decref(root);
    stk__free(ci);
    stk__free(text);
    return rc;
}

int stk__litdata_sniff_text(const char *text, size_t len)
{
    json_t *root = json_loadb(text, len, 0, NULL);
    /* An index that does not parse but looks like LitData's is still
     * LitData: the reader then says what is wrong with it. */
    int rc = root ? json_is_array(json_object_get(root, "chunks")) &&
                        json_is_object(json_object_get(root, "config"))
                  : strstr(text, "\"chunks\"") && strstr(text, "\"data_format\"");
    if (root)
        json_decref(root);
    return rc;
}

int stk__litdata_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                              size_t errlen)
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
    lchunk_info *ci = NULL;
    size_t nc = 0;
    ld d = {.label = -1};
    lchunk t = {.fd = -1};
    int rc = parse_index((const char *)buf + 4, il, &root, &d, &ci, &nc, err, errlen);
    if (rc)
        goto out;
    lrd r = {-1, buf + 4 + il, n - 4 - il};
    t.bytes = r.size;
    if ((rc = stk__ot_head(&r, ci[0].samples, &t, &k_ld_words, err, errlen)))
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
        if (stk__ot_range(&t, j, &off, &len, &k_ld_words, why, sizeof why))
            continue;
        const uint8_t *it = r.buf + off;
        if (fields_of_item(&d, it, len, fs, why, sizeof why))
            continue;
        for (size_t k = 0; k < fs->n; k++) {
            const stk__field_ref *f = &fs->f[k];
            bool in_it =
                f->data >= it && f->len <= len && f->data - it <= (ptrdiff_t)(len - f->len);
            bool in_gen = f->data >= fs->gen && f->data + f->len <= fs->gen + fs->gen_used;
            if (f->id >= d.nleaves || !(in_it || in_gen)) {
                stk__fmt(err, errlen, "field %zu of item %" PRIu64 " lies outside it", k, j);
                rc = STK_EINVAL;
            }
        }
    }
    stk__free(fs);
out:
    stk__free(t.off);
    free_leaves(d.leaves, d.nleaves);
    stk__free(ci);
    if (root)
        json_decref(root);
    return rc;
}
