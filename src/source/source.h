/*
 * source.h -- the source interface: what a dataset format must provide.
 *
 * A source knows its samples: how many, each one's label, a name for error
 * messages (path or key), and how to read its bytes. Every source is random
 * access. Reads come from many worker threads at once, so read() must be
 * thread-safe (pread on a shared descriptor, or open/read/close per sample).
 * Formats live one per file in src/source/, each exporting one open function
 * that fills a stk__source with its ops table, the way curl keeps its TLS
 * backends. The table is all a caller may know of a kind: what its samples
 * are (flags), how to describe the dataset, a sample's key, a class's name,
 * a sample's stored size. `kind` is a name for messages and is never
 * compared: code that must treat a kind differently asks for a slot or a
 * flag here, so a new format is one file and one table.
 *
 * Module map of src/source/ (each layer includes only the layers above it):
 *
 *   source.h, common.c      this interface and the helpers every reader uses
 *   offtab.h/.c             shards that begin with an offsets table (MDS
 *                           shards, LitData chunks): the table, item ranges
 *   unpack.h/.c             a reader's private temporary area for files stored
 *                           compressed (mds.c, litdata.c): $TMPDIR/stoker-TAG-*,
 *                           free-space, size and xxh64 checks; the codec is an
 *                           enum stk__codec (zstd; a new one, e.g. gzip for
 *                           TFRecord .gz, is a decoder and a row in unpack.c)
 *   stkformat.h/.c          .stk bytes: header, footer, index, shard writer
 *   manifest.h/.c           a packed dataset's stoker.manifest
 *   remote_files.c          the files a dataset names as local files: DIR/NAME,
 *                           or objects downloaded whole into the disk cache
 *   folder.c records.c      the readers, one per kind; stk.c reads the
 *   stk.c tar.c cifar.c     manifest and reads its shards, local or remote,
 *   mds.c litdata.c         by ranges through the transport (io/transport.h);
 *   tfrecord.c parquet.c    tar.c, mds.c, litdata.c, tfrecord.c and parquet.c
 *                           read remote datasets through remote_files.c
 *   bucket.c                unpacked CLASS/NAME objects under an S3 prefix,
 *                           each a one-sample shard of the fetch stage
 *   listcache.c             bucket.c's listing kept in cache_dir for the next
 *                           open (listing_ttl)
 *   dataset.h, detect.c     which kind a path names, opening it, describing
 *                           an open source (info, pack); calls the readers,
 *                           which never call it
 *
 * Outside src/source/, the loader, the dataset API (src/dataset_api.c, which
 * `stoker info` and `stoker verify` print) and the packer (src/pack/) use
 * dataset.h.
 */
#ifndef STK_SOURCE_H
#define STK_SOURCE_H

#include "internal.h"

struct stk__manifest;
struct stk__remote;
struct stk__remote_cfg;
struct stk__cache;

/* Where a read puts its bytes: stk__sink, in internal.h (the image pipeline
 * writes its output through one too). */

typedef struct stk__source stk__source;

/* ---- Fields (samples with several fields, docs/multimodal.md) ----------
 * A source describes the fields its samples have (stk__source.fields) and,
 * given the bytes a read or a fetch brought for sample i, says where each
 * of its fields is (the `fields` op). A source without the op has the
 * generic fields stk__source_fields_generic gives: its one payload and its
 * label. */
#define STK__MAX_FIELDS 64 /* fields one source may describe */

typedef struct stk__field_desc {
    char *name;       /* a tar member's extension after the key ("jpg",
                         "seg.png"), a .stk field's name, a column */
    int kind;         /* enum stk_field_kind the source knows it has, or AUTO */
    uint64_t samples; /* samples that have it; UINT64_MAX: not known */
    bool nocopy;      /* a field a copy (stk pack) leaves out: another field's
                         bytes under a second name (Parquet's "image.bytes"
                         beside "image"), or a name no sample has (a
                         Parquet list's "images[]") */
} stk__field_desc;

/* One field of one sample: id indexes stk__source.fields; data/len its bytes
 * (inside the bytes the read gave, or in the set's gen area). An INT field's
 * bytes are its decimal text, a FLOAT's too. */
typedef struct stk__field_ref {
    uint32_t id;
    const uint8_t *data;
    size_t len;
} stk__field_ref;

#define STK__FIELD_GEN 4200 /* bytes a source may generate per sample (a label, a path) */
typedef struct stk__field_set {
    stk__field_ref f[STK__MAX_FIELDS];
    size_t n;
    /* Fields the sample has that the select left out (ids; only sources that
     * read a subset fill it): for the message naming what a sample has. */
    uint32_t others[STK__MAX_FIELDS];
    size_t nothers;
    size_t gen_used;
    uint8_t gen[STK__FIELD_GEN];
} stk__field_set;

/* What stk__source_describe (and a kind's describe op) tell of an open source. */
typedef struct stk__dataset_info {
    const char *format;           /* "stk", "tar", "cifar10", "folder", "records" */
    const char *payload;          /* stk: payload kind name; else NULL */
    uint64_t shards;              /* files behind the source */
    uint64_t bytes;               /* their total size */
    uint32_t raw_h, raw_w, raw_c; /* stk raw kind */
    int64_t restart_indexed;      /* stk: samples with a restart index per the
                                     manifest; -1 when it does not say */
    int images;                   /* which samples must be image files (verify,
                                     pack): 0 none checked, 1 all, 2 those whose
                                     key names an image (an encoded .stk holds
                                     whatever files it was packed from) */
} stk__dataset_info;

struct stk__source_params;

typedef struct stk__source_ops {
    const char *kind; /* "folder", "records", ... */
    /* Reads sample i (i < count): on success *data points at its bytes (inside
     * the sink's buffer), *len is their length and *label the label (-1 if
     * none). On failure returns STK_EIO / STK_EFORMAT / STK_ETOOBIG /
     * STK_ENOMEM with the reason (without the name) in err. Thread-safe. */
    int (*read)(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                int64_t *label, char *err, size_t errlen);
    /* Writes sample i's name (path or key) into buf. */
    void (*name)(const stk__source *s, uint64_t i, char *buf, size_t n);
    void (*close)(stk__source *s);
    /* Optional, for sources whose samples are byte ranges of shards (the
     * fetch stage reads them ahead of the workers): where sample i lives.
     * *shard SIZE_MAX: sample i is not fetched but read by `read` (a
     * mixture's sample of a local child). */
    void (*locate)(const stk__source *s, uint64_t i, size_t *shard, uint64_t *off, uint64_t *len);
    /* Optional, with locate: checks the bytes fetched for sample i (checksum)
     * and gives its label. STK_EFORMAT with the reason in err. */
    int (*accept)(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                  int64_t *label, char *err, size_t errlen);
    /* Optional: the fields reads return from now on (bit k: fields[k]);
     * called once after open, before any read or locate. A source whose
     * sample is one range of bytes holding all its fields may ignore it.
     * Without a select, reads return the sample's payload as they always
     * did. */
    int (*select)(stk__source *s, uint64_t mask, char *err, size_t errlen);
    /* Optional: fills fs with the fields of sample i found in bytes/len (what
     * read or locate+fetch gave after select) and label (what the read gave).
     * STK_EFORMAT with the reason (without the sample's name) in err. NULL:
     * stk__source_fields_generic. */
    int (*fields)(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len, int64_t label,
                  stk__field_set *fs, char *err, size_t errlen);
    /* What the kind's samples are (STK__SRC_* below): facts that hold for
     * every dataset of the kind, so callers never test `kind` itself. */
    unsigned flags;
    /* Optional: fills in what the kind knows about the open dataset (format,
     * payload, shards, bytes, raw shape, which samples must be images); di
     * arrives zeroed with format = kind and restart_indexed = -1. */
    void (*describe)(const stk__source *s, stk__dataset_info *di);
    /* Optional: sample i's short key (a .stk or tar key, CIFAR's
     * "file#record"). NULL: stk__source_key shortens the name. */
    void (*key)(const stk__source *s, uint64_t i, char *buf, size_t n);
    /* Optional: class c's name (a folder's subfolder, a manifest's name), or
     * NULL for an unnamed class or c past the classes. NULL: no names. */
    const char *(*class_name)(const stk__source *s, uint64_t c);
    /* Optional: sample i's width and height as the index stores them;
     * STK_EUNSUPPORTED (0 x 0) when this dataset stores none. */
    int (*meta)(const stk__source *s, uint64_t i, uint32_t *w, uint32_t *h);
    /* Optional: a field the description does not list that the source can
     * still give, by name (a Parquet list's element "images[3]"): adds it to
     * s->fields (stk__source_add_field) and returns its id, or -1 when there
     * is no such field (or no room). Called before select, from one thread. */
    int (*field_named)(stk__source *s, const char *name, size_t len);
    /* Optional: told, once after select, the order the loader reads in
     * (shuffled or not; global: not in shards; shard_window row groups or
     * shards at a time otherwise): a reader whose random reads can cost far
     * more than reading in that order warns and says what to
     * change, through stk__warn(prm, ...). Reads nothing the first reads
     * would not. */
    void (*advise_order)(stk__source *s, const struct stk__source_params *prm, bool shuffle,
                         bool global, unsigned shard_window);
    /* Optional, for stoker verify (stk_dataset_verify): sample i's values
     * that a read with every field selected does not give or check (every
     * element of a Parquet list, "images[3]"; the values of image columns),
     * each passed to fn with its field's name, its kind (enum
     * stk_field_kind, AUTO: by the name) and its bytes (valid during the
     * call). Stops at fn's first nonzero return and returns it. A value
     * that cannot be read fails as read does (STK_EFORMAT, STK_EIO, ...,
     * the reason, naming the field, in err). One thread. */
    int (*each_value)(stk__source *s, uint64_t i,
                      int (*fn)(void *user, const char *field, int kind, const uint8_t *p,
                                size_t n),
                      void *user, char *err, size_t errlen);
} stk__source_ops;

/* stk__source_ops.flags. STK__SRC_IMAGES: samples are images (encoded, or
 * raw pixels when stk__source.raw_c is set); without it, plain bytes. */
#define STK__SRC_IMAGES 1u

struct stk__source {
    const stk__source_ops *ops;
    void *impl;
    uint64_t count;
    uint64_t num_classes;
    /* Bytes of every sample when all are the same size (records), else 0. */
    size_t fixed_len;
    /* Bytes the source keeps in memory (its index), for the memory bound. */
    uint64_t index_bytes;
    /* Bytes of the largest sample when the index says (0: unknown). */
    uint64_t max_len;
    /* Samples that are uncompressed images of one shape (CIFAR: 32x32x3
     * planar; raw .stk: HWC): raw_c 0 when they are not. The image pipeline
     * transforms them as decoded images. */
    uint32_t raw_h, raw_w, raw_c;
    int raw_chw;
    /* Shards (0 when the source has none): shard k holds samples
     * [shard_first[k], shard_first[k + 1]); shard_first has nshards + 1
     * entries. Used by shard-aware order and the fetch stage. */
    size_t nshards;
    uint64_t *shard_first;
    /* Remote sources: the object store (owned by the source), each shard's
     * object name (relative to the dataset URL) and size in bytes. */
    struct stk__remote *remote;
    char **shard_objs; /* nshards_objs_ entries (allocated before nshards is known) */
    uint64_t *shard_bytes;
    char **shard_tags; /* NULL, or per shard its ETag/Last-Modified (NULL: none) */
    /* NULL, or per shard what identifies its content when no ETag is known
     * (a .stk opened from its consolidated index: its footer's checksums):
     * the disk cache keys the shard with it, so a republished shard of the
     * same size is not read from the old entry. Never compared with a
     * response's validator. */
    char **shard_ids;
    size_t nshards_objs_;
    /* NULL, or per shard the store it is read from (NULL: a shard read by the
     * source's own read op, never fetched): a mixture's flattened table of
     * its children's shards (source/mix.c), whose stores the children own.
     * The fetch stage uses it instead of `remote` when set. */
    struct stk__remote **shard_remote;
    /* NULL, or per shard whether the fetch stage keeps it out of the disk
     * cache (a mixture's source with its own cache 0: its samples are read
     * by range). Owned. */
    bool *shard_nocache;
    /* Cache entries pinned for the source's life (open descriptors holding
     * shared locks), and the cache they belong to. */
    int *pins;
    size_t npins;
    struct stk__cache *cache;
    /* The fields samples have (owned; names freed by stk__source_close); 0 and
     * NULL until stk__source_open sets the generic ones for a reader that did
     * not describe its own. */
    stk__field_desc *fields;
    size_t nfields;
};

/* Adds a field to s's description (name copied). Returns its id, or -1 when
 * out of memory or past STK__MAX_FIELDS. */
int stk__source_add_field(stk__source *s, const char *name, size_t name_len, int kind,
                          uint64_t samples);
/* The generic fields for a reader that describes none: field 0 is the
 * payload ("image" for image sources, else "data"), field 1 "label" (INT)
 * when the source has labels. Called by stk__source_open. */
int stk__source_default_fields(stk__source *s);
/* The generic `fields` op: field 0 = bytes, field 1 = the label's digits
 * (only when label >= 0). */
int stk__source_fields_generic(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                               int64_t label, stk__field_set *fs, char *err, size_t errlen);
/* Appends a generated field (bytes copied into fs->gen). STK_ETOOBIG when the
 * gen area is full, STK_EFORMAT past STK__MAX_FIELDS refs. */
int stk__field_set_gen(stk__field_set *fs, uint32_t id, const void *data, size_t len);

/* Parameters a source may need beyond the path. */
typedef struct stk__source_params {
    size_t record_bytes, header_bytes;
    unsigned label_bytes;
    /* Remote datasets (URLs): the store's settings, and the disk cache that
     * tar shards are downloaded into (cache_dir NULL: none). */
    const struct stk__remote_cfg *remote;
    const char *cache_dir;
    uint64_t cache_limit;
    /* NULL, or a flag set (by another thread) when the open should stop:
     * waits on other processes re-check it. */
    const _Atomic bool *cancel;
    /* .stk over a URL: open each shard, never from the consolidated index
     * (stoker verify checks the shards' own bytes). */
    bool no_index;
    /* Unpacked objects in a bucket: seconds a listing kept in cache_dir is
     * trusted (listcache.c); 0: STK__LISTING_TTL_DEFAULT; STK__LISTING_RELIST:
     * list on every open. */
    uint64_t listing_ttl;
    /* Where the open's warnings go (stk_options_set_warning; NULL: stderr).
     * Sources warn through stk__warn, never by printing. */
    stk_warning_fn warn;
    void *warn_user;
} stk__source_params;

/* A warning (a condition the open goes on after) to prm's channel: its
 * function, or the line "stoker: warning: MSG" on stderr when prm or its
 * function is NULL. The message is formatted into STK_ERRMSG_MAX * 4
 * bytes (cut beyond). Call in the thread of the open that prm belongs to,
 * while it runs (stk_options_set_warning's contract). */
void stk__warn(const stk__source_params *prm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define STK__LISTING_TTL_DEFAULT 86400u
#define STK__LISTING_RELIST      UINT64_MAX

/* ---- The files a dataset names (remote_files.c) ------------------------
 * A reader whose index names its files (MDS, LitData) or that is given a
 * list of files (tar, TFRecord, and any reader of whole files) finds them
 * through a stk__files: a transport and the names got through it. A local
 * dataset's are "DIR/NAME"; an object store's are objects of the caching
 * transport over the store's (io/transport_cache.c): downloaded whole into
 * the disk cache (prm->cache_dir, required), pinned there, and read by the
 * same local reader. Readers never know which: they open the local path and
 * name the shown one in messages. */
typedef struct stk__files stk__files;
/* Files under dir (NULL: names are paths). STK_ENOMEM. */
int stk__files_open_local(stk__files **out, const char *dir);
/* Objects of the store r (taken over: closed with the set, also on
 * failure). prm is borrowed until the set is closed. what: what is
 * downloaded, for messages ("MDS shards"). STK_ENOMEM. */
int stk__files_open_remote(stk__files **out, struct stk__remote *r, const stk__source_params *prm,
                           const char *what);
bool stk__files_is_remote(const stk__files *f);
void stk__files_set_what(stk__files *f, const char *what);
/* Makes names[0..n) local files (remote: probed, downloaded at once into
 * the cache or pinned there; a name already got is not fetched again):
 * paths[k] the file to open, shown[k] (either may be NULL) the name for
 * messages (DIR/NAME, or the object's URL without secrets), both owned by f
 * until it closes. sizes (may be NULL): the sizes an index or listing gives,
 * which the objects must have (sizes_from names it: "index.json"). Remote
 * errors name the object's URL: STK_ENOENT (404), STK_EIO (unreachable, size
 * mismatch, changed while read), STK_EINVAL (no cache_dir), STK_ETOOBIG (does
 * not fit the cache), STK_ENOMEM. Local names are not checked: the reader's
 * open reports them. */
int stk__files_get(stk__files *f, const char *const *names, const uint64_t *sizes, size_t n,
                   const char *sizes_from, const char **paths, const char **shown, char *err,
                   size_t errlen);
/* The shown name of name, without getting it; written into buf, returned. */
const char *stk__files_shown(const stk__files *f, const char *name, char *buf, size_t n);
/* Hands the pins of what f got (and the cache they belong to) to s, which
 * keeps them for its life; call after the reader opened s. STK_ENOMEM. */
int stk__files_keep(stk__files *f, stk__source *s);
void stk__files_close(stk__files *f);

/* A reader of a list of whole files: paths are the local files to read,
 * shown (NULL: paths) their names for messages. detect.c opens such a
 * reader on a local list or a remote one alike (K_* table there). */
typedef int (*stk__files_open_fn)(stk__source *s, const char *const *paths,
                                  const char *const *shown, size_t n, char *err, size_t errlen);

struct stat;
/* Opens the regular file path to read (shown: its name for messages): the
 * descriptor, with its stat in *st; or a negative code with "SHOWN: why" in
 * err: STK_ENOENT (no such file), STK_EIO (any other failure, or not a
 * regular file). */
int stk__open_regular(const char *path, const char *shown, struct stat *st, char *err,
                      size_t errlen);

/* Writes n bytes to path whole or not at all: into a temporary file whose
 * name no other writer uses (the pid, a counter, the time: two loaders of a
 * process, or processes with one pid in containers sharing the folder),
 * renamed over path. STK_OK; STK_EIO (the temporary file removed). */
int stk__write_replace(const char *path, const void *buf, size_t n);

/* Reads a file a reader sealed for itself (an index kept on disk): whole,
 * of min to 2^40 bytes, starting with the 8 bytes of magic and ending in
 * the XXH3-64 of all before it (stk__put64). STK_OK with *buf (stk__free)
 * and its *n bytes; STK_ENOENT when it cannot be opened; STK_EFORMAT when
 * it is no such file, or cannot be read; STK_ENOMEM. */
int stk__sealed_read(const char *path, const char *magic, size_t min, uint8_t **buf, size_t *n);

void stk__source_close(stk__source *s);
/* Frees what every source may hold besides its impl (shard tables, the
 * remote store) and zeroes those fields: for failure paths. */
void stk__source_free_common(stk__source *s);

int stk__source_folder_open(stk__source *s, const char *path, char *err, size_t errlen);
int stk__source_records_open(stk__source *s, const char *path, const stk__source_params *prm,
                             char *err, size_t errlen);
/* Sources over a list of shard files (a directory's, a brace pattern's, or one
 * file). The paths are copied. dir: the dataset directory when a directory
 * was named (the .stk reader reads its manifest there), else NULL. */
int stk__source_stk_open(stk__source *s, const char *const *paths, size_t n, const char *dir,
                         char *err, size_t errlen);
int stk__source_tar_open(stk__source *s, const char *const *paths, size_t n, char *err,
                         size_t errlen);
/* .stk shards in an object store: r is taken over by the source (closed with
 * it, also on failure). names are object names relative to the dataset URL;
 * sizes (may be NULL) their sizes when known (a listing or the manifest);
 * man: the dataset's manifest when it has one (taken over), else NULL;
 * when it names a consolidated index (stoker.index) the shards are opened
 * from it, kept in prm->cache_dir when given (prm may be NULL). */
int stk__source_stk_open_remote(stk__source *s, struct stk__remote *r, const char *const *names,
                                const uint64_t *sizes, size_t n, struct stk__manifest *man,
                                const stk__source_params *prm, char *err, size_t errlen);
/* CIFAR-10 (3073-byte records: label, 3072 bytes CHW) or CIFAR-100 (3074:
 * coarse label, fine label, 3072 bytes CHW) batch files; samples are the
 * 3072 image bytes as stored (CHW), the label is the (fine) label. */
int stk__source_cifar_open(stk__source *s, const char *const *paths, size_t n, char *err,
                           size_t errlen);
/* A MosaicML Streaming (MDS) dataset: fs gives index.json (version 2) and
 * its .mds or .mds.zstd shards (mds.c; docs/formats.md), from a local
 * directory or an object store. Each column is a field; the zstd shards
 * are decompressed into a temporary directory that the source removes at
 * close. */
int stk__source_mds_open(stk__source *s, stk__files *fs, char *err, size_t errlen);
/* Whether an index.json's text describes MDS shards (detect.c asks): 1
 * yes, 0 no. An index that does not parse but names MDS shards is MDS (the
 * reader then says what is wrong with it). */
int stk__mds_sniff_text(const char *text, size_t len);

/* A LitData dataset (litdata's optimize()): fs gives index.json and its
 * chunk-*.bin or chunk-*.zstd.bin chunks (litdata.c; docs/formats.md), from
 * a local directory or an object store. Each pytree leaf is a field; zstd
 * chunks are decompressed into a temporary directory that the source
 * removes at close. */
int stk__source_litdata_open(stk__source *s, stk__files *fs, char *err, size_t errlen);
/* Whether an index.json's text describes LitData chunks ("chunks" and
 * "config"): 1 yes, 0 no. Asked after stk__mds_sniff_text. */
int stk__litdata_sniff_text(const char *text, size_t len);
/* TFRecord files of tf.train.Example records (.tfrecord, or .tfrecord.gz
 * decompressed into a temporary directory removed at close): paths are the
 * local files (a remote dataset's cached copies), shown (NULL: paths) their
 * names for messages (tfrecord.c; docs/formats.md). Each feature is a
 * field. A stk__files_open_fn. */
int stk__source_tfrecord_open(stk__source *s, const char *const *paths, const char *const *shown,
                              size_t n, char *err, size_t errlen);
/* Unpacked objects in a bucket (bucket.c, docs/remote.md): the listing of
 * every object below an S3 prefix or an HTTP URL with nginx autoindex pages
 * (names relative to it, sizes); objects
 * CLASS/NAME with an image extension are the samples, each a one-sample
 * shard the fetch stage reads with one GET. r is taken over (closed with
 * the source, also on failure). STK_EEMPTY when no object is a sample. */
int stk__source_bucket_open(stk__source *s, struct stk__remote *r, char *const *names,
                            const uint64_t *sizes, size_t n, char *err, size_t errlen);
/* The listing of the prefix below r kept in prm->cache_dir (listcache.c),
 * when there is one, whole and younger than prm->listing_ttl: STK_OK with
 * the arrays (the caller's, stk__remote_list_free); STK_ENOENT (none, stale,
 * relist asked, or damaged: a warning through stk__warn says so); STK_ENOMEM. */
int stk__listing_load(struct stk__remote *r, const stk__source_params *prm, char ***names,
                      uint64_t **sizes, size_t *n);
/* Parses a kept listing's whole file (buf, len; listcache.c has the layout),
 * which must name the prefix id, into new arrays (stk__remote_list_free) and
 * the time it was listed: STK_OK; STK_EFORMAT (why says what is wrong);
 * STK_ENOMEM. */
int stk__listing_parse(const uint8_t *buf, size_t len, const char *id, uint64_t *listed_at,
                       char ***names, uint64_t **sizes, size_t *n, char *why, size_t wn);
/* stk__remote_list_tree, kept in prm->cache_dir when it is a bucket's
 * (stk__bucket_samples) for the next open; one rank of the node lists while
 * the others wait for its file. */
int stk__listing_tree(struct stk__remote *r, const stk__source_params *prm, char ***names,
                      uint64_t **sizes, size_t *n, char *err, size_t errlen);
/* Whether a listing is mostly CLASS/NAME image objects (an ImageFolder). */
int stk__bucket_samples(char *const *names, size_t n);
/* Parquet files (one, or a directory's *.parquet sorted by name): paths
 * are the local files, shown (NULL: paths) their names for messages (parquet.c; docs/formats.md).
 * Each leaf column that is not repeated is a field; Hugging Face's Image struct is also a field
 * under its own name (its bytes). A stk__files_open_fn. */
int stk__source_parquet_open(stk__source *s, const char *const *paths, const char *const *shown,
                             size_t n, char *err, size_t errlen);
/* Parquet files names[0..n) in the store r (taken over: closed with the
 * source, also on failure), read by byte ranges without a disk cache: the
 * footers at the open (a few requests a file, many files in flight), then
 * each row group's chunks of the columns read, fetched as one unit at the
 * first read of the row group and kept in a bounded memory LRU (parquet.c,
 * docs/remote.md), and with prm->cache_dir also in the disk cache (each
 * unit an entry). sizes (NULL: none) are the listing's, which the files
 * must have; prm (may be NULL) gives the cache and the cancel flag. Errors name the
 * file's URL: STK_ENOENT, STK_EIO, STK_EFORMAT, STK_ENOMEM... */
/* The remote units' memory bound (PQ_UNIT_BYTES; tests make it smaller). */
extern size_t stk__parquet_unit_bytes;
int stk__source_parquet_open_remote(stk__source *s, struct stk__remote *r, const char *const *names,
                                    const uint64_t *sizes, size_t n, const stk__source_params *prm,
                                    char *err, size_t errlen);
/* Parquet parsing on a memory buffer (fuzz entry point): the footer, the
 * schema and row groups, then every row of every field read through the
 * reader's own path (pages, levels, dictionaries, codecs) and its record
 * split. STK_OK, STK_EFORMAT/STK_EUNSUPPORTED/STK_EEMPTY/STK_ENOMEM, or
 * STK_EINVAL if the reader's record does not split (a parser bug). */
int stk__parquet_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                              size_t errlen);
/* CRC32C (Castagnoli) of n bytes, as TFRecord's framing uses it (unmasked). */
uint32_t stk__crc32c(const void *data, size_t n);
/* The same by the table alone, never the CPU's instruction (tests compare). */
uint32_t stk__crc32c_table(const void *data, size_t n);
/* TFRecord parsing on a memory buffer (fuzz entry point): walks the framing
 * of one file's bytes, checks the CRCs, scans every Example's features and
 * splits each record into its fields (a data CRC mismatch does not stop
 * the parse), checking each lies inside it.
 * STK_OK, STK_EFORMAT/STK_EUNSUPPORTED/STK_ENOMEM, or STK_EINVAL if a field
 * does not lie inside its record (a parser bug). */
int stk__tfrecord_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                               size_t errlen);

/* Tar parsing on a memory buffer (fuzz entry point): walks the headers and
 * groups samples, then checks every entry lies inside buf, the index passes
 * the cache's checks, and the fields grouping (every field selected) gives
 * ranges and refs inside buf. Returns STK_OK, STK_EFORMAT, STK_ENOMEM, or
 * STK_EINVAL if a check fails (a parser bug). */
int stk__tar_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                          size_t errlen);
/* MDS parsing on a memory buffer (fuzz entry point): the input is a u32
 * (little-endian) length, that many bytes of index.json, then the bytes of
 * the index's first shard; parses the index, the shard's offsets table and
 * splits every record into its fields, checking each lies inside it.
 * STK_OK, STK_EFORMAT/STK_EUNSUPPORTED/STK_EEMPTY/STK_ENOMEM, or STK_EINVAL
 * if a field does not lie inside its record (a parser bug). */
int stk__mds_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                          size_t errlen);

/* LitData parsing on a memory buffer (fuzz entry point): a u32
 * (little-endian) length, that many bytes of index.json, then the bytes of
 * the index's first chunk (decompressed); parses the index (config, the
 * pytree spec, serializer names), the chunk's offsets table and splits
 * every item into its leaves, checking each lies inside it. STK_OK,
 * STK_EFORMAT/STK_EUNSUPPORTED/STK_EEMPTY/STK_ENOMEM, or STK_EINVAL if a
 * field does not lie inside its item (a parser bug). */
int stk__litdata_parse_buffer(const uint8_t *buf, size_t n, uint64_t *samples, char *err,
                              size_t errlen);

/* ---- Helpers shared by readers (common.c) ------------------------------ */
/* pread exactly n bytes at off. STK_EIO with reason (short read = truncated). */
int stk__pread_full(int fd, void *buf, size_t n, uint64_t off, char *err, size_t errlen);
/* Same, from fd, or when fd < 0 from path opened for this read only (a
 * reader with many shards keeps no descriptor per shard). */
int stk__pread_at(int fd, const char *path, void *buf, size_t n, uint64_t off, char *err,
                  size_t errlen);
/* The shard holding sample i: the last k with s->shard_first[k] <= i. */
size_t stk__source_shard_of(const stk__source *s, uint64_t i);
/* Writes exactly n bytes. */
int stk__write_full(int fd, const void *buf, size_t n);
/* fsyncs the directory holding path, so a rename in it is durable. */
void stk__fsync_parent(const char *path);

/* Where a reader caches the index it built of a file (tar, TFRecord): beside
 * it as FILE.stkidx, or (beside false) under $XDG_CACHE_HOME/stoker/KIND/
 * (default ~/.cache/stoker/KIND/), named by a hash of the file's absolute
 * path. STK_EIO when neither the path resolves nor a cache home is known. */
int stk__index_cache_path(const char *file, const char *kind, bool beside, char *out, size_t n);
/* Makes the directories above file (errors ignored: the write that follows
 * reports them). */
void stk__mkdirs_for(const char *file);

/* Reads a whole file of at most limit bytes (an index.json) into *text,
 * NUL-terminated (the caller frees it), *len its length. Errors name shown:
 * STK_ENOENT, STK_EIO, STK_ETOOBIG, STK_ENOMEM. */
int stk__read_text(const char *path, const char *shown, size_t limit, char **text, size_t *len,
                   char *err, size_t errlen);
/* Reads a whole file into a sink (open, fstat, read, close): the shared helper
 * for sources whose samples are files. */
int stk__read_file(const char *path, stk__sink *sink, uint8_t **data, size_t *len, char *err,
                   size_t errlen);

#endif
