/* Finding a non-finite float (ps_finite.h).
 *
 * x * 0 is 0 for a finite x and NaN otherwise; summed in 16 independent
 * lanes (a loop compilers turn into vector instructions without
 * reordering a sum) a block is non-finite when its sum is. Only a bad
 * block is searched again for the index. IEEE floats are needed: never
 * build this with -ffast-math. */
#include "ps_finite.h"

#include <stdint.h>
#include <string.h>

#define F32_EXP_BITS 0x7f800000u

static inline int any_nonfinite(const float *x, size_t n)
{
    enum { LANES = 16 };
    float acc[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (size_t j = 0; j < LANES; j++)
            acc[j] += x[i + j] * 0.0f;
    for (; i < n; i++)
        acc[0] += x[i] * 0.0f;
    float all = 0.0f;
    for (size_t j = 0; j < LANES; j++)
        all += acc[j];
    return all != all;
}

static inline size_t first_nonfinite(const float *x, size_t n)
{
    enum { BLOCK = 4096 };
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK;
        if (!any_nonfinite(x + i, m))
            continue;
        for (size_t j = 0; j < m; j++) {
            uint32_t b;
            memcpy(&b, x + i + j, sizeof b);
            if ((b & F32_EXP_BITS) == F32_EXP_BITS)
                return i + j;
        }
    }
    return n;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* AVX2 where the CPU has it (twice the lanes of the baseline's SSE2), as
 * the optimizer's apply does (kernels/psk_optim.c, which says why this is
 * a plain check rather than target_clones). */
__attribute__((target("avx2"))) static size_t first_nonfinite_avx2(const float *x, size_t n)
{
    return first_nonfinite(x, n);
}
#define PS_FINITE_AVX2 1
#endif

size_t ps_first_nonfinite(const float *x, size_t n)
{
#ifdef PS_FINITE_AVX2
    if (__builtin_cpu_supports("avx2"))
        return first_nonfinite_avx2(x, n);
#endif
    return first_nonfinite(x, n);
}
