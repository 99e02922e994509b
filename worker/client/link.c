/* Links between the neighbouring stages of a pipeline (psclient.h,
 * "Pipeline links"): a micro-batch's activations forward, their gradient
 * backward, each a message of a header (OP_STAGE: step, micro-batch,
 * dtype, shape) and one values frame; a credit window on activations in
 * flight; every message from a neighbour checked before it is used; and
 * a neighbour that dies found by ZeroMQ's heartbeats and the socket's
 * monitor, and named. One link per process, used from one thread. */
#include "psclient.h"
#include "sized_impl.h"

#include "ps_err.h"
#include "ps_header.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_wire.h"
#include "ps_zmsg.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define LINK_ARENA_BYTES (4u * PS_HEADER_BYTES_MAX)
/* ZeroMQ's heartbeat to a neighbour; silence past timeout_ms ends it */
#define LINK_HEARTBEAT_MS 250
/* a wait looks at the neighbour's connection this often */
#define LINK_POLL_MS 100

/* One neighbour: the socket to it, the monitor of that socket, and what
 * the monitor said. */
struct side {
    void *sock, *mon;
    uint32_t stage;                 /* the neighbour's */
    char endpoint[PS_ENDPOINT_MAX]; /* bound (previous) or connected to (next) */
    int up, gone;                   /* connected once; its connection dropped since */
    char why[192];                  /* a handshake that failed ("": none) */
    zmq_msg_t held;                 /* the last tensor received from it */
    uint64_t sent, received;        /* bytes of values */
};

struct psc_link {
    void *ctx;
    uint32_t stage, stages, window, in_flight;
    int timeout_ms;
    uint64_t bytes_max;
    struct side prev, next; /* stage - 1 (it connects here), stage + 1 (this one connects) */
    void *zap;              /* CURVE: the handler admitting stage - 1's keys */
    uint8_t allow[PSC_LINK_ALLOW_MAX][32];
    size_t nallow;
    uint64_t refused; /* handshakes the handler refused */
    struct ps_arena arena;
    unsigned char arena_buf[LINK_ARENA_BYTES];
    uint8_t hdr_buf[PS_HEADER_BYTES_MAX];
    char err[PS_ERROR_TEXT_MAX + 256];
};

static int fail(struct psc_link *l, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct psc_link *l, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, sizeof l->err, fmt, ap);
    va_end(ap);
    return code;
}

const char *psc_link_error(const struct psc_link *l)
{
    return l->err;
}

const char *psc_link_endpoint(const struct psc_link *l)
{
    return l->prev.sock != NULL ? l->prev.endpoint : "";
}

void psc_link_bytes(const struct psc_link *l, uint64_t *sent, uint64_t *received)
{
    *sent = l->prev.sent + l->next.sent;
    *received = l->prev.received + l->next.received;
}

uint32_t psc_link_in_flight(const struct psc_link *l)
{
    return l->in_flight;
}

/* The socket to one neighbour, with heartbeats and a monitor of its
 * connection. Not ZMQ_IMMEDIATE: with it, what a neighbour sent just
 * before it closed (the last answer of a run) is dropped with its
 * connection, unread. */
static int open_side(struct psc_link *l, struct side *s, const char *name, int timeout_ms)
{
    int zero = 0, hb = LINK_HEARTBEAT_MS, hwm = (int)PSC_LINK_QUEUE_MAX;
    int64_t max = (int64_t)l->bytes_max + PS_HEADER_BYTES_MAX;
    zmq_msg_init(&s->held);
    s->sock = zmq_socket(l->ctx, ZMQ_DEALER);
    if (s->sock == NULL || zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout_ms, sizeof timeout_ms) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_TTL, &timeout_ms, sizeof timeout_ms) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0)
        return fail(l, PS_EZMQ, "link: cannot make the socket to stage %u: %s", s->stage,
                    zmq_strerror(errno));
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://psc-link-%p-%s", (void *)l, name);
    int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(s->sock, mon, events) != 0 ||
        (s->mon = zmq_socket(l->ctx, ZMQ_PAIR)) == NULL || zmq_connect(s->mon, mon) != 0)
        return fail(l, PS_EZMQ, "link: cannot watch the connection to stage %u: %s", s->stage,
                    zmq_strerror(errno));
    return 0;
}

/* A Z85 key of 40 characters, decoded into 32 bytes. */
static int z85_key(const char *k, uint8_t *out)
{
    return k != NULL && strlen(k) == 40 && zmq_z85_decode(out, k) != NULL;
}

/* CURVE on the sockets (cfg's keys checked): stage - 1's socket a server
 * whose handler admits the allow list, stage + 1's a client of its key. */
static int curve(struct psc_link *l, const struct psc_link_config *cfg, int first, int last,
                 char *err, size_t errlen)
{
    uint8_t pub[32], sec[32], srv[32];
    if (!z85_key(cfg->curve_public, pub) || !z85_key(cfg->curve_secret, sec))
        return ps_errf(PS_EINVAL, err, errlen,
                       "link: curve_public and curve_secret: this stage's key pair, 40 Z85 "
                       "characters each");
    if (!last && !z85_key(cfg->curve_server_key, srv))
        return ps_errf(PS_EINVAL, err, errlen,
                       "link: curve_server_key: stage %u's public key, 40 Z85 characters",
                       cfg->stage + 1);
    if (!first && (cfg->ncurve_allow == 0 || cfg->ncurve_allow > PSC_LINK_ALLOW_MAX))
        return ps_errf(PS_EINVAL, err, errlen,
                       "link: curve_allow: 1 to %u public keys stage %u may connect with",
                       PSC_LINK_ALLOW_MAX, cfg->stage - 1);
    for (size_t i = 0; !first && i < cfg->ncurve_allow; i++)
        if (!z85_key(cfg->curve_allow[i], l->allow[i]))
            return ps_errf(PS_EINVAL, err, errlen,
                           "link: curve_allow[%zu] is not a public key of 40 Z85 characters", i);
    l->nallow = first ? 0 : cfg->ncurve_allow;
    int one = 1;
    if (!first) { /* the handler first: the server's handshakes ask it */
        if ((l->zap = zmq_socket(l->ctx, ZMQ_REP)) == NULL ||
            zmq_bind(l->zap, "inproc://zeromq.zap.01") != 0 ||
            zmq_setsockopt(l->prev.sock, ZMQ_ZAP_DOMAIN, "psc-link", 8) != 0 ||
            zmq_setsockopt(l->prev.sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
            zmq_setsockopt(l->prev.sock, ZMQ_CURVE_SECRETKEY, sec, 32) != 0)
            return ps_errf(PS_EZMQ, err, errlen, "link: cannot set up CURVE for stage %u: %s",
                           cfg->stage - 1, zmq_strerror(errno));
    }
    if (!last && (zmq_setsockopt(l->next.sock, ZMQ_CURVE_SERVERKEY, srv, 32) != 0 ||
                  zmq_setsockopt(l->next.sock, ZMQ_CURVE_PUBLICKEY, pub, 32) != 0 ||
                  zmq_setsockopt(l->next.sock, ZMQ_CURVE_SECRETKEY, sec, 32) != 0))
        return ps_errf(PS_EZMQ, err, errlen, "link: cannot set up CURVE for stage %u: %s",
                       cfg->stage + 1, zmq_strerror(errno));
    return 0;
}

int psc_link_create(const struct psc_link_config *caller, struct psc_link **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    struct psc_link_config own;
    int rc0 = psc__sized_in(&own, sizeof own, PSC__LINK_CONFIG_V1, caller, "psc_link_config", err,
                            errlen);
    if (rc0 != 0)
        return rc0;
    const struct psc_link_config *cfg = &own;
    if (cfg->stages < 2 || cfg->stage >= cfg->stages || cfg->stages > PS_WORKERS_MAX)
        return ps_errf(PS_EINVAL, err, errlen, "link: stage %u of %u (2 to %u stages)", cfg->stage,
                       cfg->stages, PS_WORKERS_MAX);
    int first = cfg->stage == 0, last = cfg->stage + 1 == cfg->stages;
    if (!first && (cfg->listen == NULL || ps_endpoint_check(cfg->listen, 1, err, errlen) != 0))
        return ps_errf(PS_EINVAL, err, errlen,
                       "link: stage %u needs listen, where stage %u connects (tcp://HOST:PORT)",
                       cfg->stage, cfg->stage - 1);
    if (!last && (cfg->next == NULL || ps_endpoint_check(cfg->next, 0, err, errlen) != 0))
        return ps_errf(PS_EINVAL, err, errlen,
                       "link: stage %u needs next, the endpoint stage %u listens on", cfg->stage,
                       cfg->stage + 1);
    if (!last && (cfg->window == 0 || cfg->window > PSC_LINK_WINDOW_MAX))
        return ps_errf(PS_EINVAL, err, errlen, "link: window %u outside [1, %u]", cfg->window,
                       PSC_LINK_WINDOW_MAX);
    if (cfg->bytes_max == 0 || cfg->bytes_max > PS_VALUE_BYTES_MAX)
        return ps_errf(PS_EINVAL, err, errlen, "link: bytes_max %llu outside [1, %llu]",
                       (unsigned long long)cfg->bytes_max, (unsigned long long)PS_VALUE_BYTES_MAX);
    struct psc_link *l = calloc(1, sizeof *l);
    if (l == NULL)
        return ps_errf(PS_ENOMEM, err, errlen, "link: out of memory");
    l->stage = cfg->stage;
    l->stages = cfg->stages;
    l->window = cfg->window;
    l->bytes_max = cfg->bytes_max;
    l->prev.stage = cfg->stage - 1;
    l->next.stage = cfg->stage + 1;
    ps_arena_init(&l->arena, l->arena_buf, sizeof l->arena_buf);
    int timeout = cfg->timeout_ms > 0 ? cfg->timeout_ms : PSC_LINK_TIMEOUT_MS_DEFAULT;
    l->timeout_ms = timeout;
    int rc = (l->ctx = zmq_ctx_new()) == NULL ? fail(l, PS_EZMQ, "link: no ZeroMQ context") : 0;
    if (rc == 0 && !first)
        rc = open_side(l, &l->prev, "prev", timeout);
    if (rc == 0 && !last)
        rc = open_side(l, &l->next, "next", timeout);
    int keys = cfg->curve_public != NULL || cfg->curve_secret != NULL ||
               cfg->curve_server_key != NULL || cfg->curve_allow != NULL;
    if (rc == 0 && keys && (rc = curve(l, cfg, first, last, l->err, sizeof l->err)) != 0) {
        snprintf(err, errlen, "%s", l->err);
        psc_link_destroy(l);
        return rc;
    }
    if (rc == 0 && !first) {
        size_t len = sizeof l->prev.endpoint;
        if (zmq_bind(l->prev.sock, cfg->listen) != 0)
            rc = fail(l, PS_EZMQ, "link: cannot bind %s: %s", cfg->listen, zmq_strerror(errno));
        else if (zmq_getsockopt(l->prev.sock, ZMQ_LAST_ENDPOINT, l->prev.endpoint, &len) != 0)
            snprintf(l->prev.endpoint, sizeof l->prev.endpoint, "%s", cfg->listen);
    }
    if (rc == 0 && !last) {
        snprintf(l->next.endpoint, sizeof l->next.endpoint, "%s", cfg->next);
        if (zmq_connect(l->next.sock, cfg->next) != 0)
            rc = fail(l, PS_EZMQ, "link: cannot connect to %s: %s", cfg->next, zmq_strerror(errno));
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s", l->err);
        psc_link_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
}

static void watch(struct psc_link *l, struct side *s);

/* What was sent still goes (the last answer of a run) for up to the
 * link's timeout, unless the neighbour is gone. The monitor stops before
 * its reading end closes: ZeroMQ's I/O thread sends it events blocking,
 * and one sent to a closed end would hold that thread, and this one
 * with it, for ever. */
static void close_side(struct psc_link *l, struct side *s)
{
    zmq_msg_close(&s->held);
    if (s->sock != NULL) {
        watch(l, s); /* drained: the I/O thread is not held on a full queue */
        zmq_socket_monitor(s->sock, NULL, 0);
        int linger = s->gone ? 0 : l->timeout_ms;
        zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(s->sock);
    }
    if (s->mon != NULL)
        zmq_close(s->mon);
}

static void serve_zap(struct psc_link *l);

void psc_link_destroy(struct psc_link *l)
{
    if (l == NULL)
        return;
    if (l->zap != NULL) { /* no handshake left waiting for the handler as it goes */
        int zero = 0;
        serve_zap(l);
        zmq_setsockopt(l->zap, ZMQ_LINGER, &zero, sizeof zero);
    }
    close_side(l, &l->prev);
    close_side(l, &l->next);
    if (l->zap != NULL)
        zmq_close(l->zap);
    if (l->ctx != NULL)
        zmq_ctx_term(l->ctx);
    free(l);
}

/* Answers the ZAP requests waiting (CURVE: a neighbour's handshake
 * waits for this): admits the keys of the allow list. */
static void serve_zap(struct psc_link *l)
{
    for (;;) {
        enum { PARTS = 8 };
        zmq_msg_t parts[PARTS];
        size_t n = 0, total = 0;
        if (ps_zmsg_recv(l->zap, ZMQ_DONTWAIT, parts, PARTS, &n, &total, NULL) != 0)
            return;
        /* [version][request id][domain][address][identity][mechanism][key] */
        int ok = total == 7 && zmq_msg_size(&parts[5]) == 5 &&
                 memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) == 0 && zmq_msg_size(&parts[6]) == 32;
        int admit = 0;
        for (size_t i = 0; ok && i < l->nallow && !admit; i++)
            admit = memcmp(zmq_msg_data(&parts[6]), l->allow[i], 32) == 0;
        if (!admit)
            l->refused++;
        const char *code = admit ? "200" : ok ? "400" : "500";
        const char *text = admit ? "OK" : ok ? "key not allowed" : "malformed ZAP request";
        zmq_send(l->zap, "1.0", 3, ZMQ_SNDMORE);
        if (n > 1)
            zmq_send(l->zap, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), ZMQ_SNDMORE);
        else
            zmq_send(l->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(l->zap, code, 3, ZMQ_SNDMORE);
        zmq_send(l->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(l->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(l->zap, "", 0, 0);
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
    }
}

/* Reads what the monitor of s says: its connection came up or dropped,
 * or a handshake failed. */
static void watch(struct psc_link *l, struct side *s)
{
    if (l->zap != NULL)
        serve_zap(l);
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, s->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t id = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&id, zmq_msg_data(&ev), 2);
        zmq_msg_close(&ev);
        zmq_msg_init(&addr);
        zmq_msg_recv(&addr, s->mon, 0); /* the event's second frame */
        zmq_msg_close(&addr);
        if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            s->up = 1;
            s->why[0] = '\0';
        } else if (id == ZMQ_EVENT_DISCONNECTED && s->up) {
            s->gone = 1;
        } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            snprintf(s->why, sizeof s->why, "%s",
                     s == &l->prev ? "a stage connected with a CURVE key this stage does not "
                                     "admit"
                                   : "it refused this stage's CURVE key");
        } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                   id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
            snprintf(s->why, sizeof s->why,
                     "a handshake failed: one side runs CURVE and the other not, or the server "
                     "key is not the one it holds");
        }
    }
}

static int gone(struct psc_link *l, const struct side *s)
{
    return fail(l, PS_EIO,
                "stage %u (%s) is gone: its connection dropped (it exited, or sent no heartbeat "
                "within the link's timeout)",
                s->stage, s->endpoint);
}

/* Sends one header (and values when not NULL) to s. */
static int send_msg(struct psc_link *l, struct side *s, const Ps__Header *h, const void *data,
                    size_t bytes)
{
    watch(l, s);
    if (s->gone)
        return gone(l, s);
    int64_t n = ps_wire_header_pack(h, l->hdr_buf, sizeof l->hdr_buf);
    if (n < 0)
        return fail(l, PS_ELIMIT, "link: a header past %u bytes", PS_HEADER_BYTES_MAX);
    /* the header's send waits (SNDTIMEO at a time) while the neighbour
     * is there with its queue full; the values frame of a message whose
     * header went never waits (ZeroMQ takes a message's frames whole) */
    while (zmq_send(s->sock, l->hdr_buf, (size_t)n, data != NULL ? ZMQ_SNDMORE : 0) < 0) {
        if (errno != EAGAIN && errno != EINTR)
            return fail(l, PS_EZMQ, "link: sending to stage %u: %s", s->stage, zmq_strerror(errno));
        watch(l, s);
        if (s->gone)
            return gone(l, s);
        if (!s->up)
            return fail(l, PS_ETIMEDOUT,
                        "stage %u (%s) never connected within the link's timeout%s%s", s->stage,
                        s->endpoint, s->why[0] ? ": " : "", s->why);
    }
    if (data != NULL && zmq_send(s->sock, data, bytes, 0) < 0)
        return fail(l, PS_EZMQ, "link: sending to stage %u: %s", s->stage, zmq_strerror(errno));
    if (data != NULL)
        s->sent += bytes;
    return 0;
}

/* The side a direction's messages go to (send) or come from (recv). */
static struct side *side_of(struct psc_link *l, int dir, int sending)
{
    int toward_next = (dir == PSC_LINK_FORWARD) == (sending != 0);
    struct side *s = toward_next ? &l->next : &l->prev;
    return s->sock != NULL ? s : NULL;
}

static size_t esize(int dtype)
{
    return dtype == PS__DTYPE__DTYPE_F32 ? 4u : 2u;
}

/* Elements of a shape, or 0 when it is not 1..PSC_SHAPE_DIMS_MAX
 * dimensions of at least 1 whose product fits bytes_max. */
static uint64_t elements(const uint64_t *shape, size_t ndims, size_t es, uint64_t bytes_max)
{
    if (ndims == 0 || ndims > PSC_SHAPE_DIMS_MAX)
        return 0;
    uint64_t n = 1;
    for (size_t i = 0; i < ndims; i++) {
        if (shape[i] == 0 || n > bytes_max / es / shape[i])
            return 0;
        n *= shape[i];
    }
    return n;
}

int psc_link_send(struct psc_link *l, int dir, const struct psc_tensor *caller)
{
    struct psc_tensor own;
    char why[PS_ERROR_TEXT_MAX];
    if (psc__sized_in(&own, sizeof own, PSC__TENSOR_V1, caller, "psc_tensor", why, sizeof why) != 0)
        return fail(l, PS_EINVAL, "link: %s", why);
    const struct psc_tensor *t = &own;
    struct side *s = side_of(l, dir, 1);
    if (s == NULL)
        return fail(l, PS_EINVAL, "link: stage %u of %u sends no %s", l->stage, l->stages,
                    dir == PSC_LINK_FORWARD ? "activations (it is the last)"
                                            : "gradients (it is the first)");
    if (t->dtype != PSC_F32 && t->dtype != PSC_F16 && t->dtype != PSC_BF16)
        return fail(l, PS_EINVAL, "link: dtype %d is not f32, f16 or bf16", t->dtype);
    size_t es = esize(t->dtype);
    uint64_t n = elements(t->shape, t->ndims, es, l->bytes_max);
    if (n == 0)
        return fail(l, PS_EINVAL,
                    "link: a shape of %u dimensions, each at least 1, their %s bytes at most %llu",
                    t->ndims, t->ndims > PSC_SHAPE_DIMS_MAX ? "many" : "product's",
                    (unsigned long long)l->bytes_max);
    int credit = dir == PSC_LINK_FORWARD && !t->eval;
    if (credit && l->in_flight >= l->window)
        return fail(l, PS_ELIMIT,
                    "link: %u micro-batches' activations in flight to stage %u, its window: "
                    "receive a gradient first",
                    l->in_flight, s->stage);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_STAGE);
    h.clock = t->step;
    h.offset = t->micro;
    h.count = n;
    h.dtype = (Ps__DType)t->dtype;
    h.stage = l->stage;
    h.backward = dir == PSC_LINK_BACKWARD;
    h.stages = l->stages;
    h.eval = t->eval != 0;
    h.n_shape = t->ndims;
    h.shape = (uint64_t *)t->shape;
    int rc = send_msg(l, s, &h, t->data, (size_t)(n * es));
    if (rc == 0 && credit)
        l->in_flight++;
    return rc;
}

/* Tells s its last message was refused, and why (best effort). */
static void refuse(struct psc_link *l, struct side *s, int code)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_STAGE);
    h.status = code;
    h.stage = l->stage;
    h.stages = l->stages;
    h.error = l->err;
    (void)send_msg(l, s, &h, NULL, 0);
}

/* The header and values of a message from s, checked: what a neighbour
 * sends is used only once it is what it says it is. */
static int check(struct psc_link *l, struct side *s, int dir, zmq_msg_t *parts, size_t kept,
                 size_t total, struct psc_tensor *t)
{
    size_t hn = zmq_msg_size(&parts[0]);
    Ps__Header *h = NULL;
    if (hn <= PS_HEADER_BYTES_MAX) {
        ps_arena_reset(&l->arena);
        h = ps__header__unpack(&l->arena.pa, hn, zmq_msg_data(&parts[0]));
    }
    if (h == NULL || h->op != PS__OP__OP_STAGE)
        return fail(l, PS_EPROTO, "stage %u sent a message that is no pipeline tensor", s->stage);
    if (h->status != 0)
        return fail(l, PS_EREMOTE, "stage %u refused this stage's message: %s", s->stage,
                    h->error ? h->error : "(no reason given)");
    if (h->stages != l->stages)
        return fail(l, PS_EPROTO,
                    "stage %u's pipeline has %u stages, this one's %u (a run started with "
                    "different stage counts?)",
                    s->stage, h->stages, l->stages);
    if (h->stage != s->stage || h->backward != (dir == PSC_LINK_BACKWARD))
        return fail(l, PS_EPROTO, "a message from stage %u says it is stage %u's %s", s->stage,
                    h->stage, h->backward ? "gradient" : "activations");
    if (total != 2 || kept != 2)
        return fail(l, PS_EFRAMES, "stage %u sent %zu frames, a tensor takes 2", s->stage, total);
    if (h->dtype != PS__DTYPE__DTYPE_F32 && h->dtype != PS__DTYPE__DTYPE_F16 &&
        h->dtype != PS__DTYPE__DTYPE_BF16)
        return fail(l, PS_EDTYPE, "stage %u sent dtype %d", s->stage, (int)h->dtype);
    size_t es = esize(h->dtype), bytes = zmq_msg_size(&parts[1]);
    uint64_t n = elements(h->shape, h->n_shape, es, l->bytes_max);
    if (n == 0 || n != h->count || n * es != bytes)
        return fail(l, n == 0 ? PS_ELIMIT : PS_ESIZE,
                    "stage %u sent %zu bytes with a shape of %zu dimensions and %llu elements "
                    "(each dimension at least 1, at most %u of them, %llu bytes at most, and the "
                    "frame as many bytes as they take)",
                    s->stage, bytes, h->n_shape, (unsigned long long)h->count, PSC_SHAPE_DIMS_MAX,
                    (unsigned long long)l->bytes_max);
    t->step = h->clock;
    t->micro = (uint32_t)h->offset;
    t->dtype = (int)h->dtype;
    t->ndims = (uint32_t)h->n_shape;
    memcpy(t->shape, h->shape, h->n_shape * sizeof t->shape[0]);
    t->data = zmq_msg_data(&parts[1]);
    t->eval = h->eval != 0;
    return 0;
}

/* Waits up to timeout_ms (< 0: as long as s is there) for s to send. */
static int wait_for(struct psc_link *l, struct side *s, int timeout_ms)
{
    for (int waited = 0;;) {
        /* what came before the neighbour went is still read: looked for
         * after the monitor, which hears of the drop after the data */
        watch(l, s);
        zmq_pollitem_t now = {s->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&now, 1, 0) > 0)
            return 0;
        if (s->gone)
            return gone(l, s);
        int slice = timeout_ms < 0 || timeout_ms - waited > LINK_POLL_MS ? LINK_POLL_MS
                                                                         : timeout_ms - waited;
        /* a neighbour's CURVE handshake may wait for this stage's handler */
        zmq_pollitem_t it[2] = {{s->sock, 0, ZMQ_POLLIN, 0}, {l->zap, 0, ZMQ_POLLIN, 0}};
        int n = zmq_poll(it, l->zap != NULL ? 2 : 1, slice);
        if (n > 0 && (it[0].revents & ZMQ_POLLIN))
            return 0;
        if (n < 0 && errno != EINTR)
            return fail(l, PS_EZMQ, "link: waiting for stage %u: %s", s->stage,
                        zmq_strerror(errno));
        waited += slice;
        if (timeout_ms >= 0 && waited >= timeout_ms)
            return fail(l, PS_ETIMEDOUT, "stage %u (%s) sent nothing for %d ms%s%s%s", s->stage,
                        s->endpoint, waited, s->up ? "" : " (it never connected)",
                        s->why[0] ? ": " : "", s->why);
    }
}

int psc_link_wait_connected(struct psc_link *l, int timeout_ms)
{
    struct side *sides[2] = {&l->prev, &l->next};
    for (int waited = 0;; waited += LINK_POLL_MS) {
        char missing[2 * (PS_ENDPOINT_MAX + 256)] = "";
        size_t used = 0;
        for (int i = 0; i < 2; i++) {
            struct side *s = sides[i];
            if (s->sock == NULL)
                continue;
            watch(l, s);
            if (s->gone)
                return gone(l, s);
            if (!s->up)
                used += (size_t)snprintf(missing + used, sizeof missing - used,
                                         "%sstage %u (%s%s%s)", used ? "; " : "", s->stage,
                                         s->endpoint, s->why[0] ? ": " : "", s->why);
        }
        if (used == 0)
            return 0;
        if (waited >= timeout_ms)
            return fail(l, PS_ETIMEDOUT, "%s never connected within %d ms", missing, timeout_ms);
        zmq_pollitem_t it[3];
        int n = 0;
        for (int i = 0; i < 2; i++)
            if (sides[i]->mon != NULL)
                it[n++] = (zmq_pollitem_t){sides[i]->mon, 0, ZMQ_POLLIN, 0};
        if (l->zap != NULL)
            it[n++] = (zmq_pollitem_t){l->zap, 0, ZMQ_POLLIN, 0};
        zmq_poll(it, n, LINK_POLL_MS);
    }
}

static int link_recv(struct psc_link *l, int dir, int timeout_ms, struct psc_tensor *t);

int psc_link_recv(struct psc_link *l, int dir, int timeout_ms, struct psc_tensor *caller)
{
    char why[PS_ERROR_TEXT_MAX];
    if (psc__sized_check_out(caller, sizeof *caller, PSC__TENSOR_V1, "psc_tensor", why,
                             sizeof why) != 0)
        return fail(l, PS_EINVAL, "link: %s", why);
    struct psc_tensor own = {0};
    int rc = link_recv(l, dir, timeout_ms, &own);
    psc__sized_out(caller, &own, sizeof own);
    return rc;
}

static int link_recv(struct psc_link *l, int dir, int timeout_ms, struct psc_tensor *t)
{
    struct side *s = side_of(l, dir, 0);
    if (s == NULL)
        return fail(l, PS_EINVAL, "link: stage %u of %u receives no %s", l->stage, l->stages,
                    dir == PSC_LINK_FORWARD ? "activations (it is the first)"
                                            : "gradients (it is the last)");
    int rc = wait_for(l, s, timeout_ms);
    if (rc != 0)
        return rc;
    enum { PARTS = 3 };
    zmq_msg_t parts[PARTS];
    size_t kept = 0, total = 0;
    (void)ps_zmsg_recv(s->sock, ZMQ_DONTWAIT, parts, PARTS, &kept, &total, NULL);
    rc = kept > 0
             ? check(l, s, dir, parts, kept, total, t)
             : fail(l, PS_EZMQ, "link: receiving from stage %u: %s", s->stage, zmq_strerror(errno));
    if (rc == 0) { /* its values stay readable until the next message from s */
        zmq_msg_close(&s->held);
        zmq_msg_init(&s->held);
        zmq_msg_move(&s->held, &parts[1]);
        t->data = zmq_msg_data(&s->held);
        s->received += zmq_msg_size(&s->held);
        if (dir == PSC_LINK_BACKWARD && !t->eval && l->in_flight > 0)
            l->in_flight--;
    } else if (rc == PS_EREMOTE) {
        /* the next stage refused activations: no gradient will give their
         * credit back */
        if (s == &l->next && l->in_flight > 0)
            l->in_flight--;
    } else if (rc != PS_EZMQ) {
        refuse(l, s, rc);
    }
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return rc;
}
