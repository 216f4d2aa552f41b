/* test_cli.c -- the `stoker` command line, run as a child process: bench's
 * checksum equals one computed here from the dataset (order, labels, bytes),
 * exit status 0 / 1 (loader error, message names the path) / 2 (usage), and
 * the error policies. The binary is $STOKER_BIN, else ../stoker next to this
 * test's directory (build/MODE/stoker); skipped with a message if missing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "options.h"
#include "order.h"
#include "testutil.h"

#include <fcntl.h>
#include <jpeglib.h>
#include <math.h>
#include <stdio.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

extern char **environ;

static char g_bin[1024];

typedef struct result {
    int status; /* exit code, or -1 if it did not exit normally */
    char *out, *err;
} result;

/* Runs bin with args (NULL-terminated), stdin from in_path (NULL: inherit),
 * capturing stdout and stderr. */
static result run_prog(const char *bin, const char *const *args, const char *in_path)
{
    result r = {-1, NULL, NULL};
    const char *outp = tu_path("cli.out"), *errp = tu_path("cli.err");
    char *argv[40];
    int n = 0;
    argv[n++] = (char *)(uintptr_t)bin;
    for (; args[n - 1] && n < 39; n++)
        argv[n] = (char *)(uintptr_t)args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (in_path)
        posix_spawn_file_actions_addopen(&fa, 0, in_path, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    size_t len;
    r.out = tu_read_file(outp, &len);
    r.out = realloc(r.out, len + 1);
    r.out[len] = 0;
    r.err = tu_read_file(errp, &len);
    r.err = realloc(r.err, len + 1);
    r.err[len] = 0;
    return r;
}

/* Runs the CLI with args (NULL-terminated), capturing stdout and stderr. */
static result run_cli(const char *const *args)
{
    return run_prog(g_bin, args, NULL);
}

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

static unsigned long long json_checksum(const char *out)
{
    const char *p = strstr(out, "\"checksum\":\"");
    if (!p)
        return 0;
    return strtoull(p + 12, NULL, 16);
}

static long long json_int(const char *out, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(out, k);
    return p ? strtoll(p + strlen(k), NULL, 10) : -1;
}

#define REC 24 /* 1 label byte + 23 payload bytes */
#define N   50

static const char *records_file(void)
{
    static char p[1024]; /* tu_path's buffers rotate */
    snprintf(p, sizeof p, "%s", tu_path("rec.bin"));
    static uint8_t buf[N * REC];
    for (uint64_t i = 0; i < N; i++) {
        buf[i * REC] = (uint8_t)(i % 7);
        for (int j = 1; j < REC; j++)
            buf[i * REC + (uint64_t)j] = (uint8_t)(i * 5 + (uint64_t)j);
    }
    tu_write_file(p, buf, sizeof buf);
    return p;
}

/* The checksum bench must print: per batch, the labels (int64 LE) and then
 * the dense data, in the seeded order. */
static uint64_t expected_records_checksum(uint64_t seed, int shuffle, size_t bs, int epochs)
{
    const uint8_t *file;
    size_t len;
    file = tu_read_file(tu_path("rec.bin"), &len);
    REQUIRE(file && len == N * REC);
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    for (int e = 0; e < epochs; e++) {
        stk__order o;
        stk__order_init(&o, N, seed, (uint64_t)e, shuffle != 0);
        for (uint64_t start = 0; start < N; start += bs) {
            uint64_t end = start + bs < N ? start + bs : N;
            for (uint64_t k = start; k < end; k++) {
                int64_t lab = file[stk__order_at(&o, k) * REC];
                XXH3_64bits_update(h, &lab, sizeof lab);
            }
            for (uint64_t k = start; k < end; k++)
                XXH3_64bits_update(h, file + stk__order_at(&o, k) * REC + 1, REC - 1);
        }
    }
    uint64_t d = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    free((void *)(uintptr_t)file);
    return d;
}

static void test_bench_records_checksum(void)
{
    const char *path = records_file();
    static const struct {
        const char *seed;
        int shuffle;
        const char *bs;
        const char *threads;
        const char *epochs;
    } cases[] = {{"0", 0, "7", "1", "1"}, {"3", 1, "7", "4", "2"}, {"12345", 1, "50", "2", "3"}};
    for (int c = 0; c < 3; c++) {
        const char *args[] = {"bench",
                              path,
                              "--record-size",
                              "24",
                              "--label-bytes",
                              "1",
                              "--batch-size",
                              cases[c].bs,
                              "--threads",
                              cases[c].threads,
                              "--seed",
                              cases[c].seed,
                              "--epochs",
                              cases[c].epochs,
                              "--json",
                              cases[c].shuffle ? NULL : "--no-shuffle",
                              NULL};
        result r = run_cli(args);
        CHECK_EQ(r.status, 0);
        if (r.status)
            fprintf(stderr, "    stderr: %s\n", r.err);
        uint64_t want =
            expected_records_checksum(strtoull(cases[c].seed, NULL, 10), cases[c].shuffle,
                                      strtoull(cases[c].bs, NULL, 10), atoi(cases[c].epochs));
        CHECK(json_checksum(r.out) == want);
        CHECK_EQ(json_int(r.out, "samples"), N * atoi(cases[c].epochs));
        CHECK(strstr(r.out, "\"ok\":true") != NULL);
        CHECK(strstr(r.out, "\"source\":\"records\"") != NULL);
        CHECK(json_int(r.out, "memory_bound_bytes") > 0);
        /* The report keys the issue names, and per-thread stage counters. */
        const char *keys[] = {"\"batches\":",
                              "\"seconds\":",
                              "\"samples_per_s\":",
                              "\"peak_rss_bytes\":",
                              "\"starvation_s\":",
                              "\"stages\":{\"read\":",
                              "\"per_thread\":[{\"read\":",
                              "\"transform\":\"none\""};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            CHECK(strstr(r.out, keys[k]) != NULL);
        result_free(&r);
    }
}

static const char *folder(void)
{
    static char root[900];
    snprintf(root, sizeof root, "%s", tu_path("tree"));
    char p[1024];
    for (int k = 0; k < 9; k++) {
        snprintf(p, sizeof p, "%s/c%d", root, k % 3);
        tu_mkdirs(p);
        snprintf(p, sizeof p, "%s/c%d/%d.jpg", root, k % 3, k);
        char content[64];
        int n = snprintf(content, sizeof content, "sample %d %.*s", k, k * 3,
                         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
        tu_write_file(p, content, (size_t)n);
    }
    return root;
}

/* Variable batches: labels, then each sample's length (uint64 LE) and bytes.
 * Natural order is class-major; within c<j>, files j, j+3, j+6. */
static void test_bench_folder_checksum(void)
{
    const char *root = folder();
    const char *args[] = {"bench", root, "--no-shuffle", "--json", "--batch-size", "2", NULL};
    result r = run_cli(args);
    CHECK_EQ(r.status, 0);
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    int order[9];
    for (int i = 0; i < 9; i++)
        order[i] = (i % 3) * 3 + i / 3; /* index -> file number */
    for (int start = 0; start < 9; start += 2) {
        int end = start + 2 < 9 ? start + 2 : 9;
        for (int i = start; i < end; i++) {
            int64_t lab = i / 3;
            XXH3_64bits_update(h, &lab, sizeof lab);
        }
        for (int i = start; i < end; i++) {
            char content[64];
            int k = order[i];
            int n = snprintf(content, sizeof content, "sample %d %.*s", k, k * 3,
                             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
            uint64_t len = (uint64_t)n;
            XXH3_64bits_update(h, &len, sizeof len);
            XXH3_64bits_update(h, content, len);
        }
    }
    uint64_t want = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    CHECK(json_checksum(r.out) == want);
    CHECK_EQ(json_int(r.out, "samples"), 9);
    CHECK(strstr(r.out, "\"source\":\"folder\"") != NULL);
    result_free(&r);
}

static void test_bad_input_exit_codes(void)
{
    /* Missing path: exit 1, the message names it. */
    char missing[1024];
    snprintf(missing, sizeof missing, "%s", tu_path("no/such/dir"));
    const char *a1[] = {"bench", missing, NULL};
    result r = run_cli(a1);
    CHECK_EQ(r.status, 1);
    CHECK(strstr(r.err, missing) != NULL);
    result_free(&r);
    /* Empty folder. */
    char empty[1024];
    snprintf(empty, sizeof empty, "%s", tu_path("empty"));
    tu_mkdirs(empty);
    const char *a2[] = {"bench", empty, NULL};
    r = run_cli(a2);
    CHECK_EQ(r.status, 1);
    CHECK(strstr(r.err, "class") != NULL);
    result_free(&r);
    /* A trailing partial record. */
    const char *a3[] = {"bench", records_file(), "--record-size", "7", NULL};
    r = run_cli(a3);
    CHECK_EQ(r.status, 1);
    CHECK(strstr(r.err, "rec.bin") != NULL);
    result_free(&r);
    /* Usage errors: exit 2. */
    const char *u1[] = {NULL};
    r = run_cli(u1);
    CHECK_EQ(r.status, 2);
    result_free(&r);
    const char *u2[] = {"bench", "--bogus", NULL};
    r = run_cli(u2);
    CHECK_EQ(r.status, 2);
    result_free(&r);
    const char *u3[] = {"bench", empty, "--rank", "2", "--world-size", "2", NULL};
    r = run_cli(u3);
    CHECK_EQ(r.status, 2);
    result_free(&r);
    const char *u4[] = {"bench", empty, "--batch-size", "lots", NULL};
    r = run_cli(u4);
    CHECK_EQ(r.status, 2);
    result_free(&r);
    const char *u5[] = {"frobnicate", NULL};
    r = run_cli(u5);
    CHECK_EQ(r.status, 2);
    result_free(&r);
    const char *v[] = {"version", NULL};
    r = run_cli(v);
    CHECK_EQ(r.status, 0);
    CHECK(strstr(r.out, STK_VERSION_STRING) != NULL);
    result_free(&r);
}

/* A sample that cannot be read: raise exits 1 naming the file; skip exits 0
 * and lists it in the JSON errors. */
static void test_bad_sample_policies(void)
{
    char root[900];
    snprintf(root, sizeof root, "%s", tu_path("badtree"));
    char p[1024];
    snprintf(p, sizeof p, "%s/c", root);
    tu_mkdirs(p);
    for (int k = 0; k < 4; k++) {
        snprintf(p, sizeof p, "%s/c/%d.png", root, k);
        tu_write_file(p, "png?", 4);
    }
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/c/2b.png", root);
    REQUIRE(symlink("gone.png", bad) == 0);
    const char *a1[] = {"bench", root, "--no-shuffle", "--batch-size", "2", NULL};
    result r = run_cli(a1);
    CHECK_EQ(r.status, 1);
    if (!strstr(r.err, bad))
        fprintf(stderr, "    stderr \"%s\" does not name %s\n", r.err, bad);
    CHECK(strstr(r.err, bad) != NULL);
    result_free(&r);
    const char *a2[] = {"bench", root, "--no-shuffle", "--on-error", "skip", "--json", NULL};
    r = run_cli(a2);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "skipped"), 1);
    CHECK_EQ(json_int(r.out, "samples"), 4);
    CHECK(strstr(r.out, bad) != NULL);
    result_free(&r);
}

static double json_num(const char *out, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(out, k);
    return p ? strtod(p + strlen(k), NULL) : -1.0;
}

/* The clock starts before the loader opens (workers fill the ring during
 * the open): the open and the first batch are reported, inside the run's
 * seconds, and samples/s is samples over those seconds. */
static void test_bench_times_from_open(void)
{
    const char *path = records_file();
    const char *args[] = {"bench",        path, "--record-size", "24",
                          "--batch-size", "5",  "--json",        NULL};
    result r = run_cli(args);
    CHECK_EQ(r.status, 0);
    double open_s = json_num(r.out, "open_s"), first = json_num(r.out, "first_batch_s");
    double secs = json_num(r.out, "seconds"), rate = json_num(r.out, "samples_per_s");
    CHECK(strstr(r.out, "\"open_s\":") && strstr(r.out, "\"first_batch_s\":"));
    CHECK(open_s >= 0 && first >= open_s && secs >= first);
    CHECK(secs > 0 && rate > 0);
    /* seconds is printed to the microsecond: a run this small takes under a
     * millisecond, so its rounding alone can move N / secs by more than
     * 0.1 %; allow half a microsecond either way. */
    if (secs > 0)
        CHECK(rate > 0.999 * N / (secs + 5e-7) && rate < 1.001 * N / fmax(secs - 5e-7, 1e-9));
    result_free(&r);
    const char *text[] = {"bench", path, "--record-size", "24", NULL};
    r = run_cli(text);
    CHECK_EQ(r.status, 0);
    CHECK(strstr(r.out, "startup      open ") != NULL);
    CHECK(strstr(r.out, ", first batch after ") != NULL);
    result_free(&r);
}

/* Is s (n bytes) well-formed UTF-8? */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len = c < 0x80                ? 1
                     : c >= 0xC2 && c < 0xE0 ? 2
                     : c >= 0xE0 && c < 0xF0 ? 3
                     : c >= 0xF0 && c < 0xF5 ? 4
                                             : 0;
        if (!len || i + len > n)
            return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) ||
            (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += len;
    }
    return true;
}

/* --json stays valid UTF-8 when file names are not: a byte outside
 * well-formed UTF-8 is written \udcXX, so a strict JSON parser reads it and
 * os.fsencode gives the original bytes back. */
static void test_json_non_utf8_names(void)
{
    char root[900], p[1024], bad[1024];
    snprintf(root, sizeof root, "%s", tu_path("utf\xff-tree")); /* 0xff: never UTF-8 */
    snprintf(p, sizeof p, "%s/caf\xc3\xa9", root);              /* é: valid UTF-8, kept */
    tu_mkdirs(p);
    snprintf(p, sizeof p, "%s/caf\xc3\xa9/ok.jpg", root);
    tu_write_file(p, "x", 1);
    snprintf(bad, sizeof bad, "%s/caf\xc3\xa9/gone\xe9\x80.jpg", root); /* cut sequence */
    REQUIRE(symlink("nowhere", bad) == 0);
    const char *args[] = {"bench", root, "--on-error", "skip", "--json", NULL};
    result r = run_cli(args);
    CHECK_EQ(r.status, 0);
    CHECK(valid_utf8((const unsigned char *)r.out, strlen(r.out)));
    CHECK(strstr(r.out, "utf\\udcff-tree") != NULL);
    CHECK(strstr(r.out, "caf\xc3\xa9/gone\\udce9\\udc80.jpg") != NULL);
    CHECK_EQ(json_int(r.out, "skipped"), 1);
    /* A strict parser, and the round trip back to the bytes. */
    if (access("/usr/bin/python3", X_OK) == 0) {
        char json[1024];
        snprintf(json, sizeof json, "%s", tu_path("bench.json"));
        tu_write_file(json, r.out, strlen(r.out));
        const char *py[] = {
            "-c",
            "import json, os, sys\n"
            "d = json.loads(sys.stdin.buffer.read().decode('utf-8', 'strict'))\n"
            "assert os.fsencode(d['path']) == os.fsencode(sys.argv[1]), d['path']\n"
            "assert os.fsencode(d['errors'][0]['path']) == os.fsencode(sys.argv[2]), d['errors']\n"
            "print('round trip ok')\n",
            root, bad, NULL};
        result q = run_prog("/usr/bin/python3", py, json);
        CHECK_EQ(q.status, 0);
        CHECK(strstr(q.out, "round trip ok") != NULL);
        if (q.status)
            fprintf(stderr, "    python: %s\n", q.err);
        result_free(&q);
    } else {
        printf("  (no /usr/bin/python3: strict-parser round trip not run)\n");
    }
    result_free(&r);
}

/* Usage errors say what is wrong: out-of-range numbers give the range,
 * options that would do nothing are refused, never ignored. */
static void test_usage_messages(void)
{
    const char *rec = records_file();
    static char recp[1024];
    snprintf(recp, sizeof recp, "%s", rec);
    static const struct {
        const char *args[10];
        const char *says;
    } cases[] = {
        {{"bench", "x", "--world-size", "4294967297", NULL},
         "--world-size 4294967297 is out of range (1..4294967295)"},
        {{"bench", "x", "--rank", "99999999999999999999999", NULL},
         "--rank 99999999999999999999999 is out of range (0..4294967294)"},
        {{"bench", "x", "--rank", "2", "--world-size", "2", NULL},
         "--rank 2 is out of range for --world-size 2 (0..1)"},
        {{"bench", "x", "--threads", "257", NULL}, "--threads 257 is out of range (0..256)"},
        {{"bench", "x", "--batch-size", "0", NULL}, "--batch-size 0 is out of range (1..16777216)"},
        {{"bench", "x", "--depth", "65", NULL}, "--depth 65 is out of range (1..63)"},
        {{"bench", "x", "--threads", "-1", NULL}, "--threads -1 is out of range (0..256)"},
        {{"bench", "x", "--depth", "two", NULL}, "--depth needs a number, got 'two'"},
        {{"bench", "x", "--record-size", "0", NULL}, "--record-size 0 is not a valid record size"},
        {{"bench", "x", "--header-bytes", "16", NULL},
         "--header-bytes applies to record files; give --record-size too"},
        {{"bench", "x", "--label-bytes", "1", NULL},
         "--label-bytes applies to record files; give --record-size too"},
        {{"bench", "x", "--size", "64", NULL}, "--size sets the output size of the presets"},
        {{"bench", "x", "--size", "64", "--transform", "CenterCrop(8)", NULL},
         "--transform CenterCrop(8) has none"},
        {{"bench", "x", "--transform", "", NULL}, "--transform needs a transform"},
        {{"bench", "x", "--layout", "chw", NULL}, "--layout takes nchw or nhwc, got 'chw'"},
        {{"info", "x", "--record-size", "0", NULL}, "--record-size 0 is not a valid record size"},
        {{"verify", "x", "--header-bytes", "4", NULL}, "--header-bytes applies to record files"},
        {{"pack", "x", "y", "--record-size", "0", NULL},
         "--record-size 0 is not a valid record size"},
        {{"pack", "x", "y", "--label-bytes", "1", NULL}, "--label-bytes applies to record files"},
        {{"pack", "x", "y", "--quality", "101", NULL}, "--quality 101 is out of range (1..100)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        result r = run_cli(cases[k].args);
        CHECK_EQ(r.status, 2);
        if (!strstr(r.err, cases[k].says))
            fprintf(stderr, "    case %zu: stderr '%s' lacks '%s'\n", k, r.err, cases[k].says);
        CHECK(strstr(r.err, cases[k].says) != NULL);
        result_free(&r);
    }
    /* --size with a preset, even inside a longer spec, is taken (the run
     * gets past parsing; the records are not images, so they are skipped). */
    const char *ok[] = {"bench",  recp,          "--record-size",
                        "24",     "--transform", "imagenet-val | RandomHorizontalFlip(p=0.5)",
                        "--size", "64",          "--on-error",
                        "skip",   NULL};
    result r = run_cli(ok);
    CHECK_EQ(r.status, 0);
    CHECK(strstr(r.err, "--size") == NULL);
    result_free(&r);
    /* The header is honoured with a record size. */
    const char *hdr[] = {"bench",         recp, "--record-size", "24", "--header-bytes", "24",
                         "--label-bytes", "1",  "--json",        NULL};
    r = run_cli(hdr);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "samples"), N - 1);
    result_free(&r);
}

/* Byte sizes are parsed once, in the library (stk_parse_size), the same for
 * every size option (issue 18.10: "16MiB" was refused). */
static void test_parse_size(void)
{
    static const struct {
        const char *text;
        int rc;
        uint64_t v;
    } cases[] = {
        {"0", STK_OK, 0},
        {"1048576", STK_OK, 1048576},
        {"16K", STK_OK, 16 << 10},
        {"16k", STK_OK, 16 << 10},
        {"16M", STK_OK, 16 << 20},
        {"16MiB", STK_OK, 16 << 20},
        {"16mib", STK_OK, 16 << 20},
        {"16MB", STK_OK, 16000000},
        {"16 MiB", STK_OK, 16 << 20},
        {"1.5G", STK_OK, 3ull << 29},
        {"0.5KiB", STK_OK, 512},
        {"500GiB", STK_OK, 500ull << 30},
        {"2T", STK_OK, 2ull << 40},
        {"3TB", STK_OK, 3000000000000ull},
        {"100B", STK_OK, 100},
        {"18446744073709551615", STK_OK, UINT64_MAX},
        {"18446744073709551616", STK_ETOOBIG, 0},
        {"16777216T", STK_ETOOBIG, 0},
        {"", STK_EINVAL, 0},
        {"M", STK_EINVAL, 0},
        {"1.5", STK_EINVAL, 0},
        {"-1", STK_EINVAL, 0},
        {"16 QB", STK_EINVAL, 0},
        {"16MiBs", STK_EINVAL, 0},
        {"16Mi", STK_EINVAL, 0},
        {"1e6", STK_EINVAL, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t v = 12345;
        int rc = stk_parse_size(cases[k].text, &v);
        if (rc != cases[k].rc || (rc == STK_OK && v != cases[k].v))
            printf("    '%s': rc %d value %llu\n", cases[k].text, rc, (unsigned long long)v);
        CHECK_EQ(rc, cases[k].rc);
        if (rc == STK_OK)
            CHECK_EQ(v, cases[k].v);
    }
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "cache_limit", "16MiB"), STK_OK);
    CHECK_EQ(o->cache_limit, 16u << 20);
    CHECK_EQ(stk_options_set(o, "max_input_bytes", "1.5G"), STK_OK);
    CHECK_EQ(o->max_input_bytes, (size_t)3 << 29);
    CHECK_EQ(stk_options_set(o, "batch_memory", "64MB"), STK_OK);
    CHECK_EQ(o->batch_memory, 64000000);
    /* cache_dir: "~" is the home directory, never a directory named "~". */
    const char *home = getenv("HOME");
    char *saved = home ? strdup(home) : NULL;
    setenv("HOME", "/home/someone", 1);
    CHECK_EQ(stk_options_set(o, "cache_dir", "~/stoker-cache"), STK_OK);
    CHECK(!strcmp(o->cache_dir, "/home/someone/stoker-cache"));
    CHECK_EQ(stk_options_set(o, "cache_dir", "~"), STK_OK);
    CHECK(!strcmp(o->cache_dir, "/home/someone"));
    CHECK_EQ(stk_options_set(o, "cache_dir", "~other/x"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "cache_dir", ""), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "cache_dir", "/abs/~x"), STK_OK);
    CHECK(!strcmp(o->cache_dir, "/abs/~x"));
    if (saved)
        setenv("HOME", saved, 1);
    else
        unsetenv("HOME");
    free(saved);
    stk_options_destroy(o);
}

/* The CLI takes sizes as the library does and names a bad one's flag as the
 * user wrote it with the syntax; remote options that would change nothing
 * are refused (issue 18: --cache-limit without --cache-dir, --cache-dir on a
 * local path, --cache-dir ""); --max-input-bytes exists (issue 24.7). */
static void test_sizes_and_unused_remote_options(void)
{
    const char *rec = records_file();
    static const struct {
        const char *args[12];
        const char *needle;
    } bad[] = {
        {{"bench", "http://127.0.0.1:1/ds", "--cache-dir", "/tmp/c", "--cache-limit", "16QB", NULL},
         "--cache-limit takes a size in bytes (e.g. 1048576, 64K, 16M or 16MiB"},
        {{"bench", "REC", "--record-size", "16", "--batch-memory", "1.5X", NULL},
         "--batch-memory takes a size in bytes"},
        {{"bench", "REC", "--record-size", "16", "--max-input-bytes", "lots", NULL},
         "--max-input-bytes takes a size in bytes"},
        {{"bench", "http://127.0.0.1:1/ds", "--cache-limit", "16MiB", NULL},
         "--cache-limit is the size limit of the disk cache; give --cache-dir too"},
        {{"bench", "REC", "--record-size", "16", "--cache-dir", "/tmp/c", NULL},
         "--cache-dir applies to remote datasets"},
        {{"bench", "REC", "--record-size", "16", "--fetch-timeout", "5", NULL},
         "--fetch-timeout applies to remote datasets"},
        {{"bench", "http://127.0.0.1:1/ds", "--cache-dir", "", NULL},
         "--cache-dir needs a directory"},
        {{"bench", "http://127.0.0.1:1/ds", "--fetch-timeout", "0", NULL},
         "--fetch-timeout takes seconds, 1..3600, got '0'"},
        {{"doctor", "REC", "--record-size", "16", "--cache-limit", "1G", NULL},
         "--cache-limit applies to remote datasets"},
        {{"pack", "REC", "/tmp/never-written", "--shard-size", "2 gigs", NULL},
         "--shard-size takes a size in bytes (e.g. 1048576, 64K, 16M or 16MiB"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *args[12];
        for (size_t j = 0; j < 12; j++)
            args[j] = bad[k].args[j] && !strcmp(bad[k].args[j], "REC") ? rec : bad[k].args[j];
        result r = run_cli(args);
        if (r.status != 2 || !strstr(r.err, bad[k].needle))
            printf("    case %zu: status %d, stderr: %s", k, r.status, r.err);
        CHECK_EQ(r.status, 2);
        CHECK(strstr(r.err, bad[k].needle) != NULL);
        result_free(&r);
    }
    /* What users type is accepted: the run gets past the arguments to the
     * (refused) connection, exit 1, not a usage error. */
    const char *remote[] = {
        "bench", "http://127.0.0.1:1/ds", "--cache-dir", tu_path("cache"),  "--cache-limit",
        "16MiB", "--fetch-buffer",        "1.5M",        "--fetch-retries", "0",
        NULL};
    result r = run_cli(remote);
    CHECK_EQ(r.status, 1);
    CHECK(strstr(r.err, "cannot open") != NULL);
    result_free(&r);
    const char *local[] = {
        "bench",           rec,    "--record-size",     "16",   "--batch-memory",     "1.5M",
        "--memory-budget", "1GiB", "--max-input-bytes", "64MB", "--max-sample-bytes", "4KiB",
        "--json",          NULL};
    r = run_cli(local);
    CHECK_EQ(r.status, 0);
    if (r.status)
        printf("    stderr: %s", r.err);
    result_free(&r);
}

/* A folder of two JPEGs: a small one and one of noise over 4 KiB. */
static const char *jpeg_folder(size_t *big_len)
{
    static char root[900];
    snprintf(root, sizeof root, "%s", tu_path("jpegs"));
    char p[1024];
    snprintf(p, sizeof p, "%s/a", root);
    tu_mkdirs(p);
    uint8_t *px = malloc(128 * 128 * 3);
    REQUIRE(px);
    uint64_t x = 1;
    for (size_t k = 0; k < 128 * 128 * 3; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        px[k] = (uint8_t)(x >> 56);
    }
    size_t n;
    uint8_t *big = tu_jpeg(px, 128, 128, 95, &n);
    REQUIRE(n > 4096);
    *big_len = n;
    snprintf(p, sizeof p, "%s/a/big.jpg", root);
    tu_write_file(p, big, n);
    free(big);
    memset(px, 90, 16 * 16 * 3);
    uint8_t *small = tu_jpeg(px, 16, 16, 90, &n);
    REQUIRE(n < 4096);
    snprintf(p, sizeof p, "%s/a/small.jpg", root);
    tu_write_file(p, small, n);
    free(small);
    free(px);
    return root;
}

/* An image over max_input_bytes: the run's error names the option, bench
 * takes --max-input-bytes, and verify reports the sample (issue 24.7). */
static void test_max_input_bytes(void)
{
    size_t big;
    const char *root = jpeg_folder(&big);
    const char *run1[] = {"bench",  root, "--transform",       "imagenet-val",
                          "--size", "16", "--max-input-bytes", "4K",
                          NULL};
    result r = run_cli(run1);
    CHECK_EQ(r.status, 1);
    CHECK(strstr(r.err, "big.jpg") && strstr(r.err, "max_input_bytes") &&
          strstr(r.err, "--max-input-bytes"));
    result_free(&r);
    const char *run2[] = {"bench",  root, "--transform",       "imagenet-val",
                          "--size", "16", "--max-input-bytes", "1MiB",
                          NULL};
    r = run_cli(run2);
    CHECK_EQ(r.status, 0);
    result_free(&r);

    char out[1024];
    snprintf(out, sizeof out, "%s", tu_path("jpegs-stk"));
    const char *pack[] = {"pack", root, out, "--quiet", NULL};
    r = run_cli(pack);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    const char *v1[] = {"verify", out, NULL};
    r = run_cli(v1);
    CHECK_EQ(r.status, 0); /* within the default 32M */
    CHECK(!strstr(r.out, "too large"));
    result_free(&r);
    const char *v2[] = {"verify", out, "--max-input-bytes", "4096", NULL};
    r = run_cli(v2);
    CHECK_EQ(r.status, 1);
    char want[128];
    snprintf(want, sizeof want, "an image of %zu bytes, over max_input_bytes (4096)", big);
    CHECK(strstr(r.out, "too large") && strstr(r.out, want));
    CHECK(strstr(r.out, "1 over max_input_bytes") != NULL);
    result_free(&r);
}

/* A JPEG whose quantization tables do not fit in 8 bits (quality 1 without
 * forcing baseline): libjpeg writes it as SOF1, and re-encoding it says
 * "Caution: quantization tables are too coarse for baseline JPEG". */
static void write_coarse_jpeg(const char *path)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr je;
    ci.err = jpeg_std_error(&je);
    jpeg_create_compress(&ci);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = 48;
    ci.image_height = 32;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 1, FALSE);
    ci.err->trace_level = -1; /* this writer's own caution is not under test */
    jpeg_start_compress(&ci, TRUE);
    uint8_t row[48 * 3];
    while (ci.next_scanline < ci.image_height) {
        for (int k = 0; k < 48 * 3; k++)
            row[k] = (uint8_t)(k * 5 + ci.next_scanline * 7);
        JSAMPROW rp = row;
        jpeg_write_scanlines(&ci, &rp, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    fclose(f);
}

/* libjpeg's own messages never reach stderr: pack --restart of a JPEG with
 * 16-bit quantization tables printed "Caution: ..." from inside the library
 * whatever --quiet said (issue 24.8). The file is packed, indexed (SOF1). */
static void test_libjpeg_messages_stay_quiet(void)
{
    char dir[1024], p[1100], out[1024];
    snprintf(dir, sizeof dir, "%s", tu_path("coarse"));
    snprintf(p, sizeof p, "%s/a", dir);
    tu_mkdirs(p);
    snprintf(p, sizeof p, "%s/a/x.jpg", dir);
    write_coarse_jpeg(p);
    size_t n;
    uint8_t *b = tu_read_file(p, &n);
    bool sof1 = false;
    for (size_t k = 0; b && k + 1 < n; k++)
        sof1 |= b[k] == 0xFF && b[k + 1] == 0xC1;
    free(b);
    REQUIRE(sof1);
    snprintf(out, sizeof out, "%s", tu_path("coarse-stk"));
    const char *pack[] = {"pack", dir, out, "--restart", "--quiet", NULL};
    result r = run_cli(pack);
    CHECK_EQ(r.status, 0);
    if (r.err[0])
        printf("    stderr: %s", r.err);
    CHECK_EQ(strlen(r.err), 0);
    result_free(&r);
    const char *verify[] = {"verify", out, NULL};
    r = run_cli(verify);
    CHECK_EQ(r.status, 0);
    CHECK(strstr(r.out, "1 restart indexes checked") != NULL);
    CHECK_EQ(strlen(r.err), 0);
    result_free(&r);
    const char *bench[] = {"bench", out, "--transform", "imagenet-val", "--size", "16", NULL};
    r = run_cli(bench);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(strlen(r.err), 0);
    result_free(&r);
}

/* pack refuses an OUT inside SRC (and the reverse) from the command line. */
static void test_pack_into_source(void)
{
    const char *root = folder();
    char out[1024];
    snprintf(out, sizeof out, "%s/c0/../packed", root);
    const char *args[] = {"pack", root, out, "--quiet", NULL};
    result r = run_cli(args);
    CHECK_EQ(r.status, 1);
    CHECK(strstr(r.err, "is inside the source dataset") != NULL);
    result_free(&r);
    snprintf(out, sizeof out, "%s/packed", root);
    CHECK(access(out, F_OK) != 0);
}

/* The option table (issue 19.1): every key has its type, range, default and
 * doc line; stk_options_set parses and checks from it, stores what the old
 * setter stored, and says which key, which value and what it takes. */
static void test_option_table(void)
{
    size_t count = 0;
    for (const stk_option_info *in = stk_option_next(NULL); in; in = stk_option_next(in)) {
        count++;
        CHECK(in->name && *in->name && in->doc && *in->doc && in->def && *in->def);
        CHECK(stk_option_by_name(in->name) == in);
        CHECK(in->min <= in->max);
        CHECK(in->type != STK_OPTION_ENUM || (in->values && *in->values));
        CHECK(in->flags != 0);
        stk_options *o = NULL;
        REQUIRE(stk_options_create(&o) == STK_OK);
        char good[64], bad[64] = "";
        switch (in->type) {
        case STK_OPTION_BOOL:
            snprintf(good, sizeof good, "1");
            snprintf(bad, sizeof bad, "yes");
            break;
        case STK_OPTION_ENUM:
            snprintf(good, sizeof good, "%.*s", (int)strcspn(in->values, "|"), in->values);
            snprintf(bad, sizeof bad, "no-such-word");
            break;
        case STK_OPTION_STRING: snprintf(good, sizeof good, "/tmp/x"); break;
        default:
            snprintf(good, sizeof good, "%llu", (unsigned long long)in->min);
            snprintf(bad, sizeof bad, "%llu", (unsigned long long)in->max + 1);
            break;
        }
        CHECK_EQ(stk_options_set(o, in->name, good), STK_OK);
        CHECK(!strcmp(stk_options_errmsg(o), ""));
        if (*bad) {
            CHECK_EQ(stk_options_set(o, in->name, bad), STK_EINVAL);
            const char *m = stk_options_errmsg(o);
            CHECK(!strncmp(m, in->name, strlen(in->name)) && strstr(m, bad));
            if (!strstr(m, bad))
                printf("    %s: %s\n", in->name, m);
        }
        stk_options_destroy(o);
    }
    CHECK(count >= 29);
    CHECK(stk_option_by_name("no_such_key") == NULL && stk_option_by_name(NULL) == NULL);

    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "no_such_key", "1"), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "unknown option 'no_such_key'"));
    CHECK_EQ(stk_options_set(o, "fetch_timeout", "0"), STK_EINVAL);
    CHECK(!strcmp(stk_options_errmsg(o), "fetch_timeout takes seconds, 1..3600, got '0'"));
    CHECK_EQ(stk_options_set(o, "jpeg_memory", "1M"), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "a size in bytes (e.g. 1048576") &&
          strstr(stk_options_errmsg(o), "4M..1T, got '1M'"));
    /* What each key stores, as the strcmp chain before the table did. */
    CHECK(stk_options_set(o, "layout", "nhwc") == STK_OK && o->nchw == 0);
    CHECK(stk_options_set(o, "dtype", "bfloat16") == STK_OK && o->dtype == STK_DTYPE_BFLOAT16);
    CHECK(stk_options_set(o, "addressing", "virtual") == STK_OK && o->addressing == 2);
    CHECK(stk_options_set(o, "addressing", "auto") == STK_OK && o->addressing == 0);
    CHECK(stk_options_set(o, "order", "shards") == STK_OK && o->order == STK__ORDER_SHARDS);
    CHECK(stk_options_set(o, "fetch_retries", "0") == STK_OK && o->fetch_retries == UINT32_MAX);
    CHECK(stk_options_set(o, "fetch_retries", "7") == STK_OK && o->fetch_retries == 7);
    CHECK(stk_options_set(o, "depth", "auto") == STK_OK && o->depth_auto);
    CHECK(stk_options_set(o, "depth", "5") == STK_OK && !o->depth_auto && o->depth == 5);
    CHECK(stk_options_set(o, "device", "fake:3") == STK_OK && o->device == STK_DEVICE_FAKE &&
          o->device_id == 3);
    CHECK_EQ(stk_options_set(o, "device", "cpu:0"), STK_EINVAL);
    CHECK(stk_options_set(o, "cache_limit", "1.5G") == STK_OK && o->cache_limit == (uint64_t)3
                                                                                       << 29);
    CHECK(stk_options_set(o, "batch_memory", "16MB") == STK_OK && o->batch_memory == 16000000);
    CHECK(stk_options_set(o, "max_dim", "4K") == STK_OK && o->max_dim == 4096);
    CHECK(stk_options_set(o, "exif", "1") == STK_OK && o->exif == 1);
    CHECK(stk_options_set(o, "autotune", "1") == STK_OK && o->autotune);
    CHECK(stk_options_set(o, "trace", "/tmp/t.json") == STK_OK && o->trace);
    CHECK(stk_options_set(o, "trace", "") == STK_OK && !o->trace);
    CHECK(stk_options_set(o, "local_world_size", "0") == STK_OK && o->local_world == 0);
    CHECK(stk_options_set(o, "trace_events", "2048") == STK_OK && o->trace_events == 2048);
    stk_options_destroy(o);

    size_t presets = 0;
    for (const char *p = stk_transform_preset_next(NULL); p; p = stk_transform_preset_next(p))
        presets += (size_t)stk_transform_preset_sized(p);
    CHECK_EQ(presets, 3);
    CHECK(!stk_transform_preset_sized("CenterCrop(8)") && !stk_transform_preset_sized(NULL));
}

/* docs/options.md is `stoker options --markdown`: a key added to the table
 * without regenerating the docs (stoker options --markdown > docs/options.md)
 * fails here; every key has its row with its doc line. Every option is a
 * flag of bench, and info's remote flags are checked by the same table. */
static void test_options_doc_and_flags(void)
{
    const char *args[] = {"options", "--markdown", NULL};
    result r = run_cli(args);
    CHECK_EQ(r.status, 0);
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    REQUIRE(slash);
    snprintf(slash, sizeof path - (size_t)(slash - path), "/../../docs/options.md");
    size_t n = 0;
    char *doc = tu_read_file(path, &n);
    if (!doc)
        doc = tu_read_file("docs/options.md", &n);
    REQUIRE(doc);
    bool same = n == strlen(r.out) && !memcmp(doc, r.out, n);
    CHECK(same);
    if (!same)
        printf("    docs/options.md is not `stoker options --markdown`: regenerate it with\n"
               "    build/release/stoker options --markdown > docs/options.md\n");
    for (const stk_option_info *in = stk_option_next(NULL); in; in = stk_option_next(in)) {
        char row[128];
        snprintf(row, sizeof row, "| `%s` |", in->name);
        const char *at = memmem(doc, n, row, strlen(row));
        CHECK(at && memmem(at, n - (size_t)(at - doc), in->doc, strlen(in->doc)));
    }
    free(doc);
    result_free(&r);

    const char *flag[] = {"bench", "x", "--max-dim", "0", NULL};
    r = run_cli(flag);
    CHECK_EQ(r.status, 2);
    CHECK(strstr(r.err, "--max-dim takes a number of pixels, 1..1048576, got '0'"));
    result_free(&r);
    const char *info[] = {"info", "x", "--fetch-retries", "101", NULL};
    r = run_cli(info);
    CHECK_EQ(r.status, 2);
    CHECK(strstr(r.err, "--fetch-retries takes a number of retries, 0..100, got '101'"));
    result_free(&r);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_begin("test_cli", 60);
    const char *env = getenv("STOKER_BIN");
    if (env && *env) {
        snprintf(g_bin, sizeof g_bin, "%s", env);
    } else {
        /* build/MODE/tests/test_cli -> build/MODE/stoker */
        snprintf(g_bin, sizeof g_bin, "%s", argv[0]);
        char *slash = strrchr(g_bin, '/');
        if (slash)
            snprintf(slash, sizeof g_bin - (size_t)(slash - g_bin), "/../stoker");
    }
    RUN(test_parse_size);
    RUN(test_option_table);
    if (access(g_bin, X_OK) != 0) {
        printf("  skipped: no stoker binary at %s (set STOKER_BIN)\n", g_bin);
        return tu_end();
    }
    RUN(test_bench_records_checksum);
    RUN(test_bench_folder_checksum);
    RUN(test_bad_input_exit_codes);
    RUN(test_bad_sample_policies);
    RUN(test_bench_times_from_open);
    RUN(test_json_non_utf8_names);
    RUN(test_usage_messages);
    RUN(test_pack_into_source);
    RUN(test_sizes_and_unused_remote_options);
    RUN(test_max_input_bytes);
    RUN(test_libjpeg_messages_stay_quiet);
    RUN(test_options_doc_and_flags);
    return tu_end();
}
