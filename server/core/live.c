/* The live set: which workers were heard from within --worker-timeout,
 * dropping the silent ones from the rounds, and the hello that binds a
 * worker id to a connection. */
#include "psd_impl.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_pool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t psd_live_count(const struct psd *s)
{
    uint32_t n = 0;
    for (uint32_t w = 0; w < s->cons.workers; w++)
        n += s->live[w].live;
    return n;
}

/* Worker w leaves the rounds of every table; waiting pulls that it held
 * back are answered. */
static void leave_tables(struct psd *s, uint32_t w)
{
    int any = 0;
    for (uint32_t i = 0; i < s->ntables; i++) {
        int applied = 0;
        psd_cons_leave(&s->cons, s->tables[i], w, &applied);
        any |= applied;
    }
    if (any)
        psd_release_waits(s);
}

/* A request from a worker: it is alive. A dropped worker is live again and
 * rejoins its tables with its next push that can join a round; a worker
 * saying hello from a new process (a new session) leaves the rounds its
 * old process was in, and its old process's waiting requests are gone. */
void psd_worker_heard(struct psd *s, const Ps__Header *req)
{
    uint32_t w = req->worker_id;
    if (w >= s->cons.workers || req->op == PS__OP__OP_STATS)
        return;
    struct psd_live *lv = &s->live[w];
    const struct psd_peer *p =
        req->op == PS__OP__OP_HELLO && req->session != 0 ? psd_peer_of(s, w, 0) : NULL;
    int restarted = p != NULL && p->session != 0 && p->session != req->session;
    uint64_t now = (uint64_t)ps_mono_ms();
    if (lv->seen && (!lv->live || restarted)) {
        s->workers_rejoined++;
        lv->stale_logged = 0;
        PS_LOG(s->log, PS_LOG_INFO, S0331,
               "worker %u %s after %llu ms: it rejoins each table at a round boundary "
               "(%u of %u workers live)",
               w, restarted ? "said hello from a new session (restarted, or rejoining)" : "is back",
               (unsigned long long)(now - lv->last_ms), psd_live_count(s) + !lv->live,
               s->cons.workers);
    }
    if (restarted) {
        for (uint32_t i = 0; i < s->nwaits;) {
            if (s->waits[i].worker_id == w)
                s->waits[i] = s->waits[--s->nwaits];
            else
                i++;
        }
        leave_tables(s, w);
    }
    lv->seen = lv->live = 1;
    lv->last_ms = now;
}

void psd_drop_worker(struct psd *s, uint32_t w)
{
    if (w >= s->cons.workers || !s->live[w].live)
        return;
    s->live[w].live = 0;
    s->workers_dropped++;
    PS_LOG(s->log, PS_LOG_WARN, S0330,
           "worker %u silent for %llu ms (--worker-timeout %llu): dropped from the live set; "
           "rounds go on without it (%u of %u workers live)",
           w, (unsigned long long)((uint64_t)ps_mono_ms() - s->live[w].last_ms),
           (unsigned long long)s->worker_timeout_ms, psd_live_count(s), s->cons.workers);
    if (s->on_drop != NULL) /* before the rounds it closes: a backup drops it first too */
        s->on_drop(s->hook_ctx, w);
    leave_tables(s, w);
    psd_shm_drop_worker(&s->shm, w, NULL, 0);
}

/* Drops workers silent for longer than the worker timeout. */
void psd_drop_silent(struct psd *s, uint64_t now)
{
    for (uint32_t w = 0; s->worker_timeout_ms > 0 && w < s->cons.workers; w++)
        if (s->live[w].live && now - s->live[w].last_ms > s->worker_timeout_ms)
            psd_drop_worker(s, w);
}

/* A push from a worker outside the round: acknowledged, not applied. */
void psd_note_stale(struct psd *s, const Ps__Header *req, const struct psd_table *t)
{
    s->stale_pushes++;
    psd_applied_push(s, req);
    if (req->worker_id >= s->cons.workers) /* stale comes from members' rules only */
        return;
    struct psd_live *lv = &s->live[req->worker_id];
    if (!lv->stale_logged) {
        lv->stale_logged = 1;
        PS_LOG(s->log, PS_LOG_INFO, S0332,
               "worker %u's push of '%s' at clock %llu is outside the round (table at clock %llu): "
               "not applied; it rejoins at a round boundary",
               req->worker_id, t->name, (unsigned long long)req->clock,
               (unsigned long long)psd_cons_clock(&s->cons, t));
    }
}

/* A hello that would take a worker id from the connection holding it,
 * or that a CURVE key may not make (psd_dispatch_from). 1 with an error
 * reply; 0 when it may go on. */
int psd_hello_refused(struct psd *s, const struct ps_frame *route, const char *user,
                      const Ps__Header *req, struct psd_reply *rep)
{
    uint32_t w = req->worker_id;
    if (w == PSD_OBSERVER_ID || s->replaying)
        return 0;
    if (user != NULL && s->may_use != NULL && !s->may_use(s->send_ctx, user, w)) {
        s->hellos_refused++;
        psd_reply_errorf(
            s, req, PS_EAUTH, rep,
            "hello: this client's CURVE key may not use worker id %u (the workers: line "
            "of its file in psd --curve-allow)",
            w);
        return 1;
    }
    if (w >= s->cons.workers)
        return 0; /* not in the rounds: psd knows no holder's liveness to protect */
    const struct psd_peer *p = psd_peer_of(s, w, 0);
    if (p == NULL || p->route_len == 0 || p->session == req->session ||
        (p->route_len == route->size && memcmp(p->route, route->data, route->size) == 0) ||
        (user != NULL && strcmp(p->user, user) == 0))
        return 0; /* free, the same session on a new connection, the same connection or key */
    uint64_t hold = s->worker_timeout_ms ? s->worker_timeout_ms : PSD_HOLD_MS_DEFAULT;
    uint64_t heard = s->live[w].last_ms, now = (uint64_t)ps_mono_ms();
    if (now - heard > hold)
        return 0; /* its holder went silent: a restarted worker takes it */
    s->hellos_refused++;
    psd_reply_errorf(
        s, req, PS_EBUSY, rep,
        "hello: worker id %u is held by another connection, heard from %llu ms ago; it "
        "is free once that one is silent for %llu ms (psd --worker-timeout), or at once "
        "to the same CURVE key",
        w, (unsigned long long)(now - heard), (unsigned long long)hold);
    return 1;
}

void psd_op_hello(struct psd *s, const struct ps_frame *route, const char *user,
                  const Ps__Header *req, struct psd_reply *rep)
{
    if (req->session != 0) { /* a new session (a restarted client) starts afresh */
        struct psd_peer *p = psd_peer_of(s, req->worker_id, 1);
        if (p != NULL && p->session != req->session) {
            psd_peer_reset(p, req->session, 0);
            s->changes++;
            /* the old process's regions */
            psd_shm_drop_worker(&s->shm, req->worker_id, route->data, route->size);
        }
        if (p != NULL && req->worker_id != PSD_OBSERVER_ID && route->size <= PS_ROUTE_ID_MAX) {
            memcpy(p->route, route->data, route->size); /* hello_refused let it take the id */
            p->route_len = route->size;
            snprintf(p->user, sizeof p->user, "%s", user ? user : "");
        }
    }
    Ps__Header h;
    psd_reply_init(&h, req);
    if (psd_shm_bind(&s->shm, req->shm_token, route->data, route->size, req->worker_id,
                     (uint64_t)ps_mono_ms())) {
        h.shm_token = req->shm_token;
        PS_LOG(s->log, PS_LOG_INFO, S0301,
               "worker %u shares a memory region with this shard (%u regions bound)",
               req->worker_id, psd_shm_bound(&s->shm));
    }
    h.shard = s->shard;
    h.shards = s->shards;
    h.local_endpoint = s->local_endpoint;
    h.instance = s->instance;
    h.clock = 0; /* where a worker joining now starts: the model's clock, which the
                  * client library's vote tables ("psd:...", psclient.h) run ahead of */
    for (uint32_t i = 0; i < s->ntables; i++) {
        if (PS_TABLE_RESERVED(s->tables[i]->name))
            continue;
        uint64_t c = psd_cons_join_clock(&s->cons, s->tables[i], req->worker_id);
        h.clock = c > h.clock ? c : h.clock;
    }
    PS_LOG(s->log, PS_LOG_DEBUG, S0300, "hello from worker %u", req->worker_id);
    psd_reply_header(s, &h, rep);
}
