/* The live set: which of the round's workers [0, W) were heard from
 * within --worker-timeout, dropping the silent ones from the rounds, and
 * the hello that binds a worker id to a connection (and its CURVE key).
 * Any request but stats counts as heard (workers heartbeat when
 * otherwise quiet); never-seen ids are not dropped. Owned by live.c:
 * opaque outside it. */
#ifndef PSD_LIVE_H
#define PSD_LIVE_H

#include "psd.h"

#include <stdint.h>

#define PSD_USER_MAX 41 /* a CURVE key in Z85 and its NUL */
/* How long an id stays with a silent holder when --worker-timeout is 0. */
#define PSD_HOLD_MS_DEFAULT 10000u

/* Its counters, for stats and metrics. */
struct psd_live_stats {
    uint64_t dropped, rejoined, stale_pushes, hellos_refused;
    uint64_t requests_refused; /* data requests under an id bound to another connection */
};

/* For the round's workers [0, workers). NULL: out of memory. */
struct psd_live *psd_live_create(uint32_t workers, uint64_t worker_timeout_ms);
void psd_live_destroy(struct psd_live *l);

/* A request from req's worker: it is alive. A dropped worker is live
 * again and rejoins its tables with its next push that can join a round;
 * one saying hello from a new session (a new process) leaves the rounds
 * its old process was in, and its old process's waits are gone. */
void psd_live_heard(struct psd *s, const Ps__Header *req);
/* Drops workers silent past the worker timeout (now in ms). */
void psd_live_drop_silent(struct psd *s, uint64_t now);
/* A push from a worker outside the round: acknowledged, not applied. */
void psd_live_stale(struct psd *s, const Ps__Header *req, const struct psd_table *t);
/* A hello that would take a worker id from the connection holding it,
 * or that a CURVE key may not make: 1 with an error reply, 0 when it may
 * go on. replaying: a backup's copy of a hello its primary took (never
 * refused: the primary decided). */
int psd_live_hello_refused(struct psd *s, const struct ps_frame *route, const char *user,
                           const Ps__Header *req, int replaying, struct psd_reply *rep);
/* A data request (pull, push, push-pull, set, heartbeat) under a worker
 * id of the rounds from a connection other than the one its hello bound,
 * or under an id its CURVE key may not use: 1 with an error reply
 * (PS_EBUSY, PS_EAUTH), counted; 0 when it may go on. Ids no hello bound
 * yet, psctl's observer id and a backup's replayed requests pass. */
int psd_live_request_refused(struct psd *s, const struct ps_frame *route, const char *user,
                             const Ps__Header *req, int replaying, struct psd_reply *rep);
/* OP_HELLO (after psd_live_hello_refused let it through). */
void psd_op_hello(struct psd *s, const struct ps_frame *route, const char *user,
                  const Ps__Header *req, struct psd_reply *rep);

/* 1 when worker w of the round is in the live set. */
int psd_live_is_live(const struct psd *s, uint32_t w);
/* A worker known before a restart (its record was restored): live now,
 * dropped if it stays silent. */
void psd_live_restored(struct psd *s, uint32_t w);
/* Every live worker counts as heard now (a backup taking over: they were
 * heard through the old primary until now). */
void psd_live_heard_all(struct psd *s);
/* Forgets every worker (a state transfer replaces the shard's state). */
void psd_live_reset(struct psd *s);
uint64_t psd_worker_timeout_ms(const struct psd *s);
struct psd_live_stats psd_live_stats(const struct psd *s);
/* The ipc:// endpoint hello replies offer ("" none). */
const char *psd_local_endpoint(const struct psd *s);

#endif
