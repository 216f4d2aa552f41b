/*
 * image_dump_main.c -- runs the image pipeline on one file and writes the raw
 * output, so Python tests can compare it with PIL/torchvision. Built by
 * tests/py/test_image_parity.py with a direct gcc line (not by the Makefile:
 * its name does not start with test_).
 *
 *   image_dump IMAGE SPEC SEED OUT [dtype=..] [layout=nchw|nhwc] [size=N]
 *              [exif=0|1] [max_dim=N] [sample=N]
 *       prints "h w c nbytes"; on failure "ERR code reason" and exits 2.
 *   image_dump --rrc WIDTH HEIGHT COUNT SEED [s0 s1 r0 r1]
 *       prints COUNT lines "top left h w fallback" from the C sampler.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "ops/ops.h"

static void *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    *n = p ? fread(p, 1, (size_t)(len > 0 ? len : 0), f) : 0;
    fclose(f);
    return p;
}

static int rrc_mode(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    uint32_t w = (uint32_t)strtoul(argv[2], NULL, 10), h = (uint32_t)strtoul(argv[3], NULL, 10);
    unsigned long count = strtoul(argv[4], NULL, 10);
    uint64_t seed = strtoull(argv[5], NULL, 10);
    double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
    if (argc >= 10) {
        scale[0] = strtod(argv[6], NULL), scale[1] = strtod(argv[7], NULL);
        ratio[0] = strtod(argv[8], NULL), ratio[1] = strtod(argv[9], NULL);
    }
    for (unsigned long k = 0; k < count; k++) {
        stk__rng rng = stk__rng_for(seed, 0, k);
        uint32_t o[4];
        int fb;
        stk__rrc_params(&rng, w, h, scale, ratio, o, &fb);
        printf("%u %u %u %u %d\n", o[0], o[1], o[2], o[3], fb);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--rrc"))
        return rrc_mode(argc, argv);
    if (argc < 5) {
        fprintf(stderr, "usage: image_dump IMAGE SPEC SEED OUT [key=value...]\n");
        return 2;
    }
    stk__imgpipe_params prm = {STK_DTYPE_UINT8, 0, 0, 0, 0};
    uint64_t sample = 0;
    for (int k = 5; k < argc; k++) {
        const char *a = argv[k];
        if (!strncmp(a, "dtype=", 6)) {
            const char *v = a + 6;
            prm.dtype = !strcmp(v, "float32")    ? STK_DTYPE_FLOAT32
                        : !strcmp(v, "float16")  ? STK_DTYPE_FLOAT16
                        : !strcmp(v, "bfloat16") ? STK_DTYPE_BFLOAT16
                                                 : STK_DTYPE_UINT8;
        } else if (!strncmp(a, "layout=", 7)) {
            prm.nchw = !strcmp(a + 7, "nchw");
        } else if (!strncmp(a, "size=", 5)) {
            prm.size = (int)strtol(a + 5, NULL, 10);
        } else if (!strncmp(a, "exif=", 5)) {
            prm.exif = (int)strtol(a + 5, NULL, 10);
        } else if (!strncmp(a, "max_dim=", 8)) {
            prm.max_dim = (uint32_t)strtoul(a + 8, NULL, 10);
        } else if (!strncmp(a, "sample=", 7)) {
            sample = strtoull(a + 7, NULL, 10);
        }
    }
    char err[STK_ERRMSG_MAX] = "";
    stk__imgpipe *p = NULL;
    int rc = stk__imgpipe_create(&p, argv[2], &prm, err, sizeof err);
    if (rc) {
        printf("ERR %d %s\n", rc, err);
        return 2;
    }
    size_t n = 0;
    uint8_t *bytes = slurp(argv[1], &n);
    if (!bytes) {
        printf("ERR %d cannot read %s\n", STK_EIO, argv[1]);
        stk__imgpipe_destroy(p);
        return 2;
    }
    size_t cap = (size_t)1 << 30;
    uint8_t *out = malloc(cap);
    stk__scratch sc = {NULL, 0, (size_t)2 << 30};
    stk__rng rng = stk__rng_for(strtoull(argv[3], NULL, 10), 0, sample);
    size_t len = 0;
    int32_t dims[3] = {0, 0, 0};
    rc = stk__imgpipe_run(p, bytes, n, &rng, &sc, out, cap, &len, dims, err, sizeof err);
    if (rc) {
        printf("ERR %d %s\n", rc, err);
    } else {
        FILE *f = fopen(argv[4], "wb");
        if (!f || fwrite(out, 1, len, f) != len)
            rc = STK_EIO;
        if (f)
            fclose(f);
        printf("%d %d %d %zu\n", dims[0], dims[1], dims[2], len);
    }
    stk__scratch_free(&sc);
    free(out);
    free(bytes);
    stk__imgpipe_destroy(p);
    return rc ? 2 : 0;
}
