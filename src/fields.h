/*
 * fields.h -- samples with several fields (docs/multimodal.md): the fields a
 * user asks for (options), the plan that maps them onto a source's fields at
 * open, and the checks and conversions of one field's bytes (UTF-8, JSON,
 * numbers, .npy headers). The loader's workers put the results into the
 * batch's columns (loader_worker.c, ring/ring.c).
 */
#ifndef STK_FIELDS_H
#define STK_FIELDS_H

#include "internal.h"

#define STK__MAX_OUT_FIELDS 32 /* fields one loader may deliver */
#define STK__MAX_ALTS       8  /* ';'-separated alternatives of one field */

struct stk__source;
struct stk__imgpipe;

/* One field as the user asked for it (stk_options_add_field). */
typedef struct stk__fspec {
    char *name;
    char *sources; /* ';'-separated; never NULL (the name when not given) */
    char *transform;
    int kind;
    unsigned flags;
} stk__fspec;

/* A field as the loader delivers it, resolved against the source at open. */
typedef struct stk__fplan {
    const stk__fspec *spec;
    uint32_t alt[STK__MAX_ALTS]; /* source field ids, in the order asked */
    size_t nalt;
    const char *source_name; /* the first alternative the source has */
    int kind;
    struct stk__imgpipe *pipe; /* images with a transform (not the primary's) */
    uint64_t rng_salt;         /* further image fields: keys their draws (by name) */
    int layout, dtype;
    unsigned ndim;
    int64_t shape[4];
    size_t sample_bytes; /* dense */
} stk__fplan;

/* Frees the specs (options destroy). */
void stk__fspecs_free(stk__fspec *f, size_t n);
/* Deep copy (for a loader that outlives its options). */
int stk__fspecs_copy(stk__fspec **out, const stk__fspec *f, size_t n);

/* Maps the specs onto the source's fields: alternatives to ids (a name no
 * sample has is refused, naming what the source has), kinds decided.
 * Pipelines and layouts are the loader's to set. plan has n entries. A
 * name src does not describe is asked of its field_named op (a list's
 * element), which may add it to src's fields. STK_EINVAL with the message. */
int stk__fplan_resolve(stk__fplan *plan, const stk__fspec *specs, size_t n, struct stk__source *src,
                       char *err, size_t errlen);

/* ---- Checks and conversions of one field's bytes ---------------------------
 * Each returns STK_OK or STK_EFORMAT with the reason in err. */
int stk__utf8_check(const uint8_t *p, size_t n, char *err, size_t errlen);
int stk__json_check(const uint8_t *p, size_t n, char *err, size_t errlen);
int stk__field_int(const uint8_t *p, size_t n, int64_t *out, char *err, size_t errlen);
int stk__field_float(const uint8_t *p, size_t n, float *out, char *err, size_t errlen);

/* A .npy array: its element type (enum stk_dtype), shape and where its data
 * starts. */
typedef struct stk__npy {
    int dtype;
    unsigned ndim;
    int64_t shape[STK_FIELD_MAXDIM];
    size_t data_off, data_len;
} stk__npy;
int stk__npy_parse(const uint8_t *p, size_t n, stk__npy *out, char *err, size_t errlen);

#endif
