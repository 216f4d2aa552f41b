/* test_cli.c -- the `stoker` command line, run as a child process: bench's
 * checksum equals one computed here from the dataset (order, labels, bytes),
 * exit status 0 / 1 (loader error, message names the path) / 2 (usage), and
 * the error policies. The binary is $STOKER_BIN, else ../stoker next to this
 * test's directory (build/MODE/stoker); skipped with a message if missing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "order.h"
#include "testutil.h"

#include <fcntl.h>
#include <spawn.h>
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

/* Runs the CLI with args (NULL-terminated), capturing stdout and stderr. */
static result run_cli(const char *const *args)
{
    result r = {-1, NULL, NULL};
    const char *outp = tu_path("cli.out"), *errp = tu_path("cli.err");
    char *argv[32];
    int n = 0;
    argv[n++] = g_bin;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = (char *)(uintptr_t)args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawn(&pid, g_bin, &fa, NULL, argv, environ);
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
    if (access(g_bin, X_OK) != 0) {
        printf("  skipped: no stoker binary at %s (set STOKER_BIN)\n", g_bin);
        return tu_end();
    }
    RUN(test_bench_records_checksum);
    RUN(test_bench_folder_checksum);
    RUN(test_bad_input_exit_codes);
    RUN(test_bad_sample_policies);
    return tu_end();
}
