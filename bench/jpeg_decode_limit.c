/* jpeg_decode_limit.c -- the decode limit: single-core libjpeg-turbo full
 * decodes per second (islow IDCT, fancy upsampling, RGB output, as PIL), on
 * files already in memory. Built and run by bench/bench_images.py.
 * usage: jpeg_decode_limit FILE... */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#include <jpeglib.h>
#include <time.h>

struct err {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
};

static void on_error(j_common_ptr c)
{
    longjmp(((struct err *)c->err)->jb, 1);
}

int main(int argc, char **argv)
{
    size_t n = (size_t)argc - 1, *len = calloc(n, sizeof *len);
    unsigned char **data = calloc(n, sizeof *data);
    for (size_t i = 0; i < n; i++) {
        FILE *f = fopen(argv[i + 1], "rb");
        if (!f)
            return 1;
        fseek(f, 0, SEEK_END);
        len[i] = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        data[i] = malloc(len[i]);
        if (fread(data[i], 1, len[i], f) != len[i])
            return 1;
        fclose(f);
    }
    unsigned char *row = malloc(3 * 65536);
    struct timespec t0, t1;
    long decoded = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int rep = 0; rep < 2; rep++) {
        for (size_t i = 0; i < n; i++) {
            struct jpeg_decompress_struct c;
            struct err e;
            c.err = jpeg_std_error(&e.mgr);
            e.mgr.error_exit = on_error;
            if (setjmp(e.jb)) {
                jpeg_destroy_decompress(&c);
                continue;
            }
            jpeg_create_decompress(&c);
            jpeg_mem_src(&c, data[i], (unsigned long)len[i]);
            jpeg_read_header(&c, TRUE);
            c.out_color_space = JCS_RGB;
            c.dct_method = JDCT_ISLOW;
            jpeg_start_decompress(&c);
            while (c.output_scanline < c.output_height) {
                JSAMPROW r = row;
                jpeg_read_scanlines(&c, &r, 1);
            }
            jpeg_finish_decompress(&c);
            jpeg_destroy_decompress(&c);
            decoded++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("%.1f\n", (double)decoded / s);
    return 0;
}
