/* test_pack_api.c -- stk_pack, the public packing API (include/stoker.h):
 * the same bytes for any thread count, a packed dataset a loader reads back
 * exactly, the progress callback (final call, skipped samples with their
 * keys, cancellation that takes back what was written), errors that name
 * what is wrong (a missing source, an OUT inside SRC, bad options, a failing
 * sample); and stk_writer, which writes the same bytes sample by sample.
 * Only the public header is used. */
#include "testutil.h"

#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A folder of 3 classes x 10 real JPEGs of varying sizes. */
static void make_tree(const char *root)
{
    uint64_t x = 777;
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 10; k++) {
            char dir[600], p[700];
            snprintf(dir, sizeof dir, "%s/class%d", root, c);
            tu_mkdirs(dir);
            snprintf(p, sizeof p, "%s/img%02d.jpg", dir, k);
            uint32_t w = 20 + (uint32_t)k * 3, h = 18 + (uint32_t)c * 5;
            uint8_t *px = malloc((size_t)w * h * 3);
            REQUIRE(px);
            for (size_t j = 0; j < (size_t)w * h * 3; j++) {
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                px[j] = (uint8_t)(x >> 56);
            }
            size_t n;
            uint8_t *jpg = tu_jpeg(px, w, h, 85, &n);
            tu_write_file(p, jpg, n);
            free(jpg);
            free(px);
        }
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

typedef struct seen {
    int calls, finals;
    uint64_t last_done, total;
    int skips;
    char skipped_key[256], skipped_reason[256];
    uint64_t skipped_index;
    int cancel_on_skip;
} seen;

static int on_progress(const stk_pack_progress *p, void *user)
{
    seen *s = user;
    s->calls++;
    CHECK(p->struct_size >= sizeof *p);
    CHECK(p->done >= s->last_done); /* in order, never backwards */
    CHECK(p->done <= p->total);
    s->last_done = p->done;
    s->total = p->total;
    if (p->skipped_key) {
        s->skips++;
        s->skipped_index = p->skipped_index;
        snprintf(s->skipped_key, sizeof s->skipped_key, "%s", p->skipped_key);
        snprintf(s->skipped_reason, sizeof s->skipped_reason, "%s", p->skipped_reason);
        return s->cancel_on_skip;
    }
    if (p->done == p->total)
        s->finals++;
    return 0;
}

static void test_pack_threads_roundtrip(void)
{
    char root[512], outs[3][512], err[1024];
    snprintf(root, sizeof root, "%s", tu_path("src"));
    make_tree(root);
    unsigned threads[3] = {1, 3, 8};
    for (int k = 0; k < 3; k++) {
        char rel[32];
        snprintf(rel, sizeof rel, "out%d", k);
        snprintf(outs[k], sizeof outs[k], "%s", tu_path(rel));
        seen s = {0};
        stk_pack_options o = {.struct_size = sizeof o};
        o.shard_size = 4000;
        o.max_side = 24;
        o.threads = threads[k];
        o.progress = on_progress;
        o.progress_user = &s;
        stk_pack_result r = {.struct_size = sizeof r};
        int rc = stk_pack(root, outs[k], &o, &r, err, sizeof err);
        if (rc)
            fprintf(stderr, "stk_pack: %s\n", err);
        REQUIRE(rc == STK_OK);
        CHECK_EQ(r.samples, 30);
        CHECK_EQ(r.skipped, 0);
        CHECK_EQ(r.payload, 1); /* resized */
        CHECK(r.shards > 2);
        CHECK_EQ(r.struct_size, sizeof r);
        CHECK_EQ(s.finals, 1);
        CHECK_EQ(s.last_done, 30);
        CHECK_EQ(s.total, 30);
        /* The listed shards plus the manifest and the consolidated index,
         * nothing else (no marker). */
        CHECK_EQ(count_entries(outs[k]), (int)r.shards + 2);
    }
    for (int k = 1; k < 3; k++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/stoker.manifest", outs[0]);
        snprintf(b, sizeof b, "%s/stoker.manifest", outs[k]);
        CHECK(same_file(a, b));
        for (int sh = 0;; sh++) {
            snprintf(a, sizeof a, "%s/part-%06d.stk", outs[0], sh);
            snprintf(b, sizeof b, "%s/part-%06d.stk", outs[k], sh);
            if (access(a, F_OK) != 0)
                break;
            CHECK(same_file(a, b));
        }
    }
    /* Encoded (no options): the loader reads every file's bytes back, with
     * its class label, in the source's order. */
    char enc[512];
    snprintf(enc, sizeof enc, "%s", tu_path("enc"));
    REQUIRE(stk_pack(root, enc, NULL, NULL, err, sizeof err) == STK_OK);
    stk_options *opt;
    REQUIRE(stk_options_create(&opt) == STK_OK);
    stk_options_set_source(opt, enc);
    stk_options_set_batch_size(opt, 1);
    stk_options_set_shuffle(opt, 0);
    stk_options_set_threads(opt, 2);
    stk_loader *l;
    REQUIRE(stk_loader_open(&l, opt) == STK_OK);
    stk_options_destroy(opt);
    int n = 0;
    stk_batch *b;
    while (stk_loader_next(l, &b) == STK_OK) {
        char p[700];
        snprintf(p, sizeof p, "%s/class%d/img%02d.jpg", root, n / 10, n % 10);
        size_t len;
        uint8_t *want = tu_read_file(p, &len);
        REQUIRE(want);
        CHECK_EQ(b->size, 1);
        CHECK_EQ(b->labels[0], n / 10);
        CHECK_EQ(b->indices[0], (uint64_t)n);
        CHECK(b->lengths[0] == len && !memcmp((const uint8_t *)b->data + b->offsets[0], want, len));
        free(want);
        stk_batch_release(b);
        n++;
    }
    CHECK_EQ(n, 30);
    stk_loader_close(l);
}

static void test_skip_and_cancel(void)
{
    char root[512], out[512], err[1024];
    snprintf(root, sizeof root, "%s", tu_path("bad"));
    snprintf(out, sizeof out, "%s", tu_path("bad-out"));
    make_tree(root);
    char p[700];
    snprintf(p, sizeof p, "%s/class1/img04.jpg", root);
    tu_write_file(p, "this is text, not a JPEG", 24);

    /* Without skip_bad: the error names the sample's index and key. */
    stk_pack_options o = {.struct_size = sizeof o};
    o.threads = 3;
    int rc = stk_pack(root, out, &o, NULL, err, sizeof err);
    CHECK_EQ(rc, STK_EFORMAT);
    CHECK(strstr(err, "sample 14 (class1/img04.jpg)") != NULL);
    CHECK(strstr(err, "not an image") != NULL);
    CHECK(access(out, F_OK) != 0); /* created by the pack, so removed */

    /* skip_bad: the callback hears of the skipped sample, with its reason. */
    seen s = {0};
    o.skip_bad = 1;
    o.progress = on_progress;
    o.progress_user = &s;
    stk_pack_result r = {.struct_size = sizeof r};
    REQUIRE(stk_pack(root, out, &o, &r, err, sizeof err) == STK_OK);
    CHECK_EQ(r.samples, 29);
    CHECK_EQ(r.skipped, 1);
    CHECK_EQ(s.skips, 1);
    CHECK_EQ(s.skipped_index, 14);
    CHECK(!strcmp(s.skipped_key, "class1/img04.jpg"));
    CHECK(strstr(s.skipped_reason, "not an image") != NULL);

    /* Cancelling from the callback stops the pack with STK_ECANCELED and
     * takes back what it wrote (small shards: several were finished). */
    char out2[512];
    snprintf(out2, sizeof out2, "%s", tu_path("cancel-out"));
    tu_mkdirs(out2);
    seen c = {0};
    c.cancel_on_skip = 1;
    o.progress_user = &c;
    o.shard_size = 1000;
    o.threads = 1;
    rc = stk_pack(root, out2, &o, NULL, err, sizeof err);
    CHECK_EQ(rc, STK_ECANCELED);
    CHECK(strstr(err, "canceled") != NULL);
    CHECK_EQ(count_entries(out2), 0); /* OUT was there before: kept, empty */
}

static void test_errors(void)
{
    char root[512], err[1024], in[700];
    snprintf(root, sizeof root, "%s", tu_path("e-src"));
    make_tree(root);
    stk_pack_options o = {.struct_size = sizeof o};

    CHECK_EQ(stk_pack(tu_path("missing"), tu_path("e-out"), &o, NULL, err, sizeof err), STK_ENOENT);
    CHECK(strstr(err, "missing") != NULL);
    CHECK(access(tu_path("e-out"), F_OK) != 0);

    /* OUT equal to SRC, inside it, or holding it: refused, nothing written. */
    CHECK_EQ(stk_pack(root, root, &o, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "source dataset itself") != NULL);
    snprintf(in, sizeof in, "%s/packed", root);
    CHECK_EQ(stk_pack(root, in, &o, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "inside the source dataset") != NULL);
    CHECK(access(in, F_OK) != 0);
    CHECK_EQ(stk_pack(root, tu_tmpdir(), &o, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "is inside OUT") != NULL);

    /* Options are checked, each message naming the field. */
    stk_pack_options q = o;
    q.quality = 101;
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "quality") != NULL);
    q = o;
    q.align = 1000;
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "align") != NULL);
    q = o;
    q.raw_h = 8;
    q.raw_w = 8; /* raw_c missing */
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "raw") != NULL);
    q = o;
    q.raw_h = q.raw_w = 8;
    q.raw_c = 2;
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "C = 1 or 3") != NULL);
    q = o;
    q.label_bytes = 3;
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "label_bytes") != NULL);
    q = o;
    q.header_bytes = 16;
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "record") != NULL);
    q = o;
    q.struct_size = 8;
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &q, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "struct_size") != NULL);
    stk_pack_result r = {.struct_size = 4};
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &o, &r, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "stk_pack_result") != NULL);
    CHECK_EQ(stk_pack(NULL, tu_path("e-out"), &o, NULL, err, sizeof err), STK_EINVAL);
    CHECK_EQ(stk_pack(root, "", &o, NULL, NULL, 0), STK_EINVAL); /* err may be NULL */
    CHECK(access(tu_path("e-out"), F_OK) != 0);

    /* An output that already holds a packed dataset is refused. */
    REQUIRE(stk_pack(root, tu_path("e-out"), &o, NULL, err, sizeof err) == STK_OK);
    CHECK_EQ(stk_pack(root, tu_path("e-out"), &o, NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "already holds a packed dataset") != NULL);
    CHECK(!strcmp(stk_strerror(STK_ECANCELED), "canceled"));
}

/* A writer fed the same samples, keys, labels and class names as stk_pack
 * reads from a folder writes the same bytes: one shard writer behind both. */
static void test_writer_matches_pack(void)
{
    char root[512], a[512], b[512], err[1024];
    snprintf(root, sizeof root, "%s", tu_path("w-src"));
    snprintf(a, sizeof a, "%s", tu_path("w-pack"));
    snprintf(b, sizeof b, "%s", tu_path("w-writer"));
    make_tree(root);
    stk_pack_options po = {.struct_size = sizeof po};
    po.shard_size = 5000;
    REQUIRE(stk_pack(root, a, &po, NULL, err, sizeof err) == STK_OK);

    stk_writer_options wo = {.struct_size = sizeof wo};
    wo.shard_size = 5000;
    wo.num_classes = 3;
    stk_writer *w;
    REQUIRE(stk_writer_open(&w, b, &wo, err, sizeof err) == STK_OK);
    for (int c = 0; c < 3; c++) {
        char name[32];
        snprintf(name, sizeof name, "class%d", c);
        CHECK_EQ(stk_writer_set_class_name(w, (uint64_t)c, name), STK_OK);
        for (int k = 0; k < 10; k++) {
            char p[700], key[64];
            snprintf(p, sizeof p, "%s/class%d/img%02d.jpg", root, c, k);
            snprintf(key, sizeof key, "class%d/img%02d.jpg", c, k);
            size_t n;
            uint8_t *d = tu_read_file(p, &n);
            REQUIRE(d);
            CHECK_EQ(stk_writer_add(w, d, n, c, key), STK_OK);
            free(d);
        }
    }
    /* A rejected sample leaves the writer usable and writes nothing. */
    CHECK_EQ(stk_writer_add(w, "x", 1, 3, "bad-label"), STK_EINVAL);
    CHECK(strstr(stk_writer_errmsg(w), "label 3 is outside -1..2") != NULL);
    CHECK_EQ(stk_writer_set_class_name(w, 5, "x"), STK_EINVAL);
    stk_pack_result r = {.struct_size = sizeof r};
    REQUIRE(stk_writer_finish(w, &r) == STK_OK);
    CHECK_EQ(r.samples, 30);
    CHECK_EQ(r.payload, 0);
    CHECK_EQ(stk_writer_add(w, "x", 1, 0, NULL), STK_EMISUSE);
    CHECK_EQ(stk_writer_finish(w, NULL), STK_EMISUSE);
    stk_writer_close(w);
    CHECK_EQ(count_entries(a), count_entries(b));
    CHECK_EQ(count_entries(b), (int)r.shards + 2); /* + manifest, stoker.index */
    char x[700], y[700];
    snprintf(x, sizeof x, "%s/stoker.manifest", a);
    snprintf(y, sizeof y, "%s/stoker.manifest", b);
    CHECK(same_file(x, y));
    snprintf(x, sizeof x, "%s/stoker.index", a);
    snprintf(y, sizeof y, "%s/stoker.index", b);
    CHECK(same_file(x, y));
    for (uint64_t sh = 0; sh < r.shards; sh++) {
        snprintf(x, sizeof x, "%s/part-%06llu.stk", a, (unsigned long long)sh);
        snprintf(y, sizeof y, "%s/part-%06llu.stk", b, (unsigned long long)sh);
        CHECK(same_file(x, y));
    }
}

/* Raw tensors: a dense dataset the loader reads back exactly; samples of
 * the wrong size are refused; an unfinished writer takes back its shards. */
static void test_writer_raw_and_abort(void)
{
    char dir[512], err[1024];
    snprintf(dir, sizeof dir, "%s", tu_path("w-raw"));
    stk_writer_options wo = {.struct_size = sizeof wo};
    wo.raw_h = 4;
    wo.raw_w = 5;
    wo.raw_c = 3;
    wo.num_classes = 10;
    wo.shard_size = 200;
    stk_writer *w;
    REQUIRE(stk_writer_open(&w, dir, &wo, err, sizeof err) == STK_OK);
    uint8_t px[60];
    for (int i = 0; i < 25; i++) {
        for (int j = 0; j < 60; j++)
            px[j] = (uint8_t)(i * 7 + j);
        CHECK_EQ(stk_writer_add(w, px, sizeof px, i % 10, NULL), STK_OK);
    }
    CHECK_EQ(stk_writer_add(w, px, 59, 0, "short"), STK_EINVAL);
    CHECK(strstr(stk_writer_errmsg(w), "59 bytes, but a raw 4x5x3 sample has 60") != NULL);
    REQUIRE(stk_writer_finish(w, NULL) == STK_OK);
    stk_writer_close(w);

    stk_options *opt;
    REQUIRE(stk_options_create(&opt) == STK_OK);
    stk_options_set_source(opt, dir);
    stk_options_set_batch_size(opt, 5);
    stk_options_set_shuffle(opt, 0);
    stk_loader *l;
    REQUIRE(stk_loader_open(&l, opt) == STK_OK);
    stk_options_destroy(opt);
    stk_batch *b;
    int got = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        CHECK_EQ(b->sample_bytes, 60);
        for (size_t k = 0; k < b->size; k++, got++) {
            const uint8_t *d = (const uint8_t *)b->data + k * 60;
            CHECK_EQ(b->labels[k], got % 10);
            CHECK(d[0] == (uint8_t)(got * 7) && d[59] == (uint8_t)(got * 7 + 59));
        }
        stk_batch_release(b);
    }
    CHECK_EQ(got, 25);
    stk_loader_close(l);

    /* Open on a packed dataset: refused. Closing unfinished: nothing left. */
    CHECK_EQ(stk_writer_open(&w, dir, &wo, err, sizeof err), STK_EINVAL);
    CHECK(w == NULL);
    CHECK(strstr(err, "already holds a packed dataset") != NULL);
    char dir2[512];
    snprintf(dir2, sizeof dir2, "%s", tu_path("w-abort"));
    REQUIRE(stk_writer_open(&w, dir2, &wo, err, sizeof err) == STK_OK);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(stk_writer_add(w, px, sizeof px, -1, NULL), STK_OK);
    stk_writer_close(w);
    CHECK(access(dir2, F_OK) != 0);
    REQUIRE(stk_writer_open(&w, dir2, &wo, err, sizeof err) == STK_OK);
    CHECK_EQ(stk_writer_finish(w, NULL), STK_EEMPTY);
    stk_writer_close(w);
    CHECK(access(dir2, F_OK) != 0);
    wo.raw_c = 2;
    CHECK_EQ(stk_writer_open(&w, dir2, &wo, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "C 1 or 3") != NULL);
    stk_writer_close(NULL);
}

static void *noop_thread(void *arg)
{
    return arg;
}

int main(void)
{
    /* ThreadSanitizer starts a background thread with the first thread a
     * program creates; start it before the harness takes its baseline. */
    pthread_t th;
    if (pthread_create(&th, NULL, noop_thread, NULL) == 0)
        pthread_join(th, NULL);
    tu_begin("test_pack_api", 300);
    RUN(test_pack_threads_roundtrip);
    RUN(test_skip_and_cancel);
    RUN(test_errors);
    RUN(test_writer_matches_pack);
    RUN(test_writer_raw_and_abort);
    return tu_end();
}
