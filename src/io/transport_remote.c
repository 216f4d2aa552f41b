/*
 * transport_remote.c -- the transport table over an object store
 * (transport.h), on remote.h's engine: an object is its name; opening it
 * costs no request (its size comes with its first ranged GET, in
 * Content-Range); a batch of reads is one stk__remote_run, all in flight
 * together; a copy is one whole-object GET written into the caller's
 * descriptor by the engine's thread. The store is borrowed (the source owns it, and closes it
 * before its reader: nothing here touches it at close).
 */
#include "io/transport.h"
#include "io/remote.h"

#include <string.h>
#include <xxhash.h>

/* Reads a batch of ranges in flight together: the round trips of a
 * chunk of shards' headers, footers or index regions overlap. */
#define REMOTE_BATCH 512

typedef struct remote_tp {
    stk__transport base;
    stk__remote *r; /* borrowed */
} remote_tp;

/* What a stk__tobj points at here. */
typedef struct remote_obj {
    char *name;
} remote_obj;

static const char *obj_name(const stk__tobj *o)
{
    return ((const remote_obj *)(const void *)o)->name;
}

static stk__remote *store(const stk__transport *t)
{
    return ((const remote_tp *)t)->r;
}

static int remote_open(stk__transport *t, const char *name, stk__tobj **out, stk__tinfo *info,
                       char *err, size_t errlen)
{
    (void)t;
    (void)err;
    (void)errlen;
    remote_obj *o = stk__calloc(1, sizeof *o);
    if (!o || !(o->name = stk__strdup(name))) {
        stk__free(o);
        return STK_ENOMEM;
    }
    /* Objects are the same when their names are. */
    *info = (stk__tinfo){.sized = false, .dev = UINT64_MAX, .ino = XXH3_64bits(name, strlen(name))};
    *out = (stk__tobj *)(void *)o;
    return STK_OK;
}

static void remote_idle(stk__transport *t, stk__tobj *o)
{
    (void)t;
    (void)o;
}

/* The results of q into r. */
static void result_of(const stk__req *q, stk__trange *r)
{
    r->rc = q->rc;
    r->total = q->total;
    stk__fmt(r->version, sizeof r->version, "%s", q->validator);
    if (q->rc == STK_ENOENT && !q->err[0])
        stk__fmt(r->err, sizeof r->err, "not found (HTTP 404)");
    else
        stk__fmt(r->err, sizeof r->err, "%s", q->rc ? q->err : "");
}

static void remote_read(stk__transport *t, stk__trange *const *rs, size_t n)
{
    /* One read (a sample outside the fetch stage) needs no allocation. */
    stk__req one, *onep = &one;
    stk__req *q = n > 1 ? stk__calloc(n, sizeof *q) : &one;
    stk__req **qp = n > 1 ? stk__calloc(n, sizeof *qp) : &onep;
    size_t m = 0;
    if (!q || !qp) {
        for (size_t k = 0; k < n; k++) {
            rs[k]->rc = STK_ENOMEM;
            rs[k]->total = 0;
            rs[k]->version[0] = '\0';
            stk__fmt(rs[k]->err, sizeof rs[k]->err, "out of memory for %zu requests", n);
        }
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        stk__trange *r = rs[k];
        r->rc = STK_OK;
        r->total = 0;
        r->version[0] = r->err[0] = '\0';
        if (!r->len)
            continue;
        memset(&q[m], 0, sizeof q[m]);
        q[m].name = obj_name(r->obj);
        q[m].off = r->off;
        q[m].len = r->len;
        q[m].buf = r->buf;
        q[m].fd = -1;
        qp[m] = &q[m];
        m++;
    }
    stk__remote_run(store(t), qp, m);
    m = 0;
    for (size_t k = 0; k < n; k++)
        if (rs[k]->len)
            result_of(&q[m++], rs[k]);
out:
    if (q != &one)
        stk__free(q);
    if (qp != &onep)
        stk__free(qp);
}

static int remote_get(stk__transport *t, const char *name, size_t limit, uint8_t **out, size_t *len,
                      char *err, size_t errlen)
{
    char *text = NULL;
    int rc = stk__remote_get_small(store(t), name, limit, &text, len, err, errlen);
    *out = (uint8_t *)text;
    return rc;
}

static int remote_copy_start(stk__transport *t, stk__tcopy *c)
{
    stk__req *q = stk__calloc(1, sizeof *q);
    if (!q) {
        c->rc = STK_ENOMEM;
        stk__fmt(c->err, sizeof c->err, "out of memory for a request");
        return c->rc;
    }
    q->name = obj_name(c->obj);
    q->fd = c->fd;
    c->impl_ = q;
    stk__remote_submit(store(t), q);
    return STK_OK;
}

static void remote_copy_wait(stk__transport *t, stk__tcopy *c)
{
    stk__req *q = c->impl_;
    if (!q)
        return;
    stk__remote_wait(store(t), q);
    stk__trange r;
    result_of(q, &r);
    c->rc = r.rc;
    c->got = q->got;
    c->write_errno = q->write_errno;
    stk__fmt(c->version, sizeof c->version, "%s", r.version);
    stk__fmt(c->err, sizeof c->err, "%s", r.err);
    stk__free(q->body);
    stk__free(q);
    c->impl_ = NULL;
}

static void remote_display(const stk__transport *t, const char *name, char *buf, size_t n)
{
    stk__remote_object_display(store(t), name, buf, n);
}

static void remote_id(const stk__transport *t, const char *name, char *buf, size_t n)
{
    stk__remote_object_id(store(t), name, buf, n);
}

/* A store's object is in no local file: the caching transport
 * (transport_cache.c) over this one gives one. */
static int remote_path(stk__transport *t, stk__tobj *o, char *buf, size_t n)
{
    (void)t;
    (void)o;
    if (n)
        buf[0] = '\0';
    return STK_EUNSUPPORTED;
}

static void remote_close_obj(stk__transport *t, stk__tobj *o)
{
    (void)t;
    if (!o)
        return;
    stk__free(((remote_obj *)(void *)o)->name);
    stk__free(o);
}

static void remote_close(stk__transport *t)
{
    stk__free(t);
}

static const stk__tp_ops k_remote_ops = {.kind = "http",
                                         .batch = REMOTE_BATCH,
                                         .open = remote_open,
                                         .idle = remote_idle,
                                         .read = remote_read,
                                         .get = remote_get,
                                         .copy_start = remote_copy_start,
                                         .copy_wait = remote_copy_wait,
                                         .display = remote_display,
                                         .id = remote_id,
                                         .path = remote_path,
                                         .close_obj = remote_close_obj,
                                         .close = remote_close};

int stk__transport_remote(stk__transport **out, stk__remote *r)
{
    remote_tp *p = stk__calloc(1, sizeof *p);
    if (!p)
        return STK_ENOMEM;
    p->base.ops = &k_remote_ops;
    p->r = r;
    *out = &p->base;
    return STK_OK;
}
