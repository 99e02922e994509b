/* The admin ops: stats (psctl status, /metrics) and the rows listing. */
#include "psd_impl.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void psd_op_stats(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    static const size_t cap = PS_TABLES_MAX;
    Ps__TableStats *ts = calloc(cap, sizeof *ts);
    Ps__TableStats **tp = calloc(cap, sizeof *tp);
    if (ts == NULL || tp == NULL) {
        free(ts);
        free(tp);
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "stats: out of memory");
        return;
    }
    uint64_t bytes_held = 0;
    for (uint32_t i = 0; i < s->ntables; i++) {
        const struct psd_table *t = s->tables[i];
        ps__table_stats__init(&ts[i]);
        ts[i].name = (char *)t->name;
        ts[i].id = t->id;
        ts[i].size = t->size;
        ts[i].lo = t->lo;
        ts[i].hi = t->hi;
        ts[i].pushes = t->pushes;
        ts[i].pulls = t->pulls;
        ts[i].updates = t->steps;
        ts[i].clock = psd_cons_clock(&s->cons, t);
        ts[i].sparsity = psd_table_zero_share(s->tables[i], (uint64_t)ps_mono_ms());
        ts[i].prune_target = t->prune_target_now;
        ts[i].rows = t->sparse ? t->sp.nrows : 0;
        ts[i].rounds_lost = t->rounds_lost;
        ts[i].sparse = t->sparse != 0;
        ts[i].dim = t->dim;
        ts[i].rows_max = t->rows_max;
        ts[i].optimizer = (char *)psd_optimizer_name(t->optimizer);
        ts[i].n_shape = t->ndims;
        ts[i].shape = (uint64_t *)t->shape;
        bytes_held += psd_table_bytes_held(t);
        tp[i] = &ts[i];
    }
    Ps__Stats st;
    ps__stats__init(&st);
    st.shard = s->shard;
    st.shards = s->shards;
    st.requests = s->ctr.requests;
    st.errors = s->ctr.errors;
    st.bytes_in = s->ctr.bytes_in;
    st.bytes_out = s->ctr.bytes_out;
    st.uptime_s = (double)((uint64_t)ps_mono_ns() - s->start_ns) / 1e9;
    st.n_tables = s->ntables;
    st.tables = tp;
    char mode[32];
    psd_cons_name(&s->cons, mode, sizeof mode);
    st.consistency = mode;
    st.workers = s->cons.workers;
    st.waiting = s->nwaits;
    st.deferred_total = s->deferred_total;
    st.max_staleness = s->max_staleness;
    st.wait_timeouts = s->wait_timeouts;
    st.duplicates_dropped = s->duplicates_dropped;
    st.live_workers = psd_live_count(s);
    st.workers_dropped = s->workers_dropped;
    st.workers_rejoined = s->workers_rejoined;
    st.stale_pushes = s->stale_pushes;
    st.worker_timeout_ms = s->worker_timeout_ms;
    st.checkpoints_written = s->ckpt_written;
    st.checkpoint_age_s = psd_checkpoint_age_s(s);
    st.bytes_held = bytes_held;
    st.shm_regions = psd_shm_bound(&s->shm);
    st.unread_refused = s->unread_refused;
    st.waits_refused = s->waits_refused;
    st.nonfinite_refused = s->nonfinite_refused;
    st.hellos_refused = s->hellos_refused;
    st.unread_bytes = psd_unread_total(s);
    uint32_t *missing = calloc(s->cons.workers, sizeof *missing);
    for (uint32_t w = 0; missing != NULL && w < s->cons.workers; w++)
        if (!s->live[w].live)
            missing[st.n_missing_workers++] = w;
    st.missing_workers = missing;
    uint64_t *wc = calloc(s->cons.workers, sizeof *wc);
    if (wc != NULL) {
        for (uint32_t w = 0; w < s->cons.workers; w++)
            wc[w] = psd_worker_clock(s, w);
        st.n_worker_clocks = s->cons.workers;
        st.worker_clocks = wc;
    }
    st.role = "solo";
    if (s->on_stats != NULL)
        s->on_stats(s->hook_ctx, &st);
    Ps__Header h;
    psd_reply_init(&h, req);
    h.stats = &st;
    psd_reply_header(s, &h, rep);
    free(ts);
    free(tp);
    free(wc);
    free(missing);
}

/* A page of a sparse table's rows, in the shard's order (rows are only
 * ever added, at the end, so pages of a live table do not shift): keys,
 * then their f32 weights. */
void psd_op_list_rows(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    if (req->table_id >= s->ntables) {
        psd_reply_errorf(s, req, PS_ENOTABLE, rep, "rows: no table with id %u (this shard has %u)",
                         req->table_id, s->ntables);
        return;
    }
    const struct psd_table *t = s->tables[req->table_id];
    const struct psd_sparse *sp = &t->sp;
    if (!t->sparse) {
        psd_reply_errorf(s, req, PS_EINVAL, rep, "rows: table '%s' is dense: pull its range",
                         t->name);
        return;
    }
    if (req->offset > sp->nrows) {
        psd_reply_errorf(s, req, PS_ERANGE, rep, "rows: offset %llu past the %llu rows of '%s'",
                         (unsigned long long)req->offset, (unsigned long long)sp->nrows, t->name);
        return;
    }
    uint64_t n = sp->nrows - req->offset, wide = PS_ROWS_PAGE_BYTES / (t->dim * 4u);
    if (n > req->count)
        n = req->count;
    if (n > wide)
        n = wide;
    rep->mask = malloc(n ? n * 8u : 1);
    rep->vals = malloc(n ? n * t->dim * 4u : 1);
    if (rep->mask == NULL || rep->vals == NULL) {
        psd_reply_drop(rep);
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "rows: out of memory for %llu rows",
                         (unsigned long long)n);
        return;
    }
    rep->mask_bytes = n * 8u;
    rep->vals_bytes = n * t->dim * 4u;
    unsigned char *k = rep->mask;
    for (uint64_t i = 0; i < n; i++) { /* little-endian on the wire */
        uint64_t le = htole64(sp->row_key[req->offset + i]);
        memcpy(k + i * 8u, &le, 8);
    }
    if (n > 0) /* a table with no rows yet has no row storage (w is NULL) */
        memcpy(rep->vals, sp->w + req->offset * t->dim, rep->vals_bytes);
    Ps__Header h;
    psd_reply_init(&h, req);
    h.offset = req->offset;
    h.count = n;
    h.dim = t->dim;
    h.dtype = PS__DTYPE__DTYPE_F32;
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.rows = sp->nrows;
    psd_reply_header(s, &h, rep);
}
