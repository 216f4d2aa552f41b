/* fuzz_image.c -- libFuzzer target for the image path on untrusted bytes:
 * format sniffing, the JPEG and PNG decoders' glue (error managers, colour
 * conversions, crop-aware and DCT-scaled decoding), the EXIF orientation
 * parser, and every transform writing into a slot. Each input runs through
 * several pipelines; any result but a clean success or a clean per-sample
 * error aborts, as does an output that breaks its own contract. A strict
 * decode (the whole stream, never a restart index's sub-image) is the oracle
 * for the crop-aware one: when both succeed their pixels must be equal, so a
 * restart index that lies can never give a wrong image. Linked with
 * replay_main.c it replays the corpus as a regular test. */
#include "image.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NPIPES  4
#define MAX_DIM 2048
#define OUT_CAP ((size_t)MAX_DIM * MAX_DIM * 3)

static const char *const k_specs[NPIPES] = {
    "decode",
    "imagenet-train",
    "Resize(40)|CenterCrop(32)|Normalize(mean=(0.5,0.5,0.5),std=(0.25,0.25,0.25))",
    "RandomCrop(24,padding=4,pad_if_needed=True)|RandomVerticalFlip()|RandomHorizontalFlip()",
};

static stk__imgpipe *g_pipes[NPIPES], *g_strict;
static uint8_t *g_out, *g_ref;
static stk__scratch g_scratch;

static void setup(void)
{
    char err[STK_ERRMSG_MAX];
    for (int k = 0; k < NPIPES; k++) {
        stk__imgpipe_params prm = {k == 2 ? STK_DTYPE_FLOAT16 : STK_DTYPE_UINT8, k & 1, 0, 1,
                                   MAX_DIM};
        if (stk__imgpipe_create(&g_pipes[k], k_specs[k], &prm, err, sizeof err) != STK_OK)
            abort();
    }
    stk__imgpipe_params prm = {STK_DTYPE_UINT8, 1, 0, 1, MAX_DIM};
    if (stk__imgpipe_create(&g_strict, k_specs[1], &prm, err, sizeof err) != STK_OK)
        abort();
    stk__imgpipe_set_strict(g_strict, 1);
    g_out = malloc(OUT_CAP);
    g_ref = malloc(OUT_CAP);
    g_scratch.limit = 64u << 20;
    if (!g_out || !g_ref)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_out)
        setup();
    /* The oracle first: imagenet-train decoding the whole stream. */
    size_t ref_len = 0;
    int32_t ref_dims[3];
    char ref_err[STK_ERRMSG_MAX];
    stk__rng ref_rng = stk__rng_for(7, 1, size);
    int ref_rc = stk__imgpipe_run(g_strict, data, size, &ref_rng, &g_scratch, g_ref, OUT_CAP,
                                  &ref_len, ref_dims, ref_err, sizeof ref_err);
    for (int k = 0; k < NPIPES; k++) {
        char err[STK_ERRMSG_MAX];
        err[0] = '\0';
        stk__rng rng = stk__rng_for(7, 1, size);
        size_t len = 0;
        int32_t dims[3] = {-1, -1, -1};
        int rc = stk__imgpipe_run(g_pipes[k], data, size, &rng, &g_scratch, g_out, OUT_CAP, &len,
                                  dims, err, sizeof err);
        if (rc == STK_OK) {
            unsigned ndim;
            int64_t shape[4];
            int dtype;
            size_t sb;
            if (dims[0] <= 0 || dims[1] <= 0 || dims[2] != 3 || len > OUT_CAP)
                abort();
            if (stk__imgpipe_dense(g_pipes[k], &ndim, shape, &dtype, &sb)) {
                if (len != sb)
                    abort();
                if (k == 1 && ref_rc == STK_OK && memcmp(g_out, g_ref, len))
                    abort(); /* the crop decode disagrees with the whole-stream one */
            } else if (len != (size_t)dims[0] * (size_t)dims[1] * 3) {
                abort();
            }
        } else if (rc != STK_EFORMAT && rc != STK_EUNSUPPORTED && rc != STK_ETOOBIG &&
                   rc != STK_ENOMEM) {
            abort();
        } else if (!err[0]) {
            abort(); /* every failure says why */
        }
    }
    return 0;
}
