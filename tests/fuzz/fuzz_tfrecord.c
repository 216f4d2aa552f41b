/* fuzz_tfrecord.c -- libFuzzer target for the TFRecord reader's parsing of
 * untrusted bytes (src/source/tfrecord.c): the record framing (lengths and
 * their masked CRC32C, the data CRCs), the strict protobuf reader of
 * tf.train.Example (varints, length-delimited and fixed32 fields, packed
 * and unpacked lists), the feature scan and the splitting of every record
 * into its fields (data CRCs are checked but do not stop the parse, so
 * mutated Examples reach it). The input is the bytes of one TFRecord file. The parser
 * checks that every field it gives lies inside its record (STK_EINVAL
 * otherwise, which fails the run). Linked with replay_main.c it replays
 * corpus files given as arguments. */
#include "source/source.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t samples = 0;
    char err[STK_ERRMSG_MAX];
    int rc = stk__tfrecord_parse_buffer(data, size, &samples, err, sizeof err);
    if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_EUNSUPPORTED && rc != STK_ENOMEM)
        abort();
    /* Each record takes at least its 16 framing bytes; a cut one at the end
     * counts too. */
    if (samples > size / 16 + 1)
        abort();
    return 0;
}
