/* Who is a replicated shard's primary, decided by etcd (etcd.h), never by
 * the replicas among themselves. Two keys per shard under the prefix:
 *
 *   PREFIX/shard-I-of-S/leader  {"epoch","id","endpoint"}, on the primary's
 *                               lease: gone when the primary stops renewing
 *   PREFIX/shard-I-of-S/insync  {"epoch","members":["ID@ENDPOINT",...]}: the
 *                               replicas that hold every acknowledged write;
 *                               after a clean stop also "stopped": {"epoch",
 *                               "seq"}, the state the last primary stopped at
 *
 * A replica may take over only when the leader key is gone and it is in
 * the in-sync set (or no set exists yet: a new shard). It does so with one
 * transaction that checks both keys' revisions, so two cannot win; the
 * winner's epoch is one past the last. A primary changes the in-sync set
 * only with a transaction that checks its own leader key is still there,
 * and answers requests only while its lease is sure to hold (renewed
 * within the TTL, with a tenth to spare). Replica ids are random per
 * process, or a hash of its name (psd_lead_claim below): a restarted
 * process must catch up before it is listed either way.
 *
 * A clean stop: the primary, after its last checkpoint (labelled with
 * its epoch and record number), adds "stopped" to the in-sync key in a
 * transaction that checks its leader key, then gives up its lease. With
 * no leader, a replica whose restored checkpoint carries exactly that
 * label holds the shard's state and may take over, listed or not (a
 * restarted process has a new id); one holding another state may not. */
#ifndef PSD_LEAD_H
#define PSD_LEAD_H

#include "etcd.h"

#include "ps_limits.h"

#include <stdint.h>

#define PSD_REPLICAS_MAX    PS_REPLICAS_MAX
#define PSD_ETCD_CALL_MS    100  /* the longest one etcd call may hold psd's loop */
#define PSD_ETCD_RETRY_MS   50   /* between renewals that etcd did not answer */
#define PSD_ETCD_PREFIX_MAX 128u /* bytes of --etcd-prefix: keys stay under PSD_ETCD_KEY_MAX */
/* A lease of TTL s is sure to hold for s x this many ms after it was
 * granted or renewed: nine tenths, a tenth to spare for clock rates. */
#define PSD_LEASE_SURE_MS_PER_S 900u
/* Renewals a primary sends within one TTL (one every third of it). */
#define PSD_RENEWS_PER_TTL 3u

/* A stable replica identity (psd --replica-name): letters, digits, '.',
 * '_' and '-', at most this long (a Kubernetes pod name is a DNS label,
 * at most 63). */
#define PSD_REPLICA_NAME_MAX 63u

/* What etcd says about a shard now. */
struct psd_lead_view {
    int leader;     /* a primary holds the leader key */
    uint64_t epoch; /* the leader's, else the in-sync set's */
    uint64_t leader_id;
    char endpoint[PS_ENDPOINT_MAX]; /* the leader's */
    int insync_found;
    int64_t insync_rev;    /* mod revision of the in-sync key (0: none) */
    int member;            /* this process is in the in-sync set */
    char members[512];     /* the set as text, for logs */
    uint64_t insync_epoch; /* the in-sync set's own */
    int stopped;           /* the last primary stopped cleanly, at stopped_epoch, stopped_seq */
    uint64_t stopped_epoch, stopped_seq;
    int resume; /* set by the caller: this replica holds the stopped state (campaign) */
    char leader_value[PS_ENDPOINT_MAX + 96]; /* the leader key as read */
};

struct psd_lead {
    struct psd_etcd etcd;
    char leader_key[PSD_ETCD_KEY_MAX], insync_key[PSD_ETCD_KEY_MAX];
    uint64_t id;
    char endpoint[PS_ENDPOINT_MAX]; /* this process, as others reach it */
    int64_t ttl_s, granted_s, lease;
    char leader_value[PS_ENDPOINT_MAX + 96]; /* what this process wrote as leader */
    uint64_t epoch;                          /* held as primary */
    uint64_t lease_until_ms;                 /* requests may be answered until then */
    uint64_t renewed_ms;                     /* last keepalive sent that succeeded */
    uint64_t tried_ms;                       /* last keepalive sent */
    /* the asynchronous renewal under way (psd_lead_renew_async) */
    int64_t renew_lease;
    uint64_t renew_asked_ms;
    psd_etcd_done_fn renew_done;
    void *renew_ctx;
    /* a stable identity (psd_lead_claim): the name's key, on a lease of
     * this process's own, renewed as the leader's is */
    char name[PSD_REPLICA_NAME_MAX + 1];
    char member_key[PSD_ETCD_KEY_MAX];
    int64_t member_lease, member_granted_s;
    uint64_t member_renewed_ms, member_tried_ms;
    psd_etcd_done_fn member_done;
    void *member_ctx;
};

/* 0, or PS_E* with err. */
int psd_lead_init(struct psd_lead *l, const char *url, const char *prefix, uint32_t shard,
                  uint32_t shards, uint64_t id, const char *endpoint, int64_t ttl_s, char *err,
                  size_t errlen);
void psd_lead_fini(struct psd_lead *l);

/* Reads both keys. 0, or PS_E* (l->etcd.err says why). */
int psd_lead_read(struct psd_lead *l, struct psd_lead_view *v);

/* Tries to become primary: grants a lease and runs the transaction.
 * With no leader in v, a replica of the in-sync set (or any, before a set
 * exists, or one that holds the state a clean stop recorded: v->resume)
 * may; with one, only a replica of the set that has stopped
 * hearing from it, and only while the leader key still holds what v read
 * (a takeover: the old primary cannot answer anything after it, since this
 * replica was in its set and no longer acknowledges its records, and it
 * cannot change the set either, its key being gone). *won 1: primary at
 * l->epoch. 0 or PS_E*. */
int psd_lead_campaign(struct psd_lead *l, const struct psd_lead_view *v, int *won);

/* The primary's calls, which must not hold its loop: through etcd's
 * asynchronous calls (psd_etcd_async_start first), one at a time
 * (PS_EBUSY while one is under way: try again later).
 * psd_lead_renew_due: whether the lease's renewal is due at now_ms (a
 * third of the TTL since the last; PSD_ETCD_RETRY_MS since a try).
 * psd_lead_renew_async: starts it; done(ctx, rc, 0) once it ended, with
 * rc PS_ESTATE when etcd no longer has the lease (this process is not
 * primary); a lease given up meanwhile (psd_lead_resign) stays given up.
 * psd_lead_set_insync_async: writes the in-sync set, this process and
 * the n backups (ids and endpoints), if this process still holds the
 * leader key; done(ctx, rc, ok), ok 0 when it does not (deposed). */
int psd_lead_renew_due(const struct psd_lead *l, uint64_t now_ms);
int psd_lead_renew_async(struct psd_lead *l, uint64_t now_ms, psd_etcd_done_fn done, void *ctx);
int psd_lead_set_insync_async(struct psd_lead *l, const uint64_t *ids, const char *const *endpoints,
                              uint32_t n, psd_etcd_done_fn done, void *ctx);

/* Adds "stopped": {epoch, seq} to the in-sync set (this process and the
 * n backups), if this process still holds the leader key (*ok 0: it does
 * not). 0 or PS_E*. */
int psd_lead_set_stopped(struct psd_lead *l, const uint64_t *ids, const char *const *endpoints,
                         uint32_t n, uint64_t seq, int *ok);

/* Gives the lease up (a primary stopping): a backup takes over at once. */
void psd_lead_resign(struct psd_lead *l);

/* A stable identity. The replica's id is a hash of its name (never 0),
 * the same in every run, so a restarted process is the same replica;
 * and the name is held in etcd while the process runs, so a second
 * process claiming it is refused:
 *
 *   PREFIX/shard-I-of-S/member-NAME  {"id","endpoint"}, on a lease of the
 *                                    holder's own, renewed while it runs
 *
 * psd_lead_name_check: 0, or PS_EINVAL with err naming what is wrong.
 * psd_lead_name_id: the id the name gives.
 * psd_lead_claim: puts the name's key if no process holds it (blocking).
 * 0: held by this process now; PS_EBUSY: another holds it, its endpoint
 * in holder; else etcd's error (l->etcd.err).
 * psd_lead_member_due, psd_lead_member_renew_async: its lease's renewal,
 * as the leader's (done(ctx, rc, 0), PS_ESTATE when etcd no longer has
 * it: the name is free for anyone until claimed again).
 * psd_lead_unclaim: gives the name up (a clean stop). */
int psd_lead_name_check(const char *name, char *err, size_t errlen);
uint64_t psd_lead_name_id(const char *name);
int psd_lead_claim(struct psd_lead *l, const char *name, char *holder, size_t holderlen);
int psd_lead_member_due(const struct psd_lead *l, uint64_t now_ms);
int psd_lead_member_renew_async(struct psd_lead *l, uint64_t now_ms, psd_etcd_done_fn done,
                                void *ctx);
void psd_lead_unclaim(struct psd_lead *l);
/* psd_lead_claim as psd starts: a name still held waits for its
 * holder's lease to run out (twice the TTL and a second at most; log
 * says so, S0727): a process that stopped, killed or moved to another
 * host, lets it go within the TTL; one that runs keeps it, and this one
 * is refused (S0726, PS_EBUSY naming the holder in err). */
struct ps_log;
int psd_lead_claim_at_start(struct psd_lead *l, const char *name, struct ps_log *log, char *err,
                            size_t errlen);

#endif
