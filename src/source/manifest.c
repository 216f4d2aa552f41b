/*
 * manifest.c -- the dataset manifest (stoker.manifest, docs/format.md): the
 * list of a packed dataset's shards with their counts and sizes, its payload
 * kind and class names. Written by packing, read by the .stk reader and by
 * `stoker info`/`verify`. The text is untrusted: every field is checked.
 */
#include "source/manifest.h"
#include "io/file.h"
#include "source/stkformat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int stk__manifest_write(const char *dir, const stk__manifest *m, char *err, size_t errlen)
{
    char path[4096], tmp[4200];
    int rc = STK_OK;
    stk__fmt(path, sizeof path, "%s/%s", dir, STK_MANIFEST);
    stk__fmt(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (!f) {
        stk__fmt(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        return STK_EIO;
    }
    fprintf(f, "stoker-manifest 1\nkind %s\nsamples %llu\nclasses %llu\n",
            stk__payload_kind_name(m->kind), (unsigned long long)m->samples,
            (unsigned long long)m->classes);
    for (size_t k = 0; k < m->nshards; k++)
        fprintf(f, "shard %s %llu %llu\n", m->shards[k].name,
                (unsigned long long)m->shards[k].count, (unsigned long long)m->shards[k].bytes);
    for (uint64_t c = 0; m->class_names && c < m->classes; c++)
        if (m->class_names[c])
            fprintf(f, "class %llu %s\n", (unsigned long long)c, m->class_names[c]);
    if (m->has_restart)
        fprintf(f, "restart-indexed %llu\n", (unsigned long long)m->restart_indexed);
    if (m->has_index)
        fprintf(f, "index stoker.index %llu %016llx\n", (unsigned long long)m->index_bytes,
                (unsigned long long)m->index_sum);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        rc = STK_EIO;
    if (fclose(f) != 0)
        rc = STK_EIO;
    if (rc == STK_OK && rename(tmp, path) != 0)
        rc = STK_EIO;
    if (rc) {
        stk__fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return rc;
    }
    stk__fsync_parent(path);
    return STK_OK;
}

void stk__manifest_free(stk__manifest *m)
{
    for (size_t k = 0; k < m->nshards; k++)
        stk__free(m->shards[k].name);
    stk__free(m->shards);
    if (m->class_names)
        for (uint64_t c = 0; c < m->classes; c++)
            stk__free(m->class_names[c]);
    stk__free(m->class_names);
    memset(m, 0, sizeof *m);
}

static bool parse_dec(const char *s, const char **end, uint64_t *v)
{
    uint64_t x = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *v = x;
    *end = p;
    return true;
}

/* Reads a whole small file into a NUL-terminated buffer. */
static int slurp(const char *path, size_t limit, char **out, size_t *len, char *err, size_t errlen)
{
    int rc = STK_OK;
    char *buf = NULL;
    int fd = stk__open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return STK_ENOENT;
        stk__fmt(err, errlen, "%s: %s", path, strerror(errno));
        return STK_EIO;
    }
    struct stat st;
    if (stk__fstat(fd, &st) != 0) {
        stk__fmt(err, errlen, "%s: %s", path, strerror(errno));
        rc = STK_EIO;
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > limit) {
        stk__fmt(err, errlen, "%s: not a regular file of at most %zu bytes", path, limit);
        rc = STK_EFORMAT;
        goto out;
    }
    size_t n = (size_t)st.st_size;
    if (!(buf = stk__malloc(n + 1))) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = stk__pread_full(fd, buf, n, 0, err, errlen)))
        goto out;
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
out:
    stk__free(buf);
    stk__close(fd);
    return rc;
}

int stk__manifest_read(const char *dir, stk__manifest *m, char *err, size_t errlen)
{
    char path[4096];
    char *text = NULL;
    size_t tlen = 0;
    memset(m, 0, sizeof *m);
    stk__fmt(path, sizeof path, "%s/%s", dir, STK_MANIFEST);
    int rc = slurp(path, 64u << 20, &text, &tlen, err, errlen);
    if (rc)
        return rc;
    rc = stk__manifest_parse(text, tlen, path, m, err, errlen);
    stk__free(text);
    return rc;
}

int stk__manifest_parse(char *text, size_t tlen, const char *path, stk__manifest *m, char *err,
                        size_t errlen)
{
    int rc = STK_OK;
    size_t shard_cap = 0;
    uint64_t lineno = 0;
    memset(m, 0, sizeof *m);
    if (memchr(text, '\0', tlen)) {
        stk__fmt(err, errlen, "%s: not a text file", path);
        rc = STK_EFORMAT;
        goto out;
    }
    for (char *line = text, *next; line < text + tlen; line = next) {
        char *nl = strchr(line, '\n');
        if (nl) {
            *nl = '\0';
            next = nl + 1;
        } else {
            next = line + strlen(line);
        }
        lineno++;
        const char *e;
        uint64_t a, b, c;
        if (lineno == 1) {
            if (strcmp(line, "stoker-manifest 1") != 0) {
                stk__fmt(err, errlen, "%s: not a stoker manifest (version 1)", path);
                rc = STK_EFORMAT;
                goto out;
            }
        } else if (!strncmp(line, "kind ", 5)) {
            if (!strcmp(line + 5, "raw"))
                m->kind = STK_PAYLOAD_RAW;
            else if (!strcmp(line + 5, "resized"))
                m->kind = STK_PAYLOAD_RESIZED;
            else if (!strcmp(line + 5, "encoded"))
                m->kind = STK_PAYLOAD_ENCODED;
            else if (!strcmp(line + 5, "fields"))
                m->kind = STK_PAYLOAD_FIELDS;
            else
                goto bad; /* an unknown kind is not silently read as another */
        } else if (!strncmp(line, "samples ", 8)) {
            if (!parse_dec(line + 8, &e, &m->samples) || *e)
                goto bad;
        } else if (!strncmp(line, "classes ", 8)) {
            if (!parse_dec(line + 8, &e, &a) || *e || a > (1u << 24) || m->class_names)
                goto bad;
            m->classes = a;
            if (a && !(m->class_names = stk__calloc((size_t)a, sizeof *m->class_names))) {
                rc = STK_ENOMEM;
                goto out;
            }
        } else if (!strncmp(line, "shard ", 6)) {
            const char *name = line + 6;
            const char *sp = strchr(name, ' ');
            if (!sp || sp == name || !parse_dec(sp + 1, &e, &b) || *e != ' ' ||
                !parse_dec(e + 1, &e, &c) || *e)
                goto bad;
            if (memchr(name, '/', (size_t)(sp - name))) {
                stk__fmt(err, errlen, "%s:%llu: shard names must be plain file names", path,
                         (unsigned long long)lineno);
                rc = STK_EFORMAT;
                goto out;
            }
            rc = stk__grow((void **)&m->shards, &shard_cap, m->nshards + 1, sizeof *m->shards);
            if (rc)
                goto out;
            stk__manifest_shard *s = &m->shards[m->nshards];
            size_t namelen = (size_t)(sp - name);
            if (!(s->name = stk__malloc(namelen + 1))) {
                rc = STK_ENOMEM;
                goto out;
            }
            memcpy(s->name, name, namelen);
            s->name[namelen] = '\0';
            s->count = b;
            s->bytes = c;
            m->nshards++;
        } else if (!strncmp(line, "restart-indexed ", 16)) {
            if (!parse_dec(line + 16, &e, &a) || *e)
                goto bad;
            m->has_restart = true;
            m->restart_indexed = a;
        } else if (!strncmp(line, "index stoker.index ", 19)) {
            /* Size, then exactly 16 lowercase hex digits. */
            if (!parse_dec(line + 19, &e, &a) || *e != ' ' || strlen(e + 1) != 16)
                goto bad;
            uint64_t sum = 0;
            for (const char *h = e + 1; *h; h++) {
                int v = *h >= '0' && *h <= '9'   ? *h - '0'
                        : *h >= 'a' && *h <= 'f' ? *h - 'a' + 10
                                                 : -1;
                if (v < 0)
                    goto bad;
                sum = sum << 4 | (uint64_t)v;
            }
            m->has_index = true;
            m->index_bytes = a;
            m->index_sum = sum;
        } else if (!strncmp(line, "class ", 6)) {
            if (!parse_dec(line + 6, &e, &a) || *e != ' ')
                goto bad;
            if (a < m->classes && m->class_names && !m->class_names[a] &&
                !(m->class_names[a] = stk__strdup(e + 1))) {
                rc = STK_ENOMEM;
                goto out;
            }
        }
        continue;
    bad:
        stk__fmt(err, errlen, "%s:%llu: malformed line", path, (unsigned long long)lineno);
        rc = STK_EFORMAT;
        goto out;
    }
    if (lineno == 0) {
        stk__fmt(err, errlen, "%s: empty manifest", path);
        rc = STK_EFORMAT;
    }
out:
    if (rc)
        stk__manifest_free(m);
    return rc;
}

bool stk__pack_unfinished(const char *dir)
{
    bool found = false;
    DIR *dp = stk__opendir(dir);
    if (!dp)
        return false;
    struct dirent *e;
    while (!found && (e = stk__readdir(dp))) {
        size_t l = strlen(e->d_name);
        found = !strcmp(e->d_name, STK_PACK_MARKER) ||
                (l > 8 && !strcmp(e->d_name + l - 8, ".stk.tmp"));
    }
    stk__closedir(dp);
    return found;
}
