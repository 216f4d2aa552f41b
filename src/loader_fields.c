/*
 * loader_fields.c -- samples with several fields in the loader
 * (docs/multimodal.md): the plan made at open, a worker's making of one
 * sample's fields, and each buffer's columns (allocated, compacted over
 * skipped samples, published as stk_field views).
 *
 * The first image field (the primary) is made exactly as a loader without
 * fields makes its one image: the same pipeline, the same draws keyed by
 * (seed, epoch, sample), into the ring's data; so its pixels are bit-identical
 * and the device stage, the trace and diagnosis see it as they always did.
 * Every other field has a column: dense ones (images of one output size,
 * int64 and float32 scalars) a slot a sample, variable ones (text, JSON,
 * bytes, .npy arrays, images of their own size) exactly the bytes they need
 * from the buffer's field arena, whose size (field_memory) is part of the
 * memory bound.
 */
#include "loader_core.h"
#include "ring/ring.h"

#include <string.h>

#define SHAPE_STRIDE (STK_FIELD_MAXDIM + 1)

/* ---- open ------------------------------------------------------------------ */

static bool spec_is_none(const char *spec)
{
    return !spec || !*spec || !strcmp(spec, "none");
}

/* A pipeline for a field that is not the primary image. */
static int make_pipe(core *c, const stk_options *o, stk__fplan *p, const char *spec, char *err,
                     size_t errlen)
{
    char why[STK_ERRMSG_MAX];
    int rc = stk__imgpipe_from_options(&p->pipe, spec, o, why, sizeof why);
    if (rc) {
        stk__fmt(err, errlen, "field '%s': %s", p->spec->name, why);
        return rc;
    }
    if (c->src.raw_c)
        stk__imgpipe_set_raw(p->pipe, c->src.raw_h, c->src.raw_w, c->src.raw_c, c->src.raw_chw);
    if (stk__imgpipe_dense(p->pipe, &p->ndim, p->shape, &p->dtype, &p->sample_bytes)) {
        p->layout = STK_BATCH_DENSE;
    } else {
        p->layout = STK_BATCH_VARIABLE;
        p->dtype = STK_DTYPE_UINT8;
    }
    return STK_OK;
}

int stk__fields_setup(core *c, const stk_options *o, const char **spec, char *err, size_t errlen)
{
    c->primary = -1;
    if (!o->nfields)
        return STK_OK;
    if (stk__fspecs_copy(&c->fspecs, o->fields, o->nfields))
        return STK_ENOMEM;
    if (!(c->fplan = stk__calloc(o->nfields, sizeof *c->fplan))) {
        /* stk__fields_free frees nfplan specs: none yet. */
        stk__fspecs_free(c->fspecs, o->nfields);
        c->fspecs = NULL;
        return STK_ENOMEM;
    }
    c->nfplan = o->nfields;
    int rc = stk__fplan_resolve(c->fplan, c->fspecs, c->nfplan, &c->src, err, errlen);
    if (rc)
        return rc;
    uint64_t mask = 0;
    bool arena = false;
    for (size_t k = 0; k < c->nfplan; k++) {
        stk__fplan *p = &c->fplan[k];
        for (size_t a = 0; a < p->nalt; a++)
            mask |= (uint64_t)1 << p->alt[a];
        const char *tspec = p->spec->transform ? p->spec->transform : o->transform;
        switch (p->kind) {
        case STK_FIELD_IMAGE:
            if (c->primary < 0) {
                c->primary = (int)k;
                *spec = tspec; /* setup_output makes its pipeline */
                continue;
            }
            if (!spec_is_none(tspec) && (rc = make_pipe(c, o, p, tspec, err, errlen)))
                return rc;
            if (spec_is_none(tspec))
                p->layout = STK_BATCH_VARIABLE;
            break;
        case STK_FIELD_INT:
            p->layout = STK_BATCH_DENSE;
            p->dtype = STK_DTYPE_INT64;
            p->sample_bytes = 8;
            break;
        case STK_FIELD_FLOAT:
            p->layout = STK_BATCH_DENSE;
            p->dtype = STK_DTYPE_FLOAT32;
            p->sample_bytes = 4;
            break;
        default: p->layout = STK_BATCH_VARIABLE; p->dtype = STK_DTYPE_UINT8;
        }
        arena |= p->layout == STK_BATCH_VARIABLE;
    }
    if (c->primary < 0)
        *spec = NULL;
    c->field_memory = arena ? o->field_memory : 0;
    if (c->src.ops->select && (rc = c->src.ops->select(&c->src, mask, err, errlen)))
        return rc;
    return STK_OK;
}

void stk__fields_free(core *c)
{
    for (size_t k = 0; c->fplan && k < c->nfplan; k++)
        stk__imgpipe_destroy(c->fplan[k].pipe);
    stk__free(c->fplan);
    stk__fspecs_free(c->fspecs, c->nfplan);
    c->fplan = NULL;
    c->fspecs = NULL;
    c->nfplan = 0;
}

uint64_t stk__fields_buffer_bytes(const core *c)
{
    if (!c->nfplan)
        return 0;
    uint64_t B = c->batch_size, n = c->field_memory;
    n += c->nfplan * (sizeof(fcol) + sizeof(stk_field));
    for (size_t k = 0; k < c->nfplan; k++) {
        const stk__fplan *p = &c->fplan[k];
        bool primary = (int)k == c->primary;
        if (p->layout == STK_BATCH_DENSE && !primary)
            n += B * p->sample_bytes;
        else
            n += B * (16 + SHAPE_STRIDE * 8 + 4);
        n += B; /* present */
    }
    return n;
}

void stk__fields_devfields(const core *c, stk__devfield *out)
{
    for (size_t k = 0; k < c->nfplan; k++) {
        const stk__fplan *p = &c->fplan[k];
        stk__devfield *f = &out[k];
        bool variable = p->layout != STK_BATCH_DENSE;
        *f = (stk__devfield){.optional = (p->spec->flags & STK_FIELD_OPTIONAL) != 0};
        if ((int)k == c->primary) {
            f->where = STK__DF_PRIMARY;
        } else if (!variable) {
            f->where = STK__DF_DENSE;
            f->sample_bytes = p->sample_bytes;
        } else {
            f->where = p->kind == STK_FIELD_NPY ? STK__DF_NPY : STK__DF_HOST;
            f->shapes = p->kind == STK_FIELD_IMAGE || p->kind == STK_FIELD_NPY;
            f->dtypes = p->kind == STK_FIELD_NPY;
        }
    }
}

/* ---- the ring's columns ------------------------------------------------- */

int stk__fields_ring_alloc(core *c, buffer *b)
{
    if (!c->nfplan)
        return STK_OK;
    size_t B = c->batch_size;
    if (!(b->cols = stk__calloc(c->nfplan, sizeof *b->cols)) ||
        !(b->fviews = stk__calloc(c->nfplan, sizeof *b->fviews)))
        return STK_ENOMEM;
    if (c->field_memory && !(b->farena = stk__map(c->field_memory)))
        return STK_ENOMEM;
    for (size_t k = 0; k < c->nfplan; k++) {
        const stk__fplan *p = &c->fplan[k];
        fcol *col = &b->cols[k];
        bool primary = (int)k == c->primary;
        if (p->layout == STK_BATCH_DENSE && !primary) {
            if (p->sample_bytes && B > SIZE_MAX / p->sample_bytes)
                return STK_ETOOBIG;
            if (c->dev) {
                /* Page-locked, as the ring's data: the device copies it. */
                char err[STK_ERRMSG_MAX];
                if (c->dev->ops->host_alloc(c->dev, B * p->sample_bytes, (void **)&col->dense, err,
                                            sizeof err))
                    return STK_ENOMEM;
                memset(col->dense, 0, B * p->sample_bytes);
            } else if (!(col->dense = stk__calloc(B, p->sample_bytes))) {
                return STK_ENOMEM;
            }
        } else if (!primary || c->kind == STK_BATCH_VARIABLE) {
            if (!(col->offsets = stk__calloc(B, sizeof *col->offsets)) ||
                !(col->lengths = stk__calloc(B, sizeof *col->lengths)) ||
                !(col->shapes = stk__calloc(B * SHAPE_STRIDE, sizeof *col->shapes)))
                return STK_ENOMEM;
            if (p->kind == STK_FIELD_NPY && !(col->dtypes = stk__calloc(B, sizeof *col->dtypes)))
                return STK_ENOMEM;
        }
        if ((p->spec->flags & STK_FIELD_OPTIONAL) && !(col->present = stk__calloc(B, 1)))
            return STK_ENOMEM;
    }
    return STK_OK;
}

void stk__fields_ring_free(core *c, buffer *b)
{
    if (b->cols) {
        for (size_t k = 0; k < c->nfplan; k++) {
            fcol *col = &b->cols[k];
            if (c->dev && col->dense)
                c->dev->ops->host_free(c->dev, col->dense);
            else
                stk__free(col->dense);
            stk__free(col->offsets);
            stk__free(col->lengths);
            stk__free(col->shapes);
            stk__free(col->dtypes);
            stk__free(col->present);
        }
    }
    stk__free(b->cols);
    stk__free(b->fviews);
    if (b->farena)
        stk__unmap(b->farena, c->field_memory);
    b->cols = NULL;
    b->fviews = NULL;
    b->farena = NULL;
}

/* Moves the kept samples' entries of every column down over the failed
 * ones, then fills the views (publish: the buffer is the consumer's). */
void stk__fields_publish(core *c, buffer *b)
{
    stk_batch *v = &b->view;
    if (!c->nfplan) {
        v->nfields = 0;
        v->fields = NULL;
        return;
    }
    for (size_t k = 0; k < c->nfplan; k++) {
        const stk__fplan *p = &c->fplan[k];
        fcol *col = &b->cols[k];
        size_t j = 0;
        for (size_t s = 0; s < b->size; s++) {
            if (!b->ok[s])
                continue;
            if (j != s) {
                if (col->dense)
                    memmove(col->dense + j * p->sample_bytes, col->dense + s * p->sample_bytes,
                            p->sample_bytes);
                if (col->offsets) {
                    col->offsets[j] = col->offsets[s];
                    col->lengths[j] = col->lengths[s];
                    memmove(&col->shapes[j * SHAPE_STRIDE], &col->shapes[s * SHAPE_STRIDE],
                            SHAPE_STRIDE * sizeof *col->shapes);
                }
                if (col->dtypes)
                    col->dtypes[j] = col->dtypes[s];
                if (col->present)
                    col->present[j] = col->present[s];
            }
            j++;
        }
        stk_field *f = &b->fviews[k];
        f->name = p->spec->name;
        f->source = p->source_name;
        f->kind = p->kind;
        f->present = col->present;
        f->device = STK_DEVICE_CPU;
        f->device_id = 0;
        if ((int)k == c->primary) {
            f->layout = c->kind;
            f->dtype = c->dtype;
            f->ndim = c->ndim;
            memcpy(f->shape, c->shape, sizeof f->shape);
            f->sample_bytes = c->kind == STK_BATCH_DENSE ? c->sample_bytes : 0;
            f->data = b->data;
            f->offsets = c->kind == STK_BATCH_DENSE ? NULL : b->offsets;
            f->lengths = c->kind == STK_BATCH_DENSE ? NULL : b->lengths;
            f->shapes = col->shapes;
            f->dtypes = NULL;
        } else {
            f->layout = p->layout;
            f->dtype = p->dtype;
            f->ndim = p->ndim;
            memcpy(f->shape, p->shape, sizeof f->shape);
            f->sample_bytes = p->layout == STK_BATCH_DENSE ? p->sample_bytes : 0;
            f->data = col->dense ? (void *)col->dense : (void *)b->farena;
            f->offsets = col->offsets;
            f->lengths = col->lengths;
            f->shapes = p->kind == STK_FIELD_IMAGE || p->kind == STK_FIELD_NPY ? col->shapes : NULL;
            f->dtypes = col->dtypes;
        }
    }
    v->nfields = c->nfplan;
    v->fields = b->fviews;
}

#define PAGE_ROUND(n) (((n) + 4095) & ~(size_t)4095)

/* As the ring's arena: keep what the largest batch touched until a batch
 * uses under half of it. */
void stk__fields_release(core *c, buffer *b)
{
    if (!b->farena)
        return;
    size_t used = PAGE_ROUND(atomic_load_explicit(&b->fused, memory_order_relaxed));
    if (used > b->fhigh)
        b->fhigh = used;
    if (b->fhigh > 2 * used + ((size_t)1 << 20)) {
        stk__map_trim(b->farena + used, b->fhigh - used);
        b->fhigh = used;
    }
    (void)c;
}

/* ---- a worker's sample ---------------------------------------------------- */

typedef struct farena_req {
    core *c;
    buffer *b;
    const char *field;
} farena_req;

/* n bytes (rounded to 64) from the buffer's field arena, lock-free. */
static uint8_t *farena_alloc(stk__sink *s, size_t n, int *rc)
{
    farena_req *a = s->ctx;
    core *c = a->c;
    buffer *b = a->b;
    size_t need = (n + 63) & ~(size_t)63;
    size_t off = atomic_load_explicit(&b->fused, memory_order_relaxed);
    do {
        if (need < n || need > c->field_memory - off) {
            stk__fmt(s->why, sizeof s->why,
                     "field '%s' needs %zu bytes and the batch's variable fields already take "
                     "%zu of field_memory (%zu bytes); raise field_memory or lower batch_size",
                     a->field, n, off, c->field_memory);
            *rc = STK_ETOOBIG;
            return NULL;
        }
    } while (!atomic_compare_exchange_weak_explicit(&b->fused, &off, off + need,
                                                    memory_order_relaxed, memory_order_relaxed));
    s->dst = b->farena + off;
    s->cap = n;
    s->why[0] = '\0';
    *rc = STK_OK;
    return s->dst;
}

/* Copies n bytes into the field arena; sets the column's entry. */
static int put_bytes(core *c, buffer *b, fcol *col, size_t s, const char *field, const void *p,
                     size_t n, char *err, size_t errlen)
{
    farena_req ar = {c, b, field};
    stk__sink sk = {.alloc = farena_alloc, .ctx = &ar};
    int rc;
    uint8_t *dst = farena_alloc(&sk, n, &rc);
    if (!dst) {
        stk__fmt(err, errlen, "%s", sk.why);
        return rc;
    }
    if (n)
        memcpy(dst, p, n);
    col->offsets[s] = (uint64_t)(dst - b->farena);
    col->lengths[s] = n;
    return STK_OK;
}

/* The first alternative of plan p the sample has, or NULL. */
static const stk__field_ref *find_ref(const stk__fplan *p, const stk__field_set *fs)
{
    for (size_t a = 0; a < p->nalt; a++)
        for (size_t k = 0; k < fs->n; k++)
            if (fs->f[k].id == p->alt[a])
                return &fs->f[k];
    return NULL;
}

/* "has no field 'txt' (has: jpg, json)" */
static void missing(const core *c, const stk__fplan *p, const stk__field_set *fs, char *err,
                    size_t errlen)
{
    char has[256];
    size_t used = 0;
    has[0] = '\0';
    for (size_t k = 0; k < fs->n + fs->nothers && used + 1 < sizeof has; k++) {
        uint32_t id = k < fs->n ? fs->f[k].id : fs->others[k - fs->n];
        stk__fmt(has + used, sizeof has - used, "%s%s", k ? ", " : "", c->src.fields[id].name);
        used += strlen(has + used);
    }
    stk__fmt(err, errlen, "has no field '%s' (has: %s)", p->spec->sources,
             fs->n + fs->nothers ? has : "nothing");
}

/* The primary image: exactly what a loader without fields makes. */
static int make_primary(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch,
                        const stk__field_ref *r, fcol *col, char *err, size_t errlen)
{
    core *c = w->core;
    const bool variable = c->kind == STK_BATCH_VARIABLE;
    uint8_t *slot = variable ? NULL : b->data + s * c->sample_bytes;
    arena_req ar = {c, b};
    stk__sink arena = {.alloc = stk__ring_arena_alloc, .ctx = &ar};
    stk__sink slot_sink = {slot, c->sample_bytes, NULL, NULL, NULL, ""};
    uint8_t *out = NULL;
    size_t len = 0;
    int32_t dims[3] = {0, 0, 0};
    int rc;
    if (c->pipe) {
        stk__rng rng = stk__rng_for(c->sched.seed, epoch, i);
        stk__imgpipe_result res;
        rc = stk__imgpipe_run_sink(stk__pipe_for(c, i), r->data, r->len, &rng, &w->dec,
                                   variable ? &arena : &slot_sink, &res, err, errlen);
        out = res.out;
        len = res.len;
        memcpy(dims, res.dims, sizeof dims);
    } else if (!variable) {
        if (r->len != c->sample_bytes) {
            stk__fmt(err, errlen, "sample is %zu bytes, expected %zu", r->len, c->sample_bytes);
            return STK_EFORMAT;
        }
        memcpy(slot, r->data, r->len);
        out = slot;
        len = r->len;
        rc = STK_OK;
    } else {
        out = stk__sink_reserve(&arena, r->len, &rc);
        if (out) {
            memcpy(out, r->data, r->len);
            len = r->len;
        }
    }
    if (rc == STK_ETOOBIG && arena.why[0])
        stk__fmt(err, errlen, "%s", arena.why);
    if (rc)
        return rc;
    if (variable) {
        b->offsets[s] = (uint64_t)(out - b->data);
        b->lengths[s] = len;
        if (col->shapes) {
            int64_t *sh = &col->shapes[s * SHAPE_STRIDE];
            memset(sh, 0, SHAPE_STRIDE * sizeof *sh);
            if (c->pipe) {
                sh[0] = 3;
                sh[1] = dims[0], sh[2] = dims[1], sh[3] = dims[2];
            }
        }
    } else {
        b->lengths[s] = len;
    }
    memcpy(&b->dims[3 * s], dims, sizeof dims);
    return STK_OK;
}

/* A further image field: its own pipeline, draws keyed by the field too. */
static int make_image(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch,
                      const stk__fplan *p, const stk__field_ref *r, fcol *col, char *err,
                      size_t errlen)
{
    core *c = w->core;
    int64_t *sh = col->shapes ? &col->shapes[s * SHAPE_STRIDE] : NULL;
    if (sh)
        memset(sh, 0, SHAPE_STRIDE * sizeof *sh);
    /* A mixture source's own transform of this field, else the field's (a
     * source has one only where the field has one). */
    stk__imgpipe *pipe = stk__field_pipe_for(c, (size_t)(p - c->fplan), i);
    if (!pipe)
        return put_bytes(c, b, col, s, p->spec->name, r->data, r->len, err, errlen);
    stk__rng rng = stk__rng_for(c->sched.seed, epoch, i);
    rng.key = stk__mix64(rng.key ^ p->rng_salt);
    farena_req ar = {c, b, p->spec->name};
    stk__sink arena = {.alloc = farena_alloc, .ctx = &ar};
    stk__sink slot = {col->dense ? col->dense + s * p->sample_bytes : NULL,
                      p->sample_bytes,
                      NULL,
                      NULL,
                      NULL,
                      ""};
    stk__imgpipe_result res;
    int rc = stk__imgpipe_run_sink(pipe, r->data, r->len, &rng, &w->dec,
                                   col->dense ? &slot : &arena, &res, err, errlen);
    if (rc == STK_ETOOBIG && arena.why[0])
        stk__fmt(err, errlen, "%s", arena.why);
    if (rc)
        return rc;
    if (!col->dense) {
        col->offsets[s] = (uint64_t)(res.out - b->farena);
        col->lengths[s] = res.len;
        sh[0] = 3;
        sh[1] = res.dims[0], sh[2] = res.dims[1], sh[3] = res.dims[2];
    }
    return STK_OK;
}

static int make_npy(core *c, buffer *b, size_t s, const stk__fplan *p, const stk__field_ref *r,
                    fcol *col, char *err, size_t errlen)
{
    stk__npy a;
    int rc = stk__npy_parse(r->data, r->len, &a, err, errlen);
    if (rc)
        return rc;
    if ((rc =
             put_bytes(c, b, col, s, p->spec->name, r->data + a.data_off, a.data_len, err, errlen)))
        return rc;
    int64_t *sh = &col->shapes[s * SHAPE_STRIDE];
    memset(sh, 0, SHAPE_STRIDE * sizeof *sh);
    sh[0] = a.ndim;
    for (unsigned d = 0; d < a.ndim; d++)
        sh[1 + d] = a.shape[d];
    col->dtypes[s] = a.dtype;
    return STK_OK;
}

/* Makes one field of the sample from its bytes r. */
static int make_one(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch, size_t k,
                    const stk__field_ref *r, char *err, size_t errlen)
{
    core *c = w->core;
    const stk__fplan *p = &c->fplan[k];
    fcol *col = &b->cols[k];
    int rc;
    if ((int)k == c->primary)
        return make_primary(w, b, s, i, epoch, r, col, err, errlen);
    switch (p->kind) {
    case STK_FIELD_IMAGE: return make_image(w, b, s, i, epoch, p, r, col, err, errlen);
    case STK_FIELD_TEXT:
        if ((rc = stk__utf8_check(r->data, r->len, err, errlen)))
            return rc;
        return put_bytes(c, b, col, s, p->spec->name, r->data, r->len, err, errlen);
    case STK_FIELD_JSON:
        if ((rc = stk__json_check(r->data, r->len, err, errlen)))
            return rc;
        return put_bytes(c, b, col, s, p->spec->name, r->data, r->len, err, errlen);
    case STK_FIELD_INT: {
        int64_t v;
        if ((rc = stk__field_int(r->data, r->len, &v, err, errlen)))
            return rc;
        memcpy(col->dense + s * 8, &v, 8);
        return STK_OK;
    }
    case STK_FIELD_FLOAT: {
        float v;
        if ((rc = stk__field_float(r->data, r->len, &v, err, errlen)))
            return rc;
        memcpy(col->dense + s * 4, &v, 4);
        return STK_OK;
    }
    case STK_FIELD_NPY: return make_npy(c, b, s, p, r, col, err, errlen);
    default: return put_bytes(c, b, col, s, p->spec->name, r->data, r->len, err, errlen);
    }
}

/* An optional field the sample lacks: empty, zero, present 0. */
static void make_absent(core *c, buffer *b, size_t s, size_t k)
{
    const stk__fplan *p = &c->fplan[k];
    fcol *col = &b->cols[k];
    bool primary = (int)k == c->primary;
    if (primary && c->kind == STK_BATCH_DENSE)
        memset(b->data + s * c->sample_bytes, 0, c->sample_bytes);
    else if (primary)
        b->offsets[s] = b->lengths[s] = 0;
    if (col->dense)
        memset(col->dense + s * p->sample_bytes, 0, p->sample_bytes);
    if (col->offsets) {
        col->offsets[s] = col->lengths[s] = 0;
        memset(&col->shapes[s * SHAPE_STRIDE], 0, SHAPE_STRIDE * sizeof *col->shapes);
    }
    if (col->dtypes)
        col->dtypes[s] = STK_DTYPE_UINT8;
    if (primary)
        memset(&b->dims[3 * s], 0, 3 * sizeof *b->dims);
}

int stk__fields_make(worker *w, buffer *b, size_t s, uint64_t i, uint64_t epoch,
                     const uint8_t *bytes, size_t len, int64_t label, char *err, size_t errlen,
                     const char **field)
{
    core *c = w->core;
    stk__field_set *fs = &w->fset;
    char why[STK_ERRMSG_MAX];
    why[0] = '\0';
    *field = NULL;
    fs->nothers = 0; /* only readers of a subset fill it */
    int rc = c->src.ops->fields
                 ? c->src.ops->fields(&c->src, i, bytes, len, label, fs, why, sizeof why)
                 : stk__source_fields_generic(&c->src, i, bytes, len, label, fs, why, sizeof why);
    if (rc) {
        stk__fmt(err, errlen, "%s", why[0] ? why : stk_strerror(rc));
        return rc;
    }
    if (c->primary < 0) { /* no image: the view's entries are empty, not stale */
        b->lengths[s] = 0;
        memset(&b->dims[3 * s], 0, 3 * sizeof *b->dims);
    }
    for (size_t k = 0; k < c->nfplan; k++) {
        const stk__fplan *p = &c->fplan[k];
        const stk__field_ref *r = find_ref(p, fs);
        fcol *col = &b->cols[k];
        if (!r) {
            if (p->spec->flags & STK_FIELD_OPTIONAL) {
                col->present[s] = 0;
                make_absent(c, b, s, k);
                continue;
            }
            missing(c, p, fs, why, sizeof why);
            rc = STK_EFORMAT;
        } else {
            if (col->present)
                col->present[s] = 1;
            why[0] = '\0';
            rc = make_one(w, b, s, i, epoch, k, r, why, sizeof why);
        }
        if (rc) {
            *field = p->spec->name;
            if (r)
                stk__fmt(err, errlen, "field '%s' (%s): %s", p->spec->name,
                         c->src.fields[r->id].name, why[0] ? why : stk_strerror(rc));
            else
                stk__fmt(err, errlen, "%s", why);
            return rc;
        }
    }
    return STK_OK;
}
