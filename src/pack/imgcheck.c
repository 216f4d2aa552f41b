/*
 * imgcheck.c -- is a sample that claims to be an image one? Packing stores
 * images as they are unless asked to resize them, and `stoker verify` passes
 * them, so both sniff (and for JPEG/PNG, parse the header of) what they are
 * given: a text file named .jpg must not reach the shards unnoticed.
 */
#include "pack/pack.h"

#include "codec/codec.h"
#include "image.h"
#include "source/dataset.h"

#include <string.h>
#include <strings.h>

bool stk__image_name(const char *name)
{
    /* The folder reader's list (torchvision's IMG_EXTENSIONS). */
    static const char *const exts[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                       ".pgm", ".tif",  ".tiff", ".webp"};
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof exts / sizeof exts[0]; k++) {
        size_t e = strlen(exts[k]);
        if (n >= e && !strcasecmp(name + n - e, exts[k]))
            return true;
    }
    return false;
}

int stk__check_image(const uint8_t *b, size_t n, const char **format, char *err, size_t errlen)
{
    static const stk__codec *const codecs[] = {&stk__codec_jpeg, &stk__codec_png};
    const char *dummy;
    if (!format)
        format = &dummy;
    *format = NULL;
    if (n == 0) {
        stk__fmt(err, errlen, "not an image: empty file (0 bytes)");
        return -1;
    }
    for (size_t k = 0; k < sizeof codecs / sizeof codecs[0]; k++) {
        if (!codecs[k]->sniff(b, n))
            continue;
        /* A format stoker decodes: its header must parse too, which catches
         * files cut short or damaged near the start. */
        void *st = NULL;
        stk__imginfo info;
        stk__codec_opts copts = {0};
        int rc = codecs[k]->open(&st, b, n, &copts, &info, err, errlen);
        codecs[k]->close(st);
        if (rc == STK_OK && (info.width == 0 || info.height == 0)) {
            stk__fmt(err, errlen, "%s: image has zero size (%ux%u)", codecs[k]->name, info.width,
                     info.height);
            rc = STK_EFORMAT;
        }
        *format = codecs[k]->name;
        return rc == STK_OK ? 0 : -1;
    }
    if ((*format = stk__image_other_format(b, n)))
        return 0;
    if (n >= 3 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6' &&
        (b[2] == ' ' || b[2] == '\t' || b[2] == '\n' || b[2] == '\r')) {
        *format = "PNM";
        return 0;
    }
    stk__fmt(err, errlen, "not an image: unknown signature %02x %02x %02x %02x (%zu bytes)", b[0],
             n > 1 ? b[1] : 0, n > 2 ? b[2] : 0, n > 3 ? b[3] : 0, n);
    return -1;
}

int stk__images_of(const stk__source *s)
{
    /* The source says (stk__dataset_info.images): a folder takes only image
     * files; a resized .stk holds JPEGs; an encoded .stk the files of whatever
     * it was packed from, which its keys name. A tar sample's bytes may be
     * any member, so only the decoder checks those. */
    stk__dataset_info di;
    stk__source_describe(s, &di);
    return di.images;
}
