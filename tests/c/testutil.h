/* testutil.h -- a tiny harness for stoker's C tests. Each test program runs
 * isolated, under an alarm() timeout, and ends by checking that nothing leaked:
 * library allocations, threads and file descriptors. */
#ifndef STK_TESTUTIL_H
#define STK_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stoker.h"

extern int tu_failures;
extern int tu_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        tu_checks++;                                                                               \
        if (!(cond)) {                                                                             \
            tu_failures++;                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long tu_a = (long long)(a), tu_b = (long long)(b);                                    \
        tu_checks++;                                                                               \
        if (tu_a != tu_b) {                                                                        \
            tu_failures++;                                                                         \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__,         \
                    __LINE__, #a, #b, tu_a, tu_b);                                                 \
        }                                                                                          \
    } while (0)

/* Aborts the test program at once (for failures that make going on pointless). */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond);             \
            tu_abort();                                                                            \
        }                                                                                          \
    } while (0)

/* Runs one named test function, printing its result line. */
#define RUN(fn) tu_run(#fn, fn)

/* Call first: records the leak baseline and arms a timeout (seconds). */
void tu_begin(const char *name, unsigned timeout_s);
void tu_run(const char *name, void (*fn)(void));
/* Call last: checks leaks, prints the summary, returns main's exit status. */
int tu_end(void);
void tu_abort(void) __attribute__((noreturn));

/* A fresh temporary directory (removed by tu_end). Returned string is static
 * storage owned by the harness. */
const char *tu_tmpdir(void);
/* Joins tu_tmpdir() and rel into a static rotating buffer. */
const char *tu_path(const char *rel);
void tu_mkdirs(const char *path);
/* The shared fixtures written by each format's own writer, FIXTURES/format
 * ($STOKER_FIXTURES, ../shared/fixtures, ../../shared/fixtures or
 * /work/shared/fixtures: the first holding format/plain.manifest.json), or
 * NULL when there are none. Static storage. */
const char *tu_fixtures(const char *format);
void tu_write_file(const char *path, const void *data, size_t n);
/* Reads a whole file into a malloc'd buffer (caller frees); NULL if missing. */
void *tu_read_file(const char *path, size_t *n);
int tu_count_fds(void);
int tu_count_threads(void);
long tu_peak_rss_bytes(void);
long tu_rss_bytes(void);
/* A loader's options in one struct, for tests that open many variants.
 * Zero fields take defaults: batch 4, 2 threads, depth 2, world 1; record 0
 * means the path is not a record file; max_sample 0 keeps the library's. */
typedef struct tu_cfg {
    const char *path;
    size_t record, header;
    unsigned label;
    size_t bs;
    unsigned threads, depth;
    uint64_t seed;
    int shuffle, drop_last;
    unsigned rank, world;
    int on_error;
    size_t max_sample;
    const char *transform;  /* NULL: the library's default */
    const char *options[8]; /* key, value pairs for stk_options_set; NULL ends */
} tu_cfg;

/* The options c names (every setter must accept its value); the caller
 * destroys them. */
stk_options *tu_cfg_options(const tu_cfg *c);
/* Opens *l from c (every setter must accept its value). Returns
 * stk_loader_open's code; *l must be closed either way. */
int tu_open_cfg(stk_loader **l, const tu_cfg *c);

/* 64-bit FNV-1a, for comparing batch contents cheaply. */
uint64_t tu_hash(uint64_t h, const void *p, size_t n);

/* Hash of the n files names[0..n) of dir (each name, then its bytes; a file
 * that cannot be read counts by its name), in name order: names (rows of
 * 256 bytes) are sorted in place. Compares a directory's outputs. */
uint64_t tu_hash_files(const char *dir, char (*names)[256], int n);

/* Encodes w x h RGB pixels as a baseline JPEG (libjpeg) of the given
 * quality. Returns a malloc'd buffer (caller frees), its size in *n. */
/* Appends a tar member (ustar header, data, zero padding to 512 bytes) to the
 * growing buffer *t of *tn bytes. */
void tu_tar_add(uint8_t **t, size_t *tn, const char *name, const void *data, size_t len);
/* Writes the ustar header of a member name of len bytes into h. */
void tu_tar_header(uint8_t h[512], const char *name, size_t len);

uint8_t *tu_jpeg(const uint8_t *rgb, uint32_t w, uint32_t h, int quality, size_t *n);
/* A JPEG's size from its header (libjpeg); 0x0 if it does not parse. */
void tu_jpeg_size(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h);

/* The SHA-256 of n bytes as 64 lowercase hex digits (the format readers'
 * tests compare image bytes with the fixtures' manifests by it). */
void tu_sha256_hex(const void *data, size_t n, char out[65]);

/* ---- The format readers' tests (test_mds, test_litdata, test_tfrecord,
 * test_parquet): fixtures with manifests, copies to break, sweeps. ------- */
struct json_t;

/* FIXTURES/format/variant (tu_fixtures; they must be there), in a rotating
 * static buffer (4 deep). */
const char *tu_fixture(const char *format, const char *variant);
/* FIXTURES/format/variant.manifest.json, parsed (REQUIREd; the caller
 * json_decref's it). */
struct json_t *tu_fixture_manifest(const char *format, const char *variant);
/* The manifest's sample i (its "index" checked). */
struct json_t *tu_manifest_sample(struct json_t *m, size_t i);
/* s[key], REQUIREd to be an integer / a string. */
int64_t tu_json_int(struct json_t *s, const char *key);
const char *tu_json_str(struct json_t *s, const char *key);
/* "dir/name" in a rotating static buffer (4 deep). */
char *tu_join(const char *dir, const char *name);
/* Copies the regular files of from (not its folders or dot files) into
 * to, made if missing. */
void tu_copy_files(const char *from, const char *to);
/* A copy of the files of from at tu_path(name), whose path it returns (a
 * rotating static buffer, 4 deep): a dataset for a test to break. */
const char *tu_copy_dir(const char *from, const char *name);
/* Overwrites n bytes of the file at off (REQUIREd inside the file). */
void tu_patch(const char *path, long off, const void *b, size_t n);
/* The little-endian u32 at off in the file. */
uint32_t tu_read_le32(const char *path, long off);
/* Entries of dir whose names start with prefix (0 without dir). */
int tu_count_prefixed(const char *dir, const char *prefix);
/* Points TMPDIR at dir (made) until tu_tmpdir_restore(the return). */
char *tu_tmpdir_use(const char *dir);
void tu_tmpdir_restore(char *old);

/* The batch's field name (REQUIREd). */
const stk_field *tu_field(const stk_batch *b, const char *name);
/* Whether variable field f's sample k is the text want. */
bool tu_text_is(const stk_field *f, size_t k, const char *want);

/* A loader without fields over fixture format/variant (its first image
 * through "imagenet-val", 3 threads, batches of 8) delivers every sample
 * once, in dense batches, with the manifest's labels. */
void tu_check_images_without_fields(const char *format, const char *variant);

/* stk_dataset_open(path) returns want and its message holds n1 and n2
 * (each may be NULL). */
void tu_expect_open(const char *path, int want, const char *n1, const char *n2);
/* Reads every sample of the dataset at path (which must open): the
 * failures, the first one's message in first (n bytes; may be NULL);
 * *count (may be NULL) the samples. */
int tu_read_all(const char *path, char *first, size_t n, uint64_t *count);

/* The fault sweeps over sessions of the dataset API: open dir (no options),
 * read samples 0, step, 2 step, ... below samples, close. */
typedef struct tu_sweep {
    const char *dir;
    uint64_t samples;                /* at most 64 */
    uint64_t step;                   /* 0: 1 */
    const char *tmp_prefix;          /* not NULL: TMPDIR is a fresh folder during the
                                        sweep, which holds no entry named so after any
                                        session (a reader's temporary area goes at close) */
    void (*before)(const char *dir); /* not NULL: called before each session */
} tu_sweep;
/* The n-th file call of a session fails, for every n, with each of EINTR,
 * short reads and EIO: the first two change nothing; EIO fails the open
 * with the OS reason, or fails only samples (each with a message), every
 * other sample equal to the fault-free one. */
void tu_sweep_io_faults(const tu_sweep *w);
/* The n-th allocation of a session fails, for every n until one passes:
 * the session fails with STK_ENOMEM or succeeds, and leaks nothing
 * (allocations, descriptors). */
void tu_sweep_oom(const tu_sweep *w);

/* What stk_dataset_verify reported through tu_on_problem (user = a
 * tu_problems, zeroed): n counts every problem, the first TU_PROBLEMS_MAX
 * are kept. */
#define TU_PROBLEMS_MAX 64
typedef struct tu_problems {
    int n, kinds[TU_PROBLEMS_MAX];
    uint64_t index[TU_PROBLEMS_MAX];
    char names[TU_PROBLEMS_MAX][512], reasons[TU_PROBLEMS_MAX][1024];
} tu_problems;
void tu_on_problem(const stk_verify_problem *p, void *user);

#endif
