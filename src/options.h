/* options.h -- the options object behind stk_options_* (internal layout). */
#ifndef STK_OPTIONS_H
#define STK_OPTIONS_H

#include "internal.h"

struct stk_options {
    char *source;
    char *source_shown; /* source for messages: a URL's credentials and query removed */
    size_t record_bytes, header_bytes;
    unsigned label_bytes;
    size_t batch_size;
    unsigned threads, depth;
    uint64_t seed;
    bool shuffle, drop_last;
    unsigned rank, world;
    unsigned local_world; /* ranks per node (0: the world is one node) */
    int on_error;
    size_t max_sample_bytes; /* variable batches: one sample's cap (0: none) */
    size_t batch_memory;     /* variable batches: one batch's samples' cap */
    char *transform;
    /* Image options (stk_options_set). */
    int dtype;
    int nchw;
    int size;
    int exif;
    int strict; /* decode check of the whole compressed stream */
    uint32_t max_dim;
    size_t scratch_bytes;   /* per-thread decode scratch limit */
    size_t max_input_bytes; /* per-thread encoded-input limit when decoding */
    /* Remote datasets (stk_options_set; docs/remote.md). */
    char *endpoint, *region;
    int addressing;             /* 0 default, 1 path, 2 virtual */
    unsigned fetch_concurrency; /* requests in flight (0 = 64) */
    unsigned fetch_retries;     /* 0 = default (6) */
    unsigned fetch_rate;        /* requests a second (0: no budget) */
    unsigned fetch_hedge;       /* hedge after this multiple of the recent p95 (0: never) */
    unsigned fetch_timeout;     /* seconds of < 1 KiB/s before a retry (0 = 30) */
    uint64_t fetch_buffer;      /* bytes buffered + in flight (0 = 64 MiB) */
    uint64_t fetch_lookahead;   /* samples planned ahead (0 = 4096) */
    char *cache_dir;
    uint64_t cache_limit;
    uint64_t listing_ttl; /* seconds (0 = a day; UINT64_MAX: 0 set, relist each open) */
    /* The first remote option set by stk_options_set (the table's name), and
     * whether cache_limit was: an open refuses them where they would change
     * nothing (a local path; no cache_dir). */
    const char *remote_set;
    bool cache_limit_set;
    /* Sample order (docs/engine.md). */
    int order;             /* STK__ORDER_GLOBAL, _SHARDS, _BLOCKS (the enum's words) */
    uint64_t block_bytes;  /* order blocks: bytes of one block */
    unsigned shard_window; /* shards per window (0 = 8) */
    size_t jpeg_memory;    /* per-thread cap on libjpeg's own memory */
    /* Trace (docs/diagnosis.md): Chrome trace-event JSON written at close. */
    char *trace;            /* file, or NULL: no trace */
    bool autotune;          /* threads is a cap; the active count adapts */
    bool depth_auto;        /* depth chosen from memory_budget at open */
    uint64_t memory_budget; /* bytes for the loader's bound (0: a quarter of the
                               memory available, shared by LOCAL_WORLD_SIZE) */
    uint64_t trace_events;  /* events kept in all (the ring's size) */
    /* Samples with fields (fields.h): none = one payload and a label. */
    struct stk__fspec *fields;
    size_t nfields;
    size_t field_memory; /* one batch's variable fields' cap */
    /* A mixture of sources (stk_options_add_source; docs/mixing.md). */
    struct stk__mix_spec *mix;
    size_t nmix;
    uint64_t samples_per_epoch; /* 0: the default (mix.h) */
    int mix_resume;             /* 0 strict, 1 new: a changed mixture resumes */
    int mix_batching;           /* 0 mixed, 1 per_source */
    stk_warning_fn warn;        /* stk_options_set_warning (NULL: stderr) */
    void *warn_user;
    int device; /* enum stk_device of the batches (docs/gpu.md) */
    int device_id;
    char errmsg[512]; /* why the last stk_options_set failed (stk_options_errmsg) */
};

/* A source's own transform of a named image field (field NULL: the first). */
typedef struct stk__mix_tf {
    char *field, *spec;
} stk__mix_tf;

/* One source of a mixture. */
typedef struct stk__mix_spec {
    char *path, *shown;
    char *transform; /* the source's own transform of the first image, or NULL */
    double weight;
    uint64_t samples;
    stk__mix_tf *tfs; /* its own transforms of other image fields, by name */
    size_t ntfs;
    /* Its own sample order (stk_options_source_set), or the loader's:
     * order -1, shard_window 0, block_bytes 0. */
    int order;
    unsigned shard_window;
    uint64_t block_bytes;
    /* Whether the fetch stage may keep its shards in the disk cache
     * (stk_options_source_set "cache"): -1 the loader's (cache_dir), 0 not
     * (its samples are read by range), 1 yes. */
    int cache;
} stk__mix_spec;

enum { STK__ORDER_GLOBAL = 0, STK__ORDER_SHARDS = 1, STK__ORDER_BLOCKS = 2 };

/* How a size is written, for messages (the tools have their own copy for
 * options that are not in the table). */
#define STK__SIZE_SYNTAX                                                                           \
    "e.g. 1048576, 64K, 16M or 16MiB, 1.5G, 500GiB; K/M/G/T and KiB..TiB are powers of 1024, "     \
    "KB/MB/GB/TB powers of 1000"

struct stk__imgpipe;
/* Builds the image pipeline for spec with o's image options (dtype, layout,
 * size, exif, max_dim, strict, jpeg_memory): the one place the loader, its
 * fields and stk_bench_decode set a pipeline up from options. As
 * stk__imgpipe_create (the message in err). */
int stk__imgpipe_from_options(struct stk__imgpipe **out, const char *spec, const stk_options *o,
                              char *err, size_t errlen);

struct stk__source_params;
struct stk__remote_cfg;
/* The source parameters o names (records, the remote store's settings,
 * the cache) into *prm, its store settings into *rcfg (prm->remote points
 * there); o NULL: none. The one place the loader and the dataset API turn
 * options into a source's parameters. */
void stk__options_source_params(const stk_options *o, struct stk__source_params *prm,
                                struct stk__remote_cfg *rcfg);

#endif
