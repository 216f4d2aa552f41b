/* fuzz_fields.c -- libFuzzer target for the checks of one field's bytes
 * (src/fields.c): UTF-8, JSON, integer and float text, .npy headers, and the
 * --fields text. The same input goes to each; what is checked besides "no
 * crash, no overrun": the return codes are the documented ones, a JSON text
 * that passes is UTF-8, a parsed .npy array's data lies exactly inside the
 * input and matches its shape and dtype, a --fields text adds at most 32
 * fields, and nothing when refused. Linked with replay_main.c it replays
 * corpus files given as arguments (scripts/test-fuzz.sh). */
#include "fields.h"
#include "options.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_npy(const uint8_t *data, size_t size)
{
    stk__npy a;
    char err[STK_ERRMSG_MAX];
    int rc = stk__npy_parse(data, size, &a, err, sizeof err);
    if (rc != STK_OK) {
        if (rc != STK_EFORMAT || !err[0] || strlen(err) >= sizeof err)
            abort();
        return;
    }
    size_t isz = stk_dtype_size(a.dtype);
    if (!isz || a.ndim > STK_FIELD_MAXDIM || a.data_off > size || a.data_len != size - a.data_off)
        abort();
    uint64_t count = 1;
    for (unsigned d = 0; d < a.ndim; d++) {
        if (a.shape[d] < 0)
            abort();
        count *= (uint64_t)a.shape[d];
    }
    if (count * isz != a.data_len)
        abort();
}

static void check_fields_spec(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return;
    char *spec = malloc(size + 1);
    stk_options *o = calloc(1, sizeof *o);
    if (!spec || !o) {
        free(spec);
        free(o);
        return;
    }
    memcpy(spec, data, size);
    spec[size] = '\0';
    int rc = stk_options_set_fields(o, spec);
    if (rc == STK_OK) {
        if (!o->nfields || o->nfields > STK__MAX_OUT_FIELDS)
            abort();
        for (size_t k = 0; k < o->nfields; k++) {
            const stk__fspec *f = &o->fields[k];
            if (!f->name[0] || !f->sources[0] || f->kind < 0 || f->kind > STK_FIELD_NPY ||
                strchr(f->name, ',') || strchr(f->sources, ','))
                abort();
            for (size_t j = 0; j < k; j++)
                if (!strcmp(o->fields[j].name, f->name))
                    abort();
        }
    } else if (rc != STK_EINVAL || o->nfields || !o->errmsg[0]) {
        abort();
    }
    stk__fspecs_free(o->fields, o->nfields);
    free(o);
    free(spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[STK_ERRMSG_MAX];
    int u = stk__utf8_check(data, size, err, sizeof err);
    if (u != STK_OK && u != STK_EFORMAT)
        abort();
    int j = stk__json_check(data, size, err, sizeof err);
    if (j != STK_OK && j != STK_EFORMAT)
        abort();
    if (j == STK_OK && u != STK_OK) /* JSON texts are UTF-8 */
        abort();
    int64_t iv;
    float fv;
    int rc = stk__field_int(data, size, &iv, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT)
        abort();
    rc = stk__field_float(data, size, &fv, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT)
        abort();
    check_npy(data, size);
    check_fields_spec(data, size);
    return 0;
}
