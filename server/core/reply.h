/* Replies: headers, error replies (the one place they are written,
 * counted and logged), values (lent, masked, converted or put into a
 * client's region), the unread-bytes check before values go out, and
 * the sender deferred replies go through. Owned by reply.c: the reply
 * part is opaque outside it. */
#ifndef PSD_REPLY_H
#define PSD_REPLY_H

#include "psd.h"

#include <stddef.h>
#include <stdint.h>

/* 0 limits take the defaults (PS_UNREAD_BYTES_*). NULL: out of memory. */
struct psd_replies *psd_replies_create(uint64_t unread_bytes_max, uint64_t unread_bytes_total_max);
void psd_replies_destroy(struct psd_replies *r);

/* A reply header answering req (its ids, table and clock; req NULL: an
 * undecoded request). */
void psd_reply_init(Ps__Header *out, const Ps__Header *req);
/* Packs h into the part's header buffer as rep's header (valid until
 * the next one is packed). */
void psd_reply_header(struct psd *s, const Ps__Header *h, struct psd_reply *rep);
void psd_reply_error(struct psd *s, const Ps__Header *req, int code, const char *text,
                     struct psd_reply *rep);
void psd_reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A reply with values to route must fit the bytes it may leave unread
 * (psd_set_unread): one that does not becomes an error reply. */
void psd_fit_unread(struct psd *s, const void *route, size_t route_len, const Ps__Header *req,
                    struct psd_reply *rep);
/* The values [offset, offset+count) of dense table t as req asks for
 * them; dst, when not NULL, is where they go instead (a client's
 * region). */
void psd_reply_values(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t offset,
                      uint64_t count, int duplicate, int stale, unsigned char *dst,
                      struct psd_reply *rep);
/* Where a request's values (or keys) lie in, or go into, its
 * connection's shared region: *p, or NULL when shm (the request's bits)
 * lacks bit. An error reply and its code when the connection has no
 * region or the bytes are past its end. */
int psd_region_part(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                    uint32_t shm, uint32_t bit, uint64_t off, unsigned char **p,
                    struct psd_reply *rep);
/* The same for bytes the caller works out (a sparse request's rows:
 * count x dim floats; the decoder has checked the offsets are whole
 * elements). */
int psd_region_bytes(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                     uint32_t shm, uint32_t bit, uint64_t off, uint64_t bytes, unsigned char **p,
                     struct psd_reply *rep);

/* 1 when a sender is set (psd_set_sender): requests may wait. */
int psd_can_send(const struct psd *s);
/* Sends rep through the sender at once, counting its bytes. */
void psd_reply_send(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep);
/* The same for a reply whose bytes the dispatch counted already (a
 * request of a batch). */
void psd_reply_deliver(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep);
/* Replies refused for unread bytes so far. */
uint64_t psd_unread_refused(const struct psd *s);

#endif
