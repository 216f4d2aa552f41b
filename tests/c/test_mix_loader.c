/* test_mix_loader.c -- mixing datasets in the loader (docs/mixing.md): three
 * local sources of different kinds (a folder, a .stk set, a tar shard) whose
 * samples' bytes name them ("F:7", "S:12", "T:3"), mixed by weight:
 * proportions within the bound in every batch, every pass of a source exactly
 * once, the same batches for 1, 2 and 8 threads, exact resume mid-epoch,
 * elastic resume onto other worlds and batch sizes giving the same multiset
 * of samples as an uninterrupted epoch, the refusal of a changed mixture (and
 * mix_resume "new"), the "source" field, a missing field naming its source,
 * and a failing source under raise and skip naming the source and sample.
 * Per source: transforms of each image field landing on exactly its samples
 * (pixel-exact flips), its own order (equal to the loader's where they
 * agree) and the refusal of what is the loader's, an allocation-failure
 * sweep over them; and a moved dataset resuming (the fingerprint has no
 * paths; the first version's fingerprint still resumes). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "source/stkformat.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NF 12 /* folder */
#define NS 40 /* .stk */
#define NT 9  /* tar */

static char g_folder[1024], g_stk[1024], g_tar[1024];

static void make_sets(void)
{
    snprintf(g_folder, sizeof g_folder, "%s", tu_path("mix-folder"));
    for (int i = 0; i < NF; i++) {
        char path[1200], text[16];
        snprintf(path, sizeof path, "%s/c%d/f%02d.jpg", g_folder, i % 3, i);
        tu_mkdirs(path);
        /* tu_mkdirs made the file's own name a directory: the parent only. */
        rmdir(path);
        int n = snprintf(text, sizeof text, "F:%d", i);
        tu_write_file(path, text, (size_t)n);
    }
    snprintf(g_stk, sizeof g_stk, "%s", tu_path("mix-stk"));
    tu_mkdirs(g_stk);
    char err[256], path[1200];
    snprintf(path, sizeof path, "%s/part-000000.stk", g_stk);
    stk__stk_header h = {.kind = STK_PAYLOAD_ENCODED};
    stk__stk_writer *w = NULL;
    REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
    for (int i = 0; i < NS; i++) {
        char text[16];
        int n = snprintf(text, sizeof text, "S:%d", i);
        REQUIRE(stk__stkw_add(w, (const uint8_t *)text, (size_t)n, i, NULL, 0, 0, err,
                              sizeof err) == STK_OK);
    }
    uint64_t size;
    REQUIRE(stk__stkw_finish(w, NS, &size, err, sizeof err) == STK_OK);
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int i = 0; i < NT; i++) {
        char name[32], text[16];
        snprintf(name, sizeof name, "k%03d.jpg", i);
        int n = snprintf(text, sizeof text, "T:%d", i);
        tu_tar_add(&t, &tn, name, text, (size_t)n);
    }
    uint8_t zeros[1024] = {0};
    t = realloc(t, tn + sizeof zeros);
    REQUIRE(t);
    memcpy(t + tn, zeros, sizeof zeros);
    tn += sizeof zeros;
    snprintf(g_tar, sizeof g_tar, "%s", tu_path("mix.tar"));
    tu_write_file(g_tar, t, tn);
    free(t);
}

typedef struct mcfg {
    double w[3];
    uint64_t n; /* samples_per_epoch (0: default) */
    size_t bs;
    unsigned threads, rank, world;
    int drop_last, on_error;
    const char *fields, *mix_resume, *batching;
} mcfg;

static int open_mix(stk_loader **l, const mcfg *c)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_folder, c->w[0], 0) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_stk, c->w[1], 0) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_tar, c->w[2], 0) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, c->bs ? c->bs : 20) == STK_OK);
    REQUIRE(stk_options_set_threads(o, c->threads ? c->threads : 2) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 77) == STK_OK);
    REQUIRE(stk_options_set_drop_last(o, c->drop_last) == STK_OK);
    REQUIRE(stk_options_set_partition(o, c->rank, c->world ? c->world : 1) == STK_OK);
    REQUIRE(stk_options_set_on_error(o, c->on_error) == STK_OK);
    if (c->n) {
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)c->n);
        REQUIRE(stk_options_set(o, "samples_per_epoch", v) == STK_OK);
    }
    if (c->fields)
        REQUIRE(stk_options_set_fields(o, c->fields) == STK_OK);
    if (c->mix_resume)
        REQUIRE(stk_options_set(o, "mix_resume", c->mix_resume) == STK_OK);
    if (c->batching)
        REQUIRE(stk_options_set(o, "mix_batching", c->batching) == STK_OK);
    int rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    return rc;
}

/* Sample k's (source letter, number) from its bytes. */
static void parse(const stk_batch *b, size_t k, char *letter, int *num)
{
    const char *p = (const char *)b->data + b->offsets[k];
    char text[16];
    size_t n = b->lengths[k] < 15 ? b->lengths[k] : 15;
    memcpy(text, p, n);
    text[n] = '\0';
    *letter = text[0];
    *num = atoi(text + 2);
}

static int letter_source(char c)
{
    return c == 'F' ? 0 : c == 'S' ? 1 : c == 'T' ? 2 : -1;
}

static void test_proportions_and_passes(void)
{
    mcfg c = {.w = {0.5, 0.3, 0.2}, .n = 200, .bs = 20};
    stk_loader *l = NULL;
    REQUIRE(open_mix(&l, &c) == STK_OK);
    CHECK_EQ(stk_loader_num_sources(l), 3);
    /* quotas of 200: 100, 60, 40; sizes 12, 40, 9 */
    const uint64_t quota[3] = {100, 60, 40}, size[3] = {NF, NS, NT};
    for (int epoch = 0; epoch < 2; epoch++) {
        int counts[3][64] = {{0}};
        uint64_t total[3] = {0};
        stk_batch *b;
        int rc, batches = 0;
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            uint64_t in[3] = {0};
            for (size_t k = 0; k < b->size; k++) {
                char letter;
                int num;
                parse(b, k, &letter, &num);
                int s = letter_source(letter);
                REQUIRE(s >= 0 && num >= 0 && num < 64);
                size_t src;
                uint64_t local;
                CHECK_EQ(stk_loader_sample_source(l, b->indices[k], &src, &local), STK_OK);
                CHECK_EQ(src, (size_t)s);
                counts[s][num]++;
                in[s]++;
                total[s]++;
            }
            /* shares of 20: 10, 6, 4, within the bound of 2 */
            for (int s = 0; s < 3; s++) {
                double share = 20.0 * (double)quota[s] / 200.0;
                CHECK((double)in[s] > share - 2 && (double)in[s] < share + 2);
            }
            batches++;
            stk_batch_release(b);
        }
        CHECK_EQ(rc, STK_END);
        CHECK_EQ(batches, 10);
        for (int s = 0; s < 3; s++) {
            CHECK_EQ(total[s], quota[s]);
            /* passes exactly once: every sample quota / size times, the
             * first quota % size of the last pass once more */
            uint64_t lo = quota[s] / size[s], more = 0;
            for (uint64_t i = 0; i < size[s]; i++) {
                CHECK(counts[s][i] == (int)lo || counts[s][i] == (int)lo + 1);
                more += (uint64_t)counts[s][i] - lo;
            }
            CHECK_EQ(more, quota[s] % size[s]);
        }
    }
    uint64_t got, failed;
    CHECK_EQ(stk_loader_source_stats(l, 1, &got, &failed), STK_OK);
    CHECK_EQ(got, 120);
    CHECK_EQ(failed, 0);
    CHECK_EQ(stk_loader_source_stats(l, 3, &got, &failed), STK_EINVAL);
    stk_loader_close(l);
}

/* The hash of `batches` batches (0: to the end of the epoch) from l. */
static uint64_t hash_batches(stk_loader *l, int batches)
{
    uint64_t h = 0;
    stk_batch *b;
    for (int n = 0; batches == 0 || n < batches; n++) {
        int rc = stk_loader_next(l, &b);
        if (rc == STK_END)
            break;
        REQUIRE(rc == STK_OK);
        h = tu_hash(h, &b->size, sizeof b->size);
        for (size_t k = 0; k < b->size; k++) {
            h = tu_hash(h, (const char *)b->data + b->offsets[k], b->lengths[k]);
            h = tu_hash(h, &b->indices[k], sizeof b->indices[k]);
        }
        stk_batch_release(b);
    }
    return h;
}

static void test_threads_identical(void)
{
    uint64_t ref = 0;
    unsigned threads[3] = {1, 2, 8};
    for (int t = 0; t < 3; t++) {
        mcfg c = {.w = {0.6, 0.25, 0.15}, .n = 150, .bs = 16, .threads = threads[t]};
        stk_loader *l = NULL;
        REQUIRE(open_mix(&l, &c) == STK_OK);
        uint64_t h = hash_batches(l, 0);
        h = tu_hash(h, "|", 1);
        h ^= hash_batches(l, 0) * 3; /* epoch 1 too */
        if (t == 0)
            ref = h;
        CHECK_EQ(h, ref);
        stk_loader_close(l);
    }
}

static void test_resume_exact(void)
{
    mcfg c = {.w = {0.5, 0.3, 0.2}, .n = 200, .bs = 20};
    stk_loader *a = NULL, *b = NULL;
    REQUIRE(open_mix(&a, &c) == STK_OK);
    (void)hash_batches(a, 0); /* epoch 0 */
    (void)hash_batches(a, 4);
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(a, &st) == STK_OK);
    CHECK(st.mixture != 0);
    uint64_t rest = hash_batches(a, 0);
    REQUIRE(open_mix(&b, &c) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &st), STK_OK);
    CHECK_EQ(hash_batches(b, 0), rest);
    stk_loader_close(b);
    /* Changed weights: refused, naming the mixture and the way out. */
    mcfg d = c;
    d.w[2] = 0.4;
    REQUIRE(open_mix(&b, &d) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &st), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(b), "mixture") != NULL);
    CHECK(strstr(stk_loader_errmsg(b), "mix_resume") != NULL);
    stk_loader_close(b);
    /* A changed epoch length too. */
    d = c;
    d.n = 220;
    REQUIRE(open_mix(&b, &d) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &st), STK_EINVAL);
    stk_loader_close(b);
    /* mix_resume "new": the position carries over to the new mixture. */
    d = c;
    d.w[2] = 0.4;
    d.mix_resume = "new";
    REQUIRE(open_mix(&b, &d) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &st), STK_OK);
    stk_batch *bb;
    REQUIRE(stk_loader_next(b, &bb) == STK_OK);
    CHECK_EQ(bb->epoch, 1);
    CHECK_EQ(bb->index, 4);
    stk_batch_release(bb);
    stk_loader_close(b);
    stk_loader_close(a);
}

/* (source, local) of every sample delivered, counted. */
static void count_batch(stk_loader *l, const stk_batch *b, int *counts)
{
    for (size_t k = 0; k < b->size; k++) {
        size_t s;
        uint64_t local;
        REQUIRE(stk_loader_sample_source(l, b->indices[k], &s, &local) == STK_OK);
        counts[s * 64 + local]++;
    }
}

/* World 2 x batch 4 for `steps` batches, then world 3 x batch 3 (and then
 * world 1 x batch 5) for the rest: the multiset of samples is the
 * uninterrupted epoch's. */
static void test_elastic(void)
{
    for (int drop = 0; drop < 2; drop++) {
        int ref[3 * 64] = {0}, got[3 * 64] = {0};
        mcfg c = {.w = {0.5, 0.3, 0.2}, .n = 240, .bs = 8, .drop_last = drop};
        stk_loader *l = NULL;
        REQUIRE(open_mix(&l, &c) == STK_OK);
        stk_batch *b;
        while (stk_loader_next(l, &b) == STK_OK) {
            count_batch(l, b, ref);
            stk_batch_release(b);
        }
        stk_loader_close(l);
        /* world 2, batch 4: 5 steps */
        stk_state st = {.struct_size = sizeof st};
        for (unsigned r = 0; r < 2; r++) {
            mcfg w2 = c;
            w2.bs = 4, w2.world = 2, w2.rank = r;
            REQUIRE(open_mix(&l, &w2) == STK_OK);
            for (int k = 0; k < 5; k++) {
                REQUIRE(stk_loader_next(l, &b) == STK_OK);
                count_batch(l, b, got);
                stk_batch_release(b);
            }
            if (r == 0)
                REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
            stk_loader_close(l);
        }
        /* world 3, batch 3: 4 steps; then world 1 (batch 4) to the end */
        stk_state st2 = {.struct_size = sizeof st2};
        for (unsigned r = 0; r < 3; r++) {
            mcfg w3 = c;
            w3.bs = 3, w3.world = 3, w3.rank = r;
            REQUIRE(open_mix(&l, &w3) == STK_OK);
            REQUIRE(stk_loader_set_state(l, &st) == STK_OK);
            for (int k = 0; k < 4; k++) {
                REQUIRE(stk_loader_next(l, &b) == STK_OK);
                CHECK_EQ(b->epoch, 0);
                count_batch(l, b, got);
                stk_batch_release(b);
            }
            if (r == 0)
                REQUIRE(stk_loader_get_state(l, &st2) == STK_OK);
            stk_loader_close(l);
        }
        mcfg w1 = c;
        w1.bs = 4; /* 164 left: whole batches, so drop_last drops nothing */
        REQUIRE(open_mix(&l, &w1) == STK_OK);
        REQUIRE(stk_loader_set_state(l, &st2) == STK_OK);
        int rc;
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            CHECK_EQ(b->epoch, 0);
            count_batch(l, b, got);
            stk_batch_release(b);
        }
        CHECK_EQ(rc, STK_END);
        stk_loader_close(l);
        int same = 1;
        for (int k = 0; k < 3 * 64; k++) {
            if (ref[k] != got[k] && same)
                fprintf(stderr, "drop_last %d: sample %d/%d: %d uninterrupted, %d elastic\n", drop,
                        k / 64, k % 64, ref[k], got[k]);
            same &= ref[k] == got[k];
        }
        CHECK(same);
    }
}

static void test_source_field_and_missing_field(void)
{
    mcfg c = {.w = {0.5, 0.3, 0.2}, .n = 60, .bs = 12, .fields = "x=image;jpg,src=source"};
    stk_loader *l = NULL;
    REQUIRE(open_mix(&l, &c) == STK_OK);
    stk_batch *b;
    int batches = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        REQUIRE(b->nfields == 2);
        const stk_field *f = &b->fields[1];
        CHECK_EQ(f->dtype, STK_DTYPE_INT64);
        for (size_t k = 0; k < b->size; k++) {
            size_t s;
            uint64_t local;
            REQUIRE(stk_loader_sample_source(l, b->indices[k], &s, &local) == STK_OK);
            CHECK_EQ(((const int64_t *)f->data)[k], (int64_t)s);
            const stk_field *x = &b->fields[0];
            const char *p = (const char *)x->data + x->offsets[k];
            CHECK_EQ(letter_source(p[0]), (int)s);
        }
        batches++;
        stk_batch_release(b);
    }
    CHECK_EQ(batches, 5);
    stk_loader_close(l);
    /* The tar's samples have no "image": the open fails naming it. */
    c.fields = "x=image";
    CHECK_EQ(open_mix(&l, &c), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "mixture source 2") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "mix.tar") != NULL);
    stk_loader_close(l);
    /* ...unless it is optional. */
    c.fields = "x?=image";
    CHECK_EQ(open_mix(&l, &c), STK_OK);
    stk_loader_close(l);
}

static void test_errors_name_source(void)
{
    char victim[1200];
    snprintf(victim, sizeof victim, "%s/c1/f04.jpg", g_folder);
    for (int policy = 0; policy < 2; policy++) {
        mcfg c = {.w = {0.5, 0.3, 0.2},
                  .n = 200,
                  .bs = 20,
                  .on_error = policy ? STK_ON_ERROR_SKIP : STK_ON_ERROR_RAISE};
        /* A dangling link: listed at open, failing at every read. */
        REQUIRE(rename(victim, tu_path("moved.jpg")) == 0);
        REQUIRE(symlink(tu_path("gone.jpg"), victim) == 0);
        stk_loader *l = NULL;
        REQUIRE(open_mix(&l, &c) == STK_OK);
        stk_batch *b;
        int rc, raised = 0;
        uint64_t delivered = 0;
        while ((rc = stk_loader_next(l, &b)) != STK_END) {
            if (rc == STK_ESAMPLE) {
                stk_error_info e = {.struct_size = sizeof e};
                REQUIRE(stk_loader_last_error(l, &e) == STK_OK);
                CHECK(strstr(e.path, "f04.jpg") != NULL);
                raised++;
                continue;
            }
            REQUIRE(rc == STK_OK);
            delivered += b->size;
            stk_batch_release(b);
        }
        uint64_t got, failed, got0;
        CHECK_EQ(stk_loader_source_stats(l, 0, &got, &failed), STK_OK);
        got0 = got;
        /* source 0's quota 100 over 12 samples: f04 is read 8 or 9 times */
        CHECK(failed == 8 || failed == 9);
        CHECK_EQ(got + failed, 100);
        CHECK_EQ(stk_loader_source_stats(l, 1, &got, &failed), STK_OK);
        CHECK_EQ(failed, 0);
        if (policy) {
            CHECK_EQ(raised, 0);
            CHECK_EQ(delivered, 200 - 100 + got0);
            stk_stats s = {.struct_size = sizeof s};
            REQUIRE(stk_loader_stats(l, &s) == STK_OK);
            CHECK(s.samples_skipped == 8 || s.samples_skipped == 9);
        } else {
            CHECK(raised >= 1);
        }
        REQUIRE(unlink(victim) == 0);
        REQUIRE(rename(tu_path("moved.jpg"), victim) == 0);
        stk_loader_close(l);
    }
}

/* mix_batching "per_source": each batch from one source, the sequence of
 * batches in proportion (10/6/4 of 20 batches, every window of batches
 * within 2), each source's passes exactly once; resume exact. */
static void test_per_source_batches(void)
{
    mcfg c = {.w = {0.5, 0.3, 0.2}, .n = 200, .bs = 10, .batching = "per_source"};
    stk_loader *l = NULL;
    REQUIRE(open_mix(&l, &c) == STK_OK);
    const uint64_t quota[3] = {100, 60, 40}, size[3] = {NF, NS, NT};
    int counts[3][64] = {{0}}, seq[20], nb = 0;
    uint64_t total[3] = {0};
    stk_batch *b;
    while (stk_loader_next(l, &b) == STK_OK) {
        REQUIRE(nb < 20);
        int first = -1, mixed = 0;
        for (size_t k = 0; k < b->size; k++) {
            char letter;
            int num;
            parse(b, k, &letter, &num);
            int s = letter_source(letter);
            REQUIRE(s >= 0 && num >= 0 && num < 64);
            if (first < 0)
                first = s;
            mixed |= s != first;
            counts[s][num]++;
            total[s]++;
        }
        CHECK(!mixed);
        seq[nb++] = first;
        stk_batch_release(b);
    }
    CHECK_EQ(nb, 20);
    for (int s = 0; s < 3; s++) {
        CHECK_EQ(total[s], quota[s]);
        uint64_t lo = quota[s] / size[s];
        for (uint64_t i = 0; i < size[s]; i++)
            CHECK(counts[s][i] == (int)lo || counts[s][i] == (int)lo + 1);
        /* every window of L batches: within 2 of L x its share */
        for (int L = 1; L <= 20; L++)
            for (int a = 0; a + L <= 20; a++) {
                int in = 0;
                for (int j = a; j < a + L; j++)
                    in += seq[j] == s;
                double share = (double)L * (double)quota[s] / 200.0;
                CHECK((double)in > share - 2 && (double)in < share + 2);
            }
    }
    stk_loader_close(l);
    /* Resume mid-epoch: the same batches. */
    stk_loader *a = NULL, *r = NULL;
    REQUIRE(open_mix(&a, &c) == STK_OK);
    (void)hash_batches(a, 7);
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(a, &st) == STK_OK);
    uint64_t rest = hash_batches(a, 0);
    REQUIRE(open_mix(&r, &c) == STK_OK);
    REQUIRE(stk_loader_set_state(r, &st) == STK_OK);
    CHECK_EQ(hash_batches(r, 0), rest);
    stk_loader_close(r);
    stk_loader_close(a);
    /* Per-source mixed state is another mixture. */
    mcfg d = c;
    d.batching = NULL;
    REQUIRE(open_mix(&r, &d) == STK_OK);
    CHECK_EQ(stk_loader_set_state(r, &st), STK_EINVAL);
    stk_loader_close(r);
    /* Not whole batches: refused, saying why. */
    d = c;
    d.n = 205;
    CHECK_EQ(open_mix(&r, &d), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(r), "multiples of the batch size") != NULL);
    stk_loader_close(r);
    d = c;
    d.world = 3;
    CHECK_EQ(open_mix(&r, &d), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(r), "world_size x batch_size") != NULL);
    stk_loader_close(r);
}

static void test_open_errors(void)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_add_source(o, g_folder, -1, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_source(o, "", 1, 0), STK_EINVAL);
    REQUIRE(stk_options_add_source(o, g_folder, 1, 0) == STK_OK);
    REQUIRE(stk_options_add_source(o, tu_path("nothing-here"), 1, 0) == STK_OK);
    stk_loader *l = NULL;
    CHECK(stk_loader_open(&l, o) != STK_OK);
    CHECK(strstr(stk_loader_errmsg(l), "mixture source 1") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "nothing-here") != NULL);
    stk_loader_close(l);
    /* A source and a mixture at once. */
    REQUIRE(stk_options_set_source(o, g_folder) == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "one or the other") != NULL);
    stk_loader_close(l);
    stk_options_destroy(o);
    /* samples_per_epoch without a mixture would change nothing: refused. */
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, g_folder) == STK_OK);
    REQUIRE(stk_options_set(o, "samples_per_epoch", "30") == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "applies to a mixture") != NULL);
    stk_loader_close(l);
    stk_options_destroy(o);
    /* Fixed samples past samples_per_epoch. */
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_folder, 0, 50) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_stk, 1, 0) == STK_OK);
    REQUIRE(stk_options_set(o, "samples_per_epoch", "30") == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "samples_per_epoch 30") != NULL);
    stk_loader_close(l);
    stk_options_destroy(o);
}

/* ---- per-source transforms of every image field ---------------------------
 * Two folders of JPEGs with a left-to-right ramp; fields "image" (the first
 * image) and "view2" (the same file, a second field), both resized by the
 * loader. Source 1 flips its "image", source 0 its "view2": against the run
 * without per-source transforms (same seed, same schedule), exactly those
 * samples' fields are mirrored pixel for pixel, every other field equal. */

static char g_img[2][1024], g_imgtar[1024];

static void make_image_sets(void)
{
    static const uint32_t w[2] = {24, 32}, h[2] = {16, 20};
    for (int s = 0; s < 2; s++) {
        snprintf(g_img[s], sizeof g_img[s], "%s", tu_path(s ? "mix-img1" : "mix-img0"));
        for (int i = 0; i < (s ? 6 : 8); i++) {
            uint8_t rgb[32 * 20 * 3];
            for (uint32_t y = 0; y < h[s]; y++)
                for (uint32_t x = 0; x < w[s]; x++) {
                    uint8_t *p = &rgb[(y * w[s] + x) * 3];
                    p[0] = (uint8_t)(x * 255 / w[s]);
                    p[1] = (uint8_t)(40 + 20 * i);
                    p[2] = (uint8_t)(s ? 200 : 30);
                }
            size_t n;
            uint8_t *jpg = tu_jpeg(rgb, w[s], h[s], 95, &n);
            char path[1200];
            snprintf(path, sizeof path, "%s/c0/i%02d.jpg", g_img[s], i);
            tu_mkdirs(path);
            rmdir(path);
            tu_write_file(path, jpg, n);
            free(jpg);
        }
    }
    /* The second set's images again, as a tar (a source with a shard). */
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int i = 0; i < 6; i++) {
        char path[1200], name[32];
        snprintf(path, sizeof path, "%s/c0/i%02d.jpg", g_img[1], i);
        size_t n;
        void *jpg = tu_read_file(path, &n);
        snprintf(name, sizeof name, "k%03d.jpg", i);
        tu_tar_add(&t, &tn, name, jpg, n);
        free(jpg);
    }
    uint8_t zeros[1024] = {0};
    t = realloc(t, tn + sizeof zeros);
    REQUIRE(t);
    memcpy(t + tn, zeros, sizeof zeros);
    tn += sizeof zeros;
    snprintf(g_imgtar, sizeof g_imgtar, "%s", tu_path("mix-img.tar"));
    tu_write_file(g_imgtar, t, tn);
    free(t);
}

/* Two sources of the images, the loader's transform to 8x8 and a second
 * image field "view2" of the same image (view2_tf its transform): the
 * per-field transform tests add their own per-source transforms. */
static stk_options *two_views(const char *view2_tf)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    for (int s = 0; s < 2; s++)
        REQUIRE(stk_options_add_source(o, g_img[s], 0.5, 0) == STK_OK);
    REQUIRE(stk_options_set_transform(o, "Resize((8, 8))") == STK_OK);
    REQUIRE(stk_options_set_fields(o, "image") == STK_OK);
    REQUIRE(stk_options_add_field(o, "view2", "image", STK_FIELD_IMAGE, view2_tf, 0) == STK_OK);
    return o;
}

/* A mixture of the two image folders with fields image and view2; tf[s][f]:
 * source s's own transform of field f (0: NULL = the first image, 1:
 * "view2"), or NULL. */
static int open_images(stk_loader **l, const char *const tf[2][2], const char *view2_tf)
{
    stk_options *o = two_views(view2_tf);
    for (size_t s = 0; s < 2; s++)
        for (int f = 0; f < 2; f++)
            if (tf && tf[s][f])
                REQUIRE(stk_options_source_transform(o, s, f ? "view2" : NULL, tf[s][f]) == STK_OK);
    REQUIRE(stk_options_set(o, "samples_per_epoch", "28") == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_options_set_threads(o, 2) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 5) == STK_OK);
    int rc = stk_loader_open(l, o);
    if (rc && getenv("TU_VERBOSE"))
        fprintf(stderr, "    open: %s\n", stk_loader_errmsg(*l));
    stk_options_destroy(o);
    return rc;
}

/* Every sample's (source, image, view2) of an epoch. */
typedef struct imgrun {
    size_t n;
    int src[28];
    uint8_t img[28][3 * 8 * 8], v2[28][3 * 6 * 6];
} imgrun;

static void run_images(stk_loader *l, imgrun *r)
{
    stk_batch *b;
    r->n = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        REQUIRE(b->nfields == 2); /* image, view2 */
        const stk_field *img = &b->fields[0], *v2 = &b->fields[1];
        REQUIRE(img->layout == STK_BATCH_DENSE && v2->layout == STK_BATCH_DENSE);
        REQUIRE(img->sample_bytes == sizeof r->img[0] && v2->sample_bytes == sizeof r->v2[0]);
        for (size_t k = 0; k < b->size && r->n < 28; k++, r->n++) {
            size_t s;
            uint64_t local;
            REQUIRE(stk_loader_sample_source(l, b->indices[k], &s, &local) == STK_OK);
            r->src[r->n] = (int)s;
            memcpy(r->img[r->n], (const uint8_t *)img->data + k * img->sample_bytes,
                   img->sample_bytes);
            memcpy(r->v2[r->n], (const uint8_t *)v2->data + k * v2->sample_bytes, v2->sample_bytes);
        }
        stk_batch_release(b);
    }
}

/* Whether a (CHW, side x side) is b mirrored left to right. */
static bool mirrored(const uint8_t *a, const uint8_t *b, int side)
{
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < side; y++)
            for (int x = 0; x < side; x++)
                if (a[(c * side + y) * side + x] != b[(c * side + y) * side + side - 1 - x])
                    return false;
    return true;
}

static void test_per_source_field_transforms(void)
{
    make_image_sets();
    stk_loader *l = NULL;
    static imgrun ref, got;
    REQUIRE(open_images(&l, NULL, "Resize((6, 6))") == STK_OK);
    run_images(l, &ref);
    stk_loader_close(l);
    CHECK_EQ(ref.n, 28);
    const char *tf[2][2] = {{NULL, "Resize((6, 6))|RandomHorizontalFlip(p=1)"},
                            {"Resize((8, 8))|RandomHorizontalFlip(p=1)", NULL}};
    REQUIRE(open_images(&l, tf, "Resize((6, 6))") == STK_OK);
    run_images(l, &got);
    stk_loader_close(l);
    REQUIRE(got.n == 28);
    int per[2] = {0, 0};
    for (size_t k = 0; k < 28; k++) {
        REQUIRE(got.src[k] == ref.src[k]);
        int s = got.src[k];
        per[s]++;
        /* The ramp makes a mirrored image differ from itself. */
        CHECK(!mirrored(ref.img[k], ref.img[k], 8));
        if (s == 1) {
            CHECK(mirrored(got.img[k], ref.img[k], 8));
            CHECK(!memcmp(got.v2[k], ref.v2[k], sizeof got.v2[k]));
        } else {
            CHECK(!memcmp(got.img[k], ref.img[k], sizeof got.img[k]));
            CHECK(mirrored(got.v2[k], ref.v2[k], 6));
        }
    }
    CHECK_EQ(per[0], 14);
    CHECK_EQ(per[1], 14);
    /* The first image field by its name is the same as NULL. */
    stk_options *o = two_views("Resize((6, 6))");
    REQUIRE(stk_options_source_transform(o, 1, "image", tf[1][0]) == STK_OK);
    REQUIRE(stk_options_source_transform(o, 0, "view2", tf[0][1]) == STK_OK);
    REQUIRE(stk_options_set(o, "samples_per_epoch", "28") == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 5) == STK_OK);
    REQUIRE(stk_loader_open(&l, o) == STK_OK);
    static imgrun by_name;
    run_images(l, &by_name);
    stk_loader_close(l);
    CHECK(!memcmp(by_name.img, got.img, sizeof got.img));
    CHECK(!memcmp(by_name.v2, got.v2, sizeof got.v2));
    /* Refusals, each naming the source and the field. */
    REQUIRE(stk_options_source_transform(o, 0, "caption", "Resize((6, 6))") == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "mixture source 0") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "'caption'") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "'view2'") != NULL); /* what there is */
    stk_loader_close(l);
    REQUIRE(stk_options_source_transform(o, 0, "caption", "none") == STK_OK); /* removed */
    REQUIRE(stk_options_source_transform(o, 0, "view2", "Resize((4, 4))") == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "mixture source 0") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "field 'view2'") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "another shape") != NULL);
    stk_loader_close(l);
    REQUIRE(stk_options_source_transform(o, 0, "view2", "") == STK_OK);
    REQUIRE(stk_options_source_transform(o, 1, NULL, tf[1][0]) == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "two transforms") != NULL);
    stk_loader_close(l);
    stk_options_destroy(o);
    /* The loader's field without a transform (its bytes): refused. */
    REQUIRE(open_images(&l, tf, "none") == STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "field 'view2', but the loader has none") != NULL);
    stk_loader_close(l);
}

/* The fingerprint takes a source's per-field transforms by field name: the
 * same settings made in another order (and through a removal, which moves
 * the last into its place) resume; another transform is refused. */
static stk_loader *open_field_tfs(const char *const *fields, const char *const *specs, size_t n)
{
    stk_options *o = two_views("Resize((6, 6))");
    stk_loader *l = NULL;
    for (size_t k = 0; k < n; k++)
        REQUIRE(stk_options_source_transform(o, 0, fields[k], specs[k]) == STK_OK);
    REQUIRE(stk_options_set(o, "samples_per_epoch", "28") == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_loader_open(&l, o) == STK_OK);
    stk_options_destroy(o);
    return l;
}

static void test_field_transforms_any_order(void)
{
    make_image_sets();
    const char *fl = "Resize((8, 8))|RandomHorizontalFlip(p=1)",
               *f2 = "Resize((6, 6))|RandomHorizontalFlip(p=1)";
    const char *fa[2] = {"image", "view2"}, *sa[2] = {fl, f2};
    stk_loader *a = open_field_tfs(fa, sa, 2);
    stk_batch *b;
    REQUIRE(stk_loader_next(a, &b) == STK_OK);
    stk_batch_release(b);
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(a, &st) == STK_OK);
    stk_loader_close(a);
    /* view2 first; then image set, view2 removed (image moves to its
     * place) and set again. */
    const char *fb[2] = {"view2", "image"}, *sb[2] = {f2, fl};
    const char *fc[4] = {"view2", "image", "view2", "view2"}, *sc[4] = {f2, fl, "", f2};
    stk_loader *l = open_field_tfs(fb, sb, 2);
    CHECK_EQ(stk_loader_set_state(l, &st), STK_OK);
    stk_loader_close(l);
    l = open_field_tfs(fc, sc, 4);
    CHECK_EQ(stk_loader_set_state(l, &st), STK_OK);
    stk_loader_close(l);
    const char *sd[2] = {f2, "Resize((8, 8))"};
    l = open_field_tfs(fb, sd, 2);
    CHECK_EQ(stk_loader_set_state(l, &st), STK_EINVAL);
    stk_loader_close(l);
}

/* ---- per-source options --------------------------------------------------- */

static char g_stk4[1024];

/* A .stk set of 4 shards of 10 samples ("Q:i"). */
static void make_stk4(void)
{
    snprintf(g_stk4, sizeof g_stk4, "%s", tu_path("mix-stk4"));
    tu_mkdirs(g_stk4);
    for (int p = 0; p < 4; p++) {
        char err[256], path[1200];
        snprintf(path, sizeof path, "%s/part-%06d.stk", g_stk4, p);
        stk__stk_header h = {.kind = STK_PAYLOAD_ENCODED};
        stk__stk_writer *w = NULL;
        REQUIRE(stk__stkw_open(&w, path, &h, err, sizeof err) == STK_OK);
        for (int i = 0; i < 10; i++) {
            char text[16];
            int n = snprintf(text, sizeof text, "Q:%d", p * 10 + i);
            REQUIRE(stk__stkw_add(w, (const uint8_t *)text, (size_t)n, i, NULL, 0, 0, err,
                                  sizeof err) == STK_OK);
        }
        uint64_t size;
        REQUIRE(stk__stkw_finish(w, 10, &size, err, sizeof err) == STK_OK);
    }
}

/* The folder and the 4-shard set, 0.4/0.6 of 60; the loader's order and
 * source 1's own (NULL: none). */
static int open_ordered(stk_loader **l, const char *order, const char *src_order,
                        const char *src_key2, const char *src_val2, stk_state *st)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_folder, 0.4, 0) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_stk4, 0.6, 0) == STK_OK);
    REQUIRE(stk_options_set(o, "samples_per_epoch", "60") == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 6) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 21) == STK_OK);
    if (order)
        REQUIRE(stk_options_set(o, "order", order) == STK_OK);
    if (src_order)
        REQUIRE(stk_options_source_set(o, 1, "order", src_order) == STK_OK);
    if (src_key2)
        REQUIRE(stk_options_source_set(o, 1, src_key2, src_val2) == STK_OK);
    int rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    if (rc == STK_OK && st) {
        st->struct_size = sizeof *st;
        REQUIRE(stk_loader_get_state(*l, st) == STK_OK);
    }
    return rc;
}

/* Source 1's k-th samples of the epoch: which shard (0..3) each is in. */
static void shard_runs(stk_loader *l, int *shards, int *n)
{
    stk_batch *b;
    *n = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        for (size_t k = 0; k < b->size; k++) {
            char letter;
            int num;
            parse(b, k, &letter, &num);
            if (letter == 'Q')
                shards[(*n)++] = num / 10;
        }
        stk_batch_release(b);
    }
}

static void test_per_source_options(void)
{
    make_stk4();
    stk_loader *a = NULL, *b = NULL;
    stk_state sa, sb, sc;
    /* The loader's order shards (the folder has no shards: global) is source
     * 1's own order shards: the same batches and fingerprint. */
    REQUIRE(open_ordered(&a, "shards", NULL, "shard_window", "1", &sa) == STK_OK);
    REQUIRE(open_ordered(&b, NULL, "shards", "shard_window", "1", &sb) == STK_OK);
    uint64_t ha = hash_batches(a, 0), hb = hash_batches(b, 0);
    CHECK_EQ(ha, hb);
    CHECK_EQ(sa.mixture, sb.mixture);
    stk_loader_close(a);
    stk_loader_close(b);
    /* ... and the window of 1 shard shows: source 1 reads its shards one at
     * a time (each shard's samples consecutive in its stream). */
    REQUIRE(open_ordered(&b, NULL, "shards", "shard_window", "1", NULL) == STK_OK);
    int shards[64], n = 0, changes = 0;
    shard_runs(b, shards, &n);
    stk_loader_close(b);
    CHECK_EQ(n, 36);
    for (int k = 1; k < n; k++)
        changes += shards[k] != shards[k - 1];
    CHECK(changes <= 4); /* 36 of 40 samples: at most 4 shards, each once */
    REQUIRE(open_ordered(&b, NULL, NULL, NULL, NULL, &sc) == STK_OK);
    shard_runs(b, shards, &n);
    stk_loader_close(b);
    changes = 0;
    for (int k = 1; k < n; k++)
        changes += shards[k] != shards[k - 1];
    CHECK(changes > 8); /* the global permutation mixes the shards */
    CHECK(sc.mixture != sb.mixture);
    /* Blocks: the loader's and the source's own agree too. */
    REQUIRE(open_ordered(&a, "blocks", NULL, "block_bytes", "4096", &sa) == STK_OK);
    REQUIRE(open_ordered(&b, NULL, "blocks", "block_bytes", "4096", &sb) == STK_OK);
    CHECK_EQ(hash_batches(a, 0), hash_batches(b, 0));
    CHECK_EQ(sa.mixture, sb.mixture);
    stk_loader_close(a);
    stk_loader_close(b);
    /* A source's own window or block size that its order does not use
     * would change nothing: refused, naming it. */
    stk_loader *l = NULL;
    CHECK_EQ(open_ordered(&l, NULL, NULL, "shard_window", "2", NULL), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "mixture source 1") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "shard_window") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "global order") != NULL);
    stk_loader_close(l);
    CHECK_EQ(open_ordered(&l, NULL, "shards", "block_bytes", "8K", NULL), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "block_bytes") != NULL);
    stk_loader_close(l);
    /* What is not per source is refused, naming the source and the key. */
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_folder, 0.5, 0) == STK_OK);
    REQUIRE(stk_options_add_source(o, g_stk4, 0.5, 0) == STK_OK);
    CHECK_EQ(stk_options_source_set(o, 1, "cache_dir", "/tmp"), STK_EUNSUPPORTED);
    CHECK(strstr(stk_options_errmsg(o), "mixture source 1") != NULL);
    CHECK(strstr(stk_options_errmsg(o), "'cache_dir'") != NULL);
    CHECK(strstr(stk_options_errmsg(o), "one disk cache") != NULL);
    /* A source may keep out of the cache (0 or 1 only). */
    CHECK_EQ(stk_options_source_set(o, 1, "cache", "0"), STK_OK);
    CHECK_EQ(stk_options_source_set(o, 1, "cache", "2"), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "cache is 0 or 1") != NULL);
    CHECK_EQ(stk_options_source_set(o, 0, "fetch_retries", "2"), STK_EUNSUPPORTED);
    CHECK(strstr(stk_options_errmsg(o), "'fetch_retries' is the loader's") != NULL);
    CHECK_EQ(stk_options_source_set(o, 0, "no_such_key", "2"), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "unknown option 'no_such_key'") != NULL);
    CHECK_EQ(stk_options_source_set(o, 1, "order", "sideways"), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "mixture source 1") != NULL);
    CHECK(strstr(stk_options_errmsg(o), "order") != NULL);
    CHECK_EQ(stk_options_source_set(o, 2, "order", "shards"), STK_EINVAL);
    CHECK_EQ(stk_options_source_set(o, 1, "transform", "Resize((8, 8))"), STK_OK);
    CHECK_EQ(stk_options_source_set(o, 1, "transform", "none"), STK_OK);
    /* A source of no shards cannot take its own shard order. */
    REQUIRE(stk_options_source_set(o, 0, "order", "shards") == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "mixture source 0") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "order \"shards\"") != NULL);
    stk_loader_close(l);
    stk_options_destroy(o);
}

/* ---- the fingerprint leaves the paths out ----------------------------------
 * Save mid-epoch, move the .stk set and the folder, reopen at the new paths:
 * the state resumes and the rest of the epoch is the uninterrupted run's. A
 * state holding the first version's fingerprint (with the paths) resumes at
 * the old paths. */

static uint64_t fnv(uint64_t h, const char *p)
{
    for (; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    return h;
}

static void test_moved_dataset_resumes(void)
{
    mcfg c = {.w = {0.5, 0.3, 0.2}, .n = 200, .bs = 20};
    stk_loader *a = NULL, *b = NULL;
    REQUIRE(open_mix(&a, &c) == STK_OK);
    (void)hash_batches(a, 3);
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(a, &st) == STK_OK);
    uint64_t rest = hash_batches(a, 0);
    stk_loader_close(a);
    /* The first version's fingerprint of this mixture (paths, then per
     * source |weight|fixed|size|quota|batch unit|). */
    uint64_t v1 = 0xcbf29ce484222325ULL;
    const char *paths[3] = {g_folder, g_stk, g_tar};
    const char *lines[3] = {"|0.5|0|12|100|1|", "|0.29999999999999999|0|40|60|1|",
                            "|0.20000000000000001|0|9|40|1|"};
    for (int k = 0; k < 3; k++)
        v1 = fnv(fnv(v1, paths[k]), lines[k]);
    stk_state old = st;
    old.mixture = v1;
    REQUIRE(open_mix(&b, &c) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &old), STK_OK);
    CHECK_EQ(hash_batches(b, 0), rest);
    stk_loader_close(b);
    char moved_stk[1024], moved_folder[1024], saved_stk[1024], saved_folder[1024];
    snprintf(moved_stk, sizeof moved_stk, "%.1000s-moved", g_stk);
    snprintf(moved_folder, sizeof moved_folder, "%.1000s-moved", g_folder);
    REQUIRE(rename(g_stk, moved_stk) == 0);
    REQUIRE(rename(g_folder, moved_folder) == 0);
    memcpy(saved_stk, g_stk, sizeof saved_stk);
    memcpy(saved_folder, g_folder, sizeof saved_folder);
    memcpy(g_stk, moved_stk, sizeof g_stk);
    memcpy(g_folder, moved_folder, sizeof g_folder);
    REQUIRE(open_mix(&b, &c) == STK_OK);
    int rc = stk_loader_set_state(b, &st);
    if (rc)
        fprintf(stderr, "    set_state: %s\n", stk_loader_errmsg(b));
    CHECK_EQ(rc, STK_OK);
    CHECK_EQ(hash_batches(b, 0), rest);
    stk_loader_close(b);
    /* The first version's fingerprint names the old paths: refused here. */
    REQUIRE(open_mix(&b, &c) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &old), STK_EINVAL);
    stk_loader_close(b);
    REQUIRE(rename(moved_stk, saved_stk) == 0);
    REQUIRE(rename(moved_folder, saved_folder) == 0);
    memcpy(g_stk, saved_stk, sizeof g_stk);
    memcpy(g_folder, saved_folder, sizeof g_folder);
    /* Another dataset of another size at the same path is still refused. */
    c.w[1] = 0.3;
    mcfg d = c;
    d.n = 0; /* sizes decide the default epoch: refused by num_samples or mixture */
    REQUIRE(open_mix(&b, &d) == STK_OK);
    CHECK_EQ(stk_loader_set_state(b, &st), STK_EINVAL);
    stk_loader_close(b);
}

/* One session: options with per-source transforms of two fields and a
 * per-source order, open, an epoch; allocation n failing (-1: none).
 * STK_OK, or the failure, which must be STK_ENOMEM. */
static int oom_session(long n)
{
    const char *flip = "Resize((8, 8))|RandomHorizontalFlip(p=1)";
    stk_options *o = NULL;
    stk_loader *l = NULL;
    stk__alloc_fail_after(n);
    int rc = stk_options_create(&o);
    for (size_t s = 0; rc == STK_OK && s < 2; s++)
        rc = stk_options_add_source(o, s ? g_imgtar : g_img[0], 0.5, 0);
    if (rc == STK_OK)
        rc = stk_options_set_transform(o, "Resize((8, 8))");
    if (rc == STK_OK)
        rc = stk_options_set_fields(o, "image=image;jpg,view2=image;jpg:image");
    if (rc == STK_OK)
        rc = stk_options_source_transform(o, 0, "view2", flip);
    if (rc == STK_OK)
        rc = stk_options_source_transform(o, 1, "image", flip);
    if (rc == STK_OK)
        rc = stk_options_source_set(o, 1, "order", "shards");
    if (rc == STK_OK)
        rc = stk_options_set(o, "samples_per_epoch", "20");
    if (rc == STK_OK)
        rc = stk_options_set_threads(o, 1);
    if (rc == STK_OK)
        rc = stk_loader_open(&l, o);
    size_t got = 0;
    stk_batch *b;
    while (rc == STK_OK && (rc = stk_loader_next(l, &b)) == STK_OK) {
        got += b->size;
        stk_batch_release(b);
    }
    if (rc == STK_END) {
        CHECK_EQ(got, 20);
        rc = STK_OK;
    } else if (rc == STK_ESAMPLE) { /* a worker's allocation: the sample fails */
        stk_error_info info = {.struct_size = sizeof info};
        CHECK_EQ(stk_loader_last_error(l, &info), STK_OK);
        rc = info.sample_code;
    }
    stk__alloc_fail_after(-1);
    if (rc != STK_OK && rc != STK_ENOMEM)
        fprintf(stderr, "    allocation %ld: rc %d: %s\n", n, rc,
                l ? stk_loader_errmsg(l) : stk_options_errmsg(o));
    stk_loader_close(l);
    stk_options_destroy(o);
    return rc;
}

/* Every allocation of such a session failing in turn: STK_ENOMEM (or a
 * failure the code absorbs) and no leak. */
static void test_per_source_oom(void)
{
    long before = stk__alloc_count();
    REQUIRE(oom_session(-1) == STK_OK);
    long total = stk__alloc_count() - before;
    for (long n = 0; n < total; n++) {
        int rc = oom_session(n);
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
    }
    fprintf(stderr, "    %ld allocation failures swept\n", total);
}

int main(void)
{
    tu_begin("test_mix_loader", 240);
    make_sets();
    RUN(test_proportions_and_passes);
    RUN(test_threads_identical);
    RUN(test_resume_exact);
    RUN(test_elastic);
    RUN(test_source_field_and_missing_field);
    RUN(test_errors_name_source);
    RUN(test_per_source_batches);
    RUN(test_open_errors);
    RUN(test_per_source_field_transforms);
    RUN(test_field_transforms_any_order);
    RUN(test_per_source_options);
    RUN(test_moved_dataset_resumes);
    RUN(test_per_source_oom);
    return tu_end();
}
