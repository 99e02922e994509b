/* Reply bytes psd has handed to ZeroMQ that their peer has not read yet,
 * per connection (routing id) and in all.
 *
 * ZeroMQ bounds a connection's queue in messages (its send high-water
 * mark), not bytes: a client that asks for large pulls and never reads
 * would make psd hold a thousand of them. Every reply frame larger than
 * PS_UNREAD_INLINE_BYTES goes out through psd_unread_send, which counts
 * its bytes against the connection and the total until ZeroMQ frees the
 * frame (written to the socket, or dropped with a connection that went).
 * psd refuses a reply that would pass a bound (psd.c's fit_unread).
 * Counted up on the loop thread, down on ZeroMQ's I/O threads: the counts
 * are atomics, and a connection's record is reused only once it holds
 * nothing. This is not the transport (net.c) and knows nothing of ops. */
#ifndef PSD_UNREAD_H
#define PSD_UNREAD_H

#include "table.h"

#include "ps_limits.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct psd_unread_peer {
    _Atomic uint64_t bytes;
    size_t route_len; /* 0: never used */
    uint8_t route[PS_ROUTE_ID_MAX];
};

struct psd_unread {
    struct psd_unread_peer *peers; /* PS_UNREAD_PEERS_MAX, open addressing */
    _Atomic uint64_t total;
};

/* 0, or PS_ENOMEM. */
int psd_unread_init(struct psd_unread *u);
/* After ZeroMQ's context is gone (no frame is left to free). */
void psd_unread_fini(struct psd_unread *u);

/* The record of route, made when it has none; NULL when route is too long
 * or every record holds bytes of another connection. Loop thread. */
struct psd_unread_peer *psd_unread_peer(struct psd_unread *u, const void *route, size_t len);

/* Queues len bytes at *buf as the next frame of a message on sock (flags:
 * ZMQ_SNDMORE and ZMQ_DONTWAIT as zmq_msg_send takes them), counted
 * against p (NULL: the total only) until ZeroMQ frees it. own: *buf is
 * psd's (malloc'd, or in *lent's table block when lent is set) and is
 * handed over without a copy; otherwise it is copied. Frames of at most
 * PS_UNREAD_INLINE_BYTES are copied into the message itself and not
 * counted. After the call (whatever it returns) an owned *buf is
 * ZeroMQ's: *buf and *lent are set to NULL. 0, or -1 with errno. Loop
 * thread. */
int psd_unread_send(struct psd_unread *u, struct psd_unread_peer *p, void *sock, void **buf,
                    size_t len, struct psd_lent **lent, int own, int flags);

#endif
