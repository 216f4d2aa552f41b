/* test_mt_pack.c -- `stoker pack` is threaded: the same input packed with 1,
 * 2 and 6 worker threads gives byte-identical shards and manifest (runs
 * under ThreadSanitizer in the test command). The pack command comes from the
 * tool's code linked as build/MODE/libstoker_tools.a (tools/commands.h). */
#include "testutil.h"

#include "../../tools/commands.h"

#include <dirent.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

static void make_tree(const char *root)
{
    uint64_t x = 12345;
    for (int c = 0; c < 4; c++) {
        for (int k = 0; k < 25; k++) {
            char dir[600], p[700];
            snprintf(dir, sizeof dir, "%s/c%d", root, c);
            tu_mkdirs(dir);
            snprintf(p, sizeof p, "%s/f%03d.jpg", dir, k);
            /* A small real JPEG of varying size and content. */
            uint32_t w = 24 + (uint32_t)k, h = 16 + (uint32_t)c * 3;
            uint8_t *px = malloc((size_t)w * h * 3);
            REQUIRE(px);
            for (size_t j = 0; j < (size_t)w * h * 3; j++) {
                x = x * 6364136223846793005ULL + 1;
                px[j] = (uint8_t)(x >> 56);
            }
            size_t n;
            uint8_t *jpg = tu_jpeg(px, w, h, 80, &n);
            tu_write_file(p, jpg, n);
            free(jpg);
            free(px);
        }
    }
}

static void test_threads_give_same_bytes(void)
{
    char root[512];
    snprintf(root, sizeof root, "%s", tu_path("src"));
    make_tree(root);
    unsigned threads[3] = {1, 2, 6};
    char outs[3][512];
    for (int k = 0; k < 3; k++) {
        char rel[32], err[1024];
        snprintf(rel, sizeof rel, "out%u", threads[k]);
        snprintf(outs[k], sizeof outs[k], "%s", tu_path(rel));
        stoker_pack_opts o;
        memset(&o, 0, sizeof o);
        o.src = root;
        o.out = outs[k];
        o.shard_size = 3000;
        o.max_side = 20; /* resized: decode, resize and encode in the workers */
        o.quality = 85;
        o.threads = threads[k];
        o.quiet = 1;
        int rc = stoker_pack(&o, err, sizeof err);
        if (rc)
            fprintf(stderr, "%s\n", err);
        REQUIRE(rc == 0);
    }
    int shards = 0;
    for (int s = 0;; s++) {
        char name[32], a[600];
        snprintf(name, sizeof name, "part-%06d.stk", s);
        snprintf(a, sizeof a, "%s/%s", outs[0], name);
        size_t na;
        uint8_t *x = tu_read_file(a, &na);
        if (!x)
            break;
        shards++;
        for (int k = 1; k < 3; k++) {
            char b[600];
            size_t nb;
            snprintf(b, sizeof b, "%s/%s", outs[k], name);
            uint8_t *y = tu_read_file(b, &nb);
            CHECK(y && na == nb && !memcmp(x, y, na));
            free(y);
        }
        free(x);
    }
    CHECK(shards > 3);
}

/* A sample that fails stops the pack with its name, with every thread
 * joined, and takes back what it wrote: the shards, the marker, and OUT
 * itself when the pack created it (so running it again just works). */
static void test_failure_stops_cleanly(void)
{
    char root[512], out[512], err[1024];
    snprintf(root, sizeof root, "%s", tu_path("bad"));
    snprintf(out, sizeof out, "%s", tu_path("bad-out"));
    make_tree(root);
    char p[700];
    snprintf(p, sizeof p, "%s/c2/f007.jpg", root);
    tu_write_file(p, "\xff\xd8not a jpeg", 12);
    stoker_pack_opts o;
    memset(&o, 0, sizeof o);
    o.src = root;
    o.out = out;
    o.shard_size = 1u << 20;
    o.max_side = 16; /* forces a decode, which fails on the bad file */
    o.quality = 90;
    o.threads = 4;
    o.quiet = 1;
    CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
    if (!strstr(err, "c2/f"))
        fprintf(stderr, "err: %s\n", err);
    CHECK(strstr(err, "c2/f007.jpg") != NULL);
    CHECK(access(out, F_OK) != 0);
    /* An OUT that was there before stays, empty; shards written before the
     * failure (a small shard size makes several) are removed. */
    tu_mkdirs(out);
    o.shard_size = 1000;
    o.threads = 1;
    CHECK_EQ(stoker_pack(&o, err, sizeof err), 1);
    DIR *d = opendir(out);
    REQUIRE(d);
    int left = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            left++, fprintf(stderr, "left behind: %s\n", e->d_name);
    closedir(d);
    CHECK_EQ(left, 0);
}

static void *noop_thread(void *arg)
{
    return arg;
}

int main(void)
{
    /* ThreadSanitizer starts a background thread with the first thread a
     * program creates; start it before the harness takes its baseline. */
    pthread_t th;
    if (pthread_create(&th, NULL, noop_thread, NULL) == 0)
        pthread_join(th, NULL);
    tu_begin("test_mt_pack", 300);
    RUN(test_threads_give_same_bytes);
    RUN(test_failure_stops_cleanly);
    return tu_end();
}
