/* options.c -- typed setters for stk_options; every value is checked here so a
 * bad option fails at the call that set it. */
#include "options.h"
#include "fetch/fetch.h"
#include "fields.h"
#include "image.h"
#include "io/remote.h"
#include "schedule/mix.h"
#include "source/source.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int stk_options_create(stk_options **out)
{
    stk_options *o = stk__calloc(1, sizeof *o);
    *out = o;
    if (!o)
        return STK_ENOMEM;
    o->batch_size = 256;
    o->depth = 2;
    o->shuffle = true;
    o->world = 1;
    o->batch_memory = (size_t)512 << 20;
    o->nchw = 1;
    o->dtype = STK_DTYPE_UINT8;
    o->max_dim = 16384;
    o->scratch_bytes = 64u << 20;
    o->max_input_bytes = 32u << 20;
    o->jpeg_memory = 64u << 20;
    o->trace_events = 1u << 20;
    o->field_memory = (size_t)64 << 20;
    o->block_bytes = (uint64_t)5 << 20;
    o->fetch_rate = 5500;
    o->fetch_hedge = 3;
    return STK_OK;
}

void stk_options_destroy(stk_options *o)
{
    if (!o)
        return;
    stk__free(o->source);
    stk__free(o->source_shown);
    stk__free(o->transform);
    stk__free(o->endpoint);
    stk__free(o->region);
    stk__free(o->cache_dir);
    stk__free(o->trace);
    stk__fspecs_free(o->fields, o->nfields);
    for (size_t k = 0; k < o->nmix; k++) {
        stk__free(o->mix[k].path);
        stk__free(o->mix[k].shown);
        stk__free(o->mix[k].transform);
        for (size_t t = 0; t < o->mix[k].ntfs; t++) {
            stk__free(o->mix[k].tfs[t].field);
            stk__free(o->mix[k].tfs[t].spec);
        }
        stk__free(o->mix[k].tfs);
    }
    stk__free(o->mix);
    stk__free(o);
}

static int set_str(char **dst, const char *v)
{
    if (!v)
        return STK_EINVAL;
    char *d = stk__strdup(v);
    if (!d)
        return STK_ENOMEM;
    stk__free(*dst);
    *dst = d;
    return STK_OK;
}

int stk_options_set_source(stk_options *o, const char *path)
{
    if (!o)
        return STK_EINVAL;
    if (!path || !*path) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "source takes a path or URL, got '%s'",
                 path ? path : "(null)");
        return STK_EINVAL;
    }
    /* Messages name the source by its display form, so a URL's password or
     * presigned signature is never printed. */
    size_t n = strlen(path) + 8;
    char *shown = stk__malloc(n);
    if (!shown)
        return STK_ENOMEM;
    if (stk__url_display(path, shown, n) != shown)
        stk__fmt(shown, n, "%s", path);
    int rc = set_str(&o->source, path);
    if (rc) {
        stk__free(shown);
        return rc;
    }
    stk__free(o->source_shown);
    o->source_shown = shown;
    return STK_OK;
}

int stk_options_add_source(stk_options *o, const char *path, double weight, uint64_t samples)
{
    if (!o || !path || !*path || !(weight >= 0) || weight > 1e300 ||
        o->nmix >= STK__MIX_MAX_SOURCES)
        return STK_EINVAL;
    size_t n = strlen(path) + 8;
    char *shown = stk__malloc(n), *copy = stk__strdup(path);
    stk__mix_spec *grown =
        shown && copy ? stk__realloc(o->mix, (o->nmix + 1) * sizeof *grown) : NULL;
    if (!grown) {
        stk__free(shown);
        stk__free(copy);
        return STK_ENOMEM;
    }
    o->mix = grown;
    if (stk__url_display(path, shown, n) != shown)
        stk__fmt(shown, n, "%s", path);
    o->mix[o->nmix++] = (stk__mix_spec){.path = copy,
                                        .shown = shown,
                                        .weight = weight,
                                        .samples = samples,
                                        .order = -1,
                                        .cache = -1};
    if (!o->source) {
        /* Messages of the open name the loader's source by this. */
        char what[64];
        stk__fmt(what, sizeof what, "a mixture of %zu sources", o->nmix);
        char *d = stk__strdup(what);
        if (d) {
            stk__free(o->source_shown);
            o->source_shown = d;
        }
    }
    return STK_OK;
}

/* Source `source`'s transform of the named image field: replaced, added,
 * or (spec NULL) removed. */
static int set_field_transform(stk__mix_spec *m, const char *field, char *spec)
{
    size_t t = 0;
    while (t < m->ntfs && strcmp(m->tfs[t].field, field))
        t++;
    if (t < m->ntfs) {
        stk__free(m->tfs[t].spec);
        if (spec) {
            m->tfs[t].spec = spec;
        } else {
            stk__free(m->tfs[t].field);
            m->tfs[t] = m->tfs[--m->ntfs];
        }
        return STK_OK;
    }
    if (!spec)
        return STK_OK;
    char *name = stk__strdup(field);
    stk__mix_tf *grown = name ? stk__realloc(m->tfs, (m->ntfs + 1) * sizeof *grown) : NULL;
    if (!grown) {
        stk__free(name);
        stk__free(spec);
        return STK_ENOMEM;
    }
    m->tfs = grown;
    m->tfs[m->ntfs++] = (stk__mix_tf){name, spec};
    return STK_OK;
}

int stk_options_source_transform(stk_options *o, size_t source, const char *field,
                                 const char *transform)
{
    if (!o || source >= o->nmix || !transform)
        return STK_EINVAL;
    o->errmsg[0] = '\0';
    char *copy = NULL;
    if (*transform && strcmp(transform, "none") && !(copy = stk__strdup(transform)))
        return STK_ENOMEM;
    /* A named field is resolved against the loader's fields at open (the
     * first image field's name means the same as NULL). */
    if (field && *field)
        return set_field_transform(&o->mix[source], field, copy);
    stk__free(o->mix[source].transform);
    o->mix[source].transform = copy;
    return STK_OK;
}

int stk_options_source_set(stk_options *o, size_t source, const char *key, const char *value)
{
    if (!o)
        return STK_EINVAL;
    o->errmsg[0] = '\0';
    if (source >= o->nmix || !key || !value) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "%s",
                 source >= o->nmix ? "no such mixture source"
                                   : "a source option needs a key and a value");
        return STK_EINVAL;
    }
    stk__mix_spec *m = &o->mix[source];
    if (!strcmp(key, "transform"))
        return stk_options_source_transform(o, source, NULL, value);
    if (!strcmp(key, "cache")) {
        /* Whether this source's shards may go to the loader's disk cache. */
        if (strcmp(value, "0") && strcmp(value, "1")) {
            stk__fmt(o->errmsg, sizeof o->errmsg,
                     "mixture source %zu (%s): cache is 0 or 1, not '%.64s'", source, m->shown,
                     value);
            return STK_EINVAL;
        }
        m->cache = value[0] == '1';
        return STK_OK;
    }
    bool ord = !strcmp(key, "order"), win = !strcmp(key, "shard_window"),
         blk = !strcmp(key, "block_bytes");
    if (!ord && !win && !blk) {
        /* Everything else is the loader's: one ring, one memory bound, one
         * fetch stage and one disk cache shared by the sources (the stage
         * admits whole shards of its one table to the cache, whichever
         * source they belong to). */
        bool cache = !strncmp(key, "cache_", 6);
        bool known = cache || stk_option_by_name(key) != NULL;
        stk__fmt(o->errmsg, sizeof o->errmsg,
                 "mixture source %zu (%s): %s '%.64s' %s; per source are order, shard_window, "
                 "block_bytes, cache and transform (docs/mixing.md)",
                 source, m->shown, known ? "the option" : "unknown option", key,
                 !known  ? "(the options: docs/options.md)"
                 : cache ? "is the loader's: its remote sources share one disk cache (cache_dir; "
                           "a source may only keep out of it: cache 0)"
                         : "is the loader's, not per source");
        return known ? STK_EUNSUPPORTED : STK_EINVAL;
    }
    /* The loader's parser checks the value, with its messages. */
    stk_options *tmp = NULL;
    int rc = stk_options_create(&tmp);
    if (rc)
        return rc;
    rc = stk_options_set(tmp, key, value);
    if (rc) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "mixture source %zu (%s): %s", source, m->shown,
                 tmp->errmsg);
    } else if (ord) {
        m->order = tmp->order;
    } else if (win) {
        m->shard_window = tmp->shard_window;
    } else {
        m->block_bytes = tmp->block_bytes;
    }
    stk_options_destroy(tmp);
    return rc;
}

int stk_options_set_records(stk_options *o, size_t record_bytes, size_t header_bytes,
                            unsigned label_bytes)
{
    if (!o || !record_bytes || record_bytes <= label_bytes ||
        (label_bytes != 0 && label_bytes != 1 && label_bytes != 2 && label_bytes != 4 &&
         label_bytes != 8))
        return STK_EINVAL;
    o->record_bytes = record_bytes;
    o->header_bytes = header_bytes;
    o->label_bytes = label_bytes;
    return STK_OK;
}

/* A typed setter's refusal: the reason on the options object, as
 * stk_options_set gives it for a key (which setting, the allowed range, the
 * value given), so that front ends need not restate ranges. */
static int typed_refusal(stk_options *o, const char *what, const char *range, unsigned long long v)
{
    stk__fmt(o->errmsg, sizeof o->errmsg, "%s takes %s, got %llu", what, range, v);
    return STK_EINVAL;
}

int stk_options_set_batch_size(stk_options *o, size_t n)
{
    if (!o)
        return STK_EINVAL;
    if (n < 1 || n > STK_BATCH_SIZE_MAX)
        return typed_refusal(o, "batch_size", "1..16777216 (STK_BATCH_SIZE_MAX)", n);
    o->batch_size = n;
    return STK_OK;
}

int stk_options_set_threads(stk_options *o, unsigned n)
{
    if (!o)
        return STK_EINVAL;
    if (n > STK_THREADS_MAX)
        return typed_refusal(o, "threads", "0..256 (0: every usable CPU)", n);
    o->threads = n;
    return STK_OK;
}

int stk_options_set_depth(stk_options *o, unsigned n)
{
    if (!o)
        return STK_EINVAL;
    if (n < 1 || n > 63)
        return typed_refusal(o, "depth", "1..63", n);
    o->depth = n;
    o->depth_auto = false;
    return STK_OK;
}

int stk_options_set_seed(stk_options *o, uint64_t seed)
{
    if (!o)
        return STK_EINVAL;
    o->seed = seed;
    return STK_OK;
}

int stk_options_set_shuffle(stk_options *o, int on)
{
    if (!o)
        return STK_EINVAL;
    o->shuffle = on != 0;
    return STK_OK;
}

int stk_options_set_drop_last(stk_options *o, int on)
{
    if (!o)
        return STK_EINVAL;
    o->drop_last = on != 0;
    return STK_OK;
}

int stk_options_set_partition(stk_options *o, unsigned rank, unsigned world_size)
{
    if (!o)
        return STK_EINVAL;
    if (world_size < 1)
        return typed_refusal(o, "world_size", "1 or more", world_size);
    if (rank >= world_size) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "rank takes 0..world_size-1 (%u), got %u",
                 world_size - 1, rank);
        return STK_EINVAL;
    }
    o->rank = rank;
    o->world = world_size;
    return STK_OK;
}

int stk_options_set_on_error(stk_options *o, int policy)
{
    if (!o || (policy != STK_ON_ERROR_RAISE && policy != STK_ON_ERROR_SKIP))
        return STK_EINVAL;
    o->on_error = policy;
    return STK_OK;
}

int stk_options_set_warning(stk_options *o, stk_warning_fn fn, void *user)
{
    if (!o)
        return STK_EINVAL;
    o->warn = fn;
    o->warn_user = fn ? user : NULL;
    return STK_OK;
}

int stk_options_set_max_sample_bytes(stk_options *o, size_t n)
{
    if (!o)
        return STK_EINVAL;
    if (n < 1 || n > ((size_t)1 << 40))
        return typed_refusal(o, "max_sample_bytes", "1..2^40 bytes", n);
    o->max_sample_bytes = n;
    return STK_OK;
}

int stk_options_set_transform(stk_options *o, const char *spec)
{
    if (!o || !spec)
        return STK_EINVAL;
    return set_str(&o->transform, spec);
}

int stk_parse_size(const char *v, uint64_t *out)
{
    if (!v || !out)
        return STK_EINVAL;
    const char *p = v;
    uint64_t whole = 0, frac = 0, frac_den = 1;
    bool big = false, digits = false;
    for (; *p >= '0' && *p <= '9'; p++, digits = true) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            big = true;
        else
            whole = whole * 10 + d;
    }
    bool has_frac = *p == '.';
    if (has_frac)
        for (p++; *p >= '0' && *p <= '9'; p++, digits = true)
            if (frac_den <= UINT64_MAX / 100) { /* further digits change no whole byte */
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
            }
    if (!digits)
        return STK_EINVAL;
    while (*p == ' ')
        p++;
    /* The unit: a multiplier, binary unless it is spelt "KB", "MB", ... */
    static const char units[] = "KMGT";
    uint64_t mul = 1;
    const char *u = *p ? strchr(units, *p & ~0x20) : NULL;
    if (u && *p) {
        unsigned k = (unsigned)(u - units) + 1;
        p++;
        bool si = false;
        if ((*p == 'i' || *p == 'I') && (p[1] == 'B' || p[1] == 'b'))
            p += 2;
        else if (*p == 'B' || *p == 'b')
            si = true, p++;
        for (unsigned j = 0; j < k; j++)
            mul *= si ? 1000u : 1024u;
    } else if (*p == 'B' || *p == 'b') {
        p++;
    }
    /* A fraction needs a unit larger than a byte: "1.5" bytes means nothing. */
    if (*p || (has_frac && mul == 1))
        return STK_EINVAL;
    if (big || whole > UINT64_MAX / mul)
        return STK_ETOOBIG;
    uint64_t n = whole * mul;
    /* frac / frac_den of mul, in 128-bit arithmetic (frac_den <= 10^18). */
    unsigned __int128 part = (unsigned __int128)frac * mul / frac_den;
    if (part > UINT64_MAX - n)
        return STK_ETOOBIG;
    *out = n + (uint64_t)part;
    return STK_OK;
}

/* cache_dir: a directory; "~" and "~/..." mean the home directory ($HOME),
 * as a shell would expand them, never a directory named "~". "~user" and ""
 * are refused. */
static int set_cache_dir(stk_options *o, const char *v)
{
    if (!*v || (v[0] == '~' && v[1] && v[1] != '/'))
        return STK_EINVAL;
    if (v[0] != '~')
        return set_str(&o->cache_dir, v);
    const char *home = getenv("HOME");
    if (!home || !*home)
        return STK_EINVAL;
    size_t hn = strlen(home), vn = strlen(v + 1);
    char *d = stk__malloc(hn + vn + 1);
    if (!d)
        return STK_ENOMEM;
    memcpy(d, home, hn);
    memcpy(d + hn, v + 1, vn + 1);
    stk__free(o->cache_dir);
    o->cache_dir = d;
    return STK_OK;
}

/* ---- The option table ------------------------------------------------------
 * The only list of stk_options_set's keys: stk_options_set parses and checks
 * values from it, stk_option_next/stk_option_by_name publish it, and the
 * front ends (the `stoker` flags, Python's options=) and docs/options.md are
 * built from it. */

/* How an entry keeps its value in struct stk_options. */
enum { ST_NONE, ST_BOOL, ST_INT, ST_UNSIGNED, ST_U32, ST_SIZE, ST_U64, ST_STR };

typedef struct opt_entry {
    stk_option_info info; /* first: stk_option_next steps from it to the entry */
    size_t off;           /* the field (ST_NONE: set does all the work) */
    unsigned char store;
    const signed char *words; /* enum: what each word stores (NULL: its index) */
    /* A value that needs more than a store: called with the text and, for a
     * number, its checked value; a message it writes on o is kept. */
    int (*set)(stk_options *o, const char *v, uint64_t n);
} opt_entry;

static int set_depth(stk_options *o, const char *v, uint64_t n)
{
    /* "auto": the deepest ring (1..8) whose memory bound fits memory_budget
     * (docs/memory.md); a number sets depth as stk_options_set_depth does. */
    o->depth_auto = !strcmp(v, "auto");
    if (!o->depth_auto)
        o->depth = (unsigned)n;
    return STK_OK;
}

static int set_retries(stk_options *o, const char *v, uint64_t n)
{
    (void)v;
    o->fetch_retries = n ? (unsigned)n : UINT32_MAX; /* 0 is "none", not "default" */
    return STK_OK;
}

static int set_listing_ttl(stk_options *o, const char *v, uint64_t n)
{
    (void)v;
    o->listing_ttl = n ? n : UINT64_MAX; /* 0 is "list every open", not "default" */
    return STK_OK;
}

static int set_trace(stk_options *o, const char *v, uint64_t n)
{
    (void)n;
    if (*v)
        return set_str(&o->trace, v);
    stk__free(o->trace); /* "" turns the trace off */
    o->trace = NULL;
    return STK_OK;
}

static int set_cache_dir_entry(stk_options *o, const char *v, uint64_t n)
{
    (void)n;
    return set_cache_dir(o, v);
}

/* "cpu", "cuda", "cuda:N", "fake", "fake:N" (the tests' CPU stand-in for a
 * device; docs/gpu.md). */
static int set_device(stk_options *o, const char *v, uint64_t n)
{
    int kind;
    const char *rest;
    if (!strncmp(v, "cuda", 4))
        kind = STK_DEVICE_CUDA, rest = v + 4;
    else if (!strncmp(v, "fake", 4))
        kind = STK_DEVICE_FAKE, rest = v + 4;
    else if (!strcmp(v, "cpu"))
        kind = STK_DEVICE_CPU, rest = v + 3;
    else
        return STK_EINVAL;
    n = 0;
    if (*rest == ':' &&
        (kind == STK_DEVICE_CPU || stk_parse_size(rest + 1, &n) != STK_OK || n > 1023))
        return STK_EINVAL;
    if (*rest && *rest != ':')
        return STK_EINVAL;
    o->device = kind;
    o->device_id = (int)n;
    return STK_OK;
}

/* The option replaces the fields added so far ("" clears them). */
static int set_fields_entry(stk_options *o, const char *v, uint64_t n)
{
    (void)n;
    stk__fspec *old = o->fields;
    size_t nold = o->nfields;
    o->fields = NULL;
    o->nfields = 0;
    int rc = *v ? stk_options_set_fields(o, v) : STK_OK;
    if (rc) {
        stk__fspecs_free(o->fields, o->nfields);
        o->fields = old;
        o->nfields = nold;
        return rc;
    }
    stk__fspecs_free(old, nold);
    return STK_OK;
}

static const signed char layout_words[] = {1, 0};        /* nchw, nhwc */
static const signed char addressing_words[] = {1, 2, 0}; /* path, virtual, auto */

#define OFF(f) offsetof(struct stk_options, f)
#define TB     ((uint64_t)1 << 40)
#define PB     ((uint64_t)1 << 50)
/* name, type, min, max, values, unit, default, doc, flags; field, store, words, set */
#define OPT(name, type, lo, hi, values, unit, def, doc, flags, off, store, words, set)             \
    {                                                                                              \
        {name, STK_OPTION_##type, lo, hi, values, unit, def, doc, STK_OPTION_##flags}, off, store, \
            words, set                                                                             \
    }

static const opt_entry table[] = {
    /* Images (docs/images.md, docs/transforms.md). */
    OPT("layout", ENUM, 0, 0, "nchw|nhwc", NULL, "nchw",
        "pixel layout of image batches: channels first (nchw) or last (nhwc)", IMAGE, OFF(nchw),
        ST_INT, layout_words, NULL),
    OPT("dtype", ENUM, 0, 0, "uint8|float32|float16|bfloat16", NULL, "uint8",
        "element type of image batches (docs/images.md)", IMAGE, OFF(dtype), ST_INT, NULL, NULL),
    OPT("size", UINT, 1, 65535, NULL, "pixels", "the preset's (224; cifar-train 32)",
        "output side of the presets that take a size (stk_transform_preset_sized)", IMAGE,
        OFF(size), ST_INT, NULL, NULL),
    OPT("max_dim", UINT, 1, 1u << 20, NULL, "pixels", "16384",
        "longest image side accepted; a larger image is a bad sample", IMAGE, OFF(max_dim), ST_U32,
        NULL, NULL),
    OPT("exif", BOOL, 0, 1, NULL, NULL, "0", "apply the EXIF orientation of JPEG images", IMAGE,
        OFF(exif), ST_INT, NULL, NULL),
    OPT("strict", BOOL, 0, 1, NULL, NULL, "0",
        "decode each image's whole compressed stream, so damage outside a random crop fails in "
        "every epoch (docs/images.md)",
        IMAGE, OFF(strict), ST_INT, NULL, NULL),
    OPT("scratch_bytes", SIZE, 4096, TB, NULL, NULL, "64M", "decode scratch memory per thread",
        IMAGE, OFF(scratch_bytes), ST_SIZE, NULL, NULL),
    OPT("max_input_bytes", SIZE, 4096, TB, NULL, NULL, "32M",
        "largest encoded image accepted; a larger file is a bad sample", IMAGE,
        OFF(max_input_bytes), ST_SIZE, NULL, NULL),
    /* libjpeg's row buffers take up to about 2 MiB at max_dim widths whatever
     * the cap, so a smaller cap would not be one. */
    OPT("jpeg_memory", SIZE, 4u << 20, TB, NULL, NULL, "64M",
        "libjpeg's own memory per thread; a JPEG needing more fails with STK_ETOOBIG", IMAGE,
        OFF(jpeg_memory), ST_SIZE, NULL, NULL),
    /* The engine (docs/engine.md, docs/memory.md). */
    OPT("depth", UINT, 1, 63, "auto", "batches", "2",
        "batches prepared ahead of the one the consumer holds; auto: the deepest (1..8) that "
        "fits memory_budget",
        ENGINE, 0, ST_NONE, NULL, set_depth),
    OPT("autotune", BOOL, 0, 1, NULL, NULL, "0",
        "the threads set are a cap and the number working adapts to the consumer", ENGINE,
        OFF(autotune), ST_BOOL, NULL, NULL),
    OPT("order", ENUM, 0, 0, "global|shards|blocks", NULL, "global",
        "sample order: one global permutation; shuffled shards with samples shuffled within "
        "windows of shard_window shards; or blocks (runs of consecutive samples of about "
        "block_bytes) shuffled the same way, for remote data without a cache (docs/remote.md)",
        ENGINE, OFF(order), ST_INT, NULL, NULL),
    OPT("block_bytes", SIZE, 4096, TB, NULL, NULL, "5M",
        "bytes of one block of the block order: a remote dataset read without a cache takes "
        "one request a block",
        ENGINE, OFF(block_bytes), ST_U64, NULL, NULL),
    OPT("shard_window", UINT, 1, 1u << 20, NULL, "shards", "8",
        "shards (or blocks) per window of the shard-aware (block) order", ENGINE, OFF(shard_window),
        ST_UNSIGNED, NULL, NULL),
    OPT("local_world_size", UINT, 0, 1u << 20, NULL, "ranks", "0 (the world is one node)",
        "ranks per node: each node reads a contiguous part of the order; must divide the world "
        "size",
        ENGINE, OFF(local_world), ST_UNSIGNED, NULL, NULL),
    OPT("batch_memory", SIZE, 4096, TB, NULL, NULL, "512M",
        "the most one variable-size batch's samples may take", ENGINE, OFF(batch_memory), ST_SIZE,
        NULL, NULL),
    OPT("fields", STRING, 0, 0, NULL, "NAME[?][=SOURCES][:KIND],...",
        "none (one payload and a label)",
        "samples with several fields, e.g. image=jpg;png,caption=txt,label=cls "
        "(docs/multimodal.md)",
        ENGINE, 0, ST_NONE, NULL, set_fields_entry),
    OPT("samples_per_epoch", UINT, 1, (uint64_t)1 << 62, NULL, "samples",
        "the fixed counts plus the sizes of the weighted sources",
        "a mixture's epoch (stk_options_add_source): each source supplies its share of it "
        "(docs/mixing.md)",
        ENGINE, OFF(samples_per_epoch), ST_U64, NULL, NULL),
    OPT("mix_batching", ENUM, 0, 0, "mixed|per_source", NULL, "mixed",
        "a mixture's batches: samples of every source in proportion (mixed), or each batch "
        "from one source, the batch sequence in proportion (per_source; docs/mixing.md)",
        ENGINE, OFF(mix_batching), ST_INT, NULL, NULL),
    OPT("mix_resume", ENUM, 0, 0, "strict|new", NULL, "strict",
        "a saved state of another mixture (sources, weights, samples_per_epoch) is refused "
        "(strict), or resumed at its position with this loader's mixture from there on (new)",
        ENGINE, OFF(mix_resume), ST_INT, NULL, NULL),
    OPT("field_memory", SIZE, 4096, TB, NULL, NULL, "64M",
        "the most one batch's variable fields (text, JSON, bytes, arrays, images of their own "
        "size) may take besides its first image",
        ENGINE, OFF(field_memory), ST_SIZE, NULL, NULL),
    OPT("memory_budget", SIZE, 1, PB, NULL, NULL,
        "a quarter of the available memory, shared by the node's ranks",
        "memory the loader's bound may take when depth is auto", ENGINE, OFF(memory_budget), ST_U64,
        NULL, NULL),
    /* Where batches go (docs/gpu.md). */
    OPT("device", ENUM, 0, 1023, "cpu|cuda|cuda:N|fake|fake:N", NULL, "cpu",
        "where batches are delivered: host memory, a CUDA device, or fake (the tests' host "
        "stand-in for a device)",
        DEVICE, 0, ST_NONE, NULL, set_device),
    /* Remote datasets (docs/remote.md). */
    OPT("endpoint", STRING, 0, 0, NULL, "a URL", "AWS_ENDPOINT_URL, else AWS", "S3 endpoint URL",
        REMOTE, OFF(endpoint), ST_STR, NULL, NULL),
    OPT("region", STRING, 0, 0, NULL, "a region name",
        "AWS_REGION, AWS_DEFAULT_REGION, the profile's, else us-east-1", "S3 region", REMOTE,
        OFF(region), ST_STR, NULL, NULL),
    OPT("addressing", ENUM, 0, 0, "path|virtual|auto", NULL, "auto (path with a custom endpoint)",
        "S3 addressing style", REMOTE, OFF(addressing), ST_INT, addressing_words, NULL),
    OPT("fetch_concurrency", UINT, 1, 1024, NULL, "requests", "128", "requests in flight", REMOTE,
        OFF(fetch_concurrency), ST_UNSIGNED, NULL, NULL),
    OPT("fetch_rate", UINT, 0, 10000000, NULL, "requests a second", "5500",
        "request rate budget (S3 allows about 5500 GETs a second per prefix), halved on each "
        "throttling answer (503/429) and raised again after; 0: no budget",
        REMOTE, OFF(fetch_rate), ST_UNSIGNED, NULL, NULL),
    /* 3: a healthy store's latency passes 3x its p95 for well under 1 % of
     * requests, so hedges go to real stragglers; "The Tail at Scale" hedges
     * at the p95 itself for ~5 % more requests, which the engine allows as
     * its cap (docs/remote.md "Hedged requests"). */
    OPT("fetch_hedge", UINT, 0, 1000, NULL, "x the p95 latency", "3",
        "a request into memory still running after this multiple of the p95 latency of recent "
        "requests is sent again and the first answer wins (at most 5 % of requests); 0: never",
        REMOTE, OFF(fetch_hedge), ST_UNSIGNED, NULL, NULL),
    OPT("fetch_retries", UINT, 0, 100, NULL, "retries", "6", "retries of a failed request", REMOTE,
        0, ST_NONE, NULL, set_retries),
    OPT("fetch_timeout", UINT, 1, 3600, NULL, "seconds", "30",
        "seconds a request may stall (under 1 KiB/s) before it is retried", REMOTE,
        OFF(fetch_timeout), ST_UNSIGNED, NULL, NULL),
    OPT("fetch_buffer", SIZE, 1, PB, NULL, NULL,
        "64M; order blocks: the larger of 64M and 3 x shard_window + 2 blocks",
        "bytes buffered and in flight ahead of the workers", REMOTE, OFF(fetch_buffer), ST_U64,
        NULL, NULL),
    /* Its ring of planned entries counts in the memory bound (fetch.h). */
    OPT("fetch_lookahead", UINT, 1, STK_FETCH_LOOKAHEAD_MAX, NULL, "samples",
        "2 batches or 2 x fetch_concurrency", "samples the fetch stage plans ahead", REMOTE,
        OFF(fetch_lookahead), ST_U64, NULL, NULL),
    OPT("cache_dir", STRING, 0, 0, NULL, "a directory (~ or ~/ for the home directory)",
        "none (no disk cache)", "disk cache of whole shards", REMOTE, 0, ST_NONE, NULL,
        set_cache_dir_entry),
    OPT("cache_limit", SIZE, 1, PB, NULL, NULL, "90% of the free space when the loader opens",
        "size limit of the disk cache", REMOTE, OFF(cache_limit), ST_U64, NULL, NULL),
    /* S3 has no bucket-level ETag that says a prefix changed: a listing is
     * trusted for a time (src/source/listcache.c, docs/remote.md). */
    OPT("listing_ttl", UINT, 0, (uint64_t)1 << 40, NULL, "seconds", "86400 (a day)",
        "unpacked objects in a bucket: seconds the listing kept in cache_dir is reused "
        "instead of listing the prefix again; 0: list on every open",
        REMOTE, 0, ST_NONE, NULL, set_listing_ttl),
    /* Diagnosis (docs/diagnosis.md). */
    OPT("trace", STRING, 0, 0, NULL, "a file name", "none (\"\" turns it off)",
        "Chrome trace-event JSON file written at close", TRACE, 0, ST_NONE, NULL, set_trace),
    OPT("trace_events", UINT, 1024, (uint64_t)1 << 32, NULL, "events", "1048576 (40 MiB)",
        "events the trace keeps (the newest)", TRACE, OFF(trace_events), ST_U64, NULL, NULL),
};
#undef OPT
#define NOPT (sizeof table / sizeof table[0])

const stk_option_info *stk_option_next(const stk_option_info *prev)
{
    if (!prev)
        return &table[0].info;
    const opt_entry *e = (const opt_entry *)(const void *)prev + 1;
    return e < table + NOPT ? &e->info : NULL;
}

const stk_option_info *stk_option_by_name(const char *name)
{
    for (size_t k = 0; name && k < NOPT; k++)
        if (!strcmp(table[k].info.name, name))
            return &table[k].info;
    return NULL;
}

/* The index of v among the '|'-separated words, or -1. */
static int word_index(const char *words, const char *v)
{
    size_t vn = strlen(v);
    for (int k = 0; words && *words; k++) {
        size_t n = strcspn(words, "|");
        if (n == vn && !strncmp(words, v, n))
            return k;
        words += n + (words[n] == '|');
    }
    return -1;
}

/* n as "4K", "1T" where a binary unit divides it exactly, else digits. */
static void fmt_size(char *buf, size_t len, uint64_t n)
{
    static const char units[] = "KMGTP";
    int u = -1;
    while (n && u < 4 && !(n & 1023))
        n >>= 10, u++;
    if (u < 0)
        stk__fmt(buf, len, "%llu", (unsigned long long)n);
    else
        stk__fmt(buf, len, "%llu%c", (unsigned long long)n, units[u]);
}

/* What the option takes, for its message: "seconds, 1..3600". */
static void describe(const stk_option_info *in, char *buf, size_t len)
{
    char lo[32], hi[32], range[80];
    if (in->type == STK_OPTION_SIZE) {
        fmt_size(lo, sizeof lo, in->min);
        fmt_size(hi, sizeof hi, in->max);
    } else {
        stk__fmt(lo, sizeof lo, "%llu", (unsigned long long)in->min);
        stk__fmt(hi, sizeof hi, "%llu", (unsigned long long)in->max);
    }
    if (in->max >= TB && in->type != STK_OPTION_SIZE)
        stk__fmt(range, sizeof range, "%s or more", lo);
    else
        stk__fmt(range, sizeof range, "%s..%s", lo, hi);
    switch (in->type) {
    case STK_OPTION_BOOL: stk__fmt(buf, len, "0 or 1"); break;
    case STK_OPTION_SIZE:
        stk__fmt(buf, len, "a size in bytes (%s), %s", STK__SIZE_SYNTAX, range);
        break;
    case STK_OPTION_ENUM: {
        size_t at = 0;
        const char *w = in->values;
        buf[0] = '\0';
        for (int k = 0; *w; k++) {
            size_t n = strcspn(w, "|");
            const char *sep = !k ? "" : w[n] ? ", " : " or ";
            if (at < len)
                at += (size_t)snprintf(buf + at, len - at, "%s%.*s", sep, (int)n, w);
            w += n + (w[n] == '|');
        }
        if (in->max && at < len)
            snprintf(buf + at, len - at, " (N %s)", range);
        break;
    }
    case STK_OPTION_STRING: stk__fmt(buf, len, "%s", in->unit ? in->unit : "text"); break;
    default:
        if (in->unit && !strcmp(in->unit, "seconds"))
            stk__fmt(buf, len, "seconds, %s", range);
        else if (in->unit)
            stk__fmt(buf, len, "a number of %s, %s", in->unit, range);
        else
            stk__fmt(buf, len, "a number, %s", range);
        if (in->values)
            stk__fmt(buf + strlen(buf), len - strlen(buf), ", or %s", in->values);
        break;
    }
}

static void store(stk_options *o, const opt_entry *e, uint64_t n)
{
    void *f = (char *)o + e->off;
    switch (e->store) {
    case ST_BOOL: *(bool *)f = n != 0; break;
    case ST_INT: *(int *)f = (int)n; break;
    case ST_UNSIGNED: *(unsigned *)f = (unsigned)n; break;
    case ST_U32: *(uint32_t *)f = (uint32_t)n; break;
    case ST_SIZE: *(size_t *)f = (size_t)n; break;
    case ST_U64: *(uint64_t *)f = n; break;
    default: break;
    }
}

/* Parses and checks value as e takes it, then stores it. */
static int set_entry(stk_options *o, const opt_entry *e, const char *value)
{
    const stk_option_info *in = &e->info;
    uint64_t n = 0;
    int k;
    switch (in->type) {
    case STK_OPTION_BOOL:
        if (strcmp(value, "0") && strcmp(value, "1"))
            return STK_EINVAL;
        n = value[0] == '1';
        break;
    case STK_OPTION_ENUM:
        if (e->set)
            return e->set(o, value, 0);
        if ((k = word_index(in->values, value)) < 0)
            return STK_EINVAL;
        n = e->words ? (uint64_t)(int64_t)e->words[k] : (uint64_t)k;
        break;
    case STK_OPTION_STRING:
        if (e->set)
            return e->set(o, value, 0);
        return set_str((char **)(void *)((char *)o + e->off), value);
    default:
        if (word_index(in->values, value) >= 0)
            break; /* a word the number's setter takes ("auto") */
        if (stk_parse_size(value, &n) != STK_OK || n < in->min || n > in->max)
            return STK_EINVAL;
        break;
    }
    if (e->set)
        return e->set(o, value, n);
    store(o, e, n);
    return STK_OK;
}

int stk_options_set(stk_options *o, const char *key, const char *value)
{
    if (!o)
        return STK_EINVAL;
    o->errmsg[0] = '\0';
    const opt_entry *e = NULL;
    for (size_t k = 0; key && k < NOPT && !e; k++)
        if (!strcmp(table[k].info.name, key))
            e = &table[k];
    if (!key || !value) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "%s: no %s given", key ? key : "(null)",
                 key ? "value" : "key");
        return STK_EINVAL;
    }
    if (!e) {
        stk__fmt(o->errmsg, sizeof o->errmsg,
                 "unknown option '%.64s' (the options: stk_option_next, docs/options.md)", key);
        return STK_EINVAL;
    }
    int rc = set_entry(o, e, value);
    if (rc == STK_OK && (e->info.flags & STK_OPTION_REMOTE)) {
        if (!o->remote_set)
            o->remote_set = e->info.name;
        if (!strcmp(key, "cache_limit"))
            o->cache_limit_set = true;
    }
    if (rc == STK_EINVAL && !o->errmsg[0]) {
        char what[320];
        describe(&e->info, what, sizeof what);
        stk__fmt(o->errmsg, sizeof o->errmsg, "%s takes %s, got '%.64s'", key, what, value);
    } else if (rc == STK_ENOMEM) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "%s: out of memory", key);
    }
    return rc;
}

const char *stk_options_errmsg(const stk_options *o)
{
    return o ? o->errmsg : "";
}

/* ---- Reading an option back ------------------------------------------------ */

/* Appends to buf (n bytes) at *at, keeping track of the length the whole text
 * needs even when buf is too small. */
static void put(char *buf, size_t n, size_t *at, const char *pre, const char *s)
{
    int w = snprintf(*at < n ? buf + *at : NULL, *at < n ? n - *at : 0, "%s%s", pre, s);
    if (w > 0)
        *at += (size_t)w;
}

/* "fields" as stk_options_set_fields reads it: NAME[?][=SOURCES][:KIND],... */
static size_t fields_text(const stk_options *o, char *buf, size_t n)
{
    size_t at = 0;
    if (n)
        buf[0] = '\0';
    for (size_t k = 0; k < o->nfields; k++) {
        const stk__fspec *f = &o->fields[k];
        put(buf, n, &at, k ? "," : "", f->name);
        if (f->flags & STK_FIELD_OPTIONAL)
            put(buf, n, &at, "", "?");
        if (strcmp(f->sources, f->name))
            put(buf, n, &at, "=", f->sources);
        if (f->kind != STK_FIELD_AUTO)
            put(buf, n, &at, ":", stk_field_kind_name(f->kind));
    }
    return at;
}

/* The value of entry e in o as text stk_options_set takes back; returns the
 * length the whole text needs (buf holds as much of it as fits). */
static size_t entry_text(const stk_options *o, const opt_entry *e, char *buf, size_t n)
{
    const char *name = e->info.name;
    const void *f = (const char *)o + e->off;
    uint64_t v = 0;
    const char *s = NULL;
    char num[32];
    if (!strcmp(name, "fields"))
        return fields_text(o, buf, n);
    if (!strcmp(name, "depth")) {
        if (o->depth_auto)
            s = "auto";
        v = o->depth;
    } else if (!strcmp(name, "listing_ttl")) {
        v = o->listing_ttl == UINT64_MAX ? 0 : o->listing_ttl ? o->listing_ttl : 86400;
    } else if (!strcmp(name, "fetch_retries")) {
        v = o->fetch_retries == UINT32_MAX ? 0 : o->fetch_retries ? o->fetch_retries : 6;
    } else if (!strcmp(name, "device")) {
        static const char *const kinds[] = {"cpu", "cuda", "fake"};
        if (o->device == STK_DEVICE_CPU)
            s = "cpu";
        else
            stk__fmt(num, sizeof num, "%s:%d", kinds[o->device], o->device_id), s = num;
    } else if (!strcmp(name, "cache_dir")) {
        s = o->cache_dir ? o->cache_dir : "";
    } else if (!strcmp(name, "trace")) {
        s = o->trace ? o->trace : "";
    } else if (e->store == ST_STR) {
        s = *(char *const *)f ? *(char *const *)f : "";
    } else {
        switch (e->store) {
        case ST_BOOL: v = *(const bool *)f; break;
        case ST_INT: v = (uint64_t)(int64_t) * (const int *)f; break;
        case ST_UNSIGNED: v = *(const unsigned *)f; break;
        case ST_U32: v = *(const uint32_t *)f; break;
        case ST_SIZE: v = *(const size_t *)f; break;
        case ST_U64: v = *(const uint64_t *)f; break;
        default: break;
        }
        if (e->info.type == STK_OPTION_ENUM) {
            /* The word whose stored value is v. */
            const char *w = e->info.values;
            for (int k = 0; *w; k++) {
                size_t m = strcspn(w, "|");
                int64_t stored = e->words ? e->words[k] : k;
                if ((uint64_t)stored == v) {
                    stk__fmt(num, sizeof num, "%.*s", (int)m, w);
                    s = num;
                    break;
                }
                w += m + (w[m] == '|');
            }
        }
    }
    /* 0 below the range: not set, the library picks the value later
     * ("size": the preset's; "fetch_concurrency": 128). */
    if (!s && !v && e->info.min > 0 && e->info.type != STK_OPTION_ENUM)
        s = "";
    size_t at = 0;
    if (n)
        buf[0] = '\0';
    if (s) {
        put(buf, n, &at, "", s);
    } else {
        stk__fmt(num, sizeof num, "%llu", (unsigned long long)v);
        put(buf, n, &at, "", num);
    }
    return at;
}

static const opt_entry *find_entry(const char *key)
{
    for (size_t k = 0; key && k < NOPT; k++)
        if (!strcmp(table[k].info.name, key))
            return &table[k];
    return NULL;
}

int stk_options_get(const stk_options *o, const char *key, char *buf, size_t n)
{
    if (!o || !buf || !n)
        return STK_EINVAL;
    buf[0] = '\0';
    const opt_entry *e = find_entry(key);
    if (!e)
        return STK_EINVAL;
    return entry_text(o, e, buf, n) < n ? STK_OK : STK_ETOOBIG;
}

int stk_options_reset(stk_options *o, const char *key)
{
    if (!o)
        return STK_EINVAL;
    o->errmsg[0] = '\0';
    const opt_entry *e = find_entry(key);
    if (!e) {
        stk__fmt(o->errmsg, sizeof o->errmsg,
                 "unknown option '%.64s' (the options: stk_option_next, docs/options.md)",
                 key ? key : "(null)");
        return STK_EINVAL;
    }
    /* The default is what a fresh object holds: copy the field from one, or
     * undo what the entry's setter does. */
    stk_options d;
    memset(&d, 0, sizeof d);
    stk_options *fresh = NULL;
    if (stk_options_create(&fresh) != STK_OK)
        return STK_ENOMEM;
    d = *fresh;
    stk__free(fresh);
    const char *name = e->info.name;
    if (!strcmp(name, "depth")) {
        o->depth = d.depth;
        o->depth_auto = d.depth_auto;
    } else if (!strcmp(name, "fields")) {
        stk__fspecs_free(o->fields, o->nfields);
        o->fields = NULL;
        o->nfields = 0;
    } else if (!strcmp(name, "device")) {
        o->device = d.device;
        o->device_id = d.device_id;
    } else if (!strcmp(name, "fetch_retries")) {
        o->fetch_retries = d.fetch_retries;
    } else if (!strcmp(name, "listing_ttl")) {
        o->listing_ttl = d.listing_ttl;
    } else if (!strcmp(name, "cache_dir") || !strcmp(name, "trace") || e->store == ST_STR) {
        char **p = !strcmp(name, "cache_dir") ? &o->cache_dir
                   : !strcmp(name, "trace")   ? &o->trace
                                              : (char **)(void *)((char *)o + e->off);
        stk__free(*p);
        *p = NULL;
    } else if (e->store != ST_NONE) {
        memcpy((char *)o + e->off, (const char *)&d + e->off,
               e->store == ST_BOOL   ? sizeof(bool)
               : e->store == ST_INT  ? sizeof(int)
               : e->store == ST_U32  ? sizeof(uint32_t)
               : e->store == ST_SIZE ? sizeof(size_t)
               : e->store == ST_U64  ? sizeof(uint64_t)
                                     : sizeof(unsigned));
    }
    /* A remote option back at its default no longer counts as set. */
    if (!strcmp(name, "cache_limit"))
        o->cache_limit_set = false;
    if (o->remote_set && !strcmp(o->remote_set, name))
        o->remote_set = NULL;
    return STK_OK;
}

int stk__imgpipe_from_options(stk__imgpipe **out, const char *spec, const stk_options *o, char *err,
                              size_t errlen)
{
    stk__imgpipe_params prm = {o->dtype, o->nchw, o->size, o->exif, o->max_dim};
    int rc = stk__imgpipe_create(out, spec, &prm, err, errlen);
    if (rc)
        return rc;
    stk__imgpipe_set_strict(*out, o->strict);
    stk__imgpipe_set_jpeg_memory(*out, o->jpeg_memory);
    return STK_OK;
}

void stk__options_source_params(const stk_options *o, stk__source_params *prm,
                                stk__remote_cfg *rcfg)
{
    memset(prm, 0, sizeof *prm);
    memset(rcfg, 0, sizeof *rcfg);
    if (!o)
        return;
    *rcfg = (stk__remote_cfg){.endpoint = o->endpoint,
                              .region = o->region,
                              .addressing = o->addressing,
                              .concurrency = o->fetch_concurrency,
                              .retries = o->fetch_retries,
                              .rate = o->fetch_rate ? o->fetch_rate : UINT32_MAX,
                              .hedge = o->fetch_hedge ? o->fetch_hedge : UINT32_MAX,
                              .timeout_s = o->fetch_timeout};
    prm->record_bytes = o->record_bytes;
    prm->header_bytes = o->header_bytes;
    prm->label_bytes = o->label_bytes;
    prm->remote = rcfg;
    prm->cache_dir = o->cache_dir;
    prm->cache_limit = o->cache_limit;
    prm->listing_ttl = o->listing_ttl;
    prm->warn = o->warn;
    prm->warn_user = o->warn_user;
}
