/* cliutil.c -- small helpers shared by the `stoker` subcommands. */
#include "commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool stoker_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ULL << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1ULL << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1ULL << 30, end++;
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B' && mul > 1)
        end++;
    if (errno || *end || end == s || v > UINT64_MAX / mul)
        return false;
    *out = (uint64_t)v * mul;
    return true;
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

void stoker_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

const char *stoker_display_path(const char *path, char *buf, size_t n)
{
    const char *sep = strstr(path, "://");
    if (!sep || !n)
        return path;
    const char *host = sep + 3, *end = host;
    while (*end && *end != '/' && *end != '?')
        end++;
    const char *at = NULL;
    for (const char *p = host; p < end; p++)
        if (*p == '@')
            at = p;
    const char *from = at ? at + 1 : host;
    const char *q = strchr(from, '?');
    size_t head = (size_t)(host - path), rest = q ? (size_t)(q - from) : strlen(from);
    snprintf(buf, n, "%.*s%.*s%s", (int)head, path, (int)rest, from, q ? "?..." : "");
    return buf;
}
