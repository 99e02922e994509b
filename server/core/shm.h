/* psd's shared regions (common/protocol/ps_shm.h): handed over by clients on the
 * same host, bound by a hello to the connection (routing id) it came on.
 *
 * A region handed over waits PS_SHM_PENDING_MS for its hello. At most
 * PS_SHM_REGIONS_MAX are mapped: a new hand-over pushes out the oldest one
 * not bound yet, never a bound region (a local process handing over
 * regions in a loop cannot take them from workers), and is refused when
 * all are bound. A bound region goes when its worker is dropped or says
 * hello from a new session on another connection; requests naming it
 * after that are refused with PS_ESHM and the client sends its values in
 * frames again. Owned by the loop thread, like the rest of struct psd. */
#ifndef PSD_SHM_H
#define PSD_SHM_H

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

struct psd_shm_region {
    unsigned char *base; /* NULL: free */
    size_t size;
    uint64_t token;   /* handed over, not yet bound: its token; 0 once bound */
    uint64_t used_ms; /* handed over, bound or last used */
    uint32_t worker_id;
    uint8_t route[PS_ROUTE_ID_MAX];
    size_t route_len;
};

struct psd_shm_set {
    struct psd_shm_region r[PS_SHM_REGIONS_MAX];
    uint32_t last;                /* the region found last (a worker's requests come in runs) */
    uint64_t bytes_in, bytes_out; /* values read from and written to regions */
};

/* Takes a mapped region (munmap'd when it goes) handed over with token:
 * 0, PS_EINVAL for token 0, or PS_ELIMIT when every region is bound (the
 * caller unmaps it). */
int psd_shm_offer(struct psd_shm_set *set, uint64_t token, void *base, size_t size,
                  uint64_t now_ms);
/* Binds the region handed over with token to a connection (and drops any
 * other region bound to it). 1 bound, 0 no region waits under token. */
int psd_shm_bind(struct psd_shm_set *set, uint64_t token, const void *route, size_t route_len,
                 uint32_t worker_id, uint64_t now_ms);
/* Bytes [off, off+bytes) of the region bound to route: PS_ESHM none bound,
 * PS_ERANGE past its end; 0 with *p set. */
int psd_shm_at(struct psd_shm_set *set, const void *route, size_t route_len, uint64_t off,
               uint64_t bytes, uint64_t now_ms, unsigned char **p, size_t *size);
/* Drops the regions bound to worker w, except the one on route (NULL: all). */
void psd_shm_drop_worker(struct psd_shm_set *set, uint32_t w, const void *route, size_t route_len);
/* Drops hand-overs older than PS_SHM_PENDING_MS. */
void psd_shm_expire(struct psd_shm_set *set, uint64_t now_ms);
/* Regions bound now. */
uint32_t psd_shm_bound(const struct psd_shm_set *set);
void psd_shm_fini(struct psd_shm_set *set);

#endif
