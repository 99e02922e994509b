/* The exactly-once record: per worker id, the session that said hello
 * and which request ids were applied, so a resent push is answered but
 * not applied twice. Ids above the newest applied are new; within
 * PS_DEDUP_WINDOW below it each id is remembered on its own (after a
 * restart, requests queued behind a lost one arrive before its retry);
 * older ones count as applied. At most PSD_PEERS worker ids are
 * remembered (open addressing over a fixed array: no allocation per
 * request). Owned by dedup.c: opaque outside it. */
#ifndef PSD_DEDUP_H
#define PSD_DEDUP_H

#include "psd.h"

#include <stdint.h>

#define PSD_PEERS PS_WORKERS_MAX /* exactly-once records for this many worker ids */

/* One worker's record as a checkpoint holds it. */
struct psd_dedup_entry {
    uint32_t worker_id;
    uint64_t session, last_applied;
    const uint64_t *bits; /* PS_DEDUP_WINDOW / 64 words; NULL: every id up to
                           * last_applied counts as applied */
};

struct psd_dedup *psd_dedup_create(void);
void psd_dedup_destroy(struct psd_dedup *d);

/* 1 when req (a push) was applied already: a retry to acknowledge, not
 * apply (counted and logged). */
int psd_dedup_seen(struct psd *s, const Ps__Header *req);
/* req (a push) was applied, or taken as stale: never again. */
void psd_dedup_applied(struct psd *s, const Ps__Header *req);
/* A hello from session (not 0) for worker_id: a new session starts
 * afresh. 1 when it is new (the worker's old process is gone), 0 when it
 * is the session known, or no room is left for the id. */
int psd_dedup_hello(struct psd *s, uint32_t worker_id, uint64_t session);
/* The session worker_id said hello from (0: none). */
uint64_t psd_dedup_session(const struct psd *s, uint32_t worker_id);

/* A record as a checkpoint or state transfer saved it. */
void psd_dedup_restore(struct psd *s, const struct psd_dedup_entry *e);
/* Calls fn for each worker id with a record, in slot order. */
void psd_dedup_each(const struct psd *s, void (*fn)(void *ctx, const struct psd_dedup_entry *e),
                    void *ctx);
/* Forgets every record. */
void psd_dedup_reset(struct psd *s);

/* Retried pushes recognised so far, and setting it (a restored count). */
uint64_t psd_dedup_dropped(const struct psd *s);
void psd_dedup_set_dropped(struct psd *s, uint64_t n);

#endif
