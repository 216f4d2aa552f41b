/*
 * unpack.c -- a reader's private temporary area for decompressed files
 * (unpack.h): the area, the codecs, the size and hash checks.
 */
#include "source/unpack.h"
#include "source/source.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

/* Where a decoder puts its output: the copy, bounded by want, hashed. */
typedef struct unpack_out {
    int fd;
    uint64_t want, got;
    const char *want_from;
    XXH64_state_t *hs;
} unpack_out;

/* Writes n decompressed bytes to the copy; refuses more than want. */
static int put(unpack_out *o, const void *p, size_t n, char *why, size_t wn)
{
    if (n > o->want - o->got) {
        stk__fmt(why, wn, "decompresses to more than the %" PRIu64 " bytes index.json gives (%s)",
                 o->want, o->want_from);
        return STK_EFORMAT;
    }
    if (n && stk__write_full(o->fd, p, n)) {
        stk__fmt(why, wn, "cannot write its decompressed copy: %s", strerror(errno));
        return STK_EIO;
    }
    XXH64_update(o->hs, p, n);
    o->got += n;
    return STK_OK;
}

/* A codec's decoder: decompresses zfd's stream through put(); *ended says
 * whether the stream ended where the file did (false: cut off). */
typedef int (*decode_fn)(int zfd, unpack_out *o, bool *ended, char *why, size_t wn);

static int decode_zstd(int zfd, unpack_out *o, bool *ended, char *why, size_t wn)
{
    /* zstd's own allocator: its custom-allocator API is in the experimental
     * part of zstd.h, which a shared libzstd does not promise to keep. */
    ZSTD_DStream *zs = ZSTD_createDStream();
    size_t inc = ZSTD_DStreamInSize(), outc = ZSTD_DStreamOutSize();
    uint8_t *ib = stk__malloc(inc), *ob = stk__malloc(outc);
    uint64_t at = 0;
    size_t last = 1;
    int rc = STK_OK;
    if (!zs || !ib || !ob) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t r = stk__pread(zfd, ib, inc, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            stk__fmt(why, wn, "read failed at offset %" PRIu64 ": %s", at, strerror(errno));
            rc = STK_EIO;
            goto out;
        }
        if (r == 0)
            break;
        at += (uint64_t)r;
        ZSTD_inBuffer in = {ib, (size_t)r, 0};
        while (in.pos < in.size) {
            ZSTD_outBuffer out = {ob, outc, 0};
            last = ZSTD_decompressStream(zs, &out, &in);
            if (ZSTD_isError(last)) {
                stk__fmt(why, wn, "not a valid zstd stream (near compressed byte %" PRIu64 "): %s",
                         at - (uint64_t)r + in.pos, ZSTD_getErrorName(last));
                rc = STK_EFORMAT;
                goto out;
            }
            if ((rc = put(o, ob, out.pos, why, wn)))
                goto out;
        }
    }
    *ended = last == 0;
out:
    ZSTD_freeDStream(zs);
    stk__free(ib);
    stk__free(ob);
    return rc;
}

/* The codecs, by enum stk__codec: a new one is a row here. */
static const struct {
    const char *name;
    decode_fn decode;
} k_codecs[] = {[STK__CODEC_ZSTD] = {"zstd", decode_zstd}};

/* Decompresses zfd into ofd: exactly j->want bytes, with j->xxh64 if given. */
static int decompress(const stk__unpack_job *j, int zfd, int ofd, char *why, size_t wn)
{
    unpack_out o = {ofd, j->want, 0, j->want_from, XXH64_createState()};
    bool ended = false;
    if (!o.hs || XXH64_reset(o.hs, 0) != XXH_OK) {
        if (o.hs)
            XXH64_freeState(o.hs);
        return STK_ENOMEM;
    }
    int rc = k_codecs[j->codec].decode(zfd, &o, &ended, why, wn);
    if (!rc && (!ended || o.got != o.want)) {
        char what[64];
        stk__fmt(what, sizeof what, "the %s stream is cut off (truncated?)",
                 k_codecs[j->codec].name);
        stk__fmt(why, wn, "%s: %" PRIu64 " bytes decompressed, index.json gives %" PRIu64,
                 ended ? "wrong size" : what, o.got, o.want);
        rc = STK_EFORMAT;
    }
    if (!rc && j->xxh64) {
        char hex[17];
        stk__fmt(hex, sizeof hex, "%016llx", (unsigned long long)XXH64_digest(o.hs));
        if (strcmp(hex, j->xxh64)) {
            stk__fmt(why, wn, "its decompressed bytes have xxh64 %s, index.json gives %.20s", hex,
                     j->xxh64);
            rc = STK_EFORMAT;
        }
    }
    XXH64_freeState(o.hs);
    return rc;
}

/* The private directory, made once; checks the free space first. */
static int make_area(stk__unpack_area *a, uint64_t need, char *err, size_t errlen)
{
    if (a->dir)
        return STK_OK;
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    struct statvfs vf;
    if (statvfs(base, &vf) == 0 && (uint64_t)vf.f_bavail * vf.f_frsize < need) {
        stk__fmt(err, errlen,
                 "decompressing %s needs %" PRIu64 " bytes in %s, which has %" PRIu64
                 " free: set TMPDIR to a larger disk%s",
                 a->what, need, base, (uint64_t)vf.f_bavail * vf.f_frsize, a->hint);
        return STK_EIO;
    }
    char tmpl[4096];
    stk__fmt(tmpl, sizeof tmpl, "%s/stoker-%s-XXXXXX", base, a->tag);
    if (!mkdtemp(tmpl)) {
        stk__fmt(err, errlen, "cannot make a temporary directory in %s: %s", base, strerror(errno));
        return STK_EIO;
    }
    if (!(a->dir = stk__strdup(tmpl))) {
        (void)rmdir(tmpl);
        return STK_ENOMEM;
    }
    return STK_OK;
}

int stk__unpack(stk__unpack_area *a, const stk__unpack_job *j, char **path, uint64_t *stored,
                char *err, size_t errlen)
{
    *path = NULL;
    int rc = make_area(a, j->need, err, errlen);
    if (rc)
        return rc;
    size_t pl = strlen(a->dir) + strlen(j->name) + 2;
    char *p = stk__malloc(pl);
    if (!p)
        return STK_ENOMEM;
    stk__fmt(p, pl, "%s/%s", a->dir, j->name);
    int zfd = stk__open(j->local ? j->local : j->src, O_RDONLY | O_CLOEXEC), ofd = -1;
    struct stat st;
    if (zfd < 0 || stk__fstat(zfd, &st) != 0) {
        int e = errno;
        stk__fmt(err, errlen, "%s: %s", j->src, strerror(e));
        rc = zfd < 0 && e == ENOENT ? STK_ENOENT : STK_EIO;
        goto out;
    }
    *stored = (uint64_t)st.st_size;
    if ((ofd = stk__open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
        stk__fmt(err, errlen, "%s: cannot create %s: %s", j->src, p, strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    char why[STK_ERRMSG_MAX];
    if ((rc = decompress(j, zfd, ofd, why, sizeof why)))
        stk__fmt(err, errlen, "%s: %s", j->src, why);
out:
    if (zfd >= 0)
        stk__close(zfd);
    if (ofd >= 0)
        stk__close(ofd);
    if (rc)
        stk__free(p); /* a partial copy stays in the area until stk__unpack_remove */
    else
        *path = p;
    return rc;
}

/* Straight through libc, not the file layer: a close has no one to report a
 * failure to, and a fault injected here would only leave the area behind.
 * The directory is private (mkdtemp), so all it holds is ours. */
void stk__unpack_remove(stk__unpack_area *a)
{
    if (!a->dir)
        return;
    DIR *dp = opendir(a->dir);
    if (dp) {
        int dfd = dirfd(dp);
        for (struct dirent *e; (e = readdir(dp));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                (void)unlinkat(dfd, e->d_name, 0);
        closedir(dp);
    }
    (void)rmdir(a->dir);
    stk__free(a->dir);
    a->dir = NULL;
}
