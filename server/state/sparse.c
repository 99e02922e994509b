/* Sparse rows: hash index + contiguous row storage. */
#include "sparse.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_limits.h"
#include "ps_mem.h"
#include "ps_shard.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY PSD_SLOT_EMPTY

/* Lookups land on random pages: past a huge page, ask for huge pages so the
 * TLB covers the slots (transparent huge pages in "madvise" mode). */
static struct psd_slot *empty_slots(uint64_t n)
{
    size_t bytes = n * sizeof(struct psd_slot);
    struct psd_slot *s = ps_alloc_big(bytes, 0);
    if (s != NULL)
        memset(s, 0xff, bytes); /* row EMPTY */
    return s;
}

int psd_sparse_init(struct psd_sparse *sp, uint32_t dim, uint64_t rows_max, int nstate,
                    int init_kind, float init_scale, uint64_t seed)
{
    memset(sp, 0, sizeof *sp);
    sp->dim = dim;
    sp->rows_max = rows_max < UINT32_MAX ? rows_max : UINT32_MAX - 1;
    sp->nstate = nstate;
    sp->init_kind = init_kind;
    sp->init_scale = init_scale;
    sp->seed = seed;
    sp->slots = 64;
    if ((sp->slot = empty_slots(sp->slots)) == NULL) {
        psd_sparse_fini(sp);
        return PS_ENOMEM;
    }
    return 0;
}

void psd_sparse_fini(struct psd_sparse *sp)
{
    free(sp->slot);
    free(sp->row_key);
    free(sp->w);
    free(sp->s1);
    free(sp->s2);
    free(sp->row_steps);
    free(sp->last);
    free(sp->tomb_key);
    free(sp->tomb_tick);
    free(sp->sketch);
    free(sp->rsum);
    free(sp->freq);
    memset(sp, 0, sizeof *sp);
}

static uint64_t find_slot(const struct psd_sparse *sp, uint64_t key, uint64_t hash)
{
    uint64_t mask = sp->slots - 1, i = hash & mask;
    while (sp->slot[i].row != EMPTY && sp->slot[i].key != key)
        i = (i + 1) & mask;
    return i;
}

static int grow_slots(struct psd_sparse *sp)
{
    struct psd_slot *old = sp->slot, *grown = empty_slots(sp->slots * 2);
    if (grown == NULL)
        return PS_ENOMEM;
    uint64_t n = sp->slots;
    sp->slot = grown;
    sp->slots = n * 2;
    for (uint64_t i = 0; i < n; i++)
        if (old[i].row != EMPTY)
            sp->slot[find_slot(sp, old[i].key, ps_mix64(old[i].key))] = old[i];
    free(old);
    return 0;
}

/* Grows *p from n to cap entries of size bytes each (huge pages past
 * 2 MiB). 0 or PS_ENOMEM (*p as it was). */
static int grow_array(void **p, size_t size, size_t n, size_t cap)
{
    void *q = ps_grow_big(*p, n * size, cap * size);
    if (q == NULL)
        return PS_ENOMEM;
    *p = q;
    return 0;
}

/* The row arrays are read at random places too: huge pages past 2 MiB. */
static int grow_rows(struct psd_sparse *sp)
{
    uint64_t cap = sp->rows_cap ? sp->rows_cap * 2 : 64;
    if (cap > sp->rows_max)
        cap = sp->rows_max;
    size_t n = sp->nrows, row = (size_t)sp->dim * sizeof(float);
    struct {
        void **p;
        size_t size;
        int used;
    } arr[] = {
        {(void **)&sp->w, row, 1},
        {(void **)&sp->s1, row, sp->nstate >= 1},
        {(void **)&sp->s2, row, sp->nstate >= 2},
        {(void **)&sp->row_steps, sizeof *sp->row_steps, 1},
        {(void **)&sp->row_key, sizeof *sp->row_key, 1},
        {(void **)&sp->rsum, sizeof *sp->rsum, sp->rowwise},
        {(void **)&sp->last, sizeof *sp->last, 1},
        {(void **)&sp->freq, sizeof *sp->freq, sp->half_life != 0},
    };
    for (size_t a = 0; a < sizeof arr / sizeof arr[0]; a++)
        if (arr[a].used && grow_array(arr[a].p, arr[a].size, n, (size_t)cap) != 0)
            return PS_ENOMEM;
    sp->rows_cap = cap;
    return 0;
}

int64_t psd_sparse_row(struct psd_sparse *sp, uint64_t key, int create)
{
    return psd_sparse_row_hashed(sp, key, ps_mix64(key), create);
}

int64_t psd_sparse_row_hashed(struct psd_sparse *sp, uint64_t key, uint64_t hash, int create)
{
    uint64_t i = find_slot(sp, key, hash);
    if (sp->slot[i].row != EMPTY)
        return (int64_t)sp->slot[i].row;
    if (!create)
        return -1;
    if (sp->nrows >= sp->rows_max) {
        sp->refused++;
        return PS_ELIMIT;
    }
    if (sp->nrows == sp->rows_cap && grow_rows(sp) != 0)
        return PS_ENOMEM;
    if (2 * (sp->nrows + 1) > sp->slots) {
        if (grow_slots(sp) != 0)
            return PS_ENOMEM;
        i = find_slot(sp, key, hash);
    }
    uint64_t r = sp->nrows++;
    sp->slot[i].key = key;
    sp->slot[i].row = r;
    float *w = sp->w + r * sp->dim;
    ps_init_fill(w, sp->dim, (enum ps_init_kind)sp->init_kind, sp->init_scale,
                 sp->seed ^ ps_mix64(key), 0);
    for (int a = 0; a < sp->nstate; a++)
        memset((a == 0 ? sp->s1 : sp->s2) + r * sp->dim, 0, sp->dim * sizeof(float));
    sp->row_steps[r] = 0;
    sp->row_key[r] = key;
    if (sp->rowwise)
        sp->rsum[r] = 0.0f;
    sp->last[r] = sp->tick;
    if (sp->freq != NULL)
        sp->freq[r] = PSD_FREQ_ONE; /* the push making it */
    sp->admitted++;
    return (int64_t)r;
}

int psd_sparse_life(struct psd_sparse *sp, uint32_t admit_after, uint64_t admit_counters,
                    uint64_t evict_after, int evict_at_budget, uint64_t evict_after_s,
                    uint64_t half_life)
{
    sp->half_life = evict_at_budget ? half_life : 0;
    sp->admit_after = admit_after > 1 ? admit_after : 0;
    sp->evict_after = evict_after;
    sp->evict_at_budget = evict_at_budget != 0;
    sp->evict_after_s = evict_after_s;
    sp->life =
        sp->admit_after != 0 || evict_after != 0 || sp->evict_at_budget || evict_after_s != 0;
    if (!sp->life)
        return 0;
    if (sp->admit_after != 0) {
        uint64_t counters = admit_counters ? admit_counters : PS_ADMIT_COUNTERS_DEFAULT;
        sp->sketch_width = counters / 4;
        if ((sp->sketch = ps_alloc_big((size_t)counters, 1)) == NULL)
            return PS_ENOMEM;
    }
    return 0;
}

uint64_t psd_sparse_extra_bytes(const struct psd_sparse *sp, uint64_t rows)
{
    return rows * (sizeof *sp->last + (sp->freq != NULL ? sizeof *sp->freq : 0)) +
           4 * sp->sketch_width + sp->tomb_cap * (sizeof *sp->tomb_key + sizeof *sp->tomb_tick);
}

/* Keeps a tombstone for key, evicted now; the oldest kept goes when the
 * ring is full (and exports since before it cannot be told). */
static void tombstone(struct psd_sparse *sp, uint64_t key)
{
    if (sp->tomb_key == NULL) {
        uint64_t cap = sp->rows_max < 4096 ? 4096 : sp->rows_max;
        cap = cap < PSD_TOMBS_MAX ? cap : PSD_TOMBS_MAX;
        sp->tomb_key = malloc(cap * sizeof *sp->tomb_key);
        sp->tomb_tick = malloc(cap * sizeof *sp->tomb_tick);
        if (sp->tomb_key == NULL || sp->tomb_tick == NULL) {
            free(sp->tomb_key);
            free(sp->tomb_tick);
            sp->tomb_key = sp->tomb_tick = NULL;
            sp->tomb_floor = sp->tick; /* none kept: no delta reaches back past now */
            return;
        }
        sp->tomb_cap = cap;
    }
    if (sp->tomb_n == sp->tomb_cap) { /* the oldest goes */
        uint64_t oldest = (sp->tomb_head + sp->tomb_cap - sp->tomb_n) % sp->tomb_cap;
        sp->tomb_floor = sp->tomb_tick[oldest];
        sp->tomb_n--;
    }
    sp->tomb_key[sp->tomb_head] = key;
    sp->tomb_tick[sp->tomb_head] = sp->tick;
    sp->tomb_head = (sp->tomb_head + 1) % sp->tomb_cap;
    sp->tomb_n++;
}

/* The sketch's counter for key in row j: a hash of its own per row. */
static uint8_t *counter(struct psd_sparse *sp, uint64_t key, unsigned j)
{
    static const uint64_t salt[4] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full,
                                     0x165667B19E3779F9ull, 0xD6E8FEB86659FD93ull};
    return &sp->sketch[j * sp->sketch_width + (ps_mix64(key ^ salt[j]) & (sp->sketch_width - 1))];
}

int psd_sparse_admit(struct psd_sparse *sp, uint64_t key)
{
    if (sp->admit_after == 0)
        return 1;
    /* conservative update: only the smallest counters go up (the estimate,
     * their minimum, overcounts less) */
    unsigned est = 255;
    for (unsigned j = 0; j < 4; j++) {
        unsigned c = *counter(sp, key, j);
        est = c < est ? c : est;
    }
    unsigned next = est < 255 ? est + 1 : 255;
    for (unsigned j = 0; j < 4; j++) {
        uint8_t *c = counter(sp, key, j);
        if (*c < next)
            *c = (uint8_t)next;
    }
    if (++sp->sketch_adds >= sp->sketch_width) { /* old counts fade */
        for (uint64_t i = 0; i < 4 * sp->sketch_width; i++)
            sp->sketch[i] >>= 1;
        sp->sketch_adds = 0;
    }
    if (next >= sp->admit_after)
        return 1;
    sp->held_back++;
    return 0;
}

/* Deletes slot i's entry, moving up the entries after it that would no
 * longer be found (linear probing without tombstones). */
static void slot_delete(struct psd_sparse *sp, uint64_t i)
{
    uint64_t mask = sp->slots - 1;
    for (uint64_t j = i;;) {
        j = (j + 1) & mask;
        if (sp->slot[j].row == EMPTY)
            break;
        uint64_t home = ps_mix64(sp->slot[j].key) & mask;
        /* j's entry stays when its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            sp->slot[i] = sp->slot[j];
            i = j;
        }
    }
    sp->slot[i].row = EMPTY;
}

void psd_sparse_remove(struct psd_sparse *sp, uint64_t r)
{
    tombstone(sp, sp->row_key[r]);
    slot_delete(sp, find_slot(sp, sp->row_key[r], ps_mix64(sp->row_key[r])));
    uint64_t l = --sp->nrows;
    if (r == l)
        return;
    size_t d = sp->dim;
    memcpy(sp->w + r * d, sp->w + l * d, d * sizeof(float));
    if (sp->nstate >= 1)
        memcpy(sp->s1 + r * d, sp->s1 + l * d, d * sizeof(float));
    if (sp->nstate >= 2)
        memcpy(sp->s2 + r * d, sp->s2 + l * d, d * sizeof(float));
    sp->row_steps[r] = sp->row_steps[l];
    sp->row_key[r] = sp->row_key[l];
    if (sp->rsum != NULL)
        sp->rsum[r] = sp->rsum[l];
    sp->last[r] = sp->last[l];
    if (sp->freq != NULL)
        sp->freq[r] = sp->freq[l];
    sp->slot[find_slot(sp, sp->row_key[r], ps_mix64(sp->row_key[r]))].row = r;
}

int psd_sparse_make_room(struct psd_sparse *sp)
{
    if (sp->nrows < sp->rows_max)
        return 0;
    if (!sp->evict_at_budget || sp->nrows == 0) {
        sp->refused++;
        return PS_ELIMIT;
    }
    /* the coldest of a sample spread over the rows, not one this push
     * touched (their last is the tick): the least recently pushed, or
     * with a half-life the least decayed count (then the older) */
    uint64_t n = sp->nrows, step = n / PSD_VICTIM_SAMPLE ? n / PSD_VICTIM_SAMPLE : 1;
    uint64_t best = EMPTY;
    uint32_t best_f = 0;
    for (uint64_t j = 0; j < PSD_VICTIM_SAMPLE && j < n; j++) {
        uint64_t r = (sp->victim_at + j * step) % n;
        if (sp->last[r] >= sp->tick)
            continue;
        uint32_t f = sp->freq != NULL
                         ? psd_sparse_decayed(sp->freq[r], sp->tick - sp->last[r], sp->half_life)
                         : 0;
        if (best == EMPTY || f < best_f || (f == best_f && sp->last[r] < sp->last[best])) {
            best = r;
            best_f = f;
        }
    }
    /* all touched by this push: the first row that was not, from the
     * sample's start (this push's rows are at most its keys) */
    for (uint64_t j = 0; best == EMPTY && j < n; j++) {
        uint64_t r = (sp->victim_at + j) % n;
        if (sp->last[r] < sp->tick)
            best = r;
    }
    sp->victim_at = (sp->victim_at + 1) % n;
    if (best == EMPTY) {
        sp->refused++;
        return PS_ELIMIT;
    }
    psd_sparse_remove(sp, best);
    sp->evicted_budget++;
    return 0;
}

uint64_t psd_sparse_age_clock(struct psd_sparse *sp, uint64_t now_ms)
{
    if (sp->evict_after_s == 0)
        return 0;
    uint64_t span = sp->evict_after_s * 1000;
    uint64_t every = span / (PSD_AGE_STAMPS / 2) > 1000 ? span / (PSD_AGE_STAMPS / 2) : 1000;
    const struct psd_age_stamp *newest =
        sp->nstamps ? &sp->stamp[(sp->stamp_head + PSD_AGE_STAMPS - 1) % PSD_AGE_STAMPS] : NULL;
    if (newest == NULL || now_ms - newest->ms >= every) {
        sp->stamp[sp->stamp_head] = (struct psd_age_stamp){now_ms, sp->tick};
        sp->stamp_head = (sp->stamp_head + 1) % PSD_AGE_STAMPS;
        sp->nstamps += sp->nstamps < PSD_AGE_STAMPS;
    }
    /* the newest sample at least span old; the ring covers more than
     * span (PSD_AGE_STAMPS / 2 samples do), so the oldest ones are
     * overwritten only once newer ones are old enough */
    uint64_t floor = 0;
    for (uint32_t i = 0; i < sp->nstamps; i++) {
        const struct psd_age_stamp *st =
            &sp->stamp[(sp->stamp_head + PSD_AGE_STAMPS - 1 - i) % PSD_AGE_STAMPS];
        if (now_ms >= st->ms && now_ms - st->ms >= span) {
            floor = st->tick + 1;
            break;
        }
    }
    return floor > sp->age_floor ? floor : 0;
}

int psd_sparse_set_floor(struct psd_sparse *sp, uint64_t floor)
{
    if (floor > sp->tick + 1 || floor < sp->age_floor)
        return PS_EINVAL;
    sp->age_floor = floor;
    return 0;
}

void psd_sparse_age_slice(struct psd_sparse *sp)
{
    if (sp->evict_after == 0 && sp->age_floor == 0)
        return;
    for (unsigned k = 0; k < PSD_AGE_SLICE && sp->nrows > 0; k++) {
        if (sp->age_at >= sp->nrows)
            sp->age_at = 0;
        uint64_t r = sp->age_at;
        if ((sp->evict_after != 0 && sp->tick - sp->last[r] > sp->evict_after) ||
            sp->last[r] < sp->age_floor) {
            psd_sparse_remove(sp, r); /* the last row moves here: looked at next */
            sp->evicted_age++;
        } else {
            sp->age_at++;
        }
    }
}

int psd_sparse_tombs_linear(struct psd_sparse *sp)
{
    if (sp->tomb_n == 0 || sp->tomb_head == sp->tomb_n % sp->tomb_cap)
        return 0; /* empty, or in order from 0 already */
    uint64_t *k = malloc(sp->tomb_n * sizeof *k), *t = malloc(sp->tomb_n * sizeof *t);
    if (k == NULL || t == NULL) {
        free(k);
        free(t);
        return PS_ENOMEM;
    }
    uint64_t first = (sp->tomb_head + sp->tomb_cap - sp->tomb_n) % sp->tomb_cap;
    for (uint64_t i = 0; i < sp->tomb_n; i++) {
        k[i] = sp->tomb_key[(first + i) % sp->tomb_cap];
        t[i] = sp->tomb_tick[(first + i) % sp->tomb_cap];
    }
    memcpy(sp->tomb_key, k, sp->tomb_n * sizeof *k);
    memcpy(sp->tomb_tick, t, sp->tomb_n * sizeof *t);
    sp->tomb_head = sp->tomb_n % sp->tomb_cap;
    free(k);
    free(t);
    return 0;
}

int psd_sparse_tombs_restore(struct psd_sparse *sp, const uint64_t *keys, const uint64_t *ticks,
                             uint64_t n)
{
    if (n == 0)
        return 0;
    uint64_t cap = sp->rows_max < 4096 ? 4096 : sp->rows_max;
    cap = cap < PSD_TOMBS_MAX ? cap : PSD_TOMBS_MAX;
    if (n > cap)
        return PS_ELIMIT;
    sp->tomb_key = malloc(cap * sizeof *sp->tomb_key);
    sp->tomb_tick = malloc(cap * sizeof *sp->tomb_tick);
    if (sp->tomb_key == NULL || sp->tomb_tick == NULL)
        return PS_ENOMEM;
    sp->tomb_cap = cap;
    memcpy(sp->tomb_key, keys, n * sizeof *keys);
    memcpy(sp->tomb_tick, ticks, n * sizeof *ticks);
    sp->tomb_n = n;
    sp->tomb_head = n % cap;
    return 0;
}
