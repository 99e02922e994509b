/* Raw DEALER helpers (see raw.h). */
#include "raw.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

void *raw_dealer(void *ctx, const char *endpoint)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(s, endpoint), 0);
    return s;
}

Ps__Header *raw_recv(void *s, int timeout_ms, size_t *nframes, void *out, size_t out_bytes)
{
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return NULL;
    Ps__Header *h = NULL;
    int more = 1;
    *nframes = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        assert_true(zmq_msg_recv(&m, s, 0) >= 0);
        if (*nframes == 0)
            h = ps__header__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        else if (out != NULL && zmq_msg_size(&m) == out_bytes)
            memcpy(out, zmq_msg_data(&m), out_bytes);
        more = zmq_msg_more(&m);
        (*nframes)++;
        zmq_msg_close(&m);
    }
    assert_non_null(h);
    return h;
}

Ps__Header *raw_exchange(void *s, const Ps__Header *h, const void *vals, size_t vbytes, void *out,
                         size_t out_bytes)
{
    uint8_t buf[1024];
    size_t n = ps__header__pack(h, buf);
    assert_true(zmq_send(s, buf, n, vals ? ZMQ_SNDMORE : 0) >= 0);
    if (vals)
        assert_true(zmq_send(s, vals, vbytes, 0) >= 0);
    size_t nf = 0;
    Ps__Header *r = raw_recv(s, RAW_TIMEOUT_MS, &nf, out, out_bytes);
    if (r == NULL)
        fail_msg("%s: no reply", ps_op_name(h->op));
    if (r->status != 0)
        fail_msg("%s: %s", ps_op_name(h->op), r->error);
    return r;
}
