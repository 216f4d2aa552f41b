/*
 * remote_impl.h -- what the files of the remote store share (not included
 * outside src/io/): the store's state, and the helpers one file defines for
 * the others. remote.c is the transfer engine (one I/O thread over a libcurl
 * multi handle) and open/close; url.c parses dataset URLs, S3 addressing and
 * object names; s3list.c lists a prefix (ListObjectsV2) and reads S3's XML.
 */
#ifndef STK_IO_REMOTE_IMPL_H
#define STK_IO_REMOTE_IMPL_H

#include "io/creds.h"
#include "io/remote.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>

enum { SCHEME_HTTP = 1, SCHEME_S3 = 2 };
enum { Q_QUEUED, Q_ACTIVE, Q_WAITING_RETRY, Q_DONE };
enum { HEDGE_RING = 128 }; /* recent latencies the hedging delay is taken from */

struct stk__remote {
    int scheme;
    char *display;  /* the URL as given, no credentials or query */
    char *base;     /* request URL prefix that object names are appended to */
    char *self_url; /* URL of the root itself (a single object) */
    char *basename; /* last element of the URL's path */
    bool names_object;
    /* S3 */
    char *bucket, *prefix; /* prefix: "" or ends with '/' for a directory */
    char *list_url;        /* bucket URL for ListObjectsV2 */
    char *region, *sigv4;
    stk__creds *creds; /* the S3 credential chain (creds.c); NULL for http(s) */
    char *cafile;      /* AWS_CA_BUNDLE, else CURL_CA_BUNDLE: a CA bundle for https */
    stk__remote_cfg cfg;

    /* engine */
    pthread_mutex_t lock;
    pthread_cond_t cond_done;
    pthread_t th;
    bool started, stop;
    CURLM *multi;
    stk__req *queue_head, *queue_tail; /* Q_QUEUED, FIFO */
    stk__req *retry;                   /* Q_WAITING_RETRY, unordered */
    stk__req *act;                     /* in the multi handle (I/O thread only) */
    unsigned active;
    uint64_t rng;
    /* Counters: relaxed atomics, each independent. */
    _Atomic uint64_t n_requests, n_retries, n_failures, n_bytes, n_busy_ns;
    _Atomic uint64_t n_completed, n_request_ns, n_first_byte_ns;
    _Atomic uint64_t n_inflight, n_peak;
    /* The request governor (I/O thread only, but the counters): a token
     * bucket refilled at rate_now requests a second, rate_now halved on a
     * throttling answer (503, 429: S3's SlowDown) at most every 100 ms and
     * raised by rate_cfg / 50 a second after a second without one
     * (additive increase, multiplicative decrease). rate_cfg 0: no budget. */
    double rate_cfg, rate_now, tokens;
    uint64_t tok_ns, last_cut_ns;
    _Atomic uint64_t n_throttled, n_rate;
    /* Hedged requests (I/O thread only, but the counters): the latencies of
     * the last HEDGE_RING successful requests into memory, in microseconds,
     * and the delay after which a request still running is sent again
     * (hedge_mult x their p95; 0 until enough have completed). */
    unsigned hedge_mult; /* 0: never */
    uint32_t lat_us[HEDGE_RING];
    unsigned lat_n, lat_pos, lat_new;
    uint64_t hedge_after_ns;
    unsigned hedges_active;
    _Atomic uint64_t n_hedges, n_hedge_wins;
};

/* ---- url.c ---- */
/* The length of p's "scheme://" prefix, or 0 when it has none. */
size_t stk__url_scheme_len(const char *p);
/* A copy of s[0..n) / of a + b + c (malloc'd; NULL when out of memory). */
char *stk__dupn(const char *s, size_t n);
char *stk__cat3(const char *a, const char *b, const char *c);
/* The URL without credentials or query, for messages (malloc'd). */
char *stk__url_display_of(const char *url);
/* Fill r's addressing from an http(s):// or s3:// URL (s3: also its
 * credentials and region). */
int stk__url_parse_http(stk__remote *r, const char *url, char *err, size_t errlen);
int stk__url_parse_s3(stk__remote *r, const char *url, char *err, size_t errlen);
/* The request URL of object name (malloc'd). */
char *stk__object_url(const stk__remote *r, const char *name);

/* Every file below the dataset URL of a plain HTTP server, from nginx's
 * autoindex pages (httplist.c): as stk__remote_list_tree. */
int stk__http_list_tree(stk__remote *r, char ***names, uint64_t **sizes, size_t *n, char *err,
                        size_t errlen);

#endif
