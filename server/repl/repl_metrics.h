/* The replicas' metrics in Prometheus text (psd_replica_*): role,
 * epoch, records, held replies, backups, etcd's calls and the state
 * transfers. */
#ifndef PSD_REPL_METRICS_H
#define PSD_REPL_METRICS_H

#include "repl.h"

#include "ps_prom.h"

#include <stddef.h>

void psd_repl_metrics(const struct psd_repl *r, struct ps_buf *b);

/* "primary", "backup" or "candidate". */
const char *psd_role_name(enum psd_role role);

/* The replica's part of the shard's stats (psd_set_hooks' stats hook;
 * ctx is the struct psd_repl): role, epoch, primary, records, where its
 * checkpoint stands, etcd's in-sync set as last read, and the primary's
 * backups. */
void psd_repl_stats(void *ctx, Ps__Stats *st);

/* Whether the replica does its part (GET /readyz): 1 as primary, or as a
 * backup that holds its primary's state; 0 without a primary, or while
 * it loads the state. why says which, in words. */
int psd_repl_ready(const struct psd_repl *r, char *why, size_t len);

#endif
