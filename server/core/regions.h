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
#ifndef PSD_REGIONS_H
#define PSD_REGIONS_H

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

/* The regions of one shard; opaque outside regions.c. */
struct psd_regions;

/* NULL: out of memory. */
struct psd_regions *psd_regions_create(void);
/* Unmaps every region and frees the set (NULL: nothing). */
void psd_regions_destroy(struct psd_regions *set);

/* Takes a mapped region (munmap'd when it goes) handed over with token:
 * 0, PS_EINVAL for token 0, or PS_ELIMIT when every region is bound (the
 * caller unmaps it). */
int psd_regions_offer(struct psd_regions *set, uint64_t token, void *base, size_t size,
                      uint64_t now_ms);
/* Binds the region handed over with token to a connection (and drops any
 * other region bound to it). 1 bound, 0 no region waits under token. */
int psd_regions_bind(struct psd_regions *set, uint64_t token, const void *route, size_t route_len,
                     uint32_t worker_id, uint64_t now_ms);
/* Bytes [off, off+bytes) of the region bound to route: PS_ESHM none bound,
 * PS_ERANGE past its end; 0 with *p set. */
int psd_regions_at(struct psd_regions *set, const void *route, size_t route_len, uint64_t off,
                   uint64_t bytes, uint64_t now_ms, unsigned char **p, size_t *size);
/* Drops the regions bound to worker w, except the one on route (NULL: all). */
void psd_regions_drop_worker(struct psd_regions *set, uint32_t w, const void *route,
                             size_t route_len);
/* Drops hand-overs older than PS_SHM_PENDING_MS. */
void psd_regions_expire(struct psd_regions *set, uint64_t now_ms);
/* Regions bound now. */
uint32_t psd_regions_bound(const struct psd_regions *set);
/* Values read from (in) and written to (out) regions, counted by who
 * reads or writes them. */
void psd_regions_count_in(struct psd_regions *set, uint64_t bytes);
void psd_regions_count_out(struct psd_regions *set, uint64_t bytes);
uint64_t psd_regions_bytes_in(const struct psd_regions *set);
uint64_t psd_regions_bytes_out(const struct psd_regions *set);

#endif
