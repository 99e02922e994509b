/* Request dispatch: decode, check against server state, apply, reply. */
#include "psd.h"

#include "checkpoint.h"
#include "ps_err.h"
#include "ps_finite.h"
#include "ps_half.h"
#include "ps_local.h"
#include "ps_pool.h"
#include "ps_shard.h"
#include "psk_optim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static uint64_t now_ms(void)
{
    return uv_hrtime() / 1000000u;
}

int psd_init(struct psd *s, struct ps_log *log, const struct psd_params *p)
{
    memset(s, 0, sizeof *s);
    s->log = log;
    s->pool = p->pool;
    s->shard = p->shard;
    s->shards = p->shards;
    s->value_bytes_max = p->value_bytes_max;
    s->cons = p->cons;
    if (s->cons.workers == 0)
        s->cons.workers = 1;
    s->wait_timeout_ms = p->wait_timeout_ms ? p->wait_timeout_ms : PS_WAIT_TIMEOUT_MS_DEFAULT;
    s->table_bytes_max = p->table_bytes_max ? p->table_bytes_max : PS_TABLE_BYTES_DEFAULT;
    s->nprunes = p->nprunes < PSD_PRUNE_SPECS_MAX ? p->nprunes : PSD_PRUNE_SPECS_MAX;
    if (s->nprunes > 0)
        memcpy(s->prunes, p->prunes, s->nprunes * sizeof *s->prunes);
    s->start_ns = uv_hrtime();
    s->instance = ps_random_id();
    s->arena_buf = malloc(PS_ARENA_BYTES_SERVER);
    s->waits = calloc(PS_WAITS_MAX, sizeof *s->waits);
    s->live = calloc(s->cons.workers, sizeof *s->live);
    s->worker_timeout_ms = p->worker_timeout_ms;
    s->allow_nonfinite = p->allow_nonfinite;
    s->unread_bytes_max = p->unread_bytes_max ? p->unread_bytes_max : PS_UNREAD_BYTES_DEFAULT;
    s->unread_bytes_total_max =
        p->unread_bytes_total_max ? p->unread_bytes_total_max : PS_UNREAD_BYTES_TOTAL_DEFAULT;
    if (s->arena_buf == NULL || s->waits == NULL || s->live == NULL) {
        psd_fini(s);
        return PS_ENOMEM;
    }
    ps_arena_init(&s->arena, s->arena_buf, PS_ARENA_BYTES_SERVER);
    return 0;
}

void psd_set_sender(struct psd *s, psd_send_cb send, void *ctx)
{
    s->send = send;
    s->send_ctx = ctx;
}

void psd_set_unread(struct psd *s, psd_unread_cb unread)
{
    s->unread = unread;
}

void psd_set_may_use(struct psd *s, psd_may_use_cb may_use)
{
    s->may_use = may_use;
}

uint64_t psd_unread_total(const struct psd *s)
{
    uint64_t peer = 0, total = 0;
    if (s->unread != NULL) /* no route: the total alone */
        s->unread(s->send_ctx, NULL, 0, &peer, &total);
    return total;
}

void psd_set_local_endpoint(struct psd *s, const char *endpoint)
{
    snprintf(s->local_endpoint, sizeof s->local_endpoint, "%s", endpoint ? endpoint : "");
}

void psd_reset_tables(struct psd *s)
{
    for (uint32_t i = 0; i < s->ntables; i++) {
        psd_cons_table_fini(&s->cons, s->tables[i]);
        psd_table_destroy(s->tables[i]);
    }
    s->ntables = 0;
    memset(s->peers, 0, sizeof s->peers);
}

int psd_table_new(struct psd *s, const Ps__TableSpec *spec, struct psd_table **out)
{
    struct psd_table *t = NULL;
    int rc = psd_table_create(spec, s->ntables, s->shard, s->shards, &t);
    if (rc != 0)
        return rc;
    t->pool = s->pool;
    if ((rc = psd_cons_table_init(&s->cons, t)) != 0) {
        psd_cons_table_fini(&s->cons, t);
        psd_table_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int psd_shm_take(struct psd *s, uint64_t token, void *base, size_t size)
{
    return psd_shm_offer(&s->shm, token, base, size, now_ms());
}

void psd_fini(struct psd *s)
{
    psd_reset_tables(s);
    ps_pool_stop(s->pool);
    s->pool = NULL;
    psd_shm_fini(&s->shm);
    free(s->arena_buf);
    free(s->scratch);
    free(s->keys_scratch);
    free(s->waits);
    free(s->live);
    s->live = NULL;
    s->arena_buf = NULL;
    s->scratch = NULL;
    s->waits = NULL;
}

/* ---- replies ---------------------------------------------------------- */

void psd_reply_drop(struct psd_reply *rep)
{
    free(rep->mask);
    if (rep->lent != NULL)
        psd_lent_done(rep->lent);
    else if (!rep->vals_borrowed)
        free(rep->vals);
    rep->lent = NULL;
    rep->vals_borrowed = 0;
    rep->mask = rep->vals = NULL;
    rep->mask_bytes = rep->vals_bytes = 0;
}

static void reply_header(struct psd *s, const Ps__Header *h, struct psd_reply *rep)
{
    int64_t n = ps_wire_header_pack(h, s->hdr_buf, sizeof s->hdr_buf);
    if (n < 0) {
        /* Our own reply outgrew the header limit (e.g. stats of many tables):
         * fall back to a bare error so the peer still gets an answer. */
        Ps__Header e;
        ps_wire_header_init(&e, h->op);
        e.request_id = h->request_id;
        e.status = PS_ELIMIT;
        e.error = "reply header exceeds the header size limit";
        n = ps_wire_header_pack(&e, s->hdr_buf, sizeof s->hdr_buf);
        psd_reply_drop(rep);
    }
    rep->hdr = s->hdr_buf;
    rep->hdr_len = n < 0 ? 0 : (size_t)n;
}

static void reply_init(Ps__Header *out, const Ps__Header *req)
{
    ps_wire_header_init(out, req ? req->op : PS__OP__OP_NONE);
    if (req != NULL) {
        out->request_id = req->request_id;
        out->worker_id = req->worker_id;
        out->table_id = req->table_id;
        out->clock = req->clock;
    }
}

int psd_op_index(const Ps__Header *h)
{
    return h != NULL && h->op > 0 && h->op < PSD_OPS_COUNT ? (int)h->op : PSD_OPS_COUNT;
}

/* The one place error replies are written (and counted, and logged). */
static void reply_error(struct psd *s, const Ps__Header *req, int code, const char *text,
                        struct psd_reply *rep)
{
    Ps__Header h;
    reply_init(&h, req);
    h.status = code;
    char buf[PS_ERROR_TEXT_MAX];
    snprintf(buf, sizeof buf, "%s", text);
    h.error = buf;
    s->ctr.errors++;
    s->ctr
        .errors_by[psd_op_index(req)][code < 0 && code > -PSD_ERR_CODES ? -code : PSD_ERR_CODES]++;
    if (ps_log_sampled(++s->errors_logged))
        PS_LOG(s->log, PS_LOG_WARN, "S0200", "error reply to worker %u (%s): %s [%s] (%llu so far)",
               req ? req->worker_id : 0, req ? ps_op_name(req->op) : "?", buf, ps_err_name(code),
               (unsigned long long)s->ctr.errors);
    psd_reply_drop(rep);
    reply_header(s, &h, rep);
}

static void reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                         const char *fmt, ...)
{
    char buf[PS_ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    reply_error(s, req, code, buf, rep);
}

/* A reply with values to `route` must fit the bytes it may leave unread
 * (psd_set_unread): one that does not becomes an error reply. While the
 * connection has nothing unread, a reply of any size fits its own bound. */
static void fit_unread(struct psd *s, const void *route, size_t route_len, const Ps__Header *req,
                       struct psd_reply *rep)
{
    uint64_t bytes = rep->mask_bytes + rep->vals_bytes, peer = 0, total = 0;
    if (bytes == 0 || s->unread == NULL)
        return;
    int known = s->unread(s->send_ctx, route, route_len, &peer, &total);
    int peer_ok = peer == 0 || peer + bytes <= s->unread_bytes_max;
    int total_ok = total + bytes <= s->unread_bytes_total_max;
    if (known && peer_ok && total_ok)
        return;
    s->unread_refused++;
    if (!known)
        reply_errorf(s, req, PS_ELIMIT, rep,
                     "%s: %u connections hold replies they have not read: read yours, or retry",
                     ps_op_name(req->op), PS_UNREAD_PEERS_MAX);
    else if (!peer_ok)
        reply_errorf(s, req, PS_ELIMIT, rep,
                     "%s: this connection has %llu reply bytes it has not read; %llu more would "
                     "pass psd --max-unread-bytes %llu: read your replies",
                     ps_op_name(req->op), (unsigned long long)peer, (unsigned long long)bytes,
                     (unsigned long long)s->unread_bytes_max);
    else
        reply_errorf(s, req, PS_ELIMIT, rep,
                     "%s: connections have %llu reply bytes they have not read; %llu more would "
                     "pass psd --max-unread-bytes-total %llu",
                     ps_op_name(req->op), (unsigned long long)total, (unsigned long long)bytes,
                     (unsigned long long)s->unread_bytes_total_max);
}

/* ---- ops ---------------------------------------------------------------- */

/* The exactly-once record of a worker id (open addressing over a fixed
 * array: no allocation, and at most PSD_PEERS distinct ids). */
static struct psd_peer *peer_of(struct psd *s, uint32_t worker_id, int create)
{
    for (uint32_t i = 0, j = worker_id % PSD_PEERS; i < PSD_PEERS; i++, j = (j + 1) % PSD_PEERS) {
        struct psd_peer *p = &s->peers[j];
        if (p->used && p->worker_id == worker_id)
            return p;
        if (!p->used) {
            if (!create)
                return NULL;
            p->used = 1;
            p->worker_id = worker_id;
            return p;
        }
    }
    return NULL;
}

static int bit_get(const struct psd_peer *p, uint64_t id)
{
    uint64_t i = id % PSD_DEDUP_WINDOW;
    return (int)((p->applied_bits[i / 64] >> (i % 64)) & 1u);
}

static void bit_put(struct psd_peer *p, uint64_t id, int on)
{
    uint64_t i = id % PSD_DEDUP_WINDOW, m = UINT64_C(1) << (i % 64);
    p->applied_bits[i / 64] = on ? p->applied_bits[i / 64] | m : p->applied_bits[i / 64] & ~m;
}

/* 1 when this push was applied already (a retry): acknowledge, skip. Ids
 * above the newest applied are new; within the window below it, each id
 * is remembered on its own (a retry of a request lost in a crash comes
 * after requests sent behind it); older ones count as applied. */
static int seen_push(struct psd *s, const Ps__Header *req)
{
    struct psd_peer *p = peer_of(s, req->worker_id, 0);
    if (p == NULL || p->session == 0 || req->request_id > p->last_applied)
        return 0;
    if (p->last_applied - req->request_id < PSD_DEDUP_WINDOW && !bit_get(p, req->request_id))
        return 0;
    s->duplicates_dropped++;
    PS_LOG(s->log, PS_LOG_DEBUG, "S0340",
           "worker %u: %s %llu of table %u (clock %llu) was applied before: not again",
           req->worker_id, ps_op_name(req->op), (unsigned long long)req->request_id, req->table_id,
           (unsigned long long)req->clock);
    return 1;
}

static void applied_push(struct psd *s, const Ps__Header *req)
{
    struct psd_peer *p = peer_of(s, req->worker_id, 0);
    if (p == NULL || p->session == 0)
        return;
    s->changes++;
    uint64_t id = req->request_id;
    if (id > p->last_applied) { /* the ids skipped over are not applied (yet) */
        uint64_t gap = id - p->last_applied;
        if (gap >= PSD_DEDUP_WINDOW)
            memset(p->applied_bits, 0, sizeof p->applied_bits);
        else
            for (uint64_t j = p->last_applied + 1; j < id; j++)
                bit_put(p, j, 0);
        p->last_applied = id;
    }
    bit_put(p, id, 1);
}

/* Everything up to last_applied counts as applied (a restored checkpoint,
 * a new session at 0). */
static void peer_reset(struct psd_peer *p, uint64_t session, uint64_t last_applied)
{
    p->session = session;
    p->last_applied = last_applied;
    memset(p->applied_bits, 0xff, sizeof p->applied_bits);
}

void psd_peer_restore(struct psd *s, uint32_t worker_id, uint64_t session, uint64_t last_applied,
                      const uint64_t *bits)
{
    struct psd_peer *p = peer_of(s, worker_id, 1);
    if (p != NULL) {
        peer_reset(p, session, last_applied);
        if (bits != NULL)
            memcpy(p->applied_bits, bits, sizeof p->applied_bits);
    }
    /* a worker known before the restart: dropped if it stays silent */
    if (worker_id < s->cons.workers) {
        s->live[worker_id].seen = s->live[worker_id].live = 1;
        s->live[worker_id].last_ms = now_ms();
    }
}

static void reply_duplicate(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    Ps__Header h;
    reply_init(&h, req);
    h.duplicate = 1;
    reply_header(s, &h, rep);
}

/* ---- the live set -------------------------------------------------------- */

static void release_waits(struct psd *s);

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
        release_waits(s);
}

/* A request from a worker: it is alive. A dropped worker is live again and
 * rejoins its tables with its next push that can join a round; a worker
 * saying hello from a new process (a new session) leaves the rounds its
 * old process was in, and its old process's waiting requests are gone. */
static void worker_heard(struct psd *s, const Ps__Header *req)
{
    uint32_t w = req->worker_id;
    if (w >= s->cons.workers || req->op == PS__OP__OP_STATS)
        return;
    struct psd_live *lv = &s->live[w];
    const struct psd_peer *p =
        req->op == PS__OP__OP_HELLO && req->session != 0 ? peer_of(s, w, 0) : NULL;
    int restarted = p != NULL && p->session != 0 && p->session != req->session;
    uint64_t now = now_ms();
    if (lv->seen && (!lv->live || restarted)) {
        s->workers_rejoined++;
        lv->stale_logged = 0;
        PS_LOG(s->log, PS_LOG_INFO, "S0331",
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
    PS_LOG(s->log, PS_LOG_WARN, "S0330",
           "worker %u silent for %llu ms (--worker-timeout %llu): dropped from the live set; "
           "rounds go on without it (%u of %u workers live)",
           w, (unsigned long long)(now_ms() - s->live[w].last_ms),
           (unsigned long long)s->worker_timeout_ms, psd_live_count(s), s->cons.workers);
    leave_tables(s, w);
    psd_shm_drop_worker(&s->shm, w, NULL, 0);
}

/* Drops workers silent for longer than the worker timeout. */
static void drop_silent(struct psd *s, uint64_t now)
{
    for (uint32_t w = 0; s->worker_timeout_ms > 0 && w < s->cons.workers; w++)
        if (s->live[w].live && now - s->live[w].last_ms > s->worker_timeout_ms)
            psd_drop_worker(s, w);
}

/* A push from a worker outside the round: acknowledged, not applied. */
static void note_stale(struct psd *s, const Ps__Header *req, const struct psd_table *t)
{
    s->stale_pushes++;
    applied_push(s, req);
    if (req->worker_id >= s->cons.workers) /* stale comes from members' rules only */
        return;
    struct psd_live *lv = &s->live[req->worker_id];
    if (!lv->stale_logged) {
        lv->stale_logged = 1;
        PS_LOG(s->log, PS_LOG_INFO, "S0332",
               "worker %u's push of '%s' at clock %llu is outside the round (table at clock %llu): "
               "not applied; it rejoins at a round boundary",
               req->worker_id, t->name, (unsigned long long)req->clock,
               (unsigned long long)psd_cons_clock(&s->cons, t));
    }
}

/* A hello that would take a worker id from the connection holding it,
 * or that a CURVE key may not make (psd_dispatch_from). 1 with an error
 * reply; 0 when it may go on. */
static int hello_refused(struct psd *s, const struct ps_frame *route, const char *user,
                         const Ps__Header *req, struct psd_reply *rep)
{
    uint32_t w = req->worker_id;
    if (w == PSD_OBSERVER_ID)
        return 0;
    if (user != NULL && s->may_use != NULL && !s->may_use(s->send_ctx, user, w)) {
        s->hellos_refused++;
        reply_errorf(s, req, PS_EAUTH, rep,
                     "hello: this client's CURVE key may not use worker id %u (the workers: line "
                     "of its file in psd --curve-allow)",
                     w);
        return 1;
    }
    if (w >= s->cons.workers)
        return 0; /* not in the rounds: psd knows no holder's liveness to protect */
    const struct psd_peer *p = peer_of(s, w, 0);
    if (p == NULL || p->route_len == 0 || p->session == req->session ||
        (p->route_len == route->size && memcmp(p->route, route->data, route->size) == 0) ||
        (user != NULL && strcmp(p->user, user) == 0))
        return 0; /* free, the same session on a new connection, the same connection or key */
    uint64_t hold = s->worker_timeout_ms ? s->worker_timeout_ms : PSD_HOLD_MS_DEFAULT;
    uint64_t heard = s->live[w].last_ms, now = now_ms();
    if (now - heard > hold)
        return 0; /* its holder went silent: a restarted worker takes it */
    s->hellos_refused++;
    reply_errorf(s, req, PS_EBUSY, rep,
                 "hello: worker id %u is held by another connection, heard from %llu ms ago; it "
                 "is free once that one is silent for %llu ms (psd --worker-timeout), or at once "
                 "to the same CURVE key",
                 w, (unsigned long long)(now - heard), (unsigned long long)hold);
    return 1;
}

static void op_hello(struct psd *s, const struct ps_frame *route, const char *user,
                     const Ps__Header *req, struct psd_reply *rep)
{
    if (req->session != 0) { /* a new session (a restarted client) starts afresh */
        struct psd_peer *p = peer_of(s, req->worker_id, 1);
        if (p != NULL && p->session != req->session) {
            peer_reset(p, req->session, 0);
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
    reply_init(&h, req);
    if (psd_shm_bind(&s->shm, req->shm_token, route->data, route->size, req->worker_id, now_ms())) {
        h.shm_token = req->shm_token;
        PS_LOG(s->log, PS_LOG_INFO, "S0301",
               "worker %u shares a memory region with this shard (%u regions bound)",
               req->worker_id, psd_shm_bound(&s->shm));
    }
    h.shard = s->shard;
    h.shards = s->shards;
    h.local_endpoint = s->local_endpoint;
    h.instance = s->instance;
    h.clock = 0; /* where a worker joining now starts */
    for (uint32_t i = 0; i < s->ntables; i++) {
        uint64_t c = psd_cons_join_clock(&s->cons, s->tables[i], req->worker_id);
        h.clock = c > h.clock ? c : h.clock;
    }
    PS_LOG(s->log, PS_LOG_DEBUG, "S0300", "hello from worker %u", req->worker_id);
    reply_header(s, &h, rep);
}

uint64_t psd_table_bytes_needed(const struct psd *s, const Ps__TableSpec *spec)
{
    uint64_t lo = 0, hi = 0;
    if (!spec->sparse)
        ps_shard_range(spec->size, s->shards, s->shard, &lo, &hi);
    uint64_t elems = spec->sparse ? spec->rows_max * spec->dim : hi - lo;
    return elems * 4u * (1u + (uint64_t)psk_optim_state_arrays((int)spec->optimizer));
}

static struct psd_table *find_by_name(struct psd *s, const char *name)
{
    for (uint32_t i = 0; i < s->ntables; i++)
        if (strcmp(s->tables[i]->name, name) == 0)
            return s->tables[i];
    return NULL;
}

static void op_create(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    const Ps__TableSpec *spec = req->spec;
    struct psd_table *t = find_by_name(s, spec->name);
    if (t != NULL && !psd_table_same_spec(t, spec)) {
        reply_errorf(s, req, PS_EEXIST, rep,
                     "table '%s' exists with another spec (size %llu, %s, lr %g)", t->name,
                     (unsigned long long)t->size, psd_optimizer_name(t->optimizer), (double)t->lr);
        return;
    }
    if (t == NULL) {
        uint64_t bytes = psd_table_bytes_needed(s, spec);
        if (bytes > s->table_bytes_max) {
            reply_errorf(s, req, PS_ELIMIT, rep,
                         "table '%s' would take %llu bytes on this shard, over the limit of %llu "
                         "(psd --max-table-bytes)",
                         spec->name, (unsigned long long)bytes,
                         (unsigned long long)s->table_bytes_max);
            return;
        }
        if (s->ntables >= PS_TABLES_MAX) {
            reply_errorf(s, req, PS_ELIMIT, rep, "table limit of %u reached", PS_TABLES_MAX);
            return;
        }
        int rc = psd_table_new(s, spec, &t);
        if (rc != 0) {
            reply_errorf(s, req, rc, rep, "cannot allocate table '%s' of %llu elements", spec->name,
                         (unsigned long long)spec->size);
            return;
        }
        for (size_t i = 0; i < s->nprunes && rc == 0; i++) {
            if (strcmp(s->prunes[i].table, t->name) != 0)
                continue;
            if (psd_table_enable_prune(t, &s->prunes[i]) != 0) {
                psd_cons_table_fini(&s->cons, t);
                psd_table_destroy(t);
                reply_errorf(s, req, PS_ENOMEM, rep, "cannot allocate the prune mask of '%s'",
                             spec->name);
                return;
            }
            PS_LOG(s->log, PS_LOG_INFO, "S0311",
                   "pruning '%s' to %.4f sparsity between steps %llu and %llu, every %llu", t->name,
                   s->prunes[i].target, (unsigned long long)s->prunes[i].start,
                   (unsigned long long)s->prunes[i].end, (unsigned long long)s->prunes[i].every);
        }
        s->tables[s->ntables++] = t;
        s->changes++;
        PS_LOG(s->log, PS_LOG_INFO, "S0310",
               "created table '%s' id %u: %llu elements, this shard [%llu, %llu), %s lr %g",
               t->name, t->id, (unsigned long long)t->size, (unsigned long long)t->lo,
               (unsigned long long)t->hi, psd_optimizer_name(t->optimizer), (double)t->lr);
    }
    Ps__Header h;
    reply_init(&h, req);
    h.table_id = t->id;
    h.offset = t->lo;
    h.count = t->hi - t->lo;
    reply_header(s, &h, rep);
}

/* Server-state checks shared by pull, push and push-pull. */
static struct psd_table *check_range(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    if (req->table_id >= s->ntables) {
        reply_errorf(s, req, PS_ENOTABLE, rep, "%s: no table with id %u (this shard has %u)",
                     ps_op_name(req->op), req->table_id, s->ntables);
        return NULL;
    }
    struct psd_table *t = s->tables[req->table_id];
    if (t->sparse)
        return t; /* op_rows checks keys and dim */
    if (req->layout == PS__LAYOUT__LAYOUT_KEYS) {
        if (req->op != PS__OP__OP_PUSH || req->dim != 1) {
            reply_errorf(s, req, PS_ENOTSUP, rep,
                         "%s: table '%s' is dense; it takes keyed pushes of dim 1 only (keyed "
                         "pulls need a sparse table)",
                         ps_op_name(req->op), t->name);
            return NULL;
        }
        return t; /* the keys are checked against the shard by op_keys */
    }
    if (req->offset < t->lo || req->offset + req->count > t->hi) {
        reply_errorf(s, req, PS_ERANGE, rep,
                     "%s: [%llu, %llu) is outside shard %u's range [%llu, %llu) of table '%s' "
                     "(size %llu)",
                     ps_op_name(req->op), (unsigned long long)req->offset,
                     (unsigned long long)(req->offset + req->count), s->shard,
                     (unsigned long long)t->lo, (unsigned long long)t->hi, t->name,
                     (unsigned long long)t->size);
        return NULL;
    }
    return t;
}

/* Values as aligned f32: the frame itself when it is aligned f32, else a
 * copy or a conversion into the server's scratch buffer. */
static const float *values_f32(struct psd *s, const struct ps_wire_msg *m)
{
    int f32 = m->hdr->dtype == PS__DTYPE__DTYPE_F32;
    if (f32 && ((uintptr_t)m->vals % _Alignof(float)) == 0)
        return m->vals;
    size_t need = (size_t)m->hdr->count * m->hdr->dim * sizeof(float);
    if (need > s->scratch_cap) {
        float *p = realloc(s->scratch, need);
        if (p == NULL)
            return NULL;
        s->scratch = p;
        s->scratch_cap = need;
    }
    if (f32)
        memcpy(s->scratch, m->vals, need);
    else
        ps_half_to_f32_n(m->hdr->dtype, m->vals, s->scratch, need / sizeof(float));
    return s->scratch;
}

/* Writes the nonzeros of w[0..n) as a bitmap plus values in dtype, when
 * that is smaller than sending them all. Returns 1 when rep holds it. */
static int reply_masked(const float *w, size_t n, Ps__DType dtype, struct psd_reply *rep)
{
    size_t nnz = 0, esize = ps_dtype_size(dtype), mbytes = (n + 7) / 8;
    for (size_t i = 0; i < n; i++)
        nnz += w[i] != 0.0f;
    if (mbytes + nnz * esize >= n * esize)
        return 0;
    uint8_t *mask = calloc(mbytes ? mbytes : 1, 1);
    float *nz = malloc((nnz ? nnz : 1) * sizeof(float));
    void *vals = aligned_alloc(64, ((nnz ? nnz : 1) * esize + 63u) & ~(size_t)63u);
    if (mask == NULL || nz == NULL || vals == NULL) {
        free(mask);
        free(nz);
        free(vals);
        return 0; /* the dense reply still works */
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i] != 0.0f) {
            mask[i / 8] |= (uint8_t)(1u << (i % 8));
            nz[k++] = w[i];
        }
    }
    if (dtype == PS__DTYPE__DTYPE_F32)
        memcpy(vals, nz, nnz * sizeof(float));
    else
        ps_f32_to_half_n(dtype, nz, vals, nnz);
    free(nz);
    rep->mask = mask;
    rep->mask_bytes = mbytes;
    rep->vals = vals;
    rep->vals_bytes = nnz * esize;
    return 1;
}

/* Whether a reply of `bytes` values of t goes out from the table itself
 * (psd_table_lend): f32 replies large enough that a copy would cost more
 * than the bookkeeping, when the table's copy-on-write budget allows
 * (psd_table_may_lend). Writes to other elements do not copy: a worker's
 * chunked push-pulls write the next chunk while the last one's reply is
 * still going out. */
static int lend_ok(struct psd_table *t, const Ps__Header *req, size_t bytes)
{
    return req->dtype == PS__DTYPE__DTYPE_F32 && bytes >= PS_LEND_BYTES_MIN &&
           psd_table_may_lend(t, bytes);
}

/* dst, when not NULL: the values go there (a client's shared region), and
 * the reply carries none. */
static void reply_values(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t offset,
                         uint64_t count, int duplicate, int stale, unsigned char *dst,
                         struct psd_reply *rep)
{
    Ps__Header h;
    reply_init(&h, req);
    h.duplicate = duplicate != 0;
    h.stale = stale != 0;
    h.offset = offset;
    h.count = count;
    h.dim = 1;
    h.dtype = req->dtype;
    h.clock = psd_cons_clock(&s->cons, t);
    t->pulls++;
    const float *w = t->w + (offset - t->lo);
    if (dst != NULL) {
        memcpy(dst, w, (size_t)count * sizeof(float));
        s->shm.bytes_out += count * sizeof(float);
        h.shm = PS_SHM_OUT;
        h.shm_out = req->shm_out;
        reply_header(s, &h, rep);
        return;
    }
    if (req->nonzero_only && t->mask != NULL && reply_masked(w, (size_t)count, req->dtype, rep)) {
        h.layout = PS__LAYOUT__LAYOUT_MASK;
        reply_header(s, &h, rep);
        return;
    }
    size_t bytes = (size_t)count * ps_dtype_size(req->dtype);
    /* The reply points into the table when the sender copies it at once
     * (a frame this small), or it is lent (a later write copies the table
     * first); otherwise it gets a buffer of its own. */
    rep->vals_borrowed = req->dtype == PS__DTYPE__DTYPE_F32 && bytes < PS_ZEROCOPY_BYTES_MIN;
    if (rep->vals_borrowed || (lend_ok(t, req, bytes) &&
                               (rep->lent = psd_table_lend(t, offset, offset + count)) != NULL)) {
        rep->vals = (void *)w;
        rep->vals_bytes = bytes;
        reply_header(s, &h, rep);
        return;
    }
    void *out = aligned_alloc(64, (bytes + 63u) & ~(size_t)63u);
    if (out == NULL) {
        reply_errorf(s, req, PS_ENOMEM, rep, "%s: cannot allocate %zu reply bytes",
                     ps_op_name(req->op), bytes);
        return;
    }
    if (req->dtype == PS__DTYPE__DTYPE_F32)
        memcpy(out, w, bytes);
    else /* the table is f32; only the wire is 16-bit */
        ps_f32_to_half_n(req->dtype, w, out, (size_t)count);
    rep->vals = out;
    rep->vals_bytes = bytes;
    reply_header(s, &h, rep);
}

/* Answers a pull of [offset, offset+count) of t at `clock` by worker
 * (req's): the staleness it is admitted at, a rejoining worker joining at
 * a round boundary, then the values. The one place a pull is answered,
 * at once or after waiting. */
static void answer_pull(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t clock,
                        uint64_t offset, uint64_t count, int duplicate, int stale,
                        unsigned char *dst, struct psd_reply *rep)
{
    uint64_t low = psd_cons_clock(&s->cons, t);
    if (s->cons.mode == PSD_SSP && clock > low && clock - low > s->max_staleness)
        s->max_staleness = clock - low;
    psd_cons_pulled(&s->cons, t, req->worker_id, clock);
    reply_values(s, req, t, offset, count, duplicate, stale, dst, rep);
}

/* Header of a waiting request, enough for reply_init and error replies. */
static void wait_header(const struct psd_wait *w, Ps__Header *h)
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
static int shm_part(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                    uint32_t shm, uint32_t bit, uint64_t off, unsigned char **p,
                    struct psd_reply *rep)
{
    *p = NULL;
    if (!(shm & bit))
        return 0;
    size_t size = 0;
    uint64_t bytes = req->count * (bit == PS_SHM_KEYS ? sizeof(uint64_t) : sizeof(float));
    int rc = psd_shm_at(&s->shm, route->data, route->size, off, bytes, now_ms(), p, &size);
    if (rc == PS_ESHM)
        reply_errorf(s, req, rc, rep,
                     "%s: this connection has no shared memory region (none was bound, or it was "
                     "dropped): send the values in frames",
                     ps_op_name(req->op));
    else if (rc != 0)
        reply_errorf(s, req, rc, rep,
                     "%s: shared-memory %s [%llu, +%llu) is past the end of the region (%zu bytes)",
                     ps_op_name(req->op),
                     bit == PS_SHM_IN     ? "values"
                     : bit == PS_SHM_KEYS ? "keys"
                                          : "reply",
                     (unsigned long long)off, (unsigned long long)bytes, size);
    return rc;
}

/* Sends a reply through the sender at once, counting its bytes. */
static void send_now(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep)
{
    s->ctr.bytes_out += rep->hdr_len + rep->mask_bytes + rep->vals_bytes;
    s->send(s->send_ctx, route, route_len, rep);
}

/* Answers every waiting request that is ready now. */
static void release_waits(struct psd *s)
{
    for (uint32_t i = 0; i < s->nwaits;) {
        struct psd_wait *w = &s->waits[i];
        struct psd_table *t = s->tables[w->table_id];
        if (!psd_cons_ready(&s->cons, t, w->clock, w->offset, w->count)) {
            i++;
            continue;
        }
        Ps__Header h;
        wait_header(w, &h);
        struct psd_reply rep;
        memset(&rep, 0, sizeof rep);
        struct ps_frame route = {w->route, w->route_len};
        unsigned char *dst = NULL;
        if (shm_part(s, &route, &h, w->shm, PS_SHM_OUT, w->shm_out, &dst, &rep) == 0)
            answer_pull(s, &h, t, w->clock, w->offset, w->count, 0, 0, dst, &rep);
        fit_unread(s, w->route, w->route_len, &h, &rep);
        send_now(s, w->route, w->route_len, &rep);
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

static int defer(struct psd *s, const struct ps_frame *route, const Ps__Header *req, uint64_t clock,
                 struct psd_reply *rep)
{
    if (s->send == NULL || route->size > PS_ROUTE_ID_MAX) {
        reply_errorf(s, req, PS_EAGAIN, rep,
                     "%s: clock %llu is not ready and this server cannot wait", ps_op_name(req->op),
                     (unsigned long long)clock);
        return 1;
    }
    if (refresh_wait(s, route, req))
        return 0;
    char why[160];
    if (wait_refusal(s, route, req, clock, why, sizeof why) != NULL) {
        s->waits_refused++;
        reply_errorf(s, req, PS_ELIMIT, rep, "%s: clock %llu is not ready and may not wait: %s",
                     ps_op_name(req->op), (unsigned long long)clock, why);
        return 1;
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
    w->since_ms = now_ms();
    w->deadline_ms = w->since_ms + s->wait_timeout_ms;
    w->logged = 0;
    s->deferred_total++;
    return 0;
}

/* A push's gradient: in the region at shm_in when the request names it
 * there (shm_part), else its values frame as f32 (NULL: out of memory). */
static const float *push_values(struct psd *s, const struct ps_wire_msg *m,
                                const unsigned char *shm_in)
{
    if (shm_in == NULL)
        return values_f32(s, m);
    s->shm.bytes_in += m->hdr->count * sizeof(float);
    return (const float *)shm_in;
}

/* A push's gradient must be finite unless psd --allow-nonfinite: one NaN
 * or infinity would poison the weights for good (and in bsp the round's
 * average). n values; keys, when not NULL, name each row of dim values
 * (else they are elements from req's offset). 1 with an error reply
 * naming the table and the first bad element, 0 when it may be applied. */
static int refuse_nonfinite(struct psd *s, const Ps__Header *req, const struct psd_table *t,
                            const float *g, size_t n, const uint64_t *keys, uint32_t dim,
                            struct psd_reply *rep)
{
    size_t i = s->allow_nonfinite ? n : ps_first_nonfinite(g, n);
    if (i == n)
        return 0;
    s->nonfinite_refused++;
    char at[64];
    if (keys == NULL)
        snprintf(at, sizeof at, "element %llu", (unsigned long long)(req->offset + i));
    else if (dim == 1)
        snprintf(at, sizeof at, "key %llu", (unsigned long long)keys[i]);
    else
        snprintf(at, sizeof at, "key %llu, column %u", (unsigned long long)keys[i / dim],
                 (unsigned)(i % dim));
    reply_errorf(s, req, PS_EINVAL, rep,
                 "%s: the gradient of '%s' holds %g at %s: refused, nothing applied (psd "
                 "--allow-nonfinite takes such pushes)",
                 ps_op_name(req->op), t->name, (double)g[i], at);
    return 1;
}

/* n keys into the scratch array (NULL when it cannot grow). */
static uint64_t *keys_scratch(struct psd *s, size_t n)
{
    if (n > s->keys_cap) {
        uint64_t *p = realloc(s->keys_scratch, n * sizeof *p);
        if (p == NULL)
            return NULL;
        s->keys_scratch = p;
        s->keys_cap = n;
    }
    return s->keys_scratch;
}

/* The keys frame as aligned uint64s: the frame itself where it is aligned
 * on a little-endian host (zmq's large messages are), else a copy. */
static const uint64_t *keys_u64(struct psd *s, const struct ps_wire_msg *m)
{
    size_t n = (size_t)m->hdr->count;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (((uintptr_t)m->keys % _Alignof(uint64_t)) == 0)
        return m->keys;
#endif
    uint64_t *k = keys_scratch(s, n);
    for (size_t i = 0; k != NULL && i < n; i++)
        k[i] = ps_wire_key(m->keys, i);
    return k;
}

/* A keyed push's keys that lie in the client's region (PS_SHM_KEYS): copied
 * out first, since the client may write the region at any time, then
 * checked as the decoder checks a keys frame. NULL with an error reply. */
static const uint64_t *keys_from_region(struct psd *s, const struct ps_frame *route,
                                        const Ps__Header *req, struct psd_reply *rep)
{
    unsigned char *p = NULL;
    if (shm_part(s, route, req, req->shm, PS_SHM_KEYS, req->shm_keys, &p, rep) != 0)
        return NULL;
    size_t n = (size_t)req->count;
    uint64_t *k = keys_scratch(s, n);
    if (k == NULL) {
        reply_errorf(s, req, PS_ENOMEM, rep, "push: out of memory for %zu keys", n);
        return NULL;
    }
    /* copied and checked a block at a time, while the block is in L1 */
    enum { BLOCK = 2048 };
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK, from = i > 0 ? i - 1 : 0;
        memcpy(k + i, p + i * sizeof *k, m * sizeof *k);
        size_t b = ps_wire_keys_unordered(k + from, i + m - from); /* reads little-endian */
        if (b < i + m - from)
            bad = from + b;
    }
    if (bad < n) {
        reply_errorf(s, req, PS_EPROTO, rep,
                     "push: keys in shared memory must be strictly increasing: key[%zu]=%llu "
                     "after %llu",
                     bad, (unsigned long long)ps_wire_key(k, bad),
                     (unsigned long long)ps_wire_key(k, bad - 1));
        return NULL;
    }
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    for (size_t i = 0; i < n; i++)
        k[i] = le64toh(k[i]);
#endif
    s->shm.bytes_in += n * sizeof *k;
    return k;
}

/* Where a push that applies on arrival (asp/ssp) may be answered before
 * its optimizer step: its values are in the message, which stays psd's
 * until the dispatch returns, and not in the client's region, which the
 * client may write again once answered. The step then runs while the
 * answer crosses the wire and the client's next request comes in; no
 * request sees the table before it is done, since the loop runs one at a
 * time. */
static int ack_first(const struct psd *s, const Ps__Header *req)
{
    return s->send != NULL && !(req->shm & PS_SHM_IN);
}

/* A push's reply: its clock, and whether it was dropped as stale. */
static void push_reply(struct psd *s, const Ps__Header *req, struct psd_table *t, int stale,
                       struct psd_reply *rep)
{
    Ps__Header h;
    reply_init(&h, req);
    h.stale = stale != 0;
    h.clock = psd_cons_clock(&s->cons, t);
    reply_header(s, &h, rep);
}

/* Answers a push taken for later (never stale) through the sender, then
 * runs its optimizer step (see ack_first). The caller releases waits
 * after it and returns 0: nothing is left for the dispatch to send. */
static void answer_first(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                         struct psd_table *t, const struct psd_cons_later *later,
                         struct psd_reply *rep)
{
    push_reply(s, req, t, 0, rep);
    send_now(s, route->data, route->size, rep);
    psd_cons_apply_later(later);
}

/* A sparse push into a dense table: element indices as keys. Returns
 * psd_dispatch's "reply now". */
static int op_keys(struct psd *s, struct psd_table *t, const struct ps_frame *route,
                   const struct ps_wire_msg *m, struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    if (seen_push(s, req)) {
        reply_duplicate(s, req, rep);
        return 1;
    }
    unsigned char *shm_in = NULL;
    if (shm_part(s, route, req, req->shm, PS_SHM_IN, req->shm_in, &shm_in, rep) != 0)
        return 1;
    const uint64_t *keys = NULL;
    if (req->shm & PS_SHM_KEYS) {
        if ((keys = keys_from_region(s, route, req, rep)) == NULL)
            return 1;
    } else {
        keys = keys_u64(s, m);
    }
    const float *g = push_values(s, m, shm_in);
    if (keys == NULL || g == NULL) {
        reply_errorf(s, req, PS_ENOMEM, rep, "push: out of memory for %llu keys",
                     (unsigned long long)req->count);
        return 1;
    }
    if (refuse_nonfinite(s, req, t, g, (size_t)req->count, keys, 1, rep))
        return 1;
    uint64_t first = keys[0], last = keys[req->count - 1];
    if (first < t->lo || last >= t->hi) {
        reply_errorf(s, req, PS_ERANGE, rep,
                     "push: keys %llu..%llu are outside shard %u's range [%llu, %llu) of '%s'",
                     (unsigned long long)first, (unsigned long long)last, s->shard,
                     (unsigned long long)t->lo, (unsigned long long)t->hi, t->name);
        return 1;
    }
    int applied = 0;
    char err[PS_ERROR_TEXT_MAX];
    struct psd_cons_later later = {0};
    int rc =
        psd_cons_push_keys(&s->cons, t, req->worker_id, req->clock, keys, g, (size_t)req->count,
                           &applied, err, sizeof err, ack_first(s, req) ? &later : NULL);
    if (rc < 0) {
        reply_error(s, req, rc, err, rep);
        return 1;
    }
    t->pushes++;
    if (rc == PSD_CONS_STALE)
        note_stale(s, req, t);
    else
        applied_push(s, req);
    if (later.t != NULL)
        answer_first(s, route, req, t, &later, rep);
    if (applied)
        release_waits(s); /* before this reply's header: both are packed in s->hdr_buf */
    if (later.t != NULL)
        return 0;
    push_reply(s, req, t, rc == PSD_CONS_STALE, rep);
    return 1;
}

/* Pull, push or push-pull of rows of a sparse table. Sparse tables apply
 * pushes on arrival and answer pulls at once, whatever the mode. */
static void op_rows(struct psd *s, struct psd_table *t, const struct ps_wire_msg *m,
                    struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    if (req->layout != PS__LAYOUT__LAYOUT_KEYS || req->dim != t->dim) {
        reply_errorf(s, req, PS_EINVAL, rep,
                     "%s: table '%s' is sparse: send keys with dim %u (got layout %d, dim %u)",
                     ps_op_name(req->op), t->name, t->dim, (int)req->layout, req->dim);
        return;
    }
    const uint64_t *keys = keys_u64(s, m);
    if (keys == NULL) {
        reply_errorf(s, req, PS_ENOMEM, rep, "%s: out of memory for keys", ps_op_name(req->op));
        return;
    }
    size_t n = (size_t)req->count;
    for (size_t i = 0; i < n; i++) {
        uint32_t owner = ps_shard_of_key(keys[i], s->shards);
        if (owner != s->shard) {
            reply_errorf(s, req, PS_ERANGE, rep, "%s: key %llu of '%s' belongs to shard %u, not %u",
                         ps_op_name(req->op), (unsigned long long)keys[i], t->name, owner,
                         s->shard);
            return;
        }
    }
    char err[PS_ERROR_TEXT_MAX];
    int dup = req->op != PS__OP__OP_PULL && seen_push(s, req);
    if (dup && req->op == PS__OP__OP_PUSH) {
        reply_duplicate(s, req, rep);
        return;
    }
    if (req->op != PS__OP__OP_PULL && !dup) {
        const float *g = values_f32(s, m);
        if (g != NULL && refuse_nonfinite(s, req, t, g, (size_t)n * t->dim, keys, t->dim, rep))
            return;
        int rc = g == NULL ? PS_ENOMEM : psd_table_push_rows(t, keys, g, n, err, sizeof err);
        if (rc != 0) {
            reply_error(s, req, rc, g == NULL ? "out of memory" : err, rep);
            return;
        }
        t->pushes++;
        applied_push(s, req);
        if (req->worker_id < s->cons.workers && req->clock + 1 > t->completed[req->worker_id])
            t->completed[req->worker_id] = req->clock + 1;
    }
    Ps__Header h;
    reply_init(&h, req);
    h.duplicate = dup;
    if (req->op != PS__OP__OP_PUSH) {
        size_t elems = n * t->dim, esize = ps_dtype_size(req->dtype);
        /* f32 rows go straight into the reply; halves through a buffer */
        int f32 = req->dtype == PS__DTYPE__DTYPE_F32;
        void *out = aligned_alloc(64, (elems * esize + 63u) & ~(size_t)63u);
        float *rows = f32 ? out : malloc(elems * sizeof(float));
        int rc = rows && out ? psd_table_pull_rows(t, keys, n, rows, err, sizeof err) : PS_ENOMEM;
        if (rc == 0 && !f32)
            ps_f32_to_half_n(req->dtype, rows, out, elems);
        if (!f32)
            free(rows);
        if (rc != 0) {
            free(out);
            reply_error(s, req, rc, rc == PS_ENOMEM && !(rows && out) ? "out of memory" : err, rep);
            return;
        }
        t->pulls++;
        h.layout = PS__LAYOUT__LAYOUT_KEYS;
        h.count = req->count;
        h.dim = t->dim;
        h.dtype = req->dtype;
        rep->vals = out;
        rep->vals_bytes = elems * esize;
    }
    reply_header(s, &h, rep);
}

/* What a dense push did beyond its update, for the log: rounds a restored
 * table lost catching up, a pruning step. */
static void log_push(struct psd *s, const struct psd_table *t, uint64_t prune_updates,
                     uint64_t lost)
{
    if (t->rounds_lost != lost)
        PS_LOG(s->log, PS_LOG_WARN, "S0620",
               "'%s' restored at an older clock caught up with its workers at clock %llu: %llu "
               "round(s) of its updates were lost",
               t->name, (unsigned long long)t->clock, (unsigned long long)(t->rounds_lost - lost));
    if (t->prune_updates != prune_updates)
        PS_LOG(s->log, PS_LOG_INFO, "S0320",
               "pruned '%s' at step %llu: %llu of %llu weights (target now %.4f)", t->name,
               (unsigned long long)t->steps, (unsigned long long)t->npruned,
               (unsigned long long)(t->hi - t->lo), t->prune_target_now);
}

static int op_data(struct psd *s, const struct ps_frame *route, const struct ps_wire_msg *m,
                   struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    struct psd_table *t = check_range(s, req, rep);
    if (t == NULL)
        return 1;
    if (t->sparse && req->shm != 0) {
        reply_errorf(s, req, PS_ENOTSUP, rep,
                     "%s: values or keys in shared memory are for dense tables; '%s' is sparse",
                     ps_op_name(req->op), t->name);
        return 1;
    }
    if (t->sparse) {
        op_rows(s, t, m, rep);
        return 1;
    }
    if (req->layout == PS__LAYOUT__LAYOUT_KEYS)
        return op_keys(s, t, route, m, rep);
    unsigned char *shm_in, *shm_out;
    if (shm_part(s, route, req, req->shm, PS_SHM_IN, req->shm_in, &shm_in, rep) != 0 ||
        shm_part(s, route, req, req->shm, PS_SHM_OUT, req->shm_out, &shm_out, rep) != 0)
        return 1;
    int applied = 0;
    uint64_t prune_updates = t->prune_updates, lost = t->rounds_lost;
    /* a retried push is acknowledged; a retried push-pull is answered again;
     * neither is applied twice */
    int dup = req->op != PS__OP__OP_PULL && seen_push(s, req);
    if (dup && req->op == PS__OP__OP_PUSH) {
        reply_duplicate(s, req, rep);
        return 1;
    }
    int stale = 0;
    struct psd_cons_later later = {0};
    if (req->op != PS__OP__OP_PULL && !dup) {
        const float *g = push_values(s, m, shm_in);
        if (g != NULL && refuse_nonfinite(s, req, t, g, (size_t)req->count, NULL, 1, rep))
            return 1;
        char err[PS_ERROR_TEXT_MAX];
        int rc = g == NULL ? PS_ENOMEM
                           : psd_cons_push(&s->cons, t, req->worker_id, req->clock, req->offset,
                                           req->count, g, req->continues, &applied, err, sizeof err,
                                           req->op == PS__OP__OP_PUSH && ack_first(s, req) ? &later
                                                                                           : NULL);
        if (rc < 0) {
            reply_error(s, req, rc, g == NULL ? "out of memory" : err, rep);
            return 1;
        }
        t->pushes++;
        stale = rc == PSD_CONS_STALE;
        if (stale)
            note_stale(s, req, t);
        else
            applied_push(s, req);
    }
    if (later.t != NULL)
        answer_first(s, route, req, t, &later, rep);
    log_push(s, t, prune_updates, lost);
    if (applied)
        release_waits(s); /* before this reply's header: both are packed in s->hdr_buf */
    if (later.t != NULL)
        return 0;
    if (req->op == PS__OP__OP_PUSH) {
        push_reply(s, req, t, stale, rep);
        return 1;
    }
    /* push-pull asks for the weights after its own clock's update */
    uint64_t clock = req->op == PS__OP__OP_PUSH_PULL ? req->clock + 1 : req->clock;
    if (!psd_cons_ready(&s->cons, t, clock, req->offset, req->count))
        return defer(s, route, req, clock, rep);
    answer_pull(s, req, t, clock, req->offset, req->count, dup, stale, shm_out, rep);
    return 1;
}

/* Writes a checkpoint (the shard is between rounds); out gets the path
 * written, or the error. */
static int write_checkpoint(struct psd *s, const char *why, char *out, size_t outlen)
{
    char path[4200], err[512];
    uint64_t t0 = now_ms();
    int rc = psd_checkpoint_write(s, s->ckpt_dir, path, sizeof path, err, sizeof err);
    s->ckpt_last_ms = now_ms();
    if (rc != 0) {
        PS_LOG(s->log, PS_LOG_ERROR, "S0602", "%s", err);
        snprintf(out, outlen, "%s", err);
        return rc;
    }
    s->ckpt_written++;
    s->ckpt_ok_ms = s->ckpt_current_ms = s->ckpt_last_ms;
    s->ckpt_state = psd_state_version(s);
    s->ckpt_pending = 0;
    PS_LOG(s->log, PS_LOG_INFO, "S0600", "checkpoint %s written (%s, %u tables, %llu ms)", path,
           why, s->ntables, (unsigned long long)(s->ckpt_last_ms - t0));
    snprintf(out, outlen, "%s", path);
    snprintf(s->ckpt_path, sizeof s->ckpt_path, "%s", path);
    return 0;
}

int psd_checkpoint_now(struct psd *s, const char *why)
{
    if (s->ckpt_dir == NULL || !psd_quiescent(s))
        return 1;
    char out[4300];
    return write_checkpoint(s, why, out, sizeof out);
}

uint64_t psd_state_version(const struct psd *s)
{
    uint64_t v = s->changes; /* each term only grows: a change moves the sum */
    for (uint32_t i = 0; i < s->ntables; i++)
        v += s->tables[i]->steps + s->tables[i]->clock;
    return v;
}

void psd_checkpoint_mark_saved(struct psd *s)
{
    s->ckpt_state = psd_state_version(s);
    s->ckpt_last_ms = s->ckpt_current_ms = now_ms();
}

/* Due by the interval: written at the first moment the shard is between
 * rounds (checked after every request and on every tick), and only when
 * the state differs from the newest checkpoint's: an idle shard, or one
 * that has no tables yet, writes nothing. */
static void checkpoint_if_due(struct psd *s)
{
    if (s->ckpt_dir == NULL)
        return;
    if (s->ckpt_pending) {
        psd_checkpoint_now(s, "asked for");
    } else if (s->ckpt_every_ms > 0 && now_ms() - s->ckpt_last_ms >= s->ckpt_every_ms) {
        if (psd_state_version(s) == s->ckpt_state) {
            s->ckpt_last_ms = now_ms();
            if (s->ckpt_written)
                s->ckpt_current_ms = s->ckpt_last_ms;
        } else {
            psd_checkpoint_now(s, "interval");
        }
    }
}

/* psctl checkpoint: now, or (bsp, mid-round) at the end of the round. */
static void op_checkpoint(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    if (s->ckpt_dir == NULL) {
        reply_errorf(s, req, PS_ENOTSUP, rep, "checkpoint: shard %u runs without --checkpoint-dir",
                     s->shard);
        return;
    }
    char detail[4400];
    uint64_t age = now_ms() - s->ckpt_ok_ms;
    if (s->ckpt_written > 0 && age < PS_CHECKPOINT_ASK_MIN_MS) {
        snprintf(detail, sizeof detail,
                 "%s, written %llu ms ago, stands (at most one asked-for checkpoint every %u ms)",
                 s->ckpt_path, (unsigned long long)age, PS_CHECKPOINT_ASK_MIN_MS);
    } else if (psd_quiescent(s)) {
        int rc = write_checkpoint(s, "asked for", detail, sizeof detail);
        if (rc != 0) {
            reply_errorf(s, req, rc, rep, "checkpoint: %s", detail);
            return;
        }
    } else {
        s->ckpt_pending = 1;
        snprintf(detail, sizeof detail, "a round is in progress: written when it ends");
    }
    Ps__Header h;
    reply_init(&h, req);
    h.detail = detail;
    reply_header(s, &h, rep);
}

void psd_tick(struct psd *s)
{
    checkpoint_if_due(s);
    uint64_t now = now_ms();
    drop_silent(s, now);
    psd_shm_expire(&s->shm, now);
    for (uint32_t i = 0; i < s->nwaits;) {
        struct psd_wait *w = &s->waits[i];
        struct psd_table *t = s->tables[w->table_id];
        char missing[128];
        psd_cons_missing(&s->cons, t, w->clock, missing, sizeof missing);
        if (missing[0] == '\0') /* no member holds it back: none is left to move the rounds */
            snprintf(
                missing, sizeof missing,
                "none (no worker of the round is left to reach it; the table is at clock %llu)",
                (unsigned long long)psd_cons_clock(&s->cons, t));
        if (now >= w->deadline_ms) {
            Ps__Header h;
            wait_header(w, &h);
            struct psd_reply rep;
            memset(&rep, 0, sizeof rep);
            reply_errorf(s, &h, PS_ETIMEDOUT, &rep,
                         "%s of '%s' at clock %llu waited %llu ms; workers not there yet: %s",
                         ps_op_name(w->op), t->name, (unsigned long long)w->clock,
                         (unsigned long long)(now - w->since_ms), missing);
            s->wait_timeouts++;
            send_now(s, w->route, w->route_len, &rep);
            s->waits[i] = s->waits[--s->nwaits];
            continue;
        }
        if (!w->logged && now - w->since_ms >= 5000) {
            w->logged = 1;
            PS_LOG(s->log, PS_LOG_WARN, "S0400",
                   "worker %u's %s of '%s' at clock %llu has waited %llu ms for workers %s",
                   w->worker_id, ps_op_name(w->op), t->name, (unsigned long long)w->clock,
                   (unsigned long long)(now - w->since_ms), missing);
        }
        i++;
    }
}

uint64_t psd_worker_clock(const struct psd *s, uint32_t w)
{
    uint64_t c = s->ntables ? UINT64_MAX : 0;
    for (uint32_t i = 0; i < s->ntables; i++)
        if (s->tables[i]->completed[w] < c)
            c = s->tables[i]->completed[w];
    return c;
}

double psd_checkpoint_age_s(const struct psd *s)
{
    return s->ckpt_written ? (double)(now_ms() - s->ckpt_current_ms) / 1e3 : -1.0;
}

static void op_stats(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    static const size_t cap = PS_TABLES_MAX;
    Ps__TableStats *ts = calloc(cap, sizeof *ts);
    Ps__TableStats **tp = calloc(cap, sizeof *tp);
    if (ts == NULL || tp == NULL) {
        free(ts);
        free(tp);
        reply_errorf(s, req, PS_ENOMEM, rep, "stats: out of memory");
        return;
    }
    uint64_t bytes_held = 0;
    for (uint32_t i = 0; i < s->ntables; i++) {
        const struct psd_table *t = s->tables[i];
        ps__table_stats__init(&ts[i]);
        ts[i].name = (char *)t->name;
        ts[i].id = t->id;
        ts[i].size = t->size;
        ts[i].lo = t->lo;
        ts[i].hi = t->hi;
        ts[i].pushes = t->pushes;
        ts[i].pulls = t->pulls;
        ts[i].updates = t->steps;
        ts[i].clock = psd_cons_clock(&s->cons, t);
        ts[i].sparsity = psd_table_zero_share(s->tables[i], now_ms());
        ts[i].prune_target = t->prune_target_now;
        ts[i].rows = t->sparse ? t->sp.nrows : 0;
        ts[i].rounds_lost = t->rounds_lost;
        ts[i].sparse = t->sparse != 0;
        ts[i].dim = t->dim;
        ts[i].rows_max = t->rows_max;
        ts[i].optimizer = (char *)psd_optimizer_name(t->optimizer);
        bytes_held += psd_table_bytes_held(t);
        tp[i] = &ts[i];
    }
    Ps__Stats st;
    ps__stats__init(&st);
    st.shard = s->shard;
    st.shards = s->shards;
    st.requests = s->ctr.requests;
    st.errors = s->ctr.errors;
    st.bytes_in = s->ctr.bytes_in;
    st.bytes_out = s->ctr.bytes_out;
    st.uptime_s = (double)(uv_hrtime() - s->start_ns) / 1e9;
    st.n_tables = s->ntables;
    st.tables = tp;
    char mode[32];
    psd_cons_name(&s->cons, mode, sizeof mode);
    st.consistency = mode;
    st.workers = s->cons.workers;
    st.waiting = s->nwaits;
    st.deferred_total = s->deferred_total;
    st.max_staleness = s->max_staleness;
    st.wait_timeouts = s->wait_timeouts;
    st.duplicates_dropped = s->duplicates_dropped;
    st.live_workers = psd_live_count(s);
    st.workers_dropped = s->workers_dropped;
    st.workers_rejoined = s->workers_rejoined;
    st.stale_pushes = s->stale_pushes;
    st.worker_timeout_ms = s->worker_timeout_ms;
    st.checkpoints_written = s->ckpt_written;
    st.checkpoint_age_s = psd_checkpoint_age_s(s);
    st.bytes_held = bytes_held;
    st.shm_regions = psd_shm_bound(&s->shm);
    st.unread_refused = s->unread_refused;
    st.waits_refused = s->waits_refused;
    st.nonfinite_refused = s->nonfinite_refused;
    st.hellos_refused = s->hellos_refused;
    st.unread_bytes = psd_unread_total(s);
    uint32_t *missing = calloc(s->cons.workers, sizeof *missing);
    for (uint32_t w = 0; missing != NULL && w < s->cons.workers; w++)
        if (!s->live[w].live)
            missing[st.n_missing_workers++] = w;
    st.missing_workers = missing;
    uint64_t *wc = calloc(s->cons.workers, sizeof *wc);
    if (wc != NULL) {
        for (uint32_t w = 0; w < s->cons.workers; w++)
            wc[w] = psd_worker_clock(s, w);
        st.n_worker_clocks = s->cons.workers;
        st.worker_clocks = wc;
    }
    Ps__Header h;
    reply_init(&h, req);
    h.stats = &st;
    reply_header(s, &h, rep);
    free(ts);
    free(tp);
    free(wc);
    free(missing);
}

/* A page of a sparse table's rows, in the shard's order (rows are only
 * ever added, at the end, so pages of a live table do not shift): keys,
 * then their f32 weights. */
static void op_list_rows(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    if (req->table_id >= s->ntables) {
        reply_errorf(s, req, PS_ENOTABLE, rep, "rows: no table with id %u (this shard has %u)",
                     req->table_id, s->ntables);
        return;
    }
    const struct psd_table *t = s->tables[req->table_id];
    const struct psd_sparse *sp = &t->sp;
    if (!t->sparse) {
        reply_errorf(s, req, PS_EINVAL, rep, "rows: table '%s' is dense: pull its range", t->name);
        return;
    }
    if (req->offset > sp->nrows) {
        reply_errorf(s, req, PS_ERANGE, rep, "rows: offset %llu past the %llu rows of '%s'",
                     (unsigned long long)req->offset, (unsigned long long)sp->nrows, t->name);
        return;
    }
    uint64_t n = sp->nrows - req->offset, wide = PS_ROWS_PAGE_BYTES / (t->dim * 4u);
    if (n > req->count)
        n = req->count;
    if (n > wide)
        n = wide;
    rep->mask = malloc(n ? n * 8u : 1);
    rep->vals = malloc(n ? n * t->dim * 4u : 1);
    if (rep->mask == NULL || rep->vals == NULL) {
        psd_reply_drop(rep);
        reply_errorf(s, req, PS_ENOMEM, rep, "rows: out of memory for %llu rows",
                     (unsigned long long)n);
        return;
    }
    rep->mask_bytes = n * 8u;
    rep->vals_bytes = n * t->dim * 4u;
    unsigned char *k = rep->mask;
    for (uint64_t i = 0; i < n; i++) { /* little-endian on the wire */
        uint64_t le = htole64(sp->row_key[req->offset + i]);
        memcpy(k + i * 8u, &le, 8);
    }
    if (n > 0) /* a table with no rows yet has no row storage (w is NULL) */
        memcpy(rep->vals, sp->w + req->offset * t->dim, rep->vals_bytes);
    Ps__Header h;
    reply_init(&h, req);
    h.offset = req->offset;
    h.count = n;
    h.dim = t->dim;
    h.dtype = PS__DTYPE__DTYPE_F32;
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.rows = sp->nrows;
    reply_header(s, &h, rep);
}

static int dispatch_one(struct psd *s, const struct ps_frame *route, const char *user,
                        const struct ps_frame *frames, size_t nframes, struct psd_reply *rep,
                        int in_batch);

/* OP_BATCH: each record handled as a request of its own, in order, and
 * answered through the sender (a record may wait like any request). */
static void op_batch(struct psd *s, const struct ps_frame *route, const struct ps_wire_msg *m)
{
    const uint8_t *recs = m->batch; /* in the message, not the arena each record reuses */
    size_t bytes = m->batch_bytes, pos = 0;
    struct ps_frame one;
    while (ps_wire_batch_next(recs, bytes, &pos, &one)) {
        struct psd_reply r;
        if (dispatch_one(s, route, NULL, &one, 1, &r, 1)) /* no hello in a batch */
            s->send(s->send_ctx, route->data, route->size, &r);
    }
}

static int dispatch_one(struct psd *s, const struct ps_frame *route, const char *user,
                        const struct ps_frame *frames, size_t nframes, struct psd_reply *rep,
                        int in_batch)
{
    memset(rep, 0, sizeof *rep);
    s->ctr.requests++;
    for (size_t i = 0; i < nframes && i <= PS_FRAMES_MAX && !in_batch; i++)
        s->ctr.bytes_in += frames[i].size;
    struct ps_wire_msg m;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_decode(&s->arena, frames, nframes, PS_WIRE_REQUEST, s->value_bytes_max, &m,
                            err, sizeof err);
    int now = 1;
    s->ctr.by_op[psd_op_index(m.hdr)]++;
    if (rc != 0) {
        reply_error(s, m.hdr, rc, err, rep);
    } else if (in_batch && !ps_wire_op_moves_data(m.hdr->op)) {
        reply_errorf(s, m.hdr, PS_EOP, rep, "%s: only pull, push and push_pull go in a batch",
                     ps_op_name(m.hdr->op));
    } else if (m.hdr->op == PS__OP__OP_BATCH && s->send == NULL) {
        reply_errorf(s, m.hdr, PS_EOP, rep, "batch: this shard cannot answer batches");
    } else if (m.hdr->op == PS__OP__OP_HELLO && hello_refused(s, route, user, m.hdr, rep)) {
        /* not heard as the worker it claims: its holder keeps the id */
    } else {
        const Ps__Header *req = m.hdr;
        worker_heard(s, req);
        switch (req->op) {
        case PS__OP__OP_HELLO:
            op_hello(s, route, user, req, rep);
            break;
        case PS__OP__OP_CREATE_TABLE:
            op_create(s, req, rep);
            break;
        case PS__OP__OP_PULL:
        case PS__OP__OP_PUSH:
        case PS__OP__OP_PUSH_PULL:
            now = op_data(s, route, &m, rep);
            break;
        case PS__OP__OP_STATS:
            op_stats(s, req, rep);
            break;
        case PS__OP__OP_CHECKPOINT:
            op_checkpoint(s, req, rep);
            break;
        case PS__OP__OP_ROWS:
            op_list_rows(s, req, rep);
            break;
        case PS__OP__OP_HEARTBEAT:
            now = 0; /* noted by worker_heard; never answered */
            break;
        case PS__OP__OP_BATCH:
            op_batch(s, route, &m);
            now = 0; /* each request in it was answered */
            break;
        default:
            reply_errorf(s, req, PS_EOP, rep, "unknown op %d", (int)req->op);
            break;
        }
    }
    if (now && rc == 0)
        fit_unread(s, route->data, route->size, m.hdr, rep);
    if (now)
        s->ctr.bytes_out += rep->hdr_len + rep->mask_bytes + rep->vals_bytes;
    return now;
}

int psd_dispatch_from(struct psd *s, const struct ps_frame *route, const char *user,
                      const struct ps_frame *frames, size_t nframes, struct psd_reply *rep)
{
    int now = dispatch_one(s, route, user, frames, nframes, rep, 0);
    checkpoint_if_due(s);
    return now;
}

int psd_dispatch(struct psd *s, const struct ps_frame *route, const struct ps_frame *frames,
                 size_t nframes, struct psd_reply *rep)
{
    return psd_dispatch_from(s, route, NULL, frames, nframes, rep);
}
