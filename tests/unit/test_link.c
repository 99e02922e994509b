/* Pipeline links (psclient.h, "Pipeline links") on loopback: tensors
 * forward and back with their shapes, the credit window at its limit and
 * one past it, the checks of what a neighbour sends (at bytes_max and one
 * past it, a shape that is not the frame, a neighbour that says it is
 * another stage, junk) with the refusal reaching the sender, a neighbour
 * that never connects, and one that dies, named. */
#include "psclient.h"

#include "ps_err.h"
#include "ps_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

static struct psc_link *stage(uint32_t s, uint32_t n, const char *next, uint32_t window,
                              uint64_t bytes_max)
{
    struct psc_link_config cfg = {.struct_size = sizeof cfg,
                                  .stage = s,
                                  .stages = n,
                                  .listen = s > 0 ? "tcp://127.0.0.1:0" : NULL,
                                  .next = next,
                                  .window = window,
                                  .bytes_max = bytes_max};
    struct psc_link *l = NULL;
    char err[512];
    int rc = psc_link_create(&cfg, &l, err, sizeof err);
    if (rc != 0)
        fail_msg("stage %u: %s", s, err);
    return l;
}

/* Stage 0 connected to stage 1 (of 2). */
static void pair(struct psc_link **a, struct psc_link **b, uint32_t window, uint64_t bytes_max)
{
    *b = stage(1, 2, NULL, 0, bytes_max);
    *a = stage(0, 2, psc_link_endpoint(*b), window, bytes_max);
}

static struct psc_tensor tensor(uint64_t step, uint32_t micro, uint64_t rows, uint64_t cols,
                                const float *data)
{
    struct psc_tensor t = {.struct_size = sizeof t,
                           .step = step,
                           .micro = micro,
                           .dtype = PSC_F32,
                           .ndims = 2,
                           .data = data};
    t.shape[0] = rows;
    t.shape[1] = cols;
    return t;
}

static void test_forward_and_back(void **state)
{
    (void)state;
    struct psc_link *a, *b;
    pair(&a, &b, 4, 1 << 20);
    float x[12], g[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i, g[i] = -(float)i;
    struct psc_tensor t = tensor(7, 2, 3, 4, x), r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0);
    assert_int_equal(psc_link_in_flight(a), 1);
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r), 0);
    assert_int_equal(r.step, 7);
    assert_int_equal(r.micro, 2);
    assert_int_equal(r.dtype, PSC_F32);
    assert_int_equal(r.ndims, 2);
    assert_int_equal(r.shape[0], 3);
    assert_int_equal(r.shape[1], 4);
    assert_memory_equal(r.data, x, sizeof x);
    t = tensor(7, 2, 3, 4, g);
    assert_int_equal(psc_link_send(b, PSC_LINK_BACKWARD, &t), 0);
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 5000, &r), 0);
    assert_memory_equal(r.data, g, sizeof g);
    assert_int_equal(psc_link_in_flight(a), 0); /* the credit came back */
    uint64_t sent, received;
    psc_link_bytes(a, &sent, &received);
    assert_int_equal(sent, sizeof x);
    assert_int_equal(received, sizeof g);
    /* neither end sends or receives what its place does not have */
    assert_int_equal(psc_link_send(a, PSC_LINK_BACKWARD, &t), PS_EINVAL);
    assert_int_equal(psc_link_recv(b, PSC_LINK_BACKWARD, 0, &r), PS_EINVAL);
    assert_non_null(strstr(psc_link_error(b), "it is the last"));
    psc_link_destroy(a);
    psc_link_destroy(b);
}

/* window activations may be in flight; the next waits for a gradient. */
static void test_window(void **state)
{
    (void)state;
    struct psc_link *a, *b;
    pair(&a, &b, 2, 1 << 20);
    float x[4] = {1, 2, 3, 4};
    struct psc_tensor t = tensor(0, 0, 1, 4, x), r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0);
    t.micro = 1;
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0); /* at the window */
    t.micro = 2;
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), PS_ELIMIT); /* one past */
    assert_non_null(strstr(psc_link_error(a), "2 micro-batches' activations in flight"));
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r), 0);
    assert_int_equal(r.micro, 0);
    t.micro = 0;
    assert_int_equal(psc_link_send(b, PSC_LINK_BACKWARD, &t), 0);
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 5000, &r), 0);
    t.micro = 2;
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0); /* its credit is back */
    psc_link_destroy(a);
    psc_link_destroy(b);
}

/* A raw neighbour: a DEALER connected to stage 1's endpoint. */
struct raw {
    void *ctx, *sock;
};

static void raw_open(struct raw *w, const char *ep)
{
    w->ctx = zmq_ctx_new();
    w->sock = zmq_socket(w->ctx, ZMQ_DEALER);
    int zero = 0, ms = 5000;
    zmq_setsockopt(w->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(w->sock, ZMQ_RCVTIMEO, &ms, sizeof ms);
    assert_int_equal(zmq_connect(w->sock, ep), 0);
}

static void raw_close(struct raw *w)
{
    zmq_close(w->sock);
    zmq_ctx_term(w->ctx);
}

/* Sends a header (op OP_STAGE, as stage `from`, shape dims) and bytes of
 * values; data NULL: the header alone. */
static void raw_send(struct raw *w, uint32_t from, const uint64_t *dims, size_t nd, uint64_t count,
                     const void *data, size_t bytes)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_STAGE);
    h.stage = from;
    h.stages = 3;
    h.count = count;
    h.shape = (uint64_t *)dims;
    h.n_shape = nd;
    uint8_t buf[512];
    size_t n = ps__header__pack(&h, buf);
    assert_true(zmq_send(w->sock, buf, n, data ? ZMQ_SNDMORE : 0) >= 0);
    if (data)
        assert_true(zmq_send(w->sock, data, bytes, 0) >= 0);
}

/* What stage 1 sent back to the raw neighbour: its refusal's status. */
static int raw_refusal(struct raw *w, char *why, size_t len)
{
    uint8_t buf[4096];
    int n = zmq_recv(w->sock, buf, sizeof buf, 0);
    assert_true(n > 0);
    Ps__Header *h = ps__header__unpack(NULL, (size_t)n, buf);
    assert_non_null(h);
    int status = h->status;
    snprintf(why, len, "%s", h->error ? h->error : "");
    ps__header__free_unpacked(h, NULL);
    return status;
}

static void test_checks_what_a_neighbour_sends(void **state)
{
    (void)state;
    struct psc_link *b = stage(1, 3, "tcp://127.0.0.1:1", 1, 64); /* 16 floats at most */
    struct raw w;
    raw_open(&w, psc_link_endpoint(b));
    float v[17] = {0};
    struct psc_tensor r = {.struct_size = sizeof r};
    char why[512];
    const struct {
        uint32_t from;
        uint64_t dims[2];
        size_t nd;
        uint64_t count;
        size_t bytes;
        int code;
        const char *says;
    } cases[] = {
        {0, {4, 4}, 2, 16, 64, 0, ""},                           /* at bytes_max */
        {0, {17, 1}, 2, 17, 68, PS_ELIMIT, "68 bytes"},          /* one element past it */
        {0, {4, 4}, 2, 16, 60, PS_ESIZE, "60 bytes"},            /* a frame short of its shape */
        {0, {4, 0}, 2, 0, 0, PS_ELIMIT, "at least 1"},           /* an empty dimension */
        {2, {4, 4}, 2, 16, 64, PS_EPROTO, "says it is stage 2"}, /* not the previous stage */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        raw_send(&w, cases[i].from, cases[i].dims, cases[i].nd, cases[i].count, v, cases[i].bytes);
        int rc = psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r);
        if (rc != cases[i].code || strstr(psc_link_error(b), cases[i].says) == NULL)
            fail_msg("case %zu: %s (%d), expected %d and '%s'", i, psc_link_error(b), rc,
                     cases[i].code, cases[i].says);
        if (rc != 0) { /* the sender is told, with the reason */
            assert_int_equal(raw_refusal(&w, why, sizeof why), rc);
            assert_non_null(strstr(why, cases[i].says));
        }
    }
    /* junk that is no header */
    assert_true(zmq_send(w.sock, "junk", 4, 0) == 4);
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r), PS_EPROTO);
    assert_non_null(strstr(psc_link_error(b), "no pipeline tensor"));
    assert_int_equal(raw_refusal(&w, why, sizeof why), PS_EPROTO);
    raw_close(&w);
    psc_link_destroy(b);
}

/* A neighbour started with another stage count is refused by name. */
static void test_stage_count_mismatch(void **state)
{
    (void)state;
    struct psc_link *b = stage(1, 3, "tcp://127.0.0.1:1", 1, 1 << 10);
    struct psc_link *a = stage(0, 2, psc_link_endpoint(b), 2, 1 << 10);
    float x[4] = {0};
    struct psc_tensor t = tensor(0, 0, 1, 4, x), r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0);
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r), PS_EPROTO);
    assert_non_null(strstr(psc_link_error(b), "stage 0's pipeline has 2 stages, this one's 3"));
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 5000, &r), PS_EREMOTE);
    psc_link_destroy(a);
    psc_link_destroy(b);
}

/* Evaluation's forwards take no credit, and its backward gives none. */
static void test_eval_takes_no_credit(void **state)
{
    (void)state;
    struct psc_link *a, *b;
    pair(&a, &b, 1, 1 << 20);
    float x[4] = {1, 2, 3, 4};
    struct psc_tensor t = tensor(3, 0, 1, 4, x), r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0); /* the window's one */
    t.eval = 1;
    for (uint32_t i = 0; i < 5; i++) {
        t.micro = i;
        assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0);
    }
    assert_int_equal(psc_link_in_flight(a), 1);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r), 0);
        assert_int_equal(r.eval, i > 0);
    }
    struct psc_tensor acc = tensor(3, 0, 1, 1, x);
    acc.eval = 1;
    assert_int_equal(psc_link_send(b, PSC_LINK_BACKWARD, &acc), 0);
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 5000, &r), 0);
    assert_true(r.eval);
    assert_int_equal(psc_link_in_flight(a), 1); /* the training activations' credit is still out */
    psc_link_destroy(a);
    psc_link_destroy(b);
}

/* Waiting for the neighbours: a middle stage names the one missing, and
 * returns once both are there. */
static void test_wait_connected(void **state)
{
    (void)state;
    struct psc_link *c = stage(2, 3, NULL, 0, 64);
    struct psc_link *b = stage(1, 3, psc_link_endpoint(c), 1, 64);
    assert_int_equal(psc_link_wait_connected(b, 300), PS_ETIMEDOUT);
    assert_non_null(strstr(psc_link_error(b), "stage 0"));
    assert_null(strstr(psc_link_error(b), "stage 2"));
    struct psc_link *a = stage(0, 3, psc_link_endpoint(b), 1, 64);
    assert_int_equal(psc_link_wait_connected(a, 5000), 0);
    assert_int_equal(psc_link_wait_connected(b, 5000), 0);
    assert_int_equal(psc_link_wait_connected(c, 5000), 0);
    psc_link_destroy(a);
    psc_link_destroy(b);
    psc_link_destroy(c);
}

/* A tensor the next stage refuses: the sender's next receive says why. */
static void test_refusal_reaches_the_sender(void **state)
{
    (void)state;
    struct psc_link *b = stage(1, 2, NULL, 0, 16);
    struct psc_link_config cfg = {.struct_size = sizeof cfg,
                                  .stage = 0,
                                  .stages = 2,
                                  .next = psc_link_endpoint(b),
                                  .window = 2,
                                  .bytes_max = 64};
    struct psc_link *a = NULL;
    char err[256];
    assert_int_equal(psc_link_create(&cfg, &a, err, sizeof err), 0);
    float x[8] = {0};
    struct psc_tensor t = tensor(0, 0, 2, 4, x),
                      r = {.struct_size = sizeof r}; /* 32 bytes: past b's 16 */
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0);
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r), PS_ELIMIT);
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 5000, &r), PS_EREMOTE);
    assert_non_null(strstr(psc_link_error(a), "stage 1 refused this stage's message"));
    assert_non_null(strstr(psc_link_error(a), "32 bytes"));
    assert_int_equal(psc_link_in_flight(a), 0); /* no gradient will come for it */
    psc_link_destroy(a);
    psc_link_destroy(b);
}

/* A neighbour that never connects: a receive with a timeout says so. */
static void test_never_connected(void **state)
{
    (void)state;
    struct psc_link *b = stage(1, 2, NULL, 0, 64);
    struct psc_tensor r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 300, &r), PS_ETIMEDOUT);
    assert_non_null(strstr(psc_link_error(b), "stage 0"));
    assert_non_null(strstr(psc_link_error(b), "never connected"));
    psc_link_destroy(b);
}

/* The next stage's process answers, then exits mid-step: its answer is
 * still read, and the waiting stage's next receive ends with an error
 * naming it, not a silent wait. */
static void test_dead_neighbour_is_named(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* stage 1: takes one activation, answers, then dies */
        close(fds[0]);
        struct psc_link_config cfg = {.struct_size = sizeof cfg,
                                      .stage = 1,
                                      .stages = 2,
                                      .listen = "tcp://127.0.0.1:0",
                                      .bytes_max = 64};
        struct psc_link *b = NULL;
        char err[256];
        if (psc_link_create(&cfg, &b, err, sizeof err) != 0)
            _exit(2);
        const char *ep = psc_link_endpoint(b);
        if (write(fds[1], ep, strlen(ep) + 1) < 0)
            _exit(3);
        struct psc_tensor r = {.struct_size = sizeof r};
        if (psc_link_recv(b, PSC_LINK_FORWARD, 10000, &r) != 0)
            _exit(4);
        r.eval = 0;
        int sent = psc_link_send(b, PSC_LINK_BACKWARD, &r);
        psc_link_destroy(b); /* an exit as psworker's: what was sent goes */
        _exit(sent == 0 ? 0 : 5);
    }
    close(fds[1]);
    char ep[256] = "";
    assert_true(read(fds[0], ep, sizeof ep) > 0);
    close(fds[0]);
    struct psc_link_config cfg = {.struct_size = sizeof cfg,
                                  .stage = 0,
                                  .stages = 2,
                                  .next = ep,
                                  .window = 1,
                                  .bytes_max = 64,
                                  .timeout_ms = 1000};
    struct psc_link *a = NULL;
    char err[256];
    assert_int_equal(psc_link_create(&cfg, &a, err, sizeof err), 0);
    float x[4] = {0};
    struct psc_tensor t = tensor(0, 0, 1, 4, x), r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &t), 0);
    int status = -1;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 30000, &r), 0); /* sent before it went */
    assert_int_equal(psc_link_in_flight(a), 0);
    assert_int_equal(psc_link_recv(a, PSC_LINK_BACKWARD, 30000, &r), PS_EIO);
    assert_non_null(strstr(psc_link_error(a), "stage 1"));
    assert_non_null(strstr(psc_link_error(a), "is gone"));
    psc_link_destroy(a);
}

/* A CURVE pair of stages: a stage of another key, and one without
 * CURVE, never connect, and the waits for them say why. */
struct keys {
    char pub[41], sec[41];
};

static struct psc_link *curve_stage(uint32_t s, const char *next, const struct keys *k,
                                    const char *server_key, const char *allow)
{
    const char *allow_list[1] = {allow};
    struct psc_link_config cfg = {.struct_size = sizeof cfg,
                                  .stage = s,
                                  .stages = 2,
                                  .listen = s > 0 ? "tcp://127.0.0.1:0" : NULL,
                                  .next = next,
                                  .window = 2,
                                  .bytes_max = 1 << 10};
    if (k != NULL) {
        cfg.curve_public = k->pub;
        cfg.curve_secret = k->sec;
        cfg.curve_server_key = server_key;
        cfg.curve_allow = allow != NULL ? allow_list : NULL;
        cfg.ncurve_allow = allow != NULL;
    }
    struct psc_link *l = NULL;
    char err[512];
    if (psc_link_create(&cfg, &l, err, sizeof err) != 0)
        fail_msg("stage %u: %s", s, err);
    return l;
}

/* Waits for a and b, each in turn (one thread plays both processes: a
 * CURVE handshake waits for the listening stage's handler, which runs in
 * its calls). Returns a's and b's last results in ra, rb. */
static void both_connected(struct psc_link *a, struct psc_link *b, int ms, int *ra, int *rb)
{
    for (int waited = 0; waited < ms; waited += 100) {
        *rb = psc_link_wait_connected(b, 50);
        *ra = psc_link_wait_connected(a, 50);
        if (*ra == 0 && *rb == 0)
            return;
    }
}

static void test_curve_between_stages(void **state)
{
    (void)state;
    struct keys a, b, other;
    assert_int_equal(zmq_curve_keypair(a.pub, a.sec), 0);
    assert_int_equal(zmq_curve_keypair(b.pub, b.sec), 0);
    assert_int_equal(zmq_curve_keypair(other.pub, other.sec), 0);
    struct psc_link *lb = curve_stage(1, NULL, &b, NULL, a.pub); /* admits a's key only */
    struct psc_link *la = curve_stage(0, psc_link_endpoint(lb), &a, b.pub, NULL);
    int ra = -1, rb = -1;
    both_connected(la, lb, 5000, &ra, &rb);
    assert_int_equal(ra, 0);
    assert_int_equal(rb, 0);
    float x[4] = {1, 2, 3, 4};
    struct psc_tensor t = tensor(0, 0, 1, 4, x), r = {.struct_size = sizeof r};
    assert_int_equal(psc_link_send(la, PSC_LINK_FORWARD, &t), 0);
    assert_int_equal(psc_link_recv(lb, PSC_LINK_FORWARD, 5000, &r), 0);
    assert_memory_equal(r.data, x, sizeof x);
    psc_link_destroy(la);
    psc_link_destroy(lb);

    /* another key: refused in the handshake, named on both sides */
    lb = curve_stage(1, NULL, &b, NULL, a.pub);
    struct psc_link *lo = curve_stage(0, psc_link_endpoint(lb), &other, b.pub, NULL);
    both_connected(lo, lb, 1500, &ra, &rb);
    assert_int_equal(ra, PS_ETIMEDOUT);
    assert_non_null(strstr(psc_link_error(lo), "refused this stage's CURVE key"));
    assert_int_equal(rb, PS_ETIMEDOUT);
    assert_non_null(strstr(psc_link_error(lb), "a CURVE key this stage does not admit"));
    psc_link_destroy(lo);

    /* no CURVE at all, toward a stage that has it */
    struct psc_link *lp = curve_stage(0, psc_link_endpoint(lb), NULL, NULL, NULL);
    both_connected(lp, lb, 1500, &ra, &rb);
    assert_int_equal(ra, PS_ETIMEDOUT);
    assert_int_equal(rb, PS_ETIMEDOUT);
    assert_non_null(strstr(psc_link_error(lb), "handshake failed"));
    psc_link_destroy(lp);
    psc_link_destroy(lb);

    /* keys that are not keys */
    struct psc_link_config bad = {.struct_size = sizeof bad,
                                  .stage = 1,
                                  .stages = 2,
                                  .listen = "tcp://127.0.0.1:0",
                                  .bytes_max = 64,
                                  .curve_public = "short",
                                  .curve_secret = b.sec};
    char err[256];
    struct psc_link *l = NULL;
    assert_int_equal(psc_link_create(&bad, &l, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "40 Z85 characters"));
    bad.curve_public = b.pub; /* no key to admit */
    assert_int_equal(psc_link_create(&bad, &l, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "curve_allow"));
    assert_null(l);
}

/* Bad configurations are refused by name. */
static void test_config_refused(void **state)
{
    (void)state;
    char err[256];
    struct psc_link *l = NULL;
    struct psc_link_config one = {
        .struct_size = sizeof one, .stage = 0, .stages = 1, .bytes_max = 64};
    assert_int_equal(psc_link_create(&one, &l, err, sizeof err), PS_EINVAL);
    struct psc_link_config past = {
        .struct_size = sizeof past, .stage = 2, .stages = 2, .bytes_max = 64};
    assert_int_equal(psc_link_create(&past, &l, err, sizeof err), PS_EINVAL);
    struct psc_link_config nolisten = {
        .struct_size = sizeof nolisten, .stage = 1, .stages = 2, .bytes_max = 64};
    assert_int_equal(psc_link_create(&nolisten, &l, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "needs listen"));
    struct psc_link_config wide = {.struct_size = sizeof wide,
                                   .stage = 0,
                                   .stages = 2,
                                   .next = "tcp://127.0.0.1:1",
                                   .window = PSC_LINK_WINDOW_MAX + 1,
                                   .bytes_max = 64};
    assert_int_equal(psc_link_create(&wide, &l, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "window"));
    assert_null(l);
}

/* Tensors and link configs as programs built against other versions of
 * psclient.h pass them (psclient.h, "ABI"). */
struct newer_tensor {
    struct psc_tensor t;
    uint64_t later[2];
};

static void test_sized_structs(void **state)
{
    (void)state;
    char err[256];
    struct psc_link *l = NULL;
    struct psc_link_config bare = {
        .stage = 0, .stages = 2, .next = "tcp://127.0.0.1:1", .window = 1, .bytes_max = 64};
    assert_int_equal(psc_link_create(&bare, &l, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "struct psc_link_config: struct_size is 0"));
    assert_null(l);

    struct psc_link *a, *b;
    pair(&a, &b, 4, 1 << 10);
    float x[4] = {1, 2, 3, 4};
    /* a newer sender's tensor: its unknown field unset goes... */
    struct newer_tensor nt;
    memset(&nt, 0, sizeof nt);
    nt.t = tensor(1, 0, 1, 4, x);
    nt.t.struct_size = sizeof nt;
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &nt.t), 0);
    /* ...set, it is refused and nothing is sent */
    nt.later[1] = 7;
    assert_int_equal(psc_link_send(a, PSC_LINK_FORWARD, &nt.t), PS_EINVAL);
    assert_non_null(strstr(psc_link_error(a), "newer psclient.h"));
    assert_int_equal(psc_link_in_flight(a), 1);
    /* received into a newer struct: written up to what this library
     * knows, the rest zeroed, struct_size kept */
    struct newer_tensor r;
    memset(&r, 0xa5, sizeof r);
    r.t.struct_size = sizeof r;
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 5000, &r.t), 0);
    assert_int_equal(r.t.struct_size, sizeof r);
    assert_int_equal(r.t.step, 1);
    assert_int_equal(r.t.shape[1], 4);
    assert_memory_equal(r.t.data, x, sizeof x);
    assert_int_equal(r.later[0], 0);
    assert_int_equal(r.later[1], 0);
    /* an output tensor without struct_size: refused, not written */
    struct psc_tensor none;
    memset(&none, 0, sizeof none);
    assert_int_equal(psc_link_recv(b, PSC_LINK_FORWARD, 0, &none), PS_EINVAL);
    assert_null(none.data);
    psc_link_destroy(a);
    psc_link_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_and_back),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_checks_what_a_neighbour_sends),
        cmocka_unit_test(test_stage_count_mismatch),
        cmocka_unit_test(test_eval_takes_no_credit),
        cmocka_unit_test(test_wait_connected),
        cmocka_unit_test(test_refusal_reaches_the_sender),
        cmocka_unit_test(test_never_connected),
        cmocka_unit_test(test_dead_neighbour_is_named),
        cmocka_unit_test(test_curve_between_stages),
        cmocka_unit_test(test_config_refused),
        cmocka_unit_test(test_sized_structs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
