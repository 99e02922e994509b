/* Replication records on the wire (repl.h): the header of an
 * OP_REPLICATE record a primary sends (a request it handled, a worker it
 * dropped, a piece of a state transfer, a beat) and of the follows and
 * acknowledgements a backup sends back. Encoding and the checks a
 * backup makes before it uses one; no state, no sockets but the one
 * given to psd_record_send. */
#ifndef PSD_RECORD_H
#define PSD_RECORD_H

#include "ps_limits.h"
#include "ps_wire.h"

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/* The most a state transfer may declare (its pieces' count): a shard's
 * checkpoint file, far above any table limit a shard takes. */
#define PSD_TRANSFER_BYTES_MAX (UINT64_C(1) << 40)

/* A record header of kind in epoch, numbered seq. */
void psd_record_header(Ps__Header *h, Ps__Record kind, uint64_t epoch, uint64_t seq);

/* Packs h and sends it on sock without blocking (more: frames follow).
 * 0, or -1 (errno says why, or the header does not pack). */
int psd_record_send(void *sock, const Ps__Header *h, int more);

/* A record to the peer at route on a ROUTER sock, without waiting: the
 * route, the header packed (hdr_len bytes), then n frames (copies that
 * share their buffers). 0 sent; 1 the peer's queue is full (ZeroMQ
 * refuses it at the route frame, so nothing went: try later); -1 it
 * cannot go (errno). */
int psd_record_send_to(void *sock, const void *route, size_t route_len, const void *hdr,
                       size_t hdr_len, zmq_msg_t *frames, size_t n);

/* n frames copied into dst as ZeroMQ copies them (sharing their
 * buffers: a reference each). 0, or -1 with none of them held. */
int psd_record_share(zmq_msg_t *dst, zmq_msg_t *src, size_t n);

/* A record's header frame unpacked into arena, which is reset first
 * (the fast path, else protobuf-c); NULL when it is longer than
 * PS_HEADER_BYTES_MAX or not a ps.Header. */
Ps__Header *psd_record_unpack(struct ps_arena *arena, const void *data, size_t size);

/* Whether a piece of piece_bytes of a state transfer (h: its REC_SNAPSHOT
 * header) comes next, when have_bytes arrived so far: at that offset,
 * within the size it declares, which is at most PSD_TRANSFER_BYTES_MAX.
 * 1 when it may be written. */
int psd_record_piece_fits(const Ps__Header *h, uint64_t piece_bytes, uint64_t have_bytes);

#endif
