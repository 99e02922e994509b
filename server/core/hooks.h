/* Replication's hooks into a shard (repl/repl.h): a worker the live set
 * drops, and the replicas' part of a stats reply. Owned by hooks.c:
 * opaque outside it; set once with psd_set_hooks (psd.h). */
#ifndef PSD_HOOKS_H
#define PSD_HOOKS_H

#include "psd.h"

struct psd_hooks *psd_hooks_create(void);
void psd_hooks_destroy(struct psd_hooks *h);

/* Worker w leaves the live set (before the rounds it closes: a backup
 * drops it first too). */
void psd_hooks_drop(const struct psd *s, uint32_t w);
/* Adds the replicas' fields to a stats reply (the role stays "solo"
 * without replicas). */
void psd_hooks_stats(const struct psd *s, Ps__Stats *st);
/* Whether table's age floor rises to floor now: 1 without replicas, else
 * replication's say (a primary sends the record first). */
int psd_hooks_floor(const struct psd *s, uint32_t table, uint64_t floor);

#endif
