/* The psd server core: its state and request dispatch, free of transport.
 *
 * psd_dispatch takes the frames of one request (after the routing id) and
 * produces one reply (a packed header and an optional values buffer). It
 * validates everything: malformed input gets an error reply, never an abort.
 * The zmq transport (net.c) and the fuzz targets both drive it. Owned by one
 * loop thread; no locks. */
#ifndef PSD_PSD_H
#define PSD_PSD_H

#include "consistency.h"
#include "ps_log.h"
#include "shm.h"
#include "ps_wire.h"
#include "table.h"

#include "ps_limits.h"

#include <stdint.h>

#define PSD_OPS_COUNT    14             /* ps.Op values, OP_NONE included */
#define PSD_ERR_CODES    32             /* room for -PS_E* codes */
#define PSD_PEERS        PS_WORKERS_MAX /* exactly-once state for this many worker ids */
#define PSD_DEDUP_WINDOW 2048           /* request ids remembered one by one per worker */
#define PSD_USER_MAX     41             /* a CURVE key in Z85 and its NUL */
/* psctl's worker id (PSC_OBSERVER): never bound to a connection */
#define PSD_OBSERVER_ID UINT32_MAX
/* How long an id stays with a silent holder when --worker-timeout is 0. */
#define PSD_HOLD_MS_DEFAULT 10000u

struct psd_counters {
    uint64_t requests;
    uint64_t errors;
    uint64_t bytes_in;
    uint64_t bytes_out;
    /* requests and error replies by op (psd_op_index) and, for errors,
     * by -code (PSD_ERR_CODES: outside the known codes) */
    uint64_t by_op[PSD_OPS_COUNT + 1];
    uint64_t errors_by[PSD_OPS_COUNT + 1][PSD_ERR_CODES + 1];
};

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
};

/* A request waiting for a clock: what is needed to answer it later. */
struct psd_wait {
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
    Ps__Op op;
    uint64_t request_id;
    uint32_t worker_id, table_id;
    uint64_t clock; /* the clock it waits for */
    uint64_t offset, count;
    Ps__DType dtype; /* of the reply's values */
    int nonzero_only;
    uint32_t shm; /* PS_SHM_OUT: the values go into the route's region at shm_out */
    uint64_t shm_out;
    uint64_t since_ms, deadline_ms;
    int logged;
};

struct psd_reply;

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
 * else 1. Called with the sender's ctx. */
typedef int (*psd_unread_cb)(void *ctx, const void *route, size_t route_len, uint64_t *peer,
                             uint64_t *total);
/* Whether the client with CURVE key `user` (Z85) may use worker id w.
 * Called with the sender's ctx. */
typedef int (*psd_may_use_cb)(void *ctx, const char *user, uint32_t w);

struct psd {
    struct ps_log *log;
    struct ps_pool *pool; /* psd_params.pool, stopped by psd_fini */
    uint32_t shard, shards;
    uint64_t value_bytes_max;
    uint64_t start_ns;
    struct psd_cons cons;
    uint64_t wait_timeout_ms;
    uint64_t table_bytes_max;
    struct psd_prune_spec prunes[PSD_PRUNE_SPECS_MAX];
    size_t nprunes;

    struct psd_wait *waits; /* PS_WAITS_MAX entries */
    uint32_t nwaits;
    uint64_t deferred_total, wait_timeouts, max_staleness;
    uint64_t waits_refreshed; /* retries of a request already waiting */
    uint64_t waits_refused;   /* pulls not ready that could not wait (wait_refusal) */
    int allow_nonfinite;
    uint64_t nonfinite_refused; /* pushes refused for a NaN or an infinity */
    /* exactly-once pushes: per worker id (hashed into PSD_PEERS slots) the
     * session that said hello and the highest request id applied */
    struct psd_peer {
        uint32_t worker_id;
        uint64_t session, last_applied;
        /* ids in (last_applied - PSD_DEDUP_WINDOW, last_applied] applied so
         * far, bit id % PSD_DEDUP_WINDOW: after a restart, requests queued
         * behind a lost one arrive before its retry, out of order */
        uint64_t applied_bits[PSD_DEDUP_WINDOW / 64];
        int used;
        /* who holds the id: the connection of its session's hello and
         * that connection's CURVE key ("" without CURVE); the live set
         * says when it was last heard from */
        uint8_t route[PS_ROUTE_ID_MAX];
        size_t route_len;
        char user[PSD_USER_MAX];
    } peers[PSD_PEERS];
    uint64_t hellos_refused; /* hellos for an id another connection holds, or a key may not use */
    uint64_t duplicates_dropped;
    /* the live set: worker ids [0, cons.workers) heard from within
     * worker_timeout_ms. Any request but stats counts (workers heartbeat
     * when otherwise quiet). Never-seen ids are not dropped. */
    struct psd_live {
        uint64_t last_ms;
        uint8_t seen, live, stale_logged;
    } * live;
    uint64_t worker_timeout_ms;
    uint64_t workers_dropped, workers_rejoined, stale_pushes;
    /* checkpoints (checkpoint.c); dir NULL: off */
    const char *ckpt_dir;
    uint64_t ckpt_every_ms, ckpt_last_ms, ckpt_written;
    uint64_t ckpt_ok_ms;      /* when the last one was written */
    uint64_t ckpt_current_ms; /* when the newest was last found to hold the current state */
    uint64_t ckpt_state;      /* psd_state_version() the newest holds */
    uint64_t changes; /* bumped by every change a checkpoint saves (see psd_state_version) */
    int ckpt_pending; /* asked for (psctl checkpoint) while a round was in progress */
    char ckpt_path[PS_PATH_MAX]; /* the newest written */
    psd_send_cb send;
    void *send_ctx;
    psd_unread_cb unread;   /* NULL: replies are not held back */
    psd_may_use_cb may_use; /* NULL: any key may use any worker id */
    uint64_t unread_bytes_max, unread_bytes_total_max;
    uint64_t unread_refused; /* replies refused for unread bytes */
    /* hello replies offer local_endpoint (ipc://, "" when none) and this
     * process's random instance */
    char local_endpoint[PS_ENDPOINT_MAX];
    uint64_t instance;

    struct psd_table *tables[PS_TABLES_MAX];
    uint32_t ntables;

    struct psd_shm_set shm; /* regions of clients on this host */

    struct psd_counters ctr;
    uint64_t errors_logged; /* rate limit for malformed-request warnings */

    /* replicas (repl.h), all NULL/0 without: replaying says a request is a
     * backup's copy of one its primary took (a hello is then never
     * refused: the primary decided); on_drop hears each worker dropped from
     * the live set; on_stats adds the replicas' part to a stats reply */
    int replaying;
    void (*on_drop)(void *ctx, uint32_t w);
    void (*on_stats)(void *ctx, Ps__Stats *st);
    void *hook_ctx;

    struct ps_arena arena;
    unsigned char *arena_buf;
    float *scratch; /* aligned copy of values when a frame is misaligned */
    size_t scratch_cap;
    uint64_t *keys_scratch; /* aligned copy of a keys frame */
    size_t keys_cap;
    uint8_t hdr_buf[PS_HEADER_BYTES_MAX];
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

int psd_init(struct psd *s, struct ps_log *log, const struct psd_params *p);
/* Checkpoint support: a worker's exactly-once record, and dropping every
 * table (a restore that failed half way). */
/* bits: the applied window as saved (PSD_DEDUP_WINDOW / 64 words), or NULL
 * when the checkpoint has none: every id up to last_applied counts then. */
void psd_peer_restore(struct psd *s, uint32_t worker_id, uint64_t session, uint64_t last_applied,
                      const uint64_t *bits);
void psd_reset_tables(struct psd *s);
/* Forgets everything a checkpoint or a state transfer would bring: tables,
 * workers' exactly-once records, the live set and waiting requests (a
 * backup about to load its primary's state). */
void psd_reset_state(struct psd *s);
/* A new table of this shard (spec checked), with the consistency mode's
 * state and the apply helper; the caller adds it to s->tables. 0, or an
 * error with nothing left allocated. */
int psd_table_new(struct psd *s, const Ps__TableSpec *spec, struct psd_table **out);

/* Bytes a table of spec (checked) would take on this shard at most:
 * weights and optimizer state, the rows_max rows of a sparse one. Checked
 * against --max-table-bytes before anything is allocated for it. */
uint64_t psd_table_bytes_needed(const struct psd *s, const Ps__TableSpec *spec);

/* Frees a reply's buffers (what dispatch handed over and was not sent). */
void psd_reply_drop(struct psd_reply *rep);
void psd_fini(struct psd *s);

/* Sets where deferred replies go. Without it requests never wait: a pull
 * that is not ready is refused with PS_EAGAIN. */
void psd_set_sender(struct psd *s, psd_send_cb send, void *ctx);
/* Sets how psd learns the reply bytes a connection has not read: a reply
 * with values that would take it past unread_bytes_max, or every
 * connection past unread_bytes_total_max, is refused with PS_ELIMIT. */
void psd_set_unread(struct psd *s, psd_unread_cb unread);
/* Sets how psd asks which worker ids a CURVE key may use. */
void psd_set_may_use(struct psd *s, psd_may_use_cb may_use);
/* Reply bytes no connection has read yet, in all (0 without a transport). */
uint64_t psd_unread_total(const struct psd *s);
/* The ipc:// endpoint hello replies offer to clients on this host ("" or
 * NULL: none). */
void psd_set_local_endpoint(struct psd *s, const char *endpoint);

/* A region a client on this host handed over (net.c's fd socket), mapped;
 * psd unmaps it when it goes (server/core/shm.h). PS_ELIMIT when every region
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

/* What psd_checkpoint_now did, when it did not fail. */
enum psd_ckpt_now {
    PSD_CKPT_WRITTEN = 0,
    PSD_CKPT_SKIPPED = 1, /* mid-round, or checkpoints are off */
};

/* Writes a checkpoint now when the shard is between rounds (why goes to
 * the log). Returns an enum psd_ckpt_now, or a PS_E* code. */
int psd_checkpoint_now(struct psd *s, const char *why);

/* Drops worker w from the live set now, as the worker timeout does: the
 * rounds go on without it until it rejoins. */
void psd_drop_worker(struct psd *s, uint32_t w);

/* Drops workers silent past the worker timeout from the live set (rounds
 * go on without them), expires waits past their deadline (error replies
 * naming who is missing) and logs waits older than 5 s once. Call
 * periodically from the loop. */
void psd_tick(struct psd *s);

#endif
