/* test_fields_loader.c -- samples with several fields through the loader
 * (docs/multimodal.md) on the sources that have the generic fields today:
 * a folder (image, label), CIFAR (image, label) and records (data, label).
 * The first image field is bit-identical to the loader without fields (dense
 * and variable outputs); an image as bytes is the file's bytes; a second
 * image field draws on its own, deterministically; batches are identical
 * for 1, 2 and 8 threads and after a mid-epoch resume; skipped samples
 * leave every column lined up; errors name the field; field_memory bounds
 * the variable fields and shows in the memory bound. Also run under
 * ThreadSanitizer. */
#include "testutil.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define RRC "RandomResizedCrop(16)|RandomHorizontalFlip()"

/* ---- datasets --------------------------------------------------------------- */

#define NF 24 /* folder samples: c0/img00..11, c1/img12..23 */
static uint8_t *g_file[NF];
static size_t g_len[NF];

/* A folder of NF JPEGs of several sizes in two classes; `bad` lists indices
 * written as a text instead (a sample whose image does not decode). */
static const char *make_folder(const char *name, const int *bad, size_t nbad)
{
    static char roots[4][600];
    static int used;
    char *root = roots[used++ % 4];
    snprintf(root, 600, "%s", tu_path(name));
    for (int i = 0; i < NF; i++) {
        char dir[700], file[800];
        snprintf(dir, sizeof dir, "%s/c%d", root, i / 12);
        tu_mkdirs(dir);
        snprintf(file, sizeof file, "%s/img%02d.jpg", dir, i);
        bool is_bad = false;
        for (size_t k = 0; k < nbad; k++)
            is_bad |= bad[k] == i;
        if (is_bad) {
            char text[64];
            int n = snprintf(text, sizeof text, "sample %d is no image, caf\xc3\xa9", i);
            tu_write_file(file, text, (size_t)n);
            continue;
        }
        if (!g_file[i]) {
            uint32_t w = 24 + (uint32_t)(i % 5) * 4, h = 20 + (uint32_t)(i % 3) * 6;
            uint8_t *rgb = malloc(w * h * 3);
            REQUIRE(rgb);
            uint32_t x = 2463534242u + (uint32_t)i * 977u;
            for (size_t k = 0; k < w * h * 3; k++) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                rgb[k] = (uint8_t)((k * 3 + (size_t)i * 40) % 256 / 2 + (x & 63));
            }
            g_file[i] = tu_jpeg(rgb, w, h, 90, &g_len[i]);
            REQUIRE(g_file[i]);
            free(rgb);
        }
        tu_write_file(file, g_file[i], g_len[i]);
    }
    return root;
}

static const char *clean_folder(void)
{
    static const char *root;
    if (!root)
        root = make_folder("clean", NULL, 0);
    return root;
}

/* ---- opening ---------------------------------------------------------------- */

typedef struct fadd {
    const char *name, *sources;
    int kind;
    const char *transform;
    unsigned flags;
} fadd;

/* tu_open_cfg plus fields: a --fields text and/or stk_options_add_field calls. */
static int open_f(stk_loader **l, const tu_cfg *c, const char *fields, const fadd *adds,
                  size_t nadds)
{
    stk_options *o = tu_cfg_options(c);
    if (fields && stk_options_set_fields(o, fields) != STK_OK) {
        fprintf(stderr, "    fields '%s': %s\n", fields, stk_options_errmsg(o));
        REQUIRE(0);
    }
    for (size_t k = 0; k < nadds; k++)
        if (stk_options_add_field(o, adds[k].name, adds[k].sources, adds[k].kind, adds[k].transform,
                                  adds[k].flags) != STK_OK) {
            fprintf(stderr, "    add_field '%s': %s\n", adds[k].name, stk_options_errmsg(o));
            REQUIRE(0);
        }
    int rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    return rc;
}

static stk_loader *must_open(const tu_cfg *c, const char *fields, const fadd *adds, size_t nadds)
{
    stk_loader *l = NULL;
    int rc = open_f(&l, c, fields, adds, nadds);
    if (rc)
        fprintf(stderr, "    open %s (fields %s): %s\n", c->path, fields ? fields : "-",
                stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    return l;
}

static const stk_field *field_named(const stk_batch *b, const char *name)
{
    for (size_t k = 0; k < b->nfields; k++)
        if (!strcmp(b->fields[k].name, name))
            return &b->fields[k];
    return NULL;
}

/* Sample k of a field: its bytes and length. */
static const uint8_t *fsample(const stk_field *f, size_t k, size_t *n)
{
    if (f->layout == STK_BATCH_DENSE) {
        *n = f->sample_bytes;
        return (const uint8_t *)f->data + k * f->sample_bytes;
    }
    *n = f->lengths[k];
    return (const uint8_t *)f->data + f->offsets[k];
}

static uint64_t field_hash(uint64_t h, const stk_batch *b, const stk_field *f)
{
    h = tu_hash(h, f->name, strlen(f->name));
    h = tu_hash(h, &f->kind, sizeof f->kind);
    h = tu_hash(h, &f->layout, sizeof f->layout);
    for (size_t k = 0; k < b->size; k++) {
        size_t n;
        const uint8_t *p = fsample(f, k, &n);
        h = tu_hash(h, &n, sizeof n);
        h = tu_hash(h, p, n);
        if (f->shapes)
            h = tu_hash(h, &f->shapes[k * (STK_FIELD_MAXDIM + 1)],
                        (STK_FIELD_MAXDIM + 1) * sizeof *f->shapes);
        if (f->present)
            h = tu_hash(h, &f->present[k], 1);
    }
    return h;
}

/* Everything a batch shows: the classic view and every field. */
static uint64_t batch_hash(const stk_batch *b)
{
    uint64_t h = tu_hash(0, &b->epoch, sizeof b->epoch);
    h = tu_hash(h, &b->index, sizeof b->index);
    h = tu_hash(h, &b->size, sizeof b->size);
    h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
    h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
    for (size_t k = 0; k < b->nfields; k++)
        h = field_hash(h, b, &b->fields[k]);
    return h;
}

/* Hashes of every batch from the loader's position to the end of `epochs`
 * epochs. */
static size_t run_hashes(stk_loader *l, int epochs, uint64_t *out, size_t cap)
{
    size_t n = 0;
    for (int e = 0; e < epochs; e++)
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            if (rc)
                fprintf(stderr, "    next: %s\n", stk_loader_errmsg(l));
            REQUIRE(rc == STK_OK);
            REQUIRE(n < cap);
            out[n++] = batch_hash(b);
            stk_batch_release(b);
        }
    return n;
}

/* One image of the classic view. */
static const uint8_t *view_sample(const stk_batch *b, size_t k, size_t *n)
{
    if (b->kind == STK_BATCH_DENSE) {
        *n = b->sample_bytes;
        return (const uint8_t *)b->data + k * b->sample_bytes;
    }
    *n = b->lengths[k];
    return (const uint8_t *)b->data + b->offsets[k];
}

/* ---- the first image field is the loader without fields -------------------- */

/* Compares two loaders batch by batch over two epochs: sizes, indices,
 * labels, the view's images (and dims); in `f` the fields "image" and
 * "label" are checked against the view. */
static void compare_plain(stk_loader *plain, stk_loader *f, bool transformed)
{
    size_t batches = 0;
    for (int e = 0; e < 2; e++)
        for (;;) {
            stk_batch *a, *b;
            int ra = stk_loader_next(plain, &a), rb = stk_loader_next(f, &b);
            CHECK_EQ(ra, rb);
            if (ra != STK_OK || rb != STK_OK) {
                if (ra == STK_OK)
                    stk_batch_release(a);
                if (rb == STK_OK)
                    stk_batch_release(b);
                break;
            }
            batches++;
            CHECK_EQ(a->nfields, 0);
            CHECK(a->fields == NULL);
            CHECK_EQ(b->size, a->size);
            CHECK_EQ(b->kind, a->kind);
            CHECK_EQ(b->dtype, a->dtype);
            CHECK_EQ(b->sample_bytes, a->sample_bytes);
            CHECK(!memcmp(b->indices, a->indices, a->size * sizeof *a->indices));
            CHECK(!memcmp(b->labels, a->labels, a->size * sizeof *a->labels));
            REQUIRE(b->nfields == 2);
            const stk_field *img = field_named(b, "image"), *lab = field_named(b, "label");
            REQUIRE(img && lab);
            CHECK(img == &b->fields[0]);
            CHECK_EQ(img->kind, STK_FIELD_IMAGE);
            CHECK(!strcmp(img->source, "image"));
            CHECK(img->data == b->data);
            CHECK_EQ(img->layout, b->kind);
            CHECK(img->present == NULL);
            CHECK_EQ(lab->kind, STK_FIELD_INT);
            CHECK_EQ(lab->layout, STK_BATCH_DENSE);
            CHECK_EQ(lab->dtype, STK_DTYPE_INT64);
            CHECK_EQ(lab->sample_bytes, 8);
            CHECK(!memcmp(lab->data, a->labels, a->size * 8));
            for (size_t k = 0; k < a->size; k++) {
                size_t na, nb, nf;
                const uint8_t *pa = view_sample(a, k, &na), *pb = view_sample(b, k, &nb);
                const uint8_t *pf = fsample(img, k, &nf);
                CHECK_EQ(na, nb);
                CHECK_EQ(na, nf);
                CHECK(na == nb && !memcmp(pa, pb, na));
                CHECK(pf == pb);
                CHECK(!memcmp(&a->dims[3 * k], &b->dims[3 * k], 3 * sizeof *a->dims));
                if (img->layout == STK_BATCH_VARIABLE) {
                    const int64_t *sh = &img->shapes[k * (STK_FIELD_MAXDIM + 1)];
                    if (transformed) {
                        CHECK_EQ(sh[0], 3);
                        CHECK_EQ(sh[1], b->dims[3 * k]);
                        CHECK_EQ(sh[2], b->dims[3 * k + 1]);
                        CHECK_EQ(sh[3], b->dims[3 * k + 2]);
                        CHECK_EQ((int64_t)nb, sh[1] * sh[2] * sh[3]);
                    } else {
                        CHECK_EQ(sh[0], 0);
                    }
                }
            }
            stk_batch_release(a);
            stk_batch_release(b);
        }
    CHECK_EQ(batches, 2 * ((NF + 4) / 5));
}

static void test_folder_image_label_identical(void)
{
    const char *root = clean_folder();
    static const char *specs[] = {RRC, "Resize(12)|RandomHorizontalFlip()", "none"};
    for (int s = 0; s < 3; s++) {
        tu_cfg c = {
            .path = root, .bs = 5, .threads = 2, .seed = 5, .shuffle = 1, .transform = specs[s]};
        stk_loader *plain = must_open(&c, NULL, NULL, 0);
        stk_loader *f = must_open(&c, "image,label", NULL, 0);
        compare_plain(plain, f, s < 2);
        stk_loader_close(plain);
        stk_loader_close(f);
    }
}

/* CIFAR: raw pixels through the image pipeline, and as their bytes. */
static void test_cifar(void)
{
    enum { N = 20, REC = 3073 };
    const char *dir = tu_path("cifar");
    tu_mkdirs(dir);
    uint8_t *buf = malloc(N * REC);
    REQUIRE(buf);
    for (size_t i = 0; i < N; i++) {
        buf[i * REC] = (uint8_t)(i % 10);
        for (size_t k = 1; k < REC; k++)
            buf[i * REC + k] = (uint8_t)(i * 31 + k * 7 + (k * k >> 5));
    }
    char file[700];
    snprintf(file, sizeof file, "%s/data_batch_1.bin", dir);
    tu_write_file(file, buf, N * REC);
    static const char *specs[] = {"RandomCrop(32, padding=4)|RandomHorizontalFlip()", "none"};
    for (int s = 0; s < 2; s++) {
        tu_cfg c = {
            .path = dir, .bs = 6, .threads = 2, .seed = 9, .shuffle = 1, .transform = specs[s]};
        stk_loader *plain = must_open(&c, NULL, NULL, 0);
        stk_loader *f = must_open(&c, "image,label", NULL, 0);
        for (;;) {
            stk_batch *a, *b;
            int ra = stk_loader_next(plain, &a), rb = stk_loader_next(f, &b);
            REQUIRE(ra == rb);
            if (ra == STK_END)
                break;
            REQUIRE(ra == STK_OK);
            CHECK_EQ(a->size, b->size);
            CHECK_EQ(a->kind, b->kind);
            CHECK(!memcmp(a->indices, b->indices, a->size * 8));
            REQUIRE(b->nfields == 2);
            const stk_field *lab = &b->fields[1];
            for (size_t k = 0; k < a->size; k++) {
                size_t na, nb;
                const uint8_t *pa = view_sample(a, k, &na), *pb = view_sample(b, k, &nb);
                CHECK(na == nb && !memcmp(pa, pb, na));
                CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(b->indices[k] % 10));
                CHECK_EQ(b->labels[k], (int64_t)(b->indices[k] % 10));
            }
            stk_batch_release(a);
            stk_batch_release(b);
        }
        stk_loader_close(plain);
        stk_loader_close(f);
    }
    /* The image as bytes: the record's 3072 pixel bytes. */
    tu_cfg c = {.path = dir, .bs = 6, .threads = 2, .seed = 9, .shuffle = 1};
    stk_loader *l = must_open(&c, "px=image:bytes,label", NULL, 0);
    size_t seen = 0;
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *px = field_named(b, "px");
        REQUIRE(px);
        CHECK_EQ(px->kind, STK_FIELD_BYTES);
        CHECK_EQ(px->layout, STK_BATCH_VARIABLE);
        for (size_t k = 0; k < b->size; k++) {
            size_t n;
            const uint8_t *p = fsample(px, k, &n);
            CHECK(n == 3072 && !memcmp(p, buf + b->indices[k] * REC + 1, 3072));
            seen++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, N);
    stk_loader_close(l);
    free(buf);
}

/* ---- bytes -------------------------------------------------------------------- */

static void check_bytes_epoch(stk_loader *l, const char *name, bool in_view)
{
    int seen[NF] = {0};
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *f = field_named(b, name);
        REQUIRE(f);
        CHECK_EQ(f->layout, STK_BATCH_VARIABLE);
        CHECK_EQ(f->dtype, STK_DTYPE_UINT8);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < NF);
            seen[i]++;
            size_t n;
            const uint8_t *p = fsample(f, k, &n);
            CHECK(n == g_len[i] && !memcmp(p, g_file[i], n));
            CHECK_EQ(b->labels[k], (int64_t)(i / 12));
            if (in_view) {
                const uint8_t *v = view_sample(b, k, &n);
                CHECK(v == p && n == g_len[i]);
            }
            if (f->shapes)
                CHECK_EQ(f->shapes[k * (STK_FIELD_MAXDIM + 1)], 0);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (int i = 0; i < NF; i++)
        CHECK_EQ(seen[i], 1);
}

/* The image as bytes (kind bytes, or an image field with transform none) is
 * the file's bytes, whatever the loader's transform. */
static void test_image_as_bytes(void)
{
    const char *root = clean_folder();
    /* The dataset API agrees on which file is sample i. */
    stk_dataset *d = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&d, root, NULL, err, sizeof err) == STK_OK);
    for (uint64_t i = 0; i < NF; i++) {
        const void *p;
        size_t n;
        int64_t lab;
        REQUIRE(stk_dataset_read(d, i, &p, &n, &lab, err, sizeof err) == STK_OK);
        CHECK(n == g_len[i] && !memcmp(p, g_file[i], n) && lab == (int64_t)(i / 12));
    }
    CHECK_EQ(stk_dataset_field_count(d), 3);
    stk_dataset_field_info fi = {.struct_size = sizeof fi};
    CHECK_EQ(stk_dataset_field(d, 0, &fi), STK_OK);
    CHECK(!strcmp(fi.name, "image") && fi.kind == STK_FIELD_IMAGE && fi.samples == NF);
    CHECK_EQ(stk_dataset_field(d, 1, &fi), STK_OK);
    CHECK(!strcmp(fi.name, "label") && fi.kind == STK_FIELD_INT);
    CHECK_EQ(stk_dataset_field(d, 2, &fi), STK_OK);
    CHECK(!strcmp(fi.name, "path") && fi.kind == STK_FIELD_TEXT && fi.samples == NF);
    CHECK_EQ(stk_dataset_field(d, 3, &fi), STK_EINVAL);
    stk_dataset_close(d);

    tu_cfg c = {.path = root, .bs = 5, .threads = 2, .seed = 3, .shuffle = 1, .transform = RRC};
    stk_loader *l = must_open(&c, "raw=image:bytes,label", NULL, 0);
    check_bytes_epoch(l, "raw", false);
    stk_loader_close(l);
    fadd none = {"image", NULL, STK_FIELD_AUTO, "none", 0};
    l = must_open(&c, NULL, &none, 1);
    check_bytes_epoch(l, "image", true);
    stk_loader_close(l);
}

/* ---- a second image field ----------------------------------------------------- */

static const fadd k_two_images[] = {
    {"image", NULL, STK_FIELD_AUTO, NULL, 0},
    {"label", NULL, STK_FIELD_AUTO, NULL, 0},
    {"view2", "image", STK_FIELD_AUTO, RRC, 0},
    {"small", "image", STK_FIELD_IMAGE, "Resize(10)", 0},
    {"raw", "image", STK_FIELD_BYTES, NULL, 0},
};

/* The second image field with the first's transform draws other crops and
 * flips (keyed by the field), the same ones on every run; the first stays
 * the loader without fields; a variable image field has its shapes. */
static void test_second_image(void)
{
    const char *root = clean_folder();
    tu_cfg c = {.path = root, .bs = 6, .threads = 2, .seed = 11, .shuffle = 1, .transform = RRC};
    stk_loader *plain = must_open(&c, NULL, NULL, 0);
    stk_loader *f = must_open(&c, NULL, k_two_images, 5);
    stk_loader *again = must_open(&c, NULL, k_two_images, 5);
    size_t samples = 0, differ = 0;
    for (;;) {
        stk_batch *a, *b, *r;
        int ra = stk_loader_next(plain, &a), rb = stk_loader_next(f, &b),
            rr = stk_loader_next(again, &r);
        REQUIRE(ra == rb && rb == rr);
        if (ra == STK_END)
            break;
        REQUIRE(ra == STK_OK);
        REQUIRE(b->nfields == 5);
        CHECK_EQ(batch_hash(b), batch_hash(r));
        CHECK(!memcmp(a->data, b->data, a->size * a->sample_bytes));
        const stk_field *img = field_named(b, "image"), *v2 = field_named(b, "view2");
        const stk_field *sm = field_named(b, "small");
        REQUIRE(img && v2 && sm);
        CHECK_EQ(v2->kind, STK_FIELD_IMAGE);
        CHECK_EQ(v2->layout, STK_BATCH_DENSE);
        CHECK_EQ(v2->sample_bytes, img->sample_bytes);
        CHECK_EQ(v2->ndim, img->ndim);
        CHECK(!memcmp(v2->shape, img->shape, sizeof v2->shape));
        CHECK(v2->data != img->data);
        CHECK_EQ(sm->layout, STK_BATCH_VARIABLE);
        for (size_t k = 0; k < b->size; k++) {
            differ += memcmp(fsample(v2, k, &(size_t){0}), fsample(img, k, &(size_t){0}),
                             img->sample_bytes) != 0;
            samples++;
            uint64_t i = b->indices[k];
            const int64_t *sh = &sm->shapes[k * (STK_FIELD_MAXDIM + 1)];
            uint32_t w = 24 + (uint32_t)(i % 5) * 4, h = 20 + (uint32_t)(i % 3) * 6;
            CHECK_EQ(sh[0], 3);
            /* Resize(10): the shorter side becomes 10 */
            CHECK_EQ(sh[1], h <= w ? 10 : (int64_t)(h * 10 / w));
            CHECK_EQ(sh[2], h <= w ? (int64_t)(w * 10 / h) : 10);
            CHECK_EQ(sh[3], 3);
            CHECK_EQ((int64_t)sm->lengths[k], sh[1] * sh[2] * sh[3]);
        }
        stk_batch_release(a);
        stk_batch_release(b);
        stk_batch_release(r);
    }
    CHECK_EQ(samples, 2 * NF / 2); /* one epoch */
    /* Independent draws: most crops differ (a few may agree by chance). */
    CHECK(differ >= samples * 3 / 4);
    stk_loader_close(plain);
    stk_loader_close(f);
    stk_loader_close(again);

    /* The draws are keyed by the field's name: view2 in another position,
     * among other fields, draws the same; view3 with the same transform
     * draws its own. */
    static const fadd other[] = {
        {"image", NULL, STK_FIELD_AUTO, NULL, 0},
        {"view3", "image", STK_FIELD_AUTO, RRC, 0},
        {"view2", "image", STK_FIELD_AUTO, RRC, 0},
    };
    f = must_open(&c, NULL, k_two_images, 5);
    stk_loader *g = must_open(&c, NULL, other, 3);
    size_t same3 = 0;
    samples = 0;
    for (;;) {
        stk_batch *a, *b;
        int ra = stk_loader_next(f, &a), rb = stk_loader_next(g, &b);
        REQUIRE(ra == rb);
        if (ra == STK_END)
            break;
        REQUIRE(ra == STK_OK);
        const stk_field *v2a = field_named(a, "view2"), *v2b = field_named(b, "view2"),
                        *v3 = field_named(b, "view3");
        REQUIRE(v2a && v2b && v3);
        CHECK(!memcmp(v2a->data, v2b->data, a->size * v2a->sample_bytes));
        for (size_t k = 0; k < a->size; k++, samples++)
            same3 += !memcmp((const uint8_t *)v3->data + k * v3->sample_bytes,
                             (const uint8_t *)v2b->data + k * v2b->sample_bytes, v3->sample_bytes);
        stk_batch_release(a);
        stk_batch_release(b);
    }
    CHECK_EQ(samples, NF);
    CHECK(same3 <= samples / 4);
    stk_loader_close(f);
    stk_loader_close(g);
}

/* ---- threads and resume ------------------------------------------------------- */

static void test_threads_identical(void)
{
    const char *root = clean_folder();
    uint64_t ref[64], got[64];
    size_t nref = 0;
    static const unsigned threads[] = {1, 2, 8};
    static const unsigned depths[] = {1, 3, 2};
    for (int t = 0; t < 3; t++) {
        tu_cfg c = {.path = root,
                    .bs = 5,
                    .threads = threads[t],
                    .depth = depths[t],
                    .seed = 21,
                    .shuffle = 1,
                    .transform = RRC};
        stk_loader *l = must_open(&c, NULL, k_two_images, 5);
        size_t n = run_hashes(l, 2, t ? got : ref, 64);
        stk_loader_close(l);
        if (!t) {
            nref = n;
            CHECK_EQ(n, 2 * ((NF + 4) / 5));
            continue;
        }
        CHECK_EQ(n, nref);
        for (size_t k = 0; k < n && k < nref; k++)
            CHECK(got[k] == ref[k]);
    }
}

static void test_resume_mid_epoch(void)
{
    const char *root = clean_folder();
    tu_cfg c = {.path = root, .bs = 4, .threads = 2, .seed = 33, .shuffle = 1, .transform = RRC};
    stk_loader *l = must_open(&c, NULL, k_two_images, 5);
    uint64_t skip[16], ref[32], got[32];
    run_hashes(l, 1, skip, 16); /* epoch 0 */
    stk_batch *b;
    for (int k = 0; k < 2; k++) {
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        stk_batch_release(b);
    }
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
    CHECK_EQ(st.epoch, 1);
    CHECK_EQ(st.batch, 2);
    size_t nref = run_hashes(l, 2, ref, 32); /* the rest of epoch 1, and epoch 2 */
    stk_loader_close(l);
    CHECK_EQ(nref, NF / 4 - 2 + NF / 4);

    c.threads = 8;
    l = must_open(&c, NULL, k_two_images, 5);
    REQUIRE(stk_loader_set_state(l, &st) == STK_OK);
    size_t n = run_hashes(l, 2, got, 32);
    CHECK_EQ(n, nref);
    for (size_t k = 0; k < n && k < nref; k++)
        CHECK(got[k] == ref[k]);
    stk_loader_close(l);

    /* A position saved with other fields is not this loader's. */
    l = must_open(&c, "image,label", NULL, 0);
    CHECK_EQ(stk_loader_set_state(l, &st), STK_EINVAL);
    stk_loader_close(l);
}

/* ---- failures ------------------------------------------------------------------ */

static const int k_bad[] = {3, 10, 11, 17};
#define NBAD 4

static bool is_bad(uint64_t i)
{
    for (int k = 0; k < NBAD; k++)
        if ((uint64_t)k_bad[k] == i)
            return true;
    return false;
}

/* Under the skip policy a sample whose primary image fails is left out of
 * every column: indices, labels, the image, the bytes, a second image. Each
 * kept sample's entries are the ones a clean dataset gives for its index. */
static void test_skip_compacts_columns(void)
{
    const char *clean = clean_folder();
    const char *bad = make_folder("bad", k_bad, NBAD);
    tu_cfg c = {.path = clean,
                .bs = 5,
                .threads = 2,
                .seed = 8,
                .shuffle = 1,
                .transform = RRC,
                .on_error = STK_ON_ERROR_SKIP};
    /* What the clean set gives for each index (epoch 0): image and view2. */
    uint64_t want_img[NF] = {0}, want_v2[NF] = {0};
    stk_loader *l = must_open(&c, NULL, k_two_images, 5);
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *v2 = field_named(b, "view2");
        REQUIRE(v2);
        for (size_t k = 0; k < b->size; k++) {
            size_t n;
            const uint8_t *p = fsample(&b->fields[0], k, &n);
            want_img[b->indices[k]] = tu_hash(0, p, n);
            p = fsample(v2, k, &n);
            want_v2[b->indices[k]] = tu_hash(0, p, n);
        }
        stk_batch_release(b);
    }
    stk_loader_close(l);

    c.path = bad;
    l = must_open(&c, NULL, k_two_images, 5);
    size_t kept = 0;
    int seen[NF] = {0};
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *img = field_named(b, "image"), *lab = field_named(b, "label"),
                        *v2 = field_named(b, "view2"), *raw = field_named(b, "raw"),
                        *sm = field_named(b, "small");
        REQUIRE(img && lab && v2 && raw && sm);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < NF);
            CHECK(!is_bad(i));
            seen[i]++;
            CHECK_EQ(b->labels[k], (int64_t)(i / 12));
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i / 12));
            size_t n;
            const uint8_t *p = fsample(img, k, &n);
            CHECK(tu_hash(0, p, n) == want_img[i]);
            p = view_sample(b, k, &n);
            CHECK(tu_hash(0, p, n) == want_img[i]);
            p = fsample(v2, k, &n);
            CHECK(tu_hash(0, p, n) == want_v2[i]);
            p = fsample(raw, k, &n);
            CHECK(n == g_len[i] && !memcmp(p, g_file[i], n));
            uint32_t w = 24 + (uint32_t)(i % 5) * 4, h = 20 + (uint32_t)(i % 3) * 6;
            CHECK_EQ(sm->shapes[k * (STK_FIELD_MAXDIM + 1) + 2],
                     h <= w ? (int64_t)(w * 10 / h) : 10);
            kept++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(kept, NF - NBAD);
    for (int i = 0; i < NF; i++)
        CHECK_EQ(seen[i], !is_bad((uint64_t)i));
    CHECK_EQ(stk_loader_error_count(l), NBAD);
    for (size_t k = 0; k < stk_loader_error_count(l); k++) {
        stk_sample_error e;
        REQUIRE(stk_loader_error_get(l, k, &e) == STK_OK);
        CHECK(is_bad(e.sample));
        if (!strstr(e.reason, "field 'image' (image)"))
            fprintf(stderr, "    reason: %s\n", e.reason);
        CHECK(strstr(e.reason, "field 'image' (image)") != NULL);
    }
    stk_loader_close(l);
}

/* The same with a variable first image (Resize): its shapes, offsets and
 * dims are compacted with the other columns. */
static void test_skip_variable_primary(void)
{
    const char *bad = make_folder("bad3", k_bad, NBAD);
    tu_cfg c = {.path = bad,
                .bs = 5,
                .threads = 2,
                .seed = 8,
                .shuffle = 1,
                .transform = "Resize(10)",
                .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l = must_open(&c, "image,label,raw=image:bytes", NULL, 0);
    stk_batch *b;
    int rc;
    size_t kept = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *img = &b->fields[0], *raw = field_named(b, "raw");
        REQUIRE(raw);
        CHECK_EQ(img->layout, STK_BATCH_VARIABLE);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            CHECK(!is_bad(i));
            uint32_t w = 24 + (uint32_t)(i % 5) * 4, h = 20 + (uint32_t)(i % 3) * 6;
            int64_t hh = h <= w ? 10 : (int64_t)(h * 10 / w),
                    ww = h <= w ? (int64_t)(w * 10 / h) : 10;
            const int64_t *sh = &img->shapes[k * (STK_FIELD_MAXDIM + 1)];
            CHECK(sh[0] == 3 && sh[1] == hh && sh[2] == ww && sh[3] == 3);
            CHECK(b->dims[3 * k] == hh && b->dims[3 * k + 1] == ww);
            CHECK_EQ((int64_t)b->lengths[k], hh * ww * 3);
            CHECK_EQ(img->lengths[k], b->lengths[k]);
            CHECK_EQ(img->offsets[k], b->offsets[k]);
            size_t n;
            const uint8_t *p = fsample(raw, k, &n);
            CHECK(n == g_len[i] && !memcmp(p, g_file[i], n));
            kept++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(kept, NF - NBAD);
    stk_loader_close(l);
}

/* A failing field that is not the first image: fields "raw" (bytes) and
 * "t" (the same bytes as text). JPEGs are no UTF-8, the bad samples' texts
 * are: under skip, only those are kept, every column lined up; under raise
 * the error names field 't'. */
static void test_other_field_fails(void)
{
    const char *bad = make_folder("bad2", k_bad, NBAD);
    tu_cfg c = {
        .path = bad, .bs = 5, .threads = 2, .seed = 8, .shuffle = 1, .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l = must_open(&c, "raw=image:bytes,t=image:text,label", NULL, 0);
    stk_batch *b;
    int rc;
    size_t kept = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->nfields, 3);
        const stk_field *raw = field_named(b, "raw"), *t = field_named(b, "t"),
                        *lab = field_named(b, "label");
        REQUIRE(raw && t && lab);
        CHECK_EQ(t->kind, STK_FIELD_TEXT);
        CHECK(t->shapes == NULL && t->dtypes == NULL);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            CHECK(is_bad(i));
            char want[64];
            int wn = snprintf(want, sizeof want, "sample %d is no image, caf\xc3\xa9", (int)i);
            size_t n;
            const uint8_t *p = fsample(t, k, &n);
            CHECK(n == (size_t)wn && !memcmp(p, want, n));
            p = fsample(raw, k, &n);
            CHECK(n == (size_t)wn && !memcmp(p, want, n));
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i / 12));
            CHECK_EQ(b->labels[k], (int64_t)(i / 12));
            kept++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(kept, NBAD);
    CHECK_EQ(stk_loader_error_count(l), NF - NBAD);
    stk_sample_error e;
    REQUIRE(stk_loader_error_get(l, 0, &e) == STK_OK);
    CHECK(strstr(e.reason, "field 't' (image): invalid UTF-8") != NULL);
    stk_loader_close(l);

    /* Raise: the error names the field, in last_error and the message. */
    c.on_error = STK_ON_ERROR_RAISE;
    c.shuffle = 0;
    l = must_open(&c, "raw=image:bytes,t=image:text,label", NULL, 0);
    REQUIRE(stk_loader_next(l, &b) == STK_ESAMPLE);
    stk_error_info info = {.struct_size = sizeof info};
    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
    CHECK_EQ(info.has_sample, 1);
    CHECK_EQ(info.sample_code, STK_EFORMAT);
    CHECK(!strcmp(info.field, "t"));
    CHECK(strstr(info.reason, "field 't'") != NULL);
    CHECK(strstr(stk_loader_errmsg(l), "field 't'") != NULL);
    CHECK(strstr(info.path, "img0") != NULL);
    stk_loader_close(l);

    /* The primary image failing names field 'image'. */
    c.transform = RRC;
    c.bs = 4;
    l = must_open(&c, "image,label", NULL, 0);
    REQUIRE(stk_loader_next(l, &b) == STK_ESAMPLE); /* samples 0..3: 3 is bad */
    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
    CHECK_EQ(info.sample, 3);
    CHECK(!strcmp(info.field, "image"));
    CHECK(strstr(info.reason, "field 'image'") != NULL);
    /* The batch after the error comes without it, columns compacted. */
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->size, 3);
    CHECK_EQ(b->indices[2], 2);
    CHECK_EQ(((const int64_t *)b->fields[1].data)[2], 0);
    stk_batch_release(b);
    stk_loader_close(l);
}

/* Optional fields every sample has: present is all ones. (No source with
 * the generic fields lacks one in some samples: absent fields are tested
 * with the multi-field readers.) */
static void test_optional_present(void)
{
    tu_cfg c = {.path = clean_folder(), .bs = 5, .threads = 2, .transform = RRC};
    stk_loader *l = must_open(&c, "image,lab?=label,raw?=image:bytes", NULL, 0);
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK(b->fields[0].present == NULL);
        for (int f = 1; f < 3; f++) {
            REQUIRE(b->fields[f].present);
            for (size_t k = 0; k < b->size; k++)
                CHECK_EQ(b->fields[f].present[k], 1);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    stk_loader_close(l);
    /* A source field no sample has is refused at open, naming what there is. */
    CHECK(open_f(&l, &c, "image,x?=txt", NULL, 0) == STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "no field 'txt' (they have: image, label, path)") != NULL);
    stk_loader_close(l);
    /* With a device the dense fields are device memory, the variable ones
     * host memory (test_device_fields checks the bytes). */
    tu_cfg dc = c;
    dc.options[0] = "device";
    dc.options[1] = "fake";
    REQUIRE(open_f(&l, &dc, "image,label,raw?=image:bytes", NULL, 0) == STK_OK);
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->fields[0].device, STK_DEVICE_FAKE);
    CHECK_EQ(b->fields[1].device, STK_DEVICE_FAKE);
    CHECK_EQ(b->fields[2].device, STK_DEVICE_CPU);
    CHECK(b->fields[2].present != NULL);
    stk_batch_release(b);
    stk_loader_close(l);
    /* A transform on a field the source says is no image. */
    fadd t = {"lab", "label", STK_FIELD_AUTO, "Resize(8)", 0};
    CHECK(open_f(&l, &c, NULL, &t, 1) == STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "only image fields take a transform") != NULL);
    stk_loader_close(l);
}

/* field_memory bounds one batch's variable fields: a sample that does not
 * fit fails with STK_ETOOBIG saying so. */
static void test_field_memory_too_small(void)
{
    const char *dir = tu_path("big/c");
    tu_mkdirs(dir);
    uint8_t *rgb = malloc(64 * 64 * 3);
    REQUIRE(rgb);
    uint32_t x = 12345;
    for (size_t k = 0; k < 64 * 64 * 3; k++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        rgb[k] = (uint8_t)x;
    }
    size_t n;
    uint8_t *jpg = tu_jpeg(rgb, 64, 64, 95, &n);
    REQUIRE(jpg && n > 4096);
    for (int i = 0; i < 4; i++) {
        char file[800];
        snprintf(file, sizeof file, "%s/%d.jpg", dir, i);
        tu_write_file(file, jpg, n);
    }
    free(jpg);
    free(rgb);
    tu_cfg c = {.path = tu_path("big"),
                .bs = 2,
                .threads = 2,
                .transform = RRC,
                .options = {"field_memory", "4096", NULL}};
    stk_loader *l = must_open(&c, "image,raw=image:bytes", NULL, 0);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_ESAMPLE);
    stk_error_info info = {.struct_size = sizeof info};
    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
    CHECK_EQ(info.sample_code, STK_ETOOBIG);
    CHECK(!strcmp(info.field, "raw"));
    if (!strstr(info.reason, "field_memory"))
        fprintf(stderr, "    reason: %s\n", info.reason);
    CHECK(strstr(info.reason, "field_memory") != NULL);
    CHECK(strstr(info.reason, "field 'raw'") != NULL);
    stk_loader_close(l);
    /* Enough field_memory: delivered. */
    c.options[1] = "1M";
    l = must_open(&c, "image,raw=image:bytes", NULL, 0);
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    CHECK_EQ(b->size, 2);
    CHECK_EQ(b->fields[1].lengths[0], n);
    stk_batch_release(b);
    stk_loader_close(l);
}

/* Fields without any image field: labels alone, bytes and labels. */
static void test_no_image_field(void)
{
    tu_cfg c = {
        .path = clean_folder(), .bs = 5, .threads = 2, .seed = 2, .shuffle = 1, .transform = RRC};
    stk_loader *l = must_open(&c, "label", NULL, 0);
    stk_batch *b;
    int rc;
    size_t seen = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->nfields, 1);
        const stk_field *lab = &b->fields[0];
        CHECK_EQ(lab->kind, STK_FIELD_INT);
        CHECK_EQ(b->kind, STK_BATCH_DENSE);
        CHECK_EQ(b->sample_bytes, 0);
        for (size_t k = 0; k < b->size; k++) {
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(b->indices[k] / 12));
            CHECK_EQ(b->labels[k], (int64_t)(b->indices[k] / 12));
            /* no image: the view's per-sample entries say nothing */
            CHECK(b->dims[3 * k] == 0 && b->dims[3 * k + 1] == 0 && b->dims[3 * k + 2] == 0);
            CHECK_EQ(b->lengths[k], 0);
        }
        seen += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, NF);
    stk_loader_close(l);
    l = must_open(&c, "raw=image:bytes,label", NULL, 0);
    check_bytes_epoch(l, "raw", false);
    stk_loader_close(l);
}

/* Records: "data" and "label"; the data as text. */
static void test_records(void)
{
    enum { N = 30, REC = 24 };
    uint8_t buf[N * REC];
    for (int i = 0; i < N; i++) {
        uint8_t *r = buf + i * REC;
        r[0] = (uint8_t)(i % 7);
        memset(r + 1, 'a' + i % 26, REC - 1);
        if (i % 5 == 2)
            r[5] = 0xff; /* no UTF-8 */
    }
    const char *path = tu_path("rec.bin");
    tu_write_file(path, buf, sizeof buf);
    tu_cfg c = {.path = path,
                .record = REC,
                .label = 1,
                .bs = 4,
                .threads = 2,
                .seed = 4,
                .shuffle = 1,
                .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l = must_open(&c, "txt=data:text,raw=data,label", NULL, 0);
    stk_batch *b;
    int rc;
    size_t kept = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *t = field_named(b, "txt"), *raw = field_named(b, "raw"),
                        *lab = field_named(b, "label");
        REQUIRE(t && raw && lab);
        CHECK_EQ(raw->kind, STK_FIELD_BYTES);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            CHECK(i % 5 != 2);
            size_t n;
            const uint8_t *p = fsample(t, k, &n);
            CHECK(n == REC - 1 && !memcmp(p, buf + i * REC + 1, n));
            p = fsample(raw, k, &n);
            CHECK(n == REC - 1 && !memcmp(p, buf + i * REC + 1, n));
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i % 7));
            kept++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(kept, N - N / 5);
    stk_loader_close(l);
}

/* Records whose payload is a number's text: JSON, int and float fields of the
 * same bytes. "0N" is no JSON (a leading zero) but an integer and a float:
 * under skip those samples go, and the dense int64/float32 columns and the
 * JSON column stay lined up. */
static void test_records_json_numbers(void)
{
    enum { N = 40, REC = 16 };
    uint8_t buf[N * REC];
    for (int i = 0; i < N; i++) {
        uint8_t *r = buf + i * REC;
        r[0] = (uint8_t)(i % 3);
        char text[32];
        snprintf(text, sizeof text, i % 4 == 1 ? "0%d" : " %d", i * 7 - 50);
        memset(r + 1, ' ', REC - 1);
        memcpy(r + 1, text, strlen(text));
    }
    const char *path = tu_path("num.bin");
    tu_write_file(path, buf, sizeof buf);
    tu_cfg c = {.path = path,
                .record = REC,
                .label = 1,
                .bs = 6,
                .threads = 3,
                .seed = 6,
                .shuffle = 1,
                .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l = must_open(&c, "meta=data:json,n=data:int,f=data:float,label", NULL, 0);
    stk_batch *b;
    int rc;
    size_t kept = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *m = field_named(b, "meta"), *n = field_named(b, "n"),
                        *f = field_named(b, "f");
        REQUIRE(m && n && f);
        CHECK_EQ(m->kind, STK_FIELD_JSON);
        CHECK_EQ(n->layout, STK_BATCH_DENSE);
        CHECK_EQ(n->dtype, STK_DTYPE_INT64);
        CHECK_EQ(f->dtype, STK_DTYPE_FLOAT32);
        CHECK_EQ(f->sample_bytes, 4);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            CHECK(i % 4 != 1);
            int64_t v = (int64_t)i * 7 - 50;
            CHECK_EQ(((const int64_t *)n->data)[k], v);
            CHECK(((const float *)f->data)[k] == (float)v);
            size_t len;
            const uint8_t *p = fsample(m, k, &len);
            CHECK(len == REC - 1 && !memcmp(p, buf + i * REC + 1, len));
            CHECK_EQ(b->labels[k], (int64_t)(i % 3));
            kept++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(kept, N - N / 4);
    stk_sample_error e;
    REQUIRE(stk_loader_error_get(l, 0, &e) == STK_OK);
    CHECK(strstr(e.reason, "field 'meta' (data): invalid JSON") != NULL);
    stk_loader_close(l);
}

typedef struct npy_case {
    const char *name;
    size_t len;
    const char *bytes;
    int dtype;
    unsigned ndim;
    int64_t shape[8];
} npy_case;
static const npy_case k_npy[] = {
#include "test_fields_npy.inc"
};

/* Records holding a .npy array NumPy wrote (float32 (2, 3)), its values
 * changed per record; every sixth one's magic broken: the array column
 * (data, shapes, dtypes) stays lined up over the skipped ones. */
static void test_records_npy(void)
{
    const npy_case *t = &k_npy[0];
    REQUIRE(t->len == 152 && t->dtype == STK_DTYPE_FLOAT32);
    enum { N = 36 };
    size_t rec = 1 + t->len;
    uint8_t *buf = malloc(N * rec);
    REQUIRE(buf);
    for (size_t i = 0; i < N; i++) {
        uint8_t *r = buf + i * rec;
        r[0] = (uint8_t)(i % 2);
        memcpy(r + 1, t->bytes, t->len);
        for (int k = 0; k < 6; k++) {
            float v = (float)(i * 10 + (size_t)k);
            memcpy(r + 1 + t->len - 24 + 4 * k, &v, 4);
        }
        if (i % 6 == 5)
            r[2] = 'X';
    }
    const char *path = tu_path("npy.bin");
    tu_write_file(path, buf, N * rec);
    tu_cfg c = {.path = path,
                .record = rec,
                .label = 1,
                .bs = 5,
                .threads = 2,
                .seed = 1,
                .shuffle = 1,
                .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l = must_open(&c, "arr=data:npy,label", NULL, 0);
    stk_batch *b;
    int rc;
    size_t kept = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *a = field_named(b, "arr"), *lab = field_named(b, "label");
        REQUIRE(a && a->shapes && a->dtypes && lab);
        CHECK_EQ(a->kind, STK_FIELD_NPY);
        CHECK_EQ(a->layout, STK_BATCH_VARIABLE);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            CHECK(i % 6 != 5);
            const int64_t *sh = &a->shapes[k * (STK_FIELD_MAXDIM + 1)];
            CHECK(sh[0] == 2 && sh[1] == 2 && sh[2] == 3 && sh[3] == 0);
            CHECK_EQ(a->dtypes[k], STK_DTYPE_FLOAT32);
            size_t n;
            const uint8_t *p = fsample(a, k, &n);
            CHECK_EQ(n, 24);
            CHECK_EQ((uintptr_t)p % 8, 0);
            for (int j = 0; j < 6 && n == 24; j++) {
                float v;
                memcpy(&v, p + 4 * j, 4);
                CHECK(v == (float)(i * 10 + (uint64_t)j));
            }
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i % 2));
            kept++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(kept, N - N / 6);
    stk_sample_error e;
    REQUIRE(stk_loader_error_get(l, 0, &e) == STK_OK);
    CHECK(strstr(e.reason, "field 'arr' (data): is not a .npy array") != NULL);
    stk_loader_close(l);
    free(buf);
}

/* The memory bound counts field_memory once a ring buffer when a variable
 * field is asked for, and not otherwise. */
static void test_memory_bound(void)
{
    tu_cfg c = {.path = clean_folder(), .bs = 4, .threads = 2, .depth = 2, .transform = RRC};
    stk_loader *l0 = must_open(&c, NULL, NULL, 0);
    stk_loader *l1 = must_open(&c, "image,label", NULL, 0);
    stk_loader *l2 = must_open(&c, "image,label,raw=image:bytes", NULL, 0);
    c.options[0] = "field_memory";
    c.options[1] = "1M";
    stk_loader *l3 = must_open(&c, "image,label,raw=image:bytes", NULL, 0);
    stk_info info = {.struct_size = sizeof info};
    REQUIRE(stk_loader_info(l2, &info) == STK_OK);
    uint64_t nbufs = info.depth + 1;
    uint64_t b0 = stk_loader_memory_bound(l0), b1 = stk_loader_memory_bound(l1),
             b2 = stk_loader_memory_bound(l2), b3 = stk_loader_memory_bound(l3);
    CHECK(b1 > b0 && b1 - b0 < (1u << 20));
    CHECK(b2 - b1 >= nbufs * (64u << 20));
    CHECK(b2 - b1 < nbufs * ((64u << 20) + (1u << 20)));
    CHECK(b3 - b1 >= nbufs * (1u << 20));
    CHECK(b2 - b3 == nbufs * (63u << 20));
    stk_loader_close(l0);
    stk_loader_close(l1);
    stk_loader_close(l2);
    stk_loader_close(l3);
}

/* A .stk set whose samples 1, 4, 7, ... have no label (-1): "label" is a
 * field some samples lack. Required, those samples fail naming what they
 * have; optional, present is 0 there and the value 0. */
static const char *unlabeled_stk(void)
{
    static char dir[600];
    if (dir[0])
        return dir;
    clean_folder(); /* the JPEGs */
    snprintf(dir, sizeof dir, "%s", tu_path("unlabeled"));
    stk_writer_options wo = {.struct_size = sizeof wo, .num_classes = 3};
    stk_writer *w = NULL;
    char err[512];
    REQUIRE(stk_writer_open(&w, dir, &wo, err, sizeof err) == STK_OK);
    for (int i = 0; i < NF; i++) {
        char key[32];
        snprintf(key, sizeof key, "s%02d", i);
        REQUIRE(stk_writer_add(w, g_file[i], g_len[i], i % 3 == 1 ? -1 : i % 3, key) == STK_OK);
    }
    REQUIRE(stk_writer_finish(w, NULL) == STK_OK);
    stk_writer_close(w);
    return dir;
}

static void test_optional_absent(void)
{
    const char *dir = unlabeled_stk();
    tu_cfg c = {.path = dir, .bs = 5, .threads = 2, .seed = 4, .shuffle = 1, .transform = RRC};
    stk_loader *l = must_open(&c, "image,label?,raw=image:bytes", NULL, 0);
    stk_batch *b;
    int rc;
    size_t seen = 0, absent = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *lab = field_named(b, "label"), *raw = field_named(b, "raw");
        REQUIRE(lab && raw && lab->present);
        CHECK(raw->present == NULL);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            bool has = i % 3 != 1;
            CHECK_EQ(lab->present[k], has);
            CHECK_EQ(((const int64_t *)lab->data)[k], has ? (int64_t)(i % 3) : 0);
            CHECK_EQ(b->labels[k], has ? (int64_t)(i % 3) : -1);
            size_t n;
            const uint8_t *p = fsample(raw, k, &n);
            CHECK(n == g_len[i] && !memcmp(p, g_file[i], n));
            absent += !has;
            seen++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, NF);
    CHECK_EQ(absent, NF / 3);
    stk_loader_close(l);

    /* Required: the samples without one fail, naming the field and what the
     * sample has; under skip every column stays lined up. */
    c.on_error = STK_ON_ERROR_SKIP;
    l = must_open(&c, "image,label,raw=image:bytes", NULL, 0);
    seen = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *lab = field_named(b, "label"), *raw = field_named(b, "raw");
        REQUIRE(lab && raw);
        CHECK(lab->present == NULL);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            CHECK(i % 3 != 1);
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i % 3));
            size_t n;
            const uint8_t *p = fsample(raw, k, &n);
            CHECK(n == g_len[i] && !memcmp(p, g_file[i], n));
            seen++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, NF - NF / 3);
    CHECK_EQ(stk_loader_error_count(l), NF / 3);
    stk_sample_error e;
    REQUIRE(stk_loader_error_get(l, 0, &e) == STK_OK);
    CHECK_EQ(e.code, STK_EFORMAT);
    if (!strstr(e.reason, "has no field 'label' (has: image)"))
        fprintf(stderr, "    reason: %s (%s)\n", e.reason, e.path);
    CHECK(strstr(e.reason, "has no field 'label' (has: image)") != NULL);
    stk_loader_close(l);

    c.on_error = STK_ON_ERROR_RAISE;
    c.shuffle = 0;
    l = must_open(&c, "image,label", NULL, 0);
    REQUIRE(stk_loader_next(l, &b) == STK_ESAMPLE); /* sample 1 */
    stk_error_info info = {.struct_size = sizeof info};
    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
    CHECK_EQ(info.sample, 1);
    CHECK(!strcmp(info.field, "label"));
    CHECK(strstr(stk_loader_errmsg(l), "has no field 'label'") != NULL);
    stk_loader_close(l);
}

/* ---- allocation failures -------------------------------------------------------- */

long stk__alloc_live(void);
void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

/* Every field of sample k of a batch, hashed. */
static uint64_t sample_hash(const stk_batch *b, size_t k)
{
    uint64_t h = tu_hash(0, &b->labels[k], sizeof b->labels[k]);
    for (size_t f = 0; f < b->nfields; f++) {
        size_t n;
        const uint8_t *p = fsample(&b->fields[f], k, &n);
        h = tu_hash(tu_hash(h, &n, sizeof n), p, n);
        if (b->fields[f].shapes)
            h = tu_hash(h, &b->fields[f].shapes[k * (STK_FIELD_MAXDIM + 1)],
                        (STK_FIELD_MAXDIM + 1) * sizeof(int64_t));
    }
    return h;
}

/* One session with fields: options, open, an epoch. Every sample delivered
 * must equal the fault-free run's (ref, by index); a sample that failed must
 * have failed for memory. Returns STK_OK or the error that ended it. */
static int oom_session(const uint64_t *ref, uint64_t *seen)
{
    stk_options *o = NULL;
    stk_loader *l = NULL;
    int rc;
    if ((rc = stk_options_create(&o)) != STK_OK)
        return rc;
    if ((rc = stk_options_set_source(o, clean_folder())) ||
        (rc = stk_options_set_transform(o, RRC)) ||
        (rc = stk_options_set_fields(o, "image,label,raw=image:bytes,t=label:text")) ||
        (rc = stk_options_add_field(o, "view2", "image", STK_FIELD_AUTO, RRC, 0)))
        goto out;
    stk_options_set_batch_size(o, 5);
    stk_options_set_threads(o, 2);
    stk_options_set_seed(o, 3);
    if ((rc = stk_loader_open(&l, o)) != STK_OK) {
        CHECK(l == NULL || stk_loader_errmsg(l)[0] != 0);
        goto out;
    }
    for (;;) {
        stk_batch *b;
        int r = stk_loader_next(l, &b);
        if (r == STK_END)
            break;
        if (r == STK_ESAMPLE) {
            stk_error_info info = {.struct_size = sizeof info};
            CHECK_EQ(stk_loader_last_error(l, &info), STK_OK);
            CHECK_EQ(info.sample_code, STK_ENOMEM);
            continue;
        }
        CHECK_EQ(r, STK_OK);
        if (r != STK_OK)
            break;
        for (size_t k = 0; k < b->size; k++) {
            CHECK(sample_hash(b, k) == ref[b->indices[k]]);
            (*seen)++;
        }
        stk_batch_release(b);
    }
out:
    stk_loader_close(l);
    stk_options_destroy(o);
    return rc;
}

static void test_oom_sweep(void)
{
    uint64_t ref[NF] = {0}, seen = 0;
    /* The reference: the same session without failures. */
    {
        stk_options *o;
        stk_loader *l;
        REQUIRE(stk_options_create(&o) == STK_OK);
        REQUIRE(stk_options_set_source(o, clean_folder()) == STK_OK);
        REQUIRE(stk_options_set_transform(o, RRC) == STK_OK);
        REQUIRE(stk_options_set_fields(o, "image,label,raw=image:bytes,t=label:text") == STK_OK);
        REQUIRE(stk_options_add_field(o, "view2", "image", STK_FIELD_AUTO, RRC, 0) == STK_OK);
        stk_options_set_batch_size(o, 5);
        stk_options_set_threads(o, 2);
        stk_options_set_seed(o, 3);
        REQUIRE(stk_loader_open(&l, o) == STK_OK);
        stk_batch *b;
        while (stk_loader_next(l, &b) == STK_OK) {
            CHECK_EQ(b->nfields, 5);
            const stk_field *t = field_named(b, "t");
            for (size_t k = 0; k < b->size; k++) {
                ref[b->indices[k]] = sample_hash(b, k);
                size_t n;
                const uint8_t *p = fsample(t, k, &n);
                CHECK(n == 1 && p[0] == (uint8_t)('0' + b->indices[k] / 12));
            }
            stk_batch_release(b);
        }
        stk_loader_close(l);
        stk_options_destroy(o);
    }
    long live0 = stk__alloc_live();
    int fds0 = tu_count_fds();
    long n;
    int failed = 0;
    for (n = 0; n < 5000; n++) {
        long c0 = stk__alloc_count();
        seen = 0;
        stk__alloc_fail_after(n);
        int rc = oom_session(ref, &seen);
        stk__alloc_fail_after(-1);
        bool injected = stk__alloc_count() - c0 > n;
        if (rc != STK_OK && rc != STK_ENOMEM)
            fprintf(stderr, "    n=%ld: %s\n", n, stk_strerror(rc));
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        failed += rc == STK_ENOMEM;
        if (stk__alloc_live() != live0) {
            fprintf(stderr, "    n=%ld leaked %ld allocations\n", n, stk__alloc_live() - live0);
            CHECK(0);
            break;
        }
        if (tu_count_fds() != fds0) {
            fprintf(stderr, "    n=%ld leaked %d fds\n", n, tu_count_fds() - fds0);
            CHECK(0);
            break;
        }
        if (!injected) {
            CHECK_EQ(rc, STK_OK);
            CHECK_EQ(seen, NF);
            break;
        }
    }
    printf("    %ld allocation points, %d failed cleanly with ENOMEM\n", n, failed);
    CHECK(n > 20 && n < 5000);
}

/* Elastic resume: a position saved by one rank of batch 4 resumes on two
 * ranks of batch 3; the rest of the epoch is delivered exactly once across
 * them, each sample's fields the ones the unbroken run gives it (draws are
 * keyed by sample, not by batch or rank). */
static void test_elastic_resume(void)
{
    const char *root = clean_folder();
    tu_cfg c = {.path = root, .bs = 4, .threads = 2, .seed = 19, .shuffle = 1, .transform = RRC};
    uint64_t want[NF] = {0};
    stk_loader *l = must_open(&c, NULL, k_two_images, 5);
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        for (size_t k = 0; k < b->size; k++)
            want[b->indices[k]] = sample_hash(b, k);
        stk_batch_release(b);
    }
    stk_loader_close(l);

    l = must_open(&c, NULL, k_two_images, 5);
    int seen[NF] = {0};
    for (int k = 0; k < 2; k++) {
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        for (size_t j = 0; j < b->size; j++)
            seen[b->indices[j]]++;
        stk_batch_release(b);
    }
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
    stk_loader_close(l);
    for (unsigned r = 0; r < 2; r++) {
        tu_cfg e = c;
        e.bs = 3;
        e.rank = r;
        e.world = 2;
        stk_options *o;
        REQUIRE(stk_options_create(&o) == STK_OK);
        REQUIRE(stk_options_set_source(o, root) == STK_OK);
        REQUIRE(stk_options_set_batch_size(o, e.bs) == STK_OK);
        REQUIRE(stk_options_set_threads(o, 2) == STK_OK);
        REQUIRE(stk_options_set_seed(o, e.seed) == STK_OK);
        REQUIRE(stk_options_set_partition(o, r, 2) == STK_OK);
        REQUIRE(stk_options_set_transform(o, RRC) == STK_OK);
        for (size_t k = 0; k < 5; k++)
            REQUIRE(stk_options_add_field(o, k_two_images[k].name, k_two_images[k].sources,
                                          k_two_images[k].kind, k_two_images[k].transform,
                                          0) == STK_OK);
        REQUIRE(stk_loader_open(&l, o) == STK_OK);
        stk_options_destroy(o);
        rc = stk_loader_set_state(l, &st);
        if (rc)
            fprintf(stderr, "    set_state: %s\n", stk_loader_errmsg(l));
        REQUIRE(rc == STK_OK);
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            CHECK_EQ(b->epoch, 0);
            for (size_t k = 0; k < b->size; k++) {
                seen[b->indices[k]]++;
                CHECK(sample_hash(b, k) == want[b->indices[k]]);
            }
            stk_batch_release(b);
        }
        CHECK_EQ(rc, STK_END);
        stk_loader_close(l);
    }
    for (int i = 0; i < NF; i++)
        CHECK_EQ(seen[i], 1);
}

int main(void)
{
    tu_begin("test_fields_loader", 300);
    RUN(test_folder_image_label_identical);
    RUN(test_cifar);
    RUN(test_image_as_bytes);
    RUN(test_second_image);
    RUN(test_threads_identical);
    RUN(test_resume_mid_epoch);
    RUN(test_skip_compacts_columns);
    RUN(test_skip_variable_primary);
    RUN(test_other_field_fails);
    RUN(test_optional_present);
    RUN(test_optional_absent);
    RUN(test_field_memory_too_small);
    RUN(test_no_image_field);
    RUN(test_records);
    RUN(test_records_json_numbers);
    RUN(test_records_npy);
    RUN(test_memory_bound);
    RUN(test_elastic_resume);
    RUN(test_oom_sweep);
    for (int i = 0; i < NF; i++)
        free(g_file[i]);
    return tu_end();
}
