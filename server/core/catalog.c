/* The tables a shard holds (catalog.h). */
#include "catalog.h"

#include "counters.h"
#include "hooks.h"
#include "reply.h"

#include "ps_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct psd_catalog {
    struct psd_table *tables[PS_TABLES_MAX];
    uint32_t n;
};

struct psd_catalog *psd_catalog_create(void)
{
    return calloc(1, sizeof(struct psd_catalog));
}

void psd_catalog_destroy(struct psd_catalog *c)
{
    free(c);
}

uint32_t psd_ntables(const struct psd *s)
{
    return s->cat->n;
}

struct psd_table *psd_table_at(const struct psd *s, uint32_t id)
{
    return id < s->cat->n ? s->cat->tables[id] : NULL;
}

struct psd_table *psd_table_named(const struct psd *s, const char *name)
{
    for (uint32_t i = 0; i < s->cat->n; i++)
        if (strcmp(s->cat->tables[i]->name, name) == 0)
            return s->cat->tables[i];
    return NULL;
}

int psd_tables_add(struct psd *s, struct psd_table *t)
{
    if (s->cat->n >= PS_TABLES_MAX)
        return PS_ELIMIT;
    s->cat->tables[s->cat->n++] = t;
    psd_count_change(s);
    return 0;
}

void psd_table_drop(struct psd *s, struct psd_table *t)
{
    psd_cons_table_fini(&s->conf.cons, t);
    psd_table_destroy(t);
}

void psd_tables_reset(struct psd *s)
{
    for (uint32_t i = 0; i < s->cat->n; i++)
        psd_table_drop(s, s->cat->tables[i]);
    s->cat->n = 0;
}

int psd_table_new(struct psd *s, const Ps__TableSpec *spec, struct psd_table **out)
{
    struct psd_table *t = NULL;
    int rc = psd_table_create(spec, s->cat->n, s->conf.shard, s->conf.shards, &t);
    if (rc != 0)
        return rc;
    t->pool = s->conf.pool;
    if ((rc = psd_cons_table_init(&s->conf.cons, t)) != 0) {
        psd_table_drop(s, t);
        return rc;
    }
    *out = t;
    return 0;
}

uint64_t psd_table_bytes_needed(const struct psd *s, const Ps__TableSpec *spec)
{
    return psd_table_bytes_for(spec, s->conf.shard, s->conf.shards);
}

uint64_t psd_worker_clock(const struct psd *s, uint32_t w)
{
    const struct psd_catalog *c = s->cat;
    uint64_t clock = c->n ? UINT64_MAX : 0;
    for (uint32_t i = 0; i < c->n; i++)
        if (c->tables[i]->completed[w] < clock)
            clock = c->tables[i]->completed[w];
    return clock;
}

int psd_quiescent(const struct psd *s)
{
    if (s->conf.cons.mode != PSD_BSP)
        return 1;
    for (uint32_t i = 0; i < s->cat->n; i++) {
        const struct psd_table *t = s->cat->tables[i];
        if (t->sparse)
            continue;
        if (t->watermark != t->lo)
            return 0;
        for (uint32_t w = 0; w < s->conf.cons.workers; w++)
            if (t->next[w] != t->lo)
                return 0;
    }
    return 1;
}

uint64_t psd_tables_version(const struct psd *s)
{
    uint64_t v = 0;
    for (uint32_t i = 0; i < s->cat->n; i++)
        v += s->cat->tables[i]->steps + s->cat->tables[i]->clock;
    return v;
}

void psd_op_create(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    const Ps__TableSpec *spec = req->spec;
    struct psd_table *t = psd_table_named(s, spec->name);
    if (t != NULL && !psd_table_same_spec(t, spec)) {
        psd_reply_errorf(
            s, req, PS_EEXIST, rep, "table '%s' exists with another spec (size %llu, %s, lr %g)",
            t->name, (unsigned long long)t->size, psd_optimizer_name(t->optimizer), (double)t->lr);
        return;
    }
    char why[PS_ERROR_TEXT_MAX];
    if (t == NULL && psd_cons_check_pushers(&s->conf.cons, spec, why, sizeof why) != 0) {
        psd_reply_error(s, req, PS_EINVAL, why, rep);
        return;
    }
    if (t == NULL) {
        uint64_t bytes = psd_table_bytes_needed(s, spec);
        if (bytes > s->conf.table_bytes_max) {
            psd_reply_errorf(
                s, req, PS_ELIMIT, rep,
                "table '%s' would take %llu bytes on this shard, over the limit of %llu "
                "(psd --max-table-bytes)",
                spec->name, (unsigned long long)bytes, (unsigned long long)s->conf.table_bytes_max);
            return;
        }
        if (s->cat->n >= PS_TABLES_MAX) {
            psd_reply_errorf(s, req, PS_ELIMIT, rep, "table limit of %u reached", PS_TABLES_MAX);
            return;
        }
        int rc = psd_table_new(s, spec, &t);
        if (rc != 0) {
            psd_reply_errorf(s, req, rc, rep, "cannot allocate table '%s' of %llu elements",
                             spec->name, (unsigned long long)spec->size);
            return;
        }
        for (size_t i = 0; i < s->conf.nprunes && rc == 0; i++) {
            const struct psd_prune_spec *ps = &s->conf.prunes[i];
            if (strcmp(ps->table, t->name) != 0)
                continue;
            if (psd_table_enable_prune(t, ps) != 0) {
                psd_table_drop(s, t);
                psd_reply_errorf(s, req, PS_ENOMEM, rep, "cannot allocate the prune mask of '%s'",
                                 spec->name);
                return;
            }
            PS_LOG(s->conf.log, PS_LOG_INFO, S0311,
                   "pruning '%s' to %.4f sparsity between steps %llu and %llu, every %llu", t->name,
                   ps->target, (unsigned long long)ps->start, (unsigned long long)ps->end,
                   (unsigned long long)ps->every);
        }
        psd_tables_add(s, t); /* room was checked above */
        PS_LOG(s->conf.log, PS_LOG_INFO, S0310,
               "created table '%s' id %u: %llu elements, this shard [%llu, %llu), %s lr %g",
               t->name, t->id, (unsigned long long)t->size, (unsigned long long)t->lo,
               (unsigned long long)t->hi, psd_optimizer_name(t->optimizer), (double)t->lr);
    }
    Ps__Header h;
    psd_reply_init(&h, req);
    h.table_id = t->id;
    h.offset = t->lo;
    h.count = t->hi - t->lo;
    psd_reply_header(s, &h, rep);
}

void psd_age_clock(struct psd *s, uint64_t now)
{
    for (uint32_t id = 0; id < psd_ntables(s); id++) {
        struct psd_table *t = psd_table_at(s, id);
        if (!t->sparse || t->sp.evict_after_s == 0)
            continue;
        uint64_t floor = psd_sparse_age_clock(&t->sp, now);
        if (floor != 0 && psd_hooks_floor(s, id, floor))
            (void)psd_sparse_set_floor(&t->sp, floor); /* above the floor, within the tick */
    }
}

int psd_set_age_floor(struct psd *s, uint32_t id, uint64_t floor)
{
    struct psd_table *t = psd_table_at(s, id);
    if (t == NULL || !t->sparse)
        return PS_ENOTABLE;
    return psd_sparse_set_floor(&t->sp, floor);
}
