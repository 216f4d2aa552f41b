/*
 * loader_mix.c -- a mixture of sources in the loader (docs/mixing.md): the
 * composite source and the schedule's quotas and tree at open, each
 * source's own order (the loader's or its own: stk_options_source_set) and
 * transforms (of any image field: stk_options_source_transform), and the
 * fingerprint a resume checks, which leaves the paths out so that a moved
 * dataset resumes. loader.c's open calls these in turn.
 */
#include "loader_core.h"

#include <string.h>

static uint64_t fnv1a_bytes(uint64_t h, const void *p, size_t n)
{
    for (size_t k = 0; k < n; k++)
        h = (h ^ ((const uint8_t *)p)[k]) * 0x100000001b3ULL;
    return h;
}

static uint64_t fnv1a_u64(uint64_t h, uint64_t v)
{
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)(v >> (8 * k));
    return fnv1a_bytes(h, le, sizeof le);
}

/* Source k's order: its own (stk_options_source_set), else the loader's. */
static int source_order(const stk_options *o, size_t k, unsigned *window, uint64_t *block_bytes)
{
    const stk__mix_spec *m = &o->mix[k];
    unsigned w = m->shard_window ? m->shard_window : o->shard_window;
    *window = w ? w : 8;
    *block_bytes = m->block_bytes ? m->block_bytes : o->block_bytes;
    return m->order >= 0 ? m->order : o->order;
}

/* A source's own cache 0 (stk_options_source_set): the fetch stage reads its
 * shards by range and never admits them to the disk cache (per-shard flags
 * in the mixture's table). Only a source read through the stage (a remote
 * .stk) can keep out of the cache: a remote tar, MDS, LitData or TFRecord is
 * read from whole files in it, a remote Parquet stores its row groups there
 * from its open on (its label chunks), and a local source never uses it. */
static int mixture_cache(core *c, const stk_options *o, char *err, size_t errlen)
{
    for (size_t k = 0; k < o->nmix; k++) {
        if (o->mix[k].cache != 0)
            continue;
        const stk__source *kid = stk__source_mix_child(&c->src, k);
        if (!stk__source_mix_fetched(&c->src, k)) {
            if (!kid->remote && !kid->cache)
                continue; /* local: read in place, never cached */
            stk__fmt(err, errlen,
                     "mixture source %zu (%s): cache 0 keeps a source read by ranged requests "
                     "(a .stk in a store) out of the disk cache; this one is read through the "
                     "cache (whole files; a Parquet's row groups, read uncached only when the "
                     "loader has no cache_dir) (docs/mixing.md)",
                     k, o->mix[k].shown);
            return STK_EINVAL;
        }
        if (!c->src.shard_nocache &&
            !(c->src.shard_nocache = stk__calloc(c->src.nshards, sizeof(bool)))) {
            stk__fmt(err, errlen, "out of memory for the mixture's cache flags");
            return STK_ENOMEM;
        }
        size_t first = stk__source_mix_shard_off(&c->src, k);
        for (size_t j = 0; j < kid->nshards; j++)
            c->src.shard_nocache[first + j] = true;
    }
    return STK_OK;
}

/* Order "shards" / "blocks" in a mixture, the loader's or a source's own:
 * each source with shards reads its k-th samples in its own shard-aware
 * order over its shards (blocks), so a remote source keeps its cache's
 * working set to a window of shards; a source without shards keeps its
 * global permutation under the loader's order, and is refused under its own
 * (docs/mixing.md). With blocks, the fetch stage also gets the sources'
 * blocks as one table in the mixture's ids (a source without blocks one
 * unit, never fetched as a block: its samples are local), so that a remote
 * source's block is fetched whole by one request, as for one dataset. The
 * units each source's order walks go into *h (the fingerprint). */
static int mixture_orders(core *c, const stk_options *o, uint64_t *h, char *err, size_t errlen)
{
    bool blocks_order = false;
    for (size_t k = 0; k < o->nmix; k++) {
        unsigned w;
        uint64_t bb;
        blocks_order |= source_order(o, k, &w, &bb) == STK__ORDER_BLOCKS &&
                        stk__source_mix_child(&c->src, k)->nshards;
    }
    uint64_t *flat = NULL, base = 0;
    size_t nflat = 0, cap = 0;
    int rc = STK_OK;
    for (size_t k = 0; k < o->nmix && rc == STK_OK; k++) {
        const stk__source *ch = stk__source_mix_child(&c->src, k);
        unsigned window;
        uint64_t block_bytes;
        int ord = source_order(o, k, &window, &block_bytes);
        uint64_t *blocks = NULL;
        size_t nblocks = 0;
        char why[STK_ERRMSG_MAX] = "";
        bool sharded = ch->nshards && ch->shard_first && ord != STK__ORDER_GLOBAL;
        if (ord != STK__ORDER_GLOBAL && !sharded && o->mix[k].order >= 0) {
            stk__fmt(why, sizeof why,
                     "needs a source of shards (.stk, tar, ...); this one (%s) "
                     "has none",
                     ch->ops->kind);
            rc = STK_EINVAL;
        }
        const stk__mix_spec *m = &o->mix[k];
        if ((m->shard_window && !sharded) ||
            (m->block_bytes && !(sharded && ord == STK__ORDER_BLOCKS))) {
            /* As any option that would change nothing: refused. */
            stk__fmt(why, sizeof why,
                     "its own %s applies to its samples read in order \"%s\" over its shards, "
                     "and it reads them in the %s order: give it its own order, or drop it",
                     m->block_bytes && !(sharded && ord == STK__ORDER_BLOCKS) ? "block_bytes"
                                                                              : "shard_window",
                     m->block_bytes && !(sharded && ord == STK__ORDER_BLOCKS)
                         ? "blocks"
                         : "shards\" or \"blocks",
                     sharded ? "shard-aware" : "global");
            rc = STK_EINVAL;
        }
        if (blocks_order && ord != STK__ORDER_BLOCKS && stk__source_mix_fetched(&c->src, k)) {
            /* The stage reads every fetched sample with its whole block. */
            stk__fmt(why, sizeof why,
                     "another source reads blocks, and this one is fetched "
                     "through the one fetch stage, which then reads blocks for all its sources: "
                     "give it order blocks too");
            rc = STK_EINVAL;
        }
        if (rc == STK_OK && sharded && ord == STK__ORDER_BLOCKS)
            rc = stk__blocks_make(ch, block_bytes, &blocks, &nblocks, why, sizeof why);
        if (rc == STK_OK && sharded) {
            const uint64_t *units = blocks ? blocks : ch->shard_first;
            size_t nunits = blocks ? nblocks : ch->nshards;
            rc = stk__mix_set_order(c->sched.mix, k, units, nunits, window);
            if (!blocks) /* the cache's eviction (blocks: the least recently used) */
                stk__mix_set_shards(c->sched.mix, k, ch->shard_first, ch->nshards, window,
                                    stk__source_mix_fetched(&c->src, k)
                                        ? stk__source_mix_shard_off(&c->src, k)
                                        : SIZE_MAX);
            if (rc)
                stk__fmt(why, sizeof why, "%s",
                         rc == STK_ENOMEM ? "out of memory for its shard-aware order"
                                          : "its shard table cannot order its samples");
            /* What decides the order: the kind, the window and the units'
             * bounds (the dataset's layout, not its path). */
            *h = fnv1a_u64(fnv1a_u64(fnv1a_u64(*h ^ 0x6f72646572ULL, k), (uint64_t)ord), window);
            for (size_t u = 0; u <= nunits; u++)
                *h = fnv1a_u64(*h, units[u]);
        }
        /* This source's units of the flat table: its blocks, else itself. */
        size_t units = blocks ? nblocks : 1;
        if (rc == STK_OK && blocks_order &&
            stk__grow((void **)&flat, &cap, nflat + units + 1, sizeof *flat)) {
            rc = STK_ENOMEM;
            stk__fmt(why, sizeof why, "out of memory for the table of its blocks");
        }
        if (rc == STK_OK && blocks_order) {
            for (size_t b = 0; b < units; b++)
                flat[nflat++] = base + (blocks ? blocks[b] : 0);
        }
        stk__free(blocks);
        base += ch->count;
        if (rc)
            stk__fmt(err, errlen, "mixture source %zu (%s): order \"%s\": %s", k, o->mix[k].shown,
                     ord == STK__ORDER_BLOCKS   ? "blocks"
                     : ord == STK__ORDER_SHARDS ? "shards"
                                                : "global",
                     why);
    }
    if (rc == STK_OK && flat) {
        flat[nflat] = base;
        c->sched.block_first = flat;
        c->sched.nblocks = nflat;
        flat = NULL;
    }
    stk__free(flat);
    return rc;
}

/* Any per-source setting the first version's fingerprint did not know. */
static bool has_source_options(const stk_options *o)
{
    for (size_t k = 0; k < o->nmix; k++)
        if (o->mix[k].ntfs || o->mix[k].order >= 0 || o->mix[k].shard_window ||
            o->mix[k].block_bytes)
            return true;
    return false;
}

/* The fingerprints a resume checks (docs/mixing.md): what decides which
 * sample each position reads, as text so it is the same on every build.
 * c->mix_hash leaves the paths out (a moved dataset resumes; its identity
 * is its size, and under a shard-aware order its shards, hashed by
 * mixture_orders into *h already); mix_hash_v1 is the first version's,
 * with the paths, which states saved by it hold. */
static void mixture_fingerprint(core *c, const stk_options *o, const double *w,
                                const uint64_t *fixed, const uint64_t *sizes, const uint64_t *quota,
                                uint64_t B, uint64_t h)
{
    uint64_t v1 = 0xcbf29ce484222325ULL;
    for (size_t k = 0; k < o->nmix; k++) {
        char line[96];
        stk__fmt(line, sizeof line, "|%.17g|%llu|%llu|%llu|%llu|", w[k],
                 (unsigned long long)fixed[k], (unsigned long long)sizes[k],
                 (unsigned long long)quota[k], (unsigned long long)B);
        v1 = fnv1a_bytes(v1, o->mix[k].path, strlen(o->mix[k].path));
        v1 = fnv1a_bytes(v1, line, strlen(line));
        h = fnv1a_bytes(h, line, strlen(line));
        if (o->mix[k].transform) { /* with the image options, as the loader's */
            uint64_t t = stk__transform_hash_spec(o, o->mix[k].transform);
            v1 = fnv1a_bytes(v1 ^ t, "|t", 2);
            h = fnv1a_bytes(h ^ t, "|t", 2);
        }
        /* By field name: the stored order depends on the order the fields
         * were set and removed in (a removal moves the last into its
         * place), which decides nothing. O(n^2) over a few fields, no
         * allocation; names are unique. */
        const char *prev = NULL;
        for (size_t n = 0; n < o->mix[k].ntfs; n++) {
            const stk__mix_tf *tf = &o->mix[k].tfs[0];
            bool found = false;
            for (size_t f = 0; f < o->mix[k].ntfs; f++) {
                const stk__mix_tf *x = &o->mix[k].tfs[f];
                if ((!prev || strcmp(x->field, prev) > 0) &&
                    (!found || strcmp(x->field, tf->field) < 0)) {
                    tf = x;
                    found = true;
                }
            }
            h = fnv1a_bytes(h ^ stk__transform_hash_spec(o, tf->spec), "|t:", 3);
            h = fnv1a_bytes(h, tf->field, strlen(tf->field) + 1);
            prev = tf->field;
        }
    }
    if (o->order != STK__ORDER_GLOBAL) {
        /* The per-source orders decide the samples too (global hashes as
         * before, so earlier states still resume). */
        char line[96];
        stk__fmt(line, sizeof line, "|order %s|%u|%llu|",
                 o->order == STK__ORDER_BLOCKS ? "blocks" : "shards",
                 o->shard_window ? o->shard_window : 8,
                 (unsigned long long)(o->order == STK__ORDER_BLOCKS ? o->block_bytes : 0));
        v1 = fnv1a_bytes(v1, line, strlen(line));
    }
    c->mix_hash = h ? h : 1;
    c->mix_hash_v1 = has_source_options(o) ? 0 : v1 ? v1 : 1;
}

/* The mixture (docs/mixing.md): the composite source over o's sources, the
 * schedule's quotas and tree, the fingerprint a resume checks, and the
 * per-source counters. */
int stk__open_mixture(core *c, const stk_options *o, const stk__source_params *sp, char *err,
                      size_t errlen)
{
    int rc = STK_ENOMEM;
    size_t n = o->nmix;
    const char **paths = stk__calloc(n, sizeof *paths), **shown = stk__calloc(n, sizeof *shown);
    double *w = stk__calloc(n, sizeof *w);
    uint64_t *fixed = stk__calloc(n, sizeof *fixed), *sizes = stk__calloc(n, sizeof *sizes),
             *quota = stk__calloc(n, sizeof *quota);
    if (!paths || !shown || !w || !fixed || !sizes || !quota)
        goto out;
    for (size_t k = 0; k < n; k++) {
        paths[k] = o->mix[k].path;
        shown[k] = o->mix[k].shown;
        w[k] = o->mix[k].weight;
        fixed[k] = o->mix[k].samples;
    }
    if ((rc = stk__source_mix_open(&c->src, paths, shown, n, sp, err, errlen)))
        goto out;
    stk__source_mix_sizes(&c->src, sizes, n);
    uint64_t N = o->samples_per_epoch;
    /* per_source: the schedule's unit is a batch: quotas in batches. */
    uint64_t B = o->mix_batching == 1 ? o->batch_size : 1;
    if (B > 1) {
        if (!N) {
            for (size_t k = 0; k < n; k++)
                N += fixed[k] ? fixed[k] : sizes[k];
        }
        bool ok = N % B == 0;
        for (size_t k = 0; k < n; k++) {
            ok &= fixed[k] % B == 0;
            fixed[k] /= B;
        }
        if (!ok) {
            stk__fmt(err, errlen,
                     "mix_batching \"per_source\" takes whole batches from each source: "
                     "samples_per_epoch (%llu) and every source's fixed samples must be "
                     "multiples of the batch size %llu",
                     (unsigned long long)N, (unsigned long long)B);
            rc = STK_EINVAL;
            goto out;
        }
        N /= B;
    }
    if ((rc = stk__mix_quotas(w, fixed, sizes, n, &N, quota, err, errlen)))
        goto out;
    rc = STK_ENOMEM;
    if (!(c->sched.mix = stk__calloc(1, sizeof *c->sched.mix)) ||
        !(c->src_samples = stk__calloc(n, sizeof *c->src_samples)) ||
        !(c->src_failed = stk__calloc(n, sizeof *c->src_failed)))
        goto out;
    if ((rc = stk__mix_init(c->sched.mix, quota, sizes, n, o->seed, o->shuffle)))
        goto out;
    c->sched.mix->block = B;
    c->sched.mix->N *= B;
    /* The new fingerprint starts apart from the first version's. */
    uint64_t h = fnv1a_bytes(0xcbf29ce484222325ULL, "mix2", 4);
    if ((rc = mixture_orders(c, o, &h, err, errlen)) || (rc = mixture_cache(c, o, err, errlen)))
        goto out;
    c->nsrc = n;
    c->mix_new = o->mix_resume == 1;
    mixture_fingerprint(c, o, w, fixed, sizes, quota, B, h);
    rc = STK_OK;
out:
    stk__free(paths);
    stk__free(shown);
    stk__free(w);
    stk__free(fixed);
    stk__free(sizes);
    stk__free(quota);
    return rc;
}

/* Source k's pipeline for spec, of the kind the loader's field gives:
 * dense of that shape, dtype and size, or variable (dense false). */
static int source_pipe(core *c, const stk_options *o, size_t k, const char *field, const char *spec,
                       const stk__fplan *like, stk__imgpipe **out, char *err, size_t errlen)
{
    char why[STK_ERRMSG_MAX];
    int rc = stk__imgpipe_from_options(out, spec, o, why, sizeof why);
    if (rc) {
        stk__fmt(err, errlen, "mixture source %zu (%s): transform of %s%s%s: %s", k,
                 o->mix[k].shown, field ? "field '" : "the first image", field ? field : "",
                 field ? "'" : "", why);
        return rc;
    }
    stk__imgpipe *p = *out;
    if (c->src.raw_c)
        stk__imgpipe_set_raw(p, c->src.raw_h, c->src.raw_w, c->src.raw_c, c->src.raw_chw);
    unsigned ndim = 0;
    int64_t shape[4] = {0, 0, 0, 0};
    int dtype = 0;
    size_t sb = 0;
    bool dense = stk__imgpipe_dense(p, &ndim, shape, &dtype, &sb);
    bool want = like ? like->layout == STK_BATCH_DENSE : c->kind == STK_BATCH_DENSE;
    bool same = want ? dense && ndim == (like ? like->ndim : c->ndim) &&
                           dtype == (like ? like->dtype : c->dtype) &&
                           sb == (like ? like->sample_bytes : c->sample_bytes) &&
                           !memcmp(shape, like ? like->shape : c->shape, ndim * sizeof *shape)
                     : !dense;
    if (!same) {
        stk__fmt(err, errlen,
                 "mixture source %zu (%s): its transform of %s%s%s gives %s than the loader's: "
                 "a batch holds one kind of sample a field, so give it the same output size "
                 "and dtype (or both variable sizes)",
                 k, o->mix[k].shown, field ? "field '" : "the first image", field ? field : "",
                 field ? "'" : "",
                 dense ? "samples of another shape or dtype" : "samples of varying size");
        return STK_EINVAL;
    }
    return STK_OK;
}

/* The plan's image field named `name` (SIZE_MAX: none), for a source's
 * named transform; why says what the loader's image fields are. */
static size_t image_field(const core *c, const char *name, char *why, size_t n)
{
    size_t used = 0;
    why[0] = '\0';
    for (size_t f = 0; f < c->nfplan; f++) {
        if (c->fplan[f].kind != STK_FIELD_IMAGE)
            continue;
        if (!strcmp(c->fplan[f].spec->name, name))
            return f;
        stk__fmt(why + used, n - used, "%s'%s'", used ? ", " : "", c->fplan[f].spec->name);
        used += strlen(why + used);
    }
    return SIZE_MAX;
}

/* Source k's named transforms of further image fields into src_fpipes; the
 * first image's name gives its primary spec (*primary). */
static int source_field_pipes(core *c, const stk_options *o, size_t k, const char **primary,
                              char *err, size_t errlen)
{
    const stk__mix_spec *m = &o->mix[k];
    for (size_t t = 0; t < m->ntfs; t++) {
        const char *name = m->tfs[t].field;
        char names[256];
        size_t f = image_field(c, name, names, sizeof names);
        if (f == SIZE_MAX) {
            stk__fmt(err, errlen,
                     "mixture source %zu (%s): a transform of field '%s', which is no image "
                     "field of the loader (its image fields: %s)",
                     k, m->shown, name, names[0] ? names : "none; set fields");
            return STK_EINVAL;
        }
        if ((int)f == c->primary) {
            if (m->transform) {
                stk__fmt(err, errlen,
                         "mixture source %zu (%s): two transforms of the first image field "
                         "'%s' (one by its name, one without): give one",
                         k, m->shown, name);
                return STK_EINVAL;
            }
            *primary = m->tfs[t].spec;
            continue;
        }
        if (!c->fplan[f].pipe) {
            stk__fmt(err, errlen,
                     "mixture source %zu (%s) has its own transform of field '%s', but the "
                     "loader has none for it: give the loader's field a transform too (the "
                     "sources without their own use it), so every sample of the field is an "
                     "image",
                     k, m->shown, name);
            return STK_EINVAL;
        }
        if (!c->src_fpipes &&
            !(c->src_fpipes = stk__calloc(o->nmix * c->nfplan, sizeof *c->src_fpipes)))
            return STK_ENOMEM;
        int rc = source_pipe(c, o, k, name, m->tfs[t].spec, &c->fplan[f],
                             &c->src_fpipes[k * c->nfplan + f], err, errlen);
        if (rc)
            return rc;
    }
    return STK_OK;
}

/* Per-source transforms: a pipeline each of each field a source names,
 * giving batches of the loader's kind (the same dense shape and dtype), so
 * one batch holds them all. */
int stk__setup_source_pipes(core *c, const stk_options *o, char *err, size_t errlen)
{
    bool any = false;
    for (size_t k = 0; k < o->nmix; k++)
        any |= o->mix[k].transform || o->mix[k].ntfs;
    if (!any)
        return STK_OK;
    if (o->device != STK_DEVICE_CPU) {
        stk__fmt(err, errlen,
                 "per-source transforms are delivered in host memory in this "
                 "version; drop the device option (docs/mixing.md)");
        return STK_EUNSUPPORTED;
    }
    for (size_t k = 0; k < o->nmix; k++) {
        const char *spec = o->mix[k].transform;
        int rc = source_field_pipes(c, o, k, &spec, err, errlen);
        if (rc)
            return rc;
        if (!spec)
            continue;
        if (!c->pipe) {
            stk__fmt(err, errlen,
                     "mixture source %zu (%s) has its own transform, but the loader has none: "
                     "set the loader's transform too (the sources without their own use it), "
                     "so every sample of a batch is an image",
                     k, o->mix[k].shown);
            return STK_EINVAL;
        }
        if (!c->src_pipes && !(c->src_pipes = stk__calloc(o->nmix, sizeof *c->src_pipes)))
            return STK_ENOMEM;
        if ((rc = source_pipe(c, o, k, NULL, spec, NULL, &c->src_pipes[k], err, errlen)))
            return rc;
    }
    return STK_OK;
}

/* Every source of a mixture must give each requested field that is not
 * optional (an alternative of it). */
int stk__check_mixture_fields(core *c, char *err, size_t errlen)
{
    if (!c->sched.mix)
        return STK_OK;
    for (size_t k = 0; k < c->nfplan; k++) {
        const stk__fplan *p = &c->fplan[k];
        if (p->spec->flags & STK_FIELD_OPTIONAL)
            continue;
        int rc = stk__source_mix_check_field(&c->src, p->spec->name, p->alt, p->nalt, err, errlen);
        if (rc)
            return rc;
    }
    return STK_OK;
}
