/*
 * mix.c -- a mixture of sources as one source (docs/mixing.md): child s's
 * sample j is the mixture's sample offset[s] + j, and every op dispatches to
 * the child with the local index. The children may be of any kind (opened by
 * stk__source_open, so this file sits at dataset.h's level, above the
 * readers). Which sample is read at each position is the schedule's
 * (schedule/mix.h); this file only knows ids.
 *
 * Fields: the mixture's fields are the union of its children's by name (a
 * map per child from its field ids to the mixture's), plus "source", the
 * child's index as an INT field, when no child has a field of that name. The
 * loader checks that each child has every requested field
 * (stk__source_mix_check_field). A name the union lacks (a Parquet list's
 * element, "images[0]") is resolved through each child that resolves names
 * (mix_field_named).
 *
 * Remote children (docs/remote.md): a child whose samples are byte ranges
 * of shards in an object store (a remote .stk: remote, locate, accept and
 * shard_objs set) is read through the loader's one fetch stage, with its
 * read-ahead, ranged merging, disk cache, hedging and governor. The mixture
 * offers the stage a flattened shard table: the fetched children's shards
 * one after another (child k's shard j is the mixture's shard_off[k] + j),
 * with shard_objs, shard_bytes, shard_tags and shard_ids borrowed from the children and
 * shard_remote naming each shard's store (each child keeps its own store:
 * its endpoint, credentials and governor). locate gives a fetched child's
 * sample in that table, and SIZE_MAX for any other child's sample (local,
 * or a remote tar read from its own cache), which the stage does not plan
 * but reads through `read`. shard_first stays NULL: the table covers only
 * some samples; a shard-aware order is per child, over the child's own
 * table (stk__source_mix_child, schedule/mix.h).
 */
#include "source/dataset.h"
#include "io/remote.h"

#include <stdio.h>
#include <string.h>

typedef struct mixsrc {
    size_t n;
    stk__source *kids;
    char **shown;                     /* each child's path for messages */
    uint64_t *offset;                 /* n + 1 */
    uint32_t (*map)[STK__MAX_FIELDS]; /* child field id -> mixture field id */
    size_t *shard_off;                /* n + 1: child k's first shard in the flattened table */
    bool *fetched;                    /* per child: its samples are fetched (see above) */
    int source_field;                 /* the mixture's "source" field, -1: none */
    bool want_source;                 /* selected */
    bool selected;
} mixsrc;

static size_t child_of(const mixsrc *m, uint64_t i)
{
    return stk__run_of(m->offset, m->n, i);
}

static int mix_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                    int64_t *label, char *err, size_t errlen)
{
    mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    stk__source *c = &m->kids[k];
    return c->ops->read(c, i - m->offset[k], sink, data, len, label, err, errlen);
}

static void mix_locate(const stk__source *s, uint64_t i, size_t *shard, uint64_t *off,
                       uint64_t *len)
{
    const mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    const stk__source *c = &m->kids[k];
    if (!m->fetched[k]) {
        *shard = SIZE_MAX;
        *off = *len = 0;
        return;
    }
    c->ops->locate(c, i - m->offset[k], shard, off, len);
    *shard += m->shard_off[k];
}

static int mix_accept(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                      int64_t *label, char *err, size_t errlen)
{
    const mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    const stk__source *c = &m->kids[k];
    return c->ops->accept(c, i - m->offset[k], bytes, len, label, err, errlen);
}

/* The child's name, which for files already holds the child's path; other
 * names (a shard's key) get the child's path in front. */
static void mix_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    const stk__source *c = &m->kids[k];
    char name[1024];
    c->ops->name(c, i - m->offset[k], name, sizeof name);
    size_t pl = strlen(m->shown[k]);
    if (!strncmp(name, m->shown[k], pl))
        stk__fmt(buf, n, "%s", name);
    else
        stk__fmt(buf, n, "%s: %s", m->shown[k], name);
}

static void mix_key(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    stk__source_key(&m->kids[k], m->shown[k], i - m->offset[k], buf, n);
}

static int mix_meta(const stk__source *s, uint64_t i, uint32_t *w, uint32_t *h)
{
    const mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    const stk__source *c = &m->kids[k];
    if (!c->ops->meta) {
        *w = *h = 0;
        return STK_EUNSUPPORTED;
    }
    return c->ops->meta(c, i - m->offset[k], w, h);
}

static int mix_select(stk__source *s, uint64_t mask, char *err, size_t errlen)
{
    mixsrc *m = s->impl;
    m->selected = true;
    m->want_source = m->source_field >= 0 && (mask >> m->source_field & 1);
    for (size_t k = 0; k < m->n; k++) {
        stk__source *c = &m->kids[k];
        uint64_t cm = 0;
        for (size_t f = 0; f < c->nfields; f++)
            if (mask >> m->map[k][f] & 1)
                cm |= (uint64_t)1 << f;
        if (!c->ops->select)
            continue;
        char why[STK_ERRMSG_MAX];
        int rc = c->ops->select(c, cm, why, sizeof why);
        if (rc) {
            stk__fmt(err, errlen, "mixture source %zu (%s): %s", k, m->shown[k], why);
            return rc;
        }
    }
    return STK_OK;
}

static int mix_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                      int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    const mixsrc *m = s->impl;
    size_t k = child_of(m, i);
    const stk__source *c = &m->kids[k];
    uint64_t j = i - m->offset[k];
    int rc = c->ops->fields ? c->ops->fields(c, j, bytes, len, label, fs, err, errlen)
                            : stk__source_fields_generic(c, j, bytes, len, label, fs, err, errlen);
    if (rc)
        return rc;
    for (size_t f = 0; f < fs->n; f++)
        fs->f[f].id = m->map[k][fs->f[f].id];
    for (size_t f = 0; f < fs->nothers; f++)
        fs->others[f] = m->map[k][fs->others[f]];
    if (m->want_source) {
        char digits[24];
        int n = snprintf(digits, sizeof digits, "%zu", k);
        rc = stk__field_set_gen(fs, (uint32_t)m->source_field, digits, (size_t)n);
    }
    return rc;
}

static const char *mix_class_name(const stk__source *s, uint64_t c)
{
    /* Labels are each child's own; the first child that names class c. */
    const mixsrc *m = s->impl;
    for (size_t k = 0; k < m->n; k++) {
        const char *name = stk__source_class_name(&m->kids[k], c);
        if (name)
            return name;
    }
    return NULL;
}

static void mix_describe(const stk__source *s, stk__dataset_info *di)
{
    const mixsrc *m = s->impl;
    di->format = "mixture";
    for (size_t k = 0; k < m->n; k++) {
        stk__dataset_info ci;
        stk__source_describe(&m->kids[k], &ci);
        di->shards += ci.shards;
        di->bytes += ci.bytes;
    }
}

static void mix_free(mixsrc *m)
{
    if (!m)
        return;
    /* Every store first: closing one completes its requests, whose
     * callbacks (the fetch stage's) read the flattened table, which points
     * into every fetched child's names. */
    for (size_t k = 0; m->kids && k < m->n; k++) {
        stk__remote_close(m->kids[k].remote);
        m->kids[k].remote = NULL;
    }
    for (size_t k = 0; m->kids && k < m->n; k++)
        stk__source_close(&m->kids[k]);
    for (size_t k = 0; m->shown && k < m->n; k++)
        stk__free(m->shown[k]);
    stk__free(m->kids);
    stk__free(m->shown);
    stk__free(m->offset);
    stk__free(m->map);
    stk__free(m->shard_off);
    stk__free(m->fetched);
    stk__free(m);
}

/* The flattened table's arrays are the mixture's (stk__source_free_common
 * frees them after this), their strings and stores the children's: no
 * string is freed by the mixture (nshards_objs_ stays 0). */
static void mix_close(stk__source *s)
{
    mix_free(s->impl);
    s->impl = NULL;
}

/* A field the union does not list, by name (a Parquet list's element
 * "images[0]"): asked of every child that resolves names; each that has it
 * maps its new field to the mixture's. A child without it lacks the field
 * (stk__source_mix_check_field names it unless it is optional). The
 * mixture's field is made first, so a child's new field always has one to
 * map to, and dropped again when no child has the name. */
static int mix_field_named(stk__source *s, const char *name, size_t len)
{
    mixsrc *m = s->impl;
    int id = stk__source_add_field(s, name, len, STK_FIELD_AUTO, 0);
    if (id < 0)
        return -1;
    stk__field_desc *u = &s->fields[id];
    bool found = false;
    for (size_t k = 0; k < m->n; k++) {
        stk__source *c = &m->kids[k];
        int f = c->ops->field_named ? c->ops->field_named(c, name, len) : -1;
        if (f < 0)
            continue;
        const stk__field_desc *d = &c->fields[f];
        m->map[k][f] = (uint32_t)id;
        if (!found) {
            u->kind = d->kind;
            u->samples = d->samples;
        } else {
            if (u->kind != d->kind)
                u->kind = STK_FIELD_AUTO; /* decided by the field's name */
            u->samples = u->samples == UINT64_MAX || d->samples == UINT64_MAX
                             ? UINT64_MAX
                             : u->samples + d->samples;
        }
        found = true;
    }
    if (!found) {
        stk__free(u->name);
        u->name = NULL;
        s->nfields--;
        return -1;
    }
    return id;
}

static const stk__source_ops mix_ops_images = {
    .kind = "mixture",
    .read = mix_read,
    .name = mix_name,
    .close = mix_close,
    .locate = mix_locate,
    .accept = mix_accept,
    .select = mix_select,
    .fields = mix_fields,
    .flags = STK__SRC_IMAGES,
    .describe = mix_describe,
    .key = mix_key,
    .class_name = mix_class_name,
    .meta = mix_meta,
    .field_named = mix_field_named,
};

static const stk__source_ops mix_ops_bytes = {
    .kind = "mixture",
    .read = mix_read,
    .name = mix_name,
    .close = mix_close,
    .locate = mix_locate,
    .accept = mix_accept,
    .select = mix_select,
    .fields = mix_fields,
    .flags = 0,
    .describe = mix_describe,
    .key = mix_key,
    .class_name = mix_class_name,
    .meta = mix_meta,
    .field_named = mix_field_named,
};

static int find_field(const stk__source *s, const char *name)
{
    for (size_t f = 0; f < s->nfields; f++)
        if (!strcmp(s->fields[f].name, name))
            return (int)f;
    return -1;
}

/* The union of the children's fields. */
static int merge_fields(stk__source *s, mixsrc *m, char *err, size_t errlen)
{
    for (size_t k = 0; k < m->n; k++) {
        const stk__source *c = &m->kids[k];
        for (size_t f = 0; f < c->nfields; f++) {
            const stk__field_desc *d = &c->fields[f];
            int id = find_field(s, d->name);
            if (id < 0) {
                id = stk__source_add_field(s, d->name, strlen(d->name), d->kind, d->samples);
                if (id < 0 && s->nfields < STK__MAX_FIELDS) {
                    stk__fmt(err, errlen, "out of memory for the mixture's fields");
                    return STK_ENOMEM;
                }
                if (id < 0) {
                    stk__fmt(err, errlen,
                             "the mixture's sources have more than %d distinct fields in all",
                             STK__MAX_FIELDS);
                    return STK_EINVAL;
                }
            } else {
                stk__field_desc *u = &s->fields[id];
                if (u->kind != d->kind)
                    u->kind = STK_FIELD_AUTO; /* decided by the field's name */
                u->samples = u->samples == UINT64_MAX || d->samples == UINT64_MAX
                                 ? UINT64_MAX
                                 : u->samples + d->samples;
            }
            m->map[k][f] = (uint32_t)id;
        }
    }
    m->source_field = -1;
    if (find_field(s, "source") < 0) {
        int id = stk__source_add_field(s, "source", 6, STK_FIELD_INT, s->count);
        if (id < 0 && s->nfields < STK__MAX_FIELDS) {
            stk__fmt(err, errlen, "out of memory for the mixture's fields");
            return STK_ENOMEM;
        }
        if (id < 0) {
            stk__fmt(err, errlen, "the mixture's sources have more than %d distinct fields in all",
                     STK__MAX_FIELDS - 1);
            return STK_EINVAL;
        }
        m->source_field = id;
    }
    return STK_OK;
}

/* The flattened shard table of the fetched children (see the top). A
 * mixture with none has no table, no locate use: the loader makes no fetch
 * stage for it. */
static int flatten_shards(stk__source *s, mixsrc *m, char *err, size_t errlen)
{
    size_t total = 0;
    bool tags = false, ids = false;
    for (size_t k = 0; k < m->n; k++) {
        const stk__source *c = &m->kids[k];
        m->fetched[k] = c->remote && c->ops->locate && c->ops->accept && c->shard_objs &&
                        c->shard_bytes && c->nshards;
        m->shard_off[k] = total;
        if (m->fetched[k]) {
            total += c->nshards;
            tags |= c->shard_tags != NULL;
            ids |= c->shard_ids != NULL;
        }
    }
    m->shard_off[m->n] = total;
    if (!total)
        return STK_OK;
    if (!(s->shard_objs = stk__calloc(total, sizeof *s->shard_objs)) ||
        !(s->shard_bytes = stk__calloc(total, sizeof *s->shard_bytes)) ||
        !(s->shard_remote = stk__calloc(total, sizeof *s->shard_remote)) ||
        (tags && !(s->shard_tags = stk__calloc(total, sizeof *s->shard_tags))) ||
        (ids && !(s->shard_ids = stk__calloc(total, sizeof *s->shard_ids)))) {
        stk__fmt(err, errlen, "out of memory for the mixture's table of %zu remote shards", total);
        return STK_ENOMEM;
    }
    for (size_t k = 0; k < m->n; k++) {
        const stk__source *c = &m->kids[k];
        if (!m->fetched[k])
            continue;
        for (size_t j = 0; j < c->nshards; j++) {
            size_t x = m->shard_off[k] + j;
            s->shard_objs[x] = c->shard_objs[j];
            s->shard_bytes[x] = c->shard_bytes[j];
            s->shard_remote[x] = c->remote;
            if (s->shard_tags)
                s->shard_tags[x] = c->shard_tags ? c->shard_tags[j] : NULL;
            if (s->shard_ids) /* a child opened from its stoker.index: the cache key */
                s->shard_ids[x] = c->shard_ids ? c->shard_ids[j] : NULL;
        }
    }
    s->nshards = total;
    return STK_OK;
}

int stk__source_mix_open(stk__source *s, const char *const *paths, const char *const *shown,
                         size_t n, const stk__source_params *prm, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int rc = STK_ENOMEM;
    mixsrc *m = stk__calloc(1, sizeof *m);
    if (!m || !(m->kids = stk__calloc(n, sizeof *m->kids)) ||
        !(m->shown = stk__calloc(n, sizeof *m->shown)) ||
        !(m->offset = stk__calloc(n + 1, sizeof *m->offset)) ||
        !(m->map = stk__calloc(n, sizeof *m->map)) ||
        !(m->shard_off = stk__calloc(n + 1, sizeof *m->shard_off)) ||
        !(m->fetched = stk__calloc(n, sizeof *m->fetched))) {
        stk__fmt(err, errlen, "out of memory while opening a mixture of %zu sources", n);
        goto fail;
    }
    m->n = n;
    bool images = true;
    for (size_t k = 0; k < n; k++) {
        if (!(m->shown[k] = stk__strdup(shown[k]))) {
            stk__fmt(err, errlen, "out of memory while opening a mixture of %zu sources", n);
            rc = STK_ENOMEM; /* (rc holds the last child's open: STK_OK) */
            goto fail;
        }
        char why[STK_ERRMSG_MAX];
        if ((rc = stk__source_open(&m->kids[k], paths[k], prm, why, sizeof why))) {
            stk__fmt(err, errlen, "mixture source %zu (%s): %s", k, shown[k], why);
            goto fail; /* the failed child is closed (zeroed) by its open */
        }
        const stk__source *c = &m->kids[k];
        if (!c->count) {
            stk__fmt(err, errlen, "mixture source %zu (%s) has no samples", k, shown[k]);
            rc = STK_EEMPTY;
            goto fail;
        }
        m->offset[k + 1] = m->offset[k] + c->count;
        images &= (c->ops->flags & STK__SRC_IMAGES) != 0;
        s->index_bytes += c->index_bytes;
        s->max_len = c->max_len > s->max_len ? c->max_len : s->max_len;
        s->num_classes = c->num_classes > s->num_classes ? c->num_classes : s->num_classes;
        if (k == 0) {
            s->fixed_len = c->fixed_len;
            s->raw_h = c->raw_h, s->raw_w = c->raw_w, s->raw_c = c->raw_c;
            s->raw_chw = c->raw_chw;
        } else {
            if (s->fixed_len != c->fixed_len)
                s->fixed_len = 0;
            if (s->raw_h != c->raw_h || s->raw_w != c->raw_w || s->raw_c != c->raw_c ||
                s->raw_chw != c->raw_chw) {
                /* The pipeline treats every sample of a source alike: raw
                 * pixels of one shape, or encoded images. */
                stk__fmt(err, errlen,
                         "mixture source %zu (%s) stores %s images but source 0 (%s) stores "
                         "%s; a mixture's images must all be encoded files or all raw pixels "
                         "of one shape",
                         k, shown[k], c->raw_c ? "raw" : "encoded", shown[0],
                         s->raw_c ? "raw" : "encoded");
                rc = STK_EUNSUPPORTED;
                goto fail;
            }
        }
    }
    s->ops = images ? &mix_ops_images : &mix_ops_bytes;
    s->impl = m;
    s->count = m->offset[n];
    if ((rc = merge_fields(s, m, err, errlen)) || (rc = flatten_shards(s, m, err, errlen))) {
        stk__source_close(s);
        return rc;
    }
    return STK_OK;
fail:
    mix_free(m);
    memset(s, 0, sizeof *s);
    return rc;
}

int stk__source_mix_check_field(const stk__source *s, const char *name, const uint32_t *ids,
                                size_t nids, char *err, size_t errlen)
{
    const mixsrc *m = s->impl;
    for (size_t k = 0; k < m->n; k++) {
        const stk__source *c = &m->kids[k];
        bool has = false;
        for (size_t a = 0; a < nids && !has; a++) {
            if (m->source_field >= 0 && ids[a] == (uint32_t)m->source_field)
                has = true;
            for (size_t f = 0; f < c->nfields && !has; f++)
                has = m->map[k][f] == ids[a];
        }
        if (!has) {
            char list[512];
            size_t used = 0;
            list[0] = '\0';
            for (size_t f = 0; f < c->nfields && used + 1 < sizeof list; f++) {
                stk__fmt(list + used, sizeof list - used, "%s%s", f ? ", " : "", c->fields[f].name);
                used += strlen(list + used);
            }
            stk__fmt(err, errlen,
                     "field '%s': mixture source %zu (%s) has no such field (it has: %s); every "
                     "source must give each field that is not optional",
                     name, k, m->shown[k], list[0] ? list : "none");
            return STK_EINVAL;
        }
    }
    return STK_OK;
}

size_t stk__source_mix_sizes(const stk__source *s, uint64_t *sizes, size_t max)
{
    const mixsrc *m = s->impl;
    for (size_t k = 0; k < m->n && k < max; k++)
        sizes[k] = m->kids[k].count;
    return m->n;
}

const stk__source *stk__source_mix_child(const stk__source *s, size_t k)
{
    const mixsrc *m = s->impl;
    return &m->kids[k];
}

bool stk__source_mix_fetched(const stk__source *s, size_t k)
{
    const mixsrc *m = s->impl;
    return m->fetched[k];
}

size_t stk__source_mix_shard_off(const stk__source *s, size_t k)
{
    const mixsrc *m = s->impl;
    return m->shard_off[k];
}
