/*
 * loader_state.c -- resume state: stk_loader_get_state/set_state (with elastic
 * layouts when the world changed) and the transform fingerprint.
 */
#include "loader_core.h"

#include <stddef.h>
#include <string.h>

/* The loader's own state: position and fingerprint. Lock held. The position
 * is the user's: with a device, where the device stage's consumer is (the
 * copy thread has taken batches ahead of it). */
static stk_state own_state(const core *c)
{
    stk_state st = {.struct_size = sizeof st};
    uint64_t epoch = c->dstage ? c->cons_epoch : c->cur_epoch;
    uint64_t deliver_g = c->dstage ? c->cons_g : c->ring.deliver_g;
    st.seed = c->sched.seed;
    st.epoch = epoch;
    st.batch = deliver_g - epoch * c->sched.part.batches;
    st.num_samples = c->src.count;
    st.batch_size = c->batch_size;
    st.world_size = c->sched.part.world;
    st.local_world_size = c->sched.part.local;
    st.rank = c->sched.part.rank;
    st.shuffle = c->sched.shuffle;
    st.drop_last = c->drop_last;
    st.transform = c->transform_hash;
    st.mixture = c->mix_hash;
    const stk__resumed *r = stk__schedule_resumed(&c->sched);
    if (r && r->epoch == epoch) {
        if (st.batch >= c->sched.part.batches) {
            /* The resumed epoch is over: the next one starts afresh. */
            st.epoch++;
            st.batch = 0;
        } else {
            st.batch -= r->off;
            st.history_len = (uint32_t)(r->lay.ngens - 1);
            for (size_t i = 0; i + 1 < r->lay.ngens; i++) {
                const stk__gen_spec *g = &r->lay.gens[i].spec;
                st.history[i] = (stk_state_generation){g->world, g->local, g->batch_size, g->steps};
            }
        }
    }
    return st;
}

int stk_loader_get_state(stk_loader *l, stk_state *st)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    core *c = l->c;
    pthread_mutex_lock(&c->lock);
    stk_state own = own_state(c);
    pthread_mutex_unlock(&c->lock);
    return stk__put_sized(l, "stk_state", st, &own, sizeof own, STATE_V1);
}

/* Names the first fingerprint field where a saved state differs from the
 * loader's, with both values. Returns STK_OK when all match. */
static int check_fingerprint(stk_loader *l, const stk_state *st, const stk_state *own)
{
    static const struct {
        const char *name;
        size_t off, size;
    } fields[] = {
        {"seed", offsetof(stk_state, seed), sizeof(uint64_t)},
        {"num_samples (the dataset's size)", offsetof(stk_state, num_samples), sizeof(uint64_t)},
        {"shuffle", offsetof(stk_state, shuffle), sizeof(uint32_t)},
        {"drop_last", offsetof(stk_state, drop_last), sizeof(uint32_t)},
        {"transform", offsetof(stk_state, transform), sizeof(uint64_t)},
        {"mixture", offsetof(stk_state, mixture), sizeof(uint64_t)},
    };
    /* mix_resume "new": the position carries over to this mixture. */
    bool mix_new = l->c->mix_new;
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        if (fields[k].off + fields[k].size > st->struct_size)
            continue; /* a field later than the caller's struct */
        uint64_t a = 0, b = 0;
        if (fields[k].size == sizeof(uint32_t)) {
            uint32_t a32, b32;
            memcpy(&a32, (const char *)st + fields[k].off, sizeof a32);
            memcpy(&b32, (const char *)own + fields[k].off, sizeof b32);
            a = a32, b = b32;
        } else {
            memcpy(&a, (const char *)st + fields[k].off, sizeof a);
            memcpy(&b, (const char *)own + fields[k].off, sizeof b);
        }
        if (a == b)
            continue;
        /* A state of the first version holds the fingerprint with paths. */
        if (fields[k].off == offsetof(stk_state, mixture) && a && a == l->c->mix_hash_v1)
            continue;
        if (mix_new && (!strcmp(fields[k].name, "mixture") ||
                        fields[k].off == offsetof(stk_state, num_samples)))
            continue;
        if (!strcmp(fields[k].name, "mixture"))
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state was saved with %s (fingerprint %016llx) but this loader has %s "
                     "(%016llx): the sources, their weights or samples, their sizes or "
                     "samples_per_epoch differ, so resuming would not give the same batches; set "
                     "the option mix_resume to \"new\" to continue from the saved position with "
                     "this mixture (docs/mixing.md)",
                     a ? "a mixture" : "no mixture", (unsigned long long)a,
                     b ? (a ? "another mixture" : "a mixture") : "no mixture",
                     (unsigned long long)b);
        else if (!strcmp(fields[k].name, "transform"))
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state was saved with another transform (fingerprint %016llx; this loader's "
                     "transform and image options give %016llx): resuming would not give the "
                     "same batches",
                     (unsigned long long)a, (unsigned long long)b);
        else
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state was saved with %s %llu but this loader has %llu: resuming would not "
                     "give the same batches",
                     fields[k].name, (unsigned long long)a, (unsigned long long)b);
        return STK_EINVAL;
    }
    return STK_OK;
}

int stk_loader_set_state(stk_loader *l, const stk_state *st)
{
    int rc = stk__check_handle(l);
    if (rc)
        return rc;
    if (!st)
        return STK_EINVAL;
    if (st->struct_size < STATE_V1) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "stk_state.struct_size is %zu; set it to sizeof(stk_state) (at least %zu)",
                 st->struct_size, (size_t)STATE_V1);
        return STK_EINVAL;
    }
    core *c = l->c;
    pthread_mutex_lock(&c->lock);
    stk_state own = own_state(c);
    pthread_mutex_unlock(&c->lock);
    if ((rc = check_fingerprint(l, st, &own)))
        return rc;
    if (st->epoch > UINT64_MAX / (c->sched.part.batches + 1) - 1) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "state epoch %llu is too large",
                 (unsigned long long)st->epoch);
        return STK_EINVAL;
    }
    /* The worlds of the saved epoch: its history, then its current world
     * (fields of later versions only when struct_size covers them). */
    size_t end = offsetof(stk_state, history);
    uint32_t nhist = 0, saved_local = st->world_size;
    if (st->struct_size >= offsetof(stk_state, local_world_size) + sizeof(uint32_t) &&
        st->local_world_size)
        saved_local = st->local_world_size;
    if (st->struct_size >= offsetof(stk_state, history_len) + sizeof(uint32_t))
        nhist = st->history_len;
    if (nhist > STK_STATE_HISTORY ||
        (nhist && st->struct_size < end + nhist * sizeof(stk_state_generation))) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "state history of %u worlds: at most %d fit in stk_state (struct_size %zu)", nhist,
                 STK_STATE_HISTORY, st->struct_size);
        return STK_EINVAL;
    }
    bool same = st->world_size == c->sched.part.world && saved_local == c->sched.part.local &&
                st->batch_size == c->batch_size;
    if (same && nhist == 0) {
        /* The same world: the plain position. */
        if (st->batch > c->sched.part.batches) {
            stk__fmt(l->errmsg, sizeof l->errmsg,
                     "state batch %llu is past this loader's %llu batches per epoch",
                     (unsigned long long)st->batch, (unsigned long long)c->sched.part.batches);
            return STK_EINVAL;
        }
        stk__seek_to(c, st->epoch, st->batch, NULL, true);
        return STK_OK;
    }
    stk__gen_spec gens[STK_STATE_HISTORY + 2];
    size_t ng = 0;
    for (uint32_t i = 0; i < nhist; i++)
        gens[ng++] = (stk__gen_spec){st->history[i].world_size, st->history[i].local_world_size,
                                     st->history[i].batch_size, st->history[i].batches};
    uint64_t steps = 0;
    if (same) {
        steps = st->batch; /* the saved world continues */
    } else {
        gens[ng++] = (stk__gen_spec){st->world_size, saved_local, st->batch_size, st->batch};
    }
    gens[ng++] = (stk__gen_spec){c->sched.part.world, c->sched.part.local, c->batch_size, 0};
    stk__resumed *r = stk__calloc(1, sizeof *r);
    if (!r)
        return STK_ENOMEM;
    char why[STK_ERRMSG_MAX];
    if ((rc = stk__layout_build(&r->lay, c->sched.part.n, gens, ng, c->sched.part.rank,
                                c->drop_last, why, sizeof why))) {
        stk__fmt(l->errmsg, sizeof l->errmsg, "cannot resume this state: %s", why);
        stk__free(r);
        return rc;
    }
    const stk__gen *last = &r->lay.gens[ng - 1];
    if (steps > last->batches || last->batches > c->sched.part.batches) {
        stk__fmt(l->errmsg, sizeof l->errmsg,
                 "state batch %llu is past the %llu batches left of the epoch",
                 (unsigned long long)steps, (unsigned long long)last->batches);
        stk__layout_free(&r->lay);
        stk__free(r);
        return STK_EINVAL;
    }
    if (last->batches == steps) {
        /* Nothing left of that epoch for this world: the next one. */
        stk__layout_free(&r->lay);
        stk__free(r);
        stk__seek_to(c, st->epoch + 1, 0, NULL, true);
        return STK_OK;
    }
    r->epoch = st->epoch;
    r->off = c->sched.part.batches - last->batches;
    stk__seek_to(c, st->epoch, r->off + steps, r, true);
    return STK_OK;
}

static uint64_t fnv1a(uint64_t h, const char *text)
{
    for (const char *p = text; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    return h;
}

/* The resume fingerprint of the transform: 64-bit FNV-1a of the spec text
 * and of the image options that change its output, written out as text so
 * the value is the same on every build and platform. No transform hashes as
 * "none". */
static uint64_t spec_hash(const stk_options *o, uint64_t h, const char *spec)
{
    if (!spec || !*spec || !strcmp(spec, "none"))
        return fnv1a(h, "none");
    char opts[128];
    /* strict changes which damaged samples fail, so which batches come. */
    stk__fmt(opts, sizeof opts, "|size=%d|layout=%s|dtype=%d|exif=%d|strict=%d", o->size,
             o->nchw ? "nchw" : "nhwc", o->dtype, o->exif, o->strict);
    return fnv1a(fnv1a(h, spec), opts);
}

uint64_t stk__transform_hash_spec(const stk_options *o, const char *spec)
{
    return spec_hash(o, 0xcbf29ce484222325ULL, spec);
}

/* With fields, each field's name, sources, kind, flags and transform too:
 * a resume under other fields would deliver other batches. Without fields
 * the value is what it always was, so saved states stay valid. */
uint64_t stk__transform_hash(const stk_options *o)
{
    uint64_t h = spec_hash(o, 0xcbf29ce484222325ULL, o->transform);
    for (size_t k = 0; k < o->nfields; k++) {
        const stk__fspec *f = &o->fields[k];
        char head[64];
        stk__fmt(head, sizeof head, "|field|%d|%u|", f->kind, f->flags);
        h = fnv1a(fnv1a(fnv1a(fnv1a(h, head), f->name), "="), f->sources);
        if (f->transform)
            h = spec_hash(o, fnv1a(h, "|t="), f->transform);
    }
    return h;
}
