/* test_trace.c -- the loader's trace (docs/diagnosis.md) through the public
 * API: a complete Chrome trace-event file at close whose span counts equal the
 * stage counters written beside them; a bounded ring that keeps the latest
 * events and counts the dropped ones; a path that cannot be created fails the
 * open naming it; the target is left as it was until the trace is complete
 * and is never something other than a trace. Threads record concurrently: also run under TSan. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REC 32

long stk__alloc_live(void);
void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

static const char *records(uint64_t n)
{
    const char *path = tu_path("data.rec");
    uint8_t *buf = calloc(n, REC);
    REQUIRE(buf);
    for (uint64_t i = 0; i < n; i++)
        memcpy(buf + i * REC, &i, sizeof i);
    tu_write_file(path, buf, n * REC);
    free(buf);
    return path;
}

static size_t count(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static uint64_t field(const char *text, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *p = strstr(text, key);
    return p ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
}

static char *read_text(const char *path)
{
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    REQUIRE(text);
    char *z = realloc(text, n + 1);
    REQUIRE(z);
    z[n] = '\0';
    return z;
}

/* Files in dir whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    REQUIRE(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* Runs `epochs` epochs with a trace into `trace`; returns the file's text. */
static char *run(const char *src, const char *trace, const char *events, unsigned threads,
                 int epochs, uint64_t *delivered)
{
    stk_loader *l = NULL;
    tu_cfg c = {.path = src,
                .record = REC,
                .bs = 8,
                .threads = threads,
                .depth = 3,
                .options = {"trace", trace, "trace_events", events, NULL}};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    *delivered = 0;
    for (int e = 0; e < epochs; e++) {
        stk_batch *b;
        int rc;
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            *delivered += b->size;
            stk_batch_release(b);
        }
        CHECK_EQ(rc, STK_END);
    }
    stk_loader_close(l);
    size_t n = 0;
    char *text = tu_read_file(trace, &n);
    REQUIRE(text);
    char *z = realloc(text, n + 1);
    REQUIRE(z);
    z[n] = '\0';
    return z;
}

static void test_complete_trace_matches_counters(void)
{
    const char *src = records(500), *trace = tu_path("t.json");
    uint64_t delivered;
    char *t = run(src, trace, "1M", 3, 2, &delivered);
    CHECK_EQ(delivered, 1000);
    CHECK(!strncmp(t, "{\"displayTimeUnit\"", 18));
    CHECK(strstr(t, "\n]}\n") && strlen(strstr(t, "\n]}\n")) == 4);
    CHECK_EQ(field(t, "dropped_events"), 0);
    /* Every read the workers counted is a span, and more were read than
     * delivered only by the prefetch of the next epoch. */
    uint64_t reads = field(t, "read_items");
    CHECK_EQ(count(t, "\"name\":\"read\""), reads);
    CHECK(reads >= delivered);
    CHECK_EQ(field(t, "samples_delivered"), delivered);
    CHECK_EQ(count(t, "\"name\":\"process\""), 0); /* records: no transform */
    /* One next() span per call: 2 epochs of 63 batches, plus the 2 ends. */
    CHECK_EQ(count(t, "\"name\":\"next\""), 2 * 63 + 2);
    CHECK_EQ(count(t, "\"result\":\"delivered\""), 126);
    CHECK(count(t, "\"name\":\"batch ready\"") >= 126);
    CHECK_EQ(count(t, "\"name\":\"thread_name\""), 4); /* consumer + 3 workers */
    /* No temporary file is left behind. */
    CHECK_EQ(count_prefixed(tu_tmpdir(), ".t.json."), 0);
    free(t);
}

static void test_ring_keeps_latest_and_counts_drops(void)
{
    const char *src = records(3000), *trace = tu_path("small.json");
    uint64_t delivered;
    char *t = run(src, trace, "1024", 2, 1, &delivered);
    CHECK_EQ(delivered, 3000);
    uint64_t kept = field(t, "events"), dropped = field(t, "dropped_events");
    /* 3 tracks of 1024 / 3 = 341 events each. */
    CHECK(kept <= 3 * 341);
    CHECK(dropped > 0);
    uint64_t spans = count(t, "\"name\":\"read\"") + count(t, "\"name\":\"next\"") +
                     count(t, "\"name\":\"batch ready\"");
    CHECK_EQ(spans, kept);
    /* Everything recorded was kept or dropped: every read, 376 next() calls
     * (375 batches and the end), and a "ready" per batch filled (375, plus
     * at most the ring's 4 of the next epoch). */
    uint64_t floor = field(t, "read_items") + 376 + 375;
    CHECK(kept + dropped >= floor);
    CHECK(kept + dropped <= floor + 4);
    free(t);
}

static void test_bad_path_fails_the_open(void)
{
    const char *src = records(10);
    stk_loader *l = NULL;
    tu_cfg c = {.path = src,
                .record = REC,
                .bs = 2,
                .options = {"trace", "/nonexistent-dir/trace.json", NULL}};
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EIO);
    CHECK(l && strstr(stk_loader_errmsg(l), "/nonexistent-dir/trace.json"));
    stk_loader_close(l);
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set(o, "trace_events", "100"), STK_EINVAL);
    CHECK_EQ(stk_options_set(o, "trace", ""), STK_OK); /* off */
    stk_options_destroy(o);
}

/* A path that holds something else (a dataset's manifest, a directory) is
 * refused at open with the reason, and left as it was (issue 24.3: the
 * manifest was truncated at open). */
static void test_refuses_a_target_that_is_not_a_trace(void)
{
    const char *src = records(10);
    const char *manifest = tu_path("ds/stoker.manifest");
    tu_mkdirs(tu_path("ds"));
    const char *text = "stoker-manifest 1\nshard-000000.stk 100\n";
    tu_write_file(manifest, text, strlen(text));
    stk_loader *l = NULL;
    tu_cfg c = {.path = src, .record = REC, .bs = 2, .options = {"trace", manifest, NULL}};
    CHECK_EQ(tu_open_cfg(&l, &c), STK_EINVAL);
    CHECK(l && strstr(stk_loader_errmsg(l), manifest) &&
          strstr(stk_loader_errmsg(l), "not a stoker trace"));
    stk_loader_close(l);
    char *now = read_text(manifest);
    CHECK(!strcmp(now, text));
    free(now);
    CHECK_EQ(count_prefixed(tu_path("ds"), "."), 2); /* "." and "..": no temporary file */

    const char *dir = tu_path("ds/adir");
    tu_mkdirs(dir);
    tu_cfg c2 = {.path = src, .record = REC, .bs = 2, .options = {"trace", dir, NULL}};
    l = NULL;
    CHECK_EQ(tu_open_cfg(&l, &c2), STK_EINVAL);
    CHECK(l && strstr(stk_loader_errmsg(l), "not a regular file"));
    stk_loader_close(l);
    struct stat st;
    CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
}

/* An earlier trace at the path stays whole while the loader runs (a killed
 * run leaves it as it was), and is replaced by the new one at close; an
 * empty file (what an interrupted older run left) may be replaced too. */
static void test_previous_trace_untouched_until_close(void)
{
    const char *src = records(40), *trace = tu_path("prev/t.json");
    tu_mkdirs(tu_path("prev"));
    uint64_t delivered;
    char *first = run(src, trace, "1M", 2, 1, &delivered);
    stk_loader *l = NULL;
    tu_cfg c = {
        .path = src, .record = REC, .bs = 8, .threads = 2, .options = {"trace", trace, NULL}};
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    while (stk_loader_next(l, &b) == STK_OK)
        stk_batch_release(b);
    char *during = read_text(trace);
    CHECK(!strcmp(during, first)); /* not truncated at open */
    /* The events go to one temporary file beside it. */
    CHECK_EQ(count_prefixed(tu_path("prev"), ".t.json."), 1);
    stk_loader_close(l);
    char *after = read_text(trace);
    CHECK(!strncmp(after, "{\"displayTimeUnit\"", 18));
    CHECK(strstr(after, "\n]}\n") != NULL);
    CHECK_EQ(count_prefixed(tu_path("prev"), ".t.json."), 0);
    free(first);
    free(during);
    free(after);

    tu_write_file(trace, "", 0);
    free(run(src, trace, "1M", 1, 1, &delivered));
    char *t = read_text(trace);
    CHECK(!strncmp(t, "{\"displayTimeUnit\"", 18));
    free(t);
}

/* The temporary file is never a name someone can plant a symlink at (issue
 * 18: PATH.tmp, opened following symlinks, let a link overwrite any file the
 * user can write). */
static void test_planted_symlink_not_followed(void)
{
    const char *src = records(20), *trace = tu_path("sym/t.json");
    tu_mkdirs(tu_path("sym"));
    const char *victim = tu_path("sym/victim");
    tu_write_file(victim, "precious", 8);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", trace);
    REQUIRE(symlink(victim, tmp) == 0);
    uint64_t delivered;
    free(run(src, trace, "1M", 1, 1, &delivered));
    char *v = read_text(victim);
    CHECK(!strcmp(v, "precious"));
    free(v);
    struct stat st;
    CHECK(lstat(tmp, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(trace, &st) == 0 && S_ISREG(st.st_mode));
}

/* Every allocation of an open with a trace may fail: the open fails with
 * STK_ENOMEM (or succeeds), nothing leaks, no temporary file stays behind
 * and the earlier trace at the path is left whole. */
static void test_allocation_failures_leave_nothing(void)
{
    char src[1024], trace[1024], dir[1024]; /* tu_path's buffers rotate */
    snprintf(src, sizeof src, "%s", records(16));
    snprintf(trace, sizeof trace, "%s", tu_path("oom/t.json"));
    snprintf(dir, sizeof dir, "%s", tu_path("oom"));
    tu_mkdirs(dir);
    uint64_t delivered;
    char *first = run(src, trace, "1M", 1, 1, &delivered);
    long live0 = stk__alloc_live();
    int fds0 = tu_count_fds();
    for (long n = 0; n < 2000; n++) {
        stk_options *o = NULL;
        REQUIRE(stk_options_create(&o) == STK_OK);
        REQUIRE(stk_options_set_source(o, src) == STK_OK);
        REQUIRE(stk_options_set_records(o, REC, 0, 0) == STK_OK);
        REQUIRE(stk_options_set_batch_size(o, 4) == STK_OK);
        REQUIRE(stk_options_set_threads(o, 1) == STK_OK);
        REQUIRE(stk_options_set(o, "trace", trace) == STK_OK);
        stk_loader *l = NULL;
        long c0 = stk__alloc_count();
        stk__alloc_fail_after(n);
        int rc = stk_loader_open(&l, o);
        stk__alloc_fail_after(-1);
        stk_options_destroy(o);
        bool injected = stk__alloc_count() - c0 > n;
        if (rc != STK_OK && rc != STK_ENOMEM)
            printf("    n=%ld: %s: %s\n", n, stk_strerror(rc), l ? stk_loader_errmsg(l) : "");
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        stk_loader_close(l);
        CHECK_EQ(stk__alloc_live(), live0);
        CHECK_EQ(tu_count_fds(), fds0);
        CHECK_EQ(count_prefixed(dir, ".t.json."), 0);
        if (rc != STK_OK) {
            char *now = read_text(trace);
            CHECK(!strcmp(now, first));
            free(now);
        }
        if (!injected)
            break;
    }
    free(first);
}

int main(void)
{
    tu_begin("test_trace", 120);
    RUN(test_complete_trace_matches_counters);
    RUN(test_ring_keeps_latest_and_counts_drops);
    RUN(test_bad_path_fails_the_open);
    RUN(test_refuses_a_target_that_is_not_a_trace);
    RUN(test_previous_trace_untouched_until_close);
    RUN(test_planted_symlink_not_followed);
    RUN(test_allocation_failures_leave_nothing);
    return tu_end();
}
