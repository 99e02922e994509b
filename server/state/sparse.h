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
};

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
