/* test_mds.c -- MosaicML Streaming (MDS) datasets read in place
 * (src/source/mds.c): the fixtures written by Streaming's own MDSWriter
 * (../shared/fixtures/mds/{plain,zstd,jpeg}, each with a manifest of what
 * every sample holds) read through the dataset API and the loader with
 * fields, every field of every sample compared with the manifest, whole
 * epochs over 1 and 3 threads; encodings the fixtures lack, in shards made
 * here the way writer.py lays them out; and bad input: a truncated shard,
 * an index.json that lies about counts or sizes, a corrupt record, pkl and
 * unknown encodings, a cut-off zstd shard -- each a clear error naming the
 * file and the sample or offset; and sweeps of I/O faults over every file
 * call and of allocation failures over every allocation of a session. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <stdbool.h>

#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fixtures ------------------------------------------------------------------ */

static const char *fixtures(void)
{
    return tu_fixtures("mds");
}

static json_t *manifest(const char *variant)
{
    return tu_fixture_manifest("mds", variant);
}

static const char *fixture(const char *variant)
{
    return tu_fixture("mds", variant);
}

/* ---- the dataset API ----------------------------------------------------------- */

static const char *const k_cols[] = {"aspect", "caption", "height", "image",
                                     "label",  "meta",    "width"};

static void check_dataset(const char *variant, int image_kind)
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
    CHECK(!strcmp(di.kind, "mds"));
    CHECK_EQ(di.samples, n);
    CHECK_EQ(di.shards, 4);
    CHECK_EQ(di.files, 4);
    CHECK(!strcmp(di.payload, "encoded"));
    /* The shard files as stored (the zips for .mds.zstd). */
    json_t *files = json_object_get(m, "files");
    int64_t stored = 0;
    for (size_t k = 0; k < json_array_size(files); k++)
        if (strcmp(json_string_value(json_object_get(json_array_get(files, k), "path")),
                   "index.json"))
            stored += json_integer_value(json_object_get(json_array_get(files, k), "bytes"));
    CHECK_EQ(di.bytes, stored);
    int64_t maxl = -1;
    for (size_t i = 0; i < n; i++)
        if (tu_json_int(tu_manifest_sample(m, i), "label") > maxl)
            maxl = tu_json_int(tu_manifest_sample(m, i), "label");
    CHECK_EQ(di.classes, maxl + 1);
    /* stoker info's column list. */
    REQUIRE(stk_dataset_field_count(d) == 7);
    const int kinds[7] = {STK_FIELD_FLOAT, STK_FIELD_TEXT, STK_FIELD_INT, image_kind,
                          STK_FIELD_INT,   STK_FIELD_JSON, STK_FIELD_INT};
    for (size_t k = 0; k < 7; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK(!strcmp(fi.name, k_cols[k]));
        CHECK_EQ(fi.kind, kinds[k]);
        CHECK_EQ(fi.samples, n);
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
        CHECK(!strcmp(hex, json_string_value(json_object_get(s, "sha256"))));
        CHECK_EQ(label, tu_json_int(s, "label"));
        char key[256];
        REQUIRE(stk_dataset_sample_key(d, i, key, sizeof key) == STK_OK);
        const char *file =
            json_string_value(json_object_get(json_object_get(s, "location"), "file"));
        char want[256];
        snprintf(want, sizeof want, "%s#%lld", file,
                 (long long)json_integer_value(
                     json_object_get(json_object_get(s, "location"), "index_in_file")));
        CHECK(!strcmp(key, want));
    }
    stk_dataset_close(d);
    json_decref(m);
}

static void test_dataset_plain(void)
{
    check_dataset("plain", STK_FIELD_AUTO);
}

static void test_dataset_zstd(void)
{
    check_dataset("zstd", STK_FIELD_AUTO);
}

static void test_dataset_jpeg(void)
{
    check_dataset("jpeg", STK_FIELD_IMAGE);
}

/* ---- the loader with fields ---------------------------------------------------- */

/* One epoch with every column as a field; each sample compared with the
 * manifest; returns a hash of the batches (order included). */
static uint64_t epoch_fields(const char *variant, unsigned threads)
{
    json_t *m = manifest(variant);
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, fixture(variant)) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 11) == STK_OK);
    REQUIRE(stk_options_set_fields(o, "image,caption,meta,label,width,height,aspect") == STK_OK);
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
        const stk_field *meta = tu_field(b, "meta"), *lab = tu_field(b, "label");
        const stk_field *w = tu_field(b, "width"), *ht = tu_field(b, "height"),
                        *asp = tu_field(b, "aspect");
        CHECK_EQ(lab->kind, STK_FIELD_INT);
        CHECK_EQ(asp->kind, STK_FIELD_FLOAT);
        CHECK_EQ(cap->kind, STK_FIELD_TEXT);
        CHECK_EQ(meta->kind, STK_FIELD_JSON);
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
            CHECK(!strcmp(hex, json_string_value(json_object_get(s, "sha256"))));
            const char *want = json_string_value(json_object_get(s, "caption"));
            CHECK_EQ(cap->lengths[k], strlen(want));
            CHECK(!memcmp((const char *)cap->data + cap->offsets[k], want, strlen(want)));
            /* The meta column is json.dumps' text: equal as JSON, and byte
             * for byte to the same dump (ASCII escapes, ", " and ": "). */
            json_error_t je;
            json_t *got =
                json_loadb((const char *)meta->data + meta->offsets[k], meta->lengths[k], 0, &je);
            CHECK(got && json_equal(got, json_object_get(s, "meta")));
            char *dump =
                json_dumps(json_object_get(s, "meta"), JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER);
            /* Python writes \u00e9 where jansson writes \u00E9. */
            for (char *u = dump; u && (u = strstr(u, "\\u")); u += 2)
                for (int x = 2; x < 6 && u[x]; x++)
                    u[x] = (char)tolower((unsigned char)u[x]);
            CHECK(dump && strlen(dump) == meta->lengths[k] &&
                  !memcmp(dump, (const char *)meta->data + meta->offsets[k], meta->lengths[k]));
            free(dump);
            json_decref(got);
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

static void test_fields_plain(void)
{
    CHECK_EQ(epoch_fields("plain", 1), epoch_fields("plain", 3));
}

static void test_fields_zstd(void)
{
    CHECK_EQ(epoch_fields("zstd", 1), epoch_fields("zstd", 3));
}

static void test_fields_jpeg(void)
{
    CHECK_EQ(epoch_fields("jpeg", 3), epoch_fields("plain", 3));
}

/* Without fields: an image pipeline over the image column and the labels. */
static void test_images_without_fields(void)
{
    tu_check_images_without_fields("mds", "jpeg");
}

/* .mds.zstd shards are decompressed into $TMPDIR/stoker-mds-*, removed at
 * close. */
static int count_tmp(const char *dir)
{
    return tu_count_prefixed(dir, "stoker-mds-");
}

static void test_zstd_temporary_area(void)
{
    const char *tmp = tu_path("tmparea");
    char *old = tu_tmpdir_use(tmp);
    stk_dataset *d = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&d, fixture("zstd"), NULL, err, sizeof err) == STK_OK);
    CHECK_EQ(count_tmp(tmp), 1);
    stk_dataset_close(d);
    CHECK_EQ(count_tmp(tmp), 0);
    tu_tmpdir_restore(old);
}

/* ---- datasets made here ---------------------------------------------------------- */

/* Copies fixture variant into the temporary directory as name. */
static const char *copy_fixture(const char *variant, const char *name)
{
    return tu_copy_dir(fixture(variant), name);
}

/* Rewrites dir/index.json after edit(root) changed it. */
static void edit_index(const char *dir, void (*edit)(json_t *))
{
    json_t *root = json_load_file(tu_join(dir, "index.json"), 0, NULL);
    REQUIRE(root);
    edit(root);
    REQUIRE(json_dump_file(root, tu_join(dir, "index.json"), JSON_SORT_KEYS) == 0);
    json_decref(root);
}

static json_t *shard0(json_t *root)
{
    return json_array_get(json_object_get(root, "shards"), 0);
}

static void lie_count(json_t *r)
{
    json_object_set_new(shard0(r), "samples", json_integer(19));
}
static void lie_size(json_t *r)
{
    json_array_set_new(json_object_get(shard0(r), "column_sizes"), 2, json_integer(4));
}
static void make_pkl(json_t *r)
{
    json_t *shards = json_object_get(r, "shards");
    for (size_t k = 0; k < json_array_size(shards); k++)
        json_array_set_new(json_object_get(json_array_get(shards, k), "column_encodings"), 5,
                           json_string("pkl"));
}
static void make_unknown(json_t *r)
{
    json_t *shards = json_object_get(r, "shards");
    for (size_t k = 0; k < json_array_size(shards); k++)
        json_array_set_new(json_object_get(json_array_get(shards, k), "column_encodings"), 0,
                           json_string("float128"));
}
static void make_gz(json_t *r)
{
    json_object_set_new(shard0(r), "compression", json_string("gz"));
}
static void bad_hash(json_t *r)
{
    json_object_set_new(json_object_get(json_object_get(shard0(r), "raw_data"), "hashes"), "xxh64",
                        json_string("0123456789abcdef"));
}
static void small_raw(json_t *r)
{
    json_object_set_new(json_object_get(shard0(r), "raw_data"), "bytes", json_integer(1000));
}
static void differ(json_t *r)
{
    json_array_set_new(
        json_object_get(json_array_get(json_object_get(r, "shards"), 1), "column_encodings"), 2,
        json_string("uint32"));
}

static void test_index_lies(void)
{
    const char *d = copy_fixture("plain", "count");
    edit_index(d, lie_count);
    tu_expect_open(d, STK_EFORMAT, "shard.00000.mds", "holds 18 samples, but index.json says 19");
    d = copy_fixture("plain", "size");
    edit_index(d, lie_size);
    tu_expect_open(d, STK_EFORMAT, "index.json",
                   "column 'height' (uint16) has column_sizes entry 4");
    d = copy_fixture("plain", "pkl");
    edit_index(d, make_pkl);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "column 'meta' is encoded 'pkl'");
    d = copy_fixture("plain", "unknown");
    edit_index(d, make_unknown);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "'float128'");
    d = copy_fixture("plain", "gz");
    edit_index(d, make_gz);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "'gz'");
    d = copy_fixture("plain", "differ");
    edit_index(d, differ);
    tu_expect_open(d, STK_EUNSUPPORTED, "shard 1 (shard.00001.mds)", "other columns");
    d = copy_fixture("zstd", "hash");
    edit_index(d, bad_hash);
    tu_expect_open(d, STK_EFORMAT, "shard.00000.mds.zstd", "xxh64");
    d = copy_fixture("zstd", "bomb");
    edit_index(d, small_raw);
    tu_expect_open(d, STK_EFORMAT, "shard.00000.mds.zstd", "more than the 1000 bytes");
    d = copy_fixture("plain", "notjson");
    tu_write_file(tu_join(d, "index.json"), "{\"shards\": [{\"format\": \"mds\",", 30);
    tu_expect_open(d, STK_EFORMAT, "index.json", "not valid JSON (line 1");
    d = copy_fixture("plain", "missing");
    REQUIRE(unlink(tu_join(d, "shard.00002.mds")) == 0);
    tu_expect_open(d, STK_ENOENT, "shard.00002.mds", NULL);
}

static void test_truncated_shard(void)
{
    /* Cut inside shard 1's records: the samples before the cut read, those
     * after fail naming the shard and the offsets; the loader under skip
     * delivers the rest. */
    const char *d = copy_fixture("plain", "trunc");
    const char *sh = tu_join(d, "shard.00001.mds");
    uint32_t off5 = tu_read_le32(sh, 4 + 4 * 5);
    REQUIRE(truncate(sh, off5 + 100) == 0);
    char msg[1024];
    int bad = tu_read_all(d, msg, sizeof msg, NULL);
    CHECK_EQ(bad, 16 - 5);
    CHECK(strstr(msg, "shard.00001.mds#5") != NULL);
    CHECK(strstr(msg, "truncated") != NULL);
    tu_cfg c = {.path = d, .bs = 4, .threads = 3, .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l = NULL;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    size_t got = 0;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        got += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(got, 60 - 11);
    CHECK_EQ(stk_loader_error_count(l), 11);
    stk_sample_error se;
    REQUIRE(stk_loader_error_get(l, 0, &se) == STK_OK);
    CHECK(strstr(se.path, "shard.00001.mds#") && strstr(se.reason, "truncated"));
    stk_loader_close(l);
    /* The same with fields. */
    c.options[0] = "fields";
    c.options[1] = "image,caption,label";
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    got = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->nfields, 3);
        got += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(got, 60 - 11);
    CHECK_EQ(stk_loader_error_count(l), 11);
    stk_loader_close(l);
    /* Cut inside the offsets table: the open fails naming the file. */
    d = copy_fixture("plain", "trunc2");
    REQUIRE(truncate(tu_join(d, "shard.00003.mds"), 20) == 0);
    tu_expect_open(d, STK_EFORMAT, "shard.00003.mds", "offsets table");
    /* A zstd shard cut off. */
    d = copy_fixture("zstd", "trunc3");
    REQUIRE(truncate(tu_join(d, "shard.00002.mds.zstd"), 5000) == 0);
    tu_expect_open(d, STK_EFORMAT, "shard.00002.mds.zstd", "cut off");
    /* A zstd shard with a flipped byte: the stream or the xxh64 says so. */
    d = copy_fixture("zstd", "flip");
    tu_patch(tu_join(d, "shard.00001.mds.zstd"), 40000, "\xff\x00\xff", 3);
    tu_expect_open(d, STK_EFORMAT, "shard.00001.mds.zstd", NULL);
}

static void test_corrupt_records(void)
{
    /* Offsets table going backwards: refused at open. */
    const char *d = copy_fixture("plain", "offs");
    tu_patch(tu_join(d, "shard.00000.mds"), 4 + 4 * 3, "\x10\x00\x00\x00", 4);
    tu_expect_open(d, STK_EFORMAT, "shard.00000.mds", "offsets table is corrupt: entry 3");
    /* A record's size header lying about its caption: that sample fails,
     * naming its shard, position and offset; the others read. */
    d = copy_fixture("plain", "rec");
    const char *sh = tu_join(d, "shard.00002.mds");
    uint32_t off7 = tu_read_le32(sh, 4 + 4 * 7);
    tu_patch(sh, (long)off7, "\xff\xff\x00\x00", 4);
    char msg[1024];
    CHECK_EQ(tu_read_all(d, msg, sizeof msg, NULL), 1);
    char want[64];
    snprintf(want, sizeof want, "record at offset %u", off7);
    CHECK(strstr(msg, "shard.00002.mds#7") && strstr(msg, want) && strstr(msg, "caption"));
    if (!strstr(msg, want))
        fprintf(stderr, "%s\n", msg);
}

/* ---- encodings the fixtures lack ------------------------------------------------------
 * Shards laid out as writer.py's encode_sample and encode_joint_shard do:
 * u32 count, u32 offsets[count + 1] (absolute), the config JSON, records of
 * (u32 size per variable column) + column bytes; columns in sorted order. */

typedef struct col {
    const char *name, *enc;
    int size; /* -1: variable */
} col;

static void put32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

/* Writes dir/index.json and dir/shard.00000.mds from n records. */
static void write_mds(const char *dir, const col *cols, size_t nc, uint8_t **recs,
                      const size_t *lens, size_t n)
{
    tu_mkdirs(dir);
    json_t *names = json_array(), *encs = json_array(), *sizes = json_array();
    for (size_t k = 0; k < nc; k++) {
        json_array_append_new(names, json_string(cols[k].name));
        json_array_append_new(encs, json_string(cols[k].enc));
        json_array_append_new(sizes, cols[k].size < 0 ? json_null() : json_integer(cols[k].size));
    }
    json_t *cfg = json_pack("{s:o,s:o,s:o,s:n,s:s,s:[],s:i,s:i}", "column_encodings", encs,
                            "column_names", names, "column_sizes", sizes, "compression", "format",
                            "mds", "hashes", "size_limit", 1 << 26, "version", 2);
    char *ctext = json_dumps(cfg, JSON_SORT_KEYS);
    size_t cl = strlen(ctext), head = 4 + 4 * (n + 1) + cl, total = head;
    for (size_t i = 0; i < n; i++)
        total += lens[i];
    uint8_t *sh = malloc(total);
    put32(sh, (uint32_t)n);
    size_t at = head;
    for (size_t i = 0; i <= n; i++) {
        put32(sh + 4 + 4 * i, (uint32_t)at);
        if (i < n) {
            memcpy(sh + at, recs[i], lens[i]);
            at += lens[i];
        }
    }
    memcpy(sh + 4 + 4 * (n + 1), ctext, cl);
    tu_write_file(tu_join(dir, "shard.00000.mds"), sh, total);
    json_t *shard = json_deep_copy(cfg);
    json_object_set_new(shard, "raw_data",
                        json_pack("{s:s,s:I,s:{}}", "basename", "shard.00000.mds", "bytes",
                                  (json_int_t)total, "hashes"));
    json_object_set_new(shard, "samples", json_integer((json_int_t)n));
    json_object_set_new(shard, "zip_data", json_null());
    json_t *index = json_pack("{s:[o],s:i}", "shards", shard, "version", 2);
    REQUIRE(json_dump_file(index, tu_join(dir, "index.json"), JSON_SORT_KEYS) == 0);
    json_decref(index);
    json_decref(cfg);
    free(ctext);
    free(sh);
}

static void test_more_encodings(void)
{
    /* Sorted by name, as MDSWriter sorts them. */
    const col cols[] = {
        {"a_i8", "int8", 1},      {"b_i16", "int16", 2},      {"c_i32", "int32", 4},
        {"d_u32", "uint32", 4},   {"e_u64", "uint64", 8},     {"f_f16", "float16", 2},
        {"g_f64", "float64", 8},  {"h_sint", "str_int", -1},  {"i_arr", "ndarray:uint8:2,3", 6},
        {"j_dyn", "ndarray", -1}, {"k_pil", "pil", -1},       {"l_png", "png", -1},
        {"m_i64", "int64", 8},    {"n_sfl", "str_float", -1},
    };
    const size_t nc = sizeof cols / sizeof cols[0];
    uint8_t r0[512], *recs[1] = {r0};
    size_t p = 0;
    /* Sizes of the variable columns, in order: str_int, ndarray, pil, png, str_float. */
    const char *sint = "-12345678901";
    const uint8_t dyn[] = {34, (2 << 2) | 0, 1, 2, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
    uint8_t pil[12 + 1 + 4];
    put32(pil, 2), put32(pil + 4, 2), put32(pil + 8, 1);
    pil[12] = 'L';
    memcpy(pil + 13, "\x01\x02\x03\x04", 4);
    const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const char *sfl = "0.1";
    uint32_t vs[5] = {(uint32_t)strlen(sint), sizeof dyn, sizeof pil, sizeof png,
                      (uint32_t)strlen(sfl)};
    for (int k = 0; k < 5; k++)
        put32(r0 + p, vs[k]), p += 4;
    r0[p++] = 0x80;                                                     /* int8 -128 */
    r0[p++] = 0xfe, r0[p++] = 0xff;                                     /* int16 -2 */
    put32(r0 + p, 0x80000000u), p += 4;                                 /* int32 -2147483648 */
    put32(r0 + p, 4000000000u), p += 4;                                 /* uint32 */
    put32(r0 + p, 0xffffffffu), put32(r0 + p + 4, 0x7fffffffu), p += 8; /* uint64 INT64_MAX */
    r0[p++] = 0x00, r0[p++] = 0x3e;                                     /* float16 1.5 */
    double g = 0.1;
    memcpy(r0 + p, &g, 8), p += 8;
    memcpy(r0 + p, sint, strlen(sint)), p += strlen(sint);
    memcpy(r0 + p, "\x01\x02\x03\x04\x05\x06", 6), p += 6;
    memcpy(r0 + p, dyn, sizeof dyn), p += sizeof dyn;
    memcpy(r0 + p, pil, sizeof pil), p += sizeof pil;
    memcpy(r0 + p, png, sizeof png), p += sizeof png;
    int64_t m = -5;
    memcpy(r0 + p, &m, 8), p += 8;
    memcpy(r0 + p, sfl, strlen(sfl)), p += strlen(sfl);
    const char *dir = tu_path("encodings");
    write_mds(dir, cols, nc, recs, &p, 1);

    stk_dataset *d = NULL;
    char err[512];
    int rc = stk_dataset_open(&d, dir, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    const int kinds[] = {STK_FIELD_INT,   STK_FIELD_INT,   STK_FIELD_INT,   STK_FIELD_INT,
                         STK_FIELD_INT,   STK_FIELD_FLOAT, STK_FIELD_FLOAT, STK_FIELD_INT,
                         STK_FIELD_BYTES, STK_FIELD_BYTES, STK_FIELD_BYTES, STK_FIELD_IMAGE,
                         STK_FIELD_INT,   STK_FIELD_FLOAT};
    REQUIRE(stk_dataset_field_count(d) == nc);
    for (size_t k = 0; k < nc; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK_EQ(fi.kind, kinds[k]);
    }
    /* The payload without fields is the png column (the only image). */
    const void *data;
    size_t len;
    int64_t label;
    REQUIRE(stk_dataset_read(d, 0, &data, &len, &label, err, sizeof err) == STK_OK);
    CHECK(len == sizeof png && !memcmp(data, png, len));
    CHECK_EQ(label, -1);
    stk_dataset_close(d);

    /* Through the loader: numbers as int64/float32 exactly, the rest as stored. */
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, dir) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 1) == STK_OK);
    REQUIRE(stk_options_set_fields(o, "a_i8,b_i16,c_i32,d_u32,e_u64,f_f16,g_f64,h_sint,i_arr,"
                                      "j_dyn,k_pil,l_png,m_i64,n_sfl") == STK_OK);
    stk_loader *l = NULL;
    rc = stk_loader_open(&l, o);
    if (rc)
        fprintf(stderr, "%s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_options_destroy(o);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    const int64_t ints[] = {-128, -2, INT32_MIN, 4000000000LL, INT64_MAX};
    for (int k = 0; k < 5; k++)
        CHECK_EQ(((const int64_t *)b->fields[k].data)[0], ints[k]);
    CHECK(((const float *)b->fields[5].data)[0] == 1.5f);
    CHECK(((const float *)b->fields[6].data)[0] == 0.1f);
    CHECK_EQ(((const int64_t *)b->fields[7].data)[0], -12345678901LL);
    const stk_field *f = &b->fields[8];
    CHECK(f->lengths[0] == 6 &&
          !memcmp((const uint8_t *)f->data + f->offsets[0], "\x01\x02\x03\x04\x05\x06", 6));
    f = &b->fields[9];
    CHECK(f->lengths[0] == sizeof dyn &&
          !memcmp((const uint8_t *)f->data + f->offsets[0], dyn, sizeof dyn));
    f = &b->fields[10];
    CHECK(f->lengths[0] == sizeof pil &&
          !memcmp((const uint8_t *)f->data + f->offsets[0], pil, sizeof pil));
    CHECK_EQ(((const int64_t *)b->fields[12].data)[0], -5);
    CHECK(((const float *)b->fields[13].data)[0] == 0.1f);
    stk_batch_release(b);
    stk_loader_close(l);
}

/* ---- I/O faults ------------------------------------------------------------------
 * The n-th file call of a session (open, read every sample, close) fails,
 * for every n: EINTR and short reads change nothing; EIO fails the open
 * with the OS reason, or fails only samples (each with a message), every
 * other sample equal to the fault-free one; nothing leaks (tu_end), and the
 * temporary area is gone after every close. */

static void sweep(const char *variant)
{
    tu_sweep w = {.dir = fixture(variant), .samples = 60, .tmp_prefix = "stoker-mds-"};
    tu_sweep_io_faults(&w);
}

static void test_io_faults_plain(void)
{
    sweep("plain");
}

static void test_io_faults_zstd(void)
{
    sweep("zstd");
}

/* ---- allocation failures -----------------------------------------------------------
 * The n-th allocation of a session fails, for every n until one passes:
 * the session fails with STK_ENOMEM or succeeds, nothing leaks, and the
 * temporary area is gone after every close. */

static void oom_sweep(const char *variant)
{
    tu_sweep w = {.dir = fixture(variant), .samples = 60, .tmp_prefix = "stoker-mds-"};
    tu_sweep_oom(&w);
}

static void test_oom_plain(void)
{
    oom_sweep("plain");
}

static void test_oom_zstd(void)
{
    oom_sweep("zstd");
}

int main(void)
{
    tu_begin("test_mds", 300);
    if (!fixtures()) {
        fprintf(stderr, "test_mds: the MDS fixtures (../shared/fixtures/mds, or "
                        "$STOKER_FIXTURES/mds) are missing\n");
        return 1;
    }
    RUN(test_dataset_plain);
    RUN(test_dataset_zstd);
    RUN(test_dataset_jpeg);
    RUN(test_fields_plain);
    RUN(test_fields_zstd);
    RUN(test_fields_jpeg);
    RUN(test_images_without_fields);
    RUN(test_zstd_temporary_area);
    RUN(test_index_lies);
    RUN(test_truncated_shard);
    RUN(test_corrupt_records);
    RUN(test_more_encodings);
    RUN(test_io_faults_plain);
    RUN(test_io_faults_zstd);
    RUN(test_oom_plain);
    RUN(test_oom_zstd);
    return tu_end();
}
