/* The tables a shard holds: creating one (or finding the one a name
 * already has), the bytes it needs, and dropping them all. */
#include "psd_impl.h"

#include "ps_err.h"
#include "ps_pool.h"
#include "ps_shard.h"
#include "psk_optim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void psd_reset_tables(struct psd *s)
{
    for (uint32_t i = 0; i < s->ntables; i++) {
        psd_cons_table_fini(&s->cons, s->tables[i]);
        psd_table_destroy(s->tables[i]);
    }
    s->ntables = 0;
    memset(s->peers, 0, sizeof s->peers);
}

void psd_reset_state(struct psd *s)
{
    psd_reset_tables(s);
    memset(s->live, 0, s->cons.workers * sizeof *s->live);
    s->nwaits = 0; /* their connections are another process's */
    s->changes++;
}

int psd_table_new(struct psd *s, const Ps__TableSpec *spec, struct psd_table **out)
{
    struct psd_table *t = NULL;
    int rc = psd_table_create(spec, s->ntables, s->shard, s->shards, &t);
    if (rc != 0)
        return rc;
    t->pool = s->pool;
    if ((rc = psd_cons_table_init(&s->cons, t)) != 0) {
        psd_cons_table_fini(&s->cons, t);
        psd_table_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

uint64_t psd_table_bytes_needed(const struct psd *s, const Ps__TableSpec *spec)
{
    uint64_t lo = 0, hi = 0;
    if (!spec->sparse)
        ps_shard_range(spec->size, s->shards, s->shard, &lo, &hi);
    uint64_t elems = spec->sparse ? spec->rows_max * spec->dim : hi - lo;
    return elems * 4u * (1u + (uint64_t)psk_optim_state_arrays((int)spec->optimizer));
}

static struct psd_table *find_by_name(struct psd *s, const char *name)
{
    for (uint32_t i = 0; i < s->ntables; i++)
        if (strcmp(s->tables[i]->name, name) == 0)
            return s->tables[i];
    return NULL;
}

void psd_op_create(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    const Ps__TableSpec *spec = req->spec;
    struct psd_table *t = find_by_name(s, spec->name);
    if (t != NULL && !psd_table_same_spec(t, spec)) {
        psd_reply_errorf(
            s, req, PS_EEXIST, rep, "table '%s' exists with another spec (size %llu, %s, lr %g)",
            t->name, (unsigned long long)t->size, psd_optimizer_name(t->optimizer), (double)t->lr);
        return;
    }
    if (t == NULL) {
        uint64_t bytes = psd_table_bytes_needed(s, spec);
        if (bytes > s->table_bytes_max) {
            psd_reply_errorf(
                s, req, PS_ELIMIT, rep,
                "table '%s' would take %llu bytes on this shard, over the limit of %llu "
                "(psd --max-table-bytes)",
                spec->name, (unsigned long long)bytes, (unsigned long long)s->table_bytes_max);
            return;
        }
        if (s->ntables >= PS_TABLES_MAX) {
            psd_reply_errorf(s, req, PS_ELIMIT, rep, "table limit of %u reached", PS_TABLES_MAX);
            return;
        }
        int rc = psd_table_new(s, spec, &t);
        if (rc != 0) {
            psd_reply_errorf(s, req, rc, rep, "cannot allocate table '%s' of %llu elements",
                             spec->name, (unsigned long long)spec->size);
            return;
        }
        for (size_t i = 0; i < s->nprunes && rc == 0; i++) {
            if (strcmp(s->prunes[i].table, t->name) != 0)
                continue;
            if (psd_table_enable_prune(t, &s->prunes[i]) != 0) {
                psd_cons_table_fini(&s->cons, t);
                psd_table_destroy(t);
                psd_reply_errorf(s, req, PS_ENOMEM, rep, "cannot allocate the prune mask of '%s'",
                                 spec->name);
                return;
            }
            PS_LOG(s->log, PS_LOG_INFO, S0311,
                   "pruning '%s' to %.4f sparsity between steps %llu and %llu, every %llu", t->name,
                   s->prunes[i].target, (unsigned long long)s->prunes[i].start,
                   (unsigned long long)s->prunes[i].end, (unsigned long long)s->prunes[i].every);
        }
        s->tables[s->ntables++] = t;
        s->changes++;
        PS_LOG(s->log, PS_LOG_INFO, S0310,
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
