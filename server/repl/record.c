/* Replication records on the wire (record.h). */
#include "record.h"

#include "ps_header.h"

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
