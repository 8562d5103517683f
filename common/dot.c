/* common/dot.c: see dot.h. An AVX2 version (sign-extend 16 bytes to 16-bit lanes, multiply-add
 * pairs to 32-bit) where the CPU has it, chosen once; a scalar one otherwise. */
#include "common/dot.h"

#include <immintrin.h>

static int32_t dot_scalar(const int8_t *a, const int8_t *b, int n)
{
    int32_t s = 0;
    for (int i = 0; i < n; i++)
        s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

__attribute__((target("avx2")))
static int32_t dot_avx2(const int8_t *a, const int8_t *b, int n)
{
    __m256i acc = _mm256_setzero_si256();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(a + i)));
        __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + i)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    int32_t total = _mm_cvtsi128_si32(s);
    for (; i < n; i++)
        total += (int32_t)a[i] * (int32_t)b[i];
    return total;
}

int32_t util_dot_i8(const int8_t *a, const int8_t *b, int n)
{
    static int32_t (*impl)(const int8_t *, const int8_t *, int);
    int32_t (*f)(const int8_t *, const int8_t *, int) = __atomic_load_n(&impl, __ATOMIC_RELAXED);
    if (f == NULL) {
        __builtin_cpu_init();
        f = __builtin_cpu_supports("avx2") ? dot_avx2 : dot_scalar;
        __atomic_store_n(&impl, f, __ATOMIC_RELAXED);
    }
    return f(a, b, n);
}
