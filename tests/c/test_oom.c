/* test_oom.c -- allocation-failure sweeps, SQLite style: for n = 0, 1, 2, ...
 * the n-th library allocation fails, and a whole session (options, open, two
 * epochs, stats, errors, close) must either succeed or fail cleanly with
 * STK_ENOMEM -- never crash, hang, leak an allocation or a descriptor, or
 * deliver wrong data. The sweep ends at the first n that the session never
 * reaches.
 *
 * test_oom_pack sweeps stk_pack the same way (with a resize, so the decode,
 * resize and re-encode buffers are among the allocations, and two worker
 * threads): each run completes byte-identical to the fault-free pack or
 * fails with STK_ENOMEM, leaving no manifest and no allocation, thread or
 * descriptor behind. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long stk__alloc_live(void);
void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

#define REC 32

static long g_n; /* the allocation made to fail, for messages */
#define N 40

typedef struct scenario {
    const char *path;
    int records;
    int policy;
    uint64_t bad;     /* samples that fail by themselves (folder) */
    uint64_t samples; /* samples in the dataset */
} scenario;

/* Checks a delivered sample: records carry their index; folder files hold
 * "file <index>". */
static int sample_ok(const scenario *sc, const stk_batch *b, size_t k)
{
    if (sc->records) {
        const uint8_t *p = (const uint8_t *)b->data + k * b->sample_bytes;
        for (int j = 0; j < REC; j++)
            if (p[j] != (uint8_t)(b->indices[k] + (uint64_t)j))
                return 0;
        return 1;
    }
    char want[64];
    int n = snprintf(want, sizeof want, "file %llu", (unsigned long long)b->indices[k]);
    return b->lengths[k] == (uint64_t)n &&
           !memcmp((const uint8_t *)b->data + b->offsets[k], want, (size_t)n);
}

/* One session. Returns STK_OK or the error that ended it early. */
static int session(const scenario *sc, int *injected_visible)
{
    stk_options *o = NULL;
    stk_loader *l = NULL;
    int rc;
    if ((rc = stk_options_create(&o)) != STK_OK) {
        CHECK(o == NULL);
        return rc;
    }
    if ((rc = stk_options_set_source(o, sc->path)) != STK_OK)
        goto out;
    if (sc->records && (rc = stk_options_set_records(o, REC, 0, 0)) != STK_OK)
        goto out;
    stk_options_set_batch_size(o, 6);
    stk_options_set_threads(o, 3);
    stk_options_set_depth(o, 2);
    stk_options_set_seed(o, 1);
    stk_options_set_on_error(o, sc->policy);
    stk_options_set_max_sample_bytes(o, 64);
    if ((rc = stk_loader_open(&l, o)) != STK_OK) {
        /* A failed handle explains itself. */
        if (l && !stk_loader_errmsg(l)[0])
            fprintf(stderr, "    open failed with %s and an empty message (allocation %ld)\n",
                    stk_strerror(rc), g_n);
        if (l)
            CHECK(stk_loader_errmsg(l)[0] != 0);
        goto out;
    }
    uint64_t delivered = 0;
    int ok = 1;
    for (int e = 0; e < 2; e++) {
        for (;;) {
            stk_batch *b;
            int r = stk_loader_next(l, &b);
            if (r == STK_END)
                break;
            if (r == STK_ESAMPLE) {
                ok &= sc->policy == STK_ON_ERROR_RAISE && sc->bad > 0;
                continue;
            }
            if (r != STK_OK) {
                fprintf(stderr, "    next: %s (%s)\n", stk_strerror(r), stk_loader_errmsg(l));
                ok = 0;
                break;
            }
            for (size_t k = 0; k < b->size; k++)
                ok &= sample_ok(sc, b, k);
            delivered += b->size;
            stk_batch_release(b);
        }
    }
    /* Nothing is lost to an allocation failure after open: the counts are
     * complete, though an error's text may be. */
    CHECK(ok);
    CHECK_EQ(delivered, 2 * (sc->samples - sc->bad));
    stk_stats st = {.struct_size = sizeof st};
    CHECK_EQ(stk_loader_stats(l, &st), STK_OK);
    CHECK_EQ(sc->policy ? st.samples_skipped : st.samples_failed, 2 * sc->bad);
    size_t ne = stk_loader_error_count(l);
    CHECK(ne <= 2 * sc->bad);
    if (ne < 2 * sc->bad)
        *injected_visible = 1;
    for (size_t k = 0; k < ne; k++) {
        stk_sample_error e;
        CHECK_EQ(stk_loader_error_get(l, k, &e), STK_OK);
        CHECK(e.path != NULL && e.reason != NULL);
    }
out:
    stk_loader_close(l);
    stk_options_destroy(o);
    return rc;
}

static void sweep(const scenario *sc, const char *name)
{
    long live0 = stk__alloc_live();
    int fds0 = tu_count_fds();
    long n;
    int failures_seen = 0, late = 0;
    for (n = 0; n < 5000; n++) {
        long c0 = stk__alloc_count();
        int visible = 0;
        g_n = n;
        stk__alloc_fail_after(n);
        int rc = session(sc, &visible);
        stk__alloc_fail_after(-1);
        int injected = stk__alloc_count() - c0 > n;
        if (rc != STK_OK && rc != STK_ENOMEM)
            fprintf(stderr, "    %s: n=%ld: %s\n", name, n, stk_strerror(rc));
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        if (rc == STK_ENOMEM)
            failures_seen++;
        if (rc == STK_OK && injected)
            late++;
        if (stk__alloc_live() != live0) {
            fprintf(stderr, "    %s: n=%ld leaked %ld allocations\n", name, n,
                    stk__alloc_live() - live0);
            CHECK(0);
            break;
        }
        if (tu_count_fds() != fds0) {
            fprintf(stderr, "    %s: n=%ld leaked %d fds\n", name, n, tu_count_fds() - fds0);
            CHECK(0);
            break;
        }
        if (!injected) {
            CHECK_EQ(rc, STK_OK);
            break;
        }
    }
    printf("    %s: %ld allocation points, %d failed cleanly with ENOMEM, %d absorbed\n", name, n,
           failures_seen, late);
    CHECK(n > 5 && n < 5000);
}

static const char *records_file(void)
{
    const char *p = tu_path("rec.bin");
    static uint8_t buf[N * REC];
    for (uint64_t i = 0; i < N; i++)
        for (int j = 0; j < REC; j++)
            buf[i * REC + (uint64_t)j] = (uint8_t)(i + (uint64_t)j);
    tu_write_file(p, buf, sizeof buf);
    return p;
}

/* 3 classes, nested folders; sample 4 is a dangling symlink and sample 9 is
 * over the 64-byte budget, so error paths allocate too. */
static const char *folder_tree(void)
{
    const char *root = tu_path("tree");
    char p[1024];
    for (int k = 0; k < 18; k++) {
        int cls = k / 6, pos = k % 6;
        snprintf(p, sizeof p, "%s/k%d%s", root, cls, pos >= 3 ? "/sub" : "");
        tu_mkdirs(p);
        snprintf(p, sizeof p, "%s/k%d%s/f%d.png", root, cls, pos >= 3 ? "/sub" : "", pos);
        if (k == 4) {
            REQUIRE(symlink("missing", p) == 0);
            continue;
        }
        char content[128];
        int n = snprintf(content, sizeof content, "file %d", k);
        if (k == 9) {
            memset(content + n, 'x', 80);
            n += 80;
        }
        tu_write_file(p, content, (size_t)n);
    }
    snprintf(p, sizeof p, "%s/k1/readme.txt", root);
    tu_write_file(p, "x", 1);
    return root;
}

static void test_oom_records(void)
{
    scenario sc = {records_file(), 1, STK_ON_ERROR_RAISE, 0, N};
    sweep(&sc, "records");
}

static void test_oom_folder_skip(void)
{
    scenario sc = {folder_tree(), 0, STK_ON_ERROR_SKIP, 2, 18};
    sweep(&sc, "folder, skip");
}

static void test_oom_folder_raise(void)
{
    scenario sc = {tu_path("tree"), 0, STK_ON_ERROR_RAISE, 2, 18};
    sweep(&sc, "folder, raise");
}

/* The first allocation of each entry point failing. */
static void test_oom_entry_points(void)
{
    long live0 = stk__alloc_live();
    stk_options *o = (stk_options *)1;
    stk__alloc_fail_after(0);
    CHECK_EQ(stk_options_create(&o), STK_ENOMEM);
    stk__alloc_fail_after(-1);
    CHECK(o == NULL);
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, tu_path("tree")) == STK_OK);
    stk__alloc_fail_after(0);
    CHECK_EQ(stk_options_set_source(o, "/elsewhere"), STK_ENOMEM);
    stk__alloc_fail_after(-1);
    /* The failed setter kept the previous value. */
    stk_loader *l = (stk_loader *)1;
    stk__alloc_fail_after(0);
    CHECK_EQ(stk_loader_open(&l, o), STK_ENOMEM);
    stk__alloc_fail_after(-1);
    CHECK(l == NULL);
    stk_loader_close(l);
    CHECK_EQ(stk_loader_open(&l, o), STK_OK);
    stk_info info = {.struct_size = sizeof info};
    CHECK_EQ(stk_loader_info(l, &info), STK_OK);
    CHECK_EQ(info.num_samples, 18);
    stk_loader_close(l);
    stk_options_destroy(o);
    CHECK_EQ(stk__alloc_live(), live0);
}

/* ---- stk_pack ------------------------------------------------------------ */

/* Hash of the names and bytes of the files in dir; *manifest: whether the
 * manifest is there. -1 files: no directory. */
static uint64_t dir_hash(const char *dir, int *files, int *manifest)
{
    char names[32][256];
    int n = 0;
    *manifest = 0;
    *files = -1;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        REQUIRE(n < 32);
        *manifest |= !strcmp(e->d_name, "stoker.manifest");
        snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    uint64_t h = tu_hash_files(dir, names, n);
    *files = n;
    return h;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[16384 + 200];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            REQUIRE(unlink(p) == 0);
        }
    }
    closedir(d);
    REQUIRE(rmdir(dir) == 0);
}

static void test_oom_pack(void)
{
    char src[1024], out[1024], err[1024];
    snprintf(src, sizeof src, "%s", tu_path("pack-src"));
    snprintf(out, sizeof out, "%s", tu_path("pack-out"));
    for (int k = 0; k < 6; k++) {
        char dir[1100], p[1200];
        snprintf(dir, sizeof dir, "%s/c%d", src, k % 2);
        tu_mkdirs(dir);
        snprintf(p, sizeof p, "%s/i%d.jpg", dir, k);
        uint32_t w = 30 + (uint32_t)k * 7, h = 22 + (uint32_t)k * 5;
        uint8_t *px = malloc((size_t)w * h * 3);
        REQUIRE(px);
        for (size_t j = 0; j < (size_t)w * h * 3; j++)
            px[j] = (uint8_t)(j * 7 + (size_t)k * 13);
        size_t n;
        uint8_t *jpg = tu_jpeg(px, w, h, 90, &n);
        tu_write_file(p, jpg, n);
        free(jpg);
        free(px);
    }
    stk_pack_options o = {.struct_size = sizeof o, .max_side = 20, .shard_size = 900, .threads = 2};
    REQUIRE(stk_pack(src, out, &o, NULL, err, sizeof err) == STK_OK);
    int files, manifest;
    uint64_t ref = dir_hash(out, &files, &manifest);
    REQUIRE(manifest && files > 2);
    remove_dir(out);
    long live0 = stk__alloc_live();
    int fds0 = tu_count_fds(), threads0 = tu_count_threads(), failures = 0;
    long n;
    for (n = 0; n < 5000; n++) {
        long c0 = stk__alloc_count();
        stk__alloc_fail_after(n);
        int rc = stk_pack(src, out, &o, NULL, err, sizeof err);
        stk__alloc_fail_after(-1);
        int injected = stk__alloc_count() - c0 > n;
        uint64_t h = dir_hash(out, &files, &manifest);
        if (rc != STK_OK && rc != STK_ENOMEM)
            fprintf(stderr, "    pack: n=%ld: %s: %s\n", n, stk_strerror(rc), err);
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        if (rc == STK_OK) {
            CHECK(manifest && h == ref);
        } else {
            failures++;
            if (!err[0])
                fprintf(stderr, "    pack: n=%ld: STK_ENOMEM without a message\n", n);
            CHECK(err[0] != 0);
            CHECK(!manifest);
            CHECK(files <= 0); /* everything taken back, the directory too */
        }
        if (files >= 0)
            remove_dir(out);
        if (stk__alloc_live() != live0) {
            fprintf(stderr, "    pack: n=%ld leaked %ld allocations\n", n,
                    stk__alloc_live() - live0);
            CHECK(0);
            break;
        }
        CHECK_EQ(tu_count_fds(), fds0);
        CHECK_EQ(tu_count_threads(), threads0);
        if (!injected) {
            CHECK_EQ(rc, STK_OK);
            break;
        }
    }
    fprintf(stderr, "    pack: %ld allocations swept, %d packs failed with STK_ENOMEM\n", n,
            failures);
    CHECK(failures > 20);
}

int main(void)
{
    tu_begin("test_oom", 120);
    RUN(test_oom_records);
    RUN(test_oom_folder_skip);
    RUN(test_oom_folder_raise);
    RUN(test_oom_entry_points);
    RUN(test_oom_pack);
    return tu_end();
}
