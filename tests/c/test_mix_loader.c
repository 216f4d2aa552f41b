/* test_mix_loader.c -- mixing datasets in the loader (docs/mixing.md): three
 * local sources of different kinds (a folder, a .stk set, a tar shard) whose
 * samples' bytes name them ("F:7", "S:12", "T:3"), mixed by weight:
 * proportions within the bound in every batch, every pass of a source exactly
 * once, the same batches for 1, 2 and 8 threads, exact resume mid-epoch,
 * elastic resume onto other worlds and batch sizes giving the same multiset
 * of samples as an uninterrupted epoch, the refusal of a changed mixture (and
 * mix_resume "new"), the "source" field, a missing field naming its source,
 * and a failing source under raise and skip naming the source and sample. */
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
    return tu_end();
}
