/* ROUTER transport for psd. */
#define _GNU_SOURCE
#include "net.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_shm.h"

#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* routing id + up to PS_FRAMES_MAX frames + one more to detect excess */
#define PARTS_MAX (PS_FRAMES_MAX + 2u)

static void free_values(void *data, void *hint)
{
    (void)hint;
    free(data);
}

static void lent_done(void *data, void *hint)
{
    (void)data;
    psd_lent_done(hint);
}

/* Hands buf to zmq as the next frame: zero-copy when large (zmq frees it,
 * or lets go of *lent when buf lies in a lent table block), copied when
 * small or borrowed (a table's memory, not ours to hand over). On success
 * the frame owns buf. */
static int send_frame(struct psd_net *n, void **buf, size_t len, struct psd_lent **lent,
                      int borrowed, int more)
{
    zmq_msg_t m;
    if (len >= PS_ZEROCOPY_BYTES_MIN && !borrowed) {
        if (zmq_msg_init_data(&m, *buf, len, *lent ? lent_done : free_values, *lent) != 0)
            return -1;
        *buf = NULL; /* zmq owns it now, even if the send fails */
        *lent = NULL;
    } else {
        if (zmq_msg_init_size(&m, len) != 0)
            return -1;
        memcpy(zmq_msg_data(&m), *buf, len);
    }
    if (zmq_msg_send(&m, n->sock, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    return 0;
}

static int send_reply(struct psd_net *n, const void *route, size_t route_len, struct psd_reply *rep)
{
    int rc = 0;
    struct psd_lent *none = NULL;
    /* After the first part is queued, the rest of the message is too. */
    if (zmq_send(n->sock, route, route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(n->sock, rep->hdr, rep->hdr_len,
                 (rep->mask || rep->vals ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0 ||
        (rep->mask &&
         send_frame(n, &rep->mask, rep->mask_bytes, &none, 0, rep->vals != NULL) != 0) ||
        (rep->vals &&
         send_frame(n, &rep->vals, rep->vals_bytes, &rep->lent, rep->vals_borrowed, 0) != 0)) {
        n->send_drops++;
        PS_LOG(n->srv->log, PS_LOG_DEBUG, "S0110", "reply dropped: %s", zmq_strerror(errno));
        rc = PS_EAGAIN;
    }
    psd_reply_drop(rep);
    return rc;
}

static int on_readable(struct ps_zsock *zs, void *arg)
{
    struct psd_net *n = arg;
    zmq_msg_t parts[PARTS_MAX];
    size_t kept = 0, total = 0;
    if (ps_zsock_recv(zs->sock, ZMQ_DONTWAIT, parts, PARTS_MAX, &kept, &total, NULL) != 0)
        return -1; /* nothing to read */
    struct ps_frame frames[PARTS_MAX];
    for (size_t i = 1; i < kept; i++) {
        frames[i - 1].data = zmq_msg_data(&parts[i]);
        frames[i - 1].size = zmq_msg_size(&parts[i]);
    }
    struct ps_frame route = {zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0])};
    struct psd_reply rep;
    if (psd_dispatch(n->srv, &route, frames, total - 1, &rep))
        send_reply(n, route.data, route.size, &rep);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}

static void send_deferred(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    send_reply(ctx, route, route_len, rep);
}

/* ---- the fd socket: shared regions handed over ---------------------------- */

static void conn_closed(uv_handle_t *h)
{
    struct psd_net_conn *c = h->data;
    close(c->fd);
    c->fd = -1;
    c->state = 0;
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
    if (rc == 1)
        return; /* not all there yet */
    if (rc == 0 && psd_shm_take(n->srv, token, base, size) != 0) {
        munmap(base, size);
        rc = PS_ELIMIT;
        snprintf(err, sizeof err, "psd maps %u regions already, all of them in use",
                 PS_SHM_REGIONS_MAX);
    }
    if (rc != 0 && (n->shm_refused++ < 16 || n->shm_refused % 1024 == 0)) {
        PS_LOG(n->srv->log, PS_LOG_WARN, "S0112",
               "a shared region handed over was refused (%llu so far): %s",
               (unsigned long long)n->shm_refused, err);
    }
    ps_shm_answer(c->fd, rc == 0);
    conn_done(c);
}

/* A free connection slot; when none, those reading for over a second are
 * closed (they free up once closed) and NULL is returned. */
static struct psd_net_conn *conn_slot(struct psd_net *n, uint64_t now)
{
    for (uint32_t i = 0; i < PS_SHM_CONNS_MAX; i++)
        if (n->conns[i].state == 0)
            return &n->conns[i];
    for (uint32_t i = 0; i < PS_SHM_CONNS_MAX; i++)
        if (n->conns[i].state == 1 && now - n->conns[i].since_ms > 1000)
            conn_done(&n->conns[i]);
    return NULL;
}

static void on_shm_accept(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct psd_net *n = h->data;
    for (;;) {
        int fd = accept4(n->shm_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* none waiting (or a transient error: the next readiness retries) */
        uint64_t now = uv_now(h->loop);
        struct psd_net_conn *c = conn_slot(n, now);
        if (c == NULL || uv_poll_init(h->loop, &c->poll, fd) != 0) {
            close(fd); /* the client sees no answer and keeps to frames */
            n->shm_refused++;
            continue;
        }
        c->fd = fd;
        c->net = n;
        c->since_ms = now;
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
        PS_LOG(n->srv->log, PS_LOG_WARN, "S0113",
               "no shared memory for clients on this host (%s): their values go through %s",
               fd < 0 ? err : "cannot watch the fd socket", local);
        if (fd >= 0)
            close(fd);
        return;
    }
    n->shm_fd = fd;
    n->shm_poll.data = n;
    uv_poll_start(&n->shm_poll, UV_READABLE, on_shm_accept);
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
    int64_t maxmsg = (int64_t)srv->value_bytes_max;
    if (n->sock == NULL || set_int(n->sock, ZMQ_LINGER, 0) != 0 ||
        set_int(n->sock, ZMQ_ROUTER_MANDATORY, 1) != 0 ||
        set_int(n->sock, ZMQ_SNDBUF, PS_SOCKET_BUFFER_BYTES) != 0 ||
        set_int(n->sock, ZMQ_RCVBUF, PS_SOCKET_BUFFER_BYTES) != 0 ||
        zmq_setsockopt(n->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        snprintf(err, errlen, "cannot create ROUTER socket: %s", zmq_strerror(errno));
        psd_net_fini(n);
        return PS_EZMQ;
    }
    if (sec != NULL && psd_security_apply(sec, n->ctx, n->sock, loop, err, errlen) != 0) {
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
            PS_LOG(srv->log, PS_LOG_WARN, "S0111",
                   "cannot bind the same-host endpoint %s (%s): clients on this host use %s", local,
                   zmq_strerror(errno), n->endpoint);
    }
    psd_set_sender(srv, send_deferred, n);
    int rc = ps_zsock_start(loop, &n->zs, n->sock, on_readable, n);
    if (rc != 0) {
        snprintf(err, errlen, "cannot watch the socket on the event loop");
        psd_net_fini(n);
        return rc;
    }
    if (srv->local_endpoint[0] != '\0')
        shm_start(n, loop, srv->local_endpoint);
    return 0;
}

void psd_net_stop(struct psd_net *n)
{
    if (n->sock != NULL)
        ps_zsock_close(&n->zs);
    if (n->shm_fd >= 0) {
        uv_poll_stop(&n->shm_poll);
        uv_close((uv_handle_t *)&n->shm_poll, NULL);
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
    if (n->sec != NULL)
        psd_security_fini(n->sec);
    if (n->ctx != NULL)
        zmq_ctx_term(n->ctx);
    if (n->shm_fd >= 0)
        close(n->shm_fd);
    n->shm_fd = -1;
    n->sock = NULL;
    n->ctx = NULL;
}
