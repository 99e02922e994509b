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

/* Samples of the tick eviction by time keeps: one every
 * evict_after_s / (PSD_AGE_STAMPS / 2) seconds at least a second apart,
 * so the floor trails the true one by at most that (or a second). */
#define PSD_AGE_STAMPS 256u

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
    /* Eviction by time: rows whose last push is below age_floor are
     * evicted as age eviction's slices come to them. The floor is the
     * primary's (psd_sparse_age_clock, from its own samples of the tick
     * against its clock), sent to backups as a record and kept in
     * checkpoints. Each replica samples its own tick (a backup's lag
     * only makes its floor later), so a backup that takes over goes on
     * from its samples; a restart or a reshard starts them afresh. */
    uint64_t evict_after_s;
    uint64_t age_floor;
    /* Budget eviction by decayed frequency (evict_half_life != 0): each
     * row's push count in 1/256ths, halved every half_life ticks
     * (psd_sparse_decayed), brought up to date at each push */
    uint64_t half_life;
    uint32_t *freq; /* rows_cap, or NULL */
    struct psd_age_stamp {
        uint64_t ms, tick; /* at ms (ps_mono_ms), the table's tick was tick */
    } stamp[PSD_AGE_STAMPS];
    uint32_t nstamps, stamp_head; /* kept, and where the next goes */
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
/* One push in a row's decayed count (psd_sparse_stamp). */
#define PSD_FREQ_ONE 256u
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
                    uint64_t evict_after, int evict_at_budget, uint64_t evict_after_s,
                    uint64_t half_life);
/* Eviction by time, on the primary: samples the tick at now_ms (when a
 * sample is due) and returns the floor the samples allow: one past the
 * tick of the newest sample at least evict_after_s old (rows last pushed
 * at or before it are that old), or 0 when it would not rise. The caller
 * sets age_floor (psd_sparse_set_floor) and tells the backups. */
uint64_t psd_sparse_age_clock(struct psd_sparse *sp, uint64_t now_ms);
/* Raises age_floor to floor: 0, or PS_EINVAL when floor is past the
 * tick's next (no row could have been pushed then) or below the floor. */
int psd_sparse_set_floor(struct psd_sparse *sp, uint64_t floor);
/* Bytes beside the rows' weights and state: each row's tick (and decayed
 * count), the sketch, the tombstones. */
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
 * age_at and evicts those not pushed in the last evict_after ticks, or
 * last pushed below age_floor. */
void psd_sparse_age_slice(struct psd_sparse *sp);
/* Removes row r: the last row moves into its place. */
void psd_sparse_remove(struct psd_sparse *sp, uint64_t r);

/* A push count f (1/256ths) dt ticks after it was brought up to date:
 * halved every half_life ticks, and between halvings taken down along
 * the line to the next (within 6% of 2^(-dt/half_life)). Integer
 * arithmetic: every replica gets the same. */
static inline uint32_t psd_sparse_decayed(uint32_t f, uint64_t dt, uint64_t half_life)
{
    uint64_t k = dt / half_life;
    if (k >= 32)
        return 0;
    uint64_t g = (uint64_t)(f >> k);
    return (uint32_t)(g - g * (dt % half_life) / (2 * half_life));
}

/* Row r pushed at tick: its last push, and with decayed frequency its
 * count. */
static inline void psd_sparse_stamp(struct psd_sparse *sp, uint64_t r, uint64_t tick)
{
    if (sp->freq != NULL) {
        uint64_t f = (uint64_t)psd_sparse_decayed(sp->freq[r], tick - sp->last[r], sp->half_life) +
                     PSD_FREQ_ONE;
        sp->freq[r] = f < UINT32_MAX ? (uint32_t)f : UINT32_MAX;
    }
    sp->last[r] = tick;
}

/* A slot's row where the slot is empty (memset 0xff) */
#define PSD_SLOT_EMPTY UINT64_MAX

/* The row of key (ps_mix64(key) is hash), or -1 when it has none: the
 * lookup of psd_sparse_row_hashed without making a row, inline for the
 * walks over a request's keys (a call a key took a tenth off pulls). */
static inline int64_t psd_sparse_find_hashed(const struct psd_sparse *sp, uint64_t key,
                                             uint64_t hash)
{
    uint64_t mask = sp->slots - 1, i = hash & mask;
    for (;;) {
        const struct psd_slot *s = &sp->slot[i];
        if (s->row == PSD_SLOT_EMPTY)
            return -1;
        if (s->key == key)
            return (int64_t)s->row;
        i = (i + 1) & mask;
    }
}

/* Asks for the cache line of the slot a key with this hash starts at:
 * for a key some way ahead of the one looked up (random keys miss the
 * cache each). Into L1: asked for L2 only, pulls ran 3% slower.
 * always_inline: see prefetch_row in table.c. */
static inline __attribute__((always_inline)) void
psd_sparse_prefetch_hash(const struct psd_sparse *sp, uint64_t hash)
{
    __builtin_prefetch(&sp->slot[hash & (sp->slots - 1)], 0, 3);
}

#endif
