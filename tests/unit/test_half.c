/* f16 / bf16 conversions: exact values, rounding ties to even, subnormals,
 * overflow, infinities, NaN, and an exhaustive f16 round trip. */
#include "ps_half.h"

#include "ps.pb-c.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void test_f16_values(void **state)
{
    (void)state;
    assert_int_equal(ps_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(ps_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(ps_f32_to_f16(65504.0f), 0x7bff); /* largest finite */
    assert_int_equal(ps_f32_to_f16(65520.0f), 0x7c00); /* rounds up to infinity */
    assert_int_equal(ps_f32_to_f16(1e9f), 0x7c00);
    assert_int_equal(ps_f32_to_f16(-INFINITY), 0xfc00);
    assert_true((ps_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (ps_f32_to_f16(NAN) & 0x3ff));
    assert_int_equal(ps_f32_to_f16(5.960464477539063e-08f), 0x0001); /* smallest subnormal */
    assert_int_equal(ps_f32_to_f16(2.9e-08f), 0x0000);               /* under half of it */
    assert_int_equal(ps_f32_to_f16(-0.0f), 0x8000);
    /* ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 */
    assert_int_equal(ps_f32_to_f16(1.0f + 0.00048828125f), 0x3c00);
    assert_int_equal(ps_f32_to_f16(1.0f + 3 * 0.00048828125f), 0x3c02);
    assert_true(ps_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(isnan(ps_f16_to_f32(0x7e00)));
    assert_true(isinf(ps_f16_to_f32(0x7c00)));
}

static void test_f16_exhaustive_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = ps_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        if (ps_f32_to_f16(f) != h)
            fail_msg("f16 0x%04x -> %g -> 0x%04x", h, (double)f, ps_f32_to_f16(f));
    }
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(ps_f32_to_bf16(1.0f), 0x3f80);
    assert_true(ps_bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(ps_f32_to_bf16(1.00390625f), 0x3f80); /* tie: stays even */
    assert_int_equal(ps_f32_to_bf16(1.01171875f), 0x3f82); /* tie: rounds to even */
    assert_true(isnan(ps_bf16_to_f32(ps_f32_to_bf16(NAN))));
    float v[5] = {0.5f, -3.25f, 1e-3f, 100.0f, -0.0f}, back[5];
    unsigned char buf[11];
    ps_f32_to_half_n(PS__DTYPE__DTYPE_BF16, v, buf + 1, 5); /* unaligned on purpose */
    ps_half_to_f32_n(PS__DTYPE__DTYPE_BF16, buf + 1, back, 5);
    for (int i = 0; i < 5; i++)
        assert_float_equal(back[i], v[i], fabsf(v[i]) / 128.0f);
}

/* The bulk path (F16C where the CPU has it) agrees bit for bit with the
 * scalar reference, on random values of every magnitude and on tails. */
static void test_bulk_matches_scalar(void **state)
{
    (void)state;
    enum { N = 100003 };
    static float v[N], back[N];
    static unsigned char h[2 * N + 1];
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t bits = x & 0xbfffffffu; /* random sign, exponent, mantissa; no NaN/Inf */
        memcpy(&v[i], &bits, 4);
    }
    ps_f32_to_half_n(PS__DTYPE__DTYPE_F16, v, h + 1, N);
    for (int i = 0; i < N; i++) {
        uint16_t got;
        memcpy(&got, h + 1 + 2 * i, 2);
        if (got != ps_f32_to_f16(v[i]))
            fail_msg("encode %d: %g -> 0x%04x, scalar 0x%04x", i, (double)v[i], got,
                     ps_f32_to_f16(v[i]));
    }
    ps_half_to_f32_n(PS__DTYPE__DTYPE_F16, h + 1, back, N);
    for (int i = 0; i < N; i++) {
        uint16_t hv;
        memcpy(&hv, h + 1 + 2 * i, 2);
        float want = ps_f16_to_f32(hv);
        assert_memory_equal(&back[i], &want, 4);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_values),
        cmocka_unit_test(test_f16_exhaustive_round_trip),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_bulk_matches_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
