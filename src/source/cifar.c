/*
 * cifar.c -- CIFAR-10 and CIFAR-100 binary batches, read in place.
 *
 * CIFAR-10 (data_batch_1..5.bin, test_batch.bin): records of 3073 bytes, a
 * label byte (0..9) then 3072 image bytes. CIFAR-100 (train.bin, test.bin):
 * records of 3074 bytes, a coarse label byte (0..19), a fine label byte
 * (0..99), then 3072 image bytes. The image is 32x32 RGB stored planar, CHW:
 * 1024 red bytes (row-major), 1024 green, 1024 blue. Samples are those 3072
 * bytes exactly as stored (dense batches of shape [3072]); the label is the
 * (fine) label. `stoker pack --raw 32x32x3` converts them to HWC.
 *
 * Which layout a file has is decided by its size: 3073 divides every CIFAR-10
 * batch and 3074 every CIFAR-100 file, never both for the official files.
 * A label outside the dataset's class range is reported at read time.
 */
#include "source/stkformat.h"
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define CIFAR_IMAGE 3072

typedef struct cfile {
    char *path;
    int fd;
    uint64_t first, count, bytes;
} cfile;

typedef struct cifar {
    cfile *files;
    size_t n;
    unsigned label_bytes; /* 1 (CIFAR-10) or 2 (CIFAR-100) */
    uint64_t total_bytes;
} cifar;

static const cfile *find_file(const cifar *c, uint64_t i)
{
    size_t lo = 0, hi = c->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->files[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return &c->files[lo];
}

static int cifar_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                      int64_t *label, char *err, size_t errlen)
{
    const cifar *c = s->impl;
    const cfile *f = find_file(c, i);
    uint64_t j = i - f->first;
    uint64_t rec = CIFAR_IMAGE + c->label_bytes;
    uint8_t lab[2];
    int rc;
    uint8_t *buf = stk__sink_take(sink, CIFAR_IMAGE, "CIFAR image", &rc, err, errlen);
    if (!buf)
        return rc;
    if ((rc = stk__pread_full(f->fd, lab, c->label_bytes, j * rec, err, errlen)) ||
        (rc = stk__pread_full(f->fd, buf, CIFAR_IMAGE, j * rec + c->label_bytes, err, errlen)))
        return rc;
    unsigned l = lab[c->label_bytes - 1];
    unsigned classes = c->label_bytes == 1 ? 10 : 100;
    if (l >= classes) {
        stk__fmt(err, errlen, "label %u is outside CIFAR-%u's 0..%u", l, classes, classes - 1);
        return STK_EFORMAT;
    }
    *data = buf;
    *len = CIFAR_IMAGE;
    *label = l;
    return STK_OK;
}

static void cifar_key(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const cifar *c = s->impl;
    const cfile *f = find_file(c, i);
    const char *b = strrchr(f->path, '/');
    stk__fmt(buf, n, "%s#%llu", b ? b + 1 : f->path, (unsigned long long)(i - f->first));
}

static void cifar_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const cifar *c = s->impl;
    const cfile *f = find_file(c, i);
    stk__fmt(buf, n, "%s#%llu", f->path, (unsigned long long)(i - f->first));
}

static void cifar_describe(const stk__source *s, stk__dataset_info *di)
{
    const cifar *c = s->impl;
    di->format = c->label_bytes == 1 ? "cifar10" : "cifar100";
    di->payload = "raw CHW 3x32x32";
    di->shards = c->n;
    di->bytes = c->total_bytes;
    di->raw_h = 32;
    di->raw_w = 32;
    di->raw_c = 3;
}

static void cifar_close(stk__source *s)
{
    cifar *c = s->impl;
    if (!c)
        return;
    for (size_t k = 0; k < c->n; k++) {
        if (c->files[k].fd >= 0)
            stk__close(c->files[k].fd);
        stk__free(c->files[k].path);
    }
    stk__free(c->files);
    stk__free(c);
    s->impl = NULL;
}

static const stk__source_ops k_cifar_ops = {.kind = "cifar",
                                            .read = cifar_read,
                                            .name = cifar_name,
                                            .close = cifar_close,
                                            .flags = STK__SRC_IMAGES,
                                            .describe = cifar_describe,
                                            .key = cifar_key};

int stk__source_cifar_open(stk__source *s, const char *const *paths, size_t n, char *err,
                           size_t errlen)
{
    int rc = STK_OK;
    cifar *c = NULL;
    memset(s, 0, sizeof *s);
    if (!n) {
        stk__fmt(err, errlen, "no CIFAR batch files");
        return STK_EEMPTY;
    }
    if (!(c = stk__calloc(1, sizeof *c)) || !(c->files = stk__calloc(n, sizeof *c->files))) {
        rc = STK_ENOMEM;
        goto out;
    }
    uint64_t total = 0;
    for (size_t k = 0; k < n; k++) {
        cfile *f = &c->files[k];
        f->fd = -1;
        c->n = k + 1;
        if (!(f->path = stk__strdup(paths[k]))) {
            rc = STK_ENOMEM;
            goto out;
        }
        f->fd = stk__open(f->path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (f->fd < 0 || stk__fstat(f->fd, &st) != 0) {
            int e = errno;
            stk__fmt(err, errlen, "%s: %s", f->path, strerror(e));
            rc = e == ENOENT ? STK_ENOENT : STK_EIO;
            goto out;
        }
        f->bytes = (uint64_t)st.st_size;
        unsigned lb = f->bytes % 3073 == 0 ? 1 : f->bytes % 3074 == 0 ? 2 : 0;
        if (!lb || !f->bytes) {
            stk__fmt(err, errlen,
                     "%s: %llu bytes is not a whole number of CIFAR-10 (3073-byte) or "
                     "CIFAR-100 (3074-byte) records (truncated?)",
                     f->path, (unsigned long long)f->bytes);
            rc = STK_EFORMAT;
            goto out;
        }
        if (k && lb != c->label_bytes) {
            stk__fmt(err, errlen, "%s: a CIFAR-%s file among CIFAR-%s files", f->path,
                     lb == 1 ? "10" : "100", lb == 1 ? "100" : "10");
            rc = STK_EFORMAT;
            goto out;
        }
        c->label_bytes = lb;
        f->count = f->bytes / (CIFAR_IMAGE + lb);
        f->first = total;
        total += f->count;
        c->total_bytes += f->bytes;
    }
    s->ops = &k_cifar_ops;
    s->impl = c;
    s->count = total;
    s->num_classes = c->label_bytes == 1 ? 10 : 100;
    s->fixed_len = CIFAR_IMAGE;
    s->raw_h = s->raw_w = 32;
    s->raw_c = 3;
    s->raw_chw = 1;
    s->index_bytes = sizeof *c + n * sizeof *c->files;
    c = NULL;
out:
    if (c) {
        stk__source tmp = {.impl = c};
        cifar_close(&tmp);
    }
    return rc;
}
