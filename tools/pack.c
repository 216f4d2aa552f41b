/*
 * pack.c -- `stoker pack SRC OUT`: the command line over stk_pack
 * (include/stoker.h, src/pack/pack.c), which writes any dataset stoker can
 * read as .stk shards plus a manifest (docs/format.md, docs/shards.md). This
 * file parses the arguments, draws the progress bar on a terminal, lists the
 * samples skipped under --skip-bad and prints the summary line.
 */
#include "commands.h"

#include "stoker.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cli_progress {
    bool tty;   /* draw the bar */
    bool drawn; /* a bar line is open (not ended by a newline) */
} cli_progress;

static void draw_bar(cli_progress *c, const stk_pack_progress *pr, bool final)
{
    uint64_t n = pr->total, done = pr->done;
    double dt = pr->seconds;
    int bar = (int)(n ? 30 * done / n : 30);
    char b[31];
    for (int k = 0; k < 30; k++)
        b[k] = k < bar ? '#' : '.';
    b[30] = '\0';
    fprintf(stderr, "\rpack [%s] %3d%% %" PRIu64 "/%" PRIu64 " samples, %.0f/s, %.1f MiB%s", b,
            (int)(n ? 100 * done / n : 100), done, n, dt > 0 ? (double)done / dt : 0.0,
            (double)pr->bytes / 1048576.0, final ? "\n" : "");
    fflush(stderr);
    c->drawn = !final;
}

static int on_progress(const stk_pack_progress *pr, void *user)
{
    cli_progress *c = user;
    if (pr->skipped_key) {
        fprintf(stderr, "%sstoker pack: skipped sample %" PRIu64 " (%s): %s\n", c->tty ? "\n" : "",
                pr->skipped_index, pr->skipped_key, pr->skipped_reason);
        c->drawn = false;
        return 0;
    }
    if (c->tty)
        draw_bar(c, pr, pr->done == pr->total && pr->total);
    return 0;
}

int stoker_pack(const stoker_pack_opts *o, char *err, size_t errlen)
{
    cli_progress c = {o->progress < 0 ? isatty(2) != 0 : o->progress > 0, false};
    stk_pack_options po = {.struct_size = sizeof po};
    po.shard_size = o->shard_size;
    po.max_side = o->max_side;
    po.quality = o->quality;
    po.raw_h = o->raw_h;
    po.raw_w = o->raw_w;
    po.raw_c = o->raw_c;
    po.threads = o->threads;
    po.align = o->align;
    po.skip_bad = o->skip_bad;
    po.record_bytes = o->record_bytes;
    po.header_bytes = o->header_bytes;
    po.label_bytes = o->label_bytes;
    po.restart = o->restart;
    po.progress = on_progress;
    po.progress_user = &c;
    stk_pack_result r = {.struct_size = sizeof r};
    int rc = stk_pack(o->src, o->out, &po, &r, err, errlen);
    if (c.drawn)
        fprintf(stderr, "\n");
    if (rc)
        return 1;
    static const char *const kinds[] = {"encoded", "resized", "raw", "fields"};
    if (!o->quiet)
        printf("packed %" PRIu64 " samples (%" PRIu64 " skipped) into %" PRIu64 " shard(s), "
               "%.1f MiB, %s payloads, in %.2f s: %.0f samples/s, %.1f MiB/s -> %s\n",
               r.samples, r.skipped, r.shards, (double)r.bytes / 1048576.0,
               r.payload < 4 ? kinds[r.payload] : "unknown", r.seconds,
               r.seconds > 0 ? (double)r.samples / r.seconds : 0.0,
               r.seconds > 0 ? (double)r.bytes / 1048576.0 / r.seconds : 0.0, o->out);
    if (!o->quiet && o->restart)
        printf("restart-indexed %" PRIu64 " of %" PRIu64 " samples (the others are not "
               "8-bit Huffman JPEGs and are stored as they are)\n",
               r.restart_indexed, r.samples);
    return 0;
}

/* ---- Command line -------------------------------------------------------- */

static bool parse_shape(const char *s, unsigned *h, unsigned *w, unsigned *c)
{
    char *e;
    unsigned long v[3];
    for (int k = 0; k < 3; k++) {
        if (*s < '0' || *s > '9')
            return false;
        errno = 0;
        v[k] = strtoul(s, &e, 10);
        if (errno || v[k] == 0 || v[k] > 65535 || (k < 2 && *e != 'x') || (k == 2 && *e))
            return false;
        s = e + 1;
    }
    *h = (unsigned)v[0];
    *w = (unsigned)v[1];
    *c = (unsigned)v[2];
    return true;
}

int stoker_cmd_pack(int argc, char **argv)
{
    stoker_pack_opts o;
    memset(&o, 0, sizeof o);
    o.shard_size = 256ull << 20;
    o.quality = 90;
    o.progress = -1;
    const char *header_opt = NULL;
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t v = 0;
        if (!strcmp(k, "--shard-size")) {
            if (!stoker_parse_bytes(k, val, 1, UINT64_MAX, &v))
                return 2;
            o.shard_size = v;
            i++;
        } else if (!strcmp(k, "--max-side")) {
            if (!stoker_parse_opt(k, val, 1, 65535, &v))
                return 2;
            o.max_side = (unsigned)v;
            i++;
        } else if (!strcmp(k, "--restart")) {
            o.restart = 1;
        } else if (!strcmp(k, "--quality")) {
            if (!stoker_parse_opt(k, val, 1, 100, &v))
                return 2;
            o.quality = (unsigned)v;
            i++;
        } else if (!strcmp(k, "--threads")) {
            if (!stoker_parse_opt(k, val, 0, 256, &v))
                return 2;
            o.threads = (unsigned)v;
            i++;
        } else if (!strcmp(k, "--align")) {
            if (!stoker_parse_bytes(k, val, 0, 1u << 20, &v))
                return 2;
            if (v && (v < 512 || (v & (v - 1)))) {
                fprintf(stderr,
                        "stoker: --align takes 0 or a power of two in 512..1048576, "
                        "got %s\n",
                        val);
                return 2;
            }
            o.align = (unsigned)v;
            i++;
        } else if (!strcmp(k, "--record-size")) {
            if (val && !strcmp(val, "0")) {
                fprintf(stderr, "stoker: --record-size 0 is not a valid record size (a record "
                                "holds at least 1 byte)\n");
                return 2;
            }
            if (!stoker_parse_opt(k, val, 1, SIZE_MAX, &v))
                return 2;
            o.record_bytes = (size_t)v;
            i++;
        } else if (!strcmp(k, "--header-bytes") || !strcmp(k, "--label-bytes")) {
            if (!stoker_parse_opt(k, val, 0, k[2] == 'h' ? SIZE_MAX : 8, &v))
                return 2;
            if (k[2] == 'h')
                o.header_bytes = (size_t)v;
            else
                o.label_bytes = (unsigned)v;
            header_opt = k;
            i++;
        } else if (!strcmp(k, "--raw")) {
            if (!val || !parse_shape(val, &o.raw_h, &o.raw_w, &o.raw_c)) {
                fprintf(stderr, "stoker: --raw needs HxWxC, e.g. 32x32x3\n");
                return 2;
            }
            i++;
        } else if (!strcmp(k, "--skip-bad")) {
            o.skip_bad = 1;
        } else if (!strcmp(k, "--quiet")) {
            o.quiet = 1;
            o.progress = 0;
        } else if (!strcmp(k, "--progress")) {
            o.progress = 1;
        } else if (k[0] == '-' && k[1] == '-') {
            fprintf(stderr, "stoker: unknown or incomplete option '%s'\n", k);
            return 2;
        } else if (!o.src) {
            o.src = k;
        } else if (!o.out) {
            o.out = k;
        } else {
            fprintf(stderr, "stoker: unexpected argument '%s'\n", k);
            return 2;
        }
    }
    if (!o.src || !o.out) {
        fprintf(stderr, "stoker: pack needs SRC and OUT\n");
        return 2;
    }
    if (header_opt && !o.record_bytes) {
        fprintf(stderr, "stoker: %s applies to record files; give --record-size too\n", header_opt);
        return 2;
    }
    char err[1024];
    if (stoker_pack(&o, err, sizeof err)) {
        fprintf(stderr, "stoker: pack: %s\n", err);
        return 1;
    }
    return 0;
}
