/* psd's shared regions: hand-over, binding, lookup, eviction (regions.h). */
#include "regions.h"

#include "ps_err.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct region {
    unsigned char *base; /* NULL: free */
    size_t size;
    uint64_t token;   /* handed over, not yet bound: its token; 0 once bound */
    uint64_t used_ms; /* handed over, bound or last used */
    uint32_t worker_id;
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
};

struct psd_regions {
    struct region r[PS_SHM_REGIONS_MAX];
    uint32_t last;                /* the region found last (a worker's requests come in runs) */
    uint64_t bytes_in, bytes_out; /* values read from and written to regions */
};

struct psd_regions *psd_regions_create(void)
{
    return calloc(1, sizeof(struct psd_regions));
}

static void drop(struct region *r)
{
    munmap(r->base, r->size);
    memset(r, 0, sizeof *r);
}

int psd_regions_offer(struct psd_regions *set, uint64_t token, void *base, size_t size,
                      uint64_t now_ms)
{
    if (token == 0) /* 0 marks a bound region */
        return PS_EINVAL;
    psd_regions_expire(set, now_ms);
    struct region *slot = NULL;
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX; i++) {
        struct region *r = &set->r[i];
        if (r->base == NULL) {
            slot = r;
            break;
        }
        if (r->token != 0 && (slot == NULL || r->used_ms < slot->used_ms))
            slot = r; /* full: the oldest hand-over not bound yet goes */
    }
    if (slot == NULL)
        return PS_ELIMIT; /* every region is bound: they stay */
    if (slot->base != NULL)
        drop(slot);
    slot->base = base;
    slot->size = size;
    slot->token = token;
    slot->used_ms = now_ms;
    return 0;
}

static int same_route(const struct region *r, const void *route, size_t len)
{
    return r->base != NULL && r->token == 0 && r->route_len == len &&
           memcmp(r->route, route, len) == 0;
}

int psd_regions_bind(struct psd_regions *set, uint64_t token, const void *route, size_t route_len,
                     uint32_t worker_id, uint64_t now_ms)
{
    if (token == 0 || route_len > PS_ROUTE_ID_MAX)
        return 0;
    struct region *found = NULL;
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX && found == NULL; i++)
        if (set->r[i].base != NULL && set->r[i].token == token)
            found = &set->r[i];
    if (found == NULL)
        return 0;
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX; i++)
        if (same_route(&set->r[i], route, route_len))
            drop(&set->r[i]);
    found->token = 0;
    found->worker_id = worker_id;
    memcpy(found->route, route, route_len);
    found->route_len = route_len;
    found->used_ms = now_ms;
    return 1;
}

int psd_regions_at(struct psd_regions *set, const void *route, size_t route_len, uint64_t off,
                   uint64_t bytes, uint64_t now_ms, unsigned char **p, size_t *size)
{
    struct region *r = &set->r[set->last];
    if (!same_route(r, route, route_len)) {
        r = NULL;
        for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX && r == NULL; i++)
            if (same_route(&set->r[i], route, route_len)) {
                r = &set->r[i];
                set->last = i;
            }
    }
    if (r == NULL)
        return PS_ESHM;
    *size = r->size;
    if (off > r->size || bytes > r->size - off)
        return PS_ERANGE;
    r->used_ms = now_ms;
    *p = r->base + off;
    return 0;
}

void psd_regions_drop_worker(struct psd_regions *set, uint32_t w, const void *route,
                             size_t route_len)
{
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX; i++) {
        struct region *r = &set->r[i];
        if (r->base != NULL && r->token == 0 && r->worker_id == w &&
            (route == NULL || !same_route(r, route, route_len)))
            drop(r);
    }
}

void psd_regions_expire(struct psd_regions *set, uint64_t now_ms)
{
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX; i++) {
        struct region *r = &set->r[i];
        if (r->base != NULL && r->token != 0 && now_ms - r->used_ms > PS_SHM_PENDING_MS)
            drop(r);
    }
}

uint32_t psd_regions_bound(const struct psd_regions *set)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX; i++)
        n += set->r[i].base != NULL && set->r[i].token == 0;
    return n;
}

void psd_regions_destroy(struct psd_regions *set)
{
    if (set == NULL)
        return;
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX; i++)
        if (set->r[i].base != NULL)
            munmap(set->r[i].base, set->r[i].size);
    free(set);
}

void psd_regions_count_in(struct psd_regions *set, uint64_t bytes)
{
    set->bytes_in += bytes;
}

void psd_regions_count_out(struct psd_regions *set, uint64_t bytes)
{
    set->bytes_out += bytes;
}

uint64_t psd_regions_bytes_in(const struct psd_regions *set)
{
    return set->bytes_in;
}

uint64_t psd_regions_bytes_out(const struct psd_regions *set)
{
    return set->bytes_out;
}
