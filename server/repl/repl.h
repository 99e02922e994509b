/* Replicas of a shard (psd --etcd): the primary sends every request that
 * may change the shard, in the order it handled them, to its backups, and
 * answers nobody until each in-sync backup has applied what the answer
 * depends on; a backup applies the same requests in the same order, so it
 * holds the same state, and takes over when etcd says the primary is gone
 * (lead.h). Records travel on the shard's own ROUTER socket: a backup
 * connects a DEALER to its primary and says OP_FOLLOW; the primary
 * answers with its state (a checkpoint, taken between rounds) and then a
 * record per request (OP_REPLICATE), which the backup acknowledges.
 *
 * What is not replicated is what cannot change the state: stats, row
 * listings, checkpoint requests, and hellos the primary refused. Workers
 * dropped by the primary's timeout go as records of their own; a backup
 * never drops a worker by itself. Shared memory and the same-host
 * endpoint are off on replicated shards (a backup could not read the
 * region). All of it runs on psd's loop. */
#ifndef PSD_REPL_H
#define PSD_REPL_H

#include "backlog.h"
#include "backups.h"
#include "lead.h"
#include "ps_curve.h"
#include "net.h"
#include "psd.h"
#include "transfer.h"

#include "ps_metrics.h"
#include "ps_zsock.h"

#include <stdint.h>
#include <uv.h>

#define PSD_HELD_MAX 65536u /* replies waiting for backups; past it they are dropped (re-sent) */

enum psd_role {
    PSD_ROLE_CANDIDATE = 0, /* no primary known yet, or one lost: asks etcd */
    PSD_ROLE_BACKUP = 1,
    PSD_ROLE_PRIMARY = 2,
};

struct psd_held {
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
    uint64_t tag; /* the records the reply depends on */
    uint8_t *hdr; /* a copy: the server's header buffer is reused */
    struct psd_reply rep;
};

struct psd_repl_config {
    const char *etcd, *prefix, *advertise, *replica_of;
    /* CURVE (NULL without): the shard's key pair, which every replica of
     * it holds; a backup connects with it, and a primary takes follows
     * and acknowledgements only from it */
    const struct ps_curve_keys *curve;
    int64_t lease_ttl_s;
    uint64_t timeout_ms; /* silence after which a backup is dropped, or a primary presumed gone */
    uint64_t transfer_kept_bytes; /* the bound on records kept during a state transfer */
    uint64_t backlog_bytes;       /* the bound on the primary's backlog (backlog.h) */
    const char *name;             /* --replica-name: a stable identity (lead.h), or NULL */
    /* called when this replica must stop (its name taken by another) */
    void (*fatal)(void *ctx, const char *why);
    void *fatal_ctx;
};

struct psd_repl {
    struct psd_net *net;
    struct psd *srv;
    struct ps_log *log;
    uv_loop_t *loop;
    struct psd_lead lead;
    enum psd_role role;
    uint64_t timeout_ms;
    uint64_t epoch; /* the primary's: this process's as primary, or the one it follows */
    uint64_t seq;   /* records sent (primary) or applied (backup) in this epoch */
    uint64_t worker_timeout_ms; /* psd's, kept while a backup (which never drops) */
    struct psd_backups backups;
    struct psd_held *held; /* a ring of PSD_HELD_MAX */
    uint32_t held_head, held_n;
    int in_dispatch;
    uv_timer_t timer;
    uint64_t beat_ms, view_ms;
    char snap_dir[PS_PATH_MAX]; /* where state transfers are written and read */
    struct psd_transfer xfer;   /* one to joining backups, under way (primary) */
    struct psd_backlog backlog; /* this epoch's newest records (primary) */
    /* the state this primary's epoch began from: its predecessor's after
     * record prev_seq of epoch prev_epoch (0, 0: not known) */
    uint64_t prev_epoch, prev_seq;
    /* the state is the one after record resume_seq of epoch
     * resume_epoch (the checkpoint restored at start, untouched, or the
     * last primary's): a follow asks to resume from it (backlog.h) */
    int resumable;
    uint64_t resume_epoch, resume_seq;
    /* as a backup: the socket to the primary, and the state transfer */
    void *follow;
    struct ps_zsock fzs;
    char primary[PS_ENDPOINT_MAX]; /* as etcd names it ("" none known) */
    uint64_t heard_ms, followed_ms;
    int snap_fd;
    int loaded;           /* holds its primary's state (or was primary): may take over */
    int wait_for_primary; /* --replica-of: never the first primary of a new shard */
    uint64_t acked_sent;  /* the last record acknowledged */
    char curve_pub[PS_CURVE_KEY_LEN + 1]; /* the replicas' key ("" without CURVE) */
    /* where each request's header (repl.c) and each record's (follow.c)
     * is unpacked: no allocation per message */
    struct ps_arena req_arena, rec_arena;
    unsigned char *arena_buf; /* both arenas' bytes, PSD_REPL_ARENA_BYTES each */
    uint64_t snap_bytes;
    /* counters (metrics, stats) */
    uint64_t records_sent, records_applied, record_bytes, replies_held, held_dropped;
    uint64_t promotions, resyncs, backups_dropped, refused_not_primary;
    uint64_t held_peak;
    uint64_t etcd_failures;           /* calls etcd did not answer (their warnings are sampled) */
    uint64_t no_primary_seen;         /* looks at a shard without a primary this one may not take */
    uint64_t follows_refused;         /* follows past PSD_BACKUPS_MAX */
    uint64_t resumed, resume_refused; /* backups that resumed, or asked and got a transfer */
    int etcd_down;                    /* the last read of etcd failed */
    /* the in-sync set, while primary: a write is owed (insync_wanted),
     * or under way (the slots leaving when it began, and its size) */
    int insync_wanted;
    uint32_t insync_leaving, insync_written;
    struct psd_lead_view seen; /* etcd's view as last read (stats; psctl recover) */
    uint64_t recovered;        /* takeovers psctl recover asked for */
    uint64_t claimed_ms;       /* the name was last claimed again (reclaim_name) */
    void (*fatal)(void *ctx, const char *why);
    void *fatal_ctx;
    /* stopping (psd_repl_stop_after_primary): never campaigns; done is
     * called once, at the primary's last record or when it is gone */
    int stopping;
    void (*stopped)(void *ctx);
    void *stopped_ctx;
    /* draining (psd_repl_drain): requests are refused, held replies wait
     * for their acknowledgements until drain_until_ms */
    int draining;
    uint64_t drain_until_ms, drain_dropped;
    void (*drained)(void *ctx);
    void *drained_ctx;
};

/* Starts the replica's part: etcd, the loop timer, and the first step
 * (a campaign, or following --replica-of). The transport must be started
 * (net->sock). 0, or PS_E* with err. */
int psd_repl_start(struct psd_repl *r, struct psd_net *net, uv_loop_t *loop,
                   const struct psd_repl_config *cfg, char *err, size_t errlen);
/* A primary stopping: with a checkpoint of its state (checkpointed 1), it
 * records the clean stop in etcd (lead.h), then tells its backups this
 * is its last record and gives its lease up, so a backup that goes on
 * takes over at once. */
void psd_repl_stop(struct psd_repl *r, int checkpointed);
/* A primary stopping after its last checkpoint: replies it holds for its
 * backups' acknowledgements go before it stops (a reply refused instead
 * would leave the workers without the round's weights, and other shards
 * waiting on them). New requests are read and dropped meanwhile, so the
 * state stays the checkpoint's: the clients send them again to the
 * replica that serves next (a refusal would make them leave this one
 * before its last replies reach them). 1 when it waits: done(ctx) is called once they
 * went, or after the replica timeout; 0 when nothing is held. */
int psd_repl_drain(struct psd_repl *r, void (*done)(void *ctx), void *ctx);
/* A backup that holds its primary's state and is asked to stop follows
 * on until the primary's last record (its clean stop), so that both stop
 * at the same state, and then calls stopped(ctx); also when the primary
 * is gone. 1 when it waits so, 0 when this replica should stop now (a
 * primary, or one without its primary's state). */
int psd_repl_stop_after_primary(struct psd_repl *r, void (*stopped)(void *ctx), void *ctx);
void psd_repl_fini(struct psd_repl *r);

/* The transport's request path when replicas run (net.c): a request from
 * route, as received. */
void psd_repl_request(void *repl, const struct ps_frame *route, const char *user, zmq_msg_t *parts,
                      size_t kept, size_t total);
/* Whether a reply must wait for backups: 1 when r took it (held or, off
 * the primary, dropped), 0 when it goes now. */
int psd_repl_hold(void *repl, const void *route, size_t route_len, struct psd_reply *rep);

#endif
