/* A primary's state transfer to joining backups (repl.h), made without
 * stopping its loop. At a round boundary a forked child writes the
 * shard's state as it is then (psd_checkpoint_fork: the pages are
 * copied on write, so memory grows by what changes while it writes);
 * the primary serves on, and keeps every record it makes meanwhile. Once
 * the file is written it goes to the backups PSD_SNAP_PIECE bytes per
 * step (one step per tick of the replicas' timer), and after its last
 * piece the records kept, in order, as many a step as the backups'
 * queues take (a full queue waits for the next step), until each backup
 * has loaded the state: they then hold it up to the primary's last
 * record and follow from there.
 *
 * The records kept are bounded in bytes (their frames, headers and
 * bookkeeping; psd --replica-transfer-mib, 256 by default, as Redis
 * bounds a replica's output buffer): past it the
 * transfer ends, and its backups ask again. A shard whose pushes during
 * one transfer pass the bound never gets a backup: raise it. Where fork fails, the file is written
 * on the loop, as before.
 *
 * A resume (psd_transfer_resume) is one without a file, for a backup
 * that holds a state of its own the primary's backlog reaches: a
 * REC_RESUME record says from which record it follows, then the
 * backlog's records after it go as the records kept do.
 *
 * Mechanism only: repl.c decides which backups, logs, and drops those a
 * piece could not be sent to. */
#ifndef PSD_TRANSFER_H
#define PSD_TRANSFER_H

#include "backlog.h"
#include "backups.h"
#include "psd.h"

#include "ps_limits.h"

#include <stdint.h>
#include <sys/types.h>
#include <zmq.h>

#define PSD_SNAP_PIECE (16u << 20) /* bytes of a state transfer per record */

struct psd_transfer {
    pid_t child;         /* the forked writer (0: none) */
    int child_fd;        /* the pipe it answers on */
    int fd;              /* the file being sent (-1: none) */
    uint64_t epoch, seq; /* the state it holds: the primary's after record seq of epoch */
    uint32_t mask;       /* the backups' slots it goes to (bit i: set->b[i]) */
    uint64_t off, size;  /* what went of the file, and its size */
    uint32_t owed;       /* the backups the current piece or record has not gone to yet */
    zmq_msg_t piece;     /* the current piece (has_piece) */
    int has_piece;
    char path[PS_PATH_MAX];
    uint64_t t0_ms, fork_us; /* when it began; how long its fork held the loop */
    int child_used;          /* a forked writer wrote it (else the loop) */
    struct psd_recq kept;    /* the records kept and not yet sent */
    uint64_t kept_max;       /* the bound on kept.bytes */
    uint64_t sent_kept;      /* kept and sent, this transfer */
    /* a resume (no file): its REC_RESUME went (resume_sent), echoing the
     * state the backup named */
    int resume, resume_sent;
    uint64_t resume_epoch, resume_seq;
    /* counters (metrics) */
    uint64_t started, forked, kept_peak_bytes, over_bound;
};

/* kept_max: the bound on the bytes of records kept. */
void psd_transfer_init(struct psd_transfer *x, uint64_t kept_max);
/* Whether one is under way (written or sent). */
int psd_transfer_busy(const struct psd_transfer *x);
/* Starts one of s's state now (between rounds), which is the primary's
 * after record seq of epoch, into dir, for the backups in mask. 0, or
 * PS_E* with err (a write on the loop that failed). */
int psd_transfer_start(struct psd_transfer *x, struct psd *s, const char *dir, uint64_t epoch,
                       uint64_t seq, uint32_t mask, char *err, size_t errlen);
/* Starts a resume for the backups in mask (one, in practice), which hold
 * the state after record resume_seq of epoch resume_epoch, the same as
 * this primary's after record seq of epoch: the records after seq that
 * bl keeps are kept for them (shared, not copied). 0; PS_ELIMIT past the
 * bound on records kept, PS_ENOMEM (nothing started: a state transfer
 * it is). */
int psd_transfer_resume(struct psd_transfer *x, uint64_t epoch, uint64_t seq, uint32_t mask,
                        const struct psd_backlog *bl, uint64_t resume_epoch, uint64_t resume_seq);
/* Keeps a record made while it is under way (its header h, numbered, and
 * n frames, shared, not copied), for its backups. 0; PS_ELIMIT past the
 * bound (the caller ends it); PS_ENOMEM. */
int psd_transfer_keep(struct psd_transfer *x, const Ps__Header *h, zmq_msg_t *frames, size_t n);

enum psd_transfer_step {
    PSD_TRANSFER_WRITING = 0, /* the writer has not finished */
    PSD_TRANSFER_SENDING = 1, /* a piece went; more to come */
    PSD_TRANSFER_DONE = 2,    /* the last piece and the records kept went, and every
                               * backup has loaded the state (acknowledged seq) */
    PSD_TRANSFER_FAILED = 3,  /* the writer failed, or the file cannot be read: err */
};
/* One step: takes in the writer once it ends; then sends one piece (a
 * resume: its REC_RESUME), and after the last one the records kept, on sock to each backup of the
 * mask in set (their routes), without waiting. *failed: the slots a
 * message could not go to (the caller drops them; they leave the mask).
 * Returns an enum psd_transfer_step. */
int psd_transfer_step(struct psd_transfer *x, void *sock, const struct psd_backups *set,
                      uint32_t *failed, char *err, size_t errlen);
/* Ends it, done or not: the writer killed and taken in, the file
 * removed, the records kept let go. */
void psd_transfer_end(struct psd_transfer *x);

#endif
