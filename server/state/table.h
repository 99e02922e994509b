/* Dense tables on one shard: weights for this shard's range of a table,
 * optimizer state beside them, and the update rule.
 *
 * A table holds elements [lo, hi) of a table of `size` elements; callers
 * pass global offsets already checked against that range. Owned by the
 * server loop: no locking. Knows nothing about sockets or messages. */
#ifndef PSD_TABLE_H
#define PSD_TABLE_H

#include <limits.h> /* INT_MAX, used by the generated header */

#include "prune.h"
#include "ps_limits.h"
#include "sparse.h"

#include "ps.pb-c.h"
#include "ps_prom.h"
#include "psk_optim.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* A block of weights that zmq is sending from: pull replies go out of the
 * table without a copy. Each message in flight holds a record (which
 * elements it carries) and a reference on the block; ZeroMQ's I/O thread
 * lets go of both when the message is sent, and the last reference frees
 * the block. */
#define PSD_LENT_MAX 128 /* messages in flight from one block */
/* Copies on write in a row after which a table waits longest before it
 * lends again: 2^(PSD_COW_RUN_MAX - 1) shards' worth of replies copied
 * (psd_table_may_lend). */
#define PSD_COW_RUN_MAX 7
struct psd_lend;
struct ps_pool;
struct psd_lent {
    struct psd_lend *block;
    uint64_t lo, hi;  /* global elements [lo, hi) of the table */
    atomic_uint busy; /* 1 from psd_table_lend until psd_lent_done */
};
struct psd_lend {
    atomic_uint refs; /* one while it is the table's block, plus one per busy record */
    float *w;
    struct psd_lent rec[PSD_LENT_MAX];
};

struct psd_table {
    char name[PS_TABLE_NAME_MAX + 1];
    uint32_t id;
    uint64_t size;   /* elements in the whole table */
    uint64_t lo, hi; /* this shard's range */
    Ps__OptimizerKind optimizer;
    float lr, weight_decay, momentum, beta1, beta2, eps;
    int nesterov;
    Ps__InitKind init;
    float init_scale;
    uint64_t seed;
    int lr_schedule;
    uint64_t lr_decay_steps;
    uint64_t sched_div; /* set by the consistency mode (psk_optim.sched_div) */

    int sparse; /* rows by key (sp) instead of a range of elements (w) */
    uint32_t dim;
    uint64_t rows_max;
    float l1, l2;
    int await_set;     /* pulls wait until set_next reaches hi (OP_SET) */
    uint64_t set_next; /* the end of what OP_SET has written from lo so far */
    uint32_t ndims;    /* the spec's shape (0: a vector) */
    uint64_t shape[PS_SHAPE_DIMS_MAX];
    uint32_t *pushers; /* the worker ids that push it, increasing (NULL: every one) */
    uint32_t npushers;
    struct psd_sparse sp;
    size_t *absent; /* a life-cycle push's keys without a row (grows; absent_cap) */
    size_t absent_cap;

    float *w;              /* hi - lo weights */
    struct psd_lend *lend; /* w's, once a reply was sent from it; NULL before */
    uint32_t lend_next;    /* where psd_table_lend looks for a free record first */
    float *spare;          /* hi - lo: where w moves when written while lent */
    uint64_t cow;          /* times w moved so (psd_table_own), each a copy of hi - lo */
    uint64_t lent_bytes;   /* bytes of replies sent from the table */
    uint64_t lend_credit;  /* bytes of replies big enough to lend that were copied
                            * instead since the last copy on write (psd_table_may_lend) */
    uint64_t lent_since;   /* bytes lent since the last copy on write */
    uint32_t cow_run;      /* copies on write since lending last saved a shard's worth */
    /* Pulls of what changed (psd_table_changed): every write to w adds 1
     * to version; generation is random per table object (a restore or a
     * new process starts another, and a client then takes the whole
     * range). Once a pull first asks for changes, stamp holds per
     * element the version it was last written at, less stamp_base. */
    uint64_t version, generation, stamp_base;
    uint32_t *stamp;
    uint64_t changed_replies, whole_replies; /* changed pulls answered each way */
    float *s1;      /* momentum velocity, Adagrad accumulator, Adam first moment */
    float *s2;      /* Adam second moment */
    uint64_t steps; /* optimizer steps applied */

    uint64_t pushes, pulls;
    struct ps_hist apply_hist; /* seconds per optimizer apply */
    struct ps_pool *pool;      /* psd's apply helper (--apply-threads 2), or NULL */

    /* pruning (prune.c), when a --prune spec names this table: */
    uint8_t *mask; /* 1 = pruned; NULL when not pruned */
    float *prune_scratch;
    struct psd_prune_spec prune;
    uint64_t npruned;
    double zeros_share;     /* psd_table_zero_share's last count, */
    uint64_t zeros_at_ms;   /* and when (0: never) */
    uint64_t prune_updates; /* mask recomputations so far */
    double prune_target_now;

    /* consistency (consistency.c): */
    uint64_t clock;      /* bsp: rounds applied */
    uint64_t *completed; /* per worker: clocks pushed */
    uint8_t *member;     /* per worker: 1 when in the rounds (bsp) and the slowest-clock
                          * bound (ssp); a dropped worker is 0 until it rejoins */
    /* asp/ssp: the slowest member's clock, kept so that a reply does not
     * scan every worker (consistency.c, slowest_member): ok says clock
     * holds, with at members at it; a change the pushes' own update does
     * not follow clears ok (psd_cons_touched) */
    struct psd_slowest {
        uint64_t clock;
        uint32_t at;
        int ok;
    } * slowest;
    uint64_t *next;       /* bsp: per worker, the next offset it must push this round */
    uint64_t *pass_end;   /* asp/ssp: per worker, where its last push ended (0: none yet);
                           * a push below it starts the worker's next pass over the table */
    uint64_t watermark;   /* bsp: this round is applied on [lo, watermark) */
    uint64_t round_begun; /* bsp: clock + 1 of the round whose start has run */
    int restored;         /* from a checkpoint, and no push taken since */
    int recovering;       /* from a checkpoint, and no bsp round closed since */
    uint64_t rounds_lost; /* bsp: rounds skipped when a restored table caught up */
    float **wgrad;        /* bsp: per worker, this round's gradient */
};

/* Allocates and initialises this shard's part of the table described by
 * spec. Returns 0 or PS_ENOMEM; *out is caller-freed with psd_table_destroy. */
int psd_table_create(const Ps__TableSpec *spec, uint32_t id, uint32_t shard, uint32_t shards,
                     struct psd_table **out);
/* The same, for a restore that writes every weight and optimizer state
 * element itself: the initialiser is not run and nothing is zeroed (a
 * large table restores in about half the time). */
int psd_table_create_unfilled(const Ps__TableSpec *spec, uint32_t id, uint32_t shard,
                              uint32_t shards, struct psd_table **out);
void psd_table_destroy(struct psd_table *t);

/* Bytes a table of spec (checked) would take on shard `shard` of
 * `shards` at most: weights and optimizer state, the rows_max rows of a
 * sparse one. Checked against psd --max-table-bytes before anything is
 * allocated for it. */
uint64_t psd_table_bytes_for(const Ps__TableSpec *spec, uint32_t shard, uint32_t shards);

/* 1 when spec describes exactly this table (idempotent create). */
int psd_table_same_spec(const struct psd_table *t, const Ps__TableSpec *spec);

/* Whether a reply of `bytes` f32 values may be lent now (psd_table_lend)
 * rather than copied; when not, the caller copies it, and the copy counts
 * toward lending again. A write to elements a reply in flight carries
 * copies the whole shard first (psd_table_own), so a table lends before
 * its first copy on write, and after one only once it has copied enough
 * replies since (lend_credit): a shard's worth after one copy on write,
 * twice that after two in a row, and so on up to 2^(PSD_COW_RUN_MAX - 1)
 * shards' worth; a run ends when a shard's worth is lent between two
 * copies. A table whose replies keep being overwritten in flight (pushes
 * to a range whose last reply is still going out, several asp workers on
 * one range) then costs little more than copying every reply, over any
 * stretch of requests. (A budget of all the bytes lending ever saved let
 * a table that had lent for a while copy the whole shard on every push:
 * bench_wire's 64 KiB push-pull at window 8, after its pull cells, ran at
 * 857-1,257 requests/s, 5-7% of raw.) */
int psd_table_may_lend(struct psd_table *t, size_t bytes);
/* Lends w's elements [lo, hi) for a reply: returns the message's record
 * (the reply's pointer is t->w + (lo - t->lo)), or NULL when the spare
 * block the table would move to cannot be allocated or PSD_LENT_MAX
 * messages are already out (copy the values instead). A table that lends
 * keeps that spare: a second copy of its weights. */
struct psd_lent *psd_table_lend(struct psd_table *t, uint64_t lo, uint64_t hi);
/* The message of a record is gone (sent, dropped, or never sent): any
 * thread. */
void psd_lent_done(struct psd_lent *r);
/* Called before anything writes elements [lo, hi) of w: when a message in
 * flight carries any of them, w moves to the spare block (a copy) and the
 * old block is left to the messages (copy-on-write). Messages carrying
 * other elements do not stop the write. Never fails. */
void psd_table_own(struct psd_table *t, uint64_t lo, uint64_t hi);

/* A dense apply of PSD_APPLY_MIN elements or more goes in pieces of
 * PSD_APPLY_PIECE, a keyed one of PSD_APPLY_KEYS_MIN keys or more in
 * pieces of PSD_APPLY_KEYS_PIECE; t->pool's helper takes some while this
 * thread takes the rest. Each element gets the same operations in any
 * piece, so the results are the same bits with and without the helper
 * (test_optim). The dense bound is high: a 4 MiB apply takes about 250 us
 * here, against a wake-up of the helper; and in 1+1 training (chunks of
 * 1 MiB at most) the helper took a core the worker was using. */
#define PSD_APPLY_MIN        (1u << 20)
#define PSD_APPLY_PIECE      (1u << 16)
#define PSD_APPLY_KEYS_MIN   (1u << 14)
#define PSD_APPLY_KEYS_PIECE (1u << 13)

/* Applies gradients g[0..count) to global elements [offset, offset+count),
 * which must lie in [lo, hi), as optimizer step `step` (1-based: Adam's t
 * and the lr schedule's position). */
void psd_table_apply(struct psd_table *t, uint64_t offset, uint64_t count, const float *g,
                     uint64_t step);

/* Every write to a dense table's weights goes through one of these
 * (after psd_table_own, before or after the values change, on the loop's
 * thread): global elements [lo, hi), or keys[0..n). Each adds 1 to the
 * version and, once stamps are kept, stamps what it wrote. */
void psd_table_wrote(struct psd_table *t, uint64_t lo, uint64_t hi);
void psd_table_wrote_keys(struct psd_table *t, const uint64_t *keys, size_t n);

/* Changed pulls. psd_table_track starts keeping stamps (4 bytes per
 * element of the shard, counted in psd_table_bytes_held): 0, or
 * PS_ENOMEM (pulls then get the whole range). psd_table_changed counts
 * the elements of [offset, offset + count) written after version since
 * of this generation, and sets their bits in mask (count bits, zeroed by
 * the caller; NULL: count only). UINT64_MAX when that cannot be told:
 * no stamps yet, another generation, since 0, since newer than the
 * table, or older than the stamps reach (stamp_base); the client then
 * needs the whole range. */
int psd_table_track(struct psd_table *t);
uint64_t psd_table_changed(const struct psd_table *t, uint64_t generation, uint64_t since,
                           uint64_t offset, uint64_t count, uint8_t *mask);

/* Starts pruning this table by spec. 0 or PS_ENOMEM. */
int psd_table_enable_prune(struct psd_table *t, const struct psd_prune_spec *spec);

/* Recomputes the mask when the schedule says so at step (in clocks).
 * Returns 1 when it did. */
int psd_table_prune_step(struct psd_table *t, uint64_t step);

/* Applies gradient g[i] to global element keys[i] for i < n (keys in
 * [lo, hi), strictly increasing), as optimizer step `step`. */
void psd_table_apply_keys(struct psd_table *t, const uint64_t *keys, const float *g, size_t n,
                          uint64_t step);

/* 1 when worker w pushes t (its spec names no pushers, or names w): only
 * those are members of its rounds (consistency.h). */
int psd_table_pushed_by(const struct psd_table *t, uint32_t w);

/* The table's optimizer settings, as its applies use them. */
struct psk_optim psd_table_optim(const struct psd_table *t);

/* Sparse tables: copies the rows of keys[0..n) into out (n x dim),
 * creating missing rows; applies gradients g (n x dim) to the rows of
 * keys. 0, or PS_ELIMIT / PS_ENOMEM with a sentence in err naming the
 * key whose row could not be had: the keys before it are done (rows
 * created, gradients applied), none after it. */
int psd_table_pull_rows(struct psd_table *t, const uint64_t *keys, size_t n, float *out, char *err,
                        size_t errlen);
int psd_table_push_rows(struct psd_table *t, const uint64_t *keys, const float *g, size_t n,
                        char *err, size_t errlen);

/* Share of this shard's range pruned to zero. */
double psd_table_sparsity(const struct psd_table *t);

/* Share of this shard's weights that are exactly zero: the pruned share
 * for a pruned table, else counted (L1 and FTRL make zeros of their own,
 * in rows of sparse tables too). A count reads at most
 * PSD_ZEROS_SAMPLE_MAX weights (evenly spaced past that) and is kept for
 * PSD_ZEROS_KEEP_MS, so asking often costs nothing. Loop thread. */
#define PSD_ZEROS_SAMPLE_MAX (UINT64_C(1) << 24)
#define PSD_ZEROS_KEEP_MS    1000u
double psd_table_zero_share(struct psd_table *t, uint64_t now_ms);
/* Bytes of weights and optimizer state held, and the spare block of a
 * table that lends (psd_table_lend). */
uint64_t psd_table_bytes_held(const struct psd_table *t);

/* Copies weights of global elements [offset, offset+count) into out. */
void psd_table_read(const struct psd_table *t, uint64_t offset, uint64_t count, float *out);

/* Optimizer name ("sgd", "momentum", "adagrad", "adam"). */
const char *psd_optimizer_name(int kind);

#endif
