/* The live set (live.h). */
#include "live.h"

#include "catalog.h"
#include "counters.h"
#include "dedup.h"
#include "hooks.h"
#include "regions.h"
#include "reply.h"
#include "waits.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A worker of the round: when it was heard from, and who holds its id:
 * the connection of its session's hello and that connection's CURVE key
 * ("" without CURVE). */
struct worker {
    uint64_t last_ms;
    uint8_t seen, live, stale_logged;
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
    char user[PSD_USER_MAX];
};

struct psd_live {
    struct worker *w; /* the round's workers */
    uint32_t workers;
    uint64_t worker_timeout_ms; /* drop a worker silent this long; 0: never */
    psd_may_use_cb may_use;     /* NULL: any key may use any worker id */
    void *may_use_ctx;
    char local_endpoint[PS_ENDPOINT_MAX]; /* hello replies offer it ("" none) */
    struct psd_live_stats st;
};

struct psd_live *psd_live_create(uint32_t workers, uint64_t worker_timeout_ms)
{
    struct psd_live *l = calloc(1, sizeof *l);
    if (l == NULL || (l->w = calloc(workers, sizeof *l->w)) == NULL) {
        free(l);
        return NULL;
    }
    l->workers = workers;
    l->worker_timeout_ms = worker_timeout_ms;
    return l;
}

void psd_live_destroy(struct psd_live *l)
{
    if (l != NULL)
        free(l->w);
    free(l);
}

void psd_set_worker_timeout(struct psd *s, uint64_t ms)
{
    s->live->worker_timeout_ms = ms;
}

uint64_t psd_worker_timeout_ms(const struct psd *s)
{
    return s->live->worker_timeout_ms;
}

void psd_set_may_use(struct psd *s, psd_may_use_cb may_use, void *ctx)
{
    s->live->may_use = may_use;
    s->live->may_use_ctx = ctx;
}

void psd_set_local_endpoint(struct psd *s, const char *endpoint)
{
    snprintf(s->live->local_endpoint, sizeof s->live->local_endpoint, "%s",
             endpoint ? endpoint : "");
}

const char *psd_local_endpoint(const struct psd *s)
{
    return s->live->local_endpoint;
}

struct psd_live_stats psd_live_stats(const struct psd *s)
{
    return s->live->st;
}

int psd_live_is_live(const struct psd *s, uint32_t w)
{
    return w < s->live->workers && s->live->w[w].live;
}

void psd_live_restored(struct psd *s, uint32_t w)
{
    if (w >= s->live->workers)
        return;
    s->live->w[w].seen = s->live->w[w].live = 1;
    s->live->w[w].last_ms = (uint64_t)ps_mono_ms();
}

void psd_live_heard_all(struct psd *s)
{
    uint64_t now = (uint64_t)ps_mono_ms();
    for (uint32_t w = 0; w < s->live->workers; w++)
        if (s->live->w[w].live)
            s->live->w[w].last_ms = now;
}

void psd_live_reset(struct psd *s)
{
    memset(s->live->w, 0, s->live->workers * sizeof *s->live->w);
}

uint32_t psd_live_count(const struct psd *s)
{
    uint32_t n = 0;
    for (uint32_t w = 0; w < s->live->workers; w++)
        n += s->live->w[w].live;
    return n;
}

/* Worker w leaves the rounds of every table; waiting pulls that it held
 * back are answered. */
static void leave_tables(struct psd *s, uint32_t w)
{
    int any = 0;
    for (uint32_t i = 0; i < psd_ntables(s); i++) {
        int applied = 0;
        psd_cons_leave(&s->conf.cons, psd_table_at(s, i), w, &applied);
        any |= applied;
    }
    if (any)
        psd_release_waits(s);
}

void psd_live_heard(struct psd *s, const Ps__Header *req)
{
    uint32_t w = req->worker_id;
    if (w >= s->live->workers || req->op == PS__OP__OP_STATS)
        return;
    struct worker *lv = &s->live->w[w];
    uint64_t was = req->op == PS__OP__OP_HELLO && req->session != 0 ? psd_dedup_session(s, w) : 0;
    int restarted = was != 0 && was != req->session;
    uint64_t now = (uint64_t)ps_mono_ms();
    if (lv->seen && (!lv->live || restarted)) {
        s->live->st.rejoined++;
        lv->stale_logged = 0;
        PS_LOG(s->conf.log, PS_LOG_INFO, S0331,
               "worker %u %s after %llu ms: it rejoins each table at a round boundary "
               "(%u of %u workers live)",
               w, restarted ? "said hello from a new session (restarted, or rejoining)" : "is back",
               (unsigned long long)(now - lv->last_ms), psd_live_count(s) + !lv->live,
               s->live->workers);
    }
    if (restarted) {
        psd_waits_drop_worker(s, w);
        leave_tables(s, w);
    }
    lv->seen = lv->live = 1;
    lv->last_ms = now;
}

void psd_drop_worker(struct psd *s, uint32_t w)
{
    if (!psd_live_is_live(s, w))
        return;
    s->live->w[w].live = 0;
    s->live->st.dropped++;
    PS_LOG(s->conf.log, PS_LOG_WARN, S0330,
           "worker %u silent for %llu ms (--worker-timeout %llu): dropped from the live set; "
           "rounds go on without it (%u of %u workers live)",
           w, (unsigned long long)((uint64_t)ps_mono_ms() - s->live->w[w].last_ms),
           (unsigned long long)s->live->worker_timeout_ms, psd_live_count(s), s->live->workers);
    psd_hooks_drop(s, w); /* before the rounds it closes: a backup drops it first too */
    leave_tables(s, w);
    psd_regions_drop_worker(s->shm, w, NULL, 0);
}

void psd_live_drop_silent(struct psd *s, uint64_t now)
{
    const struct psd_live *l = s->live;
    for (uint32_t w = 0; l->worker_timeout_ms > 0 && w < l->workers; w++)
        if (l->w[w].live && now - l->w[w].last_ms > l->worker_timeout_ms)
            psd_drop_worker(s, w);
}

void psd_live_stale(struct psd *s, const Ps__Header *req, const struct psd_table *t)
{
    s->live->st.stale_pushes++;
    psd_dedup_applied(s, req);
    if (req->worker_id >= s->live->workers) /* stale comes from members' rules only */
        return;
    struct worker *lv = &s->live->w[req->worker_id];
    if (!lv->stale_logged) {
        lv->stale_logged = 1;
        PS_LOG(s->conf.log, PS_LOG_INFO, S0332,
               "worker %u's push of '%s' at clock %llu is outside the round (table at clock %llu): "
               "not applied; it rejoins at a round boundary",
               req->worker_id, t->name, (unsigned long long)req->clock,
               (unsigned long long)psd_cons_clock(&s->conf.cons, t));
    }
}

/* Whether the hello req may take worker id w (one of the round's) from
 * the connection holding it: 1 when it may. */
static int may_take(const struct psd *s, const struct ps_frame *route, const char *user,
                    const Ps__Header *req)
{
    const struct worker *h = &s->live->w[req->worker_id];
    return h->route_len == 0 || psd_dedup_session(s, req->worker_id) == req->session ||
           (h->route_len == route->size && memcmp(h->route, route->data, route->size) == 0) ||
           (user != NULL && strcmp(h->user, user) == 0);
}

/* A CURVE key that may not use req's worker id (its allow file's
 * workers: line): 1, counted in *count, with an error reply. */
static int key_refused(struct psd *s, const char *user, const Ps__Header *req, uint64_t *count,
                       struct psd_reply *rep)
{
    const struct psd_live *l = s->live;
    if (user == NULL || l->may_use == NULL || l->may_use(l->may_use_ctx, user, req->worker_id))
        return 0;
    (*count)++;
    psd_reply_errorf(s, req, PS_EAUTH, rep,
                     "%s: this client's CURVE key may not use worker id %u (the workers: line "
                     "of its file in psd --curve-allow)",
                     ps_op_name(req->op), req->worker_id);
    return 1;
}

int psd_live_hello_refused(struct psd *s, const struct ps_frame *route, const char *user,
                           const Ps__Header *req, int replaying, struct psd_reply *rep)
{
    struct psd_live *l = s->live;
    uint32_t w = req->worker_id;
    if (w == PSD_OBSERVER_ID || replaying)
        return 0;
    if (key_refused(s, user, req, &l->st.hellos_refused, rep))
        return 1;
    if (w >= l->workers)
        return 0; /* not in the rounds: psd knows no holder's liveness to protect */
    if (may_take(s, route, user, req))
        return 0; /* free, the same session on a new connection, the same connection or key */
    uint64_t hold = l->worker_timeout_ms ? l->worker_timeout_ms : PSD_HOLD_MS_DEFAULT;
    uint64_t heard = l->w[w].last_ms, now = (uint64_t)ps_mono_ms();
    if (now - heard > hold)
        return 0; /* its holder went silent: a restarted worker takes it */
    l->st.hellos_refused++;
    psd_reply_errorf(
        s, req, PS_EBUSY, rep,
        "hello: worker id %u is held by another connection, heard from %llu ms ago; it "
        "is free once that one is silent for %llu ms (psd --worker-timeout), or at once "
        "to the same CURVE key",
        w, (unsigned long long)(now - heard), (unsigned long long)hold);
    return 1;
}

int psd_live_request_refused(struct psd *s, const struct ps_frame *route, const char *user,
                             const Ps__Header *req, int replaying, struct psd_reply *rep)
{
    switch (req->op) {
    case PS__OP__OP_PULL:
    case PS__OP__OP_PUSH:
    case PS__OP__OP_PUSH_PULL:
    case PS__OP__OP_SET:
    case PS__OP__OP_HEARTBEAT:
        break;
    default:
        return 0;
    }
    struct psd_live *l = s->live;
    uint32_t w = req->worker_id;
    if (w == PSD_OBSERVER_ID || replaying)
        return 0;
    if (key_refused(s, user, req, &l->st.requests_refused, rep))
        return 1;
    if (w >= l->workers)
        return 0;
    const struct worker *h = &l->w[w];
    if (h->route_len == 0 ||
        (h->route_len == route->size && memcmp(h->route, route->data, route->size) == 0))
        return 0;
    l->st.requests_refused++;
    psd_reply_errorf(s, req, PS_EBUSY, rep,
                     "%s: worker id %u is bound to another connection, the one its last hello "
                     "came on: a client says hello on its connection before it pushes or pulls",
                     ps_op_name(req->op), w);
    return 1;
}

void psd_op_hello(struct psd *s, const struct ps_frame *route, const char *user,
                  const Ps__Header *req, struct psd_reply *rep)
{
    uint32_t w = req->worker_id;
    if (req->session != 0) { /* a new session (a restarted client) starts afresh */
        if (psd_dedup_hello(s, w, req->session)) /* the old process's regions */
            psd_regions_drop_worker(s->shm, w, route->data, route->size);
        if (w < s->live->workers && route->size <= PS_ROUTE_ID_MAX) {
            struct worker *h = &s->live->w[w]; /* hello_refused let it take the id */
            if (route->size > 0)               /* a replayed record may carry none (data NULL) */
                memcpy(h->route, route->data, route->size);
            h->route_len = route->size;
            snprintf(h->user, sizeof h->user, "%s", user ? user : "");
        }
    }
    Ps__Header h;
    psd_reply_init(&h, req);
    if (psd_regions_bind(s->shm, req->shm_token, route->data, route->size, w,
                         (uint64_t)ps_mono_ms())) {
        h.shm_token = req->shm_token;
        PS_LOG(s->conf.log, PS_LOG_INFO, S0301,
               "worker %u shares a memory region with this shard (%u regions bound)", w,
               psd_regions_bound(s->shm));
    }
    h.shard = s->conf.shard;
    h.shards = s->conf.shards;
    h.local_endpoint = s->live->local_endpoint;
    h.instance = s->conf.instance;
    h.clock = 0; /* where a worker joining now starts: the clock of the tables it
                  * pushes (a pipeline stage's own; the client library's vote tables,
                  * "psd:..." in psclient.h, run ahead of the model's) */
    for (uint32_t i = 0; i < psd_ntables(s); i++) {
        const struct psd_table *t = psd_table_at(s, i);
        if (PS_TABLE_RESERVED(t->name) || !psd_table_pushed_by(t, w))
            continue;
        uint64_t c = psd_cons_join_clock(&s->conf.cons, t, w);
        h.clock = c > h.clock ? c : h.clock;
    }
    PS_LOG(s->conf.log, PS_LOG_DEBUG, S0300, "hello from worker %u", w);
    psd_reply_header(s, &h, rep);
}
