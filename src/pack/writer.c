/*
 * writer.c -- the output directory of a pack and the shards written into it,
 * for stk_writer (include/stoker.h) and for stk_pack, which writes through
 * the same writer (pack.h).
 *
 * Shards: part-NNNNNN.stk, one at a time, each ended when the next payload
 * would take it past shard_size, each recorded in the manifest with its
 * count and size. Each is written to NAME.tmp, fsynced and renamed
 * (stkformat.c); then the consolidated index of them all (stoker.index,
 * stkindex.c), and the manifest comes last.
 *
 * Crash safety: the empty marker OUT/.stoker-pack-incomplete exists from
 * before the first shard until after the manifest, and a reader refuses a
 * directory with the marker and no manifest (stk__pack_unfinished, the one
 * check both use). A writer that fails or is closed unfinished takes back
 * what it wrote, so running it again just works.
 *
 * Every file call goes through src/io/file.h, so the fault sweep of
 * tests/c/test_iofault.c reaches it.
 */
#include "io/file.h"
#include "pack/pack.h"
#include "source/stkindex.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

double stk__pack_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- The directory ------------------------------------------------------ */

/* Checks that out (a directory that exists) holds neither a packed dataset
 * nor an interrupted pack. */
static int check_out_dir(const char *out, char *err, size_t errlen)
{
    struct stat st;
    if (stk__stat(out, &st) != 0) {
        stk__fmt(err, errlen, "%s: cannot read: %s", out, strerror(errno));
        return STK_EIO;
    }
    if (!S_ISDIR(st.st_mode)) {
        stk__fmt(err, errlen, "%s: exists and is not a directory", out);
        return STK_EINVAL;
    }
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, STK_MANIFEST);
    bool manifest = stk__stat(path, &st) == 0;
    if (!manifest && errno != ENOENT) {
        stk__fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        return STK_EIO;
    }
    if (!manifest && stk__pack_unfinished(out)) {
        stk__fmt(err, errlen,
                 "%s holds an interrupted pack (no manifest, and the marker %s or a *.stk.tmp "
                 "file is there): its shards are incomplete; remove the directory and run stoker "
                 "pack again",
                 out, STK_PACK_MARKER);
        return STK_EINVAL;
    }
    stk__fmt(path, sizeof path, "%s/part-000000.stk", out);
    bool shard = !manifest && stk__stat(path, &st) == 0;
    if (!manifest && !shard && errno != ENOENT) {
        stk__fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        return STK_EIO;
    }
    if (manifest || shard) {
        stk__fmt(err, errlen,
                 "%s already holds a packed dataset; remove it or choose another "
                 "directory",
                 out);
        return STK_EINVAL;
    }
    return STK_OK;
}

/* The output directory's writer lock: a file inside it that a writer (or a
 * pack) holds flock()ed for as long as it writes there, so that a second one
 * is told another writer is at work, instead of taking the live writer's
 * marker for an interrupted pack and being told to remove the directory. The
 * holder removes the file when done, while still holding it; a process that
 * dies loses its flock with it, so a file left behind never blocks anyone.
 * Taking the lock checks that the file locked is still the one at the path:
 * if its holder removed it meanwhile, the next try takes the new file. */
#define OUT_LOCK ".stoker-pack.lock"

/* Takes the writer lock of out (which exists) into *fd. STK_OK, STK_EBUSY
 * (another writer holds it), STK_EIO. */
static int take_lock(const char *out, int *fd, char *err, size_t errlen)
{
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, OUT_LOCK);
    for (int tries = 0; tries < 64; tries++) {
        int f = stk__open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (f < 0) {
            stk__fmt(err, errlen, "%s: cannot create the writer lock %s: %s", out, path,
                     strerror(errno));
            return STK_EIO;
        }
        if (stk__flock(f, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            stk__close(f);
            if (e == EWOULDBLOCK) {
                stk__fmt(err, errlen,
                         "%s is in use by another stoker writer or pack, which is still "
                         "writing there (it holds %s); wait for it to finish, or choose another "
                         "directory",
                         out, path);
                return STK_EBUSY;
            }
            stk__fmt(err, errlen, "%s: cannot lock %s: %s", out, path, strerror(e));
            return STK_EIO;
        }
        struct stat a, b;
        if (stk__fstat(f, &a) == 0 && stk__stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            *fd = f;
            return STK_OK;
        }
        stk__close(f); /* removed by its holder after we opened it: take the new one */
    }
    stk__fmt(err, errlen, "%s: cannot take the writer lock %s: it keeps being replaced", out, path);
    return STK_EIO;
}

/* Creates out if missing (*created) and takes its writer lock into *fd. */
static int out_lock(const char *out, bool *created, int *fd, char *err, size_t errlen)
{
    struct stat st;
    *fd = -1;
    if (stk__stat(out, &st) != 0) {
        if (stk__mkdir(out, 0755) == 0) {
            *created = true;
        } else if (errno != EEXIST) {
            stk__fmt(err, errlen, "%s: cannot create: %s", out, strerror(errno));
            return STK_EIO;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        stk__fmt(err, errlen, "%s: exists and is not a directory", out);
        return STK_EINVAL;
    }
    return take_lock(out, fd, err, errlen);
}

/* Gives the writer lock back (removing its file first, see OUT_LOCK). */
static void out_unlock(const char *out, int *fd)
{
    if (*fd < 0)
        return;
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, OUT_LOCK);
    stk__unlink(path);
    stk__close(*fd);
    *fd = -1;
}

/* Creates the marker durably (file and directory entry fsynced). */
static int marker_on(const char *out, char *err, size_t errlen)
{
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, STK_PACK_MARKER);
    int fd = stk__open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        stk__fmt(err, errlen, "%s: cannot write: %s", out, strerror(errno));
        return STK_EIO;
    }
    int rc = stk__fsync(fd) == 0 ? STK_OK : STK_EIO;
    if (rc)
        stk__fmt(err, errlen, "%s: cannot write %s: %s", out, path, strerror(errno));
    stk__close(fd);
    int dfd = rc ? -1 : stk__open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (stk__fsync(dfd) != 0) {
            stk__fmt(err, errlen, "%s: cannot write: %s", out, strerror(errno));
            rc = STK_EIO;
        }
        stk__close(dfd);
    }
    if (rc)
        stk__unlink(path);
    return rc;
}

static int marker_off(const char *out)
{
    char path[4096];
    stk__fmt(path, sizeof path, "%s/%s", out, STK_PACK_MARKER);
    return stk__unlink(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* ---- The shards ---------------------------------------------------------- */

/* Gives the shard being written its field table: every name known so far
 * (a later shard's table extends an earlier one's), with the counts of this
 * shard's samples. */
static int put_field_table(stk_writer *w)
{
    stk__stk_fdesc fd[STK__MAX_FIELDS];
    for (size_t k = 0; k < w->nfname; k++)
        fd[k] = (stk__stk_fdesc){(const uint8_t *)w->fname[k], strlen(w->fname[k]), w->fkind[k],
                                 w->fshard[k]};
    size_t n = stk__stk_ftable_size(fd, w->nfname);
    uint8_t *t = stk__malloc(n);
    if (!t)
        return STK_ENOMEM;
    stk__stk_ftable_encode(t, fd, w->nfname);
    int rc = stk__stkw_set_tail(w->sw, t, n);
    stk__free(t);
    memset(w->fshard, 0, sizeof w->fshard);
    return rc;
}

/* Finishes the shard being written and records its count and size. */
static int shard_end(stk_writer *w, char *err, size_t errlen)
{
    uint64_t fsize, cnt = stk__stkw_count(w->sw);
    const char *name = w->man.shards[w->man.nshards - 1].name;
    err[0] = '\0';
    int rc = w->layout == 2 ? put_field_table(w) : STK_OK;
    if (rc) {
        stk__fmt(err, errlen, "out of memory");
        stk__stkw_abort(w->sw);
        w->sw = NULL;
        return rc;
    }
    rc = stk__stkw_finish(w->sw, w->o.num_classes, &fsize, err, errlen);
    w->sw = NULL;
    if (rc && !err[0])
        stk__fmt(err, errlen, "%s/%s: cannot finish the shard: %s", w->dir, name, stk_strerror(rc));
    if (rc)
        return rc;
    w->man.shards[w->man.nshards - 1].count = cnt;
    w->man.shards[w->man.nshards - 1].bytes = fsize;
    w->bytes += fsize;
    return STK_OK;
}

/* Makes a shard ready for a payload of len bytes: ends the current one when
 * the payload would take it past shard_size (a shard always takes at least
 * one), starts the next one when none is open. */
static int shard_room(stk_writer *w, size_t len, char *err, size_t errlen)
{
    int rc;
    if (w->sw && stk__stkw_count(w->sw) && stk__stkw_payload_bytes(w->sw) + len > w->o.shard_size &&
        (rc = shard_end(w, err, errlen)))
        return rc;
    if (w->sw)
        return STK_OK;
    stk__manifest *m = &w->man;
    if ((rc = stk__grow((void **)&m->shards, &w->cap, m->nshards + 1, sizeof *m->shards))) {
        stk__fmt(err, errlen, "out of memory");
        return rc;
    }
    char name[64], path[4096];
    snprintf(name, sizeof name, "part-%06zu.stk", m->nshards);
    stk__manifest_shard *ms = &m->shards[m->nshards];
    ms->count = ms->bytes = 0;
    if (!(ms->name = stk__strdup(name))) {
        stk__fmt(err, errlen, "out of memory");
        return STK_ENOMEM;
    }
    m->nshards++;
    stk__fmt(path, sizeof path, "%s/%s", w->dir, name);
    err[0] = '\0';
    rc = stk__stkw_open(&w->sw, path, &w->h, err, errlen);
    if (rc && !err[0]) /* the shard writer does not say why for every failure */
        stk__fmt(err, errlen, "%s: cannot start the shard: %s", path, stk_strerror(rc));
    return rc;
}

/* ---- The writer stk_pack shares ------------------------------------------ */

int stk__writer_create(stk_writer **out, const char *dir, const stk__stk_header *h,
                       uint64_t shard_size, uint64_t num_classes, char *err, size_t errlen)
{
    *out = NULL;
    stk_writer *w = stk__calloc(1, sizeof *w);
    if (!w || !(w->dir = stk__strdup(dir)) ||
        (num_classes && !(w->man.class_names = stk__calloc(num_classes, sizeof(char *))))) {
        if (w)
            stk__free(w->dir);
        stk__free(w);
        stk__fmt(err, errlen, "out of memory");
        return STK_ENOMEM;
    }
    w->o.struct_size = sizeof w->o;
    w->o.shard_size = shard_size;
    w->o.num_classes = num_classes;
    w->o.align = h->align;
    w->o.raw_h = h->raw_h;
    w->o.raw_w = h->raw_w;
    w->o.raw_c = h->raw_c;
    w->h = *h;
    w->lock_fd = -1;
    w->t0 = stk__pack_now();
    w->man.classes = num_classes;
    w->man.kind = h->kind;
    int rc = out_lock(dir, &w->created, &w->lock_fd, err, errlen);
    if (!rc)
        rc = check_out_dir(dir, err, errlen);
    if (!rc)
        rc = marker_on(dir, err, errlen);
    if (rc) {
        stk_writer_close(w);
        return rc;
    }
    w->marker = true;
    *out = w;
    return STK_OK;
}

int stk__writer_put(stk_writer *w, uint64_t i, const void *data, size_t len, int64_t label,
                    const char *key, uint32_t iw, uint32_t ih)
{
    char why[STK_ERRMSG_MAX] = "";
    int rc = shard_room(w, len, w->err, sizeof w->err);
    if (!rc && (rc = stk__stkw_add(w->sw, data, len, label, key, iw, ih, why, sizeof why)))
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 " (%s): %s", i, key ? key : "",
                 why[0] ? why : stk_strerror(rc));
    if (rc) {
        w->failed = true;
        return rc;
    }
    if (w->layout == 2) {
        /* The payload was made from checked refs: this parse cannot fail. */
        stk__stk_fref refs[STK__MAX_FIELDS];
        size_t nr = 0;
        if (!stk__stk_fpayload_parse(data, len, w->nfname, refs, &nr, why, sizeof why))
            for (size_t k = 0; k < nr; k++)
                w->fshard[refs[k].id]++;
    }
    w->man.samples++;
    return STK_OK;
}

int stk__writer_set_fields(stk_writer *w, const stk__field_desc *fields, size_t n)
{
    if (n > STK__MAX_FIELDS || w->layout == 1 || w->sw) {
        stk__fmt(w->err, sizeof w->err, "%zu fields (at most %d) for a writer of fields", n,
                 STK__MAX_FIELDS);
        return STK_EINVAL;
    }
    for (size_t k = 0; k < n; k++) {
        size_t l = strlen(fields[k].name);
        if (!l || l > STK_FNAME_MAX) {
            stk__fmt(w->err, sizeof w->err, "field %zu: a name of %zu bytes (1 to %d)", k, l,
                     STK_FNAME_MAX);
            return STK_EINVAL;
        }
        if (!(w->fname[k] = stk__strdup(fields[k].name))) {
            stk__fmt(w->err, sizeof w->err, "out of memory");
            return STK_ENOMEM;
        }
        w->fkind[k] = fields[k].kind;
        w->nfname = k + 1;
    }
    w->layout = 2;
    w->h.kind = STK_PAYLOAD_FIELDS;
    w->man.kind = STK_PAYLOAD_FIELDS;
    return STK_OK;
}

int stk__pack_fields_payload(stk__pack_buf *b, const stk__field_ref *refs, size_t n, char *err,
                             size_t errlen)
{
    uint64_t total = STK_FPAYLOAD_HEAD + (uint64_t)n * STK_FPAYLOAD_REF;
    for (size_t k = 0; k < n; k++)
        total += refs[k].len;
    if (total > UINT32_MAX) {
        stk__fmt(err, errlen,
                 "a sample of fields taking %llu bytes is over the 4 GiB limit of a .stk sample",
                 (unsigned long long)total);
        return STK_ETOOBIG;
    }
    if (stk__pack_buf_reserve(b, (size_t)total)) {
        stk__fmt(err, errlen, "out of memory for a sample of %llu bytes",
                 (unsigned long long)total);
        return STK_ENOMEM;
    }
    stk__put32(b->p, (uint32_t)n);
    stk__put32(b->p + 4, 0);
    size_t at = STK_FPAYLOAD_HEAD + n * STK_FPAYLOAD_REF;
    for (size_t k = 0; k < n; k++) {
        uint8_t *e = b->p + STK_FPAYLOAD_HEAD + k * STK_FPAYLOAD_REF;
        stk__put32(e, refs[k].id);
        stk__put32(e + 4, (uint32_t)refs[k].len);
        if (refs[k].len)
            memcpy(b->p + at, refs[k].data, refs[k].len);
        at += refs[k].len;
    }
    b->len = at;
    return STK_OK;
}

int stk__writer_end(stk_writer *w)
{
    int rc = shard_end(w, w->err, sizeof w->err);
    /* The consolidated index is read back from the finished shards (the
     * bytes a reader will see) and written before the manifest, which names
     * it by size and checksum: a manifest never names an index that is not
     * there. */
    if (!rc && (rc = stk__stkindex_write(w->dir, &w->man, &w->man.index_bytes, &w->man.index_sum,
                                         w->err, sizeof w->err)) == STK_OK)
        w->man.has_index = true;
    if (!rc && (rc = stk__manifest_write(w->dir, &w->man, w->err, sizeof w->err)) && !w->err[0])
        stk__fmt(w->err, sizeof w->err, "%s: cannot write the manifest: %s", w->dir,
                 stk_strerror(rc));
    if (rc) {
        w->failed = true;
        return rc;
    }
    /* The manifest is there: the dataset is complete whether or not the
     * marker goes (a reader takes a manifest over the marker). */
    marker_off(w->dir);
    w->marker = false;
    w->finished = true;
    out_unlock(w->dir, &w->lock_fd);
    return STK_OK;
}

uint64_t stk__writer_bytes(const stk_writer *w)
{
    return w->bytes + (w->sw ? stk__stkw_payload_bytes(w->sw) : 0);
}

/* ---- stk_writer: samples added one by one ------------------------------- */

/* The options a caller passed, checked, with the defaults filled in. */
static int writer_options(const stk_writer_options *opts, stk_writer_options *o, char *err,
                          size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (opts) {
        if (opts->struct_size < offsetof(stk_writer_options, num_classes) + sizeof(uint64_t)) {
            stk__fmt(err, errlen,
                     "stk_writer_options.struct_size is %zu; set it to "
                     "sizeof(stk_writer_options)",
                     opts->struct_size);
            return STK_EINVAL;
        }
        memcpy(o, opts, opts->struct_size < sizeof *o ? opts->struct_size : sizeof *o);
    }
    o->struct_size = sizeof *o;
    if (!o->shard_size)
        o->shard_size = 256ull << 20;
    if (o->align && (o->align < 512 || o->align > (1u << 20) || (o->align & (o->align - 1)))) {
        stk__fmt(err, errlen, "align takes 0 or a power of two in 512..1048576, got %u", o->align);
        return STK_EINVAL;
    }
    if ((o->raw_h || o->raw_w || o->raw_c) &&
        (!o->raw_h || !o->raw_w || o->raw_h > 65535 || o->raw_w > 65535 ||
         (o->raw_c != 1 && o->raw_c != 3))) {
        stk__fmt(err, errlen, "raw shape %ux%ux%u: H and W must be in 1..65535 and C 1 or 3",
                 o->raw_h, o->raw_w, o->raw_c);
        return STK_EINVAL;
    }
    if (o->num_classes > (1u << 24)) {
        stk__fmt(err, errlen, "num_classes %llu is more than the format's %u",
                 (unsigned long long)o->num_classes, 1u << 24);
        return STK_EINVAL;
    }
    return STK_OK;
}

int stk_writer_open(stk_writer **out, const char *dir, const stk_writer_options *opts, char *err,
                    size_t errlen)
{
    char dummy[1];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
    if (!out) {
        stk__fmt(err, errlen, "stk_writer_open needs somewhere to put the writer");
        return STK_EINVAL;
    }
    *out = NULL;
    stk_writer_options o;
    int rc = writer_options(opts, &o, err, errlen);
    if (rc)
        return rc;
    if (!dir || !*dir) {
        stk__fmt(err, errlen, "stk_writer_open needs an output directory");
        return STK_EINVAL;
    }
    stk__stk_header h = {0};
    h.kind = o.raw_c ? STK_PAYLOAD_RAW : STK_PAYLOAD_ENCODED;
    h.flags = STK_FLAG_HAS_META | (o.align ? STK_FLAG_ALIGNED : 0);
    h.align = o.align;
    h.raw_h = o.raw_h;
    h.raw_w = o.raw_w;
    h.raw_c = o.raw_c;
    return stk__writer_create(out, dir, &h, o.shard_size, o.num_classes, err, errlen);
}

/* The writer refuses any call after it finished or failed. */
static int usable(stk_writer *w)
{
    w->err[0] = '\0';
    if (!w->finished && !w->failed)
        return STK_OK;
    stk__fmt(w->err, sizeof w->err, "the writer has %s",
             w->finished ? "finished" : "failed; close it");
    return STK_EMISUSE;
}

/* Checks a sample's label and key (stk_writer_add, stk_writer_add_fields). */
static int check_label_key(stk_writer *w, uint64_t i, int64_t label, const char *key)
{
    if (label < -1 || (label >= 0 && (uint64_t)label >= w->o.num_classes)) {
        stk__fmt(w->err, sizeof w->err,
                 "sample %" PRIu64 " (%s): label %lld is outside -1..%lld (num_classes %llu)", i,
                 key ? key : "", (long long)label, (long long)w->o.num_classes - 1,
                 (unsigned long long)w->o.num_classes);
        return STK_EINVAL;
    }
    if (key && strlen(key) >= STK_KEY_MAX) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": key of %zu bytes (at most %d)", i,
                 strlen(key), STK_KEY_MAX - 1);
        return STK_EINVAL;
    }
    return STK_OK;
}

int stk_writer_add(stk_writer *w, const void *data, size_t len, int64_t label, const char *key)
{
    if (!w)
        return STK_EINVAL;
    int rc = usable(w);
    if (rc)
        return rc;
    uint64_t i = w->man.samples;
    if (w->layout == 2) {
        stk__fmt(w->err, sizeof w->err,
                 "sample %" PRIu64 ": this writer's samples have fields (stk_writer_add_fields); "
                 "a dataset's samples all have one layout, so add this one with fields too",
                 i);
        return STK_EMISUSE;
    }
    if (!data && len) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": no data for %zu bytes", i, len);
        return STK_EINVAL;
    }
    if ((rc = check_label_key(w, i, label, key)))
        return rc;
    uint32_t sw = 0, sh = 0;
    if (w->o.raw_c) {
        size_t want = (size_t)w->o.raw_h * w->o.raw_w * w->o.raw_c;
        if (len != want) {
            stk__fmt(w->err, sizeof w->err,
                     "sample %" PRIu64 " (%s): %zu bytes, but a raw %ux%ux%u sample has %zu", i,
                     key ? key : "", len, w->o.raw_h, w->o.raw_w, w->o.raw_c, want);
            return STK_EINVAL;
        }
        sw = w->o.raw_w;
        sh = w->o.raw_h;
    } else {
        stk__pack_sniff_size(data, len, &sw, &sh);
    }
    w->layout = 1;
    return stk__writer_put(w, i, data, len, label, key, sw, sh);
}

/* The id field f has (or will have once added: *fresh), checking its name
 * and kind. */
static int field_id(stk_writer *w, uint64_t i, const stk_writer_field *f, size_t nnew, size_t *id,
                    bool *fresh)
{
    size_t l = f->name ? strlen(f->name) : 0;
    bool bad = !l || l > STK_FNAME_MAX;
    for (size_t k = 0; k < l && !bad; k++)
        bad = (unsigned char)f->name[k] < 0x20 || f->name[k] == 0x7f || strchr(",;=", f->name[k]);
    if (bad) {
        stk__fmt(w->err, sizeof w->err,
                 "sample %" PRIu64 ": field name '%.64s' is empty, longer than %d bytes, or has a "
                 "control character or one of , ; = (which field specs use)",
                 i, f->name ? f->name : "", STK_FNAME_MAX);
        return STK_EINVAL;
    }
    if (f->kind < STK_FIELD_AUTO || f->kind > STK_FIELD_NPY || (!f->data && f->len)) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": field '%s': %s", i, f->name,
                 f->kind < 0 || f->kind > STK_FIELD_NPY ? "unknown kind"
                                                        : "no data for its length");
        return STK_EINVAL;
    }
    *fresh = false;
    for (size_t k = 0; k < w->nfname; k++) {
        if (strcmp(w->fname[k], f->name))
            continue;
        *id = k;
        if (f->kind && w->fkind[k] && f->kind != w->fkind[k]) {
            stk__fmt(w->err, sizeof w->err,
                     "sample %" PRIu64 ": field '%s' is %s here and was %s in earlier samples", i,
                     f->name, stk_field_kind_name(f->kind), stk_field_kind_name(w->fkind[k]));
            return STK_EINVAL;
        }
        return STK_OK;
    }
    if (w->nfname + nnew >= STK__MAX_FIELDS) {
        stk__fmt(w->err, sizeof w->err,
                 "sample %" PRIu64 ": field '%s' would be the dataset's %dth; a dataset has at "
                 "most %d field names",
                 i, f->name, STK__MAX_FIELDS + 1, STK__MAX_FIELDS);
        return STK_EINVAL;
    }
    *id = w->nfname + nnew;
    *fresh = true;
    return STK_OK;
}

int stk_writer_add_fields(stk_writer *w, const stk_writer_field *fields, size_t n, int64_t label,
                          const char *key)
{
    if (!w)
        return STK_EINVAL;
    int rc = usable(w);
    if (rc)
        return rc;
    uint64_t i = w->man.samples;
    if (w->layout == 1 || w->o.raw_c) {
        stk__fmt(w->err, sizeof w->err,
                 "sample %" PRIu64 ": this writer's samples are %s; a dataset's samples all have "
                 "one layout, so samples with fields need a writer of their own",
                 i, w->o.raw_c ? "raw tensors (raw_c)" : "single payloads (stk_writer_add)");
        return STK_EMISUSE;
    }
    if (!fields || !n || n > STK__MAX_FIELDS) {
        stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": %zu fields (1 to %d)", i,
                 fields ? n : 0, STK__MAX_FIELDS);
        return STK_EINVAL;
    }
    if ((rc = check_label_key(w, i, label, key)))
        return rc;
    /* Check everything before changing anything, so a refused sample leaves
     * the writer as it was. */
    stk__field_ref refs[STK__MAX_FIELDS];
    const stk_writer_field *byid[STK__MAX_FIELDS] = {0};
    size_t nnew = 0;
    for (size_t k = 0; k < n; k++) {
        size_t id;
        bool fresh;
        if ((rc = field_id(w, i, &fields[k], nnew, &id, &fresh)))
            return rc;
        for (size_t j = 0; j < k; j++)
            if (!strcmp(fields[j].name, fields[k].name)) {
                stk__fmt(w->err, sizeof w->err, "sample %" PRIu64 ": field '%s' given twice", i,
                         fields[k].name);
                return STK_EINVAL;
            }
        nnew += fresh;
        byid[id] = &fields[k];
    }
    size_t nr = 0;
    uint32_t sw = 0, sh = 0;
    const stk_writer_field *image = NULL;
    for (size_t id = 0; id < STK__MAX_FIELDS; id++) {
        const stk_writer_field *f = byid[id];
        if (!f)
            continue;
        refs[nr++] = (stk__field_ref){(uint32_t)id, f->data, f->len};
        int kind = f->kind                          ? f->kind
                   : id < w->nfname && w->fkind[id] ? w->fkind[id]
                                                    : stk_field_kind_for_name(f->name);
        if (!image && kind == STK_FIELD_IMAGE)
            image = f;
    }
    if ((rc = stk__pack_fields_payload(&w->fbuf, refs, nr, w->err, sizeof w->err)))
        return rc;
    /* Now the names: new ones get the ids they were given above. */
    for (size_t id = w->nfname; id < w->nfname + nnew; id++) {
        if (!(w->fname[id] = stk__strdup(byid[id]->name))) {
            stk__fmt(w->err, sizeof w->err, "out of memory");
            for (size_t k = w->nfname; k < id; k++) {
                stk__free(w->fname[k]);
                w->fname[k] = NULL;
            }
            return STK_ENOMEM;
        }
        w->fkind[id] = byid[id]->kind;
    }
    for (size_t id = 0; id < w->nfname; id++)
        if (byid[id] && !w->fkind[id])
            w->fkind[id] = byid[id]->kind;
    w->nfname += nnew;
    if (!w->layout) {
        w->layout = 2;
        w->h.kind = STK_PAYLOAD_FIELDS;
        w->man.kind = STK_PAYLOAD_FIELDS;
    }
    if (image)
        stk__pack_sniff_size(image->data, image->len, &sw, &sh);
    return stk__writer_put(w, i, w->fbuf.p, w->fbuf.len, label, key, sw, sh);
}

int stk_writer_set_class_name(stk_writer *w, uint64_t c, const char *name)
{
    if (!w)
        return STK_EINVAL;
    int rc = usable(w);
    if (rc)
        return rc;
    if (c >= w->o.num_classes || !name || !*name || strchr(name, '\n')) {
        stk__fmt(w->err, sizeof w->err,
                 "class %llu: needs a non-empty name without a newline and a class below "
                 "num_classes %llu",
                 (unsigned long long)c, (unsigned long long)w->o.num_classes);
        return STK_EINVAL;
    }
    char *copy = stk__strdup(name);
    if (!copy) {
        stk__fmt(w->err, sizeof w->err, "out of memory");
        return STK_ENOMEM;
    }
    stk__free(w->man.class_names[c]);
    w->man.class_names[c] = copy;
    return STK_OK;
}

/* Readers take a dataset's class names all or none (a list with holes
 * cannot say which label a name belongs to once it is a list), so a partial
 * naming is refused at finish, where it can still be completed. */
static int check_naming(stk_writer *w)
{
    uint64_t named = 0, missing = 0, first_missing = 0;
    for (uint64_t c = 0; w->man.class_names && c < w->man.classes; c++) {
        if (w->man.class_names[c])
            named++;
        else if (!missing++)
            first_missing = c;
    }
    if (!named || !missing)
        return STK_OK;
    stk__fmt(w->err, sizeof w->err,
             "%s: %llu of %llu classes are named, and class %llu%s is not: name every class "
             "(set_class_name) or none, then finish again",
             w->dir, (unsigned long long)named, (unsigned long long)w->man.classes,
             (unsigned long long)first_missing, missing > 1 ? " (with others)" : "");
    return STK_EINVAL;
}

int stk_writer_finish(stk_writer *w, stk_pack_result *res)
{
    if (!w)
        return STK_EINVAL;
    int rc = usable(w);
    if (rc)
        return rc;
    if (res && res->struct_size < offsetof(stk_pack_result, seconds) + sizeof(double)) {
        stk__fmt(w->err, sizeof w->err,
                 "stk_pack_result.struct_size is %zu; set it to sizeof(stk_pack_result)",
                 res->struct_size);
        return STK_EINVAL;
    }
    if (!w->sw) {
        stk__fmt(w->err, sizeof w->err, "%s: no samples were added", w->dir);
        return STK_EEMPTY;
    }
    if ((rc = check_naming(w)) || (rc = stk__writer_end(w)))
        return rc;
    if (res) {
        stk_pack_result r = {0};
        r.samples = w->man.samples;
        r.shards = w->man.nshards;
        r.bytes = w->bytes;
        r.payload = w->man.kind;
        r.seconds = stk__pack_now() - w->t0;
        size_t n = res->struct_size < sizeof r ? res->struct_size : sizeof r;
        r.struct_size = n;
        memcpy(res, &r, n);
    }
    return STK_OK;
}

const char *stk_writer_errmsg(const stk_writer *w)
{
    return w ? w->err : "";
}

void stk_writer_close(stk_writer *w)
{
    if (!w)
        return;
    stk__stkw_abort(w->sw);
    if (!w->finished && w->marker) {
        /* The marker goes only once every shard has: a shard that could not
         * be removed stays under the marker, which keeps the directory an
         * interrupted pack that no reader takes for a dataset. */
        char path[4096];
        bool gone = true;
        for (size_t k = 0; k < w->man.nshards; k++) {
            stk__fmt(path, sizeof path, "%s/%s", w->dir, w->man.shards[k].name);
            if (stk__unlink(path) != 0 && errno != ENOENT)
                gone = false;
        }
        /* The index is written after the last shard: it goes with them. */
        stk__fmt(path, sizeof path, "%s/%s", w->dir, STK_INDEX_NAME);
        if (stk__unlink(path) != 0 && errno != ENOENT)
            gone = false;
        stk__fmt(path, sizeof path, "%s/%s.tmp", w->dir, STK_INDEX_NAME);
        if (stk__unlink(path) != 0 && errno != ENOENT)
            gone = false;
        if (gone)
            marker_off(w->dir);
    }
    out_unlock(w->dir, &w->lock_fd);
    if (!w->finished && w->created)
        rmdir(w->dir);
    for (size_t k = 0; k < w->man.nshards; k++)
        stk__free(w->man.shards[k].name);
    stk__free(w->man.shards);
    for (uint64_t c = 0; w->man.class_names && c < w->man.classes; c++)
        stk__free(w->man.class_names[c]);
    stk__free(w->man.class_names);
    for (size_t k = 0; k < w->nfname; k++)
        stk__free(w->fname[k]);
    stk__free(w->fbuf.p);
    stk__free(w->dir);
    stk__free(w);
}
