/* test_device_fields.c -- samples with several fields through the device
 * stage (docs/gpu.md, docs/multimodal.md), on the fake backend and on the
 * CUDA backend over the mock driver (tests/c/mock_cuda.c): the dense
 * numeric fields (the first image, converted on the device; a second image
 * of one size; int64 and float32 columns; a uniform .npy column) arrive in
 * device memory bit-identical to the host path's bytes for the same seed,
 * and the host columns (text, JSON, bytes, a ragged .npy, an optional
 * field) equal the host path's, over several epochs and thread counts, and
 * with samples skipped (every column compacted alike); a
 * consumer holding batches while the copy thread runs ahead reads them
 * intact (ASan: no use after free); a consumer on its own stream reads
 * device memory nobody rewrote (the fake's checks) and no host memory is
 * changed under a queued copy; resume; the memory bound. Also run under
 * ASan and TSan. STOKER_TEST_DEVICE=cuda (scripts/test-gpu.sh) runs the
 * checks that need no fake hooks on the real CUDA backend. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include "device/stage.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define NS     29 /* samples: batches of 4 leave a short last batch */
#define BS     4
#define EPOCHS 3
#define MAXB   (EPOCHS * ((NS + BS - 1) / BS))

static const char *g_dev = "fake"; /* or "cuda" (the mock driver) */
static char g_tar[600], g_bad[600];
static const char *g_src = g_tar; /* what open_loader opens */
static int g_on_error = STK_ON_ERROR_RAISE;

#define SPEC_NORM                                                                                  \
    "RandomResizedCrop(16)|RandomHorizontalFlip()|Normalize(mean=(0.485,0.456,0.406), "            \
    "std=(0.229,0.224,0.225))"

/* Every kind of field: image (float16, converted on the device), a second
 * image of one size (uint8, its own draws), text, JSON, int, float, a
 * uniform .npy, a ragged .npy, the image's bytes, and an optional text
 * that some samples lack. */
static const char *const k_fields =
    "image=jpg,seg=seg.jpg,caption=txt,meta=json:json,label=cls,score=score:float,arr=npy,"
    "rag=rag.npy,raw=jpg:bytes,note?=note.txt";

static uint8_t *photo(uint32_t w, uint32_t h, int seed, size_t *n)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    uint32_t x = 2463534242u + (uint32_t)seed * 977u;
    for (size_t k = 0; k < (size_t)w * h * 3; k++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        rgb[k] = (uint8_t)((k * 5 + (size_t)seed * 30) % 256 / 2 + (x & 63));
    }
    uint8_t *j = tu_jpeg(rgb, w, h, 85, n);
    free(rgb);
    REQUIRE(j);
    return j;
}

/* A .npy of `count` int32 (k, -k, k*k, ...) with shape (count,), v1.0. */
static size_t make_npy(uint8_t *out, int k, int count)
{
    char dict[128];
    int dl = snprintf(dict, sizeof dict,
                      "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", count);
    size_t hl = (size_t)dl + 1;
    while ((10 + hl) % 64)
        hl++;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)hl;
    out[9] = (uint8_t)(hl >> 8);
    memset(out + 10, ' ', hl);
    memcpy(out + 10, dict, (size_t)dl);
    out[10 + hl - 1] = '\n';
    for (int i = 0; i < count; i++) {
        int32_t v = i == 0 ? k : i == 1 ? -k : k * k + i;
        memcpy(out + 10 + hl + 4 * (size_t)i, &v, 4);
    }
    return 10 + hl + 4 * (size_t)count;
}

static void add_str(uint8_t **t, size_t *tn, const char *name, const char *s)
{
    tu_tar_add(t, tn, name, s, strlen(s));
}

/* bad: sample 5's JSON is invalid and sample 17's image no JPEG (under
 * skip both are left out of their batches, compacting every column). */
static void make_tar(const char *file, bool bad, char *path, size_t pathlen)
{
    uint8_t *t = NULL;
    size_t tn = 0;
    for (int k = 0; k < NS; k++) {
        char key[32], name[64], s[256];
        snprintf(key, sizeof key, "s%03d", k);
        size_t n;
        uint8_t *j = photo(24 + (uint32_t)(k % 7) * 3, 20 + (uint32_t)(k % 5) * 4, k, &n);
        snprintf(name, sizeof name, "%s.jpg", key);
        if (bad && k == 17)
            memset(j, 'x', 16);
        tu_tar_add(&t, &tn, name, j, n);
        free(j);
        j = photo(18 + (uint32_t)(k % 3) * 5, 30 - (uint32_t)(k % 4), k + 500, &n);
        snprintf(name, sizeof name, "%s.seg.jpg", key);
        tu_tar_add(&t, &tn, name, j, n);
        free(j);
        /* Captions of varied length (up to ~200 bytes), with UTF-8. */
        int len = snprintf(s, sizeof s, "caption %d: caf\xc3\xa9 \xf0\x9f\x9a\x80 ", k);
        for (int r = 0; r < k * 5 % 37 && len < 240; r++)
            s[len++] = (char)('a' + (k + r) % 26);
        s[len] = 0;
        snprintf(name, sizeof name, "%s.txt", key);
        add_str(&t, &tn, name, s);
        snprintf(s, sizeof s, "{\"id\": %d, \"tags\": [\"t%d\", %d.5], \"ok\": %s}", k, k % 3, k,
                 bad && k == 5 ? "nope"
                 : k % 2       ? "true"
                               : "null");
        snprintf(name, sizeof name, "%s.json", key);
        add_str(&t, &tn, name, s);
        snprintf(s, sizeof s, "%d\n", k % 5);
        snprintf(name, sizeof name, "%s.cls", key);
        add_str(&t, &tn, name, s);
        snprintf(s, sizeof s, "%d.%d", k, k * 7 % 10);
        snprintf(name, sizeof name, "%s.score", key);
        add_str(&t, &tn, name, s);
        uint8_t npy[256];
        snprintf(name, sizeof name, "%s.npy", key);
        tu_tar_add(&t, &tn, name, npy, make_npy(npy, k, 3));
        snprintf(name, sizeof name, "%s.rag.npy", key);
        tu_tar_add(&t, &tn, name, npy, make_npy(npy, k, 1 + k % 4));
        if (k % 3) {
            snprintf(s, sizeof s, "note %d", k);
            snprintf(name, sizeof name, "%s.note.txt", key);
            add_str(&t, &tn, name, s);
        }
    }
    t = realloc(t, tn + 1024);
    REQUIRE(t);
    memset(t + tn, 0, 1024);
    snprintf(path, pathlen, "%s", tu_path(file));
    tu_write_file(path, t, tn + 1024);
    free(t);
}

static int open_loader(stk_loader **l, const char *device, unsigned threads, unsigned depth,
                       uint64_t seed)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, g_src) == STK_OK);
    REQUIRE(stk_options_set_on_error(o, g_on_error) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, BS) == STK_OK);
    REQUIRE(stk_options_set_threads(o, threads) == STK_OK);
    REQUIRE(stk_options_set_depth(o, depth) == STK_OK);
    REQUIRE(stk_options_set_seed(o, seed) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
    REQUIRE(stk_options_set_transform(o, SPEC_NORM) == STK_OK);
    REQUIRE(stk_options_set(o, "dtype", "float16") == STK_OK);
    REQUIRE(stk_options_set(o, "layout", "nchw") == STK_OK);
    REQUIRE(stk_options_set(o, "device", device) == STK_OK);
    REQUIRE(stk_options_set(o, "field_memory", "1M") == STK_OK);
    if (stk_options_set_fields(o, k_fields) != STK_OK) {
        fprintf(stderr, "    fields: %s\n", stk_options_errmsg(o));
        REQUIRE(0);
    }
    REQUIRE(stk_options_add_field(o, "seg2", "seg.jpg", STK_FIELD_IMAGE, "CenterCrop(12)", 0) ==
            STK_OK);
    int rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    if (rc)
        fprintf(stderr, "    open: %s\n", stk_loader_errmsg(*l));
    return rc;
}

/* Bytes of a device column on the host (the batch's copy has run). */
static uint8_t *from_device(stk_loader *l, const void *p, size_t n)
{
    uint8_t *out = malloc(n ? n : 1);
    REQUIRE(out);
    stk__dev *d = stk__loader_device(l);
    char err[256];
    REQUIRE(d && d->ops->copy_d2h(d, out, (stk__dptr)(uintptr_t)p, n, err, sizeof err) == 0);
    return out;
}

/* A field's samples as the host path gives them, whatever its layout: the
 * bytes, present, and (images, .npy) the dtype and shape of each. An .npy
 * column that is dense on the device is variable on the host: the same
 * hash either way. */
static uint64_t field_hash(stk_loader *l, uint64_t h, const stk_batch *b, const stk_field *f)
{
    h = tu_hash(h, f->name, strlen(f->name));
    h = tu_hash(h, &f->kind, sizeof f->kind);
    bool npy = f->kind == STK_FIELD_NPY;
    if (f->layout == STK_BATCH_DENSE) {
        if (!npy) {
            h = tu_hash(h, &f->dtype, sizeof f->dtype);
            h = tu_hash(h, &f->ndim, sizeof f->ndim);
            h = tu_hash(h, f->shape, sizeof f->shape);
        }
        size_t n = b->size * f->sample_bytes;
        uint8_t *p = f->device == STK_DEVICE_CPU ? NULL : from_device(l, f->data, n);
        const uint8_t *q = p ? p : f->data;
        for (size_t k = 0; k < b->size; k++) {
            if (npy) {
                int64_t sh[STK_FIELD_MAXDIM + 1] = {(int64_t)f->ndim};
                for (unsigned d = 0; d < f->ndim; d++)
                    sh[1 + d] = f->shape[d];
                h = tu_hash(h, sh, sizeof sh);
                int32_t dt = f->dtype;
                h = tu_hash(h, &dt, sizeof dt);
            }
            uint64_t len = f->sample_bytes;
            h = tu_hash(h, &len, sizeof len);
            h = tu_hash(h, q + k * f->sample_bytes, f->sample_bytes);
            uint8_t pr = f->present ? f->present[k] : 1;
            h = tu_hash(h, &pr, 1);
        }
        free(p);
        return h;
    }
    CHECK_EQ(f->device, STK_DEVICE_CPU);
    for (size_t k = 0; k < b->size; k++) {
        if (npy) {
            h = tu_hash(h, &f->shapes[k * (STK_FIELD_MAXDIM + 1)],
                        (STK_FIELD_MAXDIM + 1) * sizeof *f->shapes);
            h = tu_hash(h, &f->dtypes[k], sizeof f->dtypes[k]);
        } else if (f->shapes) {
            h = tu_hash(h, &f->shapes[k * (STK_FIELD_MAXDIM + 1)],
                        (STK_FIELD_MAXDIM + 1) * sizeof *f->shapes);
        }
        h = tu_hash(h, &f->lengths[k], sizeof f->lengths[k]);
        h = tu_hash(h, (const uint8_t *)f->data + f->offsets[k], f->lengths[k]);
        uint8_t pr = f->present ? f->present[k] : 1;
        h = tu_hash(h, &pr, 1);
    }
    return h;
}

static uint64_t batch_hash(stk_loader *l, const stk_batch *b)
{
    uint64_t h = tu_hash(0, &b->epoch, sizeof b->epoch);
    h = tu_hash(h, &b->index, sizeof b->index);
    h = tu_hash(h, &b->size, sizeof b->size);
    h = tu_hash(h, b->labels, b->size * sizeof *b->labels);
    h = tu_hash(h, b->indices, b->size * sizeof *b->indices);
    h = tu_hash(h, &b->nfields, sizeof b->nfields);
    for (size_t k = 0; k < b->nfields; k++)
        h = field_hash(l, h, b, &b->fields[k]);
    return h;
}

static const stk_field *field_named(const stk_batch *b, const char *name)
{
    for (size_t k = 0; k < b->nfields; k++)
        if (!strcmp(b->fields[k].name, name))
            return &b->fields[k];
    REQUIRE(0);
    return NULL;
}

/* Where each field of a device batch is. */
static void check_placement(const stk_batch *b)
{
    int dev = b->device;
    CHECK(dev != STK_DEVICE_CPU);
    static const char *const on_dev[] = {"image", "seg", "seg2", "label", "score", "arr"};
    static const char *const on_host[] = {"caption", "meta", "raw", "note"};
    for (size_t k = 0; k < sizeof on_dev / sizeof *on_dev; k++) {
        const stk_field *f = field_named(b, on_dev[k]);
        CHECK_EQ(f->device, dev);
        CHECK_EQ(f->layout, STK_BATCH_DENSE);
    }
    for (size_t k = 0; k < sizeof on_host / sizeof *on_host; k++) {
        const stk_field *f = field_named(b, on_host[k]);
        CHECK_EQ(f->device, STK_DEVICE_CPU);
        CHECK_EQ(f->layout, STK_BATCH_VARIABLE);
    }
    /* The ragged .npy: dense on the device when the batch's arrays happen
     * to share a shape, else on the host. */
    const stk_field *rag = field_named(b, "rag");
    bool same = true;
    if (rag->layout == STK_BATCH_VARIABLE) {
        for (size_t k = 1; k < b->size; k++)
            same = same && rag->lengths[k] == rag->lengths[0];
        CHECK(!same || b->size == 1);
        CHECK_EQ(rag->device, STK_DEVICE_CPU);
    } else {
        CHECK_EQ(rag->device, dev);
    }
    const stk_field *img = field_named(b, "image");
    CHECK(img->data == b->data);
    CHECK_EQ(img->dtype, STK_DTYPE_FLOAT16);
    CHECK_EQ(img->shape[0], 3);
    const stk_field *arr = field_named(b, "arr");
    CHECK_EQ(arr->dtype, STK_DTYPE_INT32);
    CHECK_EQ(arr->ndim, 1u);
    CHECK_EQ(arr->shape[0], 3);
    CHECK_EQ(field_named(b, "label")->dtype, STK_DTYPE_INT64);
    CHECK_EQ(field_named(b, "score")->dtype, STK_DTYPE_FLOAT32);
    CHECK(field_named(b, "note")->present != NULL);
}

/* Hashes of every batch from the position to the end of `epochs` epochs;
 * the consumer holds up to `hold` batches at once and hashes each only
 * when it releases it, after taking the later ones (the copy thread and
 * the workers meanwhile reuse the host buffers). */
static size_t run(stk_loader *l, int epochs, unsigned hold, uint64_t *out, size_t cap)
{
    size_t n = 0;
    stk_batch *held[8];
    unsigned nh = 0;
    for (int e = 0; e < epochs; e++) {
        for (;;) {
            stk_batch *b;
            int rc = stk_loader_next(l, &b);
            if (rc == STK_END)
                break;
            if (rc)
                fprintf(stderr, "    next: %s\n", stk_loader_errmsg(l));
            REQUIRE(rc == STK_OK);
            if (b->device != STK_DEVICE_CPU) {
                check_placement(b);
                REQUIRE(stk_batch_sync(b) == STK_OK);
            }
            held[nh++] = b;
            if (nh > hold) {
                REQUIRE(n < cap);
                out[n++] = batch_hash(l, held[0]);
                stk_batch_release(held[0]);
                memmove(held, held + 1, --nh * sizeof *held);
            }
        }
        while (nh) {
            REQUIRE(n < cap);
            out[n++] = batch_hash(l, held[0]);
            stk_batch_release(held[0]);
            memmove(held, held + 1, --nh * sizeof *held);
        }
    }
    return n;
}

static size_t host_run(uint64_t *out, uint64_t seed)
{
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, "cpu", 1, 2, seed) == STK_OK);
    size_t n = run(l, EPOCHS, 0, out, MAXB);
    stk_loader_close(l);
    return n;
}

/* Every batch bit-identical to the host path's, for 1 and 3 threads, depth
 * 1 and 3, holding 0 to `depth` batches while the next ones come. */
static void test_same_as_host(void)
{
    uint64_t want[MAXB], got[MAXB];
    size_t nw = host_run(want, 11);
    CHECK_EQ(nw, (size_t)MAXB);
    static const struct {
        unsigned threads, depth, hold;
    } k_runs[] = {{1, 1, 0}, {3, 3, 3}, {2, 2, 1}};
    for (size_t r = 0; r < sizeof k_runs / sizeof *k_runs; r++) {
        stk__fake_config(r + 1, 400, 0);
        stk_loader *l = NULL;
        REQUIRE(open_loader(&l, g_dev, k_runs[r].threads, k_runs[r].depth, 11) == STK_OK);
        size_t ng = run(l, EPOCHS, k_runs[r].hold, got, MAXB);
        stk_loader_close(l);
        CHECK_EQ(ng, nw);
        for (size_t k = 0; k < nw && k < ng; k++)
            if (want[k] != got[k]) {
                fprintf(stderr, "    run %zu: batch %zu differs from the host path\n", r, k);
                CHECK(0);
                break;
            }
        if (!strncmp(g_dev, "fake", 4)) {
            stk__fake_counts fc;
            stk__fake_counts_get(&fc);
            CHECK(fc.copies > 0);
            CHECK_EQ(fc.host_changed, 0);
        }
    }
}

/* Under skip, the failed samples are left out of their batches on the
 * host before the copy: the device columns and the host ones are compacted
 * alike, equal to the host path's. */
static void test_skip_compacts(void)
{
    g_src = g_bad;
    g_on_error = STK_ON_ERROR_SKIP;
    uint64_t want[MAXB], got[MAXB];
    size_t nw = host_run(want, 2);
    stk__fake_config(9, 300, 0);
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, g_dev, 3, 2, 2) == STK_OK);
    size_t ng = run(l, EPOCHS, 2, got, MAXB);
    stk_stats st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_stats(l, &st) == STK_OK);
    /* (Counted where the copy thread is, which may be into the next epoch.) */
    CHECK(st.samples_skipped >= 2 * EPOCHS);
    stk_loader_close(l);
    CHECK_EQ(ng, nw);
    for (size_t k = 0; k < nw && k < ng; k++)
        CHECK(want[k] == got[k]);
    g_src = g_tar;
    g_on_error = STK_ON_ERROR_RAISE;
}

/* A consumer on its own fake stream: it waits on the device, checks every
 * device column there (queued, run late) and releases on its stream, so the
 * copy thread reuses buffers while those checks and earlier copies are
 * still queued. Nothing it reads was rewritten, and no host memory changed
 * under a queued copy (the .npy column is copied from the buffer's host
 * arena, which the next batch in that buffer rewrites). */
static void test_stream_consumer(void)
{
    if (strncmp(g_dev, "fake", 4))
        return;
    /* The expected bytes of every device column, from the host path. */
    static const char *const cols[] = {"image", "seg", "seg2", "label", "score"};
    enum { NC = 5 };
    uint64_t want[MAXB][NC + 1];
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, "cpu", 2, 2, 5) == STK_OK);
    size_t nb = 0;
    for (int e = 0; e < 2; e++) {
        stk_batch *b;
        while (stk_loader_next(l, &b) == STK_OK) {
            REQUIRE(nb < MAXB);
            for (int c = 0; c < NC; c++) {
                const stk_field *f = field_named(b, cols[c]);
                want[nb][c] = XXH3_64bits(f->data, b->size * f->sample_bytes);
            }
            /* The .npy column stacked, as the device has it. */
            const stk_field *a = field_named(b, "arr");
            XXH3_state_t *xs = XXH3_createState();
            REQUIRE(xs && XXH3_64bits_reset(xs) == XXH_OK);
            for (size_t k = 0; k < b->size; k++)
                XXH3_64bits_update(xs, (const uint8_t *)a->data + a->offsets[k], a->lengths[k]);
            want[nb][NC] = XXH3_64bits_digest(xs);
            XXH3_freeState(xs);
            nb++;
            stk_batch_release(b);
        }
    }
    stk_loader_close(l);

    for (uint64_t seed = 1; seed <= 3; seed++) {
        stk__fake_config(seed, 2000, 0);
        REQUIRE(open_loader(&l, "fake", 2, 2, 5) == STK_OK);
        stk__dev *d = stk__loader_device(l);
        REQUIRE(d);
        stk__stream cs = NULL;
        char err[256];
        REQUIRE(d->ops->stream_create(d, &cs, err, sizeof err) == STK_OK);
        size_t k = 0;
        for (int e = 0; e < 2; e++) {
            stk_batch *b;
            while (stk_loader_next(l, &b) == STK_OK) {
                REQUIRE(k < nb);
                CHECK_EQ(stk_batch_wait(b, cs), STK_OK);
                for (int c = 0; c <= NC; c++) {
                    const stk_field *f = field_named(b, c < NC ? cols[c] : "arr");
                    REQUIRE(stk__fake_check(d, cs, f->data, b->size * f->sample_bytes,
                                            want[k][c]) == STK_OK);
                }
                k++;
                stk_batch_release_stream(b, cs);
            }
        }
        CHECK_EQ(k, nb);
        d->ops->stream_destroy(d, cs); /* waits for the checks */
        stk_loader_close(l);
        stk__fake_counts fc;
        stk__fake_counts_get(&fc);
        CHECK(fc.checks >= (uint64_t)nb * (NC + 1));
        CHECK_EQ(fc.check_failed, 0);
        CHECK_EQ(fc.host_changed, 0);
    }
}

/* Resume mid-epoch: the rest equals the host path's. */
static void test_resume(void)
{
    uint64_t want[MAXB], got[MAXB];
    size_t nw = host_run(want, 11);
    stk_loader *l = NULL;
    REQUIRE(open_loader(&l, g_dev, 2, 2, 11) == STK_OK);
    size_t per = (NS + BS - 1) / BS;
    size_t first = run(l, 1, 1, got, MAXB); /* epoch 0 */
    CHECK_EQ(first, per);
    for (int k = 0; k < 3; k++) {
        stk_batch *b;
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        REQUIRE(stk_batch_sync(b) == STK_OK);
        got[first++] = batch_hash(l, b);
        stk_batch_release(b);
    }
    stk_state st = {.struct_size = sizeof st};
    REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
    stk_loader_close(l);
    REQUIRE(open_loader(&l, g_dev, 3, 1, 11) == STK_OK);
    REQUIRE(stk_loader_set_state(l, &st) == STK_OK);
    size_t rest = run(l, EPOCHS - 1, 1, got + first, MAXB - first);
    stk_loader_close(l);
    CHECK_EQ(first + rest, nw);
    for (size_t k = 0; k < nw && k < first + rest; k++)
        if (want[k] != got[k]) {
            fprintf(stderr, "    batch %zu after resume differs from the host path\n", k);
            CHECK(0);
            break;
        }
}

/* The memory bound counts each device buffer's host columns, and the
 * device memory its dense columns. */
static void test_memory_bound(void)
{
    stk_loader *h = NULL, *l = NULL;
    REQUIRE(open_loader(&h, "cpu", 2, 2, 1) == STK_OK);
    REQUIRE(open_loader(&l, g_dev, 2, 2, 1) == STK_OK);
    stk_stats sh = {.struct_size = sizeof sh}, sd = {.struct_size = sizeof sd};
    REQUIRE(stk_loader_stats(h, &sh) == STK_OK);
    REQUIRE(stk_loader_stats(l, &sd) == STK_OK);
    /* 3 device buffers: the field arena (1M) each, and on the device the
     * dense columns: float16 and uint8 images, int64, float32, and room
     * for the .npy column. */
    CHECK(sd.memory_bound_bytes >= sh.memory_bound_bytes + 3ull * (1 << 20));
    uint64_t dense = BS * (3ull * 16 * 16 * 2 + 3ull * 16 * 16 + 8 + 4);
    CHECK(sd.device_memory_bytes >= 3 * (dense + (1ull << 20)));
    stk_loader_close(h);
    stk_loader_close(l);
}

/* Fields without an image: the batch's data is empty and every dense
 * column still goes to the device. */
static void test_no_image_field(void)
{
    uint64_t want[MAXB];
    size_t nw = 0;
    for (int pass = 0; pass < 2; pass++) {
        stk_options *o = NULL;
        REQUIRE(stk_options_create(&o) == STK_OK);
        REQUIRE(stk_options_set_source(o, g_tar) == STK_OK);
        REQUIRE(stk_options_set_batch_size(o, BS) == STK_OK);
        REQUIRE(stk_options_set_threads(o, 2) == STK_OK);
        REQUIRE(stk_options_set_seed(o, 4) == STK_OK);
        REQUIRE(stk_options_set_shuffle(o, 1) == STK_OK);
        REQUIRE(stk_options_set(o, "device", pass ? g_dev : "cpu") == STK_OK);
        REQUIRE(stk_options_set_fields(o, "label=cls,score=score:float,caption=txt,arr=npy") ==
                STK_OK);
        stk_loader *l = NULL;
        int rc = stk_loader_open(&l, o);
        stk_options_destroy(o);
        if (rc)
            fprintf(stderr, "    open: %s\n", stk_loader_errmsg(l));
        REQUIRE(rc == STK_OK);
        stk_batch *b;
        size_t n = 0;
        for (int e = 0; e < 2; e++) {
            while ((rc = stk_loader_next(l, &b)) == STK_OK) {
                REQUIRE(stk_batch_sync(b) == STK_OK);
                CHECK_EQ(b->sample_bytes, 0);
                if (pass) {
                    CHECK_EQ(field_named(b, "label")->device, b->device);
                    CHECK_EQ(field_named(b, "arr")->device, b->device);
                    CHECK_EQ(field_named(b, "caption")->device, STK_DEVICE_CPU);
                }
                uint64_t h = batch_hash(l, b);
                if (!pass) {
                    REQUIRE(nw < MAXB);
                    want[nw++] = h;
                } else {
                    CHECK(n < nw && want[n] == h);
                }
                n++;
                stk_batch_release(b);
            }
            CHECK_EQ(rc, STK_END);
        }
        if (pass)
            CHECK_EQ(n, nw);
        stk_loader_close(l);
    }
}

/* ---- the CUDA backend on the mock driver -------------------------------- */

static void run_on_mock_cuda(void)
{
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
    REQUIRE(n > 0);
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    REQUIRE(slash);
    strcpy(slash + 1, "libmockcuda.so");
    void *mock = dlopen(exe, RTLD_NOW | RTLD_LOCAL);
    if (!mock) {
        printf("mock CUDA driver: skipped (%s)\n", dlerror());
        return;
    }
    if (!stk__cuda_have_kernels()) {
        printf("mock CUDA driver: skipped (this build has no CUDA kernels)\n");
        dlclose(mock);
        return;
    }
    printf("device under test: cuda, on the mock driver %s\n", exe);
    setenv("STOKER_LIBCUDA", exe, 1);
    g_dev = "cuda";
    RUN(test_same_as_host);
    RUN(test_skip_compacts);
    RUN(test_resume);
    RUN(test_memory_bound);
    RUN(test_no_image_field);
    unsetenv("STOKER_LIBCUDA");
    g_dev = "fake";
    long (*live)(void) = NULL;
    void *p = dlsym(mock, "mock_cuda_live");
    memcpy(&live, &p, sizeof p);
    REQUIRE(live);
    CHECK_EQ(live(), 0); /* every allocation, stream and event freed */
    dlclose(mock);
}

int main(void)
{
    /* STOKER_TEST_DEVICE=cuda (scripts/test-gpu.sh): the real CUDA backend. */
    const char *env = getenv("STOKER_TEST_DEVICE");
    if (env && *env)
        g_dev = env;
    tu_begin("test_device_fields", 300);
    printf("device under test: %s\n", g_dev);
    make_tar("fields.tar", false, g_tar, sizeof g_tar);
    make_tar("bad.tar", true, g_bad, sizeof g_bad);
    RUN(test_same_as_host);
    RUN(test_stream_consumer);
    RUN(test_skip_compacts);
    RUN(test_resume);
    RUN(test_memory_bound);
    RUN(test_no_image_field);
    if (!strncmp(g_dev, "fake", 4))
        run_on_mock_cuda();
    return tu_end();
}
