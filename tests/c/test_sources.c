/* test_sources.c -- the two sources through the public API: fixed-size records
 * (dense batches, labels, headers, malformed files, truncation mid-epoch) and
 * ImageFolder trees (torchvision's sample list and class indices, extensions,
 * nesting, symlinks, budgets), and bad input: missing paths, empty folders,
 * unreadable and vanishing files, under both error policies. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------- */

/* Payload byte j of record i, and record i's label (fits label_bytes). */
static uint8_t rec_byte(uint64_t i, size_t j)
{
    return (uint8_t)(i * 31 + j * 7 + 1);
}
static uint64_t rec_label(uint64_t i, unsigned lb)
{
    uint64_t v = 0x0102030405060708ULL + i * 0x0101010101ULL;
    if (lb < 8)
        v &= (1ULL << (8 * lb)) - 1;
    return v;
}

static void make_records(const char *path, uint64_t n, size_t record, size_t header, unsigned lb,
                         size_t extra)
{
    size_t total = header + (size_t)n * record + extra;
    uint8_t *buf = malloc(total ? total : 1);
    REQUIRE(buf);
    for (size_t k = 0; k < header; k++)
        buf[k] = 0xee;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t *r = buf + header + i * record;
        uint64_t lab = rec_label(i, lb);
        for (unsigned k = 0; k < lb; k++)
            r[k] = (uint8_t)(lab >> (8 * k));
        for (size_t j = 0; j < record - lb; j++)
            r[lb + j] = rec_byte(i, j);
    }
    for (size_t k = 0; k < extra; k++)
        buf[header + n * record + k] = 0x55;
    tu_write_file(path, buf, total);
    free(buf);
}

static int records_sample_ok(const stk_batch *b, size_t k, size_t payload)
{
    const uint8_t *p = (const uint8_t *)b->data + k * b->sample_bytes;
    for (size_t j = 0; j < payload; j++)
        if (p[j] != rec_byte(b->indices[k], j))
            return 0;
    return 1;
}

/* One delivered sample, as the tests compare them. */
typedef struct sample {
    uint64_t index, len, hash, batch;
    int64_t label;
} sample;

typedef struct run {
    sample s[4096];
    size_t n;
    uint64_t batches;
} run;

static const uint8_t *sample_bytes(const stk_batch *b, size_t k, uint64_t *len)
{
    if (b->kind == STK_BATCH_DENSE) {
        *len = b->sample_bytes;
        return (const uint8_t *)b->data + k * b->sample_bytes;
    }
    *len = b->lengths[k];
    return (const uint8_t *)b->data + b->offsets[k];
}

static void add_batch(run *r, const stk_batch *b)
{
    for (size_t k = 0; k < b->size; k++) {
        REQUIRE(r->n < sizeof r->s / sizeof r->s[0]);
        sample *s = &r->s[r->n++];
        const uint8_t *p = sample_bytes(b, k, &s->len);
        s->index = b->indices[k];
        s->label = b->labels[k];
        s->hash = tu_hash(0, p, s->len);
        s->batch = b->index;
    }
    r->batches++;
}

/* Takes batches until the end of the epoch; any other code stops it. */
static int drain(stk_loader *l, run *r)
{
    for (;;) {
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (rc != STK_OK)
            return rc;
        add_batch(r, b);
        stk_batch_release(b);
    }
}

/* ---- records ------------------------------------------------------------ */

static void test_records_dense_labels(void)
{
    static const unsigned lbs[] = {0, 1, 2, 4, 8};
    static const size_t headers[] = {0, 3, 100};
    for (size_t li = 0; li < 5; li++)
        for (size_t hi = 0; hi < 3; hi++) {
            unsigned lb = lbs[li];
            size_t rec = 24 + lb, payload = 24;
            const char *path = tu_path("rec.bin");
            make_records(path, 37, rec, headers[hi], lb, 0);
            tu_cfg c = {.path = path, .record = rec, .header = headers[hi], .label = lb, .bs = 5};
            stk_loader *l;
            REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
            stk_info info = {.struct_size = sizeof info};
            CHECK_EQ(stk_loader_info(l, &info), STK_OK);
            CHECK_EQ(info.num_samples, 37);
            CHECK_EQ(info.samples_per_epoch, 37);
            CHECK_EQ(info.batches_per_epoch, 8);
            CHECK_EQ(info.num_classes, 0);
            CHECK_EQ(info.kind, STK_BATCH_DENSE);
            CHECK(!strcmp(info.source_kind, "records"));
            uint64_t expect = 0;
            for (;;) {
                stk_batch *b;
                int rc = stk_loader_next(l, &b);
                if (rc == STK_END)
                    break;
                REQUIRE(rc == STK_OK);
                CHECK_EQ(b->kind, STK_BATCH_DENSE);
                CHECK_EQ(b->dtype, STK_DTYPE_UINT8);
                CHECK_EQ(b->ndim, 1);
                CHECK_EQ(b->shape[0], (int64_t)payload);
                CHECK_EQ(b->sample_bytes, payload);
                CHECK_EQ(b->size, b->index == 7 ? 2 : 5);
                for (size_t k = 0; k < b->size; k++) {
                    CHECK_EQ(b->indices[k], expect);
                    CHECK_EQ(b->labels[k], lb ? (int64_t)rec_label(expect, lb) : -1);
                    CHECK(records_sample_ok(b, k, payload));
                    expect++;
                }
                stk_batch_release(b);
            }
            CHECK_EQ(expect, 37);
            stk_loader_close(l);
        }
}

static void test_records_bad_files(void)
{
    stk_loader *l;
    const char *path = tu_path("bad.bin");
    /* A trailing partial record: an error at open that names the file. */
    make_records(path, 10, 16, 0, 1, 5);
    tu_cfg c = {.path = path, .record = 16, .label = 1};
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EFORMAT);
    CHECK(strstr(stk_loader_errmsg(l), path) != NULL);
    stk_loader_close(l);
    /* A header longer than the file. */
    make_records(path, 0, 16, 7, 0, 0);
    c.header = 8;
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EFORMAT);
    stk_loader_close(l);
    /* Only a header: no records. */
    c.header = 7;
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EEMPTY);
    CHECK(strstr(stk_loader_errmsg(l), path) != NULL);
    stk_loader_close(l);
    /* Missing file. */
    c.path = tu_path("nope.bin");
    CHECK_EQ(tu_open_cfg(&l, &c), STK_ENOENT);
    CHECK(strstr(stk_loader_errmsg(l), c.path) != NULL);
    stk_loader_close(l);
    /* A record size on a directory, and a plain file without one. */
    tu_mkdirs(tu_path("somedir/x"));
    c.path = tu_path("somedir");
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EINVAL);
    stk_loader_close(l);
    make_records(path, 4, 16, 0, 0, 0);
    tu_cfg c2 = {.path = path};
    CHECK_EQ(tu_open_cfg(&l, &c2), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), path) != NULL);
    stk_loader_close(l);
    /* Invalid record options are refused by the setter. */
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set_records(o, 16, 0, 3), STK_EINVAL);
    CHECK_EQ(stk_options_set_records(o, 4, 0, 4), STK_EINVAL);
    CHECK_EQ(stk_options_set_records(o, 0, 0, 0), STK_EINVAL);
    stk_options_destroy(o);
}

/* Truncating the file mid-epoch: the records past the new end fail with an
 * error naming the record; everything delivered before is intact. */
static void test_records_truncated_mid_epoch(void)
{
    for (int policy = 0; policy <= 1; policy++) {
        const char *path = tu_path("trunc.bin");
        make_records(path, 40, 10, 0, 2, 0);
        tu_cfg c = {
            .path = path, .record = 10, .label = 2, .bs = 4, .depth = 2, .on_error = policy};
        stk_loader *l;
        REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
        /* Holding every ring buffer stops production: nothing past batch 1
         * has been read when the file shrinks to 30 records and a half. */
        stk_batch *b0, *b1;
        REQUIRE(stk_loader_next(l, &b0) == STK_OK);
        REQUIRE(stk_loader_next(l, &b1) == STK_OK);
        REQUIRE(truncate(path, 305) == 0);
        CHECK(records_sample_ok(b0, 0, 8) && records_sample_ok(b1, 3, 8));
        stk_batch_release(b0);
        stk_batch_release(b1);
        uint64_t delivered = 8, nb = 2;
        int failures = 0;
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            if (rc == STK_ESAMPLE) {
                CHECK_EQ(policy, STK_ON_ERROR_RAISE);
                /* The message names the first missing record of the batch:
                 * batch b holds records 4b .. 4b+3. */
                uint64_t first = nb * 4 < 30 ? 30 : nb * 4;
                char want[1100];
                snprintf(want, sizeof want, "%s#%llu", path, (unsigned long long)first);
                const char *m = stk_loader_errmsg(l);
                CHECK(strstr(m, want) != NULL);
                if (!strstr(m, want))
                    fprintf(stderr, "    errmsg \"%s\" does not name %s\n", m, want);
                failures++;
                REQUIRE(failures < 10);
                continue;
            }
            REQUIRE(rc == STK_OK);
            for (size_t k = 0; k < b->size; k++) {
                CHECK(b->indices[k] < 30);
                CHECK(records_sample_ok(b, k, 8));
            }
            delivered += b->size;
            nb++;
            stk_batch_release(b);
        }
        CHECK_EQ(delivered, 30);
        stk_stats st = {.struct_size = sizeof st};
        CHECK_EQ(stk_loader_stats(l, &st), STK_OK);
        CHECK_EQ(policy ? st.samples_skipped : st.samples_failed, 10);
        CHECK_EQ(stk_loader_error_count(l), 10);
        for (size_t k = 0; k < stk_loader_error_count(l); k++) {
            stk_sample_error e;
            REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
            CHECK(e.sample >= 30 && e.sample < 40);
            CHECK_EQ(e.code, STK_EIO);
            CHECK_EQ(e.epoch, 0);
            char want[1100];
            snprintf(want, sizeof want, "%s#%llu", path, (unsigned long long)e.sample);
            CHECK(!strcmp(e.path, want));
            CHECK(strstr(e.reason, "short read") != NULL);
        }
        stk_loader_close(l);
    }
}

/* ---- folder ------------------------------------------------------------- */

typedef struct fexp {
    const char *rel;
    int label;
} fexp;

static void put(const char *root, const char *rel, size_t extra)
{
    char p[1024], d[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    snprintf(d, sizeof d, "%s", p);
    *strrchr(d, '/') = 0;
    tu_mkdirs(d);
    char content[2048];
    int n = snprintf(content, sizeof content, "bytes of %s ", rel);
    for (size_t k = 0; k < extra && (size_t)n < sizeof content; k++)
        content[n++] = (char)('a' + k % 26);
    tu_write_file(p, content, (size_t)n);
}

/* An ImageFolder tree with everything torchvision has an opinion on. */
static const char *build_tree(void)
{
    const char *root = tu_path("tree");
    static const char *const files[] = {
        ".hid/x.png",
        "C/1.JPG",
        "C/2.Png",
        "C/.jpg",
        "C/u.ppm",
        "C/v.pgm",
        "C/w.bmp",
        "C/x.tif",
        "C/y.TIFF",
        "C/z.WebP",
        "C/notes.txt",
        "C/noext",
        "C/a.jpgx",
        "C/b.jpeg.bak",
        "C/jpg",
        "a/img.jpg",
        "a/sub/c.jpg",
        "a/sub b/f.jpg",
        "a/sub/deep/d.jpg",
        "a/sub2/e.jpeg",
        "b/k.jpg",
        "b/Z.jpg",
        "b/\xc3\xbcn\xc3\xaf.jpg",
        "toplevel.jpg",
    };
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++)
        put(root, files[k], k * 37);
    /* A symlinked directory outside the tree, and a loop back to the class. */
    put(tu_tmpdir(), "outside/o.jpg", 5);
    char p[1024];
    snprintf(p, sizeof p, "%s/a/link", root);
    REQUIRE(symlink("../../outside", p) == 0);
    snprintf(p, sizeof p, "%s/a/sub/loop", root);
    REQUIRE(symlink("..", p) == 0);
    /* A regular file in root, next to the classes, is ignored (toplevel.jpg). */
    return root;
}

static const fexp k_tree_expected[] = {
    {".hid/x.png", 0},
    {"C/.jpg", 1},
    {"C/1.JPG", 1},
    {"C/2.Png", 1},
    {"C/u.ppm", 1},
    {"C/v.pgm", 1},
    {"C/w.bmp", 1},
    {"C/x.tif", 1},
    {"C/y.TIFF", 1},
    {"C/z.WebP", 1},
    {"a/img.jpg", 2},
    {"a/link/o.jpg", 2},
    {"a/sub/c.jpg", 2},
    {"a/sub b/f.jpg", 2},
    {"a/sub/deep/d.jpg", 2},
    {"a/sub2/e.jpeg", 2},
    {"b/Z.jpg", 3},
    {"b/k.jpg", 3},
    {"b/\xc3\xbcn\xc3\xaf.jpg", 3},
};
#define N_TREE (sizeof k_tree_expected / sizeof k_tree_expected[0])

static uint64_t file_hash(const char *root, const char *rel, uint64_t *len)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    size_t n = 0;
    void *d = tu_read_file(p, &n);
    REQUIRE(d);
    uint64_t h = tu_hash(0, d, n);
    free(d);
    *len = n;
    return h;
}

static void test_folder_torchvision_order(void)
{
    const char *root = build_tree();
    static run r;
    for (int slash = 0; slash <= 1; slash++) {
        char rootarg[1024];
        snprintf(rootarg, sizeof rootarg, "%s%s", root, slash ? "/" : "");
        tu_cfg c = {.path = rootarg, .bs = 3, .threads = 3};
        stk_loader *l;
        int rc = tu_open_cfg(&l, &c);
        if (rc)
            fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
        REQUIRE(rc == STK_OK);
        stk_info info = {.struct_size = sizeof info};
        CHECK_EQ(stk_loader_info(l, &info), STK_OK);
        CHECK_EQ(info.num_samples, N_TREE);
        CHECK_EQ(info.num_classes, 4);
        CHECK_EQ(info.kind, STK_BATCH_VARIABLE);
        CHECK(!strcmp(info.source_kind, "folder"));
        r.n = 0;
        r.batches = 0;
        CHECK_EQ(drain(l, &r), STK_END);
        CHECK_EQ(r.n, N_TREE);
        for (size_t k = 0; k < r.n && k < N_TREE; k++) {
            uint64_t len;
            uint64_t h = file_hash(root, k_tree_expected[k].rel, &len);
            CHECK_EQ(r.s[k].index, k);
            CHECK_EQ(r.s[k].label, k_tree_expected[k].label);
            CHECK_EQ(r.s[k].len, len);
            if (r.s[k].hash != h || r.s[k].label != k_tree_expected[k].label)
                fprintf(stderr, "    sample %zu: expected %s\n", k, k_tree_expected[k].rel);
            CHECK(r.s[k].hash == h);
        }
        stk_loader_close(l);
    }
}

static void test_folder_batch_layout(void)
{
    const char *root = tu_path("tree");
    tu_cfg c = {.path = root, .bs = 4, .threads = 2};
    stk_loader *l;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->kind, STK_BATCH_VARIABLE);
    CHECK_EQ(b->dtype, STK_DTYPE_UINT8);
    CHECK_EQ(b->size, 4);
    CHECK_EQ(b->epoch, 0);
    CHECK_EQ(b->index, 0);
    /* Samples do not overlap in the arena. */
    for (size_t i = 0; i < b->size; i++)
        for (size_t j = i + 1; j < b->size; j++)
            CHECK(b->offsets[i] + b->lengths[i] <= b->offsets[j] ||
                  b->offsets[j] + b->lengths[j] <= b->offsets[i]);
    for (size_t i = 0; i < 3 * b->size; i++)
        CHECK_EQ(b->dims[i], 0);
    stk_batch_release(b);
    stk_loader_close(l);
}

/* A symlink loop is detected and open still finishes, listing every file
 * once; a symlink to a file is a sample like any other. */
static void test_folder_symlink_loops(void)
{
    const char *root = tu_path("loops");
    put(root, "cls/a.jpg", 1);
    put(root, "cls/d1/d2/b.jpg", 2);
    char p[1024];
    snprintf(p, sizeof p, "%s/cls/d1/d2/up", root);
    REQUIRE(symlink("../..", p) == 0); /* back to cls */
    snprintf(p, sizeof p, "%s/cls/d1/self", root);
    REQUIRE(symlink(".", p) == 0);
    snprintf(p, sizeof p, "%s/cls/alias.png", root);
    REQUIRE(symlink("a.jpg", p) == 0);
    tu_cfg c = {.path = root, .bs = 2};
    stk_loader *l;
    int rc = tu_open_cfg(&l, &c);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_info info = {.struct_size = sizeof info};
    stk_loader_info(l, &info);
    CHECK_EQ(info.num_samples, 3); /* a.jpg, alias.png, d1/d2/b.jpg */
    static run r;
    r.n = 0;
    CHECK_EQ(drain(l, &r), STK_END);
    CHECK_EQ(r.n, 3);
    uint64_t len;
    CHECK(r.s[0].hash == file_hash(root, "cls/a.jpg", &len));
    CHECK(r.s[1].hash == file_hash(root, "cls/a.jpg", &len));
    CHECK(r.s[2].hash == file_hash(root, "cls/d1/d2/b.jpg", &len));
    stk_loader_close(l);
}

/* The per-sample budget: a file of exactly the budget fits; one byte more
 * fails with STK_ETOOBIG naming the file, and is never truncated. */
static void test_folder_sample_budget(void)
{
    const char *root = tu_path("budget");
    char p[1024];
    static const size_t sizes[] = {0, 1, 99, 100, 101, 5000};
    static uint8_t data[5000];
    for (size_t k = 0; k < sizeof data; k++)
        data[k] = (uint8_t)(k * 13);
    tu_mkdirs(tu_path("budget/c"));
    for (size_t k = 0; k < 6; k++) {
        snprintf(p, sizeof p, "%s/c/%zu_%zu.jpg", root, k, sizes[k]);
        tu_write_file(p, data, sizes[k]);
    }
    for (int policy = 0; policy <= 1; policy++) {
        tu_cfg c = {.path = root, .bs = 6, .max_sample = 100, .on_error = policy, .threads = 2};
        stk_loader *l;
        REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (policy == STK_ON_ERROR_RAISE) {
            CHECK_EQ(rc, STK_ESAMPLE);
            snprintf(p, sizeof p, "%s/c/4_101.jpg", root);
            const char *m = stk_loader_errmsg(l);
            if (!strstr(m, p))
                fprintf(stderr, "    errmsg \"%s\" does not name %s\n", m, p);
            CHECK(strstr(m, p) != NULL);
            rc = stk_loader_next(l, &b);
        }
        REQUIRE(rc == STK_OK);
        CHECK_EQ(b->size, 4);
        for (size_t k = 0; k < b->size; k++) {
            size_t want = sizes[b->indices[k]];
            CHECK(want <= 100);
            CHECK_EQ(b->lengths[k], want);
            CHECK(!memcmp((const uint8_t *)b->data + b->offsets[k], data, want));
        }
        stk_batch_release(b);
        CHECK_EQ(stk_loader_next(l, &b), STK_END);
        CHECK_EQ(stk_loader_error_count(l), 2);
        for (size_t k = 0; k < 2; k++) {
            stk_sample_error e;
            REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
            CHECK_EQ(e.code, STK_ETOOBIG);
            CHECK(e.sample == 4 || e.sample == 5);
            snprintf(p, sizeof p, "%s/c/%llu_%zu.jpg", root, (unsigned long long)e.sample,
                     sizes[e.sample]);
            CHECK(!strcmp(e.path, p));
            CHECK(strstr(e.reason, "budget") != NULL);
        }
        stk_loader_close(l);
    }
}

static void test_folder_bad_trees(void)
{
    stk_loader *l;
    tu_cfg c = {.path = tu_path("does/not/exist")};
    CHECK_EQ(tu_open_cfg(&l, &c), STK_ENOENT);
    CHECK(strstr(stk_loader_errmsg(l), c.path) != NULL);
    stk_loader_close(l);

    tu_mkdirs(tu_path("empty"));
    c.path = tu_path("empty");
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EEMPTY);
    CHECK(strstr(stk_loader_errmsg(l), c.path) != NULL);
    stk_loader_close(l);

    put(tu_path("flat"), "a.jpg", 0);
    put(tu_path("flat"), "b.jpg", 0);
    c.path = tu_path("flat");
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EEMPTY);
    CHECK(strstr(stk_loader_errmsg(l), "class") != NULL);
    stk_loader_close(l);

    /* One class without images (only other files, or an empty subfolder). */
    put(tu_path("noimg"), "good/a.jpg", 0);
    put(tu_path("noimg"), "textonly/readme.txt", 0);
    tu_mkdirs(tu_path("noimg/textonly/emptysub"));
    c.path = tu_path("noimg");
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EEMPTY);
    CHECK(strstr(stk_loader_errmsg(l), "textonly") != NULL);
    stk_loader_close(l);

    /* A rank with no batch. */
    put(tu_path("tiny"), "c/a.jpg", 0);
    put(tu_path("tiny"), "c/b.jpg", 0);
    tu_cfg t = {.path = tu_path("tiny"), .bs = 1, .world = 3, .rank = 2, .drop_last = 1};
    CHECK_EQ(tu_open_cfg(&l, &t), STK_EEMPTY);
    CHECK(stk_loader_errmsg(l)[0] != 0);
    stk_loader_close(l);
}

/* A failed loader answers only errmsg (and close); everything else is
 * STK_EMISUSE, and errmsg keeps the open error. */
static void test_failed_handle(void)
{
    stk_loader *l = NULL;
    tu_cfg c = {.path = tu_path("missing-dir")};
    CHECK_EQ(tu_open_cfg(&l, &c), STK_ENOENT);
    REQUIRE(l != NULL);
    stk_batch *b = (stk_batch *)1;
    CHECK_EQ(stk_loader_next(l, &b), STK_EMISUSE);
    CHECK(b == NULL);
    CHECK_EQ(stk_loader_next_timeout(l, &b, 1), STK_EMISUSE);
    stk_info info = {.struct_size = sizeof info};
    stk_stats st = {.struct_size = sizeof st};
    stk_state s = {.struct_size = sizeof s};
    stk_stage_stats ts = {.struct_size = sizeof ts};
    stk_sample_error e;
    CHECK_EQ(stk_loader_info(l, &info), STK_EMISUSE);
    CHECK_EQ(stk_loader_stats(l, &st), STK_EMISUSE);
    CHECK_EQ(stk_loader_thread_stats(l, 0, 0, &ts), STK_EMISUSE);
    CHECK_EQ(stk_loader_stage_stats(l, 0, &ts), STK_EMISUSE);
    CHECK_EQ(stk_loader_get_state(l, &s), STK_EMISUSE);
    CHECK_EQ(stk_loader_set_state(l, &s), STK_EMISUSE);
    CHECK_EQ(stk_loader_set_epoch(l, 1), STK_EMISUSE);
    CHECK_EQ(stk_loader_error_get(l, 0, &e), STK_EMISUSE);
    CHECK_EQ(stk_loader_error_count(l), 0);
    CHECK_EQ(stk_loader_memory_bound(l), 0);
    CHECK(strstr(stk_loader_errmsg(l), "missing-dir") != NULL);
    stk_loader_close(l);
}

/* An unreadable sample: a dangling symlink and a symlink to a device (both
 * fail as root too), and a chmod 000 file when not running as root. */
static void test_folder_unreadable(void)
{
    const char *root = tu_path("unread");
    put(root, "c/a.jpg", 1);
    put(root, "c/d.jpg", 4);
    put(root, "c/e.jpg", 5);
    put(root, "c/g.jpg", 5);
    char p[1024];
    snprintf(p, sizeof p, "%s/c/b.jpg", root);
    REQUIRE(symlink("no-such-target.jpg", p) == 0);
    snprintf(p, sizeof p, "%s/c/c.jpg", root);
    REQUIRE(symlink("/dev/null", p) == 0);
    int expect_bad = 2;
    snprintf(p, sizeof p, "%s/c/f.jpg", root);
    tu_write_file(p, "secret", 6);
    chmod(p, 0);
    int fd = open(p, O_RDONLY);
    if (fd >= 0) {
        close(fd);
        printf("    (running as root: chmod 000 does not block reads; f.jpg stays readable)\n");
    } else {
        expect_bad = 3;
    }
    for (int policy = 0; policy <= 1; policy++) {
        tu_cfg c = {.path = root, .bs = 7, .on_error = policy};
        stk_loader *l;
        REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
        stk_batch *b;
        int rc = stk_loader_next(l, &b);
        if (policy == STK_ON_ERROR_RAISE) {
            CHECK_EQ(rc, STK_ESAMPLE);
            /* The first failed sample in order is named. */
            snprintf(p, sizeof p, "%s/c/b.jpg", root);
            const char *m = stk_loader_errmsg(l);
            if (!strstr(m, p))
                fprintf(stderr, "    errmsg \"%s\" does not name %s\n", m, p);
            CHECK(strstr(m, p) != NULL);
            rc = stk_loader_next(l, &b);
        }
        REQUIRE(rc == STK_OK);
        CHECK_EQ(b->size, 7 - (size_t)expect_bad);
        for (size_t k = 0; k < b->size; k++)
            CHECK(b->indices[k] != 1 && b->indices[k] != 2);
        stk_batch_release(b);
        CHECK_EQ(stk_loader_next(l, &b), STK_END);
        stk_stats st = {.struct_size = sizeof st};
        stk_loader_stats(l, &st);
        CHECK_EQ(policy ? st.samples_skipped : st.samples_failed, expect_bad);
        CHECK_EQ(policy ? st.samples_failed : st.samples_skipped, 0);
        CHECK_EQ(st.samples_delivered, 7 - expect_bad);
        CHECK_EQ(stk_loader_error_count(l), expect_bad);
        int seen_dangling = 0, seen_dev = 0;
        for (size_t k = 0; k < stk_loader_error_count(l); k++) {
            stk_sample_error e;
            REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
            CHECK_EQ(e.code, STK_EIO);
            CHECK(strstr(e.path, root) == e.path);
            if (e.sample == 1) {
                seen_dangling = 1;
                CHECK(strstr(e.reason, "No such file") != NULL);
            }
            if (e.sample == 2) {
                seen_dev = 1;
                CHECK(strstr(e.reason, "regular") != NULL);
            }
        }
        CHECK(seen_dangling && seen_dev);
        stk_sample_error e;
        CHECK_EQ(stk_loader_error_get(l, (size_t)expect_bad, &e), STK_EINVAL);
        stk_loader_close(l);
    }
}

/* A file deleted mid-epoch: under raise, next() reports it by path and the
 * following call delivers the batch without it; under skip the batch is one
 * smaller. Either way the other samples are exactly the clean run's, and
 * batches delivered before are intact. */
static void test_folder_file_vanishes(void)
{
    const char *root = tu_path("vanish");
    char p[1024];
    for (int k = 0; k < 24; k++) {
        snprintf(p, sizeof p, "c%d/f%02d.png", k % 3, k);
        put(root, p, (size_t)k * 11);
    }
    static run clean, got;
    tu_cfg c = {.path = root, .bs = 4, .depth = 2, .threads = 3, .shuffle = 1, .seed = 9};
    stk_loader *l;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    clean.n = clean.batches = 0;
    CHECK_EQ(drain(l, &clean), STK_END);
    stk_loader_close(l);
    REQUIRE(clean.n == 24);
    /* The victim: the second sample of batch 3 in the shuffled order. */
    uint64_t victim = clean.s[3 * 4 + 1].index;

    for (int policy = 0; policy <= 1; policy++) {
        /* Recreate the victim, then open again. */
        for (int k = 0; k < 24; k++) {
            snprintf(p, sizeof p, "c%d/f%02d.png", k % 3, k);
            put(root, p, (size_t)k * 11);
        }
        c.on_error = policy;
        REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
        got.n = got.batches = 0;
        stk_batch *b0, *b1;
        /* Hold both ring buffers: batches 0 and 1 are done, nothing else read. */
        REQUIRE(stk_loader_next(l, &b0) == STK_OK);
        REQUIRE(stk_loader_next(l, &b1) == STK_OK);
        /* The sample order is class-major: index k is class k / 8. */
        char vpath[1024];
        snprintf(vpath, sizeof vpath, "%s/c%llu/f%02llu.png", root,
                 (unsigned long long)(victim / 8),
                 (unsigned long long)((victim % 8) * 3 + victim / 8));
        REQUIRE(unlink(vpath) == 0);
        add_batch(&got, b0);
        add_batch(&got, b1);
        stk_batch_release(b0);
        stk_batch_release(b1);
        int raised = 0;
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            if (rc == STK_ESAMPLE) {
                raised++;
                CHECK_EQ(policy, STK_ON_ERROR_RAISE);
                const char *m = stk_loader_errmsg(l);
                if (!strstr(m, vpath))
                    fprintf(stderr, "    errmsg \"%s\" does not name %s\n", m, vpath);
                CHECK(strstr(m, vpath) != NULL);
                REQUIRE(raised < 3);
                continue;
            }
            REQUIRE(rc == STK_OK);
            if (b->index == 3)
                CHECK_EQ(b->size, 3);
            add_batch(&got, b);
            stk_batch_release(b);
        }
        CHECK_EQ(raised, policy ? 0 : 1);
        CHECK_EQ(got.n, 23);
        size_t j = 0;
        for (size_t k = 0; k < clean.n && j < got.n; k++) {
            if (clean.s[k].index == victim)
                continue;
            CHECK_EQ(got.s[j].index, clean.s[k].index);
            CHECK_EQ(got.s[j].batch, clean.s[k].batch);
            CHECK_EQ(got.s[j].label, clean.s[k].label);
            CHECK(got.s[j].hash == clean.s[k].hash);
            j++;
        }
        stk_stats st = {.struct_size = sizeof st};
        stk_loader_stats(l, &st);
        CHECK_EQ(policy ? st.samples_skipped : st.samples_failed, 1);
        CHECK_EQ(st.samples_delivered, 23);
        CHECK_EQ(st.batches_delivered, 6);
        CHECK_EQ(stk_loader_error_count(l), 1);
        stk_sample_error e;
        REQUIRE(stk_loader_error_get(l, 0, &e) == STK_OK);
        CHECK_EQ(e.sample, victim);
        CHECK_EQ(e.code, STK_EIO);
        CHECK(!strcmp(e.path, vpath));
        stk_loader_close(l);
    }
}

static void test_options_validation(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set_source(o, NULL), STK_EINVAL);
    CHECK_EQ(stk_options_set_source(o, ""), STK_EINVAL);
    CHECK_EQ(stk_options_set_batch_size(o, 0), STK_EINVAL);
    CHECK_EQ(stk_options_set_threads(o, 257), STK_EINVAL);
    CHECK_EQ(stk_options_set_depth(o, 0), STK_EINVAL);
    CHECK_EQ(stk_options_set_depth(o, 64), STK_EINVAL); /* 1..63 batches ahead */
    CHECK_EQ(stk_options_set_depth(o, 63), STK_OK);
    CHECK_EQ(stk_options_set_partition(o, 2, 2), STK_EINVAL);
    CHECK_EQ(stk_options_set_partition(o, 0, 0), STK_EINVAL);
    CHECK_EQ(stk_options_set_on_error(o, 7), STK_EINVAL);
    CHECK_EQ(stk_options_set_max_sample_bytes(o, 0), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "no-such-key", "1"), STK_EINVAL);
    CHECK_EQ(stk_options_set_transform(o, NULL), STK_EINVAL);
    CHECK_EQ(stk_options_set_batch_size(NULL, 1), STK_EINVAL);
    CHECK_EQ(stk_options_set_source(NULL, "x"), STK_EINVAL);
    /* No source set: open fails cleanly with a message. */
    stk_loader *l;
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(stk_loader_errmsg(l)[0] != 0);
    stk_loader_close(l);
    CHECK_EQ(stk_loader_open(NULL, o), STK_EINVAL);
    stk_options_destroy(o);
    stk_options_destroy(NULL);
    for (int k = -12; k <= 3; k++)
        CHECK(stk_strerror(k) != NULL && stk_strerror(k)[0]);
    CHECK(!strcmp(stk_stage_name(STK_STAGE_READ), "read"));
    CHECK(!strcmp(stk_stage_name(99), "?"));
    CHECK(!strcmp(stk_version(), STK_VERSION_STRING));
}

int main(void)
{
    tu_begin("test_sources", 60);
    RUN(test_records_dense_labels);
    RUN(test_records_bad_files);
    RUN(test_records_truncated_mid_epoch);
    RUN(test_folder_torchvision_order);
    RUN(test_folder_batch_layout);
    RUN(test_folder_symlink_loops);
    RUN(test_folder_sample_budget);
    RUN(test_folder_bad_trees);
    RUN(test_failed_handle);
    RUN(test_folder_unreadable);
    RUN(test_folder_file_vanishes);
    RUN(test_options_validation);
    return tu_end();
}
