/* test_fields.c -- the checks and conversions of one field's bytes
 * (src/fields.c): UTF-8, JSON (RFC 8259), integers and floats, .npy headers
 * as NumPy writes them (bytes NumPy 1.24 wrote, embedded below, and more
 * arrays written by /usr/bin/python3 at test time when NumPy is there); and
 * the fields options (stk_options_add_field, stk_options_set_fields, the
 * "fields" option) with the kind rules. Loader behaviour is in
 * test_fields_loader.c. */
#include "fields.h"
#include "options.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int utf8(const char *s, size_t n)
{
    char err[256] = "";
    int rc = stk__utf8_check((const uint8_t *)s, n, err, sizeof err);
    if (rc)
        CHECK(strstr(err, "UTF-8") != NULL);
    return rc;
}
#define UTF8(lit) utf8(lit, sizeof(lit) - 1)

static void test_utf8(void)
{
    CHECK_EQ(UTF8(""), STK_OK);
    CHECK_EQ(UTF8("plain ascii\n\t"), STK_OK);
    CHECK_EQ(UTF8("a\0b"), STK_OK);                                 /* U+0000 is a scalar value */
    CHECK_EQ(UTF8("\xc3\xa9t\xc3\xa9"), STK_OK);                    /* été */
    CHECK_EQ(UTF8("\xe2\x82\xac"), STK_OK);                         /* U+20AC */
    CHECK_EQ(UTF8("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"), STK_OK); /* 日本語 */
    CHECK_EQ(UTF8("\xf0\x9f\x98\x80"), STK_OK);                     /* U+1F600 */
    CHECK_EQ(UTF8("\xf4\x8f\xbf\xbf"), STK_OK);                     /* U+10FFFF */
    CHECK_EQ(UTF8("\xed\x9f\xbf\xee\x80\x80"), STK_OK);             /* U+D7FF U+E000 */
    CHECK_EQ(UTF8("\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80"), STK_OK);
    /* overlong */
    CHECK_EQ(UTF8("\xc0\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xc1\xbf"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xe0\x80\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xe0\x9f\xbf"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf0\x80\x80\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf0\x8f\xbf\xbf"), STK_EFORMAT);
    /* surrogates */
    CHECK_EQ(UTF8("\xed\xa0\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xed\xbf\xbf"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xed\xa0\xbd\xed\xb8\x80"), STK_EFORMAT); /* CESU-8 pair */
    /* beyond U+10FFFF, and bytes that never start a sequence */
    CHECK_EQ(UTF8("\xf4\x90\x80\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf5\x80\x80\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf7\xbf\xbf\xbf"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf8\x88\x80\x80\x80"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xfe"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xff"), STK_EFORMAT);
    CHECK_EQ(UTF8("ok\x80"), STK_EFORMAT); /* a lone continuation byte */
    /* truncated, at the end and before other bytes */
    CHECK_EQ(UTF8("\xc3"), STK_EFORMAT);
    CHECK_EQ(UTF8("abc\xe2\x82"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf0\x9f\x98"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xe2\x41\xac"), STK_EFORMAT);
    CHECK_EQ(UTF8("\xf0\x9f\x98x"), STK_EFORMAT);
    /* The length given is the length checked: a valid prefix passes. */
    CHECK_EQ(utf8("\xc3\xa9\xff", 2), STK_OK);
    CHECK_EQ(utf8("\xc3\xa9\xff", 3), STK_EFORMAT);
    /* The message says where. */
    char err[256] = "";
    CHECK_EQ(stk__utf8_check((const uint8_t *)"abcd\xff", 5, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "byte 4") != NULL);
    /* A small err buffer is never overrun. */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    CHECK_EQ(stk__utf8_check((const uint8_t *)"\xff", 1, tiny, 4), STK_EFORMAT);
    CHECK(tiny[3] == '\0' && tiny[4] == 'x');
}

static int json_n(const char *s, size_t n)
{
    char err[256] = "";
    int rc = stk__json_check((const uint8_t *)s, n, err, sizeof err);
    if (rc && !err[0])
        CHECK(!"an invalid JSON text without a reason");
    return rc;
}
#define JSON(lit)     json_n(lit, sizeof(lit) - 1)
#define JSON_OK(lit)  CHECK_EQ(JSON(lit), STK_OK)
#define JSON_BAD(lit) CHECK_EQ(JSON(lit), STK_EFORMAT)

static void test_json_valid(void)
{
    JSON_OK("0");
    JSON_OK("-0");
    JSON_OK("1e5");
    JSON_OK("1E+5");
    JSON_OK("1e-5");
    JSON_OK("-1.5e-3");
    JSON_OK("0.25");
    JSON_OK("123456789012345678901234567890");
    JSON_OK("\"\"");
    JSON_OK("\"plain\"");
    JSON_OK("\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"");
    JSON_OK("\"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"");
    JSON_OK("true");
    JSON_OK("false");
    JSON_OK("null");
    JSON_OK("[]");
    JSON_OK("{}");
    JSON_OK("[ ]");
    JSON_OK("{ }");
    JSON_OK(" \t\r\n[1,2 , 3]\n");
    JSON_OK("{\"a\": [1, 2, {\"b\": null, \"c\": [true, false]}], \"d\": {\"e\": \"f\"}}");
    JSON_OK("{\"\":0}");
    JSON_OK("[[],[[]],{}]");
    JSON_OK("{\"a\":1,\"a\":2}"); /* duplicate keys: RFC 8259 allows them */
}

static void test_json_invalid(void)
{
    JSON_BAD("");
    JSON_BAD("   ");
    JSON_BAD("01");
    JSON_BAD("-01");
    JSON_BAD("00");
    JSON_BAD("[01]");
    JSON_BAD("-");
    JSON_BAD("1.");
    JSON_BAD(".5");
    JSON_BAD("+1");
    JSON_BAD("1e");
    JSON_BAD("1e+");
    JSON_BAD("1.e5");
    JSON_BAD("0x10");
    JSON_BAD("NaN");
    JSON_BAD("Infinity");
    JSON_BAD("-Infinity");
    JSON_BAD("tru");
    JSON_BAD("truex");
    JSON_BAD("nul");
    JSON_BAD("True");
    JSON_BAD("'a'");
    JSON_BAD("[1,]");
    JSON_BAD("[,1]");
    JSON_BAD("[1 2]");
    JSON_BAD("[");
    JSON_BAD("]");
    JSON_BAD("{\"a\":1,}");
    JSON_BAD("{a:1}");
    JSON_BAD("{\"a\" 1}");
    JSON_BAD("{\"a\":}");
    JSON_BAD("{1:2}");
    JSON_BAD("{\"a\":1}}");
    JSON_BAD("{\"a\":1} x");
    JSON_BAD("1 2");
    JSON_BAD("{} {}");
    JSON_BAD("\"abc");
    JSON_BAD("\"\\");
    JSON_BAD("\"\\x\"");
    JSON_BAD("\"\\'\"");
    JSON_BAD("\"\\u12\"");
    JSON_BAD("\"\\u12G4\"");
    JSON_BAD("\"\\U1234\"");
    JSON_BAD("\"a\tb\""); /* control characters must be escaped */
    JSON_BAD("\"a\nb\"");
    JSON_BAD("\"a\x1f"
             "b\"");
    JSON_BAD("\"\xff\"");         /* not UTF-8 */
    JSON_BAD("\"\xed\xa0\x80\""); /* a surrogate as UTF-8 */
    JSON_BAD("1\0");              /* a NUL after the value */
    JSON_BAD("\"a\0b\"");         /* a NUL inside a string is a control character */
    JSON_BAD("\xef\xbb\xbf{}");   /* a byte order mark */
    JSON_BAD("/* c */ 1");
    /* The message says where and why. */
    char err[256] = "";
    CHECK_EQ(stk__json_check((const uint8_t *)"[1,]", 4, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "invalid JSON at byte 3") != NULL);
    CHECK_EQ(stk__json_check((const uint8_t *)"{} x", 4, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "text after the value") != NULL);
}

/* 512 levels of nesting pass, 513 do not; very deep input fails without
 * exhausting the stack. */
static void test_json_depth(void)
{
    enum { BIG = 200000 };
    char *s = malloc(2 * BIG + 8);
    REQUIRE(s);
    for (int depth = 511; depth <= 513; depth++) {
        for (int k = 0; k < depth; k++)
            s[k] = '[', s[depth + k] = ']';
        CHECK_EQ(json_n(s, 2 * (size_t)depth), depth <= 512 ? STK_OK : STK_EFORMAT);
    }
    char err[256] = "";
    memset(s, '[', BIG);
    CHECK_EQ(stk__json_check((const uint8_t *)s, BIG, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "nesting") != NULL);
    /* Objects count too. */
    size_t n = 0;
    for (int k = 0; k < 600; k++)
        memcpy(s + n, "{\"a\":", 5), n += 5;
    s[n++] = '1';
    for (int k = 0; k < 600; k++)
        s[n++] = '}';
    CHECK_EQ(stk__json_check((const uint8_t *)s, n, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "nesting") != NULL);
    free(s);
}

static int f_int(const char *s, size_t n, int64_t *v)
{
    char err[256] = "";
    *v = 12345;
    int rc = stk__field_int((const uint8_t *)s, n, v, err, sizeof err);
    if (rc)
        CHECK(strstr(err, "is not an integer") != NULL);
    return rc;
}
#define INT_OK(lit, want)                                                                          \
    do {                                                                                           \
        int64_t v_;                                                                                \
        CHECK_EQ(f_int(lit, sizeof(lit) - 1, &v_), STK_OK);                                        \
        CHECK(v_ == (int64_t)(want));                                                              \
    } while (0)
#define INT_BAD(lit)                                                                               \
    do {                                                                                           \
        int64_t v_;                                                                                \
        CHECK_EQ(f_int(lit, sizeof(lit) - 1, &v_), STK_EFORMAT);                                   \
    } while (0)

static void test_field_int(void)
{
    INT_OK("0", 0);
    INT_OK("42", 42);
    INT_OK("-7", -7);
    INT_OK(" 3\n", 3);
    INT_OK("\t\r\n 19 \r\n", 19);
    INT_OK("007", 7);
    INT_OK("9223372036854775807", INT64_MAX);
    INT_OK("-9223372036854775808", INT64_MIN);
    INT_BAD("");
    INT_BAD("   \n");
    INT_BAD("-");
    INT_BAD("9223372036854775808");
    INT_BAD("-9223372036854775809");
    INT_BAD("99999999999999999999999");
    INT_BAD("12a");
    INT_BAD("1.5");
    INT_BAD("1e3");
    INT_BAD("0x10");
    INT_BAD("1 2");
    INT_BAD("4\0");
    INT_BAD("\xff");
    INT_BAD("cat");
    INT_BAD("\v5"); /* only space, tab, CR and LF are whitespace here */
    /* Longer than any integer's text: refused, not truncated. */
    INT_BAD("1000000000000000000000000000000000000000000000000000000000000");
    /* Only the n bytes given are read. */
    int64_t v;
    CHECK_EQ(f_int("123456", 3, &v), STK_OK);
    CHECK_EQ(v, 123);
}

static int f_float(const char *s, size_t n, float *v)
{
    char err[256] = "";
    *v = 12345.f;
    int rc = stk__field_float((const uint8_t *)s, n, v, err, sizeof err);
    if (rc)
        CHECK(strstr(err, "is not a number") != NULL || strstr(err, "range") != NULL);
    return rc;
}
#define FLT_OK(lit, want)                                                                          \
    do {                                                                                           \
        float v_;                                                                                  \
        CHECK_EQ(f_float(lit, sizeof(lit) - 1, &v_), STK_OK);                                      \
        CHECK(v_ == (float)(want));                                                                \
    } while (0)
#define FLT_BAD(lit)                                                                               \
    do {                                                                                           \
        float v_;                                                                                  \
        CHECK_EQ(f_float(lit, sizeof(lit) - 1, &v_), STK_EFORMAT);                                 \
    } while (0)

static void test_field_float(void)
{
    FLT_OK("1.5", 1.5);
    FLT_OK("-2e3", -2000);
    FLT_OK(" 0.25\n", 0.25);
    FLT_OK("3", 3);
    FLT_OK("-0", 0);
    FLT_OK("1e-50", 0); /* below float32's range: rounds to zero, as NumPy does */
    FLT_OK("3.4e38", 3.4e38);
    FLT_OK("0.1", 0.1); /* rounded once, from the double */
    FLT_BAD("");
    FLT_BAD(" ");
    FLT_BAD("abc");
    FLT_BAD("1.5x");
    FLT_BAD("1,5");
    FLT_BAD("1 5");
    FLT_BAD("2\0");
    /* Out of float32's range is no number of the field's type. */
    FLT_BAD("1e39");
    FLT_BAD("-1e39");
    FLT_BAD("1e400");
    FLT_BAD("-1e400");
    float v;
    CHECK_EQ(f_float("2.5e1", 3, &v), STK_OK);
    CHECK(v == 2.5f);
}

/* ---- .npy -------------------------------------------------------------------- */

typedef struct npy_case {
    const char *name;
    size_t len;
    const char *bytes;
    int dtype; /* -1: refused */
    unsigned ndim;
    int64_t shape[8];
} npy_case;

/* Written by NumPy 1.24.2 (numpy.lib.format.write_array; v2 and v3 with
 * version=(2, 0) / (3, 0)). The refused ones: big-endian multi-byte, Fortran
 * order in 2-D, complex, unicode, structured, datetime, 8 dims. */
static const npy_case k_npy[] = {
#include "test_fields_npy.inc"
};

static void test_npy_numpy_files(void)
{
    for (size_t k = 0; k < sizeof k_npy / sizeof k_npy[0]; k++) {
        const npy_case *t = &k_npy[k];
        stk__npy a;
        char err[256] = "";
        int rc = stk__npy_parse((const uint8_t *)t->bytes, t->len, &a, err, sizeof err);
        if ((rc == STK_OK) != (t->dtype >= 0))
            fprintf(stderr, "    %s: rc %d (%s)\n", t->name, rc, err);
        if (t->dtype < 0) {
            CHECK_EQ(rc, STK_EFORMAT);
            CHECK(strstr(err, ".npy") != NULL);
            continue;
        }
        CHECK_EQ(rc, STK_OK);
        CHECK_EQ(a.dtype, t->dtype);
        CHECK_EQ(a.ndim, t->ndim);
        uint64_t count = 1;
        for (unsigned d = 0; d < t->ndim; d++) {
            CHECK_EQ(a.shape[d], t->shape[d]);
            count *= (uint64_t)t->shape[d];
        }
        CHECK_EQ(a.data_off % 64, 0); /* NumPy aligns the data */
        CHECK_EQ(a.data_off + a.data_len, t->len);
        CHECK_EQ(a.data_len, count * stk_dtype_size(t->dtype));
    }
    /* The values are where the header says: arange(6, float32). */
    stk__npy a;
    char err[256];
    REQUIRE(stk__npy_parse((const uint8_t *)k_npy[0].bytes, k_npy[0].len, &a, err, sizeof err) ==
            STK_OK);
    for (int k = 0; k < 6; k++) {
        float f;
        memcpy(&f, k_npy[0].bytes + a.data_off + 4 * k, 4);
        CHECK(f == (float)k);
    }
}

/* Lengths that lie, and headers that are no .npy header. */
static void test_npy_lies(void)
{
    const npy_case *t = &k_npy[0]; /* float32 (2, 3), version 1 */
    uint8_t *b = malloc(t->len + 4096);
    REQUIRE(b);
    stk__npy a;
    char err[256];
    memcpy(b, t->bytes, t->len);
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_OK);
    /* the data one byte short, one byte long, cut in the header */
    CHECK_EQ(stk__npy_parse(b, t->len - 1, &a, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "needs 24 data bytes") != NULL);
    b[t->len] = 0;
    CHECK_EQ(stk__npy_parse(b, t->len + 1, &a, err, sizeof err), STK_EFORMAT);
    for (size_t n = 0; n < 128; n++)
        CHECK_EQ(stk__npy_parse(b, n, &a, err, sizeof err), STK_EFORMAT);
    /* the header's length past the end, or shorter than the dict */
    uint16_t hl = (uint16_t)(b[8] | b[9] << 8);
    b[8] = 0xff, b[9] = 0xff;
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    b[8] = 10, b[9] = 0;
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    b[8] = 0, b[9] = 0;
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    b[8] = (uint8_t)hl, b[9] = (uint8_t)(hl >> 8);
    /* a shape that claims more elements than there are bytes */
    char *sh = memmem(b, t->len, "(2, 3)", 6);
    REQUIRE(sh);
    memcpy(sh, "(2, 4)", 6);
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    memcpy(sh, "(3, 2)", 6);
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_OK);
    memcpy(sh, "(-1,2)", 6);
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    memcpy(sh, "(2, 3)", 6);
    /* sizes whose product overflows */
    {
        char hdr[256];
        int hn = snprintf(hdr, sizeof hdr,
                          "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, "
                          "4294967296, 4294967296), }");
        uint8_t big[300] = "\x93NUMPY\x01\x00";
        big[8] = (uint8_t)hn;
        memcpy(big + 10, hdr, (size_t)hn);
        CHECK_EQ(stk__npy_parse(big, 10 + (size_t)hn + 8, &a, err, sizeof err), STK_EFORMAT);
        hn = snprintf(hdr, sizeof hdr,
                      "{'descr': '<f8', 'fortran_order': False, 'shape': "
                      "(99999999999999999999999,), }");
        big[8] = (uint8_t)hn;
        memcpy(big + 10, hdr, (size_t)hn);
        CHECK_EQ(stk__npy_parse(big, 10 + (size_t)hn + 8, &a, err, sizeof err), STK_EFORMAT);
    }
    /* magic, version, a NUL in the header, keys missing */
    b[0] = 0x92;
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "magic") != NULL);
    b[0] = 0x93;
    b[6] = 4;
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    CHECK(strstr(err, "version 4") != NULL);
    b[6] = 1;
    b[20] = 0;
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    memcpy(b, t->bytes, t->len);
    char *key = memmem(b, t->len, "'shape'", 7);
    REQUIRE(key);
    memcpy(key, "'shap_'", 7);
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    memcpy(b, t->bytes, t->len);
    key = memmem(b, t->len, "'descr'", 7);
    memcpy(key, "'desc_'", 7);
    CHECK_EQ(stk__npy_parse(b, t->len, &a, err, sizeof err), STK_EFORMAT);
    /* version 2 with a 4-byte length cut off */
    memcpy(b, "\x93NUMPY\x02\x00\x10\x00", 10);
    CHECK_EQ(stk__npy_parse(b, 10, &a, err, sizeof err), STK_EFORMAT);
    CHECK_EQ(stk__npy_parse(b, 11, &a, err, sizeof err), STK_EFORMAT);
    /* a header longer than any simple dtype's: refused, not overrun */
    memset(b, ' ', 4096);
    memcpy(b, "\x93NUMPY\x02\x00", 8);
    b[8] = 0x00, b[9] = 0x0f, b[10] = 0, b[11] = 0; /* 3840 bytes */
    memcpy(b + 12, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 57);
    CHECK_EQ(stk__npy_parse(b, 12 + 3840 + 4, &a, err, sizeof err), STK_EFORMAT);
    free(b);
}

/* Arrays NumPy writes now, at test time (skipped without /usr/bin/python3 and
 * NumPy): random dtypes and shapes, versions 1 and 2, each parsed to the
 * dtype, shape and data NumPy reports in a side file. */
static void test_npy_numpy_now(void)
{
    const char *dir = tu_path("npy");
    tu_mkdirs(dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 - '%s' 2>/dev/null <<'EOF'\n"
             "import sys, numpy as np\n"
             "from numpy.lib import format as F\n"
             "d = sys.argv[1]; r = np.random.RandomState(7)\n"
             "dts = ['<f4','<f8','<f2','<i8','<i4','<i2','|i1','|u1','<u2','<u4','<u8','|b1']\n"
             "with open(d + '/list.txt', 'w') as m:\n"
             "  for k in range(40):\n"
             "    dt = dts[k %% len(dts)]; nd = int(r.randint(0, 5))\n"
             "    shape = tuple(int(s) for s in r.randint(0, 4, size=nd))\n"
             "    a = np.asarray(r.rand(*shape) * 100).astype(dt)\n"
             "    with open('%%s/a%%d.npy' %% (d, k), 'wb') as f:\n"
             "      F.write_array(f, a, version=(1, 0) if k %% 2 else (2, 0))\n"
             "    m.write('%%d %%s %%d %%s %%d\\n' %% (k, dt, a.ndim, ' '.join(map(str, "
             "a.shape + (0,) * (5 - a.ndim))), a.nbytes))\n"
             "EOF",
             dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "    (skipped: /usr/bin/python3 with NumPy is not there)\n");
        return;
    }
    static const char *names[] = {"<f4", "<f8", "<f2", "<i8", "<i4", "<i2",
                                  "|i1", "|u1", "<u2", "<u4", "<u8", "|b1"};
    static const int dts[] = {STK_DTYPE_FLOAT32, STK_DTYPE_FLOAT64, STK_DTYPE_FLOAT16,
                              STK_DTYPE_INT64,   STK_DTYPE_INT32,   STK_DTYPE_INT16,
                              STK_DTYPE_INT8,    STK_DTYPE_UINT8,   STK_DTYPE_UINT16,
                              STK_DTYPE_UINT32,  STK_DTYPE_UINT64,  STK_DTYPE_BOOL};
    char lp[1100];
    snprintf(lp, sizeof lp, "%s/list.txt", dir);
    FILE *m = fopen(lp, "r");
    REQUIRE(m);
    int seen = 0, k, ndim;
    char dt[8];
    long long s[5], nbytes;
    while (fscanf(m, "%d %7s %d %lld %lld %lld %lld %lld %lld", &k, dt, &ndim, &s[0], &s[1], &s[2],
                  &s[3], &s[4], &nbytes) == 9) {
        char fp[1100];
        snprintf(fp, sizeof fp, "%s/a%d.npy", dir, k);
        size_t n;
        uint8_t *b = tu_read_file(fp, &n);
        REQUIRE(b);
        stk__npy a;
        char err[256] = "";
        int rc = stk__npy_parse(b, n, &a, err, sizeof err);
        if (rc)
            fprintf(stderr, "    a%d.npy: %s\n", k, err);
        CHECK_EQ(rc, STK_OK);
        int want = -1;
        for (size_t j = 0; j < sizeof names / sizeof names[0]; j++)
            if (!strcmp(names[j], dt))
                want = dts[j];
        CHECK_EQ(a.dtype, want);
        CHECK_EQ(a.ndim, ndim);
        for (int d = 0; d < ndim; d++)
            CHECK_EQ(a.shape[d], s[d]);
        CHECK_EQ(a.data_len, nbytes);
        CHECK_EQ(a.data_off + a.data_len, n);
        free(b);
        seen++;
    }
    fclose(m);
    CHECK_EQ(seen, 40);
}

/* ---- options ------------------------------------------------------------------ */

static void check_spec(const stk_options *o, size_t k, const char *name, const char *sources,
                       int kind, unsigned flags)
{
    REQUIRE(k < o->nfields);
    const stk__fspec *f = &o->fields[k];
    if (strcmp(f->name, name) || strcmp(f->sources, sources))
        fprintf(stderr, "    field %zu: '%s' = '%s', want '%s' = '%s'\n", k, f->name, f->sources,
                name, sources);
    CHECK(!strcmp(f->name, name));
    CHECK(!strcmp(f->sources, sources));
    CHECK_EQ(f->kind, kind);
    CHECK_EQ(f->flags, flags);
}

static void test_set_fields_valid(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_fields(
                o, "image=jpg;png;webp,caption=txt,meta=json,label=cls:int,extra?=npy,tag?,"
                   "score:float,n?=cls2:int") == STK_OK);
    CHECK_EQ(o->nfields, 8);
    check_spec(o, 0, "image", "jpg;png;webp", STK_FIELD_AUTO, 0);
    check_spec(o, 1, "caption", "txt", STK_FIELD_AUTO, 0);
    check_spec(o, 2, "meta", "json", STK_FIELD_AUTO, 0);
    check_spec(o, 3, "label", "cls", STK_FIELD_INT, 0);
    check_spec(o, 4, "extra", "npy", STK_FIELD_AUTO, STK_FIELD_OPTIONAL);
    check_spec(o, 5, "tag", "tag", STK_FIELD_AUTO, STK_FIELD_OPTIONAL);
    check_spec(o, 6, "score", "score", STK_FIELD_FLOAT, 0);
    check_spec(o, 7, "n", "cls2", STK_FIELD_INT, STK_FIELD_OPTIONAL);
    for (size_t k = 0; k < o->nfields; k++)
        CHECK(o->fields[k].transform == NULL);
    /* A second call adds to the first. */
    REQUIRE(stk_options_set_fields(o, "seg=seg.png:image,raw:bytes,a:auto") == STK_OK);
    CHECK_EQ(o->nfields, 11);
    check_spec(o, 8, "seg", "seg.png", STK_FIELD_IMAGE, 0);
    check_spec(o, 9, "raw", "raw", STK_FIELD_BYTES, 0);
    check_spec(o, 10, "a", "a", STK_FIELD_AUTO, 0);
    /* Every kind's word. */
    stk_options_destroy(o);
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_fields(o, "a:image,b:text,c:json,d:bytes,e:int,f:float,g:npy") ==
            STK_OK);
    for (int k = 0; k < 7; k++)
        CHECK_EQ(o->fields[k].kind, STK_FIELD_IMAGE + k);
    stk_options_destroy(o);
}

/* Each bad spec fails with a reason, and adds nothing: fields already there
 * stay as they were. */
static void test_set_fields_invalid(void)
{
    static const struct {
        const char *spec, *why;
    } bad[] = {
        {"", "give NAME"},
        {"a,b,a", "'a' is named twice"},
        {"image,image=png", "named twice"},
        {"keep", "named twice"},
        {"a=b:bogus", "'bogus' is no kind"},
        {"a:Image", "no kind"},
        {"a:", "no kind"},
        {"a:imageimageimageimage", "no kind"},
        {"a=b;;c", "non-empty"},
        {"a=;b", "non-empty"},
        {"a=b;", "non-empty"},
        {"a=", "non-empty"},
        {"a?=", "non-empty"},
        {"a=;", "non-empty"},
        {"a=1;2;3;4;5;6;7;8;9", "non-empty"},
        {",a", "needs a name"},
        {"a,", "needs a name"},
        {"a,,b", "needs a name"},
        {"=jpg", "needs a name"},
        {"?", "needs a name"},
        {"?=jpg", "needs a name"},
        {":int", "needs a name"},
        {"x,y,z,a=b;;", "non-empty"},
    };
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    REQUIRE(stk_options_set_fields(o, "keep=jpg") == STK_OK);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = stk_options_set_fields(o, bad[k].spec);
        const char *msg = stk_options_errmsg(o);
        if (rc != STK_EINVAL || !strstr(msg, bad[k].why))
            fprintf(stderr, "    '%s': rc %d, \"%s\"\n", bad[k].spec, rc, msg);
        CHECK_EQ(rc, STK_EINVAL);
        CHECK(strstr(msg, bad[k].why) != NULL);
        CHECK_EQ(o->nfields, 1);
        check_spec(o, 0, "keep", "jpg", STK_FIELD_AUTO, 0);
    }
    CHECK_EQ(stk_options_set_fields(o, NULL), STK_EINVAL);
    CHECK_EQ(stk_options_set_fields(NULL, "a"), STK_EINVAL);
    /* 8 alternatives are allowed. */
    CHECK_EQ(stk_options_set_fields(o, "a=1;2;3;4;5;6;7;8"), STK_OK);
    CHECK_EQ(o->nfields, 2);
    stk_options_destroy(o);
}

static void test_fields_limit(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    char spec[33 * 8] = "";
    for (int k = 0; k < 33; k++)
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%sf%d", k ? "," : "", k);
    /* 33 in one text: refused whole. */
    CHECK_EQ(stk_options_set_fields(o, spec), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "at most 32") != NULL);
    CHECK_EQ(o->nfields, 0);
    /* 32 fit; the 33rd, however added, does not. */
    *strrchr(spec, ',') = '\0';
    CHECK_EQ(stk_options_set_fields(o, spec), STK_OK);
    CHECK_EQ(o->nfields, 32);
    CHECK_EQ(stk_options_add_field(o, "more", NULL, STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_set_fields(o, "more"), STK_EINVAL);
    CHECK_EQ(o->nfields, 32);
    stk_options_destroy(o);
}

static void test_add_field(void)
{
    stk_options *o;
    REQUIRE(stk_options_create(&o) == STK_OK);
    CHECK_EQ(stk_options_add_field(o, "image", "jpg;png", STK_FIELD_IMAGE, "Resize(8)", 0), STK_OK);
    CHECK(!strcmp(o->fields[0].transform, "Resize(8)"));
    CHECK_EQ(stk_options_add_field(o, "caption", NULL, STK_FIELD_AUTO, NULL, STK_FIELD_OPTIONAL),
             STK_OK);
    check_spec(o, 1, "caption", "caption", STK_FIELD_AUTO, STK_FIELD_OPTIONAL);
    /* An AUTO field may take a transform at this point: its kind is known
     * at open. Other kinds may not. */
    CHECK_EQ(stk_options_add_field(o, "img2", "png", STK_FIELD_AUTO, "Resize(8)", 0), STK_OK);
    CHECK_EQ(stk_options_add_field(o, "t", "txt", STK_FIELD_TEXT, "Resize(8)", 0), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "only image fields take a transform") != NULL);
    CHECK_EQ(stk_options_add_field(o, "x", NULL, 8, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(o, "x", NULL, -1, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(o, "x", NULL, STK_FIELD_AUTO, NULL, 2), STK_EINVAL);
    CHECK(strstr(stk_options_errmsg(o), "unknown flags") != NULL);
    CHECK_EQ(stk_options_add_field(o, NULL, "a", STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(o, "", "a", STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(o, "x", "", STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(o, "x", "a;", STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(o, "image", "webp", STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(stk_options_add_field(NULL, "x", NULL, STK_FIELD_AUTO, NULL, 0), STK_EINVAL);
    CHECK_EQ(o->nfields, 3);
    /* The "fields" option replaces what was added; "" clears; a bad value
     * keeps the old fields. */
    CHECK_EQ(stk_options_set(o, "fields", "a=jpg,b=txt"), STK_OK);
    CHECK_EQ(o->nfields, 2);
    check_spec(o, 0, "a", "jpg", STK_FIELD_AUTO, 0);
    CHECK_EQ(stk_options_set(o, "fields", "c,c"), STK_EINVAL);
    CHECK_EQ(o->nfields, 2);
    check_spec(o, 1, "b", "txt", STK_FIELD_AUTO, 0);
    CHECK_EQ(stk_options_set(o, "fields", ""), STK_OK);
    CHECK_EQ(o->nfields, 0);
    CHECK_EQ(stk_options_set(o, "field_memory", "1M"), STK_OK);
    CHECK_EQ(o->field_memory, 1u << 20);
    CHECK(stk_options_set(o, "field_memory", "100") != STK_OK);
    stk_options_destroy(o);
}

static void test_kinds(void)
{
    static const struct {
        const char *name;
        int kind;
    } rules[] = {
        {"jpg", STK_FIELD_IMAGE},      {"jpeg", STK_FIELD_IMAGE},    {"png", STK_FIELD_IMAGE},
        {"webp", STK_FIELD_IMAGE},     {"ppm", STK_FIELD_IMAGE},     {"image", STK_FIELD_IMAGE},
        {"JPG", STK_FIELD_IMAGE},      {"seg.png", STK_FIELD_IMAGE}, {"a.b.webp", STK_FIELD_IMAGE},
        {"txt", STK_FIELD_TEXT},       {"text", STK_FIELD_TEXT},     {"caption", STK_FIELD_TEXT},
        {"path", STK_FIELD_TEXT},      {"en.txt", STK_FIELD_TEXT},   {"json", STK_FIELD_JSON},
        {"meta.json", STK_FIELD_JSON}, {"cls", STK_FIELD_INT},       {"cls2", STK_FIELD_INT},
        {"index", STK_FIELD_INT},      {"label", STK_FIELD_INT},     {"npy", STK_FIELD_NPY},
        {"depth.npy", STK_FIELD_NPY},  {"bin", STK_FIELD_BYTES},     {"", STK_FIELD_BYTES},
        {"png.", STK_FIELD_BYTES},     {"txt.gz", STK_FIELD_BYTES},  {"jpgx", STK_FIELD_BYTES},
        {"mp4", STK_FIELD_BYTES},      {"pngs", STK_FIELD_BYTES},    {"xjson", STK_FIELD_BYTES},
    };
    for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
        int got = stk_field_kind_for_name(rules[k].name);
        if (got != rules[k].kind)
            fprintf(stderr, "    kind of '%s': %d, want %d\n", rules[k].name, got, rules[k].kind);
        CHECK_EQ(got, rules[k].kind);
    }
    CHECK_EQ(stk_field_kind_for_name(NULL), STK_FIELD_BYTES);
    static const char *const names[] = {"auto",  "image", "text",  "json",
                                        "bytes", "int",   "float", "npy"};
    for (int k = 0; k < 8; k++) {
        CHECK(!strcmp(stk_field_kind_name(k), names[k]));
        CHECK_EQ(stk_field_kind_parse(names[k]), k);
    }
    CHECK(stk_field_kind_name(8) == NULL && stk_field_kind_name(-1) == NULL);
    CHECK_EQ(stk_field_kind_parse("IMAGE"), -1);
    CHECK_EQ(stk_field_kind_parse(""), -1);
    CHECK_EQ(stk_field_kind_parse(NULL), -1);
    CHECK_EQ(stk_dtype_size(STK_DTYPE_INT64), 8);
    CHECK_EQ(stk_dtype_size(STK_DTYPE_BOOL), 1);
    CHECK_EQ(stk_dtype_size(STK_DTYPE_FLOAT16), 2);
    CHECK_EQ(stk_dtype_size(13), 0);
    CHECK(!strcmp(stk_dtype_name(STK_DTYPE_UINT32), "uint32"));
    CHECK(stk_dtype_name(-1) == NULL);
}

int main(void)
{
    tu_begin("test_fields", 120);
    RUN(test_utf8);
    RUN(test_json_valid);
    RUN(test_json_invalid);
    RUN(test_json_depth);
    RUN(test_field_int);
    RUN(test_field_float);
    RUN(test_npy_numpy_files);
    RUN(test_npy_lies);
    RUN(test_npy_numpy_now);
    RUN(test_set_fields_valid);
    RUN(test_set_fields_invalid);
    RUN(test_fields_limit);
    RUN(test_add_field);
    RUN(test_kinds);
    return tu_end();
}
