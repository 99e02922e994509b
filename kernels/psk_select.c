/* Top-k selection by magnitude (psk_select.h). */
#include "psk_select.h"

#include "ps_err.h"

#include <math.h>
#include <stdlib.h>

/* The k-th largest of a[0..n) (1-based k), rearranging a: Hoare's
 * quickselect, expected O(n), median-of-three pivots. */
static float kth_largest(float *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float p = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        size_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p)
                i++;
            while (a[j] < p)
                j--;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return a[want];
}

/* Takes the entries of pos[0..m) (indices into v, ascending) whose
 * magnitude is above thr, and ties at thr in index order until k are
 * taken: into idx and val, zeroed in v and u. */
static void take(const size_t *pos, size_t m, float thr, size_t above, float *v, float *u, size_t k,
                 uint64_t *idx, float *val)
{
    size_t ties = k - above, got = 0;
    for (size_t j = 0; j < m && got < k; j++) {
        size_t i = pos != NULL ? pos[j] : j;
        float a = fabsf(v[i]);
        if (a > thr || (a == thr && ties > 0)) {
            if (a == thr)
                ties--;
            idx[got] = i;
            val[got] = v[i];
            got++;
            v[i] = 0.0f;
            if (u != NULL)
                u[i] = 0.0f;
        }
    }
}

int psk_topk_exact(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val)
{
    float *mag = malloc(n * sizeof *mag);
    if (mag == NULL)
        return PS_ENOMEM;
    for (size_t i = 0; i < n; i++)
        mag[i] = fabsf(v[i]);
    float thr = kth_largest(mag, n, k);
    free(mag);
    size_t above = 0;
    for (size_t i = 0; i < n; i++)
        above += fabsf(v[i]) > thr;
    take(NULL, n, thr, above, v, u, k, idx, val);
    return 0;
}

/* A sample's position j of s over n: one entry of each stride, at an
 * offset a hash of j picks, so that a period in the data (a matrix's
 * rows) does not line up with the sample. */
static size_t sample_at(size_t j, size_t stride)
{
    uint64_t h = (uint64_t)j * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return j * stride + (size_t)(h % stride);
}

/* Entries scanned at a time for candidates. */
#define SELECT_BLOCK 16

int psk_topk_sampled(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val, int *exact)
{
    /* a sample expected to hold PSK_TOPK_SAMPLE_HITS of the top k, at
     * most a quarter of v */
    size_t s = (size_t)((double)PSK_TOPK_SAMPLE_HITS * (double)n / (double)k);
    if (s < PSK_TOPK_SAMPLE_MIN)
        s = PSK_TOPK_SAMPLE_MIN;
    if (s > n / 4)
        s = n / 4;
    if (exact != NULL)
        *exact = 1;
    /* too small to be worth it, or too few of the top k in the sample for
     * an estimate: select exactly */
    if (n < 4 * PSK_TOPK_SAMPLE_MIN || (double)k * (double)s / (double)n < PSK_TOPK_SAMPLE_FEW)
        return psk_topk_exact(n, v, u, k, idx, val);
    size_t stride = n / s;
    size_t cap = 3 * k + 1024; /* candidates kept; more: the estimate was too low */
    float *mag = malloc((s > cap ? s : cap) * sizeof *mag);
    size_t *pos = malloc((cap + SELECT_BLOCK) * sizeof *pos);
    if (mag == NULL || pos == NULL) {
        free(mag);
        free(pos);
        return PS_ENOMEM;
    }
    for (size_t j = 0; j < s; j++)
        mag[j] = fabsf(v[sample_at(j, stride)]);
    /* the threshold: below the sample's estimate of the k-th magnitude
     * (its rank times the slack), so that at least k entries pass it
     * nearly always */
    size_t r = (size_t)(PSK_TOPK_SAMPLE_SLACK * (double)k * (double)s / (double)n);
    float est = kth_largest(mag, s, r < 1 ? 1 : r > s ? s : r);
    /* in blocks: a count that vectorises says whether a block has any;
     * one that has is scanned without branches (pos has a block's room
     * past cap) */
    size_t m = 0;
    for (size_t b = 0; b < n && m <= cap; b += SELECT_BLOCK) {
        size_t e = b + SELECT_BLOCK < n ? b + SELECT_BLOCK : n;
        unsigned any = 0;
        for (size_t i = b; i < e; i++)
            any += fabsf(v[i]) >= est;
        if (any > 0)
            for (size_t i = b; i < e; i++) {
                pos[m] = i;
                m += fabsf(v[i]) >= est;
            }
    }
    if (m < k || m > cap) { /* the estimate missed: exact selection */
        free(mag);
        free(pos);
        return psk_topk_exact(n, v, u, k, idx, val);
    }
    /* every entry at or above the k-th magnitude is a candidate (at least
     * k are at or above est): the candidates' k-th is the whole's */
    for (size_t j = 0; j < m; j++)
        mag[j] = fabsf(v[pos[j]]);
    float thr = kth_largest(mag, m, k);
    size_t above = 0;
    for (size_t j = 0; j < m; j++)
        above += fabsf(v[pos[j]]) > thr;
    take(pos, m, thr, above, v, u, k, idx, val);
    free(mag);
    free(pos);
    if (exact != NULL)
        *exact = 0;
    return 0;
}

int psk_topk_host(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val)
{
    return psk_topk_sampled(n, v, u, k, idx, val, NULL);
}
