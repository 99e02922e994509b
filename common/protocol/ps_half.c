/* f16 / bf16 conversions on bit patterns. */
#include "ps_half.h"

#include "ps.pb-c.h"

#include <string.h>

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t ps_f32_to_f16(float f)
{
    uint32_t x = bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xffu) /* inf or NaN (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) /* overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero in f16 */
        if (e < -10)
            return sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent, up to infinity: correct */
    return (uint16_t)(sign | h);
}

float ps_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return float_of(sign);
        /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        return float_of(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    if (exp == 0x1fu)
        return float_of(sign | 0x7f800000u | (man << 13));
    return float_of(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

uint16_t ps_f32_to_bf16(float f)
{
    uint32_t x = bits_of(f);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + rounding) >> 16);
}

float ps_bf16_to_f32(uint16_t h)
{
    return float_of((uint32_t)h << 16);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define PS_HAVE_F16C_PATH 1

/* F16C converts 8 values per instruction with the same rounding (to
 * nearest even); chosen at run time, so builds assume no CPU feature. */
__attribute__((target("avx,f16c"))) static size_t f16c_encode(const float *src, unsigned char *d,
                                                              size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(d + 2 * i), h);
    }
    return i;
}

__attribute__((target("avx,f16c"))) static size_t f16c_decode(const unsigned char *s, float *dst,
                                                              size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + 2 * i))));
    return i;
}

/* F16C: CPUID.1:ECX bit 29 (asked directly: clang 14 has no "f16c" name
 * for __builtin_cpu_supports); AVX through the builtin, which also checks
 * that the OS saves the wide registers. */
static int have_f16c(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

void ps_f32_to_half_n(int dtype, const float *src, void *dst, size_t n)
{
    unsigned char *d = dst;
    size_t i = 0;
#ifdef PS_HAVE_F16C_PATH
    if (dtype == PS__DTYPE__DTYPE_F16 && have_f16c())
        i = f16c_encode(src, d, n);
#endif
    for (; i < n; i++) {
        uint16_t h =
            dtype == PS__DTYPE__DTYPE_BF16 ? ps_f32_to_bf16(src[i]) : ps_f32_to_f16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

void ps_half_to_f32_n(int dtype, const void *src, float *dst, size_t n)
{
    const unsigned char *s = src;
    size_t i = 0;
#ifdef PS_HAVE_F16C_PATH
    if (dtype == PS__DTYPE__DTYPE_F16 && have_f16c())
        i = f16c_decode(s, dst, n);
#endif
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = dtype == PS__DTYPE__DTYPE_BF16 ? ps_bf16_to_f32(h) : ps_f16_to_f32(h);
    }
}
