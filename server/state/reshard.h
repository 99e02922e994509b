/* Resharding: the snapshots of S shards rewritten for N (psctl reshard),
 * on the snapshot file's own reader (snapshot.h). */
#ifndef PSD_RESHARD_H
#define PSD_RESHARD_H

#include "snapshot.h"

#include <stddef.h>
#include <stdint.h>

/* Fills out, which names shard out->shard of
 * out->shards and the consistency mode and worker count (all other
 * fields empty), from the newest valid file of each of the shards_from
 * shards in dir `from`; they must all hold the same tables and have been
 * written with out's mode and worker count. Dense ranges are cut anew
 * with their optimizer state and pruning masks; sparse rows go to the
 * shard their key's jump hash names; each table keeps the furthest
 * clock, step count and per-worker clocks any old shard had. Workers'
 * exactly-once records are not carried: a worker must restart with the
 * new endpoint list anyway, and starts a new session. The caller then
 * writes out (psd_snapshot_write) and frees it. 0 or PS_E* with err. */
int psd_reshard(struct psd_snapshot *out, const char *from, uint32_t shards_from, char *err,
                size_t errlen);

#endif
