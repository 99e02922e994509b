/* Top-k selection by magnitude over host arrays: the one implementation
 * behind the CPU backend's psk_topk and libpsclient's psc_topk_select, so
 * psworker --topk and the Python package's top-k send the same entries.
 * Plain CPU code, no backend. */
#ifndef PSK_SELECT_H
#define PSK_SELECT_H

#include <stddef.h>
#include <stdint.h>

/* Moves the k entries of v[0..n) largest in magnitude out: their indices
 * (ascending) into idx, their values into val, and zeroes them in v and,
 * when u is not NULL, in u. Ties at the k-th magnitude go in index order.
 * 1 <= k <= n; v holds no NaN. 0, or PS_ENOMEM. */
int psk_topk_host(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val);

#endif
