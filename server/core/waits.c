/* Deferred pulls: a pull for a clock not reached yet waits, bounded per
 * connection and in reach, and is answered when its round closes or its
 * deadline passes. */
#include "psd_impl.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_pool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Answers a pull of [offset, offset+count) of t at `clock` by worker
 * (req's): the staleness it is admitted at, a rejoining worker joining at
 * a round boundary, then the values. The one place a pull is answered,
 * at once or after waiting. */
void psd_answer_pull(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t clock,
                     uint64_t offset, uint64_t count, int duplicate, int stale, unsigned char *dst,
                     struct psd_reply *rep)
{
    uint64_t low = psd_cons_clock(&s->cons, t);
    if (s->cons.mode == PSD_SSP && clock > low && clock - low > s->max_staleness)
        s->max_staleness = clock - low;
    psd_cons_pulled(&s->cons, t, req->worker_id, clock);
    psd_reply_values(s, req, t, offset, count, duplicate, stale, dst, rep);
}

/* Header of a waiting request, enough for reply_init and error replies. */
void psd_wait_header(const struct psd_wait *w, Ps__Header *h)
{
    ps_wire_header_init(h, w->op);
    h->request_id = w->request_id;
    h->worker_id = w->worker_id;
    h->table_id = w->table_id;
    h->clock = w->clock;
    h->offset = w->offset;
    h->count = w->count;
    h->shm = w->shm;
    h->shm_out = w->shm_out;
    h->dtype = w->dtype;
    h->nonzero_only = w->nonzero_only;
}

/* Where a request's values (or keys) lie in, or go into, its connection's
 * shared region: *p, or NULL when shm (the request's bits) lacks `bit`. An
 * error reply and its code when the connection has no region or the bytes
 * are past its end. */
int psd_shm_part(struct psd *s, const struct ps_frame *route, const Ps__Header *req, uint32_t shm,
                 uint32_t bit, uint64_t off, unsigned char **p, struct psd_reply *rep)
{
    *p = NULL;
    if (!(shm & bit))
        return 0;
    size_t size = 0;
    uint64_t bytes = req->count * (bit == PS_SHM_KEYS ? sizeof(uint64_t) : sizeof(float));
    int rc =
        psd_shm_at(&s->shm, route->data, route->size, off, bytes, (uint64_t)ps_mono_ms(), p, &size);
    if (rc == PS_ESHM)
        psd_reply_errorf(
            s, req, rc, rep,
            "%s: this connection has no shared memory region (none was bound, or it was "
            "dropped): send the values in frames",
            ps_op_name(req->op));
    else if (rc != 0)
        psd_reply_errorf(
            s, req, rc, rep,
            "%s: shared-memory %s [%llu, +%llu) is past the end of the region (%zu bytes)",
            ps_op_name(req->op),
            bit == PS_SHM_IN     ? "values"
            : bit == PS_SHM_KEYS ? "keys"
                                 : "reply",
            (unsigned long long)off, (unsigned long long)bytes, size);
    return rc;
}

/* Sends a reply through the sender at once, counting its bytes. */
void psd_send_now(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep)
{
    s->ctr.bytes_out += rep->hdr_len + rep->mask_bytes + rep->vals_bytes;
    s->send(s->send_ctx, route, route_len, rep);
}

/* Answers every waiting request that is ready now. */
void psd_release_waits(struct psd *s)
{
    for (uint32_t i = 0; i < s->nwaits;) {
        struct psd_wait *w = &s->waits[i];
        struct psd_table *t = s->tables[w->table_id];
        if (!psd_cons_ready(&s->cons, t, w->clock, w->offset, w->count)) {
            i++;
            continue;
        }
        Ps__Header h;
        psd_wait_header(w, &h);
        struct psd_reply rep;
        memset(&rep, 0, sizeof rep);
        struct ps_frame route = {w->route, w->route_len};
        unsigned char *dst = NULL;
        if (psd_shm_part(s, &route, &h, w->shm, PS_SHM_OUT, w->shm_out, &dst, &rep) == 0)
            psd_answer_pull(s, &h, t, w->clock, w->offset, w->count, 0, 0, dst, &rep);
        psd_fit_unread(s, w->route, w->route_len, &h, &rep);
        psd_send_now(s, w->route, w->route_len, &rep);
        s->waits[i] = s->waits[--s->nwaits]; /* order of answers does not matter */
    }
}

/* Why a pull not ready yet may not wait (NULL: it may): the worker is not
 * one of the round's, the clock is out of the mode's reach, or the
 * worker or the connection has its share of the queue waiting. */
static const char *wait_refusal(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                                uint64_t clock, char *why, size_t len)
{
    const struct psd_table *t = s->tables[req->table_id];
    uint32_t mine = 0, theirs = 0;
    if (req->worker_id >= s->cons.workers) {
        snprintf(why, len, "worker id %u is not one of the %u this shard waits for (psd --workers)",
                 req->worker_id, s->cons.workers);
        return why;
    }
    if (!psd_cons_reachable(&s->cons, t, clock)) {
        snprintf(why, len, "no worker can reach it from the table's clock %llu in %s",
                 (unsigned long long)psd_cons_clock(&s->cons, t),
                 s->cons.mode == PSD_BSP ? "bsp" : "ssp");
        return why;
    }
    for (uint32_t i = 0; i < s->nwaits; i++) {
        const struct psd_wait *o = &s->waits[i];
        mine += o->worker_id == req->worker_id;
        theirs += o->route_len == route->size && memcmp(o->route, route->data, route->size) == 0;
    }
    if (mine >= PS_WAITS_PER_WORKER_MAX || theirs >= PS_WAITS_PER_WORKER_MAX) {
        snprintf(why, len, "%s already has %u requests waiting (the limit for each)",
                 mine >= PS_WAITS_PER_WORKER_MAX ? "this worker id" : "this connection",
                 mine >= PS_WAITS_PER_WORKER_MAX ? mine : theirs);
        return why;
    }
    if (s->nwaits >= PS_WAITS_MAX) {
        snprintf(why, len, "the wait queue is full (%u requests)", PS_WAITS_MAX);
        return why;
    }
    return NULL;
}

/* A retry of a request already waiting: answered once, on the route the
 * retry came by (a reconnected peer has a new one). 1 when req is one. */
static int refresh_wait(struct psd *s, const struct ps_frame *route, const Ps__Header *req)
{
    for (uint32_t i = 0; i < s->nwaits; i++) {
        struct psd_wait *o = &s->waits[i];
        if (o->worker_id == req->worker_id && o->request_id == req->request_id &&
            o->table_id == req->table_id && o->offset == req->offset && o->count == req->count &&
            o->op == req->op) {
            memcpy(o->route, route->data, route->size);
            o->route_len = route->size;
            o->shm = req->shm & PS_SHM_OUT;
            o->shm_out = req->shm_out;
            s->waits_refreshed++;
            return 1;
        }
    }
    return 0;
}

enum psd_answer psd_defer(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                          uint64_t clock, struct psd_reply *rep)
{
    if (s->send == NULL || route->size > PS_ROUTE_ID_MAX) {
        psd_reply_errorf(s, req, PS_EAGAIN, rep,
                         "%s: clock %llu is not ready and this server cannot wait",
                         ps_op_name(req->op), (unsigned long long)clock);
        return PSD_ANSWER_NOW;
    }
    if (refresh_wait(s, route, req))
        return PSD_ANSWER_LATER;
    char why[160];
    if (wait_refusal(s, route, req, clock, why, sizeof why) != NULL) {
        s->waits_refused++;
        psd_reply_errorf(s, req, PS_ELIMIT, rep, "%s: clock %llu is not ready and may not wait: %s",
                         ps_op_name(req->op), (unsigned long long)clock, why);
        return PSD_ANSWER_NOW;
    }
    struct psd_wait *w = &s->waits[s->nwaits++];
    memcpy(w->route, route->data, route->size);
    w->route_len = route->size;
    w->op = req->op;
    w->request_id = req->request_id;
    w->worker_id = req->worker_id;
    w->table_id = req->table_id;
    w->clock = clock;
    w->offset = req->offset;
    w->count = req->count;
    w->dtype = req->dtype;
    w->nonzero_only = req->nonzero_only;
    w->shm = req->shm & PS_SHM_OUT;
    w->shm_out = req->shm_out;
    w->since_ms = (uint64_t)ps_mono_ms();
    w->deadline_ms = w->since_ms + s->wait_timeout_ms;
    w->logged = 0;
    s->deferred_total++;
    return PSD_ANSWER_LATER;
}
