/* test_mt_loader.c -- the threaded engine through the public API: every
 * sample exactly once per epoch for any thread count, depth, batch size and
 * rank; bit-identical batches for any thread count and depth; resume from a
 * saved state into a new loader; set_epoch mid-epoch; stage statistics; and
 * peak RSS under the reported memory bound. Also run under ThreadSanitizer. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "order.h"
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#else
#define UNDER_SANITIZER 0
#endif

/* ---- helpers -------------------------------------------------------------- */

/* tu_open_cfg, saying why when an open these tests expect to work fails. */
static int open_cfg(stk_loader **l, const tu_cfg *c)
{
    int rc = tu_open_cfg(l, c);
    if (rc)
        fprintf(stderr, "open %s: %s\n", c->path, stk_loader_errmsg(*l));
    return rc;
}

/* Record i: a 1-byte label i % 10, then 8 bytes of i and a pattern. */
#define REC 40
static void make_records(const char *path, uint64_t n)
{
    uint8_t *buf = malloc(n * REC);
    REQUIRE(buf);
    for (uint64_t i = 0; i < n; i++) {
        uint8_t *r = buf + i * REC;
        r[0] = (uint8_t)(i % 10);
        memcpy(r + 1, &i, 8);
        for (int j = 9; j < REC; j++)
            r[j] = (uint8_t)(i * 7 + (uint64_t)j);
    }
    tu_write_file(path, buf, n * REC);
    free(buf);
}

static int record_ok(const stk_batch *b, size_t k)
{
    const uint8_t *p = (const uint8_t *)b->data + k * b->sample_bytes;
    uint64_t i;
    memcpy(&i, p, 8);
    if (i != b->indices[k] || b->labels[k] != (int64_t)(i % 10))
        return 0;
    for (int j = 9; j < REC; j++)
        if (p[j - 1] != (uint8_t)(i * 7 + (uint64_t)j))
            return 0;
    return 1;
}

/* Everything the consumer can see of a batch, hashed. */
static uint64_t batch_hash(const stk_batch *b)
{
    uint64_t h = tu_hash(0, &b->epoch, sizeof b->epoch);
    h = tu_hash(h, &b->index, sizeof b->index);
    h = tu_hash(h, &b->size, sizeof b->size);
    h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
    h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
    if (b->kind == STK_BATCH_DENSE)
        return tu_hash(h, b->data, b->size * b->sample_bytes);
    for (size_t k = 0; k < b->size; k++) {
        h = tu_hash(h, &b->lengths[k], sizeof b->lengths[k]);
        h = tu_hash(h, (const uint8_t *)b->data + b->offsets[k], b->lengths[k]);
        h = tu_hash(h, &b->dims[3 * k], 3 * sizeof *b->dims);
    }
    return h;
}

/* Hashes of every batch of `epochs` epochs, from the loader's position. */
static size_t run_hashes(stk_loader *l, int epochs, uint64_t *out, size_t cap)
{
    size_t n = 0;
    for (int e = 0; e < epochs; e++)
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            REQUIRE(rc == STK_OK);
            REQUIRE(n < cap);
            out[n++] = batch_hash(b);
            stk_batch_release(b);
        }
    return n;
}

static const char *records_file(uint64_t n)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/rec%llu.bin", tu_tmpdir(), (unsigned long long)n);
    struct stat st;
    if (stat(p, &st) != 0)
        make_records(p, n);
    return p;
}

/* ---- exactly once --------------------------------------------------------- */

/* Every thread count, depth and batch size (dividing N or not): each epoch
 * delivers every sample once, in the seeded order, in numbered batches. */
static void test_exactly_once_matrix(void)
{
    static const unsigned threads[] = {1, 2, 4, 8};
    static const unsigned depths[] = {1, 2, 3, 5};
    static const size_t bss[] = {1, 7, 16};
    enum { N = 100 };
    const char *path = records_file(N);
    int bad_configs = 0;
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t di = 0; di < 4; di++)
            for (size_t bi = 0; bi < 3; bi++) {
                size_t bs = bss[bi];
                tu_cfg c = {.path = path,
                            .record = REC,
                            .label = 1,
                            .bs = bs,
                            .threads = threads[ti],
                            .depth = depths[di],
                            .seed = 77,
                            .shuffle = 1};
                stk_loader *l;
                REQUIRE(open_cfg(&l, &c) == STK_OK);
                stk_info info = {.struct_size = sizeof info};
                REQUIRE(stk_loader_info(l, &info) == STK_OK);
                CHECK_EQ(info.threads, threads[ti]);
                CHECK_EQ(info.depth, depths[di]);
                CHECK_EQ(info.batches_per_epoch, (N + bs - 1) / bs);
                int ok = 1;
                for (uint64_t e = 0; e < 3; e++) {
                    stk__order ord;
                    stk__order_init(&ord, N, 77, e, true);
                    uint8_t seen[N] = {0};
                    uint64_t pos = 0, batch = 0;
                    for (;;) {
                        stk_batch *b;
                        int rc = stk_loader_next(l, &b);
                        if (rc == STK_END)
                            break;
                        REQUIRE(rc == STK_OK);
                        ok &= b->epoch == e && b->index == batch;
                        ok &= b->size == (batch + 1 < info.batches_per_epoch ? bs : N - batch * bs);
                        for (size_t k = 0; k < b->size; k++) {
                            uint64_t i = b->indices[k];
                            ok &= i < N && !seen[i];
                            if (i < N)
                                seen[i] = 1;
                            ok &= i == stk__order_at(&ord, pos++);
                            ok &= record_ok(b, k);
                        }
                        batch++;
                        stk_batch_release(b);
                    }
                    ok &= pos == N && batch == info.batches_per_epoch;
                }
                if (!ok) {
                    bad_configs++;
                    fprintf(stderr, "    wrong epoch: threads %u depth %u batch %zu\n", threads[ti],
                            depths[di], bs);
                }
                stk_loader_close(l);
            }
    CHECK_EQ(bad_configs, 0);
}

/* Ranks: each delivers its DistributedSampler share, all ranks have the same
 * number of batches, and together they cover the epoch (exactly once when the
 * world divides N; the wrapped padding otherwise; at most once with
 * drop_last). */
static void test_ranks_partition(void)
{
    static const uint64_t ns[] = {103, 104};
    for (size_t ni = 0; ni < 2; ni++) {
        uint64_t N = ns[ni];
        const char *path = records_file(N);
        for (unsigned world = 1; world <= 4; world++)
            for (int dl = 0; dl <= 1; dl++) {
                unsigned cover[104] = {0};
                uint64_t batches0 = 0;
                for (unsigned rank = 0; rank < world; rank++) {
                    tu_cfg c = {.path = path,
                                .record = REC,
                                .label = 1,
                                .bs = 5,
                                .threads = 1 + rank % 3,
                                .depth = 2,
                                .seed = 5,
                                .shuffle = 1,
                                .drop_last = dl,
                                .rank = rank,
                                .world = world};
                    stk_loader *l;
                    REQUIRE(open_cfg(&l, &c) == STK_OK);
                    stk_info info = {.struct_size = sizeof info};
                    stk_loader_info(l, &info);
                    uint64_t per = dl ? N / world / 5 * 5 : (N + world - 1) / world;
                    CHECK_EQ(info.samples_per_epoch, per);
                    if (rank == 0)
                        batches0 = info.batches_per_epoch;
                    CHECK_EQ(info.batches_per_epoch, batches0);
                    stk__order ord;
                    stk__order_init(&ord, N, 5, 0, true);
                    uint64_t k = 0, nb = 0;
                    int ok = 1;
                    for (;;) {
                        stk_batch *b;
                        int rc = stk_loader_next(l, &b);
                        if (rc == STK_END)
                            break;
                        REQUIRE(rc == STK_OK);
                        for (size_t s = 0; s < b->size; s++, k++) {
                            uint64_t pos = (k * world + rank) % N;
                            ok &= b->indices[s] == stk__order_at(&ord, pos);
                            ok &= record_ok(b, s);
                            cover[b->indices[s]]++;
                        }
                        nb++;
                        stk_batch_release(b);
                    }
                    CHECK(ok);
                    CHECK_EQ(k, per);
                    CHECK_EQ(nb, batches0);
                    stk_loader_close(l);
                }
                uint64_t total = 0;
                for (uint64_t i = 0; i < N; i++) {
                    total += cover[i];
                    if (dl)
                        CHECK(cover[i] <= 1);
                    else if (N % world == 0)
                        CHECK_EQ(cover[i], 1);
                    else
                        CHECK(cover[i] == 1 || cover[i] == 2);
                }
                if (!dl)
                    CHECK_EQ(total, (N + world - 1) / world * world);
            }
    }
}

/* ---- determinism ----------------------------------------------------------- */

static const char *folder_tree(void)
{
    static char root[900];
    snprintf(root, sizeof root, "%s/tree", tu_tmpdir());
    struct stat st;
    if (stat(root, &st) == 0)
        return root;
    for (int k = 0; k < 90; k++) {
        char p[1200], d[1100];
        snprintf(d, sizeof d, "%s/class%d%s", root, k % 4, k % 3 ? "" : "/nested");
        tu_mkdirs(d);
        snprintf(p, sizeof p, "%s/img%03d.jpg", d, k);
        uint8_t buf[700];
        size_t n = 1 + (size_t)(k * 37) % sizeof buf;
        for (size_t j = 0; j < n; j++)
            buf[j] = (uint8_t)(k ^ (int)j);
        tu_write_file(p, buf, n);
    }
    return root;
}

/* Same seed: bit-identical batches (data, lengths, labels, indices) with 1 or
 * 8 threads and any depth, over epochs, for dense and variable batches. */
static void test_determinism_threads_depths(void)
{
    enum { CAP = 256 };
    static uint64_t ref[CAP], got[CAP];
    const char *paths[2] = {records_file(100), folder_tree()};
    static const unsigned tds[][2] = {{1, 1}, {8, 5}, {3, 2}, {2, 7}, {8, 1}};
    for (int src = 0; src < 2; src++)
        for (uint64_t seed = 0; seed < 2; seed++) {
            size_t nref = 0;
            for (size_t t = 0; t < sizeof tds / sizeof tds[0]; t++) {
                tu_cfg c = {.path = paths[src],
                            .record = src ? 0 : REC,
                            .label = 1,
                            .bs = 6,
                            .threads = tds[t][0],
                            .depth = tds[t][1],
                            .seed = seed * 1000 + 1,
                            .shuffle = 1};
                stk_loader *l;
                REQUIRE(open_cfg(&l, &c) == STK_OK);
                size_t n = run_hashes(l, 3, t ? got : ref, CAP);
                stk_loader_close(l);
                if (!t) {
                    nref = n;
                    CHECK(n == 3 * 17 || n == 3 * 15);
                    continue;
                }
                CHECK_EQ(n, nref);
                int same = n == nref && !memcmp(ref, got, n * sizeof *ref);
                if (!same)
                    fprintf(stderr, "    src %d seed %llu: threads %u depth %u differ\n", src,
                            (unsigned long long)seed, tds[t][0], tds[t][1]);
                CHECK(same);
            }
            /* Another seed gives other batches. */
            tu_cfg c = {.path = paths[src],
                        .record = src ? 0 : REC,
                        .label = 1,
                        .bs = 6,
                        .threads = 2,
                        .depth = 2,
                        .seed = seed * 1000 + 2,
                        .shuffle = 1};
            stk_loader *l;
            REQUIRE(open_cfg(&l, &c) == STK_OK);
            size_t n = run_hashes(l, 3, got, CAP);
            stk_loader_close(l);
            CHECK(n == nref && memcmp(ref, got, n * sizeof *ref) != 0);
        }
}

/* ---- resume and seek -------------------------------------------------------- */

static void test_resume_into_new_loader(void)
{
    enum { N = 57, CAP = 64 };
    const char *path = records_file(N);
    static uint64_t ref[CAP], got[CAP];
    tu_cfg c = {.path = path,
                .record = REC,
                .label = 1,
                .bs = 4,
                .threads = 3,
                .depth = 2,
                .seed = 3,
                .shuffle = 1};
    stk_loader *l;
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    size_t nref = run_hashes(l, 3, ref, CAP); /* 3 epochs of 15 batches */
    stk_loader_close(l);
    REQUIRE(nref == 45);

    static const uint64_t stops[] = {0, 1, 7, 14, 15};
    for (size_t si = 0; si < 5; si++) {
        for (uint64_t ep = 0; ep < 2; ep++) {
            /* Run to batch `stop` of epoch `ep`, save the state, close. */
            tu_cfg a = c;
            a.threads = 2;
            a.depth = 3;
            REQUIRE(open_cfg(&l, &a) == STK_OK);
            size_t n = 0;
            if (ep)
                n = run_hashes(l, 1, got, CAP);
            for (uint64_t k = 0; k < stops[si]; k++) {
                stk_batch *b;
                REQUIRE(stk_loader_next(l, &b) == STK_OK);
                got[n++] = batch_hash(b);
                stk_batch_release(b);
            }
            stk_state st = {.struct_size = sizeof st};
            CHECK_EQ(stk_loader_get_state(l, &st), STK_OK);
            CHECK_EQ(st.seed, 3);
            CHECK_EQ(st.epoch, ep);
            CHECK_EQ(st.batch, stops[si]);
            stk_loader_close(l);
            /* A new loader, other threads and depth, restores it. */
            tu_cfg r = c;
            r.threads = 8;
            r.depth = 5;
            REQUIRE(open_cfg(&l, &r) == STK_OK);
            CHECK_EQ(stk_loader_set_state(l, &st), STK_OK);
            stk_state back = {.struct_size = sizeof back};
            stk_loader_get_state(l, &back);
            CHECK(back.epoch == st.epoch && back.batch == st.batch);
            /* The rest of this epoch, then one more. */
            n += run_hashes(l, 2, got + n, CAP - n);
            stk_loader_close(l);
            size_t want = (size_t)(ep + 2) * 15;
            CHECK_EQ(n, want);
            int same = n == want && !memcmp(ref, got, n * sizeof *ref);
            if (!same)
                fprintf(stderr, "    resume at epoch %llu batch %llu differs\n",
                        (unsigned long long)ep, (unsigned long long)stops[si]);
            CHECK(same);
        }
    }

    /* A state from another seed, or past the epoch, is refused. */
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    stk_state bad = {.struct_size = sizeof bad};
    REQUIRE(stk_loader_get_state(l, &bad) == STK_OK);
    bad.seed = 4;
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "seed") != NULL);
    bad.seed = 3;
    bad.batch = 16;
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "batch 16") != NULL);
    bad.batch = 0;
    bad.epoch = UINT64_MAX;
    CHECK_EQ(stk_loader_set_state(l, &bad), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "epoch") != NULL);
    /* And the loader still works from where it was. */
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK(batch_hash(b) == ref[0]);
    stk_batch_release(b);
    stk_loader_close(l);
}

/* A state carries the fingerprint of its configuration; restoring it into a
 * loader that differs in any field that changes the batches is refused with a
 * message naming the field, and leaves the loader where it was. */
static void test_resume_fingerprint(void)
{
    static char p20[1024], p21[1024]; /* records_file's buffer is reused */
    snprintf(p20, sizeof p20, "%s", records_file(20));
    snprintf(p21, sizeof p21, "%s", records_file(21));
    tu_cfg base = {.path = p20, .record = REC, .label = 1, .bs = 4, .seed = 1, .shuffle = 1};
    struct {
        const char *field;
        tu_cfg c;
    } cases[] = {
        {"seed", base},      {"num_samples", base}, {"shuffle", base},
        {"drop_last", base}, {"transform", base},   {"transform", base},
    };
    cases[0].c.seed = 2;
    cases[1].c.path = p21;
    cases[2].c.shuffle = 0;
    cases[3].c.drop_last = 1;
    cases[4].c.transform = "imagenet-val";
    cases[5].c.transform = "imagenet-val";
    cases[5].c.options[0] = "dtype";
    cases[5].c.options[1] = "float32";
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tu_cfg ref = base;
        if (k == 5)
            ref.transform = "imagenet-val";
        stk_loader *saver, *l;
        REQUIRE(open_cfg(&saver, &cases[k].c) == STK_OK);
        stk_state st = {.struct_size = sizeof st};
        REQUIRE(stk_loader_get_state(saver, &st) == STK_OK);
        stk_loader_close(saver);
        REQUIRE(open_cfg(&l, &ref) == STK_OK);
        CHECK_EQ(stk_loader_set_state(l, &st), STK_EINVAL);
        const char *msg = stk_loader_errmsg(l);
        if (!strstr(msg, cases[k].field)) {
            fprintf(stderr, "    case %zu (%s): %s\n", k, cases[k].field, msg);
            CHECK(0);
        }
        /* The same configuration restores fine. */
        stk_state own = {.struct_size = sizeof own};
        REQUIRE(stk_loader_get_state(l, &own) == STK_OK);
        own.batch = 1;
        CHECK_EQ(stk_loader_set_state(l, &own), STK_OK);
        stk_loader_close(l);
    }
    /* The message gives both values. */
    stk_loader *l;
    REQUIRE(open_cfg(&l, &base) == STK_OK);
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
    st.seed = 8;
    CHECK_EQ(stk_loader_set_state(l, &st), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "seed 8 but this loader has 1") != NULL);
    /* World size, rank and batch size may differ: an elastic resume
     * (tests/c/test_elastic.c checks what it delivers). */
    st.seed = 1;
    st.world_size = 3;
    st.rank = 2;
    st.batch_size = 2;
    st.batch = 1;
    CHECK_EQ(stk_loader_set_state(l, &st), STK_OK);
    /* A struct_size that does not cover the fingerprint is refused. */
    st.struct_size = offsetof(stk_state, num_samples);
    CHECK_EQ(stk_loader_set_state(l, &st), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "struct_size") != NULL);
    stk_loader_close(l);
}

static void test_set_epoch_mid_epoch(void)
{
    enum { N = 57, CAP = 64 };
    const char *path = records_file(N);
    static uint64_t e4[CAP], e0[CAP], got[CAP];
    tu_cfg c = {.path = path,
                .record = REC,
                .label = 1,
                .bs = 4,
                .threads = 4,
                .depth = 3,
                .seed = 11,
                .shuffle = 1};
    stk_loader *l;
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    REQUIRE(run_hashes(l, 1, e0, CAP) == 15);
    CHECK_EQ(stk_loader_set_epoch(l, 4), STK_OK);
    REQUIRE(run_hashes(l, 1, e4, CAP) == 15);
    stk_loader_close(l);

    REQUIRE(open_cfg(&l, &c) == STK_OK);
    stk_batch *held;
    REQUIRE(stk_loader_next(l, &held) == STK_OK);
    uint64_t held_hash = batch_hash(held);
    for (int k = 0; k < 2; k++) {
        stk_batch *b;
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        stk_batch_release(b);
    }
    /* Mid-epoch, with a batch held: jump to epoch 4. */
    CHECK_EQ(stk_loader_set_epoch(l, 4), STK_OK);
    stk_state st = {.struct_size = sizeof st};
    stk_loader_get_state(l, &st);
    CHECK(st.epoch == 4 && st.batch == 0);
    size_t n = run_hashes(l, 1, got, CAP);
    CHECK(n == 15 && !memcmp(got, e4, sizeof *got * 15));
    /* The held batch was not touched by the seek. */
    CHECK(batch_hash(held) == held_hash);
    CHECK(held_hash == e0[0]);
    stk_batch_release(held);
    /* After epoch 4 ends comes epoch 5. */
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK(b->epoch == 5 && b->index == 0);
    stk_batch_release(b);
    /* Back to epoch 0 mid-epoch: it restarts from its first batch. */
    CHECK_EQ(stk_loader_set_epoch(l, 0), STK_OK);
    n = run_hashes(l, 1, got, CAP);
    CHECK(n == 15 && !memcmp(got, e0, sizeof *got * 15));
    /* Restarting the current epoch right at its end. */
    CHECK_EQ(stk_loader_set_epoch(l, 1), STK_OK);
    n = run_hashes(l, 1, got, CAP);
    CHECK_EQ(n, 15);
    CHECK_EQ(stk_loader_set_epoch(l, 1), STK_OK);
    size_t n2 = run_hashes(l, 1, e4, CAP);
    CHECK(n2 == 15 && !memcmp(got, e4, sizeof *got * 15));
    stk_loader_close(l);
}

/* No shuffle: the natural order, every epoch. */
static void test_no_shuffle_natural(void)
{
    enum { N = 50 };
    tu_cfg c = {.path = records_file(N),
                .record = REC,
                .label = 1,
                .bs = 8,
                .threads = 4,
                .depth = 3,
                .seed = 99,
                .shuffle = 0};
    stk_loader *l;
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    for (int e = 0; e < 2; e++) {
        uint64_t expect = 0;
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            REQUIRE(rc == STK_OK);
            for (size_t k = 0; k < b->size; k++)
                CHECK_EQ(b->indices[k], expect++);
            stk_batch_release(b);
        }
        CHECK_EQ(expect, N);
    }
    stk_loader_close(l);
}

/* Skipping under many threads is as deterministic as the clean run. */
static void test_skip_deterministic(void)
{
    const char *root = folder_tree();
    char p[1100];
    snprintf(p, sizeof p, "%s/class1/img001.jpg", root); /* k=1: class1, not nested */
    char moved[1200];
    snprintf(moved, sizeof moved, "%s.away", p);
    REQUIRE(rename(p, moved) == 0);
    REQUIRE(symlink("/nonexistent", p) == 0);
    enum { CAP = 64 };
    static uint64_t ref[CAP], got[CAP];
    for (int t = 0; t < 2; t++) {
        tu_cfg c = {.path = root,
                    .bs = 7,
                    .threads = t ? 8 : 1,
                    .depth = t ? 4 : 1,
                    .seed = 4,
                    .shuffle = 1,
                    .on_error = STK_ON_ERROR_SKIP};
        stk_loader *l;
        REQUIRE(open_cfg(&l, &c) == STK_OK);
        /* The error list holds the current epoch's failures. */
        size_t n = 0;
        for (uint64_t e = 0; e < 2; e++) {
            n += run_hashes(l, 1, (t ? got : ref) + n, CAP - n);
            CHECK_EQ(stk_loader_error_count(l), 1);
            stk_sample_error e0;
            REQUIRE(stk_loader_error_get(l, 0, &e0) == STK_OK);
            CHECK(!strcmp(e0.path, p));
            CHECK_EQ(e0.epoch, e);
        }
        CHECK_EQ(n, 26);
        if (t)
            CHECK(!memcmp(ref, got, n * sizeof *ref));
        stk_stats st = {.struct_size = sizeof st};
        stk_loader_stats(l, &st);
        CHECK_EQ(st.samples_skipped, 2);
        CHECK_EQ(st.samples_delivered, 178);
        stk_loader_close(l);
    }
    unlink(p);
    REQUIRE(rename(moved, p) == 0);
}

/* The error list keeps each epoch's failures in sample order, the first 1024
 * of every epoch (not of the loader's life, not in the order threads finished
 * them), and restarts with each epoch. */
static void test_errors_per_epoch_in_order(void)
{
    enum { N = 1500, BS = 50 };
    char root[1100], dir[1200], f[1300];
    snprintf(root, sizeof root, "%s/many-bad", tu_tmpdir());
    snprintf(dir, sizeof dir, "%s/c0", root);
    tu_mkdirs(dir);
    for (int i = 0; i < N; i++) {
        snprintf(f, sizeof f, "%s/f%05d.jpg", dir, i);
        if (i % 5 == 0)
            tu_write_file(f, "ok", 2);
        else
            REQUIRE(symlink("/nonexistent", f) == 0); /* fails to read */
    }
    tu_cfg c = {.path = root, .bs = BS, .threads = 4, .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l;
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        stk_batch *b;
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        stk_batch_release(b);
        /* The first batch of the epoch: its 40 failures only. */
        CHECK_EQ(stk_loader_error_count(l), BS * 4 / 5);
        int rc;
        while ((rc = stk_loader_next(l, &b)) == STK_OK)
            stk_batch_release(b);
        CHECK_EQ(rc, STK_END);
        /* 1200 failed; the first 1024 in sample order (no shuffle: index
         * order) are listed: index k of the list is the k-th failing index. */
        CHECK_EQ(stk_loader_error_count(l), 1024);
        int in_order = 1;
        uint64_t want = 0;
        for (size_t k = 0; k < stk_loader_error_count(l); k++) {
            if (++want % 5 == 0)
                want++;
            stk_sample_error e;
            REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
            if (in_order && !(e.sample == want && e.epoch == epoch && e.code == STK_EIO))
                fprintf(stderr, "    error %zu: sample %llu epoch %llu code %d, expected %llu\n", k,
                        (unsigned long long)e.sample, (unsigned long long)e.epoch, e.code,
                        (unsigned long long)want);
            in_order &= e.sample == want && e.epoch == epoch && e.code == STK_EIO;
        }
        CHECK(in_order);
    }
    stk_stats st = {.struct_size = sizeof st};
    stk_loader_stats(l, &st);
    CHECK_EQ(st.samples_skipped, 2 * 1200);
    /* Restarting an epoch restarts its list. */
    CHECK_EQ(stk_loader_set_epoch(l, 0), STK_OK);
    CHECK_EQ(stk_loader_error_count(l), 0);
    stk_loader_close(l);
}

/* ---- statistics ------------------------------------------------------------ */

static void test_stats(void)
{
    enum { N = 64 };
    tu_cfg c = {.path = records_file(N),
                .record = REC,
                .label = 1,
                .bs = 8,
                .threads = 3,
                .depth = 1, /* 2 ring buffers */
                .seed = 1,
                .shuffle = 1};
    stk_loader *l;
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    stk_info info = {.struct_size = sizeof info};
    stk_loader_info(l, &info);
    stk_batch *b0, *b1;
    REQUIRE(stk_loader_next(l, &b0) == STK_OK);
    REQUIRE(stk_loader_next(l, &b1) == STK_OK);
    usleep(20000);
    /* Both buffers are held, so the workers are idle and every counter is
     * settled: exactly the 16 held samples were read. */
    stk_stats st = {.struct_size = sizeof st};
    CHECK_EQ(stk_loader_stats(l, &st), STK_OK);
    CHECK_EQ(st.struct_size, sizeof st);
    stk_stage_stats rd = {.struct_size = sizeof rd}, pr = {.struct_size = sizeof pr};
    CHECK_EQ(stk_loader_stage_stats(l, STK_STAGE_READ, &rd), STK_OK);
    CHECK_EQ(stk_loader_stage_stats(l, STK_STAGE_PROCESS, &pr), STK_OK);
    CHECK_EQ(rd.items, 16);
    CHECK_EQ(pr.items, 0); /* no transform */
    CHECK(rd.busy_ns > 0);
    CHECK_EQ(st.samples_delivered, 16);
    CHECK_EQ(st.batches_delivered, 2);
    CHECK(st.consumer_wait_ns > 0);
    CHECK_EQ(st.samples_skipped + st.samples_failed, 0);
    CHECK_EQ(st.memory_bound_bytes, stk_loader_memory_bound(l));
    CHECK(st.memory_bound_bytes >= 2 * 8 * (REC - 1));
    /* Stages are queried by number up to stk_stage_count(); the per-thread
     * counters add up to the totals. */
    CHECK_EQ(stk_stage_count(), 2);
    for (int s = 0; s < stk_stage_count(); s++) {
        stk_stage_stats tot = {.struct_size = sizeof tot}, sum = {.struct_size = sizeof sum};
        CHECK_EQ(stk_loader_stage_stats(l, s, &tot), STK_OK);
        for (unsigned t = 0; t < info.threads; t++) {
            stk_stage_stats ts = {.struct_size = sizeof ts};
            CHECK_EQ(stk_loader_thread_stats(l, t, s, &ts), STK_OK);
            sum.items += ts.items;
            sum.busy_ns += ts.busy_ns;
        }
        CHECK_EQ(sum.items, tot.items);
        CHECK_EQ(sum.busy_ns, tot.busy_ns);
    }
    stk_stage_stats ts = {.struct_size = sizeof ts};
    CHECK_EQ(stk_loader_thread_stats(l, info.threads, 0, &ts), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "thread 3") != NULL);
    CHECK_EQ(stk_loader_stage_stats(l, stk_stage_count(), &ts), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "stage 2") != NULL);
    CHECK_EQ(stk_loader_stage_stats(l, -1, &ts), STK_EINVAL);
    CHECK_EQ(stk_loader_thread_stats(l, 0, stk_stage_count(), &ts), STK_EINVAL);
    CHECK(!strcmp(stk_stage_name(stk_stage_count()), "?"));
    stk_batch_release(b0);
    stk_batch_release(b1);
    /* The rest of the epoch: counters grow, the wait stays under wall time. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t wait0 = st.consumer_wait_ns;
    for (;;) {
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (rc == STK_END)
            break;
        REQUIRE(rc == STK_OK);
        stk_batch_release(b);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t wall =
        (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ULL + (uint64_t)(t1.tv_nsec - t0.tv_nsec);
    stk_stats st2 = {.struct_size = sizeof st2};
    stk_loader_stats(l, &st2);
    CHECK_EQ(st2.samples_delivered, N);
    CHECK_EQ(st2.batches_delivered, N / 8);
    CHECK_EQ(stk_loader_stage_stats(l, STK_STAGE_READ, &rd), STK_OK);
    CHECK(rd.items >= N);
    CHECK(rd.items <= N + 2 * 8); /* at most the ring ahead */
    CHECK(st2.consumer_wait_ns >= wait0 && st2.consumer_wait_ns - wait0 <= wall);
    stk_loader_close(l);
}

/* depth counts the batches prepared ahead of the one the consumer holds:
 * while it holds one batch, exactly depth more are read (and no more), the
 * ring has depth + 1 buffers, and holding all of them gives STK_EBUSY. */
static void test_depth_meaning(void)
{
    static const unsigned depths[] = {1, 2, 5};
    for (size_t di = 0; di < 3; di++) {
        unsigned depth = depths[di];
        tu_cfg c = {.path = records_file(64),
                    .record = REC,
                    .label = 1,
                    .bs = 4,
                    .threads = 2,
                    .depth = depth};
        stk_loader *l;
        REQUIRE(open_cfg(&l, &c) == STK_OK);
        stk_info info = {.struct_size = sizeof info};
        REQUIRE(stk_loader_info(l, &info) == STK_OK);
        CHECK_EQ(info.depth, depth);
        CHECK_EQ(info.ring_buffers, depth + 1);
        stk_batch *held[6];
        REQUIRE(stk_loader_next(l, &held[0]) == STK_OK);
        /* Wait until the workers have nothing left to do. */
        stk_stage_stats rd = {.struct_size = sizeof rd};
        uint64_t last = UINT64_MAX;
        for (int k = 0; k < 200; k++) {
            usleep(10000);
            REQUIRE(stk_loader_stage_stats(l, STK_STAGE_READ, &rd) == STK_OK);
            if (rd.items == last && rd.items >= (depth + 1) * 4)
                break;
            last = rd.items;
        }
        CHECK_EQ(rd.items, (depth + 1) * 4);
        for (unsigned k = 1; k <= depth; k++) {
            REQUIRE(stk_loader_next(l, &held[k]) == STK_OK);
            CHECK_EQ(held[k]->index, k);
        }
        stk_batch *b;
        CHECK_EQ(stk_loader_next(l, &b), STK_EBUSY);
        for (unsigned k = 0; k <= depth; k++)
            stk_batch_release(held[k]);
        stk_loader_close(l);
    }
}

/* The result structs are size-prefixed: a caller built against an older
 * header (smaller struct) gets the fields it knows, one built against a newer
 * header (larger struct) gets the tail zeroed and learns from struct_size how
 * much was filled, and a caller that forgot struct_size gets STK_EINVAL rather
 * than a write past its struct. */
static void test_stats_struct_size(void)
{
    tu_cfg c = {.path = records_file(16), .record = REC, .label = 1, .bs = 4, .threads = 2};
    stk_loader *l;
    REQUIRE(open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    stk_batch_release(b);

    struct {
        stk_stats s;
        uint64_t future[3];
    } big;
    memset(&big, 0xab, sizeof big);
    big.s.struct_size = sizeof big;
    CHECK_EQ(stk_loader_stats(l, &big.s), STK_OK);
    CHECK_EQ(big.s.struct_size, sizeof(stk_stats));
    CHECK_EQ(big.s.batches_delivered, 1);
    for (int k = 0; k < 3; k++)
        CHECK_EQ(big.future[k], 0);

    struct {
        stk_info i;
        uint64_t future;
    } bigi;
    memset(&bigi, 0xab, sizeof bigi);
    bigi.i.struct_size = sizeof bigi;
    CHECK_EQ(stk_loader_info(l, &bigi.i), STK_OK);
    CHECK_EQ(bigi.i.struct_size, sizeof(stk_info));
    CHECK_EQ(bigi.i.num_samples, 16);
    CHECK_EQ(bigi.future, 0);

    struct {
        stk_stage_stats s;
        uint64_t future;
    } bigs;
    memset(&bigs, 0xab, sizeof bigs);
    bigs.s.struct_size = sizeof bigs;
    CHECK_EQ(stk_loader_thread_stats(l, 1, STK_STAGE_READ, &bigs.s), STK_OK);
    CHECK_EQ(bigs.s.struct_size, sizeof(stk_stage_stats));
    CHECK(bigs.s.items <= 16);
    CHECK_EQ(bigs.future, 0);

    /* Forgotten or too small: refused, nothing written past struct_size. */
    stk_stats zero;
    memset(&zero, 0xcd, sizeof zero);
    zero.struct_size = 0;
    CHECK_EQ(stk_loader_stats(l, &zero), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "stk_stats.struct_size is 0") != NULL);
    CHECK_EQ(zero.samples_delivered, 0xcdcdcdcdcdcdcdcdULL);
    stk_info small = {.struct_size = offsetof(stk_info, source_kind)};
    CHECK_EQ(stk_loader_info(l, &small), STK_EINVAL);
    /* A caller built before ring_buffers was appended gets what it knows. */
    size_t v1 = offsetof(stk_info, source_kind) + sizeof(const char *);
    stk_info old;
    memset(&old, 0xab, sizeof old);
    old.struct_size = v1;
    CHECK_EQ(stk_loader_info(l, &old), STK_OK);
    CHECK_EQ(old.struct_size, v1);
    CHECK(!strcmp(old.source_kind, "records"));
    CHECK_EQ(old.ring_buffers, 0xababababu); /* past its struct: untouched */
    stk_stage_stats ss = {.struct_size = sizeof(size_t)};
    CHECK_EQ(stk_loader_stage_stats(l, 0, &ss), STK_EINVAL);
    CHECK_EQ(stk_loader_stats(l, NULL), STK_EINVAL);
    stk_loader_close(l);
}

/* ---- memory bound ------------------------------------------------------------ */

#define FIXED_OVERHEAD (16u << 20)

static void test_memory_bound(void)
{
    if (UNDER_SANITIZER) {
        printf("    skipped: RSS is meaningless under a sanitizer\n");
        return;
    }
    /* depth 7: 8 ring buffers of 128 x 64 KiB = 64 MiB of ring; a 32 MiB
     * file. */
    enum { PAYLOAD = 64 << 10, N = 512, BS = 128, DEPTH = 7, BUFS = DEPTH + 1 };
    const char *path = tu_path("big.bin");
    {
        FILE *f = fopen(path, "wb");
        REQUIRE(f);
        static uint8_t rec[PAYLOAD];
        for (uint64_t i = 0; i < N; i++) {
            memset(rec, (int)(i & 0xff), sizeof rec);
            REQUIRE(fwrite(rec, 1, sizeof rec, f) == sizeof rec);
        }
        fclose(f);
    }
    /* Reset the peak (Linux: "5" to clear_refs) and take the baseline. */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    int reset = cr && fputs("5", cr) >= 0;
    if (cr)
        reset &= fclose(cr) == 0;
    long base = reset ? tu_rss_bytes() : tu_peak_rss_bytes();
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    stk_options_set_source(o, path);
    stk_options_set_records(o, PAYLOAD, 0, 0);
    stk_options_set_batch_size(o, BS);
    stk_options_set_depth(o, DEPTH);
    stk_options_set_threads(o, 2);
    stk_loader *l;
    REQUIRE(stk_loader_open(&l, o) == STK_OK);
    stk_options_destroy(o);
    uint64_t bound = stk_loader_memory_bound(l);
    const uint64_t ring = (uint64_t)BUFS * BS * PAYLOAD;
    CHECK(bound >= ring);
    /* Hold two epochs' batches at once (the whole ring, since workers reuse
     * the lowest free buffer and a quick consumer would leave the rest
     * untouched), then run a third epoch releasing as it goes. */
    uint64_t samples = 0;
    stk_batch *held[BUFS];
    int nh = 0;
    for (int e = 0; e < 3; e++) {
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            REQUIRE(rc == STK_OK && nh < BUFS);
            samples += b->size;
            if (e < 2)
                held[nh++] = b;
            else
                stk_batch_release(b);
        }
        if (e == 1) {
            CHECK_EQ(nh, BUFS);
            for (int k = 0; k < nh; k++)
                stk_batch_release(held[k]);
            nh = 0;
        }
    }
    CHECK_EQ(samples, 3 * N);
    long peak = tu_peak_rss_bytes();
    stk_loader_close(l);
    long growth = peak - base;
    printf("    ring %.1f MiB, memory bound %.2f MiB, peak RSS growth %.2f MiB: %.2f MiB over "
           "the ring, %.2f MiB over the bound%s\n",
           (double)ring / 1048576.0, (double)bound / 1048576.0, (double)growth / 1048576.0,
           ((double)growth - (double)ring) / 1048576.0,
           ((double)growth - (double)bound) / 1048576.0, reset ? "" : " (peak not reset)");
    CHECK(growth <= (long)(bound + FIXED_OVERHEAD));
    /* The ring is really used (else this test measures nothing). */
    CHECK(growth >= (long)(ring * 3 / 4));
    unlink(path);
}

/* ThreadSanitizer starts a background thread of its own with the first
 * thread the program creates; start one before the harness counts threads so
 * the count at the end compares like with like. */
static void *noop_thread(void *p)
{
    return p;
}
static void warm_up_threads(void)
{
    pthread_t th;
    if (pthread_create(&th, NULL, noop_thread, NULL) == 0)
        pthread_join(th, NULL);
    usleep(20000);
}

/* Loaders opened at the same time from several threads (train and val
 * loaders, say) must not share any scan state: each sees the same samples in
 * the same order as a loader opened alone. (Found by review: the folder
 * source's sort once used a process-global context and crashed.) */
typedef struct open_job {
    const char *root;
    int rounds;
    uint64_t want, got_bad;
} open_job;

static uint64_t folder_order_hash(const char *root)
{
    stk_options *o = NULL;
    stk_loader *l = NULL;
    uint64_t h = 0;
    stk_options_create(&o);
    stk_options_set_source(o, root);
    stk_options_set_shuffle(o, 0);
    stk_options_set_threads(o, 1);
    stk_options_set_batch_size(o, 1500);
    stk_options_set_max_sample_bytes(o, 64);
    if (stk_loader_open(&l, o) == STK_OK) {
        stk_batch *b;
        if (stk_loader_next(l, &b) == STK_OK) {
            h = tu_hash(0, b->labels, b->size * sizeof *b->labels);
            h = tu_hash(h, b->lengths, b->size * sizeof *b->lengths);
            stk_batch_release(b);
        }
    }
    stk_loader_close(l);
    stk_options_destroy(o);
    return h;
}

static void *open_many(void *arg)
{
    open_job *j = arg;
    for (int r = 0; r < j->rounds; r++)
        if (folder_order_hash(j->root) != j->want)
            j->got_bad++;
    return NULL;
}

static void test_concurrent_opens(void)
{
    char root[900];
    snprintf(root, sizeof root, "%s/many", tu_tmpdir());
    for (int k = 0; k < 1500; k++) {
        char d[1000], p[1100];
        snprintf(d, sizeof d, "%s/c%d/sub%d", root, k % 3, k % 7);
        if (k < 21)
            tu_mkdirs(d);
        snprintf(p, sizeof p, "%s/f%04d_%d.png", d, (k * 7919) % 1500, k);
        uint8_t buf[64];
        memset(buf, k & 0xff, sizeof buf);
        tu_write_file(p, buf, 1 + (size_t)k % sizeof buf);
    }
    uint64_t want = folder_order_hash(root);
    CHECK(want != 0);
    open_job jobs[3];
    pthread_t th[3];
    for (int k = 0; k < 3; k++) {
        jobs[k] = (open_job){root, 6, want, 0};
        pthread_create(&th[k], NULL, open_many, &jobs[k]);
    }
    for (int k = 0; k < 3; k++) {
        pthread_join(th[k], NULL);
        CHECK_EQ(jobs[k].got_bad, 0);
    }
}

int main(void)
{
    warm_up_threads();
    tu_begin("test_mt_loader", 120);
    RUN(test_exactly_once_matrix);
    RUN(test_ranks_partition);
    RUN(test_determinism_threads_depths);
    RUN(test_resume_into_new_loader);
    RUN(test_resume_fingerprint);
    RUN(test_set_epoch_mid_epoch);
    RUN(test_no_shuffle_natural);
    RUN(test_skip_deterministic);
    RUN(test_errors_per_epoch_in_order);
    RUN(test_stats);
    RUN(test_stats_struct_size);
    RUN(test_depth_meaning);
    RUN(test_memory_bound);
    RUN(test_concurrent_opens);
    return tu_end();
}
