/* options.c -- typed setters for stk_options; every value is checked here so a
 * bad option fails at the call that set it. */
#include "options.h"
#include "fetch/fetch.h"

#include <errno.h>
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
    return STK_OK;
}

void stk_options_destroy(stk_options *o)
{
    if (!o)
        return;
    stk__free(o->source);
    stk__free(o->transform);
    stk__free(o->endpoint);
    stk__free(o->region);
    stk__free(o->cache_dir);
    stk__free(o->trace);
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
    if (!o || !path || !*path)
        return STK_EINVAL;
    return set_str(&o->source, path);
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

int stk_options_set_batch_size(stk_options *o, size_t n)
{
    if (!o || n < 1 || n > (1u << 24))
        return STK_EINVAL;
    o->batch_size = n;
    return STK_OK;
}

int stk_options_set_threads(stk_options *o, unsigned n)
{
    if (!o || n > 256)
        return STK_EINVAL;
    o->threads = n;
    return STK_OK;
}

int stk_options_set_depth(stk_options *o, unsigned n)
{
    if (!o || n < 1 || n > 63)
        return STK_EINVAL;
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
    if (!o || world_size < 1 || rank >= world_size)
        return STK_EINVAL;
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

int stk_options_set_max_sample_bytes(stk_options *o, size_t n)
{
    if (!o || n < 1 || n > ((size_t)1 << 40))
        return STK_EINVAL;
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

/* A size (stk_parse_size) no larger than max. */
static int parse_size(const char *v, uint64_t max, uint64_t *out)
{
    uint64_t n;
    if (stk_parse_size(v, &n) != STK_OK || n > max)
        return STK_EINVAL;
    *out = n;
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

int stk_options_set(stk_options *o, const char *key, const char *value)
{
    uint64_t n;
    if (!o || !key || !value)
        return STK_EINVAL;
    if (!strcmp(key, "layout")) {
        if (!strcmp(value, "nchw"))
            o->nchw = 1;
        else if (!strcmp(value, "nhwc"))
            o->nchw = 0;
        else
            return STK_EINVAL;
        return STK_OK;
    }
    if (!strcmp(key, "dtype")) {
        static const char *const names[] = {"uint8", "float32", "float16", "bfloat16"};
        for (int k = 0; k < 4; k++)
            if (!strcmp(value, names[k])) {
                o->dtype = k;
                return STK_OK;
            }
        return STK_EINVAL;
    }
    if (!strcmp(key, "exif") || !strcmp(key, "strict") || !strcmp(key, "autotune")) {
        if (strcmp(value, "0") && strcmp(value, "1"))
            return STK_EINVAL;
        if (key[0] == 'e')
            o->exif = value[0] == '1';
        else if (key[0] == 's')
            o->strict = value[0] == '1';
        else
            o->autotune = value[0] == '1';
        return STK_OK;
    }
    if (!strcmp(key, "size")) {
        if (parse_size(value, 65535, &n) || n < 1)
            return STK_EINVAL;
        o->size = (int)n;
        return STK_OK;
    }
    if (!strcmp(key, "max_dim")) {
        if (parse_size(value, 1u << 20, &n) || n < 1)
            return STK_EINVAL;
        o->max_dim = (uint32_t)n;
        return STK_OK;
    }
    if (!strcmp(key, "scratch_bytes") || !strcmp(key, "max_input_bytes") ||
        !strcmp(key, "jpeg_memory")) {
        /* jpeg_memory: libjpeg's row buffers take up to about 2 MiB at max_dim
         * widths whatever the cap, so a smaller cap would not be one. */
        if (parse_size(value, (uint64_t)1 << 40, &n) || n < (key[0] == 'j' ? 4u << 20 : 4096))
            return STK_EINVAL;
        if (key[0] == 's')
            o->scratch_bytes = (size_t)n;
        else if (key[0] == 'm')
            o->max_input_bytes = (size_t)n;
        else
            o->jpeg_memory = (size_t)n;
        return STK_OK;
    }
    /* Remote datasets (docs/remote.md). */
    if (!strcmp(key, "endpoint"))
        return set_str(&o->endpoint, value);
    if (!strcmp(key, "region"))
        return set_str(&o->region, value);
    if (!strcmp(key, "cache_dir"))
        return set_cache_dir(o, value);
    /* depth "auto": the deepest ring (1..8) whose memory bound fits
     * memory_budget (docs/memory.md); a number sets depth as
     * stk_options_set_depth does. */
    if (!strcmp(key, "depth")) {
        if (!strcmp(value, "auto")) {
            o->depth_auto = true;
            return STK_OK;
        }
        if (parse_size(value, 63, &n) || n < 1)
            return STK_EINVAL;
        o->depth_auto = false;
        o->depth = (unsigned)n;
        return STK_OK;
    }
    /* Ranks per node: each node reads a contiguous part of the order
     * (docs/engine.md); must divide the world size at open. */
    if (!strcmp(key, "local_world_size")) {
        if (parse_size(value, 1u << 20, &n))
            return STK_EINVAL;
        o->local_world = (unsigned)n;
        return STK_OK;
    }
    /* The most one variable-size batch's samples may take (docs/memory.md). */
    if (!strcmp(key, "batch_memory")) {
        if (parse_size(value, (uint64_t)1 << 40, &n) || n < 4096)
            return STK_EINVAL;
        o->batch_memory = (size_t)n;
        return STK_OK;
    }
    if (!strcmp(key, "memory_budget")) {
        if (parse_size(value, (uint64_t)1 << 50, &n) || n < 1)
            return STK_EINVAL;
        o->memory_budget = n;
        return STK_OK;
    }
    /* Trace (docs/diagnosis.md); "" turns it off. */
    if (!strcmp(key, "trace")) {
        if (!*value) {
            stk__free(o->trace);
            o->trace = NULL;
            return STK_OK;
        }
        return set_str(&o->trace, value);
    }
    if (!strcmp(key, "trace_events")) {
        if (parse_size(value, (uint64_t)1 << 32, &n) || n < 1024)
            return STK_EINVAL;
        o->trace_events = n;
        return STK_OK;
    }
    if (!strcmp(key, "addressing")) {
        if (!strcmp(value, "path"))
            o->addressing = 1;
        else if (!strcmp(value, "virtual"))
            o->addressing = 2;
        else if (!strcmp(value, "auto"))
            o->addressing = 0;
        else
            return STK_EINVAL;
        return STK_OK;
    }
    if (!strcmp(key, "fetch_concurrency") || !strcmp(key, "fetch_retries") ||
        !strcmp(key, "fetch_timeout")) {
        uint64_t lo = key[6] == 'r' ? 0 : 1, hi = key[6] == 'c' ? 1024 : key[6] == 'r' ? 100 : 3600;
        if (parse_size(value, hi, &n) || n < lo)
            return STK_EINVAL;
        if (key[6] == 'c')
            o->fetch_concurrency = (unsigned)n;
        else if (key[6] == 'r')
            o->fetch_retries = n ? (unsigned)n : UINT32_MAX;
        else
            o->fetch_timeout = (unsigned)n;
        return STK_OK;
    }
    /* Where batches are delivered (docs/gpu.md): "cpu", "cuda", "cuda:N",
     * "fake", "fake:N" (the tests' CPU stand-in for a device). */
    if (!strcmp(key, "device")) {
        int kind;
        const char *rest;
        if (!strncmp(value, "cuda", 4))
            kind = STK_DEVICE_CUDA, rest = value + 4;
        else if (!strncmp(value, "fake", 4))
            kind = STK_DEVICE_FAKE, rest = value + 4;
        else if (!strcmp(value, "cpu"))
            kind = STK_DEVICE_CPU, rest = value + 3;
        else
            return STK_EINVAL;
        n = 0;
        if (*rest == ':' && (kind == STK_DEVICE_CPU || parse_size(rest + 1, 1023, &n)))
            return STK_EINVAL;
        if (*rest && *rest != ':')
            return STK_EINVAL;
        o->device = kind;
        o->device_id = (int)n;
        return STK_OK;
    }
    if (!strcmp(key, "order")) {
        if (!strcmp(value, "shards"))
            o->shard_order = true;
        else if (!strcmp(value, "global"))
            o->shard_order = false;
        else
            return STK_EINVAL;
        return STK_OK;
    }
    if (!strcmp(key, "shard_window")) {
        if (parse_size(value, 1u << 20, &n) || n < 1)
            return STK_EINVAL;
        o->shard_window = (unsigned)n;
        return STK_OK;
    }
    if (!strcmp(key, "fetch_buffer") || !strcmp(key, "cache_limit") ||
        !strcmp(key, "fetch_lookahead")) {
        /* fetch_lookahead: its ring counts in the memory bound (fetch.h). */
        uint64_t max = !strcmp(key, "fetch_lookahead") ? STK_FETCH_LOOKAHEAD_MAX : (uint64_t)1 << 50;
        if (parse_size(value, max, &n) || n < 1)
            return STK_EINVAL;
        if (key[0] == 'c')
            o->cache_limit = n;
        else if (key[6] == 'b')
            o->fetch_buffer = n;
        else
            o->fetch_lookahead = n;
        return STK_OK;
    }
    return STK_EINVAL;
}
