/* test_api.c -- the library-wide entry points: every return code of the
 * header has its name and text from the one list (STK_CODE_MAP), and a failed
 * sample reaches the caller as fields (stk_loader_last_error), on the host
 * path and through the device stage, beside the kept error list. */
#include "testutil.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The header this test was compiled with, found from this file's path (the
 * tests are built and run from the repository root). */
static char *read_header(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    REQUIRE(slash);
    snprintf(slash, sizeof path - (size_t)(slash - path), "/../../include/stoker.h");
    size_t n;
    char *text = tu_read_file(path, &n);
    if (!text)
        text = tu_read_file("include/stoker.h", &n);
    REQUIRE(text);
    char *t = realloc(text, n + 1);
    REQUIRE(t);
    t[n] = 0;
    return t;
}

/* Every "#define STK_NAME number" of the header's return-code section has
 * stk_errname(number) == "STK_NAME" and a real text; no other number has a
 * name. So a code added to the header without its line in STK_CODE_MAP (or
 * with another number) fails here. */
static void test_every_header_code_has_name_and_text(void)
{
    char *h = read_header();
    char *start = strstr(h, "---- Return codes");
    REQUIRE(start);
    char *end = strstr(start + 1, "/* ----");
    REQUIRE(end);
    *end = 0;
    int ncodes = 0, seen_neg = 0;
    for (char *p = start; (p = strstr(p, "#define STK_")) != NULL; p++) {
        char name[64];
        size_t k = 0;
        const char *q = p + strlen("#define ");
        while ((isupper((unsigned char)*q) || *q == '_') && k + 1 < sizeof name)
            name[k++] = *q++;
        name[k] = 0;
        if (!strcmp(name, "STK_CODE_MAP"))
            continue;
        while (*q == ' ')
            q++;
        int neg = 0;
        if (*q == '(') {
            q++;
            neg = *q == '-';
            q += neg;
        }
        REQUIRE(isdigit((unsigned char)*q));
        int num = atoi(q) * (neg ? -1 : 1);
        seen_neg += neg;
        const char *got = stk_errname(num);
        if (!got || strcmp(got, name))
            fprintf(stderr, "    %s (%d): stk_errname gives %s\n", name, num, got ? got : "NULL");
        CHECK(got && !strcmp(got, name));
        const char *text = stk_strerror(num);
        CHECK(text && text[0] && strcmp(text, "unknown error"));
        ncodes++;
    }
    CHECK(ncodes >= 16);
    CHECK(seen_neg >= 13);
    int named = 0;
    for (int c = -4096; c <= 4096; c++)
        named += stk_errname(c) != NULL;
    CHECK_EQ(named, ncodes);
    free(h);
}

/* The list's own entries, as a caller expands it: name, number, text. */
static void test_code_map_expands(void)
{
    int n = 0;
#define XX(name, num, text)                                                                        \
    CHECK_EQ(STK_##name, num);                                                                     \
    CHECK(!strcmp(stk_errname(num), "STK_" #name));                                                \
    CHECK(!strcmp(stk_strerror(num), text));                                                       \
    n++;
    STK_CODE_MAP(XX)
#undef XX
    CHECK_EQ(n, 16);
    CHECK(stk_errname(-14) == NULL && stk_errname(3) == NULL &&
          stk_errname(-2147483647 - 1) == NULL);
    CHECK(!strcmp(stk_strerror(-14), "unknown error"));
    CHECK(!strcmp(stk_errname(STK_EIO), "STK_EIO"));
    CHECK(!strcmp(stk_version(), STK_VERSION_STRING));
}

/* A folder of 8 small JPEGs in one class, sample 5 (c/img05.jpg) replaced
 * by bytes that are no image. */
static const char *corrupt_folder(void)
{
    static char root[600];
    snprintf(root, sizeof root, "%s", tu_path("corrupt"));
    char dir[700], file[800];
    snprintf(dir, sizeof dir, "%s/c", root);
    tu_mkdirs(dir);
    uint8_t rgb[16 * 16 * 3];
    for (size_t k = 0; k < sizeof rgb; k++)
        rgb[k] = (uint8_t)(k * 7);
    size_t n;
    uint8_t *jpg = tu_jpeg(rgb, 16, 16, 90, &n);
    REQUIRE(jpg);
    for (int i = 0; i < 8; i++) {
        snprintf(file, sizeof file, "%s/img%02d.jpg", dir, i);
        if (i == 5)
            tu_write_file(file, "this is not a jpeg", 18);
        else
            tu_write_file(file, jpg, n);
    }
    free(jpg);
    return root;
}

static void check_no_sample(stk_loader *l, int code)
{
    stk_error_info info = {.struct_size = sizeof info};
    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
    CHECK_EQ(info.struct_size, sizeof info);
    CHECK_EQ(info.code, code);
    CHECK_EQ(info.has_sample, 0);
    CHECK(!strcmp(info.path, "") && !strcmp(info.reason, "") && !strcmp(info.field, ""));
    CHECK(info.message == stk_loader_errmsg(l));
}

/* Under the raise policy the failed sample is described by fields: index,
 * epoch, its own code, path, reason; the next call delivers the batch
 * without it and clears the record. Host ring and device stage alike. */
static void run_raise(const char *device)
{
    const char *root = corrupt_folder();
    char want[900];
    snprintf(want, sizeof want, "%s/c/img05.jpg", root);
    tu_cfg c = {.path = root,
                .bs = 4,
                .threads = 2,
                .shuffle = 0,
                .transform = "Resize(8)|CenterCrop(8)",
                .on_error = STK_ON_ERROR_RAISE,
                .options = {"device", device, NULL}};
    stk_loader *l;
    int rc = tu_open_cfg(&l, &c);
    if (rc)
        fprintf(stderr, "    open: %s\n", stk_loader_errmsg(l));
    REQUIRE(rc == STK_OK);
    check_no_sample(l, STK_OK);
    stk_batch *b;
    REQUIRE(stk_loader_next(l, &b) == STK_OK); /* samples 0..3 */
    check_no_sample(l, STK_OK);
    stk_batch_release(b);
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        if (epoch == 1) {
            REQUIRE(stk_loader_next(l, &b) == STK_OK);
            stk_batch_release(b);
        }
        REQUIRE(stk_loader_next(l, &b) == STK_ESAMPLE); /* samples 4..7 */
        stk_error_info info = {.struct_size = sizeof info};
        REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
        CHECK_EQ(info.code, STK_ESAMPLE);
        CHECK_EQ(info.has_sample, 1);
        CHECK_EQ(info.sample, 5);
        CHECK_EQ(info.epoch, epoch);
        CHECK_EQ(info.nfailed, 1);
        CHECK_EQ(info.sample_code, STK_EFORMAT);
        if (strcmp(info.path, want))
            fprintf(stderr, "    path \"%s\", want \"%s\"\n", info.path, want);
        CHECK(!strcmp(info.path, want));
        CHECK(info.reason[0] != 0);
        CHECK(!strcmp(info.field, ""));
        CHECK(info.message == stk_loader_errmsg(l));
        /* The message is written from the same record. */
        char msg[1200];
        snprintf(msg, sizeof msg, "sample 5 (%s): %s", want, info.reason);
        CHECK(!strcmp(stk_loader_errmsg(l), msg));
        /* The kept list has it too, with the same fields. (With a device
         * the list follows the copy thread, which may have reached the next
         * epoch already.) */
        if (!strcmp(device, "cpu")) {
            REQUIRE(stk_loader_error_count(l) == 1);
            stk_sample_error se;
            REQUIRE(stk_loader_error_get(l, 0, &se) == STK_OK);
            CHECK(se.sample == 5 && se.code == STK_EFORMAT && !strcmp(se.path, want) &&
                  !strcmp(se.reason, info.reason));
        }
        REQUIRE(stk_loader_next(l, &b) == STK_OK);
        CHECK_EQ(b->size, 3);
        check_no_sample(l, STK_OK);
        stk_batch_release(b);
        CHECK_EQ(stk_loader_next(l, &b), STK_END);
        check_no_sample(l, STK_END);
    }
    stk_loader_close(l);
}

static void test_raise_host(void)
{
    run_raise("cpu");
}

static void test_raise_device(void)
{
    run_raise("fake");
}

/* Several failed batches, the device's copy thread reporting ahead of the
 * user: each STK_ESAMPLE's record names its own batch's sample, in order,
 * and a seek back reports the same samples again. */
static void run_raise_many(const char *device)
{
    const char *root = tu_path("many");
    char dir[700], file[800];
    snprintf(dir, sizeof dir, "%s/c", root);
    tu_mkdirs(dir);
    uint8_t rgb[16 * 16 * 3] = {0};
    size_t n;
    uint8_t *jpg = tu_jpeg(rgb, 16, 16, 90, &n);
    REQUIRE(jpg);
    for (int i = 0; i < 16; i++) {
        snprintf(file, sizeof file, "%s/img%02d.jpg", dir, i);
        if (i == 3 || i == 6 || i == 13)
            tu_write_file(file, "not a jpeg", 10);
        else
            tu_write_file(file, jpg, n);
    }
    free(jpg);
    tu_cfg c = {.path = root,
                .bs = 2,
                .threads = 2,
                .depth = 4,
                .shuffle = 0,
                .transform = "Resize(8)|CenterCrop(8)",
                .options = {"device", device, NULL}};
    stk_loader *l;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    for (int pass = 0; pass < 2; pass++) {
        uint64_t failed[3];
        int nf = 0, rc;
        stk_batch *b;
        for (;;) {
            /* Time for the workers and the copy thread to report ahead. */
            usleep(20000);
            if ((rc = stk_loader_next(l, &b)) == STK_END)
                break;
            if (rc == STK_ESAMPLE) {
                stk_error_info info = {.struct_size = sizeof info};
                REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
                CHECK_EQ(info.has_sample, 1);
                CHECK_EQ(info.epoch, (uint64_t)pass);
                REQUIRE(nf < 3);
                failed[nf++] = info.sample;
                snprintf(file, sizeof file, "img%02llu.jpg", (unsigned long long)info.sample);
                CHECK(strstr(info.path, file) != NULL);
                continue;
            }
            REQUIRE(rc == STK_OK);
            stk_batch_release(b);
        }
        REQUIRE(nf == 3);
        CHECK(failed[0] == 3 && failed[1] == 6 && failed[2] == 13);
        if (pass == 0) {
            /* Back to the middle of epoch 0, then on into epoch 1. */
            stk_state st = {.struct_size = sizeof st};
            REQUIRE(stk_loader_get_state(l, &st) == STK_OK);
            st.epoch = 0;
            st.batch = 2; /* batch 2: samples 4, 5 */
            REQUIRE(stk_loader_set_state(l, &st) == STK_OK);
            nf = 0;
            while ((rc = stk_loader_next(l, &b)) != STK_END) {
                if (rc == STK_ESAMPLE) {
                    stk_error_info info = {.struct_size = sizeof info};
                    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
                    REQUIRE(nf < 3);
                    failed[nf++] = info.sample;
                    continue;
                }
                REQUIRE(rc == STK_OK);
                stk_batch_release(b);
            }
            CHECK(nf == 2 && failed[0] == 6 && failed[1] == 13);
        }
    }
    stk_loader_close(l);
}

static void test_raise_many_host(void)
{
    run_raise_many("cpu");
}

static void test_raise_many_device(void)
{
    run_raise_many("fake");
}

/* Under skip nothing is raised; the kept list names the sample. */
static void test_skip_lists_it(void)
{
    const char *root = corrupt_folder();
    tu_cfg c = {.path = root,
                .bs = 4,
                .threads = 2,
                .transform = "Resize(8)|CenterCrop(8)",
                .on_error = STK_ON_ERROR_SKIP};
    stk_loader *l;
    REQUIRE(tu_open_cfg(&l, &c) == STK_OK);
    stk_batch *b;
    size_t got = 0;
    int rc;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        check_no_sample(l, STK_OK);
        got += b->size;
        stk_batch_release(b);
    }
    CHECK_EQ(rc, STK_END);
    CHECK_EQ(got, 7);
    REQUIRE(stk_loader_error_count(l) == 1);
    stk_sample_error se;
    REQUIRE(stk_loader_error_get(l, 0, &se) == STK_OK);
    CHECK(se.sample == 5 && se.code == STK_EFORMAT && strstr(se.path, "c/img05.jpg"));
    stk_loader_close(l);
}

/* Argument checks, and a failed handle answering with its open error. */
static void test_last_error_arguments(void)
{
    stk_error_info info = {.struct_size = sizeof info};
    CHECK_EQ(stk_loader_last_error(NULL, &info), STK_EMISUSE);
    tu_cfg c = {.path = tu_path("no-such-dir")};
    stk_loader *l = NULL;
    int rc = tu_open_cfg(&l, &c);
    REQUIRE(rc == STK_ENOENT && l);
    REQUIRE(stk_loader_last_error(l, &info) == STK_OK);
    CHECK_EQ(info.code, STK_ENOENT);
    CHECK_EQ(info.has_sample, 0);
    CHECK(!strcmp(info.message, stk_loader_errmsg(l)) && info.message[0]);
    CHECK_EQ(stk_loader_last_error(l, NULL), STK_EINVAL);
    info.struct_size = 8;
    CHECK_EQ(stk_loader_last_error(l, &info), STK_EINVAL);
    stk_loader_close(l);
    /* A caller with a larger struct gets the tail zeroed. */
    struct {
        stk_error_info info;
        uint64_t later;
    } big;
    memset(&big, 0xff, sizeof big);
    big.info.struct_size = sizeof big;
    const char *root = corrupt_folder();
    tu_cfg c2 = {.path = root, .bs = 4, .transform = "Resize(8)|CenterCrop(8)"};
    REQUIRE(tu_open_cfg(&l, &c2) == STK_OK);
    REQUIRE(stk_loader_last_error(l, &big.info) == STK_OK);
    CHECK_EQ(big.info.struct_size, sizeof(stk_error_info));
    CHECK_EQ(big.later, 0);
    stk_loader_close(l);
}

/* The typed setters refuse a value out of range with the setting, its range
 * and the value on the options object (front ends do not restate ranges). */
static void test_typed_setters_say_why(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_set_batch_size(o, STK_BATCH_SIZE_MAX + 1), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "batch_size takes 1..16777216") &&
          strstr(stk_options_errmsg(o), "got 16777217"));
    CHECK_EQ(stk_options_set_batch_size(o, STK_BATCH_SIZE_MAX), STK_OK);
    CHECK_EQ(stk_options_set_threads(o, STK_THREADS_MAX + 1), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "threads takes 0..256") != NULL);
    CHECK_EQ(stk_options_set_depth(o, 0), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "depth takes 1..63, got 0") != NULL);
    CHECK_EQ(stk_options_set_partition(o, 3, 2), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "rank takes 0..world_size-1 (1), got 3") != NULL);
    CHECK_EQ(stk_options_set_max_sample_bytes(o, 0), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "max_sample_bytes") != NULL);
    CHECK_EQ(stk_options_set_source(o, ""), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "source takes a path or URL") != NULL);
    stk_options_destroy(o);
}

int main(void)
{
    tu_begin("test_api", 60);
    RUN(test_every_header_code_has_name_and_text);
    RUN(test_code_map_expands);
    RUN(test_raise_host);
    RUN(test_raise_device);
    RUN(test_raise_many_host);
    RUN(test_raise_many_device);
    RUN(test_skip_lists_it);
    RUN(test_last_error_arguments);
    RUN(test_typed_setters_say_why);
    return tu_end();
}
