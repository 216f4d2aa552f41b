/*
 * s3list.c -- listing an S3 prefix (ListObjectsV2 with continuation tokens)
 * and the little of S3's XML stoker reads: a listing page's keys and sizes,
 * an error body's code and message, character entities. See remote.h.
 */
#include "io/remote_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void stk__xml_unescape(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        if (*r != '&') {
            *w++ = *r++;
            continue;
        }
        /* The longest entity decoded is "&#1114111;" (10 bytes): looking no
         * further for its ';' keeps a run of lone '&' linear. */
        const char *semi = memchr(r, ';', strnlen(r, 16));
        size_t k = semi ? (size_t)(semi - r) : 0;
        unsigned long cp = 0;
        bool ok = true;
        if (k == 4 && !strncmp(r, "&amp", 4))
            cp = '&';
        else if (k == 3 && !strncmp(r, "&lt", 3))
            cp = '<';
        else if (k == 3 && !strncmp(r, "&gt", 3))
            cp = '>';
        else if (k == 5 && !strncmp(r, "&quot", 5))
            cp = '"';
        else if (k == 5 && !strncmp(r, "&apos", 5))
            cp = '\'';
        else if (k > 2 && r[1] == '#') {
            /* Digits only: strtoul alone would also take blanks and a sign
             * ("&#-4294967295;" would wrap to 1). Surrogates are no
             * characters, and NUL would cut the string short. */
            bool hex = r[2] == 'x';
            const char *d = r + (hex ? 3 : 2);
            char *end = NULL;
            ok = hex ? isxdigit((unsigned char)*d) : isdigit((unsigned char)*d);
            if (ok)
                cp = strtoul(d, &end, hex ? 16 : 10);
            ok = ok && end == semi && cp > 0 && cp < 0x110000 && (cp < 0xD800 || cp > 0xDFFF);
        } else
            ok = false;
        if (!ok) {
            *w++ = *r++;
            continue;
        }
        /* UTF-8 encode cp. */
        if (cp < 0x80) {
            *w++ = (char)cp;
        } else if (cp < 0x800) {
            *w++ = (char)(0xC0 | (cp >> 6));
            *w++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            *w++ = (char)(0xE0 | (cp >> 12));
            *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
            *w++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *w++ = (char)(0xF0 | (cp >> 18));
            *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
            *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
            *w++ = (char)(0x80 | (cp & 0x3F));
        }
        r = semi + 1;
    }
    *w = '\0';
}

void stk__s3_error_text(const char *body, char *out, size_t n)
{
    char code[128] = "", msg[256] = "";
    const char *a = strstr(body, "<Code>"), *b = a ? strstr(a, "</Code>") : NULL;
    if (a && b)
        stk__fmt(code, sizeof code, "%.*s", (int)(b - a - 6), a + 6);
    a = strstr(body, "<Message>");
    b = a ? strstr(a, "</Message>") : NULL;
    if (a && b)
        stk__fmt(msg, sizeof msg, "%.*s", (int)(b - a - 9), a + 9);
    if (code[0])
        stk__fmt(out, n, " %s%s%s", code, msg[0] ? ": " : "", msg);
    else
        out[0] = '\0';
}

/* ---- listing ------------------------------------------------------------- */

/* memmem over [from, end): every search stays inside the body given, which
 * need not be NUL-terminated. */
static const char *find(const char *from, const char *end, const char *needle)
{
    if (from >= end)
        return NULL;
    return memmem(from, (size_t)(end - from), needle, strlen(needle));
}

/* The unescaped text of the first <tag>...</tag> inside [from, end), both
 * tags included in the range. *v is NULL when there is none. */
static int xml_field(const char *from, const char *end, const char *tag, char **v)
{
    char open[64], close[64];
    stk__fmt(open, sizeof open, "<%s>", tag);
    stk__fmt(close, sizeof close, "</%s>", tag);
    *v = NULL;
    const char *a = find(from, end, open);
    if (!a)
        return STK_OK;
    a += strlen(open);
    const char *b = find(a, end, close);
    if (!b)
        return STK_OK;
    if (!(*v = stk__dupn(a, (size_t)(b - a))))
        return STK_ENOMEM;
    stk__xml_unescape(*v);
    return STK_OK;
}

int stk__s3_list_page(const char *body, size_t len, const char *prefix, char ***names,
                      uint64_t **sizes, size_t *n, size_t *cap, bool *more, char **token, char *err,
                      size_t errlen)
{
    int rc = STK_OK;
    char *key = NULL, *size = NULL, *trunc = NULL;
    size_t plen = strlen(prefix);
    *more = false;
    *token = NULL;
    /* XML has no NUL characters: the body ends at the first one, as it did
     * when this was parsed with the string functions. */
    const char *end = body + strnlen(body, len);
    for (const char *p = find(body, end, "<Contents>"); p; p = find(p, end, "<Contents>")) {
        const char *ce = find(p, end, "</Contents>");
        if (!ce)
            break;
        if ((rc = xml_field(p, ce, "Key", &key)) || (rc = xml_field(p, ce, "Size", &size)))
            goto nomem;
        p = ce;
        if (!key || !size || strncmp(key, prefix, plen) || !key[plen]) {
            stk__free(key);
            stk__free(size);
            key = size = NULL;
            continue;
        }
        if (*n == *cap) {
            /* Two arrays of one length: *cap is what both hold (a names array
             * grown when sizes then failed is just larger than it says). */
            size_t nc = *cap, sc = *cap;
            if (stk__grow((void **)names, &nc, *n + 1, sizeof **names) ||
                stk__grow((void **)sizes, &sc, *n + 1, sizeof **sizes))
                goto nomem;
            *cap = nc < sc ? nc : sc;
        }
        /* A size that is not a plain decimal number would otherwise read as 0
         * or, for "-1", as 2^64 - 1. */
        char *se = NULL;
        errno = 0;
        unsigned long long sz = isdigit((unsigned char)size[0]) ? strtoull(size, &se, 10) : 0;
        if (!se || *se || errno) {
            stk__fmt(err, errlen, "object \"%s\" has a <Size> that is not a number: \"%.40s\"", key,
                     size);
            rc = STK_EFORMAT;
            goto out;
        }
        (*names)[*n] = stk__strdup(key + plen);
        (*sizes)[*n] = sz;
        stk__free(key);
        stk__free(size);
        key = size = NULL;
        if (!(*names)[*n])
            goto nomem;
        (*n)++;
    }
    if ((rc = xml_field(body, end, "IsTruncated", &trunc)))
        goto nomem;
    *more = trunc && !strcmp(trunc, "true");
    if (*more && (rc = xml_field(body, end, "NextContinuationToken", token)))
        goto nomem;
    /* An empty token would ask for the first page again, forever. */
    if (*more && (!*token || !**token)) {
        stk__fmt(err, errlen,
                 "the server said the list is truncated but gave no continuation token");
        rc = STK_EFORMAT;
    }
    goto out;
nomem:
    stk__fmt(err, errlen, "out of memory");
    rc = STK_ENOMEM;
out:
    stk__free(key);
    stk__free(size);
    stk__free(trunc);
    return rc;
}

void stk__remote_list_free(char **names, uint64_t *sizes, size_t n)
{
    for (size_t k = 0; k < n; k++)
        stk__free(names[k]);
    stk__free(names);
    stk__free(sizes);
}

/* Lists the prefix's objects: those directly under it, or (tree) every
 * object below it, in any subfolder (no delimiter). */
static int list(stk__remote *r, bool tree, char ***names_out, uint64_t **sizes_out, size_t *n_out,
                char *err, size_t errlen)
{
    if (r->scheme != SCHEME_S3) {
        stk__fmt(err, errlen,
                 "%s: plain HTTP servers cannot be listed; the directory needs a "
                 "stoker.manifest (stoker pack writes one), or name the shards with a brace "
                 "pattern such as train-{000000..000099}.stk",
                 r->display);
        return STK_EUNSUPPORTED;
    }
    int rc = STK_OK;
    char **names = NULL;
    uint64_t *sizes = NULL;
    size_t n = 0, cap = 0;
    char *token = NULL, *url = NULL;
    uint64_t *seen = NULL; /* hashes of the continuation tokens followed */
    size_t nseen = 0, seen_cap = 0;
    stk__req q;
    memset(&q, 0, sizeof q);
    size_t enc_cap = 3 * strlen(r->prefix) + 1;
    char *enc_prefix = stk__malloc(enc_cap);
    if (!enc_prefix)
        return STK_ENOMEM;
    stk__pct_encode(r->prefix, false, enc_prefix, enc_cap);
    for (;;) {
        /* Query parameters sorted by name, values percent-encoded with '/' as
         * %2F: libcurl 7.88 signs the query as given. */
        size_t tcap = token ? 3 * strlen(token) + 1 : 1;
        char *enc_token = stk__malloc(tcap);
        size_t ucap = strlen(r->list_url) + enc_cap + tcap + 96;
        url = stk__malloc(ucap);
        if (!enc_token || !url) {
            stk__free(enc_token);
            rc = STK_ENOMEM;
            goto out;
        }
        if (token) {
            stk__pct_encode(token, false, enc_token, tcap);
            stk__fmt(url, ucap, "%s?continuation-token=%s%s&list-type=2&prefix=%s", r->list_url,
                     enc_token, tree ? "" : "&delimiter=%2F", enc_prefix);
        } else {
            stk__fmt(url, ucap, "%s?%slist-type=2&prefix=%s", r->list_url,
                     tree ? "" : "delimiter=%2F&", enc_prefix);
        }
        stk__free(enc_token);
        memset(&q, 0, sizeof q);
        q.fd = -1;
        q.max_bytes = 64u << 20;
        q.raw_url = url;
        stk__remote_submit(r, &q);
        if ((rc = stk__remote_wait(r, &q))) {
            stk__fmt(err, errlen, "listing s3://%s/%s: %s", r->bucket, r->prefix, q.err);
            goto out;
        }
        stk__free(url);
        url = NULL;
        const char *body = q.body ? (const char *)q.body : "";
        bool more;
        char why[256];
        stk__free(token);
        rc = stk__s3_list_page(body, q.body ? (size_t)q.got : 0, r->prefix, &names, &sizes, &n,
                               &cap, &more, &token, why, sizeof why);
        stk__free(q.body);
        q.body = NULL;
        if (rc) {
            stk__fmt(err, errlen, "listing s3://%s/%s: %s", r->bucket, r->prefix, why);
            goto out;
        }
        if (!more)
            break;
        /* A token seen before would list the same pages again, forever
         * (a server that ignores the token, or pages that cycle). Tokens are
         * remembered by a 64-bit hash: one page per token, so few. */
        uint64_t h = (uint64_t)XXH3_64bits(token, strlen(token));
        for (size_t k = 0; k < nseen; k++)
            if (seen[k] == h) {
                stk__fmt(err, errlen,
                         "listing s3://%s/%s: the server gave the continuation token of an "
                         "earlier page again (page %zu), so the listing would never end; the "
                         "server does not follow ListObjectsV2's continuation-token",
                         r->bucket, r->prefix, nseen + 1);
                rc = STK_EFORMAT;
                goto out;
            }
        if ((rc = stk__grow((void **)&seen, &seen_cap, nseen + 1, sizeof *seen)))
            goto out;
        seen[nseen++] = h;
    }
out:
    stk__free(seen);
    stk__free(q.body);
    stk__free(url);
    stk__free(token);
    stk__free(enc_prefix);
    if (rc) {
        stk__remote_list_free(names, sizes, n);
        return rc;
    }
    *names_out = names;
    *sizes_out = sizes;
    *n_out = n;
    return rc;
}

int stk__remote_list(stk__remote *r, char ***names, uint64_t **sizes, size_t *n, char *err,
                     size_t errlen)
{
    return list(r, false, names, sizes, n, err, errlen);
}

int stk__remote_list_tree(stk__remote *r, char ***names, uint64_t **sizes, size_t *n, char *err,
                          size_t errlen)
{
    if (r->scheme != SCHEME_S3)
        return stk__http_list_tree(r, names, sizes, n, err, errlen);
    return list(r, true, names, sizes, n, err, errlen);
}
