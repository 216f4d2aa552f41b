/*
 * info.c -- `stoker info PATH` (what a dataset holds) and `stoker verify
 * PATH` (reads every sample, checking every checksum, and lists each corrupt
 * or unreadable one by shard, index and key).
 */
#include "commands.h"
#include "codec/jpeg_restart.h"

#include "pack/pack.h"
#include "source/dataset.h"
#include "source/manifest.h"
#include "source/stkformat.h"
#include "io/remote.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Remote-dataset settings of info and verify (docs/remote.md). */
static stk__remote_cfg g_remote;
/* verify: the largest encoded image a decode accepts (--max-input-bytes, as
 * bench and the loader's max_input_bytes; the library's default). */
static uint64_t g_max_input = 32u << 20;

/* Parses one remote option (--endpoint URL ...) into prm. 1 when k was one,
 * 0 when not, 2 for a bad value (with the library's message printed: the
 * value is checked by the option table, as bench checks it). */
static int parse_remote(const char *k, const char *v, stk__source_params *prm)
{
    static const char *const used[] = {"endpoint",          "region",        "cache_dir",
                                       "addressing",        "cache_limit",   "fetch_concurrency",
                                       "fetch_retries",     "fetch_timeout"};
    char key[64];
    const stk_option_info *opt = stoker_flag_option(k, key, sizeof key);
    size_t u = 0;
    while (opt && u < sizeof used / sizeof used[0] && strcmp(key, used[u]))
        u++;
    if (!opt || u == sizeof used / sizeof used[0])
        return 0;
    stk_options *check = NULL;
    int rc = stk_options_create(&check);
    if (rc == STK_OK && (rc = stk_options_set(check, key, v)) != STK_OK)
        fprintf(stderr, "stoker: %s%s\n", k, stk_options_errmsg(check) + strlen(key));
    stk_options_destroy(check);
    if (rc != STK_OK)
        return 2;
    uint64_t n = 0;
    prm->remote = &g_remote;
    if (opt->type == STK_OPTION_UINT || opt->type == STK_OPTION_SIZE)
        stoker_parse_size(v, &n);
    if (!strcmp(key, "endpoint"))
        g_remote.endpoint = v;
    else if (!strcmp(key, "region"))
        g_remote.region = v;
    else if (!strcmp(key, "cache_dir"))
        prm->cache_dir = v;
    else if (!strcmp(key, "addressing"))
        g_remote.addressing = v[0] == 'p' ? 1 : v[0] == 'v' ? 2 : 0;
    else if (!strcmp(key, "cache_limit"))
        prm->cache_limit = n;
    else if (!strcmp(key, "fetch_concurrency"))
        g_remote.concurrency = (unsigned)n;
    else if (!strcmp(key, "fetch_retries"))
        g_remote.retries = n ? (unsigned)n : UINT32_MAX;
    else
        g_remote.timeout_s = (unsigned)n;
    return 1;
}

/* Parses PATH and the record options shared by info and verify. */
static int parse_path(int argc, char **argv, const char **path, stk__source_params *prm)
{
    const char *header_opt = NULL;
    memset(prm, 0, sizeof *prm);
    *path = NULL;
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i];
        int r = i + 1 < argc ? parse_remote(k, argv[i + 1], prm) : 0;
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
            prm->record_bytes = (size_t)v;
            i++;
        } else if (!strcmp(k, "--header-bytes")) {
            if (!stoker_parse_opt(k, val, 0, SIZE_MAX, &v))
                return 2;
            prm->header_bytes = (size_t)v;
            header_opt = k;
            i++;
        } else if (!strcmp(k, "--max-input-bytes") && !strcmp(argv[1], "verify")) {
            if (!stoker_parse_bytes(k, val, 4096, (uint64_t)1 << 40, &v))
                return 2;
            g_max_input = v;
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
        char shown[4096];
        fprintf(stderr, "stoker: cannot open %s: %s (%s)\n",
                stoker_display_path(path, shown, sizeof shown), err, stk_strerror(rc));
        return 1;
    }
    stk__dataset_info di;
    stk__source_describe(&s, &di);
    char shown_path[4096];
    printf("path      %s\n", stk__url_display(path, shown_path, sizeof shown_path));
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
    if (di.restart_indexed >= 0)
        printf("restart   %" PRId64 " of %" PRIu64 " samples restart-indexed (crops decode only "
               "their MCUs; docs/images.md)\n",
               di.restart_indexed, s.count);
    else if (!strcmp(di.format, "stk"))
        printf("restart   not recorded (packed without --restart)\n");
    printf("index     %" PRIu64 " bytes in memory\n", s.index_bytes);
    stk__source_close(&s);
    return 0;
}

/* What verify found, over the whole dataset or shard by shard. */
typedef struct vstate {
    uint64_t checked;          /* samples read */
    uint64_t corrupt;          /* of those, failed (each listed) */
    uint64_t unreadable;       /* samples in shards that do not open */
    uint64_t bad_shards;       /* shards that do not open */
    uint64_t uncounted_shards; /* of those, ones whose sample count is unknown */
    uint64_t manifest;         /* manifest disagreements (each listed) */
    uint64_t foreign;          /* images in formats stoker does not decode */
    uint64_t indexed;          /* JPEGs with a restart index (checked) */
    uint64_t too_large;        /* images over max_input_bytes (each listed) */
    const char *foreign_format;
} vstate;

/* Reads every sample of s, printing each failure; samples that claim to be
 * images (stk__images_of) must also be images. root: the path s was
 * opened from (for keys). */
static void verify_source(stk__source *s, const char *root, vstate *v)
{
    stk__scratch sc = {NULL, 0, 1u << 30};
    char err[STK_ERRMSG_MAX], name[4096], key[4096];
    int images = stk__images_of(s);
    for (uint64_t i = 0; i < s->count; i++) {
        stk__sink sink = {.grow = &sc};
        uint8_t *data;
        size_t len;
        int64_t label;
        const char *format = NULL;
        int rc = s->ops->read(s, i, &sink, &data, &len, &label, err, sizeof err);
        if (rc == STK_OK && len >= 3 && data[0] == 0xFF && data[1] == 0xD8) {
            /* A restart index must match its payload in full. */
            stk__rst x;
            int f = stk__rst_find(data, len, &x, err, sizeof err);
            if (f < 0 || (f == 1 && stk__rst_verify(data, len, &x, err, sizeof err)))
                rc = STK_EFORMAT;
            else
                v->indexed += (uint64_t)f;
        }
        if (rc == STK_OK && images) {
            if (images == 2)
                stk__source_key(s, root, i, key, sizeof key);
            if ((images == 1 || stk__image_name(key)) &&
                stk__check_image(data, len, &format, err, sizeof err))
                rc = STK_EFORMAT;
            else if (format && strcmp(format, "JPEG") && strcmp(format, "PNG") && !v->foreign++)
                v->foreign_format = format;
        }
        if (rc) {
            s->ops->name(s, i, name, sizeof name);
            printf("corrupt   %s: %s\n", name, err);
            v->corrupt++;
        } else if (len > g_max_input && len >= 3 &&
                   ((data[0] == 0xFF && data[1] == 0xD8) || !memcmp(data, "\x89PN", 3))) {
            /* Intact, but no decode takes it: every run with a transform
             * would fail this sample. */
            s->ops->name(s, i, name, sizeof name);
            printf("too large %s: an image of %zu bytes, over max_input_bytes (%" PRIu64
                   "): every decode refuses it; raise the limit (--max-input-bytes, "
                   "options={\"max_input_bytes\": N}) or re-encode it (pack --max-side)\n",
                   name, len, g_max_input);
            v->too_large++;
        }
    }
    v->checked += s->count;
    stk__scratch_free(&sc);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads the header and footer of the .stk file at path, without trusting
 * the rest. Returns a mask: 1 the header decoded, 2 the footer did. */
static int read_ends(const char *path, stk__stk_header *h, stk__stk_footer *f)
{
    char why[STK_ERRMSG_MAX];
    uint8_t hdr[STK_HEADER_SIZE], foot[STK_FOOTER_SIZE];
    int fd = open(path, O_RDONLY | O_CLOEXEC), ok = 0;
    struct stat st;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size >= STK_HEADER_SIZE + STK_FOOTER_SIZE) {
        if (!stk__pread_full(fd, hdr, sizeof hdr, 0, why, sizeof why) &&
            !stk__stk_header_decode(hdr, h, why, sizeof why))
            ok |= 1;
        if (!stk__pread_full(fd, foot, sizeof foot, (uint64_t)st.st_size - STK_FOOTER_SIZE, why,
                             sizeof why) &&
            !stk__stk_footer_decode(foot, (uint64_t)st.st_size, f, why, sizeof why))
            ok |= 2;
    }
    close(fd);
    return ok;
}

static int cmp_shard_name(const void *a, const void *b)
{
    const stk__manifest_shard *x = *(const stk__manifest_shard *const *)a;
    const stk__manifest_shard *y = *(const stk__manifest_shard *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x < y ? -1 : x > y);
}

/* Checks what the manifest of directory dir says against its shards: each
 * shard listed once and present, its size, payload kind, sample count and
 * class count; the total of samples. Prints each disagreement. */
static void check_manifest(const char *dir, const stk__manifest *m, vstate *v)
{
    uint64_t total = 0;
    const stk__manifest_shard **byname = NULL;
    if (m->nshards && (byname = malloc(m->nshards * sizeof *byname))) {
        for (size_t k = 0; k < m->nshards; k++)
            byname[k] = &m->shards[k];
        qsort(byname, m->nshards, sizeof *byname, cmp_shard_name);
        for (size_t k = 1; k < m->nshards; k++)
            if (!strcmp(byname[k]->name, byname[k - 1]->name)) {
                printf("manifest  %s: shard %s is listed twice (entries %zu and %zu): its "
                       "samples would be read twice\n",
                       dir, byname[k]->name, (size_t)(byname[k - 1] - m->shards),
                       (size_t)(byname[k] - m->shards));
                v->manifest++;
            }
        free(byname);
    }
    for (size_t k = 0; k < m->nshards; k++) {
        const stk__manifest_shard *ms = &m->shards[k];
        char path[4096];
        stk__stk_header h;
        stk__stk_footer f;
        struct stat st;
        total += ms->count;
        snprintf(path, sizeof path, "%s/%s", dir, ms->name);
        if (stat(path, &st) != 0) {
            printf("manifest  %s: listed in the manifest, but %s\n", path, strerror(errno));
            v->manifest++;
            continue;
        }
        if ((uint64_t)st.st_size != ms->bytes) {
            printf("manifest  %s: %" PRIu64 " bytes, the manifest says %" PRIu64 "\n", path,
                   (uint64_t)st.st_size, ms->bytes);
            v->manifest++;
        }
        /* What does not decode, the shard checks below report. */
        int ends = read_ends(path, &h, &f);
        if ((ends & 1) && h.kind != m->kind) {
            printf("manifest  %s: payload kind %s, the manifest says %s\n", path,
                   stk__payload_kind_name(h.kind), stk__payload_kind_name(m->kind));
            v->manifest++;
        }
        if (!(ends & 2))
            continue;
        if (f.count != ms->count) {
            printf("manifest  %s: %" PRIu64 " samples, the manifest says %" PRIu64 "\n", path,
                   f.count, ms->count);
            v->manifest++;
        }
        if (f.num_classes != m->classes) {
            printf("manifest  %s: written for %" PRIu64 " classes, the manifest says %" PRIu64 "\n",
                   path, f.num_classes, m->classes);
            v->manifest++;
        }
    }
    if (total != m->samples) {
        printf("manifest  %s: the shards listed hold %" PRIu64 " samples, the manifest says "
               "%" PRIu64 "\n",
               dir, total, m->samples);
        v->manifest++;
    }
}

/* The shard files of directory dir: the manifest's (each once, in its
 * order) if it has one, else every .stk and .tar file by name. *counts
 * gets each one's sample count by the manifest, or UINT64_MAX. */
static size_t list_shards(const char *dir, const stk__manifest *m, char ***out, uint64_t **counts)
{
    char **names = NULL;
    uint64_t *cnt = NULL;
    size_t n = 0, cap = 0;
    if (m && m->nshards) {
        names = calloc(m->nshards, sizeof *names);
        cnt = calloc(m->nshards, sizeof *cnt);
        for (size_t k = 0; names && cnt && k < m->nshards; k++) {
            bool seen = false;
            for (size_t j = 0; j < n && !seen; j++)
                seen = !strcmp(names[j], m->shards[k].name);
            if (seen || !(names[n] = strdup(m->shards[k].name)))
                continue;
            cnt[n++] = m->shards[k].count;
        }
    } else {
        struct stat st;
        DIR *d = stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? opendir(dir) : NULL;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l < 5 || (strcmp(e->d_name + l - 4, ".stk") && strcmp(e->d_name + l - 4, ".tar")))
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **q = realloc(names, cap * sizeof *q);
                uint64_t *c = q ? realloc(cnt, cap * sizeof *c) : NULL;
                if (q)
                    names = q;
                if (!c)
                    break;
                cnt = c;
            }
            if (!(names[n] = strdup(e->d_name)))
                break;
            cnt[n++] = UINT64_MAX;
        }
        if (d)
            closedir(d);
        qsort(names, n, sizeof *names, cmp_str);
    }
    *out = names;
    *counts = cnt;
    return n;
}

/* The shards of the remote directory url, as stk__source_open would find
 * them: its manifest's (each once, in its order; *counts from it), else the
 * .stk or .tar objects a listing finds (S3), by name (*counts UINT64_MAX).
 * 0 when there are none or they cannot be found (a single object, a plain
 * HTTP server without a manifest, a brace pattern). */
static size_t list_remote_shards(const char *url, const stk__source_params *prm, char ***out,
                                 uint64_t **counts)
{
    char **names = NULL, **lnames = NULL, *text = NULL, err[STK_ERRMSG_MAX];
    uint64_t *cnt = NULL, *lsizes = NULL;
    size_t n = 0, ln = 0, tlen = 0;
    stk__remote *r = NULL;
    stk__remote_cfg none = {0};
    *out = NULL;
    *counts = NULL;
    if (strchr(url, '{') || stk__remote_open(&r, url, prm->remote ? prm->remote : &none, err,
                                             sizeof err))
        return 0;
    if (stk__remote_names_object(r))
        goto out;
    int rc = stk__remote_get_small(r, STK_MANIFEST, 64u << 20, &text, &tlen, err, sizeof err);
    if (rc == STK_OK) {
        stk__manifest man;
        if (stk__manifest_parse(text, tlen, url, &man, err, sizeof err) == STK_OK) {
            if (man.nshards)
                n = list_shards(NULL, &man, &names, &cnt);
            stk__manifest_free(&man);
        }
        goto out;
    }
    if (rc != STK_ENOENT || stk__remote_list(r, &lnames, &lsizes, &ln, err, sizeof err))
        goto out;
    names = calloc(ln ? ln : 1, sizeof *names);
    cnt = calloc(ln ? ln : 1, sizeof *cnt);
    for (size_t k = 0; names && cnt && k < ln; k++) {
        size_t l = strlen(lnames[k]);
        if (l < 5 || (strcmp(lnames[k] + l - 4, ".stk") && strcmp(lnames[k] + l - 4, ".tar")) ||
            !(names[n] = strdup(lnames[k])))
            continue;
        cnt[n++] = UINT64_MAX;
    }
    if (names)
        qsort(names, n, sizeof *names, cmp_str);
out:
    stk__free(text);
    stk__remote_list_free(lnames, lsizes, ln);
    stk__remote_close(r);
    *out = names;
    *counts = cnt;
    return n;
}

int stoker_cmd_verify(int argc, char **argv)
{
    const char *path;
    stk__source_params prm;
    stk__source s;
    stk__manifest man;
    char err[STK_ERRMSG_MAX];
    vstate v = {0};
    bool have_man = false, whole = true;
    struct stat st;
    int rc = parse_path(argc, argv, &path, &prm);
    if (rc)
        return rc;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = stk__manifest_read(path, &man, err, sizeof err);
        if (rc == STK_OK) {
            have_man = true;
            check_manifest(path, &man, &v);
        } else if (rc != STK_ENOENT) {
            printf("manifest  %s\n", err);
            v.manifest++;
        }
    }
    rc = stk__source_open(&s, path, &prm, err, sizeof err);
    if (rc == STK_OK) {
        if (have_man && s.num_classes > man.classes) {
            printf("manifest  %s: labels go up to %" PRIu64 ", the manifest says %" PRIu64
                   " classes\n",
                   path, s.num_classes - 1, man.classes);
            v.manifest++;
        }
        verify_source(&s, path, &v);
        stk__source_close(&s);
        if (have_man && man.has_restart && man.restart_indexed != v.indexed && !v.corrupt) {
            printf("manifest  %s: %" PRIu64 " samples carry a restart index, the manifest says "
                   "%" PRIu64 "\n",
                   path, v.indexed, man.restart_indexed);
            v.manifest++;
        }
    } else {
        /* The dataset as a whole does not open: check shard by shard, so one
         * broken shard does not hide the state of the others, and count
         * what could not be checked. */
        whole = false;
        char **names = NULL;
        uint64_t *counts = NULL;
        bool remote = stk__is_url(path);
        char shown[4096], one_shown[4096];
        size_t n = remote ? list_remote_shards(path, &prm, &names, &counts)
                          : list_shards(path, have_man ? &man : NULL, &names, &counts);
        if (!n) {
            fprintf(stderr, "stoker: cannot open %s: %s (%s)\n",
                    stoker_display_path(path, shown, sizeof shown), err, stk_strerror(rc));
            free(names);
            free(counts);
            if (have_man)
                stk__manifest_free(&man);
            return 1;
        }
        printf("dataset   %s: %s\n", stoker_display_path(path, shown, sizeof shown), err);
        for (size_t k = 0; k < n; k++) {
            char one[4096], why[STK_ERRMSG_MAX];
            size_t pl = strlen(path);
            while (remote && pl && path[pl - 1] == '/')
                pl--;
            snprintf(one, sizeof one, "%.*s/%s", (int)pl, path, names[k]);
            /* A remote shard is opened with the dataset's remote settings
             * (endpoint, credentials' region, cache), each on its own. */
            stk__source_params none = {0};
            int r = stk__source_open(&s, one, remote ? &prm : &none, why, sizeof why);
            if (r == STK_OK) {
                verify_source(&s, one, &v);
                stk__source_close(&s);
            } else {
                stk__stk_header h;
                stk__stk_footer f;
                uint64_t c = counts[k];
                if (c == UINT64_MAX && !remote && (read_ends(one, &h, &f) & 2))
                    c = f.count; /* the footer is intact: it knows the count */
                printf("corrupt   %s: the whole shard",
                       stoker_display_path(one, one_shown, sizeof one_shown));
                if (c != UINT64_MAX)
                    printf(" (%" PRIu64 " samples)", c);
                printf(": %s\n", why);
                v.bad_shards++;
                if (c == UINT64_MAX)
                    v.uncounted_shards++;
                else
                    v.unreadable += c;
            }
            free(names[k]);
        }
        free(names);
        free(counts);
    }
    if (have_man)
        stk__manifest_free(&man);
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
    if (!whole)
        printf("; the dataset does not open as a whole");
    printf("\n");
    if (v.foreign)
        printf("note      %" PRIu64 " image%s not JPEG or PNG (the first: %s): such images load "
               "with --transform none, but stoker's transforms decode only JPEG and PNG\n",
               v.foreign, v.foreign == 1 ? " is" : "s are", v.foreign_format);
    return v.corrupt || v.too_large || v.bad_shards || v.manifest || !whole ? 1 : 0;
}
