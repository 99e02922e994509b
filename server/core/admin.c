/* The admin ops (admin.h). */
#include "admin.h"

#include "catalog.h"
#include "checkpoint.h"
#include "counters.h"
#include "dedup.h"
#include "hooks.h"
#include "live.h"
#include "ops.h"
#include "regions.h"
#include "reply.h"
#include "waits.h"

#include "ps_clock.h"
#include "ps_err.h"

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
    const struct psd_cons *c = &s->conf.cons;
    uint32_t ntables = psd_ntables(s);
    for (uint32_t i = 0; i < ntables; i++) {
        struct psd_table *t = psd_table_at(s, i);
        ps__table_stats__init(&ts[i]);
        ts[i].name = (char *)t->name;
        ts[i].id = t->id;
        ts[i].size = t->size;
        ts[i].lo = t->lo;
        ts[i].hi = t->hi;
        ts[i].pushes = t->pushes;
        ts[i].pulls = t->pulls;
        ts[i].updates = t->steps;
        ts[i].clock = psd_cons_clock(c, t);
        ts[i].sparsity = psd_table_zero_share(t, (uint64_t)ps_mono_ms());
        ts[i].prune_target = t->prune_target_now;
        ts[i].rows = t->sparse ? t->sp.nrows : 0;
        ts[i].rounds_lost = t->rounds_lost;
        ts[i].sparse = t->sparse != 0;
        ts[i].dim = t->dim;
        ts[i].rows_max = t->rows_max;
        ts[i].optimizer = (char *)psd_optimizer_name(t->optimizer);
        ts[i].n_shape = t->ndims;
        ts[i].shape = (uint64_t *)t->shape;
        ts[i].admitted = t->sparse ? t->sp.admitted : 0;
        ts[i].held_back = t->sp.held_back;
        ts[i].evicted_age = t->sp.evicted_age;
        ts[i].evicted_budget = t->sp.evicted_budget;
        ts[i].refused = t->sp.refused;
        ts[i].bytes = psd_table_bytes_held(t);
        bytes_held += ts[i].bytes;
        tp[i] = &ts[i];
    }
    const struct psd_counts *n = psd_counts(s);
    struct psd_waits_stats ws = psd_waits_stats(s);
    struct psd_live_stats ls = psd_live_stats(s);
    Ps__Stats st;
    ps__stats__init(&st);
    st.shard = s->conf.shard;
    st.shards = s->conf.shards;
    st.requests = n->requests;
    st.errors = n->errors;
    st.bytes_in = n->bytes_in;
    st.bytes_out = n->bytes_out;
    st.uptime_s = (double)((uint64_t)ps_mono_ns() - s->conf.start_ns) / 1e9;
    st.n_tables = ntables;
    st.tables = tp;
    char mode[32];
    psd_cons_name(c, mode, sizeof mode);
    st.consistency = mode;
    st.workers = c->workers;
    st.waiting = ws.waiting;
    st.deferred_total = ws.deferred_total;
    st.max_staleness = ws.max_staleness;
    st.wait_timeouts = ws.timeouts;
    st.duplicates_dropped = psd_dedup_dropped(s);
    st.live_workers = psd_live_count(s);
    st.workers_dropped = ls.dropped;
    st.workers_rejoined = ls.rejoined;
    st.stale_pushes = ls.stale_pushes;
    st.worker_timeout_ms = psd_worker_timeout_ms(s);
    st.checkpoints_written = psd_checkpoints_written(s);
    st.checkpoint_age_s = psd_checkpoint_age_s(s);
    st.bytes_held = bytes_held;
    st.shm_regions = psd_regions_bound(s->shm);
    st.unread_refused = psd_unread_refused(s);
    st.waits_refused = ws.refused;
    st.nonfinite_refused = psd_nonfinite_refused(s);
    st.hellos_refused = ls.hellos_refused;
    st.unread_bytes = psd_unread_total(s);
    uint32_t *missing = calloc(c->workers, sizeof *missing);
    for (uint32_t w = 0; missing != NULL && w < c->workers; w++)
        if (!psd_live_is_live(s, w))
            missing[st.n_missing_workers++] = w;
    st.missing_workers = missing;
    uint64_t *wc = calloc(c->workers, sizeof *wc);
    if (wc != NULL) {
        for (uint32_t w = 0; w < c->workers; w++)
            wc[w] = psd_worker_clock(s, w);
        st.n_worker_clocks = c->workers;
        st.worker_clocks = wc;
    }
    st.role = "solo";
    psd_hooks_stats(s, &st);
    Ps__Header h;
    psd_reply_init(&h, req);
    h.stats = &st;
    psd_reply_header(s, &h, rep);
    free(ts);
    free(tp);
    free(wc);
    free(missing);
}

/* A page of a sparse table's rows, in the shard's order (new rows are
 * added at the end; an eviction moves the last row into the hole): keys,
 * then their f32 weights. With changed, only the rows pushed after tick
 * since, from the rows [offset, next) looked at; with tombstones, the ids
 * evicted after since, offset counting from the oldest tombstone kept
 * (dim 1, values 0). */
void psd_op_list_rows(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    const struct psd_table *t = psd_table_at(s, req->table_id);
    if (t == NULL) {
        psd_reply_errorf(s, req, PS_ENOTABLE, rep, "rows: no table with id %u (this shard has %u)",
                         req->table_id, psd_ntables(s));
        return;
    }
    const struct psd_sparse *sp = &t->sp;
    if (!t->sparse) {
        psd_reply_errorf(s, req, PS_EINVAL, rep, "rows: table '%s' is dense: pull its range",
                         t->name);
        return;
    }
    int delta = req->changed || req->tombstones;
    if (delta && req->since > sp->tick) {
        psd_reply_errorf(s, req, PS_ESTATE, rep,
                         "rows: since %llu is past '%s''s tick %llu on this shard (it restarted "
                         "from an older checkpoint, or this is another run): take a full export",
                         (unsigned long long)req->since, t->name, (unsigned long long)sp->tick);
        return;
    }
    if (delta && req->since < sp->tomb_floor) {
        psd_reply_errorf(s, req, PS_ERANGE, rep,
                         "rows: since %llu is older than the evictions '%s' keeps on this shard "
                         "(from tick %llu on): take a full export",
                         (unsigned long long)req->since, t->name,
                         (unsigned long long)sp->tomb_floor);
        return;
    }
    uint64_t total = req->tombstones ? sp->tomb_n : sp->nrows;
    if (req->offset > total) {
        psd_reply_errorf(s, req, PS_ERANGE, rep, "rows: offset %llu past the %llu %s of '%s'",
                         (unsigned long long)req->offset, (unsigned long long)total,
                         req->tombstones ? "tombstones" : "rows", t->name);
        return;
    }
    uint32_t dim = req->tombstones ? 1 : t->dim;
    uint64_t want = req->count, wide = PS_ROWS_PAGE_BYTES / (dim * 4u);
    want = want < wide ? want : wide;
    /* a changed page looks at most PSD_ROWS_SCAN_MAX entries */
    uint64_t scan = delta ? PSD_ROWS_SCAN_MAX : want, end = req->offset;
    rep->mask = malloc(want ? want * 8u : 1);
    rep->vals = calloc(want ? want * dim : 1, 4u);
    if (rep->mask == NULL || rep->vals == NULL) {
        psd_reply_drop(rep);
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "rows: out of memory for %llu rows",
                         (unsigned long long)want);
        return;
    }
    unsigned char *k = rep->mask;
    uint64_t n = 0, first = (sp->tomb_head + sp->tomb_cap - sp->tomb_n) %
                            (sp->tomb_cap ? sp->tomb_cap : 1);
    for (; end < total && n < want && end - req->offset < scan; end++) {
        uint64_t key, tick;
        if (req->tombstones) {
            uint64_t at = (first + end) % sp->tomb_cap;
            key = sp->tomb_key[at];
            tick = sp->tomb_tick[at];
        } else {
            key = sp->row_key[end];
            tick = sp->last[end];
        }
        if (delta && tick <= req->since)
            continue;
        uint64_t le = htole64(key); /* little-endian on the wire */
        memcpy(k + n * 8u, &le, 8);
        if (!req->tombstones)
            memcpy((float *)rep->vals + n * dim, sp->w + end * dim, dim * sizeof(float));
        n++;
    }
    rep->mask_bytes = n * 8u;
    rep->vals_bytes = n * dim * 4u;
    Ps__Header h;
    psd_reply_init(&h, req);
    h.offset = req->offset;
    h.count = n;
    h.dim = dim;
    h.dtype = PS__DTYPE__DTYPE_F32;
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.rows = total;
    h.next = end;
    h.table_version = sp->tick;
    h.since = req->since;
    h.changed = req->changed;
    h.tombstones = req->tombstones;
    psd_reply_header(s, &h, rep);
}
