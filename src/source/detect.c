/*
 * detect.c -- what a dataset path names: picks the source kind from what is
 * there (a directory, a shard or batch file, a record file, a brace pattern,
 * a URL) and opens that reader; and describes an open source for `stoker
 * info` and packing. This is the top of src/source/: it calls the readers,
 * and no reader calls back into it (the module map is in source.h).
 */
#include "source/dataset.h"
#include "io/remote.h"
#include "cache/cache.h"
#include "source/manifest.h"
#include "source/stkformat.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
/* ---- Naming a dataset ----------------------------------------------------
 * A PATH is a directory (of .stk shards, .tar shards, CIFAR batches, TFRecord
 * or Parquet files, an MDS or LitData index.json with its shards, or
 * ImageFolder class subfolders), a single shard, batch or Parquet file, a file of
 * fixed-size records (when a record size is given), or a brace pattern
 * "train-{000000..000099}.tar" naming a list of shard files. The kind comes
 * from the contents (magic bytes, tar header checksums, CIFAR names and
 * sizes); a directory or list mixing kinds is an error that says so. */

/* Readers of whole files, local or remote alike: a remote dataset's files
 * are downloaded whole into the disk cache and read by the same reader
 * (remote_files.c). A new reader of whole files is one row here: the names
 * of its files, what they are called in messages, and its open. */
static int tar_open_files(stk__source *s, const char *const *paths, const char *const *shown,
                          size_t n, char *err, size_t errlen)
{
    (void)shown; /* the tar reader names the files it reads */
    return stk__source_tar_open(s, paths, n, err, errlen);
}

typedef struct file_kind {
    const char *suffixes[4];
    const char *what;
    stk__files_open_fn open;
} file_kind;

static const file_kind k_file_kinds[] = {
    {{".tar"}, ".tar shards", tar_open_files},
    {{".tfrecord", ".tfrecord.gz", ".tfrecords", ".tfrecords.gz"},
     "TFRecord files",
     stk__source_tfrecord_open},
    {{".parquet"}, "Parquet files", stk__source_parquet_open},
};

enum { K_NONE, K_STK, K_CIFAR, K_FOLDER, K_FILES /* + a row of k_file_kinds */ };
#define K_TAR     (K_FILES + 0)
#define K_TFREC   (K_FILES + 1)
#define K_PARQUET (K_FILES + 2)
#define K_COUNT   (K_FILES + (int)(sizeof k_file_kinds / sizeof k_file_kinds[0]))

static const char *kind_name(int k)
{
    static const char *const names[K_FILES] = {"unknown", ".stk shards", "CIFAR batches",
                                               "class subfolders"};
    return k >= K_FILES ? k_file_kinds[k - K_FILES].what : names[k];
}

/* The k_file_kinds row a file name belongs to (K_FILES + row), else K_NONE:
 * these files go by name (TFRecord's framing has no magic). */
static int file_kind_of(const char *name)
{
    size_t n = strlen(name);
    for (int k = 0; k < K_COUNT - K_FILES; k++)
        for (size_t j = 0; j < 4 && k_file_kinds[k].suffixes[j]; j++) {
            const char *suf = k_file_kinds[k].suffixes[j];
            if (n > strlen(suf) && !strcmp(name + n - strlen(suf), suf))
                return K_FILES + k;
        }
    return K_NONE;
}

typedef struct pathlist {
    char **v;
    size_t n, cap;
} pathlist;

static int pl_add(pathlist *l, const char *a, const char *b)
{
    int rc = stk__grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
    if (rc)
        return rc;
    size_t la = strlen(a), lb = b ? strlen(b) : 0;
    char *p = stk__malloc(la + lb + 2);
    if (!p)
        return STK_ENOMEM;
    memcpy(p, a, la);
    if (b) {
        p[la] = '/';
        memcpy(p + la + 1, b, lb + 1);
    } else {
        p[la] = '\0';
    }
    l->v[l->n++] = p;
    return STK_OK;
}

static void pl_free(pathlist *l)
{
    for (size_t k = 0; k < l->n; k++)
        stk__free(l->v[k]);
    stk__free(l->v);
    memset(l, 0, sizeof *l);
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* CIFAR batch names: CIFAR-10's data_batch_N.bin / test_batch.bin, CIFAR-100's
 * train.bin / test.bin. */
static bool cifar_name(const char *name, bool *train)
{
    *train = !strncmp(name, "data_batch_", 11) || !strcmp(name, "train.bin");
    return (*train && ends_with(name, ".bin")) || !strcmp(name, "test_batch.bin") ||
           !strcmp(name, "test.bin");
}

/* A 512-byte block is a tar header if its checksum field matches. */
static bool tar_header_ok(const uint8_t *b)
{
    unsigned long sum = 0, want = 0;
    for (int k = 0; k < 512; k++)
        sum += (k >= 148 && k < 156) ? ' ' : b[k];
    int k = 148;
    while (k < 156 && b[k] == ' ')
        k++;
    int digits = 0;
    for (; k < 156 && b[k] >= '0' && b[k] <= '7'; k++, digits++)
        want = want * 8 + (unsigned long)(b[k] - '0');
    return digits > 0 && sum == want;
}

/* Decides one file's kind from its first bytes, name and size. */
static int sniff_file(const char *path, int *kind, char *err, size_t errlen)
{
    uint8_t b[512];
    *kind = K_NONE;
    /* O_NONBLOCK: opening a FIFO must not block the open of a dataset. */
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        stk__fmt(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? STK_ENOENT : STK_EIO;
    }
    struct stat st;
    ssize_t got = 0;
    int fail = stk__fstat(fd, &st) != 0 ? errno : 0;
    /* A short read is not the end of the file: read the whole head. */
    if (!fail && S_ISREG(st.st_mode) && (got = stk__pread_upto(fd, b, sizeof b, 0)) < 0)
        fail = errno;
    stk__close(fd);
    if (fail) {
        stk__fmt(err, errlen, "%s: %s", path, strerror(fail));
        return STK_EIO;
    }
    bool train;
    if (got >= 8 && !memcmp(b, "\x89STK\r\n\x1a\n", 8))
        *kind = K_STK;
    else if (got == 512 && tar_header_ok(b))
        *kind = K_TAR;
    else if (got > 0 && cifar_name(base_name(path), &train) &&
             ((uint64_t)st.st_size % 3073 == 0 || (uint64_t)st.st_size % 3074 == 0))
        *kind = K_CIFAR;
    else if (file_kind_of(base_name(path)) > K_TAR)
        *kind = file_kind_of(base_name(path)); /* by name; a tar by its header */
    else if (got >= 4 && !memcmp(b, "PAR1", 4))
        *kind = K_PARQUET; /* a Parquet file of another name */
    return STK_OK;
}

/* Expands one "{A..B}" group (A, B decimal; zero-padded to A's width when A
 * has a leading zero or both have the same width). */
static int expand_braces(const char *pat, pathlist *out, char *err, size_t errlen)
{
    const char *lb = strchr(pat, '{');
    const char *dots = lb ? strstr(lb, "..") : NULL;
    const char *rb = dots ? strchr(dots, '}') : NULL;
    if (!rb) {
        stk__fmt(err, errlen, "%s: a brace pattern needs {FIRST..LAST}", pat);
        return STK_EINVAL;
    }
    if (strchr(rb, '{')) {
        stk__fmt(err, errlen, "%s: only one {FIRST..LAST} group is supported", pat);
        return STK_EINVAL;
    }
    uint64_t a = 0, z = 0;
    size_t wa = (size_t)(dots - lb - 1), wz = (size_t)(rb - dots - 2);
    bool ok = wa > 0 && wz > 0 && wa <= 18 && wz <= 18;
    for (const char *p = lb + 1; ok && p < dots; p++)
        ok = *p >= '0' && *p <= '9', a = a * 10 + (uint64_t)(*p - '0');
    for (const char *p = dots + 2; ok && p < rb; p++)
        ok = *p >= '0' && *p <= '9', z = z * 10 + (uint64_t)(*p - '0');
    if (!ok || z < a || z - a >= 10000000) {
        stk__fmt(err, errlen, "%s: bad brace range (want {FIRST..LAST}, decimal, FIRST <= LAST)",
                 pat);
        return STK_EINVAL;
    }
    int width = (lb[1] == '0' && wa > 1) || wa == wz ? (int)wa : 0;
    char buf[4096];
    for (uint64_t v = a; v <= z; v++) {
        int w = snprintf(buf, sizeof buf, "%.*s%0*llu%s", (int)(lb - pat), pat, width,
                         (unsigned long long)v, rb + 1);
        if (w < 0 || (size_t)w >= sizeof buf) {
            stk__fmt(err, errlen, "%s: path too long", pat);
            return STK_EINVAL;
        }
        int rc = pl_add(out, buf, NULL);
        if (rc)
            return rc;
    }
    return STK_OK;
}

static int open_kind(stk__source *s, int kind, pathlist *l, const char *dir, char *err,
                     size_t errlen)
{
    const char *const *v = (const char *const *)l->v;
    if (kind >= K_FILES && kind < K_COUNT)
        return k_file_kinds[kind - K_FILES].open(s, v, NULL, l->n, err, errlen);
    switch (kind) {
    case K_STK: return stk__source_stk_open(s, v, l->n, dir, err, errlen);
    case K_CIFAR: return stk__source_cifar_open(s, v, l->n, err, errlen);
    default: return STK_EINVAL;
    }
}

/* ---- Datasets an index.json describes (MDS, LitData) ---------------------- */

enum { IX_NONE, IX_MDS, IX_LITDATA };
#define INDEX_JSON_MAX (256u << 20) /* bytes of an index.json read, as the readers do */

static int index_kind(const char *text, size_t len)
{
    return stk__mds_sniff_text(text, len)       ? IX_MDS
           : stk__litdata_sniff_text(text, len) ? IX_LITDATA
                                                : IX_NONE;
}

/* Opens the dataset fs gives (taken over) as kind ix; the source keeps what
 * fs pinned. */
static int open_indexed(stk__source *s, stk__files *fs, int ix, char *err, size_t errlen)
{
    stk__files_set_what(fs, ix == IX_MDS ? "MDS shards" : "LitData chunks");
    int rc = ix == IX_MDS ? stk__source_mds_open(s, fs, err, errlen)
                          : stk__source_litdata_open(s, fs, err, errlen);
    if (!rc && (rc = stk__files_keep(fs, s))) {
        stk__fmt(err, errlen, "out of memory while opening the dataset");
        stk__source_close(s);
    }
    stk__files_close(fs);
    return rc;
}

/* dir/index.json's kind: IX_NONE when there is none; a negative STK_E*
 * code when it is there but cannot be read (not a reason to read the
 * directory as another kind). */
static int local_index_kind(const char *dir, char *err, size_t errlen)
{
    char ipath[4096];
    stk__fmt(ipath, sizeof ipath, "%s/index.json", dir);
    struct stat st;
    if (stk__stat(ipath, &st) != 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR || e == ELOOP)
            return IX_NONE;
        stk__fmt(err, errlen, "%s: %s", ipath, strerror(e));
        return STK_EIO;
    }
    if (!S_ISREG(st.st_mode))
        return IX_NONE;
    char *text = NULL;
    size_t len = 0;
    int rc = stk__read_text(ipath, ipath, INDEX_JSON_MAX, &text, &len, err, errlen);
    if (!rc)
        rc = index_kind(text, len);
    stk__free(text);
    return rc;
}

static int open_pattern(stk__source *s, const char *pat, char *err, size_t errlen)
{
    pathlist l = {0};
    int rc = expand_braces(pat, &l, err, errlen);
    int kind = K_NONE;
    if (rc)
        goto out;
    for (size_t k = 0; k < l.n; k++) {
        int kk;
        if ((rc = sniff_file(l.v[k], &kk, err, errlen)))
            goto out;
        if (kk == K_NONE) {
            stk__fmt(err, errlen,
                     "%s: not a .stk shard, tar shard, CIFAR batch, TFRecord or Parquet file",
                     l.v[k]);
            rc = STK_EFORMAT;
            goto out;
        }
        if (k && kk != kind) {
            stk__fmt(err, errlen, "%s: the pattern mixes %s (%s) and %s (%s)", pat, kind_name(kind),
                     l.v[0], kind_name(kk), l.v[k]);
            rc = STK_EINVAL;
            goto out;
        }
        kind = kk;
    }
    rc = open_kind(s, kind, &l, NULL, err, errlen);
out:
    pl_free(&l);
    return rc;
}

static int open_dir(stk__source *s, const char *dir, char *err, size_t errlen)
{
    int rc = STK_OK;
    pathlist lists[K_COUNT] = {{0}};
    pathlist cifar_all = {0};
    /* A MosaicML Streaming or LitData dataset: index.json names its shards. */
    int ix = local_index_kind(dir, err, errlen);
    if (ix) {
        stk__files *fs;
        if (ix < 0)
            return ix;
        if ((rc = stk__files_open_local(&fs, dir)))
            return rc;
        return open_indexed(s, fs, ix, err, errlen);
    }
    DIR *d = stk__opendir(dir);
    if (!d) {
        int ee = errno;
        stk__fmt(err, errlen, "cannot list %s: %s", dir, strerror(ee));
        return STK_EIO;
    }
    struct dirent *e;
    char path[4096];
    for (;;) {
        if (!(e = stk__readdir(d))) {
            if (errno) {
                int ee = errno;
                stk__fmt(err, errlen, "cannot list %s: %s", dir, strerror(ee));
                rc = STK_EIO;
                goto out;
            }
            break;
        }
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        stk__fmt(path, sizeof path, "%s/%s", dir, name);
        struct stat st;
        if (stk__stat(path, &st) != 0) {
            /* Gone since listed, or a dangling symlink: not part of the
             * dataset. Any other failure must not drop a file silently. */
            int ee = errno;
            if (ee == ENOENT || ee == ELOOP)
                continue;
            stk__fmt(err, errlen, "%s: %s", path, strerror(ee));
            rc = STK_EIO;
            goto out;
        }
        bool train;
        int kind = K_NONE;
        if (S_ISDIR(st.st_mode))
            kind = K_FOLDER;
        else if (!S_ISREG(st.st_mode))
            continue;
        else if (ends_with(name, ".stk"))
            kind = K_STK;
        else if ((kind = file_kind_of(name)) != K_NONE)
            ;
        else if (cifar_name(name, &train)) {
            if ((rc = pl_add(&cifar_all, dir, name)))
                goto out;
            if (train)
                kind = K_CIFAR;
        }
        if (kind != K_NONE && (rc = pl_add(&lists[kind], dir, name)))
            goto out;
    }
    if (!lists[K_CIFAR].n && cifar_all.n) {
        /* Only a test batch: read it. */
        pl_free(&lists[K_CIFAR]);
        lists[K_CIFAR] = cifar_all;
        memset(&cifar_all, 0, sizeof cifar_all);
    }
    if (lists[K_TFREC].n)
        pl_free(&lists[K_FOLDER]); /* beside TFRecord files, a subfolder (DALI's idx/) is
                                      no class */
    int found = K_NONE, kinds = 0;
    char mix[256] = "";
    for (int k = K_STK; k < K_COUNT; k++) {
        if (!lists[k].n)
            continue;
        size_t ml = strlen(mix);
        stk__fmt(mix + ml, sizeof mix - ml, "%s%zu %s", kinds ? " and " : "", lists[k].n,
                 kind_name(k));
        kinds++;
        found = k;
    }
    if (kinds > 1) {
        stk__fmt(err, errlen,
                 "%s: the directory mixes kinds of data (%s); keep one kind per directory, or "
                 "name the files with a pattern such as train-{000000..000009}.tar",
                 dir, mix);
        rc = STK_EINVAL;
        goto out;
    }
    if (found == K_FOLDER || found == K_NONE) {
        stk__closedir(d);
        d = NULL;
        rc = stk__source_folder_open(s, dir, err, errlen);
        goto out;
    }
    qsort(lists[found].v, lists[found].n, sizeof(char *), cmp_cstr);
    rc = open_kind(s, found, &lists[found], dir, err, errlen);
out:
    if (d)
        stk__closedir(d);
    for (int k = 0; k < K_COUNT; k++)
        pl_free(&lists[k]);
    pl_free(&cifar_all);
    return rc;
}

/* ---- Remote datasets ----------------------------------------------------
 * A URL names a directory (prefix) holding a packed dataset (stoker.manifest
 * and .stk shards), an MDS or LitData dataset (index.json and the shards it
 * names; URL/index.json names it too), a directory of .stk, .tar or TFRecord
 * files (S3: listed), one file, or a brace pattern of files. .stk shards are
 * read by ranges; the other kinds are downloaded whole into the disk cache
 * and read by their local readers (remote_files.c). */

typedef struct named {
    const char *name;
    uint64_t size;
} named;

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

static int url_kind(const char *name)
{
    return ends_with(name, ".stk") ? K_STK : file_kind_of(name);
}

/* Opens shards named by names in the store r (taken over): .stk by ranged
 * reads, a whole-file kind through the disk cache. */
static int open_url_shards(stk__source *s, stk__remote *r, int kind, pathlist *names,
                           const uint64_t *sizes, const stk__source_params *prm, char *err,
                           size_t errlen)
{
    const char *const *v = (const char *const *)names->v;
    if (kind == K_STK)
        return stk__source_stk_open_remote(s, r, v, sizes, names->n, NULL, prm, err, errlen);
    if (kind < K_FILES) {
        stk__fmt(err, errlen,
                 "%s: remote datasets are .stk shards (with or without a stoker.manifest), "
                 ".tar shards, TFRecord files, or an MDS or LitData index.json with its shards; "
                 "other kinds must be read from local disk",
                 stk__remote_display(r));
        stk__remote_close(r);
        return STK_EUNSUPPORTED;
    }
    if (kind == K_PARQUET)
        /* Parquet is read by row groups, by ranges (each kept in the disk
         * cache when there is one). */
        return stk__source_parquet_open_remote(s, r, v, sizes, names->n, prm, err, errlen);
    const file_kind *fk = &k_file_kinds[kind - K_FILES];
    stk__files *fs = NULL;
    const char **paths = NULL;
    int rc = stk__files_open_remote(&fs, r, prm, fk->what);
    if (rc)
        return rc;
    if (!(paths = stk__calloc(2 * names->n + 1, sizeof *paths))) {
        rc = STK_ENOMEM;
        goto out;
    }
    const char **shown = paths + names->n;
    if ((rc = stk__files_get(fs, v, sizes, names->n, "the listing", paths, shown, err, errlen)))
        goto out;
    if ((rc = fk->open(s, paths, shown, names->n, err, errlen)))
        goto out;
    if ((rc = stk__files_keep(fs, s))) {
        stk__fmt(err, errlen, "out of memory while opening %s", stk__remote_display(r));
        stk__source_close(s);
    }
out:
    stk__free(paths);
    stk__files_close(fs);
    return rc;
}

/* A directory in a store without a stoker.manifest: an MDS or LitData
 * index.json, when it has one. Returns 1 when it took r over (the source
 * opened, or *rc the failure), 0 when there is no such index (r is still
 * the caller's). */
static int open_url_index(stk__source *s, stk__remote *r, const stk__source_params *prm, int *rc,
                          char *err, size_t errlen)
{
    char *text = NULL;
    size_t tlen = 0;
    *rc = stk__remote_get_small(r, "index.json", INDEX_JSON_MAX, &text, &tlen, err, errlen);
    if (*rc == STK_ENOENT) {
        *rc = STK_OK;
        return 0;
    }
    int ix = *rc ? IX_NONE : index_kind(text, tlen);
    stk__free(text);
    if (!*rc && ix == IX_NONE)
        return 0;
    if (*rc) {
        /* Unreachable, or an answer other than 404: the message says. */
        stk__remote_close(r);
        return 1;
    }
    stk__files *fs;
    if (!(*rc = stk__files_open_remote(&fs, r, prm, "")))
        *rc = open_indexed(s, fs, ix, err, errlen);
    return 1;
}

/* The one kind of shards a listing holds (K_NONE: none of the shard
 * kinds); a listing mixing kinds is refused with the counts of each. */
static int listed_kind(stk__remote *r, char **lnames, size_t ln, int *out, char *err, size_t errlen)
{
    size_t counts[K_COUNT] = {0};
    for (size_t k = 0; k < ln; k++)
        counts[url_kind(lnames[k])]++;
    int kind = K_NONE, kinds = 0;
    char mix[256] = "";
    for (int k = K_STK; k < K_COUNT; k++) {
        if (k == K_CIFAR || k == K_FOLDER || !counts[k])
            continue;
        size_t ml = strlen(mix);
        stk__fmt(mix + ml, sizeof mix - ml, "%s%zu %s", kinds ? " and " : "", counts[k],
                 kind_name(k));
        kinds++;
        kind = k;
    }
    if (kinds > 1) {
        stk__fmt(err, errlen, "%s: the prefix mixes kinds of data (%s); keep one kind per prefix",
                 stk__remote_display(r), mix);
        return STK_EINVAL;
    }
    *out = kind;
    return STK_OK;
}

/* The listed objects of one kind, sorted by name as a local directory's
 * shards are: their names into *names, their sizes into *sizes (owned by
 * the caller). */
static int sorted_of_kind(char **lnames, const uint64_t *lsizes, size_t ln, int kind,
                          pathlist *names, uint64_t **sizes)
{
    int rc = STK_OK;
    named *ns = stk__malloc((ln ? ln : 1) * sizeof *ns);
    size_t nn = 0;
    if (!ns || !(*sizes = stk__malloc((ln ? ln : 1) * sizeof **sizes))) {
        stk__free(ns);
        return STK_ENOMEM;
    }
    for (size_t k = 0; k < ln; k++)
        if (url_kind(lnames[k]) == kind)
            ns[nn++] = (named){lnames[k], lsizes[k]};
    qsort(ns, nn, sizeof *ns, cmp_named);
    for (size_t k = 0; k < nn && !rc; k++) {
        (*sizes)[k] = ns[k].size;
        rc = pl_add(names, ns[k].name, NULL);
    }
    stk__free(ns);
    return rc;
}

static int open_url(stk__source *s, const char *url, const stk__source_params *prm, char *err,
                    size_t errlen)
{
    int rc = STK_OK;
    stk__remote *r = NULL;
    pathlist names = {0};
    char **lnames = NULL;
    uint64_t *lsizes = NULL, *sizes = NULL;
    size_t ln = 0;
    char *dir = NULL, *ixdir = NULL;
    stk__remote_cfg none = {0};
    char shown[4096]; /* url without credentials or query, for messages */
    stk__url_display(url, shown, sizeof shown);
    if (prm->record_bytes) {
        stk__fmt(err, errlen, "%s: files of fixed-size records are read from local disk only",
                 shown);
        return STK_EUNSUPPORTED;
    }
    const char *brace = strchr(url, '{');
    const char *q = strchr(url, '?');
    if (!q && ends_with(url, "/index.json")) {
        /* An index.json names its dataset: the directory holding it. */
        size_t dl = strlen(url) - strlen("/index.json");
        if (!(ixdir = stk__malloc(dl + 1)))
            return STK_ENOMEM;
        memcpy(ixdir, url, dl);
        ixdir[dl] = '\0';
        url = ixdir;
        brace = NULL; /* a directory, never a pattern */
    }
    if (brace && (!q || brace < q)) {
        /* A pattern: the directory is the store's root, names expand. */
        const char *slash = strrchr(url, '/');
        if (!slash || slash > brace) {
            stk__fmt(err, errlen, "%s: the brace pattern must be in the last path element", shown);
            return STK_EINVAL;
        }
        size_t dl = (size_t)(slash - url);
        if (!(dir = stk__malloc(dl + 1)))
            return STK_ENOMEM;
        memcpy(dir, url, dl);
        dir[dl] = '\0';
        if ((rc = expand_braces(slash + 1, &names, err, errlen)))
            goto out;
        if ((rc = stk__remote_open(&r, dir, prm->remote ? prm->remote : &none, err, errlen)))
            goto out;
        int kind = url_kind(names.v[0]);
        for (size_t k = 1; k < names.n; k++)
            if (url_kind(names.v[k]) != kind)
                kind = K_NONE;
        rc = open_url_shards(s, r, kind, &names, NULL, prm, err, errlen);
        r = NULL;
        goto out;
    }
    if ((rc = stk__remote_open(&r, url, prm->remote ? prm->remote : &none, err, errlen)))
        goto out;
    if (stk__remote_names_object(r)) {
        if ((rc = pl_add(&names, "", NULL)))
            goto out;
        int kind = url_kind(stk__remote_basename(r));
        rc = open_url_shards(s, r, kind, &names, NULL, prm, err, errlen);
        r = NULL;
        goto out;
    }
    /* A directory: its manifest, else a listing. */
    char *text = NULL;
    size_t tlen = 0;
    rc = stk__remote_get_small(r, STK_MANIFEST, 64u << 20, &text, &tlen, err, errlen);
    if (rc == STK_OK) {
        stk__manifest man;
        char where[4096];
        stk__remote_object_display(r, STK_MANIFEST, where, sizeof where);
        rc = stk__manifest_parse(text, tlen, where, &man, err, errlen);
        stk__free(text);
        if (rc)
            goto out;
        rc = stk__source_stk_open_remote(s, r, NULL, NULL, 0, &man, prm, err, errlen);
        stk__manifest_free(&man);
        r = NULL;
        goto out;
    }
    if (rc != STK_ENOENT)
        goto out;
    /* No manifest: an index.json (MDS, LitData), else a listing. */
    if (open_url_index(s, r, prm, &rc, err, errlen)) {
        r = NULL;
        goto out;
    }
    /* Unpacked objects in a bucket listed by an earlier open, kept in the
     * cache directory: no listing at all (listcache.c). */
    if ((rc = stk__listing_load(r, prm, &lnames, &lsizes, &ln)) == STK_OK &&
        stk__bucket_samples(lnames, ln)) {
        rc = stk__source_bucket_open(s, r, lnames, lsizes, ln, err, errlen);
        r = NULL;
        goto out;
    }
    if (rc == STK_ENOMEM)
        goto out;
    stk__remote_list_free(lnames, lsizes, ln);
    lnames = NULL;
    lsizes = NULL;
    ln = 0;
    if ((rc = stk__remote_list(r, &lnames, &lsizes, &ln, err, errlen))) {
        /* A plain HTTP server: no listing of shards, but maybe index pages
         * of class folders (nginx autoindex). */
        char why[STK_ERRMSG_MAX];
        if (rc != STK_EUNSUPPORTED ||
            stk__listing_tree(r, prm, &lnames, &lsizes, &ln, why, sizeof why) ||
            !stk__bucket_samples(lnames, ln))
            goto out; /* the first message says what a plain HTTP URL may name */
        rc = stk__source_bucket_open(s, r, lnames, lsizes, ln, err, errlen);
        r = NULL;
        goto out;
    }
    int kind = K_NONE;
    if ((rc = listed_kind(r, lnames, ln, &kind, err, errlen)))
        goto out;
    if (kind == K_NONE) {
        /* Unpacked objects in class folders (prefix/CLASS/NAME.jpg): every
         * object below the prefix, each a sample. */
        stk__remote_list_free(lnames, lsizes, ln);
        lnames = NULL;
        lsizes = NULL;
        ln = 0;
        if ((rc = stk__listing_tree(r, prm, &lnames, &lsizes, &ln, err, errlen)))
            goto out;
        if (stk__bucket_samples(lnames, ln)) {
            rc = stk__source_bucket_open(s, r, lnames, lsizes, ln, err, errlen);
            r = NULL;
            goto out;
        }
        stk__fmt(err, errlen,
                 "%s: holds no stoker.manifest, no index.json, no .stk, .tar or TFRecord files "
                 "and no CLASS/NAME images (%zu other objects)",
                 stk__remote_display(r), ln);
        rc = STK_ENOENT;
        goto out;
    }
    if ((rc = sorted_of_kind(lnames, lsizes, ln, kind, &names, &sizes)))
        goto out;
    rc = open_url_shards(s, r, kind, &names, sizes, prm, err, errlen);
    r = NULL;
out:
    stk__remote_close(r);
    stk__remote_list_free(lnames, lsizes, ln);
    stk__free(sizes);
    stk__free(dir);
    stk__free(ixdir);
    pl_free(&names);
    return rc;
}

static int open_any(stk__source *s, const char *path, const stk__source_params *prm, char *err,
                    size_t errlen)
{
    if (stk__is_url(path))
        return open_url(s, path, prm, err, errlen);
    struct stat st;
    if (stk__stat(path, &st) != 0) {
        int e = errno;
        if (strchr(path, '{') && !prm->record_bytes)
            return open_pattern(s, path, err, errlen);
        stk__fmt(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT || e == ENOTDIR ? STK_ENOENT : STK_EIO;
    }
    if (S_ISDIR(st.st_mode)) {
        if (prm->record_bytes) {
            stk__fmt(err, errlen, "%s: is a directory, but a record size was given", path);
            return STK_EINVAL;
        }
        return open_dir(s, path, err, errlen);
    }
    if (prm->record_bytes)
        return stk__source_records_open(s, path, prm, err, errlen);
    int kind;
    int rc = sniff_file(path, &kind, err, errlen);
    if (rc)
        return rc;
    if (kind != K_NONE) {
        char *one = (char *)(uintptr_t)path;
        pathlist l = {&one, 1, 1};
        return open_kind(s, kind, &l, NULL, err, errlen);
    }
    stk__fmt(err, errlen,
             "%s: is a file but not a .stk shard, tar shard, CIFAR batch, .tfrecord or Parquet "
             "file; give "
             "its record "
             "size (--record-size) to read it as fixed-size records, or name a directory in "
             "ImageFolder layout",
             path);
    return STK_EINVAL;
}

int stk__source_open(stk__source *s, const char *path, const stk__source_params *prm, char *err,
                     size_t errlen)
{
    memset(s, 0, sizeof *s);
    int rc = open_any(s, path, prm, err, errlen);
    if (rc == STK_OK && !s->nfields && (rc = stk__source_default_fields(s))) {
        stk__fmt(err, errlen, "out of memory while opening %s", path);
        stk__source_close(s);
    }
    return rc;
}

/* ---- Describing sources -------------------------------------------------- */

const char *stk__source_class_name(const stk__source *s, uint64_t c)
{
    if (c >= s->num_classes || !s->ops->class_name)
        return NULL;
    return s->ops->class_name(s, c);
}

void stk__source_describe(const stk__source *s, stk__dataset_info *di)
{
    memset(di, 0, sizeof *di);
    di->restart_indexed = -1;
    di->format = s->ops ? s->ops->kind : "";
    if (s->ops && s->ops->describe)
        s->ops->describe(s, di);
}

void stk__source_key(const stk__source *s, const char *root, uint64_t i, char *buf, size_t n)
{
    if (s->ops->key) {
        s->ops->key(s, i, buf, n);
        return;
    }
    char name[4096];
    s->ops->name(s, i, name, sizeof name);
    size_t rl = root ? strlen(root) : 0;
    while (rl > 1 && root[rl - 1] == '/')
        rl--;
    if (rl && !strncmp(name, root, rl) && name[rl] == '/')
        stk__fmt(buf, n, "%s", name + rl + 1);
    else
        stk__fmt(buf, n, "%s", name);
}
