/* libpsclient: the C client of psd, for psworker and any C program (or
 * Python through ctypes: plain integers, pointers and structs only).
 *
 * A client connects to S shard endpoints (index = shard), checks each with a
 * hello, creates tables, and moves dense ranges with asynchronous push, pull
 * and push-pull. Each of those splits the range over the shards that own it,
 * sends at once, and returns a ticket; psc_wait(ticket, timeout) collects the
 * replies. There is no background thread: replies are read inside psc_wait
 * (and the synchronous calls), so a client is used from one thread at a time.
 * No global state: several clients may live in one process.
 *
 * Buffer ownership: a gradient buffer passed to push/push-pull, and an output
 * buffer passed to pull/push-pull, belong to the library from the call until
 * psc_wait returns something other than PS_ETIMEDOUT for that ticket, or
 * psc_cancel returns 0. Large gradients are sent without a copy, so the
 * caller must not modify or free them before then.
 *
 * Errors are negative PS_E* codes (ps_errcodes.h, installed beside this
 * header; psc_strerror); after a failed call psc_last_error() holds a
 * sentence saying what went wrong, including a server's own error text.
 *
 * The library exports the psc_* functions declared here and nothing else
 * (libpsclient.symbols beside this file lists them; a test compares).
 *
 * ABI. The soname's number (libpsclient.so.1) is PSC_ABI_VERSION; it
 * changes only when a program built against an earlier psclient.h could
 * misbehave with this library. The structs it reads or writes grow
 * without that: each begins with struct_size, which the caller sets to
 * sizeof the struct it was built with (psc_table_spec_init does it for a
 * spec), and fields are only ever added at the end. The library reads
 * the fields a caller's struct has, takes the defaults (zero) for the
 * ones it lacks, refuses (PS_EINVAL, naming the struct) a struct_size
 * below the first version's or a newer struct whose fields this library
 * does not know are set, and writes no byte past a caller's struct_size
 * (zeroing the fields it does not know). A struct nested inside another
 * (psc_replica_stats) never changes; what goes past it is added at the
 * end of the outer one. */
#ifndef PSCLIENT_H
#define PSCLIENT_H

#include "ps_errcodes.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the shared library exports. */
#define PSC_API __attribute__((visibility("default")))

/* The ABI this header describes: the number in libpsclient.so.N. */
#define PSC_ABI_VERSION 1
/* The ABI of the library loaded (a binding that loads it by path checks it). */
PSC_API int psc_abi_version(void);

struct psc_client;

struct psc_config {
    size_t struct_size;         /* sizeof(struct psc_config) (see ABI above) */
    const char *const *servers; /* endpoints, servers[i] is shard i */
    size_t nservers;
    uint32_t worker_id;     /* this client's id in requests (rank) */
    int connect_timeout_ms; /* for the hello to every shard in psc_create */
    int hello_optional;     /* psc_create succeeds when some shards do not answer, or
                             * answer as a replica that is not the primary (an admin
                             * tool reports which); requests to them time out, or
                             * are answered as such a replica answers (stats) */
    int wire_dtype;         /* enum psc_dtype: values on the wire (servers keep f32). A
                             * shard that took the shared region (shm_bytes) is sent
                             * f32, through the region or in frames: on one host there
                             * is no wire to save. Sparse rows go in wire_dtype. */
    int nonzero_pulls;      /* let servers send only the nonzeros of pruned tables */
    int retry_ms;           /* re-send unanswered requests after this long (0: never) */
    int heartbeat_ms;       /* tell a shard we are alive when nothing else went to it for
                             * this long (0: PSC_HEARTBEAT_MS_DEFAULT, <0: never). Sent
                             * from psc_wait and psc_heartbeat: no thread. */
    int local_ipc;          /* move to a shard's same-host ipc:// endpoint when its hello
                             * offers one this process can reach (ps_local.h) */
    size_t shm_bytes;       /* with local_ipc: a region this big shared with the shards on
                             * this host (0: none); see psc_shm_alloc */
    size_t piece_bytes;     /* a pull, push or push-pull whose values in frames exceed this
                             * goes as pieces of this size (0: PSC_PIECE_BYTES_DEFAULT,
                             * SIZE_MAX: never; at least PSC_PIECE_BYTES_MIN) */
    const int *io_cpus;     /* ZeroMQ's I/O thread runs on these CPUs (nio_cpus of them; */
    int nio_cpus;           /* 0: where the thread creating the client runs) */
    /* CURVE (all three, or none): 40-character Z85 keys */
    const char *curve_server_key;            /* the servers' public key */
    const char *curve_public, *curve_secret; /* this client's key pair */
    /* While psc_create waits for the shards' hellos: called after 1 s and
     * every 5 s after that with the shards that have not answered yet
     * (n of them, in order), how long it has waited, and why: NULL when
     * they are silent, or a shard's refusal while another connection
     * still holds this client's worker id (a restart: the hello is sent
     * again until that one has been silent for the shard's
     * --worker-timeout). On psc_create's thread; NULL: not called. */
    void (*hello_waiting)(void *arg, const uint32_t *shards, uint32_t n, int waited_ms,
                          const char *why);
    void *hello_waiting_arg;
    /* Added after ABI 1's first version (a program built before passes a
     * smaller struct, and gets NULL). A ZeroMQ context (zmq_ctx_new) to
     * make the client's sockets in, shared by several clients of one
     * process, so that they share its I/O thread instead of each running
     * its own; NULL: the client's own. The caller terminates it after
     * destroying every client in it. Payloads are then copied as they are
     * sent (no zero-copy: ZeroMQ may still hold a frame after
     * psc_destroy), and nio_cpus must be 0 (set the context's own
     * ZMQ_THREAD_AFFINITY_CPU_ADD). */
    void *zmq_context;
};

/* the most dimensions a table's shape has */
#define PSC_SHAPE_DIMS_MAX 8u
/* the longest table name, in bytes without the NUL */
#define PSC_TABLE_NAME_MAX       128u
#define PSC_HEARTBEAT_MS_DEFAULT 1000
/* Large dense requests go as pieces, each a request of its own within
 * one shard, all sent at once under one ticket: the shard applies, or
 * answers, a piece while the next is on the wire, reading it while it is
 * still in the cache. A 16 MiB push moved at a median 86% of a raw ZeroMQ
 * echo's rate whole, 103% in pieces of 1 MiB (tests/bench/HISTORY.md, "Large requests go in
 * pieces"). The shard sees (and counts) each piece as a request; a piece after the first to a shard
 * says it continues the request (Header.continues), and the shard keeps it in the same optimizer
 * pass: one push is one step. Requests through the shared region (psc_shm_alloc) and pull views go
 * whole. A split request takes a ticket per piece and one more; when
 * that many are not free, it goes whole. At most PSC_PIECES_MAX pieces
 * (and one more per shard the range spans): larger requests get larger
 * pieces. psc_wait waits for every piece and returns the first error
 * once all are in; psc_cancel cancels them all. */
#define PSC_PIECE_BYTES_DEFAULT (UINT64_C(1) << 20)
#define PSC_PIECE_BYTES_MIN     4096u
#define PSC_PIECES_MAX          64u
/* worker_id for clients that only watch (psctl, monitoring): never counted
 * as a worker, never dropped or rejoined */
#define PSC_OBSERVER UINT32_MAX

enum psc_dtype {
    PSC_F32 = 0,
    PSC_F16 = 1,  /* IEEE half: half the bytes, ~3 decimal digits */
    PSC_BF16 = 2, /* bfloat16: half the bytes, f32's range */
};

enum psc_optimizer {
    PSC_SGD = 0,
    PSC_MOMENTUM = 1,
    PSC_ADAGRAD = 2,
    PSC_ADAM = 3,
    PSC_FTRL = 4,            /* FTRL-proximal: lr = alpha, eps = beta, l1, l2 */
    PSC_ROWWISE_ADAGRAD = 5, /* sparse tables: Adagrad with one accumulator per row (the mean
                              * of the row's squared gradient) */
};

enum psc_init {
    PSC_INIT_ZEROS = 0,
    PSC_INIT_CONSTANT = 1,
    PSC_INIT_UNIFORM = 2, /* U(-scale, scale) */
    PSC_INIT_NORMAL = 3,  /* N(0, scale^2) */
};

struct psc_table_spec {
    size_t struct_size; /* sizeof(struct psc_table_spec): psc_table_spec_init sets it */
    const char *name;   /* 1..128 printable ASCII characters, no spaces */
    uint64_t size;      /* elements in the whole table */
    int optimizer;      /* enum psc_optimizer */
    float lr, weight_decay;
    float momentum;
    int nesterov;
    float beta1, beta2, eps;
    int init; /* enum psc_init */
    float init_scale;
    uint64_t seed;
    int lr_schedule;         /* 0 constant, 1 cosine */
    uint64_t lr_decay_steps; /* optimizer steps the schedule spans */
    int sparse;              /* rows by uint64 key; then size must be 0 */
    uint32_t dim;            /* sparse: floats per row */
    uint64_t rows_max;       /* sparse: rows one shard may hold */
    float l1, l2;            /* FTRL */
    int await_set;           /* dense: pulls wait until a worker has set the values
                              * (psc_set) from each shard's start to its end */
    const uint64_t *shape;   /* dense: ndims dimensions whose product is size (a
                              * tensor's, for psctl export); ndims 0: a vector */
    uint32_t ndims;          /* at most PSC_SHAPE_DIMS_MAX */
    const uint32_t *pushers; /* dense: the worker ids that push it, strictly increasing
                              * (a pipeline stage's processes); its bsp and ssp rounds
                              * wait for them alone, and another worker's push is
                              * refused. npushers 0: every worker of the rounds */
    uint32_t npushers;       /* at most 4096 (PS_WORKERS_MAX) */
    /* Added after ABI 1's first version (8-byte fields first: the first
     * version's tail padding, which a caller may not have zeroed, stays
     * padding). A sparse table's life cycle (server/README.md, "Rows that
     * come and go"); all 0: none. */
    uint64_t admit_counters;  /* the count-min sketch's one-byte counters, a power of two
                               * (0: 1 MiB) */
    uint64_t evict_after;     /* a row not pushed in the table's last evict_after pushes on
                               * its shard is evicted (0: never) */
    uint32_t admit_after;     /* an id gets a row at its admit_after-th push (0, 1: its first);
                               * until then its pushes are counted, not applied, and its
                               * pulls give the initial value. At most 255 */
    int evict_at_budget;      /* a new row at rows_max evicts the least recently pushed row of
                               * a sample (not one of the same push) instead of being refused */
    uint64_t evict_after_s;   /* a row not pushed in the last evict_after_s seconds is evicted
                               * (0: never; at most ten years), by the primary's clock */
    uint64_t evict_half_life; /* with evict_at_budget: the row evicted is the one of least
                               * push count, halved every evict_half_life pushes of the
                               * table on its shard (0: the least recently pushed) */
};

struct psc_table_stats {
    size_t struct_size; /* sizeof(struct psc_table_stats); in a list, list[0]'s */
    char name[PSC_TABLE_NAME_MAX + 1];
    uint32_t id; /* on this shard */
    int sparse;
    uint32_t dim;
    char optimizer[16];
    uint64_t size;           /* elements of the whole table (dense) */
    uint64_t lo, hi;         /* this shard's range (dense) */
    uint64_t rows, rows_max; /* sparse: rows on this shard, and the most it takes */
    uint64_t pushes, pulls, updates, clock, rounds_lost;
    double sparsity; /* fraction of this shard's weights pruned to 0 */
    uint32_t ndims;  /* the spec's shape (0: a vector) */
    uint64_t shape[PSC_SHAPE_DIMS_MAX];
    /* Added after ABI 1's first version: a sparse table's life cycle on
     * this shard (rows made, pushes of ids not admitted yet, rows evicted
     * for age and for room, new rows refused), and the bytes it holds */
    uint64_t admitted, held_back, evicted_age, evicted_budget, refused;
    uint64_t bytes;
};

struct psc_shard_stats {
    size_t struct_size; /* sizeof(struct psc_shard_stats), set by the caller */
    uint32_t shard, shards;
    uint64_t requests, errors, bytes_in, bytes_out;
    uint32_t tables;
    double uptime_s;
    char consistency[16]; /* "bsp", "asp", "ssp:K" */
    uint32_t workers;
    uint64_t waiting, deferred_total, max_staleness, wait_timeouts;
    uint64_t duplicates_dropped; /* retried pushes acknowledged, not applied again */
    /* the live set (psd --worker-timeout) */
    uint32_t live_workers;
    uint32_t nmissing;    /* worker ids not live (silent, or never seen)... */
    uint32_t missing[64]; /* ...the first 64 of them */
    uint64_t workers_dropped, workers_rejoined;
    uint64_t stale_pushes; /* pushes from workers outside the round, not applied */
    uint64_t worker_timeout_ms;
    uint64_t checkpoints_written;
    double checkpoint_age_s;    /* since the last checkpoint (-1: none yet, or off) */
    uint64_t bytes_held;        /* weights and optimizer state */
    uint32_t nworker_clocks;    /* --workers... */
    uint64_t worker_clocks[64]; /* ...the first 64: clocks each pushed (lowest over tables) */
    /* replicas (psd --etcd): "solo" without; "primary", "backup" or
     * "candidate" with. A primary lists its backups. */
    char role[16];
    uint64_t epoch;    /* the fencing epoch of the shard's primary */
    uint64_t repl_seq; /* records sent (primary) or applied (backup) in that epoch */
    char primary[256]; /* the primary's endpoint as etcd names it */
    uint32_t nreplicas;
    struct psc_replica_stats {
        char endpoint[256];
        uint64_t id, acked;
        uint64_t lag; /* records sent that it has not acknowledged */
        int in_sync;  /* etcd lists it: replies wait for it, it may take over */
    } replicas[4];
    /* replicas: the position its state is at (epoch, record), as a
     * checkpoint would label it (a candidate: the checkpoint it restored),
     * and etcd's in-sync set as it last read it */
    uint64_t ckpt_epoch, ckpt_seq;
    uint64_t insync_epoch;
    int insync_stopped; /* the set records a clean stop */
    char insync[512];   /* its members, "ID@ENDPOINT, ..." */
};

/* Shared memory with shards on this host (cfg.shm_bytes; common/protocol/ps_shm.h).
 * psc_shm_alloc hands out 64-byte aligned buffers of the region (NULL
 * when there is none or it is full; they live until psc_destroy). A push
 * whose values lie in such a buffer, or a pull whose output buffer does,
 * moves those values through the region instead of a socket, on shards
 * that took the region (in f32, whatever wire_dtype says; the others get
 * frames): no copy
 * on the client's side, one on the shard's. What the caller sees is the
 * same either way, with one difference: a shard writes a pull's values
 * into such a buffer when it answers, not inside psc_wait, so the caller
 * must not read the buffer while the pull is in flight (nor after
 * psc_cancel: the shard may still answer). A shard that lost the region
 * (it restarted) refuses such requests, and they are sent again in
 * frames; the client hands the region over again (a hello in the same
 * session binds it), and the requests after that hello's reply use it. */
PSC_API void *psc_shm_alloc(struct psc_client *c, size_t bytes);
/* Shards that took the region. */
PSC_API uint32_t psc_shm_shards(const struct psc_client *c);
/* Bytes moved through the region so far (values, and the keys of keyed
 * pushes), included in psc_bytes. */
PSC_API void psc_shm_bytes(const struct psc_client *c, uint64_t *sent, uint64_t *received);

/* Call once, first in main(), in a program that pulls or pushes 128 KiB
 * or more per request (psworker does the same). ZeroMQ allocates every
 * message it receives; above glibc's mmap threshold each such buffer is a
 * fresh mmap, so every 4 KiB page of it faults as the kernel fills it, and
 * glibc raises that threshold only now and then on its own. This fixes the
 * threshold at 64 MiB for the whole process (mallopt): bench_wire's 1 MiB
 * pulls took 156-296k page faults before, 49k after. It changes how this
 * process's malloc behaves everywhere, so the library never calls it. */
PSC_API void psc_malloc_tune(void);

/* Connects to every endpoint and says hello; fails if a shard does not
 * answer within connect_timeout_ms or says it is another shard. On failure
 * returns a PS_E* code, writes why into err and sets *out to NULL. */
PSC_API int psc_create(const struct psc_config *cfg, struct psc_client **out, char *err,
                       size_t errlen);
/* Closes the sockets, dropping anything unsent. NULL is a no-op. */
PSC_API void psc_destroy(struct psc_client *c);

/* Batching (on: 1). While corked, requests that carry no frames (pulls,
 * and pushes and push-pulls whose values lie in the shared region) are
 * held per shard and go out together as one message (OP_BATCH) when the
 * client is uncorked, waited on (psc_wait, psc_cancel), or before any
 * other request to that shard; also once a shard's held requests move
 * PSC_BATCH_FLUSH_BYTES through the region, or PS_BATCH_MAX are held. The
 * shard answers each as if it came alone. PS_ENOMEM when the batches
 * cannot be allocated (requests then go one by one). */
#define PSC_BATCH_FLUSH_BYTES (UINT64_C(1) << 20)
PSC_API int psc_cork(struct psc_client *c, int on);
/* Batches of two or more requests sent so far. */
PSC_API uint64_t psc_batches_sent(const struct psc_client *c);

/* The endpoint shard is reached on: as configured, or its same-host
 * ipc:// endpoint (local_ipc). NULL for a shard out of range. */
PSC_API const char *psc_endpoint(const struct psc_client *c, uint32_t shard);

/* Text of the last failure on this client; "" when none. */
PSC_API const char *psc_last_error(const struct psc_client *c);
/* After a call returned PS_EREMOTE: the shard's own PS_E* code for the
 * refusal (PS_EEXIST, PS_ERANGE, ...); 0 after any other result. */
PSC_API int psc_last_remote(const struct psc_client *c);
/* The text of a PS_E* code ("timed out"); never NULL. */
PSC_API const char *psc_strerror(int code);
/* The name of a PS_E* code ("PS_ETIMEDOUT"); never NULL. */
PSC_API const char *psc_err_name(int code);

/* Fills s (struct_size bytes: sizeof *s) with defaults (SGD, lr 0.01,
 * momentum 0.9, Adam betas 0.9/0.999, eps 1e-8, zeros init) and sets its
 * struct_size. The macro passes the caller's sizeof, as zlib's
 * inflateInit does: a library newer than the caller's header never
 * writes past the caller's struct. */
PSC_API void psc_table_spec_init_sized(struct psc_table_spec *s, size_t struct_size,
                                       const char *name, uint64_t size);
#define psc_table_spec_init(s, name, size)                                                         \
    psc_table_spec_init_sized((s), sizeof *(s), (name), (size))

/* Creates (or finds, when the spec is the same) a table on every shard and
 * returns a client-side handle in *table. Synchronous. */
PSC_API int psc_table_create(struct psc_client *c, const struct psc_table_spec *spec,
                             int timeout_ms, uint32_t *table);

/* Asynchronous range operations on elements [offset, offset+count) of a
 * table. Return 0 and a ticket, or an error (nothing in flight then).
 * psc_pull and psc_push_pull copy each reply into out; for large pulls
 * that copy is what psc_pull_view saves (about 30 us a MiB here;
 * tests/bench/HISTORY.md, "What the copying pull's copy costs"). */
PSC_API int psc_pull(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                     float *out, uint64_t clock, uint64_t *ticket);
PSC_API int psc_push(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                     const float *grad, uint64_t clock, uint64_t *ticket);
PSC_API int psc_push_pull(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                          const float *grad, float *out, uint64_t clock, uint64_t *ticket);

/* Mirrors: pulls that move only what changed. A mirror is the caller's
 * buffer vals holding elements [offset, offset+count) of a dense table,
 * which only psc_mirror_pull writes. Each of its pulls asks every shard
 * for the elements written since the version the buffer holds of that
 * shard's part, and a shard answers with those alone (a bitmap and their
 * values) when that is smaller than the part; otherwise, and the first
 * time, with the whole part. With top-k pushes to a table whose optimizer
 * is plain SGD without weight decay (what psworker --topk runs), a pull
 * then moves about the elements the round's pushes touched. Nothing is
 * kept per worker on a shard: each table keeps a version stamp per
 * element (4 bytes) once a mirror has pulled it.
 *
 * vals belongs to the library from psc_mirror_open to psc_mirror_close:
 * the caller reads it between pulls and writes it never (after writing
 * it anyway, psc_mirror_reset makes the next pull whole). A reply that is
 * lost is asked for again from the same version, and a late or repeated
 * one is dropped, so vals is always some version the shards held; a
 * shard that restarted, or a replica that took over, has a table of
 * another generation and answers whole. One pull per mirror at a time
 * (PS_EBUSY). A pull through the shared region always goes whole.
 * psc_mirror_pull waits as psc_pull does (its clock) and is waited for
 * with psc_wait. psc_mirror_close cancels a pull in flight; psc_destroy
 * closes the mirrors left open. */
struct psc_mirror;
PSC_API int psc_mirror_open(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                            float *vals, struct psc_mirror **m);
PSC_API int psc_mirror_pull(struct psc_client *c, struct psc_mirror *m, uint64_t clock,
                            uint64_t *ticket);
PSC_API void psc_mirror_reset(struct psc_mirror *m);
/* Parts answered with the changes alone, and whole, so far. */
PSC_API void psc_mirror_counts(const struct psc_mirror *m, uint64_t *changed, uint64_t *whole);
PSC_API int psc_mirror_close(struct psc_client *c, struct psc_mirror *m);

/* Writes the values of [offset, offset+count) as they are (with the
 * wire dtype: f32 for exact weights), before the table's first optimizer
 * step: a model's own initial weights. The shards refuse it (PS_EREMOTE,
 * PS_ESTATE) once the table has taken a step. A table created with
 * await_set answers no pull until its values were set from each shard's
 * start to its end. vals belongs to the library until the wait, as a
 * push's gradient does. */
PSC_API int psc_set(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                    const float *vals, uint64_t *ticket);

/* A pull without a copy: the values stay in the messages they arrived in.
 * Needs f32 on the wire (wire_dtype), and is never a nonzero-only reply.
 * After psc_wait returns 0 for the ticket, the ticket stays held:
 * psc_view_part(c, ticket, i, ...) gives part i (i = 0, 1, ... in offset
 * order, one per shard the range spans) as a pointer to its count floats,
 * for elements [offset, offset+count), valid until psc_view_release
 * (which frees the ticket; PS_ERANGE past the last part). A wait that
 * fails releases the ticket as for any other. */
PSC_API int psc_pull_view(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                          uint64_t clock, uint64_t *ticket);
PSC_API int psc_view_part(struct psc_client *c, uint64_t ticket, uint32_t i, const float **vals,
                          uint64_t *offset, uint64_t *count);
PSC_API int psc_view_release(struct psc_client *c, uint64_t ticket);

/* Sparse push into a dense table: gradient vals[i] for element keys[i],
 * i < n, keys strictly increasing and below the table size. Every shard
 * receives a push (one holding a single zero entry when no key falls in its
 * range), so BSP rounds complete. keys and vals follow the buffer rules
 * above; either may lie in a psc_shm_alloc buffer, and then moves through
 * the region (the shard copies the keys out before it checks them). */
PSC_API int psc_push_keys(struct psc_client *c, uint32_t table, const uint64_t *keys,
                          const float *vals, size_t n, uint64_t clock, uint64_t *ticket);

/* Top-k with error feedback (Deep Gradient Compression), on host buffers:
 * what psworker --topk does on its backend, for programs that compute
 * gradients on the host (the Python package). The selection is the CPU
 * backend's own code.
 *
 * psc_topk_count: how many of n elements a fraction ratio (0 < ratio <= 1)
 * sends: ceil(ratio * n), at least 1 (0 for a ratio outside (0, 1]).
 *
 * psc_topk_select: adds grad[0..n) to the residual resid (with vel not
 * NULL, through it first: vel = momentum * vel + grad, resid += vel, as
 * DGC's momentum correction, the servers then running plain SGD), then
 * moves the k entries of resid largest in magnitude into idx (ascending)
 * and val and zeroes them in resid and vel: ready for psc_push_keys. What
 * is not sent stays in resid for the next step. PS_EINVAL, with resid and
 * vel untouched, when grad holds a NaN or an infinity, k is 0 or above n,
 * or a pointer is NULL; PS_ENOMEM. */
PSC_API uint64_t psc_topk_count(uint64_t n, double ratio);
PSC_API int psc_topk_select(uint64_t n, const float *grad, float *resid, float *vel, float momentum,
                            uint64_t k, uint64_t *idx, float *val);

/* --servers patterns and indices from the environment, as psworker takes
 * them, for programs and bindings that start from text:
 * psc_servers_parse expands "tcp://psd-[0-3].psd:5570" (Slurm's hostlist
 * ranges; plain comma lists as they are) into buf (len bytes) and eps
 * (at most max), in shard order. psc_auto_rank takes the first of
 * JOB_COMPLETION_INDEX, RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK that is
 * set; psc_auto_workers the first of WORLD_SIZE, SLURM_NTASKS,
 * OMPI_COMM_WORLD_SIZE, PSD_WORKERS. PS_EINVAL with a sentence in err
 * naming what was wrong, or every variable tried when none is set. */
PSC_API int psc_servers_parse(const char *list, char *buf, size_t len, const char **eps, size_t max,
                              size_t *n, char *err, size_t errlen);
PSC_API int psc_auto_rank(uint64_t *rank, char *err, size_t errlen);
PSC_API int psc_auto_workers(uint64_t *workers, char *err, size_t errlen);

/* Votes: all workers of a round learn whether any of them said yes, as
 * mixed precision needs ("did anyone's gradients overflow?": then every
 * worker skips the step). A vote is a one-float table named "psd:" NAME
 * (psctl export leaves such tables out, and a joining worker's start
 * clock ignores them); each round, every worker pushes its answer and
 * reads back the share that said yes, so psc_vote returns once all W
 * workers voted in it. Rounds are counted apart from the model's clock,
 * so a skipped step costs a vote and no model round.
 *
 * psc_vote_open creates or finds the table, and reads the round the
 * shards are at and whether they run bsp. Without bsp (asp, ssp) there
 * are no rounds to agree in: psc_vote then answers with the worker's own
 * flag and sends nothing. psc_vote blocks up to timeout_ms; on an error
 * the vote's round is unknown, and the run should stop. */
struct psc_vote {
    size_t struct_size; /* sizeof(struct psc_vote), set before psc_vote_open */
    uint32_t table;
    uint64_t clock; /* the next round */
    int bsp;
    float grad, share; /* the round's push and its answer */
};
PSC_API int psc_vote_open(struct psc_client *c, const char *name, int timeout_ms,
                          struct psc_vote *v);
PSC_API int psc_vote(struct psc_client *c, struct psc_vote *v, int flag, int timeout_ms, int *any);

/* Rows of a sparse table by key: keys[0..n) strictly increasing; out and
 * grads hold n x dim floats in the order of keys and follow the buffer
 * rules above (keys are copied, except where they lie in the shared
 * region and every key belongs to one shard: then they move through the
 * region with the f32 rows, and must stay unchanged until the request
 * completes). Each key goes to the shard its jump hash names; rows are
 * created on first touch. */
PSC_API int psc_pull_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                          float *out, uint64_t clock, uint64_t *ticket);
PSC_API int psc_push_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                          const float *grads, uint64_t clock, uint64_t *ticket);
PSC_API int psc_push_pull_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                               const float *grads, float *out, uint64_t clock, uint64_t *ticket);

/* Waits up to timeout_ms (0 polls, <0 waits forever) for a ticket. Returns
 * 0 when every shard applied/answered, the first error otherwise, or
 * PS_ETIMEDOUT (the ticket stays valid: wait again or cancel). Any return
 * other than PS_ETIMEDOUT releases the ticket. */
PSC_API int psc_wait(struct psc_client *c, uint64_t ticket, int timeout_ms);

/* Gives up on a ticket: late replies are dropped and the output buffer is no
 * longer written. Returns PS_EBUSY while zmq still holds a zero-copy gradient
 * buffer of it (call again later); 0 once released. */
PSC_API int psc_cancel(struct psc_client *c, uint64_t ticket);

/* Asks one shard for its counters. Synchronous. */
PSC_API int psc_stats(struct psc_client *c, uint32_t shard, int timeout_ms,
                      struct psc_shard_stats *out);

/* psc_stats, and the shard's first cap tables into list (out->tables says
 * how many it has). list[0].struct_size gives every element's size (the
 * caller's sizeof); each element is written with it. */
PSC_API int psc_stats_tables(struct psc_client *c, uint32_t shard, int timeout_ms,
                             struct psc_shard_stats *out, struct psc_table_stats *list,
                             uint32_t cap);

/* Asks one shard to write a checkpoint now (or, mid-round, when the round
 * ends); detail gets the file written or why it waits. Synchronous. */
PSC_API int psc_checkpoint(struct psc_client *c, uint32_t shard, int timeout_ms, char *detail,
                           size_t len);

/* psctl recover: asks shard's replica in use (a client of that one
 * replica) to take its shard over from the checkpoint it restored, when
 * every member of etcd's in-sync set was lost without a clean stop;
 * detail gets what was lost, or why not. Under CURVE the client's key
 * needs "admin: yes" in the shard's --curve-allow. Synchronous. */
PSC_API int psc_recover(struct psc_client *c, uint32_t shard, int timeout_ms, char *detail,
                        size_t len);

/* A page of sparse table `table`'s rows on one shard: rows [offset,
 * offset+max) in the order the shard created them (new rows are only ever
 * added at the end). keys gets *got keys and vals *got x dim floats;
 * *total gets the rows the shard holds now. A page may be shorter than max
 * (a shard answers at most PS_ROWS_PAGE_BYTES of values): page on until
 * offset reaches *total. max is 1..PS_ROWS_PAGE_MAX. Synchronous. */
PSC_API int psc_rows(struct psc_client *c, uint32_t table, uint32_t shard, uint64_t offset,
                     uint32_t max, uint64_t *keys, float *vals, uint64_t *got, uint64_t *total,
                     int timeout_ms);

/* Delta exports: psc_rows, as what says,
 *   PSC_ROWS_ALL: every row (since is ignored);
 *   PSC_ROWS_CHANGED: the rows pushed (or made) after tick since;
 *   PSC_ROWS_EVICTED: the ids evicted after tick since (keys only: vals
 *     may be NULL), offset counting from the oldest eviction kept;
 * from offset on. A page looks at entries [offset, *next) and sends
 * those that qualify (*got of them, at most max; possibly none): page on
 * from *next until it reaches the count of rows (or evictions kept).
 * *tick gets the table's tick on the shard (the pushes it applied):
 * what a later delta's since is, taken when its pages were read with no
 * push in between. A since past the shard's tick is refused (PS_EREMOTE,
 * PS_ESTATE: it restarted from an older checkpoint), and so is one older
 * than the evictions it keeps (PS_ERANGE): take a full export then.
 * Synchronous. */
enum psc_rows_what {
    PSC_ROWS_ALL = 0,
    PSC_ROWS_CHANGED = 1,
    PSC_ROWS_EVICTED = 2,
};
PSC_API int psc_rows_delta(struct psc_client *c, uint32_t table, uint32_t shard, int what,
                           uint64_t since, uint64_t offset, uint32_t max, uint64_t *keys,
                           float *vals, uint64_t *got, uint64_t *next, uint64_t *tick,
                           int timeout_ms);

/* A handle for a table some worker created, found by name on every shard
 * (a stats call to each). Synchronous. */
PSC_API int psc_table_open(struct psc_client *c, const char *name, int timeout_ms, uint32_t *table);

/* The clock a worker starting now should begin at: the furthest clock the
 * shards' tables had reached at hello (0 in a new run). A restarted worker
 * uses it to rejoin a run in progress. */
PSC_API uint64_t psc_start_clock(const struct psc_client *c);

/* Sends a heartbeat to each shard nothing has gone to for heartbeat_ms.
 * Call it during long computations (psc_wait does it while waiting). */
PSC_API void psc_heartbeat(struct psc_client *c);

/* Pushes the servers acknowledged without applying because this worker was
 * outside the round (dropped from the live set, or rejoining). */
PSC_API uint64_t psc_stale_pushes(const struct psc_client *c);

/* Sub-requests sent again: unanswered after retry_ms (a restarted server
 * lost them), or refused as "not yet" (PS_EAGAIN). */
PSC_API uint64_t psc_resends(const struct psc_client *c);

/* Moves from one replica of a shard to another (servers listed as
 * "tcp://a:5570|tcp://b:5570"): the connection to the one in use dropped,
 * or it said it is not the shard's primary. Outstanding requests go again
 * to the new primary, which applies each once. */
PSC_API uint64_t psc_failovers(const struct psc_client *c);

/* 1 when a server has acknowledged a push without applying it because this
 * worker is outside its rounds (psd dropped it as silent) since the client
 * was created or last rejoined. The worker should then call psc_rejoin and
 * go on from psc_start_clock. */
PSC_API int psc_outside_round(const struct psc_client *c);

/* Says hello again from a new session: every shard takes this worker out of
 * the rounds it is in and answers with the clock to start at (read it with
 * psc_start_clock); pulls of that clock join the rounds again. Needs no
 * ticket outstanding (PS_EBUSY otherwise). */
PSC_API int psc_rejoin(struct psc_client *c, int timeout_ms);

/* Bytes this client sent and received on the wire (all frames). */
PSC_API void psc_bytes(const struct psc_client *c, uint64_t *sent, uint64_t *received);

/* Number of shards; elements of a table; the shard range of a table. */
PSC_API uint32_t psc_shards(const struct psc_client *c);

/* 1 when shard has answered this client's hello (psc_create with
 * hello_optional goes on without the shards that did not), else 0. */
PSC_API int psc_shard_answered(const struct psc_client *c, uint32_t shard);

/* ---- Pipeline links --------------------------------------------------
 * The neighbouring stages of a pipeline (a model split into contiguous
 * runs of layers, one process each) send a micro-batch's activations
 * forward, stage s to s+1, and their gradient backward, s+1 to s. Each
 * message carries its step, its micro-batch, dtype and shape (no shape is
 * fixed in advance); the receiver checks them and the bytes against its
 * bytes_max before it uses them, and refuses a bad one back to the sender
 * (the sender's next receive says why). A stage may have at most window
 * micro-batches' activations in flight: the gradient of one gives its
 * credit back. A neighbour that exits, or whose heartbeats stop for
 * timeout_ms, is named in the error of the next call that needs it. One
 * link per process, used from one thread. With CURVE, the traffic between
 * stages is encrypted and a stage admits only the keys it is given; a
 * neighbour refused, or one that does not speak CURVE, is named in the
 * error of the wait for it. */

#define PSC_LINK_WINDOW_MAX         1024u
#define PSC_LINK_TIMEOUT_MS_DEFAULT 2000
/* Messages queued toward or from a neighbour at most (ZeroMQ's high-water
 * marks): what a link holds is bounded by this times bytes_max. */
#define PSC_LINK_QUEUE_MAX (PSC_LINK_WINDOW_MAX + 16u)

enum psc_link_dir {
    PSC_LINK_FORWARD = 0,  /* activations, stage s to s + 1 */
    PSC_LINK_BACKWARD = 1, /* their gradient, stage s + 1 to s */
};

struct psc_link_config {
    size_t struct_size;     /* sizeof(struct psc_link_config) */
    uint32_t stage, stages; /* this process's stage of its pipeline, 0-based; stages >= 2 */
    const char *listen;     /* stage > 0: where stage - 1 connects (tcp://HOST:PORT, port 0
                             * picks one: psc_link_endpoint) */
    const char *next;       /* stage < stages - 1: where stage + 1 listens */
    uint32_t window;        /* stage < stages - 1: activations in flight, 1..PSC_LINK_WINDOW_MAX */
    uint64_t bytes_max;     /* the largest tensor a neighbour may send (and this one) */
    int timeout_ms;         /* a neighbour silent this long is gone (0: the default) */
    /* CURVE between stages (all NULL: none): this stage's key pair (Z85,
     * 40 characters each), presented as the server to stage - 1 and as
     * the client to stage + 1; the public key stage + 1 must present;
     * and the public keys stage - 1 may connect with (at most
     * PSC_LINK_ALLOW_MAX; any other is refused in the handshake). */
    const char *curve_public, *curve_secret;
    const char *curve_server_key;
    const char *const *curve_allow;
    size_t ncurve_allow;
};

#define PSC_LINK_ALLOW_MAX 64u

/* A tensor of a micro-batch: shape[0..ndims) of dtype at data. Received,
 * data stays valid until the next receive from the same neighbour. */
struct psc_tensor {
    size_t struct_size; /* sizeof(struct psc_tensor), to send and to receive */
    uint64_t step;      /* the training step it belongs to */
    uint32_t micro;     /* its micro-batch in the step */
    int dtype;          /* enum psc_dtype */
    uint32_t ndims;     /* 1..PSC_SHAPE_DIMS_MAX */
    uint64_t shape[PSC_SHAPE_DIMS_MAX];
    const void *data;
    int eval; /* evaluation: forward only; no gradient comes back, no credit is taken */
};

struct psc_link;

/* Binds listen and connects to next (in the background: the neighbours
 * may start in any order). 0, or a PS_E* code with err. */
PSC_API int psc_link_create(const struct psc_link_config *cfg, struct psc_link **out, char *err,
                            size_t errlen);
/* Waits up to timeout_ms until every neighbour has connected: 0, or
 * PS_ETIMEDOUT naming those that have not (PS_EIO: one came and went). */
PSC_API int psc_link_wait_connected(struct psc_link *l, int timeout_ms);
/* Messages already sent still go, for up to timeout_ms, unless their
 * neighbour is gone. */
PSC_API void psc_link_destroy(struct psc_link *l);
/* The endpoint bound for stage - 1 ("" for stage 0). */
PSC_API const char *psc_link_endpoint(const struct psc_link *l);
/* Sends t in direction dir (enum psc_link_dir). The values are copied.
 * PS_ELIMIT when window activations are in flight; PS_EIO when the
 * neighbour is gone; PS_ETIMEDOUT when it never connected within
 * timeout_ms. A neighbour that is there but has PSC_LINK_QUEUE_MAX
 * messages unread holds the send until it reads one. */
PSC_API int psc_link_send(struct psc_link *l, int dir, const struct psc_tensor *t);
/* Receives the next tensor of direction dir, waiting up to timeout_ms
 * (< 0: as long as the neighbour is there). PS_EIO when it is gone,
 * PS_EREMOTE when it refused this stage's last message, another PS_E*
 * code when what it sent is malformed (and it is told so). */
PSC_API int psc_link_recv(struct psc_link *l, int dir, int timeout_ms, struct psc_tensor *t);
/* Why the last call failed. */
PSC_API const char *psc_link_error(const struct psc_link *l);
/* Activations sent whose gradient has not come back. */
PSC_API uint32_t psc_link_in_flight(const struct psc_link *l);
/* Bytes of values sent to and received from the neighbours. */
PSC_API void psc_link_bytes(const struct psc_link *l, uint64_t *sent, uint64_t *received);
#ifdef __cplusplus
}
#endif

#endif
