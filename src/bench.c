/*
 * bench.c -- stk_bench_decode: the decode+augment stage alone, on samples
 * already in memory (what `stoker doctor` measures at its "decode" level).
 *
 * The pipeline is the loader's (stk__imgpipe_from_options, the same set-up
 * the loader and its fields use) and the threads are the library's ordered
 * parallel map (pack/omap.c, the pool stk_pack runs on), so the figure is
 * what the loader's workers would get were reading and batching free. Items
 * cycle over the held samples until the time is up; the calling thread is the
 * map's consumer and only counts.
 */
#include "image.h"
#include "options.h"
#include "pack/pack.h"

#include <sys/resource.h>

typedef struct bench_worker {
    stk__scratch scratch; /* the decoder's */
    stk__scratch out;     /* a variable output (dense ones go to `dense`) */
    uint8_t *dense;       /* one dense output */
} bench_worker;

typedef struct bench_ctx {
    const stk__imgpipe *pipe;
    const void *const *samples;
    const size_t *lens;
    size_t n;
    uint64_t seed;
    size_t sample_bytes; /* dense outputs; 0 for variable */
    uint8_t *keep;       /* the caller's out: outputs of items 0 .. nkeep-1 */
    size_t nkeep;
    bench_worker *workers;
    int *rc; /* per slot: how the item went */
} bench_ctx;

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void bench_item(void *arg, unsigned worker, uint64_t i, uint64_t slot)
{
    bench_ctx *c = arg;
    bench_worker *w = &c->workers[worker];
    size_t k = (size_t)(i % c->n);
    /* Item i is sample k in round i / n: each round draws afresh. */
    stk__rng rng = stk__rng_for(c->seed, i / c->n, k);
    size_t len = 0;
    int32_t dims[3];
    char err[256];
    int rc;
    if (c->sample_bytes) {
        uint8_t *dst = i < c->nkeep ? c->keep + i * c->sample_bytes : w->dense;
        rc = stk__imgpipe_run(c->pipe, c->samples[k], c->lens[k], &rng, &w->scratch, dst,
                              c->sample_bytes, &len, dims, err, sizeof err);
    } else {
        stk__sink sink = {.grow = &w->out};
        stk__imgpipe_result res;
        rc = stk__imgpipe_run_sink(c->pipe, c->samples[k], c->lens[k], &rng, &w->scratch, &sink,
                                   &res, err, sizeof err);
    }
    c->rc[slot] = rc;
}

/* The output shape and the inputs' pixel count, before the clock starts. */
static void describe_run(const stk__imgpipe *pipe, const void *const *samples, const size_t *lens,
                         size_t n, stk_bench_decode_result *r)
{
    size_t sb = 0;
    r->kind = stk__imgpipe_dense(pipe, &r->ndim, r->shape, &r->dtype, &sb) ? STK_BATCH_DENSE
                                                                           : STK_BATCH_VARIABLE;
    r->sample_bytes = r->kind == STK_BATCH_DENSE ? sb : 0;
    if (r->kind != STK_BATCH_DENSE)
        r->dtype = STK_DTYPE_UINT8;
    for (size_t k = 0; k < n; k++) {
        uint32_t w = 0, h = 0;
        stk__pack_sniff_size(samples[k], lens[k], &w, &h);
        if (w && h) {
            r->input_pixels += (uint64_t)w * h;
            r->input_images++;
        }
    }
}

/* Runs the map for `seconds`, counting what came out in order. */
static int run_map(bench_ctx *c, unsigned threads, double seconds, stk_bench_decode_result *r,
                   char *err, size_t errlen)
{
    uint64_t window = 4 * (uint64_t)threads;
    stk__omap *m = NULL;
    double c0 = cpu_seconds();
    uint64_t t0 = stk__now_ns(), limit = (uint64_t)(seconds * 1e9);
    int rc =
        stk__omap_start(&m, UINT64_MAX, threads, window, "stk-bench", bench_item, c, err, errlen);
    if (rc)
        return rc;
    uint64_t i = 0;
    while (stk__now_ns() - t0 < limit) {
        if (!stk__omap_wait(m, i, 50000000u))
            continue;
        if (c->rc[i % window] == STK_OK)
            r->samples++;
        else
            r->failed++;
        stk__omap_release(m, i++);
    }
    stk__omap_stop(m);
    r->seconds = (double)(stk__now_ns() - t0) * 1e-9;
    r->cpu_seconds = cpu_seconds() - c0;
    r->outputs = c->nkeep < i ? c->nkeep : (size_t)i;
    return STK_OK;
}

int stk_bench_decode(const stk_options *o, const void *const *samples, const size_t *lens, size_t n,
                     unsigned threads, double seconds, void *out, size_t out_cap,
                     stk_bench_decode_result *res, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    if (!o || !samples || !lens || !n || !res || res->struct_size < sizeof *res || threads > 256 ||
        !(seconds > 0 && seconds <= 3600)) {
        stk__fmt(err, errlen,
                 "stk_bench_decode: needs options, 1 or more samples, threads 0..256, "
                 "seconds in (0, 3600] and a result with struct_size set");
        return STK_EINVAL;
    }
    const char *spec = o->transform;
    if (!spec || !*spec || !strcmp(spec, "none")) {
        stk__fmt(err, errlen, "no transform: nothing to decode");
        return STK_EINVAL;
    }
    if (!threads && stk__default_threads(&threads, err, errlen) != STK_OK)
        return STK_EINVAL;
    stk_bench_decode_result r = {.struct_size = sizeof r, .threads = threads};
    bench_ctx c = {.samples = samples, .lens = lens, .n = n, .seed = o->seed};
    stk__imgpipe *pipe = NULL;
    int rc = stk__imgpipe_from_options(&pipe, spec, o, err, errlen);
    if (rc)
        return rc;
    c.pipe = pipe;
    describe_run(pipe, samples, lens, n, &r);
    c.sample_bytes = r.sample_bytes;
    if (out && r.sample_bytes) {
        c.keep = out;
        c.nkeep = out_cap / r.sample_bytes;
        if (c.nkeep > n)
            c.nkeep = n; /* the first round: one output per sample */
    }
    rc = STK_ENOMEM;
    c.workers = stk__calloc(threads, sizeof *c.workers);
    c.rc = stk__calloc(4 * (size_t)threads, sizeof *c.rc);
    if (!c.workers || !c.rc)
        goto out;
    for (unsigned t = 0; t < threads; t++) {
        c.workers[t].scratch.limit = o->scratch_bytes;
        c.workers[t].out.limit = (size_t)1 << 31;
        if (r.sample_bytes && !(c.workers[t].dense = stk__malloc(r.sample_bytes)))
            goto out;
    }
    rc = run_map(&c, threads, seconds, &r, err, errlen);
out:
    if (rc == STK_ENOMEM)
        stk__fmt(err, errlen, "stk_bench_decode: out of memory");
    for (unsigned t = 0; c.workers && t < threads; t++) {
        stk__scratch_free(&c.workers[t].scratch);
        stk__scratch_free(&c.workers[t].out);
        stk__free(c.workers[t].dense);
    }
    stk__free(c.workers);
    stk__free(c.rc);
    stk__imgpipe_destroy(pipe);
    if (rc == STK_OK)
        *res = r;
    return rc;
}
