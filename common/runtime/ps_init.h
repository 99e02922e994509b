/* Seeded parameter initialisation addressed by element index.
 *
 * The value of element i depends only on (kind, scale, seed, i), never on
 * which shard or worker computes it, so a table initialised by 2 shards is
 * bit-identical to the same table initialised by 1 shard or by a standalone
 * worker. Counter-based: a hash of (seed, i), no sequential RNG state. */
#ifndef PS_INIT_H
#define PS_INIT_H

#include <stddef.h>
#include <stdint.h>

/* Same numbers as ps.InitKind on the wire. */
enum ps_init_kind {
    PS_INIT_ZEROS = 0,
    PS_INIT_CONSTANT = 1,
    PS_INIT_UNIFORM = 2, /* U(-scale, scale) */
    PS_INIT_NORMAL = 3,  /* N(0, scale^2) */
};

/* Uniform double in [0, 1) from a 64-bit hash (53 random bits). */
double ps_unit_double(uint64_t h);

/* Value of element `index` for the given initialiser. */
float ps_init_value(enum ps_init_kind kind, float scale, uint64_t seed, uint64_t index);

/* Fills out[0..n) with elements first, first+1, ... of the initialiser. */
void ps_init_fill(float *out, size_t n, enum ps_init_kind kind, float scale, uint64_t seed,
                  uint64_t first);

#endif
