/*
 * image_ops_bench.c -- per-image cost of stoker's image pipeline on files in
 * memory, one core: full decode (libjpeg through the pipeline's "decode"),
 * imagenet-train (crop-aware + DCT-scaled decode, resize, flip), and the
 * resize alone on the same RandomResizedCrop windows of a decoded image.
 * bench/image_ops_bench.py builds it, makes the test images, runs PIL on the
 * same work and prints the ratios.
 *
 *   image_ops_bench ROUNDS FILE...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "ops/ops.h"

typedef struct file {
    uint8_t *p;
    size_t n;
} file;

static file slurp(const char *path)
{
    file f = {NULL, 0};
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return f;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f.p = malloc((size_t)len);
    f.n = fread(f.p, 1, (size_t)len, fp);
    fclose(fp);
    return f;
}

/* Mean microseconds per image of running spec over all files, rounds times. */
static double time_spec(const char *spec, file *fs, int nf, int rounds, uint8_t *out, size_t cap,
                        stk__scratch *sc)
{
    stk__imgpipe_params prm = {STK_DTYPE_UINT8, 0, 0, 0, 0};
    stk__imgpipe *p = NULL;
    char err[STK_ERRMSG_MAX];
    if (stk__imgpipe_create(&p, spec, &prm, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    uint64_t t0 = stk__now_ns();
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < nf; k++) {
            stk__rng rng = stk__rng_for(1, (uint64_t)r, (uint64_t)k);
            size_t len;
            int32_t dims[3];
            if (stk__imgpipe_run(p, fs[k].p, fs[k].n, &rng, sc, out, cap, &len, dims, err,
                                 sizeof err)) {
                fprintf(stderr, "%s\n", err);
                exit(1);
            }
        }
    }
    double us = (double)(stk__now_ns() - t0) / 1e3 / rounds / nf;
    stk__imgpipe_destroy(p);
    return us;
}

/* The resampler alone: decode each file once, then resize the same
 * RandomResizedCrop windows (crop box -> 224x224) the pipeline would draw. */
static double time_resize(file *fs, int nf, int rounds, uint8_t *out, size_t cap, stk__scratch *sc)
{
    const double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
    double total = 0;
    stk__imgpipe_params prm = {STK_DTYPE_UINT8, 0, 0, 0, 0};
    stk__imgpipe *p = NULL;
    char err[STK_ERRMSG_MAX];
    stk__imgpipe_create(&p, "decode", &prm, err, sizeof err);
    uint8_t *tmp = malloc((size_t)4 << 20), *dst = malloc(224 * 224 * 3);
    void *mx = malloc((size_t)1 << 20), *my = malloc((size_t)1 << 20);
    for (int k = 0; k < nf; k++) {
        size_t len;
        int32_t d[3];
        stk__rng rng0 = stk__rng_for(0, 0, 0);
        stk__imgpipe_run(p, fs[k].p, fs[k].n, &rng0, sc, out, cap, &len, d, err, sizeof err);
        stk__view img = {out, (size_t)d[1] * 3, (uint32_t)d[1], (uint32_t)d[0]};
        uint64_t t0 = stk__now_ns();
        for (int r = 0; r < rounds; r++) {
            stk__rng rng = stk__rng_for(1, (uint64_t)r, (uint64_t)k);
            uint32_t c[4];
            stk__rrc_params(&rng, img.w, img.h, scale, ratio, c, NULL);
            stk__view src = stk__crop(&img, c[1], c[0], c[3], c[2]);
            stk__axis ax, ay;
            stk__axis_init(&ax, mx, c[3], 0, c[3], 224, 0, 224);
            stk__axis_init(&ay, my, c[2], 0, c[2], 224, 0, 224);
            stk__view hv = {tmp, 224 * 3, 224, c[2]}, ov = {dst, 224 * 3, 224, 224};
            stk__resample_h(&src, 0, &ax, &hv);
            stk__resample_v(&hv, &ay, &ov);
        }
        total += (double)(stk__now_ns() - t0);
    }
    free(tmp);
    free(dst);
    free(mx);
    free(my);
    stk__imgpipe_destroy(p);
    return total / 1e3 / rounds / nf;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: image_ops_bench ROUNDS FILE...\n");
        return 2;
    }
    int rounds = (int)strtol(argv[1], NULL, 10), nf = argc - 2;
    file *fs = calloc((size_t)nf, sizeof *fs);
    for (int k = 0; k < nf; k++)
        fs[k] = slurp(argv[k + 2]);
    size_t cap = (size_t)64 << 20;
    uint8_t *out = malloc(cap);
    stk__scratch sc = {NULL, 0, (size_t)512 << 20};
    /* Warm up caches and the scratch once. */
    time_spec("decode", fs, nf, 1, out, cap, &sc);
    double full = time_spec("decode", fs, nf, rounds, out, cap, &sc);
    double train = time_spec("imagenet-train", fs, nf, rounds, out, cap, &sc);
    double rrc = time_spec("RandomResizedCrop(224)", fs, nf, rounds, out, cap, &sc);
    double val = time_spec("imagenet-val", fs, nf, rounds, out, cap, &sc);
    double rs = time_resize(fs, nf, rounds, out, cap, &sc);
    printf("full_decode_us %.1f\nimagenet_train_us %.1f\nrrc_us %.1f\nimagenet_val_us %.1f\n"
           "resize_us %.1f\n",
           full, train, rrc, val, rs);
    stk__scratch_free(&sc);
    free(out);
    for (int k = 0; k < nf; k++)
        free(fs[k].p);
    free(fs);
    return 0;
}
