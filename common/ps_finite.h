/* Finding a non-finite float (NaN or an infinity) in an array: psd checks
 * every gradient it is pushed, psworker its own before it pushes.
 *
 * Not a kernel: it runs on the CPU, beside the network. */
#ifndef PS_FINITE_H
#define PS_FINITE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PS_F32_EXP_BITS 0x7f800000u

/* Whether x[0..n) holds a NaN or an infinity: x * 0 is 0 for a finite x
 * and NaN otherwise, summed in 16 independent lanes (a loop compilers turn
 * into vector instructions without reordering a sum). Needs IEEE floats:
 * never build this with -ffast-math. */
static inline int ps_any_nonfinite(const float *x, size_t n)
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

/* The index of the first NaN or infinity in x[0..n), or n when none:
 * blocks are checked as above, and only a bad one is searched. */
static inline size_t ps_first_nonfinite(const float *x, size_t n)
{
    enum { BLOCK = 4096 };
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK;
        if (!ps_any_nonfinite(x + i, m))
            continue;
        for (size_t j = 0; j < m; j++) {
            uint32_t b;
            memcpy(&b, x + i + j, sizeof b);
            if ((b & PS_F32_EXP_BITS) == PS_F32_EXP_BITS)
                return i + j;
        }
    }
    return n;
}

#endif
