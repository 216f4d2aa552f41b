/*
 * image.h -- the per-sample image pipeline: sniff, decode (crop-aware, DCT
 * scaled), transform, and write the result straight into the sample's slot.
 *
 * The engine (src/loader.c) creates one pipeline per loader from the user's
 * transform spec and calls stk__imgpipe_run from its worker threads, each with
 * its own scratch buffer. A pipeline is immutable after creation, so run() is
 * safe from any number of threads at once.
 */
#ifndef STK_IMAGE_H
#define STK_IMAGE_H

#include "internal.h"
#include "ops/convert.h"

typedef struct stk__imgpipe stk__imgpipe;

/* Options that are not part of the transform spec itself. */
typedef struct stk__imgpipe_params {
    int dtype;        /* enum stk_dtype of the output (default UINT8) */
    int nchw;         /* 1: CHW per sample, 0: HWC */
    int size;         /* default crop/resize size for presets (0 = preset's) */
    int exif;         /* 1: apply EXIF orientation (default 0) */
    uint32_t max_dim; /* reject images wider or taller than this (0 = 16384) */
} stk__imgpipe_params;

/* Parses spec ("imagenet-train", "imagenet-val", "cifar-train", or a list of
 * transforms, see docs/transforms.md) and builds a pipeline.
 * STK_OK; STK_EINVAL with a message in err naming the problem and what is
 * supported; STK_ENOMEM. */
int stk__imgpipe_create(stk__imgpipe **out, const char *spec, const stk__imgpipe_params *prm,
                        char *err, size_t errlen);
void stk__imgpipe_destroy(stk__imgpipe *p);

/* Raw inputs: every sample is an uncompressed h x w x c uint8 image (c 1 or
 * 3), channels interleaved (HWC) or planar (chw = 1, CIFAR), instead of an
 * encoded file; the transforms run on it as on a decoded image. Call before
 * the first run(). */
void stk__imgpipe_set_raw(stk__imgpipe *p, uint32_t h, uint32_t w, uint32_t c, int chw);

/* Strict decoding (off by default): check the whole compressed stream of
 * every image, not only the part the sample's crop needs, so a truncated or
 * corrupt file fails whatever the random crop. Call before the first run(). */
void stk__imgpipe_set_strict(stk__imgpipe *p, int strict);

/* Caps libjpeg's own working memory per decode (0: no cap); a JPEG that needs
 * more fails with STK_ETOOBIG. Call before the first run(). */
void stk__imgpipe_set_jpeg_memory(stk__imgpipe *p, size_t bytes);

/* 1 if every output has the same shape (a resize/crop fixes it): fills ndim,
 * shape and dtype, and *sample_bytes. 0 if outputs vary (decode only): then
 * outputs are HWC uint8 of the image's own size. */
int stk__imgpipe_dense(const stk__imgpipe *p, unsigned *ndim, int64_t shape[4], int *dtype,
                       size_t *sample_bytes);

/* The conversion the pipeline's last step applies to its uint8 pixels
 * (dtype, layout, ToTensor/Normalize) and the dense output size: what the
 * device stage does on the GPU instead. */
void stk__imgpipe_convert(const stk__imgpipe *p, stk__convert *cv);

/* From now on the pipeline writes uint8 HWC pixels (flips included) and
 * leaves the conversion of stk__imgpipe_convert, asked for before this, to
 * the device stage. Call before the first run(). */
void stk__imgpipe_set_host_uint8(stk__imgpipe *p);

/* Runs the pipeline on one encoded image.
 * bytes/n: the encoded file. rng: the sample's generator (keyed by seed, epoch,
 * sample). scratch: this thread's scratch (grow with stk__scratch_reserve).
 * out/out_cap: the sample's slot. On success *out_len is the bytes written and
 * dims = {h, w, c} of the output.
 * Errors: STK_EFORMAT (corrupt, truncated, not an image: err says why),
 * STK_EUNSUPPORTED (a format or variant not handled), STK_ETOOBIG (dimension
 * limit, slot or scratch too small), STK_ENOMEM. err gets the reason only
 * (the engine adds the path). Never crashes on any input. */
/* The name of an image format recognised by its signature but not decoded
 * (GIF, BMP, TIFF, WebP, AVIF, HEIC/HEIF, JPEG 2000, JPEG XL, QOI), or NULL. */
const char *stk__image_other_format(const uint8_t *b, size_t n);

int stk__imgpipe_run(const stk__imgpipe *p, const uint8_t *bytes, size_t n, stk__rng *rng,
                     stk__scratch *scratch, uint8_t *out, size_t out_cap, size_t *out_len,
                     int32_t dims[3], char *err, size_t errlen);
/* What stk__imgpipe_run_sink made. */
typedef struct stk__imgpipe_result {
    uint8_t *out;    /* where the output went (NULL if the sink gave nothing) */
    size_t len;      /* its bytes */
    int32_t dims[3]; /* {h, w, c} */
    /* When the decode finished, before the transforms, on stk__now_ns's
     * clock (0: the run failed before): the trace splits a sample's
     * processing into decode and transform with it. */
    uint64_t decoded_at;
} stk__imgpipe_result;

/* The same, writing into memory the sink gives once the output's size is
 * known: a variable batch's arena takes exactly the bytes each image needs.
 * *res is filled (zeroed first); errors as stk__imgpipe_run. */
int stk__imgpipe_run_sink(const stk__imgpipe *p, const uint8_t *bytes, size_t n, stk__rng *rng,
                          stk__scratch *scratch, stk__sink *sink, stk__imgpipe_result *res,
                          char *err, size_t errlen);

#endif
