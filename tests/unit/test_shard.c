/* Dense range split and jump-hash placement. */
#include "ps_init.h"
#include "ps_shard.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void test_ranges_cover_and_balance(void **state)
{
    (void)state;
    const uint64_t sizes[] = {0, 1, 2, 7, 1000, 1000003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (uint32_t S = 1; S <= 9; S++) {
            uint64_t n = sizes[si], expect_lo = 0, min = UINT64_MAX, max = 0;
            for (uint32_t s = 0; s < S; s++) {
                uint64_t lo, hi;
                ps_shard_range(n, S, s, &lo, &hi);
                assert_true(lo == expect_lo); /* contiguous, in order */
                assert_true(hi >= lo);
                expect_lo = hi;
                min = hi - lo < min ? hi - lo : min;
                max = hi - lo > max ? hi - lo : max;
            }
            assert_true(expect_lo == n); /* covers everything */
            assert_true(max - min <= 1); /* balanced */
        }
    }
}

static void test_shard_of_index_inverts_range(void **state)
{
    (void)state;
    for (uint32_t S = 1; S <= 7; S++) {
        for (uint64_t n = 1; n <= 40; n++) {
            for (uint32_t s = 0; s < S; s++) {
                uint64_t lo, hi;
                ps_shard_range(n, S, s, &lo, &hi);
                for (uint64_t i = lo; i < hi; i++)
                    assert_int_equal(ps_shard_of_index(n, S, i), s);
            }
        }
    }
}

static void test_jump_hash(void **state)
{
    (void)state;
    /* Published reference values of jump consistent hash. */
    assert_int_equal(ps_jump_hash(0, 1), 0);
    assert_int_equal(ps_jump_hash(UINT64_C(0xffffffffffffffff), 1), 0);
    /* Adding a shard moves ~1/(S+1) of keys, and only to the new shard. */
    const uint32_t keys = 100000;
    for (uint32_t S = 1; S < 8; S++) {
        uint32_t moved = 0, counts[9] = {0};
        for (uint64_t k = 0; k < keys; k++) {
            uint32_t a = ps_shard_of_key(k, S), b = ps_shard_of_key(k, S + 1);
            assert_true(a < S);
            assert_true(b < S + 1);
            if (a != b) {
                assert_int_equal(b, S);
                moved++;
            }
            counts[b]++;
        }
        double frac = (double)moved / keys, want = 1.0 / (S + 1);
        assert_true(frac > want * 0.9 && frac < want * 1.1);
        for (uint32_t s = 0; s <= S; s++) /* balance within 10% */
            assert_true(counts[s] > keys / (S + 1) * 0.9 && counts[s] < keys / (S + 1) * 1.1);
    }
}

static void test_init_independent_of_sharding(void **state)
{
    (void)state;
    float whole[101], part[60];
    ps_init_fill(whole, 101, PS_INIT_NORMAL, 0.1f, 7, 0);
    ps_init_fill(part, 60, PS_INIT_NORMAL, 0.1f, 7, 41);
    for (int i = 0; i < 60; i++)
        assert_true(whole[41 + i] == part[i]);
    /* Different seeds differ; uniform stays within its scale. */
    assert_true(ps_init_value(PS_INIT_NORMAL, 0.1f, 8, 3) != whole[3]);
    double sum = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        float v = ps_init_value(PS_INIT_UNIFORM, 0.5f, 1, i);
        assert_true(v >= -0.5f && v <= 0.5f);
        sum += v;
    }
    assert_true(sum / 10000 > -0.02 && sum / 10000 < 0.02);
    assert_true(ps_init_value(PS_INIT_CONSTANT, 0.25f, 1, 9) == 0.25f);
    assert_true(ps_init_value(PS_INIT_ZEROS, 0.25f, 1, 9) == 0.0f);
}

/* ps_keys_below against a linear count, for every x around every key. */
static void test_keys_below(void **state)
{
    (void)state;
    const uint64_t k[] = {0, 1, 5, 6, 100, 101, UINT64_MAX - 1};
    const size_t n = sizeof k / sizeof k[0];
    assert_int_equal(ps_keys_below(k, 0, 5), 0);
    for (size_t m = 1; m <= n; m++)
        for (size_t i = 0; i < m; i++)
            for (int d = -1; d <= 1; d++) {
                uint64_t x = k[i] + (uint64_t)(int64_t)d;
                size_t want = 0;
                while (want < m && k[want] < x)
                    want++;
                assert_int_equal(ps_keys_below(k, m, x), want);
            }
    assert_int_equal(ps_keys_below(k, n, UINT64_MAX), n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_cover_and_balance),
        cmocka_unit_test(test_shard_of_index_inverts_range),
        cmocka_unit_test(test_jump_hash),
        cmocka_unit_test(test_init_independent_of_sharding),
        cmocka_unit_test(test_keys_below),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
