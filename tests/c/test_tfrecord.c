/* test_tfrecord.c -- TFRecord files of tf.train.Example records read in
 * place (src/source/tfrecord.c): the fixtures (../shared/fixtures/tfrecord/
 * {plain,gzip}, Examples serialized by protobuf from TensorFlow's own
 * .proto files, each with a manifest) read through the dataset API and the
 * loader with every feature a field, compared with the manifest field by
 * field, whole epochs over 1 and 3 threads; the DALI idx files and the
 * index cache used; Examples the fixtures lack (unpacked values,
 * multi-valued floats) written here; and bad input: a damaged data CRC, a
 * damaged length CRC, a truncated file, a length past the end, a malformed
 * Example -- each a clear error naming the file and the record, never a
 * crash, the rest delivered under skip. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint32_t stk__crc32c(const void *data, size_t n);
uint32_t stk__crc32c_table(const void *data, size_t n);

/* ---- fixtures ------------------------------------------------------------------ */

static const char *fixtures(void)
{
    return tu_fixtures("tfrecord");
}

static json_t *manifest(const char *variant)
{
    return tu_fixture_manifest("tfrecord", variant);
}

static const char *fixture(const char *variant)
{
    return tu_fixture("tfrecord", variant);
}

/* Copies fixture variant (its idx/ folder too when idx and there is one)
 * into the temporary directory as name. */
static const char *copy_fixture(const char *variant, const char *name, bool idx)
{
    const char *out = tu_copy_dir(fixture(variant), name);
    struct stat st;
    char from[4300];
    snprintf(from, sizeof from, "%s/idx", fixture(variant));
    if (idx && stat(from, &st) == 0)
        tu_copy_files(from, tu_join(out, "idx"));
    return out;
}

/* The manifest's record offset of sample i. */
static long rec_off(json_t *m, size_t i)
{
    return (long)json_integer_value(
        json_object_get(json_object_get(tu_manifest_sample(m, i), "location"), "offset"));
}

/* ---- the dataset API ----------------------------------------------------------- */

/* The features, in the order the scan meets them (the writer's serialization
 * is deterministic: sorted keys). */
static const char *const k_feats[] = {
    "caption",      "image/aspect", "image/class/label", "image/encoded", "image/filename",
    "image/format", "image/height", "image/size",        "image/width",   "sample/index"};
static const int k_kinds[] = {STK_FIELD_AUTO, STK_FIELD_FLOAT, STK_FIELD_INT, STK_FIELD_IMAGE,
                              STK_FIELD_AUTO, STK_FIELD_AUTO,  STK_FIELD_INT, STK_FIELD_JSON,
                              STK_FIELD_INT,  STK_FIELD_JSON};

static void check_dataset(const char *path, json_t *m, uint64_t stored)
{
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_dataset *d = NULL;
    char err[512];
    int rc = stk_dataset_open(&d, path, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK(!strcmp(di.kind, "tfrecord"));
    CHECK_EQ(di.samples, n);
    CHECK_EQ(di.shards, 2);
    CHECK(!strcmp(di.payload, "encoded"));
    if (stored)
        CHECK_EQ(di.bytes, stored);
    int64_t maxl = -1;
    for (size_t i = 0; i < n; i++)
        if (tu_json_int(tu_manifest_sample(m, i), "label") > maxl)
            maxl = tu_json_int(tu_manifest_sample(m, i), "label");
    CHECK_EQ(di.classes, maxl + 1);
    REQUIRE(stk_dataset_field_count(d) == 10);
    for (size_t k = 0; k < 10; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK(!strcmp(fi.name, k_feats[k]));
        CHECK_EQ(fi.kind, k_kinds[k]);
        CHECK_EQ(fi.samples, n);
    }
    /* Without fields a sample is its image bytes and its label. */
    for (size_t i = 0; i < n; i++) {
        json_t *s = tu_manifest_sample(m, i);
        const void *data;
        size_t len;
        int64_t label;
        rc = stk_dataset_read(d, i, &data, &len, &label, err, sizeof err);
        if (rc)
            fprintf(stderr, "%s\n", err);
        REQUIRE(rc == STK_OK);
        char hex[65];
        tu_sha256_hex(data, len, hex);
        CHECK_EQ(len, tu_json_int(s, "nbytes"));
        CHECK(!strcmp(hex, json_string_value(json_object_get(s, "sha256"))));
        CHECK_EQ(label, tu_json_int(s, "label"));
    }
    stk_dataset_close(d);
}

static uint64_t stored_bytes(json_t *m)
{
    json_t *files = json_object_get(m, "files");
    uint64_t stored = 0;
    for (size_t k = 0; k < json_array_size(files); k++)
        if (strncmp(json_string_value(json_object_get(json_array_get(files, k), "path")), "idx/",
                    4))
            stored +=
                (uint64_t)json_integer_value(json_object_get(json_array_get(files, k), "bytes"));
    return stored;
}

static void test_dataset_plain(void)
{
    json_t *m = manifest("plain");
    check_dataset(fixture("plain"), m, stored_bytes(m));
    /* Again, from the cache the first open wrote. */
    check_dataset(fixture("plain"), m, stored_bytes(m));
    json_decref(m);
}

static void test_dataset_gzip(void)
{
    json_t *m = manifest("gzip");
    check_dataset(fixture("gzip"), m, stored_bytes(m));
    json_decref(m);
}

/* One file, and a brace pattern, name TFRecord datasets too. */
static void test_file_and_pattern(void)
{
    stk_dataset *d = NULL;
    char err[512], p[4300];
    snprintf(p, sizeof p, "%s/train-00001-of-00002.tfrecord", fixture("plain"));
    REQUIRE(stk_dataset_open(&d, p, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK_EQ(di.samples, 30);
    CHECK(!strcmp(di.kind, "tfrecord"));
    stk_dataset_close(d);
    snprintf(p, sizeof p, "%s/train-{00000..00001}-of-00002.tfrecord.gz", fixture("gzip"));
    int rc = stk_dataset_open(&d, p, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK_EQ(di.samples, 60);
    stk_dataset_close(d);
}

/* ---- the loader with fields ---------------------------------------------------- */

/* One epoch with every feature as a field; each sample compared with the
 * manifest; returns a hash of the batches (order included). */
static uint64_t epoch_fields(const char *path, json_t *m, unsigned threads)
{
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, path) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 11) == STK_OK);
    REQUIRE(stk_options_add_field(o, "image", "image/encoded", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "caption", NULL, STK_FIELD_TEXT, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "label", "image/class/label", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "width", "image/width", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "height", "image/height", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "aspect", "image/aspect", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "size", "image/size", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "filename", "image/filename", STK_FIELD_TEXT, NULL, 0) ==
            STK_OK);
    REQUIRE(stk_options_add_field(o, "format", "image/format", 0, NULL, 0) == STK_OK);
    REQUIRE(stk_options_add_field(o, "sample_index", "sample/index", 0, NULL, 0) == STK_OK);
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
        const stk_field *img = tu_field(b, "image"), *cap = tu_field(b, "caption");
        const stk_field *lab = tu_field(b, "label"), *w = tu_field(b, "width");
        const stk_field *ht = tu_field(b, "height"), *asp = tu_field(b, "aspect");
        const stk_field *sz = tu_field(b, "size"), *fn = tu_field(b, "filename");
        const stk_field *fmt = tu_field(b, "format"), *si = tu_field(b, "sample_index");
        CHECK_EQ(img->kind, STK_FIELD_IMAGE);
        CHECK_EQ(lab->kind, STK_FIELD_INT);
        CHECK_EQ(asp->kind, STK_FIELD_FLOAT);
        CHECK_EQ(sz->kind, STK_FIELD_JSON);
        CHECK_EQ(si->kind, STK_FIELD_JSON);
        CHECK_EQ(fmt->kind, STK_FIELD_BYTES);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < n);
            CHECK(!seen[i]);
            seen[i] = 1;
            json_t *s = tu_manifest_sample(m, i);
            const uint8_t *ib = (const uint8_t *)img->data + img->offsets[k];
            char hex[65];
            tu_sha256_hex(ib, img->lengths[k], hex);
            CHECK(!strcmp(hex, json_string_value(json_object_get(s, "sha256"))));
            CHECK(tu_text_is(cap, k, json_string_value(json_object_get(s, "caption"))));
            CHECK(tu_text_is(fn, k, json_string_value(json_object_get(s, "filename"))));
            CHECK(tu_text_is(fmt, k, "jpeg"));
            CHECK_EQ(((const int64_t *)lab->data)[k], tu_json_int(s, "label"));
            CHECK_EQ(b->labels[k], tu_json_int(s, "label"));
            CHECK_EQ(((const int64_t *)w->data)[k], tu_json_int(s, "width"));
            CHECK_EQ(((const int64_t *)ht->data)[k], tu_json_int(s, "height"));
            float fa = ((const float *)asp->data)[k];
            CHECK(fa == (float)json_real_value(json_object_get(s, "aspect")));
            /* Multi-valued int64 lists: JSON arrays equal to the manifest's. */
            json_error_t je;
            json_t *got =
                json_loadb((const char *)sz->data + sz->offsets[k], sz->lengths[k], 0, &je);
            CHECK(got && json_equal(got, json_object_get(s, "size")));
            json_decref(got);
            got = json_loadb((const char *)si->data + si->offsets[k], si->lengths[k], 0, &je);
            CHECK(got && json_equal(got, json_object_get(s, "sample_index")));
            json_decref(got);
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
    return h;
}

static void test_fields_plain(void)
{
    json_t *m = manifest("plain");
    CHECK_EQ(epoch_fields(fixture("plain"), m, 1), epoch_fields(fixture("plain"), m, 3));
    json_decref(m);
}

static void test_fields_gzip(void)
{
    json_t *m = manifest("gzip"), *mp = manifest("plain");
    CHECK_EQ(epoch_fields(fixture("gzip"), m, 1), epoch_fields(fixture("gzip"), m, 3));
    CHECK_EQ(epoch_fields(fixture("gzip"), m, 2), epoch_fields(fixture("plain"), mp, 2));
    json_decref(m);
    json_decref(mp);
}

/* Without fields: an image pipeline over image/encoded and the labels. */
static void test_images_without_fields(void)
{
    tu_check_images_without_fields("tfrecord", "plain");
}

/* ---- the index: DALI idx files, the cache, the temporary area ------------------- */

static void test_crc32c(void)
{
    /* The check value of CRC-32C (RFC 3720 B.4), and a long input (the
     * wide paths) against a bitwise CRC. */
    CHECK_EQ(stk__crc32c("123456789", 9), 0xE3069283u);
    uint8_t buf[1000];
    for (size_t k = 0; k < sizeof buf; k++)
        buf[k] = (uint8_t)(k * 7 + 3);
    uint32_t c = ~0u;
    for (size_t k = 0; k < sizeof buf; k++) {
        c ^= buf[k];
        for (int b = 0; b < 8; b++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    }
    CHECK_EQ(stk__crc32c(buf + 1, sizeof buf - 1) != ~c, 1);
    CHECK_EQ(stk__crc32c(buf, sizeof buf), ~c);
    CHECK_EQ(stk__crc32c_table("123456789", 9), 0xE3069283u);
    for (size_t k = 0; k < 20; k++) /* every alignment and tail length */
        CHECK_EQ(stk__crc32c_table(buf + k, sizeof buf - 3 * k),
                 stk__crc32c(buf + k, sizeof buf - 3 * k));
}

/* The DALI index is read instead of walking the framing: one whose first
 * line covers records 0 and 1 together (well formed, but wrong) shows it is
 * used: file 0 then has 29 records, the first failing with the lengths. */
static void test_dali_idx_used(void)
{
    const char *d = copy_fixture("plain", "dali", true);
    const char *ip = tu_join(d, "idx/train-00000-of-00002.idx");
    size_t n;
    char *t = tu_read_file(ip, &n);
    REQUIRE(t);
    unsigned long long o0, s0, o1, s1;
    int used;
    REQUIRE(sscanf(t, "%llu %llu\n%llu %llu\n%n", &o0, &s0, &o1, &s1, &used) == 4);
    char out[1024];
    int ol = snprintf(out, sizeof out, "%llu %llu\n", o0, s0 + s1);
    REQUIRE((size_t)ol + (n - (size_t)used) < sizeof out);
    memcpy(out + ol, t + used, n - (size_t)used);
    tu_write_file(ip, out, (size_t)ol + (n - (size_t)used));
    free(t);
    stk_dataset *ds = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&ds, d, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
    CHECK_EQ(di.samples, 59);
    const void *p;
    size_t len;
    int64_t label;
    CHECK_EQ(stk_dataset_read(ds, 0, &p, &len, &label, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "train-00000-of-00002.tfrecord#0") && strstr(err, "the index says"));
    CHECK_EQ(stk_dataset_read(ds, 1, &p, &len, &label, err, sizeof err), STK_OK);
    stk_dataset_close(ds);
    /* A DALI index that disagrees with the file's size is not used. */
    d = copy_fixture("plain", "dali2", true);
    tu_write_file(tu_join(d, "idx/train-00000-of-00002.idx"), "0 16055\n", 8);
    REQUIRE(stk_dataset_open(&ds, d, NULL, err, sizeof err) == STK_OK);
    REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
    CHECK_EQ(di.samples, 60);
    stk_dataset_close(ds);
}

/* The index is cached beside the file (X.stkidx) and reused while the file
 * is unchanged; a changed file is indexed again. */
static void test_index_cache(void)
{
    const char *d = copy_fixture("plain", "cache", false);
    const char *f = tu_join(d, "train-00000-of-00002.tfrecord");
    char cp[8500];
    snprintf(cp, sizeof cp, "%s.stkidx", f);
    stk_dataset *ds = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&ds, d, NULL, err, sizeof err) == STK_OK);
    stk_dataset_close(ds);
    struct stat st;
    CHECK_EQ(stat(cp, &st), 0);
    /* A cache that claims one record fewer would be read as is: rewrite the
     * file (new mtime/ctime) so the cache no longer matches it. */
    size_t n;
    void *b = tu_read_file(f, &n);
    REQUIRE(b);
    usleep(10000);
    tu_write_file(f, b, n - 100); /* cut: record 29 runs past the end */
    free(b);
    REQUIRE(stk_dataset_open(&ds, d, NULL, err, sizeof err) == STK_OK);
    const void *p;
    size_t len;
    int64_t label;
    CHECK_EQ(stk_dataset_read(ds, 29, &p, &len, &label, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "runs past the end") != NULL);
    stk_dataset_close(ds);
    /* A damaged cache is rebuilt, never trusted. */
    tu_patch(cp, 200, "\xff\xff\xff\xff", 4);
    REQUIRE(stk_dataset_open(&ds, d, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
    CHECK_EQ(di.samples, 60);
    stk_dataset_close(ds);
}

static int count_tmp(const char *dir)
{
    return tu_count_prefixed(dir, "stoker-tfrecord-");
}

static void test_gzip_temporary_area(void)
{
    const char *tmp = tu_path("tmparea");
    char *old = tu_tmpdir_use(tmp);
    stk_dataset *d = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&d, fixture("gzip"), NULL, err, sizeof err) == STK_OK);
    CHECK_EQ(count_tmp(tmp), 1);
    stk_dataset_close(d);
    CHECK_EQ(count_tmp(tmp), 0);
    /* A gzip file cut short: the open says so, naming it. */
    const char *g = copy_fixture("gzip", "gzcut", false);
    REQUIRE(truncate(tu_join(g, "train-00001-of-00002.tfrecord.gz"), 5000) == 0);
    CHECK_EQ(stk_dataset_open(&d, g, NULL, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "train-00001-of-00002.tfrecord.gz") && strstr(err, "cut off"));
    stk_dataset_close(d);
    CHECK_EQ(count_tmp(tmp), 0);
    tu_tmpdir_restore(old);
}

/* ---- bad input ------------------------------------------------------------------- */

/* One epoch of dir with fields under policy; returns the samples delivered;
 * *errs the errors counted (skip) or the failing rc (raise). */
static size_t epoch_policy(const char *dir, int policy, int *rc_out, size_t *errs, char *msg,
                           size_t mn)
{
    tu_cfg c = {.path = dir, .bs = 4, .threads = 3, .on_error = policy};
    c.options[0] = "fields";
    c.options[1] = "image=image/encoded,caption,label=image/class/label";
    stk_loader *l = NULL;
    int rc = tu_open_cfg(&l, &c);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_batch *b;
    size_t got = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->nfields, 3);
        got += b->size;
        stk_batch_release(b);
    }
    *rc_out = rc;
    *errs = (size_t)stk_loader_error_count(l);
    snprintf(msg, mn, "%s", stk_loader_errmsg(l));
    if (policy == STK_ON_ERROR_SKIP && *errs) {
        stk_sample_error se;
        REQUIRE(stk_loader_error_get(l, 0, &se) == STK_OK);
        snprintf(msg, mn, "%s: %s", se.path, se.reason);
    }
    stk_loader_close(l);
    return got;
}

static void expect_bad(const char *dir, size_t want_samples, const char *n1, const char *n2)
{
    char msg[1024];
    uint64_t count;
    CHECK_EQ(tu_read_all(dir, msg, sizeof msg, &count), 1);
    CHECK_EQ(count, want_samples);
    if (!strstr(msg, n1) || !strstr(msg, n2))
        fprintf(stderr, "message lacks '%s' or '%s': %s\n", n1, n2, msg);
    CHECK(strstr(msg, n1) && strstr(msg, n2));
    int rc;
    size_t errs;
    CHECK_EQ(epoch_policy(dir, STK_ON_ERROR_SKIP, &rc, &errs, msg, sizeof msg), want_samples - 1);
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(errs, 1);
    CHECK(strstr(msg, n1) && strstr(msg, n2));
    epoch_policy(dir, STK_ON_ERROR_RAISE, &rc, &errs, msg, sizeof msg);
    CHECK_EQ(rc, STK_ESAMPLE);
}

static void test_data_crc(void)
{
    json_t *m = manifest("plain");
    const char *d = copy_fixture("plain", "crc", false);
    tu_patch(tu_join(d, "train-00000-of-00002.tfrecord"), rec_off(m, 3) + 12 + 500, "\x5a", 1);
    expect_bad(d, 60, "train-00000-of-00002.tfrecord#3", "data CRC does not match");
    json_decref(m);
}

static void test_length_crc(void)
{
    /* The walk cannot go past a length it cannot trust: file 0 ends with
     * record 5, which fails; file 1 is read whole. */
    json_t *m = manifest("plain");
    const char *d = copy_fixture("plain", "lcrc", false);
    tu_patch(tu_join(d, "train-00000-of-00002.tfrecord"), rec_off(m, 5) + 9, "\x00", 1);
    expect_bad(d, 36, "train-00000-of-00002.tfrecord#5", "length's CRC does not match");
    json_decref(m);
}

static void test_truncated(void)
{
    json_t *m = manifest("plain");
    /* Cut inside record 10 of file 1: records 0..9 read, 10 fails. */
    const char *d = copy_fixture("plain", "trunc", false);
    REQUIRE(truncate(tu_join(d, "train-00001-of-00002.tfrecord"), rec_off(m, 40) + 100) == 0);
    expect_bad(d, 41, "train-00001-of-00002.tfrecord#10", "runs past the end of the file");
    /* Cut inside record 10's header. */
    d = copy_fixture("plain", "trunc2", false);
    REQUIRE(truncate(tu_join(d, "train-00001-of-00002.tfrecord"), rec_off(m, 40) + 5) == 0);
    expect_bad(d, 41, "train-00001-of-00002.tfrecord#10", "truncated");
    /* A length that runs past the end (with a good CRC over it). */
    d = copy_fixture("plain", "long", false);
    uint8_t h[12];
    uint64_t big = 1ull << 40;
    for (int k = 0; k < 8; k++)
        h[k] = (uint8_t)(big >> (8 * k));
    uint32_t c = stk__crc32c(h, 8);
    c = ((c >> 15) | (c << 17)) + 0xa282ead8u;
    for (int k = 0; k < 4; k++)
        h[8 + k] = (uint8_t)(c >> (8 * k));
    tu_patch(tu_join(d, "train-00000-of-00002.tfrecord"), rec_off(m, 20), h, 12);
    expect_bad(d, 51, "train-00000-of-00002.tfrecord#20", "runs past the end of the file");
    json_decref(m);
}

/* Rewrites record i's data as data (same length) with a good data CRC. */
static void put_record_data(const char *file, long off, const uint8_t *data, size_t len)
{
    size_t n;
    uint8_t *b = tu_read_file(file, &n);
    REQUIRE(b && (size_t)off + 16 + len <= n);
    memcpy(b + off + 12, data, len);
    uint32_t c = stk__crc32c(data, len);
    c = ((c >> 15) | (c << 17)) + 0xa282ead8u;
    for (int k = 0; k < 4; k++)
        b[off + 12 + (long)len + k] = (uint8_t)(c >> (8 * k));
    tu_write_file(file, b, n);
    free(b);
}

static void test_malformed_example(void)
{
    json_t *m = manifest("plain");
    const char *d = copy_fixture("plain", "malformed", false);
    const char *f = tu_join(d, "train-00000-of-00002.tfrecord");
    size_t len = (size_t)json_integer_value(
        json_object_get(json_object_get(tu_manifest_sample(m, 7), "location"), "data_length"));
    uint8_t *junk = malloc(len);
    memset(junk, 0xff, len);
    put_record_data(f, rec_off(m, 7), junk, len);
    expect_bad(d, 60, "train-00000-of-00002.tfrecord#7", "not a tf.train.Example");
    /* A length-delimited field claiming more than the record holds. */
    d = copy_fixture("plain", "malformed2", false);
    f = tu_join(d, "train-00000-of-00002.tfrecord");
    size_t n;
    uint8_t *b = tu_read_file(f, &n);
    len = (size_t)json_integer_value(
        json_object_get(json_object_get(tu_manifest_sample(m, 8), "location"), "data_length"));
    junk = realloc(junk, len);
    memcpy(junk, b + rec_off(m, 8) + 12, len);
    free(b);
    junk[1] = 0xfe; /* features = 1: a varint length far past the end */
    junk[2] = 0xff;
    junk[3] = 0x7f;
    put_record_data(f, rec_off(m, 8), junk, len);
    expect_bad(d, 60, "train-00000-of-00002.tfrecord#8", "tf.train.Example");
    free(junk);
    json_decref(m);
}

/* ---- Examples written here ------------------------------------------------------- */

typedef struct pbuf {
    uint8_t b[4096];
    size_t n;
} pbuf;

static void pb_varint(pbuf *p, uint64_t v)
{
    while (v >= 0x80) {
        p->b[p->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p->b[p->n++] = (uint8_t)v;
}

static void pb_lenfield(pbuf *p, unsigned field, const void *data, size_t n)
{
    pb_varint(p, field << 3 | 2);
    pb_varint(p, n);
    memcpy(p->b + p->n, data, n);
    p->n += n;
}

/* A map entry of Features: key, and a Feature holding list (type t). */
static void pb_feature(pbuf *feats, const char *name, unsigned t, const pbuf *list)
{
    pbuf feature = {.n = 0}, entry = {.n = 0};
    pb_lenfield(&feature, t, list->b, list->n);
    pb_lenfield(&entry, 1, name, strlen(name));
    pb_lenfield(&entry, 2, feature.b, feature.n);
    pb_lenfield(feats, 1, entry.b, entry.n);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int k = 0; k < n; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

/* Appends one framed record to f. */
static void frame(FILE *f, const pbuf *ex)
{
    uint8_t h[12], t[4];
    put_le(h, ex->n, 8);
    uint32_t c = stk__crc32c(h, 8);
    put_le(h + 8, ((c >> 15) | (c << 17)) + 0xa282ead8u, 4);
    c = stk__crc32c(ex->b, ex->n);
    put_le(t, ((c >> 15) | (c << 17)) + 0xa282ead8u, 4);
    fwrite(h, 1, 12, f);
    fwrite(ex->b, 1, ex->n, f);
    fwrite(t, 1, 4, f);
}

/* Unpacked int64 and float values (after an empty packed run), a
 * multi-valued float list, a negative int, and a bytes payload not named as an image. */
static void test_written_here(void)
{
    const char *dir = tu_path("written");
    tu_mkdirs(dir);
    FILE *f = fopen(tu_join(dir, "a.tfrecord"), "wb");
    REQUIRE(f);
    for (int r = 0; r < 3; r++) {
        pbuf ints = {.n = 0}, floats = {.n = 0}, bytes = {.n = 0}, neg = {.n = 0};
        pbuf feats = {.n = 0}, ex = {.n = 0};
        pb_varint(&ints, 1 << 3 | 0); /* unpacked */
        pb_varint(&ints, (uint64_t)r + 1);
        float fv[2] = {1.5f + (float)r, -0.25f};
        pb_lenfield(&floats, 1, "", 0); /* an empty packed run first */
        for (int k = 0; k < 2; k++) {
            pb_varint(&floats, 1 << 3 | 5); /* unpacked */
            uint32_t u;
            memcpy(&u, &fv[k], 4);
            put_le(floats.b + floats.n, u, 4);
            floats.n += 4;
        }
        char payload[32];
        snprintf(payload, sizeof payload, "data-%d", r);
        pb_lenfield(&bytes, 1, payload, strlen(payload));
        pb_varint(&neg, 1 << 3 | 0);
        pb_varint(&neg, (uint64_t)(int64_t)-5);
        pb_feature(&feats, "label", 3, &ints);
        pb_feature(&feats, "blob", 1, &bytes);
        pb_feature(&feats, "vec", 2, &floats);
        pb_feature(&feats, "neg", 3, &neg);
        pb_lenfield(&ex, 1, feats.b, feats.n);
        frame(f, &ex);
    }
    fclose(f);
    stk_dataset *ds = NULL;
    char err[512];
    int rc = stk_dataset_open(&ds, tu_join(dir, "a.tfrecord"), NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(ds, &di) == STK_OK);
    CHECK_EQ(di.samples, 3);
    CHECK_EQ(di.classes, 4);
    CHECK(!di.payload || strcmp(di.payload, "encoded"));
    stk_dataset_field_info fi = {.struct_size = sizeof fi};
    REQUIRE(stk_dataset_field(ds, 2, &fi) == STK_OK);
    CHECK(!strcmp(fi.name, "vec") && fi.kind == STK_FIELD_JSON);
    for (uint64_t i = 0; i < 3; i++) {
        const void *p;
        size_t len;
        int64_t label;
        REQUIRE(stk_dataset_read(ds, i, &p, &len, &label, err, sizeof err) == STK_OK);
        char want[32];
        snprintf(want, sizeof want, "data-%d", (int)i);
        CHECK(len == strlen(want) && !memcmp(p, want, len));
        CHECK_EQ(label, (int64_t)i + 1);
    }
    stk_dataset_close(ds);
    tu_cfg c = {.path = tu_join(dir, "a.tfrecord"), .bs = 3, .threads = 1};
    c.options[0] = "fields";
    c.options[1] = "vec,neg,label,blob";
    stk_loader *l = NULL;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    const stk_field *vec = tu_field(b, "vec"), *neg = tu_field(b, "neg"),
                    *lab = tu_field(b, "label");
    CHECK_EQ(neg->kind, STK_FIELD_INT);
    for (size_t k = 0; k < b->size; k++) {
        char want[64];
        snprintf(want, sizeof want, "[%.9g,-0.25]", 1.5 + (double)b->indices[k]);
        CHECK(tu_text_is(vec, k, want));
        CHECK_EQ(((const int64_t *)neg->data)[k], -5);
        CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)b->indices[k] + 1);
    }
    stk_batch_release(b);
    stk_loader_close(l);
}

/* ---- allocation failures -----------------------------------------------------------
 * The n-th allocation of a session (open, which builds or loads the index,
 * then every read) fails, for every n until one passes: the session fails
 * with STK_ENOMEM or succeeds, nothing leaks, and the temporary area is
 * gone after every close. */

/* Removes the index files the reader keeps beside the files. */
static void forget_indexes(const char *dir)
{
    (void)unlink(tu_join(dir, "train-00000-of-00002.tfrecord.stkidx"));
    (void)unlink(tu_join(dir, "train-00001-of-00002.tfrecord.stkidx"));
    (void)unlink(tu_join(dir, "train-00000-of-00002.tfrecord.gz.stkidx"));
    (void)unlink(tu_join(dir, "train-00001-of-00002.tfrecord.gz.stkidx"));
}

/* fresh: each session builds the index (none kept); else it loads the one
 * the first session kept. */
static void oom_sweep(const char *variant, bool fresh)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", copy_fixture(variant, fresh ? "oomfresh" : "oomcached", true));
    tu_sweep w = {.dir = dir,
                  .samples = 60,
                  .tmp_prefix = "stoker-tfrecord-",
                  .before = fresh ? forget_indexes : NULL};
    tu_read_all(dir, NULL, 0, NULL); /* the kept index, for !fresh */
    tu_sweep_oom(&w);
}

static void test_oom(void)
{
    oom_sweep("plain", true);
    oom_sweep("plain", false);
    oom_sweep("gzip", true);
}

int main(void)
{
    tu_begin("test_tfrecord", 300);
    if (!fixtures()) {
        fprintf(stderr, "test_tfrecord: the TFRecord fixtures (../shared/fixtures/tfrecord, or "
                        "$STOKER_FIXTURES/tfrecord) are missing\n");
        return 1;
    }
    /* The fixtures are read-only: their indexes go to the user cache, kept
     * inside the test's directory. */
    setenv("XDG_CACHE_HOME", tu_path("xdg"), 1);
    RUN(test_crc32c);
    RUN(test_dataset_plain);
    RUN(test_dataset_gzip);
    RUN(test_file_and_pattern);
    RUN(test_fields_plain);
    RUN(test_fields_gzip);
    RUN(test_images_without_fields);
    RUN(test_dali_idx_used);
    RUN(test_index_cache);
    RUN(test_gzip_temporary_area);
    RUN(test_data_crc);
    RUN(test_length_crc);
    RUN(test_truncated);
    RUN(test_malformed_example);
    RUN(test_written_here);
    RUN(test_oom);
    return tu_end();
}
