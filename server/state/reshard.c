/* Resharding: the snapshots of S shards rewritten for N (snapshot.h,
 * psd_reshard). */
#include "reshard.h"

#include "snapshot_impl.h"

#include "ps_err.h"
#include "ps_shard.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows of old shard b's copy of sparse table t that land on this shard. */
static int reshard_rows(const struct psd_snapshot *s, struct psd_table *t,
                        const struct psd__blob *b, int has_ticks, uint64_t shift, char *err,
                        size_t errlen)
{
    uint64_t rows = psd__blob_rows(b, t->name);
    if (rows > t->rows_max) /* also keeps the sizes below from wrapping */
        return ps_errf(PS_EPROTO, err, errlen, "'%s' has %" PRIu64 " rows, over its rows_max",
                       t->name, rows);
    size_t d = t->dim;
    const unsigned char *keys = psd__blob_tensor(b, "keys", t->name, "U64", rows * 8, err, errlen);
    const float *w =
        keys ? psd__blob_tensor(b, "w", t->name, "F32", rows * d * 4, err, errlen) : NULL;
    const unsigned char *steps =
        w ? psd__blob_tensor(b, "steps", t->name, "U32", rows * 4, err, errlen) : NULL;
    const float *st[2] = {NULL, NULL};
    for (int a = 0; steps != NULL && a < t->sp.nstate && a < 2; a++)
        if ((st[a] = psd__blob_tensor(b, a ? "s2" : "s1", t->name, "F32", rows * d * 4, err,
                                      errlen)) == NULL)
            return PS_EPROTO;
    if (steps == NULL)
        return PS_EPROTO;
    const unsigned char *rs = NULL; /* row-wise Adagrad's accumulators */
    if (t->sp.rowwise &&
        (rs = psd__blob_tensor(b, "rs", t->name, "F32", rows * 4, err, errlen)) == NULL)
        return PS_EPROTO;
    const unsigned char *last = NULL; /* each row's last push, on its old shard's ticks */
    if (has_ticks &&
        (last = psd__blob_tensor(b, "last", t->name, "U64", rows * 8, err, errlen)) == NULL)
        return PS_EPROTO;
    const unsigned char *freq = NULL;           /* each row's decayed count, as of its last push */
    if (last != NULL && t->sp.half_life != 0 && /* (its array comes with the first row) */
        (freq = psd__blob_tensor(b, "freq", t->name, "U32", rows * 4, err, errlen)) == NULL)
        return PS_EPROTO;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t k;
        memcpy(&k, keys + r * 8, 8);
        if (ps_shard_of_key(k, s->shards) != s->shard)
            continue;
        int64_t row = psd_sparse_row(&t->sp, k, 1);
        if (row < 0)
            return ps_errf(PS_ELIMIT, err, errlen,
                           "'%s': more rows land on shard %u of %u than its rows_max %" PRIu64
                           " (or key %" PRIu64 " twice)",
                           t->name, s->shard, s->shards, t->rows_max, k);
        float *dst[2] = {t->sp.s1, t->sp.s2}; /* a new row may have moved the arrays */
        memcpy(t->sp.w + (size_t)row * d, w + r * d, d * 4);
        for (int a = 0; a < 2; a++)
            if (st[a] != NULL)
                memcpy(dst[a] + (size_t)row * d, st[a] + r * d, d * 4);
        memcpy(&t->sp.row_steps[row], steps + r * 4, 4);
        if (rs != NULL)
            memcpy(&t->sp.rsum[row], rs + r * 4, 4);
        if (last != NULL) { /* as many ticks old on the new shard's count */
            memcpy(&t->sp.last[row], last + r * 8, 8);
            t->sp.last[row] += shift;
        }
        if (freq != NULL)
            memcpy(&t->sp.freq[row], freq + r * 4, 4);
    }
    return 0;
}

/* A sparse table's ticks across old shards: the new shards count ticks
 * from the furthest old count, each row as old as it was on its shard;
 * exports since a tick before the reshard cannot be told (the old
 * shards' ticks are not the new ones'), so the tombstones start empty
 * above that floor. With a life cycle, the admission sketch is the old
 * sketches' counter by counter maximum (an id was counted on one old
 * shard: at least its count stays, as a count-min sketch's estimate
 * always is). The counts of rows made, held back, evicted and refused
 * start again: rows made = rows held. */
static int reshard_ticks(struct psd_table *t, const struct psd__blob *b, json_t *const *st,
                         uint32_t n, size_t k, uint64_t *tick, char *err, size_t errlen)
{
    struct psd_sparse *sp = &t->sp;
    for (uint32_t i = 0; i < n; i++) {
        json_t *o = json_array_get(json_object_get(st[i], "tables"), k);
        tick[i] = psd__json_u64(o, "tick"); /* 0 in files from before ticks */
        sp->tick = tick[i] > sp->tick ? tick[i] : sp->tick;
        if (sp->sketch == NULL)
            continue;
        const uint8_t *sk =
            psd__blob_tensor(&b[i], "sketch", t->name, "U8", 4 * sp->sketch_width, err, errlen);
        if (sk == NULL)
            return PS_EPROTO;
        for (uint64_t c = 0; c < 4 * sp->sketch_width; c++)
            sp->sketch[c] = sk[c] > sp->sketch[c] ? sk[c] : sp->sketch[c];
    }
    sp->tomb_floor = sp->tick;
    return 0;
}

/* The part of old shard i's (of n) range of dense table t that this
 * shard's range holds: weights, optimizer state, pruning mask. */
static int reshard_dense(struct psd_table *t, const struct psd__blob *b, uint32_t i, uint32_t n,
                         char *err, size_t errlen)
{
    uint64_t lo, hi;
    ps_shard_range(t->size, n, i, &lo, &hi);
    uint64_t a = lo > t->lo ? lo : t->lo, z = hi < t->hi ? hi : t->hi;
    float *dst[3] = {t->w, t->s1, t->s2};
    const char *names[3] = {"w", "s1", "s2"};
    for (int k = 0; k < 3 && a < z; k++) {
        if (dst[k] == NULL)
            continue;
        const float *v = psd__blob_tensor(b, names[k], t->name, "F32", (hi - lo) * 4, err, errlen);
        if (v == NULL)
            return PS_EPROTO;
        memcpy(dst[k] + (a - t->lo), v + (a - lo), (z - a) * 4);
    }
    if (t->mask != NULL && a < z) {
        const uint8_t *m = psd__blob_tensor(b, "mask", t->name, "U8", hi - lo, err, errlen);
        if (m == NULL)
            return PS_EPROTO;
        memcpy(t->mask + (a - t->lo), m + (a - lo), z - a);
    }
    return 0;
}

/* The largest of a counter over the old shards' copies of table k. */
static uint64_t max_over(json_t *const *st, uint32_t n, size_t k, const char *name)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v = psd__json_u64(json_array_get(json_object_get(st[i], "tables"), k), name);
        m = v > m ? v : m;
    }
    return m;
}

/* The old shards' states st[0..n) hold the same tables, and were written
 * with out's mode and worker count. */
static int check_alike(const struct psd_snapshot *out, json_t *const *st, uint32_t n, char *err,
                       size_t errlen)
{
    json_t *tables = json_object_get(st[0], "tables");
    char mode[32];
    psd_cons_name(&out->cons, mode, sizeof mode);
    for (uint32_t i = 0; i < n; i++) {
        json_t *ti = json_object_get(st[i], "tables");
        const char *m = json_string_value(json_object_get(st[i], "consistency"));
        if (m == NULL || strcmp(m, mode) != 0 ||
            psd__json_u64(st[i], "workers") != out->cons.workers)
            return ps_errf(PS_EPROTO, err, errlen,
                           "shard %u of %u was written by a psd with --consistency %s --workers "
                           "%" PRIu64 ", not %s and %u",
                           i, n, m ? m : "?", psd__json_u64(st[i], "workers"), mode,
                           out->cons.workers);
        for (size_t k = 0; k < json_array_size(tables); k++) {
            const char *a = json_string_value(json_object_get(json_array_get(tables, k), "name"));
            const char *z = json_string_value(json_object_get(json_array_get(ti, k), "name"));
            if (a == NULL || z == NULL || strcmp(a, z) != 0)
                return ps_errf(PS_EPROTO, err, errlen,
                               "shard %u of %u holds other tables than shard 0 (table %zu: '%s', "
                               "'%s')",
                               i, n, k, z ? z : "?", a ? a : "?");
        }
        if (json_array_size(ti) != json_array_size(tables))
            return ps_errf(PS_EPROTO, err, errlen, "shard %u of %u has %zu tables, shard 0 %zu", i,
                           n, json_array_size(ti), json_array_size(tables));
    }
    return 0;
}

/* Table k of out, from the old shards' files b and states st. */
static int reshard_table(struct psd_snapshot *out, const struct psd__blob *b, json_t *const *st,
                         uint32_t n, size_t k, char *err, size_t errlen)
{
    json_t *o = json_array_get(json_object_get(st[0], "tables"), k);
    struct psd_table *t = NULL;
    int rc = psd__snapshot_table(out, o, out->ntables, PS_TABLE_BYTES_DEFAULT, &t, err, errlen);
    if (rc != 0)
        return rc;
    out->tables[out->ntables++] = t; /* freed with out if what follows fails */
    /* counters and clocks: the furthest any old shard had (equal on all in
     * bsp between rounds) */
    t->steps = max_over(st, n, k, "steps");
    t->clock = max_over(st, n, k, "clock");
    t->round_begun = max_over(st, n, k, "round_begun");
    t->pushes = max_over(st, n, k, "pushes");
    t->pulls = max_over(st, n, k, "pulls");
    for (uint32_t w = 0; w < out->cons.workers; w++)
        for (uint32_t i = 0; i < n; i++) {
            json_t *c =
                json_object_get(json_array_get(json_object_get(st[i], "tables"), k), "completed");
            uint64_t v = (uint64_t)json_integer_value(json_array_get(c, w));
            t->completed[w] = v > t->completed[w] ? v : t->completed[w];
        }
    psd_cons_touched(t);
    json_t *pr = json_object_get(o, "prune");
    if (!t->sparse) {
        psd_table_own(t, t->lo, t->hi);
        psd_table_wrote(t, t->lo, t->hi);
        if (pr != NULL && psd__snapshot_prune(t, pr) != 0)
            return ps_errf(PS_ENOMEM, err, errlen, "out of memory");
    }
    uint64_t *tick = t->sparse ? calloc(n, sizeof *tick) : NULL;
    if (t->sparse && tick == NULL)
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory");
    if (t->sparse)
        rc = reshard_ticks(t, b, st, n, k, tick, err, errlen);
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        json_t *oi = json_array_get(json_object_get(st[i], "tables"), k);
        rc = t->sparse ? reshard_rows(out, t, &b[i], json_object_get(oi, "tick") != NULL,
                                      t->sp.tick - tick[i], err, errlen)
                       : reshard_dense(t, &b[i], i, n, err, errlen);
    }
    free(tick);
    if (t->sparse) /* the counts start again on the new shards, from the rows they hold */
        t->sp.admitted = t->sp.nrows;
    for (uint64_t e = 0; rc == 0 && t->mask != NULL && e < t->hi - t->lo; e++)
        t->npruned += t->mask[e];
    return rc;
}

int psd_reshard(struct psd_snapshot *out, const char *from, uint32_t shards_from, char *err,
                size_t errlen)
{
    if (shards_from == 0 || shards_from > PS_SHARDS_MAX)
        return ps_errf(PS_EINVAL, err, errlen, "%u shards to read from", shards_from);
    struct psd__blob *b = calloc(shards_from, sizeof *b);
    json_t **st = calloc(shards_from, sizeof *st);
    out->tables = calloc(PS_TABLES_MAX, sizeof *out->tables);
    out->ntables = 0;
    int rc = b && st && out->tables ? 0 : ps_errf(PS_ENOMEM, err, errlen, "out of memory");
    char path[PS_PATH_MAX];
    uint32_t opened = 0;
    for (; rc == 0 && opened < shards_from; opened++)
        rc = psd__snapshot_newest(from, opened, shards_from, &b[opened], &st[opened], path,
                                  sizeof path, err, errlen);
    if (rc == 0)
        rc = check_alike(out, st, shards_from, err, errlen);
    json_t *tables = rc == 0 ? json_object_get(st[0], "tables") : NULL;
    for (size_t k = 0; rc == 0 && k < json_array_size(tables); k++)
        rc = reshard_table(out, b, st, shards_from, k, err, errlen);
    for (uint32_t i = 0; i < opened && st != NULL; i++) {
        json_decref(st[i]);
        psd__blob_free(&b[i]);
    }
    free(st);
    free(b);
    if (rc != 0)
        psd_snapshot_free(out);
    return rc;
}
