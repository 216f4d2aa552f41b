/*
 * bench.c -- `stoker bench PATH [options]`: iterates a dataset and reports
 * throughput, memory, per-stage times, starvation and checksums of what was
 * delivered; and the parsing of the loader options bench and doctor share
 * (stoker_parse_bench).
 */
#include "stoker.h"

#include "commands.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* Folds one batch into the checksum: labels, then each sample's length and
 * bytes, so equal checksums mean equal batches in equal order. */
static void hash_batch(XXH3_state_t *h, const stk_batch *b)
{
    XXH3_64bits_update(h, b->labels, b->size * sizeof *b->labels);
    if (b->device != STK_DEVICE_CPU)
        return; /* device memory: not readable here */
    if (b->kind == STK_BATCH_DENSE) {
        XXH3_64bits_update(h, b->data, b->size * b->sample_bytes);
        return;
    }
    for (size_t k = 0; k < b->size; k++) {
        uint64_t len = b->lengths[k];
        XXH3_64bits_update(h, &len, sizeof len);
        XXH3_64bits_update(h, (const uint8_t *)b->data + b->offsets[k], len);
    }
}

/* One checksum per field (--fields), in the order the fields were asked
 * for: each sample of the field in delivery order, a dense sample as its
 * sample_bytes bytes, a variable one as its length (8 bytes, native order)
 * then its bytes, and the absent sample of an optional field as the length
 * UINT64_MAX alone, so an absent sample and an empty one differ. A field
 * whose data is device memory counts its samples but hashes nothing. */
#define MAX_FIELDS 32
typedef struct field_sums {
    size_t n;
    XXH3_state_t *h[MAX_FIELDS];
    char name[MAX_FIELDS][64];
    const char *kind[MAX_FIELDS];
    uint64_t present[MAX_FIELDS], absent[MAX_FIELDS];
    bool device[MAX_FIELDS];
} field_sums;

static void hash_field(field_sums *fs, size_t k, const stk_field *f, size_t size)
{
    XXH3_state_t *h = fs->h[k];
    static const uint64_t absent = UINT64_MAX;
    for (size_t j = 0; j < size; j++) {
        if (f->present && !f->present[j]) {
            fs->absent[k]++;
            if (f->device == STK_DEVICE_CPU)
                XXH3_64bits_update(h, &absent, sizeof absent);
            continue;
        }
        fs->present[k]++;
        if (f->device != STK_DEVICE_CPU)
            continue; /* device memory: not readable here */
        if (f->layout == STK_BATCH_DENSE) {
            XXH3_64bits_update(h, (const uint8_t *)f->data + j * f->sample_bytes, f->sample_bytes);
        } else {
            uint64_t len = f->lengths[j];
            XXH3_64bits_update(h, &len, sizeof len);
            XXH3_64bits_update(h, (const uint8_t *)f->data + f->offsets[j], len);
        }
    }
}

/* Folds the batch's fields into their checksums (the states are made at the
 * first batch). False when out of memory. */
static bool hash_fields(field_sums *fs, const stk_batch *b)
{
    if (!fs->n && b->nfields) {
        size_t n = b->nfields < MAX_FIELDS ? b->nfields : MAX_FIELDS;
        for (size_t k = 0; k < n; k++) {
            if (!(fs->h[k] = XXH3_createState()))
                return false;
            fs->n = k + 1; /* freed by the caller from here on */
            XXH3_64bits_reset(fs->h[k]);
            snprintf(fs->name[k], sizeof fs->name[k], "%s", b->fields[k].name);
            fs->kind[k] = stk_field_kind_name(b->fields[k].kind);
            fs->device[k] = b->fields[k].device != STK_DEVICE_CPU;
        }
    }
    for (size_t k = 0; k < fs->n && k < b->nfields; k++) {
        /* (An npy field with a device is on it only in batches whose
         * arrays stack: its checksum then covers part of the samples.) */
        fs->device[k] = fs->device[k] || b->fields[k].device != STK_DEVICE_CPU;
        hash_field(fs, k, &b->fields[k], b->size);
    }
    return true;
}

static void print_fields(const field_sums *fs, bool json)
{
    if (json && fs->n) {
        printf(",\"fields\":[");
        for (size_t k = 0; k < fs->n; k++) {
            printf("%s{\"name\":", k ? "," : "");
            stoker_json_str(stdout, fs->name[k]);
            printf(",\"kind\":\"%s\",\"present\":%" PRIu64 ",\"absent\":%" PRIu64 ",\"checksum\":",
                   fs->kind[k] ? fs->kind[k] : "?", fs->present[k], fs->absent[k]);
            if (fs->device[k])
                printf("null}");
            else
                printf("\"%016llx\"}", (unsigned long long)XXH3_64bits_digest(fs->h[k]));
        }
        printf("]");
    }
    for (size_t k = 0; !json && k < fs->n; k++) {
        printf("  field        %s (%s)", fs->name[k], fs->kind[k] ? fs->kind[k] : "?");
        if (fs->device[k])
            printf(": on the device (not hashed)");
        else
            printf(": checksum %016llx", (unsigned long long)XXH3_64bits_digest(fs->h[k]));
        printf(", %" PRIu64 " samples", fs->present[k]);
        if (fs->absent[k])
            printf(", %" PRIu64 " without it", fs->absent[k]);
        printf("\n");
    }
}

/* Sets option key; a bad value is reported under the flag as the user wrote
 * it (flag), with what the library says the key takes. */
static int set_flag(stk_options *o, const char *key, const char *flag, const char *val)
{
    if (stk_options_set(o, key, val) != STK_OK) {
        const char *why = stk_options_errmsg(o);
        size_t n = strlen(key);
        /* The message starts with the key: show the flag in its place. */
        if (!strncmp(why, key, n))
            fprintf(stderr, "stoker: %s%s\n", flag, why + n);
        else
            fprintf(stderr, "stoker: %s: %s\n", flag, why);
        return 2;
    }
    return 0;
}

static int set_opt(stk_options *o, const char *key, const char *val)
{
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", key);
    return set_flag(o, key, flag, val);
}

/* A path the fetch stage reads (docs/remote.md). */
static bool is_remote(const char *path)
{
    return !strncmp(path, "http://", 7) || !strncmp(path, "https://", 8) ||
           !strncmp(path, "s3://", 5);
}

/* The fetch stage's counters (remote datasets): a report line, or a JSON
 * member ",\"fetch\":{...}". Prints nothing for a local dataset. */
void stoker_print_fetch(stk_loader *l, bool json, double secs)
{
    stk_fetch_stats f = {.struct_size = sizeof f};
    if (stk_loader_fetch_stats(l, &f) != STK_OK)
        return;
    double over = f.sample_bytes ? (double)f.bytes / (double)f.sample_bytes : 0.0;
    if (json) {
        printf(",\"fetch\":{\"requests\":%" PRIu64 ",\"retries\":%" PRIu64 ",\"failures\":%" PRIu64
               ",\"bytes\":%" PRIu64 ",\"sample_bytes\":%" PRIu64 ",\"overfetch_bytes\":%" PRIu64
               ",\"fetched_per_needed\":%.4f,\"inflight_peak\":%" PRIu64 ",\"waits\":%" PRIu64
               ",\"wait_s\":%.6f,\"buffered_peak_bytes\":%" PRIu64 ",\"cache_hits\":%" PRIu64
               ",\"cache_misses\":%" PRIu64 ",\"cache_evictions\":%" PRIu64
               ",\"cache_fallbacks\":%" PRIu64 ",\"io_busy_s\":%.6f",
               f.requests, f.retries, f.failures, f.bytes, f.sample_bytes, f.overfetch_bytes, over,
               f.inflight_peak, f.waits, (double)f.wait_ns * 1e-9, f.buffered_peak, f.cache_hits,
               f.cache_misses, f.cache_evictions, f.cache_fallbacks, (double)f.io_busy_ns * 1e-9);
        printf(",\"request_mean_s\":%.6f,\"first_byte_mean_s\":%.6f,\"throttled\":%" PRIu64
               ",\"rate_limit\":%" PRIu64 ",\"hedges\":%" PRIu64 ",\"hedge_wins\":%" PRIu64
               ",\"cache_partial_reads\":%" PRIu64 ",\"cache_cold_ranged\":%" PRIu64
               ",\"cache_download_parts\":%" PRIu64 "}",
               f.completed ? (double)f.request_ns * 1e-9 / (double)f.completed : 0.0,
               f.completed ? (double)f.first_byte_ns * 1e-9 / (double)f.completed : 0.0,
               f.throttled, f.rate_limit, f.hedges, f.hedge_wins, f.cache_partial_reads,
               f.cache_cold_ranged, f.cache_download_parts);
        return;
    }
    char b1[32], b2[32];
    printf("  fetch        %" PRIu64 " requests (%.0f/s, %" PRIu64 " retries, %" PRIu64
           " failed), %s received (%.3fx the samples' %s), peak %" PRIu64 " in flight\n",
           f.requests, secs > 0 ? (double)f.requests / secs : 0.0, f.retries, f.failures,
           stoker_human_bytes((double)f.bytes, b1, sizeof b1), over,
           stoker_human_bytes((double)f.sample_bytes, b2, sizeof b2), f.inflight_peak);
    printf("  fetch wait   %" PRIu64 " reads waited %.3f s for the network; cache %" PRIu64
           " hits, %" PRIu64 " downloads, %" PRIu64 " evictions, %" PRIu64 " fallbacks\n",
           f.waits, (double)f.wait_ns * 1e-9, f.cache_hits, f.cache_misses, f.cache_evictions,
           f.cache_fallbacks);
    if (f.cache_partial_reads || f.cache_cold_ranged || f.cache_download_parts)
        printf("  cold cache   %" PRIu64 " samples read while their shard downloaded, %" PRIu64
               " fetched by range ahead of it, %" PRIu64 " download parts\n",
               f.cache_partial_reads, f.cache_cold_ranged, f.cache_download_parts);
    if (f.completed)
        printf("  latency      %.1f ms per request on average, %.1f ms to the first byte\n",
               (double)f.request_ns * 1e-6 / (double)f.completed,
               (double)f.first_byte_ns * 1e-6 / (double)f.completed);
    if (f.throttled)
        printf("  throttled    %" PRIu64 " answers 503/429: the request budget is now %" PRIu64
               "/s (fetch_rate)\n",
               f.throttled, f.rate_limit);
    if (f.hedges)
        printf("  hedged       %" PRIu64 " slow requests sent again (fetch_hedge), %" PRIu64
               " of them answered first\n",
               f.hedges, f.hedge_wins);
}

/* Does the transform spec use a preset whose output size --size sets
 * (stk_transform_preset_sized)? */
static bool has_preset(const char *spec)
{
    for (const char *p = spec; p && *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strcspn(p, "|");
        size_t m = n;
        while (m && (p[m - 1] == ' ' || p[m - 1] == '\t'))
            m--;
        char name[64];
        if (m < sizeof name) {
            memcpy(name, p, m);
            name[m] = '\0';
            if (stk_transform_preset_sized(name))
                return true;
        }
        p += n + (p[n] == '|');
    }
    return false;
}

/* The presets --size applies to, for messages: "a, b, c". */
static const char *sized_presets(char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (const char *p = stk_transform_preset_next(NULL); p && at < n;
         p = stk_transform_preset_next(p))
        if (stk_transform_preset_sized(p))
            at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? ", " : "", p);
    return buf;
}

/* What the arguments said that is checked once all are read. */
typedef struct bench_seen {
    uint64_t rank, world, record, header, label;
    const char *size, *header_opt, *remote_flag;
    bool cache_dir, cache_limit;
} bench_seen;

/* The checks across flags, after the last argument: 0, or 2 with the
 * message printed; then the partition, the path and the records. */
static int finish_bench(const bench_seen *w, stk_options *o, bench_args *a)
{
    if (!a->path && !a->nmix) {
        fprintf(stderr, "stoker: bench needs a dataset PATH (or --mix sources)\n");
        return 2;
    }
    if (a->path && a->nmix) {
        fprintf(stderr, "stoker: give a dataset PATH or --mix sources, not both\n");
        return 2;
    }
    if (w->rank >= w->world) {
        fprintf(stderr,
                "stoker: --rank %" PRIu64 " is out of range for --world-size %" PRIu64
                " (0..%" PRIu64 ")\n",
                w->rank, w->world, w->world - 1);
        return 2;
    }
    /* Options that would otherwise change nothing are refused, so a run never
     * silently measures something other than what was asked for. */
    if (w->size && !has_preset(a->transform)) {
        char presets[128];
        fprintf(stderr,
                "stoker: --size sets the output size of the presets (%s); --transform %s has "
                "none (give sizes in the spec instead)\n",
                sized_presets(presets, sizeof presets), a->transform ? a->transform : "none");
        return 2;
    }
    if (w->remote_flag && a->path && !is_remote(a->path)) {
        fprintf(stderr,
                "stoker: %s applies to remote datasets (http://, https://, s3://); %s is a "
                "local path, which is read directly\n",
                w->remote_flag, a->path);
        return 2;
    }
    if (w->cache_limit && !w->cache_dir) {
        fprintf(stderr, "stoker: --cache-limit is the size limit of the disk cache; give "
                        "--cache-dir too\n");
        return 2;
    }
    if (w->header_opt && !w->record) {
        fprintf(stderr, "stoker: %s applies to record files; give --record-size too\n",
                w->header_opt);
        return 2;
    }
    if (stk_options_set_partition(o, (unsigned)w->rank, (unsigned)w->world) ||
        (a->path && stk_options_set_source(o, a->path))) {
        fprintf(stderr, "stoker: invalid partition or path\n");
        return 2;
    }
    if (w->record &&
        stk_options_set_records(o, (size_t)w->record, (size_t)w->header, (unsigned)w->label)) {
        fprintf(stderr, "stoker: invalid --record-size/--label-bytes (label bytes 0,1,2,4,8 "
                        "and smaller than the record)\n");
        return 2;
    }
    return 0;
}

/* Parses bench's arguments into o. Returns 0, or 2 for bad usage (with the
 * message printed). */
/* The flags that take a count or a size (--batch-size ... --label-bytes):
 * 1 when k is none of them, 0 when it was parsed (*rc: the setter's code),
 * 2 for bad usage with the message printed. */
static int parse_count_flag(int *ip, const char *k, const char *val, stk_options *o, bench_args *a,
                            bench_seen *w, int *rc)
{
    uint64_t v = 0;
#define NUM(lo, hi)                                                                                \
    do {                                                                                           \
        if (!stoker_parse_opt(k, val, (lo), (hi), &v))                                             \
            return 2;                                                                              \
        (*ip)++;                                                                                   \
    } while (0)
#define NUM_BYTES(lo, hi)                                                                          \
    do {                                                                                           \
        if (!stoker_parse_bytes(k, val, (lo), (hi), &v))                                           \
            return 2;                                                                              \
        (*ip)++;                                                                                   \
    } while (0)
    if (!strcmp(k, "--batch-size")) {
        NUM(1, 1u << 24);
        *rc = stk_options_set_batch_size(o, (size_t)v);
    } else if (!strcmp(k, "--threads") && val && !strncmp(val, "auto", 4)) {
        /* auto or auto:N: autotune up to the default count or N. */
        if (val[4] && (val[4] != ':' || !stoker_parse_size(val + 5, &v) || v < 1 || v > 256)) {
            fprintf(stderr,
                    "stoker: --threads takes a number, auto or auto:N (N the most "
                    "threads, 1..256), got '%s'\n",
                    val);
            return 2;
        }
        *rc = stk_options_set_threads(o, val[4] ? (unsigned)v : 0);
        if (*rc == STK_OK)
            *rc = stk_options_set(o, "autotune", "1");
        (*ip)++;
    } else if (!strcmp(k, "--threads")) {
        NUM(0, 256);
        *rc = stk_options_set_threads(o, (unsigned)v);
    } else if (!strcmp(k, "--depth") && val && !strcmp(val, "auto")) {
        *rc = stk_options_set(o, "depth", "auto");
        (*ip)++;
    } else if (!strcmp(k, "--memory-budget")) {
        NUM_BYTES(1, (uint64_t)1 << 50);
        char num[32];
        snprintf(num, sizeof num, "%" PRIu64, v);
        *rc = stk_options_set(o, "memory_budget", num);
    } else if (!strcmp(k, "--depth")) {
        NUM(1, 63);
        *rc = stk_options_set_depth(o, (unsigned)v);
    } else if (!strcmp(k, "--epochs")) {
        NUM(0, UINT64_MAX);
        a->epochs = v;
    } else if (!strcmp(k, "--seed")) {
        NUM(0, UINT64_MAX);
        *rc = stk_options_set_seed(o, v);
    } else if (!strcmp(k, "--rank")) {
        NUM(0, UINT32_MAX - 1);
        w->rank = v;
    } else if (!strcmp(k, "--world-size")) {
        NUM(1, UINT32_MAX);
        w->world = v;
    } else if (!strcmp(k, "--batch-memory")) {
        NUM_BYTES(4096, (uint64_t)1 << 40);
        char num[32];
        snprintf(num, sizeof num, "%" PRIu64, v);
        *rc = stk_options_set(o, "batch_memory", num);
    } else if (!strcmp(k, "--max-sample-bytes")) {
        NUM_BYTES(1, (uint64_t)1 << 40);
        *rc = stk_options_set_max_sample_bytes(o, (size_t)v);
        a->max_sample_bytes = v;
    } else if (!strcmp(k, "--record-size")) {
        if (val && !strcmp(val, "0")) {
            fprintf(stderr, "stoker: --record-size 0 is not a valid record size (a record "
                            "holds at least 1 byte)\n");
            return 2;
        }
        NUM(1, SIZE_MAX);
        w->record = v;
    } else if (!strcmp(k, "--header-bytes")) {
        NUM(0, SIZE_MAX);
        w->header = v;
        w->header_opt = k;
    } else if (!strcmp(k, "--label-bytes")) {
        NUM(0, 8);
        w->label = v;
        w->header_opt = k;
    } else {
        return 1;
    }
#undef NUM
#undef NUM_BYTES
    return 0;
}

/* --mix [WEIGHT:]PATH: a source of a mixture (docs/mixing.md). 0, or 2
 * after a message for a malformed value; *rc: stk_options_add_source's. */
static int parse_mix(const char *val, stk_options *o, int *rc)
{
    const char *path = val;
    double wgt = 0;
    char *end = NULL;
    errno = 0;
    double x = strtod(val, &end);
    if (end != val && *end == ':' && (val[0] == '.' || (val[0] >= '0' && val[0] <= '9'))) {
        if (errno || !(x > 0 && x < 1e300)) {
            fprintf(stderr, "stoker: --mix takes [WEIGHT:]PATH with a weight > 0, got '%s'\n", val);
            return 2;
        }
        wgt = x;
        path = end + 1;
    }
    if (!*path) {
        fprintf(stderr, "stoker: --mix takes [WEIGHT:]PATH, got '%s'\n", val);
        return 2;
    }
    *rc = stk_options_add_source(o, path, wgt, 0);
    return 0;
}

int stoker_parse_bench(int argc, char **argv, stk_options *o, bench_args *a)
{
    uint64_t v = 0;
    bench_seen seen = {.world = 1}, *w = &seen;
    a->epochs = 1;
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        const stk_option_info *opt;
        char key[64];
        int rc = STK_OK;
#define NUM(lo, hi)                                                                                \
    do {                                                                                           \
        if (!stoker_parse_opt(k, val, (lo), (hi), &v))                                             \
            return 2;                                                                              \
        i++;                                                                                       \
    } while (0)
#define NUM_BYTES(lo, hi)                                                                          \
    do {                                                                                           \
        if (!stoker_parse_bytes(k, val, (lo), (hi), &v))                                           \
            return 2;                                                                              \
        i++;                                                                                       \
    } while (0)
        int r = parse_count_flag(&i, k, val, o, a, w, &rc);
        if (r == 2)
            return 2;
        if (r == 0) {
            /* parsed */
        } else if (!strcmp(k, "--no-shuffle")) {
            rc = stk_options_set_shuffle(o, 0);
        } else if (!strcmp(k, "--drop-last")) {
            rc = stk_options_set_drop_last(o, 1);
        } else if (!strcmp(k, "--strict")) {
            rc = stk_options_set(o, "strict", "1");
        } else if (!strcmp(k, "--json")) {
            a->json = true;
        } else if (!strcmp(k, "--trace") && val) {
            if (!*val || set_opt(o, "trace", val))
                return 2;
            i++;
        } else if (!strcmp(k, "--trace-events")) {
            NUM(1024, (uint64_t)1 << 32);
            char num[32];
            snprintf(num, sizeof num, "%" PRIu64, v);
            rc = stk_options_set(o, "trace_events", num);
        } else if (!strcmp(k, "--progress") || !strcmp(k, "--no-progress")) {
            a->progress = k[2] == 'p';
            a->progress_set = true;
        } else if (!strcmp(k, "--seconds") && !strcmp(argv[1], "doctor")) {
            char *end = NULL;
            errno = 0;
            double sec = val ? strtod(val, &end) : 0;
            if (!val || end == val || *end || errno || !(sec >= 0.2 && sec <= 3600)) {
                fprintf(stderr, "stoker: --seconds takes seconds per level, 0.2..3600, got '%s'\n",
                        val ? val : "");
                return 2;
            }
            a->seconds = sec;
            i++;
        } else if (!strcmp(k, "--transform") && val) {
            if (!*val) {
                fprintf(stderr, "stoker: --transform needs a transform (--transform none for "
                                "the bytes as stored)\n");
                return 2;
            }
            rc = stk_options_set_transform(o, val);
            a->transform = val;
            i++;
        } else if (!strcmp(k, "--mix") && val && !strcmp(argv[1], "bench")) {
            if (parse_mix(val, o, &rc))
                return 2;
            a->nmix++;
            i++;
        } else if (!strcmp(k, "--on-error") && val) {
            if (strcmp(val, "raise") && strcmp(val, "skip")) {
                fprintf(stderr, "stoker: --on-error takes raise or skip, got '%s'\n", val);
                return 2;
            }
            rc =
                stk_options_set_on_error(o, val[0] == 's' ? STK_ON_ERROR_SKIP : STK_ON_ERROR_RAISE);
            i++;
        } else if (!strcmp(k, "--size")) {
            NUM(1, 65535);
            w->size = val;
            if (set_opt(o, "size", val))
                return 2;
        } else if (!strcmp(k, "--layout") && val) {
            if (set_opt(o, "layout", val))
                return 2;
            i++;
        } else if (!strcmp(k, "--device") && val) {
            if (set_opt(o, "device", val))
                return 2;
            a->device = strcmp(val, "cpu") != 0;
            i++;
        } else if (!strcmp(k, "--dtype") && val) {
            if (set_opt(o, "dtype", val))
                return 2;
            i++;
        } else if ((opt = stoker_flag_option(k, key, sizeof key)) && val) {
            /* Every other library option is a flag of the same name
             * (docs/options.md): --cache-limit sets w->cache_limit. */
            if (!strcmp(k, "--cache-dir") && !*val) {
                fprintf(stderr, "stoker: --cache-dir needs a directory (leave the option out "
                                "for no disk cache)\n");
                return 2;
            }
            if (set_flag(o, key, k, val))
                return 2;
            if (!strcmp(k, "--cache-dir"))
                w->cache_dir = true;
            else if (!strcmp(k, "--cache-limit"))
                w->cache_limit = true;
            if (opt->flags & STK_OPTION_REMOTE)
                w->remote_flag = k;
            i++;
        } else if (!strcmp(k, "--max-input-bytes")) {
            NUM_BYTES(4096, (uint64_t)1 << 40);
            char num[32];
            snprintf(num, sizeof num, "%" PRIu64, v);
            rc = stk_options_set(o, "max_input_bytes", num);
        } else if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
            stoker_usage(stdout);
            exit(0);
        } else if (k[0] == '-' && k[1] == '-') {
            fprintf(stderr, "stoker: unknown or incomplete option '%s'\n", k);
            return 2;
        } else if (!a->path) {
            a->path = k;
        } else {
            fprintf(stderr, "stoker: unexpected argument '%s'\n", k);
            return 2;
        }
#undef NUM
#undef NUM_BYTES
        if (rc != STK_OK) {
            fprintf(stderr, "stoker: invalid value for %s: %s\n", k, val ? val : "");
            return 2;
        }
    }
    return finish_bench(w, o, a);
}

/* The live line on stderr: rate, starvation and time left. */
void stoker_progress(stk_loader *l, double secs, uint64_t samples, uint64_t batches,
                     uint64_t total_batches)
{
    stk_stats st = {.struct_size = sizeof st};
    stk_loader_stats(l, &st);
    double rate = secs > 0 ? (double)samples / secs : 0;
    double starve = secs > 0 ? 100.0 * (double)st.consumer_wait_ns * 1e-9 / secs : 0;
    fprintf(stderr, "\r\033[K  %" PRIu64 "/%" PRIu64 " batches  %.0f samples/s  starvation %.0f%%",
            batches, total_batches, rate, starve);
    if (batches && total_batches > batches)
        fprintf(stderr, "  ETA %.0f s", secs * (double)(total_batches - batches) / (double)batches);
    fflush(stderr);
}

static void print_errors_json(stk_loader *l, FILE *f)
{
    size_t n = stk_loader_error_count(l);
    fprintf(f, "\"errors\":[");
    for (size_t k = 0; k < n; k++) {
        stk_sample_error e;
        if (stk_loader_error_get(l, k, &e))
            continue;
        fprintf(f, "%s{\"sample\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"path\":", k ? "," : "",
                e.sample, e.epoch);
        stoker_json_str(f, e.path);
        fprintf(f, ",\"reason\":");
        stoker_json_str(f, e.reason);
        fprintf(f, "}");
    }
    fprintf(f, "]");
}

/* What one bench run measured, for its report. */
typedef struct bench_run {
    stk_info info;
    stk_stats st;
    uint64_t samples, batches, bound;
    double secs, open_s, first_s, rate;
    long rss;
    unsigned long long sum;
    int status;
} bench_run;

/* The --json report: one object. */
static void report_json(stk_loader *l, const bench_args *a, const bench_run *r,
                        const field_sums *fs)
{
    char shown[4096];
    printf("{\"path\":");
    if (a->path)
        stoker_json_str(stdout, stoker_display_path(a->path, shown, sizeof shown));
    else
        printf("\"a mixture of %u sources\"", a->nmix);
    printf(",\"transform\":");
    stoker_json_str(stdout, a->transform ? a->transform : "none");
    printf(",\"source\":\"%s\",\"threads\":%u,\"batch_size\":%zu,\"depth\":%u,"
           "\"epochs\":%" PRIu64 ",\"samples\":%" PRIu64 ",\"batches\":%" PRIu64
           ",\"seconds\":%.6f,\"open_s\":%.6f,\"first_batch_s\":",
           r->info.source_kind, r->info.threads, r->info.batch_size, r->info.depth, a->epochs,
           r->samples, r->batches, r->secs, r->open_s);
    if (r->first_s < 0)
        printf("null");
    else
        printf("%.6f", r->first_s);
    printf(",\"threads_active\":%u", r->st.threads_active);
    printf(",\"samples_per_s\":%.3f,\"peak_rss_bytes\":%ld,\"memory_bound_bytes\":%" PRIu64
           ",\"starvation_s\":%.6f,\"stages\":{",
           r->rate, r->rss, r->bound, (double)r->st.consumer_wait_ns * 1e-9);
    for (int s = 0; s < stk_stage_count(); s++) {
        stk_stage_stats ss = {.struct_size = sizeof ss};
        stk_loader_stage_stats(l, s, &ss);
        printf("%s\"%s\":{\"items\":%" PRIu64 ",\"busy_s\":%.6f}", s ? "," : "", stk_stage_name(s),
               ss.items, (double)ss.busy_ns * 1e-9);
    }
    printf("},\"per_thread\":[");
    for (unsigned t = 0; t < r->info.threads; t++) {
        printf("%s{", t ? "," : "");
        for (int s = 0; s < stk_stage_count(); s++) {
            stk_stage_stats ts = {.struct_size = sizeof ts};
            stk_loader_thread_stats(l, t, s, &ts);
            printf("%s\"%s\":{\"items\":%" PRIu64 ",\"busy_s\":%.6f}", s ? "," : "",
                   stk_stage_name(s), ts.items, (double)ts.busy_ns * 1e-9);
        }
        printf("}");
    }
    printf("]");
    stoker_print_fetch(l, true, r->secs);
    printf(",\"skipped\":%" PRIu64 ",\"failed\":%" PRIu64 ",", r->st.samples_skipped,
           r->st.samples_failed);
    print_errors_json(l, stdout);
    printf(",\"checksum\":\"%016llx\"", r->sum);
    print_fields(fs, true);
    printf(",\"ok\":%s}\n", r->status ? "false" : "true");
}

/* The text report's lines after the header. */
static void report_text(stk_loader *l, const bench_run *r, const field_sums *fs)
{
    char b1[32], b2[32];
    printf("  samples      %" PRIu64 " in %" PRIu64 " batches, %.3f s -> %.1f samples/s\n",
           r->samples, r->batches, r->secs, r->rate);
    printf("  startup      open %.3f s, first batch after %.3f s (both within the %.3f s)\n",
           r->open_s, r->first_s < 0 ? 0.0 : r->first_s, r->secs);
    printf("  peak RSS     %s (memory bound %s)\n",
           stoker_human_bytes((double)r->rss, b1, sizeof b1),
           stoker_human_bytes((double)r->bound, b2, sizeof b2));
    for (int s = 0; s < stk_stage_count(); s++) {
        stk_stage_stats ss = {.struct_size = sizeof ss};
        stk_loader_stage_stats(l, s, &ss);
        double busy = (double)ss.busy_ns * 1e-9;
        printf("  %-12s %" PRIu64 " items, %.3f s busy over %u threads (%.2f us/item)\n",
               stk_stage_name(s), ss.items, busy, r->info.threads,
               ss.items ? busy * 1e6 / (double)ss.items : 0.0);
    }
    stoker_print_fetch(l, false, r->secs);
    if (r->st.threads_active != r->st.threads_max)
        printf("  autotune     %u of %u threads working at the end\n", r->st.threads_active,
               r->st.threads_max);
    double starve = (double)r->st.consumer_wait_ns * 1e-9;
    printf("  starvation   %.3f s waiting for batches (%.0f%% of the run)\n", starve,
           r->secs > 0 ? 100.0 * starve / r->secs : 0.0);
    if (r->st.samples_skipped)
        printf("  skipped      %" PRIu64 " samples (first: see --json errors)\n",
               r->st.samples_skipped);
    printf("  checksum     %016llx\n", r->sum);
    print_fields(fs, false);
}

int stoker_cmd_bench(int argc, char **argv)
{
    stk_options *o = NULL;
    stk_loader *l = NULL;
    bench_args a = {0};
    int status = 0;
    field_sums fs = {0};
    XXH3_state_t *h = XXH3_createState();
    if (!h || stk_options_create(&o)) {
        fprintf(stderr, "stoker: out of memory\n");
        return 1;
    }
    XXH3_64bits_reset(h);
    if ((status = stoker_parse_bench(argc, argv, o, &a)))
        goto out;

    /* The clock starts before the open: workers start filling the ring while
     * the open is still under way, so a clock started after it would count
     * their work and not its time (and overstate samples/s on short runs). */
    double t0 = stoker_now();
    int rc = stk_loader_open(&l, o);
    double open_s = stoker_now() - t0, first_s = -1;
    if (rc != STK_OK) {
        char shown[4096];
        fprintf(stderr, "stoker: cannot open %s: %s (%s)\n",
                stoker_display_path(a.path, shown, sizeof shown),
                l ? stk_loader_errmsg(l) : "out of memory", stk_strerror(rc));
        status = 1;
        goto out;
    }
    stk_info info = {.struct_size = sizeof info};
    stk_loader_info(l, &info);
    uint64_t bound = stk_loader_memory_bound(l);
    if (!a.json) {
        char shown[4096];
        printf("stoker bench: %s (%s, %" PRIu64 " samples, %" PRIu64 " classes)\n",
               stoker_display_path(a.path, shown, sizeof shown), info.source_kind, info.num_samples,
               info.num_classes);
        printf("  transform %s, %s batches\n", a.transform ? a.transform : "none",
               info.kind == STK_BATCH_DENSE ? "dense" : "variable-size");
        char fields[1024];
        if (stk_options_get(o, "fields", fields, sizeof fields) != STK_EINVAL && *fields)
            printf("  fields %s\n", fields);
        printf("  %u threads, batch %zu, depth %u, %" PRIu64 " batches/epoch, %" PRIu64
               " epoch(s)\n",
               info.threads, info.batch_size, info.depth, info.batches_per_epoch, a.epochs);
        fflush(stdout);
    }
    uint64_t samples = 0, batches = 0;
    bool live = a.progress_set ? a.progress : (!a.json && isatty(STDERR_FILENO));
    double shown_at = 0;
    for (uint64_t e = 0; e < a.epochs && !status; e++) {
        for (;;) {
            stk_batch *b;
            rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            if (rc != STK_OK) {
                fprintf(stderr, "stoker: %s: %s\n", stk_strerror(rc), stk_loader_errmsg(l));
                status = 1;
                break;
            }
            if (a.device) {
                /* What a GPU consumer waits for: the copy and conversion. */
                rc = stk_batch_sync(b);
                if (rc != STK_OK) {
                    fprintf(stderr,
                            "stoker: %s: batch %" PRIu64 " of epoch %" PRIu64
                            ": the device copy failed\n",
                            stk_strerror(rc), b->index, b->epoch);
                    stk_batch_release(b);
                    status = 1;
                    break;
                }
            }
            if (first_s < 0)
                first_s = stoker_now() - t0;
            hash_batch(h, b);
            if (!hash_fields(&fs, b)) {
                fprintf(stderr, "stoker: out of memory\n");
                stk_batch_release(b);
                status = 1;
                break;
            }
            samples += b->size;
            batches++;
            stk_batch_release(b);
            double t = stoker_now();
            if (live && t - shown_at >= 0.25) {
                shown_at = t;
                stoker_progress(l, t - t0, samples, batches, a.epochs * info.batches_per_epoch);
            }
        }
    }
    if (live)
        fprintf(stderr, "\r\033[K");
    double secs = stoker_now() - t0;
    stk_stats st = {.struct_size = sizeof st};
    stk_loader_stats(l, &st);
    bench_run r = {.info = info,
                   .st = st,
                   .samples = samples,
                   .batches = batches,
                   .bound = bound,
                   .secs = secs,
                   .open_s = open_s,
                   .first_s = first_s,
                   .rate = secs > 0 ? (double)samples / secs : 0,
                   .rss = stoker_peak_rss(),
                   .sum = (unsigned long long)XXH3_64bits_digest(h),
                   .status = status};
    if (a.json)
        report_json(l, &a, &r, &fs);
    else
        report_text(l, &r, &fs);
out:
    stk_loader_close(l);
    stk_options_destroy(o);
    XXH3_freeState(h);
    for (size_t k = 0; k < fs.n; k++)
        XXH3_freeState(fs.h[k]);
    return status;
}
