/* test_parquet.c -- Parquet files read in place (src/source/parquet.c): the
 * fixtures written by DuckDB's Parquet writer in the Hugging Face Image
 * layout (../shared/fixtures/parquet/{snappy,zstd,uncompressed}, each with
 * a manifest of what every sample holds) read through the dataset API and
 * the loader with fields, every field of every sample compared with the
 * manifest, whole epochs over 1 and 3 threads; and bad input: truncations
 * at many offsets, a footer length that lies, a page header that lies, a
 * flipped footer -- each a clear error naming the file and the row group
 * or offset, the rest delivered under the skip policy; and a sweep of
 * allocation failures over every allocation of a session. (Files with
 * dictionaries, nulls, page v2, gzip and many row groups, written by
 * DuckDB at test time: tests/py/test_parquet.py.) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "io/file.h"

#include <limits.h>
#include <stdbool.h>

#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fixtures ------------------------------------------------------------------ */

static const char *fixtures(void)
{
    return tu_fixtures("parquet");
}

static json_t *manifest(const char *variant)
{
    return tu_fixture_manifest("parquet", variant);
}

static const char *fixture(const char *variant)
{
    return tu_fixture("parquet", variant);
}

/* ---- the dataset API ----------------------------------------------------------- */

static const char *const k_fields[] = {"image", "image.bytes", "image.path", "caption",
                                       "label", "width",       "height",     "aspect"};
static const int k_kinds[] = {STK_FIELD_IMAGE, STK_FIELD_IMAGE, STK_FIELD_TEXT, STK_FIELD_TEXT,
                              STK_FIELD_INT,   STK_FIELD_INT,   STK_FIELD_INT,  STK_FIELD_FLOAT};

static void check_dataset(const char *variant)
{
    json_t *m = manifest(variant);
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_dataset *d = NULL;
    char err[512];
    int rc = stk_dataset_open(&d, fixture(variant), NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK(!strcmp(di.kind, "parquet"));
    CHECK_EQ(di.samples, n);
    CHECK_EQ(di.files, 2);
    CHECK(!strcmp(di.payload, "encoded"));
    json_t *files = json_object_get(m, "files");
    int64_t stored = 0;
    for (size_t k = 0; k < json_array_size(files); k++)
        stored += json_integer_value(json_object_get(json_array_get(files, k), "bytes"));
    CHECK_EQ(di.bytes, stored);
    int64_t maxl = -1;
    for (size_t i = 0; i < n; i++)
        if (tu_json_int(tu_manifest_sample(m, i), "label") > maxl)
            maxl = tu_json_int(tu_manifest_sample(m, i), "label");
    CHECK_EQ(di.classes, maxl + 1);
    /* stoker info's field list. */
    REQUIRE(stk_dataset_field_count(d) == 8);
    for (size_t k = 0; k < 8; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK(!strcmp(fi.name, k_fields[k]));
        CHECK_EQ(fi.kind, k_kinds[k]);
    }
    /* Without fields a sample is its image bytes and its label. */
    for (size_t i = 0; i < n; i++) {
        json_t *s = tu_manifest_sample(m, i);
        const void *data;
        size_t len;
        int64_t label;
        REQUIRE(stk_dataset_read(d, i, &data, &len, &label, err, sizeof err) == STK_OK);
        char hex[65];
        tu_sha256_hex(data, len, hex);
        CHECK_EQ(len, tu_json_int(s, "nbytes"));
        CHECK(!strcmp(hex, tu_json_str(s, "sha256")));
        CHECK_EQ(label, tu_json_int(s, "label"));
        char key[256], want[256];
        REQUIRE(stk_dataset_sample_key(d, i, key, sizeof key) == STK_OK);
        json_t *loc = json_object_get(s, "location");
        snprintf(want, sizeof want, "%s#%lld", tu_json_str(loc, "file"),
                 (long long)tu_json_int(loc, "index_in_file"));
        CHECK(!strcmp(key, want));
    }
    stk_dataset_close(d);
    json_decref(m);
}

static void test_dataset_snappy(void)
{
    check_dataset("snappy");
}

static void test_dataset_zstd(void)
{
    check_dataset("zstd");
}

static void test_dataset_uncompressed(void)
{
    check_dataset("uncompressed");
}

/* One file alone: its 30 rows. */
static void test_one_file(void)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/train-00001-of-00002.parquet", fixture("zstd"));
    json_t *m = manifest("zstd");
    stk_dataset *d = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&d, p, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK_EQ(di.samples, 30);
    for (size_t i = 0; i < 30; i++) {
        const void *data;
        size_t len;
        int64_t label;
        REQUIRE(stk_dataset_read(d, i, &data, &len, &label, err, sizeof err) == STK_OK);
        char hex[65];
        tu_sha256_hex(data, len, hex);
        CHECK(!strcmp(hex, tu_json_str(tu_manifest_sample(m, 30 + i), "sha256")));
    }
    stk_dataset_close(d);
    json_decref(m);
}

/* ---- the loader with fields ---------------------------------------------------- */

/* One epoch with every column as a field; each sample compared with the
 * manifest; returns a hash of the batches (order included). */
static uint64_t epoch_fields(const char *variant, unsigned threads, const char *image)
{
    json_t *m = manifest(variant);
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_options *o = NULL;
    char spec[256];
    snprintf(spec, sizeof spec, "img=%s,path=image.path,caption,label,width,height,aspect", image);
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, fixture(variant)) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 11) == STK_OK);
    REQUIRE(stk_options_set_fields(o, spec) == STK_OK);
    stk_loader *l = NULL;
    int rc = stk_loader_open(&l, o);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_options_destroy(o);
    uint8_t *seen = calloc(n, 1);
    uint64_t h = 0;
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *img = tu_field(b, "img"), *cap = tu_field(b, "caption");
        const stk_field *path = tu_field(b, "path"), *lab = tu_field(b, "label");
        const stk_field *w = tu_field(b, "width"), *ht = tu_field(b, "height"),
                        *asp = tu_field(b, "aspect");
        CHECK_EQ(lab->kind, STK_FIELD_INT);
        CHECK_EQ(asp->kind, STK_FIELD_FLOAT);
        CHECK_EQ(cap->kind, STK_FIELD_TEXT);
        CHECK_EQ(path->kind, STK_FIELD_TEXT);
        CHECK_EQ(img->kind, STK_FIELD_IMAGE);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < n);
            CHECK(!seen[i]);
            seen[i] = 1;
            json_t *s = tu_manifest_sample(m, i);
            const uint8_t *ib = (const uint8_t *)img->data + img->offsets[k];
            char hex[65];
            tu_sha256_hex(ib, img->lengths[k], hex);
            CHECK(!strcmp(hex, tu_json_str(s, "sha256")));
            CHECK_EQ(img->lengths[k], tu_json_int(s, "nbytes"));
            CHECK(tu_text_is(cap, k, tu_json_str(s, "caption")));
            CHECK(tu_text_is(path, k, tu_json_str(s, "image_path")));
            CHECK_EQ(((const int64_t *)lab->data)[k], tu_json_int(s, "label"));
            CHECK_EQ(b->labels[k], tu_json_int(s, "label"));
            CHECK_EQ(((const int64_t *)w->data)[k], tu_json_int(s, "width"));
            CHECK_EQ(((const int64_t *)ht->data)[k], tu_json_int(s, "height"));
            float fa = ((const float *)asp->data)[k];
            CHECK(fa == (float)json_real_value(json_object_get(s, "aspect")));
            h = tu_hash(h, &i, sizeof i);
            h = tu_hash(h, &fa, sizeof fa);
            h = tu_hash(h, ib, img->lengths[k]);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (size_t i = 0; i < n; i++)
        CHECK(seen[i]);
    free(seen);
    stk_loader_close(l);
    json_decref(m);
    return h;
}

static void test_fields_snappy(void)
{
    CHECK_EQ(epoch_fields("snappy", 1, "image"), epoch_fields("snappy", 3, "image"));
}

static void test_fields_zstd(void)
{
    CHECK_EQ(epoch_fields("zstd", 1, "image"), epoch_fields("zstd", 3, "image.bytes"));
}

static void test_fields_uncompressed(void)
{
    CHECK_EQ(epoch_fields("uncompressed", 3, "image"), epoch_fields("snappy", 3, "image"));
}

/* Without fields: an image pipeline over the image column and the labels. */
static void test_images_without_fields(void)
{
    tu_check_images_without_fields("parquet", "snappy");
}

/* A field the files lack: the open says which fields there are. */
static void test_unknown_field(void)
{
    tu_cfg c = {.path = fixture("snappy"), .bs = 8, .threads = 1};
    c.options[0] = "fields";
    c.options[1] = "image,nope";
    stk_loader *l = NULL;
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "no field 'nope'") &&
          strstr(stk_loader_errmsg(l), "image.path"));
    stk_loader_close(l);
}

/* ---- layouts the fixtures lack --------------------------------------------------------
 * The fuzz seeds tests/fuzz/corpus/parquet/{v1-snappy-nulls,v1-gzip-nulls,
 * v2-zstd-delta,v2-uncompressed} were written by DuckDB
 * (tests/fuzz/make_parquet_corpus.js) from a table whose every value follows
 * from its row i: dictionary-encoded strings, nulls and null structs, page
 * v2 with DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY and BYTE_STREAM_SPLIT,
 * gzip. Every field of every row is checked against that formula here,
 * without node (tests/py/test_parquet.py covers more, written at test time). */

static void check_written(const char *seed, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "tests/fuzz/corpus/parquet/%s", seed);
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    tu_cfg c = {.path = path, .bs = 16, .threads = 3};
    c.options[0] = "fields";
    c.options[1] = "id,label,cat,note?=note,img?=image,ipath?=image.path,flag,f,score?=score,u";
    stk_loader *l = NULL;
    int rc = tu_open_cfg(&l, &c);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    static const char *const cats[] = {"red", "green", "blue"};
    uint8_t seen[64] = {0};
    REQUIRE(n <= sizeof seen);
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *id = tu_field(b, "id"), *lab = tu_field(b, "label"),
                        *cat = tu_field(b, "cat");
        const stk_field *note = tu_field(b, "note"), *img = tu_field(b, "img");
        const stk_field *ip = tu_field(b, "ipath"), *flag = tu_field(b, "flag"),
                        *f = tu_field(b, "f");
        const stk_field *score = tu_field(b, "score"), *u = tu_field(b, "u");
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < n);
            CHECK(!seen[i]);
            seen[i] = 1;
            CHECK_EQ(((const int64_t *)id->data)[k], (int64_t)i);
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i % 10));
            CHECK(tu_text_is(cat, k, cats[i % 3]));
            char want[64];
            snprintf(want, sizeof want, "note %llu", (unsigned long long)i);
            CHECK_EQ(note->present[k], i % 3 != 0);
            CHECK(i % 3 == 0 || tu_text_is(note, k, want));
            /* A null struct: neither member; a null bytes member: no image. */
            CHECK_EQ(ip->present[k], i % 11 != 0);
            snprintf(want, sizeof want, "img_%llu.jpg", (unsigned long long)i);
            CHECK(i % 11 == 0 || tu_text_is(ip, k, want));
            CHECK_EQ(img->present[k], i % 11 != 0 && i % 7 != 0);
            CHECK(!img->present[k] || img->lengths[k] == 16);
            CHECK_EQ(((const int64_t *)flag->data)[k], i % 2 == 0);
            CHECK(((const float *)f->data)[k] == (float)((double)i * 0.25));
            CHECK_EQ(score->present[k], i % 5 != 0);
            if (i % 5) {
                float want_s = (float)((double)i / 7.0), got = ((const float *)score->data)[k];
                CHECK(got == want_s);
            }
            CHECK_EQ(((const int64_t *)u->data)[k], (int64_t)(3000000000ll + (int64_t)i));
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (size_t i = 0; i < n; i++)
        CHECK(seen[i]);
    stk_loader_close(l);
}

/* ---- stk pack ------------------------------------------------------------------------- */

/* Hash of field "img" (source field src_name) over one unshuffled epoch. */
static uint64_t image_hash(const char *path, const char *src_name, uint64_t *n)
{
    char spec[128];
    snprintf(spec, sizeof spec, "img?=%s:bytes", src_name);
    tu_cfg c = {.path = path, .bs = 16, .threads = 2};
    c.options[0] = "fields";
    c.options[1] = spec;
    stk_loader *l = NULL;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    uint64_t h = 1469598103934665603ull;
    stk_batch *b;
    int rc;
    *n = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *f = tu_field(b, "img");
        for (size_t k = 0; k < b->size; k++) {
            h = tu_hash(h, &b->indices[k], sizeof b->indices[k]);
            if (f->present[k])
                h = tu_hash(h, (const uint8_t *)f->data + f->offsets[k], f->lengths[k]);
            *n += f->present[k];
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    stk_loader_close(l);
    return h;
}

/* Packing HF's image struct keeps its bytes once: "image" is kept,
 * "image.bytes" (the same bytes under the member's name) is not written;
 * every image and every other column are. */
static void test_pack_keeps_the_image_once(void)
{
    char err[512];
    stk_pack_options po = {.struct_size = sizeof po, .threads = 2};
    stk_pack_result res = {.struct_size = sizeof res};
    int rc = stk_pack(fixture("snappy"), tu_path("packed"), &po, &res, err, sizeof err);
    if (rc)
        fprintf(stderr, "pack: %s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset *d = NULL;
    REQUIRE(stk_dataset_open(&d, tu_path("packed"), NULL, err, sizeof err) == STK_OK);
    bool image = false, path = false, bytes = false;
    for (size_t k = 0; k < stk_dataset_field_count(d); k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        image |= !strcmp(fi.name, "image");
        path |= !strcmp(fi.name, "image.path");
        bytes |= !strcmp(fi.name, "image.bytes");
    }
    CHECK(image && path && !bytes);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    stk_dataset_close(d);
    /* Each image once: the shards hold less than twice the images' bytes. */
    uint64_t n_src, n_out, img_bytes = 0;
    json_t *m = manifest("snappy");
    size_t i;
    json_t *smp;
    json_array_foreach(json_object_get(m, "samples"), i, smp)
    {
        img_bytes += (uint64_t)json_integer_value(json_object_get(smp, "nbytes"));
    }
    json_decref(m);
    CHECK(img_bytes > 0 && di.bytes < img_bytes * 3 / 2);
    CHECK_EQ(image_hash(tu_path("packed"), "image", &n_out),
             image_hash(fixture("snappy"), "image", &n_src));
    CHECK(n_src > 0 && n_out == n_src);
}

/* A list's stand-in names ("images[]") are no fields of a packed copy. */
static void test_pack_leaves_out_list_names(void)
{
    char err[512];
    stk_pack_options po = {.struct_size = sizeof po, .threads = 1};
    stk_pack_result res = {.struct_size = sizeof res};
    int rc = stk_pack("tests/fuzz/corpus/parquet/lists-v1-snappy", tu_path("packed-lists"), &po,
                      &res, err, sizeof err);
    if (rc)
        fprintf(stderr, "pack: %s\n", err);
    REQUIRE(rc == STK_OK);
    CHECK_EQ(res.samples, 40);
    stk_dataset *d = NULL;
    REQUIRE(stk_dataset_open(&d, tu_path("packed-lists"), NULL, err, sizeof err) == STK_OK);
    bool list = false;
    for (size_t k = 0; k < stk_dataset_field_count(d); k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        list |= strchr(fi.name, '[') != NULL;
    }
    CHECK(stk_dataset_field_count(d) > 0 && !list);
    stk_dataset_close(d);
}

/* ---- lists ------------------------------------------------------------------------------
 * The fuzz seeds lists-v1-snappy and lists-v2-zstd were written by DuckDB
 * from a table whose every list follows from its row i (40 rows):
 *   images  null when i % 13 == 0, else (i * 7) % 6 elements; element j null
 *           when (i + j) % 9 == 4, its bytes null when (i + j) % 10 == 3, else
 *           16 bytes (an md5), its path "p<j>";
 *   tags    null when i % 17 == 0, else i % 5 elements "t<j>", element 2 null;
 *   nums    i % 4 elements i * 10 + j.
 * Each element field is checked against that formula, present or lacking. */

static bool img_has(uint64_t i, uint64_t j)
{
    return i % 13 && j < (i * 7) % 6 && (i + j) % 9 != 4 && (i + j) % 10 != 3;
}

static bool path_has(uint64_t i, uint64_t j)
{
    return i % 13 && j < (i * 7) % 6 && (i + j) % 9 != 4;
}

static bool tag_has(uint64_t i, uint64_t j)
{
    return i % 17 && j < i % 5 && j != 2;
}

static void check_lists(const char *seed)
{
    char path[512];
    snprintf(path, sizeof path, "tests/fuzz/corpus/parquet/%s", seed);
    tu_cfg c = {.path = path, .bs = 7, .threads = 3};
    c.options[0] = "fields";
    c.options[1] = "id,a0?=images[0]:bytes,a4?=images[4]:bytes,p1?=images[1].path,t0?=tags[0],"
                   "t3?=tags[3],t2?=tags[2],n0?=nums[0],n2?=nums[2]";
    stk_loader *l = NULL;
    int rc = tu_open_cfg(&l, &c);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    uint8_t seen[40] = {0};
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *a0 = tu_field(b, "a0"), *a4 = tu_field(b, "a4"), *p1 = tu_field(b, "p1");
        const stk_field *t0 = tu_field(b, "t0"), *t2 = tu_field(b, "t2"), *t3 = tu_field(b, "t3");
        const stk_field *n0 = tu_field(b, "n0"), *n2 = tu_field(b, "n2");
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < 40);
            CHECK(!seen[i]);
            seen[i] = 1;
            CHECK_EQ(a0->present[k], img_has(i, 0));
            CHECK(!a0->present[k] || a0->lengths[k] == 16);
            CHECK_EQ(a4->present[k], img_has(i, 4));
            CHECK(!a4->present[k] || a4->lengths[k] == 16);
            CHECK_EQ(p1->present[k], path_has(i, 1));
            CHECK(!p1->present[k] || tu_text_is(p1, k, "p1"));
            CHECK_EQ(t0->present[k], tag_has(i, 0));
            CHECK(!t0->present[k] || tu_text_is(t0, k, "t0"));
            CHECK_EQ(t3->present[k], tag_has(i, 3));
            CHECK(!t3->present[k] || tu_text_is(t3, k, "t3"));
            CHECK(!t2->present[k]);
            CHECK_EQ(n0->present[k], i % 4 > 0);
            CHECK(!n0->present[k] || ((const int64_t *)n0->data)[k] == (int64_t)(i * 10));
            CHECK_EQ(n2->present[k], i % 4 > 2);
            CHECK(!n2->present[k] || ((const int64_t *)n2->data)[k] == (int64_t)(i * 10 + 2));
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (size_t i = 0; i < 40; i++)
        CHECK(seen[i]);
    stk_loader_close(l);
}

static void test_lists_v1(void)
{
    check_lists("lists-v1-snappy");
}

static void test_lists_v2(void)
{
    check_lists("lists-v2-zstd");
}

/* A required element a row lacks is a sample error naming the row and the
 * field; a name that is no element of a list is refused at open. */
static void test_list_missing_element(void)
{
    tu_cfg c = {.path = "tests/fuzz/corpus/parquet/lists-v1-snappy", .bs = 4, .threads = 1};
    c.options[0] = "fields";
    c.options[1] = "first=images[0]";
    stk_loader *l = NULL;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    CHECK_EQ(stk_loader_next(l, &b), STK_ESAMPLE);
    CHECK(strstr(stk_loader_errmsg(l), "lists-v1-snappy#0") &&
          strstr(stk_loader_errmsg(l), "no field 'images[0]'"));
    stk_loader_close(l);
    static const char *const bad[] = {"x=images[x]", "x=images[0", "x=tags[0].path", "x=nope[1]",
                                      "x=images[]"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        c.options[1] = bad[k];
        l = NULL;
        int rc = tu_open_cfg(&l, &c);
        CHECK(rc == STK_EINVAL || (k == 4 && rc == STK_OK));
        stk_loader_close(l);
    }
}

/* A mixture resolves element names through each source that has the list:
 * two DuckDB list files mixed, every element field of every sample checked
 * against its own file's formula (the row is its "id"). A source without
 * the list fails the open naming the source and the field; asked as
 * optional, its samples lack the field. */
static int open_list_mix(stk_loader **l, const char *second, const char *fields)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_add_source(o, "tests/fuzz/corpus/parquet/lists-v1-snappy", 0, 0) == STK_OK);
    REQUIRE(stk_options_add_source(o, second, 0, 0) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 9) == STK_OK);
    REQUIRE(stk_options_set_threads(o, 2) == STK_OK);
    REQUIRE(stk_options_set_fields(o, fields) == STK_OK);
    int rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    return rc;
}

static void test_lists_in_a_mixture(void)
{
    stk_loader *l = NULL;
    int rc = open_list_mix(&l, "tests/fuzz/corpus/parquet/lists-v2-zstd",
                           "id,source,a0?=images[0]:bytes,a4?=images[4],p1?=images[1].path,"
                           "t3?=tags[3],n2?=nums[2]");
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    uint8_t seen[2][40] = {{0}};
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *id = tu_field(b, "id"), *src = tu_field(b, "source");
        const stk_field *a0 = tu_field(b, "a0"), *a4 = tu_field(b, "a4"), *p1 = tu_field(b, "p1");
        const stk_field *t3 = tu_field(b, "t3"), *n2 = tu_field(b, "n2");
        for (size_t k = 0; k < b->size; k++) {
            int64_t i = ((const int64_t *)id->data)[k], s = ((const int64_t *)src->data)[k];
            REQUIRE(i >= 0 && i < 40 && (s == 0 || s == 1));
            size_t source = 9;
            uint64_t local = 99;
            CHECK_EQ(stk_loader_sample_source(l, b->indices[k], &source, &local), STK_OK);
            CHECK(source == (size_t)s && local == (uint64_t)i);
            CHECK(!seen[s][i]);
            seen[s][i] = 1;
            uint64_t u = (uint64_t)i;
            CHECK_EQ(a0->present[k], img_has(u, 0));
            CHECK(!a0->present[k] || a0->lengths[k] == 16);
            CHECK_EQ(a4->present[k], img_has(u, 4));
            CHECK_EQ(p1->present[k], path_has(u, 1));
            CHECK(!p1->present[k] || tu_text_is(p1, k, "p1"));
            CHECK_EQ(t3->present[k], tag_has(u, 3));
            CHECK(!t3->present[k] || tu_text_is(t3, k, "t3"));
            CHECK_EQ(n2->present[k], u % 4 > 2);
            CHECK(!n2->present[k] || ((const int64_t *)n2->data)[k] == i * 10 + 2);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (size_t i = 0; i < 40; i++)
        CHECK(seen[0][i] && seen[1][i]);
    stk_loader_close(l);

    /* The HF fixture has no list: a required element names it and the field. */
    l = NULL;
    CHECK_EQ(open_list_mix(&l, fixture("snappy"), "source,a0=images[0]"), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "field 'a0'") &&
          strstr(stk_loader_errmsg(l), "mixture source 1") &&
          strstr(stk_loader_errmsg(l), "snappy"));
    stk_loader_close(l);
    /* No source has it: refused as any unknown field. */
    l = NULL;
    CHECK_EQ(open_list_mix(&l, fixture("snappy"), "x=nope[0]"), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "nope[0]"));
    stk_loader_close(l);
    /* Optional: the fixture's samples lack it; the list file's have it. */
    l = NULL;
    rc = open_list_mix(&l, fixture("snappy"), "source,a0?=images[0],t0?=tags[0]");
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    size_t n[2] = {0, 0};
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *src = tu_field(b, "source"), *a0 = tu_field(b, "a0"),
                        *t0 = tu_field(b, "t0");
        for (size_t k = 0; k < b->size; k++) {
            int64_t s = ((const int64_t *)src->data)[k];
            size_t source;
            uint64_t local;
            REQUIRE(stk_loader_sample_source(l, b->indices[k], &source, &local) == STK_OK);
            CHECK_EQ((int64_t)source, s);
            n[source]++;
            if (s == 1) {
                CHECK(!a0->present[k] && !t0->present[k]);
            } else {
                CHECK_EQ(a0->present[k], img_has(local, 0));
                CHECK_EQ(t0->present[k], tag_has(local, 0));
            }
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK(n[0] == 40 && n[1] > 0);
    stk_loader_close(l);
}

/* stoker verify checks every element of a list (each image element must be
 * an image) and the image columns: DuckDB's list file stores 16-byte md5s
 * as its images[] struct's bytes, so each row with an image element is
 * reported, naming the row and its first such element; the HF fixture's
 * real JPEGs pass. */
static void test_verify_lists(void)
{
    tu_problems s = {0};
    char err[1024] = "";
    stk_verify_result r = {.struct_size = sizeof r};
    CHECK_EQ(stk_dataset_verify("tests/fuzz/corpus/parquet/lists-v1-snappy", NULL, tu_on_problem,
                                &s, &r, err, sizeof err),
             STK_OK);
    CHECK_EQ(r.checked, 40);
    int want = 0;
    for (uint64_t i = 0; i < 40; i++) {
        int j = 0;
        while (j < 6 && !img_has(i, (uint64_t)j))
            j++;
        if (j == 6)
            continue;
        REQUIRE(want < s.n && want < 64);
        char name[64], field[64];
        snprintf(name, sizeof name, "lists-v1-snappy#%llu", (unsigned long long)i);
        snprintf(field, sizeof field, "field 'images[%d]': not an image", j);
        CHECK_EQ(s.index[want], i);
        CHECK(strstr(s.names[want], name) && strstr(s.reasons[want], field));
        want++;
    }
    CHECK(want > 10);
    CHECK_EQ(s.n, want);
    CHECK_EQ(r.corrupt, (uint64_t)want);
    memset(&s, 0, sizeof s);
    r = (stk_verify_result){.struct_size = sizeof r};
    CHECK_EQ(stk_dataset_verify(fixture("snappy"), NULL, tu_on_problem, &s, &r, err, sizeof err),
             STK_OK);
    CHECK(r.checked == 60 && r.corrupt == 0 && s.n == 0 && r.whole == 1);
}

static void test_written_v1_snappy(void)
{
    check_written("v1-snappy-nulls", 60);
}

static void test_written_v1_gzip(void)
{
    check_written("v1-gzip-nulls", 60);
}

static void test_written_v2_zstd(void)
{
    check_written("v2-zstd-delta", 60);
}

static void test_written_v2_uncompressed(void)
{
    check_written("v2-uncompressed", 40);
}

/* ---- bad input ----------------------------------------------------------------------- */

static const char *copy_fixture(const char *variant, const char *name)
{
    return tu_copy_dir(fixture(variant), name);
}

#define F0 "train-00000-of-00002.parquet"
#define F1 "train-00001-of-00002.parquet"

/* A file cut anywhere loses its footer: the open fails naming the file, and
 * never reads past the cut. */
static void test_truncations(void)
{
    size_t n;
    char src[8400];
    snprintf(src, sizeof src, "%s/" F0, fixture("snappy"));
    uint8_t *b = tu_read_file(src, &n);
    REQUIRE(b);
    const char *p = tu_path("cut.parquet");
    int tried = 0;
    for (size_t cut = 0; cut < n; cut += cut < 64 ? 1 : cut > n - 600 ? 7 : 4999) {
        tu_write_file(p, b, cut);
        stk_dataset *d = NULL;
        char err[1024] = "";
        int rc = stk_dataset_open(&d, p, NULL, err, sizeof err);
        /* Too short to sniff: not a dataset at all (EINVAL); else a Parquet
         * file without its footer. */
        CHECK(rc == STK_EFORMAT || (cut < 4 && rc == STK_EINVAL));
        CHECK(strstr(err, "cut.parquet") != NULL);
        if (rc == STK_EFORMAT && !strstr(err, "PAR1") && !strstr(err, "too short") &&
            !strstr(err, "footer")) {
            fprintf(stderr, "cut at %zu: %s\n", cut, err);
            CHECK(0);
        }
        stk_dataset_close(d);
        tried++;
    }
    CHECK(tried > 100);
    free(b);
}

static void test_footer_lies(void)
{
    /* A footer length past the file. */
    const char *d = copy_fixture("snappy", "footlen");
    const char *f = tu_join(d, F0);
    struct stat st;
    REQUIRE(stat(f, &st) == 0);
    tu_patch(f, st.st_size - 8, "\x00\x00\x10\x00", 4);
    tu_expect_open(d, STK_EFORMAT, F0, "footer length 1048576");
    /* One that is too short: the metadata ends early. */
    d = copy_fixture("snappy", "footshort");
    f = tu_join(d, F1);
    REQUIRE(stat(f, &st) == 0);
    tu_patch(f, st.st_size - 8, "\x40\x00\x00\x00", 4);
    tu_expect_open(d, STK_EFORMAT, F1, "footer at offset");
    /* No magic at the end. */
    d = copy_fixture("snappy", "magic");
    f = tu_join(d, F0);
    REQUIRE(stat(f, &st) == 0);
    tu_patch(f, st.st_size - 4, "PAR2", 4);
    tu_expect_open(d, STK_EFORMAT, F0, "no PAR1 magic");
    /* Every byte of the footer flipped in turn: an error or a dataset that
     * reads (a flip in a value the reader does not use), never a crash; and
     * every error names the file. */
    size_t n;
    f = tu_join(fixture("zstd"), F1);
    uint8_t *b = tu_read_file(f, &n);
    REQUIRE(b);
    uint32_t fl = (uint32_t)b[n - 8] | (uint32_t)b[n - 7] << 8 | (uint32_t)b[n - 6] << 16 |
                  (uint32_t)b[n - 5] << 24;
    const char *p = tu_path("flip.parquet");
    int errors = 0;
    for (size_t k = n - 8 - fl; k < n - 8; k += 3) {
        b[k] ^= 0x5a;
        tu_write_file(p, b, n);
        b[k] ^= 0x5a;
        stk_dataset *ds = NULL;
        char err[1024] = "";
        int rc = stk_dataset_open(&ds, p, NULL, err, sizeof err);
        if (rc) {
            errors++;
            CHECK(strstr(err, "flip.parquet") != NULL);
            CHECK(rc == STK_EFORMAT || rc == STK_EUNSUPPORTED || rc == STK_EEMPTY);
            continue;
        }
        stk_dataset_info di = {.struct_size = sizeof di};
        REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
        for (uint64_t i = 0; i < di.samples; i++) {
            const void *data;
            size_t len;
            int64_t label;
            stk_dataset_read(ds, i, &data, &len, &label, err, sizeof err);
        }
        stk_dataset_close(ds);
    }
    CHECK(errors > 10);
    free(b);
}

/* The first page of the file (the image column's, at offset 4) claims more
 * bytes than it has: row group 0's reads fail naming the file, the row
 * group, the column and the offset; the loader under skip delivers the
 * other 35 rows. */
static void test_page_header_lies(void)
{
    const char *d = copy_fixture("uncompressed", "page");
    const char *f = tu_join(d, F0);
    size_t n;
    uint8_t *b = tu_read_file(f, &n);
    REQUIRE(b);
    /* PageHeader: 0x15 type(0) 0x15 uncompressed_size 0x15 compressed_size. */
    REQUIRE(b[4] == 0x15 && b[5] == 0x00 && b[6] == 0x15);
    size_t k = 7;
    while (b[k] & 0x80)
        k++;
    REQUIRE(b[k + 1] == 0x15);
    size_t cs = k + 2;
    /* Bit 6 of the compressed size's first byte flipped: 32 bytes more or
     * less than the page has (zigzag doubles), in a varint of the same
     * length. */
    REQUIRE(b[cs] & 0x80);
    b[cs] ^= 0x40;
    tu_write_file(f, b, n);
    free(b);
    char msg[1024];
    CHECK_EQ(tu_read_all(d, msg, sizeof msg, NULL), 25);
    CHECK(strstr(msg, F0 "#0") && strstr(msg, "row group 0") && strstr(msg, "image.bytes") &&
          strstr(msg, "offset 4"));
    if (!strstr(msg, "offset 4"))
        fprintf(stderr, "%s\n", msg);
    tu_cfg c = {.path = d, .bs = 4, .threads = 3, .on_error = STK_ON_ERROR_SKIP};
    c.options[0] = "fields";
    c.options[1] = "image,caption,label";
    stk_loader *l = NULL;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *bt;
    size_t got = 0;
    int rc;
    while ((rc = stk_loader_next(l, &bt)) == STK_OK) {
        CHECK_EQ(bt->nfields, 3);
        got += bt->size;
        stk_batch_release(bt);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(got, 60 - 25);
    CHECK_EQ(stk_loader_error_count(l), 25);
    stk_sample_error se;
    REQUIRE(stk_loader_error_get(l, 0, &se) == STK_OK);
    CHECK(strstr(se.path, F0 "#") && strstr(se.reason, "row group 0"));
    stk_loader_close(l);
    /* Only the caption asked for: row group 0 reads, its image is not. */
    c.options[1] = "caption,label";
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    got = 0;
    while ((rc = stk_loader_next(l, &bt)) == STK_OK) {
        got += bt->size;
        stk_batch_release(bt);
    }
    CHECK_EQ(got, 60);
    stk_loader_close(l);
}

/* A file named .parquet that is not one, beside a good one: refused,
 * naming it. */
static void test_bad_file_beside(void)
{
    const char *d = tu_path("mixed");
    tu_mkdirs(d);
    size_t n;
    uint8_t *b = tu_read_file(tu_join(fixture("snappy"), F0), &n);
    REQUIRE(b);
    tu_write_file(tu_join(d, "a.parquet"), b, n);
    free(b);
    tu_write_file(tu_join(d, "b.parquet"), "PAR1 not really", 15);
    tu_expect_open(d, STK_EFORMAT, "b.parquet", NULL);
}

/* ---- I/O faults ------------------------------------------------------------------
 * The n-th file call of a session (open, read every sample, close) fails,
 * for every n: EINTR and short reads change nothing; EIO fails the open
 * with the OS reason, or fails only samples (each with a message), every
 * other sample equal to the fault-free one; nothing leaks (tu_end). */

static void test_io_faults(void)
{
    tu_sweep w = {.dir = fixture("zstd"), .samples = 60};
    tu_sweep_io_faults(&w);
}

/* An I/O error is not remembered with the page: the next read retries. (A
 * page that does not decode is: its bytes will not change.) */
static void test_io_error_is_retried(void)
{
    stk_dataset *d = NULL;
    char err[1024];
    REQUIRE(stk_dataset_open(&d, fixture("snappy"), NULL, err, sizeof err) == STK_OK);
    const void *p;
    size_t len;
    int64_t label;
    stk__iofault_arm(STK__IOF_EIO, 0, 0);
    int rc = stk_dataset_read(d, 3, &p, &len, &label, err, sizeof err);
    stk__iofault_arm(0, -1, 0);
    CHECK_EQ(rc, STK_EIO);
    CHECK(strstr(err, "Input/output error") != NULL);
    CHECK_EQ(stk_dataset_read(d, 3, &p, &len, &label, err, sizeof err), STK_OK);
    stk_dataset_close(d);
}

/* ---- allocation failures ----------------------------------------------------------- */

static void test_oom(void)
{
    tu_sweep w = {.dir = fixture("snappy"), .samples = 60, .step = 7};
    tu_sweep_oom(&w);
}

int main(void)
{
    tu_begin("test_parquet", 300);
    if (!fixtures()) {
        fprintf(stderr, "test_parquet: the Parquet fixtures (../shared/fixtures/parquet, or "
                        "$STOKER_FIXTURES/parquet) are missing\n");
        return 1;
    }
    RUN(test_dataset_snappy);
    RUN(test_dataset_zstd);
    RUN(test_dataset_uncompressed);
    RUN(test_one_file);
    RUN(test_fields_snappy);
    RUN(test_fields_zstd);
    RUN(test_fields_uncompressed);
    RUN(test_images_without_fields);
    RUN(test_unknown_field);
    RUN(test_written_v1_snappy);
    RUN(test_written_v1_gzip);
    RUN(test_written_v2_zstd);
    RUN(test_written_v2_uncompressed);
    RUN(test_pack_keeps_the_image_once);
    RUN(test_pack_leaves_out_list_names);
    RUN(test_lists_v1);
    RUN(test_lists_v2);
    RUN(test_list_missing_element);
    RUN(test_lists_in_a_mixture);
    RUN(test_verify_lists);
    RUN(test_truncations);
    RUN(test_footer_lies);
    RUN(test_page_header_lies);
    RUN(test_bad_file_beside);
    RUN(test_io_faults);
    RUN(test_io_error_is_retried);
    RUN(test_oom);
    return tu_end();
}
