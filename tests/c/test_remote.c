/*
 * test_remote.c -- remote .stk datasets through the fetch stage, under the
 * sanitizers like every C test. The test runs its own small HTTP/1.1 server
 * on loopback (keep-alive, single byte ranges, and injected faults: 503 with
 * Retry-After, a reset mid-body, a truncated body, a stall, a permanent 500),
 * so every path of the transfer engine, the fetch stage and the disk cache
 * runs in-process where ASan and TSan see it. tests/py/test_remote.py covers
 * real servers (nginx, an S3 server that checks signatures).
 */
#include "testutil.h"

#include "../../src/cache/cache.h"
#include "../../src/fetch/fetch.h"
#include "../../src/io/file.h"
#include "../../src/io/remote.h"
#include "../../src/io/transport.h"
#include "../../src/schedule/mix.h"
#include "../../src/source/manifest.h"
#include "../../src/source/source.h"
#include "../../src/source/stkformat.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

long stk__alloc_live(void);
void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

/* ---- the server ------------------------------------------------------------ */

enum {
    F_NONE,
    F_503_FIRST,
    F_RESET_FIRST,
    F_TRUNC_FIRST,
    F_STALL,
    F_500_PAYLOAD,
    F_SHARD_STATUS, /* part-00000K.stk: whole GETs and payload ranges answer HTTP 410 + K */
    F_WHOLE_SHORT,  /* whole GETs of a .tar send its first half (as if replaced by a smaller one) */
    F_401,
    F_HANG,
    F_500_WHOLE_FIRST, /* each shard's first whole-object GET fails (500) */
    F_500_WHOLE_STALL, /* whole-object GETs fail (500), payload ranges hang */
    F_RATE,            /* over g_rate_limit requests a second (1 s windows): 503 */
    F_SLOW_WHOLE,      /* downloads of a .stk trickle (~1.3 MB/s per request) */
    F_CUT_WHOLE,       /* ... and each shard's second part trickles its first half
                          slowly (~0.3 s), then the connection is reset */
    F_CUT_PART_ONCE,   /* F_CUT_WHOLE's cut, once per shard (the retry succeeds) */
    F_STALL_SOME       /* every 50th payload range waits g_stall_ms, then is answered */
};

/* F_STALL_SOME's stall, milliseconds. */
static unsigned g_stall_ms;

/* F_RATE's limit, requests a second (set before server_start). */
static unsigned g_rate_limit;
#define MAX_STAMPS 200000

#define MAX_CONN 256
#define MAX_KEYS 4096

static struct {
    int lfd, port;
    char root[1024];
    pthread_t acceptor;
    pthread_t conns[MAX_CONN];
    int conn_fds[MAX_CONN];
    int nconn;
    pthread_mutex_t mu;
    atomic_int stop;
    int fault;
    char fault_path[256]; /* F_500_PAYLOAD: this object's payload ranges fail */
    uint64_t payload_end; /* ... below this offset (the index stays readable) */
    /* Keys (path + range) already answered once, for *_FIRST faults. */
    char *seen[MAX_KEYS];
    int nseen;
    atomic_int requests, whole_gets;
    atomic_int listings;         /* directory requests: S3 listings (.listing.xml) */
    atomic_int payloads, stalls; /* F_STALL_SOME: payload ranges seen, stalled */
    atomic_int plain_gets;       /* GETs without a Range, of any object */
    atomic_ullong big_bytes;     /* bytes of ranged replies over 1 MiB */
    atomic_ullong bytes_out;     /* body bytes of every reply */
    /* F_RATE: the current window, and every request's time and answer. */
    uint64_t win_start, win_count;
    uint64_t stamps[MAX_STAMPS];
    uint8_t throttled[MAX_STAMPS];
    size_t nstamps;
} srv;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* F_RATE: true when this request is over the limit (answered 503). */
static bool over_rate(void)
{
    uint64_t now = mono_ns();
    pthread_mutex_lock(&srv.mu);
    if (now - srv.win_start >= 1000000000ULL) {
        srv.win_start = now;
        srv.win_count = 0;
    }
    bool over = ++srv.win_count > g_rate_limit;
    if (srv.nstamps < MAX_STAMPS) {
        srv.stamps[srv.nstamps] = now;
        srv.throttled[srv.nstamps++] = over;
    }
    pthread_mutex_unlock(&srv.mu);
    return over;
}

static bool first_time(const char *key)
{
    pthread_mutex_lock(&srv.mu);
    bool first = true;
    for (int k = 0; k < srv.nseen && first; k++)
        first = strcmp(srv.seen[k], key) != 0;
    if (first && srv.nseen < MAX_KEYS)
        srv.seen[srv.nseen++] = strdup(key);
    pthread_mutex_unlock(&srv.mu);
    return first;
}

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        c += w;
        n -= (size_t)w;
    }
}

static void reply_status(int fd, int code, const char *extra)
{
    char h[512];
    int n = snprintf(h, sizeof h,
                     "HTTP/1.1 %d X\r\nContent-Length: 5\r\n%sConnection: keep-alive\r\n\r\nerror",
                     code, extra);
    send_all(fd, h, (size_t)n);
}

static uint64_t g_index_off[8];

/* Is this a ranged read of sample payloads (not a header, footer or index)? */
static bool is_payload(const char *path, bool ranged, uint64_t a)
{
    const char *p = strstr(path, "part-");
    if (!ranged || !p || a < 64)
        return false;
    int s = atoi(p + 5);
    return s >= 0 && s < 8 && a < g_index_off[s];
}

/* Serves one request; returns false to close the connection. */
/* Added before every answer (a round trip's latency), in microseconds. */
static unsigned g_delay_us;

static bool serve(int fd, const char *path, bool ranged, uint64_t a, uint64_t b)
{
    atomic_fetch_add(&srv.requests, 1);
    if (g_delay_us)
        usleep(g_delay_us);
    if (srv.fault == F_RATE && over_rate()) {
        reply_status(fd, 503, "");
        return true;
    }
    if (srv.fault == F_401) {
        reply_status(fd, 401, "WWW-Authenticate: Basic realm=\"data\"\r\n");
        return true;
    }
    if (srv.fault == F_HANG) {
        /* Reads the request, never answers. */
        while (!atomic_load(&srv.stop))
            usleep(10000);
        return false;
    }
    char file[2048], key[1200];
    snprintf(file, sizeof file, "%s%s", srv.root, path);
    snprintf(key, sizeof key, "%s %d %llu-%llu", path, ranged, (unsigned long long)a,
             (unsigned long long)b);
    int f = open(file, O_RDONLY);
    struct stat st;
    if (f >= 0 && fstat(f, &st) == 0 && S_ISDIR(st.st_mode)) {
        /* A directory: its .listing.xml (an S3 bucket's listing, path-style
         * GET /BUCKET?list-type=2..., whatever the query). */
        close(f);
        atomic_fetch_add(&srv.listings, 1);
        strncat(file, "/.listing.xml", sizeof file - strlen(file) - 1);
        f = open(file, O_RDONLY);
    }
    if (f < 0 || fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (f >= 0)
            close(f);
        reply_status(fd, 404, "");
        return true;
    }
    uint64_t size = (uint64_t)st.st_size;
    /* A download into the cache: a whole-object GET, or one part of one (a
     * range at a multiple of the part size, a part long or to the end; the
     * first part counts as the download's start). */
    uint64_t pb = stk__fetch_part_bytes;
    bool dl = !ranged || (a % pb == 0 && (b - a + 1 == pb || b + 1 == size));
    if (!ranged) {
        atomic_fetch_add(&srv.plain_gets, 1);
        a = 0;
        b = size - 1;
    }
    if (dl && a == 0 && strstr(path, ".stk"))
        atomic_fetch_add(&srv.whole_gets, 1);
    if (ranged && a >= size) {
        /* As nginx: a range that starts past the end (a file cut short). */
        close(f);
        char cr[96];
        snprintf(cr, sizeof cr, "Content-Range: bytes */%llu\r\n", (unsigned long long)size);
        reply_status(fd, 416, cr);
        return true;
    }
    if (b >= size)
        b = size - 1;
    int fault = srv.fault;
    if (fault == F_500_WHOLE_FIRST && dl && strstr(path, ".stk") && first_time(key)) {
        close(f);
        reply_status(fd, 500, "");
        return true;
    }
    if (fault == F_503_FIRST && first_time(key)) {
        close(f);
        reply_status(fd, 503, "Retry-After: 0\r\n");
        return true;
    }
    if (fault == F_500_PAYLOAD && strstr(path, srv.fault_path) && ranged && a >= 64 &&
        a < srv.payload_end) {
        close(f);
        reply_status(fd, 500, "");
        return true;
    }
    if (fault == F_SHARD_STATUS && strstr(path, "part-") && (dl || is_payload(path, ranged, a))) {
        close(f);
        reply_status(fd, 410 + atoi(strstr(path, "part-") + 5), "");
        return true;
    }
    if (fault == F_WHOLE_SHORT && !ranged && strstr(path, ".tar"))
        b = size / 2 - 1;
    if (fault == F_500_WHOLE_STALL && dl && strstr(path, ".stk")) {
        close(f);
        reply_status(fd, 500, "");
        return true;
    }
    if ((fault == F_STALL || fault == F_500_WHOLE_STALL) && is_payload(path, ranged, a)) {
        while (!atomic_load(&srv.stop))
            usleep(10000);
        close(f);
        return false;
    }
    if (fault == F_STALL_SOME && is_payload(path, ranged, a) &&
        atomic_fetch_add(&srv.payloads, 1) % 50 == 49) {
        atomic_fetch_add(&srv.stalls, 1);
        for (unsigned t = 0; t < g_stall_ms / 10 && !atomic_load(&srv.stop); t++)
            usleep(10000);
    }
    uint64_t n = b - a + 1;
    atomic_fetch_add(&srv.bytes_out, n);
    if (ranged && n > (1u << 20))
        atomic_fetch_add(&srv.big_bytes, n);
    char h[512];
    /* An ETag like nginx's: the file's size and modification time. */
    unsigned long long mt = (unsigned long long)st.st_mtim.tv_sec * 1000000000ULL +
                            (unsigned long long)st.st_mtim.tv_nsec;
    int hl = ranged ? snprintf(h, sizeof h,
                               "HTTP/1.1 206 Partial\r\nContent-Length: %llu\r\nContent-Range: "
                               "bytes %llu-%llu/%llu\r\nETag: \"%llx-%llx\"\r\nConnection: "
                               "keep-alive\r\n\r\n",
                               (unsigned long long)n, (unsigned long long)a, (unsigned long long)b,
                               (unsigned long long)size, (unsigned long long)size, mt)
                    : snprintf(h, sizeof h,
                               "HTTP/1.1 200 OK\r\nContent-Length: %llu\r\nETag: "
                               "\"%llx-%llx\"\r\nConnection: keep-alive\r\n\r\n",
                               (unsigned long long)n, (unsigned long long)size, mt);
    send_all(fd, h, (size_t)hl);
    uint8_t *buf = malloc(n ? n : 1);
    ssize_t got = pread(f, buf, n, (off_t)a);
    close(f);
    if ((fault == F_SLOW_WHOLE || fault == F_CUT_WHOLE || fault == F_CUT_PART_ONCE) && dl &&
        strstr(path, ".stk") && got > 0) {
        /* A slow download: 4 KiB every 3 ms a request; the cut part stops
         * half-way (after ~0.3 s) with a reset. */
        bool cutp =
            fault != F_SLOW_WHOLE && ranged && a == pb && (fault == F_CUT_WHOLE || first_time(key));
        size_t stop = cutp ? (size_t)got / 2 : (size_t)got;
        unsigned pace = cutp ? (unsigned)(300000 / (stop / 4096 + 1)) : 3000;
        for (size_t o = 0; o < stop && !atomic_load(&srv.stop); o += 4096) {
            send_all(fd, buf + o, stop - o < 4096 ? stop - o : 4096);
            usleep(pace);
        }
        free(buf);
        if (cutp) {
            struct linger lg = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            return false;
        }
        return true;
    }
    bool cut = (fault == F_RESET_FIRST || fault == F_TRUNC_FIRST) && n > 1 && first_time(key);
    size_t send_n = cut ? (size_t)n / 2 : (size_t)(got > 0 ? got : 0);
    send_all(fd, buf, send_n);
    free(buf);
    if (cut && fault == F_RESET_FIRST) {
        struct linger lg = {1, 0}; /* RST instead of FIN */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    return !cut;
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[8192];
    size_t have = 0;
    for (;;) {
        char *end = NULL;
        while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
            if (have == sizeof buf)
                goto done;
            ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
            if (r <= 0)
                goto done;
            have += (size_t)r;
            if ((unsigned char)buf[0] == 0x16) {
                /* A TLS ClientHello: answered as a plain HTTP server does. */
                send_all(fd, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n", 47);
                goto done;
            }
        }
        *end = '\0';
        char method[16], path[1024];
        if (sscanf(buf, "%15s %1023s", method, path) != 2)
            goto done;
        char *q = strchr(path, '?');
        if (q)
            *q = '\0';
        unsigned long long a = 0, b = 0;
        const char *rg = strcasestr(buf, "\r\nRange: bytes=");
        bool ranged = rg && sscanf(rg + 15, "%llu-%llu", &a, &b) == 2;
        size_t used = (size_t)(end + 4 - buf);
        if (!serve(fd, path, ranged, a, b))
            goto done;
        memmove(buf, buf + used, have - used);
        have -= used;
    }
done:
    close(fd);
    return NULL;
}

static void *accept_main(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(srv.lfd, NULL, NULL);
        if (fd < 0) {
            if (atomic_load(&srv.stop))
                return NULL;
            continue;
        }
        pthread_mutex_lock(&srv.mu);
        if (srv.nconn == MAX_CONN || atomic_load(&srv.stop)) {
            pthread_mutex_unlock(&srv.mu);
            close(fd);
            continue;
        }
        srv.conn_fds[srv.nconn] = fd;
        pthread_create(&srv.conns[srv.nconn], NULL, conn_main, (void *)(intptr_t)fd);
        srv.nconn++;
        pthread_mutex_unlock(&srv.mu);
    }
}

static void server_start(const char *root, int fault)
{
    memset(&srv, 0, sizeof srv);
    pthread_mutex_init(&srv.mu, NULL);
    snprintf(srv.root, sizeof srv.root, "%s", root);
    srv.fault = fault;
    srv.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    REQUIRE(bind(srv.lfd, (struct sockaddr *)&sa, sizeof sa) == 0);
    REQUIRE(listen(srv.lfd, 128) == 0);
    socklen_t sl = sizeof sa;
    getsockname(srv.lfd, (struct sockaddr *)&sa, &sl);
    srv.port = ntohs(sa.sin_port);
    pthread_create(&srv.acceptor, NULL, accept_main, NULL);
}

static void server_stop(void)
{
    atomic_store(&srv.stop, 1);
    shutdown(srv.lfd, SHUT_RDWR);
    pthread_join(srv.acceptor, NULL);
    close(srv.lfd);
    pthread_mutex_lock(&srv.mu);
    for (int k = 0; k < srv.nconn; k++)
        shutdown(srv.conn_fds[k], SHUT_RDWR);
    int n = srv.nconn;
    pthread_mutex_unlock(&srv.mu);
    for (int k = 0; k < n; k++)
        pthread_join(srv.conns[k], NULL);
    for (int k = 0; k < srv.nseen; k++)
        free(srv.seen[k]);
    pthread_mutex_destroy(&srv.mu);
}

/* ---- the dataset ---------------------------------------------------------------- */

#define SHARDS    5
#define PER_SHARD 23

static char g_www[1024], g_ds[1100];

/* Writes the dataset into dir; salt changes every payload byte but no size
 * (a republished dataset of fixed-size records). */
static void make_dataset_at(const char *dir, int salt)
{
    tu_mkdirs(dir);
    stk__manifest man = {0};
    man.kind = STK_PAYLOAD_ENCODED;
    man.classes = 7;
    man.shards = stk__calloc(SHARDS, sizeof *man.shards);
    man.nshards = SHARDS;
    char err[512], path[2048];
    for (int s = 0; s < SHARDS; s++) {
        stk__stk_header h = {0};
        h.kind = STK_PAYLOAD_ENCODED;
        stk__stk_writer *w;
        snprintf(path, sizeof path, "%s/part-%06d.stk", dir, s);
        REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
        for (int k = 0; k < PER_SHARD; k++) {
            int i = s * PER_SHARD + k;
            uint8_t data[3000];
            size_t n = 100 + (size_t)(i * 37) % 2800;
            for (size_t j = 0; j < n; j++)
                data[j] = (uint8_t)(i * 131 + j * 7 + salt);
            char key[32];
            snprintf(key, sizeof key, "s%d-%d", s, k);
            REQUIRE(stk__stkw_add(w, data, n, i % 7, key, 0, 0, err, sizeof err) == STK_OK);
        }
        uint64_t fsize = 0;
        REQUIRE(stk__stkw_finish(w, 7, &fsize, err, sizeof err) == STK_OK);
        char name[32];
        snprintf(name, sizeof name, "part-%06d.stk", s);
        man.shards[s].name = stk__strdup(name);
        man.shards[s].count = PER_SHARD;
        man.shards[s].bytes = fsize;
        man.samples += PER_SHARD;
        size_t n = 0;
        uint8_t *all = tu_read_file(path, &n);
        stk__stk_footer f;
        REQUIRE(stk__stk_footer_decode(all + n - STK_FOOTER_SIZE, n, &f, err, sizeof err) ==
                STK_OK);
        g_index_off[s] = f.index_offset;
        free(all);
    }
    REQUIRE(stk__manifest_write(dir, &man, err, sizeof err) == STK_OK);
    stk__manifest_free(&man);
}

static void make_dataset(void)
{
    snprintf(g_www, sizeof g_www, "%s", tu_path("www"));
    snprintf(g_ds, sizeof g_ds, "%s/ds", g_www);
    make_dataset_at(g_ds, 0);
}

/* Hash of every batch of `epochs` epochs (labels, indices, bytes), plus the
 * samples delivered and the fetch counters. */
typedef struct run_out {
    int open_rc;
    uint64_t hash, samples;
    stk_fetch_stats fs;
    char msg[1024];
} run_out;

static const char *g_order = "global";
/* Extra key, value option pairs for the next opens (NULL ends). */
static const char *g_extra[8];
/* The consumer's time per batch in run(), in milliseconds. */
static unsigned g_consumer_ms;
/* A mixture for the next opens instead of `path` (NULL ends): its sources'
 * paths and weights (test_mixture_*). */
static const char *g_mix[4];
static double g_mix_w[4];

/* The warnings of the opens since run_warned cleared it (one a line), and
 * whether the opens send them here (stk_options_set_warning) instead of the
 * library's default, stderr. */
static char g_warnings[8192];
static bool g_collect_warnings;

static void collect_warning(void *user, const char *msg)
{
    (void)user;
    size_t used = strlen(g_warnings);
    snprintf(g_warnings + used, sizeof g_warnings - used, "%s\n", msg);
}

/* Whether a run reads a URL (a mixture: any of its sources). */
static bool run_is_remote(const char *path)
{
    if (!g_mix[0])
        return strstr(path, "://") != NULL;
    bool any = false;
    for (int k = 0; g_mix[k]; k++)
        any |= strstr(g_mix[k], "://") != NULL;
    return any;
}

static stk_loader *open_url(const char *path, unsigned threads, const char *cache_dir,
                            const char *limit, int on_error, int *rc)
{
    stk_options *o;
    stk_loader *l = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    if (g_mix[0])
        for (int k = 0; g_mix[k]; k++)
            REQUIRE(stk_options_add_source(o, g_mix[k], g_mix_w[k], 0) == STK_OK);
    else
        stk_options_set_source(o, path);
    stk_options_set_batch_size(o, 8);
    stk_options_set_threads(o, threads);
    stk_options_set_seed(o, 11);
    stk_options_set_on_error(o, on_error);
    /* The local reference runs take the same options but the remote ones,
     * which a local path refuses (they would change nothing). */
    bool remote = run_is_remote(path);
    if (remote) {
        REQUIRE(stk_options_set(o, "fetch_timeout", "2") == STK_OK);
        REQUIRE(stk_options_set(o, "fetch_concurrency", "8") == STK_OK);
        /* A plan shorter than an epoch, so windows come and go in the cache. */
        REQUIRE(stk_options_set(o, "fetch_lookahead", "24") == STK_OK);
    }
    REQUIRE(stk_options_set(o, "order", g_order) == STK_OK);
    REQUIRE(stk_options_set(o, "shard_window", "2") == STK_OK);
    for (int k = 0; g_extra[k]; k += 2)
        if (remote || !(stk_option_by_name(g_extra[k])->flags & STK_OPTION_REMOTE))
            REQUIRE(stk_options_set(o, g_extra[k], g_extra[k + 1]) == STK_OK);
    if (cache_dir)
        REQUIRE(stk_options_set(o, "cache_dir", cache_dir) == STK_OK);
    if (limit)
        REQUIRE(stk_options_set(o, "cache_limit", limit) == STK_OK);
    if (g_collect_warnings)
        REQUIRE(stk_options_set_warning(o, collect_warning, NULL) == STK_OK);
    *rc = stk_loader_open(&l, o);
    stk_options_destroy(o);
    return l;
}

static run_out run(const char *path, unsigned threads, const char *cache_dir, const char *limit,
                   int on_error, int epochs)
{
    run_out r;
    memset(&r, 0, sizeof r);
    r.hash = 1469598103934665603ULL;
    stk_loader *l = open_url(path, threads, cache_dir, limit, on_error, &r.open_rc);
    if (r.open_rc) {
        snprintf(r.msg, sizeof r.msg, "%s", stk_loader_errmsg(l));
        stk_loader_close(l);
        return r;
    }
    for (int e = 0; e < epochs; e++) {
        int rc;
        stk_batch *b;
        while ((rc = stk_loader_next(l, &b)) != STK_END) {
            if (rc == STK_ESAMPLE) {
                if (!r.msg[0])
                    snprintf(r.msg, sizeof r.msg, "%s", stk_loader_errmsg(l));
                continue;
            }
            REQUIRE(rc == STK_OK);
            r.hash = tu_hash(r.hash, b->labels, b->size * sizeof *b->labels);
            r.hash = tu_hash(r.hash, b->indices, b->size * sizeof *b->indices);
            for (size_t k = 0; k < b->size; k++)
                r.hash = tu_hash(r.hash, (uint8_t *)b->data + b->offsets[k], b->lengths[k]);
            r.samples += b->size;
            stk_batch_release(b);
            if (g_consumer_ms)
                usleep(g_consumer_ms * 1000u);
        }
    }
    r.fs.struct_size = sizeof r.fs;
    int frc = stk_loader_fetch_stats(l, &r.fs);
    if (strstr(path, ".tar"))
        (void)frc; /* remote tar shards are read from the cache, with no fetch stage */
    else if (run_is_remote(path))
        CHECK_EQ(frc, STK_OK);
    else
        CHECK_EQ(frc, STK_EUNSUPPORTED);
    stk_loader_close(l);
    return r;
}

static const char *url(const char *rel)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "http://127.0.0.1:%d/%s", srv.port, rel);
    return buf[k];
}

/* ---- tests ---------------------------------------------------------------------- */

static void test_same_batches_as_local(void)
{
    run_out local = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    CHECK_EQ(local.open_rc, STK_OK);
    CHECK_EQ(local.samples, 2 * SHARDS * PER_SHARD);
    server_start(g_www, F_NONE);
    for (unsigned t = 1; t <= 3; t += 2) {
        run_out r = run(url("ds"), t, NULL, NULL, STK_ON_ERROR_RAISE, 2);
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK(r.hash == local.hash);
        CHECK_EQ(r.fs.failures, 0);
        CHECK(r.fs.requests > 0);
        CHECK(r.fs.sample_bytes > 0);
        CHECK(r.fs.bytes >= r.fs.sample_bytes);
    }
    /* One shard by its URL, and a brace pattern. */
    run_out one_l = run(tu_path("www/ds/part-000003.stk"), 2, NULL, NULL, 0, 1);
    run_out one_r = run(url("ds/part-000003.stk"), 2, NULL, NULL, 0, 1);
    CHECK(one_l.hash == one_r.hash && one_r.samples == PER_SHARD);
    run_out pat = run(url("ds/part-{000000..000004}.stk"), 2, NULL, NULL, 0, 1);
    run_out one_epoch = run(g_ds, 2, NULL, NULL, 0, 1);
    CHECK(pat.hash == one_epoch.hash);
    /* Missing things fail at open with the URL and the reason. */
    run_out miss = run(url("ds/part-000009.stk"), 2, NULL, NULL, 0, 1);
    CHECK_EQ(miss.open_rc, STK_ENOENT);
    CHECK(strstr(miss.msg, "part-000009.stk") && strstr(miss.msg, "404"));
    server_stop();
}

/* A .stk of fields (payload kind fields) read remotely: with fields (whole
 * samples through the fetch stage) every field equals the local read; without
 * fields (no fetch stage: each sample by its own range read) the image field. */
static uint64_t fields_hash(const char *path, const char *spec, uint64_t *samples)
{
    g_extra[0] = spec ? "fields" : NULL; /* samples as stored: no transform */
    g_extra[1] = spec;
    g_extra[2] = NULL;
    int rc;
    stk_loader *l = open_url(path, 2, NULL, NULL, STK_ON_ERROR_RAISE, &rc);
    memset(g_extra, 0, sizeof g_extra);
    if (rc)
        fprintf(stderr, "open %s: %s\n", path, stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    uint64_t h = 0;
    *samples = 0;
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
        h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
        for (size_t k = 0; k < b->size; k++)
            h = tu_hash(h, (uint8_t *)b->data + b->offsets[k], b->lengths[k]);
        for (size_t f = 0; f < b->nfields; f++) {
            const stk_field *fl = &b->fields[f];
            if (fl->layout == STK_BATCH_DENSE) {
                h = tu_hash(h, fl->data, b->size * fl->sample_bytes);
                continue;
            }
            for (size_t k = 0; k < b->size; k++)
                h = tu_hash(h, (uint8_t *)fl->data + fl->offsets[k], fl->lengths[k]);
        }
        *samples += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    /* With fields a remote dataset reads through the fetch stage; without,
     * sample by sample (the fetch stage would hand the worker whole
     * payloads, not their image field). */
    stk_fetch_stats fs = {.struct_size = sizeof fs};
    int frc = stk_loader_fetch_stats(l, &fs);
    if (strstr(path, "://") && spec)
        CHECK(frc == STK_OK && fs.requests > 0);
    else
        CHECK_EQ(frc, STK_EUNSUPPORTED);
    stk_loader_close(l);
    return h;
}

static void test_fields_remote(void)
{
    char dir[1200], err[512];
    snprintf(dir, sizeof dir, "%s/fields", g_www);
    stk_writer *w = NULL;
    stk_writer_options wo = {.struct_size = sizeof wo, .shard_size = 1500, .num_classes = 3};
    REQUIRE(stk_writer_open(&w, dir, &wo, err, sizeof err) == STK_OK);
    for (int i = 0; i < 40; i++) {
        char img[64], txt[64], cls[8], key[16];
        int ni = snprintf(img, sizeof img, "image bytes %d %.*s", i, i % 30,
                          "................................");
        snprintf(txt, sizeof txt, "caption %d: caf\xc3\xa9", i);
        snprintf(cls, sizeof cls, "%d", i % 3);
        snprintf(key, sizeof key, "k%02d", i);
        stk_writer_field f[3] = {{"jpg", img, (size_t)ni, STK_FIELD_IMAGE},
                                 {"txt", txt, strlen(txt), STK_FIELD_TEXT},
                                 {"cls", cls, strlen(cls), STK_FIELD_INT}};
        REQUIRE(stk_writer_add_fields(w, f, i % 4 ? 3 : 2, i % 3, key) == STK_OK);
    }
    REQUIRE(stk_writer_finish(w, NULL) == STK_OK);
    stk_writer_close(w);
    const char *spec = "image=jpg,caption=txt,label?=cls";
    uint64_t n_local, n_remote, n_plain_l, n_plain_r;
    uint64_t local = fields_hash(dir, spec, &n_local);
    uint64_t plain_local = fields_hash(dir, NULL, &n_plain_l);
    server_start(g_www, F_NONE);
    uint64_t remote = fields_hash(url("fields"), spec, &n_remote);
    uint64_t plain_remote = fields_hash(url("fields"), NULL, &n_plain_r);
    server_stop();
    CHECK_EQ(n_local, 40);
    CHECK_EQ(n_remote, 40);
    CHECK(local == remote);
    CHECK_EQ(n_plain_r, 40);
    CHECK(plain_local == plain_remote);
    CHECK(plain_local != local);
}

static void test_cache(void)
{
    run_out local = run(g_ds, 2, NULL, NULL, 0, 2);
    const char *cache = tu_path("cache");
    server_start(g_www, F_NONE);
    run_out cold = run(url("ds"), 2, cache, NULL, 0, 2);
    CHECK(cold.hash == local.hash);
    CHECK_EQ(cold.fs.cache_misses, SHARDS);
    CHECK_EQ(atomic_load(&srv.whole_gets), SHARDS);
    int before = atomic_load(&srv.requests);
    run_out warm = run(url("ds"), 3, cache, NULL, 0, 2);
    CHECK(warm.hash == local.hash);
    CHECK_EQ(warm.fs.cache_misses, 0);
    CHECK(warm.fs.cache_hits >= SHARDS);
    /* Warm: the manifest, and per shard a header, a footer and an index. */
    CHECK(atomic_load(&srv.requests) - before <= 1 + 3 * SHARDS);
    CHECK_EQ(atomic_load(&srv.whole_gets), SHARDS);
    /* A limit smaller than the dataset: exact batches, and what did not fit
     * was read by ranges. */
    run_out small = run(url("ds"), 2, tu_path("small"), "12K", 0, 2);
    CHECK(small.hash == local.hash);
    CHECK(small.fs.cache_fallbacks > 0);
    uint64_t total = 0;
    char sdir[2048];
    snprintf(sdir, sizeof sdir, "%s/" STK__CACHE_SUBDIR, tu_path("small"));
    DIR *d = opendir(sdir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        struct stat st;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", sdir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &st) == 0)
            total += (uint64_t)st.st_size;
    }
    if (d)
        closedir(d);
    CHECK(total <= 12 * 1024);
    /* Shard-aware order through a cache of about two shards: entries are
     * evicted (furthest next use first) and batches stay exact. */
    g_order = "shards";
    run_out sl = run(g_ds, 2, NULL, NULL, 0, 3);
    run_out sr = run(url("ds"), 2, tu_path("shards"), "80K", 0, 3);
    g_order = "global";
    CHECK(sl.hash == sr.hash && sl.samples == sr.samples);
    CHECK(sl.hash != local.hash);
    CHECK(sr.fs.cache_evictions > 0);
    server_stop();
}

static void test_faults_are_retried(void)
{
    run_out local = run(g_ds, 2, NULL, NULL, 0, 1);
    int faults[] = {F_503_FIRST, F_RESET_FIRST, F_TRUNC_FIRST};
    for (size_t k = 0; k < sizeof faults / sizeof *faults; k++) {
        server_start(g_www, faults[k]);
        run_out r = run(url("ds"), 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK(r.hash == local.hash);
        CHECK(r.fs.retries > 0);
        CHECK_EQ(r.fs.failures, 0);
        server_stop();
    }
    /* Downloads into the cache are retried too, and leave no partial file. */
    server_start(g_www, F_TRUNC_FIRST);
    run_out c = run(url("ds"), 2, tu_path("cache-faults"), NULL, 0, 1);
    CHECK(c.hash == local.hash);
    CHECK(c.fs.retries > 0);
    server_stop();
}

static void test_past_the_budget(void)
{
    server_start(g_www, F_500_PAYLOAD);
    snprintf(srv.fault_path, sizeof srv.fault_path, "part-000002.stk");
    srv.payload_end = g_index_off[2];
    /* Two retries (not the default six, whose backoff made this test take
     * 100 s): past them a request's failure is final all the same. */
    g_extra[0] = "fetch_retries";
    g_extra[1] = "2";
    /* skip: every other sample arrives, the failed ones are listed by URL. */
    run_out r = run(url("ds"), 2, NULL, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK_EQ(r.samples, (SHARDS - 1) * PER_SHARD);
    /* raise: next() names the first failed sample of the batch. */
    run_out x = run(url("ds"), 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK_EQ(x.samples, (SHARDS - 1) * PER_SHARD);
    CHECK(strstr(x.msg, "part-000002.stk") && strstr(x.msg, "HTTP 500"));
    g_extra[0] = NULL;
    server_stop();
}

static void test_close_is_prompt_while_stalled(void)
{
    server_start(g_www, F_STALL); /* every sample request hangs */
    int rc;
    stk_loader *l = open_url(url("ds"), 2, NULL, NULL, 0, &rc);
    CHECK_EQ(rc, STK_OK);
    stk_batch *b;
    CHECK_EQ(stk_loader_next_timeout(l, &b, 200), STK_TIMEOUT);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stk_loader_close(l);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(secs < 1.5);
    server_stop();
}

/* The same when the workers read samples on their own (here: the shards'
 * downloads into the cache fail, so each sample is read by range): those
 * reads are waited for like planned ones, re-checking cancel, where they
 * used to block close until the request gave up (fetch_timeout). */
static void test_close_is_prompt_while_reading_alone(void)
{
    server_start(g_www, F_500_WHOLE_STALL);
    g_extra[0] = "fetch_retries";
    g_extra[1] = "0";
    g_extra[2] = "fetch_timeout";
    g_extra[3] = "20";
    int rc;
    stk_loader *l = open_url(url("ds"), 2, tu_path("cache-stall"), NULL, 0, &rc);
    g_extra[0] = NULL;
    CHECK_EQ(rc, STK_OK);
    stk_batch *b;
    CHECK_EQ(stk_loader_next_timeout(l, &b, 500), STK_TIMEOUT);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stk_loader_close(l);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(secs < 1.5);
    if (secs >= 1.5)
        fprintf(stderr, "    close took %.1f s\n", secs);
    server_stop();
}

static double secs_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* A seek (set_epoch) while every sample request hangs returns at once: the
 * reads of the batches it drops stop waiting (they used to hold the seek
 * until their requests gave up, retries included: minutes); the loader then
 * delivers from the new position once the server answers again. */
static void test_seek_is_prompt_while_stalled(void)
{
    server_start(g_www, F_STALL);
    g_extra[0] = "fetch_timeout";
    g_extra[1] = "20";
    int rc;
    stk_loader *l = open_url(url("ds"), 2, NULL, NULL, 0, &rc);
    g_extra[0] = NULL;
    CHECK_EQ(rc, STK_OK);
    stk_batch *b;
    CHECK_EQ(stk_loader_next_timeout(l, &b, 300), STK_TIMEOUT);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk_loader_set_epoch(l, 1), STK_OK);
    double secs = secs_since(&t0);
    CHECK(secs < 1.5);
    if (secs >= 1.5)
        fprintf(stderr, "    set_epoch took %.1f s\n", secs);
    CHECK_EQ(stk_loader_next_timeout(l, &b, 300), STK_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stk_loader_close(l);
    CHECK(secs_since(&t0) < 1.5);
    server_stop();
}

/* Cache admission (the directory's lock, a scan of the entries, evictions,
 * fallocate) runs off the fetch stage's lock, and not in a seek: while a
 * reservation is slow (here each holds the directory lock 3 s, like another
 * process scanning a big cache), the other workers go on delivering the
 * samples of cached shards, the stats are read at once, and set_epoch and
 * close return promptly (the reservation's wait re-checks cancel). They used
 * to wait for the reservations, each under the stage's lock. */
static void test_slow_admission_blocks_nothing(void)
{
    server_start(g_www, F_NONE);
    const char *cache = tu_path("cache-slow");
    run_out warm = run(url("ds"), 2, cache, NULL, 0, 1);
    CHECK_EQ(warm.fs.cache_misses, SHARDS);
    /* One of the five entries goes: its shard needs admission again. */
    char sdir[2048], names[SHARDS + 4][256];
    int n = 0;
    snprintf(sdir, sizeof sdir, "%s/" STK__CACHE_SUBDIR, cache);
    DIR *d = opendir(sdir);
    REQUIRE(d != NULL);
    struct dirent *de;
    while ((de = readdir(d)) && n < SHARDS + 4)
        if (de->d_name[0] != '.' && strcmp(de->d_name, "VERSION"))
            snprintf(names[n++], sizeof names[0], "%s", de->d_name);
    closedir(d);
    CHECK_EQ(n, SHARDS);
    char gone[4096];
    snprintf(gone, sizeof gone, "%s/%s", sdir, names[0]);
    CHECK_EQ(unlink(gone), 0);
    atomic_store(&stk__cache_test_begin_wait_ms, 3000u);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc;
    /* Four workers: the first batch's first four samples are not all of
     * the one shard being admitted, so some go on. */
    stk_loader *l = open_url(url("ds"), 4, cache, NULL, 0, &rc);
    CHECK_EQ(rc, STK_OK);
    CHECK(secs_since(&t0) < 1.0); /* open's plan admits nothing itself */
    usleep(500000);
    stk_fetch_stats fs;
    memset(&fs, 0, sizeof fs);
    fs.struct_size = sizeof fs;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk_loader_fetch_stats(l, &fs), STK_OK);
    double secs = secs_since(&t0);
    CHECK(secs < 0.3);
    /* Samples of the cached shards were delivered while the first
     * reservation still held the directory. */
    CHECK(fs.samples > 0);
    if (secs >= 0.3 || !fs.samples)
        fprintf(stderr, "    stats took %.1f s, %llu samples\n", secs,
                (unsigned long long)fs.samples);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk_loader_set_epoch(l, 1), STK_OK);
    secs = secs_since(&t0);
    CHECK(secs < 1.0);
    if (secs >= 1.0)
        fprintf(stderr, "    set_epoch took %.1f s\n", secs);
    usleep(200000);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stk_loader_close(l);
    secs = secs_since(&t0);
    CHECK(secs < 1.0);
    if (secs >= 1.0)
        fprintf(stderr, "    close took %.1f s\n", secs);
    atomic_store(&stk__cache_test_begin_wait_ms, 0u);
    /* The cache is whole again after a run without the delay. */
    run_out again = run(url("ds"), 2, cache, NULL, 0, 1);
    CHECK(again.hash == warm.hash);
    server_stop();
}

static void test_resume_mid_epoch(void)
{
    server_start(g_www, F_NONE);
    int rc;
    stk_loader *a = open_url(url("ds"), 2, NULL, NULL, 0, &rc);
    stk_batch *b;
    for (int k = 0; k < 5; k++) {
        REQUIRE(stk_loader_next(a, &b) == STK_OK);
        stk_batch_release(b);
    }
    stk_state st = {.struct_size = sizeof st};
    CHECK_EQ(stk_loader_get_state(a, &st), STK_OK);
    REQUIRE(stk_loader_next(a, &b) == STK_OK);
    uint64_t want = tu_hash(1, b->indices, b->size * sizeof *b->indices);
    stk_batch_release(b);
    stk_loader_close(a);
    stk_loader *c = open_url(url("ds"), 3, NULL, NULL, 0, &rc);
    CHECK_EQ(stk_loader_set_state(c, &st), STK_OK);
    REQUIRE(stk_loader_next(c, &b) == STK_OK);
    CHECK(tu_hash(1, b->indices, b->size * sizeof *b->indices) == want);
    stk_batch_release(b);
    stk_loader_close(c);
    server_stop();
}

/* Order "blocks" (issue 23): runs of consecutive samples of a shard, fetched
 * whole, one request each. The same batches as a local read in that order,
 * every sample once an epoch, far fewer requests than samples, and a resume
 * mid-epoch that continues exactly. */
static void test_block_order(void)
{
    g_order = "blocks";
    g_extra[0] = "block_bytes";
    g_extra[1] = "8K"; /* about 5 of the ~1.5 KB samples */
    g_extra[2] = "fetch_lookahead";
    g_extra[3] = "1000";
    /* Local, in the block order: each epoch a permutation of the samples. */
    int rc;
    stk_loader *l = open_url(g_ds, 2, NULL, NULL, 0, &rc);
    REQUIRE(rc == STK_OK);
    for (int e = 0; e < 2; e++) {
        uint8_t seen[SHARDS * PER_SHARD] = {0};
        uint64_t n = 0, runs = 0, prev = UINT64_MAX;
        stk_batch *b;
        while (stk_loader_next(l, &b) == STK_OK) {
            for (size_t k = 0; k < b->size; k++) {
                uint64_t i = b->indices[k];
                REQUIRE(i < SHARDS * PER_SHARD);
                CHECK_EQ(seen[i], 0);
                seen[i] = 1;
                runs += prev != UINT64_MAX && i != prev + 1;
                prev = i;
                n++;
            }
            stk_batch_release(b);
        }
        CHECK_EQ(n, SHARDS * PER_SHARD);
        CHECK(runs > 10); /* shuffled, not read in file order */
    }
    stk_loader_close(l);
    run_out local = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    run_out global_order;
    g_order = "global";
    global_order = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    g_order = "blocks";
    CHECK(local.hash != global_order.hash);
    server_start(g_www, F_NONE);
    for (unsigned t = 1; t <= 3; t += 2) {
        run_out r = run(url("ds"), t, NULL, NULL, STK_ON_ERROR_RAISE, 2);
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK(r.hash == local.hash);
        CHECK_EQ(r.samples, 2 * SHARDS * PER_SHARD);
        CHECK_EQ(r.fs.failures, 0);
        /* About 5 blocks a shard, each fetched once an epoch (a plan that
         * reaches into the next epoch may keep a block for it). */
        CHECK(r.fs.requests <= 2 * SHARDS * 8);
        CHECK(r.fs.requests * 3 < r.samples);
        CHECK(r.fs.bytes <= r.fs.sample_bytes + r.fs.sample_bytes / 5);
    }
    server_stop();
    test_resume_mid_epoch();
    g_extra[0] = NULL;
    g_order = "global";
}

/* The block order's default budget (fetch.c, block_budget): sized in
 * windows of blocks, counted in blocks alive. With windows of 2 blocks of
 * ~8 KiB the plan holds the window being read and the next ones (a few
 * blocks), not the 64 MiB a byte budget allowed (there: every block of both
 * epochs at once); each block is still fetched once an epoch and the
 * batches are the local ones. */
static void test_block_budget(void)
{
    g_order = "blocks";
    g_extra[0] = "block_bytes";
    g_extra[1] = "8K";
    g_extra[2] = "shard_window";
    g_extra[3] = "2";
    g_extra[4] = NULL;
    run_out local = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    server_start(g_www, F_NONE);
    for (unsigned t = 1; t <= 3; t += 2) {
        run_out r = run(url("ds"), t, NULL, NULL, STK_ON_ERROR_RAISE, 2);
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK(r.hash == local.hash);
        CHECK_EQ(r.samples, 2 * SHARDS * PER_SHARD);
        CHECK_EQ(r.fs.failures, 0);
        CHECK(r.fs.requests <= 2 * SHARDS * 8);
        /* The window being read and up to 3 ahead (the latency of loopback
         * asks for 1), each block under 8 KiB; the data set is ~170 KiB. */
        if (r.fs.buffered_peak > 4 * 2 * 8192)
            fprintf(stderr, "  block budget: peak %llu bytes buffered\n",
                    (unsigned long long)r.fs.buffered_peak);
        CHECK(r.fs.buffered_peak <= 4 * 2 * 8192);
        CHECK(r.fs.buffered_peak >= 2 * 4096); /* more than one block at once */
    }
    server_stop();
    g_extra[0] = NULL;
    g_order = "global";
}

/* depth "auto" with the block order's default fetch budget (fetch.c,
 * blocks_setup: the larger of 64 MiB and 3 windows + 2 blocks): the depth is
 * chosen with the budget the stage will take, so the loader's memory bound
 * stays within memory_budget. 64 blocks of 3 KB and one of 1 MiB, windows of
 * 64 blocks: the stage takes 194 MiB, not the 64 MiB of a byte budget. */
static void test_block_budget_depth_auto(void)
{
    char dir[1200], path[1300], err[512];
    snprintf(dir, sizeof dir, "%s/bigblk", g_www);
    tu_mkdirs(dir);
    snprintf(path, sizeof path, "%s/b.stk", dir);
    stk__stk_header h = {0};
    h.kind = STK_PAYLOAD_ENCODED;
    stk__stk_writer *w;
    REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
    size_t big = 1u << 20;
    uint8_t *data = calloc(1, big);
    REQUIRE(data != NULL);
    for (int k = 0; k < 65; k++)
        REQUIRE(stk__stkw_add(w, data, k == 64 ? big : 3000, k % 2, NULL, 0, 0, err, sizeof err) ==
                STK_OK);
    free(data);
    uint64_t fsize;
    REQUIRE(stk__stkw_finish(w, 2, &fsize, err, sizeof err) == STK_OK);
    server_start(g_www, F_NONE);
    /* 150 MiB: too little for the stage (its 194 MiB of blocks, and a
     * forced claim run of the 1 MiB sample): refused; 500 MiB: room. */
    const char *budgets[2] = {"150M", "500M"};
    for (int t = 0; t < 2; t++) {
        stk_options *o;
        REQUIRE(stk_options_create(&o) == STK_OK);
        stk_options_set_source(o, url("bigblk/b.stk"));
        stk_options_set_batch_size(o, 8);
        stk_options_set_threads(o, 1);
        REQUIRE(stk_options_set(o, "order", "blocks") == STK_OK);
        REQUIRE(stk_options_set(o, "block_bytes", "4K") == STK_OK);
        REQUIRE(stk_options_set(o, "shard_window", "64") == STK_OK);
        REQUIRE(stk_options_set(o, "depth", "auto") == STK_OK);
        REQUIRE(stk_options_set(o, "memory_budget", budgets[t]) == STK_OK);
        REQUIRE(stk_options_set(o, "batch_memory", "2M") == STK_OK);
        uint64_t budget = (t ? 500ull : 150ull) << 20;
        stk_loader *l = NULL;
        int rc = stk_loader_open(&l, o);
        stk_options_destroy(o);
        /* Within the budget, or refused for it: never opened past it. */
        CHECK(rc == STK_OK || (t == 0 && rc == STK_ETOOBIG));
        if (rc == STK_OK) {
            uint64_t bound = stk_loader_memory_bound(l);
            if (bound > budget)
                fprintf(stderr, "    memory bound %llu bytes, over the budget of %llu\n",
                        (unsigned long long)bound, (unsigned long long)budget);
            CHECK(bound <= budget);
            stk_batch *b;
            CHECK_EQ(stk_loader_next(l, &b), STK_OK);
            stk_batch_release(b);
        }
        stk_loader_close(l);
    }
    server_stop();
}

/* Requests a second over the last half of the server's record, and the
 * share of them it throttled. */
static void second_half(double *rate, double *throttled)
{
    size_t n = srv.nstamps, h = n / 2, t = 0;
    for (size_t k = h; k < n; k++)
        t += srv.throttled[k];
    double secs = n > h + 1 ? (double)(srv.stamps[n - 1] - srv.stamps[h]) / 1e9 : 0;
    *rate = secs > 0 ? (double)(n - h - 1) / secs : 0;
    *throttled = n > h ? (double)t / (double)(n - h) : 0;
}

/* The request governor (issue 23): against a store that answers 503 above
 * N requests a second, every sample still arrives once, and the rate
 * settles under N instead of retrying into the limit; with a budget under N
 * nothing is throttled at all. */
static void test_governor(void)
{
    run_out local = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    g_extra[0] = "fetch_retries";
    g_extra[1] = "100";
    g_extra[2] = "fetch_lookahead";
    g_extra[3] = "8"; /* small requests: about one a sample */
    g_extra[4] = NULL;
    /* Low enough that a loaded 2-core machine still asks faster. */
    g_rate_limit = 50;
    server_start(g_www, F_RATE);
    run_out r = run(url("ds"), 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK(r.hash == local.hash);
    CHECK_EQ(r.fs.failures, 0);
    CHECK(r.fs.throttled > 0);
    CHECK(r.fs.rate_limit < 5500);
    double rate, thr;
    second_half(&rate, &thr);
    printf("    governor: %zu requests, %llu throttled, second half %.0f requests/s (%.1f%% "
           "throttled), budget now %llu/s\n",
           srv.nstamps, (unsigned long long)r.fs.throttled, rate, 100 * thr,
           (unsigned long long)r.fs.rate_limit);
    CHECK(rate < 1.3 * g_rate_limit);
    CHECK(thr < 0.25);
    server_stop();
    /* A budget under the limit: no 503 at all. */
    g_extra[4] = "fetch_rate";
    g_extra[5] = "30";
    g_extra[6] = NULL;
    server_start(g_www, F_RATE);
    r = run(url("ds"), 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK(r.hash != 0 && r.samples == SHARDS * PER_SHARD);
    CHECK_EQ(r.fs.throttled, 0);
    CHECK_EQ(r.fs.rate_limit, 30);
    second_half(&rate, &thr);
    CHECK(rate < 30 * 1.15);
    server_stop();
    g_extra[0] = NULL;
}

/* Hedged requests (issue 23): against a store that holds one payload range
 * in fifty for 5 s, a run with hedging (the default) is not held up by the
 * stalls, as the slow requests are sent again and the first answer wins;
 * every sample still arrives once, the same bytes as a local read. With
 * fetch_hedge 0 the same stalls are waited out (so the assertion can fail). */
static double run_timed(run_out *r, const char *path, int epochs)
{
    uint64_t t0 = mono_ns();
    *r = run(path, 2, NULL, NULL, STK_ON_ERROR_RAISE, epochs);
    return (double)(mono_ns() - t0) / 1e9;
}

static void test_hedge(void)
{
    run_out local = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    g_stall_ms = 5000;
    g_extra[0] = "fetch_lookahead";
    g_extra[1] = "8"; /* small requests: about one a sample */
    g_extra[2] = "fetch_timeout";
    g_extra[3] = "30"; /* the stall is waited out, not cut by the timeout */
    g_extra[4] = "fetch_hedge";
    g_extra[5] = "0";
    g_extra[6] = NULL;
    run_out r;
    server_start(g_www, F_STALL_SOME);
    double off = run_timed(&r, url("ds"), 1);
    int stalls_off = atomic_load(&srv.stalls);
    server_stop();
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK(r.hash == local.hash);
    CHECK_EQ(r.samples, SHARDS * PER_SHARD);
    CHECK_EQ(r.fs.hedges, 0);
    CHECK(stalls_off >= 1);
    /* Each stall holds the reader, which consumes in order. */
    CHECK(off >= 0.9 * g_stall_ms / 1000.0);

    g_extra[4] = NULL; /* the default: fetch_hedge 3 */
    server_start(g_www, F_STALL_SOME);
    double on = run_timed(&r, url("ds"), 1);
    int stalls_on = atomic_load(&srv.stalls);
    server_stop();
    printf("    hedging off: %.2f s (%d stalls); on: %.2f s (%d stalls, %llu hedges, %llu won, "
           "%llu requests)\n",
           off, stalls_off, on, stalls_on, (unsigned long long)r.fs.hedges,
           (unsigned long long)r.fs.hedge_wins, (unsigned long long)r.fs.requests);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK(r.hash == local.hash);
    CHECK_EQ(r.samples, SHARDS * PER_SHARD);
    CHECK_EQ(r.fs.failures, 0);
    CHECK(stalls_on >= 1);
    CHECK(r.fs.hedges >= 1);
    CHECK(r.fs.hedge_wins >= 1);
    CHECK(r.fs.hedge_wins <= r.fs.hedges);
    CHECK(r.fs.hedges * 20 <= r.fs.requests); /* at most 5 % of the requests */
    /* Well under one stall's length in all: the stalls cost nothing like
     * what they cost without hedging. */
    CHECK(on < 0.5 * g_stall_ms / 1000.0 * stalls_on);
    CHECK(on < 0.5 * off);
    g_extra[0] = NULL;
}

/* ---- the disk cache under faults (issue 18) ------------------------------------ */

/* A write error while a shard downloads into the cache (a full disk where
 * the filesystem cannot reserve blocks) lost every planned sample of the
 * shard. Now the shard is not admitted, its samples are read by ranges,
 * and the stats count it. */
static void test_cache_write_error_reads_by_ranges(void)
{
    char local[1200];
    snprintf(local, sizeof local, "%s/part-000000.stk", g_ds);
    run_out want = run(local, 2, NULL, NULL, STK_ON_ERROR_SKIP, 1);
    REQUIRE(want.samples == PER_SHARD);
    const char *cache = tu_path("cache-enospc");
    stk__cache *c;
    char err[512];
    REQUIRE(stk__cache_open(&c, cache, 0, err, sizeof err) == STK_OK); /* its marker now */
    stk__cache_close(c);
    server_start(g_www, F_NONE);
    /* Calls that store bytes: the reservation (0) passes, the download's
     * first write (1) fails with ENOSPC. */
    stk__iofault_arm(STK__IOF_ENOSPC, 1, 0);
    run_out r = run(url("ds/part-000000.stk"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    long fired = stk__iofault_fired();
    stk__iofault_arm(0, -1, 0);
    CHECK_EQ(fired, 1);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK_EQ(r.samples, PER_SHARD);
    CHECK(r.hash == want.hash);
    CHECK_EQ(r.fs.cache_write_errors, 1);
    server_stop();
}

/* A failed cached entry reported the last failed download of any shard:
 * each failed sample must name its own shard's reason. */
static void test_failed_download_names_its_own_shard(void)
{
    server_start(g_www, F_SHARD_STATUS);
    int rc;
    stk_loader *l = open_url(url("ds"), 2, tu_path("cache-status"), NULL, STK_ON_ERROR_RAISE, &rc);
    REQUIRE(rc == STK_OK);
    stk_batch *b;
    int checked = 0, wrong = 0;
    while ((rc = stk_loader_next(l, &b)) != STK_END) {
        if (rc == STK_OK) {
            stk_batch_release(b);
            continue;
        }
        REQUIRE(rc == STK_ESAMPLE);
        const char *m = stk_loader_errmsg(l);
        const char *p = strstr(m, "part-00000");
        REQUIRE(p);
        int own = p[10] - '0';
        for (int k = 0; k < SHARDS; k++) {
            char code[32];
            snprintf(code, sizeof code, "HTTP %d", 410 + k);
            if ((strstr(m, code) != NULL) != (k == own)) {
                if (!wrong)
                    fprintf(stderr, "    shard %d's sample says: %s\n", own, m);
                wrong++;
            }
        }
        checked++;
    }
    stk_loader_close(l);
    CHECK(checked > 0);
    CHECK_EQ(wrong, 0);
    server_stop();
}

/* Entries were keyed by URL and size only: a dataset republished with
 * same-size shards hit the old entries and failed forever ("payload ...
 * is corrupt"). The object's ETag is in the key now. And a cached shard
 * that fails its checksums is dropped and its samples fetched again. */
static void test_republished_and_corrupt_entries(void)
{
    char root[1024], ds[1100];
    snprintf(root, sizeof root, "%s", tu_path("www-repub"));
    snprintf(ds, sizeof ds, "%s/ds", root);
    make_dataset_at(ds, 0);
    const char *cache = tu_path("cache-repub");
    server_start(root, F_NONE);
    run_out cold = run(url("ds"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(cold.fs.cache_misses, SHARDS);
    usleep(20000); /* a later modification time */
    make_dataset_at(ds, 1);
    char other[1100];
    snprintf(other, sizeof other, "%s", tu_path("local-repub"));
    make_dataset_at(other, 1);
    run_out want = run(other, 2, NULL, NULL, STK_ON_ERROR_SKIP, 1);
    run_out again = run(url("ds"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(again.samples, SHARDS * PER_SHARD);
    CHECK(again.hash == want.hash);
    CHECK_EQ(again.fs.cache_misses, SHARDS); /* the new versions, downloaded */
    CHECK_EQ(again.fs.cache_dropped, 0);

    /* Corrupt one cached shard's payload in place (a bad disk). */
    char sub[2048], victim[4096] = "";
    snprintf(sub, sizeof sub, "%s/" STK__CACHE_SUBDIR, cache);
    DIR *d = opendir(sub);
    struct dirent *e;
    struct stat newest = {0};
    while (d && (e = readdir(d))) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", sub, e->d_name);
        if (strstr(e->d_name, "part-000001.stk") && stat(p, &st) == 0 &&
            st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec >=
                newest.st_mtim.tv_sec * 1000000000LL + newest.st_mtim.tv_nsec) {
            newest = st;
            snprintf(victim, sizeof victim, "%s", p);
        }
    }
    if (d)
        closedir(d);
    REQUIRE(victim[0]);
    int fd = open(victim, O_RDWR);
    REQUIRE(fd >= 0);
    for (uint64_t off = 200; off < g_index_off[1]; off += 97) {
        uint8_t x;
        REQUIRE(pread(fd, &x, 1, (off_t)off) == 1);
        x ^= 0x5a;
        REQUIRE(pwrite(fd, &x, 1, (off_t)off) == 1);
    }
    close(fd);
    run_out fixed = run(url("ds"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(fixed.samples, SHARDS * PER_SHARD);
    CHECK(fixed.hash == want.hash);
    CHECK_EQ(fixed.fs.cache_dropped, 1);
    /* The next run downloads that shard again and reads it from the cache. */
    run_out next = run(url("ds"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK(next.hash == want.hash);
    CHECK_EQ(next.fs.cache_misses, 1);
    CHECK_EQ(next.fs.cache_dropped, 0);
    server_stop();
}

/* ---- remote tar shards (issue 18) ------------------------------------------------ */

static void make_tars(const char *dir)
{
    tu_mkdirs(dir);
    for (int s = 0; s < 2; s++) {
        uint8_t *t = NULL;
        size_t tn = 0;
        for (int k = 0; k < 20; k++) {
            char name[64], data[600], lab[8];
            size_t n = 100 + (size_t)k * 23;
            memset(data, 'a' + (s * 20 + k) % 26, n);
            snprintf(name, sizeof name, "s%dk%03d.bin", s, k);
            tu_tar_add(&t, &tn, name, data, n);
            snprintf(lab, sizeof lab, "%d", k % 3);
            snprintf(name, sizeof name, "s%dk%03d.cls", s, k);
            tu_tar_add(&t, &tn, name, lab, strlen(lab));
        }
        uint8_t zeros[1024] = {0};
        t = realloc(t, tn + sizeof zeros);
        memcpy(t + tn, zeros, sizeof zeros);
        tn += sizeof zeros;
        char p[2048];
        snprintf(p, sizeof p, "%s/t-%06d.tar", dir, s);
        tu_write_file(p, t, tn);
        free(t);
    }
}

/* tar_remote never compared the downloaded size with the probed one: an
 * object replaced by a smaller one was committed with a zero-filled tail
 * (samples missing silently). */
static void test_tar_download_of_another_size_is_refused(void)
{
    server_start(g_www, F_WHOLE_SHORT);
    run_out r = run(url("tars/t-{000000..000001}.tar"), 2, tu_path("cache-tar-short"), NULL,
                    STK_ON_ERROR_RAISE, 1);
    CHECK(r.open_rc != STK_OK);
    CHECK(strstr(r.msg, "t-00000") && strstr(r.msg, "bytes, not the"));
    server_stop();
    /* And nothing half-made was left to be used later. */
    server_start(g_www, F_NONE);
    run_out ok = run(url("tars/t-{000000..000001}.tar"), 2, tu_path("cache-tar-short"), NULL,
                     STK_ON_ERROR_RAISE, 1);
    CHECK_EQ(ok.open_rc, STK_OK);
    CHECK_EQ(ok.samples, 40);
    server_stop();
}

/* Samples with fields from remote tar shards (issue 20): the shards are
 * downloaded whole and read by the local tar reader, so select and the
 * fields op work as locally: every field byte-equal to what was written,
 * and the same batches as the local run. */
static uint64_t tar_fields_epoch(const char *path, const char *cache, uint64_t *n)
{
    g_extra[0] = "fields";
    g_extra[1] = "data=bin,c=cls";
    int rc;
    stk_loader *l = open_url(path, 3, cache, NULL, STK_ON_ERROR_RAISE, &rc);
    g_extra[0] = g_extra[1] = NULL;
    if (rc)
        fprintf(stderr, "%s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    uint64_t h = 0;
    stk_batch *b;
    *n = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        REQUIRE(b->nfields == 2);
        const stk_field *d = &b->fields[0], *c = &b->fields[1];
        for (size_t k = 0; k < b->size; k++, (*n)++) {
            uint64_t i = b->indices[k], s = i / 20, j = i % 20;
            const uint8_t *p = (const uint8_t *)d->data + d->offsets[k];
            CHECK_EQ(d->lengths[k], 100 + j * 23);
            CHECK(p[0] == 'a' + (s * 20 + j) % 26 && p[d->lengths[k] - 1] == p[0]);
            CHECK_EQ(((const int64_t *)c->data)[k], (int64_t)(j % 3));
            CHECK_EQ(b->labels[k], (int64_t)(j % 3));
            h = tu_hash(h, &i, sizeof i);
            h = tu_hash(h, p, d->lengths[k]);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    stk_loader_close(l);
    return h;
}

static void test_tar_fields_remote_as_local(void)
{
    server_start(g_www, F_NONE);
    uint64_t nr, nl;
    uint64_t hr =
        tar_fields_epoch(url("tars/t-{000000..000001}.tar"), tu_path("cache-tar-fields"), &nr);
    char local[2048];
    snprintf(local, sizeof local, "%s/tars/t-{000000..000001}.tar", g_www);
    uint64_t hl = tar_fields_epoch(local, NULL, &nl);
    CHECK_EQ(nr, 40);
    CHECK_EQ(nl, 40);
    CHECK(hr == hl);
    server_stop();
}

/* The disk cache as a transport over the store's (io/transport_cache.c),
 * through the table alone: open downloads the object into the cache (the
 * size and identity of the entry's file), read is a ranged read of the
 * copy, path its file; a second open pins the entry with only its probe;
 * a missing object is STK_ENOENT by URL; no cache_dir is STK_EINVAL. */
static void test_cache_transport_table(void)
{
    server_start(g_www, F_NONE);
    char err[1024], local[2048], p[4096], where[4096];
    snprintf(local, sizeof local, "%s/tars/t-000000.tar", g_www);
    size_t n = 0;
    uint8_t *want = tu_read_file(local, &n);
    REQUIRE(want && n > 100);
    stk__remote *r;
    stk__remote_cfg cfg = {0};
    REQUIRE(stk__remote_open(&r, url("tars"), &cfg, err, sizeof err) == STK_OK);
    stk__transport *in = NULL, *t = NULL;
    REQUIRE(stk__transport_remote(&in, r) == STK_OK);
    stk__tcache_cfg cc = {.dir = tu_path("cache-tp"),
                          .stall_ns = 1000000000ULL,
                          .shown = "the store",
                          .what = "test objects"};
    REQUIRE(stk__transport_cache(&t, in, &cc) == STK_OK);
    stk__remote_counters c0, c1, c2;
    stk__remote_counters_get(r, &c0);
    for (int pass = 0; pass < 2; pass++) {
        stk__tobj *o = NULL;
        stk__tinfo info;
        REQUIRE(t->ops->open(t, "t-000000.tar", &o, &info, err, sizeof err) == STK_OK);
        CHECK(info.sized && info.size == n);
        uint8_t buf[64];
        stk__trange rg = {.obj = o, .off = 37, .len = sizeof buf, .buf = buf}, *rp = &rg;
        t->ops->read(t, &rp, 1);
        CHECK_EQ(rg.rc, STK_OK);
        CHECK(!memcmp(buf, want + 37, sizeof buf));
        stk__trange past = {.obj = o, .off = n - 1, .len = 2, .buf = buf}, *pp = &past;
        t->ops->read(t, &pp, 1);
        CHECK_EQ(past.rc, STK_EIO);
        CHECK(strstr(past.err, "short read") != NULL);
        CHECK_EQ(t->ops->path(t, o, p, sizeof p), STK_OK);
        size_t pn = 0;
        uint8_t *copy = tu_read_file(p, &pn);
        CHECK(copy && pn == n && !memcmp(copy, want, n));
        free(copy);
        t->ops->close_obj(t, o);
        stk__remote_counters_get(r, pass ? &c2 : &c1);
    }
    /* The first open: a probe and the download; the second: a probe. */
    CHECK_EQ(c1.requests - c0.requests, 2);
    CHECK_EQ(c2.requests - c1.requests, 1);
    stk__tobj *o = NULL;
    stk__tinfo info;
    CHECK_EQ(t->ops->open(t, "missing.tar", &o, &info, err, sizeof err), STK_ENOENT);
    t->ops->display(t, "missing.tar", where, sizeof where);
    CHECK(strstr(err, where) && strstr(err, "not found (HTTP 404)"));
    CHECK(o == NULL);
    stk__transport_close(t);
    /* No cache directory: every open fails, naming what to do. */
    REQUIRE(stk__transport_remote(&in, r) == STK_OK);
    cc.dir = NULL;
    REQUIRE(stk__transport_cache(&t, in, &cc) == STK_OK);
    CHECK_EQ(t->ops->open(t, "t-000000.tar", &o, &info, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "the store: test objects over the network") && strstr(err, "cache_dir"));
    stk__transport_close(t);
    stk__remote_close(r);
    free(want);
    server_stop();
}

/* tar_remote waited for another process's download forever. A download
 * that writes nothing for longer than every retry could take is given up
 * on, with a message. */
static void test_tar_wait_for_a_hung_download_ends(void)
{
    server_start(g_www, F_NONE);
    const char *cache = tu_path("cache-tar-hung");
    stk__cache *c;
    stk__remote *r;
    char err[512], base[1024], id[4096], key[192];
    snprintf(base, sizeof base, "%s", url("tars"));
    REQUIRE(stk__cache_open(&c, cache, 0, err, sizeof err) == STK_OK);
    stk__remote_cfg cfg = {0};
    REQUIRE(stk__remote_open(&r, base, &cfg, err, sizeof err) == STK_OK);
    uint8_t one;
    stk__req q = {.name = "t-000000.tar", .off = 0, .len = 1, .buf = &one, .fd = -1};
    stk__remote_submit(r, &q);
    REQUIRE(stk__remote_wait(r, &q) == STK_OK);
    stk__remote_object_id(r, "t-000000.tar", id, sizeof id);
    stk__cache_key(id, q.total, q.validator, key, sizeof key);
    stk__remote_close(r);
    /* "Another process": a .part held locked, last written an hour ago. */
    char part[4096];
    stk__cache_path(c, key, part, sizeof part - 8);
    strcat(part, ".part");
    int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0 && flock(fd, LOCK_EX) == 0);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 3600;
    ts[1] = ts[0];
    REQUIRE(futimens(fd, ts) == 0);
    time_t t0 = time(NULL);
    run_out o = run(url("tars/t-{000000..000001}.tar"), 2, cache, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK(o.open_rc != STK_OK);
    CHECK(strstr(o.msg, "wrote nothing") != NULL);
    CHECK(time(NULL) - t0 < 10);
    close(fd);
    unlink(part);
    stk__cache_close(c);
    server_stop();
}

/* A shard whose download into the cache fails is read by ranges, and when
 * it is admitted again while entries of the failed admission are still
 * planned, those entries release the failed admission, not the new one
 * (they used to drop the new one's pin count to 0: the shard was closed
 * under the readers, a SIGSEGV). Shard order with a window of 2, a plan
 * longer than an epoch, and a consumer slower than the 1 s before a failed
 * shard is admitted again. */
static void test_failed_download_then_readmitted(void)
{
    g_order = "shards";
    run_out local = run(g_ds, 2, NULL, NULL, STK_ON_ERROR_SKIP, 2);
    server_start(g_www, F_500_WHOLE_FIRST);
    g_extra[0] = "fetch_retries";
    g_extra[1] = "0"; /* a failed whole-object GET is final */
    g_extra[2] = "fetch_lookahead";
    g_extra[3] = "200";
    g_consumer_ms = 150;
    run_out r = run(url("ds"), 4, tu_path("cache-readmit"), NULL, STK_ON_ERROR_SKIP, 2);
    g_consumer_ms = 0;
    g_extra[0] = NULL;
    g_order = "global";
    CHECK_EQ(r.open_rc, STK_OK);
    /* Every sample, exactly once per epoch: the failed shards' samples came
     * by range. */
    CHECK_EQ(r.samples, local.samples);
    CHECK(r.hash == local.hash);
    CHECK(r.fs.cache_fallbacks >= SHARDS);
    if (r.msg[0])
        fprintf(stderr, "    first failure: %s\n", r.msg);
    server_stop();
}

/* A dataset of 4 shards of up to ~700 KB (samples of 24 KB): big enough that
 * a slow download of a shard takes a while, and that some of its samples
 * lie past what a download is trusted to cover soon. */
static void make_big_dataset(const char *dir)
{
    char err[512];
    stk_writer *w = NULL;
    stk_writer_options wo = {.struct_size = sizeof wo, .shard_size = 700000, .num_classes = 5};
    REQUIRE(stk_writer_open(&w, dir, &wo, err, sizeof err) == STK_OK);
    static uint8_t data[24000];
    for (int i = 0; i < 90; i++) {
        for (size_t j = 0; j < sizeof data; j++)
            data[j] = (uint8_t)(i * 29 + j * 13 + (j >> 9));
        char key[16];
        snprintf(key, sizeof key, "b%02d", i);
        REQUIRE(stk_writer_add(w, data, sizeof data, i % 5, key) == STK_OK);
    }
    REQUIRE(stk_writer_finish(w, NULL) == STK_OK);
    stk_writer_close(w);
}

/* The test part size: the big dataset's shards of up to ~700 KB download in
 * up to 11 parts. */
#define TEST_PART      65536u
#define TEST_PARTS_MAX 11u

/* The shards of dataset dir. */
static int shards_of(const char *dir)
{
    stk_dataset *ds = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&ds, dir, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
    stk_dataset_close(ds);
    return (int)di.shards;
}

/* Cold cache: a shard downloads in parallel ranged parts (of 64 KiB here,
 * 8 at a time), each read as soon as its bytes are on disk, and samples in
 * parts not started yet are fetched by range, so a cold epoch does not wait
 * for whole shards. Batches equal a local read; each shard is downloaded
 * once (every part once); the warm run reads only the cache. */
static void test_cold_cache_reads_while_downloading(void)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/big", g_www);
    run_out local = run(dir, 2, NULL, NULL, 0, 2);
    CHECK_EQ(local.samples, 180);
    stk__fetch_part_bytes = TEST_PART;
    server_start(g_www, F_SLOW_WHOLE);
    int req0 = atomic_load(&srv.requests);
    /* A consumer slow enough that the downloads (~0.15 s a part, 4 at a
     * time) complete within the two epochs, so the warm run finds every
     * shard. */
    g_consumer_ms = 30;
    run_out cold = run(url("big"), 2, tu_path("cache-cold"), NULL, 0, 2);
    g_consumer_ms = 0;
    /* Each shard downloaded once, in parts; the requests: the parts, the
     * open's, and the samples fetched by range (at most one each). */
    uint64_t parts = cold.fs.cache_download_parts, sh = (uint64_t)shards_of(dir);
    CHECK(parts >= 3 * sh && parts <= TEST_PARTS_MAX * sh);
    CHECK((uint64_t)(atomic_load(&srv.requests) - req0) <=
          parts + cold.fs.cache_cold_ranged + 1 + 3 * sh);
    CHECK_EQ(cold.open_rc, STK_OK);
    CHECK_EQ(cold.samples, local.samples);
    CHECK(cold.hash == local.hash);
    CHECK(cold.fs.cache_partial_reads > 0);
    CHECK(cold.fs.cache_cold_ranged > 0);
    stk_dataset *ds = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&ds, dir, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
    stk_dataset_close(ds);
    int shards = (int)di.shards;
    CHECK(shards >= 3);
    CHECK_EQ(cold.fs.cache_misses, (uint64_t)shards);
    CHECK_EQ(atomic_load(&srv.whole_gets), shards);
    CHECK_EQ(cold.fs.failures, 0);
    run_out warm = run(url("big"), 2, tu_path("cache-cold"), NULL, 0, 2);
    CHECK(warm.hash == local.hash);
    CHECK_EQ(warm.fs.cache_partial_reads, 0);
    CHECK_EQ(warm.fs.cache_cold_ranged, 0);
    CHECK_EQ(warm.fs.cache_download_parts, 0);
    CHECK_EQ(atomic_load(&srv.whole_gets), shards);
    server_stop();
    stk__fetch_part_bytes = 8ull << 20;
}

/* A download that fails midway (each shard's second part cut half-way, no
 * retries): the samples read from its other parts while it ran stay good,
 * the rest come by range; nothing is delivered twice or lost. */
static void test_cold_download_cut_midway(void)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/big", g_www);
    run_out local = run(dir, 2, NULL, NULL, 0, 1);
    stk__fetch_part_bytes = TEST_PART;
    server_start(g_www, F_CUT_WHOLE);
    g_extra[0] = "fetch_retries";
    g_extra[1] = "0";
    run_out r = run(url("big"), 2, tu_path("cache-cut"), NULL, STK_ON_ERROR_RAISE, 1);
    g_extra[0] = NULL;
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK_EQ(r.samples, local.samples);
    CHECK(r.hash == local.hash);
    CHECK(r.fs.cache_partial_reads > 0);
    CHECK(r.fs.cache_fallbacks > 0);
    if (r.msg[0])
        fprintf(stderr, "    unexpected: %s\n", r.msg);
    server_stop();
    stk__fetch_part_bytes = 8ull << 20;
}

/* A part cut half-way once is retried (the engine's retries), in place in
 * the cache file: every download completes, nothing falls back to ranges,
 * and the warm run reads only the cache, equal to a local read. */
static void test_cold_download_part_retried(void)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/big", g_www);
    run_out local = run(dir, 2, NULL, NULL, 0, 1);
    stk__fetch_part_bytes = TEST_PART;
    server_start(g_www, F_CUT_PART_ONCE);
    g_consumer_ms = 30;
    run_out r = run(url("big"), 2, tu_path("cache-retry"), NULL, STK_ON_ERROR_RAISE, 1);
    g_consumer_ms = 0;
    uint64_t shards = (uint64_t)shards_of(dir);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK_EQ(r.samples, local.samples);
    CHECK(r.hash == local.hash);
    CHECK_EQ(r.fs.cache_fallbacks, 0);
    CHECK_EQ(r.fs.cache_misses, shards);
    CHECK(r.fs.retries >= shards);
    CHECK(r.fs.cache_download_parts >= 3 * shards &&
          r.fs.cache_download_parts <= TEST_PARTS_MAX * shards);
    run_out warm = run(url("big"), 2, tu_path("cache-retry"), NULL, STK_ON_ERROR_RAISE, 1);
    CHECK(warm.hash == local.hash);
    CHECK_EQ(warm.fs.cache_misses, 0);
    CHECK_EQ(warm.fs.cache_cold_ranged, 0);
    CHECK_EQ(warm.fs.cache_download_parts, 0);
    if (r.msg[0])
        fprintf(stderr, "    unexpected: %s\n", r.msg);
    server_stop();
    stk__fetch_part_bytes = 8ull << 20;
}

/* A lookahead of a million small samples plans in a loop, not one stack
 * frame per 64 samples (that overflowed the stack at open), and the option
 * is bounded. */
static void test_huge_lookahead(void)
{
    char dir[1200], path[1300], err[512];
    snprintf(dir, sizeof dir, "%s/tiny", g_www);
    tu_mkdirs(dir);
    snprintf(path, sizeof path, "%s/t.stk", dir);
    stk__stk_header h = {0};
    h.kind = STK_PAYLOAD_ENCODED;
    stk__stk_writer *w;
    REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
    for (int k = 0; k < 1000; k++) {
        uint8_t v = (uint8_t)k;
        REQUIRE(stk__stkw_add(w, &v, 1, k % 3, NULL, 0, 0, err, sizeof err) == STK_OK);
    }
    uint64_t fsize;
    REQUIRE(stk__stkw_finish(w, 3, &fsize, err, sizeof err) == STK_OK);
    server_start(g_www, F_NONE);
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "fetch_lookahead", "1048577"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "fetch_lookahead", "4G"), STK_EINVAL);
    stk_options_set_source(o, url("tiny/t.stk"));
    stk_options_set_batch_size(o, 10);
    stk_options_set_threads(o, 2);
    stk_options_set_shuffle(o, 0); /* neighbours merge: small requests */
    REQUIRE(stk_options_set(o, "fetch_lookahead", "1000000") == STK_OK);
    stk_loader *l = NULL;
    int rc = stk_loader_open(&l, o);
    stk_options_destroy(o);
    CHECK_EQ(rc, STK_OK);
    stk_batch *b;
    for (int k = 0; rc == STK_OK && k < 3; k++) {
        CHECK_EQ(stk_loader_next(l, &b), STK_OK);
        for (size_t j = 0; j < b->size; j++)
            CHECK_EQ(((uint8_t *)b->data)[b->offsets[j]], (uint8_t)(k * 10 + (int)j));
        stk_batch_release(b);
    }
    stk_loader_close(l);
    server_stop();
}

/* One session against the server with the n-th library allocation failing
 * (test_oom.c's sweep, for the fetch stage and the disk cache): open, two
 * epochs, close. Returns open's code. Once open, nothing may be lost: an
 * allocation failure while reading ahead is no fault of a sample. */
#define MIX_FILES 20
static char g_mixdir[1024];

/* g_oom_mix: the session reads a mixture (the folder of test_mixture_*, and
 * one shard of each remote set), each sample once an epoch. */
static bool g_oom_mix;

static int oom_session(const char *cache_dir, long n, bool *reached)
{
    stk_options *o = NULL;
    stk_loader *l = NULL;
    long c0 = stk__alloc_count();
    stk__alloc_fail_after(n);
    int rc = stk_options_create(&o);
    uint64_t total = g_oom_mix ? MIX_FILES + 2 * PER_SHARD : PER_SHARD;
    if (rc == STK_OK && g_oom_mix) {
        if ((rc = stk_options_add_source(o, g_mixdir, 0, 0)) == STK_OK &&
            (rc = stk_options_add_source(o, url("ds/part-000003.stk"), 0, 0)) == STK_OK)
            rc = stk_options_add_source(o, url("ds2/part-000001.stk"), 0, 0);
    } else if (rc == STK_OK) {
        rc = stk_options_set_source(o, url("ds/part-000003.stk"));
    }
    if (rc == STK_OK) {
        stk_options_set_batch_size(o, 5);
        stk_options_set_threads(o, 2);
        stk_options_set_seed(o, 3);
        if ((rc = stk_options_set(o, "fetch_lookahead", "12")) == STK_OK && cache_dir)
            rc = stk_options_set(o, "cache_dir", cache_dir);
        if (rc == STK_OK)
            rc = stk_loader_open(&l, o);
    }
    if (rc == STK_OK) {
        for (int e = 0; e < 2; e++) {
            uint8_t seen[MIX_FILES + 2 * PER_SHARD] = {0};
            uint64_t count = 0;
            stk_batch *b;
            int r;
            while ((r = stk_loader_next(l, &b)) != STK_END) {
                if (r != STK_OK) {
                    fprintf(stderr, "    n=%ld: next: %s (%s)\n", n, stk_strerror(r),
                            stk_loader_errmsg(l));
                    CHECK(0);
                    break;
                }
                for (size_t k = 0; k < b->size; k++) {
                    uint64_t i = b->indices[k];
                    CHECK(i < total && !seen[i < total ? i : 0]);
                    seen[i < total ? i : 0] = 1;
                    count++;
                }
                stk_batch_release(b);
            }
            CHECK_EQ(count, total);
        }
    } else if (rc != STK_ENOMEM) {
        fprintf(stderr, "    n=%ld: open: %s (%s)\n", n, stk_strerror(rc),
                l ? stk_loader_errmsg(l) : "");
    }
    stk_loader_close(l);
    stk_options_destroy(o);
    stk__alloc_fail_after(-1);
    *reached = stk__alloc_count() - c0 > n;
    return rc;
}

/* The allocation-failure sweep over a remote source (g_oom_mix: a mixture
 * of a local folder and two remote shards), without and with the disk
 * cache: every session ends (a request completed at once for want of
 * memory used to deadlock the fetch stage, whose lock its callback takes),
 * opens or fails with STK_ENOMEM, delivers each sample once per epoch, and
 * leaks nothing. */
static void test_oom_sweep(void)
{
    server_start(g_www, F_NONE);
    for (int cached = 0; cached < 2; cached++) {
        long live0 = stk__alloc_live();
        int fds0 = tu_count_fds();
        long n;
        int nomem = 0;
        /* Over a mixture every point costs three stores' set-up: the short
         * form takes every 4th point (a different residue each pass);
         * STK_OOM_FULL=1 takes them all (docs/remote.md, "The network fault
         * soak"). */
        long step = g_oom_mix && !getenv("STK_OOM_FULL") ? 4 : 1;
        long it = 0;
        for (n = g_oom_mix && step > 1 ? cached : 0; n < 20000; n += step, it++) {
            char dir[64];
            snprintf(dir, sizeof dir, "oomcache-%ld", n);
            if (it % 16 == 15) { /* the server takes MAX_CONN connections in all */
                server_stop();
                server_start(g_www, F_NONE);
            }
            bool reached;
            int rc = oom_session(cached ? tu_path(dir) : NULL, n, &reached);
            CHECK(rc == STK_OK || rc == STK_ENOMEM);
            nomem += rc == STK_ENOMEM;
            /* The server's side of a connection closes a moment after the
             * client's. */
            for (int k = 0; k < 200 && tu_count_fds() != fds0; k++)
                usleep(10000);
            if (stk__alloc_live() != live0 || tu_count_fds() != fds0) {
                fprintf(stderr, "    n=%ld leaked %ld allocations, %d fds\n", n,
                        stk__alloc_live() - live0, tu_count_fds() - fds0);
                CHECK(0);
                break;
            }
            if (!reached)
                break;
        }
        printf("    %s%s: %ld allocation points, %d failed to open with ENOMEM\n",
               g_oom_mix ? "mixture, " : "", cached ? "cached" : "ranged", n, nomem);
        CHECK(n > 20 && n < 20000);
    }
    server_stop();
}

/* A sample larger than fetch_buffer is fetched once per read: planned alone,
 * past the budget. */
static void test_sample_larger_than_buffer(void)
{
    char dir[1200], path[1300], err[512];
    snprintf(dir, sizeof dir, "%s/big", g_www);
    tu_mkdirs(dir);
    snprintf(path, sizeof path, "%s/one.stk", dir);
    stk__stk_header h = {0};
    h.kind = STK_PAYLOAD_ENCODED;
    stk__stk_writer *w;
    REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
    size_t big = 3u << 20;
    uint8_t *data = malloc(big);
    for (size_t j = 0; j < big; j++)
        data[j] = (uint8_t)(j * 7 + j / 4096);
    for (int k = 0; k < 12; k++) {
        size_t n = k == 5 ? big : 1000 + (size_t)k;
        REQUIRE(stk__stkw_add(w, data, n, k % 3, NULL, 0, 0, err, sizeof err) == STK_OK);
    }
    uint64_t fsize;
    REQUIRE(stk__stkw_finish(w, 3, &fsize, err, sizeof err) == STK_OK);
    free(data);
    g_extra[0] = "fetch_buffer";
    g_extra[1] = "1M";
    g_extra[2] = "batch_memory";
    g_extra[3] = "8M";
    for (unsigned t = 1; t <= 3; t += 2) {
        server_start(g_www, F_NONE);
        run_out r = run(url("big/one.stk"), t, NULL, NULL, STK_ON_ERROR_RAISE, 6);
        uint64_t got = atomic_load(&srv.big_bytes);
        server_stop();
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK_EQ(r.samples, 6 * 12);
        /* Each read of the big sample is one request of it, plus at most
         * one planned ahead past the budget and one per worker whose read
         * ended after the stats were taken (a double fetch of each read
         * would be about twice `reads`). */
        uint64_t reads = r.fs.sample_bytes / big;
        fprintf(stderr, "    %u threads: %llu big reads, %llu bytes of big replies (%.2f each)\n",
                t, (unsigned long long)reads, (unsigned long long)got, (double)got / (double)big);
        CHECK(got <= (reads + 1 + t) * (big + 64 * 1024));
    }
    g_extra[0] = NULL;
}

/* ---- the S3 XML parsers, on bodies a server might send ---------------------- */

static int list_page(const char *body, const char *prefix, char ***names, uint64_t **sizes,
                     size_t *n, bool *more, char **token, char *err, size_t errlen)
{
    size_t cap = 0;
    *names = NULL;
    *sizes = NULL;
    *n = 0;
    return stk__s3_list_page(body, strlen(body), prefix, names, sizes, n, &cap, more, token, err,
                             errlen);
}

/* Two long pages appended to one listing (names and sizes grow together,
 * past many doublings), and the same under every allocation failure: each
 * run ends STK_OK or STK_ENOMEM, keeps the entries it had, leaks nothing. */
static void test_s3_list_pages_grow(void)
{
    enum { PAGE = 100 };
    char *body[2];
    for (int pg = 0; pg < 2; pg++) {
        size_t len = 0, room = (size_t)PAGE * 80 + 1;
        REQUIRE((body[pg] = malloc(room)));
        for (int k = 0; k < PAGE; k++)
            len += (size_t)snprintf(body[pg] + len, room - len,
                                    "<Contents><Key>p/%d-%04d.stk</Key><Size>%d</Size></Contents>",
                                    pg, k, pg * PAGE + k);
    }
    long live = stk__alloc_live();
    for (long f = -1;; f++) {
        char **names = NULL;
        uint64_t *sizes = NULL;
        size_t n = 0, cap = 0;
        bool more;
        char *token = NULL, err[256] = "";
        int rc = STK_OK;
        stk__alloc_fail_after(f);
        for (int pg = 0; pg < 2 && rc == STK_OK; pg++)
            rc = stk__s3_list_page(body[pg], strlen(body[pg]), "p/", &names, &sizes, &n, &cap,
                                   &more, &token, err, sizeof err);
        stk__alloc_fail_after(-1);
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        CHECK(n <= cap);
        int bad = 0;
        for (size_t k = 0; k < n; k++) {
            char want[32];
            snprintf(want, sizeof want, "%d-%04d.stk", (int)(k / PAGE), (int)(k % PAGE));
            bad += strcmp(names[k], want) != 0 || sizes[k] != k;
        }
        CHECK_EQ(bad, 0);
        stk__free(token);
        stk__remote_list_free(names, sizes, n);
        CHECK_EQ(stk__alloc_live(), live);
        if (f < 0) {
            CHECK_EQ(rc, STK_OK);
            CHECK_EQ(n, 2 * PAGE);
        } else if (rc == STK_OK) {
            break; /* past the last allocation */
        }
    }
    free(body[0]);
    free(body[1]);
}

static void test_s3_list_page(void)
{
    char **names;
    uint64_t *sizes;
    size_t n;
    bool more;
    char *token;
    char err[256] = "";
    const char *page =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Prefix>train/</Prefix>"
        "<IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>1ue/Gc&amp;x=</NextContinuationToken>"
        "<Contents><Key>train/</Key><Size>0</Size></Contents>"
        "<Contents><Key>train/a&amp;b.stk</Key><Size>1048576</Size></Contents>"
        "<Contents><Key>other/c.stk</Key><Size>5</Size></Contents>"
        "<Contents><Key>train/d.stk</Key><Size>18446744073709551615</Size></Contents>"
        "</ListBucketResult>";
    CHECK_EQ(list_page(page, "train/", &names, &sizes, &n, &more, &token, err, sizeof err), STK_OK);
    CHECK_EQ(n, 2);
    if (n == 2) {
        CHECK(!strcmp(names[0], "a&b.stk") && sizes[0] == 1048576);
        CHECK(!strcmp(names[1], "d.stk") && sizes[1] == UINT64_MAX);
    }
    CHECK(more && token && !strcmp(token, "1ue/Gc&x="));
    stk__free(token);
    stk__remote_list_free(names, sizes, n);

    /* The last page: no token asked for. */
    CHECK_EQ(list_page("<IsTruncated>false</IsTruncated><Contents><Key>x</Key><Size>7</Size>"
                       "</Contents>",
                       "", &names, &sizes, &n, &more, &token, err, sizeof err),
             STK_OK);
    CHECK(n == 1 && !more && !token);
    stk__remote_list_free(names, sizes, n);

    /* A size that is not a number is an error naming the object, not 0 or
     * (for "-1") 2^64 - 1. */
    const char *bad[] = {"abc", "-1", "", " 12", "12kB", "18446744073709551616"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char body[256];
        snprintf(body, sizeof body,
                 "<Contents><Key>t/ok.stk</Key><Size>3</Size></Contents>"
                 "<Contents><Key>t/x.stk</Key><Size>%s</Size></Contents>",
                 bad[k]);
        err[0] = '\0';
        CHECK_EQ(list_page(body, "t/", &names, &sizes, &n, &more, &token, err, sizeof err),
                 STK_EFORMAT);
        CHECK(strstr(err, "t/x.stk") && strstr(err, "not a number"));
        stk__remote_list_free(names, sizes, n);
    }

    /* Truncated without a token, or with an empty one (which would ask for
     * the first page again, forever). */
    const char *notoken[] = {"<IsTruncated>true</IsTruncated>",
                             "<IsTruncated>true</IsTruncated><NextContinuationToken>"
                             "</NextContinuationToken>",
                             "<IsTruncated>true</IsTruncated><NextContinuationToken>abc"};
    for (size_t k = 0; k < sizeof notoken / sizeof *notoken; k++) {
        err[0] = '\0';
        token = NULL;
        CHECK_EQ(list_page(notoken[k], "", &names, &sizes, &n, &more, &token, err, sizeof err),
                 STK_EFORMAT);
        CHECK(strstr(err, "continuation token") != NULL);
        stk__free(token);
        stk__remote_list_free(names, sizes, n);
    }

    /* The parser honours len and stops at a NUL byte, as the string
     * functions did: the second entry is past both. */
    const char twice[] = "<Contents><Key>a</Key><Size>1</Size></Contents>\0"
                         "<Contents><Key>b</Key><Size>2</Size></Contents>";
    size_t cap = 0;
    names = NULL;
    sizes = NULL;
    n = 0;
    CHECK_EQ(stk__s3_list_page(twice, sizeof twice - 1, "", &names, &sizes, &n, &cap, &more, &token,
                               err, sizeof err),
             STK_OK);
    CHECK_EQ(n, 1);
    stk__remote_list_free(names, sizes, n);
    names = NULL;
    sizes = NULL;
    n = cap = 0;
    CHECK_EQ(
        stk__s3_list_page(twice, 30, "", &names, &sizes, &n, &cap, &more, &token, err, sizeof err),
        STK_OK);
    CHECK_EQ(n, 0);
    stk__remote_list_free(names, sizes, n);
}

static void test_xml_unescape(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"a&amp;b&lt;c&gt;d&quot;e&apos;f", "a&b<c>d\"e'f"},
        {"&#65;&#x42;&#xe9;&#x4E2D;&#x1F600;", "AB\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80"},
        {"&#x10FFFF;", "\xf4\x8f\xbf\xbf"},
        /* Left as they are: a lone '&', unknown names, out of range, NUL,
         * no digits, and (once decoded by strtoul) a sign, blanks, and
         * surrogates, which are not characters. */
        {"a & b &&amp", "a & b &&amp"},
        {"&nbsp;&#x110000;&#xFFFFFFFF;&#0;&#x;&#;", "&nbsp;&#x110000;&#xFFFFFFFF;&#0;&#x;&#;"},
        {"&#-18446744073709551615;&#x-1;&# 65;&#+65;",
         "&#-18446744073709551615;&#x-1;&# 65;&#+65;"},
        {"&#xD800;&#57343;", "&#xD800;&#57343;"},
        {"&#0000000065;&#00000000000000065;", "A&#00000000000000065;"}, /* 16 bytes at most */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", cases[k].in);
        stk__xml_unescape(buf);
        if (strcmp(buf, cases[k].out))
            fprintf(stderr, "  xml_unescape(\"%s\") = \"%s\"\n", cases[k].in, buf);
        CHECK(!strcmp(buf, cases[k].out));
    }
}

static void test_s3_error_text(void)
{
    char out[384];
    stk__s3_error_text("<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>The "
                       "specified bucket does not exist</Message></Error>",
                       out, sizeof out);
    CHECK(!strcmp(out, " NoSuchBucket: The specified bucket does not exist"));
    stk__s3_error_text("<Error><Code>SlowDown</Code><Message>cut sho", out, sizeof out);
    CHECK(!strcmp(out, " SlowDown"));
    stk__s3_error_text("<html>502 Bad Gateway</html>", out, sizeof out);
    CHECK(!strcmp(out, ""));
}

/* ---- issue 18: secrets, names, schemes, listing loops, final errors ------------- */

/* Opens path with the test's settings plus key=value pairs; returns the open's
 * rc and copies its message. */
static int open_msg(const char *path, const char *const *kv, char *msg, size_t n)
{
    stk_options *o;
    stk_loader *l = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, path) == STK_OK);
    stk_options_set_batch_size(o, 8);
    stk_options_set_threads(o, 1);
    if (strstr(path, "://"))
        REQUIRE(stk_options_set(o, "fetch_timeout", "2") == STK_OK);
    for (; kv && kv[0]; kv += 2)
        REQUIRE(stk_options_set(o, kv[0], kv[1]) == STK_OK);
    int rc = stk_loader_open(&l, o);
    snprintf(msg, n, "%s", rc ? stk_loader_errmsg(l) : "");
    stk_loader_close(l);
    stk_options_destroy(o);
    return rc;
}

/* Remote options on a local path, and cache_limit without cache_dir, would
 * change nothing: the open refuses them, naming the option (issue 18). */
static void test_unused_remote_options_are_refused(void)
{
    char msg[512];
    const char *const retries[] = {"fetch_retries", "3", NULL};
    CHECK_EQ(open_msg(g_ds, retries, msg, sizeof msg), STK_EINVAL);
    CHECK(strstr(msg, "fetch_retries applies to remote datasets") != NULL);
    const char *const cache[] = {"cache_dir", tu_path("c-local"), NULL};
    CHECK_EQ(open_msg(g_ds, cache, msg, sizeof msg), STK_EINVAL);
    CHECK(strstr(msg, "cache_dir applies to remote datasets") != NULL);
    const char *const limit[] = {"cache_limit", "16MiB", NULL};
    CHECK_EQ(open_msg(url("ds"), limit, msg, sizeof msg), STK_EINVAL);
    CHECK(strstr(msg, "cache_limit is the size limit of the disk cache: set cache_dir") != NULL);
}

static void test_url_display(void)
{
    char b[512];
    CHECK(!strcmp(stk__url_display("http://alice:PW@h:8/ds", b, sizeof b), "http://h:8/ds"));
    CHECK(!strcmp(
        stk__url_display("https://a:b@c@h/x.stk?X-Amz-Signature=S&X-Amz-Credential=C", b, sizeof b),
        "https://h/x.stk?..."));
    CHECK(!strcmp(stk__url_display("s3://bkt/p#frag", b, sizeof b), "s3://bkt/p?..."));
    CHECK(!strcmp(stk__url_display("http://h/a@b/x.stk", b, sizeof b), "http://h/a@b/x.stk"));
    /* Local paths come back as they are. */
    const char *local = "/data/x?y@z";
    CHECK(stk__url_display(local, b, sizeof b) == local);
    CHECK(stk__is_url("ftp://host/ds") && stk__is_url("S3://b/p") && !stk__is_url("/a://b") &&
          !stk__is_url("data/train"));
}

static void test_secrets_never_in_messages(void)
{
    server_start(g_www, F_NONE);
    char src[1024], msg[2048];
    /* The loader's own messages (here: a float dtype without a transform). */
    snprintf(src, sizeof src, "http://alice:PW_hunter2@127.0.0.1:%d/ds", srv.port);
    const char *const f32[] = {"dtype", "float32", NULL};
    CHECK_EQ(open_msg(src, f32, msg, sizeof msg), STK_EINVAL);
    CHECK(strstr(msg, "float32") && strstr(msg, "127.0.0.1"));
    CHECK(!strstr(msg, "hunter2") && !strstr(msg, "alice"));
    /* A transfer's failure, for a presigned URL. */
    snprintf(src, sizeof src,
             "http://alice:PW_hunter2@127.0.0.1:%d/ds/part-000099.stk?X-Amz-Algorithm=AWS4"
             "&X-Amz-Credential=AKIDSECRETCRED&X-Amz-Security-Token=TOKSECRET"
             "&X-Amz-Signature=SIGSECRET",
             srv.port);
    CHECK(open_msg(src, NULL, msg, sizeof msg) != STK_OK);
    CHECK(strstr(msg, "part-000099.stk"));
    CHECK(!strstr(msg, "hunter2") && !strstr(msg, "SECRET"));
    /* An error the source detection writes itself. */
    const char *const rec[] = {"dtype", "uint8", NULL};
    snprintf(src, sizeof src, "http://alice:PW_hunter2@127.0.0.1:%d/d{0..1}s/x.stk?sig=SIGSECRET",
             srv.port);
    CHECK(open_msg(src, rec, msg, sizeof msg) != STK_OK);
    CHECK(msg[0] && !strstr(msg, "hunter2") && !strstr(msg, "SECRET"));
    server_stop();
}

static void test_unsupported_scheme_is_not_a_path(void)
{
    char msg[2048];
    CHECK_EQ(open_msg("ftp://host/ds", NULL, msg, sizeof msg), STK_EUNSUPPORTED);
    CHECK(strstr(msg, "unsupported URL scheme") && strstr(msg, "ftp"));
    CHECK(!strstr(msg, "No such file"));
}

static void test_s3_bucket_names_are_validated(void)
{
    server_start(g_www, F_NONE);
    char u[512], ep[128], err[1024];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secretkey", 1);
    setenv("AWS_SESSION_TOKEN", "sessiontoken", 1);
    /* With virtual-host addressing the bucket becomes the host: here it
     * would be 127.0.0.1:PORT, the signed request sent there. */
    stk__remote_cfg virt = {.addressing = 2};
    snprintf(u, sizeof u, "s3://127.0.0.1:%d?/train/x.stk", srv.port);
    stk__remote *r = NULL;
    err[0] = '\0';
    CHECK_EQ(stk__remote_open(&r, u, &virt, err, sizeof err), STK_EINVAL);
    CHECK(r == NULL);
    CHECK(strstr(err, "not a valid S3 bucket name"));
    snprintf(u, sizeof u, "s3://localhost:%d?/train/x.stk", srv.port);
    stk__remote_cfg dflt = {0};
    err[0] = '\0';
    CHECK_EQ(stk__remote_open(&r, u, &dflt, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "not a valid S3 bucket name"));
    const char *bad[] = {"s3://ab/x.stk",          "s3://Upper/x.stk",   "s3://a_b_c/x.stk",
                         "s3://-abc/x.stk",        "s3://abc-/x.stk",    "s3://a..b/x.stk",
                         "s3://192.168.5.4/x.stk", "s3://user@bkt/x.stk"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        err[0] = '\0';
        CHECK_EQ(stk__remote_open(&r, bad[k], &virt, err, sizeof err), STK_EINVAL);
        CHECK(strstr(err, "not a valid S3 bucket name"));
    }
    CHECK_EQ(atomic_load(&srv.requests), 0); /* nothing was sent anywhere */
    /* Valid names open (path-style against the test server). */
    stk__remote_cfg path = {.endpoint = ep, .addressing = 1};
    CHECK_EQ(stk__remote_open(&r, "s3://my-bucket.v2/p/x.stk", &path, err, sizeof err), STK_OK);
    stk__remote_close(r);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    server_stop();
}

static void test_listing_with_a_repeated_token_ends(void)
{
    /* A "bucket" whose every listing page says: truncated, continue at T.
     * Path-style, the listing is GET /lbkt?..., which the server answers
     * with this file whatever the query. */
    const char *page = "<?xml version=\"1.0\"?><ListBucketResult><Name>lbkt</Name>"
                       "<Contents><Key>ds/a.txt</Key><Size>1</Size></Contents>"
                       "<IsTruncated>true</IsTruncated>"
                       "<NextContinuationToken>T0k/en+=</NextContinuationToken>"
                       "</ListBucketResult>";
    tu_write_file(tu_path("www/lbkt"), page, strlen(page));
    server_start(g_www, F_NONE);
    char ep[128], err[1024] = "";
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    stk__remote_cfg cfg = {.endpoint = ep, .addressing = 1};
    stk__remote *r = NULL;
    REQUIRE(stk__remote_open(&r, "s3://lbkt/ds", &cfg, err, sizeof err) == STK_OK);
    char **names = NULL;
    uint64_t *sizes = NULL;
    size_t n = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk__remote_list(r, &names, &sizes, &n, err, sizeof err), STK_EFORMAT);
    CHECK(secs_since(&t0) < 5);
    CHECK(strstr(err, "continuation token of an earlier page"));
    CHECK(atomic_load(&srv.requests) == 2);
    stk__remote_close(r);
    server_stop();
    unlink(tu_path("www/lbkt"));
}

static void test_deterministic_errors_are_final(void)
{
    server_start(g_www, F_NONE);
    char u[512], err[1024] = "";
    stk__remote *r = NULL;
    stk__remote_cfg cfg = {.backoff_ms = 200}; /* 6 retries by default */
    struct timespec t0;
    /* https to a plain HTTP server: the handshake fails the same way each
     * time. */
    snprintf(u, sizeof u, "https://127.0.0.1:%d/ds/part-000000.stk", srv.port);
    REQUIRE(stk__remote_open(&r, u, &cfg, err, sizeof err) == STK_OK);
    char *body = NULL;
    size_t len = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk__remote_get_small(r, "", 1 << 20, &body, &len, err, sizeof err), STK_EIO);
    CHECK(secs_since(&t0) < 1.0);
    CHECK(strstr(err, "TLS") && strstr(err, "not retried"));
    stk__remote_counters c;
    stk__remote_counters_get(r, &c);
    CHECK_EQ(c.requests, 1);
    CHECK_EQ(c.retries, 0);
    stk__remote_close(r);
    /* A host that does not resolve (.invalid never does, RFC 6761). */
    REQUIRE(stk__remote_open(&r, "http://stoker-test.invalid/ds/x.stk", &cfg, err, sizeof err) ==
            STK_OK);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(stk__remote_get_small(r, "", 1 << 20, &body, &len, err, sizeof err), STK_EIO);
    CHECK(strstr(err, "resolve") && strstr(err, "not retried"));
    stk__remote_counters_get(r, &c);
    CHECK_EQ(c.requests, 1);
    CHECK_EQ(c.retries, 0);
    stk__remote_close(r);
    server_stop();
}

static void test_auth_message_fits_the_scheme(void)
{
    server_start(g_www, F_401);
    char msg[2048], src[512];
    snprintf(src, sizeof src, "http://127.0.0.1:%d/ds", srv.port);
    CHECK_EQ(open_msg(src, NULL, msg, sizeof msg), STK_EIO);
    CHECK(strstr(msg, "401") && strstr(msg, "HTTP authentication"));
    CHECK(!strstr(msg, "S3"));
    /* s3:// without credentials: the request went unsigned. */
    char ep[128];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    const char *creds[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "AWS_PROFILE"};
    for (size_t k = 0; k < sizeof creds / sizeof *creds; k++)
        unsetenv(creds[k]);
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent", 1);
    setenv("AWS_CONFIG_FILE", "/nonexistent", 1);
    const char *const kv[] = {"endpoint", ep, NULL};
    CHECK_EQ(open_msg("s3://bkt/ds", kv, msg, sizeof msg), STK_EIO);
    CHECK(strstr(msg, "401") && strstr(msg, "no S3 credentials"));
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    server_stop();
}

static void test_open_against_a_hung_server_is_parallel(void)
{
    /* 12 shards named by a pattern (no manifest to read first) on a server
     * that accepts and never answers: every shard's index read stalls. In
     * parallel the open fails after about (retries + 1) x fetch_timeout; one
     * at a time it took shards x that. */
    server_start(g_www, F_HANG);
    char src[512], msg[2048];
    snprintf(src, sizeof src, "http://127.0.0.1:%d/ds/part-{000000..000011}.stk", srv.port);
    const char *const kv[] = {"fetch_timeout", "1", "fetch_retries", "1", NULL};
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(open_msg(src, kv, msg, sizeof msg) != STK_OK);
    double s = secs_since(&t0);
    /* 2 attempts of 1 s each plus a backoff under 0.2 s; 12 x 2 x 1 s serial. */
    CHECK(s < 6.0);
    CHECK(msg[0]);
    server_stop();
}

/* ---- the consolidated index (stoker.index) ----------------------------------- */

/* Packs `shards` shards of `per` samples each with stk_writer (which writes
 * stoker.index and names it in the manifest) into dir; salt changes the
 * bytes (another pack of the same shape). */
static void make_indexed(const char *dir, int shards, int per, int salt)
{
    stk_writer *w = NULL;
    stk_writer_options o = {
        .struct_size = sizeof o, .shard_size = (uint64_t)per * 64, .num_classes = 5};
    char err[512];
    REQUIRE(stk_writer_open(&w, dir, &o, err, sizeof err) == STK_OK);
    for (int i = 0; i < shards * per; i++) {
        uint8_t data[64];
        for (size_t j = 0; j < sizeof data; j++)
            data[j] = (uint8_t)(i * 29 + (int)j * 3 + salt);
        char key[32];
        snprintf(key, sizeof key, "k%d", i);
        REQUIRE(stk_writer_add(w, data, sizeof data, i % 5, key) == STK_OK);
    }
    stk_pack_result r = {.struct_size = sizeof r};
    REQUIRE(stk_writer_finish(w, &r) == STK_OK);
    REQUIRE(r.shards == (uint64_t)shards);
    stk_writer_close(w);
}

/* run() over epochs; the warnings of its open are left in g_warnings. They
 * come through the warning channel (stk_options_set_warning), or with
 * on_stderr through the library's default, stderr (what the CLI shows),
 * captured in a file. Either way nothing else may reach stderr. */
static run_out run_warned(const char *path, const char *cache_dir, int epochs, bool on_stderr)
{
    char f[1024];
    snprintf(f, sizeof f, "%s", tu_path("stderr.txt"));
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    dup2(fd, STDERR_FILENO);
    close(fd);
    g_warnings[0] = '\0';
    g_collect_warnings = !on_stderr;
    run_out r = run(path, 2, cache_dir, NULL, STK_ON_ERROR_RAISE, epochs);
    g_collect_warnings = false;
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    size_t n = 0;
    char *t = tu_read_file(f, &n);
    if (on_stderr)
        snprintf(g_warnings, sizeof g_warnings, "%.*s", (int)n, t ? t : "");
    else
        CHECK_EQ(n, 0); /* the channel took every warning */
    free(t);
    return r;
}

#define MANY     500
#define MANY_PER 1

/* Requests the open of path alone makes (stk_dataset_open: no fetch stage
 * reading ahead), with cache_dir when not NULL. */
static int open_requests(const char *path, const char *cache_dir, int *rc)
{
    stk_options *o;
    stk_dataset *d = NULL;
    char err[1024];
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set(o, "fetch_concurrency", "8") == STK_OK);
    if (cache_dir)
        REQUIRE(stk_options_set(o, "cache_dir", cache_dir) == STK_OK);
    int before = atomic_load(&srv.requests);
    *rc = stk_dataset_open(&d, path, o, err, sizeof err);
    int n = atomic_load(&srv.requests) - before;
    if (*rc)
        fprintf(stderr, "open: %s\n", err);
    stk_dataset_close(d);
    stk_options_destroy(o);
    return n;
}

/* A dataset of many tiny shards opens from its index with one request after
 * the manifest's, not three a shard, and gives the batches a local read
 * gives; with a cache directory, a second open (another rank of the node)
 * reads the index from disk, and a cached copy damaged on disk is fetched
 * again. */
static void test_index_many_shards(void)
{
    char dir[1100];
    int rc;
    snprintf(dir, sizeof dir, "%s/many", g_www);
    make_indexed(dir, MANY, MANY_PER, 0);
    run_out local = run(dir, 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK_EQ(local.open_rc, STK_OK);
    CHECK_EQ(local.samples, MANY * MANY_PER);
    server_start(g_www, F_NONE);
    g_delay_us = 25000; /* every answer 25 ms late: a round trip of some 50 ms */
    int n = open_requests(url("many"), NULL, &rc);
    CHECK_EQ(rc, STK_OK);
    printf("    indexed open of %d shards: %d requests\n", MANY, n);
    CHECK_EQ(n, 2); /* the manifest, the index */
    /* Every batch as a local read's (by ranges, many in flight). */
    g_extra[0] = "fetch_concurrency";
    g_extra[1] = "32";
    g_extra[2] = "fetch_lookahead";
    g_extra[3] = "256";
    run_out r = run(url("many"), 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    g_extra[0] = NULL;
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK(r.hash == local.hash && r.samples == local.samples);
    /* The index kept on disk: a second open reads it there. */
    const char *cache = tu_path("icache");
    CHECK_EQ(open_requests(url("many"), cache, &rc), 2);
    CHECK_EQ(rc, STK_OK);
    CHECK_EQ(open_requests(url("many"), cache, &rc), 1); /* the manifest alone */
    CHECK_EQ(rc, STK_OK);
    char cdir[1200];
    snprintf(cdir, sizeof cdir, "%s/stoker-index", cache);
    DIR *d = opendir(cdir);
    struct dirent *e;
    int cached = 0;
    while (d && (e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl > 9 && !strcmp(e->d_name + nl - 9, ".stkindex")) {
            char p[2400];
            snprintf(p, sizeof p, "%s/%s", cdir, e->d_name);
            size_t len = 0;
            uint8_t *b = tu_read_file(p, &len);
            b[len / 2] ^= 1;
            tu_write_file(p, b, len);
            free(b);
            cached++;
        }
    }
    if (d)
        closedir(d);
    CHECK_EQ(cached, 1);
    CHECK_EQ(open_requests(url("many"), cache, &rc), 2); /* fetched again */
    CHECK_EQ(rc, STK_OK);
    CHECK_EQ(open_requests(url("many"), cache, &rc), 1); /* and replaced */
    g_delay_us = 0;
    server_stop();
}

/* Small packs for the failure cases: a fresh copy each. */
static void index_case(const char *name, int salt)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/%s", g_www, name);
    make_indexed(dir, 12, 3, salt);
}

static uint64_t local_hash(const char *name)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/%s", g_www, name);
    run_out l = run(dir, 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK_EQ(l.open_rc, STK_OK);
    return l.hash;
}

static void file_of(const char *name, const char *file, char *out, size_t n)
{
    snprintf(out, n, "%s/%s/%s", g_www, name, file);
}

/* A missing, truncated or corrupt index: a warning, and the shards are
 * opened one by one (the same batches). */
static void test_index_broken_falls_back(void)
{
    char p[1300];
    index_case("ix-corrupt", 1);
    index_case("ix-trunc", 2);
    index_case("ix-gone", 3);
    uint64_t h1 = local_hash("ix-corrupt"), h2 = local_hash("ix-trunc"), h3 = local_hash("ix-gone");
    file_of("ix-corrupt", "stoker.index", p, sizeof p);
    size_t n = 0;
    uint8_t *b = tu_read_file(p, &n);
    b[n - 40] ^= 0x10; /* inside the last shard's region */
    tu_write_file(p, b, n);
    free(b);
    file_of("ix-trunc", "stoker.index", p, sizeof p);
    b = tu_read_file(p, &n);
    tu_write_file(p, b, n / 2);
    free(b);
    file_of("ix-gone", "stoker.index", p, sizeof p);
    REQUIRE(unlink(p) == 0);
    server_start(g_www, F_NONE);
    run_out r = run_warned(url("ix-corrupt"), NULL, 1, false);
    CHECK(r.open_rc == STK_OK && r.hash == h1);
    CHECK(strstr(g_warnings, "stoker.index") && strstr(g_warnings, "checksum mismatch") &&
          strstr(g_warnings, "opening each shard"));
    CHECK(!strstr(g_warnings, "stoker: warning")); /* the channel gets the bare message */
    /* Without a channel: the library's default line on stderr. */
    r = run_warned(url("ix-trunc"), NULL, 1, true);
    CHECK(r.open_rc == STK_OK && r.hash == h2);
    if (r.open_rc)
        fprintf(stderr, "%s\n", r.msg);
    CHECK(!strncmp(g_warnings, "stoker: warning: ", 17) && strstr(g_warnings, "stoker.index") &&
          strstr(g_warnings, "opening each shard instead\n"));
    r = run_warned(url("ix-gone"), NULL, 1, false);
    CHECK(r.open_rc == STK_OK && r.hash == h3);
    CHECK(strstr(g_warnings, "not there"));
    /* The dataset API's open warns through the same channel. */
    stk_options *o;
    stk_dataset *d = NULL;
    char err[1024];
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_warning(o, collect_warning, NULL) == STK_OK);
    g_warnings[0] = '\0';
    CHECK_EQ(stk_dataset_open(&d, url("ix-gone"), o, err, sizeof err), STK_OK);
    CHECK(strstr(g_warnings, "stoker.index") && strstr(g_warnings, "not there"));
    stk_dataset_close(d);
    stk_options_destroy(o);
    server_stop();
}

/* A pack from before the index (its manifest names none; a stoker.index
 * beside it is not read): shard by shard, three requests a shard, the same
 * batches, nothing to warn about. */
static void test_index_not_named_is_not_used(void)
{
    index_case("ix-old", 8);
    uint64_t h = local_hash("ix-old");
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/ix-old", g_www);
    stk__manifest m;
    char err[512];
    REQUIRE(stk__manifest_read(dir, &m, err, sizeof err) == STK_OK);
    CHECK(m.has_index && m.index_bytes > 0);
    m.has_index = false;
    REQUIRE(stk__manifest_write(dir, &m, err, sizeof err) == STK_OK);
    stk__manifest_free(&m);
    server_start(g_www, F_NONE);
    int rc, n = open_requests(url("ix-old"), NULL, &rc);
    CHECK_EQ(rc, STK_OK);
    CHECK_EQ(n, 1 + 3 * 12);
    run_out r = run_warned(url("ix-old"), NULL, 1, true);
    CHECK(r.open_rc == STK_OK && r.hash == h);
    CHECK(!strstr(g_warnings, "warning"));
    server_stop();
}

/* The indexed open (with the index cache) under every allocation failure:
 * each ends STK_OK or STK_ENOMEM (never a fallback's other error) and
 * leaks nothing. */
static void test_index_oom_sweep(void)
{
    index_case("ix-oom", 9);
    server_start(g_www, F_NONE);
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set(o, "fetch_concurrency", "8") == STK_OK);
    REQUIRE(stk_options_set(o, "cache_dir", tu_path("ix-oom-cache")) == STK_OK);
    long live = stk__alloc_live();
    int failed = 0, ok = 0;
    for (long n = 0; n < 100000; n++) {
        stk_dataset *d = NULL;
        char err[1024];
        stk__alloc_fail_after(n);
        int rc = stk_dataset_open(&d, url("ix-oom"), o, err, sizeof err);
        stk__alloc_fail_after(-1);
        stk_dataset_close(d);
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        if (rc != STK_OK && rc != STK_ENOMEM)
            fprintf(stderr, "fail %ld: %s\n", n, err);
        CHECK_EQ(stk__alloc_live(), live);
        if (rc == STK_OK && ++ok == 2)
            break; /* past the last allocation, cold and then cached */
        if (rc == STK_ENOMEM)
            failed++;
    }
    printf("    indexed open: %d allocation points failed with ENOMEM\n", failed);
    CHECK(failed > 10);
    stk_options_destroy(o);
    server_stop();
}

/* The republished-dataset case of test_republished_and_corrupt_entries for
 * a dataset opened from its index (no ETag is seen at open): the cache keys
 * its shards by their index checksum, so a new pack with same-size shards
 * downloads the new versions instead of failing on the old entries. */
static void test_index_republished_is_not_read_from_old_entries(void)
{
    char dir[1100], p[1400];
    snprintf(dir, sizeof dir, "%s/ix-repub", g_www);
    make_indexed(dir, 6, 3, 10);
    const char *cache = tu_path("cache-ix-repub");
    server_start(g_www, F_NONE);
    run_out cold = run(url("ix-repub"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(cold.fs.cache_misses, 6);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%.255s", dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    REQUIRE(rmdir(dir) == 0);
    make_indexed(dir, 6, 3, 11); /* same sizes, other bytes */
    uint64_t want = local_hash("ix-repub");
    run_out again = run(url("ix-repub"), 2, cache, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(again.samples, 18);
    CHECK(again.hash == want && again.hash != cold.hash);
    CHECK_EQ(again.fs.cache_misses, 6);
    CHECK_EQ(again.fs.cache_dropped, 0);
    server_stop();
}

/* stoker verify of a packed directory checks stoker.index: the one the
 * manifest names, and the index its shards make now. */
static char g_vmsg[2048];
static void on_problem(const stk_verify_problem *p, void *user)
{
    (void)user;
    if (p->kind == STK_VERIFY_MANIFEST && strstr(p->name, "stoker.index"))
        snprintf(g_vmsg, sizeof g_vmsg, "%s", p->reason);
}

static uint64_t verify_dir(const char *dir)
{
    stk_verify_result res = {.struct_size = sizeof res};
    char err[512];
    g_vmsg[0] = '\0';
    CHECK_EQ(stk_dataset_verify(dir, NULL, on_problem, NULL, &res, err, sizeof err), STK_OK);
    return res.manifest;
}

static void test_index_verify(void)
{
    char dir[1100], p[1300], q[1300];
    index_case("ix-verify", 12);
    index_case("ix-verify-other", 13);
    snprintf(dir, sizeof dir, "%s/ix-verify", g_www);
    CHECK_EQ(verify_dir(dir), 0);
    CHECK(!g_vmsg[0]);
    /* A damaged index. */
    file_of("ix-verify", "stoker.index", p, sizeof p);
    size_t n = 0;
    uint8_t *b = tu_read_file(p, &n);
    b[n / 3] ^= 4;
    tu_write_file(p, b, n);
    CHECK_EQ(verify_dir(dir), 1);
    CHECK(strstr(g_vmsg, "not the index the manifest names"));
    b[n / 3] ^= 4;
    tu_write_file(p, b, n);
    free(b);
    CHECK_EQ(verify_dir(dir), 0);
    /* A shard replaced by another pack's of the same size: every sample
     * still matches its own shard's index, but not stoker.index. */
    file_of("ix-verify", "part-000002.stk", p, sizeof p);
    file_of("ix-verify-other", "part-000002.stk", q, sizeof q);
    b = tu_read_file(q, &n);
    tu_write_file(p, b, n);
    free(b);
    CHECK_EQ(verify_dir(dir), 1);
    CHECK(strstr(g_vmsg, "does not describe the shards"));
    /* Missing. */
    file_of("ix-verify", "stoker.index", p, sizeof p);
    REQUIRE(unlink(p) == 0);
    CHECK_EQ(verify_dir(dir), 1);
    CHECK(strstr(g_vmsg, "named by the manifest"));
}

/* An index of another pack beside this pack's manifest and shards: refused,
 * saying so. */
static void test_index_of_another_pack_is_refused(void)
{
    char a[1300], b[1300];
    index_case("ix-mine", 4);
    index_case("ix-theirs", 5);
    file_of("ix-mine", "stoker.index", a, sizeof a);
    file_of("ix-theirs", "stoker.index", b, sizeof b);
    size_t n = 0;
    uint8_t *t = tu_read_file(b, &n);
    tu_write_file(a, t, n); /* same size: same shape of pack, other bytes */
    free(t);
    server_start(g_www, F_NONE);
    run_out r = run_warned(url("ix-mine"), NULL, 1, false);
    CHECK_EQ(r.open_rc, STK_EFORMAT);
    CHECK(strstr(r.msg, "stoker.index") && strstr(r.msg, "another pack") &&
          strstr(r.msg, "different packs"));
    server_stop();
}

/* A shard replaced after the pack (another size): the index still opens the
 * dataset, and that shard's reads fail naming it, the others' samples are
 * delivered (skip policy), none of the replaced bytes. */
static void test_index_shard_replaced_since_the_pack(void)
{
    index_case("ix-stale", 6);
    char p[1300];
    file_of("ix-stale", "part-000003.stk", p, sizeof p);
    size_t n = 0;
    uint8_t *t = tu_read_file(p, &n);
    uint8_t *u = malloc(n + 8);
    memcpy(u, t, n);
    memset(u + n, 0, 8);
    tu_write_file(p, u, n + 8);
    free(t);
    free(u);
    server_start(g_www, F_NONE);
    run_out r = run(url("ix-stale"), 2, NULL, NULL, STK_ON_ERROR_SKIP, 1);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK_EQ(r.samples, 12 * 3 - 3);
    run_out e = run(url("ix-stale"), 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK(strstr(e.msg, "part-000003.stk") && strstr(e.msg, "replaced since the pack"));
    server_stop();
}

/* Open time of many shards at a round trip of g_delay_us, with and without
 * the index (STK_INDEX_BENCH=1: a measurement, not a test; prints figures). */
static void bench_index_open(void)
{
    char dir[1100];
    int shards = getenv("STK_INDEX_BENCH_SHARDS") ? atoi(getenv("STK_INDEX_BENCH_SHARDS")) : 2000;
    snprintf(dir, sizeof dir, "%s/bench", g_www);
    make_indexed(dir, shards, 4, 7);
    g_delay_us = 25000; /* each answer waits 25 ms: with the request, ~50 ms RTT */
    server_start(g_www, F_NONE);
    for (int with = 1; with >= 0; with--) {
        if (!with) {
            stk__manifest m;
            char err[512];
            REQUIRE(stk__manifest_read(dir, &m, err, sizeof err) == STK_OK);
            m.has_index = false;
            REQUIRE(stk__manifest_write(dir, &m, err, sizeof err) == STK_OK);
            stk__manifest_free(&m);
        }
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int before = atomic_load(&srv.requests), rc;
        g_extra[0] = "fetch_concurrency";
        g_extra[1] = "64";
        stk_loader *l = open_url(url("bench"), 2, NULL, NULL, STK_ON_ERROR_RAISE, &rc);
        g_extra[0] = NULL;
        double open_s = secs_since(&t0);
        int reqs = atomic_load(&srv.requests) - before;
        stk_batch *b;
        CHECK(rc == STK_OK && stk_loader_next(l, &b) == STK_OK);
        stk_batch_release(b);
        double first_s = secs_since(&t0);
        printf("    %d shards, %s index: open %.3f s (%d requests), first batch %.3f s\n", shards,
               with ? "with" : "without", open_s, reqs, first_s);
        stk_loader_close(l);
    }
    server_stop();
    g_delay_us = 0;
}
/* ---- MDS, LitData and TFRecord over HTTP (remote_files.c) ------------------ */

/* The fixtures' root (tu_fixtures gives FIXTURES/mds). */
static const char *fixtures(void)
{
    static char root[2048];
    const char *mds = tu_fixtures("mds");
    if (!mds)
        return NULL;
    snprintf(root, sizeof root, "%.*s", (int)(strlen(mds) - 4), mds);
    return root;
}

/* Every field of every sample over one epoch, as stored (kind bytes, all
 * optional, so presence is compared too), with indices and labels. The
 * field names come from the local dataset `names_from`. */
static const char *g_fx_limit; /* fx_hash's cache_limit (NULL: the default) */

static uint64_t fx_hash(const char *path, const char *names_from, const char *cache, int on_error,
                        uint64_t *n, char *msg, size_t msgn, int *open_rc)
{
    stk_options *o;
    stk_loader *l = NULL;
    char err[1024];
    REQUIRE(stk_options_create(&o) == STK_OK);
    stk_options_set_source(o, path);
    stk_options_set_batch_size(o, 8);
    stk_options_set_threads(o, 2);
    stk_options_set_seed(o, 11);
    stk_options_set_on_error(o, on_error);
    if (strstr(path, "://"))
        REQUIRE(stk_options_set(o, "fetch_timeout", "2") == STK_OK);
    if (cache)
        REQUIRE(stk_options_set(o, "cache_dir", cache) == STK_OK);
    if (cache && g_fx_limit)
        REQUIRE(stk_options_set(o, "cache_limit", g_fx_limit) == STK_OK);
    stk_dataset *d = NULL;
    if (stk_dataset_open(&d, names_from, NULL, err, sizeof err) != STK_OK)
        fprintf(stderr, "open %s: %s\n", names_from, err);
    REQUIRE(d != NULL);
    size_t nf = stk_dataset_field_count(d);
    REQUIRE(nf > 2);
    for (size_t k = 0; k < nf; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        char name[32];
        snprintf(name, sizeof name, "f%zu", k);
        REQUIRE(stk_options_add_field(o, name, fi.name, STK_FIELD_BYTES, NULL,
                                      STK_FIELD_OPTIONAL) == STK_OK);
    }
    stk_dataset_close(d);
    *open_rc = stk_loader_open(&l, o);
    stk_options_destroy(o);
    *n = 0;
    if (msg)
        msg[0] = '\0';
    if (*open_rc) {
        if (msg)
            snprintf(msg, msgn, "%s", stk_loader_errmsg(l));
        stk_loader_close(l);
        return 0;
    }
    uint64_t h = 1469598103934665603ULL;
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) != STK_END) {
        if (rc == STK_ESAMPLE) {
            if (msg && !msg[0])
                snprintf(msg, msgn, "%s", stk_loader_errmsg(l));
            continue;
        }
        REQUIRE(rc == STK_OK);
        REQUIRE(b->nfields == nf);
        h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
        h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
        for (size_t f = 0; f < b->nfields; f++) {
            const stk_field *fl = &b->fields[f];
            REQUIRE(fl->layout == STK_BATCH_VARIABLE);
            if (fl->present)
                h = tu_hash(h, fl->present, b->size);
            for (size_t k = 0; k < b->size; k++)
                h = tu_hash(h, (uint8_t *)fl->data + fl->offsets[k], fl->lengths[k]);
        }
        *n += b->size;
        stk_batch_release(b);
    }
    stk_loader_close(l);
    return h;
}

static void copy_tree(const char *from, const char *to)
{
    char cmd[8192];
    tu_mkdirs(to);
    snprintf(cmd, sizeof cmd, "cp -R '%s'/. '%s'/ && chmod -R u+w '%s'", from, to, to);
    REQUIRE(system(cmd) == 0);
}

static void test_formats_remote_as_local(void)
{
    const char *fx = fixtures();
    if (!fx) {
        fprintf(stderr, "    no fixtures: skipped\n");
        return;
    }
    static const char *const sets[][2] = {
        {"mds/plain", ""},
        {"mds/zstd", ""},
        {"mds/jpeg", ""},
        {"litdata/plain", ""},
        {"litdata/zstd", ""},
        {"litdata/jpeg", ""},
        {"tfrecord/plain", "/train-{00000..00001}-of-00002.tfrecord"},
        {"tfrecord/gzip", "/train-{00000..00001}-of-00002.tfrecord.gz"},
        {"parquet/snappy", "/train-{00000..00001}-of-00002.parquet"},
        {"parquet/zstd", "/train-{00000..00001}-of-00002.parquet"},
    };
    server_start(g_www, F_NONE);
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        char local[4096], www[2048], rel[512], cache[2048], msg[1024];
        snprintf(local, sizeof local, "%s/%s", fx, sets[k][0]);
        snprintf(www, sizeof www, "%s/fx/%s", g_www, sets[k][0]);
        snprintf(cache, sizeof cache, "%s", tu_path("cache-fx"));
        copy_tree(local, www);
        snprintf(rel, sizeof rel, "fx/%s%s", sets[k][0], sets[k][1]);
        uint64_t nl, nr, nw;
        int orc;
        uint64_t hl = fx_hash(local, local, NULL, STK_ON_ERROR_RAISE, &nl, msg, sizeof msg, &orc);
        CHECK_EQ(orc, STK_OK);
        CHECK_EQ(nl, 60);
        int before = atomic_load(&srv.plain_gets);
        uint64_t hr =
            fx_hash(url(rel), local, cache, STK_ON_ERROR_RAISE, &nr, msg, sizeof msg, &orc);
        if (orc)
            fprintf(stderr, "    %s: %s\n", rel, msg);
        CHECK_EQ(orc, STK_OK);
        CHECK_EQ(nr, 60);
        CHECK(hr == hl);
        int cold = atomic_load(&srv.plain_gets) - before;
        /* index.json or the files, downloaded whole; Parquet by row groups,
         * by ranges (test_parquet_remote_units). */
        bool pq = strstr(sets[k][0], "parquet") != NULL;
        CHECK(pq ? cold == 0 : cold >= 2);
        /* A second open reads the cache: nothing downloaded again, only
         * the probes (and the sniff of index.json). */
        before = atomic_load(&srv.plain_gets);
        int reqs = atomic_load(&srv.requests);
        uint64_t hw =
            fx_hash(url(rel), local, cache, STK_ON_ERROR_RAISE, &nw, msg, sizeof msg, &orc);
        CHECK_EQ(orc, STK_OK);
        CHECK(hw == hl && nw == 60);
        int warm_plain = atomic_load(&srv.plain_gets) - before;
        int warm_reqs = atomic_load(&srv.requests) - reqs;
        /* Warm: stoker.manifest (404) and index.json for a directory, and
         * one 1-byte probe per file; a Parquet file's head and tail (its
         * footer: the row groups and label chunks come from the cache). */
        CHECK(warm_plain <= (sets[k][1][0] ? 0 : 2));
        CHECK(warm_reqs <= (pq ? 2 * 2 : sets[k][1][0] ? 2 : 2 + 1 + 4));
        if (warm_plain > 2 || warm_reqs > 7)
            fprintf(stderr, "    %s warm: %d plain GETs, %d requests\n", rel, warm_plain,
                    warm_reqs);
    }
    /* URL/index.json names the dataset too. */
    {
        char local[4096], msg[1024];
        uint64_t nl, nr;
        int orc;
        snprintf(local, sizeof local, "%s/mds/plain", fx);
        uint64_t hl = fx_hash(local, local, NULL, STK_ON_ERROR_RAISE, &nl, msg, sizeof msg, &orc);
        uint64_t hr = fx_hash(url("fx/mds/plain/index.json"), local, tu_path("cache-fx"),
                              STK_ON_ERROR_RAISE, &nr, msg, sizeof msg, &orc);
        CHECK_EQ(orc, STK_OK);
        CHECK(hl == hr && nr == 60);
    }
    /* Without a cache directory: refused, saying why. */
    {
        char local[4096], msg[1024];
        uint64_t nr;
        int orc;
        snprintf(local, sizeof local, "%s/litdata/plain", fx);
        fx_hash(url("fx/litdata/plain"), local, NULL, STK_ON_ERROR_RAISE, &nr, msg, sizeof msg,
                &orc);
        CHECK_EQ(orc, STK_EINVAL);
        CHECK(strstr(msg, "cache_dir") && strstr(msg, "LitData chunks") &&
              strstr(msg, "fx/litdata/plain"));
    }
    server_stop();
}

/* A shard index.json names that the server does not have (404), and a
 * truncated one: clear errors naming the shard's URL; under skip the rest
 * of the truncated dataset is delivered, as locally. */
static void test_formats_remote_bad_shards(void)
{
    const char *fx = fixtures();
    if (!fx) {
        fprintf(stderr, "    no fixtures: skipped\n");
        return;
    }
    char src[4096], miss[2048], cut[2048], p[4096], msg[1024];
    snprintf(src, sizeof src, "%s/mds/plain", fx);
    snprintf(miss, sizeof miss, "%s/bad/mds-missing", g_www);
    snprintf(cut, sizeof cut, "%s/bad/mds-cut", g_www);
    copy_tree(src, miss);
    copy_tree(src, cut);
    snprintf(p, sizeof p, "%s/shard.00002.mds", miss);
    REQUIRE(unlink(p) == 0);
    snprintf(p, sizeof p, "%s/shard.00001.mds", cut);
    struct stat st;
    REQUIRE(stat(p, &st) == 0 && truncate(p, st.st_size / 2) == 0);
    server_start(g_www, F_NONE);
    uint64_t n, nl;
    int orc;
    fx_hash(url("bad/mds-missing"), src, tu_path("cache-bad"), STK_ON_ERROR_SKIP, &n, msg,
            sizeof msg, &orc);
    CHECK_EQ(orc, STK_ENOENT);
    CHECK(strstr(msg, "http://127.0.0.1:") && strstr(msg, "bad/mds-missing/shard.00002.mds") &&
          strstr(msg, "404"));
    /* Truncated: raise stops at the first damaged record, naming it. */
    fx_hash(url("bad/mds-cut"), src, tu_path("cache-bad"), STK_ON_ERROR_RAISE, &n, msg, sizeof msg,
            &orc);
    CHECK_EQ(orc, STK_OK);
    CHECK(strstr(msg, "bad/mds-cut/shard.00001.mds") != NULL);
    if (!strstr(msg, "bad/mds-cut/shard.00001.mds"))
        fprintf(stderr, "    message: %s\n", msg);
    /* Skip: the rest, exactly as the local copy delivers it. */
    uint64_t hl = fx_hash(cut, src, NULL, STK_ON_ERROR_SKIP, &nl, msg, sizeof msg, &orc);
    CHECK_EQ(orc, STK_OK);
    uint64_t hr = fx_hash(url("bad/mds-cut"), src, tu_path("cache-bad"), STK_ON_ERROR_SKIP, &n, msg,
                          sizeof msg, &orc);
    CHECK_EQ(orc, STK_OK);
    CHECK(n == nl && hr == hl);
    CHECK(n > 40 && n < 60);
    /* A truncated zstd shard fails the open (it cannot be decompressed),
     * naming its URL. */
    char zsrc[4096], zcut[2048];
    snprintf(zsrc, sizeof zsrc, "%s/litdata/zstd", fx);
    snprintf(zcut, sizeof zcut, "%s/bad/lit-zcut", g_www);
    copy_tree(zsrc, zcut);
    snprintf(p, sizeof p, "%s/chunk-0-2.zstd.bin", zcut);
    REQUIRE(stat(p, &st) == 0 && truncate(p, st.st_size / 2) == 0);
    fx_hash(url("bad/lit-zcut"), zsrc, tu_path("cache-bad"), STK_ON_ERROR_SKIP, &n, msg, sizeof msg,
            &orc);
    CHECK(orc != STK_OK);
    CHECK(strstr(msg, "bad/lit-zcut/chunk-0-2.zstd.bin") != NULL);
    if (!strstr(msg, "bad/lit-zcut/chunk-0-2.zstd.bin"))
        fprintf(stderr, "    message: %s\n", msg);
    server_stop();
}

/* ---- Remote Parquet by row groups (no cache_dir) -------------------------------------- */

/* One epoch of path (order shards when shards is set) with fields spec
 * (NULL: fx_hash's way is not used; the payload and label): the hash of the
 * batches, the samples delivered, and the skipped samples' reasons joined in
 * why. A hook runs after the open, before the first batch. */
static uint64_t pq_epoch(const char *path, const char *fields, bool shards, unsigned threads,
                         int on_error, void (*hook)(void), uint64_t *n, char *why, size_t wn)
{
    stk_options *o;
    stk_loader *l = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    stk_options_set_source(o, path);
    stk_options_set_batch_size(o, 8);
    stk_options_set_threads(o, threads);
    stk_options_set_seed(o, 5);
    stk_options_set_on_error(o, on_error);
    if (shards)
        REQUIRE(stk_options_set(o, "order", "shards") == STK_OK);
    if (strstr(path, "://"))
        REQUIRE(stk_options_set(o, "fetch_timeout", "2") == STK_OK);
    if (fields)
        REQUIRE(stk_options_set(o, "fields", fields) == STK_OK);
    int rc = stk_loader_open(&l, o);
    stk_options_destroy(o);
    if (rc)
        fprintf(stderr, "    open %s: %s\n", path, stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    if (hook)
        hook();
    uint64_t h = 1469598103934665603ULL;
    stk_batch *b;
    *n = 0;
    if (why)
        why[0] = '\0';
    while ((rc = stk_loader_next(l, &b)) != STK_END) {
        REQUIRE(rc == STK_OK);
        h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
        h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
        for (size_t f = 0; f < b->nfields; f++) {
            const stk_field *fl = &b->fields[f];
            if (fl->present)
                h = tu_hash(h, fl->present, b->size);
            if (fl->layout == STK_BATCH_VARIABLE)
                for (size_t k = 0; k < b->size; k++)
                    h = tu_hash(h, (uint8_t *)fl->data + fl->offsets[k], fl->lengths[k]);
        }
        *n += b->size;
        stk_batch_release(b);
    }
    for (size_t k = 0; why && k < stk_loader_error_count(l) && k < 4; k++) {
        stk_sample_error e;
        REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
        size_t at = strlen(why);
        snprintf(why + at, wn - at, "%s: %s\n", e.path, e.reason);
    }
    stk_loader_close(l);
    return h;
}

static char g_pq_gone[4096];
static void pq_remove_file(void)
{
    REQUIRE(unlink(g_pq_gone) == 0);
}

/* Replaced by a shorter file (its footer cut off): another size and
 * version, its row groups' bytes still there. */
static void pq_cut_file(void)
{
    struct stat st;
    REQUIRE(stat(g_pq_gone, &st) == 0 && truncate(g_pq_gone, st.st_size - 100) == 0);
}

/* A remote Parquet dataset without a cache_dir is read by ranges: the
 * footers at the open, then one request per row group (its unit), never a
 * whole-file GET; the batches are the local read's. */
static void test_parquet_remote_units(void)
{
    const char *fx = fixtures();
    if (!fx) {
        fprintf(stderr, "    no fixtures: skipped\n");
        return;
    }
    server_start(g_www, F_NONE);
    static const char *const sets[] = {"snappy", "zstd"};
    for (size_t k = 0; k < 2; k++) {
        char local[4096], www[2048], rel[512], msg[1024];
        snprintf(local, sizeof local, "%s/parquet/%s", fx, sets[k]);
        snprintf(www, sizeof www, "%s/pqu/%s", g_www, sets[k]);
        copy_tree(local, www);
        snprintf(rel, sizeof rel, "pqu/%s/train-{00000..00001}-of-00002.parquet", sets[k]);
        uint64_t nl, nr;
        int orc;
        uint64_t hl = fx_hash(local, local, NULL, STK_ON_ERROR_RAISE, &nl, msg, sizeof msg, &orc);
        CHECK_EQ(orc, STK_OK);
        int reqs = atomic_load(&srv.requests), plain = atomic_load(&srv.plain_gets);
        uint64_t hr =
            fx_hash(url(rel), local, NULL, STK_ON_ERROR_RAISE, &nr, msg, sizeof msg, &orc);
        if (orc)
            fprintf(stderr, "    %s: %s\n", rel, msg);
        CHECK_EQ(orc, STK_OK);
        CHECK(hr == hl && nr == nl && nr == 60);
        reqs = atomic_load(&srv.requests) - reqs;
        /* 2 files of two row groups each: a probe and a tail a file, then a
         * label chunk and a unit a row group, not a request a row (60). */
        CHECK_EQ(atomic_load(&srv.plain_gets) - plain, 0);
        CHECK_EQ(reqs, 2 * 2 + 4 + 4);
        if (reqs != 12)
            fprintf(stderr, "    %s: %d requests\n", rel, reqs);
    }
    /* With cache_dir, units are its entries: a cache smaller than the
     * dataset (836 KB, row groups of 50 to 340 KB) streams through it, the
     * same batches; a second run with a cache that holds it reads only the
     * footers from the network. */
    {
        char local[4096], msg[1024];
        snprintf(local, sizeof local, "%s/parquet/snappy", fx);
        const char *rel = "pqu/snappy/train-{00000..00001}-of-00002.parquet";
        uint64_t nl, nr;
        int orc;
        uint64_t hl = fx_hash(local, local, NULL, STK_ON_ERROR_RAISE, &nl, msg, sizeof msg, &orc);
        for (int big = 0; big < 2; big++) {
            g_fx_limit = big ? "8000000" : "500000";
            const char *cache = tu_path(big ? "cache-pqu-big" : "cache-pqu-small");
            for (int run = 0; run < 2; run++) {
                int reqs = atomic_load(&srv.requests);
                uint64_t hr =
                    fx_hash(url(rel), local, cache, STK_ON_ERROR_RAISE, &nr, msg, sizeof msg, &orc);
                reqs = atomic_load(&srv.requests) - reqs;
                if (orc)
                    fprintf(stderr, "    cache %d: %s\n", big, msg);
                CHECK_EQ(orc, STK_OK);
                CHECK(hr == hl && nr == 60);
                /* Cold: 12 requests (above). Warm with room: the two
                 * files' head and tail. Too small: some units again. */
                if (run == 0 || !big)
                    CHECK(reqs >= 2 * 2 + 4 + 4 - (run ? 8 : 0) && reqs <= 2 * 2 + 4 + 4);
                else
                    CHECK_EQ(reqs, 2 * 2);
                if (run && !big)
                    CHECK(reqs > 2 * 2); /* the cache could not hold every unit */
            }
        }
        g_fx_limit = NULL;
    }
    /* Three row groups of 4200 rows (DuckDB): 2 requests at the open, then
     * one a row group, not one a row; identical batches, in the shard
     * order and in the global shuffle. */
    {
        char www[2048], local[512] = "tests/fuzz/corpus/parquet/rowgroups-v2";
        snprintf(www, sizeof www, "%s/pqu/rg/rowgroups.parquet", g_www);
        tu_mkdirs(tu_path("www/pqu/rg"));
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s/pqu/rg' && cp '%s' '%s'", g_www, local, www);
        REQUIRE(system(cmd) == 0);
        for (int shards = 0; shards < 2; shards++) {
            uint64_t nl, nr;
            uint64_t hl = pq_epoch(local, "v,t", shards, 2, STK_ON_ERROR_RAISE, NULL, &nl, NULL, 0);
            int reqs = atomic_load(&srv.requests);
            unsigned long long bytes = atomic_load(&srv.bytes_out);
            uint64_t hr = pq_epoch(url("pqu/rg/rowgroups.parquet"), "v,t", shards, 2,
                                   STK_ON_ERROR_RAISE, NULL, &nr, NULL, 0);
            reqs = atomic_load(&srv.requests) - reqs;
            bytes = atomic_load(&srv.bytes_out) - bytes;
            CHECK(hr == hl && nr == nl && nr == 4200);
            CHECK_EQ(reqs, 2 + 3);
            CHECK(bytes < 2 * 1020); /* the file once, its tail twice at most */
            if (reqs != 5)
                fprintf(stderr, "    rowgroups (shards %d): %d requests, %llu bytes\n", shards,
                        reqs, bytes);
        }
        /* A unit bound smaller than any row group: each unit is fetched
         * alone, evicted for the next; the batches are the same. */
        size_t keep = stk__parquet_unit_bytes;
        stk__parquet_unit_bytes = 1;
        uint64_t nl, nr;
        uint64_t hl = pq_epoch(local, "v,t", false, 3, STK_ON_ERROR_RAISE, NULL, &nl, NULL, 0);
        uint64_t hr = pq_epoch(url("pqu/rg/rowgroups.parquet"), "v,t", false, 3, STK_ON_ERROR_RAISE,
                               NULL, &nr, NULL, 0);
        CHECK(hr == hl && nr == nl);
        stk__parquet_unit_bytes = keep;
    }
    /* Only the columns read are fetched: the captions of the image dataset
     * are a small part of its bytes. */
    {
        char local[4096];
        snprintf(local, sizeof local, "%s/parquet/snappy", fx);
        uint64_t nl, nr;
        uint64_t hl =
            pq_epoch(local, "caption,label", true, 2, STK_ON_ERROR_RAISE, NULL, &nl, NULL, 0);
        unsigned long long bytes = atomic_load(&srv.bytes_out);
        uint64_t hr = pq_epoch(url("pqu/snappy/train-{00000..00001}-of-00002.parquet"),
                               "caption,label", true, 2, STK_ON_ERROR_RAISE, NULL, &nr, NULL, 0);
        bytes = atomic_load(&srv.bytes_out) - bytes;
        CHECK(hr == hl && nr == 60);
        CHECK(bytes < 836030 / 4);
        if (bytes >= 836030 / 4)
            fprintf(stderr, "    captions: %llu bytes fetched\n", bytes);
    }
    server_stop();
}

/* A file gone from the server after the open (404), and one replaced by a
 * shorter copy: under skip, its rows are sample errors naming its URL and
 * the row group; the other file's rows are delivered as locally. */
static void test_parquet_remote_unit_errors(void)
{
    const char *fx = fixtures();
    if (!fx) {
        fprintf(stderr, "    no fixtures: skipped\n");
        return;
    }
    server_start(g_www, F_NONE);
    for (int cut = 0; cut < 2; cut++) {
        char local[3000], www[1536], rel[512], why[4096], one[4096];
        snprintf(local, sizeof local, "%s/parquet/snappy", fx);
        snprintf(www, sizeof www, "%s/pqbad%d", g_www, cut);
        copy_tree(local, www);
        snprintf(rel, sizeof rel, "pqbad%d/train-{00000..00001}-of-00002.parquet", cut);
        snprintf(one, sizeof one, "%s/train-00000-of-00002.parquet", local);
        uint64_t n0, nr;
        pq_epoch(one, "caption,label", true, 1, STK_ON_ERROR_RAISE, NULL, &n0, NULL, 0);
        snprintf(g_pq_gone, sizeof g_pq_gone, "%s/train-00001-of-00002.parquet", www);
        pq_epoch(url(rel), "caption,label", true, 2, STK_ON_ERROR_SKIP,
                 cut ? pq_cut_file : pq_remove_file, &nr, why, sizeof why);
        CHECK_EQ(nr, n0);
        bool reason = strstr(why, cut ? "changed on the server" : "404") != NULL;
        CHECK(strstr(why, "train-00001-of-00002.parquet") && strstr(why, "row group ") && reason);
        CHECK(!strstr(why, "train-00000"));
        if (!reason)
            fprintf(stderr, "    errors: %s\n", why);
    }
    server_stop();
}

/* Every allocation of a remote MDS (zstd) open, cold (downloads into a
 * fresh cache) and warm (pins), and of a cold TFRecord (gzip) open, failed
 * in turn: the open fails with ENOMEM or succeeds, and nothing leaks
 * (allocations, fds). */
static void test_formats_remote_oom_sweep(void)
{
    const char *fx = fixtures();
    if (!fx) {
        fprintf(stderr, "    no fixtures: skipped\n");
        return;
    }
    static const char *const rels[] = {"fx/mds/zstd",
                                       "fx/tfrecord/gzip/train-{00000..00001}-of-00002.tfrecord.gz",
                                       "fx/parquet/snappy/train-{00000..00001}-of-00002.parquet"};
    char www[2048], local[4096];
    snprintf(www, sizeof www, "%s/fx/mds/zstd", g_www);
    snprintf(local, sizeof local, "%s/mds/zstd", fx);
    copy_tree(local, www);
    snprintf(www, sizeof www, "%s/fx/tfrecord/gzip", g_www);
    snprintf(local, sizeof local, "%s/tfrecord/gzip", fx);
    copy_tree(local, www);
    snprintf(www, sizeof www, "%s/fx/parquet/snappy", g_www);
    snprintf(local, sizeof local, "%s/parquet/snappy", fx);
    copy_tree(local, www);
    server_start(g_www, F_NONE);
    /* Parquet: its footers and label chunks by ranges, the label chunks
     * stored in (cold) or read from (warm) the cache. */
    for (size_t r = 0; r < 3; r++) {
        for (int warm = 0; warm < (r == 1 ? 1 : 2); warm++) { /* TFRecord: cold only */
            /* A fresh server, its last connections closed, before the
             * baseline. */
            server_stop();
            server_start(g_www, F_NONE);
            usleep(200000);
            long live0 = stk__alloc_live();
            int fds0 = tu_count_fds();
            long n;
            int nomem = 0;
            /* TFRecord's own allocations are swept in test_tfrecord: here
             * every third point, for the time. */
            for (n = 0; n < 20000; n += r ? 3 : 1) {
                char cache[64], err[1024];
                snprintf(cache, sizeof cache, "oomfx-%zu-%ld", r, warm ? -1L : n);
                if (n % 16 == 15 || (r && n % 16 >= 13)) {
                    server_stop();
                    server_start(g_www, F_NONE);
                }
                stk_options *o = NULL;
                stk_dataset *d = NULL;
                REQUIRE(stk_options_create(&o) == STK_OK);
                REQUIRE(stk_options_set(o, "cache_dir", tu_path(cache)) == STK_OK);
                long c0 = stk__alloc_count();
                stk__alloc_fail_after(n);
                int rc = stk_dataset_open(&d, url(rels[r]), o, err, sizeof err);
                stk__alloc_fail_after(-1);
                bool reached = stk__alloc_count() - c0 > n;
                if (rc != STK_OK && rc != STK_ENOMEM)
                    fprintf(stderr, "    %s n=%ld: %s\n", rels[r], n, err);
                CHECK(rc == STK_OK || rc == STK_ENOMEM);
                nomem += rc == STK_ENOMEM;
                stk_dataset_close(d);
                stk_options_destroy(o);
                for (int k = 0; k < 200 && tu_count_fds() != fds0; k++)
                    usleep(10000);
                if (stk__alloc_live() != live0 || tu_count_fds() != fds0) {
                    fprintf(stderr, "    %s n=%ld leaked %ld allocations, %d fds\n", rels[r], n,
                            stk__alloc_live() - live0, tu_count_fds() - fds0);
                    CHECK(0);
                    break;
                }
                if (!reached)
                    break;
            }
            printf("    %s %s: %ld allocation points, %d failed with ENOMEM\n", rels[r],
                   warm ? "warm" : "cold", n, nomem);
            CHECK(n > 20 && nomem > 20 / (r ? 3 : 1));
        }
    }
    server_stop();
}

/* Unpacked objects in a bucket: s3://bkt/imgs holding CLASS/NAME.jpg
 * objects (the listing served as S3 would give it) reads as the local
 * ImageFolder it mirrors, each sample by one GET of its object, through
 * the fetch stage, with and without fields. */
static void test_bucket_of_class_folders(void)
{
    const char *classes[] = {"ant", "bee", "cow"};
    char dir[2048], xml[65536];
    size_t xl = (size_t)snprintf(xml, sizeof xml,
                                 "<?xml version=\"1.0\"?><ListBucketResult><Name>bkt</Name>");
    int n = 0;
    for (int c = 0; c < 3; c++) {
        snprintf(dir, sizeof dir, "%s/bkt/imgs/%s", g_www, classes[c]);
        tu_mkdirs(dir);
        for (int k = 0; k < 4 + c; k++, n++) {
            uint8_t rgb[24 * 20 * 3];
            for (size_t j = 0; j < sizeof rgb; j++)
                rgb[j] = (uint8_t)(j * 7 + (size_t)n * 31);
            size_t jn = 0;
            uint8_t *jpg = tu_jpeg(rgb, 24, 20, 90, &jn);
            char p[4096];
            snprintf(p, sizeof p, "%s/%03d.jpg", dir, k);
            tu_write_file(p, jpg, jn);
            free(jpg);
            xl += (size_t)snprintf(xml + xl, sizeof xml - xl,
                                   "<Contents><Key>imgs/%s/%03d.jpg</Key><Size>%zu</Size>"
                                   "</Contents>",
                                   classes[c], k, jn);
        }
    }
    /* Not samples: a file beside the classes, an object two levels deep. */
    xl += (size_t)snprintf(xml + xl, sizeof xml - xl,
                           "<Contents><Key>imgs/README.txt</Key><Size>3</Size></Contents>"
                           "<IsTruncated>false</IsTruncated></ListBucketResult>");
    snprintf(dir, sizeof dir, "%s/bkt/.listing.xml", g_www);
    tu_write_file(dir, xml, xl);
    snprintf(dir, sizeof dir, "%s/bkt/imgs", g_www);
    run_out local = run(dir, 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    CHECK_EQ(local.open_rc, STK_OK);
    CHECK_EQ(local.samples, 2 * (uint64_t)n);
    server_start(g_www, F_NONE);
    char ep[128];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secretkey", 1);
    g_extra[0] = "endpoint";
    g_extra[1] = ep;
    g_extra[2] = NULL;
    int before = atomic_load(&srv.requests);
    run_out r = run("s3://bkt/imgs", 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    if (r.open_rc)
        fprintf(stderr, "    %s\n", r.msg);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK(r.hash == local.hash && r.samples == local.samples);
    CHECK(r.fs.requests >= (uint64_t)n);
    /* The manifest, index.json, two listings, and the samples' GETs. */
    CHECK(atomic_load(&srv.requests) - before >= n + 4);
    /* The same objects with fields: the image and its class. */
    g_extra[2] = "fields";
    g_extra[3] = "image,label";
    g_extra[4] = NULL;
    run_out f = run("s3://bkt/imgs", 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK_EQ(f.open_rc, STK_OK);
    CHECK_EQ(f.samples, (uint64_t)n);
    memset(g_extra, 0, sizeof g_extra);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    server_stop();
    snprintf(dir, sizeof dir, "%s/bkt/.listing.xml", g_www);
    unlink(dir);
}

/* The cache file of the bucket listing under dir (the one .stklist in
 * DIR/stoker-listing/), into path; false when there is none. */
static bool listing_file(const char *dir, char *path, size_t n)
{
    char sub[2200];
    snprintf(sub, sizeof sub, "%s/stoker-listing", dir);
    DIR *d = opendir(sub);
    struct dirent *e;
    bool found = false;
    while (d && (e = readdir(d)))
        if (strlen(e->d_name) > 8 && !strcmp(e->d_name + strlen(e->d_name) - 8, ".stklist")) {
            snprintf(path, n, "%s/%s", sub, e->d_name);
            found = true;
        }
    if (d)
        closedir(d);
    return found;
}

/* Runs the loader over url (epochs, cache_dir): the listings the server
 * answered; a warning saying `says` came through the warning channel (none
 * when says is NULL). */
static int listings_of(const char *path, const char *cache, int epochs, const run_out *want,
                       const char *says)
{
    int before = atomic_load(&srv.listings);
    run_out r = run_warned(path, cache, epochs, false);
    int n = atomic_load(&srv.listings) - before;
    if (r.open_rc)
        fprintf(stderr, "    %s\n", r.msg);
    CHECK_EQ(r.open_rc, STK_OK);
    if (want)
        CHECK(r.hash == want->hash && r.samples == want->samples);
    CHECK(says ? strstr(g_warnings, says) != NULL : !g_warnings[0]);
    if (says ? !strstr(g_warnings, says) : g_warnings[0] != 0)
        fprintf(stderr, "    warnings: %s\n", g_warnings[0] ? g_warnings : "(none)");
    return n;
}

/* The listing of unpacked objects is kept in cache_dir (listcache.c): a
 * second open makes no listing request at all and gives the same batches;
 * listing_ttl 0 lists again; a cached listing damaged on disk is ignored
 * with a warning and replaced; a listing kept while objects changed fails
 * the removed and the resized one by name, and the others are read. */
static void test_bucket_listing_cached(void)
{
    const char *classes[] = {"ant", "bee"};
    char dir[2048], xml[65536], p[4096];
    size_t xl = (size_t)snprintf(xml, sizeof xml,
                                 "<?xml version=\"1.0\"?><ListBucketResult><Name>lbk</Name>");
    int n = 0;
    for (int c = 0; c < 2; c++) {
        snprintf(dir, sizeof dir, "%s/lbk/imgs/%s", g_www, classes[c]);
        tu_mkdirs(dir);
        for (int k = 0; k < 5; k++, n++) {
            uint8_t rgb[16 * 12 * 3];
            for (size_t j = 0; j < sizeof rgb; j++)
                rgb[j] = (uint8_t)(j * 5 + (size_t)n * 17);
            size_t jn = 0;
            uint8_t *jpg = tu_jpeg(rgb, 16, 12, 90, &jn);
            snprintf(p, sizeof p, "%s/%03d.jpg", dir, k);
            tu_write_file(p, jpg, jn);
            free(jpg);
            xl += (size_t)snprintf(xml + xl, sizeof xml - xl,
                                   "<Contents><Key>imgs/%s/%03d.jpg</Key><Size>%zu</Size>"
                                   "</Contents>",
                                   classes[c], k, jn);
        }
    }
    xl += (size_t)snprintf(xml + xl, sizeof xml - xl,
                           "<IsTruncated>false</IsTruncated></ListBucketResult>");
    snprintf(dir, sizeof dir, "%s/lbk/.listing.xml", g_www);
    tu_write_file(dir, xml, xl);
    server_start(g_www, F_NONE);
    char ep[128], cache[2048], lf[4096];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    snprintf(cache, sizeof cache, "%s", tu_path("listing-cache"));
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secretkey", 1);
    g_extra[0] = "endpoint";
    g_extra[1] = ep;
    /* No cache directory: listed on every open (the shallow listing and the
     * tree), and nothing kept. */
    run_out ref = run("s3://lbk/imgs", 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    CHECK_EQ(ref.open_rc, STK_OK);
    CHECK_EQ(ref.samples, (uint64_t)n);
    CHECK(listings_of("s3://lbk/imgs", NULL, 1, &ref, NULL) >= 2);
    /* First open with a cache: lists and keeps; the second lists nothing. */
    CHECK(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL) >= 2);
    CHECK(listing_file(cache, lf, sizeof lf));
    CHECK_EQ(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL), 0);
    CHECK_EQ(listings_of("s3://lbk/imgs", cache, 0, NULL, NULL), 0);
    /* TTL 0: listed again (and the kept copy rewritten). */
    g_extra[2] = "listing_ttl";
    g_extra[3] = "0";
    CHECK(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL) >= 1);
    g_extra[2] = NULL;
    CHECK_EQ(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL), 0);
    /* A TTL shorter than the listing's age: listed again. */
    sleep(2);
    g_extra[2] = "listing_ttl";
    g_extra[3] = "1";
    CHECK(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL) >= 1);
    g_extra[2] = NULL;
    /* Damaged on disk: a byte flipped in the middle, then cut short; each is
     * ignored with a warning naming the file, and listed again. */
    size_t len = 0;
    uint8_t *bytes = tu_read_file(lf, &len);
    REQUIRE(bytes && len > 40);
    bytes[len / 2] ^= 0x20;
    tu_write_file(lf, bytes, len);
    CHECK(listings_of("s3://lbk/imgs", cache, 1, &ref, "checksum does not match") >= 1);
    CHECK_EQ(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL), 0);
    tu_write_file(lf, bytes, 20);
    CHECK(listings_of("s3://lbk/imgs", cache, 1, &ref, "not a stoker listing") >= 1);
    CHECK_EQ(listings_of("s3://lbk/imgs", cache, 1, &ref, NULL), 0);
    free(bytes);
    /* What can go stale: objects changed after the listing was kept. Read
     * through the dataset API (one GET each, no disk cache of objects): the
     * removed and the resized objects fail by name, the others are read,
     * and no listing is made. */
    char gone[4096], grown[4096];
    snprintf(gone, sizeof gone, "%s/lbk/imgs/ant/001.jpg", g_www);
    snprintf(grown, sizeof grown, "%s/lbk/imgs/bee/003.jpg", g_www);
    size_t gl = 0, wl = 0;
    uint8_t *gone_b = tu_read_file(gone, &gl), *grown_b = tu_read_file(grown, &wl);
    REQUIRE(gone_b && grown_b);
    unlink(gone);
    uint8_t *big = malloc(wl + 100);
    REQUIRE(big);
    memcpy(big, grown_b, wl);
    memset(big + wl, 0, 100);
    tu_write_file(grown, big, wl + 100);
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set(o, "endpoint", ep) == STK_OK);
    REQUIRE(stk_options_set(o, "cache_dir", cache) == STK_OK);
    stk_dataset *d = NULL;
    char err[1024];
    int before = atomic_load(&srv.listings);
    int rc = stk_dataset_open(&d, "s3://lbk/imgs", o, err, sizeof err);
    CHECK_EQ(rc, STK_OK);
    CHECK_EQ(atomic_load(&srv.listings) - before, 0);
    int ok = 0, removed = 0, resized = 0;
    for (uint64_t i = 0; d && i < (uint64_t)n; i++) {
        const void *data;
        size_t dl;
        int64_t label;
        rc = stk_dataset_read(d, i, &data, &dl, &label, err, sizeof err);
        if (rc == STK_OK)
            ok++;
        else if (strstr(err, "ant/001.jpg"))
            removed++;
        else if (strstr(err, "bee/003.jpg") && strstr(err, "the listing says"))
            resized++;
        else
            fprintf(stderr, "    unexpected: %s\n", err);
    }
    CHECK_EQ(ok, n - 2);
    CHECK_EQ(removed, 1);
    CHECK_EQ(resized, 1);
    stk_dataset_close(d);
    stk_options_destroy(o);
    tu_write_file(gone, gone_b, gl);
    tu_write_file(grown, grown_b, wl);
    free(gone_b);
    free(grown_b);
    free(big);
    memset(g_extra, 0, sizeof g_extra);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    server_stop();
    unlink(dir);
}

/* nginx's index pages (src/io/httplist.c): names percent-decoded from HTML
 * links and taken as they are from JSON, sizes in bytes; links that leave
 * the directory (absolute, "..", a scheme, an encoded '/') or carry a query
 * are no entries; a size that is not in bytes fails, naming the setting. */
static void test_autoindex_pages(void)
{
    const char *html =
        "<html>\r\n<head><title>Index of /f/cat/</title></head>\r\n<body>\r\n<h1>Index of "
        "/f/cat/</h1><hr><pre><a href=\"../\">../</a>\r\n<a href=\"sub/\">sub/</a>          "
        "27-Nov-2026 21:29      -\r\n<a href=\"a%2520b.jpg\">a%20b.jpg</a>          "
        "27-Nov-2026 21:29                 100\r\n<a href=\"/etc/passwd\">p</a>  01-Jan-2026 "
        "00:00  5\r\n<a href=\"http://evil/x.jpg\">y</a>  01-Jan-2026 00:00  5\r\n<a "
        "href=\"%2e%2e\">z</a>  01-Jan-2026 00:00  1\r\n<a href=\"a%2Fb.jpg\">w</a>  "
        "01-Jan-2026 00:00  7\r\n<a href=\"q.jpg?x=1\">q</a>  01-Jan-2026 00:00  3\r\n"
        "<a href=\"z.png\">z.png</a>  01-Jan-2026 00:00  0\r\n</pre><hr></body>\r\n</html>\r\n";
    const char *json = "[\r\n{ \"name\":\"sub\", \"type\":\"directory\", \"mtime\":\"x\" },\r\n"
                       "{ \"name\":\"a%20b.jpg\", \"type\":\"file\", \"mtime\":\"x\", "
                       "\"size\":100 },\r\n{ \"name\":\"..\", \"type\":\"file\", \"size\":1 },\r\n"
                       "{ \"name\":\"z.png\", \"type\":\"file\", \"size\":0 }\r\n]";
    const char *pages[] = {html, json};
    for (int k = 0; k < 2; k++) {
        char **names = NULL, why[256] = "";
        uint64_t *sizes = NULL;
        size_t n = 0, nd = 0;
        CHECK_EQ(stk__autoindex_page(pages[k], strlen(pages[k]), &names, &sizes, &n, &nd, why,
                                     sizeof why),
                 STK_OK);
        CHECK_EQ(n, 2);
        CHECK_EQ(nd, 1);
        if (n == 2) {
            CHECK(!strcmp(names[0], "a%20b.jpg") && sizes[0] == 100);
            CHECK(!strcmp(names[1], "z.png") && sizes[1] == 0);
        }
        stk__remote_list_free(names, sizes, n);
    }
    const char *bad = "<pre><a href=\"big.jpg\">big.jpg</a>  01-Jan-2026 00:00  1K\r\n</pre>";
    char **names = NULL, why[256] = "";
    uint64_t *sizes = NULL;
    size_t n = 0, nd = 0;
    CHECK_EQ(stk__autoindex_page(bad, strlen(bad), &names, &sizes, &n, &nd, why, sizeof why),
             STK_EFORMAT);
    CHECK(strstr(why, "big.jpg") && strstr(why, "autoindex_exact_size on"));
    CHECK(!names && !n);
    CHECK_EQ(stk__autoindex_page("<h1>hello</h1>", 14, &names, &sizes, &n, &nd, why, sizeof why),
             STK_EUNSUPPORTED);
}

/* STK_TEST_ONLY=name runs that test alone (with the dataset). */
/* ---- mixtures with remote sources (docs/mixing.md) ------------------------------ */

static char g_ds2[1100];
static char g_mix_url[2][1200];

/* A local folder of MIX_FILES files (bytes that are no image: read as
 * stored), and a second remote .stk set (other bytes, the same sizes). */
static void make_mix_sets(void)
{
    snprintf(g_mixdir, sizeof g_mixdir, "%s", tu_path("mixf"));
    for (int i = 0; i < MIX_FILES; i++) {
        char path[1200];
        uint8_t data[400];
        snprintf(path, sizeof path, "%s/c%d/f%02d.jpg", g_mixdir, i % 2, i);
        tu_mkdirs(path);
        rmdir(path); /* tu_mkdirs made the file's own name a directory */
        size_t n = 50 + (size_t)i * 13;
        for (size_t j = 0; j < n; j++)
            data[j] = (uint8_t)(i * 3 + j);
        tu_write_file(path, data, n);
    }
    snprintf(g_ds2, sizeof g_ds2, "%s/ds2", g_www);
    make_dataset_at(g_ds2, 5);
}

/* The mixture folder 0.3 + ds 0.4 + ds2 0.3 (quotas 75, 100, 75 of 250),
 * the .stk sets local or by URL. */
static void set_mix(bool remote)
{
    snprintf(g_mix_url[0], sizeof g_mix_url[0], "%s", url("ds"));
    snprintf(g_mix_url[1], sizeof g_mix_url[1], "%s", url("ds2"));
    g_mix[0] = g_mixdir;
    g_mix[1] = remote ? g_mix_url[0] : g_ds;
    g_mix[2] = remote ? g_mix_url[1] : g_ds2;
    g_mix[3] = NULL;
    g_mix_w[0] = 0.3, g_mix_w[1] = 0.4, g_mix_w[2] = 0.3;
}

#define MIX_N      250
#define MIX_REMOTE 175 /* remote samples an epoch */

/* A mixture of a local folder and two remote .stk sets reads the remote
 * samples through the fetch stage (merged ranged requests, far fewer than
 * samples; the disk cache), local ones directly, and gives the batches of
 * the same mixture read from local copies, bit for bit. */
static void test_mixture_remote_as_local(void)
{
    set_mix(false);
    run_out local = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    CHECK_EQ(local.open_rc, STK_OK);
    CHECK_EQ(local.samples, 2 * MIX_N);
    server_start(g_www, F_NONE);
    set_mix(true);
    /* A plan longer than the run: the whole of it is planned at the start
     * and merged. (In steady state the planner adds a sample as one is
     * consumed, whatever the source: merging then needs neighbours planned
     * together, which the shard-aware order gives a single source.) */
    g_extra[0] = "fetch_lookahead";
    g_extra[1] = "1024";
    run_out opened = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 0);
    CHECK_EQ(opened.open_rc, STK_OK);
    for (unsigned t = 1; t <= 3; t += 2) {
        run_out r = run("mix", t, NULL, NULL, STK_ON_ERROR_RAISE, 2);
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK(r.hash == local.hash);
        CHECK_EQ(r.samples, 2 * MIX_N);
        CHECK_EQ(r.fs.failures, 0);
        /* Every remote sample, and only those, came through the stage (the
         * ring's read-ahead into the third epoch adds at most a few
         * batches; local samples would add 150)... */
        CHECK(r.fs.samples >= 2 * MIX_REMOTE && r.fs.samples < 2 * MIX_REMOTE + 64);
        /* ...by merged requests: a sample-by-sample read makes one each,
         * besides the open's (headers, indexes: about 45 here). */
        fprintf(stderr,
                "mixture: %llu requests in all (%llu by an open and its first "
                "batches) for %llu remote samples\n",
                (unsigned long long)r.fs.requests, (unsigned long long)opened.fs.requests,
                (unsigned long long)r.fs.samples);
        CHECK(r.fs.requests > opened.fs.requests && r.fs.requests * 2 < r.fs.samples);
    }
    /* With the disk cache: cold, then warm (no payload request at all). */
    run_out cold = run("mix", 2, tu_path("mixcache"), NULL, STK_ON_ERROR_RAISE, 2);
    CHECK(cold.hash == local.hash);
    CHECK(cold.fs.cache_misses > 0);
    run_out opened_c = run("mix", 2, tu_path("mixcache"), NULL, STK_ON_ERROR_RAISE, 0);
    run_out warm = run("mix", 2, tu_path("mixcache"), NULL, STK_ON_ERROR_RAISE, 2);
    CHECK(warm.hash == local.hash);
    CHECK_EQ(warm.fs.cache_misses, 0);
    CHECK(warm.fs.cache_hits > 0);
    CHECK_EQ(warm.fs.requests, opened_c.fs.requests);
    fprintf(stderr, "mixture cache: cold %llu requests %llu misses, warm %llu requests %llu hits\n",
            (unsigned long long)cold.fs.requests, (unsigned long long)cold.fs.cache_misses,
            (unsigned long long)warm.fs.requests, (unsigned long long)warm.fs.cache_hits);
    memset(g_extra, 0, sizeof g_extra);
    server_stop();
    g_mix[0] = NULL;
}

/* Faults on a mixture's remote sources are retried like a single source's. */
static void test_mixture_faults_are_retried(void)
{
    set_mix(false);
    run_out local = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
    /* One fault kind: what is mixture-specific is that each request goes to
     * its own source's store and is retried there (every kind of fault is
     * covered for one source by test_faults_are_retried). */
    int faults[] = {F_RESET_FIRST};
    for (size_t k = 0; k < sizeof faults / sizeof *faults; k++) {
        server_start(g_www, faults[k]);
        set_mix(true);
        run_out r = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 1);
        CHECK_EQ(r.open_rc, STK_OK);
        CHECK(r.hash == local.hash);
        CHECK(r.fs.retries > 0);
        CHECK_EQ(r.fs.failures, 0);
        server_stop();
    }
    g_mix[0] = NULL;
}

/* Under skip, the samples of a remote source's failing shard are skipped
 * and listed under that source's URL; the others all arrive. */
static void test_mixture_errors_name_the_source(void)
{
    server_start(g_www, F_500_PAYLOAD);
    snprintf(srv.fault_path, sizeof srv.fault_path, "ds2/part-000002.stk");
    srv.payload_end = g_index_off[2];
    set_mix(true);
    g_extra[0] = "fetch_retries";
    g_extra[1] = "2";
    int rc;
    stk_loader *l = open_url("mix", 2, NULL, NULL, STK_ON_ERROR_SKIP, &rc);
    REQUIRE(rc == STK_OK);
    stk_batch *b;
    uint64_t delivered = 0;
    while ((rc = stk_loader_next(l, &b)) != STK_END) {
        REQUIRE(rc == STK_OK);
        delivered += b->size;
        stk_batch_release(b);
    }
    uint64_t got[3], failed[3];
    for (size_t s = 0; s < 3; s++)
        CHECK_EQ(stk_loader_source_stats(l, s, &got[s], &failed[s]), STK_OK);
    CHECK_EQ(failed[0], 0);
    CHECK_EQ(failed[1], 0);
    CHECK(failed[2] > 0);
    CHECK_EQ(got[2] + failed[2], 75);
    CHECK_EQ(delivered, MIX_N - failed[2]);
    size_t ne = stk_loader_error_count(l);
    CHECK_EQ(ne, failed[2]);
    for (size_t k = 0; k < ne; k++) {
        stk_sample_error e;
        REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
        CHECK(strstr(e.path, "/ds2/part-000002.stk") != NULL);
        CHECK(strstr(e.reason, "HTTP 500") != NULL);
        if (k == 0)
            fprintf(stderr, "mixture skip: %s: %s\n", e.path, e.reason);
    }
    stk_loader_close(l);
    memset(g_extra, 0, sizeof g_extra);
    server_stop();
    g_mix[0] = NULL;
}

/* Epoch 0's sample ids of the mixture (g_mix) in batch order. */
static size_t mix_epoch_ids(uint64_t *ids, size_t max)
{
    int rc;
    stk_loader *l = open_url("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, &rc);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    size_t n = 0;
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) != STK_END) {
        REQUIRE(rc == STK_OK);
        for (size_t k = 0; k < b->size && n < max; k++)
            ids[n++] = b->indices[k];
        stk_batch_release(b);
    }
    stk_loader_close(l);
    return n;
}

/* The distinct shards among source s's first `first` samples of ids
 * (source 1: ds, ids [MIX_FILES, MIX_FILES + 115); 2: ds2 after it). */
static int shards_of_first(const uint64_t *ids, size_t n, int s, int first)
{
    uint64_t lo = MIX_FILES + (uint64_t)(s - 1) * SHARDS * PER_SHARD;
    bool seen[SHARDS] = {false};
    int got = 0, distinct = 0;
    for (size_t k = 0; k < n && got < first; k++) {
        if (ids[k] < lo || ids[k] >= lo + SHARDS * PER_SHARD)
            continue;
        int sh = (int)((ids[k] - lo) / PER_SHARD);
        distinct += !seen[sh];
        seen[sh] = true;
        got++;
    }
    return distinct;
}

/* Order "shards" in a mixture: each source with shards reads its samples a
 * window of its shards at a time (shard_window 2 here: its first 46
 * samples come from 2 shards), the folder its global permutation; a remote
 * mixture gives the local one's batches, through a cache of about two
 * shards per source; order "blocks" likewise, each block of a remote
 * source fetched by one request. */
static void test_mixture_shard_order(void)
{
    set_mix(false);
    uint64_t ids[MIX_N];
    g_order = "global";
    size_t n = mix_epoch_ids(ids, MIX_N);
    CHECK_EQ(n, MIX_N);
    /* (Under the global order the first 46 span every shard: the check
     * below can fail.) */
    CHECK(shards_of_first(ids, n, 1, 2 * PER_SHARD) > 2);
    g_order = "shards";
    n = mix_epoch_ids(ids, MIX_N);
    CHECK_EQ(n, MIX_N);
    CHECK_EQ(shards_of_first(ids, n, 1, 2 * PER_SHARD), 2);
    CHECK_EQ(shards_of_first(ids, n, 2, 2 * PER_SHARD), 2);
    /* Each source's epoch still reads each of its samples at most once
     * (quota 100 and 75 of 115: one pass). */
    bool seen[MIX_N] = {false};
    for (size_t k = 0; k < n; k++) {
        if (ids[k] >= MIX_FILES) {
            CHECK(!seen[ids[k] - MIX_FILES]);
            seen[ids[k] - MIX_FILES] = true;
        }
    }
    run_out local = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    server_start(g_www, F_NONE);
    set_mix(true);
    run_out r = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    CHECK_EQ(r.open_rc, STK_OK);
    CHECK(r.hash == local.hash && r.samples == local.samples);
    run_out c = run("mix", 2, tu_path("mixshards"), "200K", STK_ON_ERROR_RAISE, 2);
    CHECK(c.hash == local.hash && c.samples == local.samples);
    CHECK(c.fs.cache_evictions > 0);
    /* The same through the least recently used eviction: the furthest next
     * use (each source's windows in mixture positions) downloads fewer. */
    stk__mix_lru_only = true;
    run_out lru = run("mix", 2, tu_path("mixshards-lru"), "200K", STK_ON_ERROR_RAISE, 2);
    stk__mix_lru_only = false;
    CHECK(lru.hash == local.hash);
    CHECK(c.fs.cache_misses < lru.fs.cache_misses);
    fprintf(stderr,
            "mixture shards order, cache of 200K: %llu requests, %llu misses (LRU: %llu), %llu "
            "evictions, %llu fallbacks\n",
            (unsigned long long)c.fs.requests, (unsigned long long)c.fs.cache_misses,
            (unsigned long long)lru.fs.cache_misses, (unsigned long long)c.fs.cache_evictions,
            (unsigned long long)c.fs.cache_fallbacks);
    /* Blocks of about 5 samples: each fetched whole by one request (the
     * plan of 24 samples alone would merge few neighbours). */
    g_order = "blocks";
    g_extra[0] = "block_bytes";
    g_extra[1] = "8K";
    set_mix(false);
    run_out bl = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 2);
    CHECK_EQ(bl.open_rc, STK_OK);
    set_mix(true);
    run_out bo = run("mix", 2, NULL, NULL, STK_ON_ERROR_RAISE, 0);
    for (unsigned t = 1; t <= 3; t += 2) {
        run_out br = run("mix", t, NULL, NULL, STK_ON_ERROR_RAISE, 2);
        CHECK(br.hash == bl.hash && br.samples == 2 * MIX_N);
        CHECK_EQ(br.fs.failures, 0);
        fprintf(stderr,
                "mixture blocks order: %llu requests (%llu by an open), %llu remote "
                "samples, %llu bytes for %llu\n",
                (unsigned long long)br.fs.requests, (unsigned long long)bo.fs.requests,
                (unsigned long long)br.fs.samples, (unsigned long long)br.fs.bytes,
                (unsigned long long)br.fs.sample_bytes);
        /* About 5 blocks a shard, 10 remote shards, each block fetched once
         * an epoch (sample by sample: 350 requests and more). */
        CHECK(br.fs.requests <= bo.fs.requests + 2 * 2 * SHARDS * 8);
        CHECK(br.fs.requests * 2 < br.fs.samples);
    }
    g_extra[0] = NULL;
    g_order = "global";
    server_stop();
    g_mix[0] = NULL;
}

#define RUN_IF(fn)                                                                                 \
    do {                                                                                           \
        const char *only_ = getenv("STK_TEST_ONLY");                                               \
        if (!only_ || !strcmp(only_, #fn))                                                         \
            RUN(fn);                                                                               \
    } while (0)

int main(void)
{
    tu_begin("test_remote", 580);
    RUN_IF(test_s3_list_page);
    RUN_IF(test_s3_list_pages_grow);
    RUN_IF(test_xml_unescape);
    RUN_IF(test_s3_error_text);
    RUN_IF(test_autoindex_pages);
    make_dataset();
    RUN_IF(test_same_batches_as_local);
    RUN_IF(test_fields_remote);
    RUN_IF(test_cache);
    RUN_IF(test_faults_are_retried);
    RUN_IF(test_past_the_budget);
    RUN_IF(test_close_is_prompt_while_stalled);
    RUN_IF(test_close_is_prompt_while_reading_alone);
    RUN_IF(test_seek_is_prompt_while_stalled);
    RUN_IF(test_resume_mid_epoch);
    RUN_IF(test_block_order);
    RUN_IF(test_block_budget);
    RUN_IF(test_block_budget_depth_auto);
    RUN_IF(test_governor);
    RUN_IF(test_hedge);
    RUN_IF(test_slow_admission_blocks_nothing);
    RUN_IF(test_failed_download_then_readmitted);
    RUN_IF(test_huge_lookahead);
    RUN_IF(test_oom_sweep);
    RUN_IF(test_sample_larger_than_buffer);
    RUN_IF(test_cache_write_error_reads_by_ranges);
    RUN_IF(test_failed_download_names_its_own_shard);
    RUN_IF(test_republished_and_corrupt_entries);
    {
        char big[1200];
        snprintf(big, sizeof big, "%s/big", g_www);
        make_big_dataset(big);
    }
    RUN_IF(test_cold_cache_reads_while_downloading);
    RUN_IF(test_cold_download_cut_midway);
    RUN_IF(test_cold_download_part_retried);
    make_mix_sets();
    RUN_IF(test_mixture_remote_as_local);
    RUN_IF(test_mixture_faults_are_retried);
    RUN_IF(test_mixture_errors_name_the_source);
    RUN_IF(test_mixture_shard_order);
    g_oom_mix = true;
    RUN_IF(test_oom_sweep);
    g_oom_mix = false;
    make_tars(tu_path("www/tars"));
    RUN_IF(test_tar_download_of_another_size_is_refused);
    RUN_IF(test_tar_wait_for_a_hung_download_ends);
    RUN_IF(test_tar_fields_remote_as_local);
    RUN_IF(test_cache_transport_table);
    RUN_IF(test_formats_remote_as_local);
    RUN_IF(test_formats_remote_bad_shards);
    RUN_IF(test_parquet_remote_units);
    RUN_IF(test_parquet_remote_unit_errors);
    RUN_IF(test_formats_remote_oom_sweep);
    RUN_IF(test_bucket_of_class_folders);
    RUN_IF(test_bucket_listing_cached);
    RUN_IF(test_unused_remote_options_are_refused);
    RUN_IF(test_url_display);
    RUN_IF(test_secrets_never_in_messages);
    RUN_IF(test_unsupported_scheme_is_not_a_path);
    RUN_IF(test_s3_bucket_names_are_validated);
    RUN_IF(test_listing_with_a_repeated_token_ends);
    RUN_IF(test_deterministic_errors_are_final);
    RUN_IF(test_auth_message_fits_the_scheme);
    RUN_IF(test_open_against_a_hung_server_is_parallel);
    RUN_IF(test_index_many_shards);
    RUN_IF(test_index_broken_falls_back);
    RUN_IF(test_index_not_named_is_not_used);
    RUN_IF(test_index_oom_sweep);
    RUN_IF(test_index_verify);
    RUN_IF(test_index_republished_is_not_read_from_old_entries);
    RUN_IF(test_index_of_another_pack_is_refused);
    RUN_IF(test_index_shard_replaced_since_the_pack);
    if (getenv("STK_INDEX_BENCH"))
        RUN(bench_index_open);
    {
        char lnk[300], tgt[512];
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        while (getenv("STK_TEST_FDS") && d && (e = readdir(d))) {
            snprintf(lnk, sizeof lnk, "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(lnk, tgt, sizeof tgt - 1);
            if (n > 0) {
                tgt[n] = 0;
                fprintf(stderr, "fd %s -> %s\n", e->d_name, tgt);
            }
        }
        if (d)
            closedir(d);
    }
    return tu_end();
}
