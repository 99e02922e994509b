/* Counter-based initialisers: hash (seed, index) into uniform or normal. */
#include "ps_init.h"

#include "ps_shard.h"

#include <math.h>

double ps_unit_double(uint64_t h)
{
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

float ps_init_value(enum ps_init_kind kind, float scale, uint64_t seed, uint64_t index)
{
    uint64_t h = ps_mix64(ps_mix64(seed) ^ index);
    switch (kind) {
    case PS_INIT_CONSTANT:
        return scale;
    case PS_INIT_UNIFORM:
        return (float)((2.0 * ps_unit_double(h) - 1.0) * scale);
    case PS_INIT_NORMAL: {
        /* Box-Muller on two independent hashes; u1 in (0, 1] avoids log(0). */
        double u1 = 1.0 - ps_unit_double(h);
        double u2 = ps_unit_double(ps_mix64(h ^ UINT64_C(0x5851f42d4c957f2d)));
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        return (float)(z * scale);
    }
    case PS_INIT_ZEROS:
    default:
        return 0.0f;
    }
}

void ps_init_fill(float *out, size_t n, enum ps_init_kind kind, float scale, uint64_t seed,
                  uint64_t first)
{
    for (size_t i = 0; i < n; i++)
        out[i] = ps_init_value(kind, scale, seed, first + i);
}
