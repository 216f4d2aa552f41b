/*
 * info.c -- `stoker info PATH` (what a dataset holds) and `stoker verify
 * PATH` (reads every sample, checking every checksum, and lists each corrupt
 * or unreadable one by shard, index and key).
 */
#include "commands.h"

#include "source/source.h"
#include "source/stkformat.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Parses PATH and the record options shared by info and verify. */
static int parse_path(int argc, char **argv, const char **path, stk__source_params *prm)
{
    const char *header_opt = NULL;
    memset(prm, 0, sizeof *prm);
    *path = NULL;
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t v;
        if (!strcmp(k, "--record-size")) {
            if (val && !strcmp(val, "0")) {
                fprintf(stderr, "stoker: --record-size 0 is not a valid record size (a record "
                                "holds at least 1 byte)\n");
                return 2;
            }
            if (!stoker_parse_opt(k, val, 1, SIZE_MAX, &v))
                return 2;
            prm->record_bytes = (size_t)v;
            i++;
        } else if (!strcmp(k, "--header-bytes")) {
            if (!stoker_parse_opt(k, val, 0, SIZE_MAX, &v))
                return 2;
            prm->header_bytes = (size_t)v;
            header_opt = k;
            i++;
        } else if (!strcmp(k, "--label-bytes")) {
            if (!stoker_parse_opt(k, val, 0, 8, &v))
                return 2;
            prm->label_bytes = (unsigned)v;
            header_opt = k;
            i++;
        } else if (k[0] == '-' && k[1] == '-') {
            fprintf(stderr, "stoker: unknown option '%s'\n", k);
            return 2;
        } else if (!*path) {
            *path = k;
        } else {
            fprintf(stderr, "stoker: unexpected argument '%s'\n", k);
            return 2;
        }
    }
    if (!*path) {
        fprintf(stderr, "stoker: %s needs a dataset PATH\n", argv[1]);
        return 2;
    }
    if (header_opt && !prm->record_bytes) {
        fprintf(stderr, "stoker: %s applies to record files; give --record-size too\n", header_opt);
        return 2;
    }
    return 0;
}

int stoker_cmd_info(int argc, char **argv)
{
    const char *path;
    stk__source_params prm;
    stk__source s;
    char err[STK_ERRMSG_MAX], b1[32];
    int rc = parse_path(argc, argv, &path, &prm);
    if (rc)
        return rc;
    if ((rc = stk__source_open(&s, path, &prm, err, sizeof err))) {
        fprintf(stderr, "stoker: cannot open %s: %s (%s)\n", path, err, stk_strerror(rc));
        return 1;
    }
    stk__dataset_info di;
    stk__source_describe(&s, &di);
    printf("path      %s\n", path);
    printf("format    %s", di.format);
    if (di.payload)
        printf(" (%s payloads", di.payload);
    if (di.raw_c && !strcmp(di.format, "stk"))
        printf(", %ux%ux%u HWC uint8", di.raw_h, di.raw_w, di.raw_c);
    if (di.payload)
        printf(")");
    printf("\nsamples   %" PRIu64 "\n", s.count);
    printf("classes   %" PRIu64 "\n", s.num_classes);
    if (di.shards) {
        printf("shards    %" PRIu64 "\n", di.shards);
        printf("bytes     %" PRIu64 " (%s)\n", di.bytes,
               stoker_human_bytes((double)di.bytes, b1, sizeof b1));
    }
    if (s.fixed_len)
        printf("sample    %zu bytes each (dense batches)\n", s.fixed_len);
    printf("index     %" PRIu64 " bytes in memory\n", s.index_bytes);
    stk__source_close(&s);
    return 0;
}

/* Reads every sample of s, printing each failure. Returns the failures. */
static uint64_t verify_source(stk__source *s, uint64_t *checked)
{
    stk__scratch sc = {NULL, 0, 1u << 30};
    uint64_t bad = 0;
    char err[STK_ERRMSG_MAX], name[4096];
    for (uint64_t i = 0; i < s->count; i++) {
        stk__sink sink = {NULL, 0, &sc};
        uint8_t *data;
        size_t len;
        int64_t label;
        int rc = s->ops->read(s, i, &sink, &data, &len, &label, err, sizeof err);
        if (rc) {
            s->ops->name(s, i, name, sizeof name);
            printf("corrupt   %s: %s\n", name, err);
            bad++;
        }
    }
    *checked += s->count;
    stk__scratch_free(&sc);
    return bad;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int stoker_cmd_verify(int argc, char **argv)
{
    const char *path;
    stk__source_params prm;
    stk__source s;
    char err[STK_ERRMSG_MAX];
    uint64_t bad = 0, checked = 0, bad_shards = 0;
    int rc = parse_path(argc, argv, &path, &prm);
    if (rc)
        return rc;
    rc = stk__source_open(&s, path, &prm, err, sizeof err);
    if (rc == STK_OK) {
        bad = verify_source(&s, &checked);
        stk__source_close(&s);
    } else {
        /* The dataset as a whole does not open: check shard by shard, so one
         * broken shard does not hide the state of the others. */
        struct stat st;
        DIR *d = stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? opendir(path) : NULL;
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l < 5 || (strcmp(e->d_name + l - 4, ".stk") && strcmp(e->d_name + l - 4, ".tar")))
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **q = realloc(names, cap * sizeof *q);
                if (!q)
                    break;
                names = q;
            }
            if (!(names[n] = strdup(e->d_name)))
                break;
            n++;
        }
        if (d)
            closedir(d);
        if (!n) {
            fprintf(stderr, "stoker: cannot open %s: %s (%s)\n", path, err, stk_strerror(rc));
            free(names);
            return 1;
        }
        printf("dataset   %s: %s\n", path, err);
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t k = 0; k < n; k++) {
            char one[4096], why[STK_ERRMSG_MAX];
            snprintf(one, sizeof one, "%s/%s", path, names[k]);
            stk__source_params none = {0};
            int r = stk__source_open(&s, one, &none, why, sizeof why);
            if (r == STK_OK) {
                bad += verify_source(&s, &checked);
                stk__source_close(&s);
            } else {
                printf("corrupt   %s: the whole shard: %s\n", one, why);
                bad_shards++;
            }
            free(names[k]);
        }
        free(names);
        bad_shards += bad_shards == 0; /* the dataset itself failed to open */
    }
    printf("verify    %" PRIu64 " samples checked, %" PRIu64 " corrupt%s\n", checked, bad,
           bad_shards ? ", and the dataset does not open as a whole" : "");
    return bad || bad_shards ? 1 : 0;
}
