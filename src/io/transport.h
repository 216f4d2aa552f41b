/*
 * transport.h -- where a reader's bytes come from, behind one table: local
 * files (through file.h's wrappers, so the I/O-fault sweep reaches every
 * call) or objects in a store over HTTP/S3 (through remote.h's engine). A
 * reader written against this table has one code path for a disk and a
 * bucket; it never asks which it has (the .stk reader, src/source/stk.c).
 *
 * Objects are named relative to the transport's root: a local transport's
 * root is a directory (names "NAME" are "ROOT/NAME") or none (names are
 * paths); a store's root is its dataset URL ("" is the URL itself, a single
 * object).
 *
 * What a caller may rely on, whichever the transport:
 *   - reads are of exact ranges: a range past the end of the object fails
 *     (a local file: "short read ... (file truncated?)"; a store: a short
 *     body), so a caller checks nothing but rc;
 *   - a read that learns the object's size says so (total; a store's
 *     Content-Range): a caller that knew the size from elsewhere compares,
 *     so an object replaced under it fails by name;
 *   - messages (err, display) never hold a URL's credentials or query.
 *
 * Threads: read, get, display and id may be called from any thread at once
 * on one transport and one object (local reads are preads on a shared
 * descriptor; a store's requests go to its engine's queue). open, idle,
 * copy_start/copy_wait and close_obj are the object's owner's, close the
 * transport's owner's, after every read returned.
 */
#ifndef STK_IO_TRANSPORT_H
#define STK_IO_TRANSPORT_H

#include "internal.h"

#include <stdbool.h>

struct stk__remote;

typedef struct stk__transport stk__transport;
typedef struct stk__tobj stk__tobj; /* an open object (the transport's own) */

/* What opening an object learnt. */
typedef struct stk__tinfo {
    bool sized;    /* size is known (a local file's fstat); an object in a
                      store is not sized until a read says (total) */
    uint64_t size; /* bytes, when sized */
    /* Identity: two names of one object give the same pair (a local file's
     * device and inode; a store's object, a hash of its name). */
    uint64_t dev, ino;
} stk__tinfo;

/* One ranged read. The caller fills the "in" fields and owns the struct
 * (and buf) for the call. */
typedef struct stk__trange {
    /* in */
    stk__tobj *obj;
    uint64_t off, len; /* len 0: nothing is read, rc STK_OK */
    uint8_t *buf;      /* len bytes */
    /* out */
    int rc;            /* STK_OK, STK_ENOENT (the object is gone), STK_EIO, STK_ENOMEM */
    uint64_t total;    /* the object's size when this read learnt it, else 0 */
    char version[128]; /* what identifies this version of the object (a store's
                          ETag, else its Last-Modified): "" when none was said */
    char err[384];     /* the reason, without the object's name */
} stk__trange;

/* A whole object copied into a local file (the disk cache's downloads).
 * The caller fills the "in" fields and owns the struct until copy_wait. */
typedef struct stk__tcopy {
    /* in */
    stk__tobj *obj;
    int fd; /* written from offset 0 */
    /* out, after copy_wait */
    int rc;            /* STK_OK, STK_ENOENT, STK_EIO, STK_ENOMEM */
    uint64_t got;      /* bytes written: the object's size */
    char version[128]; /* as for a read: the version the copy is of */
    int write_errno;   /* why writing fd failed (errno), else 0 */
    char err[384];     /* the reason, without the object's name */
    void *impl_;       /* the transport's request in flight */
} stk__tcopy;

typedef struct stk__tp_ops {
    const char *kind; /* "file", "http": a name for messages, never compared */
    /* Reads worth putting in flight at once (1: one after the other gains
     * nothing). Callers batch their reads up to this. */
    unsigned batch;
    /* Opens object name: *out the object, info what the open learnt. A
     * local file is opened and its descriptor kept until idle or close_obj;
     * a store's object costs no request. STK_ENOENT, STK_EIO, STK_ENOMEM
     * with the reason (without the name) in err. */
    int (*open)(stk__transport *t, const char *name, stk__tobj **out, stk__tinfo *info, char *err,
                size_t errlen);
    /* The object will be read only now and then: the transport lets go of
     * what it holds for it (a descriptor), and each later read takes it
     * anew. For a dataset of more files than the process may hold open. */
    void (*idle)(stk__transport *t, stk__tobj *o);
    /* Reads the ranges rs[0..n), all in flight together where the
     * transport can (a store's engine bounds its requests); returns when
     * all are done, each with its own rc and every out field set. */
    void (*read)(stk__transport *t, stk__trange *const *rs, size_t n);
    /* Reads the whole object name, of at most limit bytes, into *out (the
     * caller frees it; NUL-terminated), *len its length. STK_ENOENT when it
     * does not exist (err untouched then), STK_ETOOBIG past limit, STK_EIO,
     * STK_ENOMEM; err names the object. */
    int (*get)(stk__transport *t, const char *name, size_t limit, uint8_t **out, size_t *len,
               char *err, size_t errlen);
    /* Starts copying the whole object c->obj into c->fd, in the
     * background where the transport can (a store: one GET among the
     * engine's requests). STK_OK: copy_wait must follow; else c->rc, the
     * reason in c->err (STK_ENOMEM; STK_EUNSUPPORTED for local files,
     * which are read where they are). */
    int (*copy_start)(stk__transport *t, stk__tcopy *c);
    /* Waits for a started copy and fills c's out fields. */
    void (*copy_wait)(stk__transport *t, stk__tcopy *c);
    /* The name of object name for messages (a path; a URL without secrets). */
    void (*display)(const stk__transport *t, const char *name, char *buf, size_t n);
    /* What identifies object name for the disk cache, across processes: a
     * local file's path; a store's request URL without secrets. */
    void (*id)(const stk__transport *t, const char *name, char *buf, size_t n);
    /* The local file that holds open object o, for readers that open their
     * files by path (tar, MDS, LitData, TFRecord, Parquet): a local file's
     * path; a cached object's entry in the disk cache (pinned while o is
     * open). STK_EUNSUPPORTED where the bytes are in no local file (a
     * store's object: read it through the caching transport). */
    int (*path)(stk__transport *t, stk__tobj *o, char *buf, size_t n);
    void (*close_obj)(stk__transport *t, stk__tobj *o); /* NULL is harmless */
    void (*close)(stk__transport *t);                   /* objects closed first */
} stk__tp_ops;

struct stk__transport {
    const stk__tp_ops *ops;
};

/* Local files under root (NULL: names are paths; copied). STK_ENOMEM. */
int stk__transport_file(stk__transport **out, const char *root);
/* The objects of store r, borrowed: r must outlive the transport (a
 * source closes its store before its reader, so the transport's close
 * never touches r). STK_ENOMEM. */
int stk__transport_remote(stk__transport **out, struct stk__remote *r);
/* ---- the disk cache as a layer over another transport ----------------
 *
 * Objects of the inner transport (a store's), each copied whole into the
 * disk cache (src/cache/cache.h) and read there: opening an object pins its
 * entry when the cache holds this version of it, else downloads it through
 * the inner transport's copy slot (all of a batch at once), or waits while
 * another process downloads it. The entry's key is the inner id, the size
 * and the version (ETag or Last-Modified) a 1-byte ranged read of the
 * object learnt at the open, so an object replaced on the server is never
 * read from a copy of the old one. Reads are preads of the pinned entry;
 * path gives the entry's file; close_obj unpins. get, display and id are
 * the inner transport's (a small object is not worth an entry). */
struct stk__cache;
typedef struct stk__tcache_cfg {
    const char *dir;            /* cache_dir (copied); NULL or "": every open fails */
    uint64_t limit;             /* cache_limit */
    const _Atomic bool *cancel; /* a wait for another process stops when set */
    uint64_t stall_ns;          /* another process's download that writes nothing this
                                   long is taken for hung */
    const char *shown;          /* the dataset, for the no-cache message (copied) */
    const char *what;           /* what is downloaded ("tar shards"), for messages */
} stk__tcache_cfg;
/* The caching transport over inner, which it owns from STK_OK on (closed
 * with it). The cache itself is opened at the first open. STK_ENOMEM. */
int stk__transport_cache(stk__transport **out, stk__transport *inner, const stk__tcache_cfg *cfg);
/* What the objects are, for messages (cfg.what, replaced). */
void stk__tcache_set_what(stk__transport *t, const char *what);
/* Opens the n objects names[] of caching transport t together: one 1-byte
 * read of each in flight at once, then their pins or downloads, all at
 * once. sizes (NULL: none) are what a listing or an index said, named by
 * sizes_from in the message when an object differs. All or nothing: on an
 * error no object is left open and err names the object and the reason. */
int stk__tcache_open(stk__transport *t, const char *const *names, const uint64_t *sizes, size_t n,
                     const char *sizes_from, stk__tobj **objs, char *err, size_t errlen);
/* Takes open object o's pin (a descriptor for stk__cache_unpin), to keep
 * the entry past o's close; -1 when it holds none. */
int stk__tcache_take_pin(stk__transport *t, stk__tobj *o);
/* Takes the cache (NULL when none was opened): its pins taken by
 * stk__tcache_take_pin must not outlive it. Later opens open it anew. */
struct stk__cache *stk__tcache_take_cache(stk__transport *t);

/* Closes t (NULL is harmless). */
static inline void stk__transport_close(stk__transport *t)
{
    if (t)
        t->ops->close(t);
}

/* The copy slots of a transport whose objects are read where they lie
 * (local files, cached copies): copy_start fails c with STK_EUNSUPPORTED and
 * "WHAT is read where it is, never copied"; copy_wait has nothing to wait
 * for. */
int stk__tp_copy_refused(stk__tcopy *c, const char *what);
void stk__tp_copy_wait_none(stk__transport *t, stk__tcopy *c);

#endif
