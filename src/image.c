/*
 * image.c -- the per-sample image pipeline: parse the transform spec once,
 * then for each sample sniff the bytes, read the header, draw the random
 * parameters, plan which source pixels the output needs, decode only those
 * (JPEG: crop-aware and DCT-scaled), resample, and write the result in the
 * requested dtype and layout straight into the sample's slot.
 *
 * Planning works on sizes alone. Each transform becomes concrete operations
 * (crop, pad, resize, flip) with its random parameters drawn in torchvision's
 * order. A leading run of crops and one resize folds into a single
 * "resample stage": a source box, the size it is resized to, and the window
 * of that result that is kept. Crop-then-resize (RandomResizedCrop) and
 * resize-then-crop (Resize + CenterCrop) are both exact in this form: the
 * kept window's outputs use the same weights as a full resize would, so only
 * the source pixels under them are decoded. What follows the stage (padding,
 * a second resize, ...) runs on buffers; flips are carried to the writer.
 *
 * All working memory of run() comes from the caller's scratch, sized once
 * per sample after planning.
 */
#include "image.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "codec/codec.h"
#include "ops/ops.h"

/* ---- Transforms ---------------------------------------------------------- */

enum tkind {
    T_RRC,
    T_RESIZE,
    T_CENTER,
    T_RCROP,
    T_PAD,
    T_HFLIP,
    T_VFLIP,
    T_NORMALIZE,
    T_TOTENSOR,
};

#define MAX_XFORMS 32
#define MAX_PARAMS 5
/* DCT scaling keeps at least this factor of the target resolution. With 1.0
 * (the bare minimum) a texture-heavy photo resized by ~4x came out at
 * 34 dB PSNR against torchvision, because the IDCT's reduction is sharper
 * than PIL's wide triangle filter; with 1.25 the worst of the test photos
 * is 43-45 dB (docs/images.md has the figures). */
#define DCT_MARGIN 1.25

/* Sizes above this are surely a typo; it also keeps every size product far
 * from overflowing. */
#define MAX_SIZE 65535u

typedef struct xform {
    int kind;
    uint32_t size[2]; /* h, w */
    int shorter;      /* Resize(int): size[0] is the shorter side */
    uint32_t max_size;
    double scale[2], ratio[2];
    uint32_t pad[4]; /* left, top, right, bottom */
    int has_pad;
    int pad_if_needed;
    uint8_t fill[3];
    double p;
    double mean[3], std[3];
} xform;

struct stk__imgpipe {
    xform x[MAX_XFORMS];
    unsigned nx;
    int decode_only;
    int dtype, nchw, exif;
    uint32_t max_dim;
    stk__codec_opts copts;
    int dense;
    uint32_t out_h, out_w;
    int normalize, totensor;
    float lut32[3 * 256];
    uint16_t lut16[3 * 256];
};

static const char SUPPORTED[] =
    "supported: RandomResizedCrop, Resize, CenterCrop, RandomCrop, Pad, "
    "RandomHorizontalFlip, RandomVerticalFlip, Normalize, ToTensor, joined with '|'; "
    "presets imagenet-train, imagenet-val, cifar-train; or decode";

/* ---- Spec parsing ---------------------------------------------------------- */

enum vkind { V_NUM, V_TUPLE, V_IDENT, V_NONE, V_BOOL };

#define MAX_TUPLE 8

typedef struct val {
    int kind;
    double v[MAX_TUPLE];
    unsigned n;
    char s[48];
} val;

typedef struct parser {
    const char *s;
    size_t i;
    char *err;
    size_t errlen;
} parser;

static void skip_ws(parser *ps)
{
    while (ps->s[ps->i] == ' ' || ps->s[ps->i] == '\t' || ps->s[ps->i] == '\n' ||
           ps->s[ps->i] == '\r')
        ps->i++;
}

static int is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Reads an identifier ([A-Za-z_][A-Za-z0-9_.-]*) into buf. 0 if none. */
static int read_ident(parser *ps, char *buf, size_t n)
{
    size_t k = 0;
    if (!is_alpha(ps->s[ps->i]))
        return 0;
    while (is_alpha(ps->s[ps->i]) || is_digit(ps->s[ps->i]) || ps->s[ps->i] == '.' ||
           ps->s[ps->i] == '-') {
        if (k + 1 < n)
            buf[k++] = ps->s[ps->i];
        ps->i++;
    }
    buf[k] = 0;
    return 1;
}

/* Decimal number, independent of the C locale (strtod would read "0,5" in
 * some locales). Values with at most 15 significant digits and a small
 * exponent are exact in one rounding (Clinger's fast path), which covers
 * every realistic parameter; others go through pow(). */
static int read_number(parser *ps, double *out)
{
    static const double p10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const char *s = ps->s + ps->i;
    size_t k = 0;
    int neg = 0, digits = 0, exp10 = 0;
    uint64_t mant = 0;
    if (s[k] == '+' || s[k] == '-')
        neg = s[k++] == '-';
    while (is_digit(s[k])) {
        if (mant < 100000000000000000ULL)
            mant = mant * 10 + (uint64_t)(s[k] - '0');
        else
            exp10++;
        digits++;
        k++;
    }
    if (s[k] == '.') {
        k++;
        while (is_digit(s[k])) {
            if (mant < 100000000000000000ULL) {
                mant = mant * 10 + (uint64_t)(s[k] - '0');
                exp10--;
            }
            digits++;
            k++;
        }
    }
    if (!digits)
        return 0;
    if (s[k] == 'e' || s[k] == 'E') {
        size_t j = k + 1;
        int eneg = 0, e = 0, ed = 0;
        if (s[j] == '+' || s[j] == '-')
            eneg = s[j++] == '-';
        while (is_digit(s[j])) {
            if (e < 10000)
                e = e * 10 + (s[j] - '0');
            ed++;
            j++;
        }
        if (ed) {
            exp10 += eneg ? -e : e;
            k = j;
        }
    }
    double v;
    if (mant == 0)
        v = 0.0;
    else if (mant < (1ULL << 53) && exp10 >= -22 && exp10 <= 22)
        v = exp10 < 0 ? (double)mant / p10[-exp10] : (double)mant * p10[exp10];
    else
        v = (double)mant * pow(10.0, exp10);
    *out = neg ? -v : v;
    ps->i += k;
    return 1;
}

/* A number, optionally divided by another ("3/4", as in ratio=(3/4, 4/3)). */
static int read_scalar(parser *ps, double *out)
{
    if (!read_number(ps, out))
        return 0;
    skip_ws(ps);
    if (ps->s[ps->i] == '/') {
        double d;
        ps->i++;
        skip_ws(ps);
        if (!read_number(ps, &d) || d == 0.0)
            return 0;
        *out /= d;
    }
    return 1;
}

static int perr(parser *ps, const char *what)
{
    stk__fmt(ps->err, ps->errlen, "transform spec: %s at offset %zu of \"%s\"", what, ps->i, ps->s);
    return STK_EINVAL;
}

static int read_value(parser *ps, val *v)
{
    char c;
    memset(v, 0, sizeof *v);
    skip_ws(ps);
    c = ps->s[ps->i];
    if (c == '(' || c == '[') {
        char close = c == '(' ? ')' : ']';
        ps->i++;
        v->kind = V_TUPLE;
        for (;;) {
            skip_ws(ps);
            if (ps->s[ps->i] == close) {
                ps->i++;
                break;
            }
            if (v->n == MAX_TUPLE)
                return perr(ps, "tuple too long");
            if (!read_scalar(ps, &v->v[v->n]))
                return perr(ps, "expected a number in the tuple");
            v->n++;
            skip_ws(ps);
            if (ps->s[ps->i] == ',')
                ps->i++;
            else if (ps->s[ps->i] != close)
                return perr(ps, "expected ',' or the end of the tuple");
        }
        return STK_OK;
    }
    if (c == '\'' || c == '"') {
        size_t k = 0;
        ps->i++;
        v->kind = V_IDENT;
        while (ps->s[ps->i] && ps->s[ps->i] != c) {
            if (k + 1 < sizeof v->s)
                v->s[k++] = ps->s[ps->i];
            ps->i++;
        }
        if (!ps->s[ps->i])
            return perr(ps, "unterminated string");
        ps->i++;
        v->s[k] = 0;
        return STK_OK;
    }
    if (is_alpha(c)) {
        read_ident(ps, v->s, sizeof v->s);
        if (!strcmp(v->s, "None"))
            v->kind = V_NONE;
        else if (!strcmp(v->s, "True") || !strcmp(v->s, "true"))
            v->kind = V_BOOL, v->v[0] = 1;
        else if (!strcmp(v->s, "False") || !strcmp(v->s, "false"))
            v->kind = V_BOOL, v->v[0] = 0;
        else
            v->kind = V_IDENT;
        return STK_OK;
    }
    v->kind = V_NUM;
    v->n = 1;
    if (!read_scalar(ps, &v->v[0]))
        return perr(ps, "expected a value (number, tuple, name)");
    return STK_OK;
}

typedef struct tdef {
    const char *name;
    int kind;
    const char *params[MAX_PARAMS];
    unsigned required; /* leading params that must be given */
} tdef;

static const tdef TDEFS[] = {
    {"RandomResizedCrop", T_RRC, {"size", "scale", "ratio", "interpolation", "antialias"}, 1},
    {"Resize", T_RESIZE, {"size", "interpolation", "max_size", "antialias", NULL}, 1},
    {"CenterCrop", T_CENTER, {"size", NULL, NULL, NULL, NULL}, 1},
    {"RandomCrop", T_RCROP, {"size", "padding", "pad_if_needed", "fill", "padding_mode"}, 1},
    {"Pad", T_PAD, {"padding", "fill", "padding_mode", NULL, NULL}, 1},
    {"RandomHorizontalFlip", T_HFLIP, {"p", NULL, NULL, NULL, NULL}, 0},
    {"RandomVerticalFlip", T_VFLIP, {"p", NULL, NULL, NULL, NULL}, 0},
    {"Normalize", T_NORMALIZE, {"mean", "std", "inplace", NULL, NULL}, 2},
    {"ToTensor", T_TOTENSOR, {NULL, NULL, NULL, NULL, NULL}, 0},
};

typedef struct argctx {
    parser *ps;
    const tdef *def;
} argctx;

static int aerr(const argctx *a, const char *param, const char *why)
{
    stk__fmt(a->ps->err, a->ps->errlen, "transform spec: %s: argument '%s' %s", a->def->name, param,
             why);
    return STK_EINVAL;
}

static int is_int(double v)
{
    return v == floor(v) && fabs(v) <= 4294967295.0;
}

/* size: int or (h, w) or (s,). shorter: set when an int (or 1-tuple) gives
 * the shorter side (Resize); crops treat it as a square. */
static int get_size(const argctx *a, const val *v, uint32_t size[2], int *shorter)
{
    double h, w;
    int one = 0;
    if (v->kind == V_NUM || (v->kind == V_TUPLE && v->n == 1)) {
        h = w = v->v[0];
        one = 1;
    } else if (v->kind == V_TUPLE && v->n == 2) {
        h = v->v[0];
        w = v->v[1];
    } else {
        return aerr(a, "size", "must be an int or a (height, width) tuple");
    }
    if (!is_int(h) || !is_int(w) || h < 1 || w < 1 || h > MAX_SIZE || w > MAX_SIZE)
        return aerr(a, "size", "must hold integers in 1..65535");
    size[0] = (uint32_t)h;
    size[1] = (uint32_t)w;
    if (shorter)
        *shorter = one;
    return STK_OK;
}

static int get_pair(const argctx *a, const char *name, const val *v, double out[2])
{
    if (v->kind != V_TUPLE || v->n != 2 || !(v->v[0] > 0) || !(v->v[1] > 0) || !isfinite(v->v[0]) ||
        !isfinite(v->v[1]))
        return aerr(a, name, "must be a tuple of two positive numbers");
    if (v->v[0] > v->v[1])
        return aerr(a, name, "must be (min, max) with min <= max");
    out[0] = v->v[0];
    out[1] = v->v[1];
    return STK_OK;
}

static int get_bool(const argctx *a, const char *name, const val *v, int *out)
{
    if (v->kind == V_BOOL || (v->kind == V_NUM && (v->v[0] == 0 || v->v[0] == 1))) {
        *out = v->v[0] != 0;
        return STK_OK;
    }
    return aerr(a, name, "must be True or False");
}

static int get_padding(const argctx *a, const val *v, uint32_t pad[4])
{
    double p[4];
    if (v->kind == V_NUM || (v->kind == V_TUPLE && v->n == 1)) {
        p[0] = p[1] = p[2] = p[3] = v->v[0];
    } else if (v->kind == V_TUPLE && v->n == 2) {
        p[0] = p[2] = v->v[0];
        p[1] = p[3] = v->v[1];
    } else if (v->kind == V_TUPLE && v->n == 4) {
        memcpy(p, v->v, sizeof p);
    } else {
        return aerr(a, "padding", "must be an int or a tuple of 2 or 4 ints");
    }
    for (int k = 0; k < 4; k++) {
        if (!is_int(p[k]) || p[k] < 0 || p[k] > MAX_SIZE)
            return aerr(a, "padding", "must hold integers in 0..65535");
        pad[k] = (uint32_t)p[k];
    }
    return STK_OK;
}

static int get_fill(const argctx *a, const val *v, uint8_t fill[3])
{
    double f[3];
    if (v->kind == V_NUM || (v->kind == V_TUPLE && v->n == 1))
        f[0] = f[1] = f[2] = v->v[0];
    else if (v->kind == V_TUPLE && v->n == 3)
        memcpy(f, v->v, sizeof f);
    else
        return aerr(a, "fill", "must be an int or an (r, g, b) tuple");
    for (int k = 0; k < 3; k++) {
        if (!is_int(f[k]) || f[k] < 0 || f[k] > 255)
            return aerr(a, "fill", "must hold integers in 0..255");
        fill[k] = (uint8_t)f[k];
    }
    return STK_OK;
}

static int get_triple(const argctx *a, const char *name, const val *v, double out[3])
{
    if (v->kind == V_NUM || (v->kind == V_TUPLE && v->n == 1)) {
        out[0] = out[1] = out[2] = v->v[0];
    } else if (v->kind == V_TUPLE && v->n == 3) {
        memcpy(out, v->v, 3 * sizeof(double));
    } else {
        return aerr(a, name, "must be a number or a tuple of 3 numbers (one per channel)");
    }
    for (int k = 0; k < 3; k++)
        if (!isfinite(out[k]))
            return aerr(a, name, "must be finite");
    return STK_OK;
}

static int check_interp(const argctx *a, const val *v)
{
    const char *s = v->s, *dot = strrchr(s, '.');
    if (v->kind == V_IDENT) {
        if (dot)
            s = dot + 1;
        if (!strcasecmp(s, "bilinear"))
            return STK_OK;
    }
    return aerr(a, "interpolation", "is not supported: only bilinear (antialiased, as PIL)");
}

static int check_mode(const argctx *a, const val *v)
{
    if (v->kind == V_IDENT && !strcmp(v->s, "constant"))
        return STK_OK;
    return aerr(a, "padding_mode", "is not supported: only 'constant'");
}

/* Applies the collected arguments of one transform to x. */
static int build_xform(const argctx *a, const val *args, const int *set, xform *x)
{
    int rc = STK_OK;
    memset(x, 0, sizeof *x);
    x->kind = a->def->kind;
    switch (x->kind) {
    case T_RRC:
        x->scale[0] = 0.08, x->scale[1] = 1.0;
        x->ratio[0] = 3.0 / 4.0, x->ratio[1] = 4.0 / 3.0;
        if ((rc = get_size(a, &args[0], x->size, NULL)))
            break;
        if (set[1] && (rc = get_pair(a, "scale", &args[1], x->scale)))
            break;
        if (set[1] && x->scale[1] > 1.0) {
            rc = aerr(a, "scale", "must lie within (0, 1]");
            break;
        }
        if (set[2] && (rc = get_pair(a, "ratio", &args[2], x->ratio)))
            break;
        if (set[3] && (rc = check_interp(a, &args[3])))
            break;
        /* antialias: PIL always antialiases, torchvision ignores it too. */
        break;
    case T_RESIZE:
        if ((rc = get_size(a, &args[0], x->size, &x->shorter)))
            break;
        if (set[1] && (rc = check_interp(a, &args[1])))
            break;
        if (set[2] && args[2].kind != V_NONE) {
            if (args[2].kind != V_NUM || !is_int(args[2].v[0]) || args[2].v[0] > MAX_SIZE) {
                rc = aerr(a, "max_size", "must be an integer");
                break;
            }
            if (!x->shorter) {
                rc = aerr(a, "max_size", "is only allowed when size is an int");
                break;
            }
            if (args[2].v[0] <= x->size[0]) {
                rc = aerr(a, "max_size", "must be greater than size");
                break;
            }
            x->max_size = (uint32_t)args[2].v[0];
        }
        break;
    case T_CENTER: rc = get_size(a, &args[0], x->size, NULL); break;
    case T_RCROP:
        if ((rc = get_size(a, &args[0], x->size, NULL)))
            break;
        if (set[1] && args[1].kind != V_NONE) {
            if ((rc = get_padding(a, &args[1], x->pad)))
                break;
            x->has_pad = 1;
        }
        if (set[2] && (rc = get_bool(a, "pad_if_needed", &args[2], &x->pad_if_needed)))
            break;
        if (set[3] && (rc = get_fill(a, &args[3], x->fill)))
            break;
        if (set[4] && (rc = check_mode(a, &args[4])))
            break;
        break;
    case T_PAD:
        if ((rc = get_padding(a, &args[0], x->pad)))
            break;
        x->has_pad = 1;
        if (set[1] && (rc = get_fill(a, &args[1], x->fill)))
            break;
        if (set[2] && (rc = check_mode(a, &args[2])))
            break;
        break;
    case T_HFLIP:
    case T_VFLIP:
        x->p = 0.5;
        if (set[0]) {
            if (args[0].kind != V_NUM || !(args[0].v[0] >= 0.0 && args[0].v[0] <= 1.0)) {
                rc = aerr(a, "p", "must be a number in [0, 1]");
                break;
            }
            x->p = args[0].v[0];
        }
        break;
    case T_NORMALIZE:
        if ((rc = get_triple(a, "mean", &args[0], x->mean)))
            break;
        if ((rc = get_triple(a, "std", &args[1], x->std)))
            break;
        for (int k = 0; k < 3; k++) {
            if (x->std[k] == 0.0) {
                rc = aerr(a, "std", "must not contain 0");
                break;
            }
        }
        break;
    default: break;
    }
    return rc;
}

/* Parses "(args)" after a transform name. */
static int parse_args(parser *ps, const tdef *def, xform *x)
{
    val args[MAX_PARAMS];
    int set[MAX_PARAMS] = {0};
    unsigned npos = 0, nparams = 0;
    int seen_kw = 0;
    argctx a = {ps, def};
    while (nparams < MAX_PARAMS && def->params[nparams])
        nparams++;
    skip_ws(ps);
    if (ps->s[ps->i] == '(') {
        ps->i++;
        for (;;) {
            char name[48];
            int idx = -1, rc;
            val v;
            skip_ws(ps);
            if (ps->s[ps->i] == ')') {
                ps->i++;
                break;
            }
            size_t save = ps->i;
            if (read_ident(ps, name, sizeof name)) {
                skip_ws(ps);
                if (ps->s[ps->i] == '=') {
                    ps->i++;
                    for (unsigned k = 0; k < nparams; k++)
                        if (!strcmp(def->params[k], name))
                            idx = (int)k;
                    if (idx < 0) {
                        char list[160] = "";
                        size_t used = 0;
                        for (unsigned k = 0; k < nparams; k++) {
                            stk__fmt(list + used, sizeof list - used, "%s%s", k ? ", " : "",
                                     def->params[k]);
                            used = strlen(list);
                        }
                        stk__fmt(ps->err, ps->errlen,
                                 "transform spec: %s has no argument '%s' (it takes: %s)",
                                 def->name, name, nparams ? list : "no arguments");
                        return STK_EINVAL;
                    }
                    seen_kw = 1;
                } else {
                    ps->i = save;
                }
            }
            if (idx < 0) {
                if (seen_kw)
                    return perr(ps, "positional argument after a keyword argument");
                if (npos >= nparams) {
                    stk__fmt(ps->err, ps->errlen,
                             "transform spec: %s takes at most %u positional arguments", def->name,
                             nparams);
                    return STK_EINVAL;
                }
                idx = (int)npos++;
            }
            if (set[idx])
                return aerr(&a, def->params[idx], "is given twice");
            if ((rc = read_value(ps, &v)))
                return rc;
            args[idx] = v;
            set[idx] = 1;
            skip_ws(ps);
            if (ps->s[ps->i] == ',')
                ps->i++;
            else if (ps->s[ps->i] != ')')
                return perr(ps, "expected ',' or ')'");
        }
    }
    for (unsigned k = 0; k < def->required; k++)
        if (!set[k])
            return aerr(&a, def->params[k], "is required");
    return build_xform(&a, args, set, x);
}

static int add_xform(stk__imgpipe *p, const xform *x, char *err, size_t errlen)
{
    if (p->nx == MAX_XFORMS) {
        stk__fmt(err, errlen, "transform spec: more than %d transforms", MAX_XFORMS);
        return STK_EINVAL;
    }
    p->x[p->nx++] = *x;
    return STK_OK;
}

/* The presets add_preset builds; the "size" option sets the output side of
 * each (stk_transform_preset_sized). */
static const char *const PRESETS[] = {"imagenet-train", "imagenet-val", "cifar-train"};

const char *stk_transform_preset_next(const char *prev)
{
    size_t n = sizeof PRESETS / sizeof PRESETS[0];
    if (!prev)
        return PRESETS[0];
    for (size_t k = 0; k + 1 < n; k++)
        if (prev == PRESETS[k] || !strcmp(prev, PRESETS[k]))
            return PRESETS[k + 1];
    return NULL;
}

int stk_transform_preset_sized(const char *name)
{
    for (size_t k = 0; name && k < sizeof PRESETS / sizeof PRESETS[0]; k++)
        if (!strcmp(name, PRESETS[k]))
            return 1;
    return 0;
}

static int add_preset(stk__imgpipe *p, const char *name, int size, char *err, size_t errlen)
{
    xform a, b;
    int rc;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    b.kind = T_HFLIP;
    b.p = 0.5;
    if (!strcmp(name, "imagenet-train")) {
        uint32_t s = size > 0 ? (uint32_t)size : 224;
        a.kind = T_RRC;
        a.size[0] = a.size[1] = s;
        a.scale[0] = 0.08, a.scale[1] = 1.0;
        a.ratio[0] = 3.0 / 4.0, a.ratio[1] = 4.0 / 3.0;
    } else if (!strcmp(name, "imagenet-val")) {
        uint32_t s = size > 0 ? (uint32_t)size : 224;
        a.kind = T_RESIZE;
        a.shorter = 1;
        a.size[0] = a.size[1] = (uint32_t)lround((double)s * 256.0 / 224.0);
        b.kind = T_CENTER;
        b.size[0] = b.size[1] = s;
    } else if (!strcmp(name, "cifar-train")) {
        uint32_t s = size > 0 ? (uint32_t)size : 32;
        a.kind = T_RCROP;
        a.size[0] = a.size[1] = s;
        a.has_pad = 1;
        a.pad[0] = a.pad[1] = a.pad[2] = a.pad[3] = 4;
    } else {
        return 1; /* not a preset */
    }
    if ((rc = add_xform(p, &a, err, errlen)))
        return rc;
    return add_xform(p, &b, err, errlen);
}

static int parse_spec(stk__imgpipe *p, const char *spec, int size, char *err, size_t errlen)
{
    parser ps = {spec, 0, err, errlen};
    for (;;) {
        char name[64];
        int rc;
        skip_ws(&ps);
        size_t at = ps.i;
        if (!read_ident(&ps, name, sizeof name))
            return perr(&ps, "expected a transform name");
        if (!strcmp(name, "decode")) {
            if (at != 0 || p->nx)
                return perr(&ps, "'decode' must be the whole spec");
            p->decode_only = 1;
        } else if ((rc = add_preset(p, name, size, err, errlen)) != 1) {
            if (rc)
                return rc;
        } else {
            const tdef *def = NULL;
            xform x;
            for (size_t k = 0; k < sizeof TDEFS / sizeof TDEFS[0]; k++)
                if (!strcmp(TDEFS[k].name, name))
                    def = &TDEFS[k];
            if (!def) {
                stk__fmt(err, errlen, "transform spec: unknown transform '%s'; %s", name,
                         SUPPORTED);
                return STK_EINVAL;
            }
            if ((rc = parse_args(&ps, def, &x)))
                return rc;
            if ((rc = add_xform(p, &x, err, errlen)))
                return rc;
        }
        skip_ws(&ps);
        if (!spec[ps.i])
            break;
        if (spec[ps.i] != '|')
            return perr(&ps, "expected '|' between transforms");
        if (p->decode_only)
            return perr(&ps, "'decode' must be the whole spec");
        ps.i++;
    }
    return STK_OK;
}

/* Checks the order of the parsed transforms and derives the output shape. */
static int finish_spec(stk__imgpipe *p, char *err, size_t errlen)
{
    int known = 0, value_op = 0;
    uint32_t h = 0, w = 0;
    for (unsigned k = 0; k < p->nx; k++) {
        const xform *x = &p->x[k];
        switch (x->kind) {
        case T_RRC:
        case T_CENTER:
        case T_RCROP:
            known = 1;
            h = x->size[0];
            w = x->size[1];
            break;
        case T_RESIZE:
            known = !x->shorter;
            h = x->size[0];
            w = x->size[1];
            break;
        case T_PAD:
            if (known) {
                h += x->pad[1] + x->pad[3];
                w += x->pad[0] + x->pad[2];
                if (h > MAX_SIZE || w > MAX_SIZE) {
                    stk__fmt(err, errlen, "transform spec: Pad makes the image larger than 65535");
                    return STK_EINVAL;
                }
            }
            break;
        case T_NORMALIZE:
            if (p->normalize) {
                stk__fmt(err, errlen, "transform spec: Normalize is given twice");
                return STK_EINVAL;
            }
            p->normalize = 1;
            value_op = 1;
            break;
        case T_TOTENSOR:
            p->totensor = 1;
            value_op = 1;
            break;
        default: break;
        }
        if (value_op && x->kind != T_NORMALIZE && x->kind != T_TOTENSOR && x->kind != T_HFLIP &&
            x->kind != T_VFLIP) {
            stk__fmt(err, errlen,
                     "transform spec: Normalize/ToTensor must come after the geometric transforms "
                     "(only flips may follow them)");
            return STK_EINVAL;
        }
    }
    p->dense = known;
    p->out_h = h;
    p->out_w = w;
    if ((p->normalize || p->totensor) && p->dtype == STK_DTYPE_UINT8)
        p->dtype = STK_DTYPE_FLOAT32;
    if (!p->dense && (p->dtype != STK_DTYPE_UINT8)) {
        stk__fmt(err, errlen,
                 "transform spec: this pipeline's output size varies per image, so it can only "
                 "produce uint8 HWC images: drop Normalize/ToTensor and the float dtype, or end "
                 "with a fixed-size transform (CenterCrop, RandomResizedCrop, RandomCrop, "
                 "Resize((h, w)))");
        return STK_EINVAL;
    }
    return STK_OK;
}

void stk__imgpipe_convert(const stk__imgpipe *p, stk__convert *cv)
{
    const xform *nx = NULL;
    for (unsigned k = 0; k < p->nx; k++)
        if (p->x[k].kind == T_NORMALIZE)
            nx = &p->x[k];
    memset(cv, 0, sizeof *cv);
    cv->dtype = p->dtype;
    cv->nchw = p->nchw;
    cv->scaled = p->normalize || p->totensor;
    cv->normalize = nx != NULL;
    for (int c = 0; c < 3; c++) {
        cv->mean[c] = nx ? (float)nx->mean[c] : 0.0f;
        cv->std[c] = nx ? (float)nx->std[c] : 1.0f;
    }
    cv->h = p->out_h;
    cv->w = p->out_w;
}

/* The output value of each channel's 256 levels, from the one definition of
 * the math (ops/convert.h): float32 in the same order as torchvision's
 * ToTensor (x / 255) and Normalize ((x - m) / s), so the result is bit-exact
 * with torch's float32 path and with the device stage's kernel. */
static void build_luts(stk__imgpipe *p)
{
    stk__convert cv;
    stk__imgpipe_convert(p, &cv);
    for (int c = 0; c < 3; c++) {
        for (unsigned v = 0; v < 256; v++) {
            float f = stk__norm_value(&cv, c, v);
            p->lut32[c * 256 + (int)v] = f;
            p->lut16[c * 256 + (int)v] =
                p->dtype == STK_DTYPE_BFLOAT16 ? stk__bf16_from_f32(f) : stk__f16_from_f32(f);
        }
    }
}

void stk__imgpipe_set_host_uint8(stk__imgpipe *p)
{
    p->dtype = STK_DTYPE_UINT8;
    p->nchw = 0;
}

int stk__imgpipe_create(stk__imgpipe **out, const char *spec, const stk__imgpipe_params *prm,
                        char *err, size_t errlen)
{
    int rc = STK_OK;
    stk__imgpipe *p = NULL;
    *out = NULL;
    if (!spec || !prm) {
        stk__fmt(err, errlen, "transform spec: missing");
        rc = STK_EINVAL;
        goto out;
    }
    if (prm->dtype < STK_DTYPE_UINT8 || prm->dtype > STK_DTYPE_BFLOAT16) {
        stk__fmt(err, errlen, "unknown dtype %d", prm->dtype);
        rc = STK_EINVAL;
        goto out;
    }
    if (prm->size < 0 || prm->size > (int)MAX_SIZE) {
        stk__fmt(err, errlen, "size %d is out of range 1..65535", prm->size);
        rc = STK_EINVAL;
        goto out;
    }
    p = stk__calloc(1, sizeof *p);
    if (!p) {
        stk__fmt(err, errlen, "out of memory");
        rc = STK_ENOMEM;
        goto out;
    }
    p->dtype = prm->dtype;
    p->nchw = prm->nchw ? 1 : 0;
    p->exif = prm->exif ? 1 : 0;
    p->copts.exif = p->exif;
    p->max_dim = prm->max_dim ? prm->max_dim : 16384;
    if ((rc = parse_spec(p, spec, prm->size, err, errlen)))
        goto out;
    if ((rc = finish_spec(p, err, errlen)))
        goto out;
    if (!p->dense)
        p->nchw = 0; /* variable-size outputs are HWC by contract */
    build_luts(p);
    *out = p;
    p = NULL;
out:
    stk__free(p);
    return rc;
}

void stk__imgpipe_set_raw(stk__imgpipe *p, uint32_t h, uint32_t w, uint32_t c, int chw)
{
    p->copts.raw_h = h;
    p->copts.raw_w = w;
    p->copts.raw_c = c;
    p->copts.raw_chw = chw;
}

void stk__imgpipe_set_strict(stk__imgpipe *p, int strict)
{
    p->copts.strict = strict ? 1 : 0;
}

void stk__imgpipe_set_jpeg_memory(stk__imgpipe *p, size_t bytes)
{
    p->copts.max_memory = bytes;
}

void stk__imgpipe_destroy(stk__imgpipe *p)
{
    stk__free(p);
}

int stk__imgpipe_dense(const stk__imgpipe *p, unsigned *ndim, int64_t shape[4], int *dtype,
                       size_t *sample_bytes)
{
    if (!p->dense)
        return 0;
    *ndim = 3;
    if (p->nchw) {
        shape[0] = 3;
        shape[1] = p->out_h;
        shape[2] = p->out_w;
    } else {
        shape[0] = p->out_h;
        shape[1] = p->out_w;
        shape[2] = 3;
    }
    shape[3] = 0;
    *dtype = p->dtype;
    *sample_bytes = (size_t)p->out_h * p->out_w * 3 * stk__dtype_size(p->dtype);
    return 1;
}

/* ---- Planning ------------------------------------------------------------ */

enum ckind { C_CROP, C_PAD, C_RESIZE, C_HFLIP, C_VFLIP };

/* A concrete operation: crop (x, y, w, h); pad (left, top, right, bottom,
 * fill); resize (w, h); flips. */
typedef struct cop {
    int kind;
    uint32_t a[4];
    uint8_t fill[3];
} cop;

#define MAX_COPS (MAX_XFORMS * 4)

typedef struct plan {
    cop ops[MAX_COPS];
    unsigned n;
    uint32_t w, h; /* size after all ops */
} plan;

static void push(plan *pl, int kind, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                 const uint8_t *fill)
{
    cop *c = &pl->ops[pl->n++];
    c->kind = kind;
    c->a[0] = a0, c->a[1] = a1, c->a[2] = a2, c->a[3] = a3;
    if (fill)
        memcpy(c->fill, fill, 3);
    else
        memset(c->fill, 0, 3);
}

static int push_pad(plan *pl, uint32_t l, uint32_t t, uint32_t r, uint32_t b, const uint8_t *fill,
                    char *err, size_t errlen)
{
    if ((uint64_t)pl->w + l + r > MAX_SIZE || (uint64_t)pl->h + t + b > MAX_SIZE) {
        stk__fmt(err, errlen, "padding makes the image larger than 65535 pixels");
        return STK_ETOOBIG;
    }
    if (l || t || r || b)
        push(pl, C_PAD, l, t, r, b, fill);
    pl->w += l + r;
    pl->h += t + b;
    return STK_OK;
}

/* Python's round() (half to even) of a float, as torchvision's center crop. */
static uint32_t round_half_even(double v)
{
    return (uint32_t)nearbyint(v);
}

/* Turns the transforms into concrete operations for an image of w x h,
 * drawing random numbers in torchvision's order. */
static int make_plan(const stk__imgpipe *p, uint32_t w, uint32_t h, stk__rng *rng, plan *pl,
                     char *err, size_t errlen)
{
    int rc = STK_OK;
    pl->n = 0;
    pl->w = w;
    pl->h = h;
    for (unsigned k = 0; k < p->nx && !rc; k++) {
        const xform *x = &p->x[k];
        switch (x->kind) {
        case T_RRC: {
            uint32_t r[4];
            stk__rrc_params(rng, pl->w, pl->h, x->scale, x->ratio, r, NULL);
            if (r[2] != pl->h || r[3] != pl->w)
                push(pl, C_CROP, r[1], r[0], r[3], r[2], NULL);
            if (r[2] != x->size[0] || r[3] != x->size[1])
                push(pl, C_RESIZE, x->size[1], x->size[0], 0, 0, NULL);
            pl->w = x->size[1];
            pl->h = x->size[0];
            break;
        }
        case T_RESIZE: {
            uint32_t nw, nh;
            if (x->shorter) {
                /* torchvision's _compute_resized_output_size. */
                uint32_t s = x->size[0];
                uint32_t shrt = pl->w <= pl->h ? pl->w : pl->h;
                uint32_t lng = pl->w <= pl->h ? pl->h : pl->w;
                double nl = floor((double)s * (double)lng / (double)shrt);
                uint32_t ns = s;
                if (nl > MAX_SIZE) {
                    stk__fmt(err, errlen, "Resize(%u) of a %ux%u image exceeds 65535 pixels", s,
                             pl->w, pl->h);
                    rc = STK_ETOOBIG;
                    break;
                }
                uint32_t nlong = (uint32_t)nl;
                if (x->max_size && nlong > x->max_size) {
                    ns = (uint32_t)floor((double)x->max_size * (double)ns / (double)nlong);
                    nlong = x->max_size;
                }
                if (ns == 0)
                    ns = 1;
                if (nlong == 0)
                    nlong = 1;
                nw = pl->w <= pl->h ? ns : nlong;
                nh = pl->w <= pl->h ? nlong : ns;
            } else {
                nw = x->size[1];
                nh = x->size[0];
            }
            if (nw != pl->w || nh != pl->h)
                push(pl, C_RESIZE, nw, nh, 0, 0, NULL);
            pl->w = nw;
            pl->h = nh;
            break;
        }
        case T_CENTER: {
            uint32_t ch = x->size[0], cw = x->size[1];
            if (cw > pl->w || ch > pl->h) {
                uint32_t l = cw > pl->w ? (cw - pl->w) / 2 : 0;
                uint32_t t = ch > pl->h ? (ch - pl->h) / 2 : 0;
                uint32_t r = cw > pl->w ? (cw - pl->w + 1) / 2 : 0;
                uint32_t b = ch > pl->h ? (ch - pl->h + 1) / 2 : 0;
                if ((rc = push_pad(pl, l, t, r, b, NULL, err, errlen)))
                    break;
                if (cw == pl->w && ch == pl->h)
                    break;
            }
            uint32_t top = round_half_even((double)(pl->h - ch) / 2.0);
            uint32_t left = round_half_even((double)(pl->w - cw) / 2.0);
            if (cw != pl->w || ch != pl->h)
                push(pl, C_CROP, left, top, cw, ch, NULL);
            pl->w = cw;
            pl->h = ch;
            break;
        }
        case T_RCROP: {
            uint32_t th = x->size[0], tw = x->size[1];
            if (x->has_pad && (rc = push_pad(pl, x->pad[0], x->pad[1], x->pad[2], x->pad[3],
                                             x->fill, err, errlen)))
                break;
            /* torchvision pads by the whole shortfall on both sides. */
            if (x->pad_if_needed && pl->w < tw &&
                (rc = push_pad(pl, tw - pl->w, 0, tw - pl->w, 0, x->fill, err, errlen)))
                break;
            if (x->pad_if_needed && pl->h < th &&
                (rc = push_pad(pl, 0, th - pl->h, 0, th - pl->h, x->fill, err, errlen)))
                break;
            if (pl->w < tw || pl->h < th) {
                stk__fmt(err, errlen,
                         "image is %ux%u, smaller than the RandomCrop size %ux%u "
                         "(use pad_if_needed=True)",
                         pl->w, pl->h, tw, th);
                rc = STK_EFORMAT;
                break;
            }
            if (pl->w == tw && pl->h == th)
                break; /* torchvision draws nothing here */
            uint32_t i = (uint32_t)stk__rng_below(rng, (uint64_t)(pl->h - th) + 1);
            uint32_t j = (uint32_t)stk__rng_below(rng, (uint64_t)(pl->w - tw) + 1);
            push(pl, C_CROP, j, i, tw, th, NULL);
            pl->w = tw;
            pl->h = th;
            break;
        }
        case T_PAD:
            rc = push_pad(pl, x->pad[0], x->pad[1], x->pad[2], x->pad[3], x->fill, err, errlen);
            break;
        case T_HFLIP:
        case T_VFLIP:
            /* torch.rand(1) < p: always one draw, whatever p. */
            if (stk__rng_uniform(rng) < x->p)
                push(pl, x->kind == T_HFLIP ? C_HFLIP : C_VFLIP, 0, 0, 0, 0, NULL);
            break;
        default: break;
        }
    }
    return rc;
}

/* One axis of a resample: outputs [o0, o0 + n) of resizing the span
 * [in0, in1) of a clamp region of in_size pixels (starting at c0 in the
 * image being read) to out pixels. lo/hi: the inputs read, relative to c0. */
typedef struct rsax {
    int identity;
    uint32_t in_size, out, o0, n;
    double in0, in1;
    int32_t c0, lo, hi;
    uint32_t ksize;
} rsax;

static void rsax_plan(rsax *a, int32_t c0, uint32_t in_size, double in0, double in1, uint32_t out,
                      uint32_t o0, uint32_t n)
{
    a->c0 = c0;
    a->in_size = in_size;
    a->in0 = in0;
    a->in1 = in1;
    a->out = out;
    a->o0 = o0;
    a->n = n;
    /* PIL's need_horizontal/need_vertical: an unscaled, unshifted axis is
     * a plain copy. */
    a->identity = in0 == 0.0 && in1 == (double)in_size && out == in_size;
    if (a->identity) {
        a->lo = (int32_t)o0;
        a->hi = (int32_t)(o0 + n);
        a->ksize = 0;
    } else {
        int32_t f0, n0, f1, n1;
        stk__axis_bound(in_size, in0, in1, out, o0, &f0, &n0);
        stk__axis_bound(in_size, in0, in1, out, o0 + n - 1, &f1, &n1);
        a->lo = f0;
        a->hi = f1 + n1;
        if (a->hi <= a->lo)
            a->hi = a->lo + 1;
        a->ksize = stk__axis_ksize(in0, in1, out);
    }
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Scratch bytes a resample needs besides its source. */
static size_t rs_bytes(const rsax *ax, const rsax *ay)
{
    size_t n = 0;
    if (!ax->identity)
        n += align64(stk__axis_bytes(ax->n, ax->ksize)) +
             align64((size_t)ax->n * (size_t)(ay->hi - ay->lo) * 3);
    if (!ay->identity)
        n += align64(stk__axis_bytes(ay->n, ay->ksize)) + align64((size_t)ax->n * ay->n * 3);
    return n;
}

/* Runs a planned resample. src covers columns [lo, hi) and rows [lo, hi)
 * of the two axes (relative to their clamp regions). mem: rs_bytes. */
static stk__view rs_run(const rsax *ax, const rsax *ay, const stk__view *src, uint8_t *mem)
{
    stk__view hv, out;
    const uint32_t rows = (uint32_t)(ay->hi - ay->lo);
    if (ax->identity) {
        hv = stk__crop(src, ax->o0 - (uint32_t)ax->lo, 0, ax->n, rows);
    } else {
        stk__axis axh;
        stk__axis_init(&axh, mem, ax->in_size, ax->in0, ax->in1, ax->out, ax->o0, ax->n);
        stk__axis_shift(&axh, -ax->lo);
        mem += align64(stk__axis_bytes(ax->n, ax->ksize));
        hv.p = mem;
        hv.stride = (size_t)ax->n * 3;
        hv.w = ax->n;
        hv.h = rows;
        mem += align64((size_t)ax->n * rows * 3);
        stk__resample_h(src, 0, &axh, &hv);
    }
    if (ay->identity) {
        out = stk__crop(&hv, 0, ay->o0 - (uint32_t)ay->lo, ax->n, ay->n);
    } else {
        stk__axis axv;
        stk__axis_init(&axv, mem, ay->in_size, ay->in0, ay->in1, ay->out, ay->o0, ay->n);
        stk__axis_shift(&axv, -ay->lo);
        mem += align64(stk__axis_bytes(ay->n, ay->ksize));
        out.p = mem;
        out.stride = (size_t)ax->n * 3;
        out.w = ax->n;
        out.h = ay->n;
        stk__resample_v(&hv, &axv, &out);
    }
    return out;
}

/* ---- EXIF orientation ----------------------------------------------------- */

static uint32_t rd16(const uint8_t *p, int le)
{
    return le ? (uint32_t)(p[0] | p[1] << 8) : (uint32_t)(p[0] << 8 | p[1]);
}

static uint32_t rd32(const uint8_t *p, int le)
{
    return le ? ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24)
              : ((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
                 (uint32_t)p[3]);
}

/* The Orientation tag (0x0112) of IFD0 of a TIFF-structured EXIF block, or
 * 1 when absent or malformed (a broken EXIF block is not a broken image). */
static int exif_orientation(const uint8_t *t, size_t n)
{
    int le;
    if (!t || n < 8)
        return 1;
    if (t[0] == 'I' && t[1] == 'I')
        le = 1;
    else if (t[0] == 'M' && t[1] == 'M')
        le = 0;
    else
        return 1;
    if (rd16(t + 2, le) != 42)
        return 1;
    uint32_t ifd = rd32(t + 4, le);
    if (ifd > n - 2)
        return 1;
    uint32_t count = rd16(t + ifd, le);
    for (uint32_t k = 0; k < count; k++) {
        size_t e = (size_t)ifd + 2 + (size_t)k * 12;
        if (e + 12 > n)
            break;
        if (rd16(t + e, le) == 0x0112 && rd16(t + e + 2, le) == 3) {
            uint32_t v = rd16(t + e + 8, le);
            return v >= 1 && v <= 8 ? (int)v : 1;
        }
    }
    return 1;
}

/* Writes the stored image s (W x H) into o in display orientation, as PIL's
 * ImageOps.exif_transpose. */
static void orient(const stk__view *s, const stk__view *o, int orientation)
{
    const uint32_t W = s->w, H = s->h;
    for (uint32_t y = 0; y < o->h; y++) {
        uint8_t *d = o->p + (size_t)y * o->stride;
        for (uint32_t x = 0; x < o->w; x++) {
            uint32_t sx, sy;
            switch (orientation) {
            case 2: sx = W - 1 - x, sy = y; break;
            case 3: sx = W - 1 - x, sy = H - 1 - y; break;
            case 4: sx = x, sy = H - 1 - y; break;
            case 5: sx = y, sy = x; break;
            case 6: sx = y, sy = H - 1 - x; break;
            case 7: sx = W - 1 - y, sy = H - 1 - x; break;
            case 8: sx = W - 1 - y, sy = x; break;
            default: sx = x, sy = y; break;
            }
            memcpy(d + (size_t)x * 3, s->p + (size_t)sy * s->stride + (size_t)sx * 3, 3);
        }
    }
}

/* ---- Running -------------------------------------------------------------- */

static const stk__codec *const CODECS[] = {&stk__codec_jpeg, &stk__codec_png};

const char *stk__image_other_format(const uint8_t *b, size_t n)
{
    /* Image formats stoker recognises by signature but does not decode. */
    static const struct {
        const char *magic;
        size_t len, off;
        const char *name;
    } others[] = {
        {"GIF87a", 6, 0, "GIF"},
        {"GIF89a", 6, 0, "GIF"},
        {"BM", 2, 0, "BMP"},
        {"II*\0", 4, 0, "TIFF"},
        {"MM\0*", 4, 0, "TIFF"},
        {"WEBP", 4, 8, "WebP"},
        {"ftypavif", 8, 4, "AVIF"},
        {"ftypheic", 8, 4, "HEIC"},
        {"ftypmif1", 8, 4, "HEIF"},
        {"\xff\x4f\xff\x51", 4, 0, "JPEG 2000"},
        {"\0\0\0\x0cjP  ", 8, 0, "JPEG 2000"},
        {"\xff\x0a", 2, 0, "JPEG XL"},
        {"qoif", 4, 0, "QOI"},
    };
    for (size_t k = 0; k < sizeof others / sizeof others[0]; k++)
        if (n >= others[k].off + others[k].len &&
            !memcmp(b + others[k].off, others[k].magic, others[k].len))
            return others[k].name;
    return NULL;
}

static int sniff(const uint8_t *b, size_t n, const stk__codec **out, char *err, size_t errlen)
{
    if (n == 0) {
        stk__fmt(err, errlen, "empty file (0 bytes)");
        return STK_EFORMAT;
    }
    for (size_t k = 0; k < sizeof CODECS / sizeof CODECS[0]; k++) {
        if (CODECS[k]->sniff(b, n)) {
            *out = CODECS[k];
            return STK_OK;
        }
    }
    const char *other = stk__image_other_format(b, n);
    if (other) {
        stk__fmt(err, errlen, "%s images are not supported (only JPEG and PNG)", other);
        return STK_EUNSUPPORTED;
    }
    if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) {
        stk__fmt(err, errlen, "not a JPEG: truncated after the SOI marker (%zu bytes)", n);
        return STK_EFORMAT;
    }
    stk__fmt(err, errlen, "not an image: unknown signature %02x %02x %02x %02x (%zu bytes)", b[0],
             n > 1 ? b[1] : 0, n > 2 ? b[2] : 0, n > 3 ? b[3] : 0, n);
    return STK_EFORMAT;
}

/* Scratch carving: regions are laid out back to back, 64-byte aligned. */
typedef struct layout {
    size_t dec, tmp, orient, stage, rest_buf, rest_aux, total;
} layout;

/* ---- Running the pipeline on one image --------------------------------------
 * stk__imgpipe_run goes through named phases sharing one context:
 *   open_image   - pick the codec, read the header, check the size, orientation
 *   plan_stage   - the sample's random plan; fold its leading crops and first
 *                  resize into one resampling stage; choose the DCT scale
 *   size_rest    - buffer sizes for the ops after that stage
 *   start_decode - commit the decoder to the region the stage reads; lay out
 *                  the scratch buffer
 *   decode       - decode the region (straight into the slot when nothing else
 *                  runs)
 *   run_stage    - orient, crop and resample the decoded region
 *   run_rest     - the remaining crops, pads, flips and resizes
 *   write_out    - convert and store into the slot (dtype, layout, flips) */

typedef struct run_ctx {
    const stk__imgpipe *p;
    const uint8_t *bytes;
    size_t n;
    char *err;
    size_t errlen;
    const stk__codec *codec;
    void *st;
    stk__imginfo info;
    int orientation;
    uint32_t W, H;
    plan pl;
    size_t esize;
    /* the first stage: box in the source, its resized size, kept window */
    uint32_t bx, by, bw, bh, rw, rh, wx, wy, ww, wh;
    int resized;
    unsigned k; /* first op after the stage */
    unsigned m; /* DCT scale m/8 */
    rsax ax, ay;
    size_t rest_buf, rest_aux;
    stk__rect r;
    int direct;
    layout L;
    uint8_t *m_dec, *m_tmp, *m_orient, *m_stage, *m_rest0, *m_rest1, *m_aux;
    stk__view cur;
    int hf, vf;
    uint64_t decoded_at; /* stk__imgpipe_result.decoded_at */
} run_ctx;

static int open_image(run_ctx *x)
{
    const stk__imgpipe *p = x->p;
    int rc;
    if (p->copts.raw_c)
        x->codec = &stk__codec_raw; /* the source's raw tensors */
    else if ((rc = sniff(x->bytes, x->n, &x->codec, x->err, x->errlen)))
        return rc;
    if ((rc = x->codec->open(&x->st, x->bytes, x->n, &p->copts, &x->info, x->err, x->errlen)))
        return rc;
    if (x->info.width == 0 || x->info.height == 0) {
        stk__fmt(x->err, x->errlen, "%s: image has zero size (%ux%u)", x->codec->name,
                 x->info.width, x->info.height);
        return STK_EFORMAT;
    }
    if (x->info.width > p->max_dim || x->info.height > p->max_dim) {
        stk__fmt(x->err, x->errlen, "%s image is %ux%u, larger than max_dim %u", x->codec->name,
                 x->info.width, x->info.height, p->max_dim);
        return STK_ETOOBIG;
    }
    x->orientation = p->exif ? exif_orientation(x->info.exif, x->info.exif_len) : 1;
    x->W = x->orientation >= 5 ? x->info.height : x->info.width;
    x->H = x->orientation >= 5 ? x->info.width : x->info.height;
    return STK_OK;
}

/* Plans the geometry and takes the output's memory from the sink, now that
 * its size is known. */
static int plan_stage(run_ctx *x, stk__rng *rng, stk__sink *out, uint8_t **outp)
{
    const stk__imgpipe *p = x->p;
    int rc;
    if ((rc = make_plan(p, x->W, x->H, rng, &x->pl, x->err, x->errlen)))
        return rc;
    x->esize = stk__dtype_size(p->dtype);
    const size_t need = (size_t)x->pl.w * x->pl.h * 3 * x->esize;
    if (!(*outp = stk__sink_reserve(out, need, &rc))) {
        if (out->why[0])
            stk__fmt(x->err, x->errlen, "%s", out->why);
        else if (rc == STK_ETOOBIG)
            stk__fmt(x->err, x->errlen, "output of %ux%u needs %zu bytes, the slot holds %zu",
                     x->pl.w, x->pl.h, need, out->cap);
        else
            stk__fmt(x->err, x->errlen, "out of memory for an output of %zu bytes", need);
        return rc;
    }

    /* Fold the leading crops and the first resize into one stage. */
    x->bx = x->by = 0, x->bw = x->W, x->bh = x->H; /* source box */
    x->rw = x->W, x->rh = x->H;                    /* its resized size */
    x->wx = x->wy = 0, x->ww = x->W, x->wh = x->H; /* kept window of the resized box */
    x->resized = 0;
    for (x->k = 0; x->k < x->pl.n; x->k++) {
        const cop *c = &x->pl.ops[x->k];
        if (c->kind == C_CROP) {
            x->wx += c->a[0];
            x->wy += c->a[1];
            x->ww = c->a[2];
            x->wh = c->a[3];
        } else if (c->kind == C_RESIZE && !x->resized) {
            x->bx += x->wx, x->by += x->wy, x->bw = x->ww, x->bh = x->wh;
            x->rw = c->a[0], x->rh = c->a[1];
            x->wx = x->wy = 0, x->ww = x->rw, x->wh = x->rh;
            x->resized = 1;
        } else {
            break;
        }
    }

    /* DCT scaling: the smallest m/8 (m in 1, 2, 4: libjpeg-turbo 2.1 has
     * SIMD IDCTs only for those and 8/8) at which the box still has
     * DCT_MARGIN times the resized resolution, so the resampler always
     * reduces by a little and its triangle filter shapes the result. */
    x->m = 8;
    if (x->resized && x->info.scalable && x->orientation == 1) {
        for (unsigned cand = 1; cand < 8; cand *= 2) {
            if ((double)x->bw * cand / 8.0 >= DCT_MARGIN * x->rw &&
                (double)x->bh * cand / 8.0 >= DCT_MARGIN * x->rh) {
                x->m = cand;
                break;
            }
        }
    }
    uint32_t sw = x->W, sh = x->H;
    if (x->m != 8)
        x->codec->scaled_size(x->st, x->m, &sw, &sh);

    const double f = (double)x->m / 8.0;
    double x0 = x->bx * f, x1 = (x->bx + x->bw) * f, y0 = x->by * f, y1 = (x->by + x->bh) * f;
    int32_t cx0 = (int32_t)floor(x0), cy0 = (int32_t)floor(y0);
    uint32_t cx1 = (uint32_t)ceil(x1), cy1 = (uint32_t)ceil(y1);
    if (cx1 > sw)
        cx1 = sw;
    if (cy1 > sh)
        cy1 = sh;
    rsax_plan(&x->ax, cx0, cx1 - (uint32_t)cx0, x0 - cx0, x1 - cx0, x->rw, x->wx, x->ww);
    rsax_plan(&x->ay, cy0, cy1 - (uint32_t)cy0, y0 - cy0, y1 - cy0, x->rh, x->wy, x->wh);
    return STK_OK;
}

/* Ping-pong buffers for the pads and resizes after the stage, plus a
 * resize's own needs. */
static void size_rest(run_ctx *x)
{
    x->rest_buf = x->rest_aux = 0;
    uint32_t cw = x->ww, ch = x->wh;
    for (unsigned j = x->k; j < x->pl.n; j++) {
        const cop *c = &x->pl.ops[j];
        if (c->kind == C_CROP) {
            cw = c->a[2], ch = c->a[3];
        } else if (c->kind == C_PAD) {
            cw += c->a[0] + c->a[2], ch += c->a[1] + c->a[3];
            size_t b = align64((size_t)cw * ch * 3);
            x->rest_buf = b > x->rest_buf ? b : x->rest_buf;
        } else if (c->kind == C_RESIZE) {
            rsax rx, ry;
            rsax_plan(&rx, 0, cw, 0, cw, c->a[0], 0, c->a[0]);
            rsax_plan(&ry, 0, ch, 0, ch, c->a[1], 0, c->a[1]);
            size_t b = rs_bytes(&rx, &ry);
            x->rest_aux = b > x->rest_aux ? b : x->rest_aux;
            cw = c->a[0], ch = c->a[1];
            b = align64((size_t)cw * ch * 3);
            x->rest_buf = b > x->rest_buf ? b : x->rest_buf;
        }
    }
}

/* Commits the decoder to the region the stage reads and lays out the
 * scratch buffer. */
static int start_decode(run_ctx *x, stk__scratch *scratch)
{
    const stk__imgpipe *p = x->p;
    int rc;
    size_t tmp_bytes = 0;
    if (x->orientation == 1) {
        x->r.x = (uint32_t)(x->ax.c0 + x->ax.lo);
        x->r.y = (uint32_t)(x->ay.c0 + x->ay.lo);
        x->r.w = (uint32_t)(x->ax.hi - x->ax.lo);
        x->r.h = (uint32_t)(x->ay.hi - x->ay.lo);
    } else {
        x->r.x = x->r.y = 0;
        x->r.w = x->info.width;
        x->r.h = x->info.height;
    }
    const uint32_t want_x = x->r.x, want_w = x->r.w;
    if ((rc = x->codec->start(x->st, x->m, &x->r, &tmp_bytes, x->err, x->errlen)))
        return rc;

    /* Decode-only (or all-identity) pipelines decode straight into the slot
     * when the decoder produces exactly the wanted pixels. */
    x->direct = x->orientation == 1 && x->k == x->pl.n && x->ax.identity && x->ay.identity &&
                p->dtype == STK_DTYPE_UINT8 && !p->nchw && x->r.x == want_x && x->r.w == want_w &&
                x->r.w == x->ww && x->r.h == x->wh;

    layout *L = &x->L;
    L->dec = x->direct ? 0 : align64((size_t)x->r.w * x->r.h * 3);
    L->tmp = align64(tmp_bytes);
    L->orient = x->orientation != 1 ? align64((size_t)x->W * x->H * 3) : 0;
    L->stage = rs_bytes(&x->ax, &x->ay);
    L->rest_buf = x->rest_buf;
    L->rest_aux = x->rest_aux;
    L->total = L->dec + L->tmp + L->orient + L->stage + 2 * L->rest_buf + L->rest_aux;
    if ((rc = stk__scratch_reserve(scratch, L->total ? L->total : 1))) {
        if (rc == STK_ETOOBIG)
            stk__fmt(x->err, x->errlen,
                     "%ux%u image needs %zu bytes of scratch for this pipeline, more than the "
                     "limit of %zu (raise scratch_bytes or lower max_dim)",
                     x->info.width, x->info.height, L->total, scratch->limit);
        else
            stk__fmt(x->err, x->errlen, "out of memory for %zu bytes of scratch", L->total);
        return rc;
    }
    uint8_t *mem = scratch->p;
    x->m_dec = mem, x->m_tmp = x->m_dec + L->dec, x->m_orient = x->m_tmp + L->tmp;
    x->m_stage = x->m_orient + L->orient, x->m_rest0 = x->m_stage + L->stage;
    x->m_rest1 = x->m_rest0 + L->rest_buf, x->m_aux = x->m_rest1 + L->rest_buf;
    return STK_OK;
}

/* Decodes the region: into the slot when direct, else into the scratch's
 * decode buffer (*dec). */
static int decode(run_ctx *x, uint8_t *out, stk__view *dec)
{
    int rc;
    if (x->direct) {
        if ((rc = x->codec->read(x->st, out, (size_t)x->r.w * 3, x->m_tmp, x->err, x->errlen)))
            return rc;
        x->decoded_at = stk__now_ns();
        return STK_OK;
    }
    *dec = (stk__view){x->m_dec, (size_t)x->r.w * 3, x->r.w, x->r.h};
    if ((rc = x->codec->read(x->st, dec->p, dec->stride, x->m_tmp, x->err, x->errlen)))
        return rc;
    x->decoded_at = stk__now_ns();
    x->codec->close(x->st);
    x->st = NULL;
    return STK_OK;
}

/* The stage's source, columns [lo, hi) and rows [lo, hi) of its axes, oriented
 * and resampled. */
static void run_stage(run_ctx *x, const stk__view *dec)
{
    stk__view src;
    if (x->orientation == 1) {
        src = stk__crop(dec, (uint32_t)(x->ax.c0 + x->ax.lo) - x->r.x, 0,
                        (uint32_t)(x->ax.hi - x->ax.lo), (uint32_t)(x->ay.hi - x->ay.lo));
    } else {
        stk__view o = {x->m_orient, (size_t)x->W * 3, x->W, x->H};
        orient(dec, &o, x->orientation);
        src = stk__crop(&o, (uint32_t)(x->ax.c0 + x->ax.lo), (uint32_t)(x->ay.c0 + x->ay.lo),
                        (uint32_t)(x->ax.hi - x->ax.lo), (uint32_t)(x->ay.hi - x->ay.lo));
    }
    x->cur = rs_run(&x->ax, &x->ay, &src, x->m_stage);
}

/* The rest of the plan. Flips are deferred: crops and pads map through them
 * exactly, and the writer applies them for free at the end; only a resize
 * (whose rounding is not mirror-symmetric) makes them happen. */
static void run_rest(run_ctx *x)
{
    int which = 0;
    stk__view cur = x->cur;
    int hf = 0, vf = 0;
    for (unsigned k = x->k; k < x->pl.n; k++) {
        const cop *c = &x->pl.ops[k];
        uint8_t *dst = which ? x->m_rest1 : x->m_rest0;
        switch (c->kind) {
        case C_CROP: {
            uint32_t cx = hf ? cur.w - c->a[0] - c->a[2] : c->a[0];
            uint32_t cy = vf ? cur.h - c->a[1] - c->a[3] : c->a[1];
            cur = stk__crop(&cur, cx, cy, c->a[2], c->a[3]);
            break;
        }
        case C_PAD: {
            uint32_t l = hf ? c->a[2] : c->a[0], t = vf ? c->a[3] : c->a[1];
            stk__view o = {dst, (size_t)(cur.w + c->a[0] + c->a[2]) * 3, cur.w + c->a[0] + c->a[2],
                           cur.h + c->a[1] + c->a[3]};
            stk__pad(&cur, &o, l, t, c->fill);
            cur = o;
            which ^= 1;
            break;
        }
        case C_HFLIP: hf ^= 1; break;
        case C_VFLIP: vf ^= 1; break;
        case C_RESIZE: {
            rsax rx, ry;
            if (hf)
                stk__flip_h(&cur);
            if (vf)
                stk__flip_v(&cur);
            hf = vf = 0;
            rsax_plan(&rx, 0, cur.w, 0, cur.w, c->a[0], 0, c->a[0]);
            rsax_plan(&ry, 0, cur.h, 0, cur.h, c->a[1], 0, c->a[1]);
            stk__view s = stk__crop(&cur, (uint32_t)rx.lo, (uint32_t)ry.lo,
                                    (uint32_t)(rx.hi - rx.lo), (uint32_t)(ry.hi - ry.lo));
            stk__view res = rs_run(&rx, &ry, &s, x->m_aux);
            /* Copy out of the aux area, which the next resize reuses. */
            stk__view o = {dst, (size_t)res.w * 3, res.w, res.h};
            for (uint32_t y = 0; y < res.h; y++)
                memcpy(o.p + y * o.stride, res.p + y * res.stride, (size_t)res.w * 3);
            cur = o;
            which ^= 1;
            break;
        }
        default: break;
        }
    }
    x->cur = cur;
    x->hf = hf;
    x->vf = vf;
}

static void write_out(const run_ctx *x, uint8_t *out, size_t *out_len, int32_t dims[3])
{
    stk__writer wr;
    wr.dtype = x->p->dtype;
    wr.nchw = x->p->nchw;
    wr.hflip = x->hf;
    wr.vflip = x->vf;
    wr.lut32 = x->p->lut32;
    wr.lut16 = x->p->lut16;
    stk__write(&x->cur, &wr, out);
    dims[0] = (int32_t)x->cur.h;
    dims[1] = (int32_t)x->cur.w;
    dims[2] = 3;
    *out_len = (size_t)x->cur.w * x->cur.h * 3 * x->esize;
}

int stk__imgpipe_run(const stk__imgpipe *p, const uint8_t *bytes, size_t n, stk__rng *rng,
                     stk__scratch *scratch, uint8_t *out, size_t out_cap, size_t *out_len,
                     int32_t dims[3], char *err, size_t errlen)
{
    stk__sink sink = {out, out_cap, NULL, NULL, NULL, ""};
    stk__imgpipe_result res;
    int rc = stk__imgpipe_run_sink(p, bytes, n, rng, scratch, &sink, &res, err, errlen);
    *out_len = res.len;
    memcpy(dims, res.dims, sizeof res.dims);
    return rc;
}

int stk__imgpipe_run_sink(const stk__imgpipe *p, const uint8_t *bytes, size_t n, stk__rng *rng,
                          stk__scratch *scratch, stk__sink *sink, stk__imgpipe_result *res,
                          char *err, size_t errlen)
{
    run_ctx x;
    uint8_t *out = NULL;
    memset(&x, 0, sizeof x);
    memset(res, 0, sizeof *res);
    x.p = p;
    x.bytes = bytes;
    x.n = n;
    x.err = err;
    x.errlen = errlen;
    stk__view dec;
    int rc;
    if ((rc = open_image(&x)) || (rc = plan_stage(&x, rng, sink, &out)))
        goto out;
    res->out = out;
    size_rest(&x);
    if ((rc = start_decode(&x, scratch)) || (rc = decode(&x, out, &dec)))
        goto out;
    if (x.direct) {
        res->dims[0] = (int32_t)x.r.h;
        res->dims[1] = (int32_t)x.r.w;
        res->dims[2] = 3;
        res->len = (size_t)x.r.w * x.r.h * 3;
        goto out;
    }
    run_stage(&x, &dec);
    run_rest(&x);
    write_out(&x, out, &res->len, res->dims);
out:
    res->decoded_at = x.decoded_at;
    if (x.codec && x.st)
        x.codec->close(x.st);
    return rc;
}
