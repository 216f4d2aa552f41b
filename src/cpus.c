/*
 * cpus.c -- how many worker threads to start by default: the CPUs this
 * process may run on (its affinity mask, as `taskset` or a container's cpuset
 * leave it), capped by a cgroup CPU quota (v2 `cpu.max`, v1
 * `cpu.cfs_quota_us` / `cpu.cfs_period_us`; the tightest along the cgroup's
 * path), divided among the ranks that share the node (LOCAL_WORLD_SIZE, as
 * torchrun sets it). More threads than that only contend for the same CPUs.
 *
 * The files are read with fixed buffers (no allocation): open may run under
 * the allocation-failure sweep.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATH_BUF 4096
#define LINE_BUF 4096

/* Reads the start of a small text file into buf. Returns 0, or -1 if the file
 * cannot be read. */
static int read_small(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t k = fread(buf, 1, n - 1, f);
    int bad = ferror(f);
    fclose(f);
    buf[k] = '\0';
    return bad ? -1 : 0;
}

/* Parses a whole decimal integer (leading blanks, trailing newline allowed). */
static int parse_i64(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s)
        return -1;
    while (*end == ' ' || *end == '\n')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

/* Whether the comma-separated list [s, s + n) holds the token tok. */
static bool has_token(const char *s, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    const char *end = s + n;
    while (s < end) {
        const char *c = memchr(s, ',', (size_t)(end - s));
        size_t len = c ? (size_t)(c - s) : (size_t)(end - s);
        if (len == tl && !memcmp(s, tok, tl))
            return true;
        s += len + 1;
    }
    return false;
}

/* The cgroup path of this process in the v2 hierarchy (v2) or in the v1
 * hierarchy holding the cpu controller, from /proc/self/cgroup's
 * "id:controllers:path" lines. Returns 0 when found. */
static int cgroup_path(const char *proc_cgroup, bool v2, char *out, size_t n)
{
    FILE *f = fopen(proc_cgroup, "re");
    if (!f)
        return -1;
    char line[LINE_BUF];
    int rc = -1;
    while (rc && fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        bool match = v2 ? (c1 - line == 1 && line[0] == '0' && c2 == c1 + 1)
                        : has_token(c1 + 1, (size_t)(c2 - c1 - 1), "cpu");
        if (!match)
            continue;
        char *p = c2 + 1;
        p[strcspn(p, "\n")] = '\0';
        if (strlen(p) < n) {
            memcpy(out, p, strlen(p) + 1);
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

/* The mount of that hierarchy, from /proc/self/mountinfo's lines
 * "id parent dev root mountpoint options [tags] - fstype source superoptions":
 * its root (the cgroup path it shows) and mount point. Returns 0 when found. */
static int cgroup_mount(const char *mountinfo, bool v2, char *root, char *mnt, size_t n)
{
    FILE *f = fopen(mountinfo, "re");
    if (!f)
        return -1;
    char line[LINE_BUF];
    int rc = -1;
    while (rc && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *sep = strstr(line, " - ");
        if (!sep)
            continue;
        *sep = '\0';
        char *fstype = sep + 3, *src = strchr(fstype, ' ');
        char *super = src ? strchr(src + 1, ' ') : NULL;
        if (!super)
            continue;
        *src = '\0';
        super++;
        bool match = v2 ? !strcmp(fstype, "cgroup2")
                        : !strcmp(fstype, "cgroup") && has_token(super, strlen(super), "cpu");
        if (!match)
            continue;
        /* Fields 4 and 5 of the part before the separator. */
        char *fld[5] = {NULL};
        char *save = NULL, *t = strtok_r(line, " ", &save);
        for (int k = 0; t && k < 5; k++, t = strtok_r(NULL, " ", &save))
            fld[k] = t;
        if (!fld[3] || !fld[4] || strlen(fld[3]) >= n || strlen(fld[4]) >= n)
            continue;
        memcpy(root, fld[3], strlen(fld[3]) + 1);
        memcpy(mnt, fld[4], strlen(fld[4]) + 1);
        rc = 0;
    }
    fclose(f);
    return rc;
}

/* CPUs allowed by the quota files in directory dir (0: no limit there). */
static unsigned quota_at(const char *dir, bool v2)
{
    char path[PATH_BUF], buf[128];
    long long quota, period;
    if (v2) {
        stk__fmt(path, sizeof path, "%s/cpu.max", dir);
        if (read_small(path, buf, sizeof buf))
            return 0;
        char *sp = strchr(buf, ' ');
        if (!sp || !strncmp(buf, "max", 3))
            return 0;
        *sp = '\0';
        if (parse_i64(buf, &quota) || parse_i64(sp + 1, &period))
            return 0;
    } else {
        stk__fmt(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        if (read_small(path, buf, sizeof buf) || parse_i64(buf, &quota))
            return 0;
        stk__fmt(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (read_small(path, buf, sizeof buf) || parse_i64(buf, &period))
            return 0;
    }
    if (quota <= 0 || period <= 0)
        return 0;
    /* Rounded up, so a fractional CPU of quota is not left idle. */
    long long n = (quota + period - 1) / period;
    return n > UINT_MAX ? UINT_MAX : (unsigned)n;
}

/* The tightest quota of one hierarchy along the process's cgroup path, from
 * its own cgroup up to the mount's root. 0: no limit. */
static unsigned hierarchy_quota(const char *proc_cgroup, const char *mountinfo, bool v2)
{
    char path[PATH_BUF], root[PATH_BUF], mnt[PATH_BUF], dir[PATH_BUF];
    if (cgroup_path(proc_cgroup, v2, path, sizeof path) ||
        cgroup_mount(mountinfo, v2, root, mnt, sizeof mnt))
        return 0;
    /* The mount shows the subtree at `root`; a path outside it (another
     * cgroup namespace) leaves the mount point itself as the best guess. */
    size_t rl = strlen(root);
    const char *rel = "";
    if (!strcmp(root, "/"))
        rel = path;
    else if (!strncmp(path, root, rl) && (path[rl] == '/' || path[rl] == '\0'))
        rel = path + rl;
    stk__fmt(dir, sizeof dir, "%s%s", mnt, rel);
    size_t ml = strlen(mnt);
    unsigned best = 0;
    for (;;) {
        size_t dl = strlen(dir);
        while (dl > ml && dir[dl - 1] == '/')
            dir[--dl] = '\0';
        unsigned q = quota_at(dir, v2);
        if (q && (!best || q < best))
            best = q;
        if (dl <= ml)
            break;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < ml)
            break;
        *slash = '\0';
    }
    return best;
}

unsigned stk__cgroup_cpus(const char *proc_cgroup, const char *mountinfo)
{
    unsigned a = hierarchy_quota(proc_cgroup, mountinfo, true);
    unsigned b = hierarchy_quota(proc_cgroup, mountinfo, false);
    return !a ? b : !b ? a : a < b ? a : b;
}

int stk__default_threads(unsigned *out, char *err, size_t errlen)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n = online < 1 ? 1 : online > 65536 ? 65536 : (unsigned)online;
    cpu_set_t set;
    CPU_ZERO(&set);
    /* A machine with more CPUs than cpu_set_t holds fails with EINVAL; the
     * online count stands then. */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        n = (unsigned)CPU_COUNT(&set);
    unsigned q = stk__cgroup_cpus("/proc/self/cgroup", "/proc/self/mountinfo");
    if (q && q < n)
        n = q;
    const char *lws = getenv("LOCAL_WORLD_SIZE");
    if (lws && *lws) {
        long long ranks;
        if (parse_i64(lws, &ranks) || ranks < 1 || ranks > 1 << 20) {
            stk__fmt(err, errlen,
                     "LOCAL_WORLD_SIZE is '%.64s', not a whole number of ranks on this node "
                     "(1 or more); fix it, or set the thread count explicitly",
                     lws);
            return STK_EINVAL;
        }
        n /= (unsigned)ranks;
    }
    *out = n < 1 ? 1 : n > 256 ? 256 : n;
    return STK_OK;
}

uint64_t stk__mem_available(void)
{
    uint64_t kb = 0;
    FILE *f = fopen("/proc/meminfo", "re");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "MemAvailable:", 13))
                kb = strtoull(line + 13, NULL, 10);
        fclose(f);
    }
    return kb * 1024u;
}

/* The public face of stk__mem_available (include/stoker.h). */
uint64_t stk_mem_available(void)
{
    return stk__mem_available();
}

/* The public face of stk__default_threads (include/stoker.h). */
int stk_default_threads(unsigned *n)
{
    char err[128];
    if (!n)
        return STK_EINVAL;
    if (stk__default_threads(n, err, sizeof err) != STK_OK) {
        *n = 1;
        return STK_EINVAL;
    }
    return STK_OK;
}
