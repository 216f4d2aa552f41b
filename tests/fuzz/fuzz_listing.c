/* fuzz_listing.c -- libFuzzer target for the parser of the bucket listings
 * kept in the cache directory (DIR/stoker-listing/H.stklist,
 * src/source/listcache.c): a file damaged on disk, cut short or written by
 * something else must be refused with a reason, never read outside it. Every
 * input is parsed twice: as it is, and with its XXH3 trailer recomputed, so
 * mutations reach the bounds and entry checks behind the checksum. The
 * prefix id it must name is taken from the input itself (its id field), so
 * mutations of the entries are not all stopped by the id check. Built by
 * scripts/test-fuzz.sh; linked with replay_main.c it replays the corpus as
 * a regular test. */
#include "io/remote.h"
#include "source/source.h"
#include "source/stkformat.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse(const uint8_t *p, size_t n, const char *id)
{
    char **names = NULL, why[STK_ERRMSG_MAX];
    uint64_t *sizes = NULL, at = 0;
    size_t count = 0;
    int rc = stk__listing_parse(p, n, id, &at, &names, &sizes, &count, why, sizeof why);
    if (rc != STK_OK && rc != STK_EFORMAT && rc != STK_ENOMEM)
        abort();
    if (rc == STK_EFORMAT && !why[0])
        abort(); /* a refusal always says why */
    if (rc != STK_OK)
        return;
    size_t bytes = 0;
    for (size_t k = 0; k < count; k++) {
        size_t nl = strlen(names[k]);
        if (!nl || nl > 4096)
            abort();
        bytes += 12 + nl;
    }
    if (bytes > n) /* every entry came from inside the input */
        abort();
    stk__remote_list_free(names, sizes, count);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char id[4097] = "";
    if (size >= 28) {
        uint32_t il = (uint32_t)data[24] | (uint32_t)data[25] << 8 | (uint32_t)data[26] << 16 |
                      (uint32_t)data[27] << 24;
        if (il < sizeof id && il <= size - 28) {
            memcpy(id, data + 28, il);
            id[il] = '\0';
        }
    }
    parse(data, size, id);
    if (size < 8)
        return 0;
    uint8_t *copy = malloc(size);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    uint64_t sum = stk__xxh3(copy, size - 8);
    for (int k = 0; k < 8; k++)
        copy[size - 8 + (size_t)k] = (uint8_t)(sum >> (8 * k));
    parse(copy, size, id);
    free(copy);
    return 0;
}
