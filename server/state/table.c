/* Dense table storage and the optimizer loops over psk_math.h. */
#include "table.h"
#include "ps_clock.h"

#include "psk_optim.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_local.h"
#include "ps_mem.h"
#include "ps_pool.h"
#include "ps_shard.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

const char *psd_optimizer_name(int kind)
{
    return psk_optim_name(kind);
}

/* Keyed pushes land on random places in big tables: huge pages keep the
 * TLB from missing on every few keys (ps_alloc_big). */
static float *alloc_floats(uint64_t n, int zero)
{
    return ps_alloc_big((size_t)n * sizeof(float), zero);
}

uint64_t psd_table_bytes_for(const Ps__TableSpec *spec, uint32_t shard, uint32_t shards)
{
    uint64_t lo = 0, hi = 0;
    if (!spec->sparse)
        ps_shard_range(spec->size, shards, shard, &lo, &hi);
    uint64_t elems = spec->sparse ? spec->rows_max * spec->dim : hi - lo;
    uint64_t life = 0; /* the sketch, and each row's last push */
    if (spec->sparse)  /* each row's tick; the sketch; tombstones once rows are evicted */
        life = spec->rows_max * sizeof(uint64_t) +
               (spec->admit_after > 1
                    ? (spec->admit_counters ? spec->admit_counters : PS_ADMIT_COUNTERS_DEFAULT)
                    : 0) +
               (spec->evict_after || spec->evict_at_budget || spec->evict_after_s
                    ? 16 * (spec->rows_max < 4096            ? 4096
                            : spec->rows_max < PSD_TOMBS_MAX ? spec->rows_max
                                                             : PSD_TOMBS_MAX)
                    : 0);
    uint64_t rowwise = spec->optimizer == PS__OPTIMIZER_KIND__OPT_ROWWISE_ADAGRAD
                           ? spec->rows_max * sizeof(float) /* a float of state a row */
                           : 0;
    if (spec->sparse && spec->evict_half_life && spec->evict_at_budget)
        life += spec->rows_max * sizeof(uint32_t); /* each row's decayed count */
    return elems * 4u * (1u + (uint64_t)psk_optim_state_arrays((int)spec->optimizer)) + life +
           rowwise;
}

/* fill: the weights from the spec's initialiser and the optimizer state
 * zeroed; without it (a restore, which writes every element) neither. */
static int create(const Ps__TableSpec *spec, uint32_t id, uint32_t shard, uint32_t shards, int fill,
                  struct psd_table **out)
{
    *out = NULL;
    struct psd_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return PS_ENOMEM;
    snprintf(t->name, sizeof t->name, "%s", spec->name);
    t->id = id;
    t->size = spec->size;
    ps_shard_range(spec->size, shards, shard, &t->lo, &t->hi);
    t->optimizer = spec->optimizer;
    t->lr = spec->lr;
    t->weight_decay = spec->weight_decay;
    t->momentum = spec->momentum;
    t->nesterov = spec->nesterov ? 1 : 0;
    t->beta1 = spec->beta1;
    t->beta2 = spec->beta2;
    t->eps = spec->eps;
    t->init = spec->init;
    t->init_scale = spec->init_scale;
    t->seed = spec->seed;
    t->lr_schedule = (int)spec->lr_schedule;
    t->lr_decay_steps = spec->lr_decay_steps;
    t->l1 = spec->l1;
    t->l2 = spec->l2;
    t->version = 1; /* 0: a client that holds nothing */
    t->generation = ps_random_id();
    t->await_set = spec->await_set && !spec->sparse;
    t->set_next = t->lo;                /* nothing set yet */
    t->ndims = (uint32_t)spec->n_shape; /* checked: at most PS_SHAPE_DIMS_MAX */
    for (uint32_t i = 0; i < t->ndims; i++)
        t->shape[i] = spec->shape[i];
    if (spec->n_pushers > 0) { /* checked: dense, at most PS_WORKERS_MAX, increasing */
        t->pushers = malloc(spec->n_pushers * sizeof *t->pushers);
        if (t->pushers == NULL) {
            free(t);
            return PS_ENOMEM;
        }
        memcpy(t->pushers, spec->pushers, spec->n_pushers * sizeof *t->pushers);
        t->npushers = (uint32_t)spec->n_pushers;
    }
    if (spec->sparse) {
        t->sparse = 1;
        t->dim = spec->dim;
        t->rows_max = spec->rows_max;
        t->lo = t->hi = 0;
        int rc = psd_sparse_init(&t->sp, spec->dim, spec->rows_max,
                                 psk_optim_state_arrays((int)spec->optimizer), (int)spec->init,
                                 spec->init_scale, spec->seed);
        t->sp.rowwise = spec->optimizer == PS__OPTIMIZER_KIND__OPT_ROWWISE_ADAGRAD;
        if (rc == 0)
            rc = psd_sparse_life(&t->sp, spec->admit_after, spec->admit_counters, spec->evict_after,
                                 spec->evict_at_budget, spec->evict_after_s, spec->evict_half_life);
        if (rc != 0) {
            psd_sparse_fini(&t->sp);
            free(t->pushers);
            free(t);
            return rc;
        }
        *out = t;
        return 0;
    }
    uint64_t n = t->hi - t->lo;
    int ns = psk_optim_state_arrays((int)t->optimizer);
    t->w = alloc_floats(n, 0);
    t->s1 = ns >= 1 ? alloc_floats(n, fill) : NULL;
    t->s2 = ns >= 2 ? alloc_floats(n, fill) : NULL;
    if (t->w == NULL || (ns >= 1 && t->s1 == NULL) || (ns >= 2 && t->s2 == NULL)) {
        psd_table_destroy(t);
        return PS_ENOMEM;
    }
    if (fill)
        ps_init_fill(t->w, (size_t)n, (enum ps_init_kind)t->init, t->init_scale, t->seed, t->lo);
    *out = t;
    return 0;
}

int psd_table_create(const Ps__TableSpec *spec, uint32_t id, uint32_t shard, uint32_t shards,
                     struct psd_table **out)
{
    return create(spec, id, shard, shards, 1, out);
}

int psd_table_create_unfilled(const Ps__TableSpec *spec, uint32_t id, uint32_t shard,
                              uint32_t shards, struct psd_table **out)
{
    return create(spec, id, shard, shards, 0, out);
}

int psd_table_enable_prune(struct psd_table *t, const struct psd_prune_spec *spec)
{
    size_t n = (size_t)(t->hi - t->lo);
    t->mask = calloc(n ? n : 1, 1);
    t->prune_scratch = malloc((n ? n : 1) * sizeof(float));
    if (t->mask == NULL || t->prune_scratch == NULL) {
        free(t->mask);
        free(t->prune_scratch);
        t->mask = NULL;
        t->prune_scratch = NULL;
        return PS_ENOMEM;
    }
    t->prune = *spec;
    return 0;
}

int psd_table_prune_step(struct psd_table *t, uint64_t step)
{
    if (t->mask == NULL || !psd_prune_due(&t->prune, step))
        return 0;
    double s = psd_prune_sparsity_at(&t->prune, step);
    t->prune_target_now = s;
    psd_table_own(t, t->lo, t->hi);
    psd_table_wrote(t, t->lo, t->hi);
    t->npruned = psd_prune_apply_mask(t->w, t->s1, t->s2, t->mask, (size_t)(t->hi - t->lo), s,
                                      t->prune_scratch);
    t->prune_updates++;
    return 1;
}

static void lend_put(struct psd_lend *l)
{
    /* acq_rel: the sender's reads of the block happen before it is freed
     * or written, on whichever thread drops the last reference */
    if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) == 1) {
        free(l->w);
        free(l);
    }
}

void psd_table_destroy(struct psd_table *t)
{
    if (t == NULL)
        return;
    free(t->mask);
    free(t->prune_scratch);
    if (t->sparse)
        psd_sparse_fini(&t->sp);
    if (t->lend != NULL)
        lend_put(t->lend); /* the block goes with its last message */
    else
        free(t->w);
    free(t->spare);
    free(t->s1);
    free(t->s2);
    free(t->pushers);
    free(t->stamp);
    free(t->absent);
    free(t);
}

int psd_table_pushed_by(const struct psd_table *t, uint32_t w)
{
    if (t->npushers == 0)
        return 1;
    uint32_t lo = 0, hi = t->npushers; /* sorted: a binary search */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->pushers[mid] == w)
            return 1;
        if (t->pushers[mid] < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static int feq(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

int psd_table_same_spec(const struct psd_table *t, const Ps__TableSpec *spec)
{
    return strcmp(t->name, spec->name) == 0 && t->size == spec->size &&
           t->optimizer == spec->optimizer && feq(t->lr, spec->lr) &&
           feq(t->weight_decay, spec->weight_decay) && feq(t->momentum, spec->momentum) &&
           t->nesterov == (spec->nesterov ? 1 : 0) && feq(t->beta1, spec->beta1) &&
           feq(t->beta2, spec->beta2) && feq(t->eps, spec->eps) && t->init == spec->init &&
           feq(t->init_scale, spec->init_scale) && t->seed == spec->seed &&
           t->lr_schedule == (int)spec->lr_schedule && t->lr_decay_steps == spec->lr_decay_steps &&
           t->sparse == (spec->sparse ? 1 : 0) && t->dim == (t->sparse ? spec->dim : 0) &&
           t->rows_max == (t->sparse ? spec->rows_max : 0) && feq(t->l1, spec->l1) &&
           feq(t->l2, spec->l2) && t->await_set == (spec->await_set && !spec->sparse) &&
           t->ndims == spec->n_shape &&
           (t->ndims == 0 || memcmp(t->shape, spec->shape, t->ndims * sizeof t->shape[0]) == 0) &&
           t->sp.admit_after == (spec->admit_after > 1 ? spec->admit_after : 0) &&
           t->sp.sketch_width * 4 ==
               (spec->admit_after > 1
                    ? (spec->admit_counters ? spec->admit_counters : PS_ADMIT_COUNTERS_DEFAULT)
                    : 0) &&
           t->sp.evict_after == spec->evict_after && t->sp.evict_after_s == spec->evict_after_s &&
           t->sp.half_life == (spec->evict_at_budget ? spec->evict_half_life : 0) &&
           t->sp.evict_at_budget == (spec->evict_at_budget ? 1 : 0) &&
           t->npushers == spec->n_pushers &&
           (t->npushers == 0 ||
            memcmp(t->pushers, spec->pushers, t->npushers * sizeof t->pushers[0]) == 0);
}

struct psk_optim psd_table_optim(const struct psd_table *t)
{
    struct psk_optim o = {
        .kind = (int)t->optimizer,
        .lr = t->lr,
        .weight_decay = t->weight_decay,
        .momentum = t->momentum,
        .beta1 = t->beta1,
        .beta2 = t->beta2,
        .eps = t->eps,
        .nesterov = t->nesterov,
        .schedule = t->lr_schedule,
        .decay_steps = t->lr_decay_steps,
        .sched_div = t->sched_div,
        .l1 = t->l1,
        .l2 = t->l2,
    };
    return o;
}

/* Seconds since t0 (ps_mono_ns), into the apply-time histogram. */
static void apply_took(struct psd_table *t, uint64_t t0)
{
    ps_hist_observe(&t->apply_hist, (double)((uint64_t)ps_mono_ns() - t0) * 1e-9);
}

int psd_table_may_lend(struct psd_table *t, size_t bytes)
{
    if (t->cow_run == 0 || t->lend_credit >= ((t->hi - t->lo) * sizeof(float) << (t->cow_run - 1)))
        return 1;
    t->lend_credit += bytes;
    return 0;
}

struct psd_lent *psd_table_lend(struct psd_table *t, uint64_t lo, uint64_t hi)
{
    if (t->spare == NULL && (t->spare = alloc_floats(t->hi - t->lo, 0)) == NULL)
        return NULL;
    if (t->lend == NULL) {
        if ((t->lend = calloc(1, sizeof *t->lend)) == NULL)
            return NULL;
        atomic_init(&t->lend->refs, 1);
        t->lend->w = t->w;
        for (int i = 0; i < PSD_LENT_MAX; i++)
            atomic_init(&t->lend->rec[i].busy, 0);
    }
    struct psd_lent *r = NULL;
    for (int i = 0; i < PSD_LENT_MAX && r == NULL; i++) {
        struct psd_lent *c = &t->lend->rec[(t->lend_next + i) % PSD_LENT_MAX];
        if (atomic_load_explicit(&c->busy, memory_order_acquire) == 0)
            r = c;
    }
    if (r == NULL)
        return NULL;
    t->lend_next = (uint32_t)(r - t->lend->rec + 1) % PSD_LENT_MAX;
    r->block = t->lend;
    r->lo = lo;
    r->hi = hi;
    atomic_store_explicit(&r->busy, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->lend->refs, 1, memory_order_relaxed);
    t->lent_bytes += (hi - lo) * sizeof(float);
    t->lent_since += (hi - lo) * sizeof(float);
    if (t->lent_since >= (t->hi - t->lo) * sizeof(float))
        t->cow_run = 0; /* lending paid for a copy on write since the last */
    return r;
}

void psd_lent_done(struct psd_lent *r)
{
    struct psd_lend *l = r->block; /* r may be reused (or freed with l) once not busy */
    atomic_store_explicit(&r->busy, 0, memory_order_release);
    lend_put(l);
}

void psd_table_own(struct psd_table *t, uint64_t lo, uint64_t hi)
{
    /* Only this thread takes references, so once none but the table's is
     * left, none can appear while w is written; a record seen not busy
     * has been let go of after the sender's last read of its elements. */
    if (t->lend == NULL || atomic_load_explicit(&t->lend->refs, memory_order_acquire) == 1)
        return;
    int overlap = 0;
    for (int i = 0; i < PSD_LENT_MAX && !overlap; i++) {
        const struct psd_lent *r = &t->lend->rec[i];
        overlap = atomic_load_explicit(&r->busy, memory_order_acquire) && r->lo < hi && lo < r->hi;
    }
    if (!overlap)
        return;
    memcpy(t->spare, t->w, (size_t)(t->hi - t->lo) * sizeof(float));
    t->w = t->spare;
    t->spare = NULL;
    struct psd_lend *old = t->lend;
    t->lend = NULL;
    lend_put(old);
    t->cow++;
    t->lend_credit = 0;
    t->lent_since = 0;
    if (t->cow_run < PSD_COW_RUN_MAX)
        t->cow_run++;
}

static void wrote_grad(struct psd_table *t, uint64_t offset, uint64_t count, const float *g);

/* One apply, cut into pieces (psd_table_apply: elements [a, a + n) of
 * the shard's arrays; psd_table_apply_keys: keys[0..n)). */
struct apply_job {
    const struct psd_table *t;
    struct psk_optim o;
    uint64_t step;
    size_t base, n;
    const uint64_t *keys; /* NULL: dense */
    const float *g;
};

static size_t piece_span(const struct apply_job *j, int i, size_t piece, size_t *len)
{
    size_t a = (size_t)i * piece;
    *len = j->n - a < piece ? j->n - a : piece;
    return a;
}

static int dense_piece(void *ctx, int i)
{
    const struct apply_job *j = ctx;
    const struct psd_table *t = j->t;
    size_t n, a = j->base + piece_span(j, i, PSD_APPLY_PIECE, &n);
    float *s1 = t->s1 ? t->s1 + a : NULL, *s2 = t->s2 ? t->s2 + a : NULL;
    psk_optim_apply(&j->o, j->step, t->w + a, s1, s2, j->g + (a - j->base), n);
    if (t->mask != NULL) /* pruned weights take no update */
        psd_prune_enforce(t->w + a, s1, s2, t->mask + a, n);
    return 0;
}

static int keys_piece(void *ctx, int i)
{
    const struct apply_job *j = ctx;
    const struct psd_table *t = j->t;
    size_t n, a = piece_span(j, i, PSD_APPLY_KEYS_PIECE, &n);
    const uint64_t *keys = j->keys + a;
    psk_optim_apply_sparse(&j->o, j->step, t->w, t->s1, t->s2, keys, t->lo, j->g + a, n);
    for (size_t k = 0; k < n && t->mask != NULL; k++) { /* pruned entries take no update */
        size_t e = (size_t)(keys[k] - t->lo);
        if (t->mask[e]) {
            t->w[e] = 0.0f;
            if (t->s1 != NULL)
                t->s1[e] = 0.0f;
            if (t->s2 != NULL)
                t->s2[e] = 0.0f;
        }
    }
    return 0;
}

/* Runs job j in pieces of `piece`: on the pool when it has min elements
 * or keys or more (the helper takes what it can), on this thread otherwise. */
static void apply_run(const struct psd_table *t, struct apply_job *j, ps_piece_fn fn, size_t min,
                      size_t piece)
{
    ps_pool_run(j->n >= min ? t->pool : NULL, fn, j, (int)((j->n + piece - 1) / piece));
}

void psd_table_apply(struct psd_table *t, uint64_t offset, uint64_t count, const float *g,
                     uint64_t step)
{
    uint64_t t0 = (uint64_t)ps_mono_ns();
    psd_table_own(t, offset, offset + count);
    assert(offset >= t->lo);
    assert(count <= t->hi - offset);
    wrote_grad(t, offset, count, g);
    struct apply_job j = {.t = t,
                          .o = psd_table_optim(t),
                          .step = step,
                          .base = (size_t)(offset - t->lo),
                          .n = count,
                          .g = g};
    apply_run(t, &j, dense_piece, PSD_APPLY_MIN, PSD_APPLY_PIECE);
    apply_took(t, t0);
}

void psd_table_apply_keys(struct psd_table *t, const uint64_t *keys, const float *g, size_t n,
                          uint64_t step)
{
    uint64_t t0 = (uint64_t)ps_mono_ns();
    if (n > 0)
        psd_table_own(t, keys[0], keys[n - 1] + 1);
    assert(n == 0 || (keys[0] >= t->lo && keys[n - 1] < t->hi));
    psd_table_wrote_keys(t, keys, n);
    struct apply_job j = {
        .t = t, .o = psd_table_optim(t), .step = step, .n = n, .keys = keys, .g = g};
    apply_run(t, &j, keys_piece, PSD_APPLY_KEYS_MIN, PSD_APPLY_KEYS_PIECE);
    apply_took(t, t0);
}

static int row_error(const struct psd_table *t, int64_t r, uint64_t key, char *err, size_t errlen)
{
    if (r == PS_ELIMIT)
        snprintf(err, errlen, "table '%s' is full: %llu rows on this shard (rows_max); key %llu",
                 t->name, (unsigned long long)t->rows_max, (unsigned long long)key);
    else
        snprintf(err, errlen, "table '%s': out of memory for key %llu", t->name,
                 (unsigned long long)key);
    return (int)r;
}

/* Rows are found ahead of their use, in two steps, so that one key's cache
 * misses wait alongside other keys' work instead of one after the other:
 * ROWS_SLOT_AHEAD keys ahead a key is hashed and its slot's line asked
 * for; ROWS_ROW_AHEAD keys ahead its slot is read (the row found or
 * created) and the row's lines asked for. Random keys miss the cache at
 * each step; at 32 and 16 keys ahead the slot's line was most often still
 * on its way when it was read (perf), and pulls of a table bigger than
 * the cache ran a tenth slower. */
#define ROWS_SLOT_AHEAD 64
#define ROWS_ROW_AHEAD  32
#define ROWS_RING       128 /* > ROWS_SLOT_AHEAD, a power of two */
/* Rows a push updates in one call where the update does not depend on a
 * row's step (psk_optim_apply_rows): about half the time a key took with
 * a call per row (psk_optim_apply) for rows of one value. */
#define ROWS_APPLY 64

/* What a walk's user does with the rows, so which lines to ask for. */
enum rows_use {
    ROWS_READ,         /* the weights */
    ROWS_UPDATE,       /* weights and state */
    ROWS_UPDATE_STEPS, /* and the row's step count (psk_optim_uses_step) */
};

struct rows_walk {
    struct psd_sparse *sp;
    const uint64_t *keys;
    size_t hashed, found; /* keys [0, hashed) hashed, [0, found) rows known */
    size_t end;           /* n, or the key whose row could not be had */
    int64_t fail;         /* its error */
    uint64_t hash[ROWS_RING], row[ROWS_RING];
    int create; /* make the rows not there; else they are ROWS_ABSENT */
};

/* rows_walk_at without create: the key has no row */
#define ROWS_ABSENT (-1)

static void rows_walk_init(struct rows_walk *w, struct psd_table *t, const uint64_t *keys, size_t n,
                           int create)
{
    w->sp = &t->sp;
    w->keys = keys;
    w->hashed = w->found = 0;
    w->end = n;
    w->fail = 0;
    w->create = create;
}

/* always_inline: GCC 12 finds a function that only prefetches free of
 * effects and drops the calls to it where it was not inlined first. */
static inline __attribute__((always_inline)) void prefetch_row(const struct psd_sparse *sp,
                                                               uint64_t r, enum rows_use use)
{
    size_t at = (size_t)r * sp->dim;
    if (use == ROWS_READ) { /* into L1, as the slot (psd_sparse_prefetch_hash) */
        __builtin_prefetch(sp->w + at, 0, 3);
        return;
    }
    __builtin_prefetch(sp->w + at, 1, 1);
    if (use == ROWS_UPDATE_STEPS)
        __builtin_prefetch(sp->row_steps + r, 1, 1);
    if (use != ROWS_READ) /* a push stamps the row's tick (and count) */
        __builtin_prefetch(sp->last + r, 1, 1);
    if (use != ROWS_READ && sp->freq != NULL)
        __builtin_prefetch(sp->freq + r, 1, 1);
    if (sp->s1 != NULL)
        __builtin_prefetch(sp->s1 + at, 1, 1);
    if (sp->s2 != NULL)
        __builtin_prefetch(sp->s2 + at, 1, 1);
}

/* Row of key i (keys before i taken in order), or <0 when key i's row
 * could not be had (rows_walk.fail; keys past it are not looked up). */
static inline int64_t rows_walk_at(struct rows_walk *w, size_t i, enum rows_use use)
{
    struct psd_sparse *sp = w->sp;
    for (size_t to = i + ROWS_SLOT_AHEAD < w->end ? i + ROWS_SLOT_AHEAD + 1 : w->end;
         w->hashed < to; w->hashed++) {
        uint64_t h = ps_mix64(w->keys[w->hashed]);
        w->hash[w->hashed % ROWS_RING] = h;
        psd_sparse_prefetch_hash(sp, h);
    }
    for (size_t to = i + ROWS_ROW_AHEAD < w->end ? i + ROWS_ROW_AHEAD + 1 : w->end; w->found < to;
         w->found++) {
        size_t k = w->found;
        int64_t r = psd_sparse_find_hashed(sp, w->keys[k], w->hash[k % ROWS_RING]);
        if (r == -1 && w->create) /* (found again there: a new row is rare) */
            r = psd_sparse_row_hashed(sp, w->keys[k], w->hash[k % ROWS_RING], 1);
        if (r == -1 && !w->create) {
            w->row[k % ROWS_RING] = (uint64_t)ROWS_ABSENT;
            continue;
        }
        if (r < 0) {
            w->end = k;
            w->fail = r;
            break;
        }
        w->row[k % ROWS_RING] = (uint64_t)r;
        prefetch_row(sp, (uint64_t)r, use);
    }
    return i < w->end ? (int64_t)w->row[i % ROWS_RING] : w->fail;
}

int psd_table_pull_rows(struct psd_table *t, const uint64_t *keys, size_t n, float *out, char *err,
                        size_t errlen)
{
    uint32_t d = t->dim;
    struct rows_walk w;
    struct psd_sparse *sp = &t->sp;
    rows_walk_init(&w, t, keys, n, !sp->life); /* with a life cycle, pulls make no rows */
    /* rows a pull makes are a tick's (a delta export after this tick has
     * them); a pull that makes none takes it back */
    uint64_t had = sp->nrows;
    sp->tick++;
    for (size_t i = 0; i < n; i++) {
        int64_t r = rows_walk_at(&w, i, ROWS_READ);
        if (r == ROWS_ABSENT && sp->life) /* what its row would start as */
            ps_init_fill(out + i * d, d, (enum ps_init_kind)sp->init_kind, sp->init_scale,
                         sp->seed ^ ps_mix64(keys[i]), 0);
        else if (r < 0) {
            sp->tick -= sp->nrows == had;
            return row_error(t, r, keys[i], err, errlen);
        } else
            memcpy(out + i * d, sp->w + (size_t)r * d, d * sizeof(float));
    }
    sp->tick -= sp->nrows == had;
    return 0;
}

/* Applies g's rows to the rows of keys whose rows are rows[0..m) (a
 * run: their gradients follow each other in g). */
static void apply_rows_run(struct psd_table *t, const struct psk_optim *o, const uint64_t *rows,
                           const float *g, size_t m)
{
    struct psd_sparse *sp = &t->sp;
    size_t d = t->dim;
    if (!psk_optim_uses_step(o)) {
        if (sp->rowwise)
            psk_optim_apply_rowwise(o, 1, sp->w, sp->rsum, rows, d, g, m);
        else
            psk_optim_apply_rows(o, 1, sp->w, sp->s1, sp->s2, rows, d, g, m);
        return;
    }
    for (size_t j = 0; j < m; j++) { /* each row at its own step */
        size_t r = (size_t)rows[j];
        if (sp->rowwise)
            psk_optim_apply_rowwise(o, ++sp->row_steps[r], sp->w, sp->rsum, &rows[j], d, g + j * d,
                                    1);
        else
            psk_optim_apply(o, ++sp->row_steps[r], sp->w + r * d, sp->s1 ? sp->s1 + r * d : NULL,
                            sp->s2 ? sp->s2 + r * d : NULL, g + j * d, d);
    }
}

/* A push with the life cycle on (sparse.h): the rows there are applied,
 * and stamped with this push's tick, as they come; then the keys without
 * one, in order: counted toward admission, given a row (room made by
 * evicting the least recently pushed row not in this push, where
 * evict_at_budget allows) and applied; then a slice of age eviction. A
 * key refused for room ends the push with an error; the rows before it
 * and every row that was there are applied. */
static int push_rows_life(struct psd_table *t, const uint64_t *keys, const float *g, size_t n,
                          char *err, size_t errlen)
{
    struct psd_sparse *sp = &t->sp;
    struct psk_optim o = psd_table_optim(t);
    size_t d = t->dim;
    uint64_t tick = ++sp->tick;
    if (t->absent_cap < n) {
        size_t *a = realloc(t->absent, n * sizeof *a);
        if (a == NULL)
            return ps_errf(PS_ENOMEM, err, errlen, "table '%s': out of memory for %zu keys",
                           t->name, n);
        t->absent = a;
        t->absent_cap = n;
    }
    size_t nabs = 0, run = 0;
    uint64_t rows[ROWS_APPLY];
    struct rows_walk w;
    rows_walk_init(&w, t, keys, n, 0);
    enum rows_use use = psk_optim_uses_step(&o) ? ROWS_UPDATE_STEPS : ROWS_UPDATE;
    for (size_t i = 0; i < n; i++) {
        int64_t r = rows_walk_at(&w, i, use);
        if (r == ROWS_ABSENT) {
            t->absent[nabs++] = i;
        } else {
            psd_sparse_stamp(sp, (uint64_t)r, tick);
            rows[run++] = (uint64_t)r;
        }
        /* a run ends at a key without a row, when full, or at the end */
        if (run > 0 && (r == ROWS_ABSENT || run == ROWS_APPLY || i + 1 == n)) {
            size_t first = r == ROWS_ABSENT ? i - run : i + 1 - run;
            apply_rows_run(t, &o, rows, g + first * d, run);
            run = 0;
        }
    }
    int rc = 0;
    for (size_t j = 0; j < nabs && rc == 0; j++) {
        size_t i = t->absent[j];
        if (!psd_sparse_admit(sp, keys[i]))
            continue;
        int64_t r = (rc = psd_sparse_make_room(sp)) == 0 ? psd_sparse_row(sp, keys[i], 1) : rc;
        if (r < 0) {
            rc = row_error(t, r, keys[i], err, errlen);
            break;
        }
        uint64_t one = (uint64_t)r;
        apply_rows_run(t, &o, &one, g + i * d, 1);
    }
    psd_sparse_age_slice(sp);
    return rc;
}

int psd_table_push_rows(struct psd_table *t, const uint64_t *keys, const float *g, size_t n,
                        char *err, size_t errlen)
{
    uint64_t t0 = (uint64_t)ps_mono_ns();
    if (t->sp.life) {
        int rc = push_rows_life(t, keys, g, n, err, errlen);
        t->steps++;
        apply_took(t, t0);
        return rc;
    }
    struct psk_optim o = psd_table_optim(t);
    uint32_t d = t->dim;
    uint64_t tick = ++t->sp.tick;
    struct rows_walk w;
    rows_walk_init(&w, t, keys, n, 1);
    uint64_t rows[ROWS_APPLY];
    int one_call = !psk_optim_uses_step(&o);
    for (size_t b = 0; b < n; b += ROWS_APPLY) {
        size_t m = n - b < ROWS_APPLY ? n - b : ROWS_APPLY, i = b;
        int64_t r = 0;
        for (; i < b + m &&
               (r = rows_walk_at(&w, i, one_call ? ROWS_UPDATE : ROWS_UPDATE_STEPS)) >= 0;
             i++) {
            rows[i - b] = (uint64_t)r;
            psd_sparse_stamp(&t->sp, (uint64_t)r, tick);
        }
        /* the rows found so far, in order: all of them but on a failure */
        apply_rows_run(t, &o, rows, g + b * d, i - b);
        if (r < 0)
            return row_error(t, r, keys[i], err, errlen);
    }
    t->steps++;
    apply_took(t, t0);
    return 0;
}

double psd_table_sparsity(const struct psd_table *t)
{
    return t->hi > t->lo ? (double)t->npruned / (double)(t->hi - t->lo) : 0.0;
}

double psd_table_zero_share(struct psd_table *t, uint64_t now_ms)
{
    if (t->mask != NULL)
        return psd_table_sparsity(t);
    if (t->zeros_at_ms != 0 && now_ms - t->zeros_at_ms < PSD_ZEROS_KEEP_MS)
        return t->zeros_share;
    const float *w = t->sparse ? t->sp.w : t->w;
    uint64_t n = t->sparse ? t->sp.nrows * t->dim : t->hi - t->lo;
    uint64_t stride =
        n > PSD_ZEROS_SAMPLE_MAX ? (n + PSD_ZEROS_SAMPLE_MAX - 1) / PSD_ZEROS_SAMPLE_MAX : 1;
    uint64_t zeros = 0, read = 0;
    for (uint64_t i = 0; w != NULL && i < n; i += stride, read++)
        zeros += w[i] == 0.0f;
    t->zeros_share = read > 0 ? (double)zeros / (double)read : 0.0;
    t->zeros_at_ms = now_ms ? now_ms : 1;
    return t->zeros_share;
}

uint64_t psd_table_bytes_held(const struct psd_table *t)
{
    uint64_t elems = t->sparse ? t->sp.nrows * t->dim : t->hi - t->lo;
    uint64_t arrays = 1u + (uint64_t)psk_optim_state_arrays((int)t->optimizer);
    return elems * 4u * (arrays + (t->spare != NULL)) /* the spare: see psd_table_lend */
           + (t->sparse ? psd_sparse_extra_bytes(&t->sp, t->sp.nrows) : 0) +
           (t->sp.rowwise ? t->sp.nrows * sizeof(float) : 0) +
           (t->stamp != NULL ? (t->hi - t->lo) * sizeof *t->stamp : 0);
}

/* The next version, and the stamp that marks it: stamps count from
 * stamp_base, and when they would pass 32 bits the base moves up to the
 * version before this write and every stamp restarts at 0 ("at or
 * before the base"): a client behind the base gets the whole range. */
static uint32_t next_version(struct psd_table *t)
{
    uint64_t v = t->version + 1;
    if (t->stamp != NULL && v - t->stamp_base > UINT32_MAX) {
        memset(t->stamp, 0, (size_t)(t->hi - t->lo) * sizeof *t->stamp);
        t->stamp_base = t->version;
    }
    t->version = v;
    return (uint32_t)(v - t->stamp_base);
}

void psd_table_wrote(struct psd_table *t, uint64_t lo, uint64_t hi)
{
    uint32_t st = next_version(t);
    for (uint64_t e = lo; t->stamp != NULL && e < hi; e++)
        t->stamp[e - t->lo] = st;
}

void psd_table_wrote_keys(struct psd_table *t, const uint64_t *keys, size_t n)
{
    uint32_t st = next_version(t);
    for (size_t i = 0; t->stamp != NULL && i < n; i++)
        t->stamp[keys[i] - t->lo] = st;
}

/* A dense apply of g to [offset, offset + count). Plain SGD without
 * weight decay leaves an element whose gradient is +0.0 as it was, bit for
 * bit (w - lr * (+0 + 0 * w) is w, -0.0 included), so only the others are
 * stamped: a bsp round of top-k pushes from several workers is applied as
 * a dense gradient that is zero nearly everywhere. Any other optimizer
 * moves a weight with a zero gradient (momentum, Adam), or may (Adagrad
 * with eps 0): the whole range is stamped. */
static void wrote_grad(struct psd_table *t, uint64_t offset, uint64_t count, const float *g)
{
    if (t->stamp == NULL || t->optimizer != PS__OPTIMIZER_KIND__OPT_SGD ||
        t->weight_decay != 0.0f) {
        psd_table_wrote(t, offset, offset + count);
        return;
    }
    uint32_t st = next_version(t), *stamp = t->stamp + (offset - t->lo);
    for (uint64_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &g[i], sizeof bits);
        if (bits != 0)
            stamp[i] = st;
    }
}

int psd_table_track(struct psd_table *t)
{
    if (t->stamp != NULL || t->sparse)
        return 0;
    size_t n = (size_t)(t->hi - t->lo);
    /* zero: everything was written at or before the version now */
    if ((t->stamp = calloc(n ? n : 1, sizeof *t->stamp)) == NULL)
        return PS_ENOMEM;
    t->stamp_base = t->version;
    return 0;
}

uint64_t psd_table_changed(const struct psd_table *t, uint64_t generation, uint64_t since,
                           uint64_t offset, uint64_t count, uint8_t *mask)
{
    if (t->stamp == NULL || generation != t->generation || since == 0 || since > t->version ||
        since < t->stamp_base)
        return UINT64_MAX;
    /* written after since: base + stamp > since, stamp > since - base */
    uint32_t after = (uint32_t)(since - t->stamp_base);
    const uint32_t *st = t->stamp + (offset - t->lo);
    uint64_t n = 0;
    if (mask == NULL) {
        for (uint64_t i = 0; i < count; i++)
            n += st[i] > after;
        return n;
    }
    for (uint64_t i = 0; i < count; i++)
        if (st[i] > after) {
            mask[i / 8] |= (uint8_t)(1u << (i % 8));
            n++;
        }
    return n;
}

void psd_table_read(const struct psd_table *t, uint64_t offset, uint64_t count, float *out)
{
    assert(offset >= t->lo);
    assert(count <= t->hi - offset);
    memcpy(out, t->w + (offset - t->lo), (size_t)count * sizeof(float));
}
