/*
 * bucket.c -- unpacked objects in a bucket: an ImageFolder layout under
 * s3://bucket/prefix/ (prefix/CLASS/NAME.jpg), listed once at open
 * (ListObjectsV2 with continuation, every object below the prefix), each
 * object one sample whose class is its first path component. Each object is
 * a one-sample "shard" of the fetch stage: the samples travel as many small
 * GETs in flight (or whole into the disk cache with cache_dir), with the
 * same order, exactly-once and resume guarantees as packed shards. It is
 * slower than packed shards (a request per sample): `stoker pack` converts
 * it once.
 */
#include "io/remote.h"
#include "source/source.h"

#include <stdlib.h>
#include <string.h>

typedef struct bucket {
    int32_t *label;     /* per sample */
    char **class_names; /* sorted */
    size_t nclasses;
} bucket;

/* An object that is a sample: CLASS/NAME with an image extension, one level
 * deep (deeper objects and files beside the classes are not samples, as in
 * a local ImageFolder). */
static bool sample_name(const char *name)
{
    const char *slash = strchr(name, '/');
    if (!slash || slash == name || strchr(slash + 1, '/') || !slash[1])
        return false;
    const char *dot = strrchr(slash + 1, '.');
    return dot && dot[1] && stk_field_kind_for_name(dot + 1) == STK_FIELD_IMAGE;
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int bk_accept(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                     int64_t *label, char *err, size_t errlen)
{
    const bucket *b = s->impl;
    (void)bytes;
    if (len != s->shard_bytes[i]) {
        stk__fmt(err, errlen, "got %zu bytes, the listing says %llu (was it replaced?)", len,
                 (unsigned long long)s->shard_bytes[i]);
        return STK_EFORMAT;
    }
    *label = b->label[i];
    return STK_OK;
}

/* Without the fetch stage (the dataset API, verify): one blocking GET. */
static int bk_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                   int64_t *label, char *err, size_t errlen)
{
    uint64_t n = s->shard_bytes[i];
    int rc = STK_OK;
    uint8_t *buf = stk__sink_reserve(sink, n ? (size_t)n : 1, &rc);
    if (!buf) {
        stk__fmt(err, errlen, "object of %llu bytes: %s", (unsigned long long)n,
                 rc == STK_ETOOBIG ? "over the sample budget" : "out of memory");
        return rc;
    }
    stk__req q;
    memset(&q, 0, sizeof q);
    q.name = s->shard_objs[i];
    q.len = n;
    q.buf = buf;
    q.fd = -1;
    if (n) {
        stk__remote_submit(s->remote, &q);
        if ((rc = stk__remote_wait(s->remote, &q))) {
            stk__fmt(err, errlen, "%s", q.err);
            return rc == STK_ENOENT ? STK_EIO : rc;
        }
    }
    /* A ranged GET of the listed size answers that many bytes of a grown
     * object: its Content-Range total tells (as the fetch stage checks). */
    if ((rc = bk_accept(s, i, buf, (size_t)(q.total ? q.total : q.got), label, err, errlen)))
        return rc;
    *data = buf;
    *len = (size_t)n;
    return STK_OK;
}

static void bk_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    stk__remote_object_display(s->remote, s->shard_objs[i], buf, n);
}

static void bk_key(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    stk__fmt(buf, n, "%s", s->shard_objs[i]);
}

static const char *bk_class_name(const stk__source *s, uint64_t c)
{
    const bucket *b = s->impl;
    return c < b->nclasses ? b->class_names[c] : NULL;
}

static void bk_free(bucket *b)
{
    if (!b)
        return;
    for (size_t k = 0; k < b->nclasses; k++)
        stk__free(b->class_names[k]);
    stk__free(b->class_names);
    stk__free(b->label);
    stk__free(b);
}

static void bk_close(stk__source *s)
{
    bk_free(s->impl);
    s->impl = NULL;
}

static void bk_locate(const stk__source *s, uint64_t i, size_t *shard, uint64_t *off, uint64_t *len)
{
    *shard = (size_t)i;
    *off = 0;
    *len = s->shard_bytes[i];
}

static void bk_describe(const stk__source *s, stk__dataset_info *di)
{
    di->shards = s->nshards;
    for (size_t k = 0; k < s->nshards; k++)
        di->bytes += s->shard_bytes[k];
    di->images = 1;
}

static const stk__source_ops k_bucket_ops = {.kind = "bucket",
                                             .read = bk_read,
                                             .name = bk_name,
                                             .close = bk_close,
                                             .locate = bk_locate,
                                             .accept = bk_accept,
                                             .flags = STK__SRC_IMAGES,
                                             .describe = bk_describe,
                                             .key = bk_key,
                                             .class_name = bk_class_name};

int stk__bucket_samples(char *const *names, size_t n)
{
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        m += sample_name(names[k]);
    return m > 0 && m * 2 >= n; /* mostly CLASS/NAME images */
}

int stk__source_bucket_open(stk__source *s, stk__remote *r, char *const *names,
                            const uint64_t *sizes, size_t n, char *err, size_t errlen)
{
    int rc = STK_OK;
    size_t m = 0;
    bucket *b = NULL;
    const char **sorted = NULL;
    memset(s, 0, sizeof *s);
    s->remote = r; /* the source's now: freed with it, also on failure */
    for (size_t k = 0; k < n; k++)
        m += sample_name(names[k]);
    if (!m) {
        stk__fmt(err, errlen, "%s: holds no CLASS/NAME image objects", stk__remote_display(r));
        rc = STK_EEMPTY;
        goto out;
    }
    if (!(b = stk__calloc(1, sizeof *b)) || !(b->label = stk__calloc(m, sizeof *b->label)) ||
        !(b->class_names = stk__calloc(m, sizeof *b->class_names)) ||
        !(sorted = stk__calloc(m, sizeof *sorted)) ||
        !(s->shard_first = stk__calloc(m + 1, sizeof *s->shard_first)) ||
        !(s->shard_objs = stk__calloc(m, sizeof *s->shard_objs)) ||
        !(s->shard_bytes = stk__calloc(m, sizeof *s->shard_bytes))) {
        rc = STK_ENOMEM;
        goto out;
    }
    s->nshards_objs_ = m;
    m = 0;
    for (size_t k = 0; k < n; k++)
        if (sample_name(names[k]))
            sorted[m++] = names[k];
    /* Sorted by name, as a local folder's files are: samples of a class
     * together, classes in order. */
    qsort(sorted, m, sizeof *sorted, cmp_cstr);
    for (size_t k = 0; k < m && !rc; k++) {
        size_t cl = (size_t)(strchr(sorted[k], '/') - sorted[k]);
        bool same = b->nclasses && !strncmp(b->class_names[b->nclasses - 1], sorted[k], cl) &&
                    !b->class_names[b->nclasses - 1][cl];
        if (!same) {
            if (!(b->class_names[b->nclasses] = stk__malloc(cl + 1))) {
                rc = STK_ENOMEM;
                break;
            }
            memcpy(b->class_names[b->nclasses], sorted[k], cl);
            b->class_names[b->nclasses++][cl] = '\0';
        }
        b->label[k] = (int32_t)(b->nclasses - 1);
        if (!(s->shard_objs[k] = stk__strdup(sorted[k])))
            rc = STK_ENOMEM;
        s->shard_first[k] = k;
    }
    /* Sizes follow the names they were listed with. */
    for (size_t k = 0; k < n && !rc; k++) {
        if (!sample_name(names[k]))
            continue;
        const char **at = bsearch(&names[k], sorted, m, sizeof *sorted, cmp_cstr);
        if (at) {
            size_t j = (size_t)(at - sorted);
            s->shard_bytes[j] = sizes[k];
            if (sizes[k] > s->max_len)
                s->max_len = sizes[k];
        }
    }
    if (rc)
        goto out;
    s->shard_first[m] = m;
    s->nshards = m;
    s->count = m;
    s->num_classes = b->nclasses;
    s->index_bytes = m * (sizeof *b->label + sizeof *s->shard_first + sizeof *s->shard_objs +
                          sizeof *s->shard_bytes + 32);
    s->ops = &k_bucket_ops;
    s->impl = b;
    b = NULL;
out:
    stk__free(sorted);
    if (rc) {
        bk_free(b);
        stk__source_free_common(s); /* closes r */
    }
    return rc;
}
