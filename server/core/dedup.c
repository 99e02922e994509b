/* The exactly-once record (dedup.h). */
#include "dedup.h"

#include "counters.h"

#include <stdlib.h>
#include <string.h>

struct peer {
    uint32_t worker_id;
    uint64_t session, last_applied;
    /* ids in (last_applied - PS_DEDUP_WINDOW, last_applied] applied so
     * far, bit id % PS_DEDUP_WINDOW */
    uint64_t applied_bits[PS_DEDUP_WINDOW / 64];
    int used;
};

struct psd_dedup {
    struct peer peers[PSD_PEERS];
    uint64_t dropped; /* retried pushes recognised */
};

struct psd_dedup *psd_dedup_create(void)
{
    return calloc(1, sizeof(struct psd_dedup));
}

void psd_dedup_destroy(struct psd_dedup *d)
{
    free(d);
}

/* The record of a worker id (NULL: none, and create is 0 or no room). */
static struct peer *peer_of(struct psd_dedup *d, uint32_t worker_id, int create)
{
    for (uint32_t i = 0, j = worker_id % PSD_PEERS; i < PSD_PEERS; i++, j = (j + 1) % PSD_PEERS) {
        struct peer *p = &d->peers[j];
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

static int bit_get(const struct peer *p, uint64_t id)
{
    uint64_t i = id % PS_DEDUP_WINDOW;
    return (int)((p->applied_bits[i / 64] >> (i % 64)) & 1u);
}

static void bit_put(struct peer *p, uint64_t id, int on)
{
    uint64_t i = id % PS_DEDUP_WINDOW, m = UINT64_C(1) << (i % 64);
    p->applied_bits[i / 64] = on ? p->applied_bits[i / 64] | m : p->applied_bits[i / 64] & ~m;
}

/* Everything up to last_applied counts as applied (a restored record
 * without its window, a new session at 0). */
static void peer_reset(struct peer *p, uint64_t session, uint64_t last_applied)
{
    p->session = session;
    p->last_applied = last_applied;
    memset(p->applied_bits, 0xff, sizeof p->applied_bits);
}

int psd_dedup_seen(struct psd *s, const Ps__Header *req)
{
    struct peer *p = peer_of(s->dedup, req->worker_id, 0);
    if (p == NULL || p->session == 0 || req->request_id > p->last_applied)
        return 0;
    if (p->last_applied - req->request_id < PS_DEDUP_WINDOW && !bit_get(p, req->request_id))
        return 0;
    s->dedup->dropped++;
    PS_LOG(s->conf.log, PS_LOG_DEBUG, S0340,
           "worker %u: %s %llu of table %u (clock %llu) was applied before: not again",
           req->worker_id, ps_op_name(req->op), (unsigned long long)req->request_id, req->table_id,
           (unsigned long long)req->clock);
    return 1;
}

void psd_dedup_applied(struct psd *s, const Ps__Header *req)
{
    struct peer *p = peer_of(s->dedup, req->worker_id, 0);
    if (p == NULL || p->session == 0)
        return;
    psd_count_change(s);
    uint64_t id = req->request_id;
    if (id > p->last_applied) { /* the ids skipped over are not applied (yet) */
        uint64_t gap = id - p->last_applied;
        if (gap >= PS_DEDUP_WINDOW)
            memset(p->applied_bits, 0, sizeof p->applied_bits);
        else
            for (uint64_t j = p->last_applied + 1; j < id; j++)
                bit_put(p, j, 0);
        p->last_applied = id;
    }
    bit_put(p, id, 1);
}

int psd_dedup_hello(struct psd *s, uint32_t worker_id, uint64_t session)
{
    struct peer *p = peer_of(s->dedup, worker_id, 1);
    if (p == NULL || p->session == session)
        return 0;
    peer_reset(p, session, 0);
    psd_count_change(s);
    return 1;
}

uint64_t psd_dedup_session(const struct psd *s, uint32_t worker_id)
{
    const struct peer *p = peer_of(s->dedup, worker_id, 0);
    return p != NULL ? p->session : 0;
}

void psd_dedup_restore(struct psd *s, const struct psd_dedup_entry *e)
{
    struct peer *p = peer_of(s->dedup, e->worker_id, 1);
    if (p == NULL)
        return;
    peer_reset(p, e->session, e->last_applied);
    if (e->bits != NULL)
        memcpy(p->applied_bits, e->bits, sizeof p->applied_bits);
}

void psd_dedup_each(const struct psd *s, void (*fn)(void *ctx, const struct psd_dedup_entry *e),
                    void *ctx)
{
    for (uint32_t i = 0; i < PSD_PEERS; i++) {
        const struct peer *p = &s->dedup->peers[i];
        if (!p->used)
            continue;
        struct psd_dedup_entry e = {p->worker_id, p->session, p->last_applied, p->applied_bits};
        fn(ctx, &e);
    }
}

void psd_dedup_reset(struct psd *s)
{
    memset(s->dedup->peers, 0, sizeof s->dedup->peers);
}

uint64_t psd_dedup_dropped(const struct psd *s)
{
    return s->dedup->dropped;
}

void psd_dedup_set_dropped(struct psd *s, uint64_t n)
{
    s->dedup->dropped = n;
}
