/* Replication records on the wire (record.h). */
#include "record.h"

#include "ps_header.h"

#include <errno.h>
#include <zmq.h>

void psd_record_header(Ps__Header *h, Ps__Record kind, uint64_t epoch, uint64_t seq)
{
    ps_wire_header_init(h, PS__OP__OP_REPLICATE);
    h->record = kind;
    h->epoch = epoch;
    h->seq = seq;
}

int psd_record_send(void *sock, const Ps__Header *h, int more)
{
    uint8_t buf[PS_HEADER_BYTES_MAX];
    int64_t n = ps_wire_header_pack(h, buf, sizeof buf);
    if (n < 0)
        return -1;
    return zmq_send(sock, buf, (size_t)n, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

int psd_record_send_to(void *sock, const void *route, size_t route_len, const void *hdr,
                       size_t hdr_len, zmq_msg_t *frames, size_t n)
{
    if (zmq_send(sock, route, route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return errno == EAGAIN ? 1 : -1;
    if (zmq_send(sock, hdr, hdr_len, (n > 0 ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_copy(&m, &frames[i]) != 0 ||
            zmq_msg_send(&m, sock, (i + 1 < n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return -1;
        }
    }
    return 0;
}

int psd_record_share(zmq_msg_t *dst, zmq_msg_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zmq_msg_init(&dst[i]);
        if (zmq_msg_copy(&dst[i], &src[i]) != 0) {
            for (size_t j = 0; j <= i; j++)
                zmq_msg_close(&dst[j]);
            return -1;
        }
    }
    return 0;
}

Ps__Header *psd_record_unpack(struct ps_arena *arena, const void *data, size_t size)
{
    if (size > PS_HEADER_BYTES_MAX)
        return NULL;
    ps_arena_reset(arena);
    Ps__Header *h = ps_header_unpack_fast(&arena->pa, size, data);
    return h != NULL ? h : ps__header__unpack(&arena->pa, size, data);
}

int psd_record_piece_fits(const Ps__Header *h, uint64_t piece_bytes, uint64_t have_bytes)
{
    return h->offset == have_bytes && h->count <= PSD_TRANSFER_BYTES_MAX &&
           piece_bytes <= h->count - h->offset && h->offset <= h->count;
}
