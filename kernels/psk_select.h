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
 * selected exactly), sets the threshold below the estimate (at
 * PSK_TOPK_SAMPLE_SLACK times its rank), keeps the entries at or above it
 * in one pass, and selects exactly among them. Whenever at least k pass,
 * every entry at or above the true k-th magnitude is among them, so the
 * result is psk_topk_exact's bit for bit. When fewer than k pass it tries
 * once more at PSK_TOPK_SAMPLE_RETRY times the rank; when fewer pass
 * again, or more than 3k + 1024 (heavy ties, mostly zeros), it falls back
 * to psk_topk_exact. *path (path may be NULL) says which ran:
 * PSK_TOPK_PATH_SAMPLED, _RETRIED or _EXACT. psk_topk_exact copies the
 * magnitudes and runs a quickselect over all n. */
#define PSK_TOPK_SAMPLE_HITS  32
#define PSK_TOPK_SAMPLE_MIN   1024
#define PSK_TOPK_SAMPLE_FEW   16
#define PSK_TOPK_SAMPLE_SLACK 1.4
#define PSK_TOPK_SAMPLE_RETRY 2.0
#define PSK_TOPK_PATH_SAMPLED 0
#define PSK_TOPK_PATH_EXACT   1
#define PSK_TOPK_PATH_RETRIED 2
int psk_topk_host(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val);
int psk_topk_sampled(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val, int *path);
int psk_topk_exact(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val);
/* The error feedback's update, then psk_topk_sampled: v += g, or with u
 * (momentum correction), u = mom u + g and v += u, bit for bit as
 * psk_scale and psk_axpy make it, then the selection over v. Where the
 * CPU has AVX2 the update and the selection's first pass are one pass
 * over g, u and v instead of four. */
int psk_topk_host_accum(size_t n, const float *g, float mom, float *u, float *v, size_t k,
                        uint64_t *idx, float *val, int *path);

#endif
