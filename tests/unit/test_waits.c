/* Waiting requests in an in-process psd (bsp, 2 workers): pulls for a
 * clock not reached wait; one worker may keep PS_WAITS_PER_WORKER_MAX
 * waiting and no more (at the limit, one past it), and another worker is
 * not affected; a push that completes the round answers them all. */
#include "checkpoint.h"
#include "psd.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static unsigned sent;

static void count_sent(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    (void)ctx;
    (void)route;
    (void)route_len;
    sent++;
    psd_reply_drop(rep);
}

/* Dispatches h; returns 1 with the reply status in *status, 0 if waiting. */
static int send_req(struct psd *s, const Ps__Header *h, const void *vals, size_t vbytes,
                    int *status)
{
    uint8_t buf[512];
    struct ps_frame f[2] = {{buf, ps__header__pack(h, buf)}, {vals, vbytes}};
    struct ps_frame route = {"r", 1};
    struct psd_reply rep;
    int now = psd_dispatch(s, &route, f, vals ? 2 : 1, &rep);
    if (now) {
        Ps__Header *r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
        assert_non_null(r);
        *status = r->status;
        ps__header__free_unpacked(r, NULL);
        psd_reply_drop(&rep);
    }
    return now;
}

static void pull(struct psd *s, uint32_t worker, uint64_t id, int expect_wait, int expect_status)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.worker_id = worker;
    h.request_id = id;
    h.clock = 1; /* round 0 not done yet */
    h.count = 4;
    int status = 0;
    int now = send_req(s, &h, NULL, 0, &status);
    assert_int_equal(now, !expect_wait);
    if (now)
        assert_int_equal(status, expect_status);
}

/* A shard in mode `mode` with `workers` workers and a table "t" of 4
 * floats; with a session, worker 0 says hello first (exactly-once on). */
static void start(struct psd *s, struct ps_log *log, const char *mode, uint32_t workers,
                  uint64_t session)
{
    ps_log_init(log, "test", PS_LOG_ERROR);
    struct psd_params p = {
        .shard = 0, .shards = 1, .value_bytes_max = 1u << 20, .wait_timeout_ms = 3600000};
    assert_int_equal(psd_cons_parse(mode, &p.cons), 0);
    p.cons.workers = workers;
    assert_int_equal(psd_init(s, log, &p), 0);
    psd_set_sender(s, count_sent, NULL);
    Ps__Header h;
    int status = -1;
    if (session != 0) {
        ps_wire_header_init(&h, PS__OP__OP_HELLO);
        h.session = session;
        h.request_id = 1;
        assert_true(send_req(s, &h, NULL, 0, &status));
        assert_int_equal(status, 0);
    }
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "t";
    sp.size = 4;
    sp.lr = 1.0f;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    h.request_id = 2;
    assert_true(send_req(s, &h, NULL, 0, &status));
    assert_int_equal(status, 0);
}

static void test_waits_per_worker(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    start(&s, &log, "bsp", 2, 0);
    Ps__Header h;
    int status = -1;
    for (unsigned i = 0; i < PS_WAITS_PER_WORKER_MAX; i++) /* up to the limit: they wait */
        pull(&s, 0, 10 + i, 1, 0);
    pull(&s, 0, 9999, 0, PS_ELIMIT); /* one past: refused at once */
    pull(&s, 1, 5, 1, 0);            /* another worker still waits normally */
    assert_int_equal(s.nwaits, PS_WAITS_PER_WORKER_MAX + 1);
    const float g[4] = {1, 1, 1, 1};
    for (uint32_t w = 0; w < 2; w++) { /* both push clock 0: the round completes */
        ps_wire_header_init(&h, PS__OP__OP_PUSH);
        h.worker_id = w;
        h.count = 4;
        assert_true(send_req(&s, &h, g, sizeof g, &status));
        assert_int_equal(status, 0);
    }
    assert_int_equal(s.nwaits, 0);
    assert_int_equal(sent, PS_WAITS_PER_WORKER_MAX + 1); /* every waiting pull answered */
    psd_fini(&s);
}

static void push_id(struct psd *s, uint64_t id)
{
    const float g[4] = {1, 1, 1, 1};
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.request_id = id;
    h.count = 4;
    int status = -1;
    assert_true(send_req(s, &h, g, sizeof g, &status));
    assert_int_equal(status, 0);
}

/* Exactly-once with requests out of order: after a server restart, the
 * requests a client queued behind a lost one reach the new process before
 * the lost one's retry. The retry must be applied; copies of applied ones
 * must not. */
static void test_push_retry_out_of_order(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    start(&s, &log, "asp", 1, 77);
    push_id(&s, 5);
    push_id(&s, 7); /* 6 was lost on the way */
    assert_int_equal(s.tables[0]->steps, 2);
    push_id(&s, 6); /* its retry: applied */
    assert_int_equal(s.tables[0]->steps, 3);
    assert_int_equal(s.duplicates_dropped, 0);
    push_id(&s, 6); /* copies of applied ones: not */
    push_id(&s, 7);
    push_id(&s, 5);
    assert_int_equal(s.tables[0]->steps, 3);
    assert_int_equal(s.duplicates_dropped, 3);
    push_id(&s, 5 + PSD_DEDUP_WINDOW + 10); /* far ahead: the window moves */
    push_id(&s, 8);                         /* below it: counted as applied */
    assert_int_equal(s.tables[0]->steps, 4);
    assert_int_equal(s.duplicates_dropped, 4);
    uint64_t top = 5 + PSD_DEDUP_WINDOW + 10;
    push_id(&s, top - (PSD_DEDUP_WINDOW - 1)); /* at the window's edge: remembered, applied */
    assert_int_equal(s.tables[0]->steps, 5);
    push_id(&s, top - PSD_DEDUP_WINDOW); /* one past it: counted as applied */
    assert_int_equal(s.tables[0]->steps, 5);
    assert_int_equal(s.duplicates_dropped, 5);
    psd_fini(&s);
}

/* A push-pull waiting for its round, sent again by a client that had no
 * answer yet: not applied twice, and merged with the waiting one (answered
 * once, counted once against the worker's limit). */
static void test_retry_of_waiting_request(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    start(&s, &log, "bsp", 2, 77);
    sent = 0;
    const float g[4] = {1, 1, 1, 1};
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH_PULL);
    h.request_id = 10;
    h.count = 4;
    int status = -1;
    for (int copy = 0; copy < 3; copy++)
        assert_false(send_req(&s, &h, g, sizeof g, &status)); /* waits for worker 1 */
    assert_int_equal(s.nwaits, 1);
    assert_int_equal(s.waits_refreshed, 2);
    assert_int_equal(s.duplicates_dropped, 2);
    h.worker_id = 1;
    h.request_id = 3;
    assert_true(send_req(&s, &h, g, sizeof g, &status)); /* completes the round: answered */
    assert_int_equal(status, 0);
    assert_int_equal(s.nwaits, 0);
    assert_int_equal(sent, 1); /* worker 0's, once */
    for (int i = 0; i < 4; i++)
        assert_float_equal(s.tables[0]->w[i], -1.0f, 0); /* the mean of two pushes of 1 */
    psd_fini(&s);
}

/* The window of ids applied one by one survives a checkpoint: a request
 * lost before it (id 6, behind 7) is applied when its retry reaches the
 * restored server; the others are not applied twice. */
static void test_dedup_window_in_checkpoint(void **state)
{
    (void)state;
    static struct psd s, r;
    struct ps_log log;
    char dir[] = "/tmp/pstest-waits-XXXXXX", path[4200], err[512];
    assert_non_null(mkdtemp(dir));
    start(&s, &log, "asp", 1, 77);
    push_id(&s, 5);
    push_id(&s, 7); /* 6 lost on the way */
    assert_int_equal(psd_checkpoint_write(&s, dir, path, sizeof path, err, sizeof err), 0);
    psd_fini(&s);
    struct psd_params p = {
        .shard = 0, .shards = 1, .value_bytes_max = 1u << 20, .wait_timeout_ms = 3600000};
    assert_int_equal(psd_cons_parse("asp", &p.cons), 0);
    p.cons.workers = 1;
    assert_int_equal(psd_init(&r, &log, &p), 0);
    assert_int_equal(psd_checkpoint_restore(&r, dir, path, sizeof path), 1);
    assert_int_equal(r.tables[0]->steps, 2);
    push_id(&r, 6); /* its retry: applied */
    assert_int_equal(r.tables[0]->steps, 3);
    push_id(&r, 7);
    push_id(&r, 5);
    assert_int_equal(r.tables[0]->steps, 3);
    psd_fini(&r);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_per_worker),
        cmocka_unit_test(test_push_retry_out_of_order),
        cmocka_unit_test(test_retry_of_waiting_request),
        cmocka_unit_test(test_dedup_window_in_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
