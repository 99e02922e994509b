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

/* The keys a rows request sends, grouped by shard (rows.c): with one
 * shard and the caller's keys in the region (whole keys in), the
 * caller's, which stay unchanged until the request completes
 * (psc_pull_rows); else the slot's copy. */
const uint64_t *psc__rows_keys(const struct psc_client *c, const struct slot *sl)
{
    const unsigned char *p = (const unsigned char *)sl->keys;
    if (c->nshards == 1 && psc__in_region(c, p, sl->nkeys * sizeof(uint64_t)) &&
        (size_t)(p - c->shm.base) % sizeof(uint64_t) == 0)
        return sl->keys;
    return sl->skeys;
}

/* Whether values [p, p+bytes) may move through the region (in f32: see
 * psc__shard_dtype). */
int psc__shm_in_region(const struct psc_client *c, uint32_t s, const void *p, size_t bytes)
{
    return psc__region_has(c, s, p, bytes, sizeof(float));
}

/* The dtype of shard s's dense values: f32 to a shard on this host that
 * took the region (there is no wire to save: its values move through the
 * region, or in f32 frames), the wire dtype to the others. */
Ps__DType psc__shard_dtype(const struct psc_client *c, uint32_t s)
{
    return c->shm_on != NULL && c->shm_on[s] ? PS__DTYPE__DTYPE_F32 : c->dtype;
}

/* The dtype shard s's last sub-request of sl went in, which its reply
 * comes in. */
Ps__DType psc__sent_dtype(const struct psc_client *c, const struct slot *sl, uint32_t s)
{
    return (sl->f32_to[s / 64] >> (s % 64)) & 1u ? PS__DTYPE__DTYPE_F32 : c->dtype;
}

/* Where shard s's part [a, b) of a pull's output lies in the region (*off
 * bytes in), when it does and the shard took the region: the shard writes
 * those values there itself. For rows, [a, b) counts floats of out. */
int psc__shm_out_at(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t a,
                    uint64_t b, uint64_t *off)
{
    float *out = sl->out != NULL && !sl->view ? sl->out + (a - sl->offset) : NULL;
    if (!psc__shm_in_region(c, s, out, (b - a) * sizeof(float)))
        return 0;
    *off = (uint64_t)((unsigned char *)out - c->shm.base);
    return 1;
}
