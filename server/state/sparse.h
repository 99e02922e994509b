/* Rows of a sparse table on one shard: uint64 key -> row of dim floats.
 *
 * Open addressing with linear probing on a mixed key; the table keeps at
 * most half its slots full and grows by doubling, rows live contiguously
 * in insertion order and grow alongside, never past rows_max. A row is
 * created on first touch, initialised from (seed, key, j) alone, so the
 * values do not depend on which shard or worker touched it first. Owned by
 * the server loop. Nothing here knows about messages. */
#ifndef PSD_SPARSE_H
#define PSD_SPARSE_H

#include <stddef.h>
#include <stdint.h>

struct psd_sparse {
    uint32_t dim;
    uint64_t rows_max;
    int nstate; /* optimizer state arrays per row (0..2) */
    int init_kind;
    float init_scale;
    uint64_t seed;

    uint64_t nrows, rows_cap;
    uint64_t slots; /* power of two */
    /* a key and its row side by side: a probe is one cache line */
    struct psd_slot {
        uint64_t key;
        uint64_t row; /* UINT64_MAX: empty */
    } * slot;
    float *w, *s1, *s2;  /* rows_cap x dim each */
    uint64_t *row_key;   /* rows_cap: each row's key (checkpoints, OP_ROWS pages) */
    uint32_t *row_steps; /* optimizer steps per row (Adam's t), counted only where
                          * the update uses them (psk_optim_uses_step) */
    uint64_t admitted;   /* rows made */
    int rowwise;         /* row-wise Adagrad: rsum, one accumulator per row */
    float *rsum;         /* rows_cap, or NULL */

    /* Every push is a tick (the table's version on this shard: delta
     * exports ask for what came after one), and each row keeps the tick of
     * its last push; an evicted row leaves a tombstone (its key and tick)
     * in a ring of tomb_cap, and ticks before tomb_floor have lost some.
     * Everything here is decided by the order the pushes are applied in,
     * so a backup replaying them does the same. */
    uint64_t *last;                 /* rows_cap: the tick of the row's last push (or its making) */
    uint64_t tick;                  /* pushes applied to the table on this shard */
    uint64_t *tomb_key, *tomb_tick; /* tomb_cap each (NULL before the first eviction) */
    uint64_t tomb_cap, tomb_n, tomb_head; /* kept, and where the next goes */
    uint64_t tomb_floor;                  /* exports since a tick below it cannot be told */
    /* The life cycle (psd_sparse_life), when admission or eviction is on:
     * pulls make no rows. */
    int life;
    uint32_t admit_after;
    uint64_t evict_after;
    int evict_at_budget;
    uint64_t age_at;    /* the row age eviction looks at next */
    uint64_t victim_at; /* where budget eviction's sample starts */
    /* admission: a count-min sketch of 4 rows of sketch_width one-byte
     * counters, halved every sketch_width counts (sketch_adds): a counter
     * holds about one other id's count on average at most, so an id
     * pushed once is rarely taken for one pushed twice */
    uint8_t *sketch;
    uint64_t sketch_width, sketch_adds;
    uint64_t held_back, evicted_age, evicted_budget, refused;
};

/* Rows age eviction looks at after each push (psd_sparse_age_slice): a
 * row is evicted within nrows / PSD_AGE_SLICE pushes of ageing out. */
#define PSD_AGE_SLICE 64u
/* Rows budget eviction compares, spread over the table. */
#define PSD_VICTIM_SAMPLE 8u

int psd_sparse_init(struct psd_sparse *sp, uint32_t dim, uint64_t rows_max, int nstate,
                    int init_kind, float init_scale, uint64_t seed);
void psd_sparse_fini(struct psd_sparse *sp);

/* Row of `key`: found, or created when `create` (initialised). Returns the
 * row index, -1 when absent and not created, PS_ELIMIT at rows_max, or
 * PS_ENOMEM. */
int64_t psd_sparse_row(struct psd_sparse *sp, uint64_t key, int create);
/* The same with the key's hash, ps_mix64(key), already computed (by a
 * caller that asked for its slot's line ahead of time). */
int64_t psd_sparse_row_hashed(struct psd_sparse *sp, uint64_t key, uint64_t hash, int create);

/* Turns the life cycle on (a table spec's admit_after, admit_counters,
 * evict_after, evict_at_budget; checked): 0 or PS_ENOMEM. */
int psd_sparse_life(struct psd_sparse *sp, uint32_t admit_after, uint64_t admit_counters,
                    uint64_t evict_after, int evict_at_budget);
/* Bytes beside the rows' weights and state: each row's tick, the sketch,
 * the tombstones. */
uint64_t psd_sparse_extra_bytes(const struct psd_sparse *sp, uint64_t rows);
/* Puts the tombstones' ring in order, oldest at 0 (a checkpoint writes
 * them so); what it holds is unchanged. 0 or PS_ENOMEM. */
int psd_sparse_tombs_linear(struct psd_sparse *sp);
/* A checkpoint's n tombstones, oldest first: 0, PS_ELIMIT (more than
 * this table keeps) or PS_ENOMEM. */
int psd_sparse_tombs_restore(struct psd_sparse *sp, const uint64_t *keys, const uint64_t *ticks,
                             uint64_t n);
/* Tombstones kept at most per table and shard. */
#define PSD_TOMBS_MAX (UINT64_C(1) << 20)
/* Counts a push of key, which has no row: 1 when that admits it (its
 * count reached admit_after), else 0. */
int psd_sparse_admit(struct psd_sparse *sp, uint64_t key);
/* Room for a new row: 0 when there is some, or one was made by evicting
 * the least recently pushed row of a sample (evict_at_budget) that the
 * push in progress (tick) did not touch; else PS_ELIMIT. */
int psd_sparse_make_room(struct psd_sparse *sp);
/* Age eviction's slice after a push: looks at PSD_AGE_SLICE rows from
 * age_at and evicts those not pushed in the last evict_after ticks. */
void psd_sparse_age_slice(struct psd_sparse *sp);
/* Removes row r: the last row moves into its place. */
void psd_sparse_remove(struct psd_sparse *sp, uint64_t r);

/* Asks for the cache line of the slot a key with this hash starts at:
 * for a key some way ahead of the one looked up (random keys miss the
 * cache each). To L2 only, as the keyed applies do (kernels/psk_optim.c).
 * always_inline: see prefetch_row in table.c. */
static inline __attribute__((always_inline)) void
psd_sparse_prefetch_hash(const struct psd_sparse *sp, uint64_t hash)
{
    __builtin_prefetch(&sp->slot[hash & (sp->slots - 1)], 0, 1);
}

#endif
