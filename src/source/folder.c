/*
 * folder.c -- an ImageFolder tree, with torchvision's semantics: class index =
 * position of the class subfolder's name in sorted order; within a class, the
 * directories reached by os.walk(followlinks=True) sorted by path, and in each
 * the files sorted by name; a file counts when its name ends, case-
 * insensitively, with one of torchvision's image extensions. Every sample's
 * bytes are the whole file.
 *
 * Departures, on purpose: a symlink loop (a directory that is its own
 * ancestor) is not followed again, where os.walk would repeat it until the
 * path grows too long; and a directory that cannot be listed is an error, where
 * os.walk skips it silently.
 */
#include "source/source.h"
#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct folder {
    char *paths;        /* all sample paths, NUL-terminated, back to back */
    uint64_t *path_off; /* count entries */
    uint32_t *labels;   /* count entries */
    char **class_names;
    uint64_t num_classes;
} folder;

/* A growable array of bytes; all scan-time storage lives in these. */
typedef struct vec {
    uint8_t *p;
    size_t len, cap;
} vec;

static int vec_push(vec *v, const void *data, size_t n)
{
    if (n > SIZE_MAX - v->len)
        return STK_ENOMEM;
    int rc = stk__grow((void **)&v->p, &v->cap, v->len + n, 1);
    if (rc)
        return rc;
    memcpy(v->p + v->len, data, n);
    v->len += n;
    return STK_OK;
}

static const char *const k_exts[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                     ".pgm", ".tif",  ".tiff", ".webp"};

static bool has_image_ext(const char *name)
{
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof k_exts / sizeof k_exts[0]; k++) {
        size_t e = strlen(k_exts[k]);
        if (n >= e && strcasecmp(name + n - e, k_exts[k]) == 0)
            return true;
    }
    return false;
}

/* One file found by the scan, before sorting. Offsets point into scan.text. */
typedef struct entry {
    uint64_t root; /* offset of its directory's path */
    uint64_t name; /* offset of its name */
    uint32_t label;
} entry;

typedef struct scan {
    vec text;    /* NUL-terminated strings */
    vec entries; /* entry[] */
    char *err;
    size_t errlen;
    uint64_t loops;
} scan;

static int join_path(char *out, size_t n, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    size_t dl = strlen(dir);
    bool slash = dl > 0 && dir[dl - 1] == '/';
    int w = snprintf(out, n, "%s%s%s", dir, slash ? "" : "/", name);
    if (w < 0 || (size_t)w >= n) {
        stk__fmt(err, errlen, "%s/%s: path too long", dir, name);
        return STK_EINVAL;
    }
    return STK_OK;
}

typedef struct dev_ino {
    dev_t dev;
    ino_t ino;
} dev_ino;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Is the entry a directory, following symlinks (as DirEntry.is_dir())? A
 * dangling symlink is not; any other stat failure is an error (STK_EIO with
 * the reason), never a silently dropped entry. */
static int entry_is_dir(const char *path, const struct dirent *d, bool *is_dir, char *err,
                        size_t errlen)
{
    *is_dir = d->d_type == DT_DIR;
    if (d->d_type != DT_LNK && d->d_type != DT_UNKNOWN)
        return STK_OK;
    struct stat st;
    if (stk__stat(path, &st) != 0) {
        int e = errno;
        if (e == ENOENT || e == ELOOP)
            return STK_OK;
        stk__fmt(err, errlen, "%s: %s", path, strerror(e));
        return STK_EIO;
    }
    *is_dir = S_ISDIR(st.st_mode);
    return STK_OK;
}

/* Walks dir (os.walk order does not matter: entries are sorted afterwards),
 * recording image files with the given label. stack holds the (dev, ino) of
 * dir's ancestors, for loop detection. */
static int walk(scan *sc, const char *dir, uint32_t label, dev_ino *stack, int depth)
{
    int rc = STK_OK;
    DIR *d = NULL;
    char **subdirs = NULL;
    size_t nsub = 0, capsub = 0;
    char path[4096];

    struct stat st;
    if (stk__stat(dir, &st) != 0) {
        int e = errno;
        stk__fmt(sc->err, sc->errlen, "%s: %s", dir, strerror(e));
        return STK_EIO;
    }
    for (int k = 0; k < depth; k++) {
        if (stack[k].dev == st.st_dev && stack[k].ino == st.st_ino) {
            sc->loops++;
            return STK_OK; /* a symlink loop: already being walked above */
        }
    }
    if (depth >= 256) {
        stk__fmt(sc->err, sc->errlen, "%s: directory tree deeper than 256 levels", dir);
        return STK_EFORMAT;
    }
    stack[depth].dev = st.st_dev;
    stack[depth].ino = st.st_ino;

    d = stk__opendir(dir);
    if (!d) {
        int e = errno;
        stk__fmt(sc->err, sc->errlen, "cannot list %s: %s", dir, strerror(e));
        return STK_EIO;
    }
    uint64_t root = sc->text.len;
    if ((rc = vec_push(&sc->text, dir, strlen(dir) + 1)))
        goto out;
    struct dirent *e;
    for (;;) {
        errno = 0;
        e = stk__readdir(d);
        if (!e) {
            if (errno) {
                int ee = errno;
                stk__fmt(sc->err, sc->errlen, "cannot list %s: %s", dir, strerror(ee));
                rc = STK_EIO;
                goto out;
            }
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((rc = join_path(path, sizeof path, dir, e->d_name, sc->err, sc->errlen)))
            goto out;
        bool is_dir;
        if ((rc = entry_is_dir(path, e, &is_dir, sc->err, sc->errlen)))
            goto out;
        if (is_dir) {
            if ((rc = stk__grow((void **)&subdirs, &capsub, nsub + 1, sizeof *subdirs)))
                goto out;
            if (!(subdirs[nsub] = stk__strdup(path))) {
                rc = STK_ENOMEM;
                goto out;
            }
            nsub++;
        } else if (has_image_ext(e->d_name)) {
            entry en = {root, sc->text.len, label};
            if ((rc = vec_push(&sc->text, e->d_name, strlen(e->d_name) + 1)) ||
                (rc = vec_push(&sc->entries, &en, sizeof en)))
                goto out;
        }
    }
    stk__closedir(d);
    d = NULL;
    for (size_t k = 0; k < nsub && !rc; k++)
        rc = walk(sc, subdirs[k], label, stack, depth + 1);
out:
    if (d)
        stk__closedir(d);
    for (size_t k = 0; k < nsub; k++)
        stk__free(subdirs[k]);
    stk__free(subdirs);
    return rc;
}

/* qsort_r (glibc), so concurrent opens never share a sort context. */
static int cmp_entry(const void *pa, const void *pb, void *ctx)
{
    const entry *a = pa, *b = pb;
    const char *text = ctx;
    if (a->label != b->label)
        return a->label < b->label ? -1 : 1;
    int c = strcmp(text + a->root, text + b->root);
    if (c)
        return c;
    return strcmp(text + a->name, text + b->name);
}

static int folder_read(stk__source *s, uint64_t i, stk__sink *sink, uint8_t **data, size_t *len,
                       int64_t *label, char *err, size_t errlen)
{
    folder *f = s->impl;
    *label = f->labels[i];
    return stk__read_file(f->paths + f->path_off[i], sink, data, len, err, errlen);
}

static void folder_name(const stk__source *s, uint64_t i, char *buf, size_t n)
{
    const folder *f = s->impl;
    stk__fmt(buf, n, "%s", f->paths + f->path_off[i]);
}

static const char *folder_class_name(const stk__source *src, uint64_t c)
{
    const folder *f = src->impl;
    if (!f || c >= f->num_classes)
        return NULL;
    return f->class_names[c];
}

static void folder_close(stk__source *s)
{
    folder *f = s->impl;
    if (!f)
        return;
    for (uint64_t k = 0; k < f->num_classes; k++)
        stk__free(f->class_names[k]);
    stk__free(f->class_names);
    stk__free(f->paths);
    stk__free(f->path_off);
    stk__free(f->labels);
    stk__free(f);
    s->impl = NULL;
}

/* Fields: "image" (the file's bytes), "label" (its class), "path" (the
 * file's path as text, for users who want it). */
static int folder_fields(const stk__source *s, uint64_t i, const uint8_t *bytes, size_t len,
                         int64_t label, stk__field_set *fs, char *err, size_t errlen)
{
    int rc = stk__source_fields_generic(s, i, bytes, len, label, fs, err, errlen);
    if (rc)
        return rc;
    const folder *f = s->impl;
    const char *path = f->paths + f->path_off[i];
    if ((rc = stk__field_set_gen(fs, 2, path, strlen(path))))
        stk__fmt(err, errlen, "path of %zu bytes is too long for the path field", strlen(path));
    return rc;
}

/* A folder takes only image files, so every sample must be an image. */
static void folder_describe(const stk__source *s, stk__dataset_info *di)
{
    (void)s;
    di->images = 1;
}

static const stk__source_ops k_folder_ops = {.kind = "folder",
                                             .read = folder_read,
                                             .name = folder_name,
                                             .close = folder_close,
                                             .flags = STK__SRC_IMAGES,
                                             .describe = folder_describe,
                                             .class_name = folder_class_name,
                                             .fields = folder_fields};

/* Lists the class subfolders of root (entries that are directories after
 * following symlinks), sorted by name. */
static int find_classes(const char *root, char ***names, size_t *count, char *err, size_t errlen)
{
    int rc = STK_OK;
    char path[4096];
    char **v = NULL;
    size_t n = 0, cap = 0;
    DIR *d = stk__opendir(root);
    if (!d) {
        int ee = errno;
        stk__fmt(err, errlen, "cannot list %s: %s", root, strerror(ee));
        return ee == ENOENT ? STK_ENOENT : STK_EIO;
    }
    struct dirent *e;
    for (;;) {
        if (!(e = stk__readdir(d))) {
            if (errno) {
                int ee = errno;
                stk__fmt(err, errlen, "cannot list %s: %s", root, strerror(ee));
                rc = STK_EIO;
            }
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((rc = join_path(path, sizeof path, root, e->d_name, err, errlen)))
            goto out;
        bool is_dir;
        if ((rc = entry_is_dir(path, e, &is_dir, err, errlen)))
            goto out;
        if (!is_dir)
            continue;
        if ((rc = stk__grow((void **)&v, &cap, n + 1, sizeof *v)))
            goto out;
        if (!(v[n] = stk__strdup(e->d_name))) {
            rc = STK_ENOMEM;
            goto out;
        }
        n++;
    }
    if (n && !rc)
        qsort(v, n, sizeof *v, cmp_str);
out:
    stk__closedir(d);
    if (rc) {
        for (size_t k = 0; k < n; k++)
            stk__free(v[k]);
        stk__free(v);
        return rc;
    }
    *names = v;
    *count = n;
    return STK_OK;
}

int stk__source_folder_open(stk__source *s, const char *root, char *err, size_t errlen)
{
    int rc = STK_OK;
    scan sc = {.err = err, .errlen = errlen};
    char **classes = NULL;
    size_t nclasses = 0;
    dev_ino *stack = NULL;
    folder *f = NULL;
    vec paths = {0};
    char path[4096];

    if ((rc = find_classes(root, &classes, &nclasses, err, errlen)))
        goto out;
    if (!nclasses) {
        stk__fmt(err, errlen, "%s: no class subfolders (ImageFolder layout is ROOT/CLASS/IMAGE)",
                 root);
        rc = STK_EEMPTY;
        goto out;
    }
    if (nclasses > UINT32_MAX) {
        stk__fmt(err, errlen, "%s: too many classes", root);
        rc = STK_EFORMAT;
        goto out;
    }
    if (!(stack = stk__calloc(257, sizeof *stack))) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (size_t c = 0; c < nclasses; c++) {
        if ((rc = join_path(path, sizeof path, root, classes[c], err, errlen)))
            goto out;
        size_t before = sc.entries.len;
        if ((rc = walk(&sc, path, (uint32_t)c, stack, 0)))
            goto out;
        if (sc.entries.len == before) {
            stk__fmt(err, errlen,
                     "%s: class folder '%s' has no image files (extensions .jpg .jpeg .png .ppm "
                     ".bmp .pgm .tif .tiff .webp, any case)",
                     root, classes[c]);
            rc = STK_EEMPTY;
            goto out;
        }
    }
    size_t n = sc.entries.len / sizeof(entry);
    entry *ents = (entry *)(void *)sc.entries.p;
    qsort_r(ents, n, sizeof *ents, cmp_entry, sc.text.p);

    if (!(f = stk__calloc(1, sizeof *f))) {
        rc = STK_ENOMEM;
        goto out;
    }
    /* Compact: full paths in sample order, then offsets and labels. */
    f->path_off = stk__malloc(n * sizeof *f->path_off);
    f->labels = stk__malloc(n * sizeof *f->labels);
    if (!f->path_off || !f->labels) {
        rc = STK_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        const char *dir = (const char *)sc.text.p + ents[k].root;
        const char *name = (const char *)sc.text.p + ents[k].name;
        if ((rc = join_path(path, sizeof path, dir, name, err, errlen)))
            goto out;
        f->path_off[k] = paths.len;
        f->labels[k] = ents[k].label;
        if ((rc = vec_push(&paths, path, strlen(path) + 1)))
            goto out;
    }
    f->paths = (char *)paths.p;
    paths.p = NULL;
    f->class_names = classes;
    f->num_classes = nclasses;
    classes = NULL;
    if (stk__source_add_field(s, "image", 5, STK_FIELD_IMAGE, n) < 0 ||
        stk__source_add_field(s, "label", 5, STK_FIELD_INT, n) < 0 ||
        stk__source_add_field(s, "path", 4, STK_FIELD_TEXT, n) < 0) {
        stk__source_free_common(s); /* the fields added */
        rc = STK_ENOMEM;
        goto out;
    }
    s->ops = &k_folder_ops;
    s->impl = f;
    s->count = n;
    s->num_classes = nclasses;
    /* The peak is while both the scan's buffers and the index exist. */
    s->index_bytes =
        paths.cap + n * (sizeof *f->path_off + sizeof *f->labels) + sc.text.cap + sc.entries.cap;
    f = NULL;
out:
    stk__free(paths.p);
    if (f) {
        stk__source tmp = {.impl = f};
        folder_close(&tmp);
    }
    if (classes) {
        for (size_t k = 0; k < nclasses; k++)
            stk__free(classes[k]);
        stk__free(classes);
    }
    stk__free(stack);
    stk__free(sc.text.p);
    stk__free(sc.entries.p);
    return rc;
}
