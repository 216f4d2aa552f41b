/*
 * jpeg_encode.c -- the JPEG encoder (stk__jpeg_encode in codec.h), through
 * libjpeg-turbo beside the decoder in jpeg.c. Packing re-encodes resized
 * images with it; the output bytes depend only on the pixels and the quality
 * (libjpeg's defaults otherwise), which is what keeps packs reproducible.
 *
 * libjpeg reports a fatal error through error_exit: ours records the message
 * and longjmps back here. The compressed stream goes to a buffer libjpeg
 * grows itself (jpeg_mem_dest, with malloc: it has no allocator hooks); its
 * address is kept in the error manager, whose address libjpeg holds, so it
 * is still known after a longjmp and is freed on every path.
 */
#include "codec/codec.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct enc_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    unsigned char *mem;
    unsigned long memlen;
} enc_err;

static void enc_error_exit(j_common_ptr c)
{
    enc_err *e = (enc_err *)(void *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

int stk__jpeg_encode(const uint8_t *px, uint32_t w, uint32_t h, uint32_t c, unsigned quality,
                     uint8_t **out, size_t *len, char *err, size_t errlen)
{
    struct jpeg_compress_struct cinfo;
    enc_err je;
    volatile int rc = STK_OK;
    *out = NULL;
    *len = 0;
    memset(&cinfo, 0, sizeof cinfo);
    je.mem = NULL;
    je.memlen = 0;
    cinfo.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = enc_error_exit;
    if (setjmp(je.jb)) {
        stk__fmt(err, errlen, "JPEG encode: %s", je.msg);
        rc = STK_EFORMAT;
        goto out;
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, &je.mem, &je.memlen);
    cinfo.image_width = w;
    cinfo.image_height = h;
    cinfo.input_components = (int)c;
    cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, (int)quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < h) {
        /* libjpeg's row pointer is not const, but it only reads the rows. */
        JSAMPROW rp = (JSAMPROW)(uintptr_t)(px + (size_t)cinfo.next_scanline * w * c);
        jpeg_write_scanlines(&cinfo, &rp, 1);
    }
    jpeg_finish_compress(&cinfo);
    if (!(*out = stk__malloc(je.memlen ? je.memlen : 1))) {
        stk__fmt(err, errlen, "out of memory for a %lu-byte JPEG", je.memlen);
        rc = STK_ENOMEM;
        goto out;
    }
    memcpy(*out, je.mem, je.memlen);
    *len = je.memlen;
out:
    jpeg_destroy_compress(&cinfo);
    free(je.mem); /* libjpeg allocated it */
    return rc;
}
