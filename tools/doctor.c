/*
 * doctor.c -- `stoker doctor PATH [bench options]`: which stage bounds
 * throughput, and what to change.
 *
 * The method is the one people apply by hand: cache the pipeline's output at
 * each stage in turn and watch where throughput drops. Each level runs for a
 * few seconds (--seconds, 3 by default) on the user's dataset and options:
 *
 *   storage   the loader with no transform: each sample's stored bytes through
 *             the real read path (files, shards, the fetch stage and cache),
 *             twice (the second pass finds the page cache warm when the
 *             samples fit in it);
 *   decode    bytes held in memory (copied from the storage pass) through the
 *             user's transform on 1..N threads: the decode+augment ceiling per
 *             thread and for the pool (the thread sweep);
 *   batching  processed samples held in memory (a record file of the decode
 *             level's outputs, in page cache) through the loader: the ring,
 *             the copy into batch slots and the hand-off;
 *   full      the user's pipeline as `stoker bench` runs it.
 *
 * The verdict models a sample's cost as the sum of its stages' costs (a
 * worker reads, then decodes, then stores, one after the other), except for
 * remote data, whose fetch stage runs ahead on its own thread and overlaps
 * the workers: then storage bounds when its rate is below the workers'. The
 * stage with the largest share of the time bounds throughput.
 */
#include "stoker.h"

#include "commands.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_SECONDS 3.0
#define CACHE_BYTES     (256u << 20) /* bytes held for the decode level */
#define CACHE_SAMPLES   4096u
#define BATCH_FILE_MAX  (256u << 20) /* bytes of the batching level's records */
#define MAX_SWEEP       16

typedef struct level {
    bool done;
    char note[512]; /* why it was not measured, or a remark */
    double open_s, seconds;
    uint64_t samples, bytes, skipped;
    double rate;   /* samples/s after the first batch (steady state) */
    double cpu;    /* cores busy on average (user + system time / wall time) */
    double starve; /* share of the wall time next() waited */
    uint64_t memory_bound;
    stk_fetch_stats fetch;
    bool remote;
    unsigned threads, depth; /* as the loader started them */
    size_t batch_size;
} level;

typedef struct sweep_pt {
    unsigned threads;
    double rate, cpu, eff;
} sweep_pt;

typedef struct doctor {
    int argc;
    char **argv;
    bench_args a;
    double secs;
    bool live;
    unsigned step, steps;
    /* What the full pipeline is: from a first parse of the arguments. */
    stk_options *o;
    unsigned threads, cpus, depth;
    size_t batch_size;
    /* Samples with fields (--fields): the decode and batching levels take
     * the first image field (the batch's data); image names it, NULL when
     * the fields hold no image. */
    bool fields;
    char image[64];
    /* The storage pass's samples, held for the decode level. */
    void **hold;
    size_t *hold_len;
    size_t nhold, hold_bytes;
    uint64_t src_pixels; /* summed over held images whose header parses */
    uint64_t src_images;
    /* The decode level's outputs, for the batching level. */
    uint8_t *outs;
    size_t nouts, out_bytes;
    int out_dense;
    int64_t out_shape[4];
    unsigned out_ndim;
    int out_dtype;
    level storage, storage2, decode, batching, full;
    sweep_pt sweep[MAX_SWEEP];
    unsigned nsweep;
    const char *source_kind;
    uint64_t num_samples, num_classes;
    uint64_t mem_available;
    uint64_t last_warning; /* hash of the last open's warning printed (doctor_warn) */
} doctor;

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void progress(doctor *d, const char *what, double t)
{
    if (!d->live)
        return;
    fprintf(stderr, "\r\033[Kstoker doctor: [%u/%u] %s %.1f s", d->step, d->steps, what, t);
    fflush(stderr);
}

/* A fresh copy of the user's options (parsing the arguments again is the one
 * way to copy an stk_options). */
static stk_options *options_again(doctor *d)
{
    stk_options *o = NULL;
    bench_args a = {0};
    if (stk_options_create(&o))
        return NULL;
    if (stoker_parse_bench(d->argc, d->argv, o, &a)) {
        stk_options_destroy(o);
        return NULL;
    }
    return o;
}

/* Option key of the user's options as text ("" when it cannot be read). */
static const char *opt(const doctor *d, const char *key, char *buf, size_t n)
{
    if (stk_options_get(d->o, key, buf, n) == STK_EINVAL)
        buf[0] = '\0'; /* STK_ETOOBIG leaves the text's start, enough here */
    return buf;
}

/* The bytes a batch delivered: every field's with fields. */
static uint64_t batch_bytes(const stk_batch *b)
{
    uint64_t n = 0;
    if (!b->nfields) {
        if (b->kind == STK_BATCH_DENSE)
            return b->size * b->sample_bytes;
        for (size_t k = 0; k < b->size; k++)
            n += b->lengths[k];
        return n;
    }
    for (size_t f = 0; f < b->nfields; f++) {
        const stk_field *fl = &b->fields[f];
        if (fl->layout == STK_BATCH_DENSE)
            n += b->size * fl->sample_bytes;
        else
            for (size_t k = 0; k < b->size; k++)
                n += fl->lengths[k];
    }
    return n;
}

/* With fields, notes which field the batch's data is (its first image
 * field), once. */
static void note_fields(doctor *d, const stk_batch *b)
{
    if (!b->nfields || d->fields)
        return;
    d->fields = true;
    for (size_t f = 0; f < b->nfields; f++)
        if (b->fields[f].kind == STK_FIELD_IMAGE) {
            snprintf(d->image, sizeof d->image, "%s", b->fields[f].name);
            return;
        }
}

/* Keeps a copy of each sample's bytes (storage pass) for the decode level:
 * with fields, those of the first image field, which the batch's data is. */
static void hold_batch(doctor *d, const stk_batch *b)
{
    note_fields(d, b);
    if (d->fields && !d->image[0])
        return;
    for (size_t k = 0; k < b->size && d->nhold < CACHE_SAMPLES; k++) {
        const uint8_t *p;
        size_t n;
        if (b->kind == STK_BATCH_DENSE) {
            p = (const uint8_t *)b->data + k * b->sample_bytes;
            n = b->sample_bytes;
        } else {
            p = (const uint8_t *)b->data + b->offsets[k];
            n = (size_t)b->lengths[k];
        }
        if (!n || d->hold_bytes + n > CACHE_BYTES)
            return;
        uint8_t *c = malloc(n);
        if (!c)
            return;
        memcpy(c, p, n);
        d->hold[d->nhold] = c;
        d->hold_len[d->nhold++] = n;
        d->hold_bytes += n;
    }
}

/* Each level opens the dataset again, and each open gives its warnings
 * (a Parquet order's advice): printed as the library would, but a warning
 * the previous one repeats is left out. */
static void doctor_warn(void *user, const char *msg)
{
    doctor *d = user;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *q = msg; *q; q++)
        h = (h ^ (uint8_t)*q) * 1099511628211ull;
    if (h == d->last_warning)
        return;
    d->last_warning = h;
    fprintf(stderr, "%sstoker: warning: %s\n", d->live ? "\r\033[K" : "", msg);
}

/* Runs one loader level for d->secs (at least one batch, at most the time):
 * open included in the wall time, the rate measured from the first batch. */
static void run_loader(doctor *d, stk_options *o, level *lv, const char *what, bool hold)
{
    stk_loader *l = NULL;
    stk_options_set_warning(o, doctor_warn, d);
    double c0 = cpu_seconds(), t0 = stoker_now();
    int rc = stk_loader_open(&l, o);
    lv->open_s = stoker_now() - t0;
    if (rc != STK_OK) {
        snprintf(lv->note, sizeof lv->note, "cannot open: %s (%s)",
                 l ? stk_loader_errmsg(l) : "out of memory", stk_strerror(rc));
        stk_loader_close(l);
        return;
    }
    stk_info info = {.struct_size = sizeof info};
    stk_loader_info(l, &info);
    lv->memory_bound = stk_loader_memory_bound(l);
    lv->threads = info.threads;
    lv->depth = info.depth;
    lv->batch_size = info.batch_size;
    double first = -1, last = t0;
    uint64_t first_samples = 0;
    for (;;) {
        stk_batch *b = NULL;
        double t = stoker_now();
        if (t - t0 >= d->secs && first >= 0)
            break;
        if (t - t0 >= 10 * d->secs + 30) {
            snprintf(lv->note, sizeof lv->note, "no batch within %.0f s", t - t0);
            break;
        }
        progress(d, what, t - t0);
        rc = stk_loader_next_timeout(l, &b, 100);
        if (rc == STK_TIMEOUT || rc == STK_END)
            continue;
        if (rc == STK_ESAMPLE) {
            lv->skipped++;
            continue;
        }
        if (rc != STK_OK) {
            snprintf(lv->note, sizeof lv->note, "%s: %s", stk_strerror(rc), stk_loader_errmsg(l));
            break;
        }
        last = stoker_now();
        if (first < 0) {
            first = last;
            first_samples = b->size;
        }
        lv->samples += b->size;
        lv->bytes += batch_bytes(b);
        if (hold)
            hold_batch(d, b);
        stk_batch_release(b);
    }
    double wall = stoker_now() - t0;
    stk_stats st = {.struct_size = sizeof st};
    stk_loader_stats(l, &st);
    lv->skipped += st.samples_skipped;
    lv->fetch.struct_size = sizeof lv->fetch;
    lv->remote = stk_loader_fetch_stats(l, &lv->fetch) == STK_OK;
    lv->cpu = wall > 0 ? (cpu_seconds() - c0) / wall : 0;
    lv->starve = wall > 0 ? (double)st.consumer_wait_ns * 1e-9 / wall : 0;
    lv->seconds = wall;
    if (first >= 0 && last > first)
        lv->rate = (double)(lv->samples - first_samples) / (last - first);
    else if (first >= 0 && wall > 0)
        lv->rate = (double)lv->samples / wall;
    lv->done = first >= 0;
    if (!d->source_kind) {
        d->source_kind = info.source_kind;
        d->num_samples = info.num_samples;
        d->num_classes = info.num_classes;
    }
    stk_loader_close(l);
}

/* ---- The decode level --------------------------------------------------- */

/* Decodes the held samples on n threads for secs through the library
 * (stk_bench_decode): samples/s and cores busy. keep: the outputs are kept
 * for the batching level. */
static int decode_run(doctor *d, unsigned n, double secs, bool keep, sweep_pt *pt, uint64_t *failed,
                      char *err, size_t errlen)
{
    char what[64];
    snprintf(what, sizeof what, "decode+augment from memory, %u thread%s", n, n == 1 ? "" : "s");
    progress(d, what, 0);
    stk_bench_decode_result r = {.struct_size = sizeof r};
    int rc = stk_bench_decode(d->o, (const void *const *)d->hold, d->hold_len, d->nhold, n, secs,
                              keep ? d->outs : NULL, keep ? BATCH_FILE_MAX : 0, &r, err, errlen);
    if (rc != STK_OK)
        return rc;
    if (keep) {
        d->out_dense = r.kind == STK_BATCH_DENSE;
        d->out_bytes = r.sample_bytes;
        d->out_ndim = r.ndim;
        memcpy(d->out_shape, r.shape, sizeof d->out_shape);
        d->out_dtype = r.dtype;
        /* One output per held sample at most: more would only repeat them. */
        d->nouts = r.outputs < d->nhold ? r.outputs : d->nhold;
        d->src_pixels = r.input_pixels;
        d->src_images = r.input_images;
    }
    *failed += r.failed;
    pt->threads = r.threads;
    pt->rate = r.seconds > 0 ? (double)r.samples / r.seconds : 0;
    pt->cpu = r.seconds > 0 ? r.cpu_seconds / r.seconds : 0;
    return STK_OK;
}

static void decode_level(doctor *d)
{
    level *lv = &d->decode;
    const char *spec = d->a.transform;
    if (!spec || !*spec || !strcmp(spec, "none")) {
        snprintf(lv->note, sizeof lv->note, "no transform: nothing to decode");
        return;
    }
    if (d->fields && !d->image[0]) {
        snprintf(lv->note, sizeof lv->note, "no image field: nothing to decode");
        return;
    }
    if (!d->nhold) {
        snprintf(lv->note, sizeof lv->note, "the storage level delivered no sample to decode");
        return;
    }
    /* Outputs of the first run, for the batching level: pages are touched
     * only for the outputs written (one per held sample at most). */
    d->outs = malloc(BATCH_FILE_MAX);
    /* The sweep: 1, 2, 4, ... and every count up to 8, always the pool's. */
    unsigned counts[MAX_SWEEP], nc = 0;
    for (unsigned t = 1; t <= d->cpus && nc + 1 < MAX_SWEEP; t = t < 8 ? t + 1 : t * 2)
        counts[nc++] = t;
    if (d->threads > d->cpus && nc < MAX_SWEEP)
        counts[nc++] = d->threads;
    else if (nc && counts[nc - 1] != d->cpus && nc < MAX_SWEEP)
        counts[nc++] = d->cpus;
    double per = d->secs * 2 / (nc + 1);
    if (per < 0.5)
        per = 0.5;
    uint64_t failed = 0;
    char err[512];
    for (unsigned i = 0; i < nc; i++) {
        if (decode_run(d, counts[i], per, i == 0 && d->outs, &d->sweep[i], &failed, err,
                       sizeof err)) {
            snprintf(lv->note, sizeof lv->note, "%s", err);
            break;
        }
        d->nsweep = i + 1;
    }
    for (unsigned i = 0; i < d->nsweep; i++)
        d->sweep[i].eff =
            d->sweep[0].rate > 0 ? d->sweep[i].rate / (d->sweep[i].threads * d->sweep[0].rate) : 0;
    /* The level's figure is the pool's: the sweep point at the loader's
     * thread count (or the nearest below it). */
    const sweep_pt *at = NULL;
    for (unsigned i = 0; i < d->nsweep; i++)
        if (!at || d->sweep[i].threads <= d->threads)
            at = &d->sweep[i];
    lv->skipped = failed;
    if (at && at->rate > 0) {
        lv->rate = at->rate;
        lv->cpu = at->cpu;
        lv->done = true;
        snprintf(lv->note, sizeof lv->note, "%u thread%s", at->threads,
                 at->threads == 1 ? "" : "s");
    } else if (at) {
        snprintf(lv->note, sizeof lv->note, "every sample failed to decode");
    }
    if (lv->done && d->fields) {
        size_t at_len = strlen(lv->note);
        snprintf(lv->note + at_len, sizeof lv->note - at_len, ", image field '%s' only", d->image);
    }
}

/* ---- The batching level ---------------------------------------------------- */

static void batching_level(doctor *d)
{
    level *lv = &d->batching;
    if (!d->out_dense || !d->nouts) {
        snprintf(lv->note, sizeof lv->note, "%s",
                 d->decode.done ? "variable-size output: measured within the full pipeline"
                 : d->fields && !d->image[0] ? "no image field: the fields are batched in the full "
                                               "pipeline"
                                             : "no processed samples to batch");
        return;
    }
    const char *tmp = getenv("TMPDIR");
    struct stat sbuf;
    if (!tmp || !*tmp)
        tmp = stat("/dev/shm", &sbuf) == 0 && S_ISDIR(sbuf.st_mode) ? "/dev/shm" : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/stoker-doctor-XXXXXX", tmp);
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(lv->note, sizeof lv->note, "cannot create a file in %.200s: %s", tmp,
                 strerror(errno));
        return;
    }
    /* At least four batches' worth, repeating the outputs. */
    size_t batch = d->batch_size, want = d->nouts;
    while (want < 4 * batch && (want + d->nouts) * d->out_bytes <= BATCH_FILE_MAX)
        want += d->nouts;
    bool ok = true;
    for (size_t k = 0; k < want && ok; k++) {
        const uint8_t *p = d->outs + (k % d->nouts) * d->out_bytes;
        for (size_t off = 0; off < d->out_bytes && ok;) {
            ssize_t w = write(fd, p + off, d->out_bytes - off);
            if (w < 0 && errno == EINTR)
                continue;
            ok = w > 0;
            off += w > 0 ? (size_t)w : 0;
        }
    }
    close(fd);
    stk_options *o = NULL;
    if (!ok) {
        snprintf(lv->note, sizeof lv->note, "cannot write %.200s: %s", path, strerror(errno));
    } else if (stk_options_create(&o) || stk_options_set_source(o, path) ||
               stk_options_set_records(o, d->out_bytes, 0, 0) ||
               stk_options_set_batch_size(o, want < batch ? want : batch) ||
               stk_options_set_threads(o, d->threads) || stk_options_set_depth(o, d->depth)) {
        snprintf(lv->note, sizeof lv->note, "cannot set up the batching level");
    } else {
        run_loader(d, o, lv, "batching from memory", false);
        if (lv->done && d->fields)
            snprintf(lv->note, sizeof lv->note,
                     "image field '%s' only: the other fields are batched in the full pipeline",
                     d->image);
    }
    stk_options_destroy(o);
    unlink(path);
}

/* ---- Verdict --------------------------------------------------------------- */

typedef struct verdict {
    const char *bound; /* "storage", "decode", "batching", or NULL */
    double share[3];   /* of a sample's time: storage, decode, batching */
    double predicted;  /* samples/s the stages predict together */
    bool overlapped;   /* storage runs ahead (remote) */
} verdict;

static const char *const stage_names[3] = {"storage", "decode", "batching"};

static verdict judge(const doctor *d)
{
    verdict v = {0};
    const level *lv[3] = {&d->storage, &d->decode, &d->batching};
    double inv[3] = {0}, sum = 0;
    for (int i = 0; i < 3; i++)
        if (lv[i]->done && lv[i]->rate > 0) {
            inv[i] = 1.0 / lv[i]->rate;
            sum += inv[i];
        }
    if (sum <= 0)
        return v;
    v.overlapped = d->storage.remote;
    if (v.overlapped && inv[0] > 0) {
        /* The fetch stage runs ahead of the workers on its own thread. */
        double work = inv[1] + inv[2];
        v.predicted = work > 0 ? fmin(d->storage.rate, 1.0 / work) : d->storage.rate;
        double tot = inv[0] + work;
        for (int i = 0; i < 3; i++)
            v.share[i] = inv[i] / tot;
        v.bound = work <= 0 || inv[0] >= work ? "storage"
                  : inv[1] >= inv[2]          ? "decode"
                                              : "batching";
        return v;
    }
    v.predicted = 1.0 / sum;
    int best = 0;
    for (int i = 0; i < 3; i++) {
        v.share[i] = inv[i] / sum;
        if (v.share[i] > v.share[best])
            best = i;
    }
    v.bound = stage_names[best];
    return v;
}

/* ---- Unpacked objects in a bucket ------------------------------------------ */

/* What reading unpacked objects (one GET a sample) costs against the same
 * samples packed. Measured: the storage level's samples/s, its requests'
 * mean time and time to the first byte, the mean object size. Estimated:
 * the packed rate. A request's time is a fixed part (the time to its first
 * byte: the round trip and the store's per-request work) plus a per-byte
 * part (the rest); a packed dataset read by ranges of block_bytes (--order
 * blocks, or whole shards with --order shards and a cache) pays the fixed
 * part once a range instead of once a sample, with the same requests in
 * flight and the same per-byte time. Bandwidth beyond what was measured is
 * not modelled, so the estimate is of storage alone, and an upper one. */
typedef struct unpacked {
    bool known;          /* the storage level measured requests */
    double measured;     /* samples/s */
    double request_s;    /* mean request time */
    double first_byte_s; /* of it, to the first byte */
    double object_bytes; /* mean */
    double range_bytes;  /* the packed read's request size */
    double per_request;  /* samples a packed request would carry */
    double packed;       /* estimated samples/s */
    double ratio;        /* packed / measured */
    /* The pipeline: the full level's samples/s, and what it would do with
     * storage at the packed estimate and the workers as measured (decode and
     * batching levels; 0 when those were not measured). */
    double pipeline, pipeline_packed;
    char command[1600]; /* the pack command */
} unpacked;

static bool is_bucket(const doctor *d)
{
    return d->source_kind && !strcmp(d->source_kind, "bucket");
}

static unpacked unpacked_estimate(const doctor *d)
{
    unpacked u = {0};
    const level *lv = &d->storage;
    char ep[512], num[64], shown[1024];
    opt(d, "endpoint", ep, sizeof ep);
    /* The path as messages show it: a URL's password or a presigned
     * signature is never printed. */
    stoker_display_path(d->a.path, shown, sizeof shown);
    /* stk_pack takes no options: a custom endpoint goes by environment. */
    int w = snprintf(u.command, sizeof u.command, "%s%s%sstoker pack %s OUT",
                     *ep ? "AWS_ENDPOINT_URL=" : "", ep, *ep ? " " : "", shown);
    if (w < 0 || (size_t)w >= sizeof u.command)
        snprintf(u.command, sizeof u.command, "stoker pack PATH OUT");
    const stk_fetch_stats *f = &lv->fetch;
    if (!lv->done || !lv->remote || !f->completed || !lv->samples || lv->rate <= 0)
        return u;
    u.measured = lv->rate;
    u.request_s = (double)f->request_ns * 1e-9 / (double)f->completed;
    u.first_byte_s = (double)f->first_byte_ns * 1e-9 / (double)f->completed;
    if (u.first_byte_s > u.request_s)
        u.first_byte_s = u.request_s;
    u.object_bytes = (double)lv->bytes / (double)lv->samples;
    uint64_t block = 0;
    if (!stoker_parse_size(opt(d, "block_bytes", num, sizeof num), &block) || !block)
        block = 5u << 20;
    u.range_bytes = (double)block;
    u.per_request = u.object_bytes > 0 ? u.range_bytes / u.object_bytes : 1;
    if (u.per_request < 1)
        u.per_request = 1; /* objects over a range: one request each either way */
    double packed_cost = u.first_byte_s / u.per_request + (u.request_s - u.first_byte_s);
    if (u.request_s <= 0 || packed_cost <= 0)
        return u;
    u.ratio = u.request_s / packed_cost;
    u.packed = u.measured * u.ratio;
    u.known = true;
    double work = 0;
    if (d->decode.done && d->decode.rate > 0)
        work += 1.0 / d->decode.rate;
    if (d->batching.done && d->batching.rate > 0)
        work += 1.0 / d->batching.rate;
    u.pipeline = d->full.done ? d->full.rate : 0;
    if (work > 0)
        u.pipeline_packed = fmin(u.packed, 1.0 / work);
    return u;
}

typedef struct advice {
    const char *stage, *action;
    char why[2560];
    double expected; /* samples/s after the change, 0 = not estimated */
} advice;

static size_t advise(const doctor *d, const verdict *v, advice *out, size_t max)
{
    size_t n = 0;
    double full = d->full.done ? d->full.rate : v->predicted;
#define ADD(st, act, exp, ...)                                                                     \
    do {                                                                                           \
        if (n < max) {                                                                             \
            out[n].stage = (st);                                                                   \
            out[n].action = (act);                                                                 \
            out[n].expected = (exp);                                                               \
            snprintf(out[n].why, sizeof out[n].why, __VA_ARGS__);                                  \
            n++;                                                                                   \
        }                                                                                          \
    } while (0)
    bool decode_bound = v->bound && !strcmp(v->bound, "decode");
    bool storage_bound = v->bound && !strcmp(v->bound, "storage");
    if (decode_bound && d->threads < d->cpus && d->nsweep) {
        const sweep_pt *best = &d->sweep[d->nsweep - 1];
        double gain = d->decode.rate > 0 ? best->rate / d->decode.rate : 0;
        ADD("decode", "more threads", gain > 1.05 ? full * gain : 0,
            "--threads %u (threads=%u in Python): decode+augment scaled to %.0f samples/s on %u "
            "threads against %.0f on %u",
            best->threads, best->threads, best->rate, best->threads, d->decode.rate, d->threads);
    }
    if (d->threads > d->cpus)
        ADD("all", "fewer threads", 0,
            "%u threads share %u usable CPUs: the extra threads only add switching; use "
            "--threads %u",
            d->threads, d->cpus, d->cpus);
    if (decode_bound && d->src_images && d->out_dense && d->out_ndim == 3) {
        double src = (double)d->src_pixels / (double)d->src_images;
        char layout[16];
        bool nchw = !strcmp(opt(d, "layout", layout, sizeof layout), "nchw");
        int64_t h = d->out_shape[nchw ? 1 : 0], w = d->out_shape[nchw ? 2 : 1];
        double outpx = (double)h * (double)w;
        if (outpx > 0 && src > 4 * outpx) {
            unsigned side = (unsigned)(2 * (h > w ? h : w));
            ADD("decode", "pack --max-side", 0,
                "stored images average %.1f Mpx for %lldx%lld outputs (%.0fx the pixels): "
                "`stoker pack SRC OUT --max-side %u` stores them smaller once, and decode cost "
                "follows the pixels decoded (docs/images.md)",
                src * 1e-6, (long long)h, (long long)w, src / outpx, side);
        }
    }
    if (storage_bound && d->source_kind && !strcmp(d->source_kind, "folder"))
        ADD("storage", "stoker pack", 0,
            "each sample is a file of its own (an open, a read and a close each): `stoker pack "
            "%s OUT` writes .stk shards read as byte ranges of few large files (docs/shards.md)",
            d->a.path);
    if (is_bucket(d)) {
        /* Said whatever bounds: the cost of a request per sample is paid in
         * every epoch, and the user asked to be told (issue 21). */
        unpacked u = unpacked_estimate(d);
        if (u.known)
            ADD("storage", "stoker pack",
                storage_bound && u.pipeline_packed > full ? u.pipeline_packed : 0,
                "the dataset is unpacked objects, one GET per sample: storage measured %.0f "
                "samples/s (%.1f ms a request, %.1f ms of it to the first byte, %.0f KB an "
                "object); packed as .stk and read by %.0f MiB ranges (--order blocks, or "
                "--order shards --cache-dir DIR) a request carries about %.0f samples: "
                "estimated %.0f samples/s from storage, %.1fx (an estimate from the measured "
                "latency and per-byte time with the same requests in flight, not a "
                "measurement). Pack once: `%s` (docs/remote.md)",
                u.measured, u.request_s * 1e3, u.first_byte_s * 1e3, u.object_bytes / 1e3,
                u.range_bytes / 1048576.0, u.per_request, u.packed, u.ratio, u.command);
        else
            ADD("storage", "stoker pack", 0,
                "the dataset is unpacked objects, one GET per sample (the storage level measured "
                "no requests, so no estimate of the difference): packed shards take a request "
                "per many samples. Pack once: `%s` (docs/remote.md)",
                u.command);
    }
    if (storage_bound && d->storage.remote) {
        char order[16], cache[8];
        if (strcmp(opt(d, "order", order, sizeof order), "shards") ||
            !*opt(d, "cache_dir", cache, sizeof cache))
            ADD("storage", "shard-aware order and a cache", 0,
                "remote samples are fetched by ranged requests (%" PRIu64 " requests for %" PRIu64
                " samples); --order shards --cache-dir DIR reads whole shards once and keeps "
                "them on local disk (docs/remote.md)",
                d->storage.fetch.requests, d->storage.samples);
        char num[32];
        unsigned conc = (unsigned)strtoul(opt(d, "fetch_concurrency", num, sizeof num), NULL, 10);
        if (!conc)
            conc = 64;
        if (d->storage.fetch.inflight_peak >= conc)
            ADD("storage", "more requests in flight", 0,
                "the fetch stage kept all %u requests in flight: raise --fetch-concurrency", conc);
        if (d->storage.fetch.throttled)
            ADD("storage", "fewer requests", 0,
                "the store answered 503/429 (throttled) %" PRIu64 " times and the request budget "
                "fell to %" PRIu64 "/s: --order blocks (one request a few MB) or a cache makes "
                "fewer requests; a prefix per shard group spreads S3's per-prefix limit "
                "(docs/remote.md)",
                d->storage.fetch.throttled, d->storage.fetch.rate_limit);
    }
    uint64_t bound = d->full.memory_bound;
    if (bound && d->mem_available && bound > d->mem_available / 2 && d->depth > 1)
        ADD("memory", "lower depth", 0,
            "the memory bound (%.0f MiB) is over half of the memory available (%.0f MiB): "
            "--depth 1 keeps one batch in preparation instead of %u",
            (double)bound / 1048576.0, (double)d->mem_available / 1048576.0, d->depth);
    if (d->out_dense && d->out_dtype != STK_DTYPE_UINT8)
        ADD("batching", "uint8 output, normalise on the GPU", 0,
            "%s output makes each batch %dx the bytes of uint8 (copied into the ring, to the "
            "device, and through the consumer): with --device cuda (Python device=\"cuda\") "
            "stoker copies uint8 and normalises on the GPU (docs/gpu.md)",
            d->out_dtype == STK_DTYPE_FLOAT32 ? "float32" : "16-bit float",
            d->out_dtype == STK_DTYPE_FLOAT32 ? 4 : 2);
    unsigned usable = d->threads < d->cpus ? d->threads : d->cpus;
    if (v->predicted > 0 && d->full.done && d->full.rate < 0.7 * v->predicted &&
        d->full.cpu < 0.75 * usable && d->full.starve > 0.2)
        ADD("all", "free the CPUs", 0,
            "the full pipeline ran at %.0f samples/s, %.0f%% of the %.0f its stages predict, "
            "while its %u workers got only %.1f CPUs and the consumer waited %.0f%% of the "
            "time: other processes on this machine are using the CPUs (see top), or the "
            "workers block on I/O",
            d->full.rate, 100 * d->full.rate / v->predicted, v->predicted, usable, d->full.cpu,
            100 * d->full.starve);
    else if (v->predicted > 0 && d->full.done && d->full.rate < 0.7 * v->predicted)
        ADD("all", "look for contention", 0,
            "the full pipeline ran at %.0f samples/s, %.0f%% of the %.0f its stages predict "
            "together: the stages compete for something (CPUs, memory bandwidth, the disk)",
            d->full.rate, 100 * d->full.rate / v->predicted, v->predicted);
#undef ADD
    return n;
}

/* ---- Report ------------------------------------------------------------------ */

static void json_level(const char *name, const level *lv, bool comma)
{
    printf("%s\"%s\":{\"measured\":%s", comma ? "," : "", name, lv->done ? "true" : "false");
    if (lv->done)
        printf(",\"samples_per_s\":%.3f,\"bytes_per_s\":%.1f,\"cpu_cores\":%.3f,\"seconds\":%.3f,"
               "\"open_s\":%.4f,\"samples\":%" PRIu64 ",\"skipped\":%" PRIu64
               ",\"starvation\":%.4f,\"memory_bound_bytes\":%" PRIu64,
               lv->rate, lv->seconds > 0 ? (double)lv->bytes / lv->seconds : 0.0, lv->cpu,
               lv->seconds, lv->open_s, lv->samples, lv->skipped, lv->starve, lv->memory_bound);
    if (lv->remote)
        printf(",\"requests\":%" PRIu64 ",\"fetched_bytes\":%" PRIu64 ",\"inflight_peak\":%" PRIu64
               ",\"fetch_wait_s\":%.4f,\"request_mean_s\":%.6f,\"first_byte_mean_s\":%.6f",
               lv->fetch.requests, lv->fetch.bytes, lv->fetch.inflight_peak,
               (double)lv->fetch.wait_ns * 1e-9,
               lv->fetch.completed
                   ? (double)lv->fetch.request_ns * 1e-9 / (double)lv->fetch.completed
                   : 0.0,
               lv->fetch.completed
                   ? (double)lv->fetch.first_byte_ns * 1e-9 / (double)lv->fetch.completed
                   : 0.0);
    if (lv->remote)
        printf(",\"throttled\":%" PRIu64 ",\"rate_limit\":%" PRIu64 ",\"hedges\":%" PRIu64
               ",\"hedge_wins\":%" PRIu64,
               lv->fetch.throttled, lv->fetch.rate_limit, lv->fetch.hedges, lv->fetch.hedge_wins);
    if (lv->note[0]) {
        printf(",\"note\":");
        stoker_json_str(stdout, lv->note);
    }
    printf("}");
}

static void text_level(const char *name, const level *lv, bool bytes)
{
    if (!lv->done) {
        printf("  %-34s %12s  %s\n", name, "-", lv->note[0] ? lv->note : "not measured");
        return;
    }
    char mb[32] = "-";
    if (bytes && lv->seconds > 0)
        snprintf(mb, sizeof mb, "%.1f", (double)lv->bytes / lv->seconds / 1e6);
    printf("  %-34s %12.1f %9s %8.2f", name, lv->rate, mb, lv->cpu);
    if (lv->skipped)
        printf("  %" PRIu64 " samples failed", lv->skipped);
    if (lv->note[0])
        printf("  %s", lv->note);
    printf("\n");
}

/* The report as one JSON object (--json). */
static void report_json(doctor *d, const verdict *vp, const advice *adv, size_t nadv,
                        const char *shown, const char *fields)
{
    verdict v = *vp;
    printf("{\"path\":");
    stoker_json_str(stdout, shown);
    printf(",\"source\":\"%s\",\"samples\":%" PRIu64 ",\"transform\":",
           d->source_kind ? d->source_kind : "unknown", d->num_samples);
    stoker_json_str(stdout, d->a.transform ? d->a.transform : "none");
    if (*fields) {
        printf(",\"fields\":");
        stoker_json_str(stdout, fields);
    }
    if (is_bucket(d)) {
        unpacked u = unpacked_estimate(d);
        printf(",\"unpacked\":{\"objects\":%" PRIu64 ",\"pack_command\":", d->num_samples);
        stoker_json_str(stdout, u.command);
        if (u.known)
            printf(",\"measured_samples_per_s\":%.3f,\"request_mean_s\":%.6f,"
                   "\"first_byte_mean_s\":%.6f,\"mean_object_bytes\":%.1f,"
                   "\"packed_range_bytes\":%.0f,\"samples_per_packed_request\":%.2f,"
                   "\"estimated_packed_samples_per_s\":%.3f,\"estimated_speedup\":%.3f",
                   u.measured, u.request_s, u.first_byte_s, u.object_bytes, u.range_bytes,
                   u.per_request, u.packed, u.ratio);
        if (u.known && u.pipeline > 0 && u.pipeline_packed > 0)
            printf(",\"pipeline_samples_per_s\":%.3f,\"estimated_packed_pipeline_samples_per_s\":"
                   "%.3f,\"estimated_pipeline_speedup\":%.3f",
                   u.pipeline, u.pipeline_packed, u.pipeline_packed / u.pipeline);
        printf("}");
    }
    printf(",\"threads\":%u,\"cpus\":%u,\"batch_size\":%zu,\"depth\":%u,\"seconds_per_level\":%"
           ".2f,"
           "\"levels\":{",
           d->threads, d->cpus, d->batch_size, d->depth, d->secs);
    json_level("storage", &d->storage, false);
    json_level("storage_warm", &d->storage2, true);
    json_level("decode", &d->decode, true);
    json_level("batching", &d->batching, true);
    json_level("full", &d->full, true);
    printf("},\"sweep\":[");
    for (unsigned i = 0; i < d->nsweep; i++)
        printf("%s{\"threads\":%u,\"samples_per_s\":%.3f,\"cpu_percent\":%.1f,"
               "\"efficiency\":%.4f}",
               i ? "," : "", d->sweep[i].threads, d->sweep[i].rate, 100 * d->sweep[i].cpu,
               d->sweep[i].eff);
    printf("],\"verdict\":{\"bound\":");
    if (v.bound)
        printf("\"%s\"", v.bound);
    else
        printf("null");
    printf(",\"shares\":{\"storage\":%.4f,\"decode\":%.4f,\"batching\":%.4f},"
           "\"predicted_samples_per_s\":%.3f,\"storage_overlaps\":%s,\"headroom\":{",
           v.share[0], v.share[1], v.share[2], v.predicted, v.overlapped ? "true" : "false");
    const level *lv[3] = {&d->storage, &d->decode, &d->batching};
    bool first = true;
    for (int i = 0; i < 3; i++)
        if (lv[i]->done && d->full.done && d->full.rate > 0) {
            printf("%s\"%s\":%.3f", first ? "" : ",", stage_names[i], lv[i]->rate / d->full.rate);
            first = false;
        }
    printf("}},\"memory\":{\"bound_bytes\":%" PRIu64 ",\"doctor_peak_rss_bytes\":%ld,"
           "\"available_bytes\":%" PRIu64 "},\"advice\":[",
           d->full.memory_bound, stoker_peak_rss(), d->mem_available);
    for (size_t i = 0; i < nadv; i++) {
        printf("%s{\"stage\":\"%s\",\"action\":\"%s\",\"why\":", i ? "," : "", adv[i].stage,
               adv[i].action);
        stoker_json_str(stdout, adv[i].why);
        if (adv[i].expected > 0)
            printf(",\"expected_samples_per_s\":%.1f}", adv[i].expected);
        else
            printf(",\"expected_samples_per_s\":null}");
    }
    printf("]}\n");
}

static void report(doctor *d)
{
    verdict v = judge(d);
    advice adv[16];
    size_t nadv = advise(d, &v, adv, 16);
    char buf[4096];
    const char *shown = stoker_display_path(d->a.path, buf, sizeof buf);
    char fields[1024];
    opt(d, "fields", fields, sizeof fields);
    if (d->a.json) {
        report_json(d, &v, adv, nadv, shown, fields);
        return;
    }
    printf("stoker doctor: %s (%s, %" PRIu64 " samples, %" PRIu64 " classes)\n", shown,
           d->source_kind ? d->source_kind : "?", d->num_samples, d->num_classes);
    printf("  transform %s, batch %zu, %u threads (%u CPUs usable), depth %u, %.1f s per level\n",
           d->a.transform ? d->a.transform : "none", d->batch_size, d->threads, d->cpus, d->depth,
           d->secs);
    if (*fields)
        printf("  fields %s\n", fields);
    printf("\n");
    printf("  %-34s %12s %9s %8s\n", "level", "samples/s", "MB/s", "CPUs");
    text_level("storage (first read)", &d->storage, true);
    text_level("storage (second read, warm)", &d->storage2, true);
    text_level("decode+augment, bytes in memory", &d->decode, false);
    text_level("batching, samples in memory", &d->batching, true);
    text_level("full pipeline", &d->full, false);
    if (d->storage.remote && d->storage.done)
        printf("  remote: %" PRIu64 " requests (%.1f ms each on average, %.1f ms to the first "
               "byte), %.1f MB received, %" PRIu64
               " at most in flight, workers waited %.2f s for the network\n",
               d->storage.fetch.requests,
               d->storage.fetch.completed
                   ? (double)d->storage.fetch.request_ns * 1e-6 / (double)d->storage.fetch.completed
                   : 0.0,
               d->storage.fetch.completed ? (double)d->storage.fetch.first_byte_ns * 1e-6 /
                                                (double)d->storage.fetch.completed
                                          : 0.0,
               (double)d->storage.fetch.bytes / 1e6, d->storage.fetch.inflight_peak,
               (double)d->storage.fetch.wait_ns * 1e-9);
    if (d->storage.remote && d->storage.done) {
        /* The governor and hedging (docs/remote.md "Request governor"). */
        const stk_fetch_stats *f = &d->storage.fetch;
        char rate[32] = "none";
        if (f->rate_limit)
            snprintf(rate, sizeof rate, "%" PRIu64 " requests/s", f->rate_limit);
        printf("  remote: rate budget %s, %" PRIu64 " answers 503/429 (throttled); %" PRIu64
               " slow requests hedged, %" PRIu64 " hedges answered first\n",
               rate, f->throttled, f->hedges, f->hedge_wins);
    }
    if (is_bucket(d)) {
        unpacked u = unpacked_estimate(d);
        if (u.known) {
            printf("  unpacked objects: %" PRIu64 " objects of %.1f KB on average, one GET each; "
                   "storage measured %.0f samples/s, packed shards estimated at %.0f from "
                   "storage (%.1fx; an estimate, see the advice)\n",
                   d->num_samples, u.object_bytes / 1e3, u.measured, u.packed, u.ratio);
            if (u.pipeline > 0 && u.pipeline_packed > 0)
                printf("  unpacked objects: the full pipeline ran at %.0f samples/s; packed, with "
                       "the workers as measured, about %.0f (%.1fx, estimated)\n",
                       u.pipeline, u.pipeline_packed, u.pipeline_packed / u.pipeline);
        } else
            printf("  unpacked objects: %" PRIu64 " objects, one GET each (no requests measured: "
                   "no estimate)\n",
                   d->num_samples);
    }
    if (d->nsweep) {
        printf("\n  thread sweep (decode+augment from memory)\n");
        printf("    %7s %12s %8s %11s\n", "threads", "samples/s", "CPU %", "efficiency");
        for (unsigned i = 0; i < d->nsweep; i++)
            printf("    %7u %12.1f %7.0f%% %11.2f\n", d->sweep[i].threads, d->sweep[i].rate,
                   100 * d->sweep[i].cpu, d->sweep[i].eff);
    }
    printf("\n");
    if (!v.bound) {
        printf("  verdict: no stage could be measured (see the notes above)\n");
    } else {
        static const char *const upper[3] = {"STORAGE", "DECODE+AUGMENT", "BATCHING"};
        int b = !strcmp(v.bound, "storage") ? 0 : !strcmp(v.bound, "decode") ? 1 : 2;
        if (v.overlapped)
            printf("  verdict: %s bounds throughput (the fetch stage overlaps the workers: "
                   "storage %.0f samples/s, workers %.0f)\n",
                   upper[b], d->storage.rate,
                   v.share[1] + v.share[2] > 0 && d->storage.rate > 0
                       ? 1.0 / ((v.share[1] + v.share[2]) / v.share[0] / d->storage.rate)
                       : 0.0);
        else
            printf("  verdict: %s bounds throughput: %.0f%% of each sample's time (storage %.0f%%, "
                   "decode+augment %.0f%%, batching %.0f%%)\n",
                   upper[b], 100 * v.share[b], 100 * v.share[0], 100 * v.share[1],
                   100 * v.share[2]);
        if (d->full.done)
            printf("  the full pipeline ran at %.0f samples/s; its stages predict %.0f (%.0f%%)\n",
                   d->full.rate, v.predicted,
                   v.predicted > 0 ? 100 * d->full.rate / v.predicted : 0.0);
        const level *lv[3] = {&d->storage, &d->decode, &d->batching};
        if (d->full.done && d->full.rate > 0) {
            printf("  headroom:");
            for (int i = 0; i < 3; i++)
                if (lv[i]->done)
                    printf(" %s %.1fx", stage_names[i], lv[i]->rate / d->full.rate);
            printf(" (each stage alone vs the full pipeline)\n");
        }
    }
    char b1[32], b3[32];
    printf("  memory: the loader's bound %s, %s available\n",
           stoker_human_bytes((double)d->full.memory_bound, b1, sizeof b1),
           stoker_human_bytes((double)d->mem_available, b3, sizeof b3));
    if (d->full.done)
        printf("  CPU: the full pipeline kept %.1f of %u usable CPUs busy\n", d->full.cpu, d->cpus);
    printf("\n  advice:%s\n", nadv ? "" : " none: no change is expected to help");
    for (size_t i = 0; i < nadv; i++) {
        printf("  - %s: %s", adv[i].action, adv[i].why);
        if (adv[i].expected > 0)
            printf(" (expected about %.0f samples/s)", adv[i].expected);
        printf("\n");
    }
}

/* Levels 1-2: the stored bytes through the loader, twice, on the host and
 * with no transform. False when the dataset does not open. */
static bool storage_levels(doctor *d)
{
    stk_options *o = options_again(d);
    if (!o)
        return false;
    stk_options_set_transform(o, "none");
    stk_options_set(o, "trace", ""); /* only the full pipeline is traced */
    /* The stored bytes stay on the host: they are what the decode level
     * reads, and without the transform they vary in size, which no device
     * batch can hold. The device applies to the full pipeline (level 5). */
    stk_options_set(o, "device", "cpu");
    /* Nor does depth "auto" apply: without the transform the batches are
     * variable-size, bounded by batch_memory a buffer (512M by default),
     * which a budget chosen for the user's batches need not hold. Reading
     * ahead depth batches is what this level measures, not the ring. */
    char val[64];
    if (stk_options_get(o, "depth", val, sizeof val) == STK_OK && !strcmp(val, "auto"))
        stk_options_set_depth(o, 2);
    stk_options_set(o, "dtype", "uint8");
    stk_options_reset(o, "size");
    stk_options_set_on_error(o, STK_ON_ERROR_SKIP);
    /* A stored image may be as large as a decode accepts. */
    uint64_t input = 0;
    if (stk_options_get(o, "max_input_bytes", val, sizeof val) == STK_OK &&
        stoker_parse_size(val, &input) && d->a.max_sample_bytes < input)
        stk_options_set_max_sample_bytes(o, (size_t)input);
    d->step = 1;
    run_loader(d, o, &d->storage, "storage, first read", true);
    d->step = 2;
    run_loader(d, o, &d->storage2, "storage, second read", false);
    stk_options_destroy(o);
    if (!d->storage.done && !d->storage2.done && d->storage.note[0] &&
        !strncmp(d->storage.note, "cannot open", 11)) {
        if (d->live)
            fprintf(stderr, "\r\033[K");
        fprintf(stderr, "stoker: doctor: %s: %s\n", d->a.path, d->storage.note);
        return false;
    }
    /* The loader's own answers for what the user's options start. */
    d->threads = d->storage.threads ? d->storage.threads : d->cpus;
    d->batch_size = d->storage.batch_size;
    d->depth = d->storage.depth;
    return true;
}

int stoker_cmd_doctor(int argc, char **argv)
{
    doctor d = {.argc = argc, .argv = argv};
    int status = 0;
    if (stk_options_create(&d.o)) {
        fprintf(stderr, "stoker: out of memory\n");
        return 1;
    }
    if ((status = stoker_parse_bench(argc, argv, d.o, &d.a)))
        goto out;
    d.secs = d.a.seconds > 0 ? d.a.seconds : DEFAULT_SECONDS;
    d.live = d.a.progress_set ? d.a.progress : isatty(STDERR_FILENO);
    d.steps = 5;
    d.mem_available = stk_mem_available();
    if (stk_default_threads(&d.cpus) != STK_OK || !d.cpus)
        d.cpus = 1;
    d.hold = calloc(CACHE_SAMPLES, sizeof *d.hold);
    d.hold_len = calloc(CACHE_SAMPLES, sizeof *d.hold_len);
    if (!d.hold || !d.hold_len) {
        fprintf(stderr, "stoker: out of memory\n");
        status = 1;
        goto out;
    }
    /* 1-2. Storage: the stored bytes through the loader, twice. */
    if (!storage_levels(&d)) {
        status = 1;
        goto out;
    }
    /* 3. Decode + augment from memory, with the thread sweep. */
    d.step = 3;
    decode_level(&d);
    /* 4. Batching of processed samples. */
    d.step = 4;
    batching_level(&d);
    /* 5. The full pipeline. */
    d.step = 5;
    stk_options *o = options_again(&d);
    if (o) {
        run_loader(&d, o, &d.full, "full pipeline", false);
        stk_options_destroy(o);
    }
    if (d.full.depth)
        d.depth = d.full.depth; /* depth auto: what the open chose */
    if (d.live)
        fprintf(stderr, "\r\033[K");
    report(&d);
out:
    for (size_t k = 0; d.hold && k < d.nhold; k++)
        free(d.hold[k]);
    free(d.hold);
    free(d.hold_len);
    free(d.outs);
    stk_options_destroy(d.o);
    return status;
}
