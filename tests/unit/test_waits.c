/* Replies through the sender in an in-process psd. Waiting requests (bsp,
 * 2 workers): pulls for a clock not reached wait; one worker may keep
 * PS_WAITS_PER_WORKER_MAX waiting and no more (at the limit, one past it),
 * and another worker is not affected; a push that completes the round
 * answers them all, and one that waits too long is answered with a
 * timeout. Pushes in asp/ssp answered before their step. */
#define _GNU_SOURCE /* memmem */
#include "catalog.h"
#include "checkpoint.h"
#include "counters.h"
#include "dedup.h"
#include "psd.h"
#include "reply.h"
#include "waits.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_log.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* Replies that went through the sender, in order: each one's request id,
 * status, bytes and values, and table 0's first 4 weights when it was
 * sent. */
#define SENT_MAX 16
static unsigned sent;
static struct sent_reply {
    uint64_t request_id;
    int status;
    size_t bytes; /* header, mask and values */
    float vals[4], w[4];
} sent_log[SENT_MAX];

static void count_sent(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    const struct psd *s = ctx;
    (void)route;
    (void)route_len;
    struct sent_reply *r = &sent_log[sent++ % SENT_MAX];
    memset(r, 0, sizeof *r);
    Ps__Header *h = ps__header__unpack(NULL, rep->hdr_len, rep->hdr);
    assert_non_null(h);
    r->request_id = h->request_id;
    r->status = h->status;
    r->bytes = rep->hdr_len + rep->mask_bytes + rep->vals_bytes;
    ps__header__free_unpacked(h, NULL);
    if (rep->vals != NULL)
        memcpy(r->vals, rep->vals,
               rep->vals_bytes < sizeof r->vals ? rep->vals_bytes : sizeof r->vals);
    if (psd_ntables(s) > 0)
        memcpy(r->w, psd_table_at(s, 0)->w, sizeof r->w);
    psd_reply_drop(rep);
}

/* Dispatches h; returns 1 with the reply status in *status, 0 if waiting. */
static int send_req(struct psd *s, const Ps__Header *h, const void *vals, size_t vbytes,
                    int *status)
{
    uint8_t buf[512];
    struct ps_frame f[2] = {{buf, ps__header__pack(h, buf)}, {vals, vbytes}};
    char id[2] = {'r', (char)('0' + h->worker_id % 10)}; /* a connection per worker */
    struct ps_frame route = {id, sizeof id};
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

/* Dispatches h as send_req does; 1 when it was answered, at once or
 * through the sender during the call (a push answered before its step),
 * with the status in *status. */
static int answered(struct psd *s, const Ps__Header *h, const void *vals, size_t vbytes,
                    int *status)
{
    unsigned before = sent;
    if (send_req(s, h, vals, vbytes, status))
        return 1;
    for (unsigned i = before; i < sent; i++)
        if (sent_log[i % SENT_MAX].request_id == h->request_id) {
            *status = sent_log[i % SENT_MAX].status;
            return 1;
        }
    return 0;
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

/* Creates table "t" of 4 floats (SGD, lr 1). */
static void create_t(struct psd *s)
{
    Ps__Header h;
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "t";
    sp.size = 4;
    sp.lr = 1.0f;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    h.request_id = 2;
    int status = -1;
    assert_true(send_req(s, &h, NULL, 0, &status));
    assert_int_equal(status, 0);
}

/* A shard in mode `mode` with `workers` workers and a table "t" of 4
 * floats; with a session, worker 0 says hello first (exactly-once on).
 * Its unread-bytes limits are unread_max and unread_total_max (0: the
 * defaults). */
static void start_with(struct psd *s, struct ps_log *log, const char *mode, uint32_t workers,
                       uint64_t session, uint64_t unread_max, uint64_t unread_total_max)
{
    ps_log_init(log, "test", PS_LOG_ERROR);
    struct psd_params p = {.shard = 0,
                           .shards = 1,
                           .value_bytes_max = 1u << 20,
                           .wait_timeout_ms = 3600000,
                           .unread_bytes_max = unread_max,
                           .unread_bytes_total_max = unread_total_max};
    assert_int_equal(psd_cons_parse(mode, &p.cons), 0);
    p.cons.workers = workers;
    assert_int_equal(psd_init(s, log, &p), 0);
    psd_set_sender(s, count_sent, s);
    Ps__Header h;
    int status = -1;
    if (session != 0) {
        ps_wire_header_init(&h, PS__OP__OP_HELLO);
        h.session = session;
        h.request_id = 1;
        assert_true(send_req(s, &h, NULL, 0, &status));
        assert_int_equal(status, 0);
    }
    create_t(s);
}

static void start(struct psd *s, struct ps_log *log, const char *mode, uint32_t workers,
                  uint64_t session)
{
    start_with(s, log, mode, workers, session, 0, 0);
}

static uint32_t waiting(const struct psd *s)
{
    return psd_waits_stats(s).waiting;
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
    pull(&s, 0, 10, 1, 0);           /* a retry of a waiting one: merged, not refused */
    pull(&s, 1, 5, 1, 0);            /* another worker still waits normally */
    assert_int_equal(waiting(&s), PS_WAITS_PER_WORKER_MAX + 1);
    const float g[4] = {1, 1, 1, 1};
    for (uint32_t w = 0; w < 2; w++) { /* both push clock 0: the round completes */
        ps_wire_header_init(&h, PS__OP__OP_PUSH);
        h.worker_id = w;
        h.count = 4;
        assert_true(send_req(&s, &h, g, sizeof g, &status));
        assert_int_equal(status, 0);
    }
    assert_int_equal(waiting(&s), 0);
    assert_int_equal(sent, PS_WAITS_PER_WORKER_MAX + 1); /* every waiting pull answered */
    psd_fini(&s);
}

/* What the fake transport says is unread (psd_unread_cb). */
static uint64_t unread_peer, unread_total;
static int unread_known;

static int fake_unread(void *ctx, const void *route, size_t len, uint64_t *peer, uint64_t *total)
{
    (void)ctx;
    (void)route;
    (void)len;
    *peer = unread_peer;
    *total = unread_total;
    return unread_known;
}

/* A pull's 16 bytes of values fit what its connection may leave unread up
 * to the byte: at the bound it is answered, one past it is refused; the
 * same for the total; an empty queue takes a reply over the bound; no
 * record of the connection refuses it. */
static void test_unread_bounds(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    const struct {
        uint64_t peer, total, max;
        int known, status;
    } cases[] = {
        {984, 984, 1000, 1, 0},         /* 984 + 16: at the bound */
        {985, 985, 1000, 1, PS_ELIMIT}, /* one past */
        {0, 0, 10, 1, 0},               /* an empty queue: one reply of any size */
        {0, 4984, 1000, 1, 0},          /* the total at its bound */
        {0, 4985, 1000, 1, PS_ELIMIT},  /* one past */
        {0, 0, 1000, 0, PS_ELIMIT},     /* no record for the connection */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unread_peer = cases[i].peer;
        unread_total = cases[i].total;
        unread_known = cases[i].known;
        start_with(&s, &log, "asp", 1, 0, cases[i].max, 5000);
        psd_set_unread(&s, fake_unread, NULL);
        pull(&s, 0, 100 + i, 0, cases[i].status);
        assert_int_equal(psd_unread_refused(&s), cases[i].status != 0);
        psd_fini(&s);
    }
}

/* A pull that waits past psd's wait timeout: psd_tick answers it with
 * PS_ETIMEDOUT through the sender and counts the reply's bytes as sent. */
static void test_wait_times_out(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    start(&s, &log, "bsp", 2, 0);
    psd_set_wait_timeout(&s, 1);
    pull(&s, 0, 77, 1, 0);
    unsigned before = sent;
    uint64_t out = psd_counts(&s)->bytes_out;
    int64_t give_up = ps_mono_ms() + 5000;
    while (sent == before && ps_mono_ms() < give_up)
        psd_tick(&s);
    assert_int_equal(sent, before + 1);
    const struct sent_reply *r = &sent_log[before % SENT_MAX];
    assert_int_equal(r->request_id, 77);
    assert_int_equal(r->status, PS_ETIMEDOUT);
    assert_int_equal(psd_waits_stats(&s).timeouts, 1);
    assert_int_equal(waiting(&s), 0);
    assert_true(r->bytes > 0);
    assert_int_equal(psd_counts(&s)->bytes_out - out, r->bytes);
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
    assert_true(answered(s, &h, g, sizeof g, &status));
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
    assert_int_equal(psd_table_at(&s, 0)->steps, 2);
    push_id(&s, 6); /* its retry: applied */
    assert_int_equal(psd_table_at(&s, 0)->steps, 3);
    assert_int_equal(psd_dedup_dropped(&s), 0);
    push_id(&s, 6); /* copies of applied ones: not */
    push_id(&s, 7);
    push_id(&s, 5);
    assert_int_equal(psd_table_at(&s, 0)->steps, 3);
    assert_int_equal(psd_dedup_dropped(&s), 3);
    push_id(&s, 5 + PS_DEDUP_WINDOW + 10); /* far ahead: the window moves */
    push_id(&s, 8);                        /* below it: counted as applied */
    assert_int_equal(psd_table_at(&s, 0)->steps, 4);
    assert_int_equal(psd_dedup_dropped(&s), 4);
    uint64_t top = 5 + PS_DEDUP_WINDOW + 10;
    push_id(&s, top - (PS_DEDUP_WINDOW - 1)); /* at the window's edge: remembered, applied */
    assert_int_equal(psd_table_at(&s, 0)->steps, 5);
    push_id(&s, top - PS_DEDUP_WINDOW); /* one past it: counted as applied */
    assert_int_equal(psd_table_at(&s, 0)->steps, 5);
    assert_int_equal(psd_dedup_dropped(&s), 5);
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
    assert_int_equal(waiting(&s), 1);
    assert_int_equal(psd_waits_stats(&s).refreshed, 2);
    assert_int_equal(psd_dedup_dropped(&s), 2);
    h.worker_id = 1;
    h.request_id = 3;
    assert_true(send_req(&s, &h, g, sizeof g, &status)); /* completes the round: answered */
    assert_int_equal(status, 0);
    assert_int_equal(waiting(&s), 0);
    assert_int_equal(sent, 1); /* worker 0's, once */
    for (int i = 0; i < 4; i++)
        assert_float_equal(psd_table_at(&s, 0)->w[i], -1.0f, 0); /* the mean of two pushes of 1 */
    psd_fini(&s);
}

static void assert_weights(const float *w, float a, float b, float c, float d)
{
    const float want[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        assert_float_equal(w[i], want[i], 0);
}

/* Pushes that apply on arrival (ssp, asp) are answered through the sender
 * before their optimizer step, and the step is done when the dispatch
 * returns. A pull that waited for the push is answered after the step,
 * with its result. */
static void test_push_answered_before_its_step(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    start(&s, &log, "ssp:0", 2, 0);
    sent = 0;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.worker_id = 1;
    h.request_id = 1;
    h.count = 4;
    const float g[4] = {1, 2, 3, 4};
    int status = -1;
    assert_false(send_req(&s, &h, g, sizeof g, &status)); /* answered through the sender */
    assert_int_equal(sent, 1);
    assert_int_equal(sent_log[0].request_id, 1);
    assert_int_equal(sent_log[0].status, 0);
    assert_weights(sent_log[0].w, 0, 0, 0, 0);              /* before the step */
    assert_weights(psd_table_at(&s, 0)->w, -1, -2, -3, -4); /* after it */
    pull(&s, 1, 2, 1, 0); /* clock 1 waits for worker 0's clock 0 */

    /* worker 0's keyed push of clock 0: its answer, its step, then the pull */
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.request_id = 3;
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.count = 2;
    const uint64_t keys[2] = {0, 2};
    const float kg[2] = {10, 20};
    uint8_t buf[512];
    struct ps_frame f[3] = {{buf, ps__header__pack(&h, buf)}, {keys, sizeof keys}, {kg, sizeof kg}};
    struct ps_frame route = {"r", 1};
    struct psd_reply rep;
    assert_int_equal(psd_dispatch(&s, &route, f, 3, &rep), 0);
    assert_int_equal(sent, 3);
    assert_int_equal(sent_log[1].request_id, 3);
    assert_int_equal(sent_log[1].status, 0);
    assert_weights(sent_log[1].w, -1, -2, -3, -4);
    assert_int_equal(sent_log[2].request_id, 2);
    assert_int_equal(sent_log[2].status, 0);
    assert_weights(sent_log[2].vals, -11, -2, -23, -4);
    assert_weights(psd_table_at(&s, 0)->w, -11, -2, -23, -4);
    assert_int_equal(waiting(&s), 0);
    psd_fini(&s);
}

/* Answered after the step, as the dispatch's reply: a push-pull (its
 * answer holds the weights), and a bsp push (applied with its round). */
static void test_answered_after_the_step(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    const float g[4] = {1, 2, 3, 4};
    Ps__Header h;
    struct ps_frame route = {"r", 1};
    uint8_t buf[512];
    struct psd_reply rep;
    start(&s, &log, "asp", 1, 0);
    sent = 0;
    ps_wire_header_init(&h, PS__OP__OP_PUSH_PULL);
    h.count = 4;
    struct ps_frame f[2] = {{buf, ps__header__pack(&h, buf)}, {g, sizeof g}};
    assert_int_equal(psd_dispatch(&s, &route, f, 2, &rep), 1);
    assert_int_equal(rep.vals_bytes, sizeof g);
    assert_weights(rep.vals, -1, -2, -3, -4);
    psd_reply_drop(&rep);
    psd_fini(&s);

    start(&s, &log, "bsp", 1, 0);
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.count = 4;
    int status = -1;
    assert_true(send_req(&s, &h, g, sizeof g, &status));
    assert_int_equal(status, 0);
    assert_weights(psd_table_at(&s, 0)->w, -1, -2, -3, -4);
    assert_int_equal(sent, 0);
    psd_fini(&s);
}

/* An empty asp shard of one worker whose tables may take table_bytes_max
 * (0: the default). */
static void empty_shard(struct psd *r, struct ps_log *log, uint64_t table_bytes_max)
{
    struct psd_params p = {.shard = 0,
                           .shards = 1,
                           .value_bytes_max = 1u << 20,
                           .wait_timeout_ms = 3600000,
                           .table_bytes_max = table_bytes_max};
    assert_int_equal(psd_cons_parse("asp", &p.cons), 0);
    p.cons.workers = 1;
    assert_int_equal(psd_init(r, log, &p), 0);
}

/* A checkpoint in dir (path set) of an asp shard whose worker 0 pushed
 * the ids given, and an empty asp shard r to restore it into. */
static void checkpoint_and_empty(const uint64_t *ids, size_t n, char *dir, char *path,
                                 size_t pathlen, struct psd *r, struct ps_log *log)
{
    static struct psd s;
    char err[512];
    assert_non_null(mkdtemp(dir));
    start(&s, log, "asp", 1, 77);
    for (size_t i = 0; i < n; i++)
        push_id(&s, ids[i]);
    assert_int_equal(psd_checkpoint_write(&s, dir, path, pathlen, err, sizeof err), 0);
    psd_fini(&s);
    empty_shard(r, log, 0);
}

/* The window of ids applied one by one survives a checkpoint: a request
 * lost before it (id 6, behind 7) is applied when its retry reaches the
 * restored server; the others are not applied twice. */
static void test_dedup_window_in_checkpoint(void **state)
{
    (void)state;
    static struct psd r;
    struct ps_log log;
    char dir[] = "/tmp/pstest-waits-XXXXXX", path[4200];
    const uint64_t ids[] = {5, 7}; /* 6 lost on the way */
    checkpoint_and_empty(ids, 2, dir, path, sizeof path, &r, &log);
    assert_int_equal(psd_checkpoint_restore(&r, dir, path, sizeof path), 1);
    assert_int_equal(psd_table_at(&r, 0)->steps, 2);
    push_id(&r, 6); /* its retry: applied */
    assert_int_equal(psd_table_at(&r, 0)->steps, 3);
    push_id(&r, 7);
    push_id(&r, 5);
    assert_int_equal(psd_table_at(&r, 0)->steps, 3);
    psd_fini(&r);
    unlink(path);
    rmdir(dir);
}

/* r must refuse the checkpoint at path with code and a reason holding
 * why, and keep no table of it. */
static void load_refused(struct psd *r, const char *path, int code, const char *why)
{
    char err[512];
    assert_int_equal(psd_checkpoint_load(r, path, err, sizeof err), code);
    if (strstr(err, why) == NULL)
        fail_msg("refused for another reason: %s", err);
    assert_int_equal(psd_ntables(r), 0);
}

static void checkpoint_gone(struct psd *r, const char *dir, const char *path)
{
    psd_fini(r);
    unlink(path);
    rmdir(dir);
}

/* A checkpoint whose JSON state was damaged (the applied window here) is
 * refused by its checksum, which covers the state as well as the tensors,
 * and nothing of it is restored. */
static void test_dedup_window_damaged(void **state)
{
    (void)state;
    static struct psd r;
    struct ps_log log;
    char dir[] = "/tmp/pstest-waits-XXXXXX", path[4200];
    const uint64_t ids[] = {5};
    checkpoint_and_empty(ids, 1, dir, path, sizeof path, &r, &log);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    char *at = memmem(buf, n, "\\\"applied", 9); /* \"applied: not last_applied */
    assert_non_null(at);
    at += 9;
    while (*at == '\\' || *at == '"' || *at == ':')
        at++;
    *at = 'z'; /* same length, not a hex digit */
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    /* the state is summed with the tensors: the damage is found there */
    load_refused(&r, path, PS_EPROTO, "checksum of the tensors and state");
    checkpoint_gone(&r, dir, path);
}

/* A checkpoint's table must fit this psd's --max-table-bytes, checked
 * before the table is allocated: at the limit it loads, one byte under
 * it is refused. */
static void test_checkpoint_table_over_limit(void **state)
{
    (void)state;
    static struct psd r;
    struct ps_log log;
    char dir[] = "/tmp/pstest-waits-XXXXXX", path[4200], err[512];
    const uint64_t ids[] = {5};
    checkpoint_and_empty(ids, 1, dir, path, sizeof path, &r, &log);
    psd_fini(&r);
    empty_shard(&r, &log, 15); /* table "t": 4 floats of SGD, 16 bytes */
    load_refused(&r, path, PS_ELIMIT, "16 bytes, over psd --max-table-bytes 15");
    psd_fini(&r);
    empty_shard(&r, &log, 16);
    assert_int_equal(psd_checkpoint_load(&r, path, err, sizeof err), 0);
    assert_int_equal(psd_ntables(&r), 1);
    checkpoint_gone(&r, dir, path);
}

/* A table's pushers go into a checkpoint and come back with it: the
 * restored table is the same spec (creating it again opens it) and its
 * rounds still wait for its pushers alone. */
static void test_pushers_survive_a_checkpoint(void **state)
{
    (void)state;
    static struct psd s, r;
    struct ps_log log;
    char dir[] = "/tmp/pstest-waits-XXXXXX", path[4200], err[512];
    assert_non_null(mkdtemp(dir));
    start(&s, &log, "bsp", 3, 0);
    const uint32_t ids[] = {0, 2};
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "stage";
    sp.size = 4;
    sp.lr = 1.0f;
    sp.pushers = (uint32_t *)ids;
    sp.n_pushers = 2;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    int status = -1;
    assert_true(send_req(&s, &h, NULL, 0, &status));
    assert_int_equal(status, 0);
    assert_int_equal(psd_checkpoint_write(&s, dir, path, sizeof path, err, sizeof err), 0);
    psd_fini(&s);
    struct psd_params p = {
        .shard = 0, .shards = 1, .value_bytes_max = 1u << 20, .wait_timeout_ms = 3600000};
    assert_int_equal(psd_cons_parse("bsp", &p.cons), 0);
    p.cons.workers = 3;
    assert_int_equal(psd_init(&r, &log, &p), 0);
    assert_int_equal(psd_checkpoint_load(&r, path, err, sizeof err), 0);
    const struct psd_table *t = psd_table_named(&r, "stage");
    assert_non_null(t);
    assert_int_equal(t->npushers, 2);
    assert_true(psd_table_pushed_by(t, 2) && !psd_table_pushed_by(t, 1));
    assert_int_equal(psd_table_same_spec(t, &sp), 1);
    assert_true(send_req(&r, &h, NULL, 0, &status)); /* the same spec: opened */
    assert_int_equal(status, 0);
    sp.n_pushers = 1; /* another set of pushers: another spec */
    assert_true(send_req(&r, &h, NULL, 0, &status));
    assert_int_equal(status, PS_EEXIST);
    checkpoint_gone(&r, dir, path);
}

/* The clock a hello from worker w is answered with. */
static uint64_t hello_clock(struct psd *s, uint32_t w)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.worker_id = w;
    uint8_t buf[512];
    struct ps_frame f = {buf, ps__header__pack(&h, buf)};
    char id[2] = {'h', (char)('0' + w)};
    struct ps_frame route = {id, sizeof id};
    struct psd_reply rep;
    assert_true(psd_dispatch(s, &route, &f, 1, &rep));
    Ps__Header *r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_non_null(r);
    assert_int_equal(r->status, 0);
    uint64_t clock = r->clock;
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);
    return clock;
}

/* A worker joins at the clock of the tables it pushes: a pipeline stage
 * whose hello comes after another stage's tables moved on starts where
 * its own tables are, not where the other stage's are. */
static void test_join_at_own_tables_clock(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    start(&s, &log, "bsp", 2, 0); /* "t" (id 0), pushed by both */
    const char *names[] = {"a", "b"};
    for (uint32_t i = 0; i < 2; i++) { /* "a" (id 1) pushed by worker 0, "b" (id 2) by 1 */
        Ps__TableSpec sp;
        ps__table_spec__init(&sp);
        sp.name = (char *)names[i];
        sp.size = 4;
        sp.lr = 1.0f;
        sp.pushers = &i;
        sp.n_pushers = 1;
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
        h.spec = &sp;
        int status = -1;
        assert_true(send_req(&s, &h, NULL, 0, &status));
        assert_int_equal(status, 0);
    }
    const float g[4] = {1, 1, 1, 1};
    for (uint64_t c = 0; c < 3; c++) { /* worker 0 takes "a" to clock 3 alone */
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_PUSH);
        h.table_id = 1;
        h.clock = c;
        h.count = 4;
        int status = -1;
        assert_true(answered(&s, &h, g, sizeof g, &status));
        assert_int_equal(status, 0);
    }
    assert_int_equal(psd_table_named(&s, "a")->clock, 3);
    assert_int_equal(hello_clock(&s, 0), 3); /* "a" is its */
    assert_int_equal(hello_clock(&s, 1), 0); /* "t" and "b" are at 0 */
    psd_fini(&s);
}

/* Interval checkpoints are written only when the state changed: none for
 * a shard with no tables (a restart would restore an empty shard over
 * nothing), none for an idle one, one after a table is created and one
 * after an update. */
static void test_interval_checkpoint_only_on_change(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    char dir[] = "/tmp/pstest-waits-XXXXXX";
    assert_non_null(mkdtemp(dir));
    ps_log_init(&log, "test", PS_LOG_ERROR);
    struct psd_params p = {.shard = 0,
                           .shards = 1,
                           .value_bytes_max = 1u << 20,
                           .wait_timeout_ms = 3600000,
                           .checkpoint_dir = dir,
                           .checkpoint_every_ms = 1000};
    assert_int_equal(psd_cons_parse("asp", &p.cons), 0);
    p.cons.workers = 1;
    assert_int_equal(psd_init(&s, &log, &p), 0);
    psd_set_sender(&s, count_sent, &s);
    psd_checkpoint_mark_saved(&s);
    const uint64_t written[] = {0, 1, 1, 2, 2};
    for (int step = 0; step < 5; step++) {
        if (step == 1)
            create_t(&s);
        if (step == 3)
            push_id(&s, 0);
        psd_tick_at(&s, (uint64_t)ps_mono_ms() + 1000); /* the interval has passed */
        psd_checkpoint_reap(&s, 1);                     /* the forked writer's answer */
        assert_int_equal(psd_checkpoints_written(&s), written[step]);
    }
    assert_true(psd_checkpoint_age_s(&s) >= 0);
    psd_fini(&s);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        assert_int_equal(unlink(path), 0);
        files++;
    }
    closedir(d);
    assert_int_equal(rmdir(dir), 0);
    assert_true(files >= 1); /* the older one may be pruned away */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_per_worker),
        cmocka_unit_test(test_wait_times_out),
        cmocka_unit_test(test_push_retry_out_of_order),
        cmocka_unit_test(test_retry_of_waiting_request),
        cmocka_unit_test(test_push_answered_before_its_step),
        cmocka_unit_test(test_answered_after_the_step),
        cmocka_unit_test(test_dedup_window_in_checkpoint),
        cmocka_unit_test(test_unread_bounds),
        cmocka_unit_test(test_dedup_window_damaged),
        cmocka_unit_test(test_checkpoint_table_over_limit),
        cmocka_unit_test(test_interval_checkpoint_only_on_change),
        cmocka_unit_test(test_pushers_survive_a_checkpoint),
        cmocka_unit_test(test_join_at_own_tables_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
