/* Pulls of what changed (psc_mirror_*) against real psd shards:
 *  - after keyed pushes, a mirror's pull leaves exactly the values a whole
 *    pull gets, and moves a small part of the bytes;
 *  - through a proxy that loses, repeats and delays pull replies, while
 *    another client pushes during the pulls, a mirror never holds values
 *    that differ from the shard's once its pull is answered;
 *  - bsp rounds of keyed pushes from two workers bring only what changed
 *    under plain SGD, and whole parts under momentum;
 *  - a shard whose table is another object (a restart, a replica that took
 *    over: the proxy moves to a second psd) answers whole, and the mirror
 *    takes its values;
 *  - what a caller may not do is refused (a second pull in flight, a
 *    sparse table, a range outside the table). */
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

#define N          20000u
#define TIMEOUT_MS 20000
#define RETRY_MS   60

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s >> 33;
}

/* k distinct keys below n, increasing, and a gradient for each. */
static size_t pick_keys(uint64_t *rng, uint64_t *keys, float *g, size_t k, uint64_t n)
{
    static uint8_t taken[N];
    memset(taken, 0, sizeof taken);
    for (size_t i = 0; i < k; i++)
        taken[rng_next(rng) % n] = 1;
    size_t m = 0;
    for (uint64_t e = 0; e < n; e++)
        if (taken[e]) {
            keys[m] = e;
            g[m++] = (float)((int)(rng_next(rng) % 2001) - 1000) / 1000.0f;
        }
    return m;
}

static struct psc_client *client(const char *const *eps, size_t n, uint32_t worker, int retry_ms)
{
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = n,
                             .worker_id = worker,
                             .connect_timeout_ms = TIMEOUT_MS,
                             .retry_ms = retry_ms};
    struct psc_client *c = NULL;
    char err[512];
    if (psc_create(&cfg, &c, err, sizeof err) != 0)
        fail_msg("psc_create: %s", err);
    return c;
}

static uint32_t table(struct psc_client *c, const char *name, uint64_t size)
{
    struct psc_table_spec s;
    psc_table_spec_init(&s, name, size);
    s.lr = 0.5f;
    s.init = PSC_INIT_UNIFORM;
    s.init_scale = 0.1f;
    s.seed = 11;
    uint32_t t = 0;
    if (psc_table_create(c, &s, TIMEOUT_MS, &t) != 0)
        fail_msg("create '%s': %s", name, psc_last_error(c));
    return t;
}

static void wait_ok(struct psc_client *c, uint64_t ticket, const char *what)
{
    int rc = psc_wait(c, ticket, TIMEOUT_MS);
    if (rc != 0)
        fail_msg("%s: %s (%s)", what, psc_err_name(rc), psc_last_error(c));
}

static void push_keys(struct psc_client *c, uint32_t t, uint64_t *rng, size_t k)
{
    static uint64_t keys[N];
    static float g[N];
    size_t m = pick_keys(rng, keys, g, k, N);
    uint64_t tk = 0;
    assert_int_equal(psc_push_keys(c, t, keys, g, m, 0, &tk), 0);
    wait_ok(c, tk, "keyed push");
}

/* The whole table by a plain pull. */
static void pull_whole(struct psc_client *c, uint32_t t, float *out)
{
    uint64_t tk = 0;
    assert_int_equal(psc_pull(c, t, 0, N, out, 0, &tk), 0);
    wait_ok(c, tk, "whole pull");
}

static void assert_same(const float *a, const float *b, const char *when)
{
    for (uint64_t e = 0; e < N; e++)
        if (memcmp(&a[e], &b[e], sizeof *a) != 0)
            fail_msg("%s: element %llu is %.9g in the mirror, %.9g on the shards", when,
                     (unsigned long long)e, (double)a[e], (double)b[e]);
}

static uint64_t received(const struct psc_client *c)
{
    uint64_t s = 0, r = 0;
    psc_bytes(c, &s, &r);
    return r;
}

static void test_mirror_matches_whole_pulls(void **state)
{
    (void)state;
    struct psd_proc sh[2];
    const char *a0[] = {"--shard", "0", "--shards", "2", "--consistency", "asp", NULL};
    const char *a1[] = {"--shard", "1", "--shards", "2", "--consistency", "asp", NULL};
    assert_int_equal(harness_psd_start(&sh[0], a0), 0);
    assert_int_equal(harness_psd_start(&sh[1], a1), 0);
    const char *eps[2] = {sh[0].endpoint, sh[1].endpoint};
    struct psc_client *c = client(eps, 2, 0, 0);
    uint32_t t = table(c, "w", N);
    static float mine[N], theirs[N];
    struct psc_mirror *m = NULL;
    assert_int_equal(psc_mirror_open(c, t, 0, N, mine, &m), 0);
    uint64_t rng = 42, changed = 0, whole = 0, tk = 0;
    uint64_t mirror_bytes = 0, whole_bytes = 0;
    for (int step = 0; step < 30; step++) {
        push_keys(c, t, &rng, N / 100);
        uint64_t r0 = received(c);
        assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
        wait_ok(c, tk, "mirror pull");
        uint64_t r1 = received(c);
        pull_whole(c, t, theirs);
        if (step > 0) {
            mirror_bytes += r1 - r0;
            whole_bytes += received(c) - r1;
        }
        assert_same(mine, theirs, "after a mirror pull");
    }
    psc_mirror_counts(m, &changed, &whole);
    assert_int_equal(whole, 2);        /* each shard's part once, the first time */
    assert_int_equal(changed, 2 * 29); /* then the changes alone */
    print_message("      mirror pulls moved %llu bytes, whole pulls %llu (%.1f%%)\n",
                  (unsigned long long)mirror_bytes, (unsigned long long)whole_bytes,
                  100.0 * (double)mirror_bytes / (double)whole_bytes);
    assert_true(mirror_bytes * 5 < whole_bytes); /* 1% changed: a bitmap and 1% of values */

    /* nothing changed: the bitmap alone */
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
    wait_ok(c, tk, "mirror pull with nothing changed");
    assert_same(mine, theirs, "with nothing changed");

    /* a dense push changes everything: the whole parts come back */
    static float g[N];
    for (uint64_t e = 0; e < N; e++)
        g[e] = 0.001f * (float)(e % 7 + 1); /* nowhere zero: every weight moves */
    assert_int_equal(psc_push(c, t, 0, N, g, 0, &tk), 0);
    wait_ok(c, tk, "dense push");
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
    wait_ok(c, tk, "mirror pull after a dense push");
    pull_whole(c, t, theirs);
    assert_same(mine, theirs, "after a dense push");
    psc_mirror_counts(m, &changed, &whole);
    assert_int_equal(whole, 4);

    /* the caller wrote the buffer: reset, and the next pull is whole */
    memset(mine, 0, sizeof mine);
    psc_mirror_reset(m);
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
    wait_ok(c, tk, "mirror pull after a reset");
    assert_same(mine, theirs, "after a reset");
    psc_mirror_counts(m, &changed, &whole);
    assert_int_equal(whole, 6);

    /* one pull at a time; a second is refused, the first still answered */
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
    uint64_t tk2 = 0;
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk2), PS_EBUSY);
    assert_non_null(strstr(psc_last_error(c), "still outstanding"));
    wait_ok(c, tk, "the first pull");
    /* closing with a pull in flight cancels it */
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
    assert_int_equal(psc_mirror_close(c, m), 0);
    assert_int_equal(psc_wait(c, tk, 0), PS_EINVAL); /* no longer outstanding */

    /* refused at open: sparse tables, ranges outside the table, NULL */
    struct psc_table_spec s;
    psc_table_spec_init(&s, "rows", 0);
    s.sparse = 1;
    s.dim = 4;
    s.rows_max = 100;
    uint32_t sp = 0;
    assert_int_equal(psc_table_create(c, &s, TIMEOUT_MS, &sp), 0);
    assert_int_equal(psc_mirror_open(c, sp, 0, 4, mine, &m), PS_EINVAL);
    assert_non_null(strstr(psc_last_error(c), "sparse"));
    assert_int_equal(psc_mirror_open(c, t, N - 1, 2, mine, &m), PS_ERANGE);
    assert_int_equal(psc_mirror_open(c, t, 0, N, NULL, &m), PS_EINVAL);
    /* left open: psc_destroy closes it */
    assert_int_equal(psc_mirror_open(c, t, 100, 1000, mine, &m), 0);
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&sh[0]), 0);
    assert_int_equal(harness_psd_stop(&sh[1]), 0);
}

/* bsp with two workers: a round of keyed pushes is applied as the
 * workers' dense mean, zero outside their keys; with plain SGD only the
 * keys change, and that is all a pull brings. With momentum every weight
 * moves each round, and pulls come whole (and still right). */
static void bsp_rounds(const char *optimizer, uint64_t *changed, uint64_t *whole)
{
    struct psd_proc sh;
    const char *args[] = {"--consistency", "bsp", "--workers", "2", NULL};
    assert_int_equal(harness_psd_start(&sh, args), 0);
    const char *eps[1] = {sh.endpoint};
    struct psc_client *c[2] = {client(eps, 1, 0, 0), client(eps, 1, 1, 0)};
    static float w[2][N], theirs[N];
    struct psc_mirror *m[2];
    uint32_t t[2];
    for (int i = 0; i < 2; i++) {
        struct psc_table_spec s;
        psc_table_spec_init(&s, "w", N);
        s.optimizer = strcmp(optimizer, "sgd") == 0 ? PSC_SGD : PSC_MOMENTUM;
        s.lr = 0.5f;
        s.init = PSC_INIT_UNIFORM;
        s.init_scale = 0.1f;
        if (psc_table_create(c[i], &s, TIMEOUT_MS, &t[i]) != 0)
            fail_msg("create: %s", psc_last_error(c[i]));
        assert_int_equal(psc_mirror_open(c[i], t[i], 0, N, w[i], &m[i]), 0);
    }
    uint64_t rng = 9, tk[2];
    static uint64_t keys[N];
    static float g[N];
    for (uint64_t clock = 0; clock < 10; clock++) {
        for (int i = 0; i < 2; i++) {
            size_t k = pick_keys(&rng, keys, g, N / 100, N);
            assert_int_equal(psc_push_keys(c[i], t[i], keys, g, k, clock, &tk[i]), 0);
        }
        for (int i = 0; i < 2; i++)
            wait_ok(c[i], tk[i], "bsp keyed push");
        for (int i = 0; i < 2; i++)
            assert_int_equal(psc_mirror_pull(c[i], m[i], clock + 1, &tk[i]), 0);
        for (int i = 0; i < 2; i++)
            wait_ok(c[i], tk[i], "bsp mirror pull");
        assert_int_equal(psc_pull(c[0], t[0], 0, N, theirs, clock + 1, &tk[0]), 0);
        wait_ok(c[0], tk[0], "bsp whole pull");
        assert_same(w[0], theirs, "worker 0 after a bsp round");
        assert_same(w[1], theirs, "worker 1 after a bsp round");
    }
    psc_mirror_counts(m[1], changed, whole);
    psc_destroy(c[0]);
    psc_destroy(c[1]);
    assert_int_equal(harness_psd_stop(&sh), 0);
}

static void test_bsp_rounds_of_keyed_pushes(void **state)
{
    (void)state;
    uint64_t changed = 0, whole = 0;
    bsp_rounds("sgd", &changed, &whole);
    assert_int_equal(whole, 1);
    assert_int_equal(changed, 9);
    bsp_rounds("momentum", &changed, &whole);
    assert_int_equal(whole, 10);
    assert_int_equal(changed, 0);
}

/* Pull replies lost, repeated or held back behind the next reply, on a
 * seeded schedule, while lossy is set. */
struct faults {
    uint64_t rng;
    atomic_int lossy;
    atomic_int lost, repeated;
};

static enum proxy_act on_reply(void *arg, const Ps__Header *h)
{
    struct faults *f = arg;
    if (h == NULL || h->op != PS__OP__OP_PULL || h->status != 0 || !atomic_load(&f->lossy))
        return PROXY_PASS;
    uint64_t roll = rng_next(&f->rng) % 100;
    if (roll < 25) {
        atomic_fetch_add(&f->lost, 1);
        return PROXY_DROP;
    }
    if (roll < 40) {
        atomic_fetch_add(&f->repeated, 1);
        return PROXY_REPEAT;
    }
    return roll < 55 ? PROXY_HOLD : PROXY_PASS;
}

static void test_lost_repeated_and_late_replies(void **state)
{
    (void)state;
    struct psd_proc sh;
    const char *args[] = {"--consistency", "asp", "--workers", "2", NULL};
    assert_int_equal(harness_psd_start(&sh, args), 0);
    static struct proxy px;
    static struct faults fx;
    fx.rng = 7;
    proxy_start(&px, sh.endpoint, NULL, on_reply, &fx);
    const char *via[1] = {px.endpoint}, *direct[1] = {sh.endpoint};
    struct psc_client *c = client(via, 1, 0, RETRY_MS);
    struct psc_client *pusher = client(direct, 1, 1, 0);
    uint32_t t = table(c, "w", N), tp = table(pusher, "w", N);
    static float mine[N], theirs[N];
    struct psc_mirror *m = NULL;
    assert_int_equal(psc_mirror_open(c, t, 0, N, mine, &m), 0);
    atomic_store(&fx.lossy, 1);
    uint64_t rng = 5, tk = 0;
    for (int step = 0; step < 60; step++) {
        push_keys(pusher, tp, &rng, N / 100);
        assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
        /* the table moves on while the pull and its retries are out */
        push_keys(pusher, tp, &rng, N / 200);
        wait_ok(c, tk, "mirror pull through the lossy proxy");
        /* and once more with nothing pushed in between: then it must
         * hold what the shard holds */
        assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
        wait_ok(c, tk, "mirror pull through the lossy proxy");
        pull_whole(pusher, tp, theirs);
        assert_same(mine, theirs, "through the lossy proxy");
    }
    uint64_t changed = 0, whole = 0;
    psc_mirror_counts(m, &changed, &whole);
    print_message("      replies lost %d, repeated %d, held back %d; client resends %llu; parts "
                  "changed %llu, whole %llu\n",
                  atomic_load(&fx.lost), atomic_load(&fx.repeated), atomic_load(&px.held),
                  (unsigned long long)psc_resends(c), (unsigned long long)changed,
                  (unsigned long long)whole);
    assert_true(atomic_load(&fx.lost) > 5);
    assert_true(atomic_load(&fx.repeated) > 5);
    assert_true(atomic_load(&px.held) > 5);
    assert_true(psc_resends(c) >= (uint64_t)atomic_load(&fx.lost));
    assert_true(changed > 100);

    /* the shard is replaced by another process with the table of the same
     * name (a restart, a replica taking over): another generation, so the
     * next pull is whole, and the mirror holds the new shard's values */
    atomic_store(&fx.lossy, 0);
    struct psd_proc sh2;
    assert_int_equal(harness_psd_start(&sh2, args), 0);
    const char *direct2[1] = {sh2.endpoint};
    struct psc_client *p2 = client(direct2, 1, 1, 0);
    uint32_t t2 = table(p2, "w", N);
    push_keys(p2, t2, &rng, N / 100);
    proxy_retarget(&px, sh2.endpoint);
    uint64_t whole_before = whole;
    assert_int_equal(psc_mirror_pull(c, m, 0, &tk), 0);
    wait_ok(c, tk, "mirror pull from the new shard");
    pull_whole(p2, t2, theirs);
    assert_same(mine, theirs, "from another generation");
    psc_mirror_counts(m, &changed, &whole);
    assert_int_equal(whole, whole_before + 1);

    psc_destroy(p2);
    psc_destroy(pusher);
    psc_destroy(c);
    proxy_stop(&px);
    assert_int_equal(harness_psd_stop(&sh2), 0);
    assert_int_equal(harness_psd_stop(&sh), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mirror_matches_whole_pulls),
        cmocka_unit_test(test_bsp_rounds_of_keyed_pushes),
        cmocka_unit_test(test_lost_repeated_and_late_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
