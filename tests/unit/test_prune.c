/* Pruning: the cubic schedule, when masks are due, spec parsing at its
 * boundaries, magnitude selection (exact counts, ties, once pruned always
 * pruned, optimizer state zeroed). */
#include "prune.h"

#include "ps_err.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void test_schedule(void **state)
{
    (void)state;
    struct psd_prune_spec p = {"t", 0.8, 100, 300, 50};
    assert_true(psd_prune_sparsity_at(&p, 0) == 0.0);
    assert_true(psd_prune_sparsity_at(&p, 100) == 0.0);
    /* halfway: 0.8 (1 - 0.5^3) = 0.7 */
    assert_float_equal(psd_prune_sparsity_at(&p, 200), 0.7, 1e-12);
    assert_true(psd_prune_sparsity_at(&p, 300) == 0.8);
    assert_true(psd_prune_sparsity_at(&p, 10000) == 0.8);
    double prev = 0; /* rises monotonically, fastest early */
    for (uint64_t t = 100; t <= 300; t++) {
        double s = psd_prune_sparsity_at(&p, t);
        assert_true(s >= prev);
        prev = s;
    }
    assert_false(psd_prune_due(&p, 99));
    assert_true(psd_prune_due(&p, 100));
    assert_false(psd_prune_due(&p, 149));
    assert_true(psd_prune_due(&p, 250));
    assert_true(psd_prune_due(&p, 300));
    assert_false(psd_prune_due(&p, 350));
}

static void test_parse(void **state)
{
    (void)state;
    struct psd_prune_spec p;
    char err[256];
    assert_int_equal(psd_prune_parse("fc1.weight:0.9", &p, err, sizeof err), 0);
    assert_string_equal(p.table, "fc1.weight");
    assert_true(p.target == 0.9 && p.start == 200 && p.end == 2000 && p.every == 100);
    assert_int_equal(psd_prune_parse("w:0.5:0:10:1", &p, err, sizeof err), 0);
    assert_true(p.start == 0 && p.end == 10 && p.every == 1);
    assert_int_equal(psd_prune_parse("w:0.9999", &p, err, sizeof err), 0); /* at the limit */
    const char *bad[] = {"w",          ":0.9",          "w:1",
                         "w:-0.1",     "w:0.5:10:10:1", "w:0.5:0:10:0",
                         "w:0.5:0:10", "w:x",           "w:0.5:a:10:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (psd_prune_parse(bad[i], &p, err, sizeof err) != PS_EINVAL)
            fail_msg("'%s' was accepted", bad[i]);
        assert_non_null(strstr(err, "--prune"));
    }
}

static void test_mask(void **state)
{
    (void)state;
    enum { N = 10 };
    float w[N] = {0.5f, -0.1f, 0.3f, 0.2f, -0.2f, 0.9f, -0.05f, 0.7f, 0.2f, -0.8f};
    float s1[N], scratch[N];
    uint8_t mask[N] = {0};
    for (int i = 0; i < N; i++)
        s1[i] = 1.0f;
    /* 30%: the three smallest magnitudes (0.05, 0.1, then one of the 0.2s) */
    assert_int_equal(psd_prune_apply_mask(w, s1, NULL, mask, N, 0.3, scratch), 3);
    assert_true(mask[6] && mask[1]);
    assert_int_equal(mask[3] + mask[4] + mask[8], 1); /* exactly one tie taken */
    for (int i = 0; i < N; i++)
        assert_true(mask[i] ? w[i] == 0.0f && s1[i] == 0.0f : w[i] != 0.0f);
    /* a pruned weight stays pruned, even if an update made it large */
    w[6] = 5.0f;
    psd_prune_enforce(w, s1, NULL, mask, N);
    assert_true(w[6] == 0.0f);
    /* 55% rounds up to 6: a target is a minimum */
    assert_int_equal(psd_prune_apply_mask(w, s1, NULL, mask, N, 0.55, scratch), 6);
    int zeros = 0;
    for (int i = 0; i < N; i++)
        zeros += w[i] == 0.0f;
    assert_int_equal(zeros, 6);
    assert_true(mask[6] && mask[1]); /* the earlier ones are still in */
    assert_int_equal(psd_prune_apply_mask(w, s1, NULL, mask, N, 0.0, scratch), 6); /* still 6 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
