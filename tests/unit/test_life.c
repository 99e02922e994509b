/* A sparse table's life cycle, on the table itself: admission by a
 * count-min sketch, eviction of the least recently pushed row at the
 * budget, eviction by age in slices, refusal when nothing may go, and the
 * same decisions from the same pushes (what a backup replaying them
 * relies on). */
#include "table.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_limits.h"
#include "ps_shard.h"
#include "ps_wire.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define DIM 4

/* A sparse table's spec: rows of DIM floats, SGD at lr. */
static Ps__TableSpec sparse_spec(const char *name, uint64_t rows_max, float lr)
{
    Ps__TableSpec spec = PS__TABLE_SPEC__INIT;
    spec.name = (char *)name;
    spec.sparse = 1;
    spec.dim = DIM;
    spec.rows_max = rows_max;
    spec.lr = lr;
    return spec;
}

static struct psd_table *make(uint64_t rows_max, uint32_t admit_after, uint64_t evict_after,
                              int at_budget)
{
    Ps__TableSpec spec = sparse_spec("e", rows_max, 0.5f);
    spec.init = PS__INIT_KIND__INIT_UNIFORM;
    spec.init_scale = 0.1f;
    spec.seed = 3;
    spec.admit_after = admit_after;
    spec.admit_counters = admit_after > 1 ? 4096 : 0;
    spec.evict_after = evict_after;
    spec.evict_at_budget = at_budget;
    char err[256];
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), 0);
    struct psd_table *t = NULL;
    assert_int_equal(psd_table_create(&spec, 0, 0, 1, &t), 0);
    return t;
}

static int push(struct psd_table *t, const uint64_t *keys, size_t n)
{
    float g[64 * DIM];
    for (size_t i = 0; i < n * DIM; i++)
        g[i] = 1.0f;
    char err[256];
    return psd_table_push_rows(t, keys, g, n, err, sizeof err);
}

static int push1(struct psd_table *t, uint64_t key)
{
    return push(t, &key, 1);
}

static int has(struct psd_table *t, uint64_t key)
{
    return psd_sparse_row(&t->sp, key, 0) >= 0;
}

/* The row of key as a pull gives it. */
static void pull1(struct psd_table *t, uint64_t key, float *out)
{
    char err[256];
    assert_int_equal(psd_table_pull_rows(t, &key, 1, out, err, sizeof err), 0);
}

static void test_admission_counts_then_admits(void **state)
{
    (void)state;
    struct psd_table *t = make(100, 3, 0, 0);
    float init[DIM], w[DIM];
    ps_init_fill(init, DIM, PS_INIT_UNIFORM, 0.1f, 3 ^ ps_mix64(42), 0);
    pull1(t, 42, w); /* no row: the initial value, and a pull makes none */
    assert_memory_equal(w, init, sizeof w);
    assert_false(has(t, 42));
    assert_int_equal(push1(t, 42), 0);
    assert_int_equal(push1(t, 42), 0);
    assert_false(has(t, 42)); /* counted twice, not applied */
    assert_int_equal(t->sp.held_back, 2);
    pull1(t, 42, w);
    assert_memory_equal(w, init, sizeof w);
    assert_int_equal(push1(t, 42), 0); /* the third push makes the row and is applied */
    assert_true(has(t, 42));
    pull1(t, 42, w);
    for (int j = 0; j < DIM; j++)
        assert_true(w[j] == init[j] - 0.5f); /* one step of lr 0.5, gradient 1 */
    assert_int_equal(t->sp.admitted, 1);
    psd_table_destroy(t);
}

static void test_budget_evicts_the_least_recently_pushed(void **state)
{
    (void)state;
    struct psd_table *t = make(4, 0, 0, 1);
    for (uint64_t k = 1; k <= 4; k++)
        assert_int_equal(push1(t, k), 0); /* ticks 1..4 */
    assert_int_equal(push1(t, 1), 0);     /* 1 at tick 5: 2 is now the oldest */
    assert_int_equal(push1(t, 5), 0);     /* at the budget: 2 goes */
    assert_int_equal(t->sp.nrows, 4);
    assert_false(has(t, 2));
    assert_true(has(t, 1) && has(t, 3) && has(t, 4) && has(t, 5));
    assert_int_equal(t->sp.evicted_budget, 1);
    /* an evicted id starts again from its initial value */
    float init[DIM], w[DIM];
    ps_init_fill(init, DIM, PS_INIT_UNIFORM, 0.1f, 3 ^ ps_mix64(2), 0);
    pull1(t, 2, w);
    assert_memory_equal(w, init, sizeof w);
    psd_table_destroy(t);
}

static void test_a_push_never_evicts_its_own_rows(void **state)
{
    (void)state;
    struct psd_table *t = make(4, 0, 0, 1);
    const uint64_t six[6] = {10, 11, 12, 13, 14, 15};
    char err[256];
    float g[6 * DIM] = {0};
    int rc = psd_table_push_rows(t, six, g, 6, err, sizeof err);
    assert_int_equal(rc, PS_ELIMIT); /* four made; the fifth finds only this push's rows */
    assert_non_null(strstr(err, "key 14"));
    assert_int_equal(t->sp.nrows, 4);
    assert_int_equal(t->sp.refused, 1);
    for (uint64_t k = 10; k <= 13; k++)
        assert_true(has(t, k));
    /* the next push may evict them */
    assert_int_equal(push1(t, 14), 0);
    assert_int_equal(t->sp.nrows, 4);
    assert_true(has(t, 14));
    psd_table_destroy(t);
}

static void test_without_eviction_the_budget_refuses(void **state)
{
    (void)state;
    struct psd_table *t = make(2, 2, 0, 0);
    assert_int_equal(push1(t, 1), 0);
    assert_int_equal(push1(t, 1), 0);
    assert_int_equal(push1(t, 2), 0);
    assert_int_equal(push1(t, 2), 0);
    assert_int_equal(t->sp.nrows, 2);
    assert_int_equal(push1(t, 3), 0);         /* counted: no row needed yet */
    assert_int_equal(push1(t, 3), PS_ELIMIT); /* admitted, no room */
    assert_int_equal(t->sp.refused, 1);
    psd_table_destroy(t);
}

static void test_age_evicts_in_slices(void **state)
{
    (void)state;
    struct psd_table *t = make(1000, 0, 3, 0);
    assert_int_equal(push1(t, 7), 0); /* tick 1 */
    for (int i = 0; i < 3; i++)
        assert_int_equal(push1(t, 8), 0); /* ticks 2..4: 7 is 3 old, kept */
    assert_true(has(t, 7));
    assert_int_equal(push1(t, 8), 0); /* tick 5: 4 old, evicted in this push's slice */
    assert_false(has(t, 7));
    assert_true(has(t, 8));
    assert_int_equal(t->sp.evicted_age, 1);
    /* a slice looks at PSD_AGE_SLICE rows: a large table ages out over
     * several pushes, never more than a slice at a time */
    struct psd_table *u = make(10000, 0, 1, 0);
    uint64_t keys[64];
    for (uint64_t b = 0; b < 1000; b += 64) {
        size_t n = 0;
        for (uint64_t k = b; k < b + 64 && k < 1000; k++)
            keys[n++] = 100 + k;
        assert_int_equal(push(u, keys, n), 0);
    }
    uint64_t before = u->sp.nrows;
    assert_int_equal(push1(u, 5), 0);
    assert_true(before - u->sp.nrows <= PSD_AGE_SLICE);
    for (int i = 0; i < 40 && u->sp.nrows > 1; i++)
        assert_int_equal(push1(u, 5), 0);
    assert_int_equal(u->sp.nrows, 1); /* all but the row still pushed */
    psd_table_destroy(u);
    psd_table_destroy(t);
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s >> 33;
}

/* Decayed frequency: the budget evicts the row of least push count,
 * halved every half-life, where the least recently pushed would be a
 * row pushed often before; the count decays along its halvings, and a
 * moved row keeps its own. */
static void test_budget_by_decayed_frequency(void **state)
{
    (void)state;
    assert_int_equal(psd_sparse_decayed(256, 0, 10), 256);
    assert_int_equal(psd_sparse_decayed(256, 10, 10), 128);
    assert_int_equal(psd_sparse_decayed(256, 5, 10), 192); /* between: on the line */
    assert_int_equal(psd_sparse_decayed(256, 25, 10), 48);
    assert_int_equal(psd_sparse_decayed(UINT32_MAX, 320, 10), 0);
    /* the largest count just short of the largest half-life: no overflow */
    assert_int_equal(
        psd_sparse_decayed(UINT32_MAX, PS_EVICT_HALF_LIFE_MAX - 1, PS_EVICT_HALF_LIFE_MAX),
        2147483649u);
    for (int lfu = 0; lfu < 2; lfu++) {
        Ps__TableSpec spec = sparse_spec("f", 3, 0.5f);
        spec.evict_at_budget = 1;
        spec.evict_half_life = lfu ? 100 : 0;
        char err[256];
        assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), 0);
        struct psd_table *t = NULL;
        assert_int_equal(psd_table_create(&spec, 0, 0, 1, &t), 0);
        for (int i = 0; i < 10; i++)
            assert_int_equal(push1(t, 1), 0); /* ticks 1..10: often, and long ago */
        assert_int_equal(push1(t, 2), 0);     /* tick 11, once */
        assert_int_equal(push1(t, 3), 0);     /* tick 12, once */
        assert_int_equal(push1(t, 4), 0);     /* at the budget */
        if (lfu) {
            assert_true(has(t, 1) && !has(t, 2)); /* 2's count decayed the most of the ones */
            assert_non_null(t->sp.freq);
            int64_t r = psd_sparse_row(&t->sp, 1, 0);
            assert_int_equal(t->sp.freq[r], 2507); /* 10 pushes, a tick apart, half-life 100 */
        } else {
            assert_true(!has(t, 1) && has(t, 2)); /* the least recently pushed */
            assert_null(t->sp.freq);
        }
        assert_true(has(t, 3) && has(t, 4));
        psd_table_destroy(t);
    }
    Ps__TableSpec spec = sparse_spec("f", 3, 0.5f);
    spec.evict_half_life = 100; /* without the budget it chooses nothing */
    char err[256];
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "evict_half_life"));
    spec.evict_at_budget = 1; /* at its bound, and one past */
    spec.evict_half_life = PS_EVICT_HALF_LIFE_MAX;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), 0);
    spec.evict_half_life = PS_EVICT_HALF_LIFE_MAX + 1;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "evict_half_life"));
}

/* The same pushes, the same table: rows, order, values and counts (what
 * a backup that replays the primary's records holds). */
static void test_the_same_pushes_give_the_same_table(void **state)
{
    (void)state;
    struct psd_table *a = make(300, 2, 200, 1), *b = make(300, 2, 200, 1);
    uint64_t rng = 11;
    for (int step = 0; step < 2000; step++) {
        uint64_t keys[32];
        size_t n = 0;
        uint64_t k = rng_next(&rng) % 50;
        for (int j = 0; j < 32; j++) { /* increasing; hot ids below 50, the rest spread */
            k += 1 + rng_next(&rng) % (j < 8 ? 4 : 400);
            keys[n++] = k;
        }
        int ra = push(a, keys, n), rb = push(b, keys, n);
        assert_int_equal(ra, rb);
        assert_true(a->sp.nrows <= 300);
    }
    assert_int_equal(a->sp.nrows, b->sp.nrows);
    assert_memory_equal(a->sp.row_key, b->sp.row_key, a->sp.nrows * 8);
    assert_memory_equal(a->sp.w, b->sp.w, a->sp.nrows * DIM * 4);
    assert_memory_equal(a->sp.last, b->sp.last, a->sp.nrows * 8);
    assert_true(a->sp.evicted_budget + a->sp.evicted_age > 0);
    assert_true(a->sp.held_back > 0);
    /* every row is found through the index (evictions moved rows) */
    for (uint64_t r = 0; r < a->sp.nrows; r++)
        assert_int_equal(psd_sparse_row(&a->sp, a->sp.row_key[r], 0), (int64_t)r);
    psd_table_destroy(a);
    psd_table_destroy(b);
}

/* Row-wise Adagrad: one accumulator per row, the mean of the row's
 * squared gradient; its rows keep it through an eviction's move. */
static void test_rowwise_adagrad(void **state)
{
    (void)state;
    Ps__TableSpec spec = sparse_spec("rw", 2, 0.1f);
    spec.eps = 1e-8f;
    spec.optimizer = PS__OPTIMIZER_KIND__OPT_ROWWISE_ADAGRAD;
    spec.evict_at_budget = 1;
    char err[256];
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), 0);
    struct psd_table *t = NULL;
    assert_int_equal(psd_table_create(&spec, 0, 0, 1, &t), 0);
    const float g[DIM] = {1, 2, 3, 4};
    float want[DIM] = {0}, s = 0, w[DIM];
    assert_int_equal(push1(t, 3), 0); /* row 0; 9 will be row 1 */
    for (int step = 0; step < 3; step++) {
        uint64_t k = 9;
        assert_int_equal(psd_table_push_rows(t, &k, g, 1, err, sizeof err), 0);
        s += (1.0f + 4.0f + 9.0f + 16.0f) / 4.0f;
        for (int j = 0; j < DIM; j++)
            want[j] -= 0.1f / (sqrtf(s) + 1e-8f) * g[j];
    }
    pull1(t, 9, w);
    assert_memory_equal(w, want, sizeof w);
    /* one float of state per row, counted */
    assert_int_equal(psd_table_bytes_held(t), 2 * (DIM * 4 + 4 + 8)); /* weights, rs, tick */
    /* 4 evicts 3, the older: row 0, where the last row (9) moves, with its
     * accumulator */
    assert_int_equal(push1(t, 4), 0);
    assert_false(has(t, 3));
    assert_int_equal(psd_sparse_row(&t->sp, 9, 0), 0);
    uint64_t k = 9;
    assert_int_equal(psd_table_push_rows(t, &k, g, 1, err, sizeof err), 0);
    s += 7.5f;
    float after[DIM];
    pull1(t, 9, after);
    for (int j = 0; j < DIM; j++)
        assert_true(after[j] == want[j] - 0.1f / (sqrtf(s) + 1e-8f) * g[j]);
    /* a dense table has no rows */
    spec.sparse = 0;
    spec.dim = 0;
    spec.rows_max = 0;
    spec.evict_at_budget = 0;
    spec.size = 10;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "row-wise"));
    psd_table_destroy(t);
}

static void test_specs_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    Ps__TableSpec spec = PS__TABLE_SPEC__INIT;
    spec.name = "d";
    spec.size = 10;
    spec.evict_after = 5; /* a dense table */
    char err[256];
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "sparse"));
    spec.size = 0;
    spec.sparse = 1;
    spec.dim = 2;
    spec.rows_max = 10;
    spec.evict_after = 0;
    spec.admit_after = 256;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "admit_after 256"));
    spec.admit_after = 2;
    spec.admit_counters = 1000; /* not a power of two */
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "admit_counters 1000"));
    spec.admit_counters = UINT64_C(1) << 31; /* past the largest sketch */
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    /* the largest is counted before the table is made (psd's
     * --max-table-bytes refuses a peer's spec that would hold more) */
    spec.admit_counters = UINT64_C(1) << 30;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), 0);
    assert_true(psd_table_bytes_for(&spec, 0, 1) >= (UINT64_C(1) << 30) + 10 * (2 * 4 + 8));
    spec.admit_after = 0;
    spec.admit_counters = 1024; /* a sketch without admission */
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    spec.admit_counters = 0;
    spec.evict_after_s = PS_EVICT_AFTER_S_MAX + 1;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "evict_after_s"));
    spec.evict_after_s = PS_EVICT_AFTER_S_MAX;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), 0);
    spec.sparse = 0; /* time eviction on a dense table */
    spec.size = 10;
    assert_int_equal(ps_wire_check_spec(&spec, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "evict_after_s"));
}

/* Eviction by time: the floor comes from the samples of the tick against
 * the clock, rows last pushed below it go as the slices reach them, and a
 * floor is only ever raised, never past the tick. */
static void test_time_evicts_below_the_floor(void **state)
{
    (void)state;
    Ps__TableSpec spec = sparse_spec("t", 100, 0.5f);
    spec.evict_after_s = 2;
    struct psd_table *t = NULL;
    assert_int_equal(psd_table_create(&spec, 0, 0, 1, &t), 0);
    assert_true(t->sp.life);
    assert_int_equal(push1(t, 1), 0);                         /* tick 1, at 0 ms */
    assert_int_equal(psd_sparse_age_clock(&t->sp, 10000), 0); /* the first sample */
    assert_int_equal(push1(t, 2), 0);                         /* tick 2, after it */
    assert_int_equal(psd_sparse_age_clock(&t->sp, 10500), 0); /* not a second on: no sample */
    assert_int_equal(psd_sparse_age_clock(&t->sp, 11000), 0); /* sampled, nothing 2 s old */
    /* at 12 s the sample of 10 s is 2 s old: rows pushed at tick 1 or
     * before are; key 2 came after it */
    uint64_t floor = psd_sparse_age_clock(&t->sp, 12000);
    assert_int_equal(floor, 2);
    assert_int_equal(psd_sparse_set_floor(&t->sp, floor), 0);
    assert_int_equal(psd_sparse_age_clock(&t->sp, 12100), 0); /* no higher yet */
    assert_true(has(t, 1));
    assert_int_equal(push1(t, 3), 0); /* its slice evicts key 1 */
    assert_false(has(t, 1));
    assert_true(has(t, 2) && has(t, 3));
    assert_int_equal(t->sp.evicted_age, 1);
    /* key 1 comes back as a new row at the tick, above the floor */
    assert_int_equal(push1(t, 1), 0);
    assert_int_equal(push1(t, 3), 0);
    assert_true(has(t, 1));
    /* a floor is raised only, and never past the next tick */
    assert_int_equal(psd_sparse_set_floor(&t->sp, 1), PS_EINVAL);
    assert_int_equal(psd_sparse_set_floor(&t->sp, t->sp.tick + 2), PS_EINVAL);
    assert_int_equal(t->sp.age_floor, 2);
    assert_int_equal(psd_sparse_set_floor(&t->sp, t->sp.tick + 1), 0);
    assert_int_equal(push1(t, 9), 0); /* every row before it goes */
    assert_true(has(t, 9));
    assert_false(has(t, 1) || has(t, 2) || has(t, 3));
    psd_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_counts_then_admits),
        cmocka_unit_test(test_budget_evicts_the_least_recently_pushed),
        cmocka_unit_test(test_a_push_never_evicts_its_own_rows),
        cmocka_unit_test(test_without_eviction_the_budget_refuses),
        cmocka_unit_test(test_age_evicts_in_slices),
        cmocka_unit_test(test_the_same_pushes_give_the_same_table),
        cmocka_unit_test(test_rowwise_adagrad),
        cmocka_unit_test(test_specs_that_do_not_fit_are_refused),
        cmocka_unit_test(test_time_evicts_below_the_floor),
        cmocka_unit_test(test_budget_by_decayed_frequency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
