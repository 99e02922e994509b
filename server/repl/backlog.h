/* A primary's backlog (repl.h): the newest records of its epoch, kept so
 * that a backup restarted from its own checkpoint gets only the records
 * made after it instead of the whole state (as Redis's replication
 * backlog lets a replica resume). Bounded in bytes (psd
 * --replica-backlog-mib): past the bound the oldest records go. Their
 * frames are shared with the requests (ZeroMQ counts references), not
 * copied. Mechanism only: repl.c decides who may resume. */
#ifndef PSD_BACKLOG_H
#define PSD_BACKLOG_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/* A record kept for backups: its header packed, then its frames
 * (copies that share the request's buffers). */
struct psd_rec {
    struct psd_rec *next;
    uint64_t seq;
    uint64_t bytes; /* what it counts against a bound (psd_rec_bytes) */
    size_t hdr_len, n;
    uint8_t *hdr;
    zmq_msg_t frames[];
};

/* Records in order, oldest first: the backlog's, and those a state
 * transfer keeps (transfer.h). */
struct psd_recq {
    struct psd_rec *head, *tail;
    uint64_t n, bytes;
};

/* What a record of a hdr_len-byte header and n frames counts against a
 * bound: its frames, its header and its bookkeeping. */
uint64_t psd_rec_bytes(size_t hdr_len, zmq_msg_t *frames, size_t n);
/* Appends record seq (bytes: psd_rec_bytes's) with its frames shared.
 * 0, or PS_ENOMEM with nothing appended. */
int psd_recq_push(struct psd_recq *q, uint64_t seq, const void *hdr, size_t hdr_len,
                  zmq_msg_t *frames, size_t n, uint64_t bytes);
/* Lets the oldest record go (q not empty). */
void psd_recq_pop(struct psd_recq *q);
/* Lets every record go. */
void psd_recq_clear(struct psd_recq *q);

struct psd_backlog {
    struct psd_recq q;
    /* the records after base up to last are all kept: a state after any
     * record from base to last can be brought up to date from here */
    uint64_t base, last;
    uint64_t max_bytes;
    uint64_t evicted; /* records let go for the bound (metrics) */
};

/* max_bytes 0: no record is kept (only a state after the last record
 * resumes). */
void psd_backlog_init(struct psd_backlog *b, uint64_t max_bytes);
/* Keeps record seq (its header packed, hdr_len bytes, and n frames,
 * shared), letting the oldest go past the bound. A record that does not
 * follow the last one, or cannot be kept (larger than the bound, no
 * memory), starts the backlog over after it. */
void psd_backlog_add(struct psd_backlog *b, uint64_t seq, const void *hdr, size_t hdr_len,
                     zmq_msg_t *frames, size_t n);
/* Whether a state after record seq can be brought up to the last one
 * from what is kept. */
int psd_backlog_covers(const struct psd_backlog *b, uint64_t seq);
/* The first record kept after record seq (NULL: none). */
const struct psd_rec *psd_backlog_after(const struct psd_backlog *b, uint64_t seq);
/* Lets every record go; the next one kept is numbered seq + 1 (a new
 * epoch: 0). */
void psd_backlog_reset(struct psd_backlog *b, uint64_t seq);

#endif
