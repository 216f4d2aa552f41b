/* replay_main.c -- the main() of a fuzz target built as a regular test: feeds
 * every file named on the command line to LLVMFuzzerTestOneInput, so the
 * corpus replays under ASan+UBSan without libFuzzer (scripts/test-fuzz.sh). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    int failed = 0;
    for (int k = 1; k < argc; k++) {
        FILE *f = fopen(argv[k], "rb");
        if (!f) {
            fprintf(stderr, "%s: cannot open\n", argv[k]);
            failed = 1;
            continue;
        }
        uint8_t *b = NULL;
        size_t n = 0, cap = 0, r;
        do {
            if (n == cap) {
                cap = cap ? cap * 2 : 65536;
                uint8_t *nb = realloc(b, cap);
                if (!nb) {
                    fprintf(stderr, "%s: out of memory\n", argv[k]);
                    exit(1);
                }
                b = nb;
            }
            r = fread(b + n, 1, cap - n, f);
            n += r;
        } while (r > 0);
        fclose(f);
        LLVMFuzzerTestOneInput(b, n);
        free(b);
    }
    return failed;
}
