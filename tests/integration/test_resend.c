/* Requests lost on the way to a real psd (bsp, one worker), through a
 * proxy that drops the first copy of a chosen push, as a restarted shard
 * loses what was in flight:
 *  - the client re-sends a lost request even while it waits on another
 *    ticket (a pull of the next clock that the lost push alone can let
 *    through);
 *  - a bsp chunk that arrives before the chunk it follows is refused as
 *    "not yet" (PS_EAGAIN), not failed, and goes again after that one;
 *  - a lost push re-sent after later ones were applied is applied.
 * Every push is applied exactly once: the weights say so. */
#include "harness.h"
#include "proxy.h"
#include "psclient.h"

#include "ps_err.h"
#include "ps_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define N          8
#define RETRY_MS   100
#define TIMEOUT_MS 20000

/* What the proxy saw of one client's pushes: it drops the first push
 * whose offset is drop_offset and counts pushes by offset. */
struct seen {
    uint64_t drop_offset;
    atomic_int dropped;
    atomic_int pushes_at[N];
};

static enum proxy_act on_request(void *arg, const Ps__Header *h)
{
    struct seen *p = arg;
    if (h == NULL || h->op != PS__OP__OP_PUSH || h->offset >= N)
        return PROXY_PASS;
    atomic_fetch_add(&p->pushes_at[h->offset], 1);
    if (h->offset != p->drop_offset || atomic_load(&p->dropped))
        return PROXY_PASS;
    atomic_store(&p->dropped, 1);
    return PROXY_DROP;
}

struct fixture {
    struct psd_proc shard;
    struct proxy px;
    struct seen proxy;
    struct psc_client *c;
    uint32_t t;
};

static void setup(struct fixture *f, uint64_t drop_offset)
{
    const char *args[] = {"--consistency", "bsp", "--workers", "1", NULL};
    assert_int_equal(harness_psd_start(&f->shard, args), 0);
    memset(&f->proxy, 0, sizeof f->proxy);
    f->proxy.drop_offset = drop_offset;
    proxy_start(&f->px, f->shard.endpoint, on_request, NULL, &f->proxy);
    const char *eps[1] = {f->px.endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 1,
                             .worker_id = 0,
                             .connect_timeout_ms = TIMEOUT_MS,
                             .retry_ms = RETRY_MS};
    char err[512];
    if (psc_create(&cfg, &f->c, err, sizeof err) != 0)
        fail_msg("psc_create: %s", err);
    struct psc_table_spec s;
    psc_table_spec_init(&s, "t", N);
    s.lr = 1.0f;
    s.init = PSC_INIT_ZEROS;
    if (psc_table_create(f->c, &s, TIMEOUT_MS, &f->t) != 0)
        fail_msg("create: %s", psc_last_error(f->c));
}

static void teardown(struct fixture *f)
{
    psc_destroy(f->c);
    proxy_stop(&f->px);
    if (harness_psd_stop(&f->shard) != 0) {
        harness_psd_dump_log(&f->shard);
        fail_msg("psd did not exit cleanly");
    }
}

static void wait_ok(struct fixture *f, uint64_t ticket, const char *what)
{
    if (psc_wait(f->c, ticket, TIMEOUT_MS) != 0) {
        harness_psd_dump_log(&f->shard);
        fail_msg("%s: %s", what, psc_last_error(f->c));
    }
}

/* Pull of clock 1 first, then the push of clock 0 that it waits for; the
 * push is lost once. Waiting on the pull alone must get the push re-sent. */
static void test_lost_push_behind_a_waiting_pull(void **state)
{
    (void)state;
    static struct fixture f;
    setup(&f, 0);
    float g[N], w[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)(i + 1);
    uint64_t pull = 0, push = 0;
    assert_int_equal(psc_pull(f.c, f.t, 0, N, w, 1, &pull), 0);
    assert_int_equal(psc_push(f.c, f.t, 0, N, g, 0, &push), 0);
    wait_ok(&f, pull, "pull of clock 1");
    wait_ok(&f, push, "push of clock 0");
    for (int i = 0; i < N; i++)
        assert_float_equal(w[i], -g[i], 0); /* applied once */
    assert_true(atomic_load(&f.proxy.dropped));
    assert_int_equal(atomic_load(&f.proxy.pushes_at[0]), 2); /* lost, and re-sent once */
    assert_true(psc_resends(f.c) >= 1);
    teardown(&f);
}

/* The first chunk of a round is lost; the second arrives first and is
 * refused as not yet; both go again and the round closes with both. */
static void test_chunk_before_the_lost_one(void **state)
{
    (void)state;
    static struct fixture f;
    setup(&f, 0);
    float g[N], w[N];
    for (int i = 0; i < N; i++)
        g[i] = 0.5f * (float)(i + 1);
    uint64_t a = 0, b = 0, pull = 0;
    assert_int_equal(psc_push(f.c, f.t, 0, N / 2, g, 0, &a), 0);
    assert_int_equal(psc_push(f.c, f.t, N / 2, N / 2, g + N / 2, 0, &b), 0);
    assert_int_equal(psc_pull(f.c, f.t, 0, N, w, 1, &pull), 0);
    wait_ok(&f, b, "second chunk");
    wait_ok(&f, a, "first chunk");
    wait_ok(&f, pull, "pull of clock 1");
    for (int i = 0; i < N; i++)
        assert_float_equal(w[i], -g[i], 0);
    assert_int_equal(atomic_load(&f.proxy.pushes_at[0]), 2);
    assert_true(atomic_load(&f.proxy.pushes_at[N / 2]) >= 2); /* refused once at least */
    teardown(&f);
}

/* A push lost while the next one, to another table, gets through: the
 * retry of the first comes after a later id was applied, and must still
 * be applied (not taken for a copy). */
static void test_lost_push_then_another_table(void **state)
{
    (void)state;
    static struct fixture f;
    setup(&f, 0);
    struct psc_table_spec s;
    psc_table_spec_init(&s, "u", N);
    uint32_t u = 0;
    if (psc_table_create(f.c, &s, TIMEOUT_MS, &u) != 0)
        fail_msg("create: %s", psc_last_error(f.c));
    float g[N], w[N];
    for (int i = 0; i < N; i++)
        g[i] = 2.0f - (float)i;
    uint64_t a = 0, b = 0, pull = 0;
    assert_int_equal(psc_push(f.c, f.t, 0, N, g, 0, &a), 0); /* lost once */
    assert_int_equal(psc_push(f.c, u, 0, N, g, 0, &b), 0);
    wait_ok(&f, b, "push to u");
    wait_ok(&f, a, "push to t");
    assert_int_equal(psc_pull(f.c, f.t, 0, N, w, 1, &pull), 0);
    wait_ok(&f, pull, "pull of t at clock 1");
    for (int i = 0; i < N; i++)
        assert_float_equal(w[i], -g[i], 0);
    assert_int_equal(atomic_load(&f.proxy.pushes_at[0]), 3);
    teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_push_behind_a_waiting_pull),
        cmocka_unit_test(test_chunk_before_the_lost_one),
        cmocka_unit_test(test_lost_push_then_another_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
