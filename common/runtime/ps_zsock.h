/* Drives a ZeroMQ socket from a libuv loop.
 *
 * ZMQ_FD is edge-triggered and also changes state when the socket *sends*,
 * so "the fd polled readable" is not a reliable signal. The glue therefore
 * (1) watches ZMQ_FD with uv_poll, (2) reads again in a uv_prepare handle
 * before the loop blocks (a receive that finds nothing processes the
 * socket's commands as a ZMQ_EVENTS check would, and re-arms ZMQ_FD), and
 * (3) drains at most PS_DRAIN_BATCH_MAX messages per turn; when more may
 * remain it keeps a uv_idle handle active so the loop does not block while
 * input is pending. All callbacks run on the
 * loop thread. Not a message parser: on_readable receives nothing but the
 * socket and must read exactly one multipart message (or none). */
#ifndef PS_ZSOCK_H
#define PS_ZSOCK_H

#include <uv.h>
#include <zmq.h>

struct ps_zsock;

/* Called on the loop thread when the socket may have input. Reads at most
 * one multipart message; returns 0 when it read one, <0 when none was
 * waiting (draining stops for this turn). */
typedef int (*ps_zsock_read_cb)(struct ps_zsock *zs, void *arg);

struct ps_zsock {
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t idle;
    void *sock; /* the zmq socket; not owned */
    ps_zsock_read_cb on_readable;
    void *arg;
    int closing;
};

/* Registers `sock` on `loop`. zs is caller-allocated and must stay put until
 * the close callback has run. Returns 0 or a PS_E* code; on failure no handle
 * is left registered and the callback is never called. */
int ps_zsock_start(uv_loop_t *loop, struct ps_zsock *zs, void *sock, ps_zsock_read_cb cb,
                   void *arg);

/* Stops and closes the handles. The zmq socket is left to the caller.
 * uv_run must run until the handles have closed before zs is freed. */
void ps_zsock_close(struct ps_zsock *zs);

#endif
