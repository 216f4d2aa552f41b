/* test_cpus.c -- the default thread count: one per CPU this process may use
 * (affinity mask, cgroup CPU quota), divided among the ranks of the node
 * (LOCAL_WORLD_SIZE); the cgroup v2/v1 quota reader on fake hierarchies. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

unsigned stk__cgroup_cpus(const char *proc_cgroup, const char *mountinfo);

static const char *g_records;

/* Opens a loader with the default thread count; returns the threads it
 * started, or 0 if open failed (the message is copied into msg). */
static unsigned default_threads(char *msg, size_t n)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, g_records) == STK_OK);
    REQUIRE(stk_options_set_records(o, 16, 0, 0) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, 4) == STK_OK);
    stk_loader *l;
    int rc = stk_loader_open(&l, o);
    stk_options_destroy(o);
    unsigned threads = 0;
    if (rc == STK_OK) {
        stk_info info = {.struct_size = sizeof info};
        REQUIRE(stk_loader_info(l, &info) == STK_OK);
        threads = info.threads;
        stk_batch *b;
        CHECK_EQ(stk_loader_next(l, &b), STK_OK);
        stk_batch_release(b);
    } else if (msg) {
        snprintf(msg, n, "%s", stk_loader_errmsg(l));
    }
    stk_loader_close(l);
    return threads;
}

/* What the default should be for this affinity mask. */
static unsigned expected(const cpu_set_t *set, unsigned ranks)
{
    unsigned n = (unsigned)CPU_COUNT(set);
    unsigned q = stk__cgroup_cpus("/proc/self/cgroup", "/proc/self/mountinfo");
    if (q && q < n)
        n = q;
    n /= ranks;
    return n < 1 ? 1 : n > 256 ? 256 : n;
}

/* taskset: a process restricted to one CPU starts one thread, not one per
 * online core; with its whole mask back, one per CPU of the mask. */
static void test_affinity(void)
{
    cpu_set_t all, one;
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    unsetenv("LOCAL_WORLD_SIZE");
    CHECK_EQ(default_threads(NULL, 0), expected(&all, 1));
    if (CPU_COUNT(&all) < 2) {
        printf("    only one CPU in the mask: the restriction cannot be shown here\n");
        return;
    }
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    CHECK_EQ(default_threads(NULL, 0), 1);
    REQUIRE(sched_setaffinity(0, sizeof all, &all) == 0);
    printf("    %d CPUs in the mask: %u threads; pinned to CPU %d: 1 thread\n", CPU_COUNT(&all),
           expected(&all, 1), first);
}

/* torchrun's LOCAL_WORLD_SIZE: the node's CPUs are shared among its ranks,
 * at least one thread each; a malformed value is an error naming it. */
static void test_local_world_size(void)
{
    cpu_set_t all;
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    static const unsigned ranks[] = {1, 2, 3, 8, 1000};
    for (size_t k = 0; k < 5; k++) {
        char v[16];
        snprintf(v, sizeof v, "%u", ranks[k]);
        setenv("LOCAL_WORLD_SIZE", v, 1);
        CHECK_EQ(default_threads(NULL, 0), expected(&all, ranks[k]));
    }
    if (CPU_COUNT(&all) >= 2 && !stk__cgroup_cpus("/proc/self/cgroup", "/proc/self/mountinfo")) {
        setenv("LOCAL_WORLD_SIZE", "2", 1);
        CHECK_EQ(default_threads(NULL, 0), (unsigned)CPU_COUNT(&all) / 2);
    }
    static const char *const bad[] = {"x", "0", "-2", "2x", "99999999999999999999"};
    for (size_t k = 0; k < 5; k++) {
        char msg[512] = "";
        setenv("LOCAL_WORLD_SIZE", bad[k], 1);
        CHECK_EQ(default_threads(msg, sizeof msg), 0);
        CHECK(strstr(msg, "LOCAL_WORLD_SIZE") != NULL && strstr(msg, bad[k]) != NULL);
    }
    /* An explicit thread count does not look at it. */
    setenv("LOCAL_WORLD_SIZE", "x", 1);
    tu_cfg c = {.path = g_records, .record = 16, .threads = 3};
    stk_loader *l;
    CHECK_EQ(tu_open_cfg(&l, &c), STK_OK);
    stk_loader_close(l);
    unsetenv("LOCAL_WORLD_SIZE");
}

/* ---- cgroup quota reader ------------------------------------------------ */

static void put(const char *dir, const char *name, const char *text)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    tu_write_file(p, text, strlen(text));
}

static unsigned quota(const char *cgroup, const char *mountinfo)
{
    put(tu_tmpdir(), "cgroup", cgroup);
    put(tu_tmpdir(), "mountinfo", mountinfo);
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/cgroup", tu_tmpdir());
    snprintf(b, sizeof b, "%s/mountinfo", tu_tmpdir());
    return stk__cgroup_cpus(a, b);
}

static void test_cgroup_v2(void)
{
    char mnt[1024], mi[4096], d[1200];
    snprintf(mnt, sizeof mnt, "%s/cg2", tu_tmpdir());
    snprintf(d, sizeof d, "%s/a/b", mnt);
    tu_mkdirs(d);
    snprintf(mi, sizeof mi,
             "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw\n"
             "40 30 0:37 / %s rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
             mnt);
    const char *cg = "0::/a/b\n";
    CHECK_EQ(quota(cg, mi), 0); /* no cpu.max anywhere */
    put(d, "cpu.max", "max 100000\n");
    CHECK_EQ(quota(cg, mi), 0);
    snprintf(d, sizeof d, "%s/a", mnt);
    put(d, "cpu.max", "250000 100000\n");
    CHECK_EQ(quota(cg, mi), 3); /* 2.5 CPUs, from the parent, rounded up */
    snprintf(d, sizeof d, "%s/a/b", mnt);
    put(d, "cpu.max", "100000 100000\n");
    CHECK_EQ(quota(cg, mi), 1); /* the tightest along the path */
    put(d, "cpu.max", "5000 100000\n");
    CHECK_EQ(quota(cg, mi), 1); /* a fraction of one CPU is still one */
    put(d, "cpu.max", "garbage\n");
    CHECK_EQ(quota(cg, mi), 3);
    /* In a cgroup namespace the mount's root is the process's cgroup. */
    snprintf(mi, sizeof mi, "40 30 0:37 /a %s rw - cgroup2 cgroup2 rw\n", mnt);
    snprintf(d, sizeof d, "%s", mnt);
    put(d, "cpu.max", "400000 100000\n");
    CHECK_EQ(quota("0::/a\n", mi), 4);
    CHECK_EQ(quota("0::/\n", mi), 4);
    /* Unreadable inputs: no limit. */
    CHECK_EQ(stk__cgroup_cpus("/nonexistent/cgroup", "/nonexistent/mountinfo"), 0);
}

static void test_cgroup_v1(void)
{
    char mnt[1024], mi[4096], d[1200];
    snprintf(mnt, sizeof mnt, "%s/cpu,cpuacct", tu_tmpdir());
    snprintf(d, sizeof d, "%s/job/step", mnt);
    tu_mkdirs(d);
    snprintf(mi, sizeof mi,
             "31 30 0:28 / %s/memory rw,relatime - cgroup cgroup rw,memory\n"
             "32 30 0:29 / %s rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
             "40 30 0:37 / %s/unified rw - cgroup2 cgroup2 rw\n",
             tu_tmpdir(), mnt, tu_tmpdir());
    const char *cg = "4:memory:/other\n3:cpu,cpuacct:/job/step\n0::/\n";
    put(d, "cpu.cfs_quota_us", "-1\n");
    put(d, "cpu.cfs_period_us", "100000\n");
    CHECK_EQ(quota(cg, mi), 0);
    put(d, "cpu.cfs_quota_us", "150000\n");
    CHECK_EQ(quota(cg, mi), 2);
    snprintf(d, sizeof d, "%s/job", mnt);
    put(d, "cpu.cfs_quota_us", "50000\n");
    put(d, "cpu.cfs_period_us", "100000\n");
    CHECK_EQ(quota(cg, mi), 1);
    /* "cpuacct" alone is not the cpu controller. */
    CHECK_EQ(quota("3:cpuacct:/job/step\n", mi), 0);
}

int main(void)
{
    tu_begin("test_cpus", 120);
    static char p[1024];
    snprintf(p, sizeof p, "%s/rec.bin", tu_tmpdir());
    static uint8_t rec[16 * 64];
    tu_write_file(p, rec, sizeof rec);
    g_records = p;
    RUN(test_affinity);
    RUN(test_local_world_size);
    RUN(test_cgroup_v2);
    RUN(test_cgroup_v1);
    return tu_end();
}
