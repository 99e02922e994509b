/* This shard's checkpoints: turning the shard into a snapshot
 * (state/snapshot.h, the file format) and back, and when one is written:
 * every --checkpoint-every once the state changed, on request (psctl
 * checkpoint) once the round is quiet, on SIGTERM. A bsp shard is
 * written only between rounds, so what is restored is a consistent
 * clock. The schedule is owned by checkpoint.c: opaque outside it. */
#ifndef PSD_CHECKPOINT_H
#define PSD_CHECKPOINT_H

#include "psd.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* dir NULL: checkpoints are off. every_ms 0: only when asked for and on
 * SIGTERM. NULL: out of memory. */
struct psd_autosave *psd_autosave_create(const char *dir, uint64_t every_ms);
void psd_autosave_destroy(struct psd_autosave *a);

/* Writes this shard (between rounds) as the next snapshot in dir (a
 * checkpoint, or a state transfer to a backup); its path goes to path.
 * 0 or PS_E* with err. */
int psd_checkpoint_write(struct psd *s, const char *dir, char *path, size_t pathlen, char *err,
                         size_t errlen);
/* The same, by a forked child from the pages as they are now, while the
 * caller goes on serving (copy on write: memory grows by what changes
 * during the write). The child's pid, its answer to come on *fd; -1
 * where fork failed (nothing started). */
pid_t psd_checkpoint_fork(struct psd *s, const char *dir, int *fd);
/* That child's answer once it has ended (wait: waits for it): 1 while it
 * writes; 0, the path written in path; PS_EIO with why in err. fd is
 * closed once it has ended. */
int psd_checkpoint_forked(pid_t pid, int fd, int wait, char *path, size_t pathlen, char *err,
                          size_t errlen);
/* Loads one snapshot file into a shard with no tables and no workers'
 * records (nothing is left half-restored on failure). 0 or PS_E* with
 * err. */
int psd_checkpoint_load(struct psd *s, const char *path, char *err, size_t errlen);

/* What psd_checkpoint_restore found. */
enum psd_restored {
    PSD_RESTORED_NONE = 0, /* no checkpoint of this shard verified (bad ones are logged) */
    PSD_RESTORED = 1,      /* one was restored: path names it */
};
/* Restores the newest valid checkpoint of this shard from dir into an
 * empty shard. Returns an enum psd_restored. */
enum psd_restored psd_checkpoint_restore(struct psd *s, const char *dir, char *path,
                                         size_t pathlen);

/* A checkpoint due by the interval (now in ms) or asked for mid-round is
 * written at the first moment the shard is between rounds (checked after
 * every request and on every tick), and only when the state differs from
 * the newest checkpoint's: an idle shard, or one with no tables yet,
 * writes nothing. An interval checkpoint is written by a forked child
 * while the shard serves on (one at a time), as is a backup's state
 * transfer (psd_checkpoint_fork); an asked-for one and the one at
 * shutdown are written on the loop. */
void psd_checkpoint_if_due(struct psd *s, uint64_t now);
/* OP_CHECKPOINT: now, or (bsp, mid-round) at the end of the round. */
void psd_op_checkpoint(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

/* Checkpoints written so far; when the last one was tried (ms, 0:
 * never); whether checkpoints are on (--checkpoint-dir). */
uint64_t psd_checkpoints_written(const struct psd *s);
uint64_t psd_checkpoint_last_ms(const struct psd *s);
int psd_checkpoints_on(const struct psd *s);
/* The newest checkpoint this process wrote, when the state has not
 * changed since it was written (a shutdown then need not write another);
 * NULL otherwise. */
const char *psd_checkpoint_current(const struct psd *s);
/* While held, no checkpoint is written (interval, asked for or at
 * shutdown: PSD_CKPT_HELD): a backup that has asked its primary for the
 * state and not loaded it holds what it restored, already in its
 * directory, or nothing, and a checkpoint of that would hide a better
 * one there. */
void psd_checkpoint_hold(struct psd *s, int hold);
/* A replica's position (repl.h): its state is its primary's after *seq
 * records of epoch *epoch. Every checkpoint written from here is
 * labelled with the position it holds (pointers to the replica's own
 * counters, read when a checkpoint is taken; NULL: not replicated). */
void psd_checkpoint_position(struct psd *s, const uint64_t *epoch, const uint64_t *seq);
/* The label of the checkpoint restored at start (0, 0: none restored, or
 * it was written without replicas). */
void psd_checkpoint_restored_at(const struct psd *s, uint64_t *epoch, uint64_t *seq);
/* Takes in the forked writer of an interval checkpoint when it has ended
 * (wait: waits for it): from psd_tick, and before the process exits. */
void psd_checkpoint_reap(struct psd *s, int wait);

#endif
