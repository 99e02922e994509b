/* A backup's side of replication (repl.h): following a primary, taking
 * its state and applying its records, and taking over when etcd says so. */
#define _GNU_SOURCE
#include "repl_impl.h"

#include "backups.h"
#include "record.h"

#include "catalog.h"
#include "checkpoint.h"
#include "reply.h"
#include "security.h"
#include "waits.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_zmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void psd__repl_send_follow(struct psd_repl *r)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_FOLLOW);
    h.epoch = r->epoch;
    h.instance = r->lead.id;
    h.detail = r->lead.endpoint;
    if (r->resumable) {
        h.resume_epoch = r->resume_epoch;
        h.resume_seq = r->resume_seq;
    }
    psd_record_send(r->follow, &h, 0);
    r->followed_ms = (uint64_t)ps_mono_ms();
}

/* A replica about to follow another primary, or to lead: the state it
 * holds, as its last primary's (or its own as primary) after record seq
 * of epoch, is one the next primary may bring up to date (resumable).
 * One that holds the checkpoint it restored keeps that position. */
static void hold_position(struct psd_repl *r)
{
    if (r->loaded && r->epoch != 0) {
        r->resumable = 1;
        r->resume_epoch = r->epoch;
        r->resume_seq = r->seq;
    }
}

/* Follows the primary at endpoint (epoch): asks for its state, which
 * replaces this replica's. */
void psd__repl_follow(struct psd_repl *r, const char *endpoint, uint64_t epoch)
{
    if (r->primary[0] != '\0')
        zmq_disconnect(r->follow, r->primary);
    snprintf(r->primary, sizeof r->primary, "%s", endpoint);
    hold_position(r);
    r->role = PSD_ROLE_BACKUP;
    r->epoch = epoch;
    r->seq = 0;
    r->loaded = 0;
    psd_checkpoint_hold(r->srv, 1);
    r->snap_bytes = 0;
    r->heard_ms = (uint64_t)ps_mono_ms();
    if (zmq_connect(r->follow, endpoint) != 0) {
        PS_LOG(r->log, PS_LOG_ERROR, S0710, "cannot connect to the primary %s: %s", endpoint,
               zmq_strerror(errno));
        r->role = PSD_ROLE_CANDIDATE;
        r->primary[0] = '\0';
        return;
    }
    PS_LOG(r->log, PS_LOG_INFO, S0711, "following the primary %s (epoch %" PRIu64 ")", endpoint,
           epoch);
    psd__repl_send_follow(r);
}

/* Starts over from a new state transfer (a record missing or refused). */
static void resync(struct psd_repl *r, const char *why)
{
    PS_LOG(r->log, PS_LOG_WARN, S0712, "asking %s for its state again: %s", r->primary, why);
    r->resyncs++;
    r->loaded = 0;
    r->resumable = 0;
    psd_checkpoint_hold(r->srv, 1);
    r->snap_bytes = 0;
    r->seq = 0;
    psd__repl_send_follow(r);
}

static void load_snapshot(struct psd_repl *r, uint64_t seq)
{
    char path[PS_PATH_MAX + 16], err[256];
    snprintf(path, sizeof path, "%s/transfer", r->snap_dir);
    psd_reset_state(r->srv);
    r->resumable = 0;
    int rc = psd_checkpoint_load(r->srv, path, err, sizeof err);
    if (rc != 0) {
        psd_reset_state(r->srv);
        PS_LOG(r->log, PS_LOG_ERROR, S0713, "state transfer from %s does not load: %s", r->primary,
               err);
        return; /* asked again when the primary is heard from (timer) */
    }
    r->loaded = 1;
    psd_checkpoint_hold(r->srv, 0);
    r->seq = seq;
    PS_LOG(r->log, PS_LOG_INFO, S0714,
           "state from %s loaded (%u tables, %" PRIu64 " bytes, record %" PRIu64
           "); applying its changes",
           r->primary, psd_ntables(r->srv), r->snap_bytes, seq);
}

/* The primary brings the state this replica named in its follow up to
 * date (REC_RESUME): the records after h->seq follow. */
static void on_resume(struct psd_repl *r, const Ps__Header *h)
{
    if (r->loaded || !r->resumable || h->resume_epoch != r->resume_epoch ||
        h->resume_seq != r->resume_seq) {
        resync(r, "the primary resumes a state this replica does not hold");
        return;
    }
    r->resumable = 0;
    r->loaded = 1;
    r->resumed++;
    psd_waits_clear(r->srv); /* as the primary did when it took over: none is answered */
    psd_checkpoint_hold(r->srv, 0);
    r->seq = h->seq;
    PS_LOG(r->log, PS_LOG_INFO, S0731,
           "resuming from this replica's own state (epoch %" PRIu64 " record %" PRIu64
           "), which is %s's after record %" PRIu64 " of epoch %" PRIu64
           ": no state transfer; its records after it follow",
           r->resume_epoch, r->resume_seq, r->primary, h->seq, h->epoch);
}

static void on_snapshot_piece(struct psd_repl *r, const Ps__Header *h, zmq_msg_t *parts,
                              size_t kept)
{
    char path[PS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/transfer", r->snap_dir);
    if (kept != 2 || !psd_record_piece_fits(h, zmq_msg_size(&parts[1]), r->snap_bytes)) {
        resync(r, "a piece of the state transfer is out of order");
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | (h->offset == 0 ? O_TRUNC : 0) | O_CLOEXEC, 0600);
    ssize_t n = fd >= 0
                    ? pwrite(fd, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), (off_t)h->offset)
                    : -1;
    if (fd >= 0)
        close(fd);
    if (n != (ssize_t)zmq_msg_size(&parts[1])) {
        PS_LOG(r->log, PS_LOG_ERROR, S0713, "state transfer: cannot write %s: %s", path,
               strerror(errno));
        return;
    }
    r->snap_bytes += (uint64_t)n;
    if (h->last)
        load_snapshot(r, h->seq);
}

static void apply_record(struct psd_repl *r, const Ps__Header *h, zmq_msg_t *parts, size_t kept,
                         size_t total)
{
    if (!r->loaded)
        return; /* behind a state transfer asked for: it holds this */
    if (h->seq != r->seq + 1) {
        char why[96];
        snprintf(why, sizeof why, "record %" PRIu64 " came after %" PRIu64, h->seq, r->seq);
        resync(r, why);
        return;
    }
    if (h->route.len > PS_ROUTE_ID_MAX) {
        resync(r, "a record names a routing id longer than ZeroMQ's");
        return;
    }
    if (h->record == PS__RECORD__REC_DROP) {
        psd_drop_worker(r->srv, h->worker_id);
    } else if (h->record == PS__RECORD__REC_AGE_FLOOR) {
        if (psd_set_age_floor(r->srv, h->table_id, h->offset) != 0) {
            char why[128];
            snprintf(why, sizeof why,
                     "a record raises table %u's age floor to %" PRIu64
                     ", which this backup's table cannot take",
                     h->table_id, h->offset);
            resync(r, why);
            return;
        }
    } else {
        struct ps_frame frames[PARTS_MAX] = {{0}};
        for (size_t i = 1; i < kept; i++) {
            frames[i - 1].data = zmq_msg_data(&parts[i]);
            frames[i - 1].size = zmq_msg_size(&parts[i]);
        }
        struct ps_frame route = {h->route.data, h->route.len};
        struct psd_reply rep;
        if (psd_dispatch_replayed(r->srv, &route, h->user && h->user[0] ? h->user : NULL, frames,
                                  total - 1, &rep) == PSD_ANSWER_NOW)
            psd_reply_drop(&rep);
    }
    r->seq = h->seq;
    r->records_applied++;
}

/* A backup asked to stop has followed its primary to its end (or lost
 * it): it stops now (repl.h). */
static void stop_now(struct psd_repl *r)
{
    void (*done)(void *) = r->stopped;
    r->stopped = NULL;
    if (done != NULL)
        done(r->stopped_ctx);
}

/* One record of the followed epoch. */
static void on_record_apply(struct psd_repl *r, const Ps__Header *h, zmq_msg_t *parts, size_t kept,
                            size_t total)
{
    uint64_t before = r->seq;
    r->heard_ms = (uint64_t)ps_mono_ms();
    if (h->record == PS__RECORD__REC_SNAPSHOT)
        on_snapshot_piece(r, h, parts, kept);
    else if (h->record == PS__RECORD__REC_RESUME)
        on_resume(r, h);
    else if (h->record == PS__RECORD__REC_REQUEST || h->record == PS__RECORD__REC_DROP ||
             h->record == PS__RECORD__REC_AGE_FLOOR)
        apply_record(r, h, parts, kept, total);
    else if (h->record == PS__RECORD__REC_BEAT && !r->loaded &&
             (uint64_t)ps_mono_ms() - r->followed_ms > CATCH_UP_MS)
        resync(r, "no state transfer came");
    if (h->record == PS__RECORD__REC_BEAT && h->last) { /* the primary stops */
        if (r->stopping && r->loaded && h->seq == r->seq) {
            stop_now(r);
            return;
        }
        r->heard_ms = 0; /* ask etcd at the next tick: take over, or follow the next */
    }
    /* acknowledge what was applied, and beats (the primary hears this
     * backup is alive); while more records wait, one acknowledgement
     * covers up to ACK_EVERY of them */
    if (!r->loaded ||
        (r->seq == before && h->record != PS__RECORD__REC_BEAT &&
         h->record != PS__RECORD__REC_SNAPSHOT && h->record != PS__RECORD__REC_RESUME))
        return;
    int events = 0;
    size_t len = sizeof events;
    if (h->record == PS__RECORD__REC_REQUEST && r->seq - r->acked_sent < ACK_EVERY &&
        zmq_getsockopt(r->follow, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN))
        return; /* the next record's acknowledgement covers this one */
    Ps__Header a;
    psd_record_header(&a, PS__RECORD__REC_BEAT, r->epoch, r->seq);
    a.instance = r->lead.id;
    if (psd_record_send(r->follow, &a, 0) == 0)
        r->acked_sent = r->seq;
}

void psd__repl_message(struct psd_repl *r, zmq_msg_t *parts, size_t kept, size_t total)
{
    Ps__Header *h = kept > 0 ? psd_record_unpack(&r->rec_arena, zmq_msg_data(&parts[0]),
                                                 zmq_msg_size(&parts[0]))
                             : NULL;
    if (h == NULL || r->role != PSD_ROLE_BACKUP) {
        /* nothing a primary sends, or a reply to a follow when it was not one */
    } else if (h->status == PS_ENOTPRIMARY) {
        r->heard_ms = 0; /* ask etcd now */
    } else if (h->op == PS__OP__OP_REPLICATE && r->epoch == 0 && h->epoch != 0 &&
               ((h->record == PS__RECORD__REC_SNAPSHOT && h->offset == 0) ||
                h->record == PS__RECORD__REC_RESUME)) {
        r->epoch = h->epoch; /* followed by --replica-of before etcd named an epoch */
        on_record_apply(r, h, parts, kept, total);
    } else if (h->op == PS__OP__OP_REPLICATE && h->epoch == r->epoch) {
        on_record_apply(r, h, parts, kept, total);
    }
}

int psd__repl_on_record(struct ps_zsock *zs, void *arg)
{
    (void)zs;
    struct psd_repl *r = arg;
    zmq_msg_t parts[PARTS_MAX];
    size_t kept = 0, total = 0;
    if (ps_zmsg_recv(r->follow, ZMQ_DONTWAIT, parts, PARTS_MAX, &kept, &total, NULL) != 0)
        return -1;
    psd__repl_message(r, parts, kept, total);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}

static void promote(struct psd_repl *r)
{
    struct psd *s = r->srv;
    char was[PS_ENDPOINT_MAX];
    snprintf(was, sizeof was, "%s", r->primary[0] ? r->primary : "none");
    if (r->primary[0] != '\0')
        zmq_disconnect(r->follow, r->primary);
    snprintf(r->primary, sizeof r->primary, "%s", r->lead.endpoint);
    /* the state this epoch begins from: a backup that holds it too may
     * resume (backlog.h) */
    hold_position(r);
    r->prev_epoch = r->resumable ? r->resume_epoch : 0;
    r->prev_seq = r->resumable ? r->resume_seq : 0;
    r->resumable = 0;
    r->role = PSD_ROLE_PRIMARY;
    r->epoch = r->lead.epoch;
    r->seq = 0;
    psd_backlog_reset(&r->backlog, 0);
    memset(&r->backups, 0, sizeof r->backups);
    r->promotions++;
    psd_checkpoint_hold(s, 0);
    psd_take_over(s, r->worker_timeout_ms);
    PS_LOG(r->log, PS_LOG_WARN, S0715,
           "shard %u: this replica is the primary now, epoch %" PRIu64 " (the last was %s); %u "
           "tables",
           s->conf.shard, r->epoch, was, psd_ntables(s));
}

void psd__repl_consult(struct psd_repl *r, uint64_t now)
{
    /* an etcd that does not answer is asked less often: each call holds
     * the loop up to its timeout */
    if (now - r->view_ms < (r->etcd_down ? VIEW_DOWN_MS : VIEW_MS))
        return;
    r->view_ms = now;
    if (r->stopping) { /* a backup stopping whose primary fell silent: never a candidate */
        stop_now(r);
        return;
    }
    struct psd_lead_view v;
    r->etcd_down = psd_lead_read(&r->lead, &v) != 0;
    if (!r->etcd_down)
        r->seen = v;
    if (r->etcd_down) {
        if (ps_log_sampled(++r->etcd_failures))
            PS_LOG(r->log, PS_LOG_WARN, S0717, "cannot read the shard's keys from etcd: %s",
                   r->lead.etcd.err);
        return;
    }
    if (v.leader && v.leader_id != r->lead.id && strcmp(v.endpoint, r->lead.endpoint) == 0)
        return; /* the key of this endpoint's last process, killed: its lease runs out */
    int same = r->role == PSD_ROLE_BACKUP && v.epoch == r->epoch && !strcmp(v.endpoint, r->primary);
    if (v.leader && v.leader_id != r->lead.id && !same) {
        psd__repl_follow(r, v.endpoint, v.epoch);
        return;
    }
    if (v.leader && (!v.member || !r->loaded)) {
        if (now - r->followed_ms > r->timeout_ms)
            psd__repl_send_follow(r); /* the primary may have dropped this backup */
        return;
    }
    /* no primary, or one this member of its set no longer hears: a replica
     * that holds every acknowledged write takes over (lead.h); after a
     * clean stop, one whose checkpoint holds the state it stopped at */
    uint64_t at_epoch = 0, at_seq = 0;
    psd_checkpoint_restored_at(r->srv, &at_epoch, &at_seq);
    v.resume = !v.leader && v.stopped && r->role != PSD_ROLE_PRIMARY && at_epoch != 0 &&
               at_epoch == v.stopped_epoch && at_seq == v.stopped_seq && !r->loaded &&
               r->promotions == 0;
    int eligible = v.insync_found ? (v.member && r->loaded) || v.resume : !r->wait_for_primary;
    if (!eligible && v.stopped && !v.leader) {
        if (ps_log_sampled(++r->no_primary_seen))
            PS_LOG(r->log, PS_LOG_WARN, S0724,
                   "shard %u stopped cleanly at epoch %" PRIu64 " record %" PRIu64
                   "; this replica holds %s (epoch %" PRIu64 " record %" PRIu64
                   ") and may not take over: start the replica whose checkpoint holds it (or, "
                   "if none is left, psctl recover)",
                   r->srv->conf.shard, v.stopped_epoch, v.stopped_seq,
                   at_epoch ? "another state" : "no replica's checkpoint", at_epoch, at_seq);
        return;
    }
    if (!eligible) {
        if (ps_log_sampled(++r->no_primary_seen))
            PS_LOG(r->log, PS_LOG_WARN, S0718,
                   "shard %u has no primary, and only a replica in etcd's in-sync set (%s) may "
                   "take over: start one, or if all are lost run psctl recover, which names "
                   "what each survivor's checkpoint lacks and has the newest take over",
                   r->srv->conf.shard, v.members);
        return;
    }
    int won = 0;
    if (psd_lead_campaign(&r->lead, &v, &won) != 0) {
        if (ps_log_sampled(++r->etcd_failures))
            PS_LOG(r->log, PS_LOG_WARN, S0717, "campaign for primary failed: %s", r->lead.etcd.err);
    } else if (won) {
        if (v.resume && !(v.member && r->loaded))
            PS_LOG(r->log, PS_LOG_INFO, S0723,
                   "shard %u stopped cleanly at epoch %" PRIu64 " record %" PRIu64
                   ", which this replica's checkpoint holds: taking over",
                   r->srv->conf.shard, v.stopped_epoch, v.stopped_seq);
        promote(r);
    }
}

/* The campaign a clean stop allows (lead.h), asked for by psctl recover. */
static int campaign_to_recover(struct psd_repl *r, struct psd_lead_view *v, int *won)
{
    v->resume = 1;
    return psd_lead_campaign(&r->lead, v, won);
}

/* psctl recover (OP_RECOVER, repl.h): a candidate of a shard whose whole
 * in-sync set is gone takes the shard over from what it restored. */
void psd__repl_recover(struct psd_repl *r, const struct ps_frame *route, const char *user,
                       const Ps__Header *req)
{
    struct psd *s = r->srv;
    struct psd_reply rep;
    memset(&rep, 0, sizeof rep);
    uint64_t at_epoch = 0, at_seq = 0;
    psd_checkpoint_restored_at(s, &at_epoch, &at_seq);
    struct psd_lead_view v;
    int won = 0, rc = 0;
    if (r->net->sec != NULL && !psd_security_is_admin(r->net->sec, user))
        psd_reply_errorf(s, req, PS_EAUTH, &rep,
                         "recover: only a key with \"admin: yes\" in --curve-allow may ask");
    else if (r->role == PSD_ROLE_PRIMARY || (r->role == PSD_ROLE_BACKUP && r->loaded))
        psd_reply_errorf(s, req, PS_ESTATE, &rep,
                         "recover: this replica is a %s (primary %s): nothing to recover",
                         r->role == PSD_ROLE_PRIMARY ? "primary" : "backup",
                         r->primary[0] ? r->primary : "not known");
    else if (psd_ntables(s) == 0)
        psd_reply_errorf(s, req, PS_ESTATE, &rep,
                         "recover: this replica restored no checkpoint: it holds nothing to serve");
    else if ((rc = psd_lead_read(&r->lead, &v)) != 0)
        psd_reply_errorf(s, req, PS_EIO, &rep, "recover: cannot read etcd: %s", r->lead.etcd.err);
    else if (v.leader)
        psd_reply_errorf(s, req, PS_ESTATE, &rep, "recover: shard %u has a primary now (%s)",
                         s->conf.shard, v.endpoint);
    else if (!v.insync_found)
        psd_reply_errorf(s, req, PS_ESTATE, &rep,
                         "recover: etcd holds no in-sync set for shard %u: the first replica takes "
                         "a new shard by itself",
                         s->conf.shard);
    else if ((rc = campaign_to_recover(r, &v, &won)) != 0)
        psd_reply_errorf(s, req, PS_EIO, &rep, "recover: etcd: %s", r->lead.etcd.err);
    else if (!won)
        psd_reply_errorf(s, req, PS_EBUSY, &rep,
                         "recover: another replica took shard %u over first", s->conf.shard);
    if (rep.hdr != NULL) {
        psd_net_reply(r->net, route->data, route->size, &rep);
        return;
    }
    /* short enough for a reply's detail (PS_ERROR_TEXT_MAX); the log
     * names the set's members too */
    char text[PS_ERROR_TEXT_MAX];
    int len =
        snprintf(text, sizeof text,
                 "shard %u: %s took over at epoch %" PRIu64 " from its checkpoint (epoch %" PRIu64
                 " record %" PRIu64 "); lost: what the in-sync set (epoch %" PRIu64
                 ") acknowledged after it",
                 s->conf.shard, r->lead.endpoint, r->lead.epoch, at_epoch, at_seq, v.insync_epoch);
    if (len >= (int)sizeof text) /* a long endpoint: the text ends short */
        text[sizeof text - 2] = '.';
    PS_LOG(r->log, PS_LOG_WARN, S0725, "psctl recover: %s; its members were %s", text, v.members);
    r->recovered++;
    promote(r);
    Ps__Header h;
    psd_reply_init(&h, req);
    h.detail = text;
    psd_reply_header(s, &h, &rep);
    psd_net_reply(r->net, route->data, route->size, &rep);
}
