/* cliutil.c -- small helpers shared by the `stoker` subcommands. */
#include "commands.h"

#include "stoker.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

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

static bool parse_checked(const char *opt, const char *val, uint64_t lo, uint64_t hi, uint64_t *out,
                          bool bytes)
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

bool stoker_parse_bytes(const char *opt, const char *val, uint64_t lo, uint64_t hi, uint64_t *out)
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
    /* One rule for the library's messages and the tool's. No path: bench's
     * --mix sources. */
    if (!path) {
        snprintf(buf, n, "the --mix sources");
        return buf;
    }
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

void stoker_usage(FILE *f)
{
    fprintf(f, "usage: stoker bench PATH [options]\n"
               "       stoker bench --mix [WEIGHT:]PATH --mix [WEIGHT:]PATH ... [options]\n"
               "       stoker pack SRC OUT [--shard-size 256MiB] [--max-side N] [--quality Q]\n"
               "                   [--raw HxWxC] [--threads N] [--align BYTES] [--skip-bad]\n"
               "                   [--restart]\n"
               "                   [--quiet] [--progress]\n"
               "       stoker doctor PATH [bench options] [--seconds S]\n"
               "       stoker info PATH\n"
               "       stoker verify PATH [--max-input-bytes N]\n"
               "       stoker options [--markdown]\n"
               "       stoker version\n"
               "\n"
               "bench iterates the dataset at PATH and reports samples/s, peak RSS, the\n"
               "memory bound, per-stage times, consumer starvation and a checksum of\n"
               "every delivered batch (bytes and labels, in order).\n"
               "\n"
               "pack writes SRC as .stk shards and a manifest in OUT (docs/shards.md);\n"
               "doctor runs the pipeline level by level (storage, decode, batching, all)\n"
               "and says which stage bounds throughput and what to change (docs/diagnosis.md).\n"
               "\n"
               "info prints samples, classes, bytes, format and shards; verify reads\n"
               "every sample, lists each corrupt one and exits 1 if any.\n"
               "\n"
               "PATH is a directory in ImageFolder layout (ROOT/CLASS/IMAGE), a directory\n"
               "of .stk or .tar shards or CIFAR batches, one such file, a brace pattern\n"
               "such as train-{000000..000099}.tar, or, with --record-size, a file of\n"
               "fixed-size records.\n"
               "\n"
               "options:\n"
               "  --batch-size N      samples per batch (256)\n"
               "  --threads N         worker threads (0 = CPUs this process may use); auto or\n"
               "                      auto:N keeps the fewest working that feed the consumer\n"
               "  --depth N           batches prepared ahead, 1..63 (2); ring = depth + 1;\n"
               "                      auto: the deepest (up to 8) within --memory-budget\n"
               "  --memory-budget N   bytes for --depth auto (a quarter of available memory)\n"
               "  --epochs N          epochs to run (1)\n"
               "  --seed S            shuffle and augmentation seed (0)\n"
               "  --no-shuffle        natural order\n"
               "  --drop-last         drop each rank's final partial batch\n"
               "  --rank R --world-size W   this rank's share of each epoch\n"
               "  --transform T       none | imagenet-train | imagenet-val | cifar-train | SPEC\n"
               "  --size N            output size for the transform presets\n"
               "  --layout L          nchw | nhwc (nchw)\n"
               "  --dtype D           uint8 | float32 | float16 | bfloat16 (uint8)\n"
               "  --device D          cpu | cuda | cuda:N | fake: deliver batches to a GPU\n"
               "                      (copied from pinned memory, converted there; the\n"
               "                      checksum then covers labels only; docs/gpu.md)\n"
               "  --on-error P        raise | skip (raise)\n"
               "  --strict            check each image's whole compressed stream\n"
               "  --batch-memory N    most one variable-size batch's samples may take (512M)\n"
               "  --max-sample-bytes N  cap on one sample of variable-size batches (none)\n"
               "  --max-input-bytes N  largest encoded image a decode accepts (32M)\n"
               "  --record-size N     read PATH as records of N bytes\n"
               "  --header-bytes N    bytes to skip at the start of a record file (0)\n"
               "  --label-bytes N     leading label bytes of each record: 0,1,2,4,8 (0)\n"
               "  --mix [WEIGHT:]PATH a source of a mixture instead of PATH (repeat it);\n"
               "                      with --samples-per-epoch, --mix-batching (docs/mixing.md)\n"
               "  --json              print one JSON object instead of the report\n"
               "  --progress, --no-progress  live line on stderr (default: on a terminal)\n"
               "  --fields SPEC       samples with fields: NAME[?][=SOURCES][:KIND],... e.g.\n"
               "                      image=jpg;png,caption=txt,label=cls (docs/multimodal.md);\n"
               "                      bench adds a checksum per field\n"
               "  --trace FILE        write a Chrome trace-event JSON of the run (Perfetto)\n"
               "  --trace-events N    events the trace keeps, the latest (1M, 40 bytes each)\n"
               "\n"
               "Sizes in bytes take 1048576, 64K, 16M = 16MiB (binary), 16MB (decimal),\n"
               "1.5G, 500GiB.\n"
               "\n"
               "remote datasets (PATH an http://, https:// or s3:// URL; docs/remote.md):\n"
               "  --cache-dir DIR     disk cache of whole shards (shared by processes)\n"
               "  --cache-limit N     its size limit (default: 90%% of the free space)\n"
               "  --fetch-concurrency N  requests in flight (128)\n"
               "  --fetch-retries N   retries per request (6; 0 = none)\n"
               "  --fetch-timeout S   retry a request that stalls this long (30)\n"
               "  --fetch-buffer N    bytes buffered ahead of the workers (64M)\n"
               "  --endpoint URL      S3 endpoint (else AWS_ENDPOINT_URL)\n"
               "  --region R          S3 region (else AWS_REGION, profile, us-east-1)\n"
               "  --addressing A      path | virtual (path with a custom endpoint)\n"
               "  --order O           global | shards (shuffled shards, samples shuffled\n"
               "                      within windows of --shard-window K shards, default 8)\n"
               "every library option is also a flag (--max-dim 4096 sets max_dim); stoker\n"
               "options lists them all (docs/options.md).\n");
}

/* Peak resident set of this process image. VmHWM belongs to the address
 * space, so it starts afresh at exec; getrusage's ru_maxrss does not (Linux
 * carries the pre-exec peak over, so a stoker started from a large Python
 * process would report that process's size). */
long stoker_peak_rss(void)
{
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "VmHWM:", 6))
                kb = strtol(line + 6, NULL, 10);
        fclose(f);
    }
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = ru.ru_maxrss;
    }
    return kb * 1024L;
}

double stoker_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
