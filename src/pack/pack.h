/*
 * pack.h -- packing (stk_pack and stk_writer in include/stoker.h) and the
 * image checks it shares with `stoker verify`. src/pack/ sits above
 * src/source/: it reads through dataset.h, decodes and encodes through
 * src/codec/, resizes with src/ops/, and writes with stkformat.h's shard
 * writer and manifest.h; every file call goes through src/io/file.h.
 *
 *   pack.c       stk_pack: options, the plan, then "ordered parallel
 *                transform, then the writer"
 *   transform.c  one sample's payload (stk__pack_transform)
 *   omap.c       the ordered parallel map (stk__omap)
 *   writer.c     the output directory (lock, marker, shards, manifest) and
 *                the public stk_writer that stk_pack writes through
 *   imgcheck.c   is this an image?
 */
#ifndef STK_PACK_H
#define STK_PACK_H

#include "source/manifest.h"
#include "source/source.h"
#include "source/stkformat.h"

/* True if name ends with one of the image extensions the folder reader
 * takes (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case). */
bool stk__image_name(const char *name);
/* Checks that the n bytes at b are an image: JPEG or PNG (the formats
 * stoker decodes) whose header parses, or another known image format by its
 * signature (GIF, BMP, TIFF, WebP, PNM, ...). Returns 0 with *format (may be
 * NULL) set to the format's name, or -1 with the reason in err ("not an
 * image: unknown signature ..." for text and other non-images). */
int stk__check_image(const uint8_t *b, size_t n, const char **format, char *err, size_t errlen);
/* Which samples of an open source claim to be images, to be checked with
 * stk__check_image before they are packed or passed by verify: 0 none, 1
 * all (a folder, a resized .stk), 2 those whose key is an image's file name
 * (stk__image_name; an encoded .stk). */
int stk__images_of(const stk__source *s);

/* Image size from the header alone (JPEG SOF, PNG IHDR); 0x0 if unknown. */
void stk__pack_sniff_size(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h);

/* ---- One sample's payload (transform.c) ---------------------------------- */

/* IN_FIELDS: a source whose samples have more fields than a payload and a
 * label (a multi-field tar, a fields .stk): every field is kept, in the
 * fields layout. */
enum stk__pack_in { STK__IN_IMAGES, STK__IN_CIFAR, STK__IN_RAW_STK, STK__IN_BYTES, STK__IN_FIELDS };

/* What stk_pack decided (pack.c's plan); read-only while workers run. */
typedef struct stk__pack_plan {
    const stk_pack_options *o; /* with defaults filled in */
    const char *root;          /* the source path, for sample keys */
    stk__source *src;
    int in_kind;               /* enum stk__pack_in */
    uint32_t kind;             /* payload kind written */
    uint32_t in_h, in_w, in_c; /* IN_RAW_STK / IN_CIFAR sample shape */
    int images;                /* check as images: see stk__images_of */
    /* IN_FIELDS: the .stk's id of each source field (fields marked nocopy are
     * not written, so the ids after one close up). */
    uint32_t fmap[STK__MAX_FIELDS];
} stk__pack_plan;

typedef struct stk__pack_buf {
    uint8_t *p;
    size_t len, cap;
} stk__pack_buf;

#define STK__PACK_ERR 512

/* A sample made by a worker, waiting to be written in order. */
typedef struct stk__pack_sample {
    stk__pack_buf out; /* the payload */
    int64_t label;
    uint32_t w, h; /* the image size recorded in the shard's metadata */
    int rc;        /* STK_OK, or why the sample failed (reason in err) */
    bool indexed;  /* restart: the payload carries a restart index */
    char err[STK__PACK_ERR];
} stk__pack_sample;

/* One worker's reusable buffers. */
typedef struct stk__pack_worker {
    stk__scratch scratch;             /* the source's read */
    stk__pack_buf px, px2, tmp, area; /* pixels, resized, decoder and resize scratch */
    stk__field_set fs;                /* IN_FIELDS: the sample's fields */
} stk__pack_worker;

/* Does stk_pack keep src's samples as fields (STK__IN_FIELDS)? A fields
 * .stk, or a source describing fields beyond one image and one integer
 * (the payload and label the one-payload layout keeps); never a folder,
 * CIFAR or records, whose further fields are made from the key or label. */
bool stk__pack_keeps_fields(const stk__source *src);

/* Makes sample i's payload into s (s->rc and s->err say how it went). */
void stk__pack_transform(const stk__pack_plan *p, stk__pack_worker *wk, uint64_t i,
                         stk__pack_sample *s);
void stk__pack_worker_free(stk__pack_worker *wk);
int stk__pack_buf_reserve(stk__pack_buf *b, size_t n);

/* ---- The ordered parallel map (omap.c) ----------------------------------
 * threads workers (named "<name>-N") call fn(ctx, worker, i, slot) for
 * i = 0 .. n-1 in increasing order of start, each into slot i % window, and
 * never more than window ahead of the consumer, which takes the results in
 * order: stk__omap_wait(i), use slot i % window, stk__omap_release(i). fn
 * runs without any lock held. Lock order: the map's one mutex is a leaf. */
typedef struct stk__omap stk__omap;
typedef void (*stk__omap_fn)(void *ctx, unsigned worker, uint64_t i, uint64_t slot);
/* STK_OK, STK_ENOMEM, or STK_EIO when a thread cannot start (reason in err);
 * on failure nothing is left running. */
int stk__omap_start(stk__omap **out, uint64_t n, unsigned threads, uint64_t window,
                    const char *name, stk__omap_fn fn, void *ctx, char *err, size_t errlen);
/* Waits up to timeout_ns for result i: true when it is there. */
bool stk__omap_wait(stk__omap *m, uint64_t i, uint64_t timeout_ns);
/* Gives slot i % window back for sample i + window. */
void stk__omap_release(stk__omap *m, uint64_t i);
/* Stops the workers (each finishes the sample it is on), joins them, frees
 * the map. NULL is harmless. */
void stk__omap_stop(stk__omap *m);

/* ---- The output directory and its shards (writer.c) ---------------------
 * stk_pack writes through the same stk_writer the public API offers, with
 * what only packing knows (the payload kind's header, the image size of
 * each sample, the restart counts) set through these. */
struct stk_writer {
    char *dir;
    stk_writer_options o;
    stk__stk_header h;
    stk__manifest man;   /* the shards, class names and counts so far */
    stk__stk_writer *sw; /* the shard being written, or NULL */
    size_t cap;          /* entries allocated in man.shards */
    uint64_t bytes;      /* size of the finished shards */
    double t0;
    bool created, marker, finished, failed;
    int lock_fd; /* the directory's writer lock, -1 once given back */
    char err[STK_ERRMSG_MAX];
    /* The layout its samples have: 0 none yet, 1 one payload (stk_writer_add,
     * stk_pack of one-payload sources), 2 fields. */
    int layout;
    /* With fields: the names so far (ids are positions), each one's kind,
     * and how many samples of the shard being written have it. */
    char *fname[STK__MAX_FIELDS];
    int fkind[STK__MAX_FIELDS];
    uint64_t fshard[STK__MAX_FIELDS];
    size_t nfname;
    stk__pack_buf fbuf; /* add_fields' payload */
};

/* Takes dir (creating it if missing) for a writer of shards with header h:
 * its writer lock, the checks that nothing is packed or half-packed there,
 * and the unfinished-pack marker. shard_size and num_classes as in
 * stk_writer_options. On failure nothing is left behind, reason in err. */
int stk__writer_create(stk_writer **out, const char *dir, const stk__stk_header *h,
                       uint64_t shard_size, uint64_t num_classes, char *err, size_t errlen);
/* Appends one payload (sample index i names it in messages) with the image
 * size the shard records. Reason in w->err; the writer has failed then. */
int stk__writer_put(stk_writer *w, uint64_t i, const void *data, size_t len, int64_t label,
                    const char *key, uint32_t iw, uint32_t ih);
/* Makes w a writer of fields shards whose field table starts with these n
 * fields (names copied, kinds kept), so ids are the positions in fields.
 * STK_ENOMEM, STK_EINVAL past STK__MAX_FIELDS; reason in w->err. */
int stk__writer_set_fields(stk_writer *w, const stk__field_desc *fields, size_t n);
/* A fields payload from n refs (ids < w's fields, strictly increasing):
 * into b. STK_ETOOBIG past 4 GiB, STK_ENOMEM. */
int stk__pack_fields_payload(stk__pack_buf *b, const stk__field_ref *refs, size_t n, char *err,
                             size_t errlen);
/* Ends the last shard, writes the manifest, removes the marker and gives
 * the lock back. Reason in w->err. */
int stk__writer_end(stk_writer *w);
/* Bytes written so far (finished shards and the one being written). */
uint64_t stk__writer_bytes(const stk_writer *w);
double stk__pack_now(void);

#endif
