/* ROUTER transport for psd. */
#define _GNU_SOURCE
#include "net.h"

#include "catalog.h"
#include "live.h"

#include "ps_err.h"
#include "ps_zmsg.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_shm.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* routing id + up to PS_FRAMES_MAX frames + one more to detect excess */
#define PARTS_MAX (PS_FRAMES_MAX + 2u)

/* Sends [route][header][mask?][values?] to a peer without blocking; every
 * frame but the routing id is counted as unread (unread.h) until ZeroMQ
 * frees it. Large values go out without a copy (ZeroMQ frees them, or
 * lets go of a lent table block); small or borrowed ones (a table's
 * memory below PS_ZEROCOPY_BYTES_MIN) are copied. */
int psd_net_reply(struct psd_net *n, const void *route, size_t route_len, struct psd_reply *rep)
{
    struct psd_unread_peer *p = psd_unread_peer(&n->unread, route, route_len);
    struct psd_lent *none = NULL;
    void *hdr = (void *)rep->hdr;
    int own_vals = rep->vals_bytes >= PS_ZEROCOPY_BYTES_MIN && !rep->vals_borrowed;
    const int f = ZMQ_DONTWAIT;
    /* After the first part is queued, the rest of the message is too. */
    if (zmq_send(n->sock, route, route_len, ZMQ_SNDMORE | f) < 0 ||
        psd_unread_send(&n->unread, p, n->sock, &hdr, rep->hdr_len, &none, 0,
                        (rep->mask || rep->vals ? ZMQ_SNDMORE : 0) | f) != 0 ||
        (rep->mask && psd_unread_send(&n->unread, p, n->sock, &rep->mask, rep->mask_bytes, &none, 1,
                                      (rep->vals ? ZMQ_SNDMORE : 0) | f) != 0) ||
        (rep->vals && psd_unread_send(&n->unread, p, n->sock, &rep->vals, rep->vals_bytes,
                                      &rep->lent, own_vals, f) != 0)) {
        n->send_drops++;
        PS_LOG(n->srv->conf.log, PS_LOG_DEBUG, S0110, "reply dropped: %s", zmq_strerror(errno));
        psd_reply_drop(rep);
        return PS_EAGAIN;
    }
    psd_reply_drop(rep);
    return 0;
}

/* A reply, unless replicas hold it until the backups have its changes. */
static int send_reply(struct psd_net *n, const void *route, size_t route_len, struct psd_reply *rep)
{
    if (n->repl != NULL && n->repl_hold(n->repl, route, route_len, rep))
        return 0;
    return psd_net_reply(n, route, route_len, rep);
}

/* psd's question at a hello under CURVE (psd_may_use_cb). */
static int may_use(void *ctx, const char *user, uint32_t w)
{
    const struct psd_net *n = ctx;
    return n->sec == NULL || psd_security_may_use(n->sec, user, w);
}

/* psd's question before it sends values (psd_unread_cb). */
static int unread_of(void *ctx, const void *route, size_t route_len, uint64_t *peer,
                     uint64_t *total)
{
    struct psd_net *n = ctx;
    const struct psd_unread_peer *p = psd_unread_peer(&n->unread, route, route_len);
    *total = atomic_load_explicit(&n->unread.total, memory_order_relaxed);
    *peer = p != NULL ? atomic_load_explicit(&p->bytes, memory_order_relaxed) : 0;
    return p != NULL;
}

static int on_readable(struct ps_zsock *zs, void *arg)
{
    struct psd_net *n = arg;
    zmq_msg_t parts[PARTS_MAX];
    size_t kept = 0, total = 0;
    if (ps_zmsg_recv(zs->sock, ZMQ_DONTWAIT, parts, PARTS_MAX, &kept, &total, NULL) != 0)
        return -1; /* nothing to read */
    if (n->repl != NULL) {
        struct ps_frame route = {zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0])};
        const char *user = n->sec != NULL && kept > 1 ? zmq_msg_gets(&parts[1], "User-Id") : NULL;
        n->repl_request(n->repl, &route, user, parts, kept, total);
        for (size_t i = 0; i < kept; i++)
            zmq_msg_close(&parts[i]);
        /* a stop waits for the first round boundary, not for the next
         * tick: by then the next round may have begun */
        if (n->on_quiescent != NULL && psd_quiescent(n->srv))
            n->on_quiescent(n->quiescent_ctx);
        return 0;
    }
    struct ps_frame frames[PARTS_MAX];
    for (size_t i = 1; i < kept; i++) {
        frames[i - 1].data = zmq_msg_data(&parts[i]);
        frames[i - 1].size = zmq_msg_size(&parts[i]);
    }
    struct ps_frame route = {zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0])};
    struct psd_reply rep;
    /* under CURVE, the key ZAP admitted the connection with */
    const char *user = n->sec != NULL && kept > 1 ? zmq_msg_gets(&parts[1], "User-Id") : NULL;
    if (psd_dispatch_from(n->srv, &route, user, frames, total - 1, &rep))
        send_reply(n, route.data, route.size, &rep);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    if (n->on_quiescent != NULL && psd_quiescent(n->srv))
        n->on_quiescent(n->quiescent_ctx);
    return 0;
}

static void send_deferred(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    send_reply(ctx, route, route_len, rep);
}

/* ---- the fd socket: shared regions handed over ---------------------------- */

static void on_shm_accept(uv_poll_t *h, int status, int events);

static void conn_closed(uv_handle_t *h)
{
    struct psd_net_conn *c = h->data;
    struct psd_net *n = c->net;
    close(c->fd);
    c->fd = -1;
    c->state = 0;
    if (n->shm_paused && n->shm_fd >= 0) { /* a slot is free: take the next connection */
        n->shm_paused = 0;
        uv_timer_stop(&n->shm_timer);
        uv_poll_start(&n->shm_poll, UV_READABLE, on_shm_accept);
    }
}

static void conn_done(struct psd_net_conn *c)
{
    uv_poll_stop(&c->poll);
    uv_close((uv_handle_t *)&c->poll, conn_closed);
    c->state = 2;
}

static void on_conn(uv_poll_t *h, int status, int events)
{
    (void)events;
    struct psd_net_conn *c = h->data;
    struct psd_net *n = c->net;
    uint64_t token = 0;
    void *base = NULL;
    size_t size = 0;
    char err[200] = "the connection failed";
    int rc = status < 0 ? PS_EIO : ps_shm_take(c->fd, &token, &base, &size, err, sizeof err);
    if (rc == PS_SHM_PENDING)
        return; /* not all there yet */
    if (rc == 0 && psd_shm_take(n->srv, token, base, size) != 0) {
        munmap(base, size);
        rc = PS_ELIMIT;
        snprintf(err, sizeof err, "psd maps %u regions already, all of them in use",
                 PS_SHM_REGIONS_MAX);
    }
    if (rc != 0 && ps_log_sampled(++n->shm_refused)) {
        PS_LOG(n->srv->conf.log, PS_LOG_WARN, S0112,
               "a shared region handed over was refused (%llu so far): %s",
               (unsigned long long)n->shm_refused, err);
    }
    ps_shm_answer(c->fd, rc == 0);
    conn_done(c);
}

/* Closes the connections that have sent no complete hand-over for
 * PS_SHM_CONN_IDLE_MS. The count closed. */
static uint32_t close_idle(struct psd_net *n, uint64_t now)
{
    uint32_t closed = 0;
    for (uint32_t i = 0; i < PS_SHM_CONNS_MAX; i++) {
        struct psd_net_conn *c = &n->conns[i];
        if (c->state == 1 && now - c->since_ms >= PS_SHM_CONN_IDLE_MS) {
            conn_done(c);
            n->shm_idle_closed++;
            closed++;
        }
    }
    return closed;
}

/* Every slot was taken when a connection came: it waits in the listen
 * backlog while idle ones are closed; a slot freed resumes accepting
 * (conn_closed). */
static void on_shm_timer(uv_timer_t *t)
{
    struct psd_net *n = t->data;
    if (close_idle(n, uv_now(t->loop)) == 0)
        uv_timer_start(&n->shm_timer, on_shm_timer, PS_SHM_CONN_IDLE_MS, 0);
}

static struct psd_net_conn *conn_slot(struct psd_net *n)
{
    for (uint32_t i = 0; i < PS_SHM_CONNS_MAX; i++)
        if (n->conns[i].state == 0)
            return &n->conns[i];
    return NULL;
}

static void on_shm_accept(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct psd_net *n = h->data;
    for (;;) {
        struct psd_net_conn *c = conn_slot(n);
        if (c == NULL) { /* the rest wait in the backlog until a slot frees */
            uv_poll_stop(&n->shm_poll);
            n->shm_paused = 1;
            if (close_idle(n, uv_now(h->loop)) == 0)
                uv_timer_start(&n->shm_timer, on_shm_timer, PS_SHM_CONN_IDLE_MS, 0);
            return;
        }
        int fd = accept4(n->shm_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* none waiting (or a transient error: the next readiness retries) */
        if (uv_poll_init(h->loop, &c->poll, fd) != 0) {
            close(fd); /* the client sees no answer and keeps to frames */
            n->shm_refused++;
            continue;
        }
        c->fd = fd;
        c->net = n;
        c->since_ms = uv_now(h->loop);
        c->state = 1;
        c->poll.data = c;
        uv_poll_start(&c->poll, UV_READABLE, on_conn);
    }
}

/* Listens for shared regions next to the local endpoint: best effort. */
static void shm_start(struct psd_net *n, uv_loop_t *loop, const char *local)
{
    char err[200];
    int fd = ps_shm_listen(local, err, sizeof err);
    if (fd < 0 || uv_poll_init(loop, &n->shm_poll, fd) != 0) {
        PS_LOG(n->srv->conf.log, PS_LOG_WARN, S0113,
               "no shared memory for clients on this host (%s): their values go through %s",
               fd < 0 ? err : "cannot watch the fd socket", local);
        if (fd >= 0)
            close(fd);
        return;
    }
    n->shm_fd = fd;
    n->shm_poll.data = n;
    uv_timer_init(loop, &n->shm_timer);
    n->shm_timer.data = n;
    uv_poll_start(&n->shm_poll, UV_READABLE, on_shm_accept);
}

/* Descriptors psd keeps free of connections (the monitor, checkpoints,
 * the metrics endpoint, shared regions being handed over). */
#define FD_SPARE 16u

uint64_t psd_net_connections_max(const struct psd_net *n)
{
    return n->nofile > n->fd_base + FD_SPARE ? n->nofile - n->fd_base - FD_SPARE : 0;
}

/* The ROUTER's events: connections come and go (near the descriptor
 * limit, said once each time), a CURVE handshake fails. Accepts that fail
 * are not watched: past the limit ZeroMQ retries them at once, and an
 * event for each would take this loop too. */
static int on_monitor(struct ps_zsock *zs, void *arg)
{
    struct psd_net *n = arg;
    zmq_msg_t parts[2];
    size_t kept = 0, total = 0;
    if (ps_zmsg_recv(zs->sock, ZMQ_DONTWAIT, parts, 2, &kept, &total, NULL) != 0)
        return -1;
    if (kept == 2 && zmq_msg_size(&parts[0]) >= 6) {
        const uint8_t *d = zmq_msg_data(&parts[0]);
        uint16_t ev = (uint16_t)(d[0] | d[1] << 8);
        char ep[128];
        size_t len =
            zmq_msg_size(&parts[1]) < sizeof ep - 1 ? zmq_msg_size(&parts[1]) : sizeof ep - 1;
        memcpy(ep, zmq_msg_data(&parts[1]), len);
        ep[len] = '\0';
        uint64_t room = psd_net_connections_max(n);
        if (ev == ZMQ_EVENT_ACCEPTED) {
            n->connections++;
            if (n->nofile > 0 && n->connections >= room && !n->at_limit) {
                n->at_limit = 1;
                n->limit_reached++;
                PS_LOG(
                    n->srv->conf.log, PS_LOG_WARN, S0114,
                    "%llu connections on %s: at the file-descriptor limit (%llu, ulimit -n, less "
                    "what psd holds): ZeroMQ cannot accept more and retries at once, taking "
                    "a core, until one closes (raise LimitNOFILE=, or bound connections at "
                    "the firewall)",
                    (unsigned long long)n->connections, ep, (unsigned long long)n->nofile);
            }
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            n->connections -= n->connections > 0;
            if (n->connections + FD_SPARE < room)
                n->at_limit = 0;
        } else if (n->sec != NULL) {
            psd_security_handshake_failed(n->sec, ev, ep);
        }
    }
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}

/* Descriptors this process has open. */
static uint64_t fds_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    uint64_t k = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        k += e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    return k;
}

/* Before the ROUTER binds, so that no connection goes uncounted. */
static int monitor_start(struct psd_net *n, uv_loop_t *loop, char *err, size_t errlen)
{
    int events =
        ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | (n->sec != NULL ? PSD_SECURITY_EVENTS : 0);
    struct rlimit rl;
    n->nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                    ? (uint64_t)rl.rlim_cur
                    : 0;
    int linger = 0;
    if (zmq_socket_monitor(n->sock, "inproc://psd-monitor", events) != 0 ||
        (n->monitor = zmq_socket(n->ctx, ZMQ_PAIR)) == NULL ||
        zmq_setsockopt(n->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_connect(n->monitor, "inproc://psd-monitor") != 0) {
        snprintf(err, errlen, "cannot monitor the socket: %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    return ps_zsock_start(loop, &n->mon_zs, n->monitor, on_monitor, n);
}

static int set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

int psd_net_start(struct psd_net *n, struct psd *srv, uv_loop_t *loop, const char *listen,
                  int io_threads, int local_ipc, struct psd_security *sec, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    n->shm_fd = -1;
    if (psd_unread_init(&n->unread) != 0) {
        snprintf(err, errlen, "out of memory for the unread replies' records");
        return PS_ENOMEM;
    }
    for (uint32_t i = 0; i < PS_SHM_CONNS_MAX; i++)
        n->conns[i].fd = -1;
    n->srv = srv;
    n->sec = sec;
    n->ctx = zmq_ctx_new();
    if (n->ctx == NULL) {
        snprintf(err, errlen, "zmq_ctx_new: %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    zmq_ctx_set(n->ctx, ZMQ_IO_THREADS, io_threads);
    if (sec != NULL && psd_security_start(sec, n->ctx, loop, err, errlen) != 0) {
        psd_net_fini(n);
        return PS_EZMQ;
    }
    n->sock = zmq_socket(n->ctx, ZMQ_ROUTER);
    int64_t maxmsg = (int64_t)srv->conf.value_bytes_max;
    if (n->sock == NULL || set_int(n->sock, ZMQ_LINGER, 0) != 0 ||
        set_int(n->sock, ZMQ_ROUTER_MANDATORY, 1) != 0 ||
        /* a client reconnecting with its routing id (libpsclient gives
         * each socket its own, random) takes it over from the connection
         * that died: its hello's binding of a worker id holds */
        set_int(n->sock, ZMQ_ROUTER_HANDOVER, 1) != 0 ||
        set_int(n->sock, ZMQ_SNDBUF, PS_SOCKET_BUFFER_BYTES) != 0 ||
        set_int(n->sock, ZMQ_RCVBUF, PS_SOCKET_BUFFER_BYTES) != 0 ||
        zmq_setsockopt(n->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        snprintf(err, errlen, "cannot create ROUTER socket: %s", zmq_strerror(errno));
        psd_net_fini(n);
        return PS_EZMQ;
    }
    if ((sec != NULL && psd_security_apply(sec, n->sock, err, errlen) != 0) ||
        monitor_start(n, loop, err, errlen) != 0) {
        psd_net_fini(n);
        return PS_EZMQ;
    }
    if (zmq_bind(n->sock, listen) != 0) {
        snprintf(err, errlen, "--listen: cannot bind '%s': %s", listen, zmq_strerror(errno));
        psd_net_fini(n);
        return PS_EZMQ;
    }
    size_t len = sizeof n->endpoint;
    if (zmq_getsockopt(n->sock, ZMQ_LAST_ENDPOINT, n->endpoint, &len) != 0)
        snprintf(n->endpoint, sizeof n->endpoint, "%s", listen);
    /* The same socket on the host's abstract Unix name: best effort, tcp
     * serves every client whatever happens here */
    char local[PS_ENDPOINT_MAX];
    if (local_ipc && ps_local_endpoint(n->endpoint, local, sizeof local) == 0) {
        if (zmq_bind(n->sock, local) == 0)
            psd_set_local_endpoint(srv, local);
        else
            PS_LOG(srv->conf.log, PS_LOG_WARN, S0111,
                   "cannot bind the same-host endpoint %s (%s): clients on this host use %s", local,
                   zmq_strerror(errno), n->endpoint);
    }
    psd_set_sender(srv, send_deferred, n);
    psd_set_unread(srv, unread_of, n);
    psd_set_may_use(srv, may_use, n);
    int rc = ps_zsock_start(loop, &n->zs, n->sock, on_readable, n);
    if (rc != 0) {
        snprintf(err, errlen, "cannot watch the socket on the event loop");
        psd_net_fini(n);
        return rc;
    }
    if (psd_local_endpoint(srv)[0] != '\0')
        shm_start(n, loop, psd_local_endpoint(srv));
    n->fd_base = fds_open();
    return 0;
}

void psd_net_stop(struct psd_net *n)
{
    if (n->sock != NULL)
        ps_zsock_close(&n->zs);
    if (n->monitor != NULL)
        ps_zsock_close(&n->mon_zs);
    if (n->shm_fd >= 0) {
        uv_poll_stop(&n->shm_poll);
        uv_close((uv_handle_t *)&n->shm_poll, NULL);
        uv_close((uv_handle_t *)&n->shm_timer, NULL);
        n->shm_paused = 0;
        for (uint32_t i = 0; i < PS_SHM_CONNS_MAX; i++)
            if (n->conns[i].state == 1)
                conn_done(&n->conns[i]);
    }
    if (n->sec != NULL)
        psd_security_stop(n->sec);
}

void psd_net_fini(struct psd_net *n)
{
    if (n->sock != NULL) {
        zmq_socket_monitor(n->sock, NULL, 0);
        zmq_close(n->sock);
    }
    if (n->monitor != NULL)
        zmq_close(n->monitor);
    n->monitor = NULL;
    if (n->sec != NULL)
        psd_security_fini(n->sec);
    if (n->ctx != NULL)
        zmq_ctx_term(n->ctx);
    if (n->shm_fd >= 0)
        close(n->shm_fd);
    n->shm_fd = -1;
    psd_unread_fini(&n->unread); /* every frame was freed with the context */
    n->sock = NULL;
    n->ctx = NULL;
}
