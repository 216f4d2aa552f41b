/* commands.h -- the `stoker` subcommands (one file each: bench.c, pack.c,
 * info.c, doctor.c, options.c) and what they share (cliutil.c); stoker.c
 * only dispatches to them. Everything here is built on include/stoker.h. */
#ifndef STOKER_TOOLS_COMMANDS_H
#define STOKER_TOOLS_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Parses a number or a byte size as stk_parse_size does ("16M", "16MiB",
 * "16MB", "1.5G"). False on anything else. */
bool stoker_parse_size(const char *s, uint64_t *out);
/* How a size is written, for messages. */
#define STOKER_SIZE_SYNTAX                                                                         \
    "e.g. 1048576, 64K, 16M or 16MiB, 1.5G, 500GiB; K/M/G/T and KiB..TiB are powers of 1024, "     \
    "KB/MB/GB/TB powers of 1000"
/* stoker_parse_opt for an option that takes bytes: the message on a value
 * that is not a size shows the syntax. */
bool stoker_parse_bytes(const char *opt, const char *val, uint64_t lo, uint64_t hi, uint64_t *out);
/* Parses val, the value of option opt, as stoker_parse_size does and checks
 * lo <= value <= hi. On failure prints the reason on stderr ("needs a
 * number", or "is out of range (lo..hi)", also for numbers too large for 64
 * bits and negative ones) and returns false. */
bool stoker_parse_opt(const char *opt, const char *val, uint64_t lo, uint64_t hi, uint64_t *out);
/* Formats a byte count as "12.3 MiB" into buf. Returns buf. */
const char *stoker_human_bytes(double v, char *buf, size_t n);
/* PATH for messages: a URL loses its user:password@ and query string (which
 * may carry credentials); anything else is returned as it is. */
const char *stoker_display_path(const char *path, char *buf, size_t n);
/* Writes s as a JSON string literal that is valid UTF-8 whatever s holds:
 * well-formed UTF-8 is copied, a byte that is not part of it becomes the
 * escape \udcXX (XX its value), as Python's surrogateescape decodes it, so
 * os.fsencode(json.loads(out)) gives the original bytes back (docs/cli.md). */
void stoker_json_str(FILE *f, const char *s);

/* What `stoker pack` does, parsed from its arguments (tests fill it directly). */
typedef struct stoker_pack_opts {
    const char *src, *out;
    uint64_t shard_size;               /* target payload bytes per shard (256 MiB) */
    unsigned max_side;                 /* > 0: re-encode images larger than this */
    unsigned quality;                  /* JPEG quality of re-encoded images (90) */
    int restart;                       /* 1: JPEGs rewritten restart-indexed (lossless) */
    unsigned raw_h, raw_w, raw_c;      /* raw tensors of this shape when raw_c > 0 */
    unsigned threads;                  /* 0 = online cores */
    unsigned align;                    /* page alignment of payloads, 0 = none */
    int skip_bad;                      /* 1: skip unreadable samples (listed), 0: fail */
    int progress;                      /* -1: on a terminal, 0: never, 1: always */
    int quiet;                         /* 1: no summary line */
    size_t record_bytes, header_bytes; /* read SRC as fixed-size records */
    unsigned label_bytes;
} stoker_pack_opts;

/* Packs opts->src into .stk shards in opts->out through stk_pack, drawing
 * the progress bar, listing skipped samples and printing the summary line
 * as `stoker pack` does. Returns 0, or 1 with a message in err. */
int stoker_pack(const stoker_pack_opts *opts, char *err, size_t errlen);

/* What `stoker bench` (and `stoker doctor`) parsed besides the loader options. */
typedef struct bench_args {
    const char *path;
    const char *transform;
    uint64_t epochs;
    bool json;
    bool progress; /* --progress / --no-progress given: forced; else on a terminal */
    bool progress_set;
    double seconds;            /* doctor: seconds per level (0 = default) */
    bool device;               /* --device other than cpu: batches are device memory */
    uint64_t max_sample_bytes; /* --max-sample-bytes (0: not given) */
    unsigned nmix;             /* --mix sources given (bench: a mixture) */
} bench_args;

typedef struct stk_options stk_options;
typedef struct stk_loader stk_loader;
/* Parses bench's arguments (argv[2..]) into o and a. Returns 0, or 2 for bad
 * usage with the message printed. doctor = 1 also takes --seconds. */
int stoker_parse_bench(int argc, char **argv, stk_options *o, bench_args *a);
/* The fetch stage's counters as report lines, or a JSON member
 * ",\"fetch\":{...}"; nothing for a local dataset. */
void stoker_print_fetch(stk_loader *l, bool json, double secs);
/* Rewrites the live progress line on stderr. */
void stoker_progress(stk_loader *l, double secs, uint64_t samples, uint64_t batches,
                     uint64_t total_batches);
/* Peak resident set of this process (VmHWM), in bytes. */
long stoker_peak_rss(void);
/* CLOCK_MONOTONIC in seconds. */
double stoker_now(void);
/* The tool's --help text. */
void stoker_usage(FILE *f);

int stoker_cmd_bench(int argc, char **argv);   /* stoker bench PATH [options] (bench.c) */
int stoker_cmd_pack(int argc, char **argv);    /* stoker pack ... */
int stoker_cmd_info(int argc, char **argv);    /* stoker info PATH */
int stoker_cmd_verify(int argc, char **argv);  /* stoker verify PATH */
int stoker_cmd_doctor(int argc, char **argv);  /* stoker doctor PATH [bench options] */
int stoker_cmd_options(int argc, char **argv); /* stoker options [--markdown] */
struct stk_option_info;
/* The library option a flag names ("--cache-limit": cache_limit), with its
 * key written into key[n]; NULL when flag names none. */
const struct stk_option_info *stoker_flag_option(const char *flag, char *key, size_t n);

#endif
