/* fuzz_s3xml.c -- libFuzzer target for the listings servers send: an S3
 * ListObjectsV2 page (stk__s3_list_page, with the entity decoding of
 * stk__xml_unescape), an S3 error body (stk__s3_error_text), and a plain
 * HTTP server's index page (stk__autoindex_page: nginx's HTML or JSON). Built by
 * scripts/test-fuzz.sh; linked with replay_main.c it is a plain program that
 * replays corpus files given as arguments (the corpus as regular tests). */
#include "io/remote.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Is s well-formed UTF-8 (shortest forms, no surrogates, at most U+10FFFF)? */
static bool utf8_ok(const unsigned char *s)
{
    while (*s) {
        unsigned c = *s++, n = c < 0x80                ? 0
                               : c >= 0xC2 && c < 0xE0 ? 1
                               : c >= 0xE0 && c < 0xF0 ? 2
                               : c >= 0xF0 && c < 0xF5 ? 3
                                                       : 9;
        if (n == 9)
            return false;
        unsigned cp = n ? c & (0x3Fu >> n) : c;
        for (unsigned k = 0; k < n; k++, s++) {
            if ((*s & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (*s & 0x3Fu);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The engine NUL-terminates a body it keeps in memory; do the same, so
     * the parsers see what they see in production (the list parser is also
     * given the length, and must not read past it either way). */
    char *body = malloc(size + 1);
    if (!body)
        return 0;
    memcpy(body, data, size);
    body[size] = '\0';

    /* Two prefixes: the bucket root (every key counts) and a folder. */
    const char *prefixes[] = {"", "train/"};
    for (size_t k = 0; k < 2; k++) {
        char **names = NULL;
        uint64_t *sizes = NULL;
        size_t n = 0, cap = 0;
        bool more = true;
        char *token = (char *)1; /* must be overwritten */
        char err[256];
        int rc = stk__s3_list_page(body, size, prefixes[k], &names, &sizes, &n, &cap, &more, &token,
                                   err, sizeof err);
        if (rc != STK_OK && rc != STK_EFORMAT)
            abort();
        if (token == (char *)1 || (token && !more) || n > cap || (rc == STK_OK && more && !token))
            abort();
        for (size_t i = 0; i < n; i++) {
            /* Names come back relative to the prefix, never empty. */
            if (!names[i][0] || strlen(names[i]) > size)
                abort();
        }
        stk__free(token);
        stk__remote_list_free(names, sizes, n);
    }

    /* An index page: every name a plain relative one (no '/', no "..")
     * within the page's length, the files and directories no more than its
     * links. */
    {
        char **names = NULL;
        uint64_t *sizes = NULL;
        size_t n = 0, ndirs = 0;
        char why[256];
        int rc = stk__autoindex_page(body, size, &names, &sizes, &n, &ndirs, why, sizeof why);
        if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_EUNSUPPORTED)
            abort();
        if (rc != STK_OK && (names || n))
            abort();
        for (size_t i = 0; i < n; i++)
            if (!names[i][0] || strchr(names[i], '/') || !strcmp(names[i], "..") ||
                strlen(names[i]) > size)
                abort();
        if (n + ndirs > size / 8 + 1)
            abort();
        stk__remote_list_free(names, sizes, n);
    }

    /* The engine keeps at most the first 511 bytes of an error body. */
    char ebody[512];
    size_t m = size < sizeof ebody - 1 ? size : sizeof ebody - 1;
    memcpy(ebody, data, m);
    ebody[m] = '\0';
    char out[384];
    stk__s3_error_text(ebody, out, sizeof out);

    /* Entity decoding alone, on arbitrary text: it only ever shrinks, and
     * ASCII in gives well-formed UTF-8 out (no surrogates). */
    bool ascii = true;
    for (size_t k = 0; k < size && ascii; k++)
        ascii = data[k] < 0x80;
    stk__xml_unescape(body);
    if (strlen(body) > size || (ascii && !utf8_ok((const unsigned char *)body)))
        abort();
    free(body);
    return 0;
}
