/* test_litdata.c -- LitData datasets read in place (src/source/litdata.c):
 * the fixtures written by litdata's own optimize()
 * (../shared/fixtures/litdata/{plain,zstd,jpeg}, each with a manifest of
 * what every sample holds) read through the dataset API and the loader
 * with fields, every leaf of every sample compared with the manifest, whole
 * epochs over 1 and 3 threads; serializers and pytree shapes the fixtures
 * lack, in chunks made here the way writer.py lays them out; and bad
 * input: a truncated chunk, an index.json that lies about counts or sizes,
 * a corrupt item, pickle and unknown serializers, a cut-off zstd chunk --
 * each a clear error naming the file and the sample or offset; and sweeps
 * of I/O faults over every file call and of allocation failures over every
 * allocation of a session. */
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
    return tu_fixtures("litdata");
}

static json_t *manifest(const char *variant)
{
    return tu_fixture_manifest("litdata", variant);
}

static const char *fixture(const char *variant)
{
    return tu_fixture("litdata", variant);
}

/* ---- the dataset API ----------------------------------------------------------- */

/* The leaves of the plain and zstd fixtures, in data_spec's order. */
static const char *const k_leaves[] = {"image",     "caption",     "label",
                                       "width",     "height",      "meta.aspect",
                                       "meta.even", "meta.tags.0", "meta.tags.1"};
static const int k_kinds[] = {STK_FIELD_AUTO, STK_FIELD_TEXT, STK_FIELD_INT,
                              STK_FIELD_INT,  STK_FIELD_INT,  STK_FIELD_FLOAT,
                              STK_FIELD_INT,  STK_FIELD_TEXT, STK_FIELD_TEXT};

static void check_dataset(const char *variant, size_t chunks)
{
    json_t *m = manifest(variant);
    bool jpeg = !strcmp(variant, "jpeg");
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_dataset *d = NULL;
    char err[512];
    int rc = stk_dataset_open(&d, fixture(variant), NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK(!strcmp(di.kind, "litdata"));
    CHECK_EQ(di.samples, n);
    CHECK_EQ(di.shards, chunks);
    CHECK_EQ(di.files, chunks);
    CHECK(!strcmp(di.payload, "encoded"));
    /* The chunk files as stored (compressed for .zstd.bin). */
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
    /* stoker info's leaf list: the dict keys of the pytree, nested ones
     * joined with '.', list positions as numbers. */
    size_t nf = jpeg ? 3 : 9;
    REQUIRE(stk_dataset_field_count(d) == nf);
    for (size_t k = 0; k < nf; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK(!strcmp(fi.name, k_leaves[k]));
        CHECK_EQ(fi.kind, k == 0 && jpeg ? STK_FIELD_IMAGE : k_kinds[k]);
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
        if (strcmp(key, want))
            fprintf(stderr, "key %s, want %s\n", key, want);
    }
    stk_dataset_close(d);
    json_decref(m);
}

static void test_dataset_plain(void)
{
    check_dataset("plain", 4);
}

static void test_dataset_zstd(void)
{
    check_dataset("zstd", 4);
}

static void test_dataset_jpeg(void)
{
    check_dataset("jpeg", 3);
}

/* ---- the loader with fields ---------------------------------------------------- */

static void check_text(const stk_field *f, size_t k, const char *want)
{
    CHECK_EQ(f->lengths[k], strlen(want));
    CHECK(tu_text_is(f, k, want));
}

/* One epoch with every leaf as a field; each sample compared with the
 * manifest; returns a hash of the batches (order included). */
static uint64_t epoch_fields(const char *variant, unsigned threads)
{
    json_t *m = manifest(variant);
    bool jpeg = !strcmp(variant, "jpeg");
    size_t n = json_array_size(json_object_get(m, "samples"));
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, fixture(variant)) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 7) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 11) == STK_OK);
    REQUIRE(stk_options_set_fields(o, jpeg ? "image,caption,label"
                                           : "image,caption,label,width,height,meta.aspect,"
                                             "meta.even,meta.tags.0,meta.tags.1") == STK_OK);
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
        const stk_field *lab = tu_field(b, "label");
        CHECK_EQ(img->kind, STK_FIELD_IMAGE);
        CHECK_EQ(cap->kind, STK_FIELD_TEXT);
        CHECK_EQ(lab->kind, STK_FIELD_INT);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < n);
            CHECK(!seen[i]);
            seen[i] = 1;
            json_t *s = tu_manifest_sample(m, i);
            const uint8_t *ib = (const uint8_t *)img->data + img->offsets[k];
            char hex[65];
            tu_sha256_hex(ib, img->lengths[k], hex);
            CHECK_EQ(img->lengths[k], tu_json_int(s, "nbytes"));
            CHECK(!strcmp(hex, json_string_value(json_object_get(s, "sha256"))));
            check_text(cap, k, json_string_value(json_object_get(s, "caption")));
            CHECK_EQ(((const int64_t *)lab->data)[k], tu_json_int(s, "label"));
            CHECK_EQ(b->labels[k], tu_json_int(s, "label"));
            h = tu_hash(h, &i, sizeof i);
            h = tu_hash(h, ib, img->lengths[k]);
            if (jpeg)
                continue;
            json_t *meta = json_object_get(s, "meta");
            const stk_field *asp = tu_field(b, "meta.aspect"), *even = tu_field(b, "meta.even");
            CHECK_EQ(asp->kind, STK_FIELD_FLOAT);
            CHECK_EQ(even->kind, STK_FIELD_INT);
            CHECK_EQ(((const int64_t *)tu_field(b, "width")->data)[k], tu_json_int(s, "width"));
            CHECK_EQ(((const int64_t *)tu_field(b, "height")->data)[k], tu_json_int(s, "height"));
            float fa = ((const float *)asp->data)[k];
            CHECK(fa == (float)json_real_value(json_object_get(meta, "aspect")));
            CHECK_EQ(((const int64_t *)even->data)[k],
                     json_is_true(json_object_get(meta, "even")) ? 1 : 0);
            json_t *tags = json_object_get(meta, "tags");
            check_text(tu_field(b, "meta.tags.0"), k, json_string_value(json_array_get(tags, 0)));
            check_text(tu_field(b, "meta.tags.1"), k, json_string_value(json_array_get(tags, 1)));
            h = tu_hash(h, &fa, sizeof fa);
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
    CHECK_EQ(epoch_fields("jpeg", 1), epoch_fields("jpeg", 3));
}

/* Without fields: an image pipeline over the image leaf and the labels. */
static void test_images_without_fields(void)
{
    tu_check_images_without_fields("litdata", "jpeg");
}

/* .zstd.bin chunks are decompressed into $TMPDIR/stoker-litdata-*, removed
 * at close. */
static int count_tmp(const char *dir)
{
    return tu_count_prefixed(dir, "stoker-litdata-");
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

static json_t *chunk0(json_t *root)
{
    return json_array_get(json_object_get(root, "chunks"), 0);
}

static json_t *config(json_t *root)
{
    return json_object_get(root, "config");
}

static void lie_count(json_t *r)
{
    json_object_set_new(chunk0(r), "chunk_size", json_integer(17));
}
static void lie_bytes(json_t *r)
{
    json_object_set_new(chunk0(r), "chunk_bytes", json_integer(1000));
}
static void big_bytes(json_t *r)
{
    json_object_set_new(chunk0(r), "chunk_bytes", json_integer(300000));
}
static void make_pickle(json_t *r)
{
    json_array_set_new(json_object_get(config(r), "data_format"), 7, json_string("pickle"));
}
static void make_graph(json_t *r)
{
    json_array_set_new(json_object_get(config(r), "data_format"), 0, json_string("graph:pickle"));
}
static void make_unknown(json_t *r)
{
    json_array_set_new(json_object_get(config(r), "data_format"), 5, json_string("float128"));
}
static void fewer_formats(json_t *r)
{
    json_array_remove(json_object_get(config(r), "data_format"), 8);
}
static void encrypted(json_t *r)
{
    json_object_set_new(config(r), "encryption",
                        json_pack("{s:s,s:s}", "algorithm", "fernet", "level", "chunk"));
}
static void tokens(json_t *r)
{
    json_object_set_new(config(r), "item_loader", json_string("TokensLoader"));
}
static void gz(json_t *r)
{
    json_object_set_new(config(r), "compression", json_string("gzip"));
}
static void bad_spec(json_t *r)
{
    json_object_set_new(config(r), "data_spec", json_string("[2, {}]"));
}

static void test_index_lies(void)
{
    const char *d = copy_fixture("plain", "count");
    edit_index(d, lie_count);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-0.bin", "holds 16 items, but index.json says 17");
    d = copy_fixture("zstd", "bomb");
    edit_index(d, lie_bytes);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-0.zstd.bin", "more than the 1000 bytes");
    d = copy_fixture("zstd", "big");
    edit_index(d, big_bytes);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-0.zstd.bin", "wrong size");
    d = copy_fixture("plain", "pickle");
    edit_index(d, make_pickle);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json",
                   "leaf 'meta.tags.0' is serialized with 'pickle'");
    tu_expect_open(d, STK_EUNSUPPORTED, "never unpickles", NULL);
    d = copy_fixture("plain", "graph");
    edit_index(d, make_graph);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "'graph:pickle' (Python pickle)");
    d = copy_fixture("plain", "unknown");
    edit_index(d, make_unknown);
    tu_expect_open(d, STK_EUNSUPPORTED, "leaf 'meta.aspect'", "'float128'");
    d = copy_fixture("plain", "fewer");
    edit_index(d, fewer_formats);
    tu_expect_open(d, STK_EFORMAT, "index.json", "data_spec has 9 leaves, but data_format names 8");
    d = copy_fixture("plain", "enc");
    edit_index(d, encrypted);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "encrypted");
    d = copy_fixture("plain", "tokens");
    edit_index(d, tokens);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "'TokensLoader'");
    d = copy_fixture("plain", "gz");
    edit_index(d, gz);
    tu_expect_open(d, STK_EUNSUPPORTED, "index.json", "'gzip'");
    d = copy_fixture("plain", "spec");
    edit_index(d, bad_spec);
    tu_expect_open(d, STK_EFORMAT, "index.json", "protocol 1");
    d = copy_fixture("plain", "notjson");
    tu_write_file(tu_join(d, "index.json"), "{\"chunks\": [{\"data_format\": 1,", 30);
    tu_expect_open(d, STK_EFORMAT, "index.json", "not valid JSON (line 1");
    d = copy_fixture("plain", "missing");
    REQUIRE(unlink(tu_join(d, "chunk-0-2.bin")) == 0);
    tu_expect_open(d, STK_ENOENT, "chunk-0-2.bin", NULL);
}

static void test_truncated_chunk(void)
{
    /* Cut inside chunk 1's items: the items before the cut read, those
     * after fail naming the chunk and the offsets; the loader under skip
     * delivers the rest, with fields too. */
    const char *d = copy_fixture("plain", "trunc");
    const char *ch = tu_join(d, "chunk-0-1.bin");
    uint32_t off5 = tu_read_le32(ch, 4 + 4 * 5);
    REQUIRE(truncate(ch, off5 + 100) == 0);
    char msg[1024];
    int bad = tu_read_all(d, msg, sizeof msg, NULL);
    CHECK_EQ(bad, 16 - 5);
    CHECK(strstr(msg, "chunk-0-1.bin#5") != NULL);
    CHECK(strstr(msg, "truncated") != NULL);
    if (!strstr(msg, "chunk-0-1.bin#5") || !strstr(msg, "truncated"))
        fprintf(stderr, "%s\n", msg);
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
    CHECK(strstr(se.path, "chunk-0-1.bin#") && strstr(se.reason, "truncated"));
    stk_loader_close(l);
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
    REQUIRE(truncate(tu_join(d, "chunk-0-3.bin"), 20) == 0);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-3.bin", "offsets table");
    /* An empty chunk file. */
    d = copy_fixture("plain", "trunc4");
    REQUIRE(truncate(tu_join(d, "chunk-0-0.bin"), 0) == 0);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-0.bin", "truncated");
    /* A zstd chunk cut off. */
    d = copy_fixture("zstd", "trunc3");
    REQUIRE(truncate(tu_join(d, "chunk-0-2.zstd.bin"), 5000) == 0);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-2.zstd.bin", "cut off");
    /* A zstd chunk whose frame header is broken. (LitData writes frames
     * without zstd's checksum, so a flip inside the compressed data may
     * decompress to other bytes unseen.) */
    d = copy_fixture("zstd", "flip");
    tu_patch(tu_join(d, "chunk-0-1.zstd.bin"), 0, "\xff\x00\xff", 3);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-1.zstd.bin", "not a valid zstd stream");
}

static void test_corrupt_items(void)
{
    /* Offsets table going backwards: refused at open. */
    const char *d = copy_fixture("plain", "offs");
    tu_patch(tu_join(d, "chunk-0-0.bin"), 4 + 4 * 3, "\x10\x00\x00\x00", 4);
    tu_expect_open(d, STK_EFORMAT, "chunk-0-0.bin", "offsets table is corrupt: entry 3");
    /* An item's size header lying about its caption: that sample fails,
     * naming its chunk, position and offset; the others read. */
    d = copy_fixture("plain", "item");
    const char *ch = tu_join(d, "chunk-0-2.bin");
    uint32_t off7 = tu_read_le32(ch, 4 + 4 * 7);
    tu_patch(ch, (long)off7 + 4, "\xff\xff\x00\x00", 4);
    char msg[1024];
    CHECK_EQ(tu_read_all(d, msg, sizeof msg, NULL), 1);
    char want[64];
    snprintf(want, sizeof want, "item at offset %u", off7);
    CHECK(strstr(msg, "chunk-0-2.bin#7") && strstr(msg, want) && strstr(msg, "caption"));
    if (!strstr(msg, want) || !strstr(msg, "caption"))
        fprintf(stderr, "%s\n", msg);
    /* An int leaf of 4 bytes (the int serializer writes 8), its sizes still
     * adding up: named as such. */
    d = copy_fixture("plain", "intsize");
    ch = tu_join(d, "chunk-0-1.bin");
    uint32_t off3 = tu_read_le32(ch, 4 + 4 * 3);
    uint32_t capl = tu_read_le32(ch, (long)off3 + 4);
    uint8_t hdr[12];
    for (int k = 0; k < 4; k++)
        hdr[k] = (uint8_t)((capl + 4) >> (8 * k));
    memcpy(hdr + 4, "\x04\x00\x00\x00", 4);
    tu_patch(ch, (long)off3 + 4, hdr, 8);
    CHECK_EQ(tu_read_all(d, msg, sizeof msg, NULL), 1);
    CHECK(strstr(msg, "chunk-0-1.bin#3") && strstr(msg, "leaf 'label' (int) is 4 bytes"));
    if (!strstr(msg, "leaf 'label' (int) is 4 bytes"))
        fprintf(stderr, "%s\n", msg);
}

/* ---- serializers and pytrees the fixtures lack ------------------------------------
 * Chunks laid out as writer.py's _create_chunk and PyTreeLoader.encode_data
 * do: u32 count, u32 offsets[count + 1] (absolute), items of (u32 size per
 * leaf) + leaf bytes. */

static void put32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

/* Writes dir/index.json and dir/chunk-0-0.bin holding n items. */
static void write_litdata(const char *dir, const char *const *formats, size_t nf, const char *spec,
                          uint8_t **items, const size_t *lens, size_t n)
{
    tu_mkdirs(dir);
    size_t head = 4 + 4 * (n + 1), total = head;
    for (size_t i = 0; i < n; i++)
        total += lens[i];
    uint8_t *ch = malloc(total);
    put32(ch, (uint32_t)n);
    size_t at = head;
    for (size_t i = 0; i <= n; i++) {
        put32(ch + 4 + 4 * i, (uint32_t)at);
        if (i < n) {
            memcpy(ch + at, items[i], lens[i]);
            at += lens[i];
        }
    }
    tu_write_file(tu_join(dir, "chunk-0-0.bin"), ch, total);
    free(ch);
    json_t *fmt = json_array();
    for (size_t k = 0; k < nf; k++)
        json_array_append_new(fmt, json_string(formats[k]));
    json_t *index = json_pack(
        "{s:[{s:I,s:I,s:n,s:s}],s:{s:n,s:I,s:n,s:o,s:s,s:n,s:s},s:s}", "chunks", "chunk_bytes",
        (json_int_t)total, "chunk_size", (json_int_t)n, "dim", "filename", "chunk-0-0.bin",
        "config", "chunk_bytes", "chunk_size", (json_int_t)n, "compression", "data_format", fmt,
        "data_spec", spec, "encryption", "item_loader", "PyTreeLoader", "updated_at", "0");
    REQUIRE(index);
    REQUIRE(json_dump_file(index, tu_join(dir, "index.json"), JSON_SORT_KEYS) == 0);
    json_decref(index);
}

/* An item of nl leaves. */
static size_t make_item(uint8_t *out, const void *const *leaf, const size_t *len, size_t nl)
{
    size_t p = 4 * nl;
    for (size_t k = 0; k < nl; k++) {
        put32(out + 4 * k, (uint32_t)len[k]);
        memcpy(out + p, leaf[k], len[k]);
        p += len[k];
    }
    return p;
}

static void test_tuple_and_serializers(void)
{
    /* A tuple sample (str, int, bool, float, no_header_numpy, jpeg): no
     * dict keys, so the leaves are leaf_0..leaf_5. */
    const char *const formats[] = {"str", "int", "bool", "float", "no_header_numpy:10", "jpeg"};
    const char *spec =
        "[1, {\"type\": \"builtins.tuple\", \"context\": \"null\", \"children_spec\": ["
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []}]}]";
    const char *str = "h\xc3\xa9llo";
    int64_t iv = -5;
    uint8_t bv = 1;
    double fv = 0.1;
    const uint8_t arr[] = {1, 2, 3, 4};
    const uint8_t jpg[] = {0xff, 0xd8, 0xff, 0xe0, 0, 0x10, 'J', 'F', 'I', 'F'};
    const void *leaf[] = {str, &iv, &bv, &fv, arr, jpg};
    const size_t len[] = {strlen(str), 8, 1, 8, sizeof arr, sizeof jpg};
    uint8_t it0[256], *items[1] = {it0};
    size_t il = make_item(it0, leaf, len, 6);
    const char *dir = tu_path("tuple");
    write_litdata(dir, formats, 6, spec, items, &il, 1);

    stk_dataset *d = NULL;
    char err[512];
    int rc = stk_dataset_open(&d, dir, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    const int kinds[] = {STK_FIELD_TEXT,  STK_FIELD_INT,   STK_FIELD_INT,
                         STK_FIELD_FLOAT, STK_FIELD_BYTES, STK_FIELD_IMAGE};
    REQUIRE(stk_dataset_field_count(d) == 6);
    for (size_t k = 0; k < 6; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        char want[16];
        snprintf(want, sizeof want, "leaf_%zu", k);
        CHECK(!strcmp(fi.name, want));
        CHECK_EQ(fi.kind, kinds[k]);
    }
    /* The payload without fields is the jpeg leaf; no label leaf. */
    const void *data;
    size_t n;
    int64_t label;
    REQUIRE(stk_dataset_read(d, 0, &data, &n, &label, err, sizeof err) == STK_OK);
    CHECK(n == sizeof jpg && !memcmp(data, jpg, n));
    CHECK_EQ(label, -1);
    stk_dataset_close(d);

    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, dir) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 1) == STK_OK);
    REQUIRE(stk_options_set_fields(o, "leaf_0,leaf_1,leaf_2,leaf_3,leaf_4") == STK_OK);
    stk_loader *l = NULL;
    rc = stk_loader_open(&l, o);
    if (rc)
        fprintf(stderr, "%s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_options_destroy(o);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK);
    check_text(&b->fields[0], 0, str);
    CHECK_EQ(((const int64_t *)b->fields[1].data)[0], -5);
    CHECK_EQ(((const int64_t *)b->fields[2].data)[0], 1);
    CHECK(((const float *)b->fields[3].data)[0] == 0.1f);
    const stk_field *f = &b->fields[4];
    CHECK(f->lengths[0] == sizeof arr &&
          !memcmp((const uint8_t *)f->data + f->offsets[0], arr, sizeof arr));
    stk_batch_release(b);
    stk_loader_close(l);

    /* A dict sample with a "cls" int leaf (the label), an int dict key, a
     * key repeated by nesting ("a.b" and a -> b: the second is leaf_K),
     * and a file:jpg leaf that is plain bytes. */
    const char *const f2[] = {"int", "file:jpg", "str", "str"};
    const char *spec2 =
        "[1, {\"type\": \"builtins.dict\", \"context\": \"[\\\"cls\\\", 7, \\\"a.b\\\", "
        "\\\"a\\\"]\", \"children_spec\": ["
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": null, \"context\": null, \"children_spec\": []},"
        "{\"type\": \"collections.OrderedDict\", \"context\": \"[\\\"b\\\"]\", "
        "\"children_spec\": [{\"type\": null, \"context\": null, \"children_spec\": []}]}]}]";
    int64_t cls[2] = {3, 1};
    uint8_t it[2][256], *its[2] = {it[0], it[1]};
    size_t ils[2];
    for (int k = 0; k < 2; k++) {
        const void *lv[] = {&cls[k], "\x01\x02", "x", "y"};
        const size_t ll[] = {8, 2, 1, 1};
        ils[k] = make_item(it[k], lv, ll, 4);
    }
    dir = tu_path("dict");
    write_litdata(dir, f2, 4, spec2, its, ils, 2);
    rc = stk_dataset_open(&d, dir, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    const char *names[] = {"cls", "7", "a.b", "leaf_3"};
    const int kinds2[] = {STK_FIELD_INT, STK_FIELD_BYTES, STK_FIELD_TEXT, STK_FIELD_TEXT};
    REQUIRE(stk_dataset_field_count(d) == 4);
    for (size_t k = 0; k < 4; k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK(!strcmp(fi.name, names[k]));
        CHECK_EQ(fi.kind, kinds2[k]);
    }
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK_EQ(di.classes, 4);
    for (uint64_t i = 0; i < 2; i++) {
        REQUIRE(stk_dataset_read(d, i, &data, &n, &label, err, sizeof err) == STK_OK);
        CHECK(n == 2 && !memcmp(data, "\x01\x02", 2));
        CHECK_EQ(label, cls[i]);
    }
    stk_dataset_close(d);
}

/* ---- I/O faults ------------------------------------------------------------------
 * The n-th file call of a session (open, read every sample, close) fails,
 * for every n: EINTR and short reads change nothing; EIO fails the open
 * with the OS reason, or fails only samples (each with a message), every
 * other sample equal to the fault-free one; nothing leaks (tu_end), and the
 * temporary area is gone after every close. */

static void sweep(const char *variant)
{
    tu_sweep w = {.dir = fixture(variant), .samples = 60, .tmp_prefix = "stoker-litdata-"};
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
    tu_sweep w = {.dir = fixture(variant), .samples = 60, .tmp_prefix = "stoker-litdata-"};
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
    tu_begin("test_litdata", 300);
    if (!fixtures()) {
        fprintf(stderr, "test_litdata: the LitData fixtures (../shared/fixtures/litdata, or "
                        "$STOKER_FIXTURES/litdata) are missing\n");
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
    RUN(test_truncated_chunk);
    RUN(test_corrupt_items);
    RUN(test_tuple_and_serializers);
    RUN(test_io_faults_plain);
    RUN(test_io_faults_zstd);
    RUN(test_oom_plain);
    RUN(test_oom_zstd);
    return tu_end();
}
