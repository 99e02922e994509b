/* psd's core: its lifetime, the periodic tick, and dispatch of a
 * request to the op that serves it. Transport-free: net.c feeds it frames
 * and sends what it answers (psd.h). */
#include "psd_impl.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_local.h"
#include "ps_pool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    s->start_ns = (uint64_t)ps_mono_ns();
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

int psd_shm_take(struct psd *s, uint64_t token, void *base, size_t size)
{
    return psd_shm_offer(&s->shm, token, base, size, (uint64_t)ps_mono_ms());
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

int psd_op_index(const Ps__Header *h)
{
    return h != NULL && h->op > 0 && h->op < PSD_OPS_COUNT ? (int)h->op : PSD_OPS_COUNT;
}

void psd_tick(struct psd *s)
{
    psd_checkpoint_if_due(s);
    uint64_t now = (uint64_t)ps_mono_ms();
    psd_drop_silent(s, now);
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
            psd_wait_header(w, &h);
            struct psd_reply rep;
            memset(&rep, 0, sizeof rep);
            psd_reply_errorf(s, &h, PS_ETIMEDOUT, &rep,
                             "%s of '%s' at clock %llu waited %llu ms; workers not there yet: %s",
                             ps_op_name(w->op), t->name, (unsigned long long)w->clock,
                             (unsigned long long)(now - w->since_ms), missing);
            s->wait_timeouts++;
            psd_send_now(s, w->route, w->route_len, &rep);
            s->waits[i] = s->waits[--s->nwaits];
            continue;
        }
        if (!w->logged && now - w->since_ms >= 5000) {
            w->logged = 1;
            PS_LOG(s->log, PS_LOG_WARN, S0400,
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

static enum psd_answer dispatch_one(struct psd *s, const struct ps_frame *route, const char *user,
                                    const struct ps_frame *frames, size_t nframes,
                                    struct psd_reply *rep, int in_batch);

/* OP_BATCH: each record handled as a request of its own, in order, and
 * answered through the sender (a record may wait like any request). */
static void op_batch(struct psd *s, const struct ps_frame *route, const struct ps_wire_msg *m)
{
    const uint8_t *recs = m->batch; /* in the message, not the arena each record reuses */
    size_t bytes = m->batch_bytes, pos = 0;
    struct ps_frame one;
    while (ps_wire_batch_next(recs, bytes, &pos, &one)) {
        struct psd_reply r;
        if (dispatch_one(s, route, NULL, &one, 1, &r, 1) ==
            PSD_ANSWER_NOW) /* no hello in a batch */
            s->send(s->send_ctx, route->data, route->size, &r);
    }
}

static enum psd_answer dispatch_one(struct psd *s, const struct ps_frame *route, const char *user,
                                    const struct ps_frame *frames, size_t nframes,
                                    struct psd_reply *rep, int in_batch)
{
    memset(rep, 0, sizeof *rep);
    s->ctr.requests++;
    for (size_t i = 0; i < nframes && i <= PS_FRAMES_MAX && !in_batch; i++)
        s->ctr.bytes_in += frames[i].size;
    struct ps_wire_msg m;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_decode(&s->arena, frames, nframes, PS_WIRE_REQUEST, s->value_bytes_max, &m,
                            err, sizeof err);
    enum psd_answer now = PSD_ANSWER_NOW;
    s->ctr.by_op[psd_op_index(m.hdr)]++;
    if (rc != 0) {
        psd_reply_error(s, m.hdr, rc, err, rep);
    } else if (in_batch && !ps_wire_op_moves_data(m.hdr->op)) {
        psd_reply_errorf(s, m.hdr, PS_EOP, rep, "%s: only pull, push and push_pull go in a batch",
                         ps_op_name(m.hdr->op));
    } else if (m.hdr->op == PS__OP__OP_BATCH && s->send == NULL) {
        psd_reply_errorf(s, m.hdr, PS_EOP, rep, "batch: this shard cannot answer batches");
    } else if (m.hdr->op == PS__OP__OP_HELLO && psd_hello_refused(s, route, user, m.hdr, rep)) {
        /* not heard as the worker it claims: its holder keeps the id */
    } else {
        const Ps__Header *req = m.hdr;
        psd_worker_heard(s, req);
        switch (req->op) {
        case PS__OP__OP_HELLO:
            psd_op_hello(s, route, user, req, rep);
            break;
        case PS__OP__OP_CREATE_TABLE:
            psd_op_create(s, req, rep);
            break;
        case PS__OP__OP_PULL:
        case PS__OP__OP_PUSH:
        case PS__OP__OP_PUSH_PULL:
            now = psd_op_data(s, route, &m, rep);
            break;
        case PS__OP__OP_STATS:
            psd_op_stats(s, req, rep);
            break;
        case PS__OP__OP_CHECKPOINT:
            psd_op_checkpoint(s, req, rep);
            break;
        case PS__OP__OP_SET:
            psd_op_set(s, &m, rep);
            break;
        case PS__OP__OP_ROWS:
            psd_op_list_rows(s, req, rep);
            break;
        case PS__OP__OP_HEARTBEAT:
            now = PSD_ANSWER_LATER; /* noted by worker_heard; never answered */
            break;
        case PS__OP__OP_BATCH:
            op_batch(s, route, &m);
            now = PSD_ANSWER_LATER; /* each request in it was answered */
            break;
        case PS__OP__OP_FOLLOW:
        case PS__OP__OP_REPLICATE: /* the transport takes them where replicas run (repl.h) */
            psd_reply_errorf(s, req, PS_ENOTSUP, rep,
                             "%s: this shard runs without replicas (psd --etcd)",
                             ps_op_name(req->op));
            break;
        default:
            psd_reply_errorf(s, req, PS_EOP, rep, "unknown op %d", (int)req->op);
            break;
        }
    }
    if (now == PSD_ANSWER_NOW && rc == 0)
        psd_fit_unread(s, route->data, route->size, m.hdr, rep);
    if (now == PSD_ANSWER_NOW)
        s->ctr.bytes_out += rep->hdr_len + rep->mask_bytes + rep->vals_bytes;
    return now;
}

enum psd_answer psd_dispatch_from(struct psd *s, const struct ps_frame *route, const char *user,
                                  const struct ps_frame *frames, size_t nframes,
                                  struct psd_reply *rep)
{
    enum psd_answer now = dispatch_one(s, route, user, frames, nframes, rep, 0);
    psd_checkpoint_if_due(s);
    return now;
}

enum psd_answer psd_dispatch(struct psd *s, const struct ps_frame *route,
                             const struct ps_frame *frames, size_t nframes, struct psd_reply *rep)
{
    return psd_dispatch_from(s, route, NULL, frames, nframes, rep);
}
