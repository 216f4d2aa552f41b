/* test_dataset_api.c -- the public dataset-inspection API (stk_dataset_*):
 * a folder, a .stk set and a tar set described, listed and read; verify on
 * a sound set, a corrupt sample and a broken shard; clear errors on a
 * missing path and bad arguments. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint8_t *jpeg_of(uint8_t v, size_t *n)
{
    uint8_t rgb[16 * 16 * 3];
    memset(rgb, v, sizeof rgb);
    return tu_jpeg(rgb, 16, 16, 90, n);
}

static void test_folder(void)
{
    const char *names[] = {"cat/a.jpg", "cat/b.jpg", "dog/c.jpg"};
    tu_mkdirs(tu_path("folder/cat"));
    tu_mkdirs(tu_path("folder/dog"));
    size_t n0 = 0;
    uint8_t *j0 = NULL;
    for (int k = 0; k < 3; k++) {
        char rel[64];
        size_t n;
        uint8_t *j = jpeg_of((uint8_t)(40 * k), &n);
        snprintf(rel, sizeof rel, "folder/%s", names[k]);
        tu_write_file(tu_path(rel), j, n);
        if (k == 0)
            j0 = j, n0 = n;
        else
            free(j);
    }
    stk_dataset *d = NULL;
    char err[1024] = "";
    REQUIRE(stk_dataset_open(&d, tu_path("folder"), NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    CHECK_EQ(stk_dataset_describe(d, &di), STK_OK);
    CHECK(!strcmp(di.kind, "folder"));
    CHECK_EQ(di.samples, 3);
    CHECK_EQ(di.classes, 2);
    CHECK_EQ(di.shards, 0);
    CHECK(di.payload == NULL);
    CHECK(!strcmp(stk_dataset_class_name(d, 0), "cat"));
    CHECK(!strcmp(stk_dataset_class_name(d, 1), "dog"));
    CHECK(stk_dataset_class_name(d, 2) == NULL);
    char key[256];
    CHECK_EQ(stk_dataset_sample_key(d, 2, key, sizeof key), STK_OK);
    CHECK(!strcmp(key, "dog/c.jpg"));
    CHECK_EQ(stk_dataset_sample_key(d, 3, key, sizeof key), STK_EINVAL);
    const void *data;
    size_t len;
    int64_t label;
    CHECK_EQ(stk_dataset_read(d, 0, &data, &len, &label, err, sizeof err), STK_OK);
    CHECK_EQ(len, n0);
    CHECK(len == n0 && !memcmp(data, j0, n0));
    CHECK_EQ(label, 0);
    CHECK_EQ(stk_dataset_read(d, 2, &data, &len, &label, err, sizeof err), STK_OK);
    CHECK_EQ(label, 1);
    CHECK_EQ(stk_dataset_read(d, 3, &data, &len, &label, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "past the end") != NULL);
    stk_dataset_shard_info si = {.struct_size = sizeof si};
    CHECK_EQ(stk_dataset_shard(d, 0, &si), STK_EINVAL);
    stk_dataset_close(d);
    free(j0);

    /* A loader answers the same names (stk_loader_class_name). */
    stk_options *o = NULL;
    stk_loader *l = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set_source(o, tu_path("folder")), STK_OK);
    CHECK_EQ(stk_options_set_batch_size(o, 1), STK_OK);
    CHECK_EQ(stk_options_set_threads(o, 1), STK_OK);
    REQUIRE(stk_loader_open(&l, o) == STK_OK);
    CHECK(!strcmp(stk_loader_class_name(l, 0), "cat"));
    CHECK(!strcmp(stk_loader_class_name(l, 1), "dog"));
    CHECK(stk_loader_class_name(l, 2) == NULL);
    CHECK(stk_loader_class_name(NULL, 0) == NULL);
    stk_loader_close(l);
    stk_options_destroy(o);
}

/* Writes 6 samples (keys s0..s5, labels k % 2, classes "even" and "odd") in
 * shards of about two samples into dir. */
static void write_stk(const char *dir)
{
    stk_writer *w = NULL;
    char err[1024];
    stk_writer_options wo = {.struct_size = sizeof wo, .shard_size = 1, .num_classes = 2};
    REQUIRE(stk_writer_open(&w, dir, &wo, err, sizeof err) == STK_OK);
    for (int k = 0; k < 6; k++) {
        size_t n;
        uint8_t *j = jpeg_of((uint8_t)(30 * k), &n);
        char key[16];
        snprintf(key, sizeof key, "s%d", k);
        CHECK_EQ(stk_writer_add(w, j, n, k % 2, key), STK_OK);
        free(j);
    }
    CHECK_EQ(stk_writer_set_class_name(w, 0, "even"), STK_OK);
    CHECK_EQ(stk_writer_set_class_name(w, 1, "odd"), STK_OK);
    CHECK_EQ(stk_writer_finish(w, NULL), STK_OK);
    stk_writer_close(w);
}

static void test_stk(void)
{
    const char *dir = tu_path("stk");
    write_stk(dir);
    stk_dataset *d = NULL;
    char err[1024] = "";
    REQUIRE(stk_dataset_open(&d, dir, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    CHECK_EQ(stk_dataset_describe(d, &di), STK_OK);
    CHECK(!strcmp(di.kind, "stk"));
    CHECK(di.payload && !strcmp(di.payload, "encoded"));
    CHECK_EQ(di.samples, 6);
    CHECK_EQ(di.classes, 2);
    CHECK(di.shards >= 2);
    CHECK_EQ(di.files, di.shards);
    CHECK(di.bytes > 0);
    uint64_t next = 0;
    for (uint64_t k = 0; k < di.shards; k++) {
        stk_dataset_shard_info si = {.struct_size = sizeof si};
        CHECK_EQ(stk_dataset_shard(d, k, &si), STK_OK);
        CHECK_EQ(si.first, next);
        CHECK(si.count > 0);
        next = si.first + si.count;
    }
    CHECK_EQ(next, 6);
    stk_dataset_shard_info bad = {.struct_size = 1};
    CHECK_EQ(stk_dataset_shard(d, 0, &bad), STK_EINVAL);
    CHECK(!strcmp(stk_dataset_class_name(d, 1), "odd"));
    char key[64];
    CHECK_EQ(stk_dataset_sample_key(d, 4, key, sizeof key), STK_OK);
    CHECK(!strcmp(key, "s4"));
    const void *data;
    size_t len;
    int64_t label;
    size_t n;
    uint8_t *j = jpeg_of(30 * 3, &n);
    CHECK_EQ(stk_dataset_read(d, 3, &data, &len, &label, err, sizeof err), STK_OK);
    CHECK(len == n && !memcmp(data, j, n));
    CHECK_EQ(label, 1);
    free(j);
    stk_dataset_close(d);

    tu_problems s = {0};
    stk_verify_result r = {.struct_size = sizeof r};
    CHECK_EQ(stk_dataset_verify(dir, NULL, tu_on_problem, &s, &r, err, sizeof err), STK_OK);
    CHECK_EQ(s.n, 0);
    CHECK_EQ(r.checked, 6);
    CHECK_EQ(r.corrupt + r.manifest + r.bad_shards + r.too_large, 0);
    CHECK_EQ(r.whole, 1);

    /* max_input_bytes comes from the options (the smallest allowed). */
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "max_input_bytes", "4096"), STK_OK);
    memset(&s, 0, sizeof s);
    CHECK_EQ(stk_dataset_verify(dir, o, tu_on_problem, &s, &r, err, sizeof err), STK_OK);
    CHECK_EQ(r.too_large, 0); /* 16x16 JPEGs are far below 4 KiB */
    stk_options_destroy(o);
}

/* The byte offset of needle in the file at path (which must hold it). */
static size_t offset_of(const char *path, const void *needle, size_t nl, uint8_t **buf, size_t *n)
{
    *buf = tu_read_file(path, n);
    REQUIRE(*buf != NULL);
    for (size_t k = 0; k + nl <= *n; k++)
        if (!memcmp(*buf + k, needle, nl))
            return k;
    REQUIRE(!"needle not found");
    return 0;
}

static void test_stk_corrupt(void)
{
    const char *dir = tu_path("bad");
    char err[1024] = "", shard0[4096], shard1[4096];
    write_stk(dir);
    snprintf(shard0, sizeof shard0, "%s/%s", dir, "part-000000.stk");
    snprintf(shard1, sizeof shard1, "%s/%s", dir, "part-000001.stk");
    REQUIRE(access(shard0, F_OK) == 0 && access(shard1, F_OK) == 0);
    /* Flip one byte inside sample 0's JPEG payload (past its header). */
    size_t n, jn;
    uint8_t *j = jpeg_of(0, &jn), *b;
    size_t at = offset_of(shard0, j, jn, &b, &n);
    b[at + jn / 2] ^= 0x55;
    tu_write_file(shard0, b, n);
    free(b);
    free(j);
    stk_dataset *d = NULL;
    REQUIRE(stk_dataset_open(&d, dir, NULL, err, sizeof err) == STK_OK);
    const void *data;
    size_t len;
    CHECK_EQ(stk_dataset_read(d, 0, &data, &len, NULL, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "sample 0") != NULL && strstr(err, "s0") != NULL);
    stk_dataset_close(d);

    tu_problems s = {0};
    stk_verify_result r = {.struct_size = sizeof r};
    CHECK_EQ(stk_dataset_verify(dir, NULL, tu_on_problem, &s, &r, err, sizeof err), STK_OK);
    CHECK_EQ(r.corrupt, 1);
    CHECK_EQ(r.checked, 6);
    CHECK_EQ(s.n, 1);
    CHECK_EQ(s.kinds[0], STK_VERIFY_CORRUPT);
    CHECK(strstr(s.names[0], "s0") != NULL);
    CHECK(strstr(s.reasons[0], "checksum") != NULL);

    /* Cut the second shard short: the dataset no longer opens; verify checks
     * the others shard by shard and reports the broken one whole. */
    b = tu_read_file(shard1, &n);
    REQUIRE(b != NULL);
    tu_write_file(shard1, b, n / 2);
    free(b);
    CHECK(stk_dataset_open(&d, dir, NULL, err, sizeof err) < 0);
    CHECK(d == NULL);
    CHECK(strstr(err, "part-000001.stk") != NULL);
    memset(&s, 0, sizeof s);
    CHECK_EQ(stk_dataset_verify(dir, NULL, tu_on_problem, &s, &r, err, sizeof err), STK_OK);
    CHECK_EQ(r.whole, 0);
    CHECK_EQ(r.bad_shards, 1);
    CHECK(r.unreadable > 0);
    CHECK_EQ(r.corrupt, 1);
    int shard_seen = 0, dataset_seen = 0, manifest_seen = 0;
    for (int k = 0; k < s.n && k < 16; k++) {
        shard_seen += s.kinds[k] == STK_VERIFY_SHARD && strstr(s.names[k], "part-000001.stk");
        dataset_seen += s.kinds[k] == STK_VERIFY_DATASET;
        manifest_seen += s.kinds[k] == STK_VERIFY_MANIFEST;
    }
    CHECK_EQ(shard_seen, 1);
    CHECK_EQ(dataset_seen, 1);
    CHECK(manifest_seen >= 1); /* its size no longer matches the manifest */
    CHECK_EQ(r.manifest, (uint64_t)manifest_seen);
}

static void test_tar(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    size_t n0;
    uint8_t *j0 = jpeg_of(10, &n0);
    tu_tar_add(&t, &tn, "a.jpg", j0, n0);
    tu_tar_add(&t, &tn, "a.cls", "1", 1);
    size_t n1;
    uint8_t *j1 = jpeg_of(200, &n1);
    tu_tar_add(&t, &tn, "b.jpg", j1, n1);
    tu_tar_add(&t, &tn, "b.cls", "0", 1);
    t = realloc(t, tn + 1024); /* the end-of-archive blocks */
    REQUIRE(t != NULL);
    memset(t + tn, 0, 1024);
    tn += 1024;
    tu_mkdirs(tu_path("tarset"));
    tu_write_file(tu_path("tarset/part-0.tar"), t, tn);
    free(t);
    stk_dataset *d = NULL;
    char err[1024] = "";
    REQUIRE(stk_dataset_open(&d, tu_path("tarset"), NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    CHECK_EQ(stk_dataset_describe(d, &di), STK_OK);
    CHECK(!strcmp(di.kind, "tar"));
    CHECK_EQ(di.samples, 2);
    CHECK_EQ(di.shards, 1);
    char key[64];
    CHECK_EQ(stk_dataset_sample_key(d, 1, key, sizeof key), STK_OK);
    CHECK(!strcmp(key, "b"));
    CHECK(stk_dataset_class_name(d, 0) == NULL);
    const void *data;
    size_t len;
    int64_t label = -7;
    CHECK_EQ(stk_dataset_read(d, 0, &data, &len, &label, err, sizeof err), STK_OK);
    CHECK(len == n0 && !memcmp(data, j0, n0));
    stk_dataset_close(d);
    tu_problems s = {0};
    stk_verify_result r = {.struct_size = sizeof r};
    CHECK_EQ(stk_dataset_verify(tu_path("tarset"), NULL, tu_on_problem, &s, &r, err, sizeof err),
             STK_OK);
    CHECK_EQ(r.checked, 2);
    CHECK_EQ(s.n, 0);
    free(j0);
    free(j1);
}

/* The generic fields come from what the source table says its samples are
 * (STK__SRC_IMAGES): records are plain bytes ("data"), a folder's files are
 * images ("image"). */
static void test_generic_fields(void)
{
    uint8_t rec[4 * 9];
    for (size_t k = 0; k < sizeof rec; k++)
        rec[k] = (uint8_t)(k % 9 == 0 ? k / 9 : k);
    tu_write_file(tu_path("recs.bin"), rec, sizeof rec);
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK && stk_options_set_records(o, 9, 0, 1) == STK_OK);
    stk_dataset *d = NULL;
    char err[1024] = "";
    int rc = stk_dataset_open(&d, tu_path("recs.bin"), o, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset_field_info fi = {.struct_size = sizeof fi};
    CHECK(stk_dataset_field_count(d) >= 1);
    CHECK_EQ(stk_dataset_field(d, 0, &fi), STK_OK);
    CHECK(!strcmp(fi.name, "data"));
    CHECK_EQ(fi.kind, STK_FIELD_BYTES);
    stk_dataset_close(d);
    stk_options_destroy(o);
    /* test_folder left a folder of JPEGs. */
    REQUIRE(stk_dataset_open(&d, tu_path("folder"), NULL, err, sizeof err) == STK_OK);
    CHECK(stk_dataset_field_count(d) >= 1);
    CHECK_EQ(stk_dataset_field(d, 0, &fi), STK_OK);
    CHECK(!strcmp(fi.name, "image"));
    CHECK_EQ(fi.kind, STK_FIELD_IMAGE);
    stk_dataset_close(d);
}

static void test_errors(void)
{
    stk_dataset *d = (stk_dataset *)&d;
    char err[1024] = "";
    const char *missing = tu_path("no-such-dataset");
    CHECK_EQ(stk_dataset_open(&d, missing, NULL, err, sizeof err), STK_ENOENT);
    CHECK(d == NULL);
    CHECK(strstr(err, "no-such-dataset") != NULL);
    CHECK_EQ(stk_dataset_open(&d, "", NULL, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "no dataset path") != NULL);
    CHECK_EQ(stk_dataset_open(NULL, missing, NULL, err, sizeof err), STK_EINVAL);
    stk_verify_result r = {.struct_size = sizeof r};
    CHECK_EQ(stk_dataset_verify(missing, NULL, NULL, NULL, &r, err, sizeof err), STK_ENOENT);
    CHECK(strstr(err, "cannot open") != NULL && strstr(err, "no-such-dataset") != NULL);
    r.struct_size = 0;
    CHECK_EQ(stk_dataset_verify(missing, NULL, NULL, NULL, &r, err, sizeof err), STK_EINVAL);
    CHECK(stk_dataset_class_name(NULL, 0) == NULL);
    stk_dataset_close(NULL);
    char buf[64];
    CHECK(
        !strcmp(stk_path_display("s3://user:secret@bucket/set?X-Amz-Signature=1", buf, sizeof buf),
                "s3://bucket/set?..."));
    CHECK(!strcmp(stk_path_display("/data/set", buf, sizeof buf), "/data/set"));
}

int main(void)
{
    tu_begin("test_dataset_api", 120);
    RUN(test_folder);
    RUN(test_stk);
    RUN(test_stk_corrupt);
    RUN(test_tar);
    RUN(test_generic_fields);
    RUN(test_errors);
    return tu_end();
}
