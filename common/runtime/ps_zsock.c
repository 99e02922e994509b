/* ZeroMQ socket on a libuv loop: poll + prepare + idle, bounded drains. */
#include "ps_zsock.h"

#include "ps_err.h"
#include "ps_limits.h"

static void on_idle(uv_idle_t *h);

/* Reads until the callback finds nothing waiting, or PS_DRAIN_BATCH_MAX
 * messages. No ZMQ_EVENTS check: each one is a poll() syscall inside
 * libzmq (it processes the socket's commands), and a receive that finds
 * nothing processes them the same way, so the last, failed read leaves
 * ZMQ_FD armed for the next message as the check would. */
static void drain(struct ps_zsock *zs)
{
    if (zs->closing)
        return;
    int more = 1;
    for (unsigned i = 0; i < PS_DRAIN_BATCH_MAX && more; i++) {
        more = zs->on_readable(zs, zs->arg) == 0;
        if (zs->closing)
            return;
    }
    /* a full batch: keep the loop spinning, so poll does not block on input
     * already there */
    if (more)
        uv_idle_start(&zs->idle, on_idle);
    else
        uv_idle_stop(&zs->idle);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    drain(h->data);
}

static void on_prepare(uv_prepare_t *h)
{
    drain(h->data);
}

static void on_idle(uv_idle_t *h)
{
    drain(h->data);
}

int ps_zsock_start(uv_loop_t *loop, struct ps_zsock *zs, void *sock, ps_zsock_read_cb cb, void *arg)
{
    int fd = -1;
    size_t len = sizeof fd;
    if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) != 0)
        return PS_EZMQ;
    zs->sock = sock;
    zs->on_readable = cb;
    zs->arg = arg;
    zs->closing = 0;
    if (uv_poll_init(loop, &zs->poll, fd) != 0)
        return PS_EIO;
    uv_prepare_init(loop, &zs->prepare);
    uv_idle_init(loop, &zs->idle);
    zs->poll.data = zs->prepare.data = zs->idle.data = zs;
    uv_poll_start(&zs->poll, UV_READABLE, on_poll);
    uv_prepare_start(&zs->prepare, on_prepare);
    return 0;
}

void ps_zsock_close(struct ps_zsock *zs)
{
    if (zs->closing)
        return;
    zs->closing = 1;
    uv_close((uv_handle_t *)&zs->poll, NULL);
    uv_close((uv_handle_t *)&zs->prepare, NULL);
    uv_close((uv_handle_t *)&zs->idle, NULL);
}
