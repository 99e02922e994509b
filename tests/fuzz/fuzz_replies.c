/* libFuzzer target: the client library (psclient) reading what a shard
 * answers, which is peer input. A fake shard (a ROUTER on loopback, on a
 * thread of its own) answers the client's hello and table creates
 * properly; then each input names a request the client makes (its first
 * byte: a dense pull, push, push-pull or view, a keyed push, a sparse
 * table's row pull, push or push-pull, a rows page, stats, a checkpoint,
 * a table open) and holds the messages the shard answers it with, in the
 * framing of fuzz_frames.h. A message's first frame that parses as a
 * header takes the request's id and op (so it reaches the request's
 * checks), unless bit 0x80 of the first byte keeps it as it came. The
 * client must fail the request or take an answer that fits it; nothing
 * may crash, leak or trip a sanitizer. */
#include "fuzz_frames.h"

#include "psclient.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_shard.h"
#include "ps_wire.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Small requests into buffers of their exact size (malloc'd per input),
 * so that an answer written past one trips ASan. */
enum { DENSE = 1000, N = 16, DIM = 4, KEYS = 2, MESSAGES_MAX = 3, WAIT_MS = 5 };

static struct {
    void *ctx, *router;
    char endpoint[256];
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t mu;
    /* the input the next request is answered with (NULL: answer properly) */
    const uint8_t *data;
    size_t size, pos;
    int keep_headers;
    struct psc_client *c;
    uint32_t dense, sparse;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void send_message(const zmq_msg_t *route, const struct ps_frame *f, size_t n)
{
    zmq_send(g.router, zmq_msg_data((zmq_msg_t *)route), zmq_msg_size((zmq_msg_t *)route),
             n > 0 ? ZMQ_SNDMORE : 0);
    for (size_t i = 0; i < n; i++)
        zmq_send(g.router, f[i].data, f[i].size, i + 1 < n ? ZMQ_SNDMORE : 0);
}

/* What a psd answers a hello or a create of the two tables. */
static void answer_properly(const zmq_msg_t *route, const Ps__Header *req)
{
    Ps__Header h;
    ps_wire_header_init(&h, req->op);
    h.request_id = req->request_id;
    h.worker_id = req->worker_id;
    if (req->op == PS__OP__OP_HELLO) {
        h.shard = 0;
        h.shards = 1;
        h.instance = 1;
    } else if (req->op == PS__OP__OP_CREATE_TABLE && req->spec != NULL) {
        h.table_id = req->spec->sparse ? 2 : 1;
        h.count = req->spec->sparse ? 0 : req->spec->size;
    } else {
        return;
    }
    uint8_t buf[PS_HEADER_BYTES_MAX];
    int64_t len = ps_wire_header_pack(&h, buf, sizeof buf);
    struct ps_frame f = {buf, len > 0 ? (size_t)len : 0};
    send_message(route, &f, 1);
}

/* Answers one request with the input's messages. */
static void answer_with_input(const zmq_msg_t *route, const Ps__Header *req)
{
    for (int m = 0; m < MESSAGES_MAX && g.pos < g.size; m++) {
        struct ps_frame f[FUZZ_FRAMES_MAX];
        size_t n = fuzz_message(g.data, g.size, &g.pos, f, FUZZ_FRAMES_MAX);
        uint8_t buf[PS_HEADER_BYTES_MAX];
        Ps__Header *h = n > 0 && !g.keep_headers && f[0].size <= PS_HEADER_BYTES_MAX
                            ? ps__header__unpack(NULL, f[0].size, f[0].data)
                            : NULL;
        if (h != NULL) {
            h->request_id = req->request_id;
            h->op = req->op;
            int64_t len = ps_wire_header_pack(h, buf, sizeof buf);
            if (len > 0)
                f[0] = (struct ps_frame){buf, (size_t)len};
            ps__header__free_unpacked(h, NULL);
        }
        send_message(route, f, n);
    }
}

static void *shard_main(void *arg)
{
    (void)arg;
    zmq_pollitem_t it = {g.router, 0, ZMQ_POLLIN, 0};
    while (!atomic_load(&g.stop)) {
        if (zmq_poll(&it, 1, 1) != 1)
            continue;
        zmq_msg_t route, hdr;
        zmq_msg_init(&route);
        zmq_msg_init(&hdr);
        int ok = zmq_msg_recv(&route, g.router, 0) >= 0 && zmq_msg_more(&route) &&
                 zmq_msg_recv(&hdr, g.router, 0) >= 0;
        int more = ok && zmq_msg_more(&hdr);
        while (more) { /* the request's payload */
            zmq_msg_t p;
            zmq_msg_init(&p);
            more = zmq_msg_recv(&p, g.router, 0) >= 0 && zmq_msg_more(&p);
            zmq_msg_close(&p);
        }
        Ps__Header *req =
            ok ? ps__header__unpack(NULL, zmq_msg_size(&hdr), zmq_msg_data(&hdr)) : NULL;
        if (req != NULL) {
            pthread_mutex_lock(&g.mu);
            if (g.data != NULL)
                answer_with_input(&route, req);
            else
                answer_properly(&route, req);
            pthread_mutex_unlock(&g.mu);
            ps__header__free_unpacked(req, NULL);
        }
        zmq_msg_close(&route);
        zmq_msg_close(&hdr);
    }
    return NULL;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "fuzz_replies: %s: %s\n", what, why);
    abort();
}

static void setup(void)
{
    g.ctx = zmq_ctx_new();
    g.router = zmq_socket(g.ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(g.router, ZMQ_LINGER, &linger, sizeof linger);
    size_t len = sizeof g.endpoint;
    if (zmq_bind(g.router, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(g.router, ZMQ_LAST_ENDPOINT, g.endpoint, &len) != 0)
        die("bind", zmq_strerror(errno));
    if (pthread_create(&g.thread, NULL, shard_main, NULL) != 0)
        die("thread", "cannot start the fake shard");
    const char *eps[1] = {g.endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 1,
                             .worker_id = 1,
                             .connect_timeout_ms = 10000};
    char err[256];
    if (psc_create(&cfg, &g.c, err, sizeof err) != 0)
        die("psc_create", err);
    struct psc_table_spec s;
    psc_table_spec_init(&s, "dense", DENSE);
    if (psc_table_create(g.c, &s, 10000, &g.dense) != 0)
        die("create", psc_last_error(g.c));
    psc_table_spec_init(&s, "sparse", 0);
    s.sparse = 1;
    s.dim = DIM;
    s.rows_max = 100;
    if (psc_table_create(g.c, &s, 10000, &g.sparse) != 0)
        die("create", psc_last_error(g.c));
}

/* Waits for an asynchronous request; a view taken is let go, one still
 * out is canceled (while zmq still holds a zero-copy send: polled again,
 * for a second at most). */
static void settle(uint64_t tk, int view)
{
    int rc = psc_wait(g.c, tk, WAIT_MS);
    if (rc == 0 && view)
        psc_view_release(g.c, tk);
    int64_t until = ps_mono_ms() + 1000;
    while (rc == PS_ETIMEDOUT && psc_cancel(g.c, tk) == PS_EBUSY && ps_mono_ms() < until)
        sched_yield();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g.c == NULL)
        setup();
    if (size == 0)
        return 0;
    float *vals = calloc(N, sizeof(float)), *out = calloc(N, sizeof(float));
    float *rvals = calloc(KEYS * DIM, sizeof(float)), *rout = calloc(KEYS * DIM, sizeof(float));
    uint64_t *keys = malloc(KEYS * sizeof *keys), *rkeys = malloc(KEYS * sizeof *rkeys);
    if (vals == NULL || out == NULL || rvals == NULL || rout == NULL || keys == NULL ||
        rkeys == NULL)
        die("malloc", "out of memory");
    for (size_t i = 0; i < KEYS; i++)
        keys[i] = 10 * i + 3;
    pthread_mutex_lock(&g.mu);
    g.data = data;
    g.size = size;
    g.pos = 1;
    g.keep_headers = data[0] & 0x80;
    pthread_mutex_unlock(&g.mu);
    uint64_t tk = 0;
    int rc = 0;
    char detail[256];
    struct psc_shard_stats st = {.struct_size = sizeof st};
    struct psc_table_stats ts[4] = {{.struct_size = sizeof ts[0]}};
    uint64_t total = 0, got = 0;
    uint32_t t = 0;
    switch ((data[0] & 0x7f) % FUZZ_REPLY_REQUESTS) {
    case 0:
        rc = psc_pull(g.c, g.dense, 0, N, out, 0, &tk);
        break;
    case 1:
        rc = psc_push(g.c, g.dense, 100, N, vals, 0, &tk);
        break;
    case 2:
        rc = psc_push_pull(g.c, g.dense, 0, N, vals, out, 0, &tk);
        break;
    case 3:
        if (psc_pull_view(g.c, g.dense, 0, N, 0, &tk) == 0)
            settle(tk, 1);
        rc = 1;
        break;
    case 4:
        rc = psc_push_keys(g.c, g.dense, keys, vals, KEYS, 0, &tk);
        break;
    case 5:
        rc = psc_pull_rows(g.c, g.sparse, keys, KEYS, rout, 0, &tk);
        break;
    case 6:
        rc = psc_push_rows(g.c, g.sparse, keys, KEYS, rvals, 0, &tk);
        break;
    case 7:
        rc = psc_push_pull_rows(g.c, g.sparse, keys, KEYS, rvals, rout, 0, &tk);
        break;
    case 8:
        psc_rows(g.c, g.sparse, 0, 0, KEYS, rkeys, rout, &got, &total, WAIT_MS);
        rc = 1;
        break;
    case 9:
        psc_stats(g.c, 0, WAIT_MS, &st);
        rc = 1;
        break;
    case 10:
        psc_stats_tables(g.c, 0, WAIT_MS, &st, ts, 4);
        rc = 1;
        break;
    case 11:
        psc_checkpoint(g.c, 0, WAIT_MS, detail, sizeof detail);
        rc = 1;
        break;
    default:
        psc_table_open(g.c, "dense", WAIT_MS, &t);
        rc = 1;
        break;
    }
    if (rc == 0)
        settle(tk, 0);
    pthread_mutex_lock(&g.mu);
    g.data = NULL;
    pthread_mutex_unlock(&g.mu);
    free(vals);
    free(out);
    free(rvals);
    free(rout);
    free(keys);
    free(rkeys);
    return 0;
}
