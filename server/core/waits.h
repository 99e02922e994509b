/* Deferred pulls: a pull for a clock not reached yet waits, bounded per
 * worker, per connection and in all (PS_WAITS_*), and is answered when
 * its round closes or its deadline passes. Owned by waits.c: the queue
 * is opaque outside it. */
#ifndef PSD_WAITS_H
#define PSD_WAITS_H

#include "psd.h"

#include <stdint.h>

/* Its counters, for stats and metrics. */
struct psd_waits_stats {
    uint32_t waiting;
    uint64_t deferred_total, timeouts, max_staleness;
    uint64_t refreshed; /* retries of a request already waiting */
    uint64_t refused;   /* pulls not ready that could not wait */
};

/* 0 wait_timeout_ms: PS_WAIT_TIMEOUT_MS_DEFAULT. NULL: out of memory. */
struct psd_waits *psd_waits_create(uint64_t wait_timeout_ms);
void psd_waits_destroy(struct psd_waits *w);

/* Answers a pull of [offset, offset+count) of t at clock by req's
 * worker: the staleness it is admitted at, a rejoining worker joining at
 * a round boundary, then the values. The one place a pull is answered,
 * at once or after waiting. */
void psd_answer_pull(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t clock,
                     uint64_t offset, uint64_t count, int duplicate, int stale, unsigned char *dst,
                     struct psd_reply *rep);
/* A pull whose clock is not ready: waits (PSD_ANSWER_LATER), or an error
 * reply saying why it may not (PSD_ANSWER_NOW). */
enum psd_answer psd_defer(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                          uint64_t clock, struct psd_reply *rep);
/* Answers every waiting request that is ready now. */
void psd_release_waits(struct psd *s);
/* Answers waits past their deadline with an error naming who is missing,
 * and logs waits older than PSD_WAIT_WARN_MS once (now in ms). */
void psd_waits_expire(struct psd *s, uint64_t now);
/* Forgets worker w's waits (its process is gone: a new session). */
void psd_waits_drop_worker(struct psd *s, uint32_t w);
/* Forgets every wait: their connections are another process's (a state
 * transfer, a backup taking over; the clients send again). */
void psd_waits_clear(struct psd *s);

struct psd_waits_stats psd_waits_stats(const struct psd *s);

#endif
