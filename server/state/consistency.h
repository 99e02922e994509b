/* Consistency modes: when a push is applied and when a pull may be answered.
 *
 *   asp    pushes apply on arrival; pulls never wait.
 *   bsp    in round t every worker pushes its gradient of the table's shard
 *          range for clock t, in order, whole or in chunks; the prefix that
 *          every worker has pushed (the watermark) is averaged (summed in
 *          worker order, so arrival order does not matter) and applied at
 *          once. A pull of [a, b) for clock t+1 is ready when round t is
 *          applied up to b, so a chunk can come back while later chunks are
 *          still on their way.
 *   ssp:K  pushes apply on arrival; a pull for clock c waits until every
 *          worker has completed clock c-K-1, i.e. no worker is more than K
 *          clocks ahead of the slowest.
 * Membership: every worker in [0, W) starts as a member of each table. A
 * worker dropped from the live set (psd_cons_leave) no longer holds back
 * rounds or the ssp bound; the rounds average over the members. In bsp it
 * joins again at a round boundary: when its pull of clock t is answered
 * while round t has not begun (psd_cons_pulled: its next push is clock t),
 * or when its push of the start of round t comes before any of the round
 * is applied. Other pushes from a non-member are acknowledged and dropped
 * (PSD_CONS_STALE). A rejoining worker is told to start two rounds ahead
 * (psd_cons_join_clock), so that its pulls wait for the boundary; with
 * no member left, at the table's clock. In
 * ssp/asp its next push joins.
 * Worker clocks are per table. This file judges and applies; it does not
 * queue or send replies (psd.c does). */
#ifndef PSD_CONSISTENCY_H
#define PSD_CONSISTENCY_H

#include "table.h"

#include <stddef.h>
#include <stdint.h>

enum psd_mode {
    PSD_ASP = 0,
    PSD_BSP = 1,
    PSD_SSP = 2,
};

struct psd_cons {
    enum psd_mode mode;
    uint32_t staleness; /* K of ssp:K */
    uint32_t workers;   /* W */
};

/* Parses "asp", "bsp" or "ssp:K" (K in [0, 1000000]). 0 or PS_EINVAL. */
int psd_cons_parse(const char *s, struct psd_cons *out);
/* Writes the mode as text ("ssp:2"). */
void psd_cons_name(const struct psd_cons *c, char *buf, size_t len);

/* A spec's pushers must be workers of the rounds (below c->workers). 0, or
 * PS_EINVAL with err naming the first that is not. */
int psd_cons_check_pushers(const struct psd_cons *c, const Ps__TableSpec *spec, char *err,
                           size_t errlen);

/* Allocates a table's per-worker state; only its pushers are members of
 * its rounds (psd_table_pushed_by). 0 or PS_ENOMEM. */
int psd_cons_table_init(const struct psd_cons *c, struct psd_table *t);
void psd_cons_table_fini(const struct psd_cons *c, struct psd_table *t);
/* After code outside consistency.c changed t->completed or t->member
 * (a restore, a reshard, a rows push): the slowest member is found again
 * when next asked for. */
void psd_cons_touched(struct psd_table *t);
/* A push of worker w < workers at clock in asp or ssp: w is a member
 * and has completed clock + 1 (the slowest member follows). */
void psd_cons_completed(struct psd_table *t, uint32_t w, uint64_t clock);

struct psd_cons_later;

/* A push as the consistency mode takes it: a dense range (keys NULL) or
 * keyed gradients. */
struct psd_cons_push {
    uint32_t worker;
    uint64_t clock;
    const uint64_t *keys; /* NULL: count elements from offset; else count keys, strictly
                           * increasing, inside the shard (in bsp: the worker's whole
                           * shard range for the clock, keys not listed have gradient 0) */
    uint64_t offset, count;
    const float *g; /* count gradients */
    int continues;  /* dense: Header.continues (a piece after one to this shard) */
};

/* What psd_cons_push did with a push it did not refuse. */
enum psd_cons_taken {
    PSD_CONS_TAKEN = 0, /* applied now, held for the round (bsp), or in *later */
    PSD_CONS_STALE = 1, /* from a worker that is not a member of the round and could not
                         * join it: not applied */
};

/* Takes push p. Applies it now (asp/ssp) or at the end of the round
 * (bsp). In asp/ssp, continues keeps a dense piece in the optimizer pass
 * of the piece before, for any worker id; without it, a tracked worker's
 * chunks in order make one pass and each push of an untracked one (id >=
 * workers) is a pass; a keyed push is a pass of its own. Returns an enum
 * psd_cons_taken, or a PS_E* code with a sentence in err (PS_EAGAIN: a bsp
 * chunk came before the chunks it follows; the worker sends it again).
 * *applied is set when weights changed (waiting pulls may now be
 * answerable), which a stale push can do too (a round it caught up on). */
int psd_cons_push(const struct psd_cons *c, struct psd_table *t, const struct psd_cons_push *p,
                  int *applied, struct psd_cons_later *later, char *err, size_t errlen);

/* The optimizer step of a push that was taken (asp/ssp) but not applied
 * yet. psd_cons_push fills *later instead of
 * applying when later is not NULL and the mode applies on arrival (t stays
 * NULL otherwise: applied already, or held for the round): psd answers
 * such a push first and applies it next, so the next request crosses the
 * wire while it does. The table's bookkeeping (clocks, steps) is already
 * done; g and keys must stay valid, and nothing may touch the table, until
 * psd_cons_apply_later runs. */
struct psd_cons_later {
    struct psd_table *t;
    const uint64_t *keys; /* NULL: count elements from offset */
    const float *g;
    uint64_t offset, count, step;
    uint64_t prune_step; /* 0: the pruning schedule does not move */
};
void psd_cons_apply_later(const struct psd_cons_later *l);

/* 1 when a pull of [offset, offset+count) of t at `clock` may be answered. */
int psd_cons_ready(const struct psd_cons *c, const struct psd_table *t, uint64_t clock,
                   uint64_t offset, uint64_t count);

/* 1 when a member's pull may wait for `clock` now: in bsp up to two
 * rounds past those applied (a rejoining worker starts two ahead), in ssp
 * up to K + 2 past the slowest member, anything while a table restored
 * from a checkpoint has not caught up with the workers. A pull for a
 * clock past that is refused rather than queued. */
int psd_cons_reachable(const struct psd_cons *c, const struct psd_table *t, uint64_t clock);

/* bsp: rounds applied; ssp/asp: the lowest worker clock. */
uint64_t psd_cons_clock(const struct psd_cons *c, const struct psd_table *t);

/* Worker w leaves the table's rounds (it was dropped, or a new process took
 * its id). In bsp the round in progress may complete without it: *applied
 * is set when weights moved or when waiting pulls may have become ready. */
void psd_cons_leave(const struct psd_cons *c, struct psd_table *t, uint32_t w, int *applied);

/* The clock worker w saying hello now should start at: bsp the rounds
 * applied, plus 2 when w is not a member and some worker still is; ssp
 * the slowest member's clock; asp where w itself had got to. */
uint64_t psd_cons_join_clock(const struct psd_cons *c, const struct psd_table *t, uint32_t w);

/* A pull of t at `clock` by worker w is being answered: in bsp a non-member
 * joins when the round of that clock has not begun. */
void psd_cons_pulled(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock);

/* Lists (into buf) the workers a pull of t at `clock` is waiting for. */
void psd_cons_missing(const struct psd_cons *c, const struct psd_table *t, uint64_t clock,
                      char *buf, size_t len);

#endif
