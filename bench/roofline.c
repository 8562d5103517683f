/* bench/roofline.c: llmgw-roofline — this machine's roofline (kernels/roofline.h) as a markdown
 * table: the CPU model and SIMD flags, then per thread count the f32 FMA peak, the BF16 dot
 * peak (AVX512_BF16 only) and the streaming read bandwidth. The benchmarks print it first, so
 * that their figures read as fractions of what the machine can do.
 *
 *   llmgw-roofline [-t 1,2]     (default: 1 and every online CPU) */
#include "kernels/roofline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int threads[8], n = 0;
    if (argc == 3 && strcmp(argv[1], "-t") == 0) {
        for (char *s = argv[2]; *s != '\0' && n < 8;) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s || v < 1 || v > 256)
                break;
            threads[n++] = (int)v;
            s = *end == ',' ? end + 1 : end;
            if (*end != ',' && *end != '\0')
                n = 0;
        }
        if (n == 0) {
            fprintf(stderr, "llmgw-roofline: -t wants thread counts like 1,2\n");
            return 2;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: llmgw-roofline [-t 1,2]\n");
        return 2;
    } else {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads[n++] = 1;
        if (cpus > 1)
            threads[n++] = (int)cpus;
    }
    kern_roofline r[8];
    int got = 0;
    for (int i = 0; i < n; i++)
        if (kern_roofline_measure(&r[got], threads[i]) == 0)
            got++;
    if (got == 0) {
        fprintf(stderr, "llmgw-roofline: could not measure (threads or 512 MiB of memory)\n");
        return 1;
    }
    kern_roofline_print(stdout, r, got);
    return 0;
}
