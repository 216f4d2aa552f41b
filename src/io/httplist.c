/*
 * httplist.c -- listing a plain HTTP server's directory tree from the index
 * pages nginx's autoindex writes: the HTML one (the default; its sizes in
 * bytes, autoindex_exact_size on, also the default) or the JSON one
 * (autoindex_format json). For unpacked objects in class folders
 * (source/bucket.c): every file below the dataset URL, with its size.
 *
 * The pages are untrusted: names are taken only from relative links below
 * the page (no "..", no '/' but a directory's last, no scheme, no query), the
 * walk is bounded in depth and in pages, and a page that gives no size for a
 * file fails the listing with a message saying which setting to use.
 */
#include "io/remote.h"
#include "io/remote_impl.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 4           /* directories below the dataset URL */
#define MAX_PAGES 100000      /* index pages read */
#define PAGE_MAX  (64u << 20) /* bytes of one index page */

typedef struct lst {
    char **names;
    uint64_t *sizes;
    size_t n, cap;
    char **dirs; /* directories to read, relative ("cls/") */
    size_t ndirs, dcap, next;
} lst;

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* [p, p + n) into out (NUL-terminated), percent-decoded when decode (an
 * HTML link; a JSON page gives names as they are); false when it is not a
 * name this walk follows. */
static bool link_name(const char *p, size_t n, bool decode, char *out, size_t cap, bool *dir)
{
    size_t k = 0;
    *dir = n && p[n - 1] == '/';
    if (*dir)
        n--;
    if (!n || n >= cap)
        return false;
    for (size_t j = 0; j < n; j++) {
        char c = p[j];
        if (!decode) {
            /* a JSON page's name as it is */
        } else if (c == '%' && j + 2 < n && hexval(p[j + 1]) >= 0 && hexval(p[j + 2]) >= 0) {
            c = (char)(hexval(p[j + 1]) * 16 + hexval(p[j + 2]));
            j += 2;
        } else if (c == '?' || c == '#' || c == ':') {
            return false; /* a query, a fragment, a scheme: not an entry */
        }
        if (c == '/' || c == '\0' || c == '\\')
            return false;
        out[k++] = c;
    }
    out[k] = '\0';
    return strcmp(out, ".") && strcmp(out, "..");
}

static int add_entry(lst *l, const char *dir, const char *name, bool is_dir, uint64_t size,
                     unsigned depth)
{
    size_t nl = strlen(dir) + strlen(name) + 2;
    char *full = stk__malloc(nl);
    if (!full)
        return STK_ENOMEM;
    stk__fmt(full, nl, "%s%s%s", dir, name, is_dir ? "/" : "");
    int rc;
    if (is_dir) {
        if (depth >= MAX_DEPTH) {
            stk__free(full);
            return STK_OK; /* deeper folders are no part of the layout */
        }
        if ((rc = stk__grow((void **)&l->dirs, &l->dcap, l->ndirs + 1, sizeof *l->dirs))) {
            stk__free(full);
            return rc;
        }
        l->dirs[l->ndirs++] = full;
        return STK_OK;
    }
    size_t cap = l->cap;
    if ((rc = stk__grow((void **)&l->names, &cap, l->n + 1, sizeof *l->names)) ||
        (rc = stk__grow((void **)&l->sizes, &l->cap, l->n + 1, sizeof *l->sizes))) {
        stk__free(full);
        return rc;
    }
    l->names[l->n] = full;
    l->sizes[l->n++] = size;
    return STK_OK;
}

/* nginx's JSON index: [{"name": ..., "type": "directory"|"file", "size": N}, ...]. */
static int parse_json(lst *l, const char *dir, unsigned depth, const char *body, size_t len,
                      char *why, size_t wn)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    int rc = STK_OK;
    if (!json_is_array(root)) {
        stk__fmt(why, wn, "the JSON index page is not an array");
        rc = STK_EFORMAT;
    }
    for (size_t k = 0; !rc && k < json_array_size(root); k++) {
        const json_t *e = json_array_get(root, k);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *type = json_string_value(json_object_get(e, "type"));
        const json_t *size = json_object_get(e, "size");
        char nm[1024];
        bool d;
        if (!name || !type || !link_name(name, strlen(name), false, nm, sizeof nm, &d) || d)
            continue;
        if (!strcmp(type, "directory"))
            rc = add_entry(l, dir, nm, true, 0, depth);
        else if (!strcmp(type, "file") && json_is_integer(size) && json_integer_value(size) >= 0)
            rc = add_entry(l, dir, nm, false, (uint64_t)json_integer_value(size), depth);
    }
    if (root)
        json_decref(root);
    return rc;
}

/* nginx's HTML index: one line per entry,
 *   <a href="NAME">SHOWN</a>   DD-Mon-YYYY HH:MM   SIZE
 * SIZE in bytes ("-" for a directory). */
static int parse_html(lst *l, const char *dir, unsigned depth, const char *body, char *why,
                      size_t wn)
{
    const char *p = body;
    while ((p = strstr(p, "<a href=\""))) {
        p += 9;
        const char *q = strchr(p, '"');
        if (!q)
            break;
        char nm[1024];
        bool d;
        bool ok = link_name(p, (size_t)(q - p), true, nm, sizeof nm, &d);
        const char *end = strstr(q, "</a>");
        if (!ok || !end)
            continue;
        p = end + 4;
        if (d) {
            int rc = add_entry(l, dir, nm, true, 0, depth);
            if (rc)
                return rc;
            continue;
        }
        /* The date (two words), then the size. */
        const char *s = p;
        for (int w = 0; w < 2; w++) {
            while (*s == ' ')
                s++;
            while (*s && *s != ' ' && *s != '\n')
                s++;
        }
        while (*s == ' ')
            s++;
        char *e;
        unsigned long long v = strtoull(s, &e, 10);
        if (e == s || (*e != '\r' && *e != '\n' && *e != '\0' && *e != ' ')) {
            stk__fmt(why, wn,
                     "the index page gives no size in bytes for '%s' (set nginx's "
                     "autoindex_exact_size on, or autoindex_format json)",
                     nm);
            return STK_EFORMAT;
        }
        int rc = add_entry(l, dir, nm, false, v, depth);
        if (rc)
            return rc;
    }
    return STK_OK;
}

/* One index page of directory dir (depth: its entries' depth). */
static int parse_page(lst *l, const char *dir, unsigned depth, const char *body, size_t len,
                      char *why, size_t wn)
{
    const char *t = body;
    while (*t == ' ' || *t == '\n' || *t == '\r' || *t == '\t')
        t++;
    if (*t == '[')
        return parse_json(l, dir, depth, body, len, why, wn);
    if (strstr(body, "<a href="))
        return parse_html(l, dir, depth, body, why, wn);
    stk__fmt(why, wn, "not a directory index page (nginx autoindex on)");
    return STK_EUNSUPPORTED;
}

static void lst_free(lst *l)
{
    for (size_t k = 0; k < l->ndirs; k++)
        stk__free(l->dirs[k]);
    stk__free(l->dirs);
    stk__remote_list_free(l->names, l->sizes, l->n);
    memset(l, 0, sizeof *l);
}

/* Hands the files listed to the caller when rc is STK_OK (else NULL, 0)
 * and frees the rest; returns rc. */
static int lst_give(lst *l, int rc, char ***names, uint64_t **sizes, size_t *n)
{
    *names = rc ? NULL : l->names;
    *sizes = rc ? NULL : l->sizes;
    *n = rc ? 0 : l->n;
    if (!rc) {
        l->names = NULL;
        l->sizes = NULL;
        l->n = 0;
    }
    lst_free(l);
    return rc;
}

int stk__autoindex_page(const char *body, size_t len, char ***names, uint64_t **sizes, size_t *n,
                        size_t *ndirs, char *why, size_t wn)
{
    lst l = {0};
    int rc = parse_page(&l, "", 1, body, len, why, wn);
    *ndirs = rc ? 0 : l.ndirs;
    return lst_give(&l, rc, names, sizes, n);
}

int stk__http_list_tree(stk__remote *r, char ***names, uint64_t **sizes, size_t *n, char *err,
                        size_t errlen)
{
    lst l = {0};
    int rc = STK_OK;
    size_t pages = 0;
    char *root = stk__strdup("");
    if (!root || (rc = stk__grow((void **)&l.dirs, &l.dcap, 1, sizeof *l.dirs))) {
        stk__free(root);
        return STK_ENOMEM;
    }
    l.dirs[l.ndirs++] = root;
    while (!rc && l.next < l.ndirs) {
        const char *dir = l.dirs[l.next++];
        unsigned depth = 0;
        for (const char *c = dir; *c; c++)
            depth += *c == '/';
        char *body = NULL;
        size_t len = 0;
        char where[4096], why[512];
        stk__remote_object_display(r, dir, where, sizeof where);
        if (++pages > MAX_PAGES) {
            stk__fmt(err, errlen, "%s: more than %d index pages below it", r->display, MAX_PAGES);
            rc = STK_EUNSUPPORTED;
            break;
        }
        rc = stk__remote_get_small(r, dir, PAGE_MAX, &body, &len, err, errlen);
        if (rc == STK_ENOENT)
            stk__fmt(err, errlen, "%s: not found (HTTP 404)", where);
        if (rc)
            break;
        rc = parse_page(&l, dir, depth + 1, body, len, why, sizeof why);
        if (rc && rc != STK_ENOMEM)
            stk__fmt(err, errlen, "%s: %s", where, why);
        stk__free(body);
    }
    return lst_give(&l, rc, names, sizes, n);
}
