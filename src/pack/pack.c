/*
 * pack.c -- stk_pack (include/stoker.h), behind `stoker pack SRC OUT` and
 * stoker.pack() in Python: writes any dataset stoker can read
 * (ImageFolder tree, WebDataset tars, CIFAR batches, .stk shards, records)
 * as .stk shards plus a manifest (docs/format.md, docs/shards.md).
 *
 * stk_pack is an ordered parallel transform followed by the writer: the
 * ordered map of omap.c runs `threads` workers that read and transform
 * samples (transform.c; the source's read is thread-safe) into a window of
 * slots, and the calling thread hands them, strictly in sample order, to the
 * stk_writer of writer.c, which owns the output directory (its lock, the
 * unfinished-pack marker, the shards, the manifest, and taking back what a
 * failed pack wrote). The bytes of each sample depend only on the sample and
 * the options, and shard boundaries only on those bytes, so the output is
 * byte-identical whatever the thread count.
 */
#include "io/file.h"
#include "pack/pack.h"
#include "source/dataset.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PACK_READ_LIMIT (1u << 30)

/* Resolves p to an absolute path without symbolic links, for a p that need
 * not exist yet: its nearest existing ancestor is resolved and the rest of
 * p appended (with "." and ".." taken lexically). False if nothing resolves. */
static bool resolve_path(const char *p, char *out, size_t n)
{
    char head[4096], rest[4096] = "";
    stk__fmt(head, sizeof head, "%s", p);
    for (;;) {
        char *r = realpath(head[0] ? head : ".", NULL);
        if (r) {
            stk__fmt(out, n, "%s", r);
            free(r);
            break;
        }
        if (errno != ENOENT && errno != ENOTDIR)
            return false;
        /* Move head's last component to the front of rest. */
        size_t l = strlen(head);
        while (l > 1 && head[l - 1] == '/')
            head[--l] = '\0';
        char *slash = strrchr(head, '/');
        if (!head[0] || (slash == head && !slash[1]))
            return false;
        const char *last = slash ? slash + 1 : head;
        char tmp[4096];
        stk__fmt(tmp, sizeof tmp, "%s%s%s", last, rest[0] ? "/" : "", rest);
        stk__fmt(rest, sizeof rest, "%s", tmp);
        if (slash)
            slash[slash == head ? 1 : 0] = '\0';
        else
            head[0] = '\0';
    }
    for (char *c = rest, *next; *c; c = next) {
        next = strchr(c, '/');
        if (next)
            *next++ = '\0';
        else
            next = c + strlen(c);
        if (!*c || !strcmp(c, "."))
            continue;
        if (!strcmp(c, "..")) {
            char *slash = strrchr(out, '/');
            if (slash)
                slash[slash == out ? 1 : 0] = '\0';
        } else {
            size_t l = strlen(out);
            stk__fmt(out + l, n - l, "%s%s", l && out[l - 1] == '/' ? "" : "/", c);
        }
    }
    return true;
}

/* Is path a inside directory b, or b itself? */
static bool path_within(const char *a, const char *b)
{
    size_t n = strlen(b);
    if (n == 1 && b[0] == '/')
        return true;
    return !strncmp(a, b, n) && (a[n] == '\0' || a[n] == '/');
}

/* Refuses an OUT that is SRC or inside it (the shards would land in the
 * dataset being read, which then mixes kinds and no longer opens), and a SRC
 * inside OUT (the shards would land around it). Real paths are compared, so
 * symbolic links and spellings like "a/../a" do not slip through. */
static int check_paths(const char *src, const char *out, char *err, size_t errlen)
{
    char rs[4096], ro[4096];
    struct stat st;
    if (!resolve_path(src, rs, sizeof rs) || !resolve_path(out, ro, sizeof ro))
        return 0; /* the open or mkdir that follows reports what is wrong */
    bool src_dir = stk__stat(rs, &st) == 0 && S_ISDIR(st.st_mode);
    if (!strcmp(rs, ro)) {
        stk__fmt(err, errlen,
                 "OUT %s is the source dataset itself (%s); the shards would be written into "
                 "the dataset being read: choose an OUT outside SRC",
                 out, rs);
        return 1;
    }
    if (src_dir && path_within(ro, rs)) {
        stk__fmt(err, errlen,
                 "OUT %s (%s) is inside the source dataset %s (%s); the shards would be "
                 "written into the dataset being read: choose an OUT outside SRC",
                 out, ro, src, rs);
        return 1;
    }
    if (path_within(rs, ro)) {
        stk__fmt(err, errlen,
                 "the source dataset %s (%s) is inside OUT %s (%s); the shards would be "
                 "written around the dataset being read: choose an OUT that does not hold SRC",
                 src, rs, out, ro);
        return 1;
    }
    return 0;
}

/* The manifest stores a class name as the rest of its line: a name with a
 * newline cannot be stored. Says which class, showing the newline as \n. */
static int check_class_name(uint64_t c, const char *name, const char *what, char *err,
                            size_t errlen)
{
    if (!strchr(name, '\n'))
        return STK_OK;
    char shown[256];
    size_t k = 0;
    for (const char *q = name; *q && k + 3 < sizeof shown; q++) {
        if (*q == '\n') {
            shown[k++] = '\\';
            shown[k++] = 'n';
        } else {
            shown[k++] = *q;
        }
    }
    shown[k] = '\0';
    stk__fmt(err, errlen,
             "class %llu: the name \"%s\" contains a newline, which the manifest cannot store "
             "(one record per line, docs/format.md); %s",
             (unsigned long long)c, shown, what);
    return STK_EINVAL;
}

static unsigned online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
}

/* Decides the input kind and the payload kind. */
static int plan(stk__pack_plan *p, char *err, size_t errlen)
{
    const stk_pack_options *o = p->o;
    /* From what the source says its samples are: plain bytes (records),
     * raw pixels (CIFAR's CHW, a raw .stk's HWC) or encoded images. */
    const stk__source *src = p->src;
    p->in_kind = STK__IN_IMAGES;
    if (!(src->ops->flags & STK__SRC_IMAGES)) {
        p->in_kind = STK__IN_BYTES;
    } else if (src->raw_c) {
        p->in_kind = src->raw_chw ? STK__IN_CIFAR : STK__IN_RAW_STK;
        p->in_h = src->raw_h;
        p->in_w = src->raw_w;
        p->in_c = src->raw_c;
    }
    if (stk__pack_keeps_fields(p->src)) {
        p->in_kind = STK__IN_FIELDS;
        p->kind = STK_PAYLOAD_FIELDS;
        p->images = 0;
        if (o->raw_c || o->max_side) {
            char names[256];
            size_t used = 0;
            names[0] = '\0';
            for (size_t k = 0; k < p->src->nfields && used + 1 < sizeof names; k++) {
                stk__fmt(names + used, sizeof names - used, "%s%s", k ? ", " : "",
                         p->src->fields[k].name);
                used += strlen(names + used);
            }
            stk__fmt(err, errlen,
                     "--%s applies to datasets of one image a sample; this one's samples have "
                     "fields (%s), which are packed as they are: pack without --%s",
                     o->raw_c ? "raw" : "max-side", names, o->raw_c ? "raw" : "max-side");
            return 1;
        }
        return 0;
    }
    p->images = stk__images_of(p->src);
    if (o->raw_c && o->max_side) {
        stk__fmt(err, errlen, "--raw and --max-side exclude each other");
        return 1;
    }
    if (o->raw_c) {
        if (o->raw_c != 1 && o->raw_c != 3) {
            stk__fmt(err, errlen, "--raw HxWxC needs C = 1 or 3");
            return 1;
        }
        p->kind = STK_PAYLOAD_RAW;
    } else if (o->max_side) {
        p->kind = STK_PAYLOAD_RESIZED;
    } else if (p->in_kind == STK__IN_CIFAR || p->in_kind == STK__IN_RAW_STK) {
        p->kind = STK_PAYLOAD_RAW; /* keep the tensors, as HWC */
    } else {
        p->kind = STK_PAYLOAD_ENCODED;
    }
    if (p->in_kind == STK__IN_BYTES && p->kind != STK_PAYLOAD_ENCODED) {
        stk__fmt(err, errlen, "records are packed as they are (no --raw or --max-side)");
        return 1;
    }
    if (p->in_kind != STK__IN_IMAGES && p->kind == STK_PAYLOAD_RESIZED) {
        stk__fmt(err, errlen,
                 "--max-side applies to encoded images; this input holds raw "
                 "tensors (use --raw HxWxC)");
        return 1;
    }
    return 0;
}

/* The options a caller passed, checked, with the defaults filled in. The
 * first version of the struct ends with progress_user: a smaller struct_size
 * is not one this library knows. */
#define PACK_OPTIONS_V1 (offsetof(stk_pack_options, progress_user) + sizeof(void *))

static int normalize(const stk_pack_options *in, stk_pack_options *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (in) {
        if (in->struct_size < PACK_OPTIONS_V1) {
            stk__fmt(err, errlen,
                     "stk_pack_options.struct_size is %zu, below the first version's %zu "
                     "(set it to sizeof(stk_pack_options))",
                     in->struct_size, (size_t)PACK_OPTIONS_V1);
            return STK_EINVAL;
        }
        memcpy(o, in, in->struct_size < sizeof *o ? in->struct_size : sizeof *o);
    }
    o->struct_size = sizeof *o;
    if (!o->shard_size)
        o->shard_size = 256ull << 20;
    if (!o->quality)
        o->quality = 90;
    if (o->quality > 100) {
        stk__fmt(err, errlen, "quality must be in 1..100, got %u", o->quality);
        return STK_EINVAL;
    }
    if (o->max_side > 65535) {
        stk__fmt(err, errlen, "max_side must be in 1..65535 (0: keep sizes), got %u", o->max_side);
        return STK_EINVAL;
    }
    if ((o->raw_h || o->raw_w || o->raw_c) &&
        (!o->raw_h || !o->raw_w || !o->raw_c || o->raw_h > 65535 || o->raw_w > 65535)) {
        stk__fmt(err, errlen, "raw shape %ux%ux%u: H and W must be in 1..65535 and C 1 or 3",
                 o->raw_h, o->raw_w, o->raw_c);
        return STK_EINVAL;
    }
    if (o->threads > 256) {
        stk__fmt(err, errlen, "threads must be in 0..256 (0: one per online core), got %u",
                 o->threads);
        return STK_EINVAL;
    }
    if (o->align && (o->align < 512 || o->align > (1u << 20) || (o->align & (o->align - 1)))) {
        stk__fmt(err, errlen, "align takes 0 or a power of two in 512..1048576, got %u", o->align);
        return STK_EINVAL;
    }
    if (o->label_bytes > 8 || (o->label_bytes & (o->label_bytes - 1))) {
        stk__fmt(err, errlen, "label_bytes must be 0, 1, 2, 4 or 8, got %u", o->label_bytes);
        return STK_EINVAL;
    }
    if ((o->header_bytes || o->label_bytes) && !o->record_bytes) {
        stk__fmt(err, errlen, "%s applies to record files; give a record size too",
                 o->header_bytes ? "header_bytes" : "label_bytes");
        return STK_EINVAL;
    }
    return STK_OK;
}

/* ---- stk_pack ------------------------------------------------------------- */

typedef struct packjob {
    stk_pack_options o; /* with defaults filled in */
    stk__source src;
    stk__pack_plan plan;
    stk__pack_sample *slots;
    stk__pack_worker *workers;
    unsigned nworkers;
    uint64_t window;
    stk__omap *map;
    stk_writer *w;
    stk_pack_progress pr;
    double t0, last;
    uint64_t skipped, indexed;
} packjob;

static void job_transform(void *ctx, unsigned worker, uint64_t i, uint64_t slot)
{
    packjob *j = ctx;
    stk__pack_transform(&j->plan, &j->workers[worker], i, &j->slots[slot]);
}

/* Calls the progress callback; nonzero when it asks to stop. */
static int tell(packjob *j)
{
    if (!j->o.progress)
        return 0;
    j->pr.seconds = stk__pack_now() - j->t0;
    return j->o.progress(&j->pr, j->o.progress_user);
}

/* Checks the arguments, opens the source and plans the payload. */
static int job_open(packjob *j, const char *src, const char *out_dir, const stk_pack_options *opts,
                    const stk_pack_result *res, char *err, size_t errlen)
{
    int rc;
    char why[STK_ERRMSG_MAX];
    if (!src || !*src || !out_dir || !*out_dir) {
        stk__fmt(err, errlen, "stk_pack needs a source and an output directory");
        return STK_EINVAL;
    }
    if ((rc = normalize(opts, &j->o, err, errlen)))
        return rc;
    if (res && res->struct_size < offsetof(stk_pack_result, seconds) + sizeof(double)) {
        stk__fmt(err, errlen,
                 "stk_pack_result.struct_size is %zu; set it to sizeof(stk_pack_result)",
                 res->struct_size);
        return STK_EINVAL;
    }
    if (check_paths(src, out_dir, err, errlen))
        return STK_EINVAL;
    const stk_pack_options *o = &j->o;
    stk__source_params sp = {.record_bytes = o->record_bytes,
                             .header_bytes = o->header_bytes,
                             .label_bytes = o->label_bytes};
    if ((rc = stk__source_open(&j->src, src, &sp, why, sizeof why))) {
        stk__fmt(err, errlen, "cannot open %s: %s (%s)", src, why, stk_strerror(rc));
        return rc;
    }
    j->pr.total = j->src.count;
    j->plan.o = &j->o;
    j->plan.root = src;
    j->plan.src = &j->src;
    if (plan(&j->plan, err, errlen))
        return STK_EINVAL;
    /* Every field, but a second name for another's bytes only once (and
     * no stand-in name): the .stk's ids close up over those left out. */
    uint64_t all = 0;
    uint32_t next = 0;
    for (size_t k = 0; k < j->src.nfields && k < STK__MAX_FIELDS; k++) {
        j->plan.fmap[k] = next;
        if (!j->src.fields[k].nocopy) {
            all |= (uint64_t)1 << k;
            next++;
        }
    }
    if (j->plan.in_kind == STK__IN_FIELDS && j->src.ops->select) {
        /* Read as the fields op finds them (a tar reads the sample's
         * members, not just its image). */
        if ((rc = j->src.ops->select(&j->src, all, why, sizeof why))) {
            stk__fmt(err, errlen, "cannot read the fields of %s: %s", src, why);
            return rc;
        }
    }
    /* Every class name goes into the manifest, so a name it cannot store is
     * refused before anything is written (it used to be left out, and a
     * partial list of names reads as none). */
    for (uint64_t c = 0; c < j->src.num_classes; c++) {
        const char *cn = stk__source_class_name(&j->src, c);
        if (cn && (rc = check_class_name(c, cn, "rename the class folder", err, errlen)))
            return rc;
    }
    return STK_OK;
}

/* Takes the output directory through the writer, with the payload kind's
 * header and all of the source's class names (those of classes without
 * samples too). */
static int job_writer(packjob *j, const char *out_dir, char *err, size_t errlen)
{
    const stk_pack_options *o = &j->o;
    const stk__pack_plan *p = &j->plan;
    stk__stk_header h = {0};
    h.kind = p->kind;
    h.flags = STK_FLAG_HAS_META | (o->align ? STK_FLAG_ALIGNED : 0);
    h.align = o->align;
    if (p->kind == STK_PAYLOAD_RAW) {
        h.raw_h = o->raw_c ? o->raw_h : p->in_h;
        h.raw_w = o->raw_c ? o->raw_w : p->in_w;
        h.raw_c = o->raw_c ? o->raw_c : p->in_c;
    }
    if (p->kind == STK_PAYLOAD_RESIZED) {
        h.max_side = o->max_side;
        h.quality = o->quality;
    }
    if (p->kind == STK_PAYLOAD_RAW && !o->raw_c) { /* CIFAR/raw input without a raw shape */
        j->o.raw_h = h.raw_h;
        j->o.raw_w = h.raw_w;
        j->o.raw_c = h.raw_c;
    }
    int rc = stk__writer_create(&j->w, out_dir, &h, o->shard_size, j->src.num_classes, err, errlen);
    if (rc)
        return rc;
    /* The source's field ids are the shards' ids, so workers make final
     * payloads on their own. */
    stk__field_desc kept[STK__MAX_FIELDS];
    size_t nkept = 0;
    for (size_t k = 0; k < j->src.nfields && k < STK__MAX_FIELDS; k++)
        if (!j->src.fields[k].nocopy)
            kept[nkept++] = j->src.fields[k];
    if (p->in_kind == STK__IN_FIELDS && (rc = stk__writer_set_fields(j->w, kept, nkept))) {
        stk__fmt(err, errlen, "%s", j->w->err);
        return rc;
    }
    j->w->man.has_restart = o->restart != 0;
    for (uint64_t c = 0; c < j->src.num_classes; c++) {
        const char *cn = stk__source_class_name(&j->src, c);
        if (cn && !(j->w->man.class_names[c] = stk__strdup(cn))) {
            stk__fmt(err, errlen, "out of memory");
            return STK_ENOMEM;
        }
    }
    return STK_OK;
}

/* Starts the workers of the ordered map. */
static int job_start(packjob *j, char *err, size_t errlen)
{
    unsigned nt = j->o.threads ? j->o.threads : online_cores();
    j->window = (uint64_t)nt * 4 < 16 ? 16 : (uint64_t)nt * 4;
    if (!(j->slots = stk__calloc(j->window, sizeof *j->slots)) ||
        !(j->workers = stk__calloc(nt, sizeof *j->workers))) {
        stk__fmt(err, errlen, "out of memory");
        return STK_ENOMEM;
    }
    j->nworkers = nt;
    for (unsigned k = 0; k < nt; k++)
        j->workers[k].scratch.limit = PACK_READ_LIMIT;
    return stk__omap_start(&j->map, j->src.count, nt, j->window, "stk-pack", job_transform, j, err,
                           errlen);
}

/* Waits for sample i. A slow sample must not make the caller deaf to its own
 * cancellation: with a progress callback, it is told (and asked) every
 * 100 ms meanwhile. STK_OK, or STK_ECANCELED. */
static int job_wait(packjob *j, uint64_t i)
{
    while (!stk__omap_wait(j->map, i, 100000000u)) {
        if (j->o.progress && stk__pack_now() - j->last >= 0.1) {
            j->last = stk__pack_now();
            if (tell(j))
                return STK_ECANCELED;
        }
    }
    return STK_OK;
}

/* Writes sample i (or skips it, reporting it, with skip_bad). */
static int job_write(packjob *j, uint64_t i, const char *root, char *err, size_t errlen)
{
    stk__pack_sample *s = &j->slots[i % j->window];
    char key[4096];
    stk__source_key(&j->src, root, i, key, sizeof key);
    if (!s->rc) {
        j->indexed += s->indexed;
        int rc = stk__writer_put(j->w, i, s->out.p, s->out.len, s->label, key, s->w, s->h);
        if (rc)
            stk__fmt(err, errlen, "%s", j->w->err);
        return rc;
    }
    if (!j->o.skip_bad) {
        stk__fmt(err, errlen, "sample %" PRIu64 " (%s): %s", i, key, s->err);
        return s->rc;
    }
    j->skipped++;
    j->pr.done = i + 1;
    j->pr.skipped = j->skipped;
    j->pr.skipped_index = i;
    j->pr.skipped_key = key;
    j->pr.skipped_reason = s->err;
    int cancel = tell(j);
    j->pr.skipped_key = j->pr.skipped_reason = NULL;
    return cancel ? STK_ECANCELED : STK_OK;
}

/* Every sample, in order, from the map to the writer. */
static int job_run(packjob *j, const char *root, char *err, size_t errlen)
{
    for (uint64_t i = 0; i < j->src.count; i++) {
        int rc = job_wait(j, i);
        if (!rc)
            rc = job_write(j, i, root, err, errlen);
        if (rc)
            return rc;
        stk__omap_release(j->map, i);
        /* The last sample's report is job_finish's (done == total once). */
        if (j->o.progress && i + 1 < j->src.count && stk__pack_now() - j->last >= 0.1) {
            j->last = stk__pack_now();
            j->pr.done = i + 1;
            j->pr.bytes = stk__writer_bytes(j->w);
            j->pr.shards = j->w->man.nshards;
            if (tell(j))
                return STK_ECANCELED;
        }
    }
    return STK_OK;
}

/* Ends the last shard and writes the manifest; fills res. */
static int job_finish(packjob *j, stk_pack_result *res, char *err, size_t errlen)
{
    int rc;
    stk_writer *w = j->w;
    if (!w->sw) {
        stk__fmt(err, errlen, "no samples to pack (all %" PRIu64 " skipped)", j->skipped);
        return STK_EEMPTY;
    }
    w->man.restart_indexed = j->indexed;
    if ((rc = stk__writer_end(w))) {
        stk__fmt(err, errlen, "%s", w->err);
        return rc;
    }
    j->pr.done = j->src.count;
    j->pr.skipped = j->skipped;
    j->pr.bytes = w->bytes;
    j->pr.shards = w->man.nshards;
    /* The pack is complete: a stop asked for now comes too late to matter. */
    (void)tell(j);
    if (res) {
        stk_pack_result r = {0};
        r.samples = w->man.samples;
        r.skipped = j->skipped;
        r.shards = w->man.nshards;
        r.bytes = w->bytes;
        r.payload = j->plan.kind;
        r.seconds = stk__pack_now() - j->t0;
        r.restart_indexed = j->indexed;
        size_t n = res->struct_size < sizeof r ? res->struct_size : sizeof r;
        r.struct_size = n;
        memcpy(res, &r, n);
    }
    return STK_OK;
}

/* Stops the workers first (they read the source and the slots), then takes
 * back what an unfinished pack wrote (stk_writer_close). */
static void job_free(packjob *j)
{
    stk__omap_stop(j->map);
    stk_writer_close(j->w);
    for (uint64_t k = 0; j->slots && k < j->window; k++)
        stk__free(j->slots[k].out.p);
    stk__free(j->slots);
    for (unsigned k = 0; j->workers && k < j->nworkers; k++)
        stk__pack_worker_free(&j->workers[k]);
    stk__free(j->workers);
    stk__source_close(&j->src);
}

int stk_pack(const char *src, const char *out_dir, const stk_pack_options *opts,
             stk_pack_result *res, char *err, size_t errlen)
{
    char dummy[1];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
    packjob j;
    memset(&j, 0, sizeof j);
    j.t0 = stk__pack_now();
    j.last = 0; /* the first sample done is reported at once */
    j.pr.struct_size = sizeof j.pr;
    int rc = job_open(&j, src, out_dir, opts, res, err, errlen);
    if (!rc)
        rc = job_writer(&j, out_dir, err, errlen);
    if (!rc)
        rc = job_start(&j, err, errlen);
    if (!rc)
        rc = job_run(&j, src, err, errlen);
    if (!rc)
        rc = job_finish(&j, res, err, errlen);
    if (rc == STK_ECANCELED)
        stk__fmt(err, errlen,
                 "canceled by the progress callback after %" PRIu64 " of %" PRIu64
                 " samples; the shards written are removed",
                 j.pr.done, j.pr.total);
    job_free(&j);
    return rc;
}
