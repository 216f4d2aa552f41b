#include "testutil.h"

#include "io/file.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include <jpeglib.h>
#include <limits.h>
#include <setjmp.h>
#include <stdbool.h>

long stk__alloc_live(void);
void stk__alloc_fail_after(long n);
long stk__alloc_count(void);

int tu_failures;
int tu_checks;
static const char *g_name;
static long g_live0;
static int g_fds0, g_threads0;
static char g_tmp[256];
static int g_tests, g_tests_failed;

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "TIMEOUT: test exceeded its time limit\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(124);
}

static void *noop_thread(void *arg)
{
    return arg;
}

void tu_begin(const char *name, unsigned timeout_s)
{
    /* ThreadSanitizer starts a helper thread of its own when the first thread
     * is created; create one now so it exists before the baseline count. */
    int before = tu_count_threads();
    pthread_t t;
    if (pthread_create(&t, NULL, noop_thread, NULL) == 0)
        pthread_join(t, NULL);
        /* The joined thread stays counted until the kernel reaps it: wait for
         * that, so the baseline is the threads that really remain (this one, and
         * TSan's helper under TSan). */
#if defined(__SANITIZE_THREAD__)
    int expect = before + 1;
#else
    int expect = before;
#endif
    for (int i = 0; i < 100 && tu_count_threads() > expect; i++)
        usleep(10000);
    g_name = name;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, on_alarm);
    alarm(timeout_s);
    g_live0 = stk__alloc_live();
    g_fds0 = tu_count_fds();
    g_threads0 = tu_count_threads();
}

void tu_run(const char *name, void (*fn)(void))
{
    int before = tu_failures;
    long live = stk__alloc_live();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fn();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (stk__alloc_live() != live) {
        fprintf(stderr, "%s: leaked %ld library allocations\n", name, stk__alloc_live() - live);
        tu_failures++;
    }
    g_tests++;
    if (tu_failures != before)
        g_tests_failed++;
    printf("  %-44s %s (%.1f s)\n", name, tu_failures == before ? "ok" : "FAILED", secs);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    chmod(p, 0700);
    return remove(p);
}

const char *tu_tmpdir(void)
{
    if (!g_tmp[0]) {
        snprintf(g_tmp, sizeof g_tmp, "/tmp/stk-test-XXXXXX");
        if (!mkdtemp(g_tmp)) {
            perror("mkdtemp");
            tu_abort();
        }
    }
    return g_tmp;
}

const char *tu_path(const char *rel)
{
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, 1024, "%s/%s", tu_tmpdir(), rel);
    return b;
}

const char *tu_fixtures(const char *format)
{
    static char dir[4096];
    const char *env = getenv("STOKER_FIXTURES");
    const char *cands[] = {env, "../shared/fixtures", "../../shared/fixtures",
                           "/work/shared/fixtures"};
    for (size_t k = 0; k < sizeof cands / sizeof cands[0]; k++) {
        if (!cands[k])
            continue;
        snprintf(dir, sizeof dir, "%s/%s", cands[k], format);
        /* A folder of fixtures has their manifests (a format's own
         * variants: "plain", "snappy", ...). */
        DIR *d = opendir(dir);
        struct dirent *e;
        bool found = false;
        while (d && !found && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            found = n > 14 && !strcmp(e->d_name + n - 14, ".manifest.json");
        }
        if (d)
            closedir(d);
        if (found)
            return dir;
    }
    return NULL;
}

void tu_mkdirs(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    mkdir(buf, 0755);
}

void tu_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        tu_abort();
    }
    if (n && fwrite(data, 1, n, f) != n) {
        perror(path);
        tu_abort();
    }
    fclose(f);
}

void *tu_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

static int count_dir(const char *d)
{
    DIR *dir = opendir(d);
    if (!dir)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n - 1; /* the DIR's own fd when counting fds; harmless for tasks */
}

int tu_count_fds(void)
{
    return count_dir("/proc/self/fd");
}
int tu_count_threads(void)
{
    return count_dir("/proc/self/task") + 1;
}

static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl))
            v = strtol(line + kl, NULL, 10);
    fclose(f);
    return v * 1024;
}

long tu_peak_rss_bytes(void)
{
    return status_kb("VmHWM:");
}
long tu_rss_bytes(void)
{
    return status_kb("VmRSS:");
}

stk_options *tu_cfg_options(const tu_cfg *c)
{
    stk_options *o = NULL;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_source(o, c->path) == STK_OK);
    if (c->record)
        REQUIRE(stk_options_set_records(o, c->record, c->header, c->label) == STK_OK);
    REQUIRE(stk_options_set_batch_size(o, c->bs ? c->bs : 4) == STK_OK);
    REQUIRE(stk_options_set_threads(o, c->threads ? c->threads : 2) == STK_OK);
    REQUIRE(stk_options_set_depth(o, c->depth ? c->depth : 2) == STK_OK);
    REQUIRE(stk_options_set_seed(o, c->seed) == STK_OK);
    REQUIRE(stk_options_set_shuffle(o, c->shuffle) == STK_OK);
    REQUIRE(stk_options_set_drop_last(o, c->drop_last) == STK_OK);
    REQUIRE(stk_options_set_partition(o, c->rank, c->world ? c->world : 1) == STK_OK);
    REQUIRE(stk_options_set_on_error(o, c->on_error) == STK_OK);
    if (c->max_sample)
        REQUIRE(stk_options_set_max_sample_bytes(o, c->max_sample) == STK_OK);
    if (c->transform)
        REQUIRE(stk_options_set_transform(o, c->transform) == STK_OK);
    for (int k = 0; k + 1 < 8 && c->options[k]; k += 2)
        REQUIRE(stk_options_set(o, c->options[k], c->options[k + 1]) == STK_OK);
    return o;
}

int tu_open_cfg(stk_loader **l, const tu_cfg *c)
{
    stk_options *o = tu_cfg_options(c);
    int rc = stk_loader_open(l, o);
    stk_options_destroy(o);
    return rc;
}

uint64_t tu_hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    if (!h)
        h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

uint64_t tu_hash_files(const char *dir, char (*names)[256], int n)
{
    qsort(names, (size_t)n, sizeof names[0], cmp_name);
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < n; k++) {
        char p[16384 + 300];
        snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        size_t len;
        uint8_t *b = tu_read_file(p, &len);
        h = tu_hash(h, names[k], strlen(names[k]) + 1);
        if (b)
            h = tu_hash(h, b, len);
        free(b);
    }
    return h;
}

void tu_abort(void)
{
    if (g_tmp[0])
        nftw(g_tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    printf("%s: 0 passed, 1 failed (aborted)\n", g_name ? g_name : "test");
    exit(1);
}

int tu_end(void)
{
    if (g_tmp[0])
        nftw(g_tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    if (stk__alloc_live() != g_live0) {
        fprintf(stderr, "%s: %ld library allocations leaked\n", g_name,
                stk__alloc_live() - g_live0);
        tu_failures++;
    }
    /* Threads are joined by close; give the kernel a moment to reap tasks. */
    for (int i = 0; i < 100 && tu_count_threads() != g_threads0; i++)
        usleep(10000);
    if (tu_count_threads() != g_threads0) {
        fprintf(stderr, "%s: thread count %d, expected %d\n", g_name, tu_count_threads(),
                g_threads0);
        tu_failures++;
    }
    if (tu_count_fds() != g_fds0) {
        fprintf(stderr, "%s: fd count %d, expected %d\n", g_name, tu_count_fds(), g_fds0);
        tu_failures++;
    }
    printf("%s: %d tests, %d checks, %d failed checks\n", g_name, g_tests, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

typedef struct tu_jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
} tu_jerr;

static void tu_jerr_exit(j_common_ptr c)
{
    longjmp(((tu_jerr *)(void *)c->err)->jb, 1);
}

uint8_t *tu_jpeg(const uint8_t *rgb, uint32_t w, uint32_t h, int quality, size_t *n)
{
    struct jpeg_compress_struct ci;
    tu_jerr je;
    unsigned char *mem = NULL;
    unsigned long len = 0;
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = tu_jerr_exit;
    if (setjmp(je.jb)) {
        jpeg_destroy_compress(&ci);
        fprintf(stderr, "tu_jpeg: libjpeg failed\n");
        abort();
    }
    jpeg_create_compress(&ci);
    jpeg_mem_dest(&ci, &mem, &len);
    ci.image_width = w;
    ci.image_height = h;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < h) {
        JSAMPROW row = (JSAMPROW)(uintptr_t)(rgb + (size_t)ci.next_scanline * w * 3);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    uint8_t *out = malloc(len);
    if (!out)
        abort();
    memcpy(out, mem, len);
    free(mem);
    *n = len;
    return out;
}

void tu_jpeg_size(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h)
{
    struct jpeg_decompress_struct ci;
    tu_jerr je;
    *w = *h = 0;
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = tu_jerr_exit;
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        return;
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, b, (unsigned long)n);
    jpeg_read_header(&ci, TRUE);
    *w = ci.image_width;
    *h = ci.image_height;
    jpeg_destroy_decompress(&ci);
}

void tu_tar_header(uint8_t h[512], const char *name, size_t len)
{
    memset(h, 0, 512);
    snprintf((char *)h, 100, "%s", name);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    snprintf((char *)h + 124, 12, "%011o", (unsigned)len);
    snprintf((char *)h + 136, 12, "%011o", 0u);
    h[156] = '0';
    memcpy(h + 257,
           "ustar\0"
           "00",
           8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int k = 0; k < 512; k++)
        sum += h[k];
    snprintf((char *)h + 148, 8, "%06o", sum);
}

void tu_tar_add(uint8_t **t, size_t *tn, const char *name, const void *data, size_t len)
{
    size_t pad = (512 - len % 512) % 512;
    *t = realloc(*t, *tn + 512 + len + pad);
    uint8_t *h = *t + *tn;
    tu_tar_header(h, name, len);
    memcpy(h + 512, data, len);
    memset(h + 512 + len, 0, pad);
    *tn += 512 + len + pad;
}

/* ---- SHA-256 (FIPS 180-4): the fixtures' manifests hash the image bytes ---- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 =
            k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void tu_sha256_hex(const void *data, size_t n, char out[65])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const uint8_t *p = data;
    size_t k = 0;
    for (; k + 64 <= n; k += 64)
        sha_block(h, p + k);
    uint8_t tail[128] = {0};
    size_t r = n - k, tl = r < 56 ? 64 : 128;
    memcpy(tail, p + k, r);
    tail[r] = 0x80;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++)
        tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    sha_block(h, tail);
    if (tl == 128)
        sha_block(h, tail + 64);
    for (int i = 0; i < 8; i++)
        snprintf(out + 8 * i, 9, "%08x", h[i]);
}

/* ---- The format readers' tests ------------------------------------------------ */

const char *tu_fixture(const char *format, const char *variant)
{
    static char p[4][4200];
    static int rot;
    const char *dir = tu_fixtures(format);
    REQUIRE(dir);
    char *out = p[rot++ % 4];
    snprintf(out, sizeof p[0], "%s/%s", dir, variant);
    return out;
}

json_t *tu_fixture_manifest(const char *format, const char *variant)
{
    char p[4300];
    snprintf(p, sizeof p, "%s.manifest.json", tu_fixture(format, variant));
    json_error_t je;
    json_t *m = json_load_file(p, JSON_DECODE_ANY, &je);
    REQUIRE(m);
    return m;
}

json_t *tu_manifest_sample(json_t *m, size_t i)
{
    json_t *s = json_array_get(json_object_get(m, "samples"), i);
    REQUIRE(s);
    CHECK_EQ(json_integer_value(json_object_get(s, "index")), i);
    return s;
}

int64_t tu_json_int(json_t *s, const char *key)
{
    json_t *v = json_object_get(s, key);
    REQUIRE(json_is_integer(v));
    return json_integer_value(v);
}

const char *tu_json_str(json_t *s, const char *key)
{
    json_t *v = json_object_get(s, key);
    REQUIRE(json_is_string(v));
    return json_string_value(v);
}

char *tu_join(const char *dir, const char *name)
{
    static char p[4][8400];
    static int rot;
    char *out = p[rot++ % 4];
    snprintf(out, sizeof p[0], "%s/%s", dir, name);
    return out;
}

void tu_copy_files(const char *from, const char *to)
{
    tu_mkdirs(to);
    DIR *d = opendir(from);
    REQUIRE(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[8400];
        snprintf(p, sizeof p, "%s/%s", from, e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || stat(p, &st) || !S_ISREG(st.st_mode))
            continue;
        size_t n;
        void *b = tu_read_file(p, &n);
        REQUIRE(b);
        snprintf(p, sizeof p, "%s/%s", to, e->d_name);
        tu_write_file(p, b, n);
        free(b);
    }
    closedir(d);
}

const char *tu_copy_dir(const char *from, const char *name)
{
    static char dst[4][4200];
    static int rot;
    char *out = dst[rot++ % 4];
    snprintf(out, sizeof dst[0], "%s", tu_path(name));
    tu_copy_files(from, out);
    return out;
}

void tu_patch(const char *path, long off, const void *b, size_t n)
{
    size_t len;
    uint8_t *buf = tu_read_file(path, &len);
    REQUIRE(buf && off >= 0 && (size_t)off + n <= len);
    memcpy(buf + off, b, n);
    tu_write_file(path, buf, len);
    free(buf);
}

uint32_t tu_read_le32(const char *path, long off)
{
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    REQUIRE(b && off >= 0 && (size_t)off + 4 <= len);
    uint32_t v = (uint32_t)b[off] | (uint32_t)b[off + 1] << 8 | (uint32_t)b[off + 2] << 16 |
                 (uint32_t)b[off + 3] << 24;
    free(b);
    return v;
}

int tu_count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

char *tu_tmpdir_use(const char *dir)
{
    tu_mkdirs(dir);
    char *old = getenv("TMPDIR") ? strdup(getenv("TMPDIR")) : NULL;
    setenv("TMPDIR", dir, 1);
    return old;
}

void tu_tmpdir_restore(char *old)
{
    if (old)
        setenv("TMPDIR", old, 1);
    else
        unsetenv("TMPDIR");
    free(old);
}

const stk_field *tu_field(const stk_batch *b, const char *name)
{
    for (size_t k = 0; k < b->nfields; k++)
        if (!strcmp(b->fields[k].name, name))
            return &b->fields[k];
    REQUIRE(0);
    return NULL;
}

bool tu_text_is(const stk_field *f, size_t k, const char *want)
{
    return f->lengths[k] == strlen(want) &&
           !memcmp((const char *)f->data + f->offsets[k], want, strlen(want));
}

void tu_check_images_without_fields(const char *format, const char *variant)
{
    json_t *m = tu_fixture_manifest(format, variant);
    size_t n = json_array_size(json_object_get(m, "samples"));
    tu_cfg c = {
        .path = tu_fixture(format, variant), .bs = 8, .threads = 3, .transform = "imagenet-val"};
    stk_loader *l = NULL;
    int rc = tu_open_cfg(&l, &c);
    if (rc)
        fprintf(stderr, "open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    stk_batch *b;
    size_t got = 0;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        CHECK_EQ(b->kind, STK_BATCH_DENSE);
        for (size_t k = 0; k < b->size; k++)
            CHECK_EQ(b->labels[k], tu_json_int(tu_manifest_sample(m, b->indices[k]), "label"));
        got += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(got, n);
    stk_loader_close(l);
    json_decref(m);
}

void tu_expect_open(const char *path, int want, const char *n1, const char *n2)
{
    stk_dataset *d = NULL;
    char err[1024] = "";
    int rc = stk_dataset_open(&d, path, NULL, err, sizeof err);
    CHECK_EQ(rc, want);
    CHECK(!n1 || strstr(err, n1));
    CHECK(!n2 || strstr(err, n2));
    if (rc != want || (n1 && !strstr(err, n1)) || (n2 && !strstr(err, n2)))
        fprintf(stderr, "rc %d, message lacks '%s' or '%s': %s\n", rc, n1 ? n1 : "", n2 ? n2 : "",
                err);
    stk_dataset_close(d);
}

int tu_read_all(const char *path, char *first, size_t n, uint64_t *count)
{
    stk_dataset *d = NULL;
    char err[1024];
    int rc = stk_dataset_open(&d, path, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    REQUIRE(rc == STK_OK);
    stk_dataset_info di = {.struct_size = sizeof di};
    REQUIRE(stk_dataset_describe(d, &di) == STK_OK);
    if (count)
        *count = di.samples;
    int bad = 0;
    if (first)
        first[0] = '\0';
    for (uint64_t i = 0; i < di.samples; i++) {
        const void *p;
        size_t len;
        int64_t label;
        if (stk_dataset_read(d, i, &p, &len, &label, err, sizeof err) != STK_OK) {
            if (!bad && first)
                snprintf(first, n, "%s", err);
            bad++;
        }
    }
    stk_dataset_close(d);
    return bad;
}

/* One sweep session's outcome: the open's code and message, and each
 * sample read's (label and bytes) hash. */
typedef struct sweep_sess {
    int open_rc;
    char msg[1024];
    uint64_t hash[64];
    int ok[64];
} sweep_sess;

static uint64_t sweep_step(const tu_sweep *w)
{
    return w->step ? w->step : 1;
}

static void io_session(const tu_sweep *w, sweep_sess *r)
{
    memset(r, 0, sizeof *r);
    if (w->before)
        w->before(w->dir);
    stk_dataset *d = NULL;
    r->open_rc = stk_dataset_open(&d, w->dir, NULL, r->msg, sizeof r->msg);
    if (r->open_rc)
        return;
    for (uint64_t i = 0; i < w->samples; i += sweep_step(w)) {
        const void *p;
        size_t len;
        int64_t label;
        char err[1024];
        if (stk_dataset_read(d, i, &p, &len, &label, err, sizeof err) == STK_OK) {
            r->ok[i] = 1;
            r->hash[i] = tu_hash(tu_hash(0, p, len), &label, sizeof label);
        } else {
            CHECK(err[0] != '\0');
        }
    }
    stk_dataset_close(d);
}

void tu_sweep_io_faults(const tu_sweep *w)
{
    REQUIRE(w->samples <= 64);
    const char *tmp = tu_path("sweep-tmp");
    char *old = w->tmp_prefix ? tu_tmpdir_use(tmp) : NULL;
    static sweep_sess ref, r;
    io_session(w, &ref);
    REQUIRE(ref.open_rc == STK_OK);
    static const int kinds[] = {STK__IOF_EINTR, STK__IOF_SHORT, STK__IOF_EIO};
    for (size_t kk = 0; kk < 3; kk++) {
        int kind = kinds[kk], failed_open = 0, failed_samples = 0;
        stk__iofault_arm(kind, LONG_MAX, 0);
        io_session(w, &r);
        long calls = stk__iofault_calls();
        stk__iofault_arm(0, -1, 0);
        CHECK(calls > 8);
        for (long n = 0; n < calls + 2; n++) {
            stk__iofault_arm(kind, n, 0);
            io_session(w, &r);
            stk__iofault_arm(0, -1, 0);
            if (w->tmp_prefix)
                CHECK_EQ(tu_count_prefixed(tmp, w->tmp_prefix), 0);
            if (kind != STK__IOF_EIO) {
                CHECK_EQ(r.open_rc, STK_OK);
                CHECK(!memcmp(r.hash, ref.hash, sizeof r.hash));
                continue;
            }
            if (r.open_rc) {
                failed_open++;
                CHECK_EQ(r.open_rc, STK_EIO);
                CHECK(strstr(r.msg, "Input/output error") != NULL);
                if (!strstr(r.msg, "Input/output error"))
                    fprintf(stderr, "  %s: EIO at %ld: %s\n", w->dir, n, r.msg);
                continue;
            }
            for (uint64_t i = 0; i < w->samples; i++) {
                failed_samples += !r.ok[i] && i % sweep_step(w) == 0;
                CHECK(!r.ok[i] || r.hash[i] == ref.hash[i]);
            }
        }
        if (kind == STK__IOF_EIO)
            CHECK(failed_open > 0 && failed_samples > 0);
    }
    if (w->tmp_prefix)
        tu_tmpdir_restore(old);
}

static int oom_session(const tu_sweep *w)
{
    if (w->before)
        w->before(w->dir);
    stk_dataset *d = NULL;
    char err[1024];
    int rc = stk_dataset_open(&d, w->dir, NULL, err, sizeof err);
    for (uint64_t i = 0; rc == STK_OK && i < w->samples; i += sweep_step(w)) {
        const void *p;
        size_t len;
        int64_t label;
        rc = stk_dataset_read(d, i, &p, &len, &label, err, sizeof err);
    }
    stk_dataset_close(d);
    return rc;
}

void tu_sweep_oom(const tu_sweep *w)
{
    const char *tmp = tu_path("sweep-tmp");
    char *old = w->tmp_prefix ? tu_tmpdir_use(tmp) : NULL;
    long live0 = stk__alloc_live();
    int fds0 = tu_count_fds(), seen = 0;
    long n;
    for (n = 0; n < 5000; n++) {
        long c0 = stk__alloc_count();
        stk__alloc_fail_after(n);
        int rc = oom_session(w);
        stk__alloc_fail_after(-1);
        bool injected = stk__alloc_count() - c0 > n;
        CHECK(rc == STK_OK || rc == STK_ENOMEM);
        if (rc != STK_OK && rc != STK_ENOMEM)
            fprintf(stderr, "  %s: allocation %ld failed: rc %d\n", w->dir, n, rc);
        seen += rc == STK_ENOMEM;
        CHECK_EQ(stk__alloc_live(), live0);
        CHECK_EQ(tu_count_fds(), fds0);
        if (w->tmp_prefix)
            CHECK_EQ(tu_count_prefixed(tmp, w->tmp_prefix), 0);
        if (rc == STK_OK && !injected)
            break;
    }
    CHECK(n < 5000 && seen > 5);
    if (w->tmp_prefix)
        tu_tmpdir_restore(old);
}

void tu_on_problem(const stk_verify_problem *p, void *user)
{
    tu_problems *s = user;
    if (s->n < TU_PROBLEMS_MAX) {
        s->kinds[s->n] = p->kind;
        s->index[s->n] = p->index;
        snprintf(s->names[s->n], sizeof s->names[0], "%s", p->name);
        snprintf(s->reasons[s->n], sizeof s->reasons[0], "%s", p->reason);
    }
    s->n++;
}
