/*
 * stage.c -- the device stage (stage.h): the copy thread, the device ring
 * and the consumer's queue.
 */
#include "device/stage.h"

#include <string.h>

#define NSTREAMS     2            /* copies of batch k+1 overlap the conversion of k */
#define MAX_INFLIGHT 2            /* host batches whose copies may run at once */
#define HOST_SLICE   20000000ULL  /* the copy thread's wait for a host batch */
#define WAIT_SLICE   100000000ULL /* waits wake this often to re-check cancel */
#define REAP_SLICE   1000000ULL   /* while copies run, look at their events this often */

#define DEV_ALIGN    256 /* each device column starts on this (cudaMalloc's) */
#define ARENA_ALIGN  64  /* each host sample, as the host field arena has it */
#define SHAPE_STRIDE (STK_FIELD_MAXDIM + 1)

enum { D_FREE, D_ISSUING, D_QUEUED, D_HELD, D_RELEASING };

/* A field's host-side columns in one device buffer (which exist depends on
 * its stk__devfield). */
typedef struct dcol {
    uint64_t *offsets, *lengths;
    int64_t *shapes;
    int32_t *dtypes;
    uint8_t *present;
} dcol;
enum { E_BATCH, E_END, E_ERROR };

typedef struct dslot {
    stk_batch view; /* first member: the release functions cast back */
    stk__devstage *st;
    int state;
    uint64_t g;
    stk__dptr staging, out;
    stk__event ready;    /* recorded after the copy and conversion */
    stk__event released; /* recorded on the consumer's stream at release */
    bool used;           /* written before: the next copy waits for its events */
    stk__stream stream;  /* the copy stream of its last copy */
    uint64_t *offsets, *lengths, *indices;
    int32_t *dims;
    int64_t *labels;
    /* Streams the consumer added with stk_batch_record_stream while it held
     * the batch (under the lock), with an event each, made on first use and
     * kept. The release records each event on its stream, and the next copy
     * into the buffer waits for the `nwait` recorded then. */
    stk__stream rec[STK_BATCH_MAX_STREAMS];
    stk__event rec_ev[STK_BATCH_MAX_STREAMS];
    unsigned nrec, nwait;
    /* Fields: the views handed out, the host columns, the host arena of the
     * variable ones, and the device memory of the dense ones. */
    stk_field *fviews;
    dcol *cols;
    uint8_t *arena;
    stk__dptr fdev;
    bool arena_h2d; /* the last issue copied from arena to the device */
} dslot;

typedef struct entry {
    int kind;
    int rc;
    dslot *d;
    char msg[STK_ERRMSG_MAX];
} entry;

/* A host batch whose copy may still be reading it. */
typedef struct inflight {
    stk_batch *hb;
    stk__event ev; /* recorded right after the copy */
    uint64_t g;
} inflight;

struct stk__devstage {
    stk__devstage_cfg cfg;
    stk__dev *dev;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t th;
    bool started, cancel, pause, in_next, issuing;
    uint64_t gen;
    dslot *slots;
    unsigned nheld;
    stk__stream streams[NSTREAMS];
    uint64_t issued;
    entry *q;
    unsigned qcap, qhead, qlen;
    inflight fl[MAX_INFLIGHT]; /* oldest first */
    unsigned nfl;
    stk__event ev_free[MAX_INFLIGHT]; /* events of no copy in flight */
    unsigned nev_free;
    int broken; /* STK_EDEVICE once a copy or conversion failed */
    char broken_msg[STK_ERRMSG_MAX];
    uint64_t delivered_batches, delivered_samples;
    stk__devfield *fields; /* cfg.fields, copied */
    size_t *foff;          /* DENSE fields: the column's offset in a slot's fdev */
    size_t npy_off;        /* where the NPY columns go in fdev */
};

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

static bool any_field(const stk__devstage_cfg *cfg, int w1, int w2)
{
    for (size_t k = 0; k < cfg->nfields; k++)
        if (cfg->fields[k].where == w1 || cfg->fields[k].where == w2)
            return true;
    return false;
}

/* A device buffer's fdev: the dense columns, then room for the NPY ones
 * (their bytes are at most the host field arena's, plus each column's
 * alignment). */
static uint64_t fdev_bytes(const stk__devstage_cfg *cfg)
{
    uint64_t n = 0;
    for (size_t k = 0; k < cfg->nfields; k++) {
        const stk__devfield *f = &cfg->fields[k];
        if (f->where == STK__DF_DENSE)
            n += align_up(cfg->batch_size * f->sample_bytes, DEV_ALIGN);
        else if (f->where == STK__DF_NPY)
            n += DEV_ALIGN;
    }
    if (any_field(cfg, STK__DF_NPY, STK__DF_NPY))
        n += cfg->field_memory;
    return n;
}

uint64_t stk__devstage_host_bytes(const stk__devstage_cfg *cfg)
{
    if (!cfg->nfields)
        return 0;
    uint64_t B = cfg->batch_size;
    uint64_t per = cfg->nfields * (sizeof(stk_field) + sizeof(dcol));
    for (size_t k = 0; k < cfg->nfields; k++) {
        const stk__devfield *f = &cfg->fields[k];
        if (f->where == STK__DF_HOST || f->where == STK__DF_NPY)
            per += B * (16 + (f->shapes ? (uint64_t)SHAPE_STRIDE * 8 : 0u) + (f->dtypes ? 4u : 0u));
        if (f->optional)
            per += B;
    }
    if (any_field(cfg, STK__DF_HOST, STK__DF_NPY))
        per += cfg->field_memory;
    return per * cfg->slots;
}

uint64_t stk__devstage_device_bytes(const stk__devstage_cfg *cfg)
{
    uint64_t per = (uint64_t)cfg->batch_size * cfg->host_sample_bytes;
    if (cfg->convert)
        per += (uint64_t)cfg->batch_size * cfg->out_sample_bytes;
    per += fdev_bytes(cfg);
    return per * cfg->slots;
}

/* Names batch g as the user sees it. */
static void name_batch(const stk__devstage *st, uint64_t g, char *buf, size_t n)
{
    uint64_t per = st->cfg.batches_per_epoch ? st->cfg.batches_per_epoch : 1;
    stk__fmt(buf, n, "batch %llu of epoch %llu", (unsigned long long)(g % per),
             (unsigned long long)(g / per));
}

/* Marks the stage broken by a device failure of batch g. Lock held. */
static void set_broken(stk__devstage *st, uint64_t g, const char *what, const char *why)
{
    if (st->broken)
        return;
    char name[64];
    name_batch(st, g, name, sizeof name);
    st->broken = STK_EDEVICE;
    stk__fmt(st->broken_msg, sizeof st->broken_msg, "%s: the device %s failed: %s (%s device %d)",
             name, what, why, st->dev->ops->name, st->dev->id);
    pthread_cond_broadcast(&st->cond);
}

static void push(stk__devstage *st, int kind, int rc, dslot *d, const char *msg)
{
    entry *e = &st->q[(st->qhead + st->qlen) % st->qcap];
    e->kind = kind;
    e->rc = rc;
    e->d = d;
    stk__fmt(e->msg, sizeof e->msg, "%s", msg ? msg : "");
    st->qlen++;
    pthread_cond_broadcast(&st->cond);
}

static dslot *free_slot(stk__devstage *st)
{
    for (unsigned k = 0; k < st->cfg.slots; k++)
        if (st->slots[k].state == D_FREE)
            return &st->slots[k];
    return NULL;
}

/* Gives back the host batches whose copies completed; with `block`, waits
 * for the oldest first. Lock held; dropped around the calls. Only the copy
 * thread (or stop, after joining it) touches the in-flight list. */
static void reap(stk__devstage *st, bool block)
{
    const stk__dev_ops *ops = st->dev->ops;
    char err[STK_ERRMSG_MAX];
    for (unsigned k = 0; k < st->nfl;) {
        inflight f = st->fl[k];
        int rc;
        pthread_mutex_unlock(&st->lock);
        err[0] = 0;
        if (block && k == 0)
            rc = ops->event_sync(st->dev, f.ev, err, sizeof err);
        else
            rc = ops->event_query(st->dev, f.ev, err, sizeof err);
        pthread_mutex_lock(&st->lock);
        if (rc == 1) {
            k++;
            continue;
        }
        if (rc != STK_OK)
            set_broken(st, f.g, "copy", err);
        /* Done (or failed: the copy will not touch it any more). */
        memmove(&st->fl[k], &st->fl[k + 1], (st->nfl - k - 1) * sizeof *st->fl);
        st->nfl--;
        st->ev_free[st->nev_free++] = f.ev;
        pthread_mutex_unlock(&st->lock);
        st->cfg.host_release(st->cfg.ctx, f.hb);
        pthread_mutex_lock(&st->lock);
        block = false;
    }
}

/* Whether an .npy column of n samples stacks into one dense device array:
 * every sample present, of one dtype torch has (not the unsigned wider
 * ones) and one shape of at most 4 dims (stk_field.shape) that accounts
 * for exactly its bytes. */
static bool npy_uniform(const stk_field *hf, size_t n)
{
    if (!n || !hf->shapes || !hf->dtypes || !hf->lengths)
        return false;
    int dt = hf->dtypes[0];
    if (dt == STK_DTYPE_UINT16 || dt == STK_DTYPE_UINT32 || dt == STK_DTYPE_UINT64)
        return false;
    const int64_t *sh = hf->shapes;
    if (sh[0] < 0 || sh[0] > 4)
        return false;
    uint64_t bytes = stk_dtype_size(dt);
    for (int64_t d = 1; d <= sh[0]; d++) {
        if (sh[d] < 0 || (sh[d] && bytes > UINT64_MAX / (uint64_t)sh[d]))
            return false;
        bytes *= (uint64_t)sh[d];
    }
    if (!bytes || bytes != hf->lengths[0])
        return false;
    for (size_t s = 0; s < n; s++)
        if ((hf->present && !hf->present[s]) || hf->dtypes[s] != dt ||
            hf->lengths[s] != hf->lengths[0] ||
            memcmp(&hf->shapes[s * SHAPE_STRIDE], sh, SHAPE_STRIDE * sizeof *sh))
            return false;
    return true;
}

/* Packs sample s of a variable column into the arena at *aoff. The host
 * ring's field arena took each sample rounded up to ARENA_ALIGN out of
 * field_memory, and so does this, so everything that fitted there fits. */
static int pack_sample(const stk__devstage *st, dslot *d, const stk_field *hf, dcol *col, size_t s,
                       size_t *aoff, char *err, size_t errlen)
{
    size_t len = (size_t)hf->lengths[s];
    size_t need = align_up(len, ARENA_ALIGN);
    if (need < len || need > st->cfg.field_memory - *aoff) {
        stk__fmt(err, errlen, "field '%s' takes more than field_memory (%zu bytes) on the host",
                 hf->name, st->cfg.field_memory);
        return STK_ETOOBIG;
    }
    if (len)
        memcpy(d->arena + *aoff, (const uint8_t *)hf->data + hf->offsets[s], len);
    col->offsets[s] = *aoff;
    col->lengths[s] = len;
    *aoff += need;
    return STK_OK;
}

/* Queues the copies of the batch's dense fields on stream s and packs its
 * variable ones into the buffer's host arena; fills the buffer's field
 * views except the primary's (issue does, with the batch's view). The
 * host batch stays the copy thread's until the event recorded after these
 * copies completed. */
static int issue_fields(stk__devstage *st, dslot *d, const stk_batch *hb, stk__stream s, char *err,
                        size_t errlen)
{
    const stk__dev_ops *ops = st->dev->ops;
    stk__dev *dev = st->dev;
    size_t n = hb->size;
    int rc = STK_OK;
    if (hb->nfields != st->cfg.nfields) {
        stk__fmt(err, errlen, "internal error: a batch with %zu fields, the plan has %zu",
                 hb->nfields, st->cfg.nfields);
        return STK_EINVAL;
    }
    if (d->arena_h2d) {
        /* The last batch in this buffer was copied to the device from its
         * arena; the consumer may have released it with that copy still
         * queued (a device consumer orders its work after it on the device
         * only), so the host waits for it before writing the arena again. */
        if ((rc = ops->event_sync(dev, d->ready, err, errlen)))
            return rc;
        d->arena_h2d = false;
    }
    size_t aoff = 0, noff = st->npy_off;
    for (size_t k = 0; k < st->cfg.nfields; k++) {
        const stk__devfield *df = &st->fields[k];
        const stk_field *hf = &hb->fields[k];
        stk_field *f = &d->fviews[k];
        dcol *col = &d->cols[k];
        *f = *hf;
        f->device = STK_DEVICE_CPU;
        f->device_id = 0;
        if ((hf->present && !col->present) ||
            (df->where == STK__DF_HOST &&
             ((hf->shapes && !col->shapes) || (hf->dtypes && !col->dtypes)))) {
            stk__fmt(err, errlen, "internal error: field '%s' has columns its plan lacks",
                     hf->name);
            return STK_EINVAL;
        }
        if (hf->present) {
            memcpy(col->present, hf->present, n);
            f->present = col->present;
        }
        if (df->where == STK__DF_PRIMARY)
            continue;
        if (df->where == STK__DF_DENSE) {
            stk__dptr dst = d->fdev + st->foff[k];
            if (n * df->sample_bytes != 0 &&
                (rc = ops->copy_h2d(dev, dst, hf->data, n * df->sample_bytes, s, err, errlen)))
                return rc;
            f->data = (void *)(uintptr_t)dst;
            f->device = dev->kind;
            f->device_id = dev->id;
            continue;
        }
        if (df->where == STK__DF_NPY && npy_uniform(hf, n)) {
            /* One dense array: packed back to back in the arena, then one
             * copy (the arena stays untouched until it ran: arena_h2d). */
            size_t len = (size_t)hf->lengths[0], total = n * len;
            if (total > st->cfg.field_memory - aoff) {
                stk__fmt(err, errlen, "field '%s' takes more than field_memory (%zu bytes)",
                         hf->name, st->cfg.field_memory);
                return STK_ETOOBIG;
            }
            for (size_t j = 0; j < n; j++)
                memcpy(d->arena + aoff + j * len, (const uint8_t *)hf->data + hf->offsets[j], len);
            stk__dptr dst = d->fdev + noff;
            if ((rc = ops->copy_h2d(dev, dst, d->arena + aoff, total, s, err, errlen)))
                return rc;
            d->arena_h2d = true;
            aoff += align_up(total, ARENA_ALIGN);
            noff += align_up(total, DEV_ALIGN);
            f->layout = STK_BATCH_DENSE;
            f->dtype = hf->dtypes[0];
            f->ndim = (unsigned)hf->shapes[0];
            memset(f->shape, 0, sizeof f->shape);
            for (unsigned j = 0; j < f->ndim; j++)
                f->shape[j] = hf->shapes[1 + j];
            f->sample_bytes = len;
            f->data = (void *)(uintptr_t)dst;
            f->offsets = f->lengths = NULL;
            f->shapes = NULL;
            f->dtypes = NULL;
            f->device = dev->kind;
            f->device_id = dev->id;
            continue;
        }
        /* A variable column (or a ragged .npy batch) in host memory. */
        for (size_t j = 0; j < n; j++)
            if ((rc = pack_sample(st, d, hf, col, j, &aoff, err, errlen)))
                return rc;
        if (hf->shapes)
            memcpy(col->shapes, hf->shapes, n * SHAPE_STRIDE * sizeof *col->shapes);
        if (hf->dtypes)
            memcpy(col->dtypes, hf->dtypes, n * sizeof *col->dtypes);
        f->data = d->arena;
        f->offsets = col->offsets;
        f->lengths = col->lengths;
        f->shapes = hf->shapes ? col->shapes : NULL;
        f->dtypes = hf->dtypes ? col->dtypes : NULL;
    }
    return STK_OK;
}

/* Queues the copy (and conversion) of host batch hb into a free device
 * buffer. Lock held; dropped around the backend calls. */
static void issue(stk__devstage *st, stk_batch *hb)
{
    const stk__dev_ops *ops = st->dev->ops;
    stk__dev *dev = st->dev;
    dslot *d = free_slot(st); /* the caller saw one free, under the lock */
    if (!d)
        return;
    uint64_t g = hb->epoch * st->cfg.batches_per_epoch + hb->index;
    d->state = D_ISSUING;
    d->g = g;
    stk__event hev = st->ev_free[--st->nev_free];
    stk__stream s = st->streams[st->issued++ % NSTREAMS];
    st->issuing = true;
    pthread_mutex_unlock(&st->lock);

    char err[STK_ERRMSG_MAX] = "";
    const char *what = "copy";
    int rc = STK_OK;
    if (d->used) {
        /* The consumer released this buffer after its stream's use of it,
         * and its previous copy may have run on the other stream. */
        rc = ops->stream_wait_event(dev, s, d->released, err, sizeof err);
        if (!rc)
            rc = ops->stream_wait_event(dev, s, d->ready, err, sizeof err);
        /* And for the other streams it recorded (stk_batch_record_stream). */
        for (unsigned i = 0; !rc && i < d->nwait; i++)
            rc = ops->stream_wait_event(dev, s, d->rec_ev[i], err, sizeof err);
    }
    size_t host_bytes = hb->size * st->cfg.host_sample_bytes;
    if (!rc && host_bytes)
        rc = ops->copy_h2d(dev, d->staging, hb->data, host_bytes, s, err, sizeof err);
    if (!rc && st->cfg.nfields)
        rc = issue_fields(st, d, hb, s, err, sizeof err);
    if (!rc) {
        rc = ops->event_record(dev, hev, s, err, sizeof err);
    } else {
        /* Copies queued before the failure still read the host batch: its
         * release waits for them as for a whole batch's. */
        char err2[STK_ERRMSG_MAX];
        (void)ops->event_record(dev, hev, s, err2, sizeof err2);
    }
    if (!rc && st->cfg.convert && hb->size) {
        what = "conversion";
        rc = ops->convert(dev, &st->cfg.cv, d->staging, d->out, hb->size, s, err, sizeof err);
    }
    if (!rc)
        rc = ops->event_record(dev, d->ready, s, err, sizeof err);
    d->used = true;
    d->stream = s;

    /* The batch's host-side arrays are the consumer's copy, so the host
     * buffer can go back to the workers while the consumer holds this. */
    size_t n = hb->size;
    memcpy(d->labels, hb->labels, n * sizeof *d->labels);
    memcpy(d->indices, hb->indices, n * sizeof *d->indices);
    memcpy(d->lengths, hb->lengths, n * sizeof *d->lengths);
    memcpy(d->dims, hb->dims, 3 * n * sizeof *d->dims);
    /* Field by field: device and device_id are set once at creation and
     * never written again, so a late second release of an earlier batch in
     * this buffer reads them without a race. */
    stk_batch *v = &d->view;
    v->epoch = hb->epoch;
    v->index = hb->index;
    v->size = hb->size;
    v->kind = hb->kind;
    v->dtype = hb->dtype;
    v->ndim = hb->ndim;
    memcpy(v->shape, hb->shape, sizeof v->shape);
    for (size_t k = 0; k < n; k++) {
        d->offsets[k] = (uint64_t)k * st->cfg.out_sample_bytes;
        d->lengths[k] = st->cfg.out_sample_bytes;
    }
    v->data = (void *)(uintptr_t)(st->cfg.convert ? d->out : d->staging);
    v->offsets = d->offsets;
    v->lengths = d->lengths;
    v->dims = d->dims;
    v->labels = d->labels;
    v->indices = d->indices;
    v->sample_bytes = st->cfg.out_sample_bytes;
    if (st->cfg.convert) {
        const stk__convert *cv = &st->cfg.cv;
        v->dtype = cv->dtype;
        v->ndim = 3;
        v->shape[0] = cv->nchw ? 3 : cv->h;
        v->shape[1] = cv->nchw ? cv->h : cv->w;
        v->shape[2] = cv->nchw ? cv->w : 3;
        v->shape[3] = 0;
    }
    /* The primary image field is the batch's data, as on the host. */
    for (size_t k = 0; k < st->cfg.nfields; k++) {
        if (st->fields[k].where != STK__DF_PRIMARY)
            continue;
        stk_field *f = &d->fviews[k];
        f->layout = STK_BATCH_DENSE;
        f->dtype = v->dtype;
        f->ndim = v->ndim;
        memcpy(f->shape, v->shape, sizeof f->shape);
        f->sample_bytes = v->sample_bytes;
        f->data = v->data;
        f->offsets = f->lengths = NULL;
        f->device = v->device;
        f->device_id = v->device_id;
    }
    v->nfields = st->cfg.nfields;
    v->fields = st->cfg.nfields ? d->fviews : NULL;

    pthread_mutex_lock(&st->lock);
    st->issuing = false;
    pthread_cond_broadcast(&st->cond);
    /* Even a failed issue may have queued the copy: the host batch goes back
     * only after the event (never recorded: complete at once). */
    st->fl[st->nfl++] = (inflight){hb, hev, g};
    if (rc) {
        set_broken(st, g, what, err);
        d->state = D_FREE;
        return;
    }
    if (st->pause) {
        /* A seek began while this was issued: the batch is from before it. */
        d->state = D_FREE;
        return;
    }
    d->state = D_QUEUED;
    push(st, E_BATCH, STK_OK, d, NULL);
}

static void *copy_main(void *arg)
{
    stk__devstage *st = arg;
    pthread_setname_np(pthread_self(), "stk-copy");
    if (st->dev->ops->enter)
        st->dev->ops->enter(st->dev);
    char err[STK_ERRMSG_MAX];
    pthread_mutex_lock(&st->lock);
    while (!st->cancel) {
        reap(st, false);
        if (st->nfl == MAX_INFLIGHT) {
            reap(st, true);
            continue;
        }
        /* Room for what the host may answer: a batch needs a free device
         * buffer, and an error or an end one queue entry. */
        if (st->pause || st->broken || st->qlen + 1 >= st->qcap || !free_slot(st)) {
            stk__cond_wait_ns(&st->cond, &st->lock, st->nfl ? REAP_SLICE : WAIT_SLICE);
            continue;
        }
        uint64_t gen = st->gen;
        st->in_next = true;
        pthread_mutex_unlock(&st->lock);
        stk_batch *hb = NULL;
        err[0] = 0;
        int rc =
            st->cfg.host_next(st->cfg.ctx, &hb, st->nfl ? REAP_SLICE : HOST_SLICE, err, sizeof err);
        pthread_mutex_lock(&st->lock);
        st->in_next = false;
        pthread_cond_broadcast(&st->cond);
        if (rc == STK_TIMEOUT)
            continue;
        if (st->gen != gen || st->pause || st->cancel) {
            /* Taken from before a seek (or during close): not delivered. */
            if (hb) {
                pthread_mutex_unlock(&st->lock);
                st->cfg.host_release(st->cfg.ctx, hb);
                pthread_mutex_lock(&st->lock);
            }
            continue;
        }
        if (rc == STK_OK)
            issue(st, hb);
        else
            push(st, rc == STK_END ? E_END : E_ERROR, rc, NULL, err);
    }
    pthread_mutex_unlock(&st->lock);
    if (st->dev->ops->leave)
        st->dev->ops->leave(st->dev);
    return NULL;
}

int stk__devstage_next(stk__devstage *st, stk_batch **out, uint64_t timeout_ns, char *err,
                       size_t errlen)
{
    uint64_t start = stk__now_ns();
    int rc;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        if (st->broken) {
            stk__fmt(err, errlen, "%s", st->broken_msg);
            rc = st->broken;
            break;
        }
        if (st->qlen) {
            entry *e = &st->q[st->qhead];
            st->qhead = (st->qhead + 1) % st->qcap;
            st->qlen--;
            pthread_cond_broadcast(&st->cond);
            rc = e->rc;
            if (e->kind == E_BATCH) {
                e->d->state = D_HELD;
                st->nheld++;
                st->delivered_batches++;
                st->delivered_samples += e->d->view.size;
                *out = &e->d->view;
            } else if (e->kind == E_ERROR) {
                stk__fmt(err, errlen, "%s", e->msg);
            }
            break;
        }
        if (st->nheld == st->cfg.slots) {
            stk__fmt(err, errlen,
                     "all %u device buffers are held by the consumer; release a batch before "
                     "asking for the next, or raise depth",
                     st->cfg.slots);
            rc = STK_EBUSY;
            break;
        }
        uint64_t slice = stk__wait_slice(start, stk__now_ns(), timeout_ns, WAIT_SLICE);
        if (!slice) {
            rc = STK_TIMEOUT;
            break;
        }
        stk__cond_wait_ns(&st->cond, &st->lock, slice);
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

static bool host_consumer(const stk__devstage *st, void *stream)
{
    /* The fake device's consumer is the host itself unless a test hands it
     * one of the fake's streams. */
    return st->dev->kind == STK_DEVICE_FAKE && !stream;
}

void *stk__devstage_release(stk_batch *b, void *stream)
{
    dslot *d = (dslot *)(void *)b;
    stk__devstage *st = d->st;
    const stk__dev_ops *ops = st->dev->ops;
    pthread_mutex_lock(&st->lock);
    if (d->state != D_HELD) {
        pthread_mutex_unlock(&st->lock);
        return NULL;
    }
    d->state = D_RELEASING;
    unsigned nrec = d->nrec; /* fixed from here: record_stream sees RELEASING */
    pthread_mutex_unlock(&st->lock);
    /* A host consumer (the fake device without a stream) has finished with
     * the batch when it releases it; any other records where its stream is,
     * and so does every stream the consumer added. */
    bool own = !host_consumer(st, stream);
    if (own || nrec) {
        char err[STK_ERRMSG_MAX];
        int rc = STK_OK;
        if (ops->enter)
            ops->enter(st->dev);
        if (own)
            rc = ops->event_record(st->dev, d->released, stream, err, sizeof err);
        for (unsigned i = 0; !rc && i < nrec; i++)
            rc = ops->event_record(st->dev, d->rec_ev[i], d->rec[i], err, sizeof err);
        if (ops->leave)
            ops->leave(st->dev);
        if (rc) {
            /* Without the event the buffer cannot be reused safely. */
            pthread_mutex_lock(&st->lock);
            set_broken(st, d->g, "release", err);
            pthread_mutex_unlock(&st->lock);
        }
    }
    pthread_mutex_lock(&st->lock);
    d->nwait = nrec;
    d->nrec = 0;
    d->state = D_FREE;
    st->nheld--;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    return st->cfg.ctx;
}

int stk__devstage_record_stream(stk_batch *b, void *stream)
{
    dslot *d = (dslot *)(void *)b;
    stk__devstage *st = d->st;
    if (host_consumer(st, stream))
        return STK_OK; /* the host is done with the batch at its release */
    const stk__dev_ops *ops = st->dev->ops;
    stk__event spare = NULL;
    int rc = STK_OK;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        if (d->state != D_HELD) {
            rc = STK_EMISUSE;
            break;
        }
        bool dup = false;
        for (unsigned i = 0; i < d->nrec; i++)
            dup = dup || d->rec[i] == stream;
        if (dup)
            break;
        if (d->nrec == STK_BATCH_MAX_STREAMS) {
            rc = STK_EINVAL;
            break;
        }
        if (!d->rec_ev[d->nrec] && spare) {
            d->rec_ev[d->nrec] = spare;
            spare = NULL;
        }
        if (d->rec_ev[d->nrec]) {
            d->rec[d->nrec++] = stream;
            break;
        }
        /* The event is made without the lock (a device call); then look
         * again, since another thread may have added a stream meanwhile. */
        pthread_mutex_unlock(&st->lock);
        char err[STK_ERRMSG_MAX];
        if (ops->enter)
            ops->enter(st->dev);
        rc = ops->event_create(st->dev, &spare, err, sizeof err);
        if (ops->leave)
            ops->leave(st->dev);
        pthread_mutex_lock(&st->lock);
        if (rc) {
            spare = NULL;
            rc = rc < 0 ? rc : STK_EDEVICE;
            break;
        }
    }
    pthread_mutex_unlock(&st->lock);
    if (spare) {
        if (ops->enter)
            ops->enter(st->dev);
        ops->event_destroy(st->dev, spare);
        if (ops->leave)
            ops->leave(st->dev);
    }
    return rc;
}

/* A wait or sync that failed: the stage is broken, naming the batch. */
static int failed(stk__devstage *st, const dslot *d, int rc, const char *err)
{
    pthread_mutex_lock(&st->lock);
    set_broken(st, d->g, "copy or conversion", err);
    pthread_mutex_unlock(&st->lock);
    return rc < 0 ? rc : STK_EDEVICE;
}

int stk__devstage_sync(stk_batch *b)
{
    dslot *d = (dslot *)(void *)b;
    stk__devstage *st = d->st;
    char err[STK_ERRMSG_MAX];
    int rc = st->dev->ops->event_sync(st->dev, d->ready, err, sizeof err);
    return rc ? failed(st, d, rc, err) : STK_OK;
}

int stk__devstage_wait(stk_batch *b, void *stream)
{
    dslot *d = (dslot *)(void *)b;
    stk__devstage *st = d->st;
    if (host_consumer(st, stream))
        return stk__devstage_sync(b);
    const stk__dev_ops *ops = st->dev->ops;
    char err[STK_ERRMSG_MAX];
    if (ops->enter)
        ops->enter(st->dev);
    int rc = ops->event_query(st->dev, d->ready, err, sizeof err);
    if (rc >= 0)
        rc = ops->stream_wait_event(st->dev, stream, d->ready, err, sizeof err);
    if (ops->leave)
        ops->leave(st->dev);
    return rc ? failed(st, d, rc, err) : STK_OK;
}

/* Drops the batches queued but not delivered: their buffers are free again
 * (their copies may still run, which the next copy into a buffer waits for:
 * d->ready). Lock held. */
static void drop_queue(stk__devstage *st)
{
    for (; st->qlen; st->qlen--) {
        entry *e = &st->q[st->qhead];
        st->qhead = (st->qhead + 1) % st->qcap;
        if (e->kind == E_BATCH)
            e->d->state = D_FREE;
    }
}

void stk__devstage_pause(stk__devstage *st)
{
    pthread_mutex_lock(&st->lock);
    st->pause = true;
    st->gen++;
    pthread_cond_broadcast(&st->cond);
    while (st->in_next || st->issuing)
        stk__cond_wait_ns(&st->cond, &st->lock, WAIT_SLICE);
    drop_queue(st);
    pthread_mutex_unlock(&st->lock);
}

void stk__devstage_resume(stk__devstage *st)
{
    pthread_mutex_lock(&st->lock);
    st->pause = false;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
}

void stk__devstage_delivered(stk__devstage *st, uint64_t *batches, uint64_t *samples)
{
    pthread_mutex_lock(&st->lock);
    *batches = st->delivered_batches;
    *samples = st->delivered_samples;
    pthread_mutex_unlock(&st->lock);
}

void stk__devstage_stop(stk__devstage *st)
{
    if (!st || !st->started)
        return;
    pthread_mutex_lock(&st->lock);
    st->cancel = true;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    pthread_join(st->th, NULL);
    st->started = false;
    const stk__dev_ops *ops = st->dev->ops;
    if (ops->enter)
        ops->enter(st->dev);
    pthread_mutex_lock(&st->lock);
    while (st->nfl)
        reap(st, true);
    drop_queue(st);
    pthread_mutex_unlock(&st->lock);
    if (ops->leave)
        ops->leave(st->dev);
}

void stk__devstage_destroy(stk__devstage *st)
{
    if (!st)
        return;
    stk__devstage_stop(st);
    stk__dev *dev = st->dev;
    const stk__dev_ops *ops = dev->ops;
    if (ops->enter)
        ops->enter(dev);
    /* Streams first: destroying one lets its queued work finish (the copies
     * into buffers a seek dropped), before the buffers go. */
    for (unsigned k = 0; k < NSTREAMS; k++)
        if (st->streams[k])
            ops->stream_destroy(dev, st->streams[k]);
    if (st->slots) {
        for (unsigned k = 0; k < st->cfg.slots; k++) {
            dslot *d = &st->slots[k];
            if (d->ready) {
                char err[STK_ERRMSG_MAX];
                (void)ops->event_sync(dev, d->ready, err, sizeof err);
                ops->event_destroy(dev, d->ready);
            }
            if (d->released) {
                char err[STK_ERRMSG_MAX];
                (void)ops->event_sync(dev, d->released, err, sizeof err);
                ops->event_destroy(dev, d->released);
            }
            for (unsigned i = 0; i < STK_BATCH_MAX_STREAMS; i++) {
                if (!d->rec_ev[i])
                    continue;
                char err[STK_ERRMSG_MAX];
                (void)ops->event_sync(dev, d->rec_ev[i], err, sizeof err);
                ops->event_destroy(dev, d->rec_ev[i]);
            }
            if (d->fdev)
                ops->dev_free(dev, d->fdev);
            if (d->cols) {
                for (size_t f = 0; f < st->cfg.nfields; f++) {
                    stk__free(d->cols[f].offsets);
                    stk__free(d->cols[f].lengths);
                    stk__free(d->cols[f].shapes);
                    stk__free(d->cols[f].dtypes);
                    stk__free(d->cols[f].present);
                }
            }
            stk__free(d->cols);
            stk__free(d->fviews);
            if (d->arena)
                stk__unmap(d->arena, st->cfg.field_memory);
            if (d->staging)
                ops->dev_free(dev, d->staging);
            if (d->out)
                ops->dev_free(dev, d->out);
            stk__free(d->offsets);
            stk__free(d->lengths);
            stk__free(d->indices);
            stk__free(d->dims);
            stk__free(d->labels);
        }
    }
    for (unsigned k = 0; k < st->nev_free; k++)
        ops->event_destroy(dev, st->ev_free[k]);
    if (ops->leave)
        ops->leave(dev);
    stk__free(st->slots);
    stk__free(st->q);
    stk__free(st->fields);
    stk__free(st->foff);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    stk__free(st);
}

/* A device buffer's field views and host columns (and arena). */
static int alloc_field_slot(stk__devstage *st, dslot *d, bool arena, char *err, size_t errlen)
{
    size_t B = st->cfg.batch_size, n = st->cfg.nfields;
    if (!(d->fviews = stk__calloc(n, sizeof *d->fviews)) ||
        !(d->cols = stk__calloc(n, sizeof *d->cols)))
        goto oom;
    for (size_t k = 0; k < n; k++) {
        const stk__devfield *f = &st->fields[k];
        dcol *col = &d->cols[k];
        if (f->optional && !(col->present = stk__calloc(B ? B : 1, 1)))
            goto oom;
        if (f->where != STK__DF_HOST && f->where != STK__DF_NPY)
            continue;
        if (!(col->offsets = stk__calloc(B ? B : 1, sizeof *col->offsets)) ||
            !(col->lengths = stk__calloc(B ? B : 1, sizeof *col->lengths)) ||
            (f->shapes &&
             !(col->shapes = stk__calloc(B * SHAPE_STRIDE + 1, sizeof *col->shapes))) ||
            (f->dtypes && !(col->dtypes = stk__calloc(B ? B : 1, sizeof *col->dtypes))))
            goto oom;
    }
    /* Address space only, as the host ring's field arena: memory is used as
     * the columns are packed. */
    if (arena && st->cfg.field_memory && !(d->arena = stk__map(st->cfg.field_memory)))
        goto oom;
    return STK_OK;
oom:
    stk__fmt(err, errlen, "out of memory for the device batches' field columns");
    return STK_ENOMEM;
}

int stk__devstage_create(stk__devstage **out, const stk__devstage_cfg *cfg, char *err,
                         size_t errlen)
{
    *out = NULL;
    stk__devstage *st = stk__calloc(1, sizeof *st);
    if (!st) {
        stk__fmt(err, errlen, "out of memory creating the device stage");
        return STK_ENOMEM;
    }
    st->cfg = *cfg;
    st->dev = cfg->dev;
    if (pthread_mutex_init(&st->lock, NULL)) {
        stk__free(st);
        stk__fmt(err, errlen, "cannot create a lock");
        return STK_ENOMEM;
    }
    if (stk__cond_init(&st->cond)) {
        pthread_mutex_destroy(&st->lock);
        stk__free(st);
        stk__fmt(err, errlen, "cannot create a condition variable");
        return STK_ENOMEM;
    }
    const stk__dev_ops *ops = st->dev->ops;
    stk__dev *dev = st->dev;
    size_t B = cfg->batch_size;
    int rc = STK_OK;
    st->qcap = 3 * cfg->slots + 4;
    st->cfg.fields = NULL; /* the copy below, once made */
    if (!(st->q = stk__calloc(st->qcap, sizeof *st->q)) ||
        !(st->slots = stk__calloc(cfg->slots, sizeof *st->slots))) {
        stk__fmt(err, errlen, "out of memory creating the device stage");
        rc = STK_ENOMEM;
        goto fail;
    }
    if (cfg->nfields) {
        if (!(st->fields = stk__calloc(cfg->nfields, sizeof *st->fields)) ||
            !(st->foff = stk__calloc(cfg->nfields, sizeof *st->foff))) {
            st->cfg.nfields = 0; /* no slot has columns to free yet */
            stk__fmt(err, errlen, "out of memory creating the device stage");
            rc = STK_ENOMEM;
            goto fail;
        }
        memcpy(st->fields, cfg->fields, cfg->nfields * sizeof *st->fields);
        st->cfg.fields = st->fields;
        size_t off = 0;
        for (size_t k = 0; k < cfg->nfields; k++) {
            if (st->fields[k].where != STK__DF_DENSE)
                continue;
            st->foff[k] = off;
            off += align_up(B * st->fields[k].sample_bytes, DEV_ALIGN);
        }
        st->npy_off = off;
    }
    uint64_t fdev = fdev_bytes(&st->cfg);
    bool arena = any_field(&st->cfg, STK__DF_HOST, STK__DF_NPY);
    if (ops->enter)
        ops->enter(dev);
    for (unsigned k = 0; k < NSTREAMS && !rc; k++)
        rc = ops->stream_create(dev, &st->streams[k], err, errlen);
    for (unsigned k = 0; k < MAX_INFLIGHT && !rc; k++)
        if (!(rc = ops->event_create(dev, &st->ev_free[k], err, errlen)))
            st->nev_free++;
    for (unsigned k = 0; k < cfg->slots && !rc; k++) {
        dslot *d = &st->slots[k];
        d->st = st;
        d->state = D_FREE;
        d->view.device = dev->kind;
        d->view.device_id = dev->id;
        if (!(d->offsets = stk__malloc(B * sizeof *d->offsets)) ||
            !(d->lengths = stk__malloc(B * sizeof *d->lengths)) ||
            !(d->indices = stk__malloc(B * sizeof *d->indices)) ||
            !(d->dims = stk__malloc(3 * B * sizeof *d->dims)) ||
            !(d->labels = stk__malloc(B * sizeof *d->labels))) {
            stk__fmt(err, errlen, "out of memory creating the device stage");
            rc = STK_ENOMEM;
            break;
        }
        if (cfg->nfields && (rc = alloc_field_slot(st, d, arena, err, errlen)))
            break;
        if (fdev && (rc = ops->dev_alloc(dev, (size_t)fdev, &d->fdev, err, errlen)))
            break;
        rc = ops->dev_alloc(dev, B * cfg->host_sample_bytes, &d->staging, err, errlen);
        if (!rc && cfg->convert)
            rc = ops->dev_alloc(dev, B * cfg->out_sample_bytes, &d->out, err, errlen);
        if (!rc)
            rc = ops->event_create(dev, &d->ready, err, errlen);
        if (!rc)
            rc = ops->event_create(dev, &d->released, err, errlen);
    }
    if (ops->leave)
        ops->leave(dev);
    if (rc)
        goto fail;
    if (pthread_create(&st->th, NULL, copy_main, st)) {
        stk__fmt(err, errlen, "cannot start the copy thread");
        rc = STK_ENOMEM;
        goto fail;
    }
    st->started = true;
    *out = st;
    return STK_OK;
fail:
    stk__devstage_destroy(st);
    return rc;
}
