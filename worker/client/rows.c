/* Keyed requests: rows of sparse tables grouped by shard, and keyed
 * pushes into dense tables. */
#include "client_impl.h"

#include "ps_err.h"
#include "ps_shard.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int psc_push_keys(struct psc_client *c, uint32_t table, const uint64_t *keys, const float *vals,
                  size_t n, uint64_t clock, uint64_t *ticket)
{
    if (table >= c->ntables)
        return psc__set_error(c, PS_ENOTABLE, "push: no table handle %u", table);
    const struct table_h *t = c->tables[table];
    if (t->sparse)
        return psc__set_error(c, PS_EINVAL, "push: '%s' is sparse: use psc_push_rows", t->name);
    if (n == 0 || keys == NULL || vals == NULL)
        return psc__set_error(c, PS_EINVAL, "push: no keys");
    size_t bad = ps_wire_keys_unordered(keys, n); /* increasing: only the last can be too big */
    if (bad == n && keys[n - 1] >= t->size)
        bad = n - 1;
    if (bad < n)
        return psc__set_error(c, PS_EINVAL,
                              "push: key[%zu]=%llu must be below %llu and above the one before",
                              bad, (unsigned long long)keys[bad], (unsigned long long)t->size);
    uint64_t id = 0;
    struct slot *sl = psc__slot_alloc(c, PS__OP__OP_PUSH, &id);
    if (sl == NULL)
        return psc__set_error(c, PS_EBUSY, "push: %u requests already outstanding",
                              PS_CLIENT_TICKETS_MAX);
    sl->table = table;
    sl->kind = SUB_KEYS;
    sl->clock = clock;
    sl->src32 = vals; /* converted for the shards that take 16 bits (send.c) */
    sl->keys = keys;
    sl->nkeys = n;
    return psc__send_all(c, sl, id, ticket);
}

/* Grows the slot's row buffers to n keys of dim floats. */
static int rows_reserve(struct psc_client *c, struct slot *sl, size_t n, size_t dim)
{
    if (sl->grp == NULL && (sl->grp = malloc(2 * (c->nshards + 1) * sizeof *sl->grp)) == NULL)
        return PS_ENOMEM;
    if (n > sl->rows_cap) {
        uint32_t *o = realloc(sl->order, n * sizeof *o);
        if (o != NULL)
            sl->order = o;
        uint64_t *k = realloc(sl->skeys, n * sizeof *k);
        if (k != NULL)
            sl->skeys = k;
        if (o == NULL || k == NULL)
            return PS_ENOMEM;
        sl->rows_cap = n;
    }
    if (n * dim > sl->vals_cap) {
        float *v = realloc(sl->svals, n * dim * sizeof *v);
        if (v == NULL)
            return PS_ENOMEM;
        sl->svals = v;
        sl->vals_cap = n * dim;
    }
    return 0;
}

/* Groups the slot's keys by owning shard, stably, with each grouped
 * row's place in the caller's order. With one shard the group is the
 * caller's order: the keys are copied at once (unless they go from the
 * region: psc__rows_keys) and a reply lands as it comes (order is not
 * filled). */
static void rows_group(struct psc_client *c, struct slot *sl)
{
    const uint64_t *keys = sl->keys;
    size_t n = sl->nkeys;
    if (c->nshards == 1) {
        sl->grp[0] = 0;
        sl->grp[1] = (uint32_t)n;
        if (psc__rows_keys(c, sl) != keys)
            memcpy(sl->skeys, keys, n * sizeof *keys);
        return;
    }
    uint32_t *cursor = sl->grp + c->nshards + 1;
    memset(sl->grp, 0, (c->nshards + 1) * sizeof *sl->grp);
    for (size_t i = 0; i < n; i++)
        sl->grp[ps_shard_of_key(keys[i], c->nshards) + 1]++;
    for (uint32_t s = 0; s < c->nshards; s++) {
        sl->grp[s + 1] += sl->grp[s];
        cursor[s] = sl->grp[s];
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = cursor[ps_shard_of_key(keys[i], c->nshards)]++;
        sl->order[pos] = (uint32_t)i;
        sl->skeys[pos] = keys[i];
    }
}

static int start_rows(struct psc_client *c, Ps__Op op, uint32_t table, const uint64_t *keys,
                      size_t n, const float *grads, float *out, uint64_t clock, uint64_t *ticket)
{
    if (table >= c->ntables || !c->tables[table]->sparse)
        return psc__set_error(c, PS_ENOTABLE, "%s: handle %u is not a sparse table", ps_op_name(op),
                              table);
    const struct table_h *t = c->tables[table];
    if (n == 0 || n > UINT32_MAX || keys == NULL)
        return psc__set_error(c, PS_EINVAL, "%s: need 1..%u keys", ps_op_name(op), UINT32_MAX);
    size_t bad = ps_wire_keys_unordered(keys, n);
    if (bad < n)
        return psc__set_error(c, PS_EINVAL, "%s: key[%zu]=%llu is not above key[%zu]",
                              ps_op_name(op), bad, (unsigned long long)keys[bad], bad - 1);
    uint64_t id = 0;
    struct slot *sl = psc__slot_alloc(c, op, &id);
    if (sl == NULL)
        return psc__set_error(c, PS_EBUSY, "%s: too many requests outstanding", ps_op_name(op));
    size_t d = t->dim;
    const unsigned char *src = NULL;
    int grouped = c->nshards > 1;
    if (rows_reserve(c, sl, n, grads && grouped ? d : 0) != 0) {
        psc__slot_release(c, sl);
        return psc__set_error(c, PS_ENOMEM, "%s: out of memory for %zu rows", ps_op_name(op), n);
    }
    sl->keys = keys; /* read in place only where they lie in the region */
    sl->nkeys = n;
    rows_group(c, sl);
    /* keys all on one shard are in the caller's order: the gradients go
     * from grads (buffer rules), else from their grouped copy */
    int whole = !grouped;
    for (uint32_t s = 0; s < c->nshards && !whole; s++)
        whole = sl->grp[s + 1] - sl->grp[s] == n;
    for (size_t pos = 0; grads != NULL && !whole && pos < n; pos++)
        memcpy(sl->svals + pos * d, grads + (size_t)sl->order[pos] * d, d * sizeof(float));
    if (grads && (src = psc__wire_values(c, sl, whole ? grads : sl->svals, n * d)) == NULL) {
        psc__slot_release(c, sl);
        return psc__set_error(c, PS_ENOMEM, "%s: out of memory for %zu rows", ps_op_name(op), n);
    }
    sl->rows = 1;
    sl->table = table;
    sl->out = out;
    sl->offset = 0; /* out holds row 0 on (psc__shm_out_at) */
    sl->kind = SUB_ROWS;
    sl->clock = clock;
    sl->src = src;
    return psc__send_all(c, sl, id, ticket);
}

int psc_pull_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n, float *out,
                  uint64_t clock, uint64_t *ticket)
{
    if (out == NULL)
        return psc__set_error(c, PS_EINVAL, "pull: NULL output");
    return start_rows(c, PS__OP__OP_PULL, table, keys, n, NULL, out, clock, ticket);
}

int psc_push_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                  const float *grads, uint64_t clock, uint64_t *ticket)
{
    if (grads == NULL)
        return psc__set_error(c, PS_EINVAL, "push: NULL gradients");
    return start_rows(c, PS__OP__OP_PUSH, table, keys, n, grads, NULL, clock, ticket);
}

int psc_push_pull_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                       const float *grads, float *out, uint64_t clock, uint64_t *ticket)
{
    if (grads == NULL || out == NULL)
        return psc__set_error(c, PS_EINVAL, "push_pull: NULL buffer");
    return start_rows(c, PS__OP__OP_PUSH_PULL, table, keys, n, grads, out, clock, ticket);
}
