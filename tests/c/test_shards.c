/* test_shards.c -- the .stk format, `stoker pack`/`verify`, the tar and CIFAR
 * readers, and how a dataset is named (directory, file, brace pattern).
 * The pack, info and verify commands come from the tool's code linked as
 * build/MODE/libstoker_tools.a (tools/commands.h). */
#include "testutil.h"

#include "../../tools/commands.h"
#include "internal.h"
#include "pack/pack.h"
#include "source/dataset.h"
#include "source/manifest.h"
#include "source/stkformat.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

/* ---- Fixtures -------------------------------------------------------------- */

static uint64_t g_seed = 1;
static uint8_t rnd8(void)
{
    g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint8_t)(g_seed >> 56);
}

/* A real JPEG of w x h (smooth gradient plus noise). Caller frees. */
static uint8_t *make_jpeg(uint32_t w, uint32_t h, size_t *n)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    REQUIRE(px);
    for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                px[((size_t)y * w + x) * 3 + (unsigned)c] =
                    (uint8_t)((x * 255 / w + y * 128 / h + (unsigned)c * 40 + (rnd8() & 15)) & 255);
    uint8_t *out = tu_jpeg(px, w, h, 90, n);
    free(px);
    return out;
}

/* A file that passes as a JPEG up to its image data (the headers of a real
 * 8x8 JPEG, through the start-of-scan segment) followed by tail random bytes:
 * pack and verify check that a .jpg is a JPEG by its headers, and tests
 * want arbitrary payloads of many sizes. */
static void write_jpeg_like(const char *path, size_t tail)
{
    size_t n, k = 2;
    uint8_t *j = make_jpeg(8, 8, &n);
    while (k + 4 <= n && !(j[k] == 0xFF && j[k + 1] == 0xDA))
        k += 2 + ((size_t)j[k + 2] << 8 | j[k + 3]);
    REQUIRE(k + 4 <= n);
    size_t head = k + 2 + ((size_t)j[k + 2] << 8 | j[k + 3]);
    uint8_t *b = malloc(head + tail);
    memcpy(b, j, head);
    for (size_t i = 0; i < tail; i++)
        b[head + i] = rnd8();
    tu_write_file(path, b, head + tail);
    free(b);
    free(j);
}

/* ImageFolder tree: classes x per files named *.jpg, real JPEGs or JPEG
 * headers followed by random bytes. */
static const char *make_folder(const char *rel, int classes, int per, bool real_jpeg)
{
    static char root[512];
    snprintf(root, sizeof root, "%s", tu_path(rel));
    for (int c = 0; c < classes; c++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/class%02d", root, c);
        tu_mkdirs(dir);
        for (int k = 0; k < per; k++) {
            char p[700];
            snprintf(p, sizeof p, "%s/img%03d.jpg", dir, k);
            if (real_jpeg) {
                size_t n;
                uint8_t *j = make_jpeg(300 + 40 * (unsigned)k, 200 + 10 * (unsigned)c, &n);
                tu_write_file(p, j, n);
                free(j);
            } else {
                write_jpeg_like(p, 100 + (size_t)(rnd8()) * 20);
            }
        }
    }
    return root;
}

static stoker_pack_opts pack_opts(const char *src, const char *out)
{
    stoker_pack_opts o;
    memset(&o, 0, sizeof o);
    o.src = src;
    o.out = out;
    o.shard_size = 256u << 20;
    o.quality = 90;
    o.threads = 2;
    o.quiet = 1;
    return o;
}

static int do_pack(const stoker_pack_opts *o)
{
    char err[1024];
    int rc = stoker_pack(o, err, sizeof err);
    if (rc)
        fprintf(stderr, "pack failed: %s\n", err);
    return rc;
}

static int open_src(stk__source *s, const char *path, char *err, size_t n)
{
    stk__source_params prm = {0};
    return stk__source_open(s, path, &prm, err, n);
}

/* Reads sample i of s into a malloc'd copy. */
static int read_sample(stk__source *s, uint64_t i, uint8_t **out, size_t *len, int64_t *label,
                       char *err, size_t n)
{
    stk__scratch sc = {NULL, 0, 1u << 28};
    stk__sink sink = {.grow = &sc};
    uint8_t *d;
    int rc = s->ops->read(s, i, &sink, &d, len, label, err, n);
    if (rc == STK_OK) {
        *out = malloc(*len ? *len : 1);
        memcpy(*out, d, *len);
    }
    stk__scratch_free(&sc);
    return rc;
}

static bool same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* Re-seals a shard after a test edits its index: recomputes the index and
 * footer checksums so the edit reaches the entry checks. */
static void reseal(uint8_t *b, size_t n)
{
    uint8_t *f = b + n - STK_FOOTER_SIZE;
    uint64_t io = stk__get64(f);
    stk__put64(f + 32, stk__xxh3(b + io, n - STK_FOOTER_SIZE - (size_t)io));
    stk__put64(f + 48, stk__xxh3(f, 48));
}

/* ---- .stk round trip --------------------------------------------------------- */

static void test_pack_roundtrip(void)
{
    const char *root = make_folder("rt/src", 3, 7, false);
    char rootc[512];
    snprintf(rootc, sizeof rootc, "%s", root);
    stoker_pack_opts o = pack_opts(rootc, tu_path("rt/out"));
    o.shard_size = 2000; /* many shards */
    REQUIRE(do_pack(&o) == 0);
    stk__source a, b;
    char err[512];
    REQUIRE(open_src(&a, rootc, err, sizeof err) == STK_OK);
    int rc = open_src(&b, o.out, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    CHECK(!strcmp(b.ops->kind, "stk"));
    CHECK_EQ(b.count, 21);
    CHECK_EQ(b.num_classes, 3);
    stk__dataset_info di;
    stk__source_describe(&b, &di);
    CHECK(di.shards > 3);
    CHECK_EQ(di.images, 2); /* encoded: check the samples whose keys name images */
    stk__dataset_info da;
    stk__source_describe(&a, &da);
    CHECK(!strcmp(da.format, "folder"));
    CHECK_EQ(da.images, 1); /* a folder holds only image files */
    CHECK(!strcmp(stk__source_class_name(&a, 1), "class01"));
    CHECK(!stk__source_class_name(&a, 3));
    for (uint64_t i = 0; i < a.count; i++) {
        uint8_t *x, *y;
        size_t nx, ny;
        int64_t lx, ly;
        REQUIRE(read_sample(&a, i, &x, &nx, &lx, err, sizeof err) == 0);
        REQUIRE(read_sample(&b, i, &y, &ny, &ly, err, sizeof err) == 0);
        CHECK(nx == ny && !memcmp(x, y, nx));
        CHECK_EQ(lx, ly);
        char key[256], name[512];
        stk__source_key(&b, NULL, i, key, sizeof key);
        snprintf(name, sizeof name, "class%02d/img%03d.jpg", (int)(i / 7), (int)(i % 7));
        CHECK(!strcmp(key, name));
        free(x);
        free(y);
    }
    CHECK(!strcmp(stk__source_class_name(&b, 2), "class02"));
    stk__source_close(&a);
    stk__source_close(&b);

    /* Through the public API: same batches, same labels, in the same order. */
    uint64_t h[2] = {0, 0};
    const char *paths[2] = {rootc, o.out};
    for (int k = 0; k < 2; k++) {
        stk_options *op;
        stk_loader *l;
        REQUIRE(stk_options_create(&op) == 0);
        stk_options_set_source(op, paths[k]);
        stk_options_set_batch_size(op, 4);
        stk_options_set_shuffle(op, 0);
        stk_options_set_threads(op, 2);
        REQUIRE(stk_loader_open(&l, op) == STK_OK);
        stk_batch *bt;
        while (stk_loader_next(l, &bt) == STK_OK) {
            h[k] = tu_hash(h[k], bt->labels, bt->size * sizeof *bt->labels);
            for (size_t j = 0; j < bt->size; j++)
                h[k] = tu_hash(h[k], (uint8_t *)bt->data + bt->offsets[j], bt->lengths[j]);
            stk_batch_release(bt);
        }
        stk_info info = {.struct_size = sizeof info};
        stk_loader_info(l, &info);
        CHECK(!strcmp(info.source_kind, k ? "stk" : "folder"));
        stk_loader_close(l);
        stk_options_destroy(op);
    }
    CHECK(h[0] == h[1]);

    /* Packing into a directory that already holds a dataset is refused. */
    char e2[1024];
    CHECK(stoker_pack(&o, e2, sizeof e2) == 1);
    CHECK(strstr(e2, "already holds") != NULL);
}

static void test_deterministic_and_aligned(void)
{
    const char *root = make_folder("det/src", 2, 9, true);
    char rootc[512];
    snprintf(rootc, sizeof rootc, "%s", root);
    const char *outs[3] = {"det/t1", "det/t3", "det/t8"};
    unsigned th[3] = {1, 3, 8};
    char paths[3][512];
    for (int k = 0; k < 3; k++) {
        snprintf(paths[k], sizeof paths[k], "%s", tu_path(outs[k]));
        stoker_pack_opts o = pack_opts(rootc, paths[k]);
        o.threads = th[k];
        o.max_side = 256;
        o.shard_size = 20000;
        o.align = 4096;
        REQUIRE(do_pack(&o) == 0);
    }
    for (int s = 0; s < 64; s++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/part-%06d.stk", paths[0], s);
        if (access(a, F_OK) != 0) {
            CHECK(s > 1);
            break;
        }
        for (int k = 1; k < 3; k++) {
            snprintf(b, sizeof b, "%s/part-%06d.stk", paths[k], s);
            CHECK(same_file(a, b));
        }
    }
    char m1[600], m2[600];
    snprintf(m1, sizeof m1, "%s/stoker.manifest", paths[0]);
    snprintf(m2, sizeof m2, "%s/stoker.manifest", paths[2]);
    CHECK(same_file(m1, m2));

    /* Resized: every stored image is a JPEG with max side 256 (or smaller
     * originals kept), original size in the metadata; no payload straddles
     * a 4 KiB page unless longer than one. */
    stk__source s;
    char err[512];
    REQUIRE(open_src(&s, paths[0], err, sizeof err) == 0);
    stk__dataset_info di;
    stk__source_describe(&s, &di);
    CHECK(!strcmp(di.payload, "resized"));
    CHECK_EQ(di.images, 1); /* a resized .stk holds JPEGs: verify checks them all */
    for (uint64_t i = 0; i < s.count; i++) {
        uint8_t *d;
        size_t n;
        int64_t l;
        REQUIRE(read_sample(&s, i, &d, &n, &l, err, sizeof err) == 0);
        uint32_t w, h, ow, oh;
        tu_jpeg_size(d, n, &w, &h);
        CHECK(s.ops->meta && s.ops->meta(&s, i, &ow, &oh) == 0);
        CHECK(w == 256 || h == 256);
        CHECK(w <= 256 && h <= 256);
        CHECK_EQ(ow, 300 + 40 * (i % 9));
        uint32_t mx = ow > oh ? ow : oh;
        CHECK_EQ(w, (ow * 256 + mx / 2) / mx);
        free(d);
    }
    for (int sh = 0; sh < 64; sh++) {
        char a[600];
        snprintf(a, sizeof a, "%s/part-%06d.stk", paths[0], sh);
        size_t n;
        uint8_t *b = tu_read_file(a, &n);
        if (!b)
            break;
        uint64_t io = stk__get64(b + n - 64), cnt = stk__get64(b + n - 56);
        for (uint64_t k = 0; k < cnt; k++) {
            stk__stk_entry e;
            stk__stk_entry_decode(b + io + k * STK_ENTRY_SIZE, &e);
            if (e.length <= 4096)
                CHECK(e.offset / 4096 == (e.offset + e.length - 1) / 4096);
            else
                CHECK(e.offset % 4096 == 0);
        }
        free(b);
    }
    stk__source_close(&s);
}

/* ---- Bad shards ---------------------------------------------------------------- */

static void pack_small(const char *rel, char *out, size_t n)
{
    char src[64];
    snprintf(src, sizeof src, "%s-src", rel);
    const char *root = make_folder(src, 2, 3, false);
    char rootc[512];
    snprintf(rootc, sizeof rootc, "%s", root);
    snprintf(out, n, "%s", tu_path(rel));
    stoker_pack_opts o = pack_opts(rootc, out);
    REQUIRE(do_pack(&o) == 0);
}

static void test_corrupt_payload(void)
{
    char out[512], shard[600];
    pack_small("cp", out, sizeof out);
    snprintf(shard, sizeof shard, "%s/part-000000.stk", out);
    size_t n;
    uint8_t *b = tu_read_file(shard, &n);
    stk__stk_entry e;
    stk__stk_entry_decode(b + stk__get64(b + n - 64) + 4 * STK_ENTRY_SIZE, &e);
    b[e.offset + 3] ^= 0x40; /* sample 4 */
    tu_write_file(shard, b, n);
    free(b);

    stk__source s;
    char err[512];
    REQUIRE(open_src(&s, out, err, sizeof err) == 0);
    uint8_t *d;
    size_t len;
    int64_t l;
    CHECK_EQ(read_sample(&s, 4, &d, &len, &l, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "checksum mismatch") != NULL);
    CHECK_EQ(read_sample(&s, 3, &d, &len, &l, err, sizeof err), STK_OK);
    free(d);
    char name[600];
    s.ops->name(&s, 4, name, sizeof name);
    CHECK(strstr(name, "part-000000.stk#4") != NULL);
    CHECK(strstr(name, "class01/img001.jpg") != NULL);
    stk__source_close(&s);

    /* The loader: raise names the sample; skip leaves it out and lists it. */
    for (int policy = 0; policy < 2; policy++) {
        stk_options *op;
        stk_loader *ld;
        REQUIRE(stk_options_create(&op) == 0);
        stk_options_set_source(op, out);
        stk_options_set_batch_size(op, 6);
        stk_options_set_shuffle(op, 0);
        stk_options_set_on_error(op, policy ? STK_ON_ERROR_SKIP : STK_ON_ERROR_RAISE);
        REQUIRE(stk_loader_open(&ld, op) == STK_OK);
        stk_batch *bt;
        int rc = stk_loader_next(ld, &bt);
        if (!policy) {
            CHECK_EQ(rc, STK_ESAMPLE);
            /* The message names the sample; the error list has the shard,
             * index, key and reason. */
            CHECK(strstr(stk_loader_errmsg(ld), "sample 4") != NULL);
            rc = stk_loader_next(ld, &bt);
        }
        CHECK_EQ(rc, STK_OK);
        if (rc == STK_OK) {
            CHECK_EQ(bt->size, 5);
            stk_batch_release(bt);
        }
        stk_stats st = {.struct_size = sizeof st};
        stk_loader_stats(ld, &st);
        if (policy)
            CHECK_EQ(st.samples_skipped, 1);
        CHECK_EQ(stk_loader_error_count(ld), 1);
        stk_sample_error se;
        CHECK_EQ(stk_loader_error_get(ld, 0, &se), STK_OK);
        CHECK_EQ(se.sample, 4);
        CHECK(se.path && strstr(se.path, "part-000000.stk#4 key 'class01/img001.jpg'"));
        CHECK(se.reason && strstr(se.reason, "checksum mismatch"));
        stk_loader_close(ld);
        stk_options_destroy(op);
    }

    /* verify lists it and fails. */
    char *argv[] = {"stoker", "verify", out, NULL};
    fflush(stdout);
    CHECK_EQ(stoker_cmd_verify(3, argv), 1);
}

static void expect_open_fail(const char *path, int code, const char *what)
{
    stk__source s;
    char err[512] = "";
    int rc = open_src(&s, path, err, sizeof err);
    CHECK_EQ(rc, code);
    if (!strstr(err, what))
        fprintf(stderr, "  message '%s' lacks '%s'\n", err, what);
    CHECK(strstr(err, what) != NULL);
    if (rc == STK_OK)
        stk__source_close(&s);
}

static void test_bad_shards(void)
{
    char out[512], shard[600];
    pack_small("bad", out, sizeof out);
    snprintf(shard, sizeof shard, "%s/part-000000.stk", out);
    size_t n;
    uint8_t *orig = tu_read_file(shard, &n);
    uint8_t *b = malloc(n);

    /* Truncated: the footer is gone. */
    tu_write_file(shard, orig, n - 100);
    expect_open_fail(shard, STK_EFORMAT, "truncated");
    expect_open_fail(out, STK_EFORMAT, "part-000000.stk");
    tu_write_file(shard, orig, 50);
    expect_open_fail(shard, STK_EFORMAT, "truncated");

    /* Wrong magic, wrong version, corrupt header. A file without the magic
     * is not recognised as a shard at all; inside a directory it is. */
    memcpy(b, orig, n);
    b[1] = 'X';
    tu_write_file(shard, b, n);
    expect_open_fail(out, STK_EFORMAT, "wrong magic");
    memcpy(b, orig, n);
    stk__put16(b + 8, 3);
    stk__put64(b + 56, stk__xxh3(b, 56));
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "unsupported .stk version 3");
    /* Version 2 is the fields layout only (docs/format.md). */
    stk__put16(b + 8, 2);
    stk__put64(b + 56, stk__xxh3(b, 56));
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "fields is version 2 only");
    memcpy(b, orig, n);
    b[20] ^= 1;
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "header checksum");

    /* Index checksum mismatch, then an entry pointing outside the file. */
    uint64_t io = stk__get64(orig + n - 64);
    memcpy(b, orig, n);
    b[io + 30] ^= 1;
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "index checksum");
    memcpy(b, orig, n);
    stk__put64(b + io + 2 * STK_ENTRY_SIZE, n + 1000);
    reseal(b, n);
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "outside");
    memcpy(b, orig, n);
    stk__put32(b + io + 2 * STK_ENTRY_SIZE + 8, 0x7fffffff);
    reseal(b, n);
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "entry 2");
    memcpy(b, orig, n);
    stk__put64(b + io + 1 * STK_ENTRY_SIZE + 16, 1u << 30); /* key offset */
    reseal(b, n);
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "key");
    memcpy(b, orig, n);
    stk__put64(b + n - 64 + 8, 1000000); /* footer count */
    stk__put64(b + n - 64 + 48, stk__xxh3(b + n - 64, 48));
    tu_write_file(shard, b, n);
    expect_open_fail(shard, STK_EFORMAT, "footer");

    /* The manifest must agree with the shards. */
    tu_write_file(shard, orig, n);
    expect_open_fail(out, STK_OK, "");
    char man[600];
    snprintf(man, sizeof man, "%s/stoker.manifest", out);
    size_t mn;
    char *m = tu_read_file(man, &mn);
    char *p = strstr(m, "samples 6");
    REQUIRE(p);
    p[8] = '7';
    tu_write_file(man, m, mn);
    expect_open_fail(out, STK_EFORMAT, "manifest says 7");
    /* An interrupted pack: no manifest, the marker present. */
    unlink(man);
    expect_open_fail(out, STK_OK, "");
    char marker[600];
    snprintf(marker, sizeof marker, "%s/%s", out, STK_PACK_MARKER);
    tu_write_file(marker, "", 0);
    expect_open_fail(out, STK_EFORMAT, "interrupted");
    free(m);
    free(b);
    free(orig);
}

static void test_parse_buffer(void)
{
    char out[512], shard[600];
    pack_small("pb", out, sizeof out);
    snprintf(shard, sizeof shard, "%s/part-000000.stk", out);
    size_t n;
    uint8_t *b = tu_read_file(shard, &n);
    uint64_t count, bad;
    char err[256];
    CHECK_EQ(stk__stk_parse_buffer(b, n, &count, &bad, err, sizeof err), STK_OK);
    CHECK_EQ(count, 6);
    CHECK_EQ(bad, 0);
    b[70] ^= 1;
    CHECK_EQ(stk__stk_parse_buffer(b, n, &count, &bad, err, sizeof err), STK_OK);
    CHECK_EQ(bad, 1);
    for (size_t cut = 0; cut < n; cut += 7)
        CHECK_EQ(stk__stk_parse_buffer(b, cut, &count, &bad, err, sizeof err), STK_EFORMAT);
    free(b);
}

/* ---- CIFAR ---------------------------------------------------------------------- */

static void write_cifar(const char *path, int records, int label_bytes)
{
    size_t rec = 3072 + (size_t)label_bytes;
    uint8_t *b = malloc(rec * (size_t)records);
    for (int r = 0; r < records; r++) {
        uint8_t *p = b + rec * (size_t)r;
        p[0] = (uint8_t)(r % (label_bytes == 1 ? 10 : 20));
        if (label_bytes == 2)
            p[1] = (uint8_t)(r % 100);
        for (int k = 0; k < 3072; k++)
            p[label_bytes + k] = (uint8_t)(k * 7 + r);
    }
    tu_write_file(path, b, rec * (size_t)records);
    free(b);
}

static void test_cifar(void)
{
    char dir[512], f[600];
    snprintf(dir, sizeof dir, "%s", tu_path("cifar10"));
    tu_mkdirs(dir);
    for (int k = 1; k <= 2; k++) {
        snprintf(f, sizeof f, "%s/data_batch_%d.bin", dir, k);
        write_cifar(f, 5 + k, 1);
    }
    snprintf(f, sizeof f, "%s/test_batch.bin", dir);
    write_cifar(f, 4, 1);
    snprintf(f, sizeof f, "%s/batches.meta.txt", dir);
    tu_write_file(f, "airplane\n", 9);

    stk__source s;
    char err[512];
    REQUIRE(open_src(&s, dir, err, sizeof err) == 0);
    CHECK(!strcmp(s.ops->kind, "cifar"));
    CHECK_EQ(s.count, 13); /* the training batches only */
    CHECK_EQ(s.fixed_len, 3072);
    CHECK_EQ(s.num_classes, 10);
    uint8_t *d;
    size_t n;
    int64_t l;
    REQUIRE(read_sample(&s, 8, &d, &n, &l, err, sizeof err) == 0); /* batch 2, record 2 */
    CHECK_EQ(n, 3072);
    CHECK_EQ(l, 2);
    CHECK_EQ(d[5], (uint8_t)(5 * 7 + 2));
    free(d);
    char key[128];
    stk__source_key(&s, NULL, 8, key, sizeof key);
    CHECK(!strcmp(key, "data_batch_2.bin#2"));
    stk__source_close(&s);

    snprintf(f, sizeof f, "%s/test_batch.bin", dir);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    CHECK_EQ(s.count, 4);
    stk__source_close(&s);

    /* Pack to raw HWC and read back through the loader as dense batches. */
    stoker_pack_opts o = pack_opts(dir, tu_path("cifar10-stk"));
    REQUIRE(do_pack(&o) == 0);
    REQUIRE(open_src(&s, o.out, err, sizeof err) == 0);
    CHECK_EQ(s.fixed_len, 3072);
    REQUIRE(read_sample(&s, 8, &d, &n, &l, err, sizeof err) == 0);
    CHECK_EQ(l, 2);
    /* HWC pixel (y=1, x=3) channel 2 = CHW byte 2*1024 + 1*32 + 3. */
    int k = 2 * 1024 + 32 + 3;
    CHECK_EQ(d[(1 * 32 + 3) * 3 + 2], (uint8_t)(k * 7 + 2));
    free(d);
    stk__source_close(&s);
    stk_options *op;
    stk_loader *ld;
    REQUIRE(stk_options_create(&op) == 0);
    stk_options_set_source(op, o.out);
    stk_options_set_batch_size(op, 4);
    REQUIRE(stk_loader_open(&ld, op) == STK_OK);
    stk_batch *bt;
    REQUIRE(stk_loader_next(ld, &bt) == STK_OK);
    CHECK_EQ(bt->kind, STK_BATCH_DENSE);
    CHECK_EQ(bt->sample_bytes, 3072);
    stk_batch_release(bt);
    stk_loader_close(ld);
    stk_options_destroy(op);

    /* Raw at another size (downscaled, grey). */
    stoker_pack_opts o2 = pack_opts(dir, tu_path("cifar10-16"));
    o2.raw_h = 16;
    o2.raw_w = 16;
    o2.raw_c = 1;
    REQUIRE(do_pack(&o2) == 0);
    REQUIRE(open_src(&s, o2.out, err, sizeof err) == 0);
    CHECK_EQ(s.fixed_len, 256);
    stk__source_close(&s);

    /* CIFAR-100 and a truncated batch. */
    snprintf(dir, sizeof dir, "%s", tu_path("cifar100"));
    tu_mkdirs(dir);
    snprintf(f, sizeof f, "%s/train.bin", dir);
    write_cifar(f, 30, 2);
    REQUIRE(open_src(&s, dir, err, sizeof err) == 0);
    CHECK_EQ(s.num_classes, 100);
    REQUIRE(read_sample(&s, 29, &d, &n, &l, err, sizeof err) == 0);
    CHECK_EQ(l, 29);
    free(d);
    stk__source_close(&s);
    snprintf(f, sizeof f, "%s/data_batch_1.bin", tu_path("cifar10"));
    size_t fn;
    uint8_t *fb = tu_read_file(f, &fn);
    tu_write_file(f, fb, fn - 10);
    free(fb);
    expect_open_fail(tu_path("cifar10"), STK_EFORMAT, "not a whole number");
}

/* ---- Tar -------------------------------------------------------------------------- */

typedef struct tbuf {
    uint8_t *p;
    size_t n;
} tbuf;

static void tar_add(tbuf *t, const char *name, const void *data, size_t len)
{
    tu_tar_add(&t->p, &t->n, name, data, len);
}

static void tar_end(tbuf *t)
{
    t->p = realloc(t->p, t->n + 1024);
    memset(t->p + t->n, 0, 1024);
    t->n += 1024;
}

static void make_tar(const char *path, int first, int count, int unlabeled_at, bool json)
{
    tbuf t = {0};
    for (int k = first; k < first + count; k++) {
        char name[64], lab[64], img[64];
        snprintf(name, sizeof name, "s%05d.jpg", k);
        snprintf(img, sizeof img, "image-%d-bytes", k);
        tar_add(&t, name, img, strlen(img));
        if (k == unlabeled_at)
            continue;
        if (json) {
            snprintf(name, sizeof name, "s%05d.json", k);
            snprintf(lab, sizeof lab, "{\"w\": 3.5, \"label\" : %d}", k % 7);
        } else {
            snprintf(name, sizeof name, "s%05d.cls", k);
            snprintf(lab, sizeof lab, "%d\n", k % 7);
        }
        tar_add(&t, name, lab, strlen(lab));
    }
    tar_end(&t);
    tu_write_file(path, t.p, t.n);
    free(t.p);
}

static void test_tar(void)
{
    char dir[512], f[600], idx[640];
    snprintf(dir, sizeof dir, "%s", tu_path("wds"));
    tu_mkdirs(dir);
    for (int s = 0; s < 3; s++) {
        snprintf(f, sizeof f, "%s/train-%06d.tar", dir, s);
        make_tar(f, s * 10, 10, -1, s == 1);
    }
    stk__source s;
    char err[512];
    REQUIRE(open_src(&s, dir, err, sizeof err) == 0);
    CHECK(!strcmp(s.ops->kind, "tar"));
    CHECK_EQ(s.count, 30);
    CHECK_EQ(s.num_classes, 7);
    for (uint64_t i = 0; i < 30; i += 7) {
        uint8_t *d;
        size_t n;
        int64_t l;
        REQUIRE(read_sample(&s, i, &d, &n, &l, err, sizeof err) == 0);
        char want[64];
        snprintf(want, sizeof want, "image-%d-bytes", (int)i);
        CHECK(n == strlen(want) && !memcmp(d, want, n));
        CHECK_EQ(l, (int64_t)(i % 7));
        free(d);
    }
    char key[64];
    stk__source_key(&s, NULL, 13, key, sizeof key);
    CHECK(!strcmp(key, "s00013"));
    stk__source_close(&s);
    snprintf(idx, sizeof idx, "%s/train-000000.tar.stkidx", dir);
    CHECK(access(idx, F_OK) == 0);

    /* The cache is used (a planted index wins while size and mtime match),
     * and rebuilt when the tar changes. */
    snprintf(f, sizeof f, "%s/train-000000.tar", dir);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    CHECK_EQ(s.count, 10);
    stk__source_close(&s);
    make_tar(f, 0, 12, -1, false);
    struct timeval tv[2] = {{1000000000, 0}, {1000000000, 0}};
    utimes(f, tv);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    CHECK_EQ(s.count, 12);
    stk__source_close(&s);
    /* Replaced by another tar of the same size with the mtime restored (as
     * cp -p or tar x do): the stale cache must not be used (found by
     * review: it delivered cut samples and header bytes). */
    make_tar(f, 100, 12, -1, false);
    utimes(f, tv);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    {
        uint8_t *d;
        size_t n;
        int64_t l;
        REQUIRE(read_sample(&s, 0, &d, &n, &l, err, sizeof err) == 0);
        CHECK(n == strlen("image-100-bytes") && !memcmp(d, "image-100-bytes", n));
        free(d);
    }
    stk__source_close(&s);
    size_t cn;
    uint8_t *cb = tu_read_file(idx, &cn);
    REQUIRE(cb && cn > 64);
    cb[cn - 1] ^= 1; /* corrupt cache: silently rebuilt */
    tu_write_file(idx, cb, cn);
    free(cb);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    CHECK_EQ(s.count, 12);
    stk__source_close(&s);

    /* Brace pattern and a single file. */
    char pat[600];
    snprintf(pat, sizeof pat, "%s/train-{000001..000002}.tar", dir);
    REQUIRE(open_src(&s, pat, err, sizeof err) == 0);
    CHECK_EQ(s.count, 20);
    stk__source_close(&s);
    snprintf(pat, sizeof pat, "%s/train-{000001..000003}.tar", dir);
    expect_open_fail(pat, STK_ENOENT, "train-000003.tar");

    /* Pack the tars; the .stk dataset has the same samples. */
    stoker_pack_opts o = pack_opts(dir, tu_path("wds-stk"));
    REQUIRE(do_pack(&o) == 0);
    REQUIRE(open_src(&s, o.out, err, sizeof err) == 0);
    CHECK_EQ(s.count, 32);
    stk__source_key(&s, NULL, 31, key, sizeof key);
    CHECK(!strcmp(key, "s00029"));
    stk__source_close(&s);

    /* A directory that mixes .tar and .stk shards. */
    char mixed[600];
    snprintf(mixed, sizeof mixed, "%s/part-000000.stk", o.out);
    snprintf(f, sizeof f, "%s/x.stk", dir);
    size_t sn;
    uint8_t *sb = tu_read_file(mixed, &sn);
    tu_write_file(f, sb, sn);
    free(sb);
    expect_open_fail(dir, STK_EINVAL, "mixes");
    unlink(f);

    /* Missing label: that sample fails, naming the reason; others read. */
    snprintf(dir, sizeof dir, "%s", tu_path("wds-bad"));
    tu_mkdirs(dir);
    snprintf(f, sizeof f, "%s/a.tar", dir);
    make_tar(f, 0, 6, 3, false);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    uint8_t *d;
    size_t n;
    int64_t l;
    CHECK_EQ(read_sample(&s, 3, &d, &n, &l, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "no label") != NULL);
    char name[600];
    s.ops->name(&s, 3, name, sizeof name);
    CHECK(strstr(name, "a.tar#3") && strstr(name, "s00003"));
    REQUIRE(read_sample(&s, 4, &d, &n, &l, err, sizeof err) == 0);
    free(d);
    stk__source_close(&s);

    /* Unlabeled dataset: labels -1, no errors. */
    tbuf t = {0};
    tar_add(&t, "dir/k1.jpg", "A", 1);
    tar_add(&t, "dir/k1.txt", "caption", 7);
    tar_add(&t, "dir/k2.png", "BB", 2);
    tar_end(&t);
    snprintf(f, sizeof f, "%s/u.tar", dir);
    tu_write_file(f, t.p, t.n);
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    CHECK_EQ(s.count, 2);
    REQUIRE(read_sample(&s, 1, &d, &n, &l, err, sizeof err) == 0);
    CHECK(n == 2 && l == -1);
    free(d);
    stk__source_close(&s);

    /* Truncated tail: the samples before the cut read, the cut one fails. */
    snprintf(f, sizeof f, "%s/t.tar", dir);
    make_tar(f, 0, 5, -1, false);
    size_t tn;
    uint8_t *tb = tu_read_file(f, &tn);
    tu_write_file(f, tb, 4 * 2048 + 512 + 5); /* into sample 4's data */
    REQUIRE(open_src(&s, f, err, sizeof err) == 0);
    CHECK_EQ(s.count, 5);
    CHECK_EQ(read_sample(&s, 4, &d, &n, &l, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "truncated") != NULL);
    REQUIRE(read_sample(&s, 3, &d, &n, &l, err, sizeof err) == 0);
    free(d);
    stk__source_close(&s);
    /* Cut inside the next member's header: every sample before it is whole,
     * and the cut one is still reported (by its name when the header kept
     * it, else by its offset), never dropped silently. */
    for (int keep_name = 1; keep_name >= 0; keep_name--) {
        tu_write_file(f, tb, 4 * 2048 + (keep_name ? 100 : 3));
        REQUIRE(open_src(&s, f, err, sizeof err) == 0);
        CHECK_EQ(s.count, 5);
        for (uint64_t k = 0; k < 4; k++) {
            CHECK_EQ(read_sample(&s, k, &d, &n, &l, err, sizeof err), 0);
            free(d);
        }
        CHECK_EQ(read_sample(&s, 4, &d, &n, &l, err, sizeof err), STK_EFORMAT);
        CHECK(strstr(err, "truncated") != NULL);
        stk__source_close(&s);
    }
    /* A non-file member whose size runs past the end (a cut or lying tar):
     * reported as a failed sample, not a silent end of the shard. */
    {
        tbuf t2 = {0};
        tar_add(&t2, "a.jpg", "A", 1);
        tar_add(&t2, "a.cls", "1", 1);
        tar_add(&t2, "dir", "0123456789", 10);
        uint8_t *h = t2.p + t2.n - 1024; /* the "dir" header */
        h[156] = '5';
        snprintf((char *)h + 124, 12, "%011o", 0777777u);
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (int k = 0; k < 512; k++)
            sum += h[k];
        snprintf((char *)h + 148, 8, "%06o", sum);
        tu_write_file(f, t2.p, t2.n);
        free(t2.p);
        REQUIRE(open_src(&s, f, err, sizeof err) == 0);
        CHECK_EQ(s.count, 2);
        CHECK_EQ(read_sample(&s, 0, &d, &n, &l, err, sizeof err), 0);
        free(d);
        CHECK_EQ(read_sample(&s, 1, &d, &n, &l, err, sizeof err), STK_EFORMAT);
        CHECK(strstr(err, "truncated") != NULL);
        stk__source_close(&s);
    }
    /* A corrupt header fails the open with the shard and the offset. */
    tb[512 * 2 + 10] ^= 0x20;
    tu_write_file(f, tb, tn);
    expect_open_fail(f, STK_EFORMAT, "corrupt tar header at offset 1024");
    free(tb);
    free(t.p);
}

static void test_naming(void)
{
    char out[512];
    pack_small("nm", out, sizeof out);
    char p[700];
    snprintf(p, sizeof p, "%s/part-{000000..000000}.stk", out);
    stk__source s;
    char err[512];
    REQUIRE(open_src(&s, p, err, sizeof err) == 0);
    CHECK_EQ(s.count, 6);
    stk__source_close(&s);
    snprintf(p, sizeof p, "%s/part-000000.stk", out);
    REQUIRE(open_src(&s, p, err, sizeof err) == 0);
    stk__source_close(&s);
    snprintf(p, sizeof p, "%s/stoker.manifest", out);
    expect_open_fail(p, STK_EINVAL, "record size");
    snprintf(p, sizeof p, "%s/part-{9..1}.stk", out);
    expect_open_fail(p, STK_EINVAL, "brace");
    /* Class subfolders next to shards: mixed. */
    snprintf(p, sizeof p, "%s/sub", out);
    tu_mkdirs(p);
    expect_open_fail(out, STK_EINVAL, "class subfolders");
}

static void test_info_cmd(void)
{
    char out[512];
    pack_small("inf", out, sizeof out);
    char *argv[] = {"stoker", "info", out, NULL};
    fflush(stdout);
    CHECK_EQ(stoker_cmd_info(3, argv), 0);
    char *argv2[] = {"stoker", "verify", out, NULL};
    CHECK_EQ(stoker_cmd_verify(3, argv2), 0);
    char *argv3[] = {"stoker", "info", "/nonexistent/x", NULL};
    CHECK_EQ(stoker_cmd_info(3, argv3), 1);
}

/* ---- Issue 13: pack's paths and inputs, verify's counts and manifest ------- */

/* Runs fn(argc, argv) with stdout captured. Returns its status; *out gets
 * what it printed (caller frees). */
static int capture(int (*fn)(int, char **), int argc, char **argv, char **out)
{
    const char *path = tu_path("captured.txt");
    fflush(stdout);
    int saved = dup(1);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    dup2(fd, 1);
    close(fd);
    int rc = fn(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    size_t n;
    char *t = tu_read_file(path, &n);
    *out = realloc(t, n + 1);
    (*out)[n] = '\0';
    return rc;
}

static bool dir_is_empty_or_gone(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return true;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n == 0;
}

/* OUT equal to SRC, inside it (given through a symbolic link, "..", or not
 * existing yet), and SRC inside OUT: each refused before anything is
 * written, so the source still opens. */
static void test_pack_refuses_overlap(void)
{
    char src[512], p[700], err[1024];
    snprintf(src, sizeof src, "%s", make_folder("ov/src", 2, 2, true));
    snprintf(p, sizeof p, "%s/ov/link", tu_tmpdir());
    REQUIRE(symlink("src", p) == 0);
    static const struct {
        const char *out; /* relative to the temporary directory */
        const char *why;
    } cases[] = {
        {"ov/src", "is the source dataset itself"},
        {"ov/src/", "is the source dataset itself"},
        {"ov/link", "is the source dataset itself"},
        {"ov/src/packed", "is inside the source dataset"},
        {"ov/link/class00/../packed", "is inside the source dataset"},
        {"ov/src/class01", "is inside the source dataset"},
        {"ov", "is inside OUT"},
        {".", "is inside OUT"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char out[700];
        snprintf(out, sizeof out, "%s/%s", tu_tmpdir(), cases[k].out);
        stoker_pack_opts o = pack_opts(src, out);
        err[0] = '\0';
        CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
        if (!strstr(err, cases[k].why))
            fprintf(stderr, "  OUT %s: '%s' lacks '%s'\n", cases[k].out, err, cases[k].why);
        CHECK(strstr(err, cases[k].why) != NULL);
    }
    /* SRC given through the link, OUT inside the real directory. */
    snprintf(p, sizeof p, "%s/ov/link", tu_tmpdir());
    char out[700];
    snprintf(out, sizeof out, "%s/ov/src/packed2", tu_tmpdir());
    stoker_pack_opts o = pack_opts(p, out);
    CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
    CHECK(strstr(err, "is inside the source dataset") != NULL);
    /* Nothing was written, and the source still opens as it did. */
    snprintf(p, sizeof p, "%s/%s", src, STK_MANIFEST);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/part-000000.stk", src);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/packed", src);
    CHECK(access(p, F_OK) != 0);
    stk__source s;
    REQUIRE(open_src(&s, src, err, sizeof err) == STK_OK);
    CHECK_EQ(s.count, 4);
    stk__source_close(&s);
    /* A sibling OUT is fine. */
    snprintf(out, sizeof out, "%s/ov/src-packed", tu_tmpdir());
    o = pack_opts(src, out);
    CHECK_EQ(do_pack(&o), 0);
}

/* Packing into the output of a pack that was killed says so, and what to do;
 * a complete dataset there is "already" one. */
static void test_pack_into_interrupted(void)
{
    char src[512], out[512], p[700], err[1024];
    snprintf(src, sizeof src, "%s", make_folder("ip/src", 2, 2, true));
    snprintf(out, sizeof out, "%s", tu_path("ip/out"));
    tu_mkdirs(out);
    snprintf(p, sizeof p, "%s/%s", out, STK_PACK_MARKER);
    tu_write_file(p, "", 0);
    snprintf(p, sizeof p, "%s/part-000000.stk", out);
    tu_write_file(p, "partial", 7);
    stoker_pack_opts o = pack_opts(src, out);
    CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
    CHECK(strstr(err, "interrupted pack") != NULL);
    CHECK(strstr(err, "remove the directory and run stoker pack again") != NULL);
    CHECK(strstr(err, "already holds") == NULL);
    /* A shard still being written (*.stk.tmp) shows an unfinished pack too,
     * as the reader sees it. */
    snprintf(p, sizeof p, "%s/%s", out, STK_PACK_MARKER);
    unlink(p);
    snprintf(p, sizeof p, "%s/part-000000.stk", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/part-000000.stk.tmp", out);
    tu_write_file(p, "partial", 7);
    CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
    CHECK(strstr(err, "interrupted pack") != NULL);
    /* Removed as told, the pack runs. */
    unlink(p);
    CHECK_EQ(do_pack(&o), 0);
}

/* Files named .jpg that are not images: verify reports each and fails,
 * pack refuses them unless --skip-bad (then skips and lists them); a
 * re-pack of the .stk checks its payloads by their keys too. */
static void test_not_images(void)
{
    char src[512], out[512], p[700], err[1024], *text;
    snprintf(src, sizeof src, "%s", make_folder("ni/src", 2, 3, true));
    snprintf(p, sizeof p, "%s/class01/notes.jpg", src);
    tu_write_file(p, "just some text\n", 15);
    snprintf(p, sizeof p, "%s/class00/cut.jpg", src);
    tu_write_file(p, "\xff\xd8\xff\xe0\x00\x10JFIF", 10); /* a JPEG cut in its header */
    snprintf(p, sizeof p, "%s/class01/icon.bmp", src);
    tu_write_file(p, "BM\x3a\0\0\0\0\0\0\0\x36\0\0\0", 14); /* an image, not decoded */

    char *argv[] = {"stoker", "verify", src, NULL};
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
    CHECK(strstr(text, "class01/notes.jpg: not an image: unknown signature 6a 75 73 74") != NULL);
    CHECK(strstr(text, "class00/cut.jpg: JPEG") != NULL);
    CHECK(strstr(text, "9 samples checked, 2 corrupt") != NULL);
    CHECK(strstr(text, "note      1 image is not JPEG or PNG (the first: BMP)") != NULL);
    CHECK(strstr(text, "icon.bmp") == NULL);
    free(text);

    snprintf(out, sizeof out, "%s", tu_path("ni/out"));
    stoker_pack_opts o = pack_opts(src, out);
    CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
    CHECK(strstr(err, "cut.jpg") != NULL);
    CHECK(dir_is_empty_or_gone(out));
    o.skip_bad = 1;
    CHECK_EQ(do_pack(&o), 0);
    stk__source s;
    REQUIRE(open_src(&s, out, err, sizeof err) == STK_OK);
    CHECK_EQ(s.count, 7);
    stk__source_close(&s);
    char *argv2[] = {"stoker", "verify", out, NULL};
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv2, &text), 0);
    free(text);

    /* An encoded .stk whose payload under a .jpg key is not an image (as an
     * older pack stored it): verify and re-pack catch it by the key. */
    char shard[700];
    snprintf(shard, sizeof shard, "%s/part-000000.stk", out);
    size_t n;
    uint8_t *b = tu_read_file(shard, &n);
    stk__stk_entry e;
    stk__stk_entry_decode(b + stk__get64(b + n - 64) + 2 * STK_ENTRY_SIZE, &e);
    memcpy(b + e.offset, "text", 4);
    uint64_t sum = stk__xxh3(b + e.offset, e.length);
    stk__put64(b + stk__get64(b + n - 64) + 2 * STK_ENTRY_SIZE + 32, sum);
    reseal(b, n);
    tu_write_file(shard, b, n);
    free(b);
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv2, &text), 1);
    CHECK(strstr(text, "#2 key 'class00/img002.jpg': not an image") != NULL);
    free(text);
    stoker_pack_opts o2 = pack_opts(out, tu_path("ni/out2"));
    CHECK_EQ(stoker_pack(&o2, err, sizeof err), 1);
    CHECK(strstr(err, "class00/img002.jpg") && strstr(err, "not an image"));
}

/* One shard that does not open: verify checks the others and counts the
 * samples it could not check (by the manifest, else the shard's footer). */
static void test_verify_counts_unreadable(void)
{
    char src[512], out[512], p[700], *text;
    snprintf(src, sizeof src, "%s", make_folder("vu/src", 2, 10, false));
    snprintf(out, sizeof out, "%s", tu_path("vu/out"));
    stoker_pack_opts o = pack_opts(src, out);
    o.shard_size = 9000;
    REQUIRE(do_pack(&o) == 0);
    stk__manifest m;
    char err[512];
    REQUIRE(stk__manifest_read(out, &m, err, sizeof err) == STK_OK);
    REQUIRE(m.nshards >= 3);
    uint64_t lost = m.shards[1].count;
    stk__manifest_free(&m);
    snprintf(p, sizeof p, "%s/part-000001.stk", out);
    size_t n;
    uint8_t *b = tu_read_file(p, &n);
    b[20] ^= 1; /* header checksum */
    tu_write_file(p, b, n);
    char want[160];
    snprintf(want, sizeof want,
             "verify    %llu samples checked, 0 corrupt, %llu unreadable in 1 shard; the "
             "dataset does not open as a whole",
             (unsigned long long)(20 - lost), (unsigned long long)lost);
    char *argv[] = {"stoker", "verify", out, NULL};
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
    if (!strstr(text, want))
        fprintf(stderr, "  verify said:\n%s  want: %s\n", text, want);
    CHECK(strstr(text, want) != NULL);
    CHECK(strstr(text, "part-000001.stk: the whole shard") != NULL);
    free(text);
    /* Without the manifest the footer still gives the count. */
    char man[700];
    snprintf(man, sizeof man, "%s/%s", out, STK_MANIFEST);
    size_t mn;
    char *mt = tu_read_file(man, &mn);
    unlink(man);
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
    CHECK(strstr(text, want) != NULL);
    free(text);
    /* With neither, the shard is counted as one whose samples are unknown. */
    tu_write_file(p, b, 100);
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
    CHECK(strstr(text, "0 unreadable in 1 shard (1 of them too damaged to count") != NULL);
    free(text);
    tu_write_file(man, mt, mn);
    free(mt);
    free(b);
}

/* The manifest's byte counts, kind and classes are checked against the
 * shards, and a shard listed twice is an error for verify and for the
 * reader (which would otherwise deliver its samples twice). */
static void test_verify_manifest(void)
{
    char out[512], man[700], *text, err[512];
    pack_small("vm", out, sizeof out);
    snprintf(man, sizeof man, "%s/%s", out, STK_MANIFEST);
    size_t mn;
    char *orig = tu_read_file(man, &mn);
    orig = realloc(orig, mn + 1);
    orig[mn] = '\0';
    char *argv[] = {"stoker", "verify", out, NULL};
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 0);
    free(text);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/part-000000.stk", out);
    struct stat st;
    REQUIRE(stat(shard, &st) == 0);
    static const struct {
        const char *from, *to, *says;
    } cases[] = {
        {"kind encoded", "kind raw", "payload kind encoded, the manifest says raw"},
        {"classes 2", "classes 1", "written for 2 classes, the manifest says 1"},
        {"classes 2", "classes 5", "written for 2 classes, the manifest says 5"},
        {" 6 ", " 6 1", "bytes, the manifest says 1"}, /* the shard line's byte count */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char edited[4096];
        const char *at = strstr(orig, cases[k].from);
        REQUIRE(at && mn < sizeof edited - 8);
        size_t pre = (size_t)(at - orig);
        snprintf(edited, sizeof edited, "%.*s%s%s", (int)pre, orig, cases[k].to,
                 at + strlen(cases[k].from));
        tu_write_file(man, edited, strlen(edited));
        CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
        if (!strstr(text, cases[k].says))
            fprintf(stderr, "  case %zu: verify said:\n%s", k, text);
        CHECK(strstr(text, cases[k].says) != NULL);
        CHECK(strstr(text, "1 manifest problem") != NULL || strstr(text, "2 manifest problems"));
        free(text);
    }
    /* Fewer classes than the labels need. */
    {
        char edited[4096];
        const char *at = strstr(orig, "classes 2");
        snprintf(edited, sizeof edited, "%.*sclasses 1%s", (int)(at - orig), orig, at + 9);
        tu_write_file(man, edited, strlen(edited));
        CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
        CHECK(strstr(text, "labels go up to 1, the manifest says 1 classes") != NULL);
        free(text);
    }
    /* The shard listed twice, with the totals made to agree. */
    char edited[4096];
    const char *sl = strstr(orig, "shard part-000000.stk");
    REQUIRE(sl);
    const char *eol = strchr(sl, '\n');
    REQUIRE(eol);
    const char *smp = strstr(orig, "samples 6");
    REQUIRE(smp && smp < sl);
    snprintf(edited, sizeof edited, "%.*ssamples 12%.*s\n%.*s%s", (int)(smp - orig), orig,
             (int)(eol - (smp + 9)), smp + 9, (int)(eol - sl), sl, eol);
    tu_write_file(man, edited, strlen(edited));
    CHECK_EQ(capture(stoker_cmd_verify, 3, argv, &text), 1);
    CHECK(strstr(text, "shard part-000000.stk is listed twice (entries 0 and 1)") != NULL);
    CHECK(strstr(text, "6 samples checked") != NULL); /* each shard once */
    free(text);
    expect_open_fail(out, STK_EFORMAT, "listed twice");
    stk_options *op;
    stk_loader *ld = NULL;
    REQUIRE(stk_options_create(&op) == 0);
    stk_options_set_source(op, out);
    CHECK_EQ(stk_loader_open(&ld, op), STK_EFORMAT);
    CHECK(ld && strstr(stk_loader_errmsg(ld), "listed twice"));
    stk_loader_close(ld);
    stk_options_destroy(op);
    /* The same file through a second name (a hard link) is the same shard. */
    tu_write_file(man, orig, mn);
    char alias[700];
    snprintf(alias, sizeof alias, "%s/part-000000-again.stk", out);
    REQUIRE(link(shard, alias) == 0);
    const char *both[2] = {shard, alias};
    stk__source s;
    CHECK_EQ(stk__source_stk_open(&s, both, 2, NULL, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "listed twice") != NULL);
    unlink(alias);
    free(orig);
}

int main(void)
{
    tu_begin("test_shards", 300);
    RUN(test_pack_roundtrip);
    RUN(test_deterministic_and_aligned);
    RUN(test_corrupt_payload);
    RUN(test_bad_shards);
    RUN(test_parse_buffer);
    RUN(test_cifar);
    RUN(test_tar);
    RUN(test_naming);
    RUN(test_info_cmd);
    RUN(test_pack_refuses_overlap);
    RUN(test_pack_into_interrupted);
    RUN(test_not_images);
    RUN(test_verify_counts_unreadable);
    RUN(test_verify_manifest);
    return tu_end();
}
