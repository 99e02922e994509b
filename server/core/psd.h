/* The psd server core: a shard's state and request dispatch, free of
 * transport.
 *
 * psd_dispatch takes the frames of one request (after the routing id) and
 * produces one reply (a packed header and an optional values buffer). It
 * validates everything: malformed input gets an error reply, never an abort.
 * The zmq transport (net/net.c), the replicas (repl/) and the fuzz targets
 * drive it. Owned by one loop thread; no locks.
 *
 * A shard is a handful of parts, each owned by one file of this folder
 * and opaque to the others, so the compiler checks that no other file
 * writes it; they form a one-way stack under psd.c, the dispatcher
 * (server/README.md, "The core"). */
#ifndef PSD_PSD_H
#define PSD_PSD_H

#include "consistency.h"
#include "prune.h"
#include "table.h"

#include "ps_limits.h"
#include "ps_log.h"
#include "ps_wire.h"

#include <stdint.h>

#define PSD_OPS_COUNT 14 /* ps.Op values, OP_NONE included */
#define PSD_ERR_CODES 32 /* room for -PS_E* codes */
/* psctl's worker id (PSC_OBSERVER): never bound to a connection */
#define PSD_OBSERVER_ID UINT32_MAX

struct ps_pool;

struct psd_params {
    uint32_t shard, shards;
    uint64_t value_bytes_max;
    struct psd_cons cons;
    uint64_t wait_timeout_ms;
    const struct psd_prune_spec *prunes; /* tables to prune, by name */
    size_t nprunes;
    uint64_t table_bytes_max;        /* weights + optimizer state of one table; 0: default */
    uint64_t worker_timeout_ms;      /* drop a worker silent this long; 0: never */
    struct ps_pool *pool;            /* a helper for big applies (--apply-threads 2), or NULL;
                                      * psd_init takes it over, even when it fails */
    uint64_t unread_bytes_max;       /* per connection (--max-unread-bytes); 0: default */
    uint64_t unread_bytes_total_max; /* in all (--max-unread-bytes-total); 0: default */
    int allow_nonfinite;             /* take pushes holding NaN or infinities */
    const char *checkpoint_dir;      /* NULL: no checkpoints (copied) */
    uint64_t checkpoint_every_ms;    /* 0: only when asked for and at shutdown */
};

/* What psd_init was given, checked and defaulted. */
struct psd_conf {
    struct ps_log *log;
    struct ps_pool *pool; /* psd_params.pool, stopped by psd_fini */
    uint32_t shard, shards;
    uint64_t value_bytes_max;
    struct psd_cons cons; /* cons.workers is at least 1 */
    uint64_t table_bytes_max;
    struct psd_prune_spec prunes[PSD_PRUNE_SPECS_MAX];
    size_t nprunes;
    int allow_nonfinite;
    uint64_t instance; /* this process's random id: hello replies, replicas */
    uint64_t start_ns;
};

/* A shard. conf is psd_init's and read-only (const: the compiler checks
 * it); each part is owned by its file, opaque elsewhere. */
struct psd {
    const struct psd_conf conf;
    struct psd_counters *ctr;  /* counters.c: requests, errors, bytes, changes */
    struct psd_hooks *hooks;   /* hooks.c: replication's */
    struct psd_replies *out;   /* reply.c: the header buffer, the sender, unread bytes */
    struct psd_catalog *cat;   /* catalog.c: the tables */
    struct psd_dedup *dedup;   /* dedup.c: the exactly-once record */
    struct psd_waits *waits;   /* waits.c: pulls waiting for a clock */
    struct psd_live *live;     /* live.c: the live set, who holds each worker id */
    struct psd_ops *ops;       /* ops.c: scratch for a request's values and keys */
    struct psd_autosave *save; /* checkpoint.c: the checkpoint schedule */
    struct psd_regions *shm;   /* regions.c: clients' shared regions */
    struct psd_dispatch *in;   /* psd.c: the arena requests are decoded into */
};

/* One reply. hdr points into the server (valid until the next dispatch);
 * mask and vals, when not NULL, are malloc'd and owned by the caller after
 * dispatch (release with free(), or hand to zmq with a free callback).
 * Frames go out as [hdr][mask?][vals?]. */
struct psd_reply {
    const uint8_t *hdr;
    size_t hdr_len;
    void *mask; /* the frame before the values: LAYOUT_MASK replies' bitmap of nonzero
                 * elements, OP_ROWS replies' keys */
    size_t mask_bytes;
    void *vals;
    size_t vals_bytes;
    struct psd_lent *lent; /* non-NULL: vals point into a table's lent block (this
                            * record held), not a buffer of the reply's own */
    int vals_borrowed;     /* vals point into a table, below PS_ZEROCOPY_BYTES_MIN:
                            * copied when sent, which is at once, never freed */
};

/* Whether a request was answered: a reply in *rep to send now, or none
 * now (it waits and is answered later through the sender, or it needs no
 * answer). */
enum psd_answer {
    PSD_ANSWER_LATER = 0,
    PSD_ANSWER_NOW = 1,
};
/* Sends a deferred reply to a routing id (the transport implements it). */
typedef void (*psd_send_cb)(void *ctx, const void *route, size_t route_len, struct psd_reply *rep);
/* Reply bytes the transport holds that have not been read: by the
 * connection `route` (*peer; route NULL: none asked) and in all (*total).
 * 0 when it keeps no record of route (too many connections hold bytes),
 * else 1. */
typedef int (*psd_unread_cb)(void *ctx, const void *route, size_t route_len, uint64_t *peer,
                             uint64_t *total);
/* Whether the client with CURVE key `user` (Z85) may use worker id w. */
typedef int (*psd_may_use_cb)(void *ctx, const char *user, uint32_t w);
/* Replication's hooks: worker w leaves the live set (before the rounds
 * it closes); a stats reply gets the replicas' part; a sparse table's
 * age floor may rise (eviction by time): 1 when it is to (the primary,
 * having sent the record), 0 on a backup, which waits for its
 * primary's. */
typedef void (*psd_drop_hook)(void *ctx, uint32_t w);
typedef void (*psd_stats_hook)(void *ctx, Ps__Stats *st);
typedef int (*psd_floor_hook)(void *ctx, uint32_t table, uint64_t floor);

/* 0, or PS_ENOMEM (with nothing left allocated). */
int psd_init(struct psd *s, struct ps_log *log, const struct psd_params *p);
void psd_fini(struct psd *s);
/* Forgets everything a checkpoint or a state transfer would bring: tables,
 * workers' exactly-once records, the live set and waiting requests (a
 * backup about to load its primary's state). */
void psd_reset_state(struct psd *s);

/* Frees a reply's buffers (what dispatch handed over and was not sent). */
void psd_reply_drop(struct psd_reply *rep);

/* Sets where deferred replies go. Without it requests never wait: a pull
 * that is not ready is refused with PS_EAGAIN. */
void psd_set_sender(struct psd *s, psd_send_cb send, void *ctx);
/* Sets how psd learns the reply bytes a connection has not read: a reply
 * with values that would take it past unread_bytes_max, or every
 * connection past unread_bytes_total_max, is refused with PS_ELIMIT. */
void psd_set_unread(struct psd *s, psd_unread_cb unread, void *ctx);
/* Sets how psd asks which worker ids a CURVE key may use. */
void psd_set_may_use(struct psd *s, psd_may_use_cb may_use, void *ctx);
/* Sets replication's hooks (repl/repl.h). */
void psd_set_hooks(struct psd *s, psd_drop_hook on_drop, psd_stats_hook on_stats,
                   psd_floor_hook on_floor, void *ctx);
/* Reply bytes no connection has read yet, in all (0 without a transport). */
uint64_t psd_unread_total(const struct psd *s);
/* The ipc:// endpoint hello replies offer to clients on this host ("" or
 * NULL: none). */
void psd_set_local_endpoint(struct psd *s, const char *endpoint);
/* What SIGHUP changes while running. */
void psd_set_wait_timeout(struct psd *s, uint64_t ms);
void psd_set_worker_timeout(struct psd *s, uint64_t ms);
void psd_set_checkpoint_every(struct psd *s, uint64_t ms);

/* A region a client on this host handed over (net.c's fd socket), mapped;
 * psd unmaps it when it goes (regions.h). PS_ELIMIT when every region
 * psd may map is bound: the caller unmaps it. */
int psd_shm_take(struct psd *s, uint64_t token, void *base, size_t size);

/* Workers in the live set. */
uint32_t psd_live_count(const struct psd *s);
/* Clocks worker w has pushed, lowest over tables (0 with no tables). */
uint64_t psd_worker_clock(const struct psd *s, uint32_t w);
/* Seconds since the newest checkpoint was written or last found to hold
 * the shard's current state; -1 when none was written. */
double psd_checkpoint_age_s(const struct psd *s);
/* A number that changes whenever what a checkpoint saves changes: tables
 * created, updates applied, rounds closed, workers' applied ids. */
uint64_t psd_state_version(const struct psd *s);
/* The state now counts as saved (a checkpoint just restored, or none to
 * restore): interval checkpoints are written only once it changes. */
void psd_checkpoint_mark_saved(struct psd *s);

/* A request's op as a counter index: PSD_OPS_COUNT when it has no valid op
 * (it did not decode). */
int psd_op_index(const Ps__Header *h);

/* Handles one request from `route`. nframes counts every frame after the
 * routing id (it may exceed the array: frames past PS_FRAMES_MAX are
 * counted, not passed). Returns PSD_ANSWER_NOW with a reply in *rep, or
 * PSD_ANSWER_LATER when there is no reply now: the request waits (its
 * reply goes out later through the sender), or it was a heartbeat (never
 * answered). Replies to other, earlier waiting requests may be sent during
 * the call. A batch (OP_BATCH) is answered through the sender, one reply
 * per request in it (PSD_ANSWER_LATER; NOW with an error reply when the
 * batch itself is bad). */
enum psd_answer psd_dispatch(struct psd *s, const struct ps_frame *route,
                             const struct ps_frame *frames, size_t nframes, struct psd_reply *rep);
/* psd_dispatch for a request that came with the CURVE key `user` (Z85,
 * the connection's ZAP user id; NULL without CURVE). A hello binds its
 * worker id (one of the rounds', 0..W-1) to the connection and key: a
 * hello with a new session from another connection for an id whose
 * holder was heard from within --worker-timeout is refused (PS_EBUSY)
 * unless it comes with the same key; under CURVE a key may say hello
 * only as the ids its allow file names (PS_EAUTH), whatever the id. */
enum psd_answer psd_dispatch_from(struct psd *s, const struct ps_frame *route, const char *user,
                                  const struct ps_frame *frames, size_t nframes,
                                  struct psd_reply *rep);
/* psd_dispatch_from for a backup's copy of a request its primary took
 * (repl/follow.c): a hello is then never refused (the primary decided). */
enum psd_answer psd_dispatch_replayed(struct psd *s, const struct ps_frame *route, const char *user,
                                      const struct ps_frame *frames, size_t nframes,
                                      struct psd_reply *rep);

/* What psd_checkpoint_now did, when it did not fail. */
enum psd_ckpt_now {
    PSD_CKPT_WRITTEN = 0,
    PSD_CKPT_SKIPPED = 1, /* mid-round, or checkpoints are off */
    PSD_CKPT_HELD = 2,    /* held: a backup without its primary's state (psd_checkpoint_hold) */
};

/* Writes a checkpoint now when the shard is between rounds (why goes to
 * the log). Returns an enum psd_ckpt_now, or a PS_E* code. */
int psd_checkpoint_now(struct psd *s, const char *why);

/* Drops worker w from the live set now, as the worker timeout does: the
 * rounds go on without it until it rejoins. */
void psd_drop_worker(struct psd *s, uint32_t w);
/* Raises sparse table id's age floor (a primary's REC_AGE_FLOOR): 0, or
 * PS_ENOTABLE / PS_EINVAL (no such sparse table; a floor past its tick
 * or below its floor) with nothing changed. */
int psd_set_age_floor(struct psd *s, uint32_t id, uint64_t floor);
/* A backup becomes primary: the live workers count as heard now (through
 * the old primary until now), the waits are forgotten (they were the old
 * primary's connections: the clients send again), and workers are
 * dropped after worker_timeout_ms from here on. */
void psd_take_over(struct psd *s, uint64_t worker_timeout_ms);

/* Drops workers silent past the worker timeout from the live set (rounds
 * go on without them), expires waits past their deadline (error replies
 * naming who is missing) and logs long waits once, expires shared
 * regions nobody bound, raises the age floors of tables that evict by
 * time (a primary's or a solo shard's), and writes a checkpoint when one
 * is due. Call
 * periodically from the loop; psd_tick_at takes the time (ms of
 * ps_mono_ms) instead of reading it. */
void psd_tick(struct psd *s);
void psd_tick_at(struct psd *s, uint64_t now);

#endif
