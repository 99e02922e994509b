/* The region shared with shards on this host (ps_shm.h), as requests
 * use it: whether values lie in it, and where a pull's output goes. */
#include "client_impl.h"

#include <stddef.h>

/* Whether [p, p+bytes) lies in the shared region. */
int psc__in_region(const struct psc_client *c, const void *p, size_t bytes)
{
    const unsigned char *q = p;
    return q != NULL && c->shm.base != NULL && q >= c->shm.base && bytes <= c->shm.size &&
           q - c->shm.base <= (ptrdiff_t)(c->shm.size - bytes);
}

/* Whether [p, p+bytes) lies in the region, a multiple of align bytes in,
 * and shard s took the region. */
int psc__region_has(const struct psc_client *c, uint32_t s, const void *p, size_t bytes,
                    size_t align)
{
    return c->shm_on != NULL && c->shm_on[s] && psc__in_region(c, p, bytes) &&
           (size_t)((const unsigned char *)p - c->shm.base) % align == 0;
}

/* Whether values [p, p+bytes) may move through the region (f32 only). */
int psc__shm_in_region(const struct psc_client *c, uint32_t s, const void *p, size_t bytes)
{
    return c->dtype == PS__DTYPE__DTYPE_F32 && psc__region_has(c, s, p, bytes, sizeof(float));
}

/* Where shard s's part [a, b) of a pull's output lies in the region (*off
 * bytes in), when it does and the shard took the region: the shard writes
 * those values there itself. */
int psc__shm_out_at(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t a,
                    uint64_t b, uint64_t *off)
{
    float *out = sl->out != NULL && !sl->view ? sl->out + (a - sl->offset) : NULL;
    if (!psc__shm_in_region(c, s, out, (b - a) * sizeof(float)))
        return 0;
    *off = (uint64_t)((unsigned char *)out - c->shm.base);
    return 1;
}
