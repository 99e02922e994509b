/* Deferred pulls (waits.h). */
#include "waits.h"

#include "catalog.h"
#include "reply.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A waiting pull's log line, once it has waited this long. */
#define PSD_WAIT_WARN_MS 5000u

/* A request waiting for a clock: what is needed to answer it later. */
struct wait {
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
    Ps__Op op;
    uint64_t request_id;
    uint32_t worker_id, table_id;
    uint64_t clock; /* the clock it waits for */
    uint64_t offset, count;
    Ps__DType dtype; /* of the reply's values */
    int nonzero_only;
    int changed; /* Header.changed, since and generation: what the client holds */
    uint64_t since, generation;
    uint32_t shm; /* PS_SHM_OUT: the values go into the route's region at shm_out */
    uint64_t shm_out;
    uint64_t since_ms, deadline_ms;
    int logged;
};

struct psd_waits {
    struct wait *w; /* PS_WAITS_MAX entries */
    uint32_t n;
    uint64_t timeout_ms;
    struct psd_waits_stats st; /* its waiting field is n */
};

struct psd_waits *psd_waits_create(uint64_t wait_timeout_ms)
{
    struct psd_waits *q = calloc(1, sizeof *q);
    if (q == NULL || (q->w = calloc(PS_WAITS_MAX, sizeof *q->w)) == NULL) {
        free(q);
        return NULL;
    }
    q->timeout_ms = wait_timeout_ms ? wait_timeout_ms : PS_WAIT_TIMEOUT_MS_DEFAULT;
    return q;
}

void psd_waits_destroy(struct psd_waits *q)
{
    if (q != NULL)
        free(q->w);
    free(q);
}

void psd_set_wait_timeout(struct psd *s, uint64_t ms)
{
    s->waits->timeout_ms = ms ? ms : PS_WAIT_TIMEOUT_MS_DEFAULT;
}

struct psd_waits_stats psd_waits_stats(const struct psd *s)
{
    struct psd_waits_stats st = s->waits->st;
    st.waiting = s->waits->n;
    return st;
}

void psd_waits_drop_worker(struct psd *s, uint32_t w)
{
    struct psd_waits *q = s->waits;
    for (uint32_t i = 0; i < q->n;) {
        if (q->w[i].worker_id == w)
            q->w[i] = q->w[--q->n];
        else
            i++;
    }
}

void psd_waits_clear(struct psd *s)
{
    s->waits->n = 0;
}

/* Answers a pull of [offset, offset+count) of t at `clock` by worker
 * (req's): the staleness it is admitted at, a rejoining worker joining at
 * a round boundary, then the values. The one place a pull is answered,
 * at once or after waiting. */
void psd_answer_pull(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t clock,
                     uint64_t offset, uint64_t count, int duplicate, int stale, unsigned char *dst,
                     struct psd_reply *rep)
{
    uint64_t low = psd_cons_clock(&s->conf.cons, t);
    struct psd_waits_stats *st = &s->waits->st;
    if (s->conf.cons.mode == PSD_SSP && clock > low && clock - low > st->max_staleness)
        st->max_staleness = clock - low;
    psd_cons_pulled(&s->conf.cons, t, req->worker_id, clock);
    psd_reply_values(s, req, t, offset, count, duplicate, stale, dst, rep);
}

/* Header of a waiting request, enough for reply_init and error replies. */
static void wait_header(const struct wait *w, Ps__Header *h)
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
    h->changed = w->changed != 0;
    h->since = w->since;
    h->generation = w->generation;
}

/* Answers every waiting request that is ready now. */
void psd_release_waits(struct psd *s)
{
    struct psd_waits *q = s->waits;
    for (uint32_t i = 0; i < q->n;) {
        struct wait *w = &q->w[i];
        struct psd_table *t = psd_table_at(s, w->table_id);
        if (!psd_cons_ready(&s->conf.cons, t, w->clock, w->offset, w->count)) {
            i++;
            continue;
        }
        Ps__Header h;
        wait_header(w, &h);
        struct psd_reply rep;
        memset(&rep, 0, sizeof rep);
        struct ps_frame route = {w->route, w->route_len};
        unsigned char *dst = NULL;
        if (psd_region_part(s, &route, &h, w->shm, PS_SHM_OUT, w->shm_out, &dst, &rep) == 0)
            psd_answer_pull(s, &h, t, w->clock, w->offset, w->count, 0, 0, dst, &rep);
        psd_fit_unread(s, w->route, w->route_len, &h, &rep);
        psd_reply_send(s, w->route, w->route_len, &rep);
        q->w[i] = q->w[--q->n]; /* order of answers does not matter */
    }
}

/* Why a pull not ready yet may not wait (NULL: it may): the worker is not
 * one of the round's, the clock is out of the mode's reach, or the
 * worker or the connection has its share of the queue waiting. */
static const char *wait_refusal(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                                uint64_t clock, char *why, size_t len)
{
    const struct psd_cons *c = &s->conf.cons;
    const struct psd_table *t = psd_table_at(s, req->table_id);
    const struct psd_waits *q = s->waits;
    uint32_t mine = 0, theirs = 0;
    if (req->worker_id >= c->workers) {
        snprintf(why, len, "worker id %u is not one of the %u this shard waits for (psd --workers)",
                 req->worker_id, c->workers);
        return why;
    }
    if (!psd_cons_reachable(c, t, clock)) {
        snprintf(why, len, "no worker can reach it from the table's clock %llu in %s",
                 (unsigned long long)psd_cons_clock(c, t), c->mode == PSD_BSP ? "bsp" : "ssp");
        return why;
    }
    for (uint32_t i = 0; i < q->n; i++) {
        const struct wait *o = &q->w[i];
        mine += o->worker_id == req->worker_id;
        theirs += o->route_len == route->size && memcmp(o->route, route->data, route->size) == 0;
    }
    if (mine >= PS_WAITS_PER_WORKER_MAX || theirs >= PS_WAITS_PER_WORKER_MAX) {
        snprintf(why, len, "%s already has %u requests waiting (the limit for each)",
                 mine >= PS_WAITS_PER_WORKER_MAX ? "this worker id" : "this connection",
                 mine >= PS_WAITS_PER_WORKER_MAX ? mine : theirs);
        return why;
    }
    if (q->n >= PS_WAITS_MAX) {
        snprintf(why, len, "the wait queue is full (%u requests)", PS_WAITS_MAX);
        return why;
    }
    return NULL;
}

/* A retry of a request already waiting: answered once, on the route the
 * retry came by (a reconnected peer has a new one). 1 when req is one. */
static int refresh_wait(struct psd *s, const struct ps_frame *route, const Ps__Header *req)
{
    struct psd_waits *q = s->waits;
    for (uint32_t i = 0; i < q->n; i++) {
        struct wait *o = &q->w[i];
        if (o->worker_id == req->worker_id && o->request_id == req->request_id &&
            o->table_id == req->table_id && o->offset == req->offset && o->count == req->count &&
            o->op == req->op) {
            memcpy(o->route, route->data, route->size);
            o->route_len = route->size;
            o->shm = req->shm & PS_SHM_OUT;
            o->shm_out = req->shm_out;
            q->st.refreshed++;
            return 1;
        }
    }
    return 0;
}

enum psd_answer psd_defer(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                          uint64_t clock, struct psd_reply *rep)
{
    if (!psd_can_send(s) || route->size > PS_ROUTE_ID_MAX) {
        psd_reply_errorf(s, req, PS_EAGAIN, rep,
                         "%s: clock %llu is not ready and this server cannot wait",
                         ps_op_name(req->op), (unsigned long long)clock);
        return PSD_ANSWER_NOW;
    }
    if (refresh_wait(s, route, req))
        return PSD_ANSWER_LATER;
    char why[160];
    if (wait_refusal(s, route, req, clock, why, sizeof why) != NULL) {
        s->waits->st.refused++;
        psd_reply_errorf(s, req, PS_ELIMIT, rep, "%s: clock %llu is not ready and may not wait: %s",
                         ps_op_name(req->op), (unsigned long long)clock, why);
        return PSD_ANSWER_NOW;
    }
    struct psd_waits *q = s->waits;
    struct wait *w = &q->w[q->n++];
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
    w->changed = req->changed;
    w->since = req->since;
    w->generation = req->generation;
    w->shm = req->shm & PS_SHM_OUT;
    w->shm_out = req->shm_out;
    w->since_ms = (uint64_t)ps_mono_ms();
    w->deadline_ms = w->since_ms + q->timeout_ms;
    w->logged = 0;
    q->st.deferred_total++;
    return PSD_ANSWER_LATER;
}

/* Why the wait on t at clock is not over: the workers it waits for. */
static void missing_text(const struct psd *s, const struct psd_table *t, uint64_t clock, char *out,
                         size_t len)
{
    psd_cons_missing(&s->conf.cons, t, clock, out, len);
    if (out[0] == '\0') /* no member holds it back: none is left to move the rounds */
        snprintf(out, len,
                 "none (no worker of the round is left to reach it; the table is at clock %llu)",
                 (unsigned long long)psd_cons_clock(&s->conf.cons, t));
}

void psd_waits_expire(struct psd *s, uint64_t now)
{
    struct psd_waits *q = s->waits;
    for (uint32_t i = 0; i < q->n;) {
        struct wait *w = &q->w[i];
        const struct psd_table *t = psd_table_at(s, w->table_id);
        char missing[128];
        missing_text(s, t, w->clock, missing, sizeof missing);
        if (now >= w->deadline_ms) {
            Ps__Header h;
            wait_header(w, &h);
            struct psd_reply rep;
            memset(&rep, 0, sizeof rep);
            psd_reply_errorf(s, &h, PS_ETIMEDOUT, &rep,
                             "%s of '%s' at clock %llu waited %llu ms; workers not there yet: %s",
                             ps_op_name(w->op), t->name, (unsigned long long)w->clock,
                             (unsigned long long)(now - w->since_ms), missing);
            q->st.timeouts++;
            psd_reply_send(s, w->route, w->route_len, &rep);
            q->w[i] = q->w[--q->n];
            continue;
        }
        if (!w->logged && now - w->since_ms >= PSD_WAIT_WARN_MS) {
            w->logged = 1;
            PS_LOG(s->conf.log, PS_LOG_WARN, S0400,
                   "worker %u's %s of '%s' at clock %llu has waited %llu ms for workers %s",
                   w->worker_id, ps_op_name(w->op), t->name, (unsigned long long)w->clock,
                   (unsigned long long)(now - w->since_ms), missing);
        }
        i++;
    }
}
