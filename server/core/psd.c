/* psd's core: a shard's lifetime, the periodic tick, and dispatch of a
 * request to the op that serves it. Transport-free: net.c feeds it frames
 * and sends what it answers (psd.h). The top of the core's stack: the
 * parts below never call back into it. */
#include "psd.h"

#include "admin.h"
#include "catalog.h"
#include "checkpoint.h"
#include "counters.h"
#include "dedup.h"
#include "hooks.h"
#include "live.h"
#include "ops.h"
#include "regions.h"
#include "reply.h"
#include "waits.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_local.h"
#include "ps_pool.h"

#include <stdlib.h>
#include <string.h>

/* The dispatcher's own part: the arena each request's header is decoded
 * into (reset per request). */
struct psd_dispatch {
    struct ps_arena arena;
    unsigned char buf[PS_ARENA_BYTES_SERVER];
};

/* conf is const to every other file; this is the one place it is set. */
static void set_conf(struct psd *s, struct ps_log *log, const struct psd_params *p)
{
    struct psd_conf c;
    memset(&c, 0, sizeof c);
    c.log = log;
    c.pool = p->pool;
    c.shard = p->shard;
    c.shards = p->shards;
    c.value_bytes_max = p->value_bytes_max;
    c.cons = p->cons;
    if (c.cons.workers == 0)
        c.cons.workers = 1;
    c.table_bytes_max = p->table_bytes_max ? p->table_bytes_max : PS_TABLE_BYTES_DEFAULT;
    c.nprunes = p->nprunes < PSD_PRUNE_SPECS_MAX ? p->nprunes : PSD_PRUNE_SPECS_MAX;
    if (c.nprunes > 0)
        memcpy(c.prunes, p->prunes, c.nprunes * sizeof *c.prunes);
    c.allow_nonfinite = p->allow_nonfinite;
    c.instance = ps_random_id();
    c.start_ns = (uint64_t)ps_mono_ns();
    memcpy((void *)&s->conf, &c, sizeof c);
}

int psd_init(struct psd *s, struct ps_log *log, const struct psd_params *p)
{
    memset(s, 0, sizeof *s);
    set_conf(s, log, p);
    const struct psd_conf *c = &s->conf;
    s->ctr = psd_counters_create();
    s->hooks = psd_hooks_create();
    s->out = psd_replies_create(p->unread_bytes_max, p->unread_bytes_total_max);
    s->cat = psd_catalog_create();
    s->dedup = psd_dedup_create();
    s->waits = psd_waits_create(p->wait_timeout_ms);
    s->live = psd_live_create(c->cons.workers, p->worker_timeout_ms);
    s->ops = psd_ops_create();
    s->save = psd_autosave_create(p->checkpoint_dir, p->checkpoint_every_ms);
    s->shm = psd_regions_create();
    s->in = malloc(sizeof *s->in);
    if (!s->ctr || !s->hooks || !s->out || !s->cat || !s->dedup || !s->waits || !s->live ||
        !s->ops || !s->save || !s->shm || !s->in) {
        psd_fini(s);
        return PS_ENOMEM;
    }
    ps_arena_init(&s->in->arena, s->in->buf, sizeof s->in->buf);
    return 0;
}

void psd_fini(struct psd *s)
{
    if (s->save != NULL)
        psd_checkpoint_reap(s, 1); /* a forked writer: waited for, not left behind */
    if (s->cat != NULL)
        psd_tables_reset(s);
    ps_pool_stop(s->conf.pool);
    psd_catalog_destroy(s->cat);
    psd_counters_destroy(s->ctr);
    psd_hooks_destroy(s->hooks);
    psd_replies_destroy(s->out);
    psd_dedup_destroy(s->dedup);
    psd_waits_destroy(s->waits);
    psd_live_destroy(s->live);
    psd_ops_destroy(s->ops);
    psd_autosave_destroy(s->save);
    psd_regions_destroy(s->shm);
    free(s->in);
    struct psd_conf c = s->conf;
    memset(s, 0, sizeof *s);
    c.pool = NULL; /* stopped */
    memcpy((void *)&s->conf, &c, sizeof c);
}

void psd_reset_state(struct psd *s)
{
    psd_tables_reset(s);
    psd_dedup_reset(s);
    psd_live_reset(s);
    psd_waits_clear(s); /* their connections are another process's */
    psd_count_change(s);
}

int psd_shm_take(struct psd *s, uint64_t token, void *base, size_t size)
{
    return psd_regions_offer(s->shm, token, base, size, (uint64_t)ps_mono_ms());
}

void psd_take_over(struct psd *s, uint64_t worker_timeout_ms)
{
    psd_set_worker_timeout(s, worker_timeout_ms);
    psd_live_heard_all(s);
    psd_waits_clear(s);
}

void psd_tick_at(struct psd *s, uint64_t now)
{
    psd_age_clock(s, now);
    psd_checkpoint_reap(s, 0);
    psd_checkpoint_if_due(s, now);
    psd_live_drop_silent(s, now);
    psd_regions_expire(s->shm, now);
    psd_waits_expire(s, now);
}

void psd_tick(struct psd *s)
{
    psd_tick_at(s, (uint64_t)ps_mono_ms());
}

static enum psd_answer dispatch_one(struct psd *s, const struct ps_frame *route, const char *user,
                                    const struct ps_frame *frames, size_t nframes,
                                    struct psd_reply *rep, int in_batch, int replaying);

/* OP_BATCH: each record handled as a request of its own, in order, and
 * answered through the sender (a record may wait like any request). */
static void op_batch(struct psd *s, const struct ps_frame *route, const struct ps_wire_msg *m,
                     int replaying)
{
    const uint8_t *recs = m->batch; /* in the message, not the arena each record reuses */
    size_t bytes = m->batch_bytes, pos = 0;
    struct ps_frame one;
    while (ps_wire_batch_next(recs, bytes, &pos, &one)) {
        struct psd_reply r;
        if (dispatch_one(s, route, NULL, &one, 1, &r, 1, replaying) ==
            PSD_ANSWER_NOW) /* no hello in a batch; dispatch_one counted its bytes */
            psd_reply_deliver(s, route->data, route->size, &r);
    }
}

/* The op of a request that decoded and may go on. */
static enum psd_answer run_op(struct psd *s, const struct ps_frame *route, const char *user,
                              const struct ps_wire_msg *m, struct psd_reply *rep, int replaying)
{
    const Ps__Header *req = m->hdr;
    switch (req->op) {
    case PS__OP__OP_HELLO:
        psd_op_hello(s, route, user, req, rep);
        return PSD_ANSWER_NOW;
    case PS__OP__OP_CREATE_TABLE:
        psd_op_create(s, req, rep);
        return PSD_ANSWER_NOW;
    case PS__OP__OP_PULL:
    case PS__OP__OP_PUSH:
    case PS__OP__OP_PUSH_PULL:
        return psd_op_data(s, route, m, rep);
    case PS__OP__OP_STATS:
        psd_op_stats(s, req, rep);
        return PSD_ANSWER_NOW;
    case PS__OP__OP_CHECKPOINT:
        psd_op_checkpoint(s, req, rep);
        return PSD_ANSWER_NOW;
    case PS__OP__OP_SET:
        psd_op_set(s, m, rep);
        return PSD_ANSWER_NOW;
    case PS__OP__OP_ROWS:
        psd_op_list_rows(s, req, rep);
        return PSD_ANSWER_NOW;
    case PS__OP__OP_HEARTBEAT:
        return PSD_ANSWER_LATER; /* noted by psd_live_heard; never answered */
    case PS__OP__OP_BATCH:
        op_batch(s, route, m, replaying);
        return PSD_ANSWER_LATER; /* each request in it was answered */
    case PS__OP__OP_FOLLOW:
    case PS__OP__OP_REPLICATE: /* the transport takes them where replicas run (repl.h) */
    case PS__OP__OP_RECOVER:
        psd_reply_errorf(s, req, PS_ENOTSUP, rep,
                         "%s: this shard runs without replicas (psd --etcd)", ps_op_name(req->op));
        return PSD_ANSWER_NOW;
    default:
        psd_reply_errorf(s, req, PS_EOP, rep, "unknown op %d", (int)req->op);
        return PSD_ANSWER_NOW;
    }
}

static enum psd_answer dispatch_one(struct psd *s, const struct ps_frame *route, const char *user,
                                    const struct ps_frame *frames, size_t nframes,
                                    struct psd_reply *rep, int in_batch, int replaying)
{
    memset(rep, 0, sizeof *rep);
    for (size_t i = 0; i < nframes && i <= PS_FRAMES_MAX && !in_batch; i++)
        psd_count_bytes_in(s, frames[i].size);
    struct ps_wire_msg m;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_decode(&s->in->arena, frames, nframes, PS_WIRE_REQUEST,
                            s->conf.value_bytes_max, &m, err, sizeof err);
    enum psd_answer now = PSD_ANSWER_NOW;
    psd_count_request(s, m.hdr);
    if (rc != 0) {
        psd_reply_error(s, m.hdr, rc, err, rep);
    } else if (in_batch && !ps_wire_op_moves_data(m.hdr->op)) {
        psd_reply_errorf(s, m.hdr, PS_EOP, rep, "%s: only pull, push and push_pull go in a batch",
                         ps_op_name(m.hdr->op));
    } else if (m.hdr->op == PS__OP__OP_BATCH && !psd_can_send(s)) {
        psd_reply_errorf(s, m.hdr, PS_EOP, rep, "batch: this shard cannot answer batches");
    } else if (m.hdr->op == PS__OP__OP_HELLO &&
               psd_live_hello_refused(s, route, user, m.hdr, replaying, rep)) {
        /* not heard as the worker it claims: its holder keeps the id */
    } else if (psd_live_request_refused(s, route, user, m.hdr, replaying, rep)) {
        /* the same: the id's connection is the one its hello bound */
    } else {
        psd_live_heard(s, m.hdr);
        now = run_op(s, route, user, &m, rep, replaying);
    }
    if (now == PSD_ANSWER_NOW && rc == 0)
        psd_fit_unread(s, route->data, route->size, m.hdr, rep);
    if (now == PSD_ANSWER_NOW)
        psd_count_bytes_out(s, rep->hdr_len + rep->mask_bytes + rep->vals_bytes);
    return now;
}

/* One request from outside a batch; then a checkpoint if one is due. */
static enum psd_answer dispatch(struct psd *s, const struct ps_frame *route, const char *user,
                                const struct ps_frame *frames, size_t nframes,
                                struct psd_reply *rep, int replaying)
{
    enum psd_answer now = dispatch_one(s, route, user, frames, nframes, rep, 0, replaying);
    psd_checkpoint_if_due(s, (uint64_t)ps_mono_ms());
    return now;
}

enum psd_answer psd_dispatch_from(struct psd *s, const struct ps_frame *route, const char *user,
                                  const struct ps_frame *frames, size_t nframes,
                                  struct psd_reply *rep)
{
    return dispatch(s, route, user, frames, nframes, rep, 0);
}

enum psd_answer psd_dispatch_replayed(struct psd *s, const struct ps_frame *route, const char *user,
                                      const struct ps_frame *frames, size_t nframes,
                                      struct psd_reply *rep)
{
    return dispatch(s, route, user, frames, nframes, rep, 1);
}

enum psd_answer psd_dispatch(struct psd *s, const struct ps_frame *route,
                             const struct ps_frame *frames, size_t nframes, struct psd_reply *rep)
{
    return psd_dispatch_from(s, route, NULL, frames, nframes, rep);
}
