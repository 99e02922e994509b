/* psd's ZeroMQ transport: a ROUTER socket on the server loop.
 *
 * Reads [routing id][frames...], hands the frames to psd_dispatch, and sends
 * [routing id][reply header][values?] back without blocking. Values of
 * replies go out zero-copy (zmq frees them through a callback). Sends that
 * would block (peer's queue full) or go to a vanished peer are dropped and
 * counted: the loop never waits on one peer. */
#ifndef PSD_NET_H
#define PSD_NET_H

#include "psd.h"
#include "security.h"
#include "unread.h"
#include "ps_zsock.h"

#include <uv.h>

/* A connection to the fd socket, handing a shared region over. */
struct psd_net_conn {
    uv_poll_t poll;
    int fd;
    int state; /* 0 free, 1 reading, 2 closing */
    uint64_t since_ms;
    struct psd_net *net;
};

/* Replicas (repl.h) take every request, and hold replies until their
 * backups have what the replies depend on (1: taken, held or dropped;
 * 0: send it now). Called on the loop, with the net's repl pointer. */
typedef void (*psd_net_request_cb)(void *repl, const struct ps_frame *route, const char *user,
                                   zmq_msg_t *parts, size_t kept, size_t total);
typedef int (*psd_net_hold_cb)(void *repl, const void *route, size_t route_len,
                               struct psd_reply *rep);

struct psd_net {
    struct psd *srv;
    void *repl; /* replicas (repl.h), or NULL: requests go to psd_dispatch */
    psd_net_request_cb repl_request;
    psd_net_hold_cb repl_hold;
    void *ctx;
    void *sock;
    struct ps_zsock zs;
    char endpoint[PS_ENDPOINT_MAX]; /* actual bound endpoint (port resolved) */
    uint64_t send_drops;
    struct psd_unread unread; /* reply bytes peers have not read */
    struct psd_security *sec;
    /* the fd socket next to the local endpoint (ps_shm.h); -1: none */
    int shm_fd;
    uv_poll_t shm_poll;
    struct psd_net_conn conns[PS_SHM_CONNS_MAX];
    uv_timer_t shm_timer; /* closes idle connections while accepting waits */
    int shm_paused;       /* every slot taken: new connections wait in the backlog */
    uint64_t shm_refused, shm_idle_closed;
    /* the ROUTER's monitor: connections accepted and not yet gone; when
     * they reach the file-descriptor limit (nofile, less the fd_base psd
     * holds otherwise) ZeroMQ cannot accept more, and retries at once:
     * said once each time (at_limit), counted in limit_reached. Handshake
     * failures go to sec. */
    void *monitor;
    struct ps_zsock mon_zs;
    uint64_t connections, nofile, fd_base, limit_reached;
    int at_limit;
    /* A stop waiting for the end of a bsp round (psd's SIGTERM): called
     * after the request that leaves every table between rounds, before
     * another is read (it may stop the net). NULL: none waits. */
    void (*on_quiescent)(void *ctx);
    void *quiescent_ctx;
};

/* Connections psd can hold: its descriptor limit less those it holds
 * otherwise (0: no limit known). */
uint64_t psd_net_connections_max(const struct psd_net *n);

/* Binds `listen` and registers on `loop`. io_threads sizes zmq's I/O pool.
 * local_ipc: when `listen` is tcp://, also bind its same-host endpoint
 * (ps_local.h) and offer it in hello replies, and listen for shared
 * regions (ps_shm.h) next to it; a failure there is logged.
 * sec, when not NULL (loaded), makes the socket a CURVE server behind the
 * ZAP allow list; it must outlive the transport. */
int psd_net_start(struct psd_net *n, struct psd *srv, uv_loop_t *loop, const char *listen,
                  int io_threads, int local_ipc, struct psd_security *sec, char *err,
                  size_t errlen);
/* Sends a reply to route now, whatever replicas wait for (repl.c). */
int psd_net_reply(struct psd_net *n, const void *route, size_t route_len, struct psd_reply *rep);
/* Deregisters from the loop (handles close on the next uv_run turn). */
void psd_net_stop(struct psd_net *n);
/* Closes the socket and terminates the context; after the loop is done. */
void psd_net_fini(struct psd_net *n);

#endif
