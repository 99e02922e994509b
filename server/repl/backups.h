/* A primary's backups and the rules of the in-sync set (repl.h): which
 * backups a reply waits for, when one joins etcd's in-sync set and when
 * it may leave it. Pure bookkeeping: the caller (repl.c) sends, logs and
 * writes etcd; nothing here blocks or allocates.
 *
 * A backup follows (TRANSFER), gets the shard's state (CATCHING_UP, from
 * the record the transfer holds everything up to), and once it has
 * acknowledged that record it is IN_SYNC: replies wait for it from then
 * on, and etcd's set lists it. One dropped while IN_SYNC is LEAVING:
 * replies still wait for it until etcd's set no longer lists it, since a
 * backup listed there may take over (lead.h). */
#ifndef PSD_BACKUPS_H
#define PSD_BACKUPS_H

#include "lead.h"

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

#define PSD_BACKUPS_MAX (PSD_REPLICAS_MAX - 1u)

enum psd_backup_state {
    PSD_BACKUP_FREE = 0,        /* the slot is free */
    PSD_BACKUP_TRANSFER = 1,    /* waits for its state transfer */
    PSD_BACKUP_CATCHING_UP = 2, /* has its state; gets records, not waited for yet */
    PSD_BACKUP_IN_SYNC = 3,     /* listed in etcd's in-sync set; replies wait for it */
    PSD_BACKUP_LEAVING = 4,     /* dropped, still listed: replies wait for it until the
                                 * set is written without it */
};

struct psd_backup {
    enum psd_backup_state state;
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
    char endpoint[PS_ENDPOINT_MAX];
    uint64_t id;
    uint64_t from_seq; /* its state transfer held every record up to this */
    uint64_t acked;
    uint64_t heard_ms;
    /* the state its follow says it holds (its own checkpoint): after
     * record resume_seq of epoch resume_epoch; 0, 0: none */
    uint64_t resume_epoch, resume_seq;
};

struct psd_backups {
    struct psd_backup b[PSD_BACKUPS_MAX];
};

/* The fewest records every backup a reply waits for (IN_SYNC or
 * LEAVING) has applied; UINT64_MAX when none is waited for. */
uint64_t psd_backups_required(const struct psd_backups *set);

/* The slot a follow from replica id takes: its own if it has one, else a
 * free one; NULL when every slot is taken. */
struct psd_backup *psd_backups_slot(struct psd_backups *set, uint64_t id);
/* Starts b over as replica id at endpoint on route (route_len at most
 * PS_ROUTE_ID_MAX), waiting for its state transfer. */
void psd_backup_follows(struct psd_backup *b, uint64_t id, const char *endpoint, const void *route,
                        size_t route_len, uint64_t now_ms);
/* Its state transfer went out, holding every record up to seq. */
void psd_backup_transferred(struct psd_backup *b, uint64_t seq);

/* An acknowledgement of every record up to seq (the primary has sent
 * sent): counts when it moves forward and is not past sent. 1 when b
 * just joined the in-sync set (the set must be written), else 0. */
int psd_backup_acked(struct psd_backup *b, uint64_t seq, uint64_t sent, uint64_t now_ms);

/* Drops b: 1 when it was in the in-sync set (now LEAVING: the set must be
 * written without it), 0 when it is gone at once or was gone. */
int psd_backup_drop(struct psd_backup *b);
/* The slots LEAVING now, a bit each: what a set written from
 * psd_backups_in_sync now leaves out. */
uint32_t psd_backups_leaving_mask(const struct psd_backups *set);
/* etcd's set was written from psd_backups_in_sync when the slots in
 * mask were LEAVING: those still LEAVING are gone (one dropped since was
 * in that set, and stays until a set without it is written). */
void psd_backups_listed(struct psd_backups *set, uint32_t mask);
/* The IN_SYNC backups' ids and endpoints (at most PSD_BACKUPS_MAX). */
uint32_t psd_backups_in_sync(const struct psd_backups *set, uint64_t *ids, const char **endpoints);
/* 1 when some backup is LEAVING (a set write that has not happened yet). */
int psd_backups_leaving(const struct psd_backups *set);
/* 1 when some backup waits for its state transfer. */
int psd_backups_waiting(const struct psd_backups *set);

/* Whether b has been silent too long at now: an IN_SYNC one past
 * timeout_ms, one still loading its state past catch_up_ms. */
int psd_backup_silent(const struct psd_backup *b, uint64_t now_ms, uint64_t timeout_ms,
                      uint64_t catch_up_ms);
/* Whether b gets records (it has its state), and beats (it follows and
 * is not leaving). */
int psd_backup_gets_records(const struct psd_backup *b);
int psd_backup_gets_beats(const struct psd_backup *b);
/* Records b has not acknowledged when the primary has sent seq. */
uint64_t psd_backup_lag(const struct psd_backup *b, uint64_t seq);

#endif
