/* Shards with replicas ("tcp://a:5570|tcp://b:5570" in the server list):
 * which replica the client talks to, and moving to another when the one
 * in use goes away or says it is not the primary.
 *
 * The socket of a shard is connected to one replica at a time. Its
 * connection dropping (ZeroMQ's socket monitor) or a PS_ENOTPRIMARY reply
 * makes the shard unconfirmed: a probe (a hello in this session, which a
 * primary answers and a backup refuses naming the primary it knows) goes
 * to the replica named, or the next one, every PROBE_MS until a primary
 * answers; then every request outstanding on the shard is sent again
 * with its own id, and the new primary's exactly-once window answers a
 * copy of what it already applied without applying it twice. */
#include "client_impl.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    PROBE_MS = 50,       /* between probes while no primary answers */
    PROBE_WAIT_MS = 250, /* a replica that answers no probe this long: try the next */
    AVOID_MS = 2000,     /* a replica whose connection dropped is not chosen for this long */
    SILENT_MS = 1000,    /* no reply this long while one is awaited: is it still primary? */
};

/* Whether a request to shard s has waited SILENT_MS while the shard sent
 * nothing at all (a stopped or unreachable replica keeps its connection). */
static int silent(struct psc_client *c, uint32_t s, int64_t now)
{
    const struct replicas *r = &c->reps[s];
    if (now - r->heard_ms < SILENT_MS || now - r->since_ms < SILENT_MS)
        return 0;
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++) {
        const struct slot *sl = &c->slots[i];
        if (sl->seq != 0 && !sl->canceled && sl->pending != 0 &&
            ((sl->expected[s / 64] >> (s % 64)) & 1u) && !psc__shard_replied(sl, s) &&
            now - sl->sent_ms >= SILENT_MS)
            return 1;
    }
    return 0;
}

int psc__replicas_init(struct psc_client *c, const struct psc_config *cfg, char *err, size_t errlen)
{
    int any = 0;
    for (uint32_t s = 0; s < c->nshards; s++)
        any |= strchr(cfg->servers[s], '|') != NULL;
    if (!any)
        return 0;
    c->reps = calloc(c->nshards, sizeof *c->reps);
    if (c->reps == NULL) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    for (uint32_t s = 0; s < c->nshards; s++) {
        struct replicas *r = &c->reps[s];
        r->confirmed = 1;
        const char *p = cfg->servers[s];
        while (r->n < PS_REPLICAS_MAX) {
            const char *bar = strchr(p, '|');
            size_t len = bar ? (size_t)(bar - p) : strlen(p);
            if ((r->eps[r->n] = strndup(p, len)) == NULL) {
                snprintf(err, errlen, "out of memory");
                return PS_ENOMEM;
            }
            r->n++;
            if (bar == NULL)
                break;
            p = bar + 1;
        }
    }
    return 0;
}

void psc__replicas_fini(struct psc_client *c)
{
    for (uint32_t s = 0; c->reps != NULL && s < c->nshards; s++) {
        for (uint32_t i = 0; i < c->reps[s].n; i++)
            free(c->reps[s].eps[i]);
        if (c->reps[s].mon != NULL) {
            /* the monitor stops before its reading end closes: ZeroMQ's
             * I/O thread sends it events blocking */
            if (c->socks != NULL && c->socks[s] != NULL)
                zmq_socket_monitor(c->socks[s], NULL, 0);
            zmq_close(c->reps[s].mon);
        }
    }
    free(c->reps);
    c->reps = NULL;
}

/* Watches each replicated shard's socket for its connection dropping. */
void psc__replicas_watch(struct psc_client *c)
{
    for (uint32_t s = 0; c->reps != NULL && s < c->nshards; s++) {
        struct replicas *r = &c->reps[s];
        if (r->n < 2 || r->mon != NULL)
            continue;
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://psc-replicas-%p-%u", (void *)c, s);
        int linger = 0;
        if (zmq_socket_monitor(c->socks[s], ep, ZMQ_EVENT_DISCONNECTED) != 0 ||
            (r->mon = zmq_socket(c->ctx, ZMQ_PAIR)) == NULL ||
            zmq_setsockopt(r->mon, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
            zmq_connect(r->mon, ep) != 0) {
            if (r->mon != NULL)
                zmq_close(r->mon);
            r->mon = NULL; /* best effort: replies that do not come are re-sent anyway */
        }
    }
}

/* The socket of shard s moves to replica i. */
static void move(struct psc_client *c, uint32_t s, uint32_t i)
{
    struct replicas *r = &c->reps[s];
    if (i == r->cur)
        return;
    zmq_disconnect(c->socks[s], r->eps[r->cur]);
    if (zmq_connect(c->socks[s], r->eps[i]) != 0) {
        zmq_connect(c->socks[s], r->eps[r->cur]);
        return;
    }
    r->cur = i;
    r->since_ms = ps_mono_ms();
    free(c->endpoints[s]);
    c->endpoints[s] = strdup(r->eps[i]);
    if (c->endpoints[s] == NULL) /* what error texts name; the socket does not need it */
        c->endpoints[s] = strdup("");
    c->failovers++;
}

static void probe(struct psc_client *c, uint32_t s)
{
    struct replicas *r = &c->reps[s];
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.request_id = r->probe_id = ++c->next_seq; /* an id no slot will have */
    h.worker_id = c->worker_id;
    h.session = c->session;
    r->probe_ms = ps_mono_ms();
    if (psc__send_frames(c, s, &h, NULL, 0, NULL, 0, NULL, 1) != 0)
        r->probe_id = 0;
}

/* Shard s's replica in use is not (or no longer) the primary: hint names
 * the one it knows ("" none). */
static void unconfirm(struct psc_client *c, uint32_t s, const char *hint)
{
    struct replicas *r = &c->reps[s];
    int64_t now = ps_mono_ms();
    uint32_t to = r->cur;
    int found = 0;
    for (uint32_t i = 0; hint != NULL && hint[0] && i < r->n; i++)
        if (strcmp(r->eps[i], hint) == 0 && !(i == r->dead && now - r->dead_ms < AVOID_MS)) {
            to = i;
            found = 1;
        }
    if (!found && hint == NULL) /* no answer: the next one */
        for (uint32_t k = 1; k <= r->n; k++) {
            uint32_t i = (r->cur + k) % r->n;
            if (!(i == r->dead && now - r->dead_ms < AVOID_MS) || k == r->n) {
                to = i;
                break;
            }
        }
    r->confirmed = 0;
    r->tried_ms = now;
    move(c, s, to);
}

int psc__not_primary(struct psc_client *c, uint32_t s, const Ps__Header *h)
{
    if (c->reps == NULL || c->reps[s].n < 2)
        return 0;
    struct replicas *r = &c->reps[s];
    if (h->request_id == r->probe_id)
        r->probe_id = 0;
    if (r->confirmed || h->request_id != 0)
        unconfirm(c, s, h->detail);
    return 1;
}

static int by_seq(const void *a, const void *b)
{
    const struct slot *x = *(const struct slot *const *)a, *y = *(const struct slot *const *)b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Every request outstanding on shard s, sent again to its replica now, in
 * the order they were first sent (a bsp shard takes a range's pieces in
 * order). */
static void resend_shard(struct psc_client *c, uint32_t s)
{
    struct slot *out[PS_CLIENT_TICKETS_MAX];
    uint32_t n = 0;
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++) {
        struct slot *sl = &c->slots[i];
        if (sl->seq != 0 && !sl->canceled && sl->pending != 0 &&
            ((sl->expected[s / 64] >> (s % 64)) & 1u) && !psc__shard_replied(sl, s))
            out[n++] = sl;
    }
    qsort(out, n, sizeof *out, by_seq);
    for (uint32_t i = 0; i < n; i++) {
        struct slot *sl = out[i];
        if (sl->kind == SUB_SYNC && sl->sync_len > 0) {
            if (zmq_send(c->socks[s], sl->sync_hdr, sl->sync_len, ZMQ_DONTWAIT) >= 0)
                c->resends++;
        } else if (psc__send_sub(c, sl, s, 1) == PSC_SUB_SENT) {
            c->resends++;
        }
        sl->sent_ms = ps_mono_ms();
    }
}

int psc__probe_answered(struct psc_client *c, uint32_t s, const Ps__Header *h)
{
    if (c->reps == NULL || c->reps[s].probe_id == 0 || h->request_id != c->reps[s].probe_id)
        return 0;
    struct replicas *r = &c->reps[s];
    r->probe_id = 0;
    if (h->status == 0) {
        r->confirmed = 1;
        resend_shard(c, s);
    } else if (h->status == PS_ENOTPRIMARY) {
        unconfirm(c, s, h->detail);
    }
    return 1;
}

/* The monitors' news, and probes due. Called from every wait. */
void psc__failover_poll(struct psc_client *c)
{
    if (c->reps == NULL)
        return;
    int64_t now = ps_mono_ms();
    for (uint32_t s = 0; s < c->nshards; s++) {
        struct replicas *r = &c->reps[s];
        for (int k = 0; r->mon != NULL && k < 16; k++) {
            zmq_msg_t ev, addr;
            zmq_msg_init(&ev);
            zmq_msg_init(&addr);
            int got = zmq_msg_recv(&ev, r->mon, ZMQ_DONTWAIT) >= 0 &&
                      zmq_msg_recv(&addr, r->mon, ZMQ_DONTWAIT) >= 0;
            if (got && zmq_msg_size(&ev) >= 2) {
                uint16_t e;
                memcpy(&e, zmq_msg_data(&ev), sizeof e);
                size_t n = zmq_msg_size(&addr);
                const char *cur = r->eps[r->cur];
                if (e == ZMQ_EVENT_DISCONNECTED && n == strlen(cur) &&
                    memcmp(zmq_msg_data(&addr), cur, n) == 0)
                    r->dropped = 1; /* psc__failover_dropped, once its replies are read */
            }
            zmq_msg_close(&ev);
            zmq_msg_close(&addr);
            if (!got)
                break;
        }
        if (r->dropped)
            continue;
        if (r->confirmed && silent(c, s, now)) {
            r->since_ms = r->tried_ms = now; /* one probe per SILENT_MS while it lasts */
            r->confirmed = 0;
            probe(c, s); /* a primary answers at once, even when its rounds wait */
        }
        if (r->confirmed)
            continue;
        if (r->probe_id != 0 && now - r->tried_ms >= PROBE_WAIT_MS)
            unconfirm(c, s, NULL); /* no answer from this one */
        if (r->probe_id == 0 || now - r->probe_ms >= PROBE_MS)
            probe(c, s);
    }
}

void psc__failover_dropped(struct psc_client *c, uint32_t s)
{
    struct replicas *r = &c->reps[s];
    r->dropped = 0;
    r->dead = r->cur;
    r->dead_ms = ps_mono_ms();
    unconfirm(c, s, NULL);
    probe(c, s);
}

int psc__failover_wait_ms(const struct psc_client *c, int wait)
{
    if (c->reps == NULL)
        return wait;
    return wait < 0 || wait > PROBE_MS ? PROBE_MS : wait;
}

uint64_t psc_failovers(const struct psc_client *c)
{
    return c->failovers;
}
