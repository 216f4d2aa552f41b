/*
 * remote.h -- object storage over HTTP(S) and S3: naming objects, signing,
 * and a transfer engine that runs many ranged GETs at once.
 *
 * A stk__remote is opened from a dataset URL (http://, https://, s3://). It
 * holds the endpoint, the bucket and prefix (S3), the credentials (never
 * printed: messages use stk__remote_display(), which has none), and one I/O
 * thread ("stk-io-0") driving a libcurl multi handle: up to `concurrency`
 * requests in flight over reused connections (HTTP/2 multiplexed where the
 * server offers it), each retried with exponential backoff and jitter on
 * 5xx, 429/SlowDown, resets, stalls and short bodies, honouring Retry-After.
 * Requests start within a rate budget (the governor: a token bucket, halved
 * on 503/429), and a request into memory that runs far past the recent p95
 * latency is sent a second time, the first answer winning (hedging; a caller
 * sees one request either way).
 *
 * Objects are named relative to the dataset root: "" is the root URL itself
 * (a single shard), "train-000000.stk" an object beside it.
 *
 * Threads: stk__remote_submit/wait/run may be called from any thread. A
 * request's done callback runs on the I/O thread with no lock of the engine
 * held; it must not block. Lock order: a caller's lock may be held while
 * submitting (the engine's lock is innermost).
 */
#ifndef STK_IO_REMOTE_H
#define STK_IO_REMOTE_H

#include "internal.h"

#include <stdatomic.h>
#include <stdbool.h>

/* Requests in flight by default: 128. At 50 ms from the store that is 2,560
 * ranged reads a second, above what 2 cores decode, so a cold cache's reads
 * by range (the samples a download has not reached yet) and a global order
 * without a cache are less often waiting on the round trip; 64 left a cold
 * run waiting 0.62-0.89 s against 0.44-0.49 s at 128, at the same loader CPU
 * (docs/benchmarks.md, session 5). */
#define STK__FETCH_CONCURRENCY 128u

/* Settings a caller may give (zero = default). */
typedef struct stk__remote_cfg {
    const char *endpoint; /* S3 endpoint URL; else AWS_ENDPOINT_URL(_S3); else AWS */
    const char *region;   /* else AWS_REGION, AWS_DEFAULT_REGION, profile, us-east-1 */
    int addressing;       /* 0 default (path-style with a custom endpoint), 1 path, 2 virtual */
    unsigned concurrency; /* requests in flight (default STK__FETCH_CONCURRENCY) */
    unsigned retries;     /* retries after the first attempt (0: 6; UINT32_MAX: none) */
    unsigned timeout_s;   /* a request that moves < 1 KiB/s for this long is retried (30);
                             an attempt's deadline is this + 1 s per 16 KiB of its body */
    unsigned backoff_ms;  /* first backoff (default 200; doubles, capped at 10 s) */
    unsigned rate;        /* requests a second at most (default 5500, S3's per-prefix GET
                             rate; UINT32_MAX: no budget); halved on throttling answers */
    unsigned hedge;       /* a request into memory still running after this multiple of the
                             recent p95 latency is sent again, the first answer wins
                             (default 3; UINT32_MAX: never) */
} stk__remote_cfg;

typedef struct stk__remote stk__remote;

/* Does path start with a URL scheme ("scheme://")? Any scheme counts, so
 * that one this build does not read (ftp://) is refused by
 * stk__remote_open as such, never looked up as a local path. */
bool stk__is_url(const char *path);
/* The display form of a dataset path for messages and reprs: for a URL, the
 * user:password@ of its authority removed and its query and fragment (a
 * presigned URL's X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token)
 * replaced by "?..."; written into buf and returned. Anything that is not a
 * URL is returned as it is (buf untouched). */
const char *stk__url_display(const char *path, char *buf, size_t n);

/* Parses url, finds credentials and region (S3), starts the I/O thread.
 * STK_EINVAL (bad URL, an invalid S3 bucket name), STK_ENOMEM,
 * STK_EUNSUPPORTED (a scheme other than http, https and s3), with the reason
 * in err (which never holds the URL's credentials or query). */
int stk__remote_open(stk__remote **out, const char *url, const stk__remote_cfg *cfg, char *err,
                     size_t errlen);
/* Cancels requests in flight (their rc becomes STK_EIO "cancelled"), stops
 * the thread, frees r. NULL is harmless. */
void stk__remote_close(stk__remote *r);

/* The dataset URL as given, without credentials: for messages. */
const char *stk__remote_display(const stk__remote *r);
/* Does the URL name one object (ends in a file name with an extension)
 * rather than a directory/prefix? */
bool stk__remote_names_object(const stk__remote *r);
/* The last path element of the URL ("" for a bucket root). */
const char *stk__remote_basename(const stk__remote *r);
/* Writes the displayable URL of object name into buf. */
void stk__remote_object_display(const stk__remote *r, const char *name, char *buf, size_t n);
/* Writes what identifies object name for the disk cache into buf: its
 * request URL with the endpoint (s3://), or its display URL (http), never
 * credentials or a query. */
void stk__remote_object_id(const stk__remote *r, const char *name, char *buf, size_t n);

/* One request. The caller fills the "in" fields and owns the struct (and buf)
 * until it completes. */
typedef struct stk__req stk__req;
struct stk__req {
    /* in */
    const char *name;    /* object, relative to the root (copied at submit) */
    const char *raw_url; /* instead of name: a full request URL (copied) */
    uint64_t off, len;   /* byte range; len 0 = the whole object */
    uint8_t *buf;        /* memory destination: len bytes (ranged), or NULL: the
                            engine allocates up to max_bytes (whole object) */
    size_t max_bytes;    /* limit for a whole object kept in memory */
    int fd;              /* >= 0 (and buf NULL): write the body to fd, at offset 0, or
                            with a range at its own place (off..off+len): several
                            ranged requests may fill one file in parallel */
    void (*done)(stk__req *q, void *ctx);
    void *ctx;
    /* Optional, fd destinations: called on the I/O thread (no engine lock
     * held) after `written` grew, so a reader waiting for bytes of a
     * download in progress can look again. */
    void (*progress)(stk__req *q, void *ctx);
    /* out */
    int rc;         /* STK_OK, STK_ENOENT (404), STK_EIO, STK_ETOOBIG, STK_ENOMEM */
    long status;    /* last HTTP status */
    uint64_t got;   /* body bytes received */
    uint64_t total; /* object size when the server said (Content-Range/Length) */
    uint8_t *body;  /* engine-allocated body (whole object in memory); caller frees */
    unsigned attempts;
    char validator[128]; /* the response's ETag, else its Last-Modified ("" when neither) */
    int write_errno;     /* fd destination: why writing the body failed (errno), else 0 */
    /* fd destination: bytes [0, written) of the object (of the range, from
     * off, for a ranged request) are in the file, the most any attempt of
     * this request has written (a retry rewrites them from the start; a changed object fails the
     * request, and a reader of bytes written before that checks them by checksum). Written by the
     * I/O thread, read by any (release/acquire: the bytes are in the file before the mark says so).
     */
    _Atomic uint64_t written;
    char err[384];
    /* engine private */
    char *url_;
    void *easy_;
    uint64_t not_before_;
    uint64_t attempt_got_;
    int state_;
    long retry_after_s_;
    struct curl_slist *hdrs_;
    char ebody_[512];    /* start of an error response's body (S3's XML error) */
    uint64_t cred_gen_;  /* generation of the credentials that signed it */
    bool cred_retried_;  /* already retried once after an expired token */
    bool hedged_;        /* a hedge was sent for it (one a request at most) */
    stk__req *hedge_;    /* its hedge in flight, or NULL */
    stk__req *hedge_of_; /* for a hedge (engine-allocated): the request it races */
    char cerr_[256];     /* libcurl's detail of a failed attempt (CURL_ERROR_SIZE) */
    uint64_t t0_;        /* the current attempt's start (stk__now_ns) */
    unsigned timeout_s_;
    size_t ebody_len_;
    stk__req *next_, *anext_;
};

/* Queues q (its rc is undefined until done). Never blocks on the network. */
void stk__remote_submit(stk__remote *r, stk__req *q);
/* Blocks until q is done; returns q->rc. Only for requests without a done
 * callback. */
int stk__remote_wait(stk__remote *r, stk__req *q);
/* Submits n requests and waits for all; returns the first failure's rc (in
 * array order) or STK_OK. */
int stk__remote_run(stk__remote *r, stk__req **qs, size_t n);
/* Convenience: GET a whole small object into a NUL-terminated buffer.
 * STK_ENOENT when it does not exist (err untouched then). */
int stk__remote_get_small(stk__remote *r, const char *name, size_t limit, char **out, size_t *len,
                          char *err, size_t errlen);

/* Lists the objects directly under the dataset prefix (S3 ListObjectsV2 with
 * continuation tokens; names relative to the prefix, sizes in bytes).
 * STK_EUNSUPPORTED for plain HTTP (no listing). The arrays are the caller's
 * to free with stk__remote_list_free. */
int stk__remote_list(stk__remote *r, char ***names, uint64_t **sizes, size_t *n, char *err,
                     size_t errlen);
/* The same for every object below the prefix, in subfolders too (names
 * "class/x.jpg"); for plain HTTP, every file below the URL as nginx's
 * autoindex pages (HTML with exact sizes, or JSON) list them. */
int stk__remote_list_tree(stk__remote *r, char ***names, uint64_t **sizes, size_t *n, char *err,
                          size_t errlen);
void stk__remote_list_free(char **names, uint64_t *sizes, size_t n);

/* Transfer counters (relaxed; for stats). */
typedef struct stk__remote_counters {
    uint64_t requests, retries, failures, bytes, inflight, inflight_peak, busy_ns;
    uint64_t completed, request_ns, first_byte_ns; /* attempts ended, their summed times */
    uint64_t throttled;          /* answers 503 / 429 (SlowDown): each cut the rate budget */
    uint64_t rate;               /* the rate budget now, requests a second (0: none) */
    uint64_t hedges, hedge_wins; /* hedged requests sent; those that answered first */
} stk__remote_counters;
void stk__remote_counters_get(const stk__remote *r, stk__remote_counters *c);
/* The most hedges in flight at once (0: hedging off); each holds a copy of
 * its request's buffer until it ends (for the memory bound). */
unsigned stk__remote_hedge_slots(const stk__remote *r);

/* ---- Pieces shared with tests -------------------------------------------- */
/* Percent-encodes s (RFC 3986: unreserved kept; '/' kept when keep_slash). */
void stk__pct_encode(const char *s, bool keep_slash, char *out, size_t n);
/* Decodes XML character entities in place (&amp; &lt; &gt; &quot; &apos;
 * &#N; &#xN;). */
void stk__xml_unescape(char *s);
/* Parses one ListObjectsV2 page, body[0..len) (it ends early at a NUL byte):
 * appends each <Contents> whose <Key> is under prefix (the name without the
 * prefix; keys equal to the prefix are left out) and its <Size> to
 * names/sizes (n used, cap allocated; grown with stk__grow, freed with
 * stk__remote_list_free even after an error). Sets *more from <IsTruncated>
 * and *token (the caller frees it) to <NextContinuationToken> when more,
 * else NULL. STK_EFORMAT (truncated without a token), STK_ENOMEM; the reason
 * in err. */
int stk__s3_list_page(const char *body, size_t len, const char *prefix, char ***names,
                      uint64_t **sizes, size_t *n, size_t *cap, bool *more, char **token, char *err,
                      size_t errlen);
/* Parses one nginx autoindex page (HTML, or JSON from autoindex_format
 * json; body NUL-terminated, len bytes) of the dataset's root: its files
 * (names, sizes: the caller frees them with stk__remote_list_free) and how
 * many subdirectories it links. STK_EFORMAT (a file without a size in
 * bytes, a JSON page that is no array), STK_EUNSUPPORTED (not an index
 * page), STK_ENOMEM; the reason in why. */
int stk__autoindex_page(const char *body, size_t len, char ***names, uint64_t **sizes, size_t *n,
                        size_t *ndirs, char *why, size_t wn);
/* Writes " Code: Message" from an S3 XML error body (NUL-terminated) into
 * out, or "" when it has no <Code>. */
void stk__s3_error_text(const char *body, char *out, size_t n);

#endif
