/*
 * fields.c -- samples with several fields: see fields.h.
 */
#include "fields.h"
#include "options.h"
#include "source/source.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- dtypes and kinds ------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} k_dtypes[] = {
    [STK_DTYPE_UINT8] = {"uint8", 1},     [STK_DTYPE_FLOAT32] = {"float32", 4},
    [STK_DTYPE_FLOAT16] = {"float16", 2}, [STK_DTYPE_BFLOAT16] = {"bfloat16", 2},
    [STK_DTYPE_INT64] = {"int64", 8},     [STK_DTYPE_FLOAT64] = {"float64", 8},
    [STK_DTYPE_INT8] = {"int8", 1},       [STK_DTYPE_INT16] = {"int16", 2},
    [STK_DTYPE_INT32] = {"int32", 4},     [STK_DTYPE_UINT16] = {"uint16", 2},
    [STK_DTYPE_UINT32] = {"uint32", 4},   [STK_DTYPE_UINT64] = {"uint64", 8},
    [STK_DTYPE_BOOL] = {"bool", 1},
};
#define NDTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

size_t stk_dtype_size(int dtype)
{
    return dtype >= 0 && (size_t)dtype < NDTYPES ? k_dtypes[dtype].size : 0;
}

const char *stk_dtype_name(int dtype)
{
    return dtype >= 0 && (size_t)dtype < NDTYPES ? k_dtypes[dtype].name : NULL;
}

static const char *const k_kinds[] = {"auto",  "image", "text",  "json",
                                      "bytes", "int",   "float", "npy"};
#define NKINDS (sizeof k_kinds / sizeof k_kinds[0])

const char *stk_field_kind_name(int kind)
{
    return kind >= 0 && (size_t)kind < NKINDS ? k_kinds[kind] : NULL;
}

int stk_field_kind_parse(const char *name)
{
    if (name)
        for (size_t k = 0; k < NKINDS; k++)
            if (!strcmp(name, k_kinds[k]))
                return (int)k;
    return -1;
}

int stk_field_kind_for_name(const char *name)
{
    static const struct {
        const char *word;
        int kind;
    } words[] = {
        {"jpg", STK_FIELD_IMAGE},  {"jpeg", STK_FIELD_IMAGE}, {"png", STK_FIELD_IMAGE},
        {"webp", STK_FIELD_IMAGE}, {"ppm", STK_FIELD_IMAGE},  {"image", STK_FIELD_IMAGE},
        {"txt", STK_FIELD_TEXT},   {"text", STK_FIELD_TEXT},  {"caption", STK_FIELD_TEXT},
        {"path", STK_FIELD_TEXT},  {"json", STK_FIELD_JSON},  {"cls", STK_FIELD_INT},
        {"cls2", STK_FIELD_INT},   {"index", STK_FIELD_INT},  {"label", STK_FIELD_INT},
        {"npy", STK_FIELD_NPY},
    };
    if (!name)
        return STK_FIELD_BYTES;
    const char *last = strrchr(name, '.');
    last = last ? last + 1 : name;
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
        if (!strcasecmp(last, words[k].word))
            return words[k].kind;
    return STK_FIELD_BYTES;
}

/* ---- options ------------------------------------------------------------------ */

void stk__fspecs_free(stk__fspec *f, size_t n)
{
    if (!f)
        return;
    for (size_t k = 0; k < n; k++) {
        stk__free(f[k].name);
        stk__free(f[k].sources);
        stk__free(f[k].transform);
    }
    stk__free(f);
}

static int fspec_fill(stk__fspec *d, const char *name, size_t name_len, const char *sources,
                      size_t sources_len, const char *transform, int kind, unsigned flags)
{
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->flags = flags;
    if (!(d->name = stk__malloc(name_len + 1)) || !(d->sources = stk__malloc(sources_len + 1)) ||
        (transform && !(d->transform = stk__strdup(transform)))) {
        stk__free(d->name);
        stk__free(d->sources);
        return STK_ENOMEM;
    }
    memcpy(d->name, name, name_len);
    d->name[name_len] = '\0';
    memcpy(d->sources, sources, sources_len);
    d->sources[sources_len] = '\0';
    return STK_OK;
}

int stk__fspecs_copy(stk__fspec **out, const stk__fspec *f, size_t n)
{
    *out = NULL;
    if (!n)
        return STK_OK;
    stk__fspec *c = stk__calloc(n, sizeof *c);
    if (!c)
        return STK_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        if (fspec_fill(&c[k], f[k].name, strlen(f[k].name), f[k].sources, strlen(f[k].sources),
                       f[k].transform, f[k].kind, f[k].flags)) {
            stk__fspecs_free(c, k);
            return STK_ENOMEM;
        }
    }
    *out = c;
    return STK_OK;
}

/* Checks one field before it is added; the reason goes to o->errmsg. */
static int check_field(stk_options *o, const char *name, size_t name_len, const char *sources,
                       size_t sources_len, int kind, const char *transform)
{
    if (!name_len) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "fields: a field needs a name");
        return STK_EINVAL;
    }
    for (size_t k = 0; k < o->nfields; k++) {
        if (strlen(o->fields[k].name) == name_len && !memcmp(o->fields[k].name, name, name_len)) {
            stk__fmt(o->errmsg, sizeof o->errmsg, "fields: '%.*s' is named twice", (int)name_len,
                     name);
            return STK_EINVAL;
        }
    }
    if (o->nfields >= STK__MAX_OUT_FIELDS) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "fields: at most %d fields", STK__MAX_OUT_FIELDS);
        return STK_EINVAL;
    }
    if (kind < 0 || (size_t)kind >= NKINDS) {
        stk__fmt(o->errmsg, sizeof o->errmsg,
                 "fields: '%.*s' has kind %d, which is none (image, text, json, bytes, int, "
                 "float, npy, or auto)",
                 (int)name_len, name, kind);
        return STK_EINVAL;
    }
    size_t alts = 1;
    for (size_t k = 0; k < sources_len; k++)
        alts += sources[k] == ';';
    bool empty_alt = !sources_len || sources[0] == ';' || sources[sources_len - 1] == ';' ||
                     memmem(sources, sources_len, ";;", 2);
    if (empty_alt || alts > STK__MAX_ALTS) {
        stk__fmt(o->errmsg, sizeof o->errmsg,
                 "fields: '%.*s' takes '%.*s': give 1..%d non-empty ';'-separated source "
                 "field names",
                 (int)name_len, name, (int)sources_len, sources, STK__MAX_ALTS);
        return STK_EINVAL;
    }
    if (transform && kind != STK_FIELD_IMAGE &&
        !(kind == STK_FIELD_AUTO && stk_field_kind_for_name(name) == STK_FIELD_IMAGE)) {
        /* An AUTO field's kind is known only at open: its transform is
         * checked there too (stk__fplan_resolve). */
        if (kind != STK_FIELD_AUTO) {
            stk__fmt(o->errmsg, sizeof o->errmsg,
                     "fields: '%.*s' is a %s field; only image fields take a transform",
                     (int)name_len, name, k_kinds[kind]);
            return STK_EINVAL;
        }
    }
    return STK_OK;
}

static int add_field(stk_options *o, const char *name, size_t name_len, const char *sources,
                     size_t sources_len, int kind, const char *transform, unsigned flags)
{
    if (!sources) {
        sources = name;
        sources_len = name_len;
    }
    int rc = check_field(o, name, name_len, sources, sources_len, kind, transform);
    if (rc)
        return rc;
    stk__fspec *grown = stk__realloc(o->fields, (o->nfields + 1) * sizeof *grown);
    if (!grown)
        return STK_ENOMEM;
    o->fields = grown;
    if (fspec_fill(&o->fields[o->nfields], name, name_len, sources, sources_len, transform, kind,
                   flags))
        return STK_ENOMEM;
    o->nfields++;
    return STK_OK;
}

int stk_options_add_field(stk_options *o, const char *name, const char *sources, int kind,
                          const char *transform, unsigned flags)
{
    if (!o)
        return STK_EINVAL;
    o->errmsg[0] = '\0';
    if (!name) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "fields: a field needs a name");
        return STK_EINVAL;
    }
    if (flags & ~STK_FIELD_OPTIONAL) {
        stk__fmt(o->errmsg, sizeof o->errmsg, "fields: '%s': unknown flags 0x%x", name, flags);
        return STK_EINVAL;
    }
    return add_field(o, name, strlen(name), sources, sources ? strlen(sources) : 0, kind, transform,
                     flags);
}

int stk_options_set_fields(stk_options *o, const char *spec)
{
    if (!o)
        return STK_EINVAL;
    o->errmsg[0] = '\0';
    if (!spec || !*spec) {
        stk__fmt(o->errmsg, sizeof o->errmsg,
                 "fields: give NAME[?][=SOURCES][:KIND],... e.g. image=jpg;png,caption=txt");
        return STK_EINVAL;
    }
    size_t before = o->nfields;
    const char *p = spec;
    int rc = STK_OK;
    while (rc == STK_OK) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', n);
        size_t body = colon ? (size_t)(colon - p) : n;
        int kind = STK_FIELD_AUTO;
        if (colon) {
            char word[16];
            size_t wl = n - body - 1;
            stk__fmt(word, sizeof word, "%.*s", (int)(wl < sizeof word ? wl : sizeof word - 1),
                     colon + 1);
            kind = wl < sizeof word ? stk_field_kind_parse(word) : -1;
            if (kind < 0) {
                stk__fmt(o->errmsg, sizeof o->errmsg,
                         "fields: '%.*s' is no kind (image, text, json, bytes, int, float, npy)",
                         (int)wl, colon + 1);
                rc = STK_EINVAL;
                break;
            }
        }
        const char *eq = memchr(p, '=', body);
        size_t name_len = eq ? (size_t)(eq - p) : body;
        unsigned flags = 0;
        if (name_len && p[name_len - 1] == '?') {
            flags = STK_FIELD_OPTIONAL;
            name_len--;
        }
        rc = add_field(o, p, name_len, eq ? eq + 1 : NULL, eq ? body - name_len - 1 - !!flags : 0,
                       kind, NULL, flags);
        if (!end)
            break;
        p = end + 1;
    }
    if (rc) {
        stk__fspec *keep = o->fields;
        for (size_t k = before; k < o->nfields; k++) {
            stk__free(keep[k].name);
            stk__free(keep[k].sources);
            stk__free(keep[k].transform);
        }
        o->nfields = before;
    }
    return rc;
}

/* ---- resolving against a source -------------------------------------------- */

static int find_field(const stk__source *s, const char *name, size_t len)
{
    for (size_t k = 0; k < s->nfields; k++)
        if (strlen(s->fields[k].name) == len && !memcmp(s->fields[k].name, name, len))
            return (int)k;
    return -1;
}

/* "jpg (20000 samples), txt (20000), json (19990)" */
static void list_fields(const stk__source *s, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < s->nfields && used + 1 < n; k++) {
        stk__fmt(buf + used, n - used, "%s%s", k ? ", " : "", s->fields[k].name);
        used += strlen(buf + used);
    }
    if (!s->nfields)
        stk__fmt(buf, n, "none");
}

int stk__fplan_resolve(stk__fplan *plan, const stk__fspec *specs, size_t n, stk__source *src,
                       char *err, size_t errlen)
{
    for (size_t k = 0; k < n; k++) {
        const stk__fspec *sp = &specs[k];
        stk__fplan *p = &plan[k];
        memset(p, 0, sizeof *p);
        p->spec = sp;
        const char *a = sp->sources;
        for (;;) {
            const char *end = strchr(a, ';');
            size_t len = end ? (size_t)(end - a) : strlen(a);
            int id = find_field(src, a, len);
            if (id < 0 && src->ops && src->ops->field_named)
                id = src->ops->field_named(src, a, len);
            if (id >= 0) {
                if (!p->nalt)
                    p->source_name = src->fields[id].name;
                p->alt[p->nalt++] = (uint32_t)id;
            }
            if (!end)
                break;
            a = end + 1;
        }
        if (!p->nalt) {
            char has[512];
            list_fields(src, has, sizeof has);
            stk__fmt(err, errlen,
                     "field '%s': the dataset's samples have no field '%s' (they have: %s)",
                     sp->name, sp->sources, has);
            return STK_EINVAL;
        }
        int kind = sp->kind;
        if (kind == STK_FIELD_AUTO)
            kind = src->fields[p->alt[0]].kind;
        if (kind == STK_FIELD_AUTO)
            kind = stk_field_kind_for_name(p->source_name);
        p->kind = kind;
        if (sp->transform && kind != STK_FIELD_IMAGE) {
            stk__fmt(err, errlen,
                     "field '%s' is a %s field (from '%s'); only image fields take a transform",
                     sp->name, k_kinds[kind], p->source_name);
            return STK_EINVAL;
        }
        /* Keyed by the output name, not the position: adding or moving
         * another field leaves this one's draws as they were. */
        uint64_t h = 0x4649454c44ULL; /* "FIELD" */
        for (const char *q = sp->name; *q; q++)
            h = stk__mix64(h ^ (uint8_t)*q);
        p->rng_salt = stk__mix64(h);
    }
    return STK_OK;
}

/* ---- checks ------------------------------------------------------------------ */

int stk__utf8_check(const uint8_t *p, size_t n, char *err, size_t errlen)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            stk__fmt(err, errlen, "invalid UTF-8 at byte %zu (0x%02x)", i, c);
            return STK_EFORMAT;
        }
        if (len > n - i) {
            stk__fmt(err, errlen, "invalid UTF-8 at byte %zu (a sequence cut short)", i);
            return STK_EFORMAT;
        }
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) {
                stk__fmt(err, errlen, "invalid UTF-8 at byte %zu (0x%02x)", i + k, p[i + k]);
                return STK_EFORMAT;
            }
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            stk__fmt(err, errlen, "invalid UTF-8 at byte %zu (%s)", i,
                     cp < min ? "an overlong encoding" : "no Unicode scalar value");
            return STK_EFORMAT;
        }
        i += len;
    }
    return STK_OK;
}

/* JSON (RFC 8259) syntax: a recursive-descent check with a nesting limit,
 * building nothing (Python builds the values, once per batch). Why not
 * jansson, which the MDS reader links for index.json: the worker only needs
 * "is this valid JSON" per sample, and json_loadb builds (and frees) a tree
 * through its own allocator, outside the memory bound and the allocation
 * fault tests. Measured on this machine (bench in the closing note of issue
 * 20): 1.4 us for a 117-byte caption object and 1.8 us for a 248-byte LAION-
 * style record here, against 12 us and 19 us for json_loadb + json_decref. */
#define JSON_MAX_DEPTH 512

typedef struct jcur {
    const uint8_t *p;
    size_t n, i;
    const char *why;
} jcur;

static void jws(jcur *c)
{
    while (c->i < c->n &&
           (c->p[c->i] == ' ' || c->p[c->i] == '\t' || c->p[c->i] == '\n' || c->p[c->i] == '\r'))
        c->i++;
}

static bool jlit(jcur *c, const char *w)
{
    size_t l = strlen(w);
    if (c->n - c->i < l || memcmp(c->p + c->i, w, l)) {
        c->why = "an unknown word";
        return false;
    }
    c->i += l;
    return true;
}

static bool jdigits(jcur *c)
{
    size_t s = c->i;
    while (c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9')
        c->i++;
    if (c->i == s)
        c->why = "a number without digits";
    return c->i > s;
}

static bool jnumber(jcur *c)
{
    if (c->p[c->i] == '-')
        c->i++;
    if (c->i < c->n && c->p[c->i] == '0')
        c->i++;
    else if (!jdigits(c))
        return false;
    if (c->i < c->n && c->p[c->i] == '.') {
        c->i++;
        if (!jdigits(c))
            return false;
    }
    if (c->i < c->n && (c->p[c->i] == 'e' || c->p[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->p[c->i] == '+' || c->p[c->i] == '-'))
            c->i++;
        if (!jdigits(c))
            return false;
    }
    return true;
}

static bool jstring(jcur *c)
{
    c->i++; /* the opening quote */
    while (c->i < c->n) {
        uint8_t ch = c->p[c->i++];
        if (ch == '"')
            return true;
        if (ch < 0x20) {
            c->why = "a control character in a string";
            return false;
        }
        if (ch == '\\') {
            if (c->i >= c->n)
                break;
            uint8_t e = c->p[c->i++];
            if (e == 'u') {
                for (int k = 0; k < 4; k++, c->i++) {
                    if (c->i >= c->n ||
                        !((c->p[c->i] >= '0' && c->p[c->i] <= '9') ||
                          ((c->p[c->i] | 0x20) >= 'a' && (c->p[c->i] | 0x20) <= 'f'))) {
                        c->why = "a bad \\u escape";
                        return false;
                    }
                }
            } else if (!strchr("\"\\/bfnrt", e) || !e) {
                c->why = "a bad escape";
                return false;
            }
        }
    }
    c->why = "an unterminated string";
    return false;
}

static bool jvalue(jcur *c, int depth)
{
    jws(c);
    if (c->i >= c->n) {
        c->why = "the text ends where a value should be";
        return false;
    }
    uint8_t ch = c->p[c->i];
    if (ch == '"')
        return jstring(c);
    if (ch == '-' || (ch >= '0' && ch <= '9'))
        return jnumber(c);
    if (ch == 't')
        return jlit(c, "true");
    if (ch == 'f')
        return jlit(c, "false");
    if (ch == 'n')
        return jlit(c, "null");
    if (ch != '{' && ch != '[') {
        c->why = "an unexpected character";
        return false;
    }
    if (depth >= JSON_MAX_DEPTH) {
        c->why = "nesting deeper than 512";
        return false;
    }
    uint8_t close = ch == '{' ? '}' : ']';
    c->i++;
    jws(c);
    if (c->i < c->n && c->p[c->i] == close) {
        c->i++;
        return true;
    }
    for (;;) {
        if (close == '}') {
            jws(c);
            if (c->i >= c->n || c->p[c->i] != '"') {
                c->why = "an object key that is not a string";
                return false;
            }
            if (!jstring(c))
                return false;
            jws(c);
            if (c->i >= c->n || c->p[c->i] != ':') {
                c->why = "a missing ':'";
                return false;
            }
            c->i++;
        }
        if (!jvalue(c, depth + 1))
            return false;
        jws(c);
        if (c->i < c->n && c->p[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->i < c->n && c->p[c->i] == close) {
            c->i++;
            return true;
        }
        c->why = close == '}' ? "a missing ',' or '}'" : "a missing ',' or ']'";
        return false;
    }
}

int stk__json_check(const uint8_t *p, size_t n, char *err, size_t errlen)
{
    if (stk__utf8_check(p, n, err, errlen))
        return STK_EFORMAT;
    jcur c = {p, n, 0, NULL};
    if (jvalue(&c, 0)) {
        jws(&c);
        if (c.i == c.n)
            return STK_OK;
        c.why = "text after the value";
    }
    stk__fmt(err, errlen, "invalid JSON at byte %zu: %s", c.i, c.why ? c.why : "bad syntax");
    return STK_EFORMAT;
}

/* The bytes as a terminated string without surrounding whitespace, for
 * strtoll/strtod; false when they do not fit or hold a NUL. */
static bool number_text(const uint8_t *p, size_t n, char *buf, size_t cap)
{
    while (n && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\n' || p[n - 1] == '\r'))
        n--;
    /* strtoll/strtod would skip other leading space (\v, \f) too */
    if (!n || n >= cap || memchr(p, '\0', n) || *p == '\v' || *p == '\f')
        return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return true;
}

int stk__field_int(const uint8_t *p, size_t n, int64_t *out, char *err, size_t errlen)
{
    char buf[32], *end;
    if (number_text(p, n, buf, sizeof buf)) {
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (!*end && errno == 0 && end != buf) {
            *out = v;
            return STK_OK;
        }
    }
    stk__fmt(err, errlen, "is not an integer (%zu bytes: '%.*s')", n, (int)(n < 24 ? n : 24),
             (const char *)p);
    return STK_EFORMAT;
}

int stk__field_float(const uint8_t *p, size_t n, float *out, char *err, size_t errlen)
{
    char buf[64], *end;
    if (number_text(p, n, buf, sizeof buf)) {
        errno = 0;
        double v = strtod(buf, &end);
        if (!*end && end != buf) {
            /* Beyond float32 (or double: ERANGE with HUGE_VAL) is no value of
             * the field's type; only an "inf" written as such is infinite.
             * Values below its range round to zero, as NumPy's do. */
            if (isfinite(v) && fabs(v) > FLT_MAX) {
                stk__fmt(err, errlen, "is out of float32's range (%.*s)", (int)(n < 24 ? n : 24),
                         (const char *)p);
                return STK_EFORMAT;
            }
            if (!(errno == ERANGE && isinf(v))) {
                *out = (float)v;
                return STK_OK;
            }
            stk__fmt(err, errlen, "is out of float32's range (%.*s)", (int)(n < 24 ? n : 24),
                     (const char *)p);
            return STK_EFORMAT;
        }
    }
    stk__fmt(err, errlen, "is not a number (%zu bytes: '%.*s')", n, (int)(n < 24 ? n : 24),
             (const char *)p);
    return STK_EFORMAT;
}

/* ---- .npy ---------------------------------------------------------------------
 * The format (NumPy's numpy/lib/format.py): "\x93NUMPY", major, minor, the
 * header's length (2 bytes little-endian in version 1, 4 in 2 and 3), then a
 * Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }. */

static const char *dict_value(const char *h, const char *key)
{
    const char *k = strstr(h, key);
    if (!k)
        return NULL;
    k += strlen(key);
    while (*k == ' ')
        k++;
    if (*k != ':')
        return NULL;
    k++;
    while (*k == ' ')
        k++;
    return k;
}

static int npy_dtype(const char *d, size_t len)
{
    static const struct {
        const char *code;
        int dtype;
    } codes[] = {{"b1", STK_DTYPE_BOOL},    {"i1", STK_DTYPE_INT8},    {"u1", STK_DTYPE_UINT8},
                 {"i2", STK_DTYPE_INT16},   {"u2", STK_DTYPE_UINT16},  {"i4", STK_DTYPE_INT32},
                 {"u4", STK_DTYPE_UINT32},  {"i8", STK_DTYPE_INT64},   {"u8", STK_DTYPE_UINT64},
                 {"f2", STK_DTYPE_FLOAT16}, {"f4", STK_DTYPE_FLOAT32}, {"f8", STK_DTYPE_FLOAT64}};
    if (len != 3)
        return -1;
    for (size_t k = 0; k < sizeof codes / sizeof codes[0]; k++) {
        if (memcmp(d + 1, codes[k].code, 2))
            continue;
        /* Little-endian, or one byte (no order), as this machine reads them. */
        bool one = codes[k].code[1] == '1';
        if (d[0] == '<' || d[0] == '=' || (d[0] == '|' && one) || (d[0] == '>' && one))
            return codes[k].dtype;
        return -1;
    }
    return -1;
}

int stk__npy_parse(const uint8_t *p, size_t n, stk__npy *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (n < 10 || memcmp(p, "\x93NUMPY", 6)) {
        stk__fmt(err, errlen, "is not a .npy array (no \\x93NUMPY magic)");
        return STK_EFORMAT;
    }
    unsigned major = p[6];
    size_t hlen, hoff;
    if (major == 1) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8;
        hoff = 10;
    } else if ((major == 2 || major == 3) && n >= 12) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        hoff = 12;
    } else {
        stk__fmt(err, errlen, ".npy version %u is not supported (1, 2, 3)", major);
        return STK_EFORMAT;
    }
    if (hlen > n - hoff || hlen > 65536) {
        stk__fmt(err, errlen, ".npy header of %zu bytes runs past the %zu bytes of the array", hlen,
                 n);
        return STK_EFORMAT;
    }
    char h[1024];
    if (hlen >= sizeof h) {
        stk__fmt(err, errlen,
                 ".npy header of %zu bytes is too long (structured dtypes are not "
                 "supported)",
                 hlen);
        return STK_EFORMAT;
    }
    memcpy(h, p + hoff, hlen);
    h[hlen] = '\0';
    if (strlen(h) != hlen) {
        stk__fmt(err, errlen, ".npy header holds a NUL byte");
        return STK_EFORMAT;
    }
    const char *d = dict_value(h, "'descr'");
    const char *fo = dict_value(h, "'fortran_order'");
    const char *sh = dict_value(h, "'shape'");
    if (!d || !fo || !sh || *d != '\'' || *sh != '(') {
        stk__fmt(err, errlen, ".npy header lacks descr, fortran_order or shape");
        return STK_EFORMAT;
    }
    const char *dend = strchr(d + 1, '\'');
    int dtype = dend ? npy_dtype(d + 1, (size_t)(dend - d - 1)) : -1;
    if (dtype < 0) {
        stk__fmt(err, errlen,
                 ".npy dtype %.*s is not supported (bool, int8..int64, uint8..uint64, float16, "
                 "float32, float64, little-endian)",
                 dend ? (int)(dend - d + 1) : 8, d);
        return STK_EFORMAT;
    }
    const char *q = sh + 1;
    unsigned ndim = 0;
    uint64_t count = 1;
    for (;;) {
        while (*q == ' ' || *q == ',')
            q++;
        if (*q == ')')
            break;
        if (*q < '0' || *q > '9' || ndim >= STK_FIELD_MAXDIM) {
            stk__fmt(err, errlen, ".npy shape is not a tuple of at most %d sizes",
                     STK_FIELD_MAXDIM);
            return STK_EFORMAT;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(q, &end, 10);
        if (errno || v > ((uint64_t)1 << 48) || (v && count > UINT64_MAX / v)) {
            stk__fmt(err, errlen, ".npy shape has a size out of range");
            return STK_EFORMAT;
        }
        out->shape[ndim++] = (int64_t)v;
        count *= v;
        q = end;
    }
    bool fortran = !strncmp(fo, "True", 4);
    if (fortran && ndim > 1) {
        stk__fmt(err, errlen, ".npy array in Fortran order is not supported; save it C-ordered");
        return STK_EFORMAT;
    }
    size_t isz = stk_dtype_size(dtype);
    size_t off = hoff + hlen;
    if (count > (n - off) / isz || count * isz != n - off) {
        stk__fmt(err, errlen, ".npy array of shape %s needs %llu data bytes, has %zu", sh,
                 (unsigned long long)(count * isz), n - off);
        return STK_EFORMAT;
    }
    out->dtype = dtype;
    out->ndim = ndim;
    out->data_off = off;
    out->data_len = n - off;
    return STK_OK;
}
