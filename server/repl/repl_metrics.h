/* The replicas' metrics in Prometheus text (psd_replica_*): role,
 * epoch, records, held replies, backups, etcd's calls and the state
 * transfers. */
#ifndef PSD_REPL_METRICS_H
#define PSD_REPL_METRICS_H

#include "repl.h"

#include "ps_prom.h"

void psd_repl_metrics(const struct psd_repl *r, struct ps_buf *b);

#endif
