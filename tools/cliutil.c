/* cliutil.c -- small helpers shared by the `stoker` subcommands. */
#include "commands.h"

#include "stoker.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* 0: a number, stored in *out; 1: not a number; 2: a number too large for
 * uint64 (or negative), so "out of range" is the true complaint. The syntax
 * is the library's (stk_parse_size), so the tool and the library accept the
 * same sizes. */
static int parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return 1;
    bool neg = *s == '-';
    if (neg || *s == '+')
        s++;
    int rc = stk_parse_size(s, out);
    if (rc == STK_EINVAL)
        return 1;
    if (rc != STK_OK || neg)
        return 2;
    return 0;
}

bool stoker_parse_size(const char *s, uint64_t *out)
{
    return parse_size(s, out) == 0;
}

static bool parse_checked(const char *opt, const char *val, uint64_t lo, uint64_t hi,
                          uint64_t *out, bool bytes)
{
    int rc = parse_size(val, out);
    if (rc == 1) {
        if (bytes)
            fprintf(stderr, "stoker: %s takes a size in bytes (%s), got '%s'\n", opt,
                    STOKER_SIZE_SYNTAX, val ? val : "nothing");
        else
            fprintf(stderr, "stoker: %s needs a number, got '%s'\n", opt, val ? val : "nothing");
        return false;
    }
    if (rc == 2 || *out < lo || *out > hi) {
        fprintf(stderr, "stoker: %s %s is out of range (%" PRIu64 "..%" PRIu64 ")\n", opt, val, lo,
                hi);
        return false;
    }
    return true;
}

bool stoker_parse_opt(const char *opt, const char *val, uint64_t lo, uint64_t hi, uint64_t *out)
{
    return parse_checked(opt, val, lo, hi, out, false);
}

bool stoker_parse_bytes(const char *opt, const char *val, uint64_t lo, uint64_t hi,
                        uint64_t *out)
{
    return parse_checked(opt, val, lo, hi, out, true);
}

const char *stoker_human_bytes(double v, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (v >= 1024 && k < 4)
        v /= 1024, k++;
    snprintf(buf, n, "%.1f %s", v, u[k]);
    return buf;
}

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0 if the bytes
 * there are not one (RFC 3629: no overlong forms, no surrogates, nothing
 * above U+10FFFF), exactly the sequences Python's UTF-8 decoder accepts. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    if (c < 0xC2 || c > 0xF4)
        return 0;
    unsigned char lo = 0x80, hi = 0xBF;
    size_t n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if (s[k] < 0x80 || s[k] > 0xBF)
            return 0; /* also stops at the terminating NUL */
    return n;
}

void stoker_json_str(FILE *f, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    while (*s) {
        size_t n = utf8_len(s);
        if (n == 0) {
            /* A byte that is not part of well-formed UTF-8: Python's
             * surrogateescape code point for it, so the output stays valid
             * UTF-8 and os.fsencode() gives the original bytes back. */
            fprintf(f, "\\udc%02x", *s);
            s++;
        } else if (*s == '"' || *s == '\\') {
            fprintf(f, "\\%c", *s);
            s++;
        } else if (*s < 0x20) {
            fprintf(f, "\\u%04x", *s);
            s++;
        } else {
            fwrite(s, 1, n, f);
            s += n;
        }
    }
    fputc('"', f);
}

const char *stoker_display_path(const char *path, char *buf, size_t n)
{
    /* One rule for the library's messages and the tool's. */
    return stk_path_display(path, buf, n);
}

const stk_option_info *stoker_flag_option(const char *flag, char *key, size_t n)
{
    if (!flag || strncmp(flag, "--", 2) || !n)
        return NULL;
    size_t k = 0;
    for (const char *s = flag + 2; *s && k + 1 < n; s++, k++)
        key[k] = *s == '-' ? '_' : *s == '_' ? '\0' : *s; /* --cache_dir is no flag */
    key[k] = '\0';
    if (strlen(key) != strlen(flag + 2))
        return NULL;
    return stk_option_by_name(key);
}
