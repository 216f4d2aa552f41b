/*
 * info.c -- `stoker info PATH` (what a dataset holds) and `stoker verify
 * PATH` (reads every sample, checking every checksum, and lists each corrupt
 * or unreadable one by shard, index and key). Both print what the library's
 * dataset-inspection API (stk_dataset_*, include/stoker.h) answers.
 */
#include "commands.h"

#include "stoker.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The remote-dataset options info and verify take (docs/remote.md). */
static bool remote_key(const char *key)
{
    static const char *const used[] = {"endpoint",      "region",       "cache_dir",
                                       "addressing",    "cache_limit",  "fetch_concurrency",
                                       "fetch_retries", "fetch_timeout"};
    for (size_t u = 0; u < sizeof used / sizeof used[0]; u++)
        if (!strcmp(key, used[u]))
            return true;
    return false;
}

/* Sets the option flag k names (--endpoint URL ...) on o, when it is one of
 * remote_key's. 1 when k was one, 0 when not, 2 for a bad value (with the
 * library's message printed). */
static int parse_remote(const char *k, const char *v, stk_options *o)
{
    char key[64];
    const stk_option_info *opt = stoker_flag_option(k, key, sizeof key);
    if (!opt || !remote_key(key))
        return 0;
    if (stk_options_set(o, key, v) != STK_OK) {
        fprintf(stderr, "stoker: %s%s\n", k, stk_options_errmsg(o) + strlen(key));
        return 2;
    }
    return 1;
}

/* Parses PATH and the record, remote and (verify) --max-input-bytes options
 * shared by info and verify into *path and o. 0, or 2 with the message
 * printed. */
static int parse_path(int argc, char **argv, const char **path, stk_options *o)
{
    const char *header_opt = NULL;
    size_t record_bytes = 0, header_bytes = 0;
    unsigned label_bytes = 0;
    *path = NULL;
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i];
        int r = i + 1 < argc ? parse_remote(k, argv[i + 1], o) : 0;
        if (r == 2)
            return 2;
        if (r == 1) {
            i++;
            continue;
        }
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
            record_bytes = (size_t)v;
            i++;
        } else if (!strcmp(k, "--header-bytes")) {
            if (!stoker_parse_opt(k, val, 0, SIZE_MAX, &v))
                return 2;
            header_bytes = (size_t)v;
            header_opt = k;
            i++;
        } else if (!strcmp(k, "--max-input-bytes") && !strcmp(argv[1], "verify")) {
            if (!stoker_parse_bytes(k, val, 4096, (uint64_t)1 << 40, &v))
                return 2;
            if (stk_options_set(o, "max_input_bytes", val) != STK_OK) {
                fprintf(stderr, "stoker: %s: %s\n", k, stk_options_errmsg(o));
                return 2;
            }
            i++;
        } else if (!strcmp(k, "--label-bytes")) {
            if (!stoker_parse_opt(k, val, 0, 8, &v))
                return 2;
            label_bytes = (unsigned)v;
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
    if (header_opt && !record_bytes) {
        fprintf(stderr, "stoker: %s applies to record files; give --record-size too\n", header_opt);
        return 2;
    }
    if (record_bytes &&
        stk_options_set_records(o, record_bytes, header_bytes, label_bytes) != STK_OK) {
        fprintf(stderr, "stoker: --record-size %zu --label-bytes %u: %s\n", record_bytes,
                label_bytes, stk_options_errmsg(o));
        return 2;
    }
    return 0;
}

/* Creates the options and parses the arguments into them: 0, or the exit
 * status (2 bad usage, 1 out of memory) with the message printed. */
static int parse_args(int argc, char **argv, const char **path, stk_options **o)
{
    if (stk_options_create(o) != STK_OK) {
        fprintf(stderr, "stoker: out of memory\n");
        return 1;
    }
    int rc = parse_path(argc, argv, path, *o);
    if (rc) {
        stk_options_destroy(*o);
        *o = NULL;
    }
    return rc;
}

/* The fields the dataset's samples have (stk_dataset_field), one line each:
 * name, kind (the source's, else the one the name implies, marked so) and
 * how many samples have it. */
static void print_fields(const stk_dataset *d)
{
    size_t n = stk_dataset_field_count(d);
    for (size_t k = 0; k < n; k++) {
        stk_dataset_field_info f = {.struct_size = sizeof f};
        if (stk_dataset_field(d, k, &f) != STK_OK)
            continue;
        bool implied = f.kind == STK_FIELD_AUTO;
        const char *kind = stk_field_kind_name(implied ? stk_field_kind_for_name(f.name) : f.kind);
        printf("field     %-12s %-6s%s", f.name, kind ? kind : "?",
               implied ? " (by its name)" : "");
        if (f.samples == UINT64_MAX)
            printf("  samples not counted\n");
        else
            printf("  %" PRIu64 " samples\n", f.samples);
    }
}

int stoker_cmd_info(int argc, char **argv)
{
    const char *path;
    stk_options *o;
    stk_dataset *d;
    char err[1024], b1[32], shown[4096];
    int rc = parse_args(argc, argv, &path, &o);
    if (rc)
        return rc;
    rc = stk_dataset_open(&d, path, o, err, sizeof err);
    stk_options_destroy(o);
    if (rc) {
        fprintf(stderr, "stoker: cannot open %s: %s (%s)\n",
                stoker_display_path(path, shown, sizeof shown), err, stk_strerror(rc));
        return 1;
    }
    stk_dataset_info di = {.struct_size = sizeof di};
    stk_dataset_describe(d, &di);
    printf("path      %s\n", stoker_display_path(path, shown, sizeof shown));
    printf("format    %s", di.kind);
    if (di.payload)
        printf(" (%s payloads", di.payload);
    if (di.raw_c && !strcmp(di.kind, "stk"))
        printf(", %ux%ux%u HWC uint8", di.raw_h, di.raw_w, di.raw_c);
    if (di.payload)
        printf(")");
    printf("\nsamples   %" PRIu64 "\n", di.samples);
    printf("classes   %" PRIu64 "\n", di.classes);
    if (di.files) {
        printf("shards    %" PRIu64 "\n", di.files);
        printf("bytes     %" PRIu64 " (%s)\n", di.bytes,
               stoker_human_bytes((double)di.bytes, b1, sizeof b1));
    }
    if (di.sample_bytes)
        printf("sample    %zu bytes each (dense batches)\n", di.sample_bytes);
    if (di.restart_indexed >= 0)
        printf("restart   %" PRId64 " of %" PRIu64 " samples restart-indexed (crops decode only "
               "their MCUs; docs/images.md)\n",
               di.restart_indexed, di.samples);
    else if (!strcmp(di.kind, "stk"))
        printf("restart   not recorded (packed without --restart)\n");
    print_fields(d);
    printf("index     %" PRIu64 " bytes in memory\n", di.index_bytes);
    /* A .stk of fields: its stored fields, each one's kind and how many
     * samples have it (other sources' fields are listed by --fields users'
     * docs, docs/multimodal.md). */
    for (size_t k = 0;
         di.payload && !strcmp(di.payload, "fields") && k < stk_dataset_field_count(d); k++) {
        stk_dataset_field_info fi = {.struct_size = sizeof fi};
        if (stk_dataset_field(d, k, &fi) != STK_OK)
            continue;
        int kind = fi.kind ? fi.kind : stk_field_kind_for_name(fi.name);
        printf("field     %s (%s%s), %" PRIu64 " of %" PRIu64 " samples\n", fi.name,
               stk_field_kind_name(kind), fi.kind ? "" : ", by its name", fi.samples, di.samples);
    }
    stk_dataset_close(d);
    return 0;
}

/* Prints one problem verify found, as a line "KIND NAME: REASON". */
static void print_problem(const stk_verify_problem *p, void *user)
{
    (void)user;
    static const char *const label[] = {"",         "corrupt", "too large",
                                        "manifest", "corrupt", "dataset"};
    const char *l = p->kind > 0 && p->kind <= STK_VERIFY_DATASET ? label[p->kind] : "problem";
    if (*p->name)
        printf("%-9s %s: %s\n", l, p->name, p->reason);
    else
        printf("%-9s %s\n", l, p->reason);
}

int stoker_cmd_verify(int argc, char **argv)
{
    const char *path;
    stk_options *o;
    char err[1024];
    int rc = parse_args(argc, argv, &path, &o);
    if (rc)
        return rc;
    stk_verify_result v = {.struct_size = sizeof v};
    rc = stk_dataset_verify(path, o, print_problem, NULL, &v, err, sizeof err);
    stk_options_destroy(o);
    if (rc) {
        fprintf(stderr, "stoker: %s\n", err);
        return 1;
    }
    printf("verify    %" PRIu64 " samples checked, %" PRIu64 " corrupt", v.checked, v.corrupt);
    if (v.indexed)
        printf(", %" PRIu64 " restart indexes checked", v.indexed);
    if (v.bad_shards) {
        printf(", %" PRIu64 " unreadable in %" PRIu64 " shard%s", v.unreadable, v.bad_shards,
               v.bad_shards == 1 ? "" : "s");
        if (v.uncounted_shards)
            printf(" (%" PRIu64 " of them too damaged to count their samples)", v.uncounted_shards);
    }
    if (v.too_large)
        printf(", %" PRIu64 " over max_input_bytes", v.too_large);
    if (v.manifest)
        printf(", %" PRIu64 " manifest problem%s", v.manifest, v.manifest == 1 ? "" : "s");
    if (!v.whole)
        printf("; the dataset does not open as a whole");
    printf("\n");
    if (v.foreign)
        printf("note      %" PRIu64 " image%s not JPEG or PNG (the first: %s): such images load "
               "with --transform none, but stoker's transforms decode only JPEG and PNG\n",
               v.foreign, v.foreign == 1 ? " is" : "s are", v.foreign_format);
    return v.corrupt || v.too_large || v.bad_shards || v.manifest || !v.whole ? 1 : 0;
}
