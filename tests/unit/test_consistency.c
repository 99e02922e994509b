/* Consistency rules in isolation: BSP rounds by watermark (chunked pushes,
 * arrival order irrelevant to the bits, ranges ready as the watermark
 * passes them, refusals), the SSP bound, ASP. */
#include "cases.h"
#include "consistency.h"
#include "table.h"

#include "ps_err.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#define N 10

/* A table of N ones; with adam set, Adam with a cosine schedule over 10
 * steps (both read the optimizer's step), else SGD at a constant 0.5. */
static struct psd_table *make_opt(const struct psd_cons *c, int adam)
{
    Ps__TableSpec s;
    case_table_spec(&s, "t", N);
    if (adam) {
        s.optimizer = PS__OPTIMIZER_KIND__OPT_ADAM;
        s.lr_schedule = PS__LR_SCHEDULE__LR_COSINE;
        s.lr_decay_steps = 10;
    }
    struct psd_table *t = NULL;
    assert_int_equal(psd_table_create(&s, 0, 0, 1, &t), 0);
    assert_int_equal(psd_cons_table_init(c, t), 0);
    return t;
}

static struct psd_table *make(const struct psd_cons *c)
{
    return make_opt(c, 0);
}

static void drop(const struct psd_cons *c, struct psd_table *t)
{
    psd_cons_table_fini(c, t);
    psd_table_destroy(t);
}

/* A keyed push of n gradients g for keys k from worker w at clock. */
static int push_keys(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock,
                     const uint64_t *k, const float *g, size_t n, int *applied)
{
    char err[256];
    const struct psd_cons_push p = {.worker = w, .clock = clock, .keys = k, .count = n, .g = g};
    return psd_cons_push(c, t, &p, applied, NULL, err, sizeof err);
}

/* A push whose header says it continues a request (a client's piece). */
static int piece(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock,
                 uint64_t off, uint64_t n, const float *g, int continues)
{
    int applied = 0;
    char err[256];
    const struct psd_cons_push p = {.worker = w,
                                    .clock = clock,
                                    .offset = off,
                                    .count = n,
                                    .g = g + off,
                                    .continues = continues};
    return psd_cons_push(c, t, &p, &applied, NULL, err, sizeof err);
}

static int push(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock,
                uint64_t off, uint64_t n, const float *g)
{
    return piece(c, t, w, clock, off, n, g, 0);
}

/* The clocks a pull may wait for: in bsp up to two rounds past those
 * applied, in ssp:K up to K + 2 past the slowest worker; one more is out
 * of reach. A restored table reaches any clock until its first push. */
static void test_reachable_clocks(void **state)
{
    (void)state;
    float g[N] = {0};
    struct psd_cons bsp = {PSD_BSP, 0, 2};
    struct psd_table *t = make(&bsp);
    assert_true(psd_cons_reachable(&bsp, t, 2));
    assert_false(psd_cons_reachable(&bsp, t, 3));
    assert_int_equal(push(&bsp, t, 0, 0, 0, N, g), 0);
    assert_int_equal(push(&bsp, t, 1, 0, 0, N, g), 0); /* round 0 applied: clock 1 */
    assert_true(psd_cons_reachable(&bsp, t, 3));
    assert_false(psd_cons_reachable(&bsp, t, 4));
    t->restored = t->recovering = 1;
    assert_true(psd_cons_reachable(&bsp, t, UINT64_C(1) << 40));
    drop(&bsp, t);

    struct psd_cons ssp = {PSD_SSP, 3, 2};
    t = make(&ssp);
    assert_int_equal(push(&ssp, t, 0, 0, 0, N, g), 0); /* worker 1 is still at 0 */
    assert_true(psd_cons_reachable(&ssp, t, 5));
    assert_false(psd_cons_reachable(&ssp, t, 6));
    drop(&ssp, t);

    struct psd_cons asp = {PSD_ASP, 0, 2};
    t = make(&asp);
    assert_true(psd_cons_reachable(&asp, t, UINT64_C(1) << 40));
    drop(&asp, t);
}

/* A worker saying hello from outside the rounds starts two rounds ahead
 * while some worker is still a member, and at the table's clock once
 * none is (nobody would close the rounds in between). */
static void test_join_clock_without_members(void **state)
{
    (void)state;
    float g[N] = {0};
    struct psd_cons bsp = {PSD_BSP, 0, 2};
    struct psd_table *t = make(&bsp);
    assert_int_equal(push(&bsp, t, 0, 0, 0, N, g), 0);
    assert_int_equal(push(&bsp, t, 1, 0, 0, N, g), 0); /* clock 1 */
    int applied = 0;
    psd_cons_leave(&bsp, t, 1, &applied);
    assert_int_equal(psd_cons_join_clock(&bsp, t, 1), 3);
    psd_cons_leave(&bsp, t, 0, &applied);
    assert_int_equal(psd_cons_join_clock(&bsp, t, 1), 1);
    assert_true(psd_cons_ready(&bsp, t, 1, 0, N)); /* its pull is answered at once */
    drop(&bsp, t);
}

static void test_bsp_watermark(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 2};
    float g0[N], g1[N];
    for (int i = 0; i < N; i++) {
        g0[i] = 0.1f * (float)i;
        g1[i] = 0.3f - 0.07f * (float)i;
    }
    /* order A: worker 0 pushes everything first, in two chunks */
    struct psd_table *a = make(&c);
    assert_int_equal(push(&c, a, 0, 0, 0, 4, g0), 0);
    assert_int_equal(push(&c, a, 0, 0, 4, 6, g0), 0);
    assert_int_equal(a->watermark, 0); /* nothing from worker 1 yet */
    assert_false(psd_cons_ready(&c, a, 1, 0, 4));
    assert_int_equal(push(&c, a, 1, 0, 0, 3, g1), 0);
    assert_int_equal(a->watermark, 3);
    assert_true(psd_cons_ready(&c, a, 1, 0, 3)); /* the applied prefix */
    assert_false(psd_cons_ready(&c, a, 1, 0, 4));
    assert_int_equal(push(&c, a, 1, 0, 3, 7, g1), 0);
    assert_int_equal(a->clock, 1); /* round closed */
    assert_true(psd_cons_ready(&c, a, 1, 0, N));
    /* order B: interleaved, worker 1 first, other chunking */
    struct psd_table *b = make(&c);
    assert_int_equal(push(&c, b, 1, 0, 0, 7, g1), 0);
    assert_int_equal(push(&c, b, 0, 0, 0, 2, g0), 0);
    assert_int_equal(push(&c, b, 0, 0, 2, 8, g0), 0);
    assert_int_equal(push(&c, b, 1, 0, 7, 3, g1), 0);
    assert_int_equal(b->clock, 1);
    assert_memory_equal(a->w, b->w, N * sizeof(float)); /* same bits */
    for (int i = 0; i < N; i++)
        assert_float_equal(a->w[i], 1.0f - 0.5f * (g0[i] + g1[i]) / 2.0f, 1e-6);
    assert_int_equal(a->steps, 1);
    drop(&c, a);
    drop(&c, b);
}

static void test_bsp_refusals(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 2};
    float g[N] = {0};
    struct psd_table *t = make(&c);
    assert_int_equal(push(&c, t, 0, 1, 0, N, g), PS_ESTATE); /* a future clock */
    assert_int_equal(push(&c, t, 0, 0, 4, 6, g), PS_EAGAIN); /* before [0, 4): not yet */
    assert_int_equal(push(&c, t, 0, 0, 0, 4, g), 0);
    assert_int_equal(push(&c, t, 0, 0, 0, 4, g), PS_ESTATE); /* the same chunk again */
    assert_int_equal(push(&c, t, 2, 0, 0, 4, g), PS_EINVAL); /* not one of 2 workers */
    char missing[64];
    psd_cons_missing(&c, t, 1, missing, sizeof missing);
    assert_string_equal(missing, "0, 1"); /* neither finished clock 0 */
    assert_int_equal(push(&c, t, 0, 0, 4, 6, g), 0);
    psd_cons_missing(&c, t, 1, missing, sizeof missing);
    assert_string_equal(missing, "1");
    drop(&c, t);
}

/* After a shard restart the chunk a worker sent first can be the one lost:
 * the later chunk is refused as "not yet" and leaves no trace, then both
 * arrive in order and the round is the same as without the loss. The
 * same for a worker outside the round whose first chunk is late. */
static void test_bsp_chunk_before_lost_one(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 2};
    float g0[N], g1[N];
    for (int i = 0; i < N; i++) {
        g0[i] = 0.2f * (float)i;
        g1[i] = 1.0f - 0.1f * (float)i;
    }
    struct psd_table *a = make(&c), *b = make(&c);
    assert_int_equal(push(&c, a, 0, 0, 0, 6, g0), 0);
    assert_int_equal(push(&c, a, 0, 0, 6, 4, g0), 0);
    assert_int_equal(push(&c, a, 1, 0, 0, N, g1), 0);
    assert_int_equal(push(&c, b, 0, 0, 6, 4, g0), PS_EAGAIN);
    assert_int_equal(b->next[0], 0);
    assert_int_equal(push(&c, b, 1, 0, 0, N, g1), 0);
    assert_int_equal(b->watermark, 0); /* nothing of worker 0 yet */
    assert_int_equal(push(&c, b, 0, 0, 0, 6, g0), 0);
    assert_int_equal(push(&c, b, 0, 0, 6, 4, g0), 0); /* the re-send */
    assert_int_equal(b->clock, 1);
    assert_memory_equal(a->w, b->w, N * sizeof(float));
    /* worker 1 left; its first chunk of clock 1 is late */
    int applied = 0;
    psd_cons_leave(&c, b, 1, &applied);
    assert_int_equal(push(&c, b, 1, 1, 5, 5, g1), PS_EAGAIN);
    assert_false(b->member[1]);
    assert_int_equal(push(&c, b, 1, 1, 0, 5, g1), 0); /* joins */
    assert_true(b->member[1]);
    assert_int_equal(push(&c, b, 1, 1, 5, 5, g1), 0);
    /* once the round has begun without it, it is stale */
    psd_cons_leave(&c, b, 1, &applied);
    assert_int_equal(push(&c, b, 0, 1, 0, N, g0), 0);
    assert_int_equal(b->clock, 2);
    assert_int_equal(push(&c, b, 0, 2, 0, 5, g0), 0);
    assert_int_equal(push(&c, b, 1, 2, 5, 5, g1), PSD_CONS_STALE);
    drop(&c, a);
    drop(&c, b);
}

/* After a restore, the first push sets the clock; a worker already a round
 * past it (the old shard closed that round) moves the table on, and the
 * rest of the skipped round is stale, not an error. */
static void test_bsp_restored_worker_ahead(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 2};
    float g[N];
    for (int i = 0; i < N; i++)
        g[i] = 0.01f * (float)i;
    struct psd_table *t = make(&c);
    t->clock = t->steps = 5; /* as a checkpoint restores it */
    t->restored = t->recovering = 1;
    assert_int_equal(push(&c, t, 0, 6, 0, 4, g), 0); /* a retry of round 6: catch up to 6 */
    assert_int_equal(t->clock, 6);
    int applied = 0;
    char err[256];
    const struct psd_cons_push p = {.worker = 1, .clock = 7, .count = N, .g = g};
    assert_int_equal(psd_cons_push(&c, t, &p, &applied, NULL, err, sizeof err), 0);
    assert_true(applied);
    assert_int_equal(t->clock, 7);
    assert_int_equal(t->rounds_lost, 2);
    assert_true(psd_cons_ready(&c, t, 7, 0, N));
    assert_int_equal(push(&c, t, 0, 6, 4, 6, g), PSD_CONS_STALE); /* the rest of round 6 */
    assert_int_equal(push(&c, t, 0, 7, 0, N, g), 0);              /* round 7 closes */
    assert_int_equal(t->clock, 8);
    assert_false(t->recovering);
    /* once a round has closed, a push of an older clock is an error again */
    assert_int_equal(push(&c, t, 0, 6, 0, N, g), PS_ESTATE);
    drop(&c, t);
}

static void test_ssp_and_asp(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_SSP, 2, 2};
    float g[N] = {0};
    struct psd_table *t = make(&c);
    for (uint64_t k = 0; k < 3; k++) /* worker 0 completes clocks 0..2 */
        assert_int_equal(push(&c, t, 0, k, 0, N, g), 0);
    assert_true(psd_cons_ready(&c, t, 2, 0, N));  /* worker 1 at 0: 2 ahead is allowed */
    assert_false(psd_cons_ready(&c, t, 3, 0, N)); /* 3 ahead is not */
    assert_int_equal(push(&c, t, 1, 0, 0, N, g), 0);
    assert_true(psd_cons_ready(&c, t, 3, 0, N));
    assert_int_equal(t->steps, 4); /* applied on arrival */
    drop(&c, t);
    struct psd_cons a = {PSD_ASP, 0, 1};
    t = make(&a);
    assert_int_equal(push(&a, t, 7, 5, 2, 3, g), 0); /* any worker, any clock, any range */
    assert_true(psd_cons_ready(&a, t, 1000, 0, N));
    drop(&a, t);
}

/* asp/ssp: the optimizer's step counts a worker's passes over the table,
 * so a gradient sent in chunks (psworker's, in order) takes the step one
 * push of it would, to the bit (Adam's bias correction and the cosine
 * schedule read it). */
static void test_asp_steps_count_passes(void **state)
{
    (void)state;
    struct psd_cons a = {PSD_ASP, 0, 2};
    float g[3][N];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < N; i++)
            g[k][i] = 0.1f * (float)(i + 1) - 0.2f * (float)k;
    struct psd_table *whole = make_opt(&a, 1), *cut = make_opt(&a, 1);
    for (uint64_t k = 0; k < 3; k++) {
        assert_int_equal(push(&a, whole, 0, k, 0, N, g[k]), 0);
        assert_int_equal(push(&a, cut, 0, k, 0, 4, g[k]), 0);
        assert_int_equal(push(&a, cut, 0, k, 4, 3, g[k]), 0);
        assert_int_equal(push(&a, cut, 0, k, 7, 3, g[k]), 0);
    }
    assert_int_equal(whole->steps, 3);
    assert_int_equal(cut->steps, 3);
    assert_memory_equal(whole->w, cut->w, N * sizeof(float));
    assert_true(whole->w[0] != 1.0f);
    /* two workers' chunks interleaved, two rounds: a step per pass of each */
    for (uint64_t k = 0; k < 2; k++) {
        for (uint32_t w = 0; w < 2; w++)
            assert_int_equal(push(&a, cut, w, 3 + k, 0, 5, g[0]), 0);
        for (uint32_t w = 0; w < 2; w++)
            assert_int_equal(push(&a, cut, w, 3 + k, 5, 5, g[0]), 0);
    }
    assert_int_equal(cut->steps, 7);
    /* the same range again is a new pass; so is a range below the last end */
    assert_int_equal(push(&a, cut, 0, 9, 5, 5, g[0]), 0);
    assert_int_equal(cut->steps, 8);
    assert_int_equal(push(&a, cut, 0, 9, 2, 1, g[0]), 0);
    assert_int_equal(cut->steps, 9);
    /* a keyed push is a pass of its own, and the range push after it too */
    const uint64_t k0[1] = {6};
    int applied = 0;
    assert_int_equal(push_keys(&a, cut, 0, 9, k0, g[1], 1, &applied), 0);
    assert_int_equal(cut->steps, 10);
    assert_int_equal(push(&a, cut, 0, 9, 8, 2, g[0]), 0);
    assert_int_equal(cut->steps, 11);
    /* a worker id past --workers (asp takes any): every push a pass */
    assert_int_equal(push(&a, cut, 7, 0, 0, 5, g[0]), 0);
    assert_int_equal(push(&a, cut, 7, 0, 5, 5, g[0]), 0);
    assert_int_equal(cut->steps, 13);
    /* unless its pieces say they continue one request: a pass each */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(piece(&a, cut, 7, 0, 0, 4, g[0], 0), 0);
        assert_int_equal(piece(&a, cut, 7, 0, 4, 3, g[0], 1), 0);
        assert_int_equal(piece(&a, cut, 7, 0, 7, 3, g[0], 1), 0);
    }
    assert_int_equal(cut->steps, 15);
    /* a tracked worker's piece sent again out of order (after a restart)
     * stays in its pass too */
    assert_int_equal(piece(&a, cut, 1, 0, 0, 4, g[0], 0), 0);
    assert_int_equal(piece(&a, cut, 1, 0, 7, 3, g[0], 1), 0);
    assert_int_equal(piece(&a, cut, 1, 0, 4, 3, g[0], 1), 0);
    assert_int_equal(cut->steps, 16);
    drop(&a, whole);
    drop(&a, cut);
}

static void test_keyed_push_equals_dense_zeros(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 2};
    float g0[N] = {0}, g1[N] = {0};
    g0[2] = 0.5f;
    g0[7] = -1.0f;
    g1[7] = 0.25f;
    struct psd_table *dense = make(&c), *keyed = make(&c);
    assert_int_equal(push(&c, dense, 0, 0, 0, N, g0), 0);
    assert_int_equal(push(&c, dense, 1, 0, 0, N, g1), 0);
    const uint64_t k0[2] = {2, 7}, k1[1] = {7};
    const float v0[2] = {0.5f, -1.0f}, v1[1] = {0.25f};
    int applied = 0;
    assert_int_equal(push_keys(&c, keyed, 1, 0, k1, v1, 1, &applied), 0);
    assert_false(applied); /* waits for worker 0 */
    assert_int_equal(push_keys(&c, keyed, 0, 0, k0, v0, 2, &applied), 0);
    assert_true(applied);
    assert_int_equal(keyed->clock, 1);
    assert_memory_equal(dense->w, keyed->w, N * sizeof(float));
    /* a second keyed push in the same clock is refused */
    assert_int_equal(push_keys(&c, keyed, 0, 0, k0, v0, 2, &applied), PS_ESTATE);
    drop(&c, dense);
    drop(&c, keyed);
}

static int leave(const struct psd_cons *c, struct psd_table *t, uint32_t w)
{
    int applied = 0;
    psd_cons_leave(c, t, w, &applied);
    return applied;
}

/* A worker dropped mid-round: the round completes with the others, the
 * part already applied keeps its gradient, the rest averages without it. */
static void test_bsp_leave_and_rejoin(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 2};
    float g0[N], g1[N];
    for (int i = 0; i < N; i++) {
        g0[i] = 0.2f;
        g1[i] = 0.6f;
    }
    struct psd_table *t = make(&c);
    assert_int_equal(push(&c, t, 1, 0, 0, 4, g1), 0);
    assert_int_equal(push(&c, t, 0, 0, 0, N, g0), 0);
    assert_int_equal(t->watermark, 4); /* [0, 4) applied with both */
    assert_true(leave(&c, t, 1));      /* worker 1 is gone: the round closes */
    assert_int_equal(t->clock, 1);
    for (int i = 0; i < N; i++)
        assert_float_equal(t->w[i], 1.0f - 0.5f * (i < 4 ? 0.4f : 0.2f), 1e-6);
    assert_int_equal(psd_cons_join_clock(&c, t, 0), 1); /* a member: where it is */
    assert_int_equal(psd_cons_join_clock(&c, t, 1), 3); /* two rounds ahead */
    /* a non-member's push of another clock: dropped; of this clock but not
     * at the start, before the round began: not yet (its start may come) */
    assert_int_equal(push(&c, t, 1, 0, 4, 6, g1), PSD_CONS_STALE);
    assert_int_equal(push(&c, t, 1, 1, 4, 6, g1), PS_EAGAIN);
    /* round 1 goes on without it, once worker 0 has pushed a part */
    assert_int_equal(push(&c, t, 0, 1, 0, 2, g0), 0);
    assert_int_equal(t->watermark, 2);
    assert_int_equal(push(&c, t, 1, 1, 0, N, g1), PSD_CONS_STALE); /* mid-round */
    assert_int_equal(push(&c, t, 0, 1, 2, 8, g0), 0);
    assert_int_equal(t->clock, 2);
    /* at the start of round 2 it joins: the round waits for it again */
    assert_int_equal(push(&c, t, 1, 2, 0, 5, g1), 0);
    assert_int_equal(push(&c, t, 0, 2, 0, N, g0), 0);
    assert_int_equal(t->clock, 2);
    assert_int_equal(t->watermark, 5);
    char who[64];
    psd_cons_missing(&c, t, 3, who, sizeof who);
    assert_string_equal(who, "1");
    assert_int_equal(push(&c, t, 1, 2, 5, 5, g1), 0);
    assert_int_equal(t->clock, 3);
    /* nobody left: nothing is applied, nothing is waited for */
    assert_int_equal(push(&c, t, 0, 3, 0, 3, g0), 0);
    leave(&c, t, 0);
    leave(&c, t, 1);
    assert_int_equal(t->clock, 3);
    assert_int_equal(t->watermark, 0);
    psd_cons_missing(&c, t, 4, who, sizeof who);
    assert_string_equal(who, "");
    /* a pull answered at a round boundary makes a member; mid-round not */
    psd_cons_pulled(&c, t, 0, 3);
    assert_int_equal(push(&c, t, 0, 3, 0, N, g0), 0);
    assert_int_equal(t->clock, 4); /* alone in the round */
    psd_cons_pulled(&c, t, 1, 4);
    assert_int_equal(push(&c, t, 0, 4, 0, N, g0), 0);
    assert_int_equal(t->clock, 4); /* round 4 waits for worker 1 now */
    assert_int_equal(push(&c, t, 1, 4, 0, N, g1), 0);
    assert_int_equal(t->clock, 5);
    leave(&c, t, 1);
    assert_int_equal(push(&c, t, 0, 5, 0, 3, g0), 0);
    psd_cons_pulled(&c, t, 1, 5); /* round 5 has begun: too late */
    assert_int_equal(push(&c, t, 0, 5, 3, 7, g0), 0);
    assert_int_equal(t->clock, 6);
    drop(&c, t);
}

/* A table its spec says workers 0 and 2 of 4 push (a pipeline stage's
 * processes): in bsp its rounds close with their pushes alone, a pull by
 * another worker waits for them and never makes it a member, its push is
 * refused naming the table, and a pusher that leaves and comes back
 * rejoins; in ssp the bound is over the pushers alone. */
static void test_pushers_alone_make_rounds(void **state)
{
    (void)state;
    const uint32_t stage[] = {0, 2};
    for (int mode = 0; mode < 2; mode++) {
        struct psd_cons c = {mode ? PSD_SSP : PSD_BSP, 0, 4};
        Ps__TableSpec sp;
        case_table_spec(&sp, "stage0", N);
        sp.pushers = (uint32_t *)stage;
        sp.n_pushers = 2;
        struct psd_table *t = NULL;
        assert_int_equal(psd_table_create(&sp, 0, 0, 1, &t), 0);
        assert_int_equal(psd_cons_table_init(&c, t), 0);
        assert_true(psd_table_pushed_by(t, 0) && psd_table_pushed_by(t, 2));
        assert_false(psd_table_pushed_by(t, 1) || psd_table_pushed_by(t, 3));
        assert_int_equal(psd_table_same_spec(t, &sp), 1);
        float g[N];
        for (int i = 0; i < N; i++)
            g[i] = 0.5f;
        char who[64];
        psd_cons_missing(&c, t, 1, who, sizeof who);
        assert_string_equal(who, "0, 2");
        assert_int_equal(psd_cons_ready(&c, t, 1, 0, N), 0);
        assert_int_equal(push(&c, t, 0, 0, 0, N, g), 0);
        assert_int_equal(psd_cons_ready(&c, t, 1, 0, N), 0);
        psd_cons_pulled(&c, t, 1, 0); /* worker 1 reads it: no member for that */
        assert_int_equal(push(&c, t, 2, 0, 0, N, g), 0);
        assert_int_equal(psd_cons_ready(&c, t, 1, 0, N), 1); /* 0 and 2 alone */
        if (mode == 0)
            assert_int_equal(t->clock, 1);
        assert_int_equal(push(&c, t, 1, 1, 0, N, g), PS_EINVAL);
        char err[256];
        const struct psd_cons_push p = {.worker = 3, .clock = 1, .count = N, .g = g};
        int applied = 0;
        assert_int_equal(psd_cons_push(&c, t, &p, &applied, NULL, err, sizeof err), PS_EINVAL);
        assert_non_null(strstr(err, "worker 3 does not push 'stage0'"));
        /* pusher 2 leaves: the rounds go on with 0; back at a boundary, it
         * is waited for again */
        leave(&c, t, 2);
        assert_int_equal(push(&c, t, 0, 1, 0, N, g), 0);
        assert_int_equal(psd_cons_ready(&c, t, 2, 0, N), 1);
        assert_int_equal(push(&c, t, 2, 2, 0, N, g), 0);
        assert_int_equal(psd_cons_ready(&c, t, 3, 0, N), 0);
        psd_cons_missing(&c, t, 3, who, sizeof who);
        assert_string_equal(who, "0");
        sp.n_pushers = 1; /* another set is another spec */
        assert_int_equal(psd_table_same_spec(t, &sp), 0);
        drop(&c, t);
    }
}

/* Pushers must be workers of the rounds. */
static void test_pushers_checked_against_workers(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_BSP, 0, 3};
    const uint32_t ok[] = {0, 2}, past[] = {1, 3};
    Ps__TableSpec sp;
    case_table_spec(&sp, "t", N);
    char err[256];
    sp.pushers = (uint32_t *)ok;
    sp.n_pushers = 2;
    assert_int_equal(psd_cons_check_pushers(&c, &sp, err, sizeof err), 0);
    sp.pushers = (uint32_t *)past;
    assert_int_equal(psd_cons_check_pushers(&c, &sp, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "pusher 3 is not one of the 3 workers"));
}

static void test_ssp_leave_and_rejoin(void **state)
{
    (void)state;
    struct psd_cons c = {PSD_SSP, 1, 2};
    float g[N] = {0};
    struct psd_table *t = make(&c);
    for (uint64_t k = 0; k < 4; k++)
        assert_int_equal(push(&c, t, 0, k, 0, N, g), 0);
    assert_false(psd_cons_ready(&c, t, 4, 0, N)); /* worker 1 is at clock 0 */
    assert_true(leave(&c, t, 1));
    assert_true(psd_cons_ready(&c, t, 4, 0, N));
    assert_int_equal(psd_cons_join_clock(&c, t, 1), 4);
    /* a push joins it again: the bound counts it from there */
    assert_int_equal(push(&c, t, 1, 4, 0, N, g), 0);
    assert_int_equal(psd_cons_clock(&c, t), 4);
    assert_true(psd_cons_ready(&c, t, 5, 0, N));
    assert_false(psd_cons_ready(&c, t, 6, 0, N));
    drop(&c, t);
    struct psd_cons a = {PSD_ASP, 0, 2};
    t = make(&a);
    assert_int_equal(push(&a, t, 1, 6, 0, N, g), 0);
    assert_int_equal(psd_cons_join_clock(&a, t, 1), 7); /* its own position */
    assert_int_equal(psd_cons_join_clock(&a, t, 0), 0);
    drop(&a, t);
}

/* The slowest member's clock, as asp and ssp answer with it: kept
 * between requests instead of scanned, it must equal a scan of every
 * worker after any sequence of pushes (in and out of order, keyed and
 * ranged), leaves, rejoins and changes made from outside
 * (psd_cons_touched). */
static uint64_t scanned_clock(const struct psd_cons *c, const struct psd_table *t)
{
    uint64_t m = UINT64_MAX, most = 0;
    for (uint32_t w = 0; w < c->workers; w++) {
        most = t->completed[w] > most ? t->completed[w] : most;
        if (t->member[w] && t->completed[w] < m)
            m = t->completed[w];
    }
    return m == UINT64_MAX ? most : m;
}

static void test_slowest_member_kept(void **state)
{
    (void)state;
    const struct psd_cons modes[2] = {{PSD_ASP, 0, 37}, {PSD_SSP, 3, 37}};
    float g[N] = {0};
    uint64_t k1[1] = {2};
    uint64_t seed = 11;
    for (int m = 0; m < 2; m++) {
        const struct psd_cons *c = &modes[m];
        struct psd_table *t = make(c);
        for (int step = 0; step < 20000; step++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            uint32_t r = (uint32_t)(seed >> 33), w = r % c->workers;
            uint64_t clock =
                t->completed[w] + (r >> 8) % 3 - (t->completed[w] > 0 && (r >> 8) % 7 == 0);
            int applied = 0;
            switch ((r >> 16) % 16) {
            case 0:
                psd_cons_leave(c, t, w, &applied);
                break;
            case 1: /* a restore or a reshard changed the clocks */
                t->completed[w] = (r >> 4) % 64;
                psd_cons_touched(t);
                break;
            case 2:
                assert_int_equal(push_keys(c, t, w, clock, k1, g, 1, &applied), 0);
                break;
            default:
                assert_int_equal(push(c, t, w, clock, 0, N, g), 0);
                break;
            }
            if (psd_cons_clock(c, t) != scanned_clock(c, t))
                fail_msg("%s, step %d: the slowest member's clock is %llu, a scan says %llu",
                         m ? "ssp" : "asp", step, (unsigned long long)psd_cons_clock(c, t),
                         (unsigned long long)scanned_clock(c, t));
        }
        drop(c, t);
    }
}

static void test_parse(void **state)
{
    (void)state;
    struct psd_cons c;
    char name[32];
    assert_int_equal(psd_cons_parse("ssp:3", &c), 0);
    psd_cons_name(&c, name, sizeof name);
    assert_string_equal(name, "ssp:3");
    assert_int_equal(psd_cons_parse("ssp:1000000", &c), 0);
    assert_int_equal(psd_cons_parse("ssp:1000001", &c), PS_EINVAL);
    assert_int_equal(psd_cons_parse("ssp:", &c), PS_EINVAL);
    assert_int_equal(psd_cons_parse("bsp2", &c), PS_EINVAL);
    assert_int_equal(psd_cons_parse("bsp", &c), 0);
    assert_int_equal(c.mode, PSD_BSP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reachable_clocks),
        cmocka_unit_test(test_join_clock_without_members),
        cmocka_unit_test(test_bsp_watermark),
        cmocka_unit_test(test_bsp_refusals),
        cmocka_unit_test(test_bsp_chunk_before_lost_one),
        cmocka_unit_test(test_bsp_restored_worker_ahead),
        cmocka_unit_test(test_ssp_and_asp),
        cmocka_unit_test(test_asp_steps_count_passes),
        cmocka_unit_test(test_keyed_push_equals_dense_zeros),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_bsp_leave_and_rejoin),
        cmocka_unit_test(test_ssp_leave_and_rejoin),
        cmocka_unit_test(test_slowest_member_kept),
        cmocka_unit_test(test_pushers_alone_make_rounds),
        cmocka_unit_test(test_pushers_checked_against_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
