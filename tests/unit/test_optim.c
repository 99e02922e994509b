/* Server optimizers checked against values computed by hand (the numbers
 * in the comments), on a table shard that starts at constant 1.0. */
#include "cases.h"
#include "table.h"

#include "ps_cpus.h"
#include "ps_err.h"
#include "ps_pool.h"
#include "ps_mem.h"
#include "psk_math.h"
#include "psk_optim.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const Ps__OptimizerKind all_kinds[] = {
    PS__OPTIMIZER_KIND__OPT_SGD, PS__OPTIMIZER_KIND__OPT_MOMENTUM, PS__OPTIMIZER_KIND__OPT_ADAGRAD,
    PS__OPTIMIZER_KIND__OPT_ADAM, PS__OPTIMIZER_KIND__OPT_FTRL};

static struct psd_table *make(Ps__OptimizerKind opt, float lr, float wd, int nesterov,
                              uint32_t shard, uint32_t shards, uint64_t size)
{
    Ps__TableSpec s;
    case_table_spec(&s, "t", size);
    s.optimizer = opt;
    s.lr = lr;
    s.weight_decay = wd;
    s.nesterov = nesterov;
    struct psd_table *t = NULL;
    assert_int_equal(psd_table_create(&s, 0, shard, shards, &t), 0);
    return t;
}

static float step(struct psd_table *t, float g)
{
    float out;
    psd_table_apply(t, t->lo, 1, &g, ++t->steps);
    psd_table_read(t, t->lo, 1, &out);
    return out;
}

static void test_sgd(void **state)
{
    (void)state;
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_SGD, 0.1f, 0.0f, 0, 0, 1, 4);
    assert_float_equal(step(t, 0.5f), 0.95f, 1e-7); /* 1 - 0.1*0.5 */
    psd_table_destroy(t);
    t = make(PS__OPTIMIZER_KIND__OPT_SGD, 0.1f, 0.01f, 0, 0, 1, 4);
    assert_float_equal(step(t, 0.5f), 0.949f, 1e-7); /* g' = 0.5 + 0.01*1 */
    psd_table_destroy(t);
}

static void test_momentum(void **state)
{
    (void)state;
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_MOMENTUM, 0.1f, 0.0f, 0, 0, 1, 4);
    assert_float_equal(step(t, 0.5f), 0.95f, 1e-6);  /* v=0.5 */
    assert_float_equal(step(t, 0.5f), 0.855f, 1e-6); /* v=0.95 */
    psd_table_destroy(t);
    t = make(PS__OPTIMIZER_KIND__OPT_MOMENTUM, 0.1f, 0.0f, 1, 0, 1, 4);
    assert_float_equal(step(t, 0.5f), 0.905f, 1e-6);  /* 1 - 0.1*(0.5 + 0.9*0.5) */
    assert_float_equal(step(t, 0.5f), 0.7695f, 1e-6); /* - 0.1*(0.5 + 0.9*0.95) */
    psd_table_destroy(t);
}

static void test_adagrad(void **state)
{
    (void)state;
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_ADAGRAD, 0.1f, 0.0f, 0, 0, 1, 4);
    assert_float_equal(step(t, 0.5f), 0.9f, 1e-6);       /* h=0.25 */
    assert_float_equal(step(t, 0.5f), 0.8292893f, 1e-6); /* h=0.5 */
    psd_table_destroy(t);
}

static void test_adam(void **state)
{
    (void)state;
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_ADAM, 0.1f, 0.0f, 0, 0, 1, 4);
    assert_float_equal(step(t, 0.5f), 0.9f, 1e-6);         /* mhat=0.5, vhat=0.25 */
    assert_float_equal(step(t, -0.25f), 0.8733663f, 1e-6); /* t=2, bias-corrected */
    psd_table_destroy(t);
}

static void test_shard_part_and_subrange(void **state)
{
    (void)state;
    /* Shard 1 of 2 of a 5-element table holds [3, 5). */
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_SGD, 1.0f, 0.0f, 0, 1, 2, 5);
    assert_int_equal(t->lo, 3);
    assert_int_equal(t->hi, 5);
    float g = 0.25f, out[2];
    psd_table_apply(t, 4, 1, &g, ++t->steps);
    psd_table_read(t, 3, 2, out);
    assert_true(out[0] == 1.0f); /* untouched */
    assert_true(out[1] == 0.75f);
    psd_table_destroy(t);
}

static void test_same_spec(void **state)
{
    (void)state;
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_SGD, 0.1f, 0.0f, 0, 0, 1, 4);
    Ps__TableSpec s;
    ps__table_spec__init(&s);
    s.name = "t";
    s.size = 4;
    s.lr = 0.1f;
    s.momentum = 0.9f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.init = PS__INIT_KIND__INIT_CONSTANT;
    s.init_scale = 1.0f;
    assert_true(psd_table_same_spec(t, &s));
    s.lr = 0.2f;
    assert_false(psd_table_same_spec(t, &s));
    psd_table_destroy(t);
}

/* A keyed push applies to each key what a one-element range push of the
 * same step would, for every kind; on a shard that does not start at 0,
 * with more keys than the loops' prefetch distance. */
static void test_keyed_matches_range(void **state)
{
    (void)state;
    enum { SIZE = 20000, N = 1500 };
    static uint64_t keys[N];
    static float g[N];
    for (size_t k = 0; k < sizeof all_kinds / sizeof all_kinds[0]; k++) {
        struct psd_table *a = make(all_kinds[k], 0.05f, 0.01f, 0, 1, 2, SIZE);
        struct psd_table *b = make(all_kinds[k], 0.05f, 0.01f, 0, 1, 2, SIZE);
        for (uint64_t st = 1; st <= 3; st++) {
            for (size_t i = 0; i < N; i++) { /* a different spread each step */
                keys[i] = a->lo + i * 6 + (i * st) % 5;
                g[i] = 0.01f * (float)((int)((i * 7 + st) % 13) - 6);
            }
            psd_table_apply_keys(a, keys, g, N, st);
            for (size_t i = 0; i < N; i++)
                psd_table_apply(b, keys[i], 1, &g[i], st);
        }
        assert_memory_equal(a->w, b->w, (size_t)(a->hi - a->lo) * sizeof(float));
        if (a->s1 != NULL)
            assert_memory_equal(a->s1, b->s1, (size_t)(a->hi - a->lo) * sizeof(float));
        if (a->s2 != NULL)
            assert_memory_equal(a->s2, b->s2, (size_t)(a->hi - a->lo) * sizeof(float));
        psd_table_destroy(a);
        psd_table_destroy(b);
    }
}

/* Big applies go in pieces that psd's helper thread shares: a table with
 * the helper ends with the same bits as one applied in calls too small to
 * be cut (1,000 elements or keys each), for every kind, over
 * a range that starts and ends off the pieces' edges, keyed pushes of
 * more than two pieces, and pruned elements. Repeated until the helper
 * has run pieces (with 2 or more CPUs; one CPU may never let it). */
static void test_pieces_same_bits(void **state)
{
    (void)state;
    enum {
        SIZE = PSD_APPLY_MIN + 3 * PSD_APPLY_PIECE + 1234,
        NK = PSD_APPLY_KEYS_MIN + 77,
        C = 1000
    };
    static float g[SIZE];
    static uint64_t keys[NK];
    struct ps_pool *pool = NULL;
    assert_int_equal(ps_pool_start(&pool, PS_POOL_SPIN_NS, "test-apply"), 0);
    struct psd_prune_spec ps = {.target = 0.5, .start = 1, .end = 2, .every = 1};
    int rounds = 0;
    do {
        for (size_t k = 0; k < sizeof all_kinds / sizeof all_kinds[0]; k++) {
            struct psd_table *a = make(all_kinds[k], 0.05f, 0.01f, 0, 1, 2, 2 * SIZE);
            struct psd_table *b = make(all_kinds[k], 0.05f, 0.01f, 0, 1, 2, 2 * SIZE);
            a->pool = pool;
            assert_int_equal(psd_table_enable_prune(a, &ps), 0);
            assert_int_equal(psd_table_enable_prune(b, &ps), 0);
            for (uint64_t i = 0; i < SIZE; i += 7)
                a->mask[i] = b->mask[i] = 1;
            for (uint64_t st = 1; st <= 3; st++) {
                for (size_t i = 0; i < SIZE; i++)
                    g[i] = 0.01f * (float)((int)((i * 7 + st + (size_t)rounds) % 13) - 6);
                for (size_t i = 0; i < NK; i++)
                    keys[i] = a->lo + i * 2 + (i * st) % 2;
                psd_table_apply(a, a->lo + 5, SIZE - 9, g, 2 * st - 1);
                psd_table_apply_keys(a, keys, g, NK, 2 * st);
                for (size_t i = 0; i < SIZE - 9; i += C) /* calls of one piece each */
                    psd_table_apply(b, b->lo + 5 + i, i + C < SIZE - 9 ? C : SIZE - 9 - i, g + i,
                                    2 * st - 1);
                for (size_t i = 0; i < NK; i += C)
                    psd_table_apply_keys(b, keys + i, g + i, i + C < NK ? C : NK - i, 2 * st);
            }
            size_t bytes = (size_t)(a->hi - a->lo) * sizeof(float);
            assert_memory_equal(a->w, b->w, bytes);
            if (a->s1 != NULL)
                assert_memory_equal(a->s1, b->s1, bytes);
            if (a->s2 != NULL)
                assert_memory_equal(a->s2, b->s2, bytes);
            psd_table_destroy(a);
            psd_table_destroy(b);
        }
    } while (ps_pool_helped(pool) == 0 && ps_cpus_allowed() >= 2 && ++rounds < 50);
    if (ps_cpus_allowed() >= 2)
        assert_true(ps_pool_helped(pool) > 0);
    /* one element or key under the bounds: this thread alone, whatever the helper does */
    struct psd_table *a = make(PS__OPTIMIZER_KIND__OPT_SGD, 0.05f, 0.0f, 0, 0, 1, SIZE);
    a->pool = pool;
    for (size_t i = 0; i < NK; i++)
        keys[i] = 2 * i;
    unsigned long helped = ps_pool_helped(pool);
    for (int r = 0; r < 20; r++) {
        psd_table_apply(a, 0, PSD_APPLY_MIN - 1, g, 1);
        psd_table_apply_keys(a, keys, g, PSD_APPLY_KEYS_MIN - 1, 1);
    }
    assert_int_equal(ps_pool_helped(pool), helped);
    psd_table_destroy(a);
    ps_pool_stop(pool);
}

/* psk_optim_apply (its AVX2 build where the CPU has AVX2) against a plain
 * loop over the same per-element rules, bit for bit, for every kind, over
 * an odd length (the vector loop's tail runs) and several steps. */
static void test_apply_matches_element_rules(void **state)
{
    (void)state;
    const int kinds[] = {PSK_OPT_SGD, PSK_OPT_MOMENTUM, PSK_OPT_ADAGRAD, PSK_OPT_ADAM,
                         PSK_OPT_FTRL};
    enum { N = 1031 };
    static float w[N], s1[N], s2[N], rw[N], r1[N], r2[N], g[N];
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        struct psk_optim o = {.kind = kinds[k],
                              .lr = 0.05f,
                              .weight_decay = 0.01f,
                              .momentum = 0.9f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .eps = 1e-6f,
                              .nesterov = 1,
                              .l1 = 0.001f,
                              .l2 = 0.01f};
        for (size_t i = 0; i < N; i++) {
            w[i] = rw[i] = 0.5f - 0.001f * (float)i;
            s1[i] = r1[i] = s2[i] = r2[i] = 0.0f;
        }
        for (uint64_t st = 1; st <= 4; st++) {
            for (size_t i = 0; i < N; i++)
                g[i] = 0.01f * (float)((int)((i * 7 + st * 3) % 17) - 8);
            psk_optim_apply(&o, st, w, s1, s2, g, N);
            float lr = psk_optim_lr(&o, st), wd = o.weight_decay;
            float bc1 = (float)(1.0 - pow((double)o.beta1, (double)st));
            float bc2 = (float)(1.0 - pow((double)o.beta2, (double)st));
            for (size_t i = 0; i < N; i++) {
                float d = psk_decay(g[i], rw[i], wd);
                switch (o.kind) {
                case PSK_OPT_MOMENTUM:
                    rw[i] = psk_momentum(rw[i], d, &r1[i], lr, o.momentum, o.nesterov);
                    break;
                case PSK_OPT_ADAGRAD:
                    rw[i] = psk_adagrad(rw[i], d, &r1[i], lr, o.eps);
                    break;
                case PSK_OPT_ADAM:
                    rw[i] =
                        psk_adam(rw[i], d, &r1[i], &r2[i], lr, o.beta1, o.beta2, o.eps, bc1, bc2);
                    break;
                case PSK_OPT_FTRL:
                    rw[i] = psk_ftrl(rw[i], g[i], &r1[i], &r2[i], lr, o.eps, o.l1, o.l2);
                    break;
                default:
                    rw[i] = psk_sgd(rw[i], d, lr);
                }
            }
        }
        assert_memory_equal(w, rw, sizeof w);
        assert_memory_equal(s1, r1, sizeof s1);
        assert_memory_equal(s2, r2, sizeof s2);
    }
}

/* A sparse table's rows of spec s (sparse), both created; b is updated a
 * row at a time by the caller. */
static void make_row_pair(const Ps__TableSpec *s, struct psd_table **a, struct psd_table **b)
{
    assert_int_equal(psd_table_create(s, 0, 0, 1, a), 0);
    assert_int_equal(psd_table_create(s, 0, 0, 1, b), 0);
}

/* A push of keys the plain way: each row found (or created) in turn and
 * updated alone at its own step (counted where the update uses it). */
static void push_row_by_row(struct psd_table *b, const uint64_t *keys, const float *g, size_t n)
{
    struct psk_optim o = psd_table_optim(b);
    struct psd_sparse *sp = &b->sp;
    size_t d = sp->dim;
    for (size_t i = 0; i < n; i++) {
        int64_t r = psd_sparse_row(sp, keys[i], 1);
        assert_true(r >= 0);
        size_t at = (size_t)r * d;
        uint32_t st = psk_optim_uses_step(&o) ? ++sp->row_steps[r] : 1;
        psk_optim_apply(&o, st, sp->w + at, sp->s1 ? sp->s1 + at : NULL,
                        sp->s2 ? sp->s2 + at : NULL, g + i * d, d);
    }
}

static void assert_rows_equal(const struct psd_table *a, const struct psd_table *b)
{
    const struct psd_sparse *x = &a->sp, *y = &b->sp;
    size_t bytes = (size_t)x->nrows * x->dim * sizeof(float);
    assert_int_equal(x->nrows, y->nrows);
    assert_memory_equal(x->row_key, y->row_key, (size_t)x->nrows * sizeof *x->row_key);
    assert_memory_equal(x->row_steps, y->row_steps, (size_t)x->nrows * sizeof *x->row_steps);
    assert_memory_equal(x->w, y->w, bytes);
    if (x->s1 != NULL)
        assert_memory_equal(x->s1, y->s1, bytes);
    if (x->s2 != NULL)
        assert_memory_equal(x->s2, y->s2, bytes);
}

/* A sparse table's push finds its rows some keys ahead of their update,
 * and updates up to 64 rows in one call where the step does not matter
 * (psk_optim_uses_step): it ends with the same bits as each row updated
 * alone at its own step, for every kind, with a constant rate and a cosine
 * schedule (rows at different steps then take different rates; a sparse
 * table used to drop its schedule's length, so kept a constant rate), rows of 1
 * and 3 values, over pushes of 1, 63, 64, 65 and 700 keys that create
 * rows and come back to them. A pull reads them back. */
static void test_rows_match_row_by_row(void **state)
{
    (void)state;
    enum { KEYS = 3000, N = 700, DMAX = 3 };
    static uint64_t keys[N];
    static float g[N * DMAX], out[N * DMAX];
    const size_t sizes[] = {1, 63, 64, 65, N, 65, N};
    for (size_t k = 0; k < sizeof all_kinds / sizeof all_kinds[0]; k++)
        for (uint32_t d = 1; d <= DMAX; d += DMAX - 1)
            for (int cosine = 0; cosine <= 1; cosine++) {
                Ps__TableSpec s;
                case_table_spec(&s, "rows", 0);
                s.sparse = 1;
                s.dim = d;
                s.rows_max = KEYS;
                s.optimizer = all_kinds[k];
                s.lr = 0.05f;
                s.weight_decay = 0.01f;
                s.l1 = 0.001f;
                s.l2 = 0.01f;
                s.init = PS__INIT_KIND__INIT_UNIFORM;
                s.init_scale = 0.1f;
                s.lr_schedule = cosine ? PS__LR_SCHEDULE__LR_COSINE : PS__LR_SCHEDULE__LR_CONSTANT;
                s.lr_decay_steps = cosine ? 6 : 0;
                struct psd_table *a, *b;
                make_row_pair(&s, &a, &b);
                assert_true(psd_table_same_spec(a, &s)); /* its schedule kept too */
                char err[256];
                for (size_t p = 0; p < sizeof sizes / sizeof sizes[0]; p++) {
                    size_t n = sizes[p], gap = KEYS / n;
                    for (size_t i = 0; i < n; i++) { /* sorted; a different spread each push */
                        keys[i] = i * gap + (i * 13 + p * 7) % gap;
                        for (size_t e = 0; e < d; e++)
                            g[i * d + e] = 0.01f * (float)((int)((i * 7 + e + p * 3) % 17) - 8);
                    }
                    assert_int_equal(psd_table_push_rows(a, keys, g, n, err, sizeof err), 0);
                    push_row_by_row(b, keys, g, n);
                    assert_rows_equal(a, b);
                    assert_int_equal(psd_table_pull_rows(a, keys, n, out, err, sizeof err), 0);
                    for (size_t i = 0; i < n; i++) {
                        int64_t r = psd_sparse_row(&b->sp, keys[i], 0);
                        assert_memory_equal(out + i * d, b->sp.w + (size_t)r * d, d * 4);
                    }
                }
                psd_table_destroy(a);
                psd_table_destroy(b);
            }
}

/* A push that runs out of rows stops at the key that found none: the keys
 * before it have their rows and their update, none after it has a row. */
static void test_rows_full_midway(void **state)
{
    (void)state;
    enum { MAX = 100, N = 150 };
    static uint64_t keys[N];
    static float g[N];
    for (size_t i = 0; i < N; i++) {
        keys[i] = 1000 + 3 * i;
        g[i] = 0.01f * (float)(i % 7 + 1);
    }
    for (size_t k = 0; k < sizeof all_kinds / sizeof all_kinds[0]; k++) {
        Ps__TableSpec s;
        case_table_spec(&s, "rows", 0);
        s.sparse = 1;
        s.dim = 1;
        s.rows_max = MAX;
        s.optimizer = all_kinds[k];
        struct psd_table *a, *b;
        make_row_pair(&s, &a, &b);
        char err[256];
        assert_int_equal(psd_table_push_rows(a, keys, g, N, err, sizeof err), PS_ELIMIT);
        assert_non_null(strstr(err, "is full"));
        assert_non_null(strstr(err, "key 1300")); /* keys[MAX] */
        push_row_by_row(b, keys, g, MAX);
        assert_rows_equal(a, b);
        assert_int_equal(psd_sparse_row(&a->sp, keys[MAX], 0), -1);
        /* a pull stops there too, and creates nothing */
        static float out[N];
        assert_int_equal(psd_table_pull_rows(a, keys, N, out, err, sizeof err), PS_ELIMIT);
        assert_int_equal(a->sp.nrows, MAX);
        assert_memory_equal(out, a->sp.w, MAX * sizeof(float));
        psd_table_destroy(a);
        psd_table_destroy(b);
    }
}

/* A lent block stays as it was while a message carrying its elements is
 * out: a write to those elements moves the table to a copy (once), a write
 * to other elements stays in place, and the block is freed with its last
 * message, also after the table is gone. */
static void test_lend_copy_on_write(void **state)
{
    (void)state;
    enum { SIZE = 1000 };
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_MOMENTUM, 0.5f, 0.0f, 0, 0, 1, SIZE);
    float g[SIZE], before[SIZE];
    for (size_t i = 0; i < SIZE; i++)
        g[i] = 0.25f;
    struct psd_lent *l = psd_table_lend(t, 0, 500);
    assert_non_null(l);
    float *block = t->w;
    memcpy(before, t->w, sizeof before);
    psd_table_apply(t, 500, 500, g, ++t->steps); /* other elements: in place */
    assert_ptr_equal(t->w, block);
    assert_int_equal(t->cow, 0);
    const uint64_t key = 499;
    psd_table_apply_keys(t, &key, g, 1, ++t->steps); /* one of the lent ones: moves */
    assert_true(t->w != block);
    assert_int_equal(t->cow, 1);
    assert_memory_equal(block, before, 500 * sizeof(float)); /* what the message carries */
    assert_true(t->w[499] == 1.0f - 0.5f * 0.25f);
    psd_table_apply(t, 0, SIZE, g, ++t->steps); /* nothing out on the new block */
    assert_int_equal(t->cow, 1);
    psd_lent_done(l); /* the old block goes (ASan: no leak) */

    struct psd_lent *l2 = psd_table_lend(t, 0, 10), *l3 = psd_table_lend(t, 990, 1000);
    assert_true(l2 != l3 && l2->block == l3->block); /* two messages, one block */
    psd_lent_done(l2);
    float *w = t->w;
    psd_table_apply(t, 0, 10, g, ++t->steps); /* l2's elements, but l2 is done */
    assert_ptr_equal(t->w, w);
    psd_table_prune_step(t, 1);                 /* no prune spec: no write */
    psd_table_apply(t, 985, 10, g, ++t->steps); /* overlaps l3 */
    assert_int_equal(t->cow, 2);
    assert_true(t->w != w);
    psd_lent_done(l3);

    struct psd_lent *many[PSD_LENT_MAX + 1];
    for (int i = 0; i < PSD_LENT_MAX; i++)
        assert_non_null(many[i] = psd_table_lend(t, 0, 1));
    assert_null(psd_table_lend(t, 0, 1)); /* every record out: copy instead */
    for (int i = 0; i < PSD_LENT_MAX; i++)
        psd_lent_done(many[i]);
    struct psd_lent *l5 = psd_table_lend(t, 0, SIZE);
    memcpy(before, t->w, sizeof before);
    psd_table_destroy(t); /* with a message still out */
    assert_memory_equal(l5->block->w, before, sizeof before);
    psd_lent_done(l5); /* frees the block (ASan: no use after free, no leak) */
}

/* Big arrays (tables, their optimizer state, sparse slots) start on a huge
 * page and are whole huge pages, so transparent huge pages can back them;
 * small ones are cache-line aligned. Zeroed to the rounded end. */
static void test_big_arrays_on_huge_pages(void **state)
{
    (void)state;
    const size_t sizes[] = {0,
                            100,
                            PS_HUGE_PAGE_BYTES - 1,
                            PS_HUGE_PAGE_BYTES,
                            PS_HUGE_PAGE_BYTES + 4,
                            3 * PS_HUGE_PAGE_BYTES};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i], round = n < PS_HUGE_PAGE_BYTES ? 64 : PS_HUGE_PAGE_BYTES;
        unsigned char *p = ps_alloc_big(n, 1);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % round, 0);
        size_t end = n == 0 ? 64 : (n + round - 1) / round * round;
        for (size_t j = 0; j < end; j += 4093)
            assert_int_equal(p[j], 0);
        assert_int_equal(p[end - 1], 0);
        free(p);
    }
    /* grown: the old bytes kept, the new block aligned the same way */
    unsigned char *p = ps_grow_big(NULL, 0, 100);
    assert_non_null(p);
    for (int j = 0; j < 100; j++)
        p[j] = (unsigned char)j;
    p = ps_grow_big(p, 100, 3 * PS_HUGE_PAGE_BYTES);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % PS_HUGE_PAGE_BYTES, 0);
    for (int j = 0; j < 100; j++)
        assert_int_equal(p[j], j);
    free(p);
    /* a sparse table's rows grow onto huge pages too (1M rows of 1 value) */
    Ps__TableSpec s;
    case_table_spec(&s, "rows", 0);
    s.sparse = 1;
    s.dim = 1;
    s.rows_max = 1u << 20;
    s.optimizer = PS__OPTIMIZER_KIND__OPT_ADAM;
    struct psd_table *rt = NULL;
    assert_int_equal(psd_table_create(&s, 0, 0, 1, &rt), 0);
    for (uint64_t k = 0; k < (1u << 20); k++)
        assert_true(psd_sparse_row(&rt->sp, k * 7, 1) == (int64_t)k);
    const void *arrays[] = {rt->sp.w, rt->sp.s1, rt->sp.s2, rt->sp.row_steps, rt->sp.row_key};
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++)
        assert_int_equal((uintptr_t)arrays[a] % PS_HUGE_PAGE_BYTES, 0);
    assert_int_equal(rt->sp.row_key[12345], 12345u * 7);
    assert_int_equal(psd_sparse_row(&rt->sp, 12345u * 7, 0), 12345);
    psd_table_destroy(rt);
    /* a table of 1M floats and its Adam state; its values as initialized */
    struct psd_table *t = make(PS__OPTIMIZER_KIND__OPT_ADAM, 0.01f, 0, 0, 0, 1, 1u << 20);
    assert_int_equal((uintptr_t)t->w % PS_HUGE_PAGE_BYTES, 0);
    assert_int_equal((uintptr_t)t->s1 % PS_HUGE_PAGE_BYTES, 0);
    assert_int_equal((uintptr_t)t->s2 % PS_HUGE_PAGE_BYTES, 0);
    assert_true(t->w[0] == 1.0f && t->w[(1u << 20) - 1] == 1.0f);
    assert_true(t->s2[(1u << 20) - 1] == 0.0f);
    psd_table_destroy(t);
}

/* The share of zero weights psctl shows: counted for a table without a
 * prune mask, dense or sparse, kept for PSD_ZEROS_KEEP_MS, counted again
 * after it. */
static void test_zero_share(void **state)
{
    (void)state;
    Ps__TableSpec s;
    case_table_spec(&s, "d", 8); /* ones */
    struct psd_table *t = NULL;
    assert_int_equal(psd_table_create(&s, 0, 0, 1, &t), 0);
    assert_float_equal(psd_table_zero_share(t, 1000), 0.0, 0.0);
    t->w[0] = t->w[3] = 0.0f;
    assert_float_equal(psd_table_zero_share(t, 1500), 0.0, 0.0);  /* kept */
    assert_float_equal(psd_table_zero_share(t, 2000), 0.25, 0.0); /* counted again */
    psd_table_destroy(t);

    Ps__TableSpec sp;
    case_sparse_spec(&sp, "rows", 2, 16, 1.0f);
    assert_int_equal(psd_table_create(&sp, 1, 0, 1, &t), 0);
    const uint64_t keys[2] = {5, 9};
    const float g[4] = {-1.0f, 0.0f, 0.0f, 0.0f}; /* zeros init: 3 of 4 stay 0 */
    char err[256];
    assert_int_equal(psd_table_push_rows(t, keys, g, 2, err, sizeof err), 0);
    assert_float_equal(psd_table_zero_share(t, 1000), 0.75, 0.0);
    psd_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_share),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_shard_part_and_subrange),
        cmocka_unit_test(test_same_spec),
        cmocka_unit_test(test_keyed_matches_range),
        cmocka_unit_test(test_pieces_same_bits),
        cmocka_unit_test(test_apply_matches_element_rules),
        cmocka_unit_test(test_rows_match_row_by_row),
        cmocka_unit_test(test_rows_full_midway),
        cmocka_unit_test(test_lend_copy_on_write),
        cmocka_unit_test(test_big_arrays_on_huge_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
