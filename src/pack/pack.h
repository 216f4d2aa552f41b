/*
 * pack.h -- packing (stk_pack in include/stoker.h) and the image checks it
 * shares with `stoker verify`. src/pack/ sits above src/source/: it reads
 * through dataset.h and writes with stkformat.h's shard writer and
 * manifest.h.
 */
#ifndef STK_PACK_H
#define STK_PACK_H

#include "source/source.h"

/* True if name ends with one of the image extensions the folder reader
 * takes (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case). */
bool stk__image_name(const char *name);
/* Checks that the n bytes at b are an image: JPEG or PNG (the formats
 * stoker decodes) whose header parses, or another known image format by its
 * signature (GIF, BMP, TIFF, WebP, PNM, ...). Returns 0 with *format (may be
 * NULL) set to the format's name, or -1 with the reason in err ("not an
 * image: unknown signature ..." for text and other non-images). */
int stk__check_image(const uint8_t *b, size_t n, const char **format, char *err, size_t errlen);
/* Which samples of an open source claim to be images, to be checked with
 * stk__check_image before they are packed or passed by verify: 0 none, 1
 * all (a folder, a resized .stk), 2 those whose key is an image's file name
 * (stk__image_name; an encoded .stk). */
int stk__images_of(const stk__source *s);

#endif
