/*
 * stoker.h -- the public C API of libstoker, a data-loading engine.
 *
 * This header is the contract. Everything not declared here is internal.
 *
 * Model: an options object describes a dataset and a pipeline; a loader opened
 * from it runs a fixed pool of native worker threads that fill a bounded ring of
 * batch buffers, and hands complete batches to one consumer, strictly in order.
 *
 * Return codes: functions return int: STK_OK (0), a positive status (STK_END),
 * or a negative STK_E* code. The numbers never change. stk_strerror() gives a
 * static text for a code; the detailed message (which sample, which file, why)
 * is kept on the handle and read with stk_loader_errmsg().
 *
 * Threads: an options object belongs to one thread at a time. A loader's
 * consumer functions (next, release, set_epoch, state, stats, close) may be
 * called from any thread, but not concurrently with each other for the same
 * loader, except stk_batch_release(), which any thread may call at any time
 * while the batch is held.
 */
#ifndef STOKER_H
#define STOKER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(STK_BUILDING_LIBRARY)
#define STK_API __attribute__((visibility("default")))
#else
#define STK_API
#endif

/* The version, in one place: the Makefile (shared library file name and
 * soname, stoker.pc) and setup.py (the Python package's metadata) read these
 * three lines, stk_version() returns the string built from them, and
 * `stoker version` and stoker.__version__ print stk_version(). The soname's
 * number is STK_VERSION_MAJOR: it changes only when the ABI breaks. */
#define STK_VERSION_MAJOR 0
#define STK_VERSION_MINOR 1
#define STK_VERSION_PATCH 0

#define STK__STR(x)  #x
#define STK__XSTR(x) STK__STR(x)
/* "MAJOR.MINOR.PATCH", e.g. "0.1.0". */
#define STK_VERSION_STRING                                                                         \
    STK__XSTR(STK_VERSION_MAJOR) "." STK__XSTR(STK_VERSION_MINOR) "." STK__XSTR(STK_VERSION_PATCH)
/* One comparable number for #if checks: 0xMMmmpp, e.g. 0x000100 for 0.1.0. */
#define STK_VERSION_NUMBER                                                                         \
    ((STK_VERSION_MAJOR << 16) | (STK_VERSION_MINOR << 8) | STK_VERSION_PATCH)

/* ---- Return codes (stable numbers) ------------------------------------- */
#define STK_OK      0
#define STK_END     1 /* stk_loader_next: the epoch has ended, no batch returned */
#define STK_TIMEOUT 2 /* stk_loader_next_timeout: no batch within the timeout */

#define STK_EINVAL       (-1)  /* an argument or option is invalid */
#define STK_ENOMEM       (-2)  /* an allocation failed */
#define STK_EIO          (-3)  /* reading a file failed (unreadable, vanished, short) */
#define STK_ENOENT       (-4)  /* a path does not exist */
#define STK_EFORMAT      (-5)  /* data is malformed (corrupt sample, bad dataset) */
#define STK_ETOOBIG      (-6)  /* a sample exceeds its budget or a size limit */
#define STK_EMISUSE      (-7)  /* API misuse: closed/failed handle, forked child */
#define STK_EBUSY        (-8)  /* the consumer holds every ring buffer */
#define STK_EEMPTY       (-9)  /* the dataset (or this rank's share) has no samples */
#define STK_EUNSUPPORTED (-10) /* a feature or format this build lacks */
#define STK_ESAMPLE      (-11) /* a sample failed under the raise policy; see errmsg */
#define STK_ECANCELED    (-12) /* stk_pack: the progress callback asked to stop */
#define STK_EDEVICE      (-13) /* the device (CUDA) failed a copy, kernel or allocation */

/* Every return code above, once: XX(NAME, number, text). stk_errname() and
 * stk_strerror() are generated from this list (src/api.c checks at compile
 * time that each number equals its STK_NAME define), so a code added to the
 * defines and not here fails the build's tests (tests/c/test_api.c). Callers
 * may expand it too, e.g. to build their own table of every code. */
#define STK_CODE_MAP(XX)                                                                           \
    XX(OK, 0, "success")                                                                           \
    XX(END, 1, "end of epoch")                                                                     \
    XX(TIMEOUT, 2, "timed out waiting for a batch")                                                \
    XX(EINVAL, -1, "invalid argument")                                                             \
    XX(ENOMEM, -2, "out of memory")                                                                \
    XX(EIO, -3, "I/O error")                                                                       \
    XX(ENOENT, -4, "no such file or directory")                                                    \
    XX(EFORMAT, -5, "malformed data")                                                              \
    XX(ETOOBIG, -6, "too big for its budget or limit")                                             \
    XX(EMISUSE, -7, "API misuse")                                                                  \
    XX(EBUSY, -8, "all ring buffers are held by the consumer")                                     \
    XX(EEMPTY, -9, "no samples")                                                                   \
    XX(EUNSUPPORTED, -10, "unsupported")                                                           \
    XX(ESAMPLE, -11, "a sample failed")                                                            \
    XX(ECANCELED, -12, "canceled")                                                                 \
    XX(EDEVICE, -13, "device error")

/* Returns a static, never-NULL description of a return code ("unknown error"
 * for a number that is no code). Thread-safe, no allocation. */
STK_API const char *stk_strerror(int code);

/* Returns the name of a return code as the header spells it: "STK_OK",
 * "STK_EIO", "STK_ESAMPLE", ... Static storage; NULL for a number that is no
 * code (so a caller can tell the two apart). Thread-safe, no allocation. */
STK_API const char *stk_errname(int code);

/* Returns the version string of the library that is running (its
 * STK_VERSION_STRING, which may differ from the header a program was compiled
 * with when it loads another libstoker.so). Static storage; thread-safe. */
STK_API const char *stk_version(void);

/* ---- Enumerations ------------------------------------------------------- */

/* What to do when one sample cannot be read or decoded. */
enum stk_on_error {
    STK_ON_ERROR_RAISE = 0, /* stk_loader_next returns STK_ESAMPLE (default) */
    STK_ON_ERROR_SKIP = 1   /* the sample is left out of its batch, counted and
                               listed (stk_loader_error_get) */
};

/* Element type of a dense batch. */
enum stk_dtype {
    STK_DTYPE_UINT8 = 0,
    STK_DTYPE_FLOAT32 = 1,
    STK_DTYPE_FLOAT16 = 2,
    STK_DTYPE_BFLOAT16 = 3,
    /* Added with fields (scalars and .npy arrays, stk_field): */
    STK_DTYPE_INT64 = 4,
    STK_DTYPE_FLOAT64 = 5,
    STK_DTYPE_INT8 = 6,
    STK_DTYPE_INT16 = 7,
    STK_DTYPE_INT32 = 8,
    STK_DTYPE_UINT16 = 9,
    STK_DTYPE_UINT32 = 10,
    STK_DTYPE_UINT64 = 11,
    STK_DTYPE_BOOL = 12
};

/* Bytes of one element of a dtype (0 for a number that is no dtype). */
STK_API size_t stk_dtype_size(int dtype);
/* The dtype's name as NumPy spells it ("uint8", "float32", "bfloat16",
 * "int64", "bool"), or NULL for a number that is no dtype. Static. */
STK_API const char *stk_dtype_name(int dtype);

/* What a sample's field holds (samples with fields, docs/multimodal.md). */
enum stk_field_kind {
    STK_FIELD_AUTO = 0,  /* stk_options_add_field: the source's kind, else the name's */
    STK_FIELD_IMAGE = 1, /* decoded and transformed in C (its own transform) */
    STK_FIELD_TEXT = 2,  /* UTF-8 text (checked) */
    STK_FIELD_JSON = 3,  /* a JSON text (checked for syntax and UTF-8) */
    STK_FIELD_BYTES = 4, /* bytes as stored */
    STK_FIELD_INT = 5,   /* a decimal integer: batched as int64 */
    STK_FIELD_FLOAT = 6, /* a decimal number: batched as float32 */
    STK_FIELD_NPY = 7    /* a NumPy .npy array: its data, with dtype and shape */
};

/* The kind's name as a (field, kind) pair writes it: "image", "text",
 * "json", "bytes", "int", "float", "npy" ("auto" for 0); NULL for no kind. */
STK_API const char *stk_field_kind_name(int kind);
/* The kind a name stands for: one of the names above, else -1. */
STK_API int stk_field_kind_parse(const char *name);
/* The kind a source field's name implies when the source does not say: its
 * last dot-separated part decides (case-insensitive): jpg jpeg png webp ppm
 * image -> IMAGE; txt text caption path -> TEXT; json -> JSON; cls cls2 index
 * label -> INT; npy -> NPY; anything else BYTES. "seg.png" is an image. */
STK_API int stk_field_kind_for_name(const char *name);

/* Where a batch's data lives (stk_options_set(o, "device", ...),
 * docs/gpu.md). */
enum stk_device {
    STK_DEVICE_CPU = 0,  /* host memory (default) */
    STK_DEVICE_CUDA = 1, /* CUDA device memory */
    STK_DEVICE_FAKE = 2  /* the CPU stand-in for a device the tests use: host
                            memory written later by another thread */
};

/* How a batch stores its samples. */
enum stk_batch_kind {
    STK_BATCH_DENSE = 0,   /* one tensor: size x shape, contiguous */
    STK_BATCH_VARIABLE = 1 /* one arena, per-sample offset/length/dims */
};

/* Stages whose items and busy time are counted. The numbers never change;
 * later versions add stages with new numbers, so size nothing by a compile-time
 * count: ask stk_stage_count() (the linked library's) and query each stage with
 * stk_loader_stage_stats(), which answers STK_EINVAL past the last one. */
enum stk_stage {
    STK_STAGE_READ = 0,   /* fetching a sample's bytes from its source */
    STK_STAGE_PROCESS = 1 /* decoding and transforming into the batch slot */
};

/* Returns the number of stages this library counts (stages 0..count-1). */
STK_API int stk_stage_count(void);

/* Returns the stage's name ("read", "process", ...), or "?" for a stage this
 * library does not have. Static; thread-safe. */
STK_API const char *stk_stage_name(int stage);

/* Extensible result structs. stk_info, stk_stats, stk_stage_stats and
 * stk_state start with `size_t struct_size`, which the caller sets to the size of the struct
 * it was compiled with, e.g. `stk_stats st = {.struct_size = sizeof st};`. Later versions
 * only append fields. The library fills the fields that fit in struct_size,
 * zeroes any tail it does not know, and sets struct_size to the number of
 * bytes it filled (the smaller of the two sizes), so a caller built against a
 * newer header can tell which fields an older library left out. A struct_size
 * smaller than the first version of the struct is STK_EINVAL. */

/* ---- Options ------------------------------------------------------------ */

typedef struct stk_options stk_options;

/* Creates an options object with defaults: batch_size 256, threads 0 (= the
 * CPUs this process may use: see stk_options_set_threads), depth 2 (3 ring
 * buffers), seed 0, shuffle on, drop_last off, rank 0 of 1, on_error raise,
 * batch_memory 512 MiB and no max_sample_bytes (variable-size batches),
 * transform none. Returns STK_OK or STK_ENOMEM (*out is NULL then). */
STK_API int stk_options_create(stk_options **out);

/* Destroys an options object; NULL is harmless. Loaders opened from it do not
 * keep a reference. */
STK_API void stk_options_destroy(stk_options *o);

/* The dataset, detected from what is there (docs/shards.md): a directory in
 * ImageFolder layout (class subfolders); a directory of .stk shards (with its
 * manifest) or of WebDataset .tar shards; a single .stk or .tar shard; a brace
 * pattern such as "train-{000000..000099}.tar"; CIFAR-10/100 binary batches (a
 * directory or one batch file); or a file of fixed-size records (then
 * stk_options_set_records is required). A directory mixing kinds is an error
 * at open. The string is copied. Returns STK_OK, STK_EINVAL (NULL or empty),
 * STK_ENOMEM. */
STK_API int stk_options_set_source(stk_options *o, const char *path);

/* Mixing datasets (docs/mixing.md): adds a source to the loader's mixture
 * instead of one source (stk_options_set_source must then not be set). An
 * epoch is samples_per_epoch positions (stk_options_set(o,
 * "samples_per_epoch", N); default: the fixed counts plus the sizes of the
 * weighted sources); source s supplies exactly `samples` of them when
 * samples > 0, else its share by `weight` of what the fixed counts leave
 * (weight 0: in proportion to its size; then every source without
 * samples must have weight 0, checked at open), rounded by largest remainder. A
 * share above the source's size repeats it, each pass a fresh permutation.
 * Which source supplies each position is deterministic and stratified:
 * every window of L consecutive samples of a rank (every batch) holds
 * within 2 of L x its share of each source. The mixture's sample ids are
 * source 0's samples, then source 1's, ... (stk_loader_sample_source maps
 * back); its fields are the union of the sources' plus "source" (int: the
 * source index). Each source may be of any kind stk_options_set_source
 * takes; remote ones are read sample by sample, without the fetch stage's
 * read-ahead, in this version. The path is copied. Returns STK_OK,
 * STK_EINVAL (NULL or empty path, negative or non-finite weight, more than
 * 256 sources), STK_ENOMEM. */
STK_API int stk_options_add_source(stk_options *o, const char *path, double weight,
                                   uint64_t samples);
/* Source `source`'s own transform (a spec, docs/transforms.md) of an image
 * field: samples of that source go through it instead of the loader's
 * transform of that field. field NULL or "" is the first image field (the
 * batch's data); a name is one of the loader's image fields (resolved at
 * open: the first image field's name means the same as NULL; a name that
 * is no image field of the loader fails the open, naming it). A field the
 * source names no transform for takes the loader's transform of that
 * field. That field must have a transform in the loader too, and the
 * source's must give batches of the same kind: the same output shape and
 * dtype when the loader's is dense (checked at open). "" or "none" removes
 * it. The spec is copied and checked at open. Returns STK_OK, STK_EINVAL
 * (no such source, NULL transform), STK_ENOMEM. */
STK_API int stk_options_source_transform(stk_options *o, size_t source, const char *field,
                                         const char *transform);
/* Source `source`'s own value of an option that is meaningful per source
 * (docs/mixing.md), as stk_options_set takes it: "order" (global, shards or
 * blocks: that source's samples in its own shard-aware order, whatever the
 * loader's), "shard_window", "block_bytes", "cache" ("0": a remote .stk source's
 * shards stay out of the loader's disk cache, read by range; a remote
 * whole-file source (tar, MDS, ...) with "0" fails the open; a local one
 * never uses the cache), and "transform" (as
 * stk_options_source_transform with field NULL). A source without its own
 * takes the loader's. Every other option is the loader's (one ring, one
 * fetch stage, one disk cache for all the sources): STK_EUNSUPPORTED, with
 * stk_options_errmsg naming the source and the key. STK_OK; STK_EINVAL (no
 * such source, an unknown key, a bad value: the reason on
 * stk_options_errmsg); STK_ENOMEM. */
STK_API int stk_options_source_set(stk_options *o, size_t source, const char *key,
                                   const char *value);

/* Declares the source file as fixed-size records: each record is
 * record_bytes long, the file starts with header_bytes to skip, and the first
 * label_bytes (0, 1, 2, 4 or 8; little-endian unsigned) of each record are its
 * label and are not part of the sample (label -1 when 0). A trailing partial
 * record is an error at open. Returns STK_OK or STK_EINVAL. */
STK_API int stk_options_set_records(stk_options *o, size_t record_bytes, size_t header_bytes,
                                    unsigned label_bytes);

/* The ranges of the typed setters that have no key in the option table
 * (stk_option_by_name("depth") gives depth's). */
#define STK_BATCH_SIZE_MAX (1u << 24)
#define STK_THREADS_MAX    256u
/* The typed setters below (batch size, threads, depth, partition,
 * max_sample_bytes, source) return STK_EINVAL for a value out of range, with
 * the setting, its range and the value given on stk_options_errmsg(o), as
 * stk_options_set does for a key. */
STK_API int stk_options_set_batch_size(stk_options *o, size_t n); /* 1..2^24 */
/* Worker threads, 0..256. 0 (default) starts one per CPU this process may
 * use: the CPUs of its affinity mask (taskset, cpusets), capped by a cgroup
 * v2/v1 CPU quota (rounded up), divided by the LOCAL_WORLD_SIZE environment
 * variable when set (ranks sharing the node; at least 1 thread). A malformed
 * LOCAL_WORLD_SIZE then fails stk_loader_open with STK_EINVAL. */
STK_API int stk_options_set_threads(stk_options *o, unsigned n);
/* stk_options_set(o, "autotune", "1"): the threads started above are a cap;
 * the loader keeps the smallest number of them working that keeps the
 * consumer from waiting, adjusting online (docs/diagnosis.md). Batches are
 * the same, bit for bit, as with any fixed thread count. */
/* depth: batches prepared ahead of the one the consumer holds, 1..63 (default
 * 2). The ring has depth + 1 batch buffers: the consumer may hold one batch
 * while `depth` more are filled; holding more than one at a time leaves fewer
 * prepared ahead, and holding all depth + 1 makes stk_loader_next return
 * STK_EBUSY. Memory grows with depth + 1 (docs/memory.md). */
STK_API int stk_options_set_depth(stk_options *o, unsigned n);
STK_API int stk_options_set_seed(stk_options *o, uint64_t seed);
STK_API int stk_options_set_shuffle(stk_options *o, int on);
/* drop_last on: each rank gets floor(N / world) samples and a final partial
 * batch is dropped. Off: each rank gets ceil(N / world) samples, padding by
 * wrapping around to the start of the epoch's order, and the final batch may
 * be partial. Either way every rank has the same number of batches. */
STK_API int stk_options_set_drop_last(stk_options *o, int on);
/* rank < world_size, world_size >= 1. */
STK_API int stk_options_set_partition(stk_options *o, unsigned rank, unsigned world_size);
STK_API int stk_options_set_on_error(stk_options *o, int policy); /* enum stk_on_error */
/* Receives the library's warnings: conditions an open goes on after, which
 * no return code would show (today: a remote dataset's consolidated index
 * that is missing, damaged or does not fit, so each shard is opened
 * instead; a bucket listing kept in cache_dir that is damaged, so the
 * objects are listed again; a shuffle of a Parquet dataset whose pages
 * hold many rows and whose read columns exceed its page cache, so most
 * samples would decode a whole page: the order to use instead). msg is one line without a prefix or
 * a newline, borrowed for the call only. */
typedef void (*stk_warning_fn)(void *user, const char *msg);
/* Where the warnings of opens from o go: fn(user, msg). The default (and fn
 * NULL) writes the line "stoker: warning: MSG" on stderr; to drop them, give
 * a function that does nothing. fn is called in the thread that made the
 * call that meets the condition, while that call runs (today only during
 * stk_loader_open, stk_dataset_open and stk_dataset_verify): user must stay
 * valid until it returns, and fn must not call into the library on the
 * handle being opened. Loaders and datasets keep neither after their open.
 * STK_OK; STK_EINVAL for NULL o. */
STK_API int stk_options_set_warning(stk_options *o, stk_warning_fn fn, void *user);
/* Variable-size batches (raw bytes, images decoded at their own size) keep
 * their samples in one arena per batch, taking exactly the bytes each sample
 * needs, up to stk_options_set(o, "batch_memory", N) for the whole batch
 * (default 512M; 4K..1T; K/M/G suffixes): the memory bound counts it once per
 * ring buffer, and an arena gives memory back when a batch needs much less
 * than the one before (docs/memory.md). A sample that does not fit fails
 * with STK_ETOOBIG naming the numbers, never truncated: one larger than
 * batch_memory always; one that finds its batch's arena full (the batch's
 * samples together need more than batch_memory: raise it or lower the batch
 * size) otherwise. max_sample_bytes (n >= 1) also caps each sample: a larger
 * one fails with STK_ETOOBIG. */
STK_API int stk_options_set_max_sample_bytes(stk_options *o, size_t n);
/* The per-sample transform: "none" (default: raw bytes), or an image pipeline
 * spec (see docs/transforms.md), e.g. "imagenet-train". Copied. STK_EINVAL on
 * NULL; the spec itself is checked at stk_loader_open. */
STK_API int stk_options_set_transform(stk_options *o, const char *spec);
/* Samples with fields (docs/multimodal.md): adds an output field to the
 * samples the loader delivers. With none added, a sample is one payload and
 * a label, as always.
 *   name       the output name (unique among the fields), e.g. "caption"
 *   sources    the source's field names to take it from, ';'-separated
 *              alternatives, the first a sample has wins: "jpg;png;webp"
 *              (a tar member's extension after the key, a .stk field, a
 *              column); NULL: name itself
 *   kind       enum stk_field_kind; AUTO: the kind the source gives the
 *              field, else stk_field_kind_for_name of the source field
 *   transform  image fields: the pipeline spec (as stk_options_set_transform);
 *              NULL: the loader's transform. Other kinds: must be NULL.
 *              The first image field draws exactly what the loader without
 *              fields draws; further ones draw keyed by (seed, epoch, sample,
 *              field)
 *   flags      STK_FIELD_OPTIONAL: a sample without it gets present[k] = 0
 *              instead of failing ("has no field 'txt' (has: jpg, json)")
 * Copied. STK_OK; STK_EINVAL (NULL or empty name, a duplicate name, a kind
 * that is none, a transform on a field that is no image, more than 32
 * fields) with the reason on stk_options_errmsg; STK_ENOMEM. A source field
 * that no sample has is refused at stk_loader_open. */
#define STK_FIELD_OPTIONAL 1u
STK_API int stk_options_add_field(stk_options *o, const char *name, const char *sources, int kind,
                                  const char *transform, unsigned flags);
/* Adds fields from one text, as the command line's --fields takes it:
 * comma-separated NAME[?][=SOURCES][:KIND], e.g.
 * "image=jpg;png,caption=txt,meta=json,label=cls:int,extra?=npy" ('?':
 * optional). Images take the loader's transform. STK_OK, or as
 * stk_options_add_field (nothing added on a failure). */
STK_API int stk_options_set_fields(stk_options *o, const char *spec);

/* Parses a byte size as every size option takes it (stk_options_set, the
 * `stoker` tool, Python): a whole number of bytes ("1048576"), or a number,
 * possibly with a fraction, followed by a unit: K, M, G, T or KiB, MiB, GiB,
 * TiB are binary (2^10, 2^20, 2^30, 2^40), KB, MB, GB, TB decimal (10^3,
 * 10^6, 10^9, 10^12), B bytes; units in any case, a space before the unit
 * allowed ("16M", "16MiB", "16MB", "1.5G", "500 GiB"). A fraction of a byte
 * is dropped. Thread-safe, no allocation. STK_OK; STK_EINVAL for anything
 * else (NULL, empty, negative, other units); STK_ETOOBIG for a size above
 * 2^64 - 1. */
STK_API int stk_parse_size(const char *text, uint64_t *out);
/* Sets the option key (an stk_option_info name) from its text value: a
 * bool is "0" or "1"; a number (int, uint) is written as stk_parse_size
 * reads it; a size is a byte count in stk_parse_size's syntax ("16M",
 * "16MiB", "1.5G"); an enum is one of its words; a string is copied. The
 * value must lie in the option's range [min, max]. Every key, its type,
 * range, default and meaning: stk_option_next / stk_option_by_name and the
 * generated table in docs/options.md. Copied; o keeps no pointer to key or
 * value. STK_OK; STK_EINVAL for NULL, an unknown key or a bad value, with
 * the reason on stk_options_errmsg(o); STK_ENOMEM. */
STK_API int stk_options_set(stk_options *o, const char *key, const char *value);
/* Reads option key (an stk_option_info name) back as text that
 * stk_options_set takes: a bool "0"/"1", a number or size in decimal bytes,
 * an enum its word ("nchw", "auto" for depth auto, "cuda:1"), a string as
 * set, "fields" as stk_options_set_fields reads it (per-field transforms
 * left out). "" means not set: the default applies, decided by the loader
 * where it depends on other things ("size": the preset's; "fetch_buffer",
 * "cache_limit", ...), and stk_options_reset gets back there. Writes into buf (n bytes, always
 * terminated). STK_OK; STK_EINVAL (NULL o or buf, n 0, an unknown key); STK_ETOOBIG when the text
 * does not fit (buf holds as much as fits). Does not touch o (nor its message): any thread, as long
 * as none sets o meanwhile. */
STK_API int stk_options_get(const stk_options *o, const char *key, char *buf, size_t n);
/* Sets option key back to its default (stk_option_info.def), as a fresh
 * stk_options_create holds it: "size" back to the preset's, "fields" to none,
 * "trace" off. STK_OK; STK_EINVAL for NULL or an unknown key (the reason on
 * stk_options_errmsg); STK_ENOMEM. */
STK_API int stk_options_reset(stk_options *o, const char *key);
/* Why the last stk_options_set on o failed, naming the key, the value and
 * what the key takes ("fetch_timeout takes seconds, 1..3600, got '0'"; an
 * unknown key: "unknown option 'x'"); "" after a call that succeeded. The
 * text starts with the key as given. Owned by o, valid until the next call
 * on o; "" for NULL. */
STK_API const char *stk_options_errmsg(const stk_options *o);

/* ---- The option table --------------------------------------------------- */

/* What an option's value is (stk_option_info.type). */
typedef enum stk_option_type {
    STK_OPTION_BOOL = 0,   /* "0" or "1" */
    STK_OPTION_INT = 1,    /* a signed count (none today; kept for the table's readers) */
    STK_OPTION_UINT = 2,   /* a count in [min, max] */
    STK_OPTION_SIZE = 3,   /* bytes in [min, max], with stk_parse_size's units */
    STK_OPTION_STRING = 4, /* text (a path, a URL) */
    STK_OPTION_ENUM = 5    /* one of the '|'-separated words in values */
} stk_option_type;

/* Which part of the engine an option belongs to (stk_option_info.flags). */
enum {
    STK_OPTION_ENGINE = 1u << 0, /* order, depth, threads, memory */
    STK_OPTION_IMAGE = 1u << 1,  /* decode and the image pipeline */
    STK_OPTION_REMOTE = 1u << 2, /* remote datasets: fetch and disk cache */
    STK_OPTION_DEVICE = 1u << 3, /* where batches are delivered */
    STK_OPTION_TRACE = 1u << 4   /* diagnosis */
};

/* One stk_options_set key. All strings are static. */
typedef struct stk_option_info {
    const char *name;   /* the key, e.g. "fetch_timeout" */
    int type;           /* enum stk_option_type */
    uint64_t min, max;  /* range of a number or size; of N in an enum's "word:N" */
    const char *values; /* enum: the accepted words separated by '|' ("nchw|nhwc");
                           other types: words accepted besides a number ("auto"), or NULL */
    const char *unit;   /* what a number counts ("seconds", "requests"), or NULL */
    const char *def;    /* the default, as text ("64M", "auto: ...") */
    const char *doc;    /* one line: what it does */
    unsigned flags;     /* STK_OPTION_ENGINE ... STK_OPTION_TRACE */
} stk_option_info;

/* Iterates over every option: stk_option_next(NULL) is the first,
 * stk_option_next(prev) the one after prev (prev must come from this table),
 * NULL after the last. Static data: thread-safe, no allocation. */
STK_API const stk_option_info *stk_option_next(const stk_option_info *prev);
/* The option named name, or NULL for none (or NULL). Thread-safe. */
STK_API const stk_option_info *stk_option_by_name(const char *name);

/* Transform presets (docs/transforms.md). stk_transform_preset_next(NULL) is
 * the first preset's name, stk_transform_preset_next(prev) the next one
 * (prev a name this function returned), NULL after the last. */
STK_API const char *stk_transform_preset_next(const char *prev);
/* 1 when name is a preset whose output size the "size" option sets, else 0
 * (also for NULL). Thread-safe. */
STK_API int stk_transform_preset_sized(const char *name);

/* ---- Loader ------------------------------------------------------------- */

typedef struct stk_loader stk_loader;

/* A batch handed to the consumer. All fields are read-only and valid until
 * stk_batch_release(); the memory belongs to the loader's ring. A released
 * batch's buffer is reused, so do not touch any pointer after release. Batch
 * memory stays valid after stk_loader_close() until released. */
typedef struct stk_batch {
    uint64_t epoch;
    uint64_t index;          /* batch index within the epoch, from 0 */
    size_t size;             /* samples in this batch (<= batch_size) */
    int kind;                /* enum stk_batch_kind */
    int dtype;               /* enum stk_dtype (dense); UINT8 for variable */
    unsigned ndim;           /* dense: rank of one sample's shape */
    int64_t shape[4];        /* dense: shape of one sample */
    size_t sample_bytes;     /* dense: bytes of one sample */
    void *data;              /* dense: size*sample_bytes bytes; variable: arena */
    const uint64_t *offsets; /* variable: offset of sample k into data */
    const uint64_t *lengths; /* variable: byte length of sample k */
    const int32_t *dims;     /* variable: 3 per sample (h, w, c) or zeros */
    const int64_t *labels;   /* size entries; -1 where the source has none */
    const uint64_t *indices; /* dataset index of each sample */
    /* Added after the first version (the library owns the struct, so
     * callers built against the older header are unaffected): */
    int device;    /* enum stk_device of `data`; labels, indices, offsets,
                      lengths and dims are host memory always */
    int device_id; /* which device, for CUDA and FAKE */
    /* Samples with fields (stk_options_add_field): one column per requested
     * field, in the order they were added; 0 and NULL without fields. The
     * first image field is also the batch's data above (data, kind, dtype,
     * shape, offsets, lengths, dims, device), so code that reads one image
     * per sample keeps working. */
    size_t nfields;
    const struct stk_field *fields;
} stk_batch;

#define STK_FIELD_MAXDIM 7 /* dims of a variable field's sample (.npy arrays) */

/* One field of a batch: `size` samples of it (the batch's size, after
 * skipped samples were left out), in the batch's sample order. Owned by the
 * batch, valid until it is released; every pointer is host memory except
 * `data` of a dense field of a device batch (then `device` says so: the
 * first image field, converted as the batch's data, further images of one
 * size, INT and FLOAT; docs/gpu.md). With a device, an NPY field whose
 * samples in this batch all have one dtype and shape (up to 4 dims, not
 * UINT16/32/64) is delivered dense in device memory for that batch; other
 * batches of it may be variable, in host memory.
 *
 * Dense (layout STK_BATCH_DENSE): data holds size x shape of dtype, sample k
 * at k * sample_bytes: images of one output size, INT (int64, shape ()),
 * FLOAT (float32, shape ()).
 * Variable (STK_BATCH_VARIABLE): sample k is lengths[k] bytes at
 * data + offsets[k]; for IMAGE and NPY, shapes[k * (STK_FIELD_MAXDIM + 1)]
 * is its number of dims and the next ones the dims (an image: h, w, c; a
 * .npy: its shape, C order), and for NPY dtypes[k] its element type. TEXT
 * and JSON are UTF-8 without a terminator; BYTES as stored; an image
 * without a transform is its encoded bytes (shapes all 0). */
typedef struct stk_field {
    const char *name;    /* the output name given to stk_options_add_field */
    const char *source;  /* the source field that supplied it (the first
                            alternative when samples differ) */
    int kind;            /* enum stk_field_kind, never AUTO */
    int layout;          /* STK_BATCH_DENSE or STK_BATCH_VARIABLE */
    int dtype;           /* dense: element type; variable: UINT8 */
    unsigned ndim;       /* dense: rank of one sample's shape */
    int64_t shape[4];    /* dense: one sample's shape */
    size_t sample_bytes; /* dense: bytes of one sample */
    void *data;
    const uint64_t *offsets; /* variable: NULL for dense */
    const uint64_t *lengths; /* variable: NULL for dense */
    const int64_t *shapes;   /* variable IMAGE and NPY; else NULL */
    const int32_t *dtypes;   /* variable NPY: element type per sample; else NULL */
    const uint8_t *present;  /* optional fields: 1 where the sample has it, 0
                                where not (then its bytes are empty, a dense
                                value zero); NULL when every sample has it */
    int device, device_id;   /* where `data` is (enum stk_device) */
} stk_field;

/* Static facts about an open loader (extensible: set struct_size). */
typedef struct stk_info {
    size_t struct_size;         /* in: sizeof(stk_info); out: bytes filled */
    uint64_t num_samples;       /* samples in the whole dataset */
    uint64_t samples_per_epoch; /* samples this rank delivers per epoch */
    uint64_t batches_per_epoch; /* batches this rank delivers per epoch */
    uint64_t num_classes;       /* ImageFolder classes; 0 when no classes */
    unsigned threads;           /* worker threads actually started */
    unsigned depth;             /* batches prepared ahead (stk_options_set_depth) */
    size_t batch_size;
    int kind;                /* enum stk_batch_kind of the batches */
    const char *source_kind; /* "folder", "records", "stk", "tar", "cifar" (static) */
    unsigned ring_buffers;   /* depth + 1 */
} stk_info;

/* One world an epoch ran under before the current one (elastic resume,
 * docs/engine.md): its size, ranks per node, batch size, and the batches each
 * of its ranks delivered. */
typedef struct stk_state_generation {
    uint32_t world_size;
    uint32_t local_world_size;
    uint64_t batch_size;
    uint64_t batches;
} stk_state_generation;

#define STK_STATE_HISTORY 16 /* worlds an epoch may change through */

/* Loader position, and the fingerprint of the configuration it is a position
 * in: resume by restoring it (extensible: set struct_size). */
typedef struct stk_state {
    size_t struct_size; /* in: sizeof(stk_state); out: bytes filled */
    uint64_t seed;
    uint64_t epoch;
    uint64_t batch; /* batches of this epoch already delivered */
    /* Fingerprint: a position only means the same batches when these match. */
    uint64_t num_samples; /* samples in the dataset */
    uint64_t batch_size;
    uint32_t world_size;
    uint32_t rank;
    uint32_t shuffle;   /* 0 or 1 */
    uint32_t drop_last; /* 0 or 1 */
    uint64_t transform; /* 64-bit FNV-1a hash of the transform spec and the
                           image options (size, layout, dtype, exif, strict);
                           stable across builds and platforms */
    /* Added after the first version: elastic resume (docs/engine.md). `batch`
     * counts the batches of the current world (world_size,
     * local_world_size, batch_size); history lists the worlds this epoch ran
     * under before it, oldest first. */
    uint32_t local_world_size; /* ranks per node (stk_options_set
                                  "local_world_size"); world_size: one node */
    uint32_t history_len;
    stk_state_generation history[STK_STATE_HISTORY];
    /* Added with mixtures (docs/mixing.md): 64-bit FNV-1a of what decides
     * the mixture's schedule (each source's weight or samples, size, quota,
     * own transforms and order, samples_per_epoch, batching; not its path,
     * so a moved dataset resumes); 0 without a mixture. */
    uint64_t mixture;
} stk_state;

/* One stage's counters (extensible: set struct_size). */
typedef struct stk_stage_stats {
    size_t struct_size; /* in: sizeof(stk_stage_stats); out: bytes filled */
    uint64_t items;     /* samples that went through the stage */
    uint64_t busy_ns;   /* time spent in it */
} stk_stage_stats;

/* Loader-wide counters (extensible: set struct_size). Per-stage counters are
 * read with stk_loader_stage_stats(). */
typedef struct stk_stats {
    size_t struct_size; /* in: sizeof(stk_stats); out: bytes filled */
    uint64_t samples_delivered;
    uint64_t batches_delivered;
    uint64_t consumer_wait_ns; /* time next() waited for a batch: starvation */
    uint64_t samples_skipped;  /* under STK_ON_ERROR_SKIP */
    uint64_t samples_failed;   /* under STK_ON_ERROR_RAISE */
    uint64_t memory_bound_bytes;
    /* Added after the first version: */
    unsigned threads_active;      /* workers taking work now (< threads under autotune) */
    unsigned threads_max;         /* workers started */
    uint64_t device_memory_bytes; /* the part of memory_bound_bytes that is
                                     device memory (docs/gpu.md); 0 on the CPU */
} stk_stats;

/* One failed or skipped sample. Strings are owned by the loader and valid
 * until the error list restarts (see stk_loader_error_count) or the loader
 * is closed. */
typedef struct stk_sample_error {
    uint64_t sample; /* dataset index */
    uint64_t epoch;
    int code;         /* STK_E* */
    const char *path; /* file path or key */
    const char *reason;
} stk_sample_error;

/* Opens a loader: scans the source, allocates every buffer, starts the
 * threads, and begins producing epoch 0. Blocks while scanning.
 * On success *out is a running loader. On failure (any negative code) *out is
 * a failed loader that only answers stk_loader_errmsg() and must be closed,
 * except on STK_ENOMEM before the handle exists, when *out is NULL.
 * Errors: STK_EINVAL, STK_ENOENT, STK_EIO, STK_EFORMAT, STK_EEMPTY,
 * STK_ETOOBIG, STK_EUNSUPPORTED, STK_ENOMEM. */
STK_API int stk_loader_open(stk_loader **out, const stk_options *o);

/* Waits for the next batch in order and hands it out.
 * STK_OK: *out is a held batch; give it back with stk_batch_release().
 * STK_END: the epoch is over (no batch); the next call starts the next epoch.
 * STK_ESAMPLE: a sample of the next batch failed under the raise policy; the
 *   message names it. The following call delivers that batch without the
 *   failed samples, so nothing else is lost.
 * STK_EBUSY: every ring buffer is held by the consumer and none is ready.
 * STK_EMISUSE: closed/failed handle, or called from a forked child.
 * Blocks; releases no locks the caller holds. */
STK_API int stk_loader_next(stk_loader *l, stk_batch **out);

/* As stk_loader_next, but waits at most timeout_ms milliseconds and then
 * returns STK_TIMEOUT (no batch, nothing lost; call again). Lets a caller such
 * as the Python module check for signals while it waits. */
STK_API int stk_loader_next_timeout(stk_loader *l, stk_batch **out, unsigned timeout_ms);

/* Gives a batch back to the ring. Any thread, while the batch is held.
 * A device batch (b->device is not STK_DEVICE_CPU) released this way may be
 * overwritten as soon as work already queued on the legacy default stream
 * has run: use stk_batch_release_stream when it was used on another stream.
 * STK_OK; STK_OK for NULL (harmless); STK_EMISUSE, touching nothing, for a
 * batch this process does not hold: released already (a second release,
 * also one after stk_loader_close() freed the ring with the last batch), or
 * inherited from the parent by a forked child. The library checks `b`
 * against the batches it handed out without reading *b; a pointer whose
 * address a later stk_loader_next has handed out again is that new batch. */
STK_API int stk_batch_release(stk_batch *b);

/* Device batches (docs/gpu.md). A device batch is handed out by
 * stk_loader_next as soon as its copy (and conversion) is queued on the
 * loader's copy stream, so the consumer must order its work after it:
 *
 * stk_batch_wait: makes `stream` (a CUstream / cudaStream_t; NULL is the
 *   legacy default stream) wait on the device until the batch's data is
 *   ready, without blocking the calling thread. For the FAKE device, whose
 *   consumer is the host, NULL waits on the host as stk_batch_sync does.
 * stk_batch_sync: blocks the calling thread until the data is ready.
 * stk_batch_record_stream: adds `stream` to the streams the release waits
 *   for, like torch's Tensor.record_stream: at release an event is recorded
 *   on each stream added this way as well as on the release's own stream,
 *   and the device memory is reused only after the work queued on all of
 *   them up to the release has run. For a consumer that uses the batch on
 *   several streams; each must stay valid until the release. Up to
 *   STK_BATCH_MAX_STREAMS streams a batch (one given twice counts once):
 *   STK_EINVAL beyond. For the FAKE device NULL (the host) adds nothing.
 *   Not concurrently with the batch's release.
 * stk_batch_release_stream: releases the batch; its device memory is reused
 *   only after the work queued on `stream` (and on the streams added with
 *   stk_batch_record_stream) up to this call has run. Returns as
 *   stk_batch_release.
 *
 * All are no-ops returning STK_OK for host batches held. wait and sync
 * return STK_EDEVICE (with the loader's message naming the batch, once the
 * loader notices) when the batch's copy or conversion failed; wait, sync
 * and record_stream STK_EINVAL for NULL, and all STK_EMISUSE for a batch not
 * held (as stk_batch_release), and record_stream STK_EDEVICE when the device
 * cannot create the event. Any thread, while the batch is held. */
#define STK_BATCH_MAX_STREAMS 8
STK_API int stk_batch_wait(stk_batch *b, void *stream);
STK_API int stk_batch_sync(stk_batch *b);
STK_API int stk_batch_record_stream(stk_batch *b, void *stream);
STK_API int stk_batch_release_stream(stk_batch *b, void *stream);

/* Starts epoch e at its first batch (discarding prefetched work if the loader
 * was elsewhere). Held batches stay valid. Blocks briefly.
 * STK_OK, STK_EMISUSE. */
STK_API int stk_loader_set_epoch(stk_loader *l, uint64_t epoch);

/* Reads the position (batches already delivered in the current epoch) and the
 * loader's fingerprint into *st (set st->struct_size first).
 * STK_OK; STK_EINVAL for NULL or a struct_size below the first version's;
 * STK_EMISUSE. */
STK_API int stk_loader_get_state(stk_loader *l, stk_state *st);

/* Restores a position read by stk_loader_get_state, possibly from another
 * process. The seed, num_samples, shuffle, drop_last and transform must match
 * this loader's, so a resumed run cannot silently deliver other batches: a
 * mismatch is STK_EINVAL with a message naming the field and both values.
 * world_size, local_world_size and batch_size may differ (elastic resume):
 * the rest of the epoch is then laid out over this loader's world, and every
 * sample the saved world had not delivered is delivered exactly once across
 * the new ranks (docs/engine.md); rank is not checked, since in lockstep
 * training every rank's state is the same (save it from rank 0 alone). At
 * most STK_STATE_HISTORY changes of world in one epoch. Fields appended in
 * later versions are read only when st->struct_size covers them. A mixture's
 * fingerprint (weights, sizes, samples_per_epoch: stk_state.mixture; a
 * fingerprint of the first version, with the paths, is taken too) must
 * match too, unless
 * the option mix_resume is "new": then the position (epoch, batch) is kept
 * and the new mixture applies from it (docs/mixing.md).
 * STK_OK, STK_EINVAL, STK_EMISUSE. */
STK_API int stk_loader_set_state(stk_loader *l, const stk_state *st);

/* Fill *info / *st (set struct_size first; see "Extensible result structs").
 * STK_OK; STK_EINVAL for NULL or a struct_size below the first version's;
 * STK_EMISUSE for a closed or failed handle. Consumer functions (see top). */
STK_API int stk_loader_info(stk_loader *l, stk_info *info);
/* Class c's name as the dataset stores it (c < num_classes): a folder's
 * subfolder, the name a .stk manifest gives (stk_dataset_class_name for a
 * dataset without a loader). NULL when the dataset names none (records, tar,
 * CIFAR, a class an older manifest leaves unnamed), c past the classes, or a
 * closed or failed handle. Owned by the loader, valid until close. A consumer
 * function (see the top); no allocation, does not block. */
STK_API const char *stk_loader_class_name(stk_loader *l, uint64_t c);
STK_API int stk_loader_stats(stk_loader *l, stk_stats *st);

/* One stage's counters summed over the worker threads. STK_EINVAL if stage is
 * not in 0..stk_stage_count()-1, out is NULL or out->struct_size is too small;
 * STK_EMISUSE for a closed or failed handle. */
STK_API int stk_loader_stage_stats(stk_loader *l, int stage, stk_stage_stats *out);

/* Mixtures (docs/mixing.md): the number of sources (0 without a mixture). */
STK_API size_t stk_loader_num_sources(stk_loader *l);
/* Source `source`'s counters: samples delivered from it and samples that
 * failed (skipped or raised) since open. STK_OK; STK_EINVAL (source past the
 * last, NULL pointers); STK_EMISUSE. A consumer function. */
STK_API int stk_loader_source_stats(stk_loader *l, size_t source, uint64_t *samples,
                                    uint64_t *failed);
/* Which source a batch's sample id (stk_batch indices) comes from, and its
 * index within that source. STK_OK; STK_EINVAL (index past the samples, or
 * no mixture); STK_EMISUSE. Any thread; does not block. */
STK_API int stk_loader_sample_source(stk_loader *l, uint64_t index, size_t *source,
                                     uint64_t *local);

/* One worker thread's counters of one stage. STK_EINVAL if thread >=
 * info.threads or as stk_loader_stage_stats. */
STK_API int stk_loader_thread_stats(stk_loader *l, unsigned thread, int stage,
                                    stk_stage_stats *out);

/* Counters of the fetch stage, which reads remote datasets (http://,
 * https://, s3://) ahead of the workers (docs/remote.md). Size-prefixed like
 * stk_stats: set struct_size to sizeof(stk_fetch_stats) before the call; the
 * library fills the fields that fit and sets struct_size to what it filled. */
typedef struct stk_fetch_stats {
    size_t struct_size;
    uint64_t requests;        /* HTTP requests made (attempts, retries included) */
    uint64_t retries;         /* attempts repeated after a retryable failure */
    uint64_t failures;        /* requests that failed for good */
    uint64_t bytes;           /* body bytes received */
    uint64_t inflight;        /* requests in flight now */
    uint64_t inflight_peak;   /* most requests in flight at once */
    uint64_t samples;         /* samples handed to the workers */
    uint64_t sample_bytes;    /* their bytes */
    uint64_t overfetch_bytes; /* gap bytes fetched to merge neighbouring samples */
    uint64_t waits;           /* reads that waited for the network */
    uint64_t wait_ns;         /* time workers waited for the network */
    uint64_t buffered_bytes;  /* bytes buffered + in flight now */
    uint64_t buffered_peak;   /* peak of that */
    uint64_t cache_hits;      /* shards found in the disk cache */
    uint64_t cache_misses;    /* shards downloaded into it */
    uint64_t cache_evictions; /* entries this process evicted */
    uint64_t cache_fallbacks; /* shards read by ranges because the cache was full */
    uint64_t io_busy_ns;      /* time the I/O thread spent in libcurl */
    /* Added after the first version: */
    uint64_t completed;          /* attempts that ended (success or not) */
    uint64_t request_ns;         /* their summed duration, connection to last byte */
    uint64_t first_byte_ns;      /* their summed time to the first byte */
    uint64_t cache_write_errors; /* shards the cache's disk refused (full, I/O error): read by
                                    ranges instead */
    uint64_t cache_dropped;      /* cached shards removed because they failed a checksum */
    uint64_t throttled;          /* answers 503/429 (S3 SlowDown): each halves the rate budget */
    uint64_t rate_limit;         /* the request rate budget now (requests a second; 0: none), raised
                                    again while the store stops throttling (docs/remote.md) */
    uint64_t hedges;             /* requests sent again because they ran past fetch_hedge x the
                                    recent p95 latency (counted in requests too) */
    uint64_t hedge_wins;         /* hedges that answered before the request they raced */
    /* Cold cache (docs/remote.md "Cold cache"): samples read from a shard's
     * file while its download into the cache was still running, and samples
     * fetched by range because their shard's download would reach them too
     * late. */
    uint64_t cache_partial_reads;
    uint64_t cache_cold_ranged;
    /* Ranged requests that downloaded parts of shards into the cache (a
     * shard downloads in parts of 8 MiB, a few at a time; counted in
     * requests too). */
    uint64_t cache_download_parts;
} stk_fetch_stats;

/* Fills *st (st->struct_size set by the caller). STK_EUNSUPPORTED when the
 * dataset is local (no fetch stage); STK_EINVAL for a NULL st or a
 * struct_size smaller than the first version of the struct. Same threads as stk_loader_stats. */
STK_API int stk_loader_fetch_stats(stk_loader *l, stk_fetch_stats *st);

/* Peak bytes of every buffer the loader allocates while running (ring, sample
 * metadata, per-thread scratch, index), known before the first batch. The
 * process's peak RSS stays under its baseline + this + a fixed overhead (see
 * docs/memory.md). Returns 0 for a failed handle. */
STK_API uint64_t stk_loader_memory_bound(stk_loader *l);

/* The failed or skipped samples of the current epoch: the epoch of the last
 * batch delivered or reported (still the one just ended after STK_END), in
 * sample order (their order in the epoch), the first 1024 of the epoch kept.
 * The list restarts when a batch of another epoch is delivered or reported,
 * and on stk_loader_set_epoch/set_state. Counts in stk_stats are complete
 * and for the loader's life. error_get: STK_OK, STK_EINVAL (i >= count or e
 * NULL), STK_EMISUSE. */
STK_API size_t stk_loader_error_count(stk_loader *l);
STK_API int stk_loader_error_get(stk_loader *l, size_t i, stk_sample_error *e);

/* The last error's detailed message; never NULL ("" when none). Valid until
 * the next call on the loader. */
STK_API const char *stk_loader_errmsg(stk_loader *l);

/* What the last stk_loader_next or stk_loader_next_timeout call returned, in
 * structure. After STK_ESAMPLE (the raise policy) has_sample is 1 and sample,
 * epoch, sample_code, path, reason and nfailed name the failed sample that the
 * message names (the lowest slot of the batch), so callers need not parse the
 * message. Strings are owned by the loader, never NULL, and valid until the
 * next stk_loader_next/stk_loader_next_timeout call or stk_loader_close. */
typedef struct stk_error_info {
    size_t struct_size; /* in: sizeof(stk_error_info); out: bytes filled */
    int code;           /* the call's return code (STK_ESAMPLE for a failed sample);
                           for a failed handle, the stk_loader_open error */
    int has_sample;     /* 1: the fields below describe a failed sample */
    int sample_code;    /* the sample's own STK_E* code (STK_EIO, STK_EFORMAT, ...) */
    uint64_t sample;    /* dataset index */
    uint64_t epoch;
    uint64_t nfailed;    /* failed samples in that batch (>= 1) */
    const char *path;    /* the sample's file path or key ("" without a sample) */
    const char *reason;  /* why it failed ("" without a sample) */
    const char *field;   /* the output field that failed (stk_options_add_field);
                            "" without fields or when the sample failed as a whole */
    const char *message; /* the text stk_loader_errmsg() returns */
} stk_error_info;

/* Fills *info (info->struct_size set by the caller; see the note on
 * struct_size above) with the last stk_loader_next/_timeout result; before
 * any, code is STK_OK and has_sample 0. A failed handle answers too (code is
 * its open error). A consumer function (see the top): call it from the thread
 * that called next, before the next call. No allocation, does not block.
 * Returns STK_OK; STK_EINVAL for a NULL info or a struct_size below the first
 * version's; STK_EMISUSE for NULL, a closed handle or a forked child. */
STK_API int stk_loader_last_error(stk_loader *l, stk_error_info *info);

/* Stops the threads (promptly, from any state) and frees the loader. Batches
 * still held stay valid until released; the last release frees them. NULL is
 * harmless. */
STK_API void stk_loader_close(stk_loader *l);

/* ---- Packing ------------------------------------------------------------ */

/* Progress of stk_pack, passed to the callback (read-only, valid during the
 * call). Extensible: check struct_size before reading a field added later. */
typedef struct stk_pack_progress {
    size_t struct_size; /* sizeof the struct the library filled */
    uint64_t done;      /* samples handled so far (written or skipped), in order */
    uint64_t total;     /* samples in the source */
    uint64_t skipped;   /* samples skipped so far (skip_bad) */
    uint64_t bytes;     /* bytes written so far (finished shards + payloads) */
    uint64_t shards;    /* shards started so far */
    double seconds;     /* since stk_pack started */
    /* Non-NULL when this call reports a sample just skipped under skip_bad:
     * its index in the source, key (path or shard key) and the reason. */
    const char *skipped_key, *skipped_reason;
    uint64_t skipped_index;
} stk_pack_progress;

/* Called by stk_pack on the calling thread: after the first sample, then
 * about every 100 ms while it runs (also while waiting on a slow sample),
 * for each skipped sample, and once at the end (done == total) when the
 * pack succeeded. Returning nonzero stops the pack: it
 * removes what it wrote and returns STK_ECANCELED. */
typedef int (*stk_pack_progress_fn)(const stk_pack_progress *p, void *user);

/* What stk_pack does (extensible: set struct_size = sizeof, zero the rest;
 * fields are only appended). Zero means the default for every field. */
typedef struct stk_pack_options {
    size_t struct_size;
    uint64_t shard_size;           /* target payload bytes per shard (0: 256 MiB) */
    unsigned max_side;             /* 1..65535: re-encode images larger than this as JPEG */
    unsigned quality;              /* JPEG quality of re-encoded images, 1..100 (0: 90) */
    unsigned raw_h, raw_w, raw_c;  /* raw_c 1 or 3: decode to HxWxC uint8 tensors */
    unsigned threads;              /* workers, 0..256 (0: online cores) */
    unsigned align;                /* 0, or payload alignment: a power of two, 512..1 MiB */
    int skip_bad;                  /* 1: skip failing samples (reported), 0: fail */
    size_t record_bytes;           /* > 0: read SRC as fixed-size records ... */
    size_t header_bytes;           /* ... after a header of this size ... */
    unsigned label_bytes;          /* ... each starting with a label (0, 1, 2, 4, 8) */
    stk_pack_progress_fn progress; /* may be NULL */
    void *progress_user;
    /* Added after the first version: */
    int restart; /* 1: rewrite JPEG payloads losslessly with restart markers and
                    a segment index (docs/images.md); others stay as they are */
} stk_pack_options;

/* What a finished stk_pack wrote (extensible: set struct_size). */
typedef struct stk_pack_result {
    size_t struct_size; /* in: sizeof(stk_pack_result); out: bytes filled */
    uint64_t samples;   /* samples written */
    uint64_t skipped;   /* samples skipped (skip_bad) */
    uint64_t shards;
    uint64_t bytes;   /* total size of the shards */
    uint32_t payload; /* 0 encoded, 1 resized, 2 raw, 3 fields (docs/format.md) */
    double seconds;
    /* Added after the first version: */
    uint64_t restart_indexed; /* payloads rewritten restart-indexed (restart) */
} stk_pack_result;

/* Packs the dataset at src (any source stk_options_set_source takes, local)
 * into .stk shards plus a manifest in the directory out (created if missing;
 * it must not hold a packed dataset, and must neither be src, lie inside it
 * nor contain it): docs/shards.md. Worker threads read and transform the
 * samples; the output is byte-identical whatever the thread count. Crash
 * safe: a marker file stays in out until the manifest is written; on failure
 * or cancellation stk_pack removes the shards it wrote (and out if it created
 * it). o may be NULL (all defaults); res may be NULL. Blocks until done; any
 * thread; independent calls may run at once (distinct outputs).
 * Returns STK_OK; STK_EINVAL (bad options or paths, out not usable);
 * STK_EBUSY (another writer or pack is writing into out: its lock is held);
 * STK_ENOENT, STK_EIO, STK_EFORMAT, STK_EEMPTY (src cannot be opened, a
 * sample cannot be read or converted: the message names the sample's index
 * and key); STK_EUNSUPPORTED; STK_ENOMEM; STK_ECANCELED. The message is
 * written to err (errlen bytes, may be 0). */
STK_API int stk_pack(const char *src, const char *out, const stk_pack_options *o,
                     stk_pack_result *res, char *err, size_t errlen);

/* ---- Writing .stk shards sample by sample --------------------------------
 * For programs that produce samples themselves (no dataset on disk to pack):
 * open a writer on an output directory, add samples in order, finish. The
 * shards, the manifest and the crash safety are stk_pack's (docs/format.md);
 * the result opens with stk_options_set_source like any packed dataset. One
 * writer is used by one thread at a time. */
typedef struct stk_writer stk_writer;

typedef struct stk_writer_options {
    size_t struct_size;           /* sizeof(stk_writer_options); zero the rest */
    uint64_t shard_size;          /* target payload bytes per shard (0: 256 MiB) */
    unsigned align;               /* 0, or payload alignment: a power of two, 512..1 MiB */
    unsigned raw_h, raw_w, raw_c; /* raw_c 1 or 3: every sample is an HxWxC uint8
                                   * tensor (HWC) of exactly H*W*C bytes; 0: samples
                                   * are encoded files (images or any bytes) */
    uint64_t num_classes;         /* labels are -1 (none) or 0..num_classes-1 */
} stk_writer_options;

/* Creates the writer: dir is created if missing and must not hold a packed
 * dataset. The writer holds dir's writer lock (a flock on a file inside it)
 * until it finishes or closes, so a second writer or pack on dir gets
 * STK_EBUSY instead of mistaking the live one's work for an interrupted pack.
 * o may be NULL (encoded samples, no labels). On failure *out is NULL and the
 * reason is in err. STK_OK, STK_EINVAL, STK_EBUSY, STK_EIO, STK_ENOMEM. */
STK_API int stk_writer_open(stk_writer **out, const char *dir, const stk_writer_options *o,
                            char *err, size_t errlen);
/* Appends one sample: len bytes at data (copied), its label, and its key
 * (NULL: none; at most 4095 bytes; the name `info`/`verify` and error
 * messages use). STK_OK; STK_EINVAL (a label out of range, a raw sample of
 * the wrong size: nothing written, the writer stays usable); STK_EIO,
 * STK_ENOMEM (the writer has failed: later calls return STK_EMISUSE);
 * STK_EMISUSE after finish or a failure, or on a writer given samples with
 * fields (stk_writer_add_fields). */
STK_API int stk_writer_add(stk_writer *w, const void *data, size_t len, int64_t label,
                           const char *key);
/* One field of a sample for stk_writer_add_fields. */
typedef struct stk_writer_field {
    const char *name; /* 1..255 bytes, no control characters and none of , ; = (the
                         characters stk_options_set_fields gives meaning to) */
    const void *data; /* len bytes, copied (may be NULL when len is 0) */
    size_t len;
    int kind; /* enum stk_field_kind the bytes are, or STK_FIELD_AUTO (readers
                 then go by the name, stk_field_kind_for_name). A name keeps
                 the first kind other than AUTO it is given */
} stk_writer_field;

/* Appends one sample made of n named fields (docs/format.md, payload kind
 * fields): a reader's stk_options_add_field / set_fields then asks for them
 * by name ("image=jpg,caption=txt"), and the loader without fields gets the
 * sample's first image field (by kind, else by name). Field names are
 * collected across samples in the order they first appear (at most 64 in a
 * dataset); a sample may lack any of them. Everything is copied: the fields
 * are borrowed for the call only. An INT or FLOAT field holds its decimal
 * text ("3"), an NPY field a whole .npy file. label and key as in
 * stk_writer_add: the label stays in the index (a "cls" field may hold it
 * too, for readers that ask for fields). A writer takes one layout: after
 * stk_writer_add it refuses this call, and after this call stk_writer_add
 * (STK_EMISUSE with the reason); a raw writer (raw_c) refuses it too.
 * STK_OK; STK_EINVAL (n 0, a name that is empty, too long, repeated in the
 * sample or not allowed, a kind that contradicts the name's earlier one, a
 * 65th name, a label or key as stk_writer_add refuses: nothing written, the
 * writer stays usable); STK_ETOOBIG (the sample's payload would pass 4 GiB,
 * nothing written); STK_EIO, STK_ENOMEM (the writer has failed);
 * STK_EMISUSE. */
STK_API int stk_writer_add_fields(stk_writer *w, const stk_writer_field *fields, size_t n,
                                  int64_t label, const char *key);
/* Names class c (< num_classes) in the manifest (copied; no newline).
 * STK_OK, STK_EINVAL, STK_ENOMEM, STK_EMISUSE. */
STK_API int stk_writer_set_class_name(stk_writer *w, uint64_t c, const char *name);
/* Finishes the last shard and writes the manifest; res (may be NULL; set
 * struct_size) gets the counts. STK_OK; STK_EEMPTY (no sample added);
 * STK_EIO; STK_ENOMEM; STK_EMISUSE (already finished or failed). */
STK_API int stk_writer_finish(stk_writer *w, stk_pack_result *res);
/* The last error's message ("" when none); valid until the next call. */
STK_API const char *stk_writer_errmsg(const stk_writer *w);
/* Frees the writer. Without a successful finish it removes the shards it
 * wrote and the directory if it created it. NULL is harmless. */
STK_API void stk_writer_close(stk_writer *w);

/* ---- Inspecting a dataset ------------------------------------------------
 * What `stoker info` and `stoker verify` print, without a loader: open the
 * dataset at a path (any source stk_options_set_source takes, local or
 * remote), read its kind and counts, its shards and class names, a sample's
 * key and bytes, or check every sample. A dataset handle is used by one
 * thread at a time; distinct handles are independent. */
typedef struct stk_dataset stk_dataset;

/* Opens the dataset at path. o (may be NULL: defaults) supplies the settings
 * a source needs beyond its path: records (stk_options_set_records) and the
 * remote store and its cache (endpoint, region, addressing, fetch_*,
 * cache_dir, cache_limit); nothing else of o is read, and o may be destroyed
 * after the call. Blocks while the dataset is scanned (a folder is listed, a
 * shard's index read). On success *out is the handle, to close with
 * stk_dataset_close. On failure *out is NULL and err (errlen bytes, may be
 * 0) names the path and the reason. STK_OK; STK_EINVAL (NULL out, no path,
 * bad records); STK_ENOENT; STK_EIO; STK_EFORMAT (a corrupt shard, manifest
 * or record file); STK_EEMPTY; STK_EUNSUPPORTED; STK_ENOMEM. */
STK_API int stk_dataset_open(stk_dataset **out, const char *path, const stk_options *o, char *err,
                             size_t errlen);
/* Frees the handle (and the bytes of its last read). NULL is harmless. */
STK_API void stk_dataset_close(stk_dataset *d);

/* What a dataset holds (extensible: set struct_size = sizeof, fields are
 * only appended). Strings are static or owned by the handle. */
typedef struct stk_dataset_info {
    size_t struct_size;
    const char *kind;    /* "folder", "records", "stk", "tar", "cifar" */
    const char *payload; /* stk: "encoded", "resized", "raw" or "fields"; else NULL */
    uint64_t samples;
    uint64_t classes;             /* labels are 0..classes-1 */
    uint64_t shards;              /* shards (stk_dataset_shard); 0 for folders, records */
    uint64_t files;               /* shard or batch files behind the dataset (0: not counted) */
    uint64_t bytes;               /* their total size (with files) */
    size_t sample_bytes;          /* bytes of every sample when all are one size, else 0 */
    uint32_t raw_h, raw_w, raw_c; /* stk raw payloads: HWC uint8 shape; else 0 */
    int64_t restart_indexed;      /* stk: samples with a restart index per the
                                     manifest; -1 when it does not say */
    uint64_t index_bytes;         /* bytes the dataset's index keeps in memory */
} stk_dataset_info;

/* Fills *info. STK_OK; STK_EINVAL (NULL, or info->struct_size too small). */
STK_API int stk_dataset_describe(const stk_dataset *d, stk_dataset_info *info);

/* The fields a dataset's samples have (docs/multimodal.md): a tar's member
 * extensions, a .stk's stored fields, a folder's image, label and path. */
typedef struct stk_dataset_field_info {
    size_t struct_size;
    const char *name; /* owned by the handle */
    int kind;         /* enum stk_field_kind the source gives it, or AUTO */
    uint64_t samples; /* samples that have it; UINT64_MAX: not known */
} stk_dataset_field_info;
/* Number of fields (0 for a source that cannot say). */
STK_API size_t stk_dataset_field_count(const stk_dataset *d);
/* STK_OK; STK_EINVAL (k >= count, NULL, struct_size too small). */
STK_API int stk_dataset_field(const stk_dataset *d, size_t k, stk_dataset_field_info *info);

/* Shard k of a sharded dataset (extensible as stk_dataset_info). */
typedef struct stk_dataset_shard_info {
    size_t struct_size;
    uint64_t first; /* its samples are first .. first+count-1 */
    uint64_t count;
    const char *name; /* remote: the object name (owned by the handle); local: NULL */
    uint64_t bytes;   /* its size when known, else 0 */
} stk_dataset_shard_info;

/* STK_OK; STK_EINVAL (k >= shards, NULL, struct_size too small). */
STK_API int stk_dataset_shard(const stk_dataset *d, uint64_t k, stk_dataset_shard_info *info);
/* Class c's name: a folder's subfolder, or the name a .stk manifest gives;
 * NULL when the dataset names none (other kinds, c >= classes, a class an
 * older manifest leaves unnamed). Owned by the handle, valid until close. */
STK_API const char *stk_dataset_class_name(const stk_dataset *d, uint64_t c);
/* Writes sample i's key into buf (n bytes, always terminated): the .stk or
 * tar key, CIFAR's "file#record", a folder's path relative to its root.
 * STK_OK; STK_EINVAL (i >= samples, NULL buf, n 0). */
STK_API int stk_dataset_sample_key(const stk_dataset *d, uint64_t i, char *buf, size_t n);
/* Reads sample i's bytes as stored (checksums checked; for a .stk of fields,
 * the whole sample is checked and its first image field is given, as a
 * loader without fields reads it): *data points at len
 * bytes owned by the handle, valid until the next stk_dataset_read or close;
 * *label (may be NULL) gets its label, -1 when none. On failure err names
 * the sample's index and key and the reason. STK_OK; STK_EINVAL; STK_EIO;
 * STK_EFORMAT (corrupt); STK_ETOOBIG; STK_ENOMEM. */
STK_API int stk_dataset_read(stk_dataset *d, uint64_t i, const void **data, size_t *len,
                             int64_t *label, char *err, size_t errlen);

/* What stk_dataset_verify found, one problem at a time. */
#define STK_VERIFY_CORRUPT   1 /* a sample fails (read, checksum, restart index, image) */
#define STK_VERIFY_TOO_LARGE 2 /* an intact image over max_input_bytes: no decode takes it */
#define STK_VERIFY_MANIFEST  3 /* the manifest disagrees with the shards */
#define STK_VERIFY_SHARD     4 /* a whole shard does not open; samples: its count */
#define STK_VERIFY_DATASET                                                                         \
    5 /* the dataset does not open as a whole (shards are                                          \
         then checked one by one) */
typedef struct stk_verify_problem {
    size_t struct_size;
    int kind;           /* STK_VERIFY_* */
    const char *name;   /* the sample's key or path, the shard, the dataset; "" if none */
    const char *reason; /* why, in words */
    uint64_t index;     /* the sample's index in its (shard's) source, or UINT64_MAX */
    uint64_t samples;   /* samples it makes unreadable; UINT64_MAX: unknown */
} stk_verify_problem;
/* Called on the calling thread; strings valid during the call only. */
typedef void (*stk_verify_fn)(const stk_verify_problem *p, void *user);

typedef struct stk_verify_result {
    size_t struct_size;         /* in: sizeof(stk_verify_result) */
    uint64_t checked;           /* samples read */
    uint64_t corrupt;           /* of those, failed */
    uint64_t too_large;         /* intact images over max_input_bytes */
    uint64_t unreadable;        /* samples in shards that do not open */
    uint64_t bad_shards;        /* shards that do not open */
    uint64_t uncounted_shards;  /* of those, ones whose sample count is unknown */
    uint64_t manifest;          /* manifest problems */
    uint64_t indexed;           /* JPEGs with a restart index (checked) */
    uint64_t foreign;           /* images in formats stoker does not decode */
    const char *foreign_format; /* the first of those (static), or NULL */
    int whole;                  /* 1: the dataset opened as a whole */
} stk_verify_result;

/* Reads every sample of the dataset at path, checking every checksum,
 * restart index and image header, and a packed directory's manifest against
 * its shards; fn (may be NULL) is called for each problem. A dataset that
 * does not open as a whole is checked shard by shard, so one broken shard
 * does not hide the others. o as for stk_dataset_open, plus max_input_bytes.
 * Blocks; any thread. Returns STK_OK when the check ran (problems or not:
 * the dataset is sound when res counts no corrupt, too_large, bad_shards and
 * manifest problems and whole is 1); STK_EINVAL (no path, res NULL or
 * struct_size too small); or the open's error (STK_ENOENT, STK_EFORMAT, ...)
 * when nothing could be checked, with the reason in err. */
STK_API int stk_dataset_verify(const char *path, const stk_options *o, stk_verify_fn fn, void *user,
                               stk_verify_result *res, char *err, size_t errlen);

/* ---- Measuring one stage ------------------------------------------------
 * What `stoker doctor` measures at its "decode" level (docs/diagnosis.md):
 * the decode+augment stage alone, on samples already in memory. */

/* The worker threads a loader with threads 0 starts: the CPUs in this
 * thread's affinity mask, capped by the cgroup CPU quota, divided by the
 * LOCAL_WORLD_SIZE environment variable when set; 1..256. STK_OK; STK_EINVAL
 * for NULL or a malformed LOCAL_WORLD_SIZE (*n is then 1). Any thread. */
STK_API int stk_default_threads(unsigned *n);

/* Bytes of memory this machine can still give without swapping
 * (MemAvailable of /proc/meminfo); 0 when it cannot be read. A loader
 * without memory_budget takes a quarter of it, shared by the node's ranks
 * (docs/memory.md); `stoker doctor` compares the memory bound with it.
 * Any thread. */
STK_API uint64_t stk_mem_available(void);

/* What stk_bench_decode measured (set struct_size = sizeof; filled on STK_OK). */
typedef struct stk_bench_decode_result {
    size_t struct_size;
    unsigned threads;      /* threads that ran */
    uint64_t samples;      /* samples decoded and transformed */
    uint64_t failed;       /* samples whose decode or transform failed */
    double seconds;        /* wall time of the run (thread start to stop) */
    double cpu_seconds;    /* this process's CPU time over it (user + system,
                              every thread, so other threads' work counts) */
    int kind;              /* STK_BATCH_DENSE: every output has the shape below */
    int dtype;             /* dense: the outputs' enum stk_dtype; else UINT8 */
    unsigned ndim;         /* dense: rank of one output */
    int64_t shape[4];      /* dense: one output's shape */
    size_t sample_bytes;   /* dense: bytes of one output; 0 for variable */
    size_t outputs;        /* dense outputs written into out (samples 0, 1, ...) */
    uint64_t input_pixels; /* width x height summed over the inputs whose JPEG or
                              PNG header gives a size */
    uint64_t input_images; /* how many inputs those are */
} stk_bench_decode_result;

/* Runs the image pipeline a loader with options o would run (o's transform
 * and image options: dtype, layout, size, exif, max_dim, strict,
 * jpeg_memory, scratch_bytes) on the n samples at samples[k] (lens[k] bytes
 * each, encoded images as stored), over and over in order, on `threads`
 * library threads (0: stk_default_threads) for `seconds` (0 < seconds <=
 * 3600), and counts what came out. Sample k's draws are keyed by (o's seed,
 * round, k). Nothing is read from storage and nothing is batched: the rate
 * res->samples / res->seconds is the decode+augment ceiling of that many
 * threads. When out is not NULL and outputs are dense, the first round's
 * outputs (sample 0, 1, ..., one each) are written there, as many as out_cap
 * bytes hold (res->outputs says how many were). The samples and out are borrowed for the call; o is
 * only read. Blocks for `seconds`; any thread, calls may overlap. STK_OK (samples that fail are
 * counted, not errors); STK_EINVAL (NULL arguments, n 0, threads over 256, seconds out of range, no
 * transform, a bad spec, res->struct_size too small, a malformed LOCAL_WORLD_SIZE); STK_ENOMEM;
 * STK_EIO (a thread would not start). err (errlen bytes, may be 0) says why. */
STK_API int stk_bench_decode(const stk_options *o, const void *const *samples, const size_t *lens,
                             size_t n, unsigned threads, double seconds, void *out, size_t out_cap,
                             stk_bench_decode_result *res, char *err, size_t errlen);

/* path as messages show it: a URL loses its user:password@ and its query
 * string and fragment, shown as "?..." (they may carry credentials); anything else is
 * returned as it is. Returns buf (n bytes, always terminated) when it wrote
 * there, else path. Any thread; no allocation. */
STK_API const char *stk_path_display(const char *path, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
