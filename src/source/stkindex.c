/*
 * stkindex.c -- the consolidated index (stoker.index, docs/format.md): its
 * parser, the per-shard checks, and its writer.
 *
 * Layout (all integers little-endian):
 *   header, 64 bytes: magic "STKINDEX", u16 version 1, u16 minor 0, u32 0,
 *     u64 nshards, u64 samples, u64 names_bytes, u64 file size, u64 0,
 *     u64 XXH3-64 of bytes 0..55
 *   shard table, 32 bytes a shard: u64 shard size, u64 count,
 *     u64 region bytes, u32 name length, u32 0
 *   names, back to back; zeros to a multiple of 8
 *   per shard: its header (64), its footer (64), its index region, zeros to
 *     a multiple of 8
 *   trailer, 16 bytes: u64 XXH3-64 of every byte before it, "STKIEND\n"
 * The shards' parts are copies of their own bytes, so a reader checks them
 * exactly as it checks a shard it opens, and no second encoding of an entry
 * exists to drift from the first.
 */
#include "source/stkindex.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t pad8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

void stk__stkindex_free(stk__stkindex *ix)
{
    if (!ix)
        return;
    stk__free(ix->sh);
    memset(ix, 0, sizeof *ix);
}

int stk__stkindex_parse(const uint8_t *p, size_t n, stk__stkindex *ix, char *err, size_t errlen)
{
    int rc = STK_OK;
    memset(ix, 0, sizeof *ix);
    if (n < STK_INDEX_HEAD + STK_INDEX_TRAILER) {
        stk__fmt(err, errlen, "%zu bytes is too short for an index (truncated)", n);
        return STK_EFORMAT;
    }
    if (memcmp(p, STK_INDEX_MAGIC, 8)) {
        stk__fmt(err, errlen, "not a stoker index (bad magic)");
        return STK_EFORMAT;
    }
    if (stk__xxh3(p, 56) != stk__get64(p + 56)) {
        stk__fmt(err, errlen, "index header checksum mismatch (corrupt)");
        return STK_EFORMAT;
    }
    if (stk__get16(p + 8) != STK_INDEX_VERSION) {
        stk__fmt(err, errlen, "index version %u; this stoker reads version %d", stk__get16(p + 8),
                 STK_INDEX_VERSION);
        return STK_EFORMAT;
    }
    uint64_t ns = stk__get64(p + 16), samples = stk__get64(p + 24);
    uint64_t names_bytes = stk__get64(p + 32), fsize = stk__get64(p + 40);
    if (fsize != n) {
        stk__fmt(err, errlen, "index of %zu bytes says it has %llu (truncated or extended)", n,
                 (unsigned long long)fsize);
        return STK_EFORMAT;
    }
    /* The trailer's checksum covers everything, so nothing below is a
     * corruption in transit: what is checked after it is a lying writer. */
    const uint8_t *tr = p + n - STK_INDEX_TRAILER;
    if (memcmp(tr + 8, STK_INDEX_END, 8)) {
        stk__fmt(err, errlen, "index trailer missing (truncated)");
        return STK_EFORMAT;
    }
    ix->sum = stk__xxh3(p, n - STK_INDEX_TRAILER);
    if (ix->sum != stk__get64(tr)) {
        stk__fmt(err, errlen, "index checksum mismatch (corrupt)");
        return STK_EFORMAT;
    }
    /* Each shard takes at least its record, a name byte, header and footer. */
    uint64_t body = n - STK_INDEX_HEAD - STK_INDEX_TRAILER;
    if (!ns || ns > body / (STK_INDEX_REC + 1 + STK_HEADER_SIZE + STK_FOOTER_SIZE) ||
        names_bytes > body) {
        stk__fmt(err, errlen,
                 "index says %llu shards and %llu bytes of names: more than its %zu "
                 "bytes hold",
                 (unsigned long long)ns, (unsigned long long)names_bytes, n);
        return STK_EFORMAT;
    }
    uint64_t at = STK_INDEX_HEAD + ns * STK_INDEX_REC;
    uint64_t names_at = at;
    at = pad8(at + names_bytes);
    if (at > n - STK_INDEX_TRAILER) {
        stk__fmt(err, errlen, "index shard table and names run past its end");
        return STK_EFORMAT;
    }
    if (!(ix->sh = stk__calloc((size_t)ns, sizeof *ix->sh))) {
        rc = STK_ENOMEM;
        goto out;
    }
    ix->n = (size_t)ns;
    uint64_t name_off = 0, total = 0;
    for (size_t k = 0; k < ix->n; k++) {
        const uint8_t *r = p + STK_INDEX_HEAD + k * STK_INDEX_REC;
        stk__stkindex_shard *s = &ix->sh[k];
        s->bytes = stk__get64(r);
        s->count = stk__get64(r + 8);
        uint64_t rlen = stk__get64(r + 16);
        uint32_t nl = stk__get32(r + 24);
        if (stk__get32(r + 28) || !nl || nl > STK_KEY_MAX || nl > names_bytes - name_off) {
            stk__fmt(err, errlen, "index shard %zu: bad record (name of %u bytes)", k, nl);
            rc = STK_EFORMAT;
            goto out;
        }
        s->name = (const char *)p + names_at + name_off;
        s->name_len = nl;
        name_off += nl;
        if (memchr(s->name, '/', nl) || memchr(s->name, '\0', nl)) {
            stk__fmt(err, errlen, "index shard %zu: its name is not a plain file name", k);
            rc = STK_EFORMAT;
            goto out;
        }
        /* The region's size follows from the shard's: checked again
         * against the footer by stk__stkindex_check_shard. */
        if (s->bytes < STK_HEADER_SIZE + STK_FOOTER_SIZE ||
            rlen > s->bytes - STK_HEADER_SIZE - STK_FOOTER_SIZE ||
            rlen > n - STK_INDEX_TRAILER - at ||
            STK_HEADER_SIZE + STK_FOOTER_SIZE > n - STK_INDEX_TRAILER - at - rlen) {
            stk__fmt(err, errlen,
                     "index shard %zu: a shard of %llu bytes with an index region of %llu bytes "
                     "does not fit the index",
                     k, (unsigned long long)s->bytes, (unsigned long long)rlen);
            rc = STK_EFORMAT;
            goto out;
        }
        s->hdr = p + at;
        s->foot = p + at + STK_HEADER_SIZE;
        s->region = p + at + STK_HEADER_SIZE + STK_FOOTER_SIZE;
        s->region_len = (size_t)rlen;
        at = pad8(at + STK_HEADER_SIZE + STK_FOOTER_SIZE + rlen);
        if (s->count > UINT64_MAX - total) {
            stk__fmt(err, errlen, "index shard %zu: sample counts overflow", k);
            rc = STK_EFORMAT;
            goto out;
        }
        total += s->count;
    }
    if (name_off != names_bytes || at != n - STK_INDEX_TRAILER || total != samples) {
        stk__fmt(err, errlen,
                 "index sizes do not add up (names %llu of %llu bytes, parts end at %llu of %zu, "
                 "%llu samples of %llu)",
                 (unsigned long long)name_off, (unsigned long long)names_bytes,
                 (unsigned long long)at, n - STK_INDEX_TRAILER, (unsigned long long)total,
                 (unsigned long long)samples);
        rc = STK_EFORMAT;
        goto out;
    }
    ix->samples = samples;
out:
    if (rc)
        stk__stkindex_free(ix);
    return rc;
}

int stk__stkindex_check_shard(const stk__stkindex_shard *s, stk__stk_header *h, stk__stk_footer *f,
                              int64_t *max_label, char *err, size_t errlen)
{
    int rc;
    if ((rc = stk__stk_header_decode(s->hdr, h, err, errlen)) ||
        (rc = stk__stk_footer_decode(s->foot, s->bytes, f, err, errlen)))
        return rc;
    if (s->bytes - STK_FOOTER_SIZE - f->index_offset != s->region_len || f->count != s->count) {
        stk__fmt(err, errlen,
                 "the index's record (%zu bytes of region, %llu samples) disagrees with the "
                 "shard's footer (%llu, %llu)",
                 s->region_len, (unsigned long long)s->count,
                 (unsigned long long)(s->bytes - STK_FOOTER_SIZE - f->index_offset),
                 (unsigned long long)f->count);
        return STK_EFORMAT;
    }
    if (stk__xxh3(s->region, s->region_len) != f->index_sum) {
        stk__fmt(err, errlen, "index checksum mismatch (corrupt index)");
        return STK_EFORMAT;
    }
    return stk__stk_index_check(s->region, f, h, max_label, err, errlen);
}

/* Reads the header, footer and region of shard DIR/name (of `bytes` bytes
 * as the manifest says) onto the end of *buf (*len used, *cap allocated). */
static int append_shard(const char *dir, const stk__manifest_shard *ms, uint8_t **buf, size_t *len,
                        size_t *cap, char *err, size_t errlen)
{
    int rc = STK_OK;
    char path[4096], why[STK_ERRMSG_MAX];
    stk__fmt(path, sizeof path, "%s/%s", dir, ms->name);
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        stk__fmt(err, errlen, "%s: cannot read back for the index: %s", path, strerror(errno));
        return STK_EIO;
    }
    uint8_t ends[STK_HEADER_SIZE + STK_FOOTER_SIZE];
    stk__stk_footer f;
    if (ms->bytes < sizeof ends) {
        stk__fmt(err, errlen, "%s: %llu bytes is too short for a shard", path,
                 (unsigned long long)ms->bytes);
        rc = STK_EFORMAT;
        goto out;
    }
    if ((rc = stk__pread_full(fd, ends, STK_HEADER_SIZE, 0, why, sizeof why)) ||
        (rc = stk__pread_full(fd, ends + STK_HEADER_SIZE, STK_FOOTER_SIZE,
                              ms->bytes - STK_FOOTER_SIZE, why, sizeof why)) ||
        (rc = stk__stk_footer_decode(ends + STK_HEADER_SIZE, ms->bytes, &f, why, sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", path, why);
        goto out;
    }
    uint64_t rlen = ms->bytes - STK_FOOTER_SIZE - f.index_offset;
    size_t need = *len + sizeof ends + (size_t)pad8(rlen);
    if ((rc = stk__grow((void **)buf, cap, need, 1))) {
        stk__fmt(err, errlen, "out of memory for the index");
        goto out;
    }
    memcpy(*buf + *len, ends, sizeof ends);
    memset(*buf + *len + sizeof ends, 0, (size_t)pad8(rlen));
    if ((rc = stk__pread_full(fd, *buf + *len + sizeof ends, (size_t)rlen, f.index_offset, why,
                              sizeof why))) {
        stk__fmt(err, errlen, "%s: %s", path, why);
        goto out;
    }
    *len = need;
out:
    stk__close(fd);
    return rc;
}

int stk__stkindex_build(const char *dir, const stk__manifest *m, uint8_t **out, size_t *out_len,
                        uint64_t *sum, char *err, size_t errlen)
{
    int rc = STK_OK;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    uint64_t names_bytes = 0, samples = 0;
    for (size_t k = 0; k < m->nshards; k++) {
        names_bytes += strlen(m->shards[k].name);
        samples += m->shards[k].count;
    }
    size_t head = (size_t)pad8(STK_INDEX_HEAD + m->nshards * STK_INDEX_REC + names_bytes);
    if ((rc = stk__grow((void **)&buf, &cap, head, 1))) {
        stk__fmt(err, errlen, "out of memory for the index");
        goto out;
    }
    memset(buf, 0, head);
    size_t nat = STK_INDEX_HEAD + m->nshards * STK_INDEX_REC;
    len = head;
    for (size_t k = 0; k < m->nshards; k++) {
        size_t before = len;
        if ((rc = append_shard(dir, &m->shards[k], &buf, &len, &cap, err, errlen)))
            goto out;
        /* The region's exact length: the part less header, footer and the
         * padding append_shard added. */
        uint64_t rlen = m->shards[k].bytes - STK_FOOTER_SIZE -
                        stk__get64(buf + before + STK_HEADER_SIZE); /* footer: index_offset */
        uint8_t *r = buf + STK_INDEX_HEAD + k * STK_INDEX_REC;
        size_t nl = strlen(m->shards[k].name);
        stk__put64(r, m->shards[k].bytes);
        stk__put64(r + 8, m->shards[k].count);
        stk__put64(r + 16, rlen);
        stk__put32(r + 24, (uint32_t)nl);
        stk__put32(r + 28, 0);
        memcpy(buf + nat, m->shards[k].name, nl);
        nat += nl;
    }
    if ((rc = stk__grow((void **)&buf, &cap, len + STK_INDEX_TRAILER, 1))) {
        stk__fmt(err, errlen, "out of memory for the index");
        goto out;
    }
    memcpy(buf, STK_INDEX_MAGIC, 8);
    stk__put16(buf + 8, STK_INDEX_VERSION);
    stk__put16(buf + 10, 0);
    stk__put32(buf + 12, 0);
    stk__put64(buf + 16, m->nshards);
    stk__put64(buf + 24, samples);
    stk__put64(buf + 32, names_bytes);
    stk__put64(buf + 40, len + STK_INDEX_TRAILER);
    stk__put64(buf + 48, 0);
    stk__put64(buf + 56, stk__xxh3(buf, 56));
    *sum = stk__xxh3(buf, len);
    stk__put64(buf + len, *sum);
    memcpy(buf + len + 8, STK_INDEX_END, 8);
    len += STK_INDEX_TRAILER;
    *out = buf;
    *out_len = len;
    buf = NULL;
out:
    stk__free(buf);
    return rc;
}

int stk__stkindex_write(const char *dir, const stk__manifest *m, uint64_t *bytes, uint64_t *sum,
                        char *err, size_t errlen)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int fd = -1;
    char path[4096], tmp[4200];
    stk__fmt(path, sizeof path, "%s/%s", dir, STK_INDEX_NAME);
    stk__fmt(tmp, sizeof tmp, "%s.tmp", path);
    int rc = stk__stkindex_build(dir, m, &buf, &len, sum, err, errlen);
    if (rc)
        return rc;
    *bytes = len;
    fd = stk__open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || stk__write_full(fd, buf, len) != STK_OK || stk__fsync(fd) != 0) {
        stk__fmt(err, errlen, "%s: cannot write: %s", tmp, strerror(errno ? errno : EIO));
        rc = STK_EIO;
        goto out;
    }
    int cr = stk__close(fd);
    fd = -1;
    if (cr != 0 || rename(tmp, path) != 0) {
        stk__fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    /* Durable before the manifest that names it is. */
    stk__fsync_parent(path);
out:
    if (fd >= 0)
        stk__close(fd);
    if (rc)
        stk__unlink(tmp);
    stk__free(buf);
    return rc;
}
