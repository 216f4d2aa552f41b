/* test_tar_fields.c -- WebDataset tar samples with several fields (issue 20):
 * every member of a sample described (stk_dataset_field*) and delivered as a
 * field byte-equal to what was written, over whole epochs with 1 and 3
 * threads; the loader without fields unchanged (first image member, label
 * from .cls); the first image field bit-identical to it; keys with dots and
 * multi-dot extensions; missing, optional, duplicate and empty members;
 * invalid UTF-8 and JSON under raise and skip; the index cache carrying the
 * members; a tar of 100k tiny members. */
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long stk__alloc_live(void);
void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

#define NS 23 /* samples of the main tar (batches of 5: a short last one) */

typedef struct want {
    uint8_t *jpg, *left;
    size_t njpg, nleft;
    char txt[128], json[256];
    int cls;
    uint8_t npy[160];
    size_t nnpy, npy_data; /* whole .npy, where its data starts */
} want;

static want W[NS];
static char g_main[600];

static uint8_t *photo(uint32_t w, uint32_t h, int seed, size_t *n)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 7 + seed * 13);
            p[1] = (uint8_t)(y * 5 + seed * 29);
            p[2] = (uint8_t)((x ^ y) + seed);
        }
    uint8_t *j = tu_jpeg(rgb, w, h, 85, n);
    free(rgb);
    REQUIRE(j);
    return j;
}

/* A .npy of three int32 (k, -k, k*k) written by hand: magic, version 1.0,
 * header length, the header dict padded to 64 bytes, the data. */
static size_t make_npy(uint8_t *out, int k, size_t *data_off)
{
    char dict[128];
    int dl =
        snprintf(dict, sizeof dict, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }");
    size_t hl = (size_t)dl + 1;
    while ((10 + hl) % 64)
        hl++;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)hl;
    out[9] = (uint8_t)(hl >> 8);
    memset(out + 10, ' ', hl);
    memcpy(out + 10, dict, (size_t)dl);
    out[10 + hl - 1] = '\n';
    int32_t v[3] = {k, -k, k * k};
    memcpy(out + 10 + hl, v, sizeof v);
    *data_off = 10 + hl;
    return 10 + hl + sizeof v;
}

static void add_str(uint8_t **t, size_t *tn, const char *name, const char *s)
{
    tu_tar_add(t, tn, name, s, strlen(s));
}

/* The main tar: keys in a directory with dots, members in tar order cls,
 * jpg, json, left.jpg, npy, txt. */
static void make_main(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int k = 0; k < NS; k++) {
        want *w = &W[k];
        char key[64], name[100];
        snprintf(key, sizeof key, "set.v1.2/s%03d", k);
        w->jpg = photo(24 + (uint32_t)k, 20 + (uint32_t)(k % 5), k, &w->njpg);
        w->left = photo(16, 16 + (uint32_t)k, k + 100, &w->nleft);
        w->cls = k % 4;
        snprintf(w->txt, sizeof w->txt,
                 "caption %d: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
                 "\xf0\x9f\x9a\x80 na\xc3\xafve",
                 k);
        snprintf(w->json, sizeof w->json,
                 "{\"id\": %d, \"nested\": {\"a\": [1, 2.5, {\"b\": \"\\u00e9\xc3\xa9\"}], "
                 "\"t\": true, \"n\": null}}",
                 k);
        w->nnpy = make_npy(w->npy, k, &w->npy_data);
        char cls[16];
        snprintf(cls, sizeof cls, "%d\n", w->cls);
        snprintf(name, sizeof name, "%s.cls", key);
        add_str(&t, &tn, name, cls);
        snprintf(name, sizeof name, "%s.jpg", key);
        tu_tar_add(&t, &tn, name, w->jpg, w->njpg);
        snprintf(name, sizeof name, "%s.json", key);
        add_str(&t, &tn, name, w->json);
        snprintf(name, sizeof name, "%s.left.jpg", key);
        tu_tar_add(&t, &tn, name, w->left, w->nleft);
        snprintf(name, sizeof name, "%s.npy", key);
        tu_tar_add(&t, &tn, name, w->npy, w->nnpy);
        snprintf(name, sizeof name, "%s.txt", key);
        add_str(&t, &tn, name, w->txt);
    }
    t = realloc(t, tn + 1024);
    memset(t + tn, 0, 1024);
    snprintf(g_main, sizeof g_main, "%s", tu_path("main.tar"));
    tu_write_file(g_main, t, tn + 1024);
    free(t);
}

static void write_tar(const char *path, uint8_t *t, size_t tn)
{
    t = realloc(t, tn + 1024);
    memset(t + tn, 0, 1024);
    tu_write_file(path, t, tn + 1024);
    free(t);
}

typedef struct run_cfg {
    const char *path;
    const char *fields; /* NULL: none */
    const char *transform;
    unsigned threads;
    int on_error;
    size_t bs;
} run_cfg;

static int open_run(stk_loader **l, const run_cfg *c)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, c->path) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, c->bs ? c->bs : 5) == STK_OK);
    REQUIRE(stk_options_set_threads(o, c->threads ? c->threads : 1) == STK_OK);
    REQUIRE(stk_options_set_seed(o, 7) == STK_OK);
    REQUIRE(stk_options_set_on_error(o, c->on_error) == STK_OK);
    if (c->transform)
        REQUIRE(stk_options_set_transform(o, c->transform) == STK_OK);
    if (c->fields && stk_options_set_fields(o, c->fields) != STK_OK) {
        fprintf(stderr, "set_fields: %s\n", stk_options_errmsg(o));
        REQUIRE(0);
    }
    int rc = stk_loader_open(l, o);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(*l));
    stk_options_destroy(o);
    return rc;
}

static const stk_field *field_of(const stk_batch *b, const char *name)
{
    for (size_t k = 0; k < b->nfields; k++)
        if (!strcmp(b->fields[k].name, name))
            return &b->fields[k];
    return NULL;
}

static int var_eq(const stk_field *f, size_t s, const void *p, size_t n)
{
    return f && f->layout == STK_BATCH_VARIABLE && f->lengths[s] == n &&
           !memcmp((const uint8_t *)f->data + f->offsets[s], p, n);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_describe(void)
{
    stk_dataset *d = NULL;
    char err[1024] = "";
    REQUIRE(stk_dataset_open(&d, g_main, NULL, err, sizeof err) == STK_OK);
    const char *names[] = {"cls", "jpg", "json", "left.jpg", "npy", "txt"};
    CHECK_EQ(stk_dataset_field_count(d), 6);
    for (size_t k = 0; k < 6 && k < stk_dataset_field_count(d); k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        CHECK_EQ(stk_dataset_field(d, k, &fi), STK_OK);
        CHECK(!strcmp(fi.name, names[k]));
        CHECK_EQ(fi.samples, NS);
        CHECK_EQ(fi.kind, STK_FIELD_AUTO);
    }
    /* The plain read: the first image member, the .cls label, the key. */
    const void *data;
    size_t len;
    int64_t label;
    CHECK_EQ(stk_dataset_read(d, 3, &data, &len, &label, err, sizeof err), STK_OK);
    CHECK(len == W[3].njpg && !memcmp(data, W[3].jpg, len));
    CHECK_EQ(label, W[3].cls);
    char key[256];
    CHECK_EQ(stk_dataset_sample_key(d, 3, key, sizeof key), STK_OK);
    CHECK(!strcmp(key, "set.v1.2/s003"));
    stk_dataset_close(d);
}

static const char *k_all =
    "label=cls,jpg=jpg:bytes,caption=txt,meta=json,arr=npy,left=left.jpg:bytes";

/* Every field of every sample, once per epoch, byte-equal; returns a hash
 * of the epoch's batches (order, indices and every field). */
static uint64_t whole_epoch(unsigned threads)
{
    stk_loader *l = NULL;
    run_cfg c = {.path = g_main, .fields = k_all, .threads = threads};
    REQUIRE(open_run(&l, &c) == STK_OK);
    int seen[NS] = {0};
    uint64_t h = 0;
    stk_batch *b;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->nfields, 6);
        const stk_field *lab = field_of(b, "label"), *jpg = field_of(b, "jpg"),
                        *cap = field_of(b, "caption"), *meta = field_of(b, "meta"),
                        *arr = field_of(b, "arr"), *left = field_of(b, "left");
        REQUIRE(lab && jpg && cap && meta && arr && left);
        CHECK(lab->layout == STK_BATCH_DENSE && lab->dtype == STK_DTYPE_INT64);
        CHECK(!strcmp(left->source, "left.jpg"));
        CHECK_EQ(cap->kind, STK_FIELD_TEXT);
        CHECK_EQ(meta->kind, STK_FIELD_JSON);
        CHECK_EQ(arr->kind, STK_FIELD_NPY);
        for (size_t s = 0; s < b->size; s++) {
            uint64_t i = b->indices[s];
            REQUIRE(i < NS);
            seen[i]++;
            const want *w = &W[i];
            CHECK_EQ(((const int64_t *)lab->data)[s], w->cls);
            CHECK_EQ(b->labels[s], w->cls);
            CHECK(var_eq(jpg, s, w->jpg, w->njpg));
            CHECK(var_eq(left, s, w->left, w->nleft));
            CHECK(var_eq(cap, s, w->txt, strlen(w->txt)));
            CHECK(var_eq(meta, s, w->json, strlen(w->json)));
            CHECK(var_eq(arr, s, w->npy + w->npy_data, w->nnpy - w->npy_data));
            const int64_t *sh = &arr->shapes[s * (STK_FIELD_MAXDIM + 1)];
            CHECK(sh[0] == 1 && sh[1] == 3);
            CHECK_EQ(arr->dtypes[s], STK_DTYPE_INT32);
            h = tu_hash(h, &i, sizeof i);
            for (size_t f = 0; f < b->nfields; f++) {
                const stk_field *x = &b->fields[f];
                if (x->layout == STK_BATCH_DENSE)
                    h = tu_hash(h, (const uint8_t *)x->data + s * x->sample_bytes, x->sample_bytes);
                else
                    h = tu_hash(h, (const uint8_t *)x->data + x->offsets[s], x->lengths[s]);
            }
        }
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    for (int k = 0; k < NS; k++)
        CHECK_EQ(seen[k], 1);
    stk_loader_close(l);
    return h;
}

static void test_all_fields_epoch(void)
{
    uint64_t h1 = whole_epoch(1), h3 = whole_epoch(3);
    CHECK(h1 == h3);
    /* Again from the cached index (X.tar.stkidx now exists). */
    char idx[700];
    snprintf(idx, sizeof idx, "%s.stkidx", g_main);
    CHECK(access(idx, F_OK) == 0);
    CHECK(whole_epoch(3) == h1);
    /* A subset that starts past the sample's first member and skips one
     * between (npy): one read spans json .. txt. */
    stk_loader *l = NULL;
    run_cfg c = {
        .path = g_main, .fields = "meta=json,caption=txt,left=left.jpg:bytes", .threads = 2};
    REQUIRE(open_run(&l, &c) == STK_OK);
    stk_batch *b;
    size_t n = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        CHECK_EQ(b->nfields, 3);
        for (size_t s = 0; s < b->size; s++, n++) {
            const want *w = &W[b->indices[s]];
            CHECK(var_eq(field_of(b, "meta"), s, w->json, strlen(w->json)));
            CHECK(var_eq(field_of(b, "caption"), s, w->txt, strlen(w->txt)));
            CHECK(var_eq(field_of(b, "left"), s, w->left, w->nleft));
            CHECK_EQ(b->labels[s], w->cls); /* the label out of the read, as always */
        }
        stk_batch_release(b);
    }
    CHECK_EQ(n, NS);
    stk_loader_close(l);
}

/* Hash of an epoch's primary data, labels and indices. */
static uint64_t epoch_hash(const run_cfg *c, size_t *n)
{
    stk_loader *l = NULL;
    REQUIRE(open_run(&l, c) == STK_OK);
    uint64_t h = 0;
    stk_batch *b;
    *n = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        for (size_t s = 0; s < b->size; s++) {
            if (b->kind == STK_BATCH_DENSE)
                h = tu_hash(h, (uint8_t *)b->data + s * b->sample_bytes, b->sample_bytes);
            else
                h = tu_hash(h, (uint8_t *)b->data + b->offsets[s], b->lengths[s]);
            h = tu_hash(h, &b->labels[s], 8);
            h = tu_hash(h, &b->indices[s], 8);
            (*n)++;
        }
        stk_batch_release(b);
    }
    stk_loader_close(l);
    return h;
}

static void test_without_fields_unchanged(void)
{
    /* No fields, no transform: each sample's bytes are its first image
     * member (the .jpg, not the later .left.jpg), its label the .cls. */
    stk_loader *l = NULL;
    run_cfg c = {.path = g_main, .threads = 2};
    REQUIRE(open_run(&l, &c) == STK_OK);
    stk_batch *b;
    size_t n = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        CHECK_EQ(b->nfields, 0);
        for (size_t s = 0; s < b->size; s++, n++) {
            const want *w = &W[b->indices[s]];
            CHECK(b->lengths[s] == w->njpg &&
                  !memcmp((uint8_t *)b->data + b->offsets[s], w->jpg, w->njpg));
            CHECK_EQ(b->labels[s], w->cls);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(n, NS);
    stk_loader_close(l);
    /* The first image field decodes and draws exactly what the loader
     * without fields does: same pixels, labels and order, 1 or 3 threads. */
    const char *tf = "RandomResizedCrop(24)|RandomHorizontalFlip()";
    run_cfg plain = {.path = g_main, .transform = tf, .threads = 1};
    run_cfg with = {
        .path = g_main, .transform = tf, .threads = 3, .fields = "image=jpg,caption=txt,label=cls"};
    size_t n1, n2;
    uint64_t h1 = epoch_hash(&plain, &n1), h2 = epoch_hash(&with, &n2);
    CHECK_EQ(n1, NS);
    CHECK_EQ(n2, NS);
    CHECK(h1 == h2);
}

/* Runs an epoch and collects the errors; returns samples delivered. */
static size_t run_errors(const run_cfg *c, int *raised, char *msg, size_t msglen, char *field,
                         size_t fieldlen)
{
    stk_loader *l = NULL;
    REQUIRE(open_run(&l, c) == STK_OK);
    stk_batch *b;
    size_t n = 0;
    int rc;
    *raised = 0;
    msg[0] = field[0] = '\0';
    for (;;) {
        rc = stk_loader_next(l, &b);
        if (rc == STK_ESAMPLE) {
            stk_error_info ei = {.struct_size = sizeof ei};
            CHECK_EQ(stk_loader_last_error(l, &ei), STK_OK);
            if (!*raised) {
                snprintf(msg, msglen, "%s | %s", ei.message, ei.reason);
                snprintf(field, fieldlen, "%s", ei.field);
            }
            (*raised)++;
            continue;
        }
        if (rc != STK_OK)
            break;
        n += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    if (c->on_error == STK_ON_ERROR_SKIP) {
        stk_stats st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        CHECK_EQ(stk_loader_stats(l, &st), STK_OK);
        size_t ne = stk_loader_error_count(l);
        CHECK_EQ(st.samples_skipped, ne);
        if (ne && !msg[0]) {
            stk_sample_error se;
            CHECK_EQ(stk_loader_error_get(l, 0, &se), STK_OK);
            snprintf(msg, msglen, "%s | %s", se.path, se.reason);
        }
    }
    stk_loader_close(l);
    return n;
}

/* The message of a missing field names every field the sample has, also
 * those the loader did not select (issue 20: "has no field 'txt' (has: jpg,
 * json)"). */
static void test_missing_names_what_the_sample_has(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    add_str(&t, &tn, "a.cls", "1");
    add_str(&t, &tn, "a.json", "{}");
    add_str(&t, &tn, "a.txt", "x");
    add_str(&t, &tn, "b.cls", "2");
    add_str(&t, &tn, "b.json", "[]");
    const char *p = tu_path("has.tar");
    write_tar(p, t, tn); /* takes t */
    char msg[2048], field[64];
    int raised;
    run_cfg c = {.path = p, .fields = "t=txt", .bs = 1, .on_error = STK_ON_ERROR_SKIP};
    (void)run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    stk_loader *l = NULL;
    REQUIRE(open_run(&l, &c) == STK_OK);
    stk_batch *b;
    while (stk_loader_next(l, &b) == STK_OK)
        stk_batch_release(b);
    CHECK_EQ(stk_loader_error_count(l), 1);
    stk_sample_error se;
    CHECK_EQ(stk_loader_error_get(l, 0, &se), STK_OK);
    CHECK(strstr(se.reason, "has no field 'txt' (has: cls, json)") != NULL);
    stk_loader_close(l);
}

/* A tar of 6 samples: 0..5, with a txt and a cls each but sample 2 lacks
 * its txt, sample 3 has a duplicate txt, sample 4 an empty txt. */
static void test_missing_optional_duplicate_empty(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int k = 0; k < 6; k++) {
        char name[100], txt[64];
        snprintf(name, sizeof name, "k%d.cls", k);
        add_str(&t, &tn, name, k == 1 ? "1" : "0");
        snprintf(txt, sizeof txt, "text %d \xc3\xa9", k);
        snprintf(name, sizeof name, "k%d.txt", k);
        if (k == 4)
            add_str(&t, &tn, name, "");
        else if (k != 2)
            add_str(&t, &tn, name, txt);
        if (k == 3)
            add_str(&t, &tn, name, "again");
    }
    const char *p = tu_path("mixed.tar");
    write_tar(p, t, tn);

    stk_dataset *d = NULL;
    char err[1024] = "";
    REQUIRE(stk_dataset_open(&d, p, NULL, err, sizeof err) == STK_OK);
    stk_dataset_field_info fi = {.struct_size = sizeof fi};
    CHECK_EQ(stk_dataset_field_count(d), 2);
    CHECK_EQ(stk_dataset_field(d, 1, &fi), STK_OK);
    CHECK(!strcmp(fi.name, "txt"));
    CHECK_EQ(fi.samples, 5); /* the duplicate counts once */
    stk_dataset_close(d);

    /* raise: sample 2 has no field, sample 3 a duplicate; the others come. */
    char msg[2048], field[64];
    int raised;
    run_cfg c = {.path = p, .fields = "t=txt,label=cls", .bs = 1};
    size_t n = run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    CHECK_EQ(n, 4);
    CHECK_EQ(raised, 2);
    /* skip: the same two, counted, each named. */
    c.on_error = STK_ON_ERROR_SKIP;
    c.bs = 3;
    n = run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    CHECK_EQ(n, 4);
    CHECK_EQ(raised, 0);
    {
        stk_loader *l = NULL;
        REQUIRE(open_run(&l, &c) == STK_OK);
        stk_batch *b;
        int empty_seen = 0;
        while (stk_loader_next(l, &b) == STK_OK) {
            const stk_field *f = field_of(b, "t");
            REQUIRE(f);
            for (size_t s = 0; s < b->size; s++)
                if (b->indices[s] == 4)
                    empty_seen = f->lengths[s] == 0; /* an empty member: 0 bytes */
            stk_batch_release(b);
        }
        CHECK(empty_seen);
        CHECK_EQ(stk_loader_error_count(l), 2);
        int missing = 0, dup = 0;
        for (size_t k = 0; k < stk_loader_error_count(l); k++) {
            stk_sample_error se;
            CHECK_EQ(stk_loader_error_get(l, k, &se), STK_OK);
            CHECK_EQ(se.code, STK_EFORMAT);
            if (se.sample == 2 && strstr(se.reason, "has no field 'txt'") && strstr(se.path, "k2"))
                missing = 1;
            if (se.sample == 3 && strstr(se.reason, "duplicate field 'txt'") &&
                strstr(se.path, "k3"))
                dup = 1;
        }
        CHECK(missing && dup);
        stk_loader_close(l);
    }
    /* txt alone: sample 2's read spans no member at all (0 bytes). */
    c.fields = "t=txt";
    n = run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    CHECK_EQ(n, 4);
    CHECK(strstr(msg, "has no field 'txt'") || strstr(msg, "duplicate field 'txt'"));
    /* Optional: sample 2 is delivered with present 0; the duplicate still
     * fails. */
    c.fields = "t?=txt,label=cls";
    c.on_error = STK_ON_ERROR_SKIP;
    {
        stk_loader *l = NULL;
        REQUIRE(open_run(&l, &c) == STK_OK);
        stk_batch *b;
        size_t got = 0;
        int absent = 0;
        while (stk_loader_next(l, &b) == STK_OK) {
            const stk_field *f = field_of(b, "t"), *lab = field_of(b, "label");
            REQUIRE(f && f->present && lab);
            for (size_t s = 0; s < b->size; s++, got++) {
                if (b->indices[s] == 2)
                    absent = f->present[s] == 0 && f->lengths[s] == 0;
                else
                    CHECK_EQ(f->present[s], 1);
                CHECK_EQ(((const int64_t *)lab->data)[s], b->indices[s] == 1 ? 1 : 0);
            }
            stk_batch_release(b);
        }
        CHECK_EQ(got, 5);
        CHECK(absent);
        CHECK_EQ(stk_loader_error_count(l), 1);
        stk_loader_close(l);
    }
    /* Without fields the tar reads as it always did: the first member that
     * is no label is the payload (the first of the duplicates, the empty
     * one), and sample 2, with only a label member, fails as before. */
    c.fields = NULL;
    c.on_error = STK_ON_ERROR_SKIP;
    n = run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    CHECK_EQ(n, 5);
    CHECK(strstr(msg, "no data member") != NULL);
}

/* Invalid UTF-8 in a txt and invalid JSON: sample errors naming the field,
 * under raise and skip. */
static void test_invalid_text_json(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int k = 0; k < 8; k++) {
        char name[100];
        snprintf(name, sizeof name, "q%d.txt", k);
        add_str(&t, &tn, name, k == 2 ? "bad \xc3\x28 utf8" : "fine \xc3\xa9");
        snprintf(name, sizeof name, "q%d.json", k);
        add_str(&t, &tn, name, k == 5 ? "{\"a\": [1, 2}" : "{\"a\": [1, 2]}");
    }
    const char *p = tu_path("bad.tar");
    write_tar(p, t, tn);
    char msg[2048], field[64];
    int raised;
    run_cfg c = {.path = p, .fields = "caption=txt,meta=json", .bs = 2, .threads = 2};
    size_t n = run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    CHECK_EQ(n, 6);
    CHECK_EQ(raised, 2);
    c.on_error = STK_ON_ERROR_SKIP;
    stk_loader *l = NULL;
    REQUIRE(open_run(&l, &c) == STK_OK);
    stk_batch *b;
    n = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        n += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(n, 6);
    CHECK_EQ(stk_loader_error_count(l), 2);
    for (size_t k = 0; k < stk_loader_error_count(l); k++) {
        stk_sample_error se;
        CHECK_EQ(stk_loader_error_get(l, k, &se), STK_OK);
        if (se.sample == 2)
            CHECK(strstr(se.reason, "caption") && strstr(se.reason, "txt") &&
                  strstr(se.path, "q2"));
        else
            CHECK(se.sample == 5 && strstr(se.reason, "meta") && strstr(se.reason, "json") &&
                  strstr(se.path, "q5"));
    }
    stk_loader_close(l);
    /* raise: the message names the field. */
    c.on_error = STK_ON_ERROR_RAISE;
    c.bs = 1;
    c.threads = 1;
    c.fields = "caption=txt";
    n = run_errors(&c, &raised, msg, sizeof msg, field, sizeof field);
    CHECK_EQ(n, 7);
    CHECK_EQ(raised, 1);
    CHECK(!strcmp(field, "caption"));
    CHECK(strstr(msg, "q2") != NULL);
}

/* A field no sample has is refused at open, naming what there is. */
static void test_unknown_field(void)
{
    stk_loader *l = NULL;
    run_cfg c = {.path = g_main, .fields = "x=seg.png"};
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, c.path) == STK_OK);
    REQUIRE(stk_options_set_fields(o, c.fields) == STK_OK);
    CHECK_EQ(stk_loader_open(&l, o), STK_EINVAL);
    CHECK(strstr(stk_loader_errmsg(l), "seg.png") && strstr(stk_loader_errmsg(l), "left.jpg"));
    stk_loader_close(l);
    stk_options_destroy(o);
}

/* Extensions are lowercased (WebDataset's rule); the key is what precedes
 * the first dot of the file name; an old-format index cache is rebuilt. */
static void test_case_and_cache(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    add_str(&t, &tn, "d.x/a.TXT", "upper");
    add_str(&t, &tn, "d.x/a.Seg.Bin", "seg");
    add_str(&t, &tn, "d.x/b.txt", "lower");
    const char *p = tu_path("case.tar");
    write_tar(p, t, tn);
    /* A planted cache of the previous format beside it: ignored. */
    char idx[700];
    snprintf(idx, sizeof idx, "%s.stkidx", p);
    uint8_t old[200];
    memset(old, 'x', sizeof old);
    memcpy(old, "STKTIDX2", 8);
    tu_write_file(idx, old, sizeof old);
    for (int pass = 0; pass < 2; pass++) { /* built, then from the new cache */
        stk_loader *l = NULL;
        run_cfg c = {.path = p, .fields = "t=txt,s?=seg.bin", .bs = 2};
        REQUIRE(open_run(&l, &c) == STK_OK);
        stk_batch *b;
        int ok = 0;
        while (stk_loader_next(l, &b) == STK_OK) {
            const stk_field *f = field_of(b, "t"), *s = field_of(b, "s");
            REQUIRE(f && s && s->present);
            for (size_t k = 0; k < b->size; k++) {
                if (b->indices[k] == 0)
                    ok += var_eq(f, k, "upper", 5) && s->present[k] && var_eq(s, k, "seg", 3);
                else
                    ok += var_eq(f, k, "lower", 5) && !s->present[k];
            }
            stk_batch_release(b);
        }
        CHECK_EQ(ok, 2);
        stk_loader_close(l);
        size_t cn = 0;
        uint8_t *cb = tu_read_file(idx, &cn);
        CHECK(cb && cn > 8 && !memcmp(cb, "STKTIDX3", 8));
        free(cb);
    }
}

/* 100k tiny members (50k samples of txt + cls) open and read fast. */
static void test_many_tiny(void)
{
    const int ns = 50000;
    size_t cap = (size_t)ns * 2 * 1024 + 1024, tn = 0;
    uint8_t *t = calloc(1, cap);
    REQUIRE(t);
    /* tu_tar_add reallocs per member: write the members into one buffer
     * here instead (its headers by tu_tar_header). */
    for (int k = 0; k < ns; k++) {
        for (int m = 0; m < 2; m++) {
            char name[32], body[16];
            snprintf(name, sizeof name, "%06d.%s", k, m ? "txt" : "cls");
            int bl = m ? snprintf(body, sizeof body, "t%d", k)
                       : snprintf(body, sizeof body, "%d", k % 10);
            uint8_t *h = t + tn;
            tu_tar_header(h, name, (size_t)bl);
            memcpy(h + 512, body, (size_t)bl);
            tn += 1024;
        }
    }
    const char *p = tu_path("tiny.tar");
    tu_write_file(p, t, tn + 1024);
    free(t);
    stk_dataset *d = NULL;
    char err[1024] = "";
    REQUIRE(stk_dataset_open(&d, p, NULL, err, sizeof err) == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    CHECK_EQ(stk_dataset_describe(d, &di), STK_OK);
    CHECK_EQ(di.samples, (uint64_t)ns);
    CHECK_EQ(stk_dataset_field_count(d), 2);
    stk_dataset_close(d);
    stk_loader *l = NULL;
    run_cfg c = {.path = p, .fields = "t=txt,c=cls", .bs = 1000, .threads = 2};
    REQUIRE(open_run(&l, &c) == STK_OK);
    stk_batch *b;
    size_t n = 0, good = 0;
    while (stk_loader_next(l, &b) == STK_OK) {
        const stk_field *f = field_of(b, "t"), *cl = field_of(b, "c");
        REQUIRE(f && cl);
        for (size_t s = 0; s < b->size; s++, n++) {
            char want_t[16];
            int wl = snprintf(want_t, sizeof want_t, "t%llu", (unsigned long long)b->indices[s]);
            good += var_eq(f, s, want_t, (size_t)wl) &&
                    ((const int64_t *)cl->data)[s] == (int64_t)(b->indices[s] % 10);
        }
        stk_batch_release(b);
    }
    CHECK_EQ(n, (size_t)ns);
    CHECK_EQ(good, (size_t)ns);
    stk_loader_close(l);
}

/* One session on the small tar: open with fields, an epoch, close. Samples
 * may fail (skip policy) when an allocation fails inside a worker. */
static int oom_session(const char *p, size_t *delivered)
{
    stk_options *o = NULL;
    stk_loader *l = NULL;
    int rc;
    *delivered = 0;
    if ((rc = stk_options_create(&o)) != STK_OK)
        return rc;
    if ((rc = stk_options_set_source(o, p)) ||
        (rc = stk_options_set_fields(o, "t=txt,m=json,c=cls")))
        goto out;
    stk_options_set_batch_size(o, 2);
    stk_options_set_threads(o, 2);
    stk_options_set_on_error(o, STK_ON_ERROR_SKIP);
    if ((rc = stk_loader_open(&l, o)) != STK_OK) {
        if (l)
            CHECK(stk_loader_errmsg(l)[0] != 0);
        goto out;
    }
    stk_batch *b;
    int r;
    while ((r = stk_loader_next(l, &b)) == STK_OK) {
        *delivered += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(r, STK_END);
out:
    stk_loader_close(l);
    stk_options_destroy(o);
    return rc;
}

/* Allocation failures in the index build (cache removed before each
 * session), the cache load, the fields description and the reads: each
 * open succeeds or fails with STK_ENOMEM, nothing leaks. */
static void test_oom_sweep(void)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int k = 0; k < 5; k++) {
        char name[100];
        snprintf(name, sizeof name, "o%d.txt", k);
        add_str(&t, &tn, name, "text \xc3\xa9");
        snprintf(name, sizeof name, "o%d.json", k);
        add_str(&t, &tn, name, "{\"a\": 1}");
        snprintf(name, sizeof name, "o%d.cls", k);
        add_str(&t, &tn, name, "3");
    }
    const char *p = tu_path("oom.tar");
    write_tar(p, t, tn);
    char idx[700];
    snprintf(idx, sizeof idx, "%s.stkidx", p);
    /* An index the beside cache could not store (an allocation failed)
     * goes to $XDG_CACHE_HOME/stoker/tar (set by main to the test's own). */
    char xdg[700];
    snprintf(xdg, sizeof xdg, "%s/stoker/tar", getenv("XDG_CACHE_HOME"));
    for (int cached = 0; cached < 2; cached++) {
        long live0 = stk__alloc_live(), n;
        int fds0 = tu_count_fds(), enomem = 0;
        for (n = 0; n < 3000; n++) {
            if (!cached) {
                unlink(idx);
                DIR *d = opendir(xdg);
                struct dirent *e;
                while (d && (e = readdir(d))) {
                    char f[1200];
                    snprintf(f, sizeof f, "%s/%s", xdg, e->d_name);
                    if (e->d_name[0] != '.')
                        unlink(f);
                }
                if (d)
                    closedir(d);
            }
            long c0 = stk__alloc_count();
            size_t got;
            stk__alloc_fail_after(n);
            int rc = oom_session(p, &got);
            stk__alloc_fail_after(-1);
            int injected = stk__alloc_count() - c0 > n;
            CHECK(rc == STK_OK || rc == STK_ENOMEM);
            enomem += rc == STK_ENOMEM;
            if (rc == STK_OK && !injected)
                CHECK_EQ(got, 5);
            if (stk__alloc_live() != live0 || tu_count_fds() != fds0) {
                fprintf(stderr, "    n=%ld leaked %ld allocations, %d fds\n", n,
                        stk__alloc_live() - live0, tu_count_fds() - fds0);
                CHECK(0);
                break;
            }
            if (!injected)
                break;
        }
        printf("    %s: %ld allocation points, %d opens failed with ENOMEM\n",
               cached ? "cached index" : "index built", n, enomem);
        CHECK(n > 5 && n < 3000);
    }
}

int main(void)
{
    tu_begin("test_tar_fields", 120);
    setenv("XDG_CACHE_HOME", tu_path("xdg"), 1);
    make_main();
    RUN(test_describe);
    RUN(test_all_fields_epoch);
    RUN(test_without_fields_unchanged);
    RUN(test_missing_optional_duplicate_empty);
    RUN(test_missing_names_what_the_sample_has);
    RUN(test_invalid_text_json);
    RUN(test_unknown_field);
    RUN(test_case_and_cache);
    RUN(test_many_tiny);
    RUN(test_oom_sweep);
    for (int k = 0; k < NS; k++) {
        free(W[k].jpg);
        free(W[k].left);
    }
    return tu_end();
}
