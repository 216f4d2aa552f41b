/*
 * remote.c -- the transfer engine (one I/O thread over a libcurl multi handle)
 * and opening and closing a store. URLs are parsed in url.c, listings in
 * s3list.c. See remote.h.
 *
 * S3 requests are signed by libcurl (CURLOPT_AWS_SIGV4). libcurl 7.88 needs
 * three things from its caller for the signature to match what the server
 * computes: the `x-amz-content-sha256: UNSIGNED-PAYLOAD` header, a query
 * string already sorted by name and percent-encoded (RFC 3986, '/' as %2F),
 * and object keys percent-encoded except unreserved characters and '/'.
 */
#include "io/remote_impl.h"
#include "io/file.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------ */

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init_rc;
static void curl_init_once(void)
{
    g_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- the transfer engine ------------------------------------------------- */

static uint64_t rng_next(stk__remote *r)
{
    r->rng = r->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return stk__mix64(r->rng);
}

/* Writes n body bytes of an fd destination at their place in the file (a
 * ranged request's bytes at off + got) and moves the request's high-water
 * mark; false after a write error (the attempt ends, final). */
static bool write_fd(stk__req *q, const char *p, size_t n)
{
    uint64_t base = q->len ? q->off : 0;
    size_t done = 0;
    while (done < n) {
        ssize_t w = stk__pwrite(q->fd, p + done, n - done, (off_t)(base + q->got + done));
        if (w <= 0) {
            q->write_errno = w < 0 ? errno : EIO;
            stk__fmt(q->err, sizeof q->err, "cannot write the download: %s",
                     strerror(q->write_errno));
            q->retry_after_s_ = -2;
            return false;
        }
        done += (size_t)w;
    }
    uint64_t hw = q->got + n;
    if (hw > atomic_load_explicit(&q->written, memory_order_relaxed)) {
        atomic_store_explicit(&q->written, hw, memory_order_release);
        if (q->progress)
            q->progress(q, q->ctx);
    }
    return true;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
    stk__req *q = ud;
    size_t n = sz * nm;
    long st = 0;
    curl_easy_getinfo((CURL *)q->easy_, CURLINFO_RESPONSE_CODE, &st);
    if (st >= 300 || st < 200) {
        size_t room = sizeof q->ebody_ - 1 - q->ebody_len_;
        size_t k = n < room ? n : room;
        memcpy(q->ebody_ + q->ebody_len_, p, k);
        q->ebody_len_ += k;
        q->ebody_[q->ebody_len_] = '\0';
        return n;
    }
    if (q->len && st == 200 && q->off != 0) {
        stk__fmt(q->err, sizeof q->err,
                 "the server ignored the byte range (HTTP 200 instead of 206); it must support "
                 "Range requests");
        q->retry_after_s_ = -2; /* final */
        return 0;
    }
    bool to_fd = q->fd >= 0 && !q->buf;
    if (q->len) {
        uint64_t room = q->len - q->got;
        if (n > room) {
            if (st == 200 && q->off == 0 && room) {
                /* A server that sends the whole object: keep what was asked. */
                if (to_fd && !write_fd(q, p, (size_t)room))
                    return 0;
                if (!to_fd)
                    memcpy(q->buf + q->got, p, (size_t)room);
                q->got += room;
            }
            if (st == 200 && q->off == 0) {
                q->retry_after_s_ = -3; /* complete: stop the transfer */
                return 0;
            }
            stk__fmt(q->err, sizeof q->err, "the server sent more bytes than the range asked for");
            q->retry_after_s_ = -2;
            return 0;
        }
        if (!to_fd)
            memcpy(q->buf + q->got, p, n);
        else if (!write_fd(q, p, n))
            return 0;
    } else if (to_fd) {
        if (!write_fd(q, p, n))
            return 0;
    } else {
        if (q->got + n > q->max_bytes) {
            stk__fmt(q->err, sizeof q->err, "object is larger than the %zu-byte limit",
                     q->max_bytes);
            q->retry_after_s_ = -4;
            return 0;
        }
        size_t cap = q->body ? (size_t)q->total : 0;
        if (q->got + n + 1 > cap) {
            size_t nc = cap ? cap * 2 : 65536;
            while (nc < q->got + n + 1)
                nc *= 2;
            if (nc > q->max_bytes + 1)
                nc = q->max_bytes + 1;
            uint8_t *b = stk__realloc(q->body, nc);
            if (!b) {
                q->retry_after_s_ = -5;
                return 0;
            }
            q->body = b;
            q->total = nc; /* capacity until done */
        }
        memcpy(q->body + q->got, p, n);
    }
    q->got += n;
    return n;
}

/* The slowest average rate an attempt may keep beyond its first
 * fetch_timeout seconds (docs/remote.md "Faults"). */
#define MIN_RATE (16u * 1024u)

/* libcurl's progress callback: ends an attempt past its deadline, which is
 * fetch_timeout seconds plus one second per MIN_RATE bytes of the body
 * (its Content-Length once known, else the bytes received so far). The
 * stall rule (less than 1 KiB/s for fetch_timeout seconds) alone lets a
 * server trickling just above 1 KiB/s hold a request slot for hours. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)ultotal;
    (void)ulnow;
    stk__req *q = ud;
    uint64_t bytes = (uint64_t)(dltotal > dlnow ? dltotal : dlnow);
    uint64_t limit_ns = (uint64_t)q->timeout_s_ * 1000000000ULL + bytes / MIN_RATE * 1000000000ULL +
                        bytes % MIN_RATE * (1000000000ULL / MIN_RATE);
    uint64_t el = stk__now_ns() - q->t0_;
    if (el <= limit_ns)
        return 0;
    if (dlnow == 0 && dltotal <= 0)
        stk__fmt(q->err, sizeof q->err, "no answer in %.1f s (fetch_timeout)", (double)el * 1e-9);
    else
        stk__fmt(q->err, sizeof q->err,
                 "too slow: %llu of %s%llu bytes in %.1f s (the deadline of an attempt is "
                 "fetch_timeout, %u s, plus 1 s per %u KiB)",
                 (unsigned long long)dlnow, dltotal > 0 ? "" : "at least ",
                 (unsigned long long)(dltotal > 0 ? dltotal : dlnow), (double)el * 1e-9,
                 q->timeout_s_, MIN_RATE / 1024u);
    q->retry_after_s_ = -6; /* retried like a stall */
    return 1;
}

static int setup_easy(stk__remote *r, stk__req *q)
{
    CURL *e = q->easy_;
    if (!e) {
        if (!(e = curl_easy_init()))
            return STK_ENOMEM;
        q->easy_ = e;
    } else {
        curl_easy_reset(e);
    }
    curl_slist_free_all(q->hdrs_);
    q->hdrs_ = NULL;
    char range[96];
    struct curl_slist *h = NULL, *t;
    /* The credentials' current snapshot, held until libcurl has copied it. */
    stk__cred *k = r->sigv4 ? stk__creds_acquire(r->creds) : NULL;
    if (q->len) {
        stk__fmt(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)q->off,
                 (unsigned long long)(q->off + q->len - 1));
        if (!(t = curl_slist_append(h, range)))
            goto nomem;
        h = t;
    }
    if (k) {
        if (!(t = curl_slist_append(h, "x-amz-content-sha256: UNSIGNED-PAYLOAD")))
            goto nomem;
        h = t;
        if (k->token) {
            size_t n = strlen(k->token) + 32;
            char *line = stk__malloc(n);
            if (!line)
                goto nomem;
            stk__fmt(line, n, "x-amz-security-token: %s", k->token);
            t = curl_slist_append(h, line);
            memset(line, 0, n);
            stk__free(line);
            if (!t)
                goto nomem;
            h = t;
        }
    }
    q->hdrs_ = h;
    curl_easy_setopt(e, CURLOPT_URL, q->url_);
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    if (h)
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (r->cafile)
        curl_easy_setopt(e, CURLOPT_CAINFO, r->cafile);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->cerr_);
    q->cerr_[0] = '\0';
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)r->cfg.timeout_s);
    /* The attempt's deadline (deadline_passed) is checked here, at least
     * once a second whether or not bytes arrive. */
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, q);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    /* No CURLOPT_PIPEWAIT: it makes each new request wait for a connection
     * in progress to learn whether it multiplexes, and against a server that
     * accepts and never answers that connection never learns it, so the
     * requests of an open went one at a time, each waiting out the timeout.
     * Requests reuse multiplexed connections once there are some. */
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (r->scheme == SCHEME_HTTP) {
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
        /* A redirect never downgrades https to http (where the data, and a
         * presigned URL's signature, would travel in clear). */
        curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR,
                         strncasecmp(q->url_, "https://", 8) ? "http,https" : "https");
    }
    if (k) {
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, r->sigv4);
        curl_easy_setopt(e, CURLOPT_USERNAME, k->key_id);
        curl_easy_setopt(e, CURLOPT_PASSWORD, k->secret);
        q->cred_gen_ = k->gen;
        stk__creds_release(r->creds, k);
    }
    q->got = 0;
    q->write_errno = 0;
    q->validator[0] = '\0';
    q->ebody_len_ = 0;
    q->ebody_[0] = '\0';
    q->retry_after_s_ = -1;
    q->t0_ = stk__now_ns();
    q->timeout_s_ = r->cfg.timeout_s;
    if (!q->len && !(q->fd >= 0 && !q->buf)) {
        stk__free(q->body);
        q->body = NULL;
        q->total = 0;
    }
    return STK_OK;
nomem:
    stk__creds_release(r->creds, k);
    curl_slist_free_all(h);
    return STK_ENOMEM;
}

static bool retryable_curl(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY: return true;
    default: return false;
    }
}

static uint64_t header_u64(CURL *e, const char *name, bool *ok)
{
    struct curl_header *h = NULL;
    *ok = false;
    if (curl_easy_header(e, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h || !h->value)
        return 0;
    char *end;
    unsigned long long v = strtoull(h->value, &end, 10);
    *ok = end != h->value;
    return v;
}

/* judge() for an attempt that failed below HTTP (res not CURLE_OK): a
 * final error (q->rc set), or 1 to retry. */
static int judge_transport(stk__req *q, CURLcode res)
{
    if (q->retry_after_s_ == -2) {
        q->rc = STK_EIO;
        return q->rc;
    }
    if (q->retry_after_s_ == -4) {
        q->rc = STK_ETOOBIG;
        return q->rc;
    }
    if (q->retry_after_s_ == -5) {
        stk__fmt(q->err, sizeof q->err, "out of memory for the response");
        q->rc = STK_ENOMEM;
        return q->rc;
    }
    if (q->retry_after_s_ == -6)
        return 1; /* past the attempt's deadline (on_progress wrote why) */
    const char *detail = q->cerr_[0] ? q->cerr_ : curl_easy_strerror(res);
    switch (res) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        /* The resolver has its own retries; ours would only make a
         * misspelt host take a quarter of a minute to report. */
        stk__fmt(q->err, sizeof q->err,
                 "%s (not retried: check the host name in the URL or the endpoint)", detail);
        return q->rc = STK_EIO;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
        /* A handshake fails the same way each time (a plain-HTTP server,
         * an untrusted or expired certificate, no common protocol). */
        stk__fmt(q->err, sizeof q->err,
                 "TLS connection failed: %s (not retried: a handshake fails the same way "
                 "each time; check that the server speaks https on this port and that its "
                 "certificate is trusted)",
                 detail);
        return q->rc = STK_EIO;
    case CURLE_UNSUPPORTED_PROTOCOL:
        stk__fmt(q->err, sizeof q->err,
                 "%s (a redirect to another protocol is refused, and one from https to "
                 "http always is)",
                 detail);
        return q->rc = STK_EIO;
    default: break;
    }
    stk__fmt(q->err, sizeof q->err, "%s", curl_easy_strerror(res));
    return retryable_curl(res) ? 1 : (q->rc = STK_EIO);
}

/* Evaluates a finished attempt: STK_OK, a final error, or "retry" (1). */
static int judge(stk__remote *r, stk__req *q, CURLcode res)
{
    CURL *e = q->easy_;
    long st = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
    q->status = st;
    char what[256];
    if (res == CURLE_WRITE_ERROR && q->retry_after_s_ == -3)
        res = CURLE_OK; /* we stopped a whole-object reply once we had the range */
    if (res != CURLE_OK)
        return judge_transport(q, res);
    if (st == 200 || st == 206) {
        struct curl_header *vh = NULL;
        if ((curl_easy_header(e, "ETag", 0, CURLH_HEADER, -1, &vh) == CURLHE_OK ||
             curl_easy_header(e, "Last-Modified", 0, CURLH_HEADER, -1, &vh) == CURLHE_OK) &&
            vh && vh->value)
            stk__fmt(q->validator, sizeof q->validator, "%s", vh->value);
        if (q->len) {
            if (q->got != q->len) {
                stk__fmt(q->err, sizeof q->err, "short body: %llu of %llu bytes",
                         (unsigned long long)q->got, (unsigned long long)q->len);
                return 1;
            }
            if (st == 206) {
                struct curl_header *h = NULL;
                if (curl_easy_header(e, "Content-Range", 0, CURLH_HEADER, -1, &h) == CURLHE_OK &&
                    h && h->value) {
                    const char *slash = strchr(h->value, '/');
                    unsigned long long a = 0;
                    if (sscanf(h->value, "bytes %llu-", &a) != 1 || a != q->off) {
                        stk__fmt(q->err, sizeof q->err,
                                 "the server answered a different range (%s) than asked", h->value);
                        q->rc = STK_EIO;
                        return q->rc;
                    }
                    if (slash && slash[1] != '*')
                        q->total = strtoull(slash + 1, NULL, 10);
                }
            } else {
                bool ok;
                uint64_t cl = header_u64(e, "Content-Length", &ok);
                if (ok)
                    q->total = cl;
            }
        } else {
            bool ok;
            uint64_t cl = header_u64(e, "Content-Length", &ok);
            if (ok && cl != q->got) {
                stk__fmt(q->err, sizeof q->err, "short body: %llu of %llu bytes",
                         (unsigned long long)q->got, (unsigned long long)cl);
                return 1;
            }
            q->total = q->got;
            if (q->body)
                q->body[q->got] = '\0';
        }
        q->rc = STK_OK;
        return STK_OK;
    }
    char s3[384];
    stk__s3_error_text(q->ebody_, s3, sizeof s3);
    stk__fmt(what, sizeof what, "HTTP %ld%s", st, s3);
    stk__fmt(q->err, sizeof q->err, "%s", what);
    bool ok;
    uint64_t ra = header_u64(e, "Retry-After", &ok);
    if (ok)
        q->retry_after_s_ = (long)(ra > 600 ? 600 : ra);
    if ((st == 400 || st == 403) && r->sigv4 && stk__creds_expired_error(q->ebody_)) {
        /* Expired credentials: the I/O thread reads the chain again and
         * retries once (2); a second refusal is final. */
        if (!q->cred_retried_)
            return 2;
        stk__fmt(q->err, sizeof q->err,
                 "%s (the credentials expired, and those the credential "
                 "chain gave again were refused too)",
                 what);
        q->rc = STK_EIO;
        return q->rc;
    }
    if (st == 408 || st == 429 || st >= 500 || strstr(s3, "SlowDown"))
        return 1;
    if (st == 404) {
        q->rc = STK_ENOENT;
        return q->rc;
    }
    if ((st == 401 || st == 403) && r->scheme == SCHEME_HTTP)
        stk__fmt(q->err, sizeof q->err,
                 "%s (access denied: the web server %s; give user:password@ in the URL, or "
                 "a presigned URL, that it accepts)",
                 what, st == 401 ? "asks for HTTP authentication" : "refuses this URL");
    else if (st == 401 || st == 403)
        stk__fmt(q->err, sizeof q->err, "%s (access denied: %s)", what,
                 r->sigv4 ? "check the credentials, region and endpoint"
                          : "the request went unsigned, as no S3 credentials were found "
                            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in "
                            "~/.aws/credentials); this bucket needs them");
    if (st == 416)
        stk__fmt(q->err, sizeof q->err,
                 "%s (range not satisfiable: the object is shorter than "
                 "its index says)",
                 what);
    q->rc = STK_EIO;
    return q->rc;
}

static void finish_locked(stk__remote *r, stk__req *q)
{
    q->state_ = Q_DONE;
    if (q->rc)
        atomic_fetch_add_explicit(&r->n_failures, 1, memory_order_relaxed);
}

static void hedge_drop(stk__remote *r, stk__req *h);
static void hedge_cancel(stk__remote *r, stk__req *h);

static void complete(stk__remote *r, stk__req *q)
{
    if (q->hedge_of_) {
        /* A hedge that lost, failed or could not start: it has no caller. */
        hedge_drop(r, q);
        return;
    }
    if (q->hedge_)
        hedge_cancel(r, q->hedge_); /* q answered (or failed for good) first */
    /* done callbacks run without the engine lock; waiters are woken after. */
    void (*cb)(stk__req *, void *) = q->done;
    void *ctx = q->ctx;
    if (q->easy_) {
        curl_easy_cleanup(q->easy_);
        q->easy_ = NULL;
    }
    curl_slist_free_all(q->hdrs_);
    q->hdrs_ = NULL;
    stk__free(q->url_);
    q->url_ = NULL;
    pthread_mutex_lock(&r->lock);
    finish_locked(r, q);
    pthread_cond_broadcast(&r->cond_done);
    pthread_mutex_unlock(&r->lock);
    if (cb)
        cb(q, ctx);
}

static void start_one(stk__remote *r, stk__req *q)
{
    int rc = setup_easy(r, q);
    if (rc == STK_OK && curl_multi_add_handle(r->multi, q->easy_) != CURLM_OK)
        rc = STK_ENOMEM;
    if (rc) {
        q->rc = rc;
        stk__fmt(q->err, sizeof q->err, "cannot start the request: out of memory");
        pthread_mutex_lock(&r->lock);
        r->active--;
        pthread_mutex_unlock(&r->lock);
        atomic_fetch_sub_explicit(&r->n_inflight, 1, memory_order_relaxed);
        complete(r, q);
        return;
    }
    q->attempts++;
    q->anext_ = r->act;
    r->act = q;
    atomic_fetch_add_explicit(&r->n_requests, 1, memory_order_relaxed);
}

/* Unlinks q from the I/O thread's list of requests in the multi handle. */
static void act_remove(stk__remote *r, stk__req *q)
{
    for (stk__req **pp = &r->act; *pp; pp = &(*pp)->anext_)
        if (*pp == q) {
            *pp = q->anext_;
            break;
        }
    q->anext_ = NULL;
}

/* A request refused for an expired token (judge gave 2): reads the chain
 * again (unless another request did since q was signed) and queues q again at
 * once, outside the retry budget, or fails it with the reason. Returns what
 * io_main does next: 0 (queued or failed here) or the judge's verdict. */
static int cred_retry(stk__remote *r, stk__req *q)
{
    char why[320];
    if (stk__creds_refresh(r->creds, q->cred_gen_, true, why, sizeof why)) {
        char last[sizeof q->err];
        stk__fmt(last, sizeof last, "%s", q->err);
        stk__fmt(q->err, sizeof q->err, "%s; %s", last, why);
        q->rc = STK_EIO;
        return q->rc;
    }
    q->cred_retried_ = true;
    atomic_fetch_add_explicit(&r->n_retries, 1, memory_order_relaxed);
    pthread_mutex_lock(&r->lock);
    r->active--;
    q->not_before_ = 0;
    q->state_ = Q_WAITING_RETRY;
    q->next_ = r->retry;
    r->retry = q;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

/* ---- the request governor ------------------------------------------------- */

#define GOV_BURST 16.0 /* requests that may start at once after an idle spell */

/* Refills the bucket; true (one token taken) when a request may start now,
 * else false with *next_due lowered to when one will. I/O thread. */
static bool gov_take(stk__remote *r, uint64_t now, uint64_t *next_due)
{
    if (r->rate_cfg <= 0)
        return true;
    double dt = (double)(now - r->tok_ns) / 1e9;
    r->tok_ns = now;
    if (now - r->last_cut_ns > 1000000000ULL && r->rate_now < r->rate_cfg) {
        r->rate_now += r->rate_cfg / 50 * dt;
        if (r->rate_now > r->rate_cfg)
            r->rate_now = r->rate_cfg;
    }
    r->tokens += r->rate_now * dt;
    if (r->tokens > GOV_BURST)
        r->tokens = GOV_BURST;
    atomic_store_explicit(&r->n_rate, (uint64_t)r->rate_now, memory_order_relaxed);
    if (r->tokens >= 1) {
        r->tokens -= 1;
        return true;
    }
    uint64_t due = now + (uint64_t)((1 - r->tokens) / r->rate_now * 1e9) + 1;
    if (due < *next_due)
        *next_due = due;
    return false;
}

/* A throttling answer: halve the budget (once per 100 ms: the answers of
 * one burst are one signal). I/O thread. */
static void gov_cut(stk__remote *r)
{
    atomic_fetch_add_explicit(&r->n_throttled, 1, memory_order_relaxed);
    uint64_t now = stk__now_ns();
    if (r->rate_cfg <= 0 || now - r->last_cut_ns < 100000000ULL)
        return;
    r->last_cut_ns = now;
    r->rate_now = r->rate_now / 2 < 1 ? 1 : r->rate_now / 2;
    atomic_store_explicit(&r->n_rate, (uint64_t)r->rate_now, memory_order_relaxed);
}

/* ---- hedged requests ------------------------------------------------------- */

/* A request still running after hedge_mult x the p95 latency of recent
 * requests is sent again, and the first of the two to answer completes it:
 * the other is cancelled (its connection closed). A slow disk or a busy
 * server behind an object store delays a few requests in a hundred by many
 * times the usual latency ("The Tail at Scale", Dean and Barroso, 2013); a
 * reader that consumes in order waits for the slowest of them, so one
 * straggler in a window stalls every worker.
 *
 * Bounds: one hedge a request; hedges are at most HEDGE_PCT % of the
 * requests sent and at most an eighth of the concurrency at once; each
 * takes a slot of the concurrency and a token of the governor like any
 * request. Only requests into memory are hedged: a download into a cache
 * file is written in place as it arrives, and two writers of one file would
 * need a second file and a rename to decide between them. */
#define HEDGE_MIN_SAMPLES 20 /* completed requests before the first hedge */
#define HEDGE_PCT         5
/* Below this a delay is the host's scheduling (a loaded machine runs the
 * I/O thread late), not the store's tail: hedging it would only duplicate. */
#define HEDGE_FLOOR_NS 20000000ULL

static unsigned hedge_cap(const stk__remote *r)
{
    return r->cfg.concurrency / 8 ? r->cfg.concurrency / 8 : 1;
}

unsigned stk__remote_hedge_slots(const stk__remote *r)
{
    return r->hedge_mult ? hedge_cap(r) : 0;
}

static bool hedgeable(const stk__req *q)
{
    return !(q->fd >= 0 && !q->buf);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Records a successful request's latency; every 8 records the hedging delay
 * is taken again from the ring's p95. I/O thread. */
static void hedge_record(stk__remote *r, uint64_t us)
{
    if (!r->hedge_mult)
        return;
    r->lat_us[r->lat_pos] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    r->lat_pos = (r->lat_pos + 1) % HEDGE_RING;
    if (r->lat_n < HEDGE_RING)
        r->lat_n++;
    if (++r->lat_new < 8 || r->lat_n < HEDGE_MIN_SAMPLES)
        return;
    r->lat_new = 0;
    uint32_t v[HEDGE_RING];
    memcpy(v, r->lat_us, r->lat_n * sizeof *v);
    qsort(v, r->lat_n, sizeof *v, cmp_u32);
    uint64_t p95 = v[(r->lat_n * 95 - 1) / 100];
    uint64_t d = p95 * 1000u * r->hedge_mult;
    r->hedge_after_ns = d > HEDGE_FLOOR_NS ? d : HEDGE_FLOOR_NS;
}

/* Frees hedge h (not in the multi handle any more) and unlinks it from the
 * request it raced. I/O thread. */
static void hedge_drop(stk__remote *r, stk__req *h)
{
    h->hedge_of_->hedge_ = NULL;
    r->hedges_active--;
    if (h->easy_)
        curl_easy_cleanup(h->easy_);
    curl_slist_free_all(h->hdrs_);
    stk__free(h->url_);
    stk__free(h->buf);
    stk__free(h->body);
    stk__free(h);
}

/* Stops hedge h in flight (the request it raced answered first). */
static void hedge_cancel(stk__remote *r, stk__req *h)
{
    curl_multi_remove_handle(r->multi, h->easy_);
    act_remove(r, h);
    atomic_fetch_add_explicit(&r->n_bytes, h->got, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->n_inflight, 1, memory_order_relaxed);
    pthread_mutex_lock(&r->lock);
    r->active--;
    pthread_mutex_unlock(&r->lock);
    hedge_drop(r, h);
}

/* Sends a hedge for p (a slot and a token already taken for it). Out of
 * memory, it is simply not sent. */
static void hedge_start(stk__remote *r, stk__req *p)
{
    p->hedged_ = true;
    stk__req *h = stk__calloc(1, sizeof *h);
    if (h && p->len)
        h->buf = stk__malloc((size_t)p->len);
    if (h)
        h->url_ = stk__strdup(p->url_);
    if (!h || (p->len && !h->buf) || !h->url_) {
        if (h) {
            stk__free(h->buf);
            stk__free(h->url_);
            stk__free(h);
        }
        pthread_mutex_lock(&r->lock);
        r->active--;
        pthread_mutex_unlock(&r->lock);
        return;
    }
    h->off = p->off;
    h->len = p->len;
    h->max_bytes = p->max_bytes;
    h->fd = -1;
    h->hedge_of_ = p;
    h->state_ = Q_ACTIVE;
    p->hedge_ = h;
    r->hedges_active++;
    atomic_fetch_add_explicit(&r->n_hedges, 1, memory_order_relaxed);
    uint64_t v = atomic_fetch_add_explicit(&r->n_inflight, 1, memory_order_relaxed) + 1;
    if (v > atomic_load_explicit(&r->n_peak, memory_order_relaxed))
        atomic_store_explicit(&r->n_peak, v, memory_order_relaxed);
    start_one(r, h);
}

/* Sends hedges for the requests in flight past the hedging delay, within
 * the bounds; lowers *next_due to when the next one will be due. Before the
 * queue is served: the straggler holds up everything the reader consumes
 * after it. I/O thread. */
static void hedge_scan(stk__remote *r, uint64_t now, uint64_t *next_due)
{
    if (!r->hedge_mult || !r->hedge_after_ns)
        return;
    unsigned cap = hedge_cap(r);
    for (stk__req *q = r->act; q; q = q->anext_) {
        if (q->hedge_of_ || q->hedged_ || !hedgeable(q))
            continue;
        uint64_t due = q->t0_ + r->hedge_after_ns;
        if (due > now) {
            if (due < *next_due)
                *next_due = due;
            continue;
        }
        uint64_t sent = atomic_load_explicit(&r->n_requests, memory_order_relaxed);
        uint64_t hedges = atomic_load_explicit(&r->n_hedges, memory_order_relaxed);
        if (r->hedges_active >= cap || (hedges + 1) * 100 > HEDGE_PCT * (sent - hedges))
            return; /* looked at again as requests complete */
        pthread_mutex_lock(&r->lock);
        bool ok = r->active < r->cfg.concurrency && gov_take(r, now, next_due);
        if (ok)
            r->active++;
        pthread_mutex_unlock(&r->lock);
        if (!ok)
            return;
        hedge_start(r, q); /* puts the hedge at the head of r->act, behind q */
    }
}

/* A hedge ended: when it answered, it completes the request it raced, whose
 * own attempt is stopped (or whose wait for a retry ends); else it goes,
 * leaving the request to its own attempts. I/O thread. */
static void hedge_done(stk__remote *r, stk__req *h, int v)
{
    stk__req *p = h->hedge_of_;
    pthread_mutex_lock(&r->lock);
    r->active--;
    if (v == STK_OK && p->state_ == Q_WAITING_RETRY)
        for (stk__req **pp = &r->retry; *pp; pp = &(*pp)->next_)
            if (*pp == p) {
                *pp = p->next_;
                p->next_ = NULL;
                break;
            }
    pthread_mutex_unlock(&r->lock);
    if (v != STK_OK) {
        hedge_drop(r, h);
        return;
    }
    atomic_fetch_add_explicit(&r->n_hedge_wins, 1, memory_order_relaxed);
    if (p->state_ == Q_ACTIVE) {
        curl_multi_remove_handle(r->multi, p->easy_);
        act_remove(r, p);
        atomic_fetch_add_explicit(&r->n_bytes, p->got, memory_order_relaxed);
        atomic_fetch_sub_explicit(&r->n_inflight, 1, memory_order_relaxed);
        pthread_mutex_lock(&r->lock);
        r->active--;
        pthread_mutex_unlock(&r->lock);
    }
    if (p->len) {
        memcpy(p->buf, h->buf, (size_t)h->len);
    } else {
        stk__free(p->body);
        p->body = h->body;
        h->body = NULL;
    }
    p->got = h->got;
    p->total = h->total;
    p->status = h->status;
    memcpy(p->validator, h->validator, sizeof p->validator);
    p->rc = STK_OK;
    p->err[0] = '\0';
    hedge_drop(r, h);
    complete(r, p);
}

/* Takes queued requests and due retries, up to the concurrency and the
 * governor's budget (io_main). Their list; next_due is lowered to when a
 * retry or a token is due. */
static stk__req *take_due(stk__remote *r, uint64_t now, uint64_t *next_due)
{
    stk__req *take = NULL, **tail = &take;
    for (stk__req **pp = &r->retry; *pp;) {
        stk__req *q = *pp;
        if (q->not_before_ <= now && r->active < r->cfg.concurrency && gov_take(r, now, next_due)) {
            *pp = q->next_;
            q->next_ = NULL;
            *tail = q;
            tail = &q->next_;
            q->state_ = Q_ACTIVE;
            r->active++;
        } else {
            if (q->not_before_ < *next_due)
                *next_due = q->not_before_;
            pp = &q->next_;
        }
    }
    while (r->queue_head && r->active < r->cfg.concurrency && gov_take(r, now, next_due)) {
        stk__req *q = r->queue_head;
        r->queue_head = q->next_;
        if (!r->queue_head)
            r->queue_tail = NULL;
        q->next_ = NULL;
        *tail = q;
        tail = &q->next_;
        q->state_ = Q_ACTIVE;
        r->active++;
    }
    return take;
}

/* One attempt of q has ended with res (io_main): counted, judged, and then
 * retried (backoff with equal jitter), resent with fresh credentials, or
 * completed. */
static void attempt_done(stk__remote *r, CURL *e, CURLcode res)
{
    stk__req *q = NULL;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&q);
    curl_multi_remove_handle(r->multi, e);
    act_remove(r, q);
    atomic_fetch_add_explicit(&r->n_bytes, q->got, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->n_inflight, 1, memory_order_relaxed);
    curl_off_t total_us = 0, first_us = 0;
    curl_easy_getinfo(e, CURLINFO_TOTAL_TIME_T, &total_us);
    curl_easy_getinfo(e, CURLINFO_STARTTRANSFER_TIME_T, &first_us);
    atomic_fetch_add_explicit(&r->n_completed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->n_request_ns, (uint64_t)total_us * 1000u, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->n_first_byte_ns, (uint64_t)first_us * 1000u,
                              memory_order_relaxed);
    int v = judge(r, q, res);
    if (q->status == 503 || q->status == 429)
        gov_cut(r);
    if (v == STK_OK && hedgeable(q))
        hedge_record(r, (uint64_t)total_us);
    if (q->hedge_of_) {
        hedge_done(r, q, v);
        return;
    }
    if (v == 2 && !(v = cred_retry(r, q)))
        return; /* queued again with fresh credentials */
    if (v == 1 && q->attempts <= r->cfg.retries) {
        uint64_t cap = 10000ULL, base = r->cfg.backoff_ms;
        unsigned sh = q->attempts - 1 < 16 ? q->attempts - 1 : 16;
        uint64_t ms = base << sh;
        if (ms > cap)
            ms = cap;
        /* "Equal jitter": half fixed, half random, so retries of many
         * requests that failed together spread out. */
        ms = ms / 2 + rng_next(r) % (ms / 2 + 1);
        if (q->retry_after_s_ > 0 && (uint64_t)q->retry_after_s_ * 1000 > ms)
            ms = (uint64_t)q->retry_after_s_ * 1000;
        atomic_fetch_add_explicit(&r->n_retries, 1, memory_order_relaxed);
        pthread_mutex_lock(&r->lock);
        r->active--;
        q->not_before_ = stk__now_ns() + ms * 1000000ULL;
        q->state_ = Q_WAITING_RETRY;
        q->next_ = r->retry;
        r->retry = q;
        pthread_mutex_unlock(&r->lock);
        return;
    }
    if (v == 1) {
        char last[sizeof q->err];
        stk__fmt(last, sizeof last, "%s", q->err);
        stk__fmt(q->err, sizeof q->err, "failed after %u attempts; last: %s", q->attempts, last);
        q->rc = STK_EIO;
    }
    pthread_mutex_lock(&r->lock);
    r->active--;
    pthread_mutex_unlock(&r->lock);
    complete(r, q);
}

/* Stopping (io_main): everything not done fails as cancelled. */
static void cancel_all(stk__remote *r)
{
    for (;;) {
        pthread_mutex_lock(&r->lock);
        stk__req *q = r->queue_head;
        if (q) {
            r->queue_head = q->next_;
            if (!r->queue_head)
                r->queue_tail = NULL;
        } else if ((q = r->retry)) {
            r->retry = q->next_;
        }
        pthread_mutex_unlock(&r->lock);
        if (!q)
            break;
        q->rc = STK_EIO;
        stk__fmt(q->err, sizeof q->err, "cancelled: the loader is closing");
        complete(r, q);
    }
    while (r->act) {
        stk__req *q = r->act;
        r->act = q->anext_;
        curl_multi_remove_handle(r->multi, q->easy_);
        q->rc = STK_EIO;
        stk__fmt(q->err, sizeof q->err, "cancelled: the loader is closing");
        complete(r, q);
    }
}

static void *io_main(void *arg)
{
    stk__remote *r = arg;
    pthread_setname_np(pthread_self(), "stk-io-0");
    for (;;) {
        uint64_t now = stk__now_ns(), next_due = UINT64_MAX;
        hedge_scan(r, now, &next_due);
        pthread_mutex_lock(&r->lock);
        if (r->stop) {
            pthread_mutex_unlock(&r->lock);
            break;
        }
        stk__req *take = take_due(r, now, &next_due);
        pthread_mutex_unlock(&r->lock);
        /* Credentials about to expire are renewed before they sign more. */
        if (take && r->sigv4 && stk__creds_due(r->creds)) {
            stk__cred *k = stk__creds_acquire(r->creds);
            char why[320];
            if (k)
                (void)stk__creds_refresh(r->creds, k->gen, false, why, sizeof why);
            stk__creds_release(r->creds, k);
        }
        for (stk__req *q = take, *n; q; q = n) {
            n = q->next_;
            q->next_ = NULL;
            uint64_t v = atomic_fetch_add_explicit(&r->n_inflight, 1, memory_order_relaxed) + 1;
            if (v > atomic_load_explicit(&r->n_peak, memory_order_relaxed))
                atomic_store_explicit(&r->n_peak, v, memory_order_relaxed);
            start_one(r, q);
            /* Wake in time to hedge it (hedge_scan). */
            if (r->hedge_after_ns && hedgeable(q) && now + r->hedge_after_ns < next_due)
                next_due = now + r->hedge_after_ns;
        }

        int running = 0;
        uint64_t t0 = stk__now_ns();
        curl_multi_perform(r->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(r->multi, &left)))
            if (m->msg == CURLMSG_DONE)
                attempt_done(r, m->easy_handle, m->data.result);
        atomic_fetch_add_explicit(&r->n_busy_ns, stk__now_ns() - t0, memory_order_relaxed);
        int wait_ms = 100;
        if (next_due != UINT64_MAX) {
            uint64_t now2 = stk__now_ns();
            uint64_t d = next_due > now2 ? (next_due - now2) / 1000000ULL + 1 : 0;
            if (d < (uint64_t)wait_ms)
                wait_ms = (int)d;
        }
        curl_multi_poll(r->multi, NULL, 0, wait_ms, NULL);
    }
    cancel_all(r);
    return NULL;
}

void stk__remote_submit(stk__remote *r, stk__req *q)
{
    atomic_store_explicit(&q->written, 0, memory_order_relaxed); /* not yet shared */
    q->rc = STK_OK;
    q->err[0] = '\0';
    q->attempts = 0;
    q->cred_gen_ = 0;
    q->cred_retried_ = false;
    q->got = 0;
    q->status = 0;
    q->next_ = NULL;
    q->easy_ = NULL;
    q->hdrs_ = NULL;
    if (!q->len && !(q->fd >= 0 && !q->buf))
        q->body = NULL;
    if (!q->len)
        q->total = 0;
    q->url_ = q->raw_url ? stk__strdup(q->raw_url) : stk__object_url(r, q->name ? q->name : "");
    if (!q->url_) {
        q->rc = STK_ENOMEM;
        stk__fmt(q->err, sizeof q->err, "out of memory");
        pthread_mutex_lock(&r->lock);
        q->state_ = Q_DONE;
        pthread_cond_broadcast(&r->cond_done);
        pthread_mutex_unlock(&r->lock);
        if (q->done)
            q->done(q, q->ctx);
        return;
    }
    pthread_mutex_lock(&r->lock);
    q->state_ = Q_QUEUED;
    if (r->queue_tail)
        r->queue_tail->next_ = q;
    else
        r->queue_head = q;
    r->queue_tail = q;
    pthread_mutex_unlock(&r->lock);
    curl_multi_wakeup(r->multi);
}

int stk__remote_wait(stk__remote *r, stk__req *q)
{
    pthread_mutex_lock(&r->lock);
    while (q->state_ != Q_DONE)
        pthread_cond_wait(&r->cond_done, &r->lock);
    pthread_mutex_unlock(&r->lock);
    return q->rc;
}

int stk__remote_run(stk__remote *r, stk__req **qs, size_t n)
{
    for (size_t k = 0; k < n; k++)
        stk__remote_submit(r, qs[k]);
    int rc = STK_OK;
    for (size_t k = 0; k < n; k++) {
        int v = stk__remote_wait(r, qs[k]);
        if (v && !rc)
            rc = v;
    }
    return rc;
}

int stk__remote_get_small(stk__remote *r, const char *name, size_t limit, char **out, size_t *len,
                          char *err, size_t errlen)
{
    stk__req q;
    memset(&q, 0, sizeof q);
    q.name = name;
    q.fd = -1;
    q.max_bytes = limit;
    stk__remote_submit(r, &q);
    int rc = stk__remote_wait(r, &q);
    if (rc == STK_OK) {
        if (!q.body && !(q.body = stk__calloc(1, 1)))
            rc = STK_ENOMEM;
        *out = (char *)q.body;
        *len = (size_t)q.got;
        return rc;
    }
    stk__free(q.body);
    if (rc != STK_ENOENT) {
        char where[1024];
        stk__remote_object_display(r, name, where, sizeof where);
        stk__fmt(err, errlen, "%s: %s", where, q.err);
    }
    return rc;
}

void stk__remote_counters_get(const stk__remote *r, stk__remote_counters *c)
{
    stk__remote *m = (stk__remote *)(uintptr_t)r;
    c->requests = atomic_load_explicit(&m->n_requests, memory_order_relaxed);
    c->retries = atomic_load_explicit(&m->n_retries, memory_order_relaxed);
    c->failures = atomic_load_explicit(&m->n_failures, memory_order_relaxed);
    c->bytes = atomic_load_explicit(&m->n_bytes, memory_order_relaxed);
    c->inflight = atomic_load_explicit(&m->n_inflight, memory_order_relaxed);
    c->inflight_peak = atomic_load_explicit(&m->n_peak, memory_order_relaxed);
    c->busy_ns = atomic_load_explicit(&m->n_busy_ns, memory_order_relaxed);
    c->completed = atomic_load_explicit(&m->n_completed, memory_order_relaxed);
    c->request_ns = atomic_load_explicit(&m->n_request_ns, memory_order_relaxed);
    c->first_byte_ns = atomic_load_explicit(&m->n_first_byte_ns, memory_order_relaxed);
    c->throttled = atomic_load_explicit(&m->n_throttled, memory_order_relaxed);
    c->rate = atomic_load_explicit(&m->n_rate, memory_order_relaxed);
    c->hedges = atomic_load_explicit(&m->n_hedges, memory_order_relaxed);
    c->hedge_wins = atomic_load_explicit(&m->n_hedge_wins, memory_order_relaxed);
}

/* ---- open / close ---------------------------------------------------------- */

void stk__remote_close(stk__remote *r)
{
    if (!r)
        return;
    if (r->started) {
        stk__creds_cancel(r->creds); /* a refresh in progress ends now */
        pthread_mutex_lock(&r->lock);
        r->stop = true;
        pthread_mutex_unlock(&r->lock);
        curl_multi_wakeup(r->multi);
        pthread_join(r->th, NULL);
    }
    if (r->multi)
        curl_multi_cleanup(r->multi);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cond_done);
    char *strs[] = {r->display, r->base,     r->self_url, r->basename, r->bucket,
                    r->prefix,  r->list_url, r->region,   r->sigv4,    r->cafile};
    for (size_t k = 0; k < sizeof strs / sizeof *strs; k++)
        stk__free(strs[k]);
    stk__creds_close(r->creds); /* wipes the secrets */
    stk__free(r);
}

int stk__remote_open(stk__remote **out, const char *url, const stk__remote_cfg *cfg, char *err,
                     size_t errlen)
{
    *out = NULL;
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init_rc != CURLE_OK) {
        stk__fmt(err, errlen, "cannot initialise libcurl: %s", curl_easy_strerror(g_curl_init_rc));
        return STK_EUNSUPPORTED;
    }
    stk__remote *r = stk__calloc(1, sizeof *r);
    if (!r)
        return STK_ENOMEM;
    if (pthread_mutex_init(&r->lock, NULL) || pthread_cond_init(&r->cond_done, NULL)) {
        stk__free(r);
        return STK_ENOMEM;
    }
    int rc = STK_OK;
    if (cfg)
        r->cfg = *cfg;
    r->cfg.endpoint = r->cfg.region = NULL; /* not kept: copied where needed */
    if (!r->cfg.concurrency)
        r->cfg.concurrency = STK__FETCH_CONCURRENCY;
    if (!r->cfg.timeout_s)
        r->cfg.timeout_s = 30;
    if (!r->cfg.backoff_ms)
        r->cfg.backoff_ms = 200;
    if (!r->cfg.retries)
        r->cfg.retries = 6;
    else if (r->cfg.retries == UINT32_MAX)
        r->cfg.retries = 0; /* asked for none */
    r->rate_cfg = r->cfg.rate == UINT32_MAX ? 0 : r->cfg.rate ? r->cfg.rate : 5500;
    r->rate_now = r->rate_cfg;
    r->tokens = GOV_BURST;
    r->tok_ns = stk__now_ns();
    r->n_rate = (uint64_t)r->rate_cfg;
    r->hedge_mult = r->cfg.hedge == UINT32_MAX ? 0 : r->cfg.hedge ? r->cfg.hedge : 3;
    r->rng = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)r;
    if (!(r->display = stk__url_display_of(url))) {
        rc = STK_ENOMEM;
        goto out;
    }
    stk__remote_cfg tmp = cfg ? *cfg : (stk__remote_cfg){0};
    if (!strncasecmp(url, "s3://", 5)) {
        r->scheme = SCHEME_S3;
        r->cfg.endpoint = tmp.endpoint;
        r->cfg.region = tmp.region;
        rc = stk__url_parse_s3(r, url, err, errlen);
        r->cfg.endpoint = r->cfg.region = NULL;
    } else if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8)) {
        r->scheme = SCHEME_HTTP;
        rc = stk__url_parse_http(r, url, err, errlen);
    } else {
        stk__fmt(err, errlen,
                 "%s: unsupported URL scheme \"%.*s\": stoker reads http://, https:// and "
                 "s3:// URLs (and local paths, which have no scheme)",
                 r->display, (int)(stk__url_scheme_len(url) - 3), url);
        rc = STK_EUNSUPPORTED;
    }
    if (rc)
        goto out;
    /* A private CA (an internal endpoint, a test server): the variables the
     * AWS tools and curl read. */
    const char *ca = getenv("AWS_CA_BUNDLE");
    if (!ca || !*ca)
        ca = getenv("CURL_CA_BUNDLE");
    if (ca && *ca && !(r->cafile = stk__strdup(ca))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if (!(r->multi = curl_multi_init())) {
        rc = STK_ENOMEM;
        goto out;
    }
    curl_multi_setopt(r->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)r->cfg.concurrency);
    curl_multi_setopt(r->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)r->cfg.concurrency);
    curl_multi_setopt(r->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    if (pthread_create(&r->th, NULL, io_main, r)) {
        stk__fmt(err, errlen, "cannot start the I/O thread: %s", strerror(errno));
        rc = STK_ENOMEM;
        goto out;
    }
    r->started = true;
out:
    if (rc) {
        if (rc == STK_ENOMEM && !err[0])
            stk__fmt(err, errlen, "out of memory opening %s", r->display ? r->display : "URL");
        stk__remote_close(r);
        return rc;
    }
    *out = r;
    return STK_OK;
}
