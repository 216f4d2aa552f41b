/* test_iofault.c -- I/O fault sweeps, like test_oom's allocation sweeps: for
 * each source kind (folder, records, .stk, tar, CIFAR; local) and each fault
 * (EIO, EINTR, short read/write, ENOENT), the n-th file call of the library
 * (src/io/file.c) fails, for n over every call a session makes: open, one
 * whole epoch, close. Every run must
 *   - with EINTR or a short read: deliver exactly the fault-free run's
 *     batches (the library retries and loops transparently);
 *   - with EIO or ENOENT: fail its open with STK_EIO/STK_ENOENT and a message
 *     naming the OS reason, or open the same dataset and deliver only samples
 *     bit-identical to the fault-free run's, in its order, every other sample
 *     reported as a sample error (path and reason) -- or end the epoch with a
 *     clear error;
 *   - leak no allocation or descriptor, and finish within a bounded time.
 * After each sweep a fault-free run must again equal the first; the tar
 * indexing sweep (index caches removed before each run) checks that after
 * every run, so no fault leaves a bad index in the cache.
 *
 *
 * Packing (test_pack) is swept the same way: each file call of stk_pack
 * failing in turn (source, output directory, lock, marker, shards,
 * manifest) either leaves the pack complete and byte-identical to the
 * fault-free one, or fails with a message naming the OS reason and leaves
 * no shard that a reader could take for a finished dataset (no manifest,
 * and no shard without the unfinished-pack marker); EINTR and short
 * transfers change nothing.
 *
 * `make test` sweeps at most STK_IOFAULT_POINTS (default 48) points per
 * (source, fault), evenly spread; STK_IOFAULT_FULL=1 sweeps every call. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "io/file.h"
#include "source/manifest.h"
#include "source/stkformat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAXS 320 /* samples per dataset, at most */

typedef struct sample {
    int seen;
    int64_t label;
    size_t len;
    uint8_t *bytes;
} sample;

/* One run's outcome. */
typedef struct run {
    int open_rc;
    char open_msg[512];
    uint64_t num_samples;
    int end_rc; /* STK_END, or the error that ended the epoch */
    char end_msg[512];
    size_t nbatch;
    uint64_t order[MAXS]; /* indices delivered, in order */
    size_t batch_size[MAXS];
    size_t ndelivered;
    sample s[MAXS];
    uint64_t failed; /* stats: samples skipped or failed */
    size_t nerrors;
    int errors_ok;        /* every error names a path and a reason */
    char reasons[4][256]; /* the first few reasons */
    uint64_t esample;     /* STK_ESAMPLE answers (raise policy) */
} run;

typedef struct scenario {
    const char *name;
    tu_cfg cfg;
    void (*before)(void); /* runs before each session, unarmed */
} scenario;

static void run_free(run *r)
{
    for (int k = 0; k < MAXS; k++)
        free(r->s[k].bytes);
    memset(r, 0, sizeof *r);
}

static const uint8_t *sample_bytes(const stk_batch *b, size_t k, size_t *len)
{
    if (b->kind == STK_BATCH_DENSE) {
        *len = b->sample_bytes;
        return (const uint8_t *)b->data + k * b->sample_bytes;
    }
    *len = (size_t)b->lengths[k];
    return (const uint8_t *)b->data + b->offsets[k];
}

static long g_n_now;
static const char *g_name_now;

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "test_iofault: a run took more than 30 s (hang)\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(1);
}

/* The sweeps: each fault kind once from the start; ENOENT sticky (the data
 * vanished and stays gone), and once mid-run (a file deleted under a run). */
typedef struct mode {
    int kind, sticky;
    int mid_run; /* armed once the loader is open (a listing that misses a
                    file that vanished is right: the dataset no longer has it) */
    const char *name;
} mode;
static const mode k_modes[] = {{STK__IOF_EIO, 0, 0, "EIO"},
                               {STK__IOF_EINTR, 0, 0, "EINTR"},
                               {STK__IOF_SHORT, 0, 0, "short read"},
                               {STK__IOF_ENOENT, 1, 0, "ENOENT"},
                               {STK__IOF_ENOENT, 0, 1, "ENOENT mid-run"}};
/* Opens, runs one epoch, closes; with m, the n-th call of m's kind fails
 * (counted from the start, or from the open's return for m->mid_run). */
static void session(const scenario *sc, run *r, const mode *m, long n)
{
    memset(r, 0, sizeof *r);
    r->errors_ok = 1;
    stk_loader *l = NULL;
    if (sc->before)
        sc->before();
    if (m && !m->mid_run)
        stk__iofault_arm(m->kind, n, m->sticky);
    r->open_rc = tu_open_cfg(&l, &sc->cfg);
    if (m && m->mid_run)
        stk__iofault_arm(m->kind, n, m->sticky);
    if (r->open_rc != STK_OK) {
        if (l)
            stk__fmt(r->open_msg, sizeof r->open_msg, "%s", stk_loader_errmsg(l));
        stk_loader_close(l);
        return;
    }
    stk_info info = {.struct_size = sizeof info};
    CHECK_EQ(stk_loader_info(l, &info), STK_OK);
    r->num_samples = info.num_samples;
    REQUIRE(info.num_samples <= MAXS);
    for (;;) {
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (rc == STK_ESAMPLE) {
            r->esample++;
            continue;
        }
        if (rc != STK_OK) {
            r->end_rc = rc;
            if (rc != STK_END)
                stk__fmt(r->end_msg, sizeof r->end_msg, "%s", stk_loader_errmsg(l));
            break;
        }
        REQUIRE(r->nbatch < MAXS);
        r->batch_size[r->nbatch++] = b->size;
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < MAXS && r->ndelivered < MAXS);
            r->order[r->ndelivered++] = i;
            size_t len;
            const uint8_t *p = sample_bytes(b, k, &len);
            sample *s = &r->s[i];
            CHECK(!s->seen); /* once per epoch */
            s->seen = 1;
            s->label = b->labels[k];
            s->len = len;
            s->bytes = malloc(len ? len : 1);
            memcpy(s->bytes, p, len);
        }
        stk_batch_release(b);
    }
    stk_stats st = {.struct_size = sizeof st};
    CHECK_EQ(stk_loader_stats(l, &st), STK_OK);
    r->failed = st.samples_skipped + st.samples_failed;
    r->nerrors = stk_loader_error_count(l);
    for (size_t k = 0; k < r->nerrors; k++) {
        stk_sample_error e;
        CHECK_EQ(stk_loader_error_get(l, k, &e), STK_OK);
        if (!e.path || !e.path[0] || !e.reason || !e.reason[0])
            r->errors_ok = 0;
        else if (k < 4)
            stk__fmt(r->reasons[k], sizeof r->reasons[k], "%s", e.reason);
    }
    stk_loader_close(l);
}

/* Are a and b the same delivery, batch for batch and byte for byte? */
static int same_run(const run *a, const run *b)
{
    if (a->open_rc != b->open_rc || a->num_samples != b->num_samples || a->end_rc != b->end_rc ||
        a->nbatch != b->nbatch || a->ndelivered != b->ndelivered || a->nerrors != b->nerrors ||
        a->failed != b->failed)
        return 0;
    if (memcmp(a->batch_size, b->batch_size, a->nbatch * sizeof a->batch_size[0]) ||
        memcmp(a->order, b->order, a->ndelivered * sizeof a->order[0]))
        return 0;
    for (int i = 0; i < MAXS; i++) {
        const sample *x = &a->s[i], *y = &b->s[i];
        if (x->seen != y->seen)
            return 0;
        if (x->seen &&
            (x->label != y->label || x->len != y->len || memcmp(x->bytes, y->bytes, x->len)))
            return 0;
    }
    return 1;
}

static const char *g_mode_now = "";

/* Checks a faulted run against the fault-free one. Returns 0 if it broke a
 * rule (and says which). */
static int judge(const run *base, const run *r, int kind)
{
    const char *why = NULL;
    if (kind == STK__IOF_EINTR || kind == STK__IOF_SHORT) {
        if (!same_run(base, r))
            why = r->open_rc ? r->open_msg : r->end_rc != STK_END ? r->end_msg : "delivery differs";
        goto out;
    }
    if (r->open_rc != STK_OK) {
        const char *os = strerror(kind == STK__IOF_EIO ? EIO : ENOENT);
        if (r->open_rc != STK_EIO && r->open_rc != STK_ENOENT)
            why = "open failed with a code other than EIO/ENOENT";
        else if (!strstr(r->open_msg, os))
            why = "open's message does not give the OS reason";
        goto out;
    }
    if (r->num_samples != base->num_samples) {
        why = "opened a different dataset (sample count)";
        goto out;
    }
    /* Delivered samples: a subsequence of the fault-free order, each byte
     * for byte the same. */
    size_t j = 0;
    for (size_t k = 0; k < r->ndelivered && !why; k++) {
        while (j < base->ndelivered && base->order[j] != r->order[k])
            j++;
        if (j == base->ndelivered)
            why = "a sample delivered out of order (or not in the fault-free run)";
        const sample *x = &base->s[r->order[k]], *y = &r->s[r->order[k]];
        if (!why &&
            (x->label != y->label || x->len != y->len || memcmp(x->bytes, y->bytes, x->len)))
            why = "a delivered sample differs from the fault-free run (wrong bytes)";
    }
    if (why)
        goto out;
    if (r->end_rc == STK_END) {
        /* A complete epoch: every missing sample is a reported error. */
        if (r->ndelivered + r->failed != base->ndelivered)
            why = "samples missing without an error";
        else if (r->nerrors != r->failed || !r->errors_ok)
            why = "a failed sample without a reported error (path and reason)";
        for (size_t k = 0; k < r->nerrors && k < 4 && !why; k++)
            if (!strstr(r->reasons[k], strerror(kind == STK__IOF_EIO ? EIO : ENOENT))) {
                fprintf(stderr, "    reason: %s\n", r->reasons[k]);
                why = "a sample error's reason does not give the OS reason";
            }
    } else if (!r->end_msg[0]) {
        why = "the epoch ended with an error but no message";
    }
out:
    if (why) {
        fprintf(stderr, "    %s, %s at call %ld: %s (open %s: \"%s\"; end %s: \"%s\")\n",
                g_name_now, g_mode_now, g_n_now, why, stk_strerror(r->open_rc), r->open_msg,
                stk_strerror(r->end_rc), r->end_msg);
        return 0;
    }
    return 1;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

static void sweep(const scenario *sc)
{
    run base, again, r;
    g_name_now = sc->name;
    session(sc, &base, NULL, 0);
    REQUIRE(base.open_rc == STK_OK && base.end_rc == STK_END && base.ndelivered > 0);
    CHECK_EQ(base.nerrors, 0);
    int full = env_long("STK_IOFAULT_FULL", 0) != 0;
    long points = env_long("STK_IOFAULT_POINTS", 48);
    for (size_t mi = 0; mi < sizeof k_modes / sizeof k_modes[0]; mi++) {
        int kind = k_modes[mi].kind;
        g_mode_now = k_modes[mi].name;
        /* The calls a fault-free session makes that this fault applies to. */
        mode count = k_modes[mi];
        count.sticky = 0;
        session(sc, &again, &count, LONG_MAX);
        long calls = stk__iofault_calls();
        stk__iofault_arm(0, -1, 0);
        CHECK(same_run(&base, &again));
        run_free(&again);
        long stride = full || calls <= points ? 1 : (calls + points - 1) / points;
        long swept = 0, unreached = 0, open_failed = 0, sample_errors = 0, ended = 0, absorbed = 0;
        long live0 = stk__alloc_live();
        int fds0 = tu_count_fds();
        int bad = 0;
        for (long n = 0; n < calls && bad < 3; n += stride) {
            g_n_now = n;
            alarm(30);
            session(sc, &r, &k_modes[mi], n);
            long fired = stk__iofault_fired();
            stk__iofault_arm(0, -1, 0);
            alarm(0);
            swept++;
            /* Sessions past the epoch prefetch a varying part of the next
             * one, so the last few calls may not happen in every run. */
            if (!fired)
                unreached++;
            if (!judge(&base, &r, kind)) {
                CHECK(0);
                bad++;
            }
            if (r.open_rc)
                open_failed++;
            else if (r.end_rc != STK_END)
                ended++;
            else if (r.failed)
                sample_errors++;
            else
                absorbed++;
            run_free(&r);
            if (sc->before) {
                /* What the faulted run left behind (a tar index it stored)
                 * must give the fault-free delivery. */
                scenario keep = *sc;
                keep.before = NULL;
                session(&keep, &again, NULL, 0);
                if (!same_run(&base, &again)) {
                    fprintf(stderr, "    %s, %s at call %ld: the next fault-free run differs\n",
                            sc->name, g_mode_now, n);
                    CHECK(0);
                    bad++;
                }
                run_free(&again);
            }
            if (stk__alloc_live() != live0) {
                fprintf(stderr, "    %s, %s at call %ld: leaked %ld allocations\n", sc->name,
                        g_mode_now, n, stk__alloc_live() - live0);
                CHECK(0);
                live0 = stk__alloc_live();
                bad++;
            }
            if (tu_count_fds() != fds0) {
                fprintf(stderr, "    %s, %s at call %ld: leaked %d descriptors\n", sc->name,
                        g_mode_now, n, tu_count_fds() - fds0);
                CHECK(0);
                fds0 = tu_count_fds();
                bad++;
            }
        }
        printf("    %-8s %-10s: %4ld calls, %3ld swept (every %ld): %ld opens failed cleanly, "
               "%ld epochs ended with an error, %ld with sample errors, %ld identical "
               "(%ld not reached)\n",
               sc->name, g_mode_now, calls, swept, stride, open_failed, ended, sample_errors,
               absorbed, unreached);
        /* Sources that keep their files open make no path call after open. */
        CHECK(calls > 0 || k_modes[mi].mid_run);
        CHECK(unreached < swept || !calls);
        /* Nothing left behind: a fault-free run is the first one again. */
        session(sc, &again, NULL, 0);
        CHECK(same_run(&base, &again));
        run_free(&again);
    }
    run_free(&base);
}

/* ---- Datasets ------------------------------------------------------------ */

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (uint8_t)((k * 31 + seed * 17) ^ (k >> 3));
}

/* 3 classes, nested subfolders, one class reached through a symlink (so
 * the listing stats it); 15 files of 100..590 bytes. */
static const char *make_folder(void)
{
    const char *root = tu_path("folder");
    char p[1024];
    uint8_t buf[700];
    for (int k = 0; k < 15; k++) {
        int cls = k / 5;
        if (cls == 2)
            snprintf(p, sizeof p, "%s%s", tu_path("folder-c2"), k % 5 >= 3 ? "/sub" : "");
        else
            snprintf(p, sizeof p, "%s/c%d%s", root, cls, k % 5 >= 3 ? "/sub" : "");
        tu_mkdirs(p);
        snprintf(p + strlen(p), sizeof p - strlen(p), "/f%02d.png", k);
        size_t n = 100 + (size_t)k * 35;
        fill(buf, n, (unsigned)k);
        tu_write_file(p, buf, n);
    }
    snprintf(p, sizeof p, "%s/c2", root);
    REQUIRE(symlink(tu_path("folder-c2"), p) == 0);
    return root;
}

/* 24 records: 16-byte header, 1-byte label, 40 payload bytes. */
static const char *make_records(void)
{
    const char *p = tu_path("rec.bin");
    uint8_t buf[16 + 24 * 41];
    fill(buf, sizeof buf, 99);
    for (int k = 0; k < 24; k++)
        buf[16 + k * 41] = (uint8_t)(k % 5);
    tu_write_file(p, buf, sizeof buf);
    return p;
}

/* nshards raw .stk shards (4x4x3 payloads) of per samples, and a manifest.
 * Past 256 shards the reader opens a shard for each read (no kept fds). */
static const char *make_stk(const char *rel, int nshards, int per)
{
    const char *dir = tu_path(rel);
    tu_mkdirs(dir);
    stk__manifest m = {0};
    stk__manifest_shard *sh = calloc((size_t)nshards, sizeof *sh);
    m.kind = STK_PAYLOAD_RAW;
    m.classes = 4;
    m.shards = sh;
    m.nshards = (size_t)nshards;
    char err[512];
    for (int s = 0; s < nshards; s++) {
        char path[1024], name[64];
        snprintf(name, sizeof name, "train-%06d.stk", s);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        stk__stk_header h = {
            .kind = STK_PAYLOAD_RAW, .align = 64, .raw_h = 4, .raw_w = 4, .raw_c = 3};
        stk__stk_writer *w;
        REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
        for (int k = 0; k < per; k++) {
            uint8_t px[48];
            int i = s * per + k;
            fill(px, sizeof px, (unsigned)i);
            char key[32];
            snprintf(key, sizeof key, "s%04d", i);
            REQUIRE(stk__stkw_add(w, px, sizeof px, i % 4, key, 4, 4, err, sizeof err) == STK_OK);
        }
        uint64_t size;
        REQUIRE(stk__stkw_finish(w, 4, &size, err, sizeof err) == STK_OK);
        sh[s].name = strdup(name);
        sh[s].count = (uint64_t)per;
        sh[s].bytes = size;
        m.samples += (uint64_t)per;
    }
    REQUIRE(stk__manifest_write(dir, &m, err, sizeof err) == STK_OK);
    for (int s = 0; s < nshards; s++)
        free(sh[s].name);
    free(sh);
    return dir;
}

/* Two tar shards of 8 samples each (.png data + .cls label). */
static const char *make_tar(void)
{
    const char *dir = tu_path("tar");
    tu_mkdirs(dir);
    for (int s = 0; s < 2; s++) {
        uint8_t *t = NULL;
        size_t tn = 0;
        for (int k = s * 8; k < s * 8 + 8; k++) {
            char name[64], lab[16];
            uint8_t img[900];
            size_t n = 200 + (size_t)k * 40;
            fill(img, n, (unsigned)k + 7);
            snprintf(name, sizeof name, "s%04d.png", k);
            tu_tar_add(&t, &tn, name, img, n);
            snprintf(name, sizeof name, "s%04d.cls", k);
            snprintf(lab, sizeof lab, "%d\n", k % 3);
            tu_tar_add(&t, &tn, name, lab, strlen(lab));
        }
        t = realloc(t, tn + 1024);
        memset(t + tn, 0, 1024);
        tn += 1024;
        char path[1024];
        snprintf(path, sizeof path, "%s/train-%06d.tar", dir, s);
        tu_write_file(path, t, tn);
        free(t);
    }
    return dir;
}

/* Two CIFAR-10 batches of 6 records. */
static const char *make_cifar(void)
{
    const char *dir = tu_path("cifar");
    tu_mkdirs(dir);
    for (int f = 0; f < 2; f++) {
        static uint8_t b[6 * 3073];
        for (int r = 0; r < 6; r++) {
            b[r * 3073] = (uint8_t)((f * 6 + r) % 10);
            fill(b + r * 3073 + 1, 3072, (unsigned)(f * 6 + r));
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/data_batch_%d.bin", dir, f + 1);
        tu_write_file(path, b, sizeof b);
    }
    return dir;
}

static scenario base_scenario(const char *name, const char *path)
{
    scenario sc;
    memset(&sc, 0, sizeof sc);
    /* tu_path's buffers rotate: keep a copy. */
    static char paths[16][1024];
    static int np;
    REQUIRE(np < 16);
    snprintf(paths[np], sizeof paths[np], "%s", path);
    sc.name = name;
    sc.cfg.path = paths[np++];
    sc.cfg.bs = 5;
    sc.cfg.threads = 2;
    sc.cfg.depth = 2;
    sc.cfg.seed = 7;
    sc.cfg.shuffle = 1;
    sc.cfg.on_error = STK_ON_ERROR_SKIP;
    sc.cfg.max_sample = 4096;
    return sc;
}

static void test_folder(void)
{
    scenario sc = base_scenario("folder", make_folder());
    sweep(&sc);
    sc.name = "folder/raise";
    sc.cfg.on_error = STK_ON_ERROR_RAISE;
    sweep(&sc);
}

static void test_records(void)
{
    scenario sc = base_scenario("records", make_records());
    sc.cfg.record = 41;
    sc.cfg.header = 16;
    sc.cfg.label = 1;
    sweep(&sc);
}

static void test_stk(void)
{
    scenario sc = base_scenario("stk", make_stk("stk", 2, 10));
    sweep(&sc);
    /* 260 one-sample shards: each read opens its shard. */
    sc = base_scenario("stk/260", make_stk("stk260", 260, 1));
    sc.cfg.threads = 1;
    sweep(&sc);
}

static void test_tar(void)
{
    scenario sc = base_scenario("tar", make_tar());
    sweep(&sc);
}

/* Removes the tar index caches (beside the shards and under XDG_CACHE_HOME),
 * so the session indexes the tars and stores the index again. */
static void remove_indexes_in(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (n > 7 && !strcmp(e->d_name + n - 7, ".stkidx"))
            REQUIRE(unlink(p) == 0);
    }
    closedir(d);
}

static void remove_tar_indexes(void)
{
    remove_indexes_in(tu_path("tar"));
    remove_indexes_in(tu_path("xdg/stoker/tar"));
}

static void test_tar_indexing(void)
{
    scenario sc = base_scenario("tar/index", tu_path("tar"));
    sc.before = remove_tar_indexes;
    sweep(&sc);
}

static void test_cifar(void)
{
    scenario sc = base_scenario("cifar", make_cifar());
    sweep(&sc);
}

/* The shim itself: EINTR never reaches a caller; a short read is short; the
 * count and the sticky mode do what file.h says. */
static void test_shim(void)
{
    const char *p = tu_path("shim.bin");
    uint8_t data[100], got[100];
    fill(data, sizeof data, 3);
    tu_write_file(p, data, sizeof data);
    stk__iofault_arm(STK__IOF_EINTR, 0, 0);
    int fd = stk__open(p, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_EQ(stk__iofault_fired(), 1);
    stk__iofault_arm(STK__IOF_SHORT, 0, 0);
    CHECK_EQ(stk__pread(fd, got, 100, 0), 50);
    CHECK_EQ(stk__pread(fd, got, 100, 0), 100);
    stk__iofault_arm(STK__IOF_SHORT, 0, 1);
    CHECK_EQ(stk__pread_upto(fd, got, 100, 0), 100); /* 50 + 25 + ... + 1 */
    CHECK(!memcmp(got, data, 100));
    stk__iofault_arm(STK__IOF_EIO, 1, 0);
    CHECK_EQ(stk__pread(fd, got, 10, 0), 10);
    errno = 0;
    CHECK_EQ(stk__pread(fd, got, 10, 0), -1);
    CHECK_EQ(errno, EIO);
    CHECK_EQ(stk__iofault_calls(), 2);
    stk__iofault_arm(STK__IOF_ENOENT, 0, 0);
    struct stat st;
    CHECK_EQ(stk__fstat(fd, &st), 0); /* ENOENT does not apply to fstat */
    CHECK_EQ(stk__iofault_calls(), 0);
    CHECK_EQ(stk__stat(p, &st), -1);
    CHECK_EQ(errno, ENOENT);
    stk__iofault_arm(0, -1, 0);
    CHECK_EQ(stk__close(fd), 0);
}

/* ---- stk_pack under faults -------------------------------------------- */

/* A folder of 2 classes x 4 real JPEGs, for packing with a resize (so the
 * decode, resize and encode path runs between the file calls). */
static const char *make_jpeg_tree(void)
{
    const char *root = tu_path("pack-src");
    for (int k = 0; k < 8; k++) {
        char dir[1024], p[1100];
        snprintf(dir, sizeof dir, "%s/class%d", root, k / 4);
        tu_mkdirs(dir);
        snprintf(p, sizeof p, "%s/img%02d.jpg", dir, k);
        uint32_t w = 24 + (uint32_t)k * 5, h = 20 + (uint32_t)k * 3;
        uint8_t *px = malloc((size_t)w * h * 3);
        REQUIRE(px);
        fill(px, (size_t)w * h * 3, (unsigned)k + 11);
        size_t n;
        uint8_t *jpg = tu_jpeg(px, w, h, 90, &n);
        tu_write_file(p, jpg, n);
        free(jpg);
        free(px);
    }
    return root;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        REQUIRE(unlink(p) == 0);
    }
    closedir(d);
    REQUIRE(rmdir(dir) == 0);
}

/* What a finished pack left: a hash of the names and bytes of its shards
 * and manifest (other files: none expected). *state: 0 no directory, 1 a
 * dataset (a manifest), 2 no manifest and nothing a reader could take for a
 * dataset (no shards, or the unfinished-pack marker beside them), 3 shards
 * without a manifest or marker. */
static uint64_t pack_state(const char *dir, int *state)
{
    DIR *d = opendir(dir);
    *state = 0;
    if (!d)
        return 0;
    char names[64][256];
    int n = 0, manifest = 0, marker = 0, shards = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        size_t l = strlen(e->d_name);
        manifest |= !strcmp(e->d_name, STK_MANIFEST);
        marker |= !strcmp(e->d_name, STK_PACK_MARKER);
        /* Left behind when their removal fails, and harmless then: the lock
         * file (a lock no one holds) and, beside a manifest, the marker (a
         * manifest makes the dataset complete). Not part of the pack. */
        if (!strcmp(e->d_name, ".stoker-pack.lock") || !strcmp(e->d_name, STK_PACK_MARKER))
            continue;
        shards += l > 4 && !strcmp(e->d_name + l - 4, ".stk");
        REQUIRE(n < 64);
        snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    uint64_t h = tu_hash_files(dir, names, n);
    *state = manifest ? 1 : !shards || marker ? 2 : 3;
    return h;
}

static void test_pack(void)
{
    const char *src = make_jpeg_tree();
    char out[1024];
    snprintf(out, sizeof out, "%s", tu_path("pack-out"));
    stk_pack_options o = {
        .struct_size = sizeof o, .max_side = 16, .quality = 80, .shard_size = 600, .threads = 2};
    char err[1024];
    /* The fault-free pack. */
    REQUIRE(stk_pack(src, out, &o, NULL, err, sizeof err) == STK_OK);
    int state;
    uint64_t ref = pack_state(out, &state);
    REQUIRE(state == 1);
    remove_tree(out);
    static const int kinds[] = {STK__IOF_EIO, STK__IOF_ENOENT, STK__IOF_EINTR, STK__IOF_SHORT};
    static const char *const kname[] = {"", "EIO", "EINTR", "SHORT", "ENOENT"};
    int fds = tu_count_fds();
    for (size_t kk = 0; kk < sizeof kinds / sizeof *kinds; kk++) {
        int kind = kinds[kk], failed = 0, lock_failed = 0;
        /* The calls this kind of fault applies to, in a fault-free pack. */
        stk__iofault_arm(kind, LONG_MAX, 0);
        REQUIRE(stk_pack(src, out, &o, NULL, err, sizeof err) == STK_OK);
        long calls = stk__iofault_calls();
        stk__iofault_arm(0, -1, 0);
        remove_tree(out);
        CHECK(calls > 8);
        for (long n = 0; n < calls + 2; n++) {
            err[0] = '\0';
            stk__iofault_arm(kind, n, 0);
            int rc = stk_pack(src, out, &o, NULL, err, sizeof err);
            long fired = stk__iofault_fired();
            stk__iofault_arm(0, -1, 0);
            uint64_t h = pack_state(out, &state);
            if (rc == STK_OK) {
                if (h != ref || state != 1)
                    fprintf(stderr, "  pack %s at call %ld: OK but not the fault-free pack\n",
                            kname[kind], n);
                CHECK(h == ref && state == 1);
            } else {
                failed++;
                lock_failed += strstr(err, "writer lock") != NULL;
                const char *why = strerror(kind == STK__IOF_ENOENT ? ENOENT : EIO);
                if (!err[0] || !strstr(err, why) || state == 1 || state == 3)
                    fprintf(stderr, "  pack %s at call %ld: rc %d, state %d, err: %s\n",
                            kname[kind], n, rc, state, err);
                CHECK(fired == 1);
                CHECK(kind == STK__IOF_EIO || kind == STK__IOF_ENOENT);
                CHECK(strstr(err, why) != NULL); /* the OS reason reaches the caller */
                CHECK(state != 1 && state != 3); /* nothing presented as complete */
            }
            CHECK_EQ(tu_count_fds(), fds);
            if (state)
                remove_tree(out);
        }
        /* EIO/ENOENT must actually have failed packs, or the sweep missed them. */
        if (kind == STK__IOF_EIO || kind == STK__IOF_ENOENT) {
            CHECK(failed > calls / 2);
            /* The output directory's calls are swept too (its lock). */
            CHECK(lock_failed > 0);
        }
        fprintf(stderr,
                "    pack %-6s: %ld calls swept, %d packs failed cleanly, the others "
                "complete and identical\n",
                kname[kind], calls + 2, failed);
    }
    REQUIRE(stk_pack(src, out, &o, NULL, err, sizeof err) == STK_OK);
    CHECK(pack_state(out, &state) == ref);
    remove_tree(out);
}

int main(void)
{
    tu_begin("test_iofault", 580);
    signal(SIGALRM, on_alarm);
    /* The tar index cache lives under the test's own directory. */
    setenv("XDG_CACHE_HOME", tu_path("xdg"), 1);
    RUN(test_shim);
    RUN(test_pack);
    RUN(test_records);
    RUN(test_cifar);
    RUN(test_stk);
    RUN(test_tar);
    RUN(test_tar_indexing);
    RUN(test_folder);
    return tu_end();
}
