/* Gradual magnitude pruning of dense tables (Zhu & Gupta, 2017).
 *
 * A table named in a prune spec gets a mask. Its sparsity rises from 0 at
 * step START to TARGET at step END along s(t) = TARGET (1 - (1 - (t -
 * START) / (END - START))^3), and the mask is recomputed every EVERY steps:
 * the smallest-magnitude weights of this shard are zeroed until the
 * shard's sparsity reaches s(t). Pruned weights (and their optimizer
 * state) stay exactly zero: updates to them are dropped after each apply.
 * Steps are the table's optimizer steps in clocks (bsp rounds; asp/ssp
 * pushes divided by the worker count). Nothing here talks to the network. */
#ifndef PSD_PRUNE_H
#define PSD_PRUNE_H

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

#define PSD_PRUNE_SPECS_MAX 64
/* A spec's schedule when it names only TABLE:TARGET (steps). Plain
 * numbers: psd's --help writes them with PSD_PRUNE_DEFAULTS. */
#define PSD_PRUNE_START   200
#define PSD_PRUNE_END     2000
#define PSD_PRUNE_EVERY   100
#define PSD_PRUNE_STR_(x) #x
#define PSD_PRUNE_STR(x)  PSD_PRUNE_STR_(x)
#define PSD_PRUNE_DEFAULTS                                                                         \
    PSD_PRUNE_STR(PSD_PRUNE_START)                                                                 \
    ":" PSD_PRUNE_STR(PSD_PRUNE_END) ":" PSD_PRUNE_STR(PSD_PRUNE_EVERY)

struct psd_prune_spec {
    char table[PS_TABLE_NAME_MAX + 1];
    double target;              /* final sparsity in [0, 1) */
    uint64_t start, end, every; /* steps; start < end, every >= 1 */
};

/* Parses "TABLE:TARGET[:START:END:EVERY]" (defaults PSD_PRUNE_*). 0 or
 * PS_EINVAL with a sentence naming the bad part. */
int psd_prune_parse(const char *s, struct psd_prune_spec *out, char *err, size_t errlen);

/* The schedule's sparsity at step t. */
double psd_prune_sparsity_at(const struct psd_prune_spec *p, uint64_t t);

/* 1 when the mask is due for recomputation at step t (START, every EVERY
 * steps after it, and END). */
int psd_prune_due(const struct psd_prune_spec *p, uint64_t t);

/* Marks in mask (1 = pruned) the smallest-magnitude elements of w[0..n)
 * until `sparsity` of them are pruned (already-pruned ones included),
 * zeroes them in w, s1, s2 (when not NULL). scratch holds n floats.
 * Returns the number pruned. */
uint64_t psd_prune_apply_mask(float *w, float *s1, float *s2, uint8_t *mask, size_t n,
                              double sparsity, float *scratch);

/* Re-zeroes the pruned elements of [0, n) after an update. */
void psd_prune_enforce(float *w, float *s1, float *s2, const uint8_t *mask, size_t n);

#endif
