/*
 * dataset_api.c -- the public dataset-inspection surface (stk_dataset_*):
 * open a dataset without a loader, describe it, list its shards and class
 * names, read a sample's key and bytes, and verify every sample and the
 * manifest (what `stoker info` and `stoker verify` print). Built on the
 * source layer (src/source/dataset.h).
 */
#include "internal.h"

#include "codec/jpeg_restart.h"
#include "io/file.h"
#include "io/remote.h"
#include "options.h"
#include "pack/pack.h"
#include "source/dataset.h"
#include "source/manifest.h"
#include "source/stkindex.h"
#include "source/stkformat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct stk_dataset {
    stk__source src;
    char *path;
    stk__dataset_info di;
    stk__scratch sc; /* the last stk_dataset_read's bytes */
};

int stk_dataset_open(stk_dataset **out, const char *path, const stk_options *o, char *err,
                     size_t errlen)
{
    stk__source_params prm;
    stk__remote_cfg rcfg;
    stk_dataset *d = NULL;
    int rc = STK_OK;
    if (out)
        *out = NULL;
    if (!out || !path || !*path) {
        stk__fmt(err, errlen, "stk_dataset_open: %s", !out ? "out is NULL" : "no dataset path");
        return STK_EINVAL;
    }
    if (!(d = stk__calloc(1, sizeof *d)) || !(d->path = stk__strdup(path))) {
        stk__fmt(err, errlen, "stk_dataset_open: out of memory");
        rc = STK_ENOMEM;
        goto out;
    }
    stk__options_source_params(o, &prm, &rcfg);
    if ((rc = stk__source_open(&d->src, path, &prm, err, errlen)))
        goto out;
    stk__source_describe(&d->src, &d->di);
    d->sc.limit = (size_t)1 << 40;
out:
    if (rc && d) {
        stk__free(d->path);
        stk__free(d);
        d = NULL;
    }
    *out = d;
    return rc;
}

void stk_dataset_close(stk_dataset *d)
{
    if (!d)
        return;
    stk__source_close(&d->src);
    stk__scratch_free(&d->sc);
    stk__free(d->path);
    stk__free(d);
}

int stk_dataset_describe(const stk_dataset *d, stk_dataset_info *info)
{
    if (!d || !info || info->struct_size < sizeof(stk_dataset_info))
        return STK_EINVAL;
    *info = (stk_dataset_info){.struct_size = sizeof *info,
                               .kind = d->di.format,
                               .payload = d->di.payload,
                               .samples = d->src.count,
                               .classes = d->src.num_classes,
                               .shards = d->src.nshards,
                               .bytes = d->di.bytes,
                               .files = d->di.shards,
                               .sample_bytes = d->src.fixed_len,
                               .raw_h = d->di.raw_h,
                               .raw_w = d->di.raw_w,
                               .raw_c = d->di.raw_c,
                               .restart_indexed = d->di.restart_indexed,
                               .index_bytes = d->src.index_bytes};
    return STK_OK;
}

int stk_dataset_shard(const stk_dataset *d, uint64_t k, stk_dataset_shard_info *info)
{
    if (!d || !info || info->struct_size < sizeof(stk_dataset_shard_info) || k >= d->src.nshards)
        return STK_EINVAL;
    *info = (stk_dataset_shard_info){
        .struct_size = sizeof *info,
        .first = d->src.shard_first[k],
        .count = d->src.shard_first[k + 1] - d->src.shard_first[k],
        .name = d->src.shard_objs && k < d->src.nshards_objs_ ? d->src.shard_objs[k] : NULL,
        .bytes = d->src.shard_bytes ? d->src.shard_bytes[k] : 0};
    return STK_OK;
}

const char *stk_dataset_class_name(const stk_dataset *d, uint64_t c)
{
    return d ? stk__source_class_name(&d->src, c) : NULL;
}

size_t stk_dataset_field_count(const stk_dataset *d)
{
    return d ? d->src.nfields : 0;
}

int stk_dataset_field(const stk_dataset *d, size_t k, stk_dataset_field_info *info)
{
    if (!d || !info || info->struct_size < sizeof(stk_dataset_field_info) || k >= d->src.nfields)
        return STK_EINVAL;
    const stk__field_desc *f = &d->src.fields[k];
    *info = (stk_dataset_field_info){
        .struct_size = sizeof *info, .name = f->name, .kind = f->kind, .samples = f->samples};
    return STK_OK;
}

int stk_dataset_sample_key(const stk_dataset *d, uint64_t i, char *buf, size_t n)
{
    if (!d || !buf || !n || i >= d->src.count)
        return STK_EINVAL;
    stk__source_key(&d->src, d->path, i, buf, n);
    return STK_OK;
}

int stk_dataset_read(stk_dataset *d, uint64_t i, const void **data, size_t *len, int64_t *label,
                     char *err, size_t errlen)
{
    uint8_t *p = NULL;
    size_t l = 0;
    int64_t lab = -1;
    if (!d || !data || !len || i >= d->src.count) {
        stk__fmt(err, errlen, "stk_dataset_read: %s",
                 !d || !data || !len ? "a NULL argument" : "sample index past the end");
        return STK_EINVAL;
    }
    stk__sink sink = {.grow = &d->sc};
    char why[STK_ERRMSG_MAX];
    int rc = d->src.ops->read(&d->src, i, &sink, &p, &l, &lab, why, sizeof why);
    if (rc) {
        char name[4096];
        d->src.ops->name(&d->src, i, name, sizeof name);
        stk__fmt(err, errlen, "sample %" PRIu64 " (%s): %s", i, name, why);
        return rc;
    }
    *data = p;
    *len = l;
    if (label)
        *label = lab;
    return STK_OK;
}

/* ---- Verify -------------------------------------------------------------- */

typedef struct vctx {
    stk_verify_result *r;
    stk_verify_fn fn;
    void *user;
    uint64_t max_input;
} vctx;

static void report(vctx *v, int kind, const char *name, uint64_t index, uint64_t samples,
                   const char *reason)
{
    if (kind == STK_VERIFY_MANIFEST)
        v->r->manifest++;
    if (!v->fn)
        return;
    stk_verify_problem p = {.struct_size = sizeof p,
                            .kind = kind,
                            .name = name ? name : "",
                            .reason = reason,
                            .index = index,
                            .samples = samples};
    v->fn(&p, v->user);
}

/* A value each_value gives (a Parquet list's element): an image field's
 * must be an image (stk__check_image). */
typedef struct vval {
    vctx *v;
    char *err;
    size_t errlen;
} vval;

static int check_value(void *user, const char *field, int kind, const uint8_t *p, size_t n)
{
    vval *x = user;
    const char *format = NULL;
    char why[STK_ERRMSG_MAX];
    if (kind == STK_FIELD_AUTO)
        kind = stk_field_kind_for_name(field);
    if (kind != STK_FIELD_IMAGE)
        return STK_OK;
    if (stk__check_image(p, n, &format, why, sizeof why)) {
        stk__fmt(x->err, x->errlen, "field '%s': %s", field, why);
        return STK_EFORMAT;
    }
    if (format && strcmp(format, "JPEG") && strcmp(format, "PNG") && !x->v->r->foreign++)
        x->v->r->foreign_format = format;
    return STK_OK;
}

/* Reads every sample of s, reporting each failure; samples that claim to be
 * images (stk__images_of) must also be images, and so must the image values
 * the source's each_value gives. root: the path s was opened
 * from (for keys). */
static void verify_source(stk__source *s, const char *root, vctx *v)
{
    stk__scratch sc = {NULL, 0, 1u << 30};
    char err[STK_ERRMSG_MAX], name[4096], key[4096], why[STK_ERRMSG_MAX + 256];
    int images = stk__images_of(s);
    /* A source with fields of its own: whole samples, each checked by its
     * fields op (a .stk sample's field table), not just the field a read
     * without select gives. */
    stk__field_set *fs = NULL;
    if (s->ops->fields && s->ops->select && (fs = stk__malloc(sizeof *fs)) &&
        s->ops->select(s, ~(uint64_t)0, err, sizeof err) != STK_OK) {
        stk__free(fs);
        fs = NULL;
    }
    for (uint64_t i = 0; i < s->count; i++) {
        stk__sink sink = {.grow = &sc};
        uint8_t *data;
        size_t len;
        int64_t label;
        const char *format = NULL;
        int rc = s->ops->read(s, i, &sink, &data, &len, &label, err, sizeof err);
        if (rc == STK_OK && fs)
            rc = s->ops->fields(s, i, data, len, label, fs, err, sizeof err);
        if (rc == STK_OK && s->ops->each_value) {
            /* What the read leaves out or unchecked (a list's elements). */
            vval x = {v, err, sizeof err};
            rc = s->ops->each_value(s, i, check_value, &x, err, sizeof err);
        }
        if (rc == STK_OK && len >= 3 && data[0] == 0xFF && data[1] == 0xD8) {
            /* A restart index must match its payload in full. */
            stk__rst x;
            int f = stk__rst_find(data, len, &x, err, sizeof err);
            if (f < 0 || (f == 1 && stk__rst_verify(data, len, &x, err, sizeof err)))
                rc = STK_EFORMAT;
            else
                v->r->indexed += (uint64_t)f;
        }
        if (rc == STK_OK && images) {
            if (images == 2)
                stk__source_key(s, root, i, key, sizeof key);
            if ((images == 1 || stk__image_name(key)) &&
                stk__check_image(data, len, &format, err, sizeof err))
                rc = STK_EFORMAT;
            else if (format && strcmp(format, "JPEG") && strcmp(format, "PNG") && !v->r->foreign++)
                v->r->foreign_format = format;
        }
        if (rc) {
            s->ops->name(s, i, name, sizeof name);
            v->r->corrupt++;
            report(v, STK_VERIFY_CORRUPT, name, i, 1, err);
        } else if (len > v->max_input && len >= 3 &&
                   ((data[0] == 0xFF && data[1] == 0xD8) || !memcmp(data, "\x89PN", 3))) {
            /* Intact, but no decode takes it: every run with a transform
             * would fail this sample. */
            s->ops->name(s, i, name, sizeof name);
            stk__fmt(why, sizeof why,
                     "an image of %zu bytes, over max_input_bytes (%" PRIu64
                     "): every decode refuses it; raise the limit (--max-input-bytes, "
                     "options={\"max_input_bytes\": N}) or re-encode it (pack --max-side)",
                     len, v->max_input);
            v->r->too_large++;
            report(v, STK_VERIFY_TOO_LARGE, name, i, 1, why);
        }
    }
    v->r->checked += s->count;
    stk__scratch_free(&sc);
    stk__free(fs);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads the header and footer of the .stk file at path, without trusting
 * the rest. Returns a mask: 1 the header decoded, 2 the footer did. */
static int read_ends(const char *path, stk__stk_header *h, stk__stk_footer *f)
{
    char why[STK_ERRMSG_MAX];
    uint8_t hdr[STK_HEADER_SIZE], foot[STK_FOOTER_SIZE];
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC), ok = 0;
    struct stat st;
    if (fd < 0)
        return 0;
    if (stk__fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size >= STK_HEADER_SIZE + STK_FOOTER_SIZE) {
        if (!stk__pread_full(fd, hdr, sizeof hdr, 0, why, sizeof why) &&
            !stk__stk_header_decode(hdr, h, why, sizeof why))
            ok |= 1;
        if (!stk__pread_full(fd, foot, sizeof foot, (uint64_t)st.st_size - STK_FOOTER_SIZE, why,
                             sizeof why) &&
            !stk__stk_footer_decode(foot, (uint64_t)st.st_size, f, why, sizeof why))
            ok |= 2;
    }
    stk__close(fd);
    return ok;
}

static int cmp_shard_name(const void *a, const void *b)
{
    const stk__manifest_shard *x = *(const stk__manifest_shard *const *)a;
    const stk__manifest_shard *y = *(const stk__manifest_shard *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x < y ? -1 : x > y);
}

/* Reports each shard the manifest m lists twice. */
static void check_manifest_twice(const char *dir, const stk__manifest *m, vctx *v)
{
    char why[8192];
    const stk__manifest_shard **byname = NULL;
    if (!m->nshards || !(byname = stk__malloc(m->nshards * sizeof *byname)))
        return;
    for (size_t k = 0; k < m->nshards; k++)
        byname[k] = &m->shards[k];
    qsort(byname, m->nshards, sizeof *byname, cmp_shard_name);
    for (size_t k = 1; k < m->nshards; k++)
        if (!strcmp(byname[k]->name, byname[k - 1]->name)) {
            stk__fmt(why, sizeof why,
                     "shard %s is listed twice (entries %zu and %zu): its samples would be "
                     "read twice",
                     byname[k]->name, (size_t)(byname[k - 1] - m->shards),
                     (size_t)(byname[k] - m->shards));
            report(v, STK_VERIFY_MANIFEST, dir, UINT64_MAX, 0, why);
        }
    stk__free(byname);
}

/* Checks what the manifest of directory dir says against its shards: each
 * shard listed once and present, its size, payload kind, sample count and
 * class count; the total of samples. Reports each disagreement. */
static void check_manifest(const char *dir, const stk__manifest *m, vctx *v)
{
    uint64_t total = 0;
    char why[8192];
    check_manifest_twice(dir, m, v);
    for (size_t k = 0; k < m->nshards; k++) {
        const stk__manifest_shard *ms = &m->shards[k];
        char path[4096];
        stk__stk_header h;
        stk__stk_footer f;
        struct stat st;
        total += ms->count;
        stk__fmt(path, sizeof path, "%s/%s", dir, ms->name);
        if (stk__stat(path, &st) != 0) {
            stk__fmt(why, sizeof why, "listed in the manifest, but %s", strerror(errno));
            report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
            continue;
        }
        if ((uint64_t)st.st_size != ms->bytes) {
            stk__fmt(why, sizeof why, "%" PRIu64 " bytes, the manifest says %" PRIu64,
                     (uint64_t)st.st_size, ms->bytes);
            report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
        }
        /* What does not decode, the shard checks report. */
        int ends = read_ends(path, &h, &f);
        if ((ends & 1) && h.kind != m->kind) {
            stk__fmt(why, sizeof why, "payload kind %s, the manifest says %s",
                     stk__payload_kind_name(h.kind), stk__payload_kind_name(m->kind));
            report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
        }
        if (!(ends & 2))
            continue;
        if (f.count != ms->count) {
            stk__fmt(why, sizeof why, "%" PRIu64 " samples, the manifest says %" PRIu64, f.count,
                     ms->count);
            report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
        }
        if (f.num_classes != m->classes) {
            stk__fmt(why, sizeof why, "written for %" PRIu64 " classes, the manifest says %" PRIu64,
                     f.num_classes, m->classes);
            report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
        }
    }
    if (total != m->samples) {
        stk__fmt(why, sizeof why,
                 "the shards listed hold %" PRIu64 " samples, the manifest says %" PRIu64, total,
                 m->samples);
        report(v, STK_VERIFY_MANIFEST, dir, UINT64_MAX, 0, why);
    }
}

/* Do the shards' parts of an index built from them pass their own checks?
 * A shard whose bytes are broken is reported by the shard checks; the index
 * is compared only with intact shards. */
static bool shards_intact(const uint8_t *p, size_t n)
{
    stk__stkindex ix;
    char why[STK_ERRMSG_MAX];
    bool ok = stk__stkindex_parse(p, n, &ix, why, sizeof why) == STK_OK;
    for (size_t k = 0; ok && k < ix.n; k++) {
        stk__stk_header h;
        stk__stk_footer f;
        int64_t maxl;
        ok = stk__stkindex_check_shard(&ix.sh[k], &h, &f, &maxl, why, sizeof why) == STK_OK;
    }
    if (ix.sh)
        stk__stkindex_free(&ix);
    return ok;
}

/* Checks the consolidated index the manifest of dir names (stoker.index):
 * there, the size and checksum the manifest gives, and equal to the index
 * the shards make now (so a shard rewritten since the pack, or an index of
 * another pack, is reported). A remote open would ignore a missing or
 * damaged index with a warning, and refuse another pack's. */
static void check_index(const char *dir, const stk__manifest *m, vctx *v)
{
    char path[4096], why[STK_ERRMSG_MAX + 256], berr[STK_ERRMSG_MAX];
    uint8_t *built = NULL, *have = NULL;
    size_t blen = 0, hlen = 0;
    uint64_t bsum = 0;
    if (!m->has_index)
        return;
    stk__fmt(path, sizeof path, "%s/%s", dir, STK_INDEX_NAME);
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        stk__fmt(why, sizeof why,
                 "named by the manifest, but %s (a remote open reads each shard "
                 "instead)",
                 strerror(errno));
        report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
        return;
    }
    if (stk__fstat(fd, &st) == 0 && (uint64_t)st.st_size == m->index_bytes &&
        (have = stk__malloc((size_t)m->index_bytes ? (size_t)m->index_bytes : 1)) &&
        stk__pread_full(fd, have, (size_t)m->index_bytes, 0, berr, sizeof berr) == STK_OK)
        hlen = (size_t)m->index_bytes;
    stk__close(fd);
    if (hlen < STK_INDEX_TRAILER || stk__xxh3(have, hlen - STK_INDEX_TRAILER) != m->index_sum) {
        stk__fmt(why, sizeof why,
                 "is not the index the manifest names (%" PRIu64 " bytes, XXH3 %016" PRIx64
                 "): damaged, or another pack's",
                 m->index_bytes, m->index_sum);
        report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
    } else if (stk__stkindex_build(dir, m, &built, &blen, &bsum, berr, sizeof berr) == STK_OK &&
               (blen != hlen || memcmp(built, have, hlen)) && shards_intact(built, blen)) {
        stk__fmt(why, sizeof why,
                 "does not describe the shards as they are now (their index is XXH3 %016" PRIx64
                 "): an intact shard was replaced since the pack",
                 bsum);
        report(v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, why);
    }
    stk__free(have);
    stk__free(built);
}

/* A list of shard names and their sample counts (UINT64_MAX: unknown). */
typedef struct shard_list {
    char **names;
    uint64_t *counts;
    size_t n, cap;
} shard_list;

static bool shard_list_add(shard_list *l, const char *name, uint64_t count)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **q = stk__realloc(l->names, cap * sizeof *q);
        if (!q)
            return false;
        l->names = q;
        uint64_t *c = stk__realloc(l->counts, cap * sizeof *c);
        if (!c)
            return false;
        l->counts = c;
        l->cap = cap;
    }
    if (!(l->names[l->n] = stk__strdup(name)))
        return false;
    l->counts[l->n++] = count;
    return true;
}

static void shard_list_free(shard_list *l)
{
    for (size_t k = 0; k < l->n; k++)
        stk__free(l->names[k]);
    stk__free(l->names);
    stk__free(l->counts);
    memset(l, 0, sizeof *l);
}

static bool shard_name(const char *name)
{
    size_t l = strlen(name);
    return l >= 5 && (!strcmp(name + l - 4, ".stk") || !strcmp(name + l - 4, ".tar"));
}

/* The manifest's shards, each once, in its order. */
static void list_manifest_shards(const stk__manifest *m, shard_list *l)
{
    for (size_t k = 0; k < m->nshards; k++) {
        bool seen = false;
        for (size_t j = 0; j < l->n && !seen; j++)
            seen = !strcmp(l->names[j], m->shards[k].name);
        if (!seen && !shard_list_add(l, m->shards[k].name, m->shards[k].count))
            return;
    }
}

/* The shard files of directory dir: the manifest's if it has one, else
 * every .stk and .tar file by name. */
static void list_shards(const char *dir, const stk__manifest *m, shard_list *l)
{
    if (m && m->nshards) {
        list_manifest_shards(m, l);
        return;
    }
    struct stat st;
    DIR *d = stk__stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? stk__opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = stk__readdir(d)))
        if (shard_name(e->d_name) && !shard_list_add(l, e->d_name, UINT64_MAX))
            break;
    if (d)
        stk__closedir(d);
    if (l->n)
        qsort(l->names, l->n, sizeof *l->names, cmp_str);
    /* counts stay with their names: all UINT64_MAX here */
}

/* The shards of the remote directory url, as stk__source_open would find
 * them: its manifest's, else the .stk or .tar objects a listing finds (S3),
 * by name. None when they cannot be found (a single object, a plain HTTP
 * server without a manifest, a brace pattern). */
static void list_remote_shards(const char *url, const stk__source_params *prm, shard_list *l)
{
    char **lnames = NULL, *text = NULL, err[STK_ERRMSG_MAX];
    uint64_t *lsizes = NULL;
    size_t ln = 0, tlen = 0;
    stk__remote *r = NULL;
    stk__remote_cfg none = {0};
    if (strchr(url, '{') ||
        stk__remote_open(&r, url, prm->remote ? prm->remote : &none, err, sizeof err))
        return;
    if (stk__remote_names_object(r))
        goto out;
    int rc = stk__remote_get_small(r, STK_MANIFEST, 64u << 20, &text, &tlen, err, sizeof err);
    if (rc == STK_OK) {
        stk__manifest man;
        if (stk__manifest_parse(text, tlen, url, &man, err, sizeof err) == STK_OK) {
            list_manifest_shards(&man, l);
            stk__manifest_free(&man);
        }
        goto out;
    }
    if (rc != STK_ENOENT || stk__remote_list(r, &lnames, &lsizes, &ln, err, sizeof err))
        goto out;
    for (size_t k = 0; k < ln; k++)
        if (shard_name(lnames[k]) && !shard_list_add(l, lnames[k], UINT64_MAX))
            break;
    if (l->n)
        qsort(l->names, l->n, sizeof *l->names, cmp_str);
out:
    stk__free(text);
    stk__remote_list_free(lnames, lsizes, ln);
    stk__remote_close(r);
}

/* The dataset at path does not open as a whole: checks it shard by shard, so
 * one broken shard does not hide the state of the others, and counts what
 * could not be checked. STK_OK, or the open's error when there are no
 * shards to check. */
static int verify_shards(const char *path, const stk__source_params *prm, const stk__manifest *man,
                         const char *open_err, vctx *v)
{
    shard_list l = {0};
    bool remote = stk__is_url(path);
    char shown[4096], one_shown[4096], why[STK_ERRMSG_MAX], msg[STK_ERRMSG_MAX + 128];
    if (remote)
        list_remote_shards(path, prm, &l);
    else
        list_shards(path, man, &l);
    if (!l.n) {
        shard_list_free(&l);
        return STK_EFORMAT;
    }
    report(v, STK_VERIFY_DATASET, stk__url_display(path, shown, sizeof shown), UINT64_MAX, 0,
           open_err);
    for (size_t k = 0; k < l.n; k++) {
        char one[4096];
        size_t pl = strlen(path);
        while (remote && pl && path[pl - 1] == '/')
            pl--;
        stk__fmt(one, sizeof one, "%.*s/%s", (int)pl, path, l.names[k]);
        /* A remote shard is opened with the dataset's remote settings
         * (endpoint, credentials' region, cache), each on its own. */
        stk__source_params none = {0};
        stk__source s;
        int r = stk__source_open(&s, one, remote ? prm : &none, why, sizeof why);
        if (r == STK_OK) {
            verify_source(&s, one, v);
            stk__source_close(&s);
            continue;
        }
        stk__stk_header h;
        stk__stk_footer f;
        uint64_t c = l.counts[k];
        if (c == UINT64_MAX && !remote && (read_ends(one, &h, &f) & 2))
            c = f.count; /* the footer is intact: it knows the count */
        if (c != UINT64_MAX)
            stk__fmt(msg, sizeof msg, "the whole shard (%" PRIu64 " samples): %s", c, why);
        else
            stk__fmt(msg, sizeof msg, "the whole shard: %s", why);
        v->r->bad_shards++;
        if (c == UINT64_MAX)
            v->r->uncounted_shards++;
        else
            v->r->unreadable += c;
        report(v, STK_VERIFY_SHARD, stk__url_display(one, one_shown, sizeof one_shown), UINT64_MAX,
               c, msg);
    }
    shard_list_free(&l);
    return STK_OK;
}

int stk_dataset_verify(const char *path, const stk_options *o, stk_verify_fn fn, void *user,
                       stk_verify_result *res, char *err, size_t errlen)
{
    stk__source_params prm;
    stk__remote_cfg rcfg;
    stk__source s;
    stk__manifest man;
    char why[STK_ERRMSG_MAX], msg[STK_ERRMSG_MAX + 128];
    bool have_man = false;
    struct stat st;
    if (!path || !*path || !res || res->struct_size < sizeof(stk_verify_result)) {
        stk__fmt(err, errlen, "stk_dataset_verify: %s",
                 !path || !*path ? "no dataset path" : "res is NULL or its struct_size too small");
        return STK_EINVAL;
    }
    *res = (stk_verify_result){.struct_size = sizeof *res, .whole = 1};
    vctx v = {res, fn, user, o ? o->max_input_bytes : (uint64_t)32 << 20};
    stk__options_source_params(o, &prm, &rcfg);
    prm.no_index = true; /* every shard's own header, footer and index */
    if (!stk__is_url(path) && stk__stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        int mrc = stk__manifest_read(path, &man, why, sizeof why);
        if (mrc == STK_OK) {
            have_man = true;
            check_manifest(path, &man, &v);
            check_index(path, &man, &v);
        } else if (mrc != STK_ENOENT) {
            report(&v, STK_VERIFY_MANIFEST, NULL, UINT64_MAX, 0, why);
        }
    }
    int rc = stk__source_open(&s, path, &prm, why, sizeof why);
    if (rc == STK_OK) {
        if (have_man && s.num_classes > man.classes) {
            stk__fmt(msg, sizeof msg,
                     "labels go up to %" PRIu64 ", the manifest says %" PRIu64 " classes",
                     s.num_classes - 1, man.classes);
            report(&v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, msg);
        }
        verify_source(&s, path, &v);
        stk__source_close(&s);
        if (have_man && man.has_restart && man.restart_indexed != res->indexed && !res->corrupt) {
            stk__fmt(msg, sizeof msg,
                     "%" PRIu64 " samples carry a restart index, the manifest says %" PRIu64,
                     res->indexed, man.restart_indexed);
            report(&v, STK_VERIFY_MANIFEST, path, UINT64_MAX, 0, msg);
        }
    } else {
        res->whole = 0;
        int src = verify_shards(path, &prm, have_man ? &man : NULL, why, &v);
        if (src) {
            char shown[4096];
            stk__fmt(err, errlen, "cannot open %s: %s (%s)",
                     stk__url_display(path, shown, sizeof shown), why, stk_strerror(rc));
        } else {
            rc = STK_OK;
        }
    }
    if (have_man)
        stk__manifest_free(&man);
    return rc;
}

const char *stk_path_display(const char *path, char *buf, size_t n)
{
    return path ? stk__url_display(path, buf, n) : "";
}
