/*
 * url.c -- dataset URLs: telling a URL from a path, the display form without
 * credentials, http(s):// and s3:// parsing (bucket, prefix, endpoint,
 * path- or virtual-hosted addressing, the credentials and region of S3), and
 * object names to request URLs. See remote.h.
 */
#include "io/remote_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The length of p's "scheme://" prefix (RFC 3986: a letter, then letters,
 * digits, '+', '-', '.'), or 0 when p does not start with one. */
size_t stk__url_scheme_len(const char *p)
{
    if (!p || !isalpha((unsigned char)p[0]))
        return 0;
    size_t k = 1;
    while (isalnum((unsigned char)p[k]) || p[k] == '+' || p[k] == '-' || p[k] == '.')
        k++;
    return strncmp(p + k, "://", 3) ? 0 : k + 3;
}

bool stk__is_url(const char *p)
{
    /* Any scheme, so that "ftp://host/ds" is refused as a URL this build
     * does not read rather than looked up as a local path. */
    return stk__url_scheme_len(p) != 0;
}

const char *stk__url_display(const char *url, char *buf, size_t n)
{
    size_t head = stk__url_scheme_len(url);
    if (!head || !n)
        return url;
    /* The authority ends at the first '/', '?' or '#'; what precedes its
     * last '@' is user:password. A query (a presigned URL's X-Amz-Signature,
     * X-Amz-Credential, X-Amz-Security-Token, or any other token) and a
     * fragment are dropped whole: nothing in them is needed to name the
     * dataset. */
    const char *host = url + head, *aend = host;
    while (*aend && *aend != '/' && *aend != '?' && *aend != '#')
        aend++;
    const char *from = host;
    for (const char *p = host; p < aend; p++)
        if (*p == '@')
            from = p + 1;
    size_t rest = strcspn(from, "?#");
    stk__fmt(buf, n, "%.*s%.*s%s", (int)head, url, (int)rest, from, from[rest] ? "?..." : "");
    return buf;
}

char *stk__dupn(const char *s, size_t n)
{
    char *p = stk__malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

char *stk__cat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *p = stk__malloc(la + lb + lc + 1);
    if (p) {
        memcpy(p, a, la);
        memcpy(p + la, b, lb);
        memcpy(p + la + lb, c, lc + 1);
    }
    return p;
}

void stk__pct_encode(const char *s, bool keep_slash, char *out, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    if (!n)
        return;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char ch = *p;
        bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' || ch == '~' ||
                    (keep_slash && ch == '/');
        if (o + (keep ? 1 : 3) >= n)
            break; /* no room: truncated (callers size out at 3 x strlen + 1) */
        if (keep) {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = '\0';
}

/* ---- credentials: the chain itself is in creds.c -------------------------- */

static const char *env(const char *k)
{
    const char *v = getenv(k);
    return v && *v ? v : NULL;
}

static int s3_credentials(stk__remote *r, char *err, size_t errlen)
{
    int rc = stk__creds_open(&r->creds, r->cfg.region, err, errlen);
    if (rc)
        return rc;
    if (!(r->region = stk__strdup(stk__creds_region(r->creds))))
        return STK_ENOMEM;
    stk__cred *k = stk__creds_acquire(r->creds);
    if (k) {
        size_t n = strlen(r->region) + 16;
        if ((r->sigv4 = stk__malloc(n)))
            stk__fmt(r->sigv4, n, "aws:amz:%s:s3", r->region);
        stk__creds_release(r->creds, k);
        if (!r->sigv4)
            return STK_ENOMEM;
    }
    return STK_OK;
}

/* ---- URL parsing ----------------------------------------------------------- */

/* Splits "scheme://[user@]host[:port]/path[?query]": *origin gets
 * "scheme://[user@]host[:port]", *path the rest from '/' (or ""). */
static void split_url(const char *url, const char **authority_end)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    while (*p && *p != '/' && *p != '?')
        p++;
    *authority_end = p;
}

/* A display form (stk__url_display), allocated. */
char *stk__url_display_of(const char *url)
{
    size_t n = strlen(url) + 8;
    char *d = stk__malloc(n);
    if (d && stk__url_display(url, d, n) != d)
        stk__fmt(d, n, "%s", url);
    return d;
}

static bool looks_like_object(const char *last)
{
    return *last && strchr(last, '.') != NULL;
}

int stk__url_parse_http(stk__remote *r, const char *url, char *err, size_t errlen)
{
    const char *aend;
    split_url(url, &aend);
    const char *q = strchr(aend, '?');
    size_t plen = q ? (size_t)(q - url) : strlen(url);
    /* path without query, trailing slashes dropped */
    while (plen > (size_t)(aend - url) && url[plen - 1] == '/')
        plen--;
    const char *last = url + plen;
    while (last > aend && last[-1] != '/')
        last--;
    if (!(r->basename = stk__dupn(last, (size_t)(url + plen - last))))
        return STK_ENOMEM;
    r->names_object = looks_like_object(r->basename);
    if (r->names_object) {
        if (!(r->self_url = stk__strdup(url)) || !(r->base = stk__dupn(url, (size_t)(last - url))))
            return STK_ENOMEM;
    } else {
        if (q) {
            stk__fmt(err, errlen,
                     "%s: a directory URL cannot carry a query string (name one object, or "
                     "drop the query)",
                     r->display);
            return STK_EINVAL;
        }
        char *dir = stk__dupn(url, plen);
        if (!dir)
            return STK_ENOMEM;
        r->base = stk__cat3(dir, "/", "");
        r->self_url = dir;
        if (!r->base)
            return STK_ENOMEM;
    }
    return STK_OK;
}

/* Why b is not a valid S3 bucket name (S3's naming rules), or NULL when it
 * is one. A bucket is pasted into the host name under virtual-host
 * addressing, so anything else (a ':', '@', '?', an uppercase letter) could
 * send the signed request, with its key id and session token, to another
 * host: such names are refused, whatever the addressing. */
static const char *bucket_invalid(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return n < 3 ? "shorter than 3 characters" : "longer than 63 characters";
    for (size_t k = 0; k < n; k++) {
        char c = b[k];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'))
            return "it holds a character other than a-z, 0-9, '.' and '-'";
    }
    if (!isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
        return "it does not begin and end with a letter or digit";
    if (strstr(b, ".."))
        return "it holds two adjacent dots";
    /* Four dot-separated groups of digits: an IP address, which virtual-host
     * addressing would turn into the host itself. */
    unsigned groups = 1;
    bool digits = true;
    for (size_t k = 0; k < n; k++) {
        if (b[k] == '.')
            groups++;
        else if (!isdigit((unsigned char)b[k]))
            digits = false;
    }
    if (digits && groups == 4)
        return "it has the form of an IP address";
    return NULL;
}

int stk__url_parse_s3(stk__remote *r, const char *url, char *err, size_t errlen)
{
    const char *b = url + 5;
    const char *slash = strchr(b, '/');
    size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    if (!blen) {
        stk__fmt(err, errlen, "%s: an s3:// URL needs a bucket (s3://BUCKET/PREFIX)", url);
        return STK_EINVAL;
    }
    if (!(r->bucket = stk__dupn(b, blen)))
        return STK_ENOMEM;
    const char *why = bucket_invalid(r->bucket);
    if (why) {
        /* The bucket as the display form shows it (no user:password@, no
         * query), so the message never echoes a secret. */
        const char *db = r->display + 5;
        stk__fmt(err, errlen,
                 "%s: \"%.*s\" is not a valid S3 bucket name: %s (bucket names are 3 to 63 "
                 "lowercase letters, digits, dots and hyphens, beginning and ending with a "
                 "letter or digit)",
                 r->display, (int)strcspn(db, "/"), db, why);
        return STK_EINVAL;
    }
    const char *key = slash ? slash + 1 : "";
    size_t klen = strlen(key);
    while (klen && key[klen - 1] == '/')
        klen--;
    const char *last = key + klen;
    while (last > key && last[-1] != '/')
        last--;
    if (!(r->basename = stk__dupn(last, (size_t)(key + klen - last))))
        return STK_ENOMEM;
    r->names_object = looks_like_object(r->basename);
    /* prefix: the "directory" objects are named under. */
    size_t dirlen = r->names_object ? (size_t)(last - key) : klen;
    char *dir = stk__dupn(key, dirlen);
    if (!dir)
        return STK_ENOMEM;
    r->prefix = (dirlen && dir[dirlen - 1] != '/') ? stk__cat3(dir, "/", "") : stk__strdup(dir);
    stk__free(dir);
    if (!r->prefix)
        return STK_ENOMEM;

    int rc = s3_credentials(r, err, errlen);
    if (rc)
        return rc;
    const char *ep =
        r->cfg.endpoint && *r->cfg.endpoint ? r->cfg.endpoint : env("AWS_ENDPOINT_URL_S3");
    if (!ep)
        ep = env("AWS_ENDPOINT_URL");
    char host[1024];
    bool custom = ep != NULL;
    if (!ep) {
        stk__fmt(host, sizeof host, "https://s3.%s.amazonaws.com", r->region);
        ep = host;
    }
    if (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)) {
        stk__fmt(err, errlen, "S3 endpoint '%s' must start with http:// or https://", ep);
        return STK_EINVAL;
    }
    size_t elen = strlen(ep);
    while (elen && ep[elen - 1] == '/')
        elen--;
    char *epc = stk__dupn(ep, elen);
    if (!epc)
        return STK_ENOMEM;
    bool virt =
        r->cfg.addressing == 2 || (r->cfg.addressing == 0 && !custom && !strchr(r->bucket, '.'));
    char enc_bucket[512];
    stk__pct_encode(r->bucket, false, enc_bucket, sizeof enc_bucket);
    if (virt) {
        const char *sep = strstr(epc, "://") + 3;
        size_t schemelen = (size_t)(sep - epc);
        char *origin = stk__malloc(elen + blen + 8);
        if (!origin) {
            stk__free(epc);
            return STK_ENOMEM;
        }
        memcpy(origin, epc, schemelen);
        stk__fmt(origin + schemelen, elen + blen + 8 - schemelen, "%s.%s", r->bucket, sep);
        r->list_url = stk__cat3(origin, "/", "");
        stk__free(origin);
    } else {
        /* Path-style: the bucket's URL has no trailing slash (the canonical
         * URI servers sign for a listing is "/bucket"). */
        r->list_url = stk__cat3(epc, "/", enc_bucket);
    }
    stk__free(epc);
    if (!r->list_url)
        return STK_ENOMEM;
    char enc_prefix[4096];
    stk__pct_encode(r->prefix, true, enc_prefix, sizeof enc_prefix);
    bool ends_slash = r->list_url[strlen(r->list_url) - 1] == '/';
    if (!(r->base = stk__cat3(r->list_url, ends_slash ? "" : "/", enc_prefix)))
        return STK_ENOMEM;
    char enc_key[4096];
    stk__pct_encode(r->basename, true, enc_key, sizeof enc_key);
    if (!(r->self_url = r->names_object ? stk__cat3(r->base, enc_key, "") : stk__strdup(r->base)))
        return STK_ENOMEM;
    (void)err;
    (void)errlen;
    return STK_OK;
}

const char *stk__remote_display(const stk__remote *r)
{
    return r->display;
}

bool stk__remote_names_object(const stk__remote *r)
{
    return r->names_object;
}

const char *stk__remote_basename(const stk__remote *r)
{
    return r->basename;
}

void stk__remote_object_display(const stk__remote *r, const char *name, char *buf, size_t n)
{
    if (!*name) {
        stk__fmt(buf, n, "%s", r->display);
        return;
    }
    if (r->scheme == SCHEME_S3) {
        stk__fmt(buf, n, "s3://%s/%s%s", r->bucket, r->prefix, name);
        return;
    }
    /* The display URL's directory + name. */
    const char *d = r->display;
    size_t dl = strlen(d);
    if (r->names_object) {
        const char *s = strrchr(d, '/');
        dl = s ? (size_t)(s - d) : dl;
    }
    stk__fmt(buf, n, "%.*s/%s", (int)dl, d, name);
}

void stk__remote_object_id(const stk__remote *r, const char *name, char *buf, size_t n)
{
    if (r->scheme != SCHEME_S3) {
        stk__remote_object_display(r, name, buf, n);
        return;
    }
    if (!*name) {
        stk__fmt(buf, n, "%s", r->self_url);
        return;
    }
    char enc[8192];
    stk__pct_encode(name, true, enc, sizeof enc);
    stk__fmt(buf, n, "%s%s", r->base, enc);
}

/* The request URL of object name (malloc'd). */
char *stk__object_url(const stk__remote *r, const char *name)
{
    if (!*name)
        return stk__strdup(r->self_url);
    size_t n = strlen(name) * 3 + 1;
    char *enc = stk__malloc(n);
    if (!enc)
        return NULL;
    stk__pct_encode(name, true, enc, n);
    char *u = stk__cat3(r->base, enc, "");
    stk__free(enc);
    return u;
}
