/* Receiving: matching a reply to its ticket and reading its values (in
 * frames, masked, or in the shared region) into the caller's buffer. */
#include "client_impl.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_half.h"
#include "ps_shard.h"
#include "ps_zmsg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* out[i] = the next value for each set bit of the mask, 0 elsewhere. The
 * decoder checked that the values frame holds exactly the set bits. */
static void expand_masked(Ps__DType dtype, const struct ps_wire_msg *m, float *out, size_t n)
{
    const unsigned char *v = m->vals;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((m->mask[i / 8] >> (i % 8)) & 1u) {
            if (dtype == PS__DTYPE__DTYPE_F32)
                memcpy(&out[i], v + 4 * k, 4);
            else
                ps_half_to_f32_n(dtype, v + 2 * k, &out[i], 1);
            k++;
        } else {
            out[i] = 0.0f;
        }
    }
}

/* out[i] = the next value for each set bit of the mask; the others stay
 * as they are (a LAYOUT_CHANGED reply: what was written since the
 * mirror's version). */
static void expand_changed(Ps__DType dtype, const struct ps_wire_msg *m, float *out, size_t n)
{
    const unsigned char *v = m->vals;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 8) {
        unsigned bits = m->mask[i / 8];
        for (; bits != 0; bits &= bits - 1) {
            size_t e = i + (size_t)__builtin_ctz(bits);
            if (dtype == PS__DTYPE__DTYPE_F32)
                memcpy(&out[e], v + 4 * k, 4);
            else
                ps_half_to_f32_n(dtype, v + 2 * k, &out[e], 1);
            k++;
        }
    }
}

/* Whether a LAYOUT_CHANGED reply fits what segment seg holds: changes of
 * the generation it is at, from its version on. */
static int changes_fit(const struct mirror_seg *seg, const Ps__Header *h)
{
    return seg != NULL && seg->version != 0 && h->generation == seg->generation &&
           h->table_version >= seg->version;
}

/* Scatters the rows of shard s's reply back to the caller's order. */
static void handle_rows_reply(struct psc_client *c, uint32_t shard, struct slot *sl,
                              const struct ps_wire_msg *m)
{
    const Ps__Header *h = m->hdr;
    const struct table_h *t = c->tables[sl->table];
    uint32_t a = sl->grp[shard], b = sl->grp[shard + 1];
    size_t bytes = (size_t)(b - a) * t->dim * sizeof(float);
    uint64_t off;
    if (h->shm == PS_SHM_OUT && h->layout == PS__LAYOUT__LAYOUT_KEYS && h->count == b - a &&
        h->dim == t->dim && a == 0 && b == sl->nkeys &&
        psc__shm_out_at(c, sl, shard, 0, (uint64_t)(b - a) * t->dim, &off) && h->shm_out == off) {
        /* the shard wrote the rows where they belong, in the caller's order */
        c->shm_received += bytes;
        c->bytes_received += bytes;
        return;
    }
    if (h->layout != PS__LAYOUT__LAYOUT_KEYS || h->count != b - a || h->dim != t->dim ||
        h->dtype != c->dtype || h->shm != 0 ||
        m->vals_bytes != (size_t)(b - a) * t->dim * c->esize) {
        psc__slot_fail(sl, PS_EPROTO,
                       "shard %u answered %llu rows of dim %u, expected %u of dim %u", shard,
                       (unsigned long long)h->count, h->dim, b - a, t->dim);
        return;
    }
    if (sl->canceled)
        return;
    const unsigned char *v = m->vals;
    size_t d = t->dim, rowb = d * c->esize;
    if (c->nshards == 1) { /* in the caller's order already (rows_group) */
        if (c->dtype == PS__DTYPE__DTYPE_F32)
            memcpy(sl->out, v, (size_t)(b - a) * rowb);
        else
            ps_half_to_f32_n(c->dtype, v, sl->out, (size_t)(b - a) * d);
        return;
    }
    for (uint32_t i = a; i < b; i++) {
        float *dst = sl->out + (size_t)sl->order[i] * d;
        if (c->dtype == PS__DTYPE__DTYPE_F32)
            memcpy(dst, v + (i - a) * rowb, rowb);
        else
            ps_half_to_f32_n(c->dtype, v + (i - a) * rowb, dst, d);
    }
}

/* A view's reply: its values message is kept in the slot, or a copy of
 * it where the values are not float-aligned in the message. */
static void view_keep(struct slot *sl, uint32_t shard, const struct ps_wire_msg *m,
                      zmq_msg_t *vals_msg)
{
    zmq_msg_t *dst = &sl->vmsg[shard];
    if (vals_msg != NULL && zmq_msg_data(vals_msg) == m->vals &&
        (uintptr_t)m->vals % _Alignof(float) == 0) {
        zmq_msg_move(dst, vals_msg);
        return;
    }
    zmq_msg_close(dst);
    if (zmq_msg_init_size(dst, m->vals_bytes) != 0) {
        zmq_msg_init(dst);
        psc__slot_fail(sl, PS_ENOMEM, "no memory for %zu bytes of shard %u's values", m->vals_bytes,
                       shard);
        return;
    }
    memcpy(zmq_msg_data(dst), m->vals, m->vals_bytes);
}

static void handle_data_reply(struct psc_client *c, uint32_t shard, struct slot *sl,
                              const struct ps_wire_msg *m, zmq_msg_t *vals_msg)
{
    const Ps__Header *h = m->hdr;
    c->stale_pushes += h->stale;
    c->outside |= h->stale;
    if (sl->op == PS__OP__OP_PUSH)
        return;
    if (sl->rows) {
        handle_rows_reply(c, shard, sl, m);
        return;
    }
    uint64_t a, b;
    int asked = psc__range_part(c, sl, shard, &a, &b);
    int masked = m->mask != NULL;
    uint64_t off;
    if (asked && h->shm == PS_SHM_OUT && h->offset == a && h->count == b - a &&
        psc__shm_out_at(c, sl, shard, a, b, &off) && h->shm_out == off) {
        /* the shard wrote the values where they belong */
        c->shm_received += (b - a) * sizeof(float);
        c->bytes_received += (b - a) * sizeof(float);
        return;
    }
    Ps__DType dt = psc__sent_dtype(c, sl, shard);
    size_t es = ps_dtype_size(dt);
    int changed = h->layout == PS__LAYOUT__LAYOUT_CHANGED;
    struct mirror_seg *seg = sl->mirror && asked ? psc__mirror_seg(sl->mirror, a, b) : NULL;
    if (!asked || h->offset != a || h->count != b - a || h->dtype != dt || h->shm != 0 ||
        (masked && !changed && (!c->nonzero_pulls || sl->view)) ||
        (!masked && m->vals_bytes != (b - a) * es)) {
        psc__slot_fail(sl, PS_EPROTO, "shard %u answered [%llu, +%llu), expected [%llu, +%llu)",
                       shard, (unsigned long long)h->offset, (unsigned long long)h->count,
                       (unsigned long long)a, (unsigned long long)(asked ? b - a : 0));
        return;
    }
    if (changed && !changes_fit(seg, h)) {
        if (seg != NULL)
            seg->version = 0; /* the next pull takes it whole */
        psc__slot_fail(sl, PS_EPROTO,
                       "shard %u answered the changes since version %llu of generation %llx; this "
                       "client holds [%llu, +%llu) at version %llu of %llx",
                       shard, (unsigned long long)h->since, (unsigned long long)h->generation,
                       (unsigned long long)a, (unsigned long long)(b - a),
                       (unsigned long long)(seg ? seg->version : 0),
                       (unsigned long long)(seg ? seg->generation : 0));
        return;
    }
    if (sl->canceled)
        return;
    float *out = sl->out != NULL ? sl->out + (a - sl->offset) : NULL; /* NULL: a view */
    if (changed) {
        expand_changed(dt, m, out, (size_t)(b - a));
        seg->version = h->table_version;
        sl->mirror->changed++;
        return;
    }
    if (masked)
        expand_masked(dt, m, out, (size_t)(b - a));
    else if (sl->view)
        view_keep(sl, shard, m, vals_msg);
    else if (dt == PS__DTYPE__DTYPE_F32)
        memcpy(out, m->vals, m->vals_bytes);
    else
        ps_half_to_f32_n(dt, m->vals, out, (size_t)(b - a));
    if (seg != NULL) { /* the whole part, at the version the shard says (0: unknown) */
        seg->generation = h->generation;
        seg->version = h->table_version;
        sl->mirror->whole++;
    }
}

static void handle_rows_page(uint32_t shard, struct slot *sl, const struct ps_wire_msg *m)
{
    const Ps__Header *h = m->hdr;
    struct rows_out *ro = sl->ctx;
    if (h->offset != ro->offset || h->count > ro->max || h->dim != ro->dim ||
        h->rows < h->offset + h->count) {
        psc__slot_fail(sl, PS_EPROTO,
                       "shard %u answered rows [%llu, +%llu) of dim %u (of %llu), asked for [%llu, "
                       "+%llu) of dim %u",
                       shard, (unsigned long long)h->offset, (unsigned long long)h->count, h->dim,
                       (unsigned long long)h->rows, (unsigned long long)ro->offset,
                       (unsigned long long)ro->max, ro->dim);
        return;
    }
    if (ro->delta && (h->next < h->offset + h->count || h->next > h->rows)) {
        psc__slot_fail(sl, PS_EPROTO,
                       "shard %u answered rows [%llu, %llu) of %llu, with %llu of them sent", shard,
                       (unsigned long long)h->offset, (unsigned long long)h->next,
                       (unsigned long long)h->rows, (unsigned long long)h->count);
        return;
    }
    for (uint64_t i = 0; i < h->count; i++)
        ro->keys[i] = ps_wire_key(m->keys, i);
    if (ro->vals != NULL)
        memcpy(ro->vals, m->vals, m->vals_bytes);
    ro->got = h->count;
    ro->total = h->rows;
    ro->next = h->next;
    ro->tick = h->table_version;
}

static void handle_sync_reply(struct psc_client *c, uint32_t shard, struct slot *sl,
                              const struct ps_wire_msg *m)
{
    const Ps__Header *h = m->hdr;
    if (sl->op == PS__OP__OP_ROWS) {
        handle_rows_page(shard, sl, m);
    } else if (sl->op == PS__OP__OP_HELLO) {
        if (h->shard != shard || h->shards != c->nshards)
            psc__slot_fail(sl, PS_ESTATE,
                           "server %u (%s) says it is shard %u of %u, but was listed as %u of %u: "
                           "check the order of the server list",
                           shard, c->endpoints[shard], h->shard, h->shards, shard, c->nshards);
        if (h->clock > c->start_clock)
            c->start_clock = h->clock;
        /* only a hint: one that is malformed or out of reach leaves tcp */
        snprintf(c->offers[shard].local, sizeof c->offers[shard].local, "%s",
                 h->local_endpoint != NULL && strlen(h->local_endpoint) < PS_ENDPOINT_MAX
                     ? h->local_endpoint
                     : "");
        c->offers[shard].instance = h->instance;
        if (c->shm_on != NULL && h->shm_token != 0)
            c->shm_on[shard] = h->shm_token == c->shm_token;
    } else if (sl->op == PS__OP__OP_CREATE_TABLE) {
        struct table_h *t = sl->ctx;
        uint64_t lo, hi;
        ps_shard_range(t->size, c->nshards, shard, &lo, &hi);
        if (h->offset != lo || h->count != hi - lo)
            psc__slot_fail(
                sl, PS_ESTATE, "shard %u holds [%llu, %llu) of '%s', expected [%llu, %llu)", shard,
                (unsigned long long)h->offset, (unsigned long long)(h->offset + h->count), t->name,
                (unsigned long long)lo, (unsigned long long)hi);
        t->ids[shard] = h->table_id;
    } else if (sl->op == PS__OP__OP_CHECKPOINT || sl->op == PS__OP__OP_RECOVER) {
        snprintf(sl->ctx, PS_ERROR_TEXT_MAX, "%s", h->detail);
    } else if (sl->op == PS__OP__OP_STATS) {
        const struct stats_out *so = sl->ctx;
        struct psc_shard_stats *st = so->st;
        if (h->stats == NULL) {
            psc__slot_fail(sl, PS_EPROTO, "shard %u: stats reply without stats", shard);
            return;
        }
        st->shard = h->stats->shard;
        st->shards = h->stats->shards;
        st->requests = h->stats->requests;
        st->errors = h->stats->errors;
        st->bytes_in = h->stats->bytes_in;
        st->bytes_out = h->stats->bytes_out;
        st->tables = (uint32_t)h->stats->n_tables;
        st->uptime_s = h->stats->uptime_s;
        snprintf(st->consistency, sizeof st->consistency, "%s", h->stats->consistency);
        st->workers = h->stats->workers;
        st->waiting = h->stats->waiting;
        st->deferred_total = h->stats->deferred_total;
        st->max_staleness = h->stats->max_staleness;
        st->wait_timeouts = h->stats->wait_timeouts;
        st->duplicates_dropped = h->stats->duplicates_dropped;
        st->live_workers = h->stats->live_workers;
        st->nmissing = (uint32_t)h->stats->n_missing_workers;
        for (size_t i = 0; i < h->stats->n_missing_workers && i < 64; i++)
            st->missing[i] = h->stats->missing_workers[i];
        st->workers_dropped = h->stats->workers_dropped;
        st->workers_rejoined = h->stats->workers_rejoined;
        st->stale_pushes = h->stats->stale_pushes;
        st->worker_timeout_ms = h->stats->worker_timeout_ms;
        st->checkpoints_written = h->stats->checkpoints_written;
        st->checkpoint_age_s = h->stats->checkpoint_age_s;
        st->bytes_held = h->stats->bytes_held;
        snprintf(st->role, sizeof st->role, "%s", h->stats->role ? h->stats->role : "");
        snprintf(st->primary, sizeof st->primary, "%s", h->stats->primary ? h->stats->primary : "");
        st->epoch = h->stats->epoch;
        st->repl_seq = h->stats->repl_seq;
        st->ckpt_epoch = h->stats->ckpt_epoch;
        st->ckpt_seq = h->stats->ckpt_seq;
        st->insync_epoch = h->stats->insync_epoch;
        st->insync_stopped = h->stats->insync_stopped;
        snprintf(st->insync, sizeof st->insync, "%s", h->stats->insync ? h->stats->insync : "");
        st->nreplicas = 0;
        for (size_t i = 0; i < h->stats->n_replicas && i < 4; i++) {
            const Ps__ReplicaStats *rs = h->stats->replicas[i];
            struct psc_replica_stats *o = &st->replicas[st->nreplicas++];
            snprintf(o->endpoint, sizeof o->endpoint, "%s", rs->endpoint ? rs->endpoint : "");
            o->id = rs->id;
            o->acked = rs->acked;
            o->lag = rs->lag;
            o->in_sync = rs->in_sync;
        }
        for (size_t i = 0; i < h->stats->n_tables && i < so->cap; i++) {
            const Ps__TableStats *t = h->stats->tables[i];
            struct psc_table_stats *o = &so->list[i];
            snprintf(o->name, sizeof o->name, "%s", t->name);
            snprintf(o->optimizer, sizeof o->optimizer, "%s", t->optimizer);
            o->id = t->id;
            o->sparse = t->sparse;
            o->dim = t->dim;
            o->size = t->size;
            o->lo = t->lo;
            o->hi = t->hi;
            o->rows = t->rows;
            o->rows_max = t->rows_max;
            o->pushes = t->pushes;
            o->pulls = t->pulls;
            o->updates = t->updates;
            o->clock = t->clock;
            o->rounds_lost = t->rounds_lost;
            o->sparsity = t->sparsity;
            o->ndims = t->n_shape <= PSC_SHAPE_DIMS_MAX ? (uint32_t)t->n_shape : 0;
            for (uint32_t d = 0; d < o->ndims; d++)
                o->shape[d] = t->shape[d];
            o->admitted = t->admitted;
            o->held_back = t->held_back;
            o->evicted_age = t->evicted_age;
            o->evicted_budget = t->evicted_budget;
            o->refused = t->refused;
            o->bytes = t->bytes;
        }
        st->nworker_clocks = (uint32_t)h->stats->n_worker_clocks;
        for (size_t i = 0; i < h->stats->n_worker_clocks && i < 64; i++)
            st->worker_clocks[i] = h->stats->worker_clocks[i];
    }
}

/* Hands the region again to shard s, which refused it (it restarted, or
 * dropped this worker), and sends a hello in this session that binds it
 * to the connection; the hello's reply (rebound) turns it back on. No slot
 * of the caller's: the hello's id is kept in c->rebind. One at a time per
 * shard; anything that fails leaves the shard on frames. */
static void rebind_region(struct psc_client *c, uint32_t s)
{
    struct rebind *rb = &c->rebind[s];
    int64_t now = ps_mono_ms();
    if (rb->id != 0 && now - rb->sent_ms < REBIND_WAIT_MS)
        return;
    rb->id = 0;
    char err[256];
    if (ps_shm_hand(c->endpoints[s], c->shm.fd, c->shm_token, REBIND_WAIT_MS, err, sizeof err) != 0)
        return;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.request_id = ++c->next_seq; /* an id no slot will have */
    h.worker_id = c->worker_id;
    h.session = c->session;
    h.shm_token = c->shm_token;
    if (psc__send_frames(c, s, &h, NULL, 0, NULL, 0, NULL, 1) == 0) {
        rb->id = h.request_id;
        rb->sent_ms = now;
    }
}

/* Whether h answers shard s's rebind hello; if so, the region is on again
 * when the shard took it. */
static int rebound(struct psc_client *c, uint32_t s, const Ps__Header *h)
{
    if (c->rebind == NULL || c->rebind[s].id == 0 || h->request_id != c->rebind[s].id ||
        h->op != PS__OP__OP_HELLO)
        return 0;
    c->rebind[s].id = 0;
    c->shm_on[s] = h->status == 0 && h->shm_token == c->shm_token;
    return 1;
}

static void handle_reply(struct psc_client *c, uint32_t shard, const struct ps_frame *frames,
                         size_t nframes, zmq_msg_t *last)
{
    struct ps_wire_msg m;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_decode(&c->arena, frames, nframes, PS_WIRE_REPLY, PS_MESSAGE_BYTES_MAX, &m,
                            err, sizeof err);
    struct slot *sl = m.hdr ? psc__slot_lookup(c, m.hdr->request_id) : NULL;
    if (sl == NULL && rc == 0 && rebound(c, shard, m.hdr))
        return;
    if (sl == NULL && rc == 0 && psc__probe_answered(c, shard, m.hdr))
        return;
    if (rc == 0 && m.hdr->status == PS_ENOTPRIMARY && psc__not_primary(c, shard, m.hdr))
        return; /* still outstanding: it goes again to the primary */
    if (sl == NULL || psc__shard_replied(sl, shard) || sl->pending == 0) {
        c->bad_replies++; /* stale, duplicate or unattributable: dropped */
        return;
    }
    if (rc == 0 && m.hdr->op == sl->op && m.hdr->status == PS_EAGAIN && sl->kind != SUB_SYNC &&
        c->retry_ms > 0) {
        /* "not yet" (a bsp chunk ahead of one a restart lost): still
         * unanswered, sent again after retry_ms */
        sl->sent_ms = ps_mono_ms();
        return;
    }
    if (rc == 0 && m.hdr->op == sl->op && m.hdr->status == PS_ESHM && sl->kind != SUB_SYNC) {
        if (!((sl->via_shm[shard / 64] >> (shard % 64)) & 1u)) {
            /* the refusal of a copy sent before the one in frames (copies
             * queue up while a shard is down): that one will answer */
            c->bad_replies++;
            return;
        }
        /* the shard lost the region (it restarted): frames until it
         * takes the region again */
        c->shm_on[shard] = 0;
        int sent = psc__send_sub(c, sl, shard, 1) == PSC_SUB_SENT;
        rebind_region(c, shard);
        if (sent)
            return;
    }
    sl->replied[shard / 64] |= UINT64_C(1) << (shard % 64);
    sl->pending--;
    if (rc != 0) {
        psc__slot_fail(sl, PS_EPROTO, "shard %u sent a malformed reply: %s", shard, err);
        return;
    }
    const Ps__Header *h = m.hdr;
    if (h->op != sl->op) {
        psc__slot_fail(sl, PS_EPROTO, "shard %u answered %s to a %s request", shard,
                       ps_op_name(h->op), ps_op_name(sl->op));
        return;
    }
    if (h->status != 0) {
        if (sl->status == 0)
            sl->remote = h->status; /* what the shard said, kept with the first error */
        psc__slot_fail(sl, PS_EREMOTE, "shard %u (%s): %s [%s]", shard, c->endpoints[shard],
                       h->error, ps_err_name(h->status));
        return;
    }
    if (sl->op == PS__OP__OP_SET)
        return; /* a status, nothing to read */
    if (ps_wire_op_moves_data(sl->op))
        handle_data_reply(c, shard, sl, &m, last);
    else
        handle_sync_reply(c, shard, sl, &m);
}

/* Reads one message from a shard's socket. 0: handled one; <0: none. */
static int recv_one(struct psc_client *c, uint32_t shard, int flags)
{
    zmq_msg_t parts[REPLY_PARTS_MAX];
    size_t kept = 0, total = 0;
    if (ps_zmsg_recv(c->socks[shard], flags, parts, REPLY_PARTS_MAX, &kept, &total,
                     &c->bytes_received) != 0)
        return -1;
    if (c->reps != NULL)
        c->reps[shard].heard_ms = ps_mono_ms();
    struct ps_frame frames[REPLY_PARTS_MAX];
    for (size_t i = 0; i < kept; i++) {
        frames[i].data = zmq_msg_data(&parts[i]);
        frames[i].size = zmq_msg_size(&parts[i]);
    }
    handle_reply(c, shard, frames, total, kept == total && kept > 0 ? &parts[kept - 1] : NULL);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}

void psc__drain_shard(struct psc_client *c, uint32_t s)
{
    for (unsigned i = 0; i < 4 * PS_DRAIN_BATCH_MAX && recv_one(c, s, ZMQ_DONTWAIT) == 0; i++)
        ;
}

/* Receives replies: what is waiting, or else the first to come within
 * wait_ms (-1: no limit). Returns how many it received. Waiting costs what
 * a plain zmq client's costs:
 * - one shard: a blocking receive with ZMQ_RCVTIMEO (setting it costs
 *   about 14 ns), as a raw zmq client does: a poll and an eventfd read a
 *   wake-up, where zmq_poll took five polls and an EAGAIN receive;
 * - several: each socket is read until EAGAIN, which leaves its commands
 *   processed and its ZMQ_FD armed (zmq's rule for polling ZMQ_FD), then
 *   one poll() on those fds. Nothing may touch a socket between its EAGAIN
 *   and the poll: a send can swallow the fd's edge. */
unsigned psc__await_replies(struct psc_client *c, const struct slot *sl, int wait_ms)
{
    if (c->nshards == 1 && zmq_setsockopt(c->socks[0], ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms) == 0)
        return recv_one(c, 0, 0) == 0;
    enum { DRAIN_MAX = 4 * PS_DRAIN_BATCH_MAX };
    int armed = 1;
    unsigned got = 0;
    for (uint32_t s = 0; s < c->nshards; s++) {
        unsigned i = 0;
        while (i < DRAIN_MAX && recv_one(c, s, ZMQ_DONTWAIT) == 0)
            i++;
        got += i;
        size_t len = sizeof c->pfds[s].fd;
        if (i == DRAIN_MAX || zmq_getsockopt(c->socks[s], ZMQ_FD, &c->pfds[s].fd, &len) != 0)
            armed = 0; /* more may be waiting, or no fd: come back without sleeping */
        c->pfds[s].events = POLLIN;
    }
    if (armed && sl->pending != 0 && wait_ms != 0)
        poll(c->pfds, c->nshards, wait_ms);
    return got;
}
