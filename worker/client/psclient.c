/* libpsclient: a client's lifetime (sockets, the hello to every shard,
 * moving to a shard's same-host endpoint) and its counters. */
#include "client_impl.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_local.h"
#include "ps_zmsg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void psc_bytes(const struct psc_client *c, uint64_t *sent, uint64_t *received)
{
    *sent = c->bytes_sent;
    *received = c->bytes_received;
}

void *psc_shm_alloc(struct psc_client *c, size_t bytes)
{
    size_t at = (c->shm_used + PS_SHM_ALIGN - 1u) & ~(size_t)(PS_SHM_ALIGN - 1u);
    if (c->shm.base == NULL || at > c->shm.size || bytes > c->shm.size - at)
        return NULL;
    c->shm_used = at + bytes;
    return c->shm.base + at;
}

uint32_t psc_shm_shards(const struct psc_client *c)
{
    uint32_t n = 0;
    for (uint32_t s = 0; c->shm_on != NULL && s < c->nshards; s++)
        n += c->shm_on[s];
    return n;
}

void psc_shm_bytes(const struct psc_client *c, uint64_t *sent, uint64_t *received)
{
    *sent = c->shm_sent;
    *received = c->shm_received;
}

uint32_t psc_shards(const struct psc_client *c)
{
    return c->nshards;
}

int psc_shard_answered(const struct psc_client *c, uint32_t shard)
{
    return shard < c->nshards && c->offers[shard].instance != 0;
}

/* A DEALER connected to ep for shard s, in *out; closed again on failure.
 * Its routing id is its own and random, kept when ZeroMQ reconnects (a
 * connection cut and made again): the shard's binding of this client's
 * worker id to the connection its hello came on still holds, where an
 * id ZeroMQ makes up would be a new connection to it. */
static int open_socket(struct psc_client *c, const struct psc_config *cfg, uint32_t s,
                       const char *ep, void **out, char *err, size_t errlen)
{
    void *sock = *out = zmq_socket(c->ctx, ZMQ_DEALER);
    int linger = 0, buf = PS_SOCKET_BUFFER_BYTES, hwm = PS_SOCKET_HWM, rc = 0;
    unsigned char rid[1 + 2 * sizeof(uint64_t)] = {'p'}; /* not 0: ZeroMQ's own start so */
    uint64_t r[2] = {ps_random_id(), ps_random_id()};
    memcpy(rid + 1, r, sizeof r);
    if (sock == NULL || zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(sock, ZMQ_ROUTING_ID, rid, sizeof rid) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDBUF, &buf, sizeof buf) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVBUF, &buf, sizeof buf) != 0) {
        snprintf(err, errlen, "server %u: cannot create socket: %s", s, zmq_strerror(errno));
        rc = PS_EZMQ;
    } else if (cfg->curve_server_key != NULL &&
               (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, cfg->curve_server_key, 41) != 0 ||
                zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, cfg->curve_public, 41) != 0 ||
                zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, cfg->curve_secret, 41) != 0)) {
        snprintf(err, errlen, "server %u: CURVE keys refused by zmq: %s", s, zmq_strerror(errno));
        rc = PS_EINVAL;
    } else if (zmq_connect(sock, ep) != 0) {
        snprintf(err, errlen, "server %u: cannot connect to '%s': %s", s, ep, zmq_strerror(errno));
        rc = PS_EINVAL;
    }
    if (rc != 0 && sock != NULL) {
        zmq_close(sock);
        *out = NULL;
    }
    return rc;
}

static int open_sockets(struct psc_client *c, const struct psc_config *cfg, char *err,
                        size_t errlen)
{
    for (uint32_t s = 0; s < c->nshards; s++) {
        const char *ep = cfg->servers[s];
        if (ep == NULL || strlen(ep) >= PS_ENDPOINT_MAX) {
            snprintf(err, errlen, "server %u: endpoint missing or longer than %u bytes", s,
                     PS_ENDPOINT_MAX - 1);
            return PS_EINVAL;
        }
        void *sock = NULL;
        if ((c->endpoints[s] = strdup(c->reps ? c->reps[s].eps[0] : ep)) == NULL) {
            snprintf(err, errlen, "out of memory");
            return PS_ENOMEM;
        }
        if (c->reps != NULL) /* the first replica named */
            ep = c->reps[s].eps[0];
        int rc = open_socket(c, cfg, s, ep, &sock, err, errlen);
        if (rc != 0)
            return rc;
        c->socks[s] = sock;
    }
    return 0;
}

/* Tells cfg's hello_waiting which shards have not answered the hello,
 * and why when a shard said (NULL: no answer yet). */
static void hello_waiting(const struct psc_client *c, const struct psc_config *cfg, int waited_ms,
                          const char *why)
{
    uint32_t missing[PS_SHARDS_MAX], n = 0;
    for (uint32_t s = 0; s < c->nshards; s++)
        if (c->offers[s].instance == 0)
            missing[n++] = s;
    if (n > 0)
        cfg->hello_waiting(cfg->hello_waiting_arg, missing, n, waited_ms, why);
}

/* ZeroMQ's socket monitor on each shard's socket while the hello waits:
 * a handshake the server refused (CURVE key not admitted, CURVE on one
 * side only) shows there at once, where the hello would just never be
 * answered. */
struct hello_watch {
    void *mon[PS_SHARDS_MAX]; /* PAIR sockets reading each monitor; NULL: none */
};

static void watch_start(struct psc_client *c, struct hello_watch *hw)
{
    memset(hw, 0, sizeof *hw);
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    for (uint32_t s = 0; s < c->nshards; s++) {
        char ep[64];
        int linger = 0;
        snprintf(ep, sizeof ep, "inproc://psc-hello-%p-%u", (void *)c, s);
        void *m = NULL;
        if (zmq_socket_monitor(c->socks[s], ep, events) != 0 ||
            (m = zmq_socket(c->ctx, ZMQ_PAIR)) == NULL ||
            zmq_setsockopt(m, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(m, ep) != 0) {
            if (m != NULL)
                zmq_close(m);
            zmq_socket_monitor(c->socks[s], NULL, 0);
            continue; /* best effort: the hello still times out */
        }
        hw->mon[s] = m;
    }
}

static void watch_stop(struct psc_client *c, struct hello_watch *hw)
{
    for (uint32_t s = 0; s < c->nshards; s++)
        if (hw->mon[s] != NULL) {
            zmq_socket_monitor(c->socks[s], NULL, 0);
            zmq_close(hw->mon[s]);
            hw->mon[s] = NULL;
        }
}

/* A refused handshake seen by the monitors, waited for up to wait_ms:
 * PS_EAUTH with the shard and the likely cause in the client's error; 0
 * when none was seen. */
static int watch_refused(struct psc_client *c, const struct psc_config *cfg, struct hello_watch *hw,
                         int wait_ms)
{
    zmq_pollitem_t items[PS_SHARDS_MAX];
    int n = 0;
    for (uint32_t s = 0; wait_ms > 0 && s < c->nshards; s++)
        if (hw->mon[s] != NULL)
            items[n++] = (zmq_pollitem_t){.socket = hw->mon[s], .events = ZMQ_POLLIN};
    if (n > 0)
        zmq_poll(items, n, wait_ms);
    for (uint32_t s = 0; s < c->nshards; s++) {
        zmq_msg_t parts[2];
        size_t kept = 0, total = 0;
        if (hw->mon[s] == NULL ||
            ps_zmsg_recv(hw->mon[s], ZMQ_DONTWAIT, parts, 2, &kept, &total, NULL) != 0)
            continue;
        uint16_t ev = 0;
        if (kept >= 1 && zmq_msg_size(&parts[0]) >= 6) {
            const uint8_t *d = zmq_msg_data(&parts[0]);
            ev = (uint16_t)(d[0] | d[1] << 8);
        }
        for (size_t i = 0; i < kept; i++)
            zmq_msg_close(&parts[i]);
        /* the server often closes the connection before its reason arrives
         * (no detail, EPIPE): the cause is told from this side's keys */
        int curve = cfg->curve_server_key != NULL;
        const char *why =
            !curve ? "the handshake failed: the server speaks CURVE and this client does not "
                     "(give it CURVE keys: --curve-secret and --curve-server-key)"
            : ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                ? "the server's CURVE allow list does not admit this client's public key"
                : "the CURVE handshake failed: the server does not speak CURVE, or its public "
                  "key is not the one given (--curve-server-key)";
        return psc__set_error(c, PS_EAUTH, "hello: shard %u (%s) refused this client: %s", s,
                              c->endpoints[s], why);
    }
    return 0;
}

/* Hello to every shard from a new session (a random id: servers keep the
 * last request id applied per worker and session, so a restarted worker is
 * not mistaken for a retry of the old one); the start clock is the
 * furthest any shard names. Waited for up to timeout_ms. With cfg (NULL:
 * none of this), in pieces of WATCH_MS: a handshake the server refused
 * ends it at once (watch_refused), and hello_waiting is told after 1 s
 * and every 5 s which shards have not answered. */
static int say_hello(struct psc_client *c, const struct psc_config *cfg, int timeout_ms)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.worker_id = c->worker_id;
    h.session = c->session = ps_random_id();
    c->start_clock = 0;
    /* a refused hello is tried again every WATCH_MS; hello_waiting hears
     * after TELL_FIRST_MS, then every TELL_EVERY_MS */
    enum { WATCH_MS = 200, TELL_FIRST_MS = 1000, TELL_EVERY_MS = 5000 };
    int rc = 0, waited = 0, tell_at = TELL_FIRST_MS;
    uint64_t id = 0;
    char held[sizeof c->last_error] = ""; /* why a shard would not let go of the id yet */
    struct hello_watch hw;
    if (cfg != NULL)
        watch_start(c, &hw);
    for (int sent = 0;;) {
        if (!sent) { /* the hello, again with the same session after a refusal */
            struct slot *sl = psc__slot_alloc(c, h.op, &id);
            if (sl == NULL) {
                rc = psc__set_error(c, PS_EBUSY, "hello: too many requests outstanding");
                break;
            }
            h.request_id = id;
            for (uint32_t s = 0; s < c->nshards; s++)
                if (psc__send_frames(c, s, &h, NULL, 0, NULL, 0, sl, 0) != 0)
                    break;
            sent = 1;
        }
        int piece = cfg == NULL || timeout_ms < 0 || timeout_ms - waited <= WATCH_MS
                        ? (timeout_ms < 0 ? -1 : timeout_ms - waited)
                        : WATCH_MS;
        rc = psc_wait(c, id, piece);
        if (rc == PS_EAGAIN && cfg != NULL) {
            /* the hello could not be sent: ZeroMQ drops a connection whose
             * handshake the server refused, and then has nowhere to queue
             * it. The refusal's reason is on the monitor, or soon is. */
            int refused = watch_refused(c, cfg, &hw, WATCH_MS);
            rc = refused != 0 ? refused : rc;
            break;
        }
        if (rc == PS_EREMOTE && c->last_remote == PS_EBUSY && cfg != NULL && timeout_ms >= 0 &&
            waited + piece < timeout_ms) {
            /* the id is still held by the connection of a process this one
             * may replace (a restart): the shard lets go of it once that
             * one has been silent for its --worker-timeout */
            snprintf(held, sizeof held, "%s", c->last_error);
            struct timespec ts = {0, WATCH_MS * 1000000L};
            nanosleep(&ts, NULL);
            sent = 0;
            rc = PS_ETIMEDOUT;
        } else if (rc != PS_ETIMEDOUT) {
            break;
        }
        waited += piece;
        if (piece < 0 || waited >= timeout_ms)
            break;
        if ((rc = watch_refused(c, cfg, &hw, 0)) != 0)
            break;
        rc = PS_ETIMEDOUT;
        if (cfg->hello_waiting != NULL && waited >= tell_at) {
            hello_waiting(c, cfg, waited, held[0] ? held : NULL);
            tell_at += TELL_EVERY_MS;
        }
    }
    if (cfg != NULL)
        watch_stop(c, &hw);
    char why[sizeof c->last_error];
    if (rc == PS_EAUTH) {
        psc_cancel(c, id);
        return rc;
    }
    if (rc == PS_ETIMEDOUT) { /* psc_wait named the shards and its last piece's time */
        const char *from = strstr(c->last_error, " from shard ");
        snprintf(why, sizeof why, "%s", from ? from : "");
        if (held[0] != '\0')
            psc__set_error(c, PS_EBUSY, "%s (for %d ms)", held, waited);
        else
            psc__set_error(c, rc, "hello: no reply within %d ms%s", waited, why);
        psc_cancel(c, id); /* no zero-copy frames: always releases */
        return held[0] != '\0' ? PS_EBUSY : rc;
    }
    if (rc != 0) {
        snprintf(why, sizeof why, "%s", c->last_error);
        return psc__set_error(c, rc, "hello: %s", why);
    }
    c->outside = 0;
    return 0;
}

/* Moves each shard whose hello offered a same-host endpoint this process can
 * reach onto it (ps_local.h). The switch is checked by a hello in the same
 * session over the new socket: it must come from the same psd process, or
 * the shard stays on the endpoint it was given. Runs before any request is
 * outstanding, so no reply is lost with the old socket. */
static void go_local(struct psc_client *c, const struct psc_config *cfg, int timeout_ms)
{
    for (uint32_t s = 0; s < c->nshards; s++) {
        if (!ps_local_reachable(c->offers[s].local))
            continue;
        struct offer want = c->offers[s];
        char *ep = strdup(want.local);
        void *tcp = c->socks[s], *local = NULL;
        char err[256];
        if (ep == NULL || open_socket(c, cfg, s, want.local, &local, err, sizeof err) != 0) {
            free(ep);
            continue;
        }
        c->socks[s] = local;
        uint64_t start_clock = c->start_clock;
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_HELLO);
        h.session = c->session; /* the same session: not a restart */
        if (c->shm.fd >= 0 &&
            ps_shm_hand(want.local, c->shm.fd, c->shm_token, timeout_ms, err, sizeof err) == 0)
            h.shm_token = c->shm_token; /* bound to this connection by the hello */
        if (psc__call_sync(c, &h, s, s, NULL, timeout_ms) == 0 &&
            c->offers[s].instance == want.instance) {
            zmq_close(tcp);
            free(c->endpoints[s]);
            c->endpoints[s] = ep;
        } else {
            zmq_close(local);
            c->socks[s] = tcp;
            c->offers[s] = want;
            if (c->shm_on != NULL)
                c->shm_on[s] = 0;
            c->start_clock = start_clock;
            free(ep);
        }
    }
    c->last_error[0] = '\0';
}

const char *psc_endpoint(const struct psc_client *c, uint32_t shard)
{
    return shard < c->nshards ? c->endpoints[shard] : NULL;
}

int psc_outside_round(const struct psc_client *c)
{
    return c->outside;
}

int psc_rejoin(struct psc_client *c, int timeout_ms)
{
    if (c->nfree != PS_CLIENT_TICKETS_MAX)
        return psc__set_error(c, PS_EBUSY, "rejoin: %u tickets are outstanding",
                              PS_CLIENT_TICKETS_MAX - c->nfree);
    return say_hello(c, NULL, timeout_ms);
}

int psc_create(const struct psc_config *caller, struct psc_client **out, char *err, size_t errlen)
{
    *out = NULL;
    struct psc_config own;
    int rc0 = psc__sized_in(&own, sizeof own, PSC__CONFIG_V1, caller, "psc_config", err, errlen);
    if (rc0 != 0)
        return rc0;
    const struct psc_config *cfg = &own;
    if (cfg->curve_server_key != NULL &&
        (cfg->curve_public == NULL || cfg->curve_secret == NULL ||
         strlen(cfg->curve_server_key) != 40 || strlen(cfg->curve_public) != 40 ||
         strlen(cfg->curve_secret) != 40)) {
        snprintf(err, errlen,
                 "CURVE needs the server key and this client's key pair, 40 "
                 "Z85 characters each");
        return PS_EINVAL;
    }
    if (cfg->zmq_context != NULL && cfg->nio_cpus > 0) {
        snprintf(err, errlen,
                 "io_cpus with a shared zmq_context: set the context's own "
                 "ZMQ_THREAD_AFFINITY_CPU_ADD instead");
        return PS_EINVAL;
    }
    if (cfg->servers == NULL || cfg->nservers == 0 || cfg->nservers > PS_SHARDS_MAX) {
        snprintf(err, errlen, "need 1..%u server endpoints", PS_SHARDS_MAX);
        return PS_EINVAL;
    }
    for (size_t s = 0; s < cfg->nservers; s++)
        if (cfg->servers[s] == NULL || ps_endpoints_check(cfg->servers[s], err, errlen) != 0) {
            if (cfg->servers[s] == NULL)
                snprintf(err, errlen, "server endpoint %zu is NULL", s);
            return PS_EINVAL;
        }
    struct psc_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    c->nshards = (uint32_t)cfg->nservers;
    c->worker_id = cfg->worker_id;
    c->dtype = (Ps__DType)cfg->wire_dtype;
    c->nonzero_pulls = cfg->nonzero_pulls != 0;
    c->retry_ms = cfg->retry_ms > 0 ? cfg->retry_ms : 0;
    c->heartbeat_ms = cfg->heartbeat_ms == 0 ? PSC_HEARTBEAT_MS_DEFAULT : cfg->heartbeat_ms;
    c->esize = ps_dtype_size(cfg->wire_dtype);
    if (c->esize == 0) {
        snprintf(err, errlen, "wire dtype %d is not f32, f16 or bf16", cfg->wire_dtype);
        free(c);
        return PS_EINVAL;
    }
    c->piece_bytes = cfg->piece_bytes == 0 ? PSC_PIECE_BYTES_DEFAULT : cfg->piece_bytes;
    if (c->piece_bytes < PSC_PIECE_BYTES_MIN) {
        snprintf(err, errlen, "piece_bytes %zu is below %u", cfg->piece_bytes, PSC_PIECE_BYTES_MIN);
        free(c);
        return PS_EINVAL;
    }
    c->socks = calloc(c->nshards, sizeof *c->socks);
    c->endpoints = calloc(c->nshards, sizeof *c->endpoints);
    c->offers = calloc(c->nshards, sizeof *c->offers);
    c->shm.fd = -1;
    c->pfds = calloc(c->nshards, sizeof *c->pfds);
    c->last_send_ms = calloc(c->nshards, sizeof *c->last_send_ms);
    c->arena_buf = malloc(CLIENT_ARENA_BYTES);
    c->own_ctx = cfg->zmq_context == NULL;
    c->ctx = c->own_ctx ? zmq_ctx_new() : cfg->zmq_context;
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++) {
        atomic_init(&c->slots[i].zc_refs, 0u);
        c->free_stack[i] = (uint16_t)(PS_CLIENT_TICKETS_MAX - 1 - i);
    }
    c->nfree = PS_CLIENT_TICKETS_MAX;
    if (c->socks == NULL || c->endpoints == NULL || c->offers == NULL || c->pfds == NULL ||
        c->arena_buf == NULL || c->last_send_ms == NULL || c->ctx == NULL) {
        snprintf(err, errlen, "out of memory");
        psc_destroy(c);
        return PS_ENOMEM;
    }
    ps_arena_init(&c->arena, c->arena_buf, CLIENT_ARENA_BYTES);
    /* before the first socket starts the I/O thread */
    for (int i = 0; i < cfg->nio_cpus; i++)
        if (zmq_ctx_set(c->ctx, ZMQ_THREAD_AFFINITY_CPU_ADD, cfg->io_cpus[i]) != 0) {
            snprintf(err, errlen, "cannot run ZeroMQ's I/O thread on CPU %d: %s", cfg->io_cpus[i],
                     zmq_strerror(errno));
            psc_destroy(c);
            return PS_EINVAL;
        }
    int rc = psc__replicas_init(c, cfg, err, errlen);
    if (rc == 0)
        rc = open_sockets(c, cfg, err, errlen);
    if (rc == 0 && (rc = say_hello(c, cfg, cfg->connect_timeout_ms)) != 0) {
        snprintf(err, errlen, "%s", c->last_error);
        if ((rc == PS_ETIMEDOUT || (rc == PS_EREMOTE && c->last_remote == PS_ENOTPRIMARY)) &&
            cfg->hello_optional)
            rc = 0;
    } else if (rc == 0 && cfg->local_ipc) {
        /* no region is no error: values go in frames */
        char why[200];
        if (cfg->shm_bytes > 0 && (c->shm_on = calloc(c->nshards, 1)) != NULL &&
            (c->rebind = calloc(c->nshards, sizeof *c->rebind)) != NULL &&
            ps_shm_create(cfg->shm_bytes, &c->shm, why, sizeof why) == 0)
            c->shm_token = ps_random_id();
        go_local(c, cfg, cfg->connect_timeout_ms);
    }
    if (rc != 0) {
        psc_destroy(c);
        return rc;
    }
    psc__replicas_watch(c);
    *out = c;
    return 0;
}

void psc_malloc_tune(void)
{
    ps_malloc_tune();
}

void psc_destroy(struct psc_client *c)
{
    if (c == NULL)
        return;
    psc__replicas_fini(c);
    for (uint32_t s = 0; c->socks != NULL && s < c->nshards; s++) {
        if (c->socks[s] != NULL)
            zmq_close(c->socks[s]);
        free(c->endpoints ? c->endpoints[s] : NULL);
    }
    if (c->ctx != NULL && c->own_ctx)
        zmq_ctx_term(c->ctx); /* linger 0: drops unsent frames, runs free callbacks */
    for (uint32_t i = 0; i < c->ntables; i++)
        free(c->tables[i]);
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++) {
        psc__view_drop(c, &c->slots[i]);
        free(c->slots[i].vmsg);
        free(c->slots[i].conv);
        free(c->slots[i].order);
        free(c->slots[i].skeys);
        free(c->slots[i].svals);
        free(c->slots[i].grp);
        free(c->slots[i].kids);
        free(c->slots[i].sync_hdr);
    }
    for (struct psc_mirror *m = c->mirrors, *next; m != NULL; m = next) {
        next = m->next;
        free(m);
    }
    ps_shm_close(&c->shm);
    free(c->shm_on);
    free(c->rebind);
    free(c->socks);
    free(c->endpoints);
    free(c->offers);
    free(c->pfds);
    free(c->batches);
    free(c->last_send_ms);
    free(c->arena_buf);
    free(c);
}

uint64_t psc_start_clock(const struct psc_client *c)
{
    return c->start_clock;
}

uint64_t psc_stale_pushes(const struct psc_client *c)
{
    return c->stale_pushes;
}

uint64_t psc_resends(const struct psc_client *c)
{
    return c->resends;
}
