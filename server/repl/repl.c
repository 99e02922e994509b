/* Replicas of a shard, the primary's side (repl.h): held replies,
 * records, the in-sync set, state transfer; and the loop's timer. */
#define _GNU_SOURCE
#include "repl_impl.h"
#include "repl_metrics.h"

#include "backups.h"
#include "record.h"

#include "catalog.h"
#include "checkpoint.h"
#include "live.h"
#include "reply.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_zmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    return (uint64_t)ps_mono_ms();
}

/* This process stops answering as primary (it lost its lease, or etcd
 * names another): held replies are refused as not primary, the clients
 * send them again. */
static void step_down(struct psd_repl *r, const char *why);

/* ---- held replies (primary) ---------------------------------------------- */

static int lease_ok(const struct psd_repl *r)
{
    return r->lead.lease_until_ms > now_ms();
}

int psd_repl_hold(void *repl, const void *route, size_t route_len, struct psd_reply *rep)
{
    struct psd_repl *r = repl;
    if (r->role != PSD_ROLE_PRIMARY) { /* a backup's copy of a reply its primary sends */
        psd_reply_drop(rep);
        return 1;
    }
    if (r->held_n == 0 && psd_backups_required(&r->backups) == UINT64_MAX && lease_ok(r))
        return 0;
    if (r->held_n == PSD_HELD_MAX || route_len > PS_ROUTE_ID_MAX) {
        r->held_dropped++; /* the client sends it again */
        psd_reply_drop(rep);
        return 1;
    }
    struct psd_held *e = &r->held[(r->held_head + r->held_n) % PSD_HELD_MAX];
    e->hdr = malloc(rep->hdr_len ? rep->hdr_len : 1);
    void *vals = rep->vals;
    int copy = rep->vals_borrowed && rep->vals != NULL; /* the table's memory changes */
    if (copy && (vals = malloc(rep->vals_bytes ? rep->vals_bytes : 1)) != NULL)
        memcpy(vals, rep->vals, rep->vals_bytes);
    if (e->hdr == NULL || (copy && vals == NULL)) {
        free(e->hdr);
        if (vals != rep->vals)
            free(vals);
        r->held_dropped++;
        psd_reply_drop(rep);
        return 1;
    }
    memcpy(e->hdr, rep->hdr, rep->hdr_len);
    e->rep = *rep;
    e->rep.hdr = e->hdr;
    e->rep.vals = vals;
    e->rep.vals_borrowed = 0;
    memcpy(e->route, route, route_len);
    e->route_len = route_len;
    e->tag = r->in_dispatch ? UINT64_MAX : r->seq; /* set when the request is numbered */
    r->held_n++;
    r->replies_held++;
    if (r->held_n > r->held_peak)
        r->held_peak = r->held_n;
    return 1;
}

/* Sends the held replies whose records every required backup applied. */
static void flush(struct psd_repl *r)
{
    if (r->role != PSD_ROLE_PRIMARY || !lease_ok(r))
        return;
    uint64_t acked = psd_backups_required(&r->backups);
    while (r->held_n > 0) {
        struct psd_held *e = &r->held[r->held_head];
        if (e->tag > acked)
            break;
        psd_net_reply(r->net, e->route, e->route_len, &e->rep);
        free(e->hdr);
        r->held_head = (r->held_head + 1) % PSD_HELD_MAX;
        r->held_n--;
    }
}

static void drop_held(struct psd_repl *r)
{
    while (r->held_n > 0) {
        struct psd_held *e = &r->held[r->held_head];
        psd_reply_drop(&e->rep);
        free(e->hdr);
        r->held_head = (r->held_head + 1) % PSD_HELD_MAX;
        r->held_n--;
    }
}

/* ---- records (primary) ------------------------------------------------- */

static void drop_backup(struct psd_repl *r, struct psd_backup *b, const char *why);

/* b gets no part of the state transfer under way (it is dropped, or
 * asks for its state again); one that goes to nobody ends. */
static void leave_transfer(struct psd_repl *r, const struct psd_backup *b)
{
    r->xfer.mask &= ~(1u << (uint32_t)(b - r->backups.b));
    if (r->xfer.mask == 0 && psd_transfer_busy(&r->xfer))
        psd_transfer_end(&r->xfer);
}

/* One record to backup b: the header (packed, len bytes; < 0: it does
 * not pack), then frames (copies that share the request's buffers). */
static void send_packed(struct psd_repl *r, struct psd_backup *b, const Ps__Header *h,
                        const uint8_t *hdr, int64_t len, zmq_msg_t *frames, size_t n)
{
    int rc = len < 0 ? -1
                     : psd_record_send_to(r->net->sock, b->route, b->route_len, hdr, (size_t)len,
                                          frames, n);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            r->record_bytes += zmq_msg_size(&frames[i]);
        return;
    }
    if (rc == 1 && h->record == PS__RECORD__REC_BEAT)
        return; /* its queue is full (a state transfer fills it): the next beat */
    char why[160];
    snprintf(why, sizeof why, "a record could not be sent to it (%s)",
             rc == 1 ? "its queue is full" : zmq_strerror(errno));
    drop_backup(r, b, why);
}

static void send_record(struct psd_repl *r, struct psd_backup *b, const Ps__Header *h,
                        zmq_msg_t *frames, size_t n)
{
    uint8_t hdr[PS_HEADER_BYTES_MAX];
    send_packed(r, b, h, hdr, ps_wire_header_pack(h, hdr, sizeof hdr), frames, n);
}

/* Numbers the next record, sends it to every backup past its state
 * transfer and keeps it in the backlog. */
static void forward(struct psd_repl *r, Ps__Header *h, zmq_msg_t *frames, size_t n)
{
    r->seq++;
    h->seq = r->seq;
    r->records_sent++;
    uint8_t hdr[PS_HEADER_BYTES_MAX];
    int64_t len = ps_wire_header_pack(h, hdr, sizeof hdr);
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (psd_backup_gets_records(&r->backups.b[i]))
            send_packed(r, &r->backups.b[i], h, hdr, len, frames, n);
    if (len >= 0)
        psd_backlog_add(&r->backlog, r->seq, hdr, (size_t)len, frames, n);
    else
        psd_backlog_reset(&r->backlog, r->seq);
    if (r->xfer.mask == 0) /* none, or no backup left to get it */
        return;
    int rc = psd_transfer_keep(&r->xfer, h, frames, n);
    if (rc == 0)
        return;
    uint32_t mask = r->xfer.mask;
    psd_transfer_end(&r->xfer);
    char why[160];
    snprintf(why, sizeof why,
             rc == PS_ELIMIT ? "the records made during its state transfer passed "
                               "--replica-transfer-mib %llu; it asks again"
                             : "out of memory for the records made during its state transfer "
                               "(--replica-transfer-mib %llu)",
             (unsigned long long)(r->xfer.kept_max >> 20));
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (mask & (1u << i))
            drop_backup(r, &r->backups.b[i], why);
}

static void on_drop(void *ctx, uint32_t w)
{
    struct psd_repl *r = ctx;
    if (r->role != PSD_ROLE_PRIMARY)
        return;
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_DROP, r->epoch, r->seq);
    h.worker_id = w;
    forward(r, &h, NULL, 0);
}

/* A table's age floor rises on the primary alone, at this point of its
 * record stream: the record goes first, and backups raise theirs when
 * they reach it, between the same two requests. */
static int on_floor(void *ctx, uint32_t table, uint64_t floor)
{
    struct psd_repl *r = ctx;
    if (r->role != PSD_ROLE_PRIMARY)
        return 0;
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_AGE_FLOOR, r->epoch, r->seq);
    h.table_id = table;
    h.offset = floor;
    forward(r, &h, NULL, 0);
    return 1;
}

/* ---- the in-sync set ------------------------------------------------------ */

/* ---- etcd from the loop: one asynchronous call at a time --------------------- */

static void etcd_next(struct psd_repl *r, uint64_t now);

static void on_insync_written(void *ctx, int rc, int64_t ok)
{
    struct psd_repl *r = ctx;
    uint32_t mask = r->insync_leaving;
    r->insync_leaving = 0;
    if (r->role != PSD_ROLE_PRIMARY)
        return;
    if (rc != 0) {
        r->insync_wanted = 1; /* again at the next tick */
        if (ps_log_sampled(++r->etcd_failures))
            PS_LOG(r->log, PS_LOG_WARN, S0702,
                   "cannot write the in-sync set to etcd (%s): replies wait", r->lead.etcd.err);
        return;
    }
    if (!ok) {
        step_down(r, "etcd's leader key is no longer this process's");
        return;
    }
    psd_backups_listed(&r->backups, mask);
    PS_LOG(r->log, PS_LOG_INFO, S0703, "in sync: this primary and %u backup(s)", r->insync_written);
    flush(r); /* a backup that left is no longer waited for */
    etcd_next(r, now_ms());
}

/* Writes etcd's in-sync set from the backups in sync, on the loop; those
 * leaving now are let go once it is written. */
static void write_insync(struct psd_repl *r)
{
    uint64_t ids[PSD_BACKUPS_MAX];
    const char *eps[PSD_BACKUPS_MAX];
    uint32_t n = psd_backups_in_sync(&r->backups, ids, eps);
    r->insync_wanted = 0;
    r->insync_leaving = psd_backups_leaving_mask(&r->backups);
    r->insync_written = n;
    int rc = psd_lead_set_insync_async(&r->lead, ids, eps, n, on_insync_written, r);
    if (rc != 0) {
        r->insync_wanted = 1;
        if (ps_log_sampled(++r->etcd_failures))
            PS_LOG(r->log, PS_LOG_WARN, S0702,
                   "cannot write the in-sync set to etcd (%s): replies wait", r->lead.etcd.err);
    }
}

static void lease_not_renewed(struct psd_repl *r, uint64_t now)
{
    if (ps_log_sampled(++r->etcd_failures))
        PS_LOG(r->log, PS_LOG_WARN, S0717, "lease not renewed: %s (replies stop in %lld ms)",
               r->lead.etcd.err, (long long)r->lead.lease_until_ms - (long long)now);
}

static void on_renewed(void *ctx, int rc, int64_t unused)
{
    (void)unused;
    struct psd_repl *r = ctx;
    if (r->role != PSD_ROLE_PRIMARY)
        return;
    uint64_t now = now_ms();
    if (rc == PS_ESTATE) {
        step_down(r, "etcd no longer holds its lease");
        return;
    }
    if (rc != 0)
        lease_not_renewed(r, now);
    etcd_next(r, now);
}

static void on_member_renewed(void *ctx, int rc, int64_t unused)
{
    (void)unused;
    struct psd_repl *r = ctx;
    if (rc == PS_ESTATE)
        PS_LOG(r->log, PS_LOG_WARN, S0728,
               "etcd no longer holds --replica-name %s's lease (etcd did not hear from this "
               "process within it): claiming the name again",
               r->lead.name);
    else if (rc != 0 && ps_log_sampled(++r->etcd_failures))
        PS_LOG(r->log, PS_LOG_WARN, S0717, "--replica-name %s's lease not renewed: %s",
               r->lead.name, r->lead.etcd.err);
    etcd_next(r, now_ms());
}

/* The next call this replica owes etcd, unless one is under way: a
 * primary's lease renewal first when due, then the name's, then a
 * primary's in-sync set. */
static void etcd_next(struct psd_repl *r, uint64_t now)
{
    if (psd_etcd_busy(&r->lead.etcd))
        return;
    int primary = r->role == PSD_ROLE_PRIMARY;
    if (primary && psd_lead_renew_due(&r->lead, now)) {
        int rc = psd_lead_renew_async(&r->lead, now, on_renewed, r);
        if (rc == PS_ESTATE)
            step_down(r, "etcd no longer holds its lease");
        else if (rc != 0)
            lease_not_renewed(r, now);
        return;
    }
    if (psd_lead_member_due(&r->lead, now)) {
        if (psd_lead_member_renew_async(&r->lead, now, on_member_renewed, r) != 0 &&
            ps_log_sampled(++r->etcd_failures))
            PS_LOG(r->log, PS_LOG_WARN, S0717, "--replica-name %s's lease not renewed: %s",
                   r->lead.name, r->lead.etcd.err);
        return;
    }
    if (primary && (r->insync_wanted || psd_backups_leaving(&r->backups)))
        write_insync(r);
}

/* The in-sync set changed: etcd is told as soon as it can be. */
static void update_insync(struct psd_repl *r)
{
    r->insync_wanted = 1;
    etcd_next(r, now_ms());
}

static void drop_backup(struct psd_repl *r, struct psd_backup *b, const char *why)
{
    if (b->state == PSD_BACKUP_FREE || b->state == PSD_BACKUP_LEAVING)
        return;
    leave_transfer(r, b);
    PS_LOG(r->log, PS_LOG_WARN, S0704, "backup %s (%016" PRIx64 ") dropped: %s; %s", b->endpoint,
           b->id, why,
           b->state == PSD_BACKUP_IN_SYNC ? "replies wait until etcd no longer lists it"
                                          : "it was not in sync yet");
    r->backups_dropped++;
    if (psd_backup_drop(b))
        update_insync(r);
}

/* ---- state transfer (primary) ----------------------------------------------- */

/* A state transfer's backups that could not be sent to. */
static void drop_failed(struct psd_repl *r, uint32_t failed)
{
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (failed & (1u << i))
            drop_backup(r, &r->backups.b[i], "its state transfer could not be sent");
}

/* The state transfer under way, one step (a tick): its writer taken in,
 * a piece sent, or at its end the records kept meanwhile. */
static void step_transfer(struct psd_repl *r)
{
    struct psd_transfer *x = &r->xfer;
    uint32_t failed = 0;
    char err[PS_PATH_MAX + 600];
    int st = psd_transfer_step(x, r->net->sock, &r->backups, &failed, err, sizeof err);
    drop_failed(r, failed);
    if (st == PSD_TRANSFER_FAILED) {
        PS_LOG(r->log, PS_LOG_ERROR, S0705, "state transfer: %s; the backups get another", err);
        psd_transfer_end(x);
        return;
    }
    if (st != PSD_TRANSFER_DONE)
        return;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        struct psd_backup *b = &r->backups.b[i];
        if (!(x->mask & (1u << i)) || b->state != PSD_BACKUP_TRANSFER)
            continue;
        psd_backup_transferred(b, r->seq); /* it has everything up to here */
        if (x->resume)                     /* S0729 said so when it began */
            continue;
        PS_LOG(r->log, PS_LOG_INFO, S0706,
               "backup %s: state transfer sent (%" PRIu64 " bytes, record %" PRIu64
               ", written in %" PRIu64 " ms %s (the fork held it %" PRIu64 " us), then %" PRIu64
               " records made meanwhile); it follows from record %" PRIu64,
               b->endpoint, x->size, x->seq, now_ms() - x->t0_ms,
               x->child_used ? "by a forked writer while the shard served" : "on the loop",
               x->fork_us, x->sent_kept, r->seq);
    }
    psd_transfer_end(x);
}

/* Backups waiting for their state get a transfer of the state at a round
 * boundary (one at a time); the tick sends it. */
static void try_snapshots(struct psd_repl *r)
{
    if (psd_transfer_busy(&r->xfer) || !psd_backups_waiting(&r->backups) ||
        psd__repl_try_resume(r) || !psd_quiescent(r->srv))
        return;
    uint32_t mask = 0;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (r->backups.b[i].state == PSD_BACKUP_TRANSFER)
            mask |= 1u << i;
    char err[512];
    if (psd_transfer_start(&r->xfer, r->srv, r->snap_dir, r->epoch, r->seq, mask, err,
                           sizeof err) != 0)
        PS_LOG(r->log, PS_LOG_ERROR, S0705, "state transfer: %s", err);
}

static void on_follow(struct psd_repl *r, const struct ps_frame *route, const Ps__Header *h)
{
    if (h->epoch > r->epoch) {
        char why[96];
        snprintf(why, sizeof why, "a backup follows epoch %" PRIu64 ", past this one's %" PRIu64,
                 h->epoch, r->epoch);
        step_down(r, why);
        return;
    }
    const char *ep = h->detail != NULL ? h->detail : "";
    if (route->size > PS_ROUTE_ID_MAX || strlen(ep) >= PS_ENDPOINT_MAX || h->instance == 0)
        return;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        struct psd_backup *o = &r->backups.b[i];
        if (o->id != h->instance && strcmp(o->endpoint, ep) == 0)
            drop_backup(r, o, "a new process follows from its endpoint");
    }
    struct psd_backup *b = psd_backups_slot(&r->backups, h->instance);
    if (b == NULL) { /* it asks again every --replica-timeout-ms */
        if (ps_log_sampled(++r->follows_refused))
            PS_LOG(r->log, PS_LOG_WARN, S0707,
                   "%s asked to follow, but %u backups follow already (%llu refused)", ep,
                   PSD_BACKUPS_MAX, (unsigned long long)r->follows_refused);
        return;
    }
    if (b->state == PSD_BACKUP_IN_SYNC || b->state == PSD_BACKUP_LEAVING) {
        drop_backup(r, b, "it asked for its state again"); /* it must leave the set first */
        if (b->state != PSD_BACKUP_FREE)
            return; /* etcd still lists it: it asks again */
    }
    leave_transfer(r, b); /* one under way began before this follow */
    psd_backup_follows(b, h->instance, ep, route->data, route->size, now_ms());
    b->resume_epoch = h->resume_epoch;
    b->resume_seq = h->resume_epoch != 0 ? h->resume_seq : 0;
    PS_LOG(r->log, PS_LOG_INFO, S0708,
           "backup %s (%016" PRIx64 ") follows; its state goes "
           "between rounds",
           ep, b->id);
    try_snapshots(r);
}

/* A primary draining before it stops (psd_repl_drain): done once every
 * held reply went, or at its deadline. */
static void drained(struct psd_repl *r, uint64_t now)
{
    if (r->drained == NULL || (r->held_n > 0 && now < r->drain_until_ms))
        return;
    void (*done)(void *) = r->drained;
    r->drained = NULL;
    done(r->drained_ctx);
}

static void on_ack(struct psd_repl *r, const struct ps_frame *route, const Ps__Header *h)
{
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        struct psd_backup *b = &r->backups.b[i];
        if (b->state == PSD_BACKUP_FREE || b->id != h->instance || b->route_len != route->size ||
            memcmp(b->route, route->data, route->size) != 0 || h->epoch != r->epoch)
            continue;
        if (psd_backup_acked(b, h->seq, r->seq, now_ms()))
            update_insync(r);
    }
    flush(r);
    drained(r, now_ms());
}

/* ---- requests ----------------------------------------------------------------- */

static void reply_not_primary(struct psd_repl *r, const struct ps_frame *route,
                              const Ps__Header *req)
{
    if (req != NULL && req->op == PS__OP__OP_HEARTBEAT)
        return; /* never answered */
    Ps__Header h;
    psd_reply_init(&h, req);
    h.status = PS_ENOTPRIMARY;
    char text[PS_ENDPOINT_MAX + 96];
    snprintf(text, sizeof text, "shard %u: this replica is a %s; the primary is %s",
             r->srv->conf.shard, psd_role_name(r->role),
             r->primary[0] ? r->primary : "not known yet");
    h.error = text;
    h.detail = r->primary;
    uint8_t buf[PS_HEADER_BYTES_MAX];
    int64_t n = ps_wire_header_pack(&h, buf, sizeof buf);
    if (n < 0)
        return;
    struct psd_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.hdr = buf;
    rep.hdr_len = (size_t)n;
    r->refused_not_primary++;
    psd_net_reply(r->net, route->data, route->size, &rep);
}

/* A follow under CURVE from a key other than the shard's own: a worker
 * admitted to push may not read the whole shard as a backup. */
static void refuse_follow(struct psd_repl *r, const struct ps_frame *route, const Ps__Header *req)
{
    r->follows_refused++;
    struct psd_reply rep;
    memset(&rep, 0, sizeof rep);
    psd_reply_errorf(r->srv, req, PS_EAUTH, &rep,
                     "follow: only this shard's own CURVE key may follow it (its replicas share "
                     "the key pair)");
    psd_net_reply(r->net, route->data, route->size, &rep);
}

/* Whether a request the primary handled goes to the backups. */
static int replicable(const Ps__Header *h, enum psd_answer ans, const struct psd_reply *rep)
{
    switch (h->op) {
    case PS__OP__OP_STATS:
    case PS__OP__OP_ROWS:
    case PS__OP__OP_CHECKPOINT:
        return 0;
    case PS__OP__OP_HELLO: { /* a refused hello took nothing */
        if (ans != PSD_ANSWER_NOW)
            return 1;
        Ps__Header *o = ps__header__unpack(NULL, rep->hdr_len, rep->hdr);
        int ok = o != NULL && o->status == 0;
        if (o != NULL)
            ps__header__free_unpacked(o, NULL);
        return ok;
    }
    default:
        return 1;
    }
}

void psd_repl_request(void *repl, const struct ps_frame *route, const char *user, zmq_msg_t *parts,
                      size_t kept, size_t total)
{
    struct psd_repl *r = repl;
    Ps__Header *h = kept > 1 ? psd_record_unpack(&r->req_arena, zmq_msg_data(&parts[1]),
                                                 zmq_msg_size(&parts[1]))
                             : NULL;
    int op = h != NULL ? (int)h->op : 0;
    if (op == PS__OP__OP_FOLLOW || op == PS__OP__OP_REPLICATE) {
        if (r->curve_pub[0] != '\0' && (user == NULL || strcmp(user, r->curve_pub) != 0)) {
            /* a worker's key: replicas hold the shard's own */
            if (op == PS__OP__OP_FOLLOW)
                refuse_follow(r, route, h);
        } else if (r->role == PSD_ROLE_PRIMARY)
            (op == PS__OP__OP_FOLLOW ? on_follow : on_ack)(r, route, h);
        else if (op == PS__OP__OP_FOLLOW)
            reply_not_primary(r, route, h);
        return;
    }
    if (op == PS__OP__OP_RECOVER) {
        psd__repl_recover(r, route, user, h);
        return;
    }
    if (r->draining) { /* unanswered: a refusal would send the client to another replica
                        * before the replies it waits for leave this one */
        r->drain_dropped++;
        return;
    }
    if (r->role != PSD_ROLE_PRIMARY && op != PS__OP__OP_STATS && h != NULL) {
        reply_not_primary(r, route, h);
        return;
    }
    struct ps_frame frames[PARTS_MAX] = {{0}};
    for (size_t i = 1; i < kept; i++) {
        frames[i - 1].data = zmq_msg_data(&parts[i]);
        frames[i - 1].size = zmq_msg_size(&parts[i]);
    }
    struct psd_reply rep;
    uint32_t made = r->held_n; /* replies held from here on come of this request */
    r->in_dispatch = r->role == PSD_ROLE_PRIMARY;
    enum psd_answer ans = psd_dispatch_from(r->srv, route, user, frames, total - 1, &rep);
    r->in_dispatch = 0;
    if (r->role == PSD_ROLE_PRIMARY && h != NULL && kept == total && replicable(h, ans, &rep)) {
        Ps__Header rec;
        psd_record_header(&rec, PS__RECORD__REC_REQUEST, r->epoch, r->seq);
        rec.route.data = (uint8_t *)route->data;
        rec.route.len = route->size;
        rec.user = (char *)(user ? user : "");
        forward(r, &rec, &parts[1], kept - 1);
    }
    for (uint32_t i = made; i < r->held_n; i++) /* numbered now: they depend on it */
        r->held[(r->held_head + i) % PSD_HELD_MAX].tag = r->seq;
    if (ans == PSD_ANSWER_NOW) {
        if (r->role != PSD_ROLE_PRIMARY) /* stats on a backup */
            psd_net_reply(r->net, route->data, route->size, &rep);
        else if (!psd_repl_hold(r, route->data, route->size, &rep))
            psd_net_reply(r->net, route->data, route->size, &rep);
    }
    if (r->role == PSD_ROLE_PRIMARY)
        try_snapshots(r); /* a round may have just closed */
}

/* A primary stopping being one: the requests whose replies it held are
 * answered PS_ENOTPRIMARY instead (what they did may not be on the
 * replica that goes on, so the clients send them there). */
static void refuse_held(struct psd_repl *r)
{
    r->role = PSD_ROLE_CANDIDATE; /* what the refusals say */
    r->primary[0] = '\0';
    while (r->held_n > 0) {
        struct psd_held *e = &r->held[r->held_head];
        Ps__Header *h = ps__header__unpack(NULL, e->rep.hdr_len, e->hdr);
        struct ps_frame route = {e->route, e->route_len};
        if (h != NULL) {
            reply_not_primary(r, &route, h);
            ps__header__free_unpacked(h, NULL);
        }
        psd_reply_drop(&e->rep);
        free(e->hdr);
        r->held_head = (r->held_head + 1) % PSD_HELD_MAX;
        r->held_n--;
    }
}

static void step_down(struct psd_repl *r, const char *why)
{
    if (r->role != PSD_ROLE_PRIMARY)
        return;
    PS_LOG(r->log, PS_LOG_ERROR, S0716,
           "shard %u: no longer primary (%s); %u replies held are refused as not primary, the "
           "clients send them again",
           r->srv->conf.shard, why, r->held_n);
    refuse_held(r);
    psd_lead_resign(&r->lead);
    psd_transfer_end(&r->xfer);
    psd_backlog_reset(&r->backlog, 0);
    memset(&r->backups, 0, sizeof r->backups);
    psd_set_worker_timeout(r->srv, 0);
    r->view_ms = 0;
}

/* A primary's tick: its lease, its backups, and the replies they let go. */
static void primary_tick(struct psd_repl *r, uint64_t now)
{
    if (r->lead.lease == 0) {
        step_down(r, "etcd no longer holds its lease");
        return;
    }
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        struct psd_backup *b = &r->backups.b[i];
        if (psd_backup_silent(b, now, r->timeout_ms, CATCH_UP_MS)) {
            char why[64];
            snprintf(why, sizeof why, "silent for %" PRIu64 " ms", now - b->heard_ms);
            drop_backup(r, b, why);
        }
    }
    etcd_next(r, now); /* a renewal due, a set etcd did not take before */
    if (r->role != PSD_ROLE_PRIMARY)
        return;
    if (now - r->beat_ms >= BEAT_MS) {
        r->beat_ms = now;
        Ps__Header h;
        psd_record_header(&h, PS__RECORD__REC_BEAT, r->epoch, r->seq);
        for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
            if (psd_backup_gets_beats(&r->backups.b[i]))
                send_record(r, &r->backups.b[i], &h, NULL, 0);
    }
    if (psd_transfer_busy(&r->xfer))
        step_transfer(r);
    try_snapshots(r);
    flush(r);
    drained(r, now);
}

/* A name whose lease etcd dropped is claimed again, by a replica that
 * serves nobody (a blocking call); another process holding it now ends
 * this one. */
static void reclaim_name(struct psd_repl *r, uint64_t now)
{
    if (r->lead.name[0] == '\0' || r->lead.member_lease != 0 || r->role == PSD_ROLE_PRIMARY ||
        now - r->claimed_ms < VIEW_DOWN_MS)
        return;
    r->claimed_ms = now;
    char holder[PS_ENDPOINT_MAX];
    int rc = psd_lead_claim(&r->lead, r->lead.name, holder, sizeof holder);
    if (rc == PS_EBUSY && r->fatal != NULL) {
        char why[PS_ENDPOINT_MAX + 160];
        snprintf(why, sizeof why,
                 "--replica-name %s is held by the process at %s: two processes may not share "
                 "one",
                 r->lead.name, holder);
        PS_LOG(r->log, PS_LOG_ERROR, S0726, "%s; stopping", why);
        r->fatal(r->fatal_ctx, why);
    }
}

static void on_tick(uv_timer_t *t)
{
    struct psd_repl *r = t->data;
    uint64_t now = now_ms();
    if (r->role != PSD_ROLE_PRIMARY) {
        reclaim_name(r, now);
        etcd_next(r, now); /* the name's lease */
    }
    if (r->role == PSD_ROLE_PRIMARY)
        primary_tick(r, now);
    else if (r->role == PSD_ROLE_CANDIDATE ||
             (r->role == PSD_ROLE_BACKUP && now - r->heard_ms > r->timeout_ms))
        psd__repl_consult(r, now);
}

int psd_repl_start(struct psd_repl *r, struct psd_net *net, uv_loop_t *loop,
                   const struct psd_repl_config *cfg, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->net = net;
    r->srv = net->srv;
    r->log = net->srv->conf.log;
    r->loop = loop;
    r->timeout_ms = cfg->timeout_ms;
    r->snap_fd = -1;
    psd_transfer_init(&r->xfer, cfg->transfer_kept_bytes);
    psd_backlog_init(&r->backlog, cfg->backlog_bytes);
    /* a checkpoint restored at start is a state a primary may bring up to date */
    psd_checkpoint_restored_at(net->srv, &r->resume_epoch, &r->resume_seq);
    r->resumable = r->resume_epoch != 0;
    const char *tmp = getenv("TMPDIR");
    snprintf(r->snap_dir, sizeof r->snap_dir, "%s/psd-replica-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(r->snap_dir) == NULL) {
        r->snap_dir[0] = '\0';
        return ps_errf(PS_EIO, err, errlen, "cannot make a directory for state transfers: %s",
                       strerror(errno));
    }
    r->held = calloc(PSD_HELD_MAX, sizeof *r->held);
    r->arena_buf = malloc(2 * PSD_REPL_ARENA_BYTES);
    if (r->held == NULL || r->arena_buf == NULL)
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory for held replies");
    ps_arena_init(&r->req_arena, r->arena_buf, PSD_REPL_ARENA_BYTES);
    ps_arena_init(&r->rec_arena, r->arena_buf + PSD_REPL_ARENA_BYTES, PSD_REPL_ARENA_BYTES);
    const struct psd_conf *c = &r->srv->conf;
    if (cfg->name != NULL && psd_lead_name_check(cfg->name, err, errlen) != 0)
        return PS_EINVAL;
    int rc = psd_lead_init(&r->lead, cfg->etcd, cfg->prefix, c->shard, c->shards,
                           cfg->name != NULL ? psd_lead_name_id(cfg->name) : c->instance,
                           cfg->advertise, cfg->lease_ttl_s, err, errlen);
    if (rc != 0 || (cfg->name != NULL &&
                    (rc = psd_lead_claim_at_start(&r->lead, cfg->name, r->log, err, errlen)) != 0))
        return rc;
    r->fatal = cfg->fatal;
    r->fatal_ctx = cfg->fatal_ctx;
    r->follow = zmq_socket(net->ctx, ZMQ_DEALER);
    int zero = 0;
    const struct ps_curve_keys *k = cfg->curve;
    if (k != NULL)
        snprintf(r->curve_pub, sizeof r->curve_pub, "%s", k->pub);
    if (r->follow == NULL || zmq_setsockopt(r->follow, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(r->follow, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
        (k != NULL &&
         (zmq_setsockopt(r->follow, ZMQ_CURVE_SERVERKEY, k->pub, sizeof k->pub) != 0 ||
          zmq_setsockopt(r->follow, ZMQ_CURVE_PUBLICKEY, k->pub, sizeof k->pub) != 0 ||
          zmq_setsockopt(r->follow, ZMQ_CURVE_SECRETKEY, k->sec, sizeof k->sec) != 0)) ||
        (rc = ps_zsock_start(loop, &r->fzs, r->follow, psd__repl_on_record, r)) != 0)
        return ps_errf(PS_EZMQ, err, errlen, "cannot open the socket to a primary: %s",
                       zmq_strerror(errno));
    r->worker_timeout_ms = psd_worker_timeout_ms(r->srv);
    psd_set_worker_timeout(r->srv, 0); /* until primary: only the primary drops workers */
    psd_set_hooks(r->srv, on_drop, psd_repl_stats, on_floor, r);
    psd_checkpoint_position(r->srv, &r->epoch, &r->seq);
    /* the primary's calls (its lease, its in-sync set) never hold the
     * loop; each may take a third of the lease, the time between renewals */
    if ((rc = psd_etcd_async_start(&r->lead.etcd, loop,
                                   (long)cfg->lease_ttl_s * 1000 / PSD_RENEWS_PER_TTL, err,
                                   errlen)) != 0)
        return rc;
    net->repl = r;
    net->repl_request = psd_repl_request;
    net->repl_hold = psd_repl_hold;
    r->wait_for_primary = cfg->replica_of != NULL;
    if (cfg->replica_of != NULL)
        psd__repl_follow(r, cfg->replica_of, 0); /* etcd names the primary at the first tick */
    uv_timer_init(loop, &r->timer);
    r->timer.data = r;
    uv_timer_start(&r->timer, on_tick, 0, TICK_MS);
    return 0;
}

/* A primary stopping cleanly: etcd records the state it stops at (its
 * checkpoint's label), so that a replica restarted from that checkpoint
 * may take over without anyone touching etcd (lead.h). */
static void record_stop(struct psd_repl *r)
{
    uint64_t ids[PSD_BACKUPS_MAX];
    const char *eps[PSD_BACKUPS_MAX];
    uint32_t n = psd_backups_in_sync(&r->backups, ids, eps);
    int ok = 0;
    int rc = psd_lead_set_stopped(&r->lead, ids, eps, n, r->seq, &ok);
    if (rc != 0 || !ok)
        PS_LOG(r->log, PS_LOG_WARN, S0721,
               "cannot record the clean stop in etcd (%s): a restart waits for a replica of the "
               "in-sync set, or psctl recover",
               rc != 0 ? r->lead.etcd.err : "etcd's leader key is no longer this process's");
    else
        PS_LOG(r->log, PS_LOG_INFO, S0720,
               "shard %u stopped cleanly: etcd records its state as epoch %" PRIu64
               " record %" PRIu64 ", which the checkpoint holds; a replica restarted from it "
               "takes over",
               r->srv->conf.shard, r->epoch, r->seq);
}

void psd_repl_stop(struct psd_repl *r, int checkpointed)
{
    if (r->role == PSD_ROLE_PRIMARY) {
        if (checkpointed)
            record_stop(r);
        Ps__Header h; /* the last record: backups stopping stop now, others take over */
        psd_record_header(&h, PS__RECORD__REC_BEAT, r->epoch, r->seq);
        h.last = 1;
        for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
            if (psd_backup_gets_beats(&r->backups.b[i]))
                send_record(r, &r->backups.b[i], &h, NULL, 0);
        flush(r);
        /* the socket closes next: that record (and any reply queued) may
         * take this long to go, instead of being dropped */
        int linger = LAST_RECORD_LINGER_MS;
        zmq_setsockopt(r->net->sock, ZMQ_LINGER, &linger, sizeof linger);
        PS_LOG(r->log, PS_LOG_INFO, S0719,
               "giving up the primary's lease: a backup takes over (%" PRIu64
               " request(s) read while the last replies went were dropped: their clients send "
               "them again)",
               r->drain_dropped);
        psd_lead_resign(&r->lead);
        refuse_held(r);
    }
    if (r->follow != NULL)
        ps_zsock_close(&r->fzs);
    psd_transfer_end(&r->xfer);
    psd_etcd_async_close(&r->lead.etcd);
    psd_lead_unclaim(&r->lead); /* the name is free for this replica's next run */
    if (r->held != NULL)
        uv_close((uv_handle_t *)&r->timer, NULL);
}

int psd_repl_drain(struct psd_repl *r, void (*done)(void *ctx), void *ctx)
{
    if (r->role != PSD_ROLE_PRIMARY || r->held_n == 0)
        return 0;
    r->draining = 1;
    r->drained = done;
    r->drained_ctx = ctx;
    r->drain_until_ms = now_ms() + r->timeout_ms + BEAT_MS;
    return 1;
}

int psd_repl_stop_after_primary(struct psd_repl *r, void (*stopped)(void *ctx), void *ctx)
{
    if (r->role != PSD_ROLE_BACKUP || !r->loaded)
        return 0;
    r->stopping = 1;
    r->stopped = stopped;
    r->stopped_ctx = ctx;
    return 1;
}

void psd_repl_fini(struct psd_repl *r)
{
    if (r->follow != NULL)
        zmq_close(r->follow);
    r->follow = NULL;
    drop_held(r);
    psd_transfer_end(&r->xfer);
    psd_backlog_reset(&r->backlog, 0);
    free(r->held);
    r->held = NULL;
    free(r->arena_buf);
    r->arena_buf = NULL;
    psd_lead_fini(&r->lead);
    if (r->snap_dir[0] != '\0') {
        char path[PS_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/transfer", r->snap_dir);
        unlink(path);
        rmdir(r->snap_dir);
    }
}
