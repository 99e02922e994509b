/* Two real psd shards on loopback, a 1M-float table, push / pull / push-pull
 * through libpsclient with every element checked; idempotent and
 * conflicting creates; client-side errors; timeouts; stats. */
#include "harness.h"
#include "psclient.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_half.h"
#include "ps_init.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_shard.h"
#include "ps_wire.h"

#include <math.h>

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

#define N          (1u << 20)
#define TIMEOUT_MS 10000

struct fixture {
    struct psd_proc shard[2];
    struct psc_client *c;
    uint32_t big;
};

static void big_spec(struct psc_table_spec *s)
{
    psc_table_spec_init(s, "big", N);
    s->lr = 0.5f;
    s->init = PSC_INIT_UNIFORM;
    s->init_scale = 0.1f;
    s->seed = 7;
}

static int setup(void **state)
{
    static struct fixture f;
    memset(&f, 0, sizeof f);
    const char *a0[] = {"--shard", "0", "--shards", "2", NULL};
    const char *a1[] = {"--shard", "1", "--shards", "2", NULL};
    if (harness_psd_start(&f.shard[0], a0) != 0 || harness_psd_start(&f.shard[1], a1) != 0)
        return -1;
    const char *eps[2] = {f.shard[0].endpoint, f.shard[1].endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 2,
                             .worker_id = 1,
                             .connect_timeout_ms = TIMEOUT_MS};
    char err[512];
    if (psc_create(&cfg, &f.c, err, sizeof err) != 0) {
        fprintf(stderr, "psc_create: %s\n", err);
        return -1;
    }
    struct psc_table_spec s;
    big_spec(&s);
    if (psc_table_create(f.c, &s, TIMEOUT_MS, &f.big) != 0) {
        fprintf(stderr, "create: %s\n", psc_last_error(f.c));
        return -1;
    }
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    psc_destroy(f->c);
    for (int i = 0; i < 2; i++) /* a test that failed with a shard stopped */
        kill(f->shard[i].pid, SIGCONT);
    int rc0 = harness_psd_stop(&f->shard[0]);
    int rc1 = harness_psd_stop(&f->shard[1]);
    if (rc0 != 0 || rc1 != 0) { /* a clean SIGTERM shutdown exits 0 */
        harness_psd_dump_log(&f->shard[0]);
        harness_psd_dump_log(&f->shard[1]);
        return -1;
    }
    return 0;
}

static void wait_ok(struct psc_client *c, uint64_t t)
{
    int rc = psc_wait(c, t, TIMEOUT_MS);
    if (rc != 0)
        fail_msg("wait: %s: %s", ps_err_name(rc), psc_last_error(c));
}

static float grad_of(uint64_t i, int round)
{
    return (float)((i * 2654435761u + (uint64_t)round * 97u) % 1000u) * 1e-4f - 0.05f;
}

static void test_pull_matches_init(void **state)
{
    struct fixture *f = *state;
    float *w = malloc(N * sizeof(float));
    uint64_t t;
    assert_int_equal(psc_pull(f->c, f->big, 0, N, w, 0, &t), 0);
    wait_ok(f->c, t);
    for (uint64_t i = 0; i < N; i++)
        if (w[i] != ps_init_value(PS_INIT_UNIFORM, 0.1f, 7, i))
            fail_msg("element %llu: %g != init", (unsigned long long)i, (double)w[i]);
    free(w);
}

static void test_push_then_pull_every_element(void **state)
{
    struct fixture *f = *state;
    float *w0 = malloc(N * 4), *g = malloc(N * 4), *w = malloc(N * 4), *w2 = malloc(N * 4);
    uint64_t t;
    assert_int_equal(psc_pull(f->c, f->big, 0, N, w0, 0, &t), 0);
    wait_ok(f->c, t);
    for (uint64_t i = 0; i < N; i++)
        g[i] = grad_of(i, 1);
    assert_int_equal(psc_push(f->c, f->big, 0, N, g, 1, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_pull(f->c, f->big, 0, N, w, 1, &t), 0);
    wait_ok(f->c, t);
    for (uint64_t i = 0; i < N; i++)
        if (w[i] != w0[i] - 0.5f * g[i])
            fail_msg("element %llu: %.9g, expected %.9g", (unsigned long long)i, (double)w[i],
                     (double)(w0[i] - 0.5f * g[i]));
    /* push-pull across the shard boundary returns the fresh values */
    uint64_t off = N / 2 - 1000, cnt = 3000;
    for (uint64_t i = 0; i < cnt; i++)
        g[i] = grad_of(off + i, 2);
    assert_int_equal(psc_push_pull(f->c, f->big, off, cnt, g, w2, 2, &t), 0);
    wait_ok(f->c, t);
    for (uint64_t i = 0; i < cnt; i++)
        assert_true(w2[i] == w[off + i] - 0.5f * g[i]);
    free(w0);
    free(g);
    free(w);
    free(w2);
}

static void test_window_of_eight(void **state)
{
    struct fixture *f = *state;
    enum { W = 8, C = 4096 };
    float *out = malloc(W * C * 4);
    uint64_t t[W];
    for (int i = 0; i < W; i++) /* 8 outstanding, spread over both shards */
        assert_int_equal(psc_pull(f->c, f->big, (uint64_t)i * (N / W), C, out + i * C, 3, &t[i]),
                         0);
    for (int i = W - 1; i >= 0; i--) /* waited in reverse order */
        wait_ok(f->c, t[i]);
    float *ref = malloc(C * 4);
    for (int i = 0; i < W; i++) {
        uint64_t tt;
        assert_int_equal(psc_pull(f->c, f->big, (uint64_t)i * (N / W), C, ref, 3, &tt), 0);
        wait_ok(f->c, tt);
        assert_memory_equal(ref, out + i * C, C * 4);
    }
    free(out);
    free(ref);
}

/* Keyed pushes over two shards: keys on both sides of the boundary (the
 * client finds each shard's part by binary search), keys on one shard only
 * (the other gets a single zero entry), and the client's refusals. */
static void test_keyed_push(void **state)
{
    struct fixture *f = *state;
    const uint64_t keys[] = {0, 5, N / 2 - 1, N / 2, N / 2 + 1, N - 1};
    const uint64_t upper[] = {N / 2 + 7, N / 2 + 8};
    enum { K = sizeof keys / sizeof keys[0] };
    float *w0 = malloc(N * 4), *w = malloc(N * 4),
          g[K] = {0.01f, -0.02f, 0.03f, -0.04f, 0.05f, -0.06f};
    uint64_t t;
    assert_int_equal(psc_pull(f->c, f->big, 0, N, w0, 4, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_push_keys(f->c, f->big, keys, g, K, 4, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_push_keys(f->c, f->big, upper, g, 2, 4, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_pull(f->c, f->big, 0, N, w, 4, &t), 0);
    wait_ok(f->c, t);
    for (uint64_t i = 0; i < N; i++) {
        float want = w0[i];
        for (size_t k = 0; k < K; k++)
            if (keys[k] == i)
                want = w0[i] - 0.5f * g[k];
        for (size_t k = 0; k < 2; k++)
            if (upper[k] == i)
                want = w0[i] - 0.5f * g[k];
        if (w[i] != want)
            fail_msg("element %llu: %.9g, expected %.9g", (unsigned long long)i, (double)w[i],
                     (double)want);
    }
    const uint64_t dup[] = {1, 2, 3, 3, 9}, past[] = {1, 2, 3, 4, N};
    assert_int_equal(psc_push_keys(f->c, f->big, dup, g, 5, 4, &t), PS_EINVAL);
    assert_non_null(strstr(psc_last_error(f->c), "key[3]=3"));
    assert_int_equal(psc_push_keys(f->c, f->big, past, g, 5, 4, &t), PS_EINVAL);
    assert_non_null(strstr(psc_last_error(f->c), "key[4]=1048576 must be below 1048576"));
    free(w0);
    free(w);
}

static void test_create_idempotent_and_conflict(void **state)
{
    struct fixture *f = *state;
    struct psc_table_spec s;
    big_spec(&s);
    uint32_t h;
    assert_int_equal(psc_table_create(f->c, &s, TIMEOUT_MS, &h), 0);
    assert_int_equal(h, f->big);
    s.lr = 0.25f;
    assert_int_equal(psc_table_create(f->c, &s, TIMEOUT_MS, &h), PS_EREMOTE);
    assert_non_null(strstr(psc_last_error(f->c), "exists with another spec"));
    /* A table smaller than the shard count: shard 1 holds nothing. */
    struct psc_table_spec one;
    psc_table_spec_init(&one, "tiny", 1);
    one.optimizer = PSC_MOMENTUM;
    one.lr = 0.1f;
    one.init = PSC_INIT_CONSTANT;
    one.init_scale = 1.0f;
    uint32_t th;
    assert_int_equal(psc_table_create(f->c, &one, TIMEOUT_MS, &th), 0);
    float g = 0.5f, w = 0;
    uint64_t t;
    assert_int_equal(psc_push_pull(f->c, th, 0, 1, &g, &w, 0, &t), 0);
    wait_ok(f->c, t);
    assert_float_equal(w, 0.95f, 1e-7);
    assert_int_equal(psc_push_pull(f->c, th, 0, 1, &g, &w, 0, &t), 0);
    wait_ok(f->c, t);
    assert_float_equal(w, 0.855f, 1e-6); /* momentum state lives on the server */
}

static void test_client_side_errors(void **state)
{
    struct fixture *f = *state;
    float buf[4];
    uint64_t t;
    assert_int_equal(psc_pull(f->c, f->big, N - 2, 4, buf, 0, &t), PS_ERANGE);
    assert_non_null(strstr(psc_last_error(f->c), "outside table 'big'"));
    assert_int_equal(psc_pull(f->c, f->big, 0, 0, buf, 0, &t), PS_ERANGE);
    assert_int_equal(psc_pull(f->c, 999, 0, 1, buf, 0, &t), PS_ENOTABLE);
    assert_int_equal(psc_wait(f->c, 12345, 0), PS_EINVAL);
    struct psc_table_spec s;
    psc_table_spec_init(&s, "bad name", 4);
    uint32_t h;
    assert_int_equal(psc_table_create(f->c, &s, TIMEOUT_MS, &h), PS_EINVAL);
}

static void test_stats(void **state)
{
    struct fixture *f = *state;
    for (uint32_t s = 0; s < 2; s++) {
        struct psc_shard_stats st = {.struct_size = sizeof st};
        assert_int_equal(psc_stats(f->c, s, TIMEOUT_MS, &st), 0);
        assert_int_equal(st.shard, s);
        assert_int_equal(st.shards, 2);
        assert_true(st.tables >= 1);
        assert_true(st.requests >= 4);
        assert_true(st.bytes_in > (N / 2) * 4); /* the 1M-float push */
        assert_true(st.bytes_out > (N / 2) * 4);
    }
    uint64_t sent, recvd;
    psc_bytes(f->c, &sent, &recvd);
    assert_true(sent > N * 4 && recvd > 2 * N * 4);
}

/* The structs that grow (psclient.h, "ABI"), as a program built against
 * an older or a newer psclient.h passes them: a newer one's unknown
 * fields must be zero, an older one's missing fields take their defaults,
 * and what the library writes stops at the caller's struct_size. */
struct newer_config {
    struct psc_config cfg;
    uint64_t later; /* a field a newer header has */
};
struct newer_shard_stats {
    struct psc_shard_stats st;
    unsigned char later[40];
};
struct newer_table_stats {
    struct psc_table_stats ts;
    unsigned char later[24];
};

static void test_sized_structs(void **state)
{
    struct fixture *f = *state;
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = NULL;
    char err[512];
    /* no struct_size: refused, saying what to set */
    struct psc_config zero = {.servers = eps, .nservers = 2, .connect_timeout_ms = TIMEOUT_MS};
    assert_int_equal(psc_create(&zero, &c, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "struct psc_config: struct_size is 0"));
    assert_null(c);
    /* smaller than the first version's */
    zero.struct_size = offsetof(struct psc_config, hello_waiting);
    assert_int_equal(psc_create(&zero, &c, err, sizeof err), PS_EINVAL);
    /* a newer program's struct: its new field unset is fine... */
    struct newer_config nc;
    memset(&nc, 0, sizeof nc);
    nc.cfg.struct_size = sizeof nc;
    nc.cfg.servers = eps;
    nc.cfg.nservers = 2;
    nc.cfg.worker_id = 9;
    nc.cfg.connect_timeout_ms = TIMEOUT_MS;
    assert_int_equal(psc_create(&nc.cfg, &c, err, sizeof err), 0);
    psc_destroy(c);
    c = NULL;
    /* ...set, it is refused: this library would ignore it */
    nc.later = 1;
    assert_int_equal(psc_create(&nc.cfg, &c, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "newer psclient.h"));
    assert_null(c);

    /* a spec without struct_size is named by psc_table_create */
    struct psc_table_spec sp;
    psc_table_spec_init(&sp, "sized", 8);
    assert_int_equal(sp.struct_size, sizeof sp);
    sp.struct_size = 0;
    uint32_t h;
    assert_int_equal(psc_table_create(f->c, &sp, TIMEOUT_MS, &h), PS_EINVAL);
    assert_non_null(strstr(psc_last_error(f->c), "struct psc_table_spec"));

    /* stats into a newer program's structs: the fields this library knows
     * are written, the rest zeroed, struct_size and the stride kept */
    struct newer_shard_stats ns;
    memset(&ns, 0xa5, sizeof ns);
    ns.st.struct_size = sizeof ns;
    struct newer_table_stats nt[4];
    memset(nt, 0xa5, sizeof nt);
    nt[0].ts.struct_size = sizeof nt[0];
    assert_int_equal(psc_stats_tables(f->c, 0, TIMEOUT_MS, &ns.st, &nt[0].ts, 4), 0);
    assert_int_equal(ns.st.struct_size, sizeof ns);
    assert_int_equal(ns.st.shard, 0);
    assert_true(ns.st.tables >= 1);
    for (size_t i = 0; i < sizeof ns.later; i++)
        assert_int_equal(ns.later[i], 0);
    int found = 0;
    for (uint32_t i = 0; i < ns.st.tables && i < 4; i++) {
        assert_int_equal(nt[i].ts.struct_size, sizeof nt[0]);
        for (size_t j = 0; j < sizeof nt[i].later; j++)
            assert_int_equal(nt[i].later[j], 0);
        found |= strcmp(nt[i].ts.name, "big") == 0;
    }
    assert_true(found);
    /* an output struct without struct_size is refused, and not written */
    struct psc_shard_stats bare;
    memset(&bare, 0, sizeof bare);
    assert_int_equal(psc_stats(f->c, 0, TIMEOUT_MS, &bare), PS_EINVAL);
    assert_non_null(strstr(psc_last_error(f->c), "struct psc_shard_stats"));
    assert_int_equal(bare.shards, 0);
}

static void test_unreachable_and_misordered(void **state)
{
    struct fixture *f = *state;
    /* Nothing listens on port 1 of loopback: hello times out, naming it. */
    const char *dead[1] = {"tcp://127.0.0.1:1"};
    struct psc_config cfg = {
        .struct_size = sizeof cfg, .servers = dead, .nservers = 1, .connect_timeout_ms = 300};
    struct psc_client *c = NULL;
    char err[512];
    long long t0 = ps_mono_ms();
    assert_int_equal(psc_create(&cfg, &c, err, sizeof err), PS_ETIMEDOUT);
    assert_true(ps_mono_ms() - t0 < 5000);
    assert_non_null(strstr(err, "tcp://127.0.0.1:1"));
    assert_null(c);
    /* Endpoints listed in the wrong order: hello says which is which. */
    const char *swapped[2] = {f->shard[1].endpoint, f->shard[0].endpoint};
    struct psc_config cfg2 = {.struct_size = sizeof cfg2,
                              .servers = swapped,
                              .nservers = 2,
                              .connect_timeout_ms = TIMEOUT_MS};
    assert_int_equal(psc_create(&cfg2, &c, err, sizeof err), PS_ESTATE);
    assert_non_null(strstr(err, "check the order"));
    /* Garbage endpoint: named in the error. */
    const char *junk[1] = {"nonsense://x"};
    struct psc_config cfg3 = {
        .struct_size = sizeof cfg3, .servers = junk, .nservers = 1, .connect_timeout_ms = 100};
    assert_int_equal(psc_create(&cfg3, &c, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "nonsense://x"));
}

/* A client with cfg (the endpoints, the worker id and the connect timeout
 * from the arguments); the test fails when it cannot be created. */
static struct psc_client *client_or_fail(struct psc_config cfg, const char *const *eps, size_t n,
                                         uint32_t worker)
{
    cfg.struct_size = sizeof cfg;
    cfg.servers = eps;
    cfg.nservers = n;
    cfg.worker_id = worker;
    cfg.connect_timeout_ms = TIMEOUT_MS;
    struct psc_client *c = NULL;
    char err[512];
    if (psc_create(&cfg, &c, err, sizeof err) != 0)
        fail_msg("psc_create: %s", err);
    return c;
}

/* Another client (worker 2) of the fixture's shards. */
static struct psc_client *other_client(const struct fixture *f, int wire_dtype, int local_ipc)
{
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    return client_or_fail((struct psc_config){.wire_dtype = wire_dtype, .local_ipc = local_ipc},
                          eps, 2, 2);
}

/* Polling: psc_wait with a timeout of 0 never blocks: with the shard that
 * holds element 0 stopped (SIGSTOP: it cannot answer), it returns
 * PS_ETIMEDOUT each time (a wait that blocked would hang the test until
 * meson's timeout). And it takes the replies that came: called again and
 * again it completes each ticket, with the pulled values right. Run on
 * the fixture's two shards (poll() on their ZMQ_FDs) and on a one-shard
 * client (a blocking receive with a timeout). */
static void poll_window(struct psc_client *c, uint32_t table, uint64_t size, pid_t first)
{
    enum { W = 8, C = 4096 };
    float *out = malloc(W * C * 4), *ref = malloc(C * 4);
    uint64_t t[W];
    assert_int_equal(kill(first, SIGSTOP), 0);
    assert_int_equal(psc_pull(c, table, 0, C, ref, 0, &t[0]), 0);
    for (int k = 0; k < 3; k++)
        assert_int_equal(psc_wait(c, t[0], 0), PS_ETIMEDOUT);
    assert_int_equal(kill(first, SIGCONT), 0);
    wait_ok(c, t[0]);
    for (int i = 0; i < W; i++)
        assert_int_equal(psc_pull(c, table, (uint64_t)i * (size / W), C, out + i * C, 0, &t[i]), 0);
    unsigned polls = 0;
    for (int i = 0; i < W; i++) {
        int rc = PS_ETIMEDOUT;
        int64_t until = ps_mono_ms() + TIMEOUT_MS;
        while (rc == PS_ETIMEDOUT && ps_mono_ms() < until) {
            rc = psc_wait(c, t[i], 0);
            polls++;
        }
        if (rc != 0)
            fail_msg("ticket %d: %s: %s", i, ps_err_name(rc), psc_last_error(c));
    }
    assert_true(polls >= W);
    for (int i = 0; i < W; i++) {
        uint64_t tt;
        assert_int_equal(psc_pull(c, table, (uint64_t)i * (size / W), C, ref, 0, &tt), 0);
        wait_ok(c, tt);
        assert_memory_equal(ref, out + i * C, C * 4);
    }
    free(out);
    free(ref);
}

static void test_wait_zero_polls(void **state)
{
    struct fixture *f = *state;
    /* no heartbeat: it would end a wait that wrongly blocked after 1 s */
    const struct psc_config quiet = {.struct_size = sizeof quiet, .heartbeat_ms = -1};
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = client_or_fail(quiet, eps, 2, 2);
    struct psc_table_spec sp;
    big_spec(&sp);
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    poll_window(c, t, N, f->shard[0].pid);
    psc_destroy(c);

    struct psd_proc one;
    const char *a[] = {NULL};
    assert_int_equal(harness_psd_start(&one, a), 0);
    const char *ep1[1] = {one.endpoint};
    c = client_or_fail(quiet, ep1, 1, 2);
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    poll_window(c, t, N, one.pid);
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&one), 0);
}

/* Table `name` as shard s reports it (the test fails when it does not). */
static struct psc_table_stats shard_table(struct psc_client *c, uint32_t s, const char *name)
{
    struct psc_shard_stats st = {.struct_size = sizeof st};
    struct psc_table_stats list[16] = {{.struct_size = sizeof list[0]}};
    int rc = psc_stats_tables(c, s, TIMEOUT_MS, &st, list, 16);
    if (rc != 0)
        fail_msg("stats of shard %u: %s", s, psc_last_error(c));
    for (uint32_t i = 0; i < st.tables && i < 16; i++)
        if (strcmp(list[i].name, name) == 0)
            return list[i];
    fail_msg("shard %u has no table '%s'", s, name);
    return list[0];
}

static uint32_t adam_table(struct psc_client *c, const char *name, uint64_t size)
{
    struct psc_table_spec s;
    psc_table_spec_init(&s, name, size);
    s.optimizer = PSC_ADAM;
    s.lr = 0.01f;
    s.init = PSC_INIT_UNIFORM;
    s.init_scale = 0.1f;
    s.seed = 11;
    uint32_t t = 0;
    if (psc_table_create(c, &s, TIMEOUT_MS, &t) != 0)
        fail_msg("create '%s': %s", name, psc_last_error(c));
    return t;
}

/* Requests over piece_bytes go as pieces (PSC_PIECE_BYTES_DEFAULT), here
 * of 4 KiB over a table of 40,003 elements on two shards: pulls, pushes
 * and push-pulls give the bits whole requests give; a pass in pieces is
 * one optimizer step, though the workers (2 and 3) are past psd's
 * --workers and so untracked: the pieces say they continue a request
 * (Adam's bias correction would differ otherwise: the weights are compared
 * bit for bit with a table pushed whole), while the shards count each
 * piece as a push; a wait that runs out while a shard
 * is stopped names it, and the ticket completes once it goes on; a cancel
 * takes every piece; a request of piece_bytes goes whole and one element
 * more in two pieces; an f16 wire cuts pieces of as many bytes; a
 * piece_bytes one below the least is refused. */
static void test_pieces(void **state)
{
    struct fixture *f = *state;
    enum { M = 40003, OFF = 17, C = M - 40, PER_SHARD_MIN = 19 }; /* 19,978 / 1,024 > 19 */
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *p = client_or_fail(
        (struct psc_config){.piece_bytes = PSC_PIECE_BYTES_MIN, .heartbeat_ms = -1}, eps, 2, 2);
    struct psc_client *w = client_or_fail((struct psc_config){.piece_bytes = SIZE_MAX}, eps, 2, 3);
    uint32_t tp = adam_table(p, "adam_pieces", M), tw = adam_table(w, "adam_whole", M);
    float *g = malloc(M * 4), *a = malloc(M * 4), *b = malloc(M * 4);
    uint64_t t;
    for (int round = 0; round < 2; round++) {
        for (uint64_t i = 0; i < C; i++)
            g[i] = grad_of(OFF + i, round);
        assert_int_equal(psc_push(p, tp, OFF, C, g, 0, &t), 0);
        wait_ok(p, t);
        assert_int_equal(psc_push(w, tw, OFF, C, g, 0, &t), 0);
        wait_ok(w, t);
    }
    for (uint64_t i = 0; i < C; i++)
        g[i] = grad_of(OFF + i, 5);
    assert_int_equal(psc_push_pull(p, tp, OFF, C, g, a, 0, &t), 0);
    wait_ok(p, t);
    assert_int_equal(psc_push_pull(w, tw, OFF, C, g, b, 0, &t), 0);
    wait_ok(w, t);
    assert_memory_equal(a, b, (size_t)C * 4);
    assert_int_equal(psc_pull(p, tw, 0, M, a, 0, &t), 0); /* the whole table, in pieces */
    wait_ok(p, t);
    assert_int_equal(psc_pull(w, tp, 0, M, b, 0, &t), 0);
    wait_ok(w, t);
    assert_memory_equal(a, b, (size_t)M * 4);
    for (uint32_t s = 0; s < 2; s++) {
        struct psc_table_stats sp = shard_table(w, s, "adam_pieces");
        struct psc_table_stats sw = shard_table(w, s, "adam_whole");
        assert_int_equal(sp.updates, 3);
        assert_int_equal(sw.updates, 3);
        assert_int_equal(sw.pushes, 3);
        assert_true(sp.pushes >= 3 * PER_SHARD_MIN);
    }

    /* shard 1 stopped: no piece of it answers, and the wait says which
     * (checked once it goes on again: a failed check would leave it
     * stopped) */
    assert_int_equal(kill(f->shard[1].pid, SIGSTOP), 0);
    int rc = psc_pull(p, tp, 0, M, a, 0, &t);
    int rc0 = rc == 0 ? psc_wait(p, t, 0) : rc;
    char msg0[512], msg1[512];
    snprintf(msg0, sizeof msg0, "%s", psc_last_error(p));
    int rc1 = rc == 0 ? psc_wait(p, t, 20) : rc;
    snprintf(msg1, sizeof msg1, "%s", psc_last_error(p));
    assert_int_equal(kill(f->shard[1].pid, SIGCONT), 0);
    assert_int_equal(rc, 0);
    assert_int_equal(rc0, PS_ETIMEDOUT);
    assert_int_equal(rc1, PS_ETIMEDOUT);
    assert_non_null(strstr(msg0, f->shard[1].endpoint));
    assert_non_null(strstr(msg1, f->shard[1].endpoint));
    assert_non_null(strstr(msg1, "within 20 ms"));
    wait_ok(p, t);
    assert_memory_equal(a, b, (size_t)M * 4);
    /* canceled: the ticket is gone, late replies are dropped, the next
     * request goes through */
    assert_int_equal(kill(f->shard[1].pid, SIGSTOP), 0);
    rc = psc_pull(p, tp, 0, M, a, 0, &t);
    rc0 = rc;
    int64_t until = ps_mono_ms() + TIMEOUT_MS;
    while (rc == 0 && (rc0 = psc_cancel(p, t)) == PS_EBUSY && ps_mono_ms() < until)
        ;
    rc1 = rc == 0 ? psc_wait(p, t, 0) : rc;
    assert_int_equal(kill(f->shard[1].pid, SIGCONT), 0);
    assert_int_equal(rc, 0);
    assert_int_equal(rc0, 0);
    assert_int_equal(rc1, PS_EINVAL);
    memset(a, 0, (size_t)M * 4);
    assert_int_equal(psc_pull(p, tp, 0, M, a, 0, &t), 0);
    wait_ok(p, t);
    assert_memory_equal(a, b, (size_t)M * 4);

    /* at the bound: 1,024 elements (4 KiB) go whole, 1,025 in two pieces */
    struct psc_table_spec es;
    psc_table_spec_init(&es, "piece_edge", M);
    uint32_t te;
    assert_int_equal(psc_table_create(p, &es, TIMEOUT_MS, &te), 0);
    for (uint64_t n = 1024; n <= 1025; n++) {
        uint64_t before_pushes = shard_table(w, 0, "piece_edge").pushes;
        assert_int_equal(psc_push(p, te, 0, n, g, 0, &t), 0);
        wait_ok(p, t);
        assert_int_equal(shard_table(w, 0, "piece_edge").pushes - before_pushes, n - 1023);
    }

    /* f16 on the wire: pieces of 2,048 elements, the same values */
    struct psc_client *h = client_or_fail(
        (struct psc_config){.wire_dtype = PSC_F16, .piece_bytes = PSC_PIECE_BYTES_MIN}, eps, 2, 4);
    struct psc_client *hw = client_or_fail(
        (struct psc_config){.wire_dtype = PSC_F16, .piece_bytes = SIZE_MAX}, eps, 2, 5);
    uint32_t th = adam_table(h, "adam_whole", M), thw = adam_table(hw, "adam_whole", M);
    struct psc_table_stats before = shard_table(w, 0, "adam_whole");
    assert_int_equal(psc_pull(h, th, 0, M, a, 0, &t), 0);
    wait_ok(h, t);
    assert_int_equal(psc_pull(hw, thw, 0, M, b, 0, &t), 0);
    wait_ok(hw, t);
    assert_memory_equal(a, b, (size_t)M * 4);
    assert_true(shard_table(w, 0, "adam_whole").pulls - before.pulls > (M / 2) / 2048);
    psc_destroy(h);
    psc_destroy(hw);

    struct psc_client *bad = NULL;
    char err[512];
    struct psc_config small = {.struct_size = sizeof small,
                               .servers = eps,
                               .nservers = 2,
                               .piece_bytes = PSC_PIECE_BYTES_MIN - 1};
    assert_int_equal(psc_create(&small, &bad, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "piece_bytes 4095"));
    assert_null(bad);
    psc_destroy(p);
    psc_destroy(w);
    free(g);
    free(a);
    free(b);
}

/* Requests queued for one shard near ZeroMQ's default high-water mark
 * (1,000 messages): with the shard stopped, 30 pushes of 32 pieces (990 of
 * the 1,024 tickets) wait in the client's queue (the kernel's buffers take
 * a few dozen), and none is refused (PS_SOCKET_HWM); once it goes on, each
 * is applied. Two pushes go first: ZeroMQ's sender learns what its queue's
 * reader took in steps of half the mark, so a queue that has moved 67
 * messages since holds 67 fewer (with the default mark, this test's sends
 * were then refused: tried). */
static void test_queue_past_default_hwm(void **state)
{
    struct fixture *f = *state;
    enum { K = 30, H = N / 2 }; /* shard 1's half, in pieces of 64 KiB: 32 */
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = client_or_fail(
        (struct psc_config){.piece_bytes = 64 * 1024, .heartbeat_ms = -1}, eps, 2, 2);
    struct psc_table_spec s;
    big_spec(&s);
    s.name = "queued";
    uint32_t t;
    assert_int_equal(psc_table_create(c, &s, TIMEOUT_MS, &t), 0);
    float *w0 = malloc(H * 4), *w = malloc(H * 4), *g = malloc(H * 4);
    uint64_t tk[K];
    assert_int_equal(psc_pull(c, t, H, H, w0, 0, &tk[0]), 0);
    wait_ok(c, tk[0]);
    for (uint64_t i = 0; i < H; i++)
        g[i] = grad_of(i, 3);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(psc_push(c, t, H, H, g, 0, &tk[k]), 0);
        wait_ok(c, tk[k]);
    }
    assert_int_equal(kill(f->shard[1].pid, SIGSTOP), 0);
    int sent = 0;
    while (sent < K && psc_push(c, t, H, H, g, 0, &tk[sent]) == 0)
        sent++;
    assert_int_equal(kill(f->shard[1].pid, SIGCONT), 0);
    if (sent < K)
        fail_msg("push %d of %d refused: %s", sent, K, psc_last_error(c));
    for (int k = 0; k < K; k++)
        wait_ok(c, tk[k]);
    assert_int_equal(psc_pull(c, t, H, H, w, 0, &tk[0]), 0);
    wait_ok(c, tk[0]);
    for (uint64_t i = 0; i < H; i++) {
        float e = w0[i];
        for (int k = 0; k < K + 2; k++)
            e -= 0.5f * g[i];
        if (w[i] != e)
            fail_msg("element %llu: %.9g, expected %.9g", (unsigned long long)(H + i), (double)w[i],
                     (double)e);
    }
    assert_true(shard_table(c, 1, "queued").pushes >= (K + 2) * 32);
    psc_destroy(c);
    free(w0);
    free(w);
    free(g);
}

/* BSP with two workers pushing the table in pieces, interleaved on one
 * shard: the round applies their mean once every piece of both is in, and
 * a pull of the next clock in pieces reads it. */
static void test_pieces_bsp(void **state)
{
    (void)state;
    enum { M = 100003 };
    struct psd_proc one;
    const char *args[] = {"--consistency", "bsp", "--workers", "2", NULL};
    assert_int_equal(harness_psd_start(&one, args), 0);
    const char *eps[1] = {one.endpoint};
    struct psc_client *c[2];
    uint32_t t[2];
    float *g[2], *w0 = malloc(M * 4), *w1 = malloc(M * 4);
    struct psc_table_spec s;
    psc_table_spec_init(&s, "bsp_pieces", M);
    s.lr = 0.5f;
    s.init = PSC_INIT_UNIFORM;
    s.init_scale = 0.1f;
    for (int k = 0; k < 2; k++) {
        c[k] = client_or_fail((struct psc_config){.piece_bytes = PSC_PIECE_BYTES_MIN}, eps, 1,
                              (uint32_t)k);
        assert_int_equal(psc_table_create(c[k], &s, TIMEOUT_MS, &t[k]), 0);
        g[k] = malloc(M * 4);
        for (uint64_t i = 0; i < M; i++)
            g[k][i] = grad_of(i, k);
    }
    uint64_t tk[2];
    assert_int_equal(psc_pull(c[0], t[0], 0, M, w0, 0, &tk[0]), 0);
    wait_ok(c[0], tk[0]);
    for (int k = 0; k < 2; k++)
        assert_int_equal(psc_push(c[k], t[k], 0, M, g[k], 0, &tk[k]), 0);
    for (int k = 0; k < 2; k++)
        wait_ok(c[k], tk[k]);
    assert_int_equal(psc_pull(c[1], t[1], 0, M, w1, 1, &tk[1]), 0);
    wait_ok(c[1], tk[1]);
    for (uint64_t i = 0; i < M; i++) {
        float mean = (g[0][i] + g[1][i]) * 0.5f;
        if (w1[i] != w0[i] - 0.5f * mean)
            fail_msg("element %llu: %.9g, expected %.9g", (unsigned long long)i, (double)w1[i],
                     (double)(w0[i] - 0.5f * mean));
    }
    struct psc_table_stats ts = shard_table(c[0], 0, "bsp_pieces");
    assert_int_equal(ts.clock, 1);
    /* 100,003 elements in pieces of 1,024 would be 98: the cap makes 64 */
    assert_int_equal(ts.pushes, 2 * PSC_PIECES_MAX);
    for (int k = 0; k < 2; k++) {
        psc_destroy(c[k]);
        free(g[k]);
    }
    free(w0);
    free(w1);
    assert_int_equal(harness_psd_stop(&one), 0);
}

static void test_f16_on_the_wire(void **state)
{
    struct fixture *f = *state;
    struct psc_client *h = other_client(f, PSC_F16, 0);
    struct psc_table_spec s;
    big_spec(&s);
    uint32_t t16;
    assert_int_equal(psc_table_create(h, &s, TIMEOUT_MS, &t16), 0);
    enum { OFF = N / 2 - 5000, C = 10000 }; /* across the shard boundary */
    float *exact = malloc(C * 4), *half = malloc(C * 4), *g = malloc(C * 4);
    uint64_t t;
    assert_int_equal(psc_pull(f->c, f->big, OFF, C, exact, 9, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_pull(h, t16, OFF, C, half, 9, &t), 0);
    wait_ok(h, t);
    for (int i = 0; i < C; i++) /* the server's f32, rounded once to f16 */
        assert_true(half[i] == ps_f16_to_f32(ps_f32_to_f16(exact[i])));
    for (int i = 0; i < C; i++)
        g[i] = 0.001f * (float)(i % 97) - 0.05f;
    assert_int_equal(psc_push(h, t16, OFF, C, g, 9, &t), 0);
    wait_ok(h, t);
    float *after = malloc(C * 4);
    assert_int_equal(psc_pull(f->c, f->big, OFF, C, after, 9, &t), 0);
    wait_ok(f->c, t);
    for (int i = 0; i < C; i++) /* the server applied the f16-rounded gradient */
        assert_true(after[i] == exact[i] - 0.5f * ps_f16_to_f32(ps_f32_to_f16(g[i])));
    uint64_t sent, recvd;
    psc_bytes(h, &sent, &recvd);
    assert_true(sent < C * 4 && sent > C * 2); /* half the bytes of f32 */
    psc_destroy(h);
    free(exact);
    free(half);
    free(g);
    free(after);
}

/* Pull views: a range over both shards comes back as two parts, equal to
 * a copying pull; the ticket stays held until released (waiting on it
 * again is refused, a part past the last is refused); views of small
 * replies, several at once, and a view on an f16 client is refused. */
static void test_pull_view(void **state)
{
    struct fixture *f = *state;
    enum { OFF = N / 2 - 70000, C = 100000 }; /* 280 KB on shard 0, 120 KB on shard 1 */
    float *ref = malloc(C * 4);
    uint64_t t, v, v2;
    float small[5];
    assert_int_equal(psc_pull(f->c, f->big, OFF, C, ref, 10, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_pull(f->c, f->big, 3, 5, small, 10, &t), 0);
    wait_ok(f->c, t);
    assert_int_equal(psc_pull_view(f->c, f->big, OFF, C, 10, &v), 0);
    assert_int_equal(psc_pull_view(f->c, f->big, 3, 5, 10, &v2), 0); /* small: one part */
    wait_ok(f->c, v);
    wait_ok(f->c, v2);
    assert_int_equal(psc_wait(f->c, v, 0), PS_EINVAL); /* held, not outstanding */
    const float *p;
    uint64_t off, cnt, seen = 0;
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(psc_view_part(f->c, v, i, &p, &off, &cnt), 0);
        assert_int_equal(off, OFF + seen);
        assert_memory_equal(p, ref + seen, cnt * 4);
        seen += cnt;
    }
    assert_int_equal(seen, C);
    assert_int_equal(psc_view_part(f->c, v, 2, &p, &off, &cnt), PS_ERANGE);
    assert_int_equal(psc_view_part(f->c, v2, 0, &p, &off, &cnt), 0);
    assert_true(off == 3 && cnt == 5);
    assert_memory_equal(p, small, sizeof small);
    assert_int_equal(psc_view_release(f->c, v), 0);
    assert_int_equal(psc_view_release(f->c, v), PS_EINVAL); /* once */
    assert_int_equal(psc_view_release(f->c, v2), 0);
    struct psc_client *h = other_client(f, PSC_F16, 0);
    struct psc_table_spec s;
    big_spec(&s);
    uint32_t t16;
    assert_int_equal(psc_table_create(h, &s, TIMEOUT_MS, &t16), 0);
    assert_int_equal(psc_pull_view(h, t16, 0, 10, 10, &v), PS_EINVAL);
    assert_non_null(strstr(psc_last_error(h), "f32 on the wire"));
    psc_destroy(h);
    free(ref);
}

static void test_sparse_rows(void **state)
{
    struct fixture *f = *state;
    struct psc_table_spec s;
    psc_table_spec_init(&s, "emb", 0);
    s.sparse = 1;
    s.dim = 4;
    s.rows_max = 16; /* per shard */
    s.optimizer = PSC_ADAGRAD;
    s.lr = 0.5f;
    s.eps = 1e-8f;
    s.init = PSC_INIT_UNIFORM;
    s.init_scale = 0.1f;
    s.seed = 11;
    uint32_t t;
    assert_int_equal(psc_table_create(f->c, &s, TIMEOUT_MS, &t), 0);
    enum { K = 6 };
    const uint64_t keys[K] = {3, 17, 99, 1000, UINT64_C(1) << 40, UINT64_MAX};
    float w[K * 4], w2[K * 4], g[K * 4];
    uint64_t tk;
    assert_int_equal(psc_pull_rows(f->c, t, keys, K, w, 0, &tk), 0);
    wait_ok(f->c, tk);
    for (int i = 0; i < K; i++) /* created on first touch from (seed, key, j) */
        for (int j = 0; j < 4; j++)
            assert_true(w[i * 4 + j] ==
                        ps_init_value(PS_INIT_UNIFORM, 0.1f, 11 ^ ps_mix64(keys[i]), j));
    for (int i = 0; i < K * 4; i++)
        g[i] = 0.01f * (float)(i + 1);
    assert_int_equal(psc_push_pull_rows(f->c, t, keys, K, g, w2, 0, &tk), 0);
    wait_ok(f->c, tk);
    for (int i = 0; i < K * 4; i++) /* one Adagrad step: lr g / (|g| + eps) */
        assert_float_equal(w2[i], w[i] - 0.5f * g[i] / (fabsf(g[i]) + 1e-8f), 1e-6);
    /* unsorted keys are refused by the client; dense calls on a sparse table too */
    const uint64_t bad[2] = {5, 4};
    assert_int_equal(psc_pull_rows(f->c, t, bad, 2, w, 0, &tk), PS_EINVAL);
    assert_int_equal(psc_pull(f->c, t, 0, 1, w, 0, &tk), PS_EINVAL);
    /* the row limit: 16 per shard, 2 shards, 40 new keys cannot all fit */
    uint64_t many[40];
    float out[40 * 4];
    for (int i = 0; i < 40; i++)
        many[i] = 5000 + (uint64_t)i;
    assert_int_equal(psc_pull_rows(f->c, t, many, 40, out, 0, &tk), 0);
    assert_int_equal(psc_wait(f->c, tk, TIMEOUT_MS), PS_EREMOTE);
    assert_non_null(strstr(psc_last_error(f->c), "is full"));
    /* FTRL with a large l1 keeps weights exactly 0 */
    struct psc_table_spec fs;
    psc_table_spec_init(&fs, "ftrl", 0);
    fs.sparse = 1;
    fs.dim = 1;
    fs.rows_max = 100;
    fs.optimizer = PSC_FTRL;
    fs.lr = 0.1f;
    fs.eps = 1.0f;
    fs.l1 = 10.0f;
    uint32_t ft;
    assert_int_equal(psc_table_create(f->c, &fs, TIMEOUT_MS, &ft), 0);
    float fg[K], fw[K];
    for (int i = 0; i < K; i++)
        fg[i] = 0.5f;
    assert_int_equal(psc_push_pull_rows(f->c, ft, keys, K, fg, fw, 0, &tk), 0);
    wait_ok(f->c, tk);
    for (int i = 0; i < K; i++)
        assert_true(fw[i] == 0.0f);
}

/* A sparse table of dim columns, SGD with lr 0.5, rows from a seeded
 * uniform initialiser. */
static void rows_spec(struct psc_table_spec *s, const char *name, uint32_t dim, uint64_t rows_max,
                      uint64_t seed)
{
    psc_table_spec_init(s, name, 0);
    s->sparse = 1;
    s->dim = dim;
    s->rows_max = rows_max;
    s->lr = 0.5f;
    s->init = PSC_INIT_UNIFORM;
    s->init_scale = 0.1f;
    s->seed = seed;
}

/* Rows through a client of one shard, whose keys need no grouping: they
 * go in the caller's order and the gradients from the caller's buffer.
 * Pulls land in the caller's order, as f32 and as halves; a push and a
 * push-pull take two SGD steps; an f16 client's push arrives as its
 * halves. */
static void test_sparse_rows_one_shard(void **state)
{
    (void)state;
    enum { K = 1000, D = 3 };
    struct psd_proc one;
    const char *args[] = {NULL};
    assert_int_equal(harness_psd_start(&one, args), 0);
    const char *eps[1] = {one.endpoint};
    struct psc_client *c = client_or_fail((struct psc_config){0}, eps, 1, 0);
    struct psc_client *h = client_or_fail((struct psc_config){.wire_dtype = PSC_F16}, eps, 1, 1);
    struct psc_table_spec s;
    rows_spec(&s, "emb1", D, 4 * K, 5);
    uint32_t t, th;
    assert_int_equal(psc_table_create(c, &s, TIMEOUT_MS, &t), 0);
    assert_int_equal(psc_table_create(h, &s, TIMEOUT_MS, &th), 0);
    static uint64_t keys[K];
    static float w[K * D], w2[K * D], g[K * D], g2[K * D];
    for (uint64_t i = 0; i < K; i++)
        keys[i] = i * 977 + (ps_mix64(i) & 511);
    uint64_t tk;
    assert_int_equal(psc_pull_rows(c, t, keys, K, w, 0, &tk), 0);
    wait_ok(c, tk);
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < D; j++)
            assert_true(w[i * D + j] ==
                        ps_init_value(PS_INIT_UNIFORM, 0.1f, 5 ^ ps_mix64(keys[i]), j));
    for (size_t i = 0; i < K * D; i++) {
        g[i] = 0.001f * (float)(i % 97);
        g2[i] = -0.002f * (float)(i % 13);
    }
    assert_int_equal(psc_push_rows(c, t, keys, K, g, 0, &tk), 0);
    wait_ok(c, tk);
    assert_int_equal(psc_push_pull_rows(c, t, keys, K, g2, w2, 0, &tk), 0);
    wait_ok(c, tk);
    for (size_t i = 0; i < K * D; i++) {
        float want = (w[i] - 0.5f * g[i]) - 0.5f * g2[i];
        if (w2[i] != want)
            fail_msg("row %zu value %zu: %.9g, expected %.9g", i / D, i % D, (double)w2[i],
                     (double)want);
    }
    /* halves: gradients of whole 64ths are exact in f16 */
    for (size_t i = 0; i < K * D; i++)
        g[i] = (float)((int)(i % 9) - 4) / 64.0f;
    assert_int_equal(psc_push_rows(h, th, keys, K, g, 0, &tk), 0);
    wait_ok(h, tk);
    assert_int_equal(psc_pull_rows(c, t, keys, K, w, 0, &tk), 0);
    wait_ok(c, tk);
    for (size_t i = 0; i < K * D; i++)
        assert_true(w[i] == w2[i] - 0.5f * g[i]);
    /* and an f16 client's pull reads the same rows as halves */
    static uint16_t half[K * D];
    ps_f32_to_half_n(PS__DTYPE__DTYPE_F16, w, half, K * D);
    ps_half_to_f32_n(PS__DTYPE__DTYPE_F16, half, w2, K * D);
    assert_int_equal(psc_pull_rows(h, th, keys, K, w, 0, &tk), 0);
    wait_ok(h, tk);
    assert_memory_equal(w, w2, sizeof w);
    psc_destroy(c);
    psc_destroy(h);
    assert_int_equal(harness_psd_stop(&one), 0);
}

/* The same-host endpoint a shard bound to tcp://H:P offers: ipc://@psd/H:P. */
static void local_name(const char *tcp, char *out, size_t len)
{
    assert_int_equal(ps_local_endpoint(tcp, out, len), 0);
    assert_true(strncmp(out, "ipc://@psd/", 11) == 0 && strcmp(out + 11, tcp + 6) == 0);
}

static void test_local_names(void **state)
{
    (void)state;
    char out[PS_ENDPOINT_MAX], big[200];
    assert_int_equal(ps_local_endpoint("ipc:///tmp/x", out, sizeof out), -1);
    assert_int_equal(ps_local_endpoint("tcp://", out, sizeof out), -1);
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    memcpy(big, "tcp://", 6);
    assert_int_equal(ps_local_endpoint(big, out, sizeof out), -1); /* over sun_path */
    /* malformed offers are never reachable, whatever /proc/net/unix holds */
    const char *bad[] = {"",
                         "ipc://@psd/",
                         "ipc:///tmp/psd.sock",
                         "tcp://@psd/x:1",
                         "ipc://@psd/a b",
                         "ipc://@other/x:1",
                         big};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(ps_local_reachable(bad[i]));
    assert_false(ps_local_reachable("ipc://@psd/127.0.0.1:1")); /* nobody listens there */
}

/* Names of PS_LOCAL_NAME_MAX characters are made and found; one more is
 * neither, even where a socket listens on it. */
static void test_local_name_limit(void **state)
{
    (void)state;
    char tcp[PS_ENDPOINT_MAX], made[PS_ENDPOINT_MAX], over[PS_ENDPOINT_MAX];
    size_t host = PS_LOCAL_NAME_MAX - strlen("psd/"); /* "tcp://" + host chars */
    memcpy(tcp, "tcp://", 6);
    memset(tcp + 6, 'h', host + 1);
    tcp[6 + host + 1] = '\0';
    assert_int_equal(ps_local_endpoint(tcp, made, sizeof made), -1); /* one past */
    tcp[6 + host] = '\0';
    assert_int_equal(ps_local_endpoint(tcp, made, sizeof made), 0); /* at the limit */
    assert_int_equal(strlen(made), strlen("ipc://@") + PS_LOCAL_NAME_MAX);
    size_t len = strlen(made); /* the same name and one character more */
    memcpy(over, made, len);
    over[len] = 'h';
    over[len + 1] = '\0';

    void *ctx = zmq_ctx_new(), *at = zmq_socket(ctx, ZMQ_ROUTER),
         *past = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(at, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(past, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(at, made), 0);
    assert_int_equal(zmq_bind(past, over), 0); /* the kernel takes it */
    assert_true(ps_local_reachable(made));
    assert_false(ps_local_reachable(over));
    zmq_close(at);
    zmq_close(past);
    zmq_ctx_term(ctx);
}

/* A client with local_ipc moves to each shard's same-host endpoint and gets
 * the same answers there; the fixture's client (local_ipc 0) stays on tcp. */
static void test_local_ipc(void **state)
{
    struct fixture *f = *state;
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = other_client(f, PSC_F32, 1);
    char want[PS_ENDPOINT_MAX];
    for (uint32_t s = 0; s < 2; s++) {
        local_name(eps[s], want, sizeof want);
        assert_string_equal(psc_endpoint(c, s), want);
        assert_true(ps_local_reachable(want));
        assert_string_equal(psc_endpoint(f->c, s), eps[s]);
    }
    assert_null(psc_endpoint(c, 2));
    struct psc_table_spec sp;
    big_spec(&sp);
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    uint64_t k;
    assert_int_equal(psc_pull(c, t, 0, N, a, 0, &k), 0);
    wait_ok(c, k);
    assert_int_equal(psc_pull(f->c, f->big, 0, N, b, 0, &k), 0);
    wait_ok(f->c, k);
    assert_memory_equal(a, b, N * sizeof(float));
    free(a);
    free(b);
    psc_destroy(c);
}

/* A client with a shared region: values in psc_shm_alloc buffers move
 * through it (no bytes on the wire for them), others in frames, and the
 * answers match the fixture's client on tcp element for element. */
static void test_shared_memory(void **state)
{
    struct fixture *f = *state;
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = client_or_fail(
        (struct psc_config){.local_ipc = 1, .shm_bytes = 3 * N * sizeof(float)}, eps, 2, 3);
    assert_int_equal(psc_shm_shards(c), 2);
    struct psc_table_spec sp;
    big_spec(&sp);
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    float *w = psc_shm_alloc(c, N * sizeof(float)), *g = psc_shm_alloc(c, N * sizeof(float));
    float *w2 = psc_shm_alloc(c, N * sizeof(float));
    assert_non_null(w2);
    assert_null(psc_shm_alloc(c, N * sizeof(float))); /* full */
    assert_int_equal((uintptr_t)w % 64, 0);
    float *ref = malloc(N * sizeof(float)), *plain = malloc(N * sizeof(float));
    uint64_t k, sent0, recv0, ssent, srecv;
    psc_bytes(c, &sent0, &recv0);
    assert_int_equal(psc_pull(c, t, 0, N, w, 9, &k), 0);
    wait_ok(c, k);
    assert_int_equal(psc_pull(f->c, f->big, 0, N, ref, 9, &k), 0);
    wait_ok(f->c, k);
    assert_memory_equal(w, ref, N * sizeof(float));
    psc_shm_bytes(c, &ssent, &srecv);
    assert_int_equal(srecv, N * sizeof(float));
    memcpy(w2, w, N * sizeof(float)); /* the weights, kept up to date below */
    /* push-pulls across the shard boundary: both ways shared, the gradient
     * only, the weights only */
    uint64_t off = N / 2 - 1000, cnt = 3000;
    for (int round = 0; round < 3; round++) {
        float *gp = round == 2 ? plain : g;
        for (uint64_t i = 0; i < cnt; i++)
            gp[off + i] = grad_of(off + i, 10 + round);
        float *out = round == 1 ? ref : w;
        assert_int_equal(psc_push_pull(c, t, off, cnt, gp + off, out + off, 10, &k), 0);
        wait_ok(c, k);
        for (uint64_t i = off; i < off + cnt; i++)
            if (out[i] != w2[i] - 0.5f * gp[i])
                fail_msg("round %d, element %llu: %.9g, expected %.9g", round,
                         (unsigned long long)i, (double)out[i], (double)(w2[i] - 0.5f * gp[i]));
        memcpy(w2 + off, out + off, cnt * sizeof(float)); /* the weights now */
        if (round == 0) {                                 /* checked against tcp */
            assert_int_equal(psc_pull(f->c, f->big, off, cnt, plain, 10, &k), 0);
            wait_ok(f->c, k);
            assert_memory_equal(plain, w + off, cnt * sizeof(float));
        }
    }
    psc_shm_bytes(c, &ssent, &srecv);
    assert_int_equal(ssent, 2 * cnt * sizeof(float));
    assert_int_equal(srecv, N * sizeof(float) + 2 * cnt * sizeof(float));
    uint64_t sent, recv;
    psc_bytes(c, &sent, &recv);
    assert_true(sent - sent0 >= 3 * cnt * sizeof(float)); /* shared bytes count as moved */
    free(ref);
    free(plain);
    psc_destroy(c);
}

/* Keyed pushes whose keys and values lie in the region (PS_SHM_KEYS,
 * PS_SHM_IN): nothing but headers on the wire, so corked ones go to each
 * shard as one batch; a shard none of the keys fall on gets its padding
 * push in frames; the table ends as frames would leave it (read back over
 * tcp by the fixture's client). */
static void test_keyed_push_through_shared_memory(void **state)
{
    struct fixture *f = *state;
    enum { K = 1000 };
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = client_or_fail(
        (struct psc_config){.local_ipc = 1, .shm_bytes = 3 * K * 12 + 256}, eps, 2, 5);
    assert_int_equal(psc_shm_shards(c), 2);
    struct psc_table_spec sp;
    big_spec(&sp);
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    float *w = malloc(N * sizeof(float)), *want = malloc(N * sizeof(float));
    uint64_t tk[3], k;
    assert_int_equal(psc_pull(f->c, f->big, 0, N, want, 20, &k), 0);
    wait_ok(f->c, k);
    uint64_t *keys[3];
    float *vals[3];
    for (int p = 0; p < 3; p++) { /* pushes 0 and 1 span both shards, 2 only shard 0 */
        keys[p] = psc_shm_alloc(c, K * sizeof(uint64_t));
        vals[p] = psc_shm_alloc(c, K * sizeof(float));
        assert_non_null(vals[p]);
        uint64_t stride = (p < 2 ? N : N / 2) / K;
        for (uint64_t i = 0; i < K; i++) {
            keys[p][i] = i * stride + (uint64_t)p * 7;
            vals[p][i] = grad_of(keys[p][i], 30 + p);
            want[keys[p][i]] -= 0.5f * vals[p][i];
        }
    }
    uint64_t b0 = psc_batches_sent(c), s0, r0;
    psc_shm_bytes(c, &s0, &r0);
    assert_int_equal(psc_cork(c, 1), 0);
    for (int p = 0; p < 2; p++)
        assert_int_equal(psc_push_keys(c, t, keys[p], vals[p], K, 20, &tk[p]), 0);
    assert_int_equal(psc_batches_sent(c), b0); /* held: they carry no frames */
    assert_int_equal(psc_cork(c, 0), 0);
    assert_int_equal(psc_batches_sent(c), b0 + 2); /* one batch per shard */
    assert_int_equal(psc_push_keys(c, t, keys[2], vals[2], K, 20, &tk[2]), 0);
    for (int p = 0; p < 3; p++)
        wait_ok(c, tk[p]);
    uint64_t s1, r1;
    psc_shm_bytes(c, &s1, &r1);
    assert_int_equal(s1 - s0, 3 * K * (sizeof(uint64_t) + sizeof(float)));
    assert_int_equal(psc_pull(f->c, f->big, 0, N, w, 20, &k), 0);
    wait_ok(f->c, k);
    for (uint64_t i = 0; i < N; i++)
        if (w[i] != want[i])
            fail_msg("element %llu: %.9g, expected %.9g", (unsigned long long)i, (double)w[i],
                     (double)want[i]);
    free(w);
    free(want);
    psc_destroy(c);
}

/* Rows of a sparse table through the region: a request whose keys all go
 * to one shard moves its keys, gradients and pulled rows there (nothing
 * but headers on the wire), one that spans both shards goes in frames;
 * every answer matches the fixture's client on tcp, and a push-pull
 * takes the SGD step it should. */
static void test_sparse_rows_through_shared_memory(void **state)
{
    struct fixture *f = *state;
    enum { K = 500, D = 4 };
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = client_or_fail(
        (struct psc_config){.local_ipc = 1, .shm_bytes = 2 * K * 8 + 2 * K * D * 4 + 512}, eps, 2,
        6);
    assert_int_equal(psc_shm_shards(c), 2);
    struct psc_table_spec s;
    rows_spec(&s, "emb.shm", D, 4 * K, 9);
    uint32_t t, tt;
    assert_int_equal(psc_table_create(c, &s, TIMEOUT_MS, &t), 0);
    assert_int_equal(psc_table_create(f->c, &s, TIMEOUT_MS, &tt), 0);
    uint64_t *one = psc_shm_alloc(c, K * 8), *both = psc_shm_alloc(c, K * 8);
    float *w = psc_shm_alloc(c, K * D * 4), *g = psc_shm_alloc(c, K * D * 4);
    assert_non_null(g);
    for (uint64_t k = 0, n = 0; n < K; k++) /* keys of shard 1 only */
        if (ps_shard_of_key(k * 31, 2) == 1)
            one[n++] = k * 31;
    for (uint64_t i = 0; i < K; i++)
        both[i] = i * 7 + 3;
    static float ref[K * D];
    uint64_t tk, s0, r0, s1, r1;
    for (int spans = 0; spans < 2; spans++) {
        const uint64_t *keys = spans ? both : one;
        psc_shm_bytes(c, &s0, &r0);
        assert_int_equal(psc_pull_rows(c, t, keys, K, w, 0, &tk), 0);
        wait_ok(c, tk);
        assert_int_equal(psc_pull_rows(f->c, tt, keys, K, ref, 0, &tk), 0);
        wait_ok(f->c, tk);
        assert_memory_equal(w, ref, sizeof ref);
        for (size_t i = 0; i < K * D; i++)
            g[i] = 0.001f * (float)(i % 89) - 0.04f;
        assert_int_equal(psc_push_pull_rows(c, t, keys, K, g, w, 0, &tk), 0);
        wait_ok(c, tk);
        for (size_t i = 0; i < K * D; i++)
            if (w[i] != ref[i] - 0.5f * g[i])
                fail_msg("spans %d, row %zu value %zu: %.9g, expected %.9g", spans, i / D, i % D,
                         (double)w[i], (double)(ref[i] - 0.5f * g[i]));
        assert_int_equal(psc_pull_rows(f->c, tt, keys, K, ref, 0, &tk), 0);
        wait_ok(f->c, tk);
        assert_memory_equal(w, ref, sizeof ref);
        psc_shm_bytes(c, &s1, &r1);
        /* through the region: the keys twice and the gradients; the rows twice */
        assert_int_equal(s1 - s0, spans ? 0 : 2 * K * 8 + K * D * 4);
        assert_int_equal(r1 - r0, spans ? 0 : 2 * K * D * 4);
    }
    psc_destroy(c);
}

/* Issues n pulls of 8 elements each from the start of the big table (all
 * on shard 0) into out[8i..], tickets in tk. */
static void pulls_of_eight(struct psc_client *c, uint32_t t, int n, float *out, uint64_t *tk)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(psc_pull(c, t, (uint64_t)i * 8, 8, out + i * 8, 9, &tk[i]), 0);
}

/* psc_cork: requests with no frames go to a shard together, at most
 * PS_BATCH_MAX of them (the one past it starts the next batch), and once
 * they move PSC_BATCH_FLUSH_BYTES through the region they go at once;
 * every answer is the one a request sent alone gets. */
static void test_cork_batches(void **state)
{
    struct fixture *f = *state;
    enum { MAX = PS_BATCH_MAX };
    static float out[(MAX + 1) * 8], ref[(MAX + 1) * 8];
    static uint64_t tk[MAX + 1];
    uint64_t k;
    assert_int_equal(psc_pull(f->c, f->big, 0, (MAX + 1) * 8, ref, 9, &k), 0);
    wait_ok(f->c, k);
    uint64_t b0 = psc_batches_sent(f->c);
    assert_int_equal(psc_cork(f->c, 1), 0);
    pulls_of_eight(f->c, f->big, MAX, out, tk);
    assert_int_equal(psc_batches_sent(f->c), b0); /* all held: at the limit, not past it */
    assert_int_equal(psc_cork(f->c, 0), 0);
    assert_int_equal(psc_batches_sent(f->c), b0 + 1);
    for (int i = 0; i < MAX; i++)
        wait_ok(f->c, tk[i]);
    assert_memory_equal(out, ref, MAX * 8 * sizeof(float));

    memset(out, 0, sizeof out);
    assert_int_equal(psc_cork(f->c, 1), 0);
    pulls_of_eight(f->c, f->big, MAX + 1, out, tk);
    assert_int_equal(psc_batches_sent(f->c), b0 + 2); /* one past: the full batch went */
    assert_int_equal(psc_cork(f->c, 0), 0);
    assert_int_equal(psc_batches_sent(f->c), b0 + 2); /* the last one alone */
    for (int i = 0; i <= MAX; i++)
        wait_ok(f->c, tk[i]);
    assert_memory_equal(out, ref, sizeof out);

    /* through the region: held until they move PSC_BATCH_FLUSH_BYTES */
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    struct psc_client *c = client_or_fail(
        (struct psc_config){.local_ipc = 1, .shm_bytes = 2 * PSC_BATCH_FLUSH_BYTES}, eps, 2, 4);
    assert_int_equal(psc_shm_shards(c), 2);
    struct psc_table_spec sp;
    big_spec(&sp);
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    const uint64_t floats = PSC_BATCH_FLUSH_BYTES / sizeof(float); /* all on shard 0 */
    float *w = psc_shm_alloc(c, PSC_BATCH_FLUSH_BYTES);
    assert_non_null(w);
    assert_int_equal(psc_cork(c, 1), 0);
    assert_int_equal(psc_pull(c, t, 0, 1, w, 9, &tk[0]), 0);
    assert_int_equal(psc_pull(c, t, 1, floats - 2, w + 1, 9, &tk[1]), 0);
    assert_int_equal(psc_batches_sent(c), 0); /* 4 bytes short of the limit: held */
    assert_int_equal(psc_pull(c, t, floats - 1, 1, w + floats - 1, 9, &tk[2]), 0);
    assert_int_equal(psc_batches_sent(c), 1); /* at it: gone while still corked */
    assert_int_equal(psc_cork(c, 0), 0);
    for (int i = 0; i < 3; i++)
        wait_ok(c, tk[i]);
    float *whole = malloc(PSC_BATCH_FLUSH_BYTES);
    assert_int_equal(psc_pull(f->c, f->big, 0, floats, whole, 9, &k), 0);
    wait_ok(f->c, k);
    assert_memory_equal(w, whole, PSC_BATCH_FLUSH_BYTES);
    free(whole);
    psc_destroy(c);
}

/* A shard restarted on the same port has lost the region: it refuses the
 * shared-memory request (PS_ESHM), the client sends it again in frames,
 * and the answer is right. The client hands the region over again, and
 * the requests after that go through it. */
static void test_shared_memory_after_restart(void **state)
{
    (void)state;
    struct psd_proc p;
    const char *args[] = {"--shard", "0", "--shards", "1", NULL};
    assert_int_equal(harness_psd_start(&p, args), 0);
    char ep[256];
    snprintf(ep, sizeof ep, "%s", p.endpoint);
    const char *eps[1] = {ep};
    struct psc_client *c = client_or_fail(
        (struct psc_config){.retry_ms = 200, .local_ipc = 1, .shm_bytes = 1 << 20}, eps, 1, 0);
    assert_int_equal(psc_shm_shards(c), 1);
    struct psc_table_spec sp;
    psc_table_spec_init(&sp, "small", 1000);
    sp.lr = 1.0f;
    sp.init = PSC_INIT_CONSTANT;
    sp.init_scale = 1.0f;
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    float *g = psc_shm_alloc(c, 1000 * sizeof(float)), *w = psc_shm_alloc(c, 1000 * sizeof(float));
    for (int i = 0; i < 1000; i++)
        g[i] = 0.25f;
    uint64_t k;
    assert_int_equal(psc_push_pull(c, t, 0, 1000, g, w, 0, &k), 0);
    wait_ok(c, k);
    assert_true(w[999] == 0.75f);
    uint64_t s0, r0;
    psc_shm_bytes(c, &s0, &r0);
    assert_int_equal(s0, 4000);

    /* the same port, a new process: no table, no region */
    assert_int_equal(harness_psd_stop(&p), 0);
    const char *again[] = {"--shard", "0", "--shards", "1", "--listen", ep, NULL};
    assert_int_equal(harness_psd_start(&p, again), 0);
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    assert_int_equal(psc_push_pull(c, t, 0, 1000, g, w, 1, &k), 0);
    wait_ok(c, k);
    for (int i = 0; i < 1000; i++)
        assert_true(w[i] == 0.75f);
    uint64_t s1, r1;
    psc_shm_bytes(c, &s1, &r1);
    assert_int_equal(s1, 2 * s0); /* the refused try named the region; the re-send did not */
    assert_int_equal(r1, r0);
    struct psc_shard_stats st = {
        .struct_size = sizeof st}; /* answered after the hello that binds the region again */
    assert_int_equal(psc_stats(c, 0, TIMEOUT_MS, &st), 0);
    assert_int_equal(st.errors, 1); /* the refusal */
    assert_int_equal(psc_shm_shards(c), 1);
    assert_int_equal(psc_push_pull(c, t, 0, 1000, g, w, 2, &k), 0);
    wait_ok(c, k);
    assert_true(w[0] == 0.5f);
    psc_shm_bytes(c, &s0, &r0);
    assert_int_equal(s0, s1 + 4000); /* through the region again */
    assert_int_equal(psc_stats(c, 0, TIMEOUT_MS, &st), 0);
    assert_int_equal(st.errors, 1);
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&p), 0);
}

/* Threads of this process. */
static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    return n;
}

/* Clients sharing one ZeroMQ context (psc_config.zmq_context): one I/O
 * thread for all of them, payloads past the zero-copy size copied, one
 * client destroyed while the others go on, the context terminated by
 * its owner after the last. */
static void test_shared_context(void **state)
{
    struct fixture *f = *state;
    const char *eps[2] = {f->shard[0].endpoint, f->shard[1].endpoint};
    void *ctx = zmq_ctx_new();
    assert_non_null(ctx);
    struct psc_client *c[3] = {NULL};
    char err[512];
    int io_cpu = 0;
    struct psc_config bad = {.struct_size = sizeof bad,
                             .servers = eps,
                             .nservers = 2,
                             .worker_id = 20,
                             .connect_timeout_ms = TIMEOUT_MS,
                             .zmq_context = ctx,
                             .io_cpus = &io_cpu,
                             .nio_cpus = 1};
    assert_int_equal(psc_create(&bad, &c[0], err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "shared zmq_context"));
    int after_first = 0;
    for (int k = 0; k < 3; k++) {
        struct psc_config cfg = {.struct_size = sizeof cfg,
                                 .servers = eps,
                                 .nservers = 2,
                                 .worker_id = 20 + (uint32_t)k,
                                 .connect_timeout_ms = TIMEOUT_MS,
                                 .zmq_context = ctx};
        if (psc_create(&cfg, &c[k], err, sizeof err) != 0)
            fail_msg("client %d: %s", k, err);
        if (k == 0)
            after_first = threads_now();
    }
    assert_true(threads_now() <= after_first); /* no thread of their own */
    enum { M = 64 * 1024 };                    /* 256 KiB: past the zero-copy size */
    struct psc_table_spec sp;
    psc_table_spec_init(&sp, "shared_ctx", M);
    sp.lr = 1.0f;
    float *g = malloc(M * 4), *w = malloc(M * 4);
    assert_true(g && w);
    for (int i = 0; i < M; i++)
        g[i] = 0.5f;
    for (int k = 0; k < 3; k++) {
        uint32_t t;
        uint64_t tk;
        assert_int_equal(psc_table_create(c[k], &sp, TIMEOUT_MS, &t), 0);
        assert_int_equal(psc_push_pull(c[k], t, 0, M, g, w, 0, &tk), 0);
        wait_ok(c[k], tk);
        if (k == 0)
            psc_destroy(c[0]); /* the others go on in the context */
    }
    uint32_t t;
    uint64_t tk;
    assert_int_equal(psc_table_open(c[2], "shared_ctx", TIMEOUT_MS, &t), 0);
    assert_int_equal(psc_pull(c[2], t, 0, M, w, 3, &tk), 0);
    wait_ok(c[2], tk);
    assert_true(w[0] == -1.5f && w[M - 1] == -1.5f); /* three pushes of 0.5, lr 1 */
    psc_destroy(c[1]);
    psc_destroy(c[2]);
    assert_int_equal(zmq_ctx_term(ctx), 0);
    free(g);
    free(w);
}

/* A dtype per shard: a client with f16 on the wire sends f32 to the
 * shard that took its shared region (on this host there is no wire to
 * save), through the region or in frames, and f16 to the shard it
 * reaches over tcp (psd --no-local-ipc). Shard 0's weights come out
 * exact, shard 1's rounded to f16 both ways. */
static void test_dtype_per_shard(void **state)
{
    (void)state;
    struct psd_proc p[2];
    const char *a0[] = {"--shard", "0", "--shards", "2", NULL};
    const char *a1[] = {"--shard", "1", "--shards", "2", "--no-local-ipc", NULL};
    assert_int_equal(harness_psd_start(&p[0], a0), 0);
    assert_int_equal(harness_psd_start(&p[1], a1), 0);
    const char *eps[2] = {p[0].endpoint, p[1].endpoint};
    enum { M = 1000 };
    struct psc_client *c = client_or_fail(
        (struct psc_config){.wire_dtype = PSC_F16, .local_ipc = 1, .shm_bytes = 4 * M * 4}, eps, 2,
        0);
    assert_int_equal(psc_shm_shards(c), 1);
    assert_non_null(strstr(psc_endpoint(c, 0), "ipc://"));
    assert_non_null(strstr(psc_endpoint(c, 1), "tcp://"));
    struct psc_table_spec sp;
    psc_table_spec_init(&sp, "per_shard", M);
    sp.lr = 1.0f;
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, TIMEOUT_MS, &t), 0);
    float *g = psc_shm_alloc(c, M * 4), *w = psc_shm_alloc(c, M * 4);
    float *plain = malloc(M * 4), *w2 = malloc(M * 4);
    assert_true(g && w && plain && w2);
    for (int i = 0; i < M; i++) /* not one of them an f16 */
        plain[i] = g[i] = 1.0f / 3.0f + (float)i * 1e-4f;
    uint64_t k, s0, r0, s1, r1;
    psc_shm_bytes(c, &s0, &r0);
    assert_int_equal(psc_push_pull(c, t, 0, M, g, w, 0, &k), 0);
    wait_ok(c, k);
    psc_shm_bytes(c, &s1, &r1);
    assert_int_equal(s1 - s0, (M / 2) * 4); /* shard 0's half, through the region */
    assert_int_equal(r1 - r0, (M / 2) * 4);
    /* and from buffers outside the region: f32 frames to shard 0 */
    assert_int_equal(psc_push_pull(c, t, 0, M, plain, w2, 1, &k), 0);
    wait_ok(c, k);
    for (int i = 0; i < M; i++) {
        float h = ps_f16_to_f32(ps_f32_to_f16(plain[i]));
        float one = i < M / 2 ? -plain[i] : ps_f16_to_f32(ps_f32_to_f16(-h));
        float two = i < M / 2 ? -2.0f * plain[i] : ps_f16_to_f32(ps_f32_to_f16(-2.0f * h));
        if (w[i] != one || w2[i] != two)
            fail_msg("element %d (shard %d): %.9g and %.9g, expected %.9g and %.9g", i,
                     i < M / 2 ? 0 : 1, (double)w[i], (double)w2[i], (double)one, (double)two);
    }
    free(plain);
    free(w2);
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&p[0]), 0);
    assert_int_equal(harness_psd_stop(&p[1]), 0);
}

/* Answers one hello as shard 0 of 1, offering `offer` as its same-host
 * endpoint under an instance no psd has. */
struct fake_shard {
    void *ctx, *sock;
    char endpoint[PS_ENDPOINT_MAX];
    const char *offer;
    pthread_t thread;
    int answered;
};

static void *fake_shard_main(void *arg)
{
    struct fake_shard *fs = arg;
    zmq_pollitem_t it = {fs->sock, 0, ZMQ_POLLIN, 0};
    uint8_t route[256], hdr[PS_HEADER_BYTES_MAX];
    if (zmq_poll(&it, 1, TIMEOUT_MS) != 1)
        return NULL;
    int rl = zmq_recv(fs->sock, route, sizeof route, 0);
    int hl = rl > 0 ? zmq_recv(fs->sock, hdr, sizeof hdr, 0) : -1;
    Ps__Header *req = hl > 0 ? ps__header__unpack(NULL, (size_t)hl, hdr) : NULL;
    if (req == NULL)
        return NULL;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.request_id = req->request_id;
    h.worker_id = req->worker_id;
    h.shard = 0;
    h.shards = 1;
    h.local_endpoint = (char *)fs->offer;
    h.instance = 12345;
    ps__header__free_unpacked(req, NULL);
    int64_t len = ps_wire_header_pack(&h, hdr, sizeof hdr);
    if (len > 0 && zmq_send(fs->sock, route, (size_t)rl, ZMQ_SNDMORE) == rl &&
        zmq_send(fs->sock, hdr, (size_t)len, 0) == len)
        fs->answered = 1;
    return NULL;
}

/* Where the endpoint offered is not the shard that offered it (another
 * process answers there), or a shard offers none (--no-local-ipc), the
 * client stays on the endpoint it was given. */
static void test_local_ipc_refused(void **state)
{
    (void)state;
    struct psd_proc other, plain;
    const char *a_other[] = {NULL};
    const char *a_plain[] = {"--no-local-ipc", NULL};
    assert_int_equal(harness_psd_start(&other, a_other), 0);
    assert_int_equal(harness_psd_start(&plain, a_plain), 0);
    char offer[PS_ENDPOINT_MAX], plain_local[PS_ENDPOINT_MAX];
    local_name(other.endpoint, offer, sizeof offer);
    local_name(plain.endpoint, plain_local, sizeof plain_local);
    assert_true(ps_local_reachable(offer));
    assert_false(ps_local_reachable(plain_local));

    struct fake_shard fs = {.offer = offer};
    fs.ctx = zmq_ctx_new();
    fs.sock = zmq_socket(fs.ctx, ZMQ_ROUTER);
    int linger = 0;
    size_t elen = sizeof fs.endpoint;
    zmq_setsockopt(fs.sock, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(fs.sock, "tcp://127.0.0.1:0"), 0);
    assert_int_equal(zmq_getsockopt(fs.sock, ZMQ_LAST_ENDPOINT, fs.endpoint, &elen), 0);
    assert_int_equal(pthread_create(&fs.thread, NULL, fake_shard_main, &fs), 0);
    const char *eps[1] = {fs.endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 1,
                             .worker_id = 3,
                             .connect_timeout_ms = TIMEOUT_MS,
                             .local_ipc = 1};
    struct psc_client *c = NULL;
    char err[512];
    int rc = psc_create(&cfg, &c, err, sizeof err);
    pthread_join(fs.thread, NULL);
    if (rc != 0)
        fail_msg("psc_create: %s", err);
    assert_true(fs.answered);
    assert_string_equal(psc_endpoint(c, 0), fs.endpoint); /* another instance answered */
    psc_destroy(c);
    zmq_close(fs.sock);
    zmq_ctx_term(fs.ctx);

    eps[0] = plain.endpoint;
    assert_int_equal(psc_create(&cfg, &c, err, sizeof err), 0);
    assert_string_equal(psc_endpoint(c, 0), plain.endpoint);
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&other), 0);
    assert_int_equal(harness_psd_stop(&plain), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_matches_init),
        cmocka_unit_test(test_push_then_pull_every_element),
        cmocka_unit_test(test_window_of_eight),
        cmocka_unit_test(test_wait_zero_polls),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_pieces_bsp),
        cmocka_unit_test(test_queue_past_default_hwm),
        cmocka_unit_test(test_keyed_push),
        cmocka_unit_test(test_pull_view),
        cmocka_unit_test(test_create_idempotent_and_conflict),
        cmocka_unit_test(test_client_side_errors),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_dtype_per_shard),
        cmocka_unit_test(test_shared_context),
        cmocka_unit_test(test_sized_structs),
        cmocka_unit_test(test_f16_on_the_wire),
        cmocka_unit_test(test_sparse_rows),
        cmocka_unit_test(test_sparse_rows_one_shard),
        cmocka_unit_test(test_sparse_rows_through_shared_memory),
        cmocka_unit_test(test_unreachable_and_misordered),
        cmocka_unit_test(test_shared_memory),
        cmocka_unit_test(test_shared_memory_after_restart),
        cmocka_unit_test(test_keyed_push_through_shared_memory),
        cmocka_unit_test(test_cork_batches),
        cmocka_unit_test(test_local_names),
        cmocka_unit_test(test_local_name_limit),
        cmocka_unit_test(test_local_ipc),
        cmocka_unit_test(test_local_ipc_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
