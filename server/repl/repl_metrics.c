/* The replicas' metrics in Prometheus text (repl.h). */
#include "repl_metrics.h"

#include "checkpoint.h"

#include "ps_metrics.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

const char *psd_role_name(enum psd_role role)
{
    switch (role) {
    case PSD_ROLE_PRIMARY:
        return "primary";
    case PSD_ROLE_BACKUP:
        return "backup";
    default:
        return "candidate";
    }
}

void psd_repl_metrics(const struct psd_repl *r, struct ps_buf *b)
{
    char labels[PS_ENDPOINT_MAX + 64];
    labels[0] = '\0';
    ps_prom_label(labels, sizeof labels, "role", psd_role_name(r->role));
    ps_prom_family(b, "psd_replica_role", "gauge",
                   "This replica's role (primary, backup or candidate): 1 for the one it has.");
    ps_prom_sample(b, "psd_replica_role", labels, 1);
    const struct {
        const char *name, *type, *help;
        double v;
    } sc[] = {
        {"psd_replica_epoch", "gauge", "The fencing epoch of the primary this replica knows.",
         (double)r->epoch},
        {"psd_replica_records", "gauge",
         "Records sent (primary) or applied (backup) in this epoch.", (double)r->seq},
        {"psd_replica_record_bytes_total", "counter", "Bytes of requests sent to backups.",
         (double)r->record_bytes},
        {"psd_replica_replies_held", "gauge",
         "Replies waiting for backups to apply what they depend on.", (double)r->held_n},
        {"psd_replica_replies_held_max", "gauge", "The most replies held at once.",
         (double)r->held_peak},
        {"psd_replica_replies_dropped_total", "counter",
         "Replies dropped: more held than PSD_HELD_MAX, or out of memory (clients send again).",
         (double)r->held_dropped},
        {"psd_replica_promotions_total", "counter", "Times this replica became primary.",
         (double)r->promotions},
        {"psd_replica_resyncs_total", "counter",
         "State transfers this backup asked for again (a record missing).", (double)r->resyncs},
        {"psd_replica_backups_dropped_total", "counter", "Backups this primary dropped.",
         (double)r->backups_dropped},
        {"psd_replica_follows_refused_total", "counter",
         "Replicas refused as backups: this primary had its most (PSD_BACKUPS_MAX) already.",
         (double)r->follows_refused},
        {"psd_replica_etcd_calls_total", "counter", "Calls to etcd, blocking or not.",
         (double)r->lead.etcd.calls},
        {"psd_replica_etcd_blocking_calls_total", "counter",
         "Calls to etcd that held the loop (made only while this replica serves nobody: a "
         "candidate's or a lost primary's, a campaign, a stop); a primary's go on the loop.",
         (double)r->lead.etcd.blocking},
        {"psd_replica_etcd_failures_total", "counter", "Calls to etcd that failed.",
         (double)r->lead.etcd.failures},
        {"psd_replica_transfers_total", "counter",
         "State transfers this primary began for joining backups.", (double)r->xfer.started},
        {"psd_replica_transfers_forked_total", "counter",
         "...of them written by a forked writer while the shard served (else on the loop).",
         (double)r->xfer.forked},
        {"psd_replica_transfer_kept_bytes", "gauge",
         "Bytes of records kept for backups whose state transfer is under way.",
         (double)r->xfer.kept.bytes},
        {"psd_replica_transfer_kept_bytes_max", "gauge",
         "The most bytes of records kept at once (bound: --replica-transfer-mib).",
         (double)r->xfer.kept_peak_bytes},
        {"psd_replica_transfer_over_bound_total", "counter",
         "State transfers ended because the records kept passed their bound.",
         (double)r->xfer.over_bound},
        {"psd_replica_backlog_bytes", "gauge",
         "Bytes of this primary's newest records kept for backups that resume (bound: "
         "--replica-backlog-mib).",
         (double)r->backlog.q.bytes},
        {"psd_replica_backlog_records", "gauge", "Records in the backlog.", (double)r->backlog.q.n},
        {"psd_replica_backlog_evicted_total", "counter",
         "Records the backlog let go for its bound.", (double)r->backlog.evicted},
        {"psd_replica_resumes_total", "counter",
         "Backups brought up to date from a state of their own, without a state transfer (a "
         "primary counts those it sent, a backup the times it resumed).",
         (double)r->resumed},
        {"psd_replica_resumes_refused_total", "counter",
         "Backups that named a state of their own which the backlog could not bring up to "
         "date: they got the whole state (S0730 says why).",
         (double)r->resume_refused},
        {"psd_replica_not_primary_total", "counter",
         "Requests refused because this replica is not the primary.",
         (double)r->refused_not_primary},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++)
        ps_prom_metric(b, sc[i].name, sc[i].type, sc[i].help, sc[i].v);
    ps_prom_family(b, "psd_replica_backup_lag", "gauge",
                   "Records a backup has not acknowledged, by backup (in_sync: etcd lists it).");
    for (uint32_t i = 0; r->role == PSD_ROLE_PRIMARY && i < PSD_BACKUPS_MAX; i++) {
        const struct psd_backup *k = &r->backups.b[i];
        if (k->state == PSD_BACKUP_FREE)
            continue;
        labels[0] = '\0';
        ps_prom_label(labels, sizeof labels, "backup", k->endpoint);
        ps_prom_label(labels, sizeof labels, "in_sync", k->state == PSD_BACKUP_IN_SYNC ? "1" : "0");
        ps_prom_sample(b, "psd_replica_backup_lag", labels, (double)psd_backup_lag(k, r->seq));
    }
}

int psd_repl_ready(const struct psd_repl *r, char *why, size_t len)
{
    uint32_t shard = r->srv->conf.shard;
    if (r->role == PSD_ROLE_PRIMARY) {
        snprintf(why, len, "primary of shard %u, epoch %" PRIu64, shard, r->epoch);
        return 1;
    }
    if (r->role == PSD_ROLE_BACKUP && r->loaded) {
        snprintf(why, len, "backup of shard %u, following %s at record %" PRIu64, shard, r->primary,
                 r->seq);
        return 1;
    }
    if (r->role == PSD_ROLE_BACKUP)
        snprintf(why, len, "backup of shard %u, waiting for its state from %s", shard, r->primary);
    else
        snprintf(why, len, "shard %u has no primary this replica follows (etcd's in-sync set: %s)",
                 shard, r->seen.members[0] ? r->seen.members : "none read");
    return 0;
}

void psd_repl_stats(void *ctx, Ps__Stats *st)
{
    struct psd_repl *r = ctx;
    static Ps__ReplicaStats rs[PSD_BACKUPS_MAX];
    static Ps__ReplicaStats *rp[PSD_BACKUPS_MAX];
    st->role = (char *)psd_role_name(r->role);
    st->epoch = r->epoch;
    st->primary = r->primary;
    st->repl_seq = r->seq;
    if (r->role == PSD_ROLE_PRIMARY || r->loaded) { /* else: what it restored */
        st->ckpt_epoch = r->epoch;
        st->ckpt_seq = r->seq;
    } else if (r->resumable) { /* the last primary's, or what it restored */
        st->ckpt_epoch = r->resume_epoch;
        st->ckpt_seq = r->resume_seq;
    } else {
        psd_checkpoint_restored_at(r->srv, &st->ckpt_epoch, &st->ckpt_seq);
    }
    st->insync_epoch = r->seen.insync_epoch;
    st->insync = r->seen.members;
    st->insync_stopped = r->seen.stopped;
    st->n_replicas = 0;
    st->replicas = rp;
    for (uint32_t i = 0; r->role == PSD_ROLE_PRIMARY && i < PSD_BACKUPS_MAX; i++) {
        const struct psd_backup *b = &r->backups.b[i];
        if (b->state == PSD_BACKUP_FREE)
            continue;
        Ps__ReplicaStats *o = &rs[st->n_replicas];
        ps__replica_stats__init(o);
        o->endpoint = (char *)b->endpoint;
        o->id = b->id;
        o->acked = b->acked;
        o->lag = psd_backup_lag(b, r->seq);
        o->in_sync = b->state == PSD_BACKUP_IN_SYNC;
        rp[st->n_replicas++] = o;
    }
}
