/* The synchronous calls: tables (create, open, spec defaults), stats,
 * checkpoints and the rows listing. */
#include "client_impl.h"

#include "ps_err.h"
#include "ps_shard.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Sends h to shards [s0, s1] and waits for all. */
int psc__call_sync(struct psc_client *c, Ps__Header *h, uint32_t s0, uint32_t s1, void *ctx,
                   int timeout_ms)
{
    uint64_t id = 0;
    struct slot *sl = psc__slot_alloc(c, h->op, &id);
    if (sl == NULL)
        return psc__set_error(c, PS_EBUSY, "%s: too many requests outstanding", ps_op_name(h->op));
    sl->ctx = ctx;
    h->request_id = id;
    h->worker_id = c->worker_id;
    for (uint32_t s = s0; s <= s1; s++)
        if (psc__send_frames(c, s, h, NULL, 0, NULL, 0, sl, 0) != 0)
            break;
    int rc = psc_wait(c, id, timeout_ms);
    if (rc == PS_ETIMEDOUT)
        psc_cancel(c, id); /* no zero-copy frames: always releases */
    return rc;
}

void psc_table_spec_init_sized(struct psc_table_spec *caller, size_t struct_size, const char *name,
                               uint64_t size)
{
    struct psc_table_spec s;
    memset(&s, 0, sizeof s);
    s.struct_size = struct_size;
    s.name = name;
    s.size = size;
    s.optimizer = PSC_SGD;
    s.lr = 0.01f;
    s.momentum = 0.9f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.init = PSC_INIT_ZEROS;
    /* a caller's struct smaller than the first version's (a wrong size)
     * gets the fields it has room for: psc_table_create then names it */
    size_t n = struct_size < sizeof s ? struct_size : sizeof s;
    if (n >= sizeof s.struct_size) {
        memcpy(caller, &s, n);
        if (struct_size > sizeof s)
            memset((char *)caller + sizeof s, 0, struct_size - sizeof s);
    }
}

int psc_table_create(struct psc_client *c, const struct psc_table_spec *caller, int timeout_ms,
                     uint32_t *table)
{
    struct psc_table_spec own;
    char why[PS_ERROR_TEXT_MAX];
    if (psc__sized_in(&own, sizeof own, PSC__TABLE_SPEC_V1, caller, "psc_table_spec", why,
                      sizeof why) != 0)
        return psc__set_error(c, PS_EINVAL, "create_table: %s", why);
    const struct psc_table_spec *spec = &own;
    Ps__TableSpec ts;
    ps__table_spec__init(&ts);
    ts.name = (char *)(spec->name ? spec->name : "");
    ts.size = spec->size;
    ts.optimizer = (Ps__OptimizerKind)spec->optimizer;
    ts.lr = spec->lr;
    ts.weight_decay = spec->weight_decay;
    ts.momentum = spec->momentum;
    ts.nesterov = spec->nesterov != 0;
    ts.beta1 = spec->beta1;
    ts.beta2 = spec->beta2;
    ts.eps = spec->eps;
    ts.init = (Ps__InitKind)spec->init;
    ts.init_scale = spec->init_scale;
    ts.seed = spec->seed;
    ts.lr_schedule = (Ps__LrSchedule)spec->lr_schedule;
    ts.lr_decay_steps = spec->lr_decay_steps;
    ts.sparse = spec->sparse != 0;
    ts.dim = spec->sparse ? spec->dim : 0;
    ts.rows_max = spec->rows_max;
    ts.l1 = spec->l1;
    ts.l2 = spec->l2;
    ts.await_set = spec->await_set != 0;
    ts.n_shape = spec->shape != NULL ? spec->ndims : 0;
    ts.shape = (uint64_t *)spec->shape;
    ts.n_pushers = spec->pushers != NULL ? spec->npushers : 0;
    ts.pushers = (uint32_t *)spec->pushers;
    ts.admit_after = spec->admit_after;
    ts.admit_counters = spec->admit_counters;
    ts.evict_after = spec->evict_after;
    ts.evict_at_budget = spec->evict_at_budget != 0;
    ts.evict_after_s = spec->evict_after_s;
    ts.evict_half_life = spec->evict_half_life;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_check_spec(&ts, err, sizeof err);
    if (rc != 0)
        return psc__set_error(c, rc, "create_table: %s", err);
    int64_t existing = -1; /* created before: the servers still check the spec */
    for (uint32_t i = 0; i < c->ntables && existing < 0; i++)
        if (strcmp(c->tables[i]->name, ts.name) == 0)
            existing = i;
    if (existing < 0 && c->ntables >= PS_CLIENT_TABLES_MAX)
        return psc__set_error(c, PS_ELIMIT, "create_table: %u tables already", c->ntables);
    struct table_h *t = calloc(1, sizeof *t + c->nshards * sizeof t->ids[0]);
    if (t == NULL)
        return psc__set_error(c, PS_ENOMEM, "create_table: out of memory");
    snprintf(t->name, sizeof t->name, "%s", ts.name);
    t->size = ts.size;
    t->sparse = ts.sparse;
    t->dim = ts.dim;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &ts;
    rc = psc__call_sync(c, &h, 0, c->nshards - 1, t, timeout_ms);
    if (rc != 0 || existing >= 0) {
        free(t);
        if (rc == 0)
            *table = (uint32_t)existing;
        return rc;
    }
    c->tables[c->ntables] = t;
    *table = c->ntables++;
    return 0;
}

int psc_stats_tables(struct psc_client *c, uint32_t shard, int timeout_ms,
                     struct psc_shard_stats *out, struct psc_table_stats *list, uint32_t cap)
{
    if (shard >= c->nshards)
        return psc__set_error(c, PS_EINVAL, "stats: shard %u of %u", shard, c->nshards);
    char why[PS_ERROR_TEXT_MAX];
    if (psc__sized_check_out(out, sizeof *out, PSC__SHARD_STATS_V1, "psc_shard_stats", why,
                             sizeof why) != 0 ||
        (list != NULL && cap > 0 &&
         psc__sized_check_out(list, sizeof *list, PSC__TABLE_STATS_V1, "psc_table_stats", why,
                              sizeof why) != 0))
        return psc__set_error(c, PS_EINVAL, "stats: %s", why);
    if (list == NULL)
        cap = 0;
    if (cap > PS_TABLES_MAX)
        cap = PS_TABLES_MAX; /* a shard holds no more */
    struct psc_shard_stats st = {0};
    struct psc_table_stats *own = NULL;
    if (cap > 0 && (own = calloc(cap, sizeof *own)) == NULL)
        return psc__set_error(c, PS_ENOMEM, "stats: out of memory");
    struct stats_out so = {&st, own, cap};
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_STATS);
    int rc = psc__call_sync(c, &h, shard, shard, &so, timeout_ms);
    psc__sized_out(out, &st, sizeof st);
    size_t stride = cap > 0 ? psc__sized_size(list) : 0;
    for (uint32_t i = 0; i < cap; i++) {
        struct psc_table_stats *dst = (void *)((char *)list + i * stride);
        memcpy(dst, &stride, sizeof stride); /* each element says its size */
        psc__sized_out(dst, &own[i], sizeof own[i]);
    }
    free(own);
    return rc;
}

int psc_stats(struct psc_client *c, uint32_t shard, int timeout_ms, struct psc_shard_stats *out)
{
    return psc_stats_tables(c, shard, timeout_ms, out, NULL, 0);
}

/* A request of op to one shard whose reply says what it did in detail
 * (or the error, when it did not: recover). */
static int detail_call(struct psc_client *c, Ps__Op op, uint32_t shard, int timeout_ms,
                       char *detail, size_t len, int error_too)
{
    if (shard >= c->nshards)
        return psc__set_error(c, PS_EINVAL, "%s: shard %u of %u", ps_op_name(op), shard,
                              c->nshards);
    char buf[PS_ERROR_TEXT_MAX] = "";
    Ps__Header h;
    ps_wire_header_init(&h, op);
    int rc = psc__call_sync(c, &h, shard, shard, buf, timeout_ms);
    if (detail != NULL && len > 0)
        snprintf(detail, len, "%s", rc != 0 && error_too ? psc_last_error(c) : buf);
    return rc;
}

int psc_checkpoint(struct psc_client *c, uint32_t shard, int timeout_ms, char *detail, size_t len)
{
    return detail_call(c, PS__OP__OP_CHECKPOINT, shard, timeout_ms, detail, len, 0);
}

int psc_recover(struct psc_client *c, uint32_t shard, int timeout_ms, char *detail, size_t len)
{
    return detail_call(c, PS__OP__OP_RECOVER, shard, timeout_ms, detail, len, 1);
}

/* A page of rows (psc_rows, psc_rows_delta): checks the call, asks, and
 * fills ro. */
static int rows_page(struct psc_client *c, uint32_t table, uint32_t shard, int what, uint64_t since,
                     uint64_t offset, uint32_t max, struct rows_out *ro, int timeout_ms)
{
    if (table >= c->ntables)
        return psc__set_error(c, PS_ENOTABLE, "rows: no table handle %u", table);
    const struct table_h *t = c->tables[table];
    if (!t->sparse)
        return psc__set_error(c, PS_ENOTABLE, "rows: '%s' is not a sparse table", t->name);
    if (shard >= c->nshards)
        return psc__set_error(c, PS_EINVAL, "rows: shard %u of %u", shard, c->nshards);
    if (max == 0 || max > PS_ROWS_PAGE_MAX)
        return psc__set_error(c, PS_EINVAL, "rows: page of %u rows, expected 1..%u", max,
                              PS_ROWS_PAGE_MAX);
    if (what != PSC_ROWS_ALL && what != PSC_ROWS_CHANGED && what != PSC_ROWS_EVICTED)
        return psc__set_error(c, PS_EINVAL,
                              "rows: what %d is not PSC_ROWS_ALL, _CHANGED or _EVICTED", what);
    ro->offset = offset;
    ro->max = max;
    ro->dim = what == PSC_ROWS_EVICTED ? 1 : t->dim;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_ROWS);
    h.table_id = t->ids[shard];
    h.offset = offset;
    h.count = max;
    h.changed = what == PSC_ROWS_CHANGED;
    h.tombstones = what == PSC_ROWS_EVICTED;
    h.since = what == PSC_ROWS_ALL ? 0 : since;
    return psc__call_sync(c, &h, shard, shard, ro, timeout_ms);
}

int psc_rows(struct psc_client *c, uint32_t table, uint32_t shard, uint64_t offset, uint32_t max,
             uint64_t *keys, float *vals, uint64_t *got, uint64_t *total, int timeout_ms)
{
    struct rows_out ro = {.keys = keys, .vals = vals};
    int rc = rows_page(c, table, shard, PSC_ROWS_ALL, 0, offset, max, &ro, timeout_ms);
    *got = ro.got;
    *total = ro.total;
    return rc;
}

int psc_rows_delta(struct psc_client *c, uint32_t table, uint32_t shard, int what, uint64_t since,
                   uint64_t offset, uint32_t max, uint64_t *keys, float *vals, uint64_t *got,
                   uint64_t *next, uint64_t *tick, int timeout_ms)
{
    struct rows_out ro = {.keys = keys, .vals = vals, .delta = 1};
    int rc = rows_page(c, table, shard, what, since, offset, max, &ro, timeout_ms);
    *got = ro.got;
    *next = ro.next;
    *tick = ro.tick;
    return rc;
}

int psc_table_open(struct psc_client *c, const char *name, int timeout_ms, uint32_t *table)
{
    for (uint32_t i = 0; i < c->ntables; i++) {
        if (strcmp(c->tables[i]->name, name) == 0) {
            *table = i;
            return 0;
        }
    }
    if (c->ntables >= PS_CLIENT_TABLES_MAX)
        return psc__set_error(c, PS_ELIMIT, "open: %u tables already", c->ntables);
    struct table_h *t = calloc(1, sizeof *t + c->nshards * sizeof t->ids[0]);
    struct psc_table_stats *list = calloc(PS_TABLES_MAX, sizeof *list);
    int rc = t && list ? 0 : psc__set_error(c, PS_ENOMEM, "open: out of memory");
    if (list != NULL)
        list[0].struct_size = sizeof *list;
    for (uint32_t s = 0; s < c->nshards && rc == 0; s++) {
        struct psc_shard_stats st = {.struct_size = sizeof st};
        if ((rc = psc_stats_tables(c, s, timeout_ms, &st, list, PS_TABLES_MAX)) != 0)
            break;
        uint32_t i = 0;
        while (i < st.tables && i < PS_TABLES_MAX && strcmp(list[i].name, name) != 0)
            i++;
        if (i == st.tables || i == PS_TABLES_MAX) {
            rc = psc__set_error(c, PS_ENOTABLE, "open: shard %u (%s) has no table '%s'", s,
                                c->endpoints[s], name);
            break;
        }
        uint64_t lo, hi;
        ps_shard_range(list[i].size, c->nshards, s, &lo, &hi);
        if (!list[i].sparse && (list[i].lo != lo || list[i].hi != hi)) {
            rc = psc__set_error(c, PS_ESTATE,
                                "open: shard %u holds [%llu, %llu) of '%s', expected "
                                "[%llu, %llu)",
                                s, (unsigned long long)list[i].lo, (unsigned long long)list[i].hi,
                                name, (unsigned long long)lo, (unsigned long long)hi);
            break;
        }
        snprintf(t->name, sizeof t->name, "%s", name);
        t->size = list[i].size;
        t->sparse = list[i].sparse;
        t->dim = list[i].dim;
        t->ids[s] = list[i].id;
    }
    free(list);
    if (rc != 0) {
        free(t);
        return rc;
    }
    c->tables[c->ntables] = t;
    *table = c->ntables++;
    return 0;
}
