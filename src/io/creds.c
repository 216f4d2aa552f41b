/*
 * creds.c -- the S3 credential chain and its refresh. See creds.h.
 *
 * The providers that ask a server (STS, the container endpoint, the instance
 * metadata service) use one libcurl easy handle per request, with short
 * timeouts, no redirects, and an answer kept in a bounded buffer and parsed
 * strictly: a malformed or oversized answer is an error, never a partial key.
 */
#include "io/creds.h"

#include "io/remote.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

enum {
    REFRESH_WINDOW_S = 300,     /* refresh this long before a known expiry */
    PROACTIVE_EVERY_NS = 10000, /* ms: at most one proactive try per 10 s */
    FORCED_EVERY_NS = 1000,     /* ms: at most one forced try per second */
    ANSWER_MAX = 32768,         /* bytes of a provider's answer */
    FIELD_MAX = 4096,           /* bytes of one key, secret or token */
};

struct stk__creds {
    pthread_mutex_t lock;
    stk__cred *cur; /* holds one reference; NULL: unsigned requests */
    char *region;   /* set at open, then read-only */
    uint64_t gen;
    uint64_t last_try_ns; /* last refresh attempt (0: none) */
    int last_rc;
    bool refreshing;
    char last_err[320];
    atomic_bool cancel; /* relaxed is enough: it only cuts a transfer short */
};

/* ---- small helpers ------------------------------------------------------ */

static const char *env(const char *k)
{
    const char *v = getenv(k);
    return v && *v ? v : NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

static void wipe_free(char *s)
{
    if (!s)
        return;
    volatile char *v = s;
    while (*v)
        *v++ = 0;
    stk__free(s);
}

static void cred_free(stk__cred *k)
{
    if (!k)
        return;
    stk__free(k->key_id);
    wipe_free(k->secret);
    wipe_free(k->token);
    stk__free(k);
}

static int cred_new(stk__cred **out, const char *key_id, const char *secret, const char *token,
                    int64_t expires, const char *source)
{
    stk__cred *k = stk__calloc(1, sizeof *k);
    if (!k)
        return STK_ENOMEM;
    k->key_id = stk__strdup(key_id);
    k->secret = stk__strdup(secret);
    k->token = token && *token ? stk__strdup(token) : NULL;
    k->expires = expires;
    k->source = source;
    k->refs = 1;
    if (!k->key_id || !k->secret || (token && *token && !k->token)) {
        cred_free(k);
        return STK_ENOMEM;
    }
    *out = k;
    return STK_OK;
}

/* Looks up key in [section] of an INI-style AWS file; returns a copy or NULL.
 * *has_section (when given) says whether the section exists at all; key NULL
 * only asks that. Out of memory sets *rc to STK_ENOMEM (else *rc is kept), so
 * that a failed allocation never reads as "no such key". */
static char *ini_get(const char *path, const char *section, const char *key, bool *has_section,
                     int *rc)
{
    if (has_section)
        *has_section = false;
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char line[8192]; /* a session token line can be a few KiB */
    bool in = false;
    char *val = NULL;
    while (!val && fgets(line, sizeof line, f)) {
        char *t = trim(line);
        if (*t == '#' || *t == ';' || !*t)
            continue;
        if (*t == '[') {
            char *e = strchr(t, ']');
            if (e) {
                *e = '\0';
                in = !strcmp(trim(t + 1), section);
                if (in && has_section)
                    *has_section = true;
            }
            continue;
        }
        if (!in)
            continue;
        char *eq = strchr(t, '=');
        if (!eq)
            continue;
        *eq = '\0';
        if (key && !strcmp(trim(t), key) && !(val = stk__strdup(trim(eq + 1)))) {
            *rc = STK_ENOMEM;
            break;
        }
    }
    fclose(f);
    return val;
}

static void aws_file(const char *envname, const char *leaf, char *buf, size_t n)
{
    const char *p = env(envname);
    if (p) {
        stk__fmt(buf, n, "%s", p);
        return;
    }
    const char *home = env("HOME");
    stk__fmt(buf, n, "%s/.aws/%s", home ? home : "", leaf);
}

/* The profile and the two files it may live in. */
typedef struct profile {
    const char *name;
    bool named; /* AWS_PROFILE was set: the profile must exist */
    char cred[4096], conf[4096], section[512];
} profile;

static void profile_init(profile *p)
{
    p->name = env("AWS_PROFILE");
    p->named = p->name != NULL;
    if (!p->name)
        p->name = "default";
    aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", p->cred, sizeof p->cred);
    aws_file("AWS_CONFIG_FILE", "config", p->conf, sizeof p->conf);
    if (!strcmp(p->name, "default"))
        stk__fmt(p->section, sizeof p->section, "default");
    else
        stk__fmt(p->section, sizeof p->section, "profile %s", p->name);
}

/* Reads a small secret file (a web identity or authorization token) into out,
 * trailing white space removed. */
static int read_token_file(const char *what, const char *path, char *out, size_t n, char *err,
                           size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        stk__fmt(err, errlen, "%s '%s': cannot open: %s", what, path, strerror(errno));
        return STK_EINVAL;
    }
    size_t got = fread(out, 1, n - 1, f);
    bool more = got == n - 1 && fgetc(f) != EOF;
    bool bad = ferror(f) != 0;
    fclose(f);
    out[got] = '\0';
    if (bad || more || strlen(out) != got) {
        stk__fmt(err, errlen, "%s '%s': %s", what, path,
                 bad    ? "cannot read it"
                 : more ? "larger than a token can be"
                        : "not a text token");
        return STK_EINVAL;
    }
    char *t = trim(out);
    memmove(out, t, strlen(t) + 1);
    if (!*out || strpbrk(out, "\r\n")) {
        stk__fmt(err, errlen, "%s '%s': %s", what, path,
                 *out ? "the token spans several lines" : "the file is empty");
        return STK_EINVAL;
    }
    return STK_OK;
}

/* ---- strict parsers for the providers' answers ---------------------------- */

static const char *json_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A JSON string at p (on its '"'): decoded into out (n bytes; out NULL:
 * skipped). Returns the position after the closing quote, or NULL when
 * malformed; *fit is false when it did not fit in out. */
static const char *json_str(const char *p, const char *e, char *out, size_t n, bool *fit)
{
    size_t o = 0;
    *fit = true;
    if (p >= e || *p != '"')
        return NULL;
    for (p++; p < e; p++) {
        unsigned char ch = (unsigned char)*p;
        char buf[4];
        size_t bl = 1;
        if (ch == '"') {
            if (out)
                out[o < n ? o : n - 1] = '\0';
            return p + 1;
        }
        if (ch < 0x20)
            return NULL;
        buf[0] = (char)ch;
        if (ch == '\\') {
            if (++p >= e)
                return NULL;
            switch (*p) {
            case '"': buf[0] = '"'; break;
            case '\\': buf[0] = '\\'; break;
            case '/': buf[0] = '/'; break;
            case 'b': buf[0] = '\b'; break;
            case 'f': buf[0] = '\f'; break;
            case 'n': buf[0] = '\n'; break;
            case 'r': buf[0] = '\r'; break;
            case 't': buf[0] = '\t'; break;
            case 'u': {
                unsigned cp = 0;
                for (int k = 1; k <= 4; k++) {
                    int h = p + k < e ? hexval(p[k]) : -1;
                    if (h < 0)
                        return NULL;
                    cp = cp * 16 + (unsigned)h;
                }
                p += 4;
                if (cp >= 0xD800 && cp <= 0xDFFF)
                    return NULL; /* no surrogates in what credentials hold */
                if (cp < 0x80) {
                    buf[0] = (char)cp;
                } else if (cp < 0x800) {
                    buf[0] = (char)(0xC0 | (cp >> 6));
                    buf[1] = (char)(0x80 | (cp & 0x3F));
                    bl = 2;
                } else {
                    buf[0] = (char)(0xE0 | (cp >> 12));
                    buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    buf[2] = (char)(0x80 | (cp & 0x3F));
                    bl = 3;
                }
                break;
            }
            default: return NULL;
            }
        }
        if (out) {
            if (o + bl >= n) {
                *fit = false;
                o = n; /* keep scanning for the end, store nothing more */
            } else {
                memcpy(out + o, buf, bl);
                o += bl;
            }
        }
    }
    return NULL;
}

/* Skips one JSON value; NULL when malformed or nested too deep. */
static const char *json_skip(const char *p, const char *e, int depth)
{
    bool fit;
    p = json_ws(p, e);
    if (p >= e || depth > 16)
        return NULL;
    if (*p == '"')
        return json_str(p, e, NULL, 0, &fit);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = json_ws(p + 1, e);
        if (p < e && *p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (!(p = json_str(json_ws(p, e), e, NULL, 0, &fit)))
                    return NULL;
                p = json_ws(p, e);
                if (p >= e || *p != ':')
                    return NULL;
                p++;
            }
            if (!(p = json_skip(p, e, depth + 1)))
                return NULL;
            p = json_ws(p, e);
            if (p < e && *p == ',') {
                p++;
                continue;
            }
            return p < e && *p == close ? p + 1 : NULL;
        }
    }
    const char *s = p;
    while (p < e && (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.'))
        p++;
    return p > s ? p : NULL;
}

int stk__json_string(const char *body, size_t len, const char *key, char *out, size_t n)
{
    const char *e = body + strnlen(body, len), *p = json_ws(body, e);
    int found = 0;
    bool fit;
    if (!n || p >= e || *p != '{')
        return -1;
    out[0] = '\0';
    p = json_ws(p + 1, e);
    if (p < e && *p == '}') {
        p++;
    } else {
        for (;;) {
            char name[128];
            if (!(p = json_str(json_ws(p, e), e, name, sizeof name, &fit)))
                return -1;
            p = json_ws(p, e);
            if (p >= e || *p != ':')
                return -1;
            p = json_ws(p + 1, e);
            if (fit && !strcmp(name, key)) {
                if (found || p >= e || *p != '"')
                    return -1; /* a repeated key, or not a string */
                if (!(p = json_str(p, e, out, n, &fit)) || !fit)
                    return -1;
                found = 1;
            } else if (!(p = json_skip(p, e, 1))) {
                return -1;
            }
            p = json_ws(p, e);
            if (p < e && *p == ',') {
                p++;
                continue;
            }
            if (p >= e || *p != '}')
                return -1;
            p++;
            break;
        }
    }
    return json_ws(p, e) == e ? found : -1;
}

int64_t stk__iso8601(const char *s)
{
    int y, mo, d, h, mi, sec, used = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
        used != 19)
        return -1;
    const char *p = s + used;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return -1;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (strcmp(p, "Z") && strcmp(p, "+00:00") && strcmp(p, "+0000"))
        return -1;
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = sec};
    return (int64_t)timegm(&tm);
}

/* <tag>value</tag> inside [from, end of body): 1 found (copied, entities
 * decoded), 0 absent, -1 unterminated or too long. */
static int xml_get(const char *from, const char *tag, char *out, size_t n)
{
    char open[64], close[64];
    stk__fmt(open, sizeof open, "<%s>", tag);
    stk__fmt(close, sizeof close, "</%s>", tag);
    const char *a = strstr(from, open);
    if (!a)
        return 0;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b || (size_t)(b - a) >= n)
        return -1;
    memcpy(out, a, (size_t)(b - a));
    out[b - a] = '\0';
    stk__xml_unescape(out);
    return 1;
}

/* ---- small HTTP requests ------------------------------------------------ */

typedef struct answer {
    char buf[ANSWER_MAX];
    size_t len;
    bool over;
} answer;

static size_t on_answer(char *p, size_t sz, size_t nm, void *ud)
{
    answer *a = ud;
    size_t n = sz * nm;
    if (n >= sizeof a->buf - a->len) {
        a->over = true;
        return 0;
    }
    memcpy(a->buf + a->len, p, n);
    a->len += n;
    a->buf[a->len] = '\0';
    return n;
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    return atomic_load_explicit((atomic_bool *)ud, memory_order_relaxed) ? 1 : 0;
}

/* One request (direct: bypassing any proxy). STK_OK when the server answered (any status; the
 * answer is in a, NUL-terminated), STK_EIO when it could not be reached or the answer was too large
 * (why says which), STK_ENOMEM. No secret goes into why. */
static int http_small(stk__creds *c, const char *method, const char *url,
                      const char *const *headers, const char *post, bool direct, long timeout_ms,
                      answer *a, long *status, char *why, size_t whylen)
{
    int rc = STK_OK;
    struct curl_slist *h = NULL;
    CURL *e = curl_easy_init();
    a->len = 0;
    a->buf[0] = '\0';
    a->over = false;
    *status = 0;
    if (!e)
        return STK_ENOMEM;
    for (size_t k = 0; headers && headers[k]; k++) {
        struct curl_slist *t = curl_slist_append(h, headers[k]);
        if (!t) {
            rc = STK_ENOMEM;
            goto out;
        }
        h = t;
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_answer);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, &c->cancel);
    /* The metadata services are local to the machine or the pod: a proxy
     * must never see them (STS may need one, as for S3). */
    if (direct)
        curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    if (h)
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (post)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, post);
    else if (strcmp(method, "GET"))
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    CURLcode res = curl_easy_perform(e);
    if (res == CURLE_WRITE_ERROR && a->over) {
        stk__fmt(why, whylen, "the answer is larger than %d bytes", ANSWER_MAX);
        rc = STK_EIO;
    } else if (res == CURLE_ABORTED_BY_CALLBACK) {
        stk__fmt(why, whylen, "cancelled: the loader is closing");
        rc = STK_EIO;
    } else if (res != CURLE_OK) {
        stk__fmt(why, whylen, "%s", curl_easy_strerror(res));
        rc = STK_EIO;
    } else {
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    }
out:
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return rc;
}

/* A header line "Name: value" in a bounded buffer; refuses values that
 * would split the header. */
static bool header_line(char *out, size_t n, const char *name, const char *value)
{
    if (strpbrk(value, "\r\n") || strlen(name) + strlen(value) + 3 > n)
        return false;
    stk__fmt(out, n, "%s: %s", name, value);
    return true;
}

/* Reads AccessKeyId, SecretAccessKey, the token field and Expiration from a
 * JSON answer (container endpoint, instance metadata). */
static int cred_from_json(stk__cred **out, const answer *a, const char *token_key,
                          const char *source, const char *what, char *err, size_t errlen)
{
    int rc = STK_OK;
    char *ak = stk__malloc(FIELD_MAX), *sk = stk__malloc(FIELD_MAX), *tk = stk__malloc(FIELD_MAX);
    char exp[64] = "", code[64] = "";
    if (!ak || !sk || !tk) {
        rc = STK_ENOMEM;
        goto out;
    }
    int v1 = stk__json_string(a->buf, a->len, "AccessKeyId", ak, FIELD_MAX);
    int v2 = stk__json_string(a->buf, a->len, "SecretAccessKey", sk, FIELD_MAX);
    int v3 = stk__json_string(a->buf, a->len, token_key, tk, FIELD_MAX);
    int v4 = stk__json_string(a->buf, a->len, "Expiration", exp, sizeof exp);
    int v5 = stk__json_string(a->buf, a->len, "Code", code, sizeof code);
    if (v1 < 0 || v2 < 0 || v3 < 0 || v4 < 0 || v5 < 0) {
        stk__fmt(err, errlen, "%s: the answer is not the expected JSON object", what);
        rc = STK_EINVAL;
        goto out;
    }
    if (v5 == 1 && strcmp(code, "Success")) {
        stk__fmt(err, errlen, "%s: the answer's Code is '%.60s', not Success", what, code);
        rc = STK_EINVAL;
        goto out;
    }
    if (v1 != 1 || v2 != 1 || !*ak || !*sk) {
        stk__fmt(err, errlen, "%s: the answer lacks AccessKeyId or SecretAccessKey", what);
        rc = STK_EINVAL;
        goto out;
    }
    int64_t when = 0;
    if (v4 == 1 && (when = stk__iso8601(exp)) < 0) {
        stk__fmt(err, errlen, "%s: Expiration '%.40s' is not an ISO 8601 UTC time", what, exp);
        rc = STK_EINVAL;
        goto out;
    }
    rc = cred_new(out, ak, sk, v3 == 1 ? tk : NULL, when, source);
out:
    if (sk)
        memset(sk, 0, FIELD_MAX);
    if (tk)
        memset(tk, 0, FIELD_MAX);
    stk__free(ak);
    stk__free(sk);
    stk__free(tk);
    return rc;
}

/* ---- providers ------------------------------------------------------------ */

/* STS AssumeRoleWithWebIdentity: an unsigned POST of the token file's JWT. */
static int web_identity(stk__creds *c, const char *token_file, const char *role_arn,
                        const char *session, stk__cred **out, char *err, size_t errlen)
{
    int rc = STK_OK;
    char *jwt = stk__malloc(16384), *form = NULL;
    answer *a = stk__malloc(sizeof *a);
    char *ak = stk__malloc(FIELD_MAX), *sk = stk__malloc(FIELD_MAX), *tk = stk__malloc(FIELD_MAX);
    char url[1024], why[256], sess[80], arn_enc[1024], sess_enc[256], exp[64];
    if (!jwt || !a || !ak || !sk || !tk) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = read_token_file("the web identity token file", token_file, jwt, 16384, err, errlen)))
        goto out;
    const char *ep = env("AWS_ENDPOINT_URL_STS");
    if (!ep)
        ep = env("AWS_ENDPOINT_URL");
    if (ep)
        stk__fmt(url, sizeof url, "%s", ep);
    else
        stk__fmt(url, sizeof url, "https://sts.%s.amazonaws.com/", c->region);
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
        stk__fmt(err, errlen, "STS endpoint '%s' must start with http:// or https://", url);
        rc = STK_EINVAL;
        goto out;
    }
    if (!session)
        stk__fmt(sess, sizeof sess, "stoker-%lld", (long long)time(NULL));
    else
        stk__fmt(sess, sizeof sess, "%s", session);
    stk__pct_encode(role_arn, false, arn_enc, sizeof arn_enc);
    stk__pct_encode(sess, false, sess_enc, sizeof sess_enc);
    size_t jl = strlen(jwt) * 3 + 1, fl = jl + strlen(arn_enc) + strlen(sess_enc) + 160;
    char *jwt_enc = stk__malloc(jl);
    if ((form = stk__malloc(fl)))
        form[0] = '\0'; /* wiped at out, whatever happens next */
    if (!jwt_enc || !form) {
        stk__free(jwt_enc);
        rc = STK_ENOMEM;
        goto out;
    }
    stk__pct_encode(jwt, false, jwt_enc, jl);
    stk__fmt(form, fl,
             "Action=AssumeRoleWithWebIdentity&RoleArn=%s&RoleSessionName=%s"
             "&Version=2011-06-15&WebIdentityToken=%s",
             arn_enc, sess_enc, jwt_enc);
    memset(jwt_enc, 0, jl);
    stk__free(jwt_enc);
    /* "Expect:" off: a token of a few KiB must not wait for a 100 Continue. */
    static const char *const hdrs[] = {"Content-Type: application/x-www-form-urlencoded",
                                       "Accept: application/xml", "Expect:", NULL};
    long st;
    if ((rc = http_small(c, "POST", url, hdrs, form, false, 5000, a, &st, why, sizeof why))) {
        if (rc == STK_EIO)
            stk__fmt(err, errlen, "STS AssumeRoleWithWebIdentity at %s: %s", url, why);
        goto out;
    }
    if (st != 200) {
        char code[384];
        stk__s3_error_text(a->buf, code, sizeof code);
        stk__fmt(err, errlen, "STS AssumeRoleWithWebIdentity at %s for role %s: HTTP %ld%s", url,
                 role_arn, st, code);
        rc = STK_EINVAL;
        goto out;
    }
    const char *cr = strstr(a->buf, "<Credentials>");
    int v1 = cr ? xml_get(cr, "AccessKeyId", ak, FIELD_MAX) : 0;
    int v2 = cr ? xml_get(cr, "SecretAccessKey", sk, FIELD_MAX) : 0;
    int v3 = cr ? xml_get(cr, "SessionToken", tk, FIELD_MAX) : 0;
    int v4 = cr ? xml_get(cr, "Expiration", exp, sizeof exp) : 0;
    int64_t when = v4 == 1 ? stk__iso8601(exp) : 0;
    if (v1 != 1 || v2 != 1 || v3 != 1 || v4 < 0 || when < 0 || !*ak || !*sk) {
        stk__fmt(err, errlen,
                 "STS AssumeRoleWithWebIdentity at %s: the answer lacks well-formed "
                 "Credentials (AccessKeyId, SecretAccessKey, SessionToken, Expiration)",
                 url);
        rc = STK_EINVAL;
        goto out;
    }
    rc = cred_new(out, ak, sk, tk, when, "web identity");
out:
    if (jwt)
        memset(jwt, 0, 16384);
    if (form)
        wipe_free(form);
    if (sk)
        memset(sk, 0, FIELD_MAX);
    if (tk)
        memset(tk, 0, FIELD_MAX);
    if (a)
        memset(a, 0, sizeof *a);
    stk__free(jwt);
    stk__free(a);
    stk__free(ak);
    stk__free(sk);
    stk__free(tk);
    return rc;
}

/* Is url's host loopback, or one of the EKS pod identity agent's addresses?
 * (The AWS SDKs allow a plain-http full URI only to those.) */
static bool host_allowed_plain(const char *url)
{
    const char *h = strstr(url, "://");
    if (!h)
        return false;
    h += 3;
    size_t n = strcspn(h, "/?#");
    if (memchr(h, '@', n))
        return false;
    char host[256];
    if (n >= sizeof host)
        return false;
    memcpy(host, h, n);
    host[n] = '\0';
    if (host[0] == '[') {
        char *end = strchr(host, ']');
        if (!end)
            return false;
        *end = '\0';
        return !strcmp(host + 1, "::1") || !strcasecmp(host + 1, "fd00:ec2::23");
    }
    char *colon = strchr(host, ':');
    if (colon)
        *colon = '\0';
    if (!strcasecmp(host, "localhost") || !strcmp(host, "169.254.170.23"))
        return true;
    unsigned a, b, cc, d;
    char tail;
    return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &cc, &d, &tail) == 4 && a == 127 && b < 256 &&
           cc < 256 && d < 256;
}

static int container(stk__creds *c, stk__cred **out, char *err, size_t errlen)
{
    const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    const char *var =
        rel ? "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI" : "AWS_CONTAINER_CREDENTIALS_FULL_URI";
    char url[2048], auth[4200], tok[4096], why[256], what[128];
    const char *hdrs[2] = {NULL, NULL};
    int rc = STK_OK;
    answer *a = NULL;
    stk__fmt(what, sizeof what, "container credentials (%s)", var);
    if (rel) {
        if (rel[0] != '/') {
            stk__fmt(err, errlen, "%s must start with '/'", var);
            return STK_EINVAL;
        }
        stk__fmt(url, sizeof url, "http://169.254.170.2%s", rel);
    } else {
        if (strncmp(full, "https://", 8) &&
            !(!strncmp(full, "http://", 7) && host_allowed_plain(full))) {
            stk__fmt(err, errlen,
                     "%s must be an https:// URL, or http:// to a loopback address (as the AWS "
                     "SDKs require)",
                     var);
            return STK_EINVAL;
        }
        stk__fmt(url, sizeof url, "%s", full);
        const char *tf = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
        const char *t = env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
        if (tf) {
            if ((rc = read_token_file("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", tf, tok, sizeof tok,
                                      err, errlen)))
                goto out;
            t = tok;
        }
        if (t) {
            if (!header_line(auth, sizeof auth, "Authorization", t)) {
                stk__fmt(err, errlen, "the container authorization token is not one header line");
                rc = STK_EINVAL;
                goto out;
            }
            hdrs[0] = auth;
        }
    }
    if (!(a = stk__malloc(sizeof *a))) {
        rc = STK_ENOMEM;
        goto out;
    }
    long st;
    if ((rc = http_small(c, "GET", url, hdrs, NULL, true, 2000, a, &st, why, sizeof why))) {
        if (rc == STK_EIO)
            stk__fmt(err, errlen, "%s: %s", what, why);
        goto out;
    }
    if (st != 200) {
        stk__fmt(err, errlen, "%s: HTTP %ld", what, st);
        rc = STK_EINVAL;
        goto out;
    }
    rc = cred_from_json(out, a, "Token", "container", what, err, errlen);
out:
    memset(tok, 0, sizeof tok);
    memset(auth, 0, sizeof auth);
    if (a)
        memset(a, 0, sizeof *a);
    stk__free(a);
    return rc;
}

/* IMDSv2. No answer at all means "not on EC2": no credentials, no error. */
static int imds(stk__creds *c, stk__cred **out, char *err, size_t errlen)
{
    const char *dis = env("AWS_EC2_METADATA_DISABLED");
    if (dis && !strcasecmp(dis, "true"))
        return STK_OK;
    const char *ep = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    char base[1024], url[1280], tok[1100], hdr[1200], why[256];
    stk__fmt(base, sizeof base, "%s", ep ? ep : "http://169.254.169.254");
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/')
        base[--bl] = '\0';
    if (strncmp(base, "http://", 7) && strncmp(base, "https://", 8)) {
        stk__fmt(err, errlen,
                 "AWS_EC2_METADATA_SERVICE_ENDPOINT '%s' must start with http:// or https://",
                 base);
        return STK_EINVAL;
    }
    answer *a = stk__malloc(sizeof *a);
    if (!a)
        return STK_ENOMEM;
    int rc = STK_OK;
    long st;
    const char *put_hdrs[] = {"X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL};
    stk__fmt(url, sizeof url, "%s/latest/api/token", base);
    if (http_small(c, "PUT", url, put_hdrs, NULL, true, 1000, a, &st, why, sizeof why) ||
        st != 200 || !a->len || a->len >= sizeof tok) {
        rc = STK_OK; /* no IMDSv2 here */
        goto out;
    }
    memcpy(tok, a->buf, a->len + 1);
    if (!header_line(hdr, sizeof hdr, "X-aws-ec2-metadata-token", trim(tok))) {
        rc = STK_OK;
        goto out;
    }
    const char *hdrs[] = {hdr, NULL};
    stk__fmt(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", base);
    if ((rc = http_small(c, "GET", url, hdrs, NULL, true, 1000, a, &st, why, sizeof why))) {
        if (rc == STK_EIO)
            stk__fmt(err, errlen, "EC2 instance metadata (%s): %s", base, why);
        goto out;
    }
    if (st == 404) {
        rc = STK_OK; /* an instance without a role */
        goto out;
    }
    char role[130];
    size_t rl = strcspn(a->buf, "\r\n");
    bool ok = st == 200 && rl && rl < sizeof role;
    for (size_t k = 0; ok && k < rl; k++)
        ok = isalnum((unsigned char)a->buf[k]) || strchr("+=,.@_-", a->buf[k]);
    if (!ok) {
        stk__fmt(err, errlen, "EC2 instance metadata (%s): no valid role name (HTTP %ld)", base,
                 st);
        rc = STK_EINVAL;
        goto out;
    }
    memcpy(role, a->buf, rl);
    role[rl] = '\0';
    stk__fmt(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", base, role);
    if ((rc = http_small(c, "GET", url, hdrs, NULL, true, 1000, a, &st, why, sizeof why))) {
        if (rc == STK_EIO)
            stk__fmt(err, errlen, "EC2 instance metadata (%s) for role %s: %s", base, role, why);
        goto out;
    }
    char what[300];
    stk__fmt(what, sizeof what, "EC2 instance metadata (%s) for role %s", base, role);
    if (st != 200) {
        stk__fmt(err, errlen, "%s: HTTP %ld", what, st);
        rc = STK_EINVAL;
        goto out;
    }
    rc = cred_from_json(out, a, "Token", "instance metadata", what, err, errlen);
out:
    memset(a, 0, sizeof *a);
    memset(tok, 0, sizeof tok);
    memset(hdr, 0, sizeof hdr);
    stk__free(a);
    return rc;
}

/* Keys, or a web identity role, from the profile; *out NULL when the profile
 * has neither. */
static int from_profile(stk__creds *c, const profile *p, stk__cred **out, char *err, size_t errlen)
{
    int rc = STK_OK;
    const char *files[2] = {p->cred, p->conf};
    const char *sections[2] = {p->name, p->section};
    char *ak = NULL, *sk = NULL, *tk = NULL, *arn = NULL, *wif = NULL, *sess = NULL;
    for (int f = 0; f < 2 && !*out && !rc; f++) {
        ak = ini_get(files[f], sections[f], "aws_access_key_id", NULL, &rc);
        sk = ini_get(files[f], sections[f], "aws_secret_access_key", NULL, &rc);
        tk = ini_get(files[f], sections[f], "aws_session_token", NULL, &rc);
        if (rc) {
            /* out of memory: freed below */
        } else if (ak && sk) {
            rc = cred_new(out, ak, sk, tk, 0, "profile");
        } else if (ak || sk) {
            stk__fmt(err, errlen, "AWS profile '%s' in %s has %s but no %s", p->name, files[f],
                     ak ? "aws_access_key_id" : "aws_secret_access_key",
                     ak ? "aws_secret_access_key" : "aws_access_key_id");
            rc = STK_EINVAL;
        }
        stk__free(ak);
        wipe_free(sk);
        wipe_free(tk);
        ak = sk = tk = NULL;
    }
    if (*out || rc)
        return rc;
    /* Sources in the config file that are not keys. */
    arn = ini_get(p->conf, p->section, "role_arn", NULL, &rc);
    wif = ini_get(p->conf, p->section, "web_identity_token_file", NULL, &rc);
    sess = ini_get(p->conf, p->section, "role_session_name", NULL, &rc);
    static const char *const unsupported[] = {"credential_process", "source_profile",
                                              "credential_source",  "sso_session",
                                              "sso_start_url",      NULL};
    if (rc)
        goto out;
    if (arn && wif) {
        rc = web_identity(c, wif, arn, sess, out, err, errlen);
        goto out;
    }
    for (size_t k = 0; unsupported[k]; k++) {
        char *v = ini_get(p->conf, p->section, unsupported[k], NULL, &rc);
        stk__free(v);
        if (rc)
            goto out;
        if (v) {
            stk__fmt(err, errlen,
                     "AWS profile '%s' in %s gets its credentials through %s, which stoker does "
                     "not support: export them (aws configure export-credentials --format env) "
                     "or use AWS_WEB_IDENTITY_TOKEN_FILE",
                     p->name, p->conf, unsupported[k]);
            rc = STK_EINVAL;
            goto out;
        }
    }
    if (arn || wif) {
        stk__fmt(err, errlen, "AWS profile '%s' in %s has %s but no %s", p->name, p->conf,
                 arn ? "role_arn" : "web_identity_token_file",
                 arn ? "web_identity_token_file" : "role_arn");
        rc = STK_EINVAL;
    }
out:
    stk__free(arn);
    stk__free(wif);
    stk__free(sess);
    return rc;
}

/* Reads the whole chain once; *out NULL (and STK_OK) when it gives nothing. */
static int resolve(stk__creds *c, stk__cred **out, char *err, size_t errlen)
{
    *out = NULL;
    profile *p = stk__malloc(sizeof *p);
    if (!p)
        return STK_ENOMEM;
    profile_init(p);
    int rc = STK_OK;
    if (p->named) {
        bool in_cred, in_conf;
        ini_get(p->cred, p->name, NULL, &in_cred, &rc);
        ini_get(p->conf, p->section, NULL, &in_conf, &rc);
        if (!in_cred && !in_conf) {
            stk__fmt(err, errlen, "AWS profile '%s' could not be found (looked in %s and %s)",
                     p->name, p->cred, p->conf);
            rc = STK_EINVAL;
            goto out;
        }
    }
    const char *ak = env("AWS_ACCESS_KEY_ID"), *sk = env("AWS_SECRET_ACCESS_KEY");
    if (ak || sk) {
        if (!ak || !sk) {
            stk__fmt(err, errlen, "%s is set but %s is not",
                     ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                     ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
            rc = STK_EINVAL;
        } else {
            rc = cred_new(out, ak, sk, env("AWS_SESSION_TOKEN"), 0, "environment");
        }
        goto out;
    }
    const char *wif = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *arn = env("AWS_ROLE_ARN");
    if (wif || arn) {
        if (!wif || !arn) {
            stk__fmt(err, errlen, "%s is set but %s is not",
                     wif ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN",
                     wif ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE");
            rc = STK_EINVAL;
        } else {
            rc = web_identity(c, wif, arn, env("AWS_ROLE_SESSION_NAME"), out, err, errlen);
        }
        goto out;
    }
    if ((rc = from_profile(c, p, out, err, errlen)) || *out)
        goto out;
    if (env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") ||
        env("AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
        rc = container(c, out, err, errlen);
        goto out;
    }
    rc = imds(c, out, err, errlen);
out:
    if (rc && *out) {
        cred_free(*out);
        *out = NULL;
    }
    stk__free(p);
    return rc;
}

/* ---- the chain's state ---------------------------------------------------- */

int stk__creds_open(stk__creds **out, const char *region_opt, char *err, size_t errlen)
{
    *out = NULL;
    stk__creds *c = stk__calloc(1, sizeof *c);
    if (!c)
        return STK_ENOMEM;
    if (pthread_mutex_init(&c->lock, NULL)) {
        stk__free(c);
        return STK_ENOMEM;
    }
    atomic_init(&c->cancel, false);
    int rc = STK_OK;
    const char *reg = region_opt && *region_opt ? region_opt : env("AWS_REGION");
    if (!reg)
        reg = env("AWS_DEFAULT_REGION");
    if (reg) {
        c->region = stk__strdup(reg);
    } else {
        profile *p = stk__malloc(sizeof *p);
        if (p) {
            profile_init(p);
            c->region = ini_get(p->conf, p->section, "region", NULL, &rc);
            stk__free(p);
            if (!c->region && !rc)
                c->region = stk__strdup("us-east-1");
        }
    }
    if (!c->region) {
        rc = STK_ENOMEM;
        goto out;
    }
    if ((rc = resolve(c, &c->cur, err, errlen)))
        goto out;
    if (c->cur)
        c->cur->gen = c->gen = 1;
out:
    if (rc) {
        stk__creds_close(c);
        return rc;
    }
    *out = c;
    return STK_OK;
}

void stk__creds_cancel(stk__creds *c)
{
    if (c)
        atomic_store_explicit(&c->cancel, true, memory_order_relaxed);
}

void stk__creds_close(stk__creds *c)
{
    if (!c)
        return;
    if (c->cur && !--c->cur->refs)
        cred_free(c->cur);
    stk__free(c->region);
    pthread_mutex_destroy(&c->lock);
    stk__free(c);
}

const char *stk__creds_region(const stk__creds *c)
{
    return c->region;
}

stk__cred *stk__creds_acquire(stk__creds *c)
{
    pthread_mutex_lock(&c->lock);
    stk__cred *k = c->cur;
    if (k)
        k->refs++;
    pthread_mutex_unlock(&c->lock);
    return k;
}

void stk__creds_release(stk__creds *c, stk__cred *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&c->lock);
    bool last = !--k->refs;
    pthread_mutex_unlock(&c->lock);
    if (last)
        cred_free(k);
}

static bool due_locked(const stk__creds *c, uint64_t now_ns)
{
    if (!c->cur || !c->cur->expires || c->refreshing)
        return false;
    if (c->last_try_ns && now_ns - c->last_try_ns < PROACTIVE_EVERY_NS * 1000000ULL)
        return false;
    return (int64_t)time(NULL) + REFRESH_WINDOW_S >= c->cur->expires;
}

bool stk__creds_due(stk__creds *c)
{
    pthread_mutex_lock(&c->lock);
    bool due = due_locked(c, stk__now_ns());
    pthread_mutex_unlock(&c->lock);
    return due;
}

static bool same_cred(const stk__cred *a, const stk__cred *b)
{
    return !strcmp(a->key_id, b->key_id) && !strcmp(a->secret, b->secret) &&
           !strcmp(a->token ? a->token : "", b->token ? b->token : "");
}

int stk__creds_refresh(stk__creds *c, uint64_t gen, bool force, char *err, size_t errlen)
{
    uint64_t now = stk__now_ns();
    pthread_mutex_lock(&c->lock);
    if (!c->cur || c->cur->gen != gen || (!force && !due_locked(c, now))) {
        pthread_mutex_unlock(&c->lock);
        return STK_OK;
    }
    if (c->refreshing ||
        (force && c->last_try_ns && now - c->last_try_ns < FORCED_EVERY_NS * 1000000ULL)) {
        /* Someone just tried: their outcome stands. */
        int rc = c->last_rc;
        stk__fmt(err, errlen, "%s", c->last_err);
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    c->refreshing = true;
    c->last_try_ns = now;
    pthread_mutex_unlock(&c->lock);

    char why[256] = "";
    stk__cred *k = NULL, *old = NULL;
    int rc = resolve(c, &k, why, sizeof why);
    if (rc == STK_OK && !k) {
        stk__fmt(why, sizeof why, "the credential chain gives no credentials any more");
        rc = STK_EIO;
    }
    if (rc == STK_ENOMEM && !why[0])
        stk__fmt(why, sizeof why, "out of memory");

    pthread_mutex_lock(&c->lock);
    c->refreshing = false;
    if (rc == STK_OK) {
        if (same_cred(k, c->cur)) {
            /* Same keys (a static source): keep the generation, take the
             * newer expiry. */
            c->cur->expires = k->expires;
            old = k;
        } else {
            k->gen = ++c->gen;
            old = c->cur;
            c->cur = k;
        }
        c->last_rc = STK_OK;
        c->last_err[0] = '\0';
    } else {
        c->last_rc = STK_EIO;
        stk__fmt(c->last_err, sizeof c->last_err, "cannot refresh the S3 credentials: %s", why);
        stk__fmt(err, errlen, "%s", c->last_err);
        rc = STK_EIO;
    }
    bool free_old = old && !--old->refs;
    pthread_mutex_unlock(&c->lock);
    if (free_old)
        cred_free(old);
    return rc;
}

bool stk__creds_expired_error(const char *body)
{
    char code[64];
    const char *a = strstr(body, "<Code>");
    if (!a || xml_get(a, "Code", code, sizeof code) != 1)
        return false;
    return !strcmp(code, "ExpiredToken") || !strcmp(code, "ExpiredTokenException") ||
           !strcmp(code, "TokenRefreshRequired");
}
