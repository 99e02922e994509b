/* Reply bytes not read yet (unread.h). */
#include "unread.h"

#include "ps_err.h"

#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* What a counted frame holds until ZeroMQ frees it: the bytes to give
 * back, and the buffer (or lent block) to let go of. A copied frame's
 * bytes follow the record in the same allocation. */
struct hold {
    struct psd_unread *u;
    struct psd_unread_peer *p;
    uint64_t bytes;
    void *buf;
    struct psd_lent *lent;
    unsigned char data[];
};

int psd_unread_init(struct psd_unread *u)
{
    atomic_init(&u->total, 0);
    u->peers = calloc(PS_UNREAD_PEERS_MAX, sizeof *u->peers);
    return u->peers == NULL ? PS_ENOMEM : 0;
}

void psd_unread_fini(struct psd_unread *u)
{
    free(u->peers);
    u->peers = NULL;
}

/* FNV-1a of the routing id. */
static uint32_t route_hash(const uint8_t *r, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ r[i]) * 16777619u;
    return h;
}

struct psd_unread_peer *psd_unread_peer(struct psd_unread *u, const void *route, size_t len)
{
    if (route == NULL || len == 0 || len > PS_ROUTE_ID_MAX)
        return NULL;
    struct psd_unread_peer *idle = NULL;
    uint32_t at = route_hash(route, len) % PS_UNREAD_PEERS_MAX;
    for (uint32_t i = 0; i < PS_UNREAD_PEERS_MAX; i++) {
        struct psd_unread_peer *p = &u->peers[(at + i) % PS_UNREAD_PEERS_MAX];
        if (p->route_len == len && memcmp(p->route, route, len) == 0)
            return p;
        int empty = p->route_len == 0;
        if (idle == NULL && (empty || atomic_load_explicit(&p->bytes, memory_order_acquire) == 0))
            idle = p; /* nothing of its connection is left: free to reuse */
        if (empty)
            break; /* the end of the probe chain: route has no record */
    }
    if (idle != NULL) {
        memcpy(idle->route, route, len);
        idle->route_len = len;
    }
    return idle;
}

static void release(void *data, void *hint)
{
    (void)data;
    struct hold *h = hint;
    if (h->p != NULL)
        atomic_fetch_sub_explicit(&h->p->bytes, h->bytes, memory_order_release);
    atomic_fetch_sub_explicit(&h->u->total, h->bytes, memory_order_relaxed);
    if (h->lent != NULL)
        psd_lent_done(h->lent);
    else
        free(h->buf);
    free(h);
}

/* An owned buffer that goes out copied, or not at all. */
static void let_go(void **buf, struct psd_lent **lent)
{
    if (*lent != NULL)
        psd_lent_done(*lent);
    else
        free(*buf);
    *buf = NULL;
    *lent = NULL;
}

int psd_unread_send(struct psd_unread *u, struct psd_unread_peer *p, void *sock, void **buf,
                    size_t len, struct psd_lent **lent, int own, int flags)
{
    zmq_msg_t m;
    if (len <= PS_UNREAD_INLINE_BYTES) {
        int rc = zmq_send(sock, *buf, len, flags) < 0 ? -1 : 0;
        if (own)
            let_go(buf, lent);
        return rc;
    }
    struct hold *h = malloc(sizeof *h + (own ? 0 : len));
    if (h == NULL) {
        if (own)
            let_go(buf, lent);
        return -1;
    }
    h->u = u;
    h->p = p;
    h->bytes = len;
    h->buf = own ? *buf : NULL;
    h->lent = own ? *lent : NULL;
    void *data = own ? *buf : memcpy(h->data, *buf, len);
    if (zmq_msg_init_data(&m, data, len, release, h) != 0) {
        free(h);
        if (own)
            let_go(buf, lent);
        return -1;
    }
    if (own) {
        *buf = NULL;
        *lent = NULL;
    }
    if (p != NULL)
        atomic_fetch_add_explicit(&p->bytes, len, memory_order_relaxed);
    atomic_fetch_add_explicit(&u->total, len, memory_order_relaxed);
    if (zmq_msg_send(&m, sock, flags) < 0) {
        zmq_msg_close(&m); /* release gives the bytes back */
        return -1;
    }
    return 0;
}
