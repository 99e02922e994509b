/* A shard's state in a file: writer and validating reader (snapshot.h). */
#include "snapshot_impl.h"

#include "prune.h"

#include "ps_err.h"
#include "ps_safetensors.h"
#include "ps_shard.h"
#include "ps_wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define TENSORS_MAX (PS_TABLES_MAX * 10u)

_Static_assert(PS_TABLE_NAME_MAX + 8 <= PS_ST_NAME_MAX, "tensor names fit");

static void add(struct ps_st_tensor *ts, size_t *n, const char *prefix, const struct psd_table *t,
                const char *dtype, const void *data, size_t esize, uint64_t d0, uint64_t d1)
{
    char name[PS_ST_NAME_MAX];
    snprintf(name, sizeof name, "%s/%s", prefix, t->name);
    ps_st_tensor(&ts[(*n)++], name, dtype, data, esize, d0, d1);
}

static size_t collect(const struct psd_snapshot *s, struct ps_st_tensor *ts)
{
    size_t n = 0;
    for (uint32_t i = 0; i < s->ntables; i++) {
        const struct psd_table *t = s->tables[i];
        if (t->sparse) {
            const struct psd_sparse *sp = &t->sp;
            add(ts, &n, "keys", t, "U64", sp->row_key, 8, sp->nrows, 0);
            add(ts, &n, "w", t, "F32", sp->w, 4, sp->nrows, t->dim);
            if (sp->nstate >= 1)
                add(ts, &n, "s1", t, "F32", sp->s1, 4, sp->nrows, t->dim);
            if (sp->nstate >= 2)
                add(ts, &n, "s2", t, "F32", sp->s2, 4, sp->nrows, t->dim);
            add(ts, &n, "steps", t, "U32", sp->row_steps, 4, sp->nrows, 0);
            if (sp->rowwise)
                add(ts, &n, "rs", t, "F32", sp->rsum, 4, sp->nrows, 0);
            add(ts, &n, "last", t, "U64", sp->last, 8, sp->nrows, 0);
            if (sp->freq != NULL)
                add(ts, &n, "freq", t, "U32", sp->freq, 4, sp->nrows, 0);
            if (sp->tomb_n > 0) { /* oldest first: psd_snapshot_write put them so */
                add(ts, &n, "tomb_keys", t, "U64", sp->tomb_key, 8, sp->tomb_n, 0);
                add(ts, &n, "tomb_ticks", t, "U64", sp->tomb_tick, 8, sp->tomb_n, 0);
            }
            if (sp->sketch != NULL)
                add(ts, &n, "sketch", t, "U8", sp->sketch, 1, 4 * sp->sketch_width, 0);
            continue;
        }
        uint64_t len = t->hi - t->lo;
        add(ts, &n, "w", t, "F32", t->w, 4, len, 0);
        if (t->s1)
            add(ts, &n, "s1", t, "F32", t->s1, 4, len, 0);
        if (t->s2)
            add(ts, &n, "s2", t, "F32", t->s2, 4, len, 0);
        if (t->mask)
            add(ts, &n, "mask", t, "U8", t->mask, 1, len, 0);
    }
    return n;
}

static json_t *table_state(const struct psd_snapshot *s, const struct psd_table *t)
{
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, t->seed);
    json_t *completed = json_array();
    for (uint32_t w = 0; w < s->cons.workers; w++)
        json_array_append_new(completed, json_integer((json_int_t)t->completed[w]));
    json_t *o = json_pack(
        "{s:s, s:I, s:i, s:f, s:f, s:f, s:b, s:f, s:f, s:f, s:i, s:f, s:s, s:i, s:I, s:b, "
        "s:I, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:o}",
        "name", t->name, "size", (json_int_t)t->size, "optimizer", (int)t->optimizer, "lr",
        (double)t->lr, "weight_decay", (double)t->weight_decay, "momentum", (double)t->momentum,
        "nesterov", t->nesterov, "beta1", (double)t->beta1, "beta2", (double)t->beta2, "eps",
        (double)t->eps, "init", (int)t->init, "init_scale", (double)t->init_scale, "seed", seed,
        "lr_schedule", t->lr_schedule, "lr_decay_steps", (json_int_t)t->lr_decay_steps, "sparse",
        t->sparse, "dim", (json_int_t)t->dim, "rows_max", (json_int_t)t->rows_max, "l1",
        (double)t->l1, "l2", (double)t->l2, "steps", (json_int_t)t->steps, "clock",
        (json_int_t)t->clock, "round_begun", (json_int_t)t->round_begun, "pushes",
        (json_int_t)t->pushes, "pulls", (json_int_t)t->pulls, "completed", completed);
    if (o != NULL && t->await_set)
        json_object_set_new(o, "await_set", json_true());
    const struct psd_sparse *sp = &t->sp;
    if (o != NULL && t->sparse) {
        json_object_set_new(o, "admitted", json_integer((json_int_t)sp->admitted));
        json_object_set_new(o, "tick", json_integer((json_int_t)sp->tick));
        json_object_set_new(o, "tombs", json_integer((json_int_t)sp->tomb_n));
        json_object_set_new(o, "tomb_floor", json_integer((json_int_t)sp->tomb_floor));
    }
    if (o != NULL && sp->life) /* the life cycle: its spec, where it is, its counts */
        json_object_set_new(
            o, "life",
            json_pack("{s:I, s:I, s:I, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                      "admit_after", (json_int_t)sp->admit_after, "admit_counters",
                      (json_int_t)(4 * sp->sketch_width), "evict_after",
                      (json_int_t)sp->evict_after, "evict_at_budget", sp->evict_at_budget, "tick",
                      (json_int_t)sp->tick, "age_at", (json_int_t)sp->age_at, "victim_at",
                      (json_int_t)sp->victim_at, "sketch_adds", (json_int_t)sp->sketch_adds,
                      "held_back", (json_int_t)sp->held_back, "evicted_age",
                      (json_int_t)sp->evicted_age, "evicted_budget", (json_int_t)sp->evicted_budget,
                      "refused", (json_int_t)sp->refused, "evict_after_s",
                      (json_int_t)sp->evict_after_s, "age_floor", (json_int_t)sp->age_floor,
                      "evict_half_life", (json_int_t)sp->half_life));
    if (o != NULL && t->ndims > 0) {
        json_t *shape = json_array();
        for (uint32_t i = 0; i < t->ndims; i++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[i]));
        json_object_set_new(o, "shape", shape);
    }
    if (o != NULL && t->npushers > 0) {
        json_t *pushers = json_array();
        for (uint32_t i = 0; i < t->npushers; i++)
            json_array_append_new(pushers, json_integer((json_int_t)t->pushers[i]));
        json_object_set_new(o, "pushers", pushers);
    }
    if (o != NULL && t->mask != NULL)
        json_object_set_new(
            o, "prune",
            json_pack("{s:f, s:I, s:I, s:I, s:I, s:I, s:f}", "target", t->prune.target, "start",
                      (json_int_t)t->prune.start, "end", (json_int_t)t->prune.end, "every",
                      (json_int_t)t->prune.every, "npruned", (json_int_t)t->npruned, "updates",
                      (json_int_t)t->prune_updates, "target_now", t->prune_target_now));
    return o;
}

static json_t *peers_state(const struct psd_snapshot *s)
{
    json_t *peers = json_array();
    for (size_t i = 0; i < s->npeers; i++) {
        const struct psd_snapshot_peer *p = &s->peers[i];
        char sess[32], bits[PS_DEDUP_WINDOW / 4 + 1];
        snprintf(sess, sizeof sess, "%" PRIu64, p->session);
        for (size_t w = 0; w < PS_DEDUP_WINDOW / 64; w++)
            snprintf(bits + 16 * w, 17, "%016" PRIx64, p->has_bits ? p->bits[w] : ~UINT64_C(0));
        json_array_append_new(
            peers, json_pack("{s:I, s:s, s:I, s:s}", "worker", (json_int_t)p->worker_id, "session",
                             sess, "last_applied", (json_int_t)p->last_applied, "applied", bits));
    }
    return peers;
}

static char *state_text(const struct psd_snapshot *s)
{
    char mode[32];
    psd_cons_name(&s->cons, mode, sizeof mode);
    json_t *tables = json_array();
    for (uint32_t i = 0; i < s->ntables; i++)
        json_array_append_new(tables, table_state(s, s->tables[i]));
    json_t *st =
        json_pack("{s:I, s:I, s:s, s:I, s:I, s:o, s:o}", "shard", (json_int_t)s->shard, "shards",
                  (json_int_t)s->shards, "consistency", mode, "workers",
                  (json_int_t)s->cons.workers, "duplicates_dropped",
                  (json_int_t)s->duplicates_dropped, "tables", tables, "peers", peers_state(s));
    if (st != NULL && s->repl_epoch != 0)
        json_object_set_new(st, "replication",
                            json_pack("{s:I, s:I}", "epoch", (json_int_t)s->repl_epoch, "seq",
                                      (json_int_t)s->repl_seq));
    char *text = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    return text;
}

/* seq of a file name of shard `shard` of `shards`, or -1. */
static int64_t file_seq(uint32_t shard, uint32_t shards, const char *name)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "shard-%u-of-%u-", shard, shards);
    size_t pl = strlen(prefix), nl = strlen(name), sl = strlen(".safetensors");
    if (nl != pl + 16 + sl || strncmp(name, prefix, pl) != 0 ||
        strcmp(name + pl + 16, ".safetensors") != 0)
        return -1;
    int64_t v = 0;
    for (size_t i = pl; i < pl + 16; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The newest (at most max) of the checkpoint seqs of shard `shard` of
 * `shards` in dir, newest first; every entry is looked at. Returns how
 * many. */
size_t psd_snapshot_seqs(const char *dir, uint32_t shard, uint32_t shards, int64_t *seqs,
                         size_t max)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        int64_t v = file_seq(shard, shards, e->d_name);
        if (v < 0)
            continue;
        if (n < max) {
            seqs[n++] = v;
            continue;
        }
        size_t low = 0; /* replace the oldest kept, if this one is newer */
        for (size_t i = 1; i < n; i++)
            low = seqs[i] < seqs[low] ? i : low;
        if (v > seqs[low])
            seqs[low] = v;
    }
    if (d != NULL)
        closedir(d);
    qsort(seqs, n, sizeof *seqs, cmp_desc);
    return n;
}

void psd_snapshot_path(const char *dir, uint32_t shard, uint32_t shards, int64_t seq, char *path,
                       size_t len)
{
    snprintf(path, len, "%s/shard-%u-of-%u-%016" PRId64 ".safetensors", dir, shard, shards, seq);
}

int psd_snapshot_write(const struct psd_snapshot *s, const char *dir, char *path, size_t pathlen,
                       char *err, size_t errlen)
{
    struct ps_st_tensor *ts = calloc(TENSORS_MAX, sizeof *ts);
    char *state = state_text(s);
    int rc = PS_ENOMEM;
    if (ts == NULL || state == NULL) {
        snprintf(err, errlen, "checkpoint: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < s->ntables; i++) /* rotating the ring changes no content */
        if (s->tables[i]->sparse && psd_sparse_tombs_linear(&s->tables[i]->sp) != 0) {
            snprintf(err, errlen, "checkpoint: out of memory");
            rc = PS_ENOMEM;
            goto out;
        }
    size_t n = collect(s, ts);
    unsigned long crc = crc32(0L, Z_NULL, 0);
    for (size_t i = 0; i < n; i++)
        if (ts[i].bytes > 0 && ts[i].data != NULL)
            crc = crc32_z(crc, ts[i].data, ts[i].bytes);
    crc = crc32_z(crc, (const unsigned char *)state, strlen(state)); /* version 2: the state too */
    char crcs[16];
    snprintf(crcs, sizeof crcs, "%08lx", crc);
    const char *meta[] = {"format", "psd-checkpoint", "version", "2", "crc32",
                          crcs,     "state",          state};
    int64_t seqs[1];
    size_t have = psd_snapshot_seqs(dir, s->shard, s->shards, seqs, 1);
    psd_snapshot_path(dir, s->shard, s->shards, have ? seqs[0] + 1 : 1, path, pathlen);
    if ((rc = ps_st_write(path, ts, n, meta, 8, err, errlen)) != 0)
        goto out;
    int64_t all[64]; /* keep the newest few */
    size_t m = psd_snapshot_seqs(dir, s->shard, s->shards, all, 64);
    for (size_t i = PSD_SNAPSHOT_KEEP; i < m; i++) {
        char old[PS_PATH_MAX];
        psd_snapshot_path(dir, s->shard, s->shards, all[i], old, sizeof old);
        unlink(old);
    }
    rc = 0;
out:
    free(ts);
    free(state);
    return rc;
}

/* ---- restore ------------------------------------------------------------ */

/* The bytes of tensor prefix/name, checked for dtype and size. */
const void *psd__blob_tensor(const struct psd__blob *b, const char *prefix, const char *name,
                             const char *dtype, size_t bytes, char *err, size_t errlen)
{
    char key[PS_TABLE_NAME_MAX + 8];
    snprintf(key, sizeof key, "%s/%s", prefix, name);
    json_t *t = json_object_get(b->hdr, key);
    json_t *offs = t ? json_object_get(t, "data_offsets") : NULL;
    const char *dt = t ? json_string_value(json_object_get(t, "dtype")) : NULL;
    json_int_t a = json_integer_value(json_array_get(offs, 0));
    json_int_t z = json_integer_value(json_array_get(offs, 1));
    if (t == NULL || dt == NULL || strcmp(dt, dtype) != 0 || a < 0 || z < a ||
        (uint64_t)z > b->dlen || (size_t)(z - a) != bytes) {
        ps_errf(PS_EPROTO, err, errlen, "tensor '%s' is missing or not %zu bytes of %s", key, bytes,
                dtype);
        return NULL;
    }
    return b->data + a;
}

static int load_blob(const char *path, struct psd__blob *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ps_errf(PS_EPROTO, err, errlen, "cannot open it: %s", strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 8) {
        fclose(f);
        return ps_errf(PS_EPROTO, err, errlen, "shorter than a header");
    }
    b->size = (size_t)st.st_size;
    b->buf = malloc(b->size);
    int ok = b->buf && fread(b->buf, 1, b->size, f) == b->size;
    fclose(f);
    if (!ok)
        return ps_errf(PS_EPROTO, err, errlen, "cannot read %zu bytes", b->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b->buf[i];
    if (n > PSD_SNAPSHOT_HEADER_MAX || n > b->size - 8)
        return ps_errf(PS_EPROTO, err, errlen,
                       "header length %" PRIu64 " does not fit the file (%zu bytes)", n, b->size);
    json_error_t je;
    b->hdr = json_loadb((const char *)b->buf + 8, (size_t)n, 0, &je);
    if (b->hdr == NULL)
        return ps_errf(PS_EPROTO, err, errlen, "header is not JSON: %s", je.text);
    b->data = b->buf + 8 + n;
    b->dlen = b->size - 8 - (size_t)n;
    return 0;
}

void psd__blob_free(struct psd__blob *b)
{
    json_decref(b->hdr);
    free(b->buf);
    memset(b, 0, sizeof *b); /* freeing it again is a no-op */
}

uint64_t psd__json_u64(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_string(v))
        return strtoull(json_string_value(v), NULL, 10);
    json_int_t i = json_integer_value(v);
    return i > 0 ? (uint64_t)i : 0;
}

/* A worker's applied window, as state_text writes it: 0, or -1. */
static int parse_bits(const char *hex, uint64_t *bits)
{
    if (strlen(hex) != PS_DEDUP_WINDOW / 4)
        return -1;
    for (size_t w = 0; w < PS_DEDUP_WINDOW / 64; w++) {
        uint64_t v = 0;
        for (size_t k = 0; k < 16; k++) {
            char ch = hex[16 * w + k];
            int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
            if (d < 0)
                return -1;
            v = v << 4 | (uint64_t)d;
        }
        bits[w] = v;
    }
    return 0;
}

static float f_of(json_t *o, const char *k)
{
    return (float)json_number_value(json_object_get(o, k));
}

/* A sparse table's ticks: each row's last push and the table's count,
 * the tombstones, and with a life cycle the sketch, where the evictions
 * are and what they counted. A file written before ticks were kept has
 * none: the rows start at tick 0. */
static int restore_life(struct psd_table *t, const struct psd__blob *b, json_t *o, uint64_t rows,
                        char *err, size_t errlen)
{
    struct psd_sparse *sp = &t->sp;
    json_t *adm = json_object_get(o, "admitted");
    sp->admitted = adm != NULL ? psd__json_u64(o, "admitted") : rows; /* older files: their rows */
    if (json_object_get(o, "tick") == NULL)
        return 0;
    sp->tick = psd__json_u64(o, "tick");
    sp->tomb_floor = psd__json_u64(o, "tomb_floor");
    const unsigned char *last = psd__blob_tensor(b, "last", t->name, "U64", rows * 8, err, errlen);
    if (last == NULL)
        return PS_EPROTO;
    memcpy(sp->last, last, rows * 8);
    if (sp->half_life != 0 && rows > 0) { /* each row's decayed count */
        const void *f = psd__blob_tensor(b, "freq", t->name, "U32", rows * 4, err, errlen);
        if (f == NULL)
            return PS_EPROTO;
        memcpy(sp->freq, f, rows * 4);
    }
    for (uint64_t r = 0; r < rows; r++)
        if (sp->last[r] > sp->tick)
            return ps_errf(PS_EPROTO, err, errlen,
                           "'%s': row %" PRIu64 " was pushed at tick %" PRIu64
                           ", after the table's %" PRIu64,
                           t->name, r, sp->last[r], sp->tick);
    uint64_t tombs = psd__json_u64(o, "tombs");
    if (tombs > PSD_TOMBS_MAX)
        return ps_errf(PS_EPROTO, err, errlen, "'%s': %" PRIu64 " tombstones, over %" PRIu64,
                       t->name, tombs, (uint64_t)PSD_TOMBS_MAX);
    if (tombs > 0) {
        const void *tk = psd__blob_tensor(b, "tomb_keys", t->name, "U64", tombs * 8, err, errlen);
        const void *tt =
            tk ? psd__blob_tensor(b, "tomb_ticks", t->name, "U64", tombs * 8, err, errlen) : NULL;
        if (tt == NULL)
            return PS_EPROTO;
        int rc = psd_sparse_tombs_restore(sp, tk, tt, tombs);
        if (rc != 0)
            return ps_errf(rc, err, errlen, "'%s': cannot keep its %" PRIu64 " tombstones", t->name,
                           tombs);
    }
    json_t *life = json_object_get(o, "life");
    if (!sp->life || life == NULL)
        return 0;
    if (sp->sketch != NULL) {
        const void *sk =
            psd__blob_tensor(b, "sketch", t->name, "U8", 4 * sp->sketch_width, err, errlen);
        if (sk == NULL)
            return PS_EPROTO;
        memcpy(sp->sketch, sk, 4 * sp->sketch_width);
    }
    sp->age_at = psd__json_u64(life, "age_at");
    sp->victim_at = psd__json_u64(life, "victim_at");
    sp->sketch_adds = psd__json_u64(life, "sketch_adds");
    sp->held_back = psd__json_u64(life, "held_back");
    sp->evicted_age = psd__json_u64(life, "evicted_age");
    sp->evicted_budget = psd__json_u64(life, "evicted_budget");
    sp->refused = psd__json_u64(life, "refused");
    uint64_t floor = psd__json_u64(life, "age_floor");
    if (psd_sparse_set_floor(sp, floor) != 0)
        return ps_errf(PS_EPROTO, err, errlen,
                       "'%s': age_floor %" PRIu64 " is past its tick %" PRIu64, t->name, floor,
                       sp->tick);
    return 0;
}

static int restore_rows(struct psd_table *t, const struct psd__blob *b, json_t *o, char *err,
                        size_t errlen)
{
    uint64_t rows = psd__blob_rows(b, t->name);
    if (rows > t->rows_max)
        return ps_errf(PS_EPROTO, err, errlen, "'%s' has %" PRIu64 " rows, over its rows_max",
                       t->name, rows);
    size_t d = t->dim;
    const uint64_t *keys = psd__blob_tensor(b, "keys", t->name, "U64", rows * 8, err, errlen);
    const float *w =
        keys ? psd__blob_tensor(b, "w", t->name, "F32", rows * d * 4, err, errlen) : NULL;
    const uint32_t *steps =
        w ? psd__blob_tensor(b, "steps", t->name, "U32", rows * 4, err, errlen) : NULL;
    const float *s1 = NULL, *s2 = NULL;
    if (steps && t->sp.nstate >= 1)
        s1 = psd__blob_tensor(b, "s1", t->name, "F32", rows * d * 4, err, errlen);
    if (steps && t->sp.nstate >= 2)
        s2 = psd__blob_tensor(b, "s2", t->name, "F32", rows * d * 4, err, errlen);
    const float *rs = NULL;
    if (steps && t->sp.rowwise &&
        (rs = psd__blob_tensor(b, "rs", t->name, "F32", rows * 4, err, errlen)) == NULL)
        return PS_EPROTO;
    if (!steps || (t->sp.nstate >= 1 && !s1) || (t->sp.nstate >= 2 && !s2))
        return PS_EPROTO;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t k;
        memcpy(&k, (const unsigned char *)keys + r * 8, 8);
        int64_t row = psd_sparse_row(&t->sp, k, 1);
        if (row != (int64_t)r)
            return ps_errf(PS_EPROTO, err, errlen, "'%s': key %" PRIu64 " twice or out of room",
                           t->name, k);
        memcpy(t->sp.w + r * d, w + r * d, d * 4);
        if (s1)
            memcpy(t->sp.s1 + r * d, s1 + r * d, d * 4);
        if (s2)
            memcpy(t->sp.s2 + r * d, s2 + r * d, d * 4);
        memcpy(&t->sp.row_steps[r], (const unsigned char *)steps + r * 4, 4);
        if (rs != NULL)
            memcpy(&t->sp.rsum[r], (const unsigned char *)rs + r * 4, 4);
    }
    return restore_life(t, b, o, rows, err, errlen);
}

static int restore_dense(struct psd_table *t, const struct psd__blob *b, json_t *o, char *err,
                         size_t errlen)
{
    size_t n = (size_t)(t->hi - t->lo);
    const float *w = psd__blob_tensor(b, "w", t->name, "F32", n * 4, err, errlen);
    if (w == NULL)
        return PS_EPROTO;
    psd_table_own(t, t->lo, t->hi);
    psd_table_wrote(t, t->lo, t->hi);
    memcpy(t->w, w, n * 4);
    float *st[2] = {t->s1, t->s2};
    for (int a = 0; a < 2; a++) {
        if (st[a] == NULL)
            continue;
        const float *v = psd__blob_tensor(b, a ? "s2" : "s1", t->name, "F32", n * 4, err, errlen);
        if (v == NULL)
            return PS_EPROTO;
        memcpy(st[a], v, n * 4);
    }
    json_t *pr = json_object_get(o, "prune");
    if (pr != NULL) {
        if (psd__snapshot_prune(t, pr) != 0)
            return PS_ENOMEM;
        const uint8_t *mask = psd__blob_tensor(b, "mask", t->name, "U8", n, err, errlen);
        if (mask == NULL)
            return PS_EPROTO;
        memcpy(t->mask, mask, n);
        t->npruned = psd__json_u64(pr, "npruned");
    }
    return 0;
}

int psd__snapshot_prune(struct psd_table *t, json_t *pr)
{
    struct psd_prune_spec ps = {.target = json_number_value(json_object_get(pr, "target")),
                                .start = psd__json_u64(pr, "start"),
                                .end = psd__json_u64(pr, "end"),
                                .every = psd__json_u64(pr, "every")};
    snprintf(ps.table, sizeof ps.table, "%s", t->name);
    if (psd_table_enable_prune(t, &ps) != 0)
        return PS_ENOMEM;
    t->prune_updates = psd__json_u64(pr, "updates");
    t->prune_target_now = json_number_value(json_object_get(pr, "target_now"));
    return 0;
}

void psd__table_free(const struct psd_snapshot *s, struct psd_table *t)
{
    psd_cons_table_fini(&s->cons, t);
    psd_table_destroy(t);
}

int psd__snapshot_table(const struct psd_snapshot *s, json_t *o, uint32_t id,
                        uint64_t table_bytes_max, struct psd_table **out, char *err, size_t errlen)
{
    Ps__TableSpec spec;
    ps__table_spec__init(&spec);
    spec.name = (char *)json_string_value(json_object_get(o, "name"));
    if (spec.name == NULL)
        return ps_errf(PS_EPROTO, err, errlen, "a table without a name");
    spec.size = psd__json_u64(o, "size");
    spec.optimizer = (Ps__OptimizerKind)json_integer_value(json_object_get(o, "optimizer"));
    spec.lr = f_of(o, "lr");
    spec.weight_decay = f_of(o, "weight_decay");
    spec.momentum = f_of(o, "momentum");
    spec.nesterov = json_is_true(json_object_get(o, "nesterov"));
    spec.beta1 = f_of(o, "beta1");
    spec.beta2 = f_of(o, "beta2");
    spec.eps = f_of(o, "eps");
    spec.init = (Ps__InitKind)json_integer_value(json_object_get(o, "init"));
    spec.init_scale = f_of(o, "init_scale");
    spec.seed = psd__json_u64(o, "seed");
    spec.lr_schedule = (Ps__LrSchedule)json_integer_value(json_object_get(o, "lr_schedule"));
    spec.lr_decay_steps = psd__json_u64(o, "lr_decay_steps");
    spec.sparse = json_is_true(json_object_get(o, "sparse"));
    spec.dim = (uint32_t)psd__json_u64(o, "dim");
    spec.rows_max = psd__json_u64(o, "rows_max");
    spec.l1 = f_of(o, "l1");
    spec.l2 = f_of(o, "l2");
    spec.await_set = json_is_true(json_object_get(o, "await_set"));
    json_t *life = json_object_get(o, "life");
    if (life != NULL) {
        spec.admit_after = (uint32_t)psd__json_u64(life, "admit_after");
        spec.admit_counters = spec.admit_after > 1 ? psd__json_u64(life, "admit_counters") : 0;
        spec.evict_after = psd__json_u64(life, "evict_after");
        spec.evict_at_budget = json_is_true(json_object_get(life, "evict_at_budget"));
        spec.evict_after_s = psd__json_u64(life, "evict_after_s"); /* 0 in older files */
        spec.evict_half_life = psd__json_u64(life, "evict_half_life");
    }
    uint64_t shape[PS_SHAPE_DIMS_MAX];
    json_t *js = json_object_get(o, "shape");
    if (js != NULL && (!json_is_array(js) || json_array_size(js) > PS_SHAPE_DIMS_MAX))
        return ps_errf(PS_EPROTO, err, errlen, "'%s': shape is not a list of at most %u dimensions",
                       spec.name, PS_SHAPE_DIMS_MAX);
    for (size_t i = 0; js != NULL && i < json_array_size(js); i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 1)
            return ps_errf(PS_EPROTO, err, errlen,
                           "'%s': dimension %zu of its shape is not a positive integer", spec.name,
                           i);
        shape[i] = (uint64_t)json_integer_value(d);
    }
    spec.n_shape = js != NULL ? json_array_size(js) : 0;
    spec.shape = shape;
    uint32_t pushers[PS_WORKERS_MAX]; /* 16 KiB: psd_table_create copies them */
    json_t *jp = json_object_get(o, "pushers");
    if (jp != NULL && (!json_is_array(jp) || json_array_size(jp) > PS_WORKERS_MAX))
        return ps_errf(PS_EPROTO, err, errlen, "'%s': pushers is not a list of at most %u ids",
                       spec.name, PS_WORKERS_MAX);
    for (size_t i = 0; jp != NULL && i < json_array_size(jp); i++) {
        json_t *d = json_array_get(jp, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            json_integer_value(d) >= PS_WORKERS_MAX)
            return ps_errf(PS_EPROTO, err, errlen, "'%s': pusher %zu is not a worker id", spec.name,
                           i);
        pushers[i] = (uint32_t)json_integer_value(d);
    }
    spec.n_pushers = jp != NULL ? json_array_size(jp) : 0;
    spec.pushers = pushers;
    char why[PS_ERROR_TEXT_MAX];
    if (ps_wire_check_spec(&spec, why, sizeof why) != 0)
        return ps_errf(PS_EPROTO, err, errlen, "%s", why);
    json_t *completed = json_object_get(o, "completed");
    if (json_array_size(completed) != s->cons.workers)
        return ps_errf(PS_EPROTO, err, errlen, "'%s' was saved for %zu workers, this server has %u",
                       spec.name, json_array_size(completed), s->cons.workers);
    if (psd_cons_check_pushers(&s->cons, &spec, why, sizeof why) != 0)
        return ps_errf(PS_EPROTO, err, errlen, "%s", why);
    uint64_t bytes = psd_table_bytes_for(&spec, s->shard, s->shards);
    if (bytes > table_bytes_max)
        return ps_errf(PS_ELIMIT, err, errlen,
                       "table '%s' would take %" PRIu64
                       " bytes, over psd --max-table-bytes %" PRIu64,
                       spec.name, bytes, table_bytes_max);
    struct psd_table *t = NULL;
    if (psd_table_create_unfilled(&spec, id, s->shard, s->shards, &t) != 0)
        return ps_errf(PS_EPROTO, err, errlen, "cannot allocate table '%s'", spec.name);
    if (psd_cons_table_init(&s->cons, t) != 0) {
        psd__table_free(s, t);
        return ps_errf(PS_EPROTO, err, errlen, "cannot allocate table '%s'", spec.name);
    }
    t->steps = psd__json_u64(o, "steps");
    t->clock = psd__json_u64(o, "clock");
    t->round_begun = psd__json_u64(o, "round_begun");
    t->pushes = psd__json_u64(o, "pushes");
    t->restored = t->recovering = 1;
    t->set_next = t->hi; /* restored weights are set */
    t->pulls = psd__json_u64(o, "pulls");
    for (uint32_t w = 0; w < s->cons.workers; w++)
        t->completed[w] = (uint64_t)json_integer_value(json_array_get(completed, w));
    psd_cons_touched(t);
    *out = t;
    return 0;
}

/* Table id of s from its saved state o and b's tensors, into s. */
static int restore_table(struct psd_snapshot *s, const struct psd__blob *b, json_t *o,
                         uint64_t table_bytes_max, char *err, size_t errlen)
{
    struct psd_table *t = NULL;
    int rc = psd__snapshot_table(s, o, s->ntables, table_bytes_max, &t, err, errlen);
    if (rc != 0)
        return rc;
    s->tables[s->ntables++] = t; /* freed with s if what follows fails */
    return t->sparse ? restore_rows(t, b, o, err, errlen) : restore_dense(t, b, o, err, errlen);
}

/* Reads a checkpoint file and checks what does not depend on the shard
 * reading it: the format, the version, the checksum, the state's JSON.
 * On success *st holds the state (the caller frees it and the blob). */
int psd__snapshot_open(const char *path, struct psd__blob *b, json_t **st, char *err, size_t errlen)
{
    *st = NULL;
    int rc = load_blob(path, b, err, errlen);
    if (rc != 0)
        return rc;
    json_t *meta = json_object_get(b->hdr, "__metadata__");
    const char *fmt = json_string_value(json_object_get(meta, "format"));
    const char *crcs = json_string_value(json_object_get(meta, "crc32"));
    const char *state = json_string_value(json_object_get(meta, "state"));
    if (fmt == NULL || strcmp(fmt, "psd-checkpoint") != 0 || crcs == NULL || state == NULL)
        return ps_errf(PS_EPROTO, err, errlen,
                       "not a psd checkpoint (metadata format, crc32, state)");
    /* version 1 summed the tensors only; 2 sums the state after them */
    const char *version = json_string_value(json_object_get(meta, "version"));
    int v2 = version != NULL && strcmp(version, "2") == 0;
    if (!v2 && (version == NULL || strcmp(version, "1") != 0))
        return ps_errf(PS_EPROTO, err, errlen, "checkpoint version '%s': this psd reads 1 and 2",
                       version ? version : "(none)");
    unsigned long want = strtoul(crcs, NULL, 16);
    unsigned long got = crc32_z(crc32(0L, Z_NULL, 0), b->data, b->dlen);
    if (v2)
        got = crc32_z(got, (const unsigned char *)state, strlen(state));
    if (want != got)
        return ps_errf(PS_EPROTO, err, errlen, "checksum of the %s %08lx, the header says %08lx",
                       v2 ? "tensors and state" : "tensors", got, want);
    json_error_t je;
    if ((*st = json_loads(state, 0, &je)) == NULL)
        return ps_errf(PS_EPROTO, err, errlen, "state is not JSON: %s", je.text);
    json_t *tables = json_object_get(*st, "tables");
    if (json_array_size(tables) > PS_TABLES_MAX)
        return ps_errf(PS_EPROTO, err, errlen, "more than %u tables", PS_TABLES_MAX);
    return 0;
}

/* The workers' records of state st into s->peers. */
static int restore_peers(struct psd_snapshot *s, json_t *st, char *err, size_t errlen)
{
    json_t *peers = json_object_get(st, "peers");
    size_t n = json_array_size(peers);
    if (n > PS_WORKERS_MAX)
        return ps_errf(PS_EPROTO, err, errlen, "%zu workers' records, over %u", n, PS_WORKERS_MAX);
    s->peers = calloc(n ? n : 1, sizeof *s->peers);
    if (s->peers == NULL)
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory for %zu workers' records", n);
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(peers, i);
        struct psd_snapshot_peer *e = &s->peers[s->npeers++];
        const char *hex = json_string_value(json_object_get(p, "applied"));
        if (hex != NULL && parse_bits(hex, e->bits) != 0)
            return ps_errf(PS_EPROTO, err, errlen, "peer %zu: 'applied' is not %u hex digits", i,
                           PS_DEDUP_WINDOW / 4);
        e->has_bits = hex != NULL;
        e->worker_id = (uint32_t)psd__json_u64(p, "worker");
        e->session = psd__json_u64(p, "session");
        e->last_applied = psd__json_u64(p, "last_applied");
    }
    return 0;
}

int psd_snapshot_read(struct psd_snapshot *s, const char *path, uint64_t table_bytes_max, char *err,
                      size_t errlen)
{
    struct psd__blob b;
    json_t *st = NULL;
    s->tables = NULL;
    s->ntables = 0;
    s->peers = NULL;
    s->npeers = 0;
    s->duplicates_dropped = 0;
    s->repl_epoch = s->repl_seq = 0;
    int rc = psd__snapshot_open(path, &b, &st, err, errlen);
    if (rc != 0)
        goto out;
    if (psd__json_u64(st, "shard") != s->shard || psd__json_u64(st, "shards") != s->shards) {
        rc = ps_errf(PS_EPROTO, err, errlen,
                     "it is shard %" PRIu64 " of %" PRIu64 ", this is %u of %u",
                     psd__json_u64(st, "shard"), psd__json_u64(st, "shards"), s->shard, s->shards);
        goto out;
    }
    json_t *tables = json_object_get(st, "tables");
    s->tables = calloc(PS_TABLES_MAX, sizeof *s->tables);
    if (s->tables == NULL)
        rc = ps_errf(PS_ENOMEM, err, errlen, "out of memory");
    for (size_t i = 0; rc == 0 && i < json_array_size(tables); i++)
        rc = restore_table(s, &b, json_array_get(tables, i), table_bytes_max, err, errlen);
    if (rc == 0)
        rc = restore_peers(s, st, err, errlen);
    if (rc == 0) {
        s->duplicates_dropped = psd__json_u64(st, "duplicates_dropped");
        json_t *at = json_object_get(st, "replication");
        s->repl_epoch = json_is_object(at) ? psd__json_u64(at, "epoch") : 0;
        s->repl_seq = json_is_object(at) ? psd__json_u64(at, "seq") : 0;
    }
out:
    if (rc != 0)
        psd_snapshot_free(s);
    json_decref(st);
    psd__blob_free(&b);
    return rc;
}

void psd_snapshot_free(struct psd_snapshot *s)
{
    for (uint32_t i = 0; s->tables != NULL && i < s->ntables; i++)
        psd__table_free(s, s->tables[i]);
    free(s->tables);
    free(s->peers);
    s->tables = NULL;
    s->peers = NULL;
    s->ntables = 0;
    s->npeers = 0;
}

size_t psd_snapshot_found(const char *dir, char *what, size_t len)
{
    DIR *d = opendir(dir);
    size_t files = 0, used = 0, kinds = 0;
    unsigned seen[8][2];
    struct dirent *e;
    what[0] = '\0';
    while (d != NULL && (e = readdir(d)) != NULL) {
        unsigned shard = 0, shards = 0;
        char tail[32];
        if (sscanf(e->d_name, "shard-%u-of-%u-%31s", &shard, &shards, tail) != 3 ||
            strstr(tail, ".safetensors") == NULL)
            continue;
        files++;
        size_t k = 0;
        while (k < kinds && (seen[k][0] != shard || seen[k][1] != shards))
            k++;
        if (k < kinds || kinds == sizeof seen / sizeof seen[0])
            continue; /* named already, or enough named */
        seen[kinds][0] = shard;
        seen[kinds++][1] = shards;
        if (used < len)
            used += (size_t)snprintf(what + used, len - used, "%sshard %u of %u",
                                     kinds > 1 ? ", " : "", shard, shards);
    }
    if (d != NULL)
        closedir(d);
    return files;
}

int psd__snapshot_newest(const char *dir, uint32_t shard, uint32_t shards, struct psd__blob *b,
                         json_t **st, char *path, size_t pathlen, char *err, size_t errlen)
{
    int64_t seqs[64];
    size_t n = psd_snapshot_seqs(dir, shard, shards, seqs, 64);
    char why[512] = "", cur[512]; /* why: what was wrong with the newest */
    for (size_t i = 0; i < n; i++) {
        psd_snapshot_path(dir, shard, shards, seqs[i], path, pathlen);
        int rc = psd__snapshot_open(path, b, st, cur, sizeof cur);
        if (rc == 0 && psd__json_u64(*st, "shard") == shard &&
            psd__json_u64(*st, "shards") == shards)
            return 0;
        if (rc == 0)
            snprintf(cur, sizeof cur, "its state says shard %" PRIu64 " of %" PRIu64,
                     psd__json_u64(*st, "shard"), psd__json_u64(*st, "shards"));
        if (i == 0)
            snprintf(why, sizeof why, "%s", cur);
        json_decref(*st);
        *st = NULL;
        psd__blob_free(b);
    }
    if (why[0] != '\0')
        return ps_errf(PS_EIO, err, errlen,
                       "%s holds no valid checkpoint of shard %u of %u (the newest: %s)", dir,
                       shard, shards, why);
    return ps_errf(PS_EIO, err, errlen, "%s holds no checkpoint of shard %u of %u", dir, shard,
                   shards);
}

int psd_snapshot_params(const char *dir, uint32_t *shards, struct psd_cons *cons, char *err,
                        size_t errlen)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return ps_errf(PS_EIO, err, errlen, "cannot read %s: %s", dir, strerror(errno));
    unsigned n = 0;
    int mixed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned shard, count;
        char tail[32];
        if (sscanf(e->d_name, "shard-%u-of-%u-%31s", &shard, &count, tail) != 3 ||
            strstr(tail, ".safetensors") == NULL || count == 0 || count > PS_SHARDS_MAX)
            continue;
        mixed |= n != 0 && count != n;
        n = n ? n : count;
    }
    closedir(d);
    char what[256];
    if (mixed) {
        psd_snapshot_found(dir, what, sizeof what);
        return ps_errf(PS_EINVAL, err, errlen,
                       "%s holds checkpoints of more than one shard count (%s): keep one set", dir,
                       what);
    }
    if (n == 0)
        return ps_errf(PS_EIO, err, errlen, "%s holds no psd checkpoint", dir);
    struct psd__blob b;
    json_t *st = NULL;
    char path[PS_PATH_MAX];
    int rc = psd__snapshot_newest(dir, 0, n, &b, &st, path, sizeof path, err, errlen);
    if (rc != 0)
        return rc;
    const char *mode = json_string_value(json_object_get(st, "consistency"));
    if (mode == NULL || psd_cons_parse(mode, cons) != 0)
        rc = ps_errf(PS_EPROTO, err, errlen, "%s: consistency '%s' is not one psd knows", path,
                     mode ? mode : "(none)");
    cons->workers = (uint32_t)psd__json_u64(st, "workers");
    *shards = n;
    json_decref(st);
    psd__blob_free(&b);
    return rc;
}

uint64_t psd__blob_rows(const struct psd__blob *b, const char *name)
{
    char key[PS_TABLE_NAME_MAX + 8];
    snprintf(key, sizeof key, "keys/%s", name);
    return (uint64_t)json_integer_value(
        json_array_get(json_object_get(json_object_get(b->hdr, key), "shape"), 0));
}
