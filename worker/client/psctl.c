/* psctl: the admin client of a psd cluster.
 *
 *   psctl --servers EP[,EP...] status        shards, workers, clocks, tables, traffic
 *   psctl --servers EP[,EP...] checkpoint    every shard writes a checkpoint now
 *   psctl --servers EP[,EP...] export FILE   every dense table into one safetensors file
 *   psctl keygen PATH                        a CURVE key pair (PATH and PATH.pub)
 *   psctl reshard --from DIR --shards N --to DIR2
 *                                            checkpoints of S shards rewritten for N
 *
 * Tables for people by default, --json for scripts. It talks to the shards
 * as an observer (never counted as a worker). A shard that does not answer
 * within --timeout-ms is named, with how long it was given, and the exit
 * status is 1. */
#include "psclient.h"

#include "ps_clock.h"
#include "ps_curve.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_opts.h"
#include "ps_safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "psctl_impl.h"

#define OPT(...) PS_OPT(struct config, __VA_ARGS__)

static const struct ps_opt opts[] = {
    OPT("servers", PS_OPT_STR, servers, NULL, 0, 0, "EP[,EP...]",
        "psd endpoints, shard 0 first (as the workers take them)"),
    OPT("timeout-ms", PS_OPT_U64, timeout_ms, "5000", 100, 3600000, "MS",
        "how long a shard has to answer: status answers within it in all, shards that "
        "did not answer named"),
    OPT("json", PS_OPT_FLAG, json, NULL, 0, 0, NULL, "print JSON instead of tables"),
    OPT("format", PS_OPT_STR, format, "safetensors", 0, 0, "FORMAT",
        "export: the file format (safetensors)"),
    OPT("curve-secret", PS_OPT_STR, curve_secret, NULL, 0, 0, "FILE",
        "this client's CURVE key file; needs --curve-server-key"),
    OPT("curve-server-key", PS_OPT_STR, curve_server_key, NULL, 0, 0, "FILE",
        "the servers' public key file"),
    OPT("from", PS_OPT_STR, from, NULL, 0, 0, "DIR", "reshard: the checkpoint directory to read"),
    OPT("to", PS_OPT_STR, to, NULL, 0, 0, "DIR",
        "reshard: where to write the new shards' checkpoints (made if missing; it must hold "
        "none)"),
    OPT("shards", PS_OPT_U64, shards, "0", 0, PS_SHARDS_MAX, "N", "reshard: the new shard count"),
    OPT("since", PS_OPT_STR, since, NULL, 0, 0, "FILE",
        "export: only what changed after the export FILE (each sparse table's rows pushed since "
        "and, as NAME.evicted, the ids evicted since; dense tables whole)"),
    OPT("help", PS_OPT_FLAG, help, NULL, 0, 0, NULL, "show this help and exit"),
};
#define NOPTS (sizeof opts / sizeof opts[0])

static const char usage_text[] =
    "psctl inspects and steers a running psd cluster.\n\n"
    "commands:\n"
    "  status        shards, live and missing workers, clocks, tables (size, sparsity),\n"
    "                bytes in and out, waiting requests; exit 1 if a shard is unreachable\n"
    "  checkpoint    ask every shard to write a checkpoint now\n"
    "  export FILE   gather every dense table from every shard into one file\n"
    "                (--format safetensors; tensors named as the tables, f32, in the\n"
    "                table's shape: 1-D when it has none)\n"
    "  keygen PATH   write a CURVE key pair: PATH (secret, 0600) and PATH.pub\n"
    "  reshard       --from DIR --shards N --to DIR2: rewrite the checkpoints of a stopped\n"
    "                cluster of S shards (the newest valid one of each) as those of N\n"
    "                shards, for psd --shards N --checkpoint-dir DIR2 (needs no --servers)\n"
    "  recover       replicated shards whose in-sync set was lost whole (every member\n"
    "                gone without a clean stop; --servers lists each shard's replicas,\n"
    "                A|B): ask every replica what its checkpoint holds, name the\n"
    "                candidates and what each lacks, and have the newest take over";

/* What is left of the deadline (1 at least: a shard answering at once
 * still gets its chance). */
static int left_ms(const struct cluster *k)
{
    uint64_t now = (uint64_t)ps_mono_ms();
    return now + 1 >= k->deadline_ms ? 1 : (int)(k->deadline_ms - now);
}

/* 0 when shard s answered the hello; else the reason in err. */
static int answered(const struct cluster *k, uint32_t s, char *err, size_t len)
{
    if (psc_shard_answered(k->c, s))
        return 0;
    snprintf(err, len, "%s: no answer to hello within %d ms (--timeout-ms %d)", k->eps[s],
             k->hello_ms, k->timeout_ms);
    return -1;
}

static json_t *u64_array(const uint64_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

static json_t *shard_json(const struct psc_shard_stats *st, const struct psc_table_stats *tl,
                          uint32_t ntl)
{
    uint64_t missing[64];
    for (uint32_t i = 0; i < st->nmissing && i < 64; i++)
        missing[i] = st->missing[i];
    json_t *tables = json_array();
    for (uint32_t i = 0; i < ntl; i++) {
        const struct psc_table_stats *t = &tl[i];
        json_array_append_new(
            tables, json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}",
                              "name", t->name, "kind", t->sparse ? "sparse" : "dense", "optimizer",
                              t->optimizer, "size", (json_int_t)t->size, "lo", (json_int_t)t->lo,
                              "hi", (json_int_t)t->hi, "rows", (json_int_t)t->rows, "dim",
                              (json_int_t)t->dim, "clock", (json_int_t)t->clock, "updates",
                              (json_int_t)t->updates, "pushes", (json_int_t)t->pushes, "pulls",
                              (json_int_t)t->pulls, "sparsity", t->sparsity));
        json_t *last = json_array_get(tables, json_array_size(tables) - 1);
        if (last != NULL)
            json_object_update_new(
                last, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "bytes", (json_int_t)t->bytes,
                                "admitted", (json_int_t)t->admitted, "held_back",
                                (json_int_t)t->held_back, "evicted_age", (json_int_t)t->evicted_age,
                                "evicted_budget", (json_int_t)t->evicted_budget, "refused",
                                (json_int_t)t->refused));
    }
    json_t *o = json_pack(
        "{s:b, s:s, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "up", 1,
        "consistency", st->consistency, "uptime_s", st->uptime_s, "workers",
        (json_int_t)st->workers, "live_workers", (json_int_t)st->live_workers, "requests",
        (json_int_t)st->requests, "errors", (json_int_t)st->errors, "bytes_in",
        (json_int_t)st->bytes_in, "bytes_out", (json_int_t)st->bytes_out, "bytes_held",
        (json_int_t)st->bytes_held, "waiting", (json_int_t)st->waiting, "wait_timeouts",
        (json_int_t)st->wait_timeouts, "workers_dropped", (json_int_t)st->workers_dropped,
        "workers_rejoined", (json_int_t)st->workers_rejoined, "checkpoints_written",
        (json_int_t)st->checkpoints_written, "checkpoint_age_s", st->checkpoint_age_s);
    json_object_set_new(o, "missing_workers",
                        u64_array(missing, st->nmissing < 64 ? st->nmissing : 64));
    json_object_set_new(
        o, "worker_clocks",
        u64_array(st->worker_clocks, st->nworker_clocks < 64 ? st->nworker_clocks : 64));
    json_object_set_new(o, "tables", tables);
    json_t *reps = json_array();
    for (uint32_t i = 0; i < st->nreplicas && i < 4; i++)
        json_array_append_new(
            reps, json_pack("{s:s, s:I, s:I, s:b}", "endpoint", st->replicas[i].endpoint, "acked",
                            (json_int_t)st->replicas[i].acked, "lag",
                            (json_int_t)st->replicas[i].lag, "in_sync", st->replicas[i].in_sync));
    json_object_set_new(o, "role", json_string(st->role));
    json_object_set_new(o, "epoch", json_integer((json_int_t)st->epoch));
    json_object_set_new(o, "primary", json_string(st->primary));
    json_object_set_new(o, "backups", reps);
    if (strcmp(st->role, "solo") != 0 && st->role[0] != '\0') {
        json_object_set_new(o, "ckpt_epoch", json_integer((json_int_t)st->ckpt_epoch));
        json_object_set_new(o, "ckpt_seq", json_integer((json_int_t)st->ckpt_seq));
        json_object_set_new(o, "insync_epoch", json_integer((json_int_t)st->insync_epoch));
        json_object_set_new(o, "insync", json_string(st->insync));
        json_object_set_new(o, "insync_stopped", json_boolean(st->insync_stopped));
    }
    return o;
}

static void human_bytes(uint64_t b, char *out, size_t len)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(out, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static void print_shard(uint32_t s, const char *ep, const struct psc_shard_stats *st)
{
    char in[32], out[32], held[32], missing[256] = "none", ckpt[48];
    human_bytes(st->bytes_in, in, sizeof in);
    human_bytes(st->bytes_out, out, sizeof out);
    human_bytes(st->bytes_held, held, sizeof held);
    size_t used = 0;
    for (uint32_t i = 0; i < st->nmissing && i < 64 && used + 12 < sizeof missing; i++)
        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%u", i ? ", " : "",
                                 st->missing[i]);
    if (st->checkpoint_age_s < 0)
        snprintf(ckpt, sizeof ckpt, "none");
    else
        snprintf(ckpt, sizeof ckpt, "%.0f s ago (%llu written)", st->checkpoint_age_s,
                 (unsigned long long)st->checkpoints_written);
    printf("shard %u  %s  up %.0f s  %s\n", s, ep, st->uptime_s, st->consistency);
    printf("  workers   %u of %u live; missing: %s; dropped %llu, rejoined %llu times\n",
           st->live_workers, st->workers, missing, (unsigned long long)st->workers_dropped,
           (unsigned long long)st->workers_rejoined);
    printf("  clocks   ");
    for (uint32_t w = 0; w < st->nworker_clocks && w < 64; w++)
        printf(" %u:%llu", w, (unsigned long long)st->worker_clocks[w]);
    printf("\n  requests  %llu (%llu errors), %llu waiting, %llu wait timeouts\n",
           (unsigned long long)st->requests, (unsigned long long)st->errors,
           (unsigned long long)st->waiting, (unsigned long long)st->wait_timeouts);
    printf("  bytes     in %s, out %s, held %s; checkpoint %s\n", in, out, held, ckpt);
    if (strcmp(st->role, "solo") == 0 || st->role[0] == '\0')
        return;
    printf("  replicas  %s %s, epoch %llu, record %llu; %u backup(s)", st->role,
           st->primary[0] ? st->primary : "(no primary)", (unsigned long long)st->epoch,
           (unsigned long long)st->repl_seq, st->nreplicas);
    for (uint32_t i = 0; i < st->nreplicas && i < 4; i++)
        printf("%s %s %s, lag %llu", i ? ";" : ":", st->replicas[i].endpoint,
               st->replicas[i].in_sync ? "in sync" : "catching up",
               (unsigned long long)st->replicas[i].lag);
    printf("\n");
}

static void print_tables(uint32_t s, const struct psc_table_stats *tl, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const struct psc_table_stats *t = &tl[i];
        char where[64];
        if (t->sparse)
            snprintf(where, sizeof where, "%llu rows x %u", (unsigned long long)t->rows, t->dim);
        else
            snprintf(where, sizeof where, "[%llu, %llu)", (unsigned long long)t->lo,
                     (unsigned long long)t->hi);
        printf("  %-5u %-24s %-6s %12llu  %-24s %8llu %8llu %8.4f  %s\n", s, t->name,
               t->sparse ? "sparse" : "dense", (unsigned long long)t->size, where,
               (unsigned long long)t->clock, (unsigned long long)t->updates, t->sparsity,
               t->optimizer);
        if (t->sparse && (t->held_back || t->evicted_age || t->evicted_budget || t->refused))
            printf("        rows made %llu, pushes held back %llu, evicted %llu for age and %llu "
                   "for room, refused %llu; %llu bytes\n",
                   (unsigned long long)t->admitted, (unsigned long long)t->held_back,
                   (unsigned long long)t->evicted_age, (unsigned long long)t->evicted_budget,
                   (unsigned long long)t->refused, (unsigned long long)t->bytes);
    }
}

static int cmd_status(struct cluster *k, int json)
{
    struct psc_table_stats *tl = calloc((size_t)k->n * PS_TABLES_MAX, sizeof *tl);
    struct psc_shard_stats *st = calloc(k->n, sizeof *st);
    int *up = calloc(k->n, sizeof *up);
    char(*errs)[512] = calloc(k->n, sizeof *errs);
    if (tl == NULL || st == NULL || up == NULL || errs == NULL) {
        fprintf(stderr, "psctl: out of memory\n");
        free(tl);
        free(st);
        free(up);
        free(errs);
        return 1;
    }
    int down = 0;
    for (uint32_t s = 0; s < k->n; s++) {
        st[s].struct_size = sizeof st[s];
        tl[(size_t)s * PS_TABLES_MAX].struct_size = sizeof *tl;
        up[s] = answered(k, s, errs[s], sizeof errs[s]) == 0 &&
                psc_stats_tables(k->c, s, left_ms(k), &st[s], tl + (size_t)s * PS_TABLES_MAX,
                                 PS_TABLES_MAX) == 0;
        if (!up[s] && errs[s][0] == '\0')
            snprintf(errs[s], sizeof errs[s], "%s", psc_last_error(k->c));
        down += !up[s];
    }
    if (json) {
        json_t *shards = json_array();
        for (uint32_t s = 0; s < k->n; s++) {
            json_t *o =
                up[s] ? shard_json(&st[s], tl + (size_t)s * PS_TABLES_MAX,
                                   st[s].tables < PS_TABLES_MAX ? st[s].tables : PS_TABLES_MAX)
                      : json_pack("{s:b, s:s}", "up", 0, "error", errs[s]);
            json_object_set_new(o, "shard", json_integer(s));
            json_object_set_new(o, "endpoint", json_string(k->eps[s]));
            json_array_append_new(shards, o);
        }
        json_t *all = json_pack("{s:o, s:I}", "shards", shards, "unreachable", (json_int_t)down);
        json_dumpf(all, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(all);
    } else {
        for (uint32_t s = 0; s < k->n; s++) {
            if (up[s])
                print_shard(s, k->eps[s], &st[s]);
            else
                printf("shard %u  %s  UNREACHABLE: %s\n", s, k->eps[s], errs[s]);
        }
        printf("\ntables\n  %-5s %-24s %-6s %12s  %-24s %8s %8s %8s  %s\n", "shard", "name", "kind",
               "size", "range or rows", "clock", "updates", "sparsity", "optimizer");
        for (uint32_t s = 0; s < k->n; s++)
            if (up[s])
                print_tables(s, tl + (size_t)s * PS_TABLES_MAX,
                             st[s].tables < PS_TABLES_MAX ? st[s].tables : PS_TABLES_MAX);
        if (down)
            printf("\n%d of %zu shards unreachable\n", down, k->n);
    }
    free(tl);
    free(st);
    free(up);
    free(errs);
    return down ? 1 : 0;
}

static int cmd_checkpoint(struct cluster *k, int json)
{
    int failed = 0;
    json_t *arr = json_array();
    for (uint32_t s = 0; s < k->n; s++) {
        char detail[PS_PATH_MAX + 100], why[512] = "";
        int rc = answered(k, s, why, sizeof why);
        if (rc == 0 && (rc = psc_checkpoint(k->c, s, k->timeout_ms, detail, sizeof detail)) != 0)
            snprintf(why, sizeof why, "%s", psc_last_error(k->c));
        failed += rc != 0;
        if (json)
            json_array_append_new(
                arr, json_pack("{s:i, s:s, s:b, s:s}", "shard", (int)s, "endpoint", k->eps[s], "ok",
                               rc == 0, rc == 0 ? "detail" : "error", rc == 0 ? detail : why));
        else if (rc == 0)
            printf("shard %u: %s\n", s, detail);
        else
            printf("shard %u: FAILED: %s\n", s, why);
    }
    if (json) {
        json_dumpf(arr, stdout, JSON_INDENT(2));
        printf("\n");
    }
    json_decref(arr);
    return failed ? 1 : 0;
}

struct key_at {
    uint64_t key, at;
};

static int by_key(const void *a, const void *b)
{
    uint64_t x = ((const struct key_at *)a)->key, y = ((const struct key_at *)b)->key;
    return (x > y) - (x < y);
}

/* A sparse table gathered from every shard. */
struct gathered {
    uint64_t n, cap;
    uint64_t *keys;
    float *vals;
};

/* Room for PS_ROWS_PAGE_MAX more rows of d in g (vals too when d > 0). */
static int gathered_room(struct gathered *g, uint32_t d, const char *name)
{
    if (g->cap - g->n >= PS_ROWS_PAGE_MAX)
        return 0;
    uint64_t cap = g->cap * 2 > g->n + PS_ROWS_PAGE_MAX ? g->cap * 2 : g->n + PS_ROWS_PAGE_MAX;
    uint64_t *nk = realloc(g->keys, cap * sizeof *nk);
    if (nk != NULL)
        g->keys = nk;
    float *nv = nk != NULL && d > 0 ? realloc(g->vals, cap * d * sizeof *nv) : NULL;
    if (nk == NULL || (d > 0 && nv == NULL)) {
        fprintf(stderr, "psctl: export: '%s': out of memory at %llu rows\n", name,
                (unsigned long long)g->n);
        return PS_ENOMEM;
    }
    if (d > 0)
        g->vals = nv;
    g->cap = cap;
    return 0;
}

/* Pages shard s's rows of sparse table h (what: psc_rows_delta's) into g;
 * *tick gets the table's tick there. The tick is read at the first page
 * and the last: a push in between (the pages would not be one state) is
 * an error that says to export again when pushes pause. */
static int gather_shard(struct cluster *k, uint32_t h, const char *name, uint32_t d, uint32_t s,
                        int what, uint64_t since, struct gathered *g, uint64_t *tick)
{
    uint64_t off = 0, first = 0;
    int started = 0;
    for (;;) {
        int rc = gathered_room(g, what == PSC_ROWS_EVICTED ? 0 : d, name);
        if (rc != 0)
            return rc;
        uint64_t got = 0, next = 0, t = 0;
        rc = psc_rows_delta(k->c, h, s, what, since, off, PS_ROWS_PAGE_MAX, g->keys + g->n,
                            what == PSC_ROWS_EVICTED ? NULL : g->vals + g->n * d, &got, &next, &t,
                            (int)k->timeout_ms);
        if (rc != 0) {
            fprintf(stderr, "psctl: export: '%s': shard %u: %s\n", name, s, psc_last_error(k->c));
            return rc;
        }
        if (!started)
            first = t;
        started = 1;
        if (t != first) {
            fprintf(stderr,
                    "psctl: export: '%s': shard %u applied pushes while it was read (tick %llu, "
                    "then %llu): export again while the workers pause\n",
                    name, s, (unsigned long long)first, (unsigned long long)t);
            return PS_ESTATE;
        }
        g->n += got;
        if (next == off) /* nothing left to look at */
            break;
        off = next;
    }
    *tick = first;
    return 0;
}

/* Sorts g's rows (d floats each, or keys only when d is 0) by key: a key
 * lives on one shard only. */
static int gathered_sort(struct gathered *g, uint32_t d, const char *name)
{
    struct key_at *idx = malloc((g->n ? g->n : 1) * sizeof *idx);
    uint64_t *keys = malloc((g->n ? g->n : 1) * sizeof *keys);
    float *vals = d > 0 ? malloc((g->n ? g->n : 1) * d * sizeof *vals) : NULL;
    if (idx == NULL || keys == NULL || (d > 0 && vals == NULL)) {
        free(idx);
        free(keys);
        free(vals);
        fprintf(stderr, "psctl: export: '%s': out of memory sorting %llu rows\n", name,
                (unsigned long long)g->n);
        return PS_ENOMEM;
    }
    for (uint64_t i = 0; i < g->n; i++)
        idx[i] = (struct key_at){g->keys[i], i};
    qsort(idx, g->n, sizeof *idx, by_key);
    for (uint64_t i = 0; i < g->n; i++) {
        keys[i] = idx[i].key;
        if (d > 0)
            memcpy(vals + i * d, g->vals + idx[i].at * d, d * sizeof *vals);
    }
    free(idx);
    free(g->keys);
    free(g->vals);
    g->keys = keys;
    g->vals = vals;
    return 0;
}

/* The ticks an earlier export reached for table name, from its header's
 * "ticks/NAME" ("t0,t1,...", one per shard), into since[0..n). */
static int export_ticks(const char *path, const char *name, uint32_t n, uint64_t *since)
{
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    uint64_t len = 0;
    if (f == NULL || fread(len8, 1, 8, f) != 8) {
        fprintf(stderr, "psctl: export --since %s: cannot read it: %s\n", path,
                f ? "shorter than a header" : strerror(errno));
        if (f)
            fclose(f);
        return PS_EINVAL;
    }
    for (int i = 7; i >= 0; i--)
        len = len << 8 | len8[i];
    char *hdr = len < (UINT64_C(1) << 30) ? malloc(len + 1) : NULL;
    int ok = hdr != NULL && fread(hdr, 1, len, f) == len;
    fclose(f);
    json_t *j = ok ? (hdr[len] = '\0', json_loads(hdr, 0, NULL)) : NULL;
    free(hdr);
    char key[PS_TABLE_NAME_MAX + 8];
    snprintf(key, sizeof key, "ticks/%s", name);
    const char *v = json_string_value(json_object_get(json_object_get(j, "__metadata__"), key));
    uint32_t got = 0;
    for (const char *p = v; p != NULL && *p && got < n;) {
        char *end;
        since[got++] = strtoull(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *end != '\0')
            break;
    }
    int rc = 0;
    if (v == NULL || got != n) {
        fprintf(stderr,
                "psctl: export --since %s: it has no ticks for '%s' on %u shards (%s): take a "
                "full export\n",
                path, name, n, v ? v : "none");
        rc = PS_EINVAL;
    }
    json_decref(j); /* v is j's */
    return rc;
}

/* Metadata an export writes beside its tensors: per sparse table,
 * "ticks/NAME" (where each shard was: a later --since starts there) and,
 * in a delta, "since/NAME" (where it started). */
struct export_meta {
    char (*key)[PS_TABLE_NAME_MAX + 8];
    char (*val)[PS_SHARDS_MAX * 21 + 1];
    size_t n;
};

static void ticks_text(char *out, size_t len, const uint64_t *t, uint32_t n)
{
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t s = 0; s < n && used < len; s++)
        used += (size_t)snprintf(out + used, len - used, "%s%llu", s ? "," : "",
                                 (unsigned long long)t[s]);
}

/* Sparse table tl's rows into tensors NAME [rows, dim] and NAME.keys
 * (all of them, or since: those pushed after each shard's tick in it,
 * and NAME.evicted, the ids evicted after it), with the ticks reached in
 * meta. */
static int export_sparse(struct cluster *k, uint32_t h, const struct psc_table_stats *tl,
                         const char *since_path, struct ps_st_tensor *ts, size_t *n, void **bufs,
                         size_t *nb, struct export_meta *meta, uint64_t *bytes)
{
    uint64_t since[PS_SHARDS_MAX] = {0}, tick[PS_SHARDS_MAX], etick[PS_SHARDS_MAX];
    int rc = since_path ? export_ticks(since_path, tl->name, k->n, since) : 0;
    struct gathered g = {0}, e = {0};
    for (uint32_t s = 0; rc == 0 && s < k->n; s++) {
        rc = gather_shard(k, h, tl->name, tl->dim, s, since_path ? PSC_ROWS_CHANGED : PSC_ROWS_ALL,
                          since[s], &g, &tick[s]);
        if (rc == 0 && since_path)
            rc =
                gather_shard(k, h, tl->name, tl->dim, s, PSC_ROWS_EVICTED, since[s], &e, &etick[s]);
        if (rc == 0 && since_path && etick[s] != tick[s]) {
            fprintf(stderr,
                    "psctl: export: '%s': shard %u applied pushes while it was read (tick %llu, "
                    "then %llu): export again while the workers pause\n",
                    tl->name, s, (unsigned long long)tick[s], (unsigned long long)etick[s]);
            rc = PS_ESTATE;
        }
    }
    bufs[(*nb)++] = g.keys;
    bufs[(*nb)++] = g.vals;
    bufs[(*nb)++] = e.keys;
    if (rc == 0)
        rc = gathered_sort(&g, tl->dim, tl->name);
    if (rc == 0 && since_path)
        rc = gathered_sort(&e, 0, tl->name);
    bufs[*nb - 3] = g.keys; /* sorting replaced them */
    bufs[*nb - 2] = g.vals;
    bufs[*nb - 1] = e.keys;
    if (rc != 0)
        return rc;
    char kname[PS_ST_NAME_MAX];
    snprintf(kname, sizeof kname, "%s.keys", tl->name);
    ps_st_tensor(&ts[(*n)++], tl->name, "F32", g.vals, 4, g.n, tl->dim);
    ps_st_tensor(&ts[(*n)++], kname, "U64", g.keys, 8, g.n, 0);
    if (since_path) {
        snprintf(kname, sizeof kname, "%s.evicted", tl->name);
        ps_st_tensor(&ts[(*n)++], kname, "U64", e.keys, 8, e.n, 0);
        snprintf(meta->key[meta->n], sizeof meta->key[0], "since/%s", tl->name);
        ticks_text(meta->val[meta->n++], sizeof meta->val[0], since, k->n);
    }
    snprintf(meta->key[meta->n], sizeof meta->key[0], "ticks/%s", tl->name);
    ticks_text(meta->val[meta->n++], sizeof meta->val[0], tick, k->n);
    *bytes += g.n * tl->dim * 4;
    return 0;
}

static int cmd_export(struct cluster *k, const char *path, const char *since_path, int json)
{
    struct psc_table_stats *tl = calloc(PS_TABLES_MAX, sizeof *tl);
    struct ps_st_tensor *ts = calloc(3 * PS_TABLES_MAX, sizeof *ts);
    void **bufs = calloc(3 * PS_TABLES_MAX, sizeof *bufs);
    struct export_meta meta = {.key = calloc(2 * PS_TABLES_MAX, sizeof *meta.key),
                               .val = calloc(2 * PS_TABLES_MAX, sizeof *meta.val)};
    int rc = tl && ts && bufs && meta.key && meta.val ? 0 : PS_ENOMEM;
    struct psc_shard_stats st = {.struct_size = sizeof st};
    if (tl != NULL)
        tl[0].struct_size = sizeof *tl;
    if (rc == 0 && (rc = psc_stats_tables(k->c, 0, k->timeout_ms, &st, tl, PS_TABLES_MAX)) != 0)
        fprintf(stderr, "psctl: export: %s\n", psc_last_error(k->c));
    size_t n = 0, nb = 0, tables = 0, sparse = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; rc == 0 && i < st.tables && i < PS_TABLES_MAX; i++) {
        uint32_t h;
        if (PS_TABLE_RESERVED(tl[i].name))
            continue; /* the client library's votes: no part of the model */
        if ((rc = psc_table_open(k->c, tl[i].name, k->timeout_ms, &h)) != 0) {
            fprintf(stderr, "psctl: export: '%s': %s\n", tl[i].name, psc_last_error(k->c));
            break;
        }
        if (tl[i].sparse) { /* rows spread by key: NAME [rows, dim] and NAME.keys [rows] */
            if ((rc = export_sparse(k, h, &tl[i], since_path, ts, &n, bufs, &nb, &meta, &bytes)) !=
                0)
                break;
            sparse++;
            tables++;
            continue;
        }
        uint64_t ticket;
        float *w = malloc((tl[i].size ? tl[i].size : 1) * sizeof(float));
        bufs[nb++] = w;
        if (w == NULL) {
            rc = PS_ENOMEM;
            break;
        }
        if ((rc = psc_pull(k->c, h, 0, tl[i].size, w, 0, &ticket)) != 0 ||
            (rc = psc_wait(k->c, ticket, k->timeout_ms)) != 0) {
            fprintf(stderr, "psctl: export: '%s': %s\n", tl[i].name, psc_last_error(k->c));
            break;
        }
        ps_st_tensor(&ts[n], tl[i].name, "F32", w, 4, tl[i].size, 0);
        if (tl[i].ndims > 0 && ps_st_tensor_shape(&ts[n], tl[i].shape, tl[i].ndims) != 0) {
            fprintf(stderr, "psctl: export: '%s': its shape does not hold its %llu elements\n",
                    tl[i].name, (unsigned long long)tl[i].size);
            rc = PS_EPROTO;
            break;
        }
        n++;
        bytes += tl[i].size * 4;
        tables++;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) /* a table named like another's keys */
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(ts[i].name, ts[j].name) == 0) {
                fprintf(stderr,
                        "psctl: export: two tensors would be named '%s' (a table and a sparse "
                        "table's keys)\n",
                        ts[i].name);
                rc = PS_EEXIST;
                break;
            }
    char err[512];
    const char **mt = calloc(2 + 2 * meta.n, sizeof *mt);
    if (rc == 0 && mt == NULL)
        rc = PS_ENOMEM;
    if (rc == 0) {
        mt[0] = "format";
        mt[1] = since_path ? "psd-export-delta" : "psd-export";
        for (size_t i = 0; i < meta.n; i++) {
            mt[2 + 2 * i] = meta.key[i];
            mt[3 + 2 * i] = meta.val[i];
        }
    }
    if (rc == 0 && (rc = ps_st_write(path, ts, n, mt, 2 + 2 * meta.n, err, sizeof err)) != 0)
        fprintf(stderr, "psctl: export: %s\n", err);
    free(mt);
    free(meta.key);
    free(meta.val);
    if (rc == PS_ENOMEM)
        fprintf(stderr, "psctl: export: out of memory\n");
    if (rc == 0 && json)
        printf("{\"file\": \"%s\", \"tables\": %zu, \"sparse\": %zu, \"bytes\": %llu}\n", path,
               tables, sparse, (unsigned long long)bytes);
    else if (rc == 0)
        printf("wrote %s: %zu tables (%zu sparse), %llu bytes of f32\n", path, tables, sparse,
               (unsigned long long)bytes);
    for (size_t i = 0; bufs != NULL && i < nb; i++)
        free(bufs[i]);
    free(bufs);
    free(ts);
    free(tl);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct config cfg;
    char err[512];
    int first = 0;
    if (ps_opts_parse(opts, NOPTS, &cfg, argc, argv, &first, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return 2;
    }
    if (cfg.help) {
        ps_opts_usage(stdout, "psctl --servers EP[,EP...] [OPTIONS] COMMAND [ARGS]", usage_text,
                      opts, NOPTS);
        return 0;
    }
    const char *cmd = first < argc ? argv[first] : NULL;
    /* the command's own arguments; "--format F" may follow the command */
    const char *args[4];
    int nargs = 0;
    for (int i = first + 1; i < argc; i++) {
        if (strcmp(argv[i], "--format") == 0 && i + 1 < argc)
            cfg.format = argv[++i];
        else if (strcmp(argv[i], "--from") == 0 && i + 1 < argc)
            cfg.from = argv[++i];
        else if (strcmp(argv[i], "--to") == 0 && i + 1 < argc)
            cfg.to = argv[++i];
        else if (strcmp(argv[i], "--shards") == 0 && i + 1 < argc) {
            uint64_t v = 0;
            if (ps_parse_u64(argv[++i], 1, PS_SHARDS_MAX, &v) != 0) {
                fprintf(stderr, "psctl: --shards: '%s' is not in [1, %u]\n", argv[i],
                        PS_SHARDS_MAX);
                return 2;
            }
            cfg.shards = v;
        } else if (nargs < 4)
            args[nargs++] = argv[i];
        else
            nargs++;
    }
    if (cmd == NULL) {
        fprintf(stderr, "psctl: no command (status, checkpoint, export FILE, keygen PATH, "
                        "reshard); see --help\n");
        return 2;
    }
    if (strcmp(cmd, "keygen") == 0) {
        if (nargs != 1) {
            fprintf(stderr, "psctl: keygen takes one PATH\n");
            return 2;
        }
        if (ps_curve_keygen(args[0], err, sizeof err) != 0) {
            fprintf(stderr, "psctl: keygen: %s\n", err);
            return 1;
        }
        printf("wrote %s (secret) and %s.pub\n", args[0], args[0]);
        return 0;
    }
    if (strcmp(cmd, "reshard") == 0) {
        if (nargs != 0) {
            fprintf(stderr, "psctl: reshard takes --from DIR --shards N --to DIR, no other "
                            "arguments\n");
            return 2;
        }
        return psc__ctl_reshard(&cfg);
    }
    if (strcmp(cmd, "recover") == 0) {
        if (nargs != 0) {
            fprintf(stderr, "psctl: recover takes no arguments\n");
            return 2;
        }
        return psc__ctl_recover(&cfg);
    }
    int want = strcmp(cmd, "export") == 0 ? 1 : 0;
    if (strcmp(cmd, "status") != 0 && strcmp(cmd, "checkpoint") != 0 && !want) {
        fprintf(stderr,
                "psctl: unknown command '%s' (status, checkpoint, export, keygen, reshard, "
                "recover)\n",
                cmd);
        return 2;
    }
    if (nargs != want) {
        fprintf(stderr, "psctl: %s takes %s\n", cmd, want ? "one FILE" : "no arguments");
        return 2;
    }
    if (want && strcmp(cfg.format, "safetensors") != 0) {
        fprintf(stderr, "psctl: --format: '%s' is not a known format (safetensors)\n", cfg.format);
        return 2;
    }
    struct cluster k;
    memset(&k, 0, sizeof k);
    int rc = psc__ctl_connect(&cfg, &k);
    if (rc != 0)
        return rc;
    if (strcmp(cmd, "status") == 0)
        rc = cmd_status(&k, cfg.json);
    else if (strcmp(cmd, "checkpoint") == 0)
        rc = cmd_checkpoint(&k, cfg.json);
    else
        rc = cmd_export(&k, args[0], cfg.since, cfg.json);
    psc_destroy(k.c);
    return rc;
}
