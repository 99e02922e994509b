/* The ticket slots: allocating one for a request and finding it by its
 * id, what its shards answered, failing it, and the client's last
 * error. The bottom of the client library: it calls no other file of
 * it. */
#include "client_impl.h"

#include "ps_shard.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int psc__set_error(struct psc_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
    return code;
}

void psc__slot_fail(struct slot *sl, int code, const char *fmt, ...)
{
    if (sl == NULL || sl->status != 0)
        return; /* no ticket's (send_frames), or keep the first error */
    sl->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sl->error, sizeof sl->error, fmt, ap);
    va_end(ap);
}

void psc__zc_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_uint *)hint, 1u);
}

struct slot *psc__slot_alloc(struct psc_client *c, Ps__Op op, uint64_t *id)
{
    if (c->nfree == 0)
        return NULL;
    uint16_t idx = c->free_stack[--c->nfree];
    struct slot *sl = &c->slots[idx];
    /* the next id whose map entry is free: at most PS_CLIENT_TICKETS_MAX
     * are taken, so this skips few ids, and rarely */
    uint64_t seq;
    do
        seq = ++c->next_seq;
    while (c->id_map[seq & (ID_MAP - 1)] != 0);
    c->id_map[seq & (ID_MAP - 1)] = (uint16_t)(idx + 1);
    memset(sl->replied, 0, sizeof sl->replied);
    sl->seq = seq;
    sl->op = op;
    sl->out = NULL;
    sl->ctx = NULL;
    sl->pending = 0;
    sl->status = 0;
    sl->remote = 0;
    sl->canceled = 0;
    sl->rows = 0;
    sl->view = 0;
    sl->kind = SUB_SYNC;
    sl->nkids = 0;
    sl->continues = 0;
    sl->src = NULL;
    sl->src32 = NULL;
    sl->keys = NULL;
    sl->attempts = 0;
    sl->sync_len = 0;
    sl->mirror = NULL;
    memset(sl->expected, 0, sizeof sl->expected);
    memset(sl->via_shm, 0, sizeof sl->via_shm);
    memset(sl->f32_to, 0, sizeof sl->f32_to);
    sl->error[0] = '\0';
    *id = seq;
    return sl;
}

/* Lets go of a view's messages (they stay initialised, empty). */
void psc__view_drop(struct psc_client *c, struct slot *sl)
{
    for (uint32_t s = 0; sl->vmsg != NULL && s < c->nshards; s++) {
        zmq_msg_close(&sl->vmsg[s]);
        zmq_msg_init(&sl->vmsg[s]);
    }
    sl->held = 0;
}

void psc__slot_release(struct psc_client *c, struct slot *sl)
{
    psc__view_drop(c, sl);
    if (sl->mirror != NULL && sl->mirror->ticket == sl->seq)
        sl->mirror->ticket = 0; /* its pull is over: another may go */
    sl->mirror = NULL;
    c->id_map[sl->seq & (ID_MAP - 1)] = 0;
    sl->seq = 0;
    c->free_stack[c->nfree++] = (uint16_t)(sl - c->slots);
}

struct slot *psc__slot_lookup(struct psc_client *c, uint64_t id)
{
    uint16_t e = c->id_map[id & (ID_MAP - 1)];
    if (e == 0)
        return NULL;
    struct slot *sl = &c->slots[e - 1];
    return sl->seq == id ? sl : NULL;
}

int psc__shard_replied(const struct slot *sl, uint32_t shard)
{
    return (sl->replied[shard / 64] >> (shard % 64)) & 1u;
}

/* The part [*a, *b) of a range ticket's elements that shard s holds;
 * 0 when it holds none of them. */
int psc__range_part(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t *a,
                    uint64_t *b)
{
    uint64_t lo, hi;
    ps_shard_range(c->tables[sl->table]->size, c->nshards, s, &lo, &hi);
    *a = sl->offset > lo ? sl->offset : lo;
    *b = sl->offset + sl->count < hi ? sl->offset + sl->count : hi;
    return *a < *b;
}

struct mirror_seg *psc__mirror_seg(struct psc_mirror *m, uint64_t a, uint64_t b)
{
    for (uint32_t i = 0; i < m->nseg; i++)
        if (m->seg[i].a == a && m->seg[i].b == b)
            return &m->seg[i];
    return NULL;
}
