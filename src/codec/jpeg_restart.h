/*
 * jpeg_restart.h -- restart-indexed JPEG: random access into a JPEG's
 * entropy-coded data, so a crop decodes only the MCUs it needs.
 *
 * A JPEG's entropy-coded data has no random access: to decode a row every row
 * above it must be Huffman-decoded. Restart markers (RSTn) reset the DC
 * prediction and byte-align the stream, so each restart segment decodes on
 * its own. stk__rst_transcode rewrites a JPEG losslessly (the DCT
 * coefficients are copied, as `jpegtran -restart` does; a progressive file
 * becomes baseline) with a restart marker every k MCUs, k dividing the MCUs
 * of a row so segments never straddle two rows, and records where each
 * segment starts in an APP15 marker of the file itself ("STKRST"):
 *
 *   "STKRST\0" | version (1 byte, 1) | k (u32 LE) | nseg (u32 LE) |
 *   offset[nseg + 1] (u32 LE)
 *
 * offset[s] is where segment s's entropy bytes start in the file (after the
 * SOS header for s = 0, after the RSTn marker ending segment s - 1 for the
 * others) and offset[nseg] is where the EOI marker is. The payload stays an
 * ordinary JPEG that any decoder reads whole; the marker costs 4 bytes a
 * segment.
 *
 * stk__rst_sub then assembles a small valid JPEG of MCU rows [r0, r1) and
 * MCU columns [c0, c1) (columns on segment boundaries): the header with the
 * sub-image's size, the segments it needs, renumbered RST markers and EOI.
 * Decoded with a margin of one MCU around the region a crop needs, its pixels
 * in that region are those of the whole file (tests/c/test_restart.c).
 */
#ifndef STK_JPEG_RESTART_H
#define STK_JPEG_RESTART_H

#include "internal.h"

/* A parsed, checked index. offs points into the file it was found in. */
typedef struct stk__rst {
    uint32_t k;              /* MCUs per restart segment (divides mcus_w) */
    uint32_t nseg;           /* segments: mcus_w * mcus_h / k */
    uint32_t mcus_w, mcus_h; /* MCUs per row, MCU rows */
    uint32_t mcu_w, mcu_h;   /* an MCU's size in pixels */
    uint32_t width, height;  /* the image's */
    const uint8_t *offs;     /* nseg + 1 u32 LE offsets */
} stk__rst;

/* Segment s's first byte (s <= nseg). */
static inline uint32_t stk__rst_off(const stk__rst *x, uint32_t s)
{
    const uint8_t *p = x->offs + 4 * (size_t)s;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Rewrites the JPEG in[0..n) with restart markers and the index. On STK_OK
 * *out (stk__malloc'd; the caller frees it) holds the new file, *out_len its
 * length, and *k the restart interval chosen. A file that cannot be rewritten
 * (not baseline/progressive Huffman 8-bit, more than 4 components, an index
 * that would not fit in one marker) is STK_EUNSUPPORTED with the reason;
 * a corrupt one STK_EFORMAT. The pixels it decodes to are those of in. */
int stk__rst_transcode(const uint8_t *in, size_t n, uint8_t **out, size_t *out_len, uint32_t *k,
                       char *err, size_t errlen);

/* Looks for the index in the JPEG b[0..n) and checks it against the file's
 * header (size, sampling, restart interval, offsets in order and inside the
 * file) and its premise: a sequential Huffman frame (SOF0/SOF1) whose first
 * scan holds every component over the whole spectrum, so that scan is the
 * file's only one (a progressive or multi-scan file with an index is a
 * lie: sub-images of its first scan decode to other pixels without an
 * error). 1: found and consistent (*x filled); 0: no index; STK_EFORMAT: an
 * index that does not match the file, with the reason in err. The RST
 * markers at the offsets are checked by stk__rst_sub for the segments it
 * uses, and all of them by stk__rst_verify. */
int stk__rst_find(const uint8_t *b, size_t n, stk__rst *x, char *err, size_t errlen);

/* Checks every offset of x against the file: a RSTn marker with the right
 * number before each segment, EOI at the end. STK_OK or STK_EFORMAT. */
int stk__rst_verify(const uint8_t *b, size_t n, const stk__rst *x, char *err, size_t errlen);

/* Writes the JPEG of MCU rows [r0, r1) and columns [c0, c1) of b into
 * out[0..cap) (cap >= n always suffices). c0 and c1 must be multiples of
 * x->k, or c1 = mcus_w. STK_OK with *out_len; STK_EINVAL for a bad range;
 * STK_EFORMAT when a segment's marker is not where the index says. */
int stk__rst_sub(const uint8_t *b, size_t n, const stk__rst *x, uint32_t r0, uint32_t r1,
                 uint32_t c0, uint32_t c1, uint8_t *out, size_t cap, size_t *out_len, char *err,
                 size_t errlen);

#endif
