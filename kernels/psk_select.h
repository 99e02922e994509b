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
 * 1 <= k <= n; v holds no NaN. 0, or PS_ENOMEM.
 *
 * psk_topk_host is psk_topk_sampled: as Deep Gradient Compression does,
 * it estimates the k-th magnitude from a sample (PSK_TOPK_SAMPLE_HITS of
 * the top k expected in it, at least PSK_TOPK_SAMPLE_MIN entries and at
 * most a quarter of v; v shorter than 4 PSK_TOPK_SAMPLE_MIN, or a sample
 * expected to hold fewer than PSK_TOPK_SAMPLE_FEW of the top k, is
 * selected exactly), sets
 * the threshold below the estimate (at PSK_TOPK_SAMPLE_SLACK times its
 * rank), keeps the entries at or above it in one pass, and selects
 * exactly among them. Whenever at least k pass, every entry at or above
 * the true k-th magnitude is among them, so the result is psk_topk_exact's
 * bit for bit; when fewer than k pass, or more than 3k + 1024 (heavy ties,
 * mostly zeros), it falls back to psk_topk_exact (*exact = 1, else 0;
 * exact may be NULL). psk_topk_exact copies the magnitudes and runs a
 * quickselect over all n. */
#define PSK_TOPK_SAMPLE_HITS  32
#define PSK_TOPK_SAMPLE_MIN   1024
#define PSK_TOPK_SAMPLE_FEW   16
#define PSK_TOPK_SAMPLE_SLACK 1.4
int psk_topk_host(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val);
int psk_topk_sampled(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val, int *exact);
int psk_topk_exact(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val);

#endif
