/* test_stk_fields.c -- .stk shards whose samples have named fields (issue 20;
 * docs/format.md, payload kind fields, version 2): written with
 * stk_writer_add_fields, read back through the loader's fields
 * (stk_options_set_fields) byte for byte over an epoch, the same for 1 and 3
 * threads; described by stk_dataset_field*; read without fields (the first
 * image field); repacked by stk_pack keeping every field; a lying field
 * table is a sample error naming the reason; one-payload shards are still
 * version 1. Also run under ASan. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "source/stkformat.h"

#include <stdlib.h>
#include <string.h>

#define N 23

/* What sample i holds, made the same way by writer and checker. */
typedef struct sample {
    uint8_t *jpg;
    size_t jpg_len;
    char txt[160];
    char json[160];
    char cls[8];
    uint8_t npy[128 + 12];
    size_t npy_len;
    int has_npy;
} sample;

static sample S[N];

/* A .npy (version 1.0) of three little-endian int32s. */
static size_t make_npy(uint8_t *out, int32_t a, int32_t b, int32_t c)
{
    const char *dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
    size_t hl = 128 - 10; /* header padded so the data starts at 128 */
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)(hl & 0xff);
    out[9] = (uint8_t)(hl >> 8);
    memset(out + 10, ' ', hl);
    memcpy(out + 10, dict, strlen(dict));
    out[10 + hl - 1] = '\n';
    int32_t v[3] = {a, b, c};
    memcpy(out + 128, v, sizeof v);
    return 128 + sizeof v;
}

static void make_samples(void)
{
    for (int i = 0; i < N; i++) {
        sample *s = &S[i];
        uint32_t w = 16 + (uint32_t)i, h = 12 + (uint32_t)(i % 7);
        uint8_t *rgb = malloc((size_t)w * h * 3);
        REQUIRE(rgb);
        for (size_t k = 0; k < (size_t)w * h * 3; k++)
            rgb[k] = (uint8_t)(k * 7 + (size_t)i * 31);
        s->jpg = tu_jpeg(rgb, w, h, 80, &s->jpg_len);
        free(rgb);
        snprintf(s->txt, sizeof s->txt, "caption %d: naïve café, 東京, ünïcödé \xf0\x9f\x98\x80",
                 i);
        snprintf(s->json, sizeof s->json,
                 "{\"i\": %d, \"nested\": {\"a\": [1, 2, {\"b\": \"\xc3\xbc\"}], \"ok\": true}}",
                 i);
        snprintf(s->cls, sizeof s->cls, "%d", i % 5);
        /* The optional field first appears in a later shard, so shards have
         * different field tables. */
        s->has_npy = i >= 5 && i % 3 == 2;
        if (s->has_npy)
            s->npy_len = make_npy(s->npy, i, -i, i * 1000);
    }
}

static void free_samples(void)
{
    for (int i = 0; i < N; i++)
        free(S[i].jpg);
}

/* Writes the samples as a fields dataset at dir (shards of about 2 KB). */
static void write_dataset(const char *dir)
{
    stk_writer *w = NULL;
    char err[512];
    stk_writer_options o = {.struct_size = sizeof o, .shard_size = 2048, .num_classes = 5};
    REQUIRE(stk_writer_open(&w, dir, &o, err, sizeof err) == STK_OK);
    for (int i = 0; i < N; i++) {
        sample *s = &S[i];
        stk_writer_field f[5];
        size_t n = 0;
        /* The order a sample gives its fields in does not matter. */
        if (i % 2)
            f[n++] = (stk_writer_field){"txt", s->txt, strlen(s->txt), STK_FIELD_TEXT};
        f[n++] = (stk_writer_field){"jpg", s->jpg, s->jpg_len, STK_FIELD_AUTO};
        if (!(i % 2))
            f[n++] = (stk_writer_field){"txt", s->txt, strlen(s->txt), STK_FIELD_TEXT};
        f[n++] = (stk_writer_field){"json", s->json, strlen(s->json), STK_FIELD_JSON};
        f[n++] = (stk_writer_field){"cls", s->cls, strlen(s->cls), STK_FIELD_INT};
        if (s->has_npy)
            f[n++] = (stk_writer_field){"npy", s->npy, s->npy_len, STK_FIELD_NPY};
        char key[32];
        snprintf(key, sizeof key, "s%03d", i);
        int rc = stk_writer_add_fields(w, f, n, i % 5, key);
        if (rc)
            fprintf(stderr, "add_fields: %s\n", stk_writer_errmsg(w));
        REQUIRE(rc == STK_OK);
    }
    stk_pack_result res = {.struct_size = sizeof res};
    REQUIRE(stk_writer_finish(w, &res) == STK_OK);
    CHECK_EQ(res.samples, N);
    CHECK_EQ(res.payload, 3);
    CHECK(res.shards > 2);
    stk_writer_close(w);
}

static int open_fields(stk_loader **l, const char *dir, unsigned threads, const char *spec,
                       int on_error)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, dir) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 4) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 7) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
    REQUIRE(stk_options_set_on_error(o, on_error) == STK_OK);
    REQUIRE(stk_options_set_transform(o, "none") == STK_OK);
    int rc = stk_options_set_fields(o, spec);
    if (rc)
        fprintf(stderr, "set_fields: %s\n", stk_options_errmsg(o));
    REQUIRE(rc == STK_OK);
    rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    return rc;
}

static const stk_field *field(const stk_batch *b, const char *name)
{
    for (size_t k = 0; k < b->nfields; k++)
        if (!strcmp(b->fields[k].name, name))
            return &b->fields[k];
    return NULL;
}

static int var_eq(const stk_field *f, size_t k, const void *p, size_t n)
{
    return f->lengths[k] == n && !memcmp((const uint8_t *)f->data + f->offsets[k], p, n);
}

/* Reads one epoch of dir with the CLIP-like spec; checks every field of
 * every sample against what was written; returns a hash of the epoch. */
static uint64_t read_epoch(const char *dir, unsigned threads)
{
    stk_loader *l = NULL;
    REQUIRE(open_fields(&l, dir, threads, "image=jpg,caption=txt,meta=json,label=cls,extra?=npy",
                        STK_ON_ERROR_RAISE) == STK_OK);
    int seen[N] = {0};
    uint64_t h = 0;
    stk_batch *b = NULL;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *img = field(b, "image"), *cap = field(b, "caption"),
                        *meta = field(b, "meta"), *lab = field(b, "label"),
                        *ext = field(b, "extra");
        REQUIRE(img && cap && meta && lab && ext);
        CHECK_EQ(img->kind, STK_FIELD_IMAGE);
        CHECK_EQ(cap->kind, STK_FIELD_TEXT);
        CHECK_EQ(meta->kind, STK_FIELD_JSON);
        CHECK_EQ(lab->kind, STK_FIELD_INT);
        CHECK_EQ(ext->kind, STK_FIELD_NPY);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < N);
            const sample *s = &S[i];
            seen[i]++;
            CHECK(var_eq(img, k, s->jpg, s->jpg_len));
            CHECK(var_eq(cap, k, s->txt, strlen(s->txt)));
            CHECK(var_eq(meta, k, s->json, strlen(s->json)));
            CHECK_EQ(((const int64_t *)lab->data)[k], (int64_t)(i % 5));
            CHECK_EQ(b->labels[k], (int64_t)(i % 5));
            CHECK(ext->present);
            CHECK_EQ(ext->present[k], s->has_npy);
            if (s->has_npy) {
                CHECK(var_eq(ext, k, s->npy + 128, 12));
                CHECK_EQ(ext->shapes[k * (STK_FIELD_MAXDIM + 1)], 1);
                CHECK_EQ(ext->shapes[k * (STK_FIELD_MAXDIM + 1) + 1], 3);
                CHECK_EQ(ext->dtypes[k], STK_DTYPE_INT32);
            } else {
                CHECK_EQ(ext->lengths[k], 0);
            }
            h = tu_hash(h, &i, sizeof i);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (int i = 0; i < N; i++)
        CHECK_EQ(seen[i], 1);
    stk_loader_close(l);
    return h;
}

static void test_fields_roundtrip(void)
{
    const char *dir = tu_path("clip");
    write_dataset(dir);
    uint64_t h1 = read_epoch(dir, 1);
    uint64_t h3 = read_epoch(dir, 3);
    CHECK_EQ(h1, h3);
    /* A fields shard is version 2; its kind is "fields". */
    size_t n = 0;
    uint8_t *sh = tu_read_file(tu_path("clip/part-000000.stk"), &n);
    REQUIRE(sh && n > 8);
    CHECK_EQ(sh[8] | sh[9] << 8, 2);
    CHECK_EQ(sh[16], 3);
    free(sh);
}

/* stk_dataset_field* list the fields with their kinds and counts; the
 * loader without fields gets the first image field. */
static void test_describe_and_plain_read(void)
{
    const char *dir = tu_path("clip");
    stk_dataset *d = NULL;
    char err[512];
    REQUIRE(stk_dataset_open(&d, dir, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    CHECK(!strcmp(di.payload, "fields"));
    CHECK_EQ(di.samples, N);
    CHECK_EQ(stk_dataset_field_count(d), 5);
    static const struct {
        const char *name;
        int kind;
        uint64_t samples;
    } want[] = {{"jpg", STK_FIELD_AUTO, N},
                {"txt", STK_FIELD_TEXT, N},
                {"json", STK_FIELD_JSON, N},
                {"cls", STK_FIELD_INT, N},
                {"npy", STK_FIELD_NPY, 6}};
    for (size_t k = 0; k < 5 && k < stk_dataset_field_count(d); k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        REQUIRE(stk_dataset_field(d, k, &fi) == STK_OK);
        CHECK(!strcmp(fi.name, want[k].name));
        CHECK_EQ(fi.kind, want[k].kind);
        CHECK_EQ(fi.samples, want[k].samples);
    }
    stk_dataset_close(d);

    stk_loader *l = NULL;
    tu_cfg c = {.path = dir, .bs = 5, .threads = 2, .transform = "none"};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b = NULL;
    int rc, seen = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        for (size_t k = 0; k < b->size; k++) {
            const sample *s = &S[b->indices[k]];
            CHECK(b->lengths[k] == s->jpg_len &&
                  !memcmp((uint8_t *)b->data + b->offsets[k], s->jpg, s->jpg_len));
            CHECK_EQ(b->labels[k], (int64_t)(b->indices[k] % 5));
            seen++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, N);
    stk_loader_close(l);
}

/* stk_pack of a fields dataset keeps every field (and is a fields dataset). */
static void test_repack_keeps_fields(void)
{
    char err[512];
    stk_pack_options po = {.struct_size = sizeof po, .threads = 2, .shard_size = 4096};
    stk_pack_result res = {.struct_size = sizeof res};
    int rc = stk_pack(tu_path("clip"), tu_path("clip2"), &po, &res, err, sizeof err);
    if (rc)
        fprintf(stderr, "pack: %s\n", err);
    REQUIRE(rc == STK_OK);
    CHECK_EQ(res.payload, 3);
    CHECK_EQ(res.samples, N);
    read_epoch(tu_path("clip2"), 2);
    /* --max-side has nothing to resize in a sample of fields: refused. */
    po.max_side = 64;
    CHECK_EQ(stk_pack(tu_path("clip"), tu_path("clip3"), &po, &res, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "fields") != NULL);
}

/* One layout a writer; names, kinds and counts are checked. */
static void test_writer_refusals(void)
{
    stk_writer *w = NULL;
    char err[512];
    stk_writer_options o = {.struct_size = sizeof o};
    REQUIRE(stk_writer_open(&w, tu_path("mixed"), &o, err, sizeof err) == STK_OK);
    stk_writer_field f[2] = {{"txt", "a", 1, STK_FIELD_TEXT}, {"txt", "b", 1, STK_FIELD_TEXT}};
    CHECK_EQ(stk_writer_add_fields(w, f, 2, -1, "dup"), STK_EINVAL);
    CHECK(strstr(stk_writer_errmsg(w), "twice") != NULL);
    CHECK_EQ(stk_writer_add_fields(w, f, 0, -1, NULL), STK_EINVAL);
    stk_writer_field bad = {"a,b", "x", 1, STK_FIELD_AUTO};
    CHECK_EQ(stk_writer_add_fields(w, &bad, 1, -1, NULL), STK_EINVAL);
    CHECK_EQ(stk_writer_add_fields(w, f, 1, -1, "ok"), STK_OK);
    stk_writer_field other = {"txt", "{}", 2, STK_FIELD_JSON};
    CHECK_EQ(stk_writer_add_fields(w, &other, 1, -1, "kind"), STK_EINVAL);
    CHECK(strstr(stk_writer_errmsg(w), "json") != NULL);
    CHECK_EQ(stk_writer_add(w, "xx", 2, -1, "plain"), STK_EMISUSE);
    CHECK(strstr(stk_writer_errmsg(w), "layout") != NULL);
    CHECK_EQ(stk_writer_finish(w, NULL), STK_OK);
    stk_writer_close(w);

    REQUIRE(stk_writer_open(&w, tu_path("plain"), &o, err, sizeof err) == STK_OK);
    CHECK_EQ(stk_writer_add(w, "xx", 2, -1, "plain"), STK_OK);
    CHECK_EQ(stk_writer_add_fields(w, f, 1, -1, "ok"), STK_EMISUSE);
    CHECK(strstr(stk_writer_errmsg(w), "layout") != NULL);
    CHECK_EQ(stk_writer_finish(w, NULL), STK_OK);
    stk_writer_close(w);
    /* One-payload shards are version 1, as before. */
    size_t n = 0;
    uint8_t *sh = tu_read_file(tu_path("plain/part-000000.stk"), &n);
    REQUIRE(sh && n > 8);
    CHECK_EQ(sh[8] | sh[9] << 8, 1);
    free(sh);
}

/* Rewrites sample j's payload table of the shard at path (its checksums
 * made to match again, so only the table lies). */
static void lie_in_table(const char *path, uint64_t j, uint32_t word, uint32_t value)
{
    size_t n = 0;
    uint8_t *b = tu_read_file(path, &n);
    REQUIRE(b && n > 128);
    stk__stk_footer f;
    char err[256];
    REQUIRE(stk__stk_footer_decode(b + n - STK_FOOTER_SIZE, n, &f, err, sizeof err) == STK_OK);
    uint8_t *ent = b + f.index_offset + j * STK_ENTRY_SIZE;
    uint64_t off = stk__get64(ent);
    uint32_t len = stk__get32(ent + 8);
    stk__put32(b + off + 4 * word, value);
    stk__put64(ent + 32, stk__xxh3(b + off, len));
    uint8_t *foot = b + n - STK_FOOTER_SIZE;
    stk__put64(foot + 32, stk__xxh3(b + f.index_offset, n - STK_FOOTER_SIZE - f.index_offset));
    stk__put64(foot + 48, stk__xxh3(foot, 48));
    tu_write_file(path, b, n);
    free(b);
}

/* The first error of an epoch read with fields under raise. */
static void first_error(const char *dir, char *reason, size_t n)
{
    stk_loader *l = NULL;
    REQUIRE(open_fields(&l, dir, 2, "image=jpg,caption=txt", STK_ON_ERROR_RAISE) == STK_OK);
    stk_batch *b = NULL;
    int rc;
    reason[0] = '\0';
    while ((rc = stk_loader_next(l, &b)) != STK_END) {
        if (rc == STK_OK) {
            stk_batch_release(b);
            continue;
        }
        REQUIRE(rc == STK_ESAMPLE);
        stk_error_info ei = {.struct_size = sizeof ei};
        REQUIRE(stk_loader_last_error(l, &ei) == STK_OK);
        CHECK_EQ(ei.sample, 0);
        CHECK_EQ(ei.sample_code, STK_EFORMAT);
        CHECK(strstr(ei.path, "s000") != NULL);
        if (!reason[0])
            snprintf(reason, n, "%s", ei.reason);
    }
    stk_loader_close(l);
}

static void test_lying_table(void)
{
    const char *dir = tu_path("liar");
    stk_writer *w = NULL;
    char err[512], reason[512];
    stk_writer_options o = {.struct_size = sizeof o};
    REQUIRE(stk_writer_open(&w, dir, &o, err, sizeof err) == STK_OK);
    for (int i = 0; i < 6; i++) {
        stk_writer_field f[2] = {{"jpg", S[i].jpg, S[i].jpg_len, STK_FIELD_AUTO},
                                 {"txt", S[i].txt, strlen(S[i].txt), STK_FIELD_TEXT}};
        char key[16];
        snprintf(key, sizeof key, "s%03d", i);
        REQUIRE(stk_writer_add_fields(w, f, 2, -1, key) == STK_OK);
    }
    REQUIRE(stk_writer_finish(w, NULL) == STK_OK);
    stk_writer_close(w);
    const char *shard = tu_path("liar/part-000000.stk");
    size_t n0 = 0;
    uint8_t *orig = tu_read_file(shard, &n0);
    REQUIRE(orig);

    /* A field longer than the payload. */
    lie_in_table(shard, 0, 3, 0xfffffff0u);
    first_error(dir, reason, sizeof reason);
    CHECK(strstr(reason, "field table") && strstr(reason, "runs past"));
    /* Under skip: the sample is left out, listed with the reason. */
    {
        stk_loader *l = NULL;
        REQUIRE(open_fields(&l, dir, 2, "image=jpg,caption=txt", STK_ON_ERROR_SKIP) == STK_OK);
        stk_batch *b = NULL;
        int rc;
        size_t got = 0;
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            for (size_t k = 0; k < b->size; k++)
                CHECK(b->indices[k] != 0);
            got += b->size;
            stk_batch_release(b);
        }
        CHECK_EQ(rc, STK_END);
        CHECK_EQ(got, 5);
        CHECK_EQ(stk_loader_error_count(l), 1);
        stk_sample_error se;
        CHECK_EQ(stk_loader_error_get(l, 0, &se), STK_OK);
        CHECK_EQ(se.sample, 0);
        CHECK(se.reason && strstr(se.reason, "runs past"));
        stk_loader_close(l);
    }
    /* An id the shard does not have. */
    tu_write_file(shard, orig, n0);
    lie_in_table(shard, 0, 4, 9);
    first_error(dir, reason, sizeof reason);
    CHECK(strstr(reason, "field table") && strstr(reason, "names field 9"));
    /* More fields than the shard has. */
    tu_write_file(shard, orig, n0);
    lie_in_table(shard, 0, 0, 1000);
    first_error(dir, reason, sizeof reason);
    CHECK(strstr(reason, "field table") && strstr(reason, "1000 fields"));
    free(orig);
}

/* Shards of two writers, whose tables number the fields differently, read
 * as one dataset: the reader maps each shard's ids onto the union. */
static void test_union_of_shards(void)
{
    char err[512];
    for (int part = 0; part < 2; part++) {
        stk_writer *w = NULL;
        stk_writer_options o = {.struct_size = sizeof o};
        REQUIRE(stk_writer_open(&w, tu_path(part ? "u1" : "u0"), &o, err, sizeof err) == STK_OK);
        for (int i = 5 * part; i < 5 * part + 5; i++) {
            stk_writer_field a[2] = {{"jpg", S[i].jpg, S[i].jpg_len, STK_FIELD_AUTO},
                                     {"txt", S[i].txt, strlen(S[i].txt), STK_FIELD_TEXT}};
            stk_writer_field b[3] = {{"txt", S[i].txt, strlen(S[i].txt), STK_FIELD_TEXT},
                                     {"json", S[i].json, strlen(S[i].json), STK_FIELD_JSON},
                                     {"jpg", S[i].jpg, S[i].jpg_len, STK_FIELD_AUTO}};
            REQUIRE(stk_writer_add_fields(w, part ? b : a, part ? 3 : 2, -1, NULL) == STK_OK);
        }
        REQUIRE(stk_writer_finish(w, NULL) == STK_OK);
        stk_writer_close(w);
    }
    tu_mkdirs(tu_path("union"));
    for (int part = 0; part < 2; part++) {
        size_t n = 0;
        uint8_t *b = tu_read_file(tu_path(part ? "u1/part-000000.stk" : "u0/part-000000.stk"), &n);
        REQUIRE(b);
        tu_write_file(tu_path(part ? "union/b.stk" : "union/a.stk"), b, n);
        free(b);
    }
    stk_dataset *d = NULL;
    REQUIRE(stk_dataset_open(&d, tu_path("union"), NULL, err, sizeof err) == STK_OK);
    CHECK_EQ(stk_dataset_field_count(d), 3);
    stk_dataset_field_info fi = {.struct_size = sizeof fi};
    REQUIRE(stk_dataset_field(d, 2, &fi) == STK_OK);
    CHECK(!strcmp(fi.name, "json"));
    CHECK_EQ(fi.samples, 5);
    REQUIRE(stk_dataset_field(d, 1, &fi) == STK_OK);
    CHECK(!strcmp(fi.name, "txt"));
    CHECK_EQ(fi.samples, 10);
    stk_dataset_close(d);

    stk_loader *l = NULL;
    REQUIRE(open_fields(&l, tu_path("union"), 2, "image=jpg,caption=txt,meta?=json",
                        STK_ON_ERROR_RAISE) == STK_OK);
    stk_batch *b = NULL;
    int rc, seen = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const stk_field *img = field(b, "image"), *cap = field(b, "caption"),
                        *meta = field(b, "meta");
        REQUIRE(img && cap && meta);
        for (size_t k = 0; k < b->size; k++) {
            uint64_t i = b->indices[k];
            REQUIRE(i < 10);
            CHECK(var_eq(img, k, S[i].jpg, S[i].jpg_len));
            CHECK(var_eq(cap, k, S[i].txt, strlen(S[i].txt)));
            CHECK_EQ(meta->present[k], i >= 5);
            if (i >= 5)
                CHECK(var_eq(meta, k, S[i].json, strlen(S[i].json)));
            seen++;
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(seen, 10);
    stk_loader_close(l);
}

/* The payload parser on its own: every lie is refused, never read past. */
static void test_payload_parser(void)
{
    uint8_t p[64] = {0};
    stk__stk_fref r[STK__MAX_FIELDS];
    size_t nr;
    char err[256];
    /* two fields: id 0 of 3 bytes, id 2 of 1 byte */
    stk__put32(p, 2);
    stk__put32(p + 8, 0);
    stk__put32(p + 12, 3);
    stk__put32(p + 16, 2);
    stk__put32(p + 20, 1);
    memcpy(p + 24, "abcd", 4);
    CHECK_EQ(stk__stk_fpayload_parse(p, 28, 3, r, &nr, err, sizeof err), STK_OK);
    CHECK_EQ(nr, 2);
    CHECK_EQ(r[1].off, 27);
    CHECK_EQ(stk__stk_fpayload_parse(p, 29, 3, r, &nr, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "after the last field"));
    CHECK_EQ(stk__stk_fpayload_parse(p, 27, 3, r, &nr, err, sizeof err), STK_EFORMAT);
    CHECK_EQ(stk__stk_fpayload_parse(p, 28, 2, r, &nr, err, sizeof err), STK_EFORMAT);
    CHECK_EQ(stk__stk_fpayload_parse(p, 7, 3, r, &nr, err, sizeof err), STK_EFORMAT);
    stk__put32(p + 16, 0); /* ids must increase */
    CHECK_EQ(stk__stk_fpayload_parse(p, 28, 3, r, &nr, err, sizeof err), STK_EFORMAT);
    stk__put32(p, 5); /* entries past the end */
    CHECK_EQ(stk__stk_fpayload_parse(p, 28, 8, r, &nr, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "do not fit"));
}

int main(void)
{
    tu_begin("test_stk_fields", 120);
    make_samples();
    RUN(test_fields_roundtrip);
    RUN(test_describe_and_plain_read);
    RUN(test_repack_keeps_fields);
    RUN(test_writer_refusals);
    RUN(test_lying_table);
    RUN(test_union_of_shards);
    RUN(test_payload_parser);
    free_samples();
    return tu_end();
}
