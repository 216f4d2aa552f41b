/*
 * stk.c -- the .stk shard reader (docs/format.md). Each shard's index is read
 * once at open, checked, and kept in memory as the raw index region (a
 * remote dataset whose manifest names a consolidated index reads them all
 * from that one object: "The consolidated index" below); a sample read is
 * one pread of its payload followed by an XXH3-64 check, so a corrupt
 * payload is reported, never delivered. pread (not mmap) keeps a shard that
 * shrinks under us an I/O error instead of a SIGBUS.
 *
 * Fields shards (version 2, payload kind fields): the field tables of all
 * shards are merged by name at open into the source's fields, each shard
 * keeping its map onto them. Until a select, a read gives a sample's primary
 * field (its first image), so a loader without fields reads images and
 * labels as from any .stk, and a remote one reads sample by sample (the ops
 * have no locate: the fetch stage would hand workers whole payloads). A
 * select switches to whole samples (the fetch stage included), whose fields
 * the fields op finds, checking every bound of the payload's table.
 *
 * Every byte comes through the transport (io/transport.h): local files, or
 * objects in a store by ranged reads; the reader has one code path for both.
 * Opening reads each shard's header, footer and index region, a chunk of
 * shards' reads in flight together where the transport gains by it (a
 * store's round trips overlap). The fetch stage reads a remote dataset's
 * samples ahead of the workers through locate, with its own requests.
 *
 * Descriptors: up to STK_KEEP_FDS shards stay open for the loader's life
 * (pread on a shared descriptor is thread-safe); beyond that the transport
 * lets go of each shard after its open (idle) and each read opens and closes
 * it, so a dataset of thousands of shards never exhausts the process's
 * descriptor limit.
 */
#include "source/manifest.h"
#include "source/stkformat.h"
#include "source/stkindex.h"
#include "io/remote.h"
#include "io/file.h"
#include "io/transport.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define STK_KEEP_FDS 256

typedef struct shard {
    char *path; /* the object's name for messages: a path, or a URL without secrets */
    char *obj;  /* its name in the transport (a path; relative to the dataset URL) */
    char *tag;  /* its ETag or Last-Modified when the transport said (NULL: none) */
    stk__tobj *o;
    uint8_t *region; /* entries, meta, keys */
    uint64_t first;  /* dataset index of its first sample */
    int64_t maxl;    /* largest label, -1 if none */
    uint64_t bytes;
    bool sized;   /* bytes is known (the file's, a listing's, the manifest's) */
    uint64_t dev; /* identify the object, so one listed twice is found */
    uint64_t ino;
    stk__stk_header h;
    stk__stk_footer f;
    /* Fields shards: the dataset's id of each of the shard's field ids, and
     * the shard's id of the field a read without select delivers (-1: the
     * shard has no such field). */
    uint8_t gid[STK__MAX_FIELDS];
    uint32_t nfields;
    int primary;
} shard;

typedef struct stkset {
    shard *shards;
    size_t n;
    stk__transport *t; /* where the shards' bytes come from (a disk, a store) */
    bool keep_fds;
    stk__manifest man;
    uint64_t total_bytes;
    /* Fields datasets: the dataset's field a read without select delivers
     * (its first image field, else its first), and whether a select asked
     * for whole samples (the fields op then finds every field in them). */
    bool fields;
    int primary;
    bool whole;
} stkset;

static size_t find_shard(const stkset *d, uint64_t i)
{
    size_t lo = 0, hi = d->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->shards[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static void entry_of(const stkset *d, uint64_t i, const shard **sh, uint64_t *j, stk__stk_entry *e)
{
    const shard *s = &d->shards[find_shard(d, i)];
    *sh = s;
    *j = i - s->first;
    stk__stk_entry_decode(s->region + *j * STK_ENTRY_SIZE, e);
}

static int stk_accept(const stk__source *src, uint64_t i, const uint8_t *bytes, size_t len,
                      int64_t *label, char *err, size_t errlen)
{
    const stkset *d = src->impl;
    const shard *s;
    uint64_t j;
    stk__stk_entry e;
    entry_of(d, i, &s, &j, &e);
    uint64_t sum = stk__xxh3(bytes, len);
    if (len != e.length || sum != e.sum) {
        stk__fmt(err, errlen,
                 "checksum mismatch: payload of %u bytes at offset %llu is corrupt (XXH3 "
                 "%016llx, index says %016llx)",
                 e.length, (unsigned long long)e.offset, (unsigned long long)sum,
                 (unsigned long long)e.sum);
        return STK_EFORMAT;
    }
    *label = e.label;
    return STK_OK;
}

/* A fields sample read without select: what a loader without fields gets
 * is the sample's primary field (its image), found in the payload at buf. */
static int primary_of(const stk__source *src, const shard *s, uint8_t *buf, uint8_t **data,
                      size_t *len, char *err, size_t errlen)
{
    const stkset *d = src->impl;
    stk__stk_fref refs[STK__MAX_FIELDS];
    size_t nr;
    int rc = stk__stk_fpayload_parse(buf, *len, s->nfields, refs, &nr, err, errlen);
    if (rc)
        return rc;
    for (size_t k = 0; k < nr; k++) {
        if ((int)refs[k].id == s->primary) {
            *data = buf + refs[k].off;
            *len = refs[k].len;
            return STK_OK;
        }
    }
    stk__fmt(err, errlen,
             "has no field '%s', the one read without fields; ask for the fields it has "
             "(stk_options_set_fields, fields=)",
             src->fields[d->primary].name);
    return STK_EFORMAT;
}

static int stk_read(stk__source *src, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                    int64_t *label, char *err, size_t errlen)
{
    const stkset *d = src->impl;
    const shard *s;
    uint64_t j;
    stk__stk_entry e;
    int rc;
    entry_of(d, i, &s, &j, &e);
    uint8_t *buf = stk__sink_reserve(sink, e.length, &rc);
    if (!buf) {
        if (rc == STK_ETOOBIG)
            stk__fmt(err, errlen, "sample of %u bytes does not fit its %zu-byte budget", e.length,
                     sink->grow ? sink->grow->limit : sink->cap);
        else
            stk__fmt(err, errlen, "out of memory for %u bytes", e.length);
        return rc;
    }
    /* A remote sample read here is one ranged GET: the fetch stage reads
     * the others ahead, through locate (stoker verify reads them all here). */
    stk__trange r, *rp = &r; /* the in fields only: a read sets every out field */
    r.obj = s->o;
    r.off = e.offset;
    r.len = e.length;
    r.buf = buf;
    d->t->ops->read(d->t, &rp, 1);
    if (r.rc) {
        stk__fmt(err, errlen, "%s", r.err);
        return r.rc == STK_ENOENT ? STK_EIO : r.rc;
    }
    if (r.total && r.total != s->bytes) {
        /* Opened from the consolidated index, a shard's size is first
         * seen here: a shard replaced after the pack fails by name. */
        stk__fmt(err, errlen,
                 "the shard is now %llu bytes, not the %llu it had when the dataset was "
                 "opened (replaced since the pack?)",
                 (unsigned long long)r.total, (unsigned long long)s->bytes);
        return STK_EIO;
    }
    if ((rc = stk_accept(src, i, buf, e.length, label, err, errlen)))
        return rc;
    *data = buf;
    *len = e.length;
    if (d->fields && !d->whole)
        return primary_of(src, s, buf, data, len, err, errlen);
    return STK_OK;
}

static void stk_locate(const stk__source *src, uint64_t i, size_t *shard_ix, uint64_t *off,
                       uint64_t *len)
{
    const stkset *d = src->impl;
    size_t k = find_shard(d, i);
    stk__stk_entry e;
    stk__stk_entry_decode(d->shards[k].region + (i - d->shards[k].first) * STK_ENTRY_SIZE, &e);
    *shard_ix = k;
    *off = e.offset;
    *len = e.length;
}

static void stk_key(const stk__source *src, uint64_t i, char *buf, size_t n)
{
    const stkset *d = src->impl;
    const shard *s;
    uint64_t j;
    stk__stk_entry e;
    entry_of(d, i, &s, &j, &e);
    const uint8_t *keys = s->region + s->f.count * (STK_ENTRY_SIZE + s->f.meta_size);
    size_t k = e.key_len < n ? e.key_len : (n ? n - 1 : 0);
    if (n) {
        memcpy(buf, keys + e.key_off, k);
        buf[k] = '\0';
    }
}

static void stk_name(const stk__source *src, uint64_t i, char *buf, size_t n)
{
    const stkset *d = src->impl;
    const shard *s = &d->shards[find_shard(d, i)];
    char key[512];
    stk_key(src, i, key, sizeof key);
    stk__fmt(buf, n, "%s#%llu key '%s'", s->path, (unsigned long long)(i - s->first), key);
}

static int stk_meta(const stk__source *src, uint64_t i, uint32_t *w, uint32_t *h)
{
    const stkset *d = src->impl;
    const shard *s = &d->shards[find_shard(d, i)];
    if (!s->f.meta_size) {
        *w = *h = 0;
        return STK_EUNSUPPORTED;
    }
    const uint8_t *m = s->region + s->f.count * STK_ENTRY_SIZE + (i - s->first) * STK_META_SIZE;
    *w = stk__get32(m);
    *h = stk__get32(m + 4);
    return STK_OK;
}

static const char *stk_class_name(const stk__source *src, uint64_t c)
{
    const stkset *d = src->impl;
    if (!d || c >= d->man.classes || !d->man.class_names)
        return NULL;
    return d->man.class_names[c];
}

static void stk_describe(const stk__source *src, stk__dataset_info *di)
{
    const stkset *d = src->impl;
    di->format = "stk";
    di->payload = stk__payload_kind_name(d->shards[0].h.kind);
    di->shards = d->n;
    di->bytes = d->total_bytes;
    di->restart_indexed = d->man.has_restart ? (int64_t)d->man.restart_indexed : -1;
    /* A resized .stk holds JPEGs; an encoded one the files of whatever it
     * was packed from, which its keys name. */
    di->images = d->shards[0].h.kind == STK_PAYLOAD_RESIZED   ? 1
                 : d->shards[0].h.kind == STK_PAYLOAD_ENCODED ? 2
                                                              : 0;
    if (d->shards[0].h.kind == STK_PAYLOAD_RAW) {
        di->raw_h = d->shards[0].h.raw_h;
        di->raw_w = d->shards[0].h.raw_w;
        di->raw_c = d->shards[0].h.raw_c;
    }
}

static void stk_close(stk__source *src)
{
    stkset *d = src->impl;
    if (!d)
        return;
    for (size_t k = 0; d->t && k < d->n; k++)
        d->t->ops->close_obj(d->t, d->shards[k].o);
    stk__transport_close(d->t);
    for (size_t k = 0; k < d->n; k++) {
        stk__free(d->shards[k].path);
        stk__free(d->shards[k].obj);
        stk__free(d->shards[k].tag);
        stk__free(d->shards[k].region);
    }
    stk__free(d->shards);
    stk__manifest_free(&d->man);
    stk__free(d);
    src->impl = NULL;
}

/* The fields of sample i in its whole payload (bytes, len): the payload's
 * table parsed with every bound checked, ids mapped to the dataset's. */
static int stk_fields(const stk__source *src, uint64_t i, const uint8_t *bytes, size_t len,
                      int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    const stkset *d = src->impl;
    const shard *s = &d->shards[find_shard(d, i)];
    stk__stk_fref refs[STK__MAX_FIELDS];
    size_t nr;
    (void)label;
    fs->n = 0;
    fs->gen_used = 0;
    int rc = stk__stk_fpayload_parse(bytes, len, s->nfields, refs, &nr, err, errlen);
    if (rc)
        return rc;
    for (size_t k = 0; k < nr; k++)
        fs->f[k] = (stk__field_ref){s->gid[refs[k].id], bytes + refs[k].off, refs[k].len};
    fs->n = nr;
    return STK_OK;
}

static const stk__source_ops k_stk_ops = {.kind = "stk",
                                          .read = stk_read,
                                          .name = stk_name,
                                          .close = stk_close,
                                          .locate = stk_locate,
                                          .accept = stk_accept,
                                          .flags = STK__SRC_IMAGES,
                                          .describe = stk_describe,
                                          .key = stk_key,
                                          .class_name = stk_class_name,
                                          .meta = stk_meta};

static int stk_select(stk__source *src, uint64_t mask, char *err, size_t errlen);

/* A fields dataset, before a select: reads give the primary field. Without
 * locate, a remote one is read sample by sample (read), not through the
 * fetch stage, whose bytes go to the worker as fetched, whole. */
static const stk__source_ops k_stk_fields_ops = {.kind = "stk",
                                                 .read = stk_read,
                                                 .name = stk_name,
                                                 .close = stk_close,
                                                 .flags = STK__SRC_IMAGES,
                                                 .describe = stk_describe,
                                                 .key = stk_key,
                                                 .class_name = stk_class_name,
                                                 .meta = stk_meta,
                                                 .select = stk_select,
                                                 .fields = stk_fields};

/* After a select: whole samples, through the fetch stage when remote. */
static const stk__source_ops k_stk_whole_ops = {.kind = "stk",
                                                .read = stk_read,
                                                .name = stk_name,
                                                .close = stk_close,
                                                .flags = STK__SRC_IMAGES,
                                                .describe = stk_describe,
                                                .key = stk_key,
                                                .class_name = stk_class_name,
                                                .meta = stk_meta,
                                                .locate = stk_locate,
                                                .accept = stk_accept,
                                                .select = stk_select,
                                                .fields = stk_fields};

/* A sample is one range holding all its fields: every select reads it
 * whole, whichever fields it names. */
static int stk_select(stk__source *src, uint64_t mask, char *err, size_t errlen)
{
    stkset *d = src->impl;
    (void)mask;
    (void)err;
    (void)errlen;
    d->whole = true;
    src->ops = &k_stk_whole_ops;
    return STK_OK;
}

/* Checks a shard's header and footer bytes (read from anywhere). */
static int parse_ends(shard *s, const uint8_t *hdr, const uint8_t *foot, char *why, size_t wl)
{
    int rc;
    if (s->bytes < STK_HEADER_SIZE + STK_FOOTER_SIZE) {
        stk__fmt(why, wl, "%llu bytes is too short for a shard (truncated)",
                 (unsigned long long)s->bytes);
        return STK_EFORMAT;
    }
    if ((rc = stk__stk_header_decode(hdr, &s->h, why, wl)) ||
        (rc = stk__stk_footer_decode(foot, s->bytes, &s->f, why, wl)))
        return rc;
    return STK_OK;
}

/* Checks a shard's index region (already read into s->region). */
static int check_region(shard *s, size_t rlen, int64_t *max_label, char *why, size_t wl)
{
    if (stk__xxh3(s->region, rlen) != s->f.index_sum) {
        stk__fmt(why, wl, "index checksum mismatch (corrupt index)");
        return STK_EFORMAT;
    }
    return stk__stk_index_check(s->region, &s->f, &s->h, max_label, why, wl);
}

typedef struct file_id {
    uint64_t dev, ino;
    size_t k;
} file_id;

static int cmp_file_id(const void *pa, const void *pb)
{
    const file_id *a = pa, *b = pb;
    if (a->dev != b->dev)
        return a->dev < b->dev ? -1 : 1;
    if (a->ino != b->ino)
        return a->ino < b->ino ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

/* A shard listed twice (a manifest naming it twice, or two names of one
 * file) would deliver its samples twice per epoch: refuse it. Sorting by
 * file identity keeps this O(n log n) for datasets of many shards. */
static int check_distinct(const stkset *d, char *err, size_t errlen)
{
    int rc = STK_OK;
    if (d->n < 2)
        return STK_OK;
    file_id *ids = stk__malloc(d->n * sizeof *ids);
    if (!ids)
        return STK_ENOMEM;
    for (size_t k = 0; k < d->n; k++)
        ids[k] = (file_id){d->shards[k].dev, d->shards[k].ino, k};
    qsort(ids, d->n, sizeof *ids, cmp_file_id);
    for (size_t k = 1; k < d->n; k++) {
        if (ids[k].dev == ids[k - 1].dev && ids[k].ino == ids[k - 1].ino) {
            stk__fmt(err, errlen,
                     "%s: listed twice (shards %zu and %zu of the dataset are the same file); "
                     "each shard must appear once, or its samples would be delivered twice",
                     d->shards[ids[k - 1].k].path, ids[k - 1].k, ids[k].k);
            rc = STK_EFORMAT;
            break;
        }
    }
    stk__free(ids);
    return rc;
}

/* Fields datasets: the union of the shards' field tables (by name, in order
 * of first appearance; a kind the writer knew wins over AUTO; samples
 * added up), each shard's map onto it, and the primary field. */
static int describe_fields(stk__source *src, stkset *d, char *err, size_t errlen)
{
    for (size_t k = 0; k < d->n; k++) {
        shard *s = &d->shards[k];
        stk__stk_fdesc fd[STK__MAX_FIELDS];
        size_t nf;
        uint64_t before =
            s->f.count * ((uint64_t)s->f.entry_size + s->f.meta_size) + s->f.keys_bytes;
        char why[STK_ERRMSG_MAX];
        if (stk__stk_ftable_decode(s->region + before, (size_t)s->f.tail_bytes, fd, &nf, why,
                                   sizeof why)) {
            stk__fmt(err, errlen, "%s: field table: %s", s->path, why);
            return STK_EFORMAT;
        }
        s->nfields = (uint32_t)nf;
        for (size_t j = 0; j < nf; j++) {
            size_t g = 0;
            while (g < src->nfields && (strlen(src->fields[g].name) != fd[j].name_len ||
                                        memcmp(src->fields[g].name, fd[j].name, fd[j].name_len)))
                g++;
            if (g == src->nfields) {
                if (stk__source_add_field(src, (const char *)fd[j].name, fd[j].name_len, fd[j].kind,
                                          0) < 0) {
                    stk__fmt(err, errlen,
                             "%s: the shards have more than %d distinct field names, or out of "
                             "memory",
                             s->path, STK__MAX_FIELDS);
                    return src->nfields >= STK__MAX_FIELDS ? STK_EFORMAT : STK_ENOMEM;
                }
            }
            stk__field_desc *f = &src->fields[g];
            if (f->kind == STK_FIELD_AUTO)
                f->kind = fd[j].kind;
            f->samples += fd[j].samples;
            s->gid[j] = (uint8_t)g;
        }
    }
    d->fields = true;
    d->primary = 0;
    for (size_t g = src->nfields; g-- > 0;) {
        const stk__field_desc *f = &src->fields[g];
        int kind = f->kind ? f->kind : stk_field_kind_for_name(f->name);
        if (kind == STK_FIELD_IMAGE)
            d->primary = (int)g;
    }
    for (size_t k = 0; k < d->n; k++) {
        shard *s = &d->shards[k];
        s->primary = -1;
        for (uint32_t j = 0; j < s->nfields; j++)
            if (s->gid[j] == d->primary)
                s->primary = (int)j;
    }
    return STK_OK;
}

/* After every shard of d is parsed: checks them against the manifest and
 * each other, and fills src. Takes d over (freed on failure). */
static int finish_set(stk__source *src, stkset *d, bool man, const char *where, char *err,
                      size_t errlen)
{
    int rc = STK_OK;
    int64_t maxl = -1;
    uint64_t total = 0;
    if ((rc = check_distinct(d, err, errlen)))
        goto out;
    if (!(src->shard_first = stk__calloc(d->n + 1, sizeof *src->shard_first))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < d->n; k++) {
        shard *s = &d->shards[k];
        if (man && s->f.count != d->man.shards[k].count) {
            stk__fmt(err, errlen, "%s: has %llu samples, the manifest says %llu", s->path,
                     (unsigned long long)s->f.count, (unsigned long long)d->man.shards[k].count);
            rc = STK_EFORMAT;
            goto out;
        }
        const stk__stk_header *h0 = &d->shards[0].h;
        if (s->h.kind != h0->kind || s->h.raw_h != h0->raw_h || s->h.raw_w != h0->raw_w ||
            s->h.raw_c != h0->raw_c) {
            stk__fmt(err, errlen,
                     "%s: payload kind %s %ux%ux%u differs from the first shard's (%s "
                     "%ux%ux%u); a dataset's shards must agree",
                     s->path, stk__payload_kind_name(s->h.kind), s->h.raw_h, s->h.raw_w, s->h.raw_c,
                     stk__payload_kind_name(h0->kind), h0->raw_h, h0->raw_w, h0->raw_c);
            rc = STK_EFORMAT;
            goto out;
        }
        s->first = total;
        src->shard_first[k] = total;
        total += s->f.count;
        d->total_bytes += s->bytes;
        src->index_bytes +=
            s->bytes - STK_FOOTER_SIZE - s->f.index_offset + sizeof *s + strlen(s->path) + 1;
    }
    src->shard_first[d->n] = total;
    src->nshards = d->n;
    for (size_t k = 0; k < d->n; k++) {
        if (d->shards[k].maxl > maxl)
            maxl = d->shards[k].maxl;
        for (uint64_t j = 0; j < d->shards[k].f.count; j++) {
            uint32_t len = stk__get32(d->shards[k].region + j * STK_ENTRY_SIZE + 8);
            if (len > src->max_len)
                src->max_len = len;
        }
    }
    if (!total) {
        stk__fmt(err, errlen, "%s: the shards hold no samples", where);
        rc = STK_EEMPTY;
        goto out;
    }
    if (man && d->man.samples != total) {
        stk__fmt(err, errlen, "%s: shards hold %llu samples, the manifest says %llu", where,
                 (unsigned long long)total, (unsigned long long)d->man.samples);
        rc = STK_EFORMAT;
        goto out;
    }
    src->ops = &k_stk_ops;
    if (d->shards[0].h.kind == STK_PAYLOAD_FIELDS) {
        if ((rc = describe_fields(src, d, err, errlen)))
            goto out;
        src->ops = &k_stk_fields_ops;
    }
    src->impl = d;
    src->count = total;
    src->num_classes = (uint64_t)(maxl + 1);
    if (d->man.classes > src->num_classes)
        src->num_classes = d->man.classes;
    if (d->shards[0].h.kind == STK_PAYLOAD_RAW) {
        src->fixed_len = (size_t)d->shards[0].h.raw_h * d->shards[0].h.raw_w * d->shards[0].h.raw_c;
        src->raw_h = d->shards[0].h.raw_h;
        src->raw_w = d->shards[0].h.raw_w;
        src->raw_c = d->shards[0].h.raw_c;
    }
    src->index_bytes += sizeof *d + (d->n + 1) * sizeof *src->shard_first;
    d = NULL;
out:
    if (d) {
        stk__source tmp = {.impl = d};
        stk_close(&tmp);
        stk__free(src->shard_first);
        src->shard_first = NULL;
        for (size_t k = 0; k < src->nfields; k++)
            stk__free(src->fields[k].name);
        stk__free(src->fields);
        src->fields = NULL;
        src->nfields = 0;
    }
    return rc;
}

/* Opens the objects of shards [a, b): a local file's size and identity
 * (a store's object costs nothing here, its size comes with a read). */
static int open_objects(stkset *d, size_t a, size_t b, char *err, size_t errlen)
{
    char why[STK_ERRMSG_MAX];
    for (size_t k = a; k < b; k++) {
        shard *s = &d->shards[k];
        stk__tinfo info;
        int rc = d->t->ops->open(d->t, s->obj, &s->o, &info, why, sizeof why);
        if (rc) {
            stk__fmt(err, errlen, "%s: %s", s->path, why);
            return rc;
        }
        s->dev = info.dev;
        s->ino = info.ino;
        if (info.sized)
            s->bytes = info.size;
        /* Else the listing's or the manifest's size, when it gave one. */
        s->sized = info.sized || s->bytes;
    }
    return STK_OK;
}

/* Fills r with the read of shard s's footer into hb's footer half. */
static stk__trange *footer_req(stk__trange *r, const shard *s, uint8_t *hb)
{
    *r = (stk__trange){.obj = s->o,
                       .off = s->bytes - STK_FOOTER_SIZE,
                       .len = STK_FOOTER_SIZE,
                       .buf = hb + STK_HEADER_SIZE};
    return r;
}

/* Reads the headers of shards [a, b), and the footers of those whose size
 * is known; a header's read tells the size of the others (a store's
 * Content-Range), whose footers are read next. The reads of each step are
 * in flight together. ends: each shard's header and footer. */
static int read_ends(stkset *d, size_t a, size_t b, stk__trange *q, stk__trange **qp, uint8_t *ends,
                     char *err, size_t errlen)
{
    size_t n = b - a, nq = 0;
    for (size_t k = 0; k < n; k++) {
        shard *s = &d->shards[a + k];
        uint8_t *hb = ends + k * (STK_HEADER_SIZE + STK_FOOTER_SIZE);
        if (!s->sized || s->bytes >= STK_HEADER_SIZE + STK_FOOTER_SIZE) {
            q[2 * k] = (stk__trange){.obj = s->o, .off = 0, .len = STK_HEADER_SIZE, .buf = hb};
            qp[nq++] = &q[2 * k];
        }
        if (s->sized && s->bytes >= STK_HEADER_SIZE + STK_FOOTER_SIZE)
            qp[nq++] = footer_req(&q[2 * k + 1], s, hb);
    }
    d->t->ops->read(d->t, qp, nq);
    nq = 0;
    for (size_t k = 0; k < n; k++) {
        shard *s = &d->shards[a + k];
        const stk__trange *h = &q[2 * k];
        if (!h->obj)
            continue; /* too short to read: parse_ends reports it */
        if (h->rc) {
            stk__fmt(err, errlen, "%s: %s", s->path, h->err);
            return h->rc;
        }
        /* What identifies this version of the object, for the disk cache. */
        if (h->version[0] && !s->tag && !(s->tag = stk__strdup(h->version)))
            return STK_ENOMEM;
        if (s->sized && h->total && h->total != s->bytes) {
            stk__fmt(err, errlen, "%s: is %llu bytes, the listing or manifest says %llu", s->path,
                     (unsigned long long)h->total, (unsigned long long)s->bytes);
            return STK_EFORMAT;
        }
        if (!s->sized) {
            s->bytes = h->total;
            if (!s->bytes) {
                stk__fmt(err, errlen, "%s: the server did not say how large the object is",
                         s->path);
                return STK_EIO;
            }
            if (s->bytes < STK_HEADER_SIZE + STK_FOOTER_SIZE)
                continue; /* parse_ends reports it */
            qp[nq++] = footer_req(&q[2 * k + 1], s, ends + k * (STK_HEADER_SIZE + STK_FOOTER_SIZE));
        }
    }
    d->t->ops->read(d->t, qp, nq);
    return STK_OK;
}

/* Opens shards [a, b) of d: their objects, then headers and footers, then
 * index regions (checksummed and checked), each step's reads in flight
 * together where the transport gains by it (a store's round trips
 * overlap; a local file's reads are preads, one shard after the other). */
static int open_chunk(stkset *d, size_t a, size_t b, char *err, size_t errlen)
{
    int rc = STK_OK;
    size_t n = b - a, nq = 0;
    stk__trange *q = stk__calloc(2 * n, sizeof *q);
    stk__trange **qp = stk__calloc(2 * n, sizeof *qp);
    uint8_t *ends = stk__malloc(n * (STK_HEADER_SIZE + STK_FOOTER_SIZE));
    char why[STK_ERRMSG_MAX];
    if (!q || !qp || !ends) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = open_objects(d, a, b, err, errlen)) ||
        (rc = read_ends(d, a, b, q, qp, ends, err, errlen)))
        goto out;
    for (size_t k = 0; k < n; k++) {
        shard *s = &d->shards[a + k];
        const stk__trange *f = &q[2 * k + 1];
        uint8_t *hb = ends + k * (STK_HEADER_SIZE + STK_FOOTER_SIZE);
        if (f->obj && f->rc) {
            stk__fmt(err, errlen, "%s: %s", s->path, f->err);
            rc = f->rc == STK_ENOENT ? STK_EIO : f->rc;
            goto out;
        }
        if ((rc = parse_ends(s, hb, hb + STK_HEADER_SIZE, why, sizeof why))) {
            stk__fmt(err, errlen, "%s: %s", s->path, why);
            goto out;
        }
        size_t rlen = (size_t)(s->bytes - STK_FOOTER_SIZE - s->f.index_offset);
        if (!(s->region = stk__malloc(rlen ? rlen : 1))) {
            rc = STK_ENOMEM;
            goto out;
        }
        q[2 * k] =
            (stk__trange){.obj = s->o, .off = s->f.index_offset, .len = rlen, .buf = s->region};
        qp[nq++] = &q[2 * k];
    }
    d->t->ops->read(d->t, qp, nq);
    for (size_t k = 0; k < n; k++) {
        shard *s = &d->shards[a + k];
        size_t rlen = (size_t)(s->bytes - STK_FOOTER_SIZE - s->f.index_offset);
        if (q[2 * k].rc) {
            stk__fmt(err, errlen, "%s: %s", s->path, q[2 * k].err);
            rc = q[2 * k].rc == STK_ENOENT ? STK_EIO : q[2 * k].rc;
            goto out;
        }
        if ((rc = check_region(s, rlen, &s->maxl, why, sizeof why))) {
            stk__fmt(err, errlen, "%s: %s", s->path, why);
            goto out;
        }
        if (!d->keep_fds)
            d->t->ops->idle(d->t, s->o);
    }
out:
    stk__free(q);
    stk__free(qp);
    stk__free(ends);
    return rc;
}

/* ---- The consolidated index (stoker.index, stkindex.h) ---------------------
 * A manifest that names an index (by size and XXH3) lets a remote open read
 * every shard's header, footer and index region from that one object: a few
 * ranged GETs in parallel instead of three round trips per shard. What can
 * go wrong, and what the open does:
 *   - the index is missing, truncated or corrupt (it does not parse, or a
 *     shard's part fails the checks a shard's own bytes get): a warning, and
 *     the open reads each shard as without an index;
 *   - it parses but is not the one the manifest names (another checksum), or
 *     its shards are not the manifest's: the index and the manifest (and so
 *     the shards) come from different packs, and the open is refused;
 *   - a shard was replaced after the pack: its reads see another object size
 *     (Content-Range) and fail naming it, and every sample is checked against
 *     its XXH3 in any case, so no byte of another shard is ever delivered.
 * With a cache directory the index is kept on disk in DIR/stoker-index/,
 * named by the object's URL and its checksum, so the ranks of a node fetch
 * it once: the first takes a lock while it fetches, the others wait for it
 * and read the file. */

/* An internal status (positive, never returned to a caller): the index is
 * not usable, and each shard is opened instead. */
#define INDEX_FALLBACK 2

/* Ranged GETs of the index are at most this large, all in flight at once. */
#define INDEX_PART (8u << 20)
/* An index is refused above this size (it holds 40 bytes and a key per
 * sample: 16 GiB is some 200 million samples). */
#define INDEX_MAX (16ull << 30)

/* A warning the open goes on after, to the caller's warning channel: the
 * open succeeds, so no message would show it. */
static void open_warning(const stk__source_params *prm, const char *msg)
{
    stk__warn(prm, "%s", msg);
}

/* The cache file of the index named by id and sum, in DIR/stoker-index/. */
static void index_cache_file(const char *cache_dir, const char *id, uint64_t sum, char *out,
                             size_t n)
{
    stk__fmt(out, n, "%s/stoker-index/%016llx-%016llx.stkindex", cache_dir,
             (unsigned long long)stk__xxh3(id, strlen(id)), (unsigned long long)sum);
}

/* Reads the cached index at path (bytes long, XXH3 sum before its trailer)
 * into a new buffer; NULL when there is none, or it is not whole (a file
 * damaged on disk is fetched again, and replaced). */
static uint8_t *index_cache_read(const char *path, uint64_t bytes, uint64_t sum)
{
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    uint8_t *buf = NULL;
    char why[STK_ERRMSG_MAX];
    if (stk__fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == bytes &&
        (buf = stk__malloc((size_t)bytes)) &&
        stk__pread_full(fd, buf, (size_t)bytes, 0, why, sizeof why) != STK_OK) {
        stk__free(buf);
        buf = NULL;
    }
    stk__close(fd);
    if (buf && stk__xxh3(buf, (size_t)bytes - STK_INDEX_TRAILER) != sum) {
        stk__free(buf);
        buf = NULL;
    }
    return buf;
}

/* Writes the fetched index into the cache (tmp file, rename): best effort,
 * a cache that cannot be written costs the next rank a fetch, no more. */
static void index_cache_write(const char *path, const uint8_t *buf, size_t n)
{
    char tmp[4200];
    stk__fmt(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    int fd = stk__open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    bool ok = stk__write_full(fd, buf, n) == STK_OK;
    if (stk__close(fd) != 0)
        ok = false;
    if (!ok || rename(tmp, path) != 0)
        stk__unlink(tmp);
}

/* Fetches the index object, which the manifest says is `bytes` long, into
 * *out (*len its real length). An index of up to INDEX_PART bytes is one
 * whole-object GET; a larger one is fetched by ranges in parallel, and
 * whole when the ranges fail (an object shorter than the manifest says
 * answers its last range short). The whole-object GET takes at most twice
 * the manifest's size: STK_ETOOBIG beyond. */
static int index_fetch(stk__transport *t, uint64_t bytes, uint8_t **out, size_t *len, char *err,
                       size_t errlen)
{
    int rc = STK_OK;
    size_t np = (size_t)((bytes + INDEX_PART - 1) / INDEX_PART);
    uint8_t *buf = NULL;
    stk__trange *q = NULL, **qp = NULL;
    stk__tobj *o = NULL;
    stk__tinfo info;
    *out = NULL;
    if (np > 1) {
        buf = stk__malloc((size_t)bytes);
        q = stk__calloc(np, sizeof *q);
        qp = stk__calloc(np, sizeof *qp);
        if (!buf || !q || !qp) {
            rc = STK_ENOMEM;
            goto out;
        }
        if ((rc = t->ops->open(t, STK_INDEX_NAME, &o, &info, err, errlen)))
            goto out;
        for (size_t k = 0; k < np; k++) {
            uint64_t off = (uint64_t)k * INDEX_PART;
            q[k] = (stk__trange){.obj = o,
                                 .off = off,
                                 .len = bytes - off < INDEX_PART ? bytes - off : INDEX_PART,
                                 .buf = buf + off};
            qp[k] = &q[k];
        }
        t->ops->read(t, qp, np);
        bool whole = true;
        for (size_t k = 0; k < np; k++) {
            if (q[k].rc == STK_ENOENT) {
                rc = STK_ENOENT;
                goto out;
            }
            whole = whole && !q[k].rc && (info.sized ? info.size : q[k].total) == bytes;
        }
        if (whole) {
            *out = buf;
            *len = (size_t)bytes;
            buf = NULL;
            goto out;
        }
    }
    rc = t->ops->get(t, STK_INDEX_NAME, (size_t)(2 * bytes + (1u << 20)), out, len, err, errlen);
out:
    t->ops->close_obj(t, o);
    stk__free(buf);
    stk__free(q);
    stk__free(qp);
    return rc;
}

/* Opens the shards of d (their names, sizes and paths filled from the
 * manifest) from the dataset's consolidated index. STK_OK: opened;
 * INDEX_FALLBACK: the index is not usable (the warning is written), open each
 * shard instead; else the error, with its message. */
static int open_from_index(stkset *d, const stk__source_params *prm, char *err, size_t errlen)
{
    int rc = STK_OK;
    const stk__manifest *m = &d->man;
    uint8_t *buf = NULL;
    size_t len = (size_t)m->index_bytes;
    stk__stkindex ix = {0};
    int lock_fd = -1;
    bool fetched = false;
    char where[4096], id[4096], cpath[4400] = "", why[STK_ERRMSG_MAX], msg[STK_ERRMSG_MAX + 4400];
    d->t->ops->display(d->t, STK_INDEX_NAME, where, sizeof where);
    if (m->index_bytes < STK_INDEX_HEAD + STK_INDEX_TRAILER || m->index_bytes > INDEX_MAX) {
        stk__fmt(msg, sizeof msg,
                 "%s: the manifest gives it %llu bytes; opening each shard instead", where,
                 (unsigned long long)m->index_bytes);
        open_warning(prm, msg);
        return INDEX_FALLBACK;
    }
    if (prm && prm->cache_dir) {
        d->t->ops->id(d->t, STK_INDEX_NAME, id, sizeof id);
        index_cache_file(prm->cache_dir, id, m->index_sum, cpath, sizeof cpath);
        stk__mkdirs_for(cpath);
        buf = index_cache_read(cpath, m->index_bytes, m->index_sum);
        if (!buf) {
            /* One rank of the node fetches; the others wait for its file.
             * A lock that does not come within a minute (a process stuck
             * holding it) is given up: this rank then fetches for itself. */
            char lpath[4500];
            stk__fmt(lpath, sizeof lpath, "%s.lock", cpath);
            lock_fd = stk__open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            for (int t = 0; lock_fd >= 0 && t < 6000; t++) {
                if (stk__flock(lock_fd, LOCK_EX | LOCK_NB) == 0)
                    break;
                if (errno != EWOULDBLOCK ||
                    (prm->cancel && atomic_load_explicit(prm->cancel, memory_order_relaxed))) {
                    stk__close(lock_fd);
                    lock_fd = -1;
                    break;
                }
                usleep(10000);
            }
            buf =
                index_cache_read(cpath, m->index_bytes, m->index_sum); /* written while we waited */
        }
    }
    if (!buf) {
        /* An object of another size than the manifest's is parsed all the
         * same: that tells an index of another pack (refused) from a broken
         * one (ignored). */
        rc = index_fetch(d->t, m->index_bytes, &buf, &len, why, sizeof why);
        if (rc == STK_ETOOBIG) {
            stk__fmt(msg, sizeof msg,
                     "%s: is more than twice the %llu bytes the manifest gives it; opening each "
                     "shard instead",
                     where, (unsigned long long)m->index_bytes);
            open_warning(prm, msg);
            rc = INDEX_FALLBACK;
            goto out;
        }
        if (rc == STK_ENOENT) {
            stk__fmt(msg, sizeof msg,
                     "%s: the manifest names it but it is not there; opening each shard instead",
                     where);
            open_warning(prm, msg);
            rc = INDEX_FALLBACK;
            goto out;
        }
        if (rc) {
            stk__fmt(err, errlen, "%s: %s", where, why);
            goto out;
        }
        fetched = true;
    }
    if ((rc = stk__stkindex_parse(buf, len, &ix, why, sizeof why))) {
        if (rc == STK_ENOMEM)
            goto out;
        stk__fmt(msg, sizeof msg, "%s: %s; opening each shard instead", where, why);
        open_warning(prm, msg);
        rc = INDEX_FALLBACK;
        goto out;
    }
    if (ix.sum != m->index_sum || len != m->index_bytes) {
        stk__fmt(err, errlen,
                 "%s: is the index of another pack (%zu bytes, checksum %016llx; stoker.manifest "
                 "names %llu bytes, %016llx): the dataset's objects come from different packs. "
                 "Copy the whole packed directory again, or delete stoker.index to open the "
                 "shards without it",
                 where, len, (unsigned long long)ix.sum, (unsigned long long)m->index_bytes,
                 (unsigned long long)m->index_sum);
        rc = STK_EFORMAT;
        goto out;
    }
    bool same = ix.n == d->n;
    for (size_t k = 0; same && k < ix.n; k++)
        same = ix.sh[k].name_len == strlen(d->shards[k].obj) &&
               !memcmp(ix.sh[k].name, d->shards[k].obj, ix.sh[k].name_len) &&
               ix.sh[k].bytes == d->shards[k].bytes && ix.sh[k].count == m->shards[k].count;
    if (!same) {
        stk__fmt(err, errlen,
                 "%s: lists other shards than stoker.manifest (though the manifest names this "
                 "index): the manifest was edited, or its objects come from different packs",
                 where);
        rc = STK_EFORMAT;
        goto out;
    }
    for (size_t k = 0; k < ix.n; k++) {
        shard *s = &d->shards[k];
        if ((rc = stk__stkindex_check_shard(&ix.sh[k], &s->h, &s->f, &s->maxl, why, sizeof why))) {
            stk__fmt(msg, sizeof msg, "%s: shard %s: %s; opening each shard instead", where,
                     d->shards[k].obj, why);
            open_warning(prm, msg);
            rc = INDEX_FALLBACK;
            goto out;
        }
    }
    for (size_t k = 0; k < ix.n; k++) {
        shard *s = &d->shards[k];
        if (!(s->region = stk__malloc(ix.sh[k].region_len ? ix.sh[k].region_len : 1))) {
            rc = STK_ENOMEM;
            goto out;
        }
        memcpy(s->region, ix.sh[k].region, ix.sh[k].region_len);
    }
    if (fetched && cpath[0])
        index_cache_write(cpath, buf, len);
out:
    if (rc == INDEX_FALLBACK)
        for (size_t k = 0; k < d->n; k++) {
            stk__free(d->shards[k].region);
            d->shards[k].region = NULL;
            d->shards[k].maxl = -1;
        }
    if (lock_fd >= 0)
        stk__close(lock_fd); /* releases the lock: the file is in place */
    stk__stkindex_free(&ix);
    stk__free(buf);
    return rc;
}

/* Fills d's shards from names (or the manifest's, when d has one) and
 * their sizes when known (sizes NULL: none). */
static int add_shards(stkset *d, const char *const *names, const uint64_t *sizes, size_t n)
{
    if (!(d->shards = stk__calloc(n, sizeof *d->shards)))
        return STK_ENOMEM;
    d->keep_fds = n <= STK_KEEP_FDS;
    for (size_t k = 0; k < n; k++) {
        shard *s = &d->shards[k];
        s->maxl = -1;
        d->n = k + 1;
        const char *name = d->man.shards ? d->man.shards[k].name : names[k];
        char where[4096];
        d->t->ops->display(d->t, name, where, sizeof where);
        if (!(s->obj = stk__strdup(name)) || !(s->path = stk__strdup(where)))
            return STK_ENOMEM;
        s->bytes = d->man.shards ? d->man.shards[k].bytes : sizes ? sizes[k] : 0;
    }
    return STK_OK;
}

/* Opens every shard of d: from the consolidated index when use_index and
 * it is usable, else each shard's own header, footer and index, in chunks
 * of the transport's batch (bounded memory for the reads in flight). */
static int open_shards(stkset *d, const stk__source_params *prm, bool use_index, char *err,
                       size_t errlen)
{
    int rc = use_index ? open_from_index(d, prm, err, errlen) : INDEX_FALLBACK;
    if (rc == STK_OK)
        return open_objects(d, 0, d->n, err, errlen);
    if (rc != INDEX_FALLBACK)
        return rc;
    size_t chunk = d->t->ops->batch ? d->t->ops->batch : 1;
    for (size_t a = 0; a < d->n; a += chunk)
        if ((rc = open_chunk(d, a, a + chunk < d->n ? a + chunk : d->n, err, errlen)))
            return rc;
    return STK_OK;
}

int stk__source_stk_open(stk__source *src, const char *const *paths, size_t n, const char *dir,
                         char *err, size_t errlen)
{
    int rc = STK_OK;
    stkset *d = NULL;
    bool man = false;
    memset(src, 0, sizeof *src);
    if (!(d = stk__calloc(1, sizeof *d))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if (dir) {
        rc = stk__manifest_read(dir, &d->man, err, errlen);
        if (rc == STK_OK)
            man = true;
        else if (rc != STK_ENOENT)
            goto out;
        rc = STK_OK;
        if (!man && stk__pack_unfinished(dir)) {
            stk__fmt(
                err, errlen,
                "%s: holds an unfinished or interrupted pack (no manifest yet, and "
                "a pack marker or *.stk.tmp file); remove the directory and run stoker pack again",
                dir);
            rc = STK_EFORMAT;
            goto out;
        }
    }
    size_t ns = man ? d->man.nshards : n;
    if (!ns) {
        stk__fmt(err, errlen, "%s: no shards", dir ? dir : "dataset");
        rc = STK_EEMPTY;
        goto out;
    }
    /* A manifest names its shards relative to its directory. A local open
     * reads each shard's own index (one pread each, no round trips to save). */
    if ((rc = stk__transport_file(&d->t, man ? dir : NULL)) ||
        (rc = add_shards(d, paths, NULL, ns)) || (rc = open_shards(d, NULL, false, err, errlen)))
        goto out;
    rc = finish_set(src, d, man, dir ? dir : d->shards[0].path, err, errlen);
    d = NULL;
out:
    if (d) {
        stk__source tmp = {.impl = d};
        stk_close(&tmp);
    }
    return rc;
}

int stk__source_stk_open_remote(stk__source *src, stk__remote *r, const char *const *names,
                                const uint64_t *sizes, size_t n, stk__manifest *man,
                                const stk__source_params *prm, char *err, size_t errlen)
{
    int rc = STK_OK;
    memset(src, 0, sizeof *src);
    src->remote = r;
    stkset *d = stk__calloc(1, sizeof *d);
    if (!d) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = stk__transport_remote(&d->t, r)))
        goto out;
    if (man) {
        d->man = *man;
        memset(man, 0, sizeof *man);
        n = d->man.nshards;
    }
    if (!n) {
        stk__fmt(err, errlen, "%s: no shards", stk__remote_display(r));
        rc = STK_EEMPTY;
        goto out;
    }
    /* The fetch stage's table of the shards (source.h). */
    if (!(src->shard_objs = stk__calloc(n, sizeof *src->shard_objs)) ||
        !(src->shard_bytes = stk__calloc(n, sizeof *src->shard_bytes)) ||
        !(src->shard_tags = stk__calloc(n, sizeof *src->shard_tags)) ||
        !(src->shard_ids = stk__calloc(n, sizeof *src->shard_ids))) {
        rc = STK_ENOMEM;
        goto out;
    }
    src->nshards_objs_ = n;
    /* A store's consolidated index saves each shard's three round trips. */
    if ((rc = add_shards(d, names, sizes, n)) ||
        (rc = open_shards(d, prm, d->man.has_index && !(prm && prm->no_index), err, errlen)))
        goto out;
    rc = STK_OK;
    for (size_t k = 0; k < n; k++) {
        if (!(src->shard_objs[k] = stk__strdup(d->shards[k].obj))) {
            rc = STK_ENOMEM;
            goto out;
        }
        src->shard_bytes[k] = d->shards[k].bytes;
        src->shard_tags[k] = d->shards[k].tag;
        d->shards[k].tag = NULL;
        if (!src->shard_tags[k]) {
            /* Opened from the index, no ETag was seen: the index region's
             * checksum identifies the shard's content (its entries hold
             * every payload's XXH3-64). */
            char id[32];
            stk__fmt(id, sizeof id, "stk-%016llx", (unsigned long long)d->shards[k].f.index_sum);
            if (!(src->shard_ids[k] = stk__strdup(id))) {
                rc = STK_ENOMEM;
                goto out;
            }
        }
    }
    rc = finish_set(src, d, d->man.shards != NULL, stk__remote_display(r), err, errlen);
    d = NULL;
out:
    if (d) {
        stk__source tmp = {.impl = d};
        stk_close(&tmp);
    }
    if (rc)
        stk__source_free_common(src);
    return rc;
}
