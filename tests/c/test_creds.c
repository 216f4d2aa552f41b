/*
 * test_creds.c -- the S3 credential chain (src/io/creds.c, docs/remote.md
 * "Credentials") against loopback stand-ins for STS, the container endpoint,
 * the EC2 instance metadata service and an S3 that checks which key signed
 * each request (tests/servers/aws_standin.py, run as a child process). The
 * remote engine runs in-process, so the refresh path between the I/O thread
 * and the callers runs under ASan and TSan.
 */
#include "testutil.h"

#include "../../src/io/creds.h"
#include "../../src/io/remote.h"

#include <curl/curl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static pid_t g_pid = -1;
static char g_url[128];
static const char *OBJ = "object bytes for the credential tests\n";

/* ---- the stand-in ----------------------------------------------------------- */

static void standin_start(void)
{
    const char *script = "tests/servers/aws_standin.py";
    struct stat st;
    REQUIRE(stat(script, &st) == 0); /* run from the repository root */
    char root[1024], ready[1024];
    snprintf(root, sizeof root, "%s", tu_path("www"));
    snprintf(ready, sizeof ready, "%s", tu_path("standin.ready"));
    tu_mkdirs(tu_path("www/bkt/data"));
    tu_write_file(tu_path("www/bkt/data/obj.bin"), OBJ, strlen(OBJ));
    g_pid = fork();
    REQUIRE(g_pid >= 0);
    if (g_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with a test that aborts */
        execl("/usr/bin/python3", "python3", script, root, "--ready-file", ready, (char *)NULL);
        _exit(127);
    }
    for (int k = 0; k < 500; k++) {
        size_t n = 0;
        char *u = tu_read_file(ready, &n);
        if (u) {
            snprintf(g_url, sizeof g_url, "%.*s", (int)n, u);
            free(u);
            return;
        }
        usleep(20000);
    }
    REQUIRE(!"the stand-in did not start");
}

static void standin_stop(void)
{
    if (g_pid > 0) {
        kill(g_pid, SIGTERM);
        waitpid(g_pid, NULL, 0);
        g_pid = -1;
    }
}

static size_t grow(char *p, size_t sz, size_t nm, void *ud)
{
    char *buf = ud;
    size_t have = strlen(buf), n = sz * nm;
    if (have + n >= 65536)
        n = 65535 - have;
    memcpy(buf + have, p, n);
    buf[have + n] = '\0';
    return sz * nm;
}

/* GET g_url + path; the answer in a static buffer. */
static const char *admin(const char *path)
{
    static char buf[65536];
    char url[512];
    buf[0] = '\0';
    snprintf(url, sizeof url, "%s%s", g_url, path);
    CURL *e = curl_easy_init();
    REQUIRE(e);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, grow);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, buf);
    curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    CURLcode rc = curl_easy_perform(e);
    curl_easy_cleanup(e);
    REQUIRE(rc == CURLE_OK);
    return buf;
}

/* How often the stand-in answered endpoint (sts, container, imds_token, ...). */
static long count(const char *what)
{
    const char *s = admin("/_admin/state");
    char key[64];
    snprintf(key, sizeof key, "\"%s\": ", what);
    const char *p = strstr(s, key);
    return p ? strtol(p + strlen(key), NULL, 10) : 0;
}

/* The S3 log, "KEY:STATUS,..." (KEY None for unsigned requests). */
static const char *s3_log(void)
{
    static char out[8192];
    const char *s = admin("/_admin/state");
    const char *p = strstr(s, "\"s3_log\": \"");
    out[0] = '\0';
    if (p) {
        p += 11;
        const char *e = strchr(p, '"');
        snprintf(out, sizeof out, "%.*s", e ? (int)(e - p) : 0, p);
    }
    return out;
}

/* ---- environment ------------------------------------------------------------- */

static void clear_aws_env(void)
{
    char names[64][128];
    int n = 0;
    for (char **e = environ; *e && n < 64; e++)
        if (!strncmp(*e, "AWS_", 4)) {
            size_t l = strcspn(*e, "=");
            snprintf(names[n++], sizeof names[0], "%.*s", (int)l, *e);
        }
    for (int k = 0; k < n; k++)
        unsetenv(names[k]);
    setenv("HOME", tu_path("home"), 1); /* no ~/.aws of the machine's */
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
}

static bool no_secret(const char *msg)
{
    return !strstr(msg, "secret") && !strstr(msg, "standin-token") && !strstr(msg, "jwt-") &&
           !strstr(msg, "envsecret");
}

static int open_obj(stk__remote **r, char *err, size_t errlen)
{
    stk__remote_cfg cfg = {0};
    cfg.endpoint = g_url;
    cfg.retries = 2;
    cfg.backoff_ms = 10;
    err[0] = '\0';
    return stk__remote_open(r, "s3://bkt/data/obj.bin", &cfg, err, errlen);
}

/* An open that must fail: its code (a remote opened anyway is closed). */
static int open_fails(char *err, size_t errlen)
{
    stk__remote *r = NULL;
    int rc = open_obj(&r, err, errlen);
    CHECK(rc != STK_OK && r == NULL);
    stk__remote_close(r);
    return rc;
}

/* Opens the object, reads it, closes: STK_OK when it arrived intact. */
static int read_obj(char *err, size_t errlen)
{
    stk__remote *r = NULL;
    int rc = open_obj(&r, err, errlen);
    if (rc == STK_OK) {
        char *body = NULL;
        size_t len = 0;
        rc = stk__remote_get_small(r, "", 4096, &body, &len, err, errlen);
        if (rc == STK_OK && (len != strlen(OBJ) || memcmp(body, OBJ, len)))
            rc = STK_EFORMAT;
        stk__free(body);
    }
    stk__remote_close(r);
    return rc;
}

static void write_jwt(const char *tok)
{
    tu_write_file(tu_path("jwt"), tok, strlen(tok));
}

static void web_identity_env(void)
{
    clear_aws_env();
    write_jwt("jwt-header.payload.signature\n");
    admin("/_admin/set?jwt=jwt-header.payload.signature&ttl=3600&first_ttl=&expired_status=400");
    setenv("AWS_WEB_IDENTITY_TOKEN_FILE", tu_path("jwt"), 1);
    setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/standin", 1);
    setenv("AWS_ENDPOINT_URL_STS", g_url, 1);
}

/* ---- parsers ----------------------------------------------------------------- */

static void test_json_and_time_parsers(void)
{
    char out[64];
    const char *ok = " {\"A\": 1, \"Nested\": {\"AccessKeyId\": \"no\", \"x\": [1, {\"y\": null}]},"
                     " \"AccessKeyId\" : \"AK\\/1\\u0041\", \"t\": true}\n";
    CHECK_EQ(stk__json_string(ok, strlen(ok), "AccessKeyId", out, sizeof out), 1);
    CHECK(!strcmp(out, "AK/1A")); /* the nested one is not the top-level key */
    CHECK_EQ(stk__json_string(ok, strlen(ok), "Token", out, sizeof out), 0);
    CHECK_EQ(stk__json_string(ok, strlen(ok), "A", out, sizeof out), -1); /* not a string */
    const char *bad[] = {"",
                         "[]",
                         "{\"a\":\"b\"",
                         "{\"a\" \"b\"}",
                         "{\"a\":\"b\",}",
                         "{\"a\":\"b\"} x",
                         "{\"a\":\"\\q\"}",
                         "{\"a\":\"b\",\"a\":\"c\"}",
                         "{\"a\":\"\x01\"}",
                         "{\"a\":\"\\ud800\"}"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        CHECK_EQ(stk__json_string(bad[k], strlen(bad[k]), "a", out, sizeof out), -1);
    char tiny[4];
    CHECK_EQ(stk__json_string("{\"a\":\"long value\"}", 18, "a", tiny, sizeof tiny), -1);
    /* The length bounds the parse even without a NUL after the object. */
    CHECK_EQ(stk__json_string("{\"a\":\"v\"}{", 9, "a", out, sizeof out), 1);

    CHECK_EQ(stk__iso8601("1970-01-01T00:00:00Z"), 0);
    CHECK_EQ(stk__iso8601("2026-11-24T23:40:05Z"), 1795563605LL);
    CHECK_EQ(stk__iso8601("2026-11-24T23:40:05.123Z"), 1795563605LL);
    CHECK_EQ(stk__iso8601("2026-11-24T23:40:05+00:00"), 1795563605LL);
    CHECK_EQ(stk__iso8601("2026-11-24T23:40:05"), -1);
    CHECK_EQ(stk__iso8601("2026-11-24 23:40:05Z"), -1);
    CHECK_EQ(stk__iso8601("2026-13-24T23:40:05Z"), -1);
    CHECK_EQ(stk__iso8601("2026-11-24T23:40:05+02:00"), -1);

    CHECK(stk__creds_expired_error("<Error><Code>ExpiredToken</Code></Error>"));
    CHECK(stk__creds_expired_error("<Error><Code>TokenRefreshRequired</Code></Error>"));
    CHECK(stk__creds_expired_error("<ErrorResponse><Error><Code>ExpiredTokenException</Code>"));
    CHECK(!stk__creds_expired_error("<Error><Code>AccessDenied</Code></Error>"));
    CHECK(!stk__creds_expired_error("ExpiredToken"));
}

/* ---- 1. profiles ------------------------------------------------------------- */

static void test_missing_profile_fails_at_open(void)
{
    char err[1024], want[1200];
    clear_aws_env();
    setenv("AWS_PROFILE", "nope", 1);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    snprintf(want, sizeof want,
             "AWS profile 'nope' could not be found (looked in %s/.aws/credentials and "
             "%s/.aws/config)",
             tu_path("home"), tu_path("home"));
    CHECK(strstr(err, want) != NULL);
    if (!strstr(err, want))
        fprintf(stderr, "  got: %s\n", err);

    /* Environment keys do not hide a profile that is not there (as boto3). */
    setenv("AWS_ACCESS_KEY_ID", "envkey", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "'nope' could not be found") != NULL);
    CHECK(no_secret(err));
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");

    /* The files named by AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE are the
     * ones searched, and named. */
    const char *cred = tu_path("alt-credentials"), *conf = tu_path("alt-config");
    setenv("AWS_SHARED_CREDENTIALS_FILE", cred, 1);
    setenv("AWS_CONFIG_FILE", conf, 1);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    snprintf(want, sizeof want, "(looked in %s and %s)", cred, conf);
    CHECK(strstr(err, want) != NULL);

    /* Found in the config file ([profile nope]) or the credentials file
     * ([nope]): the open succeeds and the profile's keys sign. */
    const char *c1 = "[profile nope]\naws_access_key_id = envkey\n"
                     "aws_secret_access_key = envsecret\n";
    tu_write_file(conf, c1, strlen(c1));
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_OK);
    CHECK(!strcmp(s3_log(), "envkey:200"));
    unlink(conf);
    const char *c2 = "[default]\naws_access_key_id = x\naws_secret_access_key = y\n[nope]\n"
                     "aws_access_key_id = envkey\naws_secret_access_key = envsecret\n";
    tu_write_file(cred, c2, strlen(c2));
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_OK);
    CHECK(!strcmp(s3_log(), "envkey:200"));

    /* A half-given profile is an error, not unsigned requests. */
    const char *c3 = "[nope]\naws_access_key_id = envkey\n";
    tu_write_file(cred, c3, strlen(c3));
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "has aws_access_key_id but no aws_secret_access_key") != NULL);
    unlink(cred);

    /* Without AWS_PROFILE a missing default profile is no error: unsigned. */
    unsetenv("AWS_PROFILE");
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_EIO);
    CHECK(!strcmp(s3_log(), "None:403"));
}

/* ---- 3a. web identity ------------------------------------------------------- */

static void test_web_identity(void)
{
    char err[1024];
    web_identity_env();
    setenv("AWS_ROLE_SESSION_NAME", "trainer-7", 1);
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_OK);
    CHECK_EQ(count("sts"), 1);
    const char *st = admin("/_admin/state");
    CHECK(strstr(st, "\"trainer-7\"") != NULL);
    char want[64];
    const char *log = s3_log();
    CHECK(strncmp(log, "STANDINKEY", 10) == 0 && strstr(log, ":200") != NULL);
    snprintf(want, sizeof want, "%s", log);

    /* A token STS refuses: the open fails naming STS, the role and the code,
     * never the token. */
    write_jwt("jwt-wrong\n");
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "AssumeRoleWithWebIdentity") && strstr(err, "AccessDenied") &&
          strstr(err, "role/standin"));
    CHECK(no_secret(err));

    /* Half-given: a role without a token file. */
    unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE");
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "AWS_ROLE_ARN is set but AWS_WEB_IDENTITY_TOKEN_FILE is not") != NULL);

    /* The same from a profile in the config file. */
    clear_aws_env();
    write_jwt("jwt-header.payload.signature");
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[profile wi]\nrole_arn = arn:aws:iam::123456789012:role/standin\n"
             "web_identity_token_file = %s\n",
             tu_path("jwt"));
    tu_write_file(tu_path("wi-config"), conf, strlen(conf));
    setenv("AWS_CONFIG_FILE", tu_path("wi-config"), 1);
    setenv("AWS_PROFILE", "wi", 1);
    setenv("AWS_ENDPOINT_URL_STS", g_url, 1);
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_OK);
    CHECK_EQ(count("sts"), 1);
}

/* ---- 2. refresh on an expired token --------------------------------------- */

typedef struct {
    stk__remote *r;
    int rc;
} reader;

static void *read_many(void *arg)
{
    reader *x = arg;
    stk__req q[8];
    stk__req *qs[8];
    memset(q, 0, sizeof q);
    for (int k = 0; k < 8; k++) {
        q[k].fd = -1;
        q[k].max_bytes = 4096;
        qs[k] = &q[k];
    }
    x->rc = stk__remote_run(x->r, qs, 8);
    for (int k = 0; k < 8; k++) {
        if (q[k].rc == STK_OK && (q[k].got != strlen(OBJ) || memcmp(q[k].body, OBJ, q[k].got)))
            x->rc = STK_EFORMAT;
        stk__free(q[k].body);
    }
    return NULL;
}

static void test_expired_token_refreshes_once(void)
{
    char err[1024];
    int statuses[] = {400, 403};
    for (int v = 0; v < 2; v++) {
        web_identity_env();
        char set[128];
        snprintf(set, sizeof set, "/_admin/set?expired_status=%d", statuses[v]);
        admin(set);
        admin("/_admin/reset");
        stk__remote *r = NULL;
        REQUIRE(open_obj(&r, err, sizeof err) == STK_OK);
        char *body = NULL;
        size_t len = 0;
        CHECK_EQ(stk__remote_get_small(r, "", 4096, &body, &len, err, sizeof err), STK_OK);
        stk__free(body);
        char first[64];
        snprintf(first, sizeof first, "%s", s3_log());
        *strchr(first, ':') = '\0';
        char expire[128];
        snprintf(expire, sizeof expire, "/_admin/expire?key=%s", first);
        admin(expire);
        /* Two threads, 16 requests signed with the expired key: the chain is
         * read again once, and every request is retried with the new key. */
        reader a = {r, -1}, b = {r, -1};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, read_many, &a);
        pthread_create(&tb, NULL, read_many, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        CHECK_EQ(a.rc, STK_OK);
        CHECK_EQ(b.rc, STK_OK);
        CHECK_EQ(count("sts"), 2);
        const char *log = s3_log();
        char bad[96];
        snprintf(bad, sizeof bad, "%s:%d", first, statuses[v]);
        CHECK(strstr(log, bad) != NULL);
        stk__remote_counters c;
        stk__remote_counters_get(r, &c);
        CHECK_EQ(c.failures, 0);
        stk__remote_close(r);
    }

    /* Static keys that expired: read again (the same), retried once, then a
     * clear final error without the secret, and no retry storm. */
    clear_aws_env();
    setenv("AWS_ACCESS_KEY_ID", "envkey", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    admin("/_admin/set?expired_status=400");
    admin("/_admin/expire?key=envkey");
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_EIO);
    CHECK(strstr(err, "ExpiredToken") && strstr(err, "refused too"));
    CHECK(no_secret(err));
    CHECK(!strcmp(s3_log(), "envkey:400,envkey:400"));
}

/* ---- 3b. the container endpoint, and the proactive refresh ---------------------- */

static void test_container_and_proactive_refresh(void)
{
    char err[1024], uri[256];
    clear_aws_env();
    snprintf(uri, sizeof uri, "%s/container/creds", g_url);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri, 1);
    tu_write_file(tu_path("ctoken"), "Bearer ctok-1\n", 14);
    setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", tu_path("ctoken"), 1);
    /* The first credentials expire in 60 s, inside the refresh window: they
     * are renewed before they sign the first request. */
    admin("/_admin/set?auth_token=Bearer%20ctok-1&first_ttl=60&ttl=3600");
    admin("/_admin/reset");
    const char *st = admin("/_admin/state");
    const char *iss = strstr(st, "\"issued\": [");
    int before = 0;
    for (const char *p = iss; p && (p = strstr(p, "STANDINKEY")); p++)
        before++;
    CHECK_EQ(read_obj(err, sizeof err), STK_OK);
    CHECK_EQ(count("container"), 2);
    char want[64];
    snprintf(want, sizeof want, "STANDINKEY%d:200", before + 2);
    CHECK(!strcmp(s3_log(), want));
    if (strcmp(s3_log(), want))
        fprintf(stderr, "  s3 log: %s (want %s)\n", s3_log(), want);

    /* A wrong authorization token: 401, named, the token not printed. */
    admin("/_admin/set?first_ttl=");
    tu_write_file(tu_path("ctoken"), "Bearer ctok-wrong", 17);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "AWS_CONTAINER_CREDENTIALS_FULL_URI") && strstr(err, "HTTP 401"));
    CHECK(!strstr(err, "ctok"));

    /* A plain-http full URI must be loopback (as the AWS SDKs require). */
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://10.1.2.3/creds", 1);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "must be an https:// URL, or http:// to a loopback address") != NULL);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1.evil.example/creds", 1);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://user@127.0.0.1/creds", 1);
    CHECK_EQ(open_fails(err, sizeof err), STK_EINVAL);
}

/* ---- 3c. instance metadata ------------------------------------------------------ */

static void test_imds(void)
{
    char err[1024];
    clear_aws_env();
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", g_url, 1);
    admin("/_admin/set?first_ttl=&ttl=3600");
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_OK);
    CHECK_EQ(count("imds_token"), 1);
    CHECK_EQ(count("imds_list"), 1);
    CHECK_EQ(count("imds_role"), 1);
    CHECK(strncmp(s3_log(), "STANDINKEY", 10) == 0);

    /* Disabled: not asked, requests unsigned. */
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_EIO);
    CHECK_EQ(count("imds_token"), 0);
    CHECK(!strcmp(s3_log(), "None:403"));

    /* Nothing listening: no credentials, unsigned requests, and no long wait. */
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9", 1);
    admin("/_admin/reset");
    uint64_t t0 = stk__now_ns();
    CHECK_EQ(read_obj(err, sizeof err), STK_EIO);
    CHECK(stk__now_ns() - t0 < 3000000000ULL);
    CHECK(!strcmp(s3_log(), "None:403"));

    /* Environment keys come first: IMDS is not asked. */
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", g_url, 1);
    setenv("AWS_ACCESS_KEY_ID", "envkey", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    admin("/_admin/reset");
    CHECK_EQ(read_obj(err, sizeof err), STK_EIO); /* envkey was expired above */
    CHECK_EQ(count("imds_token"), 0);
}

/* ---- allocation failures ---------------------------------------------------- */

void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

/* For n = 0, 1, ...: the n-th library allocation fails. Every open + read
 * either succeeds (then signed with the right key: the stand-in refuses
 * anything else) or fails with STK_ENOMEM; never unsigned requests, a
 * crash or a leak (tu_end checks). */
static void test_allocation_failures(void)
{
    char err[1024], uri[256];
    for (int cfg = 0; cfg < 4; cfg++) {
        clear_aws_env();
        if (cfg == 0) {
            const char *c = "[default]\naws_access_key_id = profkey\n"
                            "aws_secret_access_key = profsecret\n";
            tu_write_file(tu_path("oom-credentials"), c, strlen(c));
            setenv("AWS_SHARED_CREDENTIALS_FILE", tu_path("oom-credentials"), 1);
        } else if (cfg == 1) {
            web_identity_env();
        } else if (cfg == 2) {
            snprintf(uri, sizeof uri, "%s/container/creds", g_url);
            setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri, 1);
            setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "Bearer ctok-1", 1);
            admin("/_admin/set?auth_token=Bearer%20ctok-1&first_ttl=");
        } else {
            unsetenv("AWS_EC2_METADATA_DISABLED");
            setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", g_url, 1);
        }
        long n;
        int failed = 0;
        for (n = 0; n < 2000; n++) {
            long c0 = stk__alloc_count();
            stk__alloc_fail_after(n);
            int rc = read_obj(err, sizeof err);
            stk__alloc_fail_after(-1);
            bool injected = stk__alloc_count() - c0 > n;
            if (rc != STK_OK && rc != STK_ENOMEM)
                fprintf(stderr, "  config %d, n=%ld: %s: %s\n", cfg, n, stk_strerror(rc), err);
            CHECK(rc == STK_OK || rc == STK_ENOMEM);
            failed += rc == STK_ENOMEM;
            if (!injected)
                break;
        }
        CHECK(n < 2000 && failed > 10);
    }
}

int main(void)
{
    tu_begin("test_creds", 120);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    RUN(test_json_and_time_parsers);
    standin_start();
    RUN(test_missing_profile_fails_at_open);
    RUN(test_web_identity);
    RUN(test_expired_token_refreshes_once);
    RUN(test_container_and_proactive_refresh);
    RUN(test_imds);
    RUN(test_allocation_failures);
    standin_stop();
    clear_aws_env();
    return tu_end();
}
