/* The exactly-once window: per worker id, the session that said hello
 * and which request ids were applied, so a resent push is answered but
 * not applied twice. */
#include "psd_impl.h"

#include "ps_clock.h"
#include "ps_pool.h"
#include "ps_shard.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The exactly-once record of a worker id (open addressing over a fixed
 * array: no allocation, and at most PSD_PEERS distinct ids). */
struct psd_peer *psd_peer_of(struct psd *s, uint32_t worker_id, int create)
{
    for (uint32_t i = 0, j = worker_id % PSD_PEERS; i < PSD_PEERS; i++, j = (j + 1) % PSD_PEERS) {
        struct psd_peer *p = &s->peers[j];
        if (p->used && p->worker_id == worker_id)
            return p;
        if (!p->used) {
            if (!create)
                return NULL;
            p->used = 1;
            p->worker_id = worker_id;
            return p;
        }
    }
    return NULL;
}

static int bit_get(const struct psd_peer *p, uint64_t id)
{
    uint64_t i = id % PSD_DEDUP_WINDOW;
    return (int)((p->applied_bits[i / 64] >> (i % 64)) & 1u);
}

static void bit_put(struct psd_peer *p, uint64_t id, int on)
{
    uint64_t i = id % PSD_DEDUP_WINDOW, m = UINT64_C(1) << (i % 64);
    p->applied_bits[i / 64] = on ? p->applied_bits[i / 64] | m : p->applied_bits[i / 64] & ~m;
}

/* 1 when this push was applied already (a retry): acknowledge, skip. Ids
 * above the newest applied are new; within the window below it, each id
 * is remembered on its own (a retry of a request lost in a crash comes
 * after requests sent behind it); older ones count as applied. */
int psd_seen_push(struct psd *s, const Ps__Header *req)
{
    struct psd_peer *p = psd_peer_of(s, req->worker_id, 0);
    if (p == NULL || p->session == 0 || req->request_id > p->last_applied)
        return 0;
    if (p->last_applied - req->request_id < PSD_DEDUP_WINDOW && !bit_get(p, req->request_id))
        return 0;
    s->duplicates_dropped++;
    PS_LOG(s->log, PS_LOG_DEBUG, S0340,
           "worker %u: %s %llu of table %u (clock %llu) was applied before: not again",
           req->worker_id, ps_op_name(req->op), (unsigned long long)req->request_id, req->table_id,
           (unsigned long long)req->clock);
    return 1;
}

void psd_applied_push(struct psd *s, const Ps__Header *req)
{
    struct psd_peer *p = psd_peer_of(s, req->worker_id, 0);
    if (p == NULL || p->session == 0)
        return;
    s->changes++;
    uint64_t id = req->request_id;
    if (id > p->last_applied) { /* the ids skipped over are not applied (yet) */
        uint64_t gap = id - p->last_applied;
        if (gap >= PSD_DEDUP_WINDOW)
            memset(p->applied_bits, 0, sizeof p->applied_bits);
        else
            for (uint64_t j = p->last_applied + 1; j < id; j++)
                bit_put(p, j, 0);
        p->last_applied = id;
    }
    bit_put(p, id, 1);
}

/* Everything up to last_applied counts as applied (a restored checkpoint,
 * a new session at 0). */
void psd_peer_reset(struct psd_peer *p, uint64_t session, uint64_t last_applied)
{
    p->session = session;
    p->last_applied = last_applied;
    memset(p->applied_bits, 0xff, sizeof p->applied_bits);
}

void psd_peer_restore(struct psd *s, uint32_t worker_id, uint64_t session, uint64_t last_applied,
                      const uint64_t *bits)
{
    struct psd_peer *p = psd_peer_of(s, worker_id, 1);
    if (p != NULL) {
        psd_peer_reset(p, session, last_applied);
        if (bits != NULL)
            memcpy(p->applied_bits, bits, sizeof p->applied_bits);
    }
    /* a worker known before the restart: dropped if it stays silent */
    if (worker_id < s->cons.workers) {
        s->live[worker_id].seen = s->live[worker_id].live = 1;
        s->live[worker_id].last_ms = (uint64_t)ps_mono_ms();
    }
}

void psd_reply_duplicate(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    Ps__Header h;
    psd_reply_init(&h, req);
    h.duplicate = 1;
    psd_reply_header(s, &h, rep);
}
