/* Checkpoints of one shard: its tables (weights, optimizer state, pruning
 * masks, sparse rows), clocks, and each worker's last applied request, in
 * a safetensors file that other tools can read (8-byte header length, a
 * JSON header written with jansson, raw little-endian tensors named
 * "w/TABLE", "s1/TABLE", "s2/TABLE", "mask/TABLE", "keys/TABLE",
 * "steps/TABLE"). The header's metadata carries the shard's state as JSON
 * and a CRC32 of the data.
 *
 * Writes are atomic (temp file, fsync, rename, fsync the directory) and
 * keep the newest PSD_CKPT_KEEP files. A BSP shard is written only when no
 * round is in progress, so what is restored is a consistent clock. Restore
 * takes the newest file that verifies; a bad one is reported and skipped. */
#ifndef PSD_CHECKPOINT_H
#define PSD_CHECKPOINT_H

#include "psd.h"

#include <stddef.h>

#define PSD_CKPT_KEEP       3
#define PSD_CKPT_HEADER_MAX (64u << 20)

/* 1 when every table is between rounds (always in asp/ssp). */
int psd_quiescent(const struct psd *s);

/* Writes the next checkpoint into dir; its path goes to path. */
int psd_checkpoint_write(struct psd *s, const char *dir, char *path, size_t pathlen, char *err,
                         size_t errlen);

/* Loads one checkpoint file into an empty server (tables may be left
 * half-restored on failure: psd_reset_tables). 0 or PS_E* with err. */
int psd_checkpoint_load(struct psd *s, const char *path, char *err, size_t errlen);

/* What psd_checkpoint_restore found. */
enum psd_restored {
    PSD_RESTORED_NONE = 0, /* no checkpoint of this shard verified (bad ones are logged) */
    PSD_RESTORED = 1,      /* one was restored: path names it */
};

/* Restores the newest valid checkpoint of this shard from dir into an
 * empty server. Returns an enum psd_restored. */
enum psd_restored psd_checkpoint_restore(struct psd *s, const char *dir, char *path,
                                         size_t pathlen);

/* Resharding (psctl reshard): fills an empty server, shard s->shard of
 * s->shards, from the newest valid checkpoint of each of the shards_from
 * shards in dir `from`, which must all hold the same tables and have been
 * written with s's consistency mode and worker count. Dense ranges are
 * cut anew with their optimizer state and pruning masks; sparse rows go
 * to the shard their key's jump hash names; each table keeps the
 * furthest clock, step count and per-worker clocks any old shard had.
 * Workers' exactly-once windows are not carried: a worker must restart
 * with the new endpoint list anyway, and starts a new session. The
 * caller then writes s (psd_checkpoint_write). 0 or PS_E* with err. */
int psd_checkpoint_reshard(struct psd *s, const char *from, uint32_t shards_from, char *err,
                           size_t errlen);

/* What the checkpoints in dir were written with: their shard count (one
 * only, or PS_EINVAL naming them), and the consistency mode and worker
 * count in the newest valid checkpoint of shard 0. */
int psd_checkpoint_params(const char *dir, uint32_t *shards, struct psd_cons *cons, char *err,
                          size_t errlen);

/* psd checkpoint files in dir, of any shard and shard count: how many,
 * and which shards they were written by ("shard 0 of 2, shard 1 of 2")
 * into what. For telling a directory that holds a model which does not
 * restore here from an empty one. */
size_t psd_checkpoint_found(const char *dir, char *what, size_t len);

#endif
