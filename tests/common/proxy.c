/* The lossy proxy (proxy.h). */
#include "proxy.h"

#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

#define PARTS_MAX 8

static int recv_parts(void *s, zmq_msg_t *parts, int *n)
{
    int more = 1;
    *n = 0;
    while (more) {
        if (*n == PARTS_MAX)
            return -1;
        zmq_msg_init(&parts[*n]);
        if (zmq_msg_recv(&parts[*n], s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&parts[*n]);
            return -1;
        }
        more = zmq_msg_more(&parts[(*n)++]);
    }
    return 0;
}

/* Sends copies of parts[0..n) (they stay the caller's), after a copy of
 * route when it is not NULL. */
static void send_copies(void *s, zmq_msg_t *route, zmq_msg_t *parts, int n)
{
    zmq_msg_t c;
    if (route != NULL) {
        zmq_msg_init(&c);
        zmq_msg_copy(&c, route);
        zmq_msg_send(&c, s, ZMQ_SNDMORE);
    }
    for (int i = 0; i < n; i++) {
        zmq_msg_init(&c);
        zmq_msg_copy(&c, &parts[i]);
        if (zmq_msg_send(&c, s, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            zmq_msg_close(&c);
    }
}

static void close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static enum proxy_act ask(struct proxy *p, proxy_fn fn, zmq_msg_t *hdr)
{
    if (fn == NULL)
        return PROXY_PASS;
    Ps__Header *h = ps__header__unpack(NULL, zmq_msg_size(hdr), zmq_msg_data(hdr));
    enum proxy_act a = fn(p->arg, h);
    if (h != NULL)
        ps__header__free_unpacked(h, NULL);
    return a;
}

static void move_back(struct proxy *p)
{
    zmq_close(p->back);
    p->back = zmq_socket(p->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(p->back, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(p->back, p->retarget);
    atomic_store(&p->retarget_state, 2);
}

static void *proxy_main(void *arg)
{
    struct proxy *p = arg;
    zmq_msg_t route, parts[PARTS_MAX], held[PARTS_MAX];
    int have_route = 0, nheld = 0;
    zmq_msg_init(&route);
    while (!atomic_load(&p->stop)) {
        if (atomic_load(&p->retarget_state) == 1)
            move_back(p);
        zmq_pollitem_t it[2] = {{p->front, 0, ZMQ_POLLIN, 0}, {p->back, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, 20) <= 0)
            continue;
        int n = 0;
        if ((it[0].revents & ZMQ_POLLIN) && recv_parts(p->front, parts, &n) == 0) {
            enum proxy_act a = n >= 2 ? ask(p, p->on_request, &parts[1]) : PROXY_PASS;
            for (int k = a == PROXY_DROP ? 0 : a == PROXY_REPEAT ? 2 : 1; k > 0; k--)
                send_copies(p->back, NULL, parts + 1, n - 1);
            zmq_msg_close(&route);
            zmq_msg_init(&route);
            zmq_msg_move(&route, &parts[0]); /* one client: its route is the last seen */
            have_route = 1;
            close_parts(parts, n);
        }
        if ((it[1].revents & ZMQ_POLLIN) && recv_parts(p->back, parts, &n) == 0) {
            enum proxy_act a = have_route && n >= 1 ? ask(p, p->on_reply, &parts[0]) : PROXY_DROP;
            if (a == PROXY_HOLD && nheld == 0) {
                for (int i = 0; i < n; i++) {
                    zmq_msg_init(&held[i]);
                    zmq_msg_move(&held[i], &parts[i]);
                }
                nheld = n;
                atomic_fetch_add(&p->held, 1);
            } else if (a != PROXY_DROP) {
                send_copies(p->front, &route, parts, n);
                if (a == PROXY_REPEAT)
                    send_copies(p->front, &route, parts, n);
                if (nheld > 0) {
                    send_copies(p->front, &route, held, nheld);
                    close_parts(held, nheld);
                    nheld = 0;
                }
            }
            close_parts(parts, n);
        }
    }
    close_parts(held, nheld);
    zmq_msg_close(&route);
    return NULL;
}

void proxy_start(struct proxy *p, const char *server, proxy_fn on_request, proxy_fn on_reply,
                 void *arg)
{
    memset(p, 0, sizeof *p);
    p->on_request = on_request;
    p->on_reply = on_reply;
    p->arg = arg;
    p->ctx = zmq_ctx_new();
    p->front = zmq_socket(p->ctx, ZMQ_ROUTER);
    p->back = zmq_socket(p->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(p->front, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(p->back, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(p->front, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof p->endpoint;
    assert_int_equal(zmq_getsockopt(p->front, ZMQ_LAST_ENDPOINT, p->endpoint, &len), 0);
    assert_int_equal(zmq_connect(p->back, server), 0);
    assert_int_equal(pthread_create(&p->thread, NULL, proxy_main, p), 0);
}

void proxy_retarget(struct proxy *p, const char *server)
{
    snprintf(p->retarget, sizeof p->retarget, "%s", server);
    atomic_store(&p->retarget_state, 1);
    for (int waited = 0; atomic_load(&p->retarget_state) != 2; waited += 5) {
        if (waited > 10000)
            fail_msg("the proxy did not move to %s within 10 s", server);
        harness_pause_ms(5);
    }
}

void proxy_stop(struct proxy *p)
{
    atomic_store(&p->stop, 1);
    pthread_join(p->thread, NULL);
    zmq_close(p->front);
    zmq_close(p->back);
    zmq_ctx_term(p->ctx);
}
