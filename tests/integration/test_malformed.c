/* Raw malformed messages over a DEALER socket to a real psd: each gets an
 * error reply with the right code and a text, and a valid request on the
 * same socket afterwards still succeeds. A frame over --max-message-bytes
 * gets its peer disconnected while other peers are served on. */
#include "cases.h"
#include "harness.h"
#include "raw.h"

#include "ps_err.h"
#include "ps_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

struct fixture {
    struct psd_proc psd;
    void *ctx;
    void *sock;
};

static void send_frames(void *s, const struct case_msg *m)
{
    for (size_t i = 0; i < m->nframes; i++)
        assert_true(zmq_send(s, m->data[i], m->size[i], i + 1 < m->nframes ? ZMQ_SNDMORE : 0) >= 0);
}

static void hello_ok(void *s)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.request_id = 7;
    ps__header__free_unpacked(raw_exchange(s, &h, NULL, 0, NULL, 0), NULL);
}

static void create_t0(void *s)
{
    Ps__Header h;
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "t0";
    sp.size = 1000;
    sp.lr = 0.1f;
    sp.eps = 1e-8f;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    Ps__Header *r = raw_exchange(s, &h, NULL, 0, NULL, 0);
    assert_int_equal(r->table_id, 0);
    ps__header__free_unpacked(r, NULL);
}

static int setup(void **state)
{
    static struct fixture f;
    const char *args[] = {"--max-message-bytes", "1048576", "--max-table-bytes", "4096000", NULL};
    if (harness_psd_start(&f.psd, args) != 0)
        return -1;
    f.ctx = zmq_ctx_new();
    f.sock = raw_dealer(f.ctx, f.psd.endpoint);
    create_t0(f.sock);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    zmq_close(f->sock);
    zmq_ctx_term(f->ctx);
    return harness_psd_stop(&f->psd) == 0 ? 0 : -1;
}

static void test_each_case_gets_error_reply(void **state)
{
    struct fixture *f = *state;
    size_t n = 0;
    for (size_t i = 0; i < bad_cases_count; i++) {
        const struct bad_case *bc = &bad_cases[i];
        struct case_msg m;
        assert_int_equal(case_msg_alloc(&m), 0);
        bc->build(&m);
        send_frames(f->sock, &m);
        size_t nf = 0;
        Ps__Header *r = raw_recv(f->sock, RAW_TIMEOUT_MS, &nf, NULL, 0);
        if (r == NULL)
            fail_msg("case '%s': no reply", bc->name);
        if (r->status != bc->expect)
            fail_msg("case '%s': status %s (%s), expected %s", bc->name, ps_err_name(r->status),
                     r->error, ps_err_name(bc->expect));
        assert_int_equal(nf, 1); /* an error reply is a header alone */
        assert_true(strlen(r->error) > 0);
        printf("  %-32s -> %s: %s\n", bc->name, ps_err_name(r->status), r->error);
        ps__header__free_unpacked(r, NULL);
        case_msg_free(&m);
        hello_ok(f->sock); /* still serving, on the same connection */
        n++;
    }
    assert_true(n >= 30);
}

static void test_oversize_frame_disconnects_only_that_peer(void **state)
{
    struct fixture *f = *state;
    void *bad = raw_dealer(f->ctx, f->psd.endpoint);
    hello_ok(bad);
    size_t big = 2u * 1024u * 1024u; /* over --max-message-bytes 1 MiB */
    char *junk = calloc(1, big);
    assert_true(zmq_send(bad, junk, 16, ZMQ_SNDMORE) >= 0);
    assert_true(zmq_send(bad, junk, big, 0) >= 0);
    free(junk);
    /* No reply to it: zmq dropped the connection at the frame limit. (An
     * absence cannot be polled for; the bound is far above a reply's
     * round trip, which the hello_ok calls show is milliseconds.) */
    size_t nf = 0;
    Ps__Header *r = raw_recv(bad, 1000, &nf, NULL, 0);
    if (r != NULL)
        fail_msg("oversize frame was answered: status %d", r->status);
    /* The good peer is served meanwhile and afterwards. */
    hello_ok(f->sock);
    void *fresh = raw_dealer(f->ctx, f->psd.endpoint);
    hello_ok(fresh);
    zmq_close(fresh);
    zmq_close(bad);
}

static void push_and_pull(void *s, uint64_t id, int *duplicate, float *w)
{
    const float g[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.worker_id = 5;
    h.request_id = id;
    h.offset = 0;
    h.count = 4;
    Ps__Header *r = raw_exchange(s, &h, g, sizeof g, NULL, 0);
    *duplicate = r->duplicate;
    ps__header__free_unpacked(r, NULL);
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.worker_id = 5;
    h.offset = 0;
    h.count = 4;
    ps__header__free_unpacked(raw_exchange(s, &h, NULL, 0, w, 4 * sizeof(float)), NULL);
}

static void hello_session(void *s, uint64_t session)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.worker_id = 5;
    h.session = session;
    ps__header__free_unpacked(raw_exchange(s, &h, NULL, 0, NULL, 0), NULL);
}

static void test_retried_push_applied_once(void **state)
{
    struct fixture *f = *state;
    void *s = raw_dealer(f->ctx, f->psd.endpoint);
    float w0[4], w1[4], w2[4], w3[4];
    int dup = 0;
    hello_session(s, 77);
    push_and_pull(s, 10, &dup, w0);
    assert_false(dup);
    push_and_pull(s, 10, &dup, w1); /* the same request again: a retry */
    assert_true(dup);
    assert_memory_equal(w0, w1, sizeof w0); /* not applied twice */
    push_and_pull(s, 11, &dup, w2);
    assert_false(dup);
    assert_float_equal(w2[0], w0[0] - 0.1f, 1e-6); /* t0: SGD, lr 0.1 */
    hello_session(s, 78); /* a restarted worker: a new session starts afresh */
    push_and_pull(s, 1, &dup, w3);
    assert_false(dup);
    assert_float_equal(w3[0], w2[0] - 0.1f, 1e-6);
    zmq_close(s);
}

static void test_table_at_the_byte_limit(void **state)
{
    struct fixture *f = *state;
    Ps__Header h;
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "at-limit";
    sp.size = CASE_TABLE_BYTES_MAX / 4; /* exactly --max-table-bytes with SGD */
    sp.lr = 0.1f;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    ps__header__free_unpacked(raw_exchange(f->sock, &h, NULL, 0, NULL, 0), NULL);
}

static void test_error_count_in_stats(void **state)
{
    struct fixture *f = *state;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_STATS);
    Ps__Header *r = raw_exchange(f->sock, &h, NULL, 0, NULL, 0);
    assert_non_null(r->stats);
    assert_true(r->stats->errors >= bad_cases_count);
    assert_int_equal(r->stats->duplicates_dropped, 1);
    assert_int_equal(r->stats->n_tables, 2); /* t0 and at-limit */
    assert_string_equal(r->stats->tables[0]->name, "t0");
    ps__header__free_unpacked(r, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_case_gets_error_reply),
        cmocka_unit_test(test_oversize_frame_disconnects_only_that_peer),
        cmocka_unit_test(test_table_at_the_byte_limit),
        cmocka_unit_test(test_retried_push_applied_once),
        cmocka_unit_test(test_error_count_in_stats),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
