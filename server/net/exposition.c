/* psd's state in Prometheus text format. Runs on the loop thread; the
 * text is then published to the HTTP thread (ps_metrics). */
#include "exposition.h"
#include "ps_clock.h"

#include "catalog.h"
#include "checkpoint.h"
#include "consistency.h"
#include "counters.h"
#include "dedup.h"
#include "live.h"
#include "ops.h"
#include "regions.h"
#include "reply.h"
#include "table.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_pool.h"
#include "ps_wire.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

static const char *op_label(int op)
{
    return op == PSD_OPS_COUNT ? "invalid" : ps_op_name(op);
}

static void table_label(char *out, size_t len, const struct psd_table *t)
{
    out[0] = '\0';
    ps_prom_label(out, len, "table", t->name);
}

struct scalar {
    const char *name, *type, *help;
    double v;
};

static void put_scalars(struct ps_buf *b, const struct scalar *sc, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ps_prom_metric(b, sc[i].name, sc[i].type, sc[i].help, sc[i].v);
}

/* One family over every table. */
enum table_field {
    T_CLOCK,
    T_UPDATES,
    T_PUSHES,
    T_PULLS,
    T_SPARSITY,
    T_ROWS,
    T_BYTES,
    T_LENT,
    T_COW,
    T_CHANGED,
    T_WHOLE,
    T_ADMITTED,
    T_HELD_BACK,
    T_EVICTED_AGE,
    T_EVICTED_BUDGET,
    T_REFUSED,
    T_BYTES_PER_ROW,
    T_TICK,
    T_AGE_FLOOR
};

static double table_value(const struct psd *s, const struct psd_table *t, enum table_field f)
{
    switch (f) {
    case T_CLOCK:
        return (double)psd_cons_clock(&s->conf.cons, t);
    case T_UPDATES:
        return (double)t->steps;
    case T_PUSHES:
        return (double)t->pushes;
    case T_PULLS:
        return (double)t->pulls;
    case T_SPARSITY:
        return psd_table_sparsity(t);
    case T_ROWS:
        return t->sparse ? (double)t->sp.nrows : (double)(t->hi - t->lo);
    case T_BYTES:
        return (double)psd_table_bytes_held(t);
    case T_LENT:
        return (double)t->lent_bytes;
    case T_COW:
        return (double)t->cow;
    case T_CHANGED:
        return (double)t->changed_replies;
    case T_WHOLE:
        return (double)t->whole_replies;
    case T_ADMITTED:
        return (double)t->sp.admitted;
    case T_HELD_BACK:
        return (double)t->sp.held_back;
    case T_EVICTED_AGE:
        return (double)t->sp.evicted_age;
    case T_EVICTED_BUDGET:
        return (double)t->sp.evicted_budget;
    case T_REFUSED:
        return (double)t->sp.refused;
    case T_BYTES_PER_ROW:
        return t->sparse && t->sp.nrows > 0 ? (double)psd_table_bytes_held(t) / (double)t->sp.nrows
                                            : 0.0;
    case T_TICK:
        return (double)t->sp.tick;
    case T_AGE_FLOOR:
        return (double)t->sp.age_floor;
    }
    return 0;
}

static void tables_family(struct ps_buf *b, const struct psd *s, const char *name, const char *type,
                          const char *help, enum table_field f)
{
    ps_prom_family(b, name, type, help);
    for (uint32_t i = 0; i < psd_ntables(s); i++) {
        char lab[512];
        table_label(lab, sizeof lab, psd_table_at(s, i));
        ps_prom_sample(b, name, lab, table_value(s, psd_table_at(s, i), f));
    }
}

static void requests(struct ps_buf *b, const struct psd *s)
{
    char lab[128];
    const struct psd_counts *n = psd_counts(s);
    ps_prom_family(b, "psd_requests_total", "counter", "Requests received, by operation.");
    for (int op = 1; op <= PSD_OPS_COUNT; op++) {
        lab[0] = '\0';
        ps_prom_label(lab, sizeof lab, "op", op_label(op));
        ps_prom_sample(b, "psd_requests_total", lab, (double)n->by_op[op]);
    }
    ps_prom_family(b, "psd_error_replies_total", "counter",
                   "Error replies, by operation and error code (requests without one were "
                   "answered ok).");
    for (int op = 0; op <= PSD_OPS_COUNT; op++)
        for (int c = 1; c <= PSD_ERR_CODES; c++) {
            if (n->errors_by[op][c] == 0)
                continue;
            lab[0] = '\0';
            ps_prom_label(lab, sizeof lab, "op", op_label(op));
            const char *code = c < PSD_ERR_CODES ? ps_err_name(-c) : "other";
            ps_prom_label(lab, sizeof lab, "code", strncmp(code, "PS_", 3) ? code : code + 3);
            ps_prom_sample(b, "psd_error_replies_total", lab, (double)n->errors_by[op][c]);
        }
}

static void workers(struct ps_buf *b, const struct psd *s)
{
    ps_prom_family(b, "psd_worker_clock", "gauge",
                   "Clocks each worker has pushed (lowest over tables).");
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t w = 0; w < s->conf.cons.workers; w++) {
        char lab[64], id[16];
        uint64_t c = psd_worker_clock(s, w);
        snprintf(id, sizeof id, "%u", w);
        lab[0] = '\0';
        ps_prom_label(lab, sizeof lab, "worker", id);
        ps_prom_sample(b, "psd_worker_clock", lab, (double)c);
        if (psd_live_is_live(s, w)) {
            lo = c < lo ? c : lo;
            hi = c > hi ? c : hi;
        }
    }
    ps_prom_metric(b, "psd_clock_spread", "gauge",
                   "Clocks between the fastest and the slowest live worker now.",
                   hi >= lo ? (double)(hi - lo) : 0.0);
    ps_prom_metric(b, "psd_max_staleness", "gauge",
                   "Largest staleness (clocks) a pull has been answered with.",
                   (double)psd_waits_stats(s).max_staleness);
}

int psd_expose(const struct psd *s, struct ps_buf *b)
{
    char lab[256] = "", v[32], mode[32];
    const struct psd_conf *c = &s->conf;
    const struct psd_counts *n = psd_counts(s);
    struct psd_waits_stats ws = psd_waits_stats(s);
    struct psd_live_stats ls = psd_live_stats(s);
    psd_cons_name(&c->cons, mode, sizeof mode);
    snprintf(v, sizeof v, "%u", c->shard);
    ps_prom_label(lab, sizeof lab, "shard", v);
    snprintf(v, sizeof v, "%u", c->shards);
    ps_prom_label(lab, sizeof lab, "shards", v);
    ps_prom_label(lab, sizeof lab, "consistency", mode);
    ps_prom_family(b, "psd_shard_info", "gauge", "This shard: index, count and consistency mode.");
    ps_prom_sample(b, "psd_shard_info", lab, 1);
    ps_prom_metric(b, "psd_uptime_seconds", "gauge", "Seconds since start.",
                   (double)((uint64_t)ps_mono_ns() - c->start_ns) / 1e9);
    requests(b, s);
    const struct scalar scalars[] = {
        {"psd_received_bytes_total", "counter", "Bytes of requests received.", (double)n->bytes_in},
        {"psd_sent_bytes_total", "counter", "Bytes of replies sent.", (double)n->bytes_out},
        {"psd_unread_bytes", "gauge",
         "Reply bytes queued that their connections have not read yet.",
         (double)psd_unread_total(s)},
        {"psd_unread_refused_total", "counter",
         "Replies refused because their connection, or all, had too many bytes unread.",
         (double)psd_unread_refused(s)},
        {"psd_nonfinite_pushes_refused_total", "counter",
         "Pushes refused for holding a NaN or an infinity (psd --allow-nonfinite takes them).",
         (double)psd_nonfinite_refused(s)},
        {"psd_hellos_refused_total", "counter",
         "Hellos refused: a worker id another live connection holds, or one a CURVE key may not "
         "use.",
         (double)ls.hellos_refused},
        {"psd_requests_refused_identity_total", "counter",
         "Pulls, pushes, sets and heartbeats refused: under a worker id bound to another "
         "connection, or one the CURVE key may not use.",
         (double)ls.requests_refused},
        {"psd_waits_refused_total", "counter",
         "Pulls not ready that could not wait: a worker id outside the round, a clock out of "
         "reach, or a worker's or connection's share of the queue used.",
         (double)ws.refused},
        {"psd_waiting_requests", "gauge", "Pulls (and push-pulls) waiting for their clock now.",
         (double)ws.waiting},
        {"psd_deferred_requests_total", "counter", "Requests that had to wait for their clock.",
         (double)ws.deferred_total},
        {"psd_waiting_retries_total", "counter",
         "Retries of a request already waiting, merged with it.", (double)ws.refreshed},
        {"psd_wait_timeouts_total", "counter", "Waiting requests answered with a timeout error.",
         (double)ws.timeouts},
        {"psd_duplicate_pushes_dropped_total", "counter",
         "Retried pushes recognised and not applied twice.", (double)psd_dedup_dropped(s)},
        {"psd_stale_pushes_total", "counter",
         "Pushes from workers outside the rounds, acknowledged and not applied.",
         (double)ls.stale_pushes},
        {"psd_workers", "gauge", "Workers the consistency mode expects.", c->cons.workers},
        {"psd_live_workers", "gauge",
         "Workers in the live set (heard from within --worker-timeout).", psd_live_count(s)},
        {"psd_workers_dropped_total", "counter",
         "Times a silent worker was dropped from the live set.", (double)ls.dropped},
        {"psd_workers_rejoined_total", "counter",
         "Times a dropped or restarted worker joined the rounds again.", (double)ls.rejoined},
        {"psd_tables", "gauge", "Tables on this shard.", psd_ntables(s)},
        {"psd_apply_helper_pieces_total", "counter",
         "Pieces of large applies run by the helper thread (--apply-threads 2).",
         (double)ps_pool_helped(c->pool)},
        {"psd_checkpoints_written_total", "counter", "Checkpoints written.",
         (double)psd_checkpoints_written(s)},
        {"psd_shm_regions", "gauge",
         "Memory regions shared with workers on this host, bound to their connections now.",
         psd_regions_bound(s->shm)},
        {"psd_shm_received_bytes_total", "counter",
         "Push values read from shared regions (not counted as received bytes).",
         (double)psd_regions_bytes_in(s->shm)},
        {"psd_shm_sent_bytes_total", "counter",
         "Pull values written into shared regions (not counted as sent bytes).",
         (double)psd_regions_bytes_out(s->shm)},
    };
    put_scalars(b, scalars, sizeof scalars / sizeof scalars[0]);
    workers(b, s);
    tables_family(b, s, "psd_table_clock", "gauge", "A table's clock (rounds applied in bsp).",
                  T_CLOCK);
    tables_family(b, s, "psd_table_updates_total", "counter", "Optimizer steps applied.",
                  T_UPDATES);
    tables_family(b, s, "psd_table_pushes_total", "counter", "Pushes received.", T_PUSHES);
    tables_family(b, s, "psd_table_pulls_total", "counter", "Pulls answered.", T_PULLS);
    tables_family(b, s, "psd_table_sparsity_ratio", "gauge",
                  "Share of this shard's weights pruned to zero.", T_SPARSITY);
    tables_family(b, s, "psd_table_rows", "gauge",
                  "Elements of this shard's range (dense) or rows held (sparse).", T_ROWS);
    tables_family(b, s, "psd_table_held_bytes", "gauge",
                  "Bytes of weights, optimizer state and change stamps.", T_BYTES);
    tables_family(b, s, "psd_table_lent_bytes_total", "counter",
                  "Bytes of pull replies sent from the table's memory without a copy.", T_LENT);
    tables_family(b, s, "psd_table_copies_on_write_total", "counter",
                  "Times the table was written while such a reply was in flight, and copied "
                  "first.",
                  T_COW);
    tables_family(b, s, "psd_table_changed_pulls_total", "counter",
                  "Pulls that asked for what changed and got only that.", T_CHANGED);
    tables_family(b, s, "psd_table_changed_pulls_whole_total", "counter",
                  "Pulls that asked for what changed and got the whole range (the client's "
                  "version unknown here, or the changes as large).",
                  T_WHOLE);
    tables_family(b, s, "psd_table_rows_admitted_total", "counter",
                  "Sparse tables: rows made (at an id's first push, or its admission).",
                  T_ADMITTED);
    tables_family(b, s, "psd_table_pushes_held_back_total", "counter",
                  "Sparse tables: pushes of ids not admitted yet (counted, not applied).",
                  T_HELD_BACK);
    tables_family(b, s, "psd_table_rows_evicted_age_total", "counter",
                  "Sparse tables: rows evicted for not being pushed in evict_after pushes or "
                  "evict_after_s seconds.",
                  T_EVICTED_AGE);
    tables_family(b, s, "psd_table_rows_evicted_budget_total", "counter",
                  "Sparse tables: rows evicted to make room at rows_max.", T_EVICTED_BUDGET);
    tables_family(b, s, "psd_table_rows_refused_total", "counter",
                  "Sparse tables: new rows refused (at rows_max with nothing to evict).",
                  T_REFUSED);
    tables_family(b, s, "psd_table_bytes_per_row", "gauge",
                  "Sparse tables: held bytes over rows (weights, state, the life cycle's).",
                  T_BYTES_PER_ROW);
    tables_family(b, s, "psd_table_tick", "gauge",
                  "Sparse tables: pushes applied on this shard (the version delta exports name).",
                  T_TICK);
    tables_family(b, s, "psd_table_age_floor", "gauge",
                  "Sparse tables with evict_after_s: rows last pushed before this tick are older "
                  "than it, and go as age eviction reaches them.",
                  T_AGE_FLOOR);
    ps_prom_family(b, "psd_apply_seconds", "histogram", "Time of one optimizer apply.");
    for (uint32_t i = 0; i < psd_ntables(s); i++) {
        char tl[512];
        table_label(tl, sizeof tl, psd_table_at(s, i));
        ps_prom_hist(b, "psd_apply_seconds", tl, &psd_table_at(s, i)->apply_hist);
    }
    if (psd_checkpoints_written(s)) /* absent until there is one */
        ps_prom_metric(b, "psd_checkpoint_age_seconds", "gauge",
                       "Seconds since the newest checkpoint was written or last found to hold the "
                       "shard's current state (an idle shard writes none).",
                       psd_checkpoint_age_s(s));
    return b->oom ? PS_ENOMEM : 0;
}

void psd_expose_net(const struct psd_net *n, const struct psd_security *sec, struct ps_buf *b)
{
    const struct scalar scalars[] = {
        {"psd_replies_dropped_total", "counter",
         "Replies dropped at send: the connection's queue was full, or it was gone.",
         (double)n->send_drops},
        {"psd_shm_refused_total", "counter",
         "Shared regions handed over and refused (bad hand-over, or every region bound).",
         (double)n->shm_refused},
        {"psd_shm_idle_closed_total", "counter",
         "Connections to the hand-over socket closed for sending nothing while others waited.",
         (double)n->shm_idle_closed},
        {"psd_connections", "gauge", "Connections accepted and not yet closed.",
         (double)n->connections},
        {"psd_connections_max", "gauge",
         "Connections psd can hold: its file-descriptor limit less those it holds otherwise.",
         (double)psd_net_connections_max(n)},
        {"psd_connection_limit_reached_total", "counter",
         "Times the connections reached psd_connections_max (S0114).", (double)n->limit_reached},
        {"psd_handshakes_admitted_total", "counter", "CURVE clients admitted.",
         sec != NULL ? (double)sec->admitted : 0},
        {"psd_handshakes_refused_total", "counter",
         "Connections refused at the handshake (key not listed, plaintext, garbage).",
         sec != NULL ? (double)sec->refused : 0},
    };
    put_scalars(b, scalars, sizeof scalars / sizeof scalars[0]);
}
