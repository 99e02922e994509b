/* Dense ranges: pull, push and push-pull split over the shards that
 * own the range, in pieces when large, and pull views. */
#include "client_impl.h"

#include "ps_err.h"
#include "ps_shard.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Sends a checked range request as one ticket (continues: see
 * Header.continues). */
static int range_ticket(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                        uint64_t count, const float *grad, float *out, int view, int continues,
                        struct psc_mirror *mirror, uint64_t clock, uint64_t *ticket);

/* Elements a piece of a count-element request holds: 0 when it goes whole
 * (see PSC_PIECE_BYTES_DEFAULT). */
static uint64_t piece_elems(const struct psc_client *c, uint64_t count, const float *grad,
                            const float *out, int view)
{
    if (view || count <= c->piece_bytes / c->esize ||
        psc__in_region(c, grad, count * sizeof(float)) ||
        psc__in_region(c, out, count * sizeof(float)))
        return 0;
    uint64_t per = c->piece_bytes / c->esize, least = (count + PSC_PIECES_MAX - 1) / PSC_PIECES_MAX;
    return per > least ? per : least;
}

/* Where the piece that starts at a ends: per elements on, or sooner at the
 * end of a's shard or at end. *shard_start: a is where a's shard begins. */
static uint64_t piece_end(const struct psc_client *c, const struct table_h *t, uint64_t a,
                          uint64_t end, uint64_t per, int *shard_start)
{
    uint64_t lo, hi;
    ps_shard_range(t->size, c->nshards, ps_shard_of_index(t->size, c->nshards, a), &lo, &hi);
    *shard_start = a == lo;
    uint64_t b = end - a > per ? a + per : end;
    return b < hi ? b : hi;
}

/* Sends a checked range request as pieces of per elements, each its own
 * ticket, under one more. Sends it whole when the tickets or the memory to
 * list them are short. */
static int start_pieces(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                        uint64_t count, const float *grad, float *out, struct psc_mirror *mirror,
                        uint64_t clock, uint64_t per, uint64_t *ticket)
{
    const struct table_h *t = c->tables[table];
    uint64_t end = offset + count;
    uint32_t n = 0;
    int shard_start;
    for (uint64_t a = offset; a < end; n++)
        a = piece_end(c, t, a, end, per, &shard_start);
    uint64_t id = 0;
    struct slot *sl = c->nfree > n ? psc__slot_alloc(c, op, &id) : NULL;
    if (sl != NULL && sl->kids_cap < n) {
        uint64_t *k = realloc(sl->kids, n * sizeof *k);
        if (k != NULL) {
            sl->kids = k;
            sl->kids_cap = n;
        }
    }
    if (sl == NULL || sl->kids_cap < n) {
        if (sl != NULL)
            psc__slot_release(c, sl);
        return range_ticket(c, op, table, offset, count, grad, out, 0, 0, mirror, clock, ticket);
    }
    sl->kind = SUB_PIECES;
    sl->mirror = mirror;
    for (uint64_t a = offset, b; a < end; a = b) {
        b = piece_end(c, t, a, end, per, &shard_start);
        uint64_t kid = 0;
        /* the first piece to each shard starts the request's pass there
         * (pieces end at shard ends, so a later one starts its shard) */
        int continues = op != PS__OP__OP_PULL && a != offset && !shard_start;
        int rc = range_ticket(c, op, table, a, b - a, grad ? grad + (a - offset) : NULL,
                              out ? out + (a - offset) : NULL, 0, continues, mirror, clock, &kid);
        if (rc != 0 && sl->nkids == 0) {
            psc__slot_release(c, sl);
            return rc; /* nothing went: as a request sent whole */
        }
        if (rc != 0) { /* fails at wait, after the pieces that went */
            psc__slot_fail(sl, rc, "%s", c->last_error);
            break;
        }
        sl->kids[sl->nkids++] = kid;
    }
    *ticket = id;
    return 0;
}

static int start_range(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                       uint64_t count, const float *grad, float *out, int view,
                       struct psc_mirror *mirror, uint64_t clock, uint64_t *ticket)
{
    if (table >= c->ntables)
        return psc__set_error(c, PS_ENOTABLE, "%s: no table handle %u", ps_op_name(op), table);
    const struct table_h *t = c->tables[table];
    if (t->sparse)
        return psc__set_error(c, PS_EINVAL, "%s: '%s' is sparse: use the _rows calls",
                              ps_op_name(op), t->name);
    if (count == 0 || offset >= t->size || count > t->size - offset)
        return psc__set_error(c, PS_ERANGE, "%s: [%llu, +%llu) is outside table '%s' of %llu",
                              ps_op_name(op), (unsigned long long)offset, (unsigned long long)count,
                              t->name, (unsigned long long)t->size);
    int reads = op == PS__OP__OP_PULL || op == PS__OP__OP_PUSH_PULL;
    if ((op != PS__OP__OP_PULL && grad == NULL) || (reads && out == NULL && !view))
        return psc__set_error(c, PS_EINVAL, "%s: NULL buffer", ps_op_name(op));
    if (view && c->dtype != PS__DTYPE__DTYPE_F32)
        return psc__set_error(c, PS_EINVAL, "pull view: the values must be f32 on the wire");
    uint64_t per = piece_elems(c, count, grad, out, view);
    if (per != 0)
        return start_pieces(c, op, table, offset, count, grad, out, mirror, clock, per, ticket);
    return range_ticket(c, op, table, offset, count, grad, out, view, 0, mirror, clock, ticket);
}

static int range_ticket(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                        uint64_t count, const float *grad, float *out, int view, int continues,
                        struct psc_mirror *mirror, uint64_t clock, uint64_t *ticket)
{
    uint64_t id = 0;
    struct slot *sl = psc__slot_alloc(c, op, &id);
    if (sl == NULL)
        return psc__set_error(c, PS_EBUSY, "%s: %u requests already outstanding", ps_op_name(op),
                              PS_CLIENT_TICKETS_MAX);
    if (view && sl->vmsg == NULL) {
        if ((sl->vmsg = malloc(c->nshards * sizeof *sl->vmsg)) == NULL) {
            psc__slot_release(c, sl);
            return psc__set_error(c, PS_ENOMEM, "pull view: no memory");
        }
        for (uint32_t s = 0; s < c->nshards; s++)
            zmq_msg_init(&sl->vmsg[s]);
    }
    sl->view = view;
    sl->table = table;
    sl->offset = offset;
    sl->count = count;
    sl->out = out;
    sl->kind = SUB_RANGE;
    sl->continues = continues;
    sl->mirror = mirror;
    sl->clock = clock;
    sl->src32 = grad; /* converted for the shards that take 16 bits (send.c) */
    return psc__send_all(c, sl, id, ticket);
}

int psc_pull(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count, float *out,
             uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PULL, table, offset, count, NULL, out, 0, NULL, clock, ticket);
}

int psc_push(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
             const float *grad, uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PUSH, table, offset, count, grad, NULL, 0, NULL, clock,
                       ticket);
}

int psc_push_pull(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                  const float *grad, float *out, uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PUSH_PULL, table, offset, count, grad, out, 0, NULL, clock,
                       ticket);
}

int psc_set(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
            const float *vals, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_SET, table, offset, count, vals, NULL, 0, NULL, 0, ticket);
}

int psc_pull_view(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                  uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PULL, table, offset, count, NULL, NULL, 1, NULL, clock,
                       ticket);
}

/* The held view of ticket, or NULL (error set). */
static struct slot *held_view(struct psc_client *c, uint64_t ticket)
{
    struct slot *sl = psc__slot_lookup(c, ticket);
    if (sl == NULL || !sl->view || !sl->held) {
        psc__set_error(c, PS_EINVAL, "ticket %llu is not a pull view that was waited for",
                       (unsigned long long)ticket);
        return NULL;
    }
    return sl;
}

int psc_view_part(struct psc_client *c, uint64_t ticket, uint32_t i, const float **vals,
                  uint64_t *offset, uint64_t *count)
{
    struct slot *sl = held_view(c, ticket);
    if (sl == NULL)
        return PS_EINVAL;
    for (uint32_t s = 0, k = 0; s < c->nshards; s++) {
        uint64_t a, b;
        if (!psc__range_part(c, sl, s, &a, &b) || k++ != i)
            continue;
        *vals = zmq_msg_data(&sl->vmsg[s]);
        *offset = a;
        *count = b - a;
        return 0;
    }
    return psc__set_error(c, PS_ERANGE, "pull view %llu has no part %u", (unsigned long long)ticket,
                          i);
}

int psc_view_release(struct psc_client *c, uint64_t ticket)
{
    struct slot *sl = held_view(c, ticket);
    if (sl == NULL)
        return PS_EINVAL;
    psc__slot_release(c, sl);
    return 0;
}

/* A mirror's segments, the sub-requests its pull sends (as start_range
 * cuts it: the shards' parts, or pieces of them), into seg (NULL: only
 * counted). Returns how many. */
static uint32_t mirror_segments(const struct psc_client *c, const struct table_h *t,
                                uint64_t offset, uint64_t count, const float *vals,
                                struct mirror_seg *seg)
{
    uint64_t end = offset + count, per = piece_elems(c, count, NULL, vals, 0);
    uint32_t n = 0;
    for (uint64_t a = offset, b; a < end; a = b, n++) {
        int shard_start;
        b = piece_end(c, t, a, end, per ? per : end - a, &shard_start);
        if (seg != NULL)
            seg[n] = (struct mirror_seg){.a = a, .b = b};
    }
    return n;
}

int psc_mirror_open(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                    float *vals, struct psc_mirror **out)
{
    *out = NULL;
    if (table >= c->ntables)
        return psc__set_error(c, PS_ENOTABLE, "mirror: no table handle %u", table);
    const struct table_h *t = c->tables[table];
    if (t->sparse)
        return psc__set_error(c, PS_EINVAL, "mirror: '%s' is sparse; mirrors take dense ranges",
                              t->name);
    if (count == 0 || offset >= t->size || count > t->size - offset)
        return psc__set_error(c, PS_ERANGE, "mirror: [%llu, +%llu) is outside table '%s' of %llu",
                              (unsigned long long)offset, (unsigned long long)count, t->name,
                              (unsigned long long)t->size);
    if (vals == NULL)
        return psc__set_error(c, PS_EINVAL, "mirror: NULL buffer");
    uint32_t n = mirror_segments(c, t, offset, count, vals, NULL);
    struct psc_mirror *m = calloc(1, sizeof *m + n * sizeof m->seg[0]);
    if (m == NULL)
        return psc__set_error(c, PS_ENOMEM, "mirror: no memory");
    m->table = table;
    m->offset = offset;
    m->count = count;
    m->vals = vals;
    m->nseg = mirror_segments(c, t, offset, count, vals, m->seg);
    m->next = c->mirrors;
    if (c->mirrors != NULL)
        c->mirrors->prev = m;
    c->mirrors = m;
    *out = m;
    return 0;
}

int psc_mirror_pull(struct psc_client *c, struct psc_mirror *m, uint64_t clock, uint64_t *ticket)
{
    if (m == NULL)
        return psc__set_error(c, PS_EINVAL, "mirror pull: NULL mirror");
    if (m->ticket != 0)
        return psc__set_error(c, PS_EBUSY,
                              "mirror pull: ticket %llu of this mirror is still outstanding: wait "
                              "for it or cancel it first",
                              (unsigned long long)m->ticket);
    int rc = start_range(c, PS__OP__OP_PULL, m->table, m->offset, m->count, NULL, m->vals, 0, m,
                         clock, ticket);
    if (rc == 0)
        m->ticket = *ticket;
    return rc;
}

void psc_mirror_reset(struct psc_mirror *m)
{
    for (uint32_t i = 0; m != NULL && i < m->nseg; i++)
        m->seg[i].version = 0;
}

void psc_mirror_counts(const struct psc_mirror *m, uint64_t *changed, uint64_t *whole)
{
    *changed = m != NULL ? m->changed : 0;
    *whole = m != NULL ? m->whole : 0;
}

static void mirror_free(struct psc_client *c, struct psc_mirror *m)
{
    if (m->prev != NULL)
        m->prev->next = m->next;
    else
        c->mirrors = m->next;
    if (m->next != NULL)
        m->next->prev = m->prev;
    free(m);
}

int psc_mirror_close(struct psc_client *c, struct psc_mirror *m)
{
    if (m == NULL)
        return 0;
    if (m->ticket != 0) {
        int rc = psc_cancel(c, m->ticket); /* a pull: nothing of the caller's is held */
        if (rc != 0)
            return rc;
    }
    mirror_free(c, m);
    return 0;
}
